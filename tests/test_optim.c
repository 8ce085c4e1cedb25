/* test_optim: SGD, Adam and AdamW against a naive double-precision reference
   written here from the PyTorch documentation's pseudo-code, against PyTorch
   itself (tests/fixtures/optim_*.bin from tools/gen_optim_fixtures.py: training
   runs, and the optimizer alone at PyTorch's default and other decimal
   hyper-parameters, state included), and gradient clipping, the schedule, desc
   validation and allocation counting; optimizers holding state for a range of the
   block (ZeRO) against the full one; create under NULL arguments and failing
   allocations (every k). */

#define _POSIX_C_SOURCE 200809L /* before the first system header (pdp.h needs POSIX) */
#include <stdio.h>
#include <stdlib.h>

static long test_allocs;
static long test_fail_at; /* > 0: the allocation counted test_fail_at returns NULL */
static void *test_malloc(size_t bytes)
{
    test_allocs++;
    if (test_allocs == test_fail_at) return NULL;
    return malloc(bytes);
}
#define PDP_MALLOC(bytes) test_malloc(bytes)
#define PDP_FREE(ptr) free(ptr)
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "fixture.h"

#include <math.h>
#include <string.h>

/* ---- helpers ---- */

static const char *status_name(int s) { return pdp_status_name((pdp_status)s); }
static const char *kind_name(int k) { return pdp_optim_kind_name((pdp_optim_kind)k); }

/* 17 -> 33 -> 7 MLP: 832 parameters in 4 tensors. */
static pdp_model *small_model(void)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 17;
    md.seed = 7;
    if (pdp_model_create(&m, &md) != PDP_OK || pdp_model_add_linear(m, 33) != PDP_OK ||
        pdp_model_add_relu(m) != PDP_OK || pdp_model_add_linear(m, 7) != PDP_OK) {
        pdp_model_free(m);
        return NULL;
    }
    return m;
}

static void fill_normal(float *x, int64_t n, pdp_rng *r, float scale)
{
    int64_t i;
    for (i = 0; i < n; i++) x[i] = scale * pdp_rng_normal(r);
}

/* |got - want| <= 1e-5 |want| + abs_tol; returns the index of the first miss or -1. */
static int64_t first_mismatch(const float *got, const double *want, int64_t n, double abs_tol)
{
    int64_t i;
    for (i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= 1e-5 * fabs(want[i]) + abs_tol)) return i;
    return -1;
}

/* ---- naive reference (double precision, PyTorch's documented algorithms) ---- */

typedef struct ref_state {
    double *p, *buf, *m, *v;
    int64_t n, t;
} ref_state;

static void ref_sgd(ref_state *s, const float *g, const pdp_optim_desc *d)
{
    int64_t i;
    for (i = 0; i < s->n; i++) {
        double gt = (double)g[i];
        if (d->weight_decay != 0.0f) gt += (double)d->weight_decay * s->p[i];
        if (d->momentum != 0.0f) {
            if (s->t == 0) s->buf[i] = gt;
            else s->buf[i] = (double)d->momentum * s->buf[i] + (1.0 - (double)d->dampening) * gt;
            if (d->nesterov) gt = gt + (double)d->momentum * s->buf[i];
            else gt = s->buf[i];
        }
        s->p[i] -= (double)d->lr * gt;
    }
    s->t++;
}

static void ref_adam(ref_state *s, const float *g, const pdp_optim_desc *d)
{
    double b1 = d->beta1, b2 = d->beta2, lr = d->lr, wd = d->weight_decay, eps = d->eps;
    int64_t i;
    s->t++;
    for (i = 0; i < s->n; i++) {
        double gt = (double)g[i], mhat, vhat;
        if (d->kind == PDP_OPTIM_ADAMW) s->p[i] *= 1.0 - lr * wd;
        else gt += wd * s->p[i];
        s->m[i] = b1 * s->m[i] + (1.0 - b1) * gt;
        s->v[i] = b2 * s->v[i] + (1.0 - b2) * gt * gt;
        mhat = s->m[i] / (1.0 - pow(b1, (double)s->t));
        vhat = s->v[i] / (1.0 - pow(b2, (double)s->t));
        s->p[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}

/* Runs `steps` updates of desc on the small model with fresh random gradients
   each step, against the reference; fails naming the step and element. */
static enum greatest_test_res check_against_reference(const pdp_optim_desc *desc, int steps)
{
    pdp_model *m = small_model();
    pdp_optim *o = NULL;
    pdp_tensor params, grads;
    ref_state s;
    pdp_rng r;
    pdp_optim_desc resolved; /* defaults filled in: checked by optim_desc_defaults */
    int64_t i, n, bad;
    int step;
    static char msg[160];
    ASSERT(m != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, desc), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(m, &params, &grads), status_name);
    resolved = pdp_optim_get_desc(o);
    n = params.count;
    memset(&s, 0, sizeof s);
    s.n = n;
    s.p = (double *)calloc((size_t)n, sizeof(double));
    s.buf = (double *)calloc((size_t)n, sizeof(double));
    s.m = (double *)calloc((size_t)n, sizeof(double));
    s.v = (double *)calloc((size_t)n, sizeof(double));
    ASSERT(s.p && s.buf && s.m && s.v);
    pdp_rng_seed(&r, 42, 1);
    fill_normal(params.data, n, &r, 0.5f);
    for (i = 0; i < n; i++) s.p[i] = params.data[i];
    bad = -1;
    for (step = 0; step < steps && bad < 0; step++) {
        fill_normal(grads.data, n, &r, step == 2 ? 1e-3f : 1.0f); /* one step of tiny grads */
        if (desc->kind == PDP_OPTIM_SGD) ref_sgd(&s, grads.data, &resolved);
        else ref_adam(&s, grads.data, &resolved);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), status_name);
        bad = first_mismatch(params.data, s.p, n, 1e-6);
    }
    if (bad >= 0)
        snprintf(msg, sizeof msg, "step %d, element %lld: got %.9g, reference %.9g", step - 1,
                 (long long)bad, (double)params.data[bad], s.p[bad]);
    free(s.p);
    free(s.buf);
    free(s.m);
    free(s.v);
    ASSERTm(msg, bad < 0);
    ASSERT_EQ(steps, (int)pdp_optim_steps(o));
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

/* ---- optimizers against the reference ---- */

