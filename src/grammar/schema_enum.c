/* schema_enum.c - the enum values that GBNF writes as one literal each (strings, numbers, true,
 * false, null) as a prefix tree: `"\"" ("gr" ("ay\"" | "een\"") | "red\"")`. A matcher expands
 * every alternative of an alternation at once, so a flat list of n values is n live stacks (and
 * past KG_STACKS_MAX the grammar is refused); in the tree, only the branches of one node are live
 * at a time. One conversion's thread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "grammar/schema.h"

int slits_mark(struct slits *l, size_t start)
{
    if (kg_grow((void **)&l->v, &l->cap, l->n + 1, sizeof *l->v))
        return -ENOMEM;
    l->v[l->n++] = (struct slit){start, l->text.n - start, NULL};
    return 0;
}

void slits_free(struct slits *l)
{
    sb_free(&l->text);
    kwk_free(l->v);
    memset(l, 0, sizeof *l);
}

static int slit_cmp(const void *a, const void *b)
{
    const struct slit *x = a, *y = b;
    int d = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    return d ? d : (x->len > y->len) - (x->len < y->len);
}

/* Sort and drop duplicates (an enum may list a value twice, or 1 and 1.0). */
static void slits_sort(struct slits *l)
{
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++)
        l->v[i].p = l->text.p + l->v[i].off;
    qsort(l->v, l->n, sizeof *l->v, slit_cmp);
    for (size_t i = 0; i < l->n; i++)
        if (!n || slit_cmp(&l->v[n - 1], &l->v[i]))
            l->v[n++] = l->v[i];
    l->n = n;
}

static int is_cont(const struct slit *s, size_t at)
{
    return at < s->len && ((unsigned char)s->p[at] & 0xC0) == 0x80;
}

/* Bytes of the character at s[at] (0 at the end). Trees split only between characters: GBNF
 * literals are UTF-8 text, and a literal cannot hold part of a character. */
static size_t char_len(const struct slit *s, size_t at)
{
    size_t k = at < s->len;
    while (k && is_cont(s, at + k))
        k++;
    return k;
}

/* One node of the tree: the literals v[next .. hi) still to write as its branches, all sharing
 * their first `at` bytes. */
struct tframe {
    size_t next, hi, at;
    size_t buf; /* where it writes: 0 the caller's text, k the k-th spilled rule's */
    int nest;   /* groups open in that text, its own included */
    int n_alts; /* branches written */
    int root;   /* the top: branches without parentheses, as the caller's alternatives */
};

struct trie {
    struct sconv *c;
    const struct slit *v;
    const char *name;
    struct sbuf *out;
    struct sbuf *spill; /* [n_spill] bodies of rules being written, innermost last */
    size_t n_spill, cap_spill;
    struct tframe *st; /* [n_st] the nodes open, a stack (trees may be thousands deep) */
    size_t n_st, cap_st;
    size_t n_rules; /* spilled rules so far: numbers their names */
};

static struct sbuf *frame_text(struct trie *t, const struct tframe *f)
{
    return f->buf ? &t->spill[f->buf - 1] : t->out;
}

/* The end of the branch that starts at v[a]: the literals with the same next character. */
static size_t branch_end(const struct trie *t, size_t a, size_t hi, size_t at)
{
    const struct slit *x = &t->v[a];
    size_t k = char_len(x, at), b = a + 1;
    while (b < hi && char_len(&t->v[b], at) == k && memcmp(t->v[b].p + at, x->p + at, k) == 0)
        b++;
    return b;
}

/* Open the node of the branch v[a .. b) (two literals or more) under f: its shared bytes past
 * f->at as a literal, then its group. Deeper than SCHEMA_ENUM_NEST groups, the node becomes a
 * rule of its own (the GBNF parser bounds nesting). */
