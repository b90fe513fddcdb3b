/* test_tokenizer_pair.c - kwk_tokenizer_encode_pair: the pair forms of BertProcessing,
 * RobertaProcessing, TemplateProcessing, a Sequence holding one of them and no post-processor
 * (small WordPiece tokenizers built inline), Hugging Face's longest_first truncation against a
 * table transformers made (tests/golden/make_tokenizer_pair_table.py), the error codes, failing
 * allocations, and llama.cpp's rerank join of GGUF vocabularies from the shared test data
 * ($KWKER_SHARED_DATA, else ../shared/data beside the checkout, as test_tokenizer.c). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kwker.h"
#include "test.h"

/* WordPiece over "a" (3), "b" (4), "hello" (5), "world" (6): one token a word. */
static const char json_head[] =
    "{\"added_tokens\": [{\"id\": 1, \"content\": \"[CLS]\", \"special\": true},"
    " {\"id\": 2, \"content\": \"[SEP]\", \"special\": true}],"
    " \"normalizer\": {\"type\": \"BertNormalizer\", \"lowercase\": true},"
    " \"pre_tokenizer\": {\"type\": \"BertPreTokenizer\"},"
    " \"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"vocab\": {\"[UNK]\": 0,"
    " \"[CLS]\": 1, \"[SEP]\": 2, \"a\": 3, \"b\": 4, \"hello\": 5, \"world\": 6, \"x\": 7}},"
    " \"post_processor\": ";

static const char bert_pp[] =
    "{\"type\": \"BertProcessing\", \"sep\": [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1]}";
static const char roberta_pp[] =
    "{\"type\": \"RobertaProcessing\", \"sep\": [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1],"
    " \"trim_offsets\": true, \"add_prefix_space\": false}";
/* B first, a special of two ids, type ids as written. */
static const char template_pp[] =
    "{\"type\": \"TemplateProcessing\","
    " \"single\": [{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}},"
    " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
    " \"pair\": [{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}},"
    " {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}},"
    " {\"SpecialToken\": {\"id\": \"two\", \"type_id\": 2}},"
    " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
    " {\"SpecialToken\": {\"id\": \"[SEP]\", \"type_id\": 1}}],"
    " \"special_tokens\": {\"[CLS]\": {\"id\": \"[CLS]\", \"ids\": [1], \"tokens\": [\"[CLS]\"]},"
    " \"[SEP]\": {\"id\": \"[SEP]\", \"ids\": [2], \"tokens\": [\"[SEP]\"]},"
    " \"two\": {\"id\": \"two\", \"ids\": [2, 7], \"tokens\": [\"[SEP]\", \"x\"]}}}";
static const char seq_roberta_pp[] =
    "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"},"
    " {\"type\": \"RobertaProcessing\", \"sep\": [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1]}]}";
/* Hugging Face refuses these files; here they load and have no pair form. */
static const char single_only_pp[] =
    "{\"type\": \"TemplateProcessing\","
    " \"single\": [{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}},"
    " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}],"
    " \"special_tokens\": {\"[CLS]\": {\"id\": \"[CLS]\", \"ids\": [1], \"tokens\": [\"[CLS]\"]}}}";
/* tokenizers wraps each part twice here; refused as no pair form. */
static const char two_adders_pp[] =
    "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"BertProcessing\", \"sep\":"
    " [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1]}, {\"type\": \"BertProcessing\", \"sep\":"
    " [\"[SEP]\", 2], \"cls\": [\"[CLS]\", 1]}]}";

static kwk_tokenizer *load_with(const char *post)
{
    char json[4096];
    struct kwk_err err;
    snprintf(json, sizeof json, "%s%s}", json_head, post);
    kwk_tokenizer *t = kwk_tokenizer_load_json(json, strlen(json), &err);
    if (!t)
        fprintf(stderr, "load: %s\n", err.msg);
    T_TRUE(t != NULL);
    return t;
}

