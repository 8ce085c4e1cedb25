/* store: torchrun-style rendezvous from the environment, and a TCP key-value store.

   Server. One thread in the rank-0 process runs a poll() loop over a wake pipe,
   the listening socket and every client connection; all sockets are non-blocking
   and only that thread touches the table of keys, so the server needs no lock and
   a slow, stuck or hostile peer cannot stall the others. Each connection carries
   one request at a time. A GET or WAIT for a missing key is parked on its
   connection with a deadline: the SET or ADD that creates the key answers it,
   otherwise the loop answers TIMEOUT when the deadline passes (poll sleeps until
   the nearest one). Timeouts are therefore decided by the server and the stream
   never falls out of step; a client only adds a grace period so that a server
   that vanished silently cannot hang it. pdp_store_free writes one byte into the
   wake pipe, joins the thread and closes what is left: clients still connected
   see EOF.

   Client. A blocking request/response on a non-blocking socket, every wait
   bounded by poll() against a deadline. Connecting retries (10 ms doubling to
   250 ms) until the timeout, so ranks may start before rank 0. Any I/O failure
   closes the connection and later calls fail with PDP_ERR_COMM; the store does
   not reconnect, since a request in flight could have been applied or not.

   Wire format (both ways, big-endian): a 24-byte header
       u32 magic 'PDPS' | u8 op or status | u8 version (1) | u16 0 |
       u32 key bytes | u32 value bytes | u64 arg
   then the key, then the value. arg is the timeout in ms for GET and WAIT, the
   delta (two's complement) for ADD, and ADD's new value in its reply. Replies
   carry no key; an ERROR reply carries a message as its value. The server checks
   every header before it allocates: a wrong magic is dropped at once, a bad
   version, op, key length (1..PDP_STORE_MAX_KEY) or value length (at most
   PDP_STORE_MAX_VALUE) gets an ERROR reply and then the connection is closed.

   Counters (ADD) are decimal text, as in PyTorch's TCPStore. Barriers are an ADD
   on "pdp/barrier/<name>" plus a WAIT on "pdp/barrier/<name>/<generation>", which
   the last rank of each generation sets, so one name can be reused. Keys live in
   a flat array searched linearly: a rendezvous store holds tens of keys, and
   every barrier generation adds one.

   SIGPIPE: every send uses MSG_NOSIGNAL (SO_NOSIGPIPE where that is missing), so
   process-wide signal handling is never touched. */

#include "internal.h"
#include <limits.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>

#ifndef MSG_NOSIGNAL
#  define MSG_NOSIGNAL 0 /* BSD and macOS: SO_NOSIGPIPE is set on every socket instead */
#endif

#define PDP__STORE_DEFAULT_HOST "127.0.0.1"
#define PDP__STORE_DEFAULT_PORT 29500
#define PDP__STORE_DEFAULT_TIMEOUT 300.0
#define PDP__STORE_GRACE_S 5.0          /* client waits this much past a server-side timeout */
#define PDP__STORE_MAX_CONNS 4096       /* further connections are accepted and closed */
#define PDP__STORE_MAX_TIMEOUT_MS 1000000000000ull

/* ---- environment ---- */

/* getenv, with an empty value counting as unset (`RANK= ./train`). */
static const char *pdp__env_get(const char *name)
{
    const char *v = getenv(name);
    return (v && v[0]) ? v : NULL;
}

/* Parses the whole of value as a decimal integer in [lo, hi]; why says what the
   range means in the message. */
