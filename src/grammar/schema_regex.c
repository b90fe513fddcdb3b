/* schema_regex.c - "pattern" (an ECMA-262 regular expression) to GBNF over a JSON string's
 * text, and code point sets written as JSON string characters. Literals, classes, `.`, \d \w
 * \s and their negations, groups, `|` and the quantifiers * + ? {m} {m,} {m,n} (lazy or not)
 * are converted; lookarounds, backreferences, \b, \p{..} and anchors inside the expression are
 * refused. The pattern is unanchored as in JSON Schema: a side without ^ or $ may hold any
 * characters. Characters matched by the pattern are spelled the one way jansson writes them
 * (raw UTF-8, the short escapes, \u00XX for other controls). One conversion's thread. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/schema.h"

#define CP_MAX 0x10FFFFu
#define RX_DEPTH_MAX 32

/* ---- code point sets ---- */

void cpset_add(struct cpset *s, uint32_t lo, uint32_t hi)
{
    if (s->n == SCHEMA_CLASS_MAX) {
        s->over = 1;
        return;
    }
    s->lo[s->n] = lo;
    s->hi[s->n] = hi;
    s->n++;
}

void cpset_normalize(struct cpset *s)
{
    /* insertion sort: classes are small */
    for (int i = 1; i < s->n; i++) {
        uint32_t lo = s->lo[i], hi = s->hi[i];
        int j = i - 1;
        for (; j >= 0 && s->lo[j] > lo; j--) {
            s->lo[j + 1] = s->lo[j];
            s->hi[j + 1] = s->hi[j];
        }
        s->lo[j + 1] = lo;
        s->hi[j + 1] = hi;
    }
    int n = 0;
    for (int i = 0; i < s->n; i++) {
        if (n && s->lo[i] <= s->hi[n - 1] + 1) {
            if (s->hi[i] > s->hi[n - 1])
                s->hi[n - 1] = s->hi[i];
        } else {
            s->lo[n] = s->lo[i];
            s->hi[n] = s->hi[i];
            n++;
        }
    }
    s->n = n;
}

/* s must be normalized */
void cpset_negate(struct cpset *s)
{
    struct cpset out = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->lo[i] > next)
            cpset_add(&out, next, s->lo[i] - 1);
        next = s->hi[i] + 1;
    }
    if (next <= CP_MAX)
        cpset_add(&out, next, CP_MAX);
    out.over |= s->over;
    *s = out;
}

int cpset_has(const struct cpset *s, uint32_t c)
{
    for (int i = 0; i < s->n; i++)
        if (c >= s->lo[i] && c <= s->hi[i])
            return 1;
    return 0;
}

static void class_char(struct sbuf *b, uint32_t c)
{
    int plain = c > 0x20 && c < 0x7F && !strchr("]\\-^\"[", (int)c);
    if (plain)
        sb_printf(b, "%c", (char)c);
    else if (c < 0x80)
        sb_printf(b, "\\x%02X", (unsigned)c);
    else if (c <= 0xFFFF)
        sb_printf(b, "\\u%04X", (unsigned)c);
    else
        sb_printf(b, "\\U%08X", (unsigned)c);
}

