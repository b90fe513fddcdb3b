/* test_score.c - kwker serve's vLLM /score and /classify bodies, token ids and replies
 * (tools/kwker/serve/score.c, included whole with openai.c, embed.c and rerank.c as the fuzz
 * target does: the server lives in the CLI): the sides' names and shapes, truncate_prompt_tokens,
 * the 400s with the field and text they name, each distinct text packed once, cosines, the
 * activations and labels of /classify (config.json read as untrusted), the replies' exact JSON,
 * and Hugging Face's truncation of one text (ids from the tokenizers library). The server with
 * real models is tests/python/test_score_server.py. */
#include "test.h"

#include "../../tools/kwker/serve/openai.c"
#include "../../tools/kwker/serve/think.c"
#include "../../tools/kwker/serve/toolcall.c"
#include "../../tools/kwker/serve/toolcall_reply.c"
#include "../../tools/kwker/serve/embed.c"
#include "../../tools/kwker/serve/rerank.c"
#include "../../tools/kwker/serve/score.c"
#include "fake_tokenizer.h"

/* fake_encode truncated as Hugging Face truncates: [101] the first cap - 2 bytes [102]. */
static int fake_trunc(void *user, const char *text, size_t len, int32_t *ids, size_t cap,
                      size_t *n)
{
    if (cap < 2) {
        *n = len + 2;
        return KWK_ELIMIT;
    }
    return fake_encode(user, text, len + 2 > cap ? cap - 2 : len, ids, cap, n);
}

static int score(const char *body, struct srv_score_req *r, struct srv_err *e)
{
    return srv_score_parse(r, body, strlen(body), e);
}

static void test_score_forms(void)
{
    struct srv_score_req r;
    struct srv_err e;
    T_EQ(score("{\"text_1\":\"q\",\"text_2\":[\"ab\",\"\",\"c\"],\"model\":\"m\"}", &r, &e), 0);
    T_EQ(r.n_a, 1);
    T_EQ(r.n_b, 3);
    T_STREQ(r.name_a, "text_1");
    T_STREQ(r.model, "m");
    T_EQ(r.truncate, SRV_TRUNC_NONE);
    T_EQ(r.use_activation, 1);
    srv_score_req_free(&r);
    /* vLLM's order: queries / documents first, even beside text_1 / text_2 */
    T_EQ(score("{\"text_1\":\"x\",\"text_2\":\"y\",\"queries\":[\"a\",\"b\"],\"documents\":"
               "[\"c\",\"d\"],\"truncate_prompt_tokens\":-1,\"use_activation\":false}",
               &r, &e),
         0);
    T_STREQ(r.name_b, "documents");
    T_EQ(r.n_a, 2);
    T_EQ(r.truncate, -1);
    T_EQ(r.use_activation, 0);
    srv_score_req_free(&r);
    T_EQ(score("{\"queries\":\"a\",\"items\":\"b\",\"encoding_format\":\"float\"}", &r, &e), 0);
    T_STREQ(r.name_b, "items");
    srv_score_req_free(&r);
    T_EQ(score("{\"data_1\":[\"a\"],\"data_2\":[\"b\",\"c\"]}", &r, &e), 0);
    T_STREQ(r.name_a, "data_1");
    srv_score_req_free(&r);
}

static void expect_score_400(const char *body, const char *param, const char *msg)
{
    struct srv_score_req r;
    struct srv_err e;
    T_EQ(score(body, &r, &e), -1);
    T_EQ(e.http, 400);
    T_STREQ(e.param ? e.param : "(null)", param);
    T_CONTAINS(e.msg, msg);
    T_TRUE(r.a == NULL && r.model == NULL); /* freed */
}

