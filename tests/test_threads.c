/* test_threads.c - the intra-op thread pool: settings, coverage, reuse, contention.

   pdp__parallel_for must run every index exactly once, on the pool plus the
   caller; two threads that use the pool at once must both finish (the loser of
   the trylock runs its job serially) and get the same GEMM bits as alone; a job
   that calls parallel_for from inside must not deadlock; pdp_shutdown_threads
   joins the workers and the pool starts again on the next call. The profile
   (pdp_profile_*): its parts add up within the wall time, each part is at most the
   time measured around the calls it counts, nothing counts while it is off, and the
   workers' idle time is (threads - 1) x wall minus their busy parts. Run under TSan by
   `make tsan`. */

#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"

#include <pthread.h>
#ifndef _WIN32
#  include <signal.h>
#  include <sys/wait.h>
#  include <unistd.h>
#endif

/* ---- helpers ---- */

typedef struct hits {
    int count[64];
    int n_seen[64];
    pthread_t who[64];
} hits;

static void mark(void *arg, int i, int n)
{
    hits *h = (hits *)arg;
    h->count[i]++; /* each index is written by one thread only */
    h->n_seen[i] = n;
    h->who[i] = pthread_self();
}

static void nested(void *arg, int i, int n)
{
    hits *h = (hits *)arg;
    hits inner;
    int j;
    memset(&inner, 0, sizeof inner);
    pdp__parallel_for(3, mark, &inner); /* the pool is busy: runs here, serially */
    for (j = 0; j < 3; j++) h->count[i] += inner.count[j];
    h->n_seen[i] = n;
}

/* ---- tests ---- */

TEST threads_setting_is_per_thread(void)
{
    long cores = pdp__cpu_count();
    ASSERT_EQ(1, pdp_get_num_threads());
    ASSERT_ENUM_EQ(PDP_OK, pdp_set_num_threads(3), pdp_status_name);
    ASSERT_EQ(3, pdp_get_num_threads());
    ASSERT_EQ(3, pdp__threads_for_caller());
    ASSERT_ENUM_EQ(PDP_OK, pdp_set_num_threads(0), pdp_status_name);
    ASSERT_EQ(cores > 0 ? (int)cores : 1, pdp_get_num_threads());
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_set_num_threads(100000), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_set_num_threads") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "100000") != NULL);
    ASSERT_EQ(cores > 0 ? (int)cores : 1, pdp_get_num_threads()); /* unchanged by the failure */
    pdp_set_num_threads(1);
    PASS();
}

static void *read_setting(void *out)
{
    *(int *)out = pdp_get_num_threads();
    return NULL;
}

TEST threads_new_thread_starts_at_one(void)
{
    pthread_t t;
    int seen = -1;
    pdp_set_num_threads(4);
    ASSERT_EQ(0, pthread_create(&t, NULL, read_setting, &seen));
    pthread_join(t, NULL);
    pdp_set_num_threads(1);
    ASSERT_EQ(1, seen);
    PASS();
}

/* The worker team on its own (pdp__team, under the pool and DataParallel): member i
   runs index i, the caller index 0 and every index past its members; a job smaller
   than the team leaves the extra members out; the same threads serve every job; free
   joins them, and the team can start again. */
TEST threads_team_runs_each_index_once_on_its_member(void)
{
    static pdp__team team; /* ~8 KB: not on the stack */
    pthread_t member[4];
    int n, i, rep, again;
    pdp__team_free(&team); /* a zeroed team: nothing to join, no crash */
    for (again = 0; again < 2; again++) {
        ASSERT_EQ(0, pdp__team_init(&team));
        ASSERT_EQ(0, pdp__team_grow(&team, 3));
        ASSERT_EQ(3, team.nworkers);
        for (rep = 0; rep < 20; rep++) {
            for (n = 0; n <= 6; n++) {
                hits h;
                memset(&h, 0, sizeof h);
                pdp__team_run(&team, n, mark, &h);
                for (i = 0; i < 64; i++) ASSERT_EQ(i < n ? 1 : 0, h.count[i]);
                for (i = 0; i < n; i++) {
                    ASSERT_EQ(n, h.n_seen[i]);
                    if (i == 0 || i > 3) { /* the caller's */
                        ASSERT(pthread_equal(h.who[i], pthread_self()));
                    } else if (rep == 0 && n == 4) { /* the first job all members run */
                        member[i] = h.who[i];
                        ASSERT(!pthread_equal(h.who[i], pthread_self()));
                    } else if (rep > 0) { /* the same member thread every time */
                        ASSERT(pthread_equal(h.who[i], member[i]));
                    }
                }
            }
        }
        pdp__team_free(&team);
        ASSERT(!team.ok);
        ASSERT_EQ(0, team.nworkers);
    }
    PASS();
}

