/* sample.c - the sampler: logits processors in transformers' order, greedy, seeded draws and
 * OpenAI logprobs (contract and order in include/kwker.h). A sampler is used by one thread at a
 * time; kwk_sample_draw and kwk_sampler_params_* are thread-safe. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "base/base.h"

struct kwk_sampler {
    int n_vocab;
    struct kwk_sampler_params p;

    float *scores;      /* [n_vocab] the row being processed */
    float *tmp;         /* [n_vocab] probabilities by token id; the top_k selection copy */
    int32_t *idx;       /* [n_vocab] ids being partitioned (top_p) */
    int32_t *cand;      /* [n_cand] ids still finite after the warpers so far, ascending */
    int n_cand;
    int32_t *n_seen;    /* [n_vocab] times each id was accepted, prompt and output */
    int32_t *n_gen;     /* [n_vocab] times each id was generated */
    int32_t *seen;      /* [n_seen_ids] distinct ids with n_seen > 0, in no particular order */
    int n_seen_ids;
    int64_t n_generated; /* generated tokens accepted: the counter of the next draw */

    float *bias;        /* [n_vocab] logit bias, NULL until one is set */
    int32_t *bias_ids;  /* [n_bias] ids with a bias entry */
    int n_bias;
    int32_t *eos;       /* [n_eos] ids min_new_tokens suppresses */
    int n_eos;
};

void kwk_sampler_params_init(struct kwk_sampler_params *p)
{
    memset(p, 0, sizeof *p);
    p->do_sample = 0;
    p->temperature = 1.0;
    p->top_k = 50;
    p->top_p = 1.0;
    p->min_p = 0.0;
    p->repetition_penalty = 1.0;
    p->seed = 0;
}

/* Written so that NaN fails every range check. */
int kwk_sampler_params_check(const struct kwk_sampler_params *p, struct kwk_err *err)
{
    if (!p)
        return kwk_err_set(err, KWK_EARG, "sampler params: NULL");
    if (!(p->temperature >= 0.0 && isfinite(p->temperature)))
        return kwk_err_set(err, KWK_EARG, "temperature must be a finite number >= 0 (got %g)",
                           p->temperature);
    if (p->top_k < 0)
        return kwk_err_set(err, KWK_EARG, "top_k must be >= 0, 0 to disable (got %d)", p->top_k);
    if (!(p->top_p > 0.0 && p->top_p <= 1.0))
        return kwk_err_set(err, KWK_EARG, "top_p must be in (0, 1] (got %g)", p->top_p);
    if (!(p->min_p >= 0.0 && p->min_p <= 1.0))
        return kwk_err_set(err, KWK_EARG, "min_p must be in [0, 1] (got %g)", p->min_p);
    if (!(p->repetition_penalty > 0.0 && isfinite(p->repetition_penalty)))
        return kwk_err_set(err, KWK_EARG, "repetition_penalty must be a finite number > 0 (got %g)",
                           p->repetition_penalty);
    if (!(p->presence_penalty >= -2.0 && p->presence_penalty <= 2.0))
        return kwk_err_set(err, KWK_EARG, "presence_penalty must be in [-2, 2] (got %g)",
                           p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0 && p->frequency_penalty <= 2.0))
        return kwk_err_set(err, KWK_EARG, "frequency_penalty must be in [-2, 2] (got %g)",
                           p->frequency_penalty);
    if (p->min_new_tokens < 0)
        return kwk_err_set(err, KWK_EARG, "min_new_tokens must be >= 0 (got %d)",
                           p->min_new_tokens);
    return 0;
}

kwk_sampler *kwk_sampler_new(int n_vocab, const struct kwk_sampler_params *p,
                             struct kwk_err *err)
{
    struct kwk_sampler *s = NULL;
    size_t nb;

    if (n_vocab < 1) {
        kwk_err_set(err, KWK_EARG, "sampler: n_vocab must be >= 1 (got %d)", n_vocab);
        goto out;
    }
    if (kwk_sampler_params_check(p, err) < 0)
        goto out;
    if (kwk_mul_size((size_t)n_vocab, sizeof(float), &nb) < 0) {
        kwk_err_set(err, KWK_ELIMIT, "sampler: n_vocab %d too large", n_vocab);
        goto out;
    }
    s = kwk_calloc(1, sizeof *s);
    if (!s)
        goto out_nomem;
    s->n_vocab = n_vocab;
    s->p = *p;
    /* float and int32_t have the same size, so nb bytes fit every array. */
    s->scores = kwk_malloc(nb);
    s->tmp = kwk_malloc(nb);
    s->idx = kwk_malloc(nb);
    s->cand = kwk_malloc(nb);
    s->n_seen = kwk_calloc((size_t)n_vocab, sizeof(int32_t));
    s->n_gen = kwk_calloc((size_t)n_vocab, sizeof(int32_t));
    s->seen = kwk_malloc(nb);
    if (!s->scores || !s->tmp || !s->idx || !s->cand || !s->n_seen || !s->n_gen || !s->seen)
        goto out_free;
    return s;

out_free:
    kwk_sampler_free(s);
    s = NULL;
out_nomem:
    kwk_err_set(err, -ENOMEM, "sampler: out of memory for a vocabulary of %d", n_vocab);
out:
    return s;
}

