/* fuzz_ckpt.c - libFuzzer harness for safetensors checkpoint loading (src/checkpoint.c,
   src/json.c). Byte 0 picks the model/optimizer the rest of the input (a file) is loaded
   into: 0 MLP, 1 MLP+Adam, 2 MLP+SGD(momentum), 3 GPT, 4 GPT+AdamW, 5 a ZeRO-style range/shard
   load into the MLP with SGD(momentum). Built with -DGEN_SEEDS it is a program that writes
   seed inputs (saved checkpoints, each prefixed by its mode byte) into argv[1]. */
#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>

#define NMODES 6
static pdp_model *g_mlp, *g_gpt;
static pdp_optim *g_adam, *g_sgd, *g_adamw;
static char g_path[256];

static pdp_model *make_mlp(void)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4;
    md.seed = 7;
    if (pdp_model_create(&m, &md) != PDP_OK || pdp_model_add_linear(m, 3) != PDP_OK ||
        pdp_model_add_relu(m) != PDP_OK || pdp_model_add_linear(m, 2) != PDP_OK)
        abort();
    return m;
}

static pdp_model *make_gpt(void)
{
    pdp_gpt_desc d;
    pdp_model *m = NULL;
    memset(&d, 0, sizeof d);
    d.vocab = 11;
    d.context = 4;
    d.layers = 1;
    d.heads = 2;
    d.dim = 8;
    d.seed = 3;
    if (pdp_gpt_create(&m, &d) != PDP_OK) abort();
    return m;
}

static pdp_optim *make_optim(pdp_model *m, pdp_optim_kind kind)
{
    pdp_optim_desc d;
    pdp_optim *o = NULL;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.lr = 0.01f;
    if (kind == PDP_OPTIM_SGD) d.momentum = 0.9f;
    if (pdp_optim_create(&o, m, &d) != PDP_OK) abort();
    return o;
}

static void setup(void)
{
    if (g_mlp) return;
    pdp_set_num_threads(1);
    g_mlp = make_mlp();
    g_gpt = make_gpt();
    g_adam = make_optim(g_mlp, PDP_OPTIM_ADAM);
    g_sgd = make_optim(g_mlp, PDP_OPTIM_SGD);
    g_adamw = make_optim(g_gpt, PDP_OPTIM_ADAMW);
    snprintf(g_path, sizeof g_path, "/dev/shm/fuzz_ckpt.%d.safetensors", (int)getpid());
}

static pdp_status load(int mode, const char *path, int64_t lo_hi)
{
    static float params[64];
    int64_t n = g_mlp->param_count, lo = lo_hi % (n + 1);
    int64_t hi = lo + (lo_hi / (n + 1)) % (n - lo + 1);
    switch (mode) {
    case 0: return pdp_checkpoint_load(path, g_mlp, NULL);
    case 1: return pdp_checkpoint_load(path, g_mlp, g_adam);
    case 2: return pdp_checkpoint_load(path, g_mlp, g_sgd);
    case 3: return pdp_checkpoint_load(path, g_gpt, NULL);
    case 4: return pdp_checkpoint_load(path, g_gpt, g_adamw);
    default:
        if (n > 64) abort();
        return pdp__checkpoint_load_range(path, g_mlp, (lo_hi % 3) != 1 ? params : NULL, g_sgd, lo,
                                          hi, "pdp_zero_checkpoint_load");
    }
}

#ifndef GEN_SEEDS
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    FILE *f;
    pdp_status st;
    int mode;
    if (size < 1) return 0;
    setup();
    mode = data[0] % NMODES;
    f = fopen(g_path, "wb");
    if (!f) abort();
    if (size > 1 && fwrite(data + 1, 1, size - 1, f) != size - 1) abort();
    fclose(f);
    pdp_clear_error();
    st = load(mode, g_path, (int64_t)(data[0] / NMODES) * 7);
    if (getenv("FUZZ_VERBOSE"))
        fprintf(stderr, "mode %d: %s %s\n", mode, pdp_status_name(st), st ? pdp_last_error() : "");
    if (st != PDP_OK) {
        const char *e = pdp_last_error();
        if (!e || strncmp(e, "pdp_", 4) != 0) { /* a message naming the function */
            fprintf(stderr, "status %s without a message: '%s'\n", pdp_status_name(st),
                    e ? e : "(null)");
            abort();
        }
    }
    return 0;
}
#else
/* writes dir/<name>: the mode byte, then the file at src */
static void seed(const char *dir, const char *name, int mode, const char *src)
{
    char p[512], buf[1 << 16];
    FILE *in = fopen(src, "rb"), *out;
    size_t n;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    out = fopen(p, "wb");
    if (!in || !out) abort();
    fputc(mode, out);
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
    fclose(in);
    fclose(out);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : ".";
    const char *tmp = "/dev/shm/fuzz_seed.safetensors";
    static float params[64];
    setup();
    if (pdp_checkpoint_save(tmp, g_mlp, NULL)) abort();
    seed(dir, "mlp", 0, tmp);
    if (pdp_checkpoint_save(tmp, g_mlp, g_adam)) abort();
    seed(dir, "mlp_adam", 1, tmp);
    if (pdp_checkpoint_save(tmp, g_mlp, g_sgd)) abort();
    seed(dir, "mlp_sgd", 2, tmp);
    if (pdp_checkpoint_save(tmp, g_gpt, NULL)) abort();
    seed(dir, "gpt", 3, tmp);
    if (pdp_checkpoint_save(tmp, g_gpt, g_adamw)) abort();
    seed(dir, "gpt_adamw", 4, tmp);
    {
        /* mode 5 reads the range from data[0] = 5 + 6k (lo_hi = 7k, load above); a byte
           holds k <= 41, so the seed is a middle range: k = 20, lo_hi 140, [20, 21) of 23 */
        int k = 20;
        int64_t n = g_mlp->param_count, lh = 7 * k, lo = lh % (n + 1),
                hi = lo + (lh / (n + 1)) % (n - lo + 1);
        memcpy(params, g_mlp->param_block, sizeof(float) * (size_t)n);
        fprintf(stderr, "shard [%lld, %lld) of %lld\n", (long long)lo, (long long)hi, (long long)n);
        if (pdp__checkpoint_save_range(tmp, g_mlp, params, g_sgd, lo, hi, "fuzz")) {
            fprintf(stderr, "%s\n", pdp_last_error());
            abort();
        }
        seed(dir, "shard", 5 + 6 * k, tmp);
    }
    remove(tmp);
    /* check each seed loads */
    return 0;
}
#endif
