// plan_command.cc: `gdn plan`, the tiling plan a CPU call makes on this machine (gdn/plan.h):
// the machine it reads, the problem, each choice and why; with --time, the chosen plan and
// every alternative tried, timed on the same problem, and whether the choice is within 5 % of
// the best.
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "api/step_plan.h"
#include "api/validate.h"
#include "args.h"
#include "bench_noise.h"
#include "bench_util.h"
#include "commands.h"
#include "cpu/backward.h"
#include "cpu/forward.h"
#include "cpu/plan.h"
#include "gdn/gdn.h"
#include "inputs.h"
#include "sysinfo.h"

namespace gdn::cli {

const char* const kPlanHelp = R"HELP(usage: gdn plan [options]

Prints the tiling plan a CPU call makes for one problem on this machine (include/gdn/plan.h):
the machine the plan reads (ISA, cores, cache sizes), the problem, and each choice with its
reason: the chunk size C (chosen by the plan when --chunk-size is 0, the default here; the
library's default is options.chunk_size = 64), the value heads of one work item, the items
and the threads that run them, the per-thread workspace, the backward's rebuild segment and
the decode split (blocks of value columns per head). A library call with the same shape and
options runs exactly this plan. Only the chunk size changes the arithmetic: every other choice
leaves the results bit-identical.

--time runs the chosen plan and each alternative tried on this problem (q and k L2-normalised,
seeded inputs): the forward and the backward at chunk sizes 32 and 64 (only the given one when
--chunk-size is not 0) and, for the forward, each value-heads-per-item candidate (the
divisors of HV / HK, then whole groups of several key heads; up to 8 heads); a decode step
(conv K = 4, a history of 4096 tokens) with each column split (1, 2, 4, ... blocks of at
least 16 columns). Alternatives of one chunk size
are first checked to give bit-identical results. Each of --rounds rounds times every
alternative --repeats times after a warm-up, in alternating order; an alternative's figure is
its lowest median over the rounds. The last line says whether the chosen plan is within 5 %%
of the best one tried, or WARN when it is not (the exit status is 0 either way; the machine
may be busy: run again, with more --rounds).

options:
%s
%s
Here each alternative's repeats in each round count as a case, judged without the peak
check; before the last line, a WARN line says when the host was too busy for the choice of
the best to be trusted.

examples:
  gdn plan
  gdn plan --op backward --seq 64k --policy none
  gdn plan --op decode --decode-batch 64 --threads 1
  gdn plan --hk 16 --hv 64 --threads 1 --time
  gdn plan --op decode --hv 4 --hk 2 --time
)HELP";

namespace {

const std::vector<OptionSpec> kPlanOptions = {
    {"op", "OP", "forward (default), backward or decode (the decodes of a serving step)"},
    {"tokens", "T",
     "tokens per sequence (default 2048); with --op decode the tokens of each decode window "
     "(default 1; more is a speculative window)"},
    {"seq", "T", "the same as --tokens; accepts a k suffix (8k, 64k)"},
    {"seqs", "N", "sequences, packed back to back (default 1; forward and backward)"},
    {"decode-batch", "N", "decodes in the step (default 1; --op decode)"},
    {"hk", "HK", "query/key heads (default 16)"},
    {"hv", "HV", "value heads, a multiple of HK (default 32)"},
    {"dk", "DK", "key head dim, 1 to 256 (default 128)"},
    {"dv", "DV", "value head dim, 1 to 256 (default 128)"},
    {"chunk-size", "C", "tokens per chunk: 0 = the plan chooses (default 0), or 1 to 256"},
    {"threads", "N", "worker threads, 0 = all cores (default 0)"},
    {"isa", "ISA", "CPU variant: auto, generic, avx2, avx512 or avx512_bf16 (default auto)"},
    {"dtype", "T", "f32 or f64 (default f32)"},
    {"residuals", nullptr, "forward: keep chunk_states and t_inv (every sequence chunked)"},
    {"policy", "P",
     "backward: the residuals it starts from, all (chunk_states and t_inv; default), t_inv or "
     "none (it rebuilds the chunk states)"},
    {"time", nullptr, "time the chosen plan and each alternative tried"},
    {"repeats", "R", "--time: timed runs per alternative and round, after a warm-up (default 3)"},
    {"rounds", "R", "--time: rounds over all alternatives (default 2)"},
    {"help", nullptr, "show this help"},
};

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

std::string heads_text(std::int64_t heads) {
  return str(heads) + (heads == 1 ? " value head" : " value heads") + " per item";
}

void row(const char* name, const std::string& value, const std::string& why) {
  std::printf("  %-16s %-12s %s\n", name, value.c_str(), why.c_str());
}

void print_plan(const Plan& plan, const PlanProblem& p) {
  const MachineInfo& m = machine_info();
  std::printf(
      "machine: %s; %d cores; L1d %s and L2 %s per core, L3 %s shared by %d core%s (from %s)\n",
      cpu_model_name().c_str(), m.cores, bytes_text(m.l1d_bytes).c_str(),
      bytes_text(m.l2_bytes).c_str(), bytes_text(m.l3_bytes).c_str(), m.l3_sharing,
      m.l3_sharing == 1 ? "" : "s", m.source.c_str());
  std::printf("plan:\n");
  row("isa", cpu_isa_name(plan.isa), plan.isa_reason);
  row("chunk size", plan.op == PlanOp::decode ? "-" : str(plan.chunk_size), plan.chunk_reason);
  if (plan.op == PlanOp::decode) {
    row("value blocks", str(plan.vblocks), plan.vblocks_reason);
    row("work items", str(plan.items),
        plural(p.num_seqs, "decode", "decodes") + " x " +
            plural(p.hv, "value head", "value heads") + " x " +
            plural(plan.vblocks, "block", "blocks") + ": " + plan.items_reason);
  } else {
    row("heads per item", str(plan.heads_per_item), plan.items_reason);
    row("work items", str(plan.items),
        plan.op == PlanOp::forward
            ? plural(p.num_seqs, "sequence", "sequences") + " x " +
                  str(p.hv / plan.heads_per_item) + " groups of value heads"
            : plural(p.num_seqs, "sequence", "sequences") + " x " + str(p.hk) + " key heads");
  }
  row("threads", str(plan.threads), plan.threads_reason);
  if (plan.op == PlanOp::backward) {
    row("rebuild segment", plan.rebuild_segment == 0 ? "-" : str(plan.rebuild_segment),
        plan.segment_reason);
  }
  row("workspace", bytes_text(plan.workspace_bytes),
      std::string("per thread; L2 ") + bytes_text(m.l2_bytes) + " per core" +
          (plan.workspace_bytes <= m.l2_bytes ? " (fits)" : " (exceeds it)"));
}

// --- Timing -------------------------------------------------------------------------------------

void fill(Tensor& t, Random& rng, double lo, double hi) {
  if (t.dtype() == DType::f64) {
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = rng.uniform(lo, hi);
  } else {
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      t.data<float>()[i] = static_cast<float>(rng.uniform(lo, hi));
    }
  }
}

Tensor random_tensor(DType dtype, std::initializer_list<std::int64_t> shape, Random& rng, double lo,
                     double hi) {
  Tensor t(dtype, shape);
  fill(t, rng, lo, hi);
  return t;
}

std::vector<std::byte> bytes_of(std::initializer_list<const Tensor*> tensors) {
  std::vector<std::byte> out;
  for (const Tensor* t : tensors) {
    if (!t->present()) continue;
    const auto* b = static_cast<const std::byte*>(t->raw());
    out.insert(out.end(), b, b + t->bytes());
  }
  return out;
}

struct Alternative {
  std::string name;
  int chunk = 0;
  bool chosen = false;
  Plan library;                 // chosen: the plan the library makes for this call, nothing forced
  std::function<void()> run;    // one call of the op under this plan
  std::function<void()> reset;  // state the op updates in place, restored
  std::function<std::vector<std::byte>()> bits;  // its results, for the bit-identity check
  Timing best;
  bool noisy = false;  // a round of it was (bench_noise.h)
};

// The forward's inputs at the problem's shape, packed (seqs x tokens).
struct CoreData {
  Tensor q, k, v, g, beta, cu, d_o;
  ForwardInputs inputs() const {
    return {q.view(), k.view(), v.view(), g.view(), beta.view(), TensorView{}, cu.view()};
  }
};

CoreData make_core_data(const PlanProblem& p, std::int64_t seqs, bool backward) {
  Random rng(20261202);
  const std::int64_t t = p.tokens * seqs;
  CoreData d;
  d.q = random_tensor(p.dtype, {t, p.hk, p.dk}, rng, -1, 1);
  d.k = random_tensor(p.dtype, {t, p.hk, p.dk}, rng, -1, 1);
  d.v = random_tensor(p.dtype, {t, p.hv, p.dv}, rng, -1, 1);
  d.g = random_tensor(p.dtype, {t, p.hv}, rng, -0.2, -0.01);
  d.beta = random_tensor(p.dtype, {t, p.hv}, rng, 0.1, 0.9);
  if (backward) d.d_o = random_tensor(p.dtype, {t, p.hv, p.dv}, rng, -1, 1);
  if (seqs > 1) {
    d.cu = Tensor(DType::i64, {seqs + 1});
    for (std::int64_t s = 0; s <= seqs; ++s) d.cu.data<std::int64_t>()[s] = s * p.tokens;
  }
  return d;
}

// Everything one chunk size's alternatives share: options, outputs, the validated problem.
struct CoreCase {
  ForwardOptions options;
  Tensor o, final_state, chunk_states, t_inv;
  detail::ValidatedForward forward;
  ForwardResult residuals;
  Tensor dq, dk, dv, dg, dbeta, dh0;
  detail::ValidatedBackward backward;
};

void add_forward(const CoreData& d, const PlanProblem& p, const ForwardOptions& base, int chunk,
                 const Plan& chosen, std::vector<std::unique_ptr<CoreCase>>* keep,
                 std::vector<Alternative>* out) {
  auto c = std::make_unique<CoreCase>();
  c->options = base;
  c->options.chunk_size = chunk;
  const ForwardInputs in = d.inputs();
  const ForwardShape shape = forward_shape(in, c->options);
  c->o = Tensor(shape.dtype, shape.o_rank(), shape.o_sizes());
  c->final_state = Tensor(shape.compute_dtype, 4, shape.state_sizes());
  if (p.residuals) {
    c->chunk_states = Tensor(shape.compute_dtype, 4, shape.chunk_states_sizes());
    c->t_inv = Tensor(shape.compute_dtype, 4, shape.t_inv_sizes());
  }
  detail::validate_forward(in,
                           {c->o.mutable_view(), c->final_state.mutable_view(),
                            c->chunk_states.mutable_view(), c->t_inv.mutable_view()},
                           c->options, detail::OutputPrecision::native, &c->forward);
  CoreCase* cc = c.get();
  for (std::int64_t heads : cpu::heads_candidates(p.hk, p.hv)) {
    const Plan plan =
        cpu::make_plan(cpu::plan_problem(cc->forward.problem),
                       cpu::plan_options(cc->forward.problem, base.isa), cpu::PlanForce{heads, 0});
    Alternative a;
    a.name = "C = " + str(chunk) + ", " + heads_text(heads);
    a.chunk = chunk;
    a.chosen = chunk == chosen.chunk_size && heads == chosen.heads_per_item;
    if (a.chosen) {
      a.library = cpu::make_plan(cpu::plan_problem(cc->forward.problem),
                                 cpu::plan_options(cc->forward.problem, base.isa), {});
    }
    a.run = [cc, plan] { cpu::forward(cc->forward.problem, plan); };
    a.bits = [cc] { return bytes_of({&cc->o, &cc->final_state, &cc->chunk_states, &cc->t_inv}); };
    out->push_back(std::move(a));
  }
  keep->push_back(std::move(c));
}

void add_backward(const CoreData& d, const ForwardOptions& base, const std::string& policy,
                  int chunk, const Plan& chosen, std::vector<std::unique_ptr<CoreCase>>* keep,
                  std::vector<Alternative>* out) {
  auto c = std::make_unique<CoreCase>();
  c->options = base;
  c->options.chunk_size = chunk;
  const ForwardInputs in = d.inputs();
  const Residuals kept = policy == "all"     ? Residuals::all
                         : policy == "t_inv" ? Residuals::t_inv
                                             : Residuals::none;
  c->residuals = chunk_gated_delta_rule_fwd(in, c->options, kept);
  BackwardInputs bin = BackwardInputs::from(in);
  bin.d_o = d.d_o.view();
  bin.chunk_states = c->residuals.chunk_states.view();
  bin.t_inv = c->residuals.t_inv.view();
  const ForwardShape shape = forward_shape(in, c->options);
  c->dq = Tensor(shape.dtype, d.q.rank(), d.q.sizes());
  c->dk = Tensor(shape.dtype, d.k.rank(), d.k.sizes());
  c->dv = Tensor(shape.dtype, d.v.rank(), d.v.sizes());
  c->dg = Tensor(shape.compute_dtype, d.g.rank(), d.g.sizes());
  c->dbeta = Tensor(shape.compute_dtype, d.beta.rank(), d.beta.sizes());
  c->dh0 = Tensor(shape.compute_dtype, 4, shape.state_sizes());
  detail::validate_backward(bin,
                            {c->dq.mutable_view(), c->dk.mutable_view(), c->dv.mutable_view(),
                             c->dg.mutable_view(), c->dbeta.mutable_view(), c->dh0.mutable_view()},
                            c->options, detail::OutputPrecision::native, &c->backward);
  CoreCase* cc = c.get();
  const Plan plan = cpu::make_plan(cpu::plan_problem(cc->backward.problem),
                                   cpu::plan_options(cc->backward.problem.fwd, base.isa), {});
  Alternative a;
  a.name = "C = " + str(chunk) + ", " + heads_text(plan.heads_per_item) +
           (plan.rebuild_segment > 0 ? ", segment " + str(plan.rebuild_segment) : "");
  a.chunk = chunk;
  a.chosen = chunk == chosen.chunk_size;
  a.library = plan;
  a.run = [cc, plan] { cpu::backward(cc->backward.problem, plan); };
  a.bits = [cc] { return bytes_of({&cc->dq, &cc->dk, &cc->dv, &cc->dg, &cc->dbeta, &cc->dh0}); };
  out->push_back(std::move(a));
  keep->push_back(std::move(c));
}

// A decode-only serving step: `batch` windows of p.tokens tokens, each with a history.
struct DecodeData {
  StepOptions options;
  Tensor qkv, a, b, conv_weight, A_log, dt_bias;
  Tensor query_start_loc, state_indices, seq_lens, distribution;
  Tensor conv_pool, state_pool, conv_start, state_start, out;
  StepInputs inputs() const {
    return {qkv.view(),
            a.view(),
            b.view(),
            conv_weight.view(),
            TensorView{},
            A_log.view(),
            dt_bias.view(),
            query_start_loc.view(),
            state_indices.view(),
            seq_lens.view(),
            distribution.view(),
            TensorView{},
            TensorView{}};
  }
  StatePools pools() { return {conv_pool.mutable_view(), state_pool.mutable_view()}; }
};

std::unique_ptr<DecodeData> make_decode_data(const PlanProblem& p, const ForwardOptions& base) {
  constexpr std::int64_t kTaps = 4, kHistory = 4096;
  auto d = std::make_unique<DecodeData>();
  d->options.hk = p.hk;
  d->options.hv = p.hv;
  d->options.dk = p.dk;
  d->options.dv = p.dv;
  d->options.threads = base.threads;
  d->options.isa = base.isa;
  d->options.num_spec = p.tokens - 1;
  const std::int64_t n = p.num_seqs, w = p.tokens, t = n * w;
  const std::int64_t channels = 2 * p.hk * p.dk + p.hv * p.dv, slots = t + 1;
  Random rng(20261202);
  d->qkv = random_tensor(p.dtype, {t, channels}, rng, -1, 1);
  d->a = random_tensor(p.dtype, {t, p.hv}, rng, -1, 1);
  d->b = random_tensor(p.dtype, {t, p.hv}, rng, -1, 1);
  d->conv_weight = random_tensor(p.dtype, {channels, kTaps}, rng, -0.5, 0.5);
  d->A_log = random_tensor(p.dtype, {p.hv}, rng, -1, 0.5);
  d->dt_bias = random_tensor(p.dtype, {p.hv}, rng, -2, 0);
  d->conv_start = random_tensor(p.dtype, {slots, kTaps - 1, channels}, rng, -1, 1);
  d->state_start = random_tensor(p.dtype, {slots, p.hv, p.dk, p.dv}, rng, -0.05, 0.05);
  d->conv_pool = Tensor(p.dtype, {slots, kTaps - 1, channels});
  d->state_pool = Tensor(p.dtype, {slots, p.hv, p.dk, p.dv});
  d->out = Tensor(p.dtype, {t, p.hv * p.dv});
  d->query_start_loc = Tensor(DType::i64, {n + 1});
  d->state_indices = Tensor(DType::i64, {n});
  d->seq_lens = Tensor(DType::i64, {n});
  d->distribution = Tensor(DType::i64, {3});
  for (std::int64_t s = 0; s <= n; ++s) d->query_start_loc.data<std::int64_t>()[s] = s * w;
  for (std::int64_t s = 0; s < n; ++s) {
    d->state_indices.data<std::int64_t>()[s] = 1 + s * w;  // slots 1 + s w .. (s + 1) w
    d->seq_lens.data<std::int64_t>()[s] = kHistory + w;
  }
  for (int i = 0; i < 3; ++i) d->distribution.data<std::int64_t>()[i] = n;
  return d;
}

void add_decode(DecodeData* d, const Plan& chosen, std::vector<Alternative>* out) {
  detail::ValidatedStep v;
  detail::validate_step(d->inputs(), d->pools(), d->out.mutable_view(), d->options,
                        detail::OutputPrecision::native, &v);
  const Plan library = detail::decode_plan(d->options, v, {});
  for (std::int64_t vblocks : cpu::vblocks_candidates(d->options.dv)) {
    Alternative a;
    a.name = str(vblocks) + (vblocks == 1 ? " block" : " blocks") + " of value columns";
    a.chosen = vblocks == chosen.vblocks;
    a.library = library;
    a.run = [d, vblocks] {
      detail::fused_gdn_step(d->inputs(), d->pools(), d->out.mutable_view(), d->options,
                             cpu::PlanForce{0, vblocks});
    };
    a.reset = [d] {
      std::memcpy(d->conv_pool.raw(), d->conv_start.raw(), d->conv_pool.bytes());
      std::memcpy(d->state_pool.raw(), d->state_start.raw(), d->state_pool.bytes());
    };
    a.bits = [d] { return bytes_of({&d->out, &d->conv_pool, &d->state_pool}); };
    out->push_back(std::move(a));
  }
}

bool same_choices(const Plan& a, const Plan& b) {
  return a.op == b.op && a.isa == b.isa && a.chunk_size == b.chunk_size &&
         a.heads_per_item == b.heads_per_item && a.items == b.items && a.threads == b.threads &&
         a.rebuild_segment == b.rebuild_segment && a.vblocks == b.vblocks &&
         a.workspace_bytes == b.workspace_bytes;
}

// Checks that the library runs the printed plan and that alternatives of one chunk size agree
// bit for bit, then times them; 1 when a check fails.
int time_alternatives(std::vector<Alternative>& alts, const Plan& printed, int repeats,
                      int rounds) {
  std::printf(
      "\ntiming: %d round%s x %d run%s per alternative after a warm-up; figure: the "
      "lowest median of the rounds\n",
      rounds, rounds == 1 ? "" : "s", repeats, repeats == 1 ? "" : "s");
  for (const Alternative& a : alts) {
    if (a.chosen && !same_choices(a.library, printed)) {
      std::fprintf(stderr,
                   "gdn plan: check failed: the library plans otherwise for this call "
                   "(%lld heads per item, %lld items, %d threads, chunk %d, vblocks %lld)\n",
                   static_cast<long long>(a.library.heads_per_item),
                   static_cast<long long>(a.library.items), a.library.threads, a.library.chunk_size,
                   static_cast<long long>(a.library.vblocks));
      return 1;
    }
  }
  std::printf("check: the library runs the plan printed above for this call: yes\n");
  std::vector<std::vector<std::byte>> first_bits;
  std::vector<int> first_chunk;
  for (Alternative& a : alts) {
    if (a.reset) a.reset();
    a.run();
    std::vector<std::byte> bits = a.bits();
    bool found = false;
    for (std::size_t i = 0; i < first_bits.size(); ++i) {
      if (first_chunk[i] != a.chunk) continue;
      found = true;
      if (bits != first_bits[i]) {
        std::fprintf(stderr,
                     "gdn plan: check failed: %s does not give the bit-identical results "
                     "of the other alternatives of chunk size %d\n",
                     a.name.c_str(), a.chunk);
        return 1;
      }
    }
    if (!found) {
      first_bits.push_back(std::move(bits));
      first_chunk.push_back(a.chunk);
    }
  }
  std::printf("check: the alternatives%s give bit-identical results: yes\n",
              alts.front().chunk > 0 ? " of each chunk size" : "");
  NoiseWatch noise(CpuIsa::automatic);
  noise.start(alts.front().library.threads, 0);  // no peak here
  for (int round = 0; round < rounds; ++round) {
    for (std::size_t j = 0; j < alts.size(); ++j) {
      Alternative& a = alts[round % 2 == 0 ? j : alts.size() - 1 - j];
      a.run();  // warm-up
      const Timing t = time_runs(a.run, repeats, a.name);
      if (round == 0 || t.median_ms < a.best.median_ms) a.best = t;
      a.noisy = noise.judge(a.name + ", round " + std::to_string(round + 1), t).noisy || a.noisy;
    }
  }
  const Alternative* best = &alts.front();
  const Alternative* chosen = nullptr;
  for (const Alternative& a : alts) {
    if (a.best.median_ms < best->best.median_ms) best = &a;
    if (a.chosen) chosen = &a;
  }
  std::printf("  %-46s %10s %24s %8s\n", "alternative", "median ms", "(min - max)", "x best");
  for (const Alternative& a : alts) {
    char range[64];
    std::snprintf(range, sizeof range, "(%.3f - %.3f)", a.best.min_ms, a.best.max_ms);
    std::printf("  %-46s %10.3f %24s %7.2fx%s%s\n", a.name.c_str(), a.best.median_ms, range,
                a.best.median_ms / best->best.median_ms, a.chosen ? "  <- chosen" : "",
                a.noisy ? "  noisy" : "");
  }
  noise.warn(stdout, "gdn plan --time");
  if (chosen == nullptr) {
    std::printf("WARN: the chosen plan is not among the alternatives tried\n");
    return 0;
  }
  const double over = 100.0 * (chosen->best.median_ms / best->best.median_ms - 1.0);
  if (chosen == best) {
    std::printf("chosen plan (%s): %.3f ms, the best tried; within 5 %% of the best tried: yes\n",
                chosen->name.c_str(), chosen->best.median_ms);
  } else if (over <= 5.0) {
    std::printf(
        "chosen plan (%s): %.3f ms, +%.1f %% over the best tried (%s); within 5 %% of "
        "the best tried: yes\n",
        chosen->name.c_str(), chosen->best.median_ms, over, best->name.c_str());
  } else {
    std::printf(
        "WARN: the chosen plan (%s, %.3f ms) is %.1f %% slower than the best tried (%s, "
        "%.3f ms)\n",
        chosen->name.c_str(), chosen->best.median_ms, over, best->name.c_str(),
        best->best.median_ms);
  }
  return 0;
}

}  // namespace

