/* tokenizer.h - internal contract of the tokenizer module (src/text/tok_*.c, tokenizer.c):
 * the loaded tokenizer, its pipeline steps and the helpers each file provides. A loaded
 * tokenizer is immutable; encode/decode use per-call scratch, so any thread may call them. */
#ifndef KWK_TEXT_TOKENIZER_H
#define KWK_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/base.h"
#include "kwker.h"

/* ---- growable byte buffer and id vector (sticky error: oom checked by the caller) -------- */

struct tok_buf {
    char *p;
    size_t n, cap;
    int oom;
};

void tok_buf_reserve(struct tok_buf *b, size_t extra);
void tok_buf_add(struct tok_buf *b, const void *s, size_t n);
void tok_buf_addc(struct tok_buf *b, char c);
void tok_buf_add_cp(struct tok_buf *b, uint32_t cp); /* UTF-8 encode one code point */
void tok_buf_free(struct tok_buf *b);

struct tok_ids {
    int32_t *p;
    size_t n, cap;
    int oom;
};

void tok_ids_push(struct tok_ids *v, int32_t id);
void tok_ids_free(struct tok_ids *v);

/* ---- hash maps ------------------------------------------------------------------------- */

uint64_t tok_hash(const void *p, size_t n);

/* String -> int32. Keys are borrowed: they must outlive the map. */
struct tok_map_slot {
    const char *key;
    uint32_t len;
    int32_t val;
    uint64_t hash;
};
struct tok_map {
    struct tok_map_slot *slots;
    size_t mask, n;
};
int tok_map_init(struct tok_map *m, size_t expected);
/* Insert or overwrite. 0 or -ENOMEM (grows as needed). */
int tok_map_put(struct tok_map *m, const char *key, size_t len, int32_t val);
int32_t tok_map_get(const struct tok_map *m, const char *key, size_t len); /* -1 if absent */
void tok_map_free(struct tok_map *m);

/* (left id, right id) -> (rank, merged id): the BPE merge table. */
struct tok_pair_slot {
    uint64_t key; /* UINT64_MAX when empty */
    int32_t rank;
    int32_t id;
};
struct tok_pairmap {
    struct tok_pair_slot *slots;
    size_t mask, n;
};
int tok_pairmap_init(struct tok_pairmap *m, size_t expected);
int tok_pairmap_put(struct tok_pairmap *m, int32_t a, int32_t b, int32_t rank, int32_t id);
const struct tok_pair_slot *tok_pairmap_get(const struct tok_pairmap *m, int32_t a, int32_t b);
void tok_pairmap_free(struct tok_pairmap *m);

/* ---- Unicode helpers (tok_unicode.c) --------------------------------------------------- */

/* Decode one code point at s[0..n); returns its length (>= 1). Invalid bytes decode as
 * U+FFFD with length 1 (input is sanitized before the pipeline, so this is only defensive). */
size_t tok_utf8_next(const char *s, size_t n, uint32_t *cp);
size_t tok_utf8_len(uint8_t lead);
/* Copy src to out, replacing every maximal invalid subsequence by U+FFFD as Python's
 * bytes.decode("utf-8", errors="replace") does. */
void tok_utf8_sanitize(const char *src, size_t n, struct tok_buf *out);
/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8 sequence which
 * could still be completed by more bytes. */
size_t tok_utf8_complete_prefix(const char *s, size_t n);
int tok_is_whitespace(uint32_t cp);  /* Rust char::is_whitespace (White_Space) */
int tok_is_punct(uint32_t cp);       /* ASCII punctuation or Unicode P* */
int tok_is_bert_punct(uint32_t cp);  /* BERT: ASCII non-alnum printable or Unicode P* */
int tok_is_numeric(uint32_t cp);     /* Nd, Nl, No */
int tok_is_alnum(uint32_t cp);       /* L*, N* */
int tok_is_control(uint32_t cp);     /* C* except \t \n \r */
int tok_is_mn(uint32_t cp);          /* Mn */
int tok_is_mark(uint32_t cp);        /* Mn, Mc, Me */
int tok_is_cjk(uint32_t cp);         /* BERT's "Chinese character" blocks */
uint32_t tok_lower(uint32_t cp);
/* Append the lowercase of cp (full mapping where it differs from the simple one). */
void tok_buf_add_lower(struct tok_buf *b, uint32_t cp);

