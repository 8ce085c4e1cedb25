/* store: a TCP key-value store, PyTorch's TCPStore in miniature (rendezvous.c reads
   who the ranks are and hands a unique id out through it).

   Server. One thread in the rank-0 process runs a poll() loop over a wake channel,
   the listening socket and every client connection; all sockets are non-blocking
   and only that thread touches the table of keys, so the server needs no lock and
   a slow, stuck or hostile peer cannot stall the others. Each connection carries
   one request at a time. A GET or WAIT for a missing key is parked on its
   connection with a deadline: the SET or ADD that creates the key answers it,
   otherwise the loop answers TIMEOUT when the deadline passes (poll sleeps until
   the nearest one). Timeouts are therefore decided by the server and the stream
   never falls out of step; a client only adds a grace period so that a server
   that vanished silently cannot hang it. pdp_store_free signals the wake channel
   (a pipe; a loopback datagram on Windows), joins the thread and closes what is
   left: clients still connected see EOF.

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

   Counters (ADD) are decimal text, as in PyTorch's TCPStore. A barrier's k-th call on
   a handle (the handle counts its calls by name) is an ADD on "pdp/barrier/<name>/<k>/n"
   plus a WAIT on "pdp/barrier/<name>/<k>", which the last rank of round k sets, so one
   name can be reused and a call that timed out, whose arrival stays counted, is not
   counted again by the retry. Keys live in
   a flat array searched linearly: a rendezvous store holds tens of keys, and
   every barrier generation adds one.

   Sockets go through platform.h (POSIX sockets, or Winsock 2 with WSAPoll): every
   send there uses MSG_NOSIGNAL (SO_NOSIGPIPE where that is missing), so process-wide
   signal handling is never touched. */

#include "internal.h"
#include <limits.h>
#ifdef PDP__POSIX
#  include <netdb.h>
#  include <poll.h>
#  include <sys/socket.h>
#endif

#define PDP__STORE_DEFAULT_HOST "127.0.0.1"
#define PDP__STORE_DEFAULT_PORT 29500
#define PDP__STORE_DEFAULT_TIMEOUT 300.0
#define PDP__STORE_GRACE_S 5.0          /* client waits this much past a server-side timeout */
#define PDP__STORE_MAX_CONNS 4096       /* further connections are accepted and closed */
#define PDP__STORE_MAX_TIMEOUT_MS 1000000000000ull

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

PDP__PRIVATE void pdp__store_put(unsigned char *p, uint64_t x, int bytes)
{
    int i;
    for (i = bytes - 1; i >= 0; i--, x >>= 8) p[i] = (unsigned char)(x & 0xff);
}

PDP__PRIVATE uint64_t pdp__store_take(const unsigned char *p, int bytes)
{
    uint64_t x = 0;
    int i;
    for (i = 0; i < bytes; i++) x = (x << 8) | p[i];
    return x;
}

PDP__PRIVATE void pdp__store_pack(unsigned char *p, int code, uint32_t key_bytes,
                                  uint32_t value_bytes, uint64_t arg)
{
    pdp__store_put(p, PDP__STORE_MAGIC, 4);
    p[4] = (unsigned char)code;
    p[5] = PDP__STORE_VERSION;
    p[6] = p[7] = 0;
    pdp__store_put(p + 8, key_bytes, 4);
    pdp__store_put(p + 12, value_bytes, 4);
    pdp__store_put(p + 16, arg, 8);
}

PDP__PRIVATE pdp__store_hdr pdp__store_unpack(const unsigned char *p)
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

PDP__PRIVATE uint64_t pdp__store_ms(double seconds)
{
    double ms = ceil(seconds * 1000.0);
    if (!(ms > 0.0)) return 0;
    return ms >= (double)PDP__STORE_MAX_TIMEOUT_MS ? PDP__STORE_MAX_TIMEOUT_MS : (uint64_t)ms;
}

/* ---- server: key table ---- */

typedef struct pdp__store_entry {
    unsigned char *data; /* key bytes then value bytes, one allocation */
    uint32_t key_bytes, value_bytes;
} pdp__store_entry;

