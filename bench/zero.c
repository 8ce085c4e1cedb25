/* bench/zero.c: ZeRO stages 1, 2, 3 beside DDP at world size 2, same run, same data.

   Workloads (bench.h's models, batch B per rank, PyTorch's convention: each rank
   computes B samples, the step trains on 2B): the MLP 784-512-512-10 at B = 512 and
   the CNN (Conv 16 k5 p2, ReLU, MaxPool 2, Conv 32 k5 p2, ReLU, MaxPool 2, Flatten,
   Linear 10) at B = 128. One step = forward, cross-entropy, backward, Adam (lr 1e-3:
   the optimizer whose state ZeRO shards), 2 thread-ranks on the local backend, one
   thread each, default units and buckets (25 MB, the first 1 MB, as PyTorch). Peers,
   interleaved round by round so that a noisy neighbour hits them alike:
     DDP       pdp_ddp_forward_backward + pdp_ddp_step
     Z1, Z2    pdp_zero at stage 1, 2
     Z3        stage 3, prefetching the next unit's all-gather (the default)
     Z3 nopf   stage 3 with desc.no_prefetch: each gather waited when its unit starts
   A figure is the median over the rounds of samples/s (a round runs about 0.25 s of
   steps after 3 warm-up steps). Ratios: each stage's against DDP's, and what prefetch
   gains (Z3 / Z3 nopf; the FSDP paper reports ~18% on its GPUs).
   Targets on a quiet 2-core machine: Z1, Z2 >= 0.95x DDP, Z3 >= 0.85x DDP.

   make bench        ./build/bench_zero [quick]          quick: 3 rounds */

#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"

#include "bench.h"

#define MAX_ROUNDS 7
#define NPEERS 5
enum { P_DDP, P_Z1, P_Z2, P_Z3, P_Z3NP };
static const char *peer_names[NPEERS] = {"DDP", "Z1", "Z2", "Z3", "Z3 nopf"};

typedef struct job {
    bool cnn;
    int peer;
    int64_t per;             /* samples per rank */
    int steps;               /* timed steps */
    float *data;             /* [2 per, 784] */
    int32_t *labels;
    pdp_local_group *g;
    int rank;
    double seconds;          /* rank 0: timed wall time */
} job;

static void view(const job *j, int64_t first, int64_t n, pdp_tensor *x)
{
    int64_t shape[4] = {n, 784, 1, 1};
    if (j->cnn) {
        shape[1] = 1;
        shape[2] = shape[3] = 28;
    }
    CHECK(pdp_tensor_wrap(j->data + first * 784, pdp_cpu(), j->cnn ? 4 : 2, shape, x));
}

static void step(job *j, pdp_ddp *d, pdp_zero *z, pdp_optim *o, const pdp_tensor *x)
{
    const int32_t *y = j->labels + j->rank * j->per;
    float loss;
    if (d) {
        CHECK(pdp_ddp_forward_backward(d, x, y, &loss));
        CHECK(pdp_ddp_step(d, o));
    } else {
        CHECK(pdp_zero_forward_backward(z, x, y, &loss));
        CHECK(pdp_zero_step(z, o));
    }
}

