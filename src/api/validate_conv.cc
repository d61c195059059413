// validate_conv.cc: argument checks of the conv op (gdn/conv.h). Same rules and messages as
// the layer op's conv arguments (validate.cc); nothing is written before all checks pass.
#include <string>

#include "api/validate.h"
#include "api/validate_checks.h"

namespace gdn::detail {
namespace {

std::vector<NamedInput> named_conv_inputs(const ConvInputs& in) {
  return {{"x", &in.x},
          {"weight", &in.weight},
          {"bias", &in.bias},
          {"initial_state", &in.initial_state},
          {"cu_seqlens", &in.cu_seqlens}};
}

const char* const kStateShape = "[N, K - 1, D]";

}  // namespace

void validate_conv_inputs(const ConvInputs& in, const ConvOptions& options, ValidatedConv* result) {
  ValidatedConv& r = *result;
  if (options.activation != ConvActivation::none && options.activation != ConvActivation::silu) {
    fail("options.activation", "none or silu",
         std::to_string(static_cast<int>(options.activation)));
  }
  check_threads_and_isa(options.threads, options.isa);
  for (const NamedInput& named : named_conv_inputs(in)) check_rank(named.first, *named.second);
  const TensorView& x = in.x;
  if (x.rank != 2) fail("x", "rank 2 [T, D]", "rank " + std::to_string(x.rank) + " " + shape_of(x));
  check_extent("x", x);
  if (x.dtype != DType::f32 && x.dtype != DType::f64 && x.dtype != DType::bf16 &&
      x.dtype != DType::f16) {
    fail("x", "dtype f32, f64, bf16 or f16", dtype_name(x.dtype));
  }
  r.tokens = x.sizes[0];
  r.channels = x.sizes[1];
  r.dtype = x.dtype;
  r.compute_dtype = x.dtype == DType::f64 ? DType::f64 : DType::f32;
  const std::string compute = compute_dtype_why(r.dtype);
  r.taps = check_conv_parameters("weight", "bias", in.weight, in.bias, r.channels, r.compute_dtype,
                                 compute);
  r.sequences.clear();
  if (in.cu_seqlens.present()) {
    packed_sequences(in.cu_seqlens, r.tokens, 1, "tokens of x", &r.sequences);
  } else {
    r.sequences.push_back({0, 0, r.tokens, 0});
  }
  if (in.initial_state.present()) {
    const std::int64_t n = static_cast<std::int64_t>(r.sequences.size());
    expect_shape("initial_state", in.initial_state, 3, {n, r.taps - 1, r.channels, 0}, kStateShape);
    check_extent("initial_state", in.initial_state);
    expect_dtype("initial_state", in.initial_state, r.compute_dtype, compute);
  }
}

void validate_conv_forward(const ConvInputs& in, const ConvOutputs& out, const ConvOptions& options,
                           OutputPrecision precision, ValidatedConv* result) {
  validate_conv_inputs(in, options, result);
  const ValidatedConv& r = *result;
  check_rank("out", out.out);
  check_rank("final_state", out.final_state);
  const bool f64 = precision == OutputPrecision::float64;
  const std::int64_t n = static_cast<std::int64_t>(r.sequences.size());
  expect_output("out", out.out, 2, {r.tokens, r.channels, 0, 0}, "[T, D] (that of x)",
                f64 ? DType::f64 : r.dtype,
                f64 ? " (reference outputs are float64)" : " (the dtype of x)", true);
  expect_output("final_state", out.final_state, 3, {n, r.taps - 1, r.channels, 0}, kStateShape,
                f64 ? DType::f64 : r.compute_dtype,
                f64 ? " (reference outputs are float64)" : compute_dtype_why(r.dtype), false);
  check_aliasing({{"out", &out.out}, {"final_state", &out.final_state}}, named_conv_inputs(in),
                 {{&out.final_state, &in.initial_state}});
}

void validate_conv_backward(const ConvBackwardInputs& in, const ConvBackwardOutputs& out,
                            const ConvOptions& options, OutputPrecision precision,
                            ValidatedConv* result) {
  validate_conv_inputs(in.forward, options, result);
  const ValidatedConv& r = *result;
  for (const auto& [name, view] :
       {NamedInput{"d_out", &in.d_out}, NamedInput{"d_final_state", &in.d_final_state}}) {
    check_rank(name, *view);
  }
  for (const auto& [name, view] : {NamedOutput{"d_x", &out.d_x},
                                   {"d_weight", &out.d_weight},
                                   {"d_bias", &out.d_bias},
                                   {"d_initial_state", &out.d_initial_state}}) {
    check_rank(name, *view);
  }
  const std::int64_t n = static_cast<std::int64_t>(r.sequences.size());
  const std::string compute = compute_dtype_why(r.dtype);
  expect_output("d_out", in.d_out, 2, {r.tokens, r.channels, 0, 0}, "[T, D] (that of x)", r.dtype,
                " (the dtype of x)", true);
  expect_output("d_final_state", in.d_final_state, 3, {n, r.taps - 1, r.channels, 0}, kStateShape,
                r.compute_dtype, compute, false);
  const bool f64 = precision == OutputPrecision::float64;
  const std::string why = f64 ? " (reference outputs are float64)" : " (the dtype of x)";
  const DType g = f64 ? DType::f64 : r.dtype, gc = f64 ? DType::f64 : r.compute_dtype;
  const std::string whyc = f64 ? why : compute;
  const ConvInputs& f = in.forward;
  expect_output("d_x", out.d_x, 2, f.x.sizes, "[T, D] (that of x)", g, why, true);
  expect_output("d_weight", out.d_weight, f.weight.rank, f.weight.sizes, "that of weight", gc, whyc,
                true);
  if (out.d_bias.present() && !f.bias.present()) {
    fail("d_bias", "absent (the forward has no bias)", shape_of(out.d_bias));
  }
  expect_output("d_bias", out.d_bias, 1, {r.channels, 0, 0, 0}, "[D]", gc, whyc, false);
  expect_output("d_initial_state", out.d_initial_state, 3, {n, r.taps - 1, r.channels, 0},
                kStateShape, gc, whyc, false);
  std::vector<NamedInput> inputs = named_conv_inputs(f);
  inputs.insert(inputs.end(), {{"d_out", &in.d_out}, {"d_final_state", &in.d_final_state}});
  check_aliasing({{"d_x", &out.d_x},
                  {"d_weight", &out.d_weight},
                  {"d_bias", &out.d_bias},
                  {"d_initial_state", &out.d_initial_state}},
                 inputs, {});
}

}  // namespace gdn::detail
