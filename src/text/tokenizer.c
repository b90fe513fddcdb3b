/* tokenizer.c - the public tokenizer API: loading (dispatch to tokenizer.json, legacy files,
 * GGUF) with the derived tables, freeing, decode and look-ups (encode is tok_encode.c, streaming
 * tok_detok.c). A loaded tokenizer is immutable apart from its locked word cache; any thread may
 * call these concurrently. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

/* ---- load-time helpers ---------------------------------------------------------------- */

char *tok_arena_dup(struct kwk_tokenizer *t, const char *s, size_t n)
{
    struct tok_arena_block *b = t->arena;
    if (!b || b->cap - b->used < n + 1) {
        size_t cap = KWK_MAX((size_t)1 << 20, n + 1);
        b = kwk_malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->next = t->arena;
        b->used = 0;
        b->cap = cap;
        t->arena = b;
    }
    char *p = b->data + b->used;
    memcpy(p, s, n);
    p[n] = 0;
    b->used += n + 1;
    return p;
}

int tok_vocab_alloc(struct kwk_tokenizer *t, int32_t n, struct kwk_err *err)
{
    if (n <= 0 || n > TOK_MAX_VOCAB)
        return kwk_err_set(err, KWK_EFORMAT, "vocabulary size %d is out of range", (int)n);
    t->n_vocab = n;
    t->pieces = kwk_calloc((size_t)n, sizeof *t->pieces);
    t->piece_lens = kwk_calloc((size_t)n, sizeof *t->piece_lens);
    t->attr = kwk_calloc((size_t)n, 1);
    /* the map grows as pieces arrive: sized by n it would be 24 bytes a slot for every id
     * below the largest, however few pieces a sparse vocabulary holds */
    if (!t->pieces || !t->piece_lens || !t->attr ||
        tok_map_init(&t->vocab, (size_t)KWK_MIN(n, 1 << 18)))
        return kwk_err_set(err, -ENOMEM, "out of memory for %d tokens", (int)n);
    return 0;
}

int tok_set_piece(struct kwk_tokenizer *t, int32_t id, const char *s, size_t n)
{
    if (id < 0 || id >= t->n_vocab || n > UINT32_MAX)
        return KWK_EFORMAT;
    char *p = tok_arena_dup(t, s, n);
    if (!p)
        return -ENOMEM;
    if (!t->pieces[id]) {
        t->pieces[id] = p;
        t->piece_lens[id] = (uint32_t)n;
    }
    return tok_map_put(&t->vocab, p, n, id);
}

int tok_add_merge(struct kwk_tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                  int32_t rank)
{
    char stack[256];
    char *cat = stack;
    int32_t ia = tok_map_get(&t->vocab, a, na), ib = tok_map_get(&t->vocab, b, nb);
    if (ia < 0 || ib < 0)
        return 0; /* HF refuses such a file; a merge that can never apply is harmless here */
    if (na + nb > sizeof stack && !(cat = kwk_malloc(na + nb)))
        return -ENOMEM;
    memcpy(cat, a, na);
    memcpy(cat + na, b, nb);
    int32_t id = tok_map_get(&t->vocab, cat, na + nb);
    if (cat != stack)
        kwk_free(cat);
    if (id < 0)
        return 0;
    return tok_pairmap_put(&t->merges, ia, ib, rank, id);
}

/* Oniguruma (HF's regex engine) gives \w the Unicode word set: letters, marks, decimal and
 * letter numbers, connector punctuation and the joiners; PCRE2's \w is narrower. */
#define ONIG_WORD "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200C}\\x{200D}"

static void translate_regex(const char *pat, size_t n, struct tok_buf *out)
{
    int in_class = 0;
    size_t class_start = 0;
    for (size_t i = 0; i < n; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < n) {
            char e = pat[i + 1];
            i++;
            if (e == 'w') {
                tok_buf_add(out, in_class ? ONIG_WORD : "[" ONIG_WORD "]",
                            strlen(ONIG_WORD) + (in_class ? 0 : 2));
            } else if (e == 'W' && !in_class) {
                tok_buf_add(out, "[^" ONIG_WORD "]", strlen(ONIG_WORD) + 3);
            } else {
                tok_buf_addc(out, c);
                tok_buf_addc(out, e);
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            class_start = i;
        } else if (in_class && c == ']' && i != class_start + 1 &&
                   !(i == class_start + 2 && pat[class_start + 1] == '^')) {
            in_class = 0;
        }
        tok_buf_addc(out, c);
    }
}

