/* ab.h - two variants of the code measured against each other inside one process, token by
 * token (build option KWK_AB, which defines KWK_AB_TIMING; for experiments only, off in every
 * normal build).
 *
 * Interleaved processes see the host's bandwidth flip between them (docs/benchmarks.md, sessions
 * 18-21); alternating the variant every evaluation does not. With -DKWK_AB=ON,
 * kwk_decoder_eval turns variant KWKER_AB_VARIANT=v on for every other call, counting one-token
 * calls (decode) and longer ones (prompt) apart, times both halves, and prints at exit, per
 * kind, the time a token with the variant divided by the time without, as a ratio of the sums
 * and of the per-call medians (a neighbour's burst moves a sum more). A kind's first call is a
 * warm-up (first touches of the weights and the cache): it runs without the variant, untimed. Code under test asks
 * KWK_AB(v), e.g. `if (KWK_AB(1)) prefetch = 0;`; variant 0 changes nothing (the null test).
 * Without the option KWK_AB(v) is the constant 0. The flag is written by the evaluating thread
 * before it hands work to the pool (whose run is the synchronization) and read by any thread. */
#ifndef KWK_BASE_AB_H
#define KWK_BASE_AB_H

#ifdef KWK_AB_TIMING
extern int kwk_ab_variant; /* KWKER_AB_VARIANT, read at the first evaluation */
extern int kwk_ab_turn;    /* 1 while the variant is on */
#define KWK_AB(v) (kwk_ab_turn && kwk_ab_variant == (v))
/* Around one evaluation of n tokens: start picks this call's side, stop adds its time. */
double kwk_ab_start(int n);
void kwk_ab_stop(int n, double t0);
#else
#define KWK_AB(v) 0
#endif

#endif
