/* packed.c - repacking a model's matrices for a quantized precision. Owner thread. */
#include "runtime/packed.h"

struct kwk_packed *kwk_packed_new(const struct kwk_model *m, int precision, struct kwk_pool *pool,
                                  struct kwk_err *err)
{
    kwk_err_set(err, KWK_EUNSUPPORTED,
                "precision %s is not available yet: only preserve runs in this version",
                precision == KWK_PRECISION_BALANCED ? "balanced" : "int4");
    return NULL;
}

void kwk_packed_free(struct kwk_packed *p)
{
    (void)p;
}

const struct kwk_layer *kwk_packed_layers(const struct kwk_packed *p)
{
    (void)p;
    return NULL;
}

const struct kwk_mat *kwk_packed_lm_head(const struct kwk_packed *p)
{
    (void)p;
    return NULL;
}
