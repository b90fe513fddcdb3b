/* misc.c - half floats, logging, clocks. Any thread. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"

float kwk_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    union { uint32_t u; float f; } v;
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24 */
        float f = (float)man * (1.0f / 16777216.0f);
        v.f = f;
        v.u |= sign;
        return v.f;
    }
    if (exp == 31)
        v.u = sign | 0x7f800000u | (man << 13);
    else
        v.u = sign | ((exp + 112) << 23) | (man << 13);
    return v.f;
}

static int log_level(void)
{
    static int level = -1;
    int l = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (l >= 0)
        return l;
    const char *e = getenv("KWKER_LOG");
    l = KWK_LOG_WARN;
    if (e) {
        if (!strcmp(e, "error")) l = KWK_LOG_ERROR;
        else if (!strcmp(e, "info")) l = KWK_LOG_INFO;
        else if (!strcmp(e, "debug")) l = KWK_LOG_DEBUG;
    }
    __atomic_store_n(&level, l, __ATOMIC_RELAXED);
    return l;
}

void kwk_log(int level, const char *fmt, ...)
{
    if (level > log_level())
        return;
    static const char *names[] = {"error", "warn", "info", "debug"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kwker %s: %s\n", names[level], line);
}

int kwk_env_word(const char *name, const char *const *words, int n)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return -1;
    char choices[256] = "";
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(v, words[i]))
            return i;
        int k = snprintf(choices + at, sizeof choices - at, "%s%s", i ? "|" : "", words[i]);
        at = k > 0 ? KWK_MIN(sizeof choices - 1, at + (size_t)k) : at;
    }
    kwk_log(KWK_LOG_WARN, "%s=%s is not %s; ignored", name, v, choices);
    return -1;
}

double kwk_time_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
