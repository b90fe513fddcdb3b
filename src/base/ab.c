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
static int seen[2];       /* per kind (0 decode, 1 prompt): calls so far; the first is a warm-up */
static int turn[2];       /* the side of the kind's last call */
static double secs[2][2]; /* [kind][variant on] */
static long toks[2][2];

/* Each timed call's seconds a token, for the medians: a neighbour's burst on a shared host
 * moves a mean more than a median. */
#define AB_CALLS 65536
static float per_tok[2][2][AB_CALLS];
static int n_calls[2][2];

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double median(float *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_float);
    return n % 2 ? v[n / 2] : 0.5 * ((double)v[n / 2 - 1] + v[n / 2]);
}

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
    for (int k = 0; k < 2; k++)
        if (n_calls[k][0] > 0 && n_calls[k][1] > 0)
            fprintf(stderr,
                    "kwker ab: variant %d %s: median time a token with / without %.4f (%d / %d "
                    "calls)\n",
                    kwk_ab_variant, kind[k],
                    median(per_tok[k][1], n_calls[k][1]) / median(per_tok[k][0], n_calls[k][0]),
                    n_calls[k][1], n_calls[k][0]);
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
    /* the first call of a kind (page faults, first touches) runs without the variant, untimed */
    turn[k] = seen[k]++ == 0 ? -1 : turn[k] == 1 ? 0 : 1;
    kwk_ab_turn = turn[k] == 1;
    return kwk_time_s();
}

void kwk_ab_stop(int n, double t0)
{
    int k = n > 1, s = turn[k];
    if (s < 0)
        return;
    double dt = kwk_time_s() - t0;
    secs[k][s] += dt;
    toks[k][s] += n;
    if (n_calls[k][s] < AB_CALLS)
        per_tok[k][s][n_calls[k][s]++] = (float)(dt / n);
}
#else
typedef int kwk_ab_unused; /* ISO C wants a declaration in every translation unit */
#endif
