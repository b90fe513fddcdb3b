/* gguf.c - mapping and validating GGUF v2/v3 files (llama.cpp's format): metadata key/values,
 * tensor infos, and the aligned data section. Every length read from the file is checked
 * against the bytes left before use. Any thread; one file object per thread while built. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_KEY 65535
#define GGUF_MAX_NAME 4096

/* A cursor over the file with the error destination. */
struct rd {
    const uint8_t *buf;
    size_t size, pos;
    const char *label;
    struct kwk_err *err;
};

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int rd_need(struct rd *r, uint64_t n, const char *what)
{
    if (n > r->size - r->pos)
        return kwk_err_set_pos(r->err, KWK_EFORMAT, (int64_t)r->pos,
                               "%s: truncated: %s needs %llu bytes at offset %zu but %zu remain",
                               r->label, what, (unsigned long long)n, r->pos, r->size - r->pos);
    return 0;
}

static int rd_uint(struct rd *r, int n, uint64_t *v, const char *what)
{
    int rc = rd_need(r, (uint64_t)n, what);
    if (rc)
        return rc;
    *v = le(r->buf + r->pos, n);
    r->pos += (size_t)n;
    return 0;
}

/* A length-prefixed string; the bytes stay in the file. */
static int rd_str(struct rd *r, uint64_t max, const uint8_t **s, size_t *n, const char *what)
{
    uint64_t len;
    int rc = rd_uint(r, 8, &len, what);
    if (rc)
        return rc;
    if (len > max)
        return kwk_err_set_pos(r->err, KWK_EFORMAT, (int64_t)r->pos - 8,
                               "%s: %s of %llu bytes is longer than %llu", r->label, what,
                               (unsigned long long)len, (unsigned long long)max);
    if ((rc = rd_need(r, len, what)))
        return rc;
    *s = r->buf + r->pos;
    *n = (size_t)len;
    r->pos += (size_t)len;
    return 0;
}

/* Bytes of one scalar of a GGUF type; 0 for strings, arrays and unknown types. */
static size_t scalar_size(uint32_t t)
{
    static const uint8_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < sizeof sz ? sz[t] : 0;
}

static int type_known(uint32_t t)
{
    return t <= KWK_GGUF_FLOAT64;
}

/* Skip a value of type t (not an array) and check it lies in the file. */
static int skip_scalar(struct rd *r, uint32_t t, const char *key)
{
    if (t == KWK_GGUF_STRING) {
        const uint8_t *s;
        size_t n;
        return rd_str(r, UINT64_MAX, &s, &n, key);
    }
    int rc = rd_need(r, scalar_size(t), key);
    if (rc == 0)
        r->pos += scalar_size(t);
    return rc;
}

static int read_value(struct rd *r, struct kwk_gguf_kv *kv)
{
    uint64_t t, at, len;
    int rc = rd_uint(r, 4, &t, kv->key);
    if (rc)
        return rc;
    if (!type_known((uint32_t)t) || t > UINT32_MAX)
        return kwk_err_set_pos(r->err, KWK_EFORMAT, (int64_t)r->pos - 4,
                               "%s: key %s has unknown value type %llu", r->label, kv->key,
                               (unsigned long long)t);
    kv->type = (int)t;
    if (t != KWK_GGUF_ARRAY) {
        kv->val = r->buf + r->pos;
        size_t start = r->pos;
        rc = skip_scalar(r, (uint32_t)t, kv->key);
        kv->val_bytes = r->pos - start;
        return rc;
    }
    if ((rc = rd_uint(r, 4, &at, kv->key)) || (rc = rd_uint(r, 8, &len, kv->key)))
        return rc;
    if (at == KWK_GGUF_ARRAY)
        return kwk_err_set_pos(r->err, KWK_EUNSUPPORTED, (int64_t)r->pos - 12,
                               "%s: key %s is an array of arrays (not supported)", r->label,
                               kv->key);
    if (!type_known((uint32_t)at) || at > UINT32_MAX)
        return kwk_err_set_pos(r->err, KWK_EFORMAT, (int64_t)r->pos - 12,
                               "%s: key %s: array of unknown type %llu", r->label, kv->key,
                               (unsigned long long)at);
    kv->arr_type = (int)at;
    kv->arr_len = len;
    kv->val = r->buf + r->pos;
    size_t start = r->pos;
    if (at == KWK_GGUF_STRING) {
        /* every string costs at least its 8-byte length: bound the loop before running it */
        if (len > (r->size - r->pos) / 8)
            return kwk_err_set_pos(r->err, KWK_EFORMAT, (int64_t)r->pos,
                                   "%s: key %s: %llu strings cannot fit in the file", r->label,
                                   kv->key, (unsigned long long)len);
        for (uint64_t i = 0; i < len; i++)
            if ((rc = skip_scalar(r, KWK_GGUF_STRING, kv->key)))
                return rc;
    } else {
        uint64_t es = scalar_size((uint32_t)at);
        if (len > (r->size - r->pos) / es)
            return kwk_err_set_pos(r->err, KWK_EFORMAT, (int64_t)r->pos,
                                   "%s: key %s: array of %llu items runs past the end of the file",
                                   r->label, kv->key, (unsigned long long)len);
        r->pos += (size_t)(len * es);
    }
    kv->val_bytes = r->pos - start;
    return 0;
}

