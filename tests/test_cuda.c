/* test_cuda: CUDA devices, two builds of one file.

   `make test` builds it without PDP_CUDA: every CUDA request must fail with
   PDP_ERR_UNSUPPORTED and a message naming PDP_CUDA, and nothing else changes.

   `make cuda` builds it with -DPDP_CUDA into build/cuda/test_cuda (linked with
   pdp_cuda.o, cuBLAS, NCCL). Every test then compares the GPU with the CPU
   reference of the same model (same seed, so the same initial parameters):
   each layer's forward output and backward gradients (the tested layer sits
   after a layer with parameters, so its dx reaches a weight gradient), both
   losses, SGD/Adam/AdamW, gradient clipping, full MLP and CNN training steps,
   DDP over NCCL at world size 1 and with one thread per GPU, ZeRO stages 1-3
   over NCCL on two GPUs (against one CPU model and the same run on the local
   backend: parameters, memory and byte figures), DP over the GPUs
   present (at least two workers, so one GPU still runs DP's multi-worker path)
   against one CPU model on the global batch, tensor and pipeline parallelism
   over NCCL (2-4 GPUs; 2-D DP x TP and DP x PP on 4) against one CPU model;
   bf16 precision (one Linear element by element against bounds; MLP and CNN
   training against the CPU's bf16 and the GPU's fp32 training, tolerances stated there);
   a GPT's kinds (attention with and without dropout and with more heads than samples,
   a residual region, a tied head, the embedding with repeated ids, its gradient bit for
   bit where the order of the adds matters, an id outside the vocabulary) and a whole
   GPT from pdp_gpt_create, three AdamW steps with dropout and ignored targets; the GPT
   over NCCL under ZeRO, in a pipeline, and split by heads (TP 2 and TP 3 with and without
   sequence parallelism and recomputing, DP 2 x TP 2 + SP under DDP and ZeRO-1: issue 25's
   covering set); plus "a step allocates nothing"
   through the caching allocator's counters, for one model and for DP. Cases
   that random data never reach have tests of their own (each added after a
   mutant of pdp_cuda.cu survived): block reuse and empty_cache through the
   allocator's counters, MaxPool's tie and NaN rules, windows that miss the last
   row (10 x 10), logits ~1e3, SGD dampening, Adam eps, TF32 switched off again.
   The NCCL backend's collectives, messages and split are the backend conformance
   suite's (tests/comm_conformance.h, tests named conf_*), run here with a thread
   per GPU on 1 .. min(GPUs, 4) ranks.
   Tolerance: 1e-5 relative to the largest reference magnitude (TF32 off).
   Without a device (cudaErrorNoDevice, cudaErrorInsufficientDriver) every GPU
   test skips; PDP_TEST_REQUIRE_CUDA=1 turns those skips into failures. */

#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"

#include <float.h>
#include <pthread.h>
#include <unistd.h>

#ifndef PDP_CUDA

/* ---- without PDP_CUDA ---- */

TEST cuda_requests_unsupported_without_macro(void)
{
    int64_t shape[2] = {2, 3};
    pdp_tensor *t = NULL;
    pdp_model *m = NULL;
    pdp_model_desc md;
    pdp_comm *c = NULL;
    pdp_comm_desc cd;
    pdp_nccl_group *g = NULL;
    pdp_device devs[1];
    int n = 5;
    devs[0] = pdp_cuda(0);

    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_tensor_create(&t, pdp_cuda(0), 2, shape),
                   pdp_status_name);
    ASSERT(t == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "PDP_CUDA") != NULL);

    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_cuda_device_count(&n), pdp_status_name);
    ASSERT_EQ(0, n);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "PDP_CUDA") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_cuda_set_tf32(true), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_cuda_synchronize(pdp_cuda(0)), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_cuda_synchronize") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_cuda_release(pdp_cuda(0)), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_cuda_release") != NULL);

    memset(&md, 0, sizeof md);
    md.input_shape[0] = 4;
    md.device = pdp_cuda(0); /* refused at create, as a tensor is */
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_model_create(&m, &md), pdp_status_name);
    ASSERT(m == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_model_create") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "PDP_CUDA") != NULL);

    memset(&cd, 0, sizeof cd);
    cd.backend = PDP_BACKEND_NCCL;
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_comm_init_env(&c, &cd), pdp_status_name);
    ASSERT(c == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "PDP_CUDA") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_nccl_group_create(&g, 1, devs, NULL), pdp_status_name);
    ASSERT(g == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "PDP_CUDA") != NULL);
    PASS();
}

/* A batcher asked for batches on a GPU fails at create, naming itself and the macro. */
TEST cuda_batcher_on_device_unsupported_without_macro(void)
{
    pdp_dataset *ds = NULL;
    pdp_dataset_desc dd;
    pdp_batcher_desc bd;
    pdp_batcher *b = NULL;
    memset(&dd, 0, sizeof dd);
    dd.max_samples = 10;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_synthetic(&ds, true, &dd), pdp_status_name);
    memset(&bd, 0, sizeof bd);
    bd.device = pdp_cuda(0);
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_batcher_create(&b, ds, &bd), pdp_status_name);
    ASSERT(b == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_batcher_create") == pdp_last_error());
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "PDP_CUDA") != NULL);
    pdp_dataset_free(ds);
    PASS();
}

SUITE(cuda)
{
    RUN_TEST(cuda_requests_unsupported_without_macro);
    RUN_TEST(cuda_batcher_on_device_unsupported_without_macro);
}

#else /* PDP_CUDA */

/* ---- with PDP_CUDA: helpers ---- */

#define TOL 1e-5
#define B 6

static int g_ndev = -1;

/* Devices visible, or -1 when there is none (the tests then skip). */
static int devices(void)
{
    if (g_ndev < 0) {
        int n = 0;
        pdp_status st = pdp_cuda_device_count(&n);
        g_ndev = st == PDP_OK ? n : -1;
        if (st != PDP_OK && st != PDP_ERR_NO_DEVICE)
            fprintf(stderr, "test_cuda: pdp_cuda_device_count: %s\n", pdp_last_error());
    }
    return g_ndev;
}

#define NEED_GPU()                                                                           \
    do {                                                                                     \
        if (devices() < 1) SKIP_NO_CUDAm("no CUDA device (cudaErrorNoDevice or no driver)"); \
    } while (0)

/* max |a - b| / max |b| (b the CPU reference) */
static double rel_err(const float *a, const float *b, int64_t n)
{
    double num = 0.0, den = 1e-30;
    int64_t i;
    for (i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) return 1e30;
        if (d > num) num = d;
        if (fabs((double)b[i]) > den) den = fabs((double)b[i]);
    }
    return num / den;
}

/* A host copy of t (malloc'd). */
static float *host_copy(const pdp_tensor *t)
{
    float *h = (float *)malloc((size_t)t->count * sizeof(float));
    if (h && pdp_tensor_download(t, h) != PDP_OK) {
        free(h);
        return NULL;
    }
    return h;
}

static void fill_random(float *x, int64_t n, uint64_t seed)
{
    pdp_rng r;
    int64_t i;
    pdp_rng_seed(&r, seed, 7);
    for (i = 0; i < n; i++) x[i] = 2.0f * pdp_rng_uniform(&r) - 1.0f;
}

/* Compares two models' flat params (which = 0) or grads (which = 1). */
static double model_rel_err(const pdp_model *gpu, const pdp_model *cpu, int which)
{
    pdp_tensor gp, gg, cp, cg;
    float *h;
    double e;
    if (pdp_model_flat(gpu, &gp, &gg) != PDP_OK || pdp_model_flat(cpu, &cp, &cg) != PDP_OK)
        return 1e30;
    h = host_copy(which ? &gg : &gp);
    if (!h) return 1e30;
    e = rel_err(h, which ? cg.data : cp.data, cp.count);
    free(h);
    return e;
}

/* A model on device dev of the given kind (see build). The *_EDGE cases take a
   10 x 10 image, whose last row and column no window reaches (k 3, stride 2, no
   padding): col2im and the pooling backward must skip window positions past
   Ho - 1 there, which the 9 x 9 cases never meet. */
typedef enum { L_LINEAR, L_RELU, L_GELU, L_TANH, L_SIGMOID, L_SILU, L_DROPOUT, L_LAYERNORM,
               L_CONV, L_MAXPOOL, L_MAXPOOL_OVERLAP, L_FLATTEN, L_CONV_EDGE, L_MAXPOOL_EDGE,
               L_ATTENTION, L_ATTENTION_DROPOUT, L_ATTENTION_HEADS, L_RESIDUAL, L_TIED_LINEAR,
               L_GELU_ERF, L_COUNT } layer_case;

static const char *case_name[L_COUNT] = {"Linear", "ReLU", "GELU", "Tanh", "Sigmoid", "SiLU",
                                         "Dropout", "LayerNorm", "Conv2d", "MaxPool2d",
                                         "MaxPool2d(3,2)", "Flatten", "Conv2d(3,2,0) on 10x10",
                                         "MaxPool2d(3,2) on 10x10",
                                         "CausalSelfAttention(2 heads)",
                                         "CausalSelfAttention(2 heads, dropout 0.3)",
                                         "CausalSelfAttention(7 heads of 1 > batch)",
                                         "Residual(Linear, GELU) + ResidualAdd",
                                         "TiedLinear(1.weight)", "GELUErf"};

static pdp_status build(pdp_model **out, layer_case k, pdp_device dev)
{
    pdp_model_desc d;
    pdp_model *m;
    pdp_status st;
    bool img = k == L_CONV || k == L_MAXPOOL || k == L_MAXPOOL_OVERLAP || k == L_FLATTEN ||
               k == L_CONV_EDGE || k == L_MAXPOOL_EDGE;
    bool seq = k == L_ATTENTION || k == L_ATTENTION_DROPOUT || k == L_ATTENTION_HEADS ||
               k == L_RESIDUAL || k == L_TIED_LINEAR;
    int64_t side = k == L_CONV_EDGE || k == L_MAXPOOL_EDGE ? 10 : 9;
    memset(&d, 0, sizeof d);
    d.seed = 1234;
    d.device = dev;
    if (seq) { /* a GPT's kinds: [T, C] samples of an Embedding, a Linear per position */
        d.input_ndim = 1;
        d.input_shape[0] = 5;
        d.input_dtype = PDP_DTYPE_I32;
    } else if (img) {
        d.input_ndim = 3;
        d.input_shape[0] = 2;
        d.input_shape[1] = side;
        d.input_shape[2] = side;
    } else {
        d.input_ndim = 1;
        d.input_shape[0] = 13;
    }
    if ((st = pdp_model_create(&m, &d)) != PDP_OK) return st;
    /* a first layer with parameters, so the tested layer's dx reaches a gradient */
    st = img ? pdp_model_add_conv2d(m, 3, 1, 1, 0)
         : seq ? pdp_model_add_embedding(m, 7, 13, 5)
               : pdp_model_add_linear(m, 12);
    if (st == PDP_OK && seq) st = pdp_model_add_linear(m, k == L_ATTENTION_HEADS ? 21 : 12);
    if (st == PDP_OK) switch (k) {
        case L_LINEAR: st = pdp_model_add_linear(m, 7); break;
        case L_RELU: st = pdp_model_add_relu(m); break;
        case L_GELU: st = pdp_model_add_gelu(m); break;
        case L_TANH: st = pdp_model_add_tanh(m); break;
        case L_SIGMOID: st = pdp_model_add_sigmoid(m); break;
        case L_SILU: st = pdp_model_add_silu(m); break;
        case L_GELU_ERF: st = pdp_model_add_gelu_erf(m); break;
        case L_DROPOUT: st = pdp_model_add_dropout(m, 0.3f); break;
        case L_LAYERNORM: st = pdp_model_add_layernorm(m, 1e-5f); break;
        case L_CONV: st = pdp_model_add_conv2d(m, 4, 3, 2, 1); break;
        case L_MAXPOOL: st = pdp_model_add_maxpool2d(m, 2, 2); break;
        case L_MAXPOOL_OVERLAP: st = pdp_model_add_maxpool2d(m, 3, 2); break;
        case L_CONV_EDGE: st = pdp_model_add_conv2d(m, 4, 3, 2, 0); break;
        case L_MAXPOOL_EDGE: st = pdp_model_add_maxpool2d(m, 3, 2); break;
        case L_FLATTEN:
            st = pdp_model_add_flatten(m);
            if (st == PDP_OK) st = pdp_model_add_linear(m, 5);
            break;
        /* [5, 12] = q | k | v of C 4; 7 heads of 1 channel: more heads than B, so the
           products batch over heads (the other way round from the cases before) */
        case L_ATTENTION: st = pdp_model_add_causal_self_attention(m, 2, 0.0f); break;
        case L_ATTENTION_DROPOUT: st = pdp_model_add_causal_self_attention(m, 2, 0.3f); break;
        case L_ATTENTION_HEADS: st = pdp_model_add_causal_self_attention(m, 7, 0.0f); break;
        case L_RESIDUAL:
            if ((st = pdp_model_residual_begin(m)) == PDP_OK &&
                (st = pdp_model_add_linear(m, 12)) == PDP_OK &&
                (st = pdp_model_add_gelu(m)) == PDP_OK)
                st = pdp_model_residual_end(m);
            break;
        case L_TIED_LINEAR: /* [5, 13] times layer 1's weight [12, 13] transposed */
            if ((st = pdp_model_add_linear(m, 13)) == PDP_OK)
                st = pdp_model_add_tied_linear(m, "1.weight");
            break;
        default: break;
        }
    if (st != PDP_OK) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

/* x [B, in] on the CPU and a copy on the GPU; a model of token ids gets ids in [0, 7)
   (the bytes of int32 in a float tensor's buffer, marked int32) */
static pdp_status make_input(const pdp_model *m, uint64_t seed, pdp_tensor **cpu, pdp_tensor **gpu,
                             pdp_device dev)
{
    int64_t shape[4], in[3], j;
    int nd = m->in_ndim, i;
    pdp_status st;
    shape[0] = B;
    memcpy(in, m->in_shape, sizeof in);
    for (i = 0; i < nd; i++) shape[i + 1] = in[i];
    if ((st = pdp_tensor_create(cpu, pdp_cpu(), nd + 1, shape)) != PDP_OK) return st;
    fill_random((*cpu)->data, (*cpu)->count, seed);
    if (m->in_dtype == PDP_DTYPE_I32)
        for (j = 0; j < (*cpu)->count; j++) {
            int32_t id = (int32_t)((*cpu)->data[j] * 3.5f + 3.5f); /* [-1, 1) -> [0, 7) */
            memcpy(&(*cpu)->data[j], &id, sizeof id);
        }
    if ((st = pdp_tensor_create(gpu, dev, nd + 1, shape)) != PDP_OK) return st;
    st = pdp_tensor_upload(*gpu, (*cpu)->data);
    (*cpu)->dtype = (*gpu)->dtype = m->in_dtype;
    return st;
}

/* ---- with PDP_CUDA: basics ---- */

TEST cuda_device_count_and_bad_ordinal(void)
{
    int64_t shape[1] = {4};
    pdp_tensor *t = NULL;
    NEED_GPU();
    ASSERT(devices() >= 1);
    ASSERT(pdp_tensor_create(&t, pdp_cuda(devices() + 3), 1, shape) != PDP_OK);
    ASSERT(t == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_cuda") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_tensor_create") != NULL);
    PASS();
}

TEST cuda_tensor_copies_round_trip(void)
{
    int64_t shape[2] = {3, 37};
    pdp_tensor *a = NULL, *b = NULL;
    float host[111], back[111];
    int i;
    NEED_GPU();
    for (i = 0; i < 111; i++) host[i] = (float)i * 0.5f - 7.0f;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&a, pdp_cuda(0), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&b, pdp_cuda(0), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(b, back), pdp_status_name);
    for (i = 0; i < 111; i++) ASSERT_EQ(0.0f, back[i]); /* created zeroed */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(a, host), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_copy(b, a), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(b, back), pdp_status_name);
    for (i = 0; i < 111; i++) ASSERT_EQ(host[i], back[i]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_fill(a, 2.5f), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(a, back), pdp_status_name);
    for (i = 0; i < 111; i++) ASSERT_EQ(2.5f, back[i]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_zeros(a), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(a, back), pdp_status_name);
    for (i = 0; i < 111; i++) ASSERT_EQ(0.0f, back[i]);
    pdp_tensor_free(a);
    pdp_tensor_free(b);
    PASS();
}

/* The caching allocator through its counters: a freed block goes back to the
   cache and the next allocation of its size takes it (no cudaMalloc, in-use
   bytes back where they were); a smaller request does not take a larger free
   block; pdp_cuda_empty_cache gives every free block back. */
TEST cuda_caching_allocator_reuses_freed_blocks(void)
{
    int64_t big[1] = {4096}, small[1] = {100};
    pdp_tensor *t = NULL;
    pdp_cuda_memory_stats base, s;
    NEED_GPU();
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_empty_cache(pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &base), pdp_status_name);
    ASSERT_EQ(base.in_use_bytes, base.reserved_bytes); /* nothing cached after empty_cache */

    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cuda(0), 1, big), pdp_status_name);
    pdp_tensor_free(t);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &s), pdp_status_name);
    ASSERT_EQ(base.device_mallocs + 1, s.device_mallocs);
    ASSERT_EQ(base.in_use_bytes, s.in_use_bytes);
    ASSERT(s.reserved_bytes >= base.reserved_bytes + 4096 * sizeof(float));

    /* the same size again: the cached block, no cudaMalloc */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cuda(0), 1, big), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &s), pdp_status_name);
    ASSERT_EQ(base.device_mallocs + 1, s.device_mallocs);
    ASSERT(s.in_use_bytes >= base.in_use_bytes + 4096 * sizeof(float));
    pdp_tensor_free(t);

    /* a small tensor gets a block of its own size, not the cached 16 KiB one */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cuda(0), 1, small), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &s), pdp_status_name);
    ASSERT_EQ(base.device_mallocs + 2, s.device_mallocs);
    ASSERT(s.in_use_bytes >= base.in_use_bytes + 100 * sizeof(float));
    ASSERT(s.in_use_bytes < base.in_use_bytes + 4096 * sizeof(float));
    pdp_tensor_free(t);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &s), pdp_status_name);
    ASSERT_EQ(base.in_use_bytes, s.in_use_bytes);

    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_empty_cache(pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &s), pdp_status_name);
    ASSERT_EQ(base.reserved_bytes, s.reserved_bytes);
    ASSERT_EQ(base.in_use_bytes, s.in_use_bytes);
    PASS();
}

/* pdp_cuda_release: refused while a tensor lives on the device (naming the device and the
   bytes; the tensor intact), then, everything freed, the device's blocks and workspaces
   (a loss's scratch, a bf16 model's inputs) handed back: nothing reserved; the next call
   creates the device's state again. */
TEST cuda_release_gives_the_device_back(void)
{
    int64_t shape[2] = {4, 300};
    int32_t labels[4] = {1, 299, 0, 7};
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_tensor *t = NULL, *d = NULL;
    const pdp_tensor *y;
    pdp_cuda_memory_stats s;
    static float host[1200], back[1200];
    float loss;
    int i;
    NEED_GPU();
    ASSERT_ENUM_EQ(PDP_ERR_DEVICE, pdp_cuda_release(pdp_cpu()), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "not CUDA") != NULL);
    for (i = 0; i < 1200; i++) host[i] = (float)(i % 17) * 0.25f;
    memset(&md, 0, sizeof md);
    md.input_ndim = 1;
    md.input_shape[0] = 300;
    md.device = pdp_cuda(0);
    md.precision = PDP_PRECISION_BF16; /* its forward takes the bf16 workspace */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &md), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(m, 5), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cuda(0), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&d, pdp_cuda(0), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(t, host), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, t, &y), pdp_status_name);
    pdp_model_free(m);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(t, labels, &loss, d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_cuda_release(pdp_cuda(0)), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "device 0") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "in use") != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(t, back), pdp_status_name);
    ASSERT_MEM_EQ(host, back, sizeof host);
    pdp_tensor_free(t);
    pdp_tensor_free(d);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_release(pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &s), pdp_status_name);
    ASSERT_EQ(0, s.reserved_bytes);
    ASSERT_EQ(0, s.in_use_bytes);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_release(pdp_cuda(0)), pdp_status_name); /* twice: fine */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cuda(0), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(t, host), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(t, labels, &loss, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(t, back), pdp_status_name);
    ASSERT_MEM_EQ(host, back, sizeof host);
    pdp_tensor_free(t);
    /* and back again: run alone under a leak checker (tests/gpu/run.sh), nothing remains */
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_release(pdp_cuda(0)), pdp_status_name);
    PASS();
}

/* ---- with PDP_CUDA: every layer, forward and backward ---- */

