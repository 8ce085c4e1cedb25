/* layers_table: the table of layer kinds and the dispatch through it. One entry per
   kind (KANN's op table, kad_op_list, is the model): its name, setup (shape
   inference and validation, parameter shapes, saved and workspace floats),
   parameter initialisation, CPU forward and backward, CUDA forward and backward
   (pdp_cuda.cu's kernels), extra workspace on CUDA, and flags that model.c plans
   with (a view; fuses a following ReLU). Nothing else in pdp switches over kinds:
   model.c, dp.c and the executors go through pdp__layer_setup, pdp__layer_forward
   and the other functions below, once per layer call (never per element).

   Adding a layer kind takes:
   1. its code in layers.c (or a file of its own, listed in amalgamate.py before
      this one, as layers_conv.c): setup, forward and backward, init when it has
      parameters, and its CUDA entries under #ifdef PDP_CUDA (see layers.c's
      conventions);
   2. its value in pdp__layer_kind (internal.h) and its entry below;
   3. its public constructor pdp_model_add_<kind> (model.h, model.c);
   4. for CUDA: its kernels and their plain C functions in pdp_cuda.cu, declared in
      cuda.h, and the same functions in tests/fake_cuda/fake_cuda.c, where each is a
      few lines that rebuild the layer and run pdp's CPU entry through fake__layer.
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

/* ---- layers_table: the table ---- */

