/* test_comm.c - the communicator API on the local backend (ranks are threads).

   The collectives and point-to-point cases every backend shares are the conformance
   suite's (tests/comm_conformance.h), run here on thread ranks (local_factory, at the
   end; its tests are named conf_*): all-reduce, broadcast, reduce-scatter, all-gather
   and the 16-bit forms against naive loops (local adds rank order: the same bits as a
   naive rank-order loop), asynchronous handles, barrier, messages and their timeouts,
   split, count bounds, a missing rank, stats. What stays here is the local backend's
   own: a rank that frees its communicator makes the others fail at once; ranks that
   issue different collectives fail instead of corrupting memory; group creation and
   its arguments; meshes (their groups against a counted grid, their names, and a failure
   on a group naming its dimension and coordinates); the desc's timeout rule; the 16-bit
   conversions (round to nearest even: ties, overflow, subnormals). Run under TSan by
   `make tsan`.

   Each conformance case was seen to fail on a broken backend (CHANGELOG, issue 22):
   e.g. comm_local.c's all-reduce perturbing one element of rank 0's slice failed
   conf_allreduce_sum_avg_odd_counts, conf_rank_order_bits and
   conf_async_handles_waited_out_of_order. */

#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "comm_conformance.h"

#define MAXR 4
#define MESH_MAXR 12 /* ranks of the largest mesh tested */

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
    ASSERT_EQ(4, (int)pdp_dtype_size(PDP_DTYPE_I32));
    PASS();
}

/* ---- faults ---- */

/* scenario 99: the last rank frees its communicator instead of calling the all-reduce;
   3: rank 1 issues a different count. */
static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fault_cv = PTHREAD_COND_INITIALIZER;
static int fault_finished;

