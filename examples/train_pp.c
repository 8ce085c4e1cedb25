/* train_pp.c - pipeline parallelism: train_ddp.c's MLP split into stages across ranks.

   Every rank builds the same MLP 784-512-512-10 (Adam, lr 0.001; -hidden H, -layers L
   for 784-H-..-H-10) and keeps its stage's layers, split so that the stages' work is
   equal (PDP_PP_BALANCE_WORK: FLOPs estimated from the layers' shapes; pp.h's default
   split by parameter count leaves a stage nearly idle). Each batch is cut into m
   micro-batches that flow through the stages: activations go forward with send/recv,
   their gradients come back and accumulate, so every step is a step of single-device
   training on the whole batch. Schedules: GPipe (all forwards,
   then all backwards) and 1F1B (one forward, one backward after a warm-up). Rank 0
   prints, for each stage, the measured bubble (idle share of the step) beside the
   formula (p-1)/(m+p-1), met within 0.10 when every stage has a core of its own (with
   fewer cores it says the stages share them), and its peak activation memory under both
   schedules: 1F1B holds min(p-s, m) micro-batches on stage s, GPipe all m; the bubble is
   the same. The last stage alone computes the loss, so it prints it.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_pp.c -o train_pp -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_pp.c -o train_pp_mpi -lm
           nvcc -O2 -arch=sm_90 -DPDP_CUDA -I. examples/train_pp.c pdp_cuda.cu -o train_pp_cuda \
               -lcublas -lnccl       (or make cuda: build/cuda/train_pp)
   Run:    ./train_pp                            (2 stages as threads, 1F1B, m = 4)
           ./train_pp -np 3 -layers 4 -schedule gpipe -micro 8
           mpirun -np 2 ./train_pp_mpi -backend mpi
           ./train_pp_cuda -backend nccl -np 2    (a thread per GPU, stages on GPUs)
           PDP_TRACE=pp.json ./train_pp          then open pp.json in ui.perfetto.dev
   Output (2 stages, 1F1B, m = 4, seed 1; -backend mpi and -schedule gpipe print the same
   losses: every schedule is the same arithmetic):
           seed 1: Fashion-MNIST, backend local, 2 stages, schedule 1f1b, 4 micro-batches ...
           stage 0: layers 0..0   stage 1: layers 1..4
           step  100  loss ...
           epoch 1  loss 0.4874  29768 samples/s
           stage 0: compute 1.31 s  bubble 0.29 (formula (p-1)/(m+p-1) = 0.20, margin 0.10:
             met)  peak activations 2 micro-batches = 0.26 MB  (1f1b: 1F1B min(p-s, m) =
             2 = 0.26 MB, GPipe m = 4 = 0.52 MB)
           stage 1: compute 1.36 s  bubble 0.25 ... GPipe m = 4 = 2.11 MB)
           1F1B changes the memory, not the bubble: ...
           (measured on 2 AMD EPYC cores at a load average of 0.6-1.1: stage 1's bubble read
           0.25-0.26 in three runs, stage 0's 0.29-0.32, at the margin's edge, so it prints
           met or missed from run to run; -schedule gpipe idled as long (0.32 and 0.25) and
           held 4 micro-batches on each stage)
   Next:   bench/pp.c (throughput against one device for m = 1, 2, 4, 8). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int epochs = 1, micro = 4, layers = 2;
static int64_t batch = 256, hidden = 512;
static double lr = 0.001;
static unsigned long long seed = 1;
static bool short_run;
static const char *backend = "local", *sched = "1f1b";
static pdp_dataset *train;

/* What every rank runs (pdp_launch): its stage of the model, on the CPU or its GPU. */
static pdp_status train_rank(const pdp_launch_ctx *ctx, void *user)
{
    int rank = ctx->rank, n = ctx->world_size, e, s, i, first, last;
    pdp_model *full;
    pdp_optim *opt;
    pdp_pp *pp;
    pdp_batcher *b;
    int64_t step = 0;
    static char lines[PDP_PP_MAX_STAGES][512]; /* each stage's figures (pdp_pp_stats_format) */
    (void)user;
    if (rank == 0)
        printf("seed %llu: %s, backend %s, %d stages, schedule %s, %d micro-batches of %lld, "
               "MLP 784-%lldx%d-10, Adam lr %g\n", seed, train->source, backend, n, sched, micro,
               (long long)(batch / micro), (long long)hidden, layers, lr);
    /* the same model on every rank (the same seed): each keeps its stage's layers */
    pdp_model_desc md = {.input_shape = {784}, .device = ctx->device, .seed = seed};
    PDP_TRY(pdp_model_create(&full, &md));
    for (i = 0; i < layers; i++) {
        PDP_TRY(pdp_model_add_linear(full, hidden));
        PDP_TRY(pdp_model_add_relu(full));
    }
    PDP_TRY(pdp_model_add_linear(full, 10));
    pdp_pp_desc pd = {.schedule = strcmp(sched, "gpipe") ? PDP_PP_1F1B : PDP_PP_GPIPE,
                      .micro_batches = micro, .balance = PDP_PP_BALANCE_WORK};
    PDP_TRY(pdp_pp_create(&pp, full, ctx->world, &pd)); /* keeps this rank's layers */
    pdp_model_free(full);
    PDP_TRY(pdp_optim_create(&opt, pdp_pp_model(pp),
                             &(pdp_optim_desc){.kind = PDP_OPTIM_ADAM, .lr = lr}));
    for (s = 0; s < n && rank == 0; s++) { /* every rank knows the whole split */
        PDP_TRY(pdp_pp_stage_layers(pp, s, &first, &last));
        printf("stage %d: layers %d..%d%s", s, first, last - 1, s + 1 < n ? "   " : "\n");
    }
    /* every rank walks the same batches: stage 0 reads x, the last stage the labels */
    pdp_batcher_desc bd = {.batch_size = batch, .shuffle = true, .drop_last = true, .seed = seed,
                           .device = rank == 0 ? ctx->device : pdp_cpu()};
    PDP_TRY(pdp_batcher_create(&b, train, &bd));
    for (e = 0; e < epochs; e++) {
        pdp_tensor x;
        const int32_t *y;
        int64_t got, seen = 0;
        double loss_sum = 0.0, t0 = pdp_seconds();
        float loss;
        pdp_pp_stats st;
        pdp_batcher_reset(b, (uint64_t)e);
        while (pdp_batcher_next(b, &x, &y, &got)) {
            PDP_TRY(pdp_pp_forward_backward(pp, &x, y, &loss)); /* the whole pipeline pass */
            PDP_TRY(pdp_pp_step(pp, opt));
            loss_sum += loss;
            seen += got;
            if (rank == n - 1 && (++step % (short_run ? 5 : 100) == 0))
                printf("step %4lld  loss %.4f\n", (long long)step, (double)loss);
        }
        PDP_TRY(pdp_batcher_status(b));
        pdp_pp_get_stats(pp, &st);
        if (rank == n - 1) /* only the last stage computes the loss */
            printf("epoch %d  loss %.4f  %.0f samples/s\n", e + 1, loss_sum * batch / (double)seen,
                   (double)seen / (pdp_seconds() - t0));
        pdp_pp_stats_format(&st, lines[rank], sizeof lines[rank]);
        for (s = 0; s < n; s++) { /* every stage's line to rank 0, printed in stage order */
            PDP_TRY(pdp_comm_broadcast_bytes(ctx->world, lines[s], sizeof lines[s], s));
            if (rank == 0) fputs(lines[s], stdout);
        }
        if (rank == 0) /* what the figures mean */
            printf("(%s)\n1F1B changes the memory, not the bubble: both schedules idle "
                   "(p-1)/(m+p-1) of a step, but stage s of 1F1B holds at most min(p-s, m) "
                   "micro-batches' activations where GPipe holds all m (so the stages differ: the "
                   "first holds the most). Only the last stage knows the loss, so it prints it.\n",
                   sysconf(_SC_NPROCESSORS_ONLN) >= n ? "as many cores as stages: on a machine "
                   "that runs nothing else the bubble is the pipeline's waiting alone, within "
                   "the margin" : "fewer cores than stages: the stages share cores, so the "
                   "measured bubble also counts waiting for a core and exceeds the formula");
    }
    pdp_batcher_free(b);
    pdp_optim_free(opt);
    pdp_pp_free(pp);
    return PDP_OK;
}

