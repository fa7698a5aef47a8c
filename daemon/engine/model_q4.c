/* One batched step of the int4 model on the thread pool: every op is split across the pinned
 * threads (matmuls by row blocks, the rest by tokens or by token x KV head) with a barrier
 * between ops, inside a single pool_run, so a step costs no allocation and no syscall
 * between its ops (a worker yields once as the step starts, for a client woken onto its
 * CPU: kernels/pool.h). The batch mixes sequences: each row carries its sequence and
 * position, attention reads each row's own paged KV. */
#include "daemon/engine/model_q4.h"

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct engine_seq {
	struct kv_seq *kv;
	uint32_t n_past;           /* positions whose K/V are in the cache */
	uint32_t n_tentative;      /* of them, the last step's draft positions, unpublished */
	int32_t *tokens;           /* ids of those positions (max_context) */
	bool used;
	bool private_;             /* ENGINE_SHARE_PRIVATE: nothing matched or published */
};

/* Activations of one input, prepared once per distinct weight group among the matrices
 * that read it (a file that mixes carried-over g32 and requantized g64/g128 tensors), in
 * mq4_group_slot order. */
struct step_acts {
	struct q4_acts g[MQ4_GROUP_SLOTS];
	unsigned have;             /* bit s: slot s is prepared */
};

/* The shared tail of a matmul phase (matmul_phase), one cache line each. */
struct mm_queue {
	_Alignas(64) atomic_size_t next;
};

struct step {
	struct model_q4 *m;
	const struct engine_span *spans;
	size_t n_spans;
	uint32_t T;                /* rows (tokens) in the step */
	uint32_t L;                /* rows whose logits are wanted */
	bool row_per_seq;          /* every row is the only row of its sequence */
	bool want_embd;            /* a span wants its rows' final hidden states */
	enum vec_kv_type kv_type;  /* the cache's element type, as the vec kernels name it */
	struct mm_queue mmq[2];    /* matmul phases use them in turn (matmul_phase) */
};

/* ---- the pieces of a step, each run by every thread on its share ---- */

static void split(size_t n, size_t t, size_t nt, size_t *b, size_t *e)
{
	pool_split(n, 1, t, nt, b, e);
}

static void acts_setup(struct step *st, struct step_acts *a, size_t n_tok, size_t cols, unsigned need)
{
	a->have = need;
	for (int s = 0; s < MQ4_GROUP_SLOTS; s++)
		if (need & 1u << s)
			q4_acts_init(&a->g[s], st->m->act, n_tok, cols, mq4_slot_group(s),
				     (uint8_t *)st->m->acts_mem + st->m->acts_off[s]);
}

/* Prepares a's prepared slots for rows [b, e) of x. */
static void acts_rows(const struct model_q4 *m, struct step_acts *a, const float *x, size_t ldx, size_t b,
		      size_t e)
{
	for (int s = 0; s < MQ4_GROUP_SLOTS; s++)
		if (a->have & 1u << s)
			m->kern->acts_prepare(&a->g[s], x, ldx, b, e);
}

static void acts_fill(struct step *st, struct step_acts *a, const float *x, size_t ldx,
		      size_t n_tok, size_t t, size_t nt)
{
	size_t b, e;
	split(n_tok, t, nt, &b, &e);
	if (b < e)
		acts_rows(st->m, a, x, ldx, b, e);
}

/* One matrix of a matmul phase: int4, or int8 where the loader's mix rule (or head_bits)
 * chose it; both layouts are 16-row blocks of block_bytes and read the same activations. */
struct mm_mat {
	const struct q4_matrix *w4;
	const struct q8_matrix *w8; /* non-NULL: this one, not w4 */
};

static size_t mm_group(const struct mm_mat *w)
{
	return w->w8 ? w->w8->group : w->w4->group;
}

static size_t mm_rows_of(const struct mm_mat *w)
{
	return w->w8 ? w->w8->rows : w->w4->rows;
}

/* Layer l's matrix i (MQ4_WQ ..) as the step multiplies by it. */
static struct mm_mat layer_mat(const struct mq4_layer *L, int i)
{
	const struct q4_matrix *w4[MQ4_LAYER_MATRICES] = { &L->wq, &L->wk, &L->wv, &L->wo,
							   &L->gate, &L->up, &L->down };
	return (struct mm_mat){ w4[i], L->w8[i].data ? &L->w8[i] : NULL };
}

