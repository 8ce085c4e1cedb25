/* test_checkpoint: safetensors save/load. Round trips (model, optimizer state,
   step count, hyper-parameters), Python's safetensors reading our files and
   writing files we read back, every broken-file path (missing, truncated,
   flipped header bytes, wrong shape, missing or extra tensor, foreign file,
   wrong optimizer) failing with the right status and message and leaving the
   model and optimizer bit-identical, an interrupted save leaving the previous
   checkpoint intact, and exact resume across processes: 1 epoch, save, load in
   a fresh process (this binary re-executed), 1 more epoch == 2 epochs straight,
   bit for bit, with Adam or SGD momentum state and dropout in the model. A GPT:
   tools/gpt_reference.py's nanoGPT files load with no renaming (parameters bit for bit,
   PyTorch's logits and loss), the tied head's alias lm_head.weight and the attn.bias
   causal masks are checked (an alias one ulp off or a wrong mask element is refused),
   pdp's file holds the tied head once and PyTorch's GPT loads it strictly. */

#define _POSIX_C_SOURCE 200809L /* before the first system header: mkdtemp, fork, setrlimit */
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#ifdef _WIN32
#  include <direct.h>
#else
#  include <sys/resource.h>
#  include <sys/wait.h>
#endif

#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"
#include "fixture.h"
#include "child_process.h"

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
    if (buf) buf[n] = 0; /* string searches stop at the end */
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
        if (d.kind == PDP_OPTIM_ADAMW) d.decay_params = PDP_DECAY_MATRICES; /* restored too */
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
    "import numpy as np\n"
    "from safetensors import safe_open\n"
    "from safetensors.numpy import load_file, save_file\n"
    "src, dst, nosum, stale, nohead = sys.argv[1:6]\n"
    "t = load_file(src)\n"
    "with safe_open(src, 'np') as f:\n"
    "    meta = f.metadata()\n"
    "want = {'0.weight': (8, 5), '0.bias': (8,), '2.weight': (3, 8), '2.bias': (3,)}\n"
    "for k, shape in want.items():\n"
    "    assert t[k].shape == shape and str(t[k].dtype) == 'float32', k\n"
    "    assert t['optim.' + k + '.exp_avg'].shape == shape\n"
    "assert meta['optim.kind'] == 'Adam' and meta['optim.steps'] == '3', meta\n"
    "assert len(t) == 12, sorted(t)\n"
    "def crc32c(data, crc=0):\n"
    "    crc ^= 0xffffffff\n"
    "    for b in data:\n"
    "        crc ^= b\n"
    "        for _ in range(8):\n"
    "            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)\n"
    "    return crc ^ 0xffffffff\n"
    "assert crc32c(b'123456789') == 0xe3069283\n"
    "# the checksums, recomputed from their definition (checkpoint.h, checkpoint.c)\n"
    "for k, v in t.items():\n"
    "    assert meta['crc32c.' + k] == '%08x' % crc32c(v.astype('<f4').tobytes()), k\n"
    "assert sorted(k for k in meta if k.startswith('crc32c.')) == \\\n"
    "    sorted(['crc32c.header'] + ['crc32c.' + k for k in t])\n"
    "canon = b''\n"
    "for k in sorted(k for k in meta if k != 'crc32c.header'):\n"
    "    canon += k.encode() + b'\\0' + meta[k].encode() + b'\\0'\n"
    "for k in sorted(t):\n"
    "    canon += k.encode() + b'\\0F32\\0' + b''.join(b'%d,' % d for d in t[k].shape) + b'\\0'\n"
    "assert meta['crc32c.header'] == '%08x' % crc32c(canon), 'header checksum'\n"
    "# rewritten by Python with our metadata: still verifies\n"
    "save_file(t, dst, metadata=meta)\n"
    "# another tool's file: no checksums, loads unverified\n"
    "save_file(t, nosum, metadata={k: v for k, v in meta.items() if not k.startswith('crc32c.')})\n"
    "# a tensor changed, the old checksums kept: refused, naming the tensor\n"
    "t2 = dict(t)\n"
    "t2['2.bias'] = t['2.bias'] + np.float32(1)\n"
    "save_file(t2, stale, metadata=meta)\n"
    "# tensor checksums without the header's: refused\n"
    "save_file(t, nohead, metadata={k: v for k, v in meta.items() if k != 'crc32c.header'})\n"
    "try:\n"
    "    import torch\n"
    "    from safetensors.torch import load_file as tload\n"
    "except ImportError:\n"
    "    print('torch not installed: its load_state_dict not checked')\n"
    "    sys.exit(0)\n"
    "net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))\n"
    "sd = tload(src)\n"
    "net.load_state_dict({k: v for k, v in sd.items() if not k.startswith('optim.')})\n"
    "print('torch load_state_dict ok')\n";

/* Python reads our file (names, shapes, dtype, metadata, and the checksums
   recomputed from their definition) and writes it back with its own writer
   (its own tensor order and padding); we load that file and get our bits
   back. Files Python writes without our checksums load; with a stale tensor
   checksum or without the header checksum they are refused, the model
   untouched. */
TEST checkpoint_python_safetensors_interop(void)
{
    char path[128], back[128], nosum[128], stale[128], nohead[128], script[128], cmd[1024];
    pdp_model *a = make_model(5, 8, 3, false, 1), *b = make_model(5, 8, 3, false, 2);
    pdp_optim *oa = NULL, *ob = NULL;
    pdp_optim_desc d = adam_desc();
    snapshot s;
    int rc;
    const char *py = pdp_test_python("safetensors.numpy, numpy");
    if (!py) {
        pdp_model_free(a);
        pdp_model_free(b);
        SKIPm(pdp_test_python_missing("safetensors.numpy, numpy"));
    }
    ASSERT(a && b);
    path_in_tmp(path, sizeof path, "py_src.safetensors");
    path_in_tmp(back, sizeof back, "py_back.safetensors");
    path_in_tmp(nosum, sizeof nosum, "py_nosum.safetensors");
    path_in_tmp(stale, sizeof stale, "py_stale.safetensors");
    path_in_tmp(nohead, sizeof nohead, "py_nohead.safetensors");
    path_in_tmp(script, sizeof script, "interop.py");
    ASSERT_EQ(0, write_all(script, py_script, (long)strlen(py_script)));
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oa, a, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&ob, b, &d), status_name);
    random_steps(a, oa, 3, 5);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path, a, oa), status_name);
    snprintf(cmd, sizeof cmd, "\"%s\" %s %s %s %s %s %s", py, script, path, back, nosum, stale,
             nohead);
    rc = system(cmd);
    ASSERT_EQm("the Python check failed (its traceback is above)", 0, rc);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(back, b, ob), status_name);
    snap_take(&s, a, oa);
    ASSERT(snap_same(&s, b, ob));
    /* refused files leave b as it is */
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_checkpoint_load(stale, b, ob), status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "tensor \"2.bias\" is corrupt") != NULL);
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_checkpoint_load(nohead, b, ob), status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "no \"crc32c.header\"") != NULL);
    ASSERT(snap_same(&s, b, ob));
    snap_free(&s);
    /* no checksums: loads (into a fresh model), bit for bit */
    pdp_optim_free(ob);
    pdp_model_free(b);
    b = make_model(5, 8, 3, false, 3);
    ob = NULL;
    ASSERT(b != NULL);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&ob, b, &d), status_name);
    snap_take(&s, a, oa);
    ASSERT_FALSE(snap_same(&s, b, ob));
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(nosum, b, ob), status_name);
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
    char prefix[256];
    snprintf(prefix, sizeof prefix, "pdp_checkpoint_load: %s: ", path);
    ASSERT_ENUM_EQm(pdp_last_error(), status, st, status_name);
    ASSERTm(pdp_last_error(), strncmp(pdp_last_error(), prefix, strlen(prefix)) == 0);
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
    /* every header byte with its low bit flipped fails (the header checksum
       catches a flip inside a metadata value) and leaves v untouched */
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
    ASSERT_EQ(n, (long)failures);
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
    { /* an optimizer of another model of the same size: its moments are not m's */
        pdp_model *twin = make_model(5, 8, 3, false, 5);
        pdp_optim *other = NULL;
        ASSERT(twin != NULL);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&other, twin, &d), status_name);
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_checkpoint_save(path, m, other), status_name);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "created on another model"));
        ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_checkpoint_load(path, m, other), status_name);
        pdp_optim_free(other);
        pdp_model_free(twin);
    }
    pdp_optim_free(sgd);
    pdp_model_free(m);
    PASS();
}

/* ---- checksums ---- */

/* CRC-32C bit by bit: the definition itself. */
static uint32_t crc32c_ref(const unsigned char *p, size_t n)
{
    uint32_t crc = 0xffffffffu;
    int k;
    while (n--) {
        crc ^= *p++;
        for (k = 0; k < 8; k++) crc = (crc >> 1) ^ (crc & 1u ? 0x82F63B78u : 0u);
    }
    return ~crc;
}

