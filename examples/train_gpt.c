/* train_gpt.c - train a small GPT on text, byte by byte, on one core or on several ranks.

   nanoGPT's GPT (gpt.h) over the 256 byte values, trained as nanoGPT does: windows of T + 1
   bytes drawn at random, AdamW (betas 0.9, 0.95, weight decay 0.1), warm-up then cosine
   decay, gradients clipped to norm 1, lr 3e-3 (at dim 128, 2e-3 and 4e-3 each reached a
   lower validation loss than nanoGPT's 1e-3 in 1200 steps). The text: Debian's fortunes
   (apt-get install fortunes), -text FILE|DIR, or pdp's synthetic text. -strategy
   dp|ddp|zero1|zero2|zero3 trains the same global batches on -np DP workers or thread
   ranks; -tp N splits each block over N more ranks (by heads), -sp 1 adds sequence
   parallelism, -recompute selective|full trades compute for activation memory, -device
   cuda trains on GPUs (dp from one thread, the others a thread rank per GPU over NCCL). It
   prints one block's activations beside Megatron-LM's formulas, the losses, each rank's
   memory beside ZeRO's (and which stage saves what), TP's traffic beside its formula, text.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_gpt.c -o train_gpt -lm -lpthread
           nvcc -O2 -arch=sm_90 -DPDP_CUDA -I. examples/train_gpt.c pdp_cuda.cu -o train_gpt_cuda \
               -lcublas -lnccl       (or make build/train_gpt; make cuda: build/cuda/train_gpt)
   Run:    ./train_gpt                       (PDP_SHORT=1 for a few steps only)
           ./train_gpt -steps 5000 -dim 128 -batch 16 -dropout 0.1 -text my_text.txt
           ./train_gpt -strategy zero3 -np 2 -recompute selective
           ./train_gpt -strategy ddp -np 2 -tp 2 -sp 1 (4 thread ranks: 2 TP pairs)
           ./train_gpt_cuda -device cuda -strategy zero2 -np 2       (a thread per GPU)
           ./train_gpt -precision bf16 -prompt "Q: " -temperature 0.6 -top_k 10 -seed 2
   Output (Intel Xeon, Sapphire Rapids class, one thread, fortunes installed; speed columns
   left out, they change with the machine and its load):
           seed 1: /usr/share/games/fortunes (43 files), 2576674 bytes (the last 257668 ...
           GPT 4 layers, 4 heads, dim 96, context 64: 478272 parameters; batch 8, AdamW ...
           one block's activations (layers 1-12), s 64 b 8 h 96 a 4, TP 1: bytes per sbh, MB
             none       34 + 5as/h            47.33   2.33   64 + 4as/h            74.67   3.67
             ...     = 82.83, 4.07 MB (pdp_model_activation_bytes)
           step  2000  loss 2.1029  val 2.1019  ...
           rank 0: parameters 1.91 MB (4Psi 1.91), gradients 1.91 (4Psi 1.91), ...
           The garning the the love Spuate mones of never bastion and Sindes pustalliataie ...
   Next:   train_tp.c (each layer split across ranks instead of the batch or the state). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MB(bytes) ((double)(bytes) / 1e6) /* as pdp_zero_memory_format */

static pdp_gpt_desc g = {.vocab = 256, .context = 64, .layers = 4, .heads = 4, .dim = 96};
static int64_t B = 8, steps = 2000, n_new = 500, seed = 1; /* B: the global batch */
static int np = 1, threads = 1, top_k = 40, stage = -1;    /* stage: ZeRO's, -1 without */
static int tp = 1, sp = 0;                                 /* TP ranks, sequence parallel */
static double lr = 3e-3, dropout = 0, temperature = 0.8;
static const char *strategy = "single", *recompute = "none", *precision = "fp32",
                  *path = PDP_FORTUNES_DIR, *prompt = "The ", *device = "cpu";
static bool short_run, cuda; /* cuda: -device cuda */
static pdp_token_dataset *ds;
static pdp_tp_stats last_step; /* rank 0's TP traffic, the last step */

