/* test_preserved.c - preserved tokens (kwk_gen_params.preserved_ids: llama.cpp's
 * preserved_tokens) over a small byte-level vocabulary whose tool-call markers are special added
 * tokens, as Mistral Nemo's [TOOL_CALLS] and Llama 3.1's <|python_tag|> are: the detokenizer
 * keeps their text (kwk_detok_preserve), the grammar vocabulary lets a matcher take them as
 * their text (kwk_matcher_preserve) and still the same text spelled in plain tokens, a lazy
 * grammar's trigger sees them, and eos stays eos. The server's run on a real template is
 * tests/python/test_tools_preserved.py. */
#include <stdlib.h>
#include <string.h>

#include "runtime/gen.h"
#include "runtime/runtime.h"
#include "test.h"

/* One character a token (no merges); then the added tokens. */
enum { C_LB, C_T, C_O, C_L, C_US, C_C, C_A, C_S, C_RB, C_LC, C_RC, C_a, C_b, C_x };
enum { T_CALLS = 14, T_PY = 15, T_EOS = 16, T_PLAIN = 17, N_VOCAB = 18 };

static const char tok_json[] =
    "{\"version\": \"1.0\",\n"
    " \"added_tokens\": ["
    "{\"id\": 14, \"content\": \"[TOOL_CALLS]\", \"special\": true, \"lstrip\": false,"
    " \"rstrip\": false, \"normalized\": false, \"single_word\": false},"
    "{\"id\": 15, \"content\": \"<|python_tag|>\", \"special\": true, \"lstrip\": false,"
    " \"rstrip\": false, \"normalized\": false, \"single_word\": false},"
    "{\"id\": 16, \"content\": \"</s>\", \"special\": true, \"lstrip\": false,"
    " \"rstrip\": false, \"normalized\": false, \"single_word\": false},"
    "{\"id\": 17, \"content\": \"<x>\", \"special\": false, \"lstrip\": false,"
    " \"rstrip\": false, \"normalized\": false, \"single_word\": false}],\n"
    " \"normalizer\": null,\n"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
    " \"use_regex\": false},\n"
    " \"post_processor\": null,\n"
    " \"decoder\": {\"type\": \"ByteLevel\"},\n"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"[\": 0, \"T\": 1, \"O\": 2, \"L\": 3,"
    " \"_\": 4, \"C\": 5, \"A\": 6, \"S\": 7, \"]\": 8, \"{\": 9, \"}\": 10, \"a\": 11,"
    " \"b\": 12, \"x\": 13},\n"
    " \"merges\": []}}\n";

/* "[TOOL_CALLS]" spelled in plain tokens */
static const int32_t SPELLED[] = {C_LB, C_T, C_O, C_O, C_L, C_US, C_C, C_A, C_L, C_L, C_S, C_RB};
#define N_SPELLED ((int)(sizeof SPELLED / sizeof *SPELLED))

static kwk_tokenizer *tiny(void)
{
    struct kwk_err err = {0};
    kwk_tokenizer *t = kwk_tokenizer_load_json(tok_json, sizeof tok_json - 1, &err);
    if (!t)
        fprintf(stderr, "tiny: %s\n", err.msg);
    return t;
}

/* Every push's piece and the flush, joined. */
static void stream(kwk_tokenizer *t, const int32_t *pres, int n_pres, const int32_t *ids, int n,
                   char *out, size_t cap)
{
    kwk_detok *d = kwk_detok_new(t, 1);
    size_t at = 0, len;
    const char *piece;
    T_TRUE(d != NULL);
    T_EQ(kwk_detok_preserve(d, pres, n_pres), 0);
    for (int i = 0; i <= n; i++) {
        int rc = i < n ? kwk_detok_push(d, ids[i], &piece, &len) : kwk_detok_flush(d, &piece, &len);
        T_EQ(rc, 0);
        if (at + len < cap) {
            memcpy(out + at, piece, len);
            at += len;
        }
    }
    out[at] = 0;
    kwk_detok_free(d);
}