static uint64_t header_len(const unsigned char *buf)
{
    uint64_t n = 0;
    int k;
    for (k = 7; k >= 0; k--) n = n << 8 | buf[k];
    return n;
}

/* The file offset of the first byte of needle inside the header of buf; -1 if absent. */
static long header_find(const unsigned char *buf, const char *needle)
{
    long n = (long)header_len(buf), len = (long)strlen(needle), i;
    for (i = 8; i + len <= 8 + n; i++)
        if (memcmp(buf + i, needle, (size_t)len) == 0) return i;
    return -1;
}

/* The file offsets [*begin, *end) of tensor name's data; 0 on success. */
static int tensor_bytes(const unsigned char *buf, const char *name, long *begin, long *end)
{
    char needle[128];
    unsigned long long b, e;
    long at;
    snprintf(needle, sizeof needle, "\"%s\":{", name);
    if ((at = header_find(buf, needle)) < 0) return -1;
    {
        const char *s = strstr((const char *)buf + at, "\"data_offsets\":[");
        if (!s || sscanf(s, "\"data_offsets\":[%llu,%llu]", &b, &e) != 2) return -1;
    }
    *begin = 8 + (long)header_len(buf) + (long)b;
    *end = 8 + (long)header_len(buf) + (long)e;
    return 0;
}

static const char *const all_tensors[] = {
    "0.weight", "0.bias", "2.weight", "2.bias",
    "optim.0.weight.exp_avg", "optim.0.bias.exp_avg", "optim.2.weight.exp_avg",
    "optim.2.bias.exp_avg", "optim.0.weight.exp_avg_sq", "optim.0.bias.exp_avg_sq",
    "optim.2.weight.exp_avg_sq", "optim.2.bias.exp_avg_sq"};

TEST checkpoint_crc32c_matches_definition(void)
{
    pdp__crc32c *c = (pdp__crc32c *)malloc(sizeof *c);
    unsigned char buf[80];
    size_t n, off, split;
    pdp_rng r;
    ASSERT(c != NULL);
    pdp__crc32c_init(c);
    ASSERT_EQ_FMT(0xe3069283u, (unsigned)pdp__crc32c_update(c, 0, "123456789", 9), "%08x");
    ASSERT_EQ_FMT(0u, (unsigned)pdp__crc32c_update(c, 0, "", 0), "%08x");
    pdp_rng_seed(&r, 3, 3);
    for (n = 0; n < sizeof buf; n++) buf[n] = (unsigned char)pdp_rng_below(&r, 256);
    for (n = 0; n + 8 <= sizeof buf; n++)
        for (off = 0; off < 8; off++) {
            uint32_t want = crc32c_ref(buf + off, n);
            split = n / 3;
            ASSERT_EQ_FMT((unsigned)want, (unsigned)pdp__crc32c_update(c, 0, buf + off, n),
                          "%08x");
            ASSERT_EQ_FMT((unsigned)want,
                          (unsigned)pdp__crc32c_update(
                              c, pdp__crc32c_update(c, 0, buf + off, split), buf + off + split,
                              n - split), "%08x");
        }
    free(c);
    PASS();
}

/* Our file carries "crc32c.header" and one "crc32c.<tensor>" per tensor,
   each the CRC-32C of the tensor's bytes in the file. */
TEST checkpoint_checksums_in_metadata(void)
{
    char path[128], needle[128];
    unsigned char *buf;
    long bytes, b, e, at;
    size_t t;
    unsigned x;
    path_in_tmp(path, sizeof path, "sums.safetensors");
    ASSERT_EQ(0, good_file(path));
    buf = read_all(path, &bytes);
    ASSERT(buf != NULL);
    ASSERT(header_find(buf, "\"crc32c.header\":\"") > 0);
    for (t = 0; t < sizeof all_tensors / sizeof all_tensors[0]; t++) {
        ASSERT_EQ(0, tensor_bytes(buf, all_tensors[t], &b, &e));
        snprintf(needle, sizeof needle, "\"crc32c.%s\":\"", all_tensors[t]);
        at = header_find(buf, needle);
        ASSERTm(needle, at > 0);
        ASSERT_EQ(1, sscanf((const char *)buf + at + strlen(needle), "%8x", &x));
        ASSERT_EQ_FMTm(all_tensors[t], (unsigned)crc32c_ref(buf + b, (size_t)(e - b)), x, "%08x");
    }
    free(buf);
    PASS();
}

/* One byte flipped in the data of each tensor: refused, naming the tensor. */
TEST checkpoint_flipped_tensor_bytes(void)
{
    char good[128], bad[128], want[128];
    unsigned char *buf;
    long bytes, b, e;
    size_t t;
    victim v;
    ASSERT_EQ(0, victim_make(&v));
    path_in_tmp(good, sizeof good, "tflip_good.safetensors");
    path_in_tmp(bad, sizeof bad, "tflip.safetensors");
    ASSERT_EQ(0, good_file(good));
    buf = read_all(good, &bytes);
    ASSERT(buf != NULL);
    for (t = 0; t < sizeof all_tensors / sizeof all_tensors[0]; t++) {
        long at;
        ASSERT_EQ(0, tensor_bytes(buf, all_tensors[t], &b, &e));
        at = b + (e - b) / 2 + (long)t % 4; /* any byte of a float, the sign and exponent too */
        buf[at] ^= (unsigned char)(1u << (t % 8));
        ASSERT_EQ(0, write_all(bad, buf, bytes));
        buf[at] ^= (unsigned char)(1u << (t % 8));
        snprintf(want, sizeof want, "tensor \"%s\" is corrupt", all_tensors[t]);
        CHECK_CALL(expect_load_fails(&v, bad, PDP_ERR_FORMAT, want, "checksum"));
    }
    /* the last byte of the file */
    buf[bytes - 1] ^= 0x80;
    ASSERT_EQ(0, write_all(bad, buf, bytes));
    CHECK_CALL(expect_load_fails(&v, bad, PDP_ERR_FORMAT,
                                 "tensor \"optim.2.bias.exp_avg_sq\" is corrupt", NULL));
    free(buf);
    victim_free(&v);
    PASS();
}

/* The checksums themselves corrupted: a digit of a tensor's or of the
   header's, a key's name, a digit's case: refused, naming the header. */
TEST checkpoint_flipped_checksum_metadata(void)
{
    static const char *const keys[] = {"\"crc32c.0.bias\":\"", "\"crc32c.header\":\"",
                                       "\"crc32c.optim.2.weight.exp_avg_sq\":\""};
    char good[128], bad[128];
    unsigned char *buf;
    long bytes, at;
    size_t k;
    int d;
    victim v;
    ASSERT_EQ(0, victim_make(&v));
    path_in_tmp(good, sizeof good, "sflip_good.safetensors");
    path_in_tmp(bad, sizeof bad, "sflip.safetensors");
    ASSERT_EQ(0, good_file(good));
    buf = read_all(good, &bytes);
    ASSERT(buf != NULL);
    for (k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        at = header_find(buf, keys[k]);
        ASSERT(at > 0);
        at += (long)strlen(keys[k]);
        for (d = 0; d < 8; d++) { /* each digit to another valid digit */
            unsigned char was = buf[at + d];
            buf[at + d] = (unsigned char)(was == '0' ? '1' : '0');
            ASSERT_EQ(0, write_all(bad, buf, bytes));
            buf[at + d] = was;
            CHECK_CALL(expect_load_fails(&v, bad, PDP_ERR_FORMAT, "the header is corrupt",
                                         "checksum"));
        }
        /* a digit's case: 8 lowercase digits, or corrupt */
        for (d = 0; d < 8 && !(buf[at + d] >= 'a' && buf[at + d] <= 'f'); d++) continue;
        if (d < 8) {
            buf[at + d] ^= 0x20;
            ASSERT_EQ(0, write_all(bad, buf, bytes));
            buf[at + d] ^= 0x20;
            CHECK_CALL(expect_load_fails(&v, bad, PDP_ERR_FORMAT, "header", NULL));
        }
        /* the key's name (its last letter, before "\":\"") */
        at -= 4;
        buf[at] ^= 1;
        ASSERT_EQ(0, write_all(bad, buf, bytes));
        buf[at] ^= 1;
        CHECK_CALL(expect_load_fails(&v, bad, PDP_ERR_FORMAT, "header is corrupt", NULL));
    }
    free(buf);
    victim_free(&v);
    PASS();
}

static bool json_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static double now_seconds(void) { return pdp_seconds(); }

/* Random single-byte corruptions anywhere in the file (at most 20,000, at most
   about 5 seconds): each either loads bit-identical data (only possible when
   header whitespace became other whitespace) or fails with PDP_ERR_FORMAT or
   PDP_ERR_SHAPE, its message starting with pdp_checkpoint_load, the model and
   optimizer untouched. Every flip in the data fails. */
