/* trace: a Chrome trace of what each rank did and when, for Perfetto
   (ui.perfetto.dev) and chrome://tracing.

   Set PDP_TRACE=path and every object that traces (the DDP reducer, the MPI
   communicator, ...) records events into one process-wide sink; the file is
   the JSON Object Format of the Trace Event Format:
       {"traceEvents":[ {...}, {...} ],"displayTimeUnit":"ms"}
   with complete events ("ph":"X", ts and dur in microseconds), nestable async
   begin/end pairs for collectives ("ph":"b"/"e", one id per collective) and
   metadata that names processes and threads ("ph":"M", process_name,
   thread_name, *_sort_index). "pid" is the rank, "tid" a track: one compute
   track per rank and one per communicator, handed out by pdp__trace_track.

   Why one process-wide sink, not an object: tracing is a process-level
   debugging switch (an environment variable, like NCCL_DEBUG), and thread-ranks
   of one process must share one file with pid = rank. The sink is one of the
   exceptions to "no hidden globals" that the manual lists (THREADS AND
   DETERMINISM, with the intra-op pool, the bf16 path, MPI's ownership record and
   the CUDA devices' state): a mutex-guarded struct that
   exists only between the first pdp__trace_open and the last pdp__trace_close
   (reference counted); PDP_TRACE is read by every open while tracing is off
   (the first open that finds it set starts the file; objects opened before
   stay silent), and the file is completed when the last reference closes, or
   brought up to date by pdp_trace_flush() before that. With PDP_STATIC
   and two copies of pdp in one program there are two sinks: give them
   different PDP_TRACE values or trace only one.

   Files: a process that is one rank of several (MPI, torchrun) passes its
   rank to pdp__trace_open and writes path with ".rank<r>" inserted before the
   extension (trace.json -> trace.rank1.json); otherwise path as given.
   Timestamps are pdp__now() (monotonic) microseconds, shared by every process of a
   machine, so the per-rank files of one machine line up: merge them with
       python3 -c 'import json,sys; print(json.dumps({"traceEvents": sum(
           (json.load(open(f))["traceEvents"] for f in sys.argv[1:]), [])}))' \
           trace.rank*.json > trace.json

   Invariants: events are fixed-size records in a buffer of
   PDP_TRACE_BUFFER_EVENTS allocated at the first open; recording copies one
   record under the mutex and never allocates. A full buffer is written out
   (the recording thread pays for that write, ~1 ms per 10^4 events) and
   reused. After every write the file ends with the closing "]}" (the next
   write seeks back over it), so the file is valid JSON after each flush and
   after close, and pdp_trace_flush() makes it current at any time. Names are
   copied (truncated to 47 bytes) and escaped when written; args are a JSON
   object body built by pdp code ("\"bytes\":4096,\"seq\":3"), copied as is.
   Reference: "Trace Event Format", Google, docs.google.com/document/d/
   1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU. */

#include "internal.h"

#ifndef PDP_TRACE_BUFFER_EVENTS
#  define PDP_TRACE_BUFFER_EVENTS 16384 /* records kept in memory between writes (160 B each) */
#endif
#define PDP__TRACE_MAX_PIDS 4096        /* ranks whose process gets a name */

/* ---- trace: records ---- */

typedef struct pdp__trace_ev {
    double ts, dur;   /* microseconds */
    uint64_t id;      /* async pair id */
    int pid, tid;
    char ph;          /* 'X' complete, 'A' async pair (written as "b" and "e"), 'M' metadata */
    const char *cat;  /* a string literal */
    char name[48];
    char args[88];    /* JSON object body, without braces; "" for none */
} pdp__trace_ev;

typedef struct pdp__trace_sink {
    int refs;                 /* open minus close calls */
    int enabled;              /* read with PDP__LOAD_ACQ on the hot path */
    FILE *f;
    char path[1024];
    char prev_path[1024];     /* the file completed last (reopen) */
    long data_end;            /* file offset where the closing trailer starts */
    int64_t written;          /* events written so far (for the separator) */
    pdp__trace_ev *ev;
    int n, cap;
    int next_tid;
    bool reopen;              /* a file of this process was completed at path: a later open
                                 appends to it instead of truncating it */
    pdp_status io_status;     /* first write error, reported by pdp_trace_flush */
    unsigned char named_pid[PDP__TRACE_MAX_PIDS / 8];
} pdp__trace_sink;

