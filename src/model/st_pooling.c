/* st_pooling.c - how a sentence-transformers folder turns an encoder's token states into one
 * embedding: modules.json lists the modules applied after the transformer (Pooling, Normalize),
 * the Pooling module's config.json says which pooling. A module Kwker does not run (Dense, a
 * second transformer, ...) makes the model unsupported rather than giving embeddings the model's
 * users would not get. Also the bounded reader of such a folder's JSON objects that seq_limit.c
 * shares. Any thread. */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"

#define ST_JSON_MAX ((size_t)1 << 20)

struct json_t *kwk_json_read_object(const char *dir, const char *name, size_t max_bytes,
                                    size_t flags, int *rc, struct kwk_err *err)
{
    char path[4096];
    *rc = 0;
    if (kwk_path_join(path, sizeof path, dir, name)) {
        *rc = kwk_err_set(err, KWK_ELIMIT, "%s: path too long", dir);
        return NULL;
    }
    if (!kwk_file_exists(path))
        return NULL;
    char *text = NULL;
    size_t n = 0;
    if ((*rc = kwk_read_file(path, max_bytes, &text, &n, err)) < 0)
        return NULL;
    json_error_t jerr;
    json_t *root = json_loadb(text, n, flags, &jerr);
    kwk_free(text);
    if (!json_is_object(root)) {
        *rc = kwk_err_set(err, KWK_EFORMAT, "%s: %s", path, root ? "not a JSON object" : jerr.text);
        json_decref(root);
        return NULL;
    }
    return root;
}

/* Why the model cannot run, unless an earlier reason was given (usually the root cause). */
static void unsupported(struct kwk_config *cfg, const char *why)
{
    if (!cfg->unsupported[0])
        snprintf(cfg->unsupported, sizeof cfg->unsupported, "%s", why);
}

static int flag(const json_t *o, const char *key)
{
    return json_is_true(json_object_get(o, key));
}

