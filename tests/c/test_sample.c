/* test_sample.c - the sampler: Philox known answers, greedy ties, parameter validation, the
 * processors on hand-worked rows, draws and their reproducibility. Single thread. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/base.h"
#include "test.h"

static kwk_sampler *mk(int n_vocab, struct kwk_sampler_params *p)
{
    struct kwk_err err = {0};
    kwk_sampler *s = kwk_sampler_new(n_vocab, p, &err);
    T_CHECK(s != NULL, "kwk_sampler_new: %s", err.msg);
    return s;
}

static void test_philox_kat(void)
{
    /* Random123's kat_vectors for philox4x32-10: counter words, key words, expected output. */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
        {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0x408f276d,
         0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
        {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09,
         0x94fdcceb, 0x5001e420, 0x24126ea1},
    };
    for (int t = 0; t < 3; t++) {
        const uint32_t *v = kat[t];
        uint64_t counter = (uint64_t)v[1] << 32 | v[0];
        uint64_t stream = (uint64_t)v[3] << 32 | v[2];
        uint64_t seed = (uint64_t)v[5] << 32 | v[4];
        uint32_t out[4];
        kwk_rng_block(seed, stream, counter, out);
        for (int i = 0; i < 4; i++)
            T_EQ(out[i], v[6 + i]);
    }
}

static void test_rng_u01(void)
{
    double sum = 0.0, lo = 1.0, hi = 0.0;
    int n = 100000, differ = 0, out_of_range = 0, unstable = 0;

    for (int i = 0; i < n; i++) {
        double u = kwk_rng_u01(42, 0, (uint64_t)i);
        out_of_range += !(u >= 0.0 && u < 1.0);
        unstable += u != kwk_rng_u01(42, 0, (uint64_t)i); /* a pure function */
        differ += u != kwk_rng_u01(43, 0, (uint64_t)i);
        sum += u;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    /* mean of n uniforms: sd = 1/sqrt(12 n) ~ 0.0009; 5 sd */
    T_EQ(out_of_range, 0);
    T_EQ(unstable, 0);
    T_NEAR(sum / n, 0.5, 0.0046);
    T_TRUE(lo < 1e-3 && hi > 1.0 - 1e-3);
    T_TRUE(differ > n - 5);
    T_TRUE(kwk_rng_u01(42, 1, 0) != kwk_rng_u01(42, 0, 0));
}

static void test_validation(void)
{
    struct kwk_sampler_params p;
    struct kwk_err err;

#define BAD(field, value, what)                                                                  \
    do {                                                                                         \
        kwk_sampler_params_init(&p);                                                             \
        p.field = value;                                                                         \
        memset(&err, 0, sizeof err);                                                             \
        T_TRUE(kwk_sampler_new(10, &p, &err) == NULL);                                           \
        T_EQ(err.code, KWK_EARG);                                                                \
        T_CONTAINS(err.msg, what);                                                               \
    } while (0)
    BAD(temperature, -0.5, "temperature");
    BAD(temperature, NAN, "temperature");
    BAD(temperature, INFINITY, "temperature");
    BAD(top_k, -1, "top_k");
    BAD(top_p, 0.0, "top_p");
    BAD(top_p, 1.5, "top_p");
    BAD(top_p, NAN, "top_p");
    BAD(min_p, -0.1, "min_p");
    BAD(min_p, 1.01, "min_p");
    BAD(repetition_penalty, 0.0, "repetition_penalty");
    BAD(repetition_penalty, -1.0, "repetition_penalty");
    BAD(presence_penalty, 2.5, "presence_penalty");
    BAD(frequency_penalty, -2.5, "frequency_penalty");
    BAD(min_new_tokens, -1, "min_new_tokens");
#undef BAD

    kwk_sampler_params_init(&p);
    memset(&err, 0, sizeof err);
    T_TRUE(kwk_sampler_new(0, &p, &err) == NULL);
    T_EQ(err.code, KWK_EARG);
    T_TRUE(kwk_sampler_new(5, NULL, &err) == NULL);

    kwk_sampler *s = mk(5, &p);
    int32_t ids[2] = {1, 5};
    float b[2] = {1.0f, 2.0f};
    T_EQ(kwk_sampler_set_logit_bias(s, ids, b, 2, &err), KWK_ERANGE);
    T_CONTAINS(err.msg, "5");
    ids[1] = 2;
    b[1] = 101.0f;
    T_EQ(kwk_sampler_set_logit_bias(s, ids, b, 2, &err), KWK_EARG);
    b[1] = NAN;
    T_EQ(kwk_sampler_set_logit_bias(s, ids, b, 2, &err), KWK_EARG);
    T_EQ(kwk_sampler_set_eos(s, ids, -1), KWK_EARG);
    ids[0] = -1;
    T_EQ(kwk_sampler_set_eos(s, ids, 1), KWK_ERANGE);
    T_EQ(kwk_sampler_accept(s, 5, 0), KWK_ERANGE);
    T_EQ(kwk_sampler_accept(s, -1, 1), KWK_ERANGE);
    T_EQ(kwk_sampler_unaccept(s, 3, 0), KWK_EARG);
    T_EQ(kwk_sampler_accept(s, 3, 0), 0);
    T_EQ(kwk_sampler_unaccept(s, 3, 1), KWK_EARG); /* accepted as generated, not as prompt */
    T_EQ(kwk_sampler_unaccept(s, 3, 0), 0);
    T_EQ(kwk_sampler_unaccept(s, 3, 0), KWK_EARG);

    float lg[5] = {0, 1, NAN, 2, 3}, pr[5];
    int32_t tok, top[21];
    float lps[21];
    T_EQ(kwk_sampler_process(s, lg, pr), KWK_EARG);
    lg[2] = INFINITY;
    T_EQ(kwk_sampler_process(s, lg, pr), KWK_EARG);
    for (int i = 0; i < 5; i++)
        lg[i] = -INFINITY;
    T_EQ(kwk_sampler_process(s, lg, pr), KWK_ERUNTIME);
    lg[0] = 0.0f;
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, top, lps, 21), KWK_EARG);
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, top, lps, 6), KWK_EARG); /* more than n_vocab */
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, top, lps, 5), 0);
    kwk_sampler_free(s);
    kwk_sampler_free(NULL);
}