static pdp__mutex pdp__trace_mu = PDP__MUTEX_INIT;
static pdp__trace_sink pdp__trace_g; /* process-wide, see above */

static const char pdp__trace_trailer[] = "\n],\"displayTimeUnit\":\"ms\"}\n";

/* ---- trace: writing ---- */

PDP__PRIVATE void pdp__trace_put_escaped(FILE *f, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
}

PDP__PRIVATE void pdp__trace_put_one(FILE *f, const pdp__trace_ev *e, char ph, double ts, bool dur)
{
    fprintf(f, "{\"ph\":\"%c\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f", ph, e->pid, e->tid, ts);
    if (dur) fprintf(f, ",\"dur\":%.3f", e->dur);
    if (e->ph == 'A') fprintf(f, ",\"id\":\"0x%llx\"", (unsigned long long)e->id);
    if (e->cat) fprintf(f, ",\"cat\":\"%s\"", e->cat);
    fputs(",\"name\":\"", f);
    pdp__trace_put_escaped(f, e->name);
    fprintf(f, "\",\"args\":{%s}}", e->args);
}

/* Appends the buffered records after the last one written, then the trailer.
   Called with the mutex held. */
PDP__PRIVATE void pdp__trace_write_locked(pdp__trace_sink *s)
{
    int i;
    if (!s->f) return;
    if (fseek(s->f, s->data_end, SEEK_SET) != 0) s->io_status = PDP_ERR_IO;
    for (i = 0; i < s->n; i++) {
        const pdp__trace_ev *e = &s->ev[i];
        fputs(s->written++ ? ",\n" : "\n", s->f);
        if (e->ph == 'A') { /* a begin and an end with the same id */
            pdp__trace_put_one(s->f, e, 'b', e->ts, false);
            fputs(",\n", s->f);
            pdp__trace_put_one(s->f, e, 'e', e->ts + e->dur, false);
        } else {
            pdp__trace_put_one(s->f, e, e->ph, e->ts, e->ph == 'X');
        }
    }
    s->n = 0;
    s->data_end = ftell(s->f);
    fputs(pdp__trace_trailer, s->f);
    if (fflush(s->f) != 0 || ferror(s->f) || s->data_end < 0) s->io_status = PDP_ERR_IO;
}

/* The next free record (writing the buffer out when it is full). Mutex held. */
PDP__PRIVATE pdp__trace_ev *pdp__trace_slot_locked(pdp__trace_sink *s)
{
    pdp__trace_ev *e;
    if (s->n == s->cap) pdp__trace_write_locked(s);
    e = &s->ev[s->n++];
    memset(e, 0, sizeof *e);
    return e;
}

PDP__PRIVATE void pdp__trace_copy(char *dst, size_t cap, const char *src)
{
    size_t n = src ? strlen(src) : 0;
    if (n >= cap) n = cap - 1;
    if (n) memcpy(dst, src, n);
    dst[n] = '\0';
}

/* args = "\"name\":\"<escaped s>\"" for metadata records. */
PDP__PRIVATE void pdp__trace_name_arg(char *dst, size_t cap, const char *s)
{
    size_t o = 0;
    o += (size_t)snprintf(dst, cap, "\"name\":\"");
    for (; *s && o + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { dst[o++] = '\\'; dst[o++] = (char)c; }
        else if (c >= 0x20) dst[o++] = (char)c;
    }
    dst[o++] = '"';
    dst[o] = '\0';
}

