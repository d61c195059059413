// forward.h: the CPU backend's entry point for a validated forward problem.
#pragma once

#include "common/kernel_problem.h"
#include "gdn/plan.h"
#include "gdn/runtime.h"

namespace gdn::cpu {

// Runs the forward on `isa` (resolved here; automatic allowed) with problem.threads threads,
// split as the tiling plan for this problem says (src/cpu/plan.h).
void forward(const detail::ForwardProblem& problem, CpuIsa isa);

// Runs the forward as `plan` says (`gdn plan --time` and the tests run every alternative).
// The plan must be a forward plan of the problem's chunk size with heads_per_item one of
// heads_candidates (src/cpu/plan.h), else gdn::RuntimeError.
void forward(const detail::ForwardProblem& problem, const Plan& plan);

}  // namespace gdn::cpu
