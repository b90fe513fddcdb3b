/* tok_gguf.c - the vocabulary inside a GGUF file (tokenizer.ggml.*): "gpt2" byte-level BPE with
 * the pre-tokenizer regexes llama.cpp associates with tokenizer.ggml.pre, "llama" SentencePiece
 * BPE whose merge order comes from the scores, "bert" WordPiece stored with phantom spaces and
 * "t5" SentencePiece unigram with its charsmap.
 * Load time only; any thread. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "text/tokenizer.h"

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

#define RX_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RX_LLAMA3 "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RX_QWEN2 "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* Pre-tokenizer regex lists by tokenizer.ggml.pre name (llama.cpp's table; each regex splits
 * the pieces the previous one left, isolating its matches). */
struct pre_def {
    const char *names; /* '|'-separated */
    int ignore_merges;
    const char *rx[7];
};

static const struct pre_def pre_defs[] = {
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|dbrx|smaug-bpe", 1,
     {RX_LLAMA3}},
    {"deepseek-llm", 0,
     {"[\r\n]",
      "\\s?[A-Za-z\xC2\xB5\xC3\x80-\xC3\x96\xC3\x98-\xC3\xB6\xC3\xB8-\xC6\xBA\xC6\xBC-\xC6\xBF\xC7\x84-\xCA\x93\xCA\x95-\xCA\xAF\xCD\xB0-\xCD\xB3\xCD\xB6\xCD\xB7\xCD\xBB-\xCD\xBD\xCD\xBF\xCE\x86\xCE\x88-\xCE\x8A\xCE\x8C\xCE\x8E-\xCE\xA1\xCE\xA3-\xCF\xB5\xCF\xB7-\xD2\x81\xD2\x8A-\xD4\xAF\xD4\xB1-\xD5\x96\xE1\x82\xA0-\xE1\x83\x85\xE1\x8E\xA0-\xE1\x8F\xB5\xE1\x8F\xB8-\xE1\x8F\xBD\xE1\xB2\x90-\xE1\xB2\xBA\xE1\xB2\xBD-\xE1\xB2\xBF\xE1\xB4\x80-\xE1\xB4\xAB\xE1\xB5\xAB-\xE1\xB5\xB7\xE1\xB5\xB9-\xE1\xB6\x9A\xE1\xB8\x80-\xE1\xBC\x95\xE1\xBC\x98-\xE1\xBC\x9D\xE1\xBC\xA0-\xE1\xBD\x85\xE1\xBD\x88-\xE1\xBD\x8D\xE1\xBD\x90-\xE1\xBD\x97\xE1\xBD\x99\xE1\xBD\x9B\xE1\xBD\x9D\xE1\xBD\x9F-\xE1\xBD\xBD\xE1\xBE\x80-\xE1\xBE\xB4\xE1\xBE\xB6-\xE1\xBE\xBC\xE1\xBE\xBE\xE1\xBF\x82-\xE1\xBF\x84\xE1\xBF\x86-\xE1\xBF\x8C\xE1\xBF\x90-\xE1\xBF\x93\xE1\xBF\x96-\xE1\xBF\x9B\xE1\xBF\xA0-\xE1\xBF\xAC\xE1\xBF\xB2-\xE1\xBF\xB4\xE1\xBF\xB6-\xE1\xBF\xBC\xE2\x84\x82\xE2\x84\x87\xE2\x84\x8A-\xE2\x84\x93\xE2\x84\x95\xE2\x84\x99-\xE2\x84\x9D\xE2\x84\xA4\xE2\x84\xA6\xE2\x84\xA8\xE2\x84\xAA-\xE2\x84\xAD\xE2\x84\xAF-\xE2\x84\xB4\xE2\x84\xB9\xE2\x84\xBC-\xE2\x84\xBF\xE2\x85\x85-\xE2\x85\x89\xE2\x85\x8E\xE2\x86\x83\xE2\x86\x84\xE2\xB0\x80-\xE2\xB1\xBB\xE2\xB1\xBE-\xE2\xB3\xA4\xE2\xB3\xAB-\xE2\xB3\xAE\xE2\xB3\xB2\xE2\xB3\xB3\xEA\x99\x80-\xEA\x99\xAD\xEA\x9A\x80-\xEA\x9A\x9B\xEA\x9C\xA2-\xEA\x9D\xAF\xEA\x9D\xB1-\xEA\x9E\x87\xEA\x9E\x8B-\xEA\x9E\x8E\xEA\xAD\xB0-\xEA\xAE\xBF\xEF\xAC\x80-\xEF\xAC\x86\xEF\xAC\x93-\xEF\xAC\x97\xEF\xBC\xA1-\xEF\xBC\xBA\xEF\xBD\x81-\xEF\xBD\x9A\xF0\x90\x90\x80-\xF0\x90\x91\x8F\xF0\x90\x92\xB0-\xF0\x90\x93\x93\xF0\x90\x93\x98-\xF0\x90\x93\xBB\xF0\x90\xB2\x80-\xF0\x90\xB2\xB2\xF0\x90\xB3\x80-\xF0\x90\xB3\xB2\xF0\x91\xA2\xA0-\xF0\x91\xA3\x9F\xF0\x9E\xA4\x80-\xF0\x9E\xA5\x83]+",
      "\\s?[!-/:-~\xEF\xBC\x81-\xEF\xBC\x8F\xEF\xBC\x9A-\xEF\xBD\x9E\xE2\x80\x98-\xE2\x80\x9F\xE3\x80\x80-\xE3\x80\x82]+",
      "\\s+$",
      "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9F\xBF]+",
      "\\p{N}+"}},
    {"deepseek-coder", 0,
     {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
      "[\xE4\xB8\x80-\xE9\xBE\xA5\xE0\xA0\x80-\xE4\xB8\x80\xEA\xB0\x80-\xED\x9F\xBF]+", "\\p{N}"}},
    {"falcon", 0, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RX_GPT2, "[0-9][0-9][0-9]"}},
    {"starcoder|refact|command-r|codeshell|exaone|minerva-7b", 0, {"\\p{N}", RX_GPT2}},
    /* "smollm": llama.cpp isolates \p{N} first (as SmolLM's own tokenizer.json does with
     * Digits), but transformers' GGUF loader, the reference for GGUF files here, builds a plain
     * GPT-2 ByteLevel split; the two differ only on non-ASCII numerals after a space (" ①"). */
    {"smollm|gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v1-en|jina-v2-es|jina-v2-de|jina-v2-code|"
     "roberta-bpe|mpt|olmo|jais",
     0, {RX_GPT2}},
    {"qwen2|deepseek-r1-qwen|stablelm2", 0, {RX_QWEN2}},
    {"tekken", 1,
     {"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
      "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
      "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"chatglm-bpe", 0,
     {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
      "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
    {"poro-chat|bloom|gpt3-finnish", 0,
     {" ?[^(\\s|.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C)]+"}},
    {"viking", 0,
     {" ?[^(\\s|.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C)]+",
      "\\p{N}"}},
    {"chameleon", 0,
     {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
      "[\\p{P}!-/:-@\\[-`{-~]", RX_GPT2}},
};

static const struct pre_def pre_default = {
    "default", 0, {"[\\p{P}\\$\\+<=>\\^~\\|]+", RX_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}};

static int name_in(const char *names, const char *s, size_t n)
{
    for (const char *p = names; *p;) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == n && !memcmp(p, s, n))
            return 1;
        if (!bar)
            break;
        p = bar + 1;
    }
    return 0;
}

