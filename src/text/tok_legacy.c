/* tok_legacy.c - tokenizer folders without tokenizer.json: vocab.json (or encoder.json) with
 * merges.txt (or vocab.bpe) as GPT-2 byte-level BPE, and vocab.txt as BERT WordPiece, built
 * the way transformers' converters build them. Load time only; any thread. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "text/tokenizer.h"

#define GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

static int first_existing(const char *dir, const char *const *names, int n, char *out,
                          size_t cap)
{
    for (int i = 0; i < n; i++)
        if (!kwk_path_join(out, cap, dir, names[i]) && kwk_file_exists(out))
            return 1;
    return 0;
}

static int add_added(struct kwk_tokenizer *t, int32_t id, const char *s, int special)
{
    struct tok_added *p = kwk_realloc(t->added, sizeof *p * (size_t)(t->n_added + 1));
    if (!p)
        return -ENOMEM;
    t->added = p;
    struct tok_added *a = &t->added[t->n_added];
    memset(a, 0, sizeof *a);
    a->id = id;
    a->len = strlen(s);
    a->content = kwk_strdup(s);
    a->special = special;
    a->normalized = !special;
    if (!a->content)
        return -ENOMEM;
    t->n_added++;
    return 0;
}

/* added_tokens_decoder of tokenizer_config.json: {"id": {"content": ..., "special": ...}} */
static int config_added(struct kwk_tokenizer *t, const char *dir, int *found)
{
    *found = 0;
    json_t *cfg = tok_read_config_json(dir, "tokenizer_config.json");
    json_t *dec = json_object_get(cfg, "added_tokens_decoder");
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(dec, k, v) {
        const char *content = json_string_value(json_object_get(v, "content"));
        char *end;
        errno = 0;
        long id = strtol(k, &end, 10); /* keys are ids written in decimal, nothing else */
        if (!content || end == k || *end || errno || id < 0 || id >= t->n_vocab)
            continue;
        if ((rc = add_added(t, (int32_t)id, content, json_is_true(json_object_get(v, "special")))))
            break;
        struct tok_added *a = &t->added[t->n_added - 1];
        a->lstrip = json_is_true(json_object_get(v, "lstrip"));
        a->rstrip = json_is_true(json_object_get(v, "rstrip"));
        a->single_word = json_is_true(json_object_get(v, "single_word"));
        a->normalized = json_is_true(json_object_get(v, "normalized"));
        *found = 1;
    }
    json_decref(cfg);
    return rc;
}

static int load_bpe(struct kwk_tokenizer *t, const char *vpath, const char *mpath,
                    const char *dir, struct kwk_err *err)
{
    json_error_t je;
    char *text = NULL;
    size_t n = 0;
    int rc;
    /* the size bound of tokenizer.json, which holds this and more */
    if ((rc = kwk_read_file(vpath, (size_t)1 << 30, &text, &n, err)))
        return rc;
    json_t *vocab = json_loadb(text, n, 0, &je);
    kwk_free(text);
    text = NULL;
    if (!vocab || !json_is_object(vocab)) {
        rc = kwk_err_set_pos(err, KWK_EFORMAT, vocab ? -1 : je.position, "%s:%d:%d: %s", vpath,
                             je.line, je.column, vocab ? "not an object" : je.text);
        json_decref(vocab);
        return rc;
    }
    const char *k;
    json_t *v;
    int32_t max = -1;
    json_object_foreach(vocab, k, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) >= TOK_MAX_VOCAB) {
            json_decref(vocab);
            return kwk_err_set(err, KWK_EFORMAT, "%s: ids must be small integers", vpath);
        }
        max = KWK_MAX(max, (int32_t)json_integer_value(v));
    }
    t->model = TOK_MODEL_BPE;
    rc = tok_vocab_alloc(t, max + 1, err);
    json_object_foreach(vocab, k, v) {
        if (rc)
            break;
        rc = tok_set_piece(t, (int32_t)json_integer_value(v), k, strlen(k));
    }
    json_decref(vocab);
    if (rc)
        return rc;
    if ((rc = kwk_read_file(mpath, (size_t)1 << 30, &text, &n, err)))
        return rc;
    if (tok_pairmap_init(&t->merges, 1024)) {
        rc = -ENOMEM;
        goto out;
    }
    int32_t rank = 0;
    for (char *line = text, *end; line < text + n && !rc; line = end + 1) {
        end = memchr(line, '\n', (size_t)(text + n - line));
        if (!end)
            end = text + n;
        size_t len = (size_t)(end - line);
        if (len && line[len - 1] == '\r')
            len--;
        if (len == 0 || (line == text && len >= 8 && !memcmp(line, "#version", 8)))
            continue;
        char *sp = len > 1 ? memchr(line + 1, ' ', len - 1) : NULL;
        if (!sp) {
            rc = kwk_err_set_pos(err, KWK_EFORMAT, line - text, "%s: merge line is not \"a b\"",
                                 mpath);
            break;
        }
        rc = tok_add_merge(t, line, (size_t)(sp - line), sp + 1, len - (size_t)(sp - line) - 1,
                           rank++);
    }
    if (rc)
        goto out;
    /* GPT-2's converter: ByteLevel without a prefix space, ByteLevel decoder. */
    t->byte_level = 1;
    t->pretok.kind = TOK_P_BYTELEVEL;
    t->pretok.use_regex = 1;
    if ((rc = tok_compile_regex(&t->pretok.re, GPT2_REGEX, strlen(GPT2_REGEX), err)))
        goto out;
    t->decoder.kind = TOK_D_BYTELEVEL;
    int found;
    if ((rc = config_added(t, dir, &found)))
        goto out;
    if (!found) {
        int32_t eot = tok_map_get(&t->vocab, "<|endoftext|>", 13);
        if (eot >= 0)
            rc = add_added(t, eot, "<|endoftext|>", 1);
    }