static int open_node(struct trie *t, size_t a, size_t b, const struct tframe *f)
{
    const struct slit *x = &t->v[a], *y = &t->v[b - 1];
    struct tframe n = {a, b, f->at, f->buf, f->nest + 1, 0, 0};
    size_t from = f->at; /* f is not used below: growing the stack may move it */
    if (sconv_step(t->c))
        return t->c->rc;
    while (n.at < x->len && n.at < y->len && x->p[n.at] == y->p[n.at])
        n.at++;
    while (n.at > from && is_cont(x, n.at))
        n.at--;
    if (n.nest > SCHEMA_ENUM_NEST) {
        if (kg_grow((void **)&t->spill, &t->cap_spill, t->n_spill + 1, sizeof *t->spill))
            return sconv_fail(t->c, -ENOMEM, "out of memory");
        t->spill[t->n_spill++] = (struct sbuf){0};
        n.buf = t->n_spill;
        n.nest = 1;
    }
    if (kg_grow((void **)&t->st, &t->cap_st, t->n_st + 1, sizeof *t->st))
        return sconv_fail(t->c, -ENOMEM, "out of memory");
    struct sbuf *text = frame_text(t, &n);
    if (n.at > from) {
        sb_literal(text, x->p + from, n.at - from);
        sb_puts(text, " ");
    }
    sb_puts(text, "(");
    t->st[t->n_st++] = n;
    return 0;
}

static int trie_fail(struct trie *t, int err)
{
    return sconv_fail(
        t->c, err, err == KWK_ELIMIT ? "the grammar would exceed the size limit" : "out of memory");
}

/* A spilled node's rule, named after the enum's rule and numbered (a name per rule keeps
 * rule_add from trying name0, name1 ... for each). */
static const char *spill_rule(struct trie *t, struct sbuf *body)
{
    char base[48], suffix[32], name[SCHEMA_NAME_MAX + 8];
    int rc = 0;
    snprintf(base, sizeof base, "%s", t->name); /* room left for the suffix */
    snprintf(suffix, sizeof suffix, "enum-%zu", t->n_rules++);
    rule_name_join(name, sizeof name, base, suffix);
    char *text = sb_take(body, &rc);
    if (!text) {
        trie_fail(t, rc);
        return NULL;
    }
    const char *r = rule_add(t->c, name, text);
    kwk_free(text);
    return r;
}

/* Close the node on top: its group, and when it was spilled, its rule named in its parent. */
static int close_node(struct trie *t)
{
    struct tframe *f = &t->st[t->n_st - 1];
    struct sbuf *text = frame_text(t, f);
    if (!f->root)
        sb_puts(text, ")");
    /* f[-1] exists: the root writes to the caller's text (buf 0) */
    if (f->buf && f->buf != f[-1].buf) {
        const char *r = spill_rule(t, text);
        t->n_spill--;
        if (!r)
            return t->c->rc;
        sb_puts(frame_text(t, &f[-1]), r);
    }
    t->n_st--;
    return 0;
}

/* The next branch of the node on top: one literal, or a node of its own. */
static int next_branch(struct trie *t)
{
    struct tframe *f = &t->st[t->n_st - 1];
    size_t a = f->next, b = branch_end(t, a, f->hi, f->at);
    f->next = b;
    if (f->n_alts++)
        sb_puts(frame_text(t, f), " | ");
    if (b - a > 1)
        return open_node(t, a, b, f);
    sb_literal(frame_text(t, f), t->v[a].p + f->at, t->v[a].len - f->at);
    return 0;
}

int schema_enum_trie(struct sconv *c, struct slits *l, const char *name, int nest, struct sbuf *b,
                     int *n_alts)
{
    struct trie t = {c, l->v, name, b, NULL, 0, 0, NULL, 0, 0, 0};
    int rc = 0;
    *n_alts = 0;
    if (l->text.err)
        return trie_fail(&t, l->text.err);
    if (!l->n)
        return 0;
    slits_sort(l);
    if (kg_grow((void **)&t.st, &t.cap_st, 1, sizeof *t.st))
        return sconv_fail(c, -ENOMEM, "out of memory");
    t.st[t.n_st++] = (struct tframe){0, l->n, 0, 0, nest, 0, 1};
    while (t.n_st && !rc) {
        struct tframe *f = &t.st[t.n_st - 1];
        if (f->next == f->hi) {
            if (f->root)
                *n_alts = f->n_alts;
            rc = close_node(&t);
        } else {
            rc = next_branch(&t);
        }
    }
    for (size_t i = 0; i < t.n_spill; i++)
        sb_free(&t.spill[i]);
    kwk_free(t.spill);
    kwk_free(t.st);
    if (!rc && b->err)
        rc = trie_fail(&t, b->err);
    return rc ? rc : c->rc;
}