static const struct pre_def *find_pre(const char *s, size_t n)
{
    if (!s)
        return &pre_default;
    for (size_t i = 0; i < KWK_ARRAY_LEN(pre_defs); i++)
        if (name_in(pre_defs[i].names, s, n))
            return &pre_defs[i];
    return &pre_default;
}

struct gv {
    struct kwk_tokenizer *t;
    struct kwk_gguf g;
    const char **ptrs;
    size_t *lens;
    int64_t n;
    const struct kwk_gguf_kv *types;
    const char *path;
    struct kwk_err *err;
};

static int ttype(struct gv *v, int64_t i)
{
    int64_t x = TT_NORMAL;
    if (v->types && (uint64_t)i < v->types->arr_len)
        kwk_gguf_arr_i64(v->types, (uint64_t)i, &x);
    return (int)x;
}

static int64_t get_id(struct gv *v, const char *key)
{
    int64_t x;
    if (kwk_gguf_get_i64(&v->g, key, &x) || x < 0 || x >= v->n)
        return -1;
    return x;
}

static int add_added(struct kwk_tokenizer *t, int32_t id, const char *s, size_t n, int special)
{
    struct tok_added *p = kwk_realloc(t->added, sizeof *p * (size_t)(t->n_added + 1));
    if (!p)
        return -ENOMEM;
    t->added = p;
    struct tok_added *a = &t->added[t->n_added];
    memset(a, 0, sizeof *a);
    a->id = id;
    a->len = n;
    a->content = kwk_malloc(n + 1);
    if (!a->content)
        return -ENOMEM;
    memcpy(a->content, s, n);
    a->content[n] = 0;
    a->special = special;
    t->n_added++;
    return 0;
}

