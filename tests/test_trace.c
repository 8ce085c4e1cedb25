/* Tests of the Chrome trace sink (src/trace.c): off without PDP_TRACE, valid
   JSON (checked by Python's json module, independently of our writer) with the
   expected events, units and escaping, per-rank file names, reference-counted
   open/close, a mid-run pdp_trace_flush, a second run in one process that keeps the
   first's events, and a hot path that allocates nothing
   after warm-up while four threads record far more events than the buffer
   holds. ZeRO stage 3: reduce-scatter and all-gather lanes, and the prefetch
   overlap (the next unit's gather starts before the current unit's forward
   ends). DDP on groups split from the world: a lane per world rank. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <stddef.h>

static void *trace_test_malloc(size_t bytes);
static void trace_test_free(void *p);
#define PDP_MALLOC(bytes) trace_test_malloc(bytes)
#define PDP_FREE(p) trace_test_free(p)
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include <pthread.h>
#include "test_platform.h"

static long trace_allocs;

static void *trace_test_malloc(size_t bytes)
{
    __atomic_add_fetch(&trace_allocs, 1, __ATOMIC_RELAXED);
    return malloc(bytes);
}

static void trace_test_free(void *p) { free(p); }

static long allocs_now(void) { return __atomic_load_n(&trace_allocs, __ATOMIC_RELAXED); }

static char tmpdir[256];

static void path_of(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

/* Reads a whole file into a malloc'd string (NULL when missing). */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    long n;
    char *s;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    s = (char *)malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* Parses path with Python's json module (an independent JSON reader) and counts
   events by phase; also checks that every "b" has an "e" with the same id and
   that the name a"b\c survived escaping. -1 when the file is not valid JSON. */
typedef struct counts { int x, b, e, m, esc, pairs_ok; } counts;

static int json_counts(const char *path, counts *c)
{
    char cmd[2048], out[300], *s;
    int rc;
    memset(c, 0, sizeof *c);
    snprintf(out, sizeof out, "%s.counts", path);
    snprintf(cmd, sizeof cmd,
             "\"%s\" -c 'import json,sys\n"
             "ev=json.load(open(sys.argv[1]))[\"traceEvents\"]\n"
             "n=lambda p: sum(1 for e in ev if e[\"ph\"]==p)\n"
             "b=sorted(e[\"id\"] for e in ev if e[\"ph\"]==\"b\")\n"
             "e=sorted(e[\"id\"] for e in ev if e[\"ph\"]==\"e\")\n"
             "esc=sum(1 for x in ev if x[\"name\"]==chr(97)+chr(34)+chr(98)+chr(92)+chr(99))\n"
             "open(sys.argv[2],\"w\").write(\"%%d %%d %%d %%d %%d %%d\" %% (n(\"X\"),n(\"b\"),"
             "n(\"e\"),n(\"M\"),esc,int(b==e)))' '%s' '%s' 2>&1",
             pdp_test_python("json"), path, out);
    rc = system(cmd);
    if (rc != 0) return -1;
    s = slurp(out);
    if (!s) return -1;
    rc = sscanf(s, "%d %d %d %d %d %d", &c->x, &c->b, &c->e, &c->m, &c->esc, &c->pairs_ok);
    free(s);
    remove(out);
    return rc == 6 ? 0 : -1;
}

static bool have_python(void) { return pdp_test_python("json") != NULL; }

TEST trace_off_without_env(void)
{
    unsetenv("PDP_TRACE");
    ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(-1), pdp_status_name);
    ASSERT_FALSE(pdp__trace_enabled());
    ASSERT_EQ(0, pdp__trace_track(0, "compute"));
    pdp__trace_complete(0, 1, "compute", "forward", 1.0, 2.0, NULL); /* no-op, no crash */
    ASSERT_ENUM_EQ(PDP_OK, pdp_trace_flush(), pdp_status_name);
    pdp__trace_close();
    ASSERT_FALSE(pdp__trace_enabled());
    PASS();
}

