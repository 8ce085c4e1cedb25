/* data: datasets in memory (from IDX files such as MNIST and Fashion-MNIST, a seeded
   synthetic classification task, or a user's own arrays), a shuffling batch iterator, token
   data for a language model, and a model's accuracy over a batcher.

   A dataset holds every sample as float32 in one block, [count, features], and its
   targets: one int32 class label per sample (a classification set), or target_features
   floats per sample (a regression set; pdp_dataset_from_arrays makes either from a user's
   arrays). Reading .gz files needs no library: pdp carries its own gzip (RFC 1952) and
   DEFLATE (RFC 1951) decoder. The batcher copies the samples and targets of each batch into
   buffers it owns, so the training loop allocates nothing, and pdp_batcher_next_target hands
   the targets out as a tensor whose dtype selects the loss: int32 labels [n] for
   cross-entropy, float32 [n, target_features] for mean squared error. Its order in epoch e
   depends on (seed, e) only, like PyTorch's DistributedSampler after set_epoch(e). A
   distributed run gives each rank its own index list (pdp_batcher_desc.indices), or its
   DistributedSampler (pdp_batcher_desc.sampler), whose epochs pdp_batcher_reset follows. A
   token dataset (pdp_token_dataset) holds a text as one stream of byte tokens for
   next-token prediction: windows of T + 1 bytes, a training and a validation split,
   batches of int32 ids written into the caller's arrays. The module ends with
   pdp_model_accuracy: a model's accuracy over a batcher's epoch. */

/* Fashion-MNIST's training-set pixel statistics (of p / 255), for
   pdp_dataset_desc.mean and .std. */
#define PDP_FASHION_MNIST_MEAN 0.2860f
#define PDP_FASHION_MNIST_STD 0.3530f

typedef struct pdp_dataset {
    int64_t count;      /* samples */
    int ndim;           /* dimensions of one sample: 3 (channels, height, width) or 1 (flat);
                           from arrays also 2 */
    int64_t shape[3];   /* one sample's shape; unused entries are 1 */
    int64_t features;   /* floats per sample: the product of shape (784 for 28x28) */
    int classes;        /* largest label + 1 (or pdp_dataset_arrays.classes); 0 for a
                           regression set */
    float *images;      /* [count, features], 64-byte aligned; read-only for the user */
    int32_t *labels;    /* [count] class labels; NULL for a regression set */
    float *targets;     /* [count, target_features] regression targets, 64-byte aligned;
                           NULL for a classification set (labels) */
    int64_t target_features; /* floats per target; 0 for a classification set */
    char source[256];   /* where the samples came from, for a program to print: "Fashion-MNIST",
                           "synthetic", the images file's path (pdp_dataset_load_idx), "arrays"
                           or pdp_dataset_arrays.name, or, after a synthetic_fallback,
                           "synthetic" and why */
} pdp_dataset;

typedef struct pdp_dataset_desc {
    bool flat;           /* samples of shape (features) instead of (1, height, width);
                            default false */
    float mean, std;     /* std > 0: a pixel p becomes (p / 255 - mean) / std; default
                            std 0: p / 255, in [0, 1] (a mean without a std is refused) */
    int64_t max_samples; /* keep only the first max_samples (0 = all): the files need hold
                            only those, and a gzipped one is decoded only that far, so its
                            CRC-32 (over the whole file) is not checked: load once without
                            it (or with one at least the file's count) to check a download;
                            synthetic: how many to make (0 = 60000 train, 10000 test) */
    uint64_t seed;       /* synthetic only: the class prototypes and the noise; default 0 */
    bool synthetic_fallback; /* pdp_dataset_load_fashion_mnist only: when any of the four
                                files is missing, pdp_dataset_synthetic's task (train or test)
                                instead, with PDP_OK; default false */
} pdp_dataset_desc;

/* Reads an IDX image file (magic 0x00000803: unsigned bytes, [count, rows, cols])
   and its IDX label file (magic 0x00000801, [count]); either may be gzipped
   (recognised by content, not by name). A bad magic, a truncated file, a failed
   CRC, counts that disagree between the two files, no sample at all or dimensions that
   overflow fail with PDP_ERR_FORMAT naming the file; a missing file or a directory with
   PDP_ERR_IO. With
   desc->max_samples, what lies past the samples kept is not read (nor its CRC). */