PDP__PRIVATE void pdp__trace_meta_locked(pdp__trace_sink *s, int pid, int tid, const char *what,
                                         const char *name, int sort_index)
{
    pdp__trace_ev *e = pdp__trace_slot_locked(s);
    char sort_what[32];
    e->ph = 'M';
    e->pid = pid;
    e->tid = tid;
    snprintf(e->name, sizeof e->name, "%.12s_name", what);
    pdp__trace_name_arg(e->args, sizeof e->args, name);
    e = pdp__trace_slot_locked(s);
    e->ph = 'M';
    e->pid = pid;
    e->tid = tid;
    snprintf(sort_what, sizeof sort_what, "%.12s_sort_index", what);
    pdp__trace_copy(e->name, sizeof e->name, sort_what);
    snprintf(e->args, sizeof e->args, "\"sort_index\":%d", sort_index);
}

/* ---- trace: the private API ---- */

/* Opens (process_rank >= 0: this process is that rank of several) or joins
   the sink. Reads PDP_TRACE while no file is open; unset or empty means
   tracing stays off and every call below is a no-op. Each successful call
   must be matched by one pdp__trace_close. */
PDP__PRIVATE pdp_status pdp__trace_open(int process_rank)
{
    pdp__trace_sink *s = &pdp__trace_g;
    const char *env;
    pdp_status st = PDP_OK;
    pdp__mutex_lock(&pdp__trace_mu);
    s->refs++;
    if (s->f) goto out; /* already tracing: join */
    env = getenv("PDP_TRACE");
    if (!env || !*env) goto out;
    {
        const char *slash = strrchr(env, '/'), *dot = strrchr(env, '.');
        int len;
        if (!dot || (slash && dot < slash)) dot = env + strlen(env); /* no extension */
        if (process_rank >= 0)
            len = snprintf(s->path, sizeof s->path, "%.*s.rank%d%s", (int)(dot - env), env,
                           process_rank, dot);
        else
            len = snprintf(s->path, sizeof s->path, "%s", env);
        if (len < 0 || (size_t)len >= sizeof s->path) {
            st = pdp__err(PDP_ERR_INVALID, "PDP_TRACE: path longer than %zu bytes",
                          sizeof s->path - 1);
            goto fail;
        }
    }
    if (s->reopen && strcmp(s->path, s->prev_path) == 0 &&
        (s->ev = (pdp__trace_ev *)pdp__alloc(sizeof(pdp__trace_ev) * PDP_TRACE_BUFFER_EVENTS)) &&
        (s->f = fopen(s->path, "r+b")) != NULL) { /* continue this process's earlier trace */
        s->cap = PDP_TRACE_BUFFER_EVENTS;
        s->n = 0;
        PDP__STORE_REL(&s->enabled, 1);
        goto out;
    }
    pdp__dealloc(s->ev);
    s->ev = (pdp__trace_ev *)pdp__alloc(sizeof(pdp__trace_ev) * PDP_TRACE_BUFFER_EVENTS);
    if (!s->ev) {
        st = pdp__err(PDP_ERR_OUT_OF_MEMORY, "PDP_TRACE: no memory for %d trace events",
                      PDP_TRACE_BUFFER_EVENTS);
        goto fail;
    }
    s->f = fopen(s->path, "w+b");
    if (!s->f) {
        st = pdp__err(PDP_ERR_IO, "PDP_TRACE: cannot open '%s' for writing: %s", s->path,
                      strerror(errno));
        goto fail;
    }
    fputs("{\"traceEvents\":[", s->f);
    s->data_end = ftell(s->f);
    s->cap = PDP_TRACE_BUFFER_EVENTS;
    s->n = 0;
    s->written = 0;
    s->next_tid = 1;
    s->io_status = PDP_OK;
    memset(s->named_pid, 0, sizeof s->named_pid);
    pdp__trace_write_locked(s); /* a valid, empty trace from the start */
    PDP__STORE_REL(&s->enabled, 1);
    goto out;
fail:
    pdp__dealloc(s->ev);
    s->ev = NULL;
    s->refs--;
out:
    pdp__mutex_unlock(&pdp__trace_mu);
    return st;
}

