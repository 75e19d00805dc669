// sbd's weight-only products on a CPU, int8 and int4, each row of x against the weights' output rows:
//   int8: y[r, n] = (Σ_k x[r, k] · w[n, k]) · scale[n]    (torch's `_weight_int8pack_mm` dequantization)
//   int4: y[r, n] = Σ_k x[r, k] · ((q[n, k] − 8) · s[n, g] + z[n, g]), g = k / 32   (torch's int4 dequantization)
// x in float32 (taken as it is: torch's kernels round it to bfloat16) or bfloat16, y in x's dtype; scales in
// bfloat16.
//
// Why: torch's CPU kernels are bound by their arithmetic: SmolLM2's int8 output layer (49,152 x 576) took
// 2.2 ms of a 10.8 ms int4 forward on a 2-core Xeon where reading its 28 MB takes ~1.2 ms, and each extra row
// of an int4 product cost ~1.4 ms a forward. Here the weights are read once per call whatever the rows
// (4 rows and 4 output rows at a time, the next ones asked for ahead), and every output is one sum over K in
// 16 float lanes (fused multiply-adds, K in order) whose lanes add in a fixed tree: the same arithmetic
// whatever the rows, the threads or the instruction set (AVX-512, AVX2 or plain C++, picked at run time;
// products_body.h is compiled once for each), so each row of a product is bit for bit the row alone: the
// exactness sbd-verify rests on (`sbd.models.quantized`).
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#ifndef AHEAD
#define AHEAD 4096  // bytes of weights asked for ahead of the ones being summed (reading overlaps arithmetic)
#endif

namespace sbd_products {

constexpr int LANES = 16;

inline float bf16(uint16_t h) {  // a bfloat16's value, exactly
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// the 16 lanes' sum: lane i + lane i+8, then i + i+4, i + i+2, i + i+1 (the order every instruction set keeps)
inline float tree(const float* v) {
  float a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) a[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; ++i) b[i] = a[i] + a[i + 4];
  for (int i = 0; i < 2; ++i) c[i] = b[i] + b[i + 2];
  return c[0] + c[1];
}

namespace plain {  // 16 lanes as an array, std::fma: the reference the vector paths match bit for bit
struct Vec {
  struct F { float v[LANES]; };
  static F zero() { return F{}; }
  static F load(const float* p) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = p[l]; return f; }
  static F fill(float a) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = a; return f; }
  static F fma(const F& a, const F& b, const F& c) {
    F f;
    for (int l = 0; l < LANES; ++l) f.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
    return f;
  }
  static float sum(const F& a) { return tree(a.v); }
  static F int8(const int8_t* p) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = (float)p[l]; return f; }
  // a group of 32 int4 weights dequantized, (q − 8)·s + z: byte i holds value i (low nibble) and i + 16 (high)
  static void int4(const uint8_t* p, const uint16_t* sz, F& first, F& second) {
    const float s = bf16(sz[0]), z = bf16(sz[1]);
    for (int l = 0; l < LANES; ++l) {
      first.v[l] = std::fma((float)((p[l] & 15) - 8), s, z);
      second.v[l] = std::fma((float)((p[l] >> 4) - 8), s, z);
    }
  }
  static void ahead(const void*) {}
};
#include "products_body.h"
}  // namespace plain

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {  // lanes 0-7 and 8-15 in two registers
struct Vec {
  struct F { __m256 lo, hi; };
  static F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static F fill(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
  static F fma(const F& a, const F& b, const F& c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static float sum(const F& a) {
    __m256 s = _mm256_add_ps(a.lo, a.hi);  // i + i+8
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));  // i + i+4
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));  // i + i+2
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));  // 0 + 1
  }
  static F int8(const int8_t* p) {
    __m128i b = _mm_loadu_si128((const __m128i*)p);
    return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))};
  }
  static void int4(const uint8_t* p, const uint16_t* sz, F& first, F& second) {
    const float s = bf16(sz[0]), z = bf16(sz[1]);
    const __m128i b = _mm_loadu_si128((const __m128i*)p), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    const __m256i eight = _mm256_set1_epi32(8);
    const __m256 sv = _mm256_set1_ps(s), zv = _mm256_set1_ps(z);
    auto dq = [&](__m128i bytes) {  // 8 values from the low 8 bytes
      return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepu8_epi32(bytes), eight)), sv, zv);
    };
    first = {dq(lo), dq(_mm_srli_si128(lo, 8))};
    second = {dq(hi), dq(_mm_srli_si128(hi, 8))};
  }
  static void ahead(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
};
#include "products_body.h"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace avx512 {  // 16 lanes in one register
struct Vec {
  using F = __m512;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F fill(float a) { return _mm512_set1_ps(a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(F a) {  // the same tree as avx2's on the two halves
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
  }
  static F int8(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p))); }
  // the 16 values (i − 8)·s + z once per group, then each weight picked from them by its 4 bits (the same
  // multiply-add on the same numbers as the other paths: the same bits)
  static void int4(const uint8_t* p, const uint16_t* sz, F& first, F& second) {
    const __m512i pair = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(sz));  // (s, z) as bfloat16 bits
    const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
    const __m512 z = _mm512_castsi512_ps(_mm512_and_si512(pair, _mm512_set1_epi32(int32_t(0xFFFF0000u))));
    const __m512 levels = _mm512_fmadd_ps(_mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7), s, z);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));  // the permute reads bits 0-3
    first = _mm512_permutexvar_ps(q, levels);
    second = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), levels);
  }
  static void ahead(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
};
#include "products_body.h"
}  // namespace avx512
#pragma GCC pop_options