TEST checkpoint_fuzz_random_byte_flips(void)
{
    char good[128], bad[128], prefix[256];
    unsigned char *buf;
    long bytes, hend, i, loaded = 0, failed = 0;
    double t0 = now_seconds();
    FILE *f;
    pdp_rng r;
    victim v;
    ASSERT_EQ(0, victim_make(&v));
    path_in_tmp(good, sizeof good, "fuzz_good.safetensors");
    path_in_tmp(bad, sizeof bad, "fuzz.safetensors");
    snprintf(prefix, sizeof prefix, "pdp_checkpoint_load: %s: ", bad);
    ASSERT_EQ(0, good_file(good));
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_load(good, v.m, v.o), status_name);
    snap_free(&v.s);
    snap_take(&v.s, v.m, v.o);
    buf = read_all(good, &bytes);
    ASSERT(buf != NULL);
    hend = 8 + (long)header_len(buf);
    ASSERT_EQ(0, write_all(bad, buf, bytes));
    f = fopen(bad, "r+b");
    ASSERT(f != NULL);
    pdp_rng_seed(&r, 20000, 1);
    for (i = 0; i < 20000 && now_seconds() - t0 < 5.0; i++) {
        long at = (long)pdp_rng_below(&r, (uint32_t)bytes);
        unsigned char x = (unsigned char)(1 + pdp_rng_below(&r, 255)), was = buf[at];
        pdp_status st;
        ASSERT(fseek(f, at, SEEK_SET) == 0 && fputc(was ^ x, f) != EOF && fflush(f) == 0);
        st = pdp_checkpoint_load(bad, v.m, v.o);
        ASSERT(fseek(f, at, SEEK_SET) == 0 && fputc(was, f) != EOF && fflush(f) == 0);
        ASSERTm("the model or optimizer changed", snap_same(&v.s, v.m, v.o));
        if (st == PDP_OK) {
            loaded++;
            ASSERTm("a flip other than whitespace to whitespace loaded",
                    at >= 8 && at < hend && json_space(was) && json_space(was ^ x));
            continue;
        }
        failed++;
        ASSERTm(pdp_last_error(), st == PDP_ERR_FORMAT || st == PDP_ERR_SHAPE);
        ASSERTm(pdp_last_error(), strncmp(pdp_last_error(), prefix, strlen(prefix)) == 0);
        if (at >= hend) ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "is corrupt"));
    }
    fclose(f);
    ASSERT_GT(i, 200);
    printf("    fuzz: %ld single-byte flips in %.1f s: %ld failed cleanly, %ld loaded "
           "bit-identical data\n", i, now_seconds() - t0, failed, loaded);
    free(buf);
    victim_free(&v);
    PASS();
}

/* Shard files and slices of full files are verified too: a slice reads the
   tensors it touches whole. */
TEST checkpoint_range_files_checksummed(void)
{
    char full[128], shard[128], bad[128];
    pdp_model *a = make_model(5, 9, 3, false, 1), *b = make_model(5, 9, 3, false, 2);
    pdp_optim *oa = NULL, *rb = NULL;
    pdp_optim_desc d = adam_desc();
    unsigned char *buf;
    long bytes, tb, te;
    int64_t lo = 7, hi = 20, n;
    float *b0;
    ASSERT(a && b);
    n = b->param_count;
    path_in_tmp(full, sizeof full, "rsum_full.safetensors");
    path_in_tmp(shard, sizeof shard, "rsum_shard.safetensors");
    path_in_tmp(bad, sizeof bad, "rsum_bad.safetensors");
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&oa, a, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp__optim_create_range(&rb, b, &d, lo, hi, "t"), status_name);
    random_steps(a, oa, 2, 5);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(full, a, oa), status_name);
    b0 = (float *)malloc((size_t)n * 4);
    ASSERT(b0 != NULL);
    memcpy(b0, b->param_block, (size_t)n * 4);

    /* a full file: a flip in 0.weight outside [7, 20) still fails the slice */
    buf = read_all(full, &bytes);
    ASSERT(buf != NULL);
    ASSERT_EQ(0, tensor_bytes(buf, "0.weight", &tb, &te));
    buf[tb + 4 * 30] ^= 1; /* element 30 */
    ASSERT_EQ(0, write_all(bad, buf, bytes));
    buf[tb + 4 * 30] ^= 1;
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT,
                   pdp__checkpoint_load_range(bad, b, b->param_block + lo, rb, lo, hi, "z"),
                   status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "tensor \"0.weight\" is corrupt"));
    ASSERT_MEM_EQ(b0, b->param_block, (size_t)n * 4);
    /* a tensor the slice does not touch is not read, so not verified (its owner verifies it) */
    ASSERT_EQ(0, tensor_bytes(buf, "2.bias", &tb, &te));
    buf[tb] ^= 1;
    ASSERT_EQ(0, write_all(bad, buf, bytes));
    buf[tb] ^= 1;
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK,
                    pdp__checkpoint_load_range(bad, b, b->param_block + lo, rb, lo, hi, "z"),
                    status_name);
    ASSERT_MEM_EQ(a->param_block + lo, b->param_block + lo, (size_t)(hi - lo) * 4);
    free(buf);

    /* a shard file */
    ASSERT_ENUM_EQ(PDP_OK, pdp__checkpoint_save_range(shard, b, b->param_block + lo, rb, lo, hi,
                                                      "z"), status_name);
    buf = read_all(shard, &bytes);
    ASSERT(buf != NULL);
    ASSERT(header_find(buf, "\"crc32c.header\":\"") > 0);
    ASSERT(header_find(buf, "\"crc32c.params\":\"") > 0);
    ASSERT(header_find(buf, "\"crc32c.optim.exp_avg_sq\":\"") > 0);
    memcpy(b0, b->param_block, (size_t)n * 4);
    ASSERT_EQ(0, tensor_bytes(buf, "params", &tb, &te));
    buf[tb + 5] ^= 4;
    ASSERT_EQ(0, write_all(bad, buf, bytes));
    buf[tb + 5] ^= 4;
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT,
                   pdp__checkpoint_load_range(bad, b, b->param_block + lo, rb, lo, hi,
                                              "pdp_zero_load"), status_name);
    ASSERTm(pdp_last_error(), strncmp(pdp_last_error(), "pdp_zero_load: ", 15) == 0);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "tensor \"params\" is corrupt"));
    ASSERT_EQ(0, tensor_bytes(buf, "optim.exp_avg", &tb, &te));
    buf[te - 1] ^= 0x40;
    ASSERT_EQ(0, write_all(bad, buf, bytes));
    buf[te - 1] ^= 0x40;
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT,
                   pdp__checkpoint_load_range(bad, b, NULL, rb, lo, hi, "z"), status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "tensor \"optim.exp_avg\" is corrupt"));
    ASSERT_MEM_EQ(b0, b->param_block, (size_t)n * 4);
    /* the header */
    buf[8 + 20] ^= 1;
    ASSERT_EQ(0, write_all(bad, buf, bytes));
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT,
                   pdp__checkpoint_load_range(bad, b, b->param_block + lo, rb, lo, hi, "z"),
                   status_name);
    ASSERT_MEM_EQ(b0, b->param_block, (size_t)n * 4);
    free(buf);
    free(b0);
    pdp_optim_free(oa);
    pdp_optim_free(rb);
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

/* ---- data offsets: gaps, overlaps, trailing bytes ---- */

/* A safetensors file of a 1 -> 2 Linear ("0.weight" [2, 1], "0.bias" [2]; the second
   named bias, or given another name) with the given data_offsets and data_bytes of data
   (floats 1, 2, 3, ...), no checksums (as another tool writes it). */
static int craft_file(const char *path, int wb, int we, int bb, int be, int data_bytes,
                      const char *bias)
{
    char h[256];
    unsigned char out[512];
    float f;
    int n, i;
    n = snprintf(h, sizeof h, "{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":"
                 "[%d,%d]},\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%d,%d]}}",
                 wb, we, bias ? bias : "0.bias", bb, be);
    while (n % 8) h[n++] = ' ';
    memset(out, 0, 8);
    out[0] = (unsigned char)n;
    memcpy(out + 8, h, (size_t)n);
    for (i = 0; i < data_bytes / 4; i++) {
        f = (float)(i + 1);
        memcpy(out + 8 + n + 4 * i, &f, 4);
    }
    return write_all(path, out, 8 + n + data_bytes);
}