TEST optim_sgd_matches_reference_all_options(void)
{
    static const float moms[] = {0.0f, 0.9f}, damps[] = {0.0f, 0.3f}, wds[] = {0.0f, 0.01f};
    int a, b, c, nest;
    for (a = 0; a < 2; a++)
        for (b = 0; b < 2; b++)
            for (c = 0; c < 2; c++)
                for (nest = 0; nest < 2; nest++) {
                    pdp_optim_desc d;
                    enum greatest_test_res res;
                    if (nest && (moms[a] == 0.0f || damps[b] != 0.0f)) continue;
                    if (moms[a] == 0.0f && damps[b] != 0.0f) continue;
                    memset(&d, 0, sizeof d);
                    d.kind = PDP_OPTIM_SGD;
                    d.lr = 0.05f;
                    d.momentum = moms[a];
                    d.dampening = damps[b];
                    d.weight_decay = wds[c];
                    d.nesterov = nest != 0;
                    res = check_against_reference(&d, 6);
                    if (res != GREATEST_TEST_RES_PASS) {
                        fprintf(stderr,
                                "  (momentum %g dampening %g weight_decay %g nesterov %d)\n",
                                (double)d.momentum, (double)d.dampening, (double)d.weight_decay,
                                nest);
                        return res;
                    }
                }
    PASS();
}

TEST optim_adam_matches_reference(void)
{
    static const float wds[] = {0.0f, 0.05f};
    int c;
    for (c = 0; c < 2; c++) {
        pdp_optim_desc d;
        memset(&d, 0, sizeof d);
        d.kind = PDP_OPTIM_ADAM;
        d.lr = 0.01f;
        d.weight_decay = wds[c];
        CHECK_CALL(check_against_reference(&d, 6));
    }
    PASS();
}

TEST optim_adamw_matches_reference(void)
{
    static const float wds[] = {0.0f, 0.1f};
    int c;
    for (c = 0; c < 2; c++) {
        pdp_optim_desc d;
        memset(&d, 0, sizeof d);
        d.kind = PDP_OPTIM_ADAMW;
        d.lr = 0.01f;
        d.beta1 = 0.8f;
        d.beta2 = 0.99f;
        d.eps = 1e-6f;
        d.weight_decay = wds[c];
        CHECK_CALL(check_against_reference(&d, 6));
    }
    PASS();
}

/* The element updates of math.h by themselves, one known value each. */
TEST optim_element_helpers_known_values(void)
{
    float buf = 0.0f, mm = 0.0f, vv = 0.0f, p;
    /* SGD, first step with momentum: buf = g + wd p = 1 + 0.5 * 2 = 2; nesterov d = 2 + 0.5 * 2 */
    p = pdp__sgd_momentum_update(2.0f, 1.0f, &buf, 0.25f, 0.5f, 1.0f, 0.5f, 1, 1);
    ASSERT_IN_RANGE(2.0f - 0.25f * 3.0f, p, 0.0);
    ASSERT_IN_RANGE(2.0f, buf, 0.0);
    /* second step, dampening 0.5: buf = 0.5 * 2 + 0.5 * (1 + 0.5 * 1.25) = 1.8125 */
    p = pdp__sgd_momentum_update(p, 1.0f, &buf, 0.25f, 0.5f, 0.5f, 0.5f, 0, 0);
    ASSERT_IN_RANGE(1.8125, buf, 1e-7);
    ASSERT_IN_RANGE(1.25 - 0.25 * 1.8125, p, 1e-7);
    ASSERT_IN_RANGE(2.0 - 0.5 * (3.0 + 0.25 * 2.0), pdp__sgd_update(2.0f, 3.0f, 0.5f, 0.25f), 0.0);
    /* Adam step 1: m = 0.1 g, v = 0.001 g^2, update = lr * sign(g) (eps 0) */
    p = pdp__adam_update(1.0f, -4.0f, &mm, &vv, 0.9f, 0.1f, 0.999f, 0.001f, 0.5f / 0.1f,
                         sqrtf(0.001f), 0.0f, 0.0f, 1.0f);
    ASSERT_IN_RANGE(1.5, p, 1e-6);
    ASSERT_IN_RANGE(-0.4, mm, 1e-7);
    ASSERT_IN_RANGE(0.016, vv, 1e-8);
    PASS();
}

/* ---- step: threads, allocation, state ---- */

/* The update is element-wise: 1 or 2 threads give the same bits on a block big
   enough to be split. */
TEST optim_step_bits_independent_of_threads(void)
{
    pdp_model_desc md;
    pdp_model *a = NULL, *b = NULL;
    pdp_optim *oa = NULL, *ob = NULL;
    pdp_optim_desc d;
    pdp_tensor pa, ga, pb, gb;
    pdp_rng r;
    int step;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 300;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&a, &md), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(a, 300), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&b, &md), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(b, 300), status_name);
    memset(&d, 0, sizeof d);
    d.kind = PDP_OPTIM_ADAMW;
    d.weight_decay = 0.01f;
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oa, a, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&ob, b, &d), status_name);
    pdp_model_flat(a, &pa, &ga);
    pdp_model_flat(b, &pb, &gb);
    ASSERT_MEM_EQ(pa.data, pb.data, (size_t)pa.count * 4);
    pdp_rng_seed(&r, 3, 0);
    for (step = 0; step < 3; step++) {
        fill_normal(ga.data, ga.count, &r, 1.0f);
        memcpy(gb.data, ga.data, (size_t)ga.count * 4);
        ASSERT_ENUM_EQ(PDP_OK, pdp_set_num_threads(1), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oa), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_set_num_threads(2), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(ob), status_name);
    }
    pdp_set_num_threads(1);
    ASSERT_MEM_EQ(pa.data, pb.data, (size_t)pa.count * 4);
    pdp_optim_free(oa);
    pdp_optim_free(ob);
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

/* ZeRO's seam: optimizers holding state for three uneven ranges that tile the
   block, each stepping its range (as three ranks would), give the bits of one
   full optimizer, parameters and state; a lone range optimizer leaves every
   element outside its range alone. Large enough for two threads per range. */
