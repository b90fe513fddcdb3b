/* safetensors.c - mapping and validating .safetensors files (8-byte header length, JSON header,
 * raw little-endian tensor data). Any thread; a file object is used by one thread while built. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"

/* Real headers are a few hundred KiB at most; a bigger claim is damage, not a model. */
#define ST_HEADER_MAX ((uint64_t)100 << 20)

struct st_span {
    size_t begin, end;
    int idx;
};

static int span_cmp(const void *a, const void *b)
{
    const struct st_span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : (x->end > y->end);
}

/* Known safetensors dtypes: 0 for the ones we run, 1 for ones we recognize but do not run. */
static int st_dtype(const char *s, int *dt)
{
    static const char *const other[] = {"I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64",
                                        "F64", "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4",
                                        "F6_E2M3", "F6_E3M2", "C64"};
    if (!strcmp(s, "F32"))
        *dt = KWK_DT_F32;
    else if (!strcmp(s, "F16"))
        *dt = KWK_DT_F16;
    else if (!strcmp(s, "BF16"))
        *dt = KWK_DT_BF16;
    else {
        for (size_t i = 0; i < KWK_ARRAY_LEN(other); i++)
            if (!strcmp(s, other[i]))
                return 1;
        return -1;
    }
    return 0;
}

/* A JSON integer in [0, max]. */
static int json_uint(const json_t *v, uint64_t max, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (uint64_t)json_integer_value(v) > max)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Fill t from one header entry; data is the start of the data section of n bytes. */
static int st_entry(struct kwk_tensor_ref *t, const char *name, const json_t *e,
                    const uint8_t *data, size_t n, const char *label, struct kwk_err *err)
{
    if (!json_is_object(e))
        return kwk_err_set(err, KWK_EFORMAT, "%s: tensor %s: header entry is not an object",
                           label, name);
    const json_t *jdt = json_object_get(e, "dtype");
    const json_t *jshape = json_object_get(e, "shape");
    const json_t *joff = json_object_get(e, "data_offsets");
    if (!json_is_string(jdt) || !json_is_array(jshape) || !json_is_array(joff) ||
        json_array_size(joff) != 2)
        return kwk_err_set(err, KWK_EFORMAT,
                           "%s: tensor %s: needs \"dtype\" (string), \"shape\" (array) and "
                           "\"data_offsets\" ([begin, end])", label, name);
    const char *dts = json_string_value(jdt);
    int k = st_dtype(dts, &t->dtype);
    if (k > 0)
        return 1; /* a type Kwker does not run (position_ids' I64): listed, never read */
    if (k < 0)
        return kwk_err_set(err, KWK_EFORMAT, "%s: tensor %s: unknown dtype \"%.32s\"", label,
                           name, dts);
    size_t nd = json_array_size(jshape);
    if (nd > KWK_MAX_DIMS)
        return kwk_err_set(err, KWK_EUNSUPPORTED, "%s: tensor %s has %zu dimensions (at most %d)",
                           label, name, nd, KWK_MAX_DIMS);
    t->n_dims = (int)nd;
    size_t count = 1;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (json_uint(json_array_get(jshape, i), INT64_MAX, &d))
            return kwk_err_set(err, KWK_EFORMAT,
                               "%s: tensor %s: shape[%zu] is not a non-negative integer", label,
                               name, i);
        t->shape[i] = (int64_t)d;
        if (d > SIZE_MAX || kwk_mul_size(count, (size_t)d, &count))
            return kwk_err_set(err, KWK_EFORMAT, "%s: tensor %s: shape too large", label, name);
    }
    uint64_t b, e2;
    if (json_uint(json_array_get(joff, 0), UINT64_MAX >> 1, &b) ||
        json_uint(json_array_get(joff, 1), UINT64_MAX >> 1, &e2) || b > e2)
        return kwk_err_set(err, KWK_EFORMAT,
                           "%s: tensor %s: data_offsets must be two integers begin <= end", label,
                           name);
    if (e2 > n)
        return kwk_err_set(err, KWK_EFORMAT,
                           "%s: tensor %s: data_offsets [%llu, %llu] past the end of the data "
                           "(%zu bytes; file truncated?)", label, name, (unsigned long long)b,
                           (unsigned long long)e2, n);
    size_t want;
    if (kwk_mul_size(count, kwk_dtype_block_bytes(t->dtype), &want))
        return kwk_err_set(err, KWK_EFORMAT, "%s: tensor %s: shape too large", label, name);
    if (want != e2 - b)
        return kwk_err_set(err, KWK_EFORMAT,
                           "%s: tensor %s: %llu bytes but shape and dtype %s need %zu", label,
                           name, (unsigned long long)(e2 - b), dts, want);
    t->data = data + b;
    t->nbytes = (size_t)(e2 - b);
    return 0;
}

