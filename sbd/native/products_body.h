// The products' loops, written once against `Vec` (16 float lanes: plain C++, AVX2 or AVX-512) and included by
// products.h once per instruction set. No include guard: each inclusion is a namespace of its own.

// R rows of x against C output rows n.. at a time (C sums in flight: one alone waits on each multiply-add),
// the weights `at(c, k)` gives 16 at a time (row n + c, inputs k..k+15), summed over K in order
template <int R, int C, typename At>
void sums(const float* x, int64_t K, const At& at, int64_t n, float* out, int64_t N) {
  typename Vec::F acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = Vec::zero();
  for (int64_t k = 0; k < K; k += LANES) {
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const typename Vec::F wv = at(c, k);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) acc[r][c] = Vec::fma(Vec::load(x + r * K + k), wv, acc[r][c]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) out[r * N + n + c] = Vec::sum(acc[r][c]);
}

// int8: each weight formed as q·d (exact in float32; the C rows' float16 scales read into float32 first, once
// per block), then summed as float weights are
template <int R, int C>
void int8_block(const float* x, int64_t K, const int8_t* w, const uint16_t* scale, int64_t n, float* out, int64_t N) {
  const int64_t G = K / 32;
  alignas(64) float ds[C * MAX_GROUPS];
  Vec::halves(scale + n * G, ds, C * G);
  sums<R, C>(x, K, [&](int c, int64_t k) {
    if (C == 4 && c == 0) Vec::ahead(w + n * K + AHEAD + 4 * k);  // the 4·K bytes of these rows, AHEAD further on
    return Vec::mul(Vec::int8(w + (n + c) * K + k), Vec::fill(ds[c * G + k / 32]));
  }, n, out, N);
}

// float32 weights (the few rows of an output layer that int8 cannot hold exactly), summed alike
template <int R, int C>
void f32_block(const float* x, int64_t K, const float* w, const uint16_t*, int64_t n, float* out, int64_t N) {
  const char* rows = reinterpret_cast<const char*>(w + n * K);  // these C rows' 4·C·K bytes, in one stretch
  sums<R, C>(x, K, [&](int c, int64_t k) {
    if (C == 4 && F32_AHEAD) Vec::ahead(rows + F32_AHEAD + 16 * k + 64 * c);  // 256 bytes a step, F32_AHEAD further on
    return Vec::load(w + (n + c) * K + k);
  }, n, out, N);
}

template <int R, int C>
void int4_block(const float* x, int64_t K, const uint8_t* w, const uint16_t* sz, int64_t n, float* out, int64_t N) {
  const int64_t G = K / 32, B = K / 2;  // groups and bytes per output row
  alignas(64) float dm[C * 2 * MAX_GROUPS];
  Vec::halves(sz + 2 * n * G, dm, C * 2 * G);
  typename Vec::F acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) acc[r][c] = Vec::zero();
  for (int64_t g = 0; g < G; ++g) {
    if (C == 4) {  // these rows' 2·K bytes and K/2 bytes of scales, further on
      Vec::ahead(w + n * B + AHEAD + 64 * g);
      Vec::ahead(sz + 2 * n * G + AHEAD / 4 + 16 * g);
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      typename Vec::F first, second;  // the group's 32 weights, dequantized
      Vec::int4(w + (n + c) * B + g * 16, dm + (c * G + g) * 2, first, second);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        acc[r][c] = Vec::fma(Vec::load(x + r * K + g * 32), first, acc[r][c]);
        acc[r][c] = Vec::fma(Vec::load(x + r * K + g * 32 + 16), second, acc[r][c]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) out[r * N + n + c] = Vec::sum(acc[r][c]);
}

// output rows n0..n1 for the M rows of x: 4 output rows at a time (then one), and for each the rows of x 4 at a
// time, then the 3, 2 or 1 left in one block (each block forms the weights again from cache; three rows as 2 + 1
// formed them twice: a 3-row forward of SmolLM2 took 12.95 ms, a 4-row one 12.04): the weights are read from
// memory once, whatever M
#define SBD_ROWS(NAME, BLOCK, W)                                                                                  \
  inline void NAME(const float* x, int64_t M, int64_t K, const W* w, const uint16_t* s, int64_t n0, int64_t n1, \
                   float* out, int64_t N) {                                                                       \
    int64_t n = n0;                                                                                               \
    for (; n + 4 <= n1; n += 4) {                                                                                 \
      int64_t r = 0;                                                                                              \
      for (; r + 4 <= M; r += 4) BLOCK<4, 4>(x + r * K, K, w, s, n, out + r * N, N);                             \
      if (M - r == 3) BLOCK<3, 4>(x + r * K, K, w, s, n, out + r * N, N);                                         \
      if (M - r == 2) BLOCK<2, 4>(x + r * K, K, w, s, n, out + r * N, N);                                         \
      if (M - r == 1) BLOCK<1, 4>(x + r * K, K, w, s, n, out + r * N, N);                                         \
    }                                                                                                             \
    for (; n < n1; ++n) {                                                                                         \
      int64_t r = 0;                                                                                              \
      for (; r + 4 <= M; r += 4) BLOCK<4, 1>(x + r * K, K, w, s, n, out + r * N, N);                             \
      for (; r < M; ++r) BLOCK<1, 1>(x + r * K, K, w, s, n, out + r * N, N);                                      \
    }                                                                                                             \
  }
SBD_ROWS(int8_rows, int8_block, int8_t)
SBD_ROWS(int4_rows, int4_block, uint8_t)
SBD_ROWS(f32_rows, f32_block, float)
#undef SBD_ROWS

// out rows += scale · ((x rows · aᵀ) · bt), each row alone (products.h's low_rank_add): t_j = x · a_j over K
// in 16 lanes, in order, the lanes added in their fixed tree, the last K % 16 after it one by one; then each
// output out_n + scale · Σ_j t_j · bt[j, n], j in order, 16 outputs at a time and the last N % 16 alike
inline void low_rank_rows(const float* x, int64_t xs, int64_t R, int64_t K, const float* a, int64_t r, const float* bt,
                          int64_t N, float* out, int64_t os, float scale) {
  float t[MAX_RANK];
  const typename Vec::F sv = Vec::fill(scale);
  for (int64_t i = 0; i < R; ++i) {
    const float* xi = x + i * xs;
    for (int64_t j = 0; j < r; ++j) {
      typename Vec::F acc = Vec::zero();
      int64_t k = 0;
      for (; k + LANES <= K; k += LANES) acc = Vec::fma(Vec::load(xi + k), Vec::load(a + j * K + k), acc);
      float sum = Vec::sum(acc);
      for (; k < K; ++k) sum = std::fma(xi[k], a[j * K + k], sum);
      t[j] = sum;
    }
    float* oi = out + i * os;
    int64_t n = 0;
    for (; n + LANES <= N; n += LANES) {
      typename Vec::F acc = Vec::zero();
      for (int64_t j = 0; j < r; ++j) acc = Vec::fma(Vec::fill(t[j]), Vec::load(bt + j * N + n), acc);
      Vec::store(oi + n, Vec::add(Vec::load(oi + n), Vec::mul(sv, acc)));
    }
    for (; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t j = 0; j < r; ++j) acc = std::fma(t[j], bt[j * N + n], acc);
      const float scaled = scale * acc;
      oi[n] = oi[n] + scaled;
    }
  }
}
