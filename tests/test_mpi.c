/* Tests of pdp_comm_init_env and of the MPI communicator backend.

   Built two ways:
     make test       plain cc, no MPI: pdp_comm_init_env's errors (MPI and NCCL
                     not compiled in, local backend asked for), MPI tests skip;
     make mpi-test   mpicc -DPDP_MPI, run by mpirun on 1, 2, 3 and 4 ranks:
                     the backend conformance suite (tests/comm_conformance.h,
                     tests named conf_*: every collective and message against
                     naive loops on odd counts up to 1000003, which crosses
                     PDP_MPI_CHUNK, the 16-bit roundings, handles waited out of
                     order, tags and timeouts, split, count bounds, a rank that
                     does not arrive at a collective, stats), then what is
                     MPI's own: an asynchronous launch that returns before the
                     peers arrive, sends that time out together, DDP, ZeRO, TP
                     and PP over MPI equal to single-device training with
                     bit-identical ranks, the trace, and a rank that does not
                     arrive at creation (tests/mpi_startup.sh: start-up checks
                     and a killed rank).

   Under MPI every rank runs every test; a test's result is agreed over
   MPI_COMM_WORLD (a failure on any rank fails it everywhere, and that rank
   prints its message on stderr), and only rank 0 prints the harness's report,
   so the final "P passed, F failed, S skipped" line appears once and every
   rank exits non-zero on a failure. Values are small integers (or multiples of
   1/8), so sums are exact in any order and the checks compare bits. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#ifdef PDP_MPI
#  include <mpi.h>
#  include <signal.h>
#  define PDP_MPI_CHUNK 100000 /* 1000003 floats take 11 MPI calls */
#endif
#define PDP_IMPLEMENTATION
#include "pdp.h"

static FILE *test_out; /* rank 0: stdout; other ranks: /dev/null */
#define GREATEST_STDOUT (test_out ? test_out : stdout)
#include "pdp_test.h"
#include "fixture.h"

static int my_rank = 0, world_size = 1;

/* ---- agreement over ranks ---- */

/* Every rank calls it with its own result; a failure anywhere fails everywhere. */
static enum greatest_test_res agree(enum greatest_test_res r)
{
#ifdef PDP_MPI
    int mine = r == GREATEST_TEST_RES_FAIL, mask = mine ? 1 << PDP__MIN(my_rank, 30) : 0, all = 0;
    if (mine && my_rank != 0)
        fprintf(stderr, "rank %d: FAIL %s: %s (%s:%u)\n", my_rank, greatest_info.name_buf,
                greatest_info.msg ? greatest_info.msg : "", greatest_info.fail_file ?
                greatest_info.fail_file : "", greatest_info.fail_line);
    MPI_Allreduce(&mask, &all, 1, MPI_INT, MPI_BOR, MPI_COMM_WORLD);
    if (all && !mine) {
        int i, n = 0;
        n += snprintf(greatest_info.msg_buf, sizeof greatest_info.msg_buf, "failed on rank(s)");
        for (i = 0; i <= 30 && n < (int)sizeof greatest_info.msg_buf - 8; i++)
            if (all & (1 << i)) n += snprintf(greatest_info.msg_buf + n,
                                              sizeof greatest_info.msg_buf - (size_t)n, " %d", i);
        greatest_info.msg = greatest_info.msg_buf;
        greatest_info.fail_file = __FILE__;
        greatest_info.fail_line = (unsigned int)__LINE__;
        return GREATEST_TEST_RES_FAIL;
    }
#endif
    return r;
}

/* TEST name runs name_body on every rank, then agrees on the result. */
#define MPI_TEST(name)                                                                        \
    static enum greatest_test_res name##_body(void);                                          \
    TEST name(void) { return agree(name##_body()); }                                          \
    static enum greatest_test_res name##_body(void)

/* ---- pdp_comm_init_env: errors (every build) ---- */

MPI_TEST(mpi_init_env_rejects_local_backend)
{
    pdp_comm *c = (pdp_comm *)&c;
    pdp_comm_desc d;
    memset(&d, 0, sizeof d);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_init_env(&c, &d), pdp_status_name);
    ASSERT(c == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_comm_init_env") != NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_local_group_create") != NULL);
    d.backend = PDP_BACKEND_LOCAL;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_init_env(&c, &d), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "LOCAL") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_init_env(&c, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_init_env(NULL, &d), pdp_status_name);
    d.backend = (pdp_backend)77;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_init_env(&c, &d), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "77") != NULL);
    PASS();
}

MPI_TEST(mpi_init_env_nccl_needs_cuda)
{
#ifdef PDP_CUDA
    SKIPm("built with PDP_CUDA: NCCL is tested by the CUDA tests");
#else
    pdp_comm *c = (pdp_comm *)&c;
    pdp_comm_desc d;
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_NCCL;
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_comm_init_env(&c, &d), pdp_status_name);
    ASSERT(c == NULL);
    ASSERT(strstr(pdp_last_error(), "PDP_CUDA") != NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_comm_init_env") != NULL);
    PASS();
#endif
}

MPI_TEST(mpi_init_env_mpi_needs_pdp_mpi)
{
    pdp_comm *c = (pdp_comm *)&c;
    pdp_comm_desc d;
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_MPI;
#ifdef PDP_MPI
    d.device = pdp_cuda(0);
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_comm_init_env(&c, &d), pdp_status_name);
    ASSERT(c == NULL);
    ASSERT(strstr(pdp_last_error(), "NCCL") != NULL);
    PASS();
#else
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_comm_init_env(&c, &d), pdp_status_name);
    ASSERT(c == NULL);
    ASSERT(strstr(pdp_last_error(), "PDP_MPI") != NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_comm_init_env") != NULL);
    PASS();
#endif
}

/* The desc rule (comm.h): a negative, NaN or infinite timeout_s is PDP_ERR_INVALID naming
   pdp_comm_init_env and the field, before MPI is touched, in every build. */
MPI_TEST(mpi_init_env_rejects_bad_timeout)
{
    static const double bad[] = {-1.0, 0.0 / 0.0, 1.0 / 0.0};
    pdp_comm *c = (pdp_comm *)&c;
    pdp_comm_desc d;
    int i;
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_MPI;
    for (i = 0; i < 3; i++) {
        d.timeout_s = bad[i];
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_init_env(&c, &d), pdp_status_name);
        ASSERT(c == NULL);
        ASSERTm(pdp_last_error(),
                strstr(pdp_last_error(), "pdp_comm_init_env: desc->timeout_s") != NULL);
    }
    PASS();
}

#ifndef PDP_MPI
TEST mpi_collectives(void) { SKIPm("built without PDP_MPI: run `make mpi-test` (needs mpicc)"); }
#else

/* ---- MPI: helpers ---- */

static pdp_comm *world; /* created first by main: pdp initialises MPI, and finalises it */
static pdp_comm *cm;    /* the communicator most tests use */
static char trace_file[300]; /* this rank's trace file, removed at the end */

/* Rank r's value at index i: a small integer, so sums are exact in any order. */
static float val(int r, int64_t i)
{
    return (float)((r + 1) * (int)(i % 251) - 3 * r + (int)(i % 7));
}

static float *fbuf(int64_t n) { return (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }

static pdp_status make_comm(pdp_comm **out, const char *name, double timeout_s)
{
    pdp_comm_desc d;
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_MPI;
    d.name = name;
    d.timeout_s = timeout_s;
    return pdp_comm_init_env(out, &d);
}

/* ---- MPI: collectives against naive values ---- */

MPI_TEST(mpi_comm_reports_rank_and_size)
{
    int r, s;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &s);
    ASSERT_EQ(r, pdp_comm_rank(cm));
    ASSERT_EQ(s, pdp_comm_size(cm));
    ASSERT_EQ(PDP_BACKEND_MPI, pdp_comm_backend(cm));
    PASS();
}

/* ---- MPI: the conformance suite (tests/comm_conformance.h), this process's rank ----
   Every rank runs every case on a fresh communicator named "conf"; conf_sync is an
   MPI_Barrier on MPI_COMM_WORLD; buffers are host memory. */

#define CONF_AGREE(r) agree(r)
#define CONF_NO_THREADS
#include "comm_conformance.h"

static int mpi_conf_run(const conf_factory *f, int n, double timeout_s, conf_fn fn, int64_t arg,
                        conf_rank *ranks)
{
    pdp_comm *c = NULL;
    if (n != world_size) return 0;
    ranks[0].f = f;
    ranks[0].rank = my_rank;
    ranks[0].size = n;
    ranks[0].arg = arg;
    ranks[0].timeout_s = timeout_s;
    if (!conf_ok(&ranks[0], make_comm(&c, "conf", timeout_s), "pdp_comm_init_env")) return 1;
    fn(&ranks[0], c);
    if (!ranks[0].freed) pdp_comm_free(c);
    return 1;
}

