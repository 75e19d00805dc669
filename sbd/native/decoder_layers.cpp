// The decoder layers of sbd's Llama forward (sbd/decoding/llama_forward.py), the same operations in the same
// order, called from C++: the bits are the Python forward's, without the Python between the operations. Both
// attend on sbd's own kernel (attention.h) where the forward passes each query's key count, else on torch's.
//
// Why: a one-token forward of SmolLM2-135M with int4 weights makes ~2,000 small operations (norms, casts,
// the rotation, views, cache writes); each costs ~1.4 us called from Python and ~0.7 us from C++, and the
// Python around them as much again. See sbd/decoding/native_layers.py for what runs here and what does not.
// It also holds sbd's int8 and int4 products (products.h), attention (attention.h) and row kernels (rows.h), which
// `sbd.models.quantized`, `sbd.decoding.attention` and `sbd.decoding.llama_forward` call from Python too.
#include <torch/extension.h>

#include "attention.h"
#include "products.h"
#include "rows.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace {

using at::Tensor;

// One linear layer: its product (a float linear, torch's int8 or int4 weight-only kernel), its bias (added
// after the product, in float) and the drafting adapter's update (A^T, B^T) when the adapter targets it.
struct Linear {
  // 0 float (F.linear with its bias), 1 int8 (torch's kernel), 2 int4 (torch's), 3 float through the narrow path,
  // 4 int8 on sbd's product, 5 int4 on sbd's (products.h)
  int64_t kind = 0;
  Tensor weight, scales, bias, a_t, b_t;
  Tensor a_rows, bt_rows;  // the update's factors as low_rank_add takes them (r, in) and (r, out), or undefined
  int64_t group = 0;
  int64_t narrow_lo = 2, narrow_hi = 0;  // kind 3: positions per forward that take the narrow path
  bool has_bias = false, has_update = false;
  // a float32 layer (kinds 0, 3) on sbd's product (f32_mm) in forwards of up to f32_rows positions (0: never),
  // of `parts` side by side when a joint product (own_kernels.FloatProduct)
  int64_t f32_rows = 0;
  std::vector<Tensor> parts;

  bool quantized() const { return kind == 1 || kind == 2 || kind == 4 || kind == 5; }
  bool own_f32(int64_t rows) const { return rows <= f32_rows && !at::GradMode::is_enabled(); }

  Tensor product(const Tensor& flat) const {  // the quantized kernels, rows in as `kernel_input` gives them, out alike
    if (f32_rows > 0) return sbd_products::f32_mm(flat, parts.empty() ? std::vector<Tensor>{weight} : parts);
    if (kind == 4) return sbd_products::int8_mm(flat, weight, scales);
    if (kind == 5) return sbd_products::int4_mm(flat, weight, scales);
    if (kind == 1) return at::_weight_int8pack_mm(flat, weight, scales);
    return at::_weight_int4pack_mm_for_cpu(flat, weight, group, scales);
  }
};

// Layers sharing an input in one kernel call (q, k, v; gate, up): the joint weights, or none.
struct Joint {
  bool present = false;
  Linear product;
  std::vector<int64_t> sizes;

  bool runs(int64_t rows) const { return present && (product.f32_rows == 0 || product.own_f32(rows)); }
};

struct Layer {
  Tensor norm1, norm2;
  double eps1 = 0, eps2 = 0, scaling = 1;
  int64_t head_dim = 0;
  Linear q, k, v, o, gate, up, down;
  Joint qkv, gu;
};

