/* bench/ddp.c: DistributedDataParallel with 2 ranks against 1, same run, same data.

   Workloads: the MLP 784-512-512-10 (ReLU) at batch 128 and 512, and the CNN
   of bench/dp.c (Conv 16 k5 p2, ReLU, MaxPool 2, Conv 32 k5 p2, ReLU, MaxPool
   2, Flatten, Linear 10) at batch 128, each twice:
     /rank    B samples per rank, PyTorch's convention (each process's DataLoader
              has batch_size B): DDP 2 trains on 2B samples per step (weak scaling);
     global   B samples per step in all (strong scaling, as bench/dp.c): DDP 2's
              ranks compute B/2 each, on smaller and less efficient GEMMs.
   One step = forward, cross-entropy, backward, SGD
   (lr 0.01), zeroing the gradients. Peers, measured in this run and interleaved
   round by round so that a noisy neighbour hits them alike:
     1 dev      pdp_model_forward_backward + pdp_optim_step, 1 thread
     DDP 1      pdp_ddp_forward_backward + pdp_ddp_step, local backend, 1 rank
     DDP 2      the same on 2 thread-ranks (local backend), 1 thread each
     2 x 1 dev  two independent single-device trainings at once, no communication:
                the scaling the machine allows right now ("free2" = 2 x 1 dev / 1 dev;
                on a quiet 2-core machine about 2x, lower when neighbours load it)
     DDP 2 MPI  the same on 2 MPI processes (built with -DPDP_MPI, run by mpirun -np 2)
   A figure is the median over the rounds of samples/s (a round runs about
   0.25 s of steps after 3 warm-up steps; both ranks run the same step count).
   "cpu2/1" is 2 x (samples per CPU second of DDP 2) / (the same of DDP 1), CPU
   time of the whole process (ranks and progress threads): the speed-up two idle
   cores would give, which a loaded machine's wall clock cannot show.
   "hidden" is the share of all-reduce time that backward covered, from
   pdp_ddp_stats over the timed steps: 1 - (time waiting in pdp_ddp_finish) /
   (execution time of the bucket all-reduces).

   make bench        ./build/bench_ddp [quick]          quick: 3 rounds
   make bench-mpi    the same plus DDP 2 over MPI (the two lines below)
   mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. bench/ddp.c -o build/bench_ddp_mpi -lm
   mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 ./build/bench_ddp_mpi
                     (rank 0 runs the in-process peers while rank 1 waits, then both
                      run DDP 2 MPI) */

#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"

#include "bench.h"

#define MAX_ROUNDS 7
#define NPEERS 5
enum { P_SINGLE, P_DDP1, P_DDP2, P_FREE2, P_MPI2 };
static const char *peer_names[NPEERS] = {"1 dev", "DDP 1", "DDP 2", "2 x 1 dev", "DDP 2 MPI"};
static pthread_barrier_t free_barrier;

