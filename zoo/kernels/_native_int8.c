/* zoo's int8 kernels: float32 rows against int8 weight rows, the arithmetic of PyTorch's
 * dynamic quantized linear on FBGEMM (torch.ao.nn.quantized.dynamic.Linear with per-row weight
 * scales), to the bit: one row (zoo_gemv_int8), many rows as FBGEMM quantizes a whole input
 * (zoo_linear_int8), or each row as it would be alone (zoo_gemm_int8, a slot batch's rows).
 *
 * FBGEMM's steps for one row x (K) and weights q (N, K) int8 with scales s (N), zero points 0
 * (for several rows, step 1 reads all of them and each row is quantized with the result):
 *   1. min and max of x (FindMinMax), and the activation's scale and zero point from them
 *      (ChooseQuantizationParams over [0, 255] with reduce_range: [0, 127], in double;
 *      the scale is then rounded to float);
 *   2. xq[k] = clamp(round_to_even(fma(x[k], 1 / scale, zero_point)), 0, 255) (QuantizeAvx2,
 *      its LEGACY form, with the reciprocal rounded to float);
 *   3. acc[n] = sum_k xq[k] * q[n, k] in int32 (exact: the pairs vpmaddubsw adds stay within
 *      int16, since xq <= 128 and |q| <= 128 give |pair| <= 32768 with -32768 the only
 *      value at the edge);
 *   4. y[n] = float(acc[n] - zero_point * colsum[n]) * (scale * s[n]) (+ bias[n]), with the
 *      bias added in one fused multiply-add as FBGEMM's build contracts it
 *      (requantizeForFloatAvx2, OUT_CHANNEL).
 * tests/test_native_int8.py compares the result with torch's for random rows and shapes.
 *
 * The rows are split among OpenMP threads in fixed blocks as in zoo_gemv_f32 (_native.c,
 * which holds the module's init and zoo_native_supported); each output is computed by one
 * thread in a fixed order, so the result does not depend on the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define ZOO_X86 1
#include <immintrin.h>
#endif

int zoo_native_vnni(void); /* _native.c: whether the int8 products run on AVX-512 VNNI */

/* Rows a thread takes at a time: 32 rows of 768 int8 values are 24 KiB. */
#define INT8_ROWS_PER_TASK 32

/* How far ahead of the row being summed its bytes are asked into the second level cache: 32
 * KiB (1 KiB into the first level cache kept one thread from reading as fast as it could:
 * docs/benchmarks.md, "Figures behind design choices"). */
#define PREFETCH 32768

/* FBGEMM's SMALL_SCALE_THRESHOLD (ATen's QuantUtils.h). */
#define SMALL_SCALE 6.1e-5f

/* The activation's scale and zero point for values in [lo, hi]: ATen's
 * quant_utils::ChooseQuantizationParams(lo, hi, 0, 255, preserve_sparsity=false,
 * force_scale_power_of_two=false, reduce_range=true), the same operations in the same
 * precisions. */
static void choose_params(float lo, float hi, float *scale_out, int32_t *zero_out) {
    const int32_t qmin = 0, qmax = 127; /* 0 / 2, 255 / 2 */
    lo = lo < 0.f ? lo : 0.f;
    hi = hi > 0.f ? hi : 0.f;
    double scale = ((double)hi - lo) / (qmax - qmin);
    if ((float)scale == 0.0f || isinf(1.0f / (float)scale)) scale = 0.1;
    if (scale < SMALL_SCALE) {
        float org_scale = (float)scale;
        scale = SMALL_SCALE;
        if (lo == 0.0f) {
            hi = SMALL_SCALE * (qmax - qmin);
        } else if (hi == 0.0f) {
            lo = -SMALL_SCALE * (qmax - qmin);
        } else {
            float amplifier = SMALL_SCALE / org_scale;
            lo *= amplifier;
            hi *= amplifier;
        }
    }
    double zero_from_min = qmin - lo / scale;
    double zero_from_max = qmax - hi / scale;
    double zero_from_min_error = fabs((double)qmin) - fabs(lo / scale);
    double zero_from_max_error = fabs((double)qmax) - fabs(hi / scale);
    double zero = zero_from_min_error < zero_from_max_error ? zero_from_min : zero_from_max;
    int32_t nudged;
    if (zero < qmin)
        nudged = qmin;
    else if (zero > qmax)
        nudged = qmax;
    else
        nudged = (int32_t)nearbyint(zero);
    *scale_out = (float)scale;
    *zero_out = nudged;
}

