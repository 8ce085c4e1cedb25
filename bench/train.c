/* bench/train.c: samples/s of a full training step, pdp beside PyTorch, same machine, same run.

   The step: forward, softmax cross-entropy (mean over the batch), backward, SGD step (lr 0.01),
   gradients zeroed. Models: an MLP 784-512-512-10 (ReLU) at batch 128 and 512, and the CNN of
   examples/train_cnn.c (conv 1->16 k5 p2, ReLU, pool 2, conv 16->32 k5 p2, ReLU, pool 2,
   flatten, linear 10) at batch 128; each with 1 and 2 threads (pdp_set_num_threads for ours,
   torch.set_num_threads for PyTorch, in its own process). Inputs are uniform random, labels
   random. bf16 rows (the MLP at batch 128 and 512, the CNN; 512 and the CNN at 1 and 2
   threads): pdp with pdp_model_set_precision(PDP_PRECISION_BF16) beside PyTorch's forward
   and loss under torch.autocast("cpu", dtype=torch.bfloat16) (its Linear and Conv2d run
   oneDNN's bf16 kernels where the CPU has AVX512-BF16 or AMX), the same step. The first
   table: samples/s, pdp / PyTorch, and pdp's bf16 step / its fp32 step, with the issue's
   targets; the heading names the CPU (bench.h's bench_cpu_name).

   Where the time goes (the second table): one more run of each configuration of ours, as
   long as a repetition, under pdp_profile (base.h): the step's share in layers with weights
   (their GEMMs, bias, im2col, bf16 packing), in the other layers (ReLU, pooling), in the
   loss and in the optimizer, the rest (the bench's own loop), and the workers' idle
   thread-seconds as a share of all thread-seconds; the step's GFLOP/s (the products a step
   must do: forward, and backward's dW and dX but the first layer's dX) as a fraction of the
   peak (bench.h's bench_peak_gflops: the fp32 FMA peak, or for bf16 the peak of the path
   pdp_gemm_bf16 takes - AMX tdpbf16ps, vdpbf16ps, the fp32 FMA - times the threads; the best of its measurements at the start and
   after each round), for the whole step and for its layers with weights alone. The
   averages over the rounds.

   What the bf16 GEMM must deliver (the third table, bf16 rows): the step split into its
   GEMMs and the rest, and the products' GFLOP/s at which the step would meet the issue's
   target against PyTorch and would equal pdp's fp32 step, the rest unchanged. The split
   is a share measured per round back to back with the step: the MLP's products timed
   alone (mlp_products_s: its eight pdp_gemm_bf16 calls) over the step; the CNN's w-layer
   share of its profiled run (an upper bound of its GEMMs: im2col, packing and the fused
   ReLU and pooling are in it).

   Per layer (the fourth table, one thread): each layer's forward + backward milliseconds
   per step in the profiled runs, fp32 beside bf16: which layers bf16 makes slower.

   Measurement: ROUNDS rounds; in each, every configuration is measured for ours and then for
   PyTorch (bench/train_torch.py under /usr/bin/python3, Debian's python3-torch, through
   popen), so the two sides of a ratio always run back to back and the drift of a shared box's
   load is spread over all configurations. One measurement is the median of 5 timed
   repetitions of about 0.2 s after a warm-up; the table shows, per side, the median over the
   rounds. The load average (/proc/loadavg) is printed at the start and at the end, with a
   warning when it is above half a core per core: the figures are not worth much then. When
   /usr/bin/python3 cannot import torch the table has our figures only and says so.

   make bench                 (or: make build/bench_train && ./build/bench_train [quick])
   quick: 1 round of 3 repetitions of about 0.1 s, for a smoke run. */

#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"

#include "bench.h"

#define NCONF 11
#define MAX_LAYERS 8
#define ROUNDS 5

