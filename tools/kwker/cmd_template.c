/* cmd_template.c - kwker template: render a model's chat template over a conversation, as
 * transformers' apply_chat_template(tokenize=False) would. Single-threaded. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli.h"
#include "kwker.h"
#include "model/model.h"

struct tpl_source {
    char *text;         /* the template (kwk_malloc) */
    char *bos, *eos;    /* special tokens or NULL (kwk_malloc) */
};

static void source_free(struct tpl_source *s)
{
    kwk_free(s->text);
    kwk_free(s->bos);
    kwk_free(s->eos);
    memset(s, 0, sizeof *s);
}

static char *dup_n(const char *p, size_t n)
{
    char *s = n < SIZE_MAX ? kwk_malloc(n + 1) : NULL;
    if (s) {
        memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}

/* A special token in tokenizer_config.json: a string or an AddedToken {"content": ...}. */
static char *token_text(const json_t *v)
{
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return json_is_string(v) ? dup_n(json_string_value(v), json_string_length(v)) : NULL;
}

/* "chat_template" is a string, or a list of {name, template}: pick "tool_use" when tools are
 * given and it exists, else "default" (transformers' get_chat_template). */
static char *pick_template(const json_t *ct, int with_tools)
{
    if (json_is_string(ct))
        return dup_n(json_string_value(ct), json_string_length(ct));
    if (!json_is_array(ct))
        return NULL;
    const json_t *dflt = NULL, *tool = NULL, *item;
    size_t i;
    json_array_foreach(ct, i, item) {
        const char *name = json_string_value(json_object_get(item, "name"));
        const json_t *tpl = json_object_get(item, "template");
        if (!name || !json_is_string(tpl))
            continue;
        if (!strcmp(name, "default"))
            dflt = tpl;
        else if (!strcmp(name, "tool_use"))
            tool = tpl;
    }
    const json_t *t = with_tools && tool ? tool : dflt;
    return t ? dup_n(json_string_value(t), json_string_length(t)) : NULL;
}

static int load_folder(const char *dir, int with_tools, struct tpl_source *s, struct kwk_err *err)
{
    char path[4096];
    size_t n;
    int rc;
    json_t *cfg = NULL;
    if (!kwk_path_join(path, sizeof path, dir, "tokenizer_config.json") &&
        kwk_file_exists(path)) {
        json_error_t je;
        cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
        if (!cfg)
            return kwk_err_set(err, KWK_EFORMAT, "%s: %s (line %d)", path, je.text, je.line);
        s->bos = token_text(json_object_get(cfg, "bos_token"));
        s->eos = token_text(json_object_get(cfg, "eos_token"));
    }
    if (!s->bos || !s->eos) {
        json_t *map = NULL;
        if (!kwk_path_join(path, sizeof path, dir, "special_tokens_map.json") &&
            kwk_file_exists(path) && (map = json_load_file(path, 0, NULL))) {
            if (!s->bos)
                s->bos = token_text(json_object_get(map, "bos_token"));
            if (!s->eos)
                s->eos = token_text(json_object_get(map, "eos_token"));
            json_decref(map);
        }
    }
    /* A chat_template.jinja file next to the config wins, as in transformers. */
    if (!kwk_path_join(path, sizeof path, dir, "chat_template.jinja") && kwk_file_exists(path)) {
        rc = kwk_read_file(path, CLI_TEMPLATE_FILE_MAX, &s->text, &n, err);
    } else if (cfg && (s->text = pick_template(json_object_get(cfg, "chat_template"),
                                               with_tools))) {
        rc = 0;
    } else {
        rc = kwk_err_set(err, KWK_ENOTFOUND, "%s: no chat_template in tokenizer_config.json and "
                         "no chat_template.jinja", dir);
    }
    json_decref(cfg);
    return rc;
}

/* Token text of id in a GGUF vocabulary, or NULL. */
static char *gguf_token(const struct kwk_gguf *g, const char *id_key)
{
    int64_t id;
    const struct kwk_gguf_kv *kv = kwk_gguf_find(g, "tokenizer.ggml.tokens");
    if (kwk_gguf_get_i64(g, id_key, &id) || !kv || kv->type != KWK_GGUF_ARRAY ||
        kv->arr_type != KWK_GGUF_STRING || id < 0 || (uint64_t)id >= kv->arr_len)
        return NULL;
    const char **ptrs = calloc(kv->arr_len, sizeof *ptrs);
    size_t *lens = calloc(kv->arr_len, sizeof *lens);
    char *out = NULL;
    if (ptrs && lens && !kwk_gguf_arr_strings(kv, ptrs, lens))
        out = dup_n(ptrs[id], lens[id]);
    free(ptrs);
    free(lens);
    return out;
}

static int load_gguf(const char *path, struct tpl_source *s, struct kwk_err *err)
{
    struct kwk_gguf g;
    const char *p;
    size_t n;
    int rc = kwk_gguf_open(&g, path, err);
    if (rc)
        return rc;
    rc = kwk_gguf_get_str(&g, "tokenizer.chat_template", &p, &n);
    if (rc) {
        kwk_err_set(err, rc, "%s: no tokenizer.chat_template key", path);
    } else if (!(s->text = dup_n(p, n))) {
        rc = kwk_err_set(err, KWK_ELIMIT, "out of memory");
    } else {
        s->bos = gguf_token(&g, "tokenizer.ggml.bos_token_id");
        s->eos = gguf_token(&g, "tokenizer.ggml.eos_token_id");
    }
    kwk_gguf_close(&g);
    return rc;
}

static int load_source(const char *model, int with_tools, struct tpl_source *s,
                       struct kwk_err *err)
{
    size_t n, len = strlen(model);
    if (kwk_dir_exists(model))
        return load_folder(model, with_tools, s, err);
    if (len > 5 && !strcmp(model + len - 5, ".gguf"))
        return load_gguf(model, s, err);
    if (kwk_file_exists(model))
        return kwk_read_file(model, CLI_TEMPLATE_FILE_MAX, &s->text, &n, err);
    return kwk_err_set(err, KWK_ENOTFOUND, "%s: not a folder, .gguf or template file", model);
}

/* The context apply_chat_template builds: messages without None-valued keys, tools and
 * documents always defined, special tokens, then every other key of the request. */
static json_t *build_context(json_t *req, const struct tpl_source *s, int gen_override)
{
    json_t *ctx = json_object(), *msgs = json_array(), *in_msgs;
    if (json_is_array(req)) {
        in_msgs = req;
    } else {
        in_msgs = json_object_get(req, "messages");
        json_object_update(ctx, req);
    }
    size_t i;
    json_t *m;
    json_array_foreach(in_msgs, i, m) {
        json_t *copy = json_object();
        const char *k;
        json_t *v;
        json_object_foreach(m, k, v) {
            if (!json_is_null(v))
                json_object_set(copy, k, v);
        }
        json_array_append_new(msgs, copy);
    }
    json_object_set_new(ctx, "messages", msgs);
    if (!json_object_get(ctx, "tools"))
        json_object_set_new(ctx, "tools", json_null());
    if (!json_object_get(ctx, "documents"))
        json_object_set_new(ctx, "documents", json_null());
    if (gen_override >= 0)
        json_object_set_new(ctx, "add_generation_prompt", json_boolean(gen_override));
    else if (!json_object_get(ctx, "add_generation_prompt"))
        json_object_set_new(ctx, "add_generation_prompt", json_true());
    if (s->bos && !json_object_get(ctx, "bos_token"))
        json_object_set_new(ctx, "bos_token", json_string(s->bos));
    if (s->eos && !json_object_get(ctx, "eos_token"))
        json_object_set_new(ctx, "eos_token", json_string(s->eos));
    return ctx;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: kwker template --model M [--no-generation-prompt] [--now UNIX_SECONDS] "
            "messages.json\n"
            "  M: a folder with tokenizer_config.json (\"chat_template\") or chat_template.jinja,\n"
            "     a .gguf file (tokenizer.chat_template) or a .jinja file\n"
            "  messages.json: a list of messages, or {\"messages\": [...], \"tools\": [...],\n"
            "     \"add_generation_prompt\": true, ...} (other keys reach the template)\n");
}

