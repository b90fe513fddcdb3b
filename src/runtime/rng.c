/* rng.c - Philox4x32-10, the counter-based generator behind sampling draws. Pure functions: any
 * thread.
 *
 * Counter-based because a draw must be a function of (seed, position) alone: the same seed gives
 * the same text whatever the thread count, batching or speculation, and no generator state has to
 * be saved, copied or rewound. Philox is the published, BigCrush-clean choice (Random123, also in
 * TensorFlow/JAX/cuRAND), with known-answer vectors that tests/c/test_sample.c checks. */
#include "base/base.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u /* golden ratio */
#define PHILOX_W1 0xBB67AE85u /* sqrt(3) - 1 */

static void philox_round(uint32_t ctr[4], const uint32_t key[2])
{
    uint64_t p0 = (uint64_t)PHILOX_M0 * ctr[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * ctr[2];
    uint32_t c0 = (uint32_t)(p1 >> 32) ^ ctr[1] ^ key[0];
    uint32_t c2 = (uint32_t)(p0 >> 32) ^ ctr[3] ^ key[1];

    ctr[1] = (uint32_t)p1;
    ctr[3] = (uint32_t)p0;
    ctr[0] = c0;
    ctr[2] = c2;
}

/* The raw cipher on a 128-bit counter and a 64-bit key (Random123's word order). */
static void philox4x32_10(const uint32_t in[4], const uint32_t key_in[2], uint32_t out[4])
{
    uint32_t ctr[4] = {in[0], in[1], in[2], in[3]};
    uint32_t key[2] = {key_in[0], key_in[1]};

    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            key[0] += PHILOX_W0;
            key[1] += PHILOX_W1;
        }
        philox_round(ctr, key);
    }
    for (int i = 0; i < 4; i++)
        out[i] = ctr[i];
}

void kwk_rng_block(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t out[4])
{
    uint32_t ctr[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};

    philox4x32_10(ctr, key, out);
}

double kwk_rng_u01(uint64_t seed, uint64_t stream, uint64_t counter)
{
    uint32_t w[4];

    kwk_rng_block(seed, stream, counter, w);
    /* 53 bits: every double in [0, 1) on the 2^-53 grid, never 1. */
    uint64_t bits = (((uint64_t)w[0] << 32) | w[1]) >> 11;
    return (double)bits * 0x1.0p-53;
}
