/* bench/dp.c: speed-up of DataParallel with 2 workers over 1, same run, same data.

   Workloads: the MLP 784-512-512-10 (ReLU) at batch 128 and 512, and a small CNN
   on 1x28x28 (Conv 16 k5 p2, ReLU, MaxPool 2, Conv 32 k5 p2, ReLU, MaxPool 2,
   Flatten, Linear 10) at batch 128. One training step = forward, cross-entropy,
   backward, SGD (lr 0.01) and zeroing the gradients. Peers, all measured in this
   run and interleaved round by round so that a noisy neighbour hits them alike:
     1 dev 1T   pdp_model_forward_backward + pdp_optim_step, 1 intra-op thread
     1 dev 2T   the same with 2 intra-op threads (pdp_set_num_threads(2))
     DP 1       pdp_dp_step with 1 worker
     DP 2       pdp_dp_step with 2 workers (1 intra-op thread each)
     1T b/2     1 dev 1T on the first half of the batch: what one of DP 2's replicas
                computes, alone on the machine, so "bound" = DP 1 / 1T b/2 is the most
                DP 2 could gain if the gather, reduce and master step cost nothing and
                two replicas ran side by side as fast as one alone
   Each figure is the median over 7 rounds of the mean step time of a round
   (a round runs about 0.15 s of steps after 3 warm-up steps). Under each row,
   DP 2's mean step split into its stages (pdp_dp_get_stats).

   A shared machine: when other processes compete for the two cores, wall time
   measures the scheduler more than DP. So each row also gives the critical path
   in CPU time - for a single device the calling thread's CPU time
   (CLOCK_THREAD_CPUTIME_ID), for DP the step's critical_cpu (pdp_dp_times: the
   calling thread's own work plus the busiest worker's CPU time in apply and in
   reduce) - which is what the step would take with a core per thread and no
   neighbours ("cpu" columns; not defined for 1 dev 2T, whose pool threads are not
   counted). Compare the two speed-ups, and the load average printed at the end
   (bench/bench.h).

   make bench           ./build/bench_dp [quick]   quick: 3 rounds, for a smoke run */

#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"

#include "bench.h"

#define MAX_ROUNDS 7
#define NPEERS 5

static const char *peer_names[NPEERS] = {"1 dev 1T", "1 dev 2T", "DP 1", "DP 2", "1T b/2"};

typedef struct peer {
    pdp_model *m;
    pdp_optim *opt;
    pdp_dp *dp;   /* NULL: single device */
    int threads;  /* intra-op threads of the calling thread (single device) */
    bool half;    /* single device on the first half of the batch */
} peer;

static void peer_step(peer *p, const pdp_tensor *x, const int32_t *y)
{
    float loss;
    pdp_tensor h;
    if (p->half) {
        CHECK(pdp_tensor_rows_view(x, 0, x->shape[0] / 2, &h));
        x = &h;
    }
    if (p->dp) {
        CHECK(pdp_dp_step(p->dp, p->opt, x, y, &loss));
    } else {
        CHECK(pdp_set_num_threads(p->threads));
        CHECK(pdp_model_forward_backward(p->m, x, y, &loss));
        CHECK(pdp_optim_step(p->opt));
        pdp_optim_zero_grad(p->opt);
        CHECK(pdp_set_num_threads(1));
    }
}

/* Mean wall seconds per step over about `budget` seconds of steps; *cpu gets the
   mean critical path in CPU seconds. */
static double time_round(peer *p, const pdp_tensor *x, const int32_t *y, double budget, double *cpu)
{
    int steps = 0;
    double t0 = bench_now(), c0 = bench_thread_cpu(), t;
    pdp_dp_stats s0, s1;
    if (p->dp) CHECK(pdp_dp_get_stats(p->dp, &s0));
    do {
        peer_step(p, x, y);
        steps++;
        t = bench_now() - t0;
    } while (t < budget);
    *cpu = (bench_thread_cpu() - c0) / steps;
    if (p->dp) {
        CHECK(pdp_dp_get_stats(p->dp, &s1));
        *cpu = (s1.sum.critical_cpu - s0.sum.critical_cpu) / steps;
    }
    return t / steps;
}

