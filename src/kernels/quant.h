/* quant.h - the quantized weight formats (int8 "balanced", int4, int6) as block structs,
 * packing from float rows, activation quantization, and the quantized matmul of each
 * instruction set.
 * Pure functions of their arguments: any thread, concurrently.
 *
 * All formats interleave 16 rows so that one 64-byte vector holds 4 consecutive columns of each
 * of 16 rows: a dot-product instruction (vpdpbusd, or maddubs + madd) then adds 4 products into
 * the 32-bit lane of each row, and a group of columns ends with 16 row sums in one register, with
 * no horizontal reduction. Rows are padded with zero rows to a multiple of 16 and columns with
 * zero columns to a multiple of the group. A matrix is [n_row_blocks][n_groups] blocks, each row
 * block's groups contiguous, so a thread that owns a range of rows streams one contiguous range.
 *
 * Activations are quantized on the fly, per token and per group of the weight's group size, to
 * 16-bit integers v with one float scale d_x = amax / 32258 (symmetric), held as two int8
 * halves v = 254 * h + l: h = round(x * 127 / amax) is the int8 quantization, l (in [-127, 127])
 * its rounding residual in 1/254 of a step. Every int8 dot-product instruction then serves
 * 16-bit activations with two passes over the same weight registers, and the integers combine
 * exactly: isum = 254 * isum_h + isum_l. Measured on SmolLM2-135M (wikitext-2, 20 chunks):
 * 8-bit activations alone cost about 0.5% perplexity, more than the int8 weights. Within a group
 * the product is an exact integer dot product; groups are combined in float:
 *   int8:  y = sum_g (float)isum_g * (d_w * d_x)
 *   int4:  y = sum_g [(float)isum_g * (d_w * d_x) + m_w * (d_x * (float)sum_v_g)]
 *   int6:  as int8
 * with isum_g = sum_k q_w[k] * v[k] over the group (q_w in [-127,127] for int8, [0,15] for
 * int4, whose weight is d_w * q_w + m_w, [-32,31] for int6). quant_ref.c states this in plain
 * C; the SIMD kernels compute the same integers and differ only in the rounding of the float
 * sums.
 *
 * 8-bit activations (kwk_mat.act8 = 1): the same quantization with every low half taken as
 * zero, v = 254 * h (l = 0, xs = 254 * sum(h), d_x unchanged), so every integer above is
 * exactly 254 times that of the h pass alone: the reference zeroes xl and recomputes xs after
 * kwk_quant_act, and the SIMD kernels run one int8 pass (one vpdpbusd, or one maddubs + madd,
 * per weight vector and token instead of two) and fold the 254 into the float scale,
 *   y = sum_g (float)isum_h_g * (d_w * (254 * d_x))   [+ m_w * (d_x * (float)xs_g) for int4]
 * which agrees with the reference to float rounding (bit for bit where 254 * isum_h_g is a
 * float, |254 * isum_h_g| <= 2^24). The integers isum_h_g are exact as in the 16-bit mode. */
#ifndef KWK_QUANT_H
#define KWK_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* Changing a block struct, a group size, the row interleaving or the numbers packing computes
 * must bump KWK_PACK_FORMAT_VERSION (runtime/packcache.h), or cached pack files stay in use. */

/* Rows interleaved per block. */
#define KWK_QROWS 16
/* Columns per group (one scale per row per group). */
#define KWK_Q8_GROUP 32
#define KWK_Q4_GROUP 32

/* int8: 16 rows x 32 columns, 8.5 bits a weight. q holds w + 128 (w in [-127, 127], so q in
 * [1, 255]): unsigned, the operand type vpdpbusd wants for weights, so activations can be the
 * broadcast signed operand. Groups of 32 rather than 64: measured on SmolLM2-135M, int8
 * activations per 64 columns moved the logits half again as much as per 32 (their outliers). */
struct kwk_q8_block {
    uint16_t d[KWK_QROWS];                         /* [16] row scales, half: w = d * (q - 128) */
    uint8_t q[KWK_Q8_GROUP / 4][KWK_QROWS][4];     /* [col/4][row][col%4] */
};
_Static_assert(sizeof(struct kwk_q8_block) == 32 + 512, "q8 block is 544 bytes");

