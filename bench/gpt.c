/* bench/gpt.c: tokens/s of a GPT training step, pdp beside PyTorch, same machine, same run.

   The model sized for a small machine (issue 24): byte vocabulary (256), context 256, 6
   layers, 6 heads, dim 384 (10.7 M parameters, the head tied to the token embedding),
   batch 8 x 256 tokens, dropout 0, seed 1. The step: forward, cross-entropy (mean over the
   2048 positions), backward, AdamW (lr 6e-4, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1,
   every parameter), gradients zeroed: pdp_model_forward_backward, pdp_optim_step,
   pdp_optim_zero_grad. fp32, and bf16 (pdp_gpt_desc.precision = PDP_PRECISION_BF16: bf16
   GEMM inputs, fp32 everything else), each on 1 and 2 threads (pdp_set_num_threads). The
   peer: the same model in PyTorch (bench/gpt_torch.py: tools/gpt_reference.py's
   architecture, nanoGPT's), fp32, and its forward and loss under torch.autocast("cpu",
   dtype=torch.bfloat16), torch.set_num_threads, the same optimizer and step.

   Measurement: ROUNDS rounds; in each, every configuration is measured for pdp and then
   for PyTorch (a /usr/bin/python3 child through popen), back to back, so a shared box's
   drift hits both sides alike. One measurement: 2 warm-up steps, then the median of REPS
   timed steps (a step is 0.3-3 s here); the table shows, per side, the median over the
   rounds, in ms per step and tokens/s, and the ratio PyTorch ms / pdp ms (above 1: pdp
   is faster) beside the targets: fp32 >= 1.3x at one thread, bf16 >= 1.0x, and
   pdp's 2 threads >= 1.8x its 1 thread.

   Fraction of the peak: the step's products over the time, over the FMA peak (bench.h's
   bench_peak_gflops, the best of its measurements at the start and after each round, as
   bench/train.c: fp32 FMA; bf16 the peak of the path pdp_gemm_bf16 takes) times the
   threads. The products, PaLM's count (Chowdhury et al. 2022, appendix B): 6 N per token
   for the weights (N = 12 L C^2 + V C: the four Linears of each block and the tied head;
   forward, dX and dW) plus 12 L T C per token for attention (Q K^T and P V, forward and
   backward, the full T x T: the masked half counted too).

   Where the time goes: one more step per round under pdp_profile (base.h) and model.c's
   per-layer seconds (an internal field: the bench includes the implementation), summed by
   kind: attention, the GEMM layers (the blocks' Linears, bias included), GELU, LayerNorm,
   the residual stream and the embedding, the head and its cross-entropy (TiedLinear and
   the loss), the optimizer (step and zero_grad), and the rest.

   No allocation in the step: PDP_MALLOC counts (as tests/counting_alloc.h does); the
   timed steps after the warm-up must allocate nothing, and the table says how many they did.

   Not measured here (printed as such): GPT-2 124M's shape and llm.c's train_gpt2.c.

   Pinning is the caller's: nice -n -10 taskset -c 1 ./build/bench_gpt for one core (the
   2-thread rows then share it), taskset -c 0,1 for two.
   make build/bench_gpt && ./build/bench_gpt [quick] [1 | 2]
   quick: 1 round of 3 steps per configuration; 1 or 2: only the rows of that many threads
   (taskset -c 1 ./build/bench_gpt 1: the one-thread rows alone on one core). */

#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

static long bench_allocs; /* PDP_MALLOC calls, from any thread */
static void *bench_malloc(size_t bytes)
{
    __atomic_add_fetch(&bench_allocs, 1, __ATOMIC_RELAXED);
    return malloc(bytes);
}
#define PDP_MALLOC(bytes) bench_malloc(bytes)
#define PDP_FREE(ptr) free(ptr)
#define PDP_IMPLEMENTATION
#include "pdp.h"

#include "bench.h"

#define V 256
#define T 256
#define L 6
#define H 6
#define C 384
#define B 8
#define ROUNDS 3
#define REPS 5
#define NCONF 4

/* the step's time by kind (the second table) */
enum { K_ATTN, K_GEMM, K_GELU, K_LN, K_RESID, K_HEAD, K_OPTIM, K_REST, K_COUNT };
static const char *k_name[K_COUNT] = {"attention", "Linear", "GELU", "LayerNorm", "resid+emb",
                                      "head+CE", "AdamW", "rest"};