static void test_score_errors(void)
{
    expect_score_400("{\"text_1\":\"q\"}", "text_2", "'text_2' is required");
    expect_score_400("{\"documents\":[\"a\"],\"query\":\"q\"}", "queries",
                     "'queries' is required (with 'documents')");
    expect_score_400("{\"text_1\":[\"a\",\"b\"],\"text_2\":[\"c\"]}", "text_2",
                     "'text_1' has 2 texts and 'text_2' 1");
    expect_score_400("{\"text_1\":\"q\",\"text_2\":[\"a\",null]}", "text_2",
                     "'text_2[1]' is not a string");
    expect_score_400("{\"text_1\":\"q\",\"text_2\":\"a\",\"truncate_prompt_tokens\":0}",
                     "truncate_prompt_tokens", "it is 0");
    expect_score_400("{\"text_1\":\"q\",\"text_2\":\"a\",\"truncate_prompt_tokens\":"
                     "9999999999}", "truncate_prompt_tokens", "it is 9999999999");
    expect_score_400("{\"text_1\":\"q\",\"text_2\":\"a\",\"encoding_format\":\"base64\"}",
                     "encoding_format", "must be 'float'");
    expect_score_400("{\"text_1\":\"q\",\"text_2\":\"a\"", "(null)", "could not parse");
    /* 1000 texts a side: one more is refused before any is copied */
    struct srv_buf b = {0};
    srv_buf_str(&b, "{\"text_1\":\"q\",\"text_2\":[");
    for (int i = 0; i <= SRV_SCORE_MAX_TEXTS; i++)
        srv_buf_str(&b, i ? ",\"d\"" : "\"d\"");
    srv_buf_str(&b, "]}");
    struct srv_score_req r;
    struct srv_err e;
    T_EQ(srv_score_parse(&r, b.p, b.len, &e), -1);
    T_CONTAINS(e.msg, "at most 1000 texts; it has 1001");
    srv_buf_free(&b);
}

static void test_trunc(void)
{
    struct srv_trunc t;
    struct srv_err e;
    T_EQ(srv_trunc_resolve(SRV_TRUNC_NONE, 128, &t, &e), 0);
    T_EQ(t.limit, 128);
    T_EQ(t.strict, 1);
    T_EQ(srv_trunc_resolve(-1, 128, &t, &e), 0);
    T_EQ(t.limit, 128);
    T_EQ(t.strict, 0);
    T_EQ(srv_trunc_resolve(5, 128, &t, &e), 0);
    T_EQ(t.limit, 5);
    T_EQ(t.strict, 0);
    T_EQ(srv_trunc_resolve(129, 128, &t, &e), -1);
    T_STREQ(e.param, "truncate_prompt_tokens");
}

static void test_pack_pairs(void)
{
    struct srv_score_req r;
    struct srv_err e;
    struct srv_trunc t = {.limit = 8, .strict = 1};
    T_EQ(score("{\"text_1\":[\"ab\",\"c\"],\"text_2\":[\"x\",\"yyyyy\"]}", &r, &e), 0);
    /* pairwise: pair 1 is (c, yyyyy): 9 tokens, over a strict 8 */
    T_EQ(srv_score_pack_pairs(&r, fake_pair, NULL, &t, &e), -1);
    T_EQ(e.http, 400);
    T_STREQ(e.code, "context_length_exceeded");
    T_CONTAINS(e.msg, "pair 1 holds more");
    srv_score_req_free(&r);
    T_EQ(score("{\"text_1\":[\"ab\",\"c\"],\"text_2\":[\"x\",\"yyyyy\"]}", &r, &e), 0);
    t.strict = 0; /* truncated longest_first: yyyyy loses one */
    T_EQ(srv_score_pack_pairs(&r, fake_pair, NULL, &t, &e), 0);
    T_EQ(r.pairs.offs[1], 6);
    T_EQ(r.pairs.offs[2], 6 + 8);
    T_EQ(r.pairs.ids[6 + 1], 'c');
    T_EQ(r.pairs.ids[6 + 3], 'y');
    T_EQ(r.pairs.types[6 + 3], 1);
    srv_score_req_free(&r);
    T_EQ(score("{\"text_1\":\"q\",\"text_2\":\"d\"}", &r, &e), 0);
    t.limit = 2; /* below the pair's three special tokens */
    T_EQ(srv_score_pack_pairs(&r, fake_pair, NULL, &t, &e), -1);
    T_EQ(e.http, 400);
    T_STREQ(e.param, "truncate_prompt_tokens");
    srv_score_req_free(&r);
}

