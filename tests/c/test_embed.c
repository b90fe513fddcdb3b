/* test_embed.c - kwker serve's /v1/embeddings bodies and replies (tools/kwker/serve/embed.c,
 * included whole with openai.c and toolcall.c as the fuzz target does: the server lives in the
 * CLI): each input form, the 400s with the field and input they name, packing with the length
 * limit, and the reply's floats and base64 read back bit for bit. The server with a real
 * encoder is tests/python/test_embeddings_server.py. */
#include "test.h"

#include "../../tools/kwker/serve/openai.c"
#include "../../tools/kwker/serve/toolcall.c"
#include "../../tools/kwker/serve/embed.c"
#include "fake_tokenizer.h"

static const struct srv_embed_limits LIM = {.n_vocab = 1000, .dim = 4, .max_tokens = 8};

static int parse(const char *body, struct srv_embed_req *r, struct srv_err *e)
{
    return srv_embed_parse(r, body, strlen(body), &LIM, e);
}

static void test_forms(void)
{
    struct srv_embed_req r;
    struct srv_err e;
    T_EQ(parse("{\"model\":\"m\",\"input\":\"hi\"}", &r, &e), 0);
    T_EQ(r.n_in, 1);
    T_STREQ(r.in[0].text, "hi");
    T_STREQ(r.model, "m");
    T_EQ(r.base64, 0);
    srv_embed_req_free(&r);

    T_EQ(parse("{\"model\":\"m\",\"input\":[\"a\",\"bc\"],\"encoding_format\":\"base64\","
               "\"dimensions\":4,\"user\":\"u\"}", &r, &e), 0);
    T_EQ(r.n_in, 2);
    T_STREQ(r.in[1].text, "bc");
    T_EQ(r.base64, 1);
    T_EQ(srv_embed_pack(&r, fake_encode, NULL, &LIM, &e), 0);
    T_EQ(r.offs[1], 3);
    T_EQ(r.offs[2], 7);
    T_EQ(r.ids[3], 101);
    T_EQ(r.ids[4], 'b');
    T_EQ(r.ids[6], 102);
    srv_embed_req_free(&r);

    /* one list of ids is one input; a list of lists is one input each, taken as given */
    T_EQ(parse("{\"model\":\"m\",\"input\":[5,6,7]}", &r, &e), 0);
    T_EQ(r.n_in, 1);
    T_EQ(r.in[0].n_ids, 3);
    T_EQ(srv_embed_pack(&r, fake_encode, NULL, &LIM, &e), 0);
    T_EQ(r.offs[1], 3);
    T_EQ(r.ids[2], 7);
    srv_embed_req_free(&r);

    T_EQ(parse("{\"model\":\"m\",\"input\":[[1],[2,3]],\"encoding_format\":\"float\"}", &r, &e),
         0);
    T_EQ(r.n_in, 2);
    T_EQ(srv_embed_pack(&r, fake_encode, NULL, &LIM, &e), 0);
    T_EQ(r.offs[2], 3);
    T_EQ(r.ids[1], 2);
    srv_embed_req_free(&r);
}

