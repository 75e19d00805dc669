// sbd's weight-only products on a CPU, int8 and int4, each row of x against the weights' output rows, in
// groups g = k / 32 of the input with float16 numbers per group and output row (GGUF's Q8_0 and Q4_1 forms):
//   int8: y[r, n] = Σ_k x[r, k] · (q[n, k] · d[n, g])
//   int4: y[r, n] = Σ_k x[r, k] · (q[n, k] · d[n, g] + m[n, g]),  q in 0..15
// Each weight is formed exactly as those formats define it (q·d is exact in float32, q·d + m one rounding), so
// a model whose float weights came from such a file is computed on the very same numbers. x in float32 (taken
// as it is: torch's kernels round it to bfloat16) or bfloat16, y in x's dtype.
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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#ifndef F32_AHEAD
#define F32_AHEAD 8192
#endif
#ifndef AHEAD
#define AHEAD 4096  // bytes of weights asked for ahead of the ones being summed (reading overlaps arithmetic)
#endif

namespace sbd_products {

constexpr int LANES = 16;
constexpr int64_t MAX_GROUPS = 1024;  // groups of 32 inputs a product takes (K up to 32,768)
constexpr int64_t MAX_RANK = 256;  // the drafting adapter's rank low_rank_add takes

inline float half(uint16_t h) {  // a float16's value, exactly (what F16C's conversion gives, in plain C++)
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16, exp = (h >> 10) & 31, man = h & 1023;
  uint32_t bits;
  if (exp == 31) {
    bits = sign | 0x7F800000u | (man << 13);  // inf, nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = man;
    do { m <<= 1; ++e; } while (!(m & 1024));
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((m & 1023) << 13);
  }
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
  static void store(float* p, const F& f) { for (int l = 0; l < LANES; ++l) p[l] = f.v[l]; }
  static F add(const F& a, const F& b) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = a.v[l] + b.v[l]; return f; }
  static F fill(float a) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = a; return f; }
  static F fma(const F& a, const F& b, const F& c) {
    F f;
    for (int l = 0; l < LANES; ++l) f.v[l] = std::fma(a.v[l], b.v[l], c.v[l]);
    return f;
  }
  static F mul(const F& a, const F& b) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = a.v[l] * b.v[l]; return f; }
  static F sub(const F& a, const F& b) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = a.v[l] - b.v[l]; return f; }
  static F div(const F& a, const F& b) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = a.v[l] / b.v[l]; return f; }
  static F max(const F& a, const F& b) {  // b where a is NaN, as the vector instructions' max
    F f;
    for (int l = 0; l < LANES; ++l) f.v[l] = a.v[l] > b.v[l] ? a.v[l] : b.v[l];
    return f;
  }
  static F min(const F& a, const F& b) {  // b where a is NaN, as the vector instructions' min
    F f;
    for (int l = 0; l < LANES; ++l) f.v[l] = a.v[l] < b.v[l] ? a.v[l] : b.v[l];
    return f;
  }
  static F nearest(const F& a) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = std::nearbyint(a.v[l]); return f; }
  static F pow2(const F& n) {  // 2^n for whole n in -126..127
    F f;
    for (int l = 0; l < LANES; ++l) {
      const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n.v[l]) + 127) << 23;
      std::memcpy(&f.v[l], &bits, 4);
    }
    return f;
  }
  static void halves(const uint16_t* h, float* out, int64_t count) {  // float16s as float32, exactly
    for (int64_t i = 0; i < count; ++i) out[i] = half(h[i]);
  }
  static float sum(const F& a) { return tree(a.v); }
  static F int8(const int8_t* p) { F f; for (int l = 0; l < LANES; ++l) f.v[l] = (float)p[l]; return f; }
  // a group of 32 int4 weights dequantized, q·d + m: byte i holds value i (low nibble) and i + 16 (high)
  static void int4(const uint8_t* p, const float* dm, F& first, F& second) {
    const float d = dm[0], m = dm[1];
    for (int l = 0; l < LANES; ++l) {
      first.v[l] = std::fma((float)(p[l] & 15), d, m);
      second.v[l] = std::fma((float)(p[l] >> 4), d, m);
    }
  }
  static void ahead(const void*) {}
};
#include "products_body.h"
#include "attention_body.h"
#include "rows_body.h"
}  // namespace plain

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {  // lanes 0-7 and 8-15 in two registers
struct Vec {
  struct F { __m256 lo, hi; };
  static F zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static F load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
  static void store(float* p, const F& f) { _mm256_storeu_ps(p, f.lo), _mm256_storeu_ps(p + 8, f.hi); }
  static F add(const F& a, const F& b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
  static F fill(float a) { return {_mm256_set1_ps(a), _mm256_set1_ps(a)}; }
  static F fma(const F& a, const F& b, const F& c) {
    return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
  }
  static F mul(const F& a, const F& b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static F sub(const F& a, const F& b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
  static F div(const F& a, const F& b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
  static F max(const F& a, const F& b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
  static F min(const F& a, const F& b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
  static F nearest(const F& a) {
    constexpr int to = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    return {_mm256_round_ps(a.lo, to), _mm256_round_ps(a.hi, to)};
  }
  static F pow2(const F& n) {
    auto one = [](__m256 h) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(h), _mm256_set1_epi32(127)), 23));
    };
    return {one(n.lo), one(n.hi)};
  }
  static void halves(const uint16_t* h, float* out, int64_t count) {
    int64_t i = 0;
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(h + i))));
    for (; i < count; ++i) out[i] = _cvtsh_ss(h[i]);
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
  static void int4(const uint8_t* p, const float* dm, F& first, F& second) {
    const __m128i b = _mm_loadu_si128((const __m128i*)p), m = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    const __m256 dv = _mm256_set1_ps(dm[0]), mv = _mm256_set1_ps(dm[1]);
    auto dq = [&](__m128i bytes) {  // 8 values from the low 8 bytes
      return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes)), dv, mv);
    };
    first = {dq(lo), dq(_mm_srli_si128(lo, 8))};
    second = {dq(hi), dq(_mm_srli_si128(hi, 8))};
  }
  static void ahead(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
};
#include "products_body.h"
#include "attention_body.h"
#include "rows_body.h"
}  // namespace avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,f16c,fma")
namespace avx512 {  // 16 lanes in one register
struct Vec {
  using F = __m512;
  static F zero() { return _mm512_setzero_ps(); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F f) { _mm512_storeu_ps(p, f); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F fill(float a) { return _mm512_set1_ps(a); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F nearest(F a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F pow2(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static void halves(const uint16_t* h, float* out, int64_t count) {
    int64_t i = 0;
    for (; i + 16 <= count; i += 16)
      _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(h + i))));
    for (; i < count; ++i) out[i] = _cvtsh_ss(h[i]);
  }
  static float sum(F a) {  // the same tree as avx2's on the two halves
    __m256 s = _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
  }
  static F int8(const int8_t* p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p))); }
  // the 16 values i·d + m once per group, then each weight picked from them by its 4 bits (the same
  // multiply-add on the same numbers as the other paths: the same bits)
  static void int4(const uint8_t* p, const float* dm, F& first, F& second) {
    const __m512 d = _mm512_set1_ps(dm[0]), m = _mm512_set1_ps(dm[1]);
    const __m512 levels = _mm512_fmadd_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), d, m);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p));  // the permute reads bits 0-3
    first = _mm512_permutexvar_ps(q, levels);
    second = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), levels);
  }
  static void ahead(const void* p) { _mm_prefetch((const char*)p, _MM_HINT_T0); }
};
#include "products_body.h"
#include "attention_body.h"
#include "rows_body.h"
}  // namespace avx512
#pragma GCC pop_options

