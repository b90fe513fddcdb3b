/* hugemap.c - putting a read-only file mapping on 2 MiB pages (issue 6). Load time only; any
 * thread, but it reads the whole file and may evict it from the page cache, so callers run it
 * once per file.
 *
 * Why: generation reads every weight once per token, and here a sequential read of memory
 * mapped with 2 MiB pages runs up to 1.5x faster than with 4 KiB pages (bw_probe); preserve
 * generation measured +2-3% (docs/benchmarks.md, session 9).
 * Kwker's packed weights (the pack cache, anonymous buffers) ask for huge pages; this is the same
 * for weights used in place from the checkpoint (preserve runs bf16 safetensors as stored).
 *
 * How: a file mapping can be PMD-mapped only where the page cache holds the file in 2 MiB folios,
 * which the kernel makes (with THP enabled and a file system that has large folios: ext4 and xfs
 * on recent kernels) when it reads the file in for a MADV_HUGEPAGE mapping. A file already
 * cached in small folios (written with write(), or read with read(): `cp`, a download, a hash)
 * stays so until evicted. So: advise, populate, and if the mapping is not mostly huge, try one
 * 2 MiB piece (evict it, read it back); when that piece comes back huge, do the whole file.
 * Eviction (POSIX_FADV_DONTNEED) drops only pages no process maps: another process using the
 * file keeps its pages, and this one shares them on small pages. The file is then read from disk
 * once; every later process finds it in huge folios. KWKER_HUGE_PAGES=0 turns this off (advice
 * only, the page cache left alone). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/base.h"

#define HUGE_BYTES ((size_t)2 << 20)

/* KiB of [lo, hi) mapped with PMDs, summed over the VMAs that start inside it (madvise may split
 * one mapping into several; the last ends on a page boundary past hi); -1 when /proc/self/smaps
 * cannot be read. */
static long pmd_kib(uintptr_t lo, uintptr_t hi)
{
    FILE *f = fopen("/proc/self/smaps", "re");
    if (!f)
        return -1;
    char line[512];
    int inside = 0;
    long kib = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b; /* b is read only to tell a header line from a field line */
        char dash;
        /* a VMA's header line starts with "start-end " in hex; its fields with "Name:" */
        if (sscanf(line, "%lx%c%lx ", &a, &dash, &b) == 3 && dash == '-') {
            inside = a >= lo && a < hi;
            continue;
        }
        long v;
        if (inside && sscanf(line, "FilePmdMapped: %ld kB", &v) == 1)
            kib += v;
    }
    fclose(f);
    return kib;
}

/* Drop this process's mapping of [off, off + len) and the page cache's unmapped pages of it, then
 * read it back in through the (MADV_HUGEPAGE) mapping. Returns the KiB of the mapping [lo, hi)
 * that this made PMD-mapped (-1 unknown). */
static long reread(const struct kwk_map *m, int fd, size_t off, size_t len)
{
    uintptr_t lo = (uintptr_t)m->data, hi = lo + m->size;
    madvise((void *)(m->data + off), len, MADV_DONTNEED);
    /* dirty pages (a file just written) are not evicted: write them back first */
    sync_file_range(fd, (off_t)off, (off_t)len,
                    SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                        SYNC_FILE_RANGE_WAIT_AFTER);
    posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    long dropped = pmd_kib(lo, hi);
    madvise((void *)(m->data + off), len, MADV_POPULATE_READ);
    long after = pmd_kib(lo, hi);
    return dropped < 0 || after < 0 ? -1 : after - dropped;
}

int kwk_map_huge(const struct kwk_map *m, const char *path)
{
#if defined(MADV_HUGEPAGE) && defined(MADV_POPULATE_READ)
    uintptr_t lo = (uintptr_t)m->data, hi = lo + m->size;
    if (!m->data)
        return 0;
    int advised = madvise((void *)m->data, m->size, MADV_HUGEPAGE) == 0;
    madvise((void *)m->data, m->size, MADV_POPULATE_READ); /* read in, huge pages or not */
    if (!advised || m->size < 2 * HUGE_BYTES || (lo & (HUGE_BYTES - 1)))
        return 0; /* no whole 2 MiB page of file offset and address alike */
    long want = (long)(m->size >> 11), before = pmd_kib(lo, hi); /* half the file, in KiB */
    if (before < 0 || before >= want)
        return before >= want;
    if (kwk_env_word("KWKER_HUGE_PAGES", (const char *const[]){"0", "1"}, 2) == 0)
        return 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    size_t probe = (m->size / 2) & ~(HUGE_BYTES - 1); /* one 2 MiB piece inside the file */
    if (reread(m, fd, probe, HUGE_BYTES) < (long)(HUGE_BYTES >> 10)) {
        close(fd);
        kwk_log(KWK_LOG_INFO, "%s: stays on 4 KiB pages (no 2 MiB page cache folios here)", path);
        return 0;
    }
    double t0 = kwk_time_s();
    reread(m, fd, 0, m->size);
    close(fd);
    long after = pmd_kib(lo, hi);
    kwk_log(KWK_LOG_INFO, "%s: read again into 2 MiB pages in %.2f s (%ld of %zu MiB huge)", path,
            kwk_time_s() - t0, after >> 10, m->size >> 20);
    return after >= want;
#else
    (void)m;
    (void)path;
    return 0;
#endif
}
