/* bf16t_ref.c - bf16 weights in AMX tile order (bf16t.h) in plain C: their size, packing, a row
 * read back, and the matmul in the tile unit's order, which the AVX-512 kernels (amx_bf16t.c)
 * must match bit for bit. Pure functions; any thread. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "base/base.h"
#include "kernels/bf16t.h"

int kwk_bf16t_bytes(int64_t rows, int64_t cols, size_t *out)
{
    *out = 0;
    if (rows < 0 || cols < 0)
        return -1;
    size_t blocks = (size_t)((rows + KWK_BF16T_ROWS - 1) / KWK_BF16T_ROWS), n;
    if (kwk_mul_size(blocks, (size_t)kwk_bf16t_chunks(cols), &n) ||
        kwk_mul_size(n, KWK_BF16T_TILE_BYTES, out))
        return -1;
    return 0;
}

/* The bf16 half of row 16b + i, column k within block b's words. */
static size_t half_at(int64_t nk, int64_t b, int i, int64_t k)
{
    int64_t c = k / KWK_BF16T_CHUNK, p = k % KWK_BF16T_CHUNK / 2;
    return ((((size_t)b * (size_t)nk + (size_t)c) * 16 + (size_t)p) * 16 + (size_t)i) * 2 +
           (size_t)(k & 1);
}

void kwk_bf16t_pack_rows(void *data, int64_t rows, int64_t cols, int64_t b, const float *src,
                         long ld)
{
    int64_t nk = kwk_bf16t_chunks(cols);
    uint16_t *h = data;
    int n = (int)KWK_MIN((int64_t)KWK_BF16T_ROWS, rows - b * KWK_BF16T_ROWS);
    memset(h + half_at(nk, b, 0, 0), 0, (size_t)nk * KWK_BF16T_TILE_BYTES);
    for (int i = 0; i < n; i++)
        for (int64_t k = 0; k < cols; k++) {
            uint32_t u;
            memcpy(&u, src + (size_t)i * (size_t)ld + k, sizeof u);
            h[half_at(nk, b, i, k)] = (uint16_t)(u >> 16);
        }
}

void kwk_bf16t_mat_row(const struct kwk_mat *w, int64_t r, float *out)
{
    const uint16_t *h = w->data;
    int64_t nk = kwk_bf16t_chunks(w->cols), b = r / KWK_BF16T_ROWS;
    for (int64_t k = 0; k < w->cols; k++)
        out[k] = kwk_bf16_to_f32(h[half_at(nk, b, (int)(r % KWK_BF16T_ROWS), k)]);
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* v rounded to bf16 (nearest even) by integer arithmetic, as amx_bf16.c's bf16_round (a NaN's
 * result is the caller's). */
static float bf16_round(float v)
{
    uint32_t u = bits_of(v);
    u += (u >> 16 & 1u) + 0x7fffu;
    return from_bits(u & 0xffff0000u);
}

static float high_half(float v)
{
    return from_bits(bits_of(v) & 0xffff0000u);
}

void kwk_bf16t_split(float x, float part[3])
{
    float a = isnan(x) ? NAN : bf16_round(x);
    float r = fabsf(a) < INFINITY ? x - a : 0.0f; /* an inf - inf would make an inf's product NaN */
    float b = bf16_round(r);
    part[0] = high_half(a);
    part[1] = high_half(b);
    part[2] = high_half(r - b);
}

/* Below float's normal range: zero of its sign (MXCSR's DAZ for inputs, FTZ for results). */
static float flush(float v)
{
    return v != 0.0f && fabsf(v) < FLT_MIN ? copysignf(0.0f, v) : v;
}

static float fma_flushed(float a, float b, float c)
{
    return flush(fmaf(flush(a), flush(b), flush(c)));
}

static float add_flushed(float a, float b)
{
    return flush(flush(a) + flush(b));
}

void kwk_bf16t_matmul_ref(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                          int64_t r0, int64_t r1)
{
    int64_t cols = w->cols, nk = kwk_bf16t_chunks(cols);
    const uint16_t *h = w->data;
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (size_t)t * (size_t)cols;
        for (int64_t r = r0; r < r1; r++) {
            int64_t b = r / KWK_BF16T_ROWS;
            int i = (int)(r % KWK_BF16T_ROWS);
            float C[3] = {0.0f, 0.0f, 0.0f};
            for (int64_t c = 0; c < nk; c++) {
                float e[3] = {0.0f, 0.0f, 0.0f}, o[3] = {0.0f, 0.0f, 0.0f};
                for (int p = 0; p < 16; p++) {
                    int64_t k = c * KWK_BF16T_CHUNK + 2 * p;
                    float pe[3] = {0.0f, 0.0f, 0.0f}, po[3] = {0.0f, 0.0f, 0.0f};
                    if (k < cols)
                        kwk_bf16t_split(xt[k], pe);
                    if (k + 1 < cols)
                        kwk_bf16t_split(xt[k + 1], po);
                    /* the pack holds zeros past the columns */
                    float we = kwk_bf16_to_f32(h[half_at(nk, b, i, k)]);
                    float wo = kwk_bf16_to_f32(h[half_at(nk, b, i, k + 1)]);
                    for (int s = 0; s < 3; s++) {
                        e[s] = fma_flushed(we, pe[s], e[s]);
                        o[s] = fma_flushed(wo, po[s], o[s]);
                    }
                }
                for (int s = 0; s < 3; s++)
                    C[s] = add_flushed(C[s], add_flushed(e[s], o[s]));
            }
            y[(int64_t)t * ldy + r] = (C[0] + C[1]) + C[2];
        }
    }
}