/* Each bad body: a 400 (or the given status) whose message holds want, on param. */
static void test_errors(void)
{
    static const struct {
        const char *body, *param, *want;
    } bad[] = {
        {"[1]", NULL, "JSON object"},
        {"{\"model\":", NULL, "could not parse"},
        {"{\"input\":\"x\"}", "model", "'model' is required"},
        {"{\"model\":3,\"input\":\"x\"}", "model", "'model' must be a string"},
        {"{\"model\":\"m\"}", "input", "'input' is required"},
        {"{\"model\":\"m\",\"input\":null}", "input", "'input' is required"},
        {"{\"model\":\"m\",\"input\":3}", "input", "'input' must be a string, a list"},
        {"{\"model\":\"m\",\"input\":\"\"}", "input", "'input' is an empty string"},
        {"{\"model\":\"m\",\"input\":[]}", "input", "'input' is an empty list"},
        {"{\"model\":\"m\",\"input\":[\"a\",\"\"]}", "input", "'input[1]' is an empty string"},
        {"{\"model\":\"m\",\"input\":[[1],[]]}", "input", "'input[1]' is an empty list"},
        {"{\"model\":\"m\",\"input\":[\"a\",[1]]}", "input", "'input[1]' is not a string"},
        {"{\"model\":\"m\",\"input\":[[1],\"a\"]}", "input", "'input[1]' is not a list"},
        {"{\"model\":\"m\",\"input\":[1,\"a\"]}", "input", "'input[1]' is not a token id"},
        {"{\"model\":\"m\",\"input\":[1,1000]}", "input", "'input[1]' is 1000, not a token id"},
        {"{\"model\":\"m\",\"input\":[[1],[2,-1]]}", "input", "'input[1][1]' is -1"},
        {"{\"model\":\"m\",\"input\":[[1],[2.5]]}", "input", "'input[1][0]' is not a token id"},
        {"{\"model\":\"m\",\"input\":[{}]}", "input", "'input[0]' is not a list"},
        {"{\"model\":\"m\",\"input\":\"x\",\"encoding_format\":\"binary\"}", "encoding_format",
         "'float' or 'base64'"},
        {"{\"model\":\"m\",\"input\":\"x\",\"encoding_format\":1}", "encoding_format",
         "'float' or 'base64'"},
        {"{\"model\":\"m\",\"input\":\"x\",\"dimensions\":3}", "dimensions", "must be 4"},
        {"{\"model\":\"m\",\"input\":\"x\",\"dimensions\":\"4\"}", "dimensions",
         "must be an integer"},
        {"{\"model\":\"m\",\"input\":\"x\",\"user\":1}", "user", "'user' must be a string"},
        {"{\"model\":\"m\",\"model\":\"n\",\"input\":\"x\"}", NULL, "duplicate"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct srv_embed_req r;
        struct srv_err e = {0};
        T_EQ(parse(bad[i].body, &r, &e), -1);
        T_EQ(e.http, 400);
        T_CONTAINS(e.msg, bad[i].want);
        T_TRUE(bad[i].param ? e.param && !strcmp(e.param, bad[i].param) : !e.param);
        T_TRUE(r.in == NULL && r.model == NULL); /* freed */
    }
}

static void test_limits(void)
{
    struct srv_embed_req r;
    struct srv_err e;
    /* 2048 inputs pass, 2049 do not */
    struct srv_buf b = {0};
    srv_buf_str(&b, "{\"model\":\"m\",\"input\":[");
    for (int i = 0; i < SRV_EMBED_MAX_INPUTS; i++)
        srv_buf_str(&b, i ? ",\"a\"" : "\"a\"");
    srv_buf_str(&b, "]}");
    T_EQ(parse(b.p, &r, &e), 0);
    T_EQ(r.n_in, SRV_EMBED_MAX_INPUTS);
    srv_embed_req_free(&r);
    b.len -= 2;
    srv_buf_str(&b, ",\"a\"]}");
    T_EQ(parse(b.p, &r, &e), -1);
    T_CONTAINS(e.msg, "at most 2048 inputs; it has 2049");
    srv_buf_free(&b);

    /* max_tokens 8 with [CLS] and [SEP]: 6 bytes of text fit, 7 do not; ids: 8 fit, 9 not */
    T_EQ(parse("{\"model\":\"m\",\"input\":[\"abcdef\",\"abcdefg\"]}", &r, &e), 0);
    T_EQ(srv_embed_pack(&r, fake_encode, NULL, &LIM, &e), -1);
    T_EQ(e.http, 400);
    T_STREQ(e.code, "context_length_exceeded");
    T_CONTAINS(e.msg, "maximum context length is 8 tokens, however you requested 9 tokens "
                      "(input 1)");
    srv_embed_req_free(&r);
    T_EQ(parse("{\"model\":\"m\",\"input\":[[1,2,3,4,5,6,7,8],[1,2,3,4,5,6,7,8,9]]}", &r, &e),
         0);
    T_EQ(srv_embed_pack(&r, fake_encode, NULL, &LIM, &e), -1);
    T_CONTAINS(e.msg, "requested 9 tokens (input 1)");
    srv_embed_req_free(&r);
    T_EQ(parse("{\"model\":\"m\",\"input\":[[1,2,3,4,5,6,7,8]]}", &r, &e), 0);
    T_EQ(srv_embed_pack(&r, fake_encode, NULL, &LIM, &e), 0);
    srv_embed_req_free(&r);
}

static size_t b64_value(char c)
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = strchr(abc, c);
    return p && c ? (size_t)(p - abc) : 64;
}

