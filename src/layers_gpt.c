/* layers_gpt: the math of a GPT's layers, forward and backward side by side (llm.c's
   layout), as plain functions on row-major fp32 arrays, then the layer kinds that call
   them (shapes, parameters, saved buffers: the end of this file). The kernels allocate
   nothing: the caller passes every output, saved and work buffer.

   Shapes: B sequences of T positions, channels C, H heads of D = C / H channels,
   vocabulary V. References: Vaswani et al., "Attention Is All You Need" (2017), for
   scaled dot-product and multi-head attention; Radford et al., "Language Models are
   Unsupervised Multitask Learners" (GPT-2, 2019), for the pre-LayerNorm block, learned
   positions and the tanh GELU; Ba, Kiros and Hinton, "Layer Normalization" (2016);
   nanoGPT's model.py and llm.c's train_gpt2.c for the layouts followed here.

   - Embedding: out[b, t, :] = wte[id[b, t], :] + wpe[t, :]. Backward scatter-adds:
     dwte[id[b, t], :] += dout[b, t, :] and dwpe[t, :] += sum over b of dout[b, t, :],
     in (b, t) order for every channel; threads split the channels, so the bits do not
     depend on the thread count even when an id repeats.
   - Attention (causal, multi-head): qkv [B, T, 3C] is the c_attn Linear's output,
     q, k and v side by side along the last dimension (nanoGPT's qkv.split(C, dim=2));
     head h of q is columns [h D, h D + D) of the q part. For each (b, h):
         S = Q K^T / sqrt(D)            [T, T] scores
         S[t, s] = -inf for s > t       the causal mask: t attends to 0..t only
         P = softmax(S) row by row      the attention probabilities, saved as att
         Pd = P o M / (1 - p)           attention dropout (training, p > 0)
         Y = Pd V                       [T, D], written to y[b, :, h D .. h D + D)
     y [B, T, C] is the heads side by side again (PyTorch's transpose(1, 2).view(B,
     T, C)). Backward from dy and the saved att (the probabilities before dropout):
         dV = Pd^T dY,  dPd = dY V^T,  dP = dPd o M / (1 - p)
         dS = P o (dP - rowsum(dP o P))   (the softmax's Jacobian, row by row)
         dQ = dS K / sqrt(D),  dK = dS^T Q / sqrt(D)
     Masked entries have P = 0 and dS = 0, so they give nothing to any product.
     Computed per (b, h), the pairs split over threads, a step per formula: each product
     one pdp_sgemm on qkv's strided rows (the masked half too: cheaper than T^2 / 2
     separate dot products; inside a part it runs on that part's thread, as threads.c
     runs a nested job, with gemm.c's bits), the softmax and its backward row by row
     (layers.c's vectorised exp, pdp__layers_exp_shift_run, and its fixed-order sums).
   - LayerNorm over the last dimension: layers.c's LayerNorm, which acts on each row of a
     [T, C] sample (l->positions).
   - GELU, tanh form: already pdp's GELU (math.h's pdp__gelu and pdp__gelu_grad), and
     layers.c's element-wise kernel acts on every position of a [T, C] sample.
   - Cross-entropy over [N, V] rows with ignore_index -1: loss.c's
     (pdp__cross_entropy_ignore, which pdp_model_forward_backward calls).

   Invariants: nothing allocated; outputs written (not accumulated) unless the
   function says +=; every reduction in a fixed order, whatever the thread count. */

#include "internal.h"

/* ---- gpt: token and position embedding ---- */

/* Every id of [B, T] in [0, V), or PDP_ERR_INVALID naming the first that is not, its
   position and why (appended: "" in the forward). */
