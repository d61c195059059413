// core_validate_fuzz.cc: the core op's validation (chunk_gated_delta_rule_fwd / _bwd, their
// float64 references, forward_shape) driven from fuzzed bytes: layouts (packed, batched),
// dtypes, shapes, strides, cu_seqlens, options, residuals, in-place and overlapping outputs.
// fuzz_views.h has the views and the oracle.
#include <algorithm>
#include <cmath>
#include <limits>

#include "api/validate.h"
#include "fuzz_views.h"

namespace {

using gdn::DType;
using gdn::fuzz::Case;

gdn::ForwardOptions fuzz_options(Case& c) {
  auto& f = c.data();
  gdn::ForwardOptions o;
  o.chunk_size = static_cast<int>(c.pick(64, {0, 1, 2, 3, 4, 8, 16, 32, 256, -1, 257}));
  o.threads = static_cast<int>(c.pick(1, {0, 2, -1, 1025}));
  o.algorithm = static_cast<gdn::Algorithm>(c.pick(0, {1, 2, 3, 255}));
  o.isa = static_cast<gdn::CpuIsa>(c.pick(0, {1, 2, 3, 4, 5, 9}));
  o.matmul_precision = static_cast<gdn::MatmulPrecision>(c.pick(0, {1, 2}));
  o.use_qk_l2norm = f.ConsumeBool();
  const std::int64_t scale = c.pick(0, {1, 2, 3, 4, 5});
  constexpr double kScales[] = {0.5, std::numeric_limits<double>::quiet_NaN(),
                                std::numeric_limits<double>::infinity(), 1e39, -2.0};
  if (scale >= 1 && scale <= 5) o.scale = kScales[scale - 1];
  return o;
}

// A mutable view over the same memory as `v` (an in-place output).
gdn::MutableTensorView same(const gdn::TensorView& v) {
  return gdn::MutableTensorView(const_cast<void*>(v.data), v.dtype, v.rank, v.sizes, v.strides);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider f(data, size);
  Case c(f);
  const int op = f.ConsumeIntegralInRange<int>(0, 3);  // fwd, bwd, ref fwd, ref bwd
  const bool ref = op >= 2;
  constexpr DType kActs[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
  const DType act = ref ? DType::f64 : kActs[f.ConsumeIntegralInRange<int>(0, 3)];
  const DType cmp = act == DType::f64 ? DType::f64 : DType::f32;
  const std::int64_t batch = f.ConsumeIntegralInRange<std::int64_t>(0, 2);  // 0: packed
  const std::int64_t t = f.ConsumeIntegralInRange<std::int64_t>(0, 9);
  const std::int64_t hk = f.ConsumeIntegralInRange<std::int64_t>(1, 2);
  const std::int64_t hv = hk * f.ConsumeIntegralInRange<std::int64_t>(1, 2);
  const std::int64_t dk = f.ConsumeIntegralInRange<std::int64_t>(1, 8);
  const std::int64_t dv = f.ConsumeIntegralInRange<std::int64_t>(1, 8);
  // cu_seqlens: N sequences cut at fuzzed points.
  std::vector<std::int64_t> cu = {0};
  const int cuts = f.ConsumeIntegralInRange<int>(0, 3);
  for (int i = 0; i < cuts; ++i)
    cu.push_back(std::max(cu.back(), f.ConsumeIntegralInRange<std::int64_t>(0, t)));
  cu.push_back(t);
  const bool has_cu = batch == 0 && f.ConsumeBool();
  const std::int64_t n =
      batch > 0 ? batch : (has_cu ? static_cast<std::int64_t>(cu.size()) - 1 : 1);

  auto tok = [&](std::int64_t h, std::int64_t d) {
    return batch > 0 ? std::vector<std::int64_t>{batch, t, h, d}
                     : std::vector<std::int64_t>{t, h, d};
  };
  auto gate = [&] {
    return batch > 0 ? std::vector<std::int64_t>{batch, t, hv} : std::vector<std::int64_t>{t, hv};
  };
  const std::vector<std::int64_t> state = {n, hv, dk, dv};

  gdn::ForwardInputs in;
  in.q = c.view(act, tok(hk, dk));
  in.k = c.view(act, tok(hk, dk));
  in.v = c.view(act, tok(hv, dv));
  in.g = c.view(cmp, gate());
  in.beta = c.view(cmp, gate());
  in.initial_state = f.ConsumeBool() ? c.view(cmp, state) : gdn::TensorView{};
  in.cu_seqlens = c.index(cu, has_cu);
  const gdn::ForwardOptions options = fuzz_options(c);
  c.finish();  // the index values, before forward_shape reads them

  // The residuals' rows: what the inputs imply when they are valid, else a guess.
  std::int64_t chunk = options.chunk_size > 0 ? options.chunk_size : 64, chunks = n;
  bool small = true;  // what the allocating forms would allocate is small (or they throw)
  try {
    const gdn::ForwardShape shape = gdn::forward_shape(in, options);
    chunk = shape.chunk_size;
    chunks = shape.total_chunks;
    small = std::max<std::int64_t>(shape.batch, 1) * shape.tokens <= 64 && shape.num_seqs <= 64 &&
            shape.total_chunks <= 64;
  } catch (const gdn::InvalidArgument&) {
  } catch (const gdn::RuntimeError&) {
  }
  // The allocating forms: their outputs are their own, so nothing in the arena may change.
  if (f.ConsumeBool()) {
    if (!c.safe() || !small) return 0;
    const auto residuals = static_cast<gdn::Residuals>(c.pick(0, {1, 2, 3}));
    c.check_call(
        [&] {
          if (op == 0) {
            gdn::chunk_gated_delta_rule_fwd(in, options, residuals);
          } else if (op == 2) {
            gdn::ref::chunked_fwd(in, options, residuals);
          } else {
            gdn::BackwardInputs bin = gdn::BackwardInputs::from(in);
            const gdn::ForwardResult fwd = gdn::chunk_gated_delta_rule_fwd(in, options, residuals);
            bin.d_o = fwd.o.view();
            if (op == 1) {
              gdn::chunk_gated_delta_rule_bwd(bin, options);
            } else {
              gdn::ref::recurrent_bwd(bin, options);
            }
          }
        },
        {});
    return 0;
  }
  const DType out_act = ref ? DType::f64 : act;
  const DType out_cmp = ref ? DType::f64 : cmp;
  const std::vector<std::int64_t> residual = {chunks, hv, dk, dv},
                                  t_inv = {chunks, hv, chunk, chunk};

  if (op == 0 || op == 2) {
    gdn::ForwardOutputs out;
    out.o = c.out(out_act, tok(hv, dv));
    const int final_mode = f.ConsumeIntegralInRange<int>(0, 2);  // fresh, absent, in place
    if (final_mode == 0) out.final_state = c.out(out_cmp, state);
    if (final_mode == 2 && in.initial_state.present()) out.final_state = same(in.initial_state);
    if (f.ConsumeBool()) out.chunk_states = c.out(out_cmp, residual);
    if (f.ConsumeBool()) out.t_inv = c.out(out_cmp, t_inv);
    // Last, so that earlier corpus inputs decode as before: o left out (a remat replay asks
    // for the states and residuals alone; with none of them, NoOutputAtAll).
    if (f.ConsumeBool()) out.o = gdn::MutableTensorView{};
    c.finish();
    if (c.safe()) {
      c.check_call(
          [&] {
            if (ref) {
              gdn::ref::recurrent_fwd(in, out, options);
            } else {
              gdn::chunk_gated_delta_rule_fwd(in, out, options);
            }
          },
          {&out.o, &out.final_state, &out.chunk_states, &out.t_inv});
    } else {
      Case::check_validation([&] {
        gdn::detail::ValidatedForward v;
        gdn::detail::validate_forward(
            in, out, options,
            ref ? gdn::detail::OutputPrecision::float64 : gdn::detail::OutputPrecision::native, &v);
      });
    }
    return 0;
  }

  gdn::BackwardInputs bin = gdn::BackwardInputs::from(in);
  bin.d_o = c.view(act, tok(hv, dv));
  if (f.ConsumeBool()) bin.d_final_state = c.view(cmp, state);
  if (!ref && f.ConsumeBool()) bin.chunk_states = c.view(cmp, residual);
  if (!ref && f.ConsumeBool()) bin.t_inv = c.view(cmp, t_inv);
  gdn::BackwardOutputs out;
  out.dq = c.out(out_act, tok(hk, dk));
  out.dk = c.out(out_act, tok(hk, dk));
  out.dv = c.out(out_act, tok(hv, dv));
  out.dg = c.out(out_cmp, gate());
  out.dbeta = c.out(out_cmp, gate());
  if (f.ConsumeBool()) out.d_initial_state = c.out(out_cmp, state);
  c.finish();
  if (c.safe()) {
    c.check_call(
        [&] {
          if (ref) {
            gdn::ref::recurrent_bwd(bin, out, options);
          } else {
            gdn::chunk_gated_delta_rule_bwd(bin, out, options);
          }
        },
        {&out.dq, &out.dk, &out.dv, &out.dg, &out.dbeta, &out.d_initial_state});
  } else {
    Case::check_validation([&] {
      gdn::detail::ValidatedBackward v;
      gdn::detail::validate_backward(
          bin, out, options,
          ref ? gdn::detail::OutputPrecision::float64 : gdn::detail::OutputPrecision::native, &v);
    });
  }
  return 0;
}
