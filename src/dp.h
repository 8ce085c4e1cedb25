/* dp: DataParallel, torch.nn.DataParallel in one process: one host thread per
   device, parameter-server style.

   Every step runs six stages around the master (the model you wrap, device 0):
     replicate      master parameters -> each replica
     scatter        the batch split along dimension 0 -> one shard per replica
     parallel apply forward, loss and backward on every replica at once
     gather         outputs and loss sums -> the master
     reduce         replica gradients summed into the master's, fixed order
     step           the optimizer updates the master's parameters (with 2+ workers
                    on the CPU, each worker updates the slice it has just reduced:
                    the same bits, no core waits; the step's time is then in reduce)
   All the traffic goes through the master, which also holds the optimizer state
   and the gathered outputs: the "DP overloads device 0" effect that the
   literature contrasts with DDP's all-reduce, measured by pdp_dp_get_stats.

   Replica 0 is the master itself; replicas 1..N-1 are clones. On the CPU they
   read the master's parameter memory (replicate copies nothing, but stays a
   stage you can time) unless copy_params asks for real copies. On GPUs
   (PDP_CUDA) each replica owns its parameters on its device and every stage
   moves real bytes: peer copies from and to device 0, one host thread per
   replica (the calling thread drives replica 0); several replicas may share a
   GPU. Shards are balanced: sizes differ by at most one and replica i gets the
   samples before replica i + 1's; with more workers than samples the extra
   workers sit idle for that step. Results
   equal one device on the same global batch to float rounding (bit for bit
   with one worker). */

typedef struct pdp_dp pdp_dp;

#define PDP_DP_MAX_WORKERS 256

typedef struct pdp_dp_desc {
    int num_workers;          /* replicas, one thread each (replica 0's is the calling
                                 thread); 0 = one per online core;
                                 negative or > PDP_DP_MAX_WORKERS is an error */
    const pdp_device *devices;/* num_workers devices (num_workers must then be > 0),
                                 devices[0] = the master's; NULL = all CPU. All CPU or all
                                 CUDA (a device may repeat); CUDA needs PDP_CUDA, else
                                 PDP_ERR_UNSUPPORTED */
    int threads_per_worker;   /* intra-op threads of each worker; default 1 (the intra-op
                                 pool is one per process: workers that ask for more at the
                                 same moment take turns, results unchanged) */
    bool copy_params;         /* CPU: give each replica its own parameter copy, refreshed by
                                 replicate every step (what GPUs always do); default false:
                                 replicas read the master's memory */
    bool reduce_on_master;    /* run the whole reduce on the master's thread, as
                                 torch.nn.DataParallel does on device 0; default false:
                                 each worker sums one slice (same result, bit for bit) */
} pdp_dp_desc;

/* Wraps master (which stays owned by the caller and must outlive dp) and starts
   workers 1..N-1. Adding layers to master afterwards fails with PDP_ERR_STATE
   (model.h, "Wrapped models"); pdp_model_set_precision on it reaches every replica
   at the next step. A pdp_dp is used
   by one calling thread at a time; between steps the caller may use the master
   as any model (evaluate it, save it). */
PDP_API pdp_status pdp_dp_create(pdp_dp **out, pdp_model *master, const pdp_dp_desc *desc);
/* Stops and joins the workers, frees the replicas (never the master). NULL is fine. */
PDP_API void pdp_dp_free(pdp_dp *dp);
PDP_API int pdp_dp_num_workers(const pdp_dp *dp);
/* The desc in use, defaults filled in (sokol's query-defaults): num_workers resolved,
   threads_per_worker >= 1; devices is dp's own copy (NULL when none was given), valid
   until pdp_dp_free. A zero desc for NULL. */
PDP_API pdp_dp_desc pdp_dp_get_desc(const pdp_dp *dp);

