/* train_gpt.c - train a small GPT on text, byte by byte, then let it write.

   The model is nanoGPT's GPT (gpt.h: pre-LayerNorm blocks of causal self-attention and a
   4x GELU MLP, each inside a residual region, a head tied to the token embedding) with a
   vocabulary of the 256 byte values: no tokenizer. The text is Debian's fortunes
   (apt-get install fortunes: every file of /usr/share/games/fortunes), a file or directory
   named on the command line, or, without either, pdp's synthetic English-like text (the
   first line says which). Training is nanoGPT's: random windows of T + 1 bytes, AdamW (betas
   0.9 and 0.95, weight decay 0.1), warm-up then cosine decay, gradients clipped to norm 1.
   Before training it prints what the memory holds: parameters, gradients, AdamW's two
   moments, and one block's activations beside Megatron-LM's formula for them.

   Build:  cc -std=c99 -O2 -march=native -I. examples/train_gpt.c -o train_gpt -lm -lpthread
           (or make build/train_gpt; the GPT's layers run on the CPU for now)
   Run:    ./train_gpt                        (fortunes, or the synthetic text; PDP_SHORT=1
                                               for a few steps only)
           ./train_gpt -steps 3000 -layers 6 -dim 192 -dropout 0.1 my_text.txt
           ./train_gpt -bf16 -prompt "Q: " -temperature 0.8 -top_k 20 -seed 2
   Output (Intel Xeon, Sapphire Rapids class, one thread, fortunes installed; 109 s):
           seed 1: /usr/share/games/fortunes (...), GPT 4 layers, 4 heads, dim 128, ...
           ... (the memory table, then a loss line every 100 steps) ...
           step 2000  loss 1.3672  val 1.4531  ...
   Next:   train_ddp.c, to train on several processes (the GPT under every executor is the
           next issue). */

#define PDP_IMPLEMENTATION
#include "pdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB(bytes) ((double)(bytes) / 1048576.0)

/* The mean loss over `batches` batches of validation windows spread over the split (the same
   windows every time), the model in evaluation mode: no dropout. */
static float val_loss(pdp_model *m, const pdp_token_dataset *ds, int64_t B, int batches,
                      int32_t *x, int32_t *y)
{
    int64_t T = ds->context, V = 256, w[64], i;
    double sum = 0;
    int k;
    pdp_model_set_training(m, false);
    for (k = 0; k < batches; k++) {
        pdp_tensor ids, logits2d;
        const pdp_tensor *logits;
        float loss;
        for (i = 0; i < B; i++) w[i] = (k * B + i) * ds->windows[PDP_SPLIT_VAL] / (batches * B);
        PDP_CHECK(pdp_token_dataset_batch(ds, PDP_SPLIT_VAL, w, B, x, y));
        PDP_CHECK(pdp_tensor_wrap_ids(x, pdp_cpu(), 2, (int64_t[]){B, T}, &ids));
        PDP_CHECK(pdp_model_forward(m, &ids, &logits)); /* [B, T, V] */
        PDP_CHECK(pdp_tensor_reshape_view(logits, 2, (int64_t[]){B * T, V}, &logits2d));
        PDP_CHECK(pdp_loss_cross_entropy(&logits2d, y, &loss, NULL));
        sum += loss;
    }
    pdp_model_set_training(m, true);
    return (float)(sum / batches);
}

/* Parameters, gradients and AdamW's state (fp32, 4 bytes a float), then one block's
   activations (the layers from its first Residual through its second ResidualAdd) as
   pdp_model_activation_bytes measures them, beside Megatron-LM's count for one transformer
   layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
   Models", sec. 4.1): s b h (34 + 5 a s / h) bytes, 16-bit values and 1-byte dropout masks.
   In values, Megatron keeps 16 [s, b, h] tensors (LayerNorm inputs, Q, K, V, ..., GELU's
   input) and the softmax output [a, s, s] a sequence, plus 2 masks [s, b, h], a mask and the
   dropped probabilities [a, s, s] when there is dropout. pdp keeps the output of every layer
   that is not a view, 18 [s, b, h] floats a block (1 + 3 + 1 + 1 + 1 for ln_1, c_attn,
   attention, c_proj and the add, 1 + 4 + 4 + 1 + 1 for ln_2, c_fc, GELU, c_proj and the add),
   plus with dropout two outputs and two float masks; the probabilities P once (backward
   redraws the attention's dropout mask); each LayerNorm's mean and rstd (2 floats a row).
   The program stops if the measurement and this count disagree. */
