/* test_store.c - rendezvous from the environment and the TCP key-value store.
 *
 * Environment parsing against hand-set variables (torchrun's, OpenMPI's, bad ones
 * with their messages); the store with a server and client threads in one process
 * (set/get/add, a get that blocks until another thread sets, barriers that really
 * hold ranks back); several processes on loopback (ranks 1..3, this binary started again
 * by tests/child_process.h, against rank 0);
 * timeouts that end in time and name the key or host:port; a foreign peer sending
 * garbage; freeing a server while clients are still connected. Only 127.0.0.1 is
 * used, and only ephemeral ports. The raw sockets of the foreign peer go through
 * platform.h's helpers, so the test runs on Winsock too (make cross-test, under Wine).
 *
 *     make build/test_store && ./build/test_store
 */
#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "child_process.h"
#include <pthread.h>
#ifdef PDP__POSIX
#  include <poll.h>
#  include <arpa/inet.h>
#  include <netinet/in.h>
#  include <sys/socket.h>
#endif

#ifdef _WIN32 /* the environment tests' setenv and unsetenv */
static int setenv(const char *name, const char *value, int overwrite)
{
    (void)overwrite;
    return _putenv_s(name, value);
}
static int unsetenv(const char *name) { return _putenv_s(name, ""); }
#endif

static const char *status_name(int s) { return pdp_status_name((pdp_status)s); }

#define ASSERT_OK(call) ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, (call), status_name)
#define ASSERT_HAS(haystack, needle)                                                         \
    ASSERTm(pdp_last_error(), strstr((haystack), (needle)) != NULL)

/* ---- helpers ---- */

static pdp_store *start_server(int world, double timeout_s)
{
    pdp_store_desc d;
    pdp_store *s = NULL;
    memset(&d, 0, sizeof d);
    d.is_server = true;
    d.port = 0;
    d.world_size = world;
    d.timeout_s = timeout_s;
    if (pdp_store_create(&s, &d) != PDP_OK) return NULL;
    return s;
}

static pdp_status connect_client(pdp_store **out, int port, int world, double timeout_s)
{
    pdp_store_desc d;
    memset(&d, 0, sizeof d);
    d.host = "127.0.0.1";
    d.port = port;
    d.world_size = world;
    d.timeout_s = timeout_s;
    return pdp_store_create(out, &d);
}

/* A loopback port nobody listens on right now: bind port 0, read it, close. */
static int free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int port;
    pdp__sock fd;
    pdp__sock_startup();
    fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd == PDP__SOCK_NONE || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0)
        port = -1;
    else
        port = ntohs(a.sin_port);
    if (fd != PDP__SOCK_NONE) pdp__sock_close(fd);
    return port;
}

/* A raw TCP connection to 127.0.0.1:port (a foreign peer), blocking. */
static pdp__sock raw_connect(int port)
{
    struct sockaddr_in a;
    pdp__sock fd;
    pdp__sock_startup();
    fd = socket(AF_INET, SOCK_STREAM, 0);
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd != PDP__SOCK_NONE && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        pdp__sock_close(fd);
        fd = PDP__SOCK_NONE;
    }
    return fd;
}

/* send all of buf: true when it went */
static bool raw_send(pdp__sock fd, const void *buf, size_t bytes)
{
    return pdp__sock_send(fd, buf, bytes) == (long)bytes;
}

/* Reads until EOF or timeout_s: bytes read (>= 0) on EOF, -1 on timeout or error. */
static long read_until_eof(pdp__sock fd, unsigned char *buf, size_t cap, double timeout_s)
{
    double deadline = pdp__now() + timeout_s;
    size_t got = 0;
    for (;;) {
        unsigned char sink[256];
        long r;
        double left = deadline - pdp__now();
        if (left <= 0) return -1;
        if (pdp__sock_wait(fd, false, deadline) <= 0) continue;
        r = pdp__sock_recv(fd, got < cap ? buf + got : sink, got < cap ? cap - got : sizeof sink);
        if (r == 0) return (long)got;
        if (r < 0) return pdp__sock_error() == ECONNRESET ? (long)got : -1;
        if (got < cap) got += (size_t)r;
    }
}

static const char *const env_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE"};

static void env_clear(void)
{
    size_t i;
    for (i = 0; i < sizeof env_vars / sizeof env_vars[0]; i++) unsetenv(env_vars[i]);
}

/* ---- environment ---- */

