/* Tokenize on the thread pool, for tokenize and embed requests; see offload.h. */
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
	/* An embed (em != NULL): its texts, and what serve_embed_tokens makes of them. */
	struct msg_embed *em;
	int pooling;
	uint32_t max_ctx, n_vocab, *ends, n_total;
	enum msg_errcode code;
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
	if (w->em) {
		w->rc = serve_embed_tokens(w->tok, w->max_ctx, w->n_vocab, w->em, &w->ids, &w->ends, &w->n_total,
					   &w->code, &w->err);
		goto done;
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
done:;
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
	if (w->em) {
		size_t n_in = w->em->n_input;
		free(w->em);
		if (ss->closing) {
			free(w->ids);
			free(w->ends);
		} else if (w->rc < 0) {
			session_reply_error(ss, w->id, w->code, w->err.msg);
		} else {
			session_embed_submit(ss, w->id, w->pooling, n_in, w->ids, w->ends, w->n_total);
		}
		w->ids = NULL;
	} else if (!ss->closing) {
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

/* Queues w (from offload_new) on the pool. */
static void offload_queue(struct session *ss, struct offload_tok *w)
{
	struct server *srv = ss->srv;
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
		free(w->text);
		free(w->em);
		session_reply_error(ss, w->id, MSG_ERR_INTERNAL, "cannot queue the tokenization");
		free(w);
	}
}

/* A job for request id, or NULL with the refusal sent (the connection's share of workers
 * taken, or no memory). */
static struct offload_tok *offload_new(struct session *ss, uint64_t id)
{
	if (ss->lim.offloaded >= OFFLOAD_PER_CLIENT) {
		char why[128];
		snprintf(why, sizeof why, "this connection already has %u long texts being tokenized",
			 ss->lim.offloaded);
		session_reply_error(ss, id, MSG_ERR_BUSY, why);
		return NULL;
	}
	struct offload_tok *w = calloc(1, sizeof *w);
	if (!w) {
		session_reply_error(ss, id, MSG_ERR_INTERNAL, "out of memory");
		return NULL;
	}
	*w = (struct offload_tok){ .ss = ss, .tok = ss->srv->model.tok, .id = id };
	return w;
}

void offload_tokenize(struct session *ss, uint64_t id, char *text, size_t len, bool add_bos,
		      bool special)
{
	struct offload_tok *w = offload_new(ss, id);
	if (!w) {
		free(text);
		return;
	}
	w->text = text;
	w->len = len;
	w->add_bos = add_bos;
	w->special = special;
	offload_queue(ss, w);
}

void offload_embed(struct session *ss, uint64_t id, int pooling, struct msg_embed *em)
{
	struct offload_tok *w = offload_new(ss, id);
	if (!w) {
		free(em);
		return;
	}
	w->em = em;
	w->pooling = pooling;
	w->max_ctx = ss->srv->model.eng.max_context;
	w->n_vocab = ss->srv->model.eng.n_vocab;
	offload_queue(ss, w);
}

void offload_quiesce(struct server *srv)
{
	pthread_mutex_lock(&srv->offload_mu);
	while (srv->offload_busy > 0)
		pthread_cond_wait(&srv->offload_cv, &srv->offload_mu);
	pthread_mutex_unlock(&srv->offload_mu);
}
