/* rendezvous: who the ranks are and how they meet, the way torchrun does it.

   pdp_env_read reads the launcher's variables (torchrun's RANK, WORLD_SIZE,
   LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, else OpenMPI's
   OMPI_COMM_WORLD_*); every value is checked, and a bad one is PDP_ERR_INVALID
   naming the variable. It never talks to anyone.

   A backend whose library needs one blob made on rank 0 before it can start
   (NCCL's unique id) meets the other ranks through the TCP store (store.c):
     pdp__rendezvous_store   every rank opens the store at MASTER_ADDR: rank 0
                             serves it. The port is MASTER_PORT, or MASTER_PORT + 1
                             under torchrun (TORCHELASTIC_RUN_ID is set: torchrun's
                             own store holds MASTER_PORT), or PDP_STORE_PORT when
                             set. A world of one opens nothing (store NULL).
     pdp__rendezvous_share   rank 0 sets the blob at key, the others get it, and
                             all meet at the barrier "<key>_read", so every rank
                             holds the blob before rank 0's store may go away.
   The caller keeps the store open until its library's own, collective,
   initialisation has returned, then frees it: rank 0's server then outlives
   every rank's barrier reply. Every wait ends by the timeout (PDP_ERR_TIMEOUT
   naming the key); messages name the public caller, the library and the rank. */

#include "internal.h"
#include <limits.h>

/* ---- rendezvous: the environment ---- */

/* getenv, with an empty value counting as unset (`RANK= ./train`). */
PDP__PRIVATE const char *pdp__env_get(const char *name)
{
    const char *v = getenv(name);
    return (v && v[0]) ? v : NULL;
}

/* Parses the whole of value as a decimal integer in [lo, hi]; why says what the
   range means in the message. */
PDP__PRIVATE pdp_status pdp__env_int(const char *name, const char *value, long lo, long hi,
                                     const char *why, int *out)
{
    char *end;
    long x;
    errno = 0;
    x = strtol(value, &end, 10);
    if (end == value || *end != '\0' || errno == ERANGE)
        return pdp__err(PDP_ERR_INVALID, "pdp_env_read: %s='%.64s' is not an integer", name, value);
    if (x < lo || x > hi)
        return pdp__err(PDP_ERR_INVALID, "pdp_env_read: %s=%ld is outside %ld..%ld%s", name, x, lo,
                        hi, why);
    *out = (int)x;
    return PDP_OK;
}

PDP_API pdp_status pdp_env_read(pdp_env_info *out)
{
    static const char *const torchrun[4] = {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                                            "LOCAL_WORLD_SIZE"};
    static const char *const ompi[4] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                        "OMPI_COMM_WORLD_LOCAL_RANK",
                                        "OMPI_COMM_WORLD_LOCAL_SIZE"};
    const char *const *names = NULL;
    const char *v;
    char why[96];
    pdp_env_info e;
    pdp_status st;

    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_env_read: out is NULL");
    memset(&e, 0, sizeof e);
    e.world_size = 1;
    e.local_world_size = 1;
    strcpy(e.master_addr, PDP__STORE_DEFAULT_HOST);
    e.master_port = PDP__STORE_DEFAULT_PORT;
    *out = e;

    if (pdp__env_get(torchrun[0]) || pdp__env_get(torchrun[1])) names = torchrun;
    else if (pdp__env_get(ompi[0]) || pdp__env_get(ompi[1])) names = ompi;
    if (names) {
        if (!pdp__env_get(names[0]) || !pdp__env_get(names[1]))
            return pdp__err(PDP_ERR_INVALID, "pdp_env_read: %s is set but %s is not",
                            pdp__env_get(names[0]) ? names[0] : names[1],
                            pdp__env_get(names[0]) ? names[1] : names[0]);
        st = pdp__env_int(names[1], pdp__env_get(names[1]), 1, INT_MAX, "", &e.world_size);
        if (st != PDP_OK) return st;
        snprintf(why, sizeof why, " (it must be below %s=%d)", names[1], e.world_size);
        st = pdp__env_int(names[0], pdp__env_get(names[0]), 0, e.world_size - 1, why, &e.rank);
        if (st != PDP_OK) return st;
        e.local_world_size = e.world_size;
        if ((v = pdp__env_get(names[3])) != NULL) {
            snprintf(why, sizeof why, " (it cannot exceed %s=%d)", names[1], e.world_size);
            st = pdp__env_int(names[3], v, 1, e.world_size, why, &e.local_world_size);
            if (st != PDP_OK) return st;
        }
        e.local_rank = e.rank % e.local_world_size; /* ranks laid out node by node */
        if ((v = pdp__env_get(names[2])) != NULL) {
            snprintf(why, sizeof why, " (it must be below %s=%d)", names[3], e.local_world_size);
            st = pdp__env_int(names[2], v, 0, e.local_world_size - 1, why, &e.local_rank);
            if (st != PDP_OK) return st;
        }
        e.from_env = true;
    }
    if ((v = pdp__env_get("MASTER_ADDR")) != NULL) {
        if (strlen(v) >= sizeof e.master_addr)
            return pdp__err(PDP_ERR_INVALID, "pdp_env_read: MASTER_ADDR='%.64s...' is %zu bytes "
                            "long (at most %zu)", v, strlen(v), sizeof e.master_addr - 1);
        strcpy(e.master_addr, v);
    }
    if ((v = pdp__env_get("MASTER_PORT")) != NULL) {
        st = pdp__env_int("MASTER_PORT", v, 1, 65535, "", &e.master_port);
        if (st != PDP_OK) return st;
    }
    *out = e;
    return PDP_OK;
}