static void test_greedy(void)
{
    struct kwk_sampler_params p;
    float lg[6] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, -INFINITY}, pr[6];
    int32_t tok = -1, eos = 1;

    kwk_sampler_params_init(&p);
    kwk_sampler *s = mk(6, &p);
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, NULL, NULL, 0), 0);
    T_EQ(tok, 1); /* first index on ties */
    T_EQ(kwk_sampler_process(s, lg, pr), 0);
    for (int i = 0; i < 6; i++)
        T_NEAR(pr[i], i == 1 ? 1.0 : 0.0, 0);
    /* the repetition penalty applies to greedy too: 3 / 1.5 = 2 loses to 3 */
    kwk_sampler_free(s);
    p.repetition_penalty = 1.5;
    s = mk(6, &p);
    kwk_sampler_accept(s, 1, 1);
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, NULL, NULL, 0), 0);
    T_EQ(tok, 3);
    /* min_new_tokens suppresses eos until enough tokens were generated */
    kwk_sampler_free(s);
    kwk_sampler_params_init(&p);
    p.min_new_tokens = 2;
    s = mk(6, &p);
    kwk_sampler_set_eos(s, &eos, 1);
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, NULL, NULL, 0), 0);
    T_EQ(tok, 3);
    kwk_sampler_accept(s, 3, 0);
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, NULL, NULL, 0), 0);
    T_EQ(tok, 3);
    kwk_sampler_accept(s, 3, 0);
    T_EQ(kwk_sampler_n_generated(s), 2);
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, NULL, NULL, 0), 0);
    T_EQ(tok, 1);
    T_EQ(kwk_sampler_unaccept(s, 3, 0), 0);
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, NULL, NULL, 0), 0);
    T_EQ(tok, 3);
    kwk_sampler_free(s);
    /* temperature 0 is greedy even with do_sample */
    kwk_sampler_params_init(&p);
    p.do_sample = 1;
    p.temperature = 0.0;
    s = mk(6, &p);
    T_EQ(kwk_sampler_sample(s, lg, &tok, NULL, NULL, NULL, 0), 0);
    T_EQ(tok, 1);
    kwk_sampler_free(s);
}

