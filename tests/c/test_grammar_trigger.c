/* test_grammar_trigger.c - a lazy grammar (kwk_gen_params.grammar_trigger) in the token chooser
 * every generation goes through (kwk_gen_seq_next), over a small made-up vocabulary and logits
 * written for each step: free choices until the trigger, a trigger split across tokens, a token
 * that brings the trigger with bytes the grammar refuses set aside, the grammar's mask after the
 * trigger, eos before it, and the limits; a thinking model's block (kwk_gen_params.think_open /
 * think_close), inside which the trigger is not looked for: tags split across tokens, a reply
 * without a block, a prefix of the open tag that turns out to be the trigger, a block opened by
 * the prompt, the close tag and the trigger in one token, a refused candidate that would have
 * closed the block. The real model's run is tests/python/test_tools.py. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "runtime/gen.h"
#include "runtime/runtime.h"
#include "test.h"

enum {
    T_A, T_B, T_LT, T_TGT, T_TRIG, T_X, T_Y, T_TRIG_A, T_EOS,
    T_THINK, T_ENDTHINK, T_NL, T_SP, T_TH, T_INK, T_ENDTH, T_CLOSE_TRIG, T_CLOSE_TRIG_A, T_WHOLE,
    T_THINK_REST, N_VOCAB
};
static const char *const BYTES[N_VOCAB] = {
    "a", "b", "<", "t>", "<t>", "x", "y", "<t>a", "",
    "<think>", "</think>", "\n", " ", "<th", "ink>", "</th", "</think><t>", "</think><t>a",
    "<think>a</think><t>", "think>",
};

struct run {
    struct kwk_gen_params p;
    struct kwk_gen_output out;
    struct kwk_gen_seq g;
    int32_t toks[16], eos;
    kwk_grammar *gr;
    kwk_grammar_vocab *v;
};

static int start_think(struct run *r, const char *trigger, const char *open, const char *close)
{
    struct kwk_err err = {0};
    uint32_t lens[N_VOCAB];
    for (int i = 0; i < N_VOCAB; i++)
        lens[i] = (uint32_t)strlen(BYTES[i]);
    memset(r, 0, sizeof *r);
    static const char g[] = "root ::= \"<t>\" \"x\"+ \"y\"";
    r->gr = kwk_grammar_new(g, sizeof g - 1, &err);
    r->v = kwk_grammar_vocab_from_bytes(BYTES, lens, N_VOCAB, &err);
    T_TRUE(r->gr && r->v);
    kwk_gen_params_init(&r->p);
    r->p.max_new_tokens = 16;
    r->p.lookup = 0;
    r->eos = T_EOS;
    r->p.eos_ids = &r->eos;
    r->p.n_eos = 1;
    r->p.grammar = r->gr;
    r->p.grammar_vocab = r->v;
    r->p.grammar_trigger = trigger;
    r->p.think_open = open;
    r->p.think_close = close;
    r->out.tokens = r->toks;
    r->out.cap = 16;
    int32_t prompt = T_A;
    return kwk_gen_seq_init(&r->g, N_VOCAB, &prompt, 1, &r->p, &r->out, &err);
}

static int start(struct run *r, const char *trigger)
{
    return start_think(r, trigger, NULL, NULL);
}

static int start_tags(struct run *r, const char *open)
{
    return start_think(r, "<t>", open, "</think>");
}

static void stop(struct run *r)
{
    kwk_gen_seq_free(&r->g);
    kwk_grammar_free(r->gr);
    kwk_grammar_vocab_free(r->v);
}

/* One step whose logits rank the tokens in order (first the highest); the rest far below. */
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

static void test_free_then_grammar(void)
{
    struct run r;
    T_EQ(start(&r, "<t>"), 0);
    T_EQ(STEP(&r, T_A), T_A);        /* free: a token the grammar would never allow */
    T_EQ(STEP(&r, T_LT, T_B), T_LT); /* half the trigger: still free */
    T_EQ(STEP(&r, T_A, T_TGT), T_A); /* "<" then "a": the trigger did not come */
    T_EQ(STEP(&r, T_LT), T_LT);
    T_EQ(STEP(&r, T_TGT, T_A), T_TGT);  /* "<" + "t>" is the trigger: the grammar starts */
    T_EQ(STEP(&r, T_A, T_Y, T_X), T_X); /* now "a" and "y" are refused: the masked argmax */
    T_EQ(STEP(&r, T_EOS, T_X), T_X);    /* eos only at a whole sentence */
    T_EQ(r.g.done, 0);
    T_EQ(STEP(&r, T_Y, T_X), T_Y); /* "<t>xxy" is whole and nothing can follow */
    T_EQ(r.g.done, 1);
    T_EQ(r.out.finish_reason, KWK_FINISH_STOP);
    T_EQ(r.out.n_tokens, 8);
    stop(&r);
}

