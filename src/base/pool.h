/* pool.h - the persistent compute thread pool: one task at a time, run by every thread.
 * A pool is driven by one thread at a time (its owner); tasks run on the owner plus n-1 workers. */
#ifndef KWK_POOL_H
#define KWK_POOL_H

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

/* Inside a task: wait until every thread of the pool reaches this barrier. */
void kwk_pool_barrier(struct kwk_pool *p);

/* Split [0, n) into nth parts aligned to `align`; thread ith gets [*lo, *hi). */
void kwk_split_range(long n, int ith, int nth, long align, long *lo, long *hi);

#endif