TEST checkpoint_gaps_and_overlaps(void)
{
    char path[128], prefix[256];
    pdp_model *m = make_model(1, 2, 0, false, 1);
    snapshot s;
    static const struct {
        int wb, we, bb, be, data;
        const char *needle, *bias;
    } bad[] = {
        {0, 8, 12, 20, 20, "\"0.bias\" starts at data byte 12, expected 8 (overlap or gap)", 0},
        {0, 8, 4, 12, 12, "\"0.bias\" starts at data byte 4, expected 8 (overlap or gap)", 0},
        {4, 12, 12, 20, 20, "\"0.weight\" starts at data byte 4, expected 0", 0},
        {0, 8, 8, 16, 20, "tensors cover 16 of the 20 data bytes", 0},
        /* a name twice, on the same bytes: the name, not an overlap */
        {0, 8, 0, 8, 8, "tensor \"0.weight\" appears twice", "0.weight"},
    };
    size_t k;
    ASSERT(m != NULL);
    path_in_tmp(path, sizeof path, "offsets.safetensors");
    snprintf(prefix, sizeof prefix, "pdp_checkpoint_load: %s: ", path);
    snap_take(&s, m, NULL);
    for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ASSERT_EQ(0, craft_file(path, bad[k].wb, bad[k].we, bad[k].bb, bad[k].be, bad[k].data,
                                bad[k].bias));
        ASSERT_ENUM_EQm(bad[k].needle, PDP_ERR_FORMAT, pdp_checkpoint_load(path, m, NULL),
                        status_name);
        ASSERTm(pdp_last_error(), strncmp(pdp_last_error(), prefix, strlen(prefix)) == 0);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), bad[k].needle) != NULL);
        ASSERT(snap_same(&s, m, NULL));
    }
    /* the same file tiled exactly loads (a file without checksums) */
    ASSERT_EQ(0, craft_file(path, 0, 8, 8, 16, 16, NULL));
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, m, NULL), status_name);
    ASSERT_EQ_FMT(1.0f, m->param_block[0], "%g");
    ASSERT_EQ_FMT(4.0f, m->param_block[3], "%g");
    snap_free(&s);
    pdp_model_free(m);
    PASS();
}

/* ---- messages ---- */

/* Hyper-parameters in the metadata that the optimizer refuses: the message
   starts with pdp_checkpoint_load and the file, as base.h promises. */
TEST checkpoint_metadata_errors_start_with_the_function(void)
{
    char path[128], prefix[256];
    pdp_model *m = make_model(5, 8, 3, false, 1);
    pdp_optim *adam = NULL, *sgd = NULL;
    pdp_optim_desc da = adam_desc(), ds = sgd_desc();
    snapshot s;
    int c;
    ASSERT(m != NULL);
    path_in_tmp(path, sizeof path, "meta.safetensors");
    snprintf(prefix, sizeof prefix, "pdp_checkpoint_load: %s: __metadata__: ", path);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&adam, m, &da), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&sgd, m, &ds), status_name);
    for (c = 0; c < 3; c++) {
        pdp_optim *o = c < 2 ? adam : sgd;
        pdp_optim_desc keep = o->desc;
        const char *needle = c == 0 ? "lr -1" : c == 1 ? "beta1 1.5" : "dampening 2";
        if (c == 0) o->desc.lr = -1.0f;
        if (c == 1) o->desc.beta1 = 1.5f;
        if (c == 2) o->desc.dampening = 2.0f;
        ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path, m, o), status_name);
        o->desc = keep;
        snap_take(&s, m, o);
        ASSERT_ENUM_EQm(needle, PDP_ERR_FORMAT, pdp_checkpoint_load(path, m, o), status_name);
        ASSERTm(pdp_last_error(), strncmp(pdp_last_error(), prefix, strlen(prefix)) == 0);
        ASSERTm(pdp_last_error(), strstr(pdp_last_error(), needle) != NULL);
        ASSERT(snap_same(&s, m, o));
        snap_free(&s);
    }
    pdp_optim_free(adam);
    pdp_optim_free(sgd);
    pdp_model_free(m);
    PASS();
}

/* In the header of the file buf [bytes]: every "crc32c.*" entry taken out (a file other
   tools write: loaded unverified) and the entry `key` replaced by `entry` ("" removes it),
   the header padded with spaces to its length, so the data stays where it was. */
static int edit_header(unsigned char *buf, long bytes, const char *key, const char *entry)
{
    uint64_t n = 0;
    char *h, *at, *end;
    int i;
    for (i = 0; i < 8; i++) n |= (uint64_t)buf[i] << (8 * i);
    if (bytes < 8 || n > (uint64_t)bytes - 8) return -1;
    h = (char *)buf + 8;
    for (;;) { /* ,"crc32c.<name>":"<8 hex>" */
        char *k = NULL, *c;
        for (c = h; c + 9 < h + n && !k; c++)
            if (memcmp(c, ",\"crc32c.", 9) == 0) k = c;
        if (!k) break;
        end = strstr(k + 9, "\":\"");
        if (!end || end + 3 + 9 > h + n) return -1;
        end += 3 + 9;
        memmove(k, end, (size_t)(h + n - end));
        memset(h + n - (end - k), ' ', (size_t)(end - k));
    }
    at = strstr(h, key); /* the header is followed by binary data: bounded below */
    if (!at || at > h + n || at == h || at[-1] != ',') return -1;
    end = strchr(at + strlen(key), '"'); /* the value's closing quote */
    if (!end || !(end = strchr(end + 1, '"')) || end > h + n) return -1;
    end++;
    at--; /* with its comma */
    if (strlen(entry) > (size_t)(end - at)) return -1;
    {
        size_t old = (size_t)(end - at), len = strlen(entry);
        memcpy(at, entry, len);
        memmove(at + len, end, (size_t)(h + n - end));
        memset(h + n - (old - len), ' ', old - len);
    }
    return 0;
}

/* "optim.decay_params": a file without it (written before it existed) loads as
   PDP_DECAY_ALL; a value that is neither "all" nor "matrices" is refused by name. */
TEST checkpoint_decay_params_absent_and_unknown(void)
{
    char path[128], edited[160];
    pdp_model *m = make_model(5, 8, 3, false, 1);
    pdp_optim *o = NULL;
    pdp_optim_desc d = adam_desc();
    unsigned char *buf;
    long bytes;
    ASSERT(m != NULL);
    d.kind = PDP_OPTIM_ADAMW;
    d.decay_params = PDP_DECAY_MATRICES;
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &d), status_name);
    path_in_tmp(path, sizeof path, "decay.safetensors");
    snprintf(edited, sizeof edited, "%s.edited", path);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_save(path, m, o), status_name);
    buf = read_all(path, &bytes);
    ASSERT(buf && strstr((char *)buf + 8, "\"optim.decay_params\":\"matrices\""));
    ASSERT_EQ(0, edit_header(buf, bytes, "\"optim.decay_params\"", ""));
    ASSERT_EQ(0, write_all(edited, buf, bytes));
    free(buf);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(edited, m, o), status_name);
    ASSERT_EQ(PDP_DECAY_ALL, pdp_optim_get_desc(o).decay_params);
    buf = read_all(path, &bytes);
    ASSERT(buf != NULL);
    ASSERT_EQ(0, edit_header(buf, bytes, "\"optim.decay_params\"",
                             ",\"optim.decay_params\":\"matrixes\""));
    ASSERT_EQ(0, write_all(edited, buf, bytes));
    free(buf);
    ASSERT_ENUM_EQ(PDP_ERR_FORMAT, pdp_checkpoint_load(edited, m, o), status_name);
    ASSERTm(pdp_last_error(), strstr(pdp_last_error(), "\"optim.decay_params\" is \"matrixes\""));
    ASSERT_EQ(PDP_DECAY_ALL, pdp_optim_get_desc(o).decay_params); /* refused: unchanged */
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, m, o), status_name);
    ASSERT_EQ(PDP_DECAY_MATRICES, pdp_optim_get_desc(o).decay_params);
    remove(edited);
    remove(path);
    pdp_optim_free(o);
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
#ifndef _WIN32
    struct rlimit old, small;
#endif
    pdp_status st;
    ASSERT(m != NULL);
    path_in_tmp(path, sizeof path, "keep.safetensors");
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, m, &d), status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(path, m, o), status_name);
    before = read_all(path, &nb);
    ASSERT(before != NULL && nb > 600);
    random_steps(m, o, 2, 77); /* the next save would write different bytes */

#ifndef _WIN32 /* no file size limit to set on Windows: the other failure below stays */
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
#else
    (void)after;
    (void)na;
#endif

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

/* ---- stale temporaries ---- */

static int exists(const char *path) { return access(path, F_OK) == 0; }

static int touch(const char *path) { return write_all(path, "x", 1); }

/* A pid that was a process and is no more (reaped). */
static long dead_pid(void)
{
    char *argv[] = {"test_checkpoint", "exit", NULL};
    child c;
    if (child_spawn(&c, argv) != 0) return -1;
    (void)child_wait(&c);
    return c.pid;
}

/* "<target>.tmp.<pid>" of a dead pid is removed by the next save of target,
   full or shard; a live pid's is kept (until it dies); names that only look
   alike are kept. */