/* the raw part: s without " \ the controls and the surrogates */
static void gen_raw_class(struct sbuf *b, const struct cpset *s, int *n_alts)
{
    struct cpset raw = {0};
    static const uint32_t cut[][2] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0xD800, 0xDFFF}};
    for (int i = 0; i < s->n; i++) {
        uint32_t lo = s->lo[i], hi = s->hi[i];
        /* split [lo, hi] around each cut range */
        uint32_t pieces_lo[8], pieces_hi[8];
        int n = 1;
        pieces_lo[0] = lo;
        pieces_hi[0] = hi;
        for (size_t k = 0; k < KWK_ARRAY_LEN(cut); k++) {
            int m = 0;
            uint32_t nl[8], nh[8];
            for (int p = 0; p < n; p++) {
                uint32_t a = pieces_lo[p], z = pieces_hi[p];
                if (z < cut[k][0] || a > cut[k][1]) {
                    nl[m] = a, nh[m++] = z;
                    continue;
                }
                if (a < cut[k][0])
                    nl[m] = a, nh[m++] = cut[k][0] - 1;
                if (z > cut[k][1])
                    nl[m] = cut[k][1] + 1, nh[m++] = z;
            }
            memcpy(pieces_lo, nl, sizeof nl);
            memcpy(pieces_hi, nh, sizeof nh);
            n = m;
        }
        for (int p = 0; p < n; p++)
            cpset_add(&raw, pieces_lo[p], pieces_hi[p]);
    }
    if (!raw.n)
        return;
    sb_puts(b, "[");
    for (int i = 0; i < raw.n; i++) {
        class_char(b, raw.lo[i]);
        if (raw.hi[i] != raw.lo[i]) {
            if (raw.hi[i] > raw.lo[i] + 1)
                sb_puts(b, "-");
            class_char(b, raw.hi[i]);
        }
    }
    sb_puts(b, "]");
    (*n_alts)++;
}

void cpset_gen_json_char(struct sbuf *b, const struct cpset *s)
{
    static const char short_esc[][2] = {{'\b', 'b'}, {'\t', 't'}, {'\n', 'n'},
                                        {'\f', 'f'}, {'\r', 'r'}};
    char shorts[16];
    int n_short = 0, n_alts = 0;
    gen_raw_class(b, s, &n_alts);
    if (cpset_has(s, '"'))
        shorts[n_short++] = '"';
    if (cpset_has(s, '\\'))
        memcpy(shorts + n_short, "\\\\", 2), n_short += 2;
    for (size_t i = 0; i < KWK_ARRAY_LEN(short_esc); i++)
        if (cpset_has(s, (uint32_t)short_esc[i][0]))
            shorts[n_short++] = short_esc[i][1];
    if (n_short) {
        shorts[n_short] = 0;
        sb_printf(b, "%s\"\\\\\" [%s]", n_alts++ ? " | " : "", shorts);
    }
    /* the other controls as \u00XX, either case of hex digit */
    for (int hi = 0; hi < 2; hi++) {
        struct sbuf digits = {0};
        for (int lo = 0; lo < 16; lo++) {
            uint32_t c = (uint32_t)(hi * 16 + lo);
            int has_short = c == '\b' || c == '\t' || c == '\n' || c == '\f' || c == '\r';
            if (has_short || !cpset_has(s, c))
                continue;
            if (lo < 10)
                sb_printf(&digits, "%d", lo);
            else
                sb_printf(&digits, "%c%c", 'a' + lo - 10, 'A' + lo - 10);
        }
        if (digits.n)
            sb_printf(b, "%s\"\\\\u00%d\" [%s]", n_alts++ ? " | " : "", hi, digits.p);
        sb_free(&digits);
    }
}

/* ---- the regular expression ---- */

struct rx {
    struct sconv *c;
    const char *s;
    size_t i, n;
    const char *ptr;
    int depth;
};

static int rx_fail(struct rx *r, int code, const char *what)
{
    return sconv_fail(r->c, code, "json schema: \"pattern\" at #%s: %s (at offset %zu)", r->ptr,
                      what, r->i);
}

static uint32_t rx_next_cp(struct rx *r)
{
    const unsigned char *p = (const unsigned char *)r->s + r->i;
    uint32_t cp = *p;
    int more = cp >= 0xF0 ? 3 : cp >= 0xE0 ? 2 : cp >= 0xC0 ? 1 : 0;
    if (more)
        cp &= 0x3Fu >> more;
    r->i++;
    for (; more > 0 && r->i < r->n && ((unsigned char)r->s[r->i] & 0xC0) == 0x80; more--)
        cp = cp << 6 | ((unsigned char)r->s[r->i++] & 0x3F);
    return cp;
}