/* A matmul phase: matrices ws[0..n) that read one input with no barrier between them.
 * Each thread first runs its even share of every matrix's leading row blocks; the
 * trailing ones (a quarter of each matrix, at most MM_TAIL_BYTES) are then handed out
 * MM_CHUNK_BYTES at a time, so the thread whose memory ran faster takes more of them and
 * the barrier after the phase waits less than it would for shares fixed in advance, which
 * the slowest thread decides. Which thread computes a row never changes the row's result. The phases use
 * the two queues in turn: thread 0 clears the other one, which nobody touches until the
 * next phase, a barrier later. */
#define MM_TAIL_BYTES (512u << 10)
#define MM_CHUNK_BYTES (32u << 10)

struct mm_plan {
	size_t blocks, lead, chunk, n_chunks; /* in row blocks, but n_chunks */
};

static void mm_plan_of(const struct mm_mat *w, struct mm_plan *p)
{
	size_t block_bytes = w->w8 ? w->w8->block_bytes : w->w4->block_bytes;
	size_t cap = MM_TAIL_BYTES / block_bytes;
	p->blocks = (mm_rows_of(w) + Q4_ROWS - 1) / Q4_ROWS;
	size_t tail = p->blocks / 4 < cap ? p->blocks / 4 : cap;
	/* chunks of an even number of blocks: the W4A8 GEMV reads blocks in pairs */
	p->chunk = ((MM_CHUNK_BYTES + block_bytes - 1) / block_bytes + 1) & ~(size_t)1;
	p->lead = p->blocks - tail;
	p->n_chunks = (tail + p->chunk - 1) / p->chunk;
}

static void mm_rows(struct step *st, const struct mm_mat *w, const struct step_acts *a, float *y,
		    size_t b0, size_t b1)
{
	size_t rows = mm_rows_of(w);
	size_t r1 = b1 * Q4_ROWS < rows ? b1 * Q4_ROWS : rows;
	const struct q4_acts *acts = &a->g[mq4_group_slot(mm_group(w))];
	if (b0 >= b1)
		return;
	if (w->w8)
		st->m->kern->q8_matmul(w->w8, acts, y, rows, b0 * Q4_ROWS, r1);
	else
		st->m->kern->matmul(w->w4, acts, y, rows, b0 * Q4_ROWS, r1);
}

static void matmul_phase(struct step *st, size_t *phase, const struct mm_mat *ws, float *const *ys,
			 size_t n, const struct step_acts *a, size_t t, size_t nt)
{
	atomic_size_t *next = &st->mmq[*phase & 1].next;
	struct mm_plan plan[3];
	size_t total = 0, b, e;
	if (t == 0)
		atomic_store_explicit(&st->mmq[(*phase + 1) & 1].next, 0, memory_order_relaxed);
	(*phase)++;
	for (size_t i = 0; i < n; i++) {
		mm_plan_of(&ws[i], &plan[i]);
		pool_split(plan[i].lead, 1, t, nt, &b, &e);
		mm_rows(st, &ws[i], a, ys[i], b, e);
		total += plan[i].n_chunks;
	}
	for (size_t c; (c = atomic_fetch_add_explicit(next, 1, memory_order_relaxed)) < total;) {
		size_t i = 0;
		while (c >= plan[i].n_chunks)
			c -= plan[i++].n_chunks;
		b = plan[i].lead + c * plan[i].chunk;
		e = b + plan[i].chunk < plan[i].blocks ? b + plan[i].chunk : plan[i].blocks;
		mm_rows(st, &ws[i], a, ys[i], b, e);
	}
}

/* An int6 embedding/head (kernels/q6.h, group 32) reads the same activations as the int4
 * matrices. */
static void matmul6(struct step *st, const struct q6_matrix *w, const struct step_acts *a, float *y,
		    size_t t, size_t nt)
{
	size_t b, e;
	pool_split(w->rows, Q4_ROWS, t, nt, &b, &e);
	if (b < e)
		st->m->kern->q6_matmul(w, &a->g[mq4_group_slot(Q6_GROUP)], y, w->rows, b, e);
}

/* An int8 embedding/head (kernels/q8.h) reads the same activations as the int4 matrices. */
static void matmul8(struct step *st, const struct q8_matrix *w, const struct step_acts *a, float *y,
		    size_t t, size_t nt)
{
	size_t b, e;
	pool_split(w->rows, Q4_ROWS, t, nt, &b, &e);
	if (b < e)
		st->m->kern->q8_matmul(w, &a->g[mq4_group_slot(w->group)], y, w->rows, b, e);
}