int tok_compile_regex(pcre2_code **re, const char *pat, size_t n, struct kwk_err *err)
{
    int ec;
    PCRE2_SIZE eo;
    struct tok_buf tr = {0};
    translate_regex(pat, n, &tr);
    if (!tr.p)
        tok_buf_add(&tr, "", 0);
    if (tr.oom) {
        tok_buf_free(&tr);
        return kwk_err_set(err, -ENOMEM, "out of memory");
    }
    *re = pcre2_compile((PCRE2_SPTR)tr.p, tr.n, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    tok_buf_free(&tr);
    if (!*re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        kwk_err_set_pos(err, KWK_ESYNTAX, (int64_t)eo, "regex /%.*s/: %s",
                        (int)KWK_MIN(n, (size_t)200), pat, (const char *)msg);
        return KWK_ESYNTAX;
    }
    /* JIT is an accelerator: without it (e.g. no executable memory) matching still works. */
    pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE);
    return 0;
}

int32_t tok_piece_id(const struct kwk_tokenizer *t, const char *s, size_t n)
{
    int32_t id = tok_map_get(&t->added_map, s, n);
    if (!t->added_map.slots) /* before tok_finish: look through the list */
        for (int i = 0; i < t->n_added && id < 0; i++)
            if (t->added[i].len == n && !memcmp(t->added[i].content, s, n))
                id = t->added[i].id;
    return id >= 0 ? id : tok_map_get(&t->vocab, s, n);
}

static int cmp_added(const void *pa, const void *pb)
{
    const struct tok_added *a = pa, *b = pb;
    uint8_t ca = a->len ? (uint8_t)a->content[0] : 0, cb = b->len ? (uint8_t)b->content[0] : 0;
    if (ca != cb)
        return ca < cb ? -1 : 1;
    return a->len > b->len ? -1 : a->len < b->len;
}

static const struct kwk_tokenizer *norm_sort_t;

static int cmp_norm(const void *pa, const void *pb)
{
    const struct tok_added *a = &norm_sort_t->added[*(const int32_t *)pa];
    const struct tok_added *b = &norm_sort_t->added[*(const int32_t *)pb];
    uint8_t ca = a->norm_len ? (uint8_t)a->norm[0] : 0, cb = b->norm_len ? (uint8_t)b->norm[0] : 0;
    if (ca != cb)
        return ca < cb ? -1 : 1;
    return a->norm_len > b->norm_len ? -1 : a->norm_len < b->norm_len;
}

static int finish_added(struct kwk_tokenizer *t)
{
    if (t->n_added > 1) /* none: t->added may be NULL, which qsort must not get */
        qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
    for (int b = 0, i = 0; b <= 256; b++) {
        while (i < t->n_added && t->added[i].len && (uint8_t)t->added[i].content[0] < b)
            i++;
        t->added_first[b] = i;
    }
    /* Empty contents sort first (byte 0) and never match. */
    for (int i = 0; i < t->n_added; i++) {
        struct tok_added *a = &t->added[i];
        if (a->id < 0 || a->id >= t->n_vocab)
            return KWK_EFORMAT;
        t->attr[a->id] |= TOK_ATTR_ADDED | (a->special ? TOK_ATTR_SPECIAL : 0);
        if (!t->pieces[a->id]) {
            t->pieces[a->id] = a->content;
            t->piece_lens[a->id] = (uint32_t)a->len;
        }
        if (tok_map_put(&t->added_map, a->content, a->len, a->id))
            return -ENOMEM;
        a->norm = a->content;
        a->norm_len = a->len;
        if (a->normalized && t->normalizer.kind != TOK_NONE) {
            struct tok_buf nb = {0};
            int rc = tok_normalize(t, &t->normalizer, a->content, a->len, &nb);
            if (rc) {
                tok_buf_free(&nb);
                return rc;
            }
            a->norm = tok_arena_dup(t, nb.p, nb.n);
            a->norm_len = nb.n;
            tok_buf_free(&nb);
            if (!a->norm)
                return -ENOMEM;
        }
        if (a->normalized)
            t->has_normalized_added = 1;
        /* HF names a normalized added token by its normalized content (id_to_token, decode). */
        if (a->norm != a->content && t->pieces[a->id] == a->content) {
            t->pieces[a->id] = a->norm;
            t->piece_lens[a->id] = (uint32_t)a->norm_len;
        }
    }
    t->added_norm_order = kwk_malloc(sizeof(int32_t) * (size_t)(t->n_added + 1));
    if (!t->added_norm_order)
        return -ENOMEM;
    for (int i = 0; i < t->n_added; i++)
        t->added_norm_order[i] = i;
    /* qsort has no context argument; loading is rare, and this sort is the only user. */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    norm_sort_t = t;
    qsort(t->added_norm_order, (size_t)t->n_added, sizeof(int32_t), cmp_norm);
    pthread_mutex_unlock(&lock);
    for (int b = 0, i = 0; b <= 256; b++) {
        while (i < t->n_added) {
            const struct tok_added *a = &t->added[t->added_norm_order[i]];
            if (a->norm_len && (uint8_t)a->norm[0] >= b)
                break;
            i++;
        }
        t->added_norm_first[b] = i;
    }
    return 0;
}