enum class Isa { plain, avx2, avx512 };

inline Isa isa() {
  static const Isa found = __builtin_cpu_supports("avx512f")                                ? Isa::avx512
                           : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                                     __builtin_cpu_supports("f16c")
                                 ? Isa::avx2
                                                                                             : Isa::plain;
  return found;
}

inline Isa chosen(int64_t use) {
  const Isa best = isa();
  const Isa run = use < 0 ? best : static_cast<Isa>(use);
  TORCH_CHECK(run <= best, "this CPU lacks the instruction set asked for");
  return run;
}

// one instruction set's loops over output rows n0..n1 (products_body.h's int8_rows, int4_rows, f32_rows)
template <typename W>
using Rows = void (*)(const float*, int64_t, int64_t, const W*, const uint16_t*, int64_t, int64_t, float*, int64_t);

// x's rows against all of w's output rows with `rows` of the chosen instruction set, then against the float32
// rows of `tail` (none when undefined): (M, N + T) in x's dtype; the threads split the output rows (each
// computed alone: the split changes no bits), `grain` at least per thread
template <typename W>
at::Tensor run(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scales, const at::Tensor& tail,
               int64_t use, int64_t grain, const Rows<W> (&rows)[3]) {
  static const Rows<float> tails[3] = {plain::f32_rows, avx2::f32_rows, avx512::f32_rows};
  const int isa_index = static_cast<int>(chosen(use));
  const Rows<W> fn = rows[isa_index];
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0), T = tail.defined() ? tail.size(0) : 0;
  at::Tensor xf = x.to(at::kFloat).contiguous(), wc = w.contiguous(), sc = scales.contiguous();
  at::Tensor out = at::empty({M, N + T}, x.options().dtype(at::kFloat));
  const float* xp = xf.data_ptr<float>();
  const W* wp = reinterpret_cast<const W*>(wc.data_ptr());
  const uint16_t* sp = reinterpret_cast<const uint16_t*>(sc.data_ptr());
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { fn(xp, M, K, wp, sp, n0, n1, op, N + T); });
  if (T > 0) {
    at::Tensor tc = tail.to(at::kFloat).contiguous();
    tails[isa_index](xp, M, K, tc.data_ptr<float>(), nullptr, 0, T, op + N, N + T);
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// x (M, K) float32 or bfloat16, w (N, K) int8, scale (N, K / 32) float16 (one per group of 32 inputs), tail
// (T, K) float32 or None: output rows of the layer held in float after the int8 ones (an output layer's rows
// int8 cannot hold exactly): (M, N + T) in x's dtype. use: the instruction set (0 plain, 1 AVX2, 2 AVX-512;
// -1 the best this CPU has): the tests run each, for the same bits.
inline at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& scale,
                          const std::optional<at::Tensor>& tail = std::nullopt, int64_t use = -1) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1) && x.is_cpu(), "int8_mm: x (M, K), w (N, K)");
  TORCH_CHECK(x.size(1) % 32 == 0 && x.size(1) <= 32 * MAX_GROUPS, "int8_mm: the input size must be a multiple of 32, "
              "at most ", 32 * MAX_GROUPS);
  TORCH_CHECK(w.scalar_type() == at::kChar && scale.scalar_type() == at::kHalf && scale.dim() == 2 &&
                  scale.size(0) == w.size(0) && scale.size(1) == x.size(1) / 32,
              "int8_mm: int8 weights, a float16 scale per output row and group of 32 inputs");
  at::Tensor t;
  if (tail.has_value() && tail->defined()) {
    t = *tail;
    TORCH_CHECK(t.dim() == 2 && t.size(1) == x.size(1) && t.scalar_type() == at::kFloat, "int8_mm: tail (T, K) float32");
  }
  static const Rows<int8_t> rows[3] = {plain::int8_rows, avx2::int8_rows, avx512::int8_rows};
  return run<int8_t>(x, w, scale, t, use, 256, rows);
}

