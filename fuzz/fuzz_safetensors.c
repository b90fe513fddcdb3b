/* fuzz_safetensors.c - libFuzzer target: kwk_st_parse on arbitrary bytes, then reading every
 * tensor it accepted (all of its bytes must lie inside the input). */
#include <stdint.h>
#include <string.h>

#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1 << 20))
        return 0;
    struct kwk_st_file f;
    struct kwk_err err;
    if (kwk_st_parse(&f, data, size, "fuzz", &err) != 0)
        return 0;
    volatile uint8_t sink = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const struct kwk_tensor_ref *t = &f.tensors[i];
        if (t->nbytes) {
            sink ^= t->data[0];
            sink ^= t->data[t->nbytes - 1];
        }
        sink ^= (uint8_t)strlen(t->name);
    }
    (void)sink;
    kwk_st_close(&f);
    return 0;
}