PDP__PRIVATE pdp_status pdp__embed_check_ids(const int32_t *ids, int64_t B, int64_t T, int64_t V,
                                             const char *fn, const char *why)
{
    int64_t i;
    for (i = 0; i < B * T; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return pdp__err(PDP_ERR_INVALID, "%s: token id %ld at position (%lld, %lld) is "
                            "outside [0, %lld)%s", fn, (long)ids[i], (long long)(i / T),
                            (long long)(i % T), (long long)V, why);
    return PDP_OK;
}

/* out[b, t, :] = wte[ids[b, t], :] + wpe[t, :] for ids [B, T] (int32), wte [V, C], wpe
   [context, C], out [B, T, C]. T > context, or an id outside [0, V), is PDP_ERR_INVALID
   naming fn, the lengths or the position (b, t) and the id; out is then unspecified. */
PDP__PRIVATE pdp_status pdp__embed_forward(const int32_t *ids, int64_t B, int64_t T,
                                           int64_t context, int64_t V, int64_t C,
                                           const float *wte, const float *wpe, float *out,
                                           const char *fn)
{
    int64_t b, t, c;
    pdp_status st;
    if (T > context)
        return pdp__err(PDP_ERR_INVALID, "%s: a sequence of %lld tokens is longer than the "
                        "context of %lld", fn, (long long)T, (long long)context);
    if ((st = pdp__embed_check_ids(ids, B, T, V, fn, "")) != PDP_OK) return st;
    for (b = 0; b < B; b++)
        for (t = 0; t < T; t++) {
            const float *e = wte + (int64_t)ids[b * T + t] * C, *p = wpe + t * C;
            float *o = out + (b * T + t) * C;
            for (c = 0; c < C; c++) o[c] = e[c] + p[c];
        }
    return PDP_OK;
}

typedef struct pdp__embed_job {
    const int32_t *ids;
    int64_t B, T, C;
    const float *dout;
    float *dwte, *dwpe;
} pdp__embed_job;

/* Part i of n: channels [lo, hi) of every row, in (b, t) order. */
PDP__PRIVATE void pdp__embed_backward_part(void *arg, int i, int n)
{
    const pdp__embed_job *j = (const pdp__embed_job *)arg;
    int64_t lo = j->C * i / n, hi = j->C * (i + 1) / n, b, t, c;
    for (b = 0; b < j->B; b++)
        for (t = 0; t < j->T; t++) {
            const float *d = j->dout + (b * j->T + t) * j->C;
            float *dw = j->dwte + (int64_t)j->ids[b * j->T + t] * j->C, *dp = j->dwpe + t * j->C;
            for (c = lo; c < hi; c++) {
                dw[c] += d[c];
                dp[c] += d[c];
            }
        }
}

/* dwte[ids[b, t], :] += dout[b, t, :] and dwpe[t, :] += dout[b, t, :] for every (b, t),
   in that order per channel (ids checked by the forward). */
PDP__PRIVATE void pdp__embed_backward(const int32_t *ids, int64_t B, int64_t T, int64_t C,
                                      const float *dout, float *dwte, float *dwpe)
{
    pdp__embed_job j;
    int parts = (int)PDP__MIN((int64_t)pdp__threads_for_caller(), C / 16);
    j.ids = ids;
    j.B = B;
    j.T = T;
    j.C = C;
    j.dout = dout;
    j.dwte = dwte;
    j.dwpe = dwpe;
    if (B * T * C < 65536) parts = 1; /* not worth waking the pool */
    pdp__parallel_for(parts < 1 ? 1 : parts, pdp__embed_backward_part, &j);
}

/* ---- gpt: causal self-attention ----
   Attention dropout draws its mask as pdp's Dropout layer does (math.h: a counter-
   based hash, no state carried between elements): element (h, t, s) of sequence b is
   kept when pdp__dropout_bits(pdp__dropout_key(seed, layer, step, sample_base + b),
   (h T + t) T + s) >= pdp__dropout_threshold(p). So a batch split over DP replicas
   (sample_base) draws the masks one device draws, and the backward regenerates the
   mask from the same key instead of storing it: att keeps P before dropout. */
typedef struct pdp__attn_dropout {
    float p;              /* drop probability in [0, 1); 0 (or the struct NULL): none */
    uint64_t seed, step;  /* the model's dropout seed and step counter */
    int layer;            /* the layer index that keys this attention's masks */
    int64_t sample_base;  /* index of sequence 0 of this batch in the global batch */
    int64_t head_base;    /* the global index of head 0 (a TP rank's first head; else 0) */
} pdp__attn_dropout;

typedef struct pdp__attn_job {
    const float *qkv, *att, *dy;
    float *y, *att_out, *dqkv, *work;
    int64_t B, T, C, H, D;
    float scale;
    int simd; /* the softmax's exp: layers.c's pdp__layers_simd */
    const pdp__attn_dropout *drop;
} pdp__attn_job;

/* Attention dropout is on: training with p > 0. */
PDP__PRIVATE bool pdp__attn_dropping(const pdp__attn_job *j)
{
    return j->drop && j->drop->p != 0.0f;
}

/* The kept-and-rescaled factor M / (1 - p) of row t of (b, h)'s dropout mask, written to
   keep[0..t]. */
PDP__PRIVATE void pdp__attn_keep_row(const pdp__attn_job *j, int64_t b, int64_t h, int64_t t,
                                     float *keep)
{
    const pdp__attn_dropout *d = j->drop;
    uint64_t key = pdp__dropout_key(d->seed, d->layer, d->step, d->sample_base + b);
    uint32_t thr = pdp__dropout_threshold(d->p);
    float scale = 1.0f / (1.0f - d->p);
    int64_t base = ((h + d->head_base) * j->T + t) * j->T, s;
    for (s = 0; s <= t; s++) keep[s] = pdp__dropout_bits(key, base + s) >= thr ? scale : 0.0f;
}

/* A row's passes, on restrict parameters so that gcc -O2 vectorises them (see layers.c's
   pdp__layers_add); the sums are layers.c's fixed-order ones. The largest of p[0, n): */
PDP__PRIVATE float pdp__attn_row_max(const float *PDP__RESTRICT p, int64_t n)
{
    float lane[16], mx;
    int64_t i = 0;
    int k;
    for (k = 0; k < 16; k++) lane[k] = -HUGE_VALF;
    for (; i + 16 <= n; i += 16)
        for (k = 0; k < 16; k++) lane[k] = p[i + k] > lane[k] ? p[i + k] : lane[k];
    for (mx = -HUGE_VALF; i < n; i++) mx = p[i] > mx ? p[i] : mx;
    for (k = 0; k < 16; k++) mx = lane[k] > mx ? lane[k] : mx;
    return mx;
}

PDP__PRIVATE void pdp__attn_row_div(float *PDP__RESTRICT p, float d, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, p[i] /= d;);
}