/* ---- string storage: keys and names are copied NUL-terminated into one growing buffer ------*/

struct sbuf {
    char *p;
    size_t n, cap;
};

static int sb_add(struct sbuf *b, const uint8_t *s, size_t n, size_t *off)
{
    size_t need;
    if (kwk_add_size(b->n, n + 1, &need))
        return -ENOMEM;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < need)
            cap *= 2;
        char *p = kwk_realloc(b->p, cap);
        if (!p)
            return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->p[b->n + n] = '\0';
    *off = b->n;
    b->n = need;
    return 0;
}

/* ---- ggml tensor types -------------------------------------------------------------------- */

static int ggml_dtype(uint32_t t)
{
    switch (t) {
    case 0: return KWK_DT_F32;
    case 1: return KWK_DT_F16;
    case 2: return KWK_DT_Q4_0;
    case 3: return KWK_DT_Q4_1;
    case 6: return KWK_DT_Q5_0;
    case 7: return KWK_DT_Q5_1;
    case 8: return KWK_DT_Q8_0;
    case 12: return KWK_DT_Q4_K;
    case 13: return KWK_DT_Q5_K;
    case 14: return KWK_DT_Q6_K;
    case 30: return KWK_DT_BF16;
    default: return -1;
    }
}

static const char *ggml_type_name(uint32_t t)
{
    static const char *const names[] = {
        [9] = "Q8_1", [10] = "Q2_K", [11] = "Q3_K", [15] = "Q8_K", [16] = "IQ2_XXS",
        [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S",
        [22] = "IQ2_S", [23] = "IQ4_XS", [24] = "I8", [25] = "I16", [26] = "I32", [27] = "I64",
        [28] = "F64", [29] = "IQ1_M", [34] = "TQ1_0", [35] = "TQ2_0", [39] = "MXFP4"};
    const char *n = t < KWK_ARRAY_LEN(names) ? names[t] : NULL;
    return n ? n : "unknown";
}

static int read_tensor_info(struct rd *r, struct kwk_tensor_ref *t, uint64_t *offset,
                            struct sbuf *sb, size_t *name_off)
{
    const uint8_t *s;
    size_t n;
    uint64_t nd, ne[KWK_MAX_DIMS], type;
    int rc = rd_str(r, GGUF_MAX_NAME, &s, &n, "tensor name");
    if (rc)
        return rc;
    if ((rc = sb_add(sb, s, n, name_off)))
        return kwk_err_set(r->err, rc, "%s: out of memory", r->label);
    const char *name = sb->p + *name_off;
    if ((rc = rd_uint(r, 4, &nd, name)))
        return rc;
    if (nd < 1 || nd > KWK_MAX_DIMS)
        return kwk_err_set_pos(r->err, KWK_EFORMAT, (int64_t)r->pos - 4,
                               "%s: tensor %s has %llu dimensions (1..%d allowed)", r->label, name,
                               (unsigned long long)nd, KWK_MAX_DIMS);
    for (uint64_t i = 0; i < nd; i++) {
        if ((rc = rd_uint(r, 8, &ne[i], name)))
            return rc;
        if (ne[i] == 0 || ne[i] > INT64_MAX)
            return kwk_err_set_pos(r->err, KWK_EFORMAT, (int64_t)r->pos - 8,
                                   "%s: tensor %s: dimension %llu is %llu", r->label, name,
                                   (unsigned long long)i, (unsigned long long)ne[i]);
    }
    if ((rc = rd_uint(r, 4, &type, name)) || (rc = rd_uint(r, 8, offset, name)))
        return rc;
    t->dtype = ggml_dtype((uint32_t)type);
    if (t->dtype < 0 || type > UINT32_MAX)
        return kwk_err_set_pos(r->err, KWK_EUNSUPPORTED, (int64_t)r->pos - 12,
                               "%s: tensor %s has ggml type %llu (%s), which Kwker does not "
                               "support (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, "
                               "Q5_K, Q6_K)", r->label, name, (unsigned long long)type,
                               ggml_type_name((uint32_t)type));
    t->n_dims = (int)nd;
    for (int i = 0; i < t->n_dims; i++)
        t->shape[i] = (int64_t)ne[t->n_dims - 1 - i];
    return 0;
}

struct span {
    size_t begin, end;
    int idx;
};

static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : (x->end > y->end);
}

