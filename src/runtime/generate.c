/* generate.c - the generation loop: prompt reuse, sampling, eos and stop strings, streaming, and
 * exact speculation (n-gram lookup or a draft model). Runs on the decoder's owner thread. */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "grammar/grammar.h"
#include "runtime/gen.h"
#include "runtime/runtime.h"

/* Tokens a lazy grammar's trigger may refuse in a row before the reply fails: a token that
 * completes the trigger with bytes the grammar does not take is re-chosen without it. */
#define TRIGGER_RETRIES 64
/* Candidates checked in one pass at most (lookup or draft). */
#define MAX_SPEC 16
/* Longest n-gram the lookup matches, shortest first tried last. */
#define LOOKUP_NGRAM_MAX 3
/* Cost of a verification pass with k >= 1 candidates, in single-token passes: 1 + FIRST +
 * EACH * (k - 1). */
#define LOOKUP_COST_FIRST 0.30
#define LOOKUP_COST_EACH 0.05
/* Weight of the newest token in the moving hit rates (about the last 8 tokens count). */
#define LOOKUP_RATE_STEP 0.125f
_Static_assert(LOOKUP_NGRAM_MAX < sizeof(((struct kwk_gen_seq *)0)->lk_rate) / sizeof(float),
               "lk_rate has a slot per match length");

void kwk_gen_params_init(struct kwk_gen_params *p)
{
    memset(p, 0, sizeof *p);
    p->max_new_tokens = 16;
    kwk_sampler_params_init(&p->sampling);
    p->prompt_cache = 1;
    p->lookup = 8;
    p->n_draft = 4;
}

void kwk_gen_output_clear(struct kwk_gen_output *o)
{
    if (!o)
        return;
    kwk_free(o->text);
    o->text = NULL;
    o->text_len = 0;
}

static int text_append(struct kwk_gen_seq *g, const char *s, size_t n)
{
    struct kwk_gen_output *o = g->out;
    if (o->text_len + n + 1 > g->text_cap) {
        size_t cap = KWK_MAX(g->text_cap * 2, o->text_len + n + 64);
        char *t = kwk_realloc(o->text, cap);
        if (!t)
            return -ENOMEM;
        o->text = t;
        g->text_cap = cap;
    }
    memcpy(o->text + o->text_len, s, n);
    o->text_len += n;
    o->text[o->text_len] = '\0';
    return 0;
}

/* Where the latest earlier occurrence of the sequence's last n-gram ends (longest n first), with
 * n in *ng; -1 when nothing matches. The token at the returned index is the lookup's guess. */
static int lookup_match(const int32_t *s, int n, int *ng)
{
    for (int k = LOOKUP_NGRAM_MAX; k >= 1; k--) {
        if (n <= k)
            continue;
        for (int i = n - k - 1; i >= 0; i--)
            if (memcmp(s + i, s + n - k, sizeof(int32_t) * (size_t)k) == 0) {
                *ng = k;
                return i + k;
            }
    }
    return -1;
}

/* How many of up to max candidates to check: the count that maximizes expected tokens per unit
 * of pass time. Candidate j (1-based) is kept with probability about a * c^(j-1) (a: hit rate
 * of this match length, c: of a copy run continuing); a pass with k candidates costs about
 * 1 + LOOKUP_COST_FIRST + LOOKUP_COST_EACH * (k - 1) single-token passes (rough figures from
 * SmolLM2-135M in float32 on 2 busy cores: the second row costs most, later rows little). The
 * choice only changes speed: every candidate is checked, so the tokens stay exact. */
static int lookup_count(const struct kwk_gen_seq *g, int ng, int max)
{
    double a = g->lk_rate[ng], c = g->lk_cont, gain = 1.0, best = 1.0, pj = a;
    int k_best = 0;
    for (int k = 1; k <= max; k++) {
        gain += pj;
        pj *= c;
        double rate = gain / (1.0 + LOOKUP_COST_FIRST + LOOKUP_COST_EACH * (k - 1));
        if (rate > best) {
            best = rate;
            k_best = k;
        }
    }
    return k_best;
}

int kwk_gen_seq_lookup(const struct kwk_gen_seq *g, int32_t *cand, int max)
{
    int ng = 0, at = lookup_match(g->seq, g->n_seq, &ng);
    if (at < 0)
        return 0;
    int k = 0, want = lookup_count(g, ng, max);
    while (k < want && at + k < g->n_seq)
        cand[k] = g->seq[at + k], k++;
    return k;
}

