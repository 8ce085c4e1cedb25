/* layers_table: the table of layer kinds and the dispatch through it. One entry per
   kind (KANN's op table, kad_op_list, is the model): its name, setup (shape
   inference and validation, parameter shapes, saved and workspace floats),
   parameter initialisation, CPU forward and backward, CUDA forward and backward
   (pdp_cuda.cu's kernels), extra workspace on CUDA, flags (internal.h's
   PDP__LAYER_*: a view, element-wise, fuses a following ReLU, GELU or pool or is the one
   fused, collective, unnumbered, takes token ids, a view only forward, holds a residual
   skip, ties another layer's weight) and an estimate of its work in FLOPs (pp.c balances
   a pipeline's stages by it).

   This table is the only place that knows what each kind is. Every decision elsewhere
   that depends on it reads the flags: model.c's views and fusions, tp.c's element-wise
   kinds between the split Linears, the state_dict numbering (and pp.c's balance by work
   reads the FLOPs estimate, pdp__layer_flops); and model.c, dp.c and the
   executors run a layer through pdp__layer_setup, pdp__layer_forward and the other
   functions below, once per layer call (never per element). A kind's value is named
   elsewhere only by its own code: its constructor (model.c's pdp_model_add_*, tp.c's
   for the TP kinds, whose order rules name the kinds they follow), the TP kinds' slices
   (layers_tp.c, tp.c's checkpoints and width check), and the tests and
   tests/fake_cuda, which build layers of a kind.

   Adding a layer kind takes (the commit that added SiLU shows every step):
   1. math: a formula that the CPU and the CUDA kernels both compute goes into math.h as
      `static inline PDP__HOSTDEV` helpers (forward and its gradient), so the CPU tests
      cover the very code the kernels run;
   2. its code in layers.c (or a file of its own, listed in amalgamate.py before this
      one, as layers_conv.c): setup (pdp__layers_setup_same for a kind that keeps the
      shape and checks nothing), init when it has parameters, CPU forward and backward
      (they return PDP_OK, or a status whose message says what is wrong with the input;
      model.c names the layer), and its CUDA entries under #ifdef PDP_CUDA (see
      layers.c's conventions, and add the kind's to them when it has its own);
   3. its value in pdp__layer_kind (internal.h), appended before
      PDP__LAYER_KIND_COUNT, and its entry at the end of the table below (in the enum's
      order: C++ has no designators), with its flags and its FLOPs estimate (a
      pdp__flops_* function of the section "work estimates"; internal.h says what
      each promises: an element-wise kind gets PDP__LAYER_ELEMENTWISE and is then
      accepted inside a TP block with no edit to tp.c);
   4. its public constructor pdp_model_add_<kind> (model.h, with a comment naming the
      PyTorch module it equals; model.c, through pdp__layer_of and pdp__model_add);
   5. CUDA: its kernels and their plain C functions in pdp_cuda.cu (an activation is a
      pdp_cudak_act value in cuda.h and a case in pdp__act_fwd and pdp__act_bwd), declared
      in cuda.h; the same functions in tests/fake_cuda/fake_cuda.c, where each is a few
      lines that rebuild the layer and run pdp's CPU entry through fake__layer (an
      activation: its kind in fake__act_kind). tests/cuda_emu needs no edit: it runs
      pdp_cuda.cu as written (make emu-cuda-test runs the new kernels on the CPU);
      make cuda compiles them with nvcc;
   6. tests: in tests/test_layers.c, gradients against finite differences and the
      forward against a naive loop (layers_activation_grads_match_finite_differences
      and layers_linear_and_activations_match_naive take an activation; a kind of
      another shape gets tests of its own), and its name in
      layers_model_layer_name_names_every_layer (the table test covers the entry); a
      PyTorch fixture: a line in tools/gen_fixtures.py, run as
      `/usr/bin/python3 tools/gen_fixtures.py --out /tmp/fx`, copying only the new file
      into tests/fixtures/ (the others were written by torch 1.13: keep their bytes),
      and its case in tests/test_fixtures.c; in tests/test_cuda.c, a layer_case in
      build() and case_name (cuda_layers_match_cpu: the GPU against the CPU, on emulated
      GPUs under make emu-cuda-test and on real ones under tests/gpu/run.sh);
   7. docs: the constructor's comment (model.h); wherever src/manual.txt, README.md and
      the module comments list kinds (tp.h's table lists the element-wise ones); a line
      in CHANGELOG.md; then python3 amalgamate.py.
   A kind without CUDA entries (NULL) works on the CPU; on a CUDA device its calls
   fail with PDP_ERR_UNSUPPORTED naming the layer.

   Invariants: every kind has an entry (tests/test_layers.c checks the name, setup,
   forward and backward of each); a setup starts from output = input shape and
   nothing saved, workspace 0, no parameters. */