static void mpi_conf_sync(conf_rank *rk)
{
    (void)rk;
    MPI_Barrier(MPI_COMM_WORLD);
}

static void *mpi_conf_alloc(pdp_comm *c, size_t bytes)
{
    (void)c;
    return malloc(bytes);
}

static void mpi_conf_release(pdp_comm *c, void *p)
{
    (void)c;
    free(p);
}

static pdp_status mpi_conf_copy(pdp_comm *c, void *dst, const void *src, size_t bytes)
{
    (void)c;
    memcpy(dst, src, bytes);
    return PDP_OK;
}

/* min = max = the world size: mpirun chooses it (make mpi-test: 1, 2, 3, 4); the cases
   that time out wait 1 s (MPI's cancel grace is 1 s more) */
static conf_factory mpi_factory = {"mpi", PDP_BACKEND_MPI, 1, 1, mpi_conf_run, mpi_conf_alloc,
                                   mpi_conf_release, mpi_conf_copy, mpi_conf_copy, mpi_conf_sync,
                                   1.0};

/* ---- MPI: asynchronous ---- */

/* Rank 0 launches at once; the others launch 300 ms later. Rank 0's launch must
   return immediately, the handle must not be done while the peers are away,
   and rank 0 computes meanwhile; the result is still exact. */
MPI_TEST(mpi_async_launch_returns_before_peers_arrive)
{
    const int64_t n = 1 << 20;
    float *b = fbuf(n), *acc = fbuf(4096);
    pdp_work *w = NULL;
    double t0, t_launch, t_compute, t_wait;
    bool done_early;
    int64_t i, k;
    int r;
    for (i = 0; i < n; i++) b[i] = val(my_rank, i);
    for (i = 0; i < 4096; i++) acc[i] = 0.0f;
    if (my_rank != 0) {
        struct timespec ts = {0, 300000000};
        nanosleep(&ts, NULL);
    }
    t0 = pdp__now();
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_allreduce(cm, b, n, PDP_REDUCE_SUM, &w), pdp_status_name);
    t_launch = pdp__now() - t0;
    done_early = pdp_work_done(w);
    /* "backward": compute until 200 ms have passed */
    for (k = 0; pdp__now() - t0 < 0.2; k++)
        for (i = 0; i < 4096; i++) acc[i] = acc[i] * 0.5f + (float)(i ^ k);
    t_compute = pdp__now() - t0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_work_wait(w), pdp_status_name);
    t_wait = pdp__now() - t0 - t_compute;
    if (my_rank == 0)
        fprintf(test_out, "\n  async: launch %.3f ms, compute %.1f ms, wait after compute "
                "%.1f ms (peers launched 300 ms late; %d ranks)\n", t_launch * 1e3,
                t_compute * 1e3, t_wait * 1e3, world_size);
    ASSERTm("launching an all-reduce took more than 50 ms", t_launch < 0.05);
    if (my_rank == 0 && world_size > 1) ASSERTm("done before the peers arrived", !done_early);
    for (i = 0; i < n; i++) {
        float e = 0.0f;
        for (r = 0; r < world_size; r++) e += val(r, i);
        if (b[i] != e) {
            free(b);
            free(acc);
            FAILm("asynchronous all-reduce result differs");
        }
    }
    ASSERT(acc[1] == acc[1]); /* the compute is used */
    free(b);
    free(acc);
    PASS();
}

/* ---- MPI: DDP equals single-device training ---- */

enum { DDP_IN = 12, DDP_HID = 16, DDP_OUT = 5, DDP_BATCH = 24, DDP_STEPS = 6 };

static pdp_status ddp_model(pdp_model **out)
{
    pdp_model_desc d;
    pdp_status st;
    memset(&d, 0, sizeof d);
    d.input_shape[0] = DDP_IN;
    d.seed = 1234;
    if ((st = pdp_model_create(out, &d)) != PDP_OK) return st;
    if ((st = pdp_model_add_linear(*out, DDP_HID)) || (st = pdp_model_add_tanh(*out)) ||
        (st = pdp_model_add_linear(*out, DDP_HID)) || (st = pdp_model_add_relu(*out)) ||
        (st = pdp_model_add_linear(*out, DDP_OUT))) {
        pdp_model_free(*out);
        *out = NULL;
    }
    return st;
}

/* Step s's global batch: the same on every rank (seeded by the step). */
static void ddp_batch(int s, float *x, int32_t *y)
{
    pdp_rng r;
    int i;
    pdp_rng_seed(&r, 99, (uint64_t)s);
    for (i = 0; i < DDP_BATCH * DDP_IN; i++) x[i] = pdp_rng_normal(&r);
    for (i = 0; i < DDP_BATCH; i++) y[i] = (int32_t)pdp_rng_below(&r, DDP_OUT);
}

MPI_TEST(mpi_ddp_matches_single_device_and_ranks_agree)
{
    pdp_model *ref = NULL, *m = NULL;
    pdp_optim *oref = NULL, *o = NULL;
    pdp_ddp *ddp = NULL;
    pdp_ddp_desc dd;
    pdp_optim_desc od;
    pdp_tensor xr, xs, pr, pm;
    float x[DDP_BATCH * DDP_IN], loss, *all = NULL, maxdiff = 0.0f;
    int32_t y[DDP_BATCH];
    int64_t shape[2], np, i;
    int s, r, per = DDP_BATCH / world_size;
    if (DDP_BATCH % world_size) SKIPm("global batch 24 does not split over this many ranks");
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 0.01f;
    memset(&dd, 0, sizeof dd);
    dd.bucket_cap_mb = 0.0005; /* ~524 bytes: several buckets */
    dd.first_bucket_mb = 0.0002;
    ASSERT_ENUM_EQ(PDP_OK, ddp_model(&ref), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, ddp_model(&m), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oref, ref, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&ddp, m, cm, &dd), pdp_status_name);
    ASSERTm("expected several buckets", world_size == 1 || pdp_ddp_num_buckets(ddp) > 1);
    for (s = 0; s < DDP_STEPS; s++) {
        ddp_batch(s, x, y);
        shape[0] = DDP_BATCH;
        shape[1] = DDP_IN;
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xr), pdp_status_name);
        /* the reference: one device, the whole global batch */
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(ref, &xr, y, &loss), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oref), pdp_status_name);
        pdp_optim_zero_grad(oref);
        /* this rank's shard */
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(&xr, (int64_t)my_rank * per, per, &xs),
                       pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(ddp, &xs, y + my_rank * per, &loss),
                       pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_step(ddp, o), pdp_status_name);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(ref, &pr, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(m, &pm, NULL), pdp_status_name);
    np = pm.count;
    for (i = 0; i < np; i++) {
        float d = fabsf(pm.data[i] - pr.data[i]);
        if (d > maxdiff) maxdiff = d;
    }
    /* every rank's parameters, through MPI itself (not through pdp) */
    all = fbuf(np * world_size);
    MPI_Allgather(pm.data, (int)np, MPI_FLOAT, all, (int)np, MPI_FLOAT, MPI_COMM_WORLD);
    if (my_rank == 0)
        fprintf(test_out, "\n  ddp over mpi: %d ranks, %d steps of Adam, %lld params, %d "
                "buckets: max |ddp - single device| = %.3g\n", world_size, DDP_STEPS,
                (long long)np, pdp_ddp_num_buckets(ddp), (double)maxdiff);
    for (r = 1; r < world_size; r++)
        ASSERTm("ranks' parameters are not bit-identical",
                memcmp(all, all + (int64_t)r * np, (size_t)np * sizeof(float)) == 0);
    ASSERT_IN_RANGE(0.0, maxdiff, 2e-5);
    free(all);
    pdp_ddp_free(ddp);
    pdp_optim_free(o);
    pdp_optim_free(oref);
    pdp_model_free(m);
    pdp_model_free(ref);
    PASS();
}

/* ---- MPI: 16-bit reductions and the compression hook ---- */

/* DDP with the bf16 compression hook over MPI: one step's averaged gradients are within
   ddp.h's bound for MPI ((N + 1) u (1 + u) sum |g_r| / N: one rounding per input, N - 1
   in MPI's sum) of the exact average (fp32 single device on the global batch), every
   rank holds the same bits, and the bytes are half of fp32 DDP's. */
