/* fuzz_template.c - libFuzzer target: compile arbitrary template text and render it with a
 * small step, depth, output and memory budget. Input: template bytes, optionally followed by a
 * NUL byte and a JSON context (else a fixed chat context with tools is used). The input size
 * modulo 4 picks trim/lstrip blocks and the dialect. */
#include <stdint.h>
#include <string.h>

#include "kwker.h"

#define FUZZ_MAX_INPUT (64 * 1024)

static const char default_ctx[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", "
    "\"content\": \"hi \\\"q\\\" \\u00e9\"}, {\"role\": \"assistant\", \"content\": null, "
    "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", "
    "\"arguments\": {\"x\": 1}}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": "
    "\"42\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"parts\"}]}], "
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"integer\"}}}}}], "
    "\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > FUZZ_MAX_INPUT)
        return 0;
    const char *src = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t src_len = nul ? (size_t)(nul - data) : size;
    const char *ctx = nul ? (const char *)nul + 1 : default_ctx;
    size_t ctx_len = nul ? size - src_len - 1 : sizeof default_ctx - 1;
    unsigned mode = (unsigned)(size & 3);

    struct kwk_template_opts o;
    kwk_template_opts_init(&o);
    o.trim_blocks = o.lstrip_blocks = !(mode & 1);
    o.dialect = (mode & 2) ? KWK_TEMPLATE_HFJS : KWK_TEMPLATE_JINJA2;
    struct kwk_err err;
    kwk_template *t = kwk_template_new(src, src_len, &o, &err);
    if (!t)
        return 0;
    struct kwk_render_opts ro;
    kwk_render_opts_init(&ro);
    ro.max_steps = 200000;
    ro.max_depth = 40;
    ro.max_output = 1 << 20;
    ro.max_memory = 32 << 20;
    ro.now = 1752148800;
    ro.have_now = 1;
    char *out = NULL;
    size_t n = 0;
    if (kwk_template_render(t, ctx, ctx_len, &ro, &out, &n, &err) == 0 && n && out[n - 1] == 1)
        err.code ^= 1; /* touch the output */
    kwk_string_free(out);
    kwk_template_free(t);
    return 0;
}
