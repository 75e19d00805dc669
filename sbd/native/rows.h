// sbd's row-wise operations of a decoder layer on a CPU, float32: the RMS norm and the MLP's SiLU-gated product.
//
// Why: in a one-token forward of SmolLM2 torch's norm is five operations (a square, a mean made of a sum and a
// division, then the scaling) and its activation two, ~30 µs a layer of dispatch for ~3,000 numbers. Here each is
// one loop, in a fixed order on every instruction set (rows_body.h), each row alone. Both sbd's C++ and Python
// layers run them where sbd's kernels are chosen (sbd/decoding/own_kernels.py), so the two agree bit for bit;
// their rounding is not torch's.
#pragma once

#include "products.h"

namespace sbd_rows {

inline at::Tensor rows_of(const at::Tensor& x, const char* what) {  // x as (R, N) rows, its columns contiguous
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat && x.is_cpu(), what, ": float32 on a CPU");
  TORCH_CHECK(x.size(-1) % sbd_products::LANES == 0 && x.size(-1) > 0, what, ": a last size that is a multiple of 16");
  at::Tensor r = x.reshape({-1, x.size(-1)});
  return r.stride(1) == 1 ? r : r.contiguous();
}

// weight · (x · 1/sqrt(mean(x²) + eps)) over x's last dimension; x (..., H), weight (H): x's shape, contiguous.
// use: the instruction set, as sbd_products::int8_mm's.
inline at::Tensor norm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t use = -1) {
  at::Tensor r = rows_of(x, "norm");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1) && weight.scalar_type() == at::kFloat &&
                  weight.is_contiguous(),
              "norm: a float32 weight per column");
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  using Fn = void (*)(const float*, int64_t, int64_t, int64_t, const float*, float, float*);
  static const Fn fns[3] = {sbd_products::plain::norm_rows, sbd_products::avx2::norm_rows,
                            sbd_products::avx512::norm_rows};
  fns[static_cast<int>(sbd_products::chosen(use))](r.data_ptr<float>(), r.stride(0), r.size(0), r.size(1),
                                                   weight.data_ptr<float>(), static_cast<float>(eps),
                                                   out.data_ptr<float>());
  return out;
}

// silu(g) · u, g and u of one shape (..., N): that shape, contiguous. use: as norm's.
inline at::Tensor silu_mul(const at::Tensor& g, const at::Tensor& u, int64_t use = -1) {
  TORCH_CHECK(g.sizes() == u.sizes(), "silu_mul: g and u of one shape");
  at::Tensor gr = rows_of(g, "silu_mul"), ur = rows_of(u, "silu_mul");
  at::Tensor out = at::empty(g.sizes(), g.options().memory_format(at::MemoryFormat::Contiguous));
  using Fn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, float*);
  static const Fn fns[3] = {sbd_products::plain::silu_mul_rows, sbd_products::avx2::silu_mul_rows,
                            sbd_products::avx512::silu_mul_rows};
  fns[static_cast<int>(sbd_products::chosen(use))](gr.data_ptr<float>(), gr.stride(0), ur.data_ptr<float>(),
                                                   ur.stride(0), gr.size(0), gr.size(1), out.data_ptr<float>());
  return out;
}

}  // namespace sbd_rows
