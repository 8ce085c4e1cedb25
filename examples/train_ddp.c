/* train_ddp.c - DistributedDataParallel: N ranks train one MLP on Fashion-MNIST.

   Every rank holds a full replica of a 784-512-512-10 MLP and trains on its own
   shard of each global batch (a DistributedSampler splits the data); during
   backward the gradients are averaged across ranks in buckets, each bucket's
   all-reduce running while backward goes on with earlier layers. Rank 0 prints
   the bytes each rank sent per step beside the ring all-reduce figure
   2(N-1)/N x gradient bytes, and the share of all-reduce time hidden under
   backward. Ranks are threads of this process (-backend local), MPI processes
   (-backend mpi), or GPUs over NCCL (-backend nccl: one thread per GPU in this
   process, or one process per GPU under torchrun / mpirun, which set WORLD_SIZE).
   -compress bf16|fp16 registers the built-in compression hook (PyTorch's
   bf16_compress_hook): gradients travel as 16-bit values, half the bytes.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_ddp.c -o train_ddp -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_ddp.c -o train_ddp_mpi -lm
           make cuda   (build/cuda/train_ddp, with -DPDP_CUDA: -backend nccl)
   Run:    ./train_ddp                       (2 thread-ranks; PDP_SHORT=1 for a few steps)
           ./train_ddp -np 2 -epochs 2 -batch 256 -lr 0.05 -seed 1
           ./train_ddp -compress bf16                (gradients on the wire as bf16)
           mpirun -np 2 ./train_ddp_mpi -backend mpi
           ./build/cuda/train_ddp -backend nccl -np 2           (2 GPUs, one thread each)
           torchrun --nproc-per-node 2 --no-python ./build/cuda/train_ddp -backend nccl
           PDP_TRACE=ddp.json ./train_ddp    then open ddp.json in ui.perfetto.dev
   Output (2 cores, 2 ranks, seed 1; mpirun -np 2 with -backend mpi prints the same losses):
           seed 1: Fashion-MNIST, backend local, 2 ranks, global batch 256 (128 per rank), ...
           step  100  loss 0.3656  sent/rank 2.68 MB  ring 2(N-1)/N x grads 2.68 MB  hidden 13%
           step  200  loss 0.3463  sent/rank 2.68 MB  ring 2(N-1)/N x grads 2.68 MB  hidden 0%
           epoch 1  loss 0.5462  test 86.50% (first 1000)  15500 samples/s  all-reduce hidden ...
           "hidden" stays low for this MLP: its second bucket (layer 0, 60% of the bytes) is
           ready only when backward ends, as with PyTorch's default buckets.
           -epochs 3, test accuracy (first 1000): fp32 89.00%, -compress bf16 89.30% (sent/rank
           1.34 MB per step instead of 2.68), -compress fp16 89.40%.
   Next:   bench/ddp.c (DDP's scaling measured against one rank). */

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

static int np = 2, epochs = 1;
static int64_t batch = 256; /* global */
static double lr = 0.05;
static unsigned long long seed = 1;
static bool short_run;
static const char *compress = "none"; /* none, bf16 or fp16: the gradients on the wire */
static pdp_dataset *train, *test;
static pdp_local_group *group;
static pdp_nccl_group *ngroup;

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* x itself for a replica on the CPU; for one on a GPU, x copied into the first rows of
   the device buffer dev (a view of them in *view). */
static const pdp_tensor *on_device(const pdp_tensor *x, const pdp_tensor *dev, pdp_tensor *view)
{
    if (!dev) return x;
    CHECK(pdp_tensor_rows_view(dev, 0, x->shape[0], view));
    CHECK(pdp_tensor_copy(view, x));
    return view;
}

/* What every rank runs, on its own thread or process; dev is where its replica lives
   (the CPU, or the rank's GPU under NCCL, where each batch is copied to xdev first). */
