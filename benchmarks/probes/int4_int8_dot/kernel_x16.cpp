// Probe, not shipped: as kernel_x8.cpp with 16 output columns per 512-bit register (AVX-512 VNNI only).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <cmath>

// Weights in groups of 16 output columns: for column group g and block b (32 k), 256 bytes = 4 x 64: byte j of
// part p holds, low nibble: k-quad 2p, high nibble: k-quad 2p+1, at column j/4, k = 4*kquad + j%4.
// d, m: (N/16, K/32, 16) float16, as a GGUF Q4_1 block keeps them (w = d*q + m). x: (M, K) float32. Returns (M, N) float32.
template <int R>
static void kernel(int64_t r0, int64_t g0, int64_t g1, int64_t K, int64_t N, const int8_t* xq, const float* dx,
                   const float* sx, const uint8_t* wp, const at::Half* dp, const at::Half* mp, float* op) {
  const int64_t B = K / 32;
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = g0; g < g1; ++g) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < B; ++b) {
      const uint8_t* wb = wp + (g * B + b) * 256;
      _mm_prefetch((const char*)(wb + 4096), _MM_HINT_T0);  // the weights a few groups ahead
      _mm_prefetch((const char*)(wb + 4096 + 64), _MM_HINT_T0);
      _mm_prefetch((const char*)(wb + 4096 + 128), _MM_HINT_T0);
      _mm_prefetch((const char*)(wb + 4096 + 192), _MM_HINT_T0);
      _mm_prefetch((const char*)(dp + (g * B + b) * 16 + 512), _MM_HINT_T0);
      _mm_prefetch((const char*)(mp + (g * B + b) * 16 + 512), _MM_HINT_T0);
      __m512i w[8];
      for (int p = 0; p < 4; ++p) {
        __m512i v = _mm512_loadu_si512((const void*)(wb + 64 * p));
        w[2 * p] = _mm512_and_si512(v, low);
        w[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
      const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(dp + (g * B + b) * 16)));
      const __m512 mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(mp + (g * B + b) * 16)));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int32_t* xr = (const int32_t*)(xq + (r0 + r) * K + b * 32);
        __m512i is = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int q = 0; q < 8; ++q) is = _mm512_dpbusd_epi32(is, w[q], _mm512_set1_epi32(xr[q]));
        const int64_t rb = (r0 + r) * B + b;
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv, _mm512_set1_ps(dx[rb])), acc[r]);
        acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sx[rb]), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(op + (r0 + r) * N + g * 16, acc[r]);
  }
}

torch::Tensor q4q8_mm(torch::Tensor x, torch::Tensor qw, torch::Tensor d, torch::Tensor m) {
  const int64_t M = x.size(0), K = x.size(1), G = d.size(0), N = G * 16, B = K / 32;
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
  at::parallel_for(0, G, 2, [&](int64_t g0, int64_t g1) {
    int64_t r0 = 0;
    for (; r0 + 4 <= M; r0 += 4) kernel<4>(r0, g0, g1, K, N, xq.data(), dx.data(), sx.data(), wp, dp, mp, op);
    for (; r0 + 2 <= M; r0 += 2) kernel<2>(r0, g0, g1, K, N, xq.data(), dx.data(), sx.data(), wp, dp, mp, op);
    for (; r0 < M; r0 += 1) kernel<1>(r0, g0, g1, K, N, xq.data(), dx.data(), sx.data(), wp, dp, mp, op);
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, mod) { mod.def("q4q8_mm", &q4q8_mm); }
