// validate.h: the one place where the arguments of a forward call are checked.
#pragma once

#include <string>
#include <vector>

#include "common/kernel_problem.h"
#include "gdn/backward.h"
#include "gdn/conv.h"
#include "gdn/forward.h"
#include "gdn/layer.h"
#include "gdn/step.h"

namespace gdn::detail {

// Which dtype the outputs must have.
enum class OutputPrecision {
  native,   // o, final_state: the input dtype; residuals: the compute dtype (the CPU backend)
  float64,  // every output f64 (the reference)
};

// A ForwardProblem together with the storage its pointers refer to. Not copyable: the
// problem points into `sequences`.
class ValidatedForward {
 public:
  ValidatedForward() = default;
  ValidatedForward(const ValidatedForward&) = delete;
  ValidatedForward& operator=(const ValidatedForward&) = delete;

  ForwardProblem problem;
  std::vector<Sequence> sequences;
};

// Checks the inputs and options and returns the shape they imply (no outputs involved).
// Fills `sequences` when it is not null.
ForwardShape validate_inputs(const ForwardInputs& inputs, const ForwardOptions& options,
                             std::vector<Sequence>* sequences);

// Checks everything (inputs, options, outputs, aliasing) and builds the problem.
// Throws gdn::InvalidArgument naming the first bad argument.
void validate_forward(const ForwardInputs& inputs, const ForwardOutputs& outputs,
                      const ForwardOptions& options, OutputPrecision precision,
                      ValidatedForward* result);

class ValidatedBackward {
 public:
  ValidatedBackward() = default;
  ValidatedBackward(const ValidatedBackward&) = delete;
  ValidatedBackward& operator=(const ValidatedBackward&) = delete;

  BackwardProblem problem;
  std::vector<Sequence> sequences;
};

// Checks a backward call (the forward's inputs and options, cotangents, residuals, gradient
// outputs, aliasing) and builds the problem. Throws gdn::InvalidArgument.
void validate_backward(const BackwardInputs& inputs, const BackwardOutputs& outputs,
                       const ForwardOptions& options, OutputPrecision precision,
                       ValidatedBackward* result);

// A validated layer call: the facts the orchestration (src/api/layer.cc) needs beyond the views.
class ValidatedLayer {
 public:
  ValidatedLayer() = default;
  ValidatedLayer(const ValidatedLayer&) = delete;
  ValidatedLayer& operator=(const ValidatedLayer&) = delete;

  std::int64_t tokens = 0, channels = 0, taps = 0;
  DType dtype = DType::f32;          // activations: qkv, a, b, out and their gradients
  DType compute_dtype = DType::f32;  // parameters, states, residuals, temporaries
  ForwardShape core;                 // the gated delta rule's shape (num_seqs, chunks, ...)
  std::vector<Sequence> sequences;
};

// Checks a layer forward (inputs, options, outputs, aliasing). Throws gdn::InvalidArgument.
void validate_layer_forward(const LayerInputs& inputs, const LayerOutputs& outputs,
                            const LayerOptions& options, OutputPrecision precision,
                            ValidatedLayer* result);
// Checks a layer backward.
void validate_layer_backward(const LayerBackwardInputs& inputs, const LayerBackwardOutputs& outputs,
                             const LayerOptions& options, OutputPrecision precision,
                             ValidatedLayer* result);
// Checks the inputs and options alone (for allocating forms).
void validate_layer_inputs(const LayerInputs& inputs, const LayerOptions& options,
                           ValidatedLayer* result);

// A validated serving step (gdn/step.h): the layer's facts plus the batch, read out of the
// index tensors. Sequences [0, decode_end) are decodes, [decode_end, mixed_end) prefills.
class ValidatedStep {
 public:
  ValidatedStep() = default;
  ValidatedStep(const ValidatedStep&) = delete;
  ValidatedStep& operator=(const ValidatedStep&) = delete;

  ValidatedLayer layer;  // tokens, channels, taps, dtype (one sequence of every token)
  std::int64_t num_slots = 0, decode_end = 0, mixed_end = 0;
  std::vector<std::int64_t> query_start;  // [mixed_end + 1]
  std::vector<std::int64_t> write_slot;   // [mixed_end]: the first slot each sequence writes
  std::vector<std::int64_t> read_slot;    // [mixed_end]: the slot it starts from, -1: zeros
  // vLLM's speculative layout (gdn/step.h): a window's write_slot is its conv buffer's slot
  // (the recurrent state after its token 0 goes there too), its read_slot the recurrent
  // state's; the other live sequences use columns [0, K - 1) of their conv slot.
  bool spec_layout = false;
  std::vector<std::int64_t> token_slot;   // [query_start[decode_end]]: the recurrent state's
                                          // slot after each window token
  std::vector<std::int64_t> conv_column;  // [decode_end]: a - 1, the window's first history
                                          // column in its conv buffer