/* One training step for classification on the global batch x [B, ...] with B
   labels in host memory (x on the master's device, or on the host for a GPU
   master): zero the master's gradients, replicate, scatter, parallel apply
   (softmax cross-entropy, mean over the global batch), gather, reduce, then
   pdp_optim_step(opt) on the master (opt must have been created on the master).
   *loss (may be NULL) gets the global mean loss. The gradients stay readable
   until the next step. An error inside a worker comes back naming it:
   "pdp_dp_step: worker 2: pdp_model_forward: layer 0 (Linear) expects ...". */
PDP_API pdp_status pdp_dp_step(pdp_dp *dp, pdp_optim *opt, const pdp_tensor *x,
                               const int32_t *labels, float *loss);
/* The same without zeroing and without the optimizer step: the master's
   gradients accumulate (+=) the global-batch gradient, as a PyTorch backward
   through DataParallel does. */
PDP_API pdp_status pdp_dp_forward_backward(pdp_dp *dp, const pdp_tensor *x, const int32_t *labels,
                                           float *loss);
/* An own loss (MSE, a hand-written one): DP runs the loss inside its workers and
   offers softmax cross-entropy only. pdp_model_forward, the loss and
   pdp_model_backward on the master work as on any model, on the calling thread
   alone: correct gradients and steps (pdp_optim_step), no parallelism, nothing
   to synchronise, since the replicas take the master's parameters at the next
   replicate. For a data-parallel own loss use DDP (pdp_ddp_backward). */
/* The gathered outputs [B, classes] of the last step (on the master), or NULL. */
PDP_API const pdp_tensor *pdp_dp_output(const pdp_dp *dp);

/* Seconds per stage, wall clock as seen by the caller (apply and reduce include
   waking the workers). */
typedef struct pdp_dp_times {
    double replicate, scatter, apply, gather, reduce, step;
    double total;       /* the whole call, stages plus bookkeeping */
    double apply_cpu;   /* CPU seconds of the busiest worker in apply and in reduce */
    double reduce_cpu;
    double critical_cpu; /* the step's critical path in CPU seconds, what it would take if
                            every worker had a core to itself: the calling thread's CPU
                            time outside apply and reduce (the other stages, bookkeeping)
                            plus apply_cpu and reduce_cpu */
} pdp_dp_times;

/* What a learner reads after a step. Bytes are device-to-device traffic as the
   algorithm moves it (master to itself does not count); with CPU replicas that
   share the master's parameters the replicate bytes are read in place, not
   copied (params_shared says so). */
typedef struct pdp_dp_stats {
    int num_workers;
    int active_workers;       /* last step: workers with at least one sample */
    int64_t steps;            /* pdp_dp_step and pdp_dp_forward_backward calls that succeeded */
    int64_t batch;            /* last global batch */
    bool params_shared;
    size_t replicate_bytes;   /* last step: parameters, master -> replicas */
    size_t scatter_bytes;     /* last step: inputs and labels, master -> replicas */
    size_t gather_bytes;      /* last step: outputs and loss sums, replicas -> master */
    size_t reduce_bytes;      /* last step: gradients, replicas -> master */
    size_t bytes_from_master; /* replicate + scatter */
    size_t bytes_to_master;   /* gather + reduce */
    pdp_dp_times last;        /* last step */
    pdp_dp_times sum;         /* all steps so far; divide by steps for a mean */
    double apply_worker_min;  /* last step: fastest and slowest worker's own apply time */
    double apply_worker_max;
    size_t master_bytes;      /* peak memory on the master's device: its parameters,
                                 gradients, activations, loss gradient, the gathered
                                 outputs and the optimizer state */
    size_t replica_bytes;     /* peak memory on the largest other replica's device */
} pdp_dp_stats;

PDP_API pdp_status pdp_dp_get_stats(const pdp_dp *dp, pdp_dp_stats *out);
/* A few human-readable lines (stage times in ms, bytes, memory) into buf;
   returns the length snprintf would have written. */
PDP_API int pdp_dp_stats_format(const pdp_dp_stats *s, char *buf, size_t bytes);
