// layer.h: the CPU backend's conv1d + SiLU drivers for the fused layer op.
#pragma once

#include "api/problem.h"
#include "gdn/runtime.h"

namespace gdn::cpu {

// xh = SiLU(conv(x)) for every sequence; items are (sequence, block of channels).
void conv_forward(const detail::ConvProblem& problem, CpuIsa isa, int threads);

// dx, d conv_state, d weight and d bias; items are blocks of channels, each over every
// sequence in order, so that the parameter gradients are summed in a fixed order.
void conv_backward(const detail::ConvProblem& problem, CpuIsa isa, int threads);

}  // namespace gdn::cpu