  // Whether live sequence s runs through the decode kernel: every decode window, and every
  // one-token sequence wherever it stands (a one-token prefill is a one-token decode: one token
  // from the read slot's states, its states written to its slot). Fixed by the sequence alone,
  // so that where it stands in the batch never changes its arithmetic (gdn/step.h).
  bool decode_path(std::int64_t s) const {
    const auto i = static_cast<std::size_t>(s);
    return s < decode_end || query_start[i + 1] - query_start[i] == 1;
  }
  // The slots live sequence s writes, from write_slot[s]: a decode window's one per token.
  std::int64_t slots_written(std::int64_t s) const {
    const auto i = static_cast<std::size_t>(s);
    return s < decode_end ? query_start[i + 1] - query_start[i] : 1;
  }
};

// Checks a step (inputs, options, pools, out, the batch's slots; gdn/step.h lists the rules).
// Throws gdn::InvalidArgument before anything is written.
void validate_step(const StepInputs& inputs, const StatePools& pools, const MutableTensorView& out,
                   const StepOptions& options, OutputPrecision precision, ValidatedStep* result);

// The checks the validations share (validate.cc).
// The sequences cu_seqlens (int64 [N + 1]) defines over `tokens` tokens, with their first
// chunk indices for chunks of `chunk` tokens.
void packed_sequences(const TensorView& cu, std::int64_t tokens, std::int64_t chunk,
                      const char* tokens_of, std::vector<Sequence>* seqs);
// Why a parameter, state or residual has the compute dtype, for error messages.
std::string compute_dtype_why(DType activations);
// options.threads in [0, 1024] and options.isa one of the enum's values.
void check_threads_and_isa(int threads, CpuIsa isa);
// A conv weight [D, K] or [D, 1, K] (K from 1 to kMaxConvTaps) and an optional bias [D], in
// the compute dtype; returns K.
std::int64_t check_conv_parameters(const char* weight_name, const char* bias_name,
                                   const TensorView& weight, const TensorView& bias,
                                   std::int64_t channels, DType compute_dtype,
                                   const std::string& why);

// A validated conv call (gdn/conv.h).
class ValidatedConv {
 public:
  ValidatedConv() = default;
  ValidatedConv(const ValidatedConv&) = delete;
  ValidatedConv& operator=(const ValidatedConv&) = delete;

  std::int64_t tokens = 0, channels = 0, taps = 0;
  DType dtype = DType::f32;          // of x, out and their gradients
  DType compute_dtype = DType::f32;  // weight, bias, states
  std::vector<Sequence> sequences;
};

// Checks a conv call's inputs and options (validate_conv.cc); Throws gdn::InvalidArgument.
void validate_conv_inputs(const ConvInputs& inputs, const ConvOptions& options,
                          ValidatedConv* result);
void validate_conv_forward(const ConvInputs& inputs, const ConvOutputs& outputs,
                           const ConvOptions& options, OutputPrecision precision,
                           ValidatedConv* result);
void validate_conv_backward(const ConvBackwardInputs& inputs, const ConvBackwardOutputs& outputs,
                            const ConvOptions& options, OutputPrecision precision,
                            ValidatedConv* result);

// A validated conv_update (gdn/conv.h): the conv's facts, and the pool's: its rows S, each
// sequence's slot, and the pool's strides in elements (inner ones normalised: a channel-last
// slot has (row, channel) = (D, 1), a channel-first one (1, S); one slot: slot = S D).
struct ValidatedConvUpdate {
  ValidatedConv conv;
  std::int64_t rows = 0;
  std::int64_t slot_stride = 0, row_stride = 0, channel_stride = 0;
  std::vector<std::int64_t> slots;
};

void validate_conv_update(const ConvUpdateInputs& inputs, const MutableTensorView& conv_state,
                          const MutableTensorView& out, const ConvOptions& options,
                          ValidatedConvUpdate* result);

}  // namespace gdn::detail