static void train_rank(pdp_comm *c, pdp_device dev)
{
    int rank = pdp_comm_rank(c), n = pdp_comm_size(c), e;
    pdp_model_desc md = {0};
    pdp_optim_desc od = {0};
    pdp_dist_sampler_desc sd = {0};
    pdp_model *m;
    pdp_optim *opt;
    pdp_ddp *ddp;
    pdp_dist_sampler *sampler;
    pdp_ddp_stats s;
    pdp_tensor *xdev = NULL;
    int64_t step = 0, per_rank = batch / n;

    md.input_shape[0] = 784;
    md.device = dev;
    md.seed = seed + (unsigned long long)rank; /* differs on purpose: DDP broadcasts rank 0's */
    CHECK(pdp_model_create(&m, &md));
    CHECK(pdp_model_add_linear(m, 512));
    CHECK(pdp_model_add_relu(m));
    CHECK(pdp_model_add_linear(m, 512));
    CHECK(pdp_model_add_relu(m));
    CHECK(pdp_model_add_linear(m, 10));
    CHECK(pdp_model_reserve(m, per_rank > 1000 ? per_rank : 1000));
    od.kind = PDP_OPTIM_SGD;
    od.lr = lr;
    od.momentum = 0.9f;
    CHECK(pdp_optim_create(&opt, m, &od));
    CHECK(pdp_ddp_create(&ddp, m, c, NULL)); /* 25 MB buckets, the first 1 MB, as PyTorch */
    if (strcmp(compress, "none")) { /* before the first backward */
        pdp_ddp_comm_hook h = !strcmp(compress, "bf16") ? pdp_ddp_hook_bf16_compress()
                                                        : pdp_ddp_hook_fp16_compress();
        CHECK(pdp_ddp_register_comm_hook(ddp, &h));
    }
    if (dev.kind != PDP_DEVICE_CPU) /* a batch, or the evaluation's 1000 samples */
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
        pdp_tensor x, xv;
        const int32_t *y;
        int64_t got, seen = 0, correct = 0;
        double loss_sum = 0.0, t0 = seconds();
        float loss;
        pdp_dist_sampler_set_epoch(sampler, (uint64_t)e); /* a new shuffle, the same on all */
        bd.batch_size = per_rank;
        bd.drop_last = true; /* every rank runs the same number of steps */
        bd.indices = pdp_dist_sampler_indices(sampler, &bd.num_indices);
        CHECK(pdp_batcher_create(&b, train, &bd));
        while (pdp_batcher_next(b, &x, &y, &got)) {
            /* forward, loss, backward; each bucket's all-reduce starts as it fills */
            CHECK(pdp_ddp_forward_backward(ddp, on_device(&x, xdev, &xv), y, &loss));
            CHECK(pdp_ddp_step(ddp, opt));                      /* waits, averages, updates */
            loss_sum += loss;
            seen += got;
            pdp_ddp_get_stats(ddp, &s); /* the last step's figures */
            if (rank == 0 && (++step % (short_run ? 5 : 100) == 0))
                printf("step %4lld  loss %.4f  sent/rank %.2f MB  ring 2(N-1)/N x grads %.2f MB"
                       "  hidden %.0f%%\n", (long long)step, (double)loss, s.bytes_sent / 1e6,
                       2.0 * (n - 1) / n * (double)s.grad_bytes / 1e6 *
                           (strcmp(compress, "none") ? 0.5 : 1.0), /* 16-bit: half */
                       100.0 * s.hidden_share);
        }
        pdp_batcher_free(b);
        pdp_ddp_get_stats(ddp, &s);
        if (rank == 0) { /* every rank holds the same parameters: rank 0 evaluates */
            pdp_tensor tx, tv;
            const pdp_tensor *logits;
            int64_t k = test->count < 1000 ? test->count : 1000;
            double dt = seconds() - t0, hidden = 1.0 - s.total_wait_s / s.total_allreduce_s;
            pdp_model_set_training(m, false);
            CHECK(pdp_dataset_view(test, 0, k, &tx));
            CHECK(pdp_model_forward(m, on_device(&tx, xdev, &tv), &logits));
            CHECK(pdp_count_correct(logits, test->labels, &correct));
            pdp_model_set_training(m, true);
            printf("epoch %d  loss %.4f  test %.2f%% (first %lld)  %.0f samples/s  all-reduce "
                   "hidden under backward: %.0f%% of %.3f s\n", e + 1,
                   loss_sum * per_rank / (double)seen, 100.0 * correct / (double)k, (long long)k,
                   (double)seen * n / dt, 100.0 * (hidden > 0 ? hidden : 0), s.total_allreduce_s);
        }
    }
    pdp_dist_sampler_free(sampler);
    pdp_tensor_free(xdev);
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
        else if (!strcmp(argv[i], "-np")) np = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-epochs")) epochs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-lr")) lr = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-compress")) compress = argv[i + 1];
        else break;
    }
    if (i < argc || np < 1 || np > 64 || epochs < 1 || batch < np ||
        (strcmp(backend, "local") && strcmp(backend, "mpi") && strcmp(backend, "nccl")) ||
        (strcmp(compress, "none") && strcmp(compress, "bf16") && strcmp(compress, "fp16"))) {
        fprintf(stderr, "usage: %s [-backend local|mpi|nccl] [-np 2 (threads; mpirun or "
                "torchrun set it for processes)] "
                "[-epochs 1] [-batch 256 (global)] [-lr 0.05] [-seed 1] "
                "[-compress none|bf16|fp16]\n", argv[0]);
        return 2;
    }
    if (!strcmp(backend, "mpi")) { /* the rank and size come from mpirun */
        pdp_comm_desc cd = {0};
        cd.backend = PDP_BACKEND_MPI;
        CHECK(pdp_comm_init_env(&c, &cd));
        rank = pdp_comm_rank(c);
        np = pdp_comm_size(c);
    } else if (!strcmp(backend, "nccl") && getenv("WORLD_SIZE")) { /* one process per GPU */
        pdp_comm_desc cd = {0};
        cd.backend = PDP_BACKEND_NCCL; /* the GPU is LOCAL_RANK's */
        CHECK(pdp_comm_init_env(&c, &cd));
        rank = pdp_comm_rank(c);
        np = pdp_comm_size(c);
        dev = pdp_cuda(getenv("LOCAL_RANK") ? atoi(getenv("LOCAL_RANK")) : 0);
    }
    dd.flat = true;
    dd.mean = PDP_FASHION_MNIST_MEAN;
    dd.std = PDP_FASHION_MNIST_STD;
    dd.max_samples = short_run ? 320 : 0;
    if (short_run) batch = 32; /* 10 steps: quick even under the sanitizers */
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
        printf("seed %llu: %s, backend %s, %d ranks, global batch %lld (%lld per rank), MLP "
               "784-512-512-10, SGD lr %g momentum 0.9, gradients %s\n", seed, source, backend,
               np, (long long)batch, (long long)(batch / np), (double)lr,
               strcmp(compress, "none") ? compress : "fp32");

    if (c) { /* MPI or NCCL processes: this process is one rank */
        train_rank(c, dev);
        pdp_comm_free(c);
    } else { /* np threads share the datasets: CPU ranks, or one per GPU over NCCL */
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