static void fault_rank(rank_ctx *ctx, pdp_comm *c)
{
    float buf[64];
    double t0 = pdp__now();
    int64_t cnt = 64;
    memset(buf, 0, sizeof buf);
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

/* The rest of the split's arguments are the suite's (conf_count_bounds_and_bad_arguments). */
TEST comm_split_rejects_a_null_out_and_names_the_group(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL, *o = NULL;
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_split(c, 0, 0, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_split(c, 5, 0, &o), pdp_status_name);
    ASSERT_EQ(1, pdp_comm_size(o));
    ASSERT(strcmp(o->name, "comm.5") == 0);
    pdp_comm_free(o);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

/* ---- process meshes ----
   The reference grid is built by counting, not by division: an odometer over the
   coordinates, last dimension fastest, visits the ranks 0, 1, 2, ... in turn; a rank's group
   along k is every rank whose coordinates equal its own except at k, in rank order. Each
   rank then checks its mesh against it: coordinates, group sizes and ranks, the members,
   the line pdp_mesh_format writes, and that each group's communicator joins exactly those
   ranks (an all-gather of the world ranks over it). */

typedef struct mesh_job {
    int ndim, sizes[PDP_MESH_MAX_DIMS];
    const char *const *names;
    char why[MESH_MAXR][1100]; /* a rank's first mismatch, "" when none */
} mesh_job;

static const char *mesh_name(const mesh_job *j, int k)
{
    static const char *const number[PDP_MESH_MAX_DIMS] = {"dim0", "dim1", "dim2", "dim3",
                                                          "dim4", "dim5", "dim6", "dim7"};
    return j->names && j->names[k] ? j->names[k] : number[k];
}

/* Dimension k's group name as comm.h spells it, for a rank at coordinates me: "world.TP(DP 1,
   PP 0)", an unnamed dimension j "dim<j>"; over 63 characters, "world.TP(first rank r)", r
   the group's first world rank */
static void mesh_group_name(const mesh_job *j, int k, const int *me, int first_rank, char *buf,
                            size_t cap)
{
    int i, len = snprintf(buf, cap, "world.%s", mesh_name(j, k)), first = 1;
    for (i = 0; i < j->ndim; i++) {
        if (i == k) continue;
        len += snprintf(buf + len, cap - (size_t)len, "%s%s %d", first ? "(" : ", ",
                        mesh_name(j, i), me[i]);
        first = 0;
    }
    if (!first) len += snprintf(buf + len, cap - (size_t)len, ")");
    if (len > 63) snprintf(buf, cap, "world.%s(first rank %d)", mesh_name(j, k), first_rank);
}

/* coords[q * ndim + k]: rank q's coordinate along k, by the odometer */
static int mesh_reference(const mesh_job *j, int *coords)
{
    int c[PDP_MESH_MAX_DIMS] = {0}, q = 0, k;
    for (;;) {
        memcpy(coords + q * j->ndim, c, (size_t)j->ndim * sizeof *c);
        q++;
        for (k = j->ndim - 1; k >= 0 && ++c[k] == j->sizes[k]; k--) c[k] = 0;
        if (k < 0) return q;
    }
}

static pdp_status mesh_check_rank(const pdp_launch_ctx *ctx, void *user)
{
    mesh_job *j = (mesh_job *)user;
    char *why = j->why[ctx->rank], line[512], want[512], gname[128];
    size_t wn = sizeof j->why[0];
    int coords[MESH_MAXR * PDP_MESH_MAX_DIMS], members[MESH_MAXR];
    int r = ctx->rank, n = mesh_reference(j, coords), k, q, len;
    int *me = coords + r * j->ndim;
    float got[MESH_MAXR], mine = (float)r;
    pdp_mesh *m = NULL;
    pdp_status st = pdp_mesh_create(&m, ctx->world, j->ndim, j->sizes, j->names);
    if (st != PDP_OK) return st;
    if (n != ctx->world_size) snprintf(why, wn, "the odometer counted %d ranks", n);
    len = snprintf(want, sizeof want, "rank %d (", r);
    for (k = 0; k < j->ndim; k++)
        len += snprintf(want + len, sizeof want - (size_t)len, "%s%s %d", k ? ", " : "",
                        mesh_name(j, k), me[k]);
    len += snprintf(want + len, sizeof want - (size_t)len, "):");
    for (k = 0; k < j->ndim && !*why; k++) {
        pdp_comm *g = pdp_mesh_group(m, k);
        int ref[MESH_MAXR], count = 0, i;
        for (q = 0; q < n; q++) { /* the ranks that differ from r at k alone */
            int same = 1;
            for (i = 0; i < j->ndim; i++) same &= i == k || coords[q * j->ndim + i] == me[i];
            if (same) ref[count++] = q;
        }
        len += snprintf(want + len, sizeof want - (size_t)len, "%s%s {", k ? "  " : " ",
                        mesh_name(j, k));
        for (i = 0; i < count; i++)
            len += snprintf(want + len, sizeof want - (size_t)len, i ? " %d" : "%d", ref[i]);
        len += snprintf(want + len, sizeof want - (size_t)len, "}");
        if (pdp_mesh_coord(m, k) != me[k] || pdp_comm_rank(g) != me[k] ||
            pdp_comm_size(g) != count || pdp_mesh_members(m, k, NULL) != count) {
            snprintf(why, wn, "rank %d dim %d: coord %d, group rank %d of %d, want %d of %d", r, k,
                     pdp_mesh_coord(m, k), pdp_comm_rank(g), pdp_comm_size(g), me[k], count);
            break;
        }
        mesh_group_name(j, k, me, ref[0], gname, sizeof gname);
        if (strcmp(pdp_comm_get_desc(g).name, gname)) {
            snprintf(why, wn, "rank %d dim %d: group name '%s', want '%s'", r, k,
                     pdp_comm_get_desc(g).name, gname);
            break;
        }
        pdp_mesh_members(m, k, members);
        if ((st = pdp_comm_allgather(g, &mine, got, 1, NULL)) != PDP_OK) break;
        for (i = 0; i < count && !*why; i++)
            if (members[i] != ref[i] || got[i] != (float)ref[i])
                snprintf(why, wn, "rank %d dim %d member %d: pdp_mesh_members %d, the group's "
                         "all-gather %g, want %d", r, k, i, members[i], (double)got[i], ref[i]);
    }
    if (st == PDP_OK && !*why) {
        if ((st = pdp_mesh_format(m, line, sizeof line)) == PDP_OK && strcmp(line, want))
            snprintf(why, wn, "format '%s', want '%s'", line, want);
        if (pdp_mesh_group(m, j->ndim) || pdp_mesh_group(m, -1) ||
            pdp_mesh_coord(m, j->ndim) != -1 || pdp_mesh_members(m, -1, NULL) != 0)
            snprintf(why, wn, "rank %d: a dimension outside 0..%d answered", r, j->ndim - 1);
    }
    pdp_mesh_free(m);
    return st;
}

TEST comm_mesh_groups_match_a_counted_grid(void)
{
    static const char *const dpt[] = {"DP", "PP", "TP"};
    /* names whose groups' full names are 77 characters: cut at 63, both dimension-0 groups
       were "world.data_parallel_(pipeline_stage_ 0, tensor_parallel 0, expe" */
    static const char *const wide[] = {"data_parallel_", "pipeline_stage_", "tensor_parallel",
                                       "expert_parallel"};
    static const mesh_job shapes[] = {
        {3, {2, 3, 2}, dpt, {{0}}},   /* 12 ranks, the middle dimension odd */
        {3, {2, 2, 2}, dpt, {{0}}},   /* train_gpt_3d's */
        {4, {1, 3, 1, 2}, NULL, {{0}}}, /* dimensions of size 1, unnamed */
        {1, {5}, NULL, {{0}}},        /* one dimension: the whole world */
        {4, {1, 1, 1, 2}, wide, {{0}}}, /* group names too long to hold every coordinate */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        static mesh_job j;
        int np = 1;
        j = shapes[i];
        for (int k = 0; k < j.ndim; k++) np *= j.sizes[k];
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(np, NULL, mesh_check_rank, &j),
                        pdp_status_name);
        for (int r = 0; r < np; r++) ASSERT_STR_EQ("", j.why[r]);
    }
    PASS();
}

/* A collective's failure on a mesh group names the group: its dimension and the coordinates
   its members share. 8 ranks as DP x PP x TP = 2 x 2 x 2, 0.3 s timeout: in rank 5's TP group
   {4 5} (DP 1, PP 0) the two ranks issue all-reduces of different counts, which fails both;
   in its pipeline {5 7} (DP 1, TP 1) rank 7 issues a barrier that rank 5 never joins (it
   holds its communicators until rank 7 has failed), which times out. Before groups had these
   names, both messages said only "comm 'world.4'" and "comm 'world.5'". */
typedef struct mesh_fail_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int rank7_done;
    pdp_status st[8];
    char msg[8][1024];
} mesh_fail_job;