/* Size each tensor, place it in the data section, and check no two share bytes. */
static int place_tensors(struct kwk_gguf *g, struct rd *r, const uint64_t *offsets)
{
    if (g->n_tensors == 0)
        return 0;
    size_t data = (r->pos + g->alignment - 1) / g->alignment * g->alignment;
    if (data < r->pos || data > r->size)
        return kwk_err_set_pos(r->err, KWK_EFORMAT, (int64_t)r->size,
                               "%s: truncated: the data section would start at %zu, past the end "
                               "(%zu bytes)", r->label, data, r->size);
    size_t avail = r->size - data;
    struct span *sp = kwk_malloc(sizeof *sp * (size_t)g->n_tensors);
    if (!sp)
        return kwk_err_set(r->err, -ENOMEM, "%s: out of memory", r->label);
    int rc = 0;
    for (int i = 0; i < g->n_tensors && !rc; i++) {
        struct kwk_tensor_ref *t = &g->tensors[i];
        int64_t cols = t->shape[t->n_dims - 1];
        size_t rows = 1, nbytes, rb = kwk_dtype_row_bytes(t->dtype, cols);
        for (int d = 0; d < t->n_dims - 1; d++)
            if (kwk_mul_size(rows, (size_t)t->shape[d], &rows))
                rb = 0;
        if (rb == 0 || kwk_mul_size(rb, rows, &nbytes)) {
            rc = kwk_err_set(r->err, KWK_EFORMAT, "%s: tensor %s: %lld columns of %s (block %d) "
                             "or its size is invalid", r->label, t->name, (long long)cols,
                             kwk_dtype_name(t->dtype), kwk_dtype_block(t->dtype));
        } else if (offsets[i] % g->alignment != 0) {
            rc = kwk_err_set(r->err, KWK_EFORMAT, "%s: tensor %s: offset %llu is not a multiple "
                             "of the alignment %zu", r->label, t->name,
                             (unsigned long long)offsets[i], g->alignment);
        } else if (offsets[i] > avail || nbytes > avail - offsets[i]) {
            rc = kwk_err_set(r->err, KWK_EFORMAT, "%s: tensor %s: %zu bytes at data offset %llu "
                             "run past the end of the file (%zu bytes of data; truncated?)",
                             r->label, t->name, nbytes, (unsigned long long)offsets[i], avail);
        } else {
            t->data = r->buf + data + offsets[i];
            t->nbytes = nbytes;
            sp[i].begin = (size_t)offsets[i];
            sp[i].end = sp[i].begin + nbytes;
            sp[i].idx = i;
        }
    }
    if (!rc) {
        qsort(sp, (size_t)g->n_tensors, sizeof *sp, span_cmp);
        for (int i = 1; i < g->n_tensors && !rc; i++)
            if (sp[i].begin < sp[i - 1].end)
                rc = kwk_err_set(r->err, KWK_EFORMAT, "%s: tensors %s and %s overlap", r->label,
                                 g->tensors[sp[i - 1].idx].name, g->tensors[sp[i].idx].name);
    }
    kwk_free(sp);
    return rc;
}

