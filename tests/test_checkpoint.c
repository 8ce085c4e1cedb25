/* test_checkpoint: safetensors save/load. Round trips (model, optimizer state,
   step count, hyper-parameters), Python's safetensors reading our files and
   writing files we read back, every broken-file path (missing, truncated,
   flipped header bytes, wrong shape, missing or extra tensor, foreign file,
   wrong optimizer) failing with the right status and message and leaving the
   model and optimizer bit-identical, an interrupted save leaving the previous
   checkpoint intact, and exact resume across processes: 1 epoch, save, load in
   a fresh process (this binary re-executed), 1 more epoch == 2 epochs straight,
   bit for bit, with Adam or SGD momentum state and dropout in the model. */

#define _POSIX_C_SOURCE 200809L /* before the first system header: mkdtemp, fork, setrlimit */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"

static char tmpdir[64];

static const char *status_name(int s) { return pdp_status_name((pdp_status)s); }

static void path_in_tmp(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

/* ---- helpers: models, training, snapshots ---- */

/* in -> hidden -> ReLU -> [Dropout(0.25)] -> out */
static pdp_model *make_model(int64_t in, int64_t hidden, int64_t out, bool dropout, uint64_t seed)
{
    pdp_model_desc md;
    pdp_model *m = NULL;
    pdp_status st;
    memset(&md, 0, sizeof md);
    md.input_shape[0] = in;
    md.seed = seed;
    if (pdp_model_create(&m, &md) != PDP_OK) return NULL;
    st = pdp_model_add_linear(m, hidden);
    if (st == PDP_OK) st = pdp_model_add_relu(m);
    if (st == PDP_OK && dropout) st = pdp_model_add_dropout(m, 0.25f);
    if (st == PDP_OK && out) st = pdp_model_add_linear(m, out);
    if (st != PDP_OK) {
        pdp_model_free(m);
        return NULL;
    }
    return m;
}

static pdp_optim_desc adam_desc(void)
{
    pdp_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = PDP_OPTIM_ADAM;
    d.lr = 0.02f;
    d.weight_decay = 0.01f;
    d.beta2 = 0.99f;
    return d;
}

static pdp_optim_desc sgd_desc(void)
{
    pdp_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = PDP_OPTIM_SGD;
    d.lr = 0.05f;
    d.momentum = 0.9f;
    d.nesterov = true;
    d.weight_decay = 1e-3f;
    return d;
}

/* A few steps with random gradients: parameters and state become non-trivial. */
static void random_steps(pdp_model *m, pdp_optim *o, int steps, uint64_t seed)
{
    pdp_tensor p, g;
    pdp_rng r;
    int64_t i;
    int s;
    pdp_model_flat(m, &p, &g);
    pdp_rng_seed(&r, seed, 9);
    for (s = 0; s < steps; s++) {
        for (i = 0; i < g.count; i++) g.data[i] = pdp_rng_normal(&r);
        pdp_optim_step(o);
    }
}

typedef struct snapshot {
    float *params, *state[2];
    int64_t count, steps, model_step;
    uint64_t model_seed;
    pdp_optim_desc desc;
} snapshot;

static void snap_take(snapshot *s, const pdp_model *m, const pdp_optim *o)
{
    int k;
    memset(s, 0, sizeof *s);
    s->count = m->param_count;
    s->params = (float *)malloc((size_t)s->count * 4);
    memcpy(s->params, m->param_block, (size_t)s->count * 4);
    s->model_step = (int64_t)m->step;
    s->model_seed = m->seed;
    if (!o) return;
    for (k = 0; k < o->nstate; k++) {
        s->state[k] = (float *)malloc((size_t)s->count * 4);
        memcpy(s->state[k], o->state[k], (size_t)s->count * 4);
    }
    s->steps = o->steps;
    s->desc = o->desc;
}

/* 1 when m (and o) hold exactly the snapshot's bits. */
static int snap_same(const snapshot *s, const pdp_model *m, const pdp_optim *o)
{
    int k;
    if (m->param_count != s->count || memcmp(s->params, m->param_block, (size_t)s->count * 4))
        return 0;
    if ((int64_t)m->step != s->model_step || m->seed != s->model_seed) return 0;
    if (!o) return 1;
    for (k = 0; k < o->nstate; k++)
        if (!s->state[k] || memcmp(s->state[k], o->state[k], (size_t)s->count * 4)) return 0;
    return o->steps == s->steps && memcmp(&o->desc, &s->desc, sizeof s->desc) == 0;
}

static void snap_free(snapshot *s)
{
    free(s->params);
    free(s->state[0]);
    free(s->state[1]);
    memset(s, 0, sizeof *s);
}

static unsigned char *read_all(const char *path, long *bytes)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n;
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = (unsigned char *)malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *bytes = n;
    return buf;
}