static void test_refused_tail_is_set_aside(void)
{
    struct run r;
    T_EQ(start(&r, "<t>"), 0);
    /* "<t>a" brings the trigger followed by "a", which the grammar refuses: the next best */
    T_EQ(STEP(&r, T_TRIG_A, T_B), T_B);
    T_TRUE(r.g.lazy);
    /* "<t>" alone is taken; then a token whose bytes hold the trigger mid-way is not needed */
    T_EQ(STEP(&r, T_TRIG, T_B), T_TRIG);
    T_TRUE(!r.g.lazy);
    T_EQ(STEP(&r, T_TRIG_A, T_X), T_X);
    stop(&r);
    /* every candidate refused in a row: an error, not a loop */
    T_EQ(start(&r, "<t>"), 0);
    float logits[N_VOCAB];
    for (int i = 0; i < N_VOCAB; i++)
        logits[i] = -INFINITY;
    logits[T_TRIG_A] = 1.0f;
    struct kwk_err err = {0};
    int32_t tok;
    /* T_TRIG_A set aside leaves only -inf logits: the sampler refuses them */
    T_TRUE(kwk_gen_seq_next(&r.g, logits, &tok, &err) < 0);
    stop(&r);
}

static void test_eos_before_the_trigger(void)
{
    struct run r;
    T_EQ(start(&r, "<t>"), 0);
    T_EQ(STEP(&r, T_B), T_B);
    T_EQ(STEP(&r, T_EOS), T_EOS); /* a reply with no call ends as free text does */
    T_EQ(r.g.done, 1);
    T_EQ(r.out.finish_reason, KWK_FINISH_STOP);
    stop(&r);
}

static void test_no_trigger_is_not_lazy(void)
{
    struct run r;
    T_EQ(start(&r, ""), 0); /* "": the grammar holds from the first byte */
    T_TRUE(!r.g.lazy);
    T_EQ(STEP(&r, T_A, T_TRIG), T_TRIG);
    stop(&r);
    T_EQ(start(&r, NULL), 0);
    T_EQ(STEP(&r, T_A, T_LT), T_LT);
    stop(&r);
}

static void test_limits(void)
{
    struct run r;
    char *big = malloc(KWK_GRAMMAR_TRIGGER_MAX + 2);
    T_TRUE(big != NULL);
    if (!big)
        return;
    memset(big, 'a', KWK_GRAMMAR_TRIGGER_MAX + 1);
    big[KWK_GRAMMAR_TRIGGER_MAX + 1] = 0;
    T_EQ(start(&r, big), KWK_EARG);
    stop(&r);
    big[KWK_GRAMMAR_TRIGGER_MAX] = 0; /* exactly the limit: taken */
    T_EQ(start(&r, big), 0);
    stop(&r);
    free(big);
}

/* The rest of a reply once the grammar holds: "x" then "y" end it, whatever else ranks first. */
static void finish_call(struct run *r)
{
    T_TRUE(!r->g.lazy);
    T_EQ(STEP(r, T_A, T_TRIG, T_X), T_X); /* the matcher holds "<t>" and nothing before it */
    T_EQ(STEP(r, T_Y, T_X), T_Y);
    T_EQ(r->g.done, 1);
    T_EQ(r->out.finish_reason, KWK_FINISH_STOP);
}