/* Learn from the token about to be recorded whether the lookup would have guessed it. */
static void lookup_learn(struct kwk_gen_seq *g, int32_t tok)
{
    int ng = 0, at = lookup_match(g->seq, g->n_seq, &ng);
    if (at < 0) {
        g->lk_prev_hit = 0;
        return;
    }
    int hit = g->seq[at] == tok;
    g->lk_rate[ng] += LOOKUP_RATE_STEP * ((float)hit - g->lk_rate[ng]);
    if (g->lk_prev_hit)
        g->lk_cont += LOOKUP_RATE_STEP * ((float)hit - g->lk_cont);
    g->lk_prev_hit = hit;
}

/* Cut the text at the first stop string that ends in the new bytes; 1 when one was found. */
static int find_stop(struct kwk_gen_seq *g, size_t old_len)
{
    struct kwk_gen_output *o = g->out;
    size_t best = (size_t)-1;
    for (int i = 0; i < g->p->n_stop; i++) {
        const char *st = g->p->stop[i];
        size_t n = strlen(st);
        if (n == 0 || n > o->text_len)
            continue;
        size_t from = old_len + 1 > n ? old_len + 1 - n : 0;
        for (size_t at = from; at + n <= o->text_len; at++)
            if (memcmp(o->text + at, st, n) == 0) {
                if (at < best)
                    best = at;
                break;
            }
    }
    if (best == (size_t)-1)
        return 0;
    o->text_len = best;
    o->text[best] = '\0';
    return 1;
}

/* Bytes of text that can no longer change: all of it once done, else all but what could still
 * be the start of a stop string (held back whole UTF-8 characters). */
static size_t settled_len(const struct kwk_gen_seq *g)
{
    size_t n = g->out->text_len;
    if (g->done || g->max_stop <= 1)
        return n;
    size_t hold = g->max_stop - 1;
    size_t cut = n > hold ? n - hold : 0;
    while (cut > 0 && ((unsigned char)g->out->text[cut] & 0xC0) == 0x80)
        cut--;
    return KWK_MAX(cut, g->emitted);
}

static int emit(struct kwk_gen_seq *g, int32_t tok)
{
    if (!g->p->on_token)
        return 0;
    size_t upto = settled_len(g);
    const char *s = g->out->text ? g->out->text + g->emitted : "";
    int stop = g->p->on_token(g->p->user, tok, s, upto - g->emitted);
    g->emitted = upto;
    return stop;
}

static int is_eos(const struct kwk_gen_seq *g, int32_t tok)
{
    for (int e = 0; e < g->p->n_eos; e++)
        if (tok == g->p->eos_ids[e])
            return 1;
    return 0;
}

/* Whether the grammar lets tok come next: an eos id once the text is a whole sentence, any
 * other token when its bytes continue the text (never one past the vocabulary, a special token,
 * or when the matcher fails: kwk_matcher_allows is then not 1). */
static int grammar_allows(struct kwk_gen_seq *g, int32_t tok)
{
    if (is_eos(g, tok))
        return kwk_matcher_done(g->matcher);
    return kwk_matcher_allows(g->matcher, tok) == 1;
}

/* Choose tok from the logits with every token the grammar forbids at -inf. */
static int grammar_sample(struct kwk_gen_seq *g, const float *logits, int32_t *tok, float *lp,
                          struct kwk_err *err)
{
    int nv = g->n_vocab, n = 0;
    int32_t rc = kwk_matcher_mask(g->matcher, g->allowed);
    if (rc < 0)
        return kwk_err_set(err, rc, "grammar: %s at byte %zu of the reply",
                           rc == KWK_ELIMIT ? "too ambiguous (the matcher's limit)"
                                            : kwk_status_str(rc),
                           g->out->text_len);
    for (int i = 0; i < nv; i++) {
        int ok = g->allowed[i >> 5] >> (i & 31) & 1;
        g->masked[i] = ok ? logits[i] : -INFINITY;
        n += ok;
    }
    /* An eos id is allowed only at a whole sentence, even when it is also a token whose bytes
     * the grammar would take (a caller's "\n" as eos). */
    int done = kwk_matcher_done(g->matcher);
    for (int e = 0; e < g->p->n_eos; e++) {
        int32_t id = g->p->eos_ids[e];
        n -= g->masked[id] != -INFINITY;
        g->masked[id] = done ? logits[id] : -INFINITY;
        n += done;
    }
    if (n <= 0)
        return kwk_err_set(err, KWK_ERUNTIME, "grammar: no token of the vocabulary can continue "
                           "the reply after byte %zu", g->out->text_len);
    rc = kwk_sampler_sample(g->sampler, g->masked, tok, NULL, NULL, NULL, 0);
    if (rc < 0)
        return kwk_err_set(err, rc, "sampling under the grammar failed: %s",
                           kwk_status_str(rc));
    kwk_sampler_raw_logprobs(g->sampler, logits, *tok, lp, g->top_ids, g->top_lps,
                             g->p->top_logprobs);
    return 0;
}

