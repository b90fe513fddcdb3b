/* bench_template.c - chat-template render time: a 20-turn conversation with tools (tool calls and
 * tool results included) through a real template, mean microseconds per render over many renders
 * (context JSON parsing included; the template is compiled once, as a server does). Prints;
 * asserts nothing. Single-threaded.
 * Usage: bench_template [template.jinja] [renders]
 * (default: ../shared/data/chat-templates/llamacpp/meta-llama-Llama-3.1-8B-Instruct.jinja) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "kwker.h"

static const char tools_json[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
    "\"Get the current weather in a city.\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"location\": {\"type\": \"string\", \"description\": \"City and "
    "country\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"]}}, "
    "\"required\": [\"location\"]}}}, {\"type\": \"function\", \"function\": {\"name\": "
    "\"search\", \"description\": \"Search the web.\", \"parameters\": {\"type\": \"object\", "
    "\"properties\": {\"query\": {\"type\": \"string\"}, \"max_results\": {\"type\": "
    "\"integer\"}}, \"required\": [\"query\"]}}}, {\"type\": \"function\", \"function\": "
    "{\"name\": \"calculator\", \"description\": \"Evaluate an arithmetic expression.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"expression\": {\"type\": "
    "\"string\"}}, \"required\": [\"expression\"]}}}]";

/* 20 turns: user, then assistant (every fourth turn calls a tool and gets its result). */
static char *make_context(void)
{
    struct {
        char *p;
        size_t n, cap;
    } b = {malloc(1 << 16), 0, 1 << 16};
    if (!b.p)
        return NULL;
#define PUT(...)                                                                                 \
    do {                                                                                         \
        int w = snprintf(b.p + b.n, b.cap - b.n, __VA_ARGS__);                                   \
        if (w < 0 || (size_t)w >= b.cap - b.n) {                                                 \
            free(b.p);                                                                           \
            return NULL;                                                                         \
        }                                                                                        \
        b.n += (size_t)w;                                                                        \
    } while (0)
    PUT("{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", "
        "\"add_generation_prompt\": true, \"date_string\": \"10 Jul 2025\", \"tools\": %s, "
        "\"messages\": [{\"role\": \"system\", \"content\": \"You are a helpful assistant "
        "with tools.\"}",
        tools_json);
    for (int t = 0; t < 20; t++) {
        PUT(", {\"role\": \"user\", \"content\": \"Question number %d: what is the weather "
            "like in city %d, and what should I wear? Please be specific.\"}", t, t);
        if (t % 4 == 1) {
            PUT(", {\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"call_%d\", \"type\": "
                "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": "
                "{\"location\": \"City %d\", \"unit\": \"celsius\"}}}]}", t, t);
            PUT(", {\"role\": \"tool\", \"tool_call_id\": \"call_%d\", \"name\": "
                "\"get_weather\", \"content\": \"{\\\"temperature\\\": %d, \\\"sky\\\": "
                "\\\"clear\\\"}\"}", t, 10 + t);
        }
        if (t < 19)
            PUT(", {\"role\": \"assistant\", \"content\": \"In city %d it is mild; a light "
                "jacket and comfortable shoes will do. Anything else?\"}", t);
    }
    PUT("]}");
#undef PUT
    return b.p;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1]
                                : "../shared/data/chat-templates/llamacpp/"
                                  "meta-llama-Llama-3.1-8B-Instruct.jinja";
    int renders = argc > 2 ? atoi(argv[2]) : 2000;
    char *src = NULL, *ctx = NULL, *out = NULL;
    size_t src_len, out_len = 0;
    struct kwk_err err;
    kwk_template *t = NULL;
    int rc = 1;
    if (renders < 1)
        renders = 1;
    if (kwk_read_file(path, 1 << 22, &src, &src_len, &err)) {
        fprintf(stderr, "bench_template: %s\n", err.msg);
        goto out;
    }
    if (!(ctx = make_context())) {
        fprintf(stderr, "bench_template: context too large\n");
        goto out;
    }
    double t0 = kwk_time_s();
    for (int i = 0; i < 100; i++) {
        kwk_template_free(t);
        if (!(t = kwk_template_new(src, src_len, NULL, &err))) {
            fprintf(stderr, "bench_template: %s\n", err.msg);
            goto out;
        }
    }
    double compile_us = (kwk_time_s() - t0) / 100 * 1e6;
    /* warm-up */
    for (int i = 0; i < 20; i++) {
        kwk_string_free(out);
        out = NULL;
        if (kwk_template_render(t, ctx, strlen(ctx), NULL, &out, &out_len, &err)) {
            fprintf(stderr, "bench_template: %s\n", err.msg);
            goto out;
        }
    }
    t0 = kwk_time_s();
    for (int i = 0; i < renders; i++) {
        kwk_string_free(out);
        out = NULL;
        if (kwk_template_render(t, ctx, strlen(ctx), NULL, &out, &out_len, &err)) {
            fprintf(stderr, "bench_template: %s\n", err.msg);
            goto out;
        }
    }
    double render_us = (kwk_time_s() - t0) / renders * 1e6;
    printf("template %s\n", path);
    printf("context: 20 turns with 3 tools (%zu bytes of JSON), output %zu bytes\n", strlen(ctx),
           out_len);
    printf("compile: %.1f us (mean of 100)\n", compile_us);
    printf("render:  %.1f us (mean of %d renders, JSON context parsing included)\n", render_us,
           renders);
    rc = 0;
out:
    kwk_string_free(out);
    kwk_template_free(t);
    free(ctx);
    kwk_free(src);
    return rc;
}
