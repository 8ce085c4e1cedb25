/* bench/pp.c: pipeline parallelism over 2 stages against one device, same run, same data.

   Workload: the MLP 1024-1024-1024-1024-1024-10 (ReLU) at a global batch of 512, split as
   stage 0 = layers 0..3 (two 1024x1024 Linears and their ReLUs), stage 1 = layers 4..8
   (two more and the 10-way head): equal GEMM work per stage but for the first Linear, which
   computes no input gradient. One step = forward, cross-entropy, backward, SGD (lr 0.01),
   zeroed gradients. Peers, measured in this run and interleaved round by round so that a
   noisy neighbour hits them alike:
     1 dev       pdp_model_forward_backward + pdp_optim_step on the whole batch, 1 thread
     2 x 1 dev   two independent single-device trainings at once: the scaling the machine
                 allows right now ("free2" = 2 x 1 dev / 1 dev; about 2x on a quiet 2-core
                 machine, lower when neighbours load it)
     PP m        pdp_pp_forward_backward + pdp_pp_step on 2 thread-ranks (local backend),
                 1F1B, the batch cut into m = 1, 2, 4, 8 micro-batches (512 .. 64 rows)
   A figure is the median over the rounds of samples/s (a round runs about 0.25 s of steps
   after 2 warm-up steps). For PP the table prints PP/1dev beside the schedule's model
   2m/(m+p-1) (p = 2: ideal 2x times the non-bubble share m/(m+p-1)), their quotient
   "of model", and the bubble measured on the stages (mean of the two, from
   pdp_pp_stats: 1 - compute / step time) beside (p-1)/(m+p-1). The model ignores that
   smaller micro-batches run smaller, less efficient GEMMs and that sends, receives and
   the pipeline's two barriers per step cost time; "of model" is what is left of them.
   Then each stage's peak activation memory (pdp_pp_stats: micro-batches held at once x
   one micro-batch's outputs, saved tensors and received input) for GPipe and 1F1B at
   m = 1, 2, 4, 8 with micro-batches of 64 rows: GPipe grows with m, 1F1B stays <= p.
   When free2 is well below 2x, neighbours hold the cores and no ratio can reach the
   model; the measured bubble, a share of each stage's own step time, suffers less.

   make bench        ./build/bench_pp [quick]          quick: 3 rounds */

#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"

#include "bench.h"

#define MAX_ROUNDS 5
#define BATCH 512
#define WIDTH 1024
static const int ms[] = {1, 2, 4, 8};
#define NM 4
enum { P_SINGLE, P_FREE2, P_PP }; /* P_PP + i: m = ms[i] */
#define NPEERS (P_PP + NM)
static pthread_barrier_t free_barrier;

typedef struct job {
    int m;                   /* micro-batches (PP) */
    int steps;
    float *data;             /* [BATCH, WIDTH] */
    int32_t *labels;
    pdp_local_group *g;
    int rank;
    bool pair;               /* the "2 x 1 dev" peer */
    double seconds, bubble;
    pdp_pp_schedule schedule;
    int64_t rows;            /* the batch (BATCH unless set) */
    pdp_pp_stats stats;      /* of the last run */
} job;

static pdp_model *make_model(void)
{
    pdp_model_desc md;
    pdp_model *m;
    int i;
    memset(&md, 0, sizeof md);
    md.seed = 1;
    md.input_shape[0] = WIDTH;
    CHECK(pdp_model_create(&m, &md));
    for (i = 0; i < 4; i++) {
        CHECK(pdp_model_add_linear(m, WIDTH));
        CHECK(pdp_model_add_relu(m));
    }
    CHECK(pdp_model_add_linear(m, 10));
    return m;
}

static void batch_view(const job *j, pdp_tensor *x)
{
    int64_t shape[2] = {j->rows ? j->rows : BATCH, WIDTH};
    CHECK(pdp_tensor_wrap(j->data, pdp_cpu(), 2, shape, x));
}

