/* train_gpt.c - train a small GPT on text, byte by byte, on one core or on several ranks.

   The model is nanoGPT's GPT (gpt.h: pre-LayerNorm blocks of causal self-attention and a 4x
   GELU MLP, each a residual region; the head tied to the token embedding) over the 256 byte
   values. The text is Debian's fortunes (apt-get install fortunes), -text FILE|DIR, or pdp's
   synthetic text (the first line says which). Training is nanoGPT's: windows of T + 1 bytes
   drawn at random, AdamW (betas 0.9, 0.95, weight decay 0.1), warm-up then cosine decay,
   gradients clipped to norm 1, lr 3e-3 (at dim 128, 2e-3 and 4e-3 each reached a lower
   validation loss than nanoGPT's 1e-3 in 1200 steps). -strategy dp|ddp|zero1|zero2|zero3
   trains the same global batches on -np DP workers or thread ranks; -tp N splits each
   block over N more ranks (attention by heads, tp.h), -sp 1 adds sequence parallelism
   (gpt.h: the layers between the blocks hold T / N positions); -recompute
   selective|full trades compute for activation memory; -device cuda trains on GPUs
   (pdp_cuda.cu's kernels): single on GPU 0, dp on -np GPUs from one thread, ddp and zero
   and -tp on a thread rank per GPU over NCCL (a CPU copy of the model writes the text). It prints
   one block's activations on rank 0, layer by layer from pdp's layer table, beside Megatron-LM's
   formulas for the run's TP size and SP (each recomputation mode, at 16 bits and in fp32), the
   losses, each rank's memory beside the formulas (and, on several ranks, which ZeRO stage
   saves what), and text. It fails when the layer table's count of a block differs from
   pdp's count by hand (print_block).

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
           one block's activations (layers 1-12 of rank 0), s 64 b 8 h 96 a 4, TP 1: bytes ...
             none       34 + 5as/h            47.33   2.33   64 + 4as/h            74.67   3.67
             ...
             pdp, recompute none, the layer table:
               LayerNorm 4.08 Linear 12.00 CausalSelfAttention 14.67 Linear 4.00 ResidualAdd 4.00
               ...
               = 82.83, 4.07 MB (pdp_model_activation_bytes)
           step  2000  loss 2.1029  val 2.1019  ...
           rank 0: parameters 1.91 MB (4Psi 1.91), gradients 1.91 (4Psi 1.91), ...
           The garning the the love Spuate mones of never bastion and Sindes pustalliataie ...
   Next:   train_tp.c (each layer split across ranks instead of the batch or the state). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MB(bytes) ((double)(bytes) / 1e6) /* as pdp_zero_memory_format */

static pdp_gpt_desc g = {.vocab = 256, .context = 64, .layers = 4, .heads = 4, .dim = 96};
static int64_t B = 8, steps = 2000, n_new = 500, seed = 1; /* B: the global batch */
static int np = 1, threads = 1, top_k = 40, stage = -1;    /* stage: ZeRO's, -1 without */
static int tp = 1, sp = 0;                                 /* TP ranks, sequence parallel */
static pdp_tp_stats last_step;                             /* rank 0's TP traffic, last step */
static double lr = 3e-3, dropout = 0, temperature = 0.8;
static const char *strategy = "single", *recompute = "none", *precision = "fp32",
                  *path = PDP_FORTUNES_DIR, *prompt = "The ";
static const char *device = "cpu";
static bool short_run, cuda; /* cuda: -device cuda */
static pdp_token_dataset *ds;

/* The ids of the b windows at x as the model's input: a view of x, or on a GPU of dx (its
   buffer of b T ids, which pdp_tensor_copy fills, dtype and all). */
static pdp_status input_ids(int32_t *x, int64_t b, pdp_tensor *dx, pdp_tensor *ids)
{
    int64_t shape[2] = {b, g.context};
    pdp_tensor host;
    PDP_TRY(pdp_tensor_wrap_ids(x, pdp_cpu(), 2, shape, dx ? &host : ids));
    if (!dx) return PDP_OK;
    PDP_TRY(pdp_tensor_wrap_ids((int32_t *)(void *)dx->data, dx->device, 2, shape, ids));
    return pdp_tensor_copy(ids, &host);
}