/* Record one chosen token: output, sampler history, text, stop conditions, callback. */
static int accept_token(struct kwk_gen_seq *g, int32_t tok, float logprob)
{
    struct kwk_gen_output *o = g->out;
    int grammar_end = 0;
    if (o->n_tokens < o->cap) {
        o->tokens[o->n_tokens] = tok;
        if (o->logprobs)
            o->logprobs[o->n_tokens] = logprob;
        int nt = g->p->top_logprobs;
        if (nt > 0 && o->top_ids && o->top_lps) {
            memcpy(o->top_ids + (size_t)o->n_tokens * nt, g->top_ids, sizeof(int32_t) * nt);
            memcpy(o->top_lps + (size_t)o->n_tokens * nt, g->top_lps, sizeof(float) * nt);
        }
    }
    o->n_tokens++;
    if (g->p->lookup > 0)
        lookup_learn(g, tok);
    g->seq[g->n_seq++] = tok;
    kwk_sampler_accept(g->sampler, tok, 0);
    if (is_eos(g, tok)) {
        o->finish_reason = KWK_FINISH_STOP;
        g->done = 1;
    } else if (g->matcher && !g->lazy) {
        /* the sampler only picks what the grammar allows, so this cannot fail; a token that
         * set off a lazy grammar has advanced it already */
        int rc = g->triggered ? 0 : kwk_matcher_accept(g->matcher, tok);
        g->triggered = 0;
        if (rc < 0)
            return rc;
        grammar_end = kwk_matcher_finished(g->matcher);
    }
    if (g->detok && !g->done) {
        const char *piece;
        size_t len, old = o->text_len;
        int rc = kwk_detok_push(g->detok, tok, &piece, &len);
        /* A token the tokenizer cannot spell (an id past its vocabulary: a checkpoint whose
         * embedding table is padded) adds no text; only running out of memory is an error. */
        if (rc == 0 && len)
            rc = text_append(g, piece, len);
        if (rc == -ENOMEM)
            return rc;
        if (g->p->n_stop && find_stop(g, old)) {
            o->finish_reason = KWK_FINISH_STOP;
            g->done = g->stop_cut = 1;
        }
    }
    if (!g->done && grammar_end) { /* a whole sentence that nothing can continue */
        o->finish_reason = KWK_FINISH_STOP;
        g->done = 1;
    }
    if (!g->done && o->n_tokens >= g->p->max_new_tokens) {
        o->finish_reason = KWK_FINISH_LENGTH;
        g->done = 1;
    }
    /* Text held back by the detokenizer (half a character) ends the reply unless a stop
     * string cut it: decode() of the same tokens would print it (as U+FFFD). */
    if (g->done && g->detok && !g->stop_cut) {
        const char *piece;
        size_t len;
        if (kwk_detok_flush(g->detok, &piece, &len) == 0 && len && text_append(g, piece, len))
            return -ENOMEM;
    }
    if (emit(g, tok)) {
        o->finish_reason = KWK_FINISH_CANCELED;
        g->done = 1;
    }
    return 0;
}

static int is_preserved(const struct kwk_gen_seq *g, int32_t tok)
{
    for (int i = 0; i < g->p->n_preserved; i++)
        if (g->p->preserved_ids[i] == tok)
            return 1;
    return 0;
}

/* The bytes tok adds to the text a lazy grammar watches, or NULL: a special token (unless
 * preserved: the detokenizer keeps its text) or a padded id adds none. */
static const char *trigger_bytes(const struct kwk_gen_seq *g, int32_t tok, size_t *n)
{
    const kwk_grammar_vocab *v = g->vocab;
    if (tok < 0 || tok >= v->n_vocab || !(v->usable[tok] || is_preserved(g, tok)))
        return NULL;
    *n = v->off[tok + 1] - v->off[tok];
    return v->bytes + v->off[tok];
}

/* The whitespace a reply may open with before its think block (a regex's \s, in ASCII). */
static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

