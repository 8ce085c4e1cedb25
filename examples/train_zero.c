/* train_zero.c - the ZeRO ladder: DDP (stage 0) and ZeRO stages 1, 2, 3 train train_ddp.c's
   MLP (Adam, lr 0.001) on Fashion-MNIST; rank 0 says whether ZeRO saves memory at this size.

   -stage 0 is DDP (every rank a full replica); 1 shards Adam's state, 2 the gradients too,
   3 the parameters too: each rank then keeps its slice of every unit (a unit holds whole
   layers) and all-gathers a unit's parameters just before it computes. -hidden H and
   -layers L size the model (784-H-..-H-10). Every rank prints its loss (over its own shard
   of the data, so the ranks' differ) and the bytes it sent beside the formula; rank 0 then
   prints zero.h's memory report (pdp_zero_get_memory, or pdp_zero_memory_plan for DDP,
   through pdp_zero_memory_format): each stage's memory per rank by pdp's fp32 formula (16
   bytes a parameter: stage 1 = 8 Psi + 8 Psi/N, ...) beside the ZeRO paper's mixed-precision
   one (K = 12: stage 1 = 4 Psi + 12 Psi/N, ...), the working buffers that stages 1-3 add (1,
   3 and 4 of the largest unit), its measured total, and when the shards outweigh the buffers.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_zero.c -o train_zero -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_zero.c -o train_zero_mpi \
               -lm
           nvcc -O2 -arch=sm_90 -DPDP_CUDA -I. examples/train_zero.c pdp_cuda.cu \
               -o train_zero_cuda -lcublas -lnccl       (or make cuda: build/cuda/train_zero)
   Run:    ./train_zero                      (stage 3, 2 thread-ranks; PDP_SHORT=1: a few steps)
           for s in 0 1 2 3; do ./train_zero -stage $s; done
           ./train_zero -layers 6            (a deeper model: here ZeRO saves at N = 2)
           ./train_zero -stage 2 -accum 2    (2 backward passes per step: 1.5x the bytes)
           mpirun -np 2 ./train_zero_mpi -backend mpi -stage 2
           ./train_zero_cuda -backend nccl -np 2 -stage 3                 (2 GPUs)
   Output (PDP_SHORT=1, seed 1, 2 ranks; mpirun -np 2 -backend mpi prints the same figures):
           seed 1: Fashion-MNIST, backend local, 2 ranks, stage 3 (ZeRO), ... (669706 parameters)
           rank 0 epoch 1  loss 1.5745  test 58.75%  ...  sent/step 4.02 MB  formula 4.02 MB = ...
           rank 1 epoch 1  loss 1.5989  test 58.75%  ...
             stage 1  pdp fp32 8 Psi + 8 Psi/N  =   8.04 MB | paper 4 Psi + 12 Psi/N =   6.70 MB
             | + buffers 1 x 4 U_max =  1.61 MB            (and stages 0, 2, 3 likewise)
           measured, stage 3: params 1.34 + grads 1.34 + optimizer 2.68 + buffers 6.43 = 11.79
             MB against DDP's 10.72 MB: stage 3 does not save here
           why: ... here (1 - 1/N) Psi = 334853 against U_max = 401920, so with this model
             stage 1 saves from N = 2, stage 2 from N = 3 and stage 3 from N = 3 (N = 2 here).
           (-np 3: stage 3 10.00 MB, stage 2 10.18 MB against 10.72; -layers 3: 13.89 against
           14.92 MB: both save, as the condition says)
   Next:   train_tp.c (splitting each layer across ranks instead of its state). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int epochs = 1, stage = 3, accum = 1, layers = 2;
static int64_t batch = 256, hidden = 512; /* global batch */
static double lr = 0.001, cap_mb = 0.5;   /* units of at most 0.5 MiB (whole layers) */
static unsigned long long seed = 1;
static const char *backend = "local";
static pdp_dataset *train, *test;