static pdp_status pdp__env_int(const char *name, const char *value, long lo, long hi,
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

/* ---- wire protocol ---- */

#define PDP__STORE_MAGIC 0x50445053u /* "PDPS" */
#define PDP__STORE_VERSION 1
#define PDP__STORE_HDR 24

enum { PDP__STORE_SET = 1, PDP__STORE_GET = 2, PDP__STORE_WAIT = 3, PDP__STORE_ADD = 4 };
enum { PDP__STORE_OK = 0, PDP__STORE_TIMEOUT = 1, PDP__STORE_ERROR = 2 };

typedef struct pdp__store_hdr {
    uint32_t magic;
    int code; /* op in a request, status in a reply */
    int version;
    uint32_t key_bytes, value_bytes;
    uint64_t arg;
} pdp__store_hdr;

static void pdp__store_put(unsigned char *p, uint64_t x, int bytes)
{
    int i;
    for (i = bytes - 1; i >= 0; i--, x >>= 8) p[i] = (unsigned char)(x & 0xff);
}

static uint64_t pdp__store_take(const unsigned char *p, int bytes)
{
    uint64_t x = 0;
    int i;
    for (i = 0; i < bytes; i++) x = (x << 8) | p[i];
    return x;
}

static void pdp__store_pack(unsigned char *p, int code, uint32_t key_bytes, uint32_t value_bytes,
                            uint64_t arg)
{
    pdp__store_put(p, PDP__STORE_MAGIC, 4);
    p[4] = (unsigned char)code;
    p[5] = PDP__STORE_VERSION;
    p[6] = p[7] = 0;
    pdp__store_put(p + 8, key_bytes, 4);
    pdp__store_put(p + 12, value_bytes, 4);
    pdp__store_put(p + 16, arg, 8);
}

static pdp__store_hdr pdp__store_unpack(const unsigned char *p)
{
    pdp__store_hdr h;
    h.magic = (uint32_t)pdp__store_take(p, 4);
    h.code = p[4];
    h.version = p[5];
    h.key_bytes = (uint32_t)pdp__store_take(p + 8, 4);
    h.value_bytes = (uint32_t)pdp__store_take(p + 12, 4);
    h.arg = pdp__store_take(p + 16, 8);
    return h;
}

static uint64_t pdp__store_ms(double seconds)
{
    double ms = ceil(seconds * 1000.0);
    if (!(ms > 0.0)) return 0;
    return ms >= (double)PDP__STORE_MAX_TIMEOUT_MS ? PDP__STORE_MAX_TIMEOUT_MS : (uint64_t)ms;
}

/* ---- sockets ---- */

/* strerror without its shared buffer: glibc's strerror_r is the GNU variant under
   _GNU_SOURCE and the XSI one otherwise. */
static const char *pdp__store_errstr(int e, char *buf, size_t cap)
{
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
    return strerror_r(e, buf, cap);
#else
    if (strerror_r(e, buf, cap) != 0) snprintf(buf, cap, "errno %d", e);
    return buf;
#endif
}

/* Non-blocking, close-on-exec, no SIGPIPE, no Nagle (requests are small and
   latency-bound). */
static void pdp__store_tune(int fd, bool tcp)
{
    int one = 1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    fcntl(fd, F_SETFD, fcntl(fd, F_GETFD) | FD_CLOEXEC);
#ifdef SO_NOSIGPIPE
    setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one);
#endif
    if (tcp) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void pdp__store_sleep(double seconds)
{
    struct timespec ts;
    if (seconds <= 0) return;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* poll() one fd for events until deadline (pdp__now() seconds): 1 ready, 0 timed
   out, -1 error (errno). */
static int pdp__store_poll1(int fd, short events, double deadline)
{
    for (;;) {
        struct pollfd p;
        double left = deadline - pdp__now();
        int r;
        if (left <= 0) return 0;
        p.fd = fd;
        p.events = events;
        p.revents = 0;
        r = poll(&p, 1, left > 1e6 ? 1000000000 : (int)ceil(left * 1000.0));
        if (r > 0) return 1;
        if (r < 0 && errno != EINTR) return -1;
    }
}

static int pdp__store_port_of(int fd)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}

/* ---- server: key table ---- */

typedef struct pdp__store_entry {
    unsigned char *data; /* key bytes then value bytes, one allocation */
    uint32_t key_bytes, value_bytes;
} pdp__store_entry;

typedef struct pdp__store_conn {
    int fd;
    unsigned char hdr[PDP__STORE_HDR];
    size_t hdr_got;
    pdp__store_hdr req;       /* valid once hdr_got == PDP__STORE_HDR */
    unsigned char *body;      /* the request's key then value */
    size_t body_cap, body_got;
    unsigned char *out;       /* the reply being sent */
    size_t out_cap, out_len, out_sent;
    bool waiting;             /* a GET/WAIT parked until its key appears or deadline */
    double deadline;
    bool close_after_reply;   /* protocol error: hang up once the ERROR reply is out */
    bool dead;
} pdp__store_conn;

typedef struct pdp__store_server {
    int listen_fd;
    int wake[2];              /* pipe: pdp_store_free writes, the loop reads and stops */
    pthread_t thread;
    pdp__store_conn **conns;
    int n_conns, cap_conns;
    struct pollfd *pfds;      /* wake, listen, then one per connection */
    int cap_pfds;
    pdp__store_entry *entries;
    int n_entries, cap_entries;
} pdp__store_server;

/* Returns an array of at least need elements of elem bytes holding p's *cap old
   ones: p itself when it is big enough, else a new block (p freed, *cap updated);
   NULL when out of memory, with p untouched. */
static void *pdp__store_grow(void *p, int *cap, int need, size_t elem)
{
    int n = *cap ? *cap : 8;
    void *q;
    if (need <= *cap) return p;
    while (n < need) n *= 2;
    q = pdp__calloc((size_t)n * elem);
    if (!q) return NULL;
    if (p) memcpy(q, p, (size_t)*cap * elem);
    pdp__dealloc(p);
    *cap = n;
    return q;
}

static bool pdp__store_reserve(unsigned char **buf, size_t *cap, size_t need)
{
    unsigned char *q;
    if (need <= *cap) return true;
    q = (unsigned char *)pdp__alloc(need);
    if (!q) return false;
    pdp__dealloc(*buf);
    *buf = q;
    *cap = need;
    return true;
}

static pdp__store_entry *pdp__store_find(pdp__store_server *srv, const unsigned char *key,
                                         uint32_t key_bytes)
{
    int i;
    for (i = 0; i < srv->n_entries; i++) {
        pdp__store_entry *e = &srv->entries[i];
        if (e->key_bytes == key_bytes && memcmp(e->data, key, key_bytes) == 0) return e;
    }
    return NULL;
}

/* Sets key to value (replacing), or returns false when out of memory. */
static bool pdp__store_put_entry(pdp__store_server *srv, const unsigned char *key,
                                 uint32_t key_bytes, const void *value, uint32_t value_bytes)
{
    pdp__store_entry *e = pdp__store_find(srv, key, key_bytes);
    unsigned char *data = (unsigned char *)pdp__alloc((size_t)key_bytes + value_bytes);
    if (!data) return false;
    if (!e) {
        pdp__store_entry *grown = (pdp__store_entry *)pdp__store_grow(
            srv->entries, &srv->cap_entries, srv->n_entries + 1, sizeof *srv->entries);
        if (!grown) {
            pdp__dealloc(data);
            return false;
        }
        srv->entries = grown;
        e = &srv->entries[srv->n_entries++];
        e->data = NULL;
    }
    memcpy(data, key, key_bytes);
    if (value_bytes) memcpy(data + key_bytes, value, value_bytes);
    pdp__dealloc(e->data);
    e->data = data;
    e->key_bytes = key_bytes;
    e->value_bytes = value_bytes;
    return true;
}

/* ---- server: connections ---- */

/* Sends what it can of c's reply; the rest goes when poll reports POLLOUT. */
static void pdp__store_flush(pdp__store_conn *c)
{
    while (c->out_sent < c->out_len) {
        ssize_t r = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent, MSG_NOSIGNAL);
        if (r > 0) {
            c->out_sent += (size_t)r;
        } else if (r < 0 && errno == EINTR) {
            continue;
        } else {
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            c->dead = true;
            return;
        }
    }
    c->out_len = c->out_sent = 0;
    if (c->close_after_reply) c->dead = true;
}

