/* hearthd's configuration: built-in defaults, then /etc/hearth/hearthd.conf (`key = value`
 * lines), then command-line settings, all through config_set so a key means the same in the
 * file and on the command line. Every error names the key, and for files the file and line
 * ("hearthd.conf:12: unknown key 'kv_bugdet' (did you mean 'kv_budget'?)"). hearthd.conf(5)
 * documents each key; this header is its source of truth. */
#ifndef HEARTH_DAEMON_CONFIG_H
#define HEARTH_DAEMON_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon/serve/log.h"
#include "protocol/error.h"

#define CONFIG_DEFAULT_SOCKET "/run/hearth/hearth.sock"

#define CONFIG_LIST_MAX 64             /* entries in allow_users / allow_groups */
#define CONFIG_SOCKET_PATH_MAX 108     /* sizeof(sockaddr_un.sun_path), NUL included */
#define CONFIG_LINE_MAX 4096

enum config_hugepages {
	CONFIG_HUGEPAGES_AUTO,     /* hugetlbfs pages if reserved, else THP, else normal pages */
	CONFIG_HUGEPAGES_HUGETLB,  /* hugetlbfs only; fail if the pages are not there */
	CONFIG_HUGEPAGES_THP,      /* madvise(MADV_HUGEPAGE) only */
	CONFIG_HUGEPAGES_NONE,
};

enum config_weights {
	CONFIG_WEIGHTS_W4A16,      /* int4 weights, bf16/f32 activations */
	CONFIG_WEIGHTS_W4A8,       /* int4 weights, int8 activations (VNNI) */
};

/* How matrices read from F32/F16/BF16 files are quantized at load (weights_group). */
enum config_weights_group {
	CONFIG_GROUP_128,          /* asymmetric group 128, searched scales: 4.25 bpw */
	CONFIG_GROUP_32,           /* symmetric group 32, searched scales: 4.5 bpw (Q4_0's format),
				    * embedding/head included */
	CONFIG_GROUP_64,           /* asymmetric group 64, searched scales as 8-bit codes per
				    * row: 4.28 bpw at 2048 columns */
};

/* How the token embedding and the output head are stored (head). */
enum config_head {
	CONFIG_HEAD_AUTO,          /* as weights_mix decides (int6 when it fits, else int4;
				    * int4 with weights_mix off) */
	CONFIG_HEAD_INT4,          /* the layers' int4 layout */
	CONFIG_HEAD_INT6,          /* int6 (group 32, 6.5 bits a weight) */
	CONFIG_HEAD_INT8,          /* int8 (group 128; Q8_0 carried over at group 32) */
};

/* Whether the loader spends what is left of 4.5 bits per weight on int8 copies of the
 * matrices where 4 bits cost the most (weights_mix; daemon/engine/load.h). */
enum config_weights_mix {
	CONFIG_MIX_AUTO,
	CONFIG_MIX_OFF,
};

/* How SIGHUP replaces the model when its settings changed. */
/* Who may find whose prompts in the prefix cache (a hit is visible as a faster first token). */
enum config_prefix_share {
	CONFIG_SHARE_UID,          /* only the same uid's prompts: no cross-user timing signal */
	CONFIG_SHARE_GROUP,        /* the same primary group's */
	CONFIG_SHARE_ALL,          /* everyone's: the most reuse */
};

enum config_model_swap {
	CONFIG_SWAP_AUTO,          /* beside when MemAvailable holds both models, else drain */
	CONFIG_SWAP_BESIDE,        /* load the new model while the old one serves */
	CONFIG_SWAP_DRAIN,         /* finish running requests, free the old model, then load */
};

enum config_kv_type {
	CONFIG_KV_F16,
	CONFIG_KV_BF16,
	CONFIG_KV_F32,
	CONFIG_KV_Q8,              /* int8 codes + one f32 scale per head row (int4 engine) */
};

