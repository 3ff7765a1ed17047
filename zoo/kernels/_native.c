/* zoo's own CPU kernels: one input row (or a few) times a weight matrix (batch-1 decoding, a
 * beam search's beams), and the norms and attention of one decoding step.
 *
 * Why they exist: a batch-1 decoding step reads every weight once, so its speed is the rate
 * at which the matrix-vector products stream weights from memory. PyTorch's kernels for one
 * row (oneDNN's linear, MKL's gemv) stream well below what the cores can read (a plain sum
 * over the same weights); these kernels reach it (docs/benchmarks.md has the figures). See
 * zoo/kernels/native.py, which loads this library with ctypes and falls back to PyTorch's kernels
 * wherever it is missing or the CPU lacks AVX2 and FMA.
 *
 * Each output is one dot product over a contiguous weight row, computed by one thread in a
 * fixed order, so the result does not depend on the thread count. The threads are OpenMP's:
 * the library links libgomp.so.1, which resolves to the copy PyTorch has already loaded, so
 * these kernels run on PyTorch's own thread team (zoo/kernels/native.py checks that only one
 * OpenMP runtime is mapped before it uses them).
 *
 * Floating point: these files are compiled with -ffp-contract=off (pyproject.toml), so no
 * compiler fuses a multiplication and an addition on its own: every fused multiply-add is
 * written out (_mm256_fmadd_ps, fmaf, fma) and every other product and sum is rounded on
 * its own. gcc (whose default fuses wherever its vectoriser leaves the two side by side) and
 * clang (which fuses within one expression) then give the same bits, and gcc left to fuse
 * on its own changes none (tests/test_native_build.py). fmaf and fma are one instruction in
 * the avx2,fma functions below; anywhere else they would be calls into the C library.
 *
 * No Python API: the module object exists only so that setuptools builds and installs this
 * file as zoo.kernels._native; zoo/kernels/native.py finds it with importlib and opens it with ctypes.
 * It uses only CPython's stable ABI (setup.py defines Py_LIMITED_API), so one library,
 * _native.abi3.so, serves every CPython from requires-python's minimum on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define ZOO_X86 1
#include <immintrin.h>
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

/* Weight rows the few-row kernel (zoo_gemm_f32) hands a thread at a time: 16 rows of 768
 * floats are 48 KiB, a few pages. The one-row kernel gives each thread its own contiguous
 * rows instead (zoo_gemv_f32). */
#define ROWS_PER_TASK 16

/* How far ahead of its reads the few-row float32 kernel (f32_tile) asks for each weight row
 * into the second level cache, in floats (a prefetch hint, which never faults, even past the
 * matrix): 32 KiB per row it reads. With a few input rows the products take long enough per
 * byte that the hardware's own prefetching falls behind and the cores wait for memory, then
 * compute. Asked this far ahead, the weights arrive while the rows compute
 * (docs/benchmarks.md, "Figures behind design choices"). The one-row kernel reads its rows
 * as four long runs instead, which the hardware's prefetchers follow (f32_rows). */
#define PREFETCH_AHEAD 8192

/* 1 where this CPU has AVX2 and FMA (the kernels below need both), else 0. */
int zoo_native_supported(void) {
#ifdef ZOO_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

/* The instruction sets the kernels may run on: AVX2 with FMA, or AVX-512 (twice the
 * registers for a batch's float32 tiles; VNNI's one-instruction byte products for int8,
 * where the CPU has it). Every variant computes the same bits. */
enum { ISA_AVX2 = 0, ISA_AVX512 = 1 };

/* The set the products run on: the widest this CPU has, unless zoo_native_set_isa chose. */
static int chosen_isa = -1;

static int isa_supported(int isa) {
#ifdef ZOO_X86
    __builtin_cpu_init();
    if (isa == ISA_AVX2) return zoo_native_supported();
    if (isa == ISA_AVX512) return zoo_native_supported() && __builtin_cpu_supports("avx512f");
#endif
    (void)isa;
    return 0;
}

/* The instruction set the float32 products run on (ISA_AVX2 or ISA_AVX512): what
 * zoo_native_set_isa chose, else the widest this CPU has. Each output's bits depend on it
 * (eight or sixteen partial sums per dot product), never on the thread count or on the
 * other rows of a batch: the one-row and the few-row kernels of a set sum alike. */
int zoo_native_isa(void) {
    if (chosen_isa < 0) chosen_isa = isa_supported(ISA_AVX512) ? ISA_AVX512 : ISA_AVX2;
    return chosen_isa;
}

/* 1 where the int8 products run on AVX-512 VNNI (the instruction set chosen is AVX-512 and the
 * CPU has VNNI, with BW and VL for its byte loads and eight-lane forms), else 0 (AVX2's). */
int zoo_native_vnni(void) {
#ifdef ZOO_X86
    return zoo_native_isa() == ISA_AVX512 && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

/* Run the float32 products on `isa` from now on (zoo/kernels/native_load.py calls it once, as
 * the library opens, from ZOO_NATIVE_ISA); returns 0, or -1 (nothing changed) where this CPU
 * lacks it. */
int zoo_native_set_isa(int isa) {
    if (!isa_supported(isa)) return -1;
    chosen_isa = isa;
    return 0;
}

/* The number of OpenMP threads a parallel region here would start with: zoo/kernels/native.py
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

/* Eight more products of each of four rows into its sums: a_i += w_i[k:k + 8] * x[k:k + 8]. */
__attribute__((always_inline, target("avx2,fma"))) static inline void f32_step4(
    const float *const w[4], const float *x, int64_t k, __m256 a[4]) {
    __m256 xv = _mm256_loadu_ps(x + k);
    for (int r = 0; r < 4; r++) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w[r] + k), xv, a[r]);
}