TEST trace_writes_valid_json_with_expected_events(void)
{
    char path[512], *s;
    int tc0, tc1, tcomm;
    counts c;
    if (!have_python()) SKIPm(pdp_test_python_missing("json"));
    path_of(path, sizeof path, "events.json");
    setenv("PDP_TRACE", path, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(-1), pdp_status_name);
    ASSERT(pdp__trace_enabled());
    tc0 = pdp__trace_track(0, "compute");
    tc1 = pdp__trace_track(1, "compute");
    tcomm = pdp__trace_track(0, "comm world");
    ASSERT(tc0 > 0 && tc1 > 0 && tcomm > 0);
    ASSERT(tc0 != tc1 && tc1 != tcomm && tc0 != tcomm);
    pdp__trace_complete(0, tc0, "compute", "backward", 1.0, 1.0025, "\"layer\":3");
    pdp__trace_complete(1, tc1, "compute", "a\"b\\c", 2.0, 2.5, NULL);
    pdp__trace_async(0, tcomm, "comm", "allreduce", 7, 1.001, 1.004, "\"seq\":0");
    pdp__trace_async(0, tcomm, "comm", "allreduce", 8, 1.002, 1.005, "\"seq\":1");
    pdp__trace_close();
    ASSERT_FALSE(pdp__trace_enabled());

    ASSERT_EQm("not valid JSON (Python's json.load failed)", 0, json_counts(path, &c));
    ASSERT_EQ(2, c.x);
    ASSERT_EQ(2, c.b);
    ASSERT_EQ(2, c.e);
    ASSERT_EQm("async begin and end ids differ", 1, c.pairs_ok);
    ASSERT_EQ(1, c.esc);
    /* process_name + sort index for ranks 0 and 1, thread_name + sort index per track */
    ASSERT_EQ(2 * 2 + 3 * 2, c.m);
    s = slurp(path);
    ASSERT(s != NULL);
    ASSERT(strncmp(s, "{\"traceEvents\":[", 16) == 0);
    ASSERTm("microseconds: ts 1 s = 1000000, dur 2.5 ms = 2500",
            strstr(s, "\"ts\":1000000.000,\"dur\":2500.000") != NULL);
    ASSERT(strstr(s, "\"name\":\"process_name\",\"args\":{\"name\":\"rank 1\"}") != NULL);
    ASSERT(strstr(s, "\"name\":\"thread_name\",\"args\":{\"name\":\"comm world\"}") != NULL);
    ASSERT(strstr(s, "\"args\":{\"layer\":3}") != NULL);
    ASSERT(strstr(s, "\"ph\":\"e\",\"pid\":0,\"tid\":") != NULL);
    free(s);
    remove(path);
    PASS();
}

TEST trace_rank_file_names(void)
{
    char base[512], expect[512];
    FILE *f;
    path_of(base, sizeof base, "ranked.json");
    setenv("PDP_TRACE", base, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(2), pdp_status_name);
    pdp__trace_close();
    path_of(expect, sizeof expect, "ranked.rank2.json");
    f = fopen(expect, "rb");
    ASSERTm("PDP_TRACE=ranked.json on rank 2 writes ranked.rank2.json", f != NULL);
    fclose(f);
    remove(expect);
    ASSERTm("the unranked name is not written", fopen(base, "rb") == NULL);

    path_of(base, sizeof base, "noext");
    setenv("PDP_TRACE", base, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(11), pdp_status_name);
    pdp__trace_close();
    path_of(expect, sizeof expect, "noext.rank11");
    f = fopen(expect, "rb");
    ASSERTm("no extension: the suffix is appended", f != NULL);
    fclose(f);
    remove(expect);
    PASS();
}

TEST trace_bad_path_fails_with_message(void)
{
    setenv("PDP_TRACE", "/nonexistent-dir-pdp/x.json", 1);
    ASSERT_ENUM_EQ(PDP_ERR_IO, pdp__trace_open(-1), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "/nonexistent-dir-pdp/x.json") != NULL);
    ASSERT(strstr(pdp_last_error(), "PDP_TRACE") != NULL);
    ASSERT_FALSE(pdp__trace_enabled());
    /* the failed open holds no reference: the next one starts afresh */
    unsetenv("PDP_TRACE");
    ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(-1), pdp_status_name);
    ASSERT_FALSE(pdp__trace_enabled());
    pdp__trace_close();
    PASS();
}

