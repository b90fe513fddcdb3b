/* grammar.h - the grammar module's contract: a compiled GBNF grammar as byte-level rules
 * (gbnf.c parses, compile.c checks and flattens), the pushdown engine that advances sets of
 * stacks byte by byte (match.c), the vocabulary trie (vocab.c) and the matcher that masks it
 * (matcher.c). Compiled grammars and vocabularies are immutable (any thread); an engine or a
 * matcher belongs to one caller at a time.
 *
 * Representation. Every rule is a list of alternatives; an alternative is a run of elements in
 * one flat array, ending in KG_END. An element is a uint32: its kind in the top two bits, its
 * argument below. KG_BYTES matches one byte of a 256-bit set; KG_REF enters a rule. Characters
 * never reach the matcher: gbnf.c turns each code-point set into rules over bytes that accept
 * exactly the valid UTF-8 encodings of the set, so a token that ends inside a character simply
 * leaves a stack part-way through that character's bytes.
 *
 * A stack is the list of element positions still to match, its top the next one. Stacks are
 * hash-consed nodes (position, parent): equal stacks are the same node id, so a set of stacks
 * is a sorted array of ids, compared and hashed as integers. Node 0 is the empty stack: the
 * sentence is complete there. A set is always closed: every top is a KG_BYTES element (rule
 * references are expanded into their alternatives, finished rules popped). */
#ifndef KWK_GRAMMAR_H
#define KWK_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/* Element kinds (top two bits of an element). KG_ALT only appears while compiling. */
enum { KG_END = 0, KG_BYTES = 1, KG_REF = 2, KG_ALT = 3 };
#define KG_ARG_MAX ((1u << 30) - 1)

static inline uint32_t kg_elem(uint32_t kind, uint32_t arg)
{
    return kind << 30 | arg;
}
static inline uint32_t kg_kind(uint32_t e)
{
    return e >> 30;
}
static inline uint32_t kg_arg(uint32_t e)
{
    return e & KG_ARG_MAX;
}

/* Limits of a compiled grammar. Elements bound the memory of what repetitions expand into
 * (x{m,n} costs O(n) elements whatever x is: x is a rule referenced n times). */
#define KG_ELEMS_MAX (1u << 22)  /* elements of all rules together */
#define KG_RULES_MAX (1u << 20)  /* rules, the generated ones included */
#define KG_NEST_MAX 256          /* depth of nested parentheses */

/* Limits of matching: one set of stacks, and the work of one byte's step. */
#define KG_STACKS_MAX 1024       /* stacks in a set */
#define KG_DEPTH_MAX 4096        /* positions in one stack */
#define KG_CLOSURE_MAX (1u << 16) /* stacks visited while expanding rules for one byte */
#define KG_NODES_MAX (1u << 22)  /* nodes an engine may hold (KWK_ELIMIT past them) */
#define KG_NODES_COMPACT (1u << 19) /* nodes past which callers compact between steps */

struct kwk_grammar {
    uint32_t *elems;      /* [n_elems]; elems[0..1] = REF root, END: the start stack */
    uint32_t n_elems;
    uint32_t *alts;       /* [n_alts] position of each alternative's first element */
    uint32_t *rule_alts;  /* [n_rules + 1]: rule r's alternatives are alts[rule_alts[r] ..
                           * rule_alts[r + 1]) */
    uint32_t n_alts, n_rules;
    uint32_t (*sets)[8];  /* [n_sets] 256-bit byte sets of the KG_BYTES elements */
    uint32_t n_sets;
    uint8_t byte_class[256]; /* bytes every set treats alike share a class (DFA columns) */
    uint8_t class_byte[256]; /* [n_classes] one byte of each class */
    uint32_t n_classes;
};

static inline int kg_set_has(const struct kwk_grammar *g, uint32_t set, unsigned byte)
{
    return (int)(g->sets[set][byte >> 5] >> (byte & 31) & 1);
}

/* Make room for `need` items of size sz in *p (capacity *cap items, doubled from 64):
 * 0 or -ENOMEM (the array unchanged). Every growable array of the module uses it. */
int kg_grow(void **p, size_t *cap, size_t need, size_t sz);

/* One stack frame: the position still to match and the stack below it. */
struct kg_node {
    uint32_t pos, parent, depth;
};

/* The pushdown engine: the node table and the scratch of a step. Not thread-safe. */
struct kg_engine {
    const struct kwk_grammar *g;
    struct kg_node *nodes;   /* [n_nodes]; nodes[0] is the empty stack */
    uint32_t n_nodes, cap_nodes;
    uint32_t *slots;         /* hash of (pos, parent) -> node id + 1; 0 = free */
    uint32_t slot_mask;
    uint32_t *mark;          /* [cap_nodes] visit stamp of each node during a step */
    uint32_t stamp;
    uint32_t *work;          /* stacks waiting to be expanded */
    size_t n_work, cap_work;
    uint32_t *out;           /* the step's result: sorted node ids */
    size_t n_out, cap_out;
    uint64_t expansions;     /* rule expansions since its owner last zeroed it: the
                              * matcher's budget for one call */
};

