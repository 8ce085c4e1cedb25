/* store: a small TCP key-value store (rendezvous.h says who the ranks are and
   where rank 0 serves it).

   The store is PyTorch's TCPStore in miniature: rank 0 serves it from a thread
   inside its own process, every rank (rank 0 too, through loopback) is a client.
   Ranks exchange small blobs through it before a collective library exists (the
   NCCL unique id) and synchronise with counters and barriers. Every blocking call
   ends by its timeout with PDP_ERR_TIMEOUT naming the key; nothing hangs. */

/* Limits a server enforces on every request (a foreign peer gets an error reply
   and is disconnected); a client checks them before sending. */
#ifndef PDP_STORE_MAX_KEY
#  define PDP_STORE_MAX_KEY 1024                 /* bytes, without the NUL */
#endif
#ifndef PDP_STORE_MAX_VALUE
#  define PDP_STORE_MAX_VALUE (1024 * 1024)      /* bytes */
#endif

typedef struct pdp_store pdp_store;

typedef struct pdp_store_desc {
    const char *host; /* client: server to reach; server: address to bind, "0.0.0.0" for
                         every interface (needed across machines); "127.0.0.1" */
    int port;         /* 29500; 0 on the server = a free ephemeral port (pdp_store_port) */
    bool is_server;   /* true on exactly one rank (rank 0): serve, then connect as a client */
    int world_size;   /* ranks taking part; default for pdp_store_barrier; 0 = unknown */
    double timeout_s; /* connect and default wait timeout, seconds; 300 */
} pdp_store_desc;

/* Creates a store handle. A server binds host:port, listens and starts its thread,
   then connects to itself like any client (to 127.0.0.1 when host is a wildcard
   such as "0.0.0.0"). A client retries the connection until timeout_s passes
   (the server may start later): PDP_ERR_TIMEOUT naming host:port. Calls on one
   handle are serialised; a thread that blocks in get/wait blocks the others on
   the same handle, so give each thread that waits its own handle. */
PDP_API pdp_status pdp_store_create(pdp_store **out, const pdp_store_desc *desc);
/* Closes the connection; on the server, also stops the thread and drops every
   client still connected. NULL is fine. */
PDP_API void pdp_store_free(pdp_store *s);
/* The server's port (the one bound when desc.port was 0). */
PDP_API int pdp_store_port(const pdp_store *s);

/* key: a NUL-terminated string of 1..PDP_STORE_MAX_KEY bytes. value: up to
   PDP_STORE_MAX_VALUE bytes (0 is fine); replaces any previous value and wakes
   every rank waiting for the key. */
PDP_API pdp_status pdp_store_set(pdp_store *s, const char *key, const void *value, size_t bytes);
/* Waits until key exists (the store's timeout_s), then copies its value into
   buf[0..cap) and its length into *bytes (may be NULL). A value longer than cap
   is PDP_ERR_INVALID with *bytes set to its length. */
PDP_API pdp_status pdp_store_get(pdp_store *s, const char *key, void *buf, size_t cap,
                                 size_t *bytes);
/* Waits until all n keys exist; timeout_s covers the whole call (0 = the store's). */
PDP_API pdp_status pdp_store_wait(pdp_store *s, const char **keys, int n, double timeout_s);
/* Atomically adds delta to the counter at key (a missing key counts as 0) and
   returns the new value in *result (may be NULL). Counters are stored as decimal
   text, so pdp_store_get on one reads e.g. "3". */
PDP_API pdp_status pdp_store_add(pdp_store *s, const char *key, int64_t delta, int64_t *result);
/* Returns once world_size ranks (0 = desc.world_size) have called it with this
   name; reusable: the k-th call on every rank meets the k-th call on the others (each
   rank's handle counts its own calls, a call that timed out included: one handle a
   rank). More arrivals in a round than a rank's world_size (two ranks with one id, or
   world sizes that differ) is PDP_ERR_INVALID on that rank. */
PDP_API pdp_status pdp_store_barrier(pdp_store *s, const char *name, int world_size,
                                     double timeout_s);