MPI_TEST(mpi_ddp_bf16_hook_within_the_bound_and_half_the_bytes)
{
    pdp_model *m = NULL, *loc = NULL, *ref = NULL;
    pdp_ddp *ddp = NULL, *d32 = NULL;
    pdp_ddp_desc dd;
    pdp_ddp_stats st16, st32;
    pdp_ddp_comm_hook h = pdp_ddp_hook_bf16_compress();
    pdp_tensor xr, xs;
    float x[DDP_BATCH * DDP_IN], loss, *locs = NULL, *all = NULL;
    int32_t y[DDP_BATCH];
    int64_t shape[2] = {DDP_BATCH, DDP_IN}, np, i;
    int r, per = DDP_BATCH / world_size;
    double u = 0x1p-8;
    if (DDP_BATCH % world_size) SKIPm("global batch 24 does not split over this many ranks");
    memset(&dd, 0, sizeof dd);
    dd.bucket_cap_mb = 0.0005;
    dd.first_bucket_mb = 0.0002;
    ASSERT_ENUM_EQ(PDP_OK, ddp_model(&ref), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, ddp_model(&loc), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, ddp_model(&m), pdp_status_name);
    ddp_batch(0, x, y);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xr), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(&xr, (int64_t)my_rank * per, per, &xs),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(ref, &xr, y, &loss), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(loc, &xs, y + my_rank * per, &loss),
                   pdp_status_name);
    np = m->param_count;
    locs = fbuf(np * world_size);
    all = fbuf(np * world_size);
    MPI_Allgather(loc->grad_block, (int)np, MPI_FLOAT, locs, (int)np, MPI_FLOAT, MPI_COMM_WORLD);
    /* fp32 DDP's bytes (on loc, whose gradients are no longer needed) */
    pdp_model_zero_grad(loc);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&d32, loc, cm, &dd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(d32, &xs, y + my_rank * per, &loss),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_finish(d32), pdp_status_name);
    pdp_ddp_get_stats(d32, &st32);
    /* bf16 DDP */
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&ddp, m, cm, &dd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_register_comm_hook(ddp, &h), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(ddp, &xs, y + my_rank * per, &loss),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_finish(ddp), pdp_status_name);
    pdp_ddp_get_stats(ddp, &st16);
    for (i = 0; i < np; i++) {
        double sabs = 0.0, bound;
        for (r = 0; r < world_size; r++) sabs += fabs((double)locs[(int64_t)r * np + i]);
        sabs /= world_size;
        bound = (world_size + 1) * u * (1.0 + u) * sabs + 0x1p-20 * sabs + 1e-7;
        if (fabs((double)m->grad_block[i] - ref->grad_block[i]) > bound) {
            fprintf(stderr, "rank %d param %lld: bf16 ddp %.9g, exact %.9g, bound %.3g\n",
                    my_rank, (long long)i, m->grad_block[i], ref->grad_block[i], bound);
            FAILm("bf16 DDP over MPI outside the stated bound");
        }
    }
    MPI_Allgather(m->grad_block, (int)np, MPI_FLOAT, all, (int)np, MPI_FLOAT, MPI_COMM_WORLD);
    for (r = 1; r < world_size; r++)
        ASSERTm("ranks' gradients are not bit-identical",
                memcmp(all, all + (int64_t)r * np, (size_t)np * sizeof(float)) == 0);
    if (world_size == 2) ASSERT_EQ(st32.bytes_sent, 2 * st16.bytes_sent);
    else ASSERT(llabs(st32.bytes_sent - 2 * st16.bytes_sent) <= 2 * pdp_ddp_num_buckets(ddp));
    if (my_rank == 0)
        fprintf(test_out, "\n  bf16 hook over mpi: %d ranks, bytes per step %lld (fp32 %lld)\n",
                world_size, (long long)st16.bytes_sent, (long long)st32.bytes_sent);
    free(locs);
    free(all);
    pdp_ddp_free(ddp);
    pdp_ddp_free(d32);
    pdp_model_free(m);
    pdp_model_free(loc);
    pdp_model_free(ref);
    PASS();
}

/* The timed-out messages' part of a test, run by one rank; the test then meets the
   other ranks whatever it returned, so that a failure here cannot hang them. */
static enum greatest_test_res unmatched_sends(pdp_comm *t, const float *b, int64_t n, int k0,
                                              int nsend, double *took)
{
    pdp_work *w[8];
    double t0 = pdp__now();
    char want[64];
    int k;
    for (k = 0; k < nsend; k++)
        ASSERT_ENUM_EQ(PDP_OK, pdp_comm_send(t, b, n, 1, k0 + k, &w[k]), pdp_status_name);
    for (k = 0; k < nsend; k++) { /* waited in order, as a pipeline drains */
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_ERR_TIMEOUT, pdp_work_wait(w[k]), pdp_status_name);
        snprintf(want, sizeof want, "(count %lld) to rank 1 with tag %d", (long long)n, k0 + k);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_work_wait: send #") != NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), want) != NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "no matching recv from rank 1 "
                                         "within 1 s") != NULL);
    }
    *took = pdp__now() - t0;
    ASSERT(*took >= 0.95);
    PASS();
}

/* Rank 1 receives what rank 0's timed-out sends left: OpenMPI cannot cancel a send, so
   the messages are still deliverable (an MPI that cancels sends times the receive out
   instead); received, they let rank 0 free its communicator cleanly (MPI is finalised at
   the end: main checks). */
static enum greatest_test_res drain_sends(pdp_comm *t, const float *b, int64_t n, int k0,
                                          int nsend)
{
    float *got = fbuf(n);
    pdp_status st;
    int k;
    for (k = 0; k < nsend; k++) {
        memset(got, 0, (size_t)n * sizeof *got);
        st = pdp_comm_recv(t, got, n, 0, k0 + k, NULL);
        if (st != PDP_OK && st != PDP_ERR_TIMEOUT) break;
        if (st == PDP_OK && memcmp(got, b, (size_t)n * sizeof *b) != 0) st = PDP_ERR_STATE;
        if (st == PDP_ERR_STATE) break;
    }
    free(got);
    ASSERTm(pdp_last_error(), k == nsend);
    PASS();
}

/* issue 21, item 15: sends that time out together (a pipeline whose peer died) fail
   together: their cancel graces overlap. Each of K = 4 sends of 400 KB (above every
   eager limit) waits timeout_s = 1 s and a cancel grace of 1 s that OpenMPI never
   confirms; waited in order, the last one failed after K graces (5 s: each grace held
   the point-to-point lock). With slack, the bound is 3.5 s; overlapped it takes 2 s. */
