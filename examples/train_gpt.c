/* train_gpt.c - train a small GPT on text, byte by byte, then let it write.

   The model is nanoGPT's GPT (gpt.h: pre-LayerNorm blocks of causal self-attention and a 4x
   GELU MLP, each a residual region; the head tied to the token embedding) over the 256 byte
   values: no tokenizer. The text is Debian's fortunes (apt-get install fortunes), a file or
   a directory named on the command line, or, with neither, pdp's synthetic English-like text
   (the first line says which, and why). Training is nanoGPT's: windows of T + 1 bytes drawn
   at random, AdamW (betas 0.9 and 0.95, weight decay 0.1), warm-up then cosine decay, the
   gradient clipped to norm 1, at lr 3e-3 (a small model, a short run: at dim 128, 2e-3 and
   4e-3 each reached a lower validation loss than nanoGPT's 1e-3 in 1200 steps). It prints the
   memory first (parameters, gradients, AdamW's moments; one block's activations beside
   Megatron-LM's formula), the losses, and at the end text written from a prompt.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_gpt.c -o train_gpt -lm -lpthread
           (or make build/train_gpt; the GPT's layers run on the CPU for now)
   Run:    ./train_gpt                       (PDP_SHORT=1 for a few steps only)
           ./train_gpt -steps 5000 -dim 128 -batch 16 -dropout 0.1 my_text.txt
           ./train_gpt -bf16 -prompt "Q: " -temperature 0.6 -top_k 10 -seed 2
   Output (Intel Xeon, Sapphire Rapids class, one thread, fortunes installed: 100 s of CPU,
   205 s of wall time beside other jobs, load 6 to 7 on 2 cores):
           seed 1: /usr/share/games/fortunes (43 files), 2576674 bytes (the last 257668 ...
           GPT 4 layers, 4 heads, dim 96, context 64: 478272 parameters; batch 8, AdamW ...
           memory (fp32): parameters 1.82 MiB, gradients 1.82 MiB, AdamW's m and v 3.65 MiB, ...
           ... one block's activations: Megatron's formula, pdp's count and measurement ...
           step   200  loss 3.1165  val 2.6771  4717 tokens/s  21.7 s
           step  2000  loss 2.1029  val 2.1019  5007 tokens/s  204.5 s
           sample (temperature 0.8, top-k 40, seed 1):
           The garning the the love Spuate mones of never bastion and Sindes pustalliataie ...
   Next:   train_ddp.c: one model trained by several ranks (the GPT under every executor is
           the next issue). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB(bytes) ((double)(bytes) / 1048576.0)

/* The mean loss of `batches` batches of validation windows, the same windows every time
   (drawn from a fixed seed), with the model in evaluation mode: no dropout. */
static float val_loss(pdp_model *m, const pdp_token_dataset *ds, int64_t B, int batches,
                      int32_t *x, int32_t *y)
{
    int64_t T = ds->context, V = ds->vocab;
    double sum = 0;
    pdp_rng r;
    int k;
    pdp_rng_seed(&r, 1234, 0);
    pdp_model_set_training(m, false);
    for (k = 0; k < batches; k++) {
        pdp_tensor ids, logits2d;
        const pdp_tensor *logits;
        float loss;
        PDP_CHECK(pdp_token_dataset_sample(ds, PDP_SPLIT_VAL, &r, B, x, y));
        PDP_CHECK(pdp_tensor_wrap_ids(x, pdp_cpu(), 2, (int64_t[]){B, T}, &ids));
        PDP_CHECK(pdp_model_forward(m, &ids, &logits)); /* [B, T, V] */
        PDP_CHECK(pdp_tensor_reshape_view(logits, 2, (int64_t[]){B * T, V}, &logits2d));
        PDP_CHECK(pdp_loss_cross_entropy(&logits2d, y, &loss, NULL)); /* over B T positions */
        sum += loss;
    }
    pdp_model_set_training(m, true);
    return (float)(sum / batches);
}

/* Memory: parameters, gradients, AdamW's two moments (fp32), and one block's activations
   (its layers from the first Residual through the second ResidualAdd) beside Megatron-LM's
   count for a transformer layer (Korthikanti et al. 2022, "Reducing Activation Recomputation
   in Large Transformer Models", sec. 4.1): sbh(34 + 5as/h) bytes are 16 [s, b, h] tensors of
   2 bytes (LayerNorm inputs, Q, K, V, GELU's input, ...), 2 dropout masks of 1 byte, and a
   sequence's softmax output, its mask and the dropped output [a, s, s] (2 + 1 + 2 bytes). pdp
   keeps the output of every layer but a view, in fp32: 1 + 3 + 1 + 1 + 1 (ln_1, c_attn,
   attention, c_proj, add) + 1 + 4 + 4 + 1 + 1 (ln_2, c_fc, GELU, c_proj, add) = 18 [s, b, h],
   with dropout 2 outputs and 2 masks more; P once (backward redraws its dropout mask); each
   LayerNorm's mean and rstd. It fails if pdp_model_activation_bytes disagrees. */