/* Penalties and bias on a hand-worked row. */
static void test_penalties(void)
{
    struct kwk_sampler_params p;
    float lg[4] = {1.0f, -1.0f, 2.0f, 0.0f}, pr[4];
    int32_t ids[3] = {0, 3, 0};
    float b[3] = {5.0f, -1.0f, 0.5f};

    kwk_sampler_params_init(&p);
    p.do_sample = 1;
    p.top_k = 0;
    p.repetition_penalty = 2.0;
    p.presence_penalty = 0.5;
    p.frequency_penalty = 0.25;
    kwk_sampler *s = mk(4, &p);
    struct kwk_err err;
    T_EQ(kwk_sampler_set_logit_bias(s, ids, b, 3, &err), 0); /* id 0: last value (0.5) wins */
    kwk_sampler_accept(s, 1, 1); /* prompt: repetition only */
    kwk_sampler_accept(s, 2, 0);
    kwk_sampler_accept(s, 2, 0);
    T_EQ(kwk_sampler_process(s, lg, pr), 0);
    /* expected logits: 0: 1+0.5 = 1.5; 1: -1*2 = -2; 2: 2/2 - 0.5 - 0.25*2 = 0; 3: 0-1 = -1 */
    double e[4] = {1.5, -2.0, 0.0, -1.0}, z = 0;
    for (int i = 0; i < 4; i++)
        z += exp(e[i]);
    for (int i = 0; i < 4; i++)
        T_NEAR(pr[i], exp(e[i]) / z, 1e-6);
    /* clearing the bias and resetting the history gives the plain softmax back */
    T_EQ(kwk_sampler_set_logit_bias(s, NULL, NULL, 0, &err), 0);
    kwk_sampler_reset(s);
    T_EQ(kwk_sampler_n_generated(s), 0);
    T_EQ(kwk_sampler_process(s, lg, pr), 0);
    z = 0;
    for (int i = 0; i < 4; i++)
        z += exp(lg[i]);
    for (int i = 0; i < 4; i++)
        T_NEAR(pr[i], exp(lg[i]) / z, 1e-6);
    kwk_sampler_free(s);
}

static int n_kept(const float *pr, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += pr[i] > 0.0f;
    return k;
}

static void test_warpers(void)
{
    struct kwk_sampler_params p;
    float lg[6] = {2.0f, 1.0f, 2.0f, 0.0f, 1.0f, -INFINITY}, pr[6];

    kwk_sampler_params_init(&p);
    p.do_sample = 1;
    p.top_k = 1;
    kwk_sampler *s = mk(6, &p);
    T_EQ(kwk_sampler_process(s, lg, pr), 0);
    T_EQ(n_kept(pr, 6), 2); /* both ties with the k-th value stay */
    T_NEAR(pr[0], 0.5, 1e-7);
    T_NEAR(pr[2], 0.5, 1e-7);
    kwk_sampler_free(s);

    /* top_p 0.5 on uniform 4: ascending cumsum 0.25 0.5 0.75 1, <= 0.5 removed: 2 kept, and
     * the tie order keeps the lower ids */
    float u[4] = {0, 0, 0, 0}, pu[4];
    kwk_sampler_params_init(&p);
    p.do_sample = 1;
    p.top_k = 0;
    p.top_p = 0.5;
    s = mk(4, &p);
    T_EQ(kwk_sampler_process(s, u, pu), 0);
    T_NEAR(pu[0], 0.5, 1e-7);
    T_NEAR(pu[1], 0.5, 1e-7);
    T_EQ(n_kept(pu, 4), 2);
    kwk_sampler_free(s);

    /* uniform rows of 2^j tokens: every cumulative sum is exact, the cut falls exactly on the
     * threshold, where "<= 1 - top_p" removes; kept: the max(1, ceil(n * top_p)) lowest ids */
    static const double tps[] = {0.5, 0.75, 0.25, 0.125, 0.0625};
    float flat[64], pf[64];
    for (int i = 0; i < 64; i++)
        flat[i] = 1.5f;
    int wrong = 0;
    for (int n = 2; n <= 64; n *= 2) {
        for (size_t t = 0; t < KWK_ARRAY_LEN(tps); t++) {
            kwk_sampler_params_init(&p);
            p.do_sample = 1;
            p.top_k = 0;
            p.top_p = tps[t];
            s = mk(n, &p);
            T_EQ(kwk_sampler_process(s, flat, pf), 0);
            int want = (int)ceil(n * tps[t]) > 1 ? (int)ceil(n * tps[t]) : 1;
            for (int i = 0; i < n; i++)
                if ((pf[i] > 0.0f) != (i < want)) {
                    fprintf(stderr, "n %d top_p %g: token %d p %g, want %d kept\n", n, tps[t], i,
                            (double)pf[i], want);
                    wrong++;
                }
            kwk_sampler_free(s);
        }
    }
    T_EQ(wrong, 0);

    /* min_p 0.5: p(x) >= 0.5 * p(top) keeps logits within log 2 of the top */
    kwk_sampler_params_init(&p);
    p.do_sample = 1;
    p.top_k = 0;
    p.min_p = 0.5;
    s = mk(6, &p);
    T_EQ(kwk_sampler_process(s, lg, pr), 0);
    T_EQ(n_kept(pr, 6), 2);
    kwk_sampler_free(s);

    /* temperature sharpens: logit 2 vs 1 at T = 0.5 -> ratio e^2 */
    float two[2] = {2.0f, 1.0f}, p2[2];
    kwk_sampler_params_init(&p);
    p.do_sample = 1;
    p.temperature = 0.5;
    s = mk(2, &p);
    T_EQ(kwk_sampler_process(s, two, p2), 0);
    T_NEAR(p2[0] / p2[1], exp(2.0), 1e-4);
    kwk_sampler_free(s);
}

