/* fuzz_gzip.c - libFuzzer harness for the gzip/DEFLATE decoder (src/inflate.c) and the IDX
   parser behind it (src/data.c). Byte 0 picks the mode: bit 0 = a prefix decode through
   pdp__idx_enough (as pdp_dataset_load_idx with max_samples does), bit 1 = ndim 3 or 1,
   bits 2..7 = keep; the rest is the gzip file. The output is then parsed as IDX. */
#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *out = NULL;
    size_t out_len = 0;
    pdp_status st;
    pdp__idx_prefix q;
    int mode;
    if (size < 1) return 0;
    mode = data[0];
    q.ndim = (mode & 2) ? 3 : 1;
    q.keep = (mode >> 2) + 1;
    data++;
    size--;
    st = pdp__gunzip(data, size, &out, &out_len, (mode & 1) ? pdp__idx_enough : NULL, &q,
                     "fuzz", "mem.gz");
    if (st == PDP_OK) {
        uint64_t dims[3];
        const uint8_t *payload;
        if (!out) __builtin_trap();
        /* touch every byte so ASan checks the length claimed */
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < out_len; i++) sink ^= out[i];
        (void)sink;
        pdp_clear_error();
        (void)pdp__idx_parse(out, out_len, q.ndim, (mode & 1) ? q.keep : 0, dims, &payload,
                             "fuzz", "mem");
    } else {
        const char *e = pdp_last_error();
        if (out || !e || !*e) __builtin_trap(); /* a failure must say why, and own nothing */
    }
    pdp__dealloc(out);
    return 0;
}