/* This rank's memory beside the formula: ZeRO's as allocated, a whole replica's (single,
   DDP) as ZeRO's stage 0 plans it; stage s shards the optimizer state (s >= 1), the gradients
   (s >= 2) and the parameters (s = 3). Then rank 0 prints ZeRO's table: every stage at this
   N, and why it saves or not at this size. DP's workers are threads of one rank. */
static pdp_status print_memory(const pdp_launch_ctx *ctx, pdp_model *m, const pdp_gpt_desc *gd,
                               pdp_zero *z, pdp_dp *dp, pdp_optim *opt, int64_t b)
{
    int n = ctx->world_size / tp; /* the data-parallel ranks */
    int64_t act = pdp_model_activation_bytes(m, 0, pdp_model_num_layers(m), b);
    double P4 = 4.0 * (double)pdp_model_param_count(m); /* 4 Psi bytes */
    char report[2048];
    pdp_zero_memory mm;
    pdp_dp_stats st;
    if (dp) {
        PDP_TRY(pdp_dp_get_stats(dp, &st));
        printf("DP, %d workers: the master holds %.2f MB (parameters, gradients, AdamW's state, "
               "its activations,\n  the gathered outputs), each other worker %.2f MB: DP saves "
               "nothing and overloads worker 0\n", np, MB(st.master_bytes), MB(st.replica_bytes));
        return PDP_OK;
    }
    PDP_TRY(z ? pdp_zero_get_memory(z, opt, &mm) : pdp_zero_memory_plan(m, n, 0, NULL, opt, &mm));
    PDP_TRY(pdp_print_by_rank(ctx->world, "rank %d: parameters %.2f MB (4Psi%s %.2f), gradients "
            "%.2f (4Psi%s %.2f), AdamW's m, v %.2f (8Psi%s %.2f),\n  activations %.2f (%lld "
            "sequences), buffers %.2f (at most %.2f): %.2f MB\n", ctx->rank,
            MB(mm.param_bytes), stage >= 3 ? "/N" : "", MB(P4 / (stage >= 3 ? n : 1)),
            MB(mm.grad_bytes), stage >= 2 ? "/N" : "", MB(P4 / (stage >= 2 ? n : 1)),
            MB(mm.optim_bytes), stage >= 1 ? "/N" : "", MB(2 * P4 / (stage >= 1 ? n : 1)),
            MB(act), (long long)b, MB(mm.buffer_bytes), MB(mm.buffer_bound),
            MB(mm.total_bytes + act)));
    if (ctx->rank > 0) return PDP_OK;
    if (tp > 1) PDP_TRY(pdp_gpt_tp_report(gd, b, &last_step, report, sizeof report, NULL));
    if (tp > 1) printf("%s", report); /* the last step's TP traffic beside the formula */
    if (n == 1) return PDP_OK;
    pdp_zero_memory_format(&mm, report, sizeof report);
    printf("%s(the losses above are rank 0's, over its slice of each global batch; the "
           "validation losses are\n single's. Activations shrink with the slice, under DDP "
           "and ZeRO alike, and with -recompute;\n ZeRO shards the rest)\n", report);
    return PDP_OK;
}

/* Every rank builds the same GPT (DDP and ZeRO start every rank from rank 0's anyway) and
   draws the same global batch of B windows from the same stream, then trains on its slice of
   B / N windows: so every strategy trains on the windows single does, and its validation loss
   equals single's to float rounding (a DistributedSampler would do the same over an epoch of
   fixed windows; nanoGPT draws windows at random). */
