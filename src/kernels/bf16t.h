/* bf16t.h - bf16 weights packed as AMX-BF16 B tiles (KWK_W_BF16T): the layout preserve packs
 * where its products run on AMX (kwk_cpu_amx_preserve), and the order every table sums it in.
 *
 * Why: preserve's exact products on AMX (amx_bf16.c) read a row-major matrix in place as A
 * tiles of 16 strided rows, and a decode step, on the vector engine, transposes every 64 bytes
 * of 16 rows in registers (a third of its work) and reads 16 streams; so a generated token ran
 * at 0.73-0.97 of the vector tables' speed and AMX was not preserve's default (sessions 28-31,
 * docs/benchmarks.md). Stored so that each 1 KiB is one B tile whose columns are 16 weight
 * rows, a block of 16 rows is one contiguous stream, prompts and decode steps take the weights
 * as B and the activation parts as A, both contiguous tile loads (a generated token about as
 * fast as on the vector tables, session 32), and a vector engine loads "pair p of 16 rows" as
 * one vector with nothing to transpose. The products commute, so the sums stay the tile
 * unit's.
 *
 * Layout: data is [ceil(rows/16)][ceil(cols/32)][16][16] uint32_t. Block b, chunk c, word
 * [p][i] holds row 16b+i's columns 32c+2p (low half) and 32c+2p+1 (high half) as bf16; rows and
 * columns past the matrix are 0.
 *
 * Sum order (every table, bitwise up to NaN payloads): the tile unit's (amx_bf16.c says how it
 * was established). Each x[t][k] is split into three bf16 parts x1 = bf16(x) (nearest even),
 * x2 = bf16(x - x1), x3 = x - x1 - x2 (kwk_bf16t_split; an infinite or NaN x1 gets zero parts).
 * For each part s and chunk c in order: e = o = +0, then for p = 0..15 e = fma(w[r][32c+2p],
 * xs[32c+2p], e) and o = fma(w[r][32c+2p+1], xs[32c+2p+1], o), then C_s = C_s + (e + o), every
 * operation with inputs and results below float's normal range flushed to zero of their sign
 * (DAZ, FTZ); columns past the matrix are zero in both. y[t][r] = (C_1 + C_2) + C_3 in plain
 * float. One token or many, any row range: the same numbers (kernels.h's batch invariance). */
#ifndef KWK_BF16T_H
#define KWK_BF16T_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

#define KWK_BF16T_ROWS 16 /* rows a block (a B tile's columns) */
#define KWK_BF16T_CHUNK 32 /* columns a chunk (a tile multiply's 16 pairs) */
#define KWK_BF16T_TILE_BYTES 1024 /* one block's chunk: [16 pairs][16 rows] x 2 bf16 */

/* A one-token product on the vector engine (where AMX-BF16 is not in use) reads a thread's
 * blocks as this many runs side by side (amx_bf16t.c; kwk_mat_decode_spans). On tiles it
 * reads them in order, four blocks at a time. */
#define KWK_BF16T_DEC_RUNS 2

/* Chunks a row of cols columns takes. */
static inline int64_t kwk_bf16t_chunks(int64_t cols)
{
    return (cols + KWK_BF16T_CHUNK - 1) / KWK_BF16T_CHUNK;
}

/* Bytes of a rows x cols matrix packed so; -1 (and 0) on overflow or a negative size. */
int kwk_bf16t_bytes(int64_t rows, int64_t cols, size_t *out);
/* Block b (rows 16b .. 16b+15) of a rows x cols matrix into data (the whole matrix's blocks)
 * from float rows src[i*ld + k] (i < min(16, rows - 16b)), each exactly a bf16 value (the low 16
 * bits of each float are dropped; the rest of the block is zero). */
void kwk_bf16t_pack_rows(void *data, int64_t rows, int64_t cols, int64_t b, const float *src,
                         long ld);
/* x's three bf16 parts as floats (low halves zero), as the sum order above defines them. */
void kwk_bf16t_split(float x, float part[3]);

/* The tables' matmul and mat_row for KWK_W_BF16T (kernels.h's contract): the scalar
 * specification (the scalar and AVX2 tables' matmul: preserve packs this layout only for the
 * AVX-512 table), and the AVX-512 kernels (amx_bf16t.c: AMX tiles for prompts where
 * kwk_cpu_amx_bf16(), AVX-512 FMAs computing the same sums otherwise). */
void kwk_bf16t_matmul_ref(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                          int64_t r0, int64_t r1);
void kwk_bf16t_mat_row(const struct kwk_mat *w, int64_t r, float *out);
void kwk_bf16t_matmul_avx512(const struct kwk_mat *w, const float *x, int n_tok, float *y,
                             long ldy, int64_t r0, int64_t r1);

/* Tests only: 1 makes kwk_bf16t_matmul_avx512 run every call on the vector engine (what it
 * runs where AMX-BF16 is not in use), 0 restores. Not thread safe. */
void kwk_bf16t_test_vector(int on);

#endif
