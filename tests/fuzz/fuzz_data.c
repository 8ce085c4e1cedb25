/* fuzz_data.c - libFuzzer harness for the file loaders of src/data.c: the IDX pair
   (pdp_dataset_load_idx, plain or gzipped, with or without max_samples) and the token
   dataset (pdp_token_dataset_load on a file, or on a directory of files).
   Input: byte 0 = mode (bits 0-1: 0/3 IDX, 1 token file, 2 token directory; bits 2-7 a
   parameter: max_samples / context), then parts separated by the 4 bytes "\xff\xfe\xfd\xfc"
   (IDX: the images file, then the labels file; directory: up to 6 files, the first part's
   name ending in ".dat" when bit 2 is set). */
#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];
static const uint8_t SEP[4] = {0xff, 0xfe, 0xfd, 0xfc};

static void put(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(p, 1, n, f) != n)) abort();
    fclose(f);
}

/* splits data at SEP into up to max parts */
static int split(const uint8_t *d, size_t n, const uint8_t **part, size_t *len, int max)
{
    int k = 0;
    size_t start = 0, i;
    for (i = 0; i + 4 <= n && k < max - 1; i++)
        if (memcmp(d + i, SEP, 4) == 0) {
            part[k] = d + start;
            len[k++] = i - start;
            start = i + 4;
            i += 3;
        }
    part[k] = d + start;
    len[k++] = n - start;
    return k;
}

static void must_say_why(pdp_status st)
{
    const char *e = pdp_last_error();
    if (st != PDP_OK && (!e || strncmp(e, "pdp_", 4) != 0)) {
        fprintf(stderr, "%s without a message naming the function: '%s'\n",
                pdp_status_name(st), e ? e : "(null)");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *part[6];
    size_t len[6];
    char a[300], b[300];
    int mode, param, n, i;
    pdp_status st;
    if (size < 1) return 0;
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/dev/shm/fuzz_data.%d", (int)getpid());
        mkdir(g_dir, 0700);
        snprintf(a, sizeof a, "%s/d", g_dir);
        mkdir(a, 0700);
    }
    mode = data[0] & 3;
    param = data[0] >> 2;
    n = split(data + 1, size - 1, part, len, mode == 2 ? 6 : 2);
    pdp_clear_error();
    if (mode == 0 || mode == 3) {
        pdp_dataset *ds = NULL;
        pdp_dataset_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.max_samples = mode == 3 ? param : 0;
        desc.flat = param & 1;
        snprintf(a, sizeof a, "%s/images", g_dir);
        snprintf(b, sizeof b, "%s/labels", g_dir);
        put(a, part[0], len[0]);
        put(b, n > 1 ? part[1] : (const uint8_t *)"", n > 1 ? len[1] : 0);
        st = pdp_dataset_load_idx(&ds, a, b, &desc);
        must_say_why(st);
        if (st == PDP_OK) {
            int64_t idx[2] = {0, ds->count - 1};
            float *x = (float *)malloc((size_t)(2 * ds->features) * sizeof(float));
            int32_t lab[2];
            if (!x) abort();
            st = pdp_dataset_gather(ds, idx, 2, x, lab);
            must_say_why(st);
            free(x);
        } else if (ds) {
            abort(); /* a failure hands nothing out */
        }
        pdp_dataset_free(ds);
    } else {
        pdp_token_dataset *ds = NULL;
        pdp_token_dataset_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.context = (param & 15) + 1;
        desc.max_tokens = (param & 16) ? (param & 15) * 7 : 0;
        desc.no_validation = (param & 32) != 0;
        if (mode == 1) {
            snprintf(a, sizeof a, "%s/text", g_dir);
            put(a, part[0], len[0]);
        } else {
            DIR *d;
            struct dirent *e;
            snprintf(a, sizeof a, "%s/d", g_dir);
            if ((d = opendir(a))) { /* empty it */
                while ((e = readdir(d)))
                    if (e->d_name[0] != '.') {
                        snprintf(b, sizeof b, "%s/%s", a, e->d_name);
                        unlink(b);
                    }
                closedir(d);
            }
            for (i = 0; i < n; i++) {
                snprintf(b, sizeof b, "%s/f%d%s", a, i, i == 0 && (param & 1) ? ".dat" : "");
                put(b, part[i], len[i]);
            }
        }
        st = pdp_token_dataset_load(&ds, a, &desc);
        must_say_why(st);
        if (st == PDP_OK) {
            int32_t x[64], y[64];
            int64_t w[2] = {0, ds->windows[PDP_SPLIT_TRAIN] - 1};
            pdp_rng r;
            volatile uint8_t sink = 0;
            int64_t k;
            pdp_rng_seed(&r, 1, 0);
            for (k = 0; k < ds->count; k++) sink ^= ds->tokens[k]; /* ASan reads them all */
            (void)sink;
            if (ds->context * 2 > 64) abort();
            st = pdp_token_dataset_batch(ds, PDP_SPLIT_TRAIN, w, 2, x, y);
            must_say_why(st);
            if (ds->windows[PDP_SPLIT_VAL]) {
                st = pdp_token_dataset_sample(ds, PDP_SPLIT_VAL, &r, 2, x, y);
                must_say_why(st);
            }
        } else if (ds) {
            abort();
        }
        pdp_token_dataset_free(ds);
    }
    return 0;
}