static void test_detok(void)
{
    kwk_tokenizer *t = tiny();
    T_TRUE(t != NULL);
    if (!t)
        return;
    T_EQ(kwk_tokenizer_n_vocab(t), N_VOCAB);
    T_EQ(kwk_tokenizer_is_special(t, T_CALLS), 1);
    T_EQ(kwk_tokenizer_is_special(t, T_PLAIN), 0);
    const int32_t ids[] = {C_a, T_CALLS, C_LB, C_LC, C_RC, C_RB, T_PY, T_PLAIN, C_b, T_EOS};
    const int n = (int)(sizeof ids / sizeof *ids);
    char out[128], ref[128];
    size_t len;
    /* none preserved: the skip_special decode, as before */
    stream(t, NULL, 0, ids, n, out, sizeof out);
    T_STREQ(out, "a[{}]<x>b");
    /* [TOOL_CALLS] preserved: its text where it stands, the other special tokens still dropped:
     * Hugging Face's decode(skip_special_tokens=False) of the ids without them */
    const int32_t calls = T_CALLS;
    stream(t, &calls, 1, ids, n, out, sizeof out);
    T_STREQ(out, "a[TOOL_CALLS][{}]<x>b");
    const int32_t kept[] = {C_a, T_CALLS, C_LB, C_LC, C_RC, C_RB, T_PLAIN, C_b};
    T_EQ(kwk_tokenizer_decode(t, kept, 8, 0, ref, sizeof ref, &len), 0);
    T_STREQ(out, ref);
    /* both markers; a plain token, ids outside the vocabulary and repeats change nothing */
    const int32_t both[] = {T_PY, T_CALLS, T_PLAIN, -1, N_VOCAB + 5, T_CALLS};
    stream(t, both, 6, ids, n, out, sizeof out);
    T_STREQ(out, "a[TOOL_CALLS][{}]<|python_tag|><x>b");
    /* the marker first and alone */
    const int32_t first[] = {T_CALLS};
    stream(t, &calls, 1, first, 1, out, sizeof out);
    T_STREQ(out, "[TOOL_CALLS]");
    kwk_detok *d = kwk_detok_new(t, 1);
    T_EQ(kwk_detok_preserve(d, NULL, 1), KWK_EARG);
    T_EQ(kwk_detok_preserve(d, &calls, -1), KWK_EARG);
    T_EQ(kwk_detok_preserve(NULL, &calls, 1), KWK_EARG);
    T_EQ(kwk_detok_preserve(d, NULL, 0), 0);
    kwk_detok_free(d);
    kwk_tokenizer_free(t);
}

static int allowed(const uint32_t *mask, int32_t tok)
{
    return (int)(mask[tok >> 5] >> (tok & 31) & 1);
}

/* The grammar vocabulary: a special token is out of every mask, unless the matcher preserves
 * it; then it is its text, beside the same text spelled in plain tokens. */