static void test_think_then_call(void)
{
    struct run r;
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(r.g.think.state, KWK_THINK_UNDECIDED);
    T_EQ(STEP(&r, T_TH, T_A), T_TH); /* "<th": the open tag split across tokens */
    T_EQ(r.g.think.state, KWK_THINK_UNDECIDED);
    T_EQ(STEP(&r, T_INK), T_INK);
    T_EQ(r.g.think.state, KWK_THINK_IN);
    T_EQ(STEP(&r, T_TRIG, T_X), T_TRIG); /* a drafted call: free text, the grammar waits */
    T_TRUE(r.g.lazy);
    T_EQ(STEP(&r, T_A, T_X), T_A);       /* "a" is taken: no grammar yet */
    T_EQ(STEP(&r, T_LT, T_TGT), T_LT);
    T_EQ(STEP(&r, T_TGT), T_TGT);        /* "<" + "t>" inside: still nothing */
    T_TRUE(r.g.lazy);
    T_EQ(STEP(&r, T_LT), T_LT);          /* "<" just before the close must not be kept... */
    T_EQ(STEP(&r, T_ENDTH, T_A), T_ENDTH); /* the close tag split across tokens */
    T_EQ(r.g.think.state, KWK_THINK_IN);
    T_EQ(STEP(&r, T_INK), T_INK);
    T_EQ(r.g.think.state, KWK_THINK_OUT);
    T_EQ(STEP(&r, T_TGT, T_A), T_TGT);   /* ...so "t>" after it is no trigger */
    T_TRUE(r.g.lazy);
    T_EQ(STEP(&r, T_NL), T_NL);
    T_EQ(STEP(&r, T_TRIG, T_A), T_TRIG); /* the call after the block: the grammar starts */
    finish_call(&r);
    stop(&r);
    /* the whole block and the call in one token */
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_WHOLE), T_WHOLE);
    finish_call(&r);
    stop(&r);
    /* the "<" of the open tag is not kept through the block: "t>" after it is no trigger */
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_LT), T_LT);
    T_EQ(STEP(&r, T_THINK_REST), T_THINK_REST);
    T_EQ(STEP(&r, T_ENDTHINK), T_ENDTHINK);
    T_EQ(STEP(&r, T_TGT, T_A), T_TGT);
    T_TRUE(r.g.lazy);
    stop(&r);
}

/* A reply that opens no block behaves as it does without the fields. */
static void test_no_block(void)
{
    struct run r;
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_A), T_A);
    T_EQ(r.g.think.state, KWK_THINK_OUT);
    T_EQ(STEP(&r, T_LT, T_B), T_LT);
    T_EQ(STEP(&r, T_TGT, T_A), T_TGT);
    finish_call(&r);
    T_EQ(r.out.n_tokens, 5);
    stop(&r);
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_TRIG, T_A), T_TRIG); /* the trigger as the reply's first bytes */
    finish_call(&r);
    stop(&r);
    /* a refused token is set aside as without the fields */
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_B), T_B);
    T_EQ(STEP(&r, T_TRIG_A, T_X), T_X);
    T_TRUE(r.g.lazy);
    stop(&r);
    /* a late "<think>" opens no block: the trigger after it still counts */
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_B), T_B);
    T_EQ(STEP(&r, T_THINK), T_THINK);
    T_EQ(STEP(&r, T_TRIG, T_A), T_TRIG);
    finish_call(&r);
    stop(&r);
}

/* Whitespace and a prefix of the open tag wait; once they open no block, the trigger sees them. */
static void test_undecided_prefix(void)
{
    struct run r;
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_NL), T_NL);
    T_EQ(STEP(&r, T_SP), T_SP);
    T_EQ(STEP(&r, T_LT, T_A), T_LT); /* "<" may begin "<think>" or "<t>" */
    T_EQ(r.g.think.state, KWK_THINK_UNDECIDED);
    T_TRUE(r.g.lazy);
    T_EQ(STEP(&r, T_TGT, T_A), T_TGT); /* "<t>": no block, and the trigger */
    T_EQ(r.g.think.state, KWK_THINK_OUT);
    finish_call(&r);
    stop(&r);
    /* whitespace then the open tag is a block */
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_SP), T_SP);
    T_EQ(STEP(&r, T_THINK), T_THINK);
    T_EQ(r.g.think.state, KWK_THINK_IN);
    T_EQ(STEP(&r, T_TRIG, T_A), T_TRIG);
    T_TRUE(r.g.lazy);
    stop(&r);
    /* "<th" then "a": no block after all, and no trigger */
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_TH), T_TH);
    T_EQ(STEP(&r, T_A), T_A);
    T_EQ(r.g.think.state, KWK_THINK_OUT);
    T_TRUE(r.g.lazy);
    stop(&r);
    /* a trigger that is also the open tag's beginning waits: the block may still open */
    T_EQ(start_think(&r, "<t>", "<t>x!", "</think>"), 0);
    T_EQ(STEP(&r, T_TRIG, T_A), T_TRIG);
    T_EQ(r.g.think.state, KWK_THINK_UNDECIDED);
    T_TRUE(r.g.lazy);
    stop(&r);
}

