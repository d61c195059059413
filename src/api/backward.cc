// backward.cc: the public backward entry points: validate once, then dispatch.
#include "gdn/backward.h"

#include "api/check_finite.h"
#include "api/validate.h"
#include "cpu/backward.h"
#include "cpu/float_env.h"
#include "reference/reference.h"

namespace gdn {
namespace detail {

BackwardResult allocate_backward_result(const BackwardInputs& inputs, const ForwardShape& shape,
                                        DType dtype) {
  // Native gradients have their input's dtype: activations for dq, dk, dv; the compute dtype
  // for dg, dbeta and d_initial_state. The reference's are all float64.
  const bool f64 = dtype == DType::f64;
  const DType act = f64 ? dtype : shape.dtype, compute = f64 ? dtype : shape.compute_dtype;
  BackwardResult r;
  r.dq = Tensor(act, inputs.q.rank, inputs.q.sizes);
  r.dk = Tensor(act, inputs.k.rank, inputs.k.sizes);
  r.dv = Tensor(act, inputs.v.rank, inputs.v.sizes);
  r.dg = Tensor(compute, inputs.g.rank, inputs.g.sizes);
  r.dbeta = Tensor(compute, inputs.beta.rank, inputs.beta.sizes);
  r.d_initial_state = Tensor(compute, 4, shape.state_sizes());
  return r;
}

BackwardOutputs outputs_of(BackwardResult& r) {
  return {r.dq.mutable_view(), r.dk.mutable_view(),    r.dv.mutable_view(),
          r.dg.mutable_view(), r.dbeta.mutable_view(), r.d_initial_state.mutable_view()};
}

}  // namespace detail

void chunk_gated_delta_rule_bwd(const BackwardInputs& inputs, const BackwardOutputs& outputs,
                                const ForwardOptions& options) {
  detail::ValidatedBackward validated;
  detail::validate_backward(inputs, outputs, options, detail::OutputPrecision::native, &validated);
  const bool check = detail::check_finite_enabled(options.check_finite);
  if (check) {
    detail::check_finite({{"q", inputs.q},
                          {"k", inputs.k},
                          {"v", inputs.v},
                          {"g", inputs.g},
                          {"beta", inputs.beta},
                          {"initial_state", inputs.initial_state},
                          {"d_o", inputs.d_o},
                          {"d_final_state", inputs.d_final_state}},
                         detail::Written::nothing);
  }
  {
    const cpu::SubnormalsAsZero mode;
    cpu::backward(validated.problem, options.isa);
  }
  if (check) {
    detail::check_finite({{"dq", outputs.dq},
                          {"dk", outputs.dk},
                          {"dv", outputs.dv},
                          {"dg", outputs.dg},
                          {"dbeta", outputs.dbeta},
                          {"d_initial_state", outputs.d_initial_state}},
                         detail::Written::outputs);
  }
}

BackwardResult chunk_gated_delta_rule_bwd(const BackwardInputs& inputs,
                                          const ForwardOptions& options) {
  const ForwardShape shape = forward_shape(inputs.forward(), options);
  BackwardResult r = detail::allocate_backward_result(inputs, shape, shape.dtype);
  chunk_gated_delta_rule_bwd(inputs, detail::outputs_of(r), options);
  return r;
}

}  // namespace gdn