MPI_TEST(mpi_p2p_timed_out_sends_cancel_together)
{
    enum { K = 4 };
    const int64_t n = 100000;
    float *b = fbuf(n);
    pdp_comm *t = NULL;
    enum greatest_test_res res = GREATEST_TEST_RES_PASS;
    double took = 0.0;
    int64_t i;
    if (world_size < 2) {
        free(b);
        SKIPm("needs at least 2 ranks");
    }
    for (i = 0; i < n; i++) b[i] = val(0, i);
    ASSERT_ENUM_EQ(PDP_OK, make_comm(&t, "p2p", 1.0), pdp_status_name);
    if (my_rank == 0) {
        res = unmatched_sends(t, b, n, 20, K, &took);
        fprintf(test_out, "\n  %d sends timed out after %.2f s (timeout 1 s, cancel grace 1 s)\n",
                K, took);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (my_rank == 1) res = drain_sends(t, b, n, 20, K);
    MPI_Barrier(MPI_COMM_WORLD);
    pdp_comm_free(t);
    free(b);
    if (res != GREATEST_TEST_RES_PASS) return res; /* the helper's assertion */
    ASSERTm("the sends' cancel graces did not overlap", took < 3.5);
    PASS();
}

/* ---- MPI: the GPT under DDP, ZeRO-3 and a pipeline equals one device ---- */

/* A GPT of 2 blocks (vocab 13, T 8, dim 24, 12 heads of 2 features: TP over 1, 2, 3, 4 and
   6 ranks; dropout 0.1), 12 sequences a step, each with one -1 target (every rank's share
   holds as many, so the mean of the ranks' means is the batch's), 2 AdamW steps with
   clipping at 0.5 */
enum { MG_B = 12, MG_T = 8, MG_HEADS = 12, MG_STEPS = 2 };

static pdp_gpt_desc mg_desc(void)
{
    pdp_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.vocab = 13, d.context = MG_T, d.layers = 2, d.heads = MG_HEADS, d.dim = 24, d.seed = 5;
    d.dropout = 0.1f;
    return d;
}

static pdp_status mg_model(pdp_model **out)
{
    pdp_gpt_desc d = mg_desc();
    return pdp_gpt_create(out, &d);
}

static void mg_batch(int s, int32_t *ids, int32_t *tg)
{
    int i;
    for (i = 0; i < MG_B * MG_T; i++) {
        ids[i] = (int32_t)((i * 7 + 3 * s + 1) % 13);
        tg[i] = i % MG_T == 5 ? -1 : (int32_t)((i * 5 + s) % 13);
    }
}

static pdp_optim_desc mg_adamw(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 1e-3, od.weight_decay = 0.1;
    return od;
}

/* The single-device model after the steps. */
static pdp_status mg_reference(pdp_model **ref)
{
    pdp_optim *o = NULL;
    pdp_optim_desc od = mg_adamw();
    int32_t ids[MG_B * MG_T], tg[MG_B * MG_T];
    int64_t shape[2] = {MG_B, MG_T};
    pdp_tensor x;
    float loss, norm;
    int s;
    pdp_status st;
    if ((st = mg_model(ref)) != PDP_OK || (st = pdp_optim_create(&o, *ref, &od)) != PDP_OK)
        return st;
    for (s = 0; s < MG_STEPS && st == PDP_OK; s++) {
        mg_batch(s, ids, tg);
        pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
        if ((st = pdp_model_forward_backward(*ref, &x, tg, &loss)) == PDP_OK &&
            (st = pdp_clip_grad_norm(*ref, 0.5f, &norm)) == PDP_OK)
            st = pdp_optim_step(o);
        pdp_optim_zero_grad(o);
    }
    pdp_optim_free(o);
    return st;
}

MPI_TEST(mpi_gpt_under_ddp_zero3_and_a_pipeline_equals_one_device)
{
    pdp_model *ref = NULL;
    pdp_tensor pr;
    int32_t ids[MG_B * MG_T], tg[MG_B * MG_T];
    int64_t per = MG_B / world_size, shape[2] = {MG_B / world_size, MG_T}, i;
    int kind, s;
    if (MG_B % world_size) SKIPm("12 sequences do not split over this many ranks");
    ASSERT_ENUM_EQ(PDP_OK, mg_reference(&ref), pdp_status_name);
    pdp_model_flat(ref, &pr, NULL);
    for (kind = 0; kind < 3; kind++) { /* DDP, ZeRO-3, a pipeline of world_size stages */
        pdp_model *m = NULL;
        pdp_ddp *ddp = NULL;
        pdp_zero *z = NULL;
        pdp_pp *pp = NULL;
        pdp_optim *o = NULL;
        pdp_optim_desc od = mg_adamw();
        pdp_zero_desc zd;
        float *mine = NULL, loss, norm;
        pdp_tensor x;
        double worst = 0.0;
        ASSERT_ENUM_EQ(PDP_OK, mg_model(&m), pdp_status_name);
        memset(&zd, 0, sizeof zd);
        zd.stage = 3;
        if (kind == 0) {
            ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&ddp, m, cm, NULL), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
        } else if (kind == 1) {
            ASSERT_ENUM_EQ(PDP_OK, pdp_zero_create(&z, m, cm, &zd), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_zero_optim_create(&o, z, &od), pdp_status_name);
        } else {
            ASSERT_ENUM_EQ(PDP_OK, pdp_pp_create(&pp, m, cm, NULL), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, pdp_pp_model(pp), &od), pdp_status_name);
        }
        for (s = 0; s < MG_STEPS; s++) {
            mg_batch(s, ids, tg);
            if (kind == 2) { /* the whole batch, cut into micro-batches */
                int64_t whole[2] = {MG_B, MG_T};
                pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, whole, &x);
                ASSERT_ENUM_EQ(PDP_OK, pdp_pp_forward_backward(pp, &x, tg, &loss),
                               pdp_status_name);
                ASSERT_ENUM_EQ(PDP_OK, pdp_pp_clip_grad_norm(pp, 0.5f, &norm), pdp_status_name);
                ASSERT_ENUM_EQ(PDP_OK, pdp_pp_step(pp, o), pdp_status_name);
                continue;
            }
            pdp_tensor_wrap_ids(ids + my_rank * per * MG_T, pdp_cpu(), 2, shape, &x);
            if (kind == 0) {
                ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(ddp, &x, tg + my_rank * per * MG_T,
                                                                &loss), pdp_status_name);
                ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_finish(ddp), pdp_status_name);
                ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(m, 0.5f, &norm), pdp_status_name);
                ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), pdp_status_name);
                pdp_optim_zero_grad(o);
            } else {
                ASSERT_ENUM_EQ(PDP_OK, pdp_zero_forward_backward(z, &x, tg + my_rank * per * MG_T,
                                                                 &loss), pdp_status_name);
                ASSERT_ENUM_EQ(PDP_OK, pdp_zero_finish(z), pdp_status_name);
                ASSERT_ENUM_EQ(PDP_OK, pdp_zero_clip_grad_norm(z, 0.5f, &norm), pdp_status_name);
                ASSERT_ENUM_EQ(PDP_OK, pdp_zero_step(z, o), pdp_status_name);
            }
        }
        if (kind < 2) { /* the full parameters against one device's */
            mine = fbuf(pr.count);
            if (kind == 0) memcpy(mine, m->param_block, (size_t)pr.count * sizeof(float));
            else ASSERT_ENUM_EQ(PDP_OK, pdp_zero_gather_params(z, mine), pdp_status_name);
            for (i = 0; i < pr.count; i++) {
                double e = fabs((double)mine[i] - pr.data[i]);
                if (e > worst) worst = e;
            }
        } else { /* this stage's tensors, by name (the last stage's copy of wte too) */
            pdp_model *st = pdp_pp_model(pp);
            int p;
            for (p = 0; p < pdp_model_num_params(st); p++) {
                pdp_param a, b;
                pdp_model_param(st, p, &a);
                ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(ref, a.name, &b), pdp_status_name);
                for (i = 0; i < a.count; i++) {
                    double e = fabs((double)a.value.data[i] - b.value.data[i]);
                    if (e > worst) worst = e;
                }
            }
        }
        free(mine);
        ASSERTm(kind == 0 ? "DDP" : kind == 1 ? "ZeRO-3" : "pipeline", worst <= 1e-5);
        pdp_optim_free(o);
        pdp_ddp_free(ddp);
        pdp_zero_free(z);
        pdp_pp_free(pp);
        pdp_model_free(m);
    }
    pdp_model_free(ref);
    PASS();
}

/* The same GPT, its blocks tensor parallel over every rank (the 12 heads split: 1-4 ranks),
   with and without sequence parallelism (the 8 positions split: 1, 2 and 4 ranks), and
   recomputing (TP selective, TP + SP full; the reference recomputes nothing): the
   whole batch on every rank, the same 2 AdamW steps with clipping; the full-tensor
   checkpoint the TP ranks write together (pdp_tp_checkpoint_save) loads into one device's
   GPT and equals the reference. */
MPI_TEST(mpi_gpt_tensor_and_sequence_parallel_equal_one_device)
{
    pdp_model *ref = NULL;
    pdp_tensor pr;
    int32_t ids[MG_B * MG_T], tg[MG_B * MG_T];
    int64_t whole[2] = {MG_B, MG_T}, i;
    char path[300], what[64];
    static const char *rc_name[] = {"", ", recompute selective", ", recompute full"};
    static const struct { int sp; pdp_recompute rc; } runs[] = {
        {0, PDP_RECOMPUTE_NONE}, {1, PDP_RECOMPUTE_NONE}, {0, PDP_RECOMPUTE_SELECTIVE},
        {1, PDP_RECOMPUTE_FULL}};
    int run, sp, s;
    if (MG_HEADS % world_size) SKIPm("12 heads do not split over this many ranks");
    ASSERT_ENUM_EQ(PDP_OK, mg_reference(&ref), pdp_status_name);
    pdp_model_flat(ref, &pr, NULL);
    for (run = 0; run < (int)(sizeof runs / sizeof runs[0]); run++) {
        pdp_model *m = NULL, *one = NULL;
        pdp_optim *o = NULL;
        pdp_optim_desc od = mg_adamw();
        pdp_gpt_desc d;
        pdp_tensor x, po;
        float loss, norm;
        double worst = 0.0;
        sp = runs[run].sp;
        if (sp && MG_T % world_size) continue; /* 8 positions: SP at 1, 2 and 4 ranks */
        snprintf(what, sizeof what, "%s%s", sp ? "tp + sp" : "tp", rc_name[runs[run].rc]);
        d = mg_desc();
        d.tp = cm, d.sequence_parallel = sp != 0, d.recompute = runs[run].rc;
        ASSERT_ENUM_EQ(PDP_OK, pdp_gpt_create(&m, &d), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
        for (s = 0; s < MG_STEPS; s++) {
            mg_batch(s, ids, tg);
            pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, whole, &x);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &x, tg, &loss), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(m, 0.5f, &norm), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), pdp_status_name);
            pdp_optim_zero_grad(o);
        }
        snprintf(path, sizeof path, "/tmp/pdp_test_mpi_gpt_tp_%d.safetensors", (int)getppid());
        ASSERT_ENUM_EQ(PDP_OK, pdp_tp_checkpoint_save(path, m, NULL), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, mg_model(&one), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(path, one, NULL), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_comm_barrier(cm, NULL), pdp_status_name);
        if (my_rank == 0) remove(path);
        pdp_model_flat(one, &po, NULL);
        ASSERT_EQ(pr.count, po.count);
        for (i = 0; i < pr.count; i++) {
            double e = fabs((double)po.data[i] - pr.data[i]);
            if (e > worst) worst = e;
        }
        if (my_rank == 0)
            fprintf(test_out, "\n  gpt %s over mpi: %d ranks, %d AdamW steps: max |tp - single "
                    "device| = %.3g\n", what, world_size, MG_STEPS, worst);
        ASSERTm(what, worst <= 1e-5);
        pdp_model_free(one);
        pdp_optim_free(o);
        pdp_model_free(m);
    }
    pdp_model_free(ref);
    PASS();
}

