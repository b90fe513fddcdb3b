/* template_api.c - the public chat-template API: compile a template once, render it with a JSON
 * context. A compiled template is immutable: renders on several threads may share it. */
#include <string.h>
#include <time.h>

#include "text/template.h"

struct kwk_template {
    struct tarena arena;
    struct tsyms syms;
    struct tnode *root;
    int dialect;
};

#define TPL_DEFAULT_STEPS 5000000ull
#define TPL_DEFAULT_DEPTH 100
#define TPL_DEFAULT_OUTPUT ((size_t)16 << 20)
#define TPL_DEFAULT_MEMORY ((size_t)256 << 20)
#define TPL_MAX_SOURCE ((size_t)4 << 20)

void kwk_template_opts_init(struct kwk_template_opts *o)
{
    memset(o, 0, sizeof *o);
    o->trim_blocks = 1;
    o->lstrip_blocks = 1;
    o->dialect = KWK_TEMPLATE_JINJA2;
}

void kwk_render_opts_init(struct kwk_render_opts *o)
{
    memset(o, 0, sizeof *o);
}

kwk_template *kwk_template_new(const char *src, size_t len, const struct kwk_template_opts *opts,
                               struct kwk_err *err)
{
    struct kwk_template_opts dflt;
    struct ttoken *toks;
    size_t n_toks;
    struct kwk_err local;
    if (!err)
        err = &local;
    kwk_err_clear(err);
    if (!opts) {
        kwk_template_opts_init(&dflt);
        opts = &dflt;
    }
    if (!src && len) {
        kwk_err_set(err, KWK_EARG, "template source is NULL");
        return NULL;
    }
    if (len > TPL_MAX_SOURCE) {
        kwk_err_set(err, KWK_ELIMIT, "template source of %zu bytes exceeds the %zu byte limit",
                    len, TPL_MAX_SOURCE);
        return NULL;
    }
    kwk_template *t = kwk_calloc(1, sizeof *t);
    if (!t) {
        kwk_err_set(err, KWK_ELIMIT, "out of memory");
        return NULL;
    }
    /* The tree of a legitimate template is a small multiple of its source. */
    ta_init(&t->arena, 64 * len + ((size_t)1 << 20));
    t->dialect = opts->dialect;
    struct tlex_opts lo = {.trim_blocks = opts->trim_blocks, .lstrip_blocks = opts->lstrip_blocks};
    if (tpl_lex(src ? src : "", len, &lo, &t->arena, &toks, &n_toks, err) ||
        tpl_parse(toks, n_toks, &t->arena, &t->syms, &t->root, err)) {
        kwk_template_free(t);
        return NULL;
    }
    return t;
}

void kwk_template_free(kwk_template *t)
{
    if (!t)
        return;
    ta_free(&t->arena);
    kwk_free(t);
}

void kwk_string_free(char *s)
{
    kwk_free(s);
}

static int context_from_json(struct trender *r, const char *json, size_t len, struct tv *out)
{
    if (!json || !len) {
        return tv_new_dict(r, 0, out);
    }
    int rc = tpl_json_parse(r, json, len, out);
    if (!rc && out->k != TV_DICT)
        rc = tpl_fail(r, KWK_EARG, NULL, "context JSON must be an object");
    return rc;
}

int kwk_template_render(const kwk_template *t, const char *context_json, size_t len,
                        const struct kwk_render_opts *opts, char **out, size_t *out_len,
                        struct kwk_err *err)
{
    struct kwk_render_opts dflt;
    struct kwk_err local;
    if (!err)
        err = &local;
    kwk_err_clear(err);
    if (!t || !out)
        return kwk_err_set(err, KWK_EARG, "kwk_template_render: NULL template or output");
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (!opts) {
        kwk_render_opts_init(&dflt);
        opts = &dflt;
    }
    struct tarena arena;
    ta_init(&arena, opts->max_memory ? opts->max_memory : TPL_DEFAULT_MEMORY);
    struct tbuf buf;
    struct trender r = {
        .a = &arena,
        .syms = &t->syms,
        .err = err,
        .dialect = t->dialect,
        .max_steps = opts->max_steps ? opts->max_steps : TPL_DEFAULT_STEPS,
        .max_depth = opts->max_depth > 0 ? opts->max_depth : TPL_DEFAULT_DEPTH,
        .max_output = opts->max_output ? opts->max_output : TPL_DEFAULT_OUTPUT,
        .now = opts->now,
        .have_now = opts->have_now,
        .out = &buf,
        .sym_loop = -2,
    };
    tb_init(&buf, r.max_output);
    tpl_work = 0;
    struct tv ctx;
    int rc = context_from_json(&r, context_json, len, &ctx);
    if (!rc)
        rc = tpl_render_root(&r, t->root, &ctx);
    if (!rc && buf.err)
        rc = tpl_fail(&r, KWK_ELIMIT, NULL, "template output exceeds its size limit");
    if (!rc && !buf.p) {
        buf.p = kwk_malloc(1);
        if (buf.p)
            buf.p[0] = 0;
        else
            rc = kwk_err_set(err, KWK_ELIMIT, "out of memory");
    }
    if (rc) {
        if (!err->code)
            kwk_err_set(err, rc, "template render failed");
        tb_free(&buf);
    } else {
        *out = buf.p;
        if (out_len)
            *out_len = buf.n;
    }
    ta_free(&arena);
    return rc;
}
