/* train_dp.c - DataParallel: the distributed examples' MLP, trained by threads of one process.

   Shows torch.nn.DataParallel's recipe in C: wrap the model with pdp_dp_create,
   then one pdp_dp_step per batch replicates the parameters, scatters the batch
   over -j workers (this thread and -j - 1 others), runs forward and backward on
   every replica at once, gathers outputs and loss, reduces the gradients into the
   master and steps the master's optimizer. The model and optimizer are those of
   train_ddp.c, train_zero.c, train_tp.c and train_pp.c (MLP 784-512-512-10, Adam lr
   0.001, here with a warm-up and cosine decay), so their figures compare; DP computes
   one device's gradients. After each epoch it prints pdp_dp_get_stats: time per stage,
   bytes through the master, and the master's memory against a replica's.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_dp.c -o train_dp -lm -lpthread
           nvcc -O2 -arch=sm_90 -DPDP_CUDA -I. examples/train_dp.c pdp_cuda.cu -o train_dp_cuda \
               -lcublas -lnccl       (or make cuda: build/cuda/train_dp; -gpus N)
   Run:    ./train_dp               (2 workers; PDP_SHORT=1 for a few steps only)
           ./train_dp -j 4 -epochs 5 -batch 128 -lr 0.001 -seed 1
           ./build/cuda/train_dp -gpus 2 -j 2   (DP on GPUs: the master on GPU 0, worker i
                        on GPU i mod 2; parameters replicated by peer copies, the batch
                        scattered from the host, outputs and gradients gathered on GPU 0)
   Output (-j 2 -epochs 1, seed 1, 2 cores shared with other jobs; the master alone holds
   the parameters the replicas read, Adam's state and the gathered outputs, hence its memory):
           seed 1: Fashion-MNIST, 60000 train / 10000 test, MLP 784-512-512-10, Adam lr 0.001, ...
           epoch 1  loss 0.5264  train 81.73%  test 86.47%  5127 samples/s  11.7 s
           dp: 2 workers (2 active), last batch 96, step 469, params shared (read in place)
             last step ms: replicate 0.000  scatter 0.000  apply 18.938 (workers ...) ...
             traffic: master -> replicas 2.83 MB (params 2.68, inputs 0.15), replicas -> ...
             memory: master 11.65 MB, largest other replica 3.61 MB (master / replica 3.23x)
   Next:   train_ddp.c (the same model with DistributedDataParallel: a process per rank). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int epochs = 5, workers = 2, gpus = 0, i;
    int64_t batch = 128, step = 0, total_steps, seed = 1;
    double lr = 1e-3, t0, acc;
    bool short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    pdp_dataset *train, *test;
    pdp_model *m;
    pdp_optim *opt;
    pdp_batcher *batcher, *tb;
    pdp_dp *dp;
    pdp_device devices[64];
    char report[1024];
    const pdp_arg args[] = { /* option, type, variable (its default), min, max, choices */
        {"-j", PDP_ARG_INT, &workers, 0, 64, NULL}, /* 0: one per core */
        {"-gpus", PDP_ARG_INT, &gpus, 0, 64, NULL}, /* workers on GPUs 0..gpus-1 */
        {"-epochs", PDP_ARG_INT, &epochs, 1, 1000, NULL},
        {"-batch", PDP_ARG_INT64, &batch, 1, 1 << 20, NULL},
        {"-lr", PDP_ARG_DOUBLE, &lr, 1e-9, 10, NULL},
        {"-seed", PDP_ARG_INT64, &seed, 0, 1e18, NULL},
    };

    if (short_run) epochs = 1; /* -epochs overrides */
    pdp_args_parse_or_exit(argc, argv, args, sizeof args / sizeof args[0]); /* -h: usage */
    if (gpus > 0 && workers < 1)
        return fprintf(stderr, "-gpus %d needs -j 1 or more (a worker per GPU)\n", gpus), 2;

    /* data as in train_mnist.c; the short mode uses the synthetic task */
    pdp_dataset_desc dd = {.flat = true, .mean = PDP_FASHION_MNIST_MEAN,
                           .std = PDP_FASHION_MNIST_STD, .max_samples = short_run ? 512 : 0,
                           .seed = (uint64_t)seed, .synthetic_fallback = true};
    pdp_status (*load)(pdp_dataset **, bool, const pdp_dataset_desc *) =
        short_run ? pdp_dataset_synthetic : pdp_dataset_load_fashion_mnist;
    PDP_CHECK(load(&train, true, &dd));
    PDP_CHECK(load(&test, false, &dd));

    /* the master model and its optimizer (the distributed examples' MLP); DP clones the
       replicas from it */
    pdp_model_desc md = {.input_shape = {784}, .seed = (uint64_t)seed,
                         .device = gpus ? pdp_cuda(0) : pdp_cpu()};
    PDP_CHECK(pdp_model_create(&m, &md));
    PDP_CHECK(pdp_model_add_linear(m, 512));
    PDP_CHECK(pdp_model_add_relu(m));
    PDP_CHECK(pdp_model_add_linear(m, 512));
    PDP_CHECK(pdp_model_add_relu(m));
    PDP_CHECK(pdp_model_add_linear(m, 10));
    PDP_CHECK(pdp_optim_create(&opt, m, &(pdp_optim_desc){.kind = PDP_OPTIM_ADAM, .lr = lr}));
    pdp_dp_desc dpd = {.num_workers = workers};
    if (gpus) { /* worker i on GPU i mod gpus; the batches stay on the host until scattered */
        for (i = 0; i < workers; i++) devices[i] = pdp_cuda(i % gpus);
        dpd.devices = devices;
    }
    PDP_CHECK(pdp_dp_create(&dp, m, &dpd));

    pdp_batcher_desc bd = {.batch_size = batch, .shuffle = true, .seed = (uint64_t)seed};
    PDP_CHECK(pdp_batcher_create(&batcher, train, &bd));
    /* the test set on the master in batches of its share of a training batch: evaluating
       reserves no activations beyond training's, so the memory line below is training's */
    int workers_used = pdp_dp_num_workers(dp);
    pdp_batcher_desc tbd = {.batch_size = (batch + workers_used - 1) / workers_used,
                            .device = md.device};
    PDP_CHECK(pdp_batcher_create(&tb, test, &tbd));
    total_steps = epochs * pdp_batcher_num_batches(batcher);
    printf("seed %lld: %s, %lld train / %lld test, MLP 784-512-512-10, Adam lr %g, batch %lld, "
           "DP over %d workers", (long long)seed, train->source, (long long)train->count,
           (long long)test->count, lr, (long long)batch, pdp_dp_num_workers(dp));
    if (gpus) printf(" on %d GPU%s", gpus, gpus > 1 ? "s" : "");
    printf("\n");

    t0 = pdp_seconds();
    for (i = 0; i < epochs; i++) {
        double loss_sum = 0, t_epoch = pdp_seconds();
        int64_t seen = 0, correct = 0, n, c;
        pdp_tensor x;
        const int32_t *y;
        pdp_dp_stats stats;
        float loss;
        pdp_batcher_reset(batcher, (uint64_t)i);
        while (pdp_batcher_next(batcher, &x, &y, &n)) {
            pdp_optim_set_lr(opt, pdp_lr_warmup_cosine(step++, total_steps < 2000 ? total_steps
                                                       / 20 : 100, total_steps, lr, lr / 20));
            /* replicate, scatter, parallel apply, gather, reduce, step */
            PDP_CHECK(pdp_dp_step(dp, opt, &x, y, &loss));
            PDP_CHECK(pdp_count_correct(pdp_dp_output(dp), y, &c)); /* the gathered outputs */
            loss_sum += (double)loss * (double)n;
            correct += c;
            seen += n;
        }
        PDP_CHECK(pdp_batcher_status(batcher));
        t_epoch = pdp_seconds() - t_epoch;
        PDP_CHECK(pdp_model_accuracy(m, tb, &acc)); /* the master holds the trained model */
        printf("epoch %d  loss %.4f  train %.2f%%  test %.2f%%  %.0f samples/s  %.1f s\n", i + 1,
               loss_sum / (double)seen, 100.0 * (double)correct / (double)seen, 100.0 * acc,
               (double)seen / t_epoch, pdp_seconds() - t0);
        PDP_CHECK(pdp_dp_get_stats(dp, &stats));
        pdp_dp_stats_format(&stats, report, sizeof report);
        printf("%s", report);
        fflush(stdout);
    }

    pdp_dp_free(dp);
    pdp_batcher_free(tb);
    pdp_batcher_free(batcher);
    pdp_optim_free(opt);
    pdp_model_free(m);
    pdp_dataset_free(train);
    pdp_dataset_free(test);
    pdp_shutdown_threads();
    return 0;
}
