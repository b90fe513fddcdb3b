/* fuzz_tokenizer.c - libFuzzer target over encode, decode, the streaming detokenizer and pair
 * encoding with fixed small tokenizers built in memory. The first input byte picks the tokenizer
 * and options; the rest is text (and, reinterpreted, ids, some out of range; and, split in two,
 * a pair). Inputs are capped at 8 KiB. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kwker.h"

/* Byte-level BPE with a Split regex, Digits, added tokens (lstrip/rstrip/single_word). */
static const char bpe_json[] =
    "{\"added_tokens\": ["
    "{\"id\": 20, \"content\": \"<|end|>\", \"special\": true, \"lstrip\": true, \"rstrip\": true,"
    " \"normalized\": false, \"single_word\": false},"
    "{\"id\": 21, \"content\": \"word\", \"special\": false, \"lstrip\": false, \"rstrip\": false,"
    " \"normalized\": true, \"single_word\": true}],"
    " \"normalizer\": {\"type\": \"NFC\"},"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|"
    "\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},"
    " \"behavior\": \"Isolated\", \"invert\": false},"
    "{\"type\": \"Digits\", \"individual_digits\": true},"
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
    " \"post_processor\": {\"type\": \"ByteLevel\"},"
    " \"decoder\": {\"type\": \"ByteLevel\"},"
    " \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"h\": 0, \"e\": 1,"
    " \"l\": 2, \"o\": 3, \"\\u0120\": 4, \"w\": 5, \"r\": 6, \"d\": 7, \"he\": 8, \"ll\": 9,"
    " \"hell\": 10, \"hello\": 11, \"\\u00c3\": 12, \"\\u00a9\": 13, \"1\": 14, \"2\": 15,"
    " \"\\u010a\": 16, \"\\u00e2\": 17, \"\\u0122\": 18, \"\\u0120h\": 19},"
    " \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\", \"\\u0120 h\"]}}";

/* SentencePiece-style BPE: Prepend/Replace normalizer, byte fallback, SPM decoders. */
static const char spm_json[] =
    "{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true, \"lstrip\": false,"
    " \"rstrip\": false, \"normalized\": false, \"single_word\": false}],"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\","
    " \"prepend\": \"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"},"
    " \"content\": \"\\u2581\"}]},"
    " \"pre_tokenizer\": null,"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\":"
    " {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
    " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\":"
    " {\"String\": \"\\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"},"
    " {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
    " \"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true,"
    " \"fuse_unk\": true, \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"<0x00>\": 2, \"<0xC3>\": 3,"
    " \"<0xA9>\": 4, \"<0xFF>\": 5, \"<0xE2>\": 6, \"\\u2581\": 7, \"a\": 8, \"b\": 9,"
    " \"\\u2581a\": 10, \"ab\": 11, \"\\u2581ab\": 12},"
    " \"merges\": [\"\\u2581 a\", \"a b\", \"\\u2581a b\"]}}";

/* WordPiece with the BERT pipeline. */
static const char wp_json[] =
    "{\"added_tokens\": [{\"id\": 0, \"content\": \"[UNK]\", \"special\": true, \"lstrip\": false,"
    " \"rstrip\": false, \"normalized\": false, \"single_word\": false}],"
    " \"normalizer\": {\"type\": \"BertNormalizer\", \"clean_text\": true,"
    " \"handle_chinese_chars\": true, \"strip_accents\": null, \"lowercase\": true},"
    " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"
    " \"post_processor\": {\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1]},"
    " \"decoder\": {\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true},"
    " \"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"max_input_chars_per_word\": 20,"
    " \"vocab\": {\"[UNK]\": 0, \"[CLS]\": 1, \"[SEP]\": 2, \"he\": 3, \"##llo\": 4, \"hello\": 5,"
    " \".\": 6, \"##s\": 7, \"a\": 8, \"\\u4e2d\": 9}}}";

static kwk_tokenizer *toks[3];

static void init(void)
{
    static const char *const js[3] = {bpe_json, spm_json, wp_json};
    static const size_t lens[3] = {sizeof bpe_json - 1, sizeof spm_json - 1, sizeof wp_json - 1};
    if (toks[0])
        return;
    for (int i = 0; i < 3; i++) {
        struct kwk_err err;
        toks[i] = kwk_tokenizer_load_json(js[i], lens[i], &err);
        if (!toks[i])
            abort(); /* the fixed tokenizers must load: a bug, not input */
    }
}

