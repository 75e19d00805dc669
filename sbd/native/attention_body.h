// sbd's attention loops (attention.h), written once against `Vec` like the products' and included by products.h
// once per instruction set. No include guard: each inclusion is a namespace of its own.

// e^x, 16 at a time: x held to -87..88 (e^-87 ≈ 1.6e-38, still a normal float; e^88 ≈ 1.7e38); then
// e^x = 2^n · e^r, n the whole number nearest x·log2(e), r = x − n·ln 2 in two parts (Cody and Waite), e^r by
// Cephes' polynomial. Products and sums only, no fused multiply-add: every instruction set rounds alike.
inline typename Vec::F exp_lanes(typename Vec::F x) {
  using F = typename Vec::F;
  x = Vec::min(Vec::max(x, Vec::fill(-87.0f)), Vec::fill(88.0f));
  const F n = Vec::nearest(Vec::mul(x, Vec::fill(1.44269504088896341f)));
  F r = Vec::sub(x, Vec::mul(n, Vec::fill(0.693359375f)));
  r = Vec::sub(r, Vec::mul(n, Vec::fill(-2.12194440e-4f)));
  F p = Vec::fill(1.9875691500e-4f);
  p = Vec::add(Vec::mul(p, r), Vec::fill(1.3981999507e-3f));
  p = Vec::add(Vec::mul(p, r), Vec::fill(8.3334519073e-3f));
  p = Vec::add(Vec::mul(p, r), Vec::fill(4.1665795894e-2f));
  p = Vec::add(Vec::mul(p, r), Vec::fill(1.6666665459e-1f));
  p = Vec::add(Vec::mul(p, r), Vec::fill(5.0000001201e-1f));
  const F y = Vec::add(Vec::add(Vec::mul(p, Vec::mul(r, r)), r), Vec::fill(1.0f));
  return Vec::mul(y, Vec::pow2(n));
}

// G queries q[g] (16·C floats each) over the same keys and values 0..S−1 (rows ks and vs floats apart), each as
// if alone: out[g] = Σ_j p_j·v_j / Σ_j p_j, p_j = e^(s_j − max s), s_j = (q · k_j)·scale. q · k_j over the C chunks
// of 16 lanes in order, the lanes added in their fixed tree; the p_j 16 at a time (the last S % 16 padded, their
// lanes set to 0), summed in 16 lanes in order, then the tree; each output lane Σ_j in order. The G queries (a
// key/value head's group of query heads) share each key and value read (SmolLM2's 3 heads a group: ~10% less
// time than one query at a time), never a sum: a query's attention is the same whatever else the forward holds.
// p: G rows of room for S rounded up to 16 floats. S = 0 gives zeros.
template <int G, int C>
inline void attend_group(const float* const* q, const float* k, int64_t ks, const float* v, int64_t vs, int64_t S,
                         float scale, float* p, float* const* out) {
  using F = typename Vec::F;
  if (S == 0) {
    for (int g = 0; g < G; ++g)
      for (int64_t d = 0; d < C * LANES; ++d) out[g][d] = 0.0f;
    return;
  }
  const int64_t padded = (S + LANES - 1) / LANES * LANES;
  float top[G];
  for (int g = 0; g < G; ++g) top[g] = -INFINITY;
  for (int64_t j = 0; j < S; ++j) {
    F acc[G];
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) acc[g] = Vec::zero();
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const F kv = Vec::load(k + j * ks + c * LANES);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g] = Vec::fma(Vec::load(q[g] + c * LANES), kv, acc[g]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < G; ++g) {
      const float sj = Vec::sum(acc[g]) * scale;
      p[g * padded + j] = sj;
      top[g] = sj > top[g] ? sj : top[g];
    }
  }
  F inv[G];
  for (int g = 0; g < G; ++g) {
    float* pg = p + g * padded;
    for (int64_t j = S; j < padded; ++j) pg[j] = top[g];
    const F shift = Vec::fill(top[g]);
    for (int64_t j = 0; j < padded; j += LANES) Vec::store(pg + j, exp_lanes(Vec::sub(Vec::load(pg + j), shift)));
    for (int64_t j = S; j < padded; ++j) pg[j] = 0.0f;
    F total = Vec::zero();
    for (int64_t j = 0; j < padded; j += LANES) total = Vec::add(total, Vec::load(pg + j));
    inv[g] = Vec::fill(1.0f / Vec::sum(total));
  }
  F acc[G][C];
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[g][c] = Vec::zero();
  for (int64_t j = 0; j < S; ++j) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      const F vv = Vec::load(v + j * vs + c * LANES);