static void test_draw(void)
{
    float pr[5] = {0.0f, 0.25f, 0.0f, 0.5f, 0.25f}, zero[3] = {0, 0, 0};

    T_EQ(kwk_sample_draw(pr, 5, 0.0), 1);
    T_EQ(kwk_sample_draw(pr, 5, 0.2499), 1);
    T_EQ(kwk_sample_draw(pr, 5, 0.25), 3);
    T_EQ(kwk_sample_draw(pr, 5, 0.7499), 3);
    T_EQ(kwk_sample_draw(pr, 5, 0.75), 4);
    T_EQ(kwk_sample_draw(pr, 5, 0.9999999999), 4);
    T_EQ(kwk_sample_draw(zero, 3, 0.5), -1);
}

/* Same seed, same tokens; another seed, other tokens; empirical frequencies near the target. */
static void test_reproducible(void)
{
    struct kwk_sampler_params p;
    enum { V = 8, N = 4000 };
    float lg[V];
    int32_t a[N], b[N], c[N];
    int count[V] = {0};

    for (int i = 0; i < V; i++)
        lg[i] = (float)(i % 3) * 0.7f - (float)i * 0.1f;
    kwk_sampler_params_init(&p);
    p.do_sample = 1;
    p.top_k = 0;
    p.seed = 1234;
    for (int run = 0; run < 3; run++) {
        if (run == 2)
            p.seed = 99;
        kwk_sampler *s = mk(V, &p);
        int32_t *out = run == 0 ? a : run == 1 ? b : c;
        int bad = 0;
        for (int i = 0; i < N; i++) {
            bad += kwk_sampler_sample(s, lg, &out[i], NULL, NULL, NULL, 0) != 0;
            bad += kwk_sampler_accept(s, out[i], 0) != 0;
        }
        T_EQ(bad, 0);
        kwk_sampler_free(s);
    }
    int same = 1, diff = 0;
    for (int i = 0; i < N; i++) {
        same &= a[i] == b[i];
        diff += a[i] != c[i];
        count[a[i]]++;
    }
    T_TRUE(same);
    T_TRUE(diff > N / 4);
    float pr[V];
    kwk_sampler *s = mk(V, &p);
    kwk_sampler_process(s, lg, pr);
    kwk_sampler_free(s);
    for (int i = 0; i < V; i++) {
        double sd = sqrt(N * pr[i] * (1 - pr[i]));
        T_NEAR(count[i], N * pr[i], 5 * sd + 1);
    }
}

