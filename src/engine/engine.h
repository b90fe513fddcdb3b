/* engine.h - the serving engine's internals: requests, KV slots, the queue, and the batched step.
 * engine.c holds the public API (any thread: submit, cancel, stats; the stepping thread: the
 * rest); step.c holds one scheduling step (stepping thread only). */
#ifndef KWK_ENGINE_H
#define KWK_ENGINE_H

#include <pthread.h>
#include <stdatomic.h>

#include "runtime/gen.h"
#include "runtime/runtime.h"

enum req_state {
    REQ_QUEUED,  /* waiting for a slot */
    REQ_PREFILL, /* in a slot, prompt being read */
    REQ_DECODE,  /* generating: `pending` is sampled and not yet in the cache */
    REQ_SHARE,   /* in a slot, waiting for the request in slot `wait_slot` to read the prompt
                  * prefix they share, which is then copied rather than read twice */
};

/* One request. Owned by the queue, then by its slot; freed on the stepping thread after its DONE
 * event. Fields below `cancel` are touched by the stepping thread only. */
struct kwk_req {
    uint64_t id;
    struct kwk_req *next;       /* queue link (under the engine's lock) */
    atomic_int cancel;          /* set by kwk_engine_cancel from any thread */
    kwk_event_fn fn;
    void *user;
    struct kwk_engine *e;

    /* deep copies of what submit was given */
    int32_t *prompt;
    int n_prompt;
    struct kwk_gen_params p;    /* pointers below point into this request's own copies */
    int32_t *eos_ids;
    int32_t *bias_ids;
    float *bias;
    char **stop;
    char *trigger;            /* p.grammar_trigger, copied */
    char *think_open;         /* p.think_open, copied */
    char *think_close;        /* p.think_close, copied */
    int32_t *preserved;       /* [p.n_preserved] p.preserved_ids, copied */

    int state;                  /* enum req_state */
    int slot;
    int n_read;                 /* prompt tokens in the slot's cache */
    int copy_src;               /* admission: slot whose first n_read positions are copied */
    int wait_slot;              /* REQ_SHARE: the slot whose request reads the shared prefix */
    uint64_t wait_id;           /* REQ_SHARE: that request's id */
    int wait_len;               /* REQ_SHARE: positions it shares with this prompt */
    int32_t pending;
    float *plp;                 /* p.prompt_logprobs: [n_prompt] each prompt token's logprob */
    int32_t *ptop_ids;          /* [n_prompt][p.top_logprobs] its alternatives */
    float *ptop_lps;
    struct kwk_gen_seq g;
    struct kwk_gen_output out;  /* tokens, logprobs, top arrays owned here */
    int seq_ready;              /* g was set up (kwk_gen_seq_free needed) */
    double t_submit, t_admit, t_first;
};

/* A KV slot: the token ids whose K/V it holds, kept after its request ends so that a later
 * request sharing the prefix reuses them. */
struct kwk_slot {
    int32_t *tokens;            /* [max_len] */
    int len;                    /* positions filled */
    struct kwk_req *req;        /* NULL when free */
    uint64_t last_used;         /* step count when last released: least recently used goes first */
};

struct kwk_engine {
    struct kwk_decoder *d;
    struct kwk_engine_params prm;
    int n_vocab;
    struct kwk_slot *slots;     /* [max_batch] */
    /* step scratch */
    int32_t *row_ids;           /* [n_batch] */
    int *row_req;               /* [n_batch] slot of the request the row belongs to */
    int *logit_rows;            /* [max_batch * (1 + MAX_SPEC)] rows whose logits are needed */
    float *logits;              /* [max_batch * (1 + MAX_SPEC)][n_vocab] */
    int spec_cap;               /* most rows with logits in a step */
    struct kwk_plan *plans;     /* [max_batch] */
    uint64_t step_tokens;       /* tokens generated in the current step */

    pthread_mutex_t mu;         /* guards the queue, next_id, stats and the thread flags */
    pthread_cond_t cv;          /* signalled on submit, cancel and stop */
    struct kwk_req *q_head, *q_tail;
    int n_queued;
    int n_running;              /* requests in slots (written by the stepping thread, under mu) */
    uint64_t next_id;
    struct kwk_engine_stats st;
    pthread_t thread;
    int thread_on, thread_stop;

    /* The token bytes grammar requests mask with, built at the first one for its tokenizer
     * (requests with another tokenizer build their own). */
    pthread_mutex_t vocab_mu;
    const kwk_tokenizer *vocab_tok;
    kwk_grammar_vocab *vocab;
};

/* Candidates checked for one sequence in one step at most. */
#define KWK_ENGINE_MAX_SPEC 8

/* Where a slot's rows and logits are in the current step. */
struct kwk_plan {
    int first_logit; /* index into logits, -1 when none */
    int n_cand;      /* decode: candidates after the pending token */
    int32_t cand[KWK_ENGINE_MAX_SPEC];
    int n_prompt;    /* prefill: prompt tokens read this step */
    int prompt_start; /* prefill: the first of them */
    int prompt_row;   /* prompt_logprobs: the batch row of the first of them, else -1 */
};

double kwk_engine_now(void);
/* Deliver DONE for r (status 0 or a negative code with msg), release its slot, free it. */
void kwk_engine_finish(struct kwk_engine *e, struct kwk_req *r, int status, const char *msg);
/* One step (kwk_engine_step's body); returns requests queued or running after it. */
int kwk_engine_run_step(struct kwk_engine *e);

#endif