struct Step {  // one forward's cache writes, attention plan and adapter gate
  int64_t lo, hi, visible, write_from;  // write_from < 0: scatter at write_at
  Tensor write_at;
  std::string plan;
  int64_t length, width;
  bool causal_blocks;
  Tensor mask;  // split/rows plans
  std::vector<int64_t> rows;  // exact plan: (length, fed, committed, prefill) per row
  // the drafting adapter's gate (sbd/drafters/gated.py, as llama_forward.LlamaForward applies it): 0 no block
  // in this forward; 1 one row, its block from column gate_start (one addmm on the flattened rows); 2 every
  // row's block from column gate_start (baddbmm); 3 a block per row, gate_per_row (B, W, 1) 1 on its columns
  int64_t gate_mode, gate_start;
  Tensor gate_per_row;
  double adapter_scaling;
  bool own_update;  // the adapter's update on sbd's low_rank_add where it takes it (else torch's two products)
  bool own;  // the norms and the activation on sbd's kernels (rows.h), else torch's operations
  Tensor ends;  // (B, W) keys each query sees: attention on sbd's attend_rows (attention.h), whatever the plan; or
                // undefined: torch's, as the plan says
};

// weight · (x · rsqrt(var + eps)) over float32 rows: the Python norm's four operations after its mean in one loop,
// each rounded as they round it (eps taken as float32, as a tensor's sum with a number takes it; 1/sqrt, as
// rsqrt computes it; no fused multiply-add: the build says -ffp-contract=off): the same bits, one call, not four
Tensor scaled_by_norm(const Tensor& weight, const Tensor& x, const Tensor& var, double eps) {
  const int64_t H = x.size(-1), rows = x.numel() / std::max<int64_t>(H, 1);
  Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  const float* xp = x.data_ptr<float>();
  const float* vp = var.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = 1.0f / std::sqrt(vp[r] + e);
    for (int64_t i = 0; i < H; ++i) {
      const float scaled = xp[r * H + i] * inv;
      op[r * H + i] = wp[i] * scaled;
    }
  }
  return out;
}

Tensor rms_norm(const Tensor& weight, double eps, const Tensor& x) {
  if (x.scalar_type() == at::kFloat) {
    Tensor var = x.pow(2).mean({-1}, true);
    if (weight.scalar_type() == at::kFloat && weight.dim() == 1 && weight.size(0) == x.size(-1) &&
        weight.is_contiguous() && x.is_contiguous() && var.is_contiguous())
      return scaled_by_norm(weight, x, var, eps);
    return weight * (x * at::rsqrt(var + eps));
  }
  Tensor h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean({-1}, true) + eps);
  return weight * h.to(x.scalar_type());
}

// x · cos + x.roll(half, -1) · sin, sin's first half negated (llama_forward's rotation): the first product by ATen,
// which lays the result out as it laid it out before, then the rolled product added in place by one loop, each
// rounded as ATen rounds it: the same bits and layout, two calls where the roll and the sum made four
Tensor rotate(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t half = cos.size(-1) / 2;
  Tensor out = x * cos;
  const bool plain = x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat &&
                     sin.scalar_type() == at::kFloat && x.dim() == 4 && sin.dim() == 4 && x.stride(3) == 1 &&
                     out.stride(3) == 1 && sin.stride(3) == 1 && sin.size(1) == 1 &&
                     (sin.size(0) == x.size(0) || sin.size(0) == 1) && sin.size(2) == x.size(2) &&
                     sin.size(3) == x.size(3) && x.size(3) == 2 * half;
  if (!plain) return out + x.roll({half}, {-1}) * sin;
  const int64_t B = x.size(0), Hn = x.size(1), W = x.size(2), D = x.size(3);
  const float* xp = x.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hn; ++h)
      for (int64_t w = 0; w < W; ++w) {
        const float* xr = xp + b * x.stride(0) + h * x.stride(1) + w * x.stride(2);
        const float* sr = sp + (sin.size(0) == 1 ? 0 : b * sin.stride(0)) + w * sin.stride(2);
        float* orow = op + b * out.stride(0) + h * out.stride(1) + w * out.stride(2);
        for (int64_t d = 0; d < D; ++d) {
          const float rolled = xr[(d + half) % D] * sr[d];
          orow[d] = orow[d] + rolled;
        }
      }
  return out;
}

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
            const std::optional<Tensor>& mask = std::nullopt);