void kwk_sampler_free(kwk_sampler *s)
{
    if (!s)
        return;
    kwk_free(s->scores);
    kwk_free(s->tmp);
    kwk_free(s->idx);
    kwk_free(s->cand);
    kwk_free(s->n_seen);
    kwk_free(s->n_gen);
    kwk_free(s->seen);
    kwk_free(s->bias);
    kwk_free(s->bias_ids);
    kwk_free(s->eos);
    kwk_free(s);
}

int kwk_sampler_set_logit_bias(kwk_sampler *s, const int32_t *ids, const float *biases, int n,
                               struct kwk_err *err)
{
    int32_t *list = NULL;
    int n_list = 0;

    if (n < 0 || (n > 0 && (!ids || !biases)))
        return kwk_err_set(err, KWK_EARG, "logit_bias: bad arguments (n = %d)", n);
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->n_vocab)
            return kwk_err_set(err, KWK_ERANGE, "logit_bias: token id %d outside [0, %d)",
                               (int)ids[i], s->n_vocab);
        if (!(biases[i] >= -100.0f && biases[i] <= 100.0f))
            return kwk_err_set(err, KWK_EARG, "logit_bias: bias %g for token %d outside "
                               "[-100, 100]", (double)biases[i], (int)ids[i]);
    }
    if (!s->bias && n > 0) {
        s->bias = kwk_calloc((size_t)s->n_vocab, sizeof(float));
        if (!s->bias)
            return kwk_err_set(err, -ENOMEM, "logit_bias: out of memory");
    }
    if (n > 0) {
        list = kwk_malloc((size_t)n * sizeof(int32_t));
        if (!list)
            return kwk_err_set(err, -ENOMEM, "logit_bias: out of memory");
    }
    for (int i = 0; i < s->n_bias; i++)
        s->bias[s->bias_ids[i]] = 0.0f;
    /* A dense row dedupes repeated ids (last wins, like a dict); the list keeps steps O(n). */
    for (int i = 0; i < n; i++) {
        int32_t id = ids[i];
        int known = 0;
        for (int j = 0; j < n_list && !known; j++)
            known = list[j] == id;
        if (!known)
            list[n_list++] = id;
        s->bias[id] = biases[i];
    }
    kwk_free(s->bias_ids);
    s->bias_ids = list;
    s->n_bias = n_list;
    return 0;
}

int kwk_sampler_set_eos(kwk_sampler *s, const int32_t *ids, int n)
{
    int32_t *copy = NULL;

    if (n < 0 || (n > 0 && !ids))
        return KWK_EARG;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= s->n_vocab)
            return KWK_ERANGE;
    if (n > 0) {
        copy = kwk_malloc((size_t)n * sizeof(int32_t));
        if (!copy)
            return -ENOMEM;
        memcpy(copy, ids, (size_t)n * sizeof(int32_t));
    }
    kwk_free(s->eos);
    s->eos = copy;
    s->n_eos = n;
    return 0;
}

int kwk_sampler_accept(kwk_sampler *s, int32_t token, int is_prompt)
{
    if (token < 0 || token >= s->n_vocab)
        return KWK_ERANGE;
    if (s->n_seen[token]++ == 0)
        s->seen[s->n_seen_ids++] = token;
    if (!is_prompt) {
        s->n_gen[token]++;
        s->n_generated++;
    }
    return 0;
}

int kwk_sampler_unaccept(kwk_sampler *s, int32_t token, int is_prompt)
{
    if (token < 0 || token >= s->n_vocab)
        return KWK_ERANGE;
    if (is_prompt ? s->n_seen[token] - s->n_gen[token] == 0 : s->n_gen[token] == 0)
        return KWK_EARG;
    if (!is_prompt) {
        s->n_gen[token]--;
        s->n_generated--;
    }
    if (--s->n_seen[token] == 0) {
        for (int i = 0; i < s->n_seen_ids; i++) {
            if (s->seen[i] == token) {
                s->seen[i] = s->seen[--s->n_seen_ids];
                break;
            }
        }
    }
    return 0;
}

