/* math: element math written once for the CPU (layers.c, optim.c, and gemm_bf16.c's
   rounding to bf16) and for the CUDA kernels of pdp_cuda.cu.

   pdp.h emits this block after the public API and outside the implementation
   guard, so pdp_cuda.cu includes it without the CPU implementation, and the CPU
   tests cover the very formulas the kernels run. Every helper is `static inline
   PDP__HOSTDEV`: __host__ __device__ under nvcc, nothing otherwise. Only <math.h>
   float functions and integer arithmetic are used, so the dropout hash gives the
   same bits on both sides. */

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#  define PDP__HOSTDEV __host__ __device__
#else
#  define PDP__HOSTDEV
#endif

/* ---- math: activations ----
   Each forward helper has a backward partner that returns dL/dx from the
   upstream gradient and whatever forward value is cheapest to reuse (x for GELU,
   y for the others). */

/* NaN propagates (torch.relu(nan) is nan): the test is x <= 0, false for NaN. */
static inline PDP__HOSTDEV float pdp__relu(float x) { return x <= 0.0f ? 0.0f : x; }
/* From the output, as PyTorch's threshold_backward(dy, y, 0): 0 where y <= 0, dy
   elsewhere, so dy passes where x > 0 and where x is NaN (y is NaN there too). */
static inline PDP__HOSTDEV float pdp__relu_grad(float dy, float y) { return y <= 0.0f ? 0.0f : dy; }

/* GELU, tanh approximation (PyTorch's approximate='tanh', Hendrycks and Gimpel
   2016): 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as the
   same function x sigmoid(2u) = x / (1 + e), e = exp(-2u): 1 + tanh(u) cancels for
   x < 0 (tanhf's error relative to 1 + tanh(u) grows as e^(2|u|): PyTorch's
   gelu(-5) is 30% off), the quotient does not. Where e overflows (u < -44) the value
   is x 0 (-0, and NaN for -inf, as PyTorch's); NaN gives NaN. layers.c's vectorised
   kernels compute the same formula, operation by operation, with their own exp. */
#define PDP__GELU_C 0.7978845608028654f /* sqrt(2 / pi) */
#define PDP__GELU_A 0.044715f
#define PDP__GELU_UMAX 44.0f /* |u| beyond which e = exp(-2u) overflows or is < 2^-126 */
static inline PDP__HOSTDEV float pdp__gelu_u(float x)
{
    return PDP__GELU_C * (x + PDP__GELU_A * (x * x) * x);
}
static inline PDP__HOSTDEV float pdp__gelu(float x)
{
    float u = pdp__gelu_u(x);
    return u < -PDP__GELU_UMAX ? x * 0.0f : x / (1.0f + expf(-2.0f * u));
}
/* d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) du/dx, t = tanh(u), du/dx = c (1 + 3 a x^2);
   with s = sigmoid(2u) = 1 / (1 + e), 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s) =
   4 s e s: d/dx = s (1 + 2 x du/dx e s). Beyond |u| = 44 the limits 1 (x > 0) and 0
   (x < 0), which ±inf gets too (the formula would give inf 0 = NaN there). */
static inline PDP__HOSTDEV float pdp__gelu_grad(float dy, float x)
{
    float u = pdp__gelu_u(x), e, s, du;
    if (u > PDP__GELU_UMAX) return dy;
    if (u < -PDP__GELU_UMAX) return dy * 0.0f;
    e = expf(-2.0f * u);
    s = 1.0f / (1.0f + e);
    du = PDP__GELU_C * (1.0f + 3.0f * PDP__GELU_A * (x * x));
    return dy * (s * (1.0f + 2.0f * x * du * (e * s)));
}

/* GELU, exact (PyTorch's nn.GELU(), approximate='none'; nanoGPT's MLP): x Phi(x) =
   0.5 x (1 + erf(x / sqrt 2)); its gradient Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) /
   sqrt(2 pi), as PyTorch's GeluBackward computes it. */
#define PDP__SQRT1_2 0.70710678118654752f    /* 1 / sqrt(2) */
#define PDP__INV_SQRT_2PI 0.39894228040143268f /* 1 / sqrt(2 pi) */
static inline PDP__HOSTDEV float pdp__gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erff(x * PDP__SQRT1_2));
}
static inline PDP__HOSTDEV float pdp__gelu_erf_grad(float dy, float x)
{
    float cdf = 0.5f * (1.0f + erff(x * PDP__SQRT1_2));
    float pdf = expf(-0.5f * x * x) * PDP__INV_SQRT_2PI;
    return dy * (cdf + x * pdf);
}

static inline PDP__HOSTDEV float pdp__tanh_grad(float dy, float y) { return dy * (1.0f - y * y); }

/* 1 / (1 + e^-x), written so that neither branch overflows. */
static inline PDP__HOSTDEV float pdp__sigmoid(float x)
{
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    {
        float e = expf(x);
        return e / (1.0f + e);
    }
}
static inline PDP__HOSTDEV float pdp__sigmoid_grad(float dy, float y)
{
    return dy * y * (1.0f - y);
}