#ifdef ZOO_X86
/* Eight values x[0..8) quantized: x * inv + zero (inv = 1 / scale), capped as FBGEMM caps,
 * rounded to even and clamped to [0, 255], as int32 lanes. */
__attribute__((target("avx2,fma"))) static inline __m256i quantize8(const float *x, __m256 inv,
                                                                   __m256 zero, __m256 cap) {
    __m256 t = _mm256_min_ps(_mm256_fmadd_ps(_mm256_loadu_ps(x), inv, zero), cap);
    return _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(t), _mm256_setzero_si256()),
                            _mm256_set1_epi32(255));
}

/* xq[k] for k < K (step 2 above), and zeros up to `padded`. */
__attribute__((target("avx2,fma"))) static void quantize_row(
    const float *x, uint8_t *xq, int64_t K, int64_t padded, float scale, int32_t zero) {
    const float inv = 1.f / scale;
    const float cap = 2147483520.f; /* the largest float below INT32_MAX, as FBGEMM clips */
    const __m256 inv_v = _mm256_set1_ps(inv), zero_v = _mm256_set1_ps((float)zero);
    const __m256 cap_v = _mm256_set1_ps(cap);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) { /* each value in [0, 255]: the packs keep it exactly */
        const float *v = x + k;
        __m256i ab = _mm256_packus_epi32(quantize8(v, inv_v, zero_v, cap_v),
                                         quantize8(v + 8, inv_v, zero_v, cap_v));
        __m256i cd = _mm256_packus_epi32(quantize8(v + 16, inv_v, zero_v, cap_v),
                                         quantize8(v + 24, inv_v, zero_v, cap_v));
        __m256i bytes = _mm256_packus_epi16(ab, cd); /* per 128-bit lane: a b c d, four each */
        _mm256_storeu_si256((__m256i *)(xq + k), _mm256_permutevar8x32_epi32(bytes, order));
    }
    for (; k + 8 <= K; k += 8) {
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, quantize8(x + k, inv_v, zero_v, cap_v));
        for (int j = 0; j < 8; j++) xq[k + j] = (uint8_t)lanes[j];
    }
    for (; k < K; k++) {
        float t = fmaf(x[k], inv, (float)zero);
        t = t < cap ? t : cap;
        int32_t r = (int32_t)_mm_cvtss_si32(_mm_set_ss(t)); /* round to even, as cvtps */
        xq[k] = (uint8_t)(r < 0 ? 0 : r > 255 ? 255 : r);
    }
    memset(xq + K, 0, (size_t)(padded - K));
}

__attribute__((target("avx2,fma"))) static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* sum_k xq[k] * w[k] of 32 values: unsigned times signed bytes, pairs to int16, to int32. */
__attribute__((target("avx2,fma"))) static inline __m256i dot32(__m256i xv, const int8_t *w) {
    __m256i pairs = _mm256_maddubs_epi16(xv, _mm256_loadu_si256((const __m256i *)w));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

/* The same for 32 weights already loaded. */
__attribute__((target("avx2,fma"))) static inline __m256i dot32v(__m256i xv, __m256i wv) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(xv, wv), _mm256_set1_epi16(1));
}

/* The integer tail of a row past the last whole 32 values. */
static inline int32_t dot_tail(const uint8_t *xq, const int8_t *w, int64_t k, int64_t K) {
    int32_t s = 0;
    for (; k < K; k++) s += (int32_t)xq[k] * (int32_t)w[k];
    return s;
}

/* Step 4 for one output (in an avx2,fma function, where fmaf is one instruction). */
__attribute__((target("avx2,fma"))) static inline float epilogue(
    int32_t acc, int32_t zero, int32_t colsum, float x_scale, float w_scale, const float *bias,
    int64_t n) {
    int32_t raw = (int32_t)((uint32_t)acc - (uint32_t)zero * (uint32_t)colsum);
    float scale = x_scale * w_scale;
    return bias ? fmaf((float)raw, scale, bias[n]) : (float)raw * scale;
}

