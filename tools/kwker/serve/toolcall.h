/* toolcall.h - what toolcall.c (formats, requests, grammars, the template's messages) and
 * toolcall_reply.c (replies read back into content and calls) share: each format's markers
 * and opening texts. Any thread. */
#ifndef KWK_SERVE_TOOLCALL_H
#define KWK_SERVE_TOOLCALL_H

#include <string.h>

#include "serve.h"

/* DeepSeek R1's markers (fullwidth bars U+FF5C, lower one-eighth blocks U+2581) */
/* clang-format off */
#define R1_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define R1_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define R1_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define R1_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define R1_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"
/* clang-format on */

#define PYTHON_TAG "<|python_tag|>"

/* The texts that open a format's call (the lazy grammar's trigger is the first; the others
 * also end the content while streaming), NULL-terminated; {NULL} for the generic formats. */
const char *const *srv_tool_format_openers(int format);

/* JSON's whitespace, which replies skip around their markers. */
static inline int srv_is_space(char c)
{
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

/* Bytes at the end of t[0, len) that begin the NUL-terminated marker s without being all of it
 * (a marker that may still be arriving, held back as stop strings are); 0 when none. */
static inline size_t srv_marker_tail(const char *t, size_t len, const char *s)
{
    size_t n = strlen(s);
    for (size_t k = n - 1; k > 0; k--)
        if (len >= k && !memcmp(t + len - k, s, k))
            return k;
    return 0;
}

/* Whether the format's reply is the generic one ({"tool_calls"} or {"response"}). */
static inline int srv_tool_format_generic(int format)
{
    return format == SRV_TOOLS_GENERIC || format == SRV_TOOLS_COMMAND_R;
}

#endif