TEST store_env_defaults(void)
{
    pdp_env_info e;
    env_clear();
    memset(&e, 0x5a, sizeof e);
    ASSERT_OK(pdp_env_read(&e));
    ASSERT_EQ(0, e.rank);
    ASSERT_EQ(1, e.world_size);
    ASSERT_EQ(0, e.local_rank);
    ASSERT_EQ(1, e.local_world_size);
    ASSERT_STR_EQ("127.0.0.1", e.master_addr);
    ASSERT_EQ(29500, e.master_port);
    ASSERT_FALSE(e.from_env);
    PASS();
}

TEST store_env_torchrun(void)
{
    pdp_env_info e;
    env_clear();
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("MASTER_ADDR", "node-a.cluster", 1);
    setenv("MASTER_PORT", "12345", 1);
    /* OpenMPI's variables are ignored when torchrun's are there. */
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    ASSERT_OK(pdp_env_read(&e));
    ASSERT_EQ(5, e.rank);
    ASSERT_EQ(8, e.world_size);
    ASSERT_EQ(1, e.local_rank);
    ASSERT_EQ(4, e.local_world_size);
    ASSERT_STR_EQ("node-a.cluster", e.master_addr);
    ASSERT_EQ(12345, e.master_port);
    ASSERT(e.from_env);

    /* Without LOCAL_*: one node, local rank = rank; LOCAL_WORLD_SIZE alone lays
       ranks out node by node. */
    env_clear();
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "4", 1);
    ASSERT_OK(pdp_env_read(&e));
    ASSERT_EQ(3, e.local_rank);
    ASSERT_EQ(4, e.local_world_size);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    ASSERT_OK(pdp_env_read(&e));
    ASSERT_EQ(1, e.local_rank);
    ASSERT_EQ(2, e.local_world_size);

    /* An empty variable counts as unset. */
    env_clear();
    setenv("RANK", "", 1);
    setenv("MASTER_PORT", "", 1);
    ASSERT_OK(pdp_env_read(&e));
    ASSERT_FALSE(e.from_env);
    ASSERT_EQ(29500, e.master_port);
    env_clear();
    PASS();
}

TEST store_env_openmpi(void)
{
    pdp_env_info e;
    env_clear();
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1", 1);
    setenv("MASTER_PORT", "4000", 1);
    ASSERT_OK(pdp_env_read(&e));
    ASSERT_EQ(2, e.rank);
    ASSERT_EQ(3, e.world_size);
    ASSERT_EQ(0, e.local_rank);
    ASSERT_EQ(1, e.local_world_size);
    ASSERT_STR_EQ("127.0.0.1", e.master_addr);
    ASSERT_EQ(4000, e.master_port);
    ASSERT(e.from_env);
    env_clear();
    PASS();
}

