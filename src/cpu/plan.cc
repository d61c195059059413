// plan.cc: the tiling plan (gdn/plan.h, src/cpu/plan.h). Each choice is one small rule with
// the measurement behind it next to it (docs/perf.md, "Tiling plan"), and a reason line that
// `gdn plan` prints.
#include "cpu/plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "cpu/kernels.h"
#include "gdn/error.h"

namespace gdn {
namespace cpu {
namespace {

std::string str(std::int64_t x) { return std::to_string(x); }

std::string bytes_text(std::int64_t bytes) {
  char text[32];
  if (bytes >= (std::int64_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else {
    std::snprintf(text, sizeof text, "%lld KiB", static_cast<long long>((bytes + 1023) >> 10));
  }
  return text;
}

std::string plural(std::int64_t n, const char* one, const char* many) {
  return str(n) + " " + (n == 1 ? one : many);
}

// --- The machine -----------------------------------------------------------------------------

// "32K", "512K", "32768K", "1M" as sysfs writes cache sizes.
std::int64_t parse_size(const std::string& text) {
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || value <= 0) return 0;
  switch (*end) {
    case 'K':
      return value << 10;
    case 'M':
      return value << 20;
    case 'G':
      return value << 30;
    default:
      return value;
  }
}

// CPUs in a sysfs list such as "0-1" or "0,2,4-7".
int count_cpus(const std::string& list) {
  int count = 0;
  std::size_t at = 0;
  while (at < list.size()) {
    std::size_t next = list.find(',', at);
    if (next == std::string::npos) next = list.size();
    const std::string part = list.substr(at, next - at);
    const std::size_t dash = part.find('-');
    if (dash == std::string::npos) {
      if (!part.empty()) ++count;
    } else {
      count += std::atoi(part.c_str() + dash + 1) - std::atoi(part.c_str()) + 1;
    }
    at = next + 1;
  }
  return count > 0 ? count : 1;
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

MachineInfo detect_machine() {
  MachineInfo m;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  m.cores = cores > 0 ? static_cast<int>(cores) : 1;
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    const std::string level = read_line(dir + "/level"), type = read_line(dir + "/type");
    if (level.empty()) break;
    const std::int64_t size = parse_size(read_line(dir + "/size"));
    if (level == "1" && type == "Data") m.l1d_bytes = size;
    if (level == "2" && type != "Instruction") m.l2_bytes = size;
    if (level == "3" && type != "Instruction") {
      m.l3_bytes = size;
      m.l3_sharing = count_cpus(read_line(dir + "/shared_cpu_list"));
    }
  }
  if (m.l1d_bytes > 0 && m.l2_bytes > 0) {
    m.source = "sysfs";
    return m;
  }
  // sysconf's L3 is the package's (under a hypervisor not necessarily what the guest shares).
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && \
    defined(_SC_LEVEL3_CACHE_SIZE)
  const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l1 > 0 && l2 > 0) {
    m.l1d_bytes = l1;
    m.l2_bytes = l2;
    m.l3_bytes = l3 > 0 ? l3 : 0;
    m.l3_sharing = m.cores;
    m.source = "sysconf";
    return m;
  }
#endif
  // A small current x86-64 or ARM core.
  m.l1d_bytes = std::int64_t{32} << 10;
  m.l2_bytes = std::int64_t{512} << 10;
  m.l3_bytes = std::int64_t{8} << 20;
  m.l3_sharing = m.cores;
  m.source = "fallback (no cache sizes in sysfs or sysconf)";
  return m;
}

// --- Checks and the ISA ------------------------------------------------------------------------

void check_problem(const PlanProblem& p, const ForwardOptions& o) {
  if (p.op != PlanOp::forward && p.op != PlanOp::backward && p.op != PlanOp::decode) {
    throw InvalidArgument("problem.op", "forward, backward or decode", str(static_cast<int>(p.op)));
  }
  if (p.hk < 1) throw InvalidArgument("problem.hk", ">= 1", str(p.hk));
  if (p.hv < 1 || p.hv % p.hk != 0) {
    throw InvalidArgument("problem.hv", "a positive multiple of hk = " + str(p.hk), str(p.hv));
  }
  if (p.dk < 1 || p.dk > 256) throw InvalidArgument("problem.dk", "1 to 256", str(p.dk));
  if (p.dv < 1 || p.dv > 256) throw InvalidArgument("problem.dv", "1 to 256", str(p.dv));
  if (p.tokens < 0) throw InvalidArgument("problem.tokens", ">= 0", str(p.tokens));
  if (p.num_seqs < 1) throw InvalidArgument("problem.num_seqs", ">= 1", str(p.num_seqs));
  if (o.chunk_size < 0 || o.chunk_size > 256) {
    throw InvalidArgument("options.chunk_size", "0 (the plan chooses) or 1 to 256",
                          str(o.chunk_size));
  }
  if (o.threads < 0 || o.threads > 1024) {
    throw InvalidArgument("options.threads", "0 (all cores) to 1024", str(o.threads));
  }
}

std::string isa_reason(CpuIsa requested, CpuIsa isa) {
  const std::string name = cpu_isa_name(isa);
  if (requested != CpuIsa::automatic) return name + ": options.isa";
  const char* env = std::getenv("GDN_CPU_ISA");
  if (env != nullptr && *env != '\0' && std::string(env) != "automatic") {
    return name + ": named by GDN_CPU_ISA";
  }
  std::string why = name + ": the widest variant compiled in that this CPU runs";
  // The next wider variant and why it did not run.
  const CpuIsa wider = isa == CpuIsa::avx512 ? CpuIsa::avx512_bf16 : CpuIsa::avx512;
  if (isa != CpuIsa::avx512_bf16) {
    const char* reason = cpu_isa_unavailable_reason(wider);
    why += std::string(" (") + cpu_isa_name(wider) + ": " +
           (reason != nullptr ? reason : "available") + ")";
  }
  return why;
}

// --- The chunk size ----------------------------------------------------------------------------

// The chunk size, per ISA: what measured faster (docs/perf.md, "Tiling plan"). On a Zen 3
// core (AVX2, 32 KiB L1d, 512 KiB L2), one thread, 1k-2k tokens: C = 32 ran the forward 3-22 %
// faster than C = 64 at Dk = Dv = 32, 64, 128 and 256 (float32 and float64: the products
// with the state cost the same per token, the intra-chunk ones, 2 C (Dk + Dv) + C^2 / 3 FLOPs
// per token and head, halve) and the backward 0-13 % faster under every remat policy (at 8k
// tokens even with its rebuilt states past the budget, checkpointed); the generic variant
// likewise (forward 13 %, backward 13 %). Neither the head dims, the dtype nor the caches
// changed the winner, so the rule is the ISA's. The cost: twice the chunk_states residual
// (1.7x the residuals at Dk = Dv = 128). AVX-512: 64, the size its kernels were tuned at
// (Zen 5, where 32 is not measured). On an Intel Xeon (AVX-512) 32 ran the forward 4-17 %
// faster and the backward from all residuals 3-4 %, but the `none` backward at 8k tokens 8 %
// slower (its rebuilt states pass the budget at C = 32 and are checkpointed): the forward and
// the backward must share C, so the policy cannot choose it, and the mixed result does not
// justify a rule by vendor before Zen 4/5 are measured. avx512_bf16 is avx512 with another
// bf16-operand product, so it keeps avx512's chunk: float32 results then do not depend on
// which of the two runs.
int chunk_rule(CpuIsa isa, std::string* reason) {
  const bool wide = isa == CpuIsa::avx512 || isa == CpuIsa::avx512_bf16;
  const int chunk = wide ? 64 : 32;
  if (reason != nullptr) {
    *reason = wide ? std::string("64: with ") + cpu_isa_name(isa) +
                         ", the size its kernels were tuned at (on an Intel Xeon 32 was "
                         "faster, except the none-policy backward; docs/perf.md \"Tiling "
                         "plan\")"
                   : std::string("32: measured faster than 64 with ") + cpu_isa_name(isa) +
                         " (forward 3-22 %, backward 0-13 %, Dk = Dv = 32 to 256), at twice "
                         "the chunk_states residual; docs/perf.md \"Tiling plan\"";
  }
  return chunk;
}

// --- Workspaces (the drivers' own sizing, src/cpu/dispatch.cc) ---------------------------------

detail::ForwardProblem sizing_problem(const PlanProblem& p, int chunk) {
  detail::ForwardProblem f;
  f.shape.hk = p.hk;
  f.shape.hv = p.hv;
  f.shape.dk = p.dk;
  f.shape.dv = p.dv;
  f.shape.dtype = p.dtype;
  f.shape.compute_dtype = p.dtype == DType::f64 ? DType::f64 : DType::f32;
  f.chunk_size = chunk;
  return f;
}

// --- The plans ---------------------------------------------------------------------------------

void plan_forward(const PlanProblem& p, int threads, const PlanForce& force, Plan* plan) {
  const std::int64_t group = p.hv / p.hk, c = plan->chunk_size;
  std::int64_t heads = 1;
  if (force.heads_per_item > 0) {
    const std::vector<std::int64_t> allowed = heads_candidates(p.hk, p.hv);
    if (std::find(allowed.begin(), allowed.end(), force.heads_per_item) == allowed.end()) {
      throw InvalidArgument("heads_per_item",
                            "a divisor of Hv / Hk = " + str(group) +
                                " or a multiple of it that divides Hv = " + str(p.hv) +
                                ", at most " + str(kMaxGroup),
                            str(force.heads_per_item));
    }
    heads = force.heads_per_item;
    plan->items_reason = plural(heads, "value head", "value heads") + " per item: forced";
  } else {
    // Value heads per item: the largest candidate (heads_candidates: a divisor of Hv / Hk, or
    // whole groups of consecutive key heads; at most kMaxGroup) that still gives every thread
    // an item and makes no item longer than a thread's share of the work (the longest
    // sequence times the heads, against all tokens times Hv over the threads).
    //
    // A group of one key head shares the packing of q and k, their L2 norm and [Q;K] K^T, and
    // reads the q and k rows once instead of once per value head: at 8k tokens, Qwen3-Next
    // shape, one thread, 238-261 ms grouped against 308-332 ms (Zen 5); on Zen 3 each doubling
    // of the group up to 8 was 9-19 % faster, even with a workspace past the L2 (4 heads at
    // C = 64: 562 KiB of 512 KiB). A threshold of two items per thread instead of one measured
    // 11-14 % slower (Hk = 1 or 2, Hv = 8, 2 threads: 4 items of 2 heads against 2 of 4).
    //
    // Several key heads share no arithmetic, but their token rows lie in the same memory
    // pages, which an item walks once for all its heads. With inputs in 4 KiB pages (what
    // XLA and torch allocate where transparent huge pages are `madvise`) that is most of what
    // a page costs: Qwen3-Next at 8k tokens, Intel Xeon (2 MiB L2), the forward on 4 KiB-page
    // inputs against the same inputs in huge pages took 302 ms against 275 with 2 heads per
    // item, 291 with 4 and 286 with 8 (one thread, minima of 9 alternating rounds; two
    // threads: 149, 143, 142 against 138), while on huge pages 4 and 8 heads were level with 2.
    // They hold a state each, so they are taken only while the workspace stays within three
    // quarters of the L2 (the rest for the bf16 scratch, the rows in flight, a sibling
    // hyperthread), and only where the busiest thread runs no more heads than with the
    // largest group of one key head (8 heads per item on 3 threads: 16 heads for one thread
    // against 12 with 2 per item).
    const std::int64_t total = p.total_tokens > 0 ? p.total_tokens : p.tokens * p.num_seqs;
    const std::int64_t l2 = machine_info().l2_bytes;
    auto allowed = [&](std::int64_t g) {
      return p.num_seqs * p.hv / g >= threads && p.tokens * g * threads <= total * p.hv;
    };
    auto busiest = [&](std::int64_t g) {
      return (p.num_seqs * p.hv / g + threads - 1) / threads * g;
    };
    const std::vector<std::int64_t> candidates = heads_candidates(p.hk, p.hv);
    for (auto g = candidates.rbegin(); g != candidates.rend(); ++g) {
      if (*g <= group && allowed(*g)) {
        heads = *g;
        break;
      }
    }
    for (auto g = candidates.rbegin(); g != candidates.rend() && *g > group; ++g) {
      const auto workspace = static_cast<std::int64_t>(
          forward_workspace_bytes(sizing_problem(p, static_cast<int>(c)), *g));
      if (workspace * 4 <= l2 * 3 && allowed(*g) && busiest(*g) <= busiest(heads)) {
        heads = *g;
        break;
      }
    }
    const std::int64_t items = p.num_seqs * p.hv / heads;
    const std::string share = plural(items, "item", "items") + " for " +
                              plural(threads, "thread", "threads") +
                              ", none longer than a thread's share";
    if (heads > group) {
      plan->items_reason =
          plural(heads, "value head", "value heads") +
          " per item: " + plural(heads / group, "key head", "key heads") +
          " whose token rows share memory pages, walked once for all of them" +
          (group > 1 ? " (each key head's value heads share its q/k packing, L2 norm and "
                       "[Q;K] K^T)"
                     : "") +
          "; workspace within 3/4 of the L2 (" + str(l2 >> 10) + " KiB); " + share;
    } else if (heads > 1) {
      plan->items_reason = plural(heads, "value head", "value heads") +
                           " per item: they share their key head's q/k packing, L2 norm and "
                           "[Q;K] K^T; " +
                           share;
    } else {
      plan->items_reason =
          group > 1 ? "1 value head per item: a group of the " + str(group) +
                          " value heads of a key head would leave a thread without an item or "
                          "make an item longer than a thread's share (" +
                          plural(threads, "thread", "threads") + ")"
                    : "1 value head per item: Hv = Hk, and items of several key heads would "
                      "leave a thread without an item, load one thread more, make an item "
                      "longer than a thread's share or not fit 3/4 of the L2 (" +
                          plural(threads, "thread", "threads") + ")";
    }
  }
  plan->heads_per_item = heads;
  plan->items = p.num_seqs * p.hv / heads;
  if (!p.residuals && p.tokens < c) {
    plan->items_reason += "; every sequence is shorter than C: the token recurrence runs";
  }
  plan->workspace_bytes = static_cast<std::int64_t>(
      forward_workspace_bytes(sizing_problem(p, plan->chunk_size), heads));
}

void plan_backward(const PlanProblem& p, Plan* plan) {
  const std::int64_t group = p.hv / p.hk, c = plan->chunk_size;
  plan->heads_per_item = group;
  plan->items = p.num_seqs * p.hk;
  plan->items_reason = "all " + plural(group, "value head", "value heads") +
                       " of a key head per item: their dq, dk are summed inside the item in "
                       "head order (no reduction pass, bit-identical for any thread count)";
  const std::int64_t chunks = (p.tokens + c - 1) / c;
  const std::int64_t elem = p.dtype == DType::f64 ? 8 : 4;
  const std::int64_t state_bytes = group * p.dk * ((p.dv + 15) / 16 * 16) * elem;
  std::int64_t segment = 0;
  if (p.residuals) {
    plan->segment_reason = "none: chunk_states were kept, nothing is rebuilt";
  } else if (chunks <= 0) {
    segment = 1;
    plan->segment_reason = "1: no chunks";
  } else if ((chunks + 1) * state_bytes <= kRebuildBudget) {
    segment = chunks;
    plan->segment_reason = "all " + str(chunks) + " chunks: their rebuilt states (" +
                           bytes_text((chunks + 1) * state_bytes) + " per thread) fit the " +
                           bytes_text(kRebuildBudget) + " rebuild budget, one forward pass";
  } else {
    segment = static_cast<std::int64_t>(std::ceil(std::sqrt(static_cast<double>(chunks))));
    plan->segment_reason = str(segment) + " chunks (ceil sqrt " + str(chunks) + "): all states (" +
                           bytes_text((chunks + 1) * state_bytes) + " per thread) exceed the " +
                           bytes_text(kRebuildBudget) +
                           " rebuild budget; checkpoints, then one segment at a time";
  }
  plan->rebuild_segment = segment;
  detail::BackwardProblem sizing;
  sizing.fwd = sizing_problem(p, plan->chunk_size);
  plan->workspace_bytes =
      static_cast<std::int64_t>(backward_workspace_bytes(sizing, group, chunks, segment));
}

void plan_decode(const PlanProblem& p, int threads, const PlanForce& force, Plan* plan) {
  std::int64_t vblocks = 1;
  const std::int64_t heads = p.num_seqs * p.hv;
  if (force.vblocks > 0) {
    if (force.vblocks > p.dv) {
      throw InvalidArgument("vblocks", "1 to Dv = " + str(p.dv), str(force.vblocks));
    }
    vblocks = force.vblocks;
    plan->vblocks_reason = str(vblocks) + ": forced";
  } else {
    // Columns are independent in the delta rule, so a head may be split into blocks of value
    // columns without changing a bit; each block repacks q and k and is one more item. Split
    // only when threads would otherwise idle (N x Hv < threads), into the fewest blocks that
    // give every thread an item, each block keeping kDecodeMinColumns columns and
    // kDecodeMinBlockBytes of state traffic. On Zen 3, 2 threads, whole decode steps of 10 to
    // 130 us: splitting N x Hv >= 2 heads into 2 to 16 blocks (the earlier rule: 8 items per
    // thread) cost 1.1-1.7x in every case; splitting one head of 64 KiB or 256 KiB of state
    // into 2 to 8 blocks measured between 1.56x slower and 1.09x faster.
    const std::int64_t bytes = p.tokens * p.dk * p.dv * (p.dtype == DType::f64 ? 8 : 4);
    while (heads * vblocks < threads && vblocks * 2 * kDecodeMinColumns <= p.dv &&
           bytes / (vblocks * 2) >= kDecodeMinBlockBytes) {
      vblocks *= 2;
    }
    if (vblocks > 1) {
      plan->vblocks_reason = str(vblocks) + " blocks of " + str(p.dv / vblocks) +
                             " value columns: " + plural(heads, "head", "heads") + " for " +
                             plural(threads, "thread", "threads") + ", " +
                             plural(heads * vblocks, "item", "items");
    } else if (heads >= threads) {
      plan->vblocks_reason = "1: " + plural(heads, "head", "heads") + " (" + str(p.num_seqs) +
                             " x " + str(p.hv) + ") give each of " +
                             plural(threads, "thread", "threads") + " whole heads";
    } else {
      plan->vblocks_reason = "1: a block of half the " + bytes_text(bytes) +
                             " of state traffic per head would be under " +
                             bytes_text(kDecodeMinBlockBytes) + " (or " + str(kDecodeMinColumns) +
                             " columns)";
    }
  }
  plan->vblocks = vblocks;
  plan->heads_per_item = 1;
  plan->items = heads * vblocks;
  plan->items_reason = "items of (sequence, value head, block of value columns)";
  detail::DecodeProblem sizing;
  sizing.dk = p.dk;
  sizing.dv = p.dv;
  sizing.dtype = p.dtype == DType::f64 ? DType::f64 : DType::f32;
  plan->workspace_bytes = static_cast<std::int64_t>(decode_workspace_bytes(sizing));
}

}  // namespace

Plan make_plan(const PlanProblem& p, const ForwardOptions& o, const PlanForce& force) {
  check_problem(p, o);
  Plan plan;
  plan.op = p.op;
  plan.isa = resolve_cpu_isa(o.isa);
  plan.isa_reason = isa_reason(o.isa, plan.isa);
  const int threads = o.threads > 0 ? o.threads : default_threads();
  const char* omp = std::getenv("OMP_NUM_THREADS");
  std::string requested = "the default (the " + str(threads) + " CPUs this process may run on)";
  if (o.threads > 0) {
    requested = "options.threads = " + str(o.threads);
  } else if (!built_with_threads()) {
    requested = "a build with GDN_THREADS=OFF";
  } else if (omp != nullptr && *omp != '\0') {
    requested = std::string("OMP_NUM_THREADS = ") + omp;
  }

  if (p.op == PlanOp::decode) {
    plan.chunk_size = 0;
    plan.chunk_reason = "none: a decode runs the token recurrence";
    plan_decode(p, threads, force, &plan);
  } else {
    if (o.chunk_size > 0) {
      plan.chunk_size = o.chunk_size;
      plan.chunk_reason = str(o.chunk_size) + ": options.chunk_size (0 lets the plan choose)";
    } else {
      plan.chunk_size = chunk_rule(plan.isa, &plan.chunk_reason);
    }
    if (p.op == PlanOp::forward) {
      plan_forward(p, threads, force, &plan);
    } else {
      plan_backward(p, &plan);
    }
  }
  plan.threads = threads;
  plan.threads_reason = plural(threads, "thread", "threads") + ": " + requested;
  if (plan.items < threads) {
    plan.threads = plan.items > 0 ? static_cast<int>(plan.items) : 1;
    plan.threads_reason = plural(plan.threads, "thread", "threads") + ": one per item (" +
                          requested + ", " + plural(plan.items, "item", "items") + ")";
  }
  return plan;
}

int planned_chunk_size([[maybe_unused]] const ForwardShape& shape, CpuIsa isa) {
  CpuIsa resolved = CpuIsa::generic;
  if (isa == CpuIsa::automatic || isa == CpuIsa::generic || isa == CpuIsa::avx2 ||
      isa == CpuIsa::avx512 || isa == CpuIsa::avx512_bf16) {
    try {
      resolved = resolve_cpu_isa(isa);
    } catch (const RuntimeError&) {
      resolved = CpuIsa::generic;
    }
  }
  return chunk_rule(resolved, nullptr);
}

PlanProblem plan_problem(const detail::ForwardProblem& f) {
  PlanProblem p;
  p.op = PlanOp::forward;
  for (std::int64_t s = 0; s < f.shape.num_seqs; ++s) {
    if (f.seqs[s].length > p.tokens) p.tokens = f.seqs[s].length;
    p.total_tokens += f.seqs[s].length;
  }
  p.num_seqs = f.shape.num_seqs;
  p.hk = f.shape.hk;
  p.hv = f.shape.hv;
  p.dk = f.shape.dk;
  p.dv = f.shape.dv;
  p.dtype = f.shape.dtype;
  p.residuals = f.chunk_states.data != nullptr || f.t_inv.data != nullptr;
  return p;
}

PlanProblem plan_problem(const detail::BackwardProblem& b) {
  PlanProblem p = plan_problem(b.fwd);
  p.op = PlanOp::backward;
  p.residuals = b.chunk_states.data != nullptr;
  return p;
}

ForwardOptions plan_options(const detail::ForwardProblem& f, CpuIsa isa) {
  ForwardOptions o;
  o.chunk_size = f.chunk_size;
  o.threads = f.threads;
  o.isa = isa;
  o.algorithm = f.algorithm;
  return o;
}

std::vector<std::int64_t> heads_candidates(std::int64_t hk, std::int64_t hv) {
  const std::int64_t group = hv / hk;
  std::vector<std::int64_t> out;
  for (std::int64_t g = 1; g <= kMaxGroup; ++g) {
    if ((g <= group && group % g == 0) || (g > group && g % group == 0 && hk % (g / group) == 0)) {
      out.push_back(g);
    }
  }
  return out;
}

std::vector<std::int64_t> vblocks_candidates(std::int64_t dv) {
  std::vector<std::int64_t> out{1};
  while (out.back() * 2 * kDecodeMinColumns <= dv) out.push_back(out.back() * 2);
  return out;
}

}  // namespace cpu

const MachineInfo& machine_info() {
  static const MachineInfo info = cpu::detect_machine();
  return info;
}

const char* plan_op_name(PlanOp op) {
  switch (op) {
    case PlanOp::forward:
      return "forward";
    case PlanOp::backward:
      return "backward";
    case PlanOp::decode:
      return "decode";
  }
  return "unknown";
}

Plan make_plan(const PlanProblem& problem, const ForwardOptions& options) {
  return cpu::make_plan(problem, options, cpu::PlanForce{});
}

}  // namespace gdn
