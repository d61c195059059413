// backward.h: the CPU backend's entry point for a validated backward problem.
#pragma once

#include "common/kernel_problem.h"
#include "gdn/plan.h"
#include "gdn/runtime.h"

namespace gdn::cpu {

// Runs the backward on `isa` (resolved here) with problem.fwd.threads threads, as the tiling
// plan for this problem says (src/cpu/plan.h).
void backward(const detail::BackwardProblem& problem, CpuIsa isa);

// Runs the backward as `plan` says: a backward plan of the problem's chunk size, all Hv / Hk
// value heads per item, a rebuild segment of 0 exactly when chunk_states were kept (else
// gdn::RuntimeError).
void backward(const detail::BackwardProblem& problem, const Plan& plan);

}  // namespace gdn::cpu