TEST store_env_bad_values(void)
{
    static const struct {
        const char *vars[3][2]; /* up to three NAME=VALUE pairs */
        const char *message;    /* must appear in pdp_last_error() */
    } cases[] = {
        {{{"RANK", "4"}, {"WORLD_SIZE", "4"}}, "RANK=4 is outside 0..3"},
        {{{"RANK", "-1"}, {"WORLD_SIZE", "4"}}, "RANK=-1"},
        {{{"RANK", "abc"}, {"WORLD_SIZE", "4"}}, "RANK='abc' is not an integer"},
        {{{"RANK", "1"}, {"WORLD_SIZE", "2x"}}, "WORLD_SIZE='2x'"},
        {{{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0"},
        {{{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not"},
        {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}}, "LOCAL_RANK=2"},
        {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}}, "LOCAL_WORLD_SIZE=3"},
        {{{"MASTER_PORT", "70000"}}, "MASTER_PORT=70000 is outside 1..65535"},
        {{{"MASTER_PORT", "http"}}, "MASTER_PORT='http'"},
        {{{"MASTER_PORT", "0"}}, "MASTER_PORT=0"},
        {{{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
         "OMPI_COMM_WORLD_RANK=5"},
        {{{"OMPI_COMM_WORLD_SIZE", "2"}}, "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK"},
    };
    size_t i, j;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pdp_env_info e;
        pdp_status st;
        env_clear();
        for (j = 0; j < 3 && cases[i].vars[j][0]; j++)
            setenv(cases[i].vars[j][0], cases[i].vars[j][1], 1);
        st = pdp_env_read(&e);
        ASSERT_ENUM_EQm(cases[i].message, PDP_ERR_INVALID, st, status_name);
        ASSERT_HAS(pdp_last_error(), "pdp_env_read: ");
        ASSERT_HAS(pdp_last_error(), cases[i].message);
        ASSERT_EQ(0, e.rank); /* the defaults, not half-read values */
        ASSERT_EQ(1, e.world_size);
    }
    env_clear();
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_env_read(NULL), status_name);
    PASS();
}

/* ---- one process: set, get, add ---- */

TEST store_set_get_add(void)
{
    static unsigned char big[PDP_STORE_MAX_VALUE], back[PDP_STORE_MAX_VALUE];
    pdp_store *s = start_server(1, 5.0), *c = NULL;
    char buf[64];
    size_t n = 0, i;
    int64_t r = 0;
    ASSERTm(pdp_last_error(), s != NULL);
    ASSERT(pdp_store_port(s) > 0);
    ASSERT_OK(connect_client(&c, pdp_store_port(s), 1, 5.0));

    ASSERT_OK(pdp_store_set(s, "alpha", "one", 3));
    ASSERT_OK(pdp_store_get(c, "alpha", buf, sizeof buf, &n));
    ASSERT_EQ(3, n);
    ASSERT_MEM_EQ("one", buf, 3);
    ASSERT_OK(pdp_store_set(c, "alpha", "replaced\0x", 10)); /* binary, with a NUL */
    ASSERT_OK(pdp_store_get(s, "alpha", buf, sizeof buf, &n));
    ASSERT_EQ(10, n);
    ASSERT_MEM_EQ("replaced\0x", buf, 10);
    ASSERT_OK(pdp_store_set(c, "empty", NULL, 0));
    n = 99;
    ASSERT_OK(pdp_store_get(s, "empty", NULL, 0, &n));
    ASSERT_EQ(0, n);

    /* The largest value goes through whole; a short buffer says how long it is. */
    for (i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 2654435761u >> 13);
    ASSERT_OK(pdp_store_set(c, "big", big, sizeof big));
    ASSERT_OK(pdp_store_get(s, "big", back, sizeof back, &n));
    ASSERT_EQ(sizeof big, n);
    ASSERT_MEM_EQ(big, back, sizeof big);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_get(s, "big", buf, sizeof buf, &n), status_name);
    ASSERT_EQ(sizeof big, n);
    ASSERT_HAS(pdp_last_error(), "'big' holds 1048576 bytes");
    ASSERT_OK(pdp_store_get(s, "alpha", buf, sizeof buf, &n)); /* the stream is still in step */
    ASSERT_EQ(10, n);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_set(c, "big", big, sizeof big + 1), status_name);
    ASSERT_HAS(pdp_last_error(), "PDP_STORE_MAX_VALUE");

    /* Counters: a missing key is 0; the text is readable with get. */
    ASSERT_OK(pdp_store_add(c, "count", 5, &r));
    ASSERT_EQ(5, r);
    ASSERT_OK(pdp_store_add(s, "count", -7, &r));
    ASSERT_EQ(-2, r);
    ASSERT_OK(pdp_store_add(c, "count", 0, &r));
    ASSERT_EQ(-2, r);
    ASSERT_OK(pdp_store_get(c, "count", buf, sizeof buf - 1, &n));
    buf[n] = '\0';
    ASSERT_STR_EQ("-2", buf);
    ASSERT_ENUM_EQ(PDP_ERR_COMM, pdp_store_add(c, "alpha", 1, &r), status_name);
    ASSERT_HAS(pdp_last_error(), "not a counter");
    ASSERT_OK(pdp_store_add(c, "count", INT64_MAX, &r)); /* -2 + max: fine */
    ASSERT_ENUM_EQ(PDP_ERR_COMM, pdp_store_add(c, "count", 3, &r), status_name);
    ASSERT_HAS(pdp_last_error(), "overflow");
    ASSERT_OK(pdp_store_add(c, "count", 1, &r)); /* the connection survived the refusals */

    /* Arguments are checked before anything is sent. */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_set(c, "", "x", 1), status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_set(c, NULL, "x", 1), status_name);
    memset(buf, 'k', sizeof buf);
    {
        static char longkey[PDP_STORE_MAX_KEY + 2];
        memset(longkey, 'k', PDP_STORE_MAX_KEY + 1);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_get(c, longkey, buf, 1, &n), status_name);
        ASSERT_HAS(pdp_last_error(), "1025 bytes long");
        longkey[PDP_STORE_MAX_KEY] = '\0'; /* exactly the maximum is fine */
        ASSERT_OK(pdp_store_set(c, longkey, "v", 1));
        ASSERT_OK(pdp_store_get(s, longkey, buf, 1, &n));
    }
    pdp_store_free(c);
    pdp_store_free(s);
    pdp_store_free(NULL);
    PASS();
}