static int write_all(const char *path, const void *data, long bytes)
{
    FILE *f = fopen(path, "wb");
    int ok;
    if (!f) return -1;
    ok = fwrite(data, 1, (size_t)bytes, f) == (size_t)bytes;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* ---- round trips ---- */

TEST checkpoint_round_trip_with_optimizer(void)
{
    static const int kinds[] = {PDP_OPTIM_SGD, PDP_OPTIM_ADAM, PDP_OPTIM_ADAMW};
    char path[128];
    int k;
    path_in_tmp(path, sizeof path, "round.safetensors");
    for (k = 0; k < 3; k++) {
        pdp_model *a = make_model(5, 8, 3, false, 1), *b = make_model(5, 8, 3, false, 2);
        pdp_optim *oa = NULL, *ob = NULL;
        pdp_optim_desc d = kinds[k] == PDP_OPTIM_SGD ? sgd_desc() : adam_desc(), other;
        snapshot s;
        d.kind = (pdp_optim_kind)kinds[k];
        memset(&other, 0, sizeof other);
        other.kind = d.kind;
        other.momentum = kinds[k] == PDP_OPTIM_SGD ? 0.5f : 0.0f;
        ASSERT(a && b);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oa, a, &d), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&ob, b, &other), status_name);
        random_steps(a, oa, 3, 11);
        pdp_optim_set_lr(oa, 0.0f); /* lr 0 (end of a schedule) must survive */
        a->step = 17;
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_save(path, a, oa), status_name);
        snap_take(&s, a, oa);
        ASSERT_FALSE(snap_same(&s, b, ob));
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, b, ob), status_name);
        ASSERTm(pdp_optim_kind_name(d.kind), snap_same(&s, b, ob));
        ASSERT_EQ(3, (int)pdp_optim_steps(ob));
        snap_free(&s);
        pdp_optim_free(oa);
        pdp_optim_free(ob);
        pdp_model_free(a);
        pdp_model_free(b);
    }
    PASS();
}

/* ZeRO's seam: a rank's range [lo, hi) of parameters and optimizer state,
   from the slice of a full checkpoint and through a shard file, each bit for
   bit; elements outside the range untouched; state only and parameters only;
   mismatched ranges and files refused, naming both. */
TEST checkpoint_range_save_and_load(void)
{
    static const int kinds[] = {PDP_OPTIM_SGD, PDP_OPTIM_ADAMW};
    char full[128], shard[128];
    int v, k;
    path_in_tmp(full, sizeof full, "range_full.safetensors");
    path_in_tmp(shard, sizeof shard, "range_shard.safetensors");
    for (v = 0; v < 2; v++) {
        pdp_model *a = make_model(5, 9, 3, false, 1), *b = make_model(5, 9, 3, false, 2);
        pdp_model *c = make_model(5, 9, 3, false, 3);
        pdp_optim *oa = NULL, *rb = NULL, *rc = NULL, *other = NULL;
        pdp_optim_desc d = kinds[v] == PDP_OPTIM_SGD ? sgd_desc() : adam_desc();
        int64_t lo, hi, n, i;
        float *b0, *c0;
        d.kind = (pdp_optim_kind)kinds[v];
        ASSERT(a && b && c);
        n = a->param_count;
        lo = 7; /* inside 0.weight */
        hi = n - 5; /* inside the last bias */
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oa, a, &d), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp__optim_create_range(&rb, b, &d, lo, hi, "t"), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp__optim_create_range(&rc, c, &d, lo, hi, "t"), status_name);
        random_steps(a, oa, 3, 11);
        a->step = 9;
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_save(full, a, oa), status_name);
        b0 = (float *)malloc((size_t)n * 4);
        c0 = (float *)malloc((size_t)n * 4);
        memcpy(b0, b->param_block, (size_t)n * 4);
        memcpy(c0, c->param_block, (size_t)n * 4);

        /* the slice of a full checkpoint */
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                        pdp__checkpoint_load_range(full, b, b->param_block + lo, rb, lo, hi, "z"),
                        status_name);
        for (i = 0; i < n; i++)
            ASSERT_EQ_FMT(i >= lo && i < hi ? a->param_block[i] : b0[i], b->param_block[i],
                          "%.9g");
        for (k = 0; k < oa->nstate; k++)
            ASSERT_MEM_EQ(oa->state[k] + lo, rb->state[k], (size_t)(hi - lo) * 4);
        ASSERT_EQ(3, (int)pdp_optim_steps(rb));
        ASSERT_EQ(9, (int)b->step);

        /* a shard file: state only first (parameters untouched), then both */
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                        pdp__checkpoint_save_range(shard, b, b->param_block + lo, rb, lo, hi, "z"),
                        status_name);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                        pdp__checkpoint_load_range(shard, c, NULL, rc, lo, hi, "z"), status_name);
        ASSERT_MEM_EQ(c0, c->param_block, (size_t)n * 4);
        for (k = 0; k < oa->nstate; k++)
            ASSERT_MEM_EQ(oa->state[k] + lo, rc->state[k], (size_t)(hi - lo) * 4);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                        pdp__checkpoint_load_range(shard, c, c->param_block + lo, NULL, lo, hi,
                                                   "z"), status_name);
        ASSERT_MEM_EQ(b->param_block + lo, c->param_block + lo, (size_t)(hi - lo) * 4);
        ASSERT_MEM_EQ(c0, c->param_block, (size_t)lo * 4);

        /* refusals */
        ASSERT_ENUM_EQ(PDP_ERR_SHAPE,
                       pdp__checkpoint_load_range(shard, c, c->param_block + lo - 1, rc, lo - 1,
                                                  hi, "pdp_zero_load"), status_name);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_zero_load") != NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "the optimizer holds state for") !=
                                      NULL);
        ASSERT_ENUM_EQ(PDP_OK, pdp__optim_create_range(&other, c, &d, lo + 1, hi, "t"),
                       status_name);
        ASSERT_ENUM_EQ(PDP_ERR_SHAPE,
                       pdp__checkpoint_load_range(shard, c, c->param_block + lo + 1, other,
                                                  lo + 1, hi, "pdp_zero_load"), status_name);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "the file holds [7, ") != NULL);
        ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_checkpoint_load(shard, c, NULL), status_name);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "a shard file") != NULL);
        ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_checkpoint_save(full, b, rb), status_name);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "[7, ") != NULL);
        ASSERT_ENUM_EQ(PDP_ERR_STATE, pdp_checkpoint_load(full, b, rb), status_name);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID,
                       pdp__checkpoint_load_range(shard, c, NULL, NULL, lo, hi, "z"), status_name);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID,
                       pdp__checkpoint_save_range(shard, c, c->param_block, NULL, 0, n + 1, "z"),
                       status_name);
        free(b0);
        free(c0);
        pdp_optim_free(oa);
        pdp_optim_free(rb);
        pdp_optim_free(rc);
        pdp_optim_free(other);
        pdp_model_free(a);
        pdp_model_free(b);
        pdp_model_free(c);
    }
    PASS();
}

