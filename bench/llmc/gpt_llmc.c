/* bench/llmc/gpt_llmc.c: llm.c's side of bench/gpt.c: ms per step of llm.c's CPU trainer.

   Not part of pdp and not built by pdp's Makefile (it lives below bench/, out of the reach of
   the bench/*.c of `make bench`): bench/llmc/gpt_llmc.sh compiles it with
   llm.c's Makefile flags against a copy of llm.c the caller fetched (PDP_LLMC=/path/to/llm.c;
   its code is never committed here). It includes llm.c's train_gpt2.c with TESTING defined,
   as llm.c's own test_gpt2.c does, so llm.c's main is left out and every function the step
   calls is llm.c's, compiled as llm.c compiles it.

   No download: it writes, with random contents, the two files llm.c's trainer reads, in
   llm.c's formats, and reads them back through llm.c's own loaders:
   - the checkpoint (gpt2_build_from_checkpoint): 256 ints (magic 20240326, version 3,
     max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size, zeros),
     then the fp32 parameters in fill_in_parameter_sizes' order: N(0, 0.02) weights, LayerNorm
     gains 1, biases 0 (GPT-2's initialisation; the token embedding's padded rows too);
     the vocabulary padded to a multiple of 128, as llm.c's train_gpt2.py writes it;
   - the tokens (dataloader_init): 256 ints (magic 20240520, version 1, token count, zeros),
     then uint16 tokens below the vocabulary, enough for 16 batches.
   Both are kept under the given directory and reused while their size is right.

   The step is the one train_gpt2.c's main times, with its hyperparameters: the next batch
   from the DataLoader, gpt2_forward (with targets: the cross-entropy), gpt2_zero_grad,
   gpt2_backward, gpt2_update (AdamW: lr 1e-4, betas 0.9 / 0.999, eps 1e-8, weight decay 0).
   Threads: OpenMP's, OMP_NUM_THREADS from the caller. 2 warm-up steps, then `reps` timed.

   usage: gpt_llmc vocab context layers heads dim batch seq reps dir
   prints each timed step's ms on stderr, then one line "fp32 <threads> <median ms>". */

#define TESTING
#include "train_gpt2.c"

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* xorshift* (as llm.c's sampler, which TESTING leaves out) */
static uint32_t draw_u32(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545F4914F6CDD1Dull) >> 32);
}

/* A standard normal (Box-Muller); the values only need to be GPT-2-like. */
static float normal(uint64_t *s)
{
    float u1, u2;
    do u1 = (float)(draw_u32(s) >> 8) / 16777216.0f; while (u1 <= 0.0f);
    u2 = (float)(draw_u32(s) >> 8) / 16777216.0f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

/* path exists with exactly `bytes` bytes */
static int have_file(const char *path, long bytes)
{
    FILE *f = fopen(path, "rb");
    long n;
    if (!f) return 0;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fclose(f);
    return n == bytes;
}

static void write_checkpoint(const char *path, GPT2Config cfg)
{
    size_t sizes[NUM_PARAMETER_TENSORS], n = 0, i, j;
    int header[256] = {0};
    uint64_t rng = 1337;
    float *buf;
    FILE *f;
    fill_in_parameter_sizes(sizes, cfg);
    for (i = 0; i < NUM_PARAMETER_TENSORS; i++) n += sizes[i];
    if (have_file(path, (long)(sizeof header + n * sizeof(float)))) return;
    header[0] = 20240326, header[1] = 3, header[2] = cfg.max_seq_len;
    header[3] = cfg.vocab_size, header[4] = cfg.num_layers, header[5] = cfg.num_heads;
    header[6] = cfg.channels, header[7] = cfg.padded_vocab_size;
    f = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int), 256, f);
    for (i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        /* 2 4 6 10 12: ln1b qkvb attprojb fcb fcprojb and 15 lnfb (biases); 2 8 14: gains */
        int gain = i == 2 || i == 8 || i == 14;
        int bias = i == 3 || i == 5 || i == 7 || i == 9 || i == 11 || i == 13 || i == 15;
        buf = (float *)mallocCheck(sizes[i] * sizeof(float));
        for (j = 0; j < sizes[i]; j++) buf[j] = gain ? 1.0f : bias ? 0.0f : 0.02f * normal(&rng);
        fwriteCheck(buf, sizeof(float), sizes[i], f);
        free(buf);
    }
    fcloseCheck(f);
}