#pragma GCC unroll 4
      for (int g = 0; g < G; ++g) acc[g][c] = Vec::fma(Vec::fill(p[g * padded + j]), vv, acc[g][c]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < G; ++g)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) Vec::store(out[g] + c * LANES, Vec::mul(acc[g][c], inv[g]));
}

// n ≤ 4 queries of head size 16·C over the same keys and values
template <int C>
inline void attend_queries(const float* const* q, int n, const float* k, int64_t ks, const float* v, int64_t vs,
                           int64_t S, float scale, float* p, float* const* out) {
  if (n == 4) attend_group<4, C>(q, k, ks, v, vs, S, scale, p, out);
  else if (n == 3) attend_group<3, C>(q, k, ks, v, vs, S, scale, p, out);
  else if (n == 2) attend_group<2, C>(q, k, ks, v, vs, S, scale, p, out);
  else attend_group<1, C>(q, k, ks, v, vs, S, scale, p, out);
}

// Query rows r0..r1 of q (B, H, W, D; strides qs) over k, v (B, Hk, S, D; strides ks, vs), rows taken in (b, key/value
// head, w, query head of its group) order, row (b, h, w) over the first ends[b·W + w] positions of key/value head
// h / (H / Hk) and written to out laid out (B, W, H, D); the rows of one key/value head that see the same keys (its
// query heads, a block's columns) taken up to 4 at a time (2 for heads of 128). D = 16·C, C in 1..8 (attention.h
// checks).
inline void attend_rows(const float* q, const int64_t* qs, const float* k, const int64_t* ks, const float* v,
                        const int64_t* vs, const int64_t* ends, int64_t H, int64_t Hk, int64_t W, int64_t D,
                        int64_t S, float scale, float* out, int64_t r0, int64_t r1) {
  const int64_t group = H / Hk, padded = (S + LANES - 1) / LANES * LANES;
  std::vector<float> p(4 * padded);
  using Fn = void (*)(const float* const*, int, const float*, int64_t, const float*, int64_t, int64_t, float, float*,
                      float* const*);
  static const Fn by_chunks[8] = {attend_queries<1>, attend_queries<2>, attend_queries<3>, attend_queries<4>,
                                  attend_queries<5>, attend_queries<6>, attend_queries<7>, attend_queries<8>};
  const Fn fn = by_chunks[D / LANES - 1];
  const float* qr[4];
  float* orow[4];
  const int64_t per_head = W * group;  // rows per (b, key/value head)
  const int most = D / LANES >= 8 ? 2 : 4;  // queries at a time: their C sums each stay in registers
  for (int64_t r = r0; r < r1;) {
    const int64_t b = r / (Hk * per_head), g = r / per_head % Hk, unit_end = r - r % per_head + per_head;
    const int64_t end = ends[b * W + r % per_head / group];
    int n = 0;
    for (; n < most && r + n < std::min(r1, unit_end) && ends[b * W + (r + n) % per_head / group] == end; ++n) {
      const int64_t w = (r + n) % per_head / group, h = g * group + (r + n) % group;
      qr[n] = q + b * qs[0] + h * qs[1] + w * qs[2];
      orow[n] = out + ((b * W + w) * H + h) * D;
    }
    fn(qr, n, k + b * ks[0] + g * ks[1], ks[2], v + b * vs[0] + g * vs[1], vs[2], end, scale, p.data(), orow);
    r += n;
  }
}