typedef struct pdp__store_conn {
    pdp__sock fd;
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
    pdp__sock listen_fd;
    pdp__wake wake;           /* pdp_store_free signals it, the loop wakes and stops */
    pdp__thread thread;
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
PDP__PRIVATE void *pdp__store_grow(void *p, int *cap, int need, size_t elem)
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

PDP__PRIVATE bool pdp__store_reserve(unsigned char **buf, size_t *cap, size_t need)
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

PDP__PRIVATE pdp__store_entry *pdp__store_find(pdp__store_server *srv, const unsigned char *key,
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
PDP__PRIVATE bool pdp__store_put_entry(pdp__store_server *srv, const unsigned char *key,
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
PDP__PRIVATE void pdp__store_flush(pdp__store_conn *c)
{
    while (c->out_sent < c->out_len) {
        long r = pdp__sock_send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent);
        int e = r < 0 ? pdp__sock_error() : 0;
        if (r > 0) {
            c->out_sent += (size_t)r;
        } else if (r < 0 && e == EINTR) {
            continue;
        } else {
            if (r < 0 && pdp__sock_retry(e)) return;
            c->dead = true;
            return;
        }
    }
    c->out_len = c->out_sent = 0;
    if (c->close_after_reply) c->dead = true;
}

/* Queues a reply, ends the current request and starts sending. */
PDP__PRIVATE void pdp__store_reply(pdp__store_conn *c, int status, const void *value,
                                   uint32_t bytes, uint64_t arg)
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

PDP__PRIVATE void pdp__store_reply_error(pdp__store_conn *c, bool hang_up, const char *fmt, ...)
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
PDP__PRIVATE void pdp__store_answer(pdp__store_conn *c, const pdp__store_entry *e)
{
    if (c->req.code == PDP__STORE_GET)
        pdp__store_reply(c, PDP__STORE_OK, e->data + e->key_bytes, e->value_bytes, 0);
    else
        pdp__store_reply(c, PDP__STORE_OK, NULL, 0, 0);
}

/* A key was created or changed: answer everyone waiting for it. */
PDP__PRIVATE void pdp__store_wake_waiters(pdp__store_server *srv, const pdp__store_entry *e)
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
PDP__PRIVATE void pdp__store_add_op(pdp__store_server *srv, pdp__store_conn *c)
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
PDP__PRIVATE void pdp__store_execute(pdp__store_server *srv, pdp__store_conn *c)
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
        PDP_ASSERT(0 && "op validated with the header");
    }
}