TEST threads_parallel_for_covers_every_index_once(void)
{
    int n, i, rep, others;
    for (rep = 0; rep < 20; rep++) {
        for (n = 0; n <= 8; n++) {
            hits h;
            memset(&h, 0, sizeof h);
            pdp__parallel_for(n, mark, &h);
            for (i = 0; i < 64; i++) {
                ASSERT_EQ(i < n ? 1 : 0, h.count[i]);
                if (i < n) ASSERT_EQ(n, h.n_seen[i]);
            }
            if (n >= 2) { /* index 0 is the caller's, the others ran on workers */
                ASSERT(pthread_equal(h.who[0], pthread_self()));
                for (others = 0, i = 1; i < n; i++) others += !pthread_equal(h.who[i], pthread_self());
                ASSERT_EQ(n - 1, others);
            }
        }
    }
    PASS();
}

TEST threads_nested_call_runs_serially(void)
{
    hits h;
    int i;
    memset(&h, 0, sizeof h);
    pdp__parallel_for(2, nested, &h);
    for (i = 0; i < 2; i++) {
        ASSERT_EQ(3, h.count[i]);
        ASSERT_EQ(2, h.n_seen[i]);
    }
    PASS();
}

/* Two callers hammer the pool with GEMMs on 2 threads; each checks its bits against
   a 1-thread result computed beforehand. */
#define CM 96
#define CK 200
#define CN 160

typedef struct contender {
    float a[CM * CK], b[CK * CN], c[CM * CN], want[CM * CN];
    int mismatches;
    int jobs;
} contender;

static void *contend(void *arg)
{
    contender *x = (contender *)arg;
    int r;
    pdp_set_num_threads(2);
    for (r = 0; r < 100; r++) {
        hits h;
        memset(&h, 0, sizeof h);
        pdp_sgemm(PDP_NO_TRANS, PDP_NO_TRANS, CM, CN, CK, 1.0f, x->a, CK, x->b, CN, 0.0f, x->c, CN);
        if (memcmp(x->c, x->want, sizeof x->c) != 0) x->mismatches++;
        pdp__parallel_for(2, mark, &h);
        x->jobs += h.count[0] + h.count[1];
    }
    return NULL;
}

