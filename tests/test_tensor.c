/* Tests of tensors (create, views, copies, errors) and of the PCG32 generator
   (reference values, determinism, distribution moments, initialiser bounds). */
#define PDP_IMPLEMENTATION
#include "pdp.h"
#include "pdp_test.h"

static int64_t s2[2] = {3, 5};

TEST tensor_create_is_zeroed_and_aligned(void)
{
    pdp_tensor *t = NULL;
    int64_t i;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cpu(), 2, s2), pdp_status_name);
    ASSERT_EQ(15, t->count);
    ASSERT_EQ(2, t->ndim);
    ASSERT_EQ(1, t->shape[2]);
    ASSERT_EQ(0, (int)((uintptr_t)t->data % 64));
    for (i = 0; i < t->count; i++) ASSERT_EQ(0.0f, t->data[i]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_fill(t, 2.5f), pdp_status_name);
    ASSERT_EQ(2.5f, t->data[14]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_zeros(t), pdp_status_name);
    ASSERT_EQ(0.0f, t->data[7]);
    pdp_tensor_free(t);
    pdp_tensor_free(NULL);
    PASS();
}

TEST tensor_bad_shapes_fail_with_messages(void)
{
    pdp_tensor *t = (pdp_tensor *)&t;
    int64_t zero[2] = {3, 0}, five[5] = {1, 1, 1, 1, 1}, huge[3] = {INT64_MAX / 2, 4, 1};
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_create(&t, pdp_cpu(), 2, zero), pdp_status_name);
    ASSERT(t == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_tensor_create: dimension 1 is 0"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_create(&t, pdp_cpu(), 5, five), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "ndim 5"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_create(&t, pdp_cpu(), 0, five), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_create(&t, pdp_cpu(), 2, NULL), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_create(&t, pdp_cpu(), 3, huge), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "overflows"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_create(NULL, pdp_cpu(), 2, s2), pdp_status_name);
    { /* a device pdp does not know: refused by name, not taken for a CUDA device or CPU 0 */
        pdp_device odd = {(pdp_device_kind)9, 0}, cpu3 = {PDP_DEVICE_CPU, 3};
        pdp_model_desc md;
        pdp_model *m = NULL;
        ASSERT_ENUM_EQ(PDP_ERR_DEVICE, pdp_tensor_create(&t, odd, 2, s2), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "pdp_tensor_create: device {kind 9, ordinal 0}"));
        ASSERT_ENUM_EQ(PDP_ERR_DEVICE, pdp_tensor_create_ids(&t, cpu3, 2, s2), pdp_status_name);
        ASSERT(strstr(pdp_last_error(), "{kind 0, ordinal 3}"));
        memset(&md, 0, sizeof md);
        md.input_shape[0] = 4;
        md.device = cpu3;
        ASSERT_ENUM_EQ(PDP_ERR_DEVICE, pdp_model_create(&m, &md), pdp_status_name);
        ASSERT(m == NULL && strstr(pdp_last_error(), "pdp_model_create: device"));
    }
    { /* a hand-made tensor with ndim 5: its message formats the shape it can */
        pdp_tensor bad, v;
        int64_t sixteen[1] = {16};
        float d[15];
        pdp_tensor_wrap(d, pdp_cpu(), 2, s2, &bad);
        bad.ndim = 5;
        ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_reshape_view(&bad, 1, sixteen, &v),
                       pdp_status_name);
    }
    PASS();
}

TEST tensor_cuda_without_pdp_cuda_is_unsupported(void)
{
#ifndef PDP_CUDA
    pdp_tensor *t;
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_tensor_create(&t, pdp_cuda(0), 2, s2), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "PDP_CUDA"));
    PASS();
#else
    SKIPm("built with PDP_CUDA");
#endif
}

TEST tensor_views_share_data_and_check_counts(void)
{
    pdp_tensor *t;
    pdp_tensor v, rows;
    int64_t flat[1] = {15}, bad[2] = {4, 4};
    int64_t i;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cpu(), 2, s2), pdp_status_name);
    for (i = 0; i < 15; i++) t->data[i] = (float)i;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_reshape_view(t, 1, flat, &v), pdp_status_name);
    ASSERT(v.data == t->data && !v.owns_data && v.count == 15 && v.ndim == 1);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_reshape_view(t, 2, bad, &v), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "[3, 5] has 15 elements, new shape has 16"));
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(t, 1, 2, &rows), pdp_status_name);
    ASSERT_EQ(5.0f, rows.data[0]);
    ASSERT_EQ(10, rows.count);
    ASSERT_EQ(2, rows.shape[0]);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_rows_view(t, 2, 2, &rows), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "rows [2, 4) outside [3, 5]"));
    pdp_tensor_free(t);
    PASS();
}

