/* train_ddp.c - DistributedDataParallel: N ranks train one MLP on Fashion-MNIST.

   Every rank holds a replica of the MLP 784-512-512-10 (Adam, lr 0.001: train_zero.c's, so
   their figures compare) and trains on its shard of each global batch (a DistributedSampler);
   in backward each bucket of gradients is averaged across the ranks as soon as it fills,
   while backward goes on with earlier layers. Rank 0 prints the bytes a rank sent per step
   beside the ring all-reduce's 2(N-1)/N x gradient bytes, and the share of all-reduce time
   hidden under backward. Ranks: threads (-backend local), MPI processes (mpi, under mpirun)
   or GPUs over NCCL (nccl: a thread per GPU, or a process per GPU under torchrun or mpirun).
   -compress bf16|fp16: 16-bit gradients, half the bytes (PyTorch's bf16_compress_hook).

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_ddp.c -o train_ddp -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_ddp.c -o train_ddp_mpi -lm
           nvcc -O2 -arch=sm_90 -DPDP_CUDA -I. examples/train_ddp.c pdp_cuda.cu -o train_ddp_cuda \
               -lcublas -lnccl       (or make cuda: build/cuda/train_ddp)
   Run:    ./train_ddp                       (2 thread-ranks; PDP_SHORT=1 for a few steps)
           ./train_ddp -np 4 -epochs 2 -compress bf16
           mpirun -np 2 ./train_ddp_mpi -backend mpi
           ./train_ddp_cuda -backend nccl -np 2                   (2 GPUs, one thread each)
           torchrun --nproc-per-node 2 --no-python ./train_ddp_cuda -backend nccl
           PDP_TRACE=ddp.json ./train_ddp    then open ddp.json in ui.perfetto.dev
   Output (2 ranks, seed 1, 2 shared cores; mpirun -np 2 -backend mpi prints the same losses):
           seed 1: Fashion-MNIST, backend local, 2 ranks, global batch 256 (128 per rank), ...
           step  100  loss 0.3812  sent/rank 2.68 MB  ring 2(N-1)/N x grads 2.68 MB  hidden ...
           epoch 1  loss 0.4848  test 85.40%  11440 samples/s  all-reduce hidden under ...
           (the losses are rank 0's, over its own shard of each batch: the other ranks' ...)
   Next:   train_zero.c (the same model and optimizer with ZeRO's shards). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int np = 2, epochs = 1; /* np: thread ranks (mpirun or torchrun decide otherwise) */
static int64_t batch = 256, seed = 1; /* batch: the global batch */
static double lr = 0.001;
static bool short_run;
static const char *backend = "local", *compress = "none"; /* compress: bf16 or fp16 */
static pdp_dataset *train, *test;

