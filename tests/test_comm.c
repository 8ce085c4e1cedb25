/* test_comm.c - the communicator API on the local backend (ranks are threads).

   Every collective is compared against a naive loop over the ranks' inputs in
   rank order, which is the order the backend reduces in, so sums must match to
   the bit and every rank must hold the same bits. Faults: a rank that never
   arrives makes the others time out naming the collective and the rank; a rank
   that frees its communicator makes the others fail at once; ranks that issue
   different collectives fail instead of corrupting memory; a broken group fails
   fast afterwards. The 16-bit reductions (bf16, fp16) match a naive fp32 sum in
   rank order rounded once, to the bit, and count 2 bytes per element; the
   conversions round to nearest even (ties, overflow, subnormals). Run under
   TSan by `make tsan`. */

#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"

#define MAXR 4

/* ---- helpers: run one function on N rank threads ---- */

typedef struct rank_ctx {
    pdp_local_group *g;
    int rank, size;
    int64_t count;
    int scenario;
    bool freed;              /* fn freed its communicator */
    void *user;
    pdp_status st;           /* first failure */
    char msg[1024];
    double elapsed;
    pdp_comm_stats stats;
} rank_ctx;

typedef void (*rank_fn)(rank_ctx *ctx, pdp_comm *c);

typedef struct runner {
    rank_fn fn;
    rank_ctx *ctx;
} runner;

static runner the_runner[MAXR];

static void *rank_main(void *arg)
{
    runner *r = (runner *)arg;
    pdp_comm *c = NULL;
    pdp_status st = pdp_comm_create_local(&c, r->ctx->g, r->ctx->rank);
    if (st != PDP_OK) {
        r->ctx->st = st;
        snprintf(r->ctx->msg, sizeof r->ctx->msg, "%s", pdp_last_error());
        return NULL;
    }
    r->fn(r->ctx, c);
    if (r->ctx->freed) return NULL;
    pdp_comm_get_stats(c, &r->ctx->stats);
    pdp_comm_free(c);
    return NULL;
}

/* Runs fn on n threads; returns PDP_OK or the status of group creation. */
static pdp_status run_ranks(int n, double timeout_s, rank_fn fn, rank_ctx *ctx)
{
    pthread_t t[MAXR];
    pdp_local_group *g = NULL;
    pdp_comm_desc d;
    pdp_status st;
    int r;
    memset(&d, 0, sizeof d);
    d.timeout_s = timeout_s;
    d.name = "test";
    if ((st = pdp_local_group_create(&g, n, &d)) != PDP_OK) return st;
    for (r = 0; r < n; r++) {
        ctx[r].g = g;
        ctx[r].rank = r;
        ctx[r].size = n;
        ctx[r].st = PDP_OK;
        ctx[r].msg[0] = '\0';
        the_runner[r].fn = fn;
        the_runner[r].ctx = &ctx[r];
        pthread_create(&t[r], NULL, rank_main, &the_runner[r]);
    }
    for (r = 0; r < n; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
    return PDP_OK;
}

static void note(rank_ctx *ctx, pdp_status st)
{
    if (st != PDP_OK && ctx->st == PDP_OK) {
        ctx->st = st;
        snprintf(ctx->msg, sizeof ctx->msg, "%s", pdp_last_error());
    }
}

/* Deterministic, rank-dependent inputs with awkward magnitudes (so the order of
   summation shows in the bits). */
static float input(int rank, int64_t i)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(rank * 40503u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * (rank % 2 ? 1e3f : 1e-2f);
}

/* ---- collectives against naive loops ---- */

typedef struct coll_out {
    float *ar_sum[MAXR], *ar_avg[MAXR], *bc[MAXR], *rs[MAXR], *ag[MAXR];
    unsigned char bytes[MAXR][37];
} coll_out;

static void all_collectives(rank_ctx *ctx, pdp_comm *c)
{
    coll_out *o = (coll_out *)ctx->user;
    int r = ctx->rank, n = ctx->size;
    int64_t i, cnt = ctx->count;
    pdp_work *w[5];
    float *send = (float *)malloc((size_t)(cnt * n + 1) * sizeof(float));
    for (i = 0; i < cnt; i++) {
        o->ar_sum[r][i] = input(r, i);
        o->ar_avg[r][i] = input(r, i);
        o->bc[r][i] = input(r, i + 7);
    }
    for (i = 0; i < cnt * n; i++) send[i] = input(r, i + 3);
    for (i = 0; i < 37; i++) o->bytes[r][i] = (unsigned char)(r == 1 % n ? i * 3 : 0);
    /* all five in flight at once, waited in reverse order */
    note(ctx, pdp_comm_allreduce(c, o->ar_sum[r], cnt, PDP_REDUCE_SUM, &w[0]));
    note(ctx, pdp_comm_allreduce(c, o->ar_avg[r], cnt, PDP_REDUCE_AVG, &w[1]));
    note(ctx, pdp_comm_broadcast(c, o->bc[r], cnt, n - 1, &w[2]));
    note(ctx, pdp_comm_reduce_scatter(c, send, o->rs[r], cnt, PDP_REDUCE_SUM, &w[3]));
    note(ctx, pdp_comm_allgather(c, send, o->ag[r], cnt, &w[4]));
    for (i = 4; i >= 0; i--) note(ctx, pdp_work_wait(ctx->st == PDP_OK ? w[i] : NULL));
    note(ctx, pdp_comm_barrier(c, NULL));
    note(ctx, pdp_comm_broadcast_bytes(c, o->bytes[r], 37, 1 % n));
    free(send);
}

static enum greatest_test_res check_collectives(int n, int64_t cnt)
{
    rank_ctx ctx[MAXR];
    coll_out o;
    int r, i2;
    int64_t i;
    memset(ctx, 0, sizeof ctx);
    memset(&o, 0, sizeof o);
    for (r = 0; r < n; r++) {
        o.ar_sum[r] = (float *)malloc((size_t)(cnt + 1) * sizeof(float));
        o.ar_avg[r] = (float *)malloc((size_t)(cnt + 1) * sizeof(float));
        o.bc[r] = (float *)malloc((size_t)(cnt + 1) * sizeof(float));
        o.rs[r] = (float *)malloc((size_t)(cnt + 1) * sizeof(float));
        o.ag[r] = (float *)malloc((size_t)(cnt * n + 1) * sizeof(float));
        ctx[r].count = cnt;
        ctx[r].user = &o;
    }
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(n, 30.0, all_collectives, ctx), pdp_status_name);
    for (r = 0; r < n; r++) ASSERT_ENUM_EQm(ctx[r].msg, PDP_OK, ctx[r].st, pdp_status_name);
    /* all-reduce: rank order sum, the same bits on every rank */
    for (i = 0; i < cnt; i++) {
        float s = input(0, i), a;
        for (r = 1; r < n; r++) s += input(r, i);
        a = s / (float)n;
        for (r = 0; r < n; r++) {
            if (o.ar_sum[r][i] != s || o.ar_avg[r][i] != a) {
                fprintf(stderr, "n %d count %lld rank %d i %lld: sum %.9g want %.9g, avg %.9g "
                        "want %.9g\n", n, (long long)cnt, r, (long long)i, o.ar_sum[r][i], s,
                        o.ar_avg[r][i], a);
                FAILm("all-reduce differs from the rank-order sum");
            }
            if (o.bc[r][i] != input(n - 1, i + 7)) FAILm("broadcast from the last rank differs");
        }
    }
    /* reduce-scatter: rank r holds slice r of the sum of every rank's send */
    for (r = 0; r < n; r++)
        for (i = 0; i < cnt; i++) {
            float s = input(0, r * cnt + i + 3);
            for (i2 = 1; i2 < n; i2++) s += input(i2, r * cnt + i + 3);
            if (o.rs[r][i] != s) FAILm("reduce-scatter differs from the naive slice sum");
        }
    /* all-gather: block q of every rank's recv is rank q's send */
    for (r = 0; r < n; r++)
        for (i2 = 0; i2 < n; i2++)
            for (i = 0; i < cnt; i++)
                if (o.ag[r][i2 * cnt + i] != input(i2, i + 3)) FAILm("all-gather block differs");
    for (r = 0; r < n; r++)
        for (i = 0; i < 37; i++)
            ASSERT_EQm("broadcast_bytes", (int)(i * 3) & 0xff, (int)o.bytes[r][i]);
    /* stats: seven collectives; the ring figure for the two all-reduces */
    for (r = 0; r < n; r++) {
        double nn = n, bytes = (double)cnt * 4;
        int64_t want = 2 * (int64_t)(2.0 * (nn - 1) / nn * bytes) /* two all-reduces */
                       + (int64_t)((nn - 1) / nn * bytes)          /* broadcast */
                       + 2 * (int64_t)((nn - 1) * bytes)           /* reduce-scatter, all-gather */
                       + (int64_t)((nn - 1) / nn * 37);            /* broadcast_bytes */
        ASSERT_EQ(7, (int)ctx[r].stats.collectives);
        ASSERT_EQ(want, ctx[r].stats.bytes_sent);
        ASSERT(ctx[r].stats.busy_s >= 0.0);
    }
    for (r = 0; r < n; r++) {
        free(o.ar_sum[r]);
        free(o.ar_avg[r]);
        free(o.bc[r]);
        free(o.rs[r]);
        free(o.ag[r]);
    }
    PASS();
}

