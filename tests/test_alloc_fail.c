/* test_alloc_fail.c - every constructor under an allocator that fails the k-th allocation.

   The test's PDP_MALLOC counts live blocks and fails the k-th allocation from the moment it
   is armed, on the armed thread only (so one rank thread fails while its peers and the
   communicators' progress threads allocate normally) or, for DataParallel, whose workers
   build their replicas on their own threads, on any thread. For each constructor (tensors,
   models and every pdp_model_add_*, the first forward, reserve, optimizers, checkpoint load
   and save, datasets (a token dataset's directory and its synthetic fallback too), the
   batcher, the sampler, local groups and communicators, the store, DP, the TP layers) the
   loop runs k = 1, 2, ... until the call succeeds without reaching its k-th allocation; each
   failing k must return PDP_ERR_OUT_OF_MEMORY with a message that
   starts with the public function's name, leave *out NULL (never a half-built object), leave
   a model it was adding to usable (its layers and parameter count unchanged, a forward
   runs), and once the caller has freed what it owns, no live block behind. Every case (the
   collective ones below too) runs twice: with only the k-th allocation failing, then with
   every allocation from the k-th on failing (memory that stays short, so the error paths'
   own allocations fail too). Under `make sanitize` ASan also catches a double free or a
   read of freed memory on any of these paths.
   Collective constructors (pdp_comm_split, pdp_mesh_create, DDP, ZeRO 1-3, pipelines, TP's
   first forward, the TP and ZeRO checkpoint loads, saves and consolidation) run on 2 thread
   ranks: each rank in turn counts its allocations in a run without failures, then fails each
   of them, and leaves (frees its communicator) as soon as the call returns, except at its last
   allocation (with only that one failing), where it holds its communicator, with a 0.3 s
   timeout, until the peer has returned. The peer must return an error too (never PDP_OK,
   never a hang), within the timeout plus slack; a failed wrap must leave each model whole
   (its own or rank 0's parameters; ZeRO stage 3 excepted, as zero.h states); once both
   ranks have freed everything no block is live. pdp_zero_optim_create and the
   communication hooks' registration are not collective and run on one rank.
   About 3.5 s in all, under ASan too (0.5 s of CPU): most of it is the peers' 0.3 s
   timeouts in the hold runs (with only the k-th failing) where a constructor's last
   allocation comes before its first collective. */

#define _POSIX_C_SOURCE 200809L /* this file includes system headers before pdp.h */
#include <stdlib.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <errno.h>
#include <sys/stat.h>

/* ---- the allocator ---- */

static atomic_long live_blocks;       /* PDP_MALLOC'd and not yet PDP_FREE'd, every thread */
static atomic_long any_fail_at;       /* > 0: the any_fail_at-th allocation on any thread fails */
static atomic_long any_allocs;        /* allocations counted while any_fail_at is armed */
static __thread long thread_fail_at;  /* > 0: this thread's thread_fail_at-th allocation fails */
static __thread long thread_allocs;   /* this thread's allocations since it was armed */
static int any_persist;               /* 1: every allocation from the any_fail_at-th fails */
static __thread int thread_persist;   /* 1: every allocation from the thread_fail_at-th fails */

static void *test_malloc(size_t n)
{
    void *p;
    if (thread_fail_at != 0 && (++thread_allocs == thread_fail_at ||
                                (thread_persist && thread_fail_at > 0 &&
                                 thread_allocs > thread_fail_at)))
        return NULL;
    if (atomic_load(&any_fail_at) > 0) {
        long i = atomic_fetch_add(&any_allocs, 1) + 1;
        if (i == any_fail_at || (any_persist && i > any_fail_at)) return NULL;
    }
    p = malloc(n);
    if (p) atomic_fetch_add(&live_blocks, 1);
    return p;
}
static void test_free(void *p)
{
    if (!p) return;
    atomic_fetch_sub(&live_blocks, 1);
    free(p);
}
#define PDP_MALLOC(n) test_malloc(n)
#define PDP_FREE(p) test_free(p)
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "test_platform.h"

/* Arms this thread: its k-th allocation from now fails (k = 0: none fails, only counts). */
static void arm_thread(long k)
{
    thread_allocs = 0;
    thread_fail_at = k > 0 ? k : -1;
}
/* Disarms this thread; returns how many allocations it made (the failed one included). */
static long disarm_thread(void)
{
    long n = thread_allocs;
    thread_fail_at = 0;
    thread_allocs = 0;
    return n;
}

#undef IN /* <windows.h> defines it */
#define IN 6
#define CLASSES 3
#define MAXK 2000 /* more allocations than any constructor here makes */