static int st_check_overlap(const struct kwk_st_file *f, const uint8_t *data, const char *label,
                            struct kwk_err *err)
{
    int rc = 0;
    if (f->n_tensors < 2)
        return 0;
    struct st_span *sp = kwk_malloc(sizeof *sp * (size_t)f->n_tensors);
    if (!sp)
        return kwk_err_set(err, -ENOMEM, "%s: out of memory", label);
    for (int i = 0; i < f->n_tensors; i++) {
        sp[i].begin = (size_t)(f->tensors[i].data - data);
        sp[i].end = sp[i].begin + f->tensors[i].nbytes;
        sp[i].idx = i;
    }
    qsort(sp, (size_t)f->n_tensors, sizeof *sp, span_cmp);
    for (int i = 1; i < f->n_tensors; i++) {
        /* empty tensors occupy no bytes and cannot collide */
        if (sp[i].begin < sp[i - 1].end && sp[i].begin != sp[i].end) {
            rc = kwk_err_set(err, KWK_EFORMAT, "%s: tensors %s and %s overlap", label,
                             f->tensors[sp[i - 1].idx].name, f->tensors[sp[i].idx].name);
            break;
        }
    }
    kwk_free(sp);
    return rc;
}

/* Copy the tensor names into one buffer and fill the tensors from the header object. */
static int st_fill(struct kwk_st_file *f, json_t *root, const uint8_t *data, size_t n,
                   const char *label, struct kwk_err *err)
{
    size_t names_len = 0;
    int count = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__"))
            continue;
        names_len += strlen(key) + 1;
        count++;
    }
    f->tensors = kwk_calloc((size_t)count, sizeof *f->tensors);
    f->unrun = kwk_calloc((size_t)count, sizeof *f->unrun);
    f->names = kwk_malloc(names_len);
    if (!f->tensors || !f->unrun || !f->names)
        return kwk_err_set(err, -ENOMEM, "%s: out of memory", label);
    char *p = f->names;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__"))
            continue;
        struct kwk_tensor_ref *t = &f->tensors[f->n_tensors];
        size_t kl = strlen(key) + 1;
        memcpy(p, key, kl);
        t->name = p;
        p += kl;
        int rc = st_entry(t, t->name, val, data, n, label, err);
        if (rc < 0)
            return rc;
        if (rc > 0)
            f->unrun[f->n_unrun++] = t->name;
        else
            f->n_tensors++;
    }
    return st_check_overlap(f, data, label, err);
}

int kwk_st_parse(struct kwk_st_file *f, const uint8_t *buf, size_t size, const char *label,
                 struct kwk_err *err)
{
    int rc = 0;
    json_t *root = NULL;
    memset(f, 0, sizeof *f);
    if (!label)
        label = "<memory>";
    if (size < 8)
        return kwk_err_set_pos(err, KWK_EFORMAT, 0,
                               "%s: %zu bytes, too short for a safetensors file", label, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    if (hlen > size - 8)
        return kwk_err_set_pos(err, KWK_EFORMAT, 0,
                               "%s: header length %llu is past the end of the file (%zu bytes; "
                               "truncated or not safetensors)", label, (unsigned long long)hlen,
                               size);
    if (hlen > ST_HEADER_MAX)
        return kwk_err_set_pos(err, KWK_ELIMIT, 0, "%s: header of %llu bytes exceeds the %llu "
                               "byte limit", label, (unsigned long long)hlen,
                               (unsigned long long)ST_HEADER_MAX);
    json_error_t jerr;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        rc = kwk_err_set_pos(err, KWK_EFORMAT, 8 + jerr.position,
                             "%s: header JSON is invalid at byte %lld: %s", label,
                             (long long)(8 + jerr.position), jerr.text);
        goto out;
    }
    if (!json_is_object(root)) {
        rc = kwk_err_set_pos(err, KWK_EFORMAT, 8, "%s: header JSON is not an object", label);
        goto out;
    }
    rc = st_fill(f, root, buf + 8 + hlen, size - 8 - (size_t)hlen, label, err);
out:
    json_decref(root);
    if (rc) {
        kwk_free(f->tensors);
        kwk_free(f->unrun);
        kwk_free(f->names);
        f->tensors = NULL;
        f->unrun = NULL;
        f->names = NULL;
        f->n_tensors = 0;
        f->n_unrun = 0;
    }
    return rc;
}

int kwk_st_open(struct kwk_st_file *f, const char *path, struct kwk_err *err)
{
    struct kwk_map map;
    memset(f, 0, sizeof *f);
    int rc = kwk_map_file(&map, path, err);
    if (rc)
        return rc;
    rc = kwk_st_parse(f, map.data, map.size, path, err);
    if (rc)
        goto out_unmap;
    f->path = kwk_strdup(path);
    if (!f->path) {
        rc = kwk_err_set(err, -ENOMEM, "%s: out of memory", path);
        goto out_close;
    }
    f->map = map;
    return 0;
out_close:
    kwk_st_close(f);
out_unmap:
    kwk_unmap(&map);
    return rc;
}

void kwk_st_close(struct kwk_st_file *f)
{
    if (!f)
        return;
    kwk_unmap(&f->map);
    kwk_free(f->tensors);
    kwk_free(f->unrun);
    kwk_free(f->names);
    kwk_free(f->path);
    memset(f, 0, sizeof *f);
}