/* DP x TP = 2 x 2 on 4 ranks (TP pairs of neighbours, DP across them), sequence parallel,
   each recomputation mode, the GPT under DDP or ZeRO stage 1, 2 or 3 over the DP group
   (stage 3 a unit per layer): each DP copy trains on its 6 of the 12 sequences, clipping
   after the DP average; each rank's TP slices equal their cuts of one device's tensors
   (relative error, fixture.h), which recomputes nothing. The MPI form of
   test_gpt_sp.c's gpt_sp_under_ddp_and_zero_equals_one_device (issue 25's covering set). */
MPI_TEST(mpi_gpt_dp_x_tp_sequence_parallel_under_ddp_and_zero_equals_one_device)
{
    pdp_model *ref = NULL;
    pdp_comm *tp = NULL, *dc = NULL;
    int32_t ids[MG_B * MG_T], tg[MG_B * MG_T];
    int64_t per = MG_B / 2, shape[2] = {MG_B / 2, MG_T};
    int dp = my_rank / 2, zero, s;
    pdp_recompute rc;
    if (world_size != 4) SKIPm("DP 2 x TP 2 runs on 4 ranks");
    ASSERT_ENUM_EQ(PDP_OK, mg_reference(&ref), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_split(cm, dp, my_rank % 2, &tp), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_split(cm, my_rank % 2, dp, &dc), pdp_status_name);
    for (zero = 0; zero <= 3; zero++)
        for (rc = PDP_RECOMPUTE_NONE; rc <= PDP_RECOMPUTE_FULL; rc = (pdp_recompute)(rc + 1)) {
            pdp_model *m = NULL;
            pdp_ddp *ddp = NULL;
            pdp_zero *z = NULL;
            pdp_optim *o = NULL;
            pdp_optim_desc od = mg_adamw();
            pdp_zero_desc zd;
            pdp_gpt_desc d = mg_desc();
            pdp_tensor x;
            float loss, norm;
            double worst = 0.0;
            char what[80];
            snprintf(what, sizeof what, "%s%d x TP 2 + SP, recompute %d",
                     zero ? "ZeRO-" : "DDP ", zero ? zero : 2, (int)rc);
            d.tp = tp, d.sequence_parallel = true, d.recompute = rc;
            memset(&zd, 0, sizeof zd);
            zd.stage = zero;
            zd.bucket_cap_mb = zero == 3 ? 1e-9 : 0.0; /* stage 3: a unit per layer */
            ASSERT_ENUM_EQm(what, PDP_OK, pdp_gpt_create(&m, &d), pdp_status_name);
            if (zero) {
                ASSERT_ENUM_EQm(what, PDP_OK, pdp_zero_create(&z, m, dc, &zd), pdp_status_name);
                ASSERT_ENUM_EQm(what, PDP_OK, pdp_zero_optim_create(&o, z, &od), pdp_status_name);
            } else {
                ASSERT_ENUM_EQm(what, PDP_OK, pdp_ddp_create(&ddp, m, dc, NULL), pdp_status_name);
                ASSERT_ENUM_EQm(what, PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
            }
            for (s = 0; s < MG_STEPS; s++) {
                mg_batch(s, ids, tg);
                pdp_tensor_wrap_ids(ids + dp * per * MG_T, pdp_cpu(), 2, shape, &x);
                if (zero) {
                    ASSERT_ENUM_EQm(what, PDP_OK, pdp_zero_forward_backward(z, &x, tg + dp * per * MG_T,
                                                                            &loss), pdp_status_name);
                    ASSERT_ENUM_EQm(what, PDP_OK, pdp_zero_finish(z), pdp_status_name);
                    ASSERT_ENUM_EQm(what, PDP_OK, pdp_zero_clip_grad_norm(z, 0.5f, &norm), pdp_status_name);
                    ASSERT_ENUM_EQm(what, PDP_OK, pdp_zero_step(z, o), pdp_status_name);
                } else {
                    ASSERT_ENUM_EQm(what, PDP_OK, pdp_ddp_forward_backward(ddp, &x, tg + dp * per * MG_T,
                                                                           &loss), pdp_status_name);
                    ASSERT_ENUM_EQm(what, PDP_OK, pdp_ddp_finish(ddp), pdp_status_name);
                    ASSERT_ENUM_EQm(what, PDP_OK, pdp_clip_grad_norm(m, 0.5f, &norm), pdp_status_name);
                    ASSERT_ENUM_EQm(what, PDP_OK, pdp_optim_step(o), pdp_status_name);
                    pdp_optim_zero_grad(o);
                }
            }
            if (zero == 3) /* the rank's TP slices, whole, into its block */
                ASSERT_ENUM_EQm(what, PDP_OK, pdp_zero_gather_params(z, NULL), pdp_status_name);
            /* each TP slice against its cut of one device's tensor, by name */
            ASSERT_ENUM_EQm(what, PDP_OK, fixture_worst_by_name(m, ref, &worst), pdp_status_name);
            if (my_rank == 0)
                fprintf(test_out, "\n  gpt %s over mpi: largest relative error against one "
                        "device %.3g\n", what, worst);
            ASSERTm(what, worst <= 1e-5);
            pdp_optim_free(o);
            pdp_ddp_free(ddp);
            pdp_zero_free(z);
            pdp_model_free(m);
        }
    pdp_comm_free(dc);
    pdp_comm_free(tp);
    pdp_model_free(ref);
    PASS();
}

/* ---- MPI: ZeRO stages 1-3 equal single-device training ---- */

MPI_TEST(mpi_zero_matches_single_device_and_ranks_agree)
{
    int stage;
    int per = DDP_BATCH / world_size;
    if (DDP_BATCH % world_size) SKIPm("global batch 24 does not split over this many ranks");
    for (stage = 1; stage <= 3; stage++) {
        pdp_model *ref = NULL, *m = NULL;
        pdp_optim *oref = NULL, *o = NULL;
        pdp_zero *z = NULL;
        pdp_zero_desc zd;
        pdp_zero_stats zs;
        pdp_optim_desc od;
        pdp_tensor xr, xs, pr;
        float x[DDP_BATCH * DDP_IN], loss, *all = NULL, *mine = NULL, maxdiff = 0.0f;
        int32_t y[DDP_BATCH];
        int64_t shape[2], np, i;
        int s, r;
        memset(&od, 0, sizeof od);
        od.kind = PDP_OPTIM_ADAM;
        od.lr = 0.01f;
        memset(&zd, 0, sizeof zd);
        zd.stage = stage;
        zd.bucket_cap_mb = 0.0005;
        zd.first_bucket_mb = 0.0002;
        ASSERT_ENUM_EQ(PDP_OK, ddp_model(&ref), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, ddp_model(&m), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oref, ref, &od), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_zero_create(&z, m, cm, &zd), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_zero_optim_create(&o, z, &od), pdp_status_name);
        for (s = 0; s < DDP_STEPS; s++) {
            ddp_batch(s, x, y);
            shape[0] = DDP_BATCH;
            shape[1] = DDP_IN;
            ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xr), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(ref, &xr, y, &loss),
                           pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oref), pdp_status_name);
            pdp_optim_zero_grad(oref);
            ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(&xr, (int64_t)my_rank * per, per, &xs),
                           pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_zero_forward_backward(z, &xs, y + my_rank * per, &loss),
                           pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_zero_step(z, o), pdp_status_name);
        }
        pdp_zero_get_stats(z, &zs);
        ASSERT_EQ(zs.formula_bytes, zs.bytes_sent);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(ref, &pr, NULL), pdp_status_name);
        np = pr.count;
        mine = fbuf(np);
        ASSERT_ENUM_EQ(PDP_OK, pdp_zero_gather_params(z, mine), pdp_status_name);
        for (i = 0; i < np; i++) {
            float d = fabsf(mine[i] - pr.data[i]);
            if (d > maxdiff) maxdiff = d;
        }
        all = fbuf(np * world_size);
        MPI_Allgather(mine, (int)np, MPI_FLOAT, all, (int)np, MPI_FLOAT, MPI_COMM_WORLD);
        if (my_rank == 0)
            fprintf(test_out, "\n  zero stage %d over mpi: %d ranks, %d units: max |zero - single "
                    "device| = %.3g, %lld bytes sent per step\n", stage, world_size,
                    pdp_zero_num_units(z), (double)maxdiff, (long long)zs.bytes_sent);
        for (r = 1; r < world_size; r++)
            ASSERTm("ranks' parameters are not bit-identical",
                    memcmp(all, all + (int64_t)r * np, (size_t)np * sizeof(float)) == 0);
        ASSERT_IN_RANGE(0.0, maxdiff, 2e-5);
        free(all);
        free(mine);
        pdp_zero_free(z);
        pdp_optim_free(o);
        pdp_optim_free(oref);
        pdp_model_free(m);
        pdp_model_free(ref);
    }
    PASS();
}