/* The slots (acts_setup's need) the matrices ws[0..n) read. */
static unsigned groups_of(const struct mm_mat *ws, size_t n)
{
	unsigned need = 0;
	for (size_t i = 0; i < n; i++)
		need |= 1u << mq4_group_slot(mm_group(&ws[i]));
	return need;
}

/* model_q4_observe's call for matrices mats[0..n) of layer l reading x: thread 0 only, after
 * the barrier that completed x and before its share of their product (x is read-only
 * until the phase's closing barrier). */
static void observe_input(const struct step *st, uint32_t l, const int *mats, size_t n, const float *x,
			  size_t cols, size_t t)
{
	const struct model_q4 *m = st->m;
	if (!m->observe || t != 0)
		return;
	for (size_t i = 0; i < n; i++)
		m->observe(m->observe_arg, l, mats[i], x, st->T, cols);
}

/* Bias, per-head q/k norm and RoPE at row i's position for KV heads [h0, h1) and the
 * query heads that share them, then their K and V into the row's sequence's cache. */
static void qkv_post(struct step *st, const struct mq4_layer *L, uint32_t l, size_t i, size_t h0,
		     size_t h1)
{
	struct model_q4 *m = st->m;
	const struct kern_table *k = m->kern;
	size_t n_rep = L->n_head / L->n_head_kv, hd = L->head_dim, hdv = L->head_dim_v;
	size_t nq = (size_t)L->n_head * hd, nk = (size_t)L->n_head_kv * hd, nv = (size_t)L->n_head_kv * hdv;
	size_t q0 = h0 * n_rep * hd, q1 = h1 * n_rep * hd;
	float *q = m->q + i * nq, *kk = m->k + i * nk, *v = m->v + i * nv;
	if (L->bq)
		for (size_t j = q0; j < q1; j++)
			q[j] += L->bq[j];
	if (L->bk)
		for (size_t j = h0 * hd; j < h1 * hd; j++)
			kk[j] += L->bk[j];
	if (L->bv)
		for (size_t j = h0 * hdv; j < h1 * hdv; j++)
			v[j] += L->bv[j];
	if (L->q_norm)
		for (size_t h = h0 * n_rep; h < h1 * n_rep; h++)
			k->rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, m->hp.norm_eps);
	if (L->k_norm)
		for (size_t h = h0; h < h1; h++)
			k->rmsnorm(kk + h * hd, kk + h * hd, L->k_norm, hd, m->hp.norm_eps);
	uint32_t pos = m->step_pos[i];
	const struct mq4_rope *r = L->rope;
	const float *cs = r->cos + (size_t)pos * (r->n_rot / 2);
	const float *sn = r->sin + (size_t)pos * (r->n_rot / 2);
	enum vec_rope_style style = m->hp.rope_style == OPS_ROPE_NEOX ? VEC_ROPE_NEOX : VEC_ROPE_NORM;
	k->rope(q + q0, (h1 - h0) * n_rep, hd, L->n_rot, style, cs, sn);
	k->rope(kk + h0 * hd, h1 - h0, hd, L->n_rot, style, cs, sn);
	struct engine_seq *s = m->step_seq[i];
	for (size_t h = h0; h < h1; h++) {
		k->to_kv(kv_seq_k(&m->kv, s->kv, l, pos, (uint32_t)h), kk + h * hd, hd, st->kv_type);
		k->to_kv(kv_seq_v(&m->kv, s->kv, l, pos, (uint32_t)h), v + h * hdv, hdv, st->kv_type);
	}
}

/* Attention units are (row, KV head group): whole rows unless there are too few rows to
 * keep every thread busy (one decoding sequence splits its KV heads). */
static size_t attn_groups(const struct step *st, const struct mq4_layer *L, size_t nt)
{
	size_t groups = (2 * nt + st->T - 1) / st->T;
	return groups > L->n_head_kv ? L->n_head_kv : groups;
}

/* Attention of row i over KV heads [h0, h1): one kernel call over the row's whole sequence
 * for all of them, which the kernel walks head by head and page by page (kernels/vec.h),
 * each head's n_rep query heads sharing each row read. The unnormalized sums accumulate
 * straight in the row's output. */