static enum greatest_test_res check_range_equals_full(const pdp_optim_desc *d)
{
    pdp_model_desc md;
    pdp_model *a = NULL, *b = NULL, *c = NULL;
    pdp_optim *full = NULL, *part[3] = {NULL, NULL, NULL}, *lone = NULL;
    pdp_tensor pa, ga, pb, gb, pc, gc;
    pdp_rng r;
    int64_t cut[4], lone_lo, lone_hi, i;
    float *before;
    int step, q, k;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 300;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&a, &md), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(a, 300), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&b, &md), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(b, 300), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&c, &md), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(c, 300), status_name);
    cut[0] = 0;
    cut[1] = 1001; /* not a multiple of 16: the blocked loops' tails move */
    cut[2] = 70013;
    cut[3] = a->param_count;
    lone_lo = 90000 - 77777;
    lone_hi = 90000;
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&full, a, d), status_name);
    for (q = 0; q < 3; q++)
        ASSERT_ENUM_EQ(PDP_OK, pdp__optim_create_range(&part[q], b, d, cut[q], cut[q + 1], "t"),
                       status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp__optim_create_range(&lone, c, d, lone_lo, lone_hi, "t"),
                   status_name);
    pdp_model_flat(a, &pa, &ga);
    pdp_model_flat(b, &pb, &gb);
    pdp_model_flat(c, &pc, &gc);
    before = (float *)malloc((size_t)pc.count * 4);
    memcpy(before, pc.data, (size_t)pc.count * 4);
    pdp_rng_seed(&r, 5, 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_set_num_threads(2), status_name);
    for (step = 0; step < 4; step++) {
        fill_normal(ga.data, ga.count, &r, 1.0f);
        memcpy(gb.data, ga.data, (size_t)ga.count * 4);
        memcpy(gc.data, ga.data, (size_t)ga.count * 4);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(full), status_name);
        for (q = 0; q < 3; q++) ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(part[q]), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(lone), status_name);
    }
    pdp_set_num_threads(1);
    ASSERT_MEM_EQ(pa.data, pb.data, (size_t)pa.count * 4);
    for (q = 0; q < 3; q++) {
        ASSERT_EQ(4, (int)pdp_optim_steps(part[q]));
        ASSERT_EQ(full->nstate, part[q]->nstate);
        for (k = 0; k < full->nstate; k++)
            ASSERT_MEM_EQ(full->state[k] + cut[q], part[q]->state[k],
                          (size_t)(cut[q + 1] - cut[q]) * 4);
    }
    for (i = 0; i < pc.count; i++) {
        if (i >= lone_lo && i < lone_hi) ASSERT_EQ_FMT(pa.data[i], pc.data[i], "%.9g");
        else ASSERT_EQ_FMT(before[i], pc.data[i], "%.9g");
    }
    free(before);
    pdp_optim_free(full);
    for (q = 0; q < 3; q++) pdp_optim_free(part[q]);
    pdp_optim_free(lone);
    pdp_model_free(a);
    pdp_model_free(b);
    pdp_model_free(c);
    PASS();
}

TEST optim_range_state_steps_like_the_full_optimizer(void)
{
    pdp_optim_desc d;
    pdp_model *m = small_model();
    pdp_optim *o = NULL;
    int v;
    for (v = 0; v < 5; v++) {
        memset(&d, 0, sizeof d);
        d.kind = v < 3 ? PDP_OPTIM_SGD : v == 3 ? PDP_OPTIM_ADAM : PDP_OPTIM_ADAMW;
        d.lr = 0.01f;
        d.weight_decay = v == 0 ? 0.0f : 0.01f;
        if (v == 1) d.momentum = 0.9f, d.dampening = 0.1f;
        if (v == 2) d.momentum = 0.9f, d.nesterov = true;
        CHECK_CALL(check_range_equals_full(&d));
    }
    ASSERT(m != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp__optim_create_range(&o, m, NULL, 5, m->param_count + 1,
                                                             "pdp_zero_create"), status_name);
    ASSERT(o == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_zero_create: range [5, 833) is not inside the model's "
                                    "832 parameters") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp__optim_create_range(&o, m, NULL, 7, 6, "f"), status_name);
    pdp_model_free(m);
    PASS();
}

TEST optim_step_allocates_nothing(void)
{
    static const pdp_optim_kind kinds[] = {PDP_OPTIM_SGD, PDP_OPTIM_ADAM, PDP_OPTIM_ADAMW};
    pdp_model *m = small_model();
    int k, i;
    ASSERT(m != NULL);
    for (k = 0; k < 3; k++) {
        pdp_optim *o = NULL;
        pdp_optim_desc d;
        long before;
        memset(&d, 0, sizeof d);
        d.kind = kinds[k];
        d.momentum = 0.9f;
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &d), status_name);
        before = test_allocs;
        for (i = 0; i < 5; i++) {
            ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), status_name);
            pdp_optim_zero_grad(o);
            ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(m, 1.0f, NULL), status_name);
        }
        ASSERT_EQm("a step allocated", before, test_allocs);
        pdp_optim_free(o);
    }
    pdp_model_free(m);
    PASS();
}

TEST optim_zero_grad_zeros_the_gradient_block(void)
{
    pdp_model *m = small_model();
    pdp_optim *o = NULL;
    pdp_tensor p, g;
    pdp_rng r;
    int64_t i;
    ASSERT(m != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, NULL), status_name);
    pdp_model_flat(m, &p, &g);
    pdp_rng_seed(&r, 1, 0);
    fill_normal(g.data, g.count, &r, 1.0f);
    pdp_optim_zero_grad(o);
    for (i = 0; i < g.count; i++) ASSERT_EQ(0.0f, g.data[i]);
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

/* Past 2 x PDP__OPTIM_MIN_PER_THREAD (32768) gradients the CPU memset splits over the
   threads: 300 -> 301 (90601 floats, not a multiple of 16), 1, 2 and 3 threads, every
   element zeroed, the parameters untouched. */
TEST optim_zero_grad_split_over_threads_zeros_every_element(void)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_tensor p, g;
    pdp_rng r;
    float *keep;
    int64_t i;
    int th;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 300;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &md), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 301), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, NULL), status_name);
    pdp_model_flat(m, &p, &g);
    ASSERT_EQ(300 * 301 + 301, g.count);
    keep = (float *)malloc((size_t)p.count * sizeof(float));
    ASSERT(keep != NULL);
    memcpy(keep, p.data, (size_t)p.count * sizeof(float));
    pdp_rng_seed(&r, 2, 0);
    for (th = 1; th <= 3; th++) {
        fill_normal(g.data, g.count, &r, 1.0f);
        for (i = 0; i < g.count; i++) g.data[i] += 2.0f; /* none already zero */
        ASSERT_ENUM_EQ(PDP_OK, pdp_set_num_threads(th), status_name);
        pdp_optim_zero_grad(o);
        pdp_set_num_threads(1);
        for (i = 0; i < g.count; i++) ASSERT_EQ(0.0f, g.data[i]);
        ASSERT_MEM_EQ(keep, p.data, (size_t)p.count * sizeof(float));
    }
    free(keep);
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

TEST optim_step_fails_after_layers_added(void)
{
    pdp_model *m = small_model();
    pdp_optim *o = NULL;
    ASSERT(m != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, NULL), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 2), status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_optim_step(o), status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_optim_step") != NULL);
    ASSERT(strstr(pdp_last_error(), "832") != NULL);
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

/* ---- create: NULL arguments, failing allocations (issue 21, item 8) ---- */

/* create(k) fails the k-th allocation it makes, for every k until it makes no k-th:
   each failure returns PDP_ERR_OUT_OF_MEMORY naming fn with *o NULL, and frees what
   it allocated (run under ASan: `make sanitize`, or the ASan line of the Makefile; the
   shard path used to read the optimizer it had just freed). Returns how many k failed. */
typedef pdp_status (*create_fn)(pdp_optim **o, void *arg);

static enum greatest_test_res check_failing_allocations(create_fn create, void *arg,
                                                        const char *fn, int *failures)
{
    int k;
    *failures = 0;
    for (k = 1; k < 100; k++) {
        static int sentinel;
        pdp_optim *o = (pdp_optim *)(void *)&sentinel; /* must come back NULL */
        pdp_status st;
        test_fail_at = test_allocs + k;
        st = create(&o, arg);
        test_fail_at = 0;
        if (st == PDP_OK) {
            ASSERT(o != NULL);
            pdp_optim_free(o);
            PASS();
        }
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_ERR_OUT_OF_MEMORY, st, status_name);
        ASSERT(o == NULL);
        ASSERTm(pdp_last_error(), strncmp(pdp_last_error(), fn, strlen(fn)) == 0);
        ++*failures;
    }
    FAILm("create still fails after 99 allocations");
}

