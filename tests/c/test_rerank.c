/* test_rerank.c - kwker serve's /v1/rerank bodies and replies (tools/kwker/serve/rerank.c,
 * included whole with openai.c and toolcall.c as the fuzz target does: the server lives in the
 * CLI): each document form, the 400s with the field and document they name, the limits, packing
 * pairs at a length limit, the activations, and the reply's order (ties by index, NaN last),
 * top_n and return_documents. The server with a real reranker is
 * tests/python/test_rerank_server.py. */
#include "test.h"

#include "../../tools/kwker/serve/openai.c"
#include "../../tools/kwker/serve/rerank.c"
#include "../../tools/kwker/serve/toolcall.c"
#include "fake_tokenizer.h"

static int parse(const char *body, struct srv_rerank_req *r, struct srv_err *e)
{
    return srv_rerank_parse(r, body, strlen(body), e);
}

static void test_forms(void)
{
    struct srv_rerank_req r;
    struct srv_err e;
    T_EQ(
        parse("{\"query\":\"q\",\"documents\":[\"ab\",{\"text\":\"\",\"title\":1},\"c\"]}", &r, &e),
        0);
    T_TRUE(r.model == NULL);
    T_EQ(r.n_docs, 3);
    T_EQ(r.top_n, 3);
    T_EQ(r.return_documents, 1);
    T_STREQ(r.docs[0].text, "ab");
    T_EQ(r.docs[1].len, 0);
    T_EQ(srv_rerank_pack(&r, fake_pair, NULL, 512, &e), 0);
    T_EQ(r.offs[1], 6); /* [101] q [102] a b [102] */
    T_EQ(r.offs[3], 6 + 4 + 5);
    T_EQ(r.ids[3], 'a');
    T_EQ(r.types[3], 1);
    T_EQ(r.types[2], 0);
    srv_rerank_req_free(&r);

    T_EQ(parse("{\"model\":\"m\",\"query\":\"\",\"documents\":[\"a\",\"b\"],\"top_n\":1,"
               "\"return_documents\":false}",
               &r, &e),
         0);
    T_STREQ(r.model, "m");
    T_EQ(r.query_len, 0);
    T_EQ(r.top_n, 1);
    T_EQ(r.return_documents, 0);
    srv_rerank_req_free(&r);

    /* top_n: 0 and null are all (vLLM's 0), past the documents all */
    const char *all[] = {"0", "null", "7"};
    for (int i = 0; i < 3; i++) {
        char body[96];
        snprintf(body, sizeof body, "{\"query\":\"q\",\"documents\":[\"a\",\"b\"],\"top_n\":%s}",
                 all[i]);
        T_EQ(parse(body, &r, &e), 0);
        T_EQ(r.top_n, 2);
        srv_rerank_req_free(&r);
    }

    /* pairs longer than the limit are cut, the longer text first */
    T_EQ(parse("{\"query\":\"qqqqqq\",\"documents\":[\"dddddddddd\",\"d\"]}", &r, &e), 0);
    T_EQ(srv_rerank_pack(&r, fake_pair, NULL, 9, &e), 0);
    T_EQ(r.offs[1], 9);
    T_EQ(r.offs[2], 9 + 9);
    T_EQ(r.ids[3], 'q'); /* the document cut to the query's length, then both in turn */
    T_EQ(r.ids[4], 102);
    T_EQ(r.types[5], 1);
    srv_rerank_req_free(&r);
}

static void expect_400(const char *body, const char *param, const char *msg)
{
    struct srv_rerank_req r;
    struct srv_err e = {0};
    T_EQ(parse(body, &r, &e), -1);
    T_EQ(e.http, 400);
    T_TRUE(param ? e.param && !strcmp(e.param, param) : e.param == NULL);
    T_CONTAINS(e.msg, msg);
    T_TRUE(r.docs == NULL && r.query == NULL); /* freed */
}