static pdp_status train_rank(const pdp_launch_ctx *ctx, void *user)
{
    int rank = ctx->rank / tp, n = ctx->world_size / tp; /* the data-parallel rank and size */
    int64_t T = g.context, b = B / n, every = steps >= 20 ? steps / 10 : steps, step, i;
    int64_t len = (int64_t)strlen(prompt), shape[2] = {b, T};
    double t_train = 0, loss_sum = 0;
    int32_t *x = malloc(sizeof *x * (size_t)(2 * B * T + len + n_new)), *y = x + B * T;
    pdp_tensor *dx = NULL; /* on a GPU: the ids of b windows */
    pdp_device gpus[64];   /* DP's workers on GPUs: 0, 1, ..., np - 1 */
    pdp_model *m;
    pdp_optim *opt;
    pdp_dp *dp = NULL;
    pdp_ddp *ddp = NULL;
    pdp_zero *z = NULL;
    pdp_comm *tpc = NULL, *dpc = ctx->world;
    pdp_gpt_desc gd = g;
    pdp_rng r;
    char report[4096];
    (void)user;
    if (!x) return PDP_ERR_OUT_OF_MEMORY;
    if (tp > 1) { /* ranks {0..tp-1}, {tp..2tp-1}, ... split each block; across them, DP */
        PDP_TRY(pdp_comm_split(ctx->world, rank, ctx->rank, &tpc));
        PDP_TRY(pdp_comm_split(ctx->world, ctx->rank % tp, ctx->rank, &dpc));
        gd.tp = tpc;
    }
    gd.sequence_parallel = sp; /* without -tp: pdp_gpt_create says what is missing */
    gd.device = ctx->device;   /* the CPU, or this rank's GPU */
    PDP_TRY(pdp_gpt_create(&m, &gd));
    if (cuda) PDP_TRY(pdp_tensor_create(&dx, ctx->device, 1, (int64_t[]){b * T}));
    for (i = 0; i < np; i++) gpus[i] = pdp_cuda((int)i);
    PDP_TRY(pdp_model_reserve(m, b)); /* activations for b sequences: steps allocate nothing */
    PDP_TRY(pdp_gpt_activation_report(m, &gd, b, report, sizeof report, NULL));
    if (ctx->rank == 0) printf("%s", report);
    pdp_optim_desc od = {.kind = PDP_OPTIM_ADAMW, .lr = lr, .beta1 = 0.9, .beta2 = 0.95,
                         .weight_decay = 0.1};
    if (!strcmp(strategy, "dp"))
        PDP_TRY(pdp_dp_create(&dp, m, &(pdp_dp_desc){.num_workers = np, /* B split in np */
                                                     .devices = cuda ? gpus : NULL}));
    if (!strcmp(strategy, "ddp")) PDP_TRY(pdp_ddp_create(&ddp, m, dpc, NULL));
    pdp_zero_desc zd = {.stage = stage, .bucket_cap_mb = 0.25, .first_bucket_mb = 0.25};
    if (stage > 0) PDP_TRY(pdp_zero_create(&z, m, dpc, &zd)); /* units of whole layers */
    PDP_TRY(z ? pdp_zero_optim_create(&opt, z, &od) : pdp_optim_create(&opt, m, &od));

    pdp_rng_seed(&r, (uint64_t)seed, 0);
    for (step = 0; step < steps; step++) {
        double t0 = pdp_seconds();
        pdp_tensor ids, host;
        float loss, val;
        if (step == steps - 1) pdp_tp_reset_stats(m); /* the last step's TP traffic */
        PDP_TRY(pdp_optim_set_lr(opt, pdp_lr_warmup_cosine(step, steps / 20, steps, lr, lr / 10)));
        PDP_TRY(pdp_token_dataset_sample(ds, PDP_SPLIT_TRAIN, &r, B, x, y)); /* the global batch */
        PDP_TRY(pdp_tensor_wrap_ids(x + rank * b * T, pdp_cpu(), 2, shape, dx ? &host : &ids));
        if (dx) { /* on a GPU: the slice's ids into dx's buffer */
            PDP_TRY(pdp_tensor_wrap_ids((int32_t *)(void *)dx->data, dx->device, 2, shape, &ids));
            PDP_TRY(pdp_tensor_copy(&ids, &host));
        }
        const int32_t *yr = y + rank * b * T; /* the slice's targets, a label a position */
        if (dp) PDP_TRY(pdp_dp_forward_backward(dp, &ids, yr, &loss)); /* split over workers */
        else if (ddp) PDP_TRY(pdp_ddp_forward_backward(ddp, &ids, yr, &loss));
        else if (z) PDP_TRY(pdp_zero_forward_backward(z, &ids, yr, &loss));
        else PDP_TRY(pdp_model_forward_backward(m, &ids, yr, &loss));
        if (ddp) PDP_TRY(pdp_ddp_finish(ddp)); /* the gradients averaged over the ranks */
        if (z) PDP_TRY(pdp_zero_finish(z));    /* this rank's shard of them */
        PDP_TRY(z ? pdp_zero_clip_grad_norm(z, 1.0f, NULL) : pdp_clip_grad_norm(m, 1.0f, NULL));
        PDP_TRY(z ? pdp_zero_step(z, opt) : pdp_optim_step(opt)); /* ZeRO 1-2 all-gather */
        if (!z) pdp_optim_zero_grad(opt); /* pdp_zero_step zeroes its own */
        t_train += pdp_seconds() - t0;
        if (step == steps - 1 && ctx->rank == 0) pdp_tp_get_stats(m, &last_step);
        loss_sum += loss;
        if ((step + 1) % every && step + 1 < steps) continue; /* a line every tenth */
        /* the same validation windows every time; every rank: collective under ZeRO-3 */
        PDP_TRY(pdp_gpt_evaluate(m, ds, PDP_SPLIT_VAL, b, (short_run ? 1 : 8) * n, 1234, &val));
        if (ctx->rank == 0)
            printf("step %5lld  loss %.4f  val %.4f  %.0f tokens/s  %.1f s\n", (long long)step + 1,
                   loss_sum / (double)(step % every + 1), val,
                   (double)((step + 1) * B * T) / t_train, t_train);
        fflush(stdout);
        loss_sum = 0;
    }

    PDP_TRY(print_memory(ctx, m, &gd, z, dp, opt, b));
    if (z) PDP_TRY(pdp_zero_gather_params(z, NULL)); /* ZeRO-3: the full parameters back */
    pdp_zero_free(z);
    pdp_ddp_free(ddp);
    pdp_dp_free(dp);
    if (rank == 0) { /* write: the prompt's bytes, then n_new bytes drawn one at a time (by
                        every TP rank of the first copy: each forward is collective) */
        int32_t *text = y + B * T;
        for (i = 0; i < len; i++) text[i] = (unsigned char)prompt[i];
        pdp_rng_seed(&r, (uint64_t)seed, 1);
        PDP_TRY(pdp_gpt_generate(m, text, len, n_new, (float)temperature, top_k, &r));
    }
    if (ctx->rank == 0) {
        int32_t *text = y + B * T;
        printf("sample (temperature %g, top-k %d, seed %lld):\n", temperature, top_k,
               (long long)seed);
        for (i = 0; i < len + n_new; i++) /* bytes as text; a control byte as '?' */
            putchar(text[i] == '\n' || text[i] == '\t' || (text[i] >= 32 && text[i] != 127)
                    ? text[i] : '?');
        putchar('\n');
    }
    free(x);
    pdp_tensor_free(dx);
    pdp_optim_free(opt);
    pdp_model_free(m);
    if (tpc) pdp_comm_free(dpc);
    pdp_comm_free(tpc);
    return PDP_OK;
}

