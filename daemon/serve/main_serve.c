/* hearthd's service mode: configuration (defaults, file, flags), the socket (systemd's or
 * our own), the server loop, and a loader thread that builds the resident int4 model while
 * the socket already answers, so early clients are told `loading` instead of refused. */

#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/serve/chat.h"
#include "daemon/serve/config.h"
#include "daemon/engine/embed.h"
#include "daemon/serve/draft.h"
#include "daemon/engine/grammar.h"
#include "daemon/engine/ledger.h"
#include "daemon/engine/load.h"
#include "daemon/serve/log.h"
#include "daemon/engine/model_q4.h"
#include "daemon/serve/server.h"
#include "daemon/serve/systemd.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/dispatch.h"

/* Exit codes as systemd and LSB read them. */
#define EXIT_BAD_ARGS 2
#define EXIT_NOT_CONFIGURED 6

/* One load: its own copy of the config, the model and tokenizer it builds, and what it
 * hands the server. Freed by loader_release when the server lets the model go. */
struct loader {
	struct hearth_config cfg;
	struct server *srv;
	struct log *log;
	struct model_q4 *model;
	struct tok *tok;
	struct sched_params sched;
	struct server_model sm;
	struct ledger_load load_record;
	struct serve_chat_model chat;
	struct grammar_vocab *gvocab;   /* the vocabulary's token trie, for grammar masks */
	struct grammar_cache *grammars;
	/* The draft model (config draft_model), loaded after the model and released with it,
	 * so a swap replaces both together. NULL: none. */
	struct model_q4 *draft;
	struct tok *draft_tok;
	struct engine draft_eng;
};

static void loader_progress(void *ctx, const char *phase, const char *what, uint64_t done,
			    uint64_t total)
{
	struct loader *ld = ctx;
	char text[128];
	/* "repacking blk.12.attn_q.weight": the tensor's block is what a person looks for. */
	snprintf(text, sizeof text, "%s %s", phase, what ? what : "");
	server_progress(ld->srv, text, done, total);
	/* A large model that keeps making progress gets more start-up time; a hang does not. */
	systemd_notify_extend_timeout(30ull * 1000000ull, NULL);
}

static void loader_release(void *owner)
{
	struct loader *ld = owner;
	serve_chat_model_free(&ld->chat);
	grammar_cache_free(ld->grammars);
	grammar_vocab_free(ld->gvocab);
	model_q4_free(ld->draft);
	tok_free(ld->draft_tok);
	model_q4_free(ld->model);
	tok_free(ld->tok);
	free(ld);
}

/* The model's chat templates. They come from the file's metadata, read again after the load
 * (which closed the file and dropped its pages: only the header pages are read back). A
 * template that does not parse is logged and replaced by the built-in ChatML, so the model
 * is still served. */
/* Compiled grammars kept for requests that use them again (a tool's schema, an app's JSON
 * format): each holds its per-position token sets, so a hit skips the precomputation. */
#define LOADER_GRAMMARS_CACHED 32

static void loader_chat(struct loader *ld)
{
	struct hearth_error e;
	struct gguf_file *f = NULL;
	int rc = gguf_open(&f, ld->cfg.model, &e);
	if (rc == 0)
		rc = serve_chat_model_load(&ld->chat, f, ld->tok, ld->cfg.chat_template, &e);
	gguf_close(f);
	if (rc < 0) {
		log_warning(ld->log, "chat template: %s; chat uses the built-in ChatML", e.msg);
		serve_chat_model_load(&ld->chat, NULL, ld->tok, NULL, &e);
	}
	log_notice(ld->log, "chat template: %s%s", ld->chat.origin,
		   !strcmp(ld->chat.origin, "chatml") ? " (built in: the model has none)" : "");
}

/* The context the draft is loaded for: max_context, or the draft's trained context when
 * that is shorter (the loader refuses a longer one). Sequences longer than it are drafted
 * for by the lookup alone (draft.c). */