static int set_template(struct kwk_tokenizer *t, int32_t bos, int32_t eos)
{
    t->post.kind = TOK_PP_TEMPLATE;
    t->post.tmpl = kwk_malloc(3 * sizeof *t->post.tmpl);
    if (!t->post.tmpl)
        return -ENOMEM;
    int n = 0;
    if (bos >= 0)
        t->post.tmpl[n++] = bos;
    t->post.tmpl[n++] = -1;
    if (eos >= 0)
        t->post.tmpl[n++] = eos;
    t->post.n_tmpl = n;
    return 0;
}

static int regex_step(struct tok_step *st, const char *rx, struct kwk_err *err)
{
    st->kind = TOK_P_SPLIT;
    st->behavior = TOK_SPLIT_ISOLATED;
    return tok_compile_regex(&st->re, rx, strlen(rx), err);
}

static int load_gpt2(struct gv *v, const char *pre, size_t pre_n)
{
    struct kwk_tokenizer *t = v->t;
    const struct kwk_gguf_kv *mk = kwk_gguf_find(&v->g, "tokenizer.ggml.merges");
    int rc = 0;
    if (!mk || mk->type != KWK_GGUF_ARRAY || mk->arr_type != KWK_GGUF_STRING)
        return kwk_err_set(v->err, KWK_EFORMAT, "%s: no tokenizer.ggml.merges", v->path);
    const char **mp = kwk_malloc(sizeof *mp * (mk->arr_len + 1));
    size_t *ml = kwk_malloc(sizeof *ml * (mk->arr_len + 1));
    if (!mp || !ml) {
        rc = -ENOMEM;
        goto out;
    }
    if ((rc = kwk_gguf_arr_strings(mk, mp, ml)))
        goto out;
    if (tok_pairmap_init(&t->merges, mk->arr_len)) {
        rc = -ENOMEM;
        goto out;
    }
    for (uint64_t i = 0; i < mk->arr_len && !rc; i++) {
        const char *sp = ml[i] > 1 ? memchr(mp[i] + 1, ' ', ml[i] - 1) : NULL;
        if (!sp)
            continue;
        size_t na = (size_t)(sp - mp[i]);
        rc = tok_add_merge(t, mp[i], na, sp + 1, ml[i] - na - 1, (int32_t)i);
    }
    if (rc)
        goto out;
    const struct pre_def *pd = find_pre(pre, pre_n);
    int n_rx = 0;
    while (n_rx < 7 && pd->rx[n_rx])
        n_rx++;
    t->ignore_merges = pd->ignore_merges;
    t->byte_level = 1;
    t->pretok.kind = TOK_P_SEQ;
    t->pretok.subs = kwk_calloc((size_t)n_rx + 1, sizeof *t->pretok.subs);
    if (!t->pretok.subs) {
        rc = -ENOMEM;
        goto out;
    }
    t->pretok.n_subs = n_rx + 1;
    for (int i = 0; i < n_rx && !rc; i++)
        rc = regex_step(&t->pretok.subs[i], pd->rx[i], v->err);
    t->pretok.subs[n_rx].kind = TOK_P_BYTELEVEL;
    t->decoder.kind = TOK_D_BYTELEVEL;
out:
    kwk_free(mp);
    kwk_free(ml);
    return rc;
}

struct scored {
    double score;
    int32_t id;
};

static int cmp_scored(const void *a, const void *b)
{
    const struct scored *x = a, *y = b;
    return x->score > y->score ? -1 : x->score < y->score;
}

