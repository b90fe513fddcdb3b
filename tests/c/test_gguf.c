/* test_gguf.c - the GGUF parser on a small file built here: metadata getters, tensor placement,
 * and every way of breaking it (magic, version, counts, lengths, types, alignment, overlap,
 * every truncation). Single-threaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "test.h"

#define LABEL "mem.gguf"

struct gb {
    uint8_t *p;
    size_t n, cap;
};

static void gb_bytes(struct gb *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void gb_le(struct gb *b, uint64_t v, int n)
{
    uint8_t t[8];
    for (int i = 0; i < n; i++)
        t[i] = (uint8_t)(v >> (8 * i));
    gb_bytes(b, t, (size_t)n);
}

static void gb_str(struct gb *b, const char *s)
{
    gb_le(b, strlen(s), 8);
    gb_bytes(b, s, strlen(s));
}

/* Knobs to break the file in one place. */
struct spec {
    uint32_t version;
    uint64_t n_kv_claim;        /* 0: the real count */
    uint32_t alignment;
    uint32_t t1_type;           /* ggml type of the second tensor */
    uint64_t t1_offset;
    uint64_t t1_ne0;
    uint32_t t0_ndims;
    uint32_t extra_kv_type;     /* append a key of this type (0: none) */
    int nested_array;
};

static void spec_default(struct spec *s)
{
    memset(s, 0, sizeof *s);
    s->version = 3;
    s->alignment = 32;
    s->t1_type = 8; /* Q8_0 */
    s->t1_offset = 32;
    s->t1_ne0 = 32;
    s->t0_ndims = 2;
}

/* Two tensors: t0 F32 ne {4, 2} at 0 (32 bytes) and t1 (Q8_0 ne {32}: 34 bytes) at 32. */
static struct gb build(const struct spec *s)
{
    struct gb b = {0};
    int n_kv = 7 + (s->extra_kv_type != 0) + s->nested_array;
    gb_bytes(&b, "GGUF", 4);
    gb_le(&b, s->version, 4);
    gb_le(&b, 2, 8);
    gb_le(&b, s->n_kv_claim ? s->n_kv_claim : (uint64_t)n_kv, 8);
    gb_str(&b, "general.architecture");
    gb_le(&b, KWK_GGUF_STRING, 4);
    gb_str(&b, "llama");
    gb_str(&b, "general.alignment");
    gb_le(&b, KWK_GGUF_UINT32, 4);
    gb_le(&b, s->alignment, 4);
    gb_str(&b, "x.f32");
    gb_le(&b, KWK_GGUF_FLOAT32, 4);
    float f = 1.5f;
    gb_bytes(&b, &f, 4);
    gb_str(&b, "x.bool");
    gb_le(&b, KWK_GGUF_BOOL, 4);
    gb_le(&b, 1, 1);
    gb_str(&b, "x.i8");
    gb_le(&b, KWK_GGUF_INT8, 4);
    gb_le(&b, 0xfe, 1);
    gb_str(&b, "x.ints");
    gb_le(&b, KWK_GGUF_ARRAY, 4);
    gb_le(&b, KWK_GGUF_INT32, 4);
    gb_le(&b, 3, 8);
    gb_le(&b, 7, 4);
    gb_le(&b, (uint32_t)-8, 4);
    gb_le(&b, 9, 4);
    gb_str(&b, "x.strs");
    gb_le(&b, KWK_GGUF_ARRAY, 4);
    gb_le(&b, KWK_GGUF_STRING, 4);
    gb_le(&b, 3, 8);
    gb_str(&b, "ab");
    gb_str(&b, "");
    gb_str(&b, "cde");
    if (s->extra_kv_type) {
        gb_str(&b, "x.extra");
        gb_le(&b, s->extra_kv_type, 4);
        gb_le(&b, 0, 8);
    }
    if (s->nested_array) {
        gb_str(&b, "x.nested");
        gb_le(&b, KWK_GGUF_ARRAY, 4);
        gb_le(&b, KWK_GGUF_ARRAY, 4);
        gb_le(&b, 1, 8);
    }
    gb_str(&b, "t0");
    gb_le(&b, s->t0_ndims, 4);
    for (uint32_t d = 0; d < s->t0_ndims && d < 8; d++)
        gb_le(&b, d == 0 ? 4 : d == 1 ? 2 : 1, 8);
    gb_le(&b, 0, 4);
    gb_le(&b, 0, 8);
    gb_str(&b, "t1");
    gb_le(&b, 1, 4);
    gb_le(&b, s->t1_ne0, 8);
    gb_le(&b, s->t1_type, 4);
    gb_le(&b, s->t1_offset, 8);
    while (b.n % 32)
        gb_le(&b, 0, 1);
    for (int i = 0; i < 8; i++) {
        float v = (float)i;
        gb_bytes(&b, &v, 4);
    }
    gb_le(&b, 0x3c00, 2); /* Q8_0 block: d = 1.0, then q = 0..31 */
    for (int i = 0; i < 32; i++)
        gb_le(&b, (uint8_t)(i - 16), 1);
    return b;
}