static void test_errors(void)
{
    expect_400("{\"documents\":[\"a\"]}", "query", "'query' is required");
    expect_400("{\"query\":[],\"documents\":[\"a\"]}", "query", "'query' must be a string");
    expect_400("{\"query\":\"q\"}", "documents", "'documents' is required");
    expect_400("{\"query\":\"q\",\"documents\":{}}", "documents", "must be a list of strings");
    expect_400("{\"query\":\"q\",\"documents\":[]}", "documents", "'documents' is an empty list");
    expect_400("{\"query\":\"q\",\"documents\":[\"a\",true]}", "documents",
               "'documents[1]' is not a string");
    expect_400("{\"query\":\"q\",\"documents\":[{\"txt\":\"a\"}]}", "documents",
               "'documents[0].text' must be a string");
    expect_400("{\"query\":\"q\",\"documents\":[\"a\"],\"top_n\":-3}", "top_n",
               "'top_n' must be at least 1");
    expect_400("{\"query\":\"q\",\"documents\":[\"a\"],\"top_n\":2.0}", "top_n",
               "'top_n' must be an integer");
    expect_400("{\"query\":\"q\",\"documents\":[\"a\"],\"return_documents\":1}", "return_documents",
               "must be a boolean");
    expect_400("{\"query\":\"q\",\"documents\":[\"a\"],\"model\":null,\"model\":1}", NULL,
               "could not parse");
    expect_400("{\"query\":\"q\",\"documents\":[\"a\"],\"model\":1}", "model",
               "'model' must be a string");
    expect_400("[\"q\"]", NULL, "the body must be a JSON object");
    expect_400("{\"query\":", NULL, "could not parse");
}

static void test_limits(void)
{
    struct srv_rerank_req r;
    struct srv_err e;
    struct srv_buf b = {0};
    srv_buf_str(&b, "{\"query\":\"q\",\"documents\":[");
    for (int i = 0; i < SRV_RERANK_MAX_DOCS; i++)
        srv_buf_str(&b, i ? ",\"d\"" : "\"d\"");
    srv_buf_str(&b, "]}");
    T_EQ(srv_rerank_parse(&r, b.p, b.len, &e), 0);
    T_EQ(r.n_docs, SRV_RERANK_MAX_DOCS);
    srv_rerank_req_free(&r);
    b.len -= 2;
    srv_buf_str(&b, ",\"d\"]}");
    T_EQ(srv_rerank_parse(&r, b.p, b.len, &e), -1);
    T_CONTAINS(e.msg, "at most 1000 documents; it has 1001");
    srv_buf_free(&b);

    /* the query counts once per document: 100 documents of a 100 KiB query pass 8 MiB */
    size_t qn = 100 << 10;
    srv_buf_str(&b, "{\"query\":\"");
    for (size_t i = 0; i < qn; i++)
        srv_buf_add(&b, "q", 1);
    srv_buf_str(&b, "\",\"documents\":[");
    for (int i = 0; i < 100; i++)
        srv_buf_str(&b, i ? ",\"d\"" : "\"d\"");
    srv_buf_str(&b, "]}");
    T_EQ(srv_rerank_parse(&r, b.p, b.len, &e), -1);
    T_EQ(e.http, 400);
    T_CONTAINS(e.msg, "more than 8388608 bytes to tokenize");
    srv_buf_free(&b);
}

static json_t *reply(const struct srv_rerank_req *r, const float *s, const char *id)
{
    struct srv_buf b = {0};
    srv_rerank_response(&b, id, "m\"odel", r, s);
    json_t *j = b.err ? NULL : json_loadb(b.p, b.len, 0, NULL);
    T_TRUE(j != NULL);
    srv_buf_free(&b);
    return j;
}

static int result_index(json_t *j, size_t k)
{
    return (int)json_integer_value(
        json_object_get(json_array_get(json_object_get(j, "results"), k), "index"));
}

