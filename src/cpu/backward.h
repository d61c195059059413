// backward.h: the CPU backend's entry point for a validated backward problem.
#pragma once

#include "api/problem.h"
#include "gdn/runtime.h"

namespace gdn::cpu {

// Runs the backward on `isa` (resolved here) with problem.fwd.threads threads.
void backward(const detail::BackwardProblem& problem, CpuIsa isa);

}  // namespace gdn::cpu
