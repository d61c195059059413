// forward.h: the CPU backend's entry point for a validated forward problem.
#pragma once

#include "api/problem.h"
#include "gdn/runtime.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace gdn::cpu {

// Runs the forward on `isa` (resolved here; automatic allowed) with problem.threads threads.
void forward(const detail::ForwardProblem& problem, CpuIsa isa);

}  // namespace gdn::cpu