int main(int argc, char **argv)
{
    const pdp_arg args[] = { /* option, type, variable (its default), min, max, choices */
        {"-strategy", PDP_ARG_STRING, &strategy, 0, 0, "single|dp|ddp|zero1|zero2|zero3"},
        {"-np", PDP_ARG_INT, &np, 1, 64, NULL}, /* DP's workers, or thread ranks */
        {"-tp", PDP_ARG_INT, &tp, 1, 64, NULL}, /* thread ranks splitting each block */
        {"-sp", PDP_ARG_INT, &sp, 0, 1, NULL},  /* 1: sequence parallelism (with -tp) */
        {"-device", PDP_ARG_STRING, &device, 0, 0, "cpu|cuda"},
        {"-recompute", PDP_ARG_STRING, &recompute, 0, 0, "none|selective|full"},
        {"-precision", PDP_ARG_STRING, &precision, 0, 0, "fp32|bf16"},
        {"-steps", PDP_ARG_INT64, &steps, 1, 1e9, NULL},
        {"-batch", PDP_ARG_INT64, &B, 1, 1 << 20, NULL}, /* global: at least 1 per rank */
        {"-context", PDP_ARG_INT64, &g.context, 1, 1 << 16, NULL},
        {"-layers", PDP_ARG_INT, &g.layers, 1, 1000, NULL},
        {"-heads", PDP_ARG_INT, &g.heads, 1, 1000, NULL},
        {"-dim", PDP_ARG_INT64, &g.dim, 1, 1 << 16, NULL},
        {"-dropout", PDP_ARG_DOUBLE, &dropout, 0, 0.99, NULL},
        {"-lr", PDP_ARG_DOUBLE, &lr, 1e-9, 10, NULL},
        {"-threads", PDP_ARG_INT, &threads, 1, 256, NULL}, /* rank 0's intra-op threads */
        {"-seed", PDP_ARG_INT64, &seed, 0, 1e18, NULL},
        {"-text", PDP_ARG_STRING, &path, 0, 0, NULL}, /* a file or a directory */
        {"-prompt", PDP_ARG_STRING, &prompt, 0, 0, NULL},
        {"-tokens", PDP_ARG_INT64, &n_new, 0, 1e6, NULL},
        {"-temperature", PDP_ARG_DOUBLE, &temperature, 0, 100, NULL},
        {"-top_k", PDP_ARG_INT, &top_k, 0, 256, NULL},
    };
    pdp_launch_desc ld = {0};
    pdp_model *m;
    PDP_CHECK(pdp_args_parse(argc, argv, args, sizeof args / sizeof args[0]));
    short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    if (short_run) steps = 10, n_new = 40;
    if (!strncmp(strategy, "zero", 4)) stage = strategy[4] - '0';
    if (!strcmp(strategy, "single")) np = 1;
    int ranks = !strcmp(strategy, "ddp") || stage > 0 ? np : 1; /* DP: np workers, one rank */
    if (B % ranks || !prompt[0] || (tp > 1 && !strcmp(strategy, "dp"))) {
        fprintf(stderr, "-batch %lld must divide by the %d ranks, the prompt be nonempty, -tp "
                "go with single, ddp or zero\n", (long long)B, ranks);
        return 2;
    }
    cuda = !strcmp(device, "cuda");
    if (cuda) ld.backend = PDP_BACKEND_NCCL; /* a thread per GPU: ctx->device is its GPU */
    PDP_CHECK(pdp_set_num_threads(threads));
    g.dropout = (float)dropout;
    g.seed = (uint64_t)seed;
    g.precision = strcmp(precision, "bf16") ? PDP_PRECISION_FP32 : PDP_PRECISION_BF16;
    g.recompute = !strcmp(recompute, "full")        ? PDP_RECOMPUTE_FULL
                  : !strcmp(recompute, "selective") ? PDP_RECOMPUTE_SELECTIVE : PDP_RECOMPUTE_NONE;

    /* the text: fortunes by default, the synthetic text when they are not installed */
    pdp_token_dataset_desc td = {.context = g.context, .seed = (uint64_t)seed,
                                 .synthetic_fallback = !strcmp(path, PDP_FORTUNES_DIR)};
    PDP_CHECK(pdp_token_dataset_load(&ds, path, &td));
    PDP_CHECK(pdp_gpt_create(&m, &g)); /* to print its size: each rank builds its own */
    printf("seed %lld: %s, %lld bytes (the last %lld validate)\n", (long long)seed, ds->source,
           (long long)ds->count, (long long)(ds->count - ds->split_at));
    printf("GPT %d layers, %d heads, dim %lld, context %lld: %lld parameters; batch %lld, AdamW "
           "lr %g, %d thread(s), %s x %d%s, TP %d%s, recompute %s%s%s\n", g.layers, g.heads,
           (long long)g.dim, (long long)g.context, (long long)pdp_model_param_count(m),
           (long long)B, lr, threads, strategy, np, cuda ? " on CUDA" : "", tp, sp ? " + SP" : "",
           recompute, g.precision ? ", bf16 " : "",
           g.precision ? pdp_bf16_path_name(pdp_bf16_best_path()) : "");
    pdp_model_free(m);
    fflush(stdout);
    PDP_CHECK(pdp_launch(ranks * tp, &ld, train_rank, NULL)); /* single and DP: one rank */
    pdp_token_dataset_free(ds);
    return 0;
}