static uint32_t loader_draft_context(const char *path, uint32_t max_context)
{
	struct gguf_file *f = NULL;
	struct hearth_error e;
	struct gguf_str arch;
	uint32_t n = 0;
	char key[96];
	if (gguf_open(&f, path, &e) < 0)
		return max_context; /* load_q4 names the problem */
	if (gguf_get_str(f, "general.architecture", &arch, &e) == 0) {
		snprintf(key, sizeof key, "%.*s.context_length", (int)arch.len, arch.ptr);
		if (gguf_get_u32(f, key, &n, &e) < 0)
			n = 0;
	}
	gguf_close(f);
	return n && n < max_context ? n : max_context;
}

/* The draft model: loaded as the model is (the same weight layout, threads, NUMA node and
 * page kind; its own KV budget), refused unless its vocabulary is the model's token for
 * token, and stepped once. The scheduler drafts from it (sched_params.draft). */
static int loader_draft(struct loader *ld, const struct load_opts *model_opts, struct hearth_error *err)
{
	const struct hearth_config *cfg = &ld->cfg;
	struct load_opts o = *model_opts;
	o.kv_budget = cfg->draft_kv_budget;
	o.max_context = loader_draft_context(cfg->draft_model, model_opts->max_context);
	o.load_record = NULL;
	o.placement = NULL;
	log_info(ld->log, "loading the draft model %s (kv_budget %llu bytes)", cfg->draft_model,
		 (unsigned long long)cfg->draft_kv_budget);
	int rc = load_q4(&ld->draft, &ld->draft_tok, cfg->draft_model, &o, err);
	if (rc < 0) {
		hearth_error_prefix(err, "draft_model");
		return rc;
	}
	if ((rc = draft_vocab_check(ld->tok, ld->draft_tok, err)) < 0) {
		hearth_error_prefix(err, "draft_model %s cannot draft for %s", cfg->draft_model, cfg->model);
		return rc;
	}
	/* One compute thread steps both models: one pool of workers serves both. */
	bool shared = model_q4_share_pool(ld->draft, ld->model);
	model_q4_engine(ld->draft, &ld->draft_eng);
	int32_t tok0 = tok_bos(ld->tok) >= 0 ? tok_bos(ld->tok) : 0;
	struct hearth_error we;
	if ((rc = engine_warm_up(&ld->draft_eng, tok0, &we)) < 0)
		return hearth_error_set(err, we.code, "draft_model %s: the warm-up step failed: %s", cfg->draft_model,
					we.msg);
	struct model_q4_facts f;
	model_q4_facts(ld->draft, &f);
	log_notice(ld->log, "draft model: %s, %llu parameters, %s; arena %zu bytes, %s pages; %s", f.name,
		   (unsigned long long)f.n_params, f.quant, f.arena_bytes, f.arena_backing,
		   shared ? "the model's compute threads" : "compute threads of its own");
	ld->sched.draft = &ld->draft_eng;
	ld->sm.draft_arena = f.arena;
	return 0;
}

