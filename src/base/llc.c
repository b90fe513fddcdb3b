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
#include <stdio.h>
#include <stdlib.h>

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

/* The first line of root/cpu<cpu>/cache/index<idx>/<name> into buf; 0, or -1 if unreadable. */
static int read_attr(const char *root, int cpu, int idx, const char *name, char *buf, int n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/cpu%d/cache/index%d/%s", root, cpu, idx, name);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int ok = fgets(buf, n, f) != NULL;
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

double kwk_llc_bytes_from(const char *root, const int *cpus, int n_cpus)
{
    int level0 = 0, n_ids = 0;
    int *ids = n_cpus > 0 ? malloc((size_t)n_cpus * sizeof *ids) : NULL;
    double total = 0.0;
    if (!ids)
        return 0.0;
    for (int c = 0; c < n_cpus; c++) {
        int level, i = last_level_index(root, cpus[c], &level);
        char size[64], shared[256];
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
        if (read_attr(root, cpus[c], i, "shared_cpu_list", shared, sizeof shared) == 0 &&
            shared[0] >= '0' && shared[0] <= '9')
            id = atoi(shared);
        for (int d = 0; d < n_ids && !seen; d++)
            seen = ids[d] == id;
        if (!seen) {
            ids[n_ids++] = id;
            total += (double)bytes;
        }
    }
    free(ids);
    return total;
}
