/* train_zero.c - the ZeRO ladder: stages 1, 2, 3 train train_ddp.c's MLP (Adam, lr 0.001) on
   Fashion-MNIST, and rank 0 says why ZeRO saves memory at this model size, or does not.

   Stage 1 shards Adam's state across the ranks, 2 the gradients too, 3 the parameters too
   (each rank all-gathers a unit, whole layers, just before it computes). -hidden H and
   -layers L size the model (784-H-..-H-10). Each rank prints its loss and the bytes it sent
   beside the formula; rank 0 prints pdp_zero_memory_format's report: per stage (0 is DDP),
   pdp's fp32 formula (stage 1 = 8 Psi + 8 Psi/N, ...) beside the ZeRO paper's mixed-precision
   one (4 Psi + 12 Psi/N, ...) and the buffers it adds; its measured bytes against DDP's; why
   (a sharded float of every parameter saves (1 - 1/N) x 4 Psi, a working buffer costs 4 U_max).

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_zero.c -o train_zero -lm -lpthread
           (mpicc -DPDP_MPI: train_zero_mpi), or make cuda (build/cuda/train_zero): nvcc -O2
           -arch=sm_90 -DPDP_CUDA -I. examples/train_zero.c pdp_cuda.cu -lcublas -lnccl
   Run:    ./train_zero -stage 1|2|3         (default 3, 2 thread-ranks; PDP_SHORT=1: a few steps)
           ./train_zero -layers 6            (a deeper model: here ZeRO saves at N = 2)
           ./train_zero -stage 2 -accum 2    (2 backward passes per step: 1.5x the bytes)
           mpirun -np 2 ./train_zero_mpi -backend mpi;  ./train_zero_cuda -backend nccl -np 2
   Output (PDP_SHORT=1, seed 1, 2 ranks; -backend mpi prints the same figures):
           seed 1: Fashion-MNIST, backend local, 2 ranks, ZeRO stage 3, ... (669706 parameters)
           rank 0 epoch 1  loss 1.5745  test 58.75%  ...  sent/step 4.02 MB  formula 4.02 MB = ...
           rank 1 epoch 1  loss 1.5989  test 58.75%  ...
           (each rank's loss is the mean over its own shard ...; DDP (train_ddp.c) sends ...)
           memory per rank, N = 2, Psi = 669706 ... (a line per stage, 0 to 3), then
           measured, stage 3: ... = 11.79 MB against DDP's 10.72 MB: stage 3 does not save here
           why: ... stage 1 saves from N = 2, stage 2 from N = 3 and stage 3 from N = 3 ...
   Next:   train_tp.c (splitting each layer across ranks instead of its state). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>

static int np = 2, epochs = 1, stage = 3, accum = 1, layers = 2; /* np: thread ranks */
static int64_t batch = 256, hidden = 512, seed = 1; /* batch: the global batch */
static double lr = 0.001, cap_mb = 0.5; /* units of 0.5 MiB or one layer (a larger layer alone) */
static const char *backend = "local";
static pdp_dataset *train, *test;

