// sbd's row-wise loops of a decoder layer (the norm and the MLP's activation, rows.h), written once against `Vec`
// and included by products.h once per instruction set. No include guard: each inclusion is a namespace of its own.

// out row = weight · (x row · 1/sqrt(Σ x² / H + eps)) for R rows of H floats (H a multiple of 16): Σ x² in 16 lanes
// in order, the lanes added in their fixed tree; then per element two products, as the norm writes them
inline void norm_rows(const float* x, int64_t xs, int64_t R, int64_t H, const float* weight, float eps, float* out) {
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * xs;
    typename Vec::F acc = Vec::zero();
    for (int64_t i = 0; i < H; i += LANES) {
      const typename Vec::F xv = Vec::load(xr + i);
      acc = Vec::fma(xv, xv, acc);
    }
    const float mean = Vec::sum(acc) / static_cast<float>(H);
    const typename Vec::F inv = Vec::fill(1.0f / std::sqrt(mean + eps));
    for (int64_t i = 0; i < H; i += LANES)
      Vec::store(out + r * H + i, Vec::mul(Vec::load(weight + i), Vec::mul(Vec::load(xr + i), inv)));
  }
}

// out row = silu(g row) · u row for R rows of N floats (N a multiple of 16), silu(g) = g / (1 + e^−g)
inline void silu_mul_rows(const float* g, int64_t gs, const float* u, int64_t us, int64_t R, int64_t N, float* out) {
  const typename Vec::F one = Vec::fill(1.0f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < N; i += LANES) {
      const typename Vec::F gv = Vec::load(g + r * gs + i);
      const typename Vec::F act = Vec::div(gv, Vec::add(one, exp_lanes(Vec::sub(Vec::zero(), gv))));
      Vec::store(out + r * N + i, Vec::mul(act, Vec::load(u + r * us + i)));
    }
}
