/* metrics.c - the server's counters and their Prometheus text exposition. Counters are atomics
 * bumped from the event-loop thread; rendering reads them from the same thread. */
#include <stdarg.h>
#include <stdio.h>

#include "serve.h"

void srv_metrics_status(struct srv_metrics *m, int http)
{
    if (http >= 0 && http < SRV_N_STATUS)
        atomic_fetch_add_explicit(&m->by_status[http], 1, memory_order_relaxed);
}

static void line(struct srv_buf *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void line(struct srv_buf *out, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0)
        srv_buf_add(out, buf, (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void metric(struct srv_buf *out, const char *name, const char *type, const char *help)
{
    line(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static uint64_t get(const _Atomic uint64_t *a)
{
    return atomic_load_explicit(a, memory_order_relaxed);
}

static void render_server(struct srv_buf *out, const struct srv_metrics *m, unsigned conns)
{
    metric(out, "kwker_http_requests_total", "counter", "HTTP requests finished, by status");
    for (int s = 100; s < SRV_N_STATUS; s++) { /* 0: no answer was sent */
        uint64_t n = get(&m->by_status[s]);
        if (n)
            line(out, "kwker_http_requests_total{status=\"%d\"} %llu\n", s,
                 (unsigned long long)n);
    }
    metric(out, "kwker_prompt_tokens_total", "counter", "prompt tokens of finished requests");
    line(out, "kwker_prompt_tokens_total %llu\n", (unsigned long long)get(&m->prompt_tokens));
    metric(out, "kwker_completion_tokens_total", "counter",
           "tokens generated for finished requests");
    line(out, "kwker_completion_tokens_total %llu\n",
         (unsigned long long)get(&m->completion_tokens));
    metric(out, "kwker_embeddings_requests_total", "counter",
           "/v1/embeddings requests answered with embeddings");
    line(out, "kwker_embeddings_requests_total %llu\n",
         (unsigned long long)get(&m->embed_requests));
    metric(out, "kwker_embeddings_inputs_total", "counter", "inputs embedded for them");
    line(out, "kwker_embeddings_inputs_total %llu\n", (unsigned long long)get(&m->embed_inputs));
    metric(out, "kwker_rerank_requests_total", "counter",
           "/v1/rerank requests answered with scores");
    line(out, "kwker_rerank_requests_total %llu\n", (unsigned long long)get(&m->rerank_requests));
    metric(out, "kwker_rerank_documents_total", "counter", "documents scored for them");
    line(out, "kwker_rerank_documents_total %llu\n",
         (unsigned long long)get(&m->rerank_documents));
    metric(out, "kwker_score_requests_total", "counter", "/score requests answered with scores");
    line(out, "kwker_score_requests_total %llu\n", (unsigned long long)get(&m->score_requests));
    metric(out, "kwker_score_pairs_total", "counter", "pairs scored for them");
    line(out, "kwker_score_pairs_total %llu\n", (unsigned long long)get(&m->score_pairs));
    metric(out, "kwker_classify_requests_total", "counter",
           "/classify requests answered with classes");
    line(out, "kwker_classify_requests_total %llu\n",
         (unsigned long long)get(&m->classify_requests));
    metric(out, "kwker_classify_inputs_total", "counter", "inputs classified for them");
    line(out, "kwker_classify_inputs_total %llu\n", (unsigned long long)get(&m->classify_inputs));
    metric(out, "kwker_streams_total", "counter", "streaming requests started");
    line(out, "kwker_streams_total %llu\n", (unsigned long long)get(&m->streams));
    metric(out, "kwker_client_aborts_total", "counter",
           "requests cancelled because the client went away");
    line(out, "kwker_client_aborts_total %llu\n", (unsigned long long)get(&m->client_aborts));
    metric(out, "kwker_http_connections", "gauge", "open HTTP connections");
    line(out, "kwker_http_connections %u\n", conns);
    metric(out, "kwker_http_requests_in_flight", "gauge",
           "requests handed to the engine and not yet answered in full");
    line(out, "kwker_http_requests_in_flight %d\n", atomic_load(&m->in_flight));
    metric(out, "kwker_server_draining", "gauge",
           "1 after SIGTERM / SIGINT: no new requests, the ones in flight finish");
    line(out, "kwker_server_draining %d\n", atomic_load(&m->draining));
    metric(out, "kwker_time_to_first_token_seconds", "summary",
           "submit to first token, as the server saw it");
    line(out, "kwker_time_to_first_token_seconds_sum %.6f\n",
         (double)get(&m->ttft_us_sum) * 1e-6);
    line(out, "kwker_time_to_first_token_seconds_count %llu\n",
         (unsigned long long)get(&m->ttft_count));
}

static void render_engine(struct srv_buf *out, const struct kwk_engine_stats *st)
{
    metric(out, "kwker_engine_requests_total", "counter", "engine requests by outcome");
    line(out, "kwker_engine_requests_total{outcome=\"submitted\"} %llu\n",
         (unsigned long long)st->submitted);
    line(out, "kwker_engine_requests_total{outcome=\"completed\"} %llu\n",
         (unsigned long long)st->completed);
    line(out, "kwker_engine_requests_total{outcome=\"canceled\"} %llu\n",
         (unsigned long long)st->canceled);
    line(out, "kwker_engine_requests_total{outcome=\"failed\"} %llu\n",
         (unsigned long long)st->failed);
    metric(out, "kwker_engine_queued", "gauge", "requests waiting for a slot");
    line(out, "kwker_engine_queued %d\n", st->queued);
    metric(out, "kwker_engine_running", "gauge", "requests holding a slot");
    line(out, "kwker_engine_running %d\n", st->running);
    metric(out, "kwker_engine_max_batch", "gauge", "slots");
    line(out, "kwker_engine_max_batch %d\n", st->max_batch);
    metric(out, "kwker_engine_prompt_tokens_total", "counter", "prompt tokens submitted");
    line(out, "kwker_engine_prompt_tokens_total %llu\n", (unsigned long long)st->prompt_tokens);
    metric(out, "kwker_engine_prompt_reused_total", "counter",
           "prompt tokens found in a slot's cache and not read again");
    line(out, "kwker_engine_prompt_reused_total %llu\n", (unsigned long long)st->prompt_reused);
    metric(out, "kwker_engine_generated_tokens_total", "counter", "tokens generated");
    line(out, "kwker_engine_generated_tokens_total %llu\n",
         (unsigned long long)st->generated_tokens);
    metric(out, "kwker_engine_steps_total", "counter", "batched forward passes");
    line(out, "kwker_engine_steps_total %llu\n", (unsigned long long)st->steps);
    metric(out, "kwker_engine_batch_rows_total", "counter", "rows summed over the steps");
    line(out, "kwker_engine_batch_rows_total %llu\n", (unsigned long long)st->batch_rows);
    metric(out, "kwker_engine_batch_size_mean", "gauge", "rows per step since start");
    line(out, "kwker_engine_batch_size_mean %.4f\n",
         st->steps ? (double)st->batch_rows / (double)st->steps : 0.0);
    metric(out, "kwker_engine_time_to_first_token_seconds", "summary",
           "submit to first token, engine side");
    line(out, "kwker_engine_time_to_first_token_seconds_sum %.6f\n", st->ttft_sum_s);
    line(out, "kwker_engine_time_to_first_token_seconds_count %llu\n",
         (unsigned long long)st->ttft_count);
    metric(out, "kwker_engine_busy_seconds_total", "counter", "time spent in steps");
    line(out, "kwker_engine_busy_seconds_total %.6f\n", st->busy_s);
    metric(out, "kwker_engine_tokens_per_second", "gauge",
           "generated tokens per busy second since start");
    line(out, "kwker_engine_tokens_per_second %.3f\n",
         st->busy_s > 0 ? (double)st->generated_tokens / st->busy_s : 0.0);
}

void srv_metrics_render(struct srv_buf *out, const struct srv_metrics *m,
                        const struct kwk_engine_stats *st, unsigned connections)
{
    render_server(out, m, connections);
    if (st)
        render_engine(out, st);
}

void srv_metrics_render_embed(struct srv_buf *out, uint64_t batches, uint64_t seqs)
{
    metric(out, "kwker_encoder_batches_total", "counter",
           "encoder calls, each one or more requests' inputs together");
    line(out, "kwker_encoder_batches_total %llu\n", (unsigned long long)batches);
    metric(out, "kwker_encoder_sequences_total", "counter",
           "sequences embedded or scored by the classification head");
    line(out, "kwker_encoder_sequences_total %llu\n", (unsigned long long)seqs);
    metric(out, "kwker_encoder_batch_size_mean", "gauge", "sequences per encoder call");
    line(out, "kwker_encoder_batch_size_mean %.4f\n",
         batches ? (double)seqs / (double)batches : 0.0);
}
