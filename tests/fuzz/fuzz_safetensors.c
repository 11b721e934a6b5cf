/*  fuzz_safetensors.c — libFuzzer target for safetensors header parsing (formats/safetensors.c):
    the input is a .safetensors file. Refused with a reason, or every tensor it exposes lies
    inside the file and converts to f32 (the largest are skipped to bound the run).
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "safetensors.h"

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
    char path [128], err [512] = "";
    s_scratch_write ("model.safetensors", data, size, path, sizeof path);
    ls_st_t *st = ls_st_open (path, err, sizeof err);
    if (!st) {
        if (!err [0])
            s_die ("refused without a reason");
        return 0;
    }
    for (size_t i = 0; i < ls_st_count (st); i++) {
        const ls_st_tensor_t *t = ls_st_at (st, i);
        if (ls_st_find (st, t->name) != t)
            s_die ("a tensor is not found by its name");
        if (t->nbytes != t->numel * ls_dtype_size (t->dtype) || t->nbytes > size)
            s_die ("a tensor's size does not add up");
        if (t->numel > (1u << 16))
            continue;
        float *f = malloc ((t->numel + 1) * sizeof *f);
        if (!f)
            abort ();
        ls_st_tensor_to_f32 (t, f);
        free (f);
        int64_t shape [LS_ST_MAX_DIMS] = { 1, 2 };
        ls_st_tensor_check_shape (t, 2, shape, err, sizeof err);
    }
    ls_st_destroy (&st);
    return 0;
}