static void single_rank(job *j)
{
    pdp_model *m = make_model();
    pdp_optim *o;
    pdp_optim_desc od;
    pdp_tensor x;
    float loss;
    double t0 = bench_now();
    int k;
    memset(&od, 0, sizeof od);
    od.lr = 0.01f;
    CHECK(pdp_optim_create(&o, m, &od));
    batch_view(j, &x);
    for (k = 0; k < 2 + j->steps; k++) {
        if (k == 2) {
            if (j->pair) pthread_barrier_wait(&free_barrier);
            t0 = bench_now();
        }
        CHECK(pdp_model_forward_backward(m, &x, j->labels, &loss));
        CHECK(pdp_optim_step(o));
        pdp_optim_zero_grad(o);
    }
    if (j->pair) pthread_barrier_wait(&free_barrier);
    j->seconds = bench_now() - t0;
    pdp_optim_free(o);
    pdp_model_free(m);
}

static void *single_thread(void *arg)
{
    single_rank((job *)arg);
    return NULL;
}

static void *pp_thread(void *arg)
{
    static const int first[2] = {0, 4};
    job *j = (job *)arg;
    pdp_comm *c;
    pdp_model *full = make_model();
    pdp_pp *pp;
    pdp_pp_desc pd;
    pdp_optim *o;
    pdp_optim_desc od;
    pdp_pp_stats s0, s1;
    pdp_tensor x;
    float loss;
    double t0;
    int k;
    CHECK(pdp_comm_create_local(&c, j->g, j->rank));
    memset(&pd, 0, sizeof pd);
    pd.micro_batches = j->m;
    pd.first_layer = first;
    pd.schedule = j->schedule;
    CHECK(pdp_pp_create(&pp, full, c, &pd));
    pdp_model_free(full);
    memset(&od, 0, sizeof od);
    od.lr = 0.01f;
    CHECK(pdp_optim_create(&o, pdp_pp_model(pp), &od));
    batch_view(j, &x);
    for (k = 0; k < 2; k++) {
        CHECK(pdp_pp_forward_backward(pp, &x, j->labels, &loss));
        CHECK(pdp_pp_step(pp, o));
    }
    pdp_pp_get_stats(pp, &s0);
    CHECK(pdp_comm_barrier(c, NULL));
    t0 = bench_now();
    for (k = 0; k < j->steps; k++) {
        CHECK(pdp_pp_forward_backward(pp, &x, j->labels, &loss));
        CHECK(pdp_pp_step(pp, o));
    }
    CHECK(pdp_comm_barrier(c, NULL));
    j->seconds = bench_now() - t0;
    pdp_pp_get_stats(pp, &s1);
    j->stats = s1;
    j->bubble = 1.0 - (s1.total_compute_s - s0.total_compute_s) /
                          (s1.total_step_s - s0.total_step_s);
    pdp_optim_free(o);
    pdp_pp_free(pp);
    pdp_comm_free(c);
    return NULL;
}

/* Seconds for base->steps steps of peer p (and, for PP, the stages' mean bubble). */
static job js[2];

static double run_peer(job *base, int p)
{
    pthread_t t[2];
    int r;
    if (p == P_SINGLE) {
        base->pair = false;
        single_rank(base);
        return base->seconds;
    }
    for (r = 0; r < 2; r++) {
        js[r] = *base;
        js[r].rank = r;
    }
    if (p == P_FREE2) {
        pthread_barrier_init(&free_barrier, NULL, 2);
        for (r = 0; r < 2; r++) {
            js[r].pair = true;
            pthread_create(&t[r], NULL, single_thread, &js[r]);
        }
        for (r = 0; r < 2; r++) pthread_join(t[r], NULL);
        pthread_barrier_destroy(&free_barrier);
    } else {
        CHECK(pdp_local_group_create(&base->g, 2, NULL));
        for (r = 0; r < 2; r++) {
            js[r].g = base->g;
            js[r].m = ms[p - P_PP];
            pthread_create(&t[r], NULL, pp_thread, &js[r]);
        }
        for (r = 0; r < 2; r++) pthread_join(t[r], NULL);
        pdp_local_group_free(base->g);
        base->bubble = 0.5 * (js[0].bubble + js[1].bubble);
    }
    base->seconds = js[0].seconds > js[1].seconds ? js[0].seconds : js[1].seconds;
    return base->seconds;
}