/* The last close writes everything, closes the file and frees the buffer. */
PDP__PRIVATE void pdp__trace_close(void)
{
    pdp__trace_sink *s = &pdp__trace_g;
    pdp__mutex_lock(&pdp__trace_mu);
    if (s->refs > 0 && --s->refs == 0 && s->f) {
        PDP__STORE_REL(&s->enabled, 0);
        pdp__trace_write_locked(s);
        fclose(s->f);
        s->f = NULL;
        s->reopen = s->io_status == PDP_OK;
        memcpy(s->prev_path, s->path, sizeof s->path);
        pdp__dealloc(s->ev);
        s->ev = NULL;
        s->cap = s->n = 0;
    }
    pdp__mutex_unlock(&pdp__trace_mu);
}

/* Cheap enough for every event site: one atomic load. */
PDP__PRIVATE bool pdp__trace_enabled(void) { return PDP__LOAD_ACQ(&pdp__trace_g.enabled) != 0; }

/* A new track (tid) on process pid (a rank) named name ("compute", "comm world");
   the first track of a pid also names the process "rank <pid>". 0 when off. */
PDP__PRIVATE int pdp__trace_track(int pid, const char *name)
{
    pdp__trace_sink *s = &pdp__trace_g;
    int tid = 0;
    if (!pdp__trace_enabled()) return 0;
    pdp__mutex_lock(&pdp__trace_mu);
    if (s->f) {
        tid = s->next_tid++;
        if (pid >= 0 && pid < PDP__TRACE_MAX_PIDS && !(s->named_pid[pid / 8] & (1u << (pid % 8)))) {
            char pname[32];
            s->named_pid[pid / 8] |= (unsigned char)(1u << (pid % 8));
            snprintf(pname, sizeof pname, "rank %d", pid);
            pdp__trace_meta_locked(s, pid, 0, "process", pname, pid);
        }
        pdp__trace_meta_locked(s, pid, tid, "thread", name, tid);
    }
    pdp__mutex_unlock(&pdp__trace_mu);
    return tid;
}

PDP__PRIVATE void pdp__trace_record(char ph, int pid, int tid, const char *cat, const char *name,
                                    uint64_t id, double t0, double t1, const char *args)
{
    pdp__trace_sink *s = &pdp__trace_g;
    pdp__trace_ev *e;
    if (!pdp__trace_enabled()) return;
    pdp__mutex_lock(&pdp__trace_mu);
    if (s->f) {
        e = pdp__trace_slot_locked(s);
        e->ph = ph;
        e->pid = pid;
        e->tid = tid;
        e->cat = cat;
        e->id = id;
        e->ts = t0 * 1e6;
        e->dur = (t1 > t0 ? t1 - t0 : 0.0) * 1e6;
        pdp__trace_copy(e->name, sizeof e->name, name);
        pdp__trace_copy(e->args, sizeof e->args, args);
    }
    pdp__mutex_unlock(&pdp__trace_mu);
}

/* A complete event: name ran on track tid of rank pid from t0 to t1 (pdp__now()
   seconds). cat: a string literal ("compute", "comm"); args: NULL or a JSON
   object body. */
PDP__PRIVATE void pdp__trace_complete(int pid, int tid, const char *cat, const char *name,
                                      double t0, double t1, const char *args)
{
    pdp__trace_record('X', pid, tid, cat, name, 0, t0, t1, args);
}

/* An async begin/end pair (a collective from launch to completion, which may
   overlap the compute track); id distinguishes concurrent pairs of one name. */
PDP__PRIVATE void pdp__trace_async(int pid, int tid, const char *cat, const char *name, uint64_t id,
                                   double t0, double t1, const char *args)
{
    pdp__trace_record('A', pid, tid, cat, name, id, t0, t1, args);
}

/* ---- trace: public ---- */

PDP_API pdp_status pdp_trace_flush(void)
{
    pdp__trace_sink *s = &pdp__trace_g;
    pdp_status st = PDP_OK;
    pdp__mutex_lock(&pdp__trace_mu);
    if (s->f) {
        pdp__trace_write_locked(s);
        if (s->io_status != PDP_OK)
            st = pdp__err(s->io_status, "pdp_trace_flush: writing '%s' failed", s->path);
    }
    pdp__mutex_unlock(&pdp__trace_mu);
    return st;
}