/* acc[n - n0] for n in [n0, n1), one row after another: the weights are read as one
 * sequential stream (four rows read side by side streamed slower: docs/benchmarks.md), asked
 * for PREFETCH bytes ahead; xq stays in L1. */
__attribute__((target("avx2,fma"))) static void int8_rows(
    const int8_t *W, const uint8_t *xq, int32_t *acc, int64_t n0, int64_t n1, int64_t K) {
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *w = W + n * K;
        __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
        int64_t k = 0;
        for (; k + 64 <= K; k += 64) {
            _mm_prefetch((const char *)(w + k + PREFETCH), _MM_HINT_T1);
            a0 = _mm256_add_epi32(a0, dot32(_mm256_loadu_si256((const __m256i *)(xq + k)), w + k));
            a1 = _mm256_add_epi32(
                a1, dot32(_mm256_loadu_si256((const __m256i *)(xq + k + 32)), w + k + 32));
        }
        if (k + 32 <= K) {
            a0 = _mm256_add_epi32(a0, dot32(_mm256_loadu_si256((const __m256i *)(xq + k)), w + k));
            k += 32;
        }
        acc[n - n0] = hsum_epi32(_mm256_add_epi32(a0, a1)) + dot_tail(xq, w, k, K);
    }
}

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

/* The sums of one weight row w with two quantized rows x0, x1 (x1 may be x0) on AVX-512 VNNI:
 * 64 byte products a row summed into sixteen int32 lanes by one instruction (vpdpbusd; exact,
 * as int8_rows' sums are), the rest one by one. One row alone gained nothing from it (its
 * products wait on memory), a few rows did: int8_task_many uses it, zoo_gemv_int8 does not. */
VNNI static inline void dot_two_vnni(const int8_t *w, const uint8_t *x0, const uint8_t *x1,
                                     int64_t K, int32_t *s0, int32_t *s1) {
    __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) {
        __m512i wv = _mm512_loadu_si512(w + k);
        a0 = _mm512_dpbusd_epi32(a0, _mm512_loadu_si512(x0 + k), wv);
        a1 = _mm512_dpbusd_epi32(a1, _mm512_loadu_si512(x1 + k), wv);
    }
    *s0 = _mm512_reduce_add_epi32(a0) + dot_tail(x0, w, k, K);
    *s1 = _mm512_reduce_add_epi32(a1) + dot_tail(x1, w, k, K);
}

/* y[n] for n in [n0, n1), at most INT8_ROWS_PER_TASK rows: steps 3 and 4. */
__attribute__((target("avx2,fma"))) static void int8_task(
    const int8_t *W, const uint8_t *xq, float *y, int64_t n0, int64_t n1, int64_t K,
    int32_t zero, const int32_t *colsum, float x_scale, const float *w_scale, const float *bias) {
    int32_t acc[INT8_ROWS_PER_TASK];
    int8_rows(W, xq, acc, n0, n1, K);
    for (int64_t n = n0; n < n1; n++)
        y[n] = epilogue(acc[n - n0], zero, colsum[n], x_scale, w_scale[n], bias, n);
}

/* What the products of many rows share: the quantized rows xq (M of them, `padded` bytes
 * apart, row m with its x_scale[m] and zero[m]), the weights and the output. */
typedef struct {
    const int8_t *W;
    const uint8_t *xq;
    int64_t padded, M, N, K;
    float *Y;
    const int32_t *zero, *colsum;
    const float *x_scale, *w_scale, *bias;
    int vnni;
} int8_many;

/* Step 4 of output (m, n) from its sum. */
__attribute__((target("avx2,fma"))) static inline void put(const int8_many *p, int64_t m,
                                                           int64_t n, int32_t acc) {
    p->Y[m * p->N + n] =
        epilogue(acc, p->zero[m], p->colsum[n], p->x_scale[m], p->w_scale[n], p->bias, n);
}

/* Y[m, n] for weight row n and the rows m in [m0, M) of xq, two rows at a time: steps 3 and
 * 4, the weight row read from memory once and from the first level cache for each further
 * pair of rows. */