Tensor folded(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  int64_t b = q.size(0), h = q.size(1), w = q.size(2), d = q.size(3);
  int64_t groups = h / k.size(1);
  if (groups == 1 || !q.is_cpu()) return sdpa(q, k, v, scale);
  Tensor f = q.reshape({b, k.size(1), groups * w, d});
  return at::scaled_dot_product_attention(f, k, v, std::nullopt, 0.0, false, scale, false).view({b, h, w, d});
}

Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const std::optional<Tensor>& mask) {
  bool gqa = q.size(1) != k.size(1);
  if (gqa && !mask.has_value() && q.size(2) == 1 && q.is_cpu()) return folded(q, k, v, scale);
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale, gqa);
}

Tensor lower_right(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  int64_t nq = q.size(2), s = k.size(2);
  if (nq == 1) return sdpa(q, k, v, scale);
  Tensor mask = at::ones({nq, s}, q.options().dtype(at::kBool)).tril(s - nq);
  return sdpa(q, k, v, scale, mask);
}

using at::indexing::Slice;

Tensor exact(const Tensor& q, const Tensor& k, const Tensor& v, const Step& st, double scale) {
  int64_t width = q.size(2);
  int64_t nrows = static_cast<int64_t>(st.rows.size()) / 4;
  if (nrows == 1 && width == 1 && st.rows[1] == 1 && st.rows[2] == 1) {
    int64_t end = st.rows[0] + 1;
    return sdpa(q, k.index({Slice(), Slice(), Slice(0, end)}), v.index({Slice(), Slice(), Slice(0, end)}), scale);
  }
  Tensor out = at::zeros_like(q);
  for (int64_t b = 0; b < nrows; ++b) {
    int64_t length = st.rows[4 * b], n = st.rows[4 * b + 1], c = st.rows[4 * b + 2];
    bool prefill = st.rows[4 * b + 3] != 0;
    int64_t first = width - n;
    Tensor qb = q.slice(0, b, b + 1), kb = k.slice(0, b, b + 1), vb = v.slice(0, b, b + 1);
    if (prefill && c) {
      int64_t end = length + c;
      out.slice(0, b, b + 1).slice(2, first, first + c).copy_(
          lower_right(qb.slice(2, first, first + c), kb.slice(2, 0, end), vb.slice(2, 0, end), scale));
    } else {
      for (int64_t t = 0; t < c; ++t) {
        int64_t end = length + t + 1, col = first + t;
        out.slice(0, b, b + 1).slice(2, col, col + 1).copy_(
            sdpa(qb.slice(2, col, col + 1), kb.slice(2, 0, end), vb.slice(2, 0, end), scale));
      }
    }
    if (c < n) {
      int64_t end = length + n;
      Tensor block = qb.slice(2, first + c);
      Tensor kk = kb.slice(2, 0, end), vv = vb.slice(2, 0, end);
      out.slice(0, b, b + 1).slice(2, first + c).copy_(st.causal_blocks ? lower_right(block, kk, vv, scale)
                                                                         : folded(block, kk, vv, scale));
    }
  }
  return out;
}

Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Step& st, double scale) {
  if (st.ends.defined()) return sbd_attention::attend_rows(q, k, v, st.ends, scale);
  if (st.plan == "exact") return exact(q, k, v, st, scale);
  if (st.plan == "rows") return sdpa(q, k, v, scale, st.mask);
  int64_t end = st.length + st.width;
  TORCH_CHECK(k.size(2) >= end, "the cache holds ", k.size(2), " positions, the layout needs ", end);
  Tensor kk = k.slice(2, 0, end), vv = v.slice(2, 0, end);
  if (st.plan == "open") return sdpa(q, kk, vv, scale);
  TORCH_CHECK(st.mask.defined(), "the split plan runs here under its shared mask only");
  return sdpa(q, kk, vv, scale, st.mask);
}