/* The pooling of a Pooling module's config.json: exactly one mode. */
static int pooling_mode(struct kwk_config *cfg, const json_t *o)
{
    static const struct {
        const char *key;
        int pooling;
    } modes[] = {
        {"pooling_mode_cls_token", KWK_POOLING_CLS},
        {"pooling_mode_mean_tokens", KWK_POOLING_MEAN},
        {"pooling_mode_max_tokens", KWK_POOLING_MAX},
        {"pooling_mode_mean_sqrt_len_tokens", KWK_POOLING_MEAN_SQRT_LEN},
        {"pooling_mode_lasttoken", KWK_POOLING_LAST},
    };
    int n = 0, pooling = KWK_POOLING_NONE;
    for (size_t i = 0; i < KWK_ARRAY_LEN(modes); i++)
        if (flag(o, modes[i].key)) {
            pooling = modes[i].pooling;
            n++;
        }
    if (flag(o, "pooling_mode_weightedmean_tokens"))
        n += 2;
    if (n != 1) {
        unsupported(cfg, n ? "the Pooling module combines modes or weights its mean: not "
                             "supported"
                           : "the Pooling module names no pooling mode");
        return KWK_POOLING_NONE;
    }
    return pooling;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

void kwk_score_act_set(struct kwk_config *cfg, const char *path)
{
    if (strncmp(path, "torch.", 6))
        return;
    const char *dot = strrchr(path, '.');
    cfg->score_act_bad[0] = '\0';
    if (!strcmp(dot + 1, "Sigmoid"))
        cfg->score_act = KWK_SCORE_SIGMOID;
    else if (!strcmp(dot + 1, "Identity"))
        cfg->score_act = KWK_SCORE_IDENTITY;
    else
        snprintf(cfg->score_act_bad, sizeof cfg->score_act_bad, "%.80s", path);
}

/* config_sentence_transformers.json's activation_fn (sentence-transformers 5 and later write
 * it there; it wins over config.json's), read as CrossEncoder reads it: only in a file of
 * model_type CrossEncoder (another type is converted, its activation not taken). */
static int st_score_act(struct kwk_config *cfg, const char *dir, struct kwk_err *err)
{
    int rc;
    json_t *o = kwk_json_read_object(dir, "config_sentence_transformers.json", ST_JSON_MAX, 0,
                                     &rc, err);
    if (!o)
        return rc;
    const char *type = json_string_value(json_object_get(o, "model_type"));
    const json_t *fn = type && !strcmp(type, "CrossEncoder") ? json_object_get(o, "activation_fn")
                                                             : NULL;
    if (json_is_string(fn))
        kwk_score_act_set(cfg, json_string_value(fn));
    else if (fn && !json_is_null(fn))
        rc = kwk_err_set(err, KWK_EFORMAT, "%s/config_sentence_transformers.json: activation_fn "
                         "is not a string", dir);
    json_decref(o);
    return rc;
}

int kwk_st_pooling_load(struct kwk_config *cfg, const char *dir, struct kwk_err *err)
{
    /* a plain BERT folder: the first token's state, normalized, as vLLM embeds with one */
    cfg->pooling = KWK_POOLING_CLS;
    cfg->normalize = 1;
    int rc;
    char path[4096];
    if (kwk_path_join(path, sizeof path, dir, "modules.json"))
        return kwk_err_set(err, KWK_ELIMIT, "%s: path too long", dir);
    int st_folder = kwk_file_exists(path);
    /* sentence-transformers reads config_sentence_transformers.json only in its own folders
     * (those with modules.json); elsewhere it builds a fresh model from config.json alone */
    if (st_folder && cfg->cls_head && (rc = st_score_act(cfg, dir, err)) < 0)
        return rc;
    if (cfg->score_act_bad[0]) {
        char why[200];
        snprintf(why, sizeof why, "the cross-encoder's activation_fn %s is not supported "
                 "(Sigmoid, Identity)", cfg->score_act_bad);
        unsupported(cfg, why);
    }
    if (!st_folder)
        return 0;
    char *text = NULL;
    size_t n = 0;
    if ((rc = kwk_read_file(path, ST_JSON_MAX, &text, &n, err)) < 0)
        return rc;
    json_error_t jerr;
    json_t *list = json_loadb(text, n, 0, &jerr);
    kwk_free(text);
    if (!json_is_array(list)) {
        rc = kwk_err_set(err, KWK_EFORMAT, "%s: %s", path,
                         list ? "not a JSON array of modules" : jerr.text);
        json_decref(list);
        return rc;
    }
    cfg->normalize = 0;
    int pooled = 0;
    size_t i;
    const json_t *m;
    json_array_foreach(list, i, m)
    {
        const char *type = json_string_value(json_object_get(m, "type"));
        const char *sub = json_string_value(json_object_get(m, "path"));
        if (!type) {
            rc = kwk_err_set(err, KWK_EFORMAT, "%s: module %zu has no type", path, i);
            break;
        }
        if (ends_with(type, ".Transformer") && i == 0)
            continue;
        if (ends_with(type, ".Normalize") && pooled) {
            cfg->normalize = 1;
            continue;
        }
        if (!ends_with(type, ".Pooling") || pooled || !sub || strstr(sub, "..")) {
            char why[200];
            snprintf(why, sizeof why,
                     "sentence-transformers module %zu (%.80s) is not "
                     "supported (Transformer, then one Pooling, then Normalize)",
                     i, type);
            unsupported(cfg, why);
            break;
        }
        char file[4096];
        if (snprintf(file, sizeof file, "%s/config.json", sub) >= (int)sizeof file) {
            rc = kwk_err_set(err, KWK_ELIMIT, "%s: module path too long", path);
            break;
        }
        json_t *pc = kwk_json_read_object(dir, file, ST_JSON_MAX, 0, &rc, err);
        if (rc < 0)
            break;
        if (!pc) {
            rc = kwk_err_set(err, KWK_ENOTFOUND, "%s: the Pooling module's %s is missing", dir,
                             file);
            break;
        }
        cfg->pooling = pooling_mode(cfg, pc);
        pooled = 1;
        json_decref(pc);
    }
    json_decref(list);
    if (rc >= 0 && !pooled && cfg->cls_head) {
        /* a CrossEncoder's folder lists its Transformer alone: its scores come from the head,
         * and its embeddings, if asked for, are the plain BERT folder's */
        cfg->pooling = KWK_POOLING_CLS;
        cfg->normalize = 1;
    } else if (rc >= 0 && !pooled)
        unsupported(cfg, "modules.json has no Pooling module: sentence-transformers gives token "
                         "states, not one embedding");
    return rc < 0 ? rc : 0;
}
