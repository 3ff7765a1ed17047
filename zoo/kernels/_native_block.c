/* One decoding step of a whole decoder in one call (zoo_decode_rows_f32), for one sequence or
 * for several each at its own position in its own slot of the caches (continuous batching): the
 * token embedding; for every block its norms, the query/key/value product, rotary positions,
 * attention over the key/value cache, the output product, the feed-forward and the residual
 * sums; the final norm and the head.
 *
 * Why: a batch-1 decoding step streams every weight once, and zoo's matrix-vector kernels
 * (_native.c, _native_int8.c) stream at the memory's rate; what remained was about a hundred
 * small PyTorch operations and a few thousand Python calls per gpt2-124m token, each run cold
 * after the weights streamed through the caches (a sizeable share of each token's time:
 * docs/benchmarks.md has the figures). Here the step is one call: its products are the same kernels, its norms and its
 * attention the same functions, and the small steps between them (residual sums, the
 * activation, the rotation, the embedding) run on values that stay in the L1 cache.
 *
 * Numerics: the products, norms and attention are those of the per-module path
 * (zoo/kernels/native.py), the residual sums and the embedding are the same float operations in
 * the same order, the rotation is the same multiplications and additions (never contracted
 * into a fused multiply-add, as PyTorch's is not: -ffp-contract=off, see _native.c). The
 * activations are computed here: GELU's tanh form and SiLU as x / (1 + exp(-z)) with an
 * eight-lane exp accurate to about 2 ulp, GELU's erf form with the C library's erff, so they
 * differ from PyTorch's in the last bits. Each row of a batch has the bits it has alone: the
 * products read each weight once for all rows (zoo_gemm_f32, zoo_gemm_int8), and every
 * other step runs row by row.
 * zoo/runtime/native_plan.py builds the descriptions (zoo_decoder, zoo_block...) from a model's
 * modules, and zoo/runtime/native_block.py checks every shape before it calls.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(_M_X64)
#define ZOO_X86 1
#include <immintrin.h>
#endif

/* The kernels of _native.c and _native_int8.c this file composes. */
void zoo_gemm_f32(const float *W, const float *X, const float *b, float *Y, int64_t M, int64_t N,
                  int64_t K, int threads);
int zoo_gemm_int8(const float *X, const int8_t *W, const float *w_scale, const int32_t *colsum,
                  const float *bias, float *Y, int64_t M, int64_t N, int64_t K, int threads);
void zoo_layer_norm_f32(const float *x, const float *w, const float *b, float *y, int64_t d,
                        float eps);
void zoo_rms_norm_f32(const float *x, const float *w, float *y, int64_t d, float eps,
                      float offset);
void zoo_attend_slots_f32(const float *qkv, int64_t qkv_row, float *ck, float *cv,
                          int64_t c_slot, int64_t c_head, const int64_t *slot,
                          const int64_t *pos, int64_t rows, int64_t heads, int64_t kv_heads,
                          int64_t hd, float scale, float *y, int threads);

enum { LINEAR_F32 = 0, LINEAR_INT8 = 1 };
enum { NORM_LAYER = 0, NORM_RMS = 1 };
enum { ACT_GELU = 0, ACT_GELU_TANH = 1, ACT_RELU = 2, ACT_SILU = 3 };
enum { PRE_NORM = 0, POST_NORM = 1, PARALLEL = 2 };

/* One product: float32 rows, or int8 rows with per-row scales and row sums
 * (zoo_gemv_int8's). Mirrored by zoo/kernels/native_abi.py's Linear, as each structure here
 * is. */
typedef struct {
    int64_t kind, n, k;
    const void *w;
    const float *scale;
    const int32_t *colsum;
    const float *bias; /* or NULL */
} zoo_linear;

/* A layer norm (w, b may be NULL) or an RMSNorm scaled by w + offset. */
typedef struct {
    int64_t kind;
    const float *w, *b;
    float eps, offset;
} zoo_norm;

/* A block: its layout (x + f(norm(x)), norm(x + f(x)), or both branches on x), attention
 * geometry, activation, whether the feed-forward is gated (fc gives the gate, then the up
 * projection). */
typedef struct {
    int64_t layout, d_model, heads, kv_heads, head_dim, act, gated;
    float scale;
    zoo_norm norm1, norm2;
    zoo_linear qkv, out, fc, proj;
} zoo_block;

/* y (rows, n) = x (rows, k) W^T + b, the weights read once for all rows, each row with the
 * bits the one-row kernel gives it alone (zoo_gemm_f32, zoo_gemm_int8). */