#define CONFIG_IMATRIX_SELF "self"   /* imatrix = self */
#define CONFIG_IMATRIX_AUTO "auto"   /* imatrix = auto (the default): self where it is kept */
#define CONFIG_IMATRIX_NONE "none"   /* imatrix = none */
#define CONFIG_WEIGHTS_CACHE_OFF "off" /* weights_cache = off */

/* Plain values: no pointers, so a config is copied with `=` and compared field by field;
 * user and group names are resolved to ids when they are set. */
struct hearth_config {
	char model[PATH_MAX];          /* GGUF file; required ("" until set) */
	char chat_template[PATH_MAX];  /* a Jinja file for chat instead of the model's own; "" none */
	char draft_model[PATH_MAX];    /* speculative decoding's draft model (same vocabulary); "" none */
	char imatrix[PATH_MAX];        /* llama-imatrix statistics for the int4 scale search; "none"
					* (or ""); "self": made by sampling the model; "auto": self
					* where it can be kept (daemon/serve/calib.h) */
	char imatrix_cache[PATH_MAX];  /* where imatrix = self keeps its files; "" $CACHE_DIRECTORY */
	uint32_t imatrix_samples;      /* imatrix = self: sequences sampled */
	/* where the packed weights are kept between starts; "" $CACHE_DIRECTORY; "off" never */
	char weights_cache[PATH_MAX];
	uint64_t draft_kv_budget;      /* bytes for the draft model's KV cache */
	uint32_t max_context;          /* tokens per sequence; sizes RoPE and per-seq KV */
	uint64_t kv_budget;            /* bytes for the whole KV cache */
	/* kv_budget was set (file or flag): then it is the whole KV cache. Unset, a model with
	 * sliding-window layers gets their rings on top of the default, so it loads as is. */
	bool kv_budget_set;
	uint32_t threads;              /* compute threads; 0 = one per core of the NUMA node */
	int numa_node;                 /* -1 = the node of the CPUs we run on (auto) */
	enum config_hugepages hugepages;
	bool lock_memory;              /* mlock the arena (needs LimitMEMLOCK=) */
	char socket[CONFIG_SOCKET_PATH_MAX]; /* used when systemd passes no socket */
	mode_t socket_mode;            /* ditto */
	uid_t allow_uids[CONFIG_LIST_MAX];
	size_t n_allow_uids;
	gid_t allow_gids[CONFIG_LIST_MAX];
	size_t n_allow_gids;
	uint32_t max_requests_per_client;       /* concurrent requests on one connection */
	uint64_t max_queued_tokens_per_client;  /* prompt + max_tokens not yet done, per connection */
	uint32_t max_requests_per_uid;          /* concurrent requests of one uid, all connections */
	uint32_t max_clients;                   /* connections at once */
	uint32_t max_clients_per_uid;           /* connections of one uid at once */
	uint64_t client_timeout_usec;           /* hello, one frame, or an over-full reply queue */
	uint64_t client_send_queue;             /* unread reply bytes before reading pauses */
	enum log_level log_level;
	enum config_weights weights;
	enum config_weights_group weights_group;
	enum config_head head;
	enum config_weights_mix weights_mix;
	enum config_kv_type kv_type;
	uint64_t shutdown_grace_usec;  /* how long SIGTERM waits for running requests */
	enum config_model_swap model_swap;
	enum config_prefix_share prefix_share;
};

/* Where hearthd reads its config without --config: SYSCONFDIR/hearth/hearthd.conf, with
 * the sysconfdir given to configure (Makefile.am passes it to config.c alone, so this is a
 * function rather than a macro that would expand differently in other targets). */
const char *config_default_path(void);

/* Fills cfg with the built-in defaults: each key's default text in the key table, read as
 * config_set reads it (see hearthd.conf(5)). */
void config_defaults(struct hearth_config *cfg);