/* ---- rendezvous: a blob from rank 0, through the TCP store ---- */

/* Opens env's store (*out NULL for a world of one); what names the library
   ("NCCL") and fn the public caller in messages. */
PDP__PRIVATE pdp_status pdp__rendezvous_store(pdp_store **out, const pdp_env_info *env,
                                              double timeout_s, const char *what, const char *fn)
{
    pdp_store_desc sd;
    const char *port_env;
    pdp_status st;
    *out = NULL;
    memset(&sd, 0, sizeof sd);
    sd.host = env->master_addr;
    sd.port = env->master_port;
    /* torchrun's own store holds MASTER_PORT; ours takes the next port */
    if (getenv("TORCHELASTIC_RUN_ID")) sd.port = env->master_port + 1;
    if ((port_env = getenv("PDP_STORE_PORT")) && *port_env) {
        pdp_status pst = pdp__env_int("PDP_STORE_PORT", port_env, 1, 65535, "", &sd.port);
        if (pst != PDP_OK) return pdp__err_wrap(pst, "%s: %s: rank %d of %d", fn, what, env->rank,
                                                env->world_size);
    }
    sd.is_server = env->rank == 0;
    sd.world_size = env->world_size;
    sd.timeout_s = timeout_s;
    if (env->world_size > 1) {
        if ((st = pdp_store_create(out, &sd)) != PDP_OK)
            return pdp__err_wrap(st, "%s: %s: rank %d of %d: the TCP store", fn, what, env->rank,
                                 env->world_size);
    }
    return PDP_OK;
}

/* Rank 0's blob[0..bytes) (made before the call) reaches every rank's blob through
   store (NULL: a world of one, nothing to do); then every rank meets at
   "<key>_read". */
PDP__PRIVATE pdp_status pdp__rendezvous_share(pdp_store *store, const pdp_env_info *env,
                                              const char *key, void *blob, size_t bytes,
                                              double timeout_s, const char *what, const char *fn)
{
    char read_key[PDP_STORE_MAX_KEY + 1];
    pdp_status st;
    if (!store) return PDP_OK;
    if (env->rank == 0) {
        if ((st = pdp_store_set(store, key, blob, bytes)) != PDP_OK)
            return pdp__err_wrap(st, "%s: rank 0 publishing the %s id", fn, what);
    } else if ((st = pdp_store_get(store, key, blob, bytes, NULL)) != PDP_OK) {
        return pdp__err_wrap(st, "%s: rank %d of %d waiting for the %s id from rank 0", fn,
                             env->rank, env->world_size, what);
    }
    /* everyone holds the id before rank 0's store may go away */
    snprintf(read_key, sizeof read_key, "%s_read", key);
    if ((st = pdp_store_barrier(store, read_key, env->world_size, timeout_s)) != PDP_OK)
        return pdp__err_wrap(st, "%s: rank %d of %d", fn, env->rank, env->world_size);
    return PDP_OK;
}