TEST checkpoint_stale_temporaries_removed(void)
{
    char target[128], shard[128], dead[192], live[192], other[192], odd[192], sdead[192];
    pdp_model *m = make_model(5, 8, 3, false, 1);
    char *sleeper[] = {"test_checkpoint", "sleep", NULL};
    long dpid = dead_pid(), lpid;
    child live_writer;
    bool made, kept_live;
    pdp_status st;
    ASSERT(m != NULL && dpid > 0);
    ASSERT_EQ(0, child_spawn(&live_writer, sleeper));
    lpid = live_writer.pid;
    path_in_tmp(target, sizeof target, "stale.safetensors");
    path_in_tmp(shard, sizeof shard, "stale_shard.safetensors");
    snprintf(dead, sizeof dead, "%s.tmp.%ld", target, (long)dpid);
    snprintf(live, sizeof live, "%s.tmp.%ld", target, (long)lpid);
    snprintf(other, sizeof other, "%s.old.tmp.%ld", target, (long)dpid);
    snprintf(odd, sizeof odd, "%s.tmp.%ldx", target, (long)dpid);
    snprintf(sdead, sizeof sdead, "%s.tmp.%ld", shard, (long)dpid);
    made = touch(dead) == 0 && touch(live) == 0 && touch(other) == 0 && touch(odd) == 0 &&
           touch(sdead) == 0;
    st = pdp_checkpoint_save(target, m, NULL);
    kept_live = exists(live);
    /* the live writer dies (reaped before any assertion can return) */
    child_kill(&live_writer);
    ASSERT(made);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, st, status_name);
    ASSERTm("a dead writer's temporary was kept", !exists(dead));
    ASSERTm("a live writer's temporary was removed", kept_live);
    ASSERTm("another target's temporary was removed", exists(other));
    ASSERTm("a name that only looks alike was removed", exists(odd));
    ASSERTm("another target's temporary was removed", exists(sdead));
    /* the next save removes the now dead writer's temporary */
    ASSERT(exists(live));
    ASSERT_ENUM_EQ(PDP_OK, pdp_checkpoint_save(target, m, NULL), status_name);
    ASSERT(!exists(live));
    ASSERT(exists(other) && exists(odd));
    /* a shard file's save does the same */
    ASSERT_ENUM_EQ(PDP_OK, pdp__checkpoint_save_range(shard, m, m->param_block + 3, NULL, 3, 10,
                                                      "z"), status_name);
    ASSERT(!exists(sdead));
    remove(other);
    remove(odd);
    pdp_model_free(m);
    PASS();
}

/* The child of checkpoint_killed_save_leaves_nothing: saves a large model to
   path until killed. */
static int save_loop_child(const char *path)
{
    pdp_model *m = make_model(512, 1024, 512, false, 1);
    if (!m) return 2;
    for (;;)
        if (pdp_checkpoint_save(path, m, NULL) != PDP_OK) return 1;
}

/* A writer SIGKILLed mid-save leaves "<path>.tmp.<its pid>.<thread>" behind; the next
   save of path (by anyone) removes it. */
TEST checkpoint_killed_save_cleaned_up(void)
{
    char path[128], tmp[192];
    pdp_model *m = make_model(5, 8, 3, false, 1);
    int tries, left = 0;
    ASSERT(m != NULL);
    path_in_tmp(path, sizeof path, "killed.safetensors");
    for (tries = 0; tries < 5 && !left; tries++) {
        double t0 = now_seconds();
        char *argv[] = {"test_checkpoint", "save-loop", path, NULL};
        child c;
        ASSERT_EQ(0, child_spawn(&c, argv));
        snprintf(tmp, sizeof tmp, "killed.safetensors.tmp.%ld.", c.pid); /* .<thread> */
        while (!tmp_files_left(tmp) && now_seconds() - t0 < 5.0) child_nap();
        child_kill(&c);
        left = tmp_files_left(tmp);
    }
    if (!left) {
        pdp_model_free(m);
        SKIPm("no kill landed inside a save in 5 tries");
    }
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_save(path, m, NULL), status_name);
    ASSERTm("the killed writer's temporary is still there", !tmp_files_left(tmp));
    ASSERT_EQ(0, tmp_files_left("killed.safetensors"));
    pdp_model_free(m);
    PASS();
}

/* Thread ranks (one process) saving one path at once, as every rank of a DDP run calling
   pdp_checkpoint_save does: each save succeeds and the file loads whole. Before: both
   wrote "<path>.tmp.<pid>" (one pid), so one rank's rename failed ("rename of ... failed:
   No such file or directory") or moved a file the other was still writing. */
typedef struct same_path_job {
    char path[128];
    pdp_status st[2];
    char msg[2][1024];
} same_path_job;

static pdp_status same_path_rank(const pdp_launch_ctx *ctx, void *user)
{
    same_path_job *j = (same_path_job *)user;
    pdp_model *m = make_model(64, 512, 64, false, 1);
    int k;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    j->st[ctx->rank] = pdp_comm_barrier(ctx->world, NULL);
    for (k = 0; k < 40 && j->st[ctx->rank] == PDP_OK; k++)
        j->st[ctx->rank] = pdp_checkpoint_save(j->path, m, NULL);
    snprintf(j->msg[ctx->rank], sizeof j->msg[ctx->rank], "%s", pdp_last_error());
    pdp_model_free(m);
    return PDP_OK;
}

TEST checkpoint_thread_ranks_save_one_path(void)
{
    same_path_job j;
    pdp_model *m = make_model(64, 512, 64, false, 1);
    ASSERT(m != NULL);
    memset(&j, 0, sizeof j);
    path_in_tmp(j.path, sizeof j.path, "same_path.safetensors");
    ASSERT_ENUM_EQ(PDP_OK, pdp_launch(2, NULL, same_path_rank, &j), status_name);
    ASSERT_ENUM_EQm(j.msg[0], PDP_OK, j.st[0], status_name);
    ASSERT_ENUM_EQm(j.msg[1], PDP_OK, j.st[1], status_name);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(j.path, m, NULL), status_name);
    ASSERT_EQ(0, tmp_files_left("same_path.safetensors"));
    remove(j.path);
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
    char *argv[] = {"test_checkpoint", "resume-child", (char *)kind, mid, end, NULL};
    child c;
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

    ASSERT_EQ(0, child_spawn(&c, argv));
    ASSERTm("the resumed process failed", child_wait(&c) == 0);

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

/* ---- a GPT: nanoGPT's files ----
   tools/gpt_reference.py wrote gpt_nanogpt.safetensors (the 28 parameters of its trained
   GPT, the tied head once as transformer.wte.weight) and
   gpt_nanogpt_with_bias_buffers.safetensors (also lm_head.weight, a copy of wte, and the
   transformer.h.{i}.attn.bias causal-mask buffers nanoGPT saves on torch < 2.0), both
   holding gpt_adamw.bin's final.*; final.logits and final.loss are that model's on
   gpt_forward.bin's ids and targets. Other nanoGPT-style files are written here by
   st_write. */

#define GPT_B 3
#define GPT_T 16
#define GPT_V 67
#define GPT_NPARAMS 28

static pdp_model *gpt_make(uint64_t seed)
{
    pdp_gpt_desc d;
    pdp_model *m = NULL;
    memset(&d, 0, sizeof d);
    d.vocab = GPT_V;
    d.context = GPT_T;
    d.layers = 2;
    d.heads = 4;
    d.dim = 48;
    d.seed = seed;
    return pdp_gpt_create(&m, &d) == PDP_OK ? m : NULL;
}

/* A tensor st_write writes: F32, little-endian (the hosts we run on). */
typedef struct st_tensor {
    char name[64];
    int ndim;
    int64_t shape[4];
    const float *data;
} st_tensor;