TEST trace_refcounted_and_flush_mid_run(void)
{
    char path[512];
    int t;
    counts c;
    if (!have_python()) SKIPm(pdp_test_python_missing("json"));
    path_of(path, sizeof path, "refs.json");
    setenv("PDP_TRACE", path, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(-1), pdp_status_name); /* e.g. the DDP object */
    ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(-1), pdp_status_name); /* e.g. its communicator */
    unsetenv("PDP_TRACE"); /* read once, at the first open */
    t = pdp__trace_track(0, "compute");
    pdp__trace_complete(0, t, "compute", "step", 1.0, 2.0, NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_trace_flush(), pdp_status_name);
    ASSERT_EQm("valid JSON after a flush, while still open", 0, json_counts(path, &c));
    ASSERT_EQ(1, c.x);
    pdp__trace_close();
    ASSERTm("one reference left: still on", pdp__trace_enabled());
    pdp__trace_complete(0, t, "compute", "step", 2.0, 3.0, NULL);
    pdp__trace_close();
    ASSERT_FALSE(pdp__trace_enabled());
    ASSERT_EQ(0, json_counts(path, &c));
    ASSERT_EQ(2, c.x);
    remove(path);
    PASS();
}

/* Two traced runs in one process (a DDP run, then a ZeRO run, each opening and closing the
   sink): the second continues the first's file, which stays valid JSON with both runs'
   events (the second open truncated it). A new process, or a file gone, starts afresh. */
TEST trace_second_run_in_a_process_keeps_the_first(void)
{
    char path[512];
    int run, t;
    counts c;
    if (!have_python()) SKIPm(pdp_test_python_missing("json"));
    path_of(path, sizeof path, "two_runs.json");
    remove(path);
    for (run = 0; run < 2; run++) {
        setenv("PDP_TRACE", path, 1);
        ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(-1), pdp_status_name);
        t = pdp__trace_track(0, run ? "compute (run 2)" : "compute");
        pdp__trace_complete(0, t, "compute", "step", 1.0 + run, 1.5 + run, NULL);
        pdp__trace_complete(0, t, "compute", "step", 1.5 + run, 2.0 + run, NULL);
        pdp__trace_close();
        ASSERT_EQm("not valid JSON", 0, json_counts(path, &c));
        ASSERT_EQ(2 * (run + 1), c.x);
    }
    remove(path); /* gone: the next run writes a new file */
    ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(-1), pdp_status_name);
    t = pdp__trace_track(0, "compute");
    pdp__trace_complete(0, t, "compute", "step", 1.0, 2.0, NULL);
    pdp__trace_close();
    ASSERT_EQ(0, json_counts(path, &c));
    ASSERT_EQ(1, c.x);
    unsetenv("PDP_TRACE");
    remove(path);
    PASS();
}

/* ---- hot path: four threads, many buffer refills, no allocation ---- */

#define HOT_THREADS 4
#define HOT_EVENTS 50000 /* per thread; the buffer holds PDP_TRACE_BUFFER_EVENTS */

typedef struct hot_arg { int rank, tid; } hot_arg;

static void *hot_thread(void *p)
{
    hot_arg *a = (hot_arg *)p;
    int i;
    char args[48];
    for (i = 0; i < HOT_EVENTS; i++) {
        double t = pdp__now();
        snprintf(args, sizeof args, "\"i\":%d", i);
        if (i % 10 == 9) pdp__trace_async(a->rank, a->tid, "comm", "allreduce", (uint64_t)i, t,
                                          t + 1e-6, args);
        else pdp__trace_complete(a->rank, a->tid, "compute", "layer", t, t + 1e-6, args);
    }
    return NULL;
}