/* think_open NULL (or ""): the prompt opened the block, the reply starts inside it. */
static void test_prompt_opened(void)
{
    const char *opens[] = {NULL, ""};
    for (int i = 0; i < 2; i++) {
        struct run r;
        T_EQ(start_tags(&r, opens[i]), 0);
        T_EQ(r.g.think.state, KWK_THINK_IN);
        T_EQ(STEP(&r, T_TRIG, T_A), T_TRIG);
        T_EQ(STEP(&r, T_LT), T_LT);
        T_EQ(STEP(&r, T_TGT), T_TGT);
        T_EQ(STEP(&r, T_TRIG_A), T_TRIG_A); /* taken as text: the grammar is not consulted */
        T_TRUE(r.g.lazy);
        T_EQ(STEP(&r, T_ENDTHINK), T_ENDTHINK);
        T_EQ(STEP(&r, T_TRIG, T_A), T_TRIG);
        finish_call(&r);
        stop(&r);
    }
}

/* The close tag and the trigger in one token: the grammar holds from the trigger's first byte. */
static void test_close_and_trigger_in_one_token(void)
{
    struct run r;
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_THINK), T_THINK);
    T_EQ(STEP(&r, T_A), T_A);
    T_EQ(STEP(&r, T_CLOSE_TRIG, T_A), T_CLOSE_TRIG);
    finish_call(&r);
    stop(&r);
}

/* A candidate refused by the grammar changes neither the think state nor the kept tail. */
static void test_refused_keeps_think_state(void)
{
    struct run r;
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_THINK), T_THINK);
    /* "</think><t>a" would close the block and bring the trigger with "a": set aside */
    T_EQ(STEP(&r, T_CLOSE_TRIG_A, T_A), T_A);
    T_EQ(r.g.think.state, KWK_THINK_IN);
    T_EQ(r.g.think.n_held, 1); /* "a", which may not begin "</think>" but was read */
    T_EQ(STEP(&r, T_TRIG, T_A), T_TRIG); /* still inside: no trigger */
    T_TRUE(r.g.lazy);
    T_EQ(STEP(&r, T_CLOSE_TRIG, T_A), T_CLOSE_TRIG);
    finish_call(&r);
    stop(&r);
    /* undecided: "<" is kept for the trigger through a refused "<t>a" */
    T_EQ(start_tags(&r, "<think>"), 0);
    T_EQ(STEP(&r, T_LT), T_LT);
    T_EQ(STEP(&r, T_TRIG_A, T_TGT), T_TGT);
    finish_call(&r);
    stop(&r);
}

static void test_think_limits(void)
{
    struct run r;
    char big[KWK_THINK_TAG_MAX + 2];
    memset(big, 'a', sizeof big - 1);
    big[KWK_THINK_TAG_MAX + 1] = 0;
    T_EQ(start_think(&r, "<t>", big, "</think>"), KWK_EARG);
    stop(&r);
    T_EQ(start_think(&r, "<t>", "<think>", big), KWK_EARG);
    stop(&r);
    T_EQ(start_think(&r, "<t>", NULL, big), KWK_EARG);
    stop(&r);
    big[KWK_THINK_TAG_MAX] = 0; /* exactly the limit: taken */
    T_EQ(start_think(&r, "<t>", big, big), 0);
    stop(&r);
    /* without think_close, or without a lazy grammar, the fields change nothing */
    T_EQ(start_think(&r, "<t>", "<think>", ""), 0);
    T_EQ(r.g.think.state, KWK_THINK_OUT);
    T_EQ(STEP(&r, T_THINK), T_THINK);
    T_EQ(STEP(&r, T_TRIG, T_A), T_TRIG);
    T_TRUE(!r.g.lazy);
    stop(&r);
    T_EQ(start_think(&r, NULL, "<think>", "</think>"), 0);
    T_EQ(STEP(&r, T_A, T_TRIG), T_TRIG); /* the grammar from the first byte */
    stop(&r);
}

int main(void)
{
    test_free_then_grammar();
    test_refused_tail_is_set_aside();
    test_eos_before_the_trigger();
    test_no_trigger_is_not_lazy();
    test_limits();
    test_think_then_call();
    test_no_block();
    test_undecided_prefix();
    test_prompt_opened();
    test_close_and_trigger_in_one_token();
    test_refused_keeps_think_state();
    test_think_limits();
    return t_report("test_grammar_trigger");
}