#include "internal.h"

#ifdef PDP_CUDA
#  define PDP__CUDA_ENTRY(fn) fn
#else
#  define PDP__CUDA_ENTRY(fn) NULL
#endif

/* ---- layers_table: work estimates ----
   Forward + backward FLOPs per sample from a layer's shapes: an estimate to balance a
   pipeline's stages by (pp.c, PDP_PP_BALANCE_WORK), not a measurement. A GEMM of
   (rows x k) by (k x n) counts 2 k n a row; an element-wise formula its operations as
   math.h writes them, a transcendental (expf, tanhf) counted as one. input_grad: the
   backward also computes the input's gradient (every layer but a model's first). */

/* in_count floats, each fwd operations forward, dparam for the parameters' gradients,
   dinput for the input's */
PDP__PRIVATE double pdp__flops_each(const pdp__layer *l, bool input_grad, double fwd,
                                    double dparam, double dinput)
{
    return (double)l->in_count * (fwd + dparam + (input_grad ? dinput : 0.0));
}
/* y = x W^T + b: one GEMM forward, one for dW, one for dx; the bias's add and sum (each
   of a [T, C] sample's T rows is one row of the GEMMs: in_count = T C) */
PDP__PRIVATE double pdp__flops_linear(const pdp__layer *l, bool input_grad)
{
    double gemm = 2.0 * (double)l->in_count * (double)l->out_features;
    return (input_grad ? 3.0 : 2.0) * gemm + 2.0 * (double)l->out_count;
}
/* the same GEMMs without a bias */
PDP__PRIVATE double pdp__flops_tied_linear(const pdp__layer *l, bool input_grad)
{
    return (input_grad ? 3.0 : 2.0) * 2.0 * (double)l->in_count * (double)l->out_features;
}
/* a row gathered and a position added; backward scatter-adds each into two tables */
PDP__PRIVATE double pdp__flops_embedding(const pdp__layer *l, bool input_grad)
{
    (void)input_grad; /* ids have no gradient */
    return 3.0 * (double)l->out_count;
}
/* per head: S = Q K^T and Y = P V, 2 T^2 D each, so 4 T^2 C forward over the heads; the
   backward's four products twice that; the softmax and its gradient ~8 a score */
PDP__PRIVATE double pdp__flops_attention(const pdp__layer *l, bool input_grad)
{
    double T = (double)l->in_shape[0], C = (double)l->out_shape[1], H = (double)l->heads;
    return 4.0 * T * T * C + (input_grad ? 8.0 * T * T * C : 0.0) + 8.0 * H * T * T;
}
/* the residual's add forward (ResidualAdd) and backward (Residual) */
PDP__PRIVATE double pdp__flops_residual(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 0, 0, 1);
}
PDP__PRIVATE double pdp__flops_residual_add(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 1, 0, 0);
}
/* the same GEMMs over im2col: out_count outputs, each a dot of C k k */
PDP__PRIVATE double pdp__flops_conv(const pdp__layer *l, bool input_grad)
{
    double gemm = 2.0 * (double)l->out_count * (double)(l->in_shape[0] * l->kernel * l->kernel);
    return (input_grad ? 3.0 : 2.0) * gemm + 2.0 * (double)l->out_count;
}
/* k k compares an output; the backward adds each output's gradient at its winner */
PDP__PRIVATE double pdp__flops_maxpool(const pdp__layer *l, bool input_grad)
{
    return (double)l->out_count * ((double)(l->kernel * l->kernel) + (input_grad ? 1.0 : 0.0));
}
/* the element-wise kinds: math.h's forward, then its gradient */
PDP__PRIVATE double pdp__flops_relu(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 1, 0, 1);
}
PDP__PRIVATE double pdp__flops_gelu(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 9, 0, 19);
}
PDP__PRIVATE double pdp__flops_tanh(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 1, 0, 3);
}
PDP__PRIVATE double pdp__flops_sigmoid(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 4, 0, 3);
}
PDP__PRIVATE double pdp__flops_silu(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 5, 0, 9);
}
PDP__PRIVATE double pdp__flops_gelu_erf(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 8, 0, 14);
}
/* the mask's compare and scale; the backward's scale */
PDP__PRIVATE double pdp__flops_dropout(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 2, 0, 1);
}
/* mean, variance, normalise, affine; the affine's gradients, then the input's */
PDP__PRIVATE double pdp__flops_layernorm(const pdp__layer *l, bool g)
{
    return pdp__flops_each(l, g, 8, 3, 8);
}

