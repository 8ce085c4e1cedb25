/* comm: communicators. One table of collectives (all-reduce, broadcast,
   reduce-scatter, all-gather, barrier), point-to-point send/recv and split behind
   every backend:
     local  N ranks as threads of one process, buffers in shared memory; each
            rank reduces one slice. No dependency; the default.
     mpi    CPU ranks in separate processes or machines (-DPDP_MPI), with a
            progress thread so collectives overlap compute.
     nccl   GPU ranks (-DPDP_CUDA, pdp_cuda.cu).
   Every collective is asynchronous: it returns at once with a handle that
   pdp_work_wait completes (passing work = NULL makes the call synchronous).
   Buffers are floats on the communicator's device; counts are elements. A count
   whose buffer exceeds the address space (count x element size, times the world size
   for reduce-scatter's send and all-gather's recv, above PTRDIFF_MAX bytes), or above
   what the backend takes in one call (MPI counts are int: INT32_MAX elements per rank in
   a reduce-scatter, all-gather, send or recv; the all-reduce and broadcasts are split),
   fails with PDP_ERR_INVALID naming the call and the count, before any data moves.
   Collectives on one communicator complete in the order they were issued, and
   every rank must issue the same collectives in the same order (as in MPI and
   NCCL). A rank that does not arrive within timeout_s makes the others fail
   with PDP_ERR_TIMEOUT naming the collective; the local backend also names the
   missing rank (it sees every rank's arrival), MPI and NCCL name the rank that
   reports it (neither library says which peer is late).
   One module per backend in src/ (comm_local.c, comm_mpi.c, comm_nccl.c) fills
   one table of functions; comm.c holds this API and the dispatcher. A new
   backend is one new file and a few lines elsewhere (its value in pdp_backend,
   its line in the dispatcher, its place in amalgamate.py, its prototype in
   internal.h): comm.c's opening comment has the whole list. */

typedef struct pdp_comm pdp_comm;
typedef struct pdp_work pdp_work;
typedef struct pdp_local_group pdp_local_group;

typedef enum pdp_backend {
    PDP_BACKEND_DEFAULT = 0, /* local */
    PDP_BACKEND_LOCAL = 1,
    PDP_BACKEND_MPI = 2,
    PDP_BACKEND_NCCL = 3
} pdp_backend;

typedef enum pdp_reduce_op {
    PDP_REDUCE_SUM = 0,
    PDP_REDUCE_AVG = 1
} pdp_reduce_op;

/* The reducing collectives' _ex forms take F32, BF16 or F16 elements (pdp_dtype, tensor.h).
   The float API is F32. 16-bit elements halve the bytes on the wire (bytes_sent counts 2
   per element); the buffers then hold uint16_t bit patterns (pdp.h's bf16: round to
   nearest even, as PyTorch's torch.bfloat16; fp16: IEEE binary16). */

typedef struct pdp_comm_desc {
    pdp_backend backend;  /* default local */
    double timeout_s;     /* a collective waits this long for a missing rank; default 300.
                             As every numeric desc field: 0 means the default; a negative,
                             NaN or infinite value (or above 1e9) is PDP_ERR_INVALID naming
                             the function and the field */
    pdp_device device;    /* where buffers live; default CPU (NCCL: the rank's GPU) */
    const char *name;     /* for messages and the trace; default "comm"; cut at 63 chars */
    pdp_log_fn log;       /* optional: the MPI start-up watchdog reports through it; NULL */
    void *log_user;       /* passed to log */
} pdp_comm_desc;

/* ---- local backend: ranks are threads ----
   Create one group for world_size ranks (1..256), then each rank's thread calls
   pdp_comm_create_local with its rank (once per rank) and issues its
   collectives on it. Each communicator runs a progress thread (none at world
   size 1, where every collective completes at once), so an asynchronous
   collective progresses while its rank computes; rank r's progress thread
   reduces slice r of every rank's buffer, in rank order, so all ranks get the
   same bits. Freeing a communicator tells the group that rank has left: a peer
   waiting for it fails at once with PDP_ERR_COMM instead of timing out. After
   a timeout or a departure the group is broken and every later collective on
   it fails at once with the first failure's message. The group outlives its
   communicators; free it after the last pdp_comm_free. */
PDP_API pdp_status pdp_local_group_create(pdp_local_group **out, int world_size,
                                          const pdp_comm_desc *desc);
