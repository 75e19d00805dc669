// sbd's int8 weight-only product on a CPU: y = (x · wᵀ) · scale, int8 weights [N, K] with one scale per output
// row, x in float32 or bfloat16 (y in x's dtype, as torch's `_weight_int8pack_mm` gives it).
//
// Why: torch's CPU kernel is bound by its arithmetic at one row: SmolLM2's int8 output layer (49,152 x 576)
// took 2.0 ms of a 10 ms int4 forward on a 2-core Xeon, where reading its 28 MB takes ~1 ms. Here each
// output is one dot product over K in 16 float lanes (fused multiply-adds, K in order), its lanes summed in a
// fixed tree: the same arithmetic whatever the number of rows, the threads or the instruction set (AVX-512,
// AVX2 or plain C++, picked at run time), so each row of a product is bit for bit the row alone (the
// exactness sbd-verify rests on, `sbd.models.quantized`).
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace sbd_int8 {

constexpr int LANES = 16;
#ifndef AHEAD
#define AHEAD 16384
#endif
// AHEAD: how far ahead (bytes) the weights are asked for while 4 output rows (4·K contiguous bytes) are summed:
// one 64-byte line per 16 inputs covers them, so reading memory overlaps the arithmetic

// the lanes' sum: lane i + lane i+8, then i + i+4, i + i+2, i + i+1 (the order every path keeps)
inline float tree(const float* v) {
  float a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) a[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; ++i) c[i] = b[i] + b[i + 2];
  return c[0] + c[1];
}

// R rows of x (float, K each, K a multiple of 16) against C output rows n of w at a time (independent sums
// in flight: one sum alone waits on each multiply-add), n0 <= n < n1: out[r, n] = dot(x[r], w[n]) · scale[n]
template <int R, int C>
void rows_plain(const float* x, int64_t K, const int8_t* w, const float* scale, int64_t n, float* out, int64_t N) {
  float acc[R][C][LANES] = {};
  for (int64_t k = 0; k < K; k += LANES)
    #pragma GCC unroll 4
    for (int c = 0; c < C; ++c)
      #pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
        for (int l = 0; l < LANES; ++l)
          acc[r][c][l] = std::fma(x[r * K + k + l], (float)w[(n + c) * K + k + l], acc[r][c][l]);
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 4
    for (int c = 0; c < C; ++c) out[r * N + n + c] = tree(acc[r][c]) * scale[n + c];
}

__attribute__((target("avx2,fma"))) inline float tree_avx2(__m256 lo, __m256 hi) {
  __m256 a = _mm256_add_ps(lo, hi);  // i + i+8
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));  // i + i+4
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));  // i + i+2
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));  // 0 + 1
}

template <int R, int C>
__attribute__((target("avx2,fma"))) void rows_avx2(const float* x, int64_t K, const int8_t* w, const float* scale,
                                                    int64_t n, float* out, int64_t N) {
  __m256 lo[R][C], hi[R][C];  // lanes 0-7 and 8-15
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 4
    for (int c = 0; c < C; ++c) lo[r][c] = _mm256_setzero_ps(), hi[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += LANES) {
    if (C == 4) _mm_prefetch((const char*)(w + n * K + AHEAD + 4 * k), _MM_HINT_T0);
    #pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      __m128i b = _mm_loadu_si128((const __m128i*)(w + (n + c) * K + k));
      __m256 wl = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
      __m256 wh = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
      #pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        lo[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * K + k), wl, lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * K + k + 8), wh, hi[r][c]);
      }
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 4
    for (int c = 0; c < C; ++c) out[r * N + n + c] = tree_avx2(lo[r][c], hi[r][c]) * scale[n + c];
}

template <int R, int C>
__attribute__((target("avx512f"))) void rows_avx512(const float* x, int64_t K, const int8_t* w, const float* scale,
                                                     int64_t n, float* out, int64_t N) {
  __m512 acc[R][C];
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += LANES) {
    if (C == 4) _mm_prefetch((const char*)(w + n * K + AHEAD + 4 * k), _MM_HINT_T0);
    #pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      __m512 wv = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + (n + c) * K + k))));
      #pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][c] = _mm512_fmadd_ps(_mm512_loadu_ps(x + r * K + k), wv, acc[r][c]);
    }
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
    #pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      __m512 v = acc[r][c];  // the same tree as tree_avx2 on its two halves
      __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
      __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
      __m128 d = _mm_add_ps(b, _mm_movehl_ps(b, b));
      out[r * N + n + c] = _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1))) * scale[n + c];
    }
}

enum class Isa { plain, avx2, avx512 };

inline Isa isa() {
  static const Isa found = __builtin_cpu_supports("avx512f")                              ? Isa::avx512
                           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::avx2
                                                                                           : Isa::plain;
  return found;
}

template <int R, int C>
void block(Isa use, const float* x, int64_t K, const int8_t* w, const float* scale, int64_t n, float* out, int64_t N) {
  switch (use) {
    case Isa::avx512: return rows_avx512<R, C>(x, K, w, scale, n, out, N);
    case Isa::avx2: return rows_avx2<R, C>(x, K, w, scale, n, out, N);
    default: return rows_plain<R, C>(x, K, w, scale, n, out, N);
  }
}

// output rows n0..n1 for the M rows of x: 4 output rows at a time (then one), and for each, the rows of x 4 at a
// time (then one): the weights are read from memory once, whatever M
inline void rows(Isa use, const float* x, int64_t M, int64_t K, const int8_t* w, const float* scale, int64_t n0,
                 int64_t n1, float* out, int64_t N) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    int64_t r = 0;
    for (; r + 4 <= M; r += 4) block<4, 4>(use, x + r * K, K, w, scale, n, out + r * N, N);
    for (; r < M; ++r) block<1, 4>(use, x + r * K, K, w, scale, n, out + r * N, N);
  }
  for (; n < n1; ++n) {
    int64_t r = 0;
    for (; r + 4 <= M; r += 4) block<4, 1>(use, x + r * K, K, w, scale, n, out + r * N, N);
    for (; r < M; ++r) block<1, 1>(use, x + r * K, K, w, scale, n, out + r * N, N);
  }
}

// x (M, K) float32 or bfloat16, w (N, K) int8, scale (N) float32 or bfloat16: (M, N) in x's dtype. use: the
// instruction set (0 plain, 1 AVX2, 2 AVX-512; -1 the best this CPU has): the tests run each, for the same bits.
inline at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t use = -1) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "int8_mm: x (M, K) and w (N, K)");
  TORCH_CHECK(w.scalar_type() == at::kChar && x.is_cpu(), "int8_mm: int8 weights on a CPU");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % LANES == 0, "int8_mm: the input size must be a multiple of ", LANES);
  const Isa best = isa();
  const Isa run = use < 0 ? best : static_cast<Isa>(use);
  TORCH_CHECK(run <= best, "int8_mm: this CPU lacks the instruction set asked for");
  at::Tensor xf = x.to(at::kFloat).contiguous(), wc = w.contiguous(), sf = scale.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const float *xp = xf.data_ptr<float>(), *sp = sf.data_ptr<float>();
  const int8_t* wp = wc.data_ptr<int8_t>();
  float* op = out.data_ptr<float>();
  // the threads split the output rows (each computed alone: the split changes no bits), 4 x rows at a time
  at::parallel_for(0, N, 256, [&](int64_t n0, int64_t n1) { rows(run, xp, M, K, wp, sp, n0, n1, op, N); });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace sbd_int8