int main(int argc, char **argv)
{
    static double sps[NPEERS][MAX_ROUNDS], bub[NM][MAX_ROUNDS];
    int rounds = argc > 1 && !strcmp(argv[1], "quick") ? 3 : MAX_ROUNDS, p, k, i;
    double med[NPEERS];
    job j;
    pdp_rng r;
    memset(&j, 0, sizeof j);
    j.data = (float *)malloc((size_t)BATCH * WIDTH * sizeof(float));
    j.labels = (int32_t *)malloc((size_t)BATCH * sizeof(int32_t));
    pdp_rng_seed(&r, 7, 0);
    for (i = 0; i < BATCH * WIDTH; i++) j.data[i] = pdp_rng_uniform(&r);
    for (i = 0; i < BATCH; i++) j.labels[i] = (int32_t)pdp_rng_below(&r, 10);
    bench_print_load("start", 0.0);
    j.steps = 2; /* calibrate: about 0.25 s of single-device training per peer and round */
    j.steps = (int)(0.25 / (run_peer(&j, P_SINGLE) / 2)) + 2;
    for (k = 0; k < rounds; k++)
        for (p = 0; p < NPEERS; p++) {
            run_peer(&j, p);
            sps[p][k] = (p == P_FREE2 ? 2.0 : 1.0) * BATCH * j.steps / j.seconds; /* both */
            if (p >= P_PP) bub[p - P_PP][k] = j.bubble;
        }
    for (p = 0; p < NPEERS; p++) med[p] = bench_median(sps[p], rounds);
    printf("PP, 2 stages (thread-ranks, local backend, 1F1B), MLP %d-%dx4-10, global batch %d, "
           "samples/s, median of %d rounds\n", WIDTH, WIDTH, BATCH, rounds);
    printf("1 dev %.0f   2 x 1 dev %.0f (free2 %.2fx: what the machine allows now)\n",
           med[P_SINGLE], med[P_FREE2], med[P_FREE2] / med[P_SINGLE]);
    printf("%3s %5s %10s | %7s %10s %8s | %7s %13s\n", "m", "rows", "PP", "PP/1dev",
           "2m/(m+p-1)", "of model", "bubble", "(p-1)/(m+p-1)");
    for (i = 0; i < NM; i++) {
        double model = 2.0 * ms[i] / (ms[i] + 1.0), ratio = med[P_PP + i] / med[P_SINGLE];
        printf("%3d %5d %10.0f | %6.2fx %9.2fx %7.0f%% | %7.2f %13.2f\n", ms[i], BATCH / ms[i],
               med[P_PP + i], ratio, model, 100.0 * ratio / model, bench_median(bub[i], rounds),
               1.0 / (ms[i] + 1.0));
    }
    /* activation memory: micro-batches of 64 rows, so the global batch is 64 m */
    printf("peak activation memory per stage, micro-batches of 64 rows (batch 64 m): GPipe "
           "holds m, 1F1B at most p - s\n%3s | %-28s | %-28s\n", "m", "GPipe stage 0, stage 1",
           "1F1B stage 0, stage 1");
    j.steps = 1;
    for (i = 0; i < NM; i++) {
        printf("%3d", ms[i]);
        for (k = 0; k < 2; k++) {
            j.schedule = k ? PDP_PP_1F1B : PDP_PP_GPIPE;
            j.rows = 64 * ms[i];
            run_peer(&j, P_PP + i);
            printf(" | %d mb %5.2f MB, %d mb %5.2f MB", js[0].stats.peak_in_flight,
                   js[0].stats.peak_activation_bytes / 1e6, js[1].stats.peak_in_flight,
                   js[1].stats.peak_activation_bytes / 1e6);
        }
        printf("\n");
    }
    if (bench_print_load("end", BENCH_OWN_LOAD_1_2)) printf("trust the bubble column more than the wall-clock ratios\n");
    free(j.data);
    free(j.labels);
    pdp_shutdown_threads();
    return 0;
}