static int read_alignment(struct kwk_gguf *g, struct rd *r)
{
    int64_t a;
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int rc = kwk_gguf_get_i64(g, "general.alignment", &a);
    if (rc == KWK_ENOTFOUND)
        return 0;
    if (rc || a <= 0 || a > (1 << 20) || (a & (a - 1)) != 0)
        return kwk_err_set(r->err, KWK_EFORMAT, "%s: general.alignment must be a power of two "
                           "up to 1 MiB", r->label);
    g->alignment = (size_t)a;
    return 0;
}

static int read_header(struct kwk_gguf *g, struct rd *r, uint64_t *n_tensors)
{
    uint64_t magic, version, n_kv;
    int rc;
    if (r->size < 4 || memcmp(r->buf, "GGUF", 4) != 0)
        return kwk_err_set_pos(r->err, KWK_EFORMAT, 0, "%s: not a GGUF file (no \"GGUF\" magic)",
                               r->label);
    if ((rc = rd_uint(r, 4, &magic, "magic")) || (rc = rd_uint(r, 4, &version, "version")))
        return rc;
    if (version == 1)
        return kwk_err_set_pos(r->err, KWK_EUNSUPPORTED, 4, "%s: GGUF version 1 is not "
                               "supported (only 2 and 3; convert it again with llama.cpp)",
                               r->label);
    if (version != 2 && version != 3)
        return kwk_err_set_pos(r->err, KWK_EUNSUPPORTED, 4, "%s: GGUF version %llu is not "
                               "supported (only 2 and 3%s)", r->label,
                               (unsigned long long)version,
                               (version & 0xffff) == 0 ? "; a big-endian file?" : "");
    g->version = (uint32_t)version;
    if ((rc = rd_uint(r, 8, n_tensors, "tensor count")) ||
        (rc = rd_uint(r, 8, &n_kv, "key/value count")))
        return rc;
    /* a key/value takes at least 13 bytes, a tensor info 32: bound the counts by the file */
    size_t left = r->size - r->pos;
    if (n_kv > left / 13 || *n_tensors > left / 32 || n_kv * 13 + *n_tensors * 32 > left ||
        *n_tensors > INT32_MAX)
        return kwk_err_set_pos(r->err, KWK_EFORMAT, 8, "%s: %llu tensors and %llu keys cannot "
                               "fit in %zu bytes (truncated or corrupt)", r->label,
                               (unsigned long long)*n_tensors, (unsigned long long)n_kv, r->size);
    g->n_kv = (int64_t)n_kv;
    return 0;
}

static int read_kvs(struct kwk_gguf *g, struct rd *r, struct sbuf *sb, size_t *key_off)
{
    for (int64_t i = 0; i < g->n_kv; i++) {
        const uint8_t *s;
        size_t n;
        int rc = rd_str(r, GGUF_MAX_KEY, &s, &n, "key");
        if (rc)
            return rc;
        if ((rc = sb_add(sb, s, n, &key_off[i])))
            return kwk_err_set(r->err, rc, "%s: out of memory", r->label);
        /* the buffer may move while growing: point at it only for this entry's messages */
        g->kv[i].key = sb->p + key_off[i];
        if ((rc = read_value(r, &g->kv[i])))
            return rc;
    }
    return 0;
}

