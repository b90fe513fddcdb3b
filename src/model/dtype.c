/* dtype.c - tensor element types: block sizes and the scalar dequantizers of the ggml block
 * formats (bit-identical to ggml's dequantize_row_* and gguf.quants.dequantize). Any thread. */
#include <string.h>

#include "model/model.h"

#define QK 32   /* elements per block of the legacy formats (Q4_0 .. Q8_0) */
#define QK_K 256 /* elements per super-block of the k-quants */

struct dtype_info {
    const char *name;
    int block;
    size_t block_bytes;
    int bits; /* of a weight's code, scales and offsets aside */
};

static const struct dtype_info dtypes[KWK_DT_COUNT] = {
    [KWK_DT_F32] = {"F32", 1, 4, 32},
    [KWK_DT_F16] = {"F16", 1, 2, 16},
    [KWK_DT_BF16] = {"BF16", 1, 2, 16},
    [KWK_DT_Q8_0] = {"Q8_0", QK, 2 + QK, 8},
    [KWK_DT_Q4_0] = {"Q4_0", QK, 2 + QK / 2, 4},
    [KWK_DT_Q4_1] = {"Q4_1", QK, 4 + QK / 2, 4},
    [KWK_DT_Q5_0] = {"Q5_0", QK, 2 + 4 + QK / 2, 5},
    [KWK_DT_Q5_1] = {"Q5_1", QK, 4 + 4 + QK / 2, 5},
    [KWK_DT_Q4_K] = {"Q4_K", QK_K, 4 + 12 + QK_K / 2, 4},
    [KWK_DT_Q5_K] = {"Q5_K", QK_K, 4 + 12 + QK_K / 8 + QK_K / 2, 5},
    [KWK_DT_Q6_K] = {"Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, 6},
};

static int dtype_valid(int dtype)
{
    return dtype >= 0 && dtype < KWK_DT_COUNT;
}

const char *kwk_dtype_name(int dtype)
{
    return dtype_valid(dtype) ? dtypes[dtype].name : "?";
}

int kwk_dtype_block(int dtype)
{
    return dtype_valid(dtype) ? dtypes[dtype].block : 0;
}

size_t kwk_dtype_block_bytes(int dtype)
{
    return dtype_valid(dtype) ? dtypes[dtype].block_bytes : 0;
}

int kwk_dtype_bits(int dtype)
{
    return dtype_valid(dtype) ? dtypes[dtype].bits : 0;
}

size_t kwk_dtype_row_bytes(int dtype, int64_t n)
{
    if (!dtype_valid(dtype) || n < 0 || n % dtypes[dtype].block != 0)
        return 0;
    size_t out;
    if (kwk_mul_size((size_t)(n / dtypes[dtype].block), dtypes[dtype].block_bytes, &out))
        return 0;
    return out;
}

/* Files are little-endian; reading byte by byte keeps this right on any host and alignment. */
static inline uint16_t rd16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline float rd_half(const uint8_t *p)
{
    return kwk_f16_to_f32(rd16(p));
}

static void deq_q8_0(const uint8_t *b, float *y)
{
    float d = rd_half(b);
    for (int i = 0; i < QK; i++)
        y[i] = (float)(int8_t)b[2 + i] * d;
}

/* Low nibbles hold elements 0..15, high nibbles 16..31. */
static void deq_q4_0(const uint8_t *b, float *y)
{
    float d = rd_half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)((qs[j] & 0x0f) - 8) * d;
        y[j + QK / 2] = (float)((qs[j] >> 4) - 8) * d;
    }
}

static void deq_q4_1(const uint8_t *b, float *y)
{
    float d = rd_half(b), m = rd_half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = (float)(qs[j] & 0x0f) * d + m;
        y[j + QK / 2] = (float)(qs[j] >> 4) * d + m;
    }
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

