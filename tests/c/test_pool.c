/* test_pool.c - the thread pool: every thread runs each task exactly once, the barrier orders
 * phases, the pool survives sleeping between tasks, a waiting thread reads the spans it was given
 * and stops when the wait ends; kwk_split_range covers [0,n) exactly. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "base/pool.h"
#include "test.h"

#define MAX_THREADS 8

struct run_ctx {
    struct kwk_pool *pool;
    long run;
    int nth_seen[MAX_THREADS];
    atomic_int hits[MAX_THREADS];
    long slot[MAX_THREADS];    /* written in phase 1, read by everyone in phase 2 */
    long slot2[MAX_THREADS];   /* written in phase 3 from what phase 2 saw */
    atomic_int bad;
};

static void task(void *arg, int ith, int nth)
{
    struct run_ctx *c = arg;
    if (ith < 0 || ith >= MAX_THREADS) {
        atomic_fetch_add_explicit(&c->bad, 1, memory_order_relaxed);
        return;
    }
    c->nth_seen[ith] = nth;
    atomic_fetch_add_explicit(&c->hits[ith], 1, memory_order_relaxed);
    c->slot[ith] = c->run;
    kwk_pool_barrier(c->pool);
    long sum = 0;
    for (int j = 0; j < nth; j++) {
        if (c->slot[j] != c->run)
            atomic_fetch_add_explicit(&c->bad, 1, memory_order_relaxed);
        sum += c->slot[j];
    }
    kwk_pool_barrier(c->pool);
    /* After the second barrier nobody reads slot any more: overwrite it, then check that the
     * third barrier publishes the new values. */
    c->slot[ith] = -1;
    c->slot2[ith] = sum;
    kwk_pool_barrier(c->pool);
    for (int j = 0; j < nth; j++)
        if (c->slot2[j] != sum || c->slot[j] != -1)
            atomic_fetch_add_explicit(&c->bad, 1, memory_order_relaxed);
}

