/* train_tp.c - tensor parallelism: N ranks share each weight matrix of one MLP block.

   The model is 784-256 (Linear, ReLU), then Megatron-LM's MLP block on d = 256 with a
   hidden width of 1024 split over the ranks, then a Linear to the 10 classes:
       f                      identity forward, all-reduce of the input gradient backward
       ColumnParallelLinear   rank r holds rows of W1 [1024, 256]: its slice of the hidden
       ReLU                   on the slice
       RowParallelLinear      rank r holds the matching columns of W2 [256, 1024]: a
                              partial sum of the output
       g                      all-reduce of the partial sums forward, identity backward
   Every rank trains on the same batches (the input is replicated); each holds 1/N of
   the block's weights and does 1/N of its GEMMs. Rank 0 prints the bytes each rank
   all-reduced per step beside the formula, one all-reduce of B x d floats forward (g)
   and one backward (f), each sending 2(N-1)/N of its bytes with the ring algorithm.
   -save PATH writes the full (unsplit) tensors: the checkpoint of the single-device
   784-256-1024-256-10 MLP, which pdp_checkpoint_load and PyTorch's
   nn.Sequential(Linear(784,256), ReLU(), Linear(256,1024), ReLU(), Linear(1024,256),
   ReLU(), Linear(256,10)).load_state_dict read. Ranks are threads (-backend local),
   MPI processes (-backend mpi), or GPUs over NCCL (-backend nccl, a thread per GPU).

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_tp.c -o train_tp -lm -lpthread
           mpicc -std=c99 -O2 -march=native -DPDP_MPI -I. examples/train_tp.c -o train_tp_mpi -lm
           make cuda   (build/cuda/train_tp, with -DPDP_CUDA: -backend nccl)
   Run:    ./train_tp                        (2 thread-ranks; PDP_SHORT=1 for a few steps)
           ./train_tp -np 4 -epochs 2 -batch 128 -lr 0.05 -seed 1 -save tp.safetensors
           mpirun -np 2 ./train_tp_mpi -backend mpi
           ./build/cuda/train_tp -backend nccl -np 2
   Output (2 cores shared with other jobs, 2 ranks, seed 1; figures per step):
           seed 1: Fashion-MNIST, backend local, 2 TP ranks, batch 128, MLP 784-256-[f, ...
           rank 0 holds hidden features [0, 512) of 1024: 466442 of 729098 parameters
           step  100  loss 0.6344  all-reduced/rank: fwd 131072 B  bwd 131072 B  (formula
                      B x d x 4 = 131072 B each)  sent 262144 B (ring 2(N-1)/N x both = 262144 B)
           ...
           epoch 1  loss 0.5367  test 85.70% (first 1000)  10558 samples/s  all-reduce 59% ...
           The all-reduce share includes waiting for the other rank: g and f are
           synchronous, so any imbalance between the ranks shows up there.
   Next:   bench/tp.c (TP at 2 ranks against one device on a GEMM-bound MLP). */

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

#define D 256      /* the block's width */
#define HIDDEN 1024 /* its hidden width, split over the ranks */

static int np = 2, epochs = 1;
static int64_t batch = 128;
static double lr = 0.05;
static unsigned long long seed = 1;
static bool short_run;
static const char *save_path;
static pdp_dataset *train, *test;
static pdp_local_group *group;
static pdp_nccl_group *ngroup;

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* x itself on the CPU; on a GPU, x copied into the first rows of dev (a view in *view). */
static const pdp_tensor *on_device(const pdp_tensor *x, const pdp_tensor *dev, pdp_tensor *view)
{
    if (!dev) return x;
    CHECK(pdp_tensor_rows_view(dev, 0, x->shape[0], view));
    CHECK(pdp_tensor_copy(view, x));
    return view;
}