/* dS = P o (dP - rowsum) scale, in place over dP */
PDP__PRIVATE void pdp__attn_row_dsoftmax(const float *PDP__RESTRICT p, float rowsum, float scale,
                                         float *PDP__RESTRICT dp, int64_t n)
{
    PDP__FOR_BLOCKED(i, n, dp[i] = p[i] * (dp[i] - rowsum) * scale;);
}

/* The causal products run in blocks of PDP__ATTN_BLOCK query rows: rows [r0, r1) see keys
   [0, r1) only, so each block's products stop at column r1 instead of T (at T = 256, 62%
   of the full T x T products; the masked entries inside a block's columns are 0 in P and
   dS and add nothing). */
#ifndef PDP__ATTN_BLOCK
#  define PDP__ATTN_BLOCK 64
#endif

/* One (b, h) pair, forward, block by block: S = Q K^T / sqrt(D) by one GEMM, P row by
   row, Y = Pd V by one GEMM. w: T (T + 1) floats of work (Pd with dropout, a row of the
   mask). */
PDP__PRIVATE void pdp__attn_forward_head(const pdp__attn_job *j, int64_t b, int64_t h, float *w)
{
    int64_t T = j->T, C = j->C, D = j->D, C3 = 3 * C, t, s, r0, r1;
    const float *q = j->qkv + b * T * C3 + h * D, *k = q + C, *v = q + 2 * C; /* row stride 3C */
    float *P = j->att_out + (b * j->H + h) * T * T, *keep = w + T * T;
    for (r0 = 0; r0 < T; r0 = r1) {
        r1 = PDP__MIN(r0 + PDP__ATTN_BLOCK, T);
        /* S[r0:r1, 0:r1]: one GEMM over the strided rows of qkv (the masked corner inside
           too: cheaper than separate dot products) */
        pdp_sgemm(PDP_NO_TRANS, PDP_TRANS, r1 - r0, r1, D, j->scale, q + r0 * C3, C3, k, C3,
                  0.0f, P + r0 * T, T);
        for (t = r0; t < r1; t++) {
            float *p = P + t * T;
            /* THE CAUSAL MASK: from here on the row is p[0..t] only, so position t never
               sees a later key; the masked scores are the -inf of the formulas, and their P
               is the 0 written below. */
            float mx = pdp__attn_row_max(p, t + 1);
            /* softmax, safe: exp(S - max) <= 1 cannot overflow (the max's term is 1) */
            pdp__layers_exp_shift_run(j->simd, p, mx, p, t + 1);
            pdp__attn_row_div(p, (float)pdp__layers_sum(p, t + 1), t + 1);
            if (t + 1 < T) memset(p + t + 1, 0, (size_t)(T - t - 1) * sizeof *p);
            if (pdp__attn_dropping(j)) { /* Pd = P o M / (1 - p) */
                pdp__attn_keep_row(j, b, h, t, keep);
                for (s = 0; s < T; s++) w[t * T + s] = s <= t ? p[s] * keep[s] : 0.0f;
            }
        }
        /* Y[r0:r1] = Pd[r0:r1, 0:r1] V[0:r1] */
        pdp_sgemm(PDP_NO_TRANS, PDP_NO_TRANS, r1 - r0, D, r1, 1.0f,
                  (pdp__attn_dropping(j) ? w : P) + r0 * T, T, v, C3, 0.0f,
                  j->y + (b * T + r0) * C + h * D, C);
    }
}

