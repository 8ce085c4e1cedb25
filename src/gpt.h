/* gpt: a GPT built from the layer table's kinds, with nanoGPT's architecture and
   state_dict names, and text generation from it.

   pdp_gpt_create builds, as one sequential model (model.h), GPT-2's architecture as
   nanoGPT writes it (Radford et al., 2019; nanoGPT's model.py):

       layer                          parameters (nanoGPT's names)
       Embedding                      transformer.wte.weight [vocab, dim]   tokens
                                      transformer.wpe.weight [context, dim] positions
       Dropout (dropout > 0 only)
       per block i, two residual regions (model.h: pdp_model_residual_begin/end):
         Residual                     x = x + attn(ln_1(x)), where the residual is added
           LayerNorm                  transformer.h.i.ln_1.weight, .bias [dim]
           Linear dim -> 3 dim        transformer.h.i.attn.c_attn.weight [3 dim, dim], .bias
           CausalSelfAttention        (heads; the causal mask and softmax: layers_gpt.c)
           Linear dim -> dim          transformer.h.i.attn.c_proj.weight [dim, dim], .bias
           Dropout (dropout > 0 only)
         ResidualAdd
         Residual                     x = x + mlp(ln_2(x))
           LayerNorm                  transformer.h.i.ln_2.weight, .bias
           Linear dim -> 4 dim        transformer.h.i.mlp.c_fc.weight [4 dim, dim], .bias
           GELU (tanh form)           GPT-2's and llm.c's; desc.gelu_erf: the exact form,
                                      nanoGPT's nn.GELU()
           Linear 4 dim -> dim        transformer.h.i.mlp.c_proj.weight [dim, 4 dim], .bias
           Dropout (dropout > 0 only)
         ResidualAdd
       LayerNorm                      transformer.ln_f.weight, .bias
       TiedLinear dim -> vocab        lm_head: transformer.wte.weight itself (tied)

   Its input is int32 ids [batch, T] (T = desc.sequence), its output logits [batch, T,
   vocab]; pdp_model_forward_backward takes targets [batch, T] (-1 ignored). The
   parameters are initialised as GPT-2 and nanoGPT do: every Linear weight and both
   embeddings N(0, 0.02), each c_proj weight N(0, 0.02 / sqrt(2 layers)), biases 0,
   LayerNorms 1 and 0, drawn from desc.seed.

   Checkpoints: pdp_checkpoint_save writes nanoGPT's names, the tied head once, as
   transformer.wte.weight (safetensors refuses two names for one tensor; PyTorch loads the
   file after sd["lm_head.weight"] = sd["transformer.wte.weight"]). A nanoGPT state_dict
   saved as safetensors loads with no renaming: lm_head.weight, when present, is read as
   the alias of transformer.wte.weight (and must equal it bit for bit), and the
   transformer.h.i.attn.bias causal-mask buffers nanoGPT keeps on torch < 2.0 hold no
   parameter: each is checked to be exactly the mask, then skipped (checkpoint.h). */

