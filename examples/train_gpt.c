/* train_gpt.c - train a small GPT on text, byte by byte, under every data-parallel strategy.

   nanoGPT's GPT (gpt.h) on the bytes of Debian's fortunes (apt-get install fortunes), -text
   FILE|DIR or a synthetic text, trained as nanoGPT does by one loop (trainer.h) under every
   -strategy, with -tp N (-sp 1: the sequence too) and -recompute; it prints a block's
   activations, each rank's memory and TP's traffic beside their formulas, then writes text.
   Build:  cc -std=c99 -O2 -march=native -I. examples/train_gpt.c -o train_gpt -lm -lpthread
           nvcc -O2 -arch=sm_90 -DPDP_CUDA -I. examples/train_gpt.c pdp_cuda.cu -o train_gpt_cuda \
               -lcublas -lnccl       (or make build/train_gpt; make cuda: build/cuda/train_gpt)
   Run:    ./train_gpt     (PDP_SHORT=1: a few steps; -prompt "Q: " -temperature 0.6 -top_k 10)
           ./train_gpt -strategy zero3 -np 2 -tp 2 -sp 1 -recompute selective -precision bf16
           ./train_gpt_cuda -device cuda -strategy zero2 -np 2       (a thread per GPU)
           ./train_gpt -accum 4     (nanoGPT's gradient accumulation: 4 batches a step)
   Output: losses, each rank's memory, a sample of text (README.md, "A GPT", shows it all)
   Next:   train_tp.c (each layer split across ranks instead of the batch or the state). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pdp_gpt_desc g = {.vocab = 256, .context = 64, .layers = 4, .heads = 4, .dim = 96};
static int64_t B = 8, steps = 2000, n_new = 500, seed = 1; /* B: the global batch */
static int np = 1, tp = 1, sp = 0, threads = 1, top_k = 40, accum = 1, short_run;
static int strategy, cuda, recompute, bf16; /* -strategy, -device, ...: their choice's index */
static double lr = 3e-3; /* at dim 128, 2e-3 and 4e-3 beat nanoGPT's 1e-3 over 1200 steps */
static double dropout = 0, temperature = 0.8;
static const char *path = PDP_FORTUNES_DIR, *prompt = "The ";

/* Every rank builds the same GPT, draws the same global batch of B windows and trains on its
   slice of B / N: every strategy trains on single's windows, its validation loss single's. */