static int64_t st_count(const st_tensor *t)
{
    int64_t n = 1;
    int d;
    for (d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* A safetensors file as another tool writes it (safetensors' "Format": the header's
   length as 8 bytes little-endian, the JSON header padded with spaces to 8 bytes, the
   data), metadata {"format": "pt"} and no checksums; 0 on success. */
static int st_write(const char *path, const st_tensor *t, int n)
{
    size_t cap = 256 + (size_t)n * 256, len = 0;
    char *h = (char *)malloc(cap);
    unsigned char len8[8];
    uint64_t at = 0;
    FILE *f;
    int i, d, ok;
    if (!h) return -1;
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (i = 0; i < n; i++) {
        uint64_t bytes = (uint64_t)st_count(&t[i]) * 4;
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[",
                                t[i].name);
        for (d = 0; d < t[i].ndim; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "",
                                    (long long)t[i].shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                                (unsigned long long)at, (unsigned long long)(at + bytes));
        at += bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' ';
    for (d = 0; d < 8; d++) len8[d] = (unsigned char)((uint64_t)len >> (8 * d));
    if (!(f = fopen(path, "wb"))) {
        free(h);
        return -1;
    }
    ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h, 1, len, f) == len;
    for (i = 0; ok && i < n; i++)
        ok = fwrite(t[i].data, 4, (size_t)st_count(&t[i]), f) == (size_t)st_count(&t[i]);
    free(h);
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* t[0..28): m's parameters by name and shape, their data gpt_adamw.bin's final.<name>;
   0 when the fixture has every one in that shape. */
static int gpt_final_tensors(const pdp_model *m, const fixture *adamw, st_tensor *t)
{
    int i, d;
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param p;
        char name[96];
        const fixture_tensor *x;
        pdp_model_param(m, i, &p);
        snprintf(name, sizeof name, "final.%s", p.name);
        if (!(x = fixture_find(adamw, name)) || x->ndim != p.ndim) return -1;
        snprintf(t[i].name, sizeof t[i].name, "%s", p.name);
        t[i].ndim = p.ndim;
        for (d = 0; d < p.ndim; d++)
            if ((t[i].shape[d] = p.shape[d]) != x->shape[d]) return -1;
        t[i].data = x->data;
    }
    return 0;
}

/* nanoGPT's causal-mask buffer: [1, 1, S, S], tril(ones(S, S)). */
static void gpt_mask(st_tensor *t, const char *name, int64_t S, float *data)
{
    int64_t r, c;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = 4;
    t->shape[0] = t->shape[1] = 1;
    t->shape[2] = t->shape[3] = S;
    for (r = 0; r < S; r++)
        for (c = 0; c < S; c++) data[r * S + c] = c <= r ? 1.0f : 0.0f;
    t->data = data;
}

/* m's parameters are gpt_adamw.bin's final.* bit for bit, and its logits and loss on
   gpt_forward.bin's ids and targets are final.logits and final.loss within 1e-5
   (fixture_rel_err). */
static enum greatest_test_res gpt_expect_final(pdp_model *m, const fixture *adamw,
                                               const fixture *fwd, const char *file)
{
    const fixture_tensor *ids = fixture_find(fwd, "ids"), *tg = fixture_find(fwd, "targets");
    const fixture_tensor *logits = fixture_find(adamw, "final.logits");
    const fixture_tensor *loss = fixture_find(adamw, "final.loss");
    int32_t id[GPT_B * GPT_T], label[GPT_B * GPT_T];
    int64_t shape[2] = {GPT_B, GPT_T};
    const pdp_tensor *y;
    pdp_tensor x;
    float got_loss;
    double e_logits, e_loss;
    int i, n = 0;
    for (i = 0; i < pdp_model_num_params(m); i++) {
        pdp_param p;
        char name[96];
        const fixture_tensor *want;
        pdp_model_param(m, i, &p);
        snprintf(name, sizeof name, "final.%s", p.name);
        want = fixture_find(adamw, name);
        ASSERTm(name, want && want->count == p.count);
        ASSERTm(name, memcmp(p.value.data, want->data, (size_t)p.count * 4) == 0);
        n++;
    }
    ASSERT_EQ(GPT_NPARAMS, n);
    ASSERT(ids && tg && logits && loss && ids->count == GPT_B * GPT_T);
    ASSERT_EQ((int64_t)GPT_B * GPT_T * GPT_V, logits->count);
    for (i = 0; i < GPT_B * GPT_T; i++) {
        id[i] = (int32_t)ids->data[i];
        label[i] = (int32_t)tg->data[i];
    }
    pdp_tensor_wrap_ids(id, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_forward(m, &x, &y), status_name);
    ASSERT_EQ(logits->count, y->count);
    e_logits = fixture_rel_err(y->data, logits->data, logits->count);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_forward_backward(m, &x, label, &got_loss),
                    status_name);
    e_loss = fixture_rel_err(&got_loss, loss->data, 1);
    printf("    %s: 28 parameters equal to final.*, logits %.2e, loss %.2e (fixture metric)\n",
           file, e_logits, e_loss);
    ASSERT_LT(e_logits, 1e-5);
    ASSERT_LT(e_loss, 1e-5);
    PASS();
}

/* Both of tools/gpt_reference.py's nanoGPT files load, with no renaming, into a GPT made
   with another initialisation: the trained parameters bit for bit, PyTorch's logits and
   loss. */
TEST checkpoint_gpt_loads_nanogpt_files(void)
{
    static const char *const files[] = {"gpt_nanogpt.safetensors",
                                        "gpt_nanogpt_with_bias_buffers.safetensors"};
    fixture adamw, fwd;
    char path[512];
    int k;
    FIXTURE_LOAD_OR_SKIP(&adamw, "gpt_adamw.bin");
    FIXTURE_LOAD_OR_SKIP(&fwd, "gpt_forward.bin");
    for (k = 0; k < 2; k++) {
        pdp_model *m = gpt_make(0);
        pdp_param wte;
        enum greatest_test_res r;
        const char *dir = getenv("PDP_FIXTURE_DIR");
        snprintf(path, sizeof path, "%s/%s", dir && *dir ? dir : "tests/fixtures", files[k]);
        ASSERT(m != NULL);
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_find_param(m, "transformer.wte.weight", &wte),
                       status_name);
        ASSERT_FALSE(memcmp(wte.value.data, fixture_find(&adamw, "final.transformer.wte.weight")
                                                ->data, (size_t)wte.count * 4) == 0);
        ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, m, NULL),
                        status_name);
        r = gpt_expect_final(m, &adamw, &fwd, files[k]);
        pdp_model_free(m);
        if (r != GREATEST_TEST_RES_PASS) return r;
    }
    fixture_free(&adamw);
    fixture_free(&fwd);
    PASS();
}

/* The tied head's alias, lm_head.weight: alone it loads into transformer.wte.weight; beside
   it, it must equal it bit for bit (one element one ulp off is refused, naming both and the
   element) and have its shape; a model without a tied head refuses it as any extra
   tensor. Every refusal leaves the model as it was. */
TEST checkpoint_gpt_head_alias(void)
{
    st_tensor t[GPT_NPARAMS + 1];
    fixture adamw, fwd;
    victim v;
    float *wte2;
    char path[128];
    int64_t wcount;
    int iw = 0, i;
    FIXTURE_LOAD_OR_SKIP(&adamw, "gpt_adamw.bin");
    FIXTURE_LOAD_OR_SKIP(&fwd, "gpt_forward.bin");
    memset(&v, 0, sizeof v);
    ASSERT((v.m = gpt_make(3)) != NULL);
    snap_take(&v.s, v.m, NULL);
    ASSERT_EQ(0, gpt_final_tensors(v.m, &adamw, t));
    while (strcmp(t[iw].name, "transformer.wte.weight") != 0) iw++;
    wcount = st_count(&t[iw]);
    path_in_tmp(path, sizeof path, "gpt_alias.safetensors");

    /* wte and a copy one ulp off at [5, 7] */
    ASSERT((wte2 = (float *)malloc((size_t)wcount * 4)) != NULL);
    memcpy(wte2, t[iw].data, (size_t)wcount * 4);
    wte2[5 * 48 + 7] = nextafterf(wte2[5 * 48 + 7], 1.0f);
    t[GPT_NPARAMS] = t[iw];
    snprintf(t[GPT_NPARAMS].name, sizeof t[0].name, "lm_head.weight");
    t[GPT_NPARAMS].data = wte2;
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS + 1));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_FORMAT, "tensor \"lm_head.weight\" differs "
                                 "from \"transformer.wte.weight\" at [5, 7]", "must be equal"));
    /* another shape */
    t[GPT_NPARAMS].data = t[iw].data;
    t[GPT_NPARAMS].shape[0] = GPT_V - 1;
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS + 1));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_SHAPE, "tensor \"lm_head.weight\" (the tied "
                                 "head, an alias of \"transformer.wte.weight\") is F32 [66, 48], "
                                 "expected F32 [67, 48]", NULL));
    t[GPT_NPARAMS].shape[0] = GPT_V;
    /* neither name */
    t[iw] = t[GPT_NPARAMS - 1];
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS - 1));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_SHAPE, "tensor \"transformer.wte.weight\" is "
                                 "missing (and so is its alias \"lm_head.weight\")", NULL));
    /* only the alias, in wte's place: it is the parameter */
    t[iw] = t[GPT_NPARAMS];
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS - 1 + 1));
    for (i = 0; i < GPT_NPARAMS - 1; i++) ASSERT(strcmp(t[i].name, "transformer.wte.weight"));
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, v.m, NULL),
                    status_name);
    CHECK_CALL(gpt_expect_final(v.m, &adamw, &fwd, "lm_head.weight alone"));
    snap_free(&v.s);
    pdp_model_free(v.m);

    /* a model without a tied head: lm_head.weight is an extra tensor */
    {
        float w[3 * 8];
        pdp_model *mlp = make_model(5, 8, 3, false, 1);
        st_tensor u[5];
        ASSERT(mlp != NULL);
        memset(w, 0, sizeof w);
        for (i = 0; i < 4; i++) {
            pdp_param p;
            pdp_model_param(mlp, i, &p);
            snprintf(u[i].name, sizeof u[i].name, "%s", p.name);
            u[i].ndim = p.ndim;
            memcpy(u[i].shape, p.shape, sizeof u[i].shape);
            u[i].data = p.value.data;
        }
        u[4] = u[2]; /* "2.weight" [3, 8] */
        snprintf(u[4].name, sizeof u[4].name, "lm_head.weight");
        ASSERT_EQ(0, st_write(path, u, 5));
        v.m = mlp;
        snap_take(&v.s, v.m, NULL);
        CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_SHAPE, "tensor \"lm_head.weight\" is not "
                                     "in the model", NULL));
        snap_free(&v.s);
        pdp_model_free(mlp);
    }
    free(wte2);
    fixture_free(&adamw);
    fixture_free(&fwd);
    PASS();
}