/* The text split in two at a point its first byte picks, encoded as a pair with a limit of 0
 * (none) to 15 tokens from the option byte: the result holds at most the limit, has as many
 * type ids as ids, and without a limit holds both texts whole. */
static void check_pair(const kwk_tokenizer *t, uint8_t opt, const char *text, size_t len)
{
    size_t cut = len ? (uint8_t)text[0] % (len + 1) : 0, max = opt >> 4;
    int32_t *ids = NULL, *types = NULL, *a = NULL, *b = NULL;
    size_t n = 0, na = 0, nb = 0;
    int rc = kwk_tokenizer_encode_pair(t, text, cut, text + cut, len - cut, max, &ids, &types,
                                       &n);
    if (rc == 0 && max && n > max)
        abort();
    if (rc == 0 && (!ids || !types))
        abort();
    if (rc == 0 && !max && kwk_tokenizer_encode_alloc(t, text, cut, 0, &a, &na) == 0 &&
        kwk_tokenizer_encode_alloc(t, text + cut, len - cut, 0, &b, &nb) == 0 && n < na + nb)
        abort();
    kwk_tokenizer_mem_free(a);
    kwk_tokenizer_mem_free(b);
    kwk_tokenizer_mem_free(ids);
    kwk_tokenizer_mem_free(types);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 8192)
        return 0;
    init();
    kwk_tokenizer *t = toks[data[0] % 3];
    int add = (data[0] >> 2) & 1, skip = (data[0] >> 3) & 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids = NULL;
    size_t n = 0;
    char *out = NULL;
    if (kwk_tokenizer_encode_alloc(t, text, len, add, &ids, &n) == 0) {
        size_t ol = 0;
        if (kwk_tokenizer_decode_alloc(t, ids, n, skip, &out, &ol) != 0)
            ol = 0;
        kwk_tokenizer_mem_free(out);
        out = NULL;
        /* Streaming the same ids must give exactly decode(all ids). */
        kwk_detok *d = kwk_detok_new(t, skip);
        char *acc = malloc(ol + 1);
        size_t al = 0;
        int ok = d && acc;
        for (size_t i = 0; ok && i <= n; i++) {
            const char *p;
            size_t pl;
            int rc = i < n ? kwk_detok_push(d, ids[i], &p, &pl) : kwk_detok_flush(d, &p, &pl);
            if (rc || al + pl > ol) {
                ok = 0;
                break;
            }
            memcpy(acc + al, p, pl);
            al += pl;
        }
        if (ok && kwk_tokenizer_decode_alloc(t, ids, n, skip, &out, &ol) == 0 &&
            (al != ol || memcmp(acc, out, al)))
            abort();
        free(acc);
        kwk_detok_free(d);
        kwk_tokenizer_mem_free(out);
        out = NULL;
    }
    kwk_tokenizer_mem_free(ids);
    /* Offsets, when kept, are ordered spans inside the (repaired) text. */
    uint32_t *offs = NULL;
    ids = NULL;
    if (kwk_tokenizer_encode_offsets(t, text, len, add, &ids, &offs, &n) == 0) {
        for (size_t i = 0; i < n; i++)
            if (offs[2 * i] > offs[2 * i + 1] || offs[2 * i + 1] > 3 * len + 3)
                abort();
    }
    kwk_tokenizer_mem_free(ids);
    kwk_tokenizer_mem_free(offs);
    /* The bytes as ids, some out of range: decode must fail cleanly or succeed. */
    size_t m = len / 2;
    int32_t *raw = malloc((m ? m : 1) * sizeof *raw);
    if (raw) {
        int nv = kwk_tokenizer_n_vocab(t);
        for (size_t i = 0; i < m; i++)
            raw[i] = (int32_t)((uint8_t)text[2 * i] | ((uint8_t)text[2 * i + 1] << 8)) % (nv + 3) - 1;
        if (kwk_tokenizer_decode_alloc(t, raw, m, skip, &out, NULL) == 0)
            kwk_tokenizer_mem_free(out);
        free(raw);
    }
    check_pair(t, data[0], text, len);
    return 0;
}