int kwk_gguf_parse(struct kwk_gguf *g, const uint8_t *buf, size_t size, const char *label,
                   struct kwk_err *err)
{
    struct rd r = {.buf = buf, .size = size, .pos = 0, .label = label ? label : "<memory>",
                   .err = err};
    struct sbuf sb = {0};
    size_t *key_off = NULL, *name_off = NULL;
    uint64_t *offsets = NULL, n_tensors = 0;
    memset(g, 0, sizeof *g);
    int rc = read_header(g, &r, &n_tensors);
    if (rc)
        goto out;
    g->kv = kwk_calloc((size_t)g->n_kv, sizeof *g->kv);
    key_off = kwk_calloc((size_t)g->n_kv, sizeof *key_off);
    g->tensors = kwk_calloc((size_t)n_tensors, sizeof *g->tensors);
    name_off = kwk_calloc((size_t)n_tensors, sizeof *name_off);
    offsets = kwk_calloc((size_t)n_tensors, sizeof *offsets);
    if (!g->kv || !key_off || !g->tensors || !name_off || !offsets) {
        rc = kwk_err_set(err, -ENOMEM, "%s: out of memory", r.label);
        goto out;
    }
    if ((rc = read_kvs(g, &r, &sb, key_off)))
        goto out;
    for (int64_t i = 0; i < g->n_kv; i++)
        g->kv[i].key = sb.p + key_off[i];
    if ((rc = read_alignment(g, &r)))
        goto out;
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((rc = read_tensor_info(&r, &g->tensors[i], &offsets[i], &sb, &name_off[i])))
            goto out;
        g->n_tensors++;
    }
    g->strings = sb.p;
    sb.p = NULL;
    for (int i = 0; i < g->n_tensors; i++)
        g->tensors[i].name = g->strings + name_off[i];
    for (int64_t i = 0; i < g->n_kv; i++)
        g->kv[i].key = g->strings + key_off[i];
    rc = place_tensors(g, &r, offsets);
out:
    kwk_free(sb.p);
    kwk_free(key_off);
    kwk_free(name_off);
    kwk_free(offsets);
    if (rc)
        kwk_gguf_close(g);
    return rc;
}

int kwk_gguf_open(struct kwk_gguf *g, const char *path, struct kwk_err *err)
{
    struct kwk_map map;
    memset(g, 0, sizeof *g);
    int rc = kwk_map_file(&map, path, err);
    if (rc)
        return rc;
    if ((rc = kwk_gguf_parse(g, map.data, map.size, path, err)))
        goto out_unmap;
    if (!(g->path = kwk_strdup(path))) {
        rc = kwk_err_set(err, -ENOMEM, "%s: out of memory", path);
        kwk_gguf_close(g);
        goto out_unmap;
    }
    g->map = map;
    return 0;
out_unmap:
    kwk_unmap(&map);
    return rc;
}

void kwk_gguf_close(struct kwk_gguf *g)
{
    if (!g)
        return;
    kwk_unmap(&g->map);
    kwk_free(g->kv);
    kwk_free(g->tensors);
    kwk_free(g->strings);
    kwk_free(g->path);
    memset(g, 0, sizeof *g);
}

/* ---- metadata getters ----------------------------------------------------------------------*/

