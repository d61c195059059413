// backward.cc: the public backward entry points: validate once, then dispatch.
#include "gdn/backward.h"

#include "api/validate.h"
#include "cpu/backward.h"
#include "reference/reference.h"

namespace gdn {
namespace detail {

BackwardResult allocate_backward_result(const BackwardInputs& inputs, const ForwardShape& shape,
                                        DType dtype) {
  BackwardResult r;
  r.dq = Tensor(dtype, inputs.q.rank, inputs.q.sizes);
  r.dk = Tensor(dtype, inputs.k.rank, inputs.k.sizes);
  r.dv = Tensor(dtype, inputs.v.rank, inputs.v.sizes);
  r.dg = Tensor(dtype, inputs.g.rank, inputs.g.sizes);
  r.dbeta = Tensor(dtype, inputs.beta.rank, inputs.beta.sizes);
  r.d_initial_state = Tensor(dtype, 4, shape.state_sizes());
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
  cpu::backward(validated.problem, options.isa);
}

BackwardResult chunk_gated_delta_rule_bwd(const BackwardInputs& inputs,
                                          const ForwardOptions& options) {
  const ForwardShape shape = forward_shape(inputs.forward(), options);
  BackwardResult r = detail::allocate_backward_result(inputs, shape, shape.dtype);
  chunk_gated_delta_rule_bwd(inputs, detail::outputs_of(r), options);
  return r;
}

}  // namespace gdn