/* GPT-2's byte <-> printable character mapping (bytes_to_unicode). */
uint32_t tok_byte_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp); /* -1 when cp is not one of the 256 */

/* ---- pipeline steps -------------------------------------------------------------------- */

enum tok_kind {
    TOK_NONE = 0,
    /* normalizers */
    TOK_N_SEQ, TOK_N_NFC, TOK_N_NFD, TOK_N_NFKC, TOK_N_NFKD, TOK_N_LOWER, TOK_N_STRIP_ACCENTS,
    TOK_N_REPLACE, TOK_N_PREPEND, TOK_N_STRIP, TOK_N_BERT, TOK_N_PRECOMPILED,
    /* pre-tokenizers */
    TOK_P_SEQ, TOK_P_BYTELEVEL, TOK_P_SPLIT, TOK_P_METASPACE, TOK_P_BERT, TOK_P_WHITESPACE,
    TOK_P_WSPLIT, TOK_P_PUNCT, TOK_P_DIGITS,
    /* decoders */
    TOK_D_SEQ, TOK_D_BYTELEVEL, TOK_D_METASPACE, TOK_D_BYTEFALLBACK, TOK_D_FUSE, TOK_D_STRIP,
    TOK_D_REPLACE, TOK_D_WORDPIECE,
    /* post-processors */
    TOK_PP_SEQ, TOK_PP_TEMPLATE, TOK_PP_NOOP,
};

/* Split behaviours (HF SplitDelimiterBehavior). */
enum tok_split { TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_PREV, TOK_SPLIT_NEXT,
                 TOK_SPLIT_CONTIGUOUS };
/* Metaspace prepend schemes. */
enum tok_prepend { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };

struct tok_step {
    int kind;
    struct tok_step *subs; /* [n_subs] for *_SEQ */
    int n_subs;
    char *pat;             /* literal pattern (Replace/Split String), Prepend text */
    size_t pat_len;
    pcre2_code *re;        /* compiled Regex pattern (with JIT) or NULL */
    char *content;         /* Replace content / Metaspace replacement / WordPiece prefix */
    size_t content_len;
    int behavior, invert;
    int add_prefix_space, use_regex; /* ByteLevel; Metaspace uses add_prefix_space as prepend */
    int prepend_scheme, split;       /* Metaspace */
    int individual;                  /* Digits */
    int left, right;                 /* Strip normalizer; Strip decoder start/stop counts */
    int clean_text, chinese, strip_accents, lowercase; /* BertNormalizer (-1 = follow lower) */
    int cleanup;                     /* WordPiece decoder */
    int32_t *tmpl;                   /* TemplateProcessing single: ids, -1 = the sequence */
    int n_tmpl;
    struct tok_piece *pair;          /* [n_pair] the pair form (TemplateProcessing "pair",
                                      * Bert's, Roberta's); NULL when the file gives none */
    int n_pair;
};

/* One piece of a pair form: a special token (id >= 0) or a text (TOK_PAIR_A, TOK_PAIR_B),
 * with the type id its tokens get (the token_type_ids). */
enum { TOK_PAIR_A = -1, TOK_PAIR_B = -2 };
struct tok_piece {
    int32_t id;
    int32_t type_id;
};

void tok_step_free(struct tok_step *s); /* frees contents, not s itself */

/* ---- the tokenizer --------------------------------------------------------------------- */

enum tok_model { TOK_MODEL_BPE = 1, TOK_MODEL_WORDPIECE = 2, TOK_MODEL_UNIGRAM = 3,
                 TOK_MODEL_WORDLEVEL = 4 };

enum { TOK_ATTR_ADDED = 1, TOK_ATTR_SPECIAL = 2, TOK_ATTR_BYTE = 4 };

struct tok_added {
    int32_t id;
    char *content;  /* as written in the file */
    size_t len;
    char *norm;     /* normalized content (normalized tokens), else == content */
    size_t norm_len;
    int special, lstrip, rstrip, normalized, single_word;
};

#define TOK_MAX_EOS 8