TEST threads_concurrent_callers_do_not_deadlock(void)
{
    static contender x[2];
    pthread_t t[2];
    int i, j;
    for (i = 0; i < 2; i++) {
        for (j = 0; j < CM * CK; j++) x[i].a[j] = (float)((j * 7 + i) % 13) - 6.0f;
        for (j = 0; j < CK * CN; j++) x[i].b[j] = (float)((j * 5 + 3 * i) % 11) * 0.25f;
        pdp_sgemm(PDP_NO_TRANS, PDP_NO_TRANS, CM, CN, CK, 1.0f, x[i].a, CK, x[i].b, CN, 0.0f,
                  x[i].want, CN);
        x[i].mismatches = 0;
        x[i].jobs = 0;
    }
    for (i = 0; i < 2; i++) ASSERT_EQ(0, pthread_create(&t[i], NULL, contend, &x[i]));
    for (i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (i = 0; i < 2; i++) {
        ASSERT_EQ(0, x[i].mismatches);
        ASSERT_EQ(200, x[i].jobs);
    }
    PASS();
}

/* Independent objects on threads of their own (the manual's "Objects and threads"): a model
   trained alone at 2 intra-op threads and a 2-rank DDP world (pdp_launch), each on a user
   thread, at once, end with the bits each ends with alone. */
#define IM_IN 24
#define IM_B 8
typedef struct indep_job {
    int ddp;                 /* 0: one model alone; 1: a DDP world of 2 thread ranks */
    float params[IM_IN * 32 + 32 + 32 * 4 + 4];
    pdp_status st;
} indep_job;

static pdp_status indep_train(pdp_model *m, pdp_ddp *d, int rank, int ranks)
{
    float x[IM_B * IM_IN], loss;
    int32_t y[IM_B];
    int64_t rows = IM_B / ranks;
    pdp_optim *o;
    pdp_tensor xt;
    pdp_status st = PDP_OK;
    int i, step;
    PDP_TRY(pdp_optim_create(&o, m, &(pdp_optim_desc){.kind = PDP_OPTIM_ADAM, .lr = 0.01}));
    for (step = 0; st == PDP_OK && step < 3; step++) {
        for (i = 0; i < IM_B * IM_IN; i++) x[i] = (float)((i * 7 + step * 3) % 17) * 0.1f - 0.8f;
        for (i = 0; i < IM_B; i++) y[i] = (i + step) % 4;
        pdp_tensor_wrap(x + rank * rows * IM_IN, pdp_cpu(), 2, (int64_t[]){rows, IM_IN}, &xt);
        if (d && (st = pdp_ddp_forward_backward(d, &xt, y + rank * rows, &loss)) == PDP_OK)
            st = pdp_ddp_step(d, o);
        else if (!d && (st = pdp_model_forward_backward(m, &xt, y, &loss)) == PDP_OK) {
            st = pdp_optim_step(o);
            pdp_optim_zero_grad(o);
        }
    }
    pdp_optim_free(o);
    return st;
}

static pdp_status indep_rank(const pdp_launch_ctx *ctx, void *user)
{
    indep_job *j = (indep_job *)user;
    pdp_model *m;
    pdp_ddp *d = NULL;
    pdp_tensor p;
    pdp_status st;
    PDP_TRY(pdp_set_num_threads(2));
    PDP_TRY(pdp_model_create(&m, &(pdp_model_desc){.input_shape = {IM_IN}, .seed = 5}));
    if ((st = pdp_model_add_linear(m, 32)) == PDP_OK && (st = pdp_model_add_relu(m)) == PDP_OK &&
        (st = pdp_model_add_linear(m, 4)) == PDP_OK &&
        (!ctx->world || (st = pdp_ddp_create(&d, m, ctx->world, NULL)) == PDP_OK) &&
        (st = indep_train(m, d, ctx->rank, ctx->world_size)) == PDP_OK &&
        (st = pdp_model_flat(m, &p, NULL)) == PDP_OK && ctx->rank == 0)
        memcpy(j->params, p.data, sizeof j->params);
    pdp_ddp_free(d);
    pdp_model_free(m);
    return st;
}

static void *indep_run(void *arg)
{
    indep_job *j = (indep_job *)arg;
    pdp_launch_ctx one = {0};
    one.world_size = 1; /* alone: no world */
    j->st = j->ddp ? pdp_launch(2, NULL, indep_rank, j) : indep_rank(&one, j);
    return NULL;
}

TEST threads_independent_models_train_at_once_as_alone(void)
{
    static indep_job alone[2], together[2];
    pthread_t t[2];
    int i;
    for (i = 0; i < 2; i++) {
        alone[i].ddp = together[i].ddp = i;
        indep_run(&alone[i]);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, alone[i].st, pdp_status_name);
    }
    for (i = 0; i < 2; i++) ASSERT_EQ(0, pthread_create(&t[i], NULL, indep_run, &together[i]));
    for (i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (i = 0; i < 2; i++) {
        ASSERT_ENUM_EQ(PDP_OK, together[i].st, pdp_status_name);
        ASSERT_MEM_EQ(alone[i].params, together[i].params, sizeof alone[i].params);
    }
    ASSERT(memcmp(alone[0].params, alone[1].params, sizeof alone[0].params) != 0);
    PASS();
}

TEST threads_shutdown_then_reuse(void)
{
    int rep, i;
    for (rep = 0; rep < 3; rep++) {
        hits h;
        memset(&h, 0, sizeof h);
        pdp__parallel_for(4, mark, &h);
        for (i = 0; i < 4; i++) ASSERT_EQ(1, h.count[i]);
        pdp_shutdown_threads();
    }
    pdp_shutdown_threads(); /* twice in a row is fine */
    PASS();
}

/* fork() after the pool started: the child has the forking thread only. Its first job waited
   for the parent's workers (pending never reached 0): a hang; pdp_shutdown_threads there
   joined threads that were not the child's. The child runs jobs, shuts the pool down and
   runs again; the parent gives it 60 seconds. */
TEST threads_pool_works_in_a_forked_child(void)
{
#if defined(_WIN32)
    SKIPm("no fork() on Windows");
#elif PDP_TEST_UNDER_TSAN
    SKIPm("ThreadSanitizer starts no thread in the child of a multi-threaded fork()");
#else
    hits h;
    pid_t pid;
    int status = -1, i;
    double t0;
    if (getenv("PDP_TEST_EXEC")) /* make cross-test's emulator (child_process.h) */
        SKIPm("qemu-user cannot start threads in the child of a multi-threaded fork()");
    memset(&h, 0, sizeof h);
    pdp__parallel_for(4, mark, &h); /* the pool runs, with 3 workers */
    for (i = 0; i < 4; i++) ASSERT_EQ(1, h.count[i]);
    fflush(NULL);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        int ok = 1, rep, j;
        for (rep = 0; rep < 2; rep++) {
            hits c;
            memset(&c, 0, sizeof c);
            pdp__parallel_for(4, mark, &c);
            for (j = 0; j < 4; j++) ok &= c.count[j] == 1;
            pdp_shutdown_threads();
        }
        _exit(ok ? 0 : 1);
    }
    t0 = pdp_seconds();
    while (waitpid(pid, &status, WNOHANG) == 0 && pdp_seconds() - t0 < 60) pdp__sleep_s(0.01);
    if (pdp_seconds() - t0 >= 60) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        FAILm("the child's first job hung (it waited for the parent's workers)");
    }
    ASSERTm("the child died or failed", WIFEXITED(status) && WEXITSTATUS(status) == 0);
    memset(&h, 0, sizeof h);
    pdp__parallel_for(4, mark, &h); /* the parent's pool is untouched */
    for (i = 0; i < 4; i++) ASSERT_EQ(1, h.count[i]);
    PASS();