static void attend(struct step *st, const struct mq4_layer *L, uint32_t l, size_t i, size_t h0,
		   size_t h1, float *mx, float *sm)
{
	struct model_q4 *m = st->m;
	size_t n_rep = L->n_head / L->n_head_kv, hd = L->head_dim, hdv = L->head_dim_v;
	uint32_t pos = m->step_pos[i];
	uint32_t first = 0;
	if (L->window && pos + 1 > L->window)
		first = pos + 1 - L->window;
	const float *q = m->q + i * (size_t)L->n_head * hd;
	float *out = m->att + i * (size_t)L->n_head * hdv;
	struct vec_kv_span span = kv_seq_span(&m->kv, m->step_seq[i]->kv, l, (uint32_t)h0, (uint32_t)h1, first,
					      pos + 1 - first, st->kv_type);
	vec_attn_init(mx + h0 * n_rep, sm + h0 * n_rep, out + h0 * n_rep * hdv, (h1 - h0) * n_rep, hdv);
	m->kern->attn(q + h0 * n_rep * hd, n_rep, hd, &span, L->attn_scale, mx + h0 * n_rep, sm + h0 * n_rep,
		      out + h0 * n_rep * hdv);
	vec_attn_finish(out + h0 * n_rep * hdv, sm + h0 * n_rep, out + h0 * n_rep * hdv, (h1 - h0) * n_rep,
			hdv);
}

/* This thread's attention units. When every row is its own sequence's only row, a unit
 * also does its own q/k post-processing and K/V store first: it reads nothing another
 * unit writes, so no barrier separates the two. When units are whole rows (split by
 * rows, as acts_fill splits them) it also prepares the row's output for the o matmul. */
static void step_attention(struct step *st, const struct mq4_layer *L, uint32_t l, struct step_acts *o,
			   size_t t, size_t nt)
{
	struct model_q4 *m = st->m;
	size_t n_kv = L->n_head_kv, na = (size_t)L->n_head * L->head_dim_v;
	float *mx = m->attn_state + t * m->attn_state_stride;
	float *sm = mx + L->n_head;
	size_t groups = attn_groups(st, L, nt), b, e;
	split((size_t)st->T * groups, t, nt, &b, &e);
	for (size_t u = b; u < e; u++) {
		size_t i = u / groups, g = u % groups;
		size_t h0 = g * n_kv / groups, h1 = (g + 1) * n_kv / groups;
		if (st->row_per_seq)
			qkv_post(st, L, l, i, h0, h1);
		attend(st, L, l, i, h0, h1, mx, sm);
		if (groups == 1)
			acts_rows(m, o, m->att, na, i, i + 1);
	}
}

/* Rows of this thread's share (split by rows, as acts_fill splits them, so the ops below
 * need no barrier between them): add the last sublayer's output (in xb; first normalized
 * by post when a model has such a norm, as Gemma does) into the residual stream when
 * asked, then normalize into xb. */
static void step_rows_norm(struct step *st, const float *w, bool residual, const float *post,
			   size_t t, size_t nt)
{
	struct model_q4 *m = st->m;
	size_t E = m->hp.n_embd, b, e;
	split(st->T, t, nt, &b, &e);
	for (size_t i = b; i < e; i++) {
		float *x = m->x + i * E;
		float *d = m->xb + i * E;
		if (residual && post)
			m->kern->rmsnorm(d, d, post, E, m->hp.norm_eps);
		if (residual)
			for (size_t j = 0; j < E; j++)
				x[j] += d[j];
		if (w)
			m->kern->rmsnorm(m->xb + i * E, x, w, E, m->hp.norm_eps);
	}
}

/* Barriers are where the step loses bandwidth (both threads wait for the slower one), so
 * every op that works on whole rows runs on the same row split as the one before it and
 * the two share a phase. Per layer: norm+acts | qkv | (post) | attention(+acts) | (acts) |
 * o | residual+norm+acts | gate,up | silu+acts | down; the bracketed barriers only when
 * a sequence has several rows in the step or a row's heads are split across threads. */
