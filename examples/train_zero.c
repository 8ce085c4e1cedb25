/* train_zero.c - the ZeRO ladder: DDP (stage 0) and ZeRO stages 1, 2, 3 train one MLP on
   Fashion-MNIST, each rank printing what it holds and what it sends.

   The same training loop as train_ddp.c, with Adam (the optimizer the ZeRO paper counts:
   K = 8 bytes of state per parameter), switched by -stage: 0 is DDP (every rank a full
   replica: 16 bytes per parameter), 1 shards the optimizer state (8 + 8/N), 2 the
   gradients too (4 + 12/N), 3 the parameters too (16/N), each rank then holding only
   its slice of every unit and all-gathering a unit's parameters just before it
   computes. Every rank prints its memory (measured bytes beside the paper's formula
   and the stated bound on the working buffers), the bytes it sent in the last step
   beside the formula that applies, in words (DDP and stages 1-2: 2(N-1)/N x 4 Psi,
   stage 3: 3(N-1)/N x 4 Psi; with -accum k backward passes per step, stage 2 sends
   (k+1)(N-1)/N x 4 Psi and stage 3 3k(N-1)/N x 4 Psi less the units kept gathered
   between micro-steps, zero.h), its step time and its test accuracy: the same accuracy
   on every rung of the ladder, a fraction of the memory, the same or 1.5x the bytes.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_zero.c -o train_zero -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_zero.c -o train_zero_mpi -lm
           make cuda   (build/cuda/train_zero, with -DPDP_CUDA: -backend nccl)
   Run:    ./train_zero                      (stage 3, 2 thread-ranks; PDP_SHORT=1: a few steps)
           for s in 0 1 2 3; do ./train_zero -stage $s -np 2; done
           ./train_zero -stage 2 -accum 2        (2 backward passes per step: 1.5x the bytes)
           mpirun -np 2 ./train_zero_mpi -backend mpi -stage 2
           ./build/cuda/train_zero -backend nccl -np 2 -stage 3     (2 GPUs, one thread each)
           PDP_TRACE=zero.json ./train_zero  then open zero.json in ui.perfetto.dev: the
                                             "allgather" lane runs ahead of the forward
   Output (PDP_SHORT=1, -stage 3, 2 ranks, seed 1; rank 1 prints the same memory and test
           figures, and -stage 0 the same test accuracy with 10.72 MB per rank):
           seed 1: Fashion-MNIST, backend local, 2 ranks, stage 3 (ZeRO), global batch 32 ...
           step   10  loss 1.0937  step 5.5 ms  sent/rank 4.02 MB  formula 4.02 MB
           rank 0 memory: params 1.34 MB  grads 1.34 MB  Adam 2.68 MB  buffers 6.43 MB (bound
             6.43 MB)  total 11.79 MB;  formula 16 Psi/N = 5.36 MB + buffers (N = 2, Psi padded
             to 669728);  DDP 16 Psi = 10.72 MB
           rank 0 epoch 1  loss 1.5745  test 58.75% (first 320)  step 5.5 ms  4720 samples/s ...
           The buffers (two gradient and two gather buffers of N x the largest unit, here the
           784x512 layer: a unit holds whole layers) outweigh the savings on a 3-layer MLP at
           N = 2; ZeRO pays off for models of many units, where the shards dominate.
   Next:   bench/zero.c (the ladder's throughput against DDP). */

#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>