/* The mean loss over the same validation windows every time (a fixed seed), batches of b
   windows, with the model in evaluation mode: no dropout. On a GPU the logits come back to
   host (b T vocab floats) for the loss. */
static pdp_status val_loss(pdp_model *m, int64_t b, int batches, int32_t *x, int32_t *y,
                           pdp_tensor *dx, float *host_logits, float *out)
{
    double sum = 0;
    pdp_rng r;
    int k;
    pdp_rng_seed(&r, 1234, 0);
    pdp_model_set_training(m, false);
    for (k = 0; k < batches; k++) {
        pdp_tensor ids, logits2d, back;
        const pdp_tensor *logits;
        float loss;
        PDP_TRY(pdp_token_dataset_sample(ds, PDP_SPLIT_VAL, &r, b, x, y));
        PDP_TRY(input_ids(x, b, dx, &ids));
        PDP_TRY(pdp_model_forward(m, &ids, &logits)); /* [b, T, V]; ZeRO-3: collective */
        if (dx) { /* on a GPU: back to the host */
            PDP_TRY(pdp_tensor_download(logits, host_logits));
            PDP_TRY(pdp_tensor_wrap(host_logits, pdp_cpu(), logits->ndim, logits->shape, &back));
            logits = &back;
        }
        PDP_TRY(pdp_tensor_reshape_view(logits, 2, (int64_t[]){b * g.context, g.vocab},
                                        &logits2d));
        PDP_TRY(pdp_loss_cross_entropy(&logits2d, y, &loss, NULL)); /* over b T positions */
        sum += loss;
    }
    pdp_model_set_training(m, true);
    *out = (float)(sum / batches);
    return PDP_OK;
}

/* Megatron-LM's tensors of one transformer layer (Korthikanti et al. 2022, "Reducing
   Activation Recomputation in Large Transformer Models", sec. 4): bytes per s b h at 16 bits
   (masks 1 byte; per a s s b for the attention scores'). TP splits the block's inside
   (split), sequence parallelism the rest too; selective recomputation drops the scores'; the
   masks and the dropped scores exist only with dropout (Megatron's count assumes it). */
static const struct meg_tensor {
    const char *what;
    double bytes;
    bool split, scores, mask, dropped;
} meg[] = {{"LayerNorms' inputs", 4, 0, 0, 0, 0}, {"inputs of QKV and c_fc", 4, 0, 0, 0, 0},
           {"2 dropout masks", 2, 0, 0, 1, 0},    {"Q, K, V", 6, 1, 0, 0, 0},
           {"c_proj's input", 2, 1, 0, 0, 0},     {"GELU's input and output", 16, 1, 0, 0, 0},
           {"softmax output", 2, 1, 1, 0, 0},     {"its dropout mask", 1, 1, 1, 1, 0},
           {"dropped scores", 2, 1, 1, 0, 1}};

static void term(char *buf, size_t size, double c, const char *unit)
{
    size_t n = strlen(buf);
    if (c > 0) snprintf(buf + n, size - n, "%s%g%s", n ? " + " : "", c, unit);
}

/* Megatron's count of a layer in recomputation mode (0 none, 1 selective, 2 full: the
   layer's input, 2 in the paper's Table 2; under SP a rank holds its slice, 2/t), at 16 bits
   or (fp32) the same tensors at 4 bytes, masks 1 byte, masks and dropped scores only when
   g.dropout > 0: its formula in bytes per sbh into buf, its value at s, h, a, t as the
   result. */