TEST trace_hot_path_allocates_nothing(void)
{
    char path[512];
    pthread_t th[HOT_THREADS];
    hot_arg a[HOT_THREADS];
    long before;
    double t0, t1;
    int i;
    counts c;
    path_of(path, sizeof path, "hot.json");
    setenv("PDP_TRACE", path, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp__trace_open(-1), pdp_status_name);
    for (i = 0; i < HOT_THREADS; i++) {
        a[i].rank = i;
        a[i].tid = pdp__trace_track(i, "compute");
    }
    pdp__trace_complete(0, a[0].tid, "compute", "warm-up", 0.0, 1.0, NULL);
    before = allocs_now();
    t0 = pdp__now();
    for (i = 0; i < HOT_THREADS; i++) pthread_create(&th[i], NULL, hot_thread, &a[i]);
    for (i = 0; i < HOT_THREADS; i++) pthread_join(th[i], NULL);
    t1 = pdp__now();
    ASSERT_EQm("recording (with buffer write-outs) called PDP_MALLOC", before, allocs_now());
    pdp__trace_close();
    printf("\ntrace: %d events from %d threads in %.1f ms (%.0f ns/event, file writes included)\n",
           HOT_THREADS * HOT_EVENTS, HOT_THREADS, (t1 - t0) * 1e3,
           (t1 - t0) * 1e9 / (HOT_THREADS * HOT_EVENTS));
    if (have_python()) {
        ASSERT_EQ(0, json_counts(path, &c));
        ASSERT_EQ(1 + HOT_THREADS * (HOT_EVENTS - HOT_EVENTS / 10), c.x);
        ASSERT_EQ(HOT_THREADS * (HOT_EVENTS / 10), c.b);
        ASSERT_EQ(c.b, c.e);
    }
    remove(path);
    PASS();
}

/* ---- ZeRO's lanes and stage 3's prefetch ---- */

typedef struct zero_rank {
    pdp_local_group *g;
    int rank;
    pdp_status st;
    char map[128]; /* "layer:unit,..." for the Linear layers (rank 0) */
} zero_rank;

static void *zero_rank_main(void *arg)
{
    zero_rank *zr = (zero_rank *)arg;
    pdp_comm *c = NULL;
    pdp_model *m = NULL;
    pdp_zero *z = NULL;
    pdp_optim *o = NULL;
    pdp_model_desc md;
    pdp_zero_desc zd;
    float x[16 * 32], loss;
    int32_t y[16];
    int64_t shape[2] = {16, 32};
    pdp_tensor xt;
    int i, s;
    size_t n = 0;
    for (i = 0; i < 16 * 32; i++) x[i] = (float)((i * 37 + zr->rank * 11) % 17) / 17.0f - 0.5f;
    for (i = 0; i < 16; i++) y[i] = (i + zr->rank) % 10;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 32;
    md.seed = 3;
    memset(&zd, 0, sizeof zd);
    zd.stage = 3;
    zd.bucket_cap_mb = 0.0001; /* one unit per Linear layer */
    zd.first_bucket_mb = 0.0001;
    if ((zr->st = pdp_comm_create_local(&c, zr->g, zr->rank)) ||
        (zr->st = pdp_model_create(&m, &md)) || (zr->st = pdp_model_add_linear(m, 64)) ||
        (zr->st = pdp_model_add_relu(m)) || (zr->st = pdp_model_add_linear(m, 64)) ||
        (zr->st = pdp_model_add_relu(m)) || (zr->st = pdp_model_add_linear(m, 64)) ||
        (zr->st = pdp_model_add_relu(m)) || (zr->st = pdp_model_add_linear(m, 10)) ||
        (zr->st = pdp_zero_create(&z, m, c, &zd)) || (zr->st = pdp_zero_optim_create(&o, z, NULL)))
        goto out;
    for (i = 0; i < m->nlayers; i++)
        if (z->unit_of_layer[i] >= 0)
            n += (size_t)snprintf(zr->map + n, sizeof zr->map - n, "%s%d:%d", n ? "," : "", i,
                                  z->unit_of_layer[i]);
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    for (s = 0; s < 2; s++)
        if ((zr->st = pdp_zero_forward_backward(z, &xt, y, &loss)) ||
            (zr->st = pdp_zero_step(z, o)))
            goto out;
out:
    pdp_zero_free(z);
    pdp_optim_free(o);
    pdp_model_free(m);
    pdp_comm_free(c);
    return NULL;
}