/* ---- MPI: pipeline parallel ---- */

/* Trains ddp_model's MLP (5 layers) for DDP_STEPS steps of Adam on pc as a pipeline (this
   rank: one stage; with dc, DP x PP: this pipeline takes its share of the global batch)
   and compares this stage's parameters, by name, with one device trained on the whole
   batches: *worst = max |pp - single|, *scale = max |single|. */
static enum greatest_test_res pp_run(pdp_comm *pc, pdp_comm *dc, pdp_pp_schedule sch, int m,
                                     double *worst, double *scale)
{
    pdp_model *ref = NULL, *full = NULL, *sm;
    pdp_optim *oref = NULL, *o = NULL;
    pdp_pp *pp = NULL;
    pdp_pp_desc pd;
    pdp_optim_desc od;
    pdp_tensor xr, xs, pr;
    float x[DDP_BATCH * DDP_IN], loss;
    int32_t y[DDP_BATCH];
    int64_t shape[2] = {DDP_BATCH, DDP_IN}, rows, row0, i;
    int s, q;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 0.01f;
    memset(&pd, 0, sizeof pd);
    pd.schedule = sch;
    pd.micro_batches = m;
    pd.dp = dc;
    rows = DDP_BATCH / (dc ? pdp_comm_size(dc) : 1);
    row0 = dc ? pdp_comm_rank(dc) * rows : 0;
    ASSERT_ENUM_EQ(PDP_OK, ddp_model(&ref), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, ddp_model(&full), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oref, ref, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_pp_create(&pp, full, pc, &pd), pdp_status_name);
    pdp_model_free(full);
    sm = pdp_pp_model(pp);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, sm, &od), pdp_status_name);
    for (s = 0; s < DDP_STEPS; s++) {
        ddp_batch(s, x, y);
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xr), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(ref, &xr, y, &loss), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oref), pdp_status_name);
        pdp_optim_zero_grad(oref);
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(&xr, row0, rows, &xs), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_pp_forward_backward(pp, &xs, y + row0, &loss),
                       pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_pp_step(pp, o), pdp_status_name);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(ref, &pr, NULL), pdp_status_name);
    *scale = *worst = 0.0;
    for (i = 0; i < pr.count; i++) *scale = fmax(*scale, fabs((double)pr.data[i]));
    for (q = 0; q < pdp_model_num_params(sm); q++) {
        pdp_param a, r;
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_param(sm, q, &a), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(ref, a.name, &r), pdp_status_name);
        for (i = 0; i < a.value.count; i++)
            *worst = fmax(*worst, fabs((double)a.value.data[i] - r.value.data[i]));
    }
    pdp_optim_free(o);
    pdp_pp_free(pp);
    pdp_optim_free(oref);
    pdp_model_free(ref);
    PASS();
}

/* A pipeline of world_size stages (the MLP split by parameter count), GPipe and 1F1B, even
   and uneven micro-batches: every stage equals single-device training on the whole batch. */
MPI_TEST(mpi_pp_matches_single_device)
{
    static const int ms[] = {1, 3, 4, 7};
    double worst, scale;
    size_t k;
    int sch;
    for (sch = 0; sch < 2; sch++)
        for (k = 0; k < sizeof ms / sizeof *ms; k++) {
            CHECK_CALL(pp_run(cm, NULL, sch ? PDP_PP_GPIPE : PDP_PP_1F1B, ms[k], &worst, &scale));
            if (worst > 1e-5 * scale) {
                fprintf(stderr, "rank %d: pp over mpi, %s, m %d: max |pp - single| %g, max "
                        "|single| %g\n", my_rank, sch ? "gpipe" : "1f1b", ms[k], worst, scale);
                FAILm("a stage differs from single-device training on the whole batch");
            }
        }
    if (my_rank == 0)
        fprintf(test_out, "\n  pp over mpi: %d stages, gpipe and 1f1b, m = 1, 3, 4, 7: every "
                "stage within 1e-5 of single-device training\n", world_size);
    PASS();
}

/* 4 ranks as 2 pipelines x 2 stages (pdp_comm_split), DDP-style averaging across the
   pipelines: equal to single-device training on the global batch. */
MPI_TEST(mpi_pp_2d_dp_x_pp_matches_single_device)
{
    pdp_comm *pc = NULL, *dc = NULL;
    double worst, scale;
    enum greatest_test_res r;
    if (world_size != 4) SKIPm("DP x PP runs on 4 ranks (2 x 2)");
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_split(cm, my_rank / 2, my_rank, &pc), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_split(cm, my_rank % 2, my_rank, &dc), pdp_status_name);
    r = pp_run(pc, dc, PDP_PP_1F1B, 3, &worst, &scale);
    pdp_comm_free(pc);
    pdp_comm_free(dc);
    if (r != GREATEST_TEST_RES_PASS) return r;
    if (worst > 1e-5 * scale) {
        fprintf(stderr, "rank %d: dp x pp over mpi: max |pp - single| %g, max |single| %g\n",
                my_rank, worst, scale);
        FAILm("a stage differs from single-device training on the global batch");
    }
    PASS();
}

/* ---- MPI: trace ---- */

MPI_TEST(mpi_trace_has_collectives_per_rank)
{
    char base[256], mine[300], cmd[1024], *p;
    pdp_comm *t = NULL;
    float b[3] = {1, 2, 3};
    int rc;
    const char *py = pdp_test_python("json");
    if (!py) SKIPm(pdp_test_python_missing("json"));
    if (my_rank == 0) snprintf(base, sizeof base, "/tmp/pdp_mpi_trace.%ld.json", (long)getpid());
    MPI_Bcast(base, sizeof base, MPI_CHAR, 0, MPI_COMM_WORLD);
    setenv("PDP_TRACE", base, 1);
    ASSERT_ENUM_EQ(PDP_OK, make_comm(&t, "traced", 20.0), pdp_status_name);
    unsetenv("PDP_TRACE");
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_allreduce(t, b, 3, PDP_REDUCE_SUM, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_broadcast(t, b, 3, 0, NULL), pdp_status_name);
    pdp_comm_free(t);
    ASSERT_ENUM_EQ(PDP_OK, pdp_trace_flush(), pdp_status_name); /* world holds the sink open */
    snprintf(mine, sizeof mine, "%s", base);
    p = strrchr(mine, '.');
    if (world_size > 1) snprintf(p, sizeof mine - (size_t)(p - mine), ".rank%d.json", my_rank);
    snprintf(trace_file, sizeof trace_file, "%s", mine);
    snprintf(cmd, sizeof cmd,
             "\"%s\" -c 'import json,sys\n"
             "ev=json.load(open(sys.argv[1]))[\"traceEvents\"]\n"
             "r=int(sys.argv[2])\n"
             "x=[e for e in ev if e[\"ph\"]==\"X\" and e[\"pid\"]==r]\n"
             "names=[e[\"name\"] for e in x]\n"
             "th=[e for e in ev if e[\"ph\"]==\"M\" and e[\"name\"]==\"thread_name\"]\n"
             "ok=names==[\"allreduce\",\"broadcast\"] and all(e[\"dur\"]>=0 for e in x)\n"
             "ok=ok and any(e[\"args\"][\"name\"]==\"comm traced (mpi)\" for e in th)\n"
             "ok=ok and sum(1 for e in ev if e[\"ph\"]==\"b\")==2\n"
             "sys.exit(0 if ok else 1)' '%s' %d", py, mine, my_rank);
    rc = system(cmd);
    ASSERT_EQm("trace file invalid or missing the rank's collectives", 0, rc);
    PASS();
}

/* ---- MPI: a rank that does not arrive ---- */

/* Rank 1 does not create the communicator in time: the others' creation fails
   with PDP_ERR_TIMEOUT after about timeout_s instead of hanging in the
   duplication. Rank 1 then creates it late, once every other rank has timed out
   (a go from each: after rank 0's alone, a slower rank 2 still waiting saw its
   duplication complete), which completes the orphaned duplications (pdp frees
   them before MPI_Finalize). */