TEST store_create_invalid(void)
{
    pdp_store *s = (pdp_store *)&s;
    pdp_store_desc d;
    memset(&d, 0, sizeof d);
    d.port = 70000;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_create(&s, &d), status_name);
    ASSERT(s == NULL);
    ASSERT_HAS(pdp_last_error(), "port 70000");
    d.port = 1234;
    d.timeout_s = -1;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_create(&s, &d), status_name);
    ASSERT_HAS(pdp_last_error(), "timeout_s");
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_create(NULL, &d), status_name);
    /* A port that is taken cannot be served twice. */
    {
        pdp_store *a = start_server(1, 2.0);
        ASSERTm(pdp_last_error(), a != NULL);
        memset(&d, 0, sizeof d);
        d.is_server = true;
        d.port = pdp_store_port(a);
        ASSERT_ENUM_EQ(PDP_ERR_COMM, pdp_store_create(&s, &d), status_name);
        ASSERT(s == NULL);
        ASSERT_HAS(pdp_last_error(), "cannot listen on 127.0.0.1:");
        pdp_store_free(a);
    }
    PASS();
}

/* ---- one process: threads as ranks ---- */

typedef struct getter {
    int port;
    const char *key;
    char value[32];
    size_t bytes;
    pdp_status status;
    double waited_s;
} getter;

static void *getter_main(void *arg)
{
    getter *g = (getter *)arg;
    pdp_store *c = NULL;
    double t0;
    g->status = connect_client(&c, g->port, 2, 5.0);
    if (g->status != PDP_OK) return NULL;
    t0 = pdp__now();
    g->status = pdp_store_get(c, g->key, g->value, sizeof g->value, &g->bytes);
    g->waited_s = pdp__now() - t0;
    pdp_store_free(c);
    return NULL;
}

TEST store_get_blocks_until_set(void)
{
    pdp_store *s = start_server(2, 5.0);
    getter g[2];
    pthread_t th[2];
    int i;
    ASSERTm(pdp_last_error(), s != NULL);
    memset(g, 0, sizeof g);
    for (i = 0; i < 2; i++) {
        g[i].port = pdp_store_port(s);
        g[i].key = "late";
        ASSERT_EQ(0, pthread_create(&th[i], NULL, getter_main, &g[i]));
    }
    pdp__sleep_s(0.15);
    ASSERT_OK(pdp_store_set(s, "late", "here", 4));
    for (i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, g[i].status, status_name);
        ASSERT_EQ(4, g[i].bytes);
        ASSERT_MEM_EQ("here", g[i].value, 4);
        ASSERT(g[i].waited_s > 0.05); /* it really waited for the set */
    }
    pdp_store_free(s);
    PASS();
}

#define RANKS 4
#define ROUNDS 5

typedef struct rank_arg {
    int port, rank;
    int failures;
    char error[256];
} rank_arg;

/* Each round: add 1 to "arrivals", barrier, then the counter must already hold
   every rank's add of this round (a barrier that let a rank through early fails). */
static void *rank_main(void *arg)
{
    rank_arg *a = (rank_arg *)arg;
    pdp_store *c = NULL;
    char key[32], want[32], got[32];
    int round, r;
    size_t n;
    int64_t count;
    if (connect_client(&c, a->port, RANKS, 5.0) != PDP_OK) goto fail;
    snprintf(key, sizeof key, "rank%d", a->rank);
    snprintf(want, sizeof want, "hello from %d", a->rank);
    if (pdp_store_set(c, key, want, strlen(want)) != PDP_OK) goto fail;
    for (round = 0; round < ROUNDS; round++) {
        if (pdp_store_add(c, "arrivals", 1, NULL) != PDP_OK) goto fail;
        if (pdp_store_barrier(c, "step", 0, 5.0) != PDP_OK) goto fail;
        if (pdp_store_add(c, "arrivals", 0, &count) != PDP_OK) goto fail;
        if (count < (int64_t)(round + 1) * RANKS) {
            snprintf(a->error, sizeof a->error, "rank %d round %d: %lld arrivals after barrier",
                     a->rank, round, (long long)count);
            a->failures++;
        }
        if (pdp_store_barrier(c, "step", 0, 5.0) != PDP_OK) goto fail; /* nobody runs ahead */
    }
    for (r = 0; r < RANKS; r++) {
        snprintf(key, sizeof key, "rank%d", r);
        snprintf(want, sizeof want, "hello from %d", r);
        if (pdp_store_get(c, key, got, sizeof got, &n) != PDP_OK) goto fail;
        if (n != strlen(want) || memcmp(got, want, n) != 0) a->failures++;
    }
    pdp_store_free(c);
    return NULL;
fail:
    snprintf(a->error, sizeof a->error, "%.255s", pdp_last_error());
    a->failures++;
    pdp_store_free(c);
    return NULL;
}