/* ---- layers_table: the table ---- */

/* C++ (the implementation compiled as C++, or by nvcc) has no array designators: there
   the entries go by their order, which must be pdp__layer_kind's (tests/test_build_cxx.sh
   compares every kind's name in a C++ build with a C build's) */
#ifdef __cplusplus
#  define PDP__KIND(k)
#else
#  define PDP__KIND(k) [k] =
#endif

/* name, setup, init, forward, backward, cuda_forward, cuda_backward, cuda_work, flags, flops */
PDP__PRIVATE const pdp__layer_kind_info pdp__layer_kinds[PDP__LAYER_KIND_COUNT] = {
    PDP__KIND(PDP__LINEAR){"Linear", pdp__linear_setup, pdp__linear_init, pdp__linear_forward,
                           pdp__linear_backward, PDP__CUDA_ENTRY(pdp__linear_cuda_forward),
                           PDP__CUDA_ENTRY(pdp__linear_cuda_backward), NULL,
                           PDP__LAYER_FUSES_RELU | PDP__LAYER_FUSES_GELU, pdp__flops_linear},
    PDP__KIND(PDP__RELU){"ReLU", pdp__layers_setup_same, NULL, pdp__relu_forward,
                         pdp__relu_backward, PDP__CUDA_ENTRY(pdp__relu_cuda_forward),
                         PDP__CUDA_ENTRY(pdp__relu_cuda_backward), NULL,
                         PDP__LAYER_ELEMENTWISE | PDP__LAYER_FUSABLE_RELU, pdp__flops_relu},
    PDP__KIND(PDP__GELU){"GELU", pdp__layers_setup_same, NULL, pdp__gelu_forward,
                         pdp__gelu_backward, PDP__CUDA_ENTRY(pdp__gelu_cuda_forward),
                         PDP__CUDA_ENTRY(pdp__gelu_cuda_backward), NULL,
                         PDP__LAYER_ELEMENTWISE | PDP__LAYER_FUSABLE_GELU, pdp__flops_gelu},
    PDP__KIND(PDP__TANH){"Tanh", pdp__layers_setup_same, NULL, pdp__tanh_forward,
                         pdp__tanh_backward, PDP__CUDA_ENTRY(pdp__tanh_cuda_forward),
                         PDP__CUDA_ENTRY(pdp__tanh_cuda_backward), NULL, PDP__LAYER_ELEMENTWISE,
                         pdp__flops_tanh},
    PDP__KIND(PDP__SIGMOID){"Sigmoid", pdp__layers_setup_same, NULL, pdp__sigmoid_forward,
                            pdp__sigmoid_backward, PDP__CUDA_ENTRY(pdp__sigmoid_cuda_forward),
                            PDP__CUDA_ENTRY(pdp__sigmoid_cuda_backward), NULL,
                            PDP__LAYER_ELEMENTWISE, pdp__flops_sigmoid},
    PDP__KIND(PDP__DROPOUT){"Dropout", pdp__dropout_setup, NULL, pdp__dropout_forward,
                            pdp__dropout_backward, PDP__CUDA_ENTRY(pdp__dropout_cuda_forward),
                            PDP__CUDA_ENTRY(pdp__dropout_cuda_backward), NULL, 0,
                            pdp__flops_dropout},
    PDP__KIND(PDP__LAYERNORM){"LayerNorm", pdp__layernorm_setup, pdp__layernorm_init,
                              pdp__layernorm_forward, pdp__layernorm_backward,
                              PDP__CUDA_ENTRY(pdp__layernorm_cuda_forward),
                              PDP__CUDA_ENTRY(pdp__layernorm_cuda_backward), NULL, 0,
                              pdp__flops_layernorm},
    PDP__KIND(PDP__CONV2D){"Conv2d", pdp__conv_setup, pdp__conv_init, pdp__conv_forward,
                           pdp__conv_backward, PDP__CUDA_ENTRY(pdp__conv_cuda_forward),
                           PDP__CUDA_ENTRY(pdp__conv_cuda_backward), pdp__conv_cuda_work,
                           PDP__LAYER_FUSES_RELU | PDP__LAYER_FUSES_POOL, pdp__flops_conv},
    PDP__KIND(PDP__MAXPOOL2D){"MaxPool2d", pdp__maxpool_setup, NULL, pdp__maxpool_forward,
                              pdp__maxpool_backward, PDP__CUDA_ENTRY(pdp__maxpool_cuda_forward),
                              PDP__CUDA_ENTRY(pdp__maxpool_cuda_backward), NULL,
                              PDP__LAYER_FUSABLE_POOL, pdp__flops_maxpool},
    PDP__KIND(PDP__FLATTEN){"Flatten", pdp__flatten_setup, NULL, pdp__flatten_forward,
                            pdp__flatten_backward, PDP__CUDA_ENTRY(pdp__flatten_cuda_forward),
                            PDP__CUDA_ENTRY(pdp__flatten_cuda_backward), NULL, PDP__LAYER_VIEW,
                            NULL},
    /* tensor parallel (tp.c): f and g run their collective on every device; the split
       Linears are Linear's kernels on this rank's slice */
    PDP__KIND(PDP__TP_COPY){"CopyToModelParallelRegion", pdp__tp_copy_setup, NULL,
                            pdp__tp_copy_forward, pdp__tp_copy_backward, NULL, NULL, NULL,
                            PDP__LAYER_COLLECTIVE | PDP__LAYER_UNNUMBERED, NULL},
    PDP__KIND(PDP__COLUMN_PARALLEL_LINEAR){
        "ColumnParallelLinear", pdp__tp_column_setup, pdp__tp_column_init, pdp__linear_forward,
        pdp__tp_column_backward, PDP__CUDA_ENTRY(pdp__linear_cuda_forward),
        PDP__CUDA_ENTRY(pdp__tp_column_cuda_backward), NULL, 0, pdp__flops_linear},
    PDP__KIND(PDP__ROW_PARALLEL_LINEAR){"RowParallelLinear", pdp__tp_row_setup, pdp__tp_row_init,
                                        pdp__tp_row_forward, pdp__linear_backward,
                                        PDP__CUDA_ENTRY(pdp__tp_row_cuda_forward),
                                        PDP__CUDA_ENTRY(pdp__linear_cuda_backward), NULL, 0,
                                        pdp__flops_linear},
    PDP__KIND(PDP__TP_REDUCE){"ReduceFromModelParallelRegion", pdp__tp_reduce_setup, NULL,
                              pdp__tp_reduce_forward, pdp__tp_reduce_backward, NULL, NULL, NULL,
                              PDP__LAYER_COLLECTIVE | PDP__LAYER_UNNUMBERED, NULL},
    /* kinds added since, in the enum's order */
    PDP__KIND(PDP__SILU){"SiLU", pdp__layers_setup_same, NULL, pdp__silu_forward,
                         pdp__silu_backward, PDP__CUDA_ENTRY(pdp__silu_cuda_forward),
                         PDP__CUDA_ENTRY(pdp__silu_cuda_backward), NULL, PDP__LAYER_ELEMENTWISE,
                         pdp__flops_silu},
    /* a GPT's kinds (layers_gpt.c); TiedLinear runs Linear's CUDA entries */
    PDP__KIND(PDP__EMBEDDING){"Embedding", pdp__embedding_setup, pdp__embedding_init,
                              pdp__embedding_forward, pdp__embedding_backward,
                              PDP__CUDA_ENTRY(pdp__embedding_cuda_forward),
                              PDP__CUDA_ENTRY(pdp__embedding_cuda_backward),
                              pdp__embedding_cuda_work, PDP__LAYER_TAKES_IDS,
                              pdp__flops_embedding},
    PDP__KIND(PDP__CAUSAL_SELF_ATTENTION){"CausalSelfAttention", pdp__attention_setup, NULL,
                                          pdp__attention_layer_forward,
                                          pdp__attention_layer_backward,
                                          PDP__CUDA_ENTRY(pdp__attention_cuda_forward),
                                          PDP__CUDA_ENTRY(pdp__attention_cuda_backward), NULL,
                                          PDP__LAYER_HEADWISE, pdp__flops_attention},
    PDP__KIND(PDP__RESIDUAL){"Residual", pdp__layers_setup_same, NULL, pdp__residual_forward,
                             pdp__residual_backward, PDP__CUDA_ENTRY(pdp__residual_cuda_forward),
                             PDP__CUDA_ENTRY(pdp__residual_cuda_backward), NULL,
                             PDP__LAYER_FORWARD_VIEW | PDP__LAYER_SKIP | PDP__LAYER_UNNUMBERED,
                             pdp__flops_residual},
    PDP__KIND(PDP__RESIDUAL_ADD){"ResidualAdd", pdp__layers_setup_same, NULL,
                                 pdp__residual_add_forward, pdp__residual_add_backward,
                                 PDP__CUDA_ENTRY(pdp__residual_add_cuda_forward),
                                 PDP__CUDA_ENTRY(pdp__residual_add_cuda_backward), NULL,
                                 PDP__LAYER_SKIP | PDP__LAYER_UNNUMBERED,
                                 pdp__flops_residual_add},
    PDP__KIND(PDP__TIED_LINEAR){"TiedLinear", pdp__tied_linear_setup, NULL, pdp__linear_forward,
                                pdp__linear_backward, PDP__CUDA_ENTRY(pdp__linear_cuda_forward),
                                PDP__CUDA_ENTRY(pdp__linear_cuda_backward), NULL,
                                PDP__LAYER_TIED, pdp__flops_tied_linear},
    /* sequence parallel (tp.c; layers_tp.c): collectives on every device, as f and g */
    PDP__KIND(PDP__SEQ_SCATTER){"ScatterToSequenceParallelRegion", pdp__tp_seq_setup, NULL,
                                pdp__tp_seq_scatter_forward, pdp__tp_seq_scatter_backward, NULL,
                                NULL, NULL, PDP__LAYER_COLLECTIVE | PDP__LAYER_UNNUMBERED, NULL},
    PDP__KIND(PDP__SEQ_GATHER){"GatherFromSequenceParallelRegion", pdp__tp_seq_setup, NULL,
                               pdp__tp_seq_gather_forward, pdp__tp_seq_gather_backward, NULL,
                               NULL, NULL, PDP__LAYER_COLLECTIVE | PDP__LAYER_UNNUMBERED, NULL},
    PDP__KIND(PDP__SEQ_REDUCE_SCATTER){"ReduceScatterToSequenceParallelRegion",
                                       pdp__tp_seq_setup, NULL,
                                       pdp__tp_seq_reduce_scatter_forward,
                                       pdp__tp_seq_scatter_backward, NULL, NULL, NULL,
                                       PDP__LAYER_COLLECTIVE | PDP__LAYER_UNNUMBERED, NULL},
    PDP__KIND(PDP__GELU_ERF){"GELUErf", pdp__layers_setup_same, NULL, pdp__gelu_erf_forward,
                             pdp__gelu_erf_backward,
                             PDP__CUDA_ENTRY(pdp__gelu_erf_cuda_forward),
                             PDP__CUDA_ENTRY(pdp__gelu_erf_cuda_backward), NULL,
                             PDP__LAYER_ELEMENTWISE, pdp__flops_gelu_erf},
};

