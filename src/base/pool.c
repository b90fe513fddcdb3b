/* pool.c - the persistent compute thread pool (generation counter + futex) and its barrier.
 * A pool is driven by its owner thread only; kwk_pool_barrier is called from inside tasks. */
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"
#include "base/pool.h"

/* How long a waiting thread spins before it sleeps: first with pauses only, then giving the CPU
 * to any other runnable thread between checks (sched_yield returns at once when there is none).
 * Between the back-to-back tasks of a forward pass the gap is far shorter than a futex wake-up,
 * and one sleeper slows the next hand-out by its wake-up latency (9 us on average on this
 * machine's VM, up to 150 us), which makes the other side wait longer than it spins, sleep in
 * turn, and so on: with 30 us of spinning, generation of SmolLM2-360M made ~60 futex calls a
 * token; with a millisecond, ~2 (issue 6). Idle periods longer than that (the next request)
 * sleep. */
#define SPIN_NS 30000.0
#define YIELD_NS 1000000.0
/* Pauses between clock reads while spinning: a clock read costs about as much as a few pauses. */
#define SPIN_CHECK 64
/* Barrier waits spin this many pauses, then yield the CPU (oversubscribed or preempted peers). */
#define BARRIER_SPINS 256

/* Lines asked for between two checks of whether a prefetching wait is over (a check is one
 * load of a line that is only read until it changes). */
#define PREFETCH_CHECK 8

/* A thread's spans for the wait after the current task (kwk_pool_prefetch), on its own line. */
struct prefetch_slot {
    _Alignas(64) struct kwk_span s[KWK_POOL_SPANS];
    int count;
    atomic_long lines; /* lines asked for, all waits (kwk_pool_prefetched) */
};

/* Each hot atomic sits on its own cache line so that workers polling one do not bounce the
 * line another is written on. */
struct kwk_pool {
    _Alignas(64) atomic_uint gen;  /* task generation: bumped (release) to hand out a task */
    _Alignas(64) atomic_uint n_done; /* tasks finished by workers, summed over generations: the
                                        owner never resets it, so a task costs one fewer cache
                                        line transfer (gen * (n_threads - 1) when all are done) */
    _Alignas(64) atomic_int gen_sleepers;  /* workers in futex_wait on gen */
    _Alignas(64) atomic_int done_sleepers; /* owner in futex_wait on n_done (0 or 1) */
    _Alignas(64) atomic_uint bar_count; /* threads arrived at the current barrier */
    _Alignas(64) atomic_uint bar_phase; /* bumped when the last thread arrives */
    _Alignas(64) kwk_task_fn fn;        /* written by the owner before the release on gen */
    void *ctx;
    int stop;                           /* likewise: set before the final bump of gen */
    int n_threads;
    int n_started;                      /* workers actually created (for a partial failure) */
    pthread_t *threads;
    struct prefetch_slot *slots;        /* [n_threads] */
};

struct worker_arg {
    struct kwk_pool *pool;
    int ith;
};

static inline void cpu_relax(void)
{
    __builtin_ia32_pause();
}