static int print_memory(const pdp_model *m, const pdp_gpt_desc *g, int64_t b)
{
    int64_t P = pdp_model_param_count(m), s = g->context, h = g->dim, a = g->heads;
    int64_t sbh = s * b * h, ass = a * s * s * b, d = g->dropout > 0, lo = -1, hi = -1, adds = 0;
    int64_t pdp = 4 * (sbh * (18 + 4 * d) + ass + 4 * s * b), measured, i;
    for (i = 0; i < pdp_model_num_layers(m) && hi < 0; i++) {
        const char *name = pdp_model_layer_name(m, (int)i);
        if (lo < 0 && !strcmp(name, "Residual")) lo = i;
        if (!strcmp(name, "ResidualAdd") && ++adds == 2) hi = i + 1;
    }
    measured = pdp_model_activation_bytes(m, (int)lo, (int)hi, b);
    printf("memory (fp32): parameters %.2f MiB, gradients %.2f MiB, AdamW's m and v %.2f MiB, "
           "activations %.2f MiB\n", MIB(4 * P), MIB(4 * P), MIB(8 * P),
           MIB(pdp_model_activation_bytes(m, 0, pdp_model_num_layers(m), b)));
    printf("one block's activations (layers %lld-%lld), s %lld b %lld h %lld a %lld:        MiB\n"
           "  Megatron, 16-bit, 1-byte masks   sbh(34 + 5as/h)          %6.2f\n"
           "  the same tensors in fp32, p %s0  sbh(%s)          %6.2f\n"
           "  pdp by hand, fp32                sbh(%s + 4as/h + 16/h)   %6.2f\n"
           "  pdp_model_activation_bytes                                %6.2f\n"
           "  pdp also keeps the c_proj outputs that only the residual adds read (8sbh) and "
           "LayerNorm's\n  mean and rstd (16/h)%s\n",
           (long long)lo, (long long)hi - 1, (long long)s, (long long)b, (long long)h,
           (long long)a, MIB(34 * sbh + 5 * ass), d ? "> " : "= ",
           d ? "66 + 9as/h" : "64 + 4as/h", MIB(d ? 66 * sbh + 9 * ass : 64 * sbh + 4 * ass),
           d ? "88" : "72", MIB(pdp), MIB(measured),
           d ? "; dropout's outputs and float masks (+14sbh); P alone, its mask redrawn "
               "(-5as/h)" : "");
    if (measured == pdp) return 0;
    fprintf(stderr, "activation bytes: %lld measured, %lld by hand\n", (long long)measured,
            (long long)pdp);
    return 1;
}