static int parse_spec(const struct spec *s, struct kwk_err *err)
{
    struct gb b = build(s);
    struct kwk_gguf g;
    kwk_err_clear(err);
    int rc = kwk_gguf_parse(&g, b.p, b.n, LABEL, err);
    if (rc == 0)
        kwk_gguf_close(&g);
    else
        T_TRUE(strncmp(err->msg, LABEL ":", strlen(LABEL ":")) == 0);
    free(b.p);
    return rc;
}

static void test_valid(void)
{
    struct spec s;
    spec_default(&s);
    struct gb b = build(&s);
    struct kwk_gguf g;
    struct kwk_err err;
    T_EQ(kwk_gguf_parse(&g, b.p, b.n, LABEL, &err), 0);
    T_EQ(g.version, 3);
    T_EQ(g.n_kv, 7);
    T_EQ(g.alignment, 32);
    const char *str;
    size_t n;
    T_EQ(kwk_gguf_get_str(&g, "general.architecture", &str, &n), 0);
    T_EQ(n, 5);
    T_TRUE(memcmp(str, "llama", 5) == 0);
    int64_t i64;
    double f64;
    int bv;
    T_EQ(kwk_gguf_get_i64(&g, "general.alignment", &i64), 0);
    T_EQ(i64, 32);
    T_EQ(kwk_gguf_get_i64(&g, "x.i8", &i64), 0);
    T_EQ(i64, -2);
    T_EQ(kwk_gguf_get_f64(&g, "x.f32", &f64), 0);
    T_NEAR(f64, 1.5, 0);
    T_EQ(kwk_gguf_get_f64(&g, "general.alignment", &f64), 0);
    T_NEAR(f64, 32, 0);
    T_EQ(kwk_gguf_get_bool(&g, "x.bool", &bv), 0);
    T_EQ(bv, 1);
    T_EQ(kwk_gguf_get_i64(&g, "x.f32", &i64), KWK_EFORMAT);
    T_EQ(kwk_gguf_get_str(&g, "x.bool", &str, &n), KWK_EFORMAT);
    T_EQ(kwk_gguf_get_bool(&g, "general.alignment", &bv), KWK_EFORMAT);
    T_EQ(kwk_gguf_get_i64(&g, "nope", &i64), KWK_ENOTFOUND);
    const struct kwk_gguf_kv *kv = kwk_gguf_find(&g, "x.ints");
    T_TRUE(kv != NULL);
    T_EQ(kv->arr_len, 3);
    T_EQ(kwk_gguf_arr_i64(kv, 1, &i64), 0);
    T_EQ(i64, -8);
    T_EQ(kwk_gguf_arr_f64(kv, 2, &f64), 0);
    T_NEAR(f64, 9, 0);
    T_EQ(kwk_gguf_arr_i64(kv, 3, &i64), KWK_ERANGE);
    kv = kwk_gguf_find(&g, "x.strs");
    const char *ptrs[3];
    size_t lens[3];
    T_EQ(kwk_gguf_arr_strings(kv, ptrs, lens), 0);
    T_EQ(lens[0], 2);
    T_EQ(lens[1], 0);
    T_EQ(lens[2], 3);
    T_TRUE(memcmp(ptrs[2], "cde", 3) == 0);
    T_EQ(kwk_gguf_arr_i64(kv, 0, &i64), KWK_EFORMAT);
    T_EQ(g.n_tensors, 2);
    T_STREQ(g.tensors[0].name, "t0");
    T_EQ(g.tensors[0].n_dims, 2);
    T_EQ(g.tensors[0].shape[0], 2); /* outermost first: ne {4, 2} is [2, 4] */
    T_EQ(g.tensors[0].shape[1], 4);
    T_EQ(g.tensors[0].nbytes, 32);
    T_EQ(g.tensors[1].dtype, KWK_DT_Q8_0);
    T_EQ(g.tensors[1].nbytes, 34);
    T_TRUE(g.tensors[1].data == b.p + b.n - 34);
    float row[32];
    kwk_dequant_row(KWK_DT_F32, g.tensors[0].data, row, 8);
    T_NEAR(row[7], 7, 0);
    kwk_dequant_row(KWK_DT_Q8_0, g.tensors[1].data, row, 32);
    T_NEAR(row[0], -16, 0);
    T_NEAR(row[31], 15, 0);
    kwk_gguf_close(&g);

    /* every prefix fails cleanly */
    int all_fail = 1;
    for (size_t k = 0; k < b.n; k++) {
        uint8_t *p = malloc(k ? k : 1);
        memcpy(p, b.p, k);
        if (kwk_gguf_parse(&g, p, k, LABEL, &err) == 0) {
            all_fail = 0;
            kwk_gguf_close(&g);
        } else if (strncmp(err.msg, LABEL ":", strlen(LABEL ":")) != 0) {
            all_fail = 0;
        }
        free(p);
    }
    T_TRUE(all_fail);
    for (long k = 1; k < 12; k++) {
        kwk_alloc_fail_after(k);
        int rc = kwk_gguf_parse(&g, b.p, b.n, LABEL, &err);
        kwk_alloc_fail_after(0);
        if (rc == 0)
            kwk_gguf_close(&g);
        else
            T_CONTAINS(err.msg, "out of memory");
    }
    free(b.p);
}