/* int4: 16 rows x 32 columns, asymmetric: w = d * q + m with q in [0, 15]. Vector c of q holds
 * columns 8c..8c+3 in the low nibbles and 8c+4..8c+7 in the high nibbles, each as [row][col%4]. */
struct kwk_q4_block {
    uint16_t d[KWK_QROWS];                         /* [16] row scales, IEEE half */
    uint16_t m[KWK_QROWS];                         /* [16] row offsets (the group minimum), half */
    uint8_t q[KWK_Q4_GROUP / 8][KWK_QROWS][4];     /* [col/8][row][col%4], two nibbles a byte */
};
_Static_assert(sizeof(struct kwk_q4_block) == 32 + 32 + 256, "q4 block is 320 bytes");

/* int6 (mix_bits=6): 16 rows x 32 columns, 6.5 bits a weight, symmetric: w = d * q with q in
 * [-32, 31], stored as u = q + 32 in [0, 63] (unsigned, vpdpbusd's weight operand, as int8's
 * +128: the kernels take 32 * sum(v) back out). The range is one code longer below zero, so
 * packing gives d the sign that puts the group's largest magnitude at -32: a step of 1/32 of
 * it rather than 1/31 (4% less RMS error on Gaussian rows). Call columns 4s..4s+3 "slice s"
 * (s < 8), one 64-byte vector of [row][col%4]. ql holds the low 4 bits of u exactly as int4's
 * nibbles: slice 2c in the low nibbles of ql[c], slice 2c+1 in its high nibbles. qh holds the
 * high 2 bits, four slices a byte: bits 2(s%4), 2(s%4)+1 of qh[s/4][row][col%4] are bits 4, 5
 * of u in slice s. A vector's high bits are then (qh shifted left by 4 - 2(s%4), right by 2
 * when s%4 = 3) & 0x30: one 16-bit shift (bits that cross into the next byte land outside
 * 0x30) and one and, or'ed onto the nibble; each qh load serves the two ql loads (four slices)
 * that share it. */
#define KWK_Q6_GROUP 32
struct kwk_q6_block {
    uint16_t d[KWK_QROWS];                         /* [16] row scales, half: w = d * (u - 32) */
    uint8_t ql[KWK_Q6_GROUP / 8][KWK_QROWS][4];    /* [col/8][row][col%4], low 4 bits of u */
    uint8_t qh[KWK_Q6_GROUP / 16][KWK_QROWS][4];   /* [col/16][row][col%4], bits 4-5 of u */
};
_Static_assert(sizeof(struct kwk_q6_block) == 32 + 256 + 128, "q6 block is 416 bytes");

/* Group size of a quantized wtype (KWK_W_Q8, KWK_W_Q4, KWK_W_Q6), 0 for any other. */
int kwk_quant_group(int wtype);
/* Bytes of the blocks of a rows x cols matrix in wtype: 0 with -1 on overflow or a bad type. */
int kwk_quant_bytes(int wtype, int64_t rows, int64_t cols, size_t *out);
/* Blocks per row block (groups along the columns, padded). */
int64_t kwk_quant_n_groups(int wtype, int64_t cols);

/* Quantize row block rb (rows 16rb .. 16rb+15, those past `rows` taken as zero) of a matrix into
 * its blocks inside data (the whole matrix's blocks). src holds the block's rows that exist:
 * src[i*ld + k] for i < min(16, rows - 16rb), k < cols. */
void kwk_quant_pack_rows(int wtype, void *data, int64_t rows, int64_t cols, int64_t rb,
                         const float *src, long ld);

/* Packing in three public steps, so that GPTQ (runtime/quantfit.c) quantizes column by column on
 * the grid packing uses: kwk_quant_pack_rows is, bit for bit, kwk_quant_fit on each group of each
 * row, kwk_quant_code on each value and kwk_quant_pack_codes on the result. */

/* The stored parameters packing chooses for one group of one row, w[n] (0 < n <= group): the
 * dequantization of code q is d * q + m (m = 0 for symmetric formats), d and m exactly as the
 * kernels see them (already rounded to half). */
