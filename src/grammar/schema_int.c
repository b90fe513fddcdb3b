/* schema_int.c - GBNF for the integers between two 64-bit bounds, digit by digit, in the shape
 * of llama.cpp's converter (so both print the same rules): a side left open allows up to 16
 * digits. One conversion's thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/schema.h"

#define OPEN_DIGITS 16 /* digits of an integer on an unbounded side */
#define UNBOUNDED (-1)

static void digit_range(struct sbuf *b, char from, char to)
{
    if (from == to)
        sb_printf(b, "[%c]", from);
    else
        sb_printf(b, "[%c-%c]", from, to);
}

/* [0-9]{min,max}; max UNBOUNDED: no upper count */
static void more_digits(struct sbuf *b, int min, int max)
{
    sb_puts(b, "[0-9]");
    if (min == max && min == 1)
        return;
    if (max != UNBOUNDED && max < min)
        max = min; /* a bound longer than the open side's digits: allow its length */
    sb_printf(b, "{%d", min);
    if (max != min) {
        sb_puts(b, ",");
        if (max != UNBOUNDED)
            sb_printf(b, "%d", max);
    }
    sb_puts(b, "}");
}

static int all_of(const char *s, size_t n, char ch)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ch)
            return 0;
    return 1;
}

/* The numbers from..to written with exactly as many digits as both have (leading zeros kept). */
static void uniform_range(struct sbuf *b, const char *from, const char *to, size_t len)
{
    size_t i = 0;
    while (i < len && from[i] == to[i])
        i++;
    if (i > 0) {
        sb_puts(b, "\"");
        sb_put(b, from, i);
        sb_puts(b, "\"");
    }
    if (i >= len)
        return;
    if (i > 0)
        sb_puts(b, " ");
    size_t sub = len - i - 1;
    if (sub == 0) {
        sb_printf(b, "[%c-%c]", from[i], to[i]);
        return;
    }
    char zeros[24], nines[24];
    memset(zeros, '0', sub);
    memset(nines, '9', sub);
    const char *from_sub = from + i + 1, *to_sub = to + i + 1;
    int to_reached = 0;
    sb_puts(b, "(");
    if (all_of(from_sub, sub, '0')) {
        digit_range(b, from[i], (char)(to[i] - 1));
        sb_puts(b, " ");
        more_digits(b, (int)sub, (int)sub);
    } else {
        sb_printf(b, "[%c] (", from[i]);
        uniform_range(b, from_sub, nines, sub);
        sb_puts(b, ")");
        if (from[i] < to[i] - 1) {
            sb_puts(b, " | ");
            if (all_of(to_sub, sub, '9')) {
                digit_range(b, (char)(from[i] + 1), to[i]);
                to_reached = 1;
            } else {
                digit_range(b, (char)(from[i] + 1), (char)(to[i] - 1));
            }
            sb_puts(b, " ");
            more_digits(b, (int)sub, (int)sub);
        }
    }
    if (!to_reached) {
        sb_puts(b, " | ");
        digit_range(b, to[i], to[i]);
        sb_puts(b, " ");
        uniform_range(b, zeros, to_sub, sub);
    }
    sb_puts(b, ")");
}

static void both_bounds(struct sbuf *b, int64_t lo, int64_t hi);

/* decimals: digits allowed on an open side; top: the number's first digit (no leading 0). */
static void min_max(struct sbuf *b, int has_lo, int64_t lo, int has_hi, int64_t hi,
                    int decimals, int top)
{
    int fewer = decimals - 1 > 1 ? decimals - 1 : 1;
    char s[24];
    if (has_lo && has_hi) {
        both_bounds(b, lo, hi);
        return;
    }
    if (has_lo) {
        if (lo < 0) {
            sb_puts(b, "\"-\" (");
            min_max(b, 0, 0, 1, -lo, decimals, 0);
            sb_puts(b, ") | [0] | [1-9] ");
            more_digits(b, 0, decimals - 1);
        } else if (lo == 0) {
            if (top) {
                sb_puts(b, "[0] | [1-9] ");
                more_digits(b, 0, fewer);
            } else {
                more_digits(b, 1, decimals);
            }
        } else if (lo <= 9) {
            char ch = (char)('0' + lo), start = top ? '1' : '0';
            if (ch > start) {
                digit_range(b, start, (char)(ch - 1));
                sb_puts(b, " ");
                more_digits(b, 1, fewer);
                sb_puts(b, " | ");
            }
            digit_range(b, ch, '9');
            sb_puts(b, " ");
            more_digits(b, 0, fewer);
        } else {
            int len = snprintf(s, sizeof s, "%lld", (long long)lo);
            char ch = s[0];
            if (ch > '1') {
                digit_range(b, top ? '1' : '0', (char)(ch - 1));
                sb_puts(b, " ");
                more_digits(b, len, fewer);
                sb_puts(b, " | ");
            }
            digit_range(b, ch, ch);
            sb_puts(b, " (");
            min_max(b, 1, (int64_t)strtoll(s + 1, NULL, 10), 0, 0, fewer, 0);
            sb_puts(b, ")");
            if (ch < '9') {
                sb_puts(b, " | ");
                digit_range(b, (char)(ch + 1), '9');
                sb_puts(b, " ");
                more_digits(b, len - 1, fewer);
            }
        }
        return;
    }
    if (hi >= 0) {
        if (top) {
            sb_puts(b, "\"-\" [1-9] ");
            more_digits(b, 0, fewer);
            sb_puts(b, " | ");
        }
        both_bounds(b, 0, hi);
    } else {
        sb_puts(b, "\"-\" (");
        min_max(b, 1, -hi, 0, 0, decimals, 0);
        sb_puts(b, ")");
    }
}

static void both_bounds(struct sbuf *b, int64_t lo, int64_t hi)
{
    char lo_s[24], hi_s[24];
    if (lo < 0 && hi < 0) {
        sb_puts(b, "\"-\" (");
        both_bounds(b, -hi, -lo);
        sb_puts(b, ")");
        return;
    }
    if (lo < 0) {
        sb_puts(b, "\"-\" (");
        both_bounds(b, 0, -lo);
        sb_puts(b, ") | ");
        lo = 0;
    }
    size_t n_lo = (size_t)snprintf(lo_s, sizeof lo_s, "%lld", (long long)lo);
    size_t n_hi = (size_t)snprintf(hi_s, sizeof hi_s, "%lld", (long long)hi);
    for (size_t digits = n_lo; digits < n_hi; digits++) {
        char nines[24];
        memset(nines, '9', digits);
        uniform_range(b, lo_s, nines, digits);
        lo_s[0] = '1';
        memset(lo_s + 1, '0', digits);
        lo_s[digits + 1] = 0;
        sb_puts(b, " | ");
    }
    uniform_range(b, lo_s, hi_s, n_hi);
}

void gen_int_range(struct sbuf *b, int has_lo, int64_t lo, int has_hi, int64_t hi)
{
    /* -(2^63) has no positive twin; the open side already allows what lies past it */
    if (has_lo && lo == INT64_MIN)
        has_lo = 0;
    if (!has_lo && !has_hi) {
        sb_puts(b, "\"-\"? ([0] | [1-9] [0-9]{0,15})");
        return;
    }
    min_max(b, has_lo, lo, has_hi, hi, OPEN_DIGITS, 1);
}
