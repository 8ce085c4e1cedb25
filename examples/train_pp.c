/* train_pp.c - pipeline parallelism: train_ddp.c's MLP split into stages across ranks.

   Every rank builds the same MLP 784-512-512-10 (Adam, lr 0.001; -hidden H, -layers L for
   784-H-..-H-10) and keeps its stage's layers, split so that the stages' work is as equal
   as whole layers allow (PDP_PP_BALANCE_WORK: FLOPs from the layers' shapes; the default
   split, by parameter count, leaves a stage nearly idle). Each batch is cut into m
   micro-batches that flow through the stages: activations go forward with send/recv, their
   gradients come back and accumulate, so a step is a step of single-device training on the
   whole batch. GPipe runs
   all forwards, then all backwards; 1F1B one forward, one backward after a warm-up. Rank 0
   prints each stage's measured bubble (idle share of the step) beside (p-1)/(m+p-1), met
   within 0.10 when every stage has a core of its own (else it says the stages share cores),
   and its peak activations under both schedules: the bubble is the same, but stage s of
   1F1B holds min(p-s, m) micro-batches, GPipe all m. Only the last stage has the loss.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_pp.c -o train_pp -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_pp.c -o train_pp_mpi -lm
           nvcc -O2 -arch=sm_90 -DPDP_CUDA -I. examples/train_pp.c pdp_cuda.cu -o train_pp_cuda \
               -lcublas -lnccl       (or make cuda: build/cuda/train_pp)
   Run:    ./train_pp                            (2 stages as threads, 1F1B, m = 4)
           ./train_pp -np 3 -layers 4 -schedule gpipe -micro 8
           mpirun -np 2 ./train_pp_mpi -backend mpi;  ./train_pp_cuda -backend nccl -np 2
           PDP_TRACE=pp.json ./train_pp          then open pp.json in ui.perfetto.dev
   Output (seed 1; -backend mpi and -schedule gpipe print the same losses: the same arithmetic):
           seed 1: Fashion-MNIST, backend local, 2 stages, schedule 1f1b, 4 micro-batches ...
           stage 0: layers 0..0                  (then stage 1: layers 1..4, "step 100 loss ...")
           epoch 1  loss 0.4874  ... samples/s
           stage 0: compute ... s  bubble B0 (formula (p-1)/(m+p-1) = 0.20, margin 0.10: met|missed)
             peak activations 2 micro-batches = 0.26 MB  (1f1b: ..., GPipe m = 4 = 0.52 MB)
           stage 1: ... bubble B1 ... 1 micro-batch = 0.40 MB  (..., GPipe m = 4 = 1.58 MB)
           (as many cores as stages: ...)  then "1F1B changes the memory, not the bubble: ..."
           (measured on 2 Intel Xeon cores at load 8-9, other jobs: bubbles 0.60-0.67 and 0.55-0.63
           in 3 runs, missed as the stages waited for cores too; GPipe's 0.55 and 0.42 as high)
   Next:   bench/pp.c (throughput against one device for m = 1, 2, 4, 8). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int np = 2, epochs = 1, micro = 4, layers = 2; /* np: stages, as thread ranks */
static int64_t batch = 256, hidden = 512, seed = 1;
static double lr = 0.001;
static bool short_run;
static const char *backend = "local", *sched = "1f1b";
static pdp_dataset *train;