MPI_TEST(mpi_init_env_times_out_when_a_rank_is_missing)
{
    pdp_comm *x = NULL;
    pdp_status st;
    double t0, t;
    int go = 1, r;
    if (world_size < 2) SKIPm("needs at least 2 ranks");
    if (my_rank == 1) {
        for (r = 0; r < world_size; r++)
            if (r != 1) MPI_Recv(&go, 1, MPI_INT, r, 78, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        ASSERT_ENUM_EQ(PDP_OK, make_comm(&x, "late-init", 20.0), pdp_status_name);
        pdp_comm_free(x);
        PASS();
    }
    t0 = pdp__now();
    st = make_comm(&x, "never", 1.0);
    t = pdp__now() - t0;
    MPI_Send(&go, 1, MPI_INT, 1, 78, MPI_COMM_WORLD); /* timed out (or not): rank 1 may go */
    ASSERT_ENUM_EQ(PDP_ERR_TIMEOUT, st, pdp_status_name);
    ASSERT(x == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_comm_init_env") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "did not call pdp_comm_init_env") != NULL);
    ASSERTm("timed out too early", t >= 0.95);
    ASSERTm("took more than 2 s to time out", t < 2.0);
    PASS();
}

/* ---- MPI: tensor parallel (tp.h) ----
   A model of two TP blocks with widths 10 and 7 (uneven over 3 and 4 ranks) against the
   single-device model on the same batches (the DDP test's data): TP over every rank, then
   its full-tensor checkpoint, loaded on one device and back into the TP layout; and 2-D:
   DDP across groups x TP inside (2 x 2 on 4 ranks, 1 x 2 on 2, 3 x 1 on 3). */

enum { TP_H1 = 10, TP_H2 = 7, TP_STEPS = 4 };

/* tp == NULL: the single-device model Linear(10) Tanh Linear(12) ReLU Linear(7) GELU
   Linear(5); otherwise the same with both Linear pairs as TP blocks on tp. */
static pdp_status tp_model(pdp_model **out, pdp_comm *tp)
{
    pdp_model_desc d;
    pdp_model *m = NULL;
    pdp_status st;
    memset(&d, 0, sizeof d);
    d.input_shape[0] = DDP_IN;
    d.seed = 4321;
    *out = NULL;
    if ((st = pdp_model_create(&m, &d)) != PDP_OK) return st;
    if (!tp)
        (void)((st = pdp_model_add_linear(m, TP_H1)) || (st = pdp_model_add_tanh(m)) ||
               (st = pdp_model_add_linear(m, DDP_IN)) || (st = pdp_model_add_relu(m)) ||
               (st = pdp_model_add_linear(m, TP_H2)) || (st = pdp_model_add_gelu(m)) ||
               (st = pdp_model_add_linear(m, DDP_OUT)));
    else
        (void)((st = pdp_model_set_tp(m, tp)) || (st = pdp_model_add_tp_copy(m)) ||
               (st = pdp_model_add_column_parallel_linear(m, TP_H1)) ||
               (st = pdp_model_add_tanh(m)) ||
               (st = pdp_model_add_row_parallel_linear(m, DDP_IN)) ||
               (st = pdp_model_add_tp_reduce(m)) || (st = pdp_model_add_relu(m)) ||
               (st = pdp_model_add_tp_copy(m)) ||
               (st = pdp_model_add_column_parallel_linear(m, TP_H2)) ||
               (st = pdp_model_add_gelu(m)) ||
               (st = pdp_model_add_row_parallel_linear(m, DDP_OUT)) ||
               (st = pdp_model_add_tp_reduce(m)));
    if (st != PDP_OK) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

/* Worst |slice - full| over a TP model's parameters against the single-device model
   `full` (same registry order), by the layout tp.h states. */
static double tp_worst(const pdp_model *m, const pdp_model *full, double *scale)
{
    double worst = 0.0;
    int p;
    int64_t i, lo, n, k;
    *scale = 0.0;
    for (p = 0; p < m->nparams; p++) {
        const pdp__param_entry *e = &m->params[p];
        const pdp__layer *l = &m->layers[e->layer];
        const float *f = full->param_block + full->params[p].offset;
        pdp_tp_split(l->tp_full, m->tp.rank, m->tp.size, &lo, &n);
        for (i = 0; i < e->count; i++) {
            if (l->kind == PDP__COLUMN_PARALLEL_LINEAR)
                k = (p == l->param_first ? lo * l->in_count : lo) + i;
            else if (l->kind == PDP__ROW_PARALLEL_LINEAR && p == l->param_first)
                k = (i / n) * l->tp_full + lo + i % n;
            else
                k = i;
            worst = fmax(worst, fabs((double)m->param_block[e->offset + i] - f[k]));
            *scale = fmax(*scale, fabs((double)f[k]));
        }
    }
    return worst;
}

/* steps of Adam from step `first` on the plain model ref (whole batch) and on the TP
   model m (DDP over dp when not NULL: this DP rank's shard of dp_size). */
static enum greatest_test_res tp_train(pdp_model *ref, pdp_optim *oref, pdp_model *m,
                                       pdp_optim *o, pdp_ddp *ddp, int dp_rank, int dp_size)
{
    float x[DDP_BATCH * DDP_IN], loss;
    int32_t y[DDP_BATCH];
    int64_t shape[2] = {DDP_BATCH, DDP_IN};
    int s, per = DDP_BATCH / dp_size;
    pdp_tensor xr, xs;
    for (s = 0; s < TP_STEPS; s++) {
        ddp_batch(s, x, y);
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xr), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(ref, &xr, y, &loss), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oref), pdp_status_name);
        pdp_optim_zero_grad(oref);
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(&xr, (int64_t)dp_rank * per, per, &xs),
                       pdp_status_name);
        if (ddp) {
            ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_forward_backward(ddp, &xs, y + dp_rank * per, &loss),
                           pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_step(ddp, o), pdp_status_name);
        } else {
            ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, &xs, y, &loss), pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), pdp_status_name);
            pdp_optim_zero_grad(o);
        }
    }
    PASS();
}