/* SentencePiece BPE merges the adjacent pair whose joined piece scores highest, leftmost on
 * ties: every split of every piece into two vocabulary pieces becomes a merge ranked by the
 * dense rank of the joined piece's score. */
static int load_spm(struct gv *v)
{
    struct kwk_tokenizer *t = v->t;
    const struct kwk_gguf_kv *sk = kwk_gguf_find(&v->g, "tokenizer.ggml.scores");
    struct scored *order = kwk_malloc(sizeof *order * (size_t)v->n);
    int rc = 0;
    if (!order)
        return -ENOMEM;
    for (int64_t i = 0; i < v->n; i++) {
        double s = 0;
        if (sk)
            kwk_gguf_arr_f64(sk, (uint64_t)i, &s);
        order[i] = (struct scored){s, (int32_t)i};
    }
    qsort(order, (size_t)v->n, sizeof *order, cmp_scored);
    if (tok_pairmap_init(&t->merges, (size_t)v->n * 2)) {
        rc = -ENOMEM;
        goto out;
    }
    int32_t rank = -1;
    double last = 0;
    for (int64_t k = 0; k < v->n && !rc; k++) {
        int32_t id = order[k].id;
        if (k == 0 || order[k].score != last)
            rank++;
        last = order[k].score;
        int ty = ttype(v, id);
        if (ty == TT_CONTROL || ty == TT_UNUSED || ty == TT_BYTE)
            continue;
        const char *s = v->ptrs[id];
        size_t n = v->lens[id];
        for (size_t cut = tok_utf8_len((uint8_t)s[0]); cut < n && !rc;
             cut += tok_utf8_len((uint8_t)s[cut])) {
            int32_t a = tok_map_get(&t->vocab, s, cut), b = tok_map_get(&t->vocab, s + cut, n - cut);
            if (a >= 0 && b >= 0 && !tok_pairmap_get(&t->merges, a, b))
                rc = tok_pairmap_put(&t->merges, a, b, rank, id);
        }
    }
    if (rc)
        goto out;
    int add_space = 1;
    kwk_gguf_get_bool(&v->g, "tokenizer.ggml.add_space_prefix", &add_space);
    t->byte_fallback = 1;
    t->fuse_unk = 1;
    /* Normalizer: [Prepend("▁")], Replace(" ", "▁"). */
    t->normalizer.kind = TOK_N_SEQ;
    t->normalizer.subs = kwk_calloc(2, sizeof *t->normalizer.subs);
    if (!t->normalizer.subs) {
        rc = -ENOMEM;
        goto out;
    }
    t->normalizer.n_subs = 2;
    struct tok_step *pp = &t->normalizer.subs[0], *rp = &t->normalizer.subs[1];
    pp->kind = add_space ? TOK_N_PREPEND : TOK_NONE;
    pp->pat = kwk_strdup("\xE2\x96\x81");
    pp->pat_len = 3;
    rp->kind = TOK_N_REPLACE;
    rp->pat = kwk_strdup(" ");
    rp->pat_len = 1;
    rp->content = kwk_strdup("\xE2\x96\x81");
    rp->content_len = 3;
    /* Decoder: Replace("▁", " "), ByteFallback, Fuse, Strip(" ", 1, 0). */
    struct tok_step *d = &t->decoder;
    d->kind = TOK_D_SEQ;
    d->subs = kwk_calloc(4, sizeof *d->subs);
    if (!d->subs || !pp->pat || !rp->pat || !rp->content) {
        rc = -ENOMEM;
        goto out;
    }
    d->n_subs = add_space ? 4 : 3;
    d->subs[0] = (struct tok_step){.kind = TOK_D_REPLACE, .pat = kwk_strdup("\xE2\x96\x81"),
                                   .pat_len = 3, .content = kwk_strdup(" "), .content_len = 1};
    d->subs[1].kind = TOK_D_BYTEFALLBACK;
    d->subs[2].kind = TOK_D_FUSE;
    /* the strip of the prepended space: only a step of the decoder (and freed) with one */
    if (add_space)
        d->subs[3] = (struct tok_step){.kind = TOK_D_STRIP, .content = kwk_strdup(" "),
                                       .content_len = 1, .left = 1};
    if (!d->subs[0].pat || !d->subs[0].content || (add_space && !d->subs[3].content))
        rc = -ENOMEM;
out:
    kwk_free(order);
    return rc;
}

