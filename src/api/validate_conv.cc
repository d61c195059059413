// validate_conv.cc: argument checks of the conv op (gdn/conv.h). Same rules and messages as
// the layer op's conv arguments (validate.cc); nothing is written before all checks pass.
#include <string>
#include <unordered_map>
#include <vector>

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

void validate_conv_update(const ConvUpdateInputs& in, const MutableTensorView& pool,
                          const MutableTensorView& out, const ConvOptions& options,
                          ValidatedConvUpdate* result) {
  ValidatedConvUpdate& r = *result;
  const ConvInputs conv{in.x, in.weight, in.bias, TensorView{}, in.cu_seqlens};
  validate_conv_inputs(conv, options, &r.conv);
  const ValidatedConv& v = r.conv;
  const auto n = static_cast<std::int64_t>(v.sequences.size());
  check_rank("conv_state", pool);
  const std::string what = "[num_slots, S, D] with S >= K - 1 = " + std::to_string(v.taps - 1) +
                           " and D = " + std::to_string(v.channels);
  if (!pool.present() || pool.rank != 3 || pool.sizes[0] < 1 || pool.sizes[1] < v.taps - 1 ||
      pool.sizes[2] != v.channels) {
    fail("conv_state", "a pool " + what, shape_of(pool));
  }
  if (pool.dtype != DType::f32 && pool.dtype != DType::f64 && pool.dtype != DType::bf16 &&
      pool.dtype != DType::f16) {
    fail("conv_state", "dtype f32, f64, bf16 or f16", dtype_name(pool.dtype));
  }
  check_extent("conv_state", pool);
  // Each slot one dense block, in either order; a size-1 dimension's stride is never used.
  const std::int64_t rows = pool.sizes[1], d = v.channels, slot = rows * d;
  const bool channel_last = (d <= 1 || pool.strides[2] == 1) && (rows <= 1 || pool.strides[1] == d);
  const bool channel_first =
      (rows <= 1 || pool.strides[1] == 1) && (d <= 1 || pool.strides[2] == rows);
  if (!channel_last && !channel_first) {
    fail("conv_state",
         "each slot one dense block: strides [*, " + std::to_string(d) +
             ", 1] (channel-last) or [*, 1, " + std::to_string(rows) + "] (channel-first)",
         "strides " + shape_string(3, pool.strides) + " for sizes " + shape_of(pool));
  }
  if (pool.sizes[0] > 1 && pool.strides[0] < slot) {
    fail("conv_state",
         "a slot stride (dim 0) of at least one slot, " + std::to_string(slot) +
             " elements, so that slots do not overlap (0 only with num_slots = 1)",
         "stride " + std::to_string(pool.strides[0]) + " with " + std::to_string(pool.sizes[0]) +
             " slots");
  }
  r.rows = rows;
  r.slot_stride = pool.sizes[0] > 1 ? pool.strides[0] : slot;
  r.row_stride = channel_last ? d : 1;
  r.channel_stride = channel_last ? 1 : rows;
  // The slots: given, or 0 .. N - 1; in range, each written by one sequence.
  const std::int64_t slots = pool.sizes[0];
  r.slots.assign(static_cast<std::size_t>(n), 0);
  check_rank("state_indices", in.state_indices);
  if (in.state_indices.present()) {
    const TensorView& si = in.state_indices;
    expect_shape("state_indices", si, 1, {n, 0, 0, 0},
                 "[N] with N = " + std::to_string(n) + " (the sequences of cu_seqlens)");
    expect_dtype("state_indices", si, DType::i64, "");
    check_extent("state_indices", si);
    for (std::int64_t s = 0; s < n; ++s)
      r.slots[static_cast<std::size_t>(s)] =
          static_cast<const std::int64_t*>(si.data)[s * si.strides[0]];
  } else {
    if (slots < n) {
      fail("conv_state",
           "at least N = " + std::to_string(n) +
               " slots without state_indices (slot s for sequence s)",
           shape_of(pool));
    }
    for (std::int64_t s = 0; s < n; ++s) r.slots[static_cast<std::size_t>(s)] = s;
  }
  // A map, not a vector of num_slots: the pool's size must not decide the validation's memory.
  std::unordered_map<std::int64_t, std::int64_t> owner;
  for (std::int64_t s = 0; s < n; ++s) {
    const std::int64_t x = r.slots[static_cast<std::size_t>(s)];
    if (x < 0 || x >= slots) {
      fail("state_indices", "a slot in [0, " + std::to_string(slots) + ") (num_slots)",
           "state_indices[" + std::to_string(s) + "] = " + std::to_string(x));
    }
    const auto [it, fresh] = owner.try_emplace(x, s);
    if (!fresh) {
      fail("state_indices", "a distinct slot for every sequence",
           "sequences " + std::to_string(it->second) + " and " + std::to_string(s) +
               " both update slot " + std::to_string(x));
    }
  }
  check_rank("out", out);
  expect_output("out", out, 2, {v.tokens, v.channels, 0, 0}, "[T, D] (that of x)", v.dtype,
                " (the dtype of x)", true);
  std::vector<NamedInput> inputs = named_conv_inputs(conv);
  inputs.emplace_back("state_indices", &in.state_indices);
  check_aliasing({{"out", &out}, {"conv_state", &pool}}, inputs, {});
}

}  // namespace gdn::detail