typedef struct config {
    const char *model; /* "mlp" or "cnn", as train_torch.py names them */
    int64_t batch;
    int threads;
    bool bf16;
    double ours[ROUNDS], torch[ROUNDS]; /* samples/s per round; 0 = not measured */
    pdp_profile prof;                   /* summed over the rounds' profiled runs */
    int64_t prof_steps;
    double gemm_share[ROUNDS]; /* per round, the GEMMs' share of the step (the third table) */
    double layer_s[MAX_LAYERS];  /* the profiled runs' seconds per layer (the fourth table) */
    const char *layer_kind[MAX_LAYERS];
    int nlayers;
} config;


static void check(pdp_status st, const char *what)
{
    if (st == PDP_OK) return;
    fprintf(stderr, "bench_train: %s: %s: %s\n", what, pdp_status_name(st), pdp_last_error());
    exit(1);
}

static pdp_model *build(const char *name)
{
    pdp_model_desc md = {0};
    pdp_model *m;
    md.seed = 1;
    if (!strcmp(name, "mlp")) {
        md.input_shape[0] = 784;
        check(pdp_model_create(&m, &md), "model");
        check(pdp_model_add_linear(m, 512), "linear");
        check(pdp_model_add_relu(m), "relu");
        check(pdp_model_add_linear(m, 512), "linear");
        check(pdp_model_add_relu(m), "relu");
        check(pdp_model_add_linear(m, 10), "linear");
        return m;
    }
    md.input_shape[0] = 1;
    md.input_shape[1] = 28;
    md.input_shape[2] = 28;
    check(pdp_model_create(&m, &md), "model");
    check(pdp_model_add_conv2d(m, 16, 5, 1, 2), "conv2d");
    check(pdp_model_add_relu(m), "relu");
    check(pdp_model_add_maxpool2d(m, 2, 2), "maxpool2d");
    check(pdp_model_add_conv2d(m, 32, 5, 1, 2), "conv2d");
    check(pdp_model_add_relu(m), "relu");
    check(pdp_model_add_maxpool2d(m, 2, 2), "maxpool2d");
    check(pdp_model_add_flatten(m), "flatten");
    check(pdp_model_add_linear(m, 10), "linear");
    return m;
}

static void step(pdp_model *m, pdp_optim *o, const pdp_tensor *x, const int32_t *y)
{
    float loss;
    check(pdp_model_forward_backward(m, x, y, &loss), "forward_backward");
    check(pdp_optim_step(o), "optim_step");
    pdp_optim_zero_grad(o);
}

/* The products of one step: forward 2 B x (multiply-adds per sample) per layer with weights,
   backward twice that (dW and dX) but the first layer's dX (nothing asks for it). */
static double step_flops(const config *c)
{
    double b = (double)c->batch, mlp[3] = {784.0 * 512, 512.0 * 512, 512.0 * 10};
    double cnn[3] = {28.0 * 28 * 16 * 1 * 25, 14.0 * 14 * 32 * 16 * 25, 32.0 * 7 * 7 * 10};
    const double *macs = strcmp(c->model, "mlp") ? cnn : mlp;
    return 2.0 * b * (3.0 * (macs[0] + macs[1] + macs[2]) - macs[0]);
}

/* The MLP step's products alone, as its Linear layers call them (forward x W^T onto the
   bias, dW += dY^T X, dX = dY W but the first layer's), on the bench's thread count and
   precision: seconds per step, the median of 5 repetitions of about 0.1 s. The step's
   time minus this is what a faster GEMM cannot remove. */
