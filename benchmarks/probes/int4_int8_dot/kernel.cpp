// Probe, not shipped: int4 weights (groups of 32 inputs, w = d*q + m with d, m in float16, as a GGUF Q4_1 block
// keeps them) times int8 activations (per row and block of 32) with integer dot products. See bench.py.
//
// Output columns are the register's lanes: COLUMNS (16: AVX-512 VNNI; 8: 256-bit VNNI, else AVX2's maddubs),
// set at build time (-DCOLUMNS=...). Weights per group g of COLUMNS columns and block b: 4 parts of 4*COLUMNS
// bytes; byte j of part p holds k-quad 2p (low nibble) and 2p+1 (high) of column j/4, k = 4*kquad + j%4.
// d, m: (N/COLUMNS, K/32, COLUMNS) float16. x: (M, K) float32. Returns (M, N) float32.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>
#include <vector>

#if COLUMNS == 16
struct Vec {  // 16 lanes
  using I = __m512i;
  using F = __m512;
  static I load(const uint8_t* p) { return _mm512_loadu_si512((const void*)p); }
  static I nibbles(I v, int high) { return _mm512_and_si512(high ? _mm512_srli_epi16(v, 4) : v, _mm512_set1_epi8(0x0F)); }
  static F halves(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
  static I izero() { return _mm512_setzero_si512(); }
  static I dot(I acc, I u, int32_t s) { return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(s)); }
  static F fzero() { return _mm512_setzero_ps(); }
  static F scaled(I is, F d, float dx, F acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc);
  }
  static F fma(F a, float b, F acc) { return _mm512_fmadd_ps(a, _mm512_set1_ps(b), acc); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
};
#else
struct Vec {  // 8 lanes
  using I = __m256i;
  using F = __m256;
  static I load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
  static I nibbles(I v, int high) { return _mm256_and_si256(high ? _mm256_srli_epi16(v, 4) : v, _mm256_set1_epi8(0x0F)); }
  static F halves(const at::Half* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
  static I izero() { return _mm256_setzero_si256(); }
  static I dot(I acc, I u, int32_t s) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, u, _mm256_set1_epi32(s));
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, u, _mm256_set1_epi32(s));
#else  // |q * x| <= 15 * 127 * 2 fits in int16
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_set1_epi32(s)), _mm256_set1_epi16(1)));
#endif
  }
  static F fzero() { return _mm256_setzero_ps(); }
  static F scaled(I is, F d, float dx, F acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc);
  }
  static F fma(F a, float b, F acc) { return _mm256_fmadd_ps(a, _mm256_set1_ps(b), acc); }
  static void store(float* p, Vec::F v) { _mm256_storeu_ps(p, v); }
};
#endif

constexpr int64_t UNIT = 16 * COLUMNS;  // bytes of one group's block: 32 inputs x COLUMNS columns x 4 bits

template <int R>  // R rows of x at once, their accumulators in registers
static void kernel(int64_t r0, int64_t g0, int64_t g1, int64_t K, int64_t N, const int8_t* xq, const float* dx,
                   const float* sx, const uint8_t* wp, const at::Half* dp, const at::Half* mp, float* op) {
  const int64_t B = K / 32;
  for (int64_t g = g0; g < g1; ++g) {
    Vec::F acc[R];
    for (int r = 0; r < R; ++r) acc[r] = Vec::fzero();
    for (int64_t b = 0; b < B; ++b) {
      const uint8_t* wb = wp + (g * B + b) * UNIT;
      for (int64_t line = 0; line < UNIT; line += 64)  // the weights a few groups ahead
        _mm_prefetch((const char*)(wb + 4096 + line), _MM_HINT_T0);
      _mm_prefetch((const char*)(dp + (g * B + b) * COLUMNS + 512), _MM_HINT_T0);
      _mm_prefetch((const char*)(mp + (g * B + b) * COLUMNS + 512), _MM_HINT_T0);
      Vec::I w[8];
      for (int p = 0; p < 4; ++p) {
        Vec::I v = Vec::load(wb + 4 * COLUMNS * p);
        w[2 * p] = Vec::nibbles(v, 0);
        w[2 * p + 1] = Vec::nibbles(v, 1);
      }
      const Vec::F dv = Vec::halves(dp + (g * B + b) * COLUMNS), mv = Vec::halves(mp + (g * B + b) * COLUMNS);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int32_t* xr = (const int32_t*)(xq + (r0 + r) * K + b * 32);
        Vec::I is = Vec::izero();
#pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) is = Vec::dot(is, w[q], xr[q]);
        const int64_t rb = (r0 + r) * B + b;
        acc[r] = Vec::fma(mv, sx[rb], Vec::scaled(is, dv, dx[rb], acc[r]));
      }
    }
    for (int r = 0; r < R; ++r) Vec::store(op + (r0 + r) * N + g * COLUMNS, acc[r]);
  }
}

// The activations rounded to int8 per row and block of 32 (scale dx; dx times their sum for the minimum's
// term), then every group of COLUMNS output columns, 4, 2 or 1 rows at a time.
torch::Tensor q4q8_mm(torch::Tensor x, torch::Tensor qw, torch::Tensor d, torch::Tensor m) {
  const int64_t M = x.size(0), K = x.size(1), G = d.size(0), N = G * COLUMNS, B = K / 32;
  auto xc = x.contiguous();
  std::vector<int8_t> xq(M * K);
  std::vector<float> dx(M * B), sx(M * B);
  const float* xp = xc.data_ptr<float>();
  for (int64_t r = 0; r < M; ++r)
    for (int64_t b = 0; b < B; ++b) {
      const float* v = xp + r * K + b * 32;
      float amax = 0.f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
      float s = amax / 127.f, inv = s > 0 ? 1.f / s : 0.f;
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        int q = (int)std::nearbyint(v[j] * inv);
        xq[r * K + b * 32 + j] = (int8_t)q;
        sum += q;
      }
      dx[r * B + b] = s;
      sx[r * B + b] = s * (float)sum;
    }
  auto out = torch::empty({M, N}, x.options());
  float* op = out.data_ptr<float>();
  const uint8_t* wp = qw.data_ptr<uint8_t>();
  const at::Half* dp = d.data_ptr<at::Half>();
  const at::Half* mp = m.data_ptr<at::Half>();
  at::parallel_for(0, G, 64 / COLUMNS, [&](int64_t g0, int64_t g1) {
    int64_t r0 = 0;
    for (; r0 + 4 <= M; r0 += 4) kernel<4>(r0, g0, g1, K, N, xq.data(), dx.data(), sx.data(), wp, dp, mp, op);
    for (; r0 + 2 <= M; r0 += 2) kernel<2>(r0, g0, g1, K, N, xq.data(), dx.data(), sx.data(), wp, dp, mp, op);
    for (; r0 < M; r0 += 1) kernel<1>(r0, g0, g1, K, N, xq.data(), dx.data(), sx.data(), wp, dp, mp, op);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) { mod.def("q4q8_mm", &q4q8_mm); }