/* name, setup, init, forward, backward, cuda_forward, cuda_backward, cuda_work, flags */
PDP__PRIVATE const pdp__layer_kind_info pdp__layer_kinds[PDP__LAYER_KIND_COUNT] = {
    [PDP__LINEAR] = {"Linear", pdp__linear_setup, pdp__linear_init, pdp__linear_forward,
                     pdp__linear_backward, PDP__CUDA_ENTRY(pdp__linear_cuda_forward),
                     PDP__CUDA_ENTRY(pdp__linear_cuda_backward), NULL, 0},
    [PDP__RELU] = {"ReLU", pdp__layers_setup_same, NULL, pdp__relu_forward, pdp__relu_backward,
                   PDP__CUDA_ENTRY(pdp__relu_cuda_forward),
                   PDP__CUDA_ENTRY(pdp__relu_cuda_backward), NULL, 0},
    [PDP__GELU] = {"GELU", pdp__layers_setup_same, NULL, pdp__gelu_forward, pdp__gelu_backward,
                   PDP__CUDA_ENTRY(pdp__gelu_cuda_forward),
                   PDP__CUDA_ENTRY(pdp__gelu_cuda_backward), NULL, 0},
    [PDP__TANH] = {"Tanh", pdp__layers_setup_same, NULL, pdp__tanh_forward, pdp__tanh_backward,
                   PDP__CUDA_ENTRY(pdp__tanh_cuda_forward),
                   PDP__CUDA_ENTRY(pdp__tanh_cuda_backward), NULL, 0},
    [PDP__SIGMOID] = {"Sigmoid", pdp__layers_setup_same, NULL, pdp__sigmoid_forward,
                      pdp__sigmoid_backward, PDP__CUDA_ENTRY(pdp__sigmoid_cuda_forward),
                      PDP__CUDA_ENTRY(pdp__sigmoid_cuda_backward), NULL, 0},
    [PDP__DROPOUT] = {"Dropout", pdp__dropout_setup, NULL, pdp__dropout_forward,
                      pdp__dropout_backward, PDP__CUDA_ENTRY(pdp__dropout_cuda_forward),
                      PDP__CUDA_ENTRY(pdp__dropout_cuda_backward), NULL, 0},
    [PDP__LAYERNORM] = {"LayerNorm", pdp__layernorm_setup, pdp__layernorm_init,
                        pdp__layernorm_forward, pdp__layernorm_backward,
                        PDP__CUDA_ENTRY(pdp__layernorm_cuda_forward),
                        PDP__CUDA_ENTRY(pdp__layernorm_cuda_backward), NULL, 0},
    [PDP__CONV2D] = {"Conv2d", pdp__conv_setup, pdp__conv_init, pdp__conv_forward,
                     pdp__conv_backward, PDP__CUDA_ENTRY(pdp__conv_cuda_forward),
                     PDP__CUDA_ENTRY(pdp__conv_cuda_backward), pdp__conv_cuda_work,
                     PDP__LAYER_FUSES_RELU | PDP__LAYER_FUSES_POOL},
    [PDP__MAXPOOL2D] = {"MaxPool2d", pdp__maxpool_setup, NULL, pdp__maxpool_forward,
                        pdp__maxpool_backward, PDP__CUDA_ENTRY(pdp__maxpool_cuda_forward),
                        PDP__CUDA_ENTRY(pdp__maxpool_cuda_backward), NULL, 0},
    [PDP__FLATTEN] = {"Flatten", pdp__flatten_setup, NULL, pdp__flatten_forward,
                      pdp__flatten_backward, PDP__CUDA_ENTRY(pdp__flatten_cuda_forward),
                      PDP__CUDA_ENTRY(pdp__flatten_cuda_backward), NULL, PDP__LAYER_VIEW},
    /* tensor parallel (tp.c): f and g run their collective on every device; the split
       Linears are Linear's kernels on this rank's slice */
    [PDP__TP_COPY] = {"CopyToModelParallelRegion", pdp__tp_copy_setup, NULL,
                      pdp__tp_copy_forward, pdp__tp_copy_backward, NULL, NULL, NULL,
                      PDP__LAYER_COLLECTIVE | PDP__LAYER_UNNUMBERED},
    [PDP__COLUMN_PARALLEL_LINEAR] = {"ColumnParallelLinear", pdp__tp_column_setup,
                                     pdp__tp_column_init, pdp__linear_forward,
                                     pdp__tp_column_backward,
                                     PDP__CUDA_ENTRY(pdp__linear_cuda_forward),
                                     PDP__CUDA_ENTRY(pdp__tp_column_cuda_backward), NULL, 0},
    [PDP__ROW_PARALLEL_LINEAR] = {"RowParallelLinear", pdp__tp_row_setup, pdp__tp_row_init,
                                  pdp__tp_row_forward, pdp__linear_backward,
                                  PDP__CUDA_ENTRY(pdp__tp_row_cuda_forward),
                                  PDP__CUDA_ENTRY(pdp__linear_cuda_backward), NULL, 0},
    [PDP__TP_REDUCE] = {"ReduceFromModelParallelRegion", pdp__tp_reduce_setup, NULL,
                        pdp__tp_reduce_forward, pdp__tp_reduce_backward, NULL, NULL, NULL,
                        PDP__LAYER_COLLECTIVE | PDP__LAYER_UNNUMBERED},
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

/* A PDP__LAYER_COLLECTIVE kind's call, on any device: its failure comes back through
   io->status, pointed at a variable of this call. */
PDP__PRIVATE pdp_status pdp__layer_collective(const pdp__layer *l, const pdp__layer_io *io,
                                              void (*fn)(const pdp__layer *, const pdp__layer_io *))
{
    pdp_status st = PDP_OK;
    pdp__layer_io run = *io;
    run.status = &st;
    fn(l, &run);
    return st;
}

/* CUDA memory goes to the kind's CUDA entry (pdp_cuda.cu's kernels); the rest is
   CPU memory. A collective kind's host entry runs on every device. */
PDP__PRIVATE pdp_status pdp__layer_forward(const pdp__layer *l, const pdp__layer_io *io)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (!info) return pdp__err(PDP_ERR_INVALID, "unknown layer kind %d", (int)l->kind);
    if (info->flags & PDP__LAYER_COLLECTIVE) return pdp__layer_collective(l, io, info->forward);
    if (io->device.kind == PDP_DEVICE_CUDA) return pdp__layer_cuda(l, io, info->cuda_forward);
    info->forward(l, io);
    return PDP_OK;
}

PDP__PRIVATE pdp_status pdp__layer_backward(const pdp__layer *l, const pdp__layer_io *io)
{
    const pdp__layer_kind_info *info = pdp__layer_kind_of(l->kind);
    if (!info) return pdp__err(PDP_ERR_INVALID, "unknown layer kind %d", (int)l->kind);
    if (info->flags & PDP__LAYER_COLLECTIVE) return pdp__layer_collective(l, io, info->backward);
    if (io->device.kind == PDP_DEVICE_CUDA) return pdp__layer_cuda(l, io, info->cuda_backward);
    info->backward(l, io);
    return PDP_OK;
}