/* Issue 13, item 2: first + rows overflowed, so the bounds check passed (the element-count
   check of the wrap stopped it, after a signed overflow that UBSan reports). */
TEST tensor_sizes_that_overflow_fail(void)
{
    pdp_tensor *t, *u, rows;
    int64_t big[2] = {(int64_t)1 << 31, (int64_t)1 << 30};
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cpu(), 2, s2), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_rows_view(t, 2, INT64_MAX, &rows), pdp_status_name);
    ASSERT(strstr(pdp_last_error(),
                  "pdp_tensor_rows_view: 9223372036854775807 rows from row 2 outside [3, 5]"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_rows_view(t, INT64_MAX, 1, &rows), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_rows_view(t, 1, 3, &rows), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "rows [1, 4) outside [3, 5]"));
    /* 2^61 elements: their bytes overflow a 64-bit size at 8 bytes each; a shape error
       (it was PDP_ERR_OUT_OF_MEMORY, after multiplying), before any allocation */
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_create(&u, pdp_cpu(), 2, big), pdp_status_name);
    ASSERT(u == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_tensor_create: element count overflows at dimension 1"));
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_wrap(t->data, pdp_cpu(), 2, big, &rows),
                   pdp_status_name);
    pdp_tensor_free(t);
    PASS();
}

TEST tensor_copy_checks_count(void)
{
    pdp_tensor *a, *b, *c;
    int64_t s3[1] = {15}, s4[1] = {4};
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&a, pdp_cpu(), 2, s2), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&b, pdp_cpu(), 1, s3), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&c, pdp_cpu(), 1, s4), pdp_status_name);
    pdp_tensor_fill(a, 7.0f);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_copy(b, a), pdp_status_name);
    ASSERT_EQ(7.0f, b->data[14]);
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_copy(c, a), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_tensor_copy: destination [4] and source [3, 5]"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_copy(NULL, a), pdp_status_name);
    pdp_tensor_free(a);
    pdp_tensor_free(b);
    pdp_tensor_free(c);
    PASS();
}

/* Copies carry the dtype: int32 ids copied into a float32 tensor's memory make it an int32
   tensor with the same bits (the way ids reach a device buffer); upload and download move
   count elements of the tensor's dtype; elements of another size are refused by name. */
TEST tensor_copy_upload_and_download_carry_ids(void)
{
    int32_t ids[6] = {7, -1, 255, 0, 3, 65536}, back[6] = {0, 0, 0, 0, 0, 0};
    int64_t shape[2] = {2, 3};
    pdp_tensor *f;
    pdp_tensor host, half;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&f, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &host), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_copy(f, &host), pdp_status_name);
    ASSERT_EQ(PDP_DTYPE_I32, f->dtype);
    ASSERT(pdp_tensor_ids(f) && memcmp(pdp_tensor_ids(f), ids, sizeof ids) == 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(f, back), pdp_status_name);
    ASSERT(memcmp(back, ids, sizeof ids) == 0);
    ids[2] = 9;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(f, ids), pdp_status_name);
    ASSERT_EQ(9, pdp_tensor_ids(f)[2]);
    half = host;
    half.dtype = PDP_DTYPE_BF16;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_copy(f, &half), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "destination int32 [2, 3] and source bfloat16 [2, 3]"));
    ASSERT_EQ(PDP_DTYPE_I32, f->dtype); /* a refused copy changes nothing */
    pdp_tensor_free(f);
    PASS();
}

/* pdp_tensor_create_ids: an owned int32 tensor, zero-filled, that takes int32 ids in and out
   and keeps its dtype through views; bad shapes are refused in its own name. */