/* What every rank runs (pdp_launch): its stage of the model, on the CPU or its GPU. */
static pdp_status train_rank(const pdp_launch_ctx *ctx, void *user)
{
    int rank = ctx->rank, n = ctx->world_size, e, i, first, last;
    pdp_model *full;
    pdp_optim *opt;
    pdp_pp *pp;
    pdp_batcher *b;
    int64_t step = 0;
    char line[512];
    (void)user;
    if (rank == 0)
        printf("seed %lld: %s, backend %s, %d stages, schedule %s, %d micro-batches of %lld%s, "
               "MLP 784-%lldx%d-10, Adam lr %g\n", (long long)seed, train->source, backend, n,
               sched, micro, (long long)(batch / micro), batch % micro ? " or one more" : "",
               (long long)hidden, layers, lr);
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
    PDP_TRY(pdp_pp_stage_layers(pp, rank, &first, &last)); /* (any stage's: every rank knows) */
    PDP_TRY(pdp_print_by_rank(ctx->world, "stage %d: layers %d..%d\n", rank, first, last - 1));
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
        pdp_pp_stats_format(&st, line, sizeof line);
        PDP_TRY(pdp_print_by_rank(ctx->world, "%s", line)); /* every stage's, in stage order */
        if (rank == 0) /* what the figures mean */
            printf("(the formula takes stages of equal time: a stage that computes less, as its "
                   "compute figure says, waits more; %s)\n1F1B changes the memory, not the "
                   "bubble: both schedules idle (p-1)/(m+p-1) of a step, but stage s of 1F1B "
                   "holds at most min(p-s, m) micro-batches' activations where GPipe holds all m "
                   "(the first stage the most micro-batches). Only the last stage knows the "
                   "loss, so it prints it.\n",
                   sysconf(_SC_NPROCESSORS_ONLN) >= n ? "as many cores as stages: on an idle "
                   "machine the bubble is the pipeline's waiting alone, within the margin"
                   : "fewer cores than stages: the stages share cores, so the measured bubble "
                   "also counts waiting for a core and exceeds the formula");
    }
    pdp_batcher_free(b);
    pdp_optim_free(opt);
    pdp_pp_free(pp);
    return PDP_OK;
}

int main(int argc, char **argv)
{
    pdp_launch_desc ld = {0};
    const pdp_arg args[] = { /* option, type, variable (its default), min, max, choices */
        {"-backend", PDP_ARG_STRING, &backend, 0, 0, "local|mpi|nccl"},
        {"-np", PDP_ARG_INT, &np, 1, PDP_PP_MAX_STAGES, NULL}, /* stages, at most the layers */
        {"-schedule", PDP_ARG_STRING, &sched, 0, 0, "1f1b|gpipe"},
        {"-micro", PDP_ARG_INT, &micro, 1, 1024, NULL}, /* micro-batches per batch */
        {"-hidden", PDP_ARG_INT64, &hidden, 1, 65536, NULL},
        {"-layers", PDP_ARG_INT, &layers, 1, 30, NULL},
        {"-epochs", PDP_ARG_INT, &epochs, 1, 1000, NULL},
        {"-batch", PDP_ARG_INT64, &batch, 1, 1 << 20, NULL}, /* at least -micro (pdp_pp says) */
        {"-lr", PDP_ARG_DOUBLE, &lr, 1e-9, 10, NULL},
        {"-seed", PDP_ARG_INT64, &seed, 0, 1e18, NULL},
    };
    short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    if (short_run) batch = 64; /* 10 steps; -batch overrides */
    pdp_args_parse_or_exit(argc, argv, args, sizeof args / sizeof args[0]); /* -h: usage */
    PDP_CHECK(pdp_backend_from_name(backend, &ld.backend));
    if (batch < micro)
        return fprintf(stderr, "-batch %lld: fewer rows than -micro %d\n", (long long)batch,
                       micro), 2;
    pdp_dataset_desc dd = {.flat = true, .mean = PDP_FASHION_MNIST_MEAN,
                           .std = PDP_FASHION_MNIST_STD, .max_samples = short_run ? 640 : 0,
                           .seed = (uint64_t)seed, .synthetic_fallback = true};
    PDP_CHECK(pdp_dataset_load_fashion_mnist(&train, true, &dd));
    PDP_CHECK(pdp_launch(np, &ld, train_rank, NULL));
    pdp_dataset_free(train);
    return 0;
}