/* base64 text[len] to bytes; the count, or -1 on a bad character. */
static long b64_decode(const char *t, size_t len, unsigned char *out)
{
    long n = 0;
    for (size_t i = 0; i + 4 <= len; i += 4) {
        uint32_t w = 0;
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            size_t v = t[i + k] == '=' ? (pad++, 0) : b64_value(t[i + k]);
            if (v == 64)
                return -1;
            w = w << 6 | (uint32_t)v;
        }
        for (int k = 0; k < 3 - pad; k++)
            out[n++] = (unsigned char)(w >> (16 - 8 * k));
    }
    return n;
}

static void test_reply(void)
{
    /* values whose shortest decimal needs all 9 digits, a subnormal, -0 and a NaN */
    const float v[2][4] = {{0.1f, -1.17549435e-38f, 3.40282347e38f, 1.4e-45f},
                           {-0.0f, 1.0f / 3.0f, NAN, 16777217.0f}};
    struct srv_buf b = {0};
    srv_embed_response(&b, "mini\"LM", &v[0][0], 2, 4, 0, 11);
    json_t *j = json_loadb(b.p, b.len, 0, NULL);
    T_TRUE(j != NULL);
    T_STREQ(json_string_value(json_object_get(j, "object")), "list");
    T_STREQ(json_string_value(json_object_get(j, "model")), "mini\"LM");
    json_t *usage = json_object_get(j, "usage");
    T_EQ(json_integer_value(json_object_get(usage, "prompt_tokens")), 11);
    T_EQ(json_integer_value(json_object_get(usage, "total_tokens")), 11);
    json_t *data = json_object_get(j, "data");
    T_EQ(json_array_size(data), 2);
    for (size_t i = 0; i < 2; i++) {
        json_t *d = json_array_get(data, i);
        T_EQ(json_integer_value(json_object_get(d, "index")), i);
        T_STREQ(json_string_value(json_object_get(d, "object")), "embedding");
        json_t *emb = json_object_get(d, "embedding");
        T_EQ(json_array_size(emb), 4);
        for (size_t k = 0; k < 4; k++) {
            json_t *x = json_array_get(emb, k);
            if (isnan(v[i][k])) {
                T_TRUE(json_is_null(x));
                continue;
            }
            float back = (float)json_number_value(x);
            T_TRUE(memcmp(&back, &v[i][k], 4) == 0 || (back == 0 && v[i][k] == 0));
        }
    }
    json_decref(j);
    srv_buf_free(&b);

    /* base64: the float32 bytes, little-endian; 1 to 3 floats cover every padding */
    for (int dim = 1; dim <= 4; dim++) {
        srv_embed_response(&b, "m", &v[0][0], 1, dim, 1, 1);
        j = json_loadb(b.p, b.len, 0, NULL);
        const char *t = json_string_value(
            json_object_get(json_array_get(json_object_get(j, "data"), 0), "embedding"));
        unsigned char bytes[16];
        T_TRUE(t != NULL);
        T_EQ(t ? b64_decode(t, strlen(t), bytes) : -1, 4 * dim);
        T_EQ(t ? strlen(t) : 0, (size_t)(4 * dim + 2) / 3 * 4);
        for (int k = 0; t && k < dim; k++) {
            uint32_t u;
            memcpy(&u, &v[0][k], 4);
            T_TRUE(bytes[4 * k] == (u & 255) && bytes[4 * k + 3] == u >> 24);
        }
        json_decref(j);
        srv_buf_free(&b);
    }
}

int main(void)
{
    test_forms();
    test_errors();
    test_limits();
    test_reply();
    return t_report("test_embed");
}