static double mlp_products_s(const config *c)
{
    static const int64_t dims[4] = {784, 512, 512, 10};
    int64_t B = c->batch, n = B * 784 > 512 * 784 ? B * 784 : 512 * 784, j, iters = 1, i;
    float *x = (float *)malloc((size_t)n * sizeof(float)), *w = (float *)malloc((size_t)n * sizeof(float));
    float *y = (float *)malloc((size_t)n * sizeof(float)), *dw = (float *)malloc((size_t)n * sizeof(float));
    void (*gemm)(pdp_trans, pdp_trans, int64_t, int64_t, int64_t, float, const float *, int64_t,
                 const float *, int64_t, float, float *, int64_t) = c->bf16 ? pdp_gemm_bf16 : pdp_sgemm;
    double t, r[5];
    int k, l;
    if (!x || !w || !y || !dw) {
        fprintf(stderr, "bench_train: out of memory\n");
        exit(1);
    }
    for (j = 0; j < n; j++) {
        x[j] = (float)((j * 7 + 3) % 13) * 0.1f - 0.6f;
        w[j] = (float)((j * 5 + 1) % 11) * 0.01f - 0.05f;
        y[j] = dw[j] = 0.0f;
    }
    for (k = -1; k < 5; k++) { /* k = -1: warm-up and the iteration count */
        t = bench_now();
        for (i = 0; i < iters; i++)
            for (l = 0; l < 3; l++) {
                int64_t in = dims[l], out = dims[l + 1];
                gemm(PDP_NO_TRANS, PDP_TRANS, B, out, in, 1.0f, x, in, w, in, 1.0f, y, out);
                gemm(PDP_TRANS, PDP_NO_TRANS, out, in, B, 1.0f, y, out, x, in, 1.0f, dw, in);
                if (l > 0) gemm(PDP_NO_TRANS, PDP_NO_TRANS, B, in, out, 1.0f, y, out, w, in, 0.0f,
                                x, in);
            }
        t = (bench_now() - t) / (double)iters;
        if (k < 0) iters = (int64_t)(0.1 / t) + 1;
        else r[k] = t;
    }
    free(x);
    free(w);
    free(y);
    free(dw);
    return bench_median(r, 5);
}

static double bench_ours(config *c, int reps, double rep_s, int round)
{
    pdp_model *m = build(c->model);
    pdp_optim_desc od = {0};
    pdp_optim *o;
    pdp_tensor *x;
    int64_t shape[4] = {c->batch, 784, 1, 1}, i, iters, calls = 0;
    int32_t *y = (int32_t *)malloc((size_t)c->batch * sizeof *y);
    double rates[16], t;
    pdp_rng r;
    int k;
    if (!strcmp(c->model, "cnn")) shape[1] = 1, shape[2] = 28, shape[3] = 28;
    check(pdp_tensor_create(&x, pdp_cpu(), strcmp(c->model, "cnn") ? 2 : 4, shape), "tensor");
    pdp_rng_seed(&r, 7, 0);
    check(pdp_tensor_uniform(x, &r, 0.0f, 1.0f), "uniform");
    for (i = 0; i < c->batch; i++) y[i] = (int32_t)pdp_rng_below(&r, 10);
    od.kind = PDP_OPTIM_SGD;
    od.lr = 0.01f;
    if (c->bf16) check(pdp_model_set_precision(m, PDP_PRECISION_BF16), "precision");
    check(pdp_optim_create(&o, m, &od), "optim");
    check(pdp_set_num_threads(c->threads), "threads");
    for (k = 0; k < 3; k++) step(m, o, x, y); /* warm-up: buffers, pool, caches */
    t = bench_now();
    while (bench_now() - t < rep_s / 2 || calls < 2) step(m, o, x, y), calls++;
    iters = (int64_t)(rep_s / ((bench_now() - t) / (double)calls));
    if (iters < 2) iters = 2;
    for (k = 0; k < reps; k++) {
        t = bench_now();
        for (i = 0; i < iters; i++) step(m, o, x, y);
        rates[k] = (double)(c->batch * iters) / (bench_now() - t);
    }
    { /* where the time goes: one more repetition, profiled */
        pdp_profile p;
        int l;
        /* and per layer: model.c's own counter (forward and backward seconds per layer,
           an internal field: the bench includes the implementation) */
        m->layer_s = c->layer_s;
        pdp_profile_start();
        for (i = 0; i < iters; i++) step(m, o, x, y);
        pdp_profile_stop(&p);
        m->layer_s = NULL;
        c->nlayers = m->nlayers < MAX_LAYERS ? m->nlayers : MAX_LAYERS;
        for (l = 0; l < c->nlayers; l++) c->layer_kind[l] = pdp__layer_kind_name(m->layers[l].kind);
        c->prof.wall_s += p.wall_s;
        c->prof.gemm_layers_s += p.gemm_layers_s;
        c->prof.other_layers_s += p.other_layers_s;
        c->prof.loss_s += p.loss_s;
        c->prof.optim_s += p.optim_s;
        c->prof.other_s += p.other_s;
        c->prof.idle_s += p.idle_s;
        c->prof.threads = p.threads;
        c->prof_steps += iters;
        /* the GEMMs' share of the step, measured back to back with the step: MLP, its
           products timed alone / the median step; CNN, the w-layer share of this run */
        if (!strcmp(c->model, "mlp"))
            c->gemm_share[round] = mlp_products_s(c) * bench_median(rates, reps) /
                                   (double)c->batch;
        else
            c->gemm_share[round] = p.wall_s > 0 ? p.gemm_layers_s / p.wall_s : 0.0;
    }
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_tensor_free(x);
    free(y);
    return bench_median(rates, reps);
}