static int finish_bytes(struct kwk_tokenizer *t)
{
    char key[8];
    for (int b = 0; b < 256; b++) {
        snprintf(key, sizeof key, "<0x%02X>", b);
        t->fallback_ids[b] = tok_map_get(&t->vocab, key, 6);
        t->byte_ids[b] = -1;
    }
    if (!t->byte_level)
        return 0;
    for (int b = 0; b < 256; b++) {
        struct tok_buf u = {0};
        tok_buf_add_cp(&u, tok_byte_cp((uint8_t)b));
        t->byte_ids[b] = u.p ? tok_map_get(&t->vocab, u.p, u.n) : -1;
        tok_buf_free(&u);
    }
    if (!t->ignore_merges)
        return 0;
    /* ignore_merges looks whole words up by their raw bytes. */
    if (tok_map_init(&t->vocab_raw, (size_t)t->n_vocab))
        return -ENOMEM;
    struct tok_buf raw = {0};
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->pieces[id];
        if (!s || (t->attr[id] & TOK_ATTR_ADDED && tok_map_get(&t->vocab, s, t->piece_lens[id]) != id))
            continue;
        size_t n = t->piece_lens[id];
        int ok = 1;
        raw.n = 0;
        for (size_t k = 0; k < n && ok;) {
            uint32_t cp;
            k += tok_utf8_next(s + k, n - k, &cp);
            int b = tok_cp_to_byte(cp);
            if (b < 0)
                ok = 0;
            else
                tok_buf_addc(&raw, (char)b);
        }
        if (!ok || raw.oom || !raw.n)
            continue;
        char *p = tok_arena_dup(t, raw.p, raw.n);
        if (!p || tok_map_put(&t->vocab_raw, p, raw.n, id)) {
            tok_buf_free(&raw);
            return -ENOMEM;
        }
    }
    tok_buf_free(&raw);
    return 0;
}

/* Every id a post-processor adds must exist, so encode never returns an id decode refuses. */
static int post_ids_ok(const struct kwk_tokenizer *t, const struct tok_step *st)
{
    for (int i = 0; i < st->n_subs; i++)
        if (!post_ids_ok(t, &st->subs[i]))
            return 0;
    for (int i = 0; i < st->n_tmpl; i++)
        if (st->tmpl[i] < -1 || st->tmpl[i] >= t->n_vocab)
            return 0;
    for (int i = 0; i < st->n_pair; i++)
        if (st->pair[i].id < TOK_PAIR_B || st->pair[i].id >= t->n_vocab)
            return 0;
    return 1;
}

int tok_finish(struct kwk_tokenizer *t, struct kwk_err *err)
{
    if (!post_ids_ok(t, &t->post))
        return kwk_err_set(err, KWK_EFORMAT, "%s: the post-processor names an id outside the "
                           "vocabulary", t->source);
    for (int i = 0; i < t->n_pair; i++)
        if (t->pair[i].id < TOK_PAIR_B || t->pair[i].id >= t->n_vocab)
            return kwk_err_set(err, KWK_EFORMAT, "%s: the pair form names an id outside the "
                               "vocabulary", t->source);
    int rc = tok_pair_resolve(t);
    if (!rc)
        rc = finish_added(t);
    if (!rc)
        rc = finish_bytes(t);
    if (rc == KWK_EFORMAT)
        return kwk_err_set(err, rc, "%s: an added token id is out of range", t->source);
    if (rc)
        return kwk_err_set(err, rc, "%s: out of memory", t->source);
    if (!t->max_chars_per_word)
        t->max_chars_per_word = 100;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->pieces[id] && t->piece_lens[id] > t->max_piece_len)
            t->max_piece_len = t->piece_lens[id];
    if (t->model == TOK_MODEL_BPE && !t->byte_level && tok_map_get(&t->vocab, "\xE2\x96\x81", 3) >= 0) {
        /* Safe to cut words before "▁" when no piece has "▁" after another character. */
        t->split_at_metaspace = 1;
        for (int32_t id = 0; id < t->n_vocab && t->split_at_metaspace; id++) {
            const char *p = t->pieces[id];
            size_t n = t->piece_lens[id], k = 0;
            if (!p)
                continue;
            while (k + 3 <= n && !memcmp(p + k, "\xE2\x96\x81", 3))
                k += 3;
            if (k < n && memmem(p + k, n - k, "\xE2\x96\x81", 3))
                t->split_at_metaspace = 0;
        }
    }
    if (t->model == TOK_MODEL_BPE && tok_gcache_new(t))
        return kwk_err_set(err, -ENOMEM, "%s: out of memory", t->source);
    return 0;
}