static void *loader_main(void *arg)
{
	struct loader *ld = arg;
	const struct hearth_config *cfg = &ld->cfg;
	struct load_opts o;
	load_opts_default(&o);
	o.max_context = cfg->max_context;
	o.kv_budget = cfg->kv_budget;
	o.kv_rings_extra = !cfg->kv_budget_set;
	o.kv_type = cfg->kv_type == CONFIG_KV_BF16 ? QTYPE_BF16
		    : cfg->kv_type == CONFIG_KV_Q8 ? QTYPE_KV_Q8
		    : cfg->kv_type == CONFIG_KV_F32 ? QTYPE_F32 /* the loader refuses it, by name */
						   : QTYPE_F16;
	o.act = cfg->weights == CONFIG_WEIGHTS_W4A8 ? Q4_ACT_A8 : Q4_ACT_A16;
	o.weights_group = cfg->weights_group == CONFIG_GROUP_32 ? LOAD_GROUP_32 : LOAD_GROUP_128;
	o.head_bits = cfg->head == CONFIG_HEAD_INT8 ? LOAD_HEAD_INT8
		      : cfg->head == CONFIG_HEAD_INT4 ? LOAD_HEAD_INT4
						     : 0;
	o.mix = cfg->weights_mix == CONFIG_MIX_OFF ? LOAD_MIX_OFF : LOAD_MIX_AUTO;
	o.n_threads = cfg->threads;
	o.arena.numa_node = cfg->numa_node;
	o.arena.lock_memory = cfg->lock_memory;
	switch (cfg->hugepages) {
	case CONFIG_HUGEPAGES_HUGETLB: o.arena.pages = ARENA_PAGES_HUGETLB; break;
	case CONFIG_HUGEPAGES_THP: o.arena.pages = ARENA_PAGES_THP; break;
	case CONFIG_HUGEPAGES_NONE: o.arena.pages = ARENA_PAGES_NONE; break;
	default: o.arena.pages = ARENA_PAGES_AUTO; break;
	}
	sched_params_default(&ld->sched);
	o.max_seqs = ld->sched.max_seqs;
	o.step_tokens = ld->sched.step_tokens;
	o.progress = loader_progress;
	o.progress_ctx = ld;
	o.load_record = &ld->load_record;

	struct hearth_error e;
	log_info(ld->log, "loading %s (max_context %u, kv_budget %llu bytes, %s, weights_group %u, head %s, weights_mix %s)",
		 cfg->model, cfg->max_context, (unsigned long long)cfg->kv_budget,
		 cfg->weights == CONFIG_WEIGHTS_W4A8 ? "w4a8" : "w4a16", o.weights_group,
		 o.head_bits == LOAD_HEAD_INT8 ? "int8" : o.head_bits == LOAD_HEAD_INT4 ? "int4" : "auto",
		 o.mix == LOAD_MIX_OFF ? "off" : "auto");
	if (load_q4(&ld->model, &ld->tok, cfg->model, &o, &e) < 0) {
		server_model_failed(ld->srv, &e);
		free(ld);
		return NULL;
	}
	struct model_q4 *m = ld->model;
	struct model_q4_facts f;
	model_q4_facts(m, &f);
	log_notice(ld->log, "arena: %zu bytes, %s pages; %s", f.arena_bytes, f.arena_backing, f.arena_note);
	log_notice(ld->log, "weights: %s, %u of %u matrices carried over without re-rounding, %u int8; kernels %s, %zu threads",
		   f.quant, f.n_carried, f.n_matrices, f.n_int8, f.kernels, f.n_threads);

	server_progress(ld->srv, "warming up", 0, 1);
	model_q4_engine(m, &ld->sm.eng);
	/* A model that cannot take one step is not served: the load fails with the step's error
	 * (no READY=1 at start; a swap keeps the old model). */
	int32_t tok0 = tok_bos(ld->tok) >= 0 ? tok_bos(ld->tok) : 0;
	struct hearth_error we;
	if (engine_warm_up(&ld->sm.eng, tok0, &we) < 0) {
		hearth_error_set(&e, we.code, "%s: the warm-up step failed: %s", cfg->model, we.msg);
		server_model_failed(ld->srv, &e);
		loader_release(ld);
		return NULL;
	}
	if (cfg->draft_model[0] && loader_draft(ld, &o, &e) < 0) {
		server_model_failed(ld->srv, &e);
		loader_release(ld);
		return NULL;
	}
	loader_chat(ld);
	ld->sm.chat = &ld->chat;
	if (grammar_vocab_new(&ld->gvocab, ld->tok, &e) < 0 ||
	    grammar_cache_new(&ld->grammars, ld->gvocab, LOADER_GRAMMARS_CACHED, &e) < 0) {
		hearth_error_prefix(&e, "%s: the grammar index of the vocabulary", cfg->model);
		server_model_failed(ld->srv, &e);
		loader_release(ld);
		return NULL;
	}
	ld->sm.grammars = ld->grammars;
	ld->sm.tok = ld->tok;
	ld->sm.sched = &ld->sched;
	ld->sm.arena = f.arena;
	ld->sm.load = &ld->load_record;
	if (ld->load_record.valid)
		log_notice(ld->log, "load: RssAnon peak %zu MiB, settled %zu MiB, transient %zu MiB",
			   ld->load_record.peak_anon >> 20, ld->load_record.settled_anon >> 20,
			   ld->load_record.transient >> 20);
	ld->sm.release = loader_release;
	ld->sm.owner = ld;
	ld->sm.info = (struct msg_model_info){
		.arch = { f.arch, strlen(f.arch) },
		.name = { f.name, strlen(f.name) },
		.quant = { f.quant, strlen(f.quant) },
		.n_params = f.n_params,
		.n_ctx = f.max_context,
		.n_ctx_train = f.n_ctx_train,
		.n_vocab = f.n_vocab,
		.n_layer = f.n_layer,
		.n_embd = f.n_embd,
		.chat_template = { ld->chat.origin, strlen(ld->chat.origin) },
	};
	if (ld->sm.eng.pooling != MODEL_POOLING_UNSPECIFIED) {
		const char *pn = embed_pooling_name((enum model_pooling)ld->sm.eng.pooling);
		ld->sm.info.pooling = (struct msg_bytes){ pn, strlen(pn) };
	}
	/* From here the server owns ld (through sm.release). */
	server_model_ready(ld->srv, &ld->sm);
	return NULL;
}