int main(int argc, char **argv)
{
    pdp_gpt_desc g = {.vocab = 256, .context = 64, .layers = 4, .heads = 4, .dim = 96};
    int64_t B = 8, steps = 2000, every, step, n_new = 500, n, i;
    int threads = 1, top_k = 40;
    double lr = 3e-3, t_train = 0, loss_sum = 0;
    float temperature = 0.8f;
    unsigned long long seed = 1;
    bool short_run = getenv("PDP_SHORT") && atoi(getenv("PDP_SHORT")), bf16 = false;
    const char *path = NULL, *prompt = "The ";
    pdp_token_dataset *ds;
    pdp_model *m;
    pdp_optim *opt;
    pdp_rng r;
    int32_t *x, *y, *text;

    for (i = 1; i < argc; i += 2) {
        if (!strcmp(argv[i], "-bf16")) bf16 = true, i--; /* a flag: no value */
        else if (argv[i][0] != '-') path = argv[i], i--;  /* the text: a file or a directory */
        else if (i + 1 >= argc) break;
        else if (!strcmp(argv[i], "-steps")) steps = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-batch")) B = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-context")) g.context = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-layers")) g.layers = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-heads")) g.heads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-dim")) g.dim = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-dropout")) g.dropout = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-lr")) lr = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-seed")) seed = strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "-prompt")) prompt = argv[i + 1];
        else if (!strcmp(argv[i], "-tokens")) n_new = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-temperature")) temperature = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "-top_k")) top_k = atoi(argv[i + 1]);
        else break;
    }
    if (i < argc || steps < 1 || B < 1 || n_new < 0 || !prompt[0]) {
        fprintf(stderr, "usage: %s [-steps 2000] [-batch 8] [-context 64] [-layers 4] "
                "[-heads 4] [-dim 96] [-dropout 0] [-lr 0.003] [-threads 1] [-seed 1] [-bf16]\n"
                "  [-prompt \"The \"] [-tokens 500] [-temperature 0.8] [-top_k 40] [text file or "
                "directory]\n  PDP_SHORT=1: a few steps only\n", argv[0]);
        return 2;
    }
    if (short_run) steps = 10, n_new = 40;
    every = steps >= 20 ? steps / 10 : steps; /* a line every tenth of the run */
    PDP_CHECK(pdp_set_num_threads(threads));

    /* the text: fortunes by default, the synthetic text when they are not installed */
    pdp_token_dataset_desc td = {.context = g.context, .seed = seed, .synthetic_fallback = !path};
    PDP_CHECK(pdp_token_dataset_load(&ds, path ? path : PDP_FORTUNES_DIR, &td));

    g.seed = seed;
    g.precision = bf16 ? PDP_PRECISION_BF16 : PDP_PRECISION_FP32;
    PDP_CHECK(pdp_gpt_create(&m, &g));
    PDP_CHECK(pdp_model_reserve(m, B)); /* activations for B sequences: steps allocate nothing */
    pdp_optim_desc od = {.kind = PDP_OPTIM_ADAMW, .lr = lr, .beta1 = 0.9, .beta2 = 0.95,
                         .weight_decay = 0.1};
    PDP_CHECK(pdp_optim_create(&opt, m, &od));
    x = malloc(sizeof *x * (size_t)(2 * B * g.context + (int64_t)strlen(prompt) + n_new));
    if (!x) return 1;
    y = x + B * g.context;     /* the targets: x shifted by one byte */
    text = y + B * g.context;  /* the prompt, then what the model writes */

    printf("seed %llu: %s, %lld bytes (the last %lld validate)\n", seed, ds->source,
           (long long)ds->count, (long long)(ds->count - ds->split_at));
    printf("GPT %d layers, %d heads, dim %lld, context %lld: %lld parameters; batch %lld, AdamW "
           "lr %g, %d thread(s)%s%s\n", g.layers, g.heads, (long long)g.dim,
           (long long)g.context, (long long)pdp_model_param_count(m), (long long)B, lr, threads,
           bf16 ? ", bf16 " : "", bf16 ? pdp_bf16_path_name(pdp_bf16_best_path()) : "");
    if (print_memory(m, &g, B)) return 1;
    fflush(stdout);

    pdp_rng_seed(&r, seed, 0);
    for (step = 0; step < steps; step++) {
        double t0 = pdp_seconds();
        pdp_tensor ids;
        float loss;
        pdp_optim_set_lr(opt, pdp_lr_warmup_cosine(step, steps / 20, steps, lr, lr / 10));
        PDP_CHECK(pdp_token_dataset_sample(ds, PDP_SPLIT_TRAIN, &r, B, x, y)); /* nanoGPT's */
        PDP_CHECK(pdp_tensor_wrap_ids(x, pdp_cpu(), 2, (int64_t[]){B, g.context}, &ids));
        PDP_CHECK(pdp_model_forward_backward(m, &ids, y, &loss)); /* y: a label a position */
        PDP_CHECK(pdp_clip_grad_norm(m, 1.0f, NULL));
        PDP_CHECK(pdp_optim_step(opt));
        pdp_optim_zero_grad(opt);
        t_train += pdp_seconds() - t0;
        loss_sum += loss;
        if ((step + 1) % every == 0 || step + 1 == steps) {
            printf("step %5lld  loss %.4f  val %.4f  %.0f tokens/s  %.1f s\n",
                   (long long)step + 1, loss_sum / (double)(step % every + 1),
                   val_loss(m, ds, B, short_run ? 1 : 8, x, y),
                   (double)((step + 1) * B * g.context) / t_train, t_train);
            fflush(stdout);
            loss_sum = 0;
        }
    }

    /* write: the prompt's bytes, then n_new bytes drawn one at a time */
    for (n = 0; prompt[n]; n++) text[n] = (unsigned char)prompt[n];
    pdp_rng_seed(&r, seed, 1);
    PDP_CHECK(pdp_gpt_generate(m, text, n, n_new, temperature, top_k, &r));
    printf("sample (temperature %g, top-k %d, seed %llu):\n", temperature, top_k, seed);
    for (i = 0; i < n + n_new; i++) /* bytes as text; a control byte as '?' */
        putchar(text[i] == '\n' || text[i] == '\t' || (text[i] >= 32 && text[i] != 127)
                ? text[i] : '?');
    putchar('\n');

    free(x);
    pdp_optim_free(opt);
    pdp_model_free(m);
    pdp_token_dataset_free(ds);
    return 0;
}