typedef struct pdp_gpt_desc {
    int64_t vocab;           /* tokens; default 256 (bytes: pdp_token_dataset) */
    int64_t context;         /* positions of wpe (nanoGPT's block_size); required */
    int64_t sequence;        /* T of every input, <= context; default context */
    int layers;              /* blocks (n_layer); required */
    int heads;               /* attention heads (n_head); must divide dim; required */
    int64_t dim;             /* channels (n_embd); required */
    float dropout;           /* after the embedding, on the attention probabilities and at
                                the end of each branch, in [0, 1); default 0 */
    uint64_t seed;           /* initialisation and dropout masks; default 0 */
    pdp_device device;       /* default CPU; pdp_cuda(i): every layer runs in pdp_cuda.cu */
    pdp_precision precision; /* as pdp_model_desc.precision */
    pdp_recompute recompute; /* as pdp_model_desc.recompute: SELECTIVE keeps no attention
                                probabilities, FULL keeps each residual region's input only */
    struct pdp_comm *tp;     /* tensor parallel (Megatron's blocks, tp.h): each block's
                                c_attn column-parallel with q, k and v split by heads, the
                                attention of this rank's heads, attn.c_proj row-parallel,
                                the MLP as tp.h's; LayerNorms, embeddings and the head
                                replicated. heads must divide by its size. NULL: none */
    bool sequence_parallel;  /* with tp: sequence parallelism (Korthikanti et al. 2022): the
                                residual stream, LayerNorms and dropouts between the TP
                                blocks hold T / N positions a rank (sequence must divide by
                                the TP size); f and g become an all-gather and a
                                reduce-scatter of the sequence. Default false */
    bool gelu_erf;           /* the MLP's GELU in its exact form (erf: nanoGPT's nn.GELU(),
                                so a nanoGPT checkpoint gives nanoGPT's logits); default
                                false: the tanh form (GPT-2's, llm.c's) */
} pdp_gpt_desc;

/* Builds the GPT described above into *out (free it with pdp_model_free). A field out of
   range fails with PDP_ERR_INVALID naming it. With desc.tp, every rank of it calls this
   with the same desc; each block is then

       Residual, LayerNorm ln_1, f, ColumnParallelLinear c_attn (3 dim: q, k and v each
       split by heads), CausalSelfAttention (this rank's heads), RowParallelLinear
       attn.c_proj, g, [Dropout], ResidualAdd,
       Residual, LayerNorm ln_2, f, ColumnParallelLinear c_fc, GELU, RowParallelLinear
       mlp.c_proj, g, [Dropout], ResidualAdd

   (4 all-reduces of batch x T x dim floats a block and step: g forward, f backward, twice),
   and its parameters start as the single-device GPT's slices (the full GPT is built and
   cut), so it trains as one device does up to float rounding. Its checkpoints are
   pdp_tp_checkpoint_save/load's, the single-device GPT's file.

   With desc.sequence_parallel (Megatron-LM's sequence parallelism) the model is

       Embedding, ScatterToSequenceParallelRegion (this rank's T / N positions), [Dropout],
       per block: Residual, LayerNorm ln_1, f = GatherFromSequenceParallelRegion (all-gather
       of the sequence; backward reduce-scatter), c_attn, attention, attn.c_proj, g =
       ReduceScatterToSequenceParallelRegion (reduce-scatter; backward all-gather),
       [Dropout], ResidualAdd, and the same for the MLP;
       LayerNorm ln_f, GatherFromSequenceParallelRegion (backward: this rank's slice),
       TiedLinear

   so every layer between the TP blocks (residuals, LayerNorms, Dropouts) holds B x T / N
   x dim activations, N times fewer. The collectives per block and step move the bytes of
   TP's 4 all-reduces (an all-reduce is a reduce-scatter and an all-gather): 4 all-gathers
   and 4 reduce-scatters of batch x T x dim floats, plus one all-gather for the head
   (forward) and one for the embedding (backward). The replicated head and loss run on the
   whole sequence on every rank. Each LayerNorm's weight and bias gradients, computed on a
   rank's positions, are summed over the TP ranks in backward (one small all-reduce a
   LayerNorm), so every rank steps the same values and clipping counts them once (on TP
   rank 0, as every replicated tensor). Dropout masks are keyed by the global position:
   the single device's masks. */
PDP_API pdp_status pdp_gpt_create(pdp_model **out, const pdp_gpt_desc *desc);
/* The parameters of the GPT desc describes, counted from its sizes before anything is built
   (nanoGPT's get_num_params with the position embedding, the head tied): vocab dim +
   context dim + layers (12 dim^2 + 13 dim) + 2 dim, vocab 0 read as 256. The whole model's
   count, which desc.tp splits over its ranks (pdp_model_param_count of a rank's model is its
   slices'). 0 for a NULL desc or a context, layers or dim below 1. */