TEST checkpoint_round_trip_model_only(void)
{
    char path[128], path2[128];
    pdp_model *a = make_model(5, 8, 3, false, 1), *b = make_model(5, 8, 3, false, 2);
    pdp_optim *oa = NULL;
    pdp_optim_desc d = adam_desc();
    snapshot s;
    ASSERT(a && b);
    path_in_tmp(path, sizeof path, "model_only.safetensors");
    path_in_tmp(path2, sizeof path2, "with_optim.safetensors");
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path, a, NULL), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(path, b, NULL), status_name);
    snap_take(&s, a, NULL);
    ASSERT(snap_same(&s, b, NULL));
    snap_free(&s);
    /* a file with optimizer state loads into a model alone (optim.* ignored) */
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oa, a, &d), status_name);
    random_steps(a, oa, 2, 3);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path2, a, oa), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(path2, b, NULL), status_name);
    snap_take(&s, a, NULL);
    ASSERT(snap_same(&s, b, NULL));
    snap_free(&s);
    pdp_optim_free(oa);
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

/* The header: 8-byte aligned, starts with '{', names as a state_dict. */
TEST checkpoint_file_layout(void)
{
    char path[128];
    pdp_model *a = make_model(5, 8, 3, false, 1);
    pdp_optim *o = NULL;
    pdp_optim_desc d = sgd_desc();
    unsigned char *buf;
    long bytes;
    uint64_t n = 0;
    int k;
    ASSERT(a != NULL);
    path_in_tmp(path, sizeof path, "layout.safetensors");
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, a, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path, a, o), status_name);
    buf = read_all(path, &bytes);
    ASSERT(buf != NULL);
    for (k = 7; k >= 0; k--) n = n << 8 | buf[k];
    ASSERT_EQ(0, (int)(n % 8));
    ASSERT_EQ('{', buf[8]);
    buf[8 + n - 1] = '\0';
    ASSERT(strstr((char *)buf + 8, "\"0.weight\":{\"dtype\":\"F32\",\"shape\":[8,5]") != NULL);
    ASSERT(strstr((char *)buf + 8, "\"optim.2.bias.momentum_buffer\"") != NULL);
    ASSERT(strstr((char *)buf + 8, "\"optim.kind\":\"SGD\"") != NULL);
    /* data = parameters then momentum, 4 bytes each */
    ASSERT_EQ((long)(8 + n + (uint64_t)a->param_count * 8), bytes);
    ASSERT_MEM_EQ(a->param_block, buf + 8 + n, (size_t)a->param_count * 4);
    free(buf);
    pdp_optim_free(o);
    pdp_model_free(a);
    PASS();
}

/* ---- Python's safetensors ---- */