static enum greatest_test_res check_layer(layer_case k)
{
    pdp_model *mc = NULL, *mg = NULL;
    pdp_tensor *xc = NULL, *xg = NULL, *dyc = NULL, *dyg = NULL;
    const pdp_tensor *yc, *yg;
    float *yh;
    double e;
    static char msg[160]; /* static: greatest keeps the pointer after we return */
    ASSERTm(pdp_last_error(), build(&mc, k, pdp_cpu()) == PDP_OK);
    ASSERT_ENUM_EQ(PDP_OK, build(&mg, k, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, make_input(mc, 99 + k, &xc, &xg, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(mc, xc, &yc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_forward(mg, xg, &yg) == PDP_OK);
    yh = host_copy(yg);
    ASSERT(yh != NULL);
    e = rel_err(yh, yc->data, yc->count);
    snprintf(msg, sizeof msg, "%s forward: relative error %g", case_name[k], e);
    ASSERTm(msg, e <= TOL);
    free(yh);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyc, pdp_cpu(), yc->ndim, yc->shape),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyg, pdp_cuda(0), yc->ndim, yc->shape),
                   pdp_status_name);
    fill_random(dyc->data, dyc->count, 555 + k);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(dyg, dyc->data), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(mc, dyc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_backward(mg, dyg) == PDP_OK);
    e = model_rel_err(mg, mc, 1);
    snprintf(msg, sizeof msg, "%s backward (all parameter gradients): relative error %g",
             case_name[k], e);
    ASSERTm(msg, e <= TOL);
    /* a second pass on another batch without zeroing: backward accumulates (dw +=), as
       gradient accumulation and DDP's no_sync rely on; an overwrite shows up here */
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    ASSERT_ENUM_EQ(PDP_OK, make_input(mc, 7 + k, &xc, &xg, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(mc, xc, &yc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_forward(mg, xg, &yg) == PDP_OK);
    fill_random(dyc->data, dyc->count, 77 + k);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(dyg, dyc->data), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(mc, dyc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_backward(mg, dyg) == PDP_OK);
    e = model_rel_err(mg, mc, 1);
    snprintf(msg, sizeof msg, "%s second backward (gradients accumulated over two batches): "
             "relative error %g", case_name[k], e);
    ASSERTm(msg, e <= TOL);
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    pdp_tensor_free(dyc);
    pdp_tensor_free(dyg);
    pdp_model_free(mc);
    pdp_model_free(mg);
    PASS();
}

TEST cuda_layers_match_cpu(void)
{
    int k;
    NEED_GPU();
    for (k = 0; k < L_COUNT; k++) CHECK_CALL(check_layer((layer_case)k));
    PASS();
}

/* A bias's and LayerNorm's gradients are column sums over the batch, in row order: rows past
   the kernels' 128-row tiles and columns past their 32-column blocks (300 x 70 here), each
   column's float adds in the CPU's order, so the bits are a host loop's. */
static enum greatest_test_res check_column_sums(bool layernorm)
{
    enum { ROWS = 300, IN = 5, N = 70 };
    int64_t xshape[2] = {ROWS, layernorm ? N : IN}, yshape[2] = {ROWS, N}, r, j;
    pdp_model_desc d;
    pdp_model *m = NULL;
    pdp_tensor *x = NULL, *dy = NULL, params, grads;
    const pdp_tensor *y;
    float *hx = malloc(sizeof(float) * ROWS * N), *hdy = malloc(sizeof(float) * ROWS * N), *g;
    double e = 0.0;
    ASSERT(hx && hdy);
    memset(&d, 0, sizeof d);
    d.seed = 99;
    d.device = pdp_cuda(0);
    d.input_ndim = 1;
    d.input_shape[0] = xshape[1];
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, layernorm ? pdp_model_add_layernorm(m, 1e-5f)
                                     : pdp_model_add_linear(m, N), pdp_status_name);
    fill_random(hx, ROWS * xshape[1], 11);
    for (r = 0; r < ROWS * xshape[1]; r++) /* row means 0 to 1 */
        hx[r] += (float)(r / xshape[1] % 3) * 0.5f;
    fill_random(hdy, ROWS * N, 12);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&x, pdp_cuda(0), 2, xshape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dy, pdp_cuda(0), 2, yshape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(x, hx), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(dy, hdy), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m, x, &y), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m, dy), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(m, &params, &grads), pdp_status_name);
    g = host_copy(&grads); /* Linear: W [N, IN], b [N]; LayerNorm: w [N], b [N] */
    ASSERT(g != NULL);
    ASSERT_EQ(N * (layernorm ? 2 : IN + 1), grads.count);
    for (j = 0; j < N; j++) {
        float acc = 0.0f; /* the bias: the row-order float sum of dy's column */
        for (r = 0; r < ROWS; r++) acc += hdy[r * N + j];
        ASSERT_EQ_FMT(acc, g[grads.count - N + j], "%.9g");
    }
    for (j = 0; layernorm && j < N; j++) { /* LayerNorm's w: sum of dy xh, against doubles */
        double want = 0.0, scale = 0.0;
        for (r = 0; r < ROWS; r++) {
            double mean = 0.0, var = 0.0, xh;
            int64_t i;
            for (i = 0; i < N; i++) mean += hx[r * N + i] / (double)N;
            for (i = 0; i < N; i++) var += (hx[r * N + i] - mean) * (hx[r * N + i] - mean) / N;
            xh = (hx[r * N + j] - mean) / sqrt(var + 1e-5);
            want += hdy[r * N + j] * xh;
            scale += fabs(hdy[r * N + j] * xh);
        }
        if (!(fabs(g[j] - want) / scale <= e)) e = fabs(g[j] - want) / scale; /* NaN too */
    }
    ASSERT_IN_RANGE(0.0, e, 1e-6);
    free(g);
    free(hx);
    free(hdy);
    pdp_tensor_free(x);
    pdp_tensor_free(dy);
    pdp_model_free(m);
    PASS();
}

TEST cuda_column_sums_keep_row_order_bits(void)
{
    NEED_GPU();
    CHECK_CALL(check_column_sums(false));
    CHECK_CALL(check_column_sums(true));
    PASS();
}

/* ---- with PDP_CUDA: a GPT ---- */

/* ids [n] on the host into a fresh int32 device tensor *buf [n], seen as [rows, n / rows] in
   *x (a view keeps the dtype) */
static pdp_status upload_ids(const int32_t *ids, int64_t rows, int64_t n, pdp_tensor **buf,
                             pdp_tensor *x)
{
    int64_t shape[2] = {rows, n / rows}, flat[1] = {n};
    pdp_status st;
    if ((st = pdp_tensor_create_ids(buf, pdp_cuda(0), 1, flat)) != PDP_OK) return st;
    if ((st = pdp_tensor_upload(*buf, ids)) != PDP_OK) return st;
    return pdp_tensor_reshape_view(*buf, 2, shape, x);
}

/* The token table's gradient adds a repeated id's rows in (b, t) order, as the CPU does, so
   the GPU's must be the CPU's bit for bit: an Embedding of V ids and width C on each, the
   ids [S, T] and dy [S, T, C] given, every gradient compared; *g0 the CPU's first. */
static enum greatest_test_res check_embedding_bits(int64_t S, int64_t T, int64_t V, int64_t C,
                                                   int32_t *ids, const float *dy, float *g0)
{
    pdp_model *m[2] = {NULL, NULL};
    pdp_model_desc d;
    pdp_tensor xc, xg, *buf = NULL, *dyc = NULL, *dyg = NULL, gc, gg;
    const pdp_tensor *y;
    int64_t shape[2] = {S, T}, yshape[3] = {S, T, C}, i;
    float *h;
    memset(&d, 0, sizeof d);
    d.seed = 3;
    d.input_shape[0] = T;
    d.input_dtype = PDP_DTYPE_I32;
    for (i = 0; i < 2; i++) {
        d.device = i ? pdp_cuda(0) : pdp_cpu();
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m[i], &d), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_embedding(m[i], V, C, T), pdp_status_name);
    }
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &xc);
    ASSERT_ENUM_EQ(PDP_OK, upload_ids(ids, S, S * T, &buf, &xg), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyc, pdp_cpu(), 3, yshape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyg, pdp_cuda(0), 3, yshape), pdp_status_name);
    memcpy(dyc->data, dy, (size_t)(S * T * C) * sizeof *dy);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(dyg, dyc->data), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m[0], &xc, &y), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_forward(m[1], &xg, &y) == PDP_OK);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m[0], dyc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_backward(m[1], dyg) == PDP_OK);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(m[0], NULL, &gc), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(m[1], NULL, &gg), pdp_status_name);
    *g0 = gc.data[0];
    h = host_copy(&gg);
    ASSERT(h != NULL);
    for (i = 0; i < gc.count; i++)
        ASSERTm("token and position gradients bit for bit", memcmp(&h[i], &gc.data[i], 4) == 0);
    free(h);
    pdp_tensor_free(buf);
    pdp_tensor_free(dyc);
    pdp_tensor_free(dyg);
    pdp_model_free(m[0]);
    pdp_model_free(m[1]);
    PASS();
}

/* With rows 1, 1e8, -1e8 for one id the order gives 0 in fp32 (1 + 1e8 rounds to 1e8) and
   any other order a different number. */
static enum greatest_test_res check_embedding_order(void)
{
    int32_t ids[2 * 3] = {0, 1, 0, 0, 2, 1};
    const float rows[2 * 3] = {1.0f, 5.0f, 1e8f, -1e8f, 3.0f, -5.0f};
    float dy[2 * 3 * 2], g0;
    int i;
    for (i = 0; i < 12; i++) dy[i] = rows[i / 2] * (i % 2 ? -1.0f : 1.0f);
    CHECK_CALL(check_embedding_bits(2, 3, 3, 2, ids, dy, &g0));
    ASSERT_EQ(0.0f, g0); /* id 0's first channel: 1 + 1e8 - 1e8 in order */
    PASS();
}

/* The same over long runs: 3 ids over 2 x 200 positions (runs of about 130 positions, past
   the kernel's batches of loads), every gradient bit for bit the CPU's. */
static enum greatest_test_res check_embedding_long_runs(void)
{
    enum { S = 2, T = 200, C = 5 };
    static int32_t ids[S * T];
    static float dy[S * T * C];
    pdp_rng r;
    float g0;
    int i;
    pdp_rng_seed(&r, 17, 0);
    for (i = 0; i < S * T; i++) ids[i] = (int32_t)pdp_rng_below(&r, 3);
    fill_random(dy, S * T * C, 23);
    for (i = 0; i < S * T * C; i++) dy[i] *= (float)(1 + i % 997); /* orders show */
    CHECK_CALL(check_embedding_bits(S, T, 3, C, ids, dy, &g0));
    PASS();
}

/* Embedding (a vocabulary of 5 over 6 x 7 positions, so ids repeat: the scatter-add's
   order) then a head tied to its token table (its gradient gets the head's product and
   then the rows the embedding adds, as on the CPU): forward, two accumulated backwards;
   then an id outside the vocabulary fails on the device, naming its position and id. */
TEST cuda_embedding_and_tied_head_match_cpu(void)
{
    pdp_model *m[2] = {NULL, NULL};
    pdp_model_desc d;
    pdp_tensor xc, xg, *buf = NULL, *dyc = NULL, *dyg = NULL;
    const pdp_tensor *yc, *yg;
    int32_t ids[B * 7];
    pdp_rng r;
    float *h;
    double e;
    int i, pass;
    static char msg[160];
    int64_t shape[2] = {B, 7};
    NEED_GPU();
    memset(&d, 0, sizeof d);
    d.seed = 31;
    d.input_shape[0] = 7;
    d.input_dtype = PDP_DTYPE_I32;
    for (i = 0; i < 2; i++) {
        d.device = i ? pdp_cuda(0) : pdp_cpu();
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&m[i], &d), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_embedding(m[i], 5, 6, 9), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_tied_linear(m[i], "0.token.weight"),
                       pdp_status_name);
    }
    ASSERT(model_rel_err(m[1], m[0], 0) == 0.0);
    pdp_rng_seed(&r, 8, 1);
    for (pass = 0; pass < 2; pass++) {
        for (i = 0; i < B * 7; i++) ids[i] = (int32_t)pdp_rng_below(&r, 5);
        pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &xc);
        pdp_tensor_free(buf);
        ASSERT_ENUM_EQ(PDP_OK, upload_ids(ids, B, B * 7, &buf, &xg), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(m[0], &xc, &yc), pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_model_forward(m[1], &xg, &yg) == PDP_OK);
        h = host_copy(yg);
        ASSERT(h != NULL);
        e = rel_err(h, yc->data, yc->count);
        free(h);
        snprintf(msg, sizeof msg, "Embedding + tied head forward %d: relative error %g", pass, e);
        ASSERTm(msg, e <= TOL);
        if (!dyc) {
            ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyc, pdp_cpu(), yc->ndim, yc->shape),
                           pdp_status_name);
            ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyg, pdp_cuda(0), yc->ndim, yc->shape),
                           pdp_status_name);
        }
        fill_random(dyc->data, dyc->count, 40 + (uint64_t)pass);
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(dyg, dyc->data), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(m[0], dyc), pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_model_backward(m[1], dyg) == PDP_OK);
        e = model_rel_err(m[1], m[0], 1);
        snprintf(msg, sizeof msg, "Embedding + tied head backward %d (gradients accumulated): "
                 "relative error %g", pass, e);
        ASSERTm(msg, e <= TOL);
    }
    ids[2 * 7 + 3] = 5; /* sequence 2, position 3: one past the vocabulary */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(buf, (const float *)(const void *)ids),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_forward(m[1], &xg, &yg), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "token id 5 at position (2, 3)") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "layer 0 (Embedding)") != NULL);
    /* ids changed between a good forward and its backward: refused before the scatter (it
       would have added rows past dwte) */
    ids[2 * 7 + 3] = 4;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(buf, (const float *)(const void *)ids),
                   pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_forward(m[1], &xg, &yg) == PDP_OK);
    ids[2 * 7 + 3] = 5;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(buf, (const float *)(const void *)ids),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_model_backward(m[1], dyg), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "token id 5 at position (2, 3) is "
                                     "outside [0, 5): the ids changed after the forward"));
    pdp_tensor_free(buf);
    pdp_tensor_free(dyc);
    pdp_tensor_free(dyg);
    pdp_model_free(m[0]);
    pdp_model_free(m[1]);
    CHECK_CALL(check_embedding_order());
    CHECK_CALL(check_embedding_long_runs());
    PASS();
}

/* pdp_gpt_create on the GPU and on the CPU from one seed (GPT-2's initialisation through
   host staging: the same parameters, bit for bit), then three AdamW steps of
   forward_backward with dropout 0.1 (attention, residual and embedding dropout: the
   masks must be the CPU's) and every fifth target -1 (ignored: the loss is the mean over
   the others): logits, loss and every gradient each step, the parameters at the end;
   steps after the first allocate no device memory. bf16: both models in bf16 (the
   GPU's Linear and TiedLinear products through cublasGemmEx, attention in fp32 on both),
   within 2^-8 (cuBLAS's order of the fp32 sums is not the CPU's). T 130, two steps of two
   sequences: score rows longer than the softmax's block of 128 threads, and more
   positions (260) than one block of the embedding's sort holds, so its tiles and
   blocks all take part. */
static enum greatest_test_res check_gpt(bool bf16, int64_t GT, pdp_recompute rc)
{
    pdp_model *m[2] = {NULL, NULL};
    pdp_optim *o[2] = {NULL, NULL};
    pdp_gpt_desc gd;
    pdp_optim_desc od;
    pdp_tensor xc, xg, *buf = NULL;
    const pdp_tensor *yc, *yg;
    enum { GV = 11, MAXT = 130 };
    int64_t GB = GT > 8 ? 2 : 3; /* the long rows: slow on the emulator */
    int32_t ids[3 * MAXT], tg[3 * MAXT];
    int64_t shape[2] = {GB, GT};
    float loss[2], *h;
    double e, tol = bf16 ? ldexp(1.0, -8) : TOL;
    pdp_rng r;
    pdp_cuda_memory_stats before, after;
    int i, step, steps = GT > 8 ? 2 : 3;
    static char msg[160];
    ASSERT(GT <= MAXT);
    memset(&gd, 0, sizeof gd);
    gd.vocab = GV;
    gd.context = GT + 4;
    gd.sequence = GT;
    gd.layers = 2;
    gd.heads = 2;
    gd.dim = 8;
    gd.dropout = 0.1f;
    gd.seed = 5;
    gd.precision = bf16 ? PDP_PRECISION_BF16 : PDP_PRECISION_FP32;
    gd.recompute = rc;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW;
    od.lr = 0.01f;
    od.weight_decay = 0.1f;
    for (i = 0; i < 2; i++) {
        gd.device = i ? pdp_cuda(0) : pdp_cpu();
        ASSERTm(pdp_last_error(), pdp_gpt_create(&m[i], &gd) == PDP_OK);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o[i], m[i], &od), pdp_status_name);
    }
    ASSERTm("GPT-2 initialisation on the GPU is the CPU's", model_rel_err(m[1], m[0], 0) == 0.0);
    pdp_rng_seed(&r, 17, 3);
    for (step = 0; step < steps; step++) {
        for (i = 0; i < GB * GT; i++) {
            ids[i] = (int32_t)pdp_rng_below(&r, GV);
            tg[i] = i % 5 == 3 ? -1 : (int32_t)pdp_rng_below(&r, GV); /* some ignored */
        }
        pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &xc);
        if (!buf)
            ASSERT_ENUM_EQ(PDP_OK, upload_ids(ids, GB, GB * GT, &buf, &xg), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(buf, (const float *)(const void *)ids),
                       pdp_status_name);
        if (step == 1)
            ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &before),
                           pdp_status_name);
        pdp_optim_zero_grad(o[0]);
        pdp_optim_zero_grad(o[1]);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m[0], &xc, tg, &loss[0]),
                       pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_model_forward_backward(m[1], &xg, tg, &loss[1]) == PDP_OK);
        snprintf(msg, sizeof msg, "GPT%s step %d: loss CPU %.9g GPU %.9g", bf16 ? " bf16" : "",
                 step, (double)loss[0], (double)loss[1]);
        ASSERTm(msg, fabs((double)loss[0] - loss[1]) <= tol * fabs((double)loss[0]));
        /* the logits the loss read: the output of the last forward */
        yc = &m[0]->out_view;
        yg = &m[1]->out_view;
        h = host_copy(yg);
        ASSERT(h != NULL);
        e = rel_err(h, yc->data, yc->count);
        free(h);
        snprintf(msg, sizeof msg, "GPT%s step %d: logits relative error %g", bf16 ? " bf16" : "",
                 step, e);
        ASSERTm(msg, e <= tol);
        e = model_rel_err(m[1], m[0], 1);
        snprintf(msg, sizeof msg, "GPT%s step %d: gradients relative error %g",
                 bf16 ? " bf16" : "", step, e);
        ASSERTm(msg, e <= tol);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o[0]), pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_optim_step(o[1]) == PDP_OK);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &after), pdp_status_name);
    ASSERT_EQ(before.device_mallocs, after.device_mallocs);
    e = model_rel_err(m[1], m[0], 0);
    snprintf(msg, sizeof msg, "GPT%s parameters after %d AdamW steps: relative error %g",
             bf16 ? " bf16" : "", steps, e);
    ASSERTm(msg, e <= tol);
    pdp_tensor_free(buf);
    for (i = 0; i < 2; i++) {
        pdp_optim_free(o[i]);
        pdp_model_free(m[i]);
    }
    PASS();
}

TEST cuda_gpt_training_matches_cpu(void)
{
    NEED_GPU();
    CHECK_CALL(check_gpt(false, 8, PDP_RECOMPUTE_NONE));
    CHECK_CALL(check_gpt(true, 8, PDP_RECOMPUTE_NONE));
    CHECK_CALL(check_gpt(false, 8, PDP_RECOMPUTE_SELECTIVE));
    CHECK_CALL(check_gpt(false, 8, PDP_RECOMPUTE_FULL));
    CHECK_CALL(check_gpt(false, 130, PDP_RECOMPUTE_NONE));
    PASS();
}

/* MaxPool's tie and NaN rules (the first maximum in window order wins, a NaN
   wins), which random inputs never exercise. The 1x1 conv before the pool gets
   all-ones weights and the input small integers, so its two channels sum to
   many equal values that come from different inputs: a pool that picks another
   of the tied positions sends the gradient to another input and changes the
   conv's weight gradient. Then one NaN pixel, last in its 2x2 window: the pooled
   output must be NaN exactly where the CPU's is. */
static enum greatest_test_res check_maxpool_ties(layer_case k)
{
    pdp_model *mc = NULL, *mg = NULL;
    pdp_tensor *xc = NULL, *xg = NULL, *dyc = NULL, *dyg = NULL, pc, pg;
    const pdp_tensor *yc, *yg;
    static char msg[160];
    float *yh;
    double e;
    pdp_rng r;
    int64_t i;
    ASSERTm(pdp_last_error(), build(&mc, k, pdp_cpu()) == PDP_OK);
    ASSERT_ENUM_EQ(PDP_OK, build(&mg, k, pdp_cuda(0)), pdp_status_name);
    pdp_model_flat(mc, &pc, NULL);
    pdp_model_flat(mg, &pg, NULL);
    for (i = 0; i < pc.count; i++) pc.data[i] = 1.0f;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(&pg, pc.data), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, make_input(mc, 1, &xc, &xg, pdp_cuda(0)), pdp_status_name);
    pdp_rng_seed(&r, 31, 7);
    for (i = 0; i < xc->count; i++) xc->data[i] = (float)(int)(3.0f * pdp_rng_uniform(&r));
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(xg, xc->data), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(mc, xc, &yc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_forward(mg, xg, &yg) == PDP_OK);
    yh = host_copy(yg);
    ASSERT(yh != NULL);
    e = rel_err(yh, yc->data, yc->count);
    free(yh);
    snprintf(msg, sizeof msg, "%s with ties: forward relative error %g", case_name[k], e);
    ASSERTm(msg, e == 0.0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyc, pdp_cpu(), yc->ndim, yc->shape),
                   pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyg, pdp_cuda(0), yc->ndim, yc->shape),
                   pdp_status_name);
    fill_random(dyc->data, dyc->count, 3);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(dyg, dyc->data), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(mc, dyc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_backward(mg, dyg) == PDP_OK);
    e = model_rel_err(mg, mc, 1);
    snprintf(msg, sizeof msg, "%s with ties: gradients relative error %g (another tied "
             "position chosen?)", case_name[k], e);
    ASSERTm(msg, e <= TOL);

    /* sample 0, channel 0, pixel (3, 3): the last of 2x2 window (1, 1) */
    xc->data[3 * xc->shape[3] + 3] = NAN;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(xg, xc->data), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(mc, xc, &yc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_forward(mg, xg, &yg) == PDP_OK);
    yh = host_copy(yg);
    ASSERT(yh != NULL);
    for (i = 0; i < yc->count; i++) { /* NaN exactly where the CPU has NaN, equal elsewhere */
        bool nc = yc->data[i] != yc->data[i], ng = yh[i] != yh[i];
        snprintf(msg, sizeof msg, "%s with a NaN input: output %lld is %g on the GPU, %g on "
                 "the CPU", case_name[k], (long long)i, (double)yh[i], (double)yc->data[i]);
        if (nc != ng || (!nc && yh[i] != yc->data[i])) {
            free(yh);
            FAILm(msg);
        }
    }
    free(yh);
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    pdp_tensor_free(dyc);
    pdp_tensor_free(dyg);
    pdp_model_free(mc);
    pdp_model_free(mg);
    PASS();
}

TEST cuda_maxpool_ties_and_nan_match_cpu(void)
{
    NEED_GPU();
    CHECK_CALL(check_maxpool_ties(L_MAXPOOL));
    CHECK_CALL(check_maxpool_ties(L_MAXPOOL_OVERLAP));
    PASS();
}

/* ---- with PDP_CUDA: losses ---- */

TEST cuda_losses_match_cpu(void)
{
    int64_t shape[2] = {B, 5};
    int32_t labels[B] = {0, 4, 2, 3, 1, 4};
    pdp_tensor *zc = NULL, *zg = NULL, *dc = NULL, *dg = NULL, *tc = NULL, *tg = NULL;
    float lc, lg, *h;
    char msg[128];
    int64_t i;
    NEED_GPU();
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&zc, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dc, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&tc, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&zg, pdp_cuda(0), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dg, pdp_cuda(0), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&tg, pdp_cuda(0), 2, shape), pdp_status_name);
    fill_random(zc->data, zc->count, 3);
    fill_random(tc->data, tc->count, 4);
    pdp_tensor_upload(zg, zc->data);
    pdp_tensor_upload(tg, tc->data);

    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(zc, labels, &lc, dc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_loss_cross_entropy(zg, labels, &lg, dg) == PDP_OK);
    ASSERT_IN_RANGE(lc, lg, TOL * fabs(lc));
    h = host_copy(dg);
    ASSERT(h && rel_err(h, dc->data, dc->count) <= TOL);
    free(h);

    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_mse(zc, tc, &lc, dc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_loss_mse(zg, tg, &lg, dg) == PDP_OK);
    ASSERT_IN_RANGE(lc, lg, TOL * fabs(lc));
    h = host_copy(dg);
    ASSERT(h && rel_err(h, dc->data, dc->count) <= TOL);
    free(h);

    /* logits far apart (exp of their differences overflows even a double) with the
       largest in the last class: the max that keeps exp finite must see every class */
    for (i = 0; i < zc->count; i++) zc->data[i] *= 1000.0f;
    zc->data[4] = 2000.0f;
    pdp_tensor_upload(zg, zc->data);
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(zc, labels, &lc, dc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_loss_cross_entropy(zg, labels, &lg, dg) == PDP_OK);
    snprintf(msg, sizeof msg, "cross-entropy of logits ~1e3: CPU %.9g GPU %.9g", (double)lc,
             (double)lg);
    ASSERTm(msg, isfinite(lc) && fabs((double)lc - lg) <= TOL * fabs((double)lc));
    h = host_copy(dg);
    ASSERT(h && rel_err(h, dc->data, dc->count) <= TOL);
    free(h);

    labels[2] = 9; /* checked on the host before anything runs, naming the sample */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_loss_cross_entropy(zg, labels, &lg, dg), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "sample 2") != NULL);
    pdp_tensor_free(zc); pdp_tensor_free(zg); pdp_tensor_free(dc);
    pdp_tensor_free(dg); pdp_tensor_free(tc); pdp_tensor_free(tg);
    PASS();
}