PDP_API int64_t pdp_gpt_param_count(const pdp_gpt_desc *desc);

/* desc as one line a program prints above its run, into buf (NUL ended): the sizes, the
   fields that differ from their defaults (vocab 256, sequence = context, dropout 0), the
   whole model's parameters (pdp_gpt_param_count), desc->tp's size (and "+ SP" with
   sequence parallelism), the precision (bf16 on the CPU with the path its products take,
   pdp_bf16_best_path) and the recomputation:
       GPT 4 layers, 4 heads, dim 96, context 64: 478272 parameters, fp32, recompute none
       GPT 2 layers, 4 heads, dim 48, context 16, vocab 67, dropout 0.1: 60624 parameters,
       TP 2 + SP, bf16 amx-bf16, recompute selective
   PDP_ERR_INVALID naming the call for a NULL argument, a desc pdp_gpt_create refuses before
   it builds anything (the same checks, the same reasons: sizes, sequence past context,
   heads not dividing dim or the TP size, dropout, recompute, precision, sequence
   parallelism without TP) or a buf too short. examples/train_gpt.c prints it. */
PDP_API pdp_status pdp_gpt_desc_format(const pdp_gpt_desc *desc, char *buf, size_t bytes);

/* Text generation (nanoGPT's generate): appends n_new tokens to ids[0..n) (ids holds room
   for n + n_new), each drawn from the model's next-token distribution at the last
   position: logits / temperature, only the top_k largest kept (top_k 0: all), softmax,
   one draw from r. The model sees the last T tokens (T = its input length); a shorter
   prefix is padded after its end, which the causal mask keeps from changing any earlier
   output. temperature 0 picks the largest logit (greedy). Runs in evaluation mode and
   restores the mode. On a GPU the window goes there and the logits [1, T, vocab] come back
   each token; under desc.tp every TP rank calls it with the same r (each forward is
   collective). */
PDP_API pdp_status pdp_gpt_generate(pdp_model *m, int32_t *ids, int64_t n, int64_t n_new,
                                    float temperature, int top_k, pdp_rng *r);

/* pdp_gpt_generate from a text, for a byte-level GPT (vocab 256, pdp_token_dataset's bytes):
   the prompt's bytes (at least one), then n_new bytes drawn as pdp_gpt_generate draws them
   (the same r, the same bytes), written into buf as text a terminal shows: newline and tab
   as they are, every other control byte (0-31, 127) as '?', NUL ended. bytes must hold
   strlen(prompt) + n_new + 1. PDP_ERR_INVALID names the call for a NULL argument, another
   vocabulary, an empty prompt, a negative n_new or a short buf; otherwise fails as
   pdp_gpt_generate does (under desc.tp, every TP rank calls it with the same r). Allocates
   the ids for the call. examples/train_gpt.c prints its sample with it. */
PDP_API pdp_status pdp_gpt_generate_text(pdp_model *m, const char *prompt, int64_t n_new,
                                         float temperature, int top_k, pdp_rng *r, char *buf,
                                         size_t bytes);

/* ---- gpt: evaluation and the reports ---- */

/* The mean cross-entropy of m over `batches` batches of `batch` windows of ds's split
   (ds->context must be m's T), drawn from a pdp_rng seeded (seed, 0), so every call sees
   the same windows; in evaluation mode (no dropout), the mode restored. m may be on any
   device (the ids go there, the logits come back) and split by desc.tp or ZeRO-3: every
   rank of those calls it, each forward being collective. Allocates 2 batch T ids, and off
   the CPU a device buffer of them and batch T vocab floats, for the call: reserve m for
   batch sequences (pdp_model_reserve) and its forwards allocate nothing. */
PDP_API pdp_status pdp_gpt_evaluate(pdp_model *m, const pdp_token_dataset *ds, pdp_split split,
                                    int64_t batch, int batches, uint64_t seed, float *loss);

