/* pool.h - the persistent compute thread pool: one task at a time, run by every thread.
 * A pool is driven by one thread at a time (its owner); tasks run on the owner plus n-1 workers. */
#ifndef KWK_POOL_H
#define KWK_POOL_H

#include <stddef.h>

/* A task: called once on each thread with ith in [0, nth). */
typedef void (*kwk_task_fn)(void *ctx, int ith, int nth);

struct kwk_pool;

/* Start n_threads-1 workers (n_threads <= 0 means kwk_default_threads()). NULL on failure. */
struct kwk_pool *kwk_pool_new(int n_threads);
/* Stop and join the workers. Accepts NULL. */
void kwk_pool_free(struct kwk_pool *p);
int kwk_pool_size(const struct kwk_pool *p);

/* Run fn on every thread of the pool (the caller is thread 0) and return when all are done.
 * Workers spin briefly, then sleep, between tasks. */
void kwk_pool_run(struct kwk_pool *p, kwk_task_fn fn, void *ctx);

/* Memory a thread will read in the next task (the first rows of its share of the next weight
 * matrix), given to the pool by the task before it returns: the thread then asks for it line by
 * line, into L2, while it would otherwise wait for the task's other threads or for the next
 * task, and stops as soon as that wait is over. Bandwidth is what generation is short of, and
 * the waits at the end of each of a token's ~150 tasks leave it idle. */
#define KWK_POOL_SPANS 4
struct kwk_span {
    const void *p;
    size_t n;
};
/* Inside a task, on thread ith: spans (up to KWK_POOL_SPANS) for the wait that follows this
 * task, read side by side (a few lines of each in turn, as a kernel reading them as parallel
 * streams would). Only for this task: forgotten when the wait ends. */
void kwk_pool_prefetch(struct kwk_pool *p, int ith, const struct kwk_span *s, int count);
/* Lines thread ith has asked for so far (statistics and tests; a worker's count of the wait
 * after the last task may still be growing). */
long kwk_pool_prefetched(const struct kwk_pool *p, int ith);
/* Inside a task: wait until every thread of the pool reaches this barrier. */
void kwk_pool_barrier(struct kwk_pool *p);

/* Split [0, n) into nth parts aligned to `align`; thread ith gets [*lo, *hi). */
void kwk_split_range(long n, int ith, int nth, long align, long *lo, long *hi);

#endif