/* Queues a reply, ends the current request and starts sending. */
static void pdp__store_reply(pdp__store_conn *c, int status, const void *value, uint32_t bytes,
                             uint64_t arg)
{
    if (!pdp__store_reserve(&c->out, &c->out_cap, PDP__STORE_HDR + (size_t)bytes)) {
        c->dead = true; /* the client sees EOF: PDP_ERR_COMM on its side */
        return;
    }
    pdp__store_pack(c->out, status, 0, bytes, arg);
    if (bytes) memcpy(c->out + PDP__STORE_HDR, value, bytes);
    c->out_len = PDP__STORE_HDR + (size_t)bytes;
    c->out_sent = 0;
    c->waiting = false;
    c->hdr_got = c->body_got = 0;
    pdp__store_flush(c);
}

static void pdp__store_reply_error(pdp__store_conn *c, bool hang_up, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->close_after_reply = hang_up;
    pdp__store_reply(c, PDP__STORE_ERROR, msg, (uint32_t)strlen(msg), 0);
}

/* Answers a parked GET/WAIT from entry e. */
static void pdp__store_answer(pdp__store_conn *c, const pdp__store_entry *e)
{
    if (c->req.code == PDP__STORE_GET)
        pdp__store_reply(c, PDP__STORE_OK, e->data + e->key_bytes, e->value_bytes, 0);
    else
        pdp__store_reply(c, PDP__STORE_OK, NULL, 0, 0);
}