static void test_grammar_vocab(void)
{
    struct kwk_err err = {0};
    kwk_tokenizer *t = tiny();
    static const char g[] = "root ::= \"[TOOL_CALLS]\" \"[\" [a-b]* \"]\"";
    kwk_grammar *gr = kwk_grammar_new(g, sizeof g - 1, &err);
    kwk_grammar_vocab *v = t ? kwk_grammar_vocab_new(t, &err) : NULL;
    T_TRUE(gr && v);
    if (!gr || !v)
        goto out;
    uint32_t mask[1];
    kwk_matcher *plain = kwk_matcher_new(gr, v, &err), *m = kwk_matcher_new(gr, v, &err);
    T_TRUE(plain && m);
    /* not preserved: only the spelled marker can start */
    T_EQ(kwk_matcher_mask(plain, mask), 1);
    T_EQ(allowed(mask, C_LB), 1);
    T_EQ(allowed(mask, T_CALLS), 0);
    T_EQ(kwk_matcher_allows(plain, T_CALLS), 0);
    T_EQ(kwk_matcher_accept(plain, T_CALLS), KWK_EARG);
    /* preserved (a plain token, a non-marker, ids outside and a repeat are ignored) */
    const int32_t pres[] = {T_CALLS, C_a, -3, N_VOCAB, T_CALLS};
    T_EQ(kwk_matcher_preserve(m, pres, 5), 0);
    T_EQ(kwk_matcher_preserve(m, NULL, 1), KWK_EARG);
    T_EQ(kwk_matcher_mask(m, mask), 2);
    T_EQ(allowed(mask, C_LB), 1);
    T_EQ(allowed(mask, T_CALLS), 1);
    T_EQ(allowed(mask, T_PY), 0);
    T_EQ(allowed(mask, T_EOS), 0);
    T_EQ(kwk_matcher_allows(m, T_CALLS), 1);
    T_EQ(kwk_matcher_allows(m, T_PY), 0);
    T_EQ(kwk_matcher_accept(m, T_CALLS), 0);
    /* past the marker: "[" only (the marker's own text cannot come again) */
    T_EQ(kwk_matcher_mask(m, mask), 1);
    T_EQ(allowed(mask, C_LB), 1);
    T_EQ(allowed(mask, T_CALLS), 0);
    T_EQ(kwk_matcher_accept(m, C_LB), 0);
    T_EQ(kwk_matcher_accept(m, C_a), 0);
    T_EQ(kwk_matcher_accept(m, C_RB), 0);
    T_EQ(kwk_matcher_finished(m), 1);
    /* the same matcher again from the start, the marker spelled */
    kwk_matcher_reset(m);
    for (int i = 0; i < N_SPELLED; i++)
        T_EQ(kwk_matcher_accept(m, SPELLED[i]), 0);
    T_EQ(kwk_matcher_allows(m, C_LB), 1);
    /* the unpreserved matcher takes the spelled marker as well */
    for (int i = 0; i < N_SPELLED; i++)
        T_EQ(kwk_matcher_accept(plain, SPELLED[i]), 0);
    T_EQ(kwk_matcher_allows(plain, C_LB), 1);
    kwk_matcher_free(plain);
    kwk_matcher_free(m);
    /* a vocabulary from bytes holds no special token to preserve */
    const char *bytes[2] = {"[TOOL_CALLS]", "["};
    uint32_t lens[2] = {12, 1};
    kwk_grammar_vocab *vb = kwk_grammar_vocab_from_bytes(bytes, lens, 2, &err);
    kwk_matcher *mb = vb ? kwk_matcher_new(gr, vb, &err) : NULL;
    T_TRUE(mb != NULL);
    T_EQ(kwk_matcher_allows(mb, 0), 1);
    kwk_matcher_free(mb);
    kwk_grammar_vocab_free(vb);
out:
    kwk_grammar_vocab_free(v);
    kwk_grammar_free(gr);
    kwk_tokenizer_free(t);
}

/* A generation over the tiny vocabulary: logits written for each step. */
struct run {
    struct kwk_gen_params p;
    struct kwk_gen_output out;
    struct kwk_gen_seq g;
    int32_t toks[32], eos;
    kwk_tokenizer *t;
    kwk_grammar *gr;
    kwk_grammar_vocab *v;
};