const struct kwk_gguf_kv *kwk_gguf_find(const struct kwk_gguf *g, const char *key)
{
    for (int64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key && !strcmp(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

/* A scalar integer or float of type t at p, as int64 (ok=0) or double. */
static int scalar_i64(int t, const uint8_t *p, int64_t *out)
{
    uint64_t u;
    switch (t) {
    case KWK_GGUF_UINT8: *out = p[0]; return 0;
    case KWK_GGUF_INT8: *out = (int8_t)p[0]; return 0;
    case KWK_GGUF_UINT16: *out = (int64_t)le(p, 2); return 0;
    case KWK_GGUF_INT16: *out = (int16_t)le(p, 2); return 0;
    case KWK_GGUF_UINT32: *out = (int64_t)le(p, 4); return 0;
    case KWK_GGUF_INT32: *out = (int32_t)(uint32_t)le(p, 4); return 0;
    case KWK_GGUF_INT64: *out = (int64_t)le(p, 8); return 0;
    case KWK_GGUF_UINT64:
        u = le(p, 8);
        if (u > INT64_MAX)
            return KWK_EFORMAT;
        *out = (int64_t)u;
        return 0;
    default: return KWK_EFORMAT;
    }
}

static int scalar_f64(int t, const uint8_t *p, double *out)
{
    union { uint32_t u; float f; } f32;
    union { uint64_t u; double d; } f64;
    int64_t i;
    switch (t) {
    case KWK_GGUF_FLOAT32: f32.u = (uint32_t)le(p, 4); *out = f32.f; return 0;
    case KWK_GGUF_FLOAT64: f64.u = le(p, 8); *out = f64.d; return 0;
    default:
        if (scalar_i64(t, p, &i))
            return KWK_EFORMAT;
        *out = (double)i;
        return 0;
    }
}

int kwk_gguf_get_i64(const struct kwk_gguf *g, const char *key, int64_t *out)
{
    const struct kwk_gguf_kv *kv = kwk_gguf_find(g, key);
    return kv ? scalar_i64(kv->type, kv->val, out) : KWK_ENOTFOUND;
}

int kwk_gguf_get_f64(const struct kwk_gguf *g, const char *key, double *out)
{
    const struct kwk_gguf_kv *kv = kwk_gguf_find(g, key);
    return kv ? scalar_f64(kv->type, kv->val, out) : KWK_ENOTFOUND;
}

int kwk_gguf_get_bool(const struct kwk_gguf *g, const char *key, int *out)
{
    const struct kwk_gguf_kv *kv = kwk_gguf_find(g, key);
    if (!kv)
        return KWK_ENOTFOUND;
    if (kv->type != KWK_GGUF_BOOL)
        return KWK_EFORMAT;
    *out = kv->val[0] != 0;
    return 0;
}

int kwk_gguf_get_str(const struct kwk_gguf *g, const char *key, const char **s, size_t *n)
{
    const struct kwk_gguf_kv *kv = kwk_gguf_find(g, key);
    if (!kv)
        return KWK_ENOTFOUND;
    if (kv->type != KWK_GGUF_STRING)
        return KWK_EFORMAT;
    *n = (size_t)le(kv->val, 8);
    *s = (const char *)kv->val + 8;
    return 0;
}

int kwk_gguf_arr_strings(const struct kwk_gguf_kv *kv, const char **ptrs, size_t *lens)
{
    if (kv->type != KWK_GGUF_ARRAY || kv->arr_type != KWK_GGUF_STRING)
        return KWK_EFORMAT;
    /* the parser checked every length against the file; val_bytes re-bounds the walk */
    size_t pos = 0;
    for (uint64_t i = 0; i < kv->arr_len; i++) {
        if (kv->val_bytes - pos < 8)
            return KWK_EFORMAT;
        uint64_t n = le(kv->val + pos, 8);
        pos += 8;
        if (n > kv->val_bytes - pos)
            return KWK_EFORMAT;
        ptrs[i] = (const char *)kv->val + pos;
        lens[i] = (size_t)n;
        pos += (size_t)n;
    }
    return 0;
}

static int arr_item(const struct kwk_gguf_kv *kv, uint64_t i, const uint8_t **p)
{
    size_t es = scalar_size((uint32_t)kv->arr_type);
    if (kv->type != KWK_GGUF_ARRAY || es == 0)
        return KWK_EFORMAT;
    if (i >= kv->arr_len)
        return KWK_ERANGE;
    *p = kv->val + i * es;
    return 0;
}

int kwk_gguf_arr_i64(const struct kwk_gguf_kv *kv, uint64_t i, int64_t *out)
{
    const uint8_t *p;
    int rc = arr_item(kv, i, &p);
    return rc ? rc : scalar_i64(kv->arr_type, p, out);
}

int kwk_gguf_arr_f64(const struct kwk_gguf_kv *kv, uint64_t i, double *out)
{
    const uint8_t *p;
    int rc = arr_item(kv, i, &p);
    return rc ? rc : scalar_f64(kv->arr_type, p, out);
}