/* A complete header arrived: validate it before anything is allocated. */
PDP__PRIVATE void pdp__store_check_header(pdp__store_conn *c)
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
PDP__PRIVATE void pdp__store_read(pdp__store_server *srv, pdp__store_conn *c)
{
    unsigned char *dst;
    size_t want;
    long r;
    if (c->hdr_got < PDP__STORE_HDR) {
        dst = c->hdr + c->hdr_got;
        want = PDP__STORE_HDR - c->hdr_got;
    } else {
        dst = c->body + c->body_got;
        want = (size_t)c->req.key_bytes + c->req.value_bytes - c->body_got;
    }
    r = pdp__sock_recv(c->fd, dst, want);
    if (r == 0 || (r < 0 && !pdp__sock_retry(pdp__sock_error()))) {
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

PDP__PRIVATE void pdp__store_conn_free(pdp__store_conn *c)
{
    if (!c) return;
    if (c->fd != PDP__SOCK_NONE) pdp__sock_close(c->fd);
    pdp__dealloc(c->body);
    pdp__dealloc(c->out);
    pdp__dealloc(c);
}

PDP__PRIVATE void pdp__store_accept(pdp__store_server *srv)
{
    for (;;) {
        pdp__store_conn **conns, *c = NULL;
        struct pollfd *pfds;
        pdp__sock fd = accept(srv->listen_fd, NULL, NULL);
        if (fd == PDP__SOCK_NONE) {
            int e = pdp__sock_error();
            if (e == EINTR || e == ECONNABORTED) continue;
            if (!pdp__sock_retry(e))
                pdp__sleep_s(0.01); /* EMFILE and the like: retry soon, without spinning */
            return;
        }
        pdp__sock_tune(fd, true);
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
            pdp__sock_close(fd); /* too many connections, or out of memory */
            continue;
        }
        c->fd = fd;
        srv->conns[srv->n_conns++] = c;
    }
}

/* ---- server: the loop ---- */

PDP__PRIVATE void *pdp__store_serve(void *arg)
{
    pdp__store_server *srv = (pdp__store_server *)arg;
    for (;;) {
        int i, n, r, timeout_ms = -1, polled;
        double now = pdp__now();
        polled = srv->n_conns;
        srv->pfds[0].fd = srv->wake.rd;
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
        r = pdp__sock_poll(srv->pfds, polled + 2, timeout_ms);
        if (r < 0 && pdp__sock_error() != EINTR) pdp__sleep_s(0.001); /* ENOMEM: try again */
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

PDP__PRIVATE void pdp__store_server_free(pdp__store_server *srv)
{
    int i;
    if (!srv) return;
    for (i = 0; i < srv->n_conns; i++) pdp__store_conn_free(srv->conns[i]);
    for (i = 0; i < srv->n_entries; i++) pdp__dealloc(srv->entries[i].data);
    if (srv->listen_fd != PDP__SOCK_NONE) pdp__sock_close(srv->listen_fd);
    pdp__wake_close(&srv->wake);
    pdp__dealloc(srv->conns);
    pdp__dealloc(srv->pfds);
    pdp__dealloc(srv->entries);
    pdp__dealloc(srv);
}

/* Binds host:port, listens and starts the loop; *port gets the port bound. */
PDP__PRIVATE pdp_status pdp__store_server_start(pdp__store_server **out, const char *host,
                                                int *port)
{
    struct addrinfo hints, *res = NULL, *ai;
    pdp__store_server *srv;
    char service[16], why[128] = "no usable address";
    int rc, one = 1;

    *out = NULL;
    srv = (pdp__store_server *)pdp__calloc(sizeof *srv);
    if (!srv) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_store_create: out of memory");
    srv->listen_fd = PDP__SOCK_NONE;
    srv->wake.rd = PDP__SOCK_NONE;
#ifdef PDP__POSIX
    srv->wake.wr = -1;
#endif
    srv->pfds = (struct pollfd *)pdp__store_grow(NULL, &srv->cap_pfds, 2, sizeof *srv->pfds);
    if (!srv->pfds) {
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_store_create: out of memory");
    }

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    snprintf(service, sizeof service, "%d", *port);
    rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_COMM, "pdp_store_create: cannot resolve server address '%s': %s",
                        host, gai_strerror(rc));
    }
    for (ai = res; ai; ai = ai->ai_next) {
        pdp__sock fd = pdp__sock_open(ai->ai_family, ai->ai_socktype, ai->ai_protocol, false);
        if (fd == PDP__SOCK_NONE) {
            pdp__errstr(pdp__sock_error(), why, sizeof why);
            continue;
        }
#ifdef PDP__POSIX /* Winsock's SO_REUSEADDR would let another process bind the same port */
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
#else
        (void)one;
#endif
        if (bind(fd, ai->ai_addr, (socklen_t)ai->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            srv->listen_fd = fd;
            break;
        }
        pdp__errstr(pdp__sock_error(), why, sizeof why);
        pdp__sock_close(fd);
    }
    freeaddrinfo(res);
    if (srv->listen_fd == PDP__SOCK_NONE) {
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_COMM, "pdp_store_create: cannot listen on %s:%d: %s", host, *port,
                        why);
    }
    *port = pdp__sock_port(srv->listen_fd);
    if ((rc = pdp__wake_open(&srv->wake)) != 0) {
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_COMM, "pdp_store_create: cannot open the wake channel: %s",
                        pdp__errstr(rc, why, sizeof why));
    }
    if ((rc = pdp__thread_create(&srv->thread, pdp__store_serve, srv)) != 0) {
        pdp__store_server_free(srv);
        return pdp__err(PDP_ERR_COMM, "pdp_store_create: cannot start the server thread: %s",
                        pdp__errstr(rc, why, sizeof why));
    }
    *out = srv;
    return PDP_OK;
}