/* One (b, h) pair, backward (see the module comment), block by block from the last (whose
   dV and dK products cover every key row and write them) to the first (adding onto rows
   [0, r1)): a fixed order. dqkv's q, k and v columns of this head are written. w: T (T + 1)
   floats of work (Pd, then dP and dS; a row of the mask). */
PDP__PRIVATE void pdp__attn_backward_head(const pdp__attn_job *j, int64_t b, int64_t h, float *w)
{
    int64_t T = j->T, C = j->C, D = j->D, C3 = 3 * C, t, s, r0, r1, nb;
    const float *q = j->qkv + b * T * C3 + h * D, *k = q + C, *v = q + 2 * C;
    const float *P = j->att + (b * j->H + h) * T * T;
    const float *dy = j->dy + b * T * C + h * D; /* row stride C */
    float *dq = j->dqkv + b * T * C3 + h * D, *dk = dq + C, *dv = dq + 2 * C, *keep = w + T * T;
    if (pdp__attn_dropping(j)) /* Pd, as the forward had it */
        for (t = 0; t < T; t++) {
            pdp__attn_keep_row(j, b, h, t, keep);
            for (s = 0; s < T; s++) w[t * T + s] = s <= t ? P[t * T + s] * keep[s] : 0.0f;
        }
    for (nb = (T + PDP__ATTN_BLOCK - 1) / PDP__ATTN_BLOCK; nb-- > 0;) {
        float beta = (nb + 1) * PDP__ATTN_BLOCK >= T ? 0.0f : 1.0f; /* the last block */
        r0 = nb * PDP__ATTN_BLOCK;
        r1 = PDP__MIN(r0 + PDP__ATTN_BLOCK, T);
        /* dV[0:r1] (+)= Pd[r0:r1, 0:r1]^T dY[r0:r1] */
        pdp_sgemm(PDP_TRANS, PDP_NO_TRANS, r1, D, r1 - r0, 1.0f,
                  (pdp__attn_dropping(j) ? w : P) + r0 * T, T, dy + r0 * C, C, beta, dv, C3);
        /* dPd[r0:r1, 0:r1] = dY[r0:r1] V[0:r1]^T (over w's Pd rows, used above) */
        pdp_sgemm(PDP_NO_TRANS, PDP_TRANS, r1 - r0, r1, D, 1.0f, dy + r0 * C, C, v, C3, 0.0f,
                  w + r0 * T, T);
        for (t = r0; t < r1; t++) { /* row by row: dP = dPd o M / (1 - p), then dS / sqrt(D) */
            const float *p = P + t * T;
            float *dp = w + t * T, rowsum;
            if (pdp__attn_dropping(j)) {
                pdp__attn_keep_row(j, b, h, t, keep);
                for (s = 0; s <= t; s++) dp[s] *= keep[s];
            }
            rowsum = (float)pdp__layers_dot(dp, p, t + 1);
            pdp__attn_row_dsoftmax(p, rowsum, j->scale, dp, t + 1);
            if (t + 1 < r1) /* masked: no gradient */
                memset(dp + t + 1, 0, (size_t)(r1 - t - 1) * sizeof *dp);
        }
        /* dQ[r0:r1] = dS[r0:r1, 0:r1] K[0:r1] / sqrt(D) (the scale is in dS) */
        pdp_sgemm(PDP_NO_TRANS, PDP_NO_TRANS, r1 - r0, D, r1, 1.0f, w + r0 * T, T, k, C3, 0.0f,
                  dq + r0 * C3, C3);
        /* dK[0:r1] (+)= dS[r0:r1, 0:r1]^T Q[r0:r1] / sqrt(D) */
        pdp_sgemm(PDP_TRANS, PDP_NO_TRANS, r1, D, r1 - r0, 1.0f, w + r0 * T, T, q + r0 * C3, C3,
                  beta, dk, C3);
    }
}

/* Part i of n: the (b, h) pairs [B H i / n, B H (i + 1) / n), each computed whole by
   one thread, so the bits do not depend on the split. */
PDP__PRIVATE void pdp__attn_forward_part(void *arg, int i, int n)
{
    const pdp__attn_job *j = (const pdp__attn_job *)arg;
    int64_t pairs = j->B * j->H, lo = pairs * i / n, hi = pairs * (i + 1) / n, bh;
    for (bh = lo; bh < hi; bh++)
        pdp__attn_forward_head(j, bh / j->H, bh % j->H, j->work + bh * j->T * (j->T + 1));
}

