/* test.h - the tiny C test harness: T_EQ(a, b) prints both values on failure; main() reports
 * "N passed, N failed". Include once per test executable. */
#ifndef KWK_TEST_H
#define KWK_TEST_H

#include <cpuid.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Random test data: a fixed xorshift sequence, so each test binary draws the same numbers run
 * after run. A file may #define T_RNG_SEED before including this header for another sequence. */
#ifndef T_RNG_SEED
#define T_RNG_SEED 0x2545f4914f6cdd1dull
#endif
static uint64_t t_rng_state = T_RNG_SEED;

static inline uint32_t t_rnd(void)
{
    t_rng_state ^= t_rng_state << 13;
    t_rng_state ^= t_rng_state >> 7;
    t_rng_state ^= t_rng_state << 17;
    return (uint32_t)(t_rng_state >> 16);
}

/* Uniform in [lo, hi). */
static inline float t_frand(float lo, float hi)
{
    return lo + (hi - lo) * (float)(t_rnd() & 0xffffff) / 16777216.0f;
}

static int t_passed, t_failed;

#define T_CHECK(cond, fmt, ...)                                                                  \
    do {                                                                                         \
        if (cond) {                                                                              \
            t_passed++;                                                                          \
        } else {                                                                                 \
            t_failed++;                                                                          \
            fprintf(stderr, "%s:%d: FAIL " fmt "\n", __FILE__, __LINE__, __VA_ARGS__);            \
        }                                                                                        \
    } while (0)

#define T_TRUE(c) T_CHECK((c), "%s", #c)
/* Each argument is evaluated once: a failing check prints the values it compared, not a second
 * evaluation of calls with side effects. */
#define T_EQ(a, b)                                                                               \
    do {                                                                                         \
        long long t_a_ = (long long)(a), t_b_ = (long long)(b);                                  \
        T_CHECK(t_a_ == t_b_, "%s == %s (%lld vs %lld)", #a, #b, t_a_, t_b_);                    \
    } while (0)
#define T_STREQ(a, b)                                                                            \
    do {                                                                                         \
        const char *t_a_ = (a), *t_b_ = (b);                                                     \
        T_CHECK(strcmp(t_a_, t_b_) == 0, "%s == %s (\"%s\" vs \"%s\")", #a, #b, t_a_, t_b_);     \
    } while (0)
#define T_CONTAINS(hay, needle)                                                                  \
    do {                                                                                         \
        const char *t_h_ = (hay), *t_n_ = (needle);                                              \
        T_CHECK(strstr(t_h_, t_n_) != NULL, "\"%s\" contains \"%s\"", t_h_, t_n_);              \
    } while (0)
#define T_NEAR(a, b, tol)                                                                        \
    do {                                                                                         \
        double t_a_ = (double)(a), t_b_ = (double)(b), t_t_ = (double)(tol);                     \
        T_CHECK(fabs(t_a_ - t_b_) <= t_t_, "%s ~ %s (%.9g vs %.9g, tol %g)", #a, #b, t_a_, t_b_, \
                t_t_);                                                                           \
    } while (0)

/* Whether the CPU has AVX2 and AVX-VNNI (CPUID leaf 7 subleaf 1, EAX bit 4), read apart from
 * the library's own kwk_cpu_avxvnni, which the tests check against it (clang before 16 does not
 * know __builtin_cpu_supports("avxvnni")). */
static inline int t_cpu_avxvnni(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
           (a >> 4 & 1);
}

/* AMX-TILE and AMX-INT8 in CPUID, with the OS saving the tile state (XCR0 bits 17 and 18: the
 * kernels that do, Linux 5.16 and later, also grant it on request). */
static inline int t_cpu_amx(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(1, 0, &a, &b, &c, &d) || !(c >> 27 & 1)) /* OSXSAVE */
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & 0x60000) == 0x60000 && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
           (d >> 24 & 1) && (d >> 25 & 1);
}

/* And AMX-BF16 (CPUID 7.0 EDX bit 22) with AVX512_BF16 (7.1 EAX bit 5): the AMX attention. */
static inline int t_cpu_amx_bf16(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!t_cpu_amx() || !__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 22 & 1))
        return 0;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);
}

/* A file of the shared data (ctest runs in the checkout: ../shared/data beside it; or
 * $KWKER_SHARED_DATA), NUL-terminated, to free; NULL (a failed check) when it cannot be read. */
static inline char *t_read_shared(const char *rel)
{
    const char *data = getenv("KWKER_SHARED_DATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", data && *data ? data : "../shared/data", rel);
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (f && !fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
        (buf = calloc(1, (size_t)n + 1)) && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    if (f)
        fclose(f);
    T_CHECK(buf != NULL, "cannot read %s (set KWKER_SHARED_DATA)", path);
    return buf;
}

static int t_report(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, t_passed, t_failed);
    return t_failed ? 1 : 0;
}

#endif
