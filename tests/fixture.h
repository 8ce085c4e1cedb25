/* fixture.h - reads the PyTorch reference fixtures in tests/fixtures/ (written by
 * tools/gen_fixtures.py and other generators using the same format).
 *
 * FORMAT (little-endian):
 *     8 bytes    magic "PDPFIX01"
 *     uint32     tensor count
 *     per tensor:
 *         uint32     name length, then the name's bytes (no terminating NUL)
 *         uint32     ndim
 *         int64      dims[ndim]
 *         float32    data[product of dims]
 *
 * USE
 *     fixture f;
 *     const fixture_tensor *x;
 *     FIXTURE_LOAD_OR_SKIP(&f, "linear.bin");      SKIPm with the path when missing
 *     x = fixture_find(&f, "x");                   NULL when absent
 *     ... x->data, x->ndim, x->shape, x->count ...
 *     fixture_free(&f);
 *
 * Files are looked up in $PDP_FIXTURE_DIR, default "tests/fixtures" (tests run from
 * the repository root). A corrupt file is a failure, not a skip. Little-endian hosts
 * only (x86-64, arm64), which is all we run on. */
#ifndef PDP_TEST_FIXTURE_H
#define PDP_TEST_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fixture_tensor {
    char name[64];
    int ndim;
    int64_t shape[8];
    int64_t count;
    float *data; /* points into the fixture's blob */
} fixture_tensor;

typedef struct fixture {
    char path[512];
    int count;
    fixture_tensor *t;
    unsigned char *blob;
} fixture;

enum { FIXTURE_OK = 0, FIXTURE_MISSING = 1, FIXTURE_CORRUPT = 2 };

static inline int fixture__read(const unsigned char **p, const unsigned char *end, void *dst,
                                size_t bytes)
{
    if ((size_t)(end - *p) < bytes) return 0;
    memcpy(dst, *p, bytes);
    *p += bytes;
    return 1;
}

static inline void fixture_free(fixture *f)
{
    free(f->t);
    free(f->blob);
    f->t = NULL;
    f->blob = NULL;
    f->count = 0;
}

/* FIXTURE_OK, FIXTURE_MISSING (no such file) or FIXTURE_CORRUPT. */
static inline int fixture_load(fixture *f, const char *file)
{
    const char *dir = getenv("PDP_FIXTURE_DIR");
    const unsigned char *p, *end;
    FILE *fp;
    long bytes;
    uint32_t n, i;
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s/%s", dir && *dir ? dir : "tests/fixtures", file);
    fp = fopen(f->path, "rb");
    if (!fp) return FIXTURE_MISSING;
    if (fseek(fp, 0, SEEK_END) != 0 || (bytes = ftell(fp)) < 12 || fseek(fp, 0, SEEK_SET) != 0 ||
        !(f->blob = (unsigned char *)malloc((size_t)bytes)) ||
        fread(f->blob, 1, (size_t)bytes, fp) != (size_t)bytes) {
        fclose(fp);
        fixture_free(f);
        return FIXTURE_CORRUPT;
    }
    fclose(fp);
    p = f->blob;
    end = f->blob + bytes;
    if (memcmp(p, "PDPFIX01", 8) != 0) goto corrupt;
    p += 8;
    if (!fixture__read(&p, end, &n, 4) || n > 4096) goto corrupt;
    f->t = (fixture_tensor *)calloc(n ? n : 1, sizeof *f->t);
    if (!f->t) goto corrupt;
    for (i = 0; i < n; i++) {
        fixture_tensor *t = &f->t[i];
        uint32_t len, ndim;
        int d;
        if (!fixture__read(&p, end, &len, 4) || len >= sizeof t->name ||
            !fixture__read(&p, end, t->name, len) || !fixture__read(&p, end, &ndim, 4) || ndim > 8)
            goto corrupt;
        t->ndim = (int)ndim;
        t->count = 1;
        for (d = 0; d < t->ndim; d++) {
            if (!fixture__read(&p, end, &t->shape[d], 8) || t->shape[d] < 0) goto corrupt;
            t->count *= t->shape[d];
        }
        if ((size_t)(end - p) < (size_t)t->count * 4) goto corrupt;
        t->data = (float *)(void *)p; /* 4-byte alignment is not guaranteed: copy below */
        p += t->count * 4;
    }
    if (p != end) goto corrupt;
    f->count = (int)n;
    /* Move every tensor's data to its own aligned block inside a new blob. */
    {
        size_t total = 0;
        unsigned char *aligned;
        for (i = 0; i < n; i++) total += (size_t)f->t[i].count * 4;
        aligned = (unsigned char *)malloc(total ? total : 1);
        if (!aligned) goto corrupt;
        total = 0;
        for (i = 0; i < n; i++) {
            memcpy(aligned + total, f->t[i].data, (size_t)f->t[i].count * 4);
            f->t[i].data = (float *)(void *)(aligned + total);
            total += (size_t)f->t[i].count * 4;
        }
        free(f->blob);
        f->blob = aligned;
    }
    return FIXTURE_OK;
corrupt:
    fixture_free(f);
    return FIXTURE_CORRUPT;
}