// x (M, K) float32 or bfloat16 against the float32 weights ws (N_j, K) side by side: (M, Σ N_j) in x's dtype, each
// output one sum over K in order, as int8_mm's on the weights as they are (the layers sharing an input, e.g. q, k
// and v, in one call without joining their weights). Row-invariant, unlike a float32 matrix product of torch's:
// a row of many is bit for bit the row alone. use: as int8_mm's.
inline at::Tensor f32_mm(const at::Tensor& x, const std::vector<at::Tensor>& ws, int64_t use = -1) {
  TORCH_CHECK(x.dim() == 2 && x.is_cpu() && x.size(1) % 16 == 0 && !ws.empty(),
              "f32_mm: x (M, K) on a CPU, K a multiple of 16, and at least one weight");
  const int64_t M = x.size(0), K = x.size(1);
  std::vector<at::Tensor> wc;
  std::vector<int64_t> at_col;  // each weight's first output column
  int64_t N = 0;
  for (const at::Tensor& w : ws) {
    TORCH_CHECK(w.dim() == 2 && w.size(1) == K && w.is_cpu() && w.scalar_type() == at::kFloat,
                "f32_mm: float32 weights (N, K) on a CPU");
    wc.push_back(w.contiguous());
    at_col.push_back(N);
    N += w.size(0);
  }
  static const Rows<float> rows[3] = {plain::f32_rows, avx2::f32_rows, avx512::f32_rows};
  const Rows<float> fn = rows[static_cast<int>(chosen(use))];
  at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({M, N}, x.options().dtype(at::kFloat));
  const float* xp = xf.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (size_t j = 0; j < wc.size(); ++j) {  // this stretch of columns, weight by weight
      const int64_t lo = std::max(n0, at_col[j]), hi = std::min(n1, at_col[j] + wc[j].size(0));
      if (lo < hi) fn(xp, M, K, wc[j].data_ptr<float>(), nullptr, lo - at_col[j], hi - at_col[j], op + at_col[j], N);
    }
  });
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

