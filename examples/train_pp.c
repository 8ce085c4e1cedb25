/* train_pp.c - pipeline parallelism: an MLP split into stages across ranks, on Fashion-MNIST.

   Every rank builds the same 784-512-512-256-10 MLP; pdp_pp_create keeps its stage's
   layers (balanced by parameter count). Each batch is cut into m micro-batches that flow
   through the stages: activations go forward with send/recv, their gradients come back,
   and the gradients accumulate over the micro-batches, so every step is a step of
   single-device training on the whole batch. Schedules: GPipe (all forwards, then all
   backwards) and 1F1B (one forward, one backward after a warm-up). Rank 0 prints, for
   each stage, the measured bubble (idle share of the step) beside the formula
   (p-1)/(m+p-1), and its peak activation memory: GPipe holds all m micro-batches, 1F1B at
   most p. The loss is known on the last stage, which prints it.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_pp.c -o train_pp -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_pp.c -o train_pp_mpi -lm
           make cuda   (build/cuda/train_pp, with -DPDP_CUDA: -backend nccl)
   Run:    ./train_pp                            (2 stages as threads, 1F1B, m = 4)
           ./train_pp -np 2 -schedule gpipe -micro 8 -batch 256 -epochs 1 -lr 0.05 -seed 1
           mpirun -np 2 ./train_pp_mpi -backend mpi
           ./build/cuda/train_pp -backend nccl -np 2   (a thread per GPU, stages on GPUs)
           PDP_TRACE=pp.json ./train_pp          then open pp.json in ui.perfetto.dev: one lane
                                                 per stage, the pipeline diagram of the papers
   Output (2 shared cores, load average 6, 2 stages, 1F1B, m = 4, seed 1; -backend mpi and
   -schedule gpipe print the same losses: every schedule is the same arithmetic):
           seed 1: Fashion-MNIST, backend local, 2 stages, schedule 1f1b, 4 micro-batches of 64, ...
           stage 0: layers 0..1   stage 1: layers 2..6
           step  100  loss 0.4709
           step  200  loss 0.4646
           epoch 1  loss 0.6379  6288 samples/s
           stage 0: bubble 0.73 (formula (p-1)/(m+p-1) = 0.20)  peak activations 2 micro-batches = 0.52 MB
           stage 1: bubble 0.48 (formula (p-1)/(m+p-1) = 0.20)  peak activations 1 micro-batch = 0.53 MB
           The measured bubble exceeds the formula here: the split by parameter count gives
           stage 0 (784x512, no input gradient) two thirds of stage 1's work, and a loaded
           machine's preemptions show up as waiting. bench/pp.c's equal stages come close to
           it. With -schedule gpipe -micro 8 each stage holds 8 micro-batches instead.
   Next:   bench/pp.c (throughput against one device for m = 1, 2, 4, 8). */

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

static int np = 2, epochs = 1, micro = 4;
static int64_t batch = 256;
static double lr = 0.05;
static unsigned long long seed = 1;
static bool short_run;
static pdp_pp_schedule schedule = PDP_PP_1F1B;
static pdp_dataset *train;
static pdp_local_group *group;
static pdp_nccl_group *ngroup;

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Every stage's 4 figures into all (host), in stage order: an all-gather, through the
   GPU under NCCL, whose buffers are device memory. */
static void gather_figures(pdp_comm *c, pdp_device dev, const float *mine, float *all)
{
    pdp_tensor *s, *r;
    if (dev.kind == PDP_DEVICE_CPU) {
        CHECK(pdp_comm_allgather(c, mine, all, 4, NULL));
        return;
    }
    CHECK(pdp_tensor_create(&s, dev, 1, (int64_t[]){4}));
    CHECK(pdp_tensor_create(&r, dev, 1, (int64_t[]){4 * pdp_comm_size(c)}));
    CHECK(pdp_tensor_upload(s, mine));
    CHECK(pdp_comm_allgather(c, s->data, r->data, 4, NULL));
    CHECK(pdp_tensor_download(r, all));
    pdp_tensor_free(s);
    pdp_tensor_free(r);
}