/* "t5": SentencePiece's unigram model (T5, XLM-R and its rerankers and embedders), run as the
 * tokenizer.json transformers writes for such a model runs it: the file's charsmap, then (with
 * remove_extra_whitespaces) trailing spaces stripped and runs of spaces made one "▁", then
 * Metaspace, prepending "▁" when add_space_prefix says so (both flags off when absent, as
 * llama.cpp reads them). That is SentencePiece's own treatment of spaces, and what llama.cpp's
 * UGM tokenizer gives as well. Scores come from tokenizer.ggml.scores; an unknown character
 * costs the lowest normal score less 10, as in all three. */
/* The unigram's scores, the lowest normal one (unknown characters cost it less 10), byte
 * fallback when the vocabulary has byte pieces, the unknown id. */
static int ugm_scores(struct gv *v)
{
    struct kwk_tokenizer *t = v->t;
    const struct kwk_gguf_kv *sk = kwk_gguf_find(&v->g, "tokenizer.ggml.scores");
    if (!sk || sk->type != KWK_GGUF_ARRAY || sk->arr_len != (uint64_t)v->n)
        return kwk_err_set(v->err, KWK_EFORMAT, "%s: a \"t5\" vocabulary needs "
                           "tokenizer.ggml.scores, one per token", v->path);
    t->model = TOK_MODEL_UNIGRAM;
    t->scores = kwk_calloc((size_t)t->n_vocab, sizeof *t->scores);
    if (!t->scores)
        return -ENOMEM;
    double lowest = 0;
    int any_normal = 0, any_byte = 0;
    for (int64_t i = 0; i < v->n; i++) {
        double x = 0;
        if (kwk_gguf_arr_f64(sk, (uint64_t)i, &x) || !isfinite(x))
            return kwk_err_set(v->err, KWK_EFORMAT, "%s: tokenizer.ggml.scores[%lld] is not a "
                               "finite number", v->path, (long long)i);
        t->scores[i] = x;
        int ty = ttype(v, i);
        any_byte |= ty == TT_BYTE;
        if (ty == TT_NORMAL && (!any_normal || x < lowest)) {
            lowest = x;
            any_normal = 1;
        }
    }
    t->min_score = lowest;
    t->fuse_unk = 1;
    t->byte_fallback = any_byte;
    for (int64_t i = 0; i < v->n && t->unk_id < 0; i++)
        if (ttype(v, i) == TT_UNKNOWN)
            t->unk_id = (int32_t)i;
    return 0;
}

/* The normalizer: the charsmap, then with collapse Strip(right) and Replace(" {2,}", "▁"). */
static int ugm_normalizer(struct gv *v, int collapse)
{
    struct kwk_tokenizer *t = v->t;
    const struct kwk_gguf_kv *cm = kwk_gguf_find(&v->g, "tokenizer.ggml.precompiled_charsmap");
    if (cm && !(cm->type == KWK_GGUF_ARRAY &&
                (cm->arr_type == KWK_GGUF_UINT8 || cm->arr_type == KWK_GGUF_INT8)))
        return kwk_err_set(v->err, KWK_EFORMAT, "%s: tokenizer.ggml.precompiled_charsmap is not "
                           "an array of bytes", v->path);
    struct tok_step *ns = kwk_calloc(3, sizeof *ns);
    if (!ns)
        return -ENOMEM;
    t->normalizer = (struct tok_step){.kind = TOK_N_SEQ, .subs = ns};
    int rc = 0;
    if (cm && cm->arr_len > 0) {
        ns[t->normalizer.n_subs++].kind = TOK_N_PRECOMPILED;
        rc = tok_precompiled_init_raw(&ns[0], cm->val, (size_t)cm->arr_len, v->err);
        if (rc)
            return rc == KWK_EFORMAT ? kwk_err_set(v->err, rc, "%s: tokenizer.ggml."
                                                   "precompiled_charsmap: bad trie size", v->path)
                                     : rc;
    }
    if (collapse) {
        ns[t->normalizer.n_subs++] = (struct tok_step){.kind = TOK_N_STRIP, .right = 1};
        struct tok_step *r = &ns[t->normalizer.n_subs++];
        r->kind = TOK_N_REPLACE;
        r->content = kwk_strdup("\xE2\x96\x81");
        r->content_len = 3;
        if (!r->content)
            return -ENOMEM;
        rc = tok_compile_regex(&r->re, " {2,}", 5, v->err);
    }
    return rc;
}

