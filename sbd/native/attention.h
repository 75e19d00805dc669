// sbd's attention on a CPU for decoding forwards: each query row over the keys it sees, in float32.
//
// Why: torch's CPU attention (its flash kernel through MKL's small matrix products) takes ~17-27 us for one
// SmolLM2 query of 9 heads over 257 cached keys, ~0.5-1 ms of a 7 ms int4 forward; the arithmetic is ~0.3 M
// multiply-adds. And it is not row-invariant, so the "exact" plan (sbd/decoding/attention.py) calls it once per
// committed token. Here every query row is computed alone, in a fixed order on every instruction set
// (attention_body.h), so one call serves a whole verifying forward and each committed row is bit for bit the
// row a one-token forward computes.
#pragma once

#include "products.h"

namespace sbd_attention {

// attend_rows on raw rows, checked by the caller except for the ends: q, k, v with their (b, head, position)
// strides (the last dimension contiguous), ends (B·W) int64, out laid out (B, W, H, D). The decoder layers call it
// so, without a tensor per layer.
inline void attend_rows_at(const float* q, const int64_t* qs, const float* k, const int64_t* ks, const float* v,
                           const int64_t* vs, const int64_t* ends, int64_t B, int64_t H, int64_t Hk, int64_t W,
                           int64_t D, int64_t S, double scale, float* out, int64_t use = -1) {
  for (int64_t i = 0; i < B * W; ++i)
    TORCH_CHECK(ends[i] >= 0 && ends[i] <= S, "attend_rows: an end beyond the ", S, " keys");
  using Fn = void (*)(const float*, const int64_t*, const float*, const int64_t*, const float*, const int64_t*,
                      const int64_t*, int64_t, int64_t, int64_t, int64_t, int64_t, float, float*, int64_t, int64_t);
  static const Fn fns[3] = {sbd_products::plain::attend_rows, sbd_products::avx2::attend_rows,
                            sbd_products::avx512::attend_rows};
  const Fn fn = fns[static_cast<int>(sbd_products::chosen(use))];
  const float sc = static_cast<float>(scale);
  // query rows split between threads (each query alone: the split changes no bits), ~64k multiply-adds at least
  // per part
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, 2 * S * D));
  at::parallel_for(0, B * W * H, grain, [&](int64_t r0, int64_t r1) {
    fn(q, qs, k, ks, v, vs, ends, H, Hk, W, D, S, sc, out, r0, r1);
  });
}

// q (B, H, W, D), k and v (B, Hk, S, D), float32 on a CPU, each with contiguous last dimension; ends (B, W) int64,
// each at most S: row (b, h, w) attends to positions 0..ends[b, w] − 1 of key/value head h / (H / Hk) (a row with
// 0 gives zeros). Returns (B, H, W, D), laid out as (B, W, H, D) is contiguously: the layout the output projection
// reads, so its transpose back costs no copy. use: the instruction set, as sbd_products::int8_mm's.
inline at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& ends,
                              double scale, int64_t use = -1) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                  q.size(3) == k.size(3),
              "attend_rows: q (B, H, W, D), k and v (B, Hk, S, D)");
  const int64_t B = q.size(0), H = q.size(1), W = q.size(2), D = q.size(3), Hk = k.size(1), S = k.size(2);
  TORCH_CHECK(Hk > 0 && H % Hk == 0, "attend_rows: the query heads must be a multiple of the key/value heads");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
                  q.is_cpu() && k.is_cpu() && v.is_cpu(),
              "attend_rows: float32 tensors on a CPU");
  TORCH_CHECK(D > 0 && D % sbd_products::LANES == 0 && D <= 8 * sbd_products::LANES && q.stride(3) == 1 &&
                  k.stride(3) == 1 && v.stride(3) == 1,
              "attend_rows: a head size that is a multiple of 16 up to 128, contiguous");
  TORCH_CHECK(ends.scalar_type() == at::kLong && ends.dim() == 2 && ends.size(0) == B && ends.size(1) == W,
              "attend_rows: ends (B, W) int64");
  at::Tensor e = ends.cpu().contiguous();
  at::Tensor out = at::empty({B, W, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  const int64_t qs[3] = {q.stride(0), q.stride(1), q.stride(2)}, ks[3] = {k.stride(0), k.stride(1), k.stride(2)},
                vs[3] = {v.stride(0), v.stride(1), v.stride(2)};
  attend_rows_at(q.data_ptr<float>(), qs, k.data_ptr<float>(), ks, v.data_ptr<float>(), vs, e.data_ptr<int64_t>(), B,
                 H, Hk, W, D, S, scale, out.data_ptr<float>(), use);
  return out.transpose(1, 2);
}

}  // namespace sbd_attention