static int hex_digits(struct rx *r, int count, uint32_t *out)
{
    uint32_t v = 0;
    for (int k = 0; k < count; k++) {
        if (r->i >= r->n)
            return -1;
        char ch = r->s[r->i];
        int d = ch >= '0' && ch <= '9'   ? ch - '0'
                : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
                : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10
                                         : -1;
        if (d < 0)
            return -1;
        v = v * 16 + (uint32_t)d;
        r->i++;
    }
    *out = v;
    return 0;
}

static void set_digits(struct cpset *s)
{
    cpset_add(s, '0', '9');
}

static void set_word(struct cpset *s)
{
    cpset_add(s, '0', '9');
    cpset_add(s, 'A', 'Z');
    cpset_add(s, '_', '_');
    cpset_add(s, 'a', 'z');
}

static void set_space(struct cpset *s)
{
    static const uint32_t ws[][2] = {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},
                                     {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029},
                                     {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
                                     {0xFEFF, 0xFEFF}};
    for (size_t i = 0; i < KWK_ARRAY_LEN(ws); i++)
        cpset_add(s, ws[i][0], ws[i][1]);
}

/* After a backslash: a character (*cp, returns 0) or a set added to s (returns 1); negative
 * when refused. in_class: \b is a backspace there. */
static int rx_escape(struct rx *r, struct cpset *s, uint32_t *cp, int in_class)
{
    if (r->i >= r->n)
        return rx_fail(r, KWK_EFORMAT, "a trailing backslash");
    char ch = r->s[r->i];
    struct cpset tmp = {0};
    switch (ch) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S':
        r->i++;
        if (ch == 'd' || ch == 'D')
            set_digits(&tmp);
        else if (ch == 'w' || ch == 'W')
            set_word(&tmp);
        else
            set_space(&tmp);
        cpset_normalize(&tmp);
        if (ch == 'D' || ch == 'W' || ch == 'S')
            cpset_negate(&tmp);
        for (int k = 0; k < tmp.n; k++)
            cpset_add(s, tmp.lo[k], tmp.hi[k]);
        return 1;
    case 't': r->i++, *cp = '\t'; return 0;
    case 'n': r->i++, *cp = '\n'; return 0;
    case 'r': r->i++, *cp = '\r'; return 0;
    case 'f': r->i++, *cp = '\f'; return 0;
    case 'v': r->i++, *cp = '\v'; return 0;
    case 'b':
        if (in_class) {
            r->i++, *cp = '\b';
            return 0;
        }
        return rx_fail(r, KWK_EUNSUPPORTED, "word boundaries (\\b) cannot be enforced");
    case 'B': return rx_fail(r, KWK_EUNSUPPORTED, "\\B cannot be enforced");
    case '0':
        r->i++;
        if (r->i < r->n && r->s[r->i] >= '0' && r->s[r->i] <= '9')
            return rx_fail(r, KWK_EUNSUPPORTED, "octal escapes are not supported");
        *cp = 0;
        return 0;
    case 'x':
        r->i++;
        if (hex_digits(r, 2, cp))
            return rx_fail(r, KWK_EFORMAT, "\\x needs two hex digits");
        return 0;
    case 'u':
        r->i++;
        if (r->i < r->n && r->s[r->i] == '{') {
            uint32_t v = 0;
            int k = 0;
            for (r->i++; r->i < r->n && r->s[r->i] != '}' && k < 7; k++) {
                uint32_t d;
                if (hex_digits(r, 1, &d))
                    return rx_fail(r, KWK_EFORMAT, "a bad \\u{...} escape");
                v = v * 16 + d;
            }
            if (r->i >= r->n || r->s[r->i] != '}' || k == 0 || v > CP_MAX)
                return rx_fail(r, KWK_EFORMAT, "a bad \\u{...} escape");
            r->i++;
            *cp = v;
            return 0;
        }
        if (hex_digits(r, 4, cp))
            return rx_fail(r, KWK_EFORMAT, "\\u needs four hex digits");
        if (*cp >= 0xD800 && *cp <= 0xDFFF)
            return rx_fail(r, KWK_EUNSUPPORTED, "surrogate escapes are not supported");
        return 0;
    case 'p':
    case 'P':
        return rx_fail(r, KWK_EUNSUPPORTED, "Unicode property classes (\\p{..}) are not "
                                            "supported");
    case 'k': return rx_fail(r, KWK_EUNSUPPORTED, "backreferences cannot be enforced");
    case 'c': return rx_fail(r, KWK_EUNSUPPORTED, "control escapes (\\c) are not supported");
    default:
        if (ch >= '1' && ch <= '9')
            return rx_fail(r, KWK_EUNSUPPORTED, "backreferences cannot be enforced");
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z'))
            return rx_fail(r, KWK_EFORMAT, "an unknown escape");
        *cp = rx_next_cp(r);
        return 0;
    }
}