/* One rank: 3 warm-up steps, a barrier, the timed steps, a barrier. */
static void *rank_thread(void *arg)
{
    job *j = (job *)arg;
    pdp_comm *c;
    pdp_model *m = bench_make_model(j->cnn);
    pdp_optim *o;
    pdp_ddp *d = NULL;
    pdp_zero *z = NULL;
    pdp_optim_desc od;
    pdp_zero_desc zd;
    pdp_tensor x;
    double t0;
    int k;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 0.001f;
    memset(&zd, 0, sizeof zd);
    zd.stage = j->peer == P_Z1 ? 1 : j->peer == P_Z2 ? 2 : 3;
    zd.no_prefetch = j->peer == P_Z3NP;
    CHECK(pdp_comm_create_local(&c, j->g, j->rank));
    if (j->peer == P_DDP) {
        CHECK(pdp_ddp_create(&d, m, c, NULL));
        CHECK(pdp_optim_create(&o, m, &od));
    } else {
        CHECK(pdp_zero_create(&z, m, c, &zd));
        CHECK(pdp_zero_optim_create(&o, z, &od));
    }
    view(j, j->rank * j->per, j->per, &x);
    for (k = 0; k < 3; k++) step(j, d, z, o, &x);
    CHECK(pdp_comm_barrier(c, NULL));
    t0 = bench_now();
    for (k = 0; k < j->steps; k++) step(j, d, z, o, &x);
    CHECK(pdp_comm_barrier(c, NULL));
    if (j->rank == 0) j->seconds = bench_now() - t0;
    pdp_zero_free(z);
    pdp_ddp_free(d);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

/* Seconds for base->steps steps of peer p at world size 2 (rank 0's). */
static double run_peer(job *base, int p)
{
    job js[2];
    pthread_t t[2];
    int r;
    CHECK(pdp_local_group_create(&base->g, 2, NULL));
    for (r = 0; r < 2; r++) {
        js[r] = *base;
        js[r].peer = p;
        js[r].rank = r;
        pthread_create(&t[r], NULL, rank_thread, &js[r]);
    }
    for (r = 0; r < 2; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(base->g);
    base->seconds = js[0].seconds;
    return base->seconds;
}

static void run(const char *name, bool cnn, int64_t per, int rounds)
{
    static double sps[NPEERS][MAX_ROUNDS];
    double med[NPEERS];
    job j;
    pdp_rng r;
    int64_t i;
    int p, k;
    memset(&j, 0, sizeof j);
    j.cnn = cnn;
    j.per = per;
    j.data = (float *)malloc((size_t)(2 * per * 784) * sizeof(float));
    j.labels = (int32_t *)malloc((size_t)(2 * per) * sizeof(int32_t));
    pdp_rng_seed(&r, 7, 0);
    for (i = 0; i < 2 * per * 784; i++) j.data[i] = pdp_rng_uniform(&r);
    for (i = 0; i < 2 * per; i++) j.labels[i] = (int32_t)pdp_rng_below(&r, 10);
    j.steps = 3; /* calibrate: steps for about 0.25 s of DDP */
    j.steps = (int)(0.25 / (run_peer(&j, P_DDP) / j.steps)) + 3;
    for (k = 0; k < rounds; k++)
        for (p = 0; p < NPEERS; p++) sps[p][k] = (double)(2 * per * j.steps) / run_peer(&j, p);
    for (p = 0; p < NPEERS; p++) med[p] = bench_median(sps[p], rounds);
    printf("%-14s %5lld |", name, (long long)per);
    for (p = 0; p < NPEERS; p++) printf(" %8.0f", med[p]);
    printf(" | %5.2fx %5.2fx %5.2fx %5.2fx | %+5.1f%%\n", med[P_Z1] / med[P_DDP],
           med[P_Z2] / med[P_DDP], med[P_Z3] / med[P_DDP], med[P_Z3NP] / med[P_DDP],
           100.0 * (med[P_Z3] / med[P_Z3NP] - 1.0));
    fflush(stdout);
    free(j.data);
    free(j.labels);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 && !strcmp(argv[1], "quick") ? 3 : MAX_ROUNDS, p;
    bench_print_load("start", 0.0);
    printf("ZeRO at world size 2 (thread-ranks, local backend), samples/s, median of %d "
           "rounds; Adam; batch per rank\n", rounds);
    printf("%-14s %5s |", "workload", "B");
    for (p = 0; p < NPEERS; p++) printf(" %8s", peer_names[p]);
    printf(" | %6s %6s %6s %6s | prefetch gain\n", "Z1/DDP", "Z2/DDP", "Z3/DDP", "nopf");
    run("MLP 784-512x2", false, 512, rounds);
    run("CNN c16-c32", true, 128, rounds);
    printf("targets: Z1, Z2 >= 0.95x DDP; Z3 >= 0.85x DDP (with prefetch)\n");
    if (bench_print_load("end", BENCH_OWN_LOAD_1_2)) printf("a loaded machine: rerun on a quiet one\n");
    pdp_shutdown_threads();
    return 0;
}