PDP_API void pdp_local_group_free(pdp_local_group *g);
PDP_API pdp_status pdp_comm_create_local(pdp_comm **out, pdp_local_group *g, int rank);

/* ---- from the environment (torchrun or mpirun) ----
   MPI: the rank and size come from MPI itself, so its ranks are started by mpirun
   (processes started as torchrun starts them, each an MPI world of one, are refused:
   PDP_ERR_INVALID naming RANK/WORLD_SIZE and MPI's rank and size); NCCL: RANK,
   WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or OMPI_COMM_WORLD_*), the unique
   id through the TCP store on rank 0. Local is not available here (it needs a group):
   CPU ranks in separate processes are MPI's. A backend that was not compiled in fails
   with PDP_ERR_UNSUPPORTED naming the macro. An MPI error never aborts the job: when pdp
   initialises MPI, MPI_COMM_WORLD's handler returns too (OpenMPI reports a non-blocking
   collective's error there), and the error becomes PDP_ERR_COMM.

   MPI start-up, what is and is not bounded by timeout_s (when pdp initialises
   MPI, i.e. the program did not call MPI_Init_thread itself):
   - bounded, naming the missing rank: with a store port in the environment
     (PDP_STORE_PORT, or MASTER_PORT; MASTER_ADDR says where rank 0 is) and the
     ranks named by the launcher (mpirun's OMPI_COMM_WORLD_*, or RANK and
     WORLD_SIZE), every rank checks in at a TCP store served by rank 0 BEFORE
     MPI_Init_thread. A rank that has not checked in within timeout_s makes the
     others fail with PDP_ERR_TIMEOUT, "missing rank 2: it did not call
     pdp_comm_init_env within 5 s", and MPI_Init_thread is never called (e.g.
     `PDP_STORE_PORT=29511 mpirun -np 4 ./train`);
   - reported, not bounded: MPI_Init_thread itself has no timeout and cannot be
     interrupted. If it has not returned timeout_s after it was called (a rank
     never started and there was no start-up check, or a rank died after its
     check), desc.log gets one PDP_LOG_ERROR message from a watchdog thread
     naming this rank; the call still blocks until MPI returns or the launcher
     ends the job (OpenMPI's mpirun does when a rank exits or dies). Without
     desc.log nothing is printed;
   - bounded: duplicating MPI_COMM_WORLD (MPI_Comm_idup, polled against
     timeout_s; PDP_ERR_TIMEOUT "did not call pdp_comm_init_env") and every
     collective, point-to-point and split afterwards.
   A rank killed later (SIGKILL, OOM): by default OpenMPI's mpirun then kills
   every rank at once, so the others get no pdp error at all. Run with
   `mpirun --enable-recovery` to keep the survivors alive: their pending
   collective then fails with PDP_ERR_TIMEOUT at timeout_s (measured: 2 ranks,
   timeout 2 s, the survivor's all-reduce failed after 2.0 s) and they can
   save a checkpoint and exit. */
PDP_API pdp_status pdp_comm_init_env(pdp_comm **out, const pdp_comm_desc *desc);

PDP_API void pdp_comm_free(pdp_comm *c);
PDP_API int pdp_comm_rank(const pdp_comm *c);
PDP_API int pdp_comm_size(const pdp_comm *c);
PDP_API pdp_backend pdp_comm_backend(const pdp_comm *c);
PDP_API double pdp_comm_timeout(const pdp_comm *c); /* seconds */
/* The desc in use, defaults filled in (sokol's query-defaults): the backend that
   runs it, timeout_s, device, and name (the communicator's own string, valid until it
   is freed); log and log_user are not kept (NULL). A zero desc for NULL. */
PDP_API pdp_comm_desc pdp_comm_get_desc(const pdp_comm *c);

/* In place: buf <- op over ranks of buf. */
PDP_API pdp_status pdp_comm_allreduce(pdp_comm *c, float *buf, int64_t count, pdp_reduce_op op,
                                      pdp_work **work);