TEST comm_collectives_match_naive_loops(void)
{
    static const int64_t counts[] = {0, 1, 17, 1000, 5003, 70001};
    int n;
    size_t k;
    for (n = 1; n <= MAXR; n++)
        for (k = 0; k < sizeof counts / sizeof *counts; k++)
            CHECK_CALL(check_collectives(n, counts[k]));
    PASS();
}

/* ---- 16-bit reductions (pdp_comm_allreduce_ex, pdp_comm_reduce_scatter_ex) ---- */

TEST comm_16bit_conversions_round_to_nearest_even(void)
{
    uint32_t h;
    /* every fp16 and bf16 value survives widen-then-round (NaNs stay NaNs) */
    for (h = 0; h < 65536; h++) {
        float f = pdp__f16_float((uint16_t)h), b = pdp__bf16_float((uint16_t)h);
        if (f == f) ASSERT_EQm("fp16 round trip", (int)h, (int)pdp__f16_bits(f));
        else ASSERT(pdp__f16_float(pdp__f16_bits(f)) != pdp__f16_float(pdp__f16_bits(f)));
        if (b == b) ASSERT_EQm("bf16 round trip", (int)h, (int)pdp__bf16_bits(b));
    }
    ASSERT_EQ(0x3c00, pdp__f16_bits(1.0f));
    ASSERT_EQ(0x3c00, pdp__f16_bits(1.0f + 0x1p-11f));          /* tie: to even (down) */
    ASSERT_EQ(0x3c02, pdp__f16_bits(1.0f + 3.0f * 0x1p-11f));   /* tie: to even (up) */
    ASSERT_EQ(0x7bff, pdp__f16_bits(65504.0f));
    ASSERT_EQ(0x7bff, pdp__f16_bits(65519.0f));
    ASSERT_EQ(0x7c00, pdp__f16_bits(65520.0f));                 /* overflow: Inf */
    ASSERT_EQ(0xfc00, pdp__f16_bits(-1e9f));
    ASSERT_EQ(0x0001, pdp__f16_bits(0x1p-24f));                 /* the smallest subnormal */
    ASSERT_EQ(0x0000, pdp__f16_bits(0x1p-25f));                 /* tie: to even (zero) */
    ASSERT_EQ(0x0001, pdp__f16_bits(1.5f * 0x1p-25f));
    ASSERT_EQ(0x0400, pdp__f16_bits(0x1p-14f - 0x1p-26f));      /* rounds up into normals */
    ASSERT_EQ(0x3f80, pdp__bf16_bits(1.0f));
    ASSERT_EQ(0x3f80, pdp__bf16_bits(1.0f + 0x1p-8f));          /* tie: to even */
    ASSERT_EQ(0x3f82, pdp__bf16_bits(1.0f + 3.0f * 0x1p-8f));
    ASSERT_EQ(2, (int)pdp_dtype_size(PDP_DTYPE_BF16));
    ASSERT_EQ(2, (int)pdp_dtype_size(PDP_DTYPE_F16));
    ASSERT_EQ(4, (int)pdp_dtype_size(PDP_DTYPE_F32));
    PASS();
}