static void test_pack_texts(void)
{
    struct srv_score_req r;
    struct srv_err e;
    struct srv_trunc t = {.limit = 6, .strict = 1};
    T_EQ(score("{\"text_1\":\"ab\",\"text_2\":[\"cd\",\"ab\",\"cd\",\"\"]}", &r, &e), 0);
    T_EQ(srv_score_pack_texts(&r, fake_encode, NULL, &t, &e), 0);
    T_EQ(r.uniq.n_in, 3); /* "", "ab", "cd": each once */
    T_EQ(r.b_of[1], r.a_of[0]);
    T_EQ(r.b_of[0], r.b_of[2]);
    T_TRUE(r.b_of[3] != r.b_of[0] && r.b_of[3] != r.a_of[0]);
    T_EQ(r.uniq.offs[3], 2 + 4 + 4);
    /* cosines of vectors by uniq index: "" [0,0] (zero: 0), "ab" [1,0], "cd" [1,1] */
    float vec[3][2], s[4];
    for (int u = 0; u < 3; u++) {
        const char *txt = r.uniq.in[u].text;
        vec[u][0] = *txt ? 1.0f : 0.0f;
        vec[u][1] = *txt == 'c' ? 1.0f : 0.0f;
    }
    srv_score_cosines(&r, &vec[0][0], 2, s);
    T_NEAR(s[0], 0.70710678f, 1e-7);
    T_EQ(s[1], 1.0f);
    T_NEAR(s[2], 0.70710678f, 1e-7);
    T_EQ(s[3], 0.0f);
    srv_score_req_free(&r);
    /* a text over a strict limit: named as the body has it, its first place */
    T_EQ(score("{\"queries\":[\"a\",\"b\"],\"documents\":[\"c\",\"too long\"]}", &r, &e), 0);
    T_EQ(srv_score_pack_texts(&r, fake_encode, NULL, &t, &e), -1);
    T_STREQ(e.param, "documents");
    T_CONTAINS(e.msg, "'documents[1]' holds more");
    srv_score_req_free(&r);
    /* truncated: to 3, "too long" is [101] t o [102]; to 1, no room for the special tokens */
    struct srv_trunc k = {.limit = 4, .strict = 0};
    T_EQ(score("{\"queries\":[\"a\",\"b\"],\"documents\":[\"c\",\"too long\"]}", &r, &e), 0);
    T_EQ(srv_score_pack_texts(&r, fake_trunc, NULL, &k, &e), 0);
    T_EQ(r.uniq.offs[4], 3 + 3 + 3 + 4);
    srv_score_req_free(&r);
    k.limit = 1;
    T_EQ(score("{\"text_1\":\"a\",\"text_2\":\"b\"}", &r, &e), 0);
    T_EQ(srv_score_pack_texts(&r, fake_trunc, NULL, &k, &e), -1);
    T_STREQ(e.param, "truncate_prompt_tokens");
    T_CONTAINS(e.msg, "too few tokens");
    srv_score_req_free(&r);
}

static void test_score_reply(void)
{
    struct srv_buf b = {0};
    const float s[] = {0.5f, NAN, -1.25f};
    srv_score_response(&b, "score-1", 7, "m\"x", s, 3, 12);
    T_STREQ(b.p, "{\"id\":\"score-1\",\"object\":\"list\",\"created\":7,\"model\":\"m\\\"x\","
                 "\"data\":[{\"index\":0,\"object\":\"score\",\"score\":0.5},{\"index\":1,"
                 "\"object\":\"score\",\"score\":null},{\"index\":2,\"object\":\"score\","
                 "\"score\":-1.25}],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":12}}");
    srv_buf_free(&b);
}