/* transformer.h.{i}.attn.bias: skipped when it is exactly nanoGPT's causal mask of a block
   the model has; one element off (above or on the diagonal), another shape, or a block the
   model lacks is an extra tensor, refused naming it. */
TEST checkpoint_gpt_mask_buffers(void)
{
    st_tensor t[GPT_NPARAMS + 2];
    fixture adamw, fwd;
    victim v;
    float m0[GPT_T * GPT_T], m1[GPT_T * GPT_T];
    char path[128];
    FIXTURE_LOAD_OR_SKIP(&adamw, "gpt_adamw.bin");
    FIXTURE_LOAD_OR_SKIP(&fwd, "gpt_forward.bin");
    memset(&v, 0, sizeof v);
    ASSERT((v.m = gpt_make(4)) != NULL);
    snap_take(&v.s, v.m, NULL);
    ASSERT_EQ(0, gpt_final_tensors(v.m, &adamw, t));
    path_in_tmp(path, sizeof path, "gpt_mask.safetensors");
    gpt_mask(&t[GPT_NPARAMS], "transformer.h.0.attn.bias", GPT_T, m0);
    gpt_mask(&t[GPT_NPARAMS + 1], "transformer.h.1.attn.bias", GPT_T, m1);

    m1[2 * GPT_T + 5] = 1.0f; /* above the diagonal */
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS + 2));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_SHAPE, "tensor \"transformer.h.1.attn.bias\" "
                                 "is not in the model and is not the causal mask",
                                 "element [0, 0, 2, 5] is 1, the mask's is 0"));
    m1[2 * GPT_T + 5] = 0.0f;
    m1[3 * GPT_T + 3] = 0.5f; /* on it */
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS + 2));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_SHAPE, "transformer.h.1.attn.bias",
                                 "element [0, 0, 3, 3] is 0.5, the mask's is 1"));
    m1[3 * GPT_T + 3] = 1.0f;
    m1[GPT_T * GPT_T - 1] = 0.0f; /* the last element: the whole tensor is looked at */
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS + 2));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_SHAPE, "transformer.h.1.attn.bias",
                                 "element [0, 0, 15, 15] is 0, the mask's is 1"));
    m1[GPT_T * GPT_T - 1] = 1.0f;
    t[GPT_NPARAMS + 1].ndim = 2; /* [16, 16]: not nanoGPT's buffer */
    t[GPT_NPARAMS + 1].shape[0] = t[GPT_NPARAMS + 1].shape[1] = GPT_T;
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS + 2));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_SHAPE, "transformer.h.1.attn.bias",
                                 "it is F32 [16, 16]"));
    gpt_mask(&t[GPT_NPARAMS + 1], "transformer.h.2.attn.bias", GPT_T, m1); /* no block 2 */
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS + 2));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_SHAPE, "tensor \"transformer.h.2.attn.bias\" "
                                 "is not in the model", NULL));
    ASSERT(strstr(pdp_last_error(), "causal mask") == NULL);
    gpt_mask(&t[GPT_NPARAMS + 1], "transformer.h.1.attn.mask", GPT_T, m1); /* another name */
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS + 2));
    CHECK_CALL(expect_load_fails(&v, path, PDP_ERR_SHAPE, "tensor \"transformer.h.1.attn.mask\" "
                                 "is not in the model", NULL));
    /* both masks right: skipped */
    gpt_mask(&t[GPT_NPARAMS + 1], "transformer.h.1.attn.bias", GPT_T, m1);
    ASSERT_EQ(0, st_write(path, t, GPT_NPARAMS + 2));
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, v.m, NULL),
                    status_name);
    CHECK_CALL(gpt_expect_final(v.m, &adamw, &fwd, "masks written here"));
    snap_free(&v.s);
    pdp_model_free(v.m);
    fixture_free(&adamw);
    fixture_free(&fwd);
    PASS();
}

/* Count of tensors in a file's header (entries with a "dtype"). */
static int header_tensors(const unsigned char *buf)
{
    long n = (long)header_len(buf), i;
    int count = 0;
    for (i = 8; i + 8 <= 8 + n; i++) count += memcmp(buf + i, "\"dtype\":", 8) == 0;
    return count;
}

/* pdp's file of a GPT: the tied head once, as transformer.wte.weight (28 tensors, no
   lm_head.weight: safetensors refuses two names for one tensor), and it loads back bit for
   bit. */
TEST checkpoint_gpt_round_trip_writes_the_head_once(void)
{
    pdp_model *a = gpt_make(5), *b = gpt_make(6);
    unsigned char *buf;
    char path[128];
    long bytes;
    ASSERT(a && b);
    path_in_tmp(path, sizeof path, "gpt_pdp.safetensors");
    ASSERT_EQ(GPT_NPARAMS, pdp_model_num_params(a));
    ASSERT(memcmp(a->param_block, b->param_block, (size_t)a->param_count * 4) != 0);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_save(path, a, NULL), status_name);
    ASSERT((buf = read_all(path, &bytes)) != NULL);
    ASSERT_EQ(GPT_NPARAMS, header_tensors(buf));
    ASSERT(header_find(buf, "\"transformer.wte.weight\":{") >= 0);
    ASSERT_EQ(-1, header_find(buf, "\"lm_head.weight\""));
    ASSERT_EQ(-1, header_find(buf, ".attn.bias\""));
    ASSERT_EQ(8 + (long)header_len(buf) + a->param_count * 4, bytes);
    free(buf);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(path, b, NULL), status_name);
    ASSERT(memcmp(a->param_block, b->param_block, (size_t)a->param_count * 4) == 0);
    pdp_model_free(a);
    pdp_model_free(b);
    PASS();
}

/* PyTorch loads pdp's file of a GPT into tools/gpt_reference.py's GPT with
   load_state_dict(strict=True) once lm_head.weight is put back (as the same tensor as
   transformer.wte.weight), and its logits are pdp's within 1e-5. */
static const char *py_gpt_script =
    "import sys\n"
    "import numpy as np\n"
    "import torch\n"
    "from safetensors.torch import load_file\n"
    "sys.path.insert(0, 'tools')\n"
    "import gpt_reference as g\n"
    "path, ids_path, logits_path = sys.argv[1:4]\n"
    "torch.set_num_threads(1)\n"
    "sd = load_file(path)\n"
    "# a consolidated ZeRO file also holds the optimizer's state (optim.*): the documented\n"
    "# load for a module filters it\n"
    "sd = {k: v for k, v in sd.items() if not k.startswith('optim.')}\n"
    "assert len(sd) == 28 and 'lm_head.weight' not in sd, sorted(sd)\n"
    "sd['lm_head.weight'] = sd['transformer.wte.weight']\n"
    "model = g.GPT()\n"
    "model.load_state_dict(sd)  # strict\n"
    "assert model.lm_head.weight is model.transformer.wte.weight\n"
    "ids = torch.from_numpy(np.fromfile(ids_path, '<i4').reshape(3, 16)).long()\n"
    "want = np.fromfile(logits_path, '<f4').reshape(3, 16, 67)\n"
    "with torch.no_grad():\n"
    "    logits, _ = model(ids, torch.zeros_like(ids))\n"
    "got = logits.numpy()\n"
    "err = np.abs(got - want).max() / max(np.abs(want).max(), 1.0)\n"
    "print('    PyTorch on pdp\\'s file: logits %.2e from pdp\\'s (fixture metric)' % err)\n"
    "sys.exit(0 if err <= 1e-5 else 1)\n";

TEST checkpoint_gpt_pytorch_loads_pdp_file(void)
{
    char path[128], ids_path[128], logits_path[128], script[128], cmd[1024];
    const char *py = pdp_test_python("torch, safetensors.torch, numpy");
    int32_t id[GPT_B * GPT_T];
    int64_t shape[2] = {GPT_B, GPT_T}, j;
    const pdp_tensor *y;
    pdp_model *m;
    pdp_tensor x;
    pdp_rng r;
    int i;
    if (!py) SKIPm(pdp_test_python_missing("torch, safetensors.torch, numpy"));
    ASSERT((m = gpt_make(7)) != NULL);
    /* every parameter moved off its initialisation (biases off 0, LayerNorms off 1 and 0) */
    pdp_rng_seed(&r, 11, 0);
    for (j = 0; j < m->param_count; j++) m->param_block[j] += 0.1f * pdp_rng_normal(&r);
    for (i = 0; i < GPT_B * GPT_T; i++) id[i] = (int32_t)pdp_rng_below(&r, GPT_V);
    path_in_tmp(path, sizeof path, "gpt_torch.safetensors");
    path_in_tmp(ids_path, sizeof ids_path, "gpt_ids.raw");
    path_in_tmp(logits_path, sizeof logits_path, "gpt_logits.raw");
    path_in_tmp(script, sizeof script, "gpt_torch.py");
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_save(path, m, NULL), status_name);
    pdp_tensor_wrap_ids(id, pdp_cpu(), 2, shape, &x);
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_model_forward(m, &x, &y), status_name);
    ASSERT_EQ(0, write_all(ids_path, id, (long)sizeof id));
    ASSERT_EQ(0, write_all(logits_path, y->data, (long)y->count * 4));
    ASSERT_EQ(0, write_all(script, py_gpt_script, (long)strlen(py_gpt_script)));
    snprintf(cmd, sizeof cmd, "\"%s\" %s %s %s %s", py, script, path, ids_path, logits_path);
    ASSERT_EQm("the PyTorch check failed (its output is above)", 0, system(cmd));
    pdp_model_free(m);
    PASS();
}