static int load_ugm(struct gv *v)
{
    struct kwk_tokenizer *t = v->t;
    int add_space = 0, collapse = 0; /* llama.cpp's reading of a file without the keys */
    kwk_gguf_get_bool(&v->g, "tokenizer.ggml.add_space_prefix", &add_space);
    kwk_gguf_get_bool(&v->g, "tokenizer.ggml.remove_extra_whitespaces", &collapse);
    int rc = ugm_scores(v);
    if (!rc)
        rc = ugm_normalizer(v, collapse);
    if (rc)
        return rc;
    int scheme = add_space ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    t->pretok = (struct tok_step){.kind = TOK_P_METASPACE, .prepend_scheme = scheme, .split = 1,
                                  .content = kwk_strdup("\xE2\x96\x81"), .content_len = 3};
    t->decoder = (struct tok_step){.kind = TOK_D_METASPACE, .prepend_scheme = scheme,
                                   .content = kwk_strdup("\xE2\x96\x81"), .content_len = 3};
    return t->pretok.content && t->decoder.content ? 0 : -ENOMEM;
}

/* [CLS] and [SEP]: gguf-py's converter writes them as bos / eos (and seperator_token_id, so
 * spelled) without a cls_token_id; older files have cls_token_id. */
static void bert_ids(struct gv *v, int32_t *cls, int32_t *sep)
{
    int64_t c = get_id(v, "tokenizer.ggml.cls_token_id");
    if (c < 0)
        c = get_id(v, "tokenizer.ggml.bos_token_id");
    int64_t s = get_id(v, "tokenizer.ggml.seperator_token_id");
    if (s < 0)
        s = get_id(v, "tokenizer.ggml.separator_token_id");
    if (s < 0)
        s = get_id(v, "tokenizer.ggml.eos_token_id");
    *cls = (int32_t)c;
    *sep = (int32_t)s;
}

/* The pair as llama.cpp's rerank prompt joins it (format_rerank): [bos] a [eos] [sep] b [eos],
 * each special there when its add_*_token flag says so (defaults by vocabulary as llama.cpp
 * sets them), eos standing in for a missing sep and the reverse. Type ids as Hugging Face's
 * tokenizer of the model's family gives them: a WordPiece (BERT) vocabulary's 0 up to the
 * separators after a, 1 from b on; any other's all 0, as RoBERTa's and XLM-R's post-processor
 * (their rerankers have one token type, and llama.cpp sends 0 for every token). */
static int set_rerank_pair(struct gv *v, int is_bert, int is_spm, int is_t5, const char *pre,
                           size_t pre_n)
{
    int32_t bos = v->t->bos_id, sep = -1, eos = (int32_t)get_id(v, "tokenizer.ggml.eos_token_id");
    int add_bos = is_bert || is_spm, add_eos = is_t5, add_sep = is_bert;
    if (is_bert) {
        bert_ids(v, &bos, &sep);
    } else {
        sep = (int32_t)get_id(v, "tokenizer.ggml.seperator_token_id");
        if (sep < 0)
            sep = (int32_t)get_id(v, "tokenizer.ggml.separator_token_id");
        if (pre && name_in("llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|"
                           "tekken|chameleon", pre, pre_n))
            add_bos = 1;
        if (pre && name_in("jina-v1-en|jina-v2-code|roberta-bpe", pre, pre_n))
            add_sep = 1;
    }
    kwk_gguf_get_bool(&v->g, "tokenizer.ggml.add_bos_token", &add_bos);
    kwk_gguf_get_bool(&v->g, "tokenizer.ggml.add_eos_token", &add_eos);
    kwk_gguf_get_bool(&v->g, "tokenizer.ggml.add_sep_token", &add_sep);
    int32_t end = eos >= 0 ? eos : sep;
    struct tok_piece p[6];
    int n = 0;
    if (add_bos && bos >= 0)
        p[n++] = (struct tok_piece){bos, 0};
    p[n++] = (struct tok_piece){TOK_PAIR_A, 0};
    if (add_eos && end >= 0)
        p[n++] = (struct tok_piece){end, 0};
    if (add_sep && sep >= 0)
        p[n++] = (struct tok_piece){sep, 0};
    int tb = is_bert ? 1 : 0;
    p[n++] = (struct tok_piece){TOK_PAIR_B, tb};
    if (add_eos && end >= 0)
        p[n++] = (struct tok_piece){end, tb};
    return tok_pair_set(v->t, p, n);
}