PDP__PRIVATE void pdp__attn_backward_part(void *arg, int i, int n)
{
    const pdp__attn_job *j = (const pdp__attn_job *)arg;
    int64_t pairs = j->B * j->H, lo = pairs * i / n, hi = pairs * (i + 1) / n, bh;
    for (bh = lo; bh < hi; bh++)
        pdp__attn_backward_head(j, bh / j->H, bh % j->H, j->work + bh * j->T * (j->T + 1));
}

/* Below this many multiply-adds (B H T^2 D) the pool is not woken. */
#ifndef PDP__ATTN_PAR_MIN
#  define PDP__ATTN_PAR_MIN 8192
#endif

PDP__PRIVATE int pdp__attn_parts(const pdp__attn_job *j)
{
    int64_t pairs = j->B * j->H;
    if (pairs * j->T * j->T * j->D < PDP__ATTN_PAR_MIN) return 1;
    return (int)PDP__MIN((int64_t)pdp__threads_for_caller(), pairs);
}

PDP__PRIVATE void pdp__attn_job_init(pdp__attn_job *j, int64_t B, int64_t T, int64_t C, int64_t H,
                                     const pdp__attn_dropout *drop, float *work)
{
    memset(j, 0, sizeof *j);
    j->B = B;
    j->T = T;
    j->C = C;
    j->H = H;
    j->D = C / H;
    j->scale = (float)(1.0 / sqrt((double)j->D));
    j->simd = pdp__layers_simd();
    j->drop = drop;
    j->work = work;
}

/* Causal self-attention, forward: qkv [B, T, 3C] -> y [B, T, C], saving att [B, H, T, T]
   (P before dropout; 0 above the diagonal). drop: NULL or p == 0 for none (evaluation).
   work: B H T (T + 1) floats. C % H == 0 (the caller's setup checks it). */
PDP__PRIVATE void pdp__attention_forward(const float *qkv, int64_t B, int64_t T, int64_t C,
                                         int64_t H, const pdp__attn_dropout *drop, float *y,
                                         float *att, float *work)
{
    pdp__attn_job j;
    PDP_ASSERT(H > 0 && C % H == 0);
    pdp__attn_job_init(&j, B, T, C, H, drop, work);
    j.qkv = qkv;
    j.y = y;
    j.att_out = att;
    pdp__parallel_for(pdp__attn_parts(&j), pdp__attn_forward_part, &j);
}

/* Causal self-attention, backward: dqkv [B, T, 3C] (written) from dy [B, T, C], the
   forward's qkv and att, and the same drop (its mask is drawn again). work: B H T (T + 1)
   floats (like llm.c's datt, one att-sized buffer; a model can share it between layers).
   dqkv must not overlap qkv, att or dy. */
PDP__PRIVATE void pdp__attention_backward(const float *qkv, const float *att, const float *dy,
                                          int64_t B, int64_t T, int64_t C, int64_t H,
                                          const pdp__attn_dropout *drop, float *dqkv, float *work)
{
    pdp__attn_job j;
    PDP_ASSERT(H > 0 && C % H == 0);
    pdp__attn_job_init(&j, B, T, C, H, drop, work);
    j.qkv = qkv;
    j.att = att;
    j.dy = dy;
    j.dqkv = dqkv;
    pdp__parallel_for(pdp__attn_parts(&j), pdp__attn_backward_part, &j);
}

/* ---- gpt: the layer kinds ----
   The table's entries (layers_table.c) for a GPT's own kinds, on the kernels above:
   - Embedding: a sample is T token ids (int32, the model's input), its output [T, C] =
     wte[id] + wpe[t]; parameters "token.weight" [vocab, C] and "position.weight"
     [context, C] (a GPT builder names them transformer.wte / transformer.wpe).
   - CausalSelfAttention: [T, 3C] (the c_attn Linear's q | k | v) -> [T, C]; no
     parameters (c_attn and c_proj are plain Linears around it); saves att [H, T, T].
   - Residual and ResidualAdd: a residual region (model.c). Residual's forward is its
     input seen again (model.c aliases it); ResidualAdd's forward is y = x + skip, the
     region's input. Backward: ResidualAdd passes dy on to the branch (dx is dy itself,
     not copied) and sends it around in dskip; Residual adds it: dx = dy + dskip, the two
     paths' gradients summed where they split.
   - TiedLinear: y = x W^T with no bias, W a parameter another layer owns (a GPT's head,
     W = wte): its gradient accumulates into that parameter's, so the embedding's rows
     and the head's product sum into one dW, as autograd sums a tied Parameter's uses. */