static pdp_status mesh_fail_rank(const pdp_launch_ctx *ctx, void *user)
{
    mesh_fail_job *j = (mesh_fail_job *)user;
    int r = ctx->rank;
    float buf[2] = {1.0f, 2.0f};
    pdp_mesh *m = NULL;
    pdp_status st = pdp_mesh_create(&m, ctx->world, 3, (int[]){2, 2, 2},
                                    (const char *[]){"DP", "PP", "TP"});
    if (st != PDP_OK) return st;
    st = pdp_comm_allreduce(pdp_mesh_group(m, 2), buf, r == 5 ? 2 : 1, PDP_REDUCE_SUM, NULL);
    if (r == 7 && st == PDP_OK) st = pdp_comm_barrier(pdp_mesh_group(m, 1), NULL);
    j->st[r] = st;
    snprintf(j->msg[r], sizeof j->msg[r], "%s", pdp_last_error());
    pthread_mutex_lock(&j->mu);
    if (r == 7) j->rank7_done = 1, pthread_cond_broadcast(&j->cv);
    while (r == 5 && !j->rank7_done) pthread_cond_wait(&j->cv, &j->mu);
    pthread_mutex_unlock(&j->mu);
    pdp_mesh_free(m);
    return PDP_OK;
}

TEST comm_mesh_group_failures_name_the_dimension(void)
{
    static mesh_fail_job j;
    pdp_launch_desc ld;
    memset(&j, 0, sizeof j);
    memset(&ld, 0, sizeof ld);
    ld.timeout_s = PDP_TEST_TIMEOUT(0.3);
    pthread_mutex_init(&j.mu, NULL);
    pthread_cond_init(&j.cv, NULL);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(8, &ld, mesh_fail_rank, &j),
                    pdp_status_name);
    pthread_mutex_destroy(&j.mu);
    pthread_cond_destroy(&j.cv);
    for (int r = 4; r <= 5; r++) {
        ASSERT_ENUM_EQm(j.msg[r], PDP_ERR_INVALID, j.st[r], pdp_status_name);
        ASSERTm(j.msg[r], strstr(j.msg[r], "collectives differ across ranks on comm "
                                 "'world.TP(DP 1, PP 0)'") != NULL);
    }
    ASSERT_ENUM_EQm(j.msg[7], PDP_ERR_TIMEOUT, j.st[7], pdp_status_name);
    ASSERTm(j.msg[7], strstr(j.msg[7], "barrier #0 (count 0) on comm 'world.PP(DP 1, TP 1)', "
                             "rank 1 of 2: no arrival within") != NULL);
    for (int r = 0; r < 8; r++)
        if (r != 4 && r != 5 && r != 7) ASSERT_ENUM_EQm(j.msg[r], PDP_OK, j.st[r], pdp_status_name);
    PASS();
}

