/* test_tokenizer.c - the tokenizer in C: a small byte-level BPE built inline (encode, decode,
 * limits, errors, streaming), every truncation of its JSON, failing allocations, and llama.cpp's
 * GGUF vocabulary vectors (inputs and Hugging Face's ids) from the shared test data's
 * llamacpp-vocab: $KWKER_SHARED_DATA, else ../shared/data beside the checkout (ctest runs
 * in it). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kwker.h"
#include "test.h"

/* Byte-level BPE over "hello world": Ġ is the space byte's character. */
static const char tiny_json[] =
    "{\"version\": \"1.0\",\n"
    " \"added_tokens\": [{\"id\": 12, \"content\": \"<|end|>\", \"special\": true,"
    " \"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"single_word\": false}],\n"
    " \"normalizer\": null,\n"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
    " \"use_regex\": true},\n"
    " \"post_processor\": {\"type\": \"TemplateProcessing\","
    " \"single\": [{\"SpecialToken\": {\"id\": \"<|end|>\", \"type_id\": 0}},"
    " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
    " \"special_tokens\": {\"<|end|>\": {\"id\": \"<|end|>\", \"ids\": [12],"
    " \"tokens\": [\"<|end|>\"]}}},\n"
    " \"decoder\": {\"type\": \"ByteLevel\"},\n"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"h\": 0, \"e\": 1, \"l\": 2, \"o\": 3,"
    " \"\\u0120\": 4, \"w\": 5, \"r\": 6, \"d\": 7, \"he\": 8, \"ll\": 9, \"hell\": 10,"
    " \"hello\": 11, \"\\u00c3\": 13, \"\\u00a9\": 14},\n"
    " \"merges\": [\"h e\", \"l l\", \"he ll\", \"hell o\"]}}\n";

static kwk_tokenizer *tiny(void)
{
    struct kwk_err err;
    kwk_tokenizer *t = kwk_tokenizer_load_json(tiny_json, sizeof tiny_json - 1, &err);
    if (!t)
        fprintf(stderr, "tiny: %s\n", err.msg);
    return t;
}

static void test_tiny(void)
{
    kwk_tokenizer *t = tiny();
    T_TRUE(t != NULL);
    if (!t)
        return;
    int32_t ids[16];
    size_t n = 0;
    T_EQ(kwk_tokenizer_encode(t, "hello world", 11, 0, ids, 16, &n), 0);
    /* hello | Ġ w o r l d */
    T_EQ(n, 7);
    T_EQ(ids[0], 11);
    T_EQ(ids[1], 4);
    T_EQ(ids[6], 7);
    T_EQ(kwk_tokenizer_encode(t, "hello<|end|>", 12, 1, ids, 16, &n), 0);
    T_EQ(n, 3);
    T_EQ(ids[0], 12);
    T_EQ(ids[1], 11);
    T_EQ(ids[2], 12);
    /* Too small a buffer: the count needed and KWK_ELIMIT. */
    T_EQ(kwk_tokenizer_encode(t, "hello world", 11, 0, ids, 2, &n), KWK_ELIMIT);
    T_EQ(n, 7);
    char buf[64];
    size_t len = 0;
    int32_t hw[] = {11, 4, 5, 3, 6, 2, 7};
    T_EQ(kwk_tokenizer_decode(t, hw, 7, 0, buf, sizeof buf, &len), 0);
    T_STREQ(buf, "hello world");
    T_EQ(len, 11);
    T_EQ(kwk_tokenizer_decode(t, hw, 7, 0, buf, 5, &len), KWK_ELIMIT);
    T_EQ(len, 11);
    int32_t bad[] = {11, 15};
    T_EQ(kwk_tokenizer_decode(t, bad, 2, 0, buf, sizeof buf, &len), KWK_ERANGE);
    int32_t neg[] = {-1};
    T_EQ(kwk_tokenizer_decode(t, neg, 1, 0, buf, sizeof buf, &len), KWK_ERANGE);
    /* skip_special drops <|end|>. */
    int32_t sp[] = {12, 11};
    T_EQ(kwk_tokenizer_decode(t, sp, 2, 1, buf, sizeof buf, &len), 0);
    T_STREQ(buf, "hello");
    /* "é" is bytes C3 A9: its byte characters are ids 13, 14. Alone, 13 is U+FFFD. */
    int32_t e1[] = {13};
    T_EQ(kwk_tokenizer_decode(t, e1, 1, 0, buf, sizeof buf, &len), 0);
    T_STREQ(buf, "\xEF\xBF\xBD");
    /* Invalid UTF-8 in: replaced by U+FFFD (EF BF BD), whose bytes are not in this vocab. */
    T_EQ(kwk_tokenizer_encode(t, "h\xff", 2, 0, ids, 16, &n), 0);
    T_EQ(n, 1);
    /* Offsets: byte spans of each id. */
    int32_t *oid = NULL;
    uint32_t *offs = NULL;
    T_EQ(kwk_tokenizer_encode_offsets(t, "hello world", 11, 1, &oid, &offs, &n), 0);
    T_EQ(n, 8);
    T_EQ(offs[0], 0); /* the post-processor's <|end|> */
    T_EQ(offs[1], 0);
    T_EQ(offs[2], 0); /* hello */
    T_EQ(offs[3], 5);
    T_EQ(offs[4], 5); /* Ġ */
    T_EQ(offs[5], 6);
    T_EQ(offs[14], 10); /* d */
    T_EQ(offs[15], 11);
    kwk_tokenizer_mem_free(oid);
    kwk_tokenizer_mem_free(offs);
    /* Look-ups. */
    T_EQ(kwk_tokenizer_n_vocab(t), 15);
    T_STREQ(kwk_tokenizer_id_to_piece(t, 4, &len), "\xC4\xA0");
    T_TRUE(kwk_tokenizer_id_to_piece(t, 15, &len) == NULL);
    T_EQ(kwk_tokenizer_piece_to_id(t, "hello", 5), 11);
    T_EQ(kwk_tokenizer_piece_to_id(t, "<|end|>", 7), 12);
    T_EQ(kwk_tokenizer_piece_to_id(t, "nope", 4), -1);
    T_EQ(kwk_tokenizer_is_special(t, 12), 1);
    T_EQ(kwk_tokenizer_is_special(t, 11), 0);
    /* Streaming: é arrives in two byte tokens; nothing is emitted between them. */
    kwk_detok *d = kwk_detok_new(t, 0);
    const char *piece;
    size_t pl;
    char acc[64] = "";
    int32_t stream[] = {11, 4, 13, 14, 4, 5};
    size_t lens[6];
    for (int i = 0; i < 6; i++) {
        T_EQ(kwk_detok_push(d, stream[i], &piece, &pl), 0);
        lens[i] = pl;
        strncat(acc, piece, pl);
    }
    T_EQ(kwk_detok_flush(d, &piece, &pl), 0);
    strncat(acc, piece, pl);
    T_EQ(lens[2], 0);
    T_EQ(lens[3], 2);
    T_STREQ(acc, "hello \xC3\xA9 w");
    T_EQ(kwk_detok_push(d, 99, &piece, &pl), KWK_ERANGE);
    kwk_detok_free(d);
    kwk_detok_free(NULL);
    kwk_tokenizer_free(t);
    kwk_tokenizer_free(NULL);
}