void tok_step_free(struct tok_step *s)
{
    for (int i = 0; i < s->n_subs; i++)
        tok_step_free(&s->subs[i]);
    kwk_free(s->subs);
    kwk_free(s->pat);
    kwk_free(s->content);
    kwk_free(s->tmpl);
    kwk_free(s->pair);
    if (s->re)
        pcre2_code_free(s->re);
    memset(s, 0, sizeof *s);
}

void kwk_tokenizer_free(kwk_tokenizer *t)
{
    if (!t)
        return;
    tok_gcache_free(t);
    kwk_free(t->pieces);
    kwk_free(t->piece_lens);
    kwk_free(t->attr);
    tok_map_free(&t->vocab);
    tok_map_free(&t->added_map);
    tok_map_free(&t->vocab_raw);
    tok_pairmap_free(&t->merges);
    kwk_free(t->cont_prefix);
    kwk_free(t->end_suffix);
    kwk_free(t->scores);
    tok_step_free(&t->normalizer);
    tok_step_free(&t->pretok);
    tok_step_free(&t->decoder);
    tok_step_free(&t->post);
    kwk_free(t->pair);
    for (int i = 0; i < t->n_added; i++)
        kwk_free(t->added[i].content);
    kwk_free(t->added);
    kwk_free(t->added_norm_order);
    kwk_free(t->bos_token);
    kwk_free(t->eos_token);
    kwk_free(t->chat_template);
    kwk_free(t->source);
    while (t->arena) {
        struct tok_arena_block *n = t->arena->next;
        kwk_free(t->arena);
        t->arena = n;
    }
    kwk_free(t);
}

static kwk_tokenizer *tok_new(const char *source)
{
    kwk_tokenizer *t = kwk_calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->unk_id = t->bos_id = t->pad_id = -1;
    t->source = kwk_strdup(source);
    if (!t->source) {
        kwk_free(t);
        return NULL;
    }
    return t;
}