static pdp_status train_rank(const pdp_launch_ctx *ctx, void *user)
{
    enum { DP, TP }; /* the mesh's dimensions */
    const pdp_token_dataset *ds = user; /* the text, read once, shared by the ranks */
    int n = ctx->world_size / tp; /* the data-parallel size */
    int64_t T = g.context, b = B / n, every = steps >= 20 ? steps / 10 : steps, step;
    int64_t rows = strategy == PDP_STRATEGY_DP ? (B + np - 1) / np : b; /* a replica's batch */
    size_t size = 4096 + strlen(prompt) + (size_t)n_new; /* the reports, then the text */
    int32_t *x = malloc(sizeof *x * (size_t)(2 * B * T)), *y = x + B * T;
    char *text = malloc(size);
    double t_train = 0, loss_sum = 0;
    pdp_model *m;
    pdp_trainer *t;          /* the strategy's executor and its optimizer */
    pdp_tensor *ids;         /* b windows of token ids [b, T] on this rank's device */
    pdp_mesh *mesh = NULL;   /* -tp: DP x TP ranks, {0..tp-1}, {tp..2tp-1}, ... split a block */
    pdp_gpt_desc gd = g;
    pdp_tp_stats ts;
    pdp_zero_memory mm;
    pdp_rng r;
    if (!x || !text) return PDP_ERR_OUT_OF_MEMORY;
    if (tp > 1) /* a communicator along each dimension; without -tp, DP's is the world */
        PDP_TRY(pdp_mesh_create(&mesh, ctx->world, 2, (int[]){n, tp}, NULL));
    pdp_comm *dpc = mesh ? pdp_mesh_group(mesh, DP) : ctx->world; /* DDP's and ZeRO's */
    int rank = pdp_comm_rank(dpc);    /* the data-parallel rank */
    gd.tp = pdp_mesh_group(mesh, TP); /* NULL without -tp */
    gd.device = ctx->device;          /* the CPU, or this rank's GPU */
    PDP_TRY(pdp_gpt_desc_format(&gd, text, size)); /* its sizes, parameters, TP, precision */
    if (ctx->rank == 0)
        printf("%s; batch %lld x %d accumulated, AdamW lr %g, %d thread(s), %s x %d%s\n", text,
               (long long)B, accum, lr, threads, pdp_strategy_name((pdp_strategy)strategy), np,
               cuda ? " on CUDA" : "");
    PDP_TRY(pdp_gpt_create(&m, &gd));
    PDP_TRY(pdp_tensor_create_ids(&ids, ctx->device, 2, (int64_t[]){b, T}));
    PDP_TRY(pdp_model_reserve(m, rows)); /* activations for its sequences: steps allocate none */
    PDP_TRY(pdp_gpt_activation_report(m, &gd, rows, text, size, NULL));
    if (ctx->rank == 0) printf("%s", text);
    PDP_TRY(pdp_trainer_create(&t, m, &(pdp_trainer_desc){ /* DDP, ZeRO: over the DP ranks */
        .strategy = (pdp_strategy)strategy, .comm = strategy >= PDP_STRATEGY_DDP ? dpc : NULL,
        .optim = {.kind = PDP_OPTIM_ADAMW, .lr = lr, .beta1 = 0.9, .beta2 = 0.95, /* nanoGPT's: */
                  .weight_decay = 0.1, .decay_params = PDP_DECAY_MATRICES}, /* biases, LN: 0 */
        /* DP: np workers (cuda: GPUs); ZeRO: units of 0.25 MiB */
        .dp = {.num_workers = np}, .zero = {.bucket_cap_mb = 0.25, .first_bucket_mb = 0.25},
        .accum_steps = accum}));

    pdp_rng_seed(&r, (uint64_t)seed, 0);
    for (step = 0; step < steps; step++) { /* the same loop for every strategy */
        double t0 = pdp_seconds();
        float loss, val;
        PDP_TRY(pdp_optim_set_lr(pdp_trainer_optim(t),
                                 pdp_lr_warmup_cosine(step, steps / 20, steps, lr, lr / 10)));
        for (int j = 0; j < accum; j++) { /* -accum: micro-batches, their gradients averaged */
            PDP_TRY(pdp_token_dataset_sample(ds, PDP_SPLIT_TRAIN, &r, B, x, y)); /* global batch */
            PDP_TRY(pdp_tensor_upload(ids, x + rank * b * T)); /* this rank's slice (DP: all) */
            PDP_TRY(pdp_trainer_forward_backward(t, ids, y + rank * b * T, &loss));
            loss_sum += loss / accum;
        }
        PDP_TRY(pdp_trainer_clip_grad_norm(t, 1.0f, NULL)); /* once DDP, ZeRO have averaged */
        PDP_TRY(pdp_trainer_step(t)); /* AdamW (ZeRO: this rank's shard, then all-gathers) */
        t_train += pdp_seconds() - t0;
        if (step == 0) pdp_tp_get_stats(m, &ts); /* TP: every step sends the same; no eval yet */
        if ((step + 1) % every && step + 1 < steps) continue; /* a line every tenth */
        /* the same validation windows every time; every rank: collective under ZeRO-3 */
        PDP_TRY(pdp_gpt_evaluate(m, ds, PDP_SPLIT_VAL, b, (short_run ? 1 : 8) * n, 1234, &val));
        if (ctx->rank == 0)
            printf("step %5lld  loss %.4f (mean of %d steps)  val %.4f  %.0f tokens/s  %.1f s\n",
                   (long long)step + 1, loss_sum / (step % every + 1), (int)(step % every + 1),
                   val, (step + 1) * B * T * accum / t_train, t_train);
        fflush(stdout);
        loss_sum = 0;
    }

    /* this rank's memory beside ZeRO's formulas (DP's workers, threads of one rank: their own) */
    PDP_TRY(pdp_trainer_memory_report(t, rows, text, size));
    PDP_TRY(pdp_print_by_rank(ctx->world, "rank %d: %s", ctx->rank, text));
    PDP_TRY(pdp_trainer_get_memory(t, &mm)); /* the formulas for every stage, below */
    if (ctx->rank == 0 && tp > 1) { /* a step's TP traffic beside its formula */
        PDP_TRY(pdp_gpt_tp_report(&gd, b, &ts, text, size, NULL));
        printf("%s", text);
    }
    if (ctx->rank == 0 && n > 1 && pdp_zero_memory_format(&mm, text, size) > 0)
        printf("%s(the losses above: rank 0's, on its slice of each batch; validation: single's\n"
               " windows, its figures single's up to the rounding of sums in another order;\n"
               " activations shrink with the slice and -recompute, ZeRO shards the rest%s)\n",
               text, tp > 1 ? ";\n Psi: one TP rank's parameters, 1/tp of each split layer" : "");
    PDP_TRY(pdp_trainer_gather_params(t)); /* ZeRO-3: the full parameters back, */
    pdp_trainer_free(t);                   /* so m is a whole model again */
    pdp_rng_seed(&r, (uint64_t)seed, 1);
    if (rank == 0) /* by every TP rank of the first copy: each forward is collective */
        PDP_TRY(pdp_gpt_generate_text(m, prompt, n_new, (float)temperature, top_k, &r, text, size));
    if (ctx->rank == 0)
        printf("sample (temperature %g, top-k %d, seed %lld):\n%s\n", temperature, top_k,
               (long long)seed, text);
    pdp_model_free(m);
    pdp_tensor_free(ids);
    pdp_mesh_free(mesh);
    free(text);
    free(x);
    return PDP_OK;
}