typedef struct coll16_out {
    int dt;
    uint16_t *ar_sum[MAXR], *ar_avg[MAXR], *rs_sum[MAXR], *rs_avg[MAXR];
} coll16_out;

static uint16_t input16(int dt, int rank, int64_t i)
{
    return pdp__dt16_bits(dt, input(rank, i) * (dt == PDP_DTYPE_F16 ? 0.1f : 1.0f));
}

static void all_collectives16(rank_ctx *ctx, pdp_comm *c)
{
    coll16_out *o = (coll16_out *)ctx->user;
    int r = ctx->rank, n = ctx->size;
    int64_t i, cnt = ctx->count;
    pdp_work *w[4];
    uint16_t *send = (uint16_t *)malloc((size_t)(cnt * n + 1) * 2);
    for (i = 0; i < cnt; i++) o->ar_sum[r][i] = o->ar_avg[r][i] = input16(o->dt, r, i);
    for (i = 0; i < cnt * n; i++) send[i] = input16(o->dt, r, i + 3);
    note(ctx, pdp_comm_allreduce_ex(c, o->ar_sum[r], cnt, (pdp_dtype)o->dt, PDP_REDUCE_SUM, &w[0]));
    note(ctx, pdp_comm_allreduce_ex(c, o->ar_avg[r], cnt, (pdp_dtype)o->dt, PDP_REDUCE_AVG, &w[1]));
    note(ctx, pdp_comm_reduce_scatter_ex(c, send, o->rs_sum[r], cnt, (pdp_dtype)o->dt,
                                         PDP_REDUCE_SUM, &w[2]));
    note(ctx, pdp_comm_reduce_scatter_ex(c, send, o->rs_avg[r], cnt, (pdp_dtype)o->dt,
                                         PDP_REDUCE_AVG, &w[3]));
    for (i = 3; i >= 0; i--) note(ctx, pdp_work_wait(ctx->st == PDP_OK ? w[i] : NULL));
    free(send);
}

/* The stated rounding: widened, summed in fp32 in rank order, AVG divided, rounded once. */
static uint16_t naive16(int dt, int n, int64_t i, int avg)
{
    float s = pdp__dt16_float(dt, input16(dt, 0, i));
    int r;
    for (r = 1; r < n; r++) s += pdp__dt16_float(dt, input16(dt, r, i));
    return pdp__dt16_bits(dt, avg ? s / (float)n : s);
}

static enum greatest_test_res check_collectives16(int dt, int n, int64_t cnt)
{
    rank_ctx ctx[MAXR];
    coll16_out o;
    int r;
    int64_t i;
    memset(ctx, 0, sizeof ctx);
    memset(&o, 0, sizeof o);
    o.dt = dt;
    for (r = 0; r < n; r++) {
        o.ar_sum[r] = (uint16_t *)malloc((size_t)(cnt + 1) * 2);
        o.ar_avg[r] = (uint16_t *)malloc((size_t)(cnt + 1) * 2);
        o.rs_sum[r] = (uint16_t *)malloc((size_t)(cnt + 1) * 2);
        o.rs_avg[r] = (uint16_t *)malloc((size_t)(cnt + 1) * 2);
        ctx[r].count = cnt;
        ctx[r].user = &o;
    }
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(n, 30.0, all_collectives16, ctx), pdp_status_name);
    for (r = 0; r < n; r++) ASSERT_ENUM_EQm(ctx[r].msg, PDP_OK, ctx[r].st, pdp_status_name);
    for (r = 0; r < n; r++)
        for (i = 0; i < cnt; i++) {
            if (o.ar_sum[r][i] != naive16(dt, n, i, 0) || o.ar_avg[r][i] != naive16(dt, n, i, 1)) {
                fprintf(stderr, "dt %d n %d count %lld rank %d i %lld: sum %04x want %04x, avg "
                        "%04x want %04x\n", dt, n, (long long)cnt, r, (long long)i,
                        o.ar_sum[r][i], naive16(dt, n, i, 0), o.ar_avg[r][i],
                        naive16(dt, n, i, 1));
                FAILm("16-bit all-reduce differs from the naive fp32 sum rounded once");
            }
            if (o.rs_sum[r][i] != naive16(dt, n, r * cnt + i + 3, 0) ||
                o.rs_avg[r][i] != naive16(dt, n, r * cnt + i + 3, 1))
                FAILm("16-bit reduce-scatter differs from the naive fp32 sum rounded once");
        }
    for (r = 0; r < n; r++) { /* 2 bytes per element: half of the float figures */
        double nn = n, bytes = (double)cnt * 2;
        int64_t want = 2 * (int64_t)(2.0 * (nn - 1) / nn * bytes) + 2 * (int64_t)((nn - 1) * bytes);
        ASSERT_EQ(want, ctx[r].stats.bytes_sent);
    }
    for (r = 0; r < n; r++) {
        free(o.ar_sum[r]);
        free(o.ar_avg[r]);
        free(o.rs_sum[r]);
        free(o.rs_avg[r]);
    }
    PASS();
}

TEST comm_16bit_collectives_match_naive_fp32_sum_rounded_once(void)
{
    static const int64_t counts[] = {0, 1, 17, 5003};
    int n, dt;
    size_t k;
    for (dt = PDP_DTYPE_BF16; dt <= PDP_DTYPE_F16; dt++)
        for (n = 1; n <= MAXR; n++)
            for (k = 0; k < sizeof counts / sizeof *counts; k++)
                CHECK_CALL(check_collectives16(dt, n, counts[k]));
    PASS();
}