/* Rows longer than a block (a vocabulary: 1000 classes, 256 threads a row), the largest
   logit at either end or far above the rest (the ignored rows of a GPT's targets: the GPT
   cases below) */
TEST cuda_cross_entropy_long_rows_match_cpu(void)
{
    int64_t shape[2] = {4, 1000}, i;
    int32_t labels[4] = {999, 3, 0, 517};
    pdp_tensor *zc = NULL, *zg = NULL, *dc = NULL, *dg = NULL;
    float lc, lg, *h;
    NEED_GPU();
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&zc, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dc, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&zg, pdp_cuda(0), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dg, pdp_cuda(0), 2, shape), pdp_status_name);
    fill_random(zc->data, zc->count, 21);
    for (i = 0; i < zc->count; i++) zc->data[i] *= 4.0f;
    zc->data[999] = 30.0f;        /* row 0: the max in the last class, its label */
    zc->data[2 * 1000] = 25.0f;   /* row 2: the max in the first */
    zc->data[3 * 1000 + 300] = 1000.0f; /* row 3: exp of the others - it overflows */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(zg, zc->data), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_fill(dg, 7.0f), pdp_status_name); /* all written */
    ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(zc, labels, &lc, dc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_loss_cross_entropy(zg, labels, &lg, dg) == PDP_OK);
    ASSERT_IN_RANGE(lc, lg, TOL * fabs(lc));
    h = host_copy(dg);
    ASSERT(h != NULL);
    ASSERT(rel_err(h, dc->data, dc->count) <= TOL);
    free(h);
    pdp_tensor_free(zc); pdp_tensor_free(zg); pdp_tensor_free(dc); pdp_tensor_free(dg);
    PASS();
}

/* ---- with PDP_CUDA: optimizers and training steps ---- */

static enum greatest_test_res check_optim(const pdp_optim_desc *od, const char *name)
{
    pdp_model *mc = NULL, *mg = NULL;
    pdp_optim *oc = NULL, *og = NULL;
    pdp_tensor cp, cg, gp, gg;
    static char msg[128];
    double e;
    int step;
    ASSERT_ENUM_EQ(PDP_OK, build(&mc, L_LINEAR, pdp_cpu()), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build(&mg, L_LINEAR, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oc, mc, od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&og, mg, od), pdp_status_name);
    pdp_model_flat(mc, &cp, &cg);
    pdp_model_flat(mg, &gp, &gg);
    for (step = 0; step < 3; step++) {
        fill_random(cg.data, cg.count, 40 + (uint64_t)step); /* the same gradients on both */
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(&gg, cg.data), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oc), pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_optim_step(og) == PDP_OK);
    }
    e = model_rel_err(mg, mc, 0);
    snprintf(msg, sizeof msg, "%s: parameters after 3 steps, relative error %g", name, e);
    ASSERTm(msg, e <= TOL);
    pdp_optim_free(oc);
    pdp_optim_free(og);
    pdp_model_free(mc);
    pdp_model_free(mg);
    PASS();
}

TEST cuda_optimizers_match_cpu(void)
{
    pdp_optim_desc d;
    NEED_GPU();
    memset(&d, 0, sizeof d);
    d.kind = PDP_OPTIM_SGD;
    d.lr = 0.1f;
    CHECK_CALL(check_optim(&d, "SGD"));
    d.momentum = 0.9f;
    d.nesterov = true;
    d.weight_decay = 0.01f;
    CHECK_CALL(check_optim(&d, "SGD momentum nesterov"));
    d.nesterov = false; /* dampening: the first step's buffer is the plain gradient */
    d.dampening = 0.5f;
    CHECK_CALL(check_optim(&d, "SGD momentum dampening"));
    d.momentum = 0.0f; /* no momentum: dampening must not touch the plain update */
    CHECK_CALL(check_optim(&d, "SGD dampening without momentum"));
    memset(&d, 0, sizeof d);
    d.kind = PDP_OPTIM_ADAM;
    d.lr = 0.01f;
    d.weight_decay = 0.1f;
    CHECK_CALL(check_optim(&d, "Adam"));
    d.kind = PDP_OPTIM_ADAMW;
    CHECK_CALL(check_optim(&d, "AdamW"));
    d.decay_params = PDP_DECAY_MATRICES; /* the bias a run of its own, undecayed */
    CHECK_CALL(check_optim(&d, "AdamW decay groups"));
    d.decay_params = PDP_DECAY_ALL;
    d.eps = 0.1f; /* where eps enters (outside the square root, after bias correction) */
    CHECK_CALL(check_optim(&d, "AdamW eps 0.1"));
    d.kind = PDP_OPTIM_ADAM;
    CHECK_CALL(check_optim(&d, "Adam eps 0.1"));
    PASS();
}

/* MLP (with dropout) or CNN, three Adam steps through pdp_model_forward_backward. */
static pdp_status build_net(pdp_model **out, bool cnn, pdp_device dev)
{
    pdp_model_desc d;
    pdp_model *m;
    pdp_status st;
    memset(&d, 0, sizeof d);
    d.seed = 77;
    d.device = dev;
    d.input_ndim = cnn ? 3 : 1;
    d.input_shape[0] = cnn ? 1 : 20;
    d.input_shape[1] = cnn ? 12 : 0;
    d.input_shape[2] = cnn ? 12 : 0;
    if ((st = pdp_model_create(&m, &d)) != PDP_OK) return st;
    if (cnn) {
        if ((st = pdp_model_add_conv2d(m, 4, 3, 1, 1)) || (st = pdp_model_add_relu(m)) ||
            (st = pdp_model_add_maxpool2d(m, 2, 2)) || (st = pdp_model_add_flatten(m)) ||
            (st = pdp_model_add_linear(m, 5))) {
            pdp_model_free(m);
            return st;
        }
    } else if ((st = pdp_model_add_linear(m, 32)) || (st = pdp_model_add_gelu(m)) ||
               (st = pdp_model_add_dropout(m, 0.2f)) || (st = pdp_model_add_layernorm(m, 1e-5f)) ||
               (st = pdp_model_add_linear(m, 5))) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

static enum greatest_test_res check_training(bool cnn)
{
    pdp_model *mc = NULL, *mg = NULL;
    pdp_optim *oc = NULL, *og = NULL;
    pdp_optim_desc od;
    pdp_tensor *xc = NULL, *xg = NULL;
    int32_t labels[B] = {1, 0, 4, 2, 3, 2};
    float lc, lg;
    double e;
    static char msg[128];
    int step;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 0.01f;
    ASSERT_ENUM_EQ(PDP_OK, build_net(&mc, cnn, pdp_cpu()), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_net(&mg, cnn, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oc, mc, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&og, mg, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, make_input(mc, 5, &xc, &xg, pdp_cuda(0)), pdp_status_name);
    for (step = 0; step < 3; step++) {
        pdp_optim_zero_grad(oc);
        pdp_optim_zero_grad(og);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(mc, xc, labels, &lc), pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_model_forward_backward(mg, xg, labels, &lg) == PDP_OK);
        snprintf(msg, sizeof msg, "%s step %d: loss CPU %.9g GPU %.9g", cnn ? "CNN" : "MLP", step,
                 (double)lc, (double)lg);
        ASSERTm(msg, fabs((double)lc - lg) <= TOL * fabs((double)lc));
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oc), pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_optim_step(og) == PDP_OK);
    }
    e = model_rel_err(mg, mc, 0);
    snprintf(msg, sizeof msg, "%s parameters after 3 steps: relative error %g", cnn ? "CNN" : "MLP",
             e);
    ASSERTm(msg, e <= TOL);
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    pdp_optim_free(oc);
    pdp_optim_free(og);
    pdp_model_free(mc);
    pdp_model_free(mg);
    PASS();
}

TEST cuda_mlp_training_matches_cpu(void)
{
    NEED_GPU();
    CHECK_CALL(check_training(false));
    PASS();
}

TEST cuda_cnn_training_matches_cpu(void)
{
    NEED_GPU();
    CHECK_CALL(check_training(true));
    PASS();
}

TEST cuda_step_allocates_nothing(void)
{
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_tensor *xc = NULL, *xg = NULL;
    int32_t labels[B] = {1, 0, 4, 2, 3, 2};
    pdp_cuda_memory_stats before, after;
    float loss;
    int step;
    NEED_GPU();
    ASSERT_ENUM_EQ(PDP_OK, build_net(&m, true, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, make_input(m, 5, &xc, &xg, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, xg, labels, &loss), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &before), pdp_status_name);
    for (step = 0; step < 5; step++) {
        pdp_optim_zero_grad(o);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m, xg, labels, &loss), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), pdp_status_name);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &after), pdp_status_name);
    ASSERT_EQ(before.device_mallocs, after.device_mallocs);
    ASSERT_EQ(before.in_use_bytes, after.in_use_bytes);
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

TEST cuda_tf32_option_changes_gemm_only_slightly(void)
{
    pdp_model *mc = NULL, *mg = NULL;
    pdp_tensor *xc = NULL, *xg = NULL;
    const pdp_tensor *yc, *yg;
    float *h;
    double e;
    NEED_GPU();
    ASSERT_ENUM_EQ(PDP_OK, build(&mc, L_LINEAR, pdp_cpu()), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build(&mg, L_LINEAR, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, make_input(mc, 8, &xc, &xg, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_set_tf32(true), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(mc, xc, &yc), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(mg, xg, &yg), pdp_status_name);
    h = host_copy(yg);
    pdp_cuda_set_tf32(false);
    ASSERT(h != NULL);
    e = rel_err(h, yc->data, yc->count);
    ASSERTm("TF32 stays within 1e-2", e <= 1e-2);
    free(h);
    /* switched off again: plain FP32 (the emulators ignore the math mode; a GPU's
       TF32 GEMM would miss this tolerance) */
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(mg, xg, &yg), pdp_status_name);
    h = host_copy(yg);
    ASSERT(h != NULL);
    e = rel_err(h, yc->data, yc->count);
    free(h);
    ASSERTm("after pdp_cuda_set_tf32(false) the GEMM is FP32 again", e <= TOL);
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    pdp_model_free(mc);
    pdp_model_free(mg);
    PASS();
}

/* ---- with PDP_CUDA: bf16 precision (cuBLAS GemmEx on bf16 copies) ----
   One Linear layer, forward and backward, element by element against double sums of
   the same bf16-rounded inputs: every product a_bf b_bf is exact in fp32 and only the
   order of the fp32 sums differs between the GPU and the CPU, so each side is within
   (k + 2) u sum |a_bf b_bf| of the exact sum (u = 2^-24 for a rounded sum; the GPU's
   bound is doubled: tensor cores may truncate instead of rounding their fp32 sums) and
   the two within the sum of both bounds. Against the fp32 inputs the GPU adds at most
   (2^-7 + 2^-16) sum |a b| (each bf16 rounding moves an input by 2^-8 of itself). */

/* exact[i, j] = sum_l a(i, l) b(l, j) in double, of bf16-rounded (rnd) or fp32 inputs;
   mag the sum of |products|; a(i, l) = a[i sai + l sal], b(l, j) = b[l sbl + j sbj] */
static void bf16_ref(int64_t m, int64_t n, int64_t k, const float *a, int64_t sai,
                     int64_t sal, const float *b, int64_t sbl, int64_t sbj, bool rnd,
                     double *exact, double *mag)
{
    int64_t i, j, l;
    for (i = 0; i < m; i++)
        for (j = 0; j < n; j++) {
            double s = 0.0, g = 0.0;
            for (l = 0; l < k; l++) {
                float x = a[i * sai + l * sal], y = b[l * sbl + j * sbj];
                double t = rnd ? (double)pdp_bf16_round(x) * pdp_bf16_round(y) : (double)x * y;
                s += t;
                g += fabs(t);
            }
            exact[i * n + j] = s;
            mag[i * n + j] = g;
        }
}

/* gpu and cpu (the CPU bf16 model's) against the bounds above; add (bias, may be NULL,
   indexed by j) is in both sums */
static int bf16_check(const char *what, const float *gpu, const float *cpu, int64_t m, int64_t n,
                      int64_t k, const float *a, int64_t sai, int64_t sal, const float *b,
                      int64_t sbl, int64_t sbj, const float *add, char *msg, size_t cap)
{
    double *e = (double *)malloc(sizeof(double) * (size_t)(m * n * 4)), *g = e + m * n;
    double *e32 = g + m * n, *g32 = e32 + m * n;
    double u = ldexp(1.0, -24);
    int64_t i, j;
    int bad = 0;
    bf16_ref(m, n, k, a, sai, sal, b, sbl, sbj, true, e, g);
    bf16_ref(m, n, k, a, sai, sal, b, sbl, sbj, false, e32, g32);
    for (i = 0; i < m * n && !bad; i++) {
        double c = add ? add[i % n] : 0.0, x = gpu[i];
        double mg = g[i] + fabs(c), tg = (double)(k + 2) * 2.0 * u * mg + 1e-30;
        double tc = (double)(k + 2) * u * mg + 1e-30;
        double t32 = tg + (ldexp(1.0, -7) + ldexp(1.0, -16)) * g32[i];
        j = i % n;
        if (fabs(x - (e[i] + c)) > tg || fabs(x - cpu[i]) > tg + tc ||
            fabs(x - (e32[i] + c)) > t32) {
            snprintf(msg, cap, "%s[%lld][%lld]: GPU %.9g, CPU bf16 %.9g, exact of bf16 %.9g "
                     "(bound %.3g), exact of fp32 %.9g (bound %.3g)", what, (long long)(i / n),
                     (long long)j, x, (double)cpu[i], e[i] + c, tg, e32[i] + c, t32);
            bad = 1;
        }
    }
    free(e);
    return bad;
}

TEST cuda_bf16_linear_matches_cpu_bf16_and_fp32(void)
{
    enum { IN = 37, OUT = 19 };
    pdp_model *mc = NULL, *mg = NULL;
    pdp_model_desc d;
    pdp_tensor *xc = NULL, *xg = NULL, *dyc = NULL, *dyg = NULL, *dxg = NULL, gp, gg;
    pdp_param wc, bc;
    const pdp_tensor *yc, *yg;
    float dxc[B * IN];
    float *yh = NULL, *gh = NULL, *dxh = NULL;
    int64_t shape[2] = {B, OUT};
    static char msg[320];
    int bad;
    NEED_GPU();
    memset(&d, 0, sizeof d);
    d.seed = 31;
    d.input_shape[0] = IN;
    d.precision = PDP_PRECISION_BF16;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&mc, &d), pdp_status_name);
    d.device = pdp_cuda(0);
    ASSERTm(pdp_last_error(), pdp_model_create(&mg, &d) == PDP_OK);
    ASSERT_EQ(PDP_PRECISION_BF16, pdp_model_precision(mg));
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(mc, OUT), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(mg, OUT), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, make_input(mc, 41, &xc, &xg, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dxg, pdp_cuda(0), xc->ndim, xc->shape),
                   pdp_status_name);
    mc->input_grad = dxc; /* the layer's dX (pp.c's hook for a stage's input gradient) */
    mg->input_grad = dxg->data;
    pdp_model_find_param(mc, "0.weight", &wc);
    pdp_model_find_param(mc, "0.bias", &bc);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(mc, xc, &yc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_forward(mg, xg, &yg) == PDP_OK);
    ASSERT((yh = host_copy(yg)) != NULL);
    bad = bf16_check("y", yh, yc->data, B, OUT, IN, xc->data, IN, 1, wc.value.data, 1, IN,
                     bc.value.data, msg, sizeof msg);
    ASSERTm(msg, !bad);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyc, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyg, pdp_cuda(0), 2, shape), pdp_status_name);
    fill_random(dyc->data, dyc->count, 43);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(dyg, dyc->data), pdp_status_name);
    pdp_model_zero_grad(mc);
    pdp_model_zero_grad(mg);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(mc, dyc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_backward(mg, dyg) == PDP_OK);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_flat(mg, &gp, &gg), pdp_status_name);
    ASSERT((gh = host_copy(&gg)) != NULL);
    /* dW [OUT, IN] = dy^T x (k = B) */
    bad = bf16_check("dW", gh, wc.grad.data, OUT, IN, B, dyc->data, 1, OUT, xc->data, IN, 1, NULL,
                     msg, sizeof msg);
    ASSERTm(msg, !bad);
    /* db: the fp32 dy summed in sample order on both (the same bits but for FMA) */
    bad = rel_err(gh + OUT * IN, bc.grad.data, OUT) > TOL;
    ASSERTm("db: fp32 column sums of dy", !bad);
    /* dX [B, IN] = dy W (k = OUT) */
    ASSERT((dxh = host_copy(dxg)) != NULL);
    bad = bf16_check("dX", dxh, dxc, B, IN, OUT, dyc->data, OUT, 1, wc.value.data, IN, 1,
                     NULL, msg, sizeof msg);
    ASSERTm(msg, !bad);
    free(yh);
    free(gh);
    free(dxh);
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    pdp_tensor_free(dyc);
    pdp_tensor_free(dyg);
    pdp_tensor_free(dxg);
    pdp_model_free(mc);
    pdp_model_free(mg);
    PASS();
}

/* MLP (dropout, LayerNorm) and CNN (Conv2d, MaxPool2d), three SGD steps in bf16 on the
   GPU against the same on the CPU: the same bf16 arithmetic but for the order of the
   fp32 sums, which also decides, for an activation that falls within those sums'
   rounding error of a bf16 rounding boundary, which way it rounds - one input moves by
   one bf16 step (2^-8 of itself). So the loss and parameters are compared within
   2^-8 relative to the largest magnitude; and against the GPU's fp32 training, the
   loss within 2^-5 (bf16 rounding of every product's inputs, through two layers).
   After the first step nothing more reaches cudaMalloc (the bf16 workspace is kept). */
static enum greatest_test_res check_bf16_training(bool cnn)
{
    pdp_model *mc = NULL, *mg = NULL, *m32 = NULL;
    pdp_optim *oc = NULL, *og = NULL, *o32 = NULL;
    pdp_optim_desc od;
    pdp_tensor *xc = NULL, *xg = NULL;
    pdp_cuda_memory_stats before, after;
    int32_t labels[B] = {1, 0, 4, 2, 3, 2};
    float lc, lg, l32;
    double e;
    static char msg[160];
    int step;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_SGD;
    od.lr = 0.1f;
    ASSERT_ENUM_EQ(PDP_OK, build_net(&mc, cnn, pdp_cpu()), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_net(&mg, cnn, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_net(&m32, cnn, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_set_precision(mc, PDP_PRECISION_BF16), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_model_set_precision(mg, PDP_PRECISION_BF16) == PDP_OK);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oc, mc, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&og, mg, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o32, m32, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, make_input(mc, 5, &xc, &xg, pdp_cuda(0)), pdp_status_name);
    for (step = 0; step < 3; step++) {
        if (step == 1)
            ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &before),
                           pdp_status_name);
        pdp_optim_zero_grad(oc);
        pdp_optim_zero_grad(og);
        pdp_optim_zero_grad(o32);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(mc, xc, labels, &lc), pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_model_forward_backward(mg, xg, labels, &lg) == PDP_OK);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(m32, xg, labels, &l32), pdp_status_name);
        snprintf(msg, sizeof msg, "%s bf16 step %d: loss CPU %.9g GPU %.9g (GPU fp32 %.9g)",
                 cnn ? "CNN" : "MLP", step, (double)lc, (double)lg, (double)l32);
        ASSERTm(msg, fabs((double)lc - lg) <= ldexp(fabs((double)lc), -8));
        ASSERTm(msg, fabs((double)l32 - lg) <= ldexp(fabs((double)l32), -5));
        ASSERTm(msg, lg != l32); /* bf16 did run */
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oc), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(og), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o32), pdp_status_name);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(0), &after), pdp_status_name);
    ASSERT_EQ(before.device_mallocs, after.device_mallocs);
    e = model_rel_err(mg, mc, 0);
    snprintf(msg, sizeof msg, "%s bf16 parameters after 3 steps: relative error %g",
             cnn ? "CNN" : "MLP", e);
    ASSERTm(msg, e <= ldexp(1.0, -8));
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    pdp_optim_free(oc);
    pdp_optim_free(og);
    pdp_optim_free(o32);
    pdp_model_free(mc);
    pdp_model_free(mg);
    pdp_model_free(m32);
    PASS();
}

TEST cuda_bf16_training_matches_cpu_bf16(void)
{
    NEED_GPU();
    CHECK_CALL(check_bf16_training(false));
    CHECK_CALL(check_bf16_training(true));
    PASS();
}

/* ---- with PDP_CUDA: DDP over NCCL, DP over GPUs ---- */

TEST cuda_ddp_nccl_world_size_1_matches_single(void)
{
    pdp_model *ms = NULL, *md = NULL;
    pdp_optim *os = NULL, *od = NULL;
    pdp_optim_desc sgd;
    pdp_comm *c = NULL;
    pdp_comm_desc cd;
    pdp_ddp *ddp = NULL;
    pdp_tensor *xc = NULL, *xg = NULL;
    int32_t labels[B] = {1, 0, 4, 2, 3, 2};
    float ls, ld;
    double e;
    int step;
    NEED_GPU();
    if (getenv("WORLD_SIZE") && strcmp(getenv("WORLD_SIZE"), "1") != 0)
        SKIPm("WORLD_SIZE is set to more than 1 in the environment");
    memset(&cd, 0, sizeof cd);
    cd.backend = PDP_BACKEND_NCCL;
    cd.device = pdp_cuda(0);
    cd.timeout_s = 60;
    ASSERTm(pdp_last_error(), pdp_comm_init_env(&c, &cd) == PDP_OK);
    ASSERT_EQ(0, pdp_comm_rank(c));
    ASSERT_EQ(1, pdp_comm_size(c));
    memset(&sgd, 0, sizeof sgd);
    sgd.lr = 0.1f;
    sgd.momentum = 0.9f;
    ASSERT_ENUM_EQ(PDP_OK, build_net(&ms, false, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_net(&md, false, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&os, ms, &sgd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&od, md, &sgd), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_ddp_create(&ddp, md, c, NULL) == PDP_OK);
    ASSERT_ENUM_EQ(PDP_OK, make_input(ms, 6, &xc, &xg, pdp_cuda(0)), pdp_status_name);
    for (step = 0; step < 3; step++) {
        pdp_optim_zero_grad(os);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(ms, xg, labels, &ls), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(os), pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_ddp_forward_backward(ddp, xg, labels, &ld) == PDP_OK);
        ASSERTm(pdp_last_error(), pdp_ddp_step(ddp, od) == PDP_OK);
        ASSERT_IN_RANGE(ls, ld, TOL * fabs(ls));
    }
    {
        pdp_tensor a, ga, b, gb;
        float *ha, *hb;
        pdp_model_flat(ms, &a, &ga);
        pdp_model_flat(md, &b, &gb);
        ha = host_copy(&a);
        hb = host_copy(&b);
        ASSERT(ha && hb);
        e = rel_err(hb, ha, a.count);
        free(ha);
        free(hb);
        ASSERTm("DDP over NCCL (1 rank) == single GPU", e <= TOL);
    }
    pdp_ddp_free(ddp);
    pdp_comm_free(c);
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    pdp_optim_free(os);
    pdp_optim_free(od);
    pdp_model_free(ms);
    pdp_model_free(md);
    PASS();
}