typedef struct create_args {
    pdp_model *m;
    pdp_zero *z;
    pdp_optim_desc d;
} create_args;

static pdp_status create_full(pdp_optim **o, void *arg)
{
    create_args *a = (create_args *)arg;
    return pdp_optim_create(o, a->m, &a->d);
}

static pdp_status create_zero(pdp_optim **o, void *arg)
{
    create_args *a = (create_args *)arg;
    return pdp_zero_optim_create(o, a->z, &a->d);
}

TEST optim_create_null_arguments_and_failing_allocations(void)
{
    static const pdp_optim_kind kinds[] = {PDP_OPTIM_SGD, PDP_OPTIM_ADAM, PDP_OPTIM_ADAMW};
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_optim *o = NULL;
    create_args a;
    int k, n;
    memset(&a, 0, sizeof a);
    a.m = small_model();
    ASSERT(a.m != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), status_name);
    /* NULL arguments: refused with a message (pdp_zero_optim_create(NULL, z, NULL) crashed) */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_create(NULL, a.m, NULL), status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_optim_create: out is NULL") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_create(&o, NULL, NULL), status_name);
    ASSERT(o == NULL && strstr(pdp_last_error(), "pdp_optim_create: model is NULL") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_zero_optim_create(&o, NULL, NULL), status_name);
    ASSERT(o == NULL && strstr(pdp_last_error(), "pdp_zero_optim_create: zero is NULL") != NULL);
    /* a second model: the first stays unwrapped for pdp_optim_create */
    {
        pdp_model *zm = small_model();
        ASSERT(zm != NULL);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_zero_create(&a.z, zm, c, NULL),
                        status_name);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_zero_optim_create(NULL, a.z, NULL), status_name);
        ASSERTm(pdp_last_error(),
                strstr(pdp_last_error(), "pdp_zero_optim_create: out is NULL") != NULL);
        for (k = 0; k < 3; k++) {
            memset(&a.d, 0, sizeof a.d);
            a.d.kind = kinds[k];
            a.d.momentum = 0.9;
            /* the object and each state buffer (SGD: 1, Adam: 2) can fail */
            CHECK_CALL(check_failing_allocations(create_full, &a, "pdp_optim_create", &n));
            ASSERT_EQ(k == 0 ? 2 : 3, n);
            CHECK_CALL(check_failing_allocations(create_zero, &a, "pdp_zero_optim_create", &n));
            ASSERT_EQ(k == 0 ? 2 : 3, n);
        }
        pdp_zero_free(a.z);
        pdp_model_free(zm);
    }
    pdp_comm_free(c);
    pdp_local_group_free(g);
    /* the model freed before its optimizer: pdp_optim_free read the model's device (a use
       after free that make sanitize reports) */
    memset(&a.d, 0, sizeof a.d);
    a.d.kind = PDP_OPTIM_ADAM;
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, a.m, &a.d), status_name);
    pdp_model_free(a.m);
    pdp_optim_free(o);
    PASS();
}

/* ---- desc ---- */

TEST optim_desc_defaults(void)
{
    pdp_model *m = small_model();
    pdp_optim *o = NULL;
    pdp_optim_desc d;
    ASSERT(m != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, NULL), status_name);
    d = pdp_optim_get_desc(o);
    ASSERT_ENUM_EQ(PDP_OPTIM_SGD, d.kind, kind_name);
    ASSERT_IN_RANGE(0.01, d.lr, 0.0); /* PyTorch's defaults as doubles, not 0.01f */
    ASSERT_IN_RANGE(0.01, pdp_optim_lr(o), 0.0);
    pdp_optim_free(o);
    memset(&d, 0, sizeof d);
    d.kind = PDP_OPTIM_ADAM;
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &d), status_name);
    d = pdp_optim_get_desc(o);
    ASSERT_IN_RANGE(0.001, d.lr, 0.0);
    ASSERT_IN_RANGE(0.9, d.beta1, 0.0);
    ASSERT_IN_RANGE(0.999, d.beta2, 0.0); /* 0.999f is 0.99900001: 1 - beta2 1.3e-5 off */
    ASSERT_IN_RANGE(1e-8, d.eps, 0.0);
    ASSERT_IN_RANGE(0.0, d.weight_decay, 0.0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_set_lr(o, 0.1), status_name);
    ASSERT_IN_RANGE(0.1, pdp_optim_lr(o), 0.0); /* kept as the double it was given */
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

typedef struct bad_desc {
    pdp_optim_desc d;
    const char *needle;
} bad_desc;

TEST optim_desc_validation_names_field_and_value(void)
{
    pdp_model *m = small_model();
    bad_desc cases[10];
    size_t i;
    ASSERT(m != NULL);
    memset(cases, 0, sizeof cases);
    cases[0].d.lr = -0.1f; cases[0].needle = "lr -0.1";
    cases[1].d.nesterov = true; cases[1].needle = "nesterov";
    cases[2].d.nesterov = true; cases[2].d.momentum = 0.9f; cases[2].d.dampening = 0.1f;
    cases[2].needle = "dampening 0.1";
    cases[3].d.kind = PDP_OPTIM_ADAM; cases[3].d.beta1 = 1.0f; cases[3].needle = "beta1 1";
    cases[4].d.kind = PDP_OPTIM_ADAMW; cases[4].d.beta2 = 1.5f; cases[4].needle = "beta2 1.5";
    cases[5].d.momentum = -0.5f; cases[5].needle = "momentum -0.5";
    cases[6].d.weight_decay = -1.0f; cases[6].needle = "weight_decay -1";
    cases[7].d.kind = PDP_OPTIM_ADAM; cases[7].d.eps = -1e-3f; cases[7].needle = "eps -0.001";
    cases[8].d.lr = NAN; cases[8].needle = "lr nan";
    cases[9].d.decay_params = (pdp_decay_params)2; cases[9].needle = "decay_params 2";
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        static int sentinel;
        pdp_optim *o = (pdp_optim *)(void *)&sentinel; /* must come back NULL */
        ASSERT_ENUM_EQm(cases[i].needle, PDP_ERR_INVALID, pdp_optim_create(&o, m, &cases[i].d),
                        status_name);
        ASSERT(o == NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_optim_create") != NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), cases[i].needle) != NULL);
    }
    {
        pdp_optim_desc d;
        pdp_optim *o = NULL;
        memset(&d, 0, sizeof d);
        d.kind = (pdp_optim_kind)7;
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_create(&o, m, &d), status_name);
        ASSERT(strstr(pdp_last_error(), "kind 7") != NULL);
    }
    pdp_model_free(m);
    PASS();
}