typedef struct config {
    bool bf16;
    int threads;
    double ours[ROUNDS], torch[ROUNDS]; /* ms per step, per round; 0 = not measured */
    double kind_s[K_COUNT];             /* seconds in the profiled steps */
    double wall_s;
    long prof_steps, allocs, timed_steps;
} config;

static double step_flops(void)
{
    double n = 12.0 * L * C * C + (double)V * C;
    return (double)B * T * (6.0 * n + 12.0 * L * T * C);
}

static void step(pdp_model *m, pdp_optim *o, const pdp_tensor *x, const int32_t *y)
{
    float loss;
    CHECK(pdp_model_forward_backward(m, x, y, &loss));
    CHECK(pdp_optim_step(o));
    pdp_optim_zero_grad(o);
}

static double bench_ours(config *c, int reps)
{
    static int32_t ids[B * T], targets[B * T];
    pdp_gpt_desc gd;
    pdp_optim_desc od;
    pdp_model *m;
    pdp_optim *o;
    pdp_tensor x;
    pdp_profile p;
    pdp_rng r;
    int64_t shape[2] = {B, T}, i;
    static double layer_s[1024];
    double ms[16], t;
    long a0;
    int k;
    memset(&gd, 0, sizeof gd);
    gd.vocab = V, gd.context = T, gd.layers = L, gd.heads = H, gd.dim = C, gd.seed = 1;
    gd.precision = c->bf16 ? PDP_PRECISION_BF16 : PDP_PRECISION_FP32;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 6e-4, od.beta1 = 0.9, od.beta2 = 0.95, od.eps = 1e-8;
    od.weight_decay = 0.1;
    CHECK(pdp_gpt_create(&m, &gd));
    CHECK(pdp_optim_create(&o, m, &od));
    CHECK(pdp_set_num_threads(c->threads));
    CHECK(pdp_model_reserve(m, B));
    pdp_rng_seed(&r, 7, 0);
    for (i = 0; i < B * T; i++) {
        ids[i] = (int32_t)pdp_rng_below(&r, V);
        targets[i] = (int32_t)pdp_rng_below(&r, V);
    }
    CHECK(pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x));
    step(m, o, &x, targets); /* warm-up: buffers, optimizer state, the pool, caches */
    step(m, o, &x, targets);
    a0 = bench_allocs;
    for (k = 0; k < reps; k++) {
        t = bench_now();
        step(m, o, &x, targets);
        ms[k] = 1e3 * (bench_now() - t);
    }
    c->allocs += bench_allocs - a0;
    c->timed_steps += reps;
    /* where the time goes: one more step, profiled, and timed layer by layer */
    if (m->nlayers > (int)(sizeof layer_s / sizeof *layer_s)) {
        fprintf(stderr, "bench_gpt: %d layers, more than the bench's table\n", m->nlayers);
        exit(1);
    }
    memset(layer_s, 0, sizeof layer_s);
    m->layer_s = layer_s;
    pdp_profile_start();
    step(m, o, &x, targets);
    pdp_profile_stop(&p);
    m->layer_s = NULL;
    for (i = 0; i < m->nlayers; i++) {
        pdp__layer_kind kd = m->layers[i].kind;
        int slot = kd == PDP__CAUSAL_SELF_ATTENTION ? K_ATTN
                   : kd == PDP__LINEAR              ? K_GEMM
                   : kd == PDP__GELU                ? K_GELU
                   : kd == PDP__LAYERNORM           ? K_LN
                   : kd == PDP__TIED_LINEAR         ? K_HEAD
                                                    : K_RESID;
        c->kind_s[slot] += layer_s[i];
    }
    c->kind_s[K_HEAD] += p.loss_s;
    c->kind_s[K_OPTIM] += p.optim_s;
    c->wall_s += p.wall_s;
    c->prof_steps++;
    pdp_optim_free(o);
    pdp_model_free(m);
    return bench_median(ms, reps);
}