/* Reads the reply's first bytes s[0..n) against think_open while it is undecided. Returns how
 * many it took: all of them while still undecided, through think_open's last byte once the
 * block opens (t->state IN), none once the reply turns out to open no block (OUT: every byte
 * read so far is ordinary text, which the trigger then sees). */
static size_t think_open_scan(const struct kwk_gen_seq *g, struct kwk_think *t, const char *s,
                              size_t n)
{
    const char *open = g->p->think_open;
    for (size_t i = 0; i < n; i++) {
        if (t->n_held == 0 && is_space(s[i]))
            continue;
        if (s[i] != open[t->n_held]) {
            t->state = KWK_THINK_OUT;
            t->n_held = 0;
            return 0;
        }
        if (++t->n_held == g->n_think_open) {
            t->state = KWK_THINK_IN;
            t->n_held = 0;
            return i + 1;
        }
    }
    return n;
}

/* Byte i of the block's held bytes followed by s. */
static char held_byte(const struct kwk_think *t, const char *s, size_t i)
{
    return i < t->n_held ? t->held[i] : s[i - t->n_held];
}

/* Reads s[0..n) inside the think block. Returns how many bytes it took through think_close's
 * last one (t->state OUT then), or n with the last bytes held, since think_close may be split
 * across tokens. */
static size_t think_close_scan(const struct kwk_gen_seq *g, struct kwk_think *t, const char *s,
                               size_t n)
{
    const char *close = g->p->think_close;
    size_t nc = g->n_think_close, len = t->n_held + n;
    for (size_t i = 0; i + nc <= len; i++) {
        size_t k = 0;
        while (k < nc && held_byte(t, s, i + k) == close[k])
            k++;
        if (k == nc) {
            size_t took = i + nc - t->n_held; /* held < nc: the match ends in s */
            t->state = KWK_THINK_OUT;
            t->n_held = 0;
            return took;
        }
    }
    char last[KWK_THINK_TAG_MAX];
    size_t keep = KWK_MIN(nc - 1, len);
    for (size_t k = 0; k < keep; k++)
        last[k] = held_byte(t, s, len - keep + k);
    memcpy(t->held, last, keep);
    t->n_held = keep;
    return n;
}

/* What one token's bytes do to the think state, and which of them the trigger sees. Worked out
 * for a candidate and applied only when it is taken (a refused one changes nothing). */
struct think_step {
    struct kwk_think next;
    size_t from; /* the trigger sees the token's bytes from here on */
    int fresh;   /* the token went through the block: the kept tail (before it) is dropped */
    int check;   /* the trigger is looked for (not inside the block, nor while undecided) */
};

static void think_advance(const struct kwk_gen_seq *g, const char *s, size_t n,
                          struct think_step *st)
{
    struct kwk_think *t = &st->next;
    size_t at = 0;
    *t = g->think;
    st->from = 0;
    st->fresh = 0;
    if (t->state == KWK_THINK_UNDECIDED)
        at = think_open_scan(g, t, s, n);
    if (t->state == KWK_THINK_IN) {
        at += think_close_scan(g, t, s + at, n - at);
        st->from = at;
        st->fresh = 1;
    }
    st->check = t->state == KWK_THINK_OUT;
}

/* Joins s[0..n) after the kept tail in trig_buf (which stays as it was, for a token that is
 * refused). Returns the end of the bytes the trigger sees, their start in *start: the tail's,
 * or s's when fresh. */
static size_t trigger_window(struct kwk_gen_seq *g, const char *s, size_t n, int fresh,
                             size_t *start)
{
    memcpy(g->trig_buf + g->trig_tail, s, n);
    *start = fresh ? g->trig_tail : 0;
    return g->trig_tail + n;
}

/* Whether trig_buf[start..len) sets off the lazy grammar: 0 no, 1 yes (the matcher now holds
 * the text from the trigger's first byte on), 2 the trigger is there but the grammar refuses
 * what follows it (nothing changed), or a negative code when the matcher could not tell
 * (KWK_ELIMIT, -ENOMEM). */
static int trigger_check(struct kwk_gen_seq *g, size_t start, size_t len)
{
    const char *t = g->p->grammar_trigger;
    char *b = g->trig_buf;
    /* the tail is shorter than the trigger, so a match found here ends in the new bytes */
    for (size_t i = start; i + g->trig_len <= len; i++) {
        if (memcmp(b + i, t, g->trig_len))
            continue;
        kwk_matcher_reset(g->matcher);
        int rc = kwk_matcher_accept_bytes(g->matcher, b + i, len - i);
        if (rc < 0) {
            kwk_matcher_reset(g->matcher);
            return rc == KWK_EARG ? 2 : rc;
        }
        return 1;
    }
    return 0;
}