/* Every prefix of the JSON: an error with a position, or (the full text) a tokenizer. */
static void test_truncations(void)
{
    size_t n = sizeof tiny_json - 1;
    int errors = 0;
    for (size_t k = 0; k < n; k++) {
        char *copy = malloc(k ? k : 1);
        memcpy(copy, tiny_json, k);
        struct kwk_err err;
        kwk_tokenizer *t = kwk_tokenizer_load_json(copy, k, &err);
        if (!t) {
            errors++;
            if (err.code != KWK_EFORMAT || err.pos < 0 || err.pos > (int64_t)k)
                T_CHECK(0, "prefix %zu: code %d pos %lld msg %s", k, err.code,
                        (long long)err.pos, err.msg);
        }
        kwk_tokenizer_free(t);
        free(copy);
    }
    T_EQ(errors, (long long)n - 1); /* all but the text without its final newline */
}

/* Allocation failures anywhere in load/encode/decode: an error code, never a crash. */
static void test_alloc_failures(void)
{
    int loaded = 0;
    for (long k = 1; k < 400; k++) {
        kwk_alloc_fail_after(k);
        struct kwk_err err;
        kwk_tokenizer *t = kwk_tokenizer_load_json(tiny_json, sizeof tiny_json - 1, &err);
        if (t) {
            int32_t *ids = NULL;
            size_t n = 0;
            char *text = NULL;
            if (!kwk_tokenizer_encode_alloc(t, "hello world hello", 17, 1, &ids, &n))
                kwk_tokenizer_decode_alloc(t, ids, n, 0, &text, NULL);
            kwk_tokenizer_mem_free(ids);
            kwk_tokenizer_mem_free(text);
            loaded++;
        }
        kwk_alloc_fail_after(0);
        kwk_tokenizer_free(t);
    }
    T_TRUE(loaded > 0);
}

static char *slurp(const char *path, size_t *n)
{
    char *s = NULL;
    if (kwk_read_file(path, (size_t)1 << 24, &s, n, NULL))
        return NULL;
    return s;
}