__attribute__((target("avx2,fma"))) static void int8_pairs(const int8_many *p, int64_t n,
                                                           int64_t m0) {
    const int64_t K = p->K, M = p->M, padded = p->padded;
    const int8_t *w = p->W + n * K;
    for (int64_t m = m0; m < M; m += 2) {
        int pair = m + 1 < M;
        const uint8_t *x0 = p->xq + m * padded, *x1 = pair ? x0 + padded : x0;
        int32_t acc0, acc1;
        if (p->vnni) {
            dot_two_vnni(w, x0, x1, K, &acc0, &acc1);
        } else {
            __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
            int64_t k = 0;
            for (; k + 32 <= K; k += 32) {
                __m256i wv = _mm256_loadu_si256((const __m256i *)(w + k));
                __m256i v0 = _mm256_loadu_si256((const __m256i *)(x0 + k));
                __m256i v1 = _mm256_loadu_si256((const __m256i *)(x1 + k));
                a0 = _mm256_add_epi32(a0, dot32v(v0, wv));
                a1 = _mm256_add_epi32(a1, dot32v(v1, wv));
            }
            acc0 = hsum_epi32(a0) + dot_tail(x0, w, k, K);
            acc1 = hsum_epi32(a1) + dot_tail(x1, w, k, K);
        }
        put(p, m, n, acc0);
        if (pair) put(p, m + 1, n, acc1);
    }
}

/* The four sums of eight int32 lanes each of a, b, c and d, in that order. */
__attribute__((target("avx2,fma"))) static inline __m128i sum4_avx2(__m256i a, __m256i b,
                                                                    __m256i c, __m256i d) {
    __m256i abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

/* Step 4 of outputs (m, n..n+3) from their sums, four lanes at once: epilogue's operations
 * lane by lane (so its bits). */
__attribute__((target("avx2,fma"))) static inline void put4(const int8_many *p, int64_t m,
                                                            int64_t n, __m128i acc) {
    __m128i colsum = _mm_loadu_si128((const __m128i *)(p->colsum + n));
    __m128i raw = _mm_sub_epi32(acc, _mm_mullo_epi32(_mm_set1_epi32(p->zero[m]), colsum));
    __m128 scale = _mm_mul_ps(_mm_set1_ps(p->x_scale[m]), _mm_loadu_ps(p->w_scale + n));
    __m128 y = _mm_cvtepi32_ps(raw);
    y = p->bias ? _mm_fmadd_ps(y, scale, _mm_loadu_ps(p->bias + n)) : _mm_mul_ps(y, scale);
    _mm_storeu_ps(p->Y + m * p->N + n, y);
}

/* The sums past the vectors' end (K's tail) of weight rows n..n+3 with input row m. */
static inline __m128i tails(const int8_many *p, int64_t m, int64_t n, int64_t k) {
    const uint8_t *x = p->xq + m * p->padded;
    const int8_t *w = p->W + n * p->K;
    int64_t K = p->K;
    return _mm_setr_epi32(dot_tail(x, w, k, K), dot_tail(x, w + K, k, K),
                          dot_tail(x, w + 2 * K, k, K), dot_tail(x, w + 3 * K, k, K));
}

/* The sums of sixteen accumulators of sixteen lanes each, a[i][j] (weight row i, input row j),
 * as one vector: lane 4j + i holds a[i][j]'s sum. Pairs are summed lane by lane, then
 * 64-bit, then 128-bit halves: 45 instructions for the sixteen sums (summing each four apart
 * took 52, and four epilogues of four lanes more). */
VNNI static inline __m512i sum16_vnni(__m512i a[4][4]) {
    __m512i u[4];
    for (int j = 0; j < 4; j++) {
        /* per 128-bit lane: [r0 r1 r0 r1] of weight rows 0, 1 and of 2, 3, then [r0 r1 r2 r3] */
        __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0][j], a[1][j]),
                                       _mm512_unpackhi_epi32(a[0][j], a[1][j]));
        __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2][j], a[3][j]),
                                       _mm512_unpackhi_epi32(a[2][j], a[3][j]));
        u[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
    }
    /* the 128-bit lanes of u[j] summed: lane j of the result (even lanes plus odd, twice) */
#define HALF(x, y) \
    _mm512_add_epi32(_mm512_shuffle_i32x4(x, y, 0x88), _mm512_shuffle_i32x4(x, y, 0xDD))
    return HALF(HALF(u[0], u[1]), HALF(u[2], u[3]));
#undef HALF
}