static const char *py_script =
    "import sys\n"
    "from safetensors import safe_open\n"
    "from safetensors.numpy import load_file, save_file\n"
    "src, dst = sys.argv[1], sys.argv[2]\n"
    "t = load_file(src)\n"
    "with safe_open(src, 'np') as f:\n"
    "    meta = f.metadata()\n"
    "want = {'0.weight': (8, 5), '0.bias': (8,), '2.weight': (3, 8), '2.bias': (3,)}\n"
    "for k, shape in want.items():\n"
    "    assert t[k].shape == shape and str(t[k].dtype) == 'float32', k\n"
    "    assert t['optim.' + k + '.exp_avg'].shape == shape\n"
    "assert meta['optim.kind'] == 'Adam' and meta['optim.steps'] == '3', meta\n"
    "assert len(t) == 12, sorted(t)\n"
    "save_file(t, dst, metadata=meta)\n"
    "try:\n"
    "    import torch\n"
    "    from safetensors.torch import load_file as tload\n"
    "except ImportError:\n"
    "    sys.exit(0)\n"
    "net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))\n"
    "sd = tload(src)\n"
    "net.load_state_dict({k: v for k, v in sd.items() if not k.startswith('optim.')})\n"
    "print('torch load_state_dict ok')\n";

/* Python reads our file (names, shapes, dtype, metadata) and writes it back
   with its own writer (its own tensor order and padding); we load that file and
   get our bits back. */
TEST checkpoint_python_safetensors_interop(void)
{
    char path[128], back[128], script[128], cmd[512];
    pdp_model *a = make_model(5, 8, 3, false, 1), *b = make_model(5, 8, 3, false, 2);
    pdp_optim *oa = NULL, *ob = NULL;
    pdp_optim_desc d = adam_desc();
    snapshot s;
    int rc;
    if (system("python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1") != 0) {
        pdp_model_free(a);
        pdp_model_free(b);
        SKIPm("python3 without safetensors and numpy (pip install safetensors numpy)");
    }
    ASSERT(a && b);
    path_in_tmp(path, sizeof path, "py_src.safetensors");
    path_in_tmp(back, sizeof back, "py_back.safetensors");
    path_in_tmp(script, sizeof script, "interop.py");
    ASSERT_EQ(0, write_all(script, py_script, (long)strlen(py_script)));
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oa, a, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&ob, b, &d), status_name);
    random_steps(a, oa, 3, 5);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path, a, oa), status_name);
    snprintf(cmd, sizeof cmd, "python3 %s %s %s", script, path, back);
    rc = system(cmd);
    ASSERT_EQm("the Python check failed (its traceback is above)", 0, rc);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(back, b, ob), status_name);
    snap_take(&s, a, oa);
    ASSERT(snap_same(&s, b, ob));
    snap_free(&s);
    pdp_optim_free(oa);
    pdp_optim_free(ob);
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

/* ---- broken files ---- */

typedef struct victim {
    pdp_model *m;
    pdp_optim *o;
    snapshot s;
} victim;

/* A model + Adam with some history, and its snapshot. */
static int victim_make(victim *v)
{
    pdp_optim_desc d = adam_desc();
    memset(v, 0, sizeof *v);
    v->m = make_model(5, 8, 3, false, 4);
    if (!v->m || pdp_optim_create(&v->o, v->m, &d) != PDP_OK) return -1;
    random_steps(v->m, v->o, 2, 8);
    snap_take(&v->s, v->m, v->o);
    return 0;
}

static void victim_free(victim *v)
{
    snap_free(&v->s);
    pdp_optim_free(v->o);
    pdp_model_free(v->m);
}

/* Loads path into v, expecting status and every needle in the message, then
   checks that v did not change. */
static enum greatest_test_res expect_load_fails(victim *v, const char *path, pdp_status status,
                                                const char *needle1, const char *needle2)
{
    pdp_status st = pdp_checkpoint_load(path, v->m, v->o);
    ASSERT_ENUM_EQm(pdp_last_error(), status, st, status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_checkpoint_load") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), path) != NULL);
    if (needle1) ASSERTm(pdp_last_error(), strstr(pdp_last_error(), needle1) != NULL);
    if (needle2) ASSERTm(pdp_last_error(), strstr(pdp_last_error(), needle2) != NULL);
    ASSERTm("the model or optimizer changed", snap_same(&v->s, v->m, v->o));
    PASS();
}

/* A good checkpoint of another 5-8-3 model with Adam state. */
static int good_file(const char *path)
{
    pdp_model *m = make_model(5, 8, 3, false, 9);
    pdp_optim *o = NULL;
    pdp_optim_desc d = adam_desc();
    int rc = -1;
    if (m && pdp_optim_create(&o, m, &d) == PDP_OK) {
        random_steps(m, o, 3, 10);
        rc = pdp_checkpoint_save(path, m, o) == PDP_OK ? 0 : -1;
    }
    pdp_optim_free(o);
    pdp_model_free(m);
    return rc;
}

TEST checkpoint_missing_file(void)
{
    char path[128];
    victim v;
    ASSERT_EQ(0, victim_make(&v));
    path_in_tmp(path, sizeof path, "does_not_exist.safetensors");
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_IO, "No such file", NULL));
    victim_free(&v);
    PASS();
}

