/* tok_config.c - the files beside a tokenizer: tokenizer_config.json (chat template, bos/eos
 * tokens, added_tokens_decoder), special_tokens_map.json, generation_config.json (eos id list)
 * and chat_template.jinja. Load time only; any thread. */
#include <string.h>

#include <jansson.h>

#include "text/tokenizer.h"

/* Real files are a few KiB to a few MiB (a long added_tokens_decoder, a chat template with tool
 * examples); TOK_CONFIG_MAX bounds what one may make a load read and parse. */
void *tok_read_config_json(const char *dir, const char *name)
{
    char path[4096];
    if (kwk_path_join(path, sizeof path, dir, name) || !kwk_file_exists(path))
        return NULL;
    char *text = NULL;
    size_t n = 0;
    struct kwk_err err;
    if (kwk_read_file(path, TOK_CONFIG_MAX, &text, &n, &err)) {
        kwk_log(KWK_LOG_WARN, "%s (ignored)", err.msg);
        return NULL;
    }
    /* model_max_length is often 1e30 written as an integer: read numbers as reals. */
    json_error_t je;
    json_t *j = json_loadb(text, n, JSON_DECODE_INT_AS_REAL, &je);
    kwk_free(text);
    if (!j)
        kwk_log(KWK_LOG_WARN, "%s:%d:%d: %s (ignored)", path, je.line, je.column, je.text);
    return j;
}

/* "bos_token": "<s>" or {"content": "<s>", ...} */
static const char *token_str(json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static int set_str(char **dst, const char *s)
{
    if (!s || *dst)
        return 0;
    *dst = kwk_strdup(s);
    return *dst ? 0 : -12;
}

static int32_t id_of(const struct kwk_tokenizer *t, const char *s)
{
    return s ? tok_piece_id(t, s, strlen(s)) : -1;
}

static int from_config(struct kwk_tokenizer *t, json_t *cfg, const char **pad, const char **unk)
{
    int rc = 0;
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct)) {
        rc = set_str(&t->chat_template, json_string_value(ct));
    } else if (json_is_array(ct)) {
        /* A list of named templates: the "default" one is the chat template. */
        for (size_t i = 0; i < json_array_size(ct) && !rc; i++) {
            json_t *e = json_array_get(ct, i);
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name && !strcmp(name, "default"))
                rc = set_str(&t->chat_template, json_string_value(json_object_get(e, "template")));
        }
    }
    if (!rc)
        rc = set_str(&t->bos_token, token_str(json_object_get(cfg, "bos_token")));
    if (!rc)
        rc = set_str(&t->eos_token, token_str(json_object_get(cfg, "eos_token")));
    if (!*pad)
        *pad = token_str(json_object_get(cfg, "pad_token"));
    if (!*unk)
        *unk = token_str(json_object_get(cfg, "unk_token"));
    return rc;
}

/* An id generation_config.json names: -1 unless it is one of the vocabulary's. */
static int32_t num_id(const struct kwk_tokenizer *t, json_t *v)
{
    double d = json_number_value(v);
    return d >= 0 && d < (double)t->n_vocab ? (int32_t)d : -1;
}

static void add_eos(struct kwk_tokenizer *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab || t->n_eos >= TOK_MAX_EOS)
        return;
    for (int i = 0; i < t->n_eos; i++)
        if (t->eos_ids[i] == id)
            return;
    t->eos_ids[t->n_eos++] = id;
}

int tok_load_configs(struct kwk_tokenizer *t, const char *dir, struct kwk_err *err)
{
    int rc = 0;
    const char *pad = NULL, *unk = NULL;
    json_t *cfg = tok_read_config_json(dir, "tokenizer_config.json");
    json_t *stm = tok_read_config_json(dir, "special_tokens_map.json");
    json_t *gen = tok_read_config_json(dir, "generation_config.json");
    char path[4096];
    /* transformers prefers chat_template.jinja to the config's copy. */
    if (!kwk_path_join(path, sizeof path, dir, "chat_template.jinja") && kwk_file_exists(path)) {
        char *text = NULL;
        size_t n;
        if (!kwk_read_file(path, (size_t)16 << 20, &text, &n, NULL))
            t->chat_template = text;
    }
    if (cfg)
        rc = from_config(t, cfg, &pad, &unk);
    if (!rc && stm)
        rc = from_config(t, stm, &pad, &unk);
    if (rc)
        goto out;
    /* Ids resolve after added tokens exist: tok_piece_id sees the added map only after
     * tok_finish, so look in both maps by hand here. */
    if (t->bos_token)
        t->bos_id = id_of(t, t->bos_token);
    int32_t eos = id_of(t, t->eos_token);
    if (pad)
        t->pad_id = id_of(t, pad);
    if (unk && t->unk_id < 0)
        t->unk_id = id_of(t, unk);
    json_t *ge = json_object_get(gen, "eos_token_id");
    if (json_is_number(ge)) {
        add_eos(t, num_id(t, ge));
    } else if (json_is_array(ge)) {
        for (size_t i = 0; i < json_array_size(ge); i++)
            if (json_is_number(json_array_get(ge, i)))
                add_eos(t, num_id(t, json_array_get(ge, i)));
    }
    if (t->n_eos == 0)
        add_eos(t, eos);
    json_t *gb = json_object_get(gen, "bos_token_id");
    if (t->bos_id < 0 && json_is_number(gb))
        t->bos_id = num_id(t, gb);
    json_t *gp = json_object_get(gen, "pad_token_id");
    if (t->pad_id < 0 && json_is_number(gp))
        t->pad_id = num_id(t, gp);
out:
    json_decref(cfg);
    json_decref(stm);
    json_decref(gen);
    if (rc)
        kwk_err_set(err, rc, "%s: out of memory reading configs", dir);
    return rc;
}