PDP__PRIVATE pdp_status pdp__embedding_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    if (l->in_ndim != 1)
        return pdp__err(PDP_ERR_SHAPE, "needs a sample of T token ids, got %s", in);
    if (l->vocab < 1 || l->out_features < 1 || l->context < 1)
        return pdp__err(PDP_ERR_INVALID, "vocab %lld, dim %lld and context %lld must be >= 1",
                        (long long)l->vocab, (long long)l->out_features, (long long)l->context);
    if (l->in_shape[0] > l->context)
        return pdp__err(PDP_ERR_SHAPE, "a sequence of %lld tokens is longer than the context "
                        "of %lld", (long long)l->in_shape[0], (long long)l->context);
    if (l->vocab > INT32_MAX)
        return pdp__err(PDP_ERR_INVALID, "vocab %lld: ids are int32", (long long)l->vocab);
    l->out_ndim = 2;
    l->out_shape[0] = l->in_shape[0];
    l->out_shape[1] = l->out_features;
    ps->wndim = ps->bndim = 2;
    ps->wshape[0] = l->vocab;
    ps->wshape[1] = l->out_features;
    ps->bshape[0] = l->context;
    ps->bshape[1] = l->out_features;
    ps->wname = "token.weight";
    ps->bname = "position.weight";
    return PDP_OK;
}

/* N(0, 1), as torch.nn.Embedding (a GPT builder draws its own, N(0, 0.02)) */
PDP__PRIVATE void pdp__embedding_init(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    pdp_tensor t;
    int64_t nw = l->vocab * l->out_features, nb = l->context * l->out_features;
    memset(&t, 0, sizeof t); /* g++ -O3 cannot see that the wrap fills it */
    pdp_tensor_wrap(w, pdp_cpu(), 1, &nw, &t);
    pdp_tensor_normal(&t, r, 0.0f, 1.0f);
    pdp_tensor_wrap(b, pdp_cpu(), 1, &nb, &t);
    pdp_tensor_normal(&t, r, 0.0f, 1.0f);
}

PDP__PRIVATE pdp_status pdp__embedding_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp__embed_forward((const int32_t *)(const void *)io->x, io->batch, l->in_shape[0],
                              l->context, l->vocab, l->out_features, io->w, io->b, io->y,
                              "token ids");
}

/* The backward reads the forward's ids again (model.c keeps the input's pointer, not a copy):
   a caller that changed them since (a loader refilling its buffer) would scatter into rows
   past dwte. Checked again here, before anything is added: B T compares. */
PDP__PRIVATE pdp_status pdp__embedding_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    const int32_t *ids = (const int32_t *)(const void *)io->x;
    int64_t T = l->in_shape[0];
    pdp_status st = pdp__embed_check_ids(ids, io->batch, T, l->vocab, "token ids", ": the ids "
                                         "changed after the forward (the backward reads the "
                                         "forward's input again)");
    if (st == PDP_OK)
        pdp__embed_backward(ids, io->batch, T, l->out_features, io->dy, io->dw, io->db);
    return st;
}

PDP__PRIVATE pdp_status pdp__attention_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    int64_t T = l->in_shape[0], C = l->in_shape[1] / 3;
    (void)ps;
    if (l->in_ndim != 2 || l->in_shape[1] % 3 != 0)
        return pdp__err(PDP_ERR_SHAPE, "needs [T, 3C] (q | k | v, a c_attn Linear's output), "
                        "got %s", in);
    if (l->heads < 1 || C % l->heads != 0)
        return pdp__err(PDP_ERR_INVALID, "heads %lld must divide C = %lld (input %s)",
                        (long long)l->heads, (long long)C, in);
    if (!(l->p >= 0.0f && l->p < 1.0f))
        return pdp__err(PDP_ERR_INVALID, "dropout %g is outside [0, 1) (input %s)", (double)l->p,
                        in);
    if (!pdp__mul3_ok(l->heads, T, T + 1, &l->work_per_sample))
        return pdp__err(PDP_ERR_SHAPE, "%lld heads of %lld x %lld scores overflow (input %s)",
                        (long long)l->heads, (long long)T, (long long)T, in);
    l->out_ndim = 2;
    l->out_shape[0] = T;
    l->out_shape[1] = C;
    l->saved_per_sample = l->heads * T * T; /* att: P before dropout */
    if (l->recompute) { /* selective recomputation: att is drawn again in backward, in the
                           work buffer beside a scratch output: nothing kept */
        l->work_per_sample += l->saved_per_sample + T * C;
        l->saved_per_sample = 0;
    }
    return PDP_OK;
}