/* One DDP rank on communicator c: trains on rows [rank per, (rank + 1) per) of the
   global batch x [n per, 20] (host) for two SGD steps on device dev, no dropout (so
   the shards add up to the global batch), and downloads the final parameters. */
static pdp_status train_ddp_shard_hook(pdp_comm *c, pdp_device dev, const float *x,
                                       const int32_t *labels, int per, float *params_out,
                                       int hook, int64_t *bytes_sent);

static pdp_status train_ddp_shard(pdp_comm *c, pdp_device dev, const float *x,
                                  const int32_t *labels, int per, float *params_out)
{
    return train_ddp_shard_hook(c, dev, x, labels, per, params_out, 0, NULL);
}

/* ... with a comm hook (1 bf16, 2 fp16 compression; 0 none) and the last step's bytes. */
static pdp_status train_ddp_shard_hook(pdp_comm *c, pdp_device dev, const float *x,
                                       const int32_t *labels, int per, float *params_out,
                                       int hook, int64_t *bytes_sent)
{
    pdp_ddp_comm_hook h = hook == 1 ? pdp_ddp_hook_bf16_compress() : pdp_ddp_hook_fp16_compress();
    pdp_ddp_stats ds;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_ddp *ddp = NULL;
    pdp_tensor *xs = NULL, p, g;
    pdp_optim_desc sgd;
    int64_t shape[2];
    int rank = pdp_comm_rank(c), step;
    float loss;
    pdp_status st;
    memset(&sgd, 0, sizeof sgd);
    sgd.lr = 0.1f;
    shape[0] = per;
    shape[1] = 20;
    if ((st = build_net(&m, false, dev)) || (st = pdp_optim_create(&o, m, &sgd)) ||
        (st = pdp_ddp_create(&ddp, m, c, NULL)) ||
        (hook && (st = pdp_ddp_register_comm_hook(ddp, &h))) ||
        (st = pdp_tensor_create(&xs, dev, 2, shape)) ||
        (st = pdp_tensor_upload(xs, x + (int64_t)rank * per * 20)))
        goto out;
    pdp_model_set_training(m, false);
    for (step = 0; step < 2; step++)
        if ((st = pdp_ddp_forward_backward(ddp, xs, labels + rank * per, &loss)) ||
            (st = pdp_ddp_step(ddp, o)))
            goto out;
    pdp_ddp_get_stats(ddp, &ds);
    if (bytes_sent) *bytes_sent = ds.bytes_sent;
    pdp_model_flat(m, &p, &g);
    st = pdp_tensor_download(&p, params_out);
out:
    pdp_ddp_free(ddp);
    pdp_tensor_free(xs);
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}

/* The reference of train_ddp_shard: one model on dev, the whole batch [rows, 20]. */
static pdp_status train_single(pdp_device dev, const float *x, const int32_t *labels,
                               int64_t rows, float **params_out, int64_t *count)
{
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_tensor *xs = NULL, p, g;
    pdp_optim_desc sgd;
    int64_t shape[2];
    float loss;
    pdp_status st;
    int step;
    *params_out = NULL;
    memset(&sgd, 0, sizeof sgd);
    sgd.lr = 0.1f;
    shape[0] = rows;
    shape[1] = 20;
    if ((st = build_net(&m, false, dev)) || (st = pdp_optim_create(&o, m, &sgd)) ||
        (st = pdp_tensor_create(&xs, dev, 2, shape)) || (st = pdp_tensor_upload(xs, x)))
        goto out;
    pdp_model_set_training(m, false);
    for (step = 0; step < 2; step++) {
        pdp_optim_zero_grad(o);
        if ((st = pdp_model_forward_backward(m, xs, labels, &loss)) || (st = pdp_optim_step(o)))
            goto out;
    }
    pdp_model_flat(m, &p, &g);
    *count = p.count;
    *params_out = host_copy(&p);
    if (!*params_out) st = PDP_ERR_OUT_OF_MEMORY;
out:
    pdp_tensor_free(xs);
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}

/* Thread-rank DDP: rank r trains on rows [r B/n, (r+1) B/n) of the global batch on GPU r. */
typedef struct rank_job {
    pdp_nccl_group *g;
    int rank, n;
    int hook;            /* train_ddp_shard_hook's */
    int64_t bytes_sent;
    const float *x;      /* host, the global batch [n * per, 20] */
    const int32_t *labels;
    int per;
    float *params_out;   /* host copy of the final parameters */
    pdp_status st;
    char msg[1100];
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = (rank_job *)arg;
    pdp_comm *c = NULL;
    if ((j->st = pdp_comm_create_nccl(&c, j->g, j->rank)) == PDP_OK)
        j->st = train_ddp_shard_hook(c, pdp_cuda(j->rank), j->x, j->labels, j->per,
                                     j->params_out, j->hook, &j->bytes_sent);
    if (j->st) snprintf(j->msg, sizeof j->msg, "rank %d: %s", j->rank, pdp_last_error());
    pdp_comm_free(c);
    return NULL;
}

TEST cuda_ddp_thread_ranks_match_single(void)
{
    enum { PER = 4, MAXR = 8 };
    int n = devices(), r;
    pdp_device devs[MAXR];
    pdp_nccl_group *g = NULL;
    rank_job jobs[MAXR];
    pthread_t th[MAXR];
    float x[MAXR * PER * 20];
    int32_t labels[MAXR * PER];
    float *ref = NULL;
    int64_t count = 0;
    double e;
    NEED_GPU();
    if (n > MAXR) n = MAXR;
    for (r = 0; r < MAXR; r++) devs[r] = pdp_cuda(r < n ? r : 0);
    fill_random(x, (int64_t)n * PER * 20, 11);
    for (r = 0; r < n * PER; r++) labels[r] = r % 5;
    ASSERTm(pdp_last_error(), pdp_nccl_group_create(&g, n, devs, NULL) == PDP_OK);
    for (r = 0; r < n; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].g = g;
        jobs[r].rank = r;
        jobs[r].n = n;
        jobs[r].x = x;
        jobs[r].labels = labels;
        jobs[r].per = PER;
        jobs[r].params_out = (float *)malloc(4096 * sizeof(float));
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (r = 0; r < n; r++) pthread_join(th[r], NULL);
    pdp_nccl_group_free(g);
    for (r = 0; r < n; r++) ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
    /* the reference: one GPU, the whole batch */
    ASSERTm(pdp_last_error(),
            train_single(pdp_cuda(0), x, labels, (int64_t)n * PER, &ref, &count) == PDP_OK);
    ASSERT(count <= 4096);
    for (r = 0; r < n; r++) {
        e = rel_err(jobs[r].params_out, ref, count);
        ASSERTm("thread-rank DDP over NCCL == one GPU on the global batch", e <= TOL);
        free(jobs[r].params_out);
    }
    free(ref);
    PASS();
}

/* The bf16 and fp16 compression hooks over NCCL on CUDA models (the conversion kernels
   and ncclBfloat16 / ncclFloat16): the conversion kernels give the CPU's bits; two SGD
   steps land within 1e-2 relative of one GPU on the global batch (16-bit gradients),
   differ from fp32 (the hook ran), the ranks agree bit for bit, and the bytes are
   half of fp32 DDP's (two ranks: exactly). */
TEST cuda_ddp_compress_hooks_over_nccl(void)
{
    enum { PER = 4, MAXR = 8, CN = 1001 };
    int n = devices(), r, hook;
    pdp_device devs[MAXR];
    pdp_nccl_group *g = NULL;
    rank_job jobs[MAXR], plain[MAXR];
    pthread_t th[MAXR];
    float x[MAXR * PER * 20], src[CN], back[CN], *dsrc = NULL, *dback = NULL;
    uint16_t h16[CN], c16[CN], *d16 = NULL;
    int32_t labels[MAXR * PER];
    float *ref = NULL;
    int64_t count = 0, i;
    int dt;
    NEED_GPU();
    /* the kernels against the CPU loops, bit for bit (ties, subnormals, overflow inside) */
    fill_random(src, CN, 5);
    src[0] = 1.0f + 0x1p-8f;
    src[1] = 0x1p-25f * 1.5f;
    src[2] = 70000.0f;
    ASSERT_ENUM_EQ(PDP_OK, pdp__dev_alloc(pdp_cuda(0), CN * 4, (void **)&dsrc), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp__dev_alloc(pdp_cuda(0), CN * 4, (void **)&dback), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp__dev_alloc(pdp_cuda(0), CN * 2, (void **)&d16), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp__dev_copy(pdp_cuda(0), dsrc, pdp_cpu(), src, CN * 4),
                   pdp_status_name);
    for (dt = PDP_DTYPE_BF16; dt <= PDP_DTYPE_F16; dt++) {
        ASSERT_ENUM_EQ(PDP_OK, pdp__dev_to16(pdp_cuda(0), d16, dsrc, CN, 0.5f, dt),
                       pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp__dev_from16(pdp_cuda(0), dback, d16, CN, dt), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp__dev_copy(pdp_cpu(), h16, pdp_cuda(0), d16, CN * 2),
                       pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp__dev_copy(pdp_cpu(), back, pdp_cuda(0), dback, CN * 4),
                       pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp__dev_to16(pdp_cpu(), c16, src, CN, 0.5f, dt), pdp_status_name);
        ASSERT_MEM_EQm("to16 kernel != CPU", c16, h16, sizeof h16);
        for (i = 0; i < CN; i++)
            if (back[i] != pdp__dt16_float(dt, c16[i]) && back[i] == back[i])
                FAILm("from16 kernel != CPU");
    }
    pdp__dev_free(pdp_cuda(0), dsrc);
    pdp__dev_free(pdp_cuda(0), dback);
    pdp__dev_free(pdp_cuda(0), d16);
    if (n > MAXR) n = MAXR;
    if (n < 2) SKIPm("one device: the hook path is covered by the kernel check above");
    for (r = 0; r < MAXR; r++) devs[r] = pdp_cuda(r < n ? r : 0);
    fill_random(x, (int64_t)n * PER * 20, 11);
    for (r = 0; r < n * PER; r++) labels[r] = r % 5;
    ASSERTm(pdp_last_error(),
            train_single(pdp_cuda(0), x, labels, (int64_t)n * PER, &ref, &count) == PDP_OK);
    for (hook = 0; hook <= 2; hook++) {
        rank_job *js = hook ? jobs : plain;
        ASSERTm(pdp_last_error(), pdp_nccl_group_create(&g, n, devs, NULL) == PDP_OK);
        for (r = 0; r < n; r++) {
            memset(&js[r], 0, sizeof js[r]);
            js[r].g = g;
            js[r].rank = r;
            js[r].n = n;
            js[r].x = x;
            js[r].labels = labels;
            js[r].per = PER;
            js[r].hook = hook;
            js[r].params_out = (float *)malloc(4096 * sizeof(float));
            pthread_create(&th[r], NULL, rank_main, &js[r]);
        }
        for (r = 0; r < n; r++) pthread_join(th[r], NULL);
        pdp_nccl_group_free(g);
        for (r = 0; r < n; r++) ASSERTm(js[r].msg, js[r].st == PDP_OK);
        if (!hook) continue;
        ASSERTm("compressed DDP over NCCL within 1e-2 of one GPU",
                rel_err(jobs[0].params_out, ref, count) <= 1e-2);
        ASSERTm("the hook changed nothing", memcmp(jobs[0].params_out, plain[0].params_out,
                                                   (size_t)count * 4) != 0);
        for (r = 0; r < n; r++) {
            if (getenv("PDP_TEST_VERBOSE"))
                for (i = 0; i < count; i++)
                    if (jobs[0].params_out[i] != jobs[r].params_out[i])
                        printf("hook %d rank %d param %lld: %.9g vs rank 0 %.9g (plain %.9g)\n",
                               hook, r, (long long)i, jobs[r].params_out[i],
                               jobs[0].params_out[i], plain[r].params_out[i]);
            ASSERT_MEM_EQm("ranks differ", jobs[0].params_out, jobs[r].params_out,
                           (size_t)count * 4);
            if (n == 2) ASSERT_EQ(plain[r].bytes_sent, 2 * jobs[r].bytes_sent);
            else ASSERT(plain[r].bytes_sent > 2 * jobs[r].bytes_sent - 8 &&
                        plain[r].bytes_sent < 2 * jobs[r].bytes_sent + 8);
        }
        for (r = 0; r < n; r++) free(jobs[r].params_out);
    }
    for (r = 0; r < n; r++) free(plain[r].params_out);
    free(ref);
    PASS();
}

/* ---- with PDP_CUDA: ZeRO over NCCL ----
   Stages 1, 2 and 3 on CUDA models, one thread rank per GPU (two GPUs), Adam,
   with and without accumulation (stages 2-3 then reduce every micro-batch), with
   and without clipping from shards: after ZN_STEPS steps every rank's gathered
   parameters equal one CPU model's on the global batches (1e-5 relative) and
   each other's bit for bit; the memory and byte figures are the CPU's formulas;
   a shard checkpoint saved and loaded back on the device changes no bit. */
enum { ZN_IN = 20, ZN_OUT = 5, ZN_PER = 4, ZN_RANKS = 2, ZN_STEPS = 3, ZN_MAXP = 1024 };

static pdp_status zn_build(pdp_model **out, pdp_device dev)
{
    pdp_model_desc d;
    pdp_model *m;
    pdp_status st;
    memset(&d, 0, sizeof d);
    d.seed = 91;
    d.device = dev;
    d.input_shape[0] = ZN_IN;
    if ((st = pdp_model_create(&m, &d)) != PDP_OK) return st;
    if ((st = pdp_model_add_linear(m, 16)) || (st = pdp_model_add_relu(m)) ||
        (st = pdp_model_add_linear(m, 11)) || (st = pdp_model_add_tanh(m)) ||
        (st = pdp_model_add_linear(m, ZN_OUT))) {
        pdp_model_free(m);
        return st;
    }
    *out = m;
    return PDP_OK;
}

/* Micro-batch mb of the global batch: x [ZN_RANKS ZN_PER, ZN_IN], labels. */
static void zn_batch(int mb, float *x, int32_t *y)
{
    int i;
    fill_random(x, (int64_t)ZN_RANKS * ZN_PER * ZN_IN, 300 + (uint64_t)mb);
    for (i = 0; i < ZN_RANKS * ZN_PER; i++) y[i] = (int32_t)((i * 3 + mb) % ZN_OUT);
}

static pdp_optim_desc zn_adam(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 0.01f;
    return od;
}

#define ZN_CLIP 0.05f

/* The reference: one CPU model on the global batches. */
static pdp_status zn_single(int accum, int clip, float *params, int64_t *count)
{
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = zn_adam();
    float x[ZN_RANKS * ZN_PER * ZN_IN], loss;
    int32_t y[ZN_RANKS * ZN_PER];
    int64_t shape[2] = {ZN_RANKS * ZN_PER, ZN_IN};
    pdp_tensor xt, p, g;
    pdp_status st;
    int s, a;
    if ((st = zn_build(&m, pdp_cpu())) || (st = pdp_optim_create(&o, m, &od))) goto out;
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    for (s = 0; s < ZN_STEPS; s++) {
        for (a = 0; a < accum; a++) {
            zn_batch(s * accum + a, x, y);
            if ((st = pdp_model_forward_backward(m, &xt, y, &loss))) goto out;
        }
        if (clip && (st = pdp_clip_grad_norm(m, ZN_CLIP, NULL))) goto out;
        if ((st = pdp_optim_step(o))) goto out;
        pdp_model_zero_grad(m);
    }
    pdp_model_flat(m, &p, &g);
    *count = p.count;
    memcpy(params, p.data, (size_t)p.count * sizeof(float));
out:
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}

typedef struct zn_job {
    pdp_nccl_group *g;   /* NCCL on GPU rank, or (NULL) */
    pdp_local_group *lg; /* the local backend on the CPU: the figures to match */
    int rank, stage, accum, clip;
    int hook;            /* 1: pdp_ddp_hook_bf16_compress registered */
    const char *prefix;  /* the checkpoint set's prefix */
    float params[ZN_MAXP], reloaded[ZN_MAXP];
    int64_t count;
    int units;
    pdp_zero_memory mem;
    pdp_zero_stats stats;
    pdp_status st;
    char msg[1100];
} zn_job;

static pdp_status zn_train(zn_job *j, pdp_comm *c)
{
    pdp_device dev = j->g ? pdp_cuda(j->rank) : pdp_cpu();
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_zero *z = NULL;
    pdp_zero_desc zd;
    pdp_optim_desc od = zn_adam();
    pdp_tensor *xs = NULL;
    float x[ZN_RANKS * ZN_PER * ZN_IN], loss;
    int32_t y[ZN_RANKS * ZN_PER];
    int64_t shape[2] = {ZN_PER, ZN_IN};
    pdp_status st;
    int s, a;
    memset(&zd, 0, sizeof zd);
    zd.stage = j->stage;
    zd.bucket_cap_mb = 1e-9; /* a unit per layer */
    zd.first_bucket_mb = 1e-9;
    pdp_ddp_comm_hook h = pdp_ddp_hook_bf16_compress();
    if ((st = zn_build(&m, dev)) || (st = pdp_zero_create(&z, m, c, &zd)) ||
        (j->hook && (st = pdp_zero_register_comm_hook(z, &h))) ||
        (st = pdp_zero_optim_create(&o, z, &od)) ||
        (st = pdp_tensor_create(&xs, dev, 2, shape)))
        goto out;
    j->units = pdp_zero_num_units(z);
    pdp_zero_get_memory(z, o, &j->mem);
    for (s = 0; s < ZN_STEPS; s++) {
        for (a = 0; a < j->accum; a++) {
            zn_batch(s * j->accum + a, x, y);
            pdp_zero_set_no_sync(z, a < j->accum - 1);
            if ((st = pdp_tensor_upload(xs, x + (int64_t)j->rank * ZN_PER * ZN_IN)) ||
                (st = pdp_zero_forward_backward(z, xs, y + j->rank * ZN_PER, &loss)))
                goto out;
        }
        if ((st = pdp_zero_finish(z))) goto out;
        if (j->clip && (st = pdp_zero_clip_grad_norm(z, ZN_CLIP, NULL))) goto out;
        if ((st = pdp_zero_step(z, o))) goto out;
    }
    pdp_zero_get_stats(z, &j->stats);
    j->count = pdp_model_param_count(m);
    if (j->count > ZN_MAXP) {
        st = PDP_ERR_INVALID;
        goto out;
    }
    if ((st = pdp_zero_gather_params(z, j->params)) ||
        (st = pdp_zero_checkpoint_save(z, o, j->prefix)) ||
        (st = pdp_zero_checkpoint_load(z, o, j->prefix)) ||
        (st = pdp_zero_gather_params(z, j->reloaded)))
        goto out;
out:
    pdp_tensor_free(xs);
    pdp_zero_free(z);
    pdp_optim_free(o);
    pdp_model_free(m);
    return st;
}

static void *zn_main(void *arg)
{
    zn_job *j = (zn_job *)arg;
    pdp_comm *c = NULL;
    j->st = j->g ? pdp_comm_create_nccl(&c, j->g, j->rank)
                 : pdp_comm_create_local(&c, j->lg, j->rank);
    if (j->st == PDP_OK) j->st = zn_train(j, c);
    if (j->st) snprintf(j->msg, sizeof j->msg, "rank %d: %s", j->rank, pdp_last_error());
    pdp_comm_free(c);
    return NULL;
}

/* The set's files: the marker and one shard per rank. */
static void zn_remove_set(const char *prefix)
{
    char path[300];
    int r;
    snprintf(path, sizeof path, "%s.done", prefix);
    remove(path);
    for (r = 0; r < ZN_RANKS; r++) {
        snprintf(path, sizeof path, "%s.rank%d.safetensors", prefix, r);
        remove(path);
    }
}

/* ZN_RANKS thread ranks over NCCL (gpu) or the local backend on the CPU. */
static pdp_status zn_run_hook(bool gpu, int stage, int accum, int clip, int hook,
                              zn_job *jobs);

static pdp_status zn_run(bool gpu, int stage, int accum, int clip, zn_job *jobs)
{
    return zn_run_hook(gpu, stage, accum, clip, 0, jobs);
}

static pdp_status zn_run_hook(bool gpu, int stage, int accum, int clip, int hook,
                              zn_job *jobs)
{
    char prefix[200];
    pdp_device devs[ZN_RANKS];
    pdp_nccl_group *g = NULL;
    pdp_local_group *lg = NULL;
    pthread_t th[ZN_RANKS];
    pdp_status st;
    int r;
    snprintf(prefix, sizeof prefix, "/tmp/pdp_test_cuda_zero_%ld", (long)getpid());
    for (r = 0; r < ZN_RANKS; r++) devs[r] = pdp_cuda(r);
    st = gpu ? pdp_nccl_group_create(&g, ZN_RANKS, devs, NULL)
             : pdp_local_group_create(&lg, ZN_RANKS, NULL);
    if (st != PDP_OK) return st;
    for (r = 0; r < ZN_RANKS; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].g = g;
        jobs[r].lg = lg;
        jobs[r].rank = r;
        jobs[r].stage = stage;
        jobs[r].accum = accum;
        jobs[r].clip = clip;
        jobs[r].hook = hook;
        jobs[r].prefix = prefix;
        pthread_create(&th[r], NULL, zn_main, &jobs[r]);
    }
    for (r = 0; r < ZN_RANKS; r++) pthread_join(th[r], NULL);
    pdp_nccl_group_free(g);
    pdp_local_group_free(lg);
    zn_remove_set(prefix);
    return PDP_OK;
}

