/* train_tp.c - tensor parallelism: N ranks share each weight matrix of train_ddp.c's MLP.

   train_ddp.c's MLP 784-512-512-10 (Adam, lr 0.001) with its first two layers made
   Megatron-LM's MLP block, the 512 hidden features split over the ranks:
       f                      identity forward, all-reduce of the input gradient backward
       ColumnParallelLinear   rank r holds rows of W1 [512, 784]: its slice of the hidden
       ReLU                   on the slice
       RowParallelLinear      rank r holds the matching columns of W2 [512, 512]: a partial sum
       g                      all-reduce of the partial sums forward, identity backward
       ReLU, Linear 512-10    replicated
   Every rank trains on the same batches, so has the same loss, and holds 1/N of the block's
   weights and GEMMs. Rank 0 prints the bytes a rank all-reduced per step beside the formula:
   g's all-reduce of B x 512 floats forward, 2(N-1)/N of them sent by the ring (f's backward
   one is skipped: the input needs no gradient). -save PATH writes the full tensors, the
   single-device MLP's checkpoint (pdp_checkpoint_load and PyTorch's nn.Sequential read it).

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_tp.c -o train_tp -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_tp.c -o train_tp_mpi -lm
           nvcc -O2 -arch=sm_90 -DPDP_CUDA -I. examples/train_tp.c pdp_cuda.cu -o train_tp_cuda \
               -lcublas -lnccl       (or make cuda: build/cuda/train_tp)
   Run:    ./train_tp                        (2 thread-ranks; PDP_SHORT=1 for a few steps)
           ./train_tp -np 4 -epochs 2 -save tp.safetensors
           mpirun -np 2 ./train_tp_mpi -backend mpi
           ./train_tp_cuda -backend nccl -np 2
   Output (PDP_SHORT=1, 2 ranks, seed 1):
           seed 1: Fashion-MNIST, backend local, 2 TP ranks, batch 32, MLP [f, 784-512 ...
           rank 0 holds hidden features [0, 256) of 512: 337674 of 669706 parameters
           step    5  loss 1.6526  all-reduced/rank a step: fwd 65536 B (formula B x 512 x 4 =
             65536 B)  bwd 0 B (f at the input: no gradient to sum)  sent 65536 B (ring ...)
           epoch 1  loss 1.5867  test 58.75%  3696 samples/s  all-reduce 72% of the time ...
   Next:   train_pp.c (splitting the layers across ranks instead of each layer). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define H 512 /* the hidden width: the block's features, split over the ranks */

static int np = 2, epochs = 1; /* np: thread ranks (mpirun decides otherwise) */
static int64_t batch = 128, seed = 1;
static double lr = 0.001;
static bool short_run;
static const char *backend = "local", *save_path;
static pdp_dataset *train, *test;