/* The tail kept after a token that did not set the trigger off: the last trig_len - 1 bytes of
 * trig_buf[start..len). */
static void trigger_keep(struct kwk_gen_seq *g, size_t start, size_t len)
{
    size_t keep = KWK_MIN(len - start, g->trig_len - 1);
    memmove(g->trig_buf, g->trig_buf + len - keep, keep);
    g->trig_tail = keep;
}

/* Whether the lazy grammar lets tok come next, in trigger_check's codes. For 0 (free text) and
 * 1 (it set the grammar off) tok is taken: think state, kept tail, matcher; for 2 and errors
 * nothing changes. */
static int lazy_take(struct kwk_gen_seq *g, int32_t tok)
{
    size_t n = 0, start;
    const char *s = trigger_bytes(g, tok, &n);
    if (!s)
        return 0;
    struct think_step st;
    think_advance(g, s, n, &st);
    size_t len = trigger_window(g, s + st.from, n - st.from, st.fresh, &start);
    int rc = st.check ? trigger_check(g, start, len) : 0;
    if (rc != 0 && rc != 1)
        return rc;
    g->think = st.next;
    if (rc == 1) {
        g->lazy = 0;
        g->triggered = 1;
    } else {
        trigger_keep(g, start, len);
    }
    return rc;
}

/* A free choice while the lazy grammar waits for its trigger; a token that would set it off
 * with bytes the grammar refuses is never chosen (the choice is made again without it). */
static int lazy_choose(struct kwk_gen_seq *g, const float *logits, int32_t *tok, float *lp,
                       struct kwk_err *err)
{
    const float *from = logits;
    for (int tries = 0;; tries++) {
        int rc = kwk_sampler_sample(g->sampler, from, tok, lp, g->top_ids, g->top_lps,
                                    g->p->top_logprobs);
        if (rc < 0)
            return kwk_err_set(err, rc, "sampling failed: %s", kwk_status_str(rc));
        if (from != logits) /* logprobs are the raw logits' */
            kwk_sampler_raw_logprobs(g->sampler, logits, *tok, lp, g->top_ids, g->top_lps,
                                     g->p->top_logprobs);
        if (is_eos(g, *tok))
            return 0;
        rc = lazy_take(g, *tok);
        if (rc < 0)
            return kwk_err_set(err, rc, "grammar: %s at its trigger",
                               rc == KWK_ELIMIT ? "too ambiguous (the matcher's limit)"
                                                : kwk_status_str(rc));
        if (rc != 2)
            return 0;
        if (tries == TRIGGER_RETRIES)
            return kwk_err_set(err, KWK_ERUNTIME, "grammar: %d tokens in a row set off the "
                               "trigger with text the grammar refuses", TRIGGER_RETRIES + 1);
        if (from == logits) {
            memcpy(g->masked, logits, sizeof(float) * (size_t)g->n_vocab);
            from = g->masked;
        }
        g->masked[*tok] = -INFINITY;
    }
}

int kwk_gen_seq_next(struct kwk_gen_seq *g, const float *logits, int32_t *tok,
                     struct kwk_err *err)
{
    float lp;
    int rc;
    if (g->matcher && g->lazy) {
        if ((rc = lazy_choose(g, logits, tok, &lp, err)) < 0)
            return rc;
        if ((rc = accept_token(g, *tok, lp)) < 0)
            return kwk_err_set(err, rc, "the reply's text: %s", kwk_status_str(rc));
        return 0;
    }
    /* Under a grammar a greedy choice the grammar allows is the masked argmax too (masking only
     * lowers other tokens), so greedy decoding masks only when the argmax is refused; sampling
     * always draws from the masked logits. */
    int greedy = !g->p->sampling.do_sample || g->p->sampling.temperature == 0;
    if (g->matcher && !greedy) {
        if ((rc = grammar_sample(g, logits, tok, &lp, err)) < 0)
            return rc;
    } else {
        rc = kwk_sampler_sample(g->sampler, logits, tok, &lp, g->top_ids, g->top_lps,
                                g->p->top_logprobs);
        if (rc < 0)
            return kwk_err_set(err, rc, "sampling failed: %s", kwk_status_str(rc));
        if (g->matcher && !grammar_allows(g, *tok) &&
            (rc = grammar_sample(g, logits, tok, &lp, err)) < 0)
            return rc;
    }
    rc = accept_token(g, *tok, lp);
    if (rc < 0)
        return kwk_err_set(err, rc, "the reply's text: %s", kwk_status_str(rc));
    return 0;
}

