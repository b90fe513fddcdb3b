/* test_llc.c - the last-level cache's size (base/llc.c): sysfs size strings, the sum over
 * distinct instances in made-up trees (one shared L3, one L3 a core complex, a CPU without a
 * list, instruction caches and missing files), and on this machine that kwk_cpu_llc_bytes is
 * what its own sysfs describes, not glibc's figure, where the two differ. Single-threaded. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "test.h"

static void test_parse(void)
{
    T_EQ(kwk_cache_size_parse("32768K\n"), 32LL << 20);
    T_EQ(kwk_cache_size_parse("1M"), 1LL << 20);
    T_EQ(kwk_cache_size_parse("2G\n"), 2LL << 30);
    T_EQ(kwk_cache_size_parse("512"), 512);
    T_EQ(kwk_cache_size_parse("0K"), 0);
    T_EQ(kwk_cache_size_parse(""), -1);
    T_EQ(kwk_cache_size_parse("K"), -1);
    T_EQ(kwk_cache_size_parse("-1K"), -1);
    T_EQ(kwk_cache_size_parse(" 1K"), -1);
    T_EQ(kwk_cache_size_parse("12Q"), -1);
    T_EQ(kwk_cache_size_parse("1KK"), -1);
    T_EQ(kwk_cache_size_parse("99999999999999999999K"), -1);
    T_EQ(kwk_cache_size_parse("9223372036854775807K"), -1);
}

static void test_lists(void)
{
    unsigned char m[16];
    memset(m, 0, sizeof m);
    T_EQ(kwk_cpu_list_mark("0-3,8,10-11\n", m, 16), 0);
    const unsigned char want[16] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0};
    T_TRUE(memcmp(m, want, 16) == 0);
    memset(m, 0, sizeof m);
    T_EQ(kwk_cpu_list_mark("5", m, 16), 0);
    T_EQ(m[5], 1);
    T_EQ(kwk_cpu_list_mark("14-40\n", m, 16), 0); /* past n_mark: left out */
    T_EQ(m[15], 1);
    /* malformed lists mark nothing, not even their well-formed start */
    const char *bad[] = {"", "\n", "a", "1-", "-1", "3-1", "1,,2", "1,", "1 2", "0-3\n\n",
                         "1-2-3", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(m, 0, sizeof m);
        T_EQ(kwk_cpu_list_mark(bad[i], m, 16), -1);
        unsigned char none[16] = {0};
        T_TRUE(memcmp(m, none, 16) == 0);
    }
}

static char root[64];

/* root/cpu<cpu>/cache/index<idx>/ with its files; shared NULL: no shared_cpu_list. */
static void put_cache(int cpu, int idx, int level, const char *type, const char *size,
                      const char *shared)
{
    char path[256];
    snprintf(path, sizeof path, "%s/cpu%d", root, cpu);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/cpu%d/cache", root, cpu);
    mkdir(path, 0700);
    snprintf(path, sizeof path, "%s/cpu%d/cache/index%d", root, cpu, idx);
    T_TRUE(mkdir(path, 0700) == 0 || errno == EEXIST);
    const char *names[] = {"level", "type", "size", "shared_cpu_list"};
    char lv[16];
    snprintf(lv, sizeof lv, "%d\n", level);
    const char *values[] = {lv, type, size, shared};
    for (int i = 0; i < 4; i++) {
        if (!values[i])
            continue;
        char file[320];
        snprintf(file, sizeof file, "%s/%s", path, names[i]);
        FILE *f = fopen(file, "w");
        T_TRUE(f != NULL);
        if (f) {
            fputs(values[i], f);
            fclose(f);
        }
    }
}

static void remove_tree(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    T_EQ(system(cmd), 0);
}

/* A core with L1d, L1i and L2 of its own, and an L3 described by shared. */
static void put_core(int cpu, const char *l3, const char *shared)
{
    put_cache(cpu, 0, 1, "Data\n", "32K\n", NULL);
    put_cache(cpu, 1, 1, "Instruction\n", "32K\n", NULL);
    put_cache(cpu, 2, 2, "Unified\n", "1024K\n", NULL);
    put_cache(cpu, 3, 3, "Unified\n", l3, shared);
}