static void step_run(void *arg, size_t t, size_t nt)
{
	struct step *st = arg;
	struct model_q4 *m = st->m;
	struct pool *p = m->pool;
	size_t E = m->hp.n_embd, T = st->T, b, e, phase = 0;
	struct step_acts a;

	bool int8 = m->head_bits == 8, int6 = m->head_bits == 6;
	split(T, t, nt, &b, &e);
	for (size_t i = b; i < e; i++) {
		float *x = m->x + i * E;
		if (int8)
			q8_unpack_rows(&m->embd8, (size_t)m->step_tokens_buf[i], 1, x, E);
		else if (int6)
			q6_unpack_rows(&m->embd6, (size_t)m->step_tokens_buf[i], 1, x, E);
		else
			q4_unpack_rows(&m->embd, (size_t)m->step_tokens_buf[i], 1, x, E);
		if (m->hp.embd_scale != 1.0f)
			for (size_t j = 0; j < E; j++)
				x[j] *= m->hp.embd_scale;
	}

	for (uint32_t l = 0; l < m->n_layer; l++) {
		const struct mq4_layer *L = &m->layers[l];
		const float *prev_post = l > 0 ? m->layers[l - 1].ffn_post_norm : NULL;
		size_t na = (size_t)L->n_head * L->head_dim_v;

		step_rows_norm(st, L->attn_norm, l > 0, prev_post, t, nt);
		const struct mm_mat qkv[3] = { layer_mat(L, MQ4_WQ), layer_mat(L, MQ4_WK), layer_mat(L, MQ4_WV) };
		acts_setup(st, &a, T, E, groups_of(qkv, 3));
		acts_fill(st, &a, m->xb, E, T, t, nt);
		pool_barrier(p);
		observe_input(st, l, (const int[]){ MQ4_WQ, MQ4_WK, MQ4_WV }, 3, m->xb, E, t);
		matmul_phase(st, &phase, qkv, (float *const[]){ m->q, m->k, m->v }, 3, &a, t, nt);
		pool_barrier(p);
		if (!st->row_per_seq) {
			split(T, t, nt, &b, &e);
			for (size_t i = b; i < e; i++)
				qkv_post(st, L, l, i, 0, L->n_head_kv);
			pool_barrier(p);
		}
		const struct mm_mat o[1] = { layer_mat(L, MQ4_WO) };
		acts_setup(st, &a, T, na, groups_of(o, 1));
		step_attention(st, L, l, &a, t, nt);
		pool_barrier(p);
		observe_input(st, l, (const int[]){ MQ4_WO }, 1, m->att, na, t);
		if (attn_groups(st, L, nt) > 1) {
			acts_fill(st, &a, m->att, na, T, t, nt);
			pool_barrier(p);
		}
		matmul_phase(st, &phase, o, &m->xb, 1, &a, t, nt);
		pool_barrier(p);
		step_rows_norm(st, L->ffn_norm, true, L->attn_post_norm, t, nt);
		const struct mm_mat gu[2] = { layer_mat(L, MQ4_GATE), layer_mat(L, MQ4_UP) };
		acts_setup(st, &a, T, E, groups_of(gu, 2));
		acts_fill(st, &a, m->xb, E, T, t, nt);
		pool_barrier(p);
		observe_input(st, l, (const int[]){ MQ4_GATE, MQ4_UP }, 2, m->xb, E, t);
		matmul_phase(st, &phase, gu, (float *const[]){ m->hb, m->hb2 }, 2, &a, t, nt);
		pool_barrier(p);
		split(T, t, nt, &b, &e);
		vec_silu_mul_fn act = m->hp.ffn_act == MODEL_FFN_GELU ? m->kern->gelu_mul : m->kern->silu_mul;
		for (size_t i = b; i < e; i++)
			act(m->hb + i * L->n_ff, m->hb2 + i * L->n_ff, L->n_ff);
		const struct mm_mat d[1] = { layer_mat(L, MQ4_DOWN) };
		acts_setup(st, &a, T, L->n_ff, groups_of(d, 1));
		acts_fill(st, &a, m->hb, L->n_ff, T, t, nt);
		pool_barrier(p);
		observe_input(st, l, (const int[]){ MQ4_DOWN }, 1, m->hb, L->n_ff, t);
		matmul_phase(st, &phase, d, &m->xb, 1, &a, t, nt);
		pool_barrier(p);
	}

	/* The head only for the rows whose logits someone wants; none (a prefill chunk or
	 * the warm-up) skips it. Its rows split differently, hence the barrier. Embedding
	 * rows need the last residual too; model_q4_forward norms them after the step. */
	if (st->L == 0 && !st->want_embd)
		return;
	step_rows_norm(st, NULL, true, m->layers[m->n_layer - 1].ffn_post_norm, t, nt);
	if (st->L == 0)
		return;
	pool_barrier(p);
	split(st->L, t, nt, &b, &e);
	for (size_t j = b; j < e; j++)
		m->kern->rmsnorm(m->xb + j * E, m->x + (size_t)m->logit_rows[j] * E, m->output_norm, E,
				 m->hp.norm_eps);
	const struct q4_matrix *head = m->output.data ? &m->output : &m->embd;
	const struct q8_matrix *head8 = m->output8.data ? &m->output8 : &m->embd8;
	const struct q6_matrix *head6 = m->output6.data ? &m->output6 : &m->embd6;
	size_t hg = int8 ? head8->group : int6 ? Q6_GROUP : head->group;
	acts_setup(st, &a, st->L, E, 1u << mq4_group_slot(hg));
	pool_barrier(p);
	if (m->observe && t == 0)
		m->observe(m->observe_arg, m->n_layer, m->hp.tied_output ? MQ4_OBSERVE_TIED_HEAD : MQ4_OBSERVE_OUTPUT,
			   m->xb, st->L, E);
	acts_fill(st, &a, m->xb, E, st->L, t, nt);
	pool_barrier(p);
	if (int8)
		matmul8(st, head8, &a, m->logits, t, nt);
	else if (int6)
		matmul6(st, head6, &a, m->logits, t, nt);
	else
		matmul_phase(st, &phase, &(struct mm_mat){ head, NULL }, &m->logits, 1, &a, t, nt);
	if (m->hp.logit_softcap > 0.0f) {
		/* cap * tanh(logit / cap), Gemma's final softcap: rows split anew after the
		 * head's barrier-free tail, hence one more barrier */
		float cap = m->hp.logit_softcap;
		pool_barrier(p);
		split((size_t)st->L * m->hp.n_vocab, t, nt, &b, &e);
		for (size_t j = b; j < e; j++)
			m->logits[j] = cap * tanhf(m->logits[j] / cap);
	}
}

