// ffi_layer.cc: XLA FFI handlers of the fused layer op (gdn_layer_forward, gdn_layer_backward)
// and of the serving step (gdn_step); python/gdn/jax/_layer.py and _serving.py call them.
// Residual buffers are sized as in ffi_core.cc.
#include <optional>

#include "bindings/buffers.h"
#include "bindings/handlers.h"
#include "bindings/xla_threads.h"
#include "gdn/layer.h"
#include "gdn/step.h"

namespace gdn::bindings {
namespace {

LayerOptions layer_options(std::int64_t hk, std::int64_t hv, std::int64_t dk, std::int64_t dv,
                           std::int64_t chunk_size, bool bf16_matmul, std::int64_t threads) {
  LayerOptions o;
  o.hk = hk;
  o.hv = hv;
  o.dk = dk;
  o.dv = dv;
  o.chunk_size = static_cast<int>(chunk_size);
  o.threads = static_cast<int>(threads);
  o.matmul_precision = bf16_matmul ? MatmulPrecision::bf16 : MatmulPrecision::compute;
  return o;
}

// The forward's inputs; `cu` holds the widened cu_seqlens the views point into.
LayerInputs layer_inputs(const ffi::AnyBuffer& qkv, const ffi::AnyBuffer& a,
                         const ffi::AnyBuffer& b, const ffi::AnyBuffer& conv_weight,
                         const ffi::AnyBuffer& conv_bias, const ffi::AnyBuffer& A_log,
                         const ffi::AnyBuffer& dt_bias, const ffi::AnyBuffer& conv_state,
                         const ffi::AnyBuffer& recurrent_state, const ffi::AnyBuffer& cu_seqlens,
                         bool has_conv_bias, bool has_conv_state, bool has_recurrent_state,
                         bool has_cu_seqlens, std::optional<IndexArray>& cu) {
  LayerInputs in;
  in.qkv = view(qkv, "qkv");
  in.a = view(a, "a");
  in.b = view(b, "b");
  in.conv_weight = view(conv_weight, "conv_weight");
  in.conv_bias = optional_view(conv_bias, has_conv_bias, "conv_bias");
  in.A_log = view(A_log, "A_log");
  in.dt_bias = view(dt_bias, "dt_bias");
  in.conv_state = optional_view(conv_state, has_conv_state, "conv_state");
  in.recurrent_state = optional_view(recurrent_state, has_recurrent_state, "recurrent_state");
  if (has_cu_seqlens) in.cu_seqlens = cu.emplace(cu_seqlens, "cu_seqlens").view();
  return in;
}

ffi::Error layer_forward(
    ffi::ThreadPool xla_pool, ffi::AnyBuffer qkv, ffi::AnyBuffer a, ffi::AnyBuffer b,
    ffi::AnyBuffer conv_weight, ffi::AnyBuffer conv_bias, ffi::AnyBuffer A_log,
    ffi::AnyBuffer dt_bias, ffi::AnyBuffer conv_state, ffi::AnyBuffer recurrent_state,
    ffi::AnyBuffer cu_seqlens, ffi::Result<ffi::AnyBuffer> out,
    ffi::Result<ffi::AnyBuffer> conv_state_out, ffi::Result<ffi::AnyBuffer> recurrent_state_out,
    ffi::Result<ffi::AnyBuffer> chunk_states, ffi::Result<ffi::AnyBuffer> t_inv, std::int64_t hk,
    std::int64_t hv, std::int64_t dk, std::int64_t dv, std::int64_t chunk_size, bool bf16_matmul,
    std::int64_t threads, bool has_conv_bias, bool has_conv_state, bool has_recurrent_state,
    bool has_cu_seqlens, bool want_out, bool want_conv_state_out, bool want_recurrent_state_out,
    bool want_chunk_states, bool want_t_inv) {
  return guarded([&] {
    const XlaThreads xla(xla_pool, threads);
    std::optional<IndexArray> cu;
    const LayerInputs in = layer_inputs(qkv, a, b, conv_weight, conv_bias, A_log, dt_bias,
                                        conv_state, recurrent_state, cu_seqlens, has_conv_bias,
                                        has_conv_state, has_recurrent_state, has_cu_seqlens, cu);
    const LayerOptions options =
        layer_options(hk, hv, dk, dv, chunk_size, bf16_matmul, xla.threads());
    const ForwardShape shape = fused_gdn_shape(in, options);
    LayerOutputs o;
    o.out = optional_mutable_view(out, want_out, "out");
    o.conv_state_out = optional_mutable_view(conv_state_out, want_conv_state_out, "conv_state_out");
    o.recurrent_state_out =
        optional_mutable_view(recurrent_state_out, want_recurrent_state_out, "recurrent_state_out");
    const MutableTensorView states =
        optional_mutable_view(chunk_states, want_chunk_states, "chunk_states");
    const MutableTensorView tinv = optional_mutable_view(t_inv, want_t_inv, "t_inv");
    if (states.present()) o.chunk_states = leading_rows(states, shape.total_chunks);
    if (tinv.present()) o.t_inv = leading_rows(tinv, shape.total_chunks);
    fused_gdn_fwd(in, o, options);
    zero_rows_from(states, shape.total_chunks);
    zero_rows_from(tinv, shape.total_chunks);
  });
}

ffi::Error layer_backward(
    ffi::ThreadPool xla_pool, ffi::AnyBuffer qkv, ffi::AnyBuffer a, ffi::AnyBuffer b,
    ffi::AnyBuffer conv_weight, ffi::AnyBuffer conv_bias, ffi::AnyBuffer A_log,
    ffi::AnyBuffer dt_bias, ffi::AnyBuffer conv_state, ffi::AnyBuffer recurrent_state,
    ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer d_out, ffi::AnyBuffer d_conv_state_out,
    ffi::AnyBuffer d_recurrent_state_out, ffi::AnyBuffer chunk_states, ffi::AnyBuffer t_inv,
    ffi::Result<ffi::AnyBuffer> d_qkv, ffi::Result<ffi::AnyBuffer> d_a,
    ffi::Result<ffi::AnyBuffer> d_b, ffi::Result<ffi::AnyBuffer> d_conv_weight,
    ffi::Result<ffi::AnyBuffer> d_conv_bias, ffi::Result<ffi::AnyBuffer> d_A_log,
    ffi::Result<ffi::AnyBuffer> d_dt_bias, ffi::Result<ffi::AnyBuffer> d_conv_state,
    ffi::Result<ffi::AnyBuffer> d_recurrent_state, std::int64_t hk, std::int64_t hv,
    std::int64_t dk, std::int64_t dv, std::int64_t chunk_size, bool bf16_matmul,
    std::int64_t threads, bool has_conv_bias, bool has_conv_state, bool has_recurrent_state,
    bool has_cu_seqlens, bool has_d_conv_state_out, bool has_d_recurrent_state_out,
    bool has_chunk_states, bool has_t_inv) {
  return guarded([&] {
    const XlaThreads xla(xla_pool, threads);
    std::optional<IndexArray> cu;
    LayerBackwardInputs in;
    in.forward = layer_inputs(qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state,
                              recurrent_state, cu_seqlens, has_conv_bias, has_conv_state,
                              has_recurrent_state, has_cu_seqlens, cu);
    const LayerOptions options =
        layer_options(hk, hv, dk, dv, chunk_size, bf16_matmul, xla.threads());
    const ForwardShape shape = fused_gdn_shape(in.forward, options);
    in.d_out = view(d_out, "d_out");
    in.d_conv_state_out = optional_view(d_conv_state_out, has_d_conv_state_out, "d_conv_state_out");
    in.d_recurrent_state_out =
        optional_view(d_recurrent_state_out, has_d_recurrent_state_out, "d_recurrent_state_out");
    if (has_chunk_states) {
      in.chunk_states = leading_rows(view(chunk_states, "chunk_states"), shape.total_chunks);
    }
    if (has_t_inv) in.t_inv = leading_rows(view(t_inv, "t_inv"), shape.total_chunks);
    LayerBackwardOutputs o;
    o.d_qkv = mutable_view(d_qkv, "d_qkv");
    o.d_a = mutable_view(d_a, "d_a");
    o.d_b = mutable_view(d_b, "d_b");
    o.d_conv_weight = mutable_view(d_conv_weight, "d_conv_weight");
    o.d_conv_bias = optional_mutable_view(d_conv_bias, has_conv_bias, "d_conv_bias");
    o.d_A_log = mutable_view(d_A_log, "d_A_log");
    o.d_dt_bias = mutable_view(d_dt_bias, "d_dt_bias");
    o.d_conv_state = mutable_view(d_conv_state, "d_conv_state");
    o.d_recurrent_state = mutable_view(d_recurrent_state, "d_recurrent_state");
    fused_gdn_bwd(in, o, options);
  });
}

// The pools arrive as inputs aliased to the first two results (input_output_aliases): the
// handler updates them through the results, in place when the caller donated them.
ffi::Error step(ffi::ThreadPool xla_pool, ffi::AnyBuffer qkv, ffi::AnyBuffer b, ffi::AnyBuffer a,
                ffi::AnyBuffer /*conv_pool*/, ffi::AnyBuffer /*recurrent_pool*/,
                ffi::AnyBuffer conv_weight, ffi::AnyBuffer conv_bias, ffi::AnyBuffer A_log,
                ffi::AnyBuffer dt_bias, ffi::AnyBuffer query_start_loc,
                ffi::AnyBuffer state_indices, ffi::AnyBuffer distribution, ffi::AnyBuffer seq_lens,
                ffi::AnyBuffer read_state_indices, ffi::AnyBuffer read_offsets,
                ffi::Result<ffi::AnyBuffer> conv_pool_out,
                ffi::Result<ffi::AnyBuffer> recurrent_pool_out, ffi::Result<ffi::AnyBuffer> out,
                std::int64_t hk, std::int64_t hv, std::int64_t dk, std::int64_t dv,
                std::int64_t num_spec, std::int64_t threads, bool has_conv_bias,
                bool has_read_state_indices, bool has_read_offsets) {
  return guarded([&] {
    const XlaThreads xla(xla_pool, threads);
    StepInputs in;
    in.qkv = view(qkv, "qkv");
    in.a = view(a, "a");
    in.b = view(b, "b");
    in.conv_weight = view(conv_weight, "conv_weight");
    in.conv_bias = optional_view(conv_bias, has_conv_bias, "conv_bias");
    in.A_log = view(A_log, "A_log");
    in.dt_bias = view(dt_bias, "dt_bias");
    const IndexArray qsl(query_start_loc, "query_start_loc");
    const IndexArray slots(state_indices, "state_indices");
    const IndexArray dist(distribution, "distribution");
    const IndexArray lens(seq_lens, "seq_lens");
    std::optional<IndexArray> read_slots, offsets;
    in.query_start_loc = qsl.view();
    in.state_indices = slots.view();
    in.distribution = dist.view();
    in.seq_lens = lens.view();
    if (has_read_state_indices) {
      in.read_state_indices = read_slots.emplace(read_state_indices, "read_state_indices").view();
    }
    if (has_read_offsets) in.read_offsets = offsets.emplace(read_offsets, "read_offsets").view();
    StepOptions options;
    static_cast<LayerOptions&>(options) = layer_options(hk, hv, dk, dv, 0, false, xla.threads());
    options.num_spec = num_spec;
    const StatePools pools{in_place_view(conv_pool_out, "conv_state"),
                           in_place_view(recurrent_pool_out, "recurrent_state")};
    fused_gdn_step(in, pools, mutable_view(out, "out"), options);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GdnLayerForward, layer_forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // qkv
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // conv_weight
                                  .Arg<ffi::AnyBuffer>()  // conv_bias
                                  .Arg<ffi::AnyBuffer>()  // A_log
                                  .Arg<ffi::AnyBuffer>()  // dt_bias
                                  .Arg<ffi::AnyBuffer>()  // conv_state
                                  .Arg<ffi::AnyBuffer>()  // recurrent_state
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // conv_state_out
                                  .Ret<ffi::AnyBuffer>()  // recurrent_state_out
                                  .Ret<ffi::AnyBuffer>()  // chunk_states
                                  .Ret<ffi::AnyBuffer>()  // t_inv
                                  .Attr<std::int64_t>("hk")
                                  .Attr<std::int64_t>("hv")
                                  .Attr<std::int64_t>("dk")
                                  .Attr<std::int64_t>("dv")
                                  .Attr<std::int64_t>("chunk_size")
                                  .Attr<bool>("bf16_matmul")
                                  .Attr<std::int64_t>("threads")
                                  .Attr<bool>("has_conv_bias")
                                  .Attr<bool>("has_conv_state")
                                  .Attr<bool>("has_recurrent_state")
                                  .Attr<bool>("has_cu_seqlens")
                                  .Attr<bool>("want_out")
                                  .Attr<bool>("want_conv_state_out")
                                  .Attr<bool>("want_recurrent_state_out")
                                  .Attr<bool>("want_chunk_states")
                                  .Attr<bool>("want_t_inv"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GdnLayerBackward, layer_backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // qkv
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // conv_weight
                                  .Arg<ffi::AnyBuffer>()  // conv_bias
                                  .Arg<ffi::AnyBuffer>()  // A_log
                                  .Arg<ffi::AnyBuffer>()  // dt_bias
                                  .Arg<ffi::AnyBuffer>()  // conv_state
                                  .Arg<ffi::AnyBuffer>()  // recurrent_state
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens
                                  .Arg<ffi::AnyBuffer>()  // d_out
                                  .Arg<ffi::AnyBuffer>()  // d_conv_state_out
                                  .Arg<ffi::AnyBuffer>()  // d_recurrent_state_out
                                  .Arg<ffi::AnyBuffer>()  // chunk_states
                                  .Arg<ffi::AnyBuffer>()  // t_inv
                                  .Ret<ffi::AnyBuffer>()  // d_qkv
                                  .Ret<ffi::AnyBuffer>()  // d_a
                                  .Ret<ffi::AnyBuffer>()  // d_b
                                  .Ret<ffi::AnyBuffer>()  // d_conv_weight
                                  .Ret<ffi::AnyBuffer>()  // d_conv_bias
                                  .Ret<ffi::AnyBuffer>()  // d_A_log
                                  .Ret<ffi::AnyBuffer>()  // d_dt_bias
                                  .Ret<ffi::AnyBuffer>()  // d_conv_state
                                  .Ret<ffi::AnyBuffer>()  // d_recurrent_state
                                  .Attr<std::int64_t>("hk")
                                  .Attr<std::int64_t>("hv")
                                  .Attr<std::int64_t>("dk")
                                  .Attr<std::int64_t>("dv")
                                  .Attr<std::int64_t>("chunk_size")
                                  .Attr<bool>("bf16_matmul")
                                  .Attr<std::int64_t>("threads")
                                  .Attr<bool>("has_conv_bias")
                                  .Attr<bool>("has_conv_state")
                                  .Attr<bool>("has_recurrent_state")
                                  .Attr<bool>("has_cu_seqlens")
                                  .Attr<bool>("has_d_conv_state_out")
                                  .Attr<bool>("has_d_recurrent_state_out")
                                  .Attr<bool>("has_chunk_states")
                                  .Attr<bool>("has_t_inv"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GdnStep, step,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // qkv
                                  .Arg<ffi::AnyBuffer>()  // b
                                  .Arg<ffi::AnyBuffer>()  // a
                                  .Arg<ffi::AnyBuffer>()  // conv_state pool
                                  .Arg<ffi::AnyBuffer>()  // recurrent_state pool
                                  .Arg<ffi::AnyBuffer>()  // conv_weight
                                  .Arg<ffi::AnyBuffer>()  // conv_bias
                                  .Arg<ffi::AnyBuffer>()  // A_log
                                  .Arg<ffi::AnyBuffer>()  // dt_bias
                                  .Arg<ffi::AnyBuffer>()  // query_start_loc
                                  .Arg<ffi::AnyBuffer>()  // state_indices
                                  .Arg<ffi::AnyBuffer>()  // distribution
                                  .Arg<ffi::AnyBuffer>()  // seq_lens
                                  .Arg<ffi::AnyBuffer>()  // read_state_indices
                                  .Arg<ffi::AnyBuffer>()  // read_offsets
                                  .Ret<ffi::AnyBuffer>()  // conv_state pool (aliased)
                                  .Ret<ffi::AnyBuffer>()  // recurrent_state pool (aliased)
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Attr<std::int64_t>("hk")
                                  .Attr<std::int64_t>("hv")
                                  .Attr<std::int64_t>("dk")
                                  .Attr<std::int64_t>("dv")
                                  .Attr<std::int64_t>("num_spec")
                                  .Attr<std::int64_t>("threads")
                                  .Attr<bool>("has_conv_bias")
                                  .Attr<bool>("has_read_state_indices")
                                  .Attr<bool>("has_read_offsets"));

}  // namespace gdn::bindings