/* A key was created or changed: answer everyone waiting for it. */
static void pdp__store_wake_waiters(pdp__store_server *srv, const pdp__store_entry *e)
{
    int i;
    for (i = 0; i < srv->n_conns; i++) {
        pdp__store_conn *c = srv->conns[i];
        if (c->waiting && !c->dead && c->req.key_bytes == e->key_bytes &&
            memcmp(c->body, e->data, e->key_bytes) == 0)
            pdp__store_answer(c, e);
    }
}

/* Applies ADD: counters are decimal text; a value that is not one is an error. */
static void pdp__store_add_op(pdp__store_server *srv, pdp__store_conn *c)
{
    const unsigned char *key = c->body;
    uint32_t kb = c->req.key_bytes;
    int64_t delta = (int64_t)c->req.arg, cur = 0, next;
    pdp__store_entry *e = pdp__store_find(srv, key, kb);
    char text[32];
    if (e) {
        char *end;
        if (e->value_bytes == 0 || e->value_bytes >= sizeof text) {
            pdp__store_reply_error(c, false, "value of '%.*s' is not a counter", (int)kb,
                                   (const char *)key);
            return;
        }
        memcpy(text, e->data + kb, e->value_bytes);
        text[e->value_bytes] = '\0';
        errno = 0;
        cur = (int64_t)strtoll(text, &end, 10);
        if (*end != '\0' || errno == ERANGE) {
            pdp__store_reply_error(c, false, "value of '%.*s' is not a counter", (int)kb,
                                   (const char *)key);
            return;
        }
    }
    if ((delta > 0 && cur > INT64_MAX - delta) || (delta < 0 && cur < INT64_MIN - delta)) {
        pdp__store_reply_error(c, false, "counter '%.*s' would overflow", (int)kb,
                               (const char *)key);
        return;
    }
    next = cur + delta;
    snprintf(text, sizeof text, "%lld", (long long)next);
    if (!pdp__store_put_entry(srv, key, kb, text, (uint32_t)strlen(text))) {
        pdp__store_reply_error(c, false, "server out of memory");
        return;
    }
    pdp__store_reply(c, PDP__STORE_OK, NULL, 0, (uint64_t)next);
    pdp__store_wake_waiters(srv, pdp__store_find(srv, key, kb));
}