void kwk_sampler_reset(kwk_sampler *s)
{
    for (int i = 0; i < s->n_seen_ids; i++) {
        s->n_seen[s->seen[i]] = 0;
        s->n_gen[s->seen[i]] = 0;
    }
    s->n_seen_ids = 0;
    s->n_generated = 0;
}

int64_t kwk_sampler_n_generated(const kwk_sampler *s)
{
    return s->n_generated;
}

/* ---- the processors, in order ---------------------------------------------------------------
 * Scalars are narrowed to float before use, as torch does for a Python number applied to a
 * float32 tensor, so thresholds land where transformers puts them. The warpers work on the list
 * of candidates (ids whose score is still finite, ascending): after top_k that is k ids, not the
 * vocabulary, and summing in ascending id order skips only zeros, so results equal a full pass. */

static void apply_penalties(kwk_sampler *s, float *x)
{
    const struct kwk_sampler_params *p = &s->p;

    for (int i = 0; i < s->n_bias; i++)
        x[s->bias_ids[i]] += s->bias[s->bias_ids[i]];
    if (p->repetition_penalty != 1.0) {
        float pen = (float)p->repetition_penalty;
        for (int i = 0; i < s->n_seen_ids; i++) {
            float *v = &x[s->seen[i]];
            *v = *v < 0.0f ? *v * pen : *v / pen;
        }
    }
    if (s->n_generated < p->min_new_tokens)
        for (int i = 0; i < s->n_eos; i++)
            x[s->eos[i]] = -INFINITY;
    if (p->presence_penalty != 0.0 || p->frequency_penalty != 0.0) {
        for (int i = 0; i < s->n_seen_ids; i++) {
            int32_t id = s->seen[i];
            int32_t c = s->n_gen[id];
            if (c > 0)
                x[id] -= (float)(p->presence_penalty + p->frequency_penalty * c);
        }
    }
}

/* p[id] = softmax(x)[id] for the candidates (every other entry of x is -inf, so its
 * probability is 0 and p[id] is not written): exp in float of x - max as torch does, the sum in
 * double. */
static void softmax_cand(const kwk_sampler *s, const float *x, float *p)
{
    const int32_t *c = s->cand;
    int n = s->n_cand;
    float m = -INFINITY;
    double z = 0.0;

    for (int j = 0; j < n; j++)
        m = x[c[j]] > m ? x[c[j]] : m;
    for (int j = 0; j < n; j++) {
        float e = expf(x[c[j]] - m);
        p[c[j]] = e;
        z += e;
    }
    for (int j = 0; j < n; j++)
        p[c[j]] = (float)(p[c[j]] / z);
}

/* Drop the candidates a warper set to -inf, keeping ascending order. */
static void prune_cand(kwk_sampler *s, const float *x)
{
    int k = 0;

    for (int j = 0; j < s->n_cand; j++)
        if (x[s->cand[j]] != -INFINITY)
            s->cand[k++] = s->cand[j];
    s->n_cand = k;
}

/* The k-th largest of a[n] (1 <= k <= n), reordering a. Three-way quickselect: logit rows hold
 * long runs of equal values, which a two-way partition would make quadratic. The pivot is the
 * middle element; model rows are not adversarial to that. */
static float kth_largest(float *a, int n, int k)
{
    int lo = 0, hi = n; /* the answer is the (k-1)-th of a[lo..hi) in descending order */
    int want = k - 1;

    for (;;) {
        float piv = a[lo + (hi - lo) / 2];
        int lt = lo, i = lo, gt = hi;
        /* a[lo..lt) > piv, a[lt..i) == piv, a[gt..hi) < piv */
        while (i < gt) {
            float v = a[i];
            if (v > piv) {
                a[i++] = a[lt];
                a[lt++] = v;
            } else if (v < piv) {
                a[i] = a[--gt];
                a[gt] = v;
            } else {
                i++;
            }
        }
        if (want < lt)
            hi = lt;
        else if (want < gt)
            return piv;
        else
            lo = gt;
    }
}

/* transformers removes scores < the k-th largest (of the whole row; -inf entries are never
 * above it, so the candidates suffice), so ties with it stay. */