static double megatron(int mode, bool fp32, bool sp, double s, double h, double a, double t,
                       char *buf, size_t size)
{
    double rep = 0, split = 0, sc = 0;
    size_t i;
    for (i = 0; i < sizeof meg / sizeof meg[0] && mode < 2; i++)
        if (!(fp32 && (meg[i].mask || meg[i].dropped) && g.dropout == 0) &&
            !(mode == 1 && meg[i].scores))
            *(meg[i].scores ? &sc : meg[i].split || sp ? &split : &rep) +=
                meg[i].bytes * (fp32 && !meg[i].mask ? 2 : 1);
    if (mode == 2) *(sp ? &split : &rep) = fp32 ? 4 : 2;
    if (t == 1) rep += split, split = 0;
    buf[0] = '\0';
    term(buf, size, rep, "");
    term(buf, size, split, "/t");
    term(buf, size, sc, t > 1 ? "as/(ht)" : "as/h");
    return rep + split / t + sc * a * s / (h * t);
}

/* One block's activations on this rank (its layers from the first Residual through the second
   ResidualAdd, at b sequences) beside Megatron's formulas for the run's TP size, sequence
   parallelism and every recomputation mode, in bytes per sbh (s the whole sequence, b this
   rank's sequences), and pdp's own count: each layer's kept bytes from the layer table
   (pdp_model_activation_bytes, layer by layer). Checks that count against pdp's by hand, in
   floats per sbh: what TP splits, 12/t (c_attn 3, the attention's output 1, c_fc 4, GELU 4)
   and P's as/(ht) (not under SELECTIVE); 2 the row-parallel outputs, 2 f's outputs (TP);
   and what SP splits: 2 LayerNorms (1 + 2/h: the output, mean and rstd), 2 g's outputs (TP),
   2 Dropouts (output and mask, 2 each), 2 ResidualAdds. FULL keeps the adds only. Returns
   PDP_ERR_STATE when they disagree. */
static pdp_status print_block(const pdp_model *m, int64_t b)
{
    static const char *modes[3] = {"none", "selective", "full"};
    double s = (double)g.context, h = (double)g.dim, a = g.heads, t = tp, sbh = s * (double)b * h;
    int lo = -1, hi = -1, adds = 0, i, col = 0;
    char f16[64], f32[64];
    for (i = 0; i < pdp_model_num_layers(m) && hi < 0; i++) {
        const char *name = pdp_model_layer_name(m, i);
        if (lo < 0 && !strcmp(name, "Residual")) lo = i;
        if (!strcmp(name, "ResidualAdd") && ++adds == 2) hi = i + 1;
    }
    int64_t kept = pdp_model_activation_bytes(m, lo, hi, b);
    double shard = sp ? 1 / t : 1, d = g.dropout > 0, inner = 12 / t + 2 + 2 * (tp > 1);
    double outer = 2 * (1 + 2 / h) + 2 * (tp > 1) + 4 * d + 2, as = a * s / (h * t);
    double by_hand = 4 * (g.recompute == PDP_RECOMPUTE_FULL ? 2 * shard
                          : inner + outer * shard + (g.recompute ? 0 : as));
    printf("one block's activations (layers %d-%d of rank 0), s %g b %lld h %g a %g, TP %d%s: "
           "bytes per sbh, MB\n  recompute  Megatron: 16-bit, 1-byte masks      its tensors in "
           "fp32, p %s 0\n", lo, hi - 1, s, (long long)b, h, a, tp, sp ? " + SP" : "",
           g.dropout > 0 ? ">" : "=");
    for (i = 0; i < 3; i++) {
        double x16 = megatron(i, false, sp, s, h, a, t, f16, sizeof f16);
        double x32 = megatron(i, true, sp, s, h, a, t, f32, sizeof f32);
        printf("  %-9s  %-20s %6.2f %6.2f   %-20s %6.2f %6.2f\n", modes[i], f16, x16,
               MB(x16 * sbh), f32, x32, MB(x32 * sbh));
    }
    printf("  pdp, recompute %s, the layer table:", modes[g.recompute]);
    for (i = lo; i < hi; i++) {
        int64_t bytes = pdp_model_activation_bytes(m, i, i + 1, b);
        if (!bytes) continue;
        if (col > 80) col = 0;
        col += printf("%s %s %.2f", col ? "" : "\n   ", pdp_model_layer_name(m, i),
                      (double)bytes / sbh);
    }
    printf("\n    = %.2f, %.2f MB (pdp_model_activation_bytes)\n  pdp keeps every layer's "
           "output in fp32, Megatron what backward reads at 16 bits, so pdp also keeps\n  %s;\n"
           "  LayerNorm's mean and rstd (16/h a block), no mask for P (it is redrawn); full: "
           "both regions' inputs, 8%s\n", (double)kept / sbh, MB(kept),
           tp == 1 ? "c_proj's outputs (no backward reads them)"
           : sp    ? "the row-parallel partial sums and g's slices (no backward reads them), f's "
                     "gathered sequence (Megatron: a slice)"
                   : "the row-parallel partial sums and g's sums (no backward reads them), f's "
                     "copies of LayerNorm's outputs", sp ? "/t" : "");
    if (fabs((double)kept - by_hand * sbh) <= 1e-6 * (double)kept) return PDP_OK;
    fprintf(stderr, "one block's activations: %lld bytes measured, %.0f by hand\n",
            (long long)kept, by_hand * sbh);
    return PDP_ERR_STATE;
}

