// ffi_conv.cc: XLA FFI handlers of the conv op (gdn/conv.h), gdn_conv_forward and
// gdn_conv_backward. python/gdn/jax/_conv.py calls them; the layer op's context-parallel path
// (python/gdn/jax/_cp.py) runs the conv on its own, with the previous device's last K - 1
// inputs as the initial state, before the core op.
#include <optional>

#include "bindings/buffers.h"
#include "bindings/handlers.h"
#include "bindings/xla_threads.h"
#include "gdn/conv.h"

namespace gdn::bindings {
namespace {

ConvOptions conv_options(bool silu, std::int64_t threads) {
  ConvOptions o;
  o.activation = silu ? ConvActivation::silu : ConvActivation::none;
  o.threads = static_cast<int>(threads);
  return o;
}

// The forward's inputs; `cu` holds the widened cu_seqlens the views point into.
ConvInputs conv_inputs(const ffi::AnyBuffer& x, const ffi::AnyBuffer& weight,
                       const ffi::AnyBuffer& bias, const ffi::AnyBuffer& initial_state,
                       const ffi::AnyBuffer& cu_seqlens, bool has_bias, bool has_initial_state,
                       bool has_cu_seqlens, std::optional<IndexArray>& cu) {
  ConvInputs in;
  in.x = view(x, "x");
  in.weight = view(weight, "weight");
  in.bias = optional_view(bias, has_bias, "bias");
  in.initial_state = optional_view(initial_state, has_initial_state, "initial_state");
  if (has_cu_seqlens) in.cu_seqlens = cu.emplace(cu_seqlens, "cu_seqlens").view();
  return in;
}

ffi::Error conv_forward(ffi::ThreadPool xla_pool, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                        ffi::AnyBuffer bias, ffi::AnyBuffer initial_state,
                        ffi::AnyBuffer cu_seqlens, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Result<ffi::AnyBuffer> final_state, bool silu, std::int64_t threads,
                        bool has_bias, bool has_initial_state, bool has_cu_seqlens,
                        bool want_final_state) {
  return guarded([&] {
    const XlaThreads xla(xla_pool, threads);
    std::optional<IndexArray> cu;
    const ConvInputs in = conv_inputs(x, weight, bias, initial_state, cu_seqlens, has_bias,
                                      has_initial_state, has_cu_seqlens, cu);
    ConvOutputs o;
    o.out = mutable_view(out, "out");
    o.final_state = optional_mutable_view(final_state, want_final_state, "final_state");
    causal_conv1d_fwd(in, o, conv_options(silu, xla.threads()));
  });
}

ffi::Error conv_backward(ffi::ThreadPool xla_pool, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                         ffi::AnyBuffer bias, ffi::AnyBuffer initial_state,
                         ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer d_out,
                         ffi::AnyBuffer d_final_state, ffi::Result<ffi::AnyBuffer> d_x,
                         ffi::Result<ffi::AnyBuffer> d_weight, ffi::Result<ffi::AnyBuffer> d_bias,
                         ffi::Result<ffi::AnyBuffer> d_initial_state, bool silu,
                         std::int64_t threads, bool has_bias, bool has_initial_state,
                         bool has_cu_seqlens, bool has_d_final_state, bool want_d_initial_state) {
  return guarded([&] {
    const XlaThreads xla(xla_pool, threads);
    std::optional<IndexArray> cu;
    ConvBackwardInputs in;
    in.forward = conv_inputs(x, weight, bias, initial_state, cu_seqlens, has_bias,
                             has_initial_state, has_cu_seqlens, cu);
    in.d_out = view(d_out, "d_out");
    in.d_final_state = optional_view(d_final_state, has_d_final_state, "d_final_state");
    ConvBackwardOutputs o;
    o.d_x = mutable_view(d_x, "d_x");
    o.d_weight = mutable_view(d_weight, "d_weight");
    o.d_bias = optional_mutable_view(d_bias, has_bias, "d_bias");
    o.d_initial_state =
        optional_mutable_view(d_initial_state, want_d_initial_state, "d_initial_state");
    causal_conv1d_bwd(in, o, conv_options(silu, xla.threads()));
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GdnConvForward, conv_forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // weight
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Arg<ffi::AnyBuffer>()  // initial_state
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // final_state
                                  .Attr<bool>("silu")
                                  .Attr<std::int64_t>("threads")
                                  .Attr<bool>("has_bias")
                                  .Attr<bool>("has_initial_state")
                                  .Attr<bool>("has_cu_seqlens")
                                  .Attr<bool>("want_final_state"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GdnConvBackward, conv_backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // x
                                  .Arg<ffi::AnyBuffer>()  // weight
                                  .Arg<ffi::AnyBuffer>()  // bias
                                  .Arg<ffi::AnyBuffer>()  // initial_state
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens
                                  .Arg<ffi::AnyBuffer>()  // d_out
                                  .Arg<ffi::AnyBuffer>()  // d_final_state
                                  .Ret<ffi::AnyBuffer>()  // d_x
                                  .Ret<ffi::AnyBuffer>()  // d_weight
                                  .Ret<ffi::AnyBuffer>()  // d_bias
                                  .Ret<ffi::AnyBuffer>()  // d_initial_state
                                  .Attr<bool>("silu")
                                  .Attr<std::int64_t>("threads")
                                  .Attr<bool>("has_bias")
                                  .Attr<bool>("has_initial_state")
                                  .Attr<bool>("has_cu_seqlens")
                                  .Attr<bool>("has_d_final_state")
                                  .Attr<bool>("want_d_initial_state"));

}  // namespace gdn::bindings
