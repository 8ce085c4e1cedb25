/* bench/gpt.c: tokens/s of a GPT training step, pdp beside PyTorch and llm.c, same machine,
   same run.

   Two shapes (issue 24, item 4), the head tied to the token embedding, dropout 0, seed 1:
   - the model sized for a small machine: byte vocabulary (256), context 256, 6 layers, 6
     heads, dim 384 (10.7 M parameters), batch 8 x 256 tokens, 5 timed steps;
   - GPT-2 124M's shape: vocabulary 50257, context 1024, 12 layers, 12 heads, dim 768 (124 M
     parameters), batch 4 x 64 tokens (pdp_gpt_desc.sequence 64), 3 timed steps.
   The step: forward, cross-entropy (mean over the batch's positions), backward, AdamW (lr
   6e-4, betas 0.9 / 0.95, eps 1e-8, weight decay 0.1, every parameter), gradients zeroed:
   pdp_model_forward_backward, pdp_optim_step, pdp_optim_zero_grad. fp32, and bf16
   (pdp_gpt_desc.precision = PDP_PRECISION_BF16: bf16 GEMM inputs, fp32 everything else), each
   on 1 and 2 threads (pdp_set_num_threads).

   The peers, each a child process (popen) measured right after pdp's configuration:
   - PyTorch: the same model (bench/gpt_torch.py --shape: tools/gpt_reference.py's
     architecture, nanoGPT's), fp32, and its forward and loss under torch.autocast("cpu",
     dtype=torch.bfloat16), torch.set_num_threads, the same optimizer and step;
   - llm.c's CPU trainer, train_gpt2.c (fp32, OpenMP threads): bench/llmc/gpt_llmc.sh builds
     bench/llmc/gpt_llmc.c against the copy of llm.c named by PDP_LLMC (fetch it yourself:
     its code is never committed here) with llm.c's Makefile's flags, writes llm.c's
     checkpoint and token files with random weights and tokens (no download; the vocabulary
     padded to 128 as llm.c pads it) and times train_gpt2.c main's step: next batch, forward,
     zero_grad, backward, update, with its own hyperparameters (AdamW lr 1e-4, betas 0.9 /
     0.999, weight decay 0: the same work). Without PDP_LLMC its columns say "-" and the
     bench prints "llm.c: not measured".

   Measurement: a shape's ROUNDS rounds, then the next shape's; in each round, every
   configuration is measured for pdp and then for its peers, back to back, so a shared box's
   drift hits every side alike. One measurement: 2 warm-up steps, then the median of the
   shape's timed steps; the table shows, per side, the median over the rounds, in ms per step
   and tokens/s, and the ratios peer ms / pdp ms (above 1: pdp is faster) beside the issue's
   targets: fp32 >= 1.3x PyTorch at one thread, bf16 >= 1.0x, and 2 threads >= 1.8x 1 thread.
   pdp's model and optimizer are built once per shape and precision and kept for the shape's
   rounds (the threads change between measurements): pdp_gpt_create at GPT-2 124M's size
   takes about 6 s (the initialisation's 124 M normal draws most of it).

   Fraction of the peak: the step's products over the time, over the FMA peak (bench.h's
   bench_peak_gflops, the best of its measurements at the start and after each round, as
   bench/train.c: fp32 FMA; bf16 the peak of the path pdp_gemm_bf16 takes) times the
   threads. The products, PaLM's count (Chowdhury et al. 2022, appendix B): 6 N per token
   for the weights (N = 12 L C^2 + V C: the four Linears of each block and the tied head;
   forward, dX and dW) plus 12 L T C per token for attention (Q K^T and P V, forward and
   backward, the full T x T: the masked half counted too).

   Where the time goes: one more step per measurement under pdp_profile (base.h) and
   model.c's per-layer seconds (an internal field: the bench includes the implementation),
   summed by kind: attention, the GEMM layers (the blocks' Linears, bias included, and the
   GELU that c_fc applies itself on the CPU: model.c's fusion, so the GELU column is 0), GELU,
   LayerNorm, the residual stream and the embedding, the head and its cross-entropy
   (TiedLinear and the loss), the optimizer (step and zero_grad), and the rest.

   No allocation in the step: PDP_MALLOC counts (as tests/counting_alloc.h does); the
   timed steps after the warm-up must allocate nothing, and the table says how many they did.

   TP 2 beside DDP 2 (issue 25): the machine-sized model's global batch (8 x 256 tokens),
   fp32, on thread ranks of the local backend with one intra-op thread a rank: one device
   (1 thread, and 2 threads: both cores, no communication), DDP 2 (4 sequences a rank), TP 2
   (every rank the 8 sequences on half of each block: pdp_gpt_desc.tp) and TP 2 + SP
   (.sequence_parallel). Per configuration: ms and tokens/s of a step (rank 0's step, the
   median of the timed steps, then the median over the rounds), the bytes rank 0 sent a step
   (pdp_comm_get_stats) beside the formula, and what a rank holds (its parameters, their
   state at 16 bytes each, its activations); then what the table teaches, with the figures
   of the formulas (printed by the bench, not typed here).

   Pinning is the caller's: nice -n -10 taskset -c 1 ./build/bench_gpt 1 for one core,
   taskset -c 0,1 for two.
   make build/bench_gpt && PDP_LLMC=/path/to/llm.c ./build/bench_gpt [quick] [pdp] [1 | 2] [WHAT]
   quick: 1 round, at most 3 timed steps; pdp: no peers (pdp's own figures and ratios, for
   comparing two builds of pdp); 1 or 2: only the rows of that many threads (no TP
   table); WHAT small or gpt2: only that shape; tp: only the TP 2 beside DDP 2 table. A full
   run takes about half an hour on 2 cores with llm.c. */

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