PDP_API pdp_status pdp_dataset_load_idx(pdp_dataset **out, const char *images_path,
                                        const char *labels_path, const pdp_dataset_desc *desc);
/* Fashion-MNIST (60000 training or 10000 test samples) from the directory named
   by $PDP_DATA if set, else /usr/share/datasets/fashion-mnist: the files
   train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
   t10k-labels-idx1-ubyte, each plain or with .gz (MNIST's files have the same names:
   pdp_dataset_load_idx reads those). When they are missing it fails with PDP_ERR_IO,
   naming the paths it tried and how to get the files; with desc->synthetic_fallback it
   returns pdp_dataset_synthetic's task instead, its source saying so and where to put the
   files. The fallback looks for all four files, so the training and test sets of one
   directory are both the files' or both synthetic, never one of each. A file that is there
   but bad still fails (PDP_ERR_FORMAT): the fallback is for a machine without the data. */
PDP_API pdp_status pdp_dataset_load_fashion_mnist(pdp_dataset **out, bool train,
                                                  const pdp_dataset_desc *desc);
/* A learnable stand-in with Fashion-MNIST's shapes (28x28, 10 classes) and no
   files: each class is a pattern of Gaussian blobs drawn from desc->seed (three
   shared by all classes, two of its own); a sample is its class pattern, shifted
   by up to two pixels, scaled, with Gaussian noise (std 0.3), clipped to [0, 1].
   Train and test share the patterns and differ in the noise. An MLP reaches
   about 95% on it, not 100%. */
PDP_API pdp_status pdp_dataset_synthetic(pdp_dataset **out, bool train,
                                         const pdp_dataset_desc *desc);

/* A user's own data, for pdp_dataset_from_arrays: count samples x and, for each, either a
   class label (a classification set: cross-entropy) or target_features floats (a
   regression set: mean squared error). Every array is row-major and read only during the
   call. Zero means default. */
typedef struct pdp_dataset_arrays {
    const float *x;          /* [count, features]: sample i is x[i features .. (i + 1)
                                features); required */
    int64_t count;           /* samples; required, >= 1 */
    int ndim;                /* dimensions of one sample, 1 to 3: (features), (T, C) or
                                (channels, height, width); default 0: the number of leading
                                nonzero entries of shape */
    int64_t shape[3];        /* one sample's shape (entries past ndim 0 or 1); features is
                                their product: .shape = {8} for 8 floats a sample */
    const int32_t *labels;   /* [count] class labels, each >= 0; or NULL */
    int classes;             /* with labels: the number of classes (every label below it);
                                default the largest label + 1 */
    const float *targets;    /* [count, target_features] regression targets; or NULL. Exactly
                                one of labels and targets is set */
    int64_t target_features; /* with targets: floats per sample's target; default 1 */
    const char *name;        /* copied to the dataset's source (up to 255 bytes); default
                                "arrays" */
} pdp_dataset_arrays;

/* A dataset holding copies of a's arrays (a's memory may be freed after the call):
   classification with a->labels, regression with a->targets (ds->labels NULL, ds->targets
   [count, target_features]). Batches come from a batcher, as for the other datasets;
   pdp_batcher_next_target hands out either kind of target. Bad input fails before anything
   is kept, *out NULL, the message naming the field: PDP_ERR_INVALID for a NULL x, count < 1,
   both or neither of labels and targets, a field of the other kind set (target_features
   with labels, classes with targets), a negative label or one not below a->classes (naming
   the sample), and a NaN or infinite value in x or targets (naming the sample and the
   feature: such a value would surface steps later as a NaN loss that names no sample);
   PDP_ERR_SHAPE for ndim outside 0..3, a shape entry < 1 within ndim or > 1 past it, a
   shape whose product overflows, or target_features < 0; PDP_ERR_INVALID when count x
   features (or x target_features) passes what a buffer may hold. Allocates only once every
   check has passed. */
PDP_API pdp_status pdp_dataset_from_arrays(pdp_dataset **out, const pdp_dataset_arrays *a);
PDP_API void pdp_dataset_free(pdp_dataset *ds); /* NULL is fine */