TEST store_threads_barrier(void)
{
    pdp_store *s = start_server(RANKS, 5.0);
    rank_arg a[RANKS];
    pthread_t th[RANKS];
    int i;
    ASSERTm(pdp_last_error(), s != NULL);
    memset(a, 0, sizeof a);
    for (i = 0; i < RANKS; i++) {
        a[i].port = pdp_store_port(s);
        a[i].rank = i;
        ASSERT_EQ(0, pthread_create(&th[i], NULL, rank_main, &a[i]));
    }
    for (i = 0; i < RANKS; i++) pthread_join(th[i], NULL);
    for (i = 0; i < RANKS; i++) ASSERT_EQm(a[i].error, 0, a[i].failures);
    pdp_store_free(s);
    PASS();
}

/* ---- several processes on loopback ---- */

/* Child: behave as rank `rank` against the server at port. The exit status says which
   step failed (0 = all good). */
static int child_rank(int rank, int port, int world)
{
    pdp_store *c = NULL;
    char key[32], want[64], got[64];
    int r;
    size_t n;
    int64_t total = 0;
    if (port <= 0) return 10;
    if (connect_client(&c, port, world, 5.0) != PDP_OK) return 11;
    snprintf(key, sizeof key, "rank%d", rank);
    snprintf(want, sizeof want, "pid %ld says %d", pdp__pid(), rank * rank);
    if (pdp_store_set(c, key, want, strlen(want)) != PDP_OK) return 12;
    for (r = 0; r < world; r++) {
        snprintf(key, sizeof key, "rank%d", r);
        if (pdp_store_get(c, key, got, sizeof got - 1, &n) != PDP_OK) return 13;
        got[n] = '\0';
        if (!strstr(got, "says") || atoi(strstr(got, "says") + 5) != r * r) return 14;
    }
    if (pdp_store_add(c, "sum", rank, NULL) != PDP_OK) return 15;
    if (pdp_store_barrier(c, "done", 0, 5.0) != PDP_OK) return 16;
    if (pdp_store_add(c, "sum", 0, &total) != PDP_OK) return 17;
    if (total != (int64_t)world * (world - 1) / 2) return 18; /* 0 + 1 + 2 + 3 */
    pdp_store_free(c);
    return 0;
}

TEST store_processes_loopback(void)
{
    enum { WORLD = 4 };
    child kids[WORLD];
    int i, code, started = 0;
    pdp_store *s;
    char key[32], got[64], rank[16], port[16], world[16];
    size_t n;
    double deadline;

    /* The children are this binary again (child_process.h), told the ephemeral port. */
    s = start_server(WORLD, 5.0);
    ASSERTm(pdp_last_error(), s != NULL);
    snprintf(port, sizeof port, "%d", pdp_store_port(s));
    snprintf(world, sizeof world, "%d", (int)WORLD);
    for (i = 1; i < WORLD; i++) {
        char *argv[] = {"test_store", "rank", rank, port, world, NULL};
        snprintf(rank, sizeof rank, "%d", i);
        if (child_spawn(&kids[i], argv) != 0) break;
        started = i;
    }
    if (started != WORLD - 1) {
        for (i = 1; i <= started; i++) child_kill(&kids[i]);
        pdp_store_free(s);
        FAILm("cannot start a child rank");
    }
    ASSERT_OK(pdp_store_set(s, "rank0", "pid 0 says 0", 12));
    for (i = 1; i < WORLD; i++) {
        snprintf(key, sizeof key, "rank%d", i);
        ASSERT_OK(pdp_store_get(s, key, got, sizeof got - 1, &n));
        got[n] = '\0';
        ASSERT_EQ(i * i, atoi(strstr(got, "says") + 5));
    }
    ASSERT_OK(pdp_store_barrier(s, "done", 0, 5.0));

    deadline = pdp__now() + 8.0;
    for (i = 1; i < WORLD; i++) {
        if (!child_wait_until(&kids[i], deadline - pdp__now(), &code)) {
            int k;
            for (k = i; k < WORLD; k++) child_kill(&kids[k]);
            FAILm("a child rank hung");
        }
        ASSERT_EQm("child rank failed (exit status = failing step; -1: killed)", 0, code);
    }
    pdp_store_free(s);
    PASS();
}