static int linear(const zoo_linear *l, const float *x, float *y, int64_t rows, int threads) {
    if (l->kind == LINEAR_INT8)
        return zoo_gemm_int8(x, (const int8_t *)l->w, l->scale, l->colsum, l->bias, y, rows,
                             l->n, l->k, threads);
    zoo_gemm_f32((const float *)l->w, x, l->bias, y, rows, l->n, l->k, threads);
    return 0;
}

/* y (rows, d) = the norm of each row of x (rows, d). */
static void norm(const zoo_norm *m, const float *x, float *y, int64_t d, int64_t rows) {
    for (int64_t r = 0; r < rows; r++) {
        if (m->kind == NORM_LAYER)
            zoo_layer_norm_f32(x + r * d, m->w, m->b, y + r * d, d, m->eps);
        else
            zoo_rms_norm_f32(x + r * d, m->w, y + r * d, d, m->eps, m->offset);
    }
}

/* y = a + b, one float addition each (PyTorch's `x + h`). */
static void add(const float *a, const float *b, float *y, int64_t d) {
    for (int64_t i = 0; i < d; i++) y[i] = a[i] + b[i];
}

/* The rotate-half rotation of the first `rot` features of each of `heads` heads (rows of hd):
 * x[i] cos[i] - x[i + rot/2] sin[i] for the first half, x[i] cos[i] + x[i - rot/2] sin[i]
 * for the second, as PyTorch computes `turned * cos + cat(-second, first) * sin`: two
 * products and one sum each, each rounded (never fused into a multiply-add: these files are
 * compiled with -ffp-contract=off, see _native.c). */
static void rotate(
    float *x, int64_t heads, int64_t hd, int64_t rot, const float *cos, const float *sin) {
    int64_t half = rot / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *row = x + h * hd;
        for (int64_t i = 0; i < half; i++) {
            float first = row[i], second = row[i + half];
            row[i] = first * cos[i] + (-second) * sin[i];
            row[i + half] = second * cos[i + half] + first * sin[i + half];
        }
    }
}

#ifdef ZOO_X86
/* exp of eight floats (Cephes' polynomial, as avx_mathfun's exp256_ps): NaN stays NaN, inputs
 * past ~88.4 give infinity, below -88.4 zero. */
__attribute__((target("avx2,fma"))) static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), x); /* NaN in x passes min and max */
    x = _mm256_max_ps(_mm256_set1_ps(-88.3762626647949f), x);
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                               _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    /* 2^n from the exponent bits: n = 128 (inputs past ~88.4) gives infinity */
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* x / (1 + exp(-z)) for eight values: SiLU (z = x) and GELU's tanh form (z = 2u, since
 * 0.5 x (1 + tanh u) = x / (1 + exp(-2u))). */
__attribute__((target("avx2,fma"))) static inline __m256 x_sigmoid(__m256 x, __m256 z) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), z));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/* GELU's tanh form's z = 2 sqrt(2/pi) (x + 0.044715 x^3). */
__attribute__((target("avx2,fma"))) static inline __m256 gelu_z(__m256 x) {
    __m256 cube = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 inner = _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), cube, x);
    return _mm256_mul_ps(_mm256_set1_ps(1.5957691216057308f), inner);
}

/* The activation `act` (ReLU, SiLU or GELU's tanh form) of eight values. */
__attribute__((target("avx2,fma"))) static inline __m256 act8(__m256 x, int64_t act) {
    if (act == ACT_RELU) /* max(0, x) keeps NaN as torch.relu does */
        return _mm256_blendv_ps(x, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    return x_sigmoid(x, act == ACT_SILU ? x : gelu_z(x));
}

/* f[0:n] = act(f[0:n]), times f[n:2n] when gated. */
__attribute__((target("avx2,fma"))) static void activate(float *f, int64_t n, int64_t act,
                                                        int64_t gated, int threads) {
    const float *up = gated ? f + n : NULL;
    if (act == ACT_GELU) { /* the C library's erff: spread over the threads */
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t i = 0; i < n; i++) {
            float g = f[i] * 0.5f * (1.0f + erff(f[i] * (float)M_SQRT1_2));
            f[i] = up ? g * up[i] : g;
        }
        return;
    }
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = act8(_mm256_loadu_ps(f + i), act);
        if (up) g = _mm256_mul_ps(g, _mm256_loadu_ps(up + i));
        _mm256_storeu_ps(f + i, g);
    }
    if (i < n) { /* the tail, eight lanes wide through a padded copy */
        float pad[8] = {0}, gate[8] = {0};
        memcpy(pad, f + i, (size_t)(n - i) * sizeof(float));
        if (up) memcpy(gate, up + i, (size_t)(n - i) * sizeof(float));
        __m256 g = act8(_mm256_loadu_ps(pad), act);
        if (up) g = _mm256_mul_ps(g, _mm256_loadu_ps(gate));
        _mm256_storeu_ps(pad, g);
        memcpy(f + i, pad, (size_t)(n - i) * sizeof(float));
    }
}
#endif