static void test_labels(void)
{
    struct srv_labels l;
    const char *ok = "{\"id2label\":{\"1\":\"pos\",\"0\":\"neg\",\"2\":\"caf\\u00e9\"},"
                     "\"problem_type\":\"multi_label_classification\"}";
    T_EQ(srv_labels_parse(&l, ok, strlen(ok), 3), 0);
    T_TRUE(l.names != NULL);
    T_STREQ(l.names[0], "neg");
    T_STREQ(l.names[2], "caf\xc3\xa9");
    T_EQ(l.act, SRV_CLS_SIGMOID);
    srv_labels_free(&l);
    /* not exactly the head's ids, a number, broken JSON: the defaults */
    const char *bad[] = {"{\"id2label\":{\"0\":\"a\",\"1\":\"b\"}}",
                         "{\"id2label\":{\"0\":\"a\",\"1\":\"b\",\"3\":\"c\"}}",
                         "{\"id2label\":{\"0\":\"a\",\"1\":2,\"2\":\"c\"}}",
                         "{\"id2label\":{\"0\":\"a\",\"01x\":\"b\",\"2\":\"c\"}}",
                         "{\"id2label\":[\"a\",\"b\",\"c\"],\"problem_type\":\"regression\"}",
                         "{\"id2label\":{\"0\":\"a\""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        T_EQ(srv_labels_parse(&l, bad[i], strlen(bad[i]), 3), 0);
        T_TRUE(l.names == NULL);
        T_EQ(l.n, 3);
        T_EQ(l.act, i == 4 ? SRV_CLS_IDENTITY : SRV_CLS_AUTO);
        srv_labels_free(&l);
    }
}

static void test_classify_reply(void)
{
    struct srv_labels l = {.n = 2};
    struct srv_buf b = {0};
    /* softmax of (0, ln 3): 0.25, 0.75; a NaN logit makes its row's probs all NaN (null),
     * whose label is the first */
    float logits[] = {0.0f, 1.09861229f, NAN, -3.0f};
    srv_classify_response(&b, "classify-1", 3, "m", &l, logits, 2, 1, 9);
    T_CONTAINS(b.p, "\"data\":[{\"index\":0,\"label\":\"LABEL_1\",\"probs\":[0.25,0.75],"
                    "\"num_classes\":2},{\"index\":1,\"label\":\"LABEL_0\",\"probs\":[null,null],"
                    "\"num_classes\":2}]");
    T_CONTAINS(b.p, "\"usage\":{\"prompt_tokens\":9,\"total_tokens\":9}}");
    srv_buf_free(&b);
    /* one label: a sigmoid; raw logits when use_activation is 0; identity by problem_type */
    struct srv_labels one = {.n = 1};
    float x[] = {0.0f};
    srv_classify_response(&b, "c", 0, "m", &one, x, 1, 1, 1);
    T_CONTAINS(b.p, "\"label\":\"LABEL_0\",\"probs\":[0.5]");
    srv_buf_free(&b);
    float y[] = {2.0f, -1.0f};
    srv_classify_response(&b, "c", 0, "m", &l, y, 1, 0, 1);
    T_CONTAINS(b.p, "\"label\":\"LABEL_0\",\"probs\":[2,-1]");
    srv_buf_free(&b);
    l.act = SRV_CLS_SIGMOID;
    float z[] = {0.0f, 0.0f, NAN, 0.0f};
    srv_classify_response(&b, "c", 0, "m", &l, z, 2, 1, 1);
    T_CONTAINS(b.p, "\"label\":\"LABEL_0\",\"probs\":[0.5,0.5]"); /* ties: the first */
    T_CONTAINS(b.p, "\"label\":\"LABEL_1\",\"probs\":[null,0.5]"); /* NaN never wins */
    srv_buf_free(&b);
}