static void run(const char *name, bool cnn, int64_t batch, int rounds, double ratios[2])
{
    peer peers[NPEERS];
    double times[NPEERS][MAX_ROUNDS], cpus[NPEERS][MAX_ROUNDS], med[NPEERS], cmed[NPEERS];
    int64_t shape[4], per = cnn ? 784 : 784, i;
    pdp_optim_desc od;
    pdp_tensor x;
    pdp_rng r;
    float *data = (float *)malloc((size_t)(batch * per) * sizeof(float));
    int32_t *labels = (int32_t *)malloc((size_t)batch * sizeof(int32_t));
    pdp_dp_stats st;
    int k, round;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_SGD;
    od.lr = 0.01f;
    pdp_rng_seed(&r, 7, 0);
    for (i = 0; i < batch * per; i++) data[i] = pdp_rng_uniform(&r);
    for (i = 0; i < batch; i++) labels[i] = (int32_t)pdp_rng_below(&r, 10);
    shape[0] = batch;
    shape[1] = cnn ? 1 : 784;
    shape[2] = shape[3] = 28;
    CHECK(pdp_tensor_wrap(data, pdp_cpu(), cnn ? 4 : 2, shape, &x));

    for (k = 0; k < NPEERS; k++) {
        peer *p = &peers[k];
        memset(p, 0, sizeof *p);
        p->m = bench_make_model(cnn);
        p->threads = k == 1 ? 2 : 1;
        p->half = k == 4;
        CHECK(pdp_optim_create(&p->opt, p->m, &od));
        if (k == 2 || k == 3) {
            pdp_dp_desc dd;
            memset(&dd, 0, sizeof dd);
            dd.num_workers = k - 1;
            CHECK(pdp_dp_create(&p->dp, p->m, &dd));
        }
        for (i = 0; i < 3; i++) peer_step(p, &x, labels); /* warm-up: buffers, pool, caches */
    }
    for (round = 0; round < rounds; round++)
        for (k = 0; k < NPEERS; k++)
            times[k][round] = time_round(&peers[k], &x, labels, 0.15, &cpus[k][round]);
    for (k = 0; k < NPEERS; k++) {
        med[k] = bench_median(times[k], rounds);
        cmed[k] = bench_median(cpus[k], rounds);
    }
    ratios[0] = med[2] / med[3];
    ratios[1] = cmed[2] / cmed[3];
    printf("%-20s %5lld", name, (long long)batch);
    for (k = 0; k < NPEERS; k++) printf(" %8.2f", med[k] * 1e3);
    printf("  %6.2fx %6.2fx %6.2fx |", ratios[0], med[1] / med[3], med[2] / med[4]);
    for (k = 0; k < NPEERS; k++)
        if (k == 1) printf(" %8s", "-");
        else printf(" %8.2f", cmed[k] * 1e3);
    printf("  %6.2fx\n", ratios[1]);

    /* DP 2's stages, for the breakdown table */
    CHECK(pdp_dp_get_stats(peers[3].dp, &st));
    {
        double s = 1e3 / (double)st.steps;
        printf("%-26s DP 2 mean ms: replicate %.3f scatter %.3f apply %.3f (cpu %.3f) gather %.3f "
               "reduce %.3f (cpu %.3f) step %.3f total %.3f\n",
               "", st.sum.replicate * s, st.sum.scatter * s, st.sum.apply * s,
               st.sum.apply_cpu * s, st.sum.gather * s, st.sum.reduce * s, st.sum.reduce_cpu * s,
               st.sum.step * s, st.sum.total * s);
    }
    for (k = 0; k < NPEERS; k++) {
        pdp_dp_free(peers[k].dp);
        pdp_optim_free(peers[k].opt);
        pdp_model_free(peers[k].m);
    }
    free(data);
    free(labels);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 && strcmp(argv[1], "quick") == 0 ? 3 : MAX_ROUNDS, k;
    double mlp128[2], mlp512[2], cnn128[2];
    printf("DataParallel, median ms per training step (SGD) of %d rounds; speed-up = DP 1 / DP 2,"
           " vs 2T = 1 dev 2T / DP 2, bound = DP 1 / 1T b/2\n", rounds);
    printf("%-20s %5s", "", "");
    printf(" %-71s| %-53s\n", "wall clock", "critical path in CPU time");
    printf("%-20s %5s", "workload", "batch");
    for (k = 0; k < NPEERS; k++) printf(" %8s", peer_names[k]);
    printf("  %7s %7s %7s |", "speedup", "vs 2T", "bound");
    for (k = 0; k < NPEERS; k++) printf(" %8s", peer_names[k]);
    printf("  %7s\n", "speedup");
    run("MLP 784-512-512-10", false, 128, rounds, mlp128);
    run("MLP 784-512-512-10", false, 512, rounds, mlp512);
    run("CNN c16-c32-fc10", true, 128, rounds, cnn128);
    printf("target: DP 2 over DP 1 >= 1.80x on the MLP at batch 512: wall %.2fx (%s), "
           "cpu path %.2fx (%s)\n", mlp512[0], mlp512[0] >= 1.8 ? "met" : "NOT met", mlp512[1],
           mlp512[1] >= 1.8 ? "met" : "NOT met");
    printf("target: DP 2 over DP 1 >= 1.80x on the MLP at batch 128: wall %.2fx (%s), "
           "cpu path %.2fx (%s)\n", mlp128[0], mlp128[0] >= 1.8 ? "met" : "NOT met", mlp128[1],
           mlp128[1] >= 1.8 ? "met" : "NOT met");
    (void)cnn128;
    if (bench_print_load("end", BENCH_OWN_LOAD_1_2))
        printf("other processes shared the cores: trust the cpu columns\n");
    pdp_shutdown_threads();
    return 0;
}