/* encode_pair(a, b, max) must give want_ids[n] with want_types[n]. */
static void check_pair(const kwk_tokenizer *t, const char *a, const char *b, size_t max,
                       const int32_t *want_ids, const int32_t *want_types, size_t n_want)
{
    int32_t *ids = NULL, *types = NULL;
    size_t n = 0;
    int rc = kwk_tokenizer_encode_pair(t, a, strlen(a), b, strlen(b), max, &ids, &types, &n);
    T_EQ(rc, 0);
    T_EQ(n, n_want);
    int same = rc == 0 && n == n_want;
    for (size_t i = 0; same && i < n; i++)
        same = ids[i] == want_ids[i] && types[i] == want_types[i];
    T_CHECK(same, "\"%s\" + \"%s\" (max %zu): ids or type ids differ", a, b, max);
    kwk_tokenizer_mem_free(ids);
    kwk_tokenizer_mem_free(types);
}

static void test_forms(void)
{
    kwk_tokenizer *t = load_with(bert_pp);
    if (t) {
        const int32_t ids[] = {1, 3, 3, 2, 4, 4, 4, 2}, types[] = {0, 0, 0, 0, 1, 1, 1, 1};
        check_pair(t, "a a", "B b b", 0, ids, types, 8);
        const int32_t e_ids[] = {1, 2, 4, 2}, e_types[] = {0, 0, 1, 1};
        check_pair(t, "", "b", 0, e_ids, e_types, 4);
        const int32_t ee_ids[] = {1, 2, 2}, ee_types[] = {0, 0, 1};
        check_pair(t, "", "", 0, ee_ids, ee_types, 3);
        /* max_tokens == the specials: both texts emptied, as transformers does */
        check_pair(t, "hello", "world", 3, ee_ids, ee_types, 3);
        kwk_tokenizer_free(t);
    }
    if ((t = load_with(roberta_pp))) {
        const int32_t ids[] = {1, 5, 2, 2, 6, 6, 2}, types[7] = {0};
        check_pair(t, "hello", "world world", 0, ids, types, 7);
        /* 4 specials: a budget of 2 for 1 + 2 tokens, the longer (b) cut */
        const int32_t tr[] = {1, 5, 2, 2, 6, 2};
        check_pair(t, "hello", "world world", 6, tr, types, 6);
        kwk_tokenizer_free(t);
    }
    if ((t = load_with(template_pp))) {
        const int32_t ids[] = {1, 4, 2, 7, 3, 3, 2}, types[] = {0, 1, 2, 2, 0, 0, 1};
        check_pair(t, "a a", "b", 0, ids, types, 7);
        /* 4 specials (two's two ids count): a budget of 2, 1 + 1 */
        const int32_t tr[] = {1, 4, 2, 7, 3, 2}, tr_types[] = {0, 1, 2, 2, 0, 1};
        check_pair(t, "a a", "b b b", 6, tr, tr_types, 6);
        /* single encode unchanged: [CLS] a */
        int32_t one[4];
        size_t n = 0;
        T_EQ(kwk_tokenizer_encode(t, "a", 1, 1, one, 4, &n), 0);
        T_EQ(n, 2);
        T_EQ(one[0], 1);
        kwk_tokenizer_free(t);
    }
    if ((t = load_with(seq_roberta_pp))) {
        const int32_t ids[] = {1, 3, 2, 2, 4, 2}, types[6] = {0};
        check_pair(t, "a", "b", 0, ids, types, 6);
        kwk_tokenizer_free(t);
    }
    if ((t = load_with("null"))) {
        /* no post-processor: a then b, their own type ids; nothing to reserve when cutting */
        const int32_t ids[] = {3, 3, 4}, types[] = {0, 0, 1};
        check_pair(t, "a a", "b", 0, ids, types, 3);
        const int32_t tr[] = {3, 4}, tr_types[] = {0, 1};
        check_pair(t, "a a", "b", 2, tr, tr_types, 2);
        kwk_tokenizer_free(t);
    }
}