static enum greatest_test_res zn_check(int stage, int accum, int clip)
{
    static zn_job jobs[ZN_RANKS], cpu[ZN_RANKS];
    static float ref[ZN_MAXP];
    static char msg[300];
    int64_t count = 0;
    double e;
    int r;
    ASSERT_ENUM_EQ(PDP_OK, zn_single(accum, clip, ref, &count), pdp_status_name);
    ASSERTm(pdp_last_error(), zn_run(false, stage, accum, clip, cpu) == PDP_OK);
    for (r = 0; r < ZN_RANKS; r++) ASSERTm(cpu[r].msg, cpu[r].st == PDP_OK);
    ASSERTm(pdp_last_error(), zn_run(true, stage, accum, clip, jobs) == PDP_OK);
    for (r = 0; r < ZN_RANKS; r++) ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
    ASSERT_EQ(count, jobs[0].count);
    e = rel_err(jobs[0].params, ref, count);
    snprintf(msg, sizeof msg, "stage %d accum %d clip %d: ZeRO over NCCL vs one CPU model %.3g",
             stage, accum, clip, e);
    ASSERTm(msg, e <= TOL);
    for (r = 0; r < ZN_RANKS; r++) {
        const pdp_zero_memory *mm = &jobs[r].mem;
        double psi = (double)mm->param_count, pad = (double)mm->padded_count, want;
        int64_t extra;
        int n = ZN_RANKS;
        if (r > 0)
            ASSERT_MEM_EQm("ranks differ after the gather", jobs[0].params, jobs[r].params,
                           (size_t)count * 4);
        ASSERT_MEM_EQm("a checkpoint saved and loaded on the device changed the parameters",
                       jobs[r].params, jobs[r].reloaded, (size_t)count * 4);
        ASSERT_EQ(count, mm->param_count);
        ASSERT_EQ(n * mm->shard_count, mm->padded_count);
        ASSERT(mm->padded_count >= psi && mm->padded_count < psi + 16 * n * jobs[r].units);
        ASSERT_EQ(2, mm->state_per_param);
        want = stage == 1   ? 4 * psi + 4 * pad + 8 * pad / n
               : stage == 2 ? 4 * psi + 12 * pad / n
                            : 16 * pad / n;
        snprintf(msg, sizeof msg, "stage %d: measured %lld, formula %.0f", stage,
                 (long long)(mm->param_bytes + mm->grad_bytes + mm->optim_bytes), want);
        ASSERT_EQm(msg, (long long)want,
                   (long long)(mm->param_bytes + mm->grad_bytes + mm->optim_bytes));
        ASSERT(mm->buffer_bytes > 0 && mm->buffer_bytes <= mm->buffer_bound);
        /* the same figures as the CPU run over the local backend */
        ASSERT_MEM_EQm("memory figures differ from the CPU's", &cpu[r].mem, mm, sizeof *mm);
        ASSERT_EQ(cpu[r].units, jobs[r].units);
        ASSERT_EQ(cpu[r].stats.bytes_sent, jobs[r].stats.bytes_sent);
        ASSERT_EQ(cpu[r].stats.gathers, jobs[r].stats.gathers);
        ASSERT_EQ(cpu[r].stats.steps, jobs[r].stats.steps);
        ASSERT_EQ(ZN_STEPS * (stage == 1 ? 1 : accum), (int)jobs[r].stats.steps);
        /* the last step's bytes, counted by the communicator: the formula (which
           counts the accumulated micro-batches' reduce-scatters and, at stage 3, their
           gathers of the units not still held), plus clipping's scalar */
        extra = clip ? (int64_t)(2.0 * (n - 1) / n * 4.0) : 0;
        snprintf(msg, sizeof msg, "stage %d accum %d clip %d: sent %lld, formula %lld + %lld",
                 stage, accum, clip, (long long)jobs[r].stats.bytes_sent,
                 (long long)jobs[r].stats.formula_bytes, (long long)extra);
        ASSERT_EQ((int64_t)accum, jobs[r].stats.micro_steps);
        if (accum == 1)
            ASSERT_EQ((stage == 3 ? 3 : 2) * (int64_t)(n - 1) * mm->shard_count * 4,
                      jobs[r].stats.formula_bytes);
        ASSERT_EQm(msg, jobs[r].stats.formula_bytes + extra, jobs[r].stats.bytes_sent);
        if (stage < 3 || accum == 1)
            ASSERT_EQ((stage == 3 ? 2 : 1) * jobs[r].units, (int)jobs[r].stats.gathers);
    }
    PASS();
}

TEST cuda_zero_nccl_thread_ranks_match_single(void)
{
    int stage, accum, clip;
    NEED_GPU();
    if (devices() < ZN_RANKS) SKIPm("ZeRO over NCCL needs 2 CUDA devices");
    for (stage = 1; stage <= 3; stage++)
        for (accum = 1; accum <= 2; accum++)
            for (clip = 0; clip <= 1; clip++) CHECK_CALL(zn_check(stage, accum, clip));
    PASS();
}

/* ZeRO stages 1-3 with the bf16 compression hook over NCCL (ncclBfloat16 reduce-scatters
   of the conversion kernels' output): within 1e-3 of the same run on the CPU over the
   local backend (with 2 ranks both round the bf16 sum once; what differs is the fp32
   gradients each device computes, which can move a bf16 rounding), different from
   fp32 ZeRO, the ranks bit-identical, and the CPU run's bytes (the reduce-scatters
   halved). */
TEST cuda_zero_nccl_bf16_hook_matches_the_cpu(void)
{
    static zn_job jobs[ZN_RANKS], cpu[ZN_RANKS], plain[ZN_RANKS];
    static char msg[200];
    int stage, r;
    double e;
    NEED_GPU();
    if (devices() < ZN_RANKS) SKIPm("ZeRO over NCCL needs 2 CUDA devices");
    for (stage = 1; stage <= 3; stage++) {
        ASSERTm(pdp_last_error(), zn_run_hook(false, stage, 1, 0, 1, cpu) == PDP_OK);
        ASSERTm(pdp_last_error(), zn_run_hook(true, stage, 1, 0, 1, jobs) == PDP_OK);
        ASSERTm(pdp_last_error(), zn_run_hook(true, stage, 1, 0, 0, plain) == PDP_OK);
        for (r = 0; r < ZN_RANKS; r++) {
            ASSERTm(cpu[r].msg, cpu[r].st == PDP_OK);
            ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
            ASSERTm(plain[r].msg, plain[r].st == PDP_OK);
        }
        e = rel_err(jobs[0].params, cpu[0].params, jobs[0].count);
        snprintf(msg, sizeof msg, "stage %d: bf16 ZeRO over NCCL vs on the CPU %.3g", stage, e);
        ASSERTm(msg, e <= 1e-3);
        ASSERTm("the hook changed nothing",
                memcmp(jobs[0].params, plain[0].params, (size_t)jobs[0].count * 4) != 0);
        for (r = 0; r < ZN_RANKS; r++) {
            ASSERT_MEM_EQm("ranks differ", jobs[0].params, jobs[r].params,
                           (size_t)jobs[0].count * 4);
            ASSERT_EQ(cpu[r].stats.bytes_sent, jobs[r].stats.bytes_sent);
            ASSERT_EQ((int64_t)(ZN_RANKS - 1) * jobs[r].mem.shard_count * 2,
                      plain[r].stats.bytes_sent - jobs[r].stats.bytes_sent);
        }
    }
    PASS();
}

/* ---- the conformance suite (tests/comm_conformance.h) over NCCL, a thread per GPU ----
   World sizes 1 .. min(GPUs, 4); buffers on rank r's GPU (pdp_cuda(r)); the cases that
   time out wait 0.5 s. `make emu-cuda-test` runs it on 1, 2, 3 and 4 emulated GPUs. */

#include "comm_conformance.h"

static pdp_status nccl_conf_make(void *group, int rank, pdp_comm **out)
{
    return pdp_comm_create_nccl(out, (pdp_nccl_group *)group, rank);
}

static int nccl_conf_run(const conf_factory *f, int n, double timeout_s, conf_fn fn, int64_t arg,
                         conf_rank *ranks)
{
    pdp_device devs[CONF_MAXR];
    pdp_nccl_group *g = NULL;
    pdp_comm_desc d;
    int r;
    memset(&d, 0, sizeof d);
    d.timeout_s = timeout_s;
    d.name = "conf";
    for (r = 0; r < CONF_MAXR; r++) devs[r] = pdp_cuda(r < n ? r : 0);
    if (pdp_nccl_group_create(&g, n, devs, &d) != PDP_OK) return 0;
    n = conf_threads(f, n, timeout_s, fn, arg, ranks, g, nccl_conf_make);
    pdp_nccl_group_free(g);
    return n;
}

static void *nccl_conf_alloc(pdp_comm *c, size_t bytes)
{
    void *p = NULL;
    return pdp_cudak_malloc(c->device.ordinal, bytes, &p) == PDP_OK ? p : NULL;
}

static void nccl_conf_release(pdp_comm *c, void *p) { pdp_cudak_free(c->device.ordinal, p); }

static pdp_status nccl_conf_put(pdp_comm *c, void *dev, const void *host, size_t bytes)
{
    return pdp_cudak_memcpy(c->device.ordinal, dev, -1, host, bytes);
}

static pdp_status nccl_conf_get(pdp_comm *c, void *host, const void *dev, size_t bytes)
{
    return pdp_cudak_memcpy(-1, host, c->device.ordinal, dev, bytes);
}

static conf_factory nccl_factory = {"nccl", PDP_BACKEND_NCCL, 1, 1, nccl_conf_run,
                                    nccl_conf_alloc, nccl_conf_release, nccl_conf_put,
                                    nccl_conf_get, conf_threads_sync, 0.5};

TEST conf_nccl_needs_a_gpu(void)
{
    NEED_GPU();
    PASS();
}

/* The desc rule (comm.h) for NCCL groups and process ranks: a negative, NaN or infinite
   timeout_s is PDP_ERR_INVALID naming the function and the field, before any NCCL call. */
TEST cuda_nccl_desc_timeout_rule(void)
{
    static const double bad[] = {-1.0, 0.0 / 0.0, 1.0 / 0.0};
    pdp_device devs[1];
    pdp_nccl_group *g = (pdp_nccl_group *)&g;
    pdp_comm *c = (pdp_comm *)&c;
    pdp_comm_desc d;
    int i;
    devs[0] = pdp_cuda(0);
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_NCCL;
    for (i = 0; i < 3; i++) {
        d.timeout_s = bad[i];
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_nccl_group_create(&g, 1, devs, &d), pdp_status_name);
        ASSERT(g == NULL);
        ASSERTm(pdp_last_error(),
                strstr(pdp_last_error(), "pdp_nccl_group_create: desc->timeout_s") != NULL);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_comm_init_env(&c, &d), pdp_status_name);
        ASSERT(c == NULL);
        ASSERTm(pdp_last_error(),
                strstr(pdp_last_error(), "pdp_comm_init_env: desc->timeout_s") != NULL);
    }
    PASS();
}

/* Process-rank DDP over NCCL: tests/gpu/run.sh starts one process per GPU with
   torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and
   `-t cuda_ddp_nccl_processes`; each rank trains its shard on GPU LOCAL_RANK and
   compares its parameters with one GPU trained on the global batch. Skips (never
   fails) when WORLD_SIZE is not above 1, i.e. in an ordinary run. */
TEST cuda_ddp_nccl_processes_match_single(void)
{
    enum { PER = 4, MAXR = 8 };
    const char *ws = getenv("WORLD_SIZE");
    pdp_env_info env;
    pdp_comm_desc cd;
    pdp_comm *c = NULL;
    float x[MAXR * PER * 20], mine[4096], *ref = NULL;
    int32_t labels[MAXR * PER];
    int64_t count = 0;
    pdp_status st;
    double e;
    int r;
    char msg[1100];
    if (!ws || atoi(ws) < 2)
        SKIPm("WORLD_SIZE is not above 1 (tests/gpu/run.sh starts one process per GPU)");
    NEED_GPU();
    ASSERTm(pdp_last_error(), pdp_env_read(&env) == PDP_OK);
    ASSERTm("WORLD_SIZE above 8", env.world_size <= MAXR);
    ASSERTm("LOCAL_RANK names no GPU of this machine", env.local_rank < devices());
    fill_random(x, (int64_t)env.world_size * PER * 20, 11);
    for (r = 0; r < env.world_size * PER; r++) labels[r] = r % 5;
    memset(&cd, 0, sizeof cd);
    cd.backend = PDP_BACKEND_NCCL;
    cd.device = pdp_cuda(env.local_rank);
    cd.timeout_s = 60;
    ASSERTm(pdp_last_error(), pdp_comm_init_env(&c, &cd) == PDP_OK);
    ASSERT_EQ(env.rank, pdp_comm_rank(c));
    ASSERT_EQ(env.world_size, pdp_comm_size(c));
    st = train_ddp_shard(c, pdp_cuda(env.local_rank), x, labels, PER, mine);
    snprintf(msg, sizeof msg, "rank %d: %s", env.rank, st == PDP_OK ? "" : pdp_last_error());
    pdp_comm_free(c);
    ASSERTm(msg, st == PDP_OK);
    ASSERTm(pdp_last_error(), train_single(pdp_cuda(env.local_rank), x, labels,
                                           (int64_t)env.world_size * PER, &ref, &count) == PDP_OK);
    ASSERT(count <= 4096);
    e = rel_err(mine, ref, count);
    free(ref);
    snprintf(msg, sizeof msg, "rank %d of %d: DDP over NCCL processes vs one GPU: relative "
             "error %g", env.rank, env.world_size, e);
    ASSERTm(msg, e <= TOL);
    PASS();
}

/* DP over every GPU present (at least two workers: with one GPU both share device 0,
   which still runs every stage - replicate, scatter, per-worker apply, gather, the
   reduce through device 0 - and two host threads on one device) against one CPU
   training on the global batch: the loss, the gathered outputs and the parameters
   after each SGD-momentum step, with dropout on (masks keyed by global sample). */
#define DP_B 10

static enum greatest_test_res check_dp(int n, const pdp_device *devs, bool host_input,
                                       const char *what)
{
    pdp_dp_desc dd;
    pdp_dp *dp = NULL;
    pdp_dp_stats stats;
    pdp_model *mg = NULL, *mc = NULL;
    pdp_optim *og = NULL, *oc = NULL;
    pdp_optim_desc sgd;
    pdp_tensor *xc = NULL, *xg = NULL, *dyc = NULL;
    const pdp_tensor *yc, *yg;
    pdp_cuda_memory_stats before[8], after[8];
    int64_t shape[2] = {DP_B, 20};
    int32_t labels[DP_B];
    int ndev = devices() < 8 ? devices() : 8, i, step;
    float lg, lc, *h;
    double e;
    static char msg[256];
    for (i = 0; i < DP_B; i++) labels[i] = (i * 3 + 1) % 5;
    memset(before, 0, sizeof before);
    memset(after, 0, sizeof after);
    memset(&sgd, 0, sizeof sgd);
    sgd.lr = 0.1f;
    sgd.momentum = 0.9f;
    ASSERT_ENUM_EQ(PDP_OK, build_net(&mc, false, pdp_cpu()), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, build_net(&mg, false, pdp_cuda(0)), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oc, mc, &sgd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&og, mg, &sgd), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&xc, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&xg, pdp_cuda(0), 2, shape), pdp_status_name);
    fill_random(xc->data, xc->count, 21);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(xg, xc->data), pdp_status_name);
    shape[1] = 5;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&dyc, pdp_cpu(), 2, shape), pdp_status_name);
    memset(&dd, 0, sizeof dd);
    dd.num_workers = n;
    dd.devices = devs;
    ASSERTm(pdp_last_error(), pdp_dp_create(&dp, mg, &dd) == PDP_OK);
    for (step = 0; step < 4; step++) {
        if (step == 2) /* the first steps grew every buffer; from here nothing is allocated */
            for (i = 0; i < ndev; i++)
                ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(i), &before[i]),
                               pdp_status_name);
        ASSERTm(pdp_last_error(), pdp_dp_step(dp, og, host_input ? xc : xg, labels, &lg) == PDP_OK);
        /* the reference: one CPU model, the whole batch */
        pdp_model_zero_grad(mc);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(mc, xc, &yc), pdp_status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_loss_cross_entropy(yc, labels, &lc, dyc), pdp_status_name);
        yg = pdp_dp_output(dp);
        ASSERT(yg != NULL);
        ASSERT_EQ(yc->count, yg->count);
        h = host_copy(yg);
        ASSERT(h != NULL);
        e = rel_err(h, yc->data, yc->count);
        free(h);
        snprintf(msg, sizeof msg, "%s step %d: gathered outputs, relative error %g", what, step,
                 e);
        ASSERTm(msg, e <= TOL);
        snprintf(msg, sizeof msg, "%s step %d: loss CPU %.9g DP %.9g", what, step, (double)lc,
                 (double)lg);
        ASSERTm(msg, fabs((double)lc - lg) <= TOL * fabs((double)lc));
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_backward(mc, dyc), pdp_status_name);
        e = model_rel_err(mg, mc, 1);
        snprintf(msg, sizeof msg, "%s step %d: reduced gradients, relative error %g", what, step,
                 e);
        ASSERTm(msg, e <= TOL);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(oc), pdp_status_name);
        e = model_rel_err(mg, mc, 0);
        snprintf(msg, sizeof msg, "%s step %d: parameters, relative error %g", what, step, e);
        ASSERTm(msg, e <= TOL);
    }
    for (i = 0; i < ndev; i++) {
        ASSERT_ENUM_EQ(PDP_OK, pdp_cuda_memory_stats_get(pdp_cuda(i), &after[i]), pdp_status_name);
        snprintf(msg, sizeof msg, "%s: cudaMalloc calls on GPU %d after warm-up: %lld -> %lld",
                 what, i, (long long)before[i].device_mallocs, (long long)after[i].device_mallocs);
        ASSERTm(msg, before[i].device_mallocs == after[i].device_mallocs);
        ASSERT_EQ(before[i].in_use_bytes, after[i].in_use_bytes);
    }
    ASSERT_ENUM_EQ(PDP_OK, pdp_dp_get_stats(dp, &stats), pdp_status_name);
    ASSERT_EQ(n, stats.num_workers);
    ASSERT_EQ(n < DP_B ? n : DP_B, stats.active_workers);
    ASSERT(!stats.params_shared);
    ASSERT_EQ((size_t)(stats.active_workers - 1) * (size_t)pdp_model_param_count(mg) *
                  sizeof(float),
              stats.reduce_bytes);
    pdp_dp_free(dp);
    pdp_tensor_free(xc);
    pdp_tensor_free(xg);
    pdp_tensor_free(dyc);
    pdp_optim_free(og);
    pdp_optim_free(oc);
    pdp_model_free(mg);
    pdp_model_free(mc);
    PASS();
}

TEST cuda_dp_over_gpus_matches_cpu(void)
{
    enum { MAXW = 17 };
    pdp_device devs[MAXW];
    int ndev, n, i;
    char what[96];
    NEED_GPU();
    ndev = devices() < 8 ? devices() : 8;
    /* one worker per GPU (two on one GPU), the batch on device 0 */
    n = ndev < 2 ? 2 : ndev;
    for (i = 0; i < n; i++) devs[i] = pdp_cuda(i % ndev);
    snprintf(what, sizeof what, "DP, %d workers on %d GPU(s), batch on GPU 0", n, ndev);
    CHECK_CALL(check_dp(n, devs, false, what));
    /* the batch on the host: scatter uploads every shard */
    snprintf(what, sizeof what, "DP, %d workers on %d GPU(s), batch on the host", n, ndev);
    CHECK_CALL(check_dp(n, devs, true, what));
    /* two workers per GPU, plus one: several host threads drive each device */
    n = 2 * ndev + 1;
    for (i = 0; i < n; i++) devs[i] = pdp_cuda(i % ndev);
    snprintf(what, sizeof what, "DP, %d workers on %d GPU(s)", n, ndev);
    CHECK_CALL(check_dp(n, devs, false, what));
    PASS();
}

/* Needs no GPU: the device list is checked before any device is touched. */
TEST cuda_dp_rejects_mixed_devices(void)
{
    pdp_model *m = NULL;
    pdp_dp *dp = NULL;
    pdp_dp_desc dd;
    pdp_device devs[2];
    ASSERT_ENUM_EQ(PDP_OK, build_net(&m, false, pdp_cpu()), pdp_status_name);
    devs[0] = pdp_cpu();
    devs[1] = pdp_cuda(0);
    memset(&dd, 0, sizeof dd);
    dd.num_workers = 2;
    dd.devices = devs;
    ASSERT_ENUM_EQ(PDP_ERR_DEVICE, pdp_dp_create(&dp, m, &dd), pdp_status_name);
    ASSERT(dp == NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "devices[1]") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "all CPU or all CUDA") != NULL);
    pdp_model_free(m);
    PASS();
}

/* ---- with PDP_CUDA: gradient clipping ---- */

/* 90,300 gradients (more than the 256 blocks x 256 threads of one pass of the norm
   kernel): the norm and the clipped gradients against the CPU, the same bits on a
   second run, nothing clipped under a large max_norm, NaN reported. */
TEST cuda_clip_grad_norm_matches_cpu(void)
{
    pdp_model_desc d;
    pdp_model *mc = NULL, *mg = NULL;
    pdp_tensor cp, cg, gp, gg;
    float nc, ng, ng2, *src = NULL, *h = NULL;
    double e;
    char msg[128];
    int64_t i;
    NEED_GPU();
    memset(&d, 0, sizeof d);
    d.seed = 5;
    d.input_shape[0] = 300;
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&mc, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(mc, 300), pdp_status_name);
    d.device = pdp_cuda(0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&mg, &d), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(mg, 300), pdp_status_name);
    pdp_model_flat(mc, &cp, &cg);
    pdp_model_flat(mg, &gp, &gg);
    ASSERT_EQ(90300, cg.count);
    src = (float *)malloc((size_t)cg.count * sizeof(float));
    h = (float *)malloc((size_t)cg.count * sizeof(float));
    ASSERT(src && h);
    fill_random(src, cg.count, 77);

    memcpy(cg.data, src, (size_t)cg.count * sizeof(float));
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(&gg, src), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(mc, 1.0f, &nc), pdp_status_name);
    ASSERTm(pdp_last_error(), pdp_clip_grad_norm(mg, 1.0f, &ng) == PDP_OK);
    snprintf(msg, sizeof msg, "norm CPU %.9g GPU %.9g", (double)nc, (double)ng);
    ASSERTm(msg, nc > 100.0f && fabs((double)nc - ng) <= 1e-6 * nc);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(&gg, h), pdp_status_name);
    e = rel_err(h, cg.data, cg.count);
    snprintf(msg, sizeof msg, "clipped gradients: relative error %g", e);
    ASSERTm(msg, e <= 1e-6);

    /* deterministic: the same gradients give the same bits */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(&gg, src), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(mg, 1.0f, &ng2), pdp_status_name);
    ASSERT_EQ(ng, ng2);

    /* under the limit: untouched */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(&gg, src), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_clip_grad_norm(mg, 1e6f, &ng2), pdp_status_name);
    ASSERT_EQ(ng, ng2);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(&gg, h), pdp_status_name);
    for (i = 0; i < cg.count; i++)
        if (h[i] != src[i]) FAILm("gradients changed although the norm is below max_norm");

    src[4321] = NAN;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(&gg, src), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_NUMERIC, pdp_clip_grad_norm(mg, 1.0f, NULL), pdp_status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_clip_grad_norm") != NULL);
    free(src);
    free(h);
    pdp_model_free(mc);
    pdp_model_free(mg);
    PASS();
}

