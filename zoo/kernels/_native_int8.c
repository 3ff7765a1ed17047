/* zoo's batch-1 int8 kernel: one float32 row against int8 weight rows, the arithmetic of
 * PyTorch's dynamic quantized linear on FBGEMM (torch.ao.nn.quantized.dynamic.Linear with
 * per-row weight scales), to the bit.
 *
 * FBGEMM's steps for one row x (K) and weights q (N, K) int8 with scales s (N), zero points 0:
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
/* xq[k] for k < K (step 2 above), and zeros up to `padded`. */
__attribute__((target("avx2,fma"))) static void quantize_row(
    const float *x, uint8_t *xq, int64_t K, int64_t padded, float scale, int32_t zero) {
    const float inv = 1.f / scale;
    const float cap = 2147483520.f; /* the largest float below INT32_MAX, as FBGEMM clips */
    const __m256 inv_v = _mm256_set1_ps(inv), zero_v = _mm256_set1_ps((float)zero);
    const __m256 cap_v = _mm256_set1_ps(cap);
    const __m256i lo_v = _mm256_setzero_si256(), hi_v = _mm256_set1_epi32(255);
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 t = _mm256_min_ps(_mm256_fmadd_ps(_mm256_loadu_ps(x + k), inv_v, zero_v), cap_v);
        __m256i r = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(t), lo_v), hi_v);
        int32_t lanes[8];
        _mm256_storeu_si256((__m256i *)lanes, r);
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

/* Y[m, n] for weight rows n in [n0, n1) and the M rows of xq (each quantized with its own
 * x_scale[m] and zero[m], `padded` bytes apart): steps 3 and 4 for every row, each weight
 * row read from memory once and from the first level cache for each further pair of rows.
 * The sums are exact integers, so each output has the bits int8_task gives its row alone. */
__attribute__((target("avx2,fma"))) static void int8_task_many(
    const int8_t *W, const uint8_t *xq, int64_t padded, int64_t M, float *Y, int64_t N,
    int64_t n0, int64_t n1, int64_t K, const int32_t *zero, const int32_t *colsum,
    const float *x_scale, const float *w_scale, const float *bias, int vnni) {
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *w = W + n * K;
        for (int64_t o = 0; o < K; o += 64) /* the row PREFETCH bytes on */
            _mm_prefetch((const char *)(w + o + PREFETCH), _MM_HINT_T1);
        for (int64_t m = 0; m < M; m += 2) {
            int pair = m + 1 < M;
            const uint8_t *x0 = xq + m * padded, *x1 = pair ? x0 + padded : x0;
            int32_t acc0, acc1;
            if (vnni) {
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
            Y[m * N + n] = epilogue(acc0, zero[m], colsum[n], x_scale[m], w_scale[n], bias, n);
            if (pair) {
                Y[(m + 1) * N + n] =
                    epilogue(acc1, zero[m + 1], colsum[n], x_scale[m + 1], w_scale[n], bias, n);
            }
        }
    }
}
#endif

/* Step 1 for x (K): its scale and zero point; -1 where x holds NaN or infinity, else 0. */
static int row_params(const float *x, int64_t K, float *x_scale, int32_t *zero) {
    float lo = 0.f, hi = 0.f;
    if (K > 0) lo = hi = x[0];
    for (int64_t k = 0; k < K; k++) {
        if (!isfinite(x[k])) return -1;
        lo = x[k] < lo ? x[k] : lo;
        hi = x[k] > hi ? x[k] : hi;
    }
    choose_params(lo, hi, x_scale, zero);
    return 0;
}

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

/* Y (M, N) = the dynamic int8 product of each row of X (M, K) and W as zoo_gemv_int8 computes
 * it for that row alone (each row quantized with its own scale and zero point, as FBGEMM
 * quantizes one row), the weights read from memory once for all rows. Returns 0, or -1 (Y
 * untouched) where a row holds NaN or infinity or no memory was left. Only call where
 * zoo_native_supported() is 1. */
int zoo_gemm_int8(const float *X, const int8_t *W, const float *w_scale, const int32_t *colsum,
                  const float *bias, float *Y, int64_t M, int64_t N, int64_t K, int threads) {
#ifdef ZOO_X86
    if (M == 1) return zoo_gemv_int8(X, W, w_scale, colsum, bias, Y, N, K, threads);
    int64_t padded = (K + 31) / 32 * 32;
    size_t bytes = (size_t)(M * (padded > 0 ? padded : 32));
    uint8_t *xq = aligned_alloc(32, (bytes + 31) / 32 * 32);
    float *x_scale = malloc((size_t)M * sizeof(float));
    int32_t *zero = malloc((size_t)M * sizeof(int32_t));
    int status = xq && x_scale && zero ? 0 : -1;
    for (int64_t m = 0; m < M && status == 0; m++) {
        status = row_params(X + m * K, K, x_scale + m, zero + m);
        if (status == 0) quantize_row(X + m * K, xq + m * padded, K, padded, x_scale[m], zero[m]);
    }
    if (status == 0) {
        int vnni = zoo_native_vnni();
        int64_t tasks = (N + INT8_ROWS_PER_TASK - 1) / INT8_ROWS_PER_TASK;
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t n0 = t * INT8_ROWS_PER_TASK;
            int64_t n1 = n0 + INT8_ROWS_PER_TASK < N ? n0 + INT8_ROWS_PER_TASK : N;
            int8_task_many(W, xq, padded, M, Y, N, n0, n1, K, zero, colsum, x_scale, w_scale,
                           bias, vnni);
        }
    }
    free(xq);
    free(x_scale);
    free(zero);
    return status;
#else
    (void)X, (void)W, (void)w_scale, (void)colsum, (void)bias, (void)Y, (void)M, (void)N;
    (void)K, (void)threads;
    return -1;
#endif
}