enum class Isa { plain, avx2, avx512 };

inline Isa isa() {
  static const Isa found = __builtin_cpu_supports("avx512f")                                ? Isa::avx512
                           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Isa::avx2
                                                                                             : Isa::plain;
  return found;
}

inline Isa chosen(int64_t use) {
  const Isa best = isa();
  const Isa run = use < 0 ? best : static_cast<Isa>(use);
  TORCH_CHECK(run <= best, "this CPU lacks the instruction set asked for");
  return run;
}

// one instruction set's loops over output rows n0..n1 (products_body.h's int8_rows, int4_rows)
template <typename W>
using Rows = void (*)(const float*, int64_t, int64_t, const W*, const uint16_t*, int64_t, int64_t, float*, int64_t);

// x's rows against all of w's output rows with `rows` of the chosen instruction set: (M, N) in x's dtype; the
// threads split the output rows (each computed alone: the split changes no bits), `grain` at least per thread
template <typename W>
at::Tensor run(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, int64_t use, int64_t grain,
               const Rows<W> (&rows)[3]) {
  const Rows<W> fn = rows[static_cast<int>(chosen(use))];
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  at::Tensor xf = x.to(at::kFloat).contiguous(), wc = w.contiguous(), sc = scales.contiguous();
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const float* xp = xf.data_ptr<float>();
  const W* wp = reinterpret_cast<const W*>(wc.data_ptr());
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sc.data_ptr<at::BFloat16>());
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { fn(xp, M, K, wp, sp, n0, n1, op, N); });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// x (M, K) float32 or bfloat16, w (N, K) int8, scale (N) bfloat16: (M, N) in x's dtype. use: the instruction
// set (0 plain, 1 AVX2, 2 AVX-512; -1 the best this CPU has): the tests run each, for the same bits.
inline at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale, int64_t use = -1) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && x.is_cpu(), "int8_mm: x (M, K), w (N, K)");
  TORCH_CHECK(w.scalar_type() == at::kChar && scale.scalar_type() == at::kBFloat16 && scale.numel() == w.size(0),
              "int8_mm: int8 weights, one bfloat16 scale per output row");
  TORCH_CHECK(x.size(1) % LANES == 0, "int8_mm: the input size must be a multiple of ", LANES);
  static const Rows<int8_t> rows[3] = {plain::int8_rows, avx2::int8_rows, avx512::int8_rows};
  return run<int8_t>(x, w, scale, use, 256, rows);
}

// x (M, K) float32 or bfloat16, w (N, K / 2) uint8 (`int4_pack`), sz (N, K / 32, 2) bfloat16 (s, z per group of
// 32 inputs): (M, N) in x's dtype. use: as int8_mm's.
inline at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sz, int64_t use = -1) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && 2 * w.size(1) == x.size(1) && x.is_cpu(), "int4_mm: x (M, K), w (N, K/2)");
  TORCH_CHECK(x.size(1) % 32 == 0, "int4_mm: the input size must be a multiple of 32");
  TORCH_CHECK(w.scalar_type() == at::kByte && sz.scalar_type() == at::kBFloat16 && sz.dim() == 3 &&
                  sz.size(0) == w.size(0) && sz.size(1) == x.size(1) / 32 && sz.size(2) == 2,
              "int4_mm: uint8 weights, bfloat16 (scale, zero) per output row and group of 32");
  static const Rows<uint8_t> rows[3] = {plain::int4_rows, avx2::int4_rows, avx512::int4_rows};
  return run<uint8_t>(x, w, sz, use, 64, rows);
}

// int4 values (N, K) int32 or uint8, 0..15, in int4_mm's layout: per group of 32 inputs 16 bytes, byte i holding
// value i (low nibble) and value i + 16 (high)
inline at::Tensor int4_pack(const at::Tensor& values) {
  TORCH_CHECK(values.dim() == 2 && values.size(1) % 32 == 0, "int4_pack: values (N, K), K a multiple of 32");
  at::Tensor v = values.to(at::kByte).reshape({values.size(0), values.size(1) / 32, 2, 16});
  return v.select(2, 0).bitwise_or(v.select(2, 1).bitwise_left_shift(4)).reshape({values.size(0), -1}).contiguous();
}

}  // namespace sbd_products