/* ---- clipping ---- */

TEST optim_clip_grad_norm_matches_naive_norm(void)
{
    pdp_model *m = small_model();
    pdp_tensor p, g;
    pdp_rng r;
    float *before, norm = 0.0f;
    double sum = 0.0, want, coef;
    int64_t i;
    int k;
    ASSERT(m != NULL);
    pdp_model_flat(m, &p, &g);
    before = (float *)malloc((size_t)g.count * 4);
    ASSERT(before != NULL);
    pdp_rng_seed(&r, 5, 0);
    fill_normal(g.data, g.count, &r, 0.3f);
    memcpy(before, g.data, (size_t)g.count * 4);
    /* the reference: per-tensor norms, then the norm of those (torch's order) */
    for (k = 0; k < pdp_model_num_params(m); k++) {
        pdp_param prm;
        double t = 0.0;
        pdp_model_param(m, k, &prm);
        for (i = 0; i < prm.grad.count; i++) t += (double)prm.grad.data[i] * prm.grad.data[i];
        sum += t;
    }
    want = sqrt(sum);
    /* no clipping when the norm is below max_norm: bits unchanged */
    ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(m, (float)(want * 2), &norm), status_name);
    ASSERT_IN_RANGE(want, norm, want * 1e-6);
    ASSERT_MEM_EQ(before, g.data, (size_t)g.count * 4);
    /* clipping to 1 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(m, 1.0f, &norm), status_name);
    ASSERT_IN_RANGE(want, norm, want * 1e-6);
    coef = 1.0 / (want + 1e-6);
    for (i = 0; i < g.count; i++) ASSERT_IN_RANGE(before[i] * coef, g.data[i], 1e-6);
    sum = 0.0;
    for (i = 0; i < g.count; i++) sum += (double)g.data[i] * g.data[i];
    ASSERT_IN_RANGE(1.0, sqrt(sum), 1e-5);
    /* a NaN gradient */
    memcpy(g.data, before, (size_t)g.count * 4);
    g.data[100] = NAN;
    ASSERT_ENUM_EQ(PDP_ERR_NUMERIC, pdp_clip_grad_norm(m, 1.0f, &norm), status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_clip_grad_norm") != NULL);
    ASSERT_EQ(0, memcmp(before, g.data, 100 * 4)); /* untouched */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_clip_grad_norm(m, -1.0f, NULL), status_name);
    ASSERT(strstr(pdp_last_error(), "max_norm -1") != NULL);
    free(before);
    pdp_model_free(m);
    PASS();
}

/* ---- option values (issue 13, item 5): zero means the default; outside the range fails ---- */

/* Each of these was accepted before: set_lr(NaN) stored NaN, clip_grad_norm(inf) passed,
   the schedule returned -inf for step -2 with warmup 0, a NaN bucket size reached the reducer. */
TEST optim_option_values_outside_their_range_fail(void)
{
    pdp_model *m = small_model();
    pdp_optim *o;
    pdp_optim_desc d;
    pdp_local_group *g;
    pdp_comm *c;
    pdp_ddp *ddp = NULL;
    pdp_ddp_desc dd;
    double lr;
    ASSERT(m != NULL);
    memset(&d, 0, sizeof d);
    d.lr = INFINITY;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_create(&o, m, &d), status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_optim_create: lr inf") != NULL);
    d.lr = 0.0f; /* the default */
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &d), status_name);
    ASSERT_IN_RANGE(0.01, pdp_optim_lr(o), 0.0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_set_lr(o, 0.25f), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_set_lr(o, 0.0f), status_name); /* lr 0 is a value here */
    ASSERT_IN_RANGE(0.0, pdp_optim_lr(o), 0.0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_set_lr(o, 0.25f), status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_set_lr(o, NAN), status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_optim_set_lr: lr nan") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_set_lr(o, -1e-3f), status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_optim_set_lr: lr -0.001") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_set_lr(o, -INFINITY), status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_set_lr(o, INFINITY), status_name);
    /* a double beyond FLT_MAX would round to inf where it meets the float tensors */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_set_lr(o, 1e300), status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_optim_set_lr: lr 1e+300") != NULL);
    ASSERT_IN_RANGE(0.25, pdp_optim_lr(o), 0.0); /* unchanged by the failures */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_set_lr(NULL, 0.1f), status_name);
    pdp_optim_free(o);

    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_clip_grad_norm(m, NAN, NULL), status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_clip_grad_norm: max_norm nan") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_clip_grad_norm(m, INFINITY, NULL), status_name);
    ASSERT(strstr(pdp_last_error(), "max_norm inf") != NULL);

    /* the schedule returns a double: NaN for an input outside its range */
    lr = pdp_lr_warmup_cosine(-2, 0, 100, 1.0f, 0.1f);
    ASSERTm("step -2, warmup 0: NaN (it was -inf)", lr != lr);
    lr = pdp_lr_warmup_cosine(-1, 0, 100, 1.0f, 0.1f);
    ASSERT(lr != lr);
    lr = pdp_lr_warmup_cosine(-1, 10, 100, 1.0f, 0.1f);
    ASSERT(lr != lr);
    lr = pdp_lr_warmup_cosine(3, -1, 100, 1.0f, 0.1f);
    ASSERT(lr != lr);
    lr = pdp_lr_warmup_cosine(3, 0, -5, 1.0f, 0.1f);
    ASSERT(lr != lr);
    lr = pdp_lr_warmup_cosine(3, 10, 100, NAN, 0.1f);
    ASSERT(lr != lr);
    lr = pdp_lr_warmup_cosine(3, 10, 100, 1.0f, -0.1f);
    ASSERT(lr != lr);
    lr = pdp_lr_warmup_cosine(3, 10, 100, INFINITY, 0.1f);
    ASSERT(lr != lr);
    ASSERT_IN_RANGE(1.0, pdp_lr_warmup_cosine(0, 0, 100, 1.0f, 0.1f), 1e-7); /* warmup 0 */
    ASSERT_IN_RANGE(0.1, pdp_lr_warmup_cosine(5, 0, 0, 1.0f, 0.1f), 1e-7);   /* total 0 */
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, NULL), status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_optim_set_lr(o, pdp_lr_warmup_cosine(-2, 0, 9, 1, 0)),
                   status_name);
    pdp_optim_free(o);

    /* DDP's bucket sizes: NaN and infinite fail before anything is communicated */
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), status_name);
    memset(&dd, 0, sizeof dd);
    dd.bucket_cap_mb = NAN;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_ddp_create(&ddp, m, c, &dd), status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_ddp_create: bucket_cap_mb nan") != NULL);
    dd.bucket_cap_mb = 0.0;
    dd.first_bucket_mb = INFINITY;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_ddp_create(&ddp, m, c, &dd), status_name);
    ASSERT(strstr(pdp_last_error(), "first_bucket_mb inf") != NULL);
    dd.first_bucket_mb = -1.0;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_ddp_create(&ddp, m, c, &dd), status_name);
    ASSERT(ddp == NULL);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    pdp_model_free(m);
    PASS();
}