/* The reducing collectives on any pdp_dtype: buf (reduce_scatter: send and recv)
   holds count elements of that type (F32: floats, as the calls above, which are
   the F32 case). The 16-bit semantics differ by backend, and each is exact for
   its stated rounding:
     local  every element is widened to fp32, reduced in fp32 in rank order
            (((x0 + x1) + x2) + ...; AVG then divides by N) and rounded ONCE to
            the 16-bit type, to nearest even: the same bits on every rank;
     mpi    a user-defined MPI_Op over MPI_UINT16_T (created once per
            communicator, commutative): each combination of two partial values
            widens both, adds in fp32 and rounds to nearest even, so N ranks
            round N - 1 times in an order MPI chooses (2 ranks: once, the local
            backend's bits); AVG then divides the rounded sum in fp32 and rounds
            again (exact for powers of two);
     nccl   ncclBfloat16 / ncclFloat16 with ncclSum / ncclAvg: NCCL's own
            reduction order and rounding of partial sums (also N - 1 roundings
            on a ring).
   Gradient compression divides by N BEFORE compressing and sums (ddp.h's
   compress hooks), so the 16-bit sums stay in range. */
PDP_API pdp_status pdp_comm_allreduce_ex(pdp_comm *c, void *buf, int64_t count, pdp_dtype dtype,
                                         pdp_reduce_op op, pdp_work **work);
PDP_API pdp_status pdp_comm_reduce_scatter_ex(pdp_comm *c, const void *send, void *recv,
                                              int64_t recv_count, pdp_dtype dtype,
                                              pdp_reduce_op op, pdp_work **work);
/* buf on every rank <- buf on root. */
PDP_API pdp_status pdp_comm_broadcast(pdp_comm *c, float *buf, int64_t count, int root,
                                      pdp_work **work);
/* send holds size * recv_count floats; rank r gets slice r of op over ranks. */
PDP_API pdp_status pdp_comm_reduce_scatter(pdp_comm *c, const float *send, float *recv,
                                           int64_t recv_count, pdp_reduce_op op, pdp_work **work);
/* recv (size * send_count floats) <- every rank's send, in rank order. */
PDP_API pdp_status pdp_comm_allgather(pdp_comm *c, const float *send, float *recv,
                                      int64_t send_count, pdp_work **work);
PDP_API pdp_status pdp_comm_barrier(pdp_comm *c, pdp_work **work);
/* Host bytes from root to every rank, synchronous (descriptions, signatures). */
PDP_API pdp_status pdp_comm_broadcast_bytes(pdp_comm *c, void *buf, size_t bytes, int root);

/* ---- point-to-point ----
   send: count floats of buf to rank peer; recv: count floats from rank peer into buf.
   Asynchronous with a handle, as the collectives (work == NULL: synchronous). A send
   and a receive match when they name each other's rank and the same tag (0..
   PDP_COMM_TAG_MAX); messages between two ranks with one tag are received in the
   order they were sent; a rank may send to itself (local, MPI). Send and recv
   buffers must stay untouched until the handle is waited. The counts must be
   equal: a mismatch fails with PDP_ERR_INVALID naming both counts (on the
   receiver; on the local backend on both sides). A send completes only once its
   receive has matched it, on every backend (MPI: a synchronous send, MPI_Issend), so
   a message not matched within timeout_s of its launch, a send nobody receives or
   receives with another tag as much as a receive nobody sends, fails its wait with
   PDP_ERR_TIMEOUT naming the peer and the tag (NCCL has no tags: a receive from that
   rank with another tag takes the send, which completes, and fails with
   PDP_ERR_INVALID naming both tags). The communicator stays usable: local
   withdraws the message; MPI withdraws an unmatched receive and cancels a send (or a
   matched receive), giving the cancel a grace of 1 s that the messages timing out
   together share, so their waits fail up to 1 s after timeout_s. OpenMPI never
   cancels a send: a timed-out send is abandoned and stays deliverable (a later
   receive of that peer with that tag still gets it, and MPI may still read its
   buffer); if it is still pending when the communicator is freed, pdp never calls
   MPI_Finalize. A peer whose local communicator is freed fails the pending messages
   naming it with PDP_ERR_COMM.
   Point-to-point is ordered with nothing else: collectives and messages may be
   interleaved freely (as in MPI). Handles come from the same fixed pool as the
   collectives' (nothing is allocated per message). Stats: bytes_sent counts the
   bytes sent, p2p the messages.
   NCCL (ncclSend/ncclRecv; no tags in NCCL, so each message carries a small header
   with its tag and count, checked by the receiver): posted messages go out together
   in one ncclGroupStart/End at the first wait or pdp_work_done on one of them, or
   before the next collective or split on that communicator (call pdp_work_done
   right after posting to start them early, or post them with pdp_comm_sendrecv,
   which starts its batch at once). Unlike local and MPI: messages and
   collectives share one stream, so ranks must issue them in an order that cannot
   deadlock; a self-send needs its receive posted in the same batch; a timed-out
   message aborts the communicator (NCCL cannot withdraw it), as a timed-out
   collective does. */