void kwk_quant_fit(int wtype, const float *w, int n, float *d, float *m);
/* The code of value w in a group with parameters d, m: the nearest in the format's range
 * (int8: [-127,127]; int4: [0,15]; int6: [-32,31]). */
int kwk_quant_code(int wtype, float w, float d, float m);
/* Row block rb of a rows x cols matrix from codes and parameters: q[i*ldq + k] the code of
 * row 16rb+i, column k (k < cols), d[i*n_groups + g], m[i*n_groups + g] its group's parameters
 * (as returned by kwk_quant_fit; m ignored by symmetric formats; rows past `rows` are zero). */
void kwk_quant_pack_codes(int wtype, void *data, int64_t rows, int64_t cols, int64_t rb,
                          const int8_t *q, long ldq, const float *d, const float *m);

/* kwk_quant_fit and kwk_quant_code of one group of 16 rows with AVX-512 (F/BW/DQ/VL) or AVX2,
 * bit for bit the scalar results, for kwk_quant_pack_rows (which calls the best kwk_isa()
 * allows): w[16*k + i] column k < n (0 < n <= 32) of row i (rows past the matrix: zeros),
 * d[16], m[16] the rows' parameters, q[16*k + i] the codes. */
void kwk_quant_fit_rows_avx512(int wtype, const float *w, int n, float *d, float *m, int8_t *q);
void kwk_quant_fit_rows_avx2(int wtype, const float *w, int n, float *d, float *m, int8_t *q);

/* Activation quantization of one token: n values of x, padded with zeros to whole groups of
 * `group`: xh and xl [n_groups*group] the int8 halves of v = 254 * xh + xl, xd[n_groups] the
 * scales of v, xs[n_groups] the sums of v. Every kernel uses this rounding (the SIMD ones
 * bit-for-bit). */
#define KWK_QX_SCALE 32258 /* 127 * 254: |v| <= KWK_QX_SCALE */
void kwk_quant_act(const float *x, int64_t n, int group, int8_t *xh, int8_t *xl, float *xd,
                   int32_t *xs);

/* IEEE half conversion used for int4 scales (round to nearest even). */
uint16_t kwk_f32_to_f16(float f);

/* Column passes: every kernel covers the columns in passes of KWK_QX_COLS (a multiple of both
 * groups), each pass's sum added to y in order, so a row's float sums are grouped the same way
 * whatever the number of tokens; SIMD kernels quantize up to KWK_QX_TOKS tokens of a pass at a
 * time into a stack buffer (about 114 KiB). */
#define KWK_QX_COLS 2048
#define KWK_QX_TOKS 24

/* Activations quantized once for every product that reads them: a layer's q, k, v (or gate, up)
 * products and every thread's rows share one quantization instead of each redoing it (about 10%
 * of a prompt's time on SmolLM2-135M). n rows of cols values in caller-owned memory laid out by
 * kwk_qact_init, filled by a table's quant_rows and read by the same table's matmul_q (the
 * numbers kept depend on the table and on the mode: AVX2 and AVX-512 keep the same ones, the
 * scalar table its own). All formats have groups of 32 columns, so one quantization serves
 * every quantized wtype of those columns. */
#define KWK_QACT_GROUP 32
_Static_assert(KWK_Q8_GROUP == KWK_QACT_GROUP && KWK_Q4_GROUP == KWK_QACT_GROUP &&
                   KWK_Q6_GROUP == KWK_QACT_GROUP,
               "one activation quantization serves every format");