struct kwk_tokenizer {
    int model;              /* enum tok_model */
    int32_t n_vocab;        /* max id + 1 over model and added tokens */
    char **pieces;          /* [n_vocab] piece text (NUL-terminated) or NULL for holes */
    uint32_t *piece_lens;   /* [n_vocab] */
    uint8_t *attr;          /* [n_vocab] TOK_ATTR_* */
    struct tok_map vocab;   /* model piece -> id */
    struct tok_map added_map; /* added content -> id */

    /* BPE */
    struct tok_pairmap merges;
    int byte_level;         /* a ByteLevel pre-tokenizer: the model sees raw bytes */
    struct tok_map vocab_raw; /* byte-level: raw bytes of each piece -> id */
    char **raw;             /* [n_vocab] raw bytes of byte-level pieces (owned) */
    int32_t byte_ids[256];  /* byte-level: id of each byte's character */
    int32_t fallback_ids[256]; /* byte_fallback: id of <0xXX>, -1 if missing */
    int byte_fallback, fuse_unk, ignore_merges;
    int split_at_metaspace; /* no piece has "▁" after another character: words may be cut
                             * before each such "▁" without changing the result */
    int32_t unk_id;         /* model unk token or -1 */
    char *cont_prefix;      /* continuing_subword_prefix (BPE, WordPiece) */
    size_t cont_prefix_len;
    char *end_suffix;
    size_t end_suffix_len;
    /* WordPiece */
    int max_chars_per_word;
    /* Unigram */
    double *scores;         /* [n_vocab] */
    double min_score;
    size_t max_piece_len;

    struct tok_step normalizer, pretok, decoder, post;
    /* How kwk_tokenizer_encode_pair joins two texts: set by the GGUF and legacy loaders, else
     * resolved from post by tok_pair_resolve; NULL when there is none. */
    struct tok_piece *pair;  /* [n_pair] */
    int n_pair;

    struct tok_added *added; /* sorted by first byte, then longest first */
    int n_added;
    int has_normalized_added;
    int32_t added_first[257]; /* added[added_first[b]..added_first[b+1]) start with byte b */
    int32_t added_norm_first[257]; /* the same over the normalized contents */
    int32_t *added_norm_order;     /* [n_added] indices sorted by normalized content */

    struct tok_arena_block *arena; /* piece strings */
    struct tok_gcache *gcache;     /* BPE words shared by all callers (locked shards) */

    /* special tokens and metadata */
    int32_t bos_id, pad_id, eos_ids[TOK_MAX_EOS];
    int n_eos;
    char *bos_token, *eos_token;
    char *chat_template;
    char *source;           /* what was loaded */
};

/* Strings that live as long as the tokenizer. */
struct tok_arena_block {
    struct tok_arena_block *next;
    size_t used, cap;
    char data[];
};
char *tok_arena_dup(struct kwk_tokenizer *t, const char *s, size_t n);

/* tok_bpe.c: the shared word cache (a direct-mapped table under sharded mutexes). */
int tok_gcache_new(struct kwk_tokenizer *t);
void tok_gcache_free(struct kwk_tokenizer *t);

/* tok_json.c: fill t from a parsed tokenizer.json text. */
int tok_load_json_text(struct kwk_tokenizer *t, const char *text, size_t len, const char *label,
                       struct kwk_err *err);
/* tok_legacy.c: vocab.json + merges.txt (byte-level BPE) or vocab.txt (WordPiece). */
int tok_load_legacy(struct kwk_tokenizer *t, const char *dir, struct kwk_err *err);
/* tok_gguf.c: tokenizer.ggml.* from a GGUF file. */
int tok_load_gguf(struct kwk_tokenizer *t, const char *path, struct kwk_err *err);
/* tok_config.c: tokenizer_config.json, special_tokens_map.json, generation_config.json,
 * chat_template.jinja beside the tokenizer. */
int tok_load_configs(struct kwk_tokenizer *t, const char *dir, struct kwk_err *err);
/* One of those files (any name in dir), parsed with numbers as reals; NULL when absent, and when
 * unreadable, past TOK_CONFIG_MAX or not JSON (reported as a warning: none is needed to
 * tokenize). A json_t * as void * so that this header needs no jansson. */
void *tok_read_config_json(const char *dir, const char *name);
#define TOK_CONFIG_MAX ((size_t)64 << 20)

/* tok_pair.c: t->pair from t->post as Hugging Face joins a pair (no token-adding step: a then
 * b, type ids 0 then 1; one step: its pair form; more: none). Kept when a loader set it.
 * 0 or -ENOMEM. */