TEST tensor_create_ids_owns_int32_elements(void)
{
    int32_t ids[6] = {7, -1, 255, 0, 3, 65536}, back[6] = {0, 0, 0, 0, 0, 0};
    int64_t shape[2] = {2, 3}, zero[2] = {2, 0};
    pdp_tensor *t = NULL;
    pdp_tensor r;
    int i;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create_ids(&t, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_EQ(PDP_DTYPE_I32, t->dtype);
    ASSERT(t->owns_data);
    ASSERT_EQ(6, t->count);
    ASSERT_EQ(0, (int)((uintptr_t)t->data % 64));
    ASSERT(pdp_tensor_ids(t) != NULL);
    for (i = 0; i < 6; i++) ASSERT_EQ(0, pdp_tensor_ids(t)[i]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_upload(t, ids), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_download(t, back), pdp_status_name);
    ASSERT(memcmp(back, ids, sizeof ids) == 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(t, 1, 1, &r), pdp_status_name);
    ASSERT_EQ(PDP_DTYPE_I32, r.dtype);
    ASSERT_EQ(65536, pdp_tensor_ids(&r)[2]);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_fill(t, 1.0f), pdp_status_name);
    pdp_tensor_free(t);
    t = (pdp_tensor *)&t;
    ASSERT_ENUM_EQ(PDP_ERR_SHAPE, pdp_tensor_create_ids(&t, pdp_cpu(), 2, zero), pdp_status_name);
    ASSERT(t == NULL);
    ASSERT(strstr(pdp_last_error(), "pdp_tensor_create_ids: dimension 1 is 0"));
#ifndef PDP_CUDA
    ASSERT_ENUM_EQ(PDP_ERR_UNSUPPORTED, pdp_tensor_create_ids(&t, pdp_cuda(0), 2, shape),
                   pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_tensor_create_ids"));
#endif
    PASS();
}

/* The first outputs of PCG32 with seed 42, stream 54 as published with the
   reference implementation (pcg32-demo). */
TEST tensor_ids_wrap_keep_their_dtype_through_views(void)
{
    int32_t ids[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {2, 3}, flat[1] = {6};
    pdp_tensor t, v, r;
    pdp_rng rng;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap_ids(ids, pdp_cpu(), 2, shape, &t), pdp_status_name);
    ASSERT_EQ(PDP_DTYPE_I32, t.dtype);
    ASSERT_EQ(ids, pdp_tensor_ids(&t));
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_rows_view(&t, 1, 1, &r), pdp_status_name);
    ASSERT_EQ(PDP_DTYPE_I32, r.dtype);
    ASSERT_EQ(4, pdp_tensor_ids(&r)[0]);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_reshape_view(&t, 1, flat, &v), pdp_status_name);
    ASSERT_EQ(PDP_DTYPE_I32, v.dtype);
    ASSERT_EQ(6, pdp_tensor_ids(&v)[5]);
    /* float initialisers refuse ids, naming what the tensor holds */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_fill(&t, 1.0f), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "int32"));
    pdp_rng_seed(&rng, 1, 0);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_uniform(&t, &rng, 0, 1), pdp_status_name);
    ASSERT_EQ(1, ids[0]);
    /* a float wrap is float, and has no ids */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap((float *)(void *)ids, pdp_cpu(), 1, flat, &v),
                   pdp_status_name);
    ASSERT_EQ(PDP_DTYPE_F32, v.dtype);
    ASSERT(pdp_tensor_ids(&v) == NULL);
    PASS();
}

TEST rng_matches_reference_pcg32(void)
{
    static const uint32_t expect[6] = {0xa15c02b7u, 0x7b47f409u, 0xba1d3330u,
                                       0x83d2f293u, 0xbfa4784bu, 0xcbed606eu};
    pdp_rng r;
    int i;
    pdp_rng_seed(&r, 42, 54);
    for (i = 0; i < 6; i++) ASSERT_EQ_FMT(expect[i], pdp_rng_u32(&r), "0x%08x");
    PASS();
}

TEST rng_streams_are_deterministic_and_distinct(void)
{
    pdp_rng a, b, c;
    int i, same = 0;
    pdp_rng_seed(&a, 7, 1);
    pdp_rng_seed(&b, 7, 1);
    pdp_rng_seed(&c, 7, 2);
    for (i = 0; i < 1000; i++) {
        uint32_t x = pdp_rng_u32(&a);
        ASSERT_EQ(x, pdp_rng_u32(&b));
        same += x == pdp_rng_u32(&c);
    }
    ASSERT(same < 3);
    PASS();
}

TEST rng_uniform_and_normal_moments(void)
{
    pdp_rng r;
    const int n = 200000;
    double su = 0, su2 = 0, sn = 0, sn2 = 0;
    float lo = 1, hi = 0;
    int i;
    uint32_t counts[7] = {0};
    pdp_rng_seed(&r, 123, 0);
    for (i = 0; i < n; i++) {
        float u = pdp_rng_uniform(&r), g = pdp_rng_normal(&r);
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
        su += u;
        su2 += (double)u * u;
        sn += g;
        sn2 += (double)g * g;
        counts[pdp_rng_below(&r, 7)]++;
    }
    ASSERT(lo >= 0.0f && hi < 1.0f);
    ASSERT_IN_RANGE(0.5, su / n, 0.005);
    ASSERT_IN_RANGE(1.0 / 12.0, su2 / n - (su / n) * (su / n), 0.002);
    ASSERT_IN_RANGE(0.0, sn / n, 0.01);
    ASSERT_IN_RANGE(1.0, sn2 / n, 0.02);
    for (i = 0; i < 7; i++) ASSERT_IN_RANGE(n / 7.0, (double)counts[i], n / 7.0 * 0.05);
    PASS();
}