/* Runs gpt_torch.py for one configuration: its ms per step, 0 when torch is unavailable. */
static double bench_torch(const config *c, int reps, const char *script)
{
    char cmd[1024], line[256], prec[16];
    double ms = 0, v;
    int threads;
    FILE *p;
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s --reps %d %s:%d", script, reps,
             c->bf16 ? "bf16" : "fp32", c->threads);
    if (!(p = popen(cmd, "r"))) return 0;
    while (fgets(line, sizeof line, p))
        if (sscanf(line, "%15s %d %lf", prec, &threads, &v) == 3) ms = v;
    return pclose(p) == 0 ? ms : 0;
}

/* As bench/train.c's: the peaks kept at their best (a loaded run can only lower one). */
static void measure_peaks(pdp_bf16_path path, double *peak32, double *peak16)
{
    double p32 = bench_peak_gflops(BENCH_PEAK_FP32);
    double p16 = path == PDP_BF16_PATH_AMX      ? bench_peak_gflops(BENCH_PEAK_AMX_BF16)
                 : path == PDP_BF16_PATH_AVX512 ? bench_peak_gflops(BENCH_PEAK_BF16_DOT) : p32;
    *peak32 = p32 > *peak32 ? p32 : *peak32;
    *peak16 = p16 > *peak16 ? p16 : *peak16;
}