// x (M, K) float32 or bfloat16, w (N, K / 2) uint8 (`int4_pack`), dm (N, K / 32, 2) float16 (d, m per group of 32
// inputs): (M, N) in x's dtype. use: as int8_mm's.
inline at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& w, const at::Tensor& dm, int64_t use = -1) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && 2 * w.size(1) == x.size(1) && x.is_cpu(), "int4_mm: x (M, K), w (N, K/2)");
  TORCH_CHECK(x.size(1) % 32 == 0 && x.size(1) <= 32 * MAX_GROUPS, "int4_mm: the input size must be a multiple of 32, "
              "at most ", 32 * MAX_GROUPS);
  TORCH_CHECK(w.scalar_type() == at::kByte && dm.scalar_type() == at::kHalf && dm.dim() == 3 &&
                  dm.size(0) == w.size(0) && dm.size(1) == x.size(1) / 32 && dm.size(2) == 2,
              "int4_mm: uint8 weights, float16 (d, m) per output row and group of 32");
  static const Rows<uint8_t> rows[3] = {plain::int4_rows, avx2::int4_rows, avx512::int4_rows};
  return run<uint8_t>(x, w, dm, at::Tensor(), use, 64, rows);
}

// int4 values (N, K) int32 or uint8, 0..15, in int4_mm's layout: per group of 32 inputs 16 bytes, byte i holding
// value i (low nibble) and value i + 16 (high)
inline at::Tensor int4_pack(const at::Tensor& values) {
  TORCH_CHECK(values.dim() == 2 && values.size(1) % 32 == 0, "int4_pack: values (N, K), K a multiple of 32");
  at::Tensor v = values.to(at::kByte).reshape({values.size(0), values.size(1) / 32, 2, 16});
  return v.select(2, 0).bitwise_or(v.select(2, 1).bitwise_left_shift(4)).reshape({values.size(0), -1}).contiguous();
}

// low_rank_add on raw rows (x: R rows of K floats `xs` apart; out: R rows of N floats `os` apart), checked by the
// caller: the decoder layers call it so, without a tensor view per layer
inline void low_rank_rows_at(const float* x, int64_t xs, int64_t R, int64_t K, const float* a, int64_t r,
                             const float* bt, int64_t N, float* out, int64_t os, float scale, int64_t use = -1) {
  using Fn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*,
                      int64_t, float);
  static const Fn fns[3] = {plain::low_rank_rows, avx2::low_rank_rows, avx512::low_rank_rows};
  fns[static_cast<int>(chosen(use))](x, xs, R, K, a, r, bt, N, out, os, scale);
}

// The drafting adapter's update at a layer's gated rows, in place: out (R, N) += scale · (x (R, K) · aᵀ) · bt,
// a (r, K) and bt (r, N) its two low-rank factors as rows; float32, rows with any stride, columns contiguous.
// Each row alone, in a fixed order on every instruction set (products_body.h's low_rank_rows). Why: from torch it
// is two small matrix products per targeted layer (420 a forward on SmolLM2's 210 layers), ~3 us of dispatch each
// for ~5 M multiply-adds in all; as one call per layer a block forward takes 0.6-0.8 ms less.
inline void low_rank_add(const at::Tensor& out, const at::Tensor& x, const at::Tensor& a, const at::Tensor& bt,
                         double scale, int64_t use = -1) {
  TORCH_CHECK(out.dim() == 2 && x.dim() == 2 && a.dim() == 2 && bt.dim() == 2 && out.size(0) == x.size(0) &&
                  a.size(1) == x.size(1) && bt.size(0) == a.size(0) && bt.size(1) == out.size(1),
              "low_rank_add: out (R, N), x (R, K), a (r, K), bt (r, N)");
  TORCH_CHECK(out.scalar_type() == at::kFloat && x.scalar_type() == at::kFloat && a.scalar_type() == at::kFloat &&
                  bt.scalar_type() == at::kFloat && out.is_cpu() && x.is_cpu() && a.is_cpu() && bt.is_cpu(),
              "low_rank_add: float32 tensors on a CPU");
  TORCH_CHECK((out.size(1) <= 1 || out.stride(1) == 1) && (x.size(1) <= 1 || x.stride(1) == 1) && a.is_contiguous() &&
                  bt.is_contiguous() && a.size(0) <= MAX_RANK,
              "low_rank_add: contiguous columns and factors, rank at most ", MAX_RANK);
  low_rank_rows_at(x.data_ptr<float>(), x.stride(0), x.size(0), x.size(1), a.data_ptr<float>(), a.size(0),
                   bt.data_ptr<float>(), bt.size(1), out.data_ptr<float>(), out.stride(0), static_cast<float>(scale),
                   use);
}

}  // namespace sbd_products