static int rx_class(struct rx *r, struct cpset *s)
{
    int negate = 0;
    r->i++; /* [ */
    if (r->i < r->n && r->s[r->i] == '^') {
        negate = 1;
        r->i++;
    }
    while (r->i < r->n && r->s[r->i] != ']') {
        uint32_t lo, hi;
        int is_set = 0;
        if (r->s[r->i] == '\\') {
            r->i++;
            if ((is_set = rx_escape(r, s, &lo, 1)) < 0)
                return is_set;
        } else {
            lo = rx_next_cp(r);
        }
        if (is_set)
            continue;
        hi = lo;
        if (r->i + 1 < r->n && r->s[r->i] == '-' && r->s[r->i + 1] != ']') {
            r->i++;
            int hi_set = 0;
            if (r->s[r->i] == '\\') {
                r->i++;
                if ((hi_set = rx_escape(r, s, &hi, 1)) < 0)
                    return hi_set;
            } else {
                hi = rx_next_cp(r);
            }
            if (hi_set) { /* [a-\d]: the '-' is a character */
                cpset_add(s, lo, lo);
                cpset_add(s, '-', '-');
                continue;
            }
            if (hi < lo)
                return rx_fail(r, KWK_EFORMAT, "a class range out of order");
        }
        cpset_add(s, lo, hi);
    }
    if (r->i >= r->n)
        return rx_fail(r, KWK_EFORMAT, "an unclosed [");
    r->i++; /* ] */
    cpset_normalize(s);
    if (negate)
        cpset_negate(s);
    if (s->over)
        return rx_fail(r, KWK_ELIMIT, "a character class with too many ranges");
    if (!s->n)
        return rx_fail(r, KWK_EUNSUPPORTED, "a class that matches nothing");
    return 0;
}

/* {m}, {m,}, {m,n} at r->i: 1 and the counts (max -1: none), 0 when it is no quantifier. */
static int rx_braces(struct rx *r, int64_t *min, int64_t *max)
{
    size_t j = r->i + 1;
    int64_t a = 0, b = -1;
    int digits = 0;
    for (; j < r->n && r->s[j] >= '0' && r->s[j] <= '9'; j++, digits++)
        a = a > KWK_GRAMMAR_REPEAT_MAX ? a : a * 10 + (r->s[j] - '0');
    if (!digits)
        return 0;
    if (j < r->n && r->s[j] == '}') {
        b = a;
    } else if (j < r->n && r->s[j] == ',') {
        j++;
        digits = 0;
        int64_t v = 0;
        for (; j < r->n && r->s[j] >= '0' && r->s[j] <= '9'; j++, digits++)
            v = v > KWK_GRAMMAR_REPEAT_MAX ? v : v * 10 + (r->s[j] - '0');
        if (j >= r->n || r->s[j] != '}')
            return 0;
        b = digits ? v : -1;
    } else {
        return 0;
    }
    r->i = j + 1;
    *min = a;
    *max = b;
    return 1;
}

static int rx_alt(struct rx *r, struct sbuf *b, int top);