/* Bad dimensions fail before any collective, on every rank, naming the sizes and the
   world's size; a line that does not fit names the bytes it needs. */
static pdp_status mesh_wrong_world_rank(const pdp_launch_ctx *ctx, void *user)
{
    pdp_mesh *m = (pdp_mesh *)ctx; /* must come back NULL */
    pdp_status st = pdp_mesh_create(&m, ctx->world, 3, (int[]){2, 2, 2},
                                    (const char *[]){"DP", "PP", "TP"});
    (void)user;
    return st == PDP_ERR_INVALID && m != NULL ? PDP_ERR_STATE : st;
}

/* Sizes that multiply to the world on every rank but differ between ranks (rank 0 DP 3 x
   TP 1, the others DP 1 x TP 3) would build groups that do not match: refused on every
   rank, naming its sizes. */
static pdp_status mesh_sizes_differ(const pdp_launch_ctx *ctx, void *user)
{
    pdp_mesh *m = NULL;
    int one = ctx->rank == 0;
    pdp_status st = pdp_mesh_create(&m, ctx->world, 2, (int[]){one ? 3 : 1, one ? 1 : 3},
                                    (const char *[]){"DP", "TP"});
    (void)user;
    pdp_mesh_free(m);
    return st == PDP_ERR_INVALID && m != NULL ? PDP_ERR_STATE : st;
}

TEST comm_mesh_rejects_bad_dimensions(void)
{
    pdp_local_group *g = NULL;
    pdp_comm *c = NULL;
    pdp_mesh *m = (pdp_mesh *)&g; /* reset to NULL on failure */
    char line[64];
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_launch(6, NULL, mesh_wrong_world_rank, NULL),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), " of 6: pdp_mesh_create: DP 2 x PP 2 x TP 2 makes 8 ranks, "
                  "but comm 'world' has 6") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_launch(3, NULL, mesh_sizes_differ, NULL),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "here, but not on every rank of comm 'world'") != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 1, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_comm_create_local(&c, g, 0), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, c, 2, (int[]){1, 2}, NULL),
                   pdp_status_name);
    ASSERT(m == NULL);
    ASSERT_STR_EQ("pdp_mesh_create: 1 x 2 makes 2 ranks, but comm 'comm' has 1",
                  pdp_last_error());
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, c, 2, (int[]){1, 0}, NULL),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "1 x 0: dimension 1 has size 0") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, c, 0, (int[]){1}, NULL), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "0 dimensions; a mesh has 1..8") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, c, PDP_MESH_MAX_DIMS + 1,
                   (int[PDP_MESH_MAX_DIMS + 1]){1, 1, 1, 1, 1, 1, 1, 1, 1}, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, c, 1, (int[]){1},
                   (const char *[]){"sixteen_letters_"}), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "dimension 0's name 'sixteen_letters_' has 16") != NULL);
    /* two dimensions of one name: both of rank 0's groups were "comm.X(X 0)", its line
       "rank 0 (X 0, X 0): X {0}  X {0}" */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, c, 2, (int[]){1, 1},
                   (const char *[]){"X", "X"}), pdp_status_name);
    ASSERT_STR_EQ("pdp_mesh_create: X 1 x X 1: dimensions 0 and 1 are both named 'X'",
                  pdp_last_error());
    ASSERT(m == NULL);
    /* ... and a name that is an unnamed dimension's, "dim<k>" */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, c, 2, (int[]){1, 1},
                   (const char *[]){NULL, "dim0"}), pdp_status_name);
    ASSERT_STR_EQ("pdp_mesh_create: 1 x dim0 1: dimensions 0 and 1 are both named 'dim0'",
                  pdp_last_error());
    ASSERT(m == NULL);
    /* the message's "A n x B n ..." cut at its buffer, not written past it (8 names of 15
       and sizes of 11 characters need 237 bytes; an ASan build caught the overflow) */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, c, PDP_MESH_MAX_DIMS,
                   (int[PDP_MESH_MAX_DIMS]){INT_MIN, INT_MIN, INT_MIN, INT_MIN, INT_MIN, INT_MIN,
                                            INT_MIN, INT_MIN},
                   (const char *[PDP_MESH_MAX_DIMS]){"fifteen_letters", "fifteen_letters",
                   "fifteen_letters", "fifteen_letters", "fifteen_letters", "fifteen_letters",
                   "fifteen_letters", "fifteen_letters"}), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), ": dimension 0 has size -2147483648; a size is >= 1") != NULL);
    ASSERT(strncmp(pdp_last_error(), "pdp_mesh_create: fifteen_letters -2147483648 x fifteen_",
                   50) == 0);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, c, 1, NULL, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(&m, NULL, 1, (int[]){1}, NULL),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_create(NULL, c, 1, (int[]){1}, NULL),
                   pdp_status_name);
    ASSERT(m == NULL);
    /* one rank, 1 x 1: "rank 0 (dim0 0, x 0): dim0 {0}  x {0}" needs 38 bytes */
    ASSERT_ENUM_EQ(PDP_OK, pdp_mesh_create(&m, c, 2, (int[]){1, 1}, (const char *[]){NULL, "x"}),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_format(m, line, 37), pdp_status_name);
    ASSERT_STR_EQ("pdp_mesh_format: rank 0's line needs 38 bytes, buf has 37", pdp_last_error());
    ASSERT_ENUM_EQ(PDP_OK, pdp_mesh_format(m, line, 38), pdp_status_name);
    ASSERT_STR_EQ("rank 0 (dim0 0, x 0): dim0 {0}  x {0}", line);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_mesh_format(NULL, line, sizeof line), pdp_status_name);
    pdp_mesh_free(m);
    /* a group name longer than 63 characters (this one needs 75), which cut there would lose
       coordinates, names the group's first rank instead */
    ASSERT_ENUM_EQ(PDP_OK, pdp_mesh_create(&m, c, PDP_MESH_MAX_DIMS,
                   (int[PDP_MESH_MAX_DIMS]){1, 1, 1, 1, 1, 1, 1, 1},
                   (const char *[PDP_MESH_MAX_DIMS]){"dimension_zero_", "dimension_one__",
                   "d2", "d3", "d4", "d5", "d6", "d7"}), pdp_status_name);
    ASSERT_STR_EQ("comm.dimension_one__(first rank 0)",
                  pdp_comm_get_desc(pdp_mesh_group(m, 1)).name);
    pdp_mesh_free(m);
    pdp_mesh_free(NULL);
    pdp_comm_free(c);
    pdp_local_group_free(g);
    PASS();
}