/* ---- schedule ---- */

TEST optim_warmup_cosine_known_points(void)
{
    /* warmup 10, total 110, 1 -> 0.1; in double, as PyTorch's schedulers: 1 * 1 / 10 is
       the double 0.1, not 0.1f */
    ASSERT_IN_RANGE(0.1, pdp_lr_warmup_cosine(0, 10, 110, 1.0, 0.1), 0.0);
    ASSERT_IN_RANGE(0.1, pdp_lr_warmup_cosine(1000, 10, 110, 1.0, 0.1), 0.0);
    ASSERT_IN_RANGE(0.5, pdp_lr_warmup_cosine(4, 10, 110, 1.0f, 0.1f), 1e-7);
    ASSERT_IN_RANGE(1.0, pdp_lr_warmup_cosine(9, 10, 110, 1.0f, 0.1f), 1e-7);
    ASSERT_IN_RANGE(1.0, pdp_lr_warmup_cosine(10, 10, 110, 1.0f, 0.1f), 1e-7);
    ASSERT_IN_RANGE(0.55, pdp_lr_warmup_cosine(60, 10, 110, 1.0f, 0.1f), 1e-6);
    ASSERT_IN_RANGE(0.1 + 0.45 * (1.0 + cos(acos(-1.0) * 0.25)),
                    pdp_lr_warmup_cosine(35, 10, 110, 1.0f, 0.1f), 1e-6);
    ASSERT_IN_RANGE(0.1, pdp_lr_warmup_cosine(110, 10, 110, 1.0f, 0.1f), 1e-7);
    ASSERT_IN_RANGE(0.1, pdp_lr_warmup_cosine(1000, 10, 110, 1.0f, 0.1f), 1e-7);
    /* no warm-up */
    ASSERT_IN_RANGE(2.0, pdp_lr_warmup_cosine(0, 0, 100, 2.0f, 0.0f), 1e-7);
    ASSERT_IN_RANGE(1.0, pdp_lr_warmup_cosine(50, 0, 100, 2.0f, 0.0f), 1e-6);
    PASS();
}

/* ---- PyTorch fixtures ---- */

typedef struct fixture_case {
    const char *model, *optim;
} fixture_case;

static void fixture_desc(const char *optim, pdp_optim_desc *d)
{
    memset(d, 0, sizeof *d);
    if (strncmp(optim, "sgd", 3) == 0) {
        d->kind = PDP_OPTIM_SGD;
        d->lr = 0.1;
        d->momentum = 0.9;
        d->weight_decay = 0.01;
        if (strcmp(optim, "sgd_nesterov") == 0) d->nesterov = true;
        else d->dampening = 0.1;
        return;
    }
    d->kind = strcmp(optim, "adam") == 0 ? PDP_OPTIM_ADAM : PDP_OPTIM_ADAMW;
    d->lr = 0.01; /* betas (0.9, 0.999) and eps 1e-8: the defaults, PyTorch's */
    d->weight_decay = d->kind == PDP_OPTIM_ADAM ? 0.01 : 0.1;
}

static pdp_model *fixture_model(const char *kind)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_status st;
    memset(&md, 0, sizeof md);
    if (strcmp(kind, "mlp") == 0) {
        md.input_shape[0] = 6;
        if (pdp_model_create(&m, &md) != PDP_OK) return NULL;
        st = pdp_model_add_linear(m, 5);
        if (st == PDP_OK) st = pdp_model_add_relu(m);
        if (st == PDP_OK) st = pdp_model_add_linear(m, 3);
    } else {
        md.input_shape[0] = 1;
        md.input_shape[1] = 6;
        md.input_shape[2] = 6;
        if (pdp_model_create(&m, &md) != PDP_OK) return NULL;
        st = pdp_model_add_conv2d(m, 2, 3, 1, 0);
        if (st == PDP_OK) st = pdp_model_add_relu(m);
        if (st == PDP_OK) st = pdp_model_add_maxpool2d(m, 2, 0);
        if (st == PDP_OK) st = pdp_model_add_flatten(m);
        if (st == PDP_OK) st = pdp_model_add_linear(m, 3);
    }
    if (st != PDP_OK) {
        pdp_model_free(m);
        return NULL;
    }
    return m;
}

static enum greatest_test_res run_fixture(const char *model_kind, const char *optim_kind)
{
    static char msg[256];
    static char skip[640];
    char file[96], name[96];
    fixture fx;
    const fixture_tensor *x, *lab, *loss, *t;
    pdp_model *m;
    pdp_optim *o = NULL;
    pdp_optim_desc d;
    pdp_tensor xv;
    int32_t labels[16];
    int i, step;
    int64_t j;
    int rc;
    snprintf(file, sizeof file, "optim_%s_%s.bin", model_kind, optim_kind);
    rc = fixture_load(&fx, file);
    if (rc == FIXTURE_MISSING) {
        snprintf(skip, sizeof skip, "%s missing (run /usr/bin/python3 tools/gen_optim_fixtures.py)",
                 fx.path);
        SKIPm(skip);
    }
    ASSERT_EQm("the fixture is corrupt", FIXTURE_OK, rc);
    m = fixture_model(model_kind);
    ASSERT(m != NULL);
    x = fixture_find(&fx, "x");
    lab = fixture_find(&fx, "labels");
    loss = fixture_find(&fx, "loss");
    ASSERT(x && lab && loss && lab->count <= 16);
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param p;
        pdp_model_param(m, i, &p);
        snprintf(name, sizeof name, "init.%s", p.name);
        t = fixture_find(&fx, name);
        ASSERTm(name, t != NULL && t->count == p.value.count);
        memcpy(p.value.data, t->data, (size_t)t->count * 4);
    }
    for (j = 0; j < lab->count; j++) labels[j] = (int32_t)lab->data[j];
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(x->data, pdp_cpu(), x->ndim, x->shape, &xv),
                   status_name);
    fixture_desc(optim_kind, &d);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &d), status_name);
    for (step = 0; step < 3; step++) {
        float l = 0.0f;
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_forward_backward(m, &xv, labels, &l),
                        status_name);
        ASSERT_IN_RANGE(loss->data[step], l, 1e-5 * fabs(loss->data[step]) + 1e-6);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), status_name);
        pdp_optim_zero_grad(o);
    }
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param p;
        pdp_model_param(m, i, &p);
        snprintf(name, sizeof name, "final.%s", p.name);
        t = fixture_find(&fx, name);
        ASSERTm(name, t != NULL && t->count == p.value.count);
        for (j = 0; j < t->count; j++) {
            double want = t->data[j], got = p.value.data[j];
            if (!(fabs(got - want) <= 1e-5 * fabs(want) + 1e-6)) {
                snprintf(msg, sizeof msg, "%s %s: %s[%lld] = %.9g, PyTorch %.9g", model_kind,
                         optim_kind, p.name, (long long)j, got, want);
                FAILm(msg);
            }
        }
    }
    pdp_optim_free(o);
    pdp_model_free(m);
    fixture_free(&fx);
    PASS();
}