/* JSON text for one character in its canonical spelling, as GBNF (a literal or a group). */
void gen_json_char_cp(struct sbuf *b, uint32_t cp)
{
    struct cpset one = {0};
    if (cp >= 0x20 && cp != '"' && cp != '\\' && !(cp >= 0xD800 && cp <= 0xDFFF)) {
        char u[5];
        size_t n = 0;
        if (cp < 0x80) {
            u[n++] = (char)cp;
        } else if (cp < 0x800) {
            u[n++] = (char)(0xC0 | cp >> 6);
            u[n++] = (char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            u[n++] = (char)(0xE0 | cp >> 12);
            u[n++] = (char)(0x80 | (cp >> 6 & 0x3F));
            u[n++] = (char)(0x80 | (cp & 0x3F));
        } else {
            u[n++] = (char)(0xF0 | cp >> 18);
            u[n++] = (char)(0x80 | (cp >> 12 & 0x3F));
            u[n++] = (char)(0x80 | (cp >> 6 & 0x3F));
            u[n++] = (char)(0x80 | (cp & 0x3F));
        }
        sb_literal(b, u, n);
        return;
    }
    cpset_add(&one, cp, cp);
    sb_puts(b, "(");
    cpset_gen_json_char(b, &one);
    sb_puts(b, ")");
}

/* One atom into b (a group, a class or a character's literal). */
static int rx_atom(struct rx *r, struct sbuf *b)
{
    char ch = r->s[r->i];
    struct cpset s = {0};
    uint32_t cp;
    int rc;
    if (ch == '(') {
        r->i++;
        if (r->i < r->n && r->s[r->i] == '?') {
            if (r->i + 1 < r->n && r->s[r->i + 1] == ':') {
                r->i += 2;
            } else if (r->i + 2 < r->n && r->s[r->i + 1] == '<' && r->s[r->i + 2] != '=' &&
                       r->s[r->i + 2] != '!') {
                const char *end = memchr(r->s + r->i, '>', r->n - r->i);
                if (!end)
                    return rx_fail(r, KWK_EFORMAT, "an unclosed group name");
                r->i = (size_t)(end - r->s) + 1;
            } else {
                return rx_fail(r, KWK_EUNSUPPORTED, "lookarounds cannot be enforced");
            }
        }
        if (++r->depth > RX_DEPTH_MAX)
            return rx_fail(r, KWK_ELIMIT, "groups nested too deep");
        sb_puts(b, "(");
        if ((rc = rx_alt(r, b, 0)))
            return rc;
        if (r->i >= r->n || r->s[r->i] != ')')
            return rx_fail(r, KWK_EFORMAT, "an unclosed (");
        r->i++;
        r->depth--;
        sb_puts(b, ")");
        return 0;
    }
    if (ch == '[') {
        if ((rc = rx_class(r, &s)))
            return rc;
    } else if (ch == '.') {
        r->i++;
        cpset_add(&s, '\n', '\n');
        cpset_add(&s, '\r', '\r');
        cpset_add(&s, 0x2028, 0x2029);
        cpset_normalize(&s);
        cpset_negate(&s);
    } else if (ch == '\\') {
        r->i++;
        if ((rc = rx_escape(r, &s, &cp, 0)) < 0)
            return rc;
        if (rc == 0) {
            gen_json_char_cp(b, cp);
            return 0;
        }
        cpset_normalize(&s);
    } else if (ch == '*' || ch == '+' || ch == '?') {
        return rx_fail(r, KWK_EFORMAT, "nothing to repeat");
    } else {
        gen_json_char_cp(b, rx_next_cp(r));
        return 0;
    }
    sb_puts(b, "(");
    cpset_gen_json_char(b, &s);
    sb_puts(b, ")");
    return 0;
}

static int rx_quantifier(struct rx *r, struct sbuf *b, const char *atom)
{
    int64_t min = 0, max = -1;
    char ch = r->i < r->n ? r->s[r->i] : 0;
    if (ch == '*' || ch == '+' || ch == '?') {
        r->i++;
        min = ch == '+';
        max = ch == '?' ? 1 : -1;
    } else if (!(ch == '{' && rx_braces(r, &min, &max))) {
        sb_puts(b, atom);
        return 0;
    }
    if (min > KWK_GRAMMAR_REPEAT_MAX || max > KWK_GRAMMAR_REPEAT_MAX)
        return rx_fail(r, KWK_ELIMIT, "a repetition over the grammar's limit");
    if (max >= 0 && min > max)
        return rx_fail(r, KWK_EFORMAT, "a repetition {m,n} with m > n");
    if (r->i < r->n && r->s[r->i] == '?')
        r->i++; /* lazy: the same strings */
    if (r->i < r->n && strchr("*+?", r->s[r->i]))
        return rx_fail(r, KWK_EFORMAT, "nothing to repeat");
    if (max == 0)
        return 0;
    gen_repetition(b, atom, min, max, NULL);
    return 0;
}

/* One branch: atoms with their quantifiers; at the top, ^ first and $ last anchor it. */
static int rx_seq(struct rx *r, struct sbuf *b, int top)
{
    int start = 0, end = 0, n = 0;
    size_t begin = r->i;
    struct sbuf body = {0};
    int rc = 0;
    while (!rc && r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        char ch = r->s[r->i];
        if (ch == '^') {
            if (!top || r->i != begin) {
                rc = rx_fail(r, KWK_EUNSUPPORTED, "^ inside the expression is not supported");
                break;
            }
            start = 1;
            r->i++;
            continue;
        }
        if (ch == '$') {
            r->i++;
            if (!top || (r->i < r->n && r->s[r->i] != '|')) {
                rc = rx_fail(r, KWK_EUNSUPPORTED, "$ inside the expression is not supported");
                break;
            }
            end = 1;
            continue;
        }
        struct sbuf atom = {0};
        rc = rx_atom(r, &atom);
        if (!rc && !atom.err) {
            size_t before = body.n;
            if (n)
                sb_puts(&body, " ");
            rc = rx_quantifier(r, &body, atom.p ? atom.p : "");
            if (body.n == before + (n ? 1 : 0))
                body.n = before; /* {0}: nothing */
            else
                n++;
            if (body.p)
                body.p[body.n] = 0;
        }
        if (atom.err && !rc)
            rc = rx_fail(r, atom.err, "the pattern is too large");
        sb_free(&atom);
    }
    if (body.err && !rc)
        rc = rx_fail(r, body.err, "the pattern is too large");
    if (!rc) {
        const char *any = rule_primitive(r->c, "char");
        int pre = top && !start, post = top && !end;
        if (!any)
            rc = r->c->rc;
        else if (!n)
            sb_puts(b, pre || post ? "char*" : "");
        else
            sb_printf(b, "%s%s%s%s", pre ? "char* " : "", body.p, post ? " " : "",
                      post ? "char*" : "");
    }
    sb_free(&body);
    return rc;
}

static int rx_alt(struct rx *r, struct sbuf *b, int top)
{
    int rc = rx_seq(r, b, top);
    while (!rc && r->i < r->n && r->s[r->i] == '|') {
        r->i++;
        sb_puts(b, " | ");
        rc = rx_seq(r, b, top);
    }
    return rc;
}

int schema_gen_pattern(struct sconv *c, const char *pattern, const char *ptr, const char *name,
                       char **body)
{
    struct rx r = {c, pattern, 0, strlen(pattern), ptr, 0};
    struct sbuf b = {0};
    int rc;
    *body = NULL;
    if (!rule_primitive(c, "space"))
        return c->rc;
    sb_puts(&b, "\"\\\"\" (");
    rc = rx_alt(&r, &b, 1);
    if (!rc && r.i < r.n)
        rc = rx_fail(&r, KWK_EFORMAT, "an unmatched )");
    sb_puts(&b, ") \"\\\"\" space");
    if (!rc) {
        *body = sb_take(&b, &rc);
        if (!*body)
            rc = sconv_fail(c, rc, "the grammar would exceed the size limit");
    }
    sb_free(&b);
    return rc;
}