static void bad_dtype(rank_ctx *ctx, pdp_comm *c)
{
    uint16_t buf[4] = {0, 0, 0, 0};
    ctx->st = pdp_comm_allreduce_ex(c, buf, 4, (pdp_dtype)7, PDP_REDUCE_SUM, NULL);
    snprintf(ctx->msg, sizeof ctx->msg, "%s", pdp_last_error());
}

TEST comm_16bit_rejects_unknown_dtype(void)
{
    rank_ctx ctx[1];
    memset(ctx, 0, sizeof ctx);
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(1, 30.0, bad_dtype, ctx), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, ctx[0].st, pdp_status_name);
    ASSERT(strstr(ctx[0].msg, "pdp_comm_allreduce_ex: unknown dtype 7") != NULL);
    PASS();
}

/* ---- stats ---- */

static void one_allreduce(rank_ctx *ctx, pdp_comm *c)
{
    float *buf = (float *)calloc(1000, sizeof(float));
    note(ctx, pdp_comm_allreduce(c, buf, 1000, PDP_REDUCE_SUM, NULL));
    free(buf);
}

TEST comm_stats_count_ring_bytes(void)
{
    rank_ctx ctx[MAXR];
    int r;
    memset(ctx, 0, sizeof ctx);
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(4, 30.0, one_allreduce, ctx), pdp_status_name);
    for (r = 0; r < 4; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg, PDP_OK, ctx[r].st, pdp_status_name);
        ASSERT_EQ(1, (int)ctx[r].stats.collectives);
        ASSERT_EQ(6000, (int)ctx[r].stats.bytes_sent); /* 2 * 3/4 * 4000 bytes */
        ASSERT(ctx[r].stats.busy_s > 0.0);
    }
    PASS();
}

/* ---- faults ---- */

/* scenario 1: the last rank never calls the all-reduce (it waits, then leaves
   after the others have given up); 2: the last rank frees its communicator
   instead; 3: rank 1 issues a different count. */
static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fault_cv = PTHREAD_COND_INITIALIZER;
static int fault_finished;

static void fault_rank(rank_ctx *ctx, pdp_comm *c)
{
    float buf[64];
    double t0 = pdp__now();
    int64_t cnt = 64;
    memset(buf, 0, sizeof buf);
    if (ctx->rank == ctx->size - 1 && ctx->scenario == 1) { /* absent until the others are done */
        pthread_mutex_lock(&fault_mu);
        while (fault_finished < ctx->size - 1) pthread_cond_wait(&fault_cv, &fault_mu);
        pthread_mutex_unlock(&fault_mu);
        return;
    }
    if (ctx->rank == ctx->size - 1 && ctx->scenario == 99) {
        pdp_comm_free(c); /* a rank that failed and cleaned up */
        ctx->freed = true;
        return;
    }
    if (ctx->scenario == 3 && ctx->rank == 1) cnt = 63;
    note(ctx, pdp_comm_allreduce(c, buf, 8, PDP_REDUCE_SUM, NULL)); /* one that succeeds */
    note(ctx, pdp_comm_allreduce(c, buf, cnt, PDP_REDUCE_SUM, NULL));
    ctx->elapsed = pdp__now() - t0;
    if (ctx->st != PDP_OK) { /* a broken group fails fast from now on */
        double t1 = pdp__now();
        pdp_status again = pdp_comm_barrier(c, NULL);
        if (again == PDP_OK || pdp__now() - t1 > 0.5) ctx->st = PDP_ERR_STATE;
    }
    pthread_mutex_lock(&fault_mu);
    fault_finished++;
    pthread_cond_broadcast(&fault_cv);
    pthread_mutex_unlock(&fault_mu);
}

TEST comm_missing_rank_times_out_naming_it(void)
{
    rank_ctx ctx[3];
    int r;
    memset(ctx, 0, sizeof ctx);
    for (r = 0; r < 3; r++) ctx[r].scenario = 1;
    fault_finished = 0;
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(3, 0.5, fault_rank, ctx), pdp_status_name);
    for (r = 0; r < 2; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg, PDP_ERR_TIMEOUT, ctx[r].st, pdp_status_name);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "pdp_comm_allreduce") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "allreduce #0") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "rank 2") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "'test'") != NULL);
        ASSERT(ctx[r].elapsed >= 0.45 && ctx[r].elapsed < 3.0); /* the timeout, not a hang */
    }
    PASS();
}

TEST comm_freed_rank_fails_the_others_at_once(void)
{
    rank_ctx ctx[3];
    int r;
    memset(ctx, 0, sizeof ctx);
    for (r = 0; r < 3; r++) ctx[r].scenario = 99;
    fault_finished = 0;
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(3, 60.0, fault_rank, ctx), pdp_status_name);
    for (r = 0; r < 2; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg, PDP_ERR_COMM, ctx[r].st, pdp_status_name);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "rank 2 left the group") != NULL);
        ASSERT(ctx[r].elapsed < 5.0); /* far below the 60 s timeout */
    }
    PASS();
}

TEST comm_mismatched_collectives_fail_on_every_rank(void)
{
    rank_ctx ctx[3];
    int r;
    memset(ctx, 0, sizeof ctx);
    for (r = 0; r < 3; r++) ctx[r].scenario = 3;
    fault_finished = 0;
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(3, 60.0, fault_rank, ctx), pdp_status_name);
    for (r = 0; r < 3; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg, PDP_ERR_INVALID, ctx[r].st, pdp_status_name);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "rank 1 issued allreduce #1 (count 63") != NULL);
        ASSERT(ctx[r].elapsed < 5.0);
    }
    PASS();
}

/* ---- arguments ---- */