static void test_runs(int n_threads, long n_runs)
{
    struct kwk_pool *p = kwk_pool_new(n_threads);
    T_TRUE(p != NULL);
    if (!p)
        return;
    T_EQ(kwk_pool_size(p), n_threads);
    struct run_ctx *c = calloc(1, sizeof *c);
    c->pool = p;
    long wrong = 0;
    for (long run = 0; run < n_runs; run++) {
        c->run = run;
        kwk_pool_run(p, task, c);
        for (int i = 0; i < n_threads; i++)
            if (atomic_load_explicit(&c->hits[i], memory_order_relaxed) != run + 1 ||
                c->nth_seen[i] != n_threads)
                wrong++;
        /* A few long pauses send the workers to sleep: the wake-up path must work too. */
        if (run % 2500 == 1) {
            struct timespec ts = {0, 2 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    T_EQ(wrong, 0);
    T_EQ(atomic_load(&c->bad), 0);
    for (int i = n_threads; i < MAX_THREADS; i++)
        T_EQ(atomic_load(&c->hits[i]), 0);
    free(c);
    kwk_pool_free(p);
}

static void test_split(void)
{
    static const long aligns[] = {1, 4, 16, 64};
    long bad = 0;
    for (long n = 0; n <= 300; n++)
        for (int nth = 1; nth <= 9; nth++)
            for (size_t a = 0; a < KWK_ARRAY_LEN(aligns); a++) {
                long align = aligns[a], prev = 0;
                long max_part = ((n / align + nth - 1) / nth) * align;
                for (int i = 0; i < nth; i++) {
                    long lo, hi;
                    kwk_split_range(n, i, nth, align, &lo, &hi);
                    if (lo != prev || hi < lo)
                        bad++;
                    if (i < nth - 1 && (hi % align != 0 || hi - lo > max_part))
                        bad++;
                    prev = hi;
                }
                if (prev != n)
                    bad++;
            }
    T_EQ(bad, 0);
    long lo, hi;
    kwk_split_range(10, 0, 1, 4, &lo, &hi);
    T_EQ(lo, 0);
    T_EQ(hi, 10);
    kwk_split_range(10, 0, 4, 0, &lo, &hi); /* align < 1 behaves as 1 */
    T_EQ(lo, 0);
    T_EQ(hi, 3);
    kwk_split_range(100, 3, 4, 16, &lo, &hi); /* blocks 6: 2,2,1,1 -> last is [80,100) */
    T_EQ(lo, 80);
    T_EQ(hi, 100);
}

struct pf_ctx {
    struct kwk_pool *pool;
    const char *buf;
    size_t bytes;
    int sleep_ms; /* the workers' time in the task */
    int n_spans;  /* spans given, each an eighth of buf (more than KWK_POOL_SPANS: clamped) */
};

static void pf_task(void *arg, int ith, int nth)
{
    struct pf_ctx *c = arg;
    (void)nth;
    struct kwk_span s[8];
    for (int i = 0; i < c->n_spans; i++)
        s[i] = (struct kwk_span){c->buf + (size_t)i * (c->bytes / 8), c->bytes / 8};
    kwk_pool_prefetch(c->pool, ith, s, c->n_spans);
    if (ith > 0 && c->sleep_ms > 0) {
        struct timespec ts = {0, c->sleep_ms * 1000L * 1000L};
        nanosleep(&ts, NULL);
    }
}

/* Prefetching waits: the owner, done long before its workers, asks for every line of its spans
 * (the first KWK_POOL_SPANS of the six given: the rest are clamped away) and returns only when
 * the workers are done; a wait ends as soon as the next task is handed out, however much is left
 * to read. */
static void test_prefetch(void)
{
    struct kwk_pool *p = kwk_pool_new(2);
    T_TRUE(p != NULL);
    if (!p)
        return;
    size_t small = 64 * 1024, big = (size_t)256 << 20;
    char *buf = malloc(big);
    T_TRUE(buf != NULL);
    if (!buf) {
        kwk_pool_free(p);
        return;
    }
    memset(buf, 1, big); /* mapped, and out of the caches */
    struct pf_ctx c = {.pool = p, .buf = buf, .bytes = small, .sleep_ms = 100, .n_spans = 6};
    /* The owner needs well under a millisecond of the workers' 100 ms; a host that takes the
     * CPU from it for all of that gets a few more tries (the count is cumulative). */
    long want = (long)(KWK_POOL_SPANS * (small / 8) / 64), got = 0;
    for (int tries = 0; tries < 5 && got != want; tries++) {
        long before = kwk_pool_prefetched(p, 0);
        kwk_pool_run(p, pf_task, &c);
        got = kwk_pool_prefetched(p, 0) - before;
    }
    T_EQ(got, want);
    /* No spans this time: nothing more is asked for. */
    c.n_spans = 0;
    long before = kwk_pool_prefetched(p, 0);
    kwk_pool_run(p, pf_task, &c);
    T_EQ(kwk_pool_prefetched(p, 0), before);

    /* 32 MiB a span, 4 spans a thread, 200 tasks back to back: reading it all would take
     * 200 * 4 * 512Ki lines; each wait stops at the next hand-out (or the workers' end) long
     * before. */
    c = (struct pf_ctx){.pool = p, .buf = buf, .bytes = big, .sleep_ms = 0, .n_spans = 4};
    long before0 = kwk_pool_prefetched(p, 0), before1 = kwk_pool_prefetched(p, 1);
    for (int i = 0; i < 200; i++)
        kwk_pool_run(p, pf_task, &c);
    long all = 200L * 4 * (long)(big / 8 / 64);
    T_TRUE(kwk_pool_prefetched(p, 0) - before0 < all);
    T_TRUE(kwk_pool_prefetched(p, 1) - before1 < all);
    /* Out-of-range threads and negative counts are ignored. */
    struct kwk_span s = {buf, 64};
    kwk_pool_prefetch(p, 2, &s, 1);
    kwk_pool_prefetch(p, -1, &s, 1);
    kwk_pool_prefetch(p, 0, &s, -3);
    T_EQ(kwk_pool_prefetched(p, 2), 0);
    kwk_pool_free(p);

    /* One thread: nothing to wait for, nothing asked for. */
    p = kwk_pool_new(1);
    T_TRUE(p != NULL);
    if (p) {
        c = (struct pf_ctx){.pool = p, .buf = buf, .bytes = small, .sleep_ms = 0, .n_spans = 2};
        kwk_pool_run(p, pf_task, &c);
        T_EQ(kwk_pool_prefetched(p, 0), 0);
    }
    kwk_pool_free(p);
    free(buf);
}

static void noop(void *ctx, int ith, int nth)
{
    (void)ctx;
    (void)ith;
    (void)nth;
}

int main(void)
{
    test_split();
    test_runs(1, 10000);
    test_runs(2, 10000);
    test_runs(3, 10000);
    test_runs(8, 4000); /* oversubscribed: fewer runs keep the test quick */
    test_prefetch();
    struct kwk_pool *p = kwk_pool_new(0);
    T_TRUE(p != NULL);
    if (p) {
        T_EQ(kwk_pool_size(p), kwk_default_threads());
        kwk_pool_run(p, noop, NULL);
    }
    kwk_pool_free(p);
    kwk_pool_free(NULL);
    T_TRUE(kwk_default_threads() >= 1);
    return t_report("test_pool");
}