/* What every rank runs, on its own thread or process (pdp_launch). */
static pdp_status train_rank(const pdp_launch_ctx *ctx, void *user)
{
    int rank = ctx->rank, n = ctx->world_size, e, i;
    int64_t step = 0, per_rank = batch / n;
    double wire = strcmp(compress, "none") ? 0.5 : 1.0, hidden = 0; /* 16-bit: half the bytes */
    pdp_model *m;
    pdp_optim *opt;
    pdp_ddp *ddp;
    pdp_dist_sampler *sampler;
    pdp_batcher *b, *tb;
    pdp_ddp_stats s;
    (void)user;
    if (rank == 0)
        printf("seed %lld: %s, backend %s, %d ranks, global batch %lld (%lld per rank%s), MLP "
               "784-512-512-10, Adam lr %g, gradients %s\n", (long long)seed, train->source,
               backend, n, (long long)(per_rank * n), (long long)per_rank,
               batch % n ? "; -batch rounded down to a multiple of the ranks" : "", lr,
               wire < 1 ? compress : "fp32");
    /* the seed differs by rank on purpose: DDP starts every rank from rank 0's parameters */
    pdp_model_desc md = {.input_shape = {784}, .device = ctx->device,
                         .seed = (uint64_t)seed + (uint64_t)rank};
    PDP_TRY(pdp_model_create(&m, &md));
    for (i = 0; i < 2; i++) {
        PDP_TRY(pdp_model_add_linear(m, 512));
        PDP_TRY(pdp_model_add_relu(m));
    }
    PDP_TRY(pdp_model_add_linear(m, 10));
    PDP_TRY(pdp_model_reserve(m, per_rank > 1000 ? per_rank : 1000));
    PDP_TRY(pdp_optim_create(&opt, m, &(pdp_optim_desc){.kind = PDP_OPTIM_ADAM, .lr = lr}));
    PDP_TRY(pdp_ddp_create(&ddp, m, ctx->world, NULL)); /* 25 MB buckets, first 1 MB */
    if (wire < 1) { /* before the first backward */
        pdp_ddp_comm_hook h = !strcmp(compress, "bf16") ? pdp_ddp_hook_bf16_compress()
                                                        : pdp_ddp_hook_fp16_compress();
        PDP_TRY(pdp_ddp_register_comm_hook(ddp, &h));
    }
    pdp_batcher_desc tbd = {.batch_size = 1000, .device = ctx->device}; /* the test set */
    PDP_TRY(pdp_batcher_create(&tb, test, &tbd));
    pdp_dist_sampler_desc sd = {.dataset_size = train->count, .world_size = n, .rank = rank,
                                .seed = (uint64_t)seed}; /* this rank's shard of the data */
    PDP_TRY(pdp_dist_sampler_create(&sampler, &sd));
    pdp_batcher_desc bd = {.batch_size = per_rank, .sampler = sampler, .device = ctx->device,
                           .drop_last = true}; /* every rank the same count of batches */
    PDP_TRY(pdp_batcher_create(&b, train, &bd));
    for (e = 0; e < epochs; e++) {
        pdp_tensor x;
        const int32_t *y;
        int64_t got, seen = 0;
        double loss_sum = 0.0, t0 = pdp_seconds(), acc;
        float loss;
        pdp_batcher_reset(b, (uint64_t)e); /* the sampler's shuffle of epoch e, the same on all */
        while (pdp_batcher_next(b, &x, &y, &got)) {
            /* forward, loss, backward; each bucket's all-reduce starts as it fills */
            PDP_TRY(pdp_ddp_forward_backward(ddp, &x, y, &loss));
            PDP_TRY(pdp_ddp_step(ddp, opt)); /* waits, averages, updates */
            loss_sum += loss;
            seen += got;
            pdp_ddp_get_stats(ddp, &s); /* the last step's figures */
            if (rank == 0 && (++step % (short_run ? 5 : 100) == 0))
                printf("step %4lld  loss %.4f  sent/rank %.2f MB  ring 2(N-1)/N x grads%s %.2f "
                       "MB  hidden %.0f%% (this step)\n", (long long)step, (double)loss,
                       s.bytes_sent / 1e6, wire < 1 ? " x 1/2" : "",
                       2.0 * (n - 1) / n * (double)s.grad_bytes / 1e6 * wire,
                       100.0 * s.hidden_share);
        }
        PDP_TRY(pdp_batcher_status(b));
        pdp_ddp_get_stats(ddp, &s);
        if (rank == 0) { /* every rank holds the same parameters: rank 0 evaluates */
            double dt = pdp_seconds() - t0;
            hidden = 1.0 - s.total_wait_s / s.total_allreduce_s;
            PDP_TRY(pdp_model_accuracy(m, tb, &acc));
            printf("epoch %d  loss %.4f  test %.2f%%  %.0f samples/s  all-reduce hidden "
                   "under backward over the epoch: %.0f%% of %.3f s\n", e + 1,
                   loss_sum * per_rank / (double)seen, 100.0 * acc, (double)seen * n / dt,
                   100.0 * (hidden > 0 ? hidden : 0), s.total_allreduce_s);
        }
    }
    if (rank == 0)
        printf("(the losses are rank 0's, on its shard: the others' differ, the parameters do "
               "not. Layer 0's bucket, 60%% of the bytes, is ready last, as backward ends: %s)\n",
               hidden < 0.5 ? "exposed" : "exposed, but quick to reduce here (not on a network)");
    pdp_batcher_free(b);
    pdp_dist_sampler_free(sampler);
    pdp_batcher_free(tb);
    pdp_ddp_free(ddp);
    pdp_optim_free(opt);
    pdp_model_free(m);
    return PDP_OK;
}

int main(int argc, char **argv)
{
    pdp_launch_desc ld = {0};
    const pdp_arg args[] = { /* option, type, variable (its default), min, max, choices */
        {"-backend", PDP_ARG_STRING, &backend, 0, 0, "local|mpi|nccl"},
        {"-np", PDP_ARG_INT, &np, 1, 256, NULL},
        {"-epochs", PDP_ARG_INT, &epochs, 1, 1000, NULL},
        {"-batch", PDP_ARG_INT64, &batch, 1, 1 << 20, NULL}, /* global: at least 1 per rank */
        {"-lr", PDP_ARG_DOUBLE, &lr, 1e-9, 10, NULL},
        {"-seed", PDP_ARG_INT64, &seed, 0, 1e18, NULL},
        {"-compress", PDP_ARG_STRING, &compress, 0, 0, "none|bf16|fp16"},
    };
    short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    if (short_run) batch = 32; /* 10 steps, quick under the sanitizers; -batch overrides */
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
    PDP_CHECK(pdp_launch(np, &ld, train_rank, NULL)); /* every rank runs train_rank */
    pdp_dataset_free(train);
    pdp_dataset_free(test);
    return 0;
}
