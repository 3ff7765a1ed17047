/* zoo's own CPU kernels: one input row times a weight matrix (batch-1 decoding).
 *
 * Why they exist: a batch-1 decoding step reads every weight once, so its speed is the rate
 * at which the matrix-vector products stream weights from memory. On a 2-core AVX2 machine
 * PyTorch's kernels for one row (oneDNN's linear, MKL's gemv) stream at 60-75% of what the
 * cores can read (a plain sum over the same weights); these kernels reach it. See
 * zoo/nn/native.py, which loads this library with ctypes and falls back to PyTorch's kernels
 * wherever it is missing or the CPU lacks AVX2 and FMA.
 *
 * Each output is one dot product over a contiguous weight row, computed by one thread in a
 * fixed order, so the result does not depend on the thread count. The threads are OpenMP's:
 * the library links libgomp.so.1, which resolves to the copy PyTorch has already loaded, so
 * these kernels run on PyTorch's own thread team (zoo/nn/native.py checks that only one
 * OpenMP runtime is mapped before it uses them).
 *
 * No Python API: the module object exists only so that setuptools builds and installs this
 * file as zoo.nn._native; zoo/nn/native.py finds it with importlib and opens it with ctypes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>

#if defined(__x86_64__) || defined(_M_X64)
#define ZOO_X86 1
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

/* Weight rows a thread takes at a time: 16 rows of 768 floats are 48 KiB, a few pages. */
#define ROWS_PER_TASK 16

/* 1 where this CPU has AVX2 and FMA (the kernels below need both), else 0. */
int zoo_native_supported(void) {
#ifdef ZOO_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* The number of OpenMP threads a parallel region here would start with: zoo/nn/native.py
 * checks that it follows torch.set_num_threads (one OpenMP runtime, PyTorch's). */
int zoo_native_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

#ifdef ZOO_X86
__attribute__((target("avx2,fma"))) static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[n] = W[n, :] . x + b[n] for n in [n0, n1): four rows at a time share each load of x. */
__attribute__((target("avx2,fma"))) static void f32_rows(
    const float *W, const float *x, const float *b, float *y, int64_t n0, int64_t n1, int64_t K) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) {
        const float *w0 = W + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) {
            __m256 xv = _mm256_loadu_ps(x + k);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xv, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xv, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), xv, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), xv, a3);
        }
        float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);
        for (; k < K; k++) {
            s0 += w0[k] * x[k];
            s1 += w1[k] * x[k];
            s2 += w2[k] * x[k];
            s3 += w3[k] * x[k];
        }
        if (b) {
            s0 += b[n];
            s1 += b[n + 1];
            s2 += b[n + 2];
            s3 += b[n + 3];
        }
        y[n] = s0;
        y[n + 1] = s1;
        y[n + 2] = s2;
        y[n + 3] = s3;
    }
    for (; n < n1; n++) {
        const float *w0 = W + n * K;
        __m256 a0 = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), _mm256_loadu_ps(x + k), a0);
        float s0 = hsum(a0);
        for (; k < K; k++) s0 += w0[k] * x[k];
        y[n] = b ? s0 + b[n] : s0;
    }
}
#endif

/* y (N) = W (N, K, row-major) x (K) + b (N, or NULL), on `threads` threads. Only call where
 * zoo_native_supported() is 1. */
void zoo_gemv_f32(const float *W, const float *x, const float *b, float *y, int64_t N, int64_t K,
                  int threads) {
#ifdef ZOO_X86
    int64_t tasks = (N + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t n0 = t * ROWS_PER_TASK;
        int64_t n1 = n0 + ROWS_PER_TASK < N ? n0 + ROWS_PER_TASK : N;
        f32_rows(W, x, b, y, n0, n1, K);
    }
#else
    (void)W, (void)x, (void)b, (void)y, (void)N, (void)K, (void)threads;
#endif
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
