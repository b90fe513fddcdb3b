/* amx_attn.h - the tile multiplies of the AMX attention table (kwk_attn_amx_bf16, whose tiles
 * live in avx512_attn.c): key blocks' scores and weighted values, in bf16 products summed in
 * float. Include only from files compiled with AVX-512; call only where
 * kwk_cpu_amx_bf16(), between kwk_attn_amx_begin() and kwk_attn_amx_end() on the same thread. */
#ifndef KWK_AMX_ATTN_H
#define KWK_AMX_ATTN_H

#include <stdint.h>

/* Loads the tile configuration of the functions below; releases the tile state. */
void kwk_attn_amx_begin(void);
void kwk_attn_amx_end(void);

/* s[u * 16 + x] = the dot product of key u (bf16 row k + u * ldk, hd elements) and query x
 * (qt[p * 16 + x]: elements 2p, 2p + 1 of query x as a pair of bf16), for nb blocks of 16 keys
 * (nb 1..4, 16 * nb keys) and 16 queries; hd a multiple of 32. Each sum runs over the
 * 32-element chunks in order and depends only on its key and query, never on the others. */
void kwk_attn_amx_scores(const uint32_t *qt, const uint16_t *k, long ldk, int hd, int nb,
                         float *s);

/* The weighted values of 16 queries x and 32 * nch elements (nch 1 or 2), over keys j < nk (a
 * multiple of 16): acc[2c][x * 16 + n] += sum over j of w(x, j) * v(j, 32c + 2n), and
 * acc[2c + 1][...] the same of element 32c + 2n + 1. v(j, e) = v[j * ldv + e], bf16 rows; the
 * weight w(x, j) rounded to bf16 is given twice, rows ldw apart: wo[x * ldw + j] as a float (its
 * bf16 in the high half) and we[...] with it in the low half (its bits >> 16); every weight of
 * keys a query does not attend zero. Each sum runs over the 16-key blocks in order, from acc
 * (read and written as 16 x 16 floats), or from zero if fresh (acc then written only: a tile
 * load right after the stores of zeros would wait for them). */
void kwk_attn_amx_values(const float *wo, const float *we, long ldw, const uint16_t *v, long ldv,
                         int nch, int nk, int fresh, float (*acc)[256]);

#endif
