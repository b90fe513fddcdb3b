/* test_safetensors.c - the safetensors parser on valid, truncated and malformed headers: each
 * error has the right code, names the file (label) and the tensor. Single-threaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "test.h"

#define LABEL "mem.safetensors"

/* 8-byte length, the JSON, then n_data bytes 0, 1, 2, ... */
static uint8_t *mk(const char *json, size_t n_data, size_t *size)
{
    size_t hl = strlen(json);
    *size = 8 + hl + n_data;
    uint8_t *b = malloc(*size);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    for (size_t i = 0; i < n_data; i++)
        b[8 + hl + i] = (uint8_t)i;
    return b;
}

/* Parse json + n_data bytes; return the code and leave the message in err. */
static int parse(const char *json, size_t n_data, struct kwk_err *err)
{
    size_t size;
    uint8_t *b = mk(json, n_data, &size);
    struct kwk_st_file f;
    kwk_err_clear(err);
    int rc = kwk_st_parse(&f, b, size, LABEL, err);
    if (rc == 0)
        kwk_st_close(&f);
    else
        T_TRUE(strncmp(err->msg, LABEL ":", strlen(LABEL ":")) == 0);
    free(b);
    return rc;
}

static const char *valid_json =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b.weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
    "\"c\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[32,34]}}";

static void test_valid(void)
{
    size_t size;
    uint8_t *b = mk(valid_json, 34, &size);
    struct kwk_st_file f;
    struct kwk_err err;
    T_EQ(kwk_st_parse(&f, b, size, LABEL, &err), 0);
    T_EQ(f.n_tensors, 3);
    T_STREQ(f.tensors[0].name, "a");
    T_EQ(f.tensors[0].dtype, KWK_DT_F32);
    T_EQ(f.tensors[0].n_dims, 2);
    T_EQ(f.tensors[0].shape[0], 2);
    T_EQ(f.tensors[0].shape[1], 3);
    T_EQ(f.tensors[0].nbytes, 24);
    size_t data = size - 34;
    T_TRUE(f.tensors[0].data == b + data);
    T_STREQ(f.tensors[1].name, "b.weight");
    T_EQ(f.tensors[1].dtype, KWK_DT_BF16);
    T_TRUE(f.tensors[1].data == b + data + 24);
    T_EQ(f.tensors[2].n_dims, 0);
    T_EQ(f.tensors[2].nbytes, 2);
    kwk_st_close(&f);
    /* every shorter prefix is an error, never a crash */
    int all_fail = 1;
    for (size_t n = 0; n < size; n++) {
        uint8_t *p = malloc(n ? n : 1);
        memcpy(p, b, n);
        if (kwk_st_parse(&f, p, n, LABEL, &err) == 0) {
            all_fail = 0;
            kwk_st_close(&f);
        }
        free(p);
    }
    T_TRUE(all_fail);
    /* each allocation failing in turn gives an error, not a crash or leak */
    for (long k = 1; k < 8; k++) {
        kwk_alloc_fail_after(k);
        int rc = kwk_st_parse(&f, b, size, LABEL, &err);
        kwk_alloc_fail_after(0);
        if (rc == 0)
            kwk_st_close(&f);
        else
            T_CONTAINS(err.msg, "out of memory");
    }
    free(b);
}