/* This rank's memory beside the formula: ZeRO's as allocated, a whole replica's (single,
   DDP) as ZeRO's stage 0 plans it; stage s shards the optimizer state (s >= 1), the gradients
   (s >= 2) and the parameters (s = 3). Then rank 0 prints ZeRO's table: every stage at this
   N, and why it saves or not at this size. DP's workers are threads of one rank. */
static pdp_status print_rank_memory(const pdp_launch_ctx *ctx, pdp_model *m, pdp_zero *z,
                                    pdp_dp *dp, pdp_optim *opt, int64_t b)
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
    if (ctx->rank > 0 || ctx->world_size == 1) return PDP_OK;
    if (tp > 1) { /* the last step's TP traffic beside the formula: per block f and g, forward
                     and backward (FULL: the regions' forwards again); SP moves each all-reduce
                     as a reduce-scatter and an all-gather, adds the head's and embedding's
                     gathers and sums each LayerNorm's 2h gradients */
        int64_t L = g.layers, P = b * g.context * g.dim * 4, re = g.recompute == 2;
        int64_t k = sp ? 8 * L + 2 + 4 * L * re : 4 * L + 2 * L * re;
        double sent = (sp ? 1.0 : 2.0) * (tp - 1) / tp * (double)(k * P) +
                      (sp ? 2.0 * (tp - 1) / tp * (double)((2 * L + 1) * 2 * g.dim * 4) : 0);
        printf("TP %d%s, the last step: %lld %s of %.3f MB (%s), %.3f MB sent by rank 0 "
               "(formula %.3f)\n", tp, sp ? " + SP" : "",
               (long long)(last_step.forward_allreduces + last_step.backward_allreduces +
                           last_step.allgathers + last_step.reduce_scatters),
               sp ? "all-gathers and reduce-scatters" : "all-reduces", MB(P),
               sp ? (re ? "12L + 2" : "8L + 2") : (re ? "6L" : "4L"), MB(last_step.bytes_sent),
               MB(sent));
    }
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
    int64_t len = (int64_t)strlen(prompt);
    double t_train = 0, loss_sum = 0;
    int32_t *x = malloc(sizeof *x * (size_t)(2 * B * T + len + n_new)), *y = x + B * T;
    float *host_logits = cuda ? malloc(sizeof(float) * (size_t)(b * T * g.vocab)) : NULL;
    pdp_tensor *dx = NULL; /* on a GPU: the ids of b windows */
    pdp_device gpus[64];   /* DP's workers on GPUs: 0, 1, ..., np - 1 */
    pdp_model *m, *mc;     /* mc: the model that writes, on the CPU */
    pdp_optim *opt;
    pdp_dp *dp = NULL;
    pdp_ddp *ddp = NULL;
    pdp_zero *z = NULL;
    pdp_comm *tpc = NULL, *dpc = ctx->world;
    pdp_gpt_desc gd = g;
    pdp_rng r;
    (void)user;
    if (!x || (cuda && !host_logits)) return PDP_ERR_OUT_OF_MEMORY;
    if (tp > 1) { /* ranks {0..tp-1}, {tp..2tp-1}, ... split each block; across them, DP */
        PDP_TRY(pdp_comm_split(ctx->world, rank, ctx->rank, &tpc));
        PDP_TRY(pdp_comm_split(ctx->world, ctx->rank % tp, ctx->rank, &dpc));
        gd.tp = tpc;
    }
    gd.sequence_parallel = sp; /* without -tp: pdp_gpt_create says what is missing */
    gd.device = ctx->device;   /* the CPU, or this rank's GPU */
    PDP_TRY(pdp_gpt_create(&m, &gd));
    mc = m;
    if (cuda) PDP_TRY(pdp_tensor_create(&dx, ctx->device, 1, (int64_t[]){b * T}));
    for (i = 0; i < np; i++) gpus[i] = pdp_cuda((int)i);
    PDP_TRY(pdp_model_reserve(m, b)); /* activations for b sequences: steps allocate nothing */
    if (ctx->rank == 0) PDP_TRY(print_block(m, b)); /* fails if the count by hand differs */
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
        pdp_tensor ids;
        if (step == steps - 1) pdp_tp_reset_stats(m); /* the last step's TP traffic */
        float loss, val;
        PDP_TRY(pdp_optim_set_lr(opt, pdp_lr_warmup_cosine(step, steps / 20, steps, lr, lr / 10)));
        PDP_TRY(pdp_token_dataset_sample(ds, PDP_SPLIT_TRAIN, &r, B, x, y)); /* the global batch */
        PDP_TRY(input_ids(x + rank * b * T, b, dx, &ids));
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
        /* every rank: collective under ZeRO-3 */
        PDP_TRY(val_loss(m, b, (short_run ? 1 : 8) * n, x, y, dx, host_logits, &val));
        if (ctx->rank == 0)
            printf("step %5lld  loss %.4f  val %.4f  %.0f tokens/s  %.1f s\n", (long long)step + 1,
                   loss_sum / (double)(step % every + 1), val,
                   (double)((step + 1) * B * T) / t_train, t_train);
        fflush(stdout);
        loss_sum = 0;
    }

    PDP_TRY(print_rank_memory(ctx, m, z, dp, opt, b));
    if (z) PDP_TRY(pdp_zero_gather_params(z, NULL)); /* ZeRO-3: the full parameters back */
    pdp_zero_free(z);
    pdp_ddp_free(ddp);
    pdp_dp_free(dp);

    if (cuda && rank == 0) { /* the trained parameters into a CPU copy, which writes; split
                                by -tp: the full tensors through the single-device file */
        pdp_tensor pc, pg;
        char file[64];
        gd.device = pdp_cpu();
        gd.tp = NULL, gd.sequence_parallel = false;
        PDP_TRY(pdp_gpt_create(&mc, &gd));
        PDP_TRY(pdp_model_flat(mc, &pc, NULL));
        PDP_TRY(pdp_model_flat(m, &pg, NULL));
        if (tp == 1) PDP_TRY(pdp_tensor_copy(&pc, &pg));
        if (tp > 1) { /* every TP rank: collective */
            snprintf(file, sizeof file, "/tmp/train_gpt_%lld.safetensors", (long long)seed);
            PDP_TRY(pdp_tp_checkpoint_save(file, m, NULL));
            PDP_TRY(pdp_checkpoint_load(file, mc, NULL));
            PDP_TRY(pdp_comm_barrier(tpc, NULL)); /* all have read it */
            if (ctx->rank == 0) remove(file);
        }
    }
    if (rank == 0) { /* write: the prompt's bytes, then n_new bytes drawn one at a time (by
                        every TP rank of the first copy: each forward is collective) */
        int32_t *text = y + B * T;
        for (i = 0; i < len; i++) text[i] = (unsigned char)prompt[i];
        pdp_rng_seed(&r, (uint64_t)seed, 1);
        PDP_TRY(pdp_gpt_generate(mc, text, len, n_new, (float)temperature, top_k, &r));
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
    free(host_logits);
    pdp_tensor_free(dx);
    pdp_optim_free(opt);
    if (mc != m) pdp_model_free(mc);
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
    PDP_CHECK(pdp_gpt_create(&m, &g)); /* to print the memory: each rank builds its own */
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
