/* fuzz_sysfs.c - libFuzzer target over the two sysfs texts llc.c parses to size the last-level
 * cache: a cache's size ("32768K") and a CPU list ("0-3,8,10-11"). The input is the size, a NUL,
 * then the list. The kernel writes these files, not a user, but a parser that could overrun on an
 * odd one would take the library down at start-up, so they get the others' treatment: each text
 * parses or is refused, never crashes; a refused list marks nothing; a parsed size is not
 * negative; and an accepted list marks exactly the CPUs it names below the mark array's end,
 * which a second, independent reading of the list checks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define FUZZ_MAX_INPUT 4096
#define N_MARK 64 /* small, so that lists run past the array's end */

/* The CPUs an accepted list names (digits, '-' and ',' only, as kwk_cpu_list_mark checked),
 * read again by hand. */
static void expect_marks(const char *s, unsigned char *want)
{
    while (*s && *s != '\n') {
        long a = 0, b;
        for (; *s >= '0' && *s <= '9'; s++) /* past INT_MAX the library refuses the list */
            a = a * 10 + (*s - '0');
        b = a;
        if (*s == '-') {
            s++;
            b = 0;
            for (; *s >= '0' && *s <= '9'; s++)
                b = b * 10 + (*s - '0');
        }
        for (long c = a; c <= b && c < N_MARK; c++)
            want[c] = 1;
        if (*s == ',')
            s++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FUZZ_MAX_INPUT)
        return 0;
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    size_t n_size = strlen(text);
    const char *list = text + n_size + (n_size < size); /* after the NUL, or "" */
    if (kwk_cache_size_parse(text) < -1)
        abort(); /* -1 is the only refusal */
    unsigned char mark[N_MARK] = {0}, want[N_MARK] = {0};
    int rc = kwk_cpu_list_mark(list, mark, N_MARK);
    if (rc == 0)
        expect_marks(list, want);
    else if (rc != -1)
        abort();
    if (memcmp(mark, want, sizeof mark) != 0)
        abort(); /* a refused list marked something, or an accepted one the wrong CPUs */
    free(text);
    return 0;
}