static void futex_wait(atomic_uint *word, unsigned val)
{
    /* EAGAIN (value changed) and EINTR both just send the caller back to its check. */
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(atomic_uint *word)
{
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Wait until *word != old; spin first, then sleep. Returns the new value (acquire).
 * The sleeper count and the futex value check pair with wake_after_store(): both sides use
 * seq_cst, so either the waker sees the sleeper or the futex sees the new value. */
static unsigned wait_change(atomic_uint *word, unsigned old, atomic_int *sleepers)
{
    unsigned v;
    double deadline = 0.0;
    int yielding = 0;
    for (int i = 0;; i++) {
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v != old)
            return v;
        cpu_relax();
        if (i % SPIN_CHECK == SPIN_CHECK - 1) {
            double now = kwk_time_s();
            if (deadline == 0.0) {
                deadline = now + SPIN_NS * 1e-9;
            } else if (now > deadline) {
                if (yielding)
                    break;
                yielding = 1;
                deadline = now + (YIELD_NS - SPIN_NS) * 1e-9;
            }
            if (yielding)
                sched_yield();
        }
    }
    for (;;) {
        atomic_fetch_add_explicit(sleepers, 1, memory_order_seq_cst);
        v = atomic_load_explicit(word, memory_order_seq_cst);
        if (v == old)
            futex_wait(word, old);
        atomic_fetch_sub_explicit(sleepers, 1, memory_order_relaxed);
        v = atomic_load_explicit(word, memory_order_acquire);
        if (v != old)
            return v;
    }
}

static void wake_after_store(atomic_uint *word, atomic_int *sleepers)
{
    if (atomic_load_explicit(sleepers, memory_order_seq_cst) > 0)
        futex_wake_all(word);
}

/* Thread ith's spans, taken out of its slot (the task's memory may be gone once it is done). */
static int take_spans(struct kwk_pool *p, int ith, struct kwk_span *s)
{
    struct prefetch_slot *slot = &p->slots[ith];
    int count = slot->count;
    memcpy(s, slot->s, sizeof(*s) * (size_t)count);
    slot->count = 0;
    return count;
}

/* Ask for the spans' lines, into L2 (hint T1), PREFETCH_CHECK lines of each span in turn, until
 * *word changes from `old` (equal = 0) or becomes `old` (equal = 1): the end of the wait they
 * fill. */
static void prefetch_while(struct prefetch_slot *slot, const struct kwk_span *s, int count,
                           atomic_uint *word, unsigned old, int equal)
{
    const char *c[KWK_POOL_SPANS], *end[KWK_POOL_SPANS];
    for (int i = 0; i < count; i++) {
        c[i] = s[i].p;
        end[i] = c[i] + s[i].n;
    }
    long lines = 0;
    for (int left = count; left > 0;) {
        left = 0;
        for (int i = 0; i < count; i++) {
            if (c[i] >= end[i])
                continue;
            unsigned v = atomic_load_explicit(word, memory_order_relaxed);
            if ((v == old) == equal)
                goto out;
            for (int k = 0; k < PREFETCH_CHECK && c[i] < end[i]; k++, c[i] += 64, lines++)
                __builtin_prefetch(c[i], 0, 2);
            left += c[i] < end[i];
        }
    }
out:
    if (lines)
        atomic_fetch_add_explicit(&slot->lines, lines, memory_order_relaxed);
}

static void *worker_main(void *arg)
{
    struct worker_arg wa = *(struct worker_arg *)arg;
    struct kwk_pool *p = wa.pool;
    kwk_free(arg);
    unsigned seen = 0;
    for (;;) {
        seen = wait_change(&p->gen, seen, &p->gen_sleepers);
        if (p->stop)
            break;
        p->fn(p->ctx, wa.ith, p->n_threads);
        struct kwk_span spans[KWK_POOL_SPANS];
        int n_spans = take_spans(p, wa.ith, spans);
        unsigned done = atomic_fetch_add_explicit(&p->n_done, 1, memory_order_seq_cst) + 1;
        if (done == seen * (unsigned)(p->n_threads - 1))
            wake_after_store(&p->n_done, &p->done_sleepers);
        prefetch_while(&p->slots[wa.ith], spans, n_spans, &p->gen, seen, 0);
    }
    return NULL;
}

/* Publish fn/ctx/stop (plain fields) to the workers with one release on the generation; returns
 * the new generation. */
static unsigned hand_out(struct kwk_pool *p)
{
    unsigned gen = atomic_fetch_add_explicit(&p->gen, 1, memory_order_seq_cst) + 1;
    wake_after_store(&p->gen, &p->gen_sleepers);
    return gen;
}

static void wait_workers(struct kwk_pool *p, unsigned target)
{
    unsigned v = atomic_load_explicit(&p->n_done, memory_order_acquire);
    while (v != target)
        v = wait_change(&p->n_done, v, &p->done_sleepers);
}

static void stop_workers(struct kwk_pool *p)
{
    if (p->n_started == 0)
        return;
    p->stop = 1;
    hand_out(p);
    for (int i = 0; i < p->n_started; i++)
        pthread_join(p->threads[i], NULL);
}

struct kwk_pool *kwk_pool_new(int n_threads)
{
    if (n_threads <= 0)
        n_threads = kwk_default_threads();
    struct kwk_pool *p = kwk_malloc_aligned(sizeof *p);
    if (!p)
        return NULL;
    memset(p, 0, sizeof *p);
    atomic_init(&p->gen, 0);
    atomic_init(&p->n_done, 0);
    atomic_init(&p->gen_sleepers, 0);
    atomic_init(&p->done_sleepers, 0);
    atomic_init(&p->bar_count, 0);
    atomic_init(&p->bar_phase, 0);
    p->n_threads = n_threads;
    if (n_threads == 1)
        return p;
    p->slots = kwk_malloc_aligned(sizeof *p->slots * (size_t)n_threads);
    p->threads = kwk_calloc((size_t)n_threads - 1, sizeof *p->threads);
    if (!p->threads || !p->slots)
        goto out_free;
    memset(p->slots, 0, sizeof *p->slots * (size_t)n_threads);
    for (int i = 0; i < n_threads; i++)
        atomic_init(&p->slots[i].lines, 0);
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = kwk_malloc(sizeof *wa);
        if (!wa)
            goto out_stop;
        wa->pool = p;
        wa->ith = i;
        int rc = pthread_create(&p->threads[i - 1], NULL, worker_main, wa);
        if (rc != 0) {
            kwk_free(wa);
            kwk_log(KWK_LOG_ERROR, "thread pool: pthread_create: %s", strerror(rc));
            goto out_stop;
        }
        p->n_started++;
    }
    return p;

out_stop:
    stop_workers(p);
out_free:
    kwk_free(p->threads);
    kwk_free_aligned(p->slots);
    kwk_free_aligned(p);
    return NULL;
}