/* SiLU (swish; Elfwing et al. 2017, Ramachandran et al. 2017): x sigmoid(x), the
   activation of modern MLPs (SwiGLU's gate). Its gradient from x, as PyTorch's
   silu_backward: dy s (1 + x (1 - s)), s = sigmoid(x). */
static inline PDP__HOSTDEV float pdp__silu(float x) { return x * pdp__sigmoid(x); }
static inline PDP__HOSTDEV float pdp__silu_grad(float dy, float x)
{
    float s = pdp__sigmoid(x);
    return dy * s * (1.0f + x * (1.0f - s));
}

/* ---- math: dropout masks ----
   The mask bit of element j of sample s is a pure function of
   (seed, layer, step, s, j): a counter-based generator in the style of
   Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), built
   from SplitMix64's finaliser (Steele, Lea and Flood, OOPSLA 2014). Nothing is
   carried from one element to the next, so any split of a batch (DP replicas
   with their sample_base, CUDA threads) draws exactly the masks that one device
   draws for the whole batch. An element is kept when the top 24 bits of its hash
   are >= the threshold floor(p * 2^24): probability 1 - p up to 2^-24. */

static inline PDP__HOSTDEV uint64_t pdp__mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The key of one sample; element j's draw is pdp__dropout_bits(key, j). */
static inline PDP__HOSTDEV uint64_t pdp__dropout_key(uint64_t seed, int layer, uint64_t step,
                                                     int64_t sample)
{
    uint64_t k = pdp__mix64(seed + UINT64_C(0x9e3779b97f4a7c15) * (uint64_t)(layer + 1));
    k = pdp__mix64(k ^ (step * 0xd1b54a32d192ed03ull));
    return pdp__mix64(k ^ ((uint64_t)sample * 0x8cb92ba72f3d8dd7ull));
}

/* 24 uniform bits for element j of the sample with this key. */
static inline PDP__HOSTDEV uint32_t pdp__dropout_bits(uint64_t key, int64_t j)
{
    return (uint32_t)(pdp__mix64(key + 0x9e3779b97f4a7c15ull * (uint64_t)(j + 1)) >> 40);
}

/* floor(p * 2^24), computed in float exactly as on the device. */
static inline PDP__HOSTDEV uint32_t pdp__dropout_threshold(float p)
{
    return (uint32_t)(p * 16777216.0f);
}

/* ---- math: optimizer element updates ----
   One parameter element of torch.optim.SGD, Adam and AdamW (PyTorch 1.13+,
   single-tensor path, maximize=False), in PyTorch's operation order so the
   bits follow it. The caller turns the hyper-parameters into per-step float
   scalars once (in double on the host, as PyTorch does in Python), and both
   the CPU loop of optim.c and a CUDA kernel call these per element.

   SGD:   d = g + wd p;  b = first ? d : momentum b + (1 - dampening) d;
          d = nesterov ? d + momentum b : b (momentum > 0 only);  p -= lr d.
   Adam:  g += l2 p (Adam's weight decay; 0 for AdamW);  m = beta1 m + (1 - beta1) g;
          v = beta2 v + (1 - beta2) g g;  p = p decay (AdamW's 1 - lr wd; 1 for
          Adam) - step_size m / (sqrt(v) / bc2_sqrt + eps),
          step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t).
   Adam is split in two halves around the square root so that a CPU loop can
   take sqrt of a whole block at once (sqrtf itself blocks auto-vectorisation
   while errno is on); pdp__adam_update is the two halves for one element. */

/* x != 0 for the finite hyper-parameters (validated by optim.c), written without == on
   floats so that the block stays quiet under a user's -Wfloat-equal. */
static inline PDP__HOSTDEV int pdp__nonzero(float x) { return x < 0.0f || x > 0.0f; }

/* SGD without momentum. */
static inline PDP__HOSTDEV float pdp__sgd_update(float p, float g, float lr, float weight_decay)
{
    float d = pdp__nonzero(weight_decay) ? g + weight_decay * p : g;
    return p - lr * d;
}

/* SGD with momentum > 0; *buf is the element's momentum buffer.
   one_minus_damp = 1 - dampening; first: the buffer becomes d (PyTorch's clone
   on the first step). */
static inline PDP__HOSTDEV float pdp__sgd_momentum_update(float p, float g, float *buf, float lr,
                                                          float momentum, float one_minus_damp,
                                                          float weight_decay, int nesterov,
                                                          int first)
{
    float d = pdp__nonzero(weight_decay) ? g + weight_decay * p : g;
    float old = *buf;
    float b = first ? d : momentum * old + one_minus_damp * d;
    *buf = b;
    d = nesterov ? d + momentum * b : b;
    return p - lr * d;
}

/* Adam/AdamW, first half: the moments *m and *v of one element. */
static inline PDP__HOSTDEV void pdp__adam_moments(float p, float g, float *m, float *v, float beta1,
                                                  float one_minus_beta1, float beta2,
                                                  float one_minus_beta2, float l2)
{
    if (pdp__nonzero(l2)) g = g + l2 * p;
    *m = beta1 * *m + one_minus_beta1 * g;
    *v = beta2 * *v + one_minus_beta2 * g * g;
}