/* Stage 3 traced: rank 0 has an "allgather <name>" lane with the gathers and a
   "comm <name>" lane with the reduce-scatters, and in forward order the gather of
   the next unit starts before the current unit's forward ends (prefetch). */
TEST trace_zero_lanes_and_prefetch_overlap(void)
{
    char path[512], script[512], cmd[1600];
    pdp_local_group *g = NULL;
    pthread_t t[2];
    zero_rank zr[2];
    FILE *f;
    int r, rc;
    if (!have_python()) SKIPm(pdp_test_python_missing("json"));
    path_of(path, sizeof path, "zero.json");
    path_of(script, sizeof script, "zero_check.py");
    setenv("PDP_TRACE", path, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 2, NULL), pdp_status_name);
    for (r = 0; r < 2; r++) {
        memset(&zr[r], 0, sizeof zr[r]);
        zr[r].g = g;
        zr[r].rank = r;
        pthread_create(&t[r], NULL, zero_rank_main, &zr[r]);
    }
    for (r = 0; r < 2; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
    unsetenv("PDP_TRACE");
    for (r = 0; r < 2; r++) ASSERT_ENUM_EQ(PDP_OK, zr[r].st, pdp_status_name);
    f = fopen(script, "w");
    ASSERT(f != NULL);
    fputs("import json, sys\n"
          "ev = json.load(open(sys.argv[1]))['traceEvents']\n"
          "unit = {int(a): int(b) for a, b in (p.split(':') for p in sys.argv[2].split(','))}\n"
          "lanes = {e['tid']: e['args']['name'] for e in ev\n"
          "         if e['ph'] == 'M' and e['name'] == 'thread_name' and e['pid'] == 0}\n"
          "mine = [e for e in ev if e.get('pid') == 0]\n"
          "rs = [e for e in mine if e['ph'] == 'b' and e['name'].startswith('reduce_scatter')]\n"
          "ag = [e for e in mine if e['ph'] == 'b' and e['name'].startswith('allgather unit')]\n"
          "assert rs and all(lanes[e['tid']].startswith('comm ') for e in rs), lanes\n"
          "assert ag and all(lanes[e['tid']].startswith('allgather ') for e in ag), lanes\n"
          "fw = sorted((e for e in mine if e['ph'] == 'X' and e['name'].startswith('forward ')\n"
          "             and int(e['name'].split()[1]) in unit), key=lambda e: e['ts'])\n"
          "assert len(fw) == 2 * len(unit), 'forward events %d' % len(fw)\n"
          "overlaps = 0\n"
          "for a, b in zip(fw, fw[1:]):\n"
          "    la, lb = int(a['name'].split()[1]), int(b['name'].split()[1])\n"
          "    if lb <= la: continue  # the next step's first layer\n"
          "    end = a['ts'] + a['dur']\n"
          "    name = 'allgather unit %d' % unit[lb]\n"
          "    if any(g['name'] == name and g['ts'] < end and g['ts'] <= a['ts'] + a['dur']\n"
          "           and g['ts'] >= a['ts'] - 1e4 for g in ag): overlaps += 1\n"
          "    else: sys.exit('no prefetch of %s during forward %d' % (name, la))\n"
          "assert overlaps == 2 * (len(unit) - 1), overlaps\n",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "\"%s\" '%s' '%s' '%s'", pdp_test_python("json"), script, path,
             zr[0].map);
    rc = system(cmd);
    remove(script);
    remove(path);
    ASSERT_EQm("the trace lacks the lanes or the prefetch overlap (python says why)", 0, rc);
    PASS();
}

/* DDP on groups split from the world (4 thread ranks, 2 groups of 2): each rank keeps its
   world rank as its trace lane, so the trace has four processes, not two groups' ranks 0
   and 1 merged, and no two async events share an id. */
typedef struct split_rank {
    pdp_local_group *g;
    int rank;
    pdp_status st;
} split_rank;