/* transformers' kept counts for ["a a ..."], ["b b ..."] (batched) under BERT's pair form. */
static const int trunc_table[][5] = {
    {0, 0, 3, 0, 0},  {0, 0, 4, 0, 0},  {0, 0, 5, 0, 0},  {0, 0, 6, 0, 0},  {0, 0, 7, 0, 0},
    {0, 0, 8, 0, 0},  {0, 0, 10, 0, 0}, {0, 0, 13, 0, 0}, {0, 1, 3, 0, 0},  {0, 1, 4, 0, 1},
    {0, 1, 5, 0, 1},  {0, 1, 6, 0, 1},  {0, 1, 7, 0, 1},  {0, 1, 8, 0, 1},  {0, 1, 10, 0, 1},
    {0, 1, 13, 0, 1}, {0, 2, 3, 0, 0},  {0, 2, 4, 0, 1},  {0, 2, 5, 0, 2},  {0, 2, 6, 0, 2},
    {0, 2, 7, 0, 2},  {0, 2, 8, 0, 2},  {0, 2, 10, 0, 2}, {0, 2, 13, 0, 2}, {0, 5, 3, 0, 0},
    {0, 5, 4, 0, 1},  {0, 5, 5, 0, 2},  {0, 5, 6, 0, 3},  {0, 5, 7, 0, 4},  {0, 5, 8, 0, 5},
    {0, 5, 10, 0, 5}, {0, 5, 13, 0, 5}, {0, 8, 3, 0, 0},  {0, 8, 4, 0, 1},  {0, 8, 5, 0, 2},
    {0, 8, 6, 0, 3},  {0, 8, 7, 0, 4},  {0, 8, 8, 0, 5},  {0, 8, 10, 0, 7}, {0, 8, 13, 0, 8},
    {1, 0, 3, 0, 0},  {1, 0, 4, 1, 0},  {1, 0, 5, 1, 0},  {1, 0, 6, 1, 0},  {1, 0, 7, 1, 0},
    {1, 0, 8, 1, 0},  {1, 0, 10, 1, 0}, {1, 0, 13, 1, 0}, {1, 1, 3, 0, 0},  {1, 1, 4, 0, 1},
    {1, 1, 5, 1, 1},  {1, 1, 6, 1, 1},  {1, 1, 7, 1, 1},  {1, 1, 8, 1, 1},  {1, 1, 10, 1, 1},
    {1, 1, 13, 1, 1}, {1, 2, 3, 0, 0},  {1, 2, 4, 0, 1},  {1, 2, 5, 1, 1},  {1, 2, 6, 1, 2},
    {1, 2, 7, 1, 2},  {1, 2, 8, 1, 2},  {1, 2, 10, 1, 2}, {1, 2, 13, 1, 2}, {1, 5, 3, 0, 0},
    {1, 5, 4, 0, 1},  {1, 5, 5, 1, 1},  {1, 5, 6, 1, 2},  {1, 5, 7, 1, 3},  {1, 5, 8, 1, 4},
    {1, 5, 10, 1, 5}, {1, 5, 13, 1, 5}, {1, 8, 3, 0, 0},  {1, 8, 4, 0, 1},  {1, 8, 5, 1, 1},
    {1, 8, 6, 1, 2},  {1, 8, 7, 1, 3},  {1, 8, 8, 1, 4},  {1, 8, 10, 1, 6}, {1, 8, 13, 1, 8},
    {2, 0, 3, 0, 0},  {2, 0, 4, 1, 0},  {2, 0, 5, 2, 0},  {2, 0, 6, 2, 0},  {2, 0, 7, 2, 0},
    {2, 0, 8, 2, 0},  {2, 0, 10, 2, 0}, {2, 0, 13, 2, 0}, {2, 1, 3, 0, 0},  {2, 1, 4, 1, 0},
    {2, 1, 5, 1, 1},  {2, 1, 6, 2, 1},  {2, 1, 7, 2, 1},  {2, 1, 8, 2, 1},  {2, 1, 10, 2, 1},
    {2, 1, 13, 2, 1}, {2, 2, 3, 0, 0},  {2, 2, 4, 0, 1},  {2, 2, 5, 1, 1},  {2, 2, 6, 1, 2},
    {2, 2, 7, 2, 2},  {2, 2, 8, 2, 2},  {2, 2, 10, 2, 2}, {2, 2, 13, 2, 2}, {2, 5, 3, 0, 0},
    {2, 5, 4, 0, 1},  {2, 5, 5, 1, 1},  {2, 5, 6, 1, 2},  {2, 5, 7, 2, 2},  {2, 5, 8, 2, 3},
    {2, 5, 10, 2, 5}, {2, 5, 13, 2, 5}, {2, 8, 3, 0, 0},  {2, 8, 4, 0, 1},  {2, 8, 5, 1, 1},
    {2, 8, 6, 1, 2},  {2, 8, 7, 2, 2},  {2, 8, 8, 2, 3},  {2, 8, 10, 2, 5}, {2, 8, 13, 2, 8},
    {5, 0, 3, 0, 0},  {5, 0, 4, 1, 0},  {5, 0, 5, 2, 0},  {5, 0, 6, 3, 0},  {5, 0, 7, 4, 0},
    {5, 0, 8, 5, 0},  {5, 0, 10, 5, 0}, {5, 0, 13, 5, 0}, {5, 1, 3, 0, 0},  {5, 1, 4, 1, 0},
    {5, 1, 5, 1, 1},  {5, 1, 6, 2, 1},  {5, 1, 7, 3, 1},  {5, 1, 8, 4, 1},  {5, 1, 10, 5, 1},
    {5, 1, 13, 5, 1}, {5, 2, 3, 0, 0},  {5, 2, 4, 1, 0},  {5, 2, 5, 1, 1},  {5, 2, 6, 2, 1},
    {5, 2, 7, 2, 2},  {5, 2, 8, 3, 2},  {5, 2, 10, 5, 2}, {5, 2, 13, 5, 2}, {5, 5, 3, 0, 0},
    {5, 5, 4, 0, 1},  {5, 5, 5, 1, 1},  {5, 5, 6, 1, 2},  {5, 5, 7, 2, 2},  {5, 5, 8, 2, 3},
    {5, 5, 10, 3, 4}, {5, 5, 13, 5, 5}, {5, 8, 3, 0, 0},  {5, 8, 4, 0, 1},  {5, 8, 5, 1, 1},
    {5, 8, 6, 1, 2},  {5, 8, 7, 2, 2},  {5, 8, 8, 2, 3},  {5, 8, 10, 3, 4}, {5, 8, 13, 5, 5},
    {8, 0, 3, 0, 0},  {8, 0, 4, 1, 0},  {8, 0, 5, 2, 0},  {8, 0, 6, 3, 0},  {8, 0, 7, 4, 0},
    {8, 0, 8, 5, 0},  {8, 0, 10, 7, 0}, {8, 0, 13, 8, 0}, {8, 1, 3, 0, 0},  {8, 1, 4, 1, 0},
    {8, 1, 5, 1, 1},  {8, 1, 6, 2, 1},  {8, 1, 7, 3, 1},  {8, 1, 8, 4, 1},  {8, 1, 10, 6, 1},
    {8, 1, 13, 8, 1}, {8, 2, 3, 0, 0},  {8, 2, 4, 1, 0},  {8, 2, 5, 1, 1},  {8, 2, 6, 2, 1},
    {8, 2, 7, 2, 2},  {8, 2, 8, 3, 2},  {8, 2, 10, 5, 2}, {8, 2, 13, 8, 2}, {8, 5, 3, 0, 0},
    {8, 5, 4, 1, 0},  {8, 5, 5, 1, 1},  {8, 5, 6, 2, 1},  {8, 5, 7, 2, 2},  {8, 5, 8, 3, 2},
    {8, 5, 10, 4, 3}, {8, 5, 13, 5, 5}, {8, 8, 3, 0, 0},  {8, 8, 4, 0, 1},  {8, 8, 5, 1, 1},
    {8, 8, 6, 1, 2},  {8, 8, 7, 2, 2},  {8, 8, 8, 2, 3},  {8, 8, 10, 3, 4}, {8, 8, 13, 5, 5},
};