/* The work buffer of a selectively recomputed attention: the kernels' work (B H T (T + 1)),
   then att (B H T T), then a scratch output (B T C). */
PDP__PRIVATE void pdp__attention_scratch(const pdp__layer *l, const pdp__layer_io *io,
                                         float **att, float **y)
{
    int64_t T = l->in_shape[0];
    *att = io->work + io->batch * l->heads * T * (T + 1);
    *y = *att + io->batch * l->heads * T * T;
}

PDP__PRIVATE void pdp__attention_drop(const pdp__layer *l, const pdp__layer_io *io,
                                      pdp__attn_dropout *d)
{
    d->p = io->training ? l->p : 0.0f;
    d->seed = io->seed;
    d->step = io->step;
    d->layer = l->mask_index;
    d->sample_base = io->sample_base;
    d->head_base = l->tp ? l->tp_lo : 0; /* a TP rank's heads draw the full model's masks */
}

PDP__PRIVATE pdp_status pdp__attention_layer_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__attn_dropout d;
    float *att = io->saved, *scratch;
    if (l->recompute) pdp__attention_scratch(l, io, &att, &scratch); /* att not kept */
    pdp__attention_drop(l, io, &d);
    pdp__attention_forward(io->x, io->batch, l->in_shape[0], l->out_shape[1], l->heads, &d, io->y,
                           att, io->work);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__attention_layer_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__attn_dropout d;
    const float *att = io->saved;
    if (!io->dx) return PDP_OK; /* no parameters: only the input's gradient to give */
    pdp__attention_drop(l, io, &d);
    if (l->recompute) { /* the scores, the mask, the softmax (and the dropout) again */
        float *a, *y;
        pdp__attention_scratch(l, io, &a, &y);
        pdp__attention_forward(io->x, io->batch, l->in_shape[0], l->out_shape[1], l->heads, &d, y,
                               a, io->work);
        att = a;
    }
    pdp__attention_backward(io->x, att, io->dy, io->batch, l->in_shape[0], l->out_shape[1],
                            l->heads, &d, io->dx, io->work);
    return PDP_OK;
}

/* Residual and ResidualAdd: element passes split over the intra-op threads as
   layers.c's activations are (pdp__elem_run: ranges of 16, each element alone, so the
   bits never depend on the split). */
PDP__PRIVATE void pdp__residual_backward_range(const pdp__layer *l, const pdp__layer_io *io,
                                               int64_t lo, int64_t hi)
{
    (void)l;
    pdp__layers_add2(io->dy + lo, io->dskip + lo, io->dx + lo, hi - lo);
}

PDP__PRIVATE void pdp__residual_add_forward_range(const pdp__layer *l, const pdp__layer_io *io,
                                                  int64_t lo, int64_t hi)
{
    (void)l;
    pdp__layers_add2(io->x + lo, io->skip + lo, io->y + lo, hi - lo);
}

PDP__PRIVATE void pdp__residual_add_backward_range(const pdp__layer *l, const pdp__layer_io *io,
                                                   int64_t lo, int64_t hi)
{
    size_t bytes = (size_t)(hi - lo) * sizeof(float);
    (void)l;
    memcpy(io->dskip + lo, io->dy + lo, bytes);
    if (io->dx) memcpy(io->dx + lo, io->dy + lo, bytes);
}

/* Residual: a forward view (model.c never calls its forward); backward dx = dy + dskip */
PDP__PRIVATE pdp_status pdp__residual_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->y != io->x) memcpy(io->y, io->x, (size_t)(io->batch * l->in_count) * sizeof(float));
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__residual_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (io->dx) pdp__elem_run(l, io, pdp__residual_backward_range);
    return PDP_OK;
}

/* ResidualAdd: y = x + skip; backward dskip = dy (and dx = dy when asked: model.c does
   not ask, it lets dy itself go on into the branch) */
PDP__PRIVATE pdp_status pdp__residual_add_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__residual_add_forward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__residual_add_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp__elem_run(l, io, pdp__residual_add_backward_range);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__tied_linear_setup(pdp__layer *l, pdp__param_shapes *ps, const char *in)
{
    (void)ps; /* none of its own */
    if ((l->in_ndim != 1 && l->in_ndim != 2) || l->in_shape[l->in_ndim - 1] != l->tied_in)
        return pdp__err(PDP_ERR_SHAPE, "its weight is [%lld, %lld]: needs samples (%lld) or "
                        "(T, %lld), got %s", (long long)l->out_features, (long long)l->tied_in,
                        (long long)l->tied_in, (long long)l->tied_in, in);
    pdp__layers_per_position(l);
    l->out_ndim = l->in_ndim;
    l->out_shape[0] = l->in_ndim == 2 ? l->positions : l->out_features;
    l->out_shape[1] = l->in_ndim == 2 ? l->out_features : 1;
    return PDP_OK;
}