int main(int argc, char **argv)
{
    static config cs[NCONF] = {{false, 1, {0}, {0}, {0}, 0, 0, 0, 0},
                               {false, 2, {0}, {0}, {0}, 0, 0, 0, 0},
                               {true, 1, {0}, {0}, {0}, 0, 0, 0, 0},
                               {true, 2, {0}, {0}, {0}, 0, 0, 0, 0}};
    pdp_bf16_path path = pdp_bf16_best_path();
    bool quick = false, have_torch;
    int reps, rounds, i, r, k, only = 0; /* only: run just the rows of that many threads */
    double peak32 = 0.0, peak16 = 0.0, ours[NCONF], torch[NCONF], t0 = bench_now();
    double flops = step_flops(), tokens = (double)B * T;
    char cpu[320];
    const char *script = "bench/gpt_torch.py";
    FILE *f;
    if (!(f = fopen(script, "r"))) script = "../bench/gpt_torch.py";
    else fclose(f);
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "quick")) quick = true;
        else if (!strcmp(argv[i], "1") || !strcmp(argv[i], "2")) only = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: bench_gpt [quick] [1 | 2]\n");
            return 2;
        }
    }
    reps = quick ? 3 : REPS;
    rounds = quick ? 1 : ROUNDS;

    measure_peaks(path, &peak32, &peak16);
    printf("GPT training step (forward, cross-entropy, backward, AdamW, zero_grad) on %s: "
           "vocab %d, context %d, %d layers, %d heads, dim %d, batch %d x %d; per side the "
           "median over %d rounds of the median of %d steps\n",
           bench_cpu_name(cpu, sizeof cpu), V, T, L, H, C, B, T, rounds, reps);
    printf("peak per core: fp32 FMA %.1f GFLOP/s; bf16 GEMM path %s %.1f GFLOP/s; the step's "
           "products %.1f GFLOP (6 N + 12 L T C per token)\n", peak32,
           pdp_bf16_path_name(path), peak16, flops * 1e-9);
    bench_print_load("start", 0.0);
    fflush(stdout);
    have_torch = system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
    for (r = 0; r < rounds; r++) {
        for (i = 0; i < NCONF; i++) {
            if (only && cs[i].threads != only) continue;
            cs[i].ours[r] = bench_ours(&cs[i], reps);
            pdp_shutdown_threads(); /* no pdp workers alive while PyTorch runs */
            if (have_torch) cs[i].torch[r] = bench_torch(&cs[i], reps, script);
            fprintf(stderr, "  round %d: %s %d thread(s): pdp %.0f ms, pytorch %.0f ms\n",
                    r + 1, cs[i].bf16 ? "bf16" : "fp32", cs[i].threads, cs[i].ours[r],
                    cs[i].torch[r]);
        }
        measure_peaks(path, &peak32, &peak16);
    }
    for (i = 0; i < NCONF; i++) {
        ours[i] = bench_median(cs[i].ours, rounds);
        torch[i] = bench_median(cs[i].torch, rounds);
    }

    printf("\n%-4s %3s | %8s %8s %6s | %8s %8s | %7s %6s | %5s\n", "prec", "thr", "pdp ms",
           "tok/s", "%peak", "torch ms", "tok/s", "ratio", "target", "alloc");
    for (i = 0; i < NCONF; i++) {
        double pk = (cs[i].bf16 ? peak16 : peak32) * cs[i].threads;
        double target = cs[i].bf16 ? 1.0 : cs[i].threads == 1 ? 1.3 : 0.0;
        char tg[16] = "-";
        if (ours[i] <= 0) continue; /* not run */
        if (target > 0) snprintf(tg, sizeof tg, "%.1fx", target);
        printf("%-4s %3d | %8.0f %8.0f %5.1f%% |", cs[i].bf16 ? "bf16" : "fp32", cs[i].threads,
               ours[i], tokens / ours[i] * 1e3,
               pk > 0 ? 100.0 * flops / (ours[i] * 1e-3) * 1e-9 / pk : 0.0);
        if (torch[i] > 0)
            printf(" %8.0f %8.0f | %6.2fx %6s |", torch[i], tokens / torch[i] * 1e3,
                   torch[i] / ours[i], tg);
        else
            printf(" %8s %8s | %7s %6s |", "-", "-", "-", tg);
        printf(" %5ld\n", cs[i].allocs);
    }
    printf("ratio: pytorch ms / pdp ms (above 1: pdp faster); target: the issue's; %%peak: the "
           "step's products / time / (threads x the peak: fp32 FMA, or the bf16 path's); alloc: "
           "PDP_MALLOC calls in the %ld timed steps (after 2 warm-up steps)\n",
           cs[only == 2 ? 1 : 0].timed_steps);
    for (k = 0; k < 2 && !only; k++) { /* pdp's 2 threads over its 1 thread, fp32, bf16 */
        double s = ours[2 * k] / ours[2 * k + 1];
        printf("%s 2 threads / 1 thread: pdp %.2fx (target 1.8x: %s)", k ? "bf16" : "fp32", s,
               s >= 1.8 ? "met" : "NOT met");
        if (torch[2 * k] > 0 && torch[2 * k + 1] > 0)
            printf(", pytorch %.2fx", torch[2 * k] / torch[2 * k + 1]);
        printf("\n");
    }
    printf("GPT-2 124M (vocab 50257, context 1024, 12 x 12 x 768) at 4 x 64, and llm.c's "
           "train_gpt2.c: not measured\n");

    printf("\nwhere pdp's step goes: ms per step (the profiled steps), share of the step\n");
    printf("%-4s %3s |", "prec", "thr");
    for (k = 0; k < K_COUNT; k++) printf(" %10s", k_name[k]);
    printf("\n");
    for (i = 0; i < NCONF; i++) {
        double n = (double)(cs[i].prof_steps ? cs[i].prof_steps : 1), known = 0.0;
        if (!cs[i].prof_steps) continue;
        for (k = 0; k < K_REST; k++) known += cs[i].kind_s[k];
        cs[i].kind_s[K_REST] = cs[i].wall_s - known;
        printf("%-4s %3d |", cs[i].bf16 ? "bf16" : "fp32", cs[i].threads);
        for (k = 0; k < K_COUNT; k++) printf(" %10.1f", 1e3 * cs[i].kind_s[k] / n);
        printf("\n%8s |", "");
        for (k = 0; k < K_COUNT; k++)
            printf(" %9.1f%%", cs[i].wall_s > 0 ? 100.0 * cs[i].kind_s[k] / cs[i].wall_s : 0.0);
        printf("\n");
    }
    printf("attention: the causal self-attention between c_attn and c_proj (its products, the "
           "softmax); Linear: the blocks' c_attn, c_proj, c_fc, c_proj (GEMMs and bias); "
           "resid+emb: residual copies and adds, the embedding; head+CE: the tied head's GEMMs "
           "and the cross-entropy; AdamW: step and zero_grad; rest: the bench's loop\n");
    if (!have_torch)
        printf("PyTorch: /usr/bin/python3 cannot import torch (apt-get install python3-torch); "
               "only pdp's figures are shown\n");
    bench_print_load("end", BENCH_OWN_LOAD_1_2);
    printf("%.0f s\n", bench_now() - t0);
    return 0;
}