static void test_truncation_table(void)
{
    kwk_tokenizer *t = load_with(bert_pp);
    if (!t)
        return;
    int bad = 0;
    for (size_t r = 0; r < KWK_ARRAY_LEN(trunc_table); r++) {
        const int *row = trunc_table[r];
        char a[32] = "", b[32] = "";
        for (int i = 0; i < row[0]; i++)
            strcat(a, "a ");
        for (int i = 0; i < row[1]; i++)
            strcat(b, "b ");
        int32_t *ids = NULL, *types = NULL;
        size_t n = 0;
        int rc = kwk_tokenizer_encode_pair(t, a, strlen(a), b, strlen(b), (size_t)row[2], &ids,
                                           &types, &n);
        /* [CLS] a... [SEP] b... [SEP] with the kept counts, type 1 from the first b on */
        int ok = rc == 0 && n == (size_t)(row[3] + row[4] + 3) && ids[0] == 1;
        for (int i = 0; ok && i < row[3]; i++)
            ok = ids[1 + i] == 3 && types[1 + i] == 0;
        ok = ok && ids[1 + row[3]] == 2 && types[1 + row[3]] == 0;
        for (int i = 0; ok && i < row[4]; i++)
            ok = ids[2 + row[3] + i] == 4 && types[2 + row[3] + i] == 1;
        ok = ok && ids[n - 1] == 2 && types[n - 1] == 1;
        if (!ok) {
            bad++;
            fprintf(stderr, "na %d nb %d max %d: rc %d n %zu, want %d + %d\n", row[0], row[1],
                    row[2], rc, n, row[3], row[4]);
        }
        kwk_tokenizer_mem_free(ids);
        kwk_tokenizer_mem_free(types);
    }
    T_EQ(bad, 0);
    kwk_tokenizer_free(t);
}