/* What every rank runs (pdp_launch), on the same batches. */
static pdp_status train_rank(const pdp_launch_ctx *ctx, void *user)
{
    int rank = ctx->rank, n = ctx->world_size, e;
    int64_t step = 0, lo, cols;
    pdp_model *m;
    pdp_optim *opt;
    pdp_batcher *b, *tb;
    pdp_tp_stats s;
    (void)user;
    if (rank == 0)
        printf("seed %lld: %s, backend %s, %d TP ranks, batch %lld, MLP [f, 784-%d split %d "
               "ways, %d-%d, g]-10, Adam lr %g\n", (long long)seed, train->source, backend, n,
               (long long)batch, H, n, H, H, lr);
    /* the same seed on every rank: each keeps its slice of the same draw */
    pdp_model_desc md = {.input_shape = {784}, .device = ctx->device, .seed = (uint64_t)seed};
    PDP_TRY(pdp_model_create(&m, &md));
    PDP_TRY(pdp_model_set_tp(m, ctx->world));
    PDP_TRY(pdp_model_add_tp_copy(m));                  /* f */
    PDP_TRY(pdp_model_add_column_parallel_linear(m, H)); /* W1 split by rows */
    PDP_TRY(pdp_model_add_relu(m));
    PDP_TRY(pdp_model_add_row_parallel_linear(m, H));    /* W2 split by columns */
    PDP_TRY(pdp_model_add_tp_reduce(m));                /* g */
    PDP_TRY(pdp_model_add_relu(m));
    PDP_TRY(pdp_model_add_linear(m, 10));
    PDP_TRY(pdp_model_reserve(m, batch > 1000 ? batch : 1000));
    pdp_tp_split(H, rank, n, &lo, &cols);
    if (rank == 0)
        printf("rank 0 holds hidden features [%lld, %lld) of %d: %lld of %lld parameters\n",
               (long long)lo, (long long)(lo + cols), H, (long long)pdp_model_param_count(m),
               (long long)(785 * H + (H + 1) * H + 10 * H + 10));
    PDP_TRY(pdp_optim_create(&opt, m, &(pdp_optim_desc){.kind = PDP_OPTIM_ADAM, .lr = lr}));
    pdp_batcher_desc bd = {.batch_size = batch, .shuffle = true, .drop_last = true,
                           .seed = (uint64_t)seed, .device = ctx->device}; /* the same batches */
    PDP_TRY(pdp_batcher_create(&b, train, &bd));
    pdp_batcher_desc tbd = {.batch_size = 1000, .device = ctx->device}; /* the test set */
    PDP_TRY(pdp_batcher_create(&tb, test, &tbd));
    for (e = 0; e < epochs; e++) {
        pdp_tensor x;
        const int32_t *y;
        int64_t got, seen = 0;
        double loss_sum = 0.0, t0 = pdp_seconds(), dt, acc;
        float loss;
        pdp_tp_reset_stats(m);
        pdp_batcher_reset(b, (uint64_t)e);
        while (pdp_batcher_next(b, &x, &y, &got)) {
            PDP_TRY(pdp_model_forward_backward(m, &x, y, &loss)); /* f and g inside */
            PDP_TRY(pdp_optim_step(opt));
            pdp_optim_zero_grad(opt);
            loss_sum += loss * (double)got;
            seen += got;
            if (rank == 0 && (++step % (short_run ? 5 : 100) == 0)) {
                pdp_tp_get_stats(m, &s);
                int64_t k = s.forward_allreduces ? s.forward_allreduces : 1; /* steps */
                printf("step %4lld  loss %.4f  all-reduced/rank a step: fwd %lld B (formula B x "
                       "%d x 4 = %lld B)  bwd %lld B%s  sent %.0f B (ring 2(N-1)/N x fwd = %.0f "
                       "B)\n", (long long)step, (double)loss, (long long)(s.forward_bytes / k),
                       H, (long long)(got * H * 4), (long long)(s.backward_bytes / k),
                       s.backward_bytes ? "" : " (f at the input: no gradient to sum)",
                       (double)s.bytes_sent / (double)k, 2.0 * (n - 1) / n * (double)(got * H * 4));
            }
        }
        PDP_TRY(pdp_batcher_status(b));
        dt = pdp_seconds() - t0;
        pdp_tp_get_stats(m, &s);
        PDP_TRY(pdp_model_accuracy(m, tb, &acc)); /* a forward too: every rank takes part in g */
        if (rank == 0)
            printf("epoch %d  loss %.4f  test %.2f%%  %.0f samples/s  all-reduce %.0f%% of the "
                   "time (%.3f s, waiting for the other ranks included: g and f are "
                   "synchronous)\n", e + 1, loss_sum / (double)seen, 100.0 * acc,
                   (double)seen / dt, 100.0 * s.allreduce_s / dt, s.allreduce_s);
    }
    if (save_path) {
        PDP_TRY(pdp_tp_checkpoint_save(save_path, m, opt)); /* collective: every rank */
        if (rank == 0) printf("saved %s: the full tensors, state_dict names\n", save_path);
    }
    pdp_batcher_free(b);
    pdp_batcher_free(tb);
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
        {"-batch", PDP_ARG_INT64, &batch, 1, 1 << 20, NULL},
        {"-lr", PDP_ARG_DOUBLE, &lr, 1e-9, 10, NULL},
        {"-seed", PDP_ARG_INT64, &seed, 0, 1e18, NULL},
        {"-save", PDP_ARG_STRING, &save_path, 0, 0, NULL}, /* the full tensors' file */
    };
    short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    if (short_run) batch = 32; /* 10 steps; -batch overrides */
    pdp_args_parse_or_exit(argc, argv, args, sizeof args / sizeof args[0]); /* -h: usage */
    PDP_CHECK(pdp_backend_from_name(backend, &ld.backend));
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