static int load_bert(struct gv *v)
{
    struct kwk_tokenizer *t = v->t;
    t->model = TOK_MODEL_WORDPIECE;
    t->cont_prefix = kwk_strdup("##");
    t->cont_prefix_len = 2;
    t->max_chars_per_word = 100;
    t->normalizer = (struct tok_step){.kind = TOK_N_BERT, .clean_text = 1, .chinese = 1,
                                      .strip_accents = -1, .lowercase = 1};
    t->pretok.kind = TOK_P_SEQ;
    t->pretok.subs = kwk_calloc(2, sizeof *t->pretok.subs);
    t->decoder = (struct tok_step){.kind = TOK_D_WORDPIECE, .content = kwk_strdup("##"),
                                   .content_len = 2, .cleanup = 1};
    if (!t->pretok.subs || !t->cont_prefix || !t->decoder.content)
        return -ENOMEM;
    t->pretok.n_subs = 2;
    t->pretok.subs[0].kind = TOK_P_WSPLIT;
    t->pretok.subs[1].kind = TOK_P_PUNCT;
    t->pretok.subs[1].behavior = TOK_SPLIT_ISOLATED;
    /* llama.cpp frames one sequence with [CLS] and [SEP] */
    int32_t cls, sep;
    bert_ids(v, &cls, &sep);
    return set_template(t, cls, sep);
}

/* GGUF BERT vocabularies mark word starts with "▁" and drop "##": undo that. */
static int set_bert_piece(struct kwk_tokenizer *t, int32_t id, const char *s, size_t n)
{
    if (n >= 2 && s[0] == '[' && s[n - 1] == ']')
        return tok_set_piece(t, id, s, n);
    if (n >= 3 && !memcmp(s, "\xE2\x96\x81", 3))
        return tok_set_piece(t, id, s + 3, n - 3);
    char stack[256];
    char *p = n + 2 <= sizeof stack ? stack : kwk_malloc(n + 2);
    if (!p)
        return -ENOMEM;
    memcpy(p, "##", 2);
    memcpy(p + 2, s, n);
    int rc = tok_set_piece(t, id, p, n + 2);
    if (p != stack)
        kwk_free(p);
    return rc;
}