static void test_errors(void)
{
    kwk_tokenizer *t = load_with(bert_pp);
    int32_t *ids = (int32_t *)&ids, *types = (int32_t *)&types;
    size_t n = 7;
    if (!t)
        return;
    T_EQ(kwk_tokenizer_encode_pair(NULL, "a", 1, "b", 1, 0, &ids, &types, &n), KWK_EARG);
    T_EQ(kwk_tokenizer_encode_pair(t, "a", 1, "b", 1, 0, NULL, &types, &n), KWK_EARG);
    T_EQ(kwk_tokenizer_encode_pair(t, "a", 1, "b", 1, 0, &ids, &types, NULL), KWK_EARG);
    T_EQ(kwk_tokenizer_encode_pair(t, NULL, 1, "b", 1, 0, &ids, &types, &n), KWK_EARG);
    T_EQ(kwk_tokenizer_encode_pair(t, "a", 1, NULL, 1, 0, &ids, &types, &n), KWK_EARG);
    /* fewer tokens than the 3 specials: refused (transformers silently does not truncate) */
    for (size_t max = 1; max < 3; max++) {
        T_EQ(kwk_tokenizer_encode_pair(t, "a", 1, "b", 1, max, &ids, &types, &n), KWK_ELIMIT);
        T_TRUE(ids == NULL && types == NULL && n == 0);
    }
    /* NULL texts of length 0 are empty texts; types may be NULL */
    T_EQ(kwk_tokenizer_encode_pair(t, NULL, 0, NULL, 0, 0, &ids, NULL, &n), 0);
    T_EQ(n, 3);
    kwk_tokenizer_mem_free(ids);
    kwk_tokenizer_free(t);
    const char *none[] = {single_only_pp, two_adders_pp};
    for (size_t i = 0; i < KWK_ARRAY_LEN(none); i++) {
        if (!(t = load_with(none[i])))
            continue;
        T_EQ(kwk_tokenizer_encode_pair(t, "a", 1, "b", 1, 0, &ids, &types, &n), KWK_EUNSUPPORTED);
        T_TRUE(ids == NULL && types == NULL && n == 0);
        kwk_tokenizer_free(t);
    }
}