static inline const fixture_tensor *fixture_find(const fixture *f, const char *name)
{
    int i;
    for (i = 0; i < f->count; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

/* max |a - b| / max(max |b|, 1): the error relative to the reference's scale, so
   that tiny entries of a large tensor are not judged on their own. */
static inline double fixture_rel_err(const float *a, const float *b, int64_t n)
{
    double diff = 0.0, scale = 1.0;
    int64_t i;
    for (i = 0; i < n; i++) {
        double d = a[i] > b[i] ? (double)a[i] - b[i] : (double)b[i] - a[i];
        double m = b[i] < 0 ? -(double)b[i] : (double)b[i];
        if (d > diff || d != d) diff = d;
        if (m > scale) scale = m;
    }
    return diff / scale;
}

/* With pdp.h's implementation in this file: pdp_model_backward, with an input
   gradient for layer 0 too (the public call skips it; a pipeline stage asks for it
   through m->input_grad): d(loss)/dx into dx ([batch, input...]); parameter
   gradients accumulate as usual. Needs a forward before it, as backward does. */
#ifdef PDP__IMPLEMENTATION_INCLUDED
static inline pdp_status fixture_backward_with_dx(pdp_model *m, const float *dy, float *dx)
{
    pdp_tensor g;
    pdp_status st;
    if (!m->have_forward) return PDP_ERR_STATE;
    pdp_tensor_wrap((float *)dy, m->device, m->out_view.ndim, m->out_view.shape, &g);
    m->input_grad = dx; /* what a pipeline stage asks of backward */
    st = pdp_model_backward(m, &g);
    m->input_grad = NULL;
    return st;
}

/* *worst = the largest fixture_rel_err of m's tensors (a pipeline stage's, a TP rank's
   slices or a whole model's) against ref's, found by name: a TP slice against its cut of
   ref's full tensor (tp.c's runs; a whole tensor is one run). */
static inline pdp_status fixture_worst_by_name(const pdp_model *m, const pdp_model *ref,
                                               double *worst)
{
    float *want = (float *)malloc((size_t)m->param_count * sizeof(float) + 4);
    pdp_status st = want ? PDP_OK : PDP_ERR_OUT_OF_MEMORY;
    int i;
    *worst = 0.0;
    for (i = 0; st == PDP_OK && i < pdp_model_num_params(m); i++) {
        pdp_param mine, full;
        double e;
        pdp_model_param(m, i, &mine);
        if ((st = pdp_model_find_param(ref, mine.name, &full)) != PDP_OK ||
            (st = pdp__tp_runs(m, i, pdp_cpu(), full.value.data, want, false)) != PDP_OK)
            break;
        e = fixture_rel_err(m->param_block + mine.offset, want, mine.count);
        if (!(e <= *worst)) *worst = e;
    }
    free(want);
    return st;
}
#endif

/* In a TEST: load `file` into *f, skip the test when it is missing, fail when it is
   corrupt. */
#define FIXTURE_LOAD_OR_SKIP(f, file)                                                           \
    do {                                                                                        \
        int fixture_rc_ = fixture_load((f), (file));                                            \
        if (fixture_rc_ == FIXTURE_MISSING)                                                     \
            SKIPm("fixture missing (regenerate: /usr/bin/python3 tools/gen_fixtures.py, "       \
                  "tools/gpt_reference.py for gpt_*): " file);                                  \
        if (fixture_rc_ != FIXTURE_OK) FAILm("fixture is corrupt: " file);                      \
    } while (0)

#endif /* PDP_TEST_FIXTURE_H */