/* A draft model's greedy proposals after the current sequence. */
static int draft_candidates(struct kwk_gen_seq *g, int32_t *cand, int max)
{
    kwk_decoder *dr = g->p->draft;
    int keep = kwk_decoder_reuse_prefix(dr, g->seq, g->n_seq);
    int n = 0;
    if (kwk_decoder_eval(dr, g->seq + keep, g->n_seq - keep, NULL, KWK_LOGITS_LAST) != 0)
        return 0;
    for (; n < max; n++) {
        int32_t best = kwk_argmax(kwk_decoder_logits(dr), dr->c->n_vocab);
        cand[n] = best;
        if (n + 1 < max && kwk_decoder_eval(dr, &best, 1, NULL, KWK_LOGITS_LAST) != 0)
            return n + 1;
    }
    return n;
}

/* One kwk_generate call: a sequence's state plus the decoder it runs on. */
struct gen_call {
    struct kwk_gen_seq g;
    kwk_decoder *d;
    float *rows; /* [MAX_SPEC + 1][n_vocab] logits of a verification pass */
};

/* One step: evaluate the pending token plus candidates, then keep candidates while the model's
 * own choice at each position equals them; the first differing choice is the next pending. */
static int step(struct gen_call *c, int32_t *pending, struct kwk_err *err)
{
    struct kwk_gen_seq *g = &c->g;
    kwk_decoder *d = c->d;
    int32_t batch[MAX_SPEC + 1];
    int room = d->max_len - d->pos - 1;
    int want = KWK_MIN(KWK_MIN(MAX_SPEC, room), g->p->max_new_tokens - g->out->n_tokens - 1);
    int n_cand = 0;
    batch[0] = *pending;
    if (want > 0 && g->p->draft)
        n_cand = draft_candidates(g, batch + 1, KWK_MIN(want, g->dr_n));
    else if (want > 0 && g->p->lookup > 0)
        n_cand = kwk_gen_seq_lookup(g, batch + 1, KWK_MIN(want, g->p->lookup));
    int base = d->pos;
    int rc = kwk_decoder_eval(d, batch, 1 + n_cand, c->rows, KWK_LOGITS_ALL);
    if (rc < 0)
        return kwk_err_set(err, rc, "forward pass failed: %s", kwk_status_str(rc));
    g->out->n_steps++;
    g->out->n_proposed += n_cand;
    size_t nv = (size_t)d->c->n_vocab;
    int kept = 0;
    for (int j = 0; j <= n_cand && !g->done; j++) {
        int32_t tok;
        if ((rc = kwk_gen_seq_next(g, c->rows + (size_t)j * nv, &tok, err)) < 0)
            return rc;
        *pending = tok;
        if (j < n_cand && tok == batch[1 + j]) {
            kept++;
            continue;
        }
        break;
    }
    g->out->n_accepted += kept;
    if (g->p->draft && n_cand > 0)
        g->dr_n = kept == n_cand ? KWK_MIN(g->dr_n + 2, MAX_SPEC) : KWK_MAX(g->dr_n - 1, 1);
    /* the cache holds the pending token and the kept candidates; the rest is dropped */
    kwk_decoder_truncate(d, base + 1 + kept);
    return 0;
}

/* The think state a lazy grammar's reply starts in (p->think_open, p->think_close). */
static int think_init(struct kwk_gen_seq *g, struct kwk_err *err)
{
    const char *open = g->p->think_open, *close = g->p->think_close;
    g->n_think_open = open ? strlen(open) : 0;
    g->n_think_close = close ? strlen(close) : 0;
    if (g->n_think_open > KWK_THINK_TAG_MAX || g->n_think_close > KWK_THINK_TAG_MAX)
        return kwk_err_set(err, KWK_EARG, "think_open and think_close are at most %d bytes",
                           KWK_THINK_TAG_MAX);
    if (g->n_think_close == 0)
        g->think.state = KWK_THINK_OUT;
    else /* no think_open: the prompt opened the block */
        g->think.state = g->n_think_open ? KWK_THINK_UNDECIDED : KWK_THINK_IN;
    return 0;
}