/* What every rank runs, on its own thread or process, on the same batches. */
static void train_rank(pdp_comm *c, pdp_device dev)
{
    int rank = pdp_comm_rank(c), n = pdp_comm_size(c), e;
    pdp_model_desc md = {0};
    pdp_optim_desc od = {0};
    pdp_batcher_desc bd = {0};
    pdp_model *m;
    pdp_optim *opt;
    pdp_batcher *b;
    pdp_tp_stats s;
    pdp_tensor *xdev = NULL;
    int64_t step = 0, lo, cols;
    double ring = 2.0 * (n - 1) / n;

    md.input_shape[0] = 784;
    md.device = dev;
    md.seed = seed; /* the same on every rank: each keeps its slice of the same draw */
    CHECK(pdp_model_create(&m, &md));
    CHECK(pdp_model_set_tp(m, c));
    CHECK(pdp_model_add_linear(m, D));
    CHECK(pdp_model_add_relu(m));
    CHECK(pdp_model_add_tp_copy(m));                       /* f */
    CHECK(pdp_model_add_column_parallel_linear(m, HIDDEN)); /* W1 split by rows */
    CHECK(pdp_model_add_relu(m));
    CHECK(pdp_model_add_row_parallel_linear(m, D));        /* W2 split by columns */
    CHECK(pdp_model_add_tp_reduce(m));                     /* g */
    CHECK(pdp_model_add_relu(m));
    CHECK(pdp_model_add_linear(m, 10));
    CHECK(pdp_model_reserve(m, batch > 1000 ? batch : 1000));
    pdp_tp_split(HIDDEN, rank, n, &lo, &cols);
    if (rank == 0)
        printf("rank 0 holds hidden features [%lld, %lld) of %d: %lld of %lld parameters\n",
               (long long)lo, (long long)(lo + cols), HIDDEN,
               (long long)pdp_model_param_count(m),
               (long long)(784 * D + D + 2LL * D * HIDDEN + HIDDEN + D + D * 10 + 10));
    od.kind = PDP_OPTIM_SGD;
    od.lr = lr;
    od.momentum = 0.9f;
    CHECK(pdp_optim_create(&opt, m, &od));
    if (dev.kind != PDP_DEVICE_CPU)
        CHECK(pdp_tensor_create(&xdev, dev, 2, (int64_t[]){batch > 1000 ? batch : 1000, 784}));
    bd.batch_size = batch;
    bd.shuffle = true;
    bd.seed = seed; /* every rank draws the same batches */
    bd.drop_last = true;
    CHECK(pdp_batcher_create(&b, train, &bd));
    for (e = 0; e < epochs; e++) {
        pdp_tensor x, xv, tx, tv;
        const pdp_tensor *logits;
        const int32_t *y;
        int64_t got, seen = 0, correct = 0, k = test->count < 1000 ? test->count : 1000;
        double loss_sum = 0.0, t0 = seconds(), dt;
        float loss;
        pdp_tp_reset_stats(m);
        while (pdp_batcher_next(b, &x, &y, &got)) {
            CHECK(pdp_model_forward_backward(m, on_device(&x, xdev, &xv), y, &loss));
            CHECK(pdp_optim_step(opt));
            pdp_optim_zero_grad(opt);
            loss_sum += loss * (double)got;
            seen += got;
            if (rank == 0 && (++step % (short_run ? 5 : 100) == 0)) {
                pdp_tp_get_stats(m, &s);
                printf("step %4lld  loss %.4f  all-reduced/rank: fwd %lld B  bwd %lld B  "
                       "(formula B x d x 4 = %lld B each)  sent %.0f B (ring 2(N-1)/N x both "
                       "= %.0f B)\n", (long long)step, (double)loss,
                       (long long)(s.forward_bytes / s.forward_allreduces),
                       (long long)(s.backward_bytes / s.backward_allreduces),
                       (long long)(got * D * 4), (double)s.bytes_sent / (double)s.forward_allreduces,
                       ring * 2.0 * (double)(got * D * 4));
            }
        }
        pdp_batcher_reset(b, (uint64_t)e + 1); /* the next epoch's order */
        dt = seconds() - t0;
        pdp_tp_get_stats(m, &s);
        /* evaluation is a forward too: every rank takes part in g */
        pdp_model_set_training(m, false);
        CHECK(pdp_dataset_view(test, 0, k, &tx));
        CHECK(pdp_model_forward(m, on_device(&tx, xdev, &tv), &logits));
        CHECK(pdp_count_correct(logits, test->labels, &correct));
        pdp_model_set_training(m, true);
        if (rank == 0)
            printf("epoch %d  loss %.4f  test %.2f%% (first %lld)  %.0f samples/s  all-reduce "
                   "%.0f%% of the time (%.3f s)\n", e + 1, loss_sum / (double)seen,
                   100.0 * correct / (double)k, (long long)k, (double)seen / dt,
                   100.0 * s.allreduce_s / dt, s.allreduce_s);
    }
    if (save_path) {
        CHECK(pdp_tp_checkpoint_save(save_path, m, opt)); /* collective: every rank */
        if (rank == 0) printf("saved %s: the full tensors, state_dict names\n", save_path);
    }
    pdp_batcher_free(b);
    pdp_tensor_free(xdev);
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
    short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "-np")) np = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-epochs")) epochs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-batch")) batch = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-lr")) lr = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-save")) save_path = argv[i + 1];
        else break;
    }
    if (i < argc || np < 1 || np > 64 || epochs < 1 || batch < 1 ||
        (strcmp(backend, "local") && strcmp(backend, "mpi") && strcmp(backend, "nccl"))) {
        fprintf(stderr, "usage: %s [-backend local|mpi|nccl] [-np 2 (threads; mpirun sets it "
                "for processes)] [-epochs 1] [-batch 128] [-lr 0.05] [-seed 1] [-save PATH]\n",
                argv[0]);
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
    dd.max_samples = short_run ? 320 : 0;
    if (short_run) batch = 32; /* 10 steps */
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
        printf("seed %llu: %s, backend %s, %d TP ranks, batch %lld, MLP 784-%d-[f, %d split "
               "%d ways, g]-%d-10, SGD lr %g momentum 0.9\n", seed, source, backend, np,
               (long long)batch, D, HIDDEN, np, D, (double)lr);

    if (c) { /* MPI processes: this process is one rank */
        train_rank(c, pdp_cpu());
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