/* Copies samples indices[0..n) to x_out ([n, features] floats) and their labels to
   labels_out (either may be NULL). An index outside [0, count) fails with
   PDP_ERR_INVALID naming it, before anything is written; so does labels_out on a
   regression set (pdp_dataset_gather_targets gathers its targets). */
PDP_API pdp_status pdp_dataset_gather(const pdp_dataset *ds, const int64_t *indices, int64_t n,
                                      float *x_out, int32_t *labels_out);
/* pdp_dataset_gather for a regression set: targets_out gets [n, target_features] floats
   (either of x_out and targets_out may be NULL; targets_out on a classification set fails
   with PDP_ERR_INVALID). */
PDP_API pdp_status pdp_dataset_gather_targets(const pdp_dataset *ds, const int64_t *indices,
                                              int64_t n, float *x_out, float *targets_out);
/* Fills *x (caller-owned struct, no allocation) with samples [first, first + n)
   as a tensor [n, sample shape...] that views the dataset's memory. */
PDP_API pdp_status pdp_dataset_view(const pdp_dataset *ds, int64_t first, int64_t n,
                                    pdp_tensor *x);

/* Fills out[0..n) with a random permutation of 0..n-1 that depends only on
   (seed, epoch): Fisher-Yates driven by pdp_rng seeded with (seed, stream epoch). */
PDP_API void pdp_permutation(int64_t *out, int64_t n, uint64_t seed, uint64_t epoch);

/* ---- batches ---- */

typedef struct pdp_batcher pdp_batcher;

typedef struct pdp_batcher_desc {
    int64_t batch_size;     /* samples per batch; default 64 */
    bool shuffle;           /* default false: in index order, as PyTorch's DataLoader */
    bool drop_last;         /* default false: the last batch of an epoch may be smaller;
                               true with batch_size above the samples: PDP_ERR_INVALID */
    uint64_t seed;          /* with shuffle: epoch e's order is pdp_permutation(seed, e) of
                               the index list */
    const int64_t *indices; /* iterate over these samples (copied at create; they may repeat,
                               as a padded DistributedSampler's do); NULL = all, in order */
    int64_t num_indices;    /* length of indices (>= 1 when indices is set) */
    struct pdp_dist_sampler *sampler; /* instead of indices: a DistributedSampler's (ddp.h),
                               which must outlive the batcher; pdp_batcher_reset(b, e) calls
                               pdp_dist_sampler_set_epoch(sampler, e) and takes this rank's
                               indices for epoch e, as PyTorch's DataLoader(sampler=s) after
                               s.set_epoch(e); default NULL */
    pdp_device device;      /* where the batches are handed out: default the CPU; a CUDA
                               device (the model's) gets each batch's samples and float
                               targets copied into buffers there, allocated at create (int32
                               labels stay on the host) */
} pdp_batcher_desc;

/* A batcher over ds (which must outlive it), positioned at the start of epoch 0. Indices
   outside [0, ds->count), or both indices and sampler, fail with PDP_ERR_INVALID. */
PDP_API pdp_status pdp_batcher_create(pdp_batcher **out, const pdp_dataset *ds,
                                      const pdp_batcher_desc *desc);
PDP_API void pdp_batcher_free(pdp_batcher *b); /* NULL is fine */
/* The desc in use, defaults filled in (sokol's query-defaults); indices points at the
   batcher's own copy of the index list (0..count-1 when none was given), num_indices
   its length; valid until pdp_batcher_free. A zero desc for NULL. */
PDP_API pdp_batcher_desc pdp_batcher_get_desc(const pdp_batcher *b);
/* The next batch of this epoch: *x becomes a view [n, sample shape...] of the
   batcher's buffer and *labels (may be NULL) points at its n labels, both valid until the
   next call. Returns false, with *n = 0, when the epoch is over; call
   pdp_batcher_reset to start the next one. Allocates nothing. On desc.device *x views
   the device buffer; a failed copy there also returns false, and pdp_batcher_status then
   says why. On a regression set, which has no labels, a non-NULL labels fails the same
   way, the message pointing at pdp_batcher_next_target; with labels NULL it hands out the
   samples alone. */