TEST checkpoint_truncated_file(void)
{
    char good[128], bad[128];
    unsigned char *buf;
    long bytes, cut;
    victim v;
    ASSERT_EQ(0, victim_make(&v));
    path_in_tmp(good, sizeof good, "trunc_good.safetensors");
    path_in_tmp(bad, sizeof bad, "trunc.safetensors");
    ASSERT_EQ(0, good_file(good));
    buf = read_all(good, &bytes);
    ASSERT(buf != NULL);
    /* cut inside the data: the last tensor's range runs past the end */
    ASSERT_EQ(0, write_all(bad, buf, bytes - 10));
    CHECK_CALL(expect_load_fails(&v, bad, PDP_ERR_FORMAT, "optim.2.bias.exp_avg_sq", "truncated"));
    /* cut inside the header, and inside the length */
    for (cut = 4; cut < 300; cut += 37) {
        ASSERT_EQ(0, write_all(bad, buf, cut));
        CHECK_CALL(expect_load_fails(&v, bad, PDP_ERR_FORMAT, NULL, NULL));
    }
    ASSERT_EQ(0, write_all(bad, buf, 0));
    CHECK_CALL(expect_load_fails(&v, bad, PDP_ERR_FORMAT, "shorter than", NULL));
    free(buf);
    victim_free(&v);
    PASS();
}

TEST checkpoint_flipped_header_bytes(void)
{
    char good[128], bad[128];
    unsigned char *buf;
    char *hit;
    long bytes, i, n;
    int failures = 0;
    victim v;
    ASSERT_EQ(0, victim_make(&v));
    path_in_tmp(good, sizeof good, "flip_good.safetensors");
    path_in_tmp(bad, sizeof bad, "flip.safetensors");
    ASSERT_EQ(0, good_file(good));
    buf = read_all(good, &bytes);
    ASSERT(buf != NULL);
    n = (long)buf[0] | (long)buf[1] << 8;
    /* a structural byte: "shape":[ -> "shape":{ */
    buf[8 + n - 1] = '\0';
    hit = strstr((char *)buf + 8, "\"shape\":[");
    ASSERT(hit != NULL);
    buf[8 + n - 1] = ' ';
    hit[8] = '{';
    ASSERT_EQ(0, write_all(bad, buf, bytes));
    CHECK_CALL(expect_load_fails(&v, bad, PDP_ERR_FORMAT, "header byte", NULL));
    hit[8] = '[';
    /* every header byte with its low bit flipped: failures leave v untouched;
       successes (a flip inside a metadata value) are allowed */
    for (i = 8; i < 8 + n; i++) {
        pdp_status st;
        buf[i] ^= 1;
        ASSERT_EQ(0, write_all(bad, buf, bytes));
        st = pdp_checkpoint_load(bad, v.m, v.o);
        buf[i] ^= 1;
        if (st == PDP_OK) {
            snap_free(&v.s);
            snap_take(&v.s, v.m, v.o);
            continue;
        }
        failures++;
        ASSERTm(pdp_last_error(), st == PDP_ERR_FORMAT || st == PDP_ERR_SHAPE);
        ASSERTm(pdp_last_error(), snap_same(&v.s, v.m, v.o));
    }
    ASSERT_GT(failures, n * 9 / 10);
    free(buf);
    victim_free(&v);
    PASS();
}

TEST checkpoint_wrong_shape(void)
{
    char path[128];
    pdp_model *other = make_model(5, 9, 3, false, 1);
    victim v;
    ASSERT(other != NULL);
    ASSERT_EQ(0, victim_make(&v));
    path_in_tmp(path, sizeof path, "shape.safetensors");
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path, other, NULL), status_name);
    pdp_model_free(other);
    {
        pdp_status st = pdp_checkpoint_load(path, v.m, NULL);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_ERR_SHAPE, st, status_name);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "\"0.weight\"") != NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "[9, 5]") != NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "[8, 5]") != NULL);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), path) != NULL);
        ASSERT(snap_same(&v.s, v.m, NULL));
    }
    victim_free(&v);
    PASS();
}

TEST checkpoint_missing_and_extra_tensor(void)
{
    char small[128], big[128];
    pdp_model *one = make_model(5, 8, 0, false, 1); /* only 0.weight, 0.bias */
    pdp_model *two = make_model(5, 8, 3, false, 1);
    victim v;
    pdp_status st;
    ASSERT(one && two);
    ASSERT_EQ(0, victim_make(&v));
    path_in_tmp(small, sizeof small, "small.safetensors");
    path_in_tmp(big, sizeof big, "big.safetensors");
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(small, one, NULL), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(big, two, NULL), status_name);
    st = pdp_checkpoint_load(small, v.m, NULL);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, st, status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "\"2.weight\" is missing") != NULL);
    ASSERT(snap_same(&v.s, v.m, NULL));
    /* with the optimizer: its state is missing from a model-only file */
    CHECK_CALL(expect_load_fails(&v, big, PDP_ERR_FORMAT, "no optimizer state", NULL));
    /* a file with more layers than the model */
    {
        snapshot s1;
        snap_take(&s1, one, NULL);
        st = pdp_checkpoint_load(big, one, NULL);
        ASSERT_ENUM_EQ(PDP_ERR_SHAPE, st, status_name);
        ASSERTm(pdp_last_error(),
                strstr(pdp_last_error(), "\"2.weight\" is not in the model") != NULL);
        ASSERT(snap_same(&s1, one, NULL));
        snap_free(&s1);
    }
    pdp_model_free(one);
    pdp_model_free(two);
    victim_free(&v);
    PASS();
}