/* ---- model parallel over NCCL: TP and PP, a thread per GPU ----
   The models of test_tp.c and test_pp.c, on 2..4 emulated or real GPUs (as many as
   there are, at most 4; fewer than 2: skipped by name), trained for MP_STEPS Adam
   steps on the same batches as one CPU model; every step's loss and the final
   parameters must match it within 1e-5 relative (TF32 off). TP: two blocks, the first
   at layer 0 (f's backward skipped), widths 10 and 7 (3 and 4 do not divide them);
   the parameters are compared through pdp_tp_checkpoint_save (the full tensors,
   gathered on the GPUs) loaded on the CPU, and pdp_tp_checkpoint_load puts every
   rank's slices back bit for bit. PP: 13 rows in 3 micro-batches (5, 4, 4), GPipe and
   1F1B; each stage's parameters against the CPU model's of the same name, and with
   pdp_pp_clip_grad_norm against pdp_clip_grad_norm (the norms too). 2-D on 4
   GPUs: 2 DP x 2 TP (DDP over NCCL groups made by pdp_comm_split) and 2 DP x 2 PP
   (desc.dp) against the CPU model on the 12 rows the two DP groups share. */
enum { MP_IN = 6, MP_B = 13, MP_STEPS = 3, MP_CLASSES = 3, MP_MAXR = 4 };

static void mp_batch(int step, float *x, int32_t *y)
{
    int i;
    fill_random(x, (int64_t)MP_B * MP_IN, 100 + (uint64_t)step);
    for (i = 0; i < MP_B; i++) y[i] = (int32_t)((i * 5 + step) % MP_CLASSES);
}

static pdp_optim_desc mp_adam(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAM;
    od.lr = 0.01f;
    return od;
}

/* Linear(10) ReLU Linear(9) Tanh Linear(7) GELU Linear(3) on dev; with tp, each Linear
   pair is a TP block (f, column-parallel, act, row-parallel, g) on tp. */
static pdp_status mp_build(pdp_model **out, pdp_device dev, pdp_comm *tp)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = MP_IN;
    md.seed = 7;
    md.device = dev;
    *out = NULL;
    if ((st = pdp_model_create(&m, &md))) return st;
    if (tp && ((st = pdp_model_set_tp(m, tp)) || (st = pdp_model_add_tp_copy(m)) ||
               (st = pdp_model_add_column_parallel_linear(m, 10)) ||
               (st = pdp_model_add_relu(m)) || (st = pdp_model_add_row_parallel_linear(m, 9)) ||
               (st = pdp_model_add_tp_reduce(m)) || (st = pdp_model_add_tanh(m)) ||
               (st = pdp_model_add_tp_copy(m)) ||
               (st = pdp_model_add_column_parallel_linear(m, 7)) || (st = pdp_model_add_gelu(m)) ||
               (st = pdp_model_add_row_parallel_linear(m, MP_CLASSES)) ||
               (st = pdp_model_add_tp_reduce(m))))
        goto fail;
    if (!tp && ((st = pdp_model_add_linear(m, 10)) || (st = pdp_model_add_relu(m)) ||
                (st = pdp_model_add_linear(m, 9)) || (st = pdp_model_add_tanh(m)) ||
                (st = pdp_model_add_linear(m, 7)) || (st = pdp_model_add_gelu(m)) ||
                (st = pdp_model_add_linear(m, MP_CLASSES))))
        goto fail;
    *out = m;
    return PDP_OK;
fail:
    pdp_model_free(m);
    return st;
}

/* The reference: the CPU model after MP_STEPS Adam steps on the whole batches' first
   rows rows; with max_norm > 0, clipped by pdp_clip_grad_norm before each step (norms[s]:
   step s's norm). */
static pdp_status mp_reference_clip(pdp_model **out, int64_t rows, float *losses,
                                    float max_norm, float *norms)
{
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = mp_adam();
    pdp_tensor xt;
    float x[MP_B * MP_IN];
    int32_t y[MP_B];
    int64_t shape[2];
    pdp_status st;
    int s;
    *out = NULL;
    shape[0] = rows;
    shape[1] = MP_IN;
    if ((st = mp_build(&m, pdp_cpu(), NULL)) || (st = pdp_optim_create(&o, m, &od))) goto out;
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    for (s = 0; s < MP_STEPS; s++) {
        mp_batch(s, x, y);
        pdp_optim_zero_grad(o);
        if ((st = pdp_model_forward_backward(m, &xt, y, &losses[s])) ||
            (max_norm > 0.0f && (st = pdp_clip_grad_norm(m, max_norm, &norms[s]))) ||
            (st = pdp_optim_step(o)))
            goto out;
    }
out:
    pdp_optim_free(o);
    if (st) pdp_model_free(m);
    else *out = m;
    return st;
}

static pdp_status mp_reference(pdp_model **out, int64_t rows, float *losses)
{
    return mp_reference_clip(out, rows, losses, 0.0f, NULL);
}

typedef struct mp_job {
    pdp_nccl_group *g;
    int rank, n;
    pdp_pp_schedule schedule; /* PP */
    const char *path;         /* TP: the checkpoint */
    const pdp_model *ref;     /* PP: the CPU reference, read only */
    bool pipeline;            /* 2-D: DP x PP (else DP x TP) */
    float losses[MP_STEPS];   /* rank 0 (TP) or the last stage (PP) */
    float max_norm;           /* PP: > 0: pdp_pp_clip_grad_norm before each step */
    float norms[MP_STEPS];    /* PP: its total_norm per step */
    double err;               /* PP: the largest relative error of the stage's parameters */
    pdp_status st;
    char msg[1100];
} mp_job;

/* The parameters of m downloaded into a malloc'd block (count floats). */
static float *mp_params(const pdp_model *m, int64_t *count)
{
    pdp_tensor p, g;
    pdp_model_flat(m, &p, &g);
    *count = p.count;
    return host_copy(&p);
}

static void *tp_main(void *arg)
{
    mp_job *j = (mp_job *)arg;
    pdp_device dev = pdp_cuda(j->rank);
    pdp_comm *c = NULL;
    pdp_model *m = NULL, *m2 = NULL;
    pdp_optim *o = NULL, *o2 = NULL;
    pdp_optim_desc od = mp_adam();
    pdp_tensor *x = NULL;
    float xh[MP_B * MP_IN], *a = NULL, *b = NULL;
    int32_t y[MP_B];
    int64_t shape[2] = {MP_B, MP_IN}, na = 0, nb = 0, i;
    int s;
    if ((j->st = pdp_comm_create_nccl(&c, j->g, j->rank)) ||
        (j->st = mp_build(&m, dev, c)) || (j->st = pdp_optim_create(&o, m, &od)) ||
        (j->st = pdp_tensor_create(&x, dev, 2, shape)))
        goto out;
    for (s = 0; s < MP_STEPS; s++) {
        mp_batch(s, xh, y);
        if ((j->st = pdp_tensor_upload(x, xh)) ||
            (j->st = pdp_model_forward_backward(m, x, y, &j->losses[s])) ||
            (j->st = pdp_optim_step(o)))
            goto out;
        pdp_optim_zero_grad(o);
    }
    /* the full tensors, gathered over NCCL; then read back into fresh slices */
    if ((j->st = pdp_tp_checkpoint_save(j->path, m, o)) || (j->st = mp_build(&m2, dev, c)) ||
        (j->st = pdp_optim_create(&o2, m2, &od)) ||
        (j->st = pdp_tp_checkpoint_load(j->path, m2, o2)))
        goto out;
    a = mp_params(m, &na);
    b = mp_params(m2, &nb);
    if (!a || !b || na != nb) {
        j->st = PDP_ERR_INVALID;
        snprintf(j->msg, sizeof j->msg, "rank %d: downloading the slices", j->rank);
        goto out;
    }
    for (i = 0; i < na; i++)
        if (a[i] != b[i]) {
            j->st = PDP_ERR_INVALID;
            snprintf(j->msg, sizeof j->msg, "rank %d: slice element %lld is %.9g after "
                     "pdp_tp_checkpoint_load, %.9g before", j->rank, (long long)i, (double)b[i],
                     (double)a[i]);
            goto out;
        }
out:
    if (j->st && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "rank %d: %s", j->rank, pdp_last_error());
    free(a);
    free(b);
    pdp_tensor_free(x);
    pdp_optim_free(o2);
    pdp_model_free(m2);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

/* j->err <- the largest relative error of stage m's parameters against j->ref's of
   the same names; a failure goes to j->st and j->msg. */
static void mp_stage_err(mp_job *j, const pdp_model *m)
{
    pdp_param p, q;
    float *h;
    int k;
    for (k = 0; k < pdp_model_num_params(m); k++) {
        double e;
        if ((j->st = pdp_model_param(m, k, &p)) ||
            (j->st = pdp_model_find_param(j->ref, p.name, &q)))
            return;
        if (!(h = host_copy(&p.value)) || p.value.count != q.value.count) {
            free(h);
            j->st = PDP_ERR_INVALID;
            snprintf(j->msg, sizeof j->msg, "rank %d: %s: download or count", j->rank, p.name);
            return;
        }
        e = rel_err(h, q.value.data, q.value.count);
        if (e > j->err) j->err = e;
        free(h);
    }
}

static void *pp_main(void *arg)
{
    mp_job *j = (mp_job *)arg;
    pdp_device dev = pdp_cuda(j->rank);
    pdp_comm *c = NULL;
    pdp_model *full = NULL, *m;
    pdp_pp *pp = NULL;
    pdp_pp_desc pd;
    pdp_optim *o = NULL;
    pdp_optim_desc od = mp_adam();
    pdp_tensor *x = NULL;
    float xh[MP_B * MP_IN];
    int32_t y[MP_B];
    int64_t shape[2] = {MP_B, MP_IN};
    int s;
    memset(&pd, 0, sizeof pd);
    pd.schedule = j->schedule;
    pd.micro_batches = 3;
    if ((j->st = pdp_comm_create_nccl(&c, j->g, j->rank)) ||
        (j->st = mp_build(&full, dev, NULL)) || (j->st = pdp_pp_create(&pp, full, c, &pd)))
        goto out;
    pdp_model_free(full);
    full = NULL;
    m = pdp_pp_model(pp);
    if ((j->st = pdp_optim_create(&o, m, &od)) || (j->st = pdp_tensor_create(&x, dev, 2, shape)))
        goto out;
    for (s = 0; s < MP_STEPS; s++) {
        mp_batch(s, xh, y);
        if ((j->st = pdp_tensor_upload(x, xh)) ||
            (j->st = pdp_pp_forward_backward(pp, x, y, &j->losses[s])) ||
            (j->max_norm > 0.0f &&
             (j->st = pdp_pp_clip_grad_norm(pp, j->max_norm, &j->norms[s]))) ||
            (j->st = pdp_pp_step(pp, o)))
            goto out;
    }
    mp_stage_err(j, m);
out:
    if (j->st && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "rank %d: %s", j->rank, pdp_last_error());
    pdp_tensor_free(x);
    pdp_optim_free(o);
    pdp_pp_free(pp);
    pdp_model_free(full);
    pdp_comm_free(c);
    return NULL;
}

/* 2-D on 4 GPUs: TP or PP groups {0, 1} and {2, 3}, DP groups {0, 2} and {1, 3}; DP
   rank d trains on rows [6 d, 6 d + 6) of the first 12 (DDP over the DP group for TP,
   desc.dp for PP). TP: each TP group saves its full tensors to j->path + its DP rank
   (".0", ".1"), read on the CPU by the test; PP: each stage against j->ref. */
static void *mp2d_main(void *arg)
{
    enum { ROWS = 6 };
    mp_job *j = (mp_job *)arg;
    pdp_device dev = pdp_cuda(j->rank);
    pdp_comm *c = NULL, *mp = NULL, *dp = NULL;
    pdp_model *m = NULL;
    pdp_ddp *ddp = NULL;
    pdp_pp *pp = NULL;
    pdp_pp_desc pd;
    pdp_optim *o = NULL;
    pdp_optim_desc od = mp_adam();
    pdp_tensor *x = NULL;
    float xh[MP_B * MP_IN], loss;
    int32_t y[MP_B];
    int64_t shape[2] = {ROWS, MP_IN};
    int s, d = j->rank / 2;
    char path[128];
    memset(&pd, 0, sizeof pd);
    pd.schedule = PDP_PP_GPIPE;
    pd.micro_batches = 3;
    if ((j->st = pdp_comm_create_nccl(&c, j->g, j->rank)) ||
        (j->st = pdp_comm_split(c, d, j->rank, &mp)) ||
        (j->st = pdp_comm_split(c, j->rank % 2, j->rank, &dp)) ||
        (j->st = pdp_tensor_create(&x, dev, 2, shape)))
        goto out;
    pd.dp = dp;
    if (j->pipeline) {
        pdp_model *full = NULL;
        if ((j->st = mp_build(&full, dev, NULL))) goto out;
        j->st = pdp_pp_create(&pp, full, mp, &pd);
        pdp_model_free(full);
        if (j->st || (j->st = pdp_optim_create(&o, pdp_pp_model(pp), &od))) goto out;
    } else if ((j->st = mp_build(&m, dev, mp)) || (j->st = pdp_optim_create(&o, m, &od)) ||
               (j->st = pdp_ddp_create(&ddp, m, dp, NULL))) {
        goto out;
    }
    for (s = 0; s < MP_STEPS; s++) {
        mp_batch(s, xh, y);
        if ((j->st = pdp_tensor_upload(x, xh + d * ROWS * MP_IN))) goto out;
        if (j->pipeline ? (j->st = pdp_pp_forward_backward(pp, x, y + d * ROWS, &loss)) ||
                              (j->st = pdp_pp_step(pp, o))
                        : (j->st = pdp_ddp_forward_backward(ddp, x, y + d * ROWS, &loss)) ||
                              (j->st = pdp_ddp_step(ddp, o)))
            goto out;
    }
    if (j->pipeline) {
        mp_stage_err(j, pdp_pp_model(pp));
    } else {
        snprintf(path, sizeof path, "%s.%d", j->path, d);
        j->st = pdp_tp_checkpoint_save(path, m, NULL);
    }
out:
    if (j->st && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "rank %d: %s", j->rank, pdp_last_error());
    pdp_tensor_free(x);
    pdp_optim_free(o);
    pdp_ddp_free(ddp);
    pdp_pp_free(pp);
    pdp_model_free(m);
    pdp_comm_free(dp);
    pdp_comm_free(mp);
    pdp_comm_free(c);
    return NULL;
}

/* Runs fn on n rank threads, one per GPU, of a fresh NCCL group; 0 when the group failed. */
static int mp_run(int n, void *(*fn)(void *), mp_job *jobs)
{
    pdp_device devs[MP_MAXR];
    pdp_nccl_group *g = NULL;
    pthread_t th[MP_MAXR];
    int r;
    for (r = 0; r < MP_MAXR; r++) devs[r] = pdp_cuda(r < n ? r : 0);
    if (pdp_nccl_group_create(&g, n, devs, NULL) != PDP_OK) return 0;
    for (r = 0; r < n; r++) {
        jobs[r].g = g;
        jobs[r].rank = r;
        jobs[r].n = n;
        pthread_create(&th[r], NULL, fn, &jobs[r]);
    }
    for (r = 0; r < n; r++) pthread_join(th[r], NULL);
    pdp_nccl_group_free(g);
    return 1;
}

/* The number of model-parallel ranks for this run: the GPUs, at most MP_MAXR. */
static int mp_ranks(void) { return devices() < MP_MAXR ? devices() : MP_MAXR; }

TEST cuda_nccl_tp_matches_cpu(void)
{
    mp_job jobs[MP_MAXR];
    pdp_model *ref = NULL, *back = NULL;
    float ref_losses[MP_STEPS];
    char path[96], msg[160];
    int n = mp_ranks(), r, s;
    pdp_tensor p, g, rp, rg;
    double e;
    NEED_GPU();
    if (n < 2) SKIPm("TP over NCCL needs 2 GPUs (PDP_EMU_CUDA_DEVICES=2 or more)");
    snprintf(path, sizeof path, "/tmp/pdp_test_cuda_tp_%d.safetensors", (int)getpid());
    ASSERTm(pdp_last_error(), mp_reference(&ref, MP_B, ref_losses) == PDP_OK);
    memset(jobs, 0, sizeof jobs);
    for (r = 0; r < n; r++) jobs[r].path = path;
    ASSERTm(pdp_last_error(), mp_run(n, tp_main, jobs));
    for (r = 0; r < n; r++) ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
    for (s = 0; s < MP_STEPS; s++)
        for (r = 0; r < n; r++) {
            e = fabs((double)jobs[r].losses[s] - ref_losses[s]) / fabs((double)ref_losses[s]);
            snprintf(msg, sizeof msg, "TP rank %d of %d, step %d: loss %.9g, CPU %.9g", r, n, s,
                     (double)jobs[r].losses[s], (double)ref_losses[s]);
            ASSERTm(msg, e <= TOL);
        }
    /* the full tensors the TP ranks saved, on one CPU model, against the reference */
    ASSERTm(pdp_last_error(), mp_build(&back, pdp_cpu(), NULL) == PDP_OK);
    ASSERTm(pdp_last_error(), pdp_checkpoint_load(path, back, NULL) == PDP_OK);
    remove(path);
    pdp_model_flat(back, &p, &g);
    pdp_model_flat(ref, &rp, &rg);
    ASSERT_EQ(rp.count, p.count);
    e = rel_err(p.data, rp.data, rp.count);
    snprintf(msg, sizeof msg, "TP over %d GPUs: parameters' relative error %g", n, e);
    ASSERTm(msg, e <= TOL);
    pdp_model_free(back);
    pdp_model_free(ref);
    PASS();
}

static enum greatest_test_res check_pp(pdp_pp_schedule schedule, const char *name)
{
    mp_job jobs[MP_MAXR];
    pdp_model *ref = NULL;
    float ref_losses[MP_STEPS];
    char msg[160];
    int n = mp_ranks(), r, s;
    double e;
    NEED_GPU();
    if (n < 2) SKIPm("PP over NCCL needs 2 GPUs (PDP_EMU_CUDA_DEVICES=2 or more)");
    ASSERTm(pdp_last_error(), mp_reference(&ref, MP_B, ref_losses) == PDP_OK);
    memset(jobs, 0, sizeof jobs);
    for (r = 0; r < n; r++) {
        jobs[r].schedule = schedule;
        jobs[r].ref = ref;
    }
    ASSERTm(pdp_last_error(), mp_run(n, pp_main, jobs));
    for (r = 0; r < n; r++) ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
    for (s = 0; s < MP_STEPS; s++) {
        e = fabs((double)jobs[n - 1].losses[s] - ref_losses[s]) / fabs((double)ref_losses[s]);
        snprintf(msg, sizeof msg, "PP %s, %d stages, step %d: loss %.9g, CPU %.9g", name, n, s,
                 (double)jobs[n - 1].losses[s], (double)ref_losses[s]);
        ASSERTm(msg, e <= TOL);
    }
    for (r = 0; r < n; r++) {
        snprintf(msg, sizeof msg, "PP %s, stage %d of %d: parameters' relative error %g", name,
                 r, n, jobs[r].err);
        ASSERTm(msg, jobs[r].err <= TOL);
    }
    pdp_model_free(ref);
    PASS();
}

TEST cuda_nccl_2d_dp_x_tp_and_dp_x_pp_match_cpu(void)
{
    mp_job jobs[MP_MAXR];
    pdp_model *ref = NULL, *back = NULL;
    float ref_losses[MP_STEPS];
    pdp_tensor p, g, rp, rg;
    char path[96], file[128], msg[160];
    int r, d;
    double e;
    NEED_GPU();
    if (devices() < 4) SKIPm("2-D over NCCL needs 4 GPUs (PDP_EMU_CUDA_DEVICES=4)");
    snprintf(path, sizeof path, "/tmp/pdp_test_cuda_2d_%d.safetensors", (int)getpid());
    ASSERTm(pdp_last_error(), mp_reference(&ref, 12, ref_losses) == PDP_OK);
    /* DP x TP: both TP groups' full tensors equal the reference */
    memset(jobs, 0, sizeof jobs);
    for (r = 0; r < 4; r++) jobs[r].path = path;
    ASSERTm(pdp_last_error(), mp_run(4, mp2d_main, jobs));
    for (r = 0; r < 4; r++) ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
    pdp_model_flat(ref, &rp, &rg);
    for (d = 0; d < 2; d++) {
        snprintf(file, sizeof file, "%s.%d", path, d);
        ASSERTm(pdp_last_error(), mp_build(&back, pdp_cpu(), NULL) == PDP_OK);
        ASSERTm(pdp_last_error(), pdp_checkpoint_load(file, back, NULL) == PDP_OK);
        remove(file);
        pdp_model_flat(back, &p, &g);
        e = rel_err(p.data, rp.data, rp.count);
        pdp_model_free(back);
        snprintf(msg, sizeof msg, "2 DP x 2 TP, DP group %d: parameters' relative error %g", d, e);
        ASSERTm(msg, e <= TOL);
    }
    /* DP x PP (GPipe): every stage of both pipelines equals the reference */
    memset(jobs, 0, sizeof jobs);
    for (r = 0; r < 4; r++) {
        jobs[r].pipeline = true;
        jobs[r].ref = ref;
    }
    ASSERTm(pdp_last_error(), mp_run(4, mp2d_main, jobs));
    for (r = 0; r < 4; r++) {
        ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
        snprintf(msg, sizeof msg, "2 DP x 2 PP, rank %d: parameters' relative error %g", r,
                 jobs[r].err);
        ASSERTm(msg, jobs[r].err <= TOL);
    }
    pdp_model_free(ref);
    PASS();
}

TEST cuda_nccl_pp_gpipe_matches_cpu(void) { return check_pp(PDP_PP_GPIPE, "GPipe"); }
TEST cuda_nccl_pp_1f1b_matches_cpu(void) { return check_pp(PDP_PP_1F1B, "1F1B"); }

/* pdp_pp_clip_grad_norm over NCCL (the stages' squared norms gathered in device memory)
   against pdp_clip_grad_norm on the CPU model: clipping at every step, the norm on every
   stage and the parameters after MP_STEPS steps. */
TEST cuda_nccl_pp_clip_grad_norm_matches_cpu(void)
{
    mp_job jobs[MP_MAXR];
    pdp_model *ref = NULL;
    float ref_losses[MP_STEPS], norms[MP_STEPS], max_norm;
    char msg[160];
    int n = mp_ranks(), r, s;
    NEED_GPU();
    if (n < 2) SKIPm("PP over NCCL needs 2 GPUs (PDP_EMU_CUDA_DEVICES=2 or more)");
    ASSERTm(pdp_last_error(),
            mp_reference_clip(&ref, MP_B, ref_losses, FLT_MAX, norms) == PDP_OK);
    pdp_model_free(ref);
    max_norm = norms[0];
    for (s = 1; s < MP_STEPS; s++) max_norm = norms[s] < max_norm ? norms[s] : max_norm;
    max_norm *= 0.5f; /* below every step's norm: clipping at every step */
    ASSERTm(pdp_last_error(),
            mp_reference_clip(&ref, MP_B, ref_losses, max_norm, norms) == PDP_OK);
    for (s = 0; s < MP_STEPS; s++) ASSERT(norms[s] > max_norm);
    memset(jobs, 0, sizeof jobs);
    for (r = 0; r < n; r++) {
        jobs[r].schedule = PDP_PP_1F1B;
        jobs[r].ref = ref;
        jobs[r].max_norm = max_norm;
    }
    ASSERTm(pdp_last_error(), mp_run(n, pp_main, jobs));
    for (r = 0; r < n; r++) {
        ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
        for (s = 0; s < MP_STEPS; s++) {
            snprintf(msg, sizeof msg, "PP clip, stage %d of %d, step %d: norm %.9g, CPU %.9g", r,
                     n, s, (double)jobs[r].norms[s], (double)norms[s]);
            ASSERTm(msg, fabs((double)jobs[r].norms[s] - norms[s]) <= TOL * norms[s]);
        }
        snprintf(msg, sizeof msg, "PP clip, stage %d of %d: parameters' relative error %g", r, n,
                 jobs[r].err);
        ASSERTm(msg, jobs[r].err <= TOL);
    }
    pdp_model_free(ref);
    PASS();
}

/* The batcher on a GPU hands out the CPU batcher's batches (same order, same bits) and
   the same labels, epoch after epoch. */
TEST cuda_batcher_on_device_matches_cpu(void)
{
    pdp_dataset *ds = NULL;
    pdp_dataset_desc dd;
    pdp_batcher_desc bd;
    pdp_batcher *bc = NULL, *bg = NULL;
    static float back[16 * 784];
    int e;
    NEED_GPU();
    memset(&dd, 0, sizeof dd);
    dd.max_samples = 40;
    ASSERT_ENUM_EQ(PDP_OK, pdp_dataset_synthetic(&ds, true, &dd), pdp_status_name);
    memset(&bd, 0, sizeof bd);
    bd.batch_size = 16; /* 16, 16, 8 */
    bd.shuffle = true;
    bd.seed = 3;
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&bc, ds, &bd), pdp_status_name);
    bd.device = pdp_cuda(0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_create(&bg, ds, &bd), pdp_status_name);
    for (e = 0; e < 2; e++) {
        pdp_tensor xc, xg;
        const int32_t *yc, *yg;
        int64_t nc, ng, i, batches = 0;
        pdp_batcher_reset(bc, (uint64_t)e);
        pdp_batcher_reset(bg, (uint64_t)e);
        while (pdp_batcher_next(bc, &xc, &yc, &nc)) {
            ASSERT(pdp_batcher_next(bg, &xg, &yg, &ng));
            ASSERT_EQ(nc, ng);
            ASSERT_EQ(PDP_DEVICE_CUDA, xg.device.kind);
            ASSERT_EQ(xc.ndim, xg.ndim);
            ASSERT_EQ(xc.count, xg.count);
            ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(&xg, back), pdp_status_name);
            for (i = 0; i < xc.count; i++) ASSERT_EQ(xc.data[i], back[i]);
            for (i = 0; i < nc; i++) ASSERT_EQ(yc[i], yg[i]);
            batches++;
        }
        ASSERT(!pdp_batcher_next(bg, &xg, &yg, &ng));
        ASSERT_ENUM_EQ(PDP_OK, pdp_batcher_status(bg), pdp_status_name);
        ASSERT_EQ(3, batches);
    }
    pdp_batcher_free(bc);
    pdp_batcher_free(bg);
    pdp_dataset_free(ds);
    PASS();
}

