/* Tokenize on the thread pool; see offload.h. */
#include "daemon/serve/offload.h"

#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/tokenizer.h"
#include "daemon/serve/serve.h"

struct offload_tok {
	uv_work_t req;
	struct session *ss;
	const struct tok *tok;
	uint64_t id;
	char *text;
	size_t len;
	bool add_bos, special;
	int32_t *ids;
	size_t n;
	int rc;
	struct hearth_error err;
};

static void offload_tok_work(uv_work_t *req)
{
	struct offload_tok *w = req->data;
	/* Below the loop thread: on a busy machine a long tokenization must not take the
	 * core from the thread that answers every other client (Linux: per thread). */
	static _Thread_local bool lowered;
	if (!lowered) {
		setpriority(PRIO_PROCESS, (id_t)gettid(), 10);
		lowered = true;
	}
	size_t cap = w->len + 8;
	if (cap > MSG_ARRAY_MAX)
		cap = MSG_ARRAY_MAX;
	w->ids = malloc(cap * sizeof *w->ids);
	if (!w->ids)
		w->rc = hearth_error_set(&w->err, HEARTH_ENOMEM, "out of memory");
	else
		w->rc = tok_encode(w->tok, w->text, w->len, w->add_bos, w->special, w->ids, cap,
				   &w->n, &w->err);
	free(w->text);
	w->text = NULL;
	struct server *srv = w->ss->srv;
	pthread_mutex_lock(&srv->offload_mu);
	srv->offload_busy--;
	pthread_cond_broadcast(&srv->offload_cv);
	pthread_mutex_unlock(&srv->offload_mu);
}

static void offload_tok_done(uv_work_t *req, int status)
{
	struct offload_tok *w = req->data;
	struct session *ss = w->ss;
	(void)status;
	if (!ss->closing) {
		if (w->rc < 0) {
			session_reply_error(ss, w->id,
					    w->rc == HEARTH_ERANGE ? MSG_ERR_TOO_LARGE
					    : w->rc == HEARTH_ENOMEM ? MSG_ERR_INTERNAL
								  : MSG_ERR_BAD_FIELD,
					    w->err.msg);
		} else {
			struct msg r;
			msg_init(&r, MSG_TOKENS, w->id);
			r.u.tokens.tokens = (uint32_t *)w->ids; /* ids are < n_vocab: non-negative */
			r.u.tokens.n_tokens = w->n;
			session_reply(ss, &r);
		}
	}
	free(w->ids);
	free(w);
	ss->lim.offloaded--;
	session_unhold(ss);
}

void offload_tokenize(struct session *ss, uint64_t id, char *text, size_t len, bool add_bos,
		      bool special)
{
	struct server *srv = ss->srv;
	if (ss->lim.offloaded >= OFFLOAD_PER_CLIENT) {
		free(text);
		char why[128];
		snprintf(why, sizeof why, "this connection already has %u long texts being tokenized",
			 ss->lim.offloaded);
		session_reply_error(ss, id, MSG_ERR_BUSY, why);
		return;
	}
	struct offload_tok *w = calloc(1, sizeof *w);
	if (!w) {
		free(text);
		session_reply_error(ss, id, MSG_ERR_INTERNAL, "out of memory");
		return;
	}
	*w = (struct offload_tok){ .ss = ss, .tok = srv->model.tok, .id = id, .text = text,
				   .len = len, .add_bos = add_bos, .special = special };
	w->req.data = w;
	pthread_mutex_lock(&srv->offload_mu);
	srv->offload_busy++;
	pthread_mutex_unlock(&srv->offload_mu);
	ss->n_inflight++;
	ss->lim.offloaded++;
	if (uv_queue_work(&srv->loop, &w->req, offload_tok_work, offload_tok_done) < 0) {
		pthread_mutex_lock(&srv->offload_mu);
		srv->offload_busy--;
		pthread_mutex_unlock(&srv->offload_mu);
		ss->n_inflight--;
		ss->lim.offloaded--;
		free(text);
		free(w);
		session_reply_error(ss, id, MSG_ERR_INTERNAL, "cannot queue the tokenization");
	}
}

void offload_quiesce(struct server *srv)
{
	pthread_mutex_lock(&srv->offload_mu);
	while (srv->offload_busy > 0)
		pthread_cond_wait(&srv->offload_cv, &srv->offload_mu);
	pthread_mutex_unlock(&srv->offload_mu);
}