PDP__PRIVATE void pdp__store_server_stop(pdp__store_server *srv)
{
    if (!srv) return;
    pdp__wake_signal(&srv->wake);
    pdp__thread_join(&srv->thread);
    pdp__store_server_free(srv);
}

/* ---- client ---- */

typedef struct pdp__store_round { /* a barrier name's calls on a handle so far */
    char *name;
    int64_t calls;
} pdp__store_round;

struct pdp_store {
    pdp__sock fd;               /* connection to the server; PDP__SOCK_NONE once it broke */
    pdp__mutex lock;       /* one request at a time on this handle */
    char host[256];             /* as given (the server's own client may use loopback) */
    int port;
    int world_size;
    double timeout_s;
    pdp__store_server *server;  /* on the serving rank only */
    pdp__store_round *rounds;   /* barriers: this handle's calls, by name */
    int n_rounds, cap_rounds;
};

/* Connects s->fd to host:s->port, retrying until timeout_s has passed. */
PDP__PRIVATE pdp_status pdp__store_connect(pdp_store *s, const char *host)
{
    double deadline = pdp__now() + s->timeout_s, backoff = 0.01;
    char service[16], why[128] = "no attempt", attempt[128];
    snprintf(service, sizeof service, "%d", s->port);
    for (;;) {
        struct addrinfo hints, *res = NULL, *ai;
        double left;
        int rc;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        rc = getaddrinfo(host, service, &hints, &res);
        if (rc == 0) {
            for (ai = res; ai && s->fd == PDP__SOCK_NONE; ai = ai->ai_next) {
                s->fd = pdp__sock_connect(ai, deadline, attempt, sizeof attempt);
                /* an attempt the deadline cut short keeps the last real reason ("refused") */
                if (s->fd == PDP__SOCK_NONE &&
                    (pdp__now() < deadline || !strcmp(why, "no attempt")))
                    memcpy(why, attempt, sizeof why);
            }
            freeaddrinfo(res);
            if (s->fd != PDP__SOCK_NONE) return PDP_OK;
        } else if (rc == EAI_AGAIN) {
            snprintf(why, sizeof why, "%s", gai_strerror(rc)); /* DNS not ready yet */
        } else {
            return pdp__err(PDP_ERR_COMM, "pdp_store_create: cannot resolve store address '%s': %s",
                            host, gai_strerror(rc));
        }
        left = deadline - pdp__now();
        if (left <= 0)
            return pdp__err(PDP_ERR_TIMEOUT, "pdp_store_create: no store server at %s:%d within "
                            "%g s (last error: %s)", host, s->port, s->timeout_s, why);
        pdp__sleep_s(PDP__MIN(backoff, left));
        backoff = PDP__MIN(backoff * 2, 0.25);
    }
}

/* Sends out[0..bytes) or, with out NULL, receives into in[0..bytes), all of it by
   deadline: 0, or -1 with why filled. */
PDP__PRIVATE int pdp__store_io(pdp__sock fd, const unsigned char *out, unsigned char *in, size_t bytes,
                               double deadline, char *why, size_t cap)
{
    size_t done = 0;
    while (done < bytes) {
        long r = out ? pdp__sock_send(fd, out + done, bytes - done)
                     : pdp__sock_recv(fd, in + done, bytes - done);
        int e = r < 0 ? pdp__sock_error() : 0;
        if (r > 0) {
            done += (size_t)r;
        } else if (r == 0) {
            snprintf(why, cap, "the server closed the connection");
            return -1;
        } else if (pdp__sock_retry(e)) {
            int ready = pdp__sock_wait(fd, out != NULL, deadline);
            if (ready == 0) {
                snprintf(why, cap, "no answer from the server in time");
                return -1;
            }
            if (ready < 0) {
                pdp__errstr(pdp__sock_error(), why, cap);
                return -1;
            }
        } else {
            pdp__errstr(e, why, cap);
            return -1;
        }
    }
    return 0;
}

PDP__PRIVATE int pdp__store_send_all(pdp__sock fd, const void *buf, size_t bytes, double deadline,
                                     char *why, size_t cap)
{
    return pdp__store_io(fd, (const unsigned char *)buf, NULL, bytes, deadline, why, cap);
}