/* Runs train_torch.py for one configuration; returns 0 when torch is unavailable. */
static double bench_torch(const config *c, int reps, double rep_s, const char *script)
{
    char cmd[1024], line[256], name[16];
    double rate = 0, r;
    long long batch;
    int threads;
    FILE *p;
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s --reps %d --rep-s %g %s:%lld:%d%s", script,
             reps, rep_s, c->model, (long long)c->batch, c->threads, c->bf16 ? ":bf16" : "");
    if (!(p = popen(cmd, "r"))) return 0;
    while (fgets(line, sizeof line, p))
        if (sscanf(line, "%15s %lld %d %lf", name, &batch, &threads, &r) == 4) rate = r;
    return pclose(p) == 0 ? rate : 0;
}

/* The peaks (bench.h's bench_peak_gflops; bf16: tdpbf16ps on the amx-bf16 path, vdpbf16ps
   on the avx512-bf16 path, else the fp32 FMA the path runs on), kept at their best: measured at the start and after
   each round, since a loaded machine lowers every run of one measurement and would
   inflate the %peak columns. */
static void measure_peaks(pdp_bf16_path path, double *peak32, double *peak16)
{
    double p32 = bench_peak_gflops(BENCH_PEAK_FP32);
    double p16 = path == PDP_BF16_PATH_AMX      ? bench_peak_gflops(BENCH_PEAK_AMX_BF16)
                 : path == PDP_BF16_PATH_AVX512 ? bench_peak_gflops(BENCH_PEAK_BF16_DOT) : p32;
    *peak32 = p32 > *peak32 ? p32 : *peak32;
    *peak16 = p16 > *peak16 ? p16 : *peak16;
}

/* The fp32 configuration of bf16 configuration i (same model, batch, threads); -1 if none. */
static int fp32_twin(const config *cs, int i)
{
    int j;
    if (!cs[i].bf16) return -1;
    for (j = 0; j < NCONF; j++)
        if (!cs[j].bf16 && !strcmp(cs[j].model, cs[i].model) && cs[j].batch == cs[i].batch &&
            cs[j].threads == cs[i].threads)
            return j;
    return -1;
}

/* "need": the products' GFLOP/s that would make the step time `step_s`, the rest
   (rest_s) unchanged; "never" when the rest alone is longer. */
static void print_need(double flops, double step_s, double rest_s)
{
    if (step_s <= rest_s) printf(" %9s", "never");
    else printf(" %9.0f", flops / (step_s - rest_s) * 1e-9);
}