static void *split_rank_main(void *arg)
{
    split_rank *sr = (split_rank *)arg;
    pdp_comm *world = NULL, *half = NULL;
    pdp_model *m = NULL;
    pdp_ddp *d = NULL;
    pdp_model_desc md;
    float x[8 * 16], loss;
    int32_t y[8];
    int64_t shape[2] = {8, 16};
    pdp_tensor xt;
    int i;
    for (i = 0; i < 8 * 16; i++) x[i] = (float)((i * 7 + sr->rank) % 13) / 13.0f;
    for (i = 0; i < 8; i++) y[i] = (i + sr->rank) % 4;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 16;
    if ((sr->st = pdp_comm_create_local(&world, sr->g, sr->rank)) ||
        (sr->st = pdp_comm_split(world, sr->rank / 2, sr->rank, &half)) ||
        (sr->st = pdp_model_create(&m, &md)) || (sr->st = pdp_model_add_linear(m, 8)) ||
        (sr->st = pdp_model_add_relu(m)) || (sr->st = pdp_model_add_linear(m, 4)) ||
        (sr->st = pdp_ddp_create(&d, m, half, NULL)))
        goto out;
    pdp_tensor_wrap(x, pdp_cpu(), 2, shape, &xt);
    if ((sr->st = pdp_ddp_forward_backward(d, &xt, y, &loss)) == PDP_OK)
        sr->st = pdp_ddp_finish(d);
out:
    pdp_ddp_free(d);
    pdp_model_free(m);
    pdp_comm_free(half);
    pdp_comm_free(world);
    return NULL;
}

TEST trace_split_groups_keep_the_world_ranks(void)
{
    char path[512], cmd[1400];
    pdp_local_group *g = NULL;
    pthread_t t[4];
    split_rank sr[4];
    int r;
    if (!have_python()) SKIPm(pdp_test_python_missing("json"));
    path_of(path, sizeof path, "split.json");
    remove(path);
    setenv("PDP_TRACE", path, 1);
    ASSERT_ENUM_EQ(PDP_OK, pdp_local_group_create(&g, 4, NULL), pdp_status_name);
    for (r = 0; r < 4; r++) {
        memset(&sr[r], 0, sizeof sr[r]);
        sr[r].g = g, sr[r].rank = r;
        pthread_create(&t[r], NULL, split_rank_main, &sr[r]);
    }
    for (r = 0; r < 4; r++) pthread_join(t[r], NULL);
    pdp_local_group_free(g);
    unsetenv("PDP_TRACE");
    for (r = 0; r < 4; r++) ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, sr[r].st, pdp_status_name);
    snprintf(cmd, sizeof cmd,
             "\"%s\" -c 'import json,sys\n"
             "ev=json.load(open(sys.argv[1]))[\"traceEvents\"]\n"
             "pids=sorted(set(e[\"pid\"] for e in ev if e[\"ph\"]==\"X\"))\n"
             "ids=[e[\"id\"] for e in ev if e[\"ph\"]==\"b\"]\n"
             "assert pids==[0,1,2,3], pids\n"
             "assert ids and len(ids)==len(set(ids)), ids\n' '%s'",
             pdp_test_python("json"), path);
    ASSERT_EQm("the trace merged the groups' ranks or repeated an id (python says which)", 0,
               system(cmd));
    remove(path);
    PASS();
}

SUITE(trace)
{
    RUN_TEST(trace_off_without_env);
    RUN_TEST(trace_writes_valid_json_with_expected_events);
    RUN_TEST(trace_rank_file_names);
    RUN_TEST(trace_bad_path_fails_with_message);
    RUN_TEST(trace_refcounted_and_flush_mid_run);
    RUN_TEST(trace_second_run_in_a_process_keeps_the_first);
    RUN_TEST(trace_hot_path_allocates_nothing);
    RUN_TEST(trace_zero_lanes_and_prefetch_overlap);
    RUN_TEST(trace_split_groups_keep_the_world_ranks);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    if (test_temp_dir(tmpdir, sizeof tmpdir, "pdp_trace_test") != 0) { perror("mkdtemp"); return 1; }
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(trace);
    (void)test_remove_tree(tmpdir);
    GREATEST_MAIN_END();
}