int model_q4_forward(struct model_q4 *m, const struct engine_span *spans, size_t n_spans,
		     struct hearth_error *err)
{
	uint32_t T = 0, L = 0;
	for (size_t i = 0; i < n_spans; i++) {
		const struct engine_span *sp = &spans[i];
		struct engine_seq *s = sp->seq;
		if (T + sp->n > m->step_tokens)
			return hearth_error_set(err, HEARTH_ERANGE, "a step of more than %u tokens",
						m->step_tokens);
		if (s->n_past + sp->n > kv_seq_reserved(s->kv))
			return hearth_error_set(err, HEARTH_EKVFULL,
						"sequence would hold %u positions; %u are reserved",
						s->n_past + sp->n, kv_seq_reserved(s->kv));
		uint32_t rows = sp->logits ? (sp->n_logits > 1 ? sp->n_logits : 1) : 0;
		if (sp->embd && sp->logits)
			return hearth_error_set(err, HEARTH_EINVAL, "a span wants both logits and embeddings");
		if (rows > sp->n || L + rows > m->max_seqs)
			return hearth_error_set(err, HEARTH_ERANGE,
						"%u logit rows of a %u-token span; a step returns at most %u",
						rows, sp->n, m->max_seqs);
		for (uint32_t j = 0; j < sp->n; j++) {
			int32_t tok = sp->tokens[j];
			if (tok < 0 || (uint32_t)tok >= m->hp.n_vocab)
				return hearth_error_set(err, HEARTH_EINVAL,
							"token %d is outside the vocabulary (%u)", tok,
							m->hp.n_vocab);
			m->step_tokens_buf[T] = tok;
			m->step_pos[T] = s->n_past + j;
			m->step_seq[T] = s;
			T++;
		}
		for (uint32_t j = rows; j > 0; j--)
			m->logit_rows[L++] = T - j;
	}
	if (T == 0)
		return 0;
	bool row_per_seq = true, want_embd = false;
	for (size_t i = 0; i < n_spans; i++)
		want_embd |= spans[i].embd != NULL;
	for (size_t i = 0; i < n_spans && row_per_seq; i++) {
		row_per_seq = spans[i].n == 1;
		for (size_t j = 0; j < i && row_per_seq; j++)
			row_per_seq = spans[j].seq != spans[i].seq;
	}
	struct step st = {
		.m = m, .spans = spans, .n_spans = n_spans, .T = T, .L = L,
		.row_per_seq = row_per_seq,
		.want_embd = want_embd,
		.kv_type = kv_elem_type(&m->kv) == QTYPE_BF16    ? VEC_KV_BF16
			   : kv_elem_type(&m->kv) == QTYPE_KV_Q8 ? VEC_KV_Q8
							    : VEC_KV_F16,
	};
	pool_run(m->pool, step_run, &st);