/* Step 4 of outputs (m..m+3, n..n+3) from their sums (lane 4j + i: output (m + j, n + i)),
 * sixteen lanes at once: epilogue's operations lane by lane (so its bits). */
VNNI static inline void put16(const int8_many *p, int64_t m, int64_t n, __m512i acc) {
    const __m512i rows = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512i colsum = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(p->colsum + n)));
    __m512i zero = _mm512_permutexvar_epi32(
        rows, _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p->zero + m))));
    __m512 x_scale =
        _mm512_permutexvar_ps(rows, _mm512_castps128_ps512(_mm_loadu_ps(p->x_scale + m)));
    __m512 scale = _mm512_mul_ps(x_scale, _mm512_broadcast_f32x4(_mm_loadu_ps(p->w_scale + n)));
    __m512 y = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_mullo_epi32(zero, colsum)));
    y = p->bias ? _mm512_fmadd_ps(y, scale, _mm512_broadcast_f32x4(_mm_loadu_ps(p->bias + n)))
                : _mm512_mul_ps(y, scale);
    float *out = p->Y + m * p->N + n;
    _mm_storeu_ps(out, _mm512_castps512_ps128(y));
    _mm_storeu_ps(out + p->N, _mm512_extractf32x4_ps(y, 1));
    _mm_storeu_ps(out + 2 * p->N, _mm512_extractf32x4_ps(y, 2));
    _mm_storeu_ps(out + 3 * p->N, _mm512_extractf32x4_ps(y, 3));
}

/* Outputs (m..m+3, n..n+3) on AVX-512 VNNI: each step loads four input rows and four weight
 * rows once for their sixteen products, which sum in lanes (vpdpbusd, written out: gcc 12
 * copied each accumulator twice a step around its builtin); the lanes are summed at the end,
 * all sixteen outputs' at once. */
#define DP(a, xv, wv) __asm__("vpdpbusd %2, %1, %0" : "+v"(a) : "v"(xv), "v"(wv))
VNNI static inline void tile_vnni(const int8_many *p, int64_t m, int64_t n) {
    const int64_t K = p->K, padded = p->padded;
    __m512i a00 = _mm512_setzero_si512(), a01 = a00, a02 = a00, a03 = a00;
    __m512i a10 = a00, a11 = a00, a12 = a00, a13 = a00, a20 = a00, a21 = a00, a22 = a00;
    __m512i a23 = a00, a30 = a00, a31 = a00, a32 = a00, a33 = a00;
    const uint8_t *x0 = p->xq + m * padded, *x1 = x0 + padded, *x2 = x1 + padded;
    const uint8_t *x3 = x2 + padded;
    const int8_t *w0 = p->W + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) { /* a_ij: weight row i, input row j */
        __m512i v0 = _mm512_loadu_si512(x0 + k), v1 = _mm512_loadu_si512(x1 + k);
        __m512i v2 = _mm512_loadu_si512(x2 + k), v3 = _mm512_loadu_si512(x3 + k);
        __m512i wv = _mm512_loadu_si512(w0 + k);
        DP(a00, v0, wv); DP(a01, v1, wv); DP(a02, v2, wv); DP(a03, v3, wv);
        wv = _mm512_loadu_si512(w1 + k);
        DP(a10, v0, wv); DP(a11, v1, wv); DP(a12, v2, wv); DP(a13, v3, wv);
        wv = _mm512_loadu_si512(w2 + k);
        DP(a20, v0, wv); DP(a21, v1, wv); DP(a22, v2, wv); DP(a23, v3, wv);
        wv = _mm512_loadu_si512(w3 + k);
        DP(a30, v0, wv); DP(a31, v1, wv); DP(a32, v2, wv); DP(a33, v3, wv);
    }
    __m512i a[4][4] = {{a00, a01, a02, a03}, {a10, a11, a12, a13},
                       {a20, a21, a22, a23}, {a30, a31, a32, a33}};
    __m512i sums = sum16_vnni(a);
    if (k < K) /* K's tail: input row j's four sums into lanes 4j..4j+3 */
        for (int j = 0; j < 4; j++) {
            sums = _mm512_mask_add_epi32(sums, (__mmask16)(0xF << (4 * j)), sums,
                                         _mm512_broadcast_i32x4(tails(p, m + j, n, k)));
        }
    put16(p, m, n, sums);
}
#undef DP

