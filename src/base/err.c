/* err.c - filling struct kwk_err and naming status codes. Any thread. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/base.h"

static int err_vset(struct kwk_err *err, int code, int64_t pos, const char *fmt, va_list ap)
{
    if (!err)
        return code;
    err->code = code;
    err->pos = pos;
    err->line = 0;
    err->col = 0;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return code;
}

int kwk_err_set(struct kwk_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(err, code, -1, fmt, ap);
    va_end(ap);
    return code;
}

int kwk_err_set_pos(struct kwk_err *err, int code, int64_t pos, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    err_vset(err, code, pos, fmt, ap);
    va_end(ap);
    return code;
}

void kwk_err_clear(struct kwk_err *err)
{
    if (err)
        memset(err, 0, sizeof *err);
}

const char *kwk_status_str(int code)
{
    switch (code) {
    case KWK_OK: return "ok";
    case KWK_EFORMAT: return "malformed input";
    case KWK_EUNSUPPORTED: return "unsupported";
    case KWK_ELIMIT: return "limit exceeded";
    case KWK_EARG: return "invalid argument";
    case KWK_ERANGE: return "out of range";
    case KWK_ESYNTAX: return "syntax error";
    case KWK_ERUNTIME: return "runtime error";
    case KWK_ENOTFOUND: return "not found";
    case KWK_ECANCELED: return "canceled";
    default: break;
    }
    return code < 0 && code > -4096 ? strerror(-code) : "unknown error";
}