/* y[n] = W[n, :] . x + b[n] for n in [n0, n1): four rows at a time share each load of x, one
 * from each quarter of the range, so the weights are read as four long runs of contiguous
 * rows, which the hardware's prefetchers follow on their own (four rows side by side, with
 * a software prefetch 32 KiB ahead, started three new runs every four rows: one thread read
 * 23-26 GB/s from huge pages where these read 29-33, as a plain sum does; docs/benchmarks.md).
 * Each row's eight lanes sum in k's order, then the lanes, the rest and the bias. */
__attribute__((target("avx2,fma"))) static void f32_rows(
    const float *W, const float *x, const float *b, float *y, int64_t n0, int64_t n1, int64_t K) {
    int64_t quarter = n1 > n0 ? (n1 - n0) / 4 : 0;
    for (int64_t i = 0; i < quarter; i++) {
        int64_t n[4];
        const float *w[4];
        __m256 a[4];
        for (int r = 0; r < 4; r++) {
            n[r] = n0 + r * quarter + i;
            w[r] = W + n[r] * K;
            a[r] = _mm256_setzero_ps();
        }
        int64_t k = 0;
        for (; k + 16 <= K; k += 16) {
            f32_step4(w, x, k, a);
            f32_step4(w, x, k + 8, a);
        }
        if (k + 8 <= K) {
            f32_step4(w, x, k, a);
            k += 8;
        }
        for (int r = 0; r < 4; r++) {
            float s = hsum(a[r]);
            for (int64_t j = k; j < K; j++) s = fmaf(w[r][j], x[j], s);
            y[n[r]] = b ? s + b[n[r]] : s;
        }
    }
    for (int64_t n = n0 + 4 * quarter; n < n1; n++) {
        const float *w0 = W + n * K;
        __m256 a0 = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), _mm256_loadu_ps(x + k), a0);
        float s0 = hsum(a0);
        for (; k < K; k++) s0 = fmaf(w0[k], x[k], s0);
        y[n] = b ? s0 + b[n] : s0;
    }
}
#endif

#ifdef ZOO_X86
/* Y[m + r, n + i] = W[n + i, :] . X[m + r, :] + b[n + i] for r < R (R <= 4) and i < w_rows
 * (w_rows <= 4; rows past them are not read): each load of a weight row serves R input rows,
 * each dot product summed as f32_rows sums it (eight lanes of fused multiply-adds in k's
 * order, the lanes, the rest, the bias), so every output has the bits zoo_gemv_f32 gives its
 * row alone, on every instruction set. Inlined into its callers, it is compiled for theirs:
 * AVX2's 16 registers hold a 4 x 2 tile's sums beside its inputs, AVX-512's 32 a 4 x 4 one. */