int kwk_gen_seq_init(struct kwk_gen_seq *g, int n_vocab, const int32_t *prompt, int n_prompt,
                     const struct kwk_gen_params *p, struct kwk_gen_output *out,
                     struct kwk_err *err)
{
    memset(g, 0, sizeof *g);
    g->p = p;
    g->out = out;
    out->n_tokens = out->n_proposed = out->n_accepted = out->n_steps = 0;
    out->finish_reason = KWK_FINISH_NONE;
    out->n_prompt = n_prompt;
    out->prompt_reused = 0;
    out->text = NULL;
    out->text_len = 0;
    if (!p || !prompt || n_prompt < 1 || p->max_new_tokens < 0 || p->n_eos < 0 || p->n_stop < 0 ||
        (p->n_eos && !p->eos_ids) || (p->n_stop && !p->stop) || p->top_logprobs < 0 ||
        p->top_logprobs > KWK_SAMPLER_TOP_MAX || p->n_preserved < 0 ||
        (p->n_preserved && !p->preserved_ids))
        return kwk_err_set(err, KWK_EARG, "generate: bad arguments");
    for (int i = 0; i < p->n_preserved; i++)
        if (p->preserved_ids[i] < 0 || p->preserved_ids[i] >= n_vocab)
            return kwk_err_set(err, KWK_EARG, "preserved token %d (id %d) is out of range", i,
                               p->preserved_ids[i]);
    if (p->n_stop > 0 && !p->tok)
        return kwk_err_set(err, KWK_EARG, "stop strings need a tokenizer");
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i])
            return kwk_err_set(err, KWK_EARG, "stop string %d is NULL", i);
    g->sampler = kwk_sampler_new(n_vocab, &p->sampling, err);
    if (!g->sampler)
        return err && err->code ? err->code : KWK_EARG;
    int rc = kwk_sampler_set_eos(g->sampler, p->eos_ids, p->n_eos);
    if (rc < 0)
        return kwk_err_set(err, rc, "eos ids out of range");
    if (p->n_logit_bias) {
        rc = kwk_sampler_set_logit_bias(g->sampler, p->logit_bias_ids, p->logit_bias,
                                        p->n_logit_bias, err);
        if (rc < 0)
            return err && err->code ? err->code : rc;
    }
    size_t n_seq = (size_t)n_prompt + (size_t)p->max_new_tokens + 1;
    g->seq = kwk_malloc(n_seq * sizeof(int32_t));
    if (p->tok)
        g->detok = kwk_detok_new(p->tok, 1);
    if (!g->seq || (p->tok && !g->detok) ||
        (g->detok && kwk_detok_preserve(g->detok, p->preserved_ids, p->n_preserved)))
        return kwk_err_set(err, -ENOMEM, "out of memory");
    for (int i = 0; i < p->n_stop; i++)
        g->max_stop = KWK_MAX(g->max_stop, strlen(p->stop[i]));
    for (int i = 0; i < n_prompt; i++)
        if ((rc = kwk_sampler_accept(g->sampler, prompt[i], 1)) < 0)
            return kwk_err_set(err, rc, "prompt token %d (id %d) is out of range", i, prompt[i]);
    memcpy(g->seq, prompt, sizeof(int32_t) * (size_t)n_prompt);
    g->n_seq = n_prompt;
    /* priors until the reply's own tokens speak: longer matches guess better */
    g->lk_rate[1] = 0.2f;
    g->lk_rate[2] = 0.35f;
    g->lk_rate[3] = 0.5f;
    g->lk_cont = 0.7f;
    g->dr_n = KWK_MAX(p->n_draft, 0);
    g->n_vocab = n_vocab;
    if (p->grammar) {
        const kwk_grammar_vocab *v = p->grammar_vocab;
        if (!v && !p->tok)
            return kwk_err_set(err, KWK_EARG, "a grammar needs the tokenizer (or its "
                                              "grammar vocabulary)");
        if (!v && !(v = g->own_vocab = kwk_grammar_vocab_new(p->tok, err)))
            return err && err->code ? err->code : -ENOMEM;
        g->matcher = kwk_matcher_new(p->grammar, v, err);
        if (!g->matcher)
            return err && err->code ? err->code : -ENOMEM;
        if (kwk_matcher_preserve(g->matcher, p->preserved_ids, p->n_preserved))
            return kwk_err_set(err, -ENOMEM, "out of memory");
        g->vocab = v;
        if (p->grammar_trigger && *p->grammar_trigger) {
            g->lazy = 1;
            g->trig_len = strlen(p->grammar_trigger);
            if (g->trig_len > KWK_GRAMMAR_TRIGGER_MAX)
                return kwk_err_set(err, KWK_EARG, "the grammar's trigger is longer than %d "
                                   "bytes", KWK_GRAMMAR_TRIGGER_MAX);
            if (!(g->trig_buf = kwk_malloc(g->trig_len + v->max_len)))
                return kwk_err_set(err, -ENOMEM, "out of memory");
            if ((rc = think_init(g, err)) < 0)
                return rc;
        }
        size_t nw = ((size_t)n_vocab + 31) / 32;
        /* the mask holds the vocabulary's words; a model's padded ids beyond it stay 0 */
        nw = KWK_MAX(nw, ((size_t)kwk_grammar_vocab_size(v) + 31) / 32);
        g->allowed = kwk_calloc(nw, sizeof(uint32_t));
        g->masked = kwk_malloc_aligned((size_t)n_vocab * sizeof(float));
        if (!g->allowed || !g->masked)
            return kwk_err_set(err, -ENOMEM, "out of memory");
    }
    return 0;
}

