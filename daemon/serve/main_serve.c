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

#include "daemon/serve/cache_dir.h"
#include "daemon/serve/calib.h"
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
#include "protocol/clock.h"

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
	/* The draft model's engine (config draft_model): the model is model->draft, loaded
	 * into the model's arena and freed with it, so a swap replaces both together. */
	struct engine draft_eng;
	uint64_t extend_ns;   /* when EXTEND_TIMEOUT_USEC last went out (CLOCK_MONOTONIC) */
};

/* Progress to the server (STATUS=, clients waiting) and the start timeout; false once the
 * daemon is stopping. */
static bool loader_report(struct loader *ld, const char *phase, const char *what, uint64_t done, uint64_t total)
{
	char text[128];
	/* "repacking blk.12.attn_q.weight": the tensor's block is what a person looks for. */
	snprintf(text, sizeof text, "%s %s", phase, what ? what : "");
	bool go_on = server_progress(ld->srv, text, done, total);
	/* A large model that keeps making progress gets more start-up time; a hang does not.
	 * Once a second is plenty for a 30 s extension: per tensor, a model of a thousand
	 * tensors would send the service manager a thousand datagrams. */
	uint64_t now = hearth_now_ns();
	if (!ld->extend_ns || now - ld->extend_ns >= 1000000000ull) {
		ld->extend_ns = now;
		systemd_notify_extend_timeout(30ull * 1000000ull, NULL);
	}
	return go_on;
}

static void loader_progress(void *ctx, const char *phase, const char *what, uint64_t done, uint64_t total)
{
	loader_report(ctx, phase, what, done, total);
}