/* server_load_fn: one detached thread per load; it reports through the server. */
static int serve_load(void *ctx, struct server *srv, const struct hearth_config *cfg,
		      struct hearth_error *err)
{
	struct loader *ld = calloc(1, sizeof *ld);
	if (!ld)
		return hearth_error_set(err, HEARTH_ENOMEM, "out of memory for a loader");
	ld->cfg = *cfg;
	ld->srv = srv;
	ld->log = ctx;
	pthread_t t;
	pthread_attr_t attr;
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	int rc = pthread_create(&t, &attr, loader_main, ld);
	pthread_attr_destroy(&attr);
	if (rc != 0) {
		free(ld);
		return hearth_error_errno(err, HEARTH_EIO, rc, "cannot start a loader thread");
	}
	return 0;
}

static void serve_usage(FILE *to)
{
	fprintf(to,
		"usage: hearthd [-c FILE] [--KEY=VALUE ...] [-o KEY=VALUE ...] [-t] [-V]\n"
		"  -c, --config FILE    configuration file (default %s when it exists)\n"
		"  -o, --set KEY=VALUE  set a configuration key; --KEY=VALUE does the same\n"
		"  -t, --check-config   check the configuration, print it, and exit\n"
		"  -V, --version\n"
		"  -h, --help\n"
		"Keys are those of hearthd.conf(5): model, max_context, kv_budget, weights,\n"
		"weights_group (128|32), head (int4|int8), threads, ... e.g. --weights-group=32\n"
		"In-process modes: hearthd --model M --prompt TEXT [-n N]; hearthd --bench ...\n",
		config_default_path());
}