static void test_classify_body(void)
{
    struct srv_embed_limits lim = {.n_vocab = 1000, .dim = 4, .max_tokens = 16};
    struct srv_classify_req r;
    struct srv_err e;
    struct srv_trunc t = {.limit = 3, .strict = 0};
    const char *body = "{\"input\":[[5,6,7,8,9],[1]],\"truncate_prompt_tokens\":3}";
    T_EQ(srv_classify_parse(&r, body, strlen(body), &lim, &e), 0);
    T_TRUE(r.in.model == NULL); /* optional, as vLLM's */
    T_EQ(r.truncate, 3);
    T_EQ(srv_classify_pack(&r, fake_encode, NULL, &t, &e), 0);
    T_EQ(r.in.offs[1], 3); /* ids keep their first three */
    T_EQ(r.in.ids[2], 7);
    T_EQ(r.in.offs[2], 4);
    srv_classify_req_free(&r);
    body = "{\"input\":\"abcdefgh\"}";
    t.strict = 1;
    T_EQ(srv_classify_parse(&r, body, strlen(body), &lim, &e), 0);
    T_EQ(srv_classify_pack(&r, fake_encode, NULL, &t, &e), -1);
    T_STREQ(e.code, "context_length_exceeded");
    srv_classify_req_free(&r);
    body = "{\"input\":[\"abc\",\"d\"]}";
    t.limit = 1;
    t.strict = 0;
    T_EQ(srv_classify_parse(&r, body, strlen(body), &lim, &e), 0);
    T_EQ(srv_classify_pack(&r, fake_trunc, NULL, &t, &e), -1);
    T_STREQ(e.param, "truncate_prompt_tokens");
    srv_classify_req_free(&r);
    body = "{\"input\":\"a\",\"use_activation\":1}";
    T_EQ(srv_classify_parse(&r, body, strlen(body), &lim, &e), -1);
    T_STREQ(e.param, "use_activation");
}

/* tokenizers' truncation of a BERT text: [CLS] hello world , fine day [SEP] to 4 and 2. */
static void test_encode_truncated(void)
{
    const char *data = getenv("KWKER_SHARED_DATA");
    char path[1200];
    struct kwk_err err;
    snprintf(path, sizeof path, "%.1000s/tokenizers/bert-uncased/all-MiniLM-L6-v2",
             data && *data ? data : "../shared/data");
    kwk_tokenizer *tok = kwk_tokenizer_load(path, &err);
    T_TRUE(tok != NULL);
    if (!tok)
        return;
    const char *text = "hello world, fine day";
    int32_t ids[8];
    size_t n = 0;
    T_EQ(srv_encode_truncated(tok, text, strlen(text), ids, 8, &n), 0);
    T_EQ(n, 7);
    T_EQ(ids[3], 1010);
    T_EQ(srv_encode_truncated(tok, text, strlen(text), ids, 4, &n), 0);
    T_EQ(n, 4);
    T_EQ(ids[0], 101);
    T_EQ(ids[1], 7592);
    T_EQ(ids[2], 2088);
    T_EQ(ids[3], 102);
    T_EQ(srv_encode_truncated(tok, text, strlen(text), ids, 2, &n), 0);
    T_EQ(n, 2);
    T_EQ(ids[1], 102);
    T_EQ(srv_encode_truncated(tok, text, strlen(text), ids, 1, &n), KWK_ELIMIT);
    kwk_tokenizer_free(tok);
}

int main(void)
{
    test_score_forms();
    test_score_errors();
    test_trunc();
    test_pack_pairs();
    test_pack_texts();
    test_score_reply();
    test_labels();
    test_classify_reply();
    test_classify_body();
    test_encode_truncated();
    return t_report("test_score");
}