// sbd/models/narrow_linear.py, narrow_linear: F.linear(x, weight, bias) as weight . x^T for few positions.
Tensor narrow_linear(const Tensor& x, const Linear& lin) {
  constexpr int64_t pad = 8;
  Tensor flat = x.reshape({-1, x.size(-1)});
  int64_t m = flat.size(0);
  int64_t cols = m > pad ? (m + pad - 1) / pad * pad : std::max<int64_t>(m, 2);
  if (cols != m) flat = at::cat({flat, flat.new_zeros({cols - m, flat.size(1)})});
  Tensor out = lin.has_bias ? at::addmm(lin.bias.unsqueeze(1), lin.weight, flat.t()) : at::matmul(lin.weight, flat.t());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(lin.weight.size(0));
  return out.t().slice(0, 0, m).contiguous().reshape(shape);
}

// A float layer's own forward: nn.Linear's, or NarrowLinear's choice between the two forms.
Tensor float_linear(const Tensor& x, const Linear& lin) {
  if (lin.kind == 3) {
    int64_t m = x.size(-1) ? x.numel() / x.size(-1) : 0;
    if (lin.narrow_lo <= m && m <= lin.narrow_hi && x.is_cpu() && !at::GradMode::is_enabled())
      return narrow_linear(x, lin);
  }
  return at::linear(x, lin.weight, lin.has_bias ? std::optional<Tensor>(lin.bias) : std::nullopt);
}

// The gated rows of a layer's input in gate mode 1.
Tensor gated(const Tensor& x, const Step& st) {
  return x.view({-1, x.size(-1)}).slice(0, st.gate_start);
}

// out (B, W, n), the layer's output for input x, with the adapter's gated update: in place (modes 1, 2:
// LlamaForward's one-row slice, gated_update's in-place form) or a new tensor (mode 3: its per-row form).
Tensor add_gated(const Linear& lin, const Tensor& x, const Tensor& out, const Step& st) {
  const bool own = st.own_update && lin.a_rows.defined() &&
                   ((st.gate_mode == 1 && x.size(0) == 1) || st.gate_mode == 2) &&
                   x.dim() == 3 && out.dim() == 3 && x.scalar_type() == at::kFloat &&
                   out.scalar_type() == at::kFloat && x.is_cpu() && x.stride(2) == 1 && out.stride(2) == 1 &&
                   x.size(2) == lin.a_rows.size(1) && out.size(2) == lin.bt_rows.size(1);
  if (own) {  // every row's block from gate_start (mode 1: the one row's), on raw rows: no view per layer
    const int64_t W = x.size(1), from = std::min(std::max<int64_t>(st.gate_start, 0), W);
    for (int64_t b = 0; b < out.size(0); ++b)
      sbd_products::low_rank_rows_at(x.data_ptr<float>() + b * x.stride(0) + from * x.stride(1), x.stride(1), W - from,
                                     x.size(2), lin.a_rows.data_ptr<float>(), lin.a_rows.size(0),
                                     lin.bt_rows.data_ptr<float>(), out.size(2),
                                     out.data_ptr<float>() + b * out.stride(0) + from * out.stride(1), out.stride(1),
                                     static_cast<float>(st.adapter_scaling));
    return out;
  }
  if (st.gate_mode == 1) {
    Tensor g = gated(x, st);
    Tensor flat = out.view({-1, out.size(-1)});
    flat.slice(0, flat.size(0) - g.size(0)).addmm_(at::mm(g, lin.a_t), lin.b_t, 1, st.adapter_scaling);
    return out;
  }
  if (st.gate_mode == 3) {
    auto dtype = x.scalar_type();
    Tensor low_rank = at::matmul(at::matmul(x, lin.a_t.to(dtype)), lin.b_t.to(dtype));
    return out + low_rank * st.adapter_scaling * st.gate_per_row;
  }
  Tensor block = out.slice(1, st.gate_start);
  block.baddbmm_(at::matmul(x.slice(1, st.gate_start), lin.a_t), lin.b_t.expand({out.size(0), -1, -1}), 1,
                 st.adapter_scaling);
  return out;
}

