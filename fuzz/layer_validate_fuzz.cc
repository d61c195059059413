// layer_validate_fuzz.cc: the validation of the fused layer op (fused_gdn_fwd / _bwd, their
// float64 references, fused_gdn_shape) and of the conv op (causal_conv1d_fwd / _bwd and
// references) driven from fuzzed bytes: head layout options, qkv width, dtypes (16-bit
// activations), shapes, strides, conv taps and weight layouts, states, cu_seqlens, residuals,
// gradients, in-place and overlapping outputs. fuzz_views.h has the views and the oracle.
#include "api/validate.h"
#include "fuzz_views.h"

namespace {

using gdn::DType;
using gdn::fuzz::Case;

gdn::MutableTensorView same(const gdn::TensorView& v) {
  return gdn::MutableTensorView(const_cast<void*>(v.data), v.dtype, v.rank, v.sizes, v.strides);
}

gdn::detail::OutputPrecision precision(bool ref) {
  return ref ? gdn::detail::OutputPrecision::float64 : gdn::detail::OutputPrecision::native;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider f(data, size);
  Case c(f);
  const int op = f.ConsumeIntegralInRange<int>(0, 7);  // layer fwd, bwd, conv fwd, bwd; + ref
  const bool ref = op >= 4;
  const bool conv = (op & 2) != 0, backward = (op & 1) != 0;
  constexpr DType kActs[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
  const DType act = ref ? DType::f64 : kActs[f.ConsumeIntegralInRange<int>(0, 3)];
  const DType cmp = act == DType::f64 ? DType::f64 : DType::f32;
  const DType out_act = ref ? DType::f64 : act, out_cmp = ref ? DType::f64 : cmp;
  const std::int64_t t = f.ConsumeIntegralInRange<std::int64_t>(0, 9);
  const std::int64_t hk = f.ConsumeIntegralInRange<std::int64_t>(1, 2);
  const std::int64_t hv = hk * f.ConsumeIntegralInRange<std::int64_t>(1, 2);
  const std::int64_t dk = f.ConsumeIntegralInRange<std::int64_t>(1, 4);
  const std::int64_t dv = f.ConsumeIntegralInRange<std::int64_t>(1, 4);
  const std::int64_t d =
      conv ? f.ConsumeIntegralInRange<std::int64_t>(1, 24) : 2 * hk * dk + hv * dv;
  const std::int64_t taps = f.ConsumeIntegralInRange<std::int64_t>(1, 5);
  const bool weight3 = f.ConsumeBool();  // [D, 1, K] rather than [D, K]
  std::vector<std::int64_t> cu = {0};
  const int cuts = f.ConsumeIntegralInRange<int>(0, 3);
  for (int i = 0; i < cuts; ++i)
    cu.push_back(std::max(cu.back(), f.ConsumeIntegralInRange<std::int64_t>(0, t)));
  cu.push_back(t);
  const bool has_cu = f.ConsumeBool();
  const std::int64_t n = has_cu ? static_cast<std::int64_t>(cu.size()) - 1 : 1;
  const std::vector<std::int64_t> weight =
      weight3 ? std::vector<std::int64_t>{d, 1, taps} : std::vector<std::int64_t>{d, taps};
  const std::vector<std::int64_t> conv_state = {n, taps - 1, d}, state = {n, hv, dk, dv};

  if (conv) {
    gdn::ConvOptions options;
    options.activation = static_cast<gdn::ConvActivation>(c.pick(1, {0, 2}));
    options.threads = static_cast<int>(c.pick(1, {0, -1, 1025}));
    options.isa = static_cast<gdn::CpuIsa>(c.pick(0, {1, 2, 3, 4, 9}));
    gdn::ConvInputs in;
    in.x = c.view(act, {t, d});
    in.weight = c.view(cmp, weight);
    if (f.ConsumeBool()) in.bias = c.view(cmp, {d});
    const bool has_state = f.ConsumeBool();
    if (has_state) in.initial_state = c.view(cmp, conv_state);
    in.cu_seqlens = c.index(cu, has_cu);
    if (f.ConsumeBool()) {  // the allocating forms (tiny shapes: the arena holds the inputs)
      c.finish();
      if (!c.safe() || in.x.rank != 2 || in.x.sizes[0] > 64 || in.x.sizes[1] > 64 ||
          (in.cu_seqlens.rank == 1 && in.cu_seqlens.sizes[0] > 65))
        return 0;
      c.check_call(
          [&] {
            if (ref) {
              gdn::ref::causal_conv1d_fwd(in, options);
            } else {
              gdn::causal_conv1d_fwd(in, options);
            }
          },
          {});
      return 0;
    }
    if (!backward) {
      gdn::ConvOutputs out;
      out.out = c.out(out_act, {t, d});
      const int final_mode = f.ConsumeIntegralInRange<int>(0, 2);
      if (final_mode == 0) out.final_state = c.out(out_cmp, conv_state);
      if (final_mode == 2 && has_state) out.final_state = same(in.initial_state);
      c.finish();
      if (c.safe()) {
        c.check_call(
            [&] {
              if (ref) {
                gdn::ref::causal_conv1d_fwd(in, out, options);
              } else {
                gdn::causal_conv1d_fwd(in, out, options);
              }
            },
            {&out.out, &out.final_state});
      } else {
        Case::check_validation([&] {
          gdn::detail::ValidatedConv v;
          gdn::detail::validate_conv_forward(in, out, options, precision(ref), &v);
        });
      }
      return 0;
    }
    gdn::ConvBackwardInputs bin;
    bin.forward = in;
    bin.d_out = c.view(act, {t, d});
    if (f.ConsumeBool()) bin.d_final_state = c.view(cmp, conv_state);
    gdn::ConvBackwardOutputs out;
    out.d_x = c.out(out_act, {t, d});
    out.d_weight = c.out(out_cmp, weight);
    if (f.ConsumeBool()) out.d_bias = c.out(out_cmp, {d});
    if (f.ConsumeBool()) out.d_initial_state = c.out(out_cmp, conv_state);
    c.finish();
    if (c.safe()) {
      c.check_call(
          [&] {
            if (ref) {
              gdn::ref::causal_conv1d_bwd(bin, out, options);
            } else {
              gdn::causal_conv1d_bwd(bin, out, options);
            }
          },
          {&out.d_x, &out.d_weight, &out.d_bias, &out.d_initial_state});
    } else {
      Case::check_validation([&] {
        gdn::detail::ValidatedConv v;
        gdn::detail::validate_conv_backward(bin, out, options, precision(ref), &v);
      });
    }
    return 0;
  }

  gdn::LayerOptions options;
  options.hk = c.pick(hk, {0, -1, hk + 1, 3});
  options.hv = c.pick(hv, {0, -1, hv + 1, 1LL << 40});
  options.dk = c.pick(dk, {0, -1, dk + 1, 257});
  options.dv = c.pick(dv, {0, -1, dv + 1, 257});
  options.chunk_size = static_cast<int>(c.pick(64, {0, 1, 2, 3, 256, -1, 257}));
  options.threads = static_cast<int>(c.pick(1, {0, -1, 1025}));
  options.isa = static_cast<gdn::CpuIsa>(c.pick(0, {1, 2, 3, 4, 9}));
  options.matmul_precision = static_cast<gdn::MatmulPrecision>(c.pick(0, {1, 2}));

  gdn::LayerInputs in;
  in.qkv = c.view(act, {t, d});
  in.a = c.view(act, {t, hv});
  in.b = c.view(act, {t, hv});
  in.conv_weight = c.view(cmp, weight);
  if (f.ConsumeBool()) in.conv_bias = c.view(cmp, {d});
  in.A_log = c.view(cmp, {hv});
  in.dt_bias = c.view(cmp, {hv});
  if (f.ConsumeBool()) in.conv_state = c.view(cmp, conv_state);
  if (f.ConsumeBool()) in.recurrent_state = c.view(cmp, state);
  in.cu_seqlens = c.index(cu, has_cu);
  c.finish();

  std::int64_t chunk = options.chunk_size > 0 ? options.chunk_size : 64, chunks = n;
  bool small = true;
  try {
    const gdn::ForwardShape shape = gdn::fused_gdn_shape(in, options);
    chunk = shape.chunk_size;
    chunks = shape.total_chunks;
    small = shape.tokens <= 64 && shape.num_seqs <= 64 && shape.total_chunks <= 64;
  } catch (const gdn::InvalidArgument&) {
  } catch (const gdn::RuntimeError&) {
  }
  const std::vector<std::int64_t> residual = {chunks, hv, dk, dv},
                                  t_inv = {chunks, hv, chunk, chunk};

  if (f.ConsumeBool()) {  // the allocating forward (tiny shapes: the arena holds the inputs)
    if (!c.safe() || !small) return 0;
    const auto residuals = static_cast<gdn::Residuals>(c.pick(0, {1, 2, 3}));
    c.check_call(
        [&] {
          if (ref) {
            gdn::ref::fused_gdn_fwd(in, options);
          } else {
            gdn::fused_gdn_fwd(in, options, residuals);
          }
        },
        {});
    return 0;
  }

  if (!backward) {
    gdn::LayerOutputs out;
    out.out = c.out(out_act, {t, hv * dv});
    if (f.ConsumeBool()) out.conv_state_out = c.out(out_cmp, conv_state);
    const int final_mode = f.ConsumeIntegralInRange<int>(0, 2);
    if (final_mode == 0) out.recurrent_state_out = c.out(out_cmp, state);
    if (final_mode == 2 && in.recurrent_state.present())
      out.recurrent_state_out = same(in.recurrent_state);
    if (!ref && f.ConsumeBool()) out.chunk_states = c.out(out_cmp, residual);
    if (!ref && f.ConsumeBool()) out.t_inv = c.out(out_cmp, t_inv);
    // Last, so that earlier corpus inputs decode as before: out left out (a remat replay).
    if (f.ConsumeBool()) out.out = gdn::MutableTensorView{};
    c.finish();
    if (c.safe()) {
      c.check_call(
          [&] {
            if (ref) {
              gdn::ref::fused_gdn_fwd(in, out, options);
            } else {
              gdn::fused_gdn_fwd(in, out, options);
            }
          },
          {&out.out, &out.conv_state_out, &out.recurrent_state_out, &out.chunk_states, &out.t_inv});
    } else {
      Case::check_validation([&] {
        gdn::detail::ValidatedLayer v;
        gdn::detail::validate_layer_forward(in, out, options, precision(ref), &v);
      });
    }
    return 0;
  }

  gdn::LayerBackwardInputs bin;
  bin.forward = in;
  bin.d_out = c.view(act, {t, hv * dv});
  if (f.ConsumeBool()) bin.d_conv_state_out = c.view(cmp, conv_state);
  if (f.ConsumeBool()) bin.d_recurrent_state_out = c.view(cmp, state);
  if (!ref && f.ConsumeBool()) bin.chunk_states = c.view(cmp, residual);
  if (!ref && f.ConsumeBool()) bin.t_inv = c.view(cmp, t_inv);
  gdn::LayerBackwardOutputs out;
  out.d_qkv = c.out(out_act, {t, d});
  out.d_a = c.out(out_act, {t, hv});
  out.d_b = c.out(out_act, {t, hv});
  out.d_conv_weight = c.out(out_cmp, weight);
  if (in.conv_bias.present() || f.ConsumeBool()) out.d_conv_bias = c.out(out_cmp, {d});
  out.d_A_log = c.out(out_cmp, {hv});
  out.d_dt_bias = c.out(out_cmp, {hv});
  if (f.ConsumeBool()) out.d_conv_state = c.out(out_cmp, conv_state);
  if (f.ConsumeBool()) out.d_recurrent_state = c.out(out_cmp, state);
  c.finish();
  if (c.safe()) {
    c.check_call(
        [&] {
          if (ref) {
            gdn::ref::fused_gdn_bwd(bin, out, options);
          } else {
            gdn::fused_gdn_bwd(bin, out, options);
          }
        },
        {&out.d_qkv, &out.d_a, &out.d_b, &out.d_conv_weight, &out.d_conv_bias, &out.d_A_log,
         &out.d_dt_bias, &out.d_conv_state, &out.d_recurrent_state});
  } else {
    Case::check_validation([&] {
      gdn::detail::ValidatedLayer v;
      gdn::detail::validate_layer_backward(bin, out, options, precision(ref), &v);
    });
  }
  return 0;
}
