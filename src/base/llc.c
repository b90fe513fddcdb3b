/* llc.c - the last-level cache's size as Linux describes the caches under
 * /sys/devices/system/cpu/cpuN/cache/indexI (level, type, size, shared_cpu_list).
 *
 * Why not sysconf(_SC_LEVEL3_CACHE_SIZE): glibc reads it on AMD from CPUID leaf 0x80000006,
 * which a hypervisor may fill with the whole socket's L3. An AMD EPYC (Zen 4) guest here reported
 * 320 MiB there, ten CCDs' worth, while a core can fill only its own CCD's 32 MiB, which the
 * cache topology (leaf 0x8000001D, and so sysfs) gives. Threads on different CCDs (or sockets)
 * each fill their own, so the instances the process may run on are summed. */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define MAX_INDEX 16 /* cache descriptions a CPU has at most (4-6 in practice) */

long long kwk_cache_size_parse(const char *s)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    long long v = strtoll(s, &end, 10), unit = 1;
    if (errno)
        return -1;
    if (*end == 'K')
        unit = 1LL << 10, end++;
    else if (*end == 'M')
        unit = 1LL << 20, end++;
    else if (*end == 'G')
        unit = 1LL << 30, end++;
    while (*end == '\n' || *end == ' ')
        end++;
    if (*end || v > LLONG_MAX / unit)
        return -1;
    return v * unit;
}

int kwk_cpu_list_mark(const char *s, unsigned char *mark, int n_mark)
{
    const char *p = s;
    /* check the whole list first, so that a malformed one marks nothing */
    for (int pass = 0; pass < 2; pass++) {
        p = s;
        for (;;) {
            char *end;
            if (*p < '0' || *p > '9')
                return -1;
            errno = 0;
            long a = strtol(p, &end, 10), b = a;
            if (errno || a > INT_MAX)
                return -1;
            p = end;
            if (*p == '-') {
                p++;
                if (*p < '0' || *p > '9')
                    return -1;
                b = strtol(p, &end, 10);
                if (errno || b > INT_MAX || b < a)
                    return -1;
                p = end;
            }
            if (pass == 1)
                for (long c = a; c <= b && c < n_mark; c++)
                    mark[c] = 1;
            if (*p == ',') {
                p++;
                continue;
            }
            if (*p == '\n')
                p++;
            if (*p)
                return -1;
            break;
        }
    }
    return 0;
}

/* The first line of root/cpu<cpu>/cache/index<idx>/<name> into buf; 0, or -1 if unreadable or
 * longer than buf holds (a truncated list would name CPUs it does not). */
static int read_attr(const char *root, int cpu, int idx, const char *name, char *buf, int n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/cpu%d/cache/index%d/%s", root, cpu, idx, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int ok = fgets(buf, n, f) != NULL;
    if (ok && strlen(buf) == (size_t)n - 1 && buf[n - 2] != '\n' && fgetc(f) != EOF)
        ok = 0;
    fclose(f);
    return ok ? 0 : -1;
}

/* The index of cpu's highest-level data or unified cache, its level in *level; -1 if none. */
static int last_level_index(const char *root, int cpu, int *level)
{
    int best = -1;
    *level = 0;
    for (int i = 0; i < MAX_INDEX; i++) {
        char lv[32], type[32];
        if (read_attr(root, cpu, i, "level", lv, sizeof lv) != 0)
            break;
        if (read_attr(root, cpu, i, "type", type, sizeof type) == 0 && type[0] == 'I')
            continue; /* Instruction */
        int l = atoi(lv);
        if (l > *level)
            *level = l, best = i;
    }
    return best;
}

/* A shared_cpu_list's room: "0-1023" style ranges are short, but a list of single CPUs (SMT
 * siblings numbered apart) on a large machine is not. */
#define LIST_BYTES 8192

double kwk_llc_bytes_from(const char *root, const int *cpus, int n_cpus)
{
    int level0 = 0, n_ids = 0, n_mark = 0;
    for (int c = 0; c < n_cpus; c++)
        if (cpus[c] >= n_mark)
            n_mark = cpus[c] + 1;
    int *ids = n_cpus > 0 ? malloc((size_t)n_cpus * sizeof *ids) : NULL;
    /* covered[c]: CPU c shares an instance already counted, so its files need no reading (one
     * CPU's reads an instance, not ~10 small files a CPU: a 256-CPU host reads 8-16 sets) */
    unsigned char *covered = n_mark > 0 ? calloc((size_t)n_mark, 1) : NULL;
    char *shared = malloc(LIST_BYTES);
    double total = 0.0;
    if (!ids || !covered || !shared) {
        free(ids), free(covered), free(shared);
        return 0.0;
    }
    for (int c = 0; c < n_cpus; c++) {
        if (cpus[c] < 0 || covered[cpus[c]])
            continue;
        int level, i = last_level_index(root, cpus[c], &level);
        char size[64];
        if (i < 0 || read_attr(root, cpus[c], i, "size", size, sizeof size) != 0)
            continue;
        if (level0 == 0)
            level0 = level;
        if (level != level0)
            continue; /* a CPU whose last level differs (hybrid parts): the first one's counts */
        long long bytes = kwk_cache_size_parse(size);
        if (bytes <= 0)
            continue;
        /* an instance is known by the first CPU that shares it (its CPU's own without a list)
         * and counted once */
        int id = cpus[c], seen = 0;
        if (read_attr(root, cpus[c], i, "shared_cpu_list", shared, LIST_BYTES) == 0 &&
            shared[0] >= '0' && shared[0] <= '9') {
            id = atoi(shared);
            kwk_cpu_list_mark(shared, covered, n_mark); /* malformed: marks nothing */
        }
        for (int d = 0; d < n_ids && !seen; d++)
            seen = ids[d] == id;
        if (!seen) {
            ids[n_ids++] = id;
            total += (double)bytes;
        }
    }
    free(ids), free(covered), free(shared);
    return total;
}

int kwk_affinity_cpus(int **cpus)
{
    *cpus = NULL;
    /* a set sized for the machine: a fixed cpu_set_t covers 1024 CPUs, and sched_getaffinity
     * fails with EINVAL where the kernel's mask is larger */
    for (int n = 1024; n <= (1 << 22); n *= 2) {
        cpu_set_t *set = CPU_ALLOC(n);
        size_t bytes = CPU_ALLOC_SIZE(n);
        if (!set)
            return -1;
        CPU_ZERO_S(bytes, set);
        if (sched_getaffinity(0, bytes, set) != 0) {
            CPU_FREE(set);
            if (errno == EINVAL)
                continue;
            return -1;
        }
        int count = CPU_COUNT_S(bytes, set), k = 0;
        int *list = malloc((size_t)(count > 0 ? count : 1) * sizeof *list);
        if (list)
            for (int c = 0; c < n && k < count; c++)
                if (CPU_ISSET_S(c, bytes, set))
                    list[k++] = c;
        CPU_FREE(set);
        if (!list)
            return -1;
        *cpus = list;
        return k;
    }
    return -1;
}