/* ---- timeouts ---- */

TEST store_get_timeout(void)
{
    pdp_store *s = start_server(1, 0.3);
    const char *keys[2] = {"present", "absent"};
    double t0, dt;
    char buf[8];
    size_t n;
    ASSERTm(pdp_last_error(), s != NULL);
    t0 = pdp__now();
    ASSERT_ENUM_EQ(PDP_ERR_TIMEOUT, pdp_store_get(s, "nobody-sets-this", buf, sizeof buf, &n),
                   status_name);
    dt = pdp__now() - t0;
    ASSERT_HAS(pdp_last_error(), "pdp_store_get: key 'nobody-sets-this'");
    ASSERT_HAS(pdp_last_error(), "0.3 s");
    ASSERT(dt >= 0.28 && dt < 0.8);

    /* wait: the timeout covers all keys and names the missing one. */
    ASSERT_OK(pdp_store_set(s, "present", "", 0));
    ASSERT_OK(pdp_store_wait(s, keys, 1, 0.2));
    t0 = pdp__now();
    ASSERT_ENUM_EQ(PDP_ERR_TIMEOUT, pdp_store_wait(s, keys, 2, 0.2), status_name);
    dt = pdp__now() - t0;
    ASSERT_HAS(pdp_last_error(), "key 'absent' (2 of 2)");
    ASSERT(dt >= 0.18 && dt < 0.7);

    /* A barrier nobody else joins names how many arrived; the store still works. */
    t0 = pdp__now();
    ASSERT_ENUM_EQ(PDP_ERR_TIMEOUT, pdp_store_barrier(s, "lonely", 3, 0.2), status_name);
    dt = pdp__now() - t0;
    ASSERT_HAS(pdp_last_error(), "'lonely'");
    ASSERT_HAS(pdp_last_error(), "1 of 3 ranks");
    ASSERT(dt >= 0.18 && dt < 0.7);
    /* a retry is this rank's next round, not a second arrival in the one that timed out
       (which would let it through alone at 2 of 2) */
    ASSERT_ENUM_EQ(PDP_ERR_TIMEOUT, pdp_store_barrier(s, "pair", 2, 0.1), status_name);
    ASSERT_ENUM_EQ(PDP_ERR_TIMEOUT, pdp_store_barrier(s, "pair", 2, 0.1), status_name);
    ASSERT_HAS(pdp_last_error(), "'pair' (round 1): 1 of 2 ranks");
    { /* two handles that both think they are the one rank of a world of 1 */
        pdp_store *c = NULL;
        ASSERT_OK(connect_client(&c, pdp_store_port(s), 0, 1.0));
        ASSERT_OK(pdp_store_barrier(s, "twice", 1, 0.2));
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_barrier(c, "twice", 1, 0.2), status_name);
        ASSERT_HAS(pdp_last_error(), "2 ranks arrived, more than world_size 1");
        pdp_store_free(c);
    }
    ASSERT_OK(pdp_store_barrier(s, "alone", 0, 0.2)); /* world 1 from the desc */
    {
        pdp_store *c = NULL; /* no world_size in the desc, none in the call */
        ASSERT_OK(connect_client(&c, pdp_store_port(s), 0, 1.0));
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_store_barrier(c, "x", 0, 0.2), status_name);
        ASSERT_HAS(pdp_last_error(), "created without one");
        ASSERT_OK(pdp_store_get(c, "present", buf, sizeof buf, &n));
        pdp_store_free(c);
    }
    pdp_store_free(s);
    PASS();
}