static void apply_top_k(kwk_sampler *s, float *x)
{
    int n = s->n_cand, k = s->p.top_k;

    if (k <= 0 || k >= n)
        return;
    for (int j = 0; j < n; j++)
        s->tmp[j] = x[s->cand[j]];
    float kth = kth_largest(s->tmp, n, k);
    for (int j = 0; j < n; j++)
        if (x[s->cand[j]] < kth)
            x[s->cand[j]] = -INFINITY;
    prune_cand(s, x);
}

/* The top_p order: a ranks before b when its logit is larger, or equal with a lower id. */
static int ranks_before(const float *x, int32_t a, int32_t b)
{
    return x[a] > x[b] || (x[a] == x[b] && a < b);
}

/* Partition ids[lo..hi) around the middle element: ranked before it first, then it, then the
 * rest. Returns its final position; *mass gets the probability of the part before it. */
static int partition_rank(const float *x, const float *p, int32_t *ids, int lo, int hi,
                          double *mass)
{
    int32_t t, piv = ids[lo + (hi - lo) / 2];
    int st = lo;
    double a = 0.0;

    ids[lo + (hi - lo) / 2] = ids[hi - 1];
    ids[hi - 1] = piv;
    for (int i = lo; i < hi - 1; i++) {
        if (ranks_before(x, ids[i], piv)) {
            t = ids[i];
            ids[i] = ids[st];
            ids[st++] = t;
            a += p[t];
        }
    }
    ids[hi - 1] = ids[st];
    ids[st] = piv;
    *mass = a;
    return st;
}

/* transformers sorts ascending and drops the entries whose cumulative probability is
 * <= 1 - top_p, keeping the largest. Seen from the top: with the m best entries holding mass S_m,
 * the kept ones are the first M where M is the least m >= 1 with total - S_m <= 1 - top_p. M is
 * found by quickselect on mass (expected O(n)), never sorting the whole vocabulary. */
static void apply_top_p(kwk_sampler *s, float *x)
{
    int h = s->n_cand, lo = 0, hi = h;
    float *p = s->tmp;
    int32_t *ids = s->idx;
    double total = 0.0, above = 0.0, a;
    float thr;

    if (s->p.top_p >= 1.0)
        return;
    thr = (float)(1.0 - s->p.top_p);
    softmax_cand(s, x, p);
    for (int j = 0; j < h; j++) {
        ids[j] = s->cand[j];
        total += p[ids[j]];
    }
    /* ids[0..lo) rank first and their prefix does not reach the cut (mass: above); the prefix
     * ids[0..hi) does, or hi == h. */
    while (lo < hi) {
        int st = partition_rank(x, p, ids, lo, hi, &a);
        if (st >= 1 && (float)(total - (above + a)) <= thr) {
            hi = st;
            continue;
        }
        above += a + p[ids[st]];
        if ((float)(total - above) <= thr)
            hi = st + 1;
        lo = st + 1;
    }
    for (int j = hi; j < h; j++)
        x[ids[j]] = -INFINITY;
    prune_cand(s, x);
}

static void apply_min_p(kwk_sampler *s, float *x)
{
    float *p = s->tmp;
    float pmax = 0.0f;

    if (s->p.min_p <= 0.0)
        return;
    softmax_cand(s, x, p);
    for (int j = 0; j < s->n_cand; j++)
        pmax = p[s->cand[j]] > pmax ? p[s->cand[j]] : pmax;
    float thr = (float)s->p.min_p * pmax;
    /* The top token has p == pmax >= thr, so min_tokens_to_keep = 1 holds by itself. */
    for (int j = 0; j < s->n_cand; j++)
        if (p[s->cand[j]] < thr)
            x[s->cand[j]] = -INFINITY;
    prune_cand(s, x);
}

static int is_greedy(const kwk_sampler *s)
{
    return !s->p.do_sample || s->p.temperature == 0.0;
}

/* Temperature, building the candidate list on the way. m is the finite max of x. */
static void apply_temperature(kwk_sampler *s, float *x, float m)
{
    int n = s->n_vocab, k = 0;
    float t = (float)s->p.temperature;
    /* torch divides the scores as they are. Where that would overflow float (huge logits, tiny
     * temperature) divide them shifted by their max instead: softmax and every warper are
     * shift-invariant, and the best token stays finite. */
    float shift = fabs((double)m / t) < 1e37 ? 0.0f : m;

    for (int i = 0; i < n; i++) {
        if (x[i] == -INFINITY)
            continue;
        if (s->p.temperature != 1.0)
            x[i] = (x[i] - shift) / t;
        if (x[i] != -INFINITY)
            s->cand[k++] = i;
    }
    s->n_cand = k;
}

/* Steps 1-8 into s->scores and s->cand. Returns the argmax for greedy samplers, -1 when the
 * warpers ran, or a negative code below -1. */