PDP_API bool pdp_batcher_next(pdp_batcher *b, pdp_tensor *x, const int32_t **labels, int64_t *n);
/* pdp_batcher_next with the targets as a tensor (target may be NULL), the same batch of the
   same order: *target becomes a view, valid until the next call, of the batcher's buffer of
   the batch's targets. A classification set gives int32 [n] labels (PDP_DTYPE_I32, read
   through pdp_tensor_ids; on the host whatever desc.device is, as pdp_batcher_next's
   labels), a regression set float32 [n, target_features] (on desc.device, copied there as
   x is). Allocates nothing. */
PDP_API bool pdp_batcher_next_target(pdp_batcher *b, pdp_tensor *x, pdp_tensor *target,
                                     int64_t *n);
/* PDP_OK, or the failure of the last pdp_batcher_next or pdp_batcher_next_target (a device
   copy; a NULL argument; labels asked of a regression set), with its message in
   pdp_last_error(); reset by pdp_batcher_reset. */
PDP_API pdp_status pdp_batcher_status(const pdp_batcher *b);
/* Starts epoch `epoch` from its first batch (its order is recomputed from the
   seed and the epoch number alone, so any epoch can be replayed). With desc.sampler the
   index list is the sampler's for that epoch; an index outside the dataset (a sampler made
   for a larger one) makes the next pdp_batcher_next return false, pdp_batcher_status
   PDP_ERR_INVALID naming it. */
PDP_API void pdp_batcher_reset(pdp_batcher *b, uint64_t epoch);
/* Batches per epoch (counting a smaller last batch unless drop_last). */
PDP_API int64_t pdp_batcher_num_batches(const pdp_batcher *b);
/* This epoch's order: *count dataset indices (may be NULL). */
PDP_API const int64_t *pdp_batcher_order(const pdp_batcher *b, int64_t *count);

/* ---- token data ----
   A text as a stream of tokens for a language model, byte-level: the vocabulary is the
   256 byte values and token i is the text's byte i (UTF-8 text becomes its bytes; no
   tokenizer). The stream is cut once, as nanoGPT's prepare.py cuts its text: the first
   floor(count x (1 - val_fraction)) tokens train, the rest validate. Each split is cut
   into windows of T + 1 tokens at stride T, w = 0, 1, ..., (length - 1) / T - 1:
   window w of a split starting at token s is tokens [s + wT, s + wT + T + 1), its inputs
   x = the first T and its targets y = the last T (y[t] = x[t + 1]: the next token). So
   tokens 1 .. WT of a split (W windows) are each a target exactly once per epoch, a window
   never crosses the split, and the last (length - 1) mod T tokens, fewer than T, are in
   no window.
   Windows are what an epoch shuffles: pdp_permutation(order, windows[split], seed, epoch),
   or a DistributedSampler (ddp.h) with dataset_size = windows[PDP_SPLIT_TRAIN], whose
   indices pdp_token_dataset_batch takes as they are. nanoGPT's get_batch (a window
   starting anywhere, drawn with replacement) is pdp_token_dataset_sample. */

/* Debian's fortunes package (apt-get install fortunes): about 2.5 MB of English text. */
#define PDP_FORTUNES_DIR "/usr/share/games/fortunes"

typedef enum pdp_split {
    PDP_SPLIT_TRAIN = 0, /* tokens [0, split_at) */
    PDP_SPLIT_VAL = 1    /* tokens [split_at, count) */
} pdp_split;

typedef struct pdp_token_dataset_desc {
    int64_t context;      /* T, the tokens of one input (nanoGPT's block_size); required, >= 1 */
    double val_fraction;  /* the share of the stream, from its end, that validates, in (0, 1);
                             default 0.1 (nanoGPT's) */
    bool no_validation;   /* every token trains: no validation split (windows[PDP_SPLIT_VAL]
                             is 0); not with val_fraction; default false */
    int64_t max_tokens;   /* keep only the first max_tokens of the stream (0 = all; files past
                             them are not read); synthetic: how many to write (0 = 1048576) */
    uint64_t seed;        /* synthetic only: the sentences drawn; default 0 */
    bool synthetic_fallback; /* pdp_token_dataset_load only: when path does not exist, the
                                synthetic text instead, with PDP_OK; default false */
} pdp_token_dataset_desc;