/* pdp_launch over NCCL: one thread per GPU, each rank on its own GPU, an all-reduce of
   rank + 1 against the naive sum. */
static pdp_status launch_nccl_fn(const pdp_launch_ctx *ctx, void *user)
{
    float *sums = (float *)user, v = (float)(ctx->rank + 1);
    pdp_tensor *t = NULL;
    int64_t one = 1;
    pdp_status st;
    if (ctx->device.kind != PDP_DEVICE_CUDA || ctx->device.ordinal != ctx->rank)
        return PDP_ERR_DEVICE;
    PDP_TRY(pdp_tensor_create(&t, ctx->device, 1, &one));
    st = pdp_tensor_upload(t, &v);
    if (st == PDP_OK) st = pdp_comm_allreduce(ctx->world, t->data, 1, PDP_REDUCE_SUM, NULL);
    if (st == PDP_OK) st = pdp_tensor_download(t, &sums[ctx->rank]);
    pdp_tensor_free(t);
    return st;
}

TEST cuda_launch_nccl_thread_ranks(void)
{
    pdp_launch_desc d;
    float sums[2] = {0, 0};
    NEED_GPU();
    if (devices() < 2) SKIPm("pdp_launch over NCCL needs 2 GPUs (PDP_EMU_CUDA_DEVICES=2)");
    if (getenv("WORLD_SIZE")) SKIPm("WORLD_SIZE is set: pdp_launch would run process ranks");
    memset(&d, 0, sizeof d);
    d.backend = PDP_BACKEND_NCCL;
    d.timeout_s = 60;
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, &d, launch_nccl_fn, sums), pdp_status_name);
    ASSERT_EQ(3.0f, sums[0]);
    ASSERT_EQ(3.0f, sums[1]);
    PASS();
}

/* ---- with PDP_CUDA: the GPT under ZeRO and in a pipeline over NCCL ----
   The GPT (vocab 11, T 8, dim 16, 2 heads, 2 layers, dropout 0.1 after the embedding, on
   the attention probabilities and in the branches; the head tied to wte) trained for
   NG_STEPS AdamW steps with clipping at NG_CLIP (below every step's norm: it clips) on
   NG_SEQ sequences, each with one target -1, against the same steps on one CPU model:
   the loss, the norm and the parameters within TOL relative (check_gpt's). One -1 a
   sequence gives every ZeRO rank the same count of targets, so the mean of the ranks'
   means (what the reduce-scatter averages) is the batch's mean (a pipeline scales by the
   pass's count itself); the dropout masks are keyed by the global sequence (the executors
   set sample_base), so a rank or a micro-batch draws the single device's masks. */
enum { NG_V = 11, NG_T = 8, NG_SEQ = 4, NG_STEPS = 2, NG_RANKS = 2, NG_MICRO = 4 };
#define NG_CLIP 0.5f

static pdp_gpt_desc ng_desc(pdp_device dev)
{
    pdp_gpt_desc d;
    memset(&d, 0, sizeof d);
    d.vocab = NG_V, d.context = NG_T, d.layers = 2, d.heads = 2, d.dim = 16, d.seed = 5;
    d.dropout = 0.1f;
    d.device = dev;
    return d;
}

static pdp_optim_desc ng_adamw(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW, od.lr = 0.01f, od.weight_decay = 0.1f;
    return od;
}

/* Step s's token ids and targets [NG_SEQ, NG_T], one target -1 in every sequence. */
static void ng_batch(int s, int32_t *ids, int32_t *tg)
{
    int i, t;
    for (i = 0; i < NG_SEQ; i++)
        for (t = 0; t < NG_T; t++) {
            uint32_t h = (uint32_t)((s * 97 + i * NG_T + t) * 2654435761u);
            h ^= h >> 13;
            ids[i * NG_T + t] = (int32_t)(h % NG_V);
            tg[i * NG_T + t] = t == (i + s) % NG_T ? -1 : (int32_t)((h >> 8) % NG_V);
        }
}

/* The reference: one CPU GPT on the whole batches; each step's loss and norm. */
static pdp_status ng_single(pdp_model **out, float *losses, float *norms)
{
    pdp_gpt_desc gd = ng_desc(pdp_cpu());
    pdp_optim_desc od = ng_adamw();
    pdp_optim *o = NULL;
    int32_t ids[NG_SEQ * NG_T], tg[NG_SEQ * NG_T];
    int64_t shape[2] = {NG_SEQ, NG_T};
    pdp_tensor x;
    pdp_status st;
    int s;
    *out = NULL;
    if ((st = pdp_gpt_create(out, &gd)) || (st = pdp_optim_create(&o, *out, &od))) goto out;
    pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < NG_STEPS; s++) {
        ng_batch(s, ids, tg);
        pdp_optim_zero_grad(o);
        if ((st = pdp_model_forward_backward(*out, &x, tg, &losses[s])) ||
            (st = pdp_clip_grad_norm(*out, NG_CLIP, &norms[s])) || (st = pdp_optim_step(o)))
            goto out;
    }
out:
    pdp_optim_free(o);
    if (st) {
        pdp_model_free(*out);
        *out = NULL;
    }
    return st;
}

/* A device buffer for rows sequences of token ids on dev, seen as ids [rows, NG_T] in *x. */
static pdp_status ng_ids(pdp_device dev, int64_t rows, pdp_tensor **buf, pdp_tensor *x)
{
    int64_t shape[2] = {rows, NG_T}, flat[1] = {rows * NG_T};
    pdp_status st;
    if ((st = pdp_tensor_create_ids(buf, dev, 1, flat)) != PDP_OK) return st;
    return pdp_tensor_reshape_view(*buf, 2, shape, x);
}

/* ZeRO: NG_RANKS thread ranks, one a GPU, rank r on sequences [r rows, (r + 1) rows) with
   a unit per layer (the tied unit leaves its gather slot between the head's use and the
   embedding's). A spy on the model's events and the reducer's collective counts the tied
   unit's reduce-scatters in each step and those launched before layer 0's (the
   embedding's) backward began: its two gradients (the head's, the embedding's) must be
   summed on the device first and reduced once, as test_zero.c checks on the CPU. */
typedef struct ng_job {
    pdp_nccl_group *g;
    int rank, stage;
    float losses[NG_STEPS], norms[NG_STEPS];
    int launches[NG_STEPS], early;
    float *params; /* gathered after the last step (malloc'd) */
    int64_t count;
    pdp_status st;
    char msg[1100];
} ng_job;

static __thread pdp__model_event_fn ng_event_next;
static __thread pdp__reduce_fn ng_reduce_next;
static __thread int ng_layer, ng_tied_unit, ng_launches, ng_early;

static pdp_status ng_spy_event(void *user, pdp_model *m, pdp__model_event ev, int layer,
                               pdp_status st)
{
    if (ev == PDP__EV_BACKWARD_BEGIN) ng_layer = m->nlayers;
    if (ev == PDP__EV_BACKWARD_LAYER) ng_layer = layer;
    return ng_event_next(user, m, ev, layer, st);
}

static pdp_status ng_spy_reduce(pdp__reducer *r, int b, pdp_work **w)
{
    if (b == ng_tied_unit) {
        ng_launches++;
        ng_early += ng_layer != 0;
    }
    return ng_reduce_next(r, b, w);
}