static int process_scores(kwk_sampler *s, const float *logits)
{
    int n = s->n_vocab, best = 0;
    float *x = s->scores;

    for (int i = 0; i < n; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return KWK_EARG;
        x[i] = logits[i];
    }
    apply_penalties(s, x);
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i; /* strictly greater: the first index wins ties */
    /* -inf everywhere: no token can be chosen. +inf: a penalty or bias overflowed. */
    if (x[best] == -INFINITY || x[best] == INFINITY)
        return KWK_ERUNTIME;
    if (is_greedy(s))
        return best;
    apply_temperature(s, x, x[best]);
    apply_top_k(s, x);
    apply_top_p(s, x);
    apply_min_p(s, x);
    return -1;
}

int kwk_sampler_process(kwk_sampler *s, const float *logits, float *probs)
{
    int g = process_scores(s, logits);

    if (g < -1 || !probs)
        return g < -1 ? g : 0;
    memset(probs, 0, (size_t)s->n_vocab * sizeof(float));
    if (g >= 0)
        probs[g] = 1.0f;
    else
        softmax_cand(s, s->scores, probs);
    return 0;
}

/* Inverse CDF over probs[ids[j]] for j < n (ids NULL: 0..n-1), in that order, zeros skipped. */
static int draw_ids(const float *probs, const int32_t *ids, int n, double u)
{
    double total = 0.0, target, run = 0.0;
    int last = -1;

    for (int j = 0; j < n; j++) {
        float v = probs[ids ? ids[j] : j];
        if (v > 0.0f)
            total += v;
    }
    if (!(total > 0.0))
        return -1;
    target = u * total;
    for (int j = 0; j < n; j++) {
        int id = ids ? ids[j] : j;
        if (!(probs[id] > 0.0f))
            continue;
        run += probs[id];
        last = id;
        if (run > target)
            return id;
    }
    /* Rounding left target at the very top: the last token with mass. */
    return last;
}

int kwk_sample_draw(const float *probs, int n, double u)
{
    return draw_ids(probs, NULL, n, u);
}

/* Raw log-softmax of the chosen token and the n_top best (insertion into a short sorted list,
 * O(n_vocab) when few logits beat the current n_top-th). */
static void raw_logprobs(const kwk_sampler *s, const float *x, int32_t token, float *logprob,
                         int32_t *top_ids, float *top_lps, int n_top)
{
    int n = s->n_vocab, have = 0;
    float m = -INFINITY;
    double z = 0.0, lse;

    for (int i = 0; i < n; i++) {
        m = x[i] > m ? x[i] : m;
        /* strictly greater: an equal logit with a higher id stays behind */
        if (n_top == 0 || (have == n_top && !(x[i] > x[top_ids[have - 1]])))
            continue;
        int j = have < n_top ? have++ : have - 1;
        while (j > 0 && x[i] > x[top_ids[j - 1]]) {
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_ids[j] = i;
    }
    for (int i = 0; i < n; i++)
        z += x[i] == -INFINITY ? 0.0f : expf(x[i] - m);
    lse = m + log(z);
    if (logprob)
        *logprob = (float)((double)x[token] - lse);
    for (int j = 0; j < have; j++)
        top_lps[j] = (float)((double)x[top_ids[j]] - lse);
}

void kwk_sampler_raw_logprobs(const kwk_sampler *s, const float *logits, int32_t token,
                              float *logprob, int32_t *top_ids, float *top_lps, int n_top)
{
    raw_logprobs(s, logits, token, logprob, top_ids, top_lps, n_top);
}

int kwk_sampler_sample(kwk_sampler *s, const float *logits, int32_t *token, float *logprob,
                       int32_t *top_ids, float *top_lps, int n_top)
{
    int g;

    if (n_top < 0 || n_top > KWK_SAMPLER_TOP_MAX || n_top > s->n_vocab ||
        (n_top > 0 && (!top_ids || !top_lps)) || !token)
        return KWK_EARG;
    g = process_scores(s, logits);
    if (g < -1)
        return g;
    if (g == -1) {
        softmax_cand(s, s->scores, s->tmp);
        double u = kwk_rng_u01(s->p.seed, 0, (uint64_t)s->n_generated);
        g = draw_ids(s->tmp, s->cand, s->n_cand, u);
        if (g < 0)
            return KWK_ERUNTIME;
    }
    *token = g;
    if (logprob || n_top > 0)
        raw_logprobs(s, logits, g, logprob, top_ids, top_lps, n_top);
    return 0;
}