typedef struct pdp_token_dataset {
    int64_t count;          /* tokens in the stream, training then validation */
    int vocab;              /* 256: a token is a byte */
    int64_t context;        /* T */
    int64_t split_at;       /* the first validation token: training is [0, split_at) */
    int64_t windows[2];     /* windows of T + 1 tokens per split, [PDP_SPLIT_TRAIN] and
                               [PDP_SPLIT_VAL]: (length - 1) / T, 0 for an empty split */
    int64_t files;          /* files read (0 for the synthetic text) */
    uint8_t *tokens;        /* [count]: the stream; read-only for the user */
    char source[256];       /* where the text came from, for a program to print: the path
                               (and, for a directory, how many files), "synthetic", or after a
                               synthetic_fallback "synthetic" and why */
    pdp_token_dataset_desc desc; /* the desc in use, defaults filled in */
} pdp_token_dataset;

/* Reads a text file, or a directory: every regular file in it whose name does not end in
   ".dat" (fortune's index files), in bytewise (strcmp) order of their names, concatenated
   with nothing between them (the stream is `cat` of the files in that order; each of
   fortunes' files ends with a newline). Subdirectories are not entered, and symbolic links
   in the directory are skipped (fortunes' "*.u8" links name its files a second time); a
   path that is itself a link is followed. A file that starts with the gzip magic is
   decompressed, as pdp_dataset_load_idx does. A path that does not exist fails with
   PDP_ERR_IO naming it (with desc->synthetic_fallback: pdp_token_dataset_synthetic's text,
   its source saying why and how to get fortunes); an empty file, a directory with no text,
   or a stream with a split shorter than T + 1 tokens fails with PDP_ERR_INVALID naming the
   path and the lengths; a file that cannot be read with PDP_ERR_IO naming it. */
PDP_API pdp_status pdp_token_dataset_load(pdp_token_dataset **out, const char *path,
                                          const pdp_token_dataset_desc *desc);
/* A text without files, deterministic in desc->seed: English-like sentences from a small
   grammar ("The quiet fox follows a green bird today."), capitalised, a period at the end,
   a newline after about one in four, max_tokens bytes (the last sentence cut there). A
   byte-level model learns its words and their order; nothing more is there to learn. */
PDP_API pdp_status pdp_token_dataset_synthetic(pdp_token_dataset **out,
                                               const pdp_token_dataset_desc *desc);
PDP_API void pdp_token_dataset_free(pdp_token_dataset *ds); /* NULL is fine */

/* Writes windows[0..count) of split as x[i] = inputs, y[i] = targets, each [count, T]
   row-major int32 (x[i T + t] and y[i T + t] = x[i T + t + 1] within the window). Either
   of x and y may be NULL. A window outside [0, ds->windows[split]) fails with
   PDP_ERR_INVALID naming it, before anything is written. Allocates nothing. */
PDP_API pdp_status pdp_token_dataset_batch(const pdp_token_dataset *ds, pdp_split split,
                                           const int64_t *windows, int64_t count, int32_t *x,
                                           int32_t *y);
/* nanoGPT's get_batch: count windows of split at offsets drawn uniformly from the split's
   length - T starting tokens (with replacement, r advanced), written as
   pdp_token_dataset_batch writes them. An empty split fails with PDP_ERR_INVALID.
   Allocates nothing. */
PDP_API pdp_status pdp_token_dataset_sample(const pdp_token_dataset *ds, pdp_split split,
                                            pdp_rng *r, int64_t count, int32_t *x, int32_t *y);

/* ---- evaluation ---- */

/* The share of b's samples, in [0, 1], whose largest logit from m is their label
   (pdp_count_correct): one pass over epoch 0 of b (pdp_batcher_reset(b, 0): an unshuffled
   batcher goes in dataset order) with m in evaluation mode, put back in the mode it was in.
   b must hand out batches where m lives (pdp_batcher_desc.device); the pass allocates
   nothing once m is reserved (pdp_model_reserve) for b's batch size. A failing forward or
   batch returns its status, message prefixed with "pdp_model_accuracy"; an empty batcher,
   or one over a regression set, gives PDP_ERR_INVALID. Rank-parallel models with their own forward (pdp_zero_forward)
   count with pdp_count_correct themselves. */
PDP_API pdp_status pdp_model_accuracy(pdp_model *m, pdp_batcher *b, double *accuracy);
