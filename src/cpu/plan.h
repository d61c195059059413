// plan.h: the CPU backend's tiling plan (gdn/plan.h): the tuning constants, the evidence for
// each, and the hooks the drivers, the validation, `gdn plan --time` and the tests share.
#pragma once

#include <cstdint>
#include <vector>

#include "common/kernel_problem.h"
#include "gdn/plan.h"

namespace gdn::cpu {

// Value heads per forward item: at most kMaxGroup (each further head costs one state of
// workspace, 64 KiB at d = 128, float32).
inline constexpr std::int64_t kMaxGroup = 8;

// Without kept chunk states, each backward item rebuilds its states: all of them when they fit
// in kRebuildBudget (one forward pass), else checkpoints every ceil(sqrt(chunks)) chunks and
// one segment at a time (O(sqrt(chunks)) states per thread, one extra pass).
inline constexpr std::int64_t kRebuildBudget = std::int64_t{32} << 20;

// A decode splits heads into blocks of value columns only for threads that would idle, each
// block at least kDecodeMinColumns columns (one AVX-512 vector, two AVX2 ones) and
// kDecodeMinBlockBytes of state read and written: a block must outlast waking a thread
// (src/cpu/plan.cc has the measurements).
inline constexpr std::int64_t kDecodeMinColumns = 16;
inline constexpr std::int64_t kDecodeMinBlockBytes = std::int64_t{256} << 10;

// Choices forced by the caller instead of planned (0: the plan chooses). For `gdn plan --time`
// and the tests, which run every alternative; none of them changes a result bit.
struct PlanForce {
  std::int64_t heads_per_item = 0;  // forward: one of heads_candidates
  std::int64_t vblocks = 0;         // decode: 1 to Dv
};

// make_plan (gdn/plan.h) with forced choices. Throws gdn::InvalidArgument for a forced choice
// the problem cannot take.
Plan make_plan(const PlanProblem& problem, const ForwardOptions& options, const PlanForce& force);

// The chunk size options.chunk_size = 0 stands for. It may depend on the head dims, the
// dtype, the ISA and the caches (measured: on the ISA alone), never on the thread count
// (results stay bit-identical for any thread count) nor on the sequence lengths
// (forward_shape and the backward's validation see the same shape). Never throws: validation
// calls it before it has checked options.isa, and an unusable ISA is reported by the dispatch.
int planned_chunk_size(const ForwardShape& shape, CpuIsa isa);

// The problem a driver plans for: the longest sequence's tokens, whether residuals are written
// (forward) or kept (backward).
PlanProblem plan_problem(const detail::ForwardProblem& problem);
PlanProblem plan_problem(const detail::BackwardProblem& problem);

// Options carrying a validated problem's threads and chunk size (fixed by the validation).
ForwardOptions plan_options(const detail::ForwardProblem& problem, CpuIsa isa);

// The alternatives tried by `gdn plan --time` and the tests: heads per forward item (the
// divisors of Hv / Hk, then the multiples of it that divide Hv: whole groups of consecutive key
// heads; up to kMaxGroup, ascending), decode column blocks (1, 2, 4, ... while a block keeps
// kDecodeMinColumns columns), chunk sizes.
std::vector<std::int64_t> heads_candidates(std::int64_t hk, std::int64_t hv);
std::vector<std::int64_t> vblocks_candidates(std::int64_t dv);
inline constexpr int kChunkCandidates[] = {32, 64};

}  // namespace gdn::cpu