TEST checkpoint_foreign_file(void)
{
    char path[128];
    static const char text[] = "This is a text file, not a checkpoint.\nIt has two lines.\n";
    unsigned char fake[64];
    victim v;
    ASSERT_EQ(0, victim_make(&v));
    path_in_tmp(path, sizeof path, "foreign.txt");
    ASSERT_EQ(0, write_all(path, text, (long)strlen(text)));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_FORMAT, "header length", NULL));
    /* a plausible length followed by something that is not JSON */
    memset(fake, 'x', sizeof fake);
    fake[0] = 40;
    memset(fake + 1, 0, 7);
    ASSERT_EQ(0, write_all(path, fake, sizeof fake));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_FORMAT, "not a safetensors file", NULL));
    /* a directory */
    CHECK_CALL(expect_load_fails(&v, tmpdir, PDP_ERR_IO, "not a regular file", NULL));
    victim_free(&v);
    PASS();
}

TEST checkpoint_wrong_optimizer_kind(void)
{
    char path[128];
    pdp_model *m = make_model(5, 8, 3, false, 4);
    pdp_optim *sgd = NULL;
    pdp_optim_desc d = sgd_desc();
    snapshot s;
    pdp_status st;
    ASSERT(m != NULL);
    path_in_tmp(path, sizeof path, "kind.safetensors");
    ASSERT_EQ(0, good_file(path)); /* Adam */
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&sgd, m, &d), status_name);
    snap_take(&s, m, sgd);
    st = pdp_checkpoint_load(path, m, sgd);
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, st, status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "holds Adam state, the optimizer is SGD"));
    ASSERT(snap_same(&s, m, sgd));
    snap_free(&s);
    pdp_optim_free(sgd);
    pdp_model_free(m);
    PASS();
}

/* ---- interrupted save ---- */

static int tmp_files_left(const char *prefix)
{
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    int n = 0;
    if (!d) return -1;
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

TEST checkpoint_failed_save_keeps_previous_file(void)
{
    char path[128], nodir[160];
    pdp_model *m = make_model(5, 8, 3, false, 1);
    pdp_optim *o = NULL;
    pdp_optim_desc d = adam_desc();
    unsigned char *before, *after;
    long nb, na;
    struct rlimit old, small;
    pdp_status st;
    ASSERT(m != NULL);
    path_in_tmp(path, sizeof path, "keep.safetensors");
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path, m, o), status_name);
    before = read_all(path, &nb);
    ASSERT(before != NULL && nb > 600);
    random_steps(m, o, 2, 77); /* the next save would write different bytes */

    /* the write of the temporary fails half-way (file size limit: EFBIG) */
    ASSERT_EQ(0, getrlimit(RLIMIT_FSIZE, &old));
    small = old;
    small.rlim_cur = 500;
    signal(SIGXFSZ, SIG_IGN);
    ASSERT_EQ(0, setrlimit(RLIMIT_FSIZE, &small));
    st = pdp_checkpoint_save(path, m, o);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_ERR_IO, st, status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "pdp_checkpoint_save") != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), path) != NULL);
    after = read_all(path, &na);
    ASSERT(after != NULL);
    ASSERT_EQ(nb, na);
    ASSERT_MEM_EQ(before, after, (size_t)nb);
    ASSERT_EQm("the temporary file was left behind", 0, tmp_files_left("keep.safetensors"));
    free(after);

    /* a directory that does not exist */
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.safetensors", tmpdir);
    st = pdp_checkpoint_save(nodir, m, o);
    ASSERT_ENUM_EQ(PDP_ERR_IO, st, status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), nodir) != NULL);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "fopen") != NULL);

    /* and the previous checkpoint still loads */
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, m, o), status_name);
    ASSERT_EQ(0, (int)pdp_optim_steps(o));
    free(before);
    pdp_optim_free(o);
    pdp_model_free(m);
    PASS();
}

/* ---- exact resume across processes ---- */

#define RS_N 48      /* samples */
#define RS_IN 5
#define RS_CLASSES 3
#define RS_BATCH 8

static float rs_x[RS_N * RS_IN];
static int32_t rs_y[RS_N];

static void rs_data(void)
{
    pdp_rng r;
    int i, j;
    pdp_rng_seed(&r, 2024, 0);
    for (i = 0; i < RS_N; i++) {
        float s = 0.0f;
        for (j = 0; j < RS_IN; j++) {
            rs_x[i * RS_IN + j] = pdp_rng_normal(&r);
            s += rs_x[i * RS_IN + j] * (float)(j - 2);
        }
        rs_y[i] = s > 1.0f ? 2 : s > -1.0f ? 1 : 0;
    }
}

/* One epoch: the order is a shuffle seeded by the epoch number alone, so any
   process computes it. */
