/* ab.c - the timing side of ab.h (only with the build option KWK_AB: KWK_AB_TIMING).
 * Evaluations run on one decoder's owner thread at a time in the experiments this serves
 * (kwker bench, generate). */
#include "base/ab.h"

#ifdef KWK_AB_TIMING
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"

int kwk_ab_variant, kwk_ab_turn;

static int inited;
static int turn[2];       /* per kind (0 decode, 1 prompt): the side of its last call */
static double secs[2][2]; /* [kind][variant on] */
static long toks[2][2];

static void report(void)
{
    static const char *kind[2] = {"decode", "prompt"};
    for (int k = 0; k < 2; k++)
        if (toks[k][0] > 0 && toks[k][1] > 0)
            fprintf(stderr,
                    "kwker ab: variant %d %s: with %.4f s / %ld tokens, without %.4f s / %ld "
                    "tokens, time a token with / without %.4f\n",
                    kwk_ab_variant, kind[k], secs[k][1], toks[k][1], secs[k][0], toks[k][0],
                    (secs[k][1] / (double)toks[k][1]) / (secs[k][0] / (double)toks[k][0]));
}

double kwk_ab_start(int n)
{
    if (!inited) {
        inited = 1;
        const char *e = getenv("KWKER_AB_VARIANT");
        kwk_ab_variant = e ? atoi(e) : 0;
        atexit(report);
    }
    int k = n > 1;
    turn[k] = !turn[k];
    kwk_ab_turn = turn[k];
    return kwk_time_s();
}

void kwk_ab_stop(int n, double t0)
{
    int k = n > 1;
    secs[k][turn[k]] += kwk_time_s() - t0;
    toks[k][turn[k]] += n;
}
#else
typedef int kwk_ab_unused; /* ISO C wants a declaration in every translation unit */
#endif