static void test_trees(void)
{
    snprintf(root, sizeof root, "/tmp/kwk_llc_XXXXXX");
    T_TRUE(mkdtemp(root) != NULL);
    /* this host's guest: two CPUs sharing one 32 MiB L3 */
    put_core(0, "32768K\n", "0-1\n");
    put_core(1, "32768K\n", "0-1\n");
    int both[] = {0, 1}, one[] = {1};
    T_EQ(kwk_llc_bytes_from(root, both, 2), 32.0 * (1 << 20));
    T_EQ(kwk_llc_bytes_from(root, one, 1), 32.0 * (1 << 20));
    /* two more CPUs on another core complex: its L3 counts once more, only when they are ours */
    put_core(2, "32768K\n", "2,3\n");
    put_core(3, "32768K\n", "2,3\n");
    int four[] = {0, 1, 2, 3}, odd[] = {1, 3}, upper[] = {2, 3};
    T_EQ(kwk_llc_bytes_from(root, four, 4), 64.0 * (1 << 20));
    T_EQ(kwk_llc_bytes_from(root, odd, 2), 64.0 * (1 << 20));
    T_EQ(kwk_llc_bytes_from(root, upper, 2), 32.0 * (1 << 20));
    /* a CPU whose L3 has no list is its own instance */
    put_core(4, "16M\n", NULL);
    int five[] = {0, 1, 2, 3, 4};
    T_EQ(kwk_llc_bytes_from(root, five, 5), 80.0 * (1 << 20));
    /* a CPU whose last level is L2 beside L3 ones: left out (the first CPU's level counts) */
    put_cache(5, 0, 1, "Data\n", "48K\n", NULL);
    put_cache(5, 1, 2, "Unified\n", "2M\n", "5\n");
    int mixed[] = {0, 5}, l2first[] = {5, 0};
    T_EQ(kwk_llc_bytes_from(root, mixed, 2), 32.0 * (1 << 20));
    T_EQ(kwk_llc_bytes_from(root, l2first, 2), 2.0 * (1 << 20));
    /* an instruction cache of a higher level does not count */
    put_cache(6, 0, 2, "Unified\n", "1M\n", "6\n");
    put_cache(6, 1, 3, "Instruction\n", "64M\n", "6\n");
    int six[] = {6};
    T_EQ(kwk_llc_bytes_from(root, six, 1), 1.0 * (1 << 20));
    /* a CPU covered by an instance already counted is not read: cpu 9's own files (a list
     * naming only itself, another size) would count 16 MiB more */
    put_core(8, "32M\n", "8-9\n");
    put_core(9, "16M\n", "9\n");
    int pair[] = {8, 9}, nine[] = {9};
    T_EQ(kwk_llc_bytes_from(root, pair, 2), 32.0 * (1 << 20));
    T_EQ(kwk_llc_bytes_from(root, nine, 1), 16.0 * (1 << 20));
    /* a list longer than a small buffer (single CPUs apart, as SMT siblings on large machines):
     * read whole; one longer than llc.c's buffer is not trusted (cpu 12 then counts alone, and
     * cpu 13 is read) */
    char *list = malloc(20000);
    T_TRUE(list != NULL);
    if (list) {
        int k = 0;
        for (int c = 10; c < 1200; c += 2)
            k += snprintf(list + k, 20000 - k, "%s%d", c > 10 ? "," : "", c);
        snprintf(list + k, 20000 - k, "\n");
        put_core(10, "8M\n", list);
        put_core(11, "4M\n", "11\n");
        put_core(1000, "1M\n", "1000\n"); /* in cpu 10's list: not read */
        int ten_eleven[] = {10, 11, 1000};
        T_EQ(kwk_llc_bytes_from(root, ten_eleven, 3), 12.0 * (1 << 20));
        k = 0;
        for (int c = 12; c < 3000; c++) /* ~15 KB */
            k += snprintf(list + k, 20000 - k, "%s%d", c > 12 ? "," : "", c);
        snprintf(list + k, 20000 - k, "\n");
        put_core(12, "2M\n", list);
        put_core(13, "2M\n", "13\n");
        int twelve[] = {12, 13};
        T_EQ(kwk_llc_bytes_from(root, twelve, 2), 4.0 * (1 << 20));
        free(list);
    }
    /* unreadable or nonsense sizes, CPUs without caches, no CPUs: nothing */
    put_cache(7, 0, 3, "Unified\n", "lots\n", "7\n");
    int seven[] = {7}, absent[] = {42};
    T_EQ(kwk_llc_bytes_from(root, seven, 1), 0.0);
    T_EQ(kwk_llc_bytes_from(root, absent, 1), 0.0);
    T_EQ(kwk_llc_bytes_from(root, both, 0), 0.0);
    T_EQ(kwk_llc_bytes_from("/nonexistent/kwk", both, 2), 0.0);
    remove_tree();
}

/* This machine: the CPUs the process may run on are those sched_getaffinity names; where sysfs
 * describes their caches, kwk_cpu_llc_bytes is its sum over them, at least each one's own
 * instance and at most one instance a CPU; else glibc's figure (or 0). */
static void test_this_machine(void)
{
    double llc = kwk_cpu_llc_bytes();
    int *cpus, n = kwk_affinity_cpus(&cpus);
    T_TRUE(n >= 1 && cpus != NULL);
    cpu_set_t set;
    CPU_ZERO(&set);
    T_EQ(sched_getaffinity(0, sizeof set, &set), 0);
    T_EQ(n, CPU_COUNT(&set)); /* this machine has fewer than CPU_SETSIZE CPUs */
    for (int i = 0; i < n; i++)
        T_TRUE(CPU_ISSET(cpus[i], &set) && (i == 0 || cpus[i] > cpus[i - 1]));
    T_EQ(kwk_default_threads(), n); /* one thread a CPU we may run on */
    double sum = n > 0 ? kwk_llc_bytes_from("/sys/devices/system/cpu", cpus, n) : 0.0;
    printf("  last-level cache: %.1f MiB over %d CPUs (glibc says %ld KiB)\n", llc / (1 << 20),
           n, sysconf(_SC_LEVEL3_CACHE_SIZE) >> 10);
    T_TRUE(llc >= 0.0);
    if (sum > 0) {
        T_EQ(llc, sum);
        double most = 0.0;
        for (int i = 0; i < n; i++) {
            double own = kwk_llc_bytes_from("/sys/devices/system/cpu", cpus + i, 1);
            T_TRUE(own <= llc);
            most = own > most ? own : most;
        }
        T_TRUE(llc <= most * n);
    } else {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        T_EQ(llc, l3 > 0 ? (double)l3 : 0.0);
    }
    free(cpus);
    /* and kwk_cpu_past_llc follows it */
    T_EQ(kwk_cpu_past_llc(0.0), 0);
    T_EQ(kwk_cpu_past_llc(llc > 0 ? llc : 1e15), 0);
    T_EQ(kwk_cpu_past_llc(llc > 0 ? 2.0 * llc : 1e15), llc > 0);
}

int main(void)
{
    test_parse();
    test_lists();
    test_trees();
    test_this_machine();
    return t_report("test_llc");
}