static pdp_status rs_epoch(pdp_model *m, pdp_optim *o, int epoch)
{
    int order[RS_N], i, j, b;
    float xb[RS_BATCH * RS_IN], loss;
    int32_t yb[RS_BATCH];
    int64_t shape[2] = {RS_BATCH, RS_IN};
    pdp_tensor x;
    pdp_rng r;
    pdp_status st;
    pdp_rng_seed(&r, 77, (uint64_t)epoch);
    for (i = 0; i < RS_N; i++) order[i] = i;
    for (i = RS_N - 1; i > 0; i--) {
        int k = (int)pdp_rng_below(&r, (uint32_t)(i + 1)), t = order[i];
        order[i] = order[k];
        order[k] = t;
    }
    pdp_tensor_wrap(xb, pdp_cpu(), 2, shape, &x);
    for (b = 0; b < RS_N / RS_BATCH; b++) {
        for (i = 0; i < RS_BATCH; i++) {
            int s = order[b * RS_BATCH + i];
            for (j = 0; j < RS_IN; j++) xb[i * RS_IN + j] = rs_x[s * RS_IN + j];
            yb[i] = rs_y[s];
        }
        pdp_optim_set_lr(o, pdp_lr_warmup_cosine(pdp_optim_steps(o), 3, 12, 0.05f, 0.005f));
        if ((st = pdp_model_forward_backward(m, &x, yb, &loss)) != PDP_OK) return st;
        if ((st = pdp_clip_grad_norm(m, 1.0f, NULL)) != PDP_OK) return st;
        if ((st = pdp_optim_step(o)) != PDP_OK) return st;
        pdp_optim_zero_grad(o);
    }
    return PDP_OK;
}

static pdp_optim_desc rs_desc(const char *kind)
{
    return strcmp(kind, "adam") == 0 ? adam_desc() : sgd_desc();
}

/* The fresh process: a model with another seed, an optimizer with default
   hyper-parameters, load, epoch 1, save. Exit status 0 on success. */
static int resume_child(const char *kind, const char *in, const char *out)
{
    pdp_model *m = make_model(RS_IN, 16, RS_CLASSES, true, 999);
    pdp_optim *o = NULL;
    pdp_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = rs_desc(kind).kind;
    d.momentum = d.kind == PDP_OPTIM_SGD ? 0.1f : 0.0f; /* restored from the file */
    rs_data();
    if (!m || pdp_optim_create(&o, m, &d) != PDP_OK) return 2;
    if (pdp_checkpoint_load(in, m, o) != PDP_OK || rs_epoch(m, o, 1) != PDP_OK ||
        pdp_checkpoint_save(out, m, o) != PDP_OK) {
        fprintf(stderr, "resume child: %s\n", pdp_last_error());
        return 1;
    }
    pdp_optim_free(o);
    pdp_model_free(m);
    return 0;
}

static enum greatest_test_res resume_case(const char *kind)
{
    char mid[128], end[128];
    pdp_model *straight = make_model(RS_IN, 16, RS_CLASSES, true, 1);
    pdp_model *first = make_model(RS_IN, 16, RS_CLASSES, true, 1);
    pdp_model *fin = make_model(RS_IN, 16, RS_CLASSES, true, 5);
    pdp_optim *os = NULL, *of = NULL, *ofin = NULL;
    pdp_optim_desc d = rs_desc(kind);
    snapshot s;
    pid_t pid;
    int status = -1;
    ASSERT(straight && first && fin);
    rs_data();
    snprintf(mid, sizeof mid, "%s/resume_%s_mid.safetensors", tmpdir, kind);
    snprintf(end, sizeof end, "%s/resume_%s_end.safetensors", tmpdir, kind);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&os, straight, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&of, first, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&ofin, fin, &d), status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, rs_epoch(straight, os, 0), status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, rs_epoch(straight, os, 1), status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, rs_epoch(first, of, 0), status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_save(mid, first, of), status_name);

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        execl("/proc/self/exe", "test_checkpoint", "resume-child", kind, mid, end, (char *)NULL);
        _exit(127);
    }
    ASSERT_EQ(pid, waitpid(pid, &status, 0));
    ASSERTm("the resumed process failed", WIFEXITED(status) && WEXITSTATUS(status) == 0);

    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(end, fin, ofin), status_name);
    snap_take(&s, straight, os);
    ASSERT_EQ(12, (int)pdp_optim_steps(ofin));
    ASSERTm("resumed training differs from straight training", snap_same(&s, fin, ofin));
    /* and the check can fail: one more step breaks it */
    ASSERT_ENUM_EQ(PDP_OK, rs_epoch(fin, ofin, 2), status_name);
    ASSERT_FALSE(snap_same(&s, fin, ofin));
    snap_free(&s);
    pdp_optim_free(os);
    pdp_optim_free(of);
    pdp_optim_free(ofin);
    pdp_model_free(straight);
    pdp_model_free(first);
    pdp_model_free(fin);
    PASS();
}