void kwk_pool_free(struct kwk_pool *p)
{
    if (!p)
        return;
    stop_workers(p);
    kwk_free(p->threads);
    kwk_free_aligned(p->slots);
    kwk_free_aligned(p);
}

int kwk_pool_size(const struct kwk_pool *p)
{
    return p->n_threads;
}

void kwk_pool_run(struct kwk_pool *p, kwk_task_fn fn, void *ctx)
{
    if (p->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    unsigned gen = hand_out(p);
    fn(ctx, 0, p->n_threads);
    /* unsigned arithmetic wraps alike on both sides, so equality stays exact */
    unsigned target = gen * (unsigned)(p->n_threads - 1);
    struct kwk_span spans[KWK_POOL_SPANS];
    int n_spans = take_spans(p, 0, spans);
    prefetch_while(&p->slots[0], spans, n_spans, &p->n_done, target, 1);
    wait_workers(p, target);
}

long kwk_pool_prefetched(const struct kwk_pool *p, int ith)
{
    if (p->n_threads == 1 || ith < 0 || ith >= p->n_threads)
        return 0;
    return atomic_load_explicit(&p->slots[ith].lines, memory_order_relaxed);
}

void kwk_pool_prefetch(struct kwk_pool *p, int ith, const struct kwk_span *s, int count)
{
    if (p->n_threads == 1 || ith < 0 || ith >= p->n_threads)
        return;
    struct prefetch_slot *slot = &p->slots[ith];
    slot->count = KWK_MIN(KWK_MAX(count, 0), KWK_POOL_SPANS);
    memcpy(slot->s, s, sizeof(*s) * (size_t)slot->count);
}

/* A sense-reversing barrier whose "sense" is a phase counter, so no thread needs local state:
 * each thread reads the phase before arriving; the last to arrive resets the count and then
 * bumps the phase (release), which frees the others. */
void kwk_pool_barrier(struct kwk_pool *p)
{
    unsigned n = (unsigned)p->n_threads;
    if (n == 1)
        return;
    unsigned phase = atomic_load_explicit(&p->bar_phase, memory_order_acquire);
    unsigned arrived = atomic_fetch_add_explicit(&p->bar_count, 1, memory_order_acq_rel) + 1;
    if (arrived == n) {
        atomic_store_explicit(&p->bar_count, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->bar_phase, 1, memory_order_release);
        return;
    }
    for (int i = 0; atomic_load_explicit(&p->bar_phase, memory_order_acquire) == phase; i++) {
        if (i < BARRIER_SPINS)
            cpu_relax();
        else
            sched_yield();
    }
}

void kwk_split_range(long n, int ith, int nth, long align, long *lo, long *hi)
{
    if (n <= 0 || nth <= 1 || ith < 0 || ith >= nth) {
        /* One part (or a caller outside the split): thread 0 of 1 gets all, others nothing. */
        *lo = 0;
        *hi = n > 0 && nth <= 1 && ith == 0 ? n : 0;
        return;
    }
    if (align < 1)
        align = 1;
    /* Whole aligned blocks are shared out evenly (the first `rem` threads get one more); the
     * last thread also takes the unaligned tail. */
    long blocks = n / align;
    long per = blocks / nth, rem = blocks % nth;
    long b0 = (long)ith * per + KWK_MIN((long)ith, rem);
    long b1 = b0 + per + (ith < rem ? 1 : 0);
    *lo = b0 * align;
    *hi = ith == nth - 1 ? n : b1 * align;
}