int main(int argc, char **argv)
{
    static config cs[NCONF] = {{.model = "mlp", .batch = 128, .threads = 1},
                               {.model = "mlp", .batch = 128, .threads = 2},
                               {.model = "mlp", .batch = 512, .threads = 1},
                               {.model = "mlp", .batch = 512, .threads = 2},
                               {.model = "cnn", .batch = 128, .threads = 1},
                               {.model = "cnn", .batch = 128, .threads = 2},
                               {.model = "mlp", .batch = 128, .threads = 1, .bf16 = true},
                               {.model = "mlp", .batch = 512, .threads = 1, .bf16 = true},
                               {.model = "mlp", .batch = 512, .threads = 2, .bf16 = true},
                               {.model = "cnn", .batch = 128, .threads = 1, .bf16 = true},
                               {.model = "cnn", .batch = 128, .threads = 2, .bf16 = true}};
    double peak32 = 0.0, peak16 = 0.0;
    pdp_bf16_path path = pdp_bf16_best_path();
    bool quick = argc > 1 && !strcmp(argv[1], "quick"), have_torch;
    int reps = quick ? 3 : 5, rounds = quick ? 1 : ROUNDS, i, r;
    double rep_s = quick ? 0.1 : 0.2, t0 = bench_now(), one = 0.0, two = 0.0;
    double ours[NCONF], torch[NCONF];
    char cpu[320];
    const char *script = "bench/train_torch.py";
    FILE *f;
    if (!(f = fopen(script, "r"))) script = "../bench/train_torch.py";
    else fclose(f);

    measure_peaks(path, &peak32, &peak16);
    printf("training step (forward, cross-entropy, backward, SGD) on %s, in samples/s: per "
           "side, the median over %d rounds of the median of %d repetitions\n",
           bench_cpu_name(cpu, sizeof cpu), rounds, reps);
    printf("peak measured per core at the start: fp32 FMA %.1f GFLOP/s; bf16 GEMM path %s: "
           "%.1f GFLOP/s (%s)\n",
           peak32, pdp_bf16_path_name(path), peak16,
           path == PDP_BF16_PATH_AMX      ? "AMX tdpbf16ps"
           : path == PDP_BF16_PATH_AVX512 ? "vdpbf16ps"
                                          : "fp32 FMA: the path emulates bf16");
    bench_print_load("start", 0.0);
    fflush(stdout);
    have_torch = system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
    for (r = 0; r < rounds; r++)
        for (i = 0; i < NCONF; i++) { /* ours, then PyTorch, config by config: same conditions */
            cs[i].ours[r] = bench_ours(&cs[i], reps, rep_s, r);
            pdp_shutdown_threads(); /* no pdp workers alive while PyTorch runs */
            if (have_torch) cs[i].torch[r] = bench_torch(&cs[i], reps, rep_s, script);
            fprintf(stderr, "  round %d: %s batch %lld threads %d %s: pdp %.0f, pytorch %.0f "
                    "samples/s\n", r + 1, cs[i].model, (long long)cs[i].batch, cs[i].threads,
                    cs[i].bf16 ? "bf16" : "fp32", cs[i].ours[r], cs[i].torch[r]);
            if (i == NCONF - 1) measure_peaks(path, &peak32, &peak16);
        }
    for (i = 0; i < NCONF; i++) {
        ours[i] = bench_median(cs[i].ours, rounds);
        torch[i] = bench_median(cs[i].torch, rounds);
    }
    printf("%-20s %5s %3s %4s | %9s %9s %7s %6s | %9s %6s\n", "model", "batch", "thr", "prec",
           "pdp", "pytorch", "ratio", "target", "bf16/fp32", "target");
    for (i = 0; i < NCONF; i++) {
        bool mlp = !strcmp(cs[i].model, "mlp");
        int f32 = fp32_twin(cs, i);
        /* the issue's, one thread: fp32 MLP 1.3x, CNN 2x; bf16 MLP at batch 512 1.5x, CNN 1.2x;
           bf16 / fp32 >= 1.0 on every configuration */
        double target = cs[i].threads != 1 ? 0.0
                        : cs[i].bf16 ? (mlp ? (cs[i].batch == 512 ? 1.5 : 0.0) : 1.2)
                                     : mlp ? 1.3 : 2.0;
        char tg[16] = "-";
        if (target > 0) snprintf(tg, sizeof tg, "%.1fx", target);
        printf("%-20s %5lld %3d %4s | %9.0f", mlp ? "MLP 784-512-512-10" : "CNN c16-p-c32-p-fc10",
               (long long)cs[i].batch, cs[i].threads, cs[i].bf16 ? "bf16" : "fp32", ours[i]);
        if (torch[i] > 0) printf(" %9.0f %6.2fx %6s |", torch[i], ours[i] / torch[i], tg);
        else printf(" %9s %7s %6s |", "-", "-", tg);
        if (f32 >= 0) printf(" %8.2fx %6s\n", ours[i] / ours[f32], "1.0x");
        else printf(" %9s %6s\n", "-", "-");
        if (mlp && !cs[i].bf16 && cs[i].batch == 128 && cs[i].threads == 1) one = ours[i];
        if (mlp && !cs[i].bf16 && cs[i].batch == 128 && cs[i].threads == 2) two = ours[i];
    }
    printf("pdp, pytorch: samples/s (pytorch bf16: torch.autocast(\"cpu\", dtype=torch.bfloat16), "
           "oneDNN's bf16 GEMMs); ratio: pdp / pytorch, same configuration; bf16/fp32: pdp's bf16 "
           "step / its fp32 step; target: the issue's\n");
    if (one > 0 && two > 0)
        printf("MLP batch 128 fp32, 2 threads / 1 thread: %.2fx (the issue's target 1.7x: %s)\n",
               two / one, two / one >= 1.7 ? "met" : "NOT met");
    printf("\n");
    printf("where pdp's step goes (share of the step's wall time; idle: the workers' idle share "
           "of all thread time); the peak per core: fp32 FMA %.1f, bf16 %.1f GFLOP/s (the best "
           "of the start's and each round's measurement)\n", peak32, peak16);
    printf("%-4s %6s %3s %5s | %7s %7s %6s %6s %6s | %6s | %8s %7s %7s\n", "", "batch", "thr",
           "prec", "w-layer", "o-layer", "loss", "optim", "rest", "idle", "GFLOP/s", "%peak",
           "w %peak");
    for (i = 0; i < NCONF; i++) {
        const pdp_profile *p = &cs[i].prof;
        double w = p->wall_s > 0 ? p->wall_s : 1.0, fl = step_flops(&cs[i]);
        double gf = p->wall_s > 0 ? fl * (double)cs[i].prof_steps / p->wall_s * 1e-9 : 0.0;
        double gfw = p->gemm_layers_s > 0
                         ? fl * (double)cs[i].prof_steps / p->gemm_layers_s * 1e-9 : 0.0;
        double pk = (cs[i].bf16 ? peak16 : peak32) * cs[i].threads;
        printf("%-4s %6lld %3d %5s | %6.1f%% %6.1f%% %5.1f%% %5.1f%% %5.1f%% | %5.1f%% | %8.1f "
               "%6.1f%% %6.1f%%\n", cs[i].model, (long long)cs[i].batch, cs[i].threads,
               cs[i].bf16 ? "bf16" : "fp32", 100 * p->gemm_layers_s / w,
               100 * p->other_layers_s / w, 100 * p->loss_s / w, 100 * p->optim_s / w,
               100 * p->other_s / w, 100 * p->idle_s / (w * cs[i].threads), gf,
               pk > 0 ? 100 * gf / pk : 0.0, pk > 0 ? 100 * gfw / pk : 0.0);
    }
    printf("w-layer: layers with weights (GEMMs, bias, im2col, packing, and the ReLU and "
           "pooling a Conv2d applies itself); o-layer: the other ReLU, pooling; %%peak: the "
           "step's GFLOP/s / (threads x peak); w %%peak: the same over the w-layer time alone\n");
    printf("\nwhat the bf16 GEMM must deliver: the step split into its products and the rest "
           "(ms per step), and the products' GFLOP/s that would meet each target with the rest "
           "unchanged\n");
    printf("%-4s %5s %3s | %7s %7s %7s %6s | %8s | %9s %9s\n", "", "batch", "thr", "step",
           "gemm", "rest", "rest%", "GFLOP/s", "need tgt", "need fp32");
    for (i = 0; i < NCONF; i++) {
        bool mlp = !strcmp(cs[i].model, "mlp");
        int f32 = fp32_twin(cs, i);
        double step = (double)cs[i].batch / ours[i], fl = step_flops(&cs[i]), g, rest;
        double target = cs[i].threads != 1 ? 0.0 : mlp ? (cs[i].batch == 512 ? 1.5 : 0.0) : 1.2;
        if (!cs[i].bf16) continue;
        g = step * bench_median(cs[i].gemm_share, rounds);
        rest = step - g;
        printf("%-4s %5lld %3d | %7.3f %7.3f %7.3f %5.0f%% | %8.1f |", cs[i].model,
               (long long)cs[i].batch, cs[i].threads, 1e3 * step, 1e3 * g, 1e3 * rest,
               100.0 * rest / step, fl / g * 1e-9);
        if (rest < 0) { /* the products alone ran slower than inside the step */
            printf(" %9s %9s (noise: the load changed between the two timings)\n", "-", "-");
            continue;
        }
        if (target > 0 && torch[i] > 0)
            print_need(fl, (double)cs[i].batch / (target * torch[i]), rest);
        else
            printf(" %9s", "-");
        if (f32 >= 0) print_need(fl, (double)cs[i].batch / ours[f32], rest);
        else printf(" %9s", "-");
        printf("\n");
    }
    printf("step: 1 / the pdp column; gemm: its share of the step (the median over the rounds) "
           "x step; the share: MLP, its products timed alone (same shapes, calls, threads) "
           "right after the step, over the step; CNN, the time in its Conv2d and Linear layers "
           "(w-layer above: im2col, packing, bias, fused ReLU and pooling included, so its rest "
           "is a lower bound); rest: step - gemm; GFLOP/s: the step's "
           "products / gemm; need tgt: the GFLOP/s at which the step would meet the issue's "
           "target against PyTorch (the target column above), need fp32: at which it would "
           "equal pdp's fp32 step (never: the rest alone is slower)\n");
    printf("\nper layer, one thread: forward + backward ms per step in the profiled runs (a "
           "fused ReLU or pooling is in its Conv2d; the first Linear and Conv2d compute no dX)\n");
    for (i = 0; i < NCONF; i++) {
        int f32 = fp32_twin(cs, i), l;
        double n16, n32;
        if (f32 < 0 || cs[i].threads != 1 || cs[i].nlayers != cs[f32].nlayers) continue;
        n16 = (double)(cs[i].prof_steps ? cs[i].prof_steps : 1);
        n32 = (double)(cs[f32].prof_steps ? cs[f32].prof_steps : 1);
        printf("%s batch %lld  %-6s", cs[i].model, (long long)cs[i].batch, "");
        for (l = 0; l < cs[i].nlayers; l++)
            if (cs[i].layer_s[l] > 0 || cs[f32].layer_s[l] > 0)
                printf(" %9.9s", cs[i].layer_kind[l]);
        printf("\n%-17s %6s", "", "fp32");
        for (l = 0; l < cs[i].nlayers; l++)
            if (cs[i].layer_s[l] > 0 || cs[f32].layer_s[l] > 0)
                printf(" %9.3f", 1e3 * cs[f32].layer_s[l] / n32);
        printf("\n%-17s %6s", "", "bf16");
        for (l = 0; l < cs[i].nlayers; l++)
            if (cs[i].layer_s[l] > 0 || cs[f32].layer_s[l] > 0)
                printf(" %9.3f", 1e3 * cs[i].layer_s[l] / n16);
        printf("\n%-17s %6s", "", "16/32");
        for (l = 0; l < cs[i].nlayers; l++)
            if (cs[i].layer_s[l] > 0 || cs[f32].layer_s[l] > 0)
                printf(" %8.2fx", cs[f32].layer_s[l] > 0 ? (cs[i].layer_s[l] / n16) /
                                                              (cs[f32].layer_s[l] / n32) : 0.0);
        printf("\n");
    }
    if (!have_torch)
        printf("PyTorch: /usr/bin/python3 cannot import torch (apt-get install python3-torch); "
               "only pdp's figures are shown\n");
    bench_print_load("end", BENCH_OWN_LOAD_1_2);
    printf("%.0f s\n", bench_now() - t0);
    return 0;
}