/* One GGUF file with .inp/.out: every input gives Hugging Face's ids. */
static int check_vectors(const char *gguf, int *n_cases)
{
    char path[4200];
    size_t ni, no;
    snprintf(path, sizeof path, "%s.inp", gguf);
    char *inp = slurp(path, &ni);
    snprintf(path, sizeof path, "%s.out", gguf);
    char *out = slurp(path, &no);
    int fails = 0;
    struct kwk_err err;
    kwk_tokenizer *t = inp && out ? kwk_tokenizer_load(gguf, &err) : NULL;
    if (!t) {
        fprintf(stderr, "%s: %s\n", gguf, inp && out ? err.msg : "no .inp/.out");
        free(inp);
        free(out);
        return 1;
    }
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = inp, *line = out;
    while (p < inp + ni && line < out + no) {
        char *end = strstr(p, sep);
        if (!end)
            break;
        char *eol = strchr(line, '\n');
        if (!eol)
            eol = out + no;
        *eol = 0;
        int32_t *ids = NULL;
        size_t n = 0;
        int rc = kwk_tokenizer_encode_alloc(t, p, (size_t)(end - p), 0, &ids, &n);
        size_t k = 0;
        int ok = rc == 0;
        for (char *q = line; ok && *q;) {
            char *e;
            long v = strtol(q, &e, 10);
            if (e == q)
                break;
            ok = k < n && ids[k] == v;
            k++;
            q = e;
        }
        ok = ok && k == n;
        if (!ok) {
            fails++;
            fprintf(stderr, "%s: case %d \"%.*s\" differs\n", gguf, *n_cases,
                    (int)KWK_MIN(end - p, 40), p);
        }
        (*n_cases)++;
        kwk_tokenizer_mem_free(ids);
        p = end + strlen(sep);
        line = eol + 1;
    }
    kwk_tokenizer_free(t);
    free(inp);
    free(out);
    return fails;
}

static void test_gguf_vectors(void)
{
    const char *data = getenv("KWKER_SHARED_DATA");
    char dirs[2][1100];
    snprintf(dirs[0], sizeof dirs[0], "%.1000s/llamacpp-vocab",
             data && *data ? data : "../shared/data");
    snprintf(dirs[1], sizeof dirs[1], "%.1000s/side-branches", dirs[0]);
    int files = 0, cases = 0, fails = 0;
    for (size_t di = 0; di < KWK_ARRAY_LEN(dirs); di++) {
        DIR *d = opendir(dirs[di]);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            size_t l = strlen(e->d_name);
            if (l < 5 || strcmp(e->d_name + l - 5, ".gguf"))
                continue;
            char path[2600], inp[2700];
            snprintf(path, sizeof path, "%s/%s", dirs[di], e->d_name);
            snprintf(inp, sizeof inp, "%s.inp", path);
            if (!kwk_file_exists(inp))
                continue;
            files++;
            int before = cases, f = check_vectors(path, &cases);
            fails += f;
            printf("  %s: %d/%d\n", e->d_name, cases - before - f, cases - before);
        }
        closedir(d);
    }
    if (files < 11)
        fprintf(stderr, "%s: %d vocabulary files (set KWKER_SHARED_DATA to the shared data)\n",
                dirs[0], files);
    T_TRUE(files >= 11);
    T_TRUE(cases >= 11 * 43);
    T_EQ(fails, 0);
}

static void test_load_errors(void)
{
    struct kwk_err err;
    T_TRUE(kwk_tokenizer_load("/nonexistent/tokenizer/folder", &err) == NULL);
    T_TRUE(err.msg[0] != 0);
    const char *bad = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0,, \"b\": 1}}}";
    T_TRUE(kwk_tokenizer_load_json(bad, strlen(bad), &err) == NULL);
    T_EQ(err.code, KWK_EFORMAT);
    T_EQ(err.line, 1);
    T_TRUE(err.pos >= 40 && err.pos <= 44);
    const char *rx = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []},"
                     " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"},"
                     " \"behavior\": \"Isolated\"}}";
    T_TRUE(kwk_tokenizer_load_json(rx, strlen(rx), &err) == NULL);
    T_EQ(err.code, KWK_ESYNTAX);

    /* ids: an added id past the limit was once cast to int32 first, wrapped into range and
     * sized a 12 GB table; the vocabulary's own ids have the same limit (2^24) */
    static const char *const big_ids[] = {
        "{\"added_tokens\": [{\"id\": 88888888888880, \"content\": \"x\"}],"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"added_tokens\": [{\"id\": 16777216, \"content\": \"x\"}],"
        " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 16777216}, \"merges\": []}}",
    };
    for (size_t i = 0; i < KWK_ARRAY_LEN(big_ids); i++) {
        T_TRUE(kwk_tokenizer_load_json(big_ids[i], strlen(big_ids[i]), &err) == NULL);
        T_EQ(err.code, KWK_EFORMAT);
        T_CONTAINS(err.msg, "range");
    }
    /* the largest id allowed loads, a sparse vocabulary of two pieces */
    const char *sparse = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 16777215},"
                         " \"merges\": []}}";
    kwk_tokenizer *t = kwk_tokenizer_load_json(sparse, strlen(sparse), &err);
    T_TRUE(t != NULL);
    int32_t ids[4];
    size_t n = 0;
    if (t) {
        T_EQ(kwk_tokenizer_encode(t, "ba", 2, 0, ids, 4, &n), 0);
        T_EQ(n, 2);
        T_EQ(ids[0], 16777215);
        T_EQ(ids[1], 0);
        kwk_tokenizer_free(t);
    }
}

int main(void)
{
    test_tiny();
    test_truncations();
    test_alloc_failures();
    test_load_errors();
    test_gguf_vectors();
    return t_report("test_tokenizer");
}