TEST checkpoint_exact_resume_adam_fresh_process(void) { return resume_case("adam"); }
TEST checkpoint_exact_resume_sgd_momentum_fresh_process(void) { return resume_case("sgd"); }

/* ---- CUDA ---- */

static bool have_cuda(void)
{
    int n = 0;
    return pdp_cuda_device_count(&n) == PDP_OK && n > 0;
}

/* A model and Adam state on the GPU: saved through host staging, loaded into a
   CPU model (same bits), and a CPU file loaded into a GPU model (same bits); a
   broken file leaves the GPU model untouched. */
TEST checkpoint_cuda_round_trip(void)
{
    char path[128], bad[128];
    pdp_model_desc md;
    pdp_model *gpu = NULL, *cpu = make_model(5, 8, 3, false, 2), *gpu2 = NULL;
    pdp_optim *og = NULL, *oc = NULL, *og2 = NULL;
    pdp_optim_desc d = adam_desc();
    pdp_tensor pg, gg, pg2;
    float *grads, *back;
    pdp_rng r;
    int64_t i, n;
    int step;
    if (!have_cuda()) {
        pdp_model_free(cpu);
        SKIP_NO_CUDA();
    }
    ASSERT(cpu != NULL);
    memset(&md, 0, sizeof md);
    md.input_shape[0] = 5;
    md.device = pdp_cuda(0);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_create(&gpu, &md), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(gpu, 8), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(gpu), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(gpu, 3), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_create(&gpu2, &md), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(gpu2, 8), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_relu(gpu2), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_add_linear(gpu2, 3), status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_optim_create(&og, gpu, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&og2, gpu2, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oc, cpu, &d), status_name);
    pdp_model_flat(gpu, &pg, &gg);
    pdp_model_flat(gpu2, &pg2, NULL);
    n = pg.count;
    grads = (float *)malloc((size_t)n * 4);
    back = (float *)malloc((size_t)n * 4);
    ASSERT(grads && back);
    pdp_rng_seed(&r, 4, 4);
    for (step = 0; step < 3; step++) {
        for (i = 0; i < n; i++) grads[i] = pdp_rng_normal(&r);
        ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(&gg, grads), status_name);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_optim_step(og), status_name);
    }
    path_in_tmp(path, sizeof path, "cuda.safetensors");
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_save(path, gpu, og), status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, cpu, oc), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(&pg, back), status_name);
    ASSERT_MEM_EQ(back, cpu->param_block, (size_t)n * 4);
    ASSERT_EQ(3, (int)pdp_optim_steps(oc));
    /* a broken file leaves the GPU model as it was */
    path_in_tmp(bad, sizeof bad, "cuda_bad.safetensors");
    ASSERT_EQ(0, write_all(bad, "not a checkpoint at all", 23));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_checkpoint_load(bad, gpu, og), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(&pg, grads), status_name);
    ASSERT_MEM_EQ(back, grads, (size_t)n * 4);
    /* the CPU model's file into a fresh GPU model */
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path, cpu, oc), status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, gpu2, og2), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(&pg2, grads), status_name);
    ASSERT_MEM_EQ(back, grads, (size_t)n * 4);
    ASSERT_EQ(3, (int)pdp_optim_steps(og2));
    free(grads);
    free(back);
    pdp_optim_free(og);
    pdp_optim_free(og2);
    pdp_optim_free(oc);
    pdp_model_free(gpu);
    pdp_model_free(gpu2);
    pdp_model_free(cpu);
    PASS();
}

SUITE(checkpoint)
{
    RUN_TEST(checkpoint_round_trip_with_optimizer);
    RUN_TEST(checkpoint_round_trip_model_only);
    RUN_TEST(checkpoint_range_save_and_load);
    RUN_TEST(checkpoint_file_layout);
    RUN_TEST(checkpoint_python_safetensors_interop);
    RUN_TEST(checkpoint_missing_file);
    RUN_TEST(checkpoint_truncated_file);
    RUN_TEST(checkpoint_flipped_header_bytes);
    RUN_TEST(checkpoint_wrong_shape);
    RUN_TEST(checkpoint_missing_and_extra_tensor);
    RUN_TEST(checkpoint_foreign_file);
    RUN_TEST(checkpoint_wrong_optimizer_kind);
    RUN_TEST(checkpoint_failed_save_keeps_previous_file);
    RUN_TEST(checkpoint_exact_resume_adam_fresh_process);
    RUN_TEST(checkpoint_exact_resume_sgd_momentum_fresh_process);
    RUN_TEST(checkpoint_cuda_round_trip);
}

GREATEST_MAIN_DEFS();

static void remove_tmpdir(void)
{
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    char path[512];
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", tmpdir, e->d_name);
        remove(path);
    }
    closedir(d);
    rmdir(tmpdir);
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "resume-child") == 0)
        return resume_child(argv[2], argv[3], argv[4]);
    strcpy(tmpdir, "/tmp/pdp_ckpt_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    {
        GREATEST_MAIN_BEGIN();
        RUN_SUITE(checkpoint);
        remove_tmpdir();
        GREATEST_MAIN_END();
    }
}