#define ROUNDS 3
#define PAR_ROUNDS 5 /* the TP 2 beside DDP 2 table's */
#define MAX_REPS 8
#define NSHAPE 2
#define NPREC 4 /* per shape: fp32 1, fp32 2, bf16 1, bf16 2 threads */
#define NCONF (NSHAPE * NPREC)

typedef struct shape {
    const char *name, *word; /* the tables' title; its word on the command line */
    int64_t vocab, context;
    int layers, heads;
    int64_t dim, batch, seq;
    int reps; /* timed steps per measurement */
} shape;

static const shape shapes[NSHAPE] = {
    {"the machine-sized model", "small", 256, 256, 6, 6, 384, 8, 256, 5},
    {"GPT-2 124M's shape", "gpt2", 50257, 1024, 12, 12, 768, 4, 64, 3},
};

/* the step's time by kind (the second table) */
enum { K_ATTN, K_GEMM, K_GELU, K_LN, K_RESID, K_HEAD, K_OPTIM, K_REST, K_COUNT };
static const char *k_name[K_COUNT] = {"attention", "Linear", "GELU", "LayerNorm", "resid+emb",
                                      "head+CE", "AdamW", "rest"};

typedef struct config {
    const shape *s;
    bool bf16;
    int threads;
    double ours[ROUNDS], torch[ROUNDS], llmc[ROUNDS]; /* ms per step, per round; 0: not measured */
    double kind_s[K_COUNT];                           /* seconds in the profiled steps */
    double wall_s;
    long prof_steps, allocs, timed_steps;
} config;

/* The step's products: PaLM's count, 6 N per token for the weights (N = 12 L C^2 + V C)
   plus 12 L T C per token for attention. */
static double step_flops(const shape *s)
{
    double n = 12.0 * s->layers * (double)s->dim * (double)s->dim + (double)s->vocab * (double)s->dim;
    return (double)s->batch * (double)s->seq *
           (6.0 * n + 12.0 * s->layers * (double)s->seq * (double)s->dim);
}

static void step(pdp_model *m, pdp_optim *o, const pdp_tensor *x, const int32_t *y)
{
    float loss;
    CHECK(pdp_model_forward_backward(m, x, y, &loss));
    CHECK(pdp_optim_step(o));
    pdp_optim_zero_grad(o);
}

/* pdp's model and optimizer of a shape and precision, built on first use and kept for the
   shape's rounds: pdp_gpt_create takes seconds at GPT-2 124M's size (see the opening
   comment), outside the step but not outside the bench's time. */
typedef struct built {
    pdp_model *m;
    pdp_optim *o;
} built;