int tok_pair_resolve(struct kwk_tokenizer *t);
/* Set t->pair to a copy of p[n]. 0 or -ENOMEM. */
int tok_pair_set(struct kwk_tokenizer *t, const struct tok_piece *p, int n);

/* tokenizer.c: shared load steps. */
/* Token ids a tokenizer may hold: [0, TOK_MAX_VOCAB). The largest real vocabularies are about
 * a million tokens (Gemma's 262144, XLM-V's 901629); 16.7M bounds what a small hostile file can
 * make a load allocate (tok_vocab_alloc's arrays take 13 bytes an id) with room to spare. */
#define TOK_MAX_VOCAB (1 << 24)
int tok_vocab_alloc(struct kwk_tokenizer *t, int32_t n, struct kwk_err *err);
int tok_set_piece(struct kwk_tokenizer *t, int32_t id, const char *s, size_t n);
int tok_finish(struct kwk_tokenizer *t, struct kwk_err *err); /* derived tables */
int tok_add_merge(struct kwk_tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                  int32_t rank);
int tok_compile_regex(pcre2_code **re, const char *pat, size_t n, struct kwk_err *err);
int32_t tok_piece_id(const struct kwk_tokenizer *t, const char *s, size_t n);

/* Per-call scratch. */
struct tok_cache_slot {
    uint64_t hash;
    uint32_t key_off, key_len;
    uint32_t ids_off, n_ids;
    int used;
};
struct tok_scratch {
    struct tok_buf norm, a, b;      /* normalized text and pre-token buffers */
    struct tok_ids spans_a, spans_b; /* pre-token spans as (off, len) pairs */
    struct tok_ids syms;            /* BPE work */
    struct tok_ids tmp;
    struct tok_cache_slot *cache;   /* word cache for this call */
    size_t cache_mask, cache_n;
    struct tok_buf cache_keys;
    struct tok_ids cache_ids;
};
void tok_scratch_free(struct tok_scratch *s);

/* tok_precompiled.c: SentencePiece charsmaps (decoded into st->content). */
int tok_precompiled_init(struct tok_step *st, const char *b64, size_t n, struct kwk_err *err);
/* The same from the charsmap's bytes (a GGUF's tokenizer.ggml.precompiled_charsmap); copied. */
int tok_precompiled_init_raw(struct tok_step *st, const void *p, size_t n, struct kwk_err *err);
void tok_precompiled_apply(const struct tok_step *st, const char *s, size_t n,
                           struct tok_buf *out);

/* tok_normalize.c: apply the normalizer to text[0..n) into out (cleared first). */
int tok_normalize(const struct kwk_tokenizer *t, const struct tok_step *st, const char *text,
                  size_t n, struct tok_buf *out);
#define TOK_NO_ORIGIN INT32_MIN
/* tok_pretok.c: split text into pieces: buf holds bytes, spans (off, len, origin) triples with
 * origin the piece's offset in text (TOK_NO_ORIGIN when a step rewrote it). first says
 * whether this text segment starts the input (Metaspace prepend_scheme "first"). */
int tok_pretokenize(const struct kwk_tokenizer *t, struct tok_scratch *s, const char *text,
                    size_t n, int first, struct tok_buf **buf, struct tok_ids **spans);
/* tok_bpe.c / tok_wordpiece.c / tok_unigram.c: one pre-token to ids. */
int tok_bpe_word(const struct kwk_tokenizer *t, struct tok_scratch *s, const char *w, size_t n,
                 struct tok_ids *out);
int tok_wordpiece_word(const struct kwk_tokenizer *t, const char *w, size_t n,
                       struct tok_ids *out);
int tok_unigram_word(const struct kwk_tokenizer *t, const char *w, size_t n,
                     struct tok_ids *out);
/* tok_decode.c: ids to text following the decoder. */
int tok_decode_ids(const struct kwk_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                   struct tok_buf *out);
/* The same, but the special tokens among keep[n_keep] are decoded even with skip_special (a
 * detokenizer's preserved tokens): as if the other special ones were removed and the rest
 * decoded with skip_special 0. */
int tok_decode_keep(const struct kwk_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                    const int32_t *keep, size_t n_keep, struct tok_buf *out);

#endif