	/* Positions now hold K/V: advance, remember ids, and publish full blocks so later
	 * prompts that start the same way share them. A draft's tentative positions are not
	 * published: a shared block is never written again, and seq_truncate may hand them
	 * back to be rewritten; the next step publishes what was accepted. */
	uint32_t lrow = 0, row0 = 0;
	for (size_t i = 0; i < n_spans; i++) {
		const struct engine_span *sp = &spans[i];
		struct engine_seq *s = sp->seq;
		uint32_t rows = sp->logits ? (sp->n_logits > 1 ? sp->n_logits : 1) : 0;
		size_t E = m->hp.n_embd;
		if (sp->embd)
			for (uint32_t j = 0; j < sp->n; j++)
				m->kern->rmsnorm(sp->embd + j * E, m->x + (size_t)(row0 + j) * E, m->output_norm,
						 E, m->hp.norm_eps);
		row0 += sp->n;
		memcpy(s->tokens + s->n_past, sp->tokens, (size_t)sp->n * sizeof(int32_t));
		s->n_past += sp->n;
		s->n_tentative = rows > 1 ? rows - 1 : 0;
		if (rows)
			memcpy(sp->logits, m->logits + (size_t)lrow * m->hp.n_vocab,
			       (size_t)rows * m->hp.n_vocab * sizeof(float));
		lrow += rows;
		if (s->private_)
			continue;
		int rc = kv_seq_commit_filled(&m->kv, s->kv, s->tokens, s->n_past - s->n_tentative, err);
		if (rc < 0)
			return rc;
	}
	return 0;
}

int model_q4_prepare(struct model_q4 *m, struct hearth_error *err)
{
	m->seqs = calloc(m->max_seqs, sizeof *m->seqs);
	m->step_seq = calloc(m->step_tokens, sizeof *m->step_seq);
	m->step_tokens_buf = calloc(m->step_tokens, sizeof *m->step_tokens_buf);
	m->step_pos = calloc(m->step_tokens, sizeof *m->step_pos);
	m->logit_rows = calloc(m->step_tokens, sizeof *m->logit_rows);
	if (!m->seqs || !m->step_seq || !m->step_tokens_buf || !m->step_pos || !m->logit_rows)
		return hearth_error_set(err, HEARTH_ENOMEM, "model: out of memory for step bookkeeping");
	for (uint32_t i = 0; i < m->max_seqs; i++) {
		m->seqs[i].tokens = malloc((size_t)m->max_context * sizeof(int32_t));
		if (!m->seqs[i].tokens)
			return hearth_error_set(err, HEARTH_ENOMEM, "model: out of memory for sequence slots");
	}
	return 0;
}

/* ---- the engine interface ---- */

static int mq4_seq_open(void *impl, const int32_t *prompt, uint32_t n_prompt, uint32_t n_reserve,
			uint64_t share, struct engine_seq **out, uint32_t *n_cached, struct hearth_error *err)
{
	struct model_q4 *m = impl;
	struct kv_seq *ks;
	*out = NULL;
	*n_cached = 0;
	/* All sequence slots live is, to a client, the KV budget being full: the message
	 * kv_seq_new wrote stays, only the code changes. err may be NULL. */
	int rc = kv_seq_new(&m->kv, &ks, err);
	if (rc == HEARTH_EBUSY) {
		if (err)
			err->code = HEARTH_EKVFULL;
		return HEARTH_EKVFULL;
	}
	if (rc < 0)
		return rc;
	kv_seq_set_share(ks, share);
	bool priv = share == ENGINE_SHARE_PRIVATE;
	int matched = priv ? 0 : kv_seq_match_prefix(&m->kv, ks, prompt, n_prompt, err);
	if (matched < 0) {
		kv_seq_free(&m->kv, ks);
		return matched;
	}
	rc = kv_seq_reserve(&m->kv, ks, n_reserve, err);
	if (rc < 0) {
		kv_seq_free(&m->kv, ks);
		return rc;
	}
	struct engine_seq *s = &m->seqs[kv_seq_slot(ks)];
	s->kv = ks;
	s->used = true;
	s->private_ = priv;
	s->n_past = (uint32_t)matched;
	s->n_tentative = 0;
	memcpy(s->tokens, prompt, (size_t)matched * sizeof(int32_t));
	*n_cached = (uint32_t)matched;
	*out = s;
	return 0;
}

static void mq4_seq_close(void *impl, struct engine_seq *s)
{
	struct model_q4 *m = impl;
	if (!s || !s->used)
		return;
	kv_seq_free(&m->kv, s->kv);
	s->kv = NULL;
	s->used = false;
	s->n_past = 0;
}

static int mq4_forward(void *impl, const struct engine_span *spans, size_t n_spans,
		       struct hearth_error *err)
{
	return model_q4_forward(impl, spans, n_spans, err);
}