static int start(struct run *r, const char *trigger, const int32_t *pres, int n_pres)
{
    struct kwk_err err = {0};
    memset(r, 0, sizeof *r);
    static const char g[] = "root ::= \"[TOOL_CALLS]\" \"[\" [a-b]* \"]\"";
    r->t = tiny();
    r->gr = kwk_grammar_new(g, sizeof g - 1, &err);
    r->v = r->t ? kwk_grammar_vocab_new(r->t, &err) : NULL;
    T_TRUE(r->t && r->gr && r->v);
    kwk_gen_params_init(&r->p);
    r->p.max_new_tokens = 32;
    r->p.lookup = 0;
    r->eos = T_EOS;
    r->p.eos_ids = &r->eos;
    r->p.n_eos = 1;
    r->p.tok = r->t;
    r->p.grammar = r->gr;
    r->p.grammar_vocab = r->v;
    r->p.grammar_trigger = trigger;
    r->p.preserved_ids = pres;
    r->p.n_preserved = n_pres;
    r->out.tokens = r->toks;
    r->out.cap = 32;
    int32_t prompt = C_x;
    return kwk_gen_seq_init(&r->g, N_VOCAB, &prompt, 1, &r->p, &r->out, &err);
}

static void stop(struct run *r)
{
    kwk_gen_seq_free(&r->g);
    kwk_gen_output_clear(&r->out);
    kwk_grammar_free(r->gr);
    kwk_grammar_vocab_free(r->v);
    kwk_tokenizer_free(r->t);
}

/* One greedy step whose logits rank the tokens in order (first the highest). */
static int32_t step(struct run *r, const int *order, int n)
{
    float logits[N_VOCAB];
    struct kwk_err err = {0};
    int32_t tok = -1;
    for (int i = 0; i < N_VOCAB; i++)
        logits[i] = -20.0f;
    for (int k = 0; k < n; k++)
        logits[order[k]] = 10.0f - (float)k;
    T_EQ(kwk_gen_seq_next(&r->g, logits, &tok, &err), 0);
    return tok;
}

#define STEP(r, ...)                                                                               \
    step((r), (const int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)))

static const char *text(const struct run *r)
{
    return r->out.text ? r->out.text : "";
}

/* "auto": the model's one marker token sets the lazy grammar off only when it is preserved. */
static void test_trigger(void)
{
    static const int32_t pres[] = {T_CALLS};
    struct run r;
    T_EQ(start(&r, "[TOOL_CALLS]", NULL, 0), 0);
    T_EQ(STEP(&r, C_a), C_a);
    T_EQ(STEP(&r, T_CALLS), T_CALLS); /* dropped, as any special token: still free text */
    T_EQ(r.g.lazy, 1);
    T_EQ(STEP(&r, C_LC), C_LC);
    T_STREQ(text(&r), "a{");
    stop(&r);

    T_EQ(start(&r, "[TOOL_CALLS]", pres, 1), 0);
    T_EQ(STEP(&r, C_a), C_a);
    T_EQ(STEP(&r, T_CALLS), T_CALLS);
    T_EQ(r.g.lazy, 0); /* the grammar holds from here */
    T_STREQ(text(&r), "a[TOOL_CALLS]");
    T_EQ(STEP(&r, C_LC, T_CALLS, C_LB), C_LB); /* neither "{" nor the marker again */
    T_EQ(STEP(&r, C_b), C_b);
    T_EQ(STEP(&r, T_EOS, C_RB), C_RB); /* eos only at a whole sentence */
    T_TRUE(r.g.done);                  /* which nothing can continue */
    T_EQ(r.out.finish_reason, KWK_FINISH_STOP);
    T_STREQ(text(&r), "a[TOOL_CALLS][b]");
    stop(&r);

    /* the trigger found across a plain token and the marker: "a" then "[TOOL_CALLS]" */
    static const char g[] = "root ::= \"a[TOOL_CALLS]\" \"[\" [a-b]* \"]\"";
    struct kwk_err err = {0};
    T_EQ(start(&r, "a[TOOL_CALLS]", pres, 1), 0);
    kwk_gen_seq_free(&r.g);
    kwk_grammar_free(r.gr);
    r.p.grammar = r.gr = kwk_grammar_new(g, sizeof g - 1, &err);
    int32_t prompt = C_x;
    T_EQ(kwk_gen_seq_init(&r.g, N_VOCAB, &prompt, 1, &r.p, &r.out, &err), 0);
    T_EQ(STEP(&r, C_b), C_b);
    T_EQ(STEP(&r, C_a), C_a);
    T_EQ(r.g.lazy, 1);
    T_EQ(STEP(&r, T_CALLS), T_CALLS);
    T_EQ(r.g.lazy, 0);
    T_EQ(STEP(&r, C_a, C_LB), C_LB);
    T_STREQ(text(&r), "ba[TOOL_CALLS][");
    stop(&r);
}