/* Where a step's rows are: `n` sequences, row r in slot slot[r] of every layer's caches
 * (slot s of a layer: its kv_heads x max_len x head_dim floats, s such blocks in), its new key
 * at position pos[r]; the first `rot` features of each of its query and key heads turn by its
 * cos and sin (rot values each, row r's at r * rot; rot 0: no rotary positions). */
typedef struct {
    int64_t n;
    const int64_t *slot, *pos;
    int64_t max_len, rot;
    const float *cos, *sin;
} zoo_rows;

/* The attention branch of normed inputs h (rows, d): a (rows, d). */
static int attention(const zoo_block *b, const zoo_rows *at, const float *h, float *qkv,
                     float *att, float *a, float *ck, float *cv, int threads) {
    int64_t hd = b->head_dim, width = b->qkv.n;
    if (linear(&b->qkv, h, qkv, at->n, threads)) return -1;
    for (int64_t r = 0; at->rot && r < at->n; r++) {
        float *q = qkv + r * width, *k = q + b->heads * hd;
        const float *cos = at->cos + r * at->rot, *sin = at->sin + r * at->rot;
        rotate(q, b->heads, hd, at->rot, cos, sin);
        rotate(k, b->kv_heads, hd, at->rot, cos, sin);
    }
    int64_t head = at->max_len * hd;
    zoo_attend_slots_f32(qkv, width, ck, cv, b->kv_heads * head, head, at->slot, at->pos, at->n,
                         b->heads, b->kv_heads, hd, b->scale, att, threads);
    return linear(&b->out, att, a, at->n, threads);
}

/* The feed-forward branch of normed inputs h (rows, d): m (rows, d); f is fc's output (rows,
 * fc.n), whose rows are then packed at proj.k apart (a gated row's activation fills its first
 * half) for proj to read. */
static int feed_forward(const zoo_block *b, const float *h, float *f, float *m, int64_t rows,
                        int threads) {
    if (linear(&b->fc, h, f, rows, threads)) return -1;
    int64_t n = b->gated ? b->fc.n / 2 : b->fc.n;
#ifdef ZOO_X86
    for (int64_t r = 0; r < rows; r++) activate(f + r * b->fc.n, n, b->act, b->gated, threads);
#endif
    for (int64_t r = 1; r < rows && n != b->fc.n; r++)
        memmove(f + r * n, f + r * b->fc.n, (size_t)n * sizeof(float));
    return linear(&b->proj, f, m, rows, threads);
}

/* y (rows, d) = the block of x (rows, d), each row at its place `at`: the new keys and values
 * are written to the caches ck, cv. Returns 0, or -1 where an int8 product met a row holding
 * NaN or infinity (or no memory was left): y is then unset, and the caller computes the block
 * otherwise (writing the same cache positions again). Only call where zoo_native_supported()
 * is 1. */
