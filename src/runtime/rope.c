/* rope.c - rotary position embeddings, computed as transformers does in float32. Any thread. */
#include <math.h>

#include "runtime/runtime.h"

/* transformers: inv_freq = 1 / base ** (arange(0, dim, 2).float() / dim), all float32. */
static void default_freqs(int head_dim, float theta, float *inv)
{
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)head_dim;
        inv[i] = 1.0f / powf(theta, e);
    }
}

/* Llama 3.1 scaling: long wavelengths slowed by factor, short kept, the band between blended. */
static void llama3_freqs(const struct kwk_config *c, float *inv)
{
    const float pi = 3.14159265358979323846f;
    float factor = c->rope_factor;
    float lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor;
    float old_len = (float)c->rope_orig_max_position;
    float low_wavelen = old_len / lo, high_wavelen = old_len / hi;
    for (int i = 0; i < c->head_dim / 2; i++) {
        float f = inv[i];
        float wavelen = 2.0f * pi / f;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            float smooth = (old_len / wavelen - lo) / (hi - lo);
            scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
        }
        inv[i] = scaled;
    }
}

void kwk_rope_freqs(const struct kwk_config *c, float *inv)
{
    default_freqs(c->head_dim, c->rope_theta, inv);
    if (c->rope_type == KWK_ROPE_LLAMA3) {
        llama3_freqs(c, inv);
    } else if (c->rope_type == KWK_ROPE_LINEAR) {
        for (int i = 0; i < c->head_dim / 2; i++)
            inv[i] /= c->rope_factor;
    }
}

void kwk_rope_freqs_local(const struct kwk_config *c, float *inv)
{
    default_freqs(c->head_dim, c->rope_theta_local, inv);
}

void kwk_rope_table(int head_dim, const float *inv, int pos, float *cs)
{
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float angle = (float)pos * inv[i];
        cs[i] = cosf(angle);
        cs[half + i] = sinf(angle);
    }
}

void kwk_rope_rotate(float *x, int head_dim, const float *cs)
{
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * cs[half + i];
        x[i + half] = b * cs[i] + a * cs[half + i];
    }
}