/* The entry of kind k; NULL for a value outside the table. */
PDP__PRIVATE const pdp__layer_kind_info *pdp__layer_kind_of(pdp__layer_kind k)
{
    return (unsigned)k < PDP__LAYER_KIND_COUNT ? &pdp__layer_kinds[k] : NULL;
}

PDP__PRIVATE const char *pdp__layer_kind_name(pdp__layer_kind k)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(k);
    return info && info->name ? info->name : "?";
}

/* "ReLU, GELU, Tanh, Sigmoid": the names of the kinds with flag, in table order, for
   messages that say which kinds a place accepts. */
PDP__PRIVATE const char *pdp__layer_kinds_with(unsigned flag, char *buf, size_t cap)
{
    size_t n = 0;
    int k;
    if (cap) buf[0] = '\0';
    for (k = 0; k < PDP__LAYER_KIND_COUNT && n < cap; k++)
        if (pdp__layer_kinds[k].flags & flag)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "",
                                  pdp__layer_kinds[k].name);
    return buf;
}

/* ---- layers_table: setup and initialisation ---- */

PDP__PRIVATE pdp_status pdp__layer_setup(pdp__layer *l, pdp__param_shapes *ps)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    char in[64];
    pdp_status st;
    memset(ps, 0, sizeof *ps);
    if (!info || !info->setup)
        return pdp__err(PDP_ERR_INVALID, "unknown layer kind %d", (int)l->kind);
    pdp__layers_dims_str(l->in_ndim, l->in_shape, in, sizeof in);
    l->out_ndim = l->in_ndim;
    memcpy(l->out_shape, l->in_shape, sizeof l->out_shape);
    l->saved_per_sample = 0;
    l->work_per_sample = 0;
    if ((st = info->setup(l, ps, in)) != PDP_OK) return st;
    if (l->out_ndim == 1) l->out_shape[1] = l->out_shape[2] = 1;
    l->out_count = l->out_shape[0] * l->out_shape[1] * l->out_shape[2];
    return PDP_OK;
}