static void loader_release(void *owner)
{
	struct loader *ld = owner;
	serve_chat_model_free(&ld->chat);
	grammar_cache_free(ld->grammars);
	grammar_vocab_free(ld->gvocab);
	model_q4_free(ld->model); /* and its draft, in the same arena */
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
#define LOADER_WEIGHTS_SUFFIX ".weights" /* weights_cache's files: <model file>-<model hash>.weights */

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

/* The arena's regions, the model's and then its draft's ("draft.*"), for the log. */
static void loader_log_regions(struct loader *ld, const struct arena *a)
{
	char text[1024];
	size_t used = 0;
	text[0] = '\0';
	for (size_t i = 0; i < a->n_regions && used < sizeof text; i++) {
		int w = snprintf(text + used, sizeof text - used, "%s%s %zu", i ? ", " : "", a->regions[i].name,
				 a->regions[i].size);
		if (w > 0)
			used += (size_t)w;
	}
	log_info(ld->log, "arena plan: %s", text);
}

/* The draft model load_q4 put into the model's arena (config draft_model): stepped once,
 * on the model's compute threads, then handed to the scheduler (sched_params.draft) and
 * named in the welcome. */
static int loader_draft(struct loader *ld, struct hearth_error *err)
{
	const struct hearth_config *cfg = &ld->cfg;
	struct model_q4 *d = ld->model->draft;
	model_q4_engine(d, &ld->draft_eng);
	int32_t tok0 = tok_bos(ld->tok) >= 0 ? tok_bos(ld->tok) : 0;
	struct hearth_error we;
	int rc = engine_warm_up(&ld->draft_eng, tok0, &we);
	if (rc < 0)
		return hearth_error_set(err, we.code, "draft_model %s: the warm-up step failed: %s", cfg->draft_model,
					we.msg);
	struct model_q4_facts f;
	model_q4_facts(d, &f);
	struct kv_stats ks;
	kv_stats(&d->kv, &ks);
	log_notice(ld->log, "draft model: %s, %llu parameters, %s, context %u; in the model's arena (KV %zu bytes); the model's compute threads",
		   f.name, (unsigned long long)f.n_params, f.quant, f.max_context, ks.pool_bytes + ks.ring_bytes);
	ld->sched.draft = &ld->draft_eng;
	return 0;
}

/* welcome.model.draft: the draft model's facts (strings point into the model). */
static void loader_draft_info(const struct model_q4 *d, struct msg_model_info *info)
{
	struct model_q4_facts f;
	model_q4_facts(d, &f);
	info->has_draft = true;
	info->draft = (struct msg_draft_info){
		.arch = { f.arch, strlen(f.arch) },
		.name = { f.name, strlen(f.name) },
		.quant = { f.quant, strlen(f.quant) },
		.n_params = f.n_params,
		.n_ctx = f.max_context,
		.n_layer = f.n_layer,
		.n_embd = f.n_embd,
	};
}

/* calib_make's progress: sampled tokens, shown and timed as the load's own; a stop ends
 * the sampling (minutes on a large model) at the next step. */
static bool loader_calib_progress(void *ctx, size_t done, size_t total)
{
	return loader_report(ctx, "calibrating:", "sampling the model", done, total);
}

/* imatrix = self: the file an earlier start made, or one made now by sampling the model
 * (remake: the cached one was refused). A cache directory that cannot be written is not
 * fatal: the file is then made for this load only. */
static int loader_calibrate(struct loader *ld, struct load_opts *o, struct calib *cal, bool remake,
			    struct hearth_error *err)
{
	const struct hearth_config *cfg = &ld->cfg;
	int rc;
	if (!remake) {
		if ((rc = calib_locate(cal, cfg, o, err)) < 0)
			return rc;
		if (calib_ready(cal)) {
			log_info(ld->log, "imatrix = self: %s, made at an earlier start", cal->path);
			o->imatrix = cal->path;
			return 0;
		}
	}
	log_notice(ld->log, "imatrix = self: sampling %zu sequences of %zu tokens from %s for GPTQ's statistics (%s%s)",
		   cal->n_seqs, cal->len, cfg->model, cal->cached ? "kept in " : "no cache directory: made at every start",
		   cal->cached ? cal->where.dir : "");
	uint64_t t0 = hearth_now_ns();
	rc = calib_make(cal, cfg->model, o, loader_calib_progress, ld, err);
	if (rc < 0 && rc != HEARTH_ECANCELED && cal->cached) {
		log_warning(ld->log, "%s; made for this load only instead", err->msg);
		if ((rc = calib_temporary(cal, err)) == 0)
			rc = calib_make(cal, cfg->model, o, loader_calib_progress, ld, err);
	}
	if (rc == HEARTH_ECANCELED)
		log_notice(ld->log, "imatrix = self: the sampling was stopped after %.1f s (hearthd is stopping); nothing kept",
			   (double)(hearth_now_ns() - t0) / 1e9);
	if (rc < 0)
		return rc;
	log_notice(ld->log, "imatrix = self: %s made in %.1f s", cal->path, (double)(hearth_now_ns() - t0) / 1e9);
	o->imatrix = cal->path;
	cal->made = true;
	return 0;
}

/* weights_cache's file for the model, or false when there is none to keep (off, no
 * directory): DIR/<model file>-<model hash>.weights, one per model file, its header keying
 * the settings it was packed with. */
static bool loader_weights_cache(struct loader *ld, struct cache_dir *cd, char *path, size_t cap)
{
	const struct hearth_config *cfg = &ld->cfg;
	char why[HEARTH_ERROR_MSG_MAX];
	int rc = cache_dir_weights(cd, cfg->weights_cache, cfg->model, why, sizeof why);
	if (rc < 0)
		log_warning(ld->log, "%s; the packed weights are not kept", why);
	if (rc <= 0)
		return false;
	if (snprintf(path, cap, "%s/%s" LOADER_WEIGHTS_SUFFIX, cd->dir, cd->stem) >= (int)cap) {
		log_warning(ld->log, "weights_cache: %s: path too long; the packed weights are not kept", cd->dir);
		return false;
	}
	cache_dir_drop_parts(path);
	return true;
}

/* What the load did with weights_cache's file, in the log; a file written replaces this
 * model file's older versions' files. */
static void loader_weights_cached(struct loader *ld, const struct cache_dir *cd, const char *path,
				  const struct load_cache_report *r)
{
	if (r->refused[0])
		log_notice(ld->log, "%s; repacked", r->refused);
	if (r->outcome == LOAD_CACHE_READ)
		log_notice(ld->log, "weights: %.1f MiB of packed matrices read from %s, nothing repacked",
			   (double)r->bytes / (1 << 20), path);
	else if (r->outcome == LOAD_CACHE_WRITTEN) {
		log_info(ld->log, "weights: %.1f MiB of packed matrices kept in %s for the next start",
			 (double)r->bytes / (1 << 20), path);
		cache_dir_drop_stale(cd, strlen(LOADER_WEIGHTS_SUFFIX), LOADER_WEIGHTS_SUFFIX);
	} else if (r->outcome == LOAD_CACHE_UNWRITTEN)
		log_warning(ld->log, "%s; the packed weights are not kept", r->unwritten);
}

static void *loader_main(void *arg)
{
	struct loader *ld = arg;
	const struct hearth_config *cfg = &ld->cfg;
	struct load_opts o;
	config_load_opts(cfg, &o);
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
		 o.head_bits == LOAD_HEAD_INT8   ? "int8"
		 : o.head_bits == LOAD_HEAD_INT6 ? "int6"
		 : o.head_bits == LOAD_HEAD_INT4 ? "int4"
						 : "auto",
		 o.mix == LOAD_MIX_OFF ? "off" : "auto");
	struct calib cal = { 0 };
	char why[HEARTH_ERROR_MSG_MAX];
	bool self = calib_wanted(cfg, &o, why, sizeof why);
	if (!strcmp(cfg->imatrix, CONFIG_IMATRIX_AUTO))
		log_info(ld->log, "imatrix = auto: %s%s", self ? "self-calibrated, kept for later starts" : "plain rounding: ",
			 why);
	if (self && loader_calibrate(ld, &o, &cal, false, &e) < 0) {
		server_model_failed(ld->srv, &e);
		free(ld);
		return NULL;
	}
	if (o.imatrix)
		log_info(ld->log, "with the imatrix %s steering the int4 scale search", o.imatrix);
	if (o.draft.path)
		log_info(ld->log, "with the draft model %s in the same arena (draft_kv_budget %llu bytes)",
			 o.draft.path, (unsigned long long)o.draft.kv_budget);
	struct cache_dir wcd;
	char wpath[PATH_MAX];
	struct load_cache_report wrep;
	if (loader_weights_cache(ld, &wcd, wpath, sizeof wpath)) {
		o.weights_cache = wpath;
		o.cache_report = &wrep;
	}
	int rc = load_q4(&ld->model, &ld->tok, cfg->model, &o, &e);
	/* A cached file the load refuses (damaged, or written by something else) is made anew
	 * once; a file made just now that fails is the load's error. */
	if (rc < 0 && self && !cal.made && calib_ready(&cal) && strstr(e.msg, cal.path)) {
		log_warning(ld->log, "imatrix = self: %s; making it again", e.msg);
		calib_drop(&cal, true);
		if ((rc = loader_calibrate(ld, &o, &cal, true, &e)) == 0)
			rc = load_q4(&ld->model, &ld->tok, cfg->model, &o, &e);
	}
	calib_drop(&cal, false);
	if (rc < 0) {
		server_model_failed(ld->srv, &e);
		free(ld);
		return NULL;
	}
	if (o.cache_report)
		loader_weights_cached(ld, &wcd, wpath, &wrep);
	struct model_q4 *m = ld->model;
	struct model_q4_facts f;
	model_q4_facts(m, &f);
	log_notice(ld->log, "arena: %zu bytes, %s pages%s; %s", f.arena_bytes, f.arena_backing,
		   m->draft ? ", the draft model's regions included" : "", f.arena_note);
	loader_log_regions(ld, m->arena);
	log_notice(ld->log, "weights: %s, %u of %u matrices carried over without re-rounding, %u int8, %u int6; kernels %s, "
		   "%zu threads", f.quant, f.n_carried, f.n_matrices, f.n_int8, f.n_int6, f.kernels, f.n_threads);
	/* An imatrix whose names match none of the model's matrices (or a model whose every
	 * matrix was carried over) steers nothing: say so, or the key looks as if it worked. */
	if (o.imatrix && f.n_gptq)
		log_notice(ld->log, "imatrix %s steered %u int4 matrices; GPTQ rounded %u against its covariances",
			   o.imatrix, f.n_imatrix, f.n_gptq);
	else if (o.imatrix)
		log_notice(ld->log, "imatrix %s steered %u int4 matrices%s", o.imatrix, f.n_imatrix,
			   f.n_imatrix ? "" : ": none of its statistics name a matrix quantized at load");

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
	if (m->draft && loader_draft(ld, &e) < 0) {
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
	if (m->draft)
		loader_draft_info(m->draft, &ld->sm.info);
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
		"weights_group (128|32), head (int4|int6|int8), threads, ... e.g. --weights-group=32\n"
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