/* The request in c (header and body) is complete: carry it out. */
static void pdp__store_execute(pdp__store_server *srv, pdp__store_conn *c)
{
    const unsigned char *key = c->body;
    uint32_t kb = c->req.key_bytes;
    pdp__store_entry *e;
    switch (c->req.code) {
    case PDP__STORE_SET:
        if (!pdp__store_put_entry(srv, key, kb, c->body + kb, c->req.value_bytes)) {
            pdp__store_reply_error(c, false, "server out of memory");
            return;
        }
        pdp__store_reply(c, PDP__STORE_OK, NULL, 0, 0);
        pdp__store_wake_waiters(srv, pdp__store_find(srv, key, kb));
        return;
    case PDP__STORE_GET:
    case PDP__STORE_WAIT:
        if ((e = pdp__store_find(srv, key, kb)) != NULL) {
            pdp__store_answer(c, e);
        } else {
            c->waiting = true;
            c->deadline = pdp__now() + (double)c->req.arg / 1000.0;
        }
        return;
    case PDP__STORE_ADD:
        pdp__store_add_op(srv, c);
        return;
    default:
        PDP_ASSERT(!"op validated with the header");
    }
}

/* A complete header arrived: validate it before anything is allocated. */
static void pdp__store_check_header(pdp__store_conn *c)
{
    pdp__store_hdr h = pdp__store_unpack(c->hdr);
    size_t need;
    c->req = h;
    if (h.magic != PDP__STORE_MAGIC) {
        c->dead = true; /* not our protocol: no reply at all */
        return;
    }
    if (h.version != PDP__STORE_VERSION) {
        pdp__store_reply_error(c, true, "protocol version %d, server speaks %d", h.version,
                               PDP__STORE_VERSION);
        return;
    }
    if (h.code < PDP__STORE_SET || h.code > PDP__STORE_ADD) {
        pdp__store_reply_error(c, true, "unknown request %d", h.code);
        return;
    }
    if (h.key_bytes == 0 || h.key_bytes > PDP_STORE_MAX_KEY) {
        pdp__store_reply_error(c, true, "key of %lu bytes (1..%d allowed)",
                               (unsigned long)h.key_bytes, PDP_STORE_MAX_KEY);
        return;
    }
    if (h.value_bytes > (h.code == PDP__STORE_SET ? (uint32_t)PDP_STORE_MAX_VALUE : 0u)) {
        pdp__store_reply_error(c, true, "value of %lu bytes (at most %lu allowed for request %d)",
                               (unsigned long)h.value_bytes,
                               h.code == PDP__STORE_SET ? (unsigned long)PDP_STORE_MAX_VALUE : 0ul,
                               h.code);
        return;
    }
    need = (size_t)h.key_bytes + h.value_bytes;
    if (!pdp__store_reserve(&c->body, &c->body_cap, need)) {
        pdp__store_reply_error(c, true, "server out of memory");
        return;
    }
    c->body_got = 0;
}

/* Reads what is there for c's current request; executes it once complete. */
static void pdp__store_read(pdp__store_server *srv, pdp__store_conn *c)
{
    unsigned char *dst;
    size_t want;
    ssize_t r;
    if (c->hdr_got < PDP__STORE_HDR) {
        dst = c->hdr + c->hdr_got;
        want = PDP__STORE_HDR - c->hdr_got;
    } else {
        dst = c->body + c->body_got;
        want = (size_t)c->req.key_bytes + c->req.value_bytes - c->body_got;
    }
    r = recv(c->fd, dst, want, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        c->dead = true; /* EOF or reset: the client left */
        return;
    }
    if (r < 0) return;
    if (c->hdr_got < PDP__STORE_HDR) {
        c->hdr_got += (size_t)r;
        if (c->hdr_got < PDP__STORE_HDR) return;
        pdp__store_check_header(c);
        if (c->dead || c->out_len) return; /* rejected */
    } else {
        c->body_got += (size_t)r;
    }
    if (c->body_got == (size_t)c->req.key_bytes + c->req.value_bytes) pdp__store_execute(srv, c);
}