PDP__PRIVATE void pdp__layer_init_params(const pdp__layer *l, float *w, float *b, pdp_rng *r)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (info && info->init) info->init(l, w, b, r);
}

/* Workspace floats per sample a layer needs on device d: the CPU's algorithm sizes
   its own (setup); on CUDA the larger of that and the kind's CUDA kernels' need. */
PDP__PRIVATE int64_t pdp__layer_work_per_sample(const pdp__layer *l, pdp_device d)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (d.kind == PDP_DEVICE_CUDA && info && info->cuda_work)
        return PDP__MAX(l->work_per_sample, info->cuda_work(l));
    return l->work_per_sample;
}

/* The kind's FLOPs estimate per sample (work estimates, above); 0 without one. */
PDP__PRIVATE double pdp__layer_flops(const pdp__layer *l, bool input_grad)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    return info && info->flops ? info->flops(l, input_grad) : 0.0;
}

/* ---- layers_table: forward and backward ---- */

/* A CUDA entry's call: pdp_cuda.cu's message on failure; without the entry (or
   without PDP_CUDA), PDP_ERR_UNSUPPORTED. */
PDP__PRIVATE pdp_status pdp__layer_cuda(const pdp__layer *l, const pdp__layer_io *io,
                                        pdp_status (*fn)(const pdp__layer *, const pdp__layer_io *))
{
#ifdef PDP_CUDA
    pdp_status st;
    if (!fn)
        return pdp__err(PDP_ERR_UNSUPPORTED, "%s has no CUDA kernel (CUDA device %d)",
                        pdp__layer_kind_name(l->kind), io->device.ordinal);
    if ((st = fn(l, io)) != PDP_OK) return pdp__err(st, "pdp_cuda: %s", pdp_cudak_error());
    return PDP_OK;
#else
    (void)l, (void)fn;
    return pdp__err(PDP_ERR_UNSUPPORTED, "CUDA device %d: built without PDP_CUDA (compile with "
                    "-DPDP_CUDA and link pdp_cuda.o)", io->device.ordinal);
#endif
}