static void test_errors(void)
{
    struct spec s;
    struct kwk_err err;
    struct kwk_gguf g;

    uint8_t bad[32] = "GGUX";
    T_EQ(kwk_gguf_parse(&g, bad, sizeof bad, LABEL, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "not a GGUF file");
    spec_default(&s);
    s.version = 1;
    T_EQ(parse_spec(&s, &err), KWK_EUNSUPPORTED);
    T_CONTAINS(err.msg, "GGUF version 1 is not supported");
    s.version = 99;
    T_EQ(parse_spec(&s, &err), KWK_EUNSUPPORTED);
    T_CONTAINS(err.msg, "version 99");
    s.version = 2;
    T_EQ(parse_spec(&s, &err), 0);

    spec_default(&s);
    s.n_kv_claim = (uint64_t)1 << 60;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "cannot fit");
    s.n_kv_claim = 9; /* two more than present: the tensor infos are read as keys */
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);

    spec_default(&s);
    s.t1_type = 10;
    T_EQ(parse_spec(&s, &err), KWK_EUNSUPPORTED);
    T_CONTAINS(err.msg, "tensor t1 has ggml type 10 (Q2_K)");
    s.t1_type = 200;
    T_EQ(parse_spec(&s, &err), KWK_EUNSUPPORTED);
    T_CONTAINS(err.msg, "unknown");

    spec_default(&s);
    s.t1_offset = 4;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "tensor t1: offset 4 is not a multiple of the alignment 32");
    s.t1_offset = 0;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "overlap");
    s.t1_offset = 64;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "tensor t1");
    T_CONTAINS(err.msg, "past the end");
    s.t1_offset = (uint64_t)-32;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);

    spec_default(&s);
    s.t1_ne0 = 33;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "tensor t1: 33 columns of Q8_0");
    s.t1_ne0 = 0;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "dimension 0 is 0");

    spec_default(&s);
    s.alignment = 24;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "power of two");
    s.alignment = 0;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    s.alignment = 1u << 30;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);

    spec_default(&s);
    s.t0_ndims = 5;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "tensor t0 has 5 dimensions");
    s.t0_ndims = 0;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);

    spec_default(&s);
    s.extra_kv_type = 13;
    T_EQ(parse_spec(&s, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "key x.extra has unknown value type 13");
    s.extra_kv_type = KWK_GGUF_STRING; /* string of length 0: fine */
    T_EQ(parse_spec(&s, &err), 0);
    spec_default(&s);
    s.nested_array = 1;
    T_EQ(parse_spec(&s, &err), KWK_EUNSUPPORTED);
    T_CONTAINS(err.msg, "array of arrays");

    /* a string length running past the end */
    spec_default(&s);
    struct gb b = build(&s);
    b.p[24] = 0xff; /* the first key's length becomes 32767 */
    b.p[25] = 0x7f;
    T_EQ(kwk_gguf_parse(&g, b.p, b.n, LABEL, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "truncated: key needs 32767 bytes at offset 32");
    b.p[24 + 7] = 0x7f;
    T_EQ(kwk_gguf_parse(&g, b.p, b.n, LABEL, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "longer than");
    free(b.p);
}

static void test_open(void)
{
    char path[256];
    snprintf(path, sizeof path, "/tmp/kwk_test_gguf_%d.gguf", (int)getpid());
    struct spec s;
    spec_default(&s);
    struct gb b = build(&s);
    FILE *fp = fopen(path, "wb");
    fwrite(b.p, 1, b.n - 1, fp);
    fclose(fp);
    struct kwk_gguf g;
    struct kwk_err err;
    T_EQ(kwk_gguf_open(&g, path, &err), KWK_EFORMAT);
    T_TRUE(strncmp(err.msg, path, strlen(path)) == 0);
    T_CONTAINS(err.msg, "tensor t1");
    fp = fopen(path, "wb");
    fwrite(b.p, 1, b.n, fp);
    fclose(fp);
    T_EQ(kwk_gguf_open(&g, path, &err), 0);
    T_STREQ(g.path, path);
    T_EQ(g.n_tensors, 2);
    kwk_gguf_close(&g);
    unlink(path);
    T_EQ(kwk_gguf_open(&g, path, &err), KWK_ENOTFOUND);
    free(b.p);
}

int main(void)
{
    test_valid();
    test_errors();
    test_open();
    return t_report("test_gguf");
}