static int block_step(const zoo_block *b, const zoo_rows *at, const float *x, float *y,
                      float *ck, float *cv, int threads) {
#ifdef ZOO_X86
    int64_t d = b->d_model, n = at->n, rows_d = n * d;
    size_t floats = (size_t)(n * (4 * d + b->qkv.n + b->heads * b->head_dim + b->fc.n) + 16);
    float *scratch = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    if (!scratch) return -1;
    float *h = scratch, *a = h + rows_d, *x1 = a + rows_d, *m = x1 + rows_d;
    float *qkv = m + rows_d, *att = qkv + n * b->qkv.n, *f = att + n * b->heads * b->head_dim;
    int status = -1;
    if (b->layout == PRE_NORM) { /* x1 = x + attn(n1(x)); y = x1 + ffn(n2(x1)) */
        norm(&b->norm1, x, h, d, n);
        if (attention(b, at, h, qkv, att, a, ck, cv, threads)) goto done;
        add(x, a, x1, rows_d);
        norm(&b->norm2, x1, h, d, n);
        if (feed_forward(b, h, f, m, n, threads)) goto done;
        add(x1, m, y, rows_d);
    } else if (b->layout == POST_NORM) { /* x1 = n1(x + attn(x)); y = n2(x1 + ffn(x1)) */
        if (attention(b, at, x, qkv, att, a, ck, cv, threads)) goto done;
        add(x, a, h, rows_d);
        norm(&b->norm1, h, x1, d, n);
        if (feed_forward(b, x1, f, m, n, threads)) goto done;
        add(x1, m, h, rows_d);
        norm(&b->norm2, h, y, d, n);
    } else { /* y = x + (attn(n1(x)) + ffn(n2(x))) */
        norm(&b->norm1, x, h, d, n);
        if (attention(b, at, h, qkv, att, a, ck, cv, threads)) goto done;
        norm(&b->norm2, x, h, d, n);
        if (feed_forward(b, h, f, m, n, threads)) goto done;
        add(a, m, x1, rows_d);
        add(x, x1, y, rows_d);
    }
    status = 0;
done:
    free(scratch);
    return status;
#else
    (void)b, (void)at, (void)x, (void)y, (void)ck, (void)cv, (void)threads;
    return -1;
#endif
}

/* y (rows, d) = blocks[n - 1](... blocks[0](x)), the whole stack of a decoder in one call: layer
 * i writes its keys and values to ck[i], cv[i]. Returns 0, or -1 as block_step does (some
 * layers may then have written their caches: the caller computes the stack otherwise,
 * writing them again). */
static int stack_step(const zoo_block *blocks, int64_t n, const zoo_rows *at, const float *x,
                      float *y, float *const *ck, float *const *cv, int threads) {
    if (n <= 0) return -1;
    int64_t rows_d = at->n * blocks[0].d_model;
    float *between = aligned_alloc(64, (size_t)(2 * rows_d * sizeof(float) + 63) / 64 * 64);
    if (!between) return -1;
    const float *in = x;
    int status = 0;
    for (int64_t i = 0; i < n && status == 0; i++) {
        float *out = i == n - 1 ? y : between + (i % 2) * rows_d;
        status = block_step(blocks + i, at, in, out, ck[i], cv[i], threads);
        in = out;
    }
    free(between);
    return status;
}

/* A token embedding: float32 rows (kind 0), or int8 rows with a float32 scale each (kind 1),
 * times `scale` (1, or sqrt(d_model) rounded to float32), plus a learned position's row
 * (positions: (max_positions, d_model) float32, or NULL). */
typedef struct {
    int64_t kind, vocab, max_positions;
    const void *rows;
    const float *row_scale;
    const float *positions;
    float scale;
} zoo_embedding;

/* A decoder: embedding, blocks, an optional final norm (has_final), the head. */
typedef struct {
    zoo_embedding embedding;
    const zoo_block *blocks;
    int64_t n_blocks, has_final;
    zoo_norm final_norm;
    zoo_linear head;
} zoo_decoder;

/* The embedding of one token at `position` into x (d): rows to float, times the row's scale,
 * times `scale`, plus the position's row, each one float operation (as the per-module path). */
static void embed(const zoo_embedding *e, int64_t token, int64_t position, float *x, int64_t d) {
    for (int64_t i = 0; i < d; i++) {
        float v = e->kind == 1 ? (float)((const int8_t *)e->rows)[token * d + i] * e->row_scale[token]
                               : ((const float *)e->rows)[token * d + i];
        v = v * e->scale;
        x[i] = e->positions ? v + e->positions[position * d + i] : v;
    }
}

/* The logits of one new token for each of `rows` rows: row r's token tokens[r] at position
 * positions[r], its key and value written at cache position pos[r] of slot slot[r] (zoo_rows),
 * its queries attending to positions [0, pos[r]] of its slot: the embedding, every block
 * (stack_step), the final norm and the head, as the per-module path computes them for each
 * row alone. Rows of different sequences sit in different slots; a prompt's tokens may be
 * rows of one slot at successive positions (every row's key and value are written before any
 * row attends, so each token sees those before it). logits (outputs, head.n) holds the rows
 * output_rows[0..outputs), in increasing order (NULL: every row, outputs = rows). One
 * sequence decoding on its own is rows 1, slot 0. Returns 0, or -1 for a token, position or
 * cache position out of range or as stack_step does: logits is then unset. */
