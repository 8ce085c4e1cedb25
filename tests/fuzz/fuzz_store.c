/* fuzz_store.c - libFuzzer harness for the TCP store's server (src/store.c). The server
   runs in-process (a pdp_store with is_server); each input is sent as-is by a raw client
   connection, which then half-closes and reads until the server hangs up (abort if it does
   not within 3 s: a stuck connection). Then the library's own client must still set and get
   a key correctly, and the process must not gain file descriptors. Every 5000 inputs the
   store is freed (with whatever the fuzz SETs left in it) and created again. */
#define _POSIX_C_SOURCE 200809L
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include <sys/types.h>

static pdp_store *g_store;
static int g_port, g_fds0 = -1;
static long g_runs;
static unsigned g_probe;

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d))) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static void start(void)
{
    pdp_store_desc d;
    memset(&d, 0, sizeof d);
    d.host = "127.0.0.1";
    d.port = 0;
    d.is_server = true;
    d.world_size = 1;
    d.timeout_s = 5;
    if (pdp_store_create(&g_store, &d) != PDP_OK) {
        fprintf(stderr, "store: %s\n", pdp_last_error());
        abort();
    }
    g_port = pdp_store_port(g_store);
}

static void probe(void)
{
    char key[64], val[64], got[64];
    size_t n = 0;
    pdp_status st;
    snprintf(key, sizeof key, "fuzz/probe/%u", g_probe % 4);
    snprintf(val, sizeof val, "value %u", g_probe++);
    if ((st = pdp_store_set(g_store, key, val, strlen(val))) != PDP_OK ||
        (st = pdp_store_get(g_store, key, got, sizeof got, &n)) != PDP_OK) {
        fprintf(stderr, "server unresponsive after the input: %s: %s\n", pdp_status_name(st),
                pdp_last_error());
        abort();
    }
    if (n != strlen(val) || memcmp(got, val, n) != 0) {
        fprintf(stderr, "probe read back the wrong value\n");
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sockaddr_in a;
    unsigned char buf[65536];
    size_t sent = 0;
    double deadline;
    int fd;
    if (!g_store) {
        pdp_set_num_threads(1);
        start();
    }
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) abort();
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    {   /* a fresh source address each time (127.x.y.z): the server closes first, so its
           TIME_WAITs would otherwise exhaust the ephemeral ports within seconds */
        struct sockaddr_in src;
        static uint32_t next = 1;
        int tries;
        memset(&src, 0, sizeof src);
        src.sin_family = AF_INET;
        for (tries = 0;; tries++) {
            next = next % 0xfffffe + 1;
            src.sin_addr.s_addr = htonl(0x7f000000u | next);
            if (bind(fd, (struct sockaddr *)&src, sizeof src) == 0 &&
                connect(fd, (struct sockaddr *)&a, sizeof a) == 0)
                break;
            if (tries == 5) {
                perror("connect");
                abort();
            }
            close(fd);
            fd = socket(AF_INET, SOCK_STREAM, 0);
            if (fd < 0) abort();
        }
    }
    deadline = pdp__now() + 3.0;
    /* send, reading replies as they come so a large one cannot deadlock the two sides */
    while (sent < size) {
        struct pollfd p = {fd, POLLOUT | POLLIN, 0};
        if (pdp__now() > deadline) { fprintf(stderr, "send stuck\n"); abort(); }
        if (poll(&p, 1, 100) <= 0) continue;
        if (p.revents & POLLIN) {
            ssize_t r = recv(fd, buf, sizeof buf, 0);
            if (r <= 0) break; /* the server hung up (a rejected request): fine */
        }
        if (p.revents & POLLOUT) {
            ssize_t r = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
            if (r < 0) break;
            sent += (size_t)r;
        }
        if (p.revents & (POLLERR | POLLHUP)) break;
    }
    shutdown(fd, SHUT_WR);
    for (;;) { /* the server must hang up: EOF (or a reset) */
        struct pollfd p = {fd, POLLIN, 0};
        double left = deadline - pdp__now();
        ssize_t r;
        if (left <= 0) {
            fprintf(stderr, "the server kept the connection open after the client's EOF\n");
            abort();
        }
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
        r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) break;
    }
    close(fd);
    probe();
    if (++g_runs % 100 == 0) {
        int n = count_fds();
        if (g_fds0 < 0) g_fds0 = n; /* the baseline once the store's own connection is up */
        if (n > g_fds0 + 20) { /* a leak grows with the inputs; a few are transient */
            fprintf(stderr, "descriptor leak: %d open, %d at the start\n", n, g_fds0);
            system("ls -l /proc/$PPID/fd >&2; ss -tanp >&2");
            abort();
        }
    }
    if (g_runs % 5000 == 0) {
        pdp_store_free(g_store);
        g_store = NULL;
        start();
    }
    return 0;
}