#endif
}

TEST threads_scratch_grows_and_is_reused(void)
{
    unsigned char *p = (unsigned char *)pdp__thread_scratch(1000), *q;
    ASSERT(p != NULL);
    ASSERT_EQ(0, (int)((uintptr_t)p % 64));
    memset(p, 1, 1000);
    q = (unsigned char *)pdp__thread_scratch(500);
    ASSERT(p == q); /* smaller request: same block, no allocation */
    q = (unsigned char *)pdp__thread_scratch(1 << 20);
    ASSERT(q != NULL);
    memset(q, 2, 1 << 20);
    pdp_shutdown_threads(); /* frees it */
    PASS();
}

/* ---- the profile ---- */

static void spin_for(double seconds)
{
    double t = pdp__now();
    volatile double x = 0.0;
    while (pdp__now() - t < seconds) x += 1.0;
}

static void spin_part(void *arg, int i, int n)
{
    (void)i, (void)n;
    spin_for(*(const double *)arg);
}

/* Linear, Tanh, Linear: a layer without weights that runs on its own (a ReLU after a Linear
   is applied by the Linear and counted with it, layers.c) */
static pdp_model *profile_mlp(void)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 64;
    md.seed = 3;
    if (pdp_model_create(&m, &md) != PDP_OK) return NULL;
    if (pdp_model_add_linear(m, 96) != PDP_OK || pdp_model_add_tanh(m) != PDP_OK ||
        pdp_model_add_linear(m, 10) != PDP_OK) {
        pdp_model_free(m);
        return NULL;
    }
    return m;
}