MPI_TEST(mpi_tp_matches_single_device_and_checkpoints_full_tensors)
{
    pdp_model *ref = NULL, *m = NULL, *one = NULL;
    pdp_optim *oref = NULL, *o = NULL;
    pdp_optim_desc od;
    pdp_tp_stats ts;
    char path[300];
    float *before;
    double worst, scale;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 0.01f;
    ASSERT_ENUM_EQ(PDP_OK, tp_model(&ref, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, tp_model(&m, cm), pdp_status_name);
    ASSERT_EQ(0.0, tp_worst(m, ref, &scale)); /* the slices of the same initialisation */
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oref, ref, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
    CHECK_CALL(tp_train(ref, oref, m, o, NULL, 0, 1));
    worst = tp_worst(m, ref, &scale);
    pdp_tp_get_stats(m, &ts);
    if (my_rank == 0)
        fprintf(test_out, "\n  tp over mpi: %d ranks, %d steps of Adam: max |tp - single device|"
                " = %.3g; %lld bytes sent per rank per step\n", world_size, TP_STEPS, worst,
                (long long)(ts.bytes_sent / TP_STEPS));
    ASSERT(worst <= 1e-5 * scale);
    ASSERT_EQ((int64_t)TP_STEPS * 2, ts.forward_allreduces);
    ASSERT_EQ((int64_t)TP_STEPS, ts.backward_allreduces);
    /* the full-tensor checkpoint: one device loads it, and so does the TP layout */
    snprintf(path, sizeof path, "/tmp/pdp_test_mpi_tp_%d.safetensors", (int)getppid());
    ASSERT_ENUM_EQ(PDP_OK, pdp_tp_checkpoint_save(path, m, o), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, tp_model(&one, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(path, one, NULL), pdp_status_name);
    ASSERT_EQ(0.0, tp_worst(m, one, &scale));
    before = fbuf(m->param_count);
    memcpy(before, m->param_block, (size_t)m->param_count * sizeof(float));
    memset(m->param_block, 0, (size_t)m->param_count * sizeof(float));
    ASSERT_ENUM_EQ(PDP_OK, pdp_tp_checkpoint_load(path, m, o), pdp_status_name);
    ASSERT(memcmp(before, m->param_block, (size_t)m->param_count * sizeof(float)) == 0);
    ASSERT_EQ(TP_STEPS, pdp_optim_steps(o));
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_barrier(cm, NULL), pdp_status_name);
    if (my_rank == 0) remove(path);
    free(before);
    pdp_model_free(one);
    pdp_optim_free(o);
    pdp_optim_free(oref);
    pdp_model_free(m);
    pdp_model_free(ref);
    PASS();
}

MPI_TEST(mpi_tp_2d_ddp_across_tp_groups_matches_single_device)
{
    pdp_model *ref = NULL, *m = NULL;
    pdp_optim *oref = NULL, *o = NULL;
    pdp_comm *tp = NULL, *dp = NULL;
    pdp_ddp *ddp = NULL;
    pdp_optim_desc od;
    double worst, scale;
    int T = world_size % 2 == 0 ? 2 : 1, D = world_size / T;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 0.01f;
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_split(cm, my_rank / T, my_rank, &tp), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_split(cm, my_rank % T, my_rank, &dp), pdp_status_name);
    ASSERT_EQ(T, pdp_comm_size(tp));
    ASSERT_EQ(D, pdp_comm_size(dp));
    ASSERT_ENUM_EQ(PDP_OK, tp_model(&ref, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, tp_model(&m, tp), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oref, ref, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_ddp_create(&ddp, m, dp, NULL), pdp_status_name);
    CHECK_CALL(tp_train(ref, oref, m, o, ddp, pdp_comm_rank(dp), D));
    worst = tp_worst(m, ref, &scale);
    if (my_rank == 0)
        fprintf(test_out, "\n  2-D over mpi: %d DP x %d TP: max |2-D - single device| = %.3g\n",
                D, T, worst);
    ASSERT(worst <= 1e-5 * scale);
    pdp_ddp_free(ddp);
    pdp_optim_free(o);
    pdp_optim_free(oref);
    pdp_model_free(m);
    pdp_model_free(ref);
    pdp_comm_free(dp);
    pdp_comm_free(tp);
    PASS();
}
#endif /* PDP_MPI */

SUITE(mpi)
{
    RUN_TEST(mpi_init_env_rejects_local_backend);
    RUN_TEST(mpi_init_env_nccl_needs_cuda);
    RUN_TEST(mpi_init_env_mpi_needs_pdp_mpi);
    RUN_TEST(mpi_init_env_rejects_bad_timeout);
#ifndef PDP_MPI
    RUN_TEST(mpi_collectives);
#else
    RUN_TEST(mpi_comm_reports_rank_and_size);
    RUN_TEST(mpi_async_launch_returns_before_peers_arrive);
    RUN_TEST(mpi_ddp_matches_single_device_and_ranks_agree);
    RUN_TEST(mpi_ddp_bf16_hook_within_the_bound_and_half_the_bytes);
    RUN_TEST(mpi_p2p_timed_out_sends_cancel_together);
    RUN_TEST(mpi_tp_matches_single_device_and_checkpoints_full_tensors);
    RUN_TEST(mpi_tp_2d_ddp_across_tp_groups_matches_single_device);
    RUN_TEST(mpi_zero_matches_single_device_and_ranks_agree);
    RUN_TEST(mpi_pp_matches_single_device);
    RUN_TEST(mpi_pp_2d_dp_x_pp_matches_single_device);
    RUN_TEST(mpi_gpt_under_ddp_zero3_and_a_pipeline_equals_one_device);
    RUN_TEST(mpi_gpt_tensor_and_sequence_parallel_equal_one_device);
    RUN_TEST(mpi_gpt_dp_x_tp_sequence_parallel_under_ddp_and_zero_equals_one_device);
    RUN_TEST(mpi_trace_has_collectives_per_rank);
    RUN_TEST(mpi_init_env_times_out_when_a_rank_is_missing);
    conf_run_suite(&mpi_factory);
#endif
}

GREATEST_MAIN_DEFS();

#ifdef PDP_MPI
/* ---- start-up and a killed rank (tests/mpi_startup.sh runs these under mpirun) ----
   test_mpi --startup MISSING SLEEP: the rank MISSING (OMPI_COMM_WORLD_RANK) sleeps SLEEP s and
   exits without MPI; every other rank calls pdp_comm_init_env with a 2 s timeout and prints
   "startup: rank R: STATUS after T s: message"; the watchdog's log lines read "startup-log: ...".
   test_mpi --killed: rank 1 SIGKILLs itself after a barrier; rank 0's all-reduce prints
   "killed: rank 0: STATUS after T s: message". test_mpi --mismatch: below. */
static void startup_log(pdp_log_level level, const char *msg, void *user)
{
    (void)level;
    (void)user;
    printf("startup-log: %s\n", msg);
    fflush(stdout);
}

static int startup_main(char **argv)
{
    const char *e = getenv("OMPI_COMM_WORLD_RANK");
    int rank = e ? atoi(e) : 0;
    double t0;
    pdp_comm *c = NULL;
    pdp_comm_desc d;
    pdp_status st;
    if (rank == atoi(argv[2])) {
        sleep((unsigned)atoi(argv[3]));
        return 0;
    }
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_MPI;
    d.timeout_s = 2.0;
    d.log = startup_log;
    t0 = pdp__now();
    st = pdp_comm_init_env(&c, &d);
    printf("startup: rank %d: %s after %.1f s: %s\n", rank, pdp_status_name(st), pdp__now() - t0,
           st != PDP_OK ? pdp_last_error() : "");
    fflush(stdout);
    pdp_comm_free(c);
    return 0;
}

static int killed_main(void)
{
    float b[4] = {0, 0, 0, 0};
    pdp_comm *c = NULL;
    pdp_comm_desc d;
    pdp_status st;
    double t0;
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_MPI;
    d.timeout_s = 2.0;
    if (pdp_comm_init_env(&c, &d) != PDP_OK || pdp_comm_barrier(c, NULL) != PDP_OK) {
        printf("killed: %s\n", pdp_last_error());
        return 1;
    }
    if (pdp_comm_rank(c) == 1) raise(SIGKILL);
    t0 = pdp__now();
    st = pdp_comm_allreduce(c, b, 4, PDP_REDUCE_SUM, NULL);
    printf("killed: rank %d: %s after %.1f s: %s\n", pdp_comm_rank(c), pdp_status_name(st),
           pdp__now() - t0, st != PDP_OK ? pdp_last_error() : "");
    fflush(stdout);
    _exit(0); /* MPI_Finalize could wait for the dead rank */
}

/* test_mpi --mismatch: rank 1 all-reduces 512 floats where the others give 1024; every rank
   prints "mismatch: rank R: STATUS: message" (a status, never MPI's fatal handler's abort) */
static int mismatch_main(void)
{
    static float b[1024];
    pdp_comm *c = NULL;
    pdp_comm_desc d;
    pdp_status st;
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_MPI;
    d.timeout_s = 2.0;
    if (pdp_comm_init_env(&c, &d) != PDP_OK) {
        printf("mismatch: %s\n", pdp_last_error());
        return 1;
    }
    st = pdp_comm_allreduce(c, b, pdp_comm_rank(c) == 1 ? 512 : 1024, PDP_REDUCE_SUM, NULL);
    if (st == PDP_OK) st = pdp_comm_allreduce(c, b, 1024, PDP_REDUCE_SUM, NULL);
    printf("mismatch: rank %d: %s: %s\n", pdp_comm_rank(c), pdp_status_name(st),
           st != PDP_OK ? pdp_last_error() : "");
    fflush(stdout);
    _exit(0); /* MPI_Finalize could wait for a rank that has failed */
}
#endif

int main(int argc, char **argv)
{
    int ok;
#ifdef PDP_MPI
    int finalized = 0;
    pdp_comm_desc d;
    if (argc > 3 && strcmp(argv[1], "--startup") == 0) return startup_main(argv);
    if (argc > 1 && strcmp(argv[1], "--killed") == 0) return killed_main();
    if (argc > 1 && strcmp(argv[1], "--mismatch") == 0) return mismatch_main();
    alarm(120); /* a hang becomes a failure (SIGALRM ends the rank, mpirun reports it) */
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_MPI;
    d.name = "world";
    /* pdp initialises MPI here (MPI_THREAD_MULTIPLE) and finalises it when world is freed */
    if (pdp_comm_init_env(&world, &d) != PDP_OK) {
        fprintf(stderr, "test_mpi: %s\n", pdp_last_error());
        return EXIT_FAILURE;
    }
    my_rank = pdp_comm_rank(world);
    world_size = pdp_comm_size(world);
    mpi_factory.min_ranks = mpi_factory.max_ranks = world_size;
    test_out = my_rank == 0 ? stdout : fopen("/dev/null", "w");
    if (make_comm(&cm, "tests", 20.0) != PDP_OK) {
        fprintf(stderr, "test_mpi: rank %d: %s\n", my_rank, pdp_last_error());
        return EXIT_FAILURE;
    }
#endif
    (void)my_rank;
    (void)world_size;
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(mpi);
    ok = greatest_all_passed();
#ifdef PDP_MPI
    pdp_comm_free(cm);
    pdp_comm_free(world); /* the last MPI communicator: pdp calls MPI_Finalize */
    MPI_Finalized(&finalized);
    if (!finalized) {
        fprintf(stderr, "test_mpi: rank %d: MPI not finalized by the last pdp_comm_free\n",
                my_rank);
        ok = 0;
    }
    if (trace_file[0]) remove(trace_file);
#endif
    GREATEST_PRINT_REPORT();
    if (test_out && test_out != stdout) fclose(test_out);
    return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