/* Outputs (m..m+1, n..n+3) on AVX2: four weight rows by two input rows (its sixteen
 * registers), the products summed as int8_rows sums them. */
#define DP(a, xv, wv) a = _mm256_add_epi32(a, dot32v(xv, wv))
__attribute__((target("avx2,fma"))) static inline void tile_avx2(const int8_many *p, int64_t m,
                                                                 int64_t n) {
    const int64_t K = p->K;
    __m256i a00 = _mm256_setzero_si256(), a01 = a00, a10 = a00, a11 = a00;
    __m256i a20 = a00, a21 = a00, a30 = a00, a31 = a00;
    const uint8_t *x0 = p->xq + m * p->padded, *x1 = x0 + p->padded;
    const int8_t *w0 = p->W + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m256i v0 = _mm256_loadu_si256((const __m256i *)(x0 + k));
        __m256i v1 = _mm256_loadu_si256((const __m256i *)(x1 + k));
        __m256i wv = _mm256_loadu_si256((const __m256i *)(w0 + k));
        DP(a00, v0, wv), DP(a01, v1, wv);
        wv = _mm256_loadu_si256((const __m256i *)(w1 + k));
        DP(a10, v0, wv), DP(a11, v1, wv);
        wv = _mm256_loadu_si256((const __m256i *)(w2 + k));
        DP(a20, v0, wv), DP(a21, v1, wv);
        wv = _mm256_loadu_si256((const __m256i *)(w3 + k));
        DP(a30, v0, wv), DP(a31, v1, wv);
    }
    int tail = k < K;
    __m128i s0 = sum4_avx2(a00, a10, a20, a30), s1 = sum4_avx2(a01, a11, a21, a31);
    put4(p, m, n, tail ? _mm_add_epi32(s0, tails(p, m, n, k)) : s0);
    put4(p, m + 1, n, tail ? _mm_add_epi32(s1, tails(p, m + 1, n, k)) : s1);
}
#undef DP

/* Input rows a block of tiles takes at a time: 64 rows of 3072 bytes stay in the second level
 * cache while the task's weight rows pass over them. */
#define TILE_ROWS 64

/* Ask for the bytes PREFETCH past weight rows n..n+rows-1 (a few input rows' products wait on
 * the weights' stream, as one row's do). */
static inline void prefetch_rows(const int8_many *p, int64_t n, int64_t rows) {
    const int8_t *w = p->W + n * p->K + PREFETCH;
    for (int64_t o = 0; o < rows * p->K; o += 64) _mm_prefetch((const char *)(w + o), _MM_HINT_T1);
}

/* Y[m, n] for weight rows n in [n0, n1) and every row m: tiles of four weight rows by TX input
 * rows, the rest by int8_pairs. Each sum is the exact integer, so each output has the bits
 * its row alone gives (int8_task), whatever the tiling. */
#define INT8_TILES(NAME, TX, TILE, TARGET)                                                    \
    TARGET static void NAME(const int8_many *p, int64_t n0, int64_t n1) {                     \
        const int64_t whole = p->M / TX * TX, tiled = n0 + (n1 - n0) / 4 * 4;                 \
        for (int64_t b = 0; b < whole; b += TILE_ROWS) {                                      \
            int64_t end = b + TILE_ROWS < whole ? b + TILE_ROWS : whole;                      \
            for (int64_t n = n0; n < tiled; n += 4) {                                         \
                prefetch_rows(p, n, 4);                                                       \
                for (int64_t m = b; m < end; m += TX) TILE(p, m, n);                          \
            }                                                                                 \
        }                                                                                     \
        for (int64_t r = n0; r < n1; r++) int8_pairs(p, r, r < tiled ? whole : 0);            \
    }

INT8_TILES(int8_tiles_vnni, 4, tile_vnni, VNNI)
INT8_TILES(int8_tiles_avx2, 2, tile_avx2, __attribute__((target("avx2,fma"))))

/* Input rows from which the tiles run: below, each weight row with every pair of rows. */
#define TILED_FROM 8