int tok_load_gguf(struct kwk_tokenizer *t, const char *path, struct kwk_err *err)
{
    struct gv v = {.t = t, .path = path, .err = err};
    const char *model = NULL, *pre = NULL, *s;
    size_t model_n = 0, pre_n = 0, n;
    int rc = kwk_gguf_open(&v.g, path, err);
    if (rc)
        return rc;
    const struct kwk_gguf_kv *tk = kwk_gguf_find(&v.g, "tokenizer.ggml.tokens");
    if (kwk_gguf_get_str(&v.g, "tokenizer.ggml.model", &model, &model_n) || !tk ||
        tk->type != KWK_GGUF_ARRAY || tk->arr_type != KWK_GGUF_STRING || tk->arr_len == 0 ||
        tk->arr_len > (1u << 26)) {
        rc = kwk_err_set(err, KWK_EFORMAT, "%s: no tokenizer.ggml.model / tokens", path);
        goto out;
    }
    kwk_gguf_get_str(&v.g, "tokenizer.ggml.pre", &pre, &pre_n);
    v.n = (int64_t)tk->arr_len;
    v.types = kwk_gguf_find(&v.g, "tokenizer.ggml.token_type");
    v.ptrs = kwk_malloc(sizeof *v.ptrs * (size_t)v.n);
    v.lens = kwk_malloc(sizeof *v.lens * (size_t)v.n);
    if (!v.ptrs || !v.lens) {
        rc = kwk_err_set(err, -ENOMEM, "%s: out of memory", path);
        goto out;
    }
    if ((rc = kwk_gguf_arr_strings(tk, v.ptrs, v.lens)))
        goto out;
    int is_bert = model_n == 4 && !memcmp(model, "bert", 4);
    int is_t5 = model_n == 2 && !memcmp(model, "t5", 2);
    if ((rc = tok_vocab_alloc(t, (int32_t)v.n, err)))
        goto out;
    for (int64_t i = 0; i < v.n && !rc; i++)
        rc = is_bert ? set_bert_piece(t, (int32_t)i, v.ptrs[i], v.lens[i])
                     : tok_set_piece(t, (int32_t)i, v.ptrs[i], v.lens[i]);
    /* Control and user-defined tokens are matched in the text before the model runs. */
    for (int64_t i = 0; i < v.n && !rc; i++) {
        int ty = ttype(&v, i);
        /* A unigram vocabulary's unknown token is one of Hugging Face's special tokens too
         * ("<unk>" in the text gives its id, in llama.cpp as well). */
        if (ty == TT_CONTROL || ty == TT_USER || (is_t5 && ty == TT_UNKNOWN))
            rc = add_added(t, (int32_t)i, t->pieces[i], t->piece_lens[i], ty != TT_USER);
    }
    if (rc)
        goto out;
    t->model = TOK_MODEL_BPE;
    t->unk_id = (int32_t)get_id(&v, "tokenizer.ggml.unknown_token_id");
    t->bos_id = (int32_t)get_id(&v, "tokenizer.ggml.bos_token_id");
    t->pad_id = (int32_t)get_id(&v, "tokenizer.ggml.padding_token_id");
    int64_t eos = get_id(&v, "tokenizer.ggml.eos_token_id");
    if (eos >= 0)
        t->eos_ids[t->n_eos++] = (int32_t)eos;
    int64_t eot = get_id(&v, "tokenizer.ggml.eot_token_id");
    if (eot >= 0 && eot != eos)
        t->eos_ids[t->n_eos++] = (int32_t)eot;
    if (model_n == 4 && !memcmp(model, "gpt2", 4)) {
        rc = load_gpt2(&v, pre, pre_n);
    } else if (model_n == 5 && !memcmp(model, "llama", 5)) {
        rc = load_spm(&v);
    } else if (is_bert) {
        rc = load_bert(&v);
    } else if (is_t5) {
        rc = load_ugm(&v);
    } else {
        rc = kwk_err_set(err, KWK_EUNSUPPORTED, "%s: tokenizer.ggml.model \"%.*s\" is not supported",
                         path, (int)KWK_MIN(model_n, (size_t)40), model);
    }
    if (rc)
        goto out;
    if (!is_bert) {
        /* llama.cpp's defaults: BOS for "llama", EOS for "t5" (T5's "text </s>") */
        int add_bos = model_n == 5, add_eos = is_t5;
        kwk_gguf_get_bool(&v.g, "tokenizer.ggml.add_bos_token", &add_bos);
        kwk_gguf_get_bool(&v.g, "tokenizer.ggml.add_eos_token", &add_eos);
        if ((add_bos && t->bos_id >= 0) || (add_eos && eos >= 0))
            rc = set_template(t, add_bos ? t->bos_id : -1, add_eos ? (int32_t)eos : -1);
        if (rc)
            goto out;
    }
    if ((rc = set_rerank_pair(&v, is_bert, model_n == 5 && !memcmp(model, "llama", 5), is_t5,
                              pre, pre_n)))
        goto out;
    if (t->bos_id >= 0 && t->pieces[t->bos_id])
        t->bos_token = kwk_strdup(t->pieces[t->bos_id]);
    if (eos >= 0 && t->pieces[eos])
        t->eos_token = kwk_strdup(t->pieces[eos]);
    if (!kwk_gguf_get_str(&v.g, "tokenizer.chat_template", &s, &n)) {
        t->chat_template = kwk_malloc(n + 1);
        if (!t->chat_template) {
            rc = -ENOMEM;
            goto out;
        }
        memcpy(t->chat_template, s, n);
        t->chat_template[n] = 0;
    }
out:
    if (rc == -ENOMEM)
        kwk_err_set(err, rc, "%s: out of memory", path);
    kwk_free(v.ptrs);
    kwk_free(v.lens);
    kwk_gguf_close(&v.g);
    return rc;
}