int main(int argc, char **argv)
{
    const pdp_arg args[] = { /* option, type, variable (its default), min, max, choices */
        {"-strategy", PDP_ARG_CHOICE, &strategy, 0, 0, "single|dp|ddp|zero1|zero2|zero3"},
        {"-np", PDP_ARG_INT, &np, 1, 64, NULL}, /* DP's workers, or thread ranks */
        {"-tp", PDP_ARG_INT, &tp, 1, 64, NULL}, /* thread ranks splitting each block */
        {"-sp", PDP_ARG_INT, &sp, 0, 1, NULL},  /* 1: sequence parallelism (with -tp) */
        {"-device", PDP_ARG_CHOICE, &cuda, 0, 0, "cpu|cuda"}, /* cuda: a thread per GPU */
        {"-recompute", PDP_ARG_CHOICE, &recompute, 0, 0, "none|selective|full"},
        {"-precision", PDP_ARG_CHOICE, &bf16, 0, 0, "fp32|bf16"},
        {"-steps", PDP_ARG_INT64, &steps, 1, 1e9, NULL},
        {"-batch", PDP_ARG_INT64, &B, 1, 1 << 20, NULL}, /* global: at least 1 per rank */
        {"-accum", PDP_ARG_INT, &accum, 1, 1024, NULL}, /* batches a step (each -batch) */
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
    pdp_token_dataset *ds;
    short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT"));
    if (short_run) steps = 10, n_new = 40; /* -steps, -tokens override */
    pdp_args_parse_or_exit(argc, argv, args, sizeof args / sizeof args[0]); /* -h: usage */
    int ranks = strategy >= PDP_STRATEGY_DDP ? np : 1; /* DP: np workers, one rank */
    const char *bad = strategy == PDP_STRATEGY_SINGLE && np > 1 ? "-np needs -strategy dp, ddp "
                      "or zero1-3" : B % ranks ? "-batch must divide by -np" : !prompt[0]
                      ? "-prompt is empty" : tp > 1 && strategy == PDP_STRATEGY_DP
                      ? "-tp goes with single, ddp or zero1-3" : sp && tp < 2
                      ? "-sp 1 needs -tp 2 or more" : NULL;
    if (bad) return fprintf(stderr, "%s\n", bad), 2;
    PDP_CHECK(pdp_set_num_threads(threads));
    g.dropout = (float)dropout, g.seed = (uint64_t)seed, g.sequence_parallel = sp;
    g.precision = (pdp_precision)bf16, g.recompute = (pdp_recompute)recompute; /* in order */
    /* the text: fortunes by default, the synthetic text when they are not installed */
    PDP_CHECK(pdp_token_dataset_load(&ds, path, &(pdp_token_dataset_desc){.context = g.context,
        .seed = (uint64_t)seed, .synthetic_fallback = !strcmp(path, PDP_FORTUNES_DIR)}));
    printf("seed %lld: %s, %lld bytes (the last %lld validate)\n", (long long)seed, ds->source,
           (long long)ds->count, (long long)(ds->count - ds->split_at));
    fflush(stdout); /* before the ranks print, and before an error on stderr */
    pdp_launch_desc ld = {.backend = cuda ? PDP_BACKEND_NCCL : PDP_BACKEND_LOCAL};
    PDP_CHECK(pdp_launch(ranks * tp, &ld, train_rank, ds)); /* single and DP: one rank */
    pdp_token_dataset_free(ds);
    return 0;
}