/* Y for weight rows [n0, n1): steps 3 and 4 for every row of xq. */
__attribute__((target("avx2,fma"))) static void int8_task_many(const int8_many *p, int64_t n0,
                                                                int64_t n1) {
    if (p->M >= TILED_FROM) {
        if (p->vnni)
            int8_tiles_vnni(p, n0, n1);
        else
            int8_tiles_avx2(p, n0, n1);
        return;
    }
    for (int64_t n = n0; n < n1; n++) {
        prefetch_rows(p, n, 1);
        int8_pairs(p, n, 0);
    }
}
#endif

#ifdef ZOO_X86
/* Step 1 for x (K): its scale and zero point; -1 where x holds NaN or infinity, else 0. The
 * least and the greatest value, eight lanes at a time: for finite values the same two numbers
 * in any order (a zero's sign aside, which choose_params drops). */
__attribute__((target("avx2,fma"))) static int row_params(const float *x, int64_t K,
                                                          float *x_scale, int32_t *zero) {
    float lo = 0.f, hi = 0.f;
    int64_t k = 0;
    if (K >= 8) {
        const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        const __m256 largest = _mm256_set1_ps(3.40282347e38f);
        __m256 lo_v = _mm256_loadu_ps(x), hi_v = lo_v;
        __m256 finite = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        for (; k + 8 <= K; k += 8) {
            __m256 v = _mm256_loadu_ps(x + k);
            /* |v| <= the largest float: false for infinity and (ordered) for NaN */
            finite = _mm256_and_ps(
                finite, _mm256_cmp_ps(_mm256_and_ps(v, magnitude), largest, _CMP_LE_OQ));
            lo_v = _mm256_min_ps(lo_v, v);
            hi_v = _mm256_max_ps(hi_v, v);
        }
        if (_mm256_movemask_ps(finite) != 0xFF) return -1;
        float los[8], his[8];
        _mm256_storeu_ps(los, lo_v);
        _mm256_storeu_ps(his, hi_v);
        lo = los[0], hi = his[0];
        for (int j = 1; j < 8; j++) {
            lo = los[j] < lo ? los[j] : lo;
            hi = his[j] > hi ? his[j] : hi;
        }
    } else if (K > 0) {
        lo = hi = x[0];
    }
    for (; k < K; k++) {
        if (!isfinite(x[k])) return -1;
        lo = x[k] < lo ? x[k] : lo;
        hi = x[k] > hi ? x[k] : hi;
    }
    choose_params(lo, hi, x_scale, zero);
    return 0;
}
#endif

/* y (N) = the dynamic int8 product of x (K) and W (N, K, row-major int8) with per-row scales
 * w_scale (N), row sums colsum (N: sum_k W[n, k]) and bias (N, or NULL), on `threads`
 * threads. Returns 0, or -1 (y untouched) where x holds NaN or infinity, for which the
 * caller keeps FBGEMM's behaviour. Only call where zoo_native_supported() is 1. */
int zoo_gemv_int8(const float *x, const int8_t *W, const float *w_scale, const int32_t *colsum,
                  const float *bias, float *y, int64_t N, int64_t K, int threads) {
#ifdef ZOO_X86
    float x_scale;
    int32_t zero;
    if (row_params(x, K, &x_scale, &zero)) return -1;
    int64_t padded = (K + 31) / 32 * 32;
    uint8_t *xq = aligned_alloc(32, (size_t)(padded > 0 ? padded : 32));
    if (!xq) return -1;
    quantize_row(x, xq, K, padded, x_scale, zero);
    int64_t tasks = (N + INT8_ROWS_PER_TASK - 1) / INT8_ROWS_PER_TASK;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t n0 = t * INT8_ROWS_PER_TASK;
        int64_t n1 = n0 + INT8_ROWS_PER_TASK < N ? n0 + INT8_ROWS_PER_TASK : N;
        int8_task(W, xq, y, n0, n1, K, zero, colsum, x_scale, w_scale, bias);
    }
    free(xq);
    return 0;
#else
    (void)x, (void)W, (void)w_scale, (void)colsum, (void)bias, (void)y, (void)N, (void)K;
    (void)threads;
    return -1;
#endif
}

/* Input values from which the rows are quantized on the threads (below, one thread is sooner
 * done than the team is woken). */
#define QUANTIZE_ON_THREADS 65536