TEST comm_rejects_bad_arguments(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL, *c2 = NULL;
    pdp_work *w = (pdp_work *)&g; /* must be reset to NULL on failure */
    float x = 0.0f;
    pdp_comm_desc d;
    memset(&d, 0, sizeof d);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_local_group_create(&g, 0, NULL), pdp_status_name);
    ASSERT(g == NULL);
    ASSERT(strstr(pdp_last_error(), "world_size 0") != NULL);
    d.device = pdp_cuda(0);
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_local_group_create(&g, 2, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_create_local(&c, g, 1), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "rank 1 outside 0..0") != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_create_local(&c2, g, 0), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "rank 0 of group 'comm' already") != NULL);
    ASSERT_EQ(0, pdp_comm_rank(c));
    ASSERT_EQ(1, pdp_comm_size(c));
    ASSERT_EQ(PDP_BACKEND_LOCAL, pdp_comm_backend(c));
    ASSERT_IN_RANGE(300.0, pdp_comm_timeout(c), 0.0);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_allreduce(c, NULL, 4, PDP_REDUCE_SUM, &w),
                   pdp_status_name);
    ASSERT(w == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_comm_allreduce: buf is NULL with count 4") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_allreduce(c, &x, -1, PDP_REDUCE_SUM, NULL),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_allreduce(c, &x, 1, (pdp_reduce_op)7, NULL),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_broadcast(c, &x, 1, 1, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_comm_broadcast: root 1 outside 0..0") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_allreduce(NULL, &x, 1, PDP_REDUCE_SUM, NULL),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_work_wait(NULL), pdp_status_name);
    ASSERT(pdp_work_done(NULL));
    /* world size 1: collectives complete at once */
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_allreduce(c, &x, 1, PDP_REDUCE_AVG, &w), pdp_status_name);
    ASSERT(pdp_work_done(w));
    ASSERT_ENUM_EQ(PDP_OK, pdp_wait(w), pdp_status_name);
    pdp_comm_free(c);
    pdp_comm_free(NULL);
    pdp_local_group_free(g);
    pdp_local_group_free(NULL);
    PASS();
}

/* issue 21, item 5: a count whose buffer does not fit in the address space (count x element
   size x the world size for reduce-scatter's send and all-gather's recv beyond PTRDIFF_MAX)
   fails at the call with PDP_ERR_INVALID naming the call and the count, before the backend
   touches memory. At world size 1 these calls used to return PDP_OK and move nothing: the
   local backend computed (size_t)count * 4 = 0 bytes. */
TEST comm_rejects_counts_beyond_the_address_space(void)
{
    const int64_t huge = (int64_t)1 << 62; /* x 4 bytes: 2^64, wraps size_t to 0 */
    const int64_t most4 = (int64_t)(PTRDIFF_MAX / 4), most8 = (int64_t)(PTRDIFF_MAX / 8);
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_work *w = (pdp_work *)&g; /* must be reset to NULL on failure */
    float x[2] = {0.0f, 0.0f};
    char want[120];
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    snprintf(want, sizeof want, "count %lld is too large", (long long)huge);
#define EXPECT_HUGE(call, name)                                                                \
    do {                                                                                       \
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_ERR_INVALID, (call), pdp_status_name);           \
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), name ": ") == pdp_last_error());    \
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), want) != NULL);                     \
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "(comm 'comm', rank 0 of") != NULL); \
    } while (0)
    EXPECT_HUGE(pdp_comm_allreduce(c, x, huge, PDP_REDUCE_SUM, &w), "pdp_comm_allreduce");
    ASSERT(w == NULL);
    EXPECT_HUGE(pdp_comm_allreduce_ex(c, x, huge, PDP_DTYPE_BF16, PDP_REDUCE_SUM, NULL),
                "pdp_comm_allreduce_ex");
    EXPECT_HUGE(pdp_comm_broadcast(c, x, huge, 0, NULL), "pdp_comm_broadcast");
    EXPECT_HUGE(pdp_comm_reduce_scatter(c, x, x + 1, huge, PDP_REDUCE_SUM, NULL),
                "pdp_comm_reduce_scatter");
    EXPECT_HUGE(pdp_comm_reduce_scatter_ex(c, x, x + 1, huge, PDP_DTYPE_F16, PDP_REDUCE_AVG,
                                           NULL), "pdp_comm_reduce_scatter_ex");
    EXPECT_HUGE(pdp_comm_allgather(c, x, x + 1, huge, NULL), "pdp_comm_allgather");
    EXPECT_HUGE(pdp_comm_send(c, x, huge, 0, 1, &w), "pdp_comm_send");
    ASSERT(w == NULL);
    EXPECT_HUGE(pdp_comm_recv(c, x + 1, huge, 0, 1, NULL), "pdp_comm_recv");
    /* the bound is the buffer's bytes: one element more than fits, per element size */
    snprintf(want, sizeof want, "count %lld is too large", (long long)most4 + 1);
    EXPECT_HUGE(pdp_comm_allreduce(c, x, most4 + 1, PDP_REDUCE_SUM, NULL), "pdp_comm_allreduce");
    snprintf(want, sizeof want, "at most %lld", (long long)most4);
    EXPECT_HUGE(pdp_comm_send(c, x, most4 + 1, 0, 1, NULL), "pdp_comm_send");
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_broadcast_bytes(c, x, (size_t)-1, 0),
                   pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_comm_broadcast_bytes: ") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "exceed the address space") != NULL);
    /* nothing was left behind: the communicator works (no handle taken, no message queued) */
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_allreduce(c, x, 2, PDP_REDUCE_SUM, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_send(c, x, 1, 0, 1, &w), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_recv(c, x + 1, 1, 0, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_work_wait(w), pdp_status_name);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    /* reduce-scatter's send and all-gather's recv hold world size x count elements: at 2
       ranks a count whose 4-byte elements fit alone (most8 + 1 <= most4) is refused */
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 2, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    snprintf(want, sizeof want, "count %lld is too large: 2 ranks x", (long long)most8 + 1);
    EXPECT_HUGE(pdp_comm_reduce_scatter(c, x, x + 1, most8 + 1, PDP_REDUCE_SUM, NULL),
                "pdp_comm_reduce_scatter");
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "rank 0 of 2") != NULL);
    EXPECT_HUGE(pdp_comm_allgather(c, x, x + 1, most8 + 1, NULL), "pdp_comm_allgather");