static void write_tokens(const char *path, int vocab, size_t ntok)
{
    int header[256] = {0};
    uint64_t rng = 7;
    uint16_t *tok;
    size_t i;
    FILE *f;
    if (have_file(path, (long)(sizeof header + ntok * sizeof(uint16_t)))) return;
    header[0] = 20240520, header[1] = 1, header[2] = (int)ntok;
    tok = (uint16_t *)mallocCheck(ntok * sizeof(uint16_t));
    for (i = 0; i < ntok; i++) tok[i] = (uint16_t)(draw_u32(&rng) % (uint32_t)vocab);
    f = fopenCheck(path, "wb");
    fwriteCheck(header, sizeof(int), 256, f);
    fwriteCheck(tok, sizeof(uint16_t), ntok, f);
    fcloseCheck(f);
    free(tok);
}

int main(int argc, char **argv)
{
    GPT2Config cfg;
    GPT2 model;
    DataLoader loader;
    char ckpt[1024], tokens[1024];
    int B, T, reps, step, threads = 1, out_fd;
    double ms[64], t;
    FILE *out;
    if (argc != 10) {
        fprintf(stderr, "usage: gpt_llmc vocab context layers heads dim batch seq reps dir\n");
        return 2;
    }
    cfg.vocab_size = atoi(argv[1]), cfg.max_seq_len = atoi(argv[2]);
    cfg.num_layers = atoi(argv[3]), cfg.num_heads = atoi(argv[4]), cfg.channels = atoi(argv[5]);
    cfg.padded_vocab_size = (cfg.vocab_size + 127) / 128 * 128;
    B = atoi(argv[6]), T = atoi(argv[7]), reps = atoi(argv[8]);
    if (cfg.vocab_size < 1 || cfg.vocab_size > 65536 || T < 1 || T > cfg.max_seq_len ||
        B < 1 || reps < 1 || reps > 64) {
        fprintf(stderr, "gpt_llmc: bad arguments\n");
        return 2;
    }
#ifdef OMP
    threads = omp_get_max_threads();
#endif
    snprintf(ckpt, sizeof ckpt, "%s/llmc_gpt_%d_%d_%d_%d_%d.bin", argv[9], cfg.vocab_size,
             cfg.max_seq_len, cfg.num_layers, cfg.num_heads, cfg.channels);
    snprintf(tokens, sizeof tokens, "%s/llmc_tokens_%d_%d_%d.bin", argv[9], cfg.vocab_size,
             B, T);
    write_checkpoint(ckpt, cfg);
    write_tokens(tokens, cfg.vocab_size, (size_t)16 * B * T + 1);

    /* llm.c's loader prints the config on stdout: kept off it, which carries the result */
    fflush(stdout);
    if ((out_fd = dup(1)) < 0 || !freopen("/dev/null", "w", stdout) || !(out = fdopen(out_fd, "w")))
        return 1;
    gpt2_build_from_checkpoint(&model, ckpt);
    dataloader_init(&loader, tokens, B, T, 0, 1, 1);
    for (step = 0; step < 2 + reps; step++) {
        t = now(); /* train_gpt2.c main's timed region, the same calls and hyperparameters */
        dataloader_next_batch(&loader);
        gpt2_forward(&model, loader.inputs, loader.targets, B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, step + 1);
        t = 1e3 * (now() - t);
        if (step >= 2) ms[step - 2] = t;
        fprintf(stderr, "llm.c step %d: loss %.4f, %.1f ms\n", step, model.mean_loss, t);
    }
    qsort(ms, (size_t)reps, sizeof *ms, cmp_double);
    fprintf(out, "fp32 %d %.1f\n", threads, 0.5 * (ms[(reps - 1) / 2] + ms[reps / 2]));
    fclose(out);
    dataloader_free(&loader);
    gpt2_free(&model);
    return 0;
}