static int print_memory(const pdp_model *m, const pdp_gpt_desc *g, int64_t b)
{
    int64_t P = pdp_model_param_count(m), s = g->context, h = g->dim, a = g->heads;
    int64_t sbh = s * b * h, ss = a * s * s * b, d = g->dropout > 0, lo = -1, hi = -1, adds = 0;
    int64_t pdp = 4 * (sbh * (18 + 4 * d) + ss + 4 * s * b), measured, i;
    for (i = 0; i < pdp_model_num_layers(m) && hi < 0; i++) {
        const char *name = pdp_model_layer_name(m, (int)i);
        if (lo < 0 && !strcmp(name, "Residual")) lo = i;
        if (!strcmp(name, "ResidualAdd") && ++adds == 2) hi = i + 1;
    }
    measured = pdp_model_activation_bytes(m, (int)lo, (int)hi, b);
    printf("memory (fp32): parameters %.2f MiB (%lld floats), gradients %.2f MiB, AdamW m and "
           "v %.2f MiB, activations %.2f MiB\n", MIB(4 * P), (long long)P, MIB(4 * P),
           MIB(8 * P), MIB(pdp_model_activation_bytes(m, 0, pdp_model_num_layers(m), b)));
    printf("one block's activations, s %lld b %lld h %lld a %lld (layers %lld-%lld):\n"
           "  Megatron, 16-bit, dropout:  sbh(34 + 5as/h)          %8.2f MiB\n"
           "  its count in fp32%s    %8.2f MiB\n"
           "  pdp by hand, fp32:          sbh(%s + 4as/h + 16/h)  %8.2f MiB\n"
           "  pdp measured:               activation_bytes        %8.2f MiB\n",
           (long long)s, (long long)b, (long long)h, (long long)a, (long long)lo,
           (long long)hi - 1, MIB(34 * sbh + 5 * ss),
           d ? ", dropout:   sbh(66 + 9as/h)   " : ", no dropout: sbh(64 + 4as/h)   ",
           MIB(d ? 66 * sbh + 9 * ss : 64 * sbh + 4 * ss), d ? "88" : "72", MIB(pdp),
           MIB(measured));
    printf("  pdp keeps 4-byte floats, every layer's output (the c_proj outputs only the "
           "residual add reads: +8sbh%s),\n  P once (backward redraws its dropout mask), "
           "and LayerNorm's mean and rstd (16/h)\n",
           d ? "; dropout's outputs and float masks: +14sbh - 5as/h" : "");
    if (measured == pdp) return 0;
    fprintf(stderr, "activation_bytes %lld != %lld counted by hand\n", (long long)measured,
            (long long)pdp);
    return 1;
}

int main(int argc, char **argv)
{
    pdp_gpt_desc g = {.vocab = 256, .context = 64, .layers = 4, .heads = 4, .dim = 128};
    int64_t B = 16, steps = 2000, every, step, n_new = 500, n, i;
    int threads = 1, top_k = 40;
    double lr = 1e-3, t_train = 0, loss_sum = 0;
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
    if (i < argc || steps < 1 || B < 1 || B > 64 || n_new < 0 || !prompt[0]) {
        fprintf(stderr, "usage: %s [-steps 2000] [-batch 16] [-context 64] [-layers 4] "
                "[-heads 4] [-dim 128] [-dropout 0] [-lr 0.001] [-threads 1] [-seed 1] [-bf16]\n"
                "  [-prompt \"The \"] [-tokens 500] [-temperature 0.8] [-top_k 40] [text file or "
                "directory]\n  PDP_SHORT=1: a few steps only\n", argv[0]);
        return 2;
    }
    if (short_run) steps = 10, n_new = 40;
    every = steps >= 10 ? steps / 10 : 1;
    PDP_CHECK(pdp_set_num_threads(threads));

    /* the text: fortunes by default, the synthetic text when they are not installed */
    pdp_token_dataset_desc td = {.context = g.context, .seed = seed, .synthetic_fallback = !path};
    PDP_CHECK(pdp_token_dataset_load(&ds, path ? path : PDP_FORTUNES_DIR, &td));

    g.seed = seed;
    g.precision = bf16 ? PDP_PRECISION_BF16 : PDP_PRECISION_FP32;
    PDP_CHECK(pdp_gpt_create(&m, &g));
    PDP_CHECK(pdp_model_reserve(m, B)); /* nothing allocated from here */
    pdp_optim_desc od = {.kind = PDP_OPTIM_ADAMW, .lr = lr, .beta1 = 0.9, .beta2 = 0.95,
                         .weight_decay = 0.1};
    PDP_CHECK(pdp_optim_create(&opt, m, &od));
    x = malloc(sizeof *x * (size_t)(B * g.context));
    y = malloc(sizeof *y * (size_t)(B * g.context));
    text = malloc(sizeof *text * (size_t)(strlen(prompt) + (size_t)n_new));
    if (!x || !y || !text) return 1;

    printf("seed %llu: %s, %lld tokens (%lld validate)\nGPT %d layers, %d heads, dim %lld, "
           "context %lld, batch %lld, AdamW lr %g, %d thread%s%s%s\n", seed, ds->source,
           (long long)ds->count, (long long)(ds->count - ds->split_at), g.layers, g.heads,
           (long long)g.dim, (long long)g.context, (long long)B, lr, threads,
           threads > 1 ? "s" : "", bf16 ? ", bf16 " : "",
           bf16 ? pdp_bf16_path_name(pdp_bf16_best_path()) : "");
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
    free(y);
    free(text);
    pdp_optim_free(opt);
    pdp_model_free(m);
    pdp_token_dataset_free(ds);
    return 0;
}