typedef struct job {
    bool cnn;
    int64_t batch;           /* global */
    int steps;               /* timed steps */
    float *data;             /* [batch, 784] */
    int32_t *labels;
    pdp_local_group *g;
    pdp_comm *comm;          /* MPI: the process's communicator */
    int rank, size;
    double seconds, hidden;  /* rank 0: timed wall time, hidden share */
    double cpu;              /* process CPU seconds over the timed steps (all threads) */
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

/* One rank of a DDP peer: 3 warm-up steps, a barrier, the timed steps, a barrier. */
static void ddp_rank(job *j, pdp_comm *c)
{
    pdp_model *m = bench_make_model(j->cnn);
    pdp_optim *o;
    pdp_ddp *d;
    pdp_optim_desc od;
    pdp_ddp_stats s;
    pdp_tensor x;
    int64_t per = j->batch / j->size;
    int k;
    float loss;
    double t0, c0;
    memset(&od, 0, sizeof od);
    od.lr = 0.01f;
    CHECK(pdp_optim_create(&o, m, &od));
    CHECK(pdp_ddp_create(&d, m, c, NULL));
    view(j, pdp_comm_rank(c) * per, per, &x);
    for (k = 0; k < 3; k++) {
        CHECK(pdp_ddp_forward_backward(d, &x, j->labels + pdp_comm_rank(c) * per, &loss));
        CHECK(pdp_ddp_step(d, o));
    }
    pdp_ddp_reset_stats(d);
    CHECK(pdp_comm_barrier(c, NULL));
    t0 = bench_now();
    c0 = bench_process_cpu();
    for (k = 0; k < j->steps; k++) {
        CHECK(pdp_ddp_forward_backward(d, &x, j->labels + pdp_comm_rank(c) * per, &loss));
        CHECK(pdp_ddp_step(d, o));
    }
    CHECK(pdp_comm_barrier(c, NULL));
    if (pdp_comm_rank(c) == 0) {
        j->seconds = bench_now() - t0;
        j->cpu = bench_process_cpu() - c0;
        pdp_ddp_get_stats(d, &s);
        j->hidden = s.total_allreduce_s > 0 ? 1.0 - s.total_wait_s / s.total_allreduce_s : 1.0;
        j->hidden = j->hidden < 0.0 ? 0.0 : j->hidden;
    }
    pdp_ddp_free(d);
    pdp_optim_free(o);
    pdp_model_free(m);
}

static void *ddp_thread(void *arg)
{
    job *j = (job *)arg;
    pdp_comm *c;
    CHECK(pdp_comm_create_local(&c, j->g, j->rank));
    ddp_rank(j, c);
    pdp_comm_free(c);
    return NULL;
}

/* Plain single-device training on samples [rank, rank + 1) x batch / size; with
   size 2 (the "2 x 1 dev" peer) two threads time their steps between barriers. */
static void single_rank(job *j)
{
    pdp_model *m = bench_make_model(j->cnn);
    pdp_optim *o;
    pdp_optim_desc od;
    pdp_tensor x;
    int64_t per = j->batch / j->size;
    float loss;
    double t0 = bench_now(), c0 = bench_process_cpu();
    int k;
    memset(&od, 0, sizeof od);
    od.lr = 0.01f;
    CHECK(pdp_optim_create(&o, m, &od));
    view(j, j->rank * per, per, &x);
    for (k = 0; k < 3 + j->steps; k++) {
        if (k == 3) {
            if (j->size > 1) pthread_barrier_wait(&free_barrier);
            t0 = bench_now();
            c0 = bench_process_cpu();
        }
        CHECK(pdp_model_forward_backward(m, &x, j->labels + j->rank * per, &loss));
        CHECK(pdp_optim_step(o));
        pdp_optim_zero_grad(o);
    }
    if (j->size > 1) pthread_barrier_wait(&free_barrier);
    j->seconds = bench_now() - t0;
    j->cpu = bench_process_cpu() - c0;
    j->hidden = 1.0;
    pdp_optim_free(o);
    pdp_model_free(m);
}

static void *single_thread(void *arg)
{
    single_rank((job *)arg);
    return NULL;
}

/* Seconds for j->steps steps of peer p (rank 0's view). */
static double run_peer(job *base, int p)
{
    job js[2];
    pthread_t t[2];
    int r, n = p == P_DDP2 ? 2 : 1;
    if (p == P_SINGLE) {
        base->rank = 0;
        base->size = 1;
        single_rank(base);
        return base->seconds;
    }
    if (p == P_FREE2) { /* two independent trainings at once: what the machine allows now */
        pthread_barrier_init(&free_barrier, NULL, 2);
        for (r = 0; r < 2; r++) {
            js[r] = *base;
            js[r].rank = r;
            js[r].size = 2;
            pthread_create(&t[r], NULL, single_thread, &js[r]);
        }
        for (r = 0; r < 2; r++) pthread_join(t[r], NULL);
        pthread_barrier_destroy(&free_barrier);
        base->hidden = 1.0;
        base->seconds = js[0].seconds;
        base->cpu = js[0].cpu;
        return base->seconds;
    }
    if (p == P_MPI2) {
        base->size = pdp_comm_size(base->comm);
        ddp_rank(base, base->comm);
        return base->seconds;
    }
    CHECK(pdp_local_group_create(&base->g, n, NULL));
    for (r = 0; r < n; r++) {
        js[r] = *base;
        js[r].rank = r;
        js[r].size = n;
        pthread_create(&t[r], NULL, ddp_thread, &js[r]);
    }
    for (r = 0; r < n; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(base->g);
    base->hidden = js[0].hidden;
    base->seconds = js[0].seconds;
    base->cpu = js[0].cpu;
    return base->seconds;
}

/* per_rank: batch is each rank's (DDP 2 trains on 2 x batch samples per step, PyTorch's
   DataLoader-per-process convention); otherwise batch is the global batch, split in two. */
static void run(const char *name, bool cnn, int64_t batch, bool per_rank, int rounds,
                pdp_comm *mpi)
{
    static double sps[NPEERS][MAX_ROUNDS], hid[NPEERS][MAX_ROUNDS], cps[NPEERS][MAX_ROUNDS];
    double med[NPEERS], hmed[NPEERS], cmed[NPEERS], t_step;
    job j;
    pdp_rng r;
    int64_t i;
    int p, k, rank = mpi ? pdp_comm_rank(mpi) : 0, npeers = mpi && pdp_comm_size(mpi) == 2 ? 5 : 4;
    memset(&j, 0, sizeof j);
    j.cnn = cnn;
    j.batch = batch;
    j.comm = mpi;
    j.data = (float *)malloc((size_t)(2 * batch * 784) * sizeof(float));
    j.labels = (int32_t *)malloc((size_t)(2 * batch) * sizeof(int32_t));
    pdp_rng_seed(&r, 7, 0);
    for (i = 0; i < 2 * batch * 784; i++) j.data[i] = pdp_rng_uniform(&r);
    for (i = 0; i < 2 * batch; i++) j.labels[i] = (int32_t)pdp_rng_below(&r, 10);
    /* calibrate: steps for about 0.25 s of single-device training */
    j.steps = 3;
    j.batch = batch;
    if (rank == 0) {
        t_step = run_peer(&j, P_SINGLE) / j.steps;
        j.steps = (int)(0.25 / t_step) + 3;
    }
    if (mpi) CHECK(pdp_comm_broadcast_bytes(mpi, &j.steps, sizeof j.steps, 0));
    for (k = 0; k < rounds; k++)
        for (p = 0; p < npeers; p++) {
            j.batch = per_rank && p >= P_DDP2 ? 2 * batch : batch;
            if (p == P_MPI2) {
                CHECK(pdp_comm_barrier(mpi, NULL)); /* rank 1 waited here during the rest */
                run_peer(&j, p);
            } else if (rank == 0) {
                run_peer(&j, p);
            } else {
                continue;
            }
            sps[p][k] = (double)(j.batch * j.steps) / j.seconds;
            hid[p][k] = j.hidden;
            cps[p][k] = (double)(j.batch * j.steps) / j.cpu; /* samples per CPU second */
        }
    if (mpi && rank != 0) return;
    for (p = 0; p < npeers; p++) {
        med[p] = bench_median(sps[p], rounds);
        hmed[p] = bench_median(hid[p], rounds);
        cmed[p] = bench_median(cps[p], rounds);
    }
    printf("%-14s %5lld %-6s |", name, (long long)batch, per_rank ? "/rank" : "global");
    for (p = 0; p < npeers; p++) printf(" %10.0f", med[p]);
    printf(" | %5.2fx %5.2fx %5.2fx", med[P_DDP2] / med[P_DDP1], med[P_DDP1] / med[P_SINGLE],
           med[P_FREE2] / med[P_SINGLE]);
    if (npeers == 5) printf(" %5.2fx", med[P_MPI2] / med[P_DDP1]);
    printf(" | %5.2fx", 2.0 * cmed[P_DDP2] / cmed[P_DDP1]);
    printf(" | %3.0f%%", 100.0 * hmed[P_DDP2]);
    if (npeers == 5) printf(" %3.0f%%", 100.0 * hmed[P_MPI2]);
    printf("\n");
    fflush(stdout);
    free(j.data);
    free(j.labels);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 && !strcmp(argv[1], "quick") ? 3 : MAX_ROUNDS, p, npeers = 4;
    pdp_comm *mpi = NULL;
    if (getenv("OMPI_COMM_WORLD_SIZE")) {
        pdp_comm_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.backend = PDP_BACKEND_MPI;
        CHECK(pdp_comm_init_env(&mpi, &cd));
        if (pdp_comm_size(mpi) == 2) npeers = 5;
    }
    if (!mpi || pdp_comm_rank(mpi) == 0) {
        printf("DDP, samples/s, median of %d rounds; 1 thread per rank. batch /rank: each rank "
               "computes B samples\n(DDP 2 trains on 2B per step); global: DDP 2 splits B into "
               "2 x B/2\n", rounds);
        printf("%-14s %-12s |", "workload", "batch");
        for (p = 0; p < npeers; p++) printf(" %10s", peer_names[p]);
        printf(" | %6s %6s %6s%s | %6s | hidden (DDP 2%s)\n", "2/1", "1/dev", "free2",
               npeers == 5 ? "  MPI/1" : "", "cpu2/1", npeers == 5 ? ", MPI" : "");
    }
    run("MLP 784-512x2", false, 128, true, rounds, mpi);
    run("MLP 784-512x2", false, 512, true, rounds, mpi);
    run("CNN c16-c32", true, 128, true, rounds, mpi);
    run("MLP 784-512x2", false, 128, false, rounds, mpi);
    run("MLP 784-512x2", false, 512, false, rounds, mpi);
    run("CNN c16-c32", true, 128, false, rounds, mpi);
    if (!mpi || pdp_comm_rank(mpi) == 0) {
        printf("targets: DDP 2 / DDP 1 >= 1.8x at batch 512; DDP 1 within 3%% of 1 dev "
               "(1/dev >= 0.97x)\n");
        if (bench_print_load("end", BENCH_OWN_LOAD_1_2)) printf("trust cpu2/1 more than the wall-clock ratios\n");
    }
    pdp_comm_free(mpi);
    pdp_shutdown_threads();
    return 0;
}
