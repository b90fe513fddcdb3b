/* amx_bf16.h - preserve's products of bf16 weights on AMX-BF16 (amx_bf16.c). Include only from
 * files compiled with AVX-512; call only where kwk_cpu_amx_bf16()
 * (the AVX-512 table does where kwk_cpu_amx_preserve()). */
#ifndef KWK_AMX_BF16_H
#define KWK_AMX_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* kwk_kernels.matmul for a KWK_W_BF16 matrix: y[t * ldy + r] = sum_k w[r][k] * x[t][k], every
 * product exact (x split into three bf16 parts), for t < n_tok and r in [r0, r1). Batch
 * invariant as kernels.h asks: a (row, token) sum depends only on that row and that token. */
void kwk_bf16_matmul_amx(const struct kwk_mat *w, const float *x, int n_tok, float *y, long ldy,
                         int64_t r0, int64_t r1);

/* The calling thread's staging buffer, at least bytes long (64-byte aligned), kept and grown
 * across calls and freed when the thread ends; NULL when it cannot be had (the caller then
 * stages piece by piece) or under kwk_bf16_amx_test_no_scratch. Valid until the thread's next
 * call of it. */
void *kwk_amx_stage(size_t bytes);

/* Tests only: 1 makes every call stage chunk by chunk, as when its staging buffer cannot be
 * allocated (the same numbers); 0 restores. Not thread safe. */
void kwk_bf16_amx_test_no_scratch(int on);
/* Tests only: 1 makes every call take the tile engine, also a decode step's (one token), which
 * otherwise takes the vector engine (AVX-512 FMAs computing the tile unit's sums); 0 restores.
 * Not thread safe. */
void kwk_bf16_amx_test_engine(int tiles_only);
/* Tests only: the columns w's chunk 0 holds before column 0 (0-31): chunk 1 starts at column
 * 32 - lead, on a 64-byte boundary of every row when it is not 0. */
int64_t kwk_bf16_amx_test_lead(const struct kwk_mat *w);
/* Tests only: rows from this many columns get a head chunk (so that small matrices exercise
 * it); 0 restores the default. Not thread safe. */
void kwk_bf16_amx_test_head_cols(int64_t cols);

#endif