PDP__PRIVATE int pdp__store_recv_all(pdp__sock fd, void *buf, size_t bytes, double deadline, char *why,
                                     size_t cap)
{
    return pdp__store_io(fd, NULL, (unsigned char *)buf, bytes, deadline, why, cap);
}

/* Reads bytes from the connection into buf[0..cap) and throws away the rest. */
PDP__PRIVATE int pdp__store_recv_into(pdp__sock fd, void *buf, size_t cap, size_t bytes, double deadline,
                                      char *why, size_t why_cap)
{
    unsigned char sink[4096];
    size_t keep = PDP__MIN(cap, bytes);
    if (keep && pdp__store_recv_all(fd, buf, keep, deadline, why, why_cap) != 0) return -1;
    for (bytes -= keep; bytes > 0; bytes -= PDP__MIN(bytes, sizeof sink))
        if (pdp__store_recv_all(fd, sink, PDP__MIN(bytes, sizeof sink), deadline, why,
                                why_cap) != 0)
            return -1;
    return 0;
}

/* One request and its reply (caller holds s->lock). wait_s is the server-side
   wait of GET/WAIT; the client itself gives up PDP__STORE_GRACE_S later. The
   reply's value goes to buf[0..cap) (its full length in *bytes), its arg to
   *arg. PDP_ERR_TIMEOUT without a message when the server reports a timeout (the
   caller words it); PDP_ERR_COMM with one when the connection or the server fails. */
PDP__PRIVATE pdp_status pdp__store_call(pdp_store *s, const char *fn, int op, const char *key,
                                        const void *value, size_t value_bytes, uint64_t arg,
                                        double wait_s, void *buf, size_t cap, size_t *bytes,
                                        uint64_t *reply_arg)
{
    unsigned char head[PDP__STORE_HDR + PDP_STORE_MAX_KEY];
    size_t key_bytes = strlen(key);
    double deadline = pdp__now() + wait_s + PDP__STORE_GRACE_S;
    char why[160];
    pdp__store_hdr h;

    if (s->fd == PDP__SOCK_NONE)
        return pdp__err(PDP_ERR_COMM, "%s: the connection to the store at %s:%d was lost "
                        "by an earlier call", fn, s->host, s->port);
    pdp__store_pack(head, op, (uint32_t)key_bytes, (uint32_t)value_bytes, arg);
    memcpy(head + PDP__STORE_HDR, key, key_bytes);
    if (pdp__store_send_all(s->fd, head, PDP__STORE_HDR + key_bytes, deadline, why,
                            sizeof why) != 0 ||
        (value_bytes &&
         pdp__store_send_all(s->fd, value, value_bytes, deadline, why, sizeof why) != 0) ||
        pdp__store_recv_all(s->fd, head, PDP__STORE_HDR, deadline, why, sizeof why) != 0)
        goto broken;
    h = pdp__store_unpack(head);
    if (h.magic != PDP__STORE_MAGIC || h.version != PDP__STORE_VERSION ||
        h.value_bytes > PDP_STORE_MAX_VALUE) {
        snprintf(why, sizeof why, "malformed reply (not a pdp store?)");
        goto broken;
    }
    if (h.code == PDP__STORE_ERROR) {
        char msg[257];
        if (pdp__store_recv_into(s->fd, msg, sizeof msg - 1, h.value_bytes, deadline, why,
                                 sizeof why) != 0)
            goto broken;
        msg[PDP__MIN(h.value_bytes, sizeof msg - 1)] = '\0';
        return pdp__err(PDP_ERR_COMM, "%s: the store at %s:%d refused key '%.64s': %s", fn,
                        s->host, s->port, key, msg);
    }
    if (pdp__store_recv_into(s->fd, buf, cap, h.value_bytes, deadline, why, sizeof why) != 0)
        goto broken;
    if (bytes) *bytes = h.value_bytes;
    if (reply_arg) *reply_arg = h.arg;
    return h.code == PDP__STORE_TIMEOUT ? PDP_ERR_TIMEOUT : PDP_OK;
broken:
    pdp__sock_close(s->fd);
    s->fd = PDP__SOCK_NONE;
    return pdp__err(PDP_ERR_COMM, "%s: key '%.64s': connection to the store at %s:%d failed: %s",
                    fn, key, s->host, s->port, why);
}