/* CUDA memory goes to the kind's CUDA entry (pdp_cuda.cu's kernels); the rest is
   CPU memory. A collective kind's host entry runs on every device. Either entry's
   status comes back as it is (the caller names the layer). */
PDP__PRIVATE pdp_status pdp__layer_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (!info) return pdp__err(PDP_ERR_INVALID, "unknown layer kind %d", (int)l->kind);
    if (io->device.kind == PDP_DEVICE_CUDA && !(info->flags & PDP__LAYER_COLLECTIVE))
        return pdp__layer_cuda(l, io, info->cuda_forward);
    return info->forward(l, io);
}

PDP__PRIVATE pdp_status pdp__layer_backward_on(const pdp__layer *l, const pdp__layer_io *io)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (!info) return pdp__err(PDP_ERR_INVALID, "unknown layer kind %d", (int)l->kind);
    if (io->device.kind == PDP_DEVICE_CUDA && !(info->flags & PDP__LAYER_COLLECTIVE))
        return pdp__layer_cuda(l, io, info->cuda_backward);
    return info->backward(l, io);
}

/* A layer with parameters on a slice of the sequence (sequence parallel: a LayerNorm
   between TP blocks) has its gradients summed over the TP ranks' slices (layers_tp.c). */
PDP__PRIVATE pdp_status pdp__layer_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    if (l->tp_seq && l->nparams > 0) return pdp__tp_seq_backward(l, io, pdp__layer_backward_on);
    return pdp__layer_backward_on(l, io);
}
