/* test_ab.c - the token-by-token A/B harness (base/ab.h) as the KWK_AB build option compiles it:
 * the variant comes from KWKER_AB_VARIANT, decode and prompt evaluations take turns apart,
 * KWK_AB(v) holds only for the chosen variant on its turns (never on a kind's first call, a
 * warm-up), and each side's tokens, time and per-call times are counted. Normal builds compile
 * ab.c empty, so this file includes it with the option on. */
#include <stdlib.h>

#define KWK_AB_TIMING 1
#include "base/ab.c"

#include "test.h"

int main(void)
{
    setenv("KWKER_AB_VARIANT", "2", 1);
    double t = kwk_ab_start(1); /* first decode call: a warm-up, without the variant, untimed */
    T_EQ(kwk_ab_variant, 2);
    T_TRUE(!KWK_AB(2));
    kwk_ab_stop(1, t);
    T_EQ(toks[0][0] + toks[0][1], 0);
    t = kwk_ab_start(1); /* second decode call: the variant's turn */
    T_TRUE(KWK_AB(2));
    T_TRUE(!KWK_AB(1) && !KWK_AB(0));
    kwk_ab_stop(1, t);
    t = kwk_ab_start(7); /* first prompt call: its own warm-up */
    T_TRUE(!KWK_AB(2));
    kwk_ab_stop(7, t);
    t = kwk_ab_start(7); /* second prompt call: on */
    T_TRUE(KWK_AB(2));
    kwk_ab_stop(7, t);
    t = kwk_ab_start(1); /* third decode call: off */
    T_TRUE(!KWK_AB(2));
    kwk_ab_stop(1, t);
    t = kwk_ab_start(1); /* fourth: on again */
    T_TRUE(KWK_AB(2));
    kwk_ab_stop(1, t);
    T_EQ(toks[0][1], 2);
    T_EQ(toks[0][0], 1);
    T_EQ(toks[1][1], 7);
    T_EQ(toks[1][0], 0);
    /* each timed call is one entry of its side's medians */
    T_EQ(n_calls[0][1], 2);
    T_EQ(n_calls[0][0], 1);
    T_EQ(n_calls[1][1], 1);
    T_EQ(n_calls[1][0], 0);
    T_TRUE(secs[0][0] >= 0.0 && secs[0][1] >= 0.0 && secs[1][1] >= 0.0);
    float v[5] = {3, 1, 5, 2, 4}, w[4] = {4, 1, 3, 2};
    T_TRUE(median(v, 5) == 3.0 && median(w, 4) == 2.5);
    return t_report("test_ab");
}