static void test_reply(void)
{
    struct srv_rerank_req r;
    struct srv_err e;
    const char *docs[] = {"zero", "one", "two", "th\xffree", "four", "five"};
    size_t lens[] = {4, 3, 3, 6, 4, 4};
    float s[] = {0.25f, NAN, 0.75f, 0.25f, 0.75f, -1.0f};
    T_EQ(srv_rerank_init(&r, "q", 1, docs, lens, 6, 0), 0);
    T_EQ(srv_rerank_pack(&r, fake_pair, NULL, 64, &e), 0);
    json_t *j = reply(&r, s, "rerank-1");
    /* by score, ties by index, NaN last (null) */
    int want[] = {2, 4, 0, 3, 5, 1};
    for (int k = 0; k < 6; k++)
        T_EQ(result_index(j, (size_t)k), want[k]);
    json_t *res = json_object_get(j, "results");
    T_TRUE(json_is_null(json_object_get(json_array_get(res, 5), "relevance_score")));
    T_EQ(json_real_value(json_object_get(json_array_get(res, 0), "relevance_score")), 0.75);
    T_STREQ(json_string_value(
                json_object_get(json_object_get(json_array_get(res, 3), "document"), "text")),
            "th\xef\xbf\xbdree"); /* bytes that are not UTF-8 become U+FFFD */
    T_STREQ(json_string_value(json_object_get(j, "id")), "rerank-1");
    T_STREQ(json_string_value(json_object_get(j, "model")), "m\"odel");
    T_STREQ(json_string_value(json_object_get(j, "object")), "list");
    json_t *u = json_object_get(j, "usage");
    T_EQ(json_integer_value(json_object_get(u, "prompt_tokens")), r.offs[6]);
    T_EQ(json_integer_value(json_object_get(u, "total_tokens")), r.offs[6]);
    json_decref(j);

    r.top_n = 2;
    r.return_documents = 0;
    j = reply(&r, s, NULL);
    res = json_object_get(j, "results");
    T_EQ(json_array_size(res), 2);
    T_EQ(json_object_size(json_array_get(res, 1)), 2); /* index and relevance_score */
    T_TRUE(json_object_get(j, "id") == NULL);
    json_decref(j);
    srv_rerank_req_free(&r);

    /* sigmoid, each logit alone; identity leaves them */
    float l[] = {0.0f, 2.0f, -30.0f, 100.0f};
    srv_rerank_scores(l, 4, KWK_SCORE_SIGMOID);
    T_EQ(l[0], 0.5f);
    T_NEAR(l[1], 0.880797078, 1e-7);
    T_NEAR(l[2] / 9.35762297e-14f, 1.0, 1e-6);
    T_EQ(l[3], 1.0f);
    float id[] = {-3.5f};
    srv_rerank_scores(id, 1, KWK_SCORE_IDENTITY);
    T_EQ(id[0], -3.5f);
}

/* A pair form that adds no tokens (no post-processor) joins an empty query and document into
 * nothing: a 400 naming the document, not the 500 of a tokenizer failure. */
static int bare_pair(void *user, const char *a, size_t na, const char *b, size_t nb, int32_t *ids,
                     int32_t *types, size_t cap, size_t *n)
{
    (void)user;
    (void)cap;
    size_t k = 0;
    for (size_t i = 0; i < na; i++)
        ids[k] = (unsigned char)a[i], types[k++] = 0;
    for (size_t i = 0; i < nb; i++)
        ids[k] = (unsigned char)b[i], types[k++] = 1;
    *n = k;
    return 0;
}

static void test_empty_pair(void)
{
    struct srv_rerank_req r;
    struct srv_err e;
    const char *docs[] = {"ab", ""};
    size_t lens[] = {2, 0};
    T_EQ(srv_rerank_init(&r, "", 0, docs, lens, 2, 0), 0);
    T_EQ(srv_rerank_pack(&r, bare_pair, NULL, 64, &e), -1);
    T_EQ(e.http, 400);
    T_TRUE(strstr(e.msg, "document 1") != NULL);
    srv_rerank_req_free(&r);
}

int main(void)
{
    test_empty_pair();
    test_forms();
    test_errors();
    test_limits();
    test_reply();
    return t_report("test_rerank");
}