static void test_logprobs(void)
{
    struct kwk_sampler_params p;
    float lg[7] = {0.5f, 3.0f, -1.0f, 3.0f, 2.0f, -INFINITY, 1.0f};
    int32_t tok, top[4];
    float lp, lps[4];
    double z = 0;

    for (int i = 0; i < 7; i++)
        z += exp(lg[i]);
    kwk_sampler_params_init(&p);
    p.repetition_penalty = 3.0; /* processing must not change the reported logprobs */
    kwk_sampler *s = mk(7, &p);
    kwk_sampler_accept(s, 1, 1);
    T_EQ(kwk_sampler_sample(s, lg, &tok, &lp, top, lps, 4), 0);
    T_EQ(tok, 3);
    T_NEAR(lp, 3.0 - log(z), 1e-6);
    int want[4] = {1, 3, 4, 6};
    for (int j = 0; j < 4; j++) {
        T_EQ(top[j], want[j]);
        T_NEAR(lps[j], lg[want[j]] - log(z), 1e-6);
    }
    kwk_sampler_free(s);
}

static void test_alloc_failure(void)
{
    struct kwk_sampler_params p;

    kwk_sampler_params_init(&p);
    for (long n = 1; n <= 8; n++) {
        struct kwk_err err = {0};
        kwk_alloc_fail_after(n);
        kwk_sampler *s = kwk_sampler_new(100, &p, &err);
        kwk_alloc_fail_after(0);
        if (!s)
            T_EQ(err.code, -ENOMEM);
        kwk_sampler_free(s);
    }
}

/* ---- a plain reference of the warpers, written from transformers' description with full
 * sorts, against the sampler's selection algorithms on random rows with ties and -inf ---- */

static const float *g_key;

/* ascending by value; equal values: the higher id first (it counts as less likely) */
static int cmp_asc(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_key[i] != g_key[j])
        return g_key[i] < g_key[j] ? -1 : 1;
    return i > j ? -1 : 1;
}

static void ref_softmax(const float *x, int n, double *p)
{
    double m = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int i = 0; i < n; i++)
        z += p[i] = exp((double)x[i] - m);
    for (int i = 0; i < n; i++)
        p[i] /= z;
}

static void ref_warp(float *x, int n, double t, int k, double top_p, double min_p, double *out)
{
    int32_t *ord = malloc((size_t)n * sizeof *ord);
    double *p = malloc((size_t)n * sizeof *p);

    for (int i = 0; i < n; i++)
        x[i] = x[i] / (float)t;
    for (int i = 0; i < n; i++)
        ord[i] = i;
    g_key = x;
    if (k > 0 && k < n) {
        qsort(ord, (size_t)n, sizeof *ord, cmp_asc);
        float kth = x[ord[n - k]];
        for (int i = 0; i < n; i++)
            if (x[i] < kth)
                x[i] = -INFINITY;
    }
    if (top_p < 1.0) {
        double cum = 0;
        ref_softmax(x, n, p);
        qsort(ord, (size_t)n, sizeof *ord, cmp_asc);
        for (int r = 0; r < n - 1; r++) {
            cum += p[ord[r]];
            if ((float)cum <= (float)(1.0 - top_p))
                x[ord[r]] = -INFINITY;
        }
    }
    if (min_p > 0) {
        double pm = 0;
        ref_softmax(x, n, p);
        for (int i = 0; i < n; i++)
            pm = p[i] > pm ? p[i] : pm;
        for (int i = 0; i < n; i++)
            if (p[i] < min_p * pm)
                x[i] = -INFINITY;
    }
    ref_softmax(x, n, out);
    free(ord);
    free(p);
}