#undef EXPECT_HUGE
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* One rule for a desc's timeout_s: 0 is the default; negative, NaN, infinite fail naming
   the function and the field (a local group used to accept -1, which MPI rejects). */
TEST comm_desc_timeout_rule(void)
{
    static const double bad[] = {-1.0, -1e-9, 0.0 / 0.0, 1.0 / 0.0, -1.0 / 0.0, 1e12};
    pdp_local_group *g = NULL;
    pdp_comm *c = (pdp_comm *)&g;
    pdp_comm_desc d;
    int i;
    memset(&d, 0, sizeof d);
    for (i = 0; i < (int)(sizeof bad / sizeof bad[0]); i++) {
        d.timeout_s = bad[i];
        d.backend = PDP_BACKEND_LOCAL;
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_local_group_create(&g, 2, &d), pdp_status_name);
        ASSERT(g == NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_local_group_create: "
                                         "desc->timeout_s") != NULL);
        d.backend = PDP_BACKEND_MPI; /* checked before the backend, in every build */
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_init_env(&c, &d), pdp_status_name);
        ASSERT(c == NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_comm_init_env: "
                                         "desc->timeout_s") != NULL);
    }
    d.backend = PDP_BACKEND_LOCAL;
    d.timeout_s = 0.0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_IN_RANGE(300.0, pdp_comm_timeout(c), 0.0);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    d.timeout_s = 2.5;
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_IN_RANGE(2.5, pdp_comm_timeout(c), 0.0);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* ---- point-to-point ---- */

#define P2P_N 1001

/* Every rank sends P2P_N floats to the next rank (tag 7) and to itself (tag 3), receives
   from the previous rank and from itself; all four launched before any wait. */
static void ring_rank(rank_ctx *ctx, pdp_comm *c)
{
    static float out[MAXR][P2P_N], in[MAXR][P2P_N], self_in[MAXR][P2P_N];
    int r = ctx->rank, n = ctx->size, i, rep;
    pdp_work *w[4];
    for (rep = 0; rep < 3; rep++) { /* handles recycle: the pool, not the heap */
        for (i = 0; i < P2P_N; i++) out[r][i] = input(r, i + rep);
        note(ctx, pdp_comm_send(c, out[r], P2P_N, (r + 1) % n, 7, &w[0]));
        note(ctx, pdp_comm_send(c, out[r], P2P_N, r, 3, &w[1]));
        note(ctx, pdp_comm_recv(c, in[r], P2P_N, (r + n - 1) % n, 7, &w[2]));
        note(ctx, pdp_comm_recv(c, self_in[r], P2P_N, r, 3, &w[3]));
        if (ctx->st != PDP_OK) return;
        for (i = 0; i < 4; i++) note(ctx, pdp_work_wait(w[i]));
        for (i = 0; i < P2P_N && ctx->st == PDP_OK; i++)
            if (in[r][i] != input((r + n - 1) % n, i + rep) || self_in[r][i] != out[r][i]) {
                ctx->st = PDP_ERR_COMM;
                snprintf(ctx->msg, sizeof ctx->msg, "rank %d of %d: element %d differs", r, n, i);
            }
    }
}

TEST comm_p2p_ring_and_self_send_at_world_sizes_1_to_4(void)
{
    rank_ctx ctx[MAXR];
    int n, r;
    for (n = 1; n <= MAXR; n++) {
        memset(ctx, 0, sizeof ctx);
        ASSERT_ENUM_EQ(PDP_OK, run_ranks(n, 20.0, ring_rank, ctx), pdp_status_name);
        for (r = 0; r < n; r++) {
            ASSERT_ENUM_EQm(ctx[r].msg, PDP_OK, ctx[r].st, pdp_status_name);
            ASSERT_EQ(12, ctx[r].stats.p2p);
            ASSERT_EQ(0, ctx[r].stats.collectives);
            ASSERT_EQ(6 * P2P_N * 4, ctx[r].stats.bytes_sent); /* sends only */
        }
    }
    PASS();
}

static void mismatch_rank(rank_ctx *ctx, pdp_comm *c)
{
    float b[7] = {0};
    if (ctx->rank == 0) note(ctx, pdp_comm_send(c, b, 7, 1, 5, NULL));
    else note(ctx, pdp_comm_recv(c, b, 5, 0, 5, NULL));
}

TEST comm_p2p_count_mismatch_names_both_counts(void)
{
    rank_ctx ctx[2];
    int r;
    memset(ctx, 0, sizeof ctx);
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(2, 5.0, mismatch_rank, ctx), pdp_status_name);
    for (r = 0; r < 2; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg, PDP_ERR_INVALID, ctx[r].st, pdp_status_name);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, r ? "pdp_comm_recv" : "pdp_comm_send") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "rank 0 sends 7 floats") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "rank 1 receives 5") != NULL);
        ASSERTm(ctx[r].msg, strstr(ctx[r].msg, "tag 5") != NULL);
    }
    PASS();
}

/* Rank 1 waits for a message rank 0 never sends (rank 0 stays until rank 1 is done). */
static pthread_mutex_t silent_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t silent_cv = PTHREAD_COND_INITIALIZER;
static int silent_done;

static void silent_rank(rank_ctx *ctx, pdp_comm *c)
{
    float b[4] = {0};
    double t0 = pdp__now();
    if (ctx->rank == 1) {
        pdp_work *w = NULL;
        note(ctx, pdp_comm_recv(c, b, 4, 0, 9, &w));
        note(ctx, pdp_work_wait(w));
        ctx->elapsed = pdp__now() - t0;
        /* the communicator stays usable: the unmatched receive was withdrawn */
        if (pdp_comm_send(c, b, 4, 1, 1, &w) != PDP_OK || pdp_comm_recv(c, b, 4, 1, 1, NULL) ||
            pdp_work_wait(w) != PDP_OK)
            ctx->st = PDP_ERR_STATE;
        pthread_mutex_lock(&silent_mu);
        silent_done = 1;
        pthread_cond_broadcast(&silent_cv);
        pthread_mutex_unlock(&silent_mu);
    } else {
        pthread_mutex_lock(&silent_mu);
        while (!silent_done) pthread_cond_wait(&silent_cv, &silent_mu);
        pthread_mutex_unlock(&silent_mu);
    }
}

