// ffi_core.cc: XLA FFI handlers of the core op, gdn_forward and gdn_backward (python/gdn/jax/
// _core.py calls them). Each handler turns XLA's buffers into views, calls the public C++ op,
// and returns its error; the op validates everything.
//
// Residual buffers are sized for the most chunks a batch of this shape can have, which is
// known when the call is traced (the chunk count depends on cu_seqlens' values, which are
// not): the op fills the first total_chunks rows and the handler zeroes the rest.
#include <optional>

#include "bindings/buffers.h"
#include "bindings/handlers.h"
#include "bindings/xla_threads.h"
#include "gdn/backward.h"
#include "gdn/forward.h"

namespace gdn::bindings {
namespace {

ForwardOptions core_options(double scale, bool l2norm, std::int64_t chunk_size, bool bf16_matmul,
                            std::int64_t threads) {
  ForwardOptions o;
  o.scale = scale;
  o.use_qk_l2norm = l2norm;
  o.chunk_size = static_cast<int>(chunk_size);
  o.threads = static_cast<int>(threads);
  o.matmul_precision = bf16_matmul ? MatmulPrecision::bf16 : MatmulPrecision::compute;
  return o;
}

ffi::Error forward(ffi::ThreadPool xla_pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                   ffi::AnyBuffer g, ffi::AnyBuffer beta, ffi::AnyBuffer h0,
                   ffi::AnyBuffer cu_seqlens, ffi::Result<ffi::AnyBuffer> o,
                   ffi::Result<ffi::AnyBuffer> final_state,
                   ffi::Result<ffi::AnyBuffer> chunk_states, ffi::Result<ffi::AnyBuffer> t_inv,
                   double scale, bool l2norm, std::int64_t chunk_size, bool bf16_matmul,
                   std::int64_t threads, bool has_h0, bool has_cu_seqlens, bool want_o,
                   bool want_final_state, bool want_chunk_states, bool want_t_inv) {
  return guarded([&] {
    const XlaThreads xla(xla_pool, threads);
    ForwardInputs in{view(q, "q"), view(k, "k"),       view(v, "v"),
                     view(g, "g"), view(beta, "beta"), optional_view(h0, has_h0, "initial_state"),
                     TensorView()};
    std::optional<IndexArray> cu;
    if (has_cu_seqlens) in.cu_seqlens = cu.emplace(cu_seqlens, "cu_seqlens").view();
    const ForwardOptions options =
        core_options(scale, l2norm, chunk_size, bf16_matmul, xla.threads());
    const ForwardShape shape = forward_shape(in, options);
    ForwardOutputs out;
    out.o = optional_mutable_view(o, want_o, "o");
    out.final_state = optional_mutable_view(final_state, want_final_state, "final_state");
    const MutableTensorView states =
        optional_mutable_view(chunk_states, want_chunk_states, "chunk_states");
    const MutableTensorView tinv = optional_mutable_view(t_inv, want_t_inv, "t_inv");
    if (states.present()) out.chunk_states = leading_rows(states, shape.total_chunks);
    if (tinv.present()) out.t_inv = leading_rows(tinv, shape.total_chunks);
    chunk_gated_delta_rule_fwd(in, out, options);
    zero_rows_from(states, shape.total_chunks);
    zero_rows_from(tinv, shape.total_chunks);
  });
}

ffi::Error backward(ffi::ThreadPool xla_pool, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                    ffi::AnyBuffer g, ffi::AnyBuffer beta, ffi::AnyBuffer h0,
                    ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer d_o, ffi::AnyBuffer d_final_state,
                    ffi::AnyBuffer chunk_states, ffi::AnyBuffer t_inv,
                    ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                    ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dg,
                    ffi::Result<ffi::AnyBuffer> dbeta, ffi::Result<ffi::AnyBuffer> dh0,
                    double scale, bool l2norm, std::int64_t chunk_size, bool bf16_matmul,
                    std::int64_t threads, bool has_h0, bool has_cu_seqlens, bool has_d_final_state,
                    bool has_chunk_states, bool has_t_inv, bool want_d_initial_state) {
  return guarded([&] {
    const XlaThreads xla(xla_pool, threads);
    BackwardInputs in;
    in.q = view(q, "q");
    in.k = view(k, "k");
    in.v = view(v, "v");
    in.g = view(g, "g");
    in.beta = view(beta, "beta");
    in.initial_state = optional_view(h0, has_h0, "initial_state");
    std::optional<IndexArray> cu;
    if (has_cu_seqlens) in.cu_seqlens = cu.emplace(cu_seqlens, "cu_seqlens").view();
    in.d_o = view(d_o, "d_o");
    in.d_final_state = optional_view(d_final_state, has_d_final_state, "d_final_state");
    const ForwardOptions options =
        core_options(scale, l2norm, chunk_size, bf16_matmul, xla.threads());
    const ForwardShape shape = forward_shape(in.forward(), options);
    if (has_chunk_states) {
      in.chunk_states = leading_rows(view(chunk_states, "chunk_states"), shape.total_chunks);
    }
    if (has_t_inv) in.t_inv = leading_rows(view(t_inv, "t_inv"), shape.total_chunks);
    BackwardOutputs out;
    out.dq = mutable_view(dq, "dq");
    out.dk = mutable_view(dk, "dk");
    out.dv = mutable_view(dv, "dv");
    out.dg = mutable_view(dg, "dg");
    out.dbeta = mutable_view(dbeta, "dbeta");
    out.d_initial_state = optional_mutable_view(dh0, want_d_initial_state, "d_initial_state");
    chunk_gated_delta_rule_bwd(in, out, options);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GdnForward, forward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // g
                                  .Arg<ffi::AnyBuffer>()  // beta
                                  .Arg<ffi::AnyBuffer>()  // initial_state
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens
                                  .Ret<ffi::AnyBuffer>()  // o
                                  .Ret<ffi::AnyBuffer>()  // final_state
                                  .Ret<ffi::AnyBuffer>()  // chunk_states
                                  .Ret<ffi::AnyBuffer>()  // t_inv
                                  .Attr<double>("scale")
                                  .Attr<bool>("l2norm")
                                  .Attr<std::int64_t>("chunk_size")
                                  .Attr<bool>("bf16_matmul")
                                  .Attr<std::int64_t>("threads")
                                  .Attr<bool>("has_h0")
                                  .Attr<bool>("has_cu_seqlens")
                                  .Attr<bool>("want_o")
                                  .Attr<bool>("want_final_state")
                                  .Attr<bool>("want_chunk_states")
                                  .Attr<bool>("want_t_inv"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(GdnBackward, backward,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // k
                                  .Arg<ffi::AnyBuffer>()  // v
                                  .Arg<ffi::AnyBuffer>()  // g
                                  .Arg<ffi::AnyBuffer>()  // beta
                                  .Arg<ffi::AnyBuffer>()  // initial_state
                                  .Arg<ffi::AnyBuffer>()  // cu_seqlens
                                  .Arg<ffi::AnyBuffer>()  // d_o
                                  .Arg<ffi::AnyBuffer>()  // d_final_state
                                  .Arg<ffi::AnyBuffer>()  // chunk_states
                                  .Arg<ffi::AnyBuffer>()  // t_inv
                                  .Ret<ffi::AnyBuffer>()  // dq
                                  .Ret<ffi::AnyBuffer>()  // dk
                                  .Ret<ffi::AnyBuffer>()  // dv
                                  .Ret<ffi::AnyBuffer>()  // dg
                                  .Ret<ffi::AnyBuffer>()  // dbeta
                                  .Ret<ffi::AnyBuffer>()  // d_initial_state
                                  .Attr<double>("scale")
                                  .Attr<bool>("l2norm")
                                  .Attr<std::int64_t>("chunk_size")
                                  .Attr<bool>("bf16_matmul")
                                  .Attr<std::int64_t>("threads")
                                  .Attr<bool>("has_h0")
                                  .Attr<bool>("has_cu_seqlens")
                                  .Attr<bool>("has_d_final_state")
                                  .Attr<bool>("has_chunk_states")
                                  .Attr<bool>("has_t_inv")
                                  .Attr<bool>("want_d_initial_state"));

}  // namespace gdn::bindings
