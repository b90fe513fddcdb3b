/* test_dequant.c - kwk_dequant_row against golden values from the gguf Python package
 * (tests/golden/make_dequant_golden.py): bit-identical for every type. Single-threaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "test.h"

static void check_type(int dtype)
{
    char path[256];
    snprintf(path, sizeof path, "tests/golden/dequant/%s.bin", kwk_dtype_name(dtype));
    char *buf = NULL;
    size_t n = 0;
    struct kwk_err err;
    int rc = kwk_read_file(path, 1 << 20, &buf, &n, &err);
    T_CHECK(rc == 0, "%s: %s", path, err.msg);
    if (rc)
        return;
    uint32_t count = 0;
    memcpy(&count, buf, 4);
    size_t raw = kwk_dtype_row_bytes(dtype, count);
    T_CHECK(raw > 0 && n == 4 + raw + 4 * (size_t)count, "%s: size %zu for %u elements", path, n,
            count);
    if (raw == 0 || n != 4 + raw + 4 * (size_t)count)
        goto out;
    float *got = malloc(4 * (size_t)count), *want = malloc(4 * (size_t)count);
    memcpy(want, buf + 4 + raw, 4 * (size_t)count);
    memset(got, 0xcc, 4 * (size_t)count);
    kwk_dequant_row(dtype, buf + 4, got, count);
    int bad = -1;
    for (uint32_t i = 0; i < count && bad < 0; i++)
        if (memcmp(&got[i], &want[i], 4) != 0)
            bad = (int)i;
    T_CHECK(bad < 0, "%s: element %d is %.9g, gguf says %.9g", kwk_dtype_name(dtype), bad,
            bad >= 0 ? got[bad] : 0.0, bad >= 0 ? want[bad] : 0.0);
    /* block by block gives the same as the whole row */
    int blk = kwk_dtype_block(dtype);
    size_t bb = kwk_dtype_block_bytes(dtype);
    int same = 1;
    for (uint32_t i = 0; i < count; i += (uint32_t)blk) {
        float one[256];
        kwk_dequant_row(dtype, buf + 4 + (i / (uint32_t)blk) * bb, one, blk);
        same &= memcmp(one, got + i, 4 * (size_t)blk) == 0;
    }
    T_TRUE(same);
    /* the 4-bit grids int4 keeps: d * q + m gives the dequantized values, bit for bit where the
     * file's own arithmetic is the same (Q4_1; Q4_0's d (q - 8); Q4_K's d1 q - m1), codes in
     * [0, 15]; the other types have none */
    uint8_t *q = malloc((size_t)count);
    float *gd = malloc(4 * ((size_t)count / 32 + 1)), *gm = malloc(4 * ((size_t)count / 32 + 1));
    int grid = kwk_dequant_grid4(dtype, buf + 4, count, q, gd, gm) == 0;
    T_EQ(grid, dtype == KWK_DT_Q4_0 || dtype == KWK_DT_Q4_1 || dtype == KWK_DT_Q4_K);
    for (uint32_t i = 0; grid && i < count; i++) {
        float v = dtype == KWK_DT_Q4_0 ? gd[i / 32] * (float)((int)q[i] - 8)
                                       : gd[i / 32] * (float)q[i] + gm[i / 32];
        if (q[i] > 15 || memcmp(&v, &want[i], 4) != 0) {
            T_CHECK(0, "%s grid element %u: code %d gives %.9g, dequantized %.9g",
                    kwk_dtype_name(dtype), i, q[i], v, want[i]);
            break;
        }
        if (dtype == KWK_DT_Q4_0 && gm[i / 32] != -8.0f * gd[i / 32]) {
            T_CHECK(0, "Q4_0 grid group %u: offset %.9g is not -8 d", i / 32, gm[i / 32]);
            break;
        }
    }
    free(q);
    free(gd);
    free(gm);
    free(got);
    free(want);
out:
    kwk_free(buf);
}

int main(void)
{
    for (int t = 0; t < KWK_DT_COUNT; t++)
        check_type(t);
    T_EQ(kwk_dtype_block(KWK_DT_Q4_K), 256);
    T_EQ(kwk_dtype_block_bytes(KWK_DT_Q4_K), 144);
    T_EQ(kwk_dtype_block_bytes(KWK_DT_Q5_K), 176);
    T_EQ(kwk_dtype_block_bytes(KWK_DT_Q6_K), 210);
    T_EQ(kwk_dtype_block_bytes(KWK_DT_Q4_1), 20);
    T_EQ(kwk_dtype_row_bytes(KWK_DT_Q8_0, 64), 68);
    T_EQ(kwk_dtype_row_bytes(KWK_DT_Q8_0, 33), 0);
    T_EQ(kwk_dtype_row_bytes(KWK_DT_BF16, 3), 6);
    T_EQ(kwk_dtype_row_bytes(KWK_DT_Q6_K, INT64_MAX / 2), 0);
    T_EQ(kwk_dtype_row_bytes(99, 32), 0);
    T_STREQ(kwk_dtype_name(KWK_DT_Q5_1), "Q5_1");
    T_STREQ(kwk_dtype_name(-1), "?");
    return t_report("test_dequant");
}
