// layer.h: the CPU backend's conv1d + SiLU drivers for the conv op, the fused layer op's
// backward and a serving step's decodes (the layer op's forward fuses its conv into the gated
// delta rule's packing: ForwardProblem::conv), and the decode driver of a serving step.
#pragma once

#include "common/kernel_problem.h"
#include "gdn/runtime.h"

namespace gdn::cpu {

// xh = SiLU(conv(x)) for every sequence; items are blocks of tokens of one sequence, all
// channels (src/cpu/workspace.h: kConvTokens).
void conv_forward(const detail::ConvProblem& problem, CpuIsa isa, int threads);

// dx, d conv_state, d weight and d bias; the same items, each writing its partial d weight
// and d bias, summed afterwards in item order (bit-identical for any thread count).
void conv_backward(const detail::ConvProblem& problem, CpuIsa isa, int threads);

// The decodes of a serving step (src/cpu/decode-inl.h): items of (sequence, value head, block
// of value columns), problem.vblocks blocks per head.
void decode(const detail::DecodeProblem& problem, CpuIsa isa, int threads);

}  // namespace gdn::cpu