out:
    kwk_free(text);
    return rc;
}

static int load_wordpiece(struct kwk_tokenizer *t, const char *path, const char *dir,
                          struct kwk_err *err)
{
    char *text = NULL;
    size_t n = 0;
    int rc = kwk_read_file(path, (size_t)1 << 30, &text, &n, err);
    if (rc)
        return rc;
    int32_t count = 0;
    for (size_t i = 0; i < n; i++)
        count += text[i] == '\n';
    if (n && text[n - 1] != '\n')
        count++;
    t->model = TOK_MODEL_WORDPIECE;
    if ((rc = tok_vocab_alloc(t, KWK_MAX(count, 1), err)))
        goto out;
    int32_t id = 0;
    for (char *line = text, *end; line < text + n && !rc; line = end + 1, id++) {
        end = memchr(line, '\n', (size_t)(text + n - line));
        if (!end)
            end = text + n;
        size_t len = (size_t)(end - line);
        if (len && line[len - 1] == '\r')
            len--;
        rc = tok_set_piece(t, id, line, len);
    }
    if (rc)
        goto out;
    t->cont_prefix = kwk_strdup("##");
    t->cont_prefix_len = 2;
    t->max_chars_per_word = 100;
    t->unk_id = tok_map_get(&t->vocab, "[UNK]", 5);
    t->normalizer = (struct tok_step){.kind = TOK_N_BERT, .clean_text = 1, .chinese = 1,
                                      .strip_accents = -1, .lowercase = 1};
    t->pretok.kind = TOK_P_SEQ;
    t->pretok.subs = kwk_calloc(2, sizeof *t->pretok.subs);
    if (!t->pretok.subs || !t->cont_prefix) {
        rc = -ENOMEM;
        goto out;
    }
    t->pretok.n_subs = 2;
    t->pretok.subs[0].kind = TOK_P_WSPLIT;
    t->pretok.subs[1].kind = TOK_P_PUNCT;
    t->pretok.subs[1].behavior = TOK_SPLIT_ISOLATED;
    t->decoder.kind = TOK_D_WORDPIECE;
    t->decoder.content = kwk_strdup("##");
    t->decoder.content_len = 2;
    t->decoder.cleanup = 1;
    int32_t cls = tok_map_get(&t->vocab, "[CLS]", 5), sep = tok_map_get(&t->vocab, "[SEP]", 5);
    if (cls >= 0 && sep >= 0) {
        t->post.kind = TOK_PP_TEMPLATE;
        t->post.tmpl = kwk_malloc(3 * sizeof *t->post.tmpl);
        if (!t->post.tmpl) {
            rc = -ENOMEM;
            goto out;
        }
        t->post.tmpl[0] = cls;
        t->post.tmpl[1] = -1;
        t->post.tmpl[2] = sep;
        t->post.n_tmpl = 3;
        /* BERT's pair, as transformers' converter builds it: [CLS] a [SEP] b [SEP] */
        const struct tok_piece pair[] = {{cls, 0}, {TOK_PAIR_A, 0}, {sep, 0}, {TOK_PAIR_B, 1},
                                         {sep, 1}};
        if ((rc = tok_pair_set(t, pair, (int)KWK_ARRAY_LEN(pair))))
            goto out;
    }
    static const char *const specials[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (size_t i = 0; i < KWK_ARRAY_LEN(specials) && !rc; i++) {
        int32_t sid = tok_map_get(&t->vocab, specials[i], strlen(specials[i]));
        if (sid >= 0)
            rc = add_added(t, sid, specials[i], 1);
    }
out:
    kwk_free(text);
    return rc;
}

int tok_load_legacy(struct kwk_tokenizer *t, const char *dir, struct kwk_err *err)
{
    static const char *const vocab_names[] = {"vocab.json", "encoder.json"};
    static const char *const merge_names[] = {"merges.txt", "vocab.bpe"};
    static const char *const wp_names[] = {"vocab.txt"};
    char vpath[4096], mpath[4096];
    if (first_existing(dir, vocab_names, 2, vpath, sizeof vpath) &&
        first_existing(dir, merge_names, 2, mpath, sizeof mpath))
        return load_bpe(t, vpath, mpath, dir, err);
    if (first_existing(dir, wp_names, 1, vpath, sizeof vpath))
        return load_wordpiece(t, vpath, dir, err);
    return kwk_err_set(err, KWK_ENOTFOUND,
                       "%s: no tokenizer.json, vocab.json + merges.txt or vocab.txt", dir);
}
