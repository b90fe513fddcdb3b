/* kernels.h - the compute kernels as a table of function pointers, one table per instruction set.
 * ref.c is the specification (plain C); avx2.c and avx512.c must agree with it to float rounding.
 * Kernels are pure functions of their arguments: any thread may call them concurrently. */
#ifndef KWK_KERNELS_H
#define KWK_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Element types of weights the kernels read. Values reach no file: internal only. */
enum kwk_wtype {
    KWK_W_F32 = 0,
    KWK_W_F16 = 1,
    KWK_W_BF16 = 2,
    KWK_W_COUNT, /* the plain types above: data is [rows][cols] elements */
    /* Packed block formats (kernels/quant.h): data is [rows/16][cols/group] blocks. Kept out of
     * KWK_W_COUNT so loops over the plain types stay as they are. */
    KWK_W_Q8 = 16, /* int8 with a half scale per 32 columns ("balanced") */
    KWK_W_Q4 = 17, /* int4 with a half scale and offset per 32 columns */
    KWK_W_Q6 = 18, /* int6 with a half scale per 32 columns (mix_bits=6) */
    /* bf16 in 16-row panels (kernels/panel.h): data is [rows/16][cols][16] halves. */
    KWK_W_BF16P = 19,
    /* bf16 in AMX-BF16 B tiles (kernels/bf16t.h): data is [rows/16][cols/32][16][16] pairs. */
    KWK_W_BF16T = 20
};

/* A weight matrix: rows x cols, row-major ([rows][cols]), borrowed (mmapped or model-owned).
 * y = W x computes one output per row. Rows are split across threads. */
struct kwk_mat {
    int wtype;        /* enum kwk_wtype */
    int64_t rows;     /* d_out */
    int64_t cols;     /* d_in */
    const void *data; /* [rows][cols] of wtype */
    /* Quantized wtypes only: 1 = activations at 8 bits (the low halves of quant.h's 16-bit
     * activations taken as zero: one int8 pass instead of two, llama.cpp's precision, for
     * speed); 0 = 16 bits. Ignored by the plain types. Last, so {wt, rows, cols, data}
     * initializers would leave it 0, but -Wextra wants designated ones. */
    int act8;
    /* Where a decode step's software prefetches of these weights go: 0 as the CPU's default
     * (kwk_cpu_prefetch_l2), 1 L1, 2 L2; a pack chooses for its matrices from the bytes a token
     * reads (kwk_cpu_prefetch_l2_for). */
    int prefetch;
};

struct kwk_qact; /* kernels/quant.h */

/* geglu's constants, 2 sqrt(2/pi) and 2 sqrt(2/pi) 0.044715: gelu_tanh(x) = x / (1 + exp(-x (A +
 * B x^2))), every table rounding A + (B x) x without an FMA, as ref.c does. */
#define KWK_GELU_A 1.5957691216057308f
#define KWK_GELU_B 0.07135481627159862f

struct kwk_kernels {
    const char *name;
    /* y[t*ldy + r] = sum_k w[r][k] * x[t*cols + k] for t in [0,n_tok), r in [r0,r1).
     * Sums in float32. x is n_tok rows of cols floats (contiguous).
     * Batch invariance: y[t][r] is bitwise the same for any n_tok, t and [r0,r1) containing r
     * (within one table), so a token's logits do not depend on what it was batched with. */
    void (*matmul)(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                   int64_t r0, int64_t r1);
    /* Quantized wtypes: matmul in two steps, so that products sharing their input quantize it
     * once (struct kwk_qact, kernels/quant.h). quant_rows fills rows [t0, t1) of qa from x (row
     * t at x + t * qa->cols); matmul_q is matmul on rows [0, n_tok) of qa, for any quantized w
     * with w->cols == qa->cols and w->act8 == qa->act8, with bitwise matmul's results. Rows
     * filled on one thread may be read on others after a barrier. */
    void (*quant_rows)(const float *x, const struct kwk_qact *qa, int t0, int t1);
    void (*matmul_q)(const struct kwk_mat *w, const struct kwk_qact *qa, int n_tok, float *y,
                     long ldy, int64_t r0, int64_t r1);
    /* out[cols] = float32 values of row r of w. */
    void (*mat_row)(const struct kwk_mat *w, int64_t r, float *out);
    /* sum_i a[i]*b[i] */
    float (*dot)(const float *a, const float *b, long n);
    /* y[i] += a * x[i] */
    void (*axpy)(float *y, float a, const float *x, long n);
    /* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]  (w may be NULL: no scale). y may equal x. */
    void (*rmsnorm)(float *y, const float *x, const float *w, long n, float eps);
    /* x[i] = exp(x[i] - max) / sum, in place */
    void (*softmax)(float *x, long n);
    /* g[i] = silu(g[i]) * u[i] */
    void (*swiglu)(float *g, const float *u, long n);
    /* g[i] = gelu_tanh(g[i]) * u[i] (Gemma's MLP). PyTorch's 0.5 x (1 + tanh(y)), y = sqrt(2/pi)
     * (x + 0.044715 x^3), is computed as its equal x / (1 + exp(-2y)): SiLU's form, so the tables
     * share their exp, and no 1 + tanh cancels where x is negative. */
    void (*geglu)(float *g, const float *u, long n);
    /* x[i] = x[i] Phi(x[i]) = x (1 + erf(x / sqrt2)) / 2: the exact GELU (BERT's "gelu"), ref.c
     * through erff, the SIMD tables through kernels/gelu_erf.h's polynomials (a few roundings
     * from it). */
    void (*gelu)(float *x, long n);
    /* y[i] = kwk_f32_to_f16(x[i]) (kernels/quant.h): nearest even, +-65504 beyond it, NaN as
     * sign | 0x7e00. The half KV cache's stores. */
    void (*to_half)(uint16_t *y, const float *x, long n);
    /* y[i] = kwk_f16_to_f32(x[i]) (exact). */
    void (*from_half)(float *y, const uint16_t *x, long n);
    /* 1: preserve packs bf16 matrices into panels (KWK_W_BF16P), which this table multiplies
     * faster than row-major bf16. Every table multiplies either layout. */
    int bf16_panels;
    /* A one-token product of a plain or panel matrix reads the rows [r0, r1) it is given as
     * this many runs of consecutive rows (16-row panels for KWK_W_BF16P) side by side, run i
     * from r0 + i * floor((r1 - r0) / dec_runs) (in rows, or panels); 1: in order. Quantized
     * matrices are read in order by every table. See kwk_mat_decode_spans. */
    int dec_runs;
};