/* Allocation failures anywhere in load and encode_pair: an error code, never a crash. */
static void test_alloc_failures(void)
{
    char json[4096];
    snprintf(json, sizeof json, "%s%s}", json_head, template_pp);
    int encoded = 0;
    for (long k = 1; k < 300; k++) {
        kwk_alloc_fail_after(k);
        kwk_tokenizer *t = kwk_tokenizer_load_json(json, strlen(json), NULL);
        int32_t *ids = NULL, *types = NULL;
        size_t n = 0;
        if (t &&
            kwk_tokenizer_encode_pair(t, "hello a", 7, "world b", 7, 5, &ids, &types, &n) == 0) {
            encoded++;
            T_EQ(n, 5);
        }
        kwk_alloc_fail_after(0);
        kwk_tokenizer_mem_free(ids);
        kwk_tokenizer_mem_free(types);
        kwk_tokenizer_free(t);
    }
    T_TRUE(encoded > 0);
}

static kwk_tokenizer *load_vocab(const char *name)
{
    const char *data = getenv("KWKER_SHARED_DATA");
    char path[1200];
    struct kwk_err err;
    snprintf(path, sizeof path, "%.1000s/llamacpp-vocab/%s",
             data && *data ? data : "../shared/data", name);
    kwk_tokenizer *t = kwk_tokenizer_load(path, &err);
    if (!t)
        fprintf(stderr, "%s: %s\n", path, err.msg);
    T_TRUE(t != NULL);
    return t;
}

/* llama.cpp's format_rerank: [bos] a [eos] [sep] b [eos] by the add_*_token flags. */
static void test_gguf(void)
{
    /* an older BERT GGUF: cls_token_id and seperator_token_id, no flags: WordPiece's defaults
     * add bos and sep, not eos: [CLS] a [SEP] b */
    kwk_tokenizer *t = load_vocab("ggml-vocab-bert-bge.gguf");
    if (t) {
        const int32_t ids[] = {101, 7592, 102, 2088}, types[] = {0, 0, 0, 1};
        check_pair(t, "hello", "world", 0, ids, types, 4);
        const int32_t tr[] = {101, 7592, 102, 2088}, tr_types[] = {0, 0, 0, 1};
        check_pair(t, "hello hello", "world world", 4, tr, tr_types, 4);
        kwk_tokenizer_free(t);
    }
    /* SentencePiece: add_bos_token true, add_eos_token false, no separator: <s> a b, all
     * of type 0 */
    if ((t = load_vocab("ggml-vocab-llama-spm.gguf"))) {
        int32_t *a = NULL, *b = NULL, *ids = NULL, *types = NULL;
        size_t na = 0, nb = 0, n = 0;
        T_EQ(kwk_tokenizer_encode_alloc(t, "Hello", 5, 0, &a, &na), 0);
        T_EQ(kwk_tokenizer_encode_alloc(t, "world", 5, 0, &b, &nb), 0);
        T_EQ(kwk_tokenizer_encode_pair(t, "Hello", 5, "world", 5, 0, &ids, &types, &n), 0);
        T_EQ(n, 1 + na + nb);
        if (n == 1 + na + nb && na && nb) {
            T_EQ(ids[0], 1);
            T_TRUE(!memcmp(ids + 1, a, na * sizeof *a) && !memcmp(ids + 1 + na, b, nb * sizeof *b));
            /* a vocabulary not BERT's: every type 0, as RoBERTa's and XLM-R's tokenizers */
            T_EQ(types[na], 0);
            T_EQ(types[na + 1], 0);
            T_EQ(types[n - 1], 0);
        }
        kwk_tokenizer_mem_free(a);
        kwk_tokenizer_mem_free(b);
        kwk_tokenizer_mem_free(ids);
        kwk_tokenizer_mem_free(types);
        kwk_tokenizer_free(t);
    }
}

