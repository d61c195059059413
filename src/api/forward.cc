// forward.cc: the public forward entry points: validate once, then dispatch.
#include "gdn/forward.h"

#include "api/check_finite.h"
#include "api/validate.h"
#include "cpu/float_env.h"
#include "cpu/forward.h"
#include "gdn/reference.h"
#include "reference/reference.h"

namespace gdn {

Dims ForwardShape::o_sizes() const {
  if (batch > 0) return {batch, tokens, hv, dv};
  return {tokens, hv, dv, 0};
}
Dims ForwardShape::state_sizes() const { return {num_seqs, hv, dk, dv}; }
Dims ForwardShape::chunk_states_sizes() const { return {total_chunks, hv, dk, dv}; }
Dims ForwardShape::t_inv_sizes() const { return {total_chunks, hv, chunk_size, chunk_size}; }

const char* matmul_precision_name(MatmulPrecision precision) {
  switch (precision) {
    case MatmulPrecision::compute:
      return "compute";
    case MatmulPrecision::bf16:
      return "bf16";
  }
  return "invalid";
}

ForwardShape forward_shape(const ForwardInputs& inputs, const ForwardOptions& options) {
  return detail::validate_inputs(inputs, options, nullptr);
}

std::int64_t residual_bytes(const ForwardShape& shape, Residuals residuals) {
  const auto elem = static_cast<std::int64_t>(dtype_size(shape.compute_dtype));
  const std::int64_t states = shape.dk * shape.dv, t_inv = shape.chunk_size * shape.chunk_size;
  const std::int64_t per_chunk = residuals == Residuals::all     ? states + t_inv
                                 : residuals == Residuals::t_inv ? t_inv
                                                                 : 0;
  return shape.total_chunks * shape.hv * per_chunk * elem;
}

void chunk_gated_delta_rule_fwd(const ForwardInputs& inputs, const ForwardOutputs& outputs,
                                const ForwardOptions& options) {
  detail::ValidatedForward validated;
  detail::validate_forward(inputs, outputs, options, detail::OutputPrecision::native, &validated);
  const bool check = detail::check_finite_enabled(options.check_finite);
  if (check) {
    detail::check_finite({{"q", inputs.q},
                          {"k", inputs.k},
                          {"v", inputs.v},
                          {"g", inputs.g},
                          {"beta", inputs.beta},
                          {"initial_state", inputs.initial_state}},
                         detail::Written::nothing);
    if (!options.use_qk_l2norm) detail::warn_expanding_keys(inputs.k, inputs.beta);
  }
  // Check mode: a state updated in place (final_state the view of initial_state) is put back
  // when an output turns out non-finite, so that the call that throws has changed it not.
  detail::StateBackup backup;
  const bool in_place =
      outputs.final_state.present() && outputs.final_state.data == inputs.initial_state.data;
  if (check && in_place) backup.save(outputs.final_state);
  detail::restoring_on_error(backup, [&] {
    {
      const cpu::SubnormalsAsZero mode;
      cpu::forward(validated.problem, options.isa);
    }
    if (check) {
      detail::check_finite({{"o", outputs.o}, {"final_state", outputs.final_state}},
                           in_place ? detail::Written::states_restored : detail::Written::outputs);
    }
  });
}

namespace detail {

ForwardResult allocate_forward_result(const ForwardShape& shape, DType out, DType residual,
                                      Residuals residuals, bool t_inv) {
  ForwardResult r;
  r.o = Tensor(out, shape.o_rank(), shape.o_sizes());
  r.final_state = Tensor(residual, 4, shape.state_sizes());  // states have the compute dtype
  if (residuals == Residuals::all) r.chunk_states = Tensor(residual, 4, shape.chunk_states_sizes());
  if (residuals != Residuals::none && t_inv) r.t_inv = Tensor(residual, 4, shape.t_inv_sizes());
  return r;
}

ForwardOutputs outputs_of(ForwardResult& r) {
  return {r.o.mutable_view(), r.final_state.mutable_view(), r.chunk_states.mutable_view(),
          r.t_inv.mutable_view()};
}

}  // namespace detail

ForwardResult chunk_gated_delta_rule_fwd(const ForwardInputs& inputs, const ForwardOptions& options,
                                         Residuals residuals) {
  const ForwardShape shape = forward_shape(inputs, options);
  const bool t_inv = options.algorithm != Algorithm::recurrent;
  ForwardResult r =
      detail::allocate_forward_result(shape, shape.dtype, shape.compute_dtype, residuals, t_inv);
  chunk_gated_delta_rule_fwd(inputs, detail::outputs_of(r), options);
  return r;
}

}  // namespace gdn