__attribute__((always_inline, target("avx2,fma"))) static inline void f32_tile(
    const float *W, const float *X, const float *b, float *Y, int64_t N, int64_t K, int64_t n,
    int w_rows, int64_t m, int R) {
    const float *w[4];
    for (int i = 0; i < 4; i++) w[i] = W + (n + (i < w_rows ? i : 0)) * K;
    __m256 acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int r = 0; r < R; r++) acc[i][r] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 xv[4];
        for (int r = 0; r < R; r++) xv[r] = _mm256_loadu_ps(X + (m + r) * K + k);
        for (int i = 0; i < 4; i++) {
            _mm_prefetch((const char *)(w[i] + k + PREFETCH_AHEAD), _MM_HINT_T1);
            __m256 wv = _mm256_loadu_ps(w[i] + k);
            for (int r = 0; r < R; r++) acc[i][r] = _mm256_fmadd_ps(wv, xv[r], acc[i][r]);
        }
    }
    for (int r = 0; r < R; r++) {
        const float *x = X + (m + r) * K;
        float *y = Y + (m + r) * N + n;
        for (int i = 0; i < w_rows; i++) {
            float s = hsum(acc[i][r]);
            for (int64_t j = k; j < K; j++) s = fmaf(w[i][j], x[j], s);
            y[i] = b ? s + b[n + i] : s;
        }
    }
}

/* Y[:, n] for weight rows n in [n0, n1) and all M rows of X, four weight rows by `tall` input
 * rows at a time (each weight row read from memory once, then from the first level cache for
 * each further tile of input rows): tall 4 where AVX-512's registers hold the tile, else 2. */
__attribute__((always_inline, target("avx2,fma"))) static inline void f32_tiles(
    const float *W, const float *X, const float *b, float *Y, int64_t M, int64_t N, int64_t K,
    int64_t n0, int64_t n1, int tall) {
    for (int64_t n = n0; n < n1; n += 4) {
        int w_rows = n1 - n < 4 ? (int)(n1 - n) : 4;
        int64_t m = 0;
        for (; tall == 4 && m + 4 <= M; m += 4) f32_tile(W, X, b, Y, N, K, n, w_rows, m, 4);
        for (; m + 2 <= M; m += 2) f32_tile(W, X, b, Y, N, K, n, w_rows, m, 2);
        if (m < M) f32_tile(W, X, b, Y, N, K, n, w_rows, m, 1);
    }
}

__attribute__((target("avx512f,avx512vl,avx2,fma"))) static void f32_rows_wide(
    const float *W, const float *X, const float *b, float *Y, int64_t M, int64_t N, int64_t K,
    int64_t n0, int64_t n1) {
    f32_tiles(W, X, b, Y, M, N, K, n0, n1, 4);
}

__attribute__((target("avx2,fma"))) static void f32_rows_many(
    const float *W, const float *X, const float *b, float *Y, int64_t M, int64_t N, int64_t K,
    int64_t n0, int64_t n1) {
    f32_tiles(W, X, b, Y, M, N, K, n0, n1, 2);
}
#endif

/* y (N) = W (N, K, row-major) x (K) + b (N, or NULL), on `threads` threads. Only call where
 * zoo_native_supported() is 1. */
void zoo_gemv_f32(const float *W, const float *x, const float *b, float *y, int64_t N, int64_t K,
                  int threads) {
#ifdef ZOO_X86
#pragma omp parallel num_threads(threads)
    { /* each thread its own contiguous rows, read as four long runs (f32_rows) */
        int64_t t = 0, team = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        team = omp_get_num_threads();
#endif
        f32_rows(W, x, b, y, N * t / team, N * (t + 1) / team, K);
    }
#else
    (void)W, (void)x, (void)b, (void)y, (void)N, (void)K, (void)threads;
#endif
}

/* Y (M, N) = X (M, K) W^T + b for a few rows of X (row-major, as W): the weights are read from
 * memory once for all M rows, where PyTorch's kernels for a few rows read them at a fraction
 * of the rate (docs/benchmarks.md). Row m of Y has the bits zoo_gemv_f32 gives X's row m
 * alone, whatever M and the thread count. Only call where zoo_native_supported() is 1. */
void zoo_gemm_f32(const float *W, const float *X, const float *b, float *Y, int64_t M, int64_t N,
                  int64_t K, int threads) {
#ifdef ZOO_X86
    if (M == 1) {
        zoo_gemv_f32(W, X, b, Y, N, K, threads);
        return;
    }
    int wide = zoo_native_isa() == ISA_AVX512;
    int64_t tasks = (N + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tasks; t++) {
        int64_t n0 = t * ROWS_PER_TASK;
        int64_t n1 = n0 + ROWS_PER_TASK < N ? n0 + ROWS_PER_TASK : N;
        if (wide)
            f32_rows_wide(W, X, b, Y, M, N, K, n0, n1);
        else
            f32_rows_many(W, X, b, Y, M, N, K, n0, n1);
    }
#else
    (void)W, (void)X, (void)b, (void)Y, (void)M, (void)N, (void)K, (void)threads;
#endif
}