TEST optim_pytorch_mlp(void)
{
    CHECK_CALL(run_fixture("mlp", "sgd_nesterov"));
    CHECK_CALL(run_fixture("mlp", "sgd_damp"));
    CHECK_CALL(run_fixture("mlp", "adam"));
    CHECK_CALL(run_fixture("mlp", "adamw"));
    PASS();
}

TEST optim_pytorch_cnn(void)
{
    CHECK_CALL(run_fixture("cnn", "sgd_nesterov"));
    CHECK_CALL(run_fixture("cnn", "sgd_damp"));
    CHECK_CALL(run_fixture("cnn", "adam"));
    CHECK_CALL(run_fixture("cnn", "adamw"));
    PASS();
}

/* ---- PyTorch fixtures: the optimizer alone (issue 21, item 16) ----
   tests/fixtures/optim_raw_<kind>.bin: PyTorch's single-tensor optimizer, its
   hyper-parameters Python floats (doubles), given RAW_STEPS gradients of one flat
   parameter of 987 floats (magnitudes 1e-9 to 10), and the parameter and the state
   after them; here the flat block of Linear(20, 47) takes the same gradients.
   Tolerance 1e-6, relative to each element's scale: the state's (the recurrence on the
   terms' magnitudes: exp_avg_sq sums positive terms, so that is itself) and the
   parameters' (|p| at the start and the end, plus lr x steps). Measured: the state
   1.6e-7 to 2.8e-7, the parameters 4e-8 to 1.5e-7 (a few float roundings: PyTorch's
   vectorised add_ with alpha is a fused multiply-add, ours is not). With the float
   hyper-parameters pdp had before, Adam's exp_avg_sq was 1.3e-5 away (1 - 0.999f is
   0.00099998713, not 0.001): that fails. */

#define RAW_STEPS 10

static void raw_desc(const char *kind, pdp_optim_desc *d)
{
    memset(d, 0, sizeof *d);
    if (strcmp(kind, "adam") == 0) {
        d->kind = PDP_OPTIM_ADAM; /* every default: lr 1e-3, betas (0.9, 0.999), eps 1e-8 */
    } else if (strcmp(kind, "adam_l2") == 0) {
        d->kind = PDP_OPTIM_ADAM;
        d->weight_decay = 0.01;
    } else if (strcmp(kind, "adamw") == 0) {
        d->kind = PDP_OPTIM_ADAMW;
        d->weight_decay = 0.01; /* PyTorch's default (pdp's is 0) */
    } else if (strcmp(kind, "adamw_b") == 0) {
        d->kind = PDP_OPTIM_ADAMW;
        d->lr = 3e-4;
        d->beta1 = 0.8;
        d->beta2 = 0.95;
        d->eps = 1e-6;
        d->weight_decay = 0.1;
    } else if (strcmp(kind, "sgd_damp") == 0) {
        d->lr = 0.05;
        d->momentum = 0.9;
        d->dampening = 0.9;
        d->weight_decay = 1e-4;
    } else { /* sgd_nest */
        d->lr = 0.05;
        d->momentum = 0.95;
        d->nesterov = true;
        d->weight_decay = 5e-4;
    }
}

/* The largest |got - want| / scale[i] over n elements. */
static double worst_error(const float *got, const float *want, const double *scale, int64_t n)
{
    double worst = 0.0, e;
    int64_t i;
    for (i = 0; i < n; i++) {
        e = fabs((double)got[i] - (double)want[i]) / scale[i];
        if (!(e <= worst)) worst = e; /* a NaN sticks */
    }
    return worst;
}

/* Runs optim_raw_<kind>.bin on device dev; *worst_state and *worst_param get the
   largest errors (relative to the scales above). */
static enum greatest_test_res run_raw_fixture(const char *kind, pdp_device dev,
                                              double *worst_state, double *worst_param)
{
    static char skip[640];
    static const char *const adam_state[] = {"final.exp_avg", "final.exp_avg_sq"};
    static const char *const sgd_state[] = {"final.momentum_buffer"};
    char file[96];
    fixture fx;
    const fixture_tensor *init, *grads, *fin, *st;
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc d;
    pdp_tensor params, g;
    double *scale;
    float *got;
    int64_t n, i;
    int rc, step, k;
    snprintf(file, sizeof file, "optim_raw_%s.bin", kind);
    rc = fixture_load(&fx, file);
    if (rc == FIXTURE_MISSING) {
        snprintf(skip, sizeof skip, "%s missing (run /usr/bin/python3 tools/gen_optim_fixtures.py)",
                 fx.path);
        SKIPm(skip);
    }
    ASSERT_EQm("the fixture is corrupt", FIXTURE_OK, rc);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 20;
    md.device = dev;
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_create(&m, &md), status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_add_linear(m, 47), status_name);
    raw_desc(kind, &d);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_optim_create(&o, m, &d), status_name);
    d = pdp_optim_get_desc(o);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(m, &params, &g), status_name);
    n = params.count;
    init = fixture_find(&fx, "init");
    grads = fixture_find(&fx, "grads");
    fin = fixture_find(&fx, "final");
    ASSERT(init && grads && fin && init->count == n && fin->count == n &&
           grads->count == RAW_STEPS * n);
    ASSERT_ENUM_EQ(PDP_OK, pdp__dev_copy(dev, params.data, pdp_cpu(), init->data, (size_t)n * 4),
                   status_name);
    for (step = 0; step < RAW_STEPS; step++) {
        ASSERT_ENUM_EQ(PDP_OK, pdp__dev_copy(dev, g.data, pdp_cpu(), grads->data + step * n,
                                             (size_t)n * 4), status_name);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_optim_step(o), status_name);
    }
    scale = (double *)malloc((size_t)n * sizeof(double));
    got = (float *)malloc((size_t)n * 4);
    ASSERT(scale != NULL && got != NULL);
    *worst_state = 0.0;
    for (k = 0; k < o->nstate; k++) {
        double e;
        st = fixture_find(&fx, d.kind == PDP_OPTIM_SGD ? sgd_state[k] : adam_state[k]);
        ASSERT(st && st->count == n);
        /* the scale: the state's recurrence in double on |terms| (the L2 term from the
           initial parameter), so an exp_avg or momentum buffer that cancels to near 0 is
           judged on the size of what it summed; exp_avg_sq sums positive terms: itself */
        for (i = 0; i < n; i++) {
            double s = 0.0, gi;
            for (step = 0; step < RAW_STEPS; step++) {
                gi = fabs((double)grads->data[step * n + i]);
                if (d.kind != PDP_OPTIM_ADAMW) gi += d.weight_decay * fabs((double)init->data[i]);
                if (d.kind == PDP_OPTIM_SGD)
                    s = step == 0 ? gi : d.momentum * s + (1.0 - d.dampening) * gi;
                else if (k == 0)
                    s = d.beta1 * s + (1.0 - d.beta1) * gi;
                else
                    s = d.beta2 * s + (1.0 - d.beta2) * gi * gi;
            }
            scale[i] = s > 0.0 ? s : 1.0;
        }
        ASSERT_ENUM_EQ(PDP_OK, pdp__dev_copy(pdp_cpu(), got, dev, o->state[k], (size_t)n * 4),
                       status_name);
        e = worst_error(got, st->data, scale, n);
        if (!(e <= *worst_state)) *worst_state = e;
    }
    /* the parameters: on the scale of where they start and end, and of Adam's movement
       (at most about lr a step) */
    for (i = 0; i < n; i++)
        scale[i] = fabs((double)init->data[i]) + fabs((double)fin->data[i]) + d.lr * RAW_STEPS;
    ASSERT_ENUM_EQ(PDP_OK, pdp__dev_copy(pdp_cpu(), got, dev, params.data, (size_t)n * 4),
                   status_name);
    *worst_param = worst_error(got, fin->data, scale, n);
    free(scale);
    free(got);
    pdp_optim_free(o);
    pdp_model_free(m);
    fixture_free(&fx);
    PASS();
}