/* One block's activations on this rank, its first block's layers (Residual through the
   second ResidualAdd) at batch sequences, as a table written into buf (bytes long, NUL
   ended; PDP_ERR_INVALID when it does not fit): Megatron-LM's formulas (Korthikanti et
   al. 2022, "Reducing Activation Recomputation in Large Transformer Models", sec. 4 and
   Table 2) for desc's TP size and sequence parallelism and each recomputation mode, in
   bytes per s b h (s the sequence, b the batch, h dim, a heads, t the TP size) and MB, at
   16 bits with 1-byte masks and with the same tensors in fp32 (masks and dropped scores
   only when desc->dropout > 0); then pdp's count in desc->recompute, each layer's kept
   bytes from the layer table (pdp_model_activation_bytes) and their sum, and what pdp
   keeps that Megatron does not count. m is pdp_gpt_create(desc)'s model on this rank.
   *block_bytes (may be NULL): the block's kept bytes. examples/train_gpt.c prints it;
   tests/test_gpt.c holds the sum to a count by hand. */
PDP_API pdp_status pdp_gpt_activation_report(const pdp_model *m, const pdp_gpt_desc *desc,
                                             int64_t batch, char *buf, size_t bytes,
                                             int64_t *block_bytes);

/* The TP traffic of a step (s: pdp_tp_get_stats of the step alone, from a rank of a
   pdp_gpt_create(desc) model with desc->tp) beside the formula, a line (SP: two) into buf
   (PDP_ERR_INVALID when it does not fit): per block f and g, forward and backward, 4
   all-reduces of batch T dim floats (FULL recomputation: the regions' forwards again, 6);
   under sequence parallelism each all-reduce moves as a reduce-scatter and an all-gather,
   with the head's and the embedding's gathers (8L + 2, FULL 12L + 2) and each LayerNorm's
   2 dim gradients summed. A ring all-reduce sends 2 (t - 1) / t of its payload, a gather or
   scatter (t - 1) / t. *formula_bytes (may be NULL): the formula's bytes sent a rank. */
PDP_API pdp_status pdp_gpt_tp_report(const pdp_gpt_desc *desc, int64_t batch,
                                     const pdp_tp_stats *s, char *buf, size_t bytes,
                                     double *formula_bytes);

/* Where this rank's memory goes in a training step, beside ZeRO's formulas (Rajbhandari et
   al. 2020, fp32 form), one entry into buf (PDP_ERR_INVALID when it does not fit, or for a
   NULL argument, batch < 1 or a report with world_size < 1): parameters, gradients and the
   optimizer's state (mm's, measured by pdp_zero_get_memory or planned by
   pdp_zero_memory_plan: stage 0 is a whole replica, single's or DDP's), each beside its
   formula, 4 Psi, 4 Psi and 4 k Psi bytes for k state floats a parameter (named "Adam's
   m, v" for 2, "momentum" for 1), divided by N from the stage that shards it (1 the state,
   2 the gradients, 3 the parameters); then the activations m keeps for backward at batch
   sequences (pdp_model_activation_bytes of every layer: not the scratch a recomputation or
   a backward works in), the working buffers and their bound, and the sum:
       parameters 0.96 MB (4Psi/N 0.96), gradients 0.96 (4Psi/N 0.96), Adam's m, v 1.91
       (8Psi/N 1.91),\n  activations kept 8.60 (4 sequences), buffers 1.20 (at most 1.20): 13.62 MB
   m is this rank's model (split by desc.tp or not; any model, a GPT's or not). MB are 1e6
   bytes, as pdp_zero_memory_format's. examples/train_gpt.c prints it for every rank. */
struct pdp_zero_memory;
PDP_API pdp_status pdp_gpt_memory_report(const pdp_model *m, const struct pdp_zero_memory *mm,
                                         int64_t batch, char *buf, size_t bytes);