TEST rng_initialisers_respect_bounds(void)
{
    pdp_tensor *t;
    pdp_rng r;
    int64_t shape[2] = {64, 100}, i;
    float bound_k = 1.0f / sqrtf(100.0f), bound_x = sqrtf(6.0f / 164.0f), mx = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cpu(), 2, shape), pdp_status_name);
    pdp_rng_seed(&r, 1, 0);
    /* a = sqrt(5): PyTorch's Linear default, bound 1/sqrt(fan_in) */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_kaiming_uniform(t, &r, 100, sqrtf(5.0f)), pdp_status_name);
    for (i = 0; i < t->count; i++) mx = fabsf(t->data[i]) > mx ? fabsf(t->data[i]) : mx;
    ASSERT(mx <= bound_k * 1.0001f && mx > bound_k * 0.95f);
    mx = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_xavier_uniform(t, &r, 100, 64), pdp_status_name);
    for (i = 0; i < t->count; i++) mx = fabsf(t->data[i]) > mx ? fabsf(t->data[i]) : mx;
    ASSERT(mx <= bound_x * 1.0001f && mx > bound_x * 0.95f);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_kaiming_uniform(t, &r, 0, 0.0f), pdp_status_name);
    /* each draw is lo + (hi - lo) u rounded once (the exact value's nearest float, here
       through long double), whether or not the build fuses the multiply and the add: the
       same initial parameters in every build */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_uniform(t, &r, -0.3f, 0.7f), pdp_status_name);
    pdp_rng_seed(&r, 1, 0);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_kaiming_uniform(t, &r, 100, sqrtf(5.0f)), pdp_status_name);
    pdp_rng_seed(&r, 1, 0);
    for (i = 0; i < t->count; i++) {
        long double u = pdp_rng_uniform(&r), lo = -bound_k, w = 2.0f * bound_k;
        ASSERT_EQ_FMT((double)(float)(lo + w * u), (double)t->data[i], "%.9g");
    }
    /* what torch.nn.init refuses: an empty or reversed range, a negative or NaN std */
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_uniform(t, &r, 1.0f, 0.0f), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_tensor_uniform: [1, 0) (finite, lo <= hi)"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_uniform(t, &r, 0.0f, INFINITY), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_normal(t, &r, 0.0f, -1.0f), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_tensor_normal: mean 0, std -1 (finite, std >= 0)"));
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_normal(t, &r, NAN, 1.0f), pdp_status_name);
    pdp_tensor_free(t);
    PASS();
}

/* A range whose width passes FLT_MAX (torch's uniform_ refuses it) would make every draw Inf
   or NaN with PDP_OK; xavier's fan_in + fan_out past INT64_MAX was a signed overflow (UB) that
   failed naming a range [nan, -nan). */
TEST rng_initialisers_refuse_ranges_that_overflow(void)
{
    float v[64];
    int64_t n = 64, i;
    pdp_tensor t;
    pdp_rng r;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_wrap(v, pdp_cpu(), 1, &n, &t), pdp_status_name);
    pdp_rng_seed(&r, 1, 0);
    for (i = 0; i < n; i++) v[i] = 7.0f;
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_uniform(&t, &r, -3e38f, 3e38f), pdp_status_name);
    ASSERT(strstr(pdp_last_error(), "pdp_tensor_uniform: [-3e+38, 3e+38)"));
    ASSERT(strstr(pdp_last_error(), "FLT_MAX"));
    for (i = 0; i < n; i++) ASSERT_EQ_FMT(7.0, (double)v[i], "%g"); /* untouched */
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_uniform(&t, &r, -1e38f, 1e38f), pdp_status_name);
    for (i = 0; i < n; i++) ASSERT(v[i] >= -1e38f && v[i] <= 1e38f);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_xavier_uniform(&t, &r, INT64_MAX, INT64_MAX),
                   pdp_status_name);
    for (i = 0; i < n; i++) ASSERT(isfinite(v[i]) && fabsf(v[i]) < 1e-9f);
    PASS();
}