static void build(built *b, const shape *s, bool bf16)
{
    pdp_gpt_desc gd;
    pdp_optim_desc od;
    double t = bench_now();
    memset(&gd, 0, sizeof gd);
    gd.vocab = s->vocab, gd.context = s->context, gd.sequence = s->seq;
    gd.layers = s->layers, gd.heads = s->heads, gd.dim = s->dim, gd.seed = 1;
    gd.precision = bf16 ? PDP_PRECISION_BF16 : PDP_PRECISION_FP32;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 6e-4, od.beta1 = 0.9, od.beta2 = 0.95, od.eps = 1e-8;
    od.weight_decay = 0.1;
    CHECK(pdp_gpt_create(&b->m, &gd));
    CHECK(pdp_optim_create(&b->o, b->m, &od));
    fprintf(stderr, "  %s, %s: pdp_gpt_create and pdp_optim_create took %.1f s\n", s->word,
            bf16 ? "bf16" : "fp32", bench_now() - t);
}

static void unbuild(built *b)
{
    if (b->o) pdp_optim_free(b->o);
    if (b->m) pdp_model_free(b->m);
    b->m = NULL, b->o = NULL;
}

static double bench_ours(config *c, built *b, int reps)
{
    const shape *s = c->s;
    int64_t n = s->batch * s->seq, shape2[2], i;
    int32_t *ids = malloc((size_t)n * sizeof *ids), *targets = malloc((size_t)n * sizeof *targets);
    pdp_model *m;
    pdp_optim *o;
    pdp_tensor x;
    pdp_profile p;
    pdp_rng r;
    static double layer_s[1024];
    double ms[MAX_REPS], t;
    long a0;
    int k;
    if (!ids || !targets) {
        fprintf(stderr, "bench_gpt: out of memory\n");
        exit(1);
    }
    if (!b->m) build(b, s, c->bf16);
    m = b->m, o = b->o;
    CHECK(pdp_set_num_threads(c->threads));
    CHECK(pdp_model_reserve(m, s->batch));
    pdp_rng_seed(&r, 7, 0);
    for (i = 0; i < n; i++) {
        ids[i] = (int32_t)pdp_rng_below(&r, (uint64_t)s->vocab);
        targets[i] = (int32_t)pdp_rng_below(&r, (uint64_t)s->vocab);
    }
    shape2[0] = s->batch, shape2[1] = s->seq;
    CHECK(pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape2, &x));
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
    free(ids);
    free(targets);
    return bench_median(ms, reps);
}

/* Runs a peer's command, which prints "<fp32|bf16> <threads> <ms>": its ms per step, 0 when
   it failed or printed none. */
static double run_peer(const char *cmd)
{
    char line[256], prec[16];
    double ms = 0, v;
    int threads;
    FILE *p;
    fflush(stdout);
    if (!(p = popen(cmd, "r"))) return 0;
    while (fgets(line, sizeof line, p))
        if (sscanf(line, "%15s %d %lf", prec, &threads, &v) == 3) ms = v;
    return pclose(p) == 0 ? ms : 0;
}

/* gpt_torch.py for one configuration: its ms per step, 0 when torch is unavailable. */
static double bench_torch(const config *c, int reps, const char *script)
{
    const shape *s = c->s;
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 %s --reps %d --shape %lld,%lld,%d,%d,%lld,%lld,%lld %s:%d", script,
             reps, (long long)s->vocab, (long long)s->context, s->layers, s->heads,
             (long long)s->dim, (long long)s->batch, (long long)s->seq,
             c->bf16 ? "bf16" : "fp32", c->threads);
    return run_peer(cmd);
}

/* llm.c's train_gpt2.c through bench/llmc/gpt_llmc.sh (PDP_LLMC names the copy): fp32 only. */
static double bench_llmc(const config *c, int reps, const char *script)
{
    const shape *s = c->s;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sh %s %d %lld %lld %d %d %lld %lld %lld %d", script, c->threads,
             (long long)s->vocab, (long long)s->context, s->layers, s->heads,
             (long long)s->dim, (long long)s->batch, (long long)s->seq, reps);
    return run_peer(cmd);
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

/* The script's path from the repository root or from build/; NULL when neither is there. */
static const char *find_script(const char *path, char *buf, size_t size)
{
    FILE *f;
    if ((f = fopen(path, "r"))) {
        fclose(f);
        return path;
    }
    snprintf(buf, size, "../%s", path);
    if ((f = fopen(buf, "r"))) {
        fclose(f);
        return buf;
    }
    return NULL;
}