int plan_command(int argc, char** argv) {
  const Args args(kPlanOptions, argc, argv, 2);
  if (args.flag("help")) {
    std::printf(kPlanHelp, describe_options(kPlanOptions).c_str(), noise_help().c_str());
    return 0;
  }
  const std::string op = args.choice("op", "forward", {"forward", "backward", "decode"});
  const bool decode = op == "decode";
  PlanProblem p;
  p.op = decode ? PlanOp::decode : op == "backward" ? PlanOp::backward : PlanOp::forward;
  p.tokens = parse_tokens(args, decode ? 1 : 2048);
  if (decode && args.has("seqs")) {
    throw UsageError("option '--seqs': not with --op decode (the decodes are --decode-batch)");
  }
  if (!decode && args.has("decode-batch")) {
    throw UsageError("option '--decode-batch': only with --op decode, given --op " + op);
  }
  if (decode && p.tokens > 64) {
    throw UsageError("option '--tokens': a decode window of 1 to 64 tokens, given " +
                     str(p.tokens));
  }
  p.num_seqs = decode ? args.integer("decode-batch", 1, 1, 4096) : args.integer("seqs", 1, 1, 4096);
  p.hk = args.integer("hk", 16, 1, 1024);
  p.hv = args.integer("hv", 32, 1, 4096);
  p.dk = args.integer("dk", 128, 1, 256);
  p.dv = args.integer("dv", 128, 1, 256);
  if (p.hv % p.hk != 0) {
    throw UsageError("option '--hv': expected a multiple of --hk = " + str(p.hk) + ", given " +
                     str(p.hv));
  }
  p.dtype = args.choice("dtype", "f32", {"f32", "f64"}) == "f64" ? DType::f64 : DType::f32;
  if (args.flag("residuals") && p.op != PlanOp::forward) {
    throw UsageError("option '--residuals': only with --op forward (the backward takes --policy)");
  }
  if (args.has("policy") && p.op != PlanOp::backward) {
    throw UsageError("option '--policy': only with --op backward, given --op " + op);
  }
  const std::string policy = args.choice("policy", "all", {"all", "t_inv", "none"});
  p.residuals = p.op == PlanOp::forward ? args.flag("residuals") : policy == "all";
  ForwardOptions options;
  options.chunk_size = static_cast<int>(args.integer("chunk-size", 0, 0, 256));
  options.threads = static_cast<int>(args.integer("threads", 0, 0, 1024));
  options.isa = isa_option(args);
  options.use_qk_l2norm = true;
  const int repeats = static_cast<int>(args.integer("repeats", 3, 1, 1000));
  const int rounds = static_cast<int>(args.integer("rounds", 2, 1, 100));
  if (decode && options.chunk_size != 0) {
    throw UsageError("option '--chunk-size': not with --op decode (a decode has no chunks)");
  }

  const Plan plan = make_plan(p, options);
  std::printf("gdn plan: %s, Hk=%lld Hv=%lld Dk=%lld Dv=%lld, %lld x %lld %s, %s%s\n", op.c_str(),
              static_cast<long long>(p.hk), static_cast<long long>(p.hv),
              static_cast<long long>(p.dk), static_cast<long long>(p.dv),
              static_cast<long long>(p.num_seqs), static_cast<long long>(p.tokens),
              decode ? "tokens per decode" : "tokens", dtype_name(p.dtype),
              p.op == PlanOp::forward    ? (p.residuals ? ", residuals kept" : "")
              : p.op == PlanOp::backward ? (", policy " + policy).c_str()
                                         : "");
  print_plan(plan, p);
  if (!args.flag("time")) return 0;

  std::vector<Alternative> alts;
  std::vector<std::unique_ptr<CoreCase>> cases;
  std::unique_ptr<CoreData> core;
  std::unique_ptr<DecodeData> step;
  std::vector<int> chunks;
  if (options.chunk_size != 0) {
    chunks.push_back(options.chunk_size);
  } else {
    for (int c : cpu::kChunkCandidates) chunks.push_back(c);
  }
  if (decode) {
    step = make_decode_data(p, options);
    add_decode(step.get(), plan, &alts);
  } else {
    core = std::make_unique<CoreData>(make_core_data(p, p.num_seqs, p.op == PlanOp::backward));
    for (int c : chunks) {
      if (p.op == PlanOp::forward) {
        add_forward(*core, p, options, c, plan, &cases, &alts);
      } else {
        add_backward(*core, options, policy, c, plan, &cases, &alts);
      }
    }
  }
  return time_alternatives(alts, plan, repeats, rounds);
}

}  // namespace gdn::cli