TEST store_connect_timeout(void)
{
    pdp_store *c = (pdp_store *)&c;
    char where[64];
    double t0, dt;
    int port = free_port();
    ASSERT(port > 0);
    t0 = pdp__now();
    ASSERT_ENUM_EQ(PDP_ERR_TIMEOUT, connect_client(&c, port, 2, 0.3), status_name);
    dt = pdp__now() - t0;
    ASSERT(c == NULL);
    snprintf(where, sizeof where, "127.0.0.1:%d", port);
    ASSERT_HAS(pdp_last_error(), "pdp_store_create: no store server at ");
    ASSERT_HAS(pdp_last_error(), where);
#ifndef _WIN32 /* Winsock's words differ */
    /* loopback refuses at once: the reason is the refusal, not the attempt the deadline cut */
    ASSERT_HAS(pdp_last_error(), "(last error: Connection refused)");
#endif
    ASSERT(dt >= 0.28 && dt < 0.8);
    PASS();
}

typedef struct late_client {
    int port;
    pdp_status status;
    char value[8];
} late_client;

static void *late_client_main(void *arg)
{
    late_client *l = (late_client *)arg;
    pdp_store *c = NULL;
    size_t n;
    l->status = connect_client(&c, l->port, 2, 5.0);
    if (l->status == PDP_OK) l->status = pdp_store_get(c, "ready", l->value, sizeof l->value, &n);
    pdp_store_free(c);
    return NULL;
}

TEST store_client_before_server(void)
{
    late_client l;
    pthread_t th;
    pdp_store_desc d;
    pdp_store *s = NULL;
    memset(&l, 0, sizeof l);
    l.port = free_port();
    ASSERT(l.port > 0);
    ASSERT_EQ(0, pthread_create(&th, NULL, late_client_main, &l));
    pdp__sleep_s(0.2); /* the client is retrying by now */
    memset(&d, 0, sizeof d);
    d.is_server = true;
    d.port = l.port;
    d.timeout_s = 5.0;
    ASSERT_OK(pdp_store_create(&s, &d));
    ASSERT_EQ(l.port, pdp_store_port(s));
    ASSERT_OK(pdp_store_set(s, "ready", "yes", 4));
    pthread_join(th, NULL);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, l.status, status_name);
    ASSERT_STR_EQ("yes", l.value);
    pdp_store_free(s);
    PASS();
}

/* ---- hostile peers and shutdown ---- */

TEST store_garbage_peer(void)
{
    pdp_store *s = start_server(1, 2.0), *c = NULL;
    unsigned char hdr[24], reply[512];
    char buf[16];
    size_t n;
    long got;
    pdp__sock fd;
    int port;
    ASSERTm(pdp_last_error(), s != NULL);
    port = pdp_store_port(s);

    /* Not our protocol at all: hung up on without a reply. */
    fd = raw_connect(port);
    ASSERT(fd != PDP__SOCK_NONE);
    ASSERT(raw_send(fd, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27));
    ASSERT_EQ(0, read_until_eof(fd, reply, sizeof reply, 2.0));
    pdp__sock_close(fd);

    /* Our magic with absurd lengths: an ERROR reply, then the hang-up; nothing is
       allocated for the 4 GiB key or value. */
    pdp__store_pack(hdr, PDP__STORE_SET, 0xffffffffu, 5, 0);
    fd = raw_connect(port);
    ASSERT(fd != PDP__SOCK_NONE);
    ASSERT(raw_send(fd, hdr, sizeof hdr));
    got = read_until_eof(fd, reply, sizeof reply, 2.0);
    pdp__sock_close(fd);
    ASSERT(got > 24);
    ASSERT_EQ(PDP__STORE_ERROR, reply[4]);
    reply[got < (long)sizeof reply ? got : (long)sizeof reply - 1] = '\0';
    ASSERT(strstr((char *)reply + 24, "key of 4294967295 bytes") != NULL);

    pdp__store_pack(hdr, PDP__STORE_SET, 3, 0x7fffffffu, 0);
    fd = raw_connect(port);
    ASSERT(fd != PDP__SOCK_NONE);
    ASSERT(raw_send(fd, hdr, sizeof hdr));
    got = read_until_eof(fd, reply, sizeof reply, 2.0);
    pdp__sock_close(fd);
    ASSERT(got > 24);
    ASSERT_EQ(PDP__STORE_ERROR, reply[4]);

    /* Unknown op; half a header then silence; a parked GET whose peer vanishes. */
    pdp__store_pack(hdr, 99, 1, 0, 0);
    fd = raw_connect(port);
    ASSERT(raw_send(fd, hdr, sizeof hdr));
    ASSERT(read_until_eof(fd, reply, sizeof reply, 2.0) > 24);
    pdp__sock_close(fd);
    fd = raw_connect(port);
    ASSERT(raw_send(fd, hdr, 10));
    pdp__sock_close(fd);
    pdp__store_pack(hdr, PDP__STORE_GET, 4, 0, 60000);
    memcpy(reply, hdr, 24);
    memcpy(reply + 24, "void", 4);
    fd = raw_connect(port);
    ASSERT(raw_send(fd, reply, 28));
    pdp__sock_close(fd);
    /* Random bytes, many of them. */
    {
        pdp_rng rng;
        int k;
        pdp_rng_seed(&rng, 7, 1);
        for (k = 0; k < 20; k++) {
            unsigned char junk[300];
            size_t j;
            for (j = 0; j < sizeof junk; j++) junk[j] = (unsigned char)pdp_rng_u32(&rng);
            if (k % 2) pdp__store_pack(junk, 1 + k % 4, pdp_rng_u32(&rng), pdp_rng_u32(&rng),
                                       pdp_rng_u32(&rng));
            fd = raw_connect(port);
            ASSERT(fd != PDP__SOCK_NONE);
            if (!raw_send(fd, junk, sizeof junk)) {
                /* the server may already have hung up: fine */
            }
            pdp__sock_close(fd);
        }
    }

    /* The server is still serving, and the parked GET left no trace. */
    ASSERT_OK(connect_client(&c, port, 1, 2.0));
    ASSERT_OK(pdp_store_set(c, "void", "ok", 2));
    ASSERT_OK(pdp_store_get(s, "void", buf, sizeof buf, &n));
    ASSERT_EQ(2, n);
    ASSERT_MEM_EQ("ok", buf, 2);
    pdp_store_free(c);
    pdp_store_free(s);
    PASS();
}

