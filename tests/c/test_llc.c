/* test_llc.c - the last-level cache's size (base/llc.c): sysfs size strings, the sum over
 * distinct instances in made-up trees (one shared L3, one L3 a core complex, a CPU without a
 * list, instruction caches and missing files), and on this machine that kwk_cpu_llc_bytes is
 * what its own sysfs describes, not glibc's figure, where the two differ. Single-threaded. */
#include <errno.h>
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
    /* unreadable or nonsense sizes, CPUs without caches, no CPUs: nothing */
    put_cache(7, 0, 3, "Unified\n", "lots\n", "7\n");
    int seven[] = {7}, absent[] = {42};
    T_EQ(kwk_llc_bytes_from(root, seven, 1), 0.0);
    T_EQ(kwk_llc_bytes_from(root, absent, 1), 0.0);
    T_EQ(kwk_llc_bytes_from(root, both, 0), 0.0);
    T_EQ(kwk_llc_bytes_from("/nonexistent/kwk", both, 2), 0.0);
    remove_tree();
}

/* This machine: where sysfs describes cpu0's caches, the size kwk_cpu_llc_bytes gives is a whole
 * number of cpu0's last-level caches, at most one a CPU; else glibc's figure (or 0). */
static void test_this_machine(void)
{
    double llc = kwk_cpu_llc_bytes();
    int cpu0[] = {0};
    double own = kwk_llc_bytes_from("/sys/devices/system/cpu", cpu0, 1);
    long n = sysconf(_SC_NPROCESSORS_CONF);
    printf("  last-level cache: %.1f MiB (cpu0's instance %.1f MiB; glibc says %ld KiB)\n",
           llc / (1 << 20), own / (1 << 20), sysconf(_SC_LEVEL3_CACHE_SIZE) >> 10);
    T_TRUE(llc >= 0.0);
    if (own > 0) {
        double k = llc / own;
        T_TRUE(k >= 1.0 && k == (double)(long)k && k <= (double)(n > 0 ? n : 1));
    } else {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        T_EQ(llc, l3 > 0 ? (double)l3 : 0.0);
    }
    /* and kwk_cpu_past_llc follows it */
    T_EQ(kwk_cpu_past_llc(0.0), 0);
    T_EQ(kwk_cpu_past_llc(llc > 0 ? llc : 1e15), 0);
    T_EQ(kwk_cpu_past_llc(llc > 0 ? 2.0 * llc : 1e15), llc > 0);
}

int main(void)
{
    test_parse();
    test_trees();
    test_this_machine();
    return t_report("test_llc");
}