PDP__PRIVATE pdp_status pdp__store_check(const pdp_store *s, const char *fn, const char *key)
{
    size_t n;
    if (!s) return pdp__err(PDP_ERR_INVALID, "%s: store is NULL", fn);
    if (!key) return pdp__err(PDP_ERR_INVALID, "%s: key is NULL", fn);
    n = strlen(key);
    if (n == 0 || n > PDP_STORE_MAX_KEY)
        return pdp__err(PDP_ERR_INVALID, "%s: key '%.64s' is %zu bytes long (1..%d allowed)", fn,
                        key, n, PDP_STORE_MAX_KEY);
    return PDP_OK;
}

/* ---- public API ---- */

PDP_API pdp_status pdp_store_create(pdp_store **out, const pdp_store_desc *desc)
{
    pdp_store_desc d;
    pdp_store *s;
    const char *self;
    pdp_status st;

    if (!out) return pdp__err(PDP_ERR_INVALID, "pdp_store_create: out is NULL");
    *out = NULL;
    memset(&d, 0, sizeof d);
    if (desc) d = *desc;
    d.host = (d.host && d.host[0]) ? d.host : PDP__STORE_DEFAULT_HOST;
    d.timeout_s = PDP__DEF(d.timeout_s, PDP__STORE_DEFAULT_TIMEOUT);
    if (!d.is_server) d.port = PDP__DEF(d.port, PDP__STORE_DEFAULT_PORT);
    if (strlen(d.host) >= sizeof s->host)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_create: host '%.64s...' is longer than %zu "
                        "bytes", d.host, sizeof s->host - 1);
    if (d.port < 0 || d.port > 65535)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_create: port %d is outside 0..65535", d.port);
    if (!(d.timeout_s > 0))
        return pdp__err(PDP_ERR_INVALID, "pdp_store_create: timeout_s = %g must be positive",
                        d.timeout_s);
    if (d.world_size < 0)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_create: world_size = %d is negative",
                        d.world_size);

    s = (pdp_store *)pdp__calloc(sizeof *s);
    if (!s) return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_store_create: out of memory");
    s->fd = PDP__SOCK_NONE;
    strcpy(s->host, d.host);
    s->port = d.port;
    s->world_size = d.world_size;
    s->timeout_s = d.timeout_s;
    if (pdp__mutex_init(&s->lock) != 0) {
        pdp__dealloc(s);
        return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_store_create: cannot create its lock");
    }
    if (pdp__sock_startup() != 0) {
        pdp__mutex_destroy(&s->lock);
        pdp__dealloc(s);
        return pdp__err(PDP_ERR_COMM, "pdp_store_create: WSAStartup failed");
    }
    self = d.host;
    if (d.is_server) {
        st = pdp__store_server_start(&s->server, d.host, &s->port);
        if (st != PDP_OK) {
            pdp_store_free(s);
            return st;
        }
        /* The serving rank is a client too; a wildcard address is reached via loopback. */
        if (strcmp(self, "0.0.0.0") == 0) self = "127.0.0.1";
        else if (strcmp(self, "::") == 0) self = "::1";
    }
    st = pdp__store_connect(s, self);
    if (st != PDP_OK) {
        pdp_store_free(s);
        return st;
    }
    *out = s;
    return PDP_OK;
}

PDP_API void pdp_store_free(pdp_store *s)
{
    int i;
    if (!s) return;
    if (s->fd != PDP__SOCK_NONE) pdp__sock_close(s->fd);
    pdp__store_server_stop(s->server);
    for (i = 0; i < s->n_rounds; i++) pdp__dealloc(s->rounds[i].name);
    pdp__dealloc(s->rounds);
    pdp__mutex_destroy(&s->lock);
    pdp__dealloc(s);
}

PDP_API int pdp_store_port(const pdp_store *s) { return s ? s->port : -1; }