/* 1 where a decode step prefetches w's weights into L2, 0 into L1: kwk_mat.prefetch, or where
 * it is 0 the CPU's default (kwk_cpu_prefetch_l2, base.h). */
int kwk_mat_prefetch_l2(const struct kwk_mat *w);

/* A decode tile's software prefetch of weights it reads soon: into L2 (pf_l2, PREFETCHT1) or L1
 * (PREFETCHT0), as kwk_mat_prefetch_l2 says; the caller reads that once a call, since the hint
 * must be a constant. */
static inline __attribute__((always_inline)) void kwk_prefetch(const void *p, int pf_l2)
{
    if (pf_l2)
        __builtin_prefetch(p, 0, 2);
    else
        __builtin_prefetch(p, 0, 3);
}

/* kwk_prefetch of every 64-byte line of [p, p + n). */
static inline __attribute__((always_inline)) void kwk_prefetch_bytes(const void *p, size_t n,
                                                                     int pf_l2)
{
    for (size_t l = 0; l < n; l += 64)
        kwk_prefetch((const char *)p + l, pf_l2);
}

/* Where rows [r0, r1) of w lie in memory: every layout keeps a range of rows contiguous (the
 * blocked ones, rows of 16, when r0 and r1 are multiples of 16 or r1 is the last row). Returns
 * 0 and sets *p, *n; -1 for a range it cannot place (bad type or bounds, a block cut). */
int kwk_mat_rows_span(const struct kwk_mat *w, int64_t r0, int64_t r1, const void **p,
                      size_t *n);

/* The memory a one-token product of table k over rows [r0, r1) of w reads first: one span a run
 * it reads side by side (kwk_kernels.dec_runs; one for quantized matrices), each the first
 * budget / runs bytes of its run, at most max spans. Returns their count (0 for a range
 * kwk_mat_rows_span refuses). What a thread can ask for ahead of the product. */
int kwk_mat_decode_spans(const struct kwk_kernels *k, const struct kwk_mat *w, int64_t r0,
                         int64_t r1, size_t budget, const void **p, size_t *n, int max);

/* 1: table k multiplies w's prompts on AMX tiles (the AVX-512 table where kwk_cpu_amx(): int8
 * tiles for quantized matrices; where kwk_cpu_amx_preserve(): bf16 tiles for row-major bf16),
 * whose kernels stage each thread's tokens themselves (the prompt planner's token split, and the
 * bf16 decode's read order, follow it). */
int kwk_mat_amx(const struct kwk_kernels *k, const struct kwk_mat *w);

/* The layout preserve packs bf16 matrices into for table k, where it packs (a pack cache):
 * KWK_W_BF16P for the AVX2 table's panels, KWK_W_BF16T where the AVX-512 table's products run on
 * AMX-BF16 (kwk_cpu_amx_preserve_pack), else KWK_W_BF16 (the checkpoint's rows, read in place). */
int kwk_preserve_wtype(const struct kwk_kernels *k);

/* The table for an ISA (enum kwk_isa); falls back to the best lower one compiled in. */
const struct kwk_kernels *kwk_kernels_for(int isa);
/* The table for kwk_isa(): detected once. */
const struct kwk_kernels *kwk_kernels(void);

/* Per-ISA tables (defined in ref.c, avx2.c, avx512.c). */
extern const struct kwk_kernels kwk_kernels_ref;
extern const struct kwk_kernels kwk_kernels_avx2;
extern const struct kwk_kernels kwk_kernels_avx512;

#endif