static void test_errors(void)
{
    struct kwk_err err;
    uint8_t tiny[5] = {1, 0, 0, 0, 0};
    struct kwk_st_file f;
    T_EQ(kwk_st_parse(&f, tiny, sizeof tiny, LABEL, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "too short");

    /* header length past the end */
    size_t size;
    uint8_t *b = mk(valid_json, 34, &size);
    b[3] = 0x10;
    T_EQ(kwk_st_parse(&f, b, size, LABEL, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "header length");
    T_CONTAINS(err.msg, "past the end");
    memset(b, 0xff, 8);
    T_EQ(kwk_st_parse(&f, b, size, LABEL, &err), KWK_EFORMAT);
    free(b);

    /* truncated data */
    T_EQ(parse(valid_json, 30, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "tensor b.weight");
    T_CONTAINS(err.msg, "past the end of the data");

    T_EQ(parse("{\"a\": [", 0, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "header JSON is invalid at byte");
    T_TRUE(err.pos >= 8);
    T_EQ(parse("[1, 2]", 0, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "not an object");
    T_EQ(parse("{\"a\":{\"dtype\":\"F32\"},\"a\":{}}", 0, &err), KWK_EFORMAT);

    T_EQ(parse("{\"w\":{\"dtype\":\"Q9\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &err),
         KWK_EFORMAT);
    T_CONTAINS(err.msg, "tensor w: unknown dtype \"Q9\"");
    /* types Kwker does not run are named, not tensors: BERT files carry an I64 position_ids */
    {
        size_t size;
        uint8_t *b = mk("{\"w\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                        "\"f\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[8,9]},"
                        "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
                        16, &size);
        struct kwk_st_file f;
        T_EQ(kwk_st_parse(&f, b, size, LABEL, &err), 0);
        T_EQ(f.n_tensors, 1);
        T_TRUE(!strcmp(f.tensors[0].name, "x"));
        T_EQ(f.n_unrun, 2);
        T_TRUE(!strcmp(f.unrun[0], "w") && !strcmp(f.unrun[1], "f"));
        kwk_st_close(&f);
        free(b);
    }

    T_EQ(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20, &err),
         KWK_EFORMAT);
    T_CONTAINS(err.msg, "tensor w: 20 bytes but shape and dtype F32 need 24");
    T_EQ(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2,3],\"data_offsets\":[0,24]}}", 24, &err),
         KWK_EFORMAT);
    T_CONTAINS(err.msg, "shape[0]");
    T_EQ(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,4]}}", 4, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "too large");
    T_EQ(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", 8, &err),
         KWK_EFORMAT);
    T_CONTAINS(err.msg, "begin <= end");
    T_EQ(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[100,104]}}", 8, &err),
         KWK_EFORMAT);
    T_CONTAINS(err.msg, "past the end");
    T_EQ(parse("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &err), KWK_EFORMAT);
    T_CONTAINS(err.msg, "tensor w: needs");
    T_EQ(parse("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
               &err), KWK_EUNSUPPORTED);
    T_EQ(parse("{\"x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
               "\"y\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]}}", 24, &err),
         KWK_EFORMAT);
    T_CONTAINS(err.msg, "tensors x and y overlap");
    /* empty tensors share offsets harmlessly */
    T_EQ(parse("{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
               "\"y\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, &err), 0);
}

static void test_open(void)
{
    char path[256];
    snprintf(path, sizeof path, "/tmp/kwk_test_st_%d.safetensors", (int)getpid());
    size_t size;
    uint8_t *b = mk(valid_json, 34, &size);
    FILE *fp = fopen(path, "wb");
    T_TRUE(fp != NULL);
    fwrite(b, 1, size - 3, fp); /* truncated on disk */
    fclose(fp);
    struct kwk_st_file f;
    struct kwk_err err;
    T_EQ(kwk_st_open(&f, path, &err), KWK_EFORMAT);
    T_TRUE(strncmp(err.msg, path, strlen(path)) == 0);
    fp = fopen(path, "wb");
    fwrite(b, 1, size, fp);
    fclose(fp);
    T_EQ(kwk_st_open(&f, path, &err), 0);
    T_STREQ(f.path, path);
    T_EQ(f.n_tensors, 3);
    T_EQ(f.tensors[1].data[0], 24);
    kwk_st_close(&f);
    kwk_st_close(&f); /* closing twice is harmless */
    unlink(path);
    T_EQ(kwk_st_open(&f, path, &err), KWK_ENOTFOUND);
    T_CONTAINS(err.msg, path);
    free(b);
}

int main(void)
{
    test_valid();
    test_errors();
    test_open();
    return t_report("test_safetensors");
}