/* ---- gpt: the kinds' CUDA entries ----
   pdp_cuda.cu's kernels for the same formulas (its "GPT" sections). Embedding's backward
   sorts the positions by id into its CUDA workspace (an int32 a position:
   pdp__embedding_cuda_work); the attention's needs B H T T floats, within the H T (T + 1)
   per sample the CPU's setup asks for (selective recomputation: att and the scratch
   output after those, pdp__attention_scratch, as on the CPU). TiedLinear runs Linear's entries: no bias, and its
   io->w and io->dw are the tied parameter's (model.c). */

PDP__PRIVATE int64_t pdp__embedding_cuda_work(const pdp__layer *l)
{
    return l->in_shape[0]; /* T positions; an int32 fills a float's bytes */
}

#ifdef PDP_CUDA
PDP__PRIVATE pdp_status pdp__embedding_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp_cudak_embed_fwd(io->device.ordinal, (const int32_t *)(const void *)io->x, io->w,
                               io->b, io->y, io->batch, l->in_shape[0], l->vocab,
                               l->out_features);
}

PDP__PRIVATE pdp_status pdp__embedding_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    return pdp_cudak_embed_bwd(io->device.ordinal, (const int32_t *)(const void *)io->x, io->dy,
                               io->dw, io->db, (int32_t *)(void *)io->work, io->batch,
                               l->in_shape[0], l->vocab, l->out_features);
}

PDP__PRIVATE void pdp__attention_cuda_geometry(const pdp__layer *l, const pdp__layer_io *io,
                                               pdp_cudak_attn *g)
{
    pdp__attn_dropout d;
    pdp__attention_drop(l, io, &d);
    memset(g, 0, sizeof *g);
    g->B = io->batch;
    g->T = l->in_shape[0];
    g->C = l->out_shape[1];
    g->H = l->heads;
    g->p = d.p;
    g->seed = d.seed;
    g->step = d.step;
    g->layer = d.layer;
    g->sample_base = d.sample_base;
    g->head_base = d.head_base;
}

PDP__PRIVATE pdp_status pdp__attention_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_attn g;
    float *att = io->saved, *scratch;
    if (l->recompute) pdp__attention_scratch(l, io, &att, &scratch); /* att not kept */
    pdp__attention_cuda_geometry(l, io, &g);
    return pdp_cudak_attention_fwd(io->device.ordinal, &g, io->x, io->y, att, io->work);
}

PDP__PRIVATE pdp_status pdp__attention_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    pdp_cudak_attn g;
    float *att = io->saved, *y;
    pdp_status st;
    if (!io->dx) return PDP_OK; /* no parameters: only the input's gradient to give */
    pdp__attention_cuda_geometry(l, io, &g);
    if (l->recompute) { /* the forward again, into the scratch: att drawn again */
        pdp__attention_scratch(l, io, &att, &y);
        if ((st = pdp_cudak_attention_fwd(io->device.ordinal, &g, io->x, y, att, io->work)) !=
            PDP_OK)
            return st;
    }
    return pdp_cudak_attention_bwd(io->device.ordinal, &g, io->x, att, io->dy, io->dx, io->work);
}

/* Residual: a forward view (never called); backward dx = dy + dskip */
PDP__PRIVATE pdp_status pdp__residual_cuda_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    int dev = io->device.ordinal;
    if (io->y == io->x) return PDP_OK;
    return pdp_cudak_memcpy(dev, io->y, dev, io->x,
                            (size_t)(io->batch * l->in_count) * sizeof(float));
}

PDP__PRIVATE pdp_status pdp__residual_cuda_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (!io->dx) return PDP_OK;
    return pdp_cudak_sum2(io->device.ordinal, io->dy, io->dskip, io->dx, io->batch * l->in_count);
}

/* ResidualAdd: y = x + skip; backward dskip = dy and dx = dy */
PDP__PRIVATE pdp_status pdp__residual_add_cuda_forward(const pdp__layer *l,
                                                       const pdp__layer_io *io)
{
    return pdp_cudak_sum2(io->device.ordinal, io->x, io->skip, io->y, io->batch * l->in_count);
}

PDP__PRIVATE pdp_status pdp__residual_add_cuda_backward(const pdp__layer *l,
                                                        const pdp__layer_io *io)
{
    return pdp_cudak_copy2(io->device.ordinal, io->dy, io->dskip, io->dx,
                           io->batch * l->in_count);
}
#endif