/* Every optim_raw_* fixture on dev, each within 1e-6 of its scales (above); -v prints
   the figures. */
static enum greatest_test_res check_raw_fixtures(pdp_device dev)
{
    static const char *const kinds[] = {"adam", "adam_l2", "adamw", "adamw_b", "sgd_damp",
                                        "sgd_nest"};
    static char msg[256];
    size_t i;
    bool ok = true;
    for (i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        double ws = 0.0, wp = 0.0;
        CHECK_CALL(run_raw_fixture(kinds[i], dev, &ws, &wp));
        if (greatest_get_verbosity() > 0)
            printf("  %-8s state %.3g of its scale (1e-6 allowed), parameters %.3g of theirs "
                   "(1e-6 allowed)\n", kinds[i], ws, wp);
        if (ok && !(ws <= 1e-6 && wp <= 1e-6)) { /* every kind runs; the first miss is named */
            snprintf(msg, sizeof msg, "%s: the state is %.3g of its scale from PyTorch's, the "
                     "parameters %.3g of theirs (1e-6 allowed)", kinds[i], ws, wp);
            ok = false;
        }
    }
    ASSERTm(msg, ok);
    PASS();
}

/* Adam, AdamW and SGD with PyTorch's defaults and other decimal hyper-parameters (none
   exact in binary) against PyTorch's own updates, state included. */
TEST optim_pytorch_default_hyperparameters(void)
{
    CHECK_CALL(check_raw_fixtures(pdp_cpu()));
    PASS();
}

/* ---- CUDA ---- */

static bool have_cuda(void)
{
    int n = 0;
    return pdp_cuda_device_count(&n) == PDP_OK && n > 0;
}

/* The fused CUDA kernels run math.h's formulas: the same updates as the CPU up to
   FMA contraction on the GPU (1e-6 relative). */
TEST optim_cuda_matches_cpu(void)
{
    static const pdp_optim_kind kinds[] = {PDP_OPTIM_SGD, PDP_OPTIM_ADAM, PDP_OPTIM_ADAMW};
    pdp_model_desc md;
    int k, step;
    if (!have_cuda()) SKIP_NO_CUDA();
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 37;
    for (k = 0; k < 3; k++) {
        pdp_model *cpu = NULL, *gpu = NULL;
        pdp_optim *oc = NULL, *og = NULL;
        pdp_optim_desc d;
        pdp_tensor pc, gc, pg, gg;
        float *back;
        pdp_rng r;
        int64_t i;
        memset(&d, 0, sizeof d);
        d.kind = kinds[k];
        d.momentum = 0.9f;
        d.weight_decay = 0.01f;
        md.device = pdp_cpu();
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&cpu, &md), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(cpu, 101), status_name);
        md.device = pdp_cuda(0);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_create(&gpu, &md), status_name);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_add_linear(gpu, 101), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oc, cpu, &d), status_name);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_optim_create(&og, gpu, &d), status_name);
        pdp_model_flat(cpu, &pc, &gc);
        pdp_model_flat(gpu, &pg, &gg);
        back = (float *)malloc((size_t)pc.count * 4);
        ASSERT(back != NULL);
        pdp_rng_seed(&r, 8, 0);
        for (step = 0; step < 4; step++) {
            fill_normal(gc.data, gc.count, &r, 1.0f);
            ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(&gg, gc.data), status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oc), status_name);
            ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_optim_step(og), status_name);
        }
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(&pg, back), status_name);
        for (i = 0; i < pc.count; i++)
            ASSERT_IN_RANGE(pc.data[i], back[i], 1e-6 * fabs(pc.data[i]) + 1e-7);
        free(back);
        pdp_optim_free(oc);
        pdp_optim_free(og);
        pdp_model_free(cpu);
        pdp_model_free(gpu);
    }
    PASS();
}

/* The fused CUDA kernels take the same float scalars (pdp__optim_scalars_of) as the
   CPU loop: the PyTorch fixtures at the default hyper-parameters hold on the GPU too. */
TEST optim_cuda_pytorch_default_hyperparameters(void)
{
    if (!have_cuda()) SKIP_NO_CUDA();
    CHECK_CALL(check_raw_fixtures(pdp_cuda(0)));
    PASS();
}

SUITE(optim)
{
    RUN_TEST(optim_sgd_matches_reference_all_options);
    RUN_TEST(optim_adam_matches_reference);
    RUN_TEST(optim_adamw_matches_reference);
    RUN_TEST(optim_element_helpers_known_values);
    RUN_TEST(optim_step_bits_independent_of_threads);
    RUN_TEST(optim_range_state_steps_like_the_full_optimizer);
    RUN_TEST(optim_step_allocates_nothing);
    RUN_TEST(optim_zero_grad_zeros_the_gradient_block);
    RUN_TEST(optim_zero_grad_split_over_threads_zeros_every_element);
    RUN_TEST(optim_step_fails_after_layers_added);
    RUN_TEST(optim_create_null_arguments_and_failing_allocations);
    RUN_TEST(optim_desc_defaults);
    RUN_TEST(optim_desc_validation_names_field_and_value);
    RUN_TEST(optim_clip_grad_norm_matches_naive_norm);
    RUN_TEST(optim_warmup_cosine_known_points);
    RUN_TEST(optim_option_values_outside_their_range_fail);
    RUN_TEST(optim_pytorch_mlp);
    RUN_TEST(optim_pytorch_cnn);
    RUN_TEST(optim_pytorch_default_hyperparameters);
    RUN_TEST(optim_cuda_matches_cpu);
    RUN_TEST(optim_cuda_pytorch_default_hyperparameters);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(optim);
    GREATEST_MAIN_END();
}