#define CHECK(call)                                                                          \
    do {                                                                                     \
        pdp_status st_ = (call);                                                             \
        if (st_ != PDP_OK) {                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, pdp_status_name(st_),     \
                    pdp_last_error());                                                       \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

static int np = 2, epochs = 1, stage = 3;
static int64_t batch = 256; /* global */
static double lr = 0.001;
static double cap_mb = 0.5; /* units of at most 0.5 MiB: each layer its own, 784x512 split */
static int accum = 1;        /* backward passes (batches) per optimizer step */
static unsigned long long seed = 1;
static bool short_run;
static pdp_dataset *train, *test;
static pdp_local_group *group;
static pdp_nccl_group *ngroup;
static pthread_mutex_t print_mu = PTHREAD_MUTEX_INITIALIZER; /* one rank's lines together */

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const pdp_tensor *on_device(const pdp_tensor *x, const pdp_tensor *dev, pdp_tensor *view)
{
    if (!dev) return x;
    CHECK(pdp_tensor_rows_view(dev, 0, x->shape[0], view));
    CHECK(pdp_tensor_copy(view, x));
    return view;
}

/* The rank's memory: ZeRO measures it; DDP holds everything (parameters, gradients, Adam's
   two state buffers) for all Psi parameters, plus its bucket buffers (not counted here). */
static void print_memory(int rank, int n, pdp_zero *z, const pdp_optim *opt, int64_t psi)
{
    const double mb = 1e6;
    if (!z) {
        printf("rank %d memory: params %.2f MB  grads %.2f MB  Adam %.2f MB  total %.2f MB;  "
               "formula DDP 16 Psi = %.2f MB\n", rank, 4.0 * psi / mb, 4.0 * psi / mb,
               8.0 * psi / mb, 16.0 * psi / mb, 16.0 * psi / mb);
        return;
    }
    {
        pdp_zero_memory mm;
        static const char *const formula[] = {"", "8 Psi + 8 Psi/N", "4 Psi + 12 Psi/N",
                                              "16 Psi/N"};
        pdp_zero_get_memory(z, opt, &mm);
        printf("rank %d memory: params %.2f MB  grads %.2f MB  Adam %.2f MB  buffers %.2f MB "
               "(bound %.2f MB)  total %.2f MB;  formula %s = %.2f MB + buffers (N = %d, "
               "Psi padded to %lld);  DDP 16 Psi = %.2f MB\n", rank, mm.param_bytes / mb,
               mm.grad_bytes / mb, mm.optim_bytes / mb, mm.buffer_bytes / mb,
               mm.buffer_bound / mb, mm.total_bytes / mb, formula[stage], mm.formula_bytes / mb,
               n, (long long)mm.padded_count, mm.ddp_bytes / mb);
    }
}

/* What every rank runs, on its own thread or process; dev is where its model lives. */
static void train_rank(pdp_comm *c, pdp_device dev)
{
    int rank = pdp_comm_rank(c), n = pdp_comm_size(c), e;
    pdp_model_desc md = {0};
    pdp_optim_desc od = {0};
    pdp_dist_sampler_desc sd = {0};
    pdp_zero_desc zdesc = {0};
    pdp_model *m;
    pdp_optim *opt;
    pdp_ddp *ddp = NULL;
    pdp_zero *z = NULL;
    pdp_dist_sampler *sampler;
    pdp_tensor *xdev = NULL;
    int64_t step = 0, per_rank = batch / n, psi;

    md.input_shape[0] = 784;
    md.device = dev;
    md.seed = seed + (unsigned long long)rank; /* DDP and ZeRO start every rank from rank 0's */
    CHECK(pdp_model_create(&m, &md));
    CHECK(pdp_model_add_linear(m, 512));
    CHECK(pdp_model_add_relu(m));
    CHECK(pdp_model_add_linear(m, 512));
    CHECK(pdp_model_add_relu(m));
    CHECK(pdp_model_add_linear(m, 10));
    CHECK(pdp_model_reserve(m, per_rank > 1000 ? per_rank : 1000));
    psi = pdp_model_param_count(m);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = lr;
    if (stage == 0) { /* the one line that switches the ladder's rung */
        CHECK(pdp_ddp_create(&ddp, m, c, NULL));
        CHECK(pdp_optim_create(&opt, m, &od));
    } else {
        zdesc.stage = stage;
        zdesc.bucket_cap_mb = cap_mb;
        zdesc.first_bucket_mb = cap_mb;
        CHECK(pdp_zero_create(&z, m, c, &zdesc));
        CHECK(pdp_zero_optim_create(&opt, z, &od)); /* state for this rank's shard only */
    }
    if (dev.kind != PDP_DEVICE_CPU)
        CHECK(pdp_tensor_create(&xdev, dev, 2, (int64_t[]){per_rank > 1000 ? per_rank : 1000,
                                                           784}));
    sd.dataset_size = train->count;
    sd.world_size = n;
    sd.rank = rank;
    sd.seed = seed;
    CHECK(pdp_dist_sampler_create(&sampler, &sd));
    for (e = 0; e < epochs; e++) {
        pdp_batcher_desc bd = {0};
        pdp_batcher *b;
        pdp_tensor x, xv, tx, tv;
        const pdp_tensor *logits;
        const int32_t *y;
        int64_t got, seen = 0, correct = 0, k = test->count < 1000 ? test->count : 1000;
        int64_t sent = 0, formula = 0, steps_here = 0, micro = 0;
        char words[160] = "";
        double loss_sum = 0.0, t0 = seconds(), ts, step_time = 0.0;
        float loss;
        pdp_dist_sampler_set_epoch(sampler, (uint64_t)e);
        bd.batch_size = per_rank;
        bd.drop_last = true;
        bd.indices = pdp_dist_sampler_indices(sampler, &bd.num_indices);
        CHECK(pdp_batcher_create(&b, train, &bd));
        while (pdp_batcher_next(b, &x, &y, &got)) {
            ts = seconds();
            if (ddp) {
                pdp_ddp_stats s;
                pdp_ddp_set_no_sync(ddp, micro < accum - 1); /* accumulate, reduce the last */
                CHECK(pdp_ddp_forward_backward(ddp, on_device(&x, xdev, &xv), y, &loss));
                if (++micro == accum) {
                    CHECK(pdp_ddp_step(ddp, opt));
                    pdp_ddp_get_stats(ddp, &s);
                    sent = s.bytes_sent;
                    formula = (int64_t)(2.0 * (n - 1) / n * (double)s.grad_bytes);
                    snprintf(words, sizeof words, "2 (N-1)/N x 4 Psi, N = %d (k = %d backward "
                             "passes: accumulated without sending)", n, accum);
                }
            } else {
                pdp_zero_stats s;
                pdp_zero_set_no_sync(z, micro < accum - 1);
                CHECK(pdp_zero_forward_backward(z, on_device(&x, xdev, &xv), y, &loss));
                if (++micro == accum) {
                    CHECK(pdp_zero_step(z, opt)); /* wait, step the shard, all-gather */
                    pdp_zero_get_stats(z, &s);
                    sent = s.bytes_sent;
                    formula = s.formula_bytes;
                    snprintf(words, sizeof words, "%s", s.formula);
                }
            }
            if (micro == accum) micro = 0;
            step_time += seconds() - ts;
            steps_here++;
            loss_sum += loss;
            seen += got;
            if (rank == 0 && (++step % (short_run ? 5 : 100) == 0))
                printf("step %4lld  loss %.4f  step %.1f ms  sent/rank %.2f MB  formula %.2f MB\n",
                       (long long)step, (double)loss, 1e3 * step_time / (double)steps_here,
                       sent / 1e6, formula / 1e6);
        }
        pdp_batcher_free(b);
        /* every rank evaluates (stage 3's forward gathers each unit: all ranks take part) */
        pdp_model_set_training(m, false);
        CHECK(pdp_dataset_view(test, 0, k, &tx));
        if (z) CHECK(pdp_zero_forward(z, on_device(&tx, xdev, &tv), &logits));
        else CHECK(pdp_model_forward(m, on_device(&tx, xdev, &tv), &logits));
        CHECK(pdp_count_correct(logits, test->labels, &correct));
        pdp_model_set_training(m, true);
        pthread_mutex_lock(&print_mu);
        print_memory(rank, n, z, opt, psi);
        printf("rank %d epoch %d  loss %.4f  test %.2f%% (first %lld)  step %.1f ms  "
               "%.0f samples/s  sent/step %.2f MB  formula %.2f MB = %s\n", rank, e + 1,
               loss_sum * per_rank / (double)(seen ? seen : 1), 100.0 * correct / (double)k,
               (long long)k, 1e3 * step_time / (double)(steps_here ? steps_here : 1),
               (double)seen * n / (seconds() - t0), sent / 1e6, formula / 1e6, words);
        fflush(stdout);
        pthread_mutex_unlock(&print_mu);
    }
    pdp_dist_sampler_free(sampler);
    pdp_tensor_free(xdev);
    pdp_zero_free(z);
    pdp_ddp_free(ddp);
    pdp_optim_free(opt);
    pdp_model_free(m);
}

static void *rank_thread(void *arg)
{
    int rank = (int)(intptr_t)arg;
    pdp_comm *c;
    if (ngroup) CHECK(pdp_comm_create_nccl(&c, ngroup, rank));
    else CHECK(pdp_comm_create_local(&c, group, rank));
    train_rank(c, ngroup ? pdp_cuda(rank) : pdp_cpu());
    pdp_comm_free(c);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *backend = "local", *source = "Fashion-MNIST";
    pdp_dataset_desc dd = {0};
    int i, rank = 0;
    pdp_comm *c = NULL;
    pdp_device dev = pdp_cpu();
    short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "-stage")) stage = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-np")) np = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-epochs")) epochs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-lr")) lr = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-cap_mb")) cap_mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-accum")) accum = atoi(argv[i + 1]);
        else break;
    }
    if (i < argc || np < 1 || np > 64 || epochs < 1 || batch < np || stage < 0 || stage > 3 ||
        accum < 1 || accum > 64 ||
        !(cap_mb > 0) ||
        (strcmp(backend, "local") && strcmp(backend, "mpi") && strcmp(backend, "nccl"))) {
        fprintf(stderr, "usage: %s [-stage 0..3 (0: DDP; default 3)] [-backend local|mpi|nccl] "
                "[-np 2 (threads; mpirun or torchrun set it for processes)] [-epochs 1] "
                "[-batch 256 (global)] [-lr 0.001] [-cap_mb 0.5] [-seed 1] [-accum 1 (backward "
                "passes per step)]\n", argv[0]);
        return 2;
    }
    if (!strcmp(backend, "mpi")) {
        pdp_comm_desc cd = {0};
        cd.backend = PDP_BACKEND_MPI;
        CHECK(pdp_comm_init_env(&c, &cd));
        rank = pdp_comm_rank(c);
        np = pdp_comm_size(c);
    } else if (!strcmp(backend, "nccl") && getenv("WORLD_SIZE")) {
        pdp_comm_desc cd = {0};
        cd.backend = PDP_BACKEND_NCCL;
        CHECK(pdp_comm_init_env(&c, &cd));
        rank = pdp_comm_rank(c);
        np = pdp_comm_size(c);
        dev = pdp_cuda(getenv("LOCAL_RANK") ? atoi(getenv("LOCAL_RANK")) : 0);
    }
    dd.flat = true;
    dd.mean = PDP_FASHION_MNIST_MEAN;
    dd.std = PDP_FASHION_MNIST_STD;
    dd.max_samples = short_run ? 320 : 0;
    if (short_run) batch = 32;
    dd.seed = seed;
    if (pdp_dataset_load_fashion_mnist(&train, true, &dd) != PDP_OK) {
        if (rank == 0) printf("%s\n(training on the built-in synthetic task instead)\n",
                              pdp_last_error());
        source = "synthetic";
        CHECK(pdp_dataset_synthetic(&train, true, &dd));
        CHECK(pdp_dataset_synthetic(&test, false, &dd));
    } else {
        CHECK(pdp_dataset_load_fashion_mnist(&test, false, &dd));
    }
    if (rank == 0)
        printf("seed %llu: %s, backend %s, %d ranks, stage %d (%s), global batch %lld (%lld per "
               "rank), MLP 784-512-512-10, Adam lr %g\n", seed, source, backend, np, stage,
               stage ? "ZeRO" : "DDP", (long long)batch, (long long)(batch / np), (double)lr);
    if (c) {
        train_rank(c, dev);
        pdp_comm_free(c);
    } else {
        pthread_t t[64];
        if (!strcmp(backend, "nccl")) {
            pdp_device devs[64];
            for (i = 0; i < np; i++) devs[i] = pdp_cuda(i);
            CHECK(pdp_nccl_group_create(&ngroup, np, devs, NULL));
        } else {
            CHECK(pdp_local_group_create(&group, np, NULL));
        }
        for (i = 0; i < np; i++) pthread_create(&t[i], NULL, rank_thread, (void *)(intptr_t)i);
        for (i = 0; i < np; i++) pthread_join(t[i], NULL);
        if (ngroup) pdp_nccl_group_free(ngroup);
        else pdp_local_group_free(group);
    }
    pdp_dataset_free(train);
    pdp_dataset_free(test);
    return 0;
}