/* What every rank runs; dev is where its stage lives (the CPU, or its GPU under NCCL). */
static void train_rank(pdp_comm *c, pdp_device dev)
{
    int rank = pdp_comm_rank(c), n = pdp_comm_size(c), e, s, first, last;
    pdp_model_desc md = {0};
    pdp_optim_desc od = {0};
    pdp_pp_desc pd = {0};
    pdp_batcher_desc bd = {0};
    pdp_model *full;
    pdp_optim *opt;
    pdp_pp *pp;
    pdp_batcher *b;
    pdp_tensor *xdev = NULL;
    int64_t step = 0;

    md.input_shape[0] = 784;
    md.device = dev;
    md.seed = seed; /* the same on every rank: each keeps its stage of the same model */
    CHECK(pdp_model_create(&full, &md));
    CHECK(pdp_model_add_linear(full, 512));
    CHECK(pdp_model_add_relu(full));
    CHECK(pdp_model_add_linear(full, 512));
    CHECK(pdp_model_add_relu(full));
    CHECK(pdp_model_add_linear(full, 256));
    CHECK(pdp_model_add_relu(full));
    CHECK(pdp_model_add_linear(full, 10));
    pd.schedule = schedule;
    pd.micro_batches = micro;
    CHECK(pdp_pp_create(&pp, full, c, &pd)); /* keeps this rank's layers */
    pdp_model_free(full);
    od.kind = PDP_OPTIM_SGD;
    od.lr = lr;
    od.momentum = 0.9f;
    CHECK(pdp_optim_create(&opt, pdp_pp_model(pp), &od));
    if (dev.kind != PDP_DEVICE_CPU && rank == 0)
        CHECK(pdp_tensor_create(&xdev, dev, 2, (int64_t[]){batch, 784}));
    for (s = 0; s < n && rank == 0; s++) { /* every rank knows the whole split */
        CHECK(pdp_pp_stage_layers(pp, s, &first, &last));
        printf("stage %d: layers %d..%d%s", s, first, last - 1, s + 1 < n ? "   " : "\n");
    }

    bd.batch_size = batch;
    bd.shuffle = true;
    bd.drop_last = true;
    bd.seed = seed; /* every rank walks the same batches: stage 0 reads x, the last the labels */
    CHECK(pdp_batcher_create(&b, train, &bd));
    for (e = 0; e < epochs; e++) {
        pdp_tensor x, xv;
        const int32_t *y;
        int64_t got, seen = 0;
        double loss_sum = 0.0, t0 = seconds();
        float loss, mine[4], all[4 * 64];
        pdp_pp_stats st;
        pdp_batcher_reset(b, (uint64_t)e);
        while (pdp_batcher_next(b, &x, &y, &got)) {
            const pdp_tensor *in = &x;
            if (xdev) { /* stage 0 on a GPU: the batch goes to the device first */
                CHECK(pdp_tensor_rows_view(xdev, 0, got, &xv));
                CHECK(pdp_tensor_copy(&xv, &x));
                in = &xv;
            }
            CHECK(pdp_pp_forward_backward(pp, in, y, &loss)); /* the whole pipeline pass */
            CHECK(pdp_pp_step(pp, opt));
            loss_sum += loss;
            seen += got;
            if (rank == n - 1 && (++step % (short_run ? 5 : 100) == 0))
                printf("step %4lld  loss %.4f\n", (long long)step, (double)loss);
        }
        pdp_pp_get_stats(pp, &st);
        if (rank == n - 1)
            printf("epoch %d  loss %.4f  %.0f samples/s\n", e + 1, loss_sum * batch / (double)seen,
                   (double)seen / (seconds() - t0));
        /* each stage's figures, gathered on every rank */
        mine[0] = (float)(1.0 - st.total_compute_s / st.total_step_s); /* over all steps */
        mine[1] = (float)st.bubble_theory;
        mine[2] = (float)st.peak_in_flight;
        mine[3] = (float)st.peak_activation_bytes;
        gather_figures(c, dev, mine, all);
        for (s = 0; s < n && rank == 0; s++)
            printf("stage %d: bubble %.2f (formula (p-1)/(m+p-1) = %.2f)  peak activations %.0f "
                   "micro-batch%s = %.2f MB\n", s, all[4 * s], all[4 * s + 1], all[4 * s + 2],
                   all[4 * s + 2] == 1.0f ? "" : "es", all[4 * s + 3] / 1e6);
    }
    pdp_batcher_free(b);
    pdp_tensor_free(xdev);
    pdp_optim_free(opt);
    pdp_pp_free(pp);
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
    const char *backend = "local", *source = "Fashion-MNIST", *sched = "1f1b";
    pdp_dataset_desc dd = {0};
    int i, rank = 0;
    pdp_comm *c = NULL;
    short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "-np")) np = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-schedule")) sched = argv[i + 1];
        else if (!strcmp(argv[i], "-micro")) micro = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-epochs")) epochs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-lr")) lr = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else break;
    }
    schedule = !strcmp(sched, "gpipe") ? PDP_PP_GPIPE : PDP_PP_1F1B;
    if (i < argc || np < 1 || np > 7 || epochs < 1 || micro < 1 || batch < micro ||
        (strcmp(sched, "gpipe") && strcmp(sched, "1f1b")) ||
        (strcmp(backend, "local") && strcmp(backend, "mpi") && strcmp(backend, "nccl"))) {
        fprintf(stderr, "usage: %s [-backend local|mpi|nccl] [-np 2 (stages, 1..7; mpirun sets "
                "it for processes)] [-schedule 1f1b|gpipe] [-micro 4] [-epochs 1] [-batch 256] "
                "[-lr 0.05] [-seed 1]\n", argv[0]);
        return 2;
    }
    if (!strcmp(backend, "mpi")) { /* the rank and size come from mpirun */
        pdp_comm_desc cd = {0};
        cd.backend = PDP_BACKEND_MPI;
        CHECK(pdp_comm_init_env(&c, &cd));
        rank = pdp_comm_rank(c);
        np = pdp_comm_size(c);
    }
    dd.flat = true;
    dd.mean = PDP_FASHION_MNIST_MEAN;
    dd.std = PDP_FASHION_MNIST_STD;
    dd.max_samples = short_run ? 640 : 0;
    if (short_run) batch = 64; /* 10 steps */
    dd.seed = seed;
    if (pdp_dataset_load_fashion_mnist(&train, true, &dd) != PDP_OK) {
        if (rank == 0) printf("%s\n(training on the built-in synthetic task instead)\n",
                              pdp_last_error());
        source = "synthetic";
        CHECK(pdp_dataset_synthetic(&train, true, &dd));
    }
    if (rank == 0)
        printf("seed %llu: %s, backend %s, %d stages, schedule %s, %d micro-batches of %lld, "
               "SGD lr %g momentum 0.9\n", seed, source, backend, np, sched, micro,
               (long long)(batch / micro), (double)lr);
    if (c) { /* MPI processes: this process is one stage */
        train_rank(c, pdp_cpu());
        pdp_comm_free(c);
    } else { /* np threads: CPU stages, or one per GPU over NCCL */
        pthread_t t[8];
        if (!strcmp(backend, "nccl")) {
            pdp_device devs[8];
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
    return 0;
}