/* A template list that would expand to more than 4096 tokens is refused at load (a small file
 * naming a long special many times would otherwise cost every encode its length); 4096 load. */
static void test_template_bound(void)
{
    for (int n_refs = 4096; n_refs <= 4097; n_refs++) {
        static const char ref[] = "{\"SpecialToken\": {\"id\": \"[CLS]\", \"type_id\": 0}},";
        size_t cap = strlen(json_head) + (size_t)n_refs * (sizeof ref - 1) + 1024;
        char *json = malloc(cap), *p = json;
        T_TRUE(json != NULL);
        if (!json)
            return;
        p += sprintf(p, "%s{\"type\": \"TemplateProcessing\", \"single\": [", json_head);
        p += sprintf(p, "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"pair\": [");
        for (int i = 0; i < n_refs - 2; i++)
            p += sprintf(p, "%s", ref);
        p += sprintf(p, "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}},"
                        "{\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}],"
                        " \"special_tokens\": {\"[CLS]\": {\"id\": \"[CLS]\", \"ids\": [1],"
                        " \"tokens\": [\"[CLS]\"]}}}}");
        struct kwk_err err;
        kwk_tokenizer *t = kwk_tokenizer_load_json(json, strlen(json), &err);
        if (n_refs == 4096) {
            T_TRUE(t != NULL);
            int32_t *ids = NULL, *types = NULL;
            size_t n = 0;
            T_EQ(kwk_tokenizer_encode_pair(t, "a", 1, "b", 1, 0, &ids, &types, &n), 0);
            T_EQ(n, 4096);
            kwk_tokenizer_mem_free(ids);
            kwk_tokenizer_mem_free(types);
        } else {
            T_TRUE(t == NULL);
            T_EQ(err.code, KWK_EFORMAT);
            T_TRUE(strstr(err.msg, "4096") != NULL);
        }
        kwk_tokenizer_free(t);
        free(json);
    }
}

/* kwk_tokenizer_join_pair on the two texts' own ids is encode_pair, truncation included. */
static void test_join(void)
{
    static const char *const forms[] = {bert_pp, roberta_pp, template_pp};
    for (size_t f = 0; f < KWK_ARRAY_LEN(forms); f++) {
        kwk_tokenizer *t = load_with(forms[f]);
        if (!t)
            continue;
        int32_t *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        T_EQ(kwk_tokenizer_encode_alloc(t, "hello a b a", 11, 0, &a, &na), 0);
        T_EQ(kwk_tokenizer_encode_alloc(t, "world x", 7, 0, &b, &nb), 0);
        for (size_t max = 0; max <= 12; max += 1) {
            int32_t *i1 = NULL, *t1 = NULL, *i2 = NULL, *t2 = NULL;
            size_t n1 = 0, n2 = 0;
            int r1 = kwk_tokenizer_encode_pair(t, "hello a b a", 11, "world x", 7, max, &i1, &t1,
                                               &n1);
            int r2 = kwk_tokenizer_join_pair(t, a, na, b, nb, max, &i2, &t2, &n2);
            T_EQ(r1, r2);
            T_EQ(n1, n2);
            T_TRUE(n1 == n2 && (!n1 || (!memcmp(i1, i2, n1 * sizeof *i1) &&
                                        !memcmp(t1, t2, n1 * sizeof *t1))));
            kwk_tokenizer_mem_free(i1);
            kwk_tokenizer_mem_free(t1);
            kwk_tokenizer_mem_free(i2);
            kwk_tokenizer_mem_free(t2);
        }
        kwk_tokenizer_mem_free(a);
        kwk_tokenizer_mem_free(b);
        kwk_tokenizer_free(t);
    }
}

int main(void)
{
    test_join();
    test_template_bound();
    test_forms();
    test_truncation_table();
    test_errors();
    test_alloc_failures();
    test_gguf();
    return t_report("test_tokenizer_pair");
}