void kwk_gen_seq_free(struct kwk_gen_seq *g)
{
    kwk_sampler_free(g->sampler);
    kwk_detok_free(g->detok);
    kwk_free(g->seq);
    kwk_matcher_free(g->matcher);
    kwk_free(g->trig_buf);
    kwk_grammar_vocab_free(g->own_vocab);
    kwk_free(g->allowed);
    kwk_free_aligned(g->masked);
    g->matcher = NULL;
    g->own_vocab = NULL;
    g->allowed = NULL;
    g->masked = NULL;
    g->sampler = NULL;
    g->detok = NULL;
    g->seq = NULL;
}

int kwk_generate(kwk_decoder *d, const int32_t *prompt, int n_prompt,
                 const struct kwk_gen_params *p, struct kwk_gen_output *out, struct kwk_err *err)
{
    struct gen_call c = {.d = d};
    struct kwk_gen_seq *g = &c.g;
    int rc = KWK_EARG;
    if (!d || !out) {
        kwk_err_set(err, KWK_EARG, "generate: no decoder or output");
        return KWK_EARG;
    }
    if (p && p->prompt_logprobs) {
        rc = kwk_err_set(err, KWK_EUNSUPPORTED, "prompt_logprobs is the serving engine's "
                                                "(kwk_engine_submit)");
        goto out;
    }
    if ((rc = kwk_gen_seq_init(g, d->c->n_vocab, prompt, n_prompt, p, out, err)) < 0)
        goto out;
    if (p->draft == d) {
        rc = kwk_err_set(err, KWK_EARG, "the draft must be another decoder (it has its own "
                                        "KV cache)");
        goto out;
    }
    if (p->draft && p->draft->c->n_vocab != d->c->n_vocab) {
        rc = kwk_err_set(err, KWK_EARG, "draft vocabulary %d differs from the model's %d",
                         p->draft->c->n_vocab, d->c->n_vocab);
        goto out;
    }
    if (n_prompt >= d->max_len) {
        rc = kwk_err_set(err, KWK_ELIMIT, "prompt of %d tokens does not fit a cache of %d",
                         n_prompt, d->max_len);
        goto out;
    }
    c.rows = kwk_malloc_aligned((size_t)(MAX_SPEC + 1) * (size_t)d->c->n_vocab * sizeof(float));
    if (!c.rows) {
        rc = kwk_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    int keep = p->prompt_cache ? kwk_decoder_reuse_prefix(d, prompt, n_prompt) : 0;
    kwk_decoder_truncate(d, keep);
    out->prompt_reused = keep;
    rc = kwk_decoder_eval(d, prompt + keep, n_prompt - keep, NULL, KWK_LOGITS_LAST);
    if (rc < 0) {
        kwk_err_set(err, rc, "prompt: %s", kwk_status_str(rc));
        goto out;
    }
    if (p->max_new_tokens == 0) {
        out->finish_reason = KWK_FINISH_LENGTH;
        goto out;
    }
    int32_t pending;
    if ((rc = kwk_gen_seq_next(g, kwk_decoder_logits(d), &pending, err)) < 0)
        goto out;
    while (!g->done) {
        if (d->pos >= d->max_len) {
            out->finish_reason = KWK_FINISH_LENGTH;
            break;
        }
        if ((rc = step(&c, &pending, err)) < 0)
            goto out;
    }
out:
    kwk_gen_seq_free(g);
    kwk_free_aligned(c.rows);
    return rc < 0 ? rc : 0;
}