static pdp_status train_rank(const pdp_launch_ctx *ctx, void *user)
{
    int rank = ctx->rank, n = ctx->world_size, e, i;
    int64_t per_rank = batch / n;
    char report[2048];
    pdp_model *m;
    pdp_optim *opt;
    pdp_ddp *ddp = NULL;
    pdp_zero *z = NULL;
    pdp_dist_sampler *sampler;
    pdp_batcher *b, *tb;
    pdp_zero_memory mm;
    pdp_ddp_stats ds;
    pdp_zero_stats zs;
    (void)user;
    pdp_model_desc md = {.input_shape = {784}, .device = ctx->device, .seed = seed + rank};
    PDP_TRY(pdp_model_create(&m, &md)); /* DDP and ZeRO start every rank from rank 0's */
    for (i = 0; i < layers; i++) {
        PDP_TRY(pdp_model_add_linear(m, hidden));
        PDP_TRY(pdp_model_add_relu(m));
    }
    PDP_TRY(pdp_model_add_linear(m, 10));
    PDP_TRY(pdp_model_reserve(m, per_rank > 1000 ? per_rank : 1000));
    if (rank == 0)
        printf("seed %llu: %s, backend %s, %d ranks, stage %d (%s), global batch %lld, MLP "
               "784-%lldx%d-10 (%lld parameters), Adam lr %g\n", seed, train->source, backend,
               n, stage, stage ? "ZeRO" : "DDP", (long long)batch, (long long)hidden, layers,
               (long long)pdp_model_param_count(m), lr);
    pdp_optim_desc od = {.kind = PDP_OPTIM_ADAM, .lr = lr};
    pdp_zero_desc zd = {.stage = stage, .bucket_cap_mb = cap_mb, .first_bucket_mb = cap_mb};
    if (stage == 0) { /* the one switch between the ladder's rungs */
        PDP_TRY(pdp_ddp_create(&ddp, m, ctx->world, NULL));
        PDP_TRY(pdp_optim_create(&opt, m, &od));
    } else {
        PDP_TRY(pdp_zero_create(&z, m, ctx->world, &zd));
        PDP_TRY(pdp_zero_optim_create(&opt, z, &od)); /* state for this rank's shard only */
    }
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
            if (ddp) {
                pdp_ddp_set_no_sync(ddp, !last);
                PDP_TRY(pdp_ddp_forward_backward(ddp, &x, y, &loss));
                if (last) PDP_TRY(pdp_ddp_step(ddp, opt));
            } else {
                pdp_zero_set_no_sync(z, !last);
                PDP_TRY(pdp_zero_forward_backward(z, &x, y, &loss));
                if (last) PDP_TRY(pdp_zero_step(z, opt)); /* wait, step the shard, all-gather */
            }
            loss_sum += loss;
            seen += got;
        }
        PDP_TRY(pdp_batcher_status(b));
        if (ddp) { /* the last step's bytes and formula; DDP's into zs: its ring all-reduce */
            pdp_ddp_get_stats(ddp, &ds);
            zs.bytes_sent = ds.bytes_sent;
            zs.formula_bytes = (int64_t)(2.0 * (n - 1) / n * (double)ds.grad_bytes);
            snprintf(zs.formula, sizeof zs.formula, "2 (N-1)/N x 4 Psi, N = %d", n);
        } else {
            pdp_zero_get_stats(z, &zs);
        }
        PDP_TRY(pdp_model_accuracy(m, tb, &acc)); /* every rank: stage 3's forward gathers */
        for (i = 0; i < n; i++) { /* in rank order, each rank's own figures */
            if (i == rank)
                printf("rank %d epoch %d  loss %.4f  test %.2f%%  %.0f samples/s  sent/step %.2f MB"
                       "  formula %.2f MB = %s\n", rank, e + 1, loss_sum * per_rank / (double)seen,
                       100.0 * acc, (double)seen * n / (pdp_seconds() - t0),
                       zs.bytes_sent / 1e6, zs.formula_bytes / 1e6, zs.formula);
            fflush(stdout);
            PDP_TRY(pdp_comm_barrier(ctx->world, NULL));
        }
    }
    if (rank == 0) { /* this rank's bytes (DDP: the plan of its replica) beside every stage's */
        PDP_TRY(z ? pdp_zero_get_memory(z, opt, &mm)
                  : pdp_zero_memory_plan(m, n, 0, &zd, opt, &mm));
        pdp_zero_memory_format(&mm, report, sizeof report);
        printf("(each rank's loss is the mean over its own shard of the batches, so the ranks' "
               "losses differ; their parameters, and test accuracies, do not)\n%s", report);
    }
    pdp_batcher_free(b);
    pdp_dist_sampler_free(sampler);
    pdp_batcher_free(tb);
    pdp_zero_free(z);
    pdp_ddp_free(ddp);
    pdp_optim_free(opt);
    pdp_model_free(m);
    return PDP_OK;
}

int main(int argc, char **argv)
{
    pdp_launch_desc ld = {0};
    int i, np = 2;
    bool short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "-stage")) stage = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-np")) np = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-hidden")) hidden = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-layers")) layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-epochs")) epochs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-lr")) lr = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-cap_mb")) cap_mb = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-accum")) accum = atoi(argv[i + 1]);
        else break;
    }
    if (i < argc || epochs < 1 || batch < np || stage < 0 || stage > 3 || accum < 1 ||
        hidden < 1 || hidden > 65536 || layers < 1 || layers > 64 || !(cap_mb > 0) ||
        pdp_backend_from_name(backend, &ld.backend) != PDP_OK) {
        fprintf(stderr, "usage: %s [-stage 0..3 (0: DDP; default 3)] [-backend local|mpi|nccl] "
                "[-np 2 (thread ranks)] [-hidden 512] [-layers 2] [-epochs 1] [-batch 256 "
                "(global)] [-lr 0.001] [-cap_mb 0.5] [-seed 1] [-accum 1]\n", argv[0]);
        return 2;
    }
    if (short_run) batch = 32;
    pdp_dataset_desc dd = {.flat = true, .mean = PDP_FASHION_MNIST_MEAN,
                           .std = PDP_FASHION_MNIST_STD, .max_samples = short_run ? 320 : 0,
                           .seed = seed, .synthetic_fallback = true};
    PDP_CHECK(pdp_dataset_load_fashion_mnist(&train, true, &dd));
    PDP_CHECK(pdp_dataset_load_fashion_mnist(&test, false, &dd));
    PDP_CHECK(pdp_launch(np, &ld, train_rank, NULL));
    pdp_dataset_free(train);
    pdp_dataset_free(test);
    return 0;
}