TEST threads_profile_parts_add_up_and_stop(void)
{
    pdp_model *m = profile_mlp();
    pdp_optim *o = NULL;
    pdp_optim_desc od;
    pdp_tensor *x = NULL;
    pdp_profile p, q;
    int64_t shape[2] = {32, 64};
    int32_t y[32];
    double t_fb = 0.0, t_opt = 0.0, t;
    float loss;
    pdp_rng r;
    int i;
    ASSERT(m != NULL);
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 1e-3f;
    ASSERT_EQ(PDP_OK, pdp_optim_create(&o, m, &od));
    ASSERT_EQ(PDP_OK, pdp_tensor_create(&x, pdp_cpu(), 2, shape));
    pdp_rng_seed(&r, 1, 0);
    ASSERT_EQ(PDP_OK, pdp_tensor_uniform(x, &r, -1.0f, 1.0f));
    for (i = 0; i < 32; i++) y[i] = i % 10;
    ASSERT_EQ(PDP_OK, pdp_set_num_threads(1));
    pdp_profile_start();
    for (i = 0; i < 30; i++) {
        t = pdp__now();
        ASSERT_EQ(PDP_OK, pdp_model_forward_backward(m, x, y, &loss));
        t_fb += pdp__now() - t;
        t = pdp__now();
        ASSERT_EQ(PDP_OK, pdp_optim_step(o));
        pdp_optim_zero_grad(o);
        t_opt += pdp__now() - t;
    }
    pdp_profile_stop(&p);
    /* each part happened, and is no more than the time measured around its calls */
    ASSERT(p.gemm_layers_s > 0.0 && p.other_layers_s > 0.0 && p.loss_s > 0.0);
    ASSERT(p.optim_s > 0.0 && p.optim_s <= t_opt);
    ASSERT(p.gemm_layers_s + p.other_layers_s + p.loss_s <= t_fb);
    ASSERT(p.wall_s >= t_fb + t_opt);
    ASSERT_IN_RANGE(p.wall_s, p.gemm_layers_s + p.other_layers_s + p.loss_s + p.optim_s +
                                  p.other_s, 1e-9);
    ASSERT_EQ(1, p.threads);
    ASSERT_EQ(0.0, p.idle_s);
    /* off: nothing more counts, and the wall time stays where stop put it */
    ASSERT_EQ(PDP_OK, pdp_model_forward_backward(m, x, y, &loss));
    ASSERT_EQ(PDP_OK, pdp_optim_step(o));
    pdp_profile_read(&q);
    ASSERT_EQ(p.wall_s, q.wall_s);
    ASSERT_EQ(p.gemm_layers_s, q.gemm_layers_s);
    ASSERT_EQ(p.loss_s, q.loss_s);
    ASSERT_EQ(p.optim_s, q.optim_s);
    pdp_profile_stop(NULL); /* NULL is fine */
    pdp_tensor_free(x);
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

TEST threads_profile_idle_is_workers_without_work(void)
{
    pdp_profile p;
    double part = 0.03, serial = 0.06;
    ASSERT_EQ(PDP_OK, pdp_set_num_threads(2));
    pdp_profile_start();
    spin_for(serial);                         /* the worker has nothing to do */
    pdp__parallel_for(2, spin_part, &part);   /* both busy for `part` */
    pdp_profile_stop(&p);
    ASSERT_EQ(2, p.threads);
    /* idle = the worker's wall minus its busy part, plus the caller's wait for it: at
       least `serial`; the parallel part counts only as far as one of the two threads
       waited for the other (a late start d adds d for each: at most 2 wall - serial -
       2 part), never as a whole */
    ASSERT(p.wall_s >= serial + part);
    ASSERT(p.idle_s >= serial * 0.9);
    ASSERT(p.idle_s <= 2.0 * p.wall_s - serial - 2.0 * part + 1e-3);
    ASSERT_EQ(PDP_OK, pdp_set_num_threads(1));
    PASS();
}

SUITE(threads)
{
    RUN_TEST(threads_setting_is_per_thread);
    RUN_TEST(threads_new_thread_starts_at_one);
    RUN_TEST(threads_team_runs_each_index_once_on_its_member);
    RUN_TEST(threads_parallel_for_covers_every_index_once);
    RUN_TEST(threads_nested_call_runs_serially);
    RUN_TEST(threads_concurrent_callers_do_not_deadlock);
    RUN_TEST(threads_independent_models_train_at_once_as_alone);
    RUN_TEST(threads_shutdown_then_reuse);
    RUN_TEST(threads_pool_works_in_a_forked_child);
    RUN_TEST(threads_scratch_grows_and_is_reused);
    RUN_TEST(threads_profile_parts_add_up_and_stop);
    RUN_TEST(threads_profile_idle_is_workers_without_work);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(threads);
    pdp_shutdown_threads();
    GREATEST_MAIN_END();
}