/* One shape's tables: ms per step and tokens/s per side, the ratios, the scaling, where pdp's
   step goes. cs: the shape's NPREC configurations. */
static void print_shape(config *cs, int rounds, int only, double peak32, double peak16,
                        bool have_llmc)
{
    const shape *s = cs[0].s;
    double flops = step_flops(s), tokens = (double)(s->batch * s->seq);
    double ours[NPREC], torch[NPREC], llmc[NPREC];
    int i, k;
    for (i = 0; i < NPREC; i++) {
        ours[i] = bench_median(cs[i].ours, rounds);
        torch[i] = bench_median(cs[i].torch, rounds);
        llmc[i] = bench_median(cs[i].llmc, rounds);
    }
    printf("\n%s: vocab %lld, context %lld, %d layers, %d heads, dim %lld, batch %lld x %lld; "
           "the step's products %.1f GFLOP (6 N + 12 L T C per token); per side the median "
           "over %d rounds of the median of %d steps\n",
           s->name, (long long)s->vocab, (long long)s->context, s->layers, s->heads,
           (long long)s->dim, (long long)s->batch, (long long)s->seq, flops * 1e-9, rounds,
           s->reps);
    printf("%-4s %3s | %8s %8s %6s | %8s %8s %7s %6s | %8s %8s %7s | %5s\n", "prec", "thr",
           "pdp ms", "tok/s", "%peak", "torch ms", "tok/s", "ratio", "target", "llm.c ms",
           "tok/s", "ratio", "alloc");
    for (i = 0; i < NPREC; i++) {
        double pk = (cs[i].bf16 ? peak16 : peak32) * cs[i].threads;
        double target = cs[i].bf16 ? 1.0 : cs[i].threads == 1 ? 1.3 : 0.0;
        char tg[16] = "-";
        if (ours[i] <= 0) continue; /* not run */
        if (target > 0) snprintf(tg, sizeof tg, "%.1fx", target);
        printf("%-4s %3d | %8.0f %8.0f %5.1f%% |", cs[i].bf16 ? "bf16" : "fp32", cs[i].threads,
               ours[i], tokens / ours[i] * 1e3,
               pk > 0 ? 100.0 * flops / (ours[i] * 1e-3) * 1e-9 / pk : 0.0);
        if (torch[i] > 0)
            printf(" %8.0f %8.0f %6.2fx %6s |", torch[i], tokens / torch[i] * 1e3,
                   torch[i] / ours[i], tg);
        else
            printf(" %8s %8s %7s %6s |", "-", "-", "-", tg);
        if (llmc[i] > 0)
            printf(" %8.0f %8.0f %6.2fx |", llmc[i], tokens / llmc[i] * 1e3, llmc[i] / ours[i]);
        else
            printf(" %8s %8s %7s |", "-", "-", "-");
        printf(" %5ld\n", cs[i].allocs);
    }
    printf("ratio: the peer's ms / pdp's ms (above 1: pdp faster); target: the issue's against "
           "PyTorch; llm.c: train_gpt2.c, fp32 only (its bf16 rows compare nothing); %%peak: the "
           "step's products / time / (threads x the peak: fp32 FMA, or the bf16 path's); alloc: "
           "PDP_MALLOC calls in the %ld timed steps (after 2 warm-up steps)\n",
           cs[only == 2 ? 1 : 0].timed_steps);
    if (!have_llmc)
        printf("llm.c: not measured (set PDP_LLMC=/path/to/llm.c, a copy of "
               "github.com/karpathy/llm.c)\n");
    for (k = 0; k < 2 && !only; k++) { /* 2 threads over 1 thread, fp32, bf16 */
        double sc = ours[2 * k] / ours[2 * k + 1];
        printf("%s 2 threads / 1 thread: pdp %.2fx (target 1.8x: %s)", k ? "bf16" : "fp32", sc,
               sc >= 1.8 ? "met" : "NOT met");
        if (torch[2 * k] > 0 && torch[2 * k + 1] > 0)
            printf(", pytorch %.2fx", torch[2 * k] / torch[2 * k + 1]);
        if (llmc[2 * k] > 0 && llmc[2 * k + 1] > 0)
            printf(", llm.c %.2fx", llmc[2 * k] / llmc[2 * k + 1]);
        printf("\n");
    }

    printf("where pdp's step goes: ms per step (the profiled steps), share of the step\n");
    printf("%-4s %3s |", "prec", "thr");
    for (k = 0; k < K_COUNT; k++) printf(" %10s", k_name[k]);
    printf("\n");
    for (i = 0; i < NPREC; i++) {
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
}

/* ---- TP 2 beside DDP 2, the same global batch ---- */

/* The machine-sized model's global batch (B x T tokens) trained five ways on thread ranks of
   the local backend, one intra-op thread a rank unless said: one device on 1 thread and on 2
   (the peer that uses both cores without communicating), DDP 2 (B / 2 sequences a rank, the
   gradients all-reduced in buckets while backward runs), TP 2 (every rank the whole batch on
   its half of each block: 3 heads, half of c_fc and c_proj) and TP 2 + SP. */
enum { P_ONE, P_ONE2, P_DDP, P_TP, P_TPSP, NPAR };
static const char *par_name[NPAR] = {"1 device", "1 device 2T", "DDP 2", "TP 2", "TP 2 + SP"};

typedef struct par_job {
    const shape *s;
    int kind, reps;
    int32_t *ids, *targets;       /* the global batch */
    double ms[MAX_REPS];          /* rank 0's step times */
    double cpu_s;                 /* the process's CPU seconds over the timed steps (rank 0) */
    int64_t sent;                 /* rank 0's bytes sent over the timed steps */
    int64_t params, act;          /* rank 0's parameters and activation bytes */
} par_job;

static pdp_status par_rank(const pdp_launch_ctx *ctx, void *user)
{
    par_job *j = (par_job *)user;
    const shape *s = j->s;
    bool tp = j->kind == P_TP || j->kind == P_TPSP, ddp = j->kind == P_DDP;
    int64_t b = ddp ? s->batch / ctx->world_size : s->batch, shape2[2];
    int64_t off = ddp ? ctx->rank * b * s->seq : 0;
    pdp_gpt_desc gd;
    pdp_optim_desc od;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_ddp *d = NULL;
    pdp_comm_stats c0, c1;
    pdp_tensor x;
    float loss;
    double cpu0 = 0.0;
    int k;
    CHECK(pdp_set_num_threads(j->kind == P_ONE2 ? 2 : 1));
    memset(&gd, 0, sizeof gd);
    gd.vocab = s->vocab, gd.context = s->context, gd.sequence = s->seq;
    gd.layers = s->layers, gd.heads = s->heads, gd.dim = s->dim, gd.seed = 1;
    gd.tp = tp ? ctx->world : NULL;
    gd.sequence_parallel = j->kind == P_TPSP;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 6e-4, od.beta1 = 0.9, od.beta2 = 0.95, od.eps = 1e-8;
    od.weight_decay = 0.1;
    CHECK(pdp_gpt_create(&m, &gd));
    CHECK(pdp_model_reserve(m, b));
    if (ddp) CHECK(pdp_ddp_create(&d, m, ctx->world, NULL));
    CHECK(pdp_optim_create(&o, m, &od));
    shape2[0] = b, shape2[1] = s->seq;
    CHECK(pdp_tensor_wrap_ids(j->ids + off, pdp_cpu(), 2, shape2, &x));
    for (k = -2; k < j->reps; k++) { /* 2 warm-up steps */
        double t;
        if (k == 0) { /* every rank past its warm-up */
            CHECK(pdp_comm_barrier(ctx->world, NULL));
            pdp_comm_get_stats(ctx->world, &c0);
            cpu0 = bench_process_cpu();
        }
        t = bench_now();
        if (d) {
            CHECK(pdp_ddp_forward_backward(d, &x, j->targets + off, &loss));
            CHECK(pdp_ddp_finish(d));
        } else
            CHECK(pdp_model_forward_backward(m, &x, j->targets + off, &loss));
        CHECK(pdp_optim_step(o));
        pdp_optim_zero_grad(o);
        if (k >= 0 && ctx->rank == 0) j->ms[k] = 1e3 * (bench_now() - t);
    }
    pdp_comm_get_stats(ctx->world, &c1); /* this rank's sends are done */
    CHECK(pdp_comm_barrier(ctx->world, NULL));
    if (ctx->rank == 0) {
        j->cpu_s = bench_process_cpu() - cpu0;
        j->sent = c1.bytes_sent - c0.bytes_sent;
        j->params = pdp_model_param_count(m);
        j->act = pdp_model_activation_bytes(m, 0, pdp_model_num_layers(m), b);
    }
    pdp_optim_free(o);
    pdp_ddp_free(d);
    pdp_model_free(m);
    return PDP_OK;
}

/* Bytes rank 0 sends a step by the formulas (ring figures, N = 2): DDP all-reduces the
   gradients, 2(N-1)/N x 4 Psi; TP all-reduces every block's f and g, forward and backward,
   4L x 2(N-1)/N x 4 bsh; SP moves each as a reduce-scatter and an all-gather, (N-1)/N each,
   adds the gather before the head and the one after the embedding (backward), and sums each
   LayerNorm's 2h gradients, (2L + 1) x 2(N-1)/N x 8h. */
static double par_formula(const shape *s, int kind, int64_t psi)
{
    double n = 2.0, bsh = 4.0 * (double)(s->batch * s->seq * s->dim), L = s->layers;
    switch (kind) {
    case P_DDP: return 2.0 * (n - 1) / n * 4.0 * (double)psi;
    case P_TP: return 4.0 * L * 2.0 * (n - 1) / n * bsh;
    case P_TPSP:
        return (8.0 * L + 2.0) * (n - 1) / n * bsh +
               (2.0 * L + 1.0) * 2.0 * (n - 1) / n * 8.0 * (double)s->dim;
    default: return 0.0;
    }
}

static void bench_parallel(const shape *s, int rounds, int reps)
{
    static par_job js[NPAR];
    static double med[NPAR][PAR_ROUNDS], cpu[NPAR][PAR_ROUNDS];
    int64_t n = s->batch * s->seq, i, psi;
    int32_t *ids = malloc((size_t)n * sizeof *ids), *targets = malloc((size_t)n * sizeof *targets);
    double tokens = (double)n, ms[NPAR], cms[NPAR], bytes[2];
    pdp_rng r;
    int p, k;
    if (!ids || !targets) {
        fprintf(stderr, "bench_gpt: out of memory\n");
        exit(1);
    }
    pdp_rng_seed(&r, 7, 0);
    for (i = 0; i < n; i++) {
        ids[i] = (int32_t)pdp_rng_below(&r, (uint64_t)s->vocab);
        targets[i] = (int32_t)pdp_rng_below(&r, (uint64_t)s->vocab);
    }
    for (k = 0; k < rounds; k++) /* each round every configuration, back to back */
        for (p = 0; p < NPAR; p++) {
            par_job *j = &js[p];
            j->s = s, j->kind = p, j->reps = reps, j->ids = ids, j->targets = targets;
            CHECK(pdp_launch(p == P_ONE || p == P_ONE2 ? 1 : 2, NULL, par_rank, j));
            med[p][k] = bench_median(j->ms, reps);
            cpu[p][k] = 1e3 * j->cpu_s / reps;
            fprintf(stderr, "  round %d: %s %.0f ms, %.0f CPU ms\n", k + 1, par_name[p],
                    med[p][k], cpu[p][k]);
        }
    for (p = 0; p < NPAR; p++) {
        ms[p] = bench_median(med[p], rounds);
        cms[p] = bench_median(cpu[p], rounds);
    }
    psi = js[P_ONE].params;
    printf("\nTP 2 beside DDP 2, %s at the same global batch %lld x %lld, fp32, thread ranks of "
           "the local backend, 1 thread a rank; per configuration the median over %d rounds of "
           "the median of %d steps\n", s->name, (long long)s->batch, (long long)s->seq, rounds,
           reps);
    printf("%-12s | %8s %8s %7s %7s | %8s %7s | %10s %10s | %9s %9s %9s\n", "", "ms", "tok/s",
           "/1 dev", "/DDP 2", "CPU ms", "/1 dev", "MB sent", "formula", "params", "state MB",
           "act MB");
    for (p = 0; p < NPAR; p++) {
        const par_job *j = &js[p];
        printf("%-12s | %8.0f %8.0f %6.2fx %6.2fx | %8.0f %6.2fx | %10.2f %10.2f | %9lld %9.1f "
               "%9.1f\n", par_name[p], ms[p], tokens / ms[p] * 1e3, ms[P_ONE] / ms[p],
               ms[P_DDP] / ms[p], cms[p], cms[p] / cms[P_ONE],
               (double)j->sent / reps / 1e6, par_formula(s, p, psi) / 1e6, (long long)j->params,
               16.0 * (double)j->params / 1e6, (double)j->act / 1e6);
    }
    bytes[0] = par_formula(s, P_DDP, psi), bytes[1] = par_formula(s, P_TP, psi);
    printf("ms: a step (forward, loss, backward, DDP's wait, AdamW, zero_grad) on rank 0; tok/s: "
           "the global batch's tokens over it; /1 dev, /DDP 2: their ms over this row's; CPU ms: "
           "the process's CPU time a step, every rank's threads (waits that spin count), /1 dev: "
           "over one device's (the work a configuration adds, less sensitive to a loaded box than "
           "ms); MB sent: "
           "by rank 0 a step (pdp_comm_get_stats), formula: DDP 2(N-1)/N x 4 Psi, TP 4L x "
           "2(N-1)/N x 4bsh, SP (8L + 2) x (N-1)/N x 4bsh + (2L + 1) x 2(N-1)/N x 8h; state: "
           "parameters, gradients, AdamW's m and v, 16 bytes a parameter of the rank; act: "
           "pdp_model_activation_bytes of the rank's batch\n");
    printf("what it teaches: TP trades DDP's gradient all-reduce (4 Psi = %.1f MB, set by the "
           "parameters) for 4 all-reduces of activations a block (4 bsh = %.1f MB each, set by "
           "the tokens): a block's 12 h^2 weights cost DDP 2(N-1)/N x 48 h^2 bytes and TP "
           "2(N-1)/N x 16 bsh, so TP sends less only when b s < 3h (here b s = %lld, 3h = %lld: "
           "TP sends %.2fx DDP's bytes). TP's collectives sit between layers, on the critical "
           "path, and every rank repeats the replicated work (LayerNorms, embedding, head, loss, "
           "their AdamW); DDP's all-reduce overlaps backward. What TP buys is memory: a rank "
           "holds 1/N of the blocks' weights, gradients and AdamW state (state MB), which DDP "
           "replicates (DDP halves the activations, a rank's half batch; TP those inside the "
           "blocks, SP also the LayerNorms' and the residual stream's: act MB), so TP pays off "
           "when the model does not fit one device (and over fast links: Megatron keeps TP "
           "inside a node)\n", bytes[0] / 1e6,
           4.0 * (double)(s->batch * s->seq * s->dim) / 1e6, (long long)(s->batch * s->seq),
           (long long)(3 * s->dim), bytes[1] / bytes[0]);
    free(ids);
    free(targets);
}

int main(int argc, char **argv)
{
    static config cs[NCONF];
    pdp_bf16_path path = pdp_bf16_best_path();
    bool quick = false, peers = true, have_torch, have_llmc, run_shape[NSHAPE] = {true, true}, par = true;
    int rounds, i, r, sh, only = 0; /* only: run just the rows of that many threads */
    double peak32 = 0.0, peak16 = 0.0, t0 = bench_now();
    char cpu[320], buf1[256], buf2[256], llmc_src[1024];
    const char *torch_script = find_script("bench/gpt_torch.py", buf1, sizeof buf1);
    const char *llmc_script = find_script("bench/llmc/gpt_llmc.sh", buf2, sizeof buf2);
    const char *llmc_dir = getenv("PDP_LLMC");
    FILE *f;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "quick")) quick = true;
        else if (!strcmp(argv[i], "pdp")) peers = false;
        else if (!strcmp(argv[i], "1") || !strcmp(argv[i], "2")) only = atoi(argv[i]);
        else if (!strcmp(argv[i], shapes[0].word)) run_shape[1] = par = false;
        else if (!strcmp(argv[i], shapes[1].word)) run_shape[0] = par = false;
        else if (!strcmp(argv[i], "tp")) run_shape[0] = run_shape[1] = false;
        else {
            fprintf(stderr, "usage: bench_gpt [quick] [pdp] [1 | 2] [%s | %s | tp]\n", shapes[0].word,
                    shapes[1].word);
            return 2;
        }
    }
    rounds = quick ? 1 : ROUNDS;
    for (i = 0; i < NCONF; i++) {
        cs[i].s = &shapes[i / NPREC];
        cs[i].bf16 = i % NPREC >= 2;
        cs[i].threads = 1 + i % 2;
    }
    snprintf(llmc_src, sizeof llmc_src, "%s/train_gpt2.c", llmc_dir ? llmc_dir : "");
    have_llmc = peers && llmc_dir && *llmc_dir && llmc_script && (f = fopen(llmc_src, "r"));
    if (have_llmc) fclose(f);

    measure_peaks(path, &peak32, &peak16);
    printf("GPT training step (forward, cross-entropy, backward, AdamW, zero_grad) on %s\n",
           bench_cpu_name(cpu, sizeof cpu));
    printf("peak per core: fp32 FMA %.1f GFLOP/s; bf16 GEMM path %s %.1f GFLOP/s\n", peak32,
           pdp_bf16_path_name(path), peak16);
    printf("peers: PyTorch %s; llm.c %s\n", torch_script ? "bench/gpt_torch.py" : "(no script)",
           have_llmc ? llmc_dir : "not measured (set PDP_LLMC=/path/to/llm.c)");
    bench_print_load("start", 0.0);
    fflush(stdout);
    have_torch = peers && torch_script &&
                 system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
    for (sh = 0; sh < NSHAPE; sh++) { /* a shape's rounds, then the next shape's */
        built b[2] = {{NULL, NULL}, {NULL, NULL}}; /* fp32, bf16 */
        if (!run_shape[sh]) continue;
        for (r = 0; r < rounds; r++) {
            for (i = sh * NPREC; i < (sh + 1) * NPREC; i++) {
                config *c = &cs[i];
                int reps = quick && c->s->reps > 3 ? 3 : c->s->reps;
                if (only && c->threads != only) continue;
                c->ours[r] = bench_ours(c, &b[c->bf16], reps);
                pdp_shutdown_threads(); /* no pdp workers alive while a peer runs */
                if (have_torch) c->torch[r] = bench_torch(c, reps, torch_script);
                if (have_llmc && !c->bf16) c->llmc[r] = bench_llmc(c, reps, llmc_script);
                fprintf(stderr, "  round %d: %s, %s %d thread(s): pdp %.0f ms, pytorch %.0f ms, "
                        "llm.c %.0f ms\n", r + 1, c->s->word, c->bf16 ? "bf16" : "fp32",
                        c->threads, c->ours[r], c->torch[r], c->llmc[r]);
            }
            measure_peaks(path, &peak32, &peak16);
        }
        unbuild(&b[0]);
        unbuild(&b[1]);
    }
    for (i = 0; i < NSHAPE; i++)
        if (run_shape[i]) print_shape(&cs[i * NPREC], rounds, only, peak32, peak16, have_llmc);
    if (par && !only) { /* after the shapes' tables: its own rounds */
        bench_parallel(&shapes[0], quick ? 1 : PAR_ROUNDS, quick ? 3 : shapes[0].reps);
        pdp_shutdown_threads();
    }
    if (run_shape[0] || run_shape[1])
        printf("\nattention: the causal self-attention between c_attn and c_proj (its products, "
               "the softmax); Linear: the blocks' c_attn, c_proj, c_fc, c_proj (GEMMs and bias, and the GELU c_fc applies on the CPU: GELU 0 there); "
               "resid+emb: residual copies and adds, the embedding; head+CE: the tied head's "
               "GEMMs and the cross-entropy; AdamW: step and zero_grad; rest: the bench's loop\n");
    if (!peers)
        printf("peers: not run (pdp)\n");
    else if (!have_torch)
        printf("PyTorch: /usr/bin/python3 cannot import torch (apt-get install python3-torch); "
               "only pdp's figures are shown\n");
    bench_print_load("end", BENCH_OWN_LOAD_1_2);
    printf("%.0f s\n", bench_now() - t0);
    return 0;
}