TEST comm_p2p_peer_that_never_sends_times_out_naming_peer_and_tag(void)
{
    rank_ctx ctx[2];
    memset(ctx, 0, sizeof ctx);
    silent_done = 0;
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(2, 0.5, silent_rank, ctx), pdp_status_name);
    ASSERT_ENUM_EQm(ctx[1].msg, PDP_ERR_TIMEOUT, ctx[1].st, pdp_status_name);
    ASSERTm(ctx[1].msg, strstr(ctx[1].msg, "pdp_work_wait") != NULL);
    ASSERTm(ctx[1].msg, strstr(ctx[1].msg, "recv #0 (count 4) from rank 0 with tag 9") != NULL);
    ASSERTm(ctx[1].msg, strstr(ctx[1].msg, "no matching send from rank 0 within 0.5 s") != NULL);
    ASSERT(ctx[1].elapsed >= 0.45 && ctx[1].elapsed < 3.0);
    ASSERT_ENUM_EQm(ctx[0].msg, PDP_OK, ctx[0].st, pdp_status_name);
    PASS();
}

/* A send completes only once received, on every backend (issue 21, item 6, where MPI
   delivered eagerly): rank 0's sends with tags 11 (nobody receives it) and 12 (rank 1
   receives tag 13) time out naming peer and tag, as rank 1's receive does; neither rank
   frees its communicator before both are done, so that no departure ends a wait first. */
static void unmatched_send_rank(rank_ctx *ctx, pdp_comm *c)
{
    float b[4] = {0};
    pdp_work *w[2] = {NULL, NULL};
    double t0 = pdp__now();
    int k;
    if (ctx->rank == 0) {
        note(ctx, pdp_comm_send(c, b, 4, 1, 11, &w[0]));
        note(ctx, pdp_comm_send(c, b, 4, 1, 12, &w[1]));
        for (k = 0; k < 2 && w[k]; k++) {
            pdp_status st = pdp_work_wait(w[k]);
            if (st != PDP_ERR_TIMEOUT || !strstr(pdp_last_error(), k ? "to rank 1 with tag 12"
                                                                      : "to rank 1 with tag 11")) {
                ctx->st = st == PDP_OK ? PDP_ERR_STATE : st;
                snprintf(ctx->msg, sizeof ctx->msg, "send %d: %s: %.900s", k, pdp_status_name(st),
                         pdp_last_error());
            } else if (k == 0) {
                snprintf(ctx->msg, sizeof ctx->msg, "%s", pdp_last_error());
            }
        }
        ctx->elapsed = pdp__now() - t0;
    } else {
        ctx->st = pdp_comm_recv(c, b, 4, 0, 13, NULL);
        snprintf(ctx->msg, sizeof ctx->msg, "%s", pdp_last_error());
    }
    pthread_mutex_lock(&silent_mu); /* both ranks done before either frees its communicator */
    silent_done++;
    pthread_cond_broadcast(&silent_cv);
    while (silent_done < 2) pthread_cond_wait(&silent_cv, &silent_mu);
    pthread_mutex_unlock(&silent_mu);
}

TEST comm_p2p_unmatched_send_times_out_naming_peer_and_tag(void)
{
    rank_ctx ctx[2];
    memset(ctx, 0, sizeof ctx);
    silent_done = 0;
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(2, 0.5, unmatched_send_rank, ctx), pdp_status_name);
    ASSERT_ENUM_EQm(ctx[0].msg, PDP_OK, ctx[0].st, pdp_status_name); /* both timed out */
    ASSERTm(ctx[0].msg, strstr(ctx[0].msg, "pdp_work_wait: send #0 (count 4) to rank 1 with "
                               "tag 11") != NULL);
    ASSERTm(ctx[0].msg, strstr(ctx[0].msg, "no matching recv from rank 1 within 0.5 s") != NULL);
    ASSERT(ctx[0].elapsed >= 0.45 && ctx[0].elapsed < 3.0);
    ASSERT_ENUM_EQm(ctx[1].msg, PDP_ERR_TIMEOUT, ctx[1].st, pdp_status_name);
    ASSERTm(ctx[1].msg, strstr(ctx[1].msg, "from rank 0 with tag 13") != NULL);
    PASS();
}

/* ---- process groups: 4 ranks as 2 x 2 ---- */

