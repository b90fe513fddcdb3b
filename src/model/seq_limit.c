/* seq_limit.c - the longest sequence an encoder folder's users truncate at: sentence-transformers
 * takes sentence_bert_config.json's max_seq_length (as Hugging Face's text-embeddings-inference
 * does), else min(max_position_embeddings, the tokenizer's model_max_length), and its
 * CrossEncoder loads the same Transformer module. Kwker never goes past the positions it holds.
 * Load time only; any thread. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>

#include "model/model.h"

/* sentence_bert_config.json is a few lines; tokenizer_config.json may carry a long
 * added_tokens_decoder (the tokenizer's own reader allows 64 MiB for it). */
#define SEQ_ST_JSON_MAX ((size_t)1 << 20)
#define SEQ_TOK_JSON_MAX ((size_t)64 << 20)

/* key of the object in dir/name as a limit (old_key's when the object has no key: transformers
 * still reads tokenizer_config.json's "max_len" so): 0 when the file, the key or a usable value
 * is missing (a string, a fraction, zero or less: warned about), INT32_MAX for anything above
 * it. Numbers are read as reals: model_max_length is often 1e30 written as an integer, more
 * than jansson's integers hold. */
static int read_limit(const char *dir, const char *name, size_t max_bytes, const char *key,
                      const char *old_key)
{
    int rc, limit = 0;
    struct kwk_err err;
    json_t *o = kwk_json_read_object(dir, name, max_bytes, JSON_DECODE_INT_AS_REAL, &rc, &err);
    if (!o) {
        if (rc < 0)
            kwk_log(KWK_LOG_WARN, "%s (ignored: the sequence limit is the positions)", err.msg);
        return 0;
    }
    if (old_key && !json_object_get(o, key))
        key = old_key;
    const json_t *v = json_object_get(o, key);
    double d = json_is_real(v) ? json_real_value(v) : 0.0;
    if (d >= 1.0 && d == floor(d)) /* NaN fails the first test */
        limit = d < (double)INT32_MAX ? (int)d : INT32_MAX;
    else if (v && !json_is_null(v))
        kwk_log(KWK_LOG_WARN, "%s/%s: %s is not a positive whole number (ignored)", dir, name,
                key);
    json_decref(o);
    return limit;
}

void kwk_seq_limit_load(struct kwk_config *cfg, const char *dir)
{
    char path[4096];
    int st_folder = !kwk_path_join(path, sizeof path, dir, "modules.json") &&
                    kwk_file_exists(path);
    /* a folder without modules.json is built afresh by sentence-transformers, which then
     * reads none of its own files */
    cfg->st_max_seq_length =
        st_folder ? read_limit(dir, "sentence_bert_config.json", SEQ_ST_JSON_MAX,
                               "max_seq_length", NULL)
                  : 0;
    cfg->tok_max_length = read_limit(dir, "tokenizer_config.json", SEQ_TOK_JSON_MAX,
                                     "model_max_length", "max_len");
    int want = cfg->st_max_seq_length ? cfg->st_max_seq_length : cfg->tok_max_length;
    cfg->max_tokens = want > 0 && want < cfg->max_position ? want : cfg->max_position;
}