/* Adam/AdamW, second half: the new parameter from m and sqrt(v). */
static inline PDP__HOSTDEV float pdp__adam_apply(float p, float m, float sqrt_v, float step_size,
                                                 float bc2_sqrt, float eps, float decay)
{
    return p * decay - step_size * m / (sqrt_v / bc2_sqrt + eps);
}

/* Adam/AdamW, one element: both halves. */
static inline PDP__HOSTDEV float pdp__adam_update(float p, float g, float *m, float *v, float beta1,
                                                  float one_minus_beta1, float beta2,
                                                  float one_minus_beta2, float step_size,
                                                  float bc2_sqrt, float eps, float l2, float decay)
{
    pdp__adam_moments(p, g, m, v, beta1, one_minus_beta1, beta2, one_minus_beta2, l2);
    return pdp__adam_apply(p, *m, sqrtf(*v), step_size, bc2_sqrt, eps, decay);
}

/* ---- math: bf16 ----
   bfloat16 is the top half of an IEEE fp32 (1 sign, 8 exponent, 7 mantissa bits).
   pdp__bf16_bits rounds an fp32 to it as PyTorch's c10::BFloat16 and the hardware's
   vcvtneps2bf16 do: round to nearest, ties to even, on the 16 bits dropped; a NaN
   stays a NaN (quiet bit set, sign kept) instead of rounding into an Inf. Overflow
   rounds to Inf; subnormals round like any other value. pdp__bf16_float widens
   (exact), so pdp__bf16_round(x) is x as a bf16 seen as an fp32. Products of two
   bf16 values are exact in fp32 (8 x 8 significant bits) unless they underflow. */
/* The rounding on the fp32 bits u: the bf16's bits in the top half, zeros below. One
   select, no branch, so that loops over it vectorise (layers_conv.c's pdp__conv_bf16). */
static inline PDP__HOSTDEV uint32_t pdp__bf16_round_u32(uint32_t u)
{
    return (u & 0x7fffffffu) > 0x7f800000u ? (u | 0x00400000u) & 0xffff0000u /* NaN: quiet */
                                           : (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
}
static inline PDP__HOSTDEV uint16_t pdp__bf16_bits(float x)
{
    union { float f; uint32_t u; } v;
    v.f = x;
    return (uint16_t)(pdp__bf16_round_u32(v.u) >> 16);
}
static inline PDP__HOSTDEV float pdp__bf16_float(uint16_t h)
{
    union { float f; uint32_t u; } v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline PDP__HOSTDEV float pdp__bf16_round(float x)
{
    return pdp__bf16_float(pdp__bf16_bits(x));
}

/* ---- math: fp16 ----
   IEEE binary16 (1 sign, 5 exponent, 10 mantissa bits; largest finite 65504,
   subnormals down to 2^-24). pdp__f16_bits rounds an fp32 to it as the hardware's
   vcvtps2ph and CUDA's __float2half_rn do: round to nearest, ties to even, with
   gradual underflow (subnormal halves) and overflow to Inf from 65520 up; a NaN
   stays a NaN (quiet bit set, sign kept). pdp__f16_float widens (exact). */
static inline PDP__HOSTDEV uint16_t pdp__f16_bits(float x)
{
    union { float f; uint32_t u; } v;
    uint32_t sign, a, m, r, rem, half;
    int shift;
    v.f = x;
    sign = (v.u >> 16) & 0x8000u;
    a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: Inf */
    if (a >= 0x38800000u) {                                   /* >= 2^-14: a normal half */
        a -= 0x38000000u;                                     /* exponent bias 127 -> 15 */
        return (uint16_t)(sign | ((a + 0xfffu + ((a >> 13) & 1u)) >> 13));
    }
    if (a <= 0x33000000u) return (uint16_t)sign; /* <= 2^-25: zero (2^-25 ties to even) */
    m = (a & 0x7fffffu) | 0x800000u;              /* value m 2^(e - 150); a unit is 2^-24 */
    shift = 126 - (int)(a >> 23);                 /* 14..23 */
    r = m >> shift;
    rem = m & ((1u << shift) - 1u);
    half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}
static inline PDP__HOSTDEV float pdp__f16_float(uint16_t h)
{
    union { float f; uint32_t u; } v;
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16, e = ((uint32_t)h >> 10) & 0x1fu,
             m = (uint32_t)h & 0x3ffu;
    if (e == 0x1fu) {
        v.u = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) { /* zero or subnormal: m 2^-24, exact in fp32 */
        v.f = (float)m * 5.9604644775390625e-8f;
        v.u |= sign;
    } else {
        v.u = sign | ((e + 112u) << 23) | (m << 13);
    }
    return v.f;
}
static inline PDP__HOSTDEV float pdp__f16_round(float x)
{
    return pdp__f16_float(pdp__f16_bits(x));
}