/* qh bit j is the fifth bit of element j. */
static void deq_q5(const uint8_t *qhp, const uint8_t *qs, int offset, float d, float m, int has_m,
                   float *y)
{
    uint32_t qh = rd32(qhp);
    for (int j = 0; j < QK / 2; j++) {
        int x0 = (int)((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4)) - offset;
        int x1 = (int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - offset;
        if (has_m) {
            y[j] = (float)x0 * d + m;
            y[j + QK / 2] = (float)x1 * d + m;
        } else {
            y[j] = (float)x0 * d;
            y[j + QK / 2] = (float)x1 * d;
        }
    }
}

/* The 12 scale bytes pack 8 six-bit scales and 8 six-bit mins. */
static void k_scale_min(const uint8_t *q, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *mn = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Q4_K and Q5_K share the layout of scales; qh is NULL for Q4_K. Sub-block s (32 elements)
 * reads the low (even s) or high (odd s) nibbles of the 32-byte chunk s/2. */
static void deq_k45(const uint8_t *b, const uint8_t *qh, const uint8_t *qs, float *y)
{
    float d = rd_half(b), dmin = rd_half(b + 2);
    const uint8_t *scales = b + 4;
    for (int s = 0; s < 8; s++) {
        int sc, mn;
        k_scale_min(scales, s, &sc, &mn);
        float d1 = d * (float)sc, m1 = dmin * (float)mn;
        const uint8_t *chunk = qs + 32 * (s / 2);
        int shift = (s & 1) ? 4 : 0;
        for (int l = 0; l < 32; l++) {
            int q = (chunk[l] >> shift) & 0x0f;
            if (qh)
                q |= ((qh[l] >> s) & 1) << 4;
            y[32 * s + l] = d1 * (float)q - m1;
        }
    }
}

static void deq_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + QK_K / 2;
    const int8_t *sc = (const int8_t *)(b + QK_K / 2 + QK_K / 4);
    float d = rd_half(b + QK_K / 2 + QK_K / 4 + QK_K / 16);
    for (int h = 0; h < 2; h++) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int)((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int)((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

static void deq_block(int dtype, const uint8_t *b, float *y)
{
    switch (dtype) {
    case KWK_DT_Q8_0: deq_q8_0(b, y); break;
    case KWK_DT_Q4_0: deq_q4_0(b, y); break;
    case KWK_DT_Q4_1: deq_q4_1(b, y); break;
    case KWK_DT_Q5_0: deq_q5(b + 2, b + 6, 16, rd_half(b), 0.0f, 0, y); break;
    case KWK_DT_Q5_1: deq_q5(b + 4, b + 8, 0, rd_half(b), rd_half(b + 2), 1, y); break;
    case KWK_DT_Q4_K: deq_k45(b, NULL, b + 16, y); break;
    case KWK_DT_Q5_K: deq_k45(b, b + 16, b + 16 + QK_K / 8, y); break;
    case KWK_DT_Q6_K: deq_q6_k(b, y); break;
    default: break;
    }
}

int kwk_dequant_grid4(int dtype, const void *src, int64_t n, uint8_t *q, float *d, float *m)
{
    if (dtype != KWK_DT_Q4_0 && dtype != KWK_DT_Q4_1 && dtype != KWK_DT_Q4_K)
        return -1;
    const uint8_t *b = src;
    size_t bb = dtypes[dtype].block_bytes;
    if (dtype == KWK_DT_Q4_K) {
        for (int64_t i = 0; i + QK_K <= n; i += QK_K, b += bb) {
            float dk = rd_half(b), dmin = rd_half(b + 2);
            for (int s = 0; s < 8; s++) {
                int sc, mn;
                k_scale_min(b + 4, s, &sc, &mn);
                d[i / QK + s] = dk * (float)sc;
                m[i / QK + s] = -(dmin * (float)mn);
                const uint8_t *chunk = b + 16 + 32 * (s / 2);
                for (int l = 0; l < QK; l++)
                    q[i + QK * s + l] = (chunk[l] >> ((s & 1) ? 4 : 0)) & 0x0f;
            }
        }
        return 0;
    }
    for (int64_t i = 0; i + QK <= n; i += QK, b += bb) {
        float dh = rd_half(b);
        /* Q4_0: d (q - 8) = d q - 8 d, exact in float (a half times 8) */
        d[i / QK] = dh;
        m[i / QK] = dtype == KWK_DT_Q4_0 ? -8.0f * dh : rd_half(b + 2);
        const uint8_t *qs = b + (dtype == KWK_DT_Q4_0 ? 2 : 4);
        for (int j = 0; j < QK / 2; j++) {
            q[i + j] = qs[j] & 0x0f;
            q[i + j + QK / 2] = qs[j] >> 4;
        }
    }
    return 0;
}

void kwk_dequant_row(int dtype, const void *src, float *dst, int64_t n)
{
    const uint8_t *s = src;
    switch (dtype) {
    case KWK_DT_F32:
        memcpy(dst, s, (size_t)n * sizeof(float));
        return;
    case KWK_DT_F16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = kwk_f16_to_f32(rd16(s + 2 * i));
        return;
    case KWK_DT_BF16:
        for (int64_t i = 0; i < n; i++)
            dst[i] = kwk_bf16_to_f32(rd16(s + 2 * i));
        return;
    default:
        break;
    }
    if (!dtype_valid(dtype))
        return;
    int64_t blk = dtypes[dtype].block;
    size_t bb = dtypes[dtype].block_bytes;
    for (int64_t i = 0; i + blk <= n; i += blk, s += bb)
        deq_block(dtype, s, dst + i);
}