/* "required": the grammar from the first byte; the marker token is the model's choice, eos is
 * still eos (even when also listed as preserved), and an id past the vocabulary is refused. */
static void test_required(void)
{
    static const int32_t pres[] = {T_CALLS, T_EOS};
    struct run r;
    T_EQ(start(&r, NULL, pres, 2), 0);
    T_EQ(STEP(&r, T_EOS, T_CALLS, C_LB), T_CALLS);
    T_STREQ(text(&r), "[TOOL_CALLS]");
    T_EQ(STEP(&r, C_LB), C_LB);
    T_EQ(STEP(&r, T_EOS, C_a), C_a); /* not a whole sentence yet: eos masked */
    T_EQ(STEP(&r, C_RB), C_RB);
    T_TRUE(r.g.done);
    T_STREQ(text(&r), "[TOOL_CALLS][a]");
    stop(&r);

    /* without preserving: the masked argmax spells the marker */
    T_EQ(start(&r, NULL, NULL, 0), 0);
    T_EQ(STEP(&r, T_CALLS, C_LB), C_LB);
    stop(&r);

    /* a grammar whose sentence may end where eos is the model's choice */
    struct kwk_err err = {0};
    static const char g2[] = "root ::= \"[TOOL_CALLS]\" \"a\"*";
    T_EQ(start(&r, NULL, pres, 2), 0);
    kwk_gen_seq_free(&r.g);
    kwk_grammar_free(r.gr);
    r.p.grammar = r.gr = kwk_grammar_new(g2, sizeof g2 - 1, &err);
    int32_t prompt = C_x;
    T_EQ(kwk_gen_seq_init(&r.g, N_VOCAB, &prompt, 1, &r.p, &r.out, &err), 0);
    T_EQ(STEP(&r, T_CALLS), T_CALLS);
    T_EQ(STEP(&r, T_EOS, C_a), T_EOS);
    T_EQ(r.out.finish_reason, KWK_FINISH_STOP);
    T_STREQ(text(&r), "[TOOL_CALLS]"); /* eos adds no text */
    stop(&r);

    const int32_t bad = N_VOCAB;
    T_EQ(start(&r, NULL, &bad, 1), KWK_EARG);
    stop(&r);
    T_EQ(start(&r, NULL, NULL, 1), KWK_EARG);
    stop(&r);
}

/* Without a grammar: the reply's text keeps the marker. */
static void test_text(void)
{
    static const int32_t pres[] = {T_PY};
    struct run r;
    T_EQ(start(&r, NULL, pres, 1), 0);
    kwk_gen_seq_free(&r.g);
    r.p.grammar = NULL;
    int32_t prompt = C_x;
    struct kwk_err err = {0};
    T_EQ(kwk_gen_seq_init(&r.g, N_VOCAB, &prompt, 1, &r.p, &r.out, &err), 0);
    T_EQ(STEP(&r, T_PY), T_PY);
    T_EQ(STEP(&r, T_CALLS), T_CALLS);
    T_EQ(STEP(&r, C_a), C_a);
    T_EQ(STEP(&r, T_EOS), T_EOS);
    T_STREQ(text(&r), "<|python_tag|>a");
    stop(&r);
}

int main(void)
{
    test_detok();
    test_grammar_vocab();
    test_trigger();
    test_required();
    test_text();
    return t_report("test_preserved");
}
