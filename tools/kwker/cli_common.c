/* cli_common.c - option parsing helpers shared by the kwker subcommands. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_parse_ids(const char *s, int *ids, int cap)
{
    int n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 0x7fffffff || n >= cap)
            return -1;
        ids[n++] = (int)v;
        s = end;
        if (*s == ',')
            s++;
        else if (*s)
            return -1;
    }
    return n;
}

int cli_parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

int cli_parse_precision(const char *s)
{
    if (!strcmp(s, "preserve"))
        return KWK_PRECISION_PRESERVE;
    if (!strcmp(s, "balanced") || !strcmp(s, "int8"))
        return KWK_PRECISION_BALANCED;
    if (!strcmp(s, "int4"))
        return KWK_PRECISION_INT4;
    return -1;
}

const char *cli_cache_dir(const char *v)
{
    static char home_dir[4096];
    if (v)
        return strcmp(v, "off") ? v : NULL;
    const char *env = getenv("KWKER_CACHE");
    if (env)
        return env[0] && strcmp(env, "off") ? env : NULL;
    const char *home = getenv("HOME");
    if (!home || !home[0])
        return NULL;
    int n = snprintf(home_dir, sizeof home_dir, "%s/.cache/kwker/packs", home);
    return n > 0 && (size_t)n < sizeof home_dir ? home_dir : NULL;
}