static void test_against_reference(void)
{
    static const int sizes[] = {1, 2, 7, 64, 1000};
    static const double temps[] = {0.7, 1.0, 1.3};
    static const int ks[] = {0, 1, 5, 50};
    static const double tps[] = {1.0, 0.9, 0.5, 0.05};
    static const double mps[] = {0.0, 0.05, 0.2};
    unsigned seed = 7;
    int cases = 0, worst_case = -1;
    double worst = 0;

    for (size_t si = 0; si < KWK_ARRAY_LEN(sizes); si++) {
        int n = sizes[si];
        float *row = malloc((size_t)n * sizeof *row), *x = malloc((size_t)n * sizeof *x);
        float *pr = malloc((size_t)n * sizeof *pr);
        double *ref = malloc((size_t)n * sizeof *ref);
        for (int kind = 0; kind < 3; kind++) {
            for (int i = 0; i < n; i++) {
                seed = seed * 1103515245u + 12345u;
                int r = (int)(seed >> 16) % 1000;
                /* kind 0: continuous; 1: few distinct values (ties); 2: a third -inf */
                row[i] = kind == 1 ? (float)(r % 5) : (float)(r - 500) / 90.0f;
                if (kind == 2 && r % 3 == 0 && i > 0)
                    row[i] = -INFINITY;
            }
            for (size_t a = 0; a < KWK_ARRAY_LEN(temps); a++)
            for (size_t b = 0; b < KWK_ARRAY_LEN(ks); b++)
            for (size_t c = 0; c < KWK_ARRAY_LEN(tps); c++)
            for (size_t d = 0; d < KWK_ARRAY_LEN(mps); d++) {
                struct kwk_sampler_params p;
                kwk_sampler_params_init(&p);
                p.do_sample = 1;
                p.temperature = temps[a];
                p.top_k = ks[b];
                p.top_p = tps[c];
                p.min_p = mps[d];
                kwk_sampler *s = kwk_sampler_new(n, &p, NULL);
                int rc = kwk_sampler_process(s, row, pr);
                kwk_sampler_free(s);
                memcpy(x, row, (size_t)n * sizeof *x);
                ref_warp(x, n, temps[a], ks[b], tps[c], mps[d], ref);
                double err = rc == 0 ? 0 : 1;
                for (int i = 0; i < n; i++)
                    err = fmax(err, fabs(pr[i] - ref[i]));
                if (err > worst) {
                    worst = err;
                    worst_case = cases;
                }
                cases++;
            }
        }
        free(row);
        free(x);
        free(pr);
        free(ref);
    }
    T_CHECK(worst <= 1e-6, "max |sampler - reference| %.3g in case %d", worst, worst_case);
    T_EQ(cases, 5 * 3 * 3 * 4 * 4 * 3);
}

/* Extreme rows never crash or return NaN: either a distribution that sums to 1 or an error. */
static void test_extremes(void)
{
    const float big = 3.4028235e38f, tiny = 1e-40f;
    float rows[5][4] = {
        {big, -big, 0.0f, tiny},
        {-big, -big, -big, -big},
        {big, big, -INFINITY, -INFINITY},
        {tiny, -tiny, 0.0f, -0.0f},
        {1e30f, -1e30f, 1e30f, 5.0f},
    };
    int bad = 0, errors = 0, ok = 0;

    for (int r = 0; r < 5; r++) {
        for (int variant = 0; variant < 4; variant++) {
            struct kwk_sampler_params p;
            kwk_sampler_params_init(&p);
            p.do_sample = variant != 0;
            p.temperature = variant == 2 ? 0.01 : 1.0;
            p.top_p = variant == 3 ? 0.3 : 1.0;
            p.min_p = variant == 3 ? 0.5 : 0.0;
            p.repetition_penalty = variant >= 2 ? 0.5 : 1.0;
            kwk_sampler *s = mk(4, &p);
            kwk_sampler_accept(s, 0, 1);
            float pr[4];
            int32_t tok = -1, top[2];
            float lp, lps[2];
            int rc = kwk_sampler_process(s, rows[r], pr);
            int rc2 = kwk_sampler_sample(s, rows[r], &tok, &lp, top, lps, 2);
            if (rc == 0) {
                double sum = 0;
                for (int i = 0; i < 4; i++)
                    sum += pr[i];
                int wrong = !(fabs(sum - 1.0) < 1e-6) || rc2 != 0 || tok < 0 || tok > 3 ||
                            !(pr[tok] > 0.0f) || isnan(lp);
                if (wrong)
                    fprintf(stderr, "row %d variant %d: sum %g rc %d token %d logprob %g\n", r,
                            variant, sum, rc2, (int)tok, (double)lp);
                bad += wrong;
                ok++;
            } else {
                bad += rc != KWK_ERUNTIME || rc2 != rc;
                errors++;
            }
            kwk_sampler_free(s);
        }
    }
    T_EQ(bad, 0);
    T_TRUE(ok > 0 && errors > 0); /* overflowing penalties are reported, the rest samples */
}

int main(void)
{
    test_philox_kat();
    test_rng_u01();
    test_validation();
    test_greedy();
    test_penalties();
    test_warpers();
    test_draw();
    test_reproducible();
    test_logprobs();
    test_alloc_failure();
    test_against_reference();
    test_extremes();
    return t_report("test_sample");
}