#define PDP_COMM_TAG_MAX 32767 /* MPI guarantees tags up to 32767 */
PDP_API pdp_status pdp_comm_send(pdp_comm *c, const float *buf, int64_t count, int peer, int tag,
                                 pdp_work **work);
PDP_API pdp_status pdp_comm_recv(pdp_comm *c, float *buf, int64_t count, int peer, int tag,
                                 pdp_work **work);

/* A batch of sends and receives that progress together (PyTorch's batch_isend_irecv): the
   n messages are checked, then posted and started at once. NCCL: one ncclGroupStart/End,
   launched now, so on the one stream none of them waits behind another (a ring where every
   rank sends to one neighbour and receives from the other completes); messages posted
   before on c and not yet started join it. Local and MPI: each posted as pdp_comm_send/recv
   posts it (they start when posted and match by tag: a batch adds no order). Each message
   gets its own handle in *ops[i].work; one whose work is NULL is waited by the call, after
   every message of the batch has started (MPI's Waitall). A message that fails to post
   fails the call; the ones posted before it keep their handles (or are waited). n = 0 does
   nothing; n at most PDP_COMM_BATCH_MAX. */
#define PDP_COMM_BATCH_MAX 16
typedef struct pdp_p2p {
    bool send;        /* true: count floats of buf to peer; false: from peer into buf */
    float *buf;       /* a send's buffer is only read */
    int64_t count;
    int peer, tag;    /* as pdp_comm_send/recv */
    pdp_work **work;  /* where its handle goes; NULL: the call waits for it */
} pdp_p2p;
PDP_API pdp_status pdp_comm_sendrecv(pdp_comm *c, const pdp_p2p *ops, int n);

/* ---- process groups ----
   Splits c by colour and key, as MPI_Comm_split: collective over c (every rank
   calls it, in the same order as its collectives; bounded by timeout_s); the
   ranks with the same colour (>= 0) form one new communicator in *out, ranked
   by (key, rank in c). colour PDP_COMM_SPLIT_NONE (-1) takes part but joins
   nothing (*out = NULL, PDP_OK). The new communicator has the backend, device
   and timeout of c, the name "<name of c>.<colour>", its own rank numbering,
   progress thread, handle pool and stats, and is independent of c: free each
   with pdp_comm_free, in any order (a local group made by a split is freed with
   its last communicator; pdp_local_group_free stays for groups the program made).
   A rank that cannot make its new communicator (no memory) makes every rank fail:
   the others with PDP_ERR_COMM naming it, *out NULL everywhere.
   E.g. 4 ranks as 2 data-parallel x 2 model-parallel groups:
     pdp_comm_split(world, rank / 2, rank, &mp);   ranks {0,1} and {2,3}
     pdp_comm_split(world, rank % 2, rank, &dp);   ranks {0,2} and {1,3} */
#define PDP_COMM_SPLIT_NONE (-1)
PDP_API pdp_status pdp_comm_split(pdp_comm *c, int colour, int key, pdp_comm **out);