static void *ng_zero_main(void *arg)
{
    enum { ROWS = NG_SEQ / NG_RANKS };
    ng_job *j = (ng_job *)arg;
    pdp_device dev = pdp_cuda(j->rank);
    pdp_gpt_desc gd = ng_desc(dev);
    pdp_optim_desc od = ng_adamw();
    pdp_zero_desc zd;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_zero *z = NULL;
    pdp_optim *o = NULL;
    pdp_tensor *buf = NULL, x;
    int32_t ids[NG_SEQ * NG_T], tg[NG_SEQ * NG_T];
    int64_t first = (int64_t)j->rank * ROWS * NG_T;
    int s;
    memset(&zd, 0, sizeof zd);
    zd.stage = j->stage;
    zd.bucket_cap_mb = zd.first_bucket_mb = 1e-9; /* a unit per layer */
    if ((j->st = pdp_comm_create_nccl(&c, j->g, j->rank)) || (j->st = pdp_gpt_create(&m, &gd)) ||
        (j->st = pdp_zero_create(&z, m, c, &zd)) || (j->st = pdp_zero_optim_create(&o, z, &od)) ||
        (j->st = ng_ids(dev, ROWS, &buf, &x)))
        goto out;
    ng_tied_unit = z->unit_of_layer[m->nlayers - 1]; /* the head's */
    ng_event_next = m->event;
    m->event = ng_spy_event;
    ng_reduce_next = z->r.desc.reduce;
    z->r.desc.reduce = ng_spy_reduce;
    ng_early = 0;
    for (s = 0; s < NG_STEPS; s++) {
        ng_batch(s, ids, tg);
        ng_launches = 0;
        if ((j->st = pdp_tensor_upload(buf, (const float *)(const void *)(ids + first))) ||
            (j->st = pdp_zero_forward_backward(z, &x, tg + first, &j->losses[s])) ||
            (j->st = pdp_zero_finish(z)) ||
            (j->st = pdp_zero_clip_grad_norm(z, NG_CLIP, &j->norms[s])) ||
            (j->st = pdp_zero_step(z, o)))
            goto out;
        j->launches[s] = ng_launches;
    }
    j->early = ng_early;
    j->count = m->param_count;
    if (!(j->params = (float *)malloc((size_t)j->count * sizeof(float))))
        j->st = PDP_ERR_OUT_OF_MEMORY;
    else
        j->st = pdp_zero_gather_params(z, j->params);
out:
    if (j->st && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "rank %d: %s", j->rank, pdp_last_error());
    pdp_tensor_free(buf);
    pdp_zero_free(z);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

TEST cuda_nccl_gpt_zero_matches_cpu(void)
{
    static ng_job jobs[NG_RANKS];
    static char msg[300];
    pdp_model *ref = NULL;
    pdp_device devs[NG_RANKS];
    pdp_nccl_group *g = NULL;
    pthread_t th[NG_RANKS];
    pdp_tensor rp, rg;
    float losses[NG_STEPS], norms[NG_STEPS], loss;
    int stage, r, s;
    double e;
    NEED_GPU();
    if (devices() < NG_RANKS) SKIPm("ZeRO over NCCL needs 2 CUDA devices");
    ASSERTm(pdp_last_error(), ng_single(&ref, losses, norms) == PDP_OK);
    for (s = 0; s < NG_STEPS; s++) ASSERTm("the reference does not clip", norms[s] > NG_CLIP);
    pdp_model_flat(ref, &rp, &rg);
    for (r = 0; r < NG_RANKS; r++) devs[r] = pdp_cuda(r);
    for (stage = 1; stage <= 3; stage++) {
        ASSERTm(pdp_last_error(), pdp_nccl_group_create(&g, NG_RANKS, devs, NULL) == PDP_OK);
        for (r = 0; r < NG_RANKS; r++) {
            memset(&jobs[r], 0, sizeof jobs[r]);
            jobs[r].g = g;
            jobs[r].rank = r;
            jobs[r].stage = stage;
            pthread_create(&th[r], NULL, ng_zero_main, &jobs[r]);
        }
        for (r = 0; r < NG_RANKS; r++) pthread_join(th[r], NULL);
        pdp_nccl_group_free(g);
        for (r = 0; r < NG_RANKS; r++) ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
        for (s = 0; s < NG_STEPS; s++) {
            for (loss = 0.0f, r = 0; r < NG_RANKS; r++) loss += jobs[r].losses[s] / NG_RANKS;
            snprintf(msg, sizeof msg, "GPT ZeRO-%d step %d: mean of the ranks' losses %.9g, "
                     "CPU %.9g; norm %.9g, CPU %.9g", stage, s, (double)loss, (double)losses[s],
                     (double)jobs[0].norms[s], (double)norms[s]);
            ASSERTm(msg, fabs((double)loss - losses[s]) <= TOL * fabs((double)losses[s]));
            for (r = 0; r < NG_RANKS; r++)
                ASSERTm(msg, fabs((double)jobs[r].norms[s] - norms[s]) <= TOL * norms[s]);
        }
        ASSERT_EQ(rp.count, jobs[0].count);
        e = rel_err(jobs[0].params, rp.data, rp.count);
        snprintf(msg, sizeof msg, "GPT ZeRO-%d over NCCL: parameters' relative error %g", stage,
                 e);
        ASSERTm(msg, e <= TOL);
        for (r = 0; r < NG_RANKS; r++) {
            if (r > 0)
                ASSERT_MEM_EQm("ranks differ after the gather", jobs[0].params, jobs[r].params,
                               (size_t)rp.count * 4);
            for (s = 0; s < NG_STEPS; s++) {
                snprintf(msg, sizeof msg, "GPT ZeRO-%d rank %d step %d: the tied unit reduced "
                         "%d times", stage, r, s, jobs[r].launches[s]);
                ASSERT_EQm(msg, 1, jobs[r].launches[s]);
            }
            ASSERT_EQm("the tied unit reduced before the embedding's backward", 0, jobs[r].early);
        }
        for (r = 0; r < NG_RANKS; r++) free(jobs[r].params);
    }
    pdp_model_free(ref);
    PASS();
}

/* A pipeline of GPT blocks over NCCL: 2 stages (the embedding and the first block on stage
   0, the second block, ln_f and the head with its copy of wte on stage 1, cut by
   parameters), GPipe and 1F1B, NG_MICRO micro-batches of one sequence, clipped by
   pdp_pp_clip_grad_norm (the copy counted once); the tied weight's two gradients are
   exchanged between the stages (pdp__pp_sum_tied, one NCCL group of a send and a receive).
   Every stage's tensors (the copy included) against the reference's of the same name, by
   check_gpt's measure: the largest difference over the largest reference parameter (per
   tensor, mp_stage_err's, is too fine for the GPU against the CPU: AdamW turns the key
   bias's gradient, zero up to rounding (softmax ignores it), into steps of the learning
   rate's order whose size follows that rounding; the single-device GPU GPT is 1.5e-4 off
   there by that measure, 3e-6 by check_gpt's); the last stage's loss and every stage's
   norm against the CPU's. */

/* j->err <- max |stage m's tensors - j->ref's of the same names| / max |j->ref's
   parameters|; a failure goes to j->st and j->msg. */
static void ng_stage_err(mp_job *j, const pdp_model *m)
{
    pdp_param p, q;
    pdp_tensor rp, rg;
    double diff = 0.0, scale = 1e-30;
    float *h;
    int64_t i;
    int k;
    pdp_model_flat(j->ref, &rp, &rg);
    for (i = 0; i < rp.count; i++)
        if (fabs((double)rp.data[i]) > scale) scale = fabs((double)rp.data[i]);
    for (k = 0; k < pdp_model_num_params(m); k++) {
        if ((j->st = pdp_model_param(m, k, &p)) ||
            (j->st = pdp_model_find_param(j->ref, p.name, &q)))
            return;
        if (!(h = host_copy(&p.value)) || p.value.count != q.value.count) {
            free(h);
            j->st = PDP_ERR_INVALID;
            snprintf(j->msg, sizeof j->msg, "rank %d: %s: download or count", j->rank, p.name);
            return;
        }
        for (i = 0; i < q.value.count; i++) {
            double d = fabs((double)h[i] - (double)q.value.data[i]);
            if (!(d <= diff)) diff = d; /* NaN sticks */
        }
        free(h);
    }
    j->err = diff / scale;
}

static void *ng_pp_main(void *arg)
{
    mp_job *j = (mp_job *)arg;
    pdp_device dev = pdp_cuda(j->rank);
    pdp_gpt_desc gd = ng_desc(dev);
    pdp_optim_desc od = ng_adamw();
    pdp_pp_desc pd;
    pdp_comm *c = NULL;
    pdp_model *full = NULL;
    pdp_pp *pp = NULL;
    pdp_optim *o = NULL;
    pdp_tensor *buf = NULL, x;
    int32_t ids[NG_SEQ * NG_T], tg[NG_SEQ * NG_T];
    int s;
    memset(&pd, 0, sizeof pd);
    pd.schedule = j->schedule;
    pd.micro_batches = NG_MICRO;
    if ((j->st = pdp_comm_create_nccl(&c, j->g, j->rank)) ||
        (j->st = pdp_gpt_create(&full, &gd)) || (j->st = pdp_pp_create(&pp, full, c, &pd)))
        goto out;
    pdp_model_free(full);
    full = NULL;
    if ((j->st = pdp_optim_create(&o, pdp_pp_model(pp), &od)) ||
        (j->st = ng_ids(dev, NG_SEQ, &buf, &x)))
        goto out;
    for (s = 0; s < NG_STEPS; s++) {
        ng_batch(s, ids, tg);
        if ((j->st = pdp_tensor_upload(buf, (const float *)(const void *)ids)) ||
            (j->st = pdp_pp_forward_backward(pp, &x, tg, &j->losses[s])) ||
            (j->st = pdp_pp_clip_grad_norm(pp, NG_CLIP, &j->norms[s])) ||
            (j->st = pdp_pp_step(pp, o)))
            goto out;
    }
    ng_stage_err(j, pdp_pp_model(pp));
out:
    if (j->st && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "rank %d: %s", j->rank, pdp_last_error());
    pdp_tensor_free(buf);
    pdp_optim_free(o);
    pdp_pp_free(pp);
    pdp_model_free(full);
    pdp_comm_free(c);
    return NULL;
}

/* The GPT pipeline over NCCL on each of n schedules against the CPU reference. */
static enum greatest_test_res ng_check_pipelines(const pdp_pp_schedule *schedules,
                                                 const char **names, int n)
{
    mp_job jobs[2];
    pdp_model *ref = NULL;
    float losses[NG_STEPS], norms[NG_STEPS];
    char msg[200];
    int k, r, s;
    NEED_GPU();
    if (devices() < 2) SKIPm("PP over NCCL needs 2 GPUs (PDP_EMU_CUDA_DEVICES=2 or more)");
    ASSERTm(pdp_last_error(), ng_single(&ref, losses, norms) == PDP_OK);
    for (k = 0; k < n; k++) {
        memset(jobs, 0, sizeof jobs);
        for (r = 0; r < 2; r++) {
            jobs[r].schedule = schedules[k];
            jobs[r].ref = ref;
        }
        ASSERTm(pdp_last_error(), mp_run(2, ng_pp_main, jobs));
        for (r = 0; r < 2; r++) ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
        for (s = 0; s < NG_STEPS; s++) {
            snprintf(msg, sizeof msg, "GPT PP %s step %d: loss %.9g, CPU %.9g; norms %.9g %.9g, "
                     "CPU %.9g", names[k], s, (double)jobs[1].losses[s], (double)losses[s],
                     (double)jobs[0].norms[s], (double)jobs[1].norms[s], (double)norms[s]);
            ASSERTm(msg, fabs((double)jobs[1].losses[s] - losses[s]) <=
                             TOL * fabs((double)losses[s]));
            for (r = 0; r < 2; r++)
                ASSERTm(msg, fabs((double)jobs[r].norms[s] - norms[s]) <= TOL * norms[s]);
        }
        for (r = 0; r < 2; r++) {
            snprintf(msg, sizeof msg, "GPT PP %s, stage %d of 2: parameters' relative error %g",
                     names[k], r, jobs[r].err);
            ASSERTm(msg, jobs[r].err <= TOL);
        }
    }
    pdp_model_free(ref);
    PASS();
}

TEST cuda_nccl_gpt_pipeline_matches_cpu(void)
{
    static const pdp_pp_schedule schedules[2] = {PDP_PP_GPIPE, PDP_PP_1F1B};
    static const char *names[2] = {"GPipe", "1F1B"};
    return ng_check_pipelines(schedules, names, 2);
}

/* Interleaved 1F1B over NCCL: v = 2 chunks a stage, the GPT in 4 pieces (the embedding; a
   block; a block; ln_f and the head, on stage 1's second chunk), m = NG_MICRO = 2p, where
   batching a message an action deadlocked on NCCL's one stream (pp.c's opening comment);
   the runner's Megatron batches complete and train as the CPU does. */
TEST cuda_nccl_gpt_interleaved_pipeline_matches_cpu(void)
{
    static const pdp_pp_schedule schedules[1] = {PDP_PP_INTERLEAVED_1F1B};
    static const char *names[1] = {"interleaved 1F1B (v = 2)"};
    return ng_check_pipelines(schedules, names, 1);
}

/* The GPT split by heads (pdp_gpt_create with desc.tp: c_attn column-parallel in q | k | v
   parts, each rank's heads' attention, attn.c_proj row-parallel; the MLP as TP's) over NCCL
   thread ranks, against the single-device GPT on the CPU, which recomputes nothing; the
   GPU side of issue 25's covering set (test_tp.c and test_gpt_sp.c the local backend's,
   test_mpi.c MPI's):
   - TP 2 on 2 GPUs, without and with sequence parallelism, and recomputing (selective;
     full with SP: the recomputed forward on the GPUs; B 2: the rank blocks reordered
     through the workspace; dropout on a slice of the sequence keyed by the global
     position);
   - TP 3 on 3 GPUs, the same four runs;
   - DP 2 x TP 2 + SP on 4 GPUs (TP groups {0, 1} and {2, 3}, DP groups {0, 2} and {1, 3},
     both split from one NCCL communicator by pdp_comm_split, as test_mpi.c's), under DDP
     and under ZeRO-1 over the DP group, each DP copy on its one of the 2 sequences (each
     holds one ignored target, so the mean of the copies' losses is the batch's).
   3 AdamW steps (lr 1e-3, as test_gpt_sp.c's: AdamW divides by |g| + eps, so a gradient
   that cancels to 1e-7 of the largest, as one of h.1.mlp.c_proj.weight's in TP 2's GPT,
   turns the float rounding of the other sums into a step of up to lr) with dropout 0.1 and
   clipping below every step's norm (after the DP average); the loss (the DP copies' mean)
   and the norm each step on every rank, no device allocation after the first step; at the
   end each rank's slices against their cuts of the CPU GPT's tensors (pdp__tp_runs, by
   name), and each TP group's full tensors through pdp_tp_checkpoint_save (gathered on the
   GPUs; not under ZeRO, which it refuses over TP) loaded on the CPU. Vocab 11, B 2, 2
   layers; TP 2: T 8, dim 16, 2 heads; TP 3 and DP x TP: T 6, dim 12, 6 heads (both split
   by 2 and by 3): small for the emulator. */
enum { TG_V = 11, TG_B = 2, TG_TMAX = 8, TG_STEPS = 3, TG_MAXR = 4 };
#define TG_CLIP 0.25f

/* One run: tp x dp GPUs, rank r TP rank r % tp of DP copy r / tp; dp 2: DDP (zero 0) or
   ZeRO stage `zero` over the DP groups. The GPT's sequence T, heads and dim. */
typedef struct tg_run {
    int tp, dp, zero;
    bool sp;
    pdp_recompute rc;
    int T, heads, dim;
} tg_run;

typedef struct tg_job {
    pdp_nccl_group *g;
    const tg_run *run;
    const pdp_model *ref; /* the CPU GPT after the steps, read only */
    int rank;
    const char *path; /* the TP group's checkpoint: path.<DP copy> */
    float losses[TG_STEPS], norms[TG_STEPS];
    double err; /* the largest difference of the rank's slices, over the largest |ref| */
    pdp_status st;
    char msg[1100];
} tg_job;

/* run's GPT on dev, split over tp; with tp NULL the reference, which recomputes nothing */
static pdp_gpt_desc tg_desc(pdp_device dev, pdp_comm *tp, const tg_run *run)
{
    pdp_gpt_desc gd;
    memset(&gd, 0, sizeof gd);
    gd.vocab = TG_V;
    gd.context = run->T;
    gd.layers = 2;
    gd.heads = run->heads;
    gd.dim = run->dim;
    gd.dropout = 0.1f;
    gd.seed = 7;
    gd.device = dev;
    gd.tp = tp;
    gd.sequence_parallel = tp && run->sp;
    gd.recompute = tp ? run->rc : PDP_RECOMPUTE_NONE;
    return gd;
}

static pdp_optim_desc tg_adamw(void)
{
    pdp_optim_desc od;
    memset(&od, 0, sizeof od);
    od.kind = PDP_OPTIM_ADAMW;
    od.lr = 1e-3f;
    od.weight_decay = 0.1f;
    return od;
}

/* Step s's tokens and targets for sequences of T (every fifth target -1: ignored). */
static void tg_batch(int s, int T, int32_t *ids, int32_t *tg)
{
    pdp_rng r;
    int i;
    pdp_rng_seed(&r, 23, (uint64_t)s);
    for (i = 0; i < TG_B * T; i++) {
        ids[i] = (int32_t)pdp_rng_below(&r, TG_V);
        tg[i] = i % 5 == 3 ? -1 : (int32_t)pdp_rng_below(&r, TG_V);
    }
}

/* What trains: m with o alone, or under ddp, or under z (o then z's); on sequences
   [first, first + buf's rows) of each batch. */
typedef struct tg_trainer {
    pdp_model *m;
    pdp_optim *o;
    pdp_ddp *ddp;
    pdp_zero *z;
    int first;
} tg_trainer;

/* TG_STEPS steps with clipping (its ids in buf, on m's device); losses and norms. On a
   GPU, *mallocs: the device memory allocations of the steps after the first. */
static pdp_status tg_train(const tg_trainer *t, int T, pdp_tensor *buf, float *losses,
                           float *norms, int64_t *mallocs)
{
    int32_t ids[TG_B * TG_TMAX], tg[TG_B * TG_TMAX], *mine = ids + t->first * T;
    const int32_t *want = tg + t->first * T;
    int64_t shape[2];
    pdp_cuda_memory_stats ms;
    pdp_tensor x;
    pdp_status st;
    int s;
    shape[0] = buf->count / T;
    shape[1] = T;
    for (s = 0; s < TG_STEPS; s++) {
        if (mallocs && s > 0 && (st = pdp_cuda_memory_stats_get(buf->device, &ms))) return st;
        if (mallocs && s == 1) *mallocs = -ms.device_mallocs;
        tg_batch(s, T, ids, tg);
        if (buf->device.kind == PDP_DEVICE_CPU)
            memcpy(buf->data, mine, (size_t)buf->count * sizeof *mine);
        else if ((st = pdp_tensor_upload(buf, (const float *)(const void *)mine)))
            return st;
        if ((st = pdp_tensor_wrap_ids((int32_t *)(void *)buf->data, buf->device, 2, shape, &x)))
            return st;
        if (t->z)
            st = pdp_zero_forward_backward(t->z, &x, want, &losses[s]);
        else if (t->ddp)
            st = pdp_ddp_forward_backward(t->ddp, &x, want, &losses[s]);
        else
            st = pdp_model_forward_backward(t->m, &x, want, &losses[s]);
        if (st || (t->ddp && (st = pdp_ddp_finish(t->ddp))) ||
            (t->z && (st = pdp_zero_finish(t->z))))
            return st;
        if (t->z) {
            if ((st = pdp_zero_clip_grad_norm(t->z, TG_CLIP, &norms[s])) ||
                (st = pdp_zero_step(t->z, t->o)))
                return st;
        } else {
            if ((st = pdp_clip_grad_norm(t->m, TG_CLIP, &norms[s])) ||
                (st = pdp_optim_step(t->o)))
                return st;
            pdp_optim_zero_grad(t->o);
        }
    }
    if (mallocs && (st = pdp_cuda_memory_stats_get(buf->device, &ms))) return st;
    if (mallocs) *mallocs += ms.device_mallocs;
    return PDP_OK;
}

/* j->err <- max over m's parameters of |this rank's slice - its cut of j->ref's tensor of
   the same name| / max |j->ref's parameters| (rel_err's measure over the whole model, as
   the checkpoint's check); a failure goes to j->st and j->msg. */
static void tg_slices_err(tg_job *j, const pdp_model *m)
{
    pdp_tensor p, rp;
    float *h = NULL, *want = NULL;
    double diff = 0.0, scale = 1e-30;
    int64_t i;
    int k;
    /* (the whole parameter block at ZeRO stage 1 too; not its gradients) */
    if ((j->st = pdp_model_flat(m, &p, NULL)) || (j->st = pdp_model_flat(j->ref, &rp, NULL)))
        return;
    for (i = 0; i < rp.count; i++)
        if (fabs((double)rp.data[i]) > scale) scale = fabs((double)rp.data[i]);
    if (!(h = host_copy(&p)) || !(want = (float *)malloc((size_t)p.count * sizeof(float)))) {
        j->st = PDP_ERR_OUT_OF_MEMORY;
        goto out;
    }
    for (k = 0; k < pdp_model_num_params(m); k++) {
        pdp_param mine, full;
        if ((j->st = pdp_model_param(m, k, &mine)) ||
            (j->st = pdp_model_find_param(j->ref, mine.name, &full)) ||
            (j->st = pdp__tp_runs(m, k, pdp_cpu(), full.value.data, want, false)))
            goto out;
        for (i = 0; i < mine.count; i++) {
            double d = fabs((double)h[mine.offset + i] - (double)want[i]);
            if (!(d <= diff)) diff = d; /* NaN sticks */
        }
    }
    j->err = diff / scale;
out:
    free(want);
    free(h);
}

static void *tg_main(void *arg)
{
    tg_job *j = (tg_job *)arg;
    const tg_run *run = j->run;
    pdp_device dev = pdp_cuda(j->rank);
    pdp_comm *c = NULL, *tp = NULL, *dc = NULL;
    pdp_model *m = NULL;
    pdp_optim *o = NULL;
    pdp_ddp *ddp = NULL;
    pdp_zero *z = NULL;
    pdp_optim_desc od = tg_adamw();
    pdp_zero_desc zd;
    pdp_tensor *buf = NULL;
    pdp_gpt_desc gd;
    tg_trainer t;
    int d = j->rank / run->tp;
    int64_t rows[1], mallocs = 0;
    char path[128];
    rows[0] = TG_B / run->dp * run->T;
    memset(&zd, 0, sizeof zd);
    zd.stage = run->zero;
    if ((j->st = pdp_comm_create_nccl(&c, j->g, j->rank))) goto out;
    if (run->dp > 1 && ((j->st = pdp_comm_split(c, d, j->rank, &tp)) ||
                        (j->st = pdp_comm_split(c, j->rank % run->tp, j->rank, &dc))))
        goto out;
    gd = tg_desc(dev, tp ? tp : c, run);
    if ((j->st = pdp_gpt_create(&m, &gd))) goto out;
    if (run->dp > 1 && run->zero) {
        if ((j->st = pdp_zero_create(&z, m, dc, &zd)) ||
            (j->st = pdp_zero_optim_create(&o, z, &od)))
            goto out;
    } else if ((j->st = pdp_optim_create(&o, m, &od)) ||
               (run->dp > 1 && (j->st = pdp_ddp_create(&ddp, m, dc, NULL)))) {
        goto out;
    }
    if ((j->st = pdp_tensor_create(&buf, dev, 1, rows))) goto out;
    t.m = m, t.o = o, t.ddp = ddp, t.z = z, t.first = TG_B / run->dp * d;
    if ((j->st = tg_train(&t, run->T, buf, j->losses, j->norms, &mallocs))) goto out;
    if (mallocs != 0) {
        j->st = PDP_ERR_INVALID;
        snprintf(j->msg, sizeof j->msg, "rank %d: %lld device allocations in steps 2-%d",
                 j->rank, (long long)mallocs, TG_STEPS);
        goto out;
    }
    tg_slices_err(j, m);
    snprintf(path, sizeof path, "%s.%d", j->path, d);
    if (!j->st && !z) j->st = pdp_tp_checkpoint_save(path, m, NULL); /* not under ZeRO yet */
out:
    if (j->st && !j->msg[0])
        snprintf(j->msg, sizeof j->msg, "rank %d: %s", j->rank, pdp_last_error());
    pdp_tensor_free(buf);
    pdp_ddp_free(ddp);
    pdp_zero_free(z);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(dc);
    pdp_comm_free(tp);
    pdp_comm_free(c);
    return NULL;
}

static enum greatest_test_res check_tp_gpt(const tg_run *run)
{
    static tg_job jobs[TG_MAXR];
    static const char *rc_name[] = {"", ", recompute selective", ", recompute full"};
    int n = run->tp * run->dp, r, s, d;
    pdp_device devs[TG_MAXR];
    pdp_nccl_group *g = NULL;
    pthread_t th[TG_MAXR];
    pdp_model *ref = NULL, *back = NULL;
    pdp_optim *o = NULL;
    pdp_optim_desc od = tg_adamw();
    pdp_gpt_desc gd = tg_desc(pdp_cpu(), NULL, run);
    pdp_tensor *buf = NULL, p, rp;
    float losses[TG_STEPS], norms[TG_STEPS], loss;
    int64_t flat[1];
    tg_trainer t;
    char path[96], file[128], what[96], msg[300];
    double e;
    if (run->dp > 1)
        snprintf(what, sizeof what, "%s x TP %d%s%s", run->zero ? "ZeRO-1" : "DDP 2", run->tp,
                 run->sp ? " + SP" : "", rc_name[run->rc]);
    else
        snprintf(what, sizeof what, "TP %d%s%s", run->tp, run->sp ? " + SP" : "",
                 rc_name[run->rc]);
    flat[0] = TG_B * run->T;
    memset(&t, 0, sizeof t);
    ASSERTm(pdp_last_error(), pdp_gpt_create(&ref, &gd) == PDP_OK);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, ref, &od), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&buf, pdp_cpu(), 1, flat), pdp_status_name);
    t.m = ref, t.o = o;
    ASSERTm(pdp_last_error(), tg_train(&t, run->T, buf, losses, norms, NULL) == PDP_OK);
    for (s = 0; s < TG_STEPS; s++) ASSERTm("clipping at every step", norms[s] > TG_CLIP);
    snprintf(path, sizeof path, "/tmp/pdp_test_cuda_tp_gpt_%d.safetensors", (int)getpid());
    for (r = 0; r < n; r++) devs[r] = pdp_cuda(r);
    ASSERTm(pdp_last_error(), pdp_nccl_group_create(&g, n, devs, NULL) == PDP_OK);
    for (r = 0; r < n; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].g = g;
        jobs[r].run = run;
        jobs[r].ref = ref;
        jobs[r].rank = r;
        jobs[r].path = path;
        pthread_create(&th[r], NULL, tg_main, &jobs[r]);
    }
    for (r = 0; r < n; r++) pthread_join(th[r], NULL);
    pdp_nccl_group_free(g);
    for (r = 0; r < n; r++) ASSERTm(jobs[r].msg, jobs[r].st == PDP_OK);
    for (s = 0; s < TG_STEPS; s++)
        for (r = 0; r < n; r++) {
            /* the DP copies' mean loss, at this rank's place in its TP group */
            for (loss = 0.0f, d = 0; d < run->dp; d++)
                loss += jobs[d * run->tp + r % run->tp].losses[s] / (float)run->dp;
            snprintf(msg, sizeof msg, "%s on GPUs, rank %d, step %d: loss %.9g norm %.9g, CPU "
                     "%.9g %.9g", what, r, s, (double)loss, (double)jobs[r].norms[s],
                     (double)losses[s], (double)norms[s]);
            ASSERTm(msg, fabs((double)loss - losses[s]) <= TOL * fabs(losses[s]));
            ASSERTm(msg, fabs((double)jobs[r].norms[s] - norms[s]) <= TOL * fabs(norms[s]));
        }
    for (e = 0.0, r = 0; r < n; r++) {
        snprintf(msg, sizeof msg, "%s on GPUs after %d AdamW steps, rank %d: its slices' "
                 "relative error %g", what, TG_STEPS, r, jobs[r].err);
        ASSERTm(msg, jobs[r].err <= TOL);
        if (jobs[r].err > e) e = jobs[r].err;
    }
    if (getenv("PDP_TEST_VERBOSE"))
        printf("  %s on GPUs: the ranks' slices within %.3g of one device\n", what, e);
    /* the full tensors each TP group gathered, on one CPU GPT, against the reference */
    pdp_model_flat(ref, &rp, NULL);
    for (d = 0; d < (run->zero ? 0 : run->dp); d++) {
        snprintf(file, sizeof file, "%s.%d", path, d);
        ASSERTm(pdp_last_error(), pdp_gpt_create(&back, &gd) == PDP_OK);
        ASSERTm(pdp_last_error(), pdp_checkpoint_load(file, back, NULL) == PDP_OK);
        remove(file);
        pdp_model_flat(back, &p, NULL);
        ASSERT_EQ(rp.count, p.count);
        e = rel_err(p.data, rp.data, rp.count);
        pdp_model_free(back);
        snprintf(msg, sizeof msg, "%s on GPUs after %d AdamW steps, DP copy %d's checkpoint: "
                 "parameters' relative error %g", what, TG_STEPS, d, e);
        ASSERTm(msg, e <= TOL);
    }
    pdp_tensor_free(buf);
    pdp_optim_free(o);
    pdp_model_free(ref);
    PASS();
}

/* TP 2, TP 3 and DP 2 x TP 2's runs; TP 3 and DP x TP on the GPT that splits by 2 and 3 */
#define TG_TP2(sp, rc) {2, 1, 0, sp, rc, 8, 2, 16}
#define TG_SMALL(tp, dp, zero, sp, rc) {tp, dp, zero, sp, rc, 6, 6, 12}

TEST cuda_nccl_tp_gpt_matches_cpu(void)
{
    static const tg_run runs[] = {
        TG_TP2(false, PDP_RECOMPUTE_NONE), TG_TP2(true, PDP_RECOMPUTE_NONE),
        /* recomputation on the GPUs, dropout on (its masks drawn again in backward): against
           the CPU GPT that recomputes nothing */
        TG_TP2(false, PDP_RECOMPUTE_SELECTIVE), TG_TP2(true, PDP_RECOMPUTE_FULL)};
    size_t i;
    NEED_GPU();
    if (devices() < 2) SKIPm("the TP GPT over NCCL needs 2 GPUs (PDP_EMU_CUDA_DEVICES=2)");
    for (i = 0; i < sizeof runs / sizeof runs[0]; i++) CHECK_CALL(check_tp_gpt(&runs[i]));
    PASS();
}

TEST cuda_nccl_tp3_gpt_matches_cpu(void)
{
    static const tg_run runs[] = {
        TG_SMALL(3, 1, 0, false, PDP_RECOMPUTE_NONE), TG_SMALL(3, 1, 0, true, PDP_RECOMPUTE_NONE),
        TG_SMALL(3, 1, 0, false, PDP_RECOMPUTE_SELECTIVE),
        TG_SMALL(3, 1, 0, true, PDP_RECOMPUTE_FULL)};
    size_t i;
    NEED_GPU();
    if (devices() < 3) SKIPm("the TP 3 GPT over NCCL needs 3 GPUs (PDP_EMU_CUDA_DEVICES=3)");
    for (i = 0; i < sizeof runs / sizeof runs[0]; i++) CHECK_CALL(check_tp_gpt(&runs[i]));
    PASS();
}

TEST cuda_nccl_dp_x_tp_gpt_under_ddp_and_zero1_matches_cpu(void)
{
    static const tg_run runs[] = {
        TG_SMALL(2, 2, 0, true, PDP_RECOMPUTE_NONE),
        TG_SMALL(2, 2, 0, true, PDP_RECOMPUTE_SELECTIVE),
        TG_SMALL(2, 2, 0, true, PDP_RECOMPUTE_FULL),
        TG_SMALL(2, 2, 1, true, PDP_RECOMPUTE_NONE),
        TG_SMALL(2, 2, 1, true, PDP_RECOMPUTE_SELECTIVE),
        TG_SMALL(2, 2, 1, true, PDP_RECOMPUTE_FULL)};
    size_t i;
    NEED_GPU();
    if (devices() < 4) SKIPm("DP 2 x TP 2 over NCCL needs 4 GPUs (PDP_EMU_CUDA_DEVICES=4)");
    for (i = 0; i < sizeof runs / sizeof runs[0]; i++) CHECK_CALL(check_tp_gpt(&runs[i]));
    PASS();
}

SUITE(cuda)
{
    RUN_TEST(cuda_batcher_on_device_matches_cpu);
    RUN_TEST(cuda_launch_nccl_thread_ranks);
    RUN_TEST(cuda_device_count_and_bad_ordinal);
    RUN_TEST(cuda_tensor_copies_round_trip);
    RUN_TEST(cuda_caching_allocator_reuses_freed_blocks);
    RUN_TEST(cuda_release_gives_the_device_back);
    RUN_TEST(cuda_layers_match_cpu);
    RUN_TEST(cuda_column_sums_keep_row_order_bits);
    RUN_TEST(cuda_embedding_and_tied_head_match_cpu);
    RUN_TEST(cuda_gpt_training_matches_cpu);
    RUN_TEST(cuda_maxpool_ties_and_nan_match_cpu);
    RUN_TEST(cuda_losses_match_cpu);
    RUN_TEST(cuda_cross_entropy_long_rows_match_cpu);
    RUN_TEST(cuda_optimizers_match_cpu);
    RUN_TEST(cuda_mlp_training_matches_cpu);
    RUN_TEST(cuda_cnn_training_matches_cpu);
    RUN_TEST(cuda_step_allocates_nothing);
    RUN_TEST(cuda_tf32_option_changes_gemm_only_slightly);
    RUN_TEST(cuda_bf16_linear_matches_cpu_bf16_and_fp32);
    RUN_TEST(cuda_bf16_training_matches_cpu_bf16);
    RUN_TEST(cuda_ddp_nccl_world_size_1_matches_single);
    RUN_TEST(cuda_ddp_thread_ranks_match_single);
    RUN_TEST(cuda_ddp_compress_hooks_over_nccl);
    RUN_TEST(cuda_zero_nccl_thread_ranks_match_single);
    RUN_TEST(cuda_zero_nccl_bf16_hook_matches_the_cpu);
    RUN_TEST(cuda_nccl_desc_timeout_rule);
    RUN_TEST(cuda_nccl_tp_matches_cpu);
    RUN_TEST(cuda_nccl_pp_gpipe_matches_cpu);
    RUN_TEST(cuda_nccl_pp_1f1b_matches_cpu);
    RUN_TEST(cuda_nccl_pp_clip_grad_norm_matches_cpu);
    RUN_TEST(cuda_nccl_2d_dp_x_tp_and_dp_x_pp_match_cpu);
    RUN_TEST(cuda_ddp_nccl_processes_match_single);
    RUN_TEST(cuda_dp_over_gpus_matches_cpu);
    RUN_TEST(cuda_dp_rejects_mixed_devices);
    RUN_TEST(cuda_clip_grad_norm_matches_cpu);
    RUN_TEST(cuda_nccl_gpt_zero_matches_cpu);
    RUN_TEST(cuda_nccl_gpt_pipeline_matches_cpu);
    RUN_TEST(cuda_nccl_gpt_interleaved_pipeline_matches_cpu);
    RUN_TEST(cuda_nccl_tp_gpt_matches_cpu);
    RUN_TEST(cuda_nccl_tp3_gpt_matches_cpu);
    RUN_TEST(cuda_nccl_dp_x_tp_gpt_under_ddp_and_zero1_matches_cpu);
    if (devices() < 1) {
        RUN_TEST(conf_nccl_needs_a_gpu); /* skips, or fails under PDP_TEST_REQUIRE_CUDA=1 */
    } else {
        nccl_factory.max_ranks = devices() < 4 ? devices() : 4;
        conf_run_suite(&nccl_factory);
    }
}

#endif /* PDP_CUDA */

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(cuda);
    GREATEST_MAIN_END();
}