int main(int argc, char **argv)
{
    pdp_launch_desc ld = {0};
    int i, np = 2;
    short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "-np")) np = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-schedule")) sched = argv[i + 1];
        else if (!strcmp(argv[i], "-micro")) micro = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-hidden")) hidden = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-epochs")) epochs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-lr")) lr = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else break;
    }
    if (short_run) batch = 64; /* 10 steps */
    if (i < argc || epochs < 1 || micro < 1 || batch < micro || hidden < 1 || layers < 1 ||
        layers > 30 || (strcmp(sched, "gpipe") && strcmp(sched, "1f1b")) ||
        pdp_backend_from_name(backend, &ld.backend) != PDP_OK) {
        fprintf(stderr, "usage: %s [-backend local|mpi|nccl] [-np 2 (stages, at most the "
                "layers)] [-schedule 1f1b|gpipe] [-micro 4] [-hidden 512] [-layers 2] "
                "[-epochs 1] [-batch 256] [-lr 0.001] [-seed 1]\n", argv[0]);
        return 2;
    }
    pdp_dataset_desc dd = {.flat = true, .mean = PDP_FASHION_MNIST_MEAN,
                           .std = PDP_FASHION_MNIST_STD, .max_samples = short_run ? 640 : 0,
                           .seed = seed, .synthetic_fallback = true};
    PDP_CHECK(pdp_dataset_load_fashion_mnist(&train, true, &dd));
    PDP_CHECK(pdp_launch(np, &ld, train_rank, NULL));
    pdp_dataset_free(train);
    return 0;
}