struct kwk_qact {
    int64_t cols;
    int act8;   /* 8-bit activations (kwk_mat.act8) */
    long ldh;   /* bytes between rows of h and l: cols padded to whole groups */
    long ldg;   /* entries between rows of d, s and m: the groups */
    int8_t *h;  /* [n][ldh] high halves of v = 254 h + l, zero past cols */
    int8_t *l;  /* [n][ldh] low halves (16-bit mode; the scalar table's 8-bit mode: zeros) */
    float *d;   /* [n][ldg] d_x; SIMD 8-bit mode: 254 * d_x */
    int32_t *s; /* [n][ldg] sum of v; SIMD 8-bit mode: sum of h */
    float *m;   /* [n][ldg] SIMD 8-bit mode: d_x * (float)(254 * sum of h) */
};
/* Bytes kwk_qact_init wants for n rows of cols columns (64-byte aligned memory). */
size_t kwk_qact_bytes(int64_t cols, int n);
/* Lay out qa in mem for n rows of cols columns in the given mode. */
void kwk_qact_init(struct kwk_qact *qa, void *mem, int64_t cols, int n, int act8);
/* qa seen from row t and group g: row 0, column 0 and group 0 of the result are those. */
struct kwk_qact kwk_qact_at(const struct kwk_qact *qa, long t, int64_t g);

/* One token block's activations over one column pass, quantized on the fly by a SIMD matmul
 * into its stack (kwk_qx_view: the same seen as a kwk_qact). With 8-bit activations l is not
 * written and d, s, m hold the SIMD 8-bit numbers. */
struct kwk_qx {
    int8_t q[KWK_QX_TOKS][KWK_QX_COLS];                   /* high halves h of v = 254 h + l */
    int8_t l[KWK_QX_TOKS][KWK_QX_COLS];                   /* low halves (16-bit mode only) */
    float d[KWK_QX_TOKS][KWK_QX_COLS / KWK_QACT_GROUP];   /* d_x; a8: 254 * d_x */
    int32_t s[KWK_QX_TOKS][KWK_QX_COLS / KWK_QACT_GROUP]; /* sum of v; a8: sum of h */
    float m[KWK_QX_TOKS][KWK_QX_COLS / KWK_QACT_GROUP];   /* a8: d_x * (float)(254 * sum of h) */
};
struct kwk_qact kwk_qx_view(struct kwk_qx *b, int64_t cols, int act8);

/* The tables' quant_rows and matmul_q (contract in kernels.h). */
void kwk_quant_rows_ref(const float *x, const struct kwk_qact *qa, int t0, int t1);
void kwk_quant_matmul_q_ref(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok, float *y,
                            long ldy, int64_t r0, int64_t r1);
void kwk_quant_rows_avx2(const float *x, const struct kwk_qact *qa, int t0, int t1);
void kwk_quant_matmul_q_avx2(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok,
                             float *y, long ldy, int64_t r0, int64_t r1);
/* The AVX2 kernels with AVX-VNNI (avxvnni_quant.c): the same numbers; the AVX2 entries call them
 * when kwk_cpu_avxvnni(). Only on a CPU with AVX-VNNI. */
void kwk_quant_matmul_avxvnni(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                              long ldy, int64_t r0, int64_t r1);
void kwk_quant_matmul_q_avxvnni(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok,
                                float *y, long ldy, int64_t r0, int64_t r1);
void kwk_quant_rows_avx512(const float *x, const struct kwk_qact *qa, int t0, int t1);
void kwk_quant_matmul_q_avx512(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok,
                               float *y, long ldy, int64_t r0, int64_t r1);

/* The table entries for quantized wtypes (contract of kwk_kernels.matmul / mat_row). */
void kwk_quant_matmul_ref(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                          int64_t r0, int64_t r1);
void kwk_quant_mat_row_ref(const struct kwk_mat *w, int64_t r, float *out);
void kwk_quant_matmul_avx2(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                           int64_t r0, int64_t r1);
/* AVX-512 VNNI; on an AVX-512 CPU without VNNI it runs the AVX2 kernel. Where kwk_cpu_amx(),
 * prompts' whole 16-token tiles run on AMX (amx_quant.c), to the same numbers. */
void kwk_quant_matmul_avx512(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                             long ldy, int64_t r0, int64_t r1);
/* The AVX-512 entries with AMX allowed (amx 1: where kwk_cpu_amx()) or not (0), so that tests
 * compare the two on one CPU. */
void kwk_quant_matmul_avx512_amx(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                                 long ldy, int64_t r0, int64_t r1, int amx);
void kwk_quant_matmul_q_avx512_amx(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok,
                                   float *y, long ldy, int64_t r0, int64_t r1, int amx);

#endif