SUITE(comm)
{
    RUN_TEST(comm_16bit_conversions_round_to_nearest_even);
    RUN_TEST(comm_freed_rank_fails_the_others_at_once);
    RUN_TEST(comm_mismatched_collectives_fail_on_every_rank);
    RUN_TEST(comm_rejects_bad_arguments);
    RUN_TEST(comm_desc_timeout_rule);
    RUN_TEST(comm_split_rejects_a_null_out_and_names_the_group);
    RUN_TEST(comm_mesh_groups_match_a_counted_grid);
    RUN_TEST(comm_mesh_rejects_bad_dimensions);
    RUN_TEST(comm_mesh_group_failures_name_the_dimension);
}

/* ---- the conformance suite (tests/comm_conformance.h) on thread ranks ---- */

static pdp_status local_make(void *group, int rank, pdp_comm **out)
{
    return pdp_comm_create_local(out, (pdp_local_group *)group, rank);
}

static int local_run(const conf_factory *f, int n, double timeout_s, conf_fn fn, int64_t arg,
                     conf_rank *ranks)
{
    pdp_local_group *g = NULL;
    pdp_comm_desc d;
    memset(&d, 0, sizeof d);
    d.timeout_s = timeout_s;
    d.name = "conf";
    if (pdp_local_group_create(&g, n, &d) != PDP_OK) return 0;
    n = conf_threads(f, n, timeout_s, fn, arg, ranks, g, local_make);
    pdp_local_group_free(g);
    return n;
}

static void *local_alloc(pdp_comm *c, size_t bytes)
{
    (void)c;
    return malloc(bytes);
}

static void local_release(pdp_comm *c, void *p)
{
    (void)c;
    free(p);
}

static pdp_status local_copy(pdp_comm *c, void *dst, const void *src, size_t bytes)
{
    (void)c;
    memcpy(dst, src, bytes);
    return PDP_OK;
}

static const conf_factory local_factory = {"local", PDP_BACKEND_LOCAL, 1, 4, local_run,
                                           local_alloc, local_release, local_copy, local_copy,
                                           conf_threads_sync, PDP_TEST_TIMEOUT(0.2)};

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(comm);
    conf_run_suite(&local_factory);
    GREATEST_MAIN_END();
}