static void split_rank(rank_ctx *ctx, pdp_comm *c)
{
    pdp_comm *mp = NULL, *dp = NULL, *none = (pdp_comm *)c;
    float a[5], b[5];
    int r = ctx->rank, i, k;
    /* model-parallel pairs {0,1} {2,3}; data-parallel pairs {0,2} {1,3}, keys reversed */
    note(ctx, pdp_comm_split(c, r / 2, r, &mp));
    note(ctx, pdp_comm_split(c, r % 2, -r, &dp));
    note(ctx, pdp_comm_split(c, r == 3 ? PDP_COMM_SPLIT_NONE : 0, 0, &none));
    if (ctx->st != PDP_OK) return;
    if (pdp_comm_size(mp) != 2 || pdp_comm_rank(mp) != r % 2 || pdp_comm_size(dp) != 2 ||
        pdp_comm_rank(dp) != (r < 2 ? 1 : 0) || (r == 3) != (none == NULL) ||
        (none && (pdp_comm_size(none) != 3 || pdp_comm_rank(none) != r))) {
        ctx->st = PDP_ERR_STATE;
        snprintf(ctx->msg, sizeof ctx->msg, "rank %d: mp %d/%d, dp %d/%d", r, pdp_comm_rank(mp),
                 pdp_comm_size(mp), pdp_comm_rank(dp), pdp_comm_size(dp));
    }
    for (i = 0; i < 5; i++) a[i] = b[i] = input(r, i);
    note(ctx, pdp_comm_allreduce(mp, a, 5, PDP_REDUCE_SUM, NULL));
    note(ctx, pdp_comm_allreduce(dp, b, 5, PDP_REDUCE_SUM, NULL));
    for (i = 0; i < 5 && ctx->st == PDP_OK; i++) {
        int m0 = (r / 2) * 2, d0 = r % 2; /* the lower old rank first: new rank order */
        float want_mp = input(m0, i) + input(m0 + 1, i);
        float want_dp = input(d0 + 2, i) + input(d0, i); /* dp new rank 0 is old rank 2 or 3 */
        if (a[i] != want_mp || b[i] != want_dp) {
            ctx->st = PDP_ERR_COMM;
            snprintf(ctx->msg, sizeof ctx->msg, "rank %d element %d: mp %g want %g, dp %g want "
                     "%g", r, i, a[i], want_mp, b[i], want_dp);
        }
    }
    /* point-to-point inside a group, by the group's ranks */
    k = pdp_comm_rank(mp);
    a[0] = (float)r;
    if (k == 0) note(ctx, pdp_comm_send(mp, a, 1, 1, 0, NULL));
    else note(ctx, pdp_comm_recv(mp, a, 1, 0, 0, NULL));
    if (ctx->st == PDP_OK && a[0] != (float)((r / 2) * 2)) ctx->st = PDP_ERR_COMM;
    pdp_comm_get_stats(mp, &ctx->stats); /* its own counters */
    if (ctx->stats.collectives != 1 || ctx->stats.p2p != 1) ctx->st = PDP_ERR_STATE;
    /* any order: the parent first, then the groups (freed with their last communicator) */
    pdp_comm_free(c);
    ctx->freed = true;
    pdp_comm_free(dp);
    pdp_comm_free(none);
    pdp_comm_free(mp);
}

TEST comm_split_2x2_collectives_match_naive(void)
{
    rank_ctx ctx[4];
    int r;
    memset(ctx, 0, sizeof ctx);
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(4, 20.0, split_rank, ctx), pdp_status_name);
    for (r = 0; r < 4; r++) ASSERT_ENUM_EQm(ctx[r].msg, PDP_OK, ctx[r].st, pdp_status_name);
    PASS();
}

TEST comm_p2p_and_split_reject_bad_arguments(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL, *o = NULL;
    float x = 0.0f;
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_send(c, &x, 1, 1, 0, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_comm_send: peer 1 outside 0..0") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_recv(c, &x, 1, 0, -1, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_comm_recv: tag -1 outside 0..32767") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_recv(c, NULL, 3, 0, 0, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_split(c, -2, 0, &o), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_comm_split: colour -2") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_split(c, 0, 0, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_split(c, 5, 0, &o), pdp_status_name);
    ASSERT_EQ(1, pdp_comm_size(o));
    ASSERT(strcmp(o->name, "comm.5") == 0);
    pdp_comm_free(o);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* ---- overlap: a collective progresses while its rank does something else ---- */

static void overlap_rank(rank_ctx *ctx, pdp_comm *c)
{
    float buf[256];
    pdp_work *w = NULL;
    double t0;
    int i;
    for (i = 0; i < 256; i++) buf[i] = (float)ctx->rank;
    note(ctx, pdp_comm_allreduce(c, buf, 256, PDP_REDUCE_SUM, &w));
    /* rank 0 never waits on its own: the collective must finish without it */
    t0 = pdp__now();
    while (ctx->st == PDP_OK && !pdp_work_done(w) && pdp__now() - t0 < 10.0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ctx->elapsed = pdp_work_done(w) ? 1.0 : 0.0;
    note(ctx, pdp_work_wait(w));
    if (buf[255] != (float)(ctx->size * (ctx->size - 1) / 2)) ctx->st = PDP_ERR_STATE;
}

TEST comm_async_progress_without_waiting(void)
{
    rank_ctx ctx[3];
    int r;
    memset(ctx, 0, sizeof ctx);
    ASSERT_ENUM_EQ(PDP_OK, run_ranks(3, 30.0, overlap_rank, ctx), pdp_status_name);
    for (r = 0; r < 3; r++) {
        ASSERT_ENUM_EQm(ctx[r].msg, PDP_OK, ctx[r].st, pdp_status_name);
        ASSERT_IN_RANGE(1.0, ctx[r].elapsed, 0.0);
    }
    PASS();
}

SUITE(comm)
{
    RUN_TEST(comm_collectives_match_naive_loops);
    RUN_TEST(comm_stats_count_ring_bytes);
    RUN_TEST(comm_16bit_conversions_round_to_nearest_even);
    RUN_TEST(comm_16bit_collectives_match_naive_fp32_sum_rounded_once);
    RUN_TEST(comm_16bit_rejects_unknown_dtype);
    RUN_TEST(comm_async_progress_without_waiting);
    RUN_TEST(comm_missing_rank_times_out_naming_it);
    RUN_TEST(comm_freed_rank_fails_the_others_at_once);
    RUN_TEST(comm_mismatched_collectives_fail_on_every_rank);
    RUN_TEST(comm_rejects_bad_arguments);
    RUN_TEST(comm_rejects_counts_beyond_the_address_space);
    RUN_TEST(comm_desc_timeout_rule);
    RUN_TEST(comm_p2p_ring_and_self_send_at_world_sizes_1_to_4);
    RUN_TEST(comm_p2p_count_mismatch_names_both_counts);
    RUN_TEST(comm_p2p_peer_that_never_sends_times_out_naming_peer_and_tag);
    RUN_TEST(comm_p2p_unmatched_send_times_out_naming_peer_and_tag);
    RUN_TEST(comm_split_2x2_collectives_match_naive);
    RUN_TEST(comm_p2p_and_split_reject_bad_arguments);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(comm);
    GREATEST_MAIN_END();
}