int main(int argc, char **argv)
{
	const char *config_path = NULL;
	bool check_only = false;
	const char **sets = calloc((size_t)argc + 1, sizeof *sets);
	char **owned = calloc((size_t)argc + 1, sizeof *owned);
	size_t n_sets = 0, n_owned = 0;
	int rc = 0;
	if (!sets || !owned) {
		fprintf(stderr, "hearthd: out of memory\n");
		return 1;
	}
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-c") || !strcmp(a, "--config")) {
			if (++i == argc)
				goto usage;
			config_path = argv[i];
		} else if (!strncmp(a, "--config=", 9)) {
			config_path = a + 9;
		} else if (!strcmp(a, "-o") || !strcmp(a, "--set")) {
			if (++i == argc)
				goto usage;
			sets[n_sets++] = argv[i];
		} else if (!strcmp(a, "-t") || !strcmp(a, "--check-config")) {
			check_only = true;
		} else if (!strcmp(a, "-V") || !strcmp(a, "--version")) {
			printf("hearthd %s\n", PACKAGE_VERSION);
			goto out;
		} else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			serve_usage(stdout);
			goto out;
		} else if (!strncmp(a, "--", 2) && a[2]) {
			/* --key=value, or --key value */
			const char *eq = strchr(a, '=');
			char *pair;
			if (eq) {
				pair = strdup(a + 2);
			} else {
				if (++i == argc)
					goto usage;
				size_t n = strlen(a + 2) + strlen(argv[i]) + 2;
				pair = malloc(n);
				if (pair)
					snprintf(pair, n, "%s=%s", a + 2, argv[i]);
			}
			if (!pair) {
				rc = 1;
				goto out;
			}
			owned[n_owned++] = pair;
			sets[n_sets++] = pair;
		} else {
			fprintf(stderr, "hearthd: unexpected argument '%s'\n", a);
			goto usage;
		}
	}
	if (!config_path && access(config_default_path(), F_OK) == 0)
		config_path = config_default_path();

	struct hearth_config cfg;
	struct hearth_error e;
	if (config_build(&cfg, config_path, sets, n_sets, &e) < 0) {
		fprintf(stderr, "hearthd: %s\n", e.msg);
		rc = EXIT_NOT_CONFIGURED;
		goto out;
	}
	if (check_only) {
		char buf[4096];
		for (size_t k = 0; config_key_at(k); k++)
			if (config_format(&cfg, config_key_at(k), buf, sizeof buf, NULL) == 0)
				printf("%s = %s\n", config_key_at(k), buf);
		goto out;
	}

	/* A peer that closes before reading its reply must cost an EPIPE, not the process:
	 * libuv writes with write(2), which has no MSG_NOSIGNAL, and a shell or a container
	 * leaves SIGPIPE at its default (systemd ignores it for us; nothing else does). */
	struct sigaction ign = { .sa_handler = SIG_IGN };
	sigemptyset(&ign.sa_mask);
	sigaction(SIGPIPE, &ign, NULL);

	struct log lg;
	log_open(&lg, 2, cfg.log_level, getenv("JOURNAL_STREAM"));
	const char *kern = getenv("HEARTH_KERNELS");
	if (kern_select(kern) < 0) {
		log_error(&lg, "HEARTH_KERNELS=%s: unknown or not supported by this CPU", kern);
		rc = EXIT_NOT_CONFIGURED;
		goto out;
	}
	int listen_fd = -1;
	int got = systemd_listen_fd(&listen_fd, &e);
	if (got < 0) {
		log_error(&lg, "%s", e.msg);
		rc = EXIT_NOT_CONFIGURED;
		goto out;
	}
	struct server *srv;
	if (server_new(&srv, &cfg, config_path, sets, n_sets, &lg, got ? listen_fd : -1, serve_load,
		       &lg, &e) < 0) {
		log_error(&lg, "%s", e.msg);
		rc = 1;
		goto out;
	}
	if (server_run(srv, &e) < 0) {
		log_error(&lg, "stopped: %s", e.msg);
		rc = 1;
	}
	server_free(srv);
	if (rc == 0)
		log_notice(&lg, "stopped cleanly");
	goto out;
usage:
	serve_usage(stderr);
	rc = EXIT_BAD_ARGS;
out:
	for (size_t i = 0; i < n_owned; i++)
		free(owned[i]);
	free(owned);
	free(sets);
	return rc;
}
