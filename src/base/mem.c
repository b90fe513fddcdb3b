/* mem.c - allocation wrappers (with a fail-the-Nth hook for tests). Any thread; the hook is for
 * single-threaded tests only. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"

static _Atomic long fail_countdown; /* 0: never fail */

void kwk_alloc_fail_after(long n)
{
    atomic_store_explicit(&fail_countdown, n, memory_order_relaxed);
}

static int should_fail(void)
{
    long n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    if (n <= 0)
        return 0;
    atomic_store_explicit(&fail_countdown, n - 1, memory_order_relaxed);
    return n == 1;
}

void *kwk_malloc(size_t n)
{
    return should_fail() ? NULL : malloc(n ? n : 1);
}

void *kwk_calloc(size_t count, size_t size)
{
    return should_fail() ? NULL : calloc(count ? count : 1, size ? size : 1);
}

void *kwk_realloc(void *p, size_t n)
{
    return should_fail() ? NULL : realloc(p, n ? n : 1);
}

void kwk_free(void *p)
{
    free(p);
}

char *kwk_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = kwk_malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

#define KWK_HUGE_PAGE ((size_t)2 << 20)
#define KWK_HUGE_MIN ((size_t)4 << 20)

void *kwk_malloc_aligned(size_t n)
{
    if (should_fail())
        return NULL;
    /* Big buffers (weights, KV caches, packed matrices) are read once per token: on 2 MiB
     * pages they read about 1.5x faster than on 4 KiB pages here, so they start on a huge-page
     * boundary and ask for huge pages (THP "madvise" mode; "always" gives them anyway). */
    size_t align = n >= KWK_HUGE_MIN ? KWK_HUGE_PAGE : 64;
    size_t rounded = (n + 63) & ~(size_t)63; /* padding never touched costs no resident memory */
    void *p = NULL;
    if (rounded < n || posix_memalign(&p, align, rounded ? rounded : 64) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (align == KWK_HUGE_PAGE) /* whole huge pages inside the buffer; advice only */
        madvise(p, rounded & ~(KWK_HUGE_PAGE - 1), MADV_HUGEPAGE);
#endif
    return p;
}

void kwk_free_aligned(void *p)
{
    free(p);
}

void kwk_mem_small_pages(void *p, size_t n)
{
    /* whole pages inside [p, p + n) only: advice about a neighbour's pages is not ours to give */
#ifdef MADV_NOHUGEPAGE
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
    if (p && hi > lo)
        madvise((void *)lo, hi - lo, MADV_NOHUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}