TEST rng_tensor_normal_moments_and_determinism(void)
{
    pdp_tensor *t, *u;
    pdp_rng r;
    int64_t shape[2] = {400, 500}, i, within = 0;
    const float mean = 3.0f, std = 0.5f;
    double s = 0, s2 = 0;
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&t, pdp_cpu(), 2, shape), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_create(&u, pdp_cpu(), 2, shape), pdp_status_name);
    pdp_rng_seed(&r, 99, 3);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_normal(t, &r, mean, std), pdp_status_name);
    for (i = 0; i < t->count; i++) {
        double x = t->data[i];
        s += x;
        s2 += x * x;
        within += fabs(x - mean) < std;
    }
    /* 200000 samples: standard errors 0.0011 (mean), 0.0008 (variance), 0.001 (fraction) */
    ASSERT_IN_RANGE(mean, s / t->count, 0.005);
    ASSERT_IN_RANGE((double)std * std, s2 / t->count - (s / t->count) * (s / t->count), 0.005);
    ASSERT_IN_RANGE(0.6827, (double)within / t->count, 0.005);
    /* the same seed and stream give the same bits: mean + std * pdp_rng_normal, in order
       (0.5 x: exact, so one rounding either way) */
    pdp_rng_seed(&r, 99, 3);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_normal(u, &r, mean, std), pdp_status_name);
    ASSERT_MEM_EQ(t->data, u->data, (size_t)t->count * sizeof(float));
    pdp_rng_seed(&r, 99, 3);
    for (i = 0; i < 100; i++) ASSERT_EQ(mean + std * pdp_rng_normal(&r), t->data[i]);
    /* another seed, other numbers */
    pdp_rng_seed(&r, 100, 3);
    ASSERT_ENUM_EQ(PDP_OK, pdp_tensor_normal(u, &r, mean, std), pdp_status_name);
    for (i = 0, within = 0; i < u->count; i++) within += u->data[i] == t->data[i];
    ASSERT(within < 10);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_normal(NULL, &r, 0.0f, 1.0f), pdp_status_name);
    ASSERT_ENUM_EQ(PDP_ERR_INVALID, pdp_tensor_normal(t, NULL, 0.0f, 1.0f), pdp_status_name);
    pdp_tensor_free(t);
    pdp_tensor_free(u);
    PASS();
}

TEST base_status_names_and_version(void)
{
    ASSERT_STR_EQ("PDP_ERR_TIMEOUT", pdp_status_name(PDP_ERR_TIMEOUT));
    ASSERT_STR_EQ("PDP_OK", pdp_status_name(PDP_OK));
    ASSERT_STR_EQ("PDP_UNKNOWN_STATUS", pdp_status_name((pdp_status)-999));
    ASSERT_STR_EQ(PDP_VERSION_STRING, pdp_version_string());
    pdp__err(PDP_ERR_SHAPE, "inner %d", 3);
    pdp__err_wrap(PDP_ERR_SHAPE, "outer");
    ASSERT_STR_EQ("outer: inner 3", pdp_last_error());
    pdp_clear_error();
    ASSERT_STR_EQ("", pdp_last_error());
    PASS();
}

SUITE(tensor)
{
    RUN_TEST(tensor_create_is_zeroed_and_aligned);
    RUN_TEST(tensor_bad_shapes_fail_with_messages);
    RUN_TEST(tensor_cuda_without_pdp_cuda_is_unsupported);
    RUN_TEST(tensor_views_share_data_and_check_counts);
    RUN_TEST(tensor_sizes_that_overflow_fail);
    RUN_TEST(tensor_copy_checks_count);
    RUN_TEST(tensor_copy_upload_and_download_carry_ids);
    RUN_TEST(tensor_create_ids_owns_int32_elements);
    RUN_TEST(base_status_names_and_version);
}

SUITE(rng)
{
    RUN_TEST(tensor_ids_wrap_keep_their_dtype_through_views);
    RUN_TEST(rng_matches_reference_pcg32);
    RUN_TEST(rng_streams_are_deterministic_and_distinct);
    RUN_TEST(rng_uniform_and_normal_moments);
    RUN_TEST(rng_initialisers_respect_bounds);
    RUN_TEST(rng_initialisers_refuse_ranges_that_overflow);
    RUN_TEST(rng_tensor_normal_moments_and_determinism);
}

GREATEST_MAIN_DEFS();

int main(int argc, char **argv)
{
    GREATEST_MAIN_BEGIN();
    RUN_SUITE(tensor);
    RUN_SUITE(rng);
    GREATEST_MAIN_END();
}