TEST store_free_with_clients_connected(void)
{
    pdp_store *s = start_server(3, 30.0), *c[12]; /* more than the server's first table */
    getter g;
    pthread_t th;
    double t0;
    int i;
    ASSERTm(pdp_last_error(), s != NULL);
    for (i = 0; i < 12; i++) ASSERT_OK(connect_client(&c[i], pdp_store_port(s), 3, 30.0));
    for (i = 0; i < 12; i++) ASSERT_OK(pdp_store_add(c[i], "connected", 1, NULL));
    memset(&g, 0, sizeof g);
    g.port = pdp_store_port(s);
    g.key = "never";
    ASSERT_EQ(0, pthread_create(&th, NULL, getter_main, &g));
    pdp__sleep_s(0.1); /* the getter is parked on the server with a 30 s timeout */
    t0 = pdp__now();
    pdp_store_free(s);
    pthread_join(th, NULL);
    ASSERT(pdp__now() - t0 < 2.0);
    ASSERT_ENUM_EQ(PDP_ERR_COMM, g.status, status_name); /* told, not left hanging */
    /* The others learn it on their next call, then fail fast with the same code. */
    ASSERT_ENUM_EQ(PDP_ERR_COMM, pdp_store_set(c[0], "k", "v", 1), status_name);
    ASSERT_HAS(pdp_last_error(), "connection to the store at 127.0.0.1:");
    ASSERT_ENUM_EQ(PDP_ERR_COMM, pdp_store_set(c[0], "k", "v", 1), status_name);
    ASSERT_HAS(pdp_last_error(), "lost by an earlier call");
    for (i = 0; i < 12; i++) pdp_store_free(c[i]);
    PASS();
}

SUITE(store)
{
    RUN_TEST(store_env_defaults);
    RUN_TEST(store_env_torchrun);
    RUN_TEST(store_env_openmpi);
    RUN_TEST(store_env_bad_values);
    RUN_TEST(store_processes_loopback);
    RUN_TEST(store_set_get_add);
    RUN_TEST(store_create_invalid);
    RUN_TEST(store_get_blocks_until_set);
    RUN_TEST(store_threads_barrier);
    RUN_TEST(store_get_timeout);
    RUN_TEST(store_connect_timeout);
    RUN_TEST(store_client_before_server);
    RUN_TEST(store_garbage_peer);
    RUN_TEST(store_free_with_clients_connected);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "rank") == 0) /* a child of store_processes_loopback */
        return child_rank(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(store);
    GREATEST_MAIN_END();
}
