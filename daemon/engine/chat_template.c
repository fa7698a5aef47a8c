/* The chat-facing face of the Jinja subset: parse once into an immutable tree, render per
 * request into its own arena with the inputs marked as message data, hand back the text
 * with its spans, and tokenize it span by span. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/chat_template.h"
#include "daemon/engine/jinja.h"

struct chat_template {
	struct jarena arena; /* the tree and its literals */
	const struct jnode *root;
	char *origin;
};

#define DEFAULT_STEPS 10000000ull
#define DEFAULT_DEPTH 64u
#define DEFAULT_OUTPUT ((size_t)8 << 20)
#define DEFAULT_RANGE ((size_t)100000)
#define DEFAULT_MEMORY ((size_t)256 << 20)
/* a template's source is bounded too: real ones are under 100 KiB */
#define MAX_SOURCE ((size_t)4 << 20)

static int fail_from_ctx(const struct jctx *c, const char *origin, struct hearth_error *err)
{
	int code = c->code == JX_LIMIT ? HEARTH_ERANGE : c->code == JX_SYNTAX ? HEARTH_EFORMAT : HEARTH_EINVAL;
	if (c->line)
		return hearth_error_set(err, code, "%s:%u:%u: %s", origin, c->line, c->col, c->msg);
	return hearth_error_set(err, code, "%s: %s", origin, c->msg);
}

int chat_template_new(struct chat_template **out, const char *source, size_t len, const char *origin,
		      struct hearth_error *err)
{
	*out = NULL;
	if (!origin)
		origin = "template";
	if (len > MAX_SOURCE)
		return hearth_error_set(err, HEARTH_ERANGE, "%s: template of %zu bytes is over the limit of %zu",
					origin, len, MAX_SOURCE);
	struct chat_template *t = calloc(1, sizeof *t);
	if (!t || !(t->origin = strdup(origin))) {
		free(t);
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: no memory for the template", origin);
	}
	ja_init(&t->arena, DEFAULT_MEMORY);
	/* volatile: read after longjmp */
	struct jctx *volatile c = calloc(1, sizeof *c);
	if (!c) {
		chat_template_free(t);
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: no memory for the parser", origin);
	}
	c->arena = &t->arena;
	c->origin = t->origin;
	c->lim.string = MAX_SOURCE;
	if (setjmp(c->jb)) {
		int rc = fail_from_ctx(c, t->origin, err);
		free(c);
		chat_template_free(t);
		return rc;
	}
	size_t n_tok;
	struct jtoken *toks = jinja_lex(c, source, len, &n_tok);
	t->root = jinja_parse(c, toks, n_tok);
	free(c);
	*out = t;
	return 0;
}

void chat_template_free(struct chat_template *t)
{
	if (!t)
		return;
	ja_free(&t->arena);
	free(t->origin);
	free(t);
}

static const struct jstr *sym(struct jctx *c, const char *s)
{
	return jstr_cstr(c, s);
}

static int export_text(const struct jbuf *b, struct chat_text *out, const char *origin, struct hearth_error *err)
{
	size_t n_spans = 0;
	for (size_t i = 0; i < b->len; i++)
		if (i == 0 || b->m[i] != b->m[i - 1])
			n_spans++;
	out->text = malloc(b->len + 1);
	out->spans = malloc((n_spans ? n_spans : 1) * sizeof *out->spans);
	if (!out->text || !out->spans) {
		chat_text_free(out);
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: no memory for %zu bytes of output", origin, b->len);
	}
	memcpy(out->text, b->s, b->len);
	out->text[b->len] = 0;
	out->len = b->len;
	for (size_t i = 0; i < b->len; i++) {
		if (i == 0 || b->m[i] != b->m[i - 1]) {
			out->spans[out->n_spans++] = (struct chat_span){ i, 0, b->m[i] != 0 };
		}
		out->spans[out->n_spans - 1].len++;
	}
	return 0;
}

int chat_template_render(const struct chat_template *t, const struct chat_render_opts *o,
			 struct chat_text *out, struct hearth_error *err)
{
	memset(out, 0, sizeof *out);
	if (o->messages && !json_is_array(o->messages))
		return hearth_error_set(err, HEARTH_EINVAL, "%s: messages must be an array", t->origin);
	if (o->vars && !json_is_object(o->vars))
		return hearth_error_set(err, HEARTH_EINVAL, "%s: template variables must be an object", t->origin);
	struct jarena arena;
	const struct chat_limits *l = &o->limits;
	ja_init(&arena, l->memory ? l->memory : DEFAULT_MEMORY);
	struct jctx *volatile c = calloc(1, sizeof *c);
	if (!c)
		return hearth_error_set(err, HEARTH_ENOMEM, "%s: no memory for the render", t->origin);
	c->arena = &arena;
	c->origin = t->origin;
	c->lim.steps = l->steps ? l->steps : DEFAULT_STEPS;
	c->lim.depth = l->depth ? l->depth : DEFAULT_DEPTH;
	c->lim.output = l->output ? l->output : DEFAULT_OUTPUT;
	c->lim.string = c->lim.output;
	c->lim.range = l->range ? l->range : DEFAULT_RANGE;
	c->now = o->now;
	if (setjmp(c->jb)) {
		int rc = fail_from_ctx(c, t->origin, err);
		free(c);
		ja_free(&arena);
		return rc;
	}
	struct jframe *root = jf_new(c, NULL);
	jf_set(c, root, sym(c, "messages"),
	       o->messages ? jv_from_json(c, o->messages, true) : jv_list(jl_new(c, 0, JL_LIST)));
	/* without tools the name stays undefined, as the reference renderings have it */
	if (o->tools)
		jf_set(c, root, sym(c, "tools"), jv_from_json(c, o->tools, true));
	jf_set(c, root, sym(c, "add_generation_prompt"), jv_bool(o->add_generation_prompt));
	jf_set(c, root, sym(c, "bos_token"), jv_str(jstr_cstr(c, o->bos_token ? o->bos_token : "")));
	jf_set(c, root, sym(c, "eos_token"), jv_str(jstr_cstr(c, o->eos_token ? o->eos_token : "")));
	if (o->vars) {
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)o->vars, k, v)
			jf_set(c, root, jstr_new(c, k, strlen(k), false), jv_from_json(c, v, true));
	}
	struct jbuf buf;
	jb_init(c, &buf, 4096);
	jinja_render(c, t->root, jf_new(c, root), &buf);
	int rc = export_text(&buf, out, t->origin, err);
	free(c);
	ja_free(&arena);
	return rc;
}

void chat_text_free(struct chat_text *out)
{
	free(out->text);
	free(out->spans);
	memset(out, 0, sizeof *out);
}

const char *chat_template_chatml(void)
{
	return "{%- for message in messages %}"
	       "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
	       "{%- endfor %}"
	       "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

int chat_text_tokenize(const struct tok *t, const struct chat_text *x, bool add_bos, int32_t *ids, size_t cap,
		       size_t *n, struct hearth_error *err)
{
	struct tok_segment *seg = malloc((x->n_spans ? x->n_spans : 1) * sizeof *seg);
	if (!seg)
		return hearth_error_set(err, HEARTH_ENOMEM, "chat_text_tokenize: no memory for %zu spans",
					x->n_spans);
	for (size_t i = 0; i < x->n_spans; i++)
		seg[i] = (struct tok_segment){ x->text + x->spans[i].off, x->spans[i].len,
					       !x->spans[i].from_message };
	int rc = tok_encode_segments(t, seg, x->n_spans, add_bos, ids, cap, n, err);
	free(seg);
	return rc;
}
