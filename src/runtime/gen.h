/* gen.h - one sequence's generation state: sampler, output tokens, text with stop strings,
 * streaming callback, and the token history n-gram lookup searches. Shared by kwk_generate (one
 * sequence on a decoder) and the serving engine (many sequences in one batched step). A sequence
 * is driven by one thread at a time. */
#ifndef KWK_GEN_H
#define KWK_GEN_H

#include "kwker.h"

/* Where a lazy grammar's reply stands against a thinking model's block (p->think_close): the
 * trigger is looked for only outside it. */
enum kwk_think_state {
    KWK_THINK_OUT = 0,   /* no block, or after it: the trigger watches every byte */
    KWK_THINK_UNDECIDED, /* only whitespace and a proper prefix of p->think_open so far */
    KWK_THINK_IN,        /* inside the block, until p->think_close */
};

struct kwk_think {
    int state;                    /* enum kwk_think_state */
    size_t n_held;                /* UNDECIDED: bytes of think_open matched; IN: of held */
    char held[KWK_THINK_TAG_MAX]; /* IN: the last bytes read, which may begin think_close */
};

struct kwk_gen_seq {
    const struct kwk_gen_params *p;
    struct kwk_gen_output *out;
    kwk_sampler *sampler;
    kwk_detok *detok;      /* NULL without a tokenizer */
    int32_t *seq;          /* [n_prompt + max_new + 1] prompt then output: what lookup searches */
    int n_seq;
    size_t text_cap;
    size_t emitted;        /* bytes of out->text already given to the callback */
    size_t max_stop;       /* longest stop string */
    int done;              /* out->finish_reason is set */
    int stop_cut;          /* a stop string ended the text */
    int32_t top_ids[KWK_SAMPLER_TOP_MAX]; /* of the token being chosen */
    float top_lps[KWK_SAMPLER_TOP_MAX];
    /* Adaptive lookup: how often the lookup's next-token guess was right, learned from every
     * token chosen (proposed or not), so a candidate is checked only when its expected gain
     * pays for its row in the verification pass. */
    float lk_rate[4];      /* [match length 1..3] moving hit rate of the first candidate */
    float lk_cont;         /* moving hit rate right after a hit (a copy run continuing) */
    int lk_prev_hit;       /* the previous token was guessed right */
    kwk_matcher *matcher;  /* with p->grammar: where the reply stands in it */
    kwk_grammar_vocab *own_vocab; /* built for this sequence when p->grammar_vocab is NULL */
    uint32_t *allowed;     /* [(n_vocab + 31) / 32] the grammar's mask of the next token */
    float *masked;         /* [n_vocab] logits with the disallowed tokens at -inf */
    const kwk_grammar_vocab *vocab; /* the matcher's: each token's bytes */
    /* A lazy grammar (p->grammar_trigger): free text until the trigger appears, then the
     * matcher from the trigger's first byte on. */
    int lazy;              /* 1 while the trigger has not appeared */
    int triggered;         /* the token being accepted started the matcher (already advanced) */
    size_t trig_len;
    char *trig_buf;        /* [trig_len + the vocabulary's longest token] the last bytes seen */
    size_t trig_tail;      /* bytes of it kept from earlier tokens (< trig_len) */
    struct kwk_think think; /* with p->think_close and a trigger, else always KWK_THINK_OUT */
    size_t n_think_open, n_think_close; /* their lengths */
    int n_vocab;
    int dr_n;              /* draft proposals for the next step: p->n_draft at first, then
                            * transformers' heuristic schedule (+2 after a step that kept them
                            * all, -1 otherwise) */
};

/* Check p, reset out and set up g for prompt[n_prompt] (the prompt's tokens enter the sampler's
 * history). p, out and the tokenizer must outlive g. Returns 0 or a negative code with err
 * filled; kwk_gen_seq_free is needed either way. */
int kwk_gen_seq_init(struct kwk_gen_seq *g, int n_vocab, const int32_t *prompt, int n_prompt,
                     const struct kwk_gen_params *p, struct kwk_gen_output *out,
                     struct kwk_err *err);
void kwk_gen_seq_free(struct kwk_gen_seq *g);

/* Choose the next token from logits[n_vocab] and record it: output (with logprob and
 * p->top_logprobs alternatives), sampler history, text, eos / stop / length, callback (whose
 * non-zero return cancels). Sets g->done with out->finish_reason when the sequence ends.
 * Returns 0, or a negative code (bad logits, out of memory) with err filled. */
int kwk_gen_seq_next(struct kwk_gen_seq *g, const float *logits, int32_t *tok,
                     struct kwk_err *err);

/* Prompt lookup: up to max tokens that followed the latest earlier occurrence of the sequence's
 * last n-gram (longest n first), fewer (down to 0) when the hit rates learned so far say the
 * extra verification rows would cost more than they save. Returns how many were written. */
int kwk_gen_seq_lookup(const struct kwk_gen_seq *g, int32_t *cand, int max);

#endif
