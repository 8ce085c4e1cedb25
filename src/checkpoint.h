/* checkpoint: save and load a model (and optionally its optimizer) as a
   safetensors file (https://github.com/huggingface/safetensors), readable by
   `safetensors.torch.load_file` and loadable into the matching PyTorch module
   with `module.load_state_dict(...)` directly.

   Layout of a file written by pdp_checkpoint_save:
     tensors, all F32, little-endian, in this order in the data section:
       "<param>"                        every model parameter, state_dict names
                                        ("0.weight", "0.bias", "3.weight", ...); a
                                        tied head's weight once, under the name of the
                                        parameter it shares (a GPT's
                                        "transformer.wte.weight": no "lm_head.weight",
                                        as safetensors refuses two names for one tensor)
       "optim.<param>.momentum_buffer"  SGD with momentum > 0
       "optim.<param>.exp_avg"          Adam, AdamW (then, after all exp_avg,
       "optim.<param>.exp_avg_sq"       every exp_avg_sq)
     __metadata__ (strings): "format": "pdp", "pdp_version", "model.seed" and
       "model.step" (the dropout stream: restored by load when present), and with an
       optimizer "optim.kind" ("SGD", "Adam", "AdamW"), "optim.steps",
       "optim.lr", "optim.momentum", "optim.dampening", "optim.nesterov"
       ("true"/"false"), "optim.weight_decay", "optim.decay_params" ("all" or
       "matrices"; a file without it loads as "all"), "optim.beta1", "optim.beta2",
       "optim.eps" (doubles printed with 17 significant digits: exact round trip;
       an earlier pdp wrote a float's 9 digits, which load as that decimal),
       and checksums: "crc32c.<tensor>" for every tensor (CRC-32C of its data
       bytes as stored) and "crc32c.header" (of the header's content: the
       metadata but itself, the tensors' names, dtypes and shapes; exactly as
       defined in checkpoint.c), each 8 lowercase hex digits.
   The header is padded with spaces so the data starts 8-byte aligned.
   In PyTorch: sd = safetensors.torch.load_file(path); model.load_state_dict(
   {k: v for k, v in sd.items() if not k.startswith("optim.")}) (or pass the
   whole dict when the file was saved without an optimizer); for a GPT (gpt.h), whose
   nanoGPT module lists its tied head under both names, first
   sd["lm_head.weight"] = sd["transformer.wte.weight"] (and on torch before 2.0, where
   nanoGPT's attention registers its causal mask as a buffer, "attn.bias", that the file
   does not hold: load_state_dict(sd, strict=False)). */

/* Writes path atomically: the bytes go to "<path>.tmp.<pid>.<thread>" (a name of its own
   for each thread, so thread ranks saving one path at once do not collide), which is
   flushed, fsync'd and renamed over path, then the directory is fsync'd. A
   failure or a crash at any point leaves any previous file at path intact (and
   on failure the temporary is removed). Temporaries "<path>.tmp.<pid>[.<thread>]" that a
   killed writer left behind are removed first, when no process has that pid
   (another live writer's are kept). o may be NULL (parameters only).
   Errors: PDP_ERR_IO naming the file and the failed call. */
PDP_API pdp_status pdp_checkpoint_save(const char *path, const pdp_model *m, const pdp_optim *o);

/* Reads a checkpoint into m (and o, when not NULL). Every parameter of m must be
   present as F32 with m's shape; with o, its state tensors must be present and
   the file's "optim.kind" must be o's kind; o's step count and hyper-parameters
   (lr, momentum, ...) are then restored from the file, as PyTorch's
   optimizer.load_state_dict does. Tensors named "optim.*" are ignored when o is
   NULL; any other tensor m does not have is an error (PyTorch's strict=True), but
   the two a nanoGPT state_dict holds beside its parameters (gpt.h), so that its file
   loads with no renaming:
     "lm_head.weight", when m has a tied head (TiedLinear: its last one) and no
       parameter of that name, is the alias of the parameter that head shares
       (transformer.wte.weight): it must be F32 of that shape; when the file has the
       parameter too, the two must be equal bit for bit (else PDP_ERR_FORMAT naming
       both and the first element that differs); when it has only the alias, the
       alias is loaded into the parameter;
     "<prefix>.attn.bias", when m has parameters "<prefix>.attn.*" and none of that
       name, is nanoGPT's causal-mask buffer (registered on torch < 2.0): it is
       skipped when it is F32 [1, 1, S, S] holding exactly tril(ones(S, S)) (1.0 on
       and below the diagonal, +0.0 above), and refused like any extra tensor
       otherwise, the message naming the first element that is not the mask's.
   The whole file is validated into a staging buffer before anything is copied:
   on failure m and o are untouched (one exception: a model on a GPU whose
   host-to-device copy itself fails, PDP_ERR_CUDA, a device fault, may be left
   partly loaded; the message says so). A file with checksums (pdp's) is
   verified: the header, and every tensor load reads, whole; a file without
   them (another tool's, or an older pdp's) loads unverified. Errors, each
   message starting with "pdp_checkpoint_load: <path>: " and naming the tensor
   or the header: PDP_ERR_IO (cannot open or read), PDP_ERR_FORMAT (not
   safetensors, truncated, corrupt header, a checksum mismatch, overlapping or
   uncovered data, wrong dtype, optimizer kind or hyper-parameters),
   PDP_ERR_SHAPE (a missing, extra or differently shaped tensor). The header is
   limited to 100 MB (10^8 bytes). */
PDP_API pdp_status pdp_checkpoint_load(const char *path, pdp_model *m, pdp_optim *o);