PDP_API pdp_status pdp_store_set(pdp_store *s, const char *key, const void *value, size_t bytes)
{
    pdp_status st = pdp__store_check(s, "pdp_store_set", key);
    if (st != PDP_OK) return st;
    if (bytes > PDP_STORE_MAX_VALUE)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_set: key '%.64s': value of %zu bytes exceeds "
                        "PDP_STORE_MAX_VALUE (%lu)", key, bytes,
                        (unsigned long)PDP_STORE_MAX_VALUE);
    if (bytes && !value)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_set: key '%.64s': value is NULL", key);
    pdp__mutex_lock(&s->lock);
    st = pdp__store_call(s, "pdp_store_set", PDP__STORE_SET, key, value, bytes, 0, s->timeout_s,
                         NULL, 0, NULL, NULL);
    pdp__mutex_unlock(&s->lock);
    return st;
}

PDP_API pdp_status pdp_store_get(pdp_store *s, const char *key, void *buf, size_t cap,
                                 size_t *bytes)
{
    size_t got = 0;
    pdp_status st = pdp__store_check(s, "pdp_store_get", key);
    if (st != PDP_OK) return st;
    if (cap && !buf)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_get: key '%.64s': buf is NULL", key);
    pdp__mutex_lock(&s->lock);
    st = pdp__store_call(s, "pdp_store_get", PDP__STORE_GET, key, NULL, 0,
                         pdp__store_ms(s->timeout_s), s->timeout_s, buf, cap, &got, NULL);
    pdp__mutex_unlock(&s->lock);
    if (bytes) *bytes = got;
    if (st == PDP_ERR_TIMEOUT)
        return pdp__err(st, "pdp_store_get: key '%.64s' was not set within %g s (store %s:%d)", key,
                        s->timeout_s, s->host, s->port);
    if (st == PDP_OK && got > cap)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_get: key '%.64s' holds %zu bytes, the buffer "
                        "only %zu", key, got, cap);
    return st;
}

PDP_API pdp_status pdp_store_wait(pdp_store *s, const char **keys, int n, double timeout_s)
{
    double t, deadline;
    pdp_status st = PDP_OK;
    int i;
    if (!s) return pdp__err(PDP_ERR_INVALID, "pdp_store_wait: store is NULL");
    if (n < 0 || (n > 0 && !keys))
        return pdp__err(PDP_ERR_INVALID, "pdp_store_wait: %d keys at %p", n, (const void *)keys);
    if (!(timeout_s >= 0) || !isfinite(timeout_s)) /* NaN too */
        return pdp__err(PDP_ERR_INVALID, "pdp_store_wait: timeout_s = %g is not a finite "
                        "number >= 0", timeout_s);
    for (i = 0; i < n; i++)
        if ((st = pdp__store_check(s, "pdp_store_wait", keys[i])) != PDP_OK) return st;
    t = PDP__DEF(timeout_s, s->timeout_s);
    deadline = pdp__now() + t;
    pdp__mutex_lock(&s->lock);
    for (i = 0; i < n && st == PDP_OK; i++) {
        double left = PDP__MAX(deadline - pdp__now(), 0.0);
        st = pdp__store_call(s, "pdp_store_wait", PDP__STORE_WAIT, keys[i], NULL, 0,
                             pdp__store_ms(left), left, NULL, 0, NULL, NULL);
    }
    pdp__mutex_unlock(&s->lock);
    if (st == PDP_ERR_TIMEOUT)
        return pdp__err(st, "pdp_store_wait: key '%.64s' (%d of %d) was not set within %g s "
                        "(store %s:%d)", keys[i - 1], i, n, t, s->host, s->port);
    return st;
}

PDP_API pdp_status pdp_store_add(pdp_store *s, const char *key, int64_t delta, int64_t *result)
{
    uint64_t r = 0;
    pdp_status st = pdp__store_check(s, "pdp_store_add", key);
    if (st != PDP_OK) return st;
    pdp__mutex_lock(&s->lock);
    st = pdp__store_call(s, "pdp_store_add", PDP__STORE_ADD, key, NULL, 0, (uint64_t)delta,
                         s->timeout_s, NULL, 0, NULL, &r);
    pdp__mutex_unlock(&s->lock);
    if (st == PDP_OK && result) *result = (int64_t)r;
    return st;
}