/* Y (M, N) = the dynamic int8 product of the rows of X (M, K) and W, each row quantized with
 * its own scale and zero point (`shared` 0) or all with those of the whole of X (`shared` 1),
 * the weights read from memory once for all rows. Returns 0, or -1 (Y untouched) where X holds
 * NaN or infinity or no memory was left. */
static int gemm_int8(const float *X, const int8_t *W, const float *w_scale, const int32_t *colsum,
                     const float *bias, float *Y, int64_t M, int64_t N, int64_t K, int threads,
                     int shared) {
#ifdef ZOO_X86
    if (M == 1) return zoo_gemv_int8(X, W, w_scale, colsum, bias, Y, N, K, threads);
    int64_t padded = (K + 31) / 32 * 32;
    size_t bytes = (size_t)(M * (padded > 0 ? padded : 32));
    uint8_t *xq = aligned_alloc(32, (bytes + 31) / 32 * 32);
    float *x_scale = malloc((size_t)M * sizeof(float));
    int32_t *zero = malloc((size_t)M * sizeof(int32_t));
    int status = xq && x_scale && zero ? 0 : -1;
    float whole_scale = 0.f;
    int32_t whole_zero = 0;
    if (status == 0 && shared) status = row_params(X, M * K, &whole_scale, &whole_zero);
    if (status == 0) { /* the rows quantized on the threads where there are many */
        int failed = 0;
#pragma omp parallel for schedule(static) num_threads(threads) reduction(|| : failed) \
    if (M * K >= QUANTIZE_ON_THREADS)
        for (int64_t m = 0; m < M; m++) {
            if (shared) {
                x_scale[m] = whole_scale, zero[m] = whole_zero;
            } else if (row_params(X + m * K, K, x_scale + m, zero + m)) {
                failed = 1;
                continue;
            }
            quantize_row(X + m * K, xq + m * padded, K, padded, x_scale[m], zero[m]);
        }
        status = failed ? -1 : 0;
    }
    if (status == 0) {
        const int8_many p = {W,    xq,     padded,  M,       N,    K,
                             Y,    zero,   colsum,  x_scale, w_scale, bias,
                             zoo_native_vnni()};
        int64_t tasks = (N + INT8_ROWS_PER_TASK - 1) / INT8_ROWS_PER_TASK;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t n0 = t * INT8_ROWS_PER_TASK;
            int64_t n1 = n0 + INT8_ROWS_PER_TASK < N ? n0 + INT8_ROWS_PER_TASK : N;
            int8_task_many(&p, n0, n1);
        }
    }
    free(xq);
    free(x_scale);
    free(zero);
    return status;
#else
    (void)X, (void)W, (void)w_scale, (void)colsum, (void)bias, (void)Y, (void)M, (void)N;
    (void)K, (void)threads, (void)shared;
    return -1;
#endif
}

/* Y (M, N) = the dynamic int8 product of each row of X (M, K) and W as zoo_gemv_int8 computes
 * it for that row alone (each row quantized with its own scale and zero point, as FBGEMM
 * quantizes one row): a slot batch's rows, each with the bits it has alone. Returns 0, or -1
 * (Y untouched) where a row holds NaN or infinity or no memory was left. Only call where
 * zoo_native_supported() is 1. */
int zoo_gemm_int8(const float *X, const int8_t *W, const float *w_scale, const int32_t *colsum,
                  const float *bias, float *Y, int64_t M, int64_t N, int64_t K, int threads) {
    return gemm_int8(X, W, w_scale, colsum, bias, Y, M, N, K, threads, 0);
}

/* Y (M, N) = PyTorch's dynamic int8 linear of X (M, K) on FBGEMM, to the bit: the whole of X
 * quantized with one scale and zero point (step 1 over all its values), then each output as
 * zoo_gemv_int8 computes it. What zoo's int8 layer computes for any number of rows, its
 * weights held once (row-major, the layout every kernel here reads). Returns 0, or -1 (Y
 * untouched) where X holds NaN or infinity or no memory was left. Only call where
 * zoo_native_supported() is 1. */
int zoo_linear_int8(const float *X, const int8_t *W, const float *w_scale, const int32_t *colsum,
                    const float *bias, float *Y, int64_t M, int64_t N, int64_t K, int threads) {
    return gemm_int8(X, W, w_scale, colsum, bias, Y, M, N, K, threads, 1);
}