/* ---- process meshes ----
   The ranks of world as a grid of sizes[0] x ... x sizes[ndim - 1] (PyTorch's DeviceMesh,
   Megatron's parallel_state), row-major: the last dimension varies fastest, so rank r sits
   at coordinates (c_0, ..., c_{n-1}) with r = sum of c_k x stride_k, stride_{n-1} = 1 and
   stride_k = sizes[k + 1] x stride_{k+1}. Along dimension k, the ranks that differ from this
   one in c_k alone, r + (i - c_k) stride_k for i < sizes[k], form this rank's group of k:
   pdp_mesh_group(m, k), a communicator made by pdp_comm_split (the backend, device and
   timeout of world), ranked by c_k and named for the dimension and the coordinates its
   members share, so that a collective's timeout or mismatch message says which group it
   was: "<world's name>.<k's name>(<j's name> c_j, ...)" over the other dimensions j, e.g.
   rank 5's TP group below is "world.TP(DP 1, PP 0)" (an unnamed dimension j is "dim<j>"
   there; world's name is cut at 24 characters; a name over 63 characters, which would lose
   the coordinates at its end, is "<world's name>.<k's name>(first rank r)" instead, r the
   group's first world rank). E.g. 8 ranks
   as DP x PP x TP = {2, 2, 2}: rank (d 2 + s) 2 + t; TP groups on neighbouring ranks {0 1}
   {2 3} {4 5} {6 7} (the dimension with the most traffic goes last), pipelines {0 2} {1 3}
   {4 6} {5 7}, data-parallel copies {0 4} {1 5} {2 6} {3 7}:
     pdp_mesh *mesh;
     CHECK(pdp_mesh_create(&mesh, world, 3, (int[]){2, 2, 2}, (const char *[]){"DP", "PP", "TP"}));
     pdp_comm *tp_comm = pdp_mesh_group(mesh, 2);   // rank 5: {4 5}, where it is rank 1
   Collective over world: every rank calls it with the same sizes. It makes one split per
   dimension, the last first (one that fails fails as pdp_comm_split says, its message then
   prefixed "pdp_mesh_create: dimension k's groups: "), then agrees that every rank
   succeeded, as pdp_comm_split does (a rank that cannot allocate its mesh makes the others
   fail with PDP_ERR_COMM naming it); a failed call leaves *out NULL and nothing allocated.
   names name the dimensions for pdp_mesh_format, each 1..15 characters (names, or one of
   them, may be NULL: dimension k is then "dim<k>", as in its groups' names; a name is
   refused when another dimension has it, "dim<k>" included).
   PDP_ERR_INVALID, before any collective and the same on every rank: the sizes' product
   is not world's size (the message names the sizes and world's size), ndim outside
   1..PDP_MESH_MAX_DIMS, a size below 1, NULL world, sizes or out, a name empty, too
   long or another dimension's. The mesh owns its groups, not world: free it (with its
   groups) before world. */
#define PDP_MESH_MAX_DIMS 8
typedef struct pdp_mesh pdp_mesh;
PDP_API pdp_status pdp_mesh_create(pdp_mesh **out, pdp_comm *world, int ndim, const int *sizes,
                                   const char *const *names);
PDP_API void pdp_mesh_free(pdp_mesh *m);
/* Dimension dim's group: this rank's communicator along it (NULL for a dim outside
   0..ndim-1 or a NULL m); and this rank's coordinate c_dim, its rank in that group (-1). */
PDP_API pdp_comm *pdp_mesh_group(const pdp_mesh *m, int dim);
PDP_API int pdp_mesh_coord(const pdp_mesh *m, int dim);
/* The world ranks of dimension dim's group, in their order in the group, into ranks
   (sizes[dim] ints; NULL: only the count). Returns their count (0 for a bad dim). */
PDP_API int pdp_mesh_members(const pdp_mesh *m, int dim, int *ranks);
/* This rank's place in the mesh, one line into buf: its world rank, its coordinates, then
   each dimension's group, "rank 5 (DP 1, PP 0, TP 1): DP {1 5}  PP {5 7}  TP {4 5}".
   PDP_ERR_INVALID when it does not fit (naming the bytes it needs), or for NULL m or buf. */
PDP_API pdp_status pdp_mesh_format(const pdp_mesh *m, char *buf, size_t bytes);

/* Completes a collective and recycles its handle (NULL is fine). The error of
   a failed collective is returned here, with its message. */
PDP_API pdp_status pdp_work_wait(pdp_work *work);
/* The same as pdp_work_wait (the short name used in the docs). */
PDP_API pdp_status pdp_wait(pdp_work *work);
/* true once the collective has completed (the handle stays valid until waited). */
PDP_API bool pdp_work_done(pdp_work *work);

/* Per-communicator counters, for learners and benchmarks. */
typedef struct pdp_comm_stats {
    int64_t collectives;   /* issued */
    int64_t bytes_sent;    /* by this rank in the bandwidth-optimal algorithm (the bytes
                              of the elements: 4 per float, 2 per BF16/F16): all-reduce
                              2(N-1)/N x bytes (the ring figure), broadcast and
                              reduce-scatter (N-1)/N x bytes, all-gather (N-1) x sent */
    double busy_s;         /* summed execution time of the waited collectives, from the
                              moment the backend starts one to its completion (queueing
                              behind earlier collectives excluded); a message's from its
                              launch to its completion */
    int64_t p2p;           /* point-to-point messages issued (sends and receives); their
                              bytes_sent is count x 4 per send */
} pdp_comm_stats;
PDP_API void pdp_comm_get_stats(const pdp_comm *c, pdp_comm_stats *out);