// The layer's output for x (B, W, in): a quantized layer's stays in its kernel's dtype (torch's: bfloat16)
// unless the adapter adds to it (llama_forward.LlamaForward._linear).
Tensor linear(const Linear& lin, const Tensor& x, const Tensor& xq, const Step& st, const Tensor& joint = Tensor()) {
  Tensor y;
  if (lin.quantized() || joint.defined() || (lin.f32_rows > 0 && lin.own_f32(x.size(-1) ? x.numel() / x.size(-1) : 0))) {
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
    shape.push_back(-1);
    y = (joint.defined() ? joint : lin.product(xq)).view(shape);
    if (lin.has_bias) y = y + lin.bias;
  } else {
    y = float_linear(x, lin);
  }
  if (st.gate_mode == 0 || !lin.has_update) return y;
  return add_gated(lin, x, y.to(x.scalar_type()), st);
}

// A quantized layer's input as its kernel takes it: bfloat16 for torch's kernels (kinds 1, 2), as it is for
// sbd's products (4, 5) and a float layer on sbd's (f32_rows); none for another float layer
// (LlamaForward._kernel_input).
Tensor kernel_input(const Tensor& x, const Linear& lin) {
  if (!lin.quantized() && lin.f32_rows == 0) return Tensor();
  Tensor flat = x.reshape({-1, x.size(-1)});
  return lin.kind == 1 || lin.kind == 2 ? flat.to(at::kBFloat16) : flat;
}

// One layer's attention on sbd's kernel from its joint q, k, v product y (B·W rows of q's, k's and v's columns,
// float32, contiguous), as the other path computes it, on raw rows: q and k rotated as `rotate` does (x·cos, then
// the rolled x·sin added: three roundings, the same bits), k and v written to the slot cache at the forward's
// positions, each query over the first ends[b, w] positions (attention.h). Returns (B, W, heads·D). Why: the
// same steps through tensors took ~20 calls a layer (views, slices, the rotation's two, the cache's copies).
Tensor rotated_attention(const Tensor& y, const std::vector<int64_t>& sz, int64_t D, const Tensor& cos,
                         const Tensor& sin, const Tensor& keys, const Tensor& values, const Step& st, double scale,
                         int64_t B, int64_t W) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.dim() == 4 &&
                  sin.dim() == 4 && cos.size(2) == W && cos.size(3) == D && sin.sizes() == cos.sizes() &&
                  cos.stride(3) == 1 && sin.stride(3) == 1,
              "the rotation's tables: (B or 1, 1, W, D) float32");
  const int64_t H = sz[0] / D, Hk = sz[1] / D, N = y.size(1), half = D / 2;
  Tensor q = at::empty({B, W, H, D}, y.options());
  Tensor att = at::empty({B, W, H * D}, y.options());
  const float* yp = y.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  float* qp = q.data_ptr<float>();
  float* kp = keys.data_ptr<float>() + st.lo * keys.stride(0);
  float* vp = values.data_ptr<float>() + st.lo * values.stride(0);
  const int64_t ks[3] = {keys.stride(0), keys.stride(1), keys.stride(2)};
  const int64_t vs[3] = {values.stride(0), values.stride(1), values.stride(2)};
  Tensor at_ = st.write_from >= 0 ? Tensor() : st.write_at.to(at::kLong).contiguous();
  const int64_t* atp = at_.defined() ? at_.data_ptr<int64_t>() : nullptr;
  auto turn = [&](const float* x, const float* c, const float* s, float* out) {
    for (int64_t d = 0; d < D; ++d) {
      const float straight = x[d] * c[d];
      const float rolled = x[(d + half) % D] * s[d];
      out[d] = straight + rolled;
    }
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t w = 0; w < W; ++w) {
      const float* row = yp + (b * W + w) * N;
      const int64_t cb = cos.size(0) == 1 ? 0 : b;
      const float* c = cp + cb * cos.stride(0) + w * cos.stride(2);
      const float* s = sp + cb * sin.stride(0) + w * sin.stride(2);
      const int64_t pos = atp ? atp[b * W + w] : st.write_from + w;
      TORCH_CHECK(pos >= 0 && pos < keys.size(2), "a position past the cache");
      for (int64_t h = 0; h < H; ++h) turn(row + h * D, c, s, qp + ((b * W + w) * H + h) * D);
      for (int64_t g = 0; g < Hk; ++g) {
        turn(row + sz[0] + g * D, c, s, kp + b * ks[0] + g * ks[1] + pos * ks[2]);
        std::memcpy(vp + b * vs[0] + g * vs[1] + pos * vs[2], row + sz[0] + sz[1] + g * D, D * sizeof(float));
      }
    }
  Tensor e = st.ends.contiguous();
  const int64_t qs[3] = {W * H * D, D, H * D};
  sbd_attention::attend_rows_at(qp, qs, kp, ks, vp, vs, e.data_ptr<int64_t>(), B, H, Hk, W, D, st.visible, scale,
                                att.data_ptr<float>());
  return att;
}