static pdp_status train_rank(const pdp_launch_ctx *ctx, void *user)
{
    int rank = ctx->rank, n = ctx->world_size, e, i;
    int64_t per_rank = batch / n;
    char report[2048];
    pdp_model *m;
    pdp_optim *opt;
    pdp_zero *z;
    pdp_dist_sampler *sampler;
    pdp_batcher *b, *tb;
    pdp_zero_memory mm;
    pdp_zero_stats zs;
    (void)user;
    pdp_model_desc md = {.input_shape = {784}, .device = ctx->device, .seed = seed + rank};
    PDP_TRY(pdp_model_create(&m, &md)); /* pdp_zero_create starts every rank from rank 0's */
    for (i = 0; i < layers; i++) {
        PDP_TRY(pdp_model_add_linear(m, hidden));
        PDP_TRY(pdp_model_add_relu(m));
    }
    PDP_TRY(pdp_model_add_linear(m, 10));
    if (rank == 0)
        printf("seed %lld: %s, backend %s, %d ranks, ZeRO stage %d, global batch %lld%s, MLP "
               "784-%lldx%d-10 (%lld parameters), Adam lr %g\n", (long long)seed, train->source,
               backend, n, stage, (long long)(per_rank * n),
               batch % n ? " (-batch rounded down to a multiple of the ranks)" : "",
               (long long)hidden, layers, (long long)pdp_model_param_count(m), lr);
    pdp_zero_desc zd = {.stage = stage, .bucket_cap_mb = cap_mb, .first_bucket_mb = cap_mb};
    PDP_TRY(pdp_zero_create(&z, m, ctx->world, &zd)); /* shards the model */
    PDP_TRY(pdp_zero_optim_create(&opt, z, &(pdp_optim_desc){.kind = PDP_OPTIM_ADAM, .lr = lr}));
    pdp_batcher_desc tbd = {.batch_size = 1000, .device = ctx->device}; /* the test set */
    PDP_TRY(pdp_batcher_create(&tb, test, &tbd));
    pdp_dist_sampler_desc sd = {.dataset_size = train->count, .world_size = n, .rank = rank,
                                .seed = seed};
    PDP_TRY(pdp_dist_sampler_create(&sampler, &sd));
    pdp_batcher_desc bd = {.batch_size = per_rank, .sampler = sampler, .device = ctx->device,
                           .drop_last = true}; /* this rank's shard, the same count on all */
    PDP_TRY(pdp_batcher_create(&b, train, &bd));
    for (e = 0; e < epochs; e++) {
        pdp_tensor x;
        const int32_t *y;
        int64_t got, seen = 0, micro = 0;
        double loss_sum = 0.0, t0 = pdp_seconds(), acc;
        float loss;
        pdp_batcher_reset(b, (uint64_t)e); /* the sampler's shuffle of epoch e */
        while (pdp_batcher_next(b, &x, &y, &got)) {
            bool last = ++micro % accum == 0; /* accum - 1 backward passes accumulate, then step */
            pdp_zero_set_no_sync(z, !last);
            PDP_TRY(pdp_zero_forward_backward(z, &x, y, &loss));
            if (last) PDP_TRY(pdp_zero_step(z, opt)); /* wait, step the shard, all-gather */
            loss_sum += loss;
            seen += got;
        }
        PDP_TRY(pdp_batcher_status(b));
        pdp_zero_get_stats(z, &zs); /* the last step's bytes and their formula */
        PDP_TRY(pdp_model_accuracy(m, tb, &acc)); /* every rank: stage 3's forward gathers */
        PDP_TRY(pdp_print_by_rank(ctx->world, "rank %d epoch %d  loss %.4f  test %.2f%%  %.0f "
                                  "samples/s  sent/step %.2f MB  formula %.2f MB = %s\n", rank,
                                  e + 1, loss_sum * per_rank / (double)seen, 100.0 * acc,
                                  (double)seen * n / (pdp_seconds() - t0), zs.bytes_sent / 1e6,
                                  zs.formula_bytes / 1e6, zs.formula));
    }
    if (rank == 0) { /* this rank's bytes beside every stage's plan, DDP's included */
        PDP_TRY(pdp_zero_get_memory(z, opt, &mm));
        pdp_zero_memory_format(&mm, report, sizeof report);
        printf("(each rank's loss is the mean over its own shard, so the ranks' losses differ; "
               "their parameters, and test accuracies, do not. DDP (train_ddp.c, this model) "
               "sends 2 (N-1)/N x 4 Psi a step, its k = %d backward passes accumulated under "
               "no_sync: stage 1 as much, stage 2 (k + 1)/2 = %.1fx, stage 3 1.5k = %.1fx, "
               "less, at k > 1, the units it keeps gathered)\n%s", accum, (accum + 1) / 2.0,
               1.5 * accum, report);
    }
    pdp_batcher_free(b);
    pdp_dist_sampler_free(sampler);
    pdp_batcher_free(tb);
    pdp_zero_free(z);
    pdp_optim_free(opt);
    pdp_model_free(m);
    return PDP_OK;
}

int main(int argc, char **argv)
{
    pdp_launch_desc ld = {0};
    bool short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    const pdp_arg args[] = { /* option, type, variable (its default), min, max, choices */
        {"-stage", PDP_ARG_INT, &stage, 1, 3, NULL},
        {"-backend", PDP_ARG_STRING, &backend, 0, 0, "local|mpi|nccl"},
        {"-np", PDP_ARG_INT, &np, 1, 256, NULL}, /* thread ranks */
        {"-hidden", PDP_ARG_INT64, &hidden, 1, 65536, NULL},
        {"-layers", PDP_ARG_INT, &layers, 1, 64, NULL},
        {"-epochs", PDP_ARG_INT, &epochs, 1, 1000, NULL},
        {"-batch", PDP_ARG_INT64, &batch, 1, 1 << 20, NULL}, /* global: at least 1 per rank */
        {"-lr", PDP_ARG_DOUBLE, &lr, 1e-9, 10, NULL},
        {"-cap_mb", PDP_ARG_DOUBLE, &cap_mb, 1e-3, 1024, NULL},
        {"-seed", PDP_ARG_INT64, &seed, 0, 1e18, NULL},
        {"-accum", PDP_ARG_INT, &accum, 1, 1000, NULL}, /* backward passes per step */
    };
    if (short_run) batch = 32; /* 10 steps; -batch overrides */
    pdp_args_parse_or_exit(argc, argv, args, sizeof args / sizeof args[0]); /* -h: usage */
    PDP_CHECK(pdp_backend_from_name(backend, &ld.backend));
    if (batch < np) {
        fprintf(stderr, "-batch %lld: fewer samples than the %d ranks\n", (long long)batch, np);
        return 2;
    }
    pdp_dataset_desc dd = {.flat = true, .mean = PDP_FASHION_MNIST_MEAN,
                           .std = PDP_FASHION_MNIST_STD, .max_samples = short_run ? 320 : 0,
                           .seed = (uint64_t)seed, .synthetic_fallback = true};
    PDP_CHECK(pdp_dataset_load_fashion_mnist(&train, true, &dd));
    PDP_CHECK(pdp_dataset_load_fashion_mnist(&test, false, &dd));
    PDP_CHECK(pdp_launch(np, &ld, train_rank, NULL));
    pdp_dataset_free(train);
    pdp_dataset_free(test);
    return 0;
}
