/* cli_chat.c - a conversation rendered with the model's chat template and tokenized, as
 * transformers' apply_chat_template(..., add_generation_prompt=True, tokenize=True) does.
 * Main thread only. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cli.h"
#include "cli_gen.h"
#include "serve/serve.h"

int cli_chat_template(const kwk_tokenizer *tok, const char *file, const char *cmd,
                      kwk_template **tpl, char **source)
{
    struct kwk_err err = {0};
    char *text = NULL; /* the file's, read here */
    const char *src;
    size_t n = 0;
    *tpl = NULL;
    if (source)
        *source = NULL;
    if (file) {
        if (kwk_read_file(file, CLI_TEMPLATE_FILE_MAX, &text, &n, &err)) {
            fprintf(stderr, "kwker %s: --chat-template-file: %s\n", cmd, err.msg);
            return -1;
        }
        src = text;
    } else if ((src = kwk_tokenizer_chat_template(tok))) {
        n = strlen(src);
    } else {
        return 0;
    }
    *tpl = kwk_template_new(src, n, NULL, &err);
    if (*tpl && source) {
        *source = text ? text : kwk_strdup(src);
        text = NULL;
        if (!*source) {
            kwk_template_free(*tpl);
            *tpl = NULL;
            err.code = -ENOMEM;
            snprintf(err.msg, sizeof err.msg, "out of memory");
        }
    }
    kwk_free(text);
    if (!*tpl) {
        fprintf(stderr, "kwker %s: chat template%s%s: %s\n", cmd, file ? " " : "",
                file ? file : "", err.msg);
        return -1;
    }
    return 0;
}

int cli_template_kwargs(const char *text, const char *cmd, json_t **out)
{
    json_error_t jerr;
    struct srv_err e = {0};
    *out = NULL;
    /* jansson's parser recurses: the server's depth limit first */
    if (!srv_json_depth_ok(text, strlen(text), SRV_MAX_DEPTH)) {
        fprintf(stderr, "kwker %s: --chat-template-kwargs: nested deeper than %d levels\n", cmd,
                SRV_MAX_DEPTH);
        return -1;
    }
    json_t *kw = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!kw) {
        fprintf(stderr, "kwker %s: --chat-template-kwargs: not JSON: %s (at byte %d)\n", cmd,
                jerr.text, jerr.position);
        return -1;
    }
    if (srv_template_kwargs_check(kw, "--chat-template-kwargs", &e)) {
        fprintf(stderr, "kwker %s: %s\n", cmd, e.msg);
        json_decref(kw);
        return -1;
    }
    *out = kw;
    return 0;
}

int cli_conv_init(struct cli_conv *c, const kwk_tokenizer *tok, const char *file,
                  const char *kwargs, const char *cmd)
{
    memset(c, 0, sizeof *c);
    if (kwargs && cli_template_kwargs(kwargs, cmd, (json_t **)&c->kwargs))
        return -1;
    if (cli_chat_template(tok, file, cmd, &c->tpl, NULL)) {
        cli_conv_free(c);
        return -1;
    }
    if (!c->tpl) {
        fprintf(stderr, "kwker %s: the model has no chat template (tokenizer_config.json, "
                        "chat_template.jinja or GGUF tokenizer.chat_template): give one with "
                        "--chat-template-file\n", cmd);
        cli_conv_free(c); /* the kwargs parsed above */
        return -1;
    }
    c->bos = kwk_tokenizer_bos_token(tok);
    c->eos = kwk_tokenizer_eos_token(tok);
    c->messages = json_array();
    if (!c->messages) {
        cli_conv_free(c);
        fprintf(stderr, "kwker %s: out of memory\n", cmd);
        return -1;
    }
    return 0;
}

void cli_conv_free(struct cli_conv *c)
{
    kwk_template_free(c->tpl);
    json_decref(c->messages);
    json_decref(c->kwargs);
    memset(c, 0, sizeof *c);
}

int cli_conv_add(struct cli_conv *c, const char *role, const char *content)
{
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    if (!m)
        return -1; /* jansson refuses strings that are not valid UTF-8 */
    return json_array_append_new(c->messages, m) ? -1 : 0;
}

int cli_conv_len(const struct cli_conv *c)
{
    return (int)json_array_size(c->messages);
}

void cli_conv_pop(struct cli_conv *c)
{
    size_t n = json_array_size(c->messages);
    if (n)
        json_array_remove(c->messages, n - 1);
}

void cli_conv_truncate(struct cli_conv *c, int keep)
{
    while ((int)json_array_size(c->messages) > keep)
        cli_conv_pop(c);
}

static int is_user(const json_t *m)
{
    const char *r = json_string_value(json_object_get(m, "role"));
    return r && !strcmp(r, "user");
}

int cli_conv_drop_oldest(struct cli_conv *c, int keep)
{
    size_t n = json_array_size(c->messages), end = (size_t)keep + 1;
    while (end < n && !is_user(json_array_get(c->messages, end)))
        end++;
    if (end >= n) /* only the current turn is left */
        return 0;
    for (size_t i = (size_t)keep; i < end; i++)
        json_array_remove(c->messages, (size_t)keep);
    return 1;
}

int cli_conv_ids(const struct cli_conv *c, const kwk_tokenizer *tok, int32_t **ids, size_t *n,
                 const char *cmd)
{
    struct kwk_err err = {0};
    char *ctx_text = NULL, *text = NULL;
    size_t len = 0;
    int rc = -1;
    /* the keys apply_chat_template always defines, then the special tokens it passes */
    json_t *ctx = json_pack("{s:O, s:n, s:n, s:b}", "messages", c->messages, "tools",
                            "documents", "add_generation_prompt", 1);
    if (ctx && c->bos)
        json_object_set_new(ctx, "bos_token", json_string(c->bos));
    if (ctx && c->eos)
        json_object_set_new(ctx, "eos_token", json_string(c->eos));
    if (ctx && c->kwargs && json_object_update(ctx, c->kwargs)) {
        json_decref(ctx);
        ctx = NULL;
    }
    if (!ctx || !(ctx_text = json_dumps(ctx, JSON_COMPACT))) {
        fprintf(stderr, "kwker %s: out of memory\n", cmd);
        goto out;
    }
    if (kwk_template_render(c->tpl, ctx_text, strlen(ctx_text), NULL, &text, &len, &err)) {
        fprintf(stderr, "kwker %s: chat template: %s\n", cmd, err.msg);
        goto out;
    }
    int st = kwk_tokenizer_encode_alloc(tok, text, len, 0, ids, n);
    if (st < 0) {
        fprintf(stderr, "kwker %s: tokenizing the conversation: %s\n", cmd, kwk_status_str(st));
        goto out;
    }
    rc = 0;
out:
    kwk_string_free(text);
    free(ctx_text);
    json_decref(ctx);
    return rc;
}