int zoo_decode_rows_f32(const zoo_decoder *m, int64_t rows, const int64_t *tokens,
                        const int64_t *positions, const int64_t *slot, const int64_t *pos,
                        int64_t outputs, const int64_t *output_rows, float *logits,
                        float *const *ck, float *const *cv, int64_t max_len, int64_t rot,
                        const float *cos, const float *sin, int threads) {
    const zoo_embedding *e = &m->embedding;
    if (m->n_blocks <= 0 || rows <= 0 || outputs <= 0 || outputs > rows ||
        (!output_rows && outputs != rows))
        return -1;
    for (int64_t r = 0; r < rows; r++)
        if (tokens[r] < 0 || tokens[r] >= e->vocab || positions[r] < 0 ||
            (e->positions && positions[r] >= e->max_positions) || slot[r] < 0 || pos[r] < 0 ||
            pos[r] >= max_len)
            return -1;
    for (int64_t o = 0; output_rows && o < outputs; o++) /* increasing: packed in place */
        if (output_rows[o] < (o ? output_rows[o - 1] + 1 : 0) || output_rows[o] >= rows)
            return -1;
    int64_t d = m->blocks[0].d_model;
    float *x = aligned_alloc(64, (size_t)(2 * rows * d * sizeof(float) + 63) / 64 * 64);
    if (!x) return -1;
    float *h = x + rows * d;
    for (int64_t r = 0; r < rows; r++) embed(e, tokens[r], positions[r], x + r * d, d);
    zoo_rows at = {rows, slot, pos, max_len, rot, cos, sin};
    int status = stack_step(m->blocks, m->n_blocks, &at, x, h, ck, cv, threads);
    if (status == 0) {
        for (int64_t o = 0; output_rows && o < outputs; o++) /* the rows wanted, packed */
            memmove(h + o * d, h + output_rows[o] * d, (size_t)d * sizeof(float));
        if (m->has_final) norm(&m->final_norm, h, x, d, outputs);
        status = linear(&m->head, m->has_final ? x : h, logits, outputs, threads);
    }
    free(x);
    return status;
}

/* The layout of the structures above, which zoo/kernels/native_abi.py mirrors with ctypes: the ABI
 * version, then for zoo_linear, zoo_norm, zoo_block, zoo_embedding and zoo_decoder in turn its
 * size and each field's offset, in bytes. zoo/kernels/native.py refuses a library whose answer is
 * not its mirrors' (a stale build, or one of other sources). ZOO_ABI_VERSION goes up, here and
 * in native_abi.py, whenever a structure or a kernel's arguments change. Writes up to
 * `capacity` values to `out` (NULL to ask only the count); returns the count. */
#define ZOO_ABI_VERSION 2
#define AT(type, field) (int64_t) offsetof(type, field)

int64_t zoo_abi(int64_t *out, int64_t capacity) {
    const int64_t abi[] = {
        ZOO_ABI_VERSION,
        sizeof(zoo_linear), AT(zoo_linear, kind), AT(zoo_linear, n), AT(zoo_linear, k),
        AT(zoo_linear, w), AT(zoo_linear, scale), AT(zoo_linear, colsum), AT(zoo_linear, bias),
        sizeof(zoo_norm), AT(zoo_norm, kind), AT(zoo_norm, w), AT(zoo_norm, b),
        AT(zoo_norm, eps), AT(zoo_norm, offset),
        sizeof(zoo_block), AT(zoo_block, layout), AT(zoo_block, d_model), AT(zoo_block, heads),
        AT(zoo_block, kv_heads), AT(zoo_block, head_dim), AT(zoo_block, act),
        AT(zoo_block, gated), AT(zoo_block, scale), AT(zoo_block, norm1), AT(zoo_block, norm2),
        AT(zoo_block, qkv), AT(zoo_block, out), AT(zoo_block, fc), AT(zoo_block, proj),
        sizeof(zoo_embedding), AT(zoo_embedding, kind), AT(zoo_embedding, vocab),
        AT(zoo_embedding, max_positions), AT(zoo_embedding, rows), AT(zoo_embedding, row_scale),
        AT(zoo_embedding, positions), AT(zoo_embedding, scale),
        sizeof(zoo_decoder), AT(zoo_decoder, embedding), AT(zoo_decoder, blocks),
        AT(zoo_decoder, n_blocks), AT(zoo_decoder, has_final), AT(zoo_decoder, final_norm),
        AT(zoo_decoder, head),
    };
    int64_t count = (int64_t)(sizeof abi / sizeof abi[0]);
    for (int64_t i = 0; out && i < count && i < capacity; i++) out[i] = abi[i];
    return count;
}