/* Rolling back a rejected draft: its positions' K/V stay in private blocks, to be
 * overwritten by the tokens that replace them; nothing was published, so no shared block
 * is touched (model_q4_forward). */
static int mq4_seq_truncate(void *impl, struct engine_seq *s, uint32_t n_past, struct hearth_error *err)
{
	(void)impl;
	if (s->private_ && n_past <= s->n_past) {
		s->n_past = n_past;
		s->n_tentative = 0;
		return 0;
	}
	if (n_past > s->n_past || n_past + s->n_tentative < s->n_past)
		return hearth_error_set(err, HEARTH_EINVAL,
					"truncate to %u of %u positions: only the %u tentative ones may go",
					n_past, s->n_past, s->n_tentative);
	s->n_tentative -= s->n_past - n_past;
	s->n_past = n_past;
	return 0;
}

static void mq4_kv_usage(void *impl, uint64_t *used, uint64_t *total)
{
	struct model_q4 *m = impl;
	struct kv_stats st;
	kv_stats(&m->kv, &st);
	/* a live sequence's ring is in use, however little it holds */
	*used = (uint64_t)st.blocks_used * st.block_bytes + (uint64_t)st.seqs_live * st.ring_bytes_per_seq;
	*total = (uint64_t)st.blocks_total * st.block_bytes + st.ring_bytes;
}

static void mq4_thread_init(void *impl)
{
	struct model_q4 *m = impl;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(m->cpus[0], &set);
	/* Best effort: under a restrictive CPUAffinity= the thread simply stays unpinned. */
	pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

void model_q4_facts(const struct model_q4 *m, struct model_q4_facts *out)
{
	uint32_t carried = 0, int8 = 0, int6 = 0;
	for (uint32_t i = 0; i < m->n_notes; i++) {
		carried += m->notes[i].carried;
		int8 += m->notes[i].bits == 8;
		int6 += m->notes[i].bits == 6;
	}
	*out = (struct model_q4_facts){
		.arch = m->arch_name, .name = m->name, .quant = m->quant_name, .n_params = m->n_params,
		.max_context = m->max_context, .n_ctx_train = m->hp.n_ctx_train, .n_vocab = m->hp.n_vocab,
		.n_layer = m->n_layer, .n_embd = m->hp.n_embd, .arena = m->arena, .arena_bytes = m->arena->size,
		.arena_backing = arena_backing_name(m->arena->backing), .arena_note = m->arena->note,
		.n_matrices = m->n_notes, .n_carried = carried, .n_int8 = int8, .n_int6 = int6, .n_imatrix = m->n_imatrix, .n_gptq = m->n_gptq,
		.kernels = m->kern->name,
		.n_threads = m->n_threads,
	};
}

void model_q4_observe(struct model_q4 *m,
		      void (*fn)(void *arg, uint32_t layer, int mat, const float *x, size_t n_tok, size_t cols),
		      void *arg)
{
	m->observe = fn;
	m->observe_arg = arg;
}

void model_q4_engine(struct model_q4 *m, struct engine *out)
{
	struct kv_stats st;
	kv_stats(&m->kv, &st);
	*out = (struct engine){
		.impl = m,
		.n_vocab = m->hp.n_vocab,
		.n_embd = m->hp.n_embd,
		.pooling = m->hp.pooling,
		.max_context = m->max_context,
		.kv_tokens = st.tokens_capacity,
		.seq_open = mq4_seq_open,
		.seq_close = mq4_seq_close,
		.forward = mq4_forward,
		.seq_truncate = mq4_seq_truncate,
		.max_logit_rows = m->max_seqs, /* the logits scratch holds max_seqs rows */
		.kv_usage = mq4_kv_usage,
		.thread_init = mq4_thread_init,
	};
}

void model_q4_free(struct model_q4 *m)
{
	if (!m)
		return;
	model_q4_free(m->draft);
	if (!m->pool_borrowed)
		pool_destroy(m->pool);
	kv_destroy(&m->kv);
	arena_destroy(&m->arena_own); /* empty in a draft: its model's arena is not its to free */
	if (m->seqs)
		for (uint32_t i = 0; i < m->max_seqs; i++)
			free(m->seqs[i].tokens);
	free(m->seqs);
	free(m->step_seq);
	free(m->step_tokens_buf);
	free(m->step_pos);
	free(m->logit_rows);
	free(m->layers);
	free(m->notes);
	free(m);
}