/* The round this handle's call of barrier name joins: its k-th call joins round k,
   whatever became of the earlier ones (a round that timed out keeps this rank's arrival,
   so a retry must not count in it again). */
PDP__PRIVATE pdp_status pdp__store_next_round(pdp_store *s, const char *name, int64_t *round)
{
    int i;
    pdp__mutex_lock(&s->lock);
    for (i = 0; i < s->n_rounds && strcmp(s->rounds[i].name, name); i++) {}
    if (i == s->n_rounds) { /* the name's first call on this handle */
        pdp__store_round *g = (pdp__store_round *)pdp__store_grow(
            s->rounds, &s->cap_rounds, s->n_rounds + 1, sizeof *s->rounds);
        char *copy = (char *)pdp__alloc(strlen(name) + 1);
        if (g) s->rounds = g;
        if (!g || !copy) {
            pdp__dealloc(copy);
            pdp__mutex_unlock(&s->lock);
            return pdp__err(PDP_ERR_OUT_OF_MEMORY, "pdp_store_barrier: '%s': no memory", name);
        }
        memcpy(copy, name, strlen(name) + 1);
        s->rounds[i].name = copy;
        s->rounds[i].calls = 0;
        s->n_rounds++;
    }
    *round = s->rounds[i].calls++;
    pdp__mutex_unlock(&s->lock);
    return PDP_OK;
}

PDP_API pdp_status pdp_store_barrier(pdp_store *s, const char *name, int world_size,
                                     double timeout_s)
{
    char counter[PDP_STORE_MAX_KEY + 1], done[PDP_STORE_MAX_KEY + 1];
    const char *keys[1];
    int64_t arrived = 0, gen = 0, now_in = 0;
    int world;
    pdp_status st;

    if (!s) return pdp__err(PDP_ERR_INVALID, "pdp_store_barrier: store is NULL");
    if (!name) return pdp__err(PDP_ERR_INVALID, "pdp_store_barrier: name is NULL");
    world = world_size > 0 ? world_size : s->world_size;
    if (world <= 0)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_barrier: '%s': world_size = %d and the store "
                        "was created without one", name, world_size);
    if (strlen(name) + 40 > PDP_STORE_MAX_KEY)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_barrier: name '%.64s...' is too long", name);
    timeout_s = PDP__DEF(timeout_s, s->timeout_s);
    if ((st = pdp__store_next_round(s, name, &gen)) != PDP_OK) return st;
    snprintf(counter, sizeof counter, "pdp/barrier/%s/%lld/n", name, (long long)gen);
    if ((st = pdp_store_add(s, counter, 1, &arrived)) != PDP_OK)
        return pdp__err_wrap(st, "pdp_store_barrier: '%s'", name);
    if (arrived > world)
        return pdp__err(PDP_ERR_INVALID, "pdp_store_barrier: '%s' (round %lld): %lld ranks "
                        "arrived, more than world_size %d (two ranks with one rank id, or world "
                        "sizes that differ)", name, (long long)gen, (long long)arrived, world);
    snprintf(done, sizeof done, "pdp/barrier/%s/%lld", name, (long long)gen);
    if (arrived == world && (st = pdp_store_set(s, done, "", 0)) != PDP_OK)
        return pdp__err_wrap(st, "pdp_store_barrier: '%s'", name);
    keys[0] = done;
    st = pdp_store_wait(s, keys, 1, timeout_s);
    if (st == PDP_ERR_TIMEOUT) {
        pdp_store_add(s, counter, 0, &now_in); /* best effort, for the message */
        return pdp__err(st, "pdp_store_barrier: '%s' (round %lld): %lld of %d ranks arrived "
                        "within %g s (store %s:%d)", name, (long long)gen,
                        (long long)now_in, world, timeout_s, s->host, s->port);
    }
    if (st != PDP_OK) return pdp__err_wrap(st, "pdp_store_barrier: '%s'", name);
    return PDP_OK;
}