int kg_engine_init(struct kg_engine *e, const struct kwk_grammar *g);
void kg_engine_free(struct kg_engine *e);
/* Bytes the engine holds (node table and scratch). */
size_t kg_engine_bytes(const struct kg_engine *e);
/* The closed set of stacks at the start of the grammar, into e->out. 0, KWK_ELIMIT, -ENOMEM. */
int kg_engine_start(struct kg_engine *e);
/* The set set[n] advanced by one byte, into e->out (empty: no stack takes it; set must not
 * alias e->out). 0, KWK_ELIMIT, -ENOMEM. */
int kg_engine_step(struct kg_engine *e, const uint32_t *set, size_t n, unsigned byte);
/* Forget every node but those of set[n]; set's ids are rewritten to the new ones and sorted.
 * 0 or -ENOMEM (the engine is then empty and set unusable). */
int kg_engine_compact(struct kg_engine *e, uint32_t *set, size_t n);

/* Vocabulary trie: nodes in depth-first preorder (the root left out), so a mask is one pass
 * over the array that jumps to `end` to skip a subtree no stack can enter. */
struct kv_node {
    uint32_t end;   /* index past this node's subtree */
    uint32_t tok;   /* this node's tokens are vocab->node_toks[tok .. next node's tok) */
    uint16_t depth; /* 1 for a token's first byte */
    uint8_t byte;
    uint8_t utf8;   /* 1: every token of the subtree, read from this node's byte on, is valid
                     * UTF-8 (its last character may be cut short) */
};

/* States of a UTF-8 decoder: at a boundary, or inside a character (what may come next). */
enum { KV_U8_START, KV_U8_CONT1, KV_U8_CONT2, KV_U8_CONT3, KV_U8_E0, KV_U8_ED, KV_U8_F0,
       KV_U8_F4, KV_U8_STATES, KV_U8_BAD = KV_U8_STATES };
/* The decoder's state after byte b in state q (KV_U8_BAD: b cannot come there). */
int kv_utf8_next(int q, unsigned b);

#define KV_TOKEN_BYTES_MAX 65535 /* bytes of one token (the trie's depth) */

struct kwk_grammar_vocab {
    int32_t n_vocab;
    char *bytes;          /* every token's bytes, back to back */
    size_t *off;          /* [n_vocab + 1] token i is bytes[off[i] .. off[i + 1]) */
    uint8_t *usable;      /* [n_vocab] 0: not in the trie (empty, special, hole); a special
                           * token's bytes are kept all the same, for a matcher that
                           * preserves it (kwk_matcher_preserve) */
    struct kv_node *nodes; /* [n_nodes + 1], the last a sentinel (tok = n_node_toks) */
    uint32_t n_nodes;
    uint64_t (*sub)[2];   /* [n_nodes] the bytes of each subtree (its own included): bit b for
                           * ASCII b >= 2, bit 1 for 0x00 and 0x01, bit 0 for any byte >= 0x80.
                           * A mask passes over a subtree whose bytes all lead back to the
                           * state they start from (matcher.c). */
    int32_t *node_toks;   /* [n_node_toks] token ids in trie order */
    uint32_t n_node_toks;
    uint32_t max_len;     /* longest token */
};

/* The matcher's mask without its cache of recent masks (benchmarks and tests: a walk of the
 * trie over the DFA as built so far), and the bytes and DFA states it holds. */
int32_t kg_matcher_mask_walk(struct kwk_matcher *m, uint32_t *allowed);
size_t kg_matcher_bytes(const struct kwk_matcher *m, size_t *n_states);
/* Drop the DFA and every node but the current state's now, as past the tables' budget (tests). */
int kg_matcher_flush(struct kwk_matcher *m);

/* ---- Compiling (gbnf.c parses into a builder, compile.c checks and flattens it) ---- */

/* A rule while compiling: its alternatives in one run, separated by KG_ALT elements. */
struct kg_rule {
    uint32_t *body;
    uint32_t n, cap;
    size_t name_off;      /* the name in the GBNF text (user rules) */
    uint32_t name_len;    /* 0 for a generated rule */
    int64_t def_pos;      /* where its name was defined; -1 while only referenced */
    int64_t ref_pos;      /* its first reference */
    uint32_t origin;      /* the user rule whose text made it (itself for a user rule) */
    uint8_t repeat;       /* a `*` helper `s ::= x s |`: its tail self-reference is a loop
                           * the engine handles, not left recursion, even when x is nullable */
};

struct kg_builder {
    const char *s;        /* the GBNF text */
    size_t n;
    struct kwk_err *err;
    struct kg_rule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *name_slots; /* hash of user rule names -> rule id + 1 */
    uint32_t name_mask;
    uint32_t (*sets)[8];
    uint32_t n_sets, cap_sets;
    uint32_t *set_slots;  /* hash of sets -> set id + 1 */
    uint32_t set_mask;
    size_t n_elems;       /* over every rule's body */
};

/* Fail at byte pos of the text with KWK_ESYNTAX or KWK_ELIMIT: err gets line, col and pos. */
int kg_fail(struct kg_builder *b, int code, size_t pos, const char *fmt, ...) KWK_PRINTF(4, 5);
/* Check the builder's rules (every one defined, no left recursion) and flatten them. */
int kg_compile(struct kg_builder *b, struct kwk_grammar **out);

#endif
