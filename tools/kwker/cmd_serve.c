/* cmd_serve.c - kwker serve: options of the OpenAI-compatible HTTP server (tools/kwker/serve/).
 * Main thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "serve/serve.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kwker serve [--model M] [options]\n"
            "An OpenAI-compatible server: GET /v1/models, POST /v1/completions,\n"
            "POST /v1/chat/completions (stream true: server-sent events), POST /tokenize,\n"
            "POST /detokenize, GET /health, GET /metrics (Prometheus). One line per request\n"
            "on stderr. An embedding model (an encoder such as all-MiniLM-L6-v2) answers\n"
            "POST /v1/embeddings instead of the completions routes, and vLLM's POST /v1/score\n"
            "(also /score: cosine similarity); a reranker (a cross-encoder such as bge-reranker)\n"
            "POST /v1/rerank (also /rerank, /v2/rerank) and /v1/score as well; a classifier\n"
            "(*ForSequenceClassification) vLLM's POST /v1/classify (also /classify).\n"
            "  -m, --model M            .gguf file, model folder or Hugging Face id in the local\n"
            "                           cache (default: models/SmolLM2-135M-Instruct.Q4_1.gguf)\n"
            "  --served-model-name N    the model id clients name (default: the file's name)\n"
            "  --host H                 address to listen on (default 127.0.0.1)\n"
            "  --port P                 port (default 8000; 0: any free port, logged)\n"
            "  --api-key K              require 'Authorization: Bearer K' on /v1/* (default:\n"
            "                           $KWKER_API_KEY; none when both are unset)\n"
            "  --max-batch N            requests decoded together (default 8)\n"
            "  -c, --max-cache-len N    positions per request, prompt + reply (default\n"
            "                           min(model max, 4096))\n"
            "  -t, --threads N          compute threads (default: the cores)\n"
            "  --precision P            preserve | balanced | int8 | int4\n"
            CLI_QUANT_USAGE
            CLI_POOLING_USAGE
            "  --cache-dir D            packed-weight cache for balanced / int4 (default\n"
            "                           $KWKER_CACHE or ~/.cache/kwker/packs; off: none)\n"
            "  --max-queue N            requests waiting for a slot (an embedding model: for\n"
            "                           the encoder) before 503 (default 4096)\n"
            "  --timeout S              close a connection idle or stalled for S seconds\n"
            "                           (slow headers included; default 60)\n"
            "  --max-body BYTES         larger request bodies get 413 (default 1048576)\n"
            "  --max-header BYTES       per-connection memory for request line and headers;\n"
            "                           larger headers close the connection (default 32768)\n"
            "  --max-connections N      open connections (default: what the fd limit allows)\n"
            "  --shutdown-timeout S     on SIGTERM / SIGINT stop listening, let the requests in\n"
            "                           flight finish for up to S seconds, then stop (a second\n"
            "                           signal stops at once; default 30; 0: cancel them)\n"
            CLI_TEMPLATE_FILE_USAGE
            "  --tool-format F          how the model writes tool calls: hermes (<tool_call>:\n"
            "                           Qwen, Hermes), llama3 ({\"name\", \"parameters\"}),\n"
            "                           mistral_nemo, functionary, deepseek_r1, firefunction,\n"
            "                           command_r_plus or generic (a JSON reply described in the\n"
            "                           system prompt) (default: read off the chat template)\n"
            "  --reasoning-format F     auto or deepseek (default auto): a chat template that\n"
            "                           thinks (names <think>) has its replies' think block in\n"
            "                           reasoning_content, the rest in content; none: all in\n"
            "                           content\n"
            "  --quiet                  no per-request log lines\n");
}

static int parse_size(const char *s, size_t lo, size_t hi, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end || errno || s[0] == '-' || v < lo || v > hi)
        return -1;
    *out = (size_t)v;
    return 0;
}

/* One option with its value v; 1 when a is not an option of serve, -1 for a bad value. */
static int parse_opt(struct srv_opts *o, const char *a, const char *v)
{
    if (!strcmp(a, "-m") || !strcmp(a, "--model"))
        return o->model = v, 0;
    if (!strcmp(a, "--served-model-name"))
        return v[0] ? (o->model_name = v, 0) : -1;
    if (!strcmp(a, "--host"))
        return v[0] ? (o->host = v, 0) : -1;
    if (!strcmp(a, "--port"))
        return cli_parse_int(v, 0, 65535, &o->port);
    if (!strcmp(a, "--api-key"))
        return o->api_key = v, 0;
    if (!strcmp(a, "--max-batch"))
        return cli_parse_int(v, 1, 256, &o->engine.max_batch);
    if (!strcmp(a, "-c") || !strcmp(a, "--max-cache-len"))
        return cli_parse_int(v, 2, 1 << 24, &o->engine.max_cache_len);
    if (!strcmp(a, "-t") || !strcmp(a, "--threads"))
        return cli_parse_int(v, 1, 1024, &o->engine.n_threads);
    if (!strcmp(a, "--precision"))
        return (o->engine.precision = cli_parse_precision(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--cache-dir"))
        return o->engine.cache_dir = cli_cache_dir(v), 0;
    if (!strcmp(a, "--max-queue"))
        return cli_parse_int(v, 1, 1 << 24, &o->engine.max_queue);
    if (!strcmp(a, "--timeout"))
        return cli_parse_int(v, 1, 86400, &o->timeout_s);
    if (!strcmp(a, "--max-body"))
        return parse_size(v, 64, (size_t)1 << 30, &o->max_body);
    if (!strcmp(a, "--max-header"))
        return parse_size(v, 4096, (size_t)1 << 24, &o->max_header);
    if (!strcmp(a, "--max-connections"))
        return cli_parse_int(v, 1, 1000000, &o->max_connections);
    if (!strcmp(a, "--chat-template-file"))
        return v[0] ? (o->chat_template_file = v, 0) : -1;
    if (!strcmp(a, "--chat-template-kwargs"))
        return o->chat_template_kwargs = v, 0;
    if (!strcmp(a, "--tool-format"))
        return (o->tool_format = srv_tool_format_parse(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--reasoning-format"))
        return (o->reasoning_format = srv_reasoning_format_parse(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--pooling"))
        return (o->pooling = cli_parse_pooling(v)) < 0 ? -1 : 0;
    if (!strcmp(a, "--shutdown-timeout"))
        return cli_parse_int(v, 0, 86400, &o->shutdown_timeout_s);
    return 1;
}

int cmd_serve(int argc, char **argv)
{
    struct srv_opts o;
    memset(&o, 0, sizeof o);
    kwk_engine_params_init(&o.engine);
    cli_quant_init(&o.quant);
    o.engine.cache_dir = cli_cache_dir(NULL);
    o.host = "127.0.0.1";
    o.port = 8000;
    o.api_key = getenv("KWKER_API_KEY");
    o.timeout_s = 60;
    o.shutdown_timeout_s = 30; /* gunicorn's and Kubernetes' grace period */
    o.max_body = 1 << 20;
    o.max_header = 32 << 10;
    o.log_requests = 1;
    o.tool_format = -1;
    o.pooling = -1;
    o.normalize = -1;
    for (int i = 1; i < argc;) {
        const char *a = argv[i++];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--quiet")) {
            o.log_requests = 0;
            continue;
        }
        if (!strcmp(a, "--normalize") || !strcmp(a, "--no-normalize")) {
            o.normalize = !strcmp(a, "--normalize");
            continue;
        }
        int q = cli_quant_parse(&o.quant, a, i < argc ? argv[i] : NULL);
        if (q < 0) {
            fprintf(stderr, "kwker serve: bad or missing value for %s\n", a);
            return 2;
        }
        if (q > 0) {
            i += q - 1;
            continue;
        }
        const char *v = i < argc ? argv[i++] : NULL; /* every other option takes a value */
        int rc = parse_opt(&o, a, v ? v : "");
        if (rc == 1) {
            fprintf(stderr, "kwker serve: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (!v || rc < 0) {
            fprintf(stderr, "kwker serve: %s for %s\n", v ? "bad value" : "missing value", a);
            return 2;
        }
    }
    int rc = srv_run(&o);
    cli_quant_free(&o.quant);
    return rc;
}