static char g_dir[256];
static const char *tmp_path(const char *name)
{
    static __thread char buf[4][512]; /* per thread: the rank threads build paths at once */
    static __thread int k;
    k = (k + 1) & 3;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

/* A small MLP: Linear(8) ReLU Linear(CLASSES) on IN features. */
static pdp_status build_mlp(pdp_model **out, uint64_t seed)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    md.seed = seed;
    *out = NULL;
    if ((st = pdp_model_create(&m, &md)) != PDP_OK) return st;
    if ((st = pdp_model_add_linear(m, 8)) || (st = pdp_model_add_relu(m)) ||
        (st = pdp_model_add_linear(m, 5)) || (st = pdp_model_add_tanh(m)) ||
        (st = pdp_model_add_linear(m, CLASSES))) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

/* A forward of 2 samples of the model's input shape (not armed). */
static pdp_status run_forward_y(pdp_model *m, const pdp_tensor **yout)
{
    float xs[2 * 64];
    int64_t shape[4];
    pdp_tensor x;
    const pdp_tensor *y = NULL;
    pdp_status st;
    int i;
    for (i = 0; i < 2 * 64; i++) xs[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    shape[0] = 2;
    if (pdp_model_num_layers(m) == 0) return PDP_OK;
    /* the input shape is the first layer's: the tests' models take IN features or (1,6,6) */
    if (strcmp(pdp_model_layer_name(m, 0), "Conv2d") == 0) {
        shape[1] = 1;
        shape[2] = 6;
        shape[3] = 6;
        pdp_tensor_wrap(xs, pdp_cpu(), 4, shape, &x);
    } else {
        shape[1] = IN;
        pdp_tensor_wrap(xs, pdp_cpu(), 2, shape, &x);
    }
    st = pdp_model_forward(m, &x, &y);
    if (yout) *yout = y;
    return st;
}
static pdp_status run_forward(pdp_model *m) { return run_forward_y(m, NULL); }

/* ---- single-thread constructors ----
   A case: setup (not armed) builds what the call needs; call is the constructor, armed;
   teardown frees everything the case owns (call's result included). */

typedef struct fx {
    pdp_model *m;
    pdp_optim *o;
    pdp_tensor *t;
    pdp_dataset *ds;
    pdp_token_dataset *tok;
    pdp_batcher *b;
    pdp_dist_sampler *s;
    pdp_local_group *g;
    pdp_comm *c;
    pdp_store *store;
    pdp_dp *dp;
    pdp_model *ref;      /* first_forward: the same model, run without failures */
    const pdp_tensor *y; /* first_forward: its output */
    int layers;          /* the model's layers before the call (add_* cases) */
    int64_t params;      /* and its parameter count */
} fx;

typedef struct single_case {
    const char *name;
    const char *fn;                     /* the public function: the message's first word */
    pdp_status (*setup)(fx *f);
    pdp_status (*call)(fx *f);
    int adds_to_model;                  /* 1: call adds a layer to f->m: check it is unchanged */
    int any_thread;                     /* 1: fail the k-th allocation of any thread */
    int (*fallback_ok)(fx *f);          /* non-NULL: a call that succeeds in spite of the
                                           failure must pass this check */
} single_case;

static pdp_status model_in(fx *f, int conv)
{
    pdp_model_desc md;
    memset(&md, 0, sizeof md);
    if (conv) {
        md.input_shape[0] = 1;
        md.input_shape[1] = 6;
        md.input_shape[2] = 6;
    } else {
        md.input_shape[0] = IN;
    }
    md.seed = 3;
    return pdp_model_create(&f->m, &md);
}
static pdp_status setup_none(fx *f) { (void)f; return PDP_OK; }
static pdp_status setup_mlp(fx *f) { return build_mlp(&f->m, 3); }
/* Eight layers and eight parameters (the arrays' first capacity): the next layer grows the
   layer array, the next parameter the registry. */
static pdp_status setup_linear(fx *f)
{
    pdp_status st = model_in(f, 0);
    int i;
    for (i = 0; i < 4 && st == PDP_OK; i++)
        if ((st = pdp_model_add_linear(f->m, 8)) == PDP_OK)
            st = i < 3 ? pdp_model_add_relu(f->m) : pdp_model_add_tanh(f->m);
    return st;
}
static pdp_status add_convs(fx *f, int n)
{
    pdp_status st = model_in(f, 1);
    int i;
    for (i = 0; i < n && st == PDP_OK; i++)
        if ((st = pdp_model_add_conv2d(f->m, 2, 3, 1, 1)) == PDP_OK)
            st = pdp_model_add_relu(f->m);
    return st;
}
static pdp_status setup_conv(fx *f) { return add_convs(f, 4); }
static pdp_status setup_conv_pool(fx *f)
{
    pdp_status st = add_convs(f, 3);
    if (st == PDP_OK) st = pdp_model_add_conv2d(f->m, 2, 3, 1, 1);
    return st == PDP_OK ? pdp_model_add_maxpool2d(f->m, 2, 0) : st;
}

/* *out must stay NULL on failure: a half-built object would escape the leak check. */
#define OUT_NULL_ON_FAIL(st, p) ((st) == PDP_OK || (p) == NULL ? (st) : PDP_ERR_STATE)

static pdp_status call_tensor(fx *f)
{
    int64_t shape[2] = {3, 5};
    pdp_status st = pdp_tensor_create(&f->t, pdp_cpu(), 2, shape);
    return OUT_NULL_ON_FAIL(st, f->t);
}
static pdp_status call_model(fx *f)
{
    pdp_model_desc md;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    st = pdp_model_create(&f->m, &md);
    return OUT_NULL_ON_FAIL(st, f->m);
}
static pdp_status call_add_linear(fx *f) { return pdp_model_add_linear(f->m, 4); }
static pdp_status call_add_relu(fx *f) { return pdp_model_add_relu(f->m); }
static pdp_status call_add_gelu(fx *f) { return pdp_model_add_gelu(f->m); }
static pdp_status call_add_tanh(fx *f) { return pdp_model_add_tanh(f->m); }
static pdp_status call_add_sigmoid(fx *f) { return pdp_model_add_sigmoid(f->m); }
static pdp_status call_add_dropout(fx *f) { return pdp_model_add_dropout(f->m, 0.25f); }
static pdp_status call_add_layernorm(fx *f) { return pdp_model_add_layernorm(f->m, 0.0f); }
static pdp_status call_add_conv2d(fx *f) { return pdp_model_add_conv2d(f->m, 2, 3, 1, 1); }
static pdp_status call_add_maxpool(fx *f) { return pdp_model_add_maxpool2d(f->m, 2, 0); }
static pdp_status call_add_flatten(fx *f) { return pdp_model_add_flatten(f->m); }
static pdp_status call_reserve(fx *f) { return pdp_model_reserve(f->m, 4); }
static pdp_status setup_mlp_pair(fx *f)
{
    pdp_status st = build_mlp(&f->m, 3);
    return st ? st : build_mlp(&f->ref, 3);
}
static pdp_status call_forward(fx *f)
{
    return run_forward_y(f->m, &f->y);
}
/* Whether a and b (n floats) agree within float rounding: the GEMM's unpacked fallback
   sums in another order than its packed kernels. */
static int close_floats(const float *a, const float *b, int64_t n)
{
    int64_t i;
    for (i = 0; i < n; i++)
        if (!(fabsf(a[i] - b[i]) <= 1e-5f * (1.0f + fabsf(b[i])))) return 0;
    return 1;
}
/* The GEMM's scratch has a fallback: a forward whose scratch allocation failed still
   succeeds, and must give the bits of one that did not fail (the same blocks, packed on
   the stack: an unpacked loop summed in another order, 3.7e-6 off). */
static int same_forward(fx *f)
{
    const pdp_tensor *y = NULL;
    if (run_forward_y(f->ref, &y) != PDP_OK) return 0;
    return f->y && y && f->y->count == y->count &&
           memcmp(f->y->data, y->data, (size_t)y->count * sizeof *y->data) == 0;
}
static pdp_status call_set_precision(fx *f)
{
    return pdp_model_set_precision(f->m, PDP_PRECISION_BF16);
}
static pdp_status call_optim_sgd(fx *f)
{
    pdp_optim_desc od;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.momentum = 0.9f;
    st = pdp_optim_create(&f->o, f->m, &od);
    return OUT_NULL_ON_FAIL(st, f->o);
}
static pdp_status call_optim_adam(fx *f)
{
    pdp_optim_desc od;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW;
    st = pdp_optim_create(&f->o, f->m, &od);
    return OUT_NULL_ON_FAIL(st, f->o);
}

/* generation: a small byte-level GPT, run once by setup (its activations exist); held in
   f->ref, as the check that f->m still runs feeds floats */
static pdp_status setup_gpt(fx *f)
{
    pdp_gpt_desc d;
    pdp_rng r;
    int32_t ids[8] = {'a', 'b'};
    pdp_status st;
    memset(&d, 0, sizeof d);
    d.context = 8, d.layers = 1, d.heads = 2, d.dim = 8;
    if ((st = pdp_gpt_create(&f->ref, &d)) != PDP_OK) return st;
    pdp_rng_seed(&r, 1, 0);
    return pdp_gpt_generate(f->ref, ids, 2, 1, 1.0f, 0, &r);
}
static pdp_status call_generate(fx *f)
{
    int32_t ids[16] = {'H', 'i'};
    pdp_rng r;
    pdp_rng_seed(&r, 2, 0);
    return pdp_gpt_generate(f->ref, ids, 2, 10, 0.8f, 5, &r);
}

/* checkpoints: the file is written once, by setup, from an MLP with Adam state */
static pdp_status setup_ckpt(fx *f)
{
    pdp_optim_desc od;
    pdp_model *src = NULL;
    pdp_optim *so = NULL;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    if ((st = build_mlp(&src, 11)) || (st = pdp_optim_create(&so, src, &od)) ||
        (st = pdp_checkpoint_save(tmp_path("ckpt.safetensors"), src, so)) ||
        (st = build_mlp(&f->m, 3)) || (st = pdp_optim_create(&f->o, f->m, &od))) {
    }
    pdp_optim_free(so);
    pdp_model_free(src);
    return st;
}
static pdp_status call_ckpt_load(fx *f)
{
    return pdp_checkpoint_load(tmp_path("ckpt.safetensors"), f->m, f->o);
}
static pdp_status call_ckpt_save(fx *f)
{
    return pdp_checkpoint_save(tmp_path("ckpt2.safetensors"), f->m, f->o);
}

/* datasets */
static pdp_status call_synthetic(fx *f)
{
    pdp_dataset_desc dd;
    pdp_status st;
    memset(&dd, 0, sizeof dd);
    dd.max_samples = 6;
    dd.flat = true;
    st = pdp_dataset_synthetic(&f->ds, true, &dd);
    return OUT_NULL_ON_FAIL(st, f->ds);
}

static uint32_t crc32_ieee(const uint8_t *p, size_t n)
{
    uint32_t c = 0xffffffffu;
    size_t i;
    int k;
    for (i = 0; i < n; i++) {
        c ^= p[i];
        for (k = 0; k < 8; k++) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}
static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}
static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}
/* Writes data to path, as a gzip member of one stored DEFLATE block when gz. */
static int write_maybe_gz(const char *path, const uint8_t *data, size_t n, int gz)
{
    static const uint8_t head[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff};
    uint8_t blk[5], tail[8];
    FILE *fp = fopen(path, "wb");
    int ok;
    if (!fp) return -1;
    if (gz) {
        blk[0] = 1; /* BFINAL, stored */
        blk[1] = (uint8_t)n;
        blk[2] = (uint8_t)(n >> 8);
        blk[3] = (uint8_t)~blk[1];
        blk[4] = (uint8_t)~blk[2];
        put_le32(tail, crc32_ieee(data, n));
        put_le32(tail + 4, (uint32_t)n);
        ok = fwrite(head, 1, 10, fp) == 10 && fwrite(blk, 1, 5, fp) == 5 &&
             fwrite(data, 1, n, fp) == n && fwrite(tail, 1, 8, fp) == 8;
    } else {
        ok = fwrite(data, 1, n, fp) == n;
    }
    return fclose(fp) == 0 && ok ? 0 : -1;
}
/* 4 images of 3x2 pixels and their labels, the images gzipped */
static pdp_status setup_idx(fx *f)
{
    uint8_t img[16 + 24], lab[8 + 4];
    int i;
    (void)f;
    put_be32(img, 0x803);
    put_be32(img + 4, 4);
    put_be32(img + 8, 3);
    put_be32(img + 12, 2);
    for (i = 0; i < 24; i++) img[16 + i] = (uint8_t)(i * 10);
    put_be32(lab, 0x801);
    put_be32(lab + 4, 4);
    for (i = 0; i < 4; i++) lab[8 + i] = (uint8_t)(i % 3);
    if (write_maybe_gz(tmp_path("img.gz"), img, sizeof img, 1) ||
        write_maybe_gz(tmp_path("lab"), lab, sizeof lab, 0))
        return PDP_ERR_IO;
    return PDP_OK;
}
static pdp_status call_idx(fx *f)
{
    pdp_status st = pdp_dataset_load_idx(&f->ds, tmp_path("img.gz"), tmp_path("lab"), NULL);
    return OUT_NULL_ON_FAIL(st, f->ds);
}
static pdp_status setup_dataset(fx *f)
{
    pdp_dataset_desc dd;
    memset(&dd, 0, sizeof dd);
    dd.max_samples = 6;
    dd.flat = true;
    return pdp_dataset_synthetic(&f->ds, true, &dd);
}
static pdp_status call_batcher(fx *f)
{
    static const int64_t idx[5] = {4, 1, 1, 0, 5};
    pdp_batcher_desc bd;
    pdp_status st;
    memset(&bd, 0, sizeof bd);
    bd.batch_size = 2;
    bd.shuffle = true;
    bd.indices = idx;
    bd.num_indices = 5;
    st = pdp_batcher_create(&f->b, f->ds, &bd);
    return OUT_NULL_ON_FAIL(st, f->b);
}
/* a directory of three text files (one gzipped) and a *.dat file: the listing, each read,
   the concatenation */
static pdp_status setup_tokens(fx *f)
{
    static const uint8_t a[] = "first file\n", b[] = "second file, gzipped\n", c[] = "third\n";
    (void)f;
    if (mkdir(tmp_path("tok"), 0700) != 0 && errno != EEXIST) return PDP_ERR_IO;
    if (write_maybe_gz(tmp_path("tok/b"), b, sizeof b - 1, 1) ||
        write_maybe_gz(tmp_path("tok/a"), a, sizeof a - 1, 0) ||
        write_maybe_gz(tmp_path("tok/c"), c, sizeof c - 1, 0) ||
        write_maybe_gz(tmp_path("tok/a.dat"), a, 4, 0))
        return PDP_ERR_IO;
    return PDP_OK;
}
static pdp_status call_tokens(fx *f)
{
    pdp_token_dataset_desc td;
    pdp_status st;
    memset(&td, 0, sizeof td);
    td.context = 3;
    st = pdp_token_dataset_load(&f->tok, tmp_path("tok"), &td);
    return OUT_NULL_ON_FAIL(st, f->tok);
}
static pdp_status call_tokens_synthetic(fx *f)
{
    pdp_token_dataset_desc td;
    pdp_status st;
    memset(&td, 0, sizeof td);
    td.context = 3;
    td.max_tokens = 64;
    td.synthetic_fallback = true; /* through the fallback: its error is wrapped */
    st = pdp_token_dataset_load(&f->tok, tmp_path("tok/missing"), &td);
    return OUT_NULL_ON_FAIL(st, f->tok);
}
static pdp_status call_sampler(fx *f)
{
    pdp_dist_sampler_desc sd;
    pdp_status st;
    memset(&sd, 0, sizeof sd);
    sd.dataset_size = 7;
    sd.world_size = 2;
    sd.rank = 1;
    st = pdp_dist_sampler_create(&f->s, &sd);
    return OUT_NULL_ON_FAIL(st, f->s);
}

/* communicators */
static pdp_status call_group(fx *f)
{
    pdp_status st = pdp_local_group_create(&f->g, 2, NULL);
    return OUT_NULL_ON_FAIL(st, f->g);
}
static pdp_status setup_group1(fx *f) { return pdp_local_group_create(&f->g, 1, NULL); }
static pdp_status call_comm_local(fx *f)
{
    pdp_status st = pdp_comm_create_local(&f->c, f->g, 0);
    return OUT_NULL_ON_FAIL(st, f->c);
}
static pdp_status setup_group2(fx *f) { return pdp_local_group_create(&f->g, 2, NULL); }
static pdp_status call_store(fx *f)
{
    pdp_store_desc sd;
    pdp_status st;
    memset(&sd, 0, sizeof sd);
    sd.is_server = true;
    sd.port = 0;
    sd.world_size = 1;
    sd.timeout_s = 5.0;
    st = pdp_store_create(&f->store, &sd);
    return OUT_NULL_ON_FAIL(st, f->store);
}
static pdp_status call_dp(fx *f)
{
    pdp_dp_desc dd;
    pdp_status st;
    memset(&dd, 0, sizeof dd);
    dd.num_workers = 2;
    dd.copy_params = true;
    st = pdp_dp_create(&f->dp, f->m, &dd);
    return OUT_NULL_ON_FAIL(st, f->dp);
}

/* TP layers on a world-1 TP communicator */
static pdp_status setup_tp(fx *f)
{
    pdp_status st;
    if ((st = pdp_local_group_create(&f->g, 1, NULL)) ||
        (st = pdp_comm_create_local(&f->c, f->g, 0)) || (st = model_in(f, 0)) ||
        (st = pdp_model_set_tp(f->m, f->c)))
        return st;
    return PDP_OK;
}
static pdp_status setup_tp_copy(fx *f)
{
    pdp_status st = setup_tp(f);
    return st ? st : pdp_model_add_tp_copy(f->m);
}
static pdp_status setup_tp_col(fx *f)
{
    pdp_status st = setup_tp_copy(f);
    return st ? st : pdp_model_add_column_parallel_linear(f->m, 8);
}
static pdp_status setup_tp_row(fx *f)
{
    pdp_status st = setup_tp_col(f);
    return st ? st : pdp_model_add_row_parallel_linear(f->m, 4);
}
static pdp_status call_tp_copy(fx *f) { return pdp_model_add_tp_copy(f->m); }
static pdp_status call_tp_col(fx *f) { return pdp_model_add_column_parallel_linear(f->m, 8); }
static pdp_status call_tp_row(fx *f) { return pdp_model_add_row_parallel_linear(f->m, 4); }
static pdp_status call_tp_reduce(fx *f) { return pdp_model_add_tp_reduce(f->m); }

static void teardown(fx *f)
{
    pdp_dp_free(f->dp);
    pdp_optim_free(f->o);
    pdp_model_free(f->m);
    pdp_model_free(f->ref);
    pdp_tensor_free(f->t);
    pdp_batcher_free(f->b);
    pdp_dataset_free(f->ds);
    pdp_token_dataset_free(f->tok);
    pdp_dist_sampler_free(f->s);
    pdp_store_free(f->store);
    pdp_comm_free(f->c);
    pdp_local_group_free(f->g);
    pdp_shutdown_threads(); /* the calling thread's GEMM scratch, which a forward keeps */
    memset(f, 0, sizeof *f);
}


/* ---- collective constructors: 2 thread ranks, the k-th allocation failing on one ----
   Each rank thread makes its communicator and runs the case's setup (not armed), meets the
   other at a start line, then calls the constructor, armed on the failing rank only. The
   failing rank then either leaves (frees its communicator: a peer waiting in a collective
   fails at once) or, in a hold run, keeps its communicator until its peer has returned (or
   TIMEOUT_S + 3 s have passed), so the peer cannot learn of the failure from a departure:
   it must get an error from the constructor's own collectives, at the latest by their
   timeout. */

#define WORLD 2
/* The timeout of the runs where the failing rank holds its communicator; the others (it
   leaves at once) take LONG_TIMEOUT_S, so that a loaded machine cannot fail their setup. */
#if defined(__SANITIZE_THREAD__)
#  define TIMEOUT_S 1.0
#else
#  define TIMEOUT_S 0.3
#endif
#define LONG_TIMEOUT_S 10.0

typedef struct rk {
    int rank, world;
    pdp_local_group *g;
    const struct coll_case *cc;
    long fail_at;       /* > 0 on the failing rank; -1: count its allocations only */
    int hold;           /* the failing rank keeps its communicator until its peers return */
    int persist;        /* every allocation after the fail_at-th fails too */
    float out[64];      /* tp_first_forward: the output */
    float before[128], after[128]; /* the model's parameters before and after a failed call
                                      (the MLP has 119; after: NaN when it holds none) */
    pdp_comm *c, *sub;
    pdp_model *m;
    pdp_optim *o;
    pdp_ddp *ddp;
    pdp_zero *z;
    pdp_pp *pp;
    pdp_mesh *mesh;
    pdp_status setup_st, st;
    char msg[1024];
    long made;
    double secs;        /* the constructor's wall time */
} rk;

typedef struct coll_case {
    const char *name;
    const char *fn;
    int world;                      /* 1: not collective (only the failing rank runs) */
    pdp_status (*setup)(rk *r);
    pdp_status (*call)(rk *r);
    int fallback_ok;                /* the call may succeed in spite of the failure (the GEMM
                                       scratch's fallback): then every rank's output is equal */
    int slices_ok;                  /* a failed call may leave a rank's model its slices only */
} coll_case;

static atomic_int coll_ready, coll_returned;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static void nap(void)
{
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
}

/* The model's first 128 parameters into out (NaN where it has no parameter block). */
static void model_params(const pdp_model *m, float *out)
{
    pdp_tensor p;
    int i;
    for (i = 0; i < 128; i++) out[i] = NAN;
    memset(&p, 0, sizeof p);
    if (pdp_model_flat(m, &p, NULL) == PDP_OK && p.data)
        memcpy(out, p.data, (size_t)PDP__MIN(p.count, 128) * sizeof(float));
}

static void *coll_main(void *arg)
{
    rk *r = (rk *)arg;
    double t0, deadline;
    r->setup_st = pdp_comm_create_local(&r->c, r->g, r->rank);
    if (!r->setup_st) r->setup_st = r->cc->setup(r);
    if (r->setup_st) snprintf(r->msg, sizeof r->msg, "setup: %.900s", pdp_last_error());
    atomic_fetch_add(&coll_ready, 1);
    while (atomic_load(&coll_ready) < r->world) nap();
    if (r->setup_st == PDP_OK && r->m) model_params(r->m, r->before);
    if (r->setup_st == PDP_OK) {
        pdp_clear_error();
        thread_persist = r->persist;
        arm_thread(r->fail_at); /* 0: counts only (and fails nothing) on the peers */
        t0 = now_s();
        r->st = r->cc->call(r);
        r->secs = now_s() - t0;
        r->made = disarm_thread();
        snprintf(r->msg, sizeof r->msg, "%s", pdp_last_error());
        if (r->st != PDP_OK && r->m) model_params(r->m, r->after);
    }
    if (r->fail_at > 0 && r->hold) { /* hold the communicator until the peers have returned */
        deadline = now_s() + TIMEOUT_S + 3.0; /* a hung peer still fails the test */
        while (atomic_load(&coll_returned) < r->world - 1 && now_s() < deadline) nap();
    } else if (r->fail_at == 0) {
        atomic_fetch_add(&coll_returned, 1);
    }
    pdp_pp_free(r->pp);
    pdp_mesh_free(r->mesh);
    pdp_optim_free(r->o);
    pdp_zero_free(r->z);
    pdp_ddp_free(r->ddp);
    pdp_model_free(r->m);
    pdp_comm_free(r->sub);
    pdp_comm_free(r->c);
    pdp_shutdown_threads(); /* this thread's GEMM scratch */
    return NULL;
}

/* setups and calls */
static pdp_status cs_none(rk *r) { (void)r; return PDP_OK; }
static pdp_status cs_mlp(rk *r) { return build_mlp(&r->m, 5 + (uint64_t)r->rank); }
/* a pipeline's ranks must each hold the same full model (pdp_pp_create compares them) */
static pdp_status cs_mlp_same(rk *r) { return build_mlp(&r->m, 5); }
static pdp_status cc_split(rk *r)
{
    pdp_status st = pdp_comm_split(r->c, 0, r->world - r->rank, &r->sub);
    return OUT_NULL_ON_FAIL(st, r->sub);
}
static pdp_status cc_mesh(rk *r) /* two splits (groups of 2 and of 1), then the mesh */
{
    pdp_status st = pdp_mesh_create(&r->mesh, r->c, 2, (int[]){2, 1}, NULL);
    return OUT_NULL_ON_FAIL(st, r->mesh);
}
static pdp_status cc_ddp(rk *r)
{
    pdp_ddp_desc dd;
    pdp_status st;
    memset(&dd, 0, sizeof dd);
    dd.bucket_cap_mb = 1e-4; /* a bucket per layer or so */
    dd.first_bucket_mb = 1e-4;
    st = pdp_ddp_create(&r->ddp, r->m, r->c, &dd);
    return OUT_NULL_ON_FAIL(st, r->ddp);
}
static pdp_status zero_at(rk *r, int stage)
{
    pdp_zero_desc zd;
    pdp_status st;
    memset(&zd, 0, sizeof zd);
    zd.stage = stage;
    zd.bucket_cap_mb = 1e-4; /* units of a layer or two */
    zd.first_bucket_mb = 1e-4;
    st = pdp_zero_create(&r->z, r->m, r->c, &zd);
    return OUT_NULL_ON_FAIL(st, r->z);
}
static pdp_status cc_zero1(rk *r) { return zero_at(r, 1); }
static pdp_status cc_zero2(rk *r) { return zero_at(r, 2); }
static pdp_status cc_zero3(rk *r) { return zero_at(r, 3); }
static pdp_status cs_zero2(rk *r)
{
    pdp_status st = cs_mlp(r);
    return st ? st : zero_at(r, 2);
}
static pdp_status cc_zero_optim(rk *r)
{
    pdp_optim_desc od;
    pdp_status st;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    st = pdp_zero_optim_create(&r->o, r->z, &od);
    return OUT_NULL_ON_FAIL(st, r->o);
}
static pdp_status cc_pp(rk *r)
{
    pdp_pp_desc pd;
    pdp_status st;
    memset(&pd, 0, sizeof pd);
    pd.micro_batches = 2;
    st = pdp_pp_create(&r->pp, r->m, r->c, &pd);
    return OUT_NULL_ON_FAIL(st, r->pp);
}

static const single_case single_cases[] = {
    {"tensor", "pdp_tensor_create", setup_none, call_tensor, 0, 0, NULL},
    {"model", "pdp_model_create", setup_none, call_model, 0, 0, NULL},
    {"add_linear", "pdp_model_add_linear", setup_linear, call_add_linear, 1, 0, NULL},
    {"add_relu", "pdp_model_add_relu", setup_linear, call_add_relu, 1, 0, NULL},
    {"add_gelu", "pdp_model_add_gelu", setup_linear, call_add_gelu, 1, 0, NULL},
    {"add_tanh", "pdp_model_add_tanh", setup_linear, call_add_tanh, 1, 0, NULL},
    {"add_sigmoid", "pdp_model_add_sigmoid", setup_linear, call_add_sigmoid, 1, 0, NULL},
    {"add_dropout", "pdp_model_add_dropout", setup_linear, call_add_dropout, 1, 0, NULL},
    {"add_layernorm", "pdp_model_add_layernorm", setup_linear, call_add_layernorm, 1, 0, NULL},
    {"add_conv2d", "pdp_model_add_conv2d", setup_conv, call_add_conv2d, 1, 0, NULL},
    {"add_maxpool2d", "pdp_model_add_maxpool2d", setup_conv, call_add_maxpool, 1, 0, NULL},
    {"add_flatten", "pdp_model_add_flatten", setup_conv_pool, call_add_flatten, 1, 0, NULL},
    {"reserve", "pdp_model_reserve", setup_mlp, call_reserve, 0, 0, NULL},
    {"first_forward", "pdp_model_forward", setup_mlp_pair, call_forward, 0, 0,
     same_forward},
    {"set_precision", "pdp_model_set_precision", setup_mlp, call_set_precision, 0, 0, NULL},
    {"optim_sgd", "pdp_optim_create", setup_mlp, call_optim_sgd, 0, 0, NULL},
    {"optim_adamw", "pdp_optim_create", setup_mlp, call_optim_adam, 0, 0, NULL},
    {"gpt_generate", "pdp_gpt_generate", setup_gpt, call_generate, 0, 0, NULL},
    {"checkpoint_load", "pdp_checkpoint_load", setup_ckpt, call_ckpt_load, 0, 0, NULL},
    {"checkpoint_save", "pdp_checkpoint_save", setup_ckpt, call_ckpt_save, 0, 0, NULL},
    {"dataset_synthetic", "pdp_dataset_synthetic", setup_none, call_synthetic, 0, 0, NULL},
    {"dataset_load_idx", "pdp_dataset_load_idx", setup_idx, call_idx, 0, 0, NULL},
    {"batcher", "pdp_batcher_create", setup_dataset, call_batcher, 0, 0, NULL},
    {"token_dataset_load", "pdp_token_dataset_load", setup_tokens, call_tokens, 0, 0, NULL},
    {"token_dataset_fallback", "pdp_token_dataset_load", setup_none, call_tokens_synthetic, 0,
     0, NULL},
    {"dist_sampler", "pdp_dist_sampler_create", setup_none, call_sampler, 0, 0, NULL},
    {"local_group", "pdp_local_group_create", setup_none, call_group, 0, 0, NULL},
    {"comm_local", "pdp_comm_create_local", setup_group1, call_comm_local, 0, 0, NULL},
    {"comm_local_world_2", "pdp_comm_create_local", setup_group2, call_comm_local, 0, 0, NULL},
    {"store", "pdp_store_create", setup_none, call_store, 0, 0, NULL},
    {"dp", "pdp_dp_create", setup_mlp, call_dp, 0, 1, NULL},
    {"tp_copy", "pdp_model_add_tp_copy", setup_tp, call_tp_copy, 1, 0, NULL},
    {"tp_column", "pdp_model_add_column_parallel_linear", setup_tp_copy, call_tp_col, 1, 0, NULL},
    {"tp_row", "pdp_model_add_row_parallel_linear", setup_tp_col, call_tp_row, 1, 0, NULL},
    {"tp_reduce", "pdp_model_add_tp_reduce", setup_tp_row, call_tp_reduce, 1, 0, NULL},
};


/* communication hooks: the bf16 hook's scratch (not collective) */
static pdp_status cs_ddp(rk *r)
{
    pdp_status st = cs_mlp(r);
    return st ? st : cc_ddp(r);
}
static pdp_status cc_ddp_hook(rk *r)
{
    pdp_ddp_comm_hook h = pdp_ddp_hook_bf16_compress();
    return pdp_ddp_register_comm_hook(r->ddp, &h);
}
static pdp_status cc_zero_hook(rk *r)
{
    pdp_ddp_comm_hook h = pdp_ddp_hook_bf16_compress();
    return pdp_zero_register_comm_hook(r->z, &h);
}

/* TP: f, ColumnParallelLinear(8), ReLU, RowParallelLinear(4), g, Linear(CLASSES) on IN features:
   the TP form of tp_reference (same state_dict names) */
static pdp_status cs_tp(rk *r)
{
    pdp_model_desc md;
    pdp_optim_desc od;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    md.seed = 9;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    if ((st = pdp_model_create(&r->m, &md)) || (st = pdp_model_set_tp(r->m, r->c)) ||
        (st = pdp_model_add_tp_copy(r->m)) ||
        (st = pdp_model_add_column_parallel_linear(r->m, 8)) ||
        (st = pdp_model_add_relu(r->m)) || (st = pdp_model_add_row_parallel_linear(r->m, 4)) ||
        (st = pdp_model_add_tp_reduce(r->m)) || (st = pdp_model_add_linear(r->m, CLASSES)))
        return st;
    return pdp_optim_create(&r->o, r->m, &od);
}
static pdp_status tp_reference(const char *path)
{
    pdp_model_desc md;
    pdp_optim_desc od;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = IN;
    md.seed = 13;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    if (!(st = pdp_model_create(&m, &md)) && !(st = pdp_model_add_linear(m, 8)) &&
        !(st = pdp_model_add_relu(m)) && !(st = pdp_model_add_linear(m, 4)) &&
        !(st = pdp_model_add_linear(m, CLASSES)) && !(st = pdp_optim_create(&o, m, &od)))
        st = pdp_checkpoint_save(path, m, o);
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}
static pdp_status cc_forward(rk *r)
{
    const pdp_tensor *y = NULL;
    pdp_status st = run_forward_y(r->m, &y);
    if (st == PDP_OK) memcpy(r->out, y->data, (size_t)PDP__MIN(y->count, 64) * sizeof(float));
    return st;
}
static pdp_status cc_tp_load(rk *r)
{
    return pdp_tp_checkpoint_load(tmp_path("tp.safetensors"), r->m, r->o);
}
static pdp_status cc_tp_save(rk *r)
{
    return pdp_tp_checkpoint_save(tmp_path("tp2.safetensors"), r->m, r->o);
}
/* ZeRO stage 2 with Adam, and a saved set of it */
static pdp_status cs_zero2_optim(rk *r)
{
    pdp_status st = cs_zero2(r);
    return st ? st : cc_zero_optim(r);
}
static pdp_status cs_zero2_saved(rk *r)
{
    pdp_status st = cs_zero2_optim(r);
    return st ? st : pdp_zero_checkpoint_save(r->z, r->o, tmp_path("zset"));
}
static pdp_status cc_zero_load(rk *r)
{
    return pdp_zero_checkpoint_load(r->z, r->o, tmp_path("zset"));
}
static pdp_status cc_zero_load_full(rk *r)
{
    return pdp_zero_checkpoint_load_full(r->z, r->o, tmp_path("ckpt.safetensors"));
}
static pdp_status cc_zero_save(rk *r)
{
    return pdp_zero_checkpoint_save(r->z, r->o, tmp_path("zset2"));
}
static pdp_status cc_zero_consolidate(rk *r)
{
    return pdp_zero_checkpoint_consolidate(r->z, r->o, tmp_path("zfull.safetensors"));
}

static const coll_case coll_cases[] = {
    {"comm_split", "pdp_comm_split", WORLD, cs_none, cc_split, 0, 0},
    {"mesh", "pdp_mesh_create", WORLD, cs_none, cc_mesh, 0, 0},
    {"ddp", "pdp_ddp_create", WORLD, cs_mlp, cc_ddp, 0, 0},
    {"zero_1", "pdp_zero_create", WORLD, cs_mlp, cc_zero1, 0, 0},
    {"zero_2", "pdp_zero_create", WORLD, cs_mlp, cc_zero2, 0, 0},
    /* stage 3 frees the model's parameter block before it allocates its buffers (so that
       its peak stays under DDP's, as zero_stage3_trains_where_ddp_does_not_fit holds it): a
       failure after that leaves every rank its slices only, as zero.h says */
    {"zero_3", "pdp_zero_create", WORLD, cs_mlp, cc_zero3, 0, 1},
    {"zero_optim", "pdp_zero_optim_create", 1, cs_zero2, cc_zero_optim, 0, 0},
    {"ddp_comm_hook", "pdp_ddp_register_comm_hook", 1, cs_ddp, cc_ddp_hook, 0, 0},
    {"zero_comm_hook", "pdp_zero_register_comm_hook", 1, cs_zero2, cc_zero_hook, 0, 0},
    {"pp", "pdp_pp_create", WORLD, cs_mlp_same, cc_pp, 0, 0},
    {"tp_first_forward", "pdp_model_forward", WORLD, cs_tp, cc_forward, 1, 0},
    {"tp_checkpoint_load", "pdp_tp_checkpoint_load", WORLD, cs_tp, cc_tp_load, 0, 0},
    {"tp_checkpoint_save", "pdp_tp_checkpoint_save", WORLD, cs_tp, cc_tp_save, 0, 0},
    {"zero_checkpoint_load", "pdp_zero_checkpoint_load", WORLD, cs_zero2_saved, cc_zero_load,
     0, 0},
    {"zero_checkpoint_load_full", "pdp_zero_checkpoint_load_full", WORLD, cs_zero2_optim,
     cc_zero_load_full, 0, 0},
    {"zero_checkpoint_save", "pdp_zero_checkpoint_save", WORLD, cs_zero2_optim, cc_zero_save,
     0, 0},
    {"zero_checkpoint_consolidate", "pdp_zero_checkpoint_consolidate", WORLD, cs_zero2_optim,
     cc_zero_consolidate, 0, 0},
};

/* Runs one collective run: rank fr's allocation k fails (k = -1: only counted). */
static void coll_run(const coll_case *cc, rk *ctx, int fr, long k, int hold, int persist)
{
    pthread_t t[WORLD];
    pdp_local_group *g = NULL;
    pdp_comm_desc cd;
    int r;
    memset(&cd, 0, sizeof cd);
    cd.timeout_s = hold ? TIMEOUT_S : LONG_TIMEOUT_S;
    cd.name = cc->name;
    memset(ctx, 0, WORLD * sizeof *ctx);
    if (pdp_local_group_create(&g, cc->world, &cd) != PDP_OK) {
        ctx[0].setup_st = PDP_ERR_STATE;
        snprintf(ctx[0].msg, sizeof ctx[0].msg, "group: %.900s", pdp_last_error());
        return;
    }
    atomic_store(&coll_ready, 0);
    atomic_store(&coll_returned, 0);
    for (r = 0; r < cc->world; r++) {
        ctx[r].rank = r;
        ctx[r].world = cc->world;
        ctx[r].g = g;
        ctx[r].cc = cc;
        ctx[r].fail_at = r == fr ? k : 0;
        ctx[r].hold = hold;
        ctx[r].persist = persist;
        pthread_create(&t[r], NULL, coll_main, &ctx[r]);
    }
    for (r = 0; r < cc->world; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
}

/* Runs one collective case: each rank in turn counts its allocations in a run without
   failures (every rank must succeed), then fails each of them, k = 1..n. The failing rank
   leaves (frees its communicator) as soon as the call returns, as a program that exits on
   the error does, except at k = n (the last allocation: after the last collective, if any
   comes after the first), where it holds its communicator: the peer must then learn of the
   failure from the call's own collectives (an agreement), or their timeout. */
static enum greatest_test_res alloc_fail_collective(void *arg)
{
    const coll_case *cc = (const coll_case *)arg;
    static char msg[2048], what[256];
    static rk ctx[WORLD];
    int fr, r, persist;
    long k, n;
    double t0 = now_s();
    for (persist = 0; persist < 2; persist++)
    for (fr = 0; fr < cc->world; fr++) {
        coll_run(cc, ctx, fr, -1, 0, 0);
        n = ctx[fr].made;
        for (r = 0; r < cc->world; r++)
            if (ctx[r].setup_st != PDP_OK || ctx[r].st != PDP_OK) {
                snprintf(msg, sizeof msg, "%s: no failure injected, rank %d: %s: %s", cc->name,
                         r, pdp_status_name(ctx[r].st), ctx[r].msg);
                FAILm(msg);
            }
        if (getenv("PDP_TEST_ALLOC_VERBOSE"))
            printf("%s: rank %d: %ld allocations\n", cc->name, fr, n);
        for (k = 1; k <= n; k++) {
            long base = atomic_load(&live_blocks);
            rk *f = &ctx[fr];
            int hold = k == n && !persist;
            coll_run(cc, ctx, fr, k, hold, persist);
            snprintf(what, sizeof what, "%s: rank %d's allocation %ld of %ld%s failed (%s)",
                     cc->name, fr, k, n, persist ? " (and every later one)" : "",
                     hold ? "holding its comm" : "leaving");
            for (r = 0; r < cc->world; r++)
                if (ctx[r].setup_st != PDP_OK) {
                    snprintf(msg, sizeof msg, "%s: rank %d: %s", cc->name, r, ctx[r].msg);
                    FAILm(msg);
                }
            if (f->made < k) {
                snprintf(msg, sizeof msg, "%s: rank %d made %ld allocations, then %ld", cc->name,
                         fr, n, f->made);
                FAILm(msg);
            }
            if (cc->fallback_ok && f->st == PDP_OK) { /* every rank succeeded, equally */
                for (r = 0; r < cc->world; r++)
                    if (ctx[r].st != PDP_OK || !close_floats(ctx[r].out, f->out, 64)) {
                        snprintf(msg, sizeof msg, "%s and it succeeded; rank %d: %s, %s output",
                                 what, r, pdp_status_name(ctx[r].st),
                                 ctx[r].st ? "no" : "another");
                        FAILm(msg);
                    }
            } else if (f->st != PDP_ERR_OUT_OF_MEMORY ||
                       strncmp(f->msg, cc->fn, strlen(cc->fn)) != 0) {
                snprintf(msg, sizeof msg, "%s: %s \"%s\"", what, pdp_status_name(f->st), f->msg);
                FAILm(msg);
            } else {
                for (r = 0; r < cc->world; r++)
                    if (r != fr && (ctx[r].st == PDP_OK ||
                                    ctx[r].secs > (hold ? TIMEOUT_S : 0.0) + 2.0)) {
                        snprintf(msg, sizeof msg, "%s; rank %d returned %s after %.2f s: \"%s\"",
                                 what, r, pdp_status_name(ctx[r].st), ctx[r].secs, ctx[r].msg);
                        FAILm(msg);
                    }
            }
            for (r = 0; r < cc->world; r++) /* a failed wrap leaves a whole model: its own or
                                                  rank 0's parameters (the broadcast's) */
                if (ctx[r].st != PDP_OK && ctx[r].m && !cc->slices_ok &&
                    memcmp(ctx[r].after, ctx[r].before, sizeof ctx[r].after) != 0 &&
                    memcmp(ctx[r].after, ctx[0].before, sizeof ctx[r].after) != 0) {
                    snprintf(msg, sizeof msg, "%s: rank %d's model holds neither its parameters "
                             "nor rank 0's (%g, %g, ...)", what, r, ctx[r].after[0],
                             ctx[r].after[1]);
                    FAILm(msg);
                }
            if (atomic_load(&live_blocks) != base) {
                snprintf(msg, sizeof msg, "%s: %ld blocks leaked", what,
                         atomic_load(&live_blocks) - base);
                FAILm(msg);
            }
        }
    }
    if (getenv("PDP_TEST_ALLOC_VERBOSE")) printf("%s: %.2f s\n", cc->name, now_s() - t0);
    PASS();
}

/* Runs one case for k = 1, 2, ... (see the top comment). */
/* 0: only the k-th allocation fails; 1: it and every later one (memory that stays short,
   so that the error paths' own allocations fail too) */
static int g_persist;

static enum greatest_test_res alloc_fail_single(void *arg)
{
    const single_case *sc = (const single_case *)arg;
    static char msg[2048];
    long k, made = 0, base;
    const char *mode = g_persist ? " (and every later one)" : "";
    any_persist = thread_persist = g_persist;
    for (k = 1; k <= MAXK; k++) {
        fx f;
        pdp_status st;
        const char *err;
        memset(&f, 0, sizeof f);
        base = atomic_load(&live_blocks);
        if ((st = sc->setup(&f)) != PDP_OK) {
            snprintf(msg, sizeof msg, "%s: setup: %s", sc->name, pdp_last_error());
            FAILm(msg);
        }
        if (sc->adds_to_model) {
            f.layers = pdp_model_num_layers(f.m);
            f.params = pdp_model_param_count(f.m);
        }
        pdp_clear_error();
        if (sc->any_thread) {
            atomic_store(&any_allocs, 0);
            atomic_store(&any_fail_at, k);
        } else {
            arm_thread(k);
        }
        st = sc->call(&f);
        if (sc->any_thread) {
            made = atomic_load(&any_allocs);
            atomic_store(&any_fail_at, 0);
        } else {
            made = disarm_thread();
        }
        err = pdp_last_error();
        if (made < k) { /* the k-th allocation was never reached: the call ran to its end */
            if (st != PDP_OK) {
                snprintf(msg, sizeof msg, "%s: no failure injected, %s: %s", sc->name,
                         pdp_status_name(st), err);
                teardown(&f);
                FAILm(msg);
            }
            teardown(&f);
            if (getenv("PDP_TEST_ALLOC_VERBOSE"))
                printf("%s: %ld allocations\n", sc->name, made);
            break;
        }
        if (st == PDP_OK && sc->fallback_ok && sc->fallback_ok(&f)) {
            teardown(&f);
            continue;
        }
        if (st != PDP_ERR_OUT_OF_MEMORY || strncmp(err, sc->fn, strlen(sc->fn)) != 0 ||
            /* checkpoint.h: every message of a load or save names the file after fn */
            (!strncmp(sc->fn, "pdp_checkpoint_", 15) && !strstr(err, ".safetensors: ")) ||
            strstr(err + strlen(sc->fn), sc->fn) || /* and says the function's name once */
            !strstr(err, "memory")) {               /* and what ran out */
            snprintf(msg, sizeof msg, "%s: allocation %ld of %ld%s failed: %s \"%s\"", sc->name,
                     k, made, mode, pdp_status_name(st), err);
            teardown(&f);
            FAILm(msg);
        }
        if (f.m && !f.dp && run_forward(f.m) != PDP_OK) { /* the model stays usable */
            snprintf(msg, sizeof msg, "%s: allocation %ld%s failed, then forward: %s",
                     sc->name, k, mode, pdp_last_error());
            teardown(&f);
            FAILm(msg);
        }
        if (sc->adds_to_model) {
            if (pdp_model_num_layers(f.m) != f.layers || pdp_model_param_count(f.m) != f.params) {
                snprintf(msg, sizeof msg, "%s: allocation %ld%s failed: %d layers, %lld params "
                         "after, %d and %lld before", sc->name, k, mode, pdp_model_num_layers(f.m),
                         (long long)pdp_model_param_count(f.m), f.layers, (long long)f.params);
                teardown(&f);
                FAILm(msg);
            }
        }
        teardown(&f);
        if (atomic_load(&live_blocks) != base) {
            snprintf(msg, sizeof msg, "%s: allocation %ld of %ld%s failed: %ld blocks leaked",
                     sc->name, k, made, mode, atomic_load(&live_blocks) - base);
            FAILm(msg);
        }
    }
    any_persist = thread_persist = 0;
    ASSERTm(sc->name, k <= MAXK && made >= 0);
    PASS();
}

/* The library allocates through this file's allocator (also when the test links the shared
   implementation object: counting_alloc.h's hooks). Were it not, every case below would see
   a constructor that never allocates and pass without failing anything. */
TEST alloc_fail_the_library_allocates_through_the_test(void)
{
    pdp_tensor *t = NULL;
    int64_t shape[1] = {4};
    long before = atomic_load(&live_blocks);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cpu(), 1, shape), pdp_status_name);
    ASSERT(atomic_load(&live_blocks) > before);
    pdp_tensor_free(t);
    ASSERT_EQ(before, atomic_load(&live_blocks));
    arm_thread(1);
    ASSERT_ENUM_EQ(PDP_ERR_OUT_OF_MEMORY, pdp_tensor_create(&t, pdp_cpu(), 1, shape),
                   pdp_status_name);
    ASSERT(disarm_thread() >= 1);
    ASSERT(t == NULL);
    PASS();
}

SUITE(alloc_fail)
{
    size_t i;
    RUN_TEST(alloc_fail_the_library_allocates_through_the_test);
    for (g_persist = 0; g_persist < 2; g_persist++)
        for (i = 0; i < sizeof single_cases / sizeof single_cases[0]; i++)
            RUN_TEST1(alloc_fail_single, (void *)&single_cases[i]);
    if (tp_reference(tmp_path("tp.safetensors")) != PDP_OK) {
        fprintf(stderr, "tp_reference: %s\n", pdp_last_error());
        exit(1);
    }
    for (i = 0; i < sizeof coll_cases / sizeof coll_cases[0]; i++)
        RUN_TEST1(alloc_fail_collective, (void *)&coll_cases[i]);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    if (test_temp_dir(g_dir, sizeof g_dir, "pdp_test_alloc_fail") != 0) {
        perror("mkdtemp");
        return 1;
    }
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(alloc_fail);
    if (test_remove_tree(g_dir) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    GREATEST_MAIN_END();
}