static int ends_with(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static int load_json_file(kwk_tokenizer *t, const char *path, struct kwk_err *err)
{
    char *text = NULL;
    size_t n = 0;
    int rc = kwk_read_file(path, (size_t)1 << 30, &text, &n, err);
    if (rc)
        return rc;
    rc = tok_load_json_text(t, text, n, path, err);
    kwk_free(text);
    return rc;
}

static int load_dir(kwk_tokenizer *t, const char *dir, struct kwk_err *err)
{
    char path[4096];
    if (kwk_path_join(path, sizeof path, dir, "tokenizer.json"))
        return kwk_err_set(err, KWK_ELIMIT, "%s: path too long", dir);
    int rc = kwk_file_exists(path) ? load_json_file(t, path, err) : tok_load_legacy(t, dir, err);
    if (rc)
        return rc;
    return tok_load_configs(t, dir, err);
}

kwk_tokenizer *kwk_tokenizer_load(const char *path_or_id, struct kwk_err *err)
{
    kwk_err_clear(err);
    if (!path_or_id) {
        kwk_err_set(err, KWK_EARG, "no tokenizer path");
        return NULL;
    }
    kwk_tokenizer *t = tok_new(path_or_id);
    int rc;
    char resolved[4096];
    if (!t) {
        kwk_err_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    if (kwk_dir_exists(path_or_id)) {
        rc = load_dir(t, path_or_id, err);
    } else if (kwk_file_exists(path_or_id)) {
        if (ends_with(path_or_id, ".gguf")) {
            rc = tok_load_gguf(t, path_or_id, err);
        } else {
            rc = load_json_file(t, path_or_id, err);
            /* Configs beside a tokenizer.json file. */
            if (!rc) {
                char dir[4096];
                snprintf(dir, sizeof dir, "%s", path_or_id);
                char *slash = strrchr(dir, '/');
                if (slash) {
                    *slash = 0;
                    rc = tok_load_configs(t, dir, err);
                } else {
                    rc = tok_load_configs(t, ".", err);
                }
            }
        }
    } else {
        rc = kwk_hf_resolve(path_or_id, resolved, sizeof resolved, err);
        if (!rc)
            rc = load_dir(t, resolved, err);
    }
    if (!rc)
        rc = tok_finish(t, err);
    if (rc) {
        if (err && !err->msg[0])
            kwk_err_set(err, rc, "%s: cannot load tokenizer", path_or_id);
        kwk_tokenizer_free(t);
        return NULL;
    }
    return t;
}

kwk_tokenizer *kwk_tokenizer_load_json(const char *json, size_t len, struct kwk_err *err)
{
    kwk_err_clear(err);
    kwk_tokenizer *t = tok_new("tokenizer.json");
    if (!t) {
        kwk_err_set(err, -ENOMEM, "out of memory");
        return NULL;
    }
    int rc = json ? tok_load_json_text(t, json, len, "tokenizer.json", err) : KWK_EARG;
    if (!rc)
        rc = tok_finish(t, err);
    if (rc) {
        if (err && !err->msg[0])
            kwk_err_set(err, rc, "cannot load tokenizer.json");
        kwk_tokenizer_free(t);
        return NULL;
    }
    return t;
}

void kwk_tokenizer_mem_free(void *p)
{
    kwk_free(p);
}

/* ---- decode and look-ups -------------------------------------------------------------- */

int kwk_tokenizer_decode(const kwk_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                         char *buf, size_t cap, size_t *len)
{
    struct tok_buf out = {0};
    if (!t || (!ids && n))
        return KWK_EARG;
    int rc = tok_decode_ids(t, ids, n, skip_special, &out);
    if (!rc) {
        if (len)
            *len = out.n;
        if (out.n + 1 > cap) {
            rc = KWK_ELIMIT;
        } else {
            memcpy(buf, out.p, out.n + 1);
        }
    }
    tok_buf_free(&out);
    return rc;
}

int kwk_tokenizer_decode_alloc(const kwk_tokenizer *t, const int32_t *ids, size_t n,
                               int skip_special, char **text, size_t *len)
{
    struct tok_buf out = {0};
    if (!t || !text || (!ids && n))
        return KWK_EARG;
    *text = NULL;
    int rc = tok_decode_ids(t, ids, n, skip_special, &out);
    if (rc) {
        tok_buf_free(&out);
        return rc;
    }
    *text = out.p;
    if (len)
        *len = out.n;
    return 0;
}

int kwk_tokenizer_n_vocab(const kwk_tokenizer *t)
{
    return t ? t->n_vocab : 0;
}

const char *kwk_tokenizer_id_to_piece(const kwk_tokenizer *t, int32_t id, size_t *len)
{
    if (!t || id < 0 || id >= t->n_vocab || !t->pieces[id])
        return NULL;
    if (len)
        *len = t->piece_lens[id];
    return t->pieces[id];
}

int32_t kwk_tokenizer_piece_to_id(const kwk_tokenizer *t, const char *piece, size_t len)
{
    return t && piece ? tok_piece_id(t, piece, len) : -1;
}

int kwk_tokenizer_is_special(const kwk_tokenizer *t, int32_t id)
{
    return t && id >= 0 && id < t->n_vocab && (t->attr[id] & TOK_ATTR_SPECIAL) ? 1 : 0;
}

int32_t kwk_tokenizer_bos_id(const kwk_tokenizer *t) { return t ? t->bos_id : -1; }
int32_t kwk_tokenizer_pad_id(const kwk_tokenizer *t) { return t ? t->pad_id : -1; }
int32_t kwk_tokenizer_unk_id(const kwk_tokenizer *t) { return t ? t->unk_id : -1; }

int kwk_tokenizer_eos_ids(const kwk_tokenizer *t, int32_t *ids, int cap)
{
    if (!t)
        return 0;
    for (int i = 0; i < t->n_eos && i < cap; i++)
        ids[i] = t->eos_ids[i];
    return t->n_eos;
}

const char *kwk_tokenizer_bos_token(const kwk_tokenizer *t) { return t ? t->bos_token : NULL; }
const char *kwk_tokenizer_eos_token(const kwk_tokenizer *t) { return t ? t->eos_token : NULL; }
const char *kwk_tokenizer_chat_template(const kwk_tokenizer *t)
{
    return t ? t->chat_template : NULL;
}

