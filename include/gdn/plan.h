// gdn/plan.h: the tiling plan, how a CPU call splits its work on this machine, and why.
//
// Every CPU call makes a plan before it runs: the chunk size (when options.chunk_size is 0),
// the value heads of one forward work item, the backward's rebuild segment, the threads that
// run and the decode split of a serving step, chosen from the problem shape, the options and
// the machine (cache sizes and core count read at run time, the resolved ISA). make_plan
// returns the plan a call with the same problem and options runs, with one line per choice
// saying why (`gdn plan` prints it). Only the chunk size changes the arithmetic: for one chunk
// size every plan gives bit-identical results, and the chunk size never depends on the thread
// count (docs/architecture.md, docs/perf.md "Tiling plan").
#pragma once

#include <cstdint>
#include <string>

#include "gdn/forward.h"
#include "gdn/runtime.h"
#include "gdn/tensor.h"

namespace gdn {

// What the plan reads of the machine, once per process: the caches of CPU 0 from
// /sys/devices/system/cpu/cpu0/cache, else sysconf, else a fallback.
struct MachineInfo {
  int cores = 1;               // online logical CPUs
  std::int64_t l1d_bytes = 0;  // per core
  std::int64_t l2_bytes = 0;   // per core
  std::int64_t l3_bytes = 0;   // the L3 of CPU 0 ...
  int l3_sharing = 1;          // ... shared by this many CPUs
  std::string source;          // "sysfs", "sysconf" or "fallback (...)"
};
const MachineInfo& machine_info();

enum class PlanOp : std::uint8_t {
  forward,   // gdn::chunk_gated_delta_rule_fwd (and the layer op's core)
  backward,  // gdn::chunk_gated_delta_rule_bwd
  decode,    // the decodes of a serving step, gdn::fused_gdn_step
};
const char* plan_op_name(PlanOp op);  // "forward", "backward", "decode"

// The problem a plan is for.
struct PlanProblem {
  PlanOp op = PlanOp::forward;
  std::int64_t tokens = 0;        // of the longest sequence (decode: of the longest window)
  std::int64_t num_seqs = 1;      // sequences (decode: decodes in the batch)
  std::int64_t total_tokens = 0;  // of all sequences; 0: tokens x num_seqs (equal lengths)
  std::int64_t hk = 1, hv = 1, dk = 128, dv = 128;
  DType dtype = DType::f32;  // of the activations
  bool residuals = false;    // forward: chunk_states or t_inv requested (every sequence chunked);
                             // backward: chunk_states kept (nothing rebuilt)
};

// The choices, each with one line saying why.
struct Plan {
  PlanOp op = PlanOp::forward;
  CpuIsa isa = CpuIsa::generic;  // resolved
  std::string isa_reason;
  int chunk_size = 64;  // C, the residuals' layout
  std::string chunk_reason;
  std::int64_t heads_per_item = 1;  // value heads per work item (all of a key head's in the
                                    // backward; 1 in a decode)
  std::int64_t items = 0;           // work items (decode: items of vblocks column blocks)
  std::string items_reason;
  int threads = 1;  // threads that run: the requested count, at most one per item
  std::string threads_reason;
  std::int64_t rebuild_segment = 0;  // backward: chunks per rebuilt segment; 0: states kept
  std::string segment_reason;
  std::int64_t vblocks = 1;  // decode: blocks of value columns per head
  std::string vblocks_reason;
  std::int64_t workspace_bytes = 0;  // per thread
};

// The plan of a call with this problem and these options (threads, isa, chunk_size; 0 lets the
// plan choose the chunk size). Throws gdn::InvalidArgument for an impossible shape (a head
// count or head dim below 1, Hv not a multiple of Hk, chunk_size outside 0..256) and
// gdn::RuntimeError for an unavailable ISA, as the call itself would.
Plan make_plan(const PlanProblem& problem, const ForwardOptions& options = {});

}  // namespace gdn
