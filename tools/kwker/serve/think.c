/* think.c - a thinking model's reply (DeepSeek R1 distills, Qwen3, QwQ, SmolLM3) split into
 * OpenAI's "reasoning_content" (the inside of its <think> ... </think> block) and "content"
 * (the rest), as llama.cpp's server does under --reasoning-format deepseek: whole, and while it
 * streams (how much of each field is settled). Also whether a template thinks and whether a
 * rendered prompt left the block open. Pure functions over the caller's text: any thread. */
#include <string.h>

#include "toolcall.h"

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"

static size_t think_skip_ws(const char *t, size_t at, size_t end)
{
    while (at < end && srv_is_space(t[at]))
        at++;
    return at;
}

/* Whether t[at, len) is a proper beginning of s (the reply may still write all of s). */
static int tag_prefix(const char *t, size_t at, size_t len, const char *s)
{
    size_t n = strlen(s);
    return len - at < n && !memcmp(t + at, s, len - at);
}

int srv_think_template(const char *template_src)
{
    /* the templates of thinking models name their tags (R1's and Qwen3's strip an earlier
     * turn's block at '</think>'; QwQ's and R1's open it in the generation prompt) */
    return template_src && (strstr(template_src, THINK_OPEN) || strstr(template_src, THINK_CLOSE));
}

int srv_think_prompt_open(const char *prompt, size_t len)
{
    /* the generation prompt ends with "<think>\n" (R1, QwQ); Qwen3's enable_thinking=false
     * closes it again ("<think>\n\n</think>\n\n"). Only the prompt's very end counts: a user's
     * message that quotes "<think>" earlier must not put the reply in reasoning */
    size_t n = strlen(THINK_OPEN);
    while (len > 0 && srv_is_space(prompt[len - 1]))
        len--;
    return len >= n && !memcmp(prompt + len - n, THINK_OPEN, n);
}

void srv_think_split(const char *text, size_t len, int open, int final, struct srv_think *out)
{
    size_t at = think_skip_ws(text, 0, len), start, end;
    memset(out, 0, sizeof *out);
    out->content = len; /* no content settled yet */
    /* undecided: only whitespace, or a "<think>" still arriving */
    if (!final && (at == len || tag_prefix(text, at, len, THINK_OPEN)))
        return;
    if (len - at >= strlen(THINK_OPEN) && !memcmp(text + at, THINK_OPEN, strlen(THINK_OPEN)))
        start = at + strlen(THINK_OPEN);
    else if (open)
        start = 0; /* the prompt opened the block: the reply starts inside it */
    else {
        out->content = 0; /* no think block: all of it is content, as it came */
        return;
    }
    out->opened = 1;
    const char *close = memmem(text + start, len - start, THINK_CLOSE, strlen(THINK_CLOSE));
    if (close) {
        end = (size_t)(close - text);
        out->content = think_skip_ws(text, end + strlen(THINK_CLOSE), len);
        out->closed = 1;
    } else { /* reasoning to the end (cut by max_tokens), but a "</think>" still arriving */
        end = final ? len : len - srv_marker_tail(text, len, THINK_CLOSE);
    }
    /* llama.cpp's string_strip: no whitespace on either side (a streamed reply holds back its
     * trailing whitespace, which more reasoning may follow) */
    if (end < start)
        end = start;
    start = think_skip_ws(text, start, end);
    while (end > start && srv_is_space(text[end - 1]))
        end--;
    out->reasoning = start;
    out->reasoning_len = end - start;
}

void srv_think_reply(const struct srv_req *q, const char *text, size_t len,
                     struct srv_tool_reply *out)
{
    struct srv_think th;
    out->content = text;
    out->content_len = len;
    out->reasoning = NULL;
    out->reasoning_len = 0;
    if (!q->think)
        return;
    srv_think_split(text, len, q->think == SRV_THINK_OPEN, 1, &th);
    out->content = text + th.content;
    out->content_len = len - th.content;
    if (th.reasoning_len) { /* an empty block gives no field (llama.cpp's) */
        out->reasoning = text + th.reasoning;
        out->reasoning_len = th.reasoning_len;
    }
}

/* What of [begin, end) is new past *sent: into *p / *n, *sent moved to end. */
static void span_next(size_t *sent, const char *text, size_t begin, size_t end, const char **p,
                      size_t *n)
{
    size_t from = *sent > begin ? *sent : begin;
    *p = text + from;
    *n = 0;
    if (end > from) { /* moved only by what is sent: content undecided at the text's end
                       * may still begin before it */
        *n = end - from;
        *sent = end;
    }
}

void srv_reply_stream_next(struct srv_reply_stream *st, const struct srv_req *q, const char *text,
                           size_t len, const struct srv_tool_reply *done, struct srv_delta *d)
{
    memset(d, 0, sizeof *d);
    if (done) { /* the reply read whole: the rest of each field */
        if (done->reasoning)
            span_next(&st->reasoning_sent, text, (size_t)(done->reasoning - text),
                      (size_t)(done->reasoning - text) + done->reasoning_len, &d->reasoning,
                      &d->reasoning_len);
        if (done->own && done->content == done->own) {
            /* the generic format's "response", own text: nothing of it was sent before */
            d->content = done->content;
            d->content_len = done->content_len;
            return;
        }
        size_t c = (size_t)(done->content - text);
        span_next(&st->content_sent, text, c, c + done->content_len, &d->content, &d->content_len);
        return;
    }
    struct srv_think th = {.content = 0};
    if (q->think) {
        srv_think_split(text, len, q->think == SRV_THINK_OPEN, 0, &th);
        span_next(&st->reasoning_sent, text, th.reasoning, th.reasoning + th.reasoning_len,
                  &d->reasoning, &d->reasoning_len);
    }
    /* with tools, only what is surely not a call's beginning */
    size_t upto = q->tools ? th.content + srv_tools_sendable(q->tool_format, text + th.content,
                                                             len - th.content)
                           : len;
    span_next(&st->content_sent, text, th.content, upto, &d->content, &d->content_len);
}

int srv_think_preserved(const kwk_tokenizer *tok, int32_t *ids, int cap)
{
    static const char *const tags[] = {THINK_OPEN, THINK_CLOSE, NULL};
    return srv_special_tokens(tok, tags, ids, cap);
}