int cmd_template(int argc, char **argv)
{
    const char *model = NULL, *msgs_path = NULL;
    int gen = -1, rc = 1;
    struct kwk_render_opts ro;
    kwk_render_opts_init(&ro);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(argv[i], "--no-generation-prompt")) {
            gen = 0;
        } else if (!strcmp(argv[i], "--now") && i + 1 < argc) {
            ro.now = strtoll(argv[++i], NULL, 10);
            ro.have_now = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        } else if (argv[i][0] != '-' && !msgs_path) {
            msgs_path = argv[i];
        } else {
            usage();
            return 2;
        }
    }
    if (!model || !msgs_path) {
        usage();
        return 2;
    }
    struct kwk_err err = {0};
    struct tpl_source src = {0};
    json_error_t je;
    json_t *req = json_load_file(msgs_path, 0, &je), *ctx = NULL;
    kwk_template *t = NULL;
    char *ctx_text = NULL, *out = NULL;
    size_t out_len = 0;
    if (!req) {
        fprintf(stderr, "kwker template: %s: %s (line %d)\n", msgs_path, je.text, je.line);
        goto out;
    }
    const json_t *tools = json_is_object(req) ? json_object_get(req, "tools") : NULL;
    if (load_source(model, tools && !json_is_null(tools), &src, &err)) {
        fprintf(stderr, "kwker template: %s\n", err.msg);
        goto out;
    }
    if (!(t = kwk_template_new(src.text, strlen(src.text), NULL, &err))) {
        fprintf(stderr, "kwker template: %s\n", err.msg);
        goto out;
    }
    ctx = build_context(req, &src, gen);
    ctx_text = json_dumps(ctx, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!ctx_text) {
        fprintf(stderr, "kwker template: out of memory\n");
        goto out;
    }
    if (kwk_template_render(t, ctx_text, strlen(ctx_text), &ro, &out, &out_len, &err)) {
        fprintf(stderr, "kwker template: %s\n", err.msg);
        goto out;
    }
    fwrite(out, 1, out_len, stdout);
    rc = 0;
out:
    kwk_string_free(out);
    free(ctx_text);
    json_decref(ctx);
    json_decref(req);
    kwk_template_free(t);
    source_free(&src);
    return rc;
}