class DecoderLayers {
 public:
  void add_layer(Tensor norm1, double eps1, Tensor norm2, double eps2, int64_t head_dim, double scaling,
                 std::vector<py::tuple> linears, py::object qkv, py::object gu) {
    Layer l;
    l.norm1 = norm1, l.eps1 = eps1, l.norm2 = norm2, l.eps2 = eps2, l.head_dim = head_dim, l.scaling = scaling;
    TORCH_CHECK(linears.size() == 7, "a layer has 7 linear layers");
    Linear* slots[7] = {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down};
    for (int i = 0; i < 7; ++i) *slots[i] = to_linear(linears[i]);
    l.qkv = to_joint(qkv);
    l.gu = to_joint(gu);
    layers_.push_back(std::move(l));
  }

  Tensor forward(Tensor h, const Tensor& cos, const Tensor& sin, const std::vector<Tensor>& keys,
                 const std::vector<Tensor>& values, int64_t lo, int64_t hi, int64_t visible, int64_t write_from,
                 const std::optional<Tensor>& write_at, const std::string& plan, int64_t length, int64_t width,
                 bool causal_blocks, const std::optional<Tensor>& mask, std::vector<int64_t> rows,
                 int64_t gate_mode, int64_t gate_start, const std::optional<Tensor>& gate_per_row,
                 double adapter_scaling, bool own_update, bool own, const std::optional<Tensor>& ends) {
    py::gil_scoped_release unlocked;
    Step st{lo, hi, visible, write_from, write_at.value_or(Tensor()), plan, length, width, causal_blocks,
            mask.value_or(Tensor()), std::move(rows), gate_mode, gate_start, gate_per_row.value_or(Tensor()),
            adapter_scaling, own_update, own, ends.value_or(Tensor())};
    int64_t B = h.size(0), W = h.size(1);
    auto dtype = h.scalar_type();
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& L = layers_[i];
      int64_t hd = L.head_dim;
      Tensor x = st.own ? sbd_rows::norm(h, L.norm1, L.eps1) : rms_norm(L.norm1, L.eps1, h);
      Tensor xq = kernel_input(x, L.q);
      Tensor qs, ks, vs, att;
      if (L.qkv.runs(B * W)) {
        const auto& sz = L.qkv.sizes;
        Tensor y = L.qkv.product.product(xq).to(dtype);
        const Linear* lins[3] = {&L.q, &L.k, &L.v};
        for (int j = 0; j < 3; ++j) {
          if (!lins[j]->has_bias && (st.gate_mode == 0 || !lins[j]->has_update)) continue;
          Tensor part = y.narrow(1, j == 0 ? 0 : j == 1 ? sz[0] : sz[0] + sz[1], sz[j]);
          if (lins[j]->has_bias) part.add_(lins[j]->bias);
          if (st.gate_mode == 0 || !lins[j]->has_update) continue;
          part = part.view({B, W, -1});
          part.copy_(add_gated(*lins[j], x, part, st));  // in place already in modes 1 and 2 (a copy onto itself: none)
        }
        if (st.ends.defined() && y.scalar_type() == at::kFloat && y.is_contiguous() &&
            keys[i].scalar_type() == at::kFloat && keys[i].stride(3) == 1 && values[i].stride(3) == 1) {
          att = rotated_attention(y, sz, hd, cos, sin, keys[i], values[i], st, L.scaling, B, W);
        } else {
          Tensor qk = y.slice(1, 0, sz[0] + sz[1]).view({B, W, -1, hd}).transpose(1, 2);
          vs = y.slice(1, sz[0] + sz[1]).view({B, W, -1, hd}).transpose(1, 2);
          qk = rotate(qk, cos, sin);
          qs = qk.slice(1, 0, sz[0] / hd);
          ks = qk.slice(1, sz[0] / hd);
        }
      } else {
        qs = linear(L.q, x, xq, st).view({B, W, -1, hd}).transpose(1, 2).to(dtype);
        ks = linear(L.k, x, xq, st).view({B, W, -1, hd}).transpose(1, 2).to(dtype);
        vs = linear(L.v, x, xq, st).view({B, W, -1, hd}).transpose(1, 2).to(dtype);
        qs = rotate(qs, cos, sin);
        ks = rotate(ks, cos, sin);
      }
      if (!att.defined()) {
        // the slot cache's write (sbd/decoding/cache.py, SlotLayer.update)
        Tensor kc = keys[i].slice(0, st.lo, st.hi), vc = values[i].slice(0, st.lo, st.hi);
        if (st.write_from >= 0) {
          kc.slice(2, st.write_from, st.write_from + ks.size(2)).copy_(ks);
          vc.slice(2, st.write_from, st.write_from + vs.size(2)).copy_(vs);
        } else {
          Tensor at_ = st.write_at.unsqueeze(1).unsqueeze(3);
          kc.scatter_(2, at_.expand_as(ks), ks);
          vc.scatter_(2, at_.expand({-1, vs.size(1), -1, vs.size(-1)}), vs);
        }
        kc = kc.slice(2, 0, st.visible);
        vc = vc.slice(2, 0, st.visible);
        att = attend(qs, kc, vc, st, L.scaling).transpose(1, 2).reshape({B, W, -1});
      }
      h = h + linear(L.o, att, kernel_input(att, L.o), st);
      x = st.own ? sbd_rows::norm(h, L.norm2, L.eps2) : rms_norm(L.norm2, L.eps2, h);
      xq = kernel_input(x, L.gate);
      Tensor yg, yu;
      if (L.gu.runs(B * W)) {
        auto parts = L.gu.product.product(xq).split_with_sizes(L.gu.sizes, -1);
        yg = parts[0], yu = parts[1];
      }
      Tensor mid = st.own ? sbd_rows::silu_mul(linear(L.gate, x, xq, st, yg).to(dtype),
                                               linear(L.up, x, xq, st, yu).to(dtype))
                          : at::silu(linear(L.gate, x, xq, st, yg).to(dtype)) * linear(L.up, x, xq, st, yu);
      h = h + linear(L.down, mid, kernel_input(mid, L.down), st);
    }
    return h;
  }

  int64_t size() const { return static_cast<int64_t>(layers_.size()); }

 private:
  // (kind, weight, scales, group, bias or None, A^T or None, B^T or None, narrow lo, narrow hi, A or None,
  // B^T contiguous or None, f32 rows)
  static Linear to_linear(const py::tuple& t) {
    Linear lin;
    lin.kind = t[0].cast<int64_t>();
    lin.weight = t[1].cast<Tensor>();
    if (!t[2].is_none()) lin.scales = t[2].cast<Tensor>();
    lin.group = t[3].cast<int64_t>();
    lin.has_bias = !t[4].is_none();
    if (lin.has_bias) lin.bias = t[4].cast<Tensor>();
    lin.has_update = !t[5].is_none();
    if (lin.has_update) lin.a_t = t[5].cast<Tensor>(), lin.b_t = t[6].cast<Tensor>();
    lin.narrow_lo = t[7].cast<int64_t>(), lin.narrow_hi = t[8].cast<int64_t>();
    if (!t[9].is_none()) lin.a_rows = t[9].cast<Tensor>(), lin.bt_rows = t[10].cast<Tensor>();
    lin.f32_rows = t[11].cast<int64_t>();
    return lin;
  }

  // None, or (kind, weight, scales, group, sizes, f32 rows, float32 weights side by side or None)
  static Joint to_joint(const py::object& o) {
    Joint j;
    if (o.is_none()) return j;
    auto t = o.cast<py::tuple>();
    j.present = true;
    j.product.kind = t[0].cast<int64_t>();
    j.product.weight = t[1].cast<Tensor>();
    if (!t[2].is_none()) j.product.scales = t[2].cast<Tensor>();
    j.product.group = t[3].cast<int64_t>();
    j.sizes = t[4].cast<std::vector<int64_t>>();
    j.product.f32_rows = t[5].cast<int64_t>();
    if (!t[6].is_none()) j.product.parts = t[6].cast<std::vector<Tensor>>();
    return j;
  }

  std::vector<Layer> layers_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_mm", &sbd_products::int8_mm, py::arg("x"), py::arg("w"), py::arg("scale"), py::arg("tail") = py::none(),
        py::arg("use") = -1,
        "x (M, K) · (int8 w (N, K) · float16 scale per group of 32 (N, K/32))ᵀ, then the float32 rows of tail (T, K) or "
        "None: (M, N + T) in x's dtype; use: 0 plain C++, 1 AVX2, 2 AVX-512, -1 the best here");
  m.def("int4_mm", &sbd_products::int4_mm, py::arg("x"), py::arg("w"), py::arg("dm"), py::arg("use") = -1,
        "x (M, K) · int4 w (N, K/2 packed by int4_pack) as q·d + m with float16 (d, m) per group of 32 (N, K/32, 2): "
        "(M, N) in x's dtype");
  m.def("f32_mm", &sbd_products::f32_mm, py::arg("x"), py::arg("ws"), py::arg("use") = -1,
        "x (M, K) against float32 weights ws [(N_j, K), ...] side by side, each output one sum over K in order, each "
        "row alone: (M, Σ N_j) in x's dtype; use: as int8_mm's");
  m.def("int4_pack", &sbd_products::int4_pack, "int4 values (N, K), 0..15, in int4_mm's layout");
  m.def("low_rank_add", &sbd_products::low_rank_add, py::arg("out"), py::arg("x"), py::arg("a"), py::arg("bt"),
        py::arg("scale"), py::arg("use") = -1,
        "in place: out (R, N) += scale * (x (R, K) @ a (r, K)^T) @ bt (r, N), float32, each row alone; use: as int8_mm's");
  m.def("attend_rows", &sbd_attention::attend_rows, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("ends"),
        py::arg("scale"), py::arg("use") = -1,
        "attention of q (B, H, W, D) over k, v (B, Hk, S, D), float32, row (b, h, w) over the first ends[b, w] keys of "
        "head h / (H / Hk), each row alone in a fixed order: (B, H, W, D); use: as int8_mm's");
  m.def("norm", &sbd_rows::norm, py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("use") = -1,
        "weight · (x · 1/sqrt(mean(x²) + eps)) over x's last dimension, float32, each row alone; use: as int8_mm's");
  m.def("silu_mul", &sbd_rows::silu_mul, py::arg("g"), py::arg("u"), py::arg("use") = -1,
        "silu(g) · u, float32, in a fixed order on every instruction set; use: as int8_mm's");
  m.def("isa", [] { return static_cast<int64_t>(sbd_products::isa()); }, "the instruction set the products run: 0, 1 or 2");
  py::class_<DecoderLayers>(m, "DecoderLayers")
      .def(py::init<>())
      .def("add_layer", &DecoderLayers::add_layer)
      .def("forward", &DecoderLayers::forward)
      .def("__len__", &DecoderLayers::size);
}