/* ZeRO-3 trains the GPT on 2 thread ranks (each its half of the batch, the same number of
   -1 targets each), consolidates one full file, and that file is the single-device GPT's
   after the same steps (pdp loads it: parameters within 1e-5) and loads into PyTorch's GPT
   with strict load_state_dict (the logits of pdp's loaded model within 1e-5). */
typedef struct zero_gpt_job {
    int32_t ids[4 * GPT_T], tg[4 * GPT_T];
    char path[128];
} zero_gpt_job;

static pdp_optim_desc gpt_adamw(void)
{
    pdp_optim_desc d;
    memset(&d, 0, sizeof d);
    d.kind = PDP_OPTIM_ADAMW, d.lr = 1e-3, d.weight_decay = 0.1;
    return d;
}

static pdp_status zero_gpt_rank(const pdp_launch_ctx *ctx, void *user)
{
    zero_gpt_job *j = (zero_gpt_job *)user;
    pdp_model *m = gpt_make(7);
    pdp_zero *z = NULL;
    pdp_optim *o = NULL;
    pdp_zero_desc zd;
    pdp_optim_desc od = gpt_adamw();
    pdp_tensor x;
    int64_t shape[2] = {2, GPT_T};
    float loss;
    int s;
    pdp_status st;
    if (!m) return PDP_ERR_OUT_OF_MEMORY;
    memset(&zd, 0, sizeof zd);
    zd.stage = 3;
    pdp_tensor_wrap_ids(j->ids + ctx->rank * 2 * GPT_T, pdp_cpu(), 2, shape, &x);
    if ((st = pdp_zero_create(&z, m, ctx->world, &zd)) != PDP_OK ||
        (st = pdp_zero_optim_create(&o, z, &od)) != PDP_OK)
        goto out;
    for (s = 0; s < 2 && st == PDP_OK; s++)
        if ((st = pdp_zero_forward_backward(z, &x, j->tg + ctx->rank * 2 * GPT_T, &loss)) ==
            PDP_OK)
            st = pdp_zero_step(z, o);
    if (st == PDP_OK) st = pdp_zero_checkpoint_consolidate(z, o, j->path);
out:
    pdp_optim_free(o);
    pdp_zero_free(z);
    pdp_model_free(m);
    return st;
}

TEST checkpoint_gpt_zero3_consolidated_is_one_devices_and_pytorch_loads_it(void)
{
    static zero_gpt_job job;
    char ids_path[128], logits_path[128], script[128], cmd[1024];
    const char *py = pdp_test_python("torch, safetensors.torch, numpy");
    pdp_model *one = gpt_make(7), *back = gpt_make(99);
    pdp_optim *o = NULL;
    pdp_optim_desc od = gpt_adamw();
    pdp_tensor x, p1, pb;
    const pdp_tensor *y;
    int64_t shape[4] = {4, GPT_T}, first3[2] = {GPT_B, GPT_T};
    float loss;
    int i, s;
    ASSERT(one && back);
    for (i = 0; i < 4 * GPT_T; i++) {
        job.ids[i] = (int32_t)((i * 17 + 5) % GPT_V);
        job.tg[i] = i % GPT_T == 6 ? -1 : (int32_t)((i * 29 + 3) % GPT_V);
    }
    path_in_tmp(job.path, sizeof job.path, "gpt_zero3.safetensors");
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_launch(2, NULL, zero_gpt_rank, &job),
                    status_name);
    /* one device, the same two steps on the whole batch */
    ASSERT_ENUM_EQ(PDP_OK, pdp_optim_create(&o, one, &od), status_name);
    pdp_tensor_wrap_ids(job.ids, pdp_cpu(), 2, shape, &x);
    for (s = 0; s < 2; s++) {
        ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward_backward(one, &x, job.tg, &loss), status_name);
        ASSERT_ENUM_EQ(PDP_OK, pdp_optim_step(o), status_name);
        pdp_optim_zero_grad(o);
    }
    ASSERT_ENUM_EQm(pdp_last_error(), PDP_OK, pdp_checkpoint_load(job.path, back, NULL),
                    status_name);
    pdp_model_flat(one, &p1, NULL);
    pdp_model_flat(back, &pb, NULL);
    ASSERT(fixture_rel_err(pb.data, p1.data, p1.count) <= 1e-5);
    if (!py) {
        pdp_optim_free(o);
        pdp_model_free(one);
        pdp_model_free(back);
        SKIPm(pdp_test_python_missing("torch, safetensors.torch, numpy"));
    }
    /* PyTorch's GPT reads the consolidated file: its logits against pdp's */
    pdp_tensor_wrap_ids(job.ids, pdp_cpu(), 2, first3, &x);
    ASSERT_ENUM_EQ(PDP_OK, pdp_model_forward(back, &x, &y), status_name);
    path_in_tmp(ids_path, sizeof ids_path, "gpt_zero3_ids.raw");
    path_in_tmp(logits_path, sizeof logits_path, "gpt_zero3_logits.raw");
    path_in_tmp(script, sizeof script, "gpt_zero3_torch.py");
    ASSERT_EQ(0, write_all(ids_path, job.ids, (long)(GPT_B * GPT_T * sizeof(int32_t))));
    ASSERT_EQ(0, write_all(logits_path, y->data, (long)y->count * 4));
    ASSERT_EQ(0, write_all(script, py_gpt_script, (long)strlen(py_gpt_script)));
    snprintf(cmd, sizeof cmd, "\"%s\" %s %s %s %s", py, script, job.path, ids_path, logits_path);
    ASSERT_EQm("the PyTorch check failed (its output is above)", 0, system(cmd));
    pdp_optim_free(o);
    pdp_model_free(one);
    pdp_model_free(back);
    PASS();
}

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
    RUN_TEST(checkpoint_crc32c_matches_definition);
    RUN_TEST(checkpoint_checksums_in_metadata);
    RUN_TEST(checkpoint_flipped_tensor_bytes);
    RUN_TEST(checkpoint_flipped_checksum_metadata);
    RUN_TEST(checkpoint_fuzz_random_byte_flips);
    RUN_TEST(checkpoint_range_files_checksummed);
    RUN_TEST(checkpoint_gaps_and_overlaps);
    RUN_TEST(checkpoint_metadata_errors_start_with_the_function);
    RUN_TEST(checkpoint_decay_params_absent_and_unknown);
    RUN_TEST(checkpoint_failed_save_keeps_previous_file);
    RUN_TEST(checkpoint_stale_temporaries_removed);
    RUN_TEST(checkpoint_killed_save_cleaned_up);
    RUN_TEST(checkpoint_thread_ranks_save_one_path);
    RUN_TEST(checkpoint_exact_resume_adam_fresh_process);
    RUN_TEST(checkpoint_exact_resume_sgd_momentum_fresh_process);
    RUN_TEST(checkpoint_gpt_loads_nanogpt_files);
    RUN_TEST(checkpoint_gpt_head_alias);
    RUN_TEST(checkpoint_gpt_mask_buffers);
    RUN_TEST(checkpoint_gpt_round_trip_writes_the_head_once);
    RUN_TEST(checkpoint_gpt_pytorch_loads_pdp_file);
    RUN_TEST(checkpoint_gpt_zero3_consolidated_is_one_devices_and_pytorch_loads_it);
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
    if (argc == 3 && strcmp(argv[1], "save-loop") == 0) return save_loop_child(argv[2]);
    if (argc == 2 && strcmp(argv[1], "exit") == 0) return 0;
    if (argc == 2 && strcmp(argv[1], "sleep") == 0) { /* until killed */
#ifdef _WIN32
        Sleep(INFINITE);
#else
        pause();
#endif
        return 0;
    }
#ifdef _WIN32
    { /* no mkdtemp: a new directory named by this process's id, in %TEMP% */
        const char *t = getenv("TEMP");
        int k, made = 0;
        for (k = 0; k < 1000 && !made; k++) {
            snprintf(tmpdir, sizeof tmpdir, "%s\\pdp_ckpt_%lu_%d", t ? t : ".",
                     (unsigned long)GetCurrentProcessId(), k);
            if (_mkdir(tmpdir) == 0) made = 1;
            else if (errno != EEXIST) break;
        }
        if (!made) {
            perror("mkdir");
            return 1;
        }
    }
#else
    strcpy(tmpdir, "/tmp/pdp_ckpt_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
#endif
    {
        GREATEST_MAIN_BEGIN();
        RUN_SUITE(checkpoint);
        remove_tmpdir();
        GREATEST_MAIN_END();
    }
}