static void pdp__store_conn_free(pdp__store_conn *c)
{
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    pdp__dealloc(c->body);
    pdp__dealloc(c->out);
    pdp__dealloc(c);
}

static void pdp__store_accept(pdp__store_server *srv)
{
    for (;;) {
        pdp__store_conn **conns, *c = NULL;
        struct pollfd *pfds;
        int fd = accept(srv->listen_fd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            return; /* EAGAIN: none left; EMFILE and the like: retried on the next poll */
        }
        pdp__store_tune(fd, true);
        if (srv->n_conns < PDP__STORE_MAX_CONNS) {
            conns = (pdp__store_conn **)pdp__store_grow(srv->conns, &srv->cap_conns,
                                                        srv->n_conns + 1, sizeof *conns);
            if (conns) srv->conns = conns;
            pfds = (struct pollfd *)pdp__store_grow(srv->pfds, &srv->cap_pfds, srv->n_conns + 3,
                                                    sizeof *pfds);
            if (pfds) srv->pfds = pfds;
            if (conns && pfds) c = (pdp__store_conn *)pdp__calloc(sizeof *c);
        }
        if (!c) {
            close(fd); /* too many connections, or out of memory */
            continue;
        }
        c->fd = fd;
        srv->conns[srv->n_conns++] = c;
    }
}

/* ---- server: the loop ---- */

static void *pdp__store_serve(void *arg)
{
    pdp__store_server *srv = (pdp__store_server *)arg;
    for (;;) {
        int i, n, r, timeout_ms = -1, polled;
        double now = pdp__now();
        polled = srv->n_conns;
        srv->pfds[0].fd = srv->wake[0];
        srv->pfds[0].events = POLLIN;
        srv->pfds[1].fd = srv->listen_fd;
        srv->pfds[1].events = POLLIN;
        for (i = 0; i < polled; i++) {
            pdp__store_conn *c = srv->conns[i];
            srv->pfds[i + 2].fd = c->fd;
            srv->pfds[i + 2].events = c->out_len ? POLLOUT : POLLIN;
            if (c->waiting) {
                double left = c->deadline - now;
                int ms = left <= 0 ? 0 : left > 1e6 ? 1000000000 : (int)ceil(left * 1000.0);
                if (timeout_ms < 0 || ms < timeout_ms) timeout_ms = ms;
            }
        }
        for (i = 0; i < polled + 2; i++) srv->pfds[i].revents = 0;
        r = poll(srv->pfds, (nfds_t)(polled + 2), timeout_ms);
        if (r < 0 && errno != EINTR) pdp__store_sleep(0.001); /* ENOMEM: try again */
        if (srv->pfds[0].revents) break;
        for (i = 0; i < polled; i++) {
            pdp__store_conn *c = srv->conns[i];
            short ev = srv->pfds[i + 2].revents;
            if (!ev || c->dead) continue;
            if (c->out_len) {
                pdp__store_flush(c);
            } else if (c->waiting) {
                /* A parked client sends nothing: readable means it left (EOF) or
                   broke the protocol; either way the connection goes. */
                c->dead = true;
            } else {
                pdp__store_read(srv, c);
            }
        }
        if (srv->pfds[1].revents) pdp__store_accept(srv);
        now = pdp__now();
        for (i = 0; i < srv->n_conns; i++) {
            pdp__store_conn *c = srv->conns[i];
            if (c->waiting && !c->dead && now >= c->deadline)
                pdp__store_reply(c, PDP__STORE_TIMEOUT, NULL, 0, 0);
        }
        for (i = n = 0; i < srv->n_conns; i++) {
            if (srv->conns[i]->dead) pdp__store_conn_free(srv->conns[i]);
            else srv->conns[n++] = srv->conns[i];
        }
        srv->n_conns = n;
    }
    return NULL;
}
