/* train_cnn.c - train a small convolutional net on Fashion-MNIST, on one device.

   Shows image-shaped data ([batch, 1, 28, 28]) through Conv2d, MaxPool2d and Flatten
   layers; otherwise the same loop as train_mnist.c: forward, cross-entropy, backward,
   Adam step, evaluation after each epoch. Without the dataset installed it trains on
   pdp's built-in synthetic task instead and says how to get the data.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_cnn.c -o train_cnn -lm -lpthread
           nvcc -O2 -arch=sm_90 -DPDP_CUDA -I. examples/train_cnn.c pdp_cuda.cu -lcublas -lnccl
           make cuda   (build/cuda/train_cnn: cc -DPDP_CUDA, then nvcc links pdp_cuda.o)
   Run:    ./train_cnn              (PDP_SHORT=1 for a few steps only)
           ./train_cnn -epochs 5 -batch 64 -lr 0.001 -threads 2 -seed 1
           ./build/cuda/train_cnn -device cuda      (on GPU 0, as train_mnist.c)
   Output (2 cores, Fashion-MNIST installed; 90.7% test accuracy after 5 epochs, about 3 min
   on an idle machine):
           seed 1: Fashion-MNIST, 60000 train / 10000 test, CNN conv16-pool-conv32-pool-fc10, ...
           epoch 1  loss 0.5088  train 82.20%  test 86.74%  631 samples/s  107.1 s
           ...
           epoch 5  loss 0.2086  train 92.47%  test 90.67%  2077 samples/s  361.8 s
   Next:   examples/train_dp.c (training spread over threads with DataParallel). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int epochs = 5, threads = 2, cuda = 0, i; /* -device: an index */
    int64_t batch = 64, step = 0, total_steps, warmup, seed = 1;
    double lr = 1e-3, t0, acc;
    bool short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT")), tty = isatty(1);
    pdp_dataset *train, *test;
    pdp_model *m;
    pdp_optim *opt;
    pdp_batcher *batcher, *tb;
    pdp_tensor *dlogits;
    const pdp_arg args[] = { /* option, type, variable (its default), min, max, choices */
        {"-epochs", PDP_ARG_INT, &epochs, 1, 1000, NULL},
        {"-batch", PDP_ARG_INT64, &batch, 1, 1 << 20, NULL},
        {"-lr", PDP_ARG_DOUBLE, &lr, 1e-9, 10, NULL},
        {"-threads", PDP_ARG_INT, &threads, 1, 256, NULL},
        {"-seed", PDP_ARG_INT64, &seed, 0, 1e18, NULL},
        {"-device", PDP_ARG_CHOICE, &cuda, 0, 0, "cpu|cuda"}, /* cuda: GPU 0 */
    };

    if (short_run) epochs = 1; /* -epochs overrides */
    pdp_args_parse_or_exit(argc, argv, args, sizeof args / sizeof args[0]); /* -h: usage */
    pdp_device dev = cuda ? pdp_cuda(0) : pdp_cpu();
    PDP_CHECK(pdp_set_num_threads(threads));
    if (short_run) epochs = 1;

    /* data: pixels normalised with the training set's mean and std, samples (1, 28, 28);
       without the files, the synthetic task (train->source says so, and why) */
    pdp_dataset_desc dd = {.mean = PDP_FASHION_MNIST_MEAN,
                           .std = PDP_FASHION_MNIST_STD, .max_samples = short_run ? 256 : 0,
                           .seed = (uint64_t)seed, .synthetic_fallback = true};
    PDP_CHECK(pdp_dataset_load_fashion_mnist(&train, true, &dd));
    PDP_CHECK(pdp_dataset_load_fashion_mnist(&test, false, &dd));

    /* model and optimizer */
    pdp_model_desc md = {.input_shape = {1, 28, 28}, .seed = (uint64_t)seed, .device = dev};
    PDP_CHECK(pdp_model_create(&m, &md));
    PDP_CHECK(pdp_model_add_conv2d(m, 16, 5, 1, 2)); /* 16 x 28 x 28 */
    PDP_CHECK(pdp_model_add_relu(m));
    PDP_CHECK(pdp_model_add_maxpool2d(m, 2, 2));     /* 16 x 14 x 14 */
    PDP_CHECK(pdp_model_add_conv2d(m, 32, 5, 1, 2)); /* 32 x 14 x 14 */
    PDP_CHECK(pdp_model_add_relu(m));
    PDP_CHECK(pdp_model_add_maxpool2d(m, 2, 2));     /* 32 x 7 x 7 */
    PDP_CHECK(pdp_model_add_flatten(m));             /* 1568 */
    PDP_CHECK(pdp_model_add_linear(m, 10));
    PDP_CHECK(pdp_model_reserve(m, batch > 1000 ? batch : 1000)); /* nothing allocated from here */
    PDP_CHECK(pdp_optim_create(&opt, m, &(pdp_optim_desc){.kind = PDP_OPTIM_ADAM, .lr = lr}));
    PDP_CHECK(pdp_tensor_create(&dlogits, dev, 2, (int64_t[]){batch, 10}));

    pdp_batcher_desc bd = {.batch_size = batch, .shuffle = true, .seed = (uint64_t)seed,
                           .device = dev};
    PDP_CHECK(pdp_batcher_create(&batcher, train, &bd)); /* batches on the model's device */
    pdp_batcher_desc tbd = {.batch_size = 1000, .device = dev}; /* the test set, in order */
    PDP_CHECK(pdp_batcher_create(&tb, test, &tbd));
    total_steps = epochs * pdp_batcher_num_batches(batcher);
    warmup = total_steps / 20 < 100 ? total_steps / 20 : 100;
    printf("seed %lld: %s, %lld train / %lld test, CNN conv16-pool-conv32-pool-fc10, Adam lr %g, "
           "batch %lld, ", (long long)seed, train->source, (long long)train->count,
           (long long)test->count, lr, (long long)batch);
    if (dev.kind == PDP_DEVICE_CPU) printf("%d threads\n", threads);
    else printf("CUDA device 0\n");

    t0 = pdp_seconds();
    for (i = 0; i < epochs; i++) {
        double loss_sum = 0, t_epoch = pdp_seconds();
        int64_t seen = 0, correct = 0, n, c, b = 0, nb = pdp_batcher_num_batches(batcher);
        pdp_tensor x, dl;
        const int32_t *y;
        const pdp_tensor *logits;
        float loss;
        pdp_batcher_reset(batcher, (uint64_t)i);
        while (pdp_batcher_next(batcher, &x, &y, &n)) {
            /* cosine decay over the run, after a short warm-up */
            pdp_optim_set_lr(opt, pdp_lr_warmup_cosine(step++, warmup, total_steps, lr, lr / 20));
            PDP_CHECK(pdp_model_forward(m, &x, &logits));
            PDP_CHECK(pdp_tensor_rows_view(dlogits, 0, n, &dl));
            PDP_CHECK(pdp_loss_cross_entropy(logits, y, &loss, &dl));
            PDP_CHECK(pdp_count_correct(logits, y, &c));
            PDP_CHECK(pdp_model_backward(m, &dl));
            PDP_CHECK(pdp_optim_step(opt));
            pdp_optim_zero_grad(opt);
            loss_sum += (double)loss * (double)n;
            correct += c;
            seen += n;
            if (tty && (++b % 20 == 0 || b == nb)) { /* progress bar, terminals only */
                printf("\r  [%-30.*s] %lld/%lld", (int)(30 * b / nb),
                       "==============================", (long long)b, (long long)nb);
                fflush(stdout);
            }
        }
        PDP_CHECK(pdp_batcher_status(batcher));
        if (tty) printf("\r%60s\r", "");
        t_epoch = pdp_seconds() - t_epoch; /* training only; the evaluation is not counted */
        PDP_CHECK(pdp_model_accuracy(m, tb, &acc)); /* the test set, in evaluation mode */
        printf("epoch %d  loss %.4f  train %.2f%%  test %.2f%%  %.0f samples/s  %.1f s\n", i + 1,
               loss_sum / (double)seen, 100.0 * (double)correct / (double)seen, 100.0 * acc,
               (double)seen / t_epoch, pdp_seconds() - t0);
        fflush(stdout);
    }

    pdp_batcher_free(batcher);
    pdp_batcher_free(tb);
    pdp_tensor_free(dlogits);
    pdp_optim_free(opt);
    pdp_model_free(m);
    pdp_dataset_free(train);
    pdp_dataset_free(test);
    return 0;
}