#ifdef ZOO_X86
/* The dot product of a[0:n] and b[0:n] in eight float lanes, then the lanes. */
__attribute__((target("avx2,fma"))) static float dot8(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float s = hsum(acc);
    for (; i < n; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* Layer norm with the mean, the variance and each centred value in double (the rounding
 * left is float32's, once per output), then the float32 scale and shift: one fused
 * multiply-add where both are given. */
__attribute__((target("avx2,fma"))) static void layer_norm(
    const float *x, const float *w, const float *b, float *y, int64_t d, float eps) {
    double sum = 0.0, squares = 0.0;
    for (int64_t i = 0; i < d; i++) sum += x[i];
    double mean = sum / (double)d;
    for (int64_t i = 0; i < d; i++) {
        double c = (double)x[i] - mean;
        squares = fma(c, c, squares);
    }
    double rstd = 1.0 / sqrt(squares / (double)d + (double)eps);
    for (int64_t i = 0; i < d; i++) {
        float h = (float)(((double)x[i] - mean) * rstd);
        if (w && b)
            y[i] = fmaf(h, w[i], b[i]);
        else
            y[i] = w ? h * w[i] : b ? h + b[i] : h;
    }
}

__attribute__((target("avx2,fma"))) static void rms_norm(
    const float *x, const float *w, float *y, int64_t d, float eps, float offset) {
    float r = 1.0f / sqrtf(dot8(x, x, d) / (float)d + eps);
    for (int64_t i = 0; i < d; i++) y[i] = (x[i] * r) * (w[i] + offset);
}

/* One query head against keys and values [0, len) (rows of hd floats, `stride` floats apart),
 * those j with keep[j] == 0 left out (keep NULL: none), online softmax:
 * y = sum_j softmax(q . k_j * scale)_j v_j. */
__attribute__((target("avx2,fma"))) static void attend_head(
    const float *q, const float *K, const float *V, int64_t stride, const uint8_t *keep, float *y,
    int64_t len, int64_t hd, float scale) {
    float top = -INFINITY, total = 0.0f;
    for (int64_t d = 0; d < hd; d++) y[d] = 0.0f;
    for (int64_t j = 0; j < len; j++) {
        if (keep && !keep[j]) continue;
        float s = dot8(q, K + j * stride, hd) * scale;
        if (s > top) {  /* a new maximum: rescale what is summed so far */
            float c = expf(top - s);
            total *= c;
            for (int64_t d = 0; d < hd; d++) y[d] *= c;
            top = s;
        }
        float p = expf(s - top);
        total += p;
        const float *v = V + j * stride;
        for (int64_t d = 0; d < hd; d++) y[d] = fmaf(p, v[d], y[d]);
    }
    float inv = 1.0f / total;
    for (int64_t d = 0; d < hd; d++) y[d] *= inv;
}
#endif

/* y (d) = layer norm of x (d) scaled by w and shifted by b (either may be NULL). */
void zoo_layer_norm_f32(const float *x, const float *w, const float *b, float *y, int64_t d,
                        float eps) {
#ifdef ZOO_X86
    layer_norm(x, w, b, y, d, eps);
#else
    (void)x, (void)w, (void)b, (void)y, (void)d, (void)eps;
#endif
}

/* y (d) = x / sqrt(mean(x^2) + eps) * (w + offset): RMSNorm (offset 0) or Gemma's (1). */
void zoo_rms_norm_f32(const float *x, const float *w, float *y, int64_t d, float eps,
                      float offset) {
#ifdef ZOO_X86
    rms_norm(x, w, y, d, eps, offset);
#else
    (void)x, (void)w, (void)y, (void)d, (void)eps, (void)offset;
#endif
}

/* One query per sequence for `rows` sequences, each with `heads` query heads (row b's head h
 * at q + b * q_row + h * q_head) attending to positions [0, len) of its key/value head
 * j = h / (heads / kv_heads) in ck, cv (row b, head j, position p at b * c_row + j * c_head +
 * p * c_pos; hd contiguous floats each), positions with keep[b * len + p] == 0 left out (keep
 * NULL: none); y is (rows, heads, hd). Where k is not NULL, each row's new key and value
 * (head j at k + b * k_row + j * k_head, likewise v) are first written at position pos of the
 * caches: one decoding step of self-attention; with k NULL, ck and cv are only read (a
 * decoder's cross-attention to its encoder's keys and values). The rows' heads run on
 * `threads` threads; each head's result does not depend on the others or on the thread count. */
void zoo_attend_rows_f32(const float *q, int64_t q_row, int64_t q_head, const float *k,
                         int64_t k_row, int64_t k_head, const float *v, int64_t v_row,
                         int64_t v_head, float *ck, float *cv, int64_t c_row, int64_t c_head,
                         int64_t c_pos, int64_t pos, int64_t len, const uint8_t *keep,
                         int64_t rows, int64_t heads, int64_t kv_heads, int64_t hd, float scale,
                         float *y, int threads) {
#ifdef ZOO_X86
    size_t bytes = (size_t)hd * sizeof(float);
    if (k)
        for (int64_t b = 0; b < rows; b++)
            for (int64_t j = 0; j < kv_heads; j++) {
                int64_t at = b * c_row + j * c_head + pos * c_pos;
                memcpy(ck + at, k + b * k_row + j * k_head, bytes);
                memcpy(cv + at, v + b * v_row + j * v_head, bytes);
            }
    int64_t group = heads / kv_heads;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < rows * heads; i++) {
        int64_t b = i / heads, h = i % heads, at = b * c_row + (h / group) * c_head;
        attend_head(q + b * q_row + h * q_head, ck + at, cv + at, c_pos,
                    keep ? keep + b * len : NULL, y + i * hd, len, hd, scale);
    }
#else
    (void)q, (void)q_row, (void)q_head, (void)k, (void)k_row, (void)k_head, (void)v;
    (void)v_row, (void)v_head, (void)ck, (void)cv, (void)c_row, (void)c_head, (void)c_pos;
    (void)pos, (void)len, (void)keep, (void)rows, (void)heads, (void)kv_heads, (void)hd;
    (void)scale, (void)y, (void)threads;
#endif
}

/* One decoding step's self-attention for `rows` sequences, each at its own position in its own
 * slot of the caches: row b's query, key and value are one row of qkv (qkv_row floats apart:
 * `heads` query heads of hd floats, then `kv_heads` key heads, then as many value heads); its
 * key and value heads are first written at position pos[b] of slot slot[b] (head j of slot s,
 * position p at s * c_slot + j * c_head + p * hd in ck, cv), then each of its query heads
 * attends to positions [0, pos[b]] of its key/value head j = h / (heads / kv_heads); y is
 * (rows, heads, hd). The slots must differ. Each head's result is attend_head's, as
 * zoo_attend_rows_f32 computes it, whatever the other rows and the thread count. */
void zoo_attend_slots_f32(const float *qkv, int64_t qkv_row, float *ck, float *cv,
                          int64_t c_slot, int64_t c_head, const int64_t *slot,
                          const int64_t *pos, int64_t rows, int64_t heads, int64_t kv_heads,
                          int64_t hd, float scale, float *y, int threads) {
#ifdef ZOO_X86
    size_t bytes = (size_t)hd * sizeof(float);
    for (int64_t b = 0; b < rows; b++) {
        const float *k = qkv + b * qkv_row + heads * hd, *v = k + kv_heads * hd;
        for (int64_t j = 0; j < kv_heads; j++) {
            int64_t at = slot[b] * c_slot + j * c_head + pos[b] * hd;
            memcpy(ck + at, k + j * hd, bytes);
            memcpy(cv + at, v + j * hd, bytes);
        }
    }
    int64_t group = heads / kv_heads;
#pragma omp parallel for schedule(dynamic) num_threads(threads)
    for (int64_t i = 0; i < rows * heads; i++) {
        int64_t b = i / heads, h = i % heads, at = slot[b] * c_slot + (h / group) * c_head;
        attend_head(qkv + b * qkv_row + h * hd, ck + at, cv + at, hd, NULL, y + i * hd,
                    pos[b] + 1, hd, scale);
    }
#else
    (void)qkv, (void)qkv_row, (void)ck, (void)cv, (void)c_slot, (void)c_head, (void)slot;
    (void)pos, (void)rows, (void)heads, (void)kv_heads, (void)hd, (void)scale, (void)y;
    (void)threads;
#endif
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_native", .m_doc = NULL, .m_size = -1};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