/* Sets one key from its text form, as written in the file or after a command-line flag.
 * A '-' in key is read as '_' so --kv-budget and kv_budget are the same key. Names in
 * allow_users / allow_groups are resolved now (getpwnam/getgrnam; numeric ids are taken as
 * they are). An empty value clears a list; for other keys it is an error.
 * Errors: HEARTH_ENOTFOUND for an unknown key, HEARTH_EINVAL / HEARTH_ERANGE for a bad value,
 * with a message naming the key and quoting the value. */
int config_set(struct hearth_config *cfg, const char *key, const char *value,
	       struct hearth_error *err);

/* "key=value" in one string, for `-o kv_budget=1GiB` style flags. */
int config_set_pair(struct hearth_config *cfg, const char *pair, struct hearth_error *err);

/* Reads a config file over cfg (keys not in the file keep their values). A key may appear
 * once per file. Comments are whole lines starting with '#'; a '#' after a value is part of
 * the value (paths may contain it), and the error for a bad value says so. The file is read
 * whole first, so a failure leaves cfg partly updated: load into a copy when that matters
 * (reload). HEARTH_EIO when the file cannot be read, else as config_set, prefixed
 * "PATH:LINE: ". */
int config_load_file(struct hearth_config *cfg, const char *path, struct hearth_error *err);

/* The whole start-up (and reload) sequence in one call, so a reload treats command-line
 * settings exactly as start-up did: defaults, then the file at path (skipped when path is
 * NULL), then each "key=value" of sets in order (the flags; later ones win), then
 * config_check. Errors from sets are prefixed "command line: ". cfg is written only on
 * success, so on reload a bad file leaves the running config untouched. */
int config_build(struct hearth_config *cfg, const char *path, const char *const *sets,
		 size_t n_sets, struct hearth_error *err);

/* Checks what single keys cannot: that model is set. Call after the file and the flags. */
int config_check(const struct hearth_config *cfg, struct hearth_error *err);

/* The canonical text of a key's value ("256MiB", "auto", "0660", "alice,1001"), which
 * config_set reads back to the same setting; names are printed for ids that resolve.
 * HEARTH_ENOTFOUND for an unknown key. For `hearthd --check-config` and tests. */
int config_format(const struct hearth_config *cfg, const char *key, char *buf, size_t size,
		  struct hearth_error *err);

/* The keys in documentation order; NULL past the end. */
const char *config_key_at(size_t i);

/* How SIGHUP applies a changed key: at once (log_level, the access lists and limits,
 * shutdown_grace, model_swap), by loading the model anew (the keys that shape the model
 * and its memory), or only at a restart (the socket). */
enum config_reload {
	CONFIG_RELOAD_LIVE,
	CONFIG_RELOAD_MODEL,
	CONFIG_RELOAD_RESTART,
};

/* The key's reload column; CONFIG_RELOAD_RESTART for an unknown key. */
enum config_reload config_key_reload(const char *key);

/* Whether the key's column is CONFIG_RELOAD_LIVE. */
bool config_key_reloadable(const char *key);

/* Whether any key whose reload column is `which` differs between a and b. */
bool config_keys_differ(const struct hearth_config *a, const struct hearth_config *b,
			enum config_reload which);

/* The canonical text of the key's built-in default as the table holds it ("256MiB",
 * "auto"), which config_defaults reads; NULL for a key with no default (model) or an
 * unknown key. */
const char *config_key_default(const char *key);

/* Reload: copies the CONFIG_RELOAD_LIVE keys of fresh into live and leaves the others.
 * Writes the comma-separated names of the other keys that changed (applied by a model swap
 * or a restart) into restart_keys ("" when none) so the caller can log them. */
void config_reload_merge(struct hearth_config *live, const struct hearth_config *fresh,
			 char *restart_keys, size_t size);

struct load_opts;
/* What cfg asks of the loader (daemon/engine/load.h): the model's options and its draft's
 * (draft_model in the same arena, refused unless its vocabulary is the model's), the same
 * for a load and for the swap's estimate of what a load would map. Pointers go into cfg. */
void config_load_opts(const struct hearth_config *cfg, struct load_opts *o);

#endif
