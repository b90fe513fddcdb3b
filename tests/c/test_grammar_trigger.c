/* test_grammar_trigger.c - a lazy grammar (kwk_gen_params.grammar_trigger) in the token chooser
 * every generation goes through (kwk_gen_seq_next), over a small made-up vocabulary and logits
 * written for each step: free choices until the trigger, a trigger split across tokens, a token
 * that brings the trigger with bytes the grammar refuses set aside, the grammar's mask after the
 * trigger, eos before it, and the limits. The real model's run is tests/python/test_tools.py. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "runtime/gen.h"
#include "runtime/runtime.h"
#include "test.h"

enum { T_A, T_B, T_LT, T_TGT, T_TRIG, T_X, T_Y, T_TRIG_A, T_EOS, N_VOCAB };
static const char *const BYTES[N_VOCAB] = {"a", "b", "<", "t>", "<t>", "x", "y", "<t>a", ""};

struct run {
    struct kwk_gen_params p;
    struct kwk_gen_output out;
    struct kwk_gen_seq g;
    int32_t toks[16], eos;
    kwk_grammar *gr;
    kwk_grammar_vocab *v;
};

static int start(struct run *r, const char *trigger)
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
    r->out.tokens = r->toks;
    r->out.cap = 16;
    int32_t prompt = T_A;
    return kwk_gen_seq_init(&r->g, N_VOCAB, &prompt, 1, &r->p, &r->out, &err);
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

int main(void)
{
    test_free_then_grammar();
    test_refused_tail_is_set_aside();
    test_eos_before_the_trigger();
    test_no_trigger_is_not_lazy();
    test_limits();
    return t_report("test_grammar_trigger");
}
