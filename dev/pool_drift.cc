// pool_drift.cc: how far a bf16 state pool drifts from a float32 one over many decode steps
// (docs/numerics.md, "bf16 state pools"). Lab program, outside the test suite (64k steps take
// about a minute); build with -DGDN_BUILD_DEV=ON and run build/.../dev/pool_drift [--steps
// 1000,8000,65536] [--seqs 2] [--seed 1] [--slow-gates].
//
// N sequences decode one token per step through gdn::fused_gdn_step, the same inputs four
// ways: float64 inputs and pools (the CPU op in float64, within 1e-12 of the reference:
// tests/cpu/step_test.cc), and float32 inputs over float32 pools, over a bf16 recurrent pool
// (float32 conv pool), and over two bf16 pools. Shape Hk = 2, Hv = 4, Dk = Dv = 128, K = 4;
// qkv, a, b ~ N(0, 1), A_log = log U(1, 16), dt_bias = 0, conv weights ~ N(0, 1 / K), drawn
// afresh for every step. Those gates forget fast (alpha = e^g: median 0.006); --slow-gates sets
// dt_bias = log(e^dt - 1) with dt log-uniform in [0.001, 0.1] (Mamba's and Qwen3-Next's
// initialisation), alpha median 0.93: a long memory, where rounding errors can add up. At
// each checkpoint n it prints the relative error (2-norm of the difference over the 2-norm of the
// float64 output) of the outputs of steps (n - 64, n], and of the recurrent states after step n.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gdn/gdn.h"

namespace {

constexpr std::int64_t kHk = 2, kHv = 4, kDk = 128, kDv = 128, kTaps = 4;
constexpr std::int64_t kChannels = 2 * kHk * kDk + kHv * kDv, kWidth = kHv * kDv;
constexpr std::int64_t kWindow = 64;  // the output steps each checkpoint's error covers

// One way of running the steps: its inputs' and pools' dtypes, its pools and its last outputs.
struct Run {
  const char* name;
  gdn::DType inputs, conv_dtype, rec_dtype;
  gdn::Tensor conv, rec, out;
};

// Sums of squares over a checkpoint's window.
struct Window {
  double ref = 0;                   // float64 outputs
  double f32_f64 = 0;               // float32 pools - float64
  double rec_f32 = 0, rec_f64 = 0;  // bf16 recurrent pool - float32 pools, - float64
  double both_f32 = 0;              // bf16 pools - float32 pools
};

double value(const gdn::Tensor& t, std::int64_t i) {
  switch (t.dtype()) {
    case gdn::DType::f64:
      return t.data<double>()[i];
    case gdn::DType::bf16: {
      const std::uint32_t bits =
          static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(t.raw())[i]) << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    default:
      return t.data<float>()[i];
  }
}

gdn::Tensor filled(gdn::DType dtype, std::initializer_list<std::int64_t> shape,
                   const std::vector<double>& values) {
  gdn::Tensor t(dtype, shape);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == gdn::DType::f64) {
      t.data<double>()[i] = values[static_cast<std::size_t>(i)];
    } else {
      t.data<float>()[i] = static_cast<float>(values[static_cast<std::size_t>(i)]);
    }
  }
  return t;
}

std::vector<std::int64_t> parse_list(const char* text) {
  std::vector<std::int64_t> values;
  std::string s(text);
  for (std::size_t at = 0; at <= s.size();) {
    const std::size_t comma = s.find(',', at);
    const std::string item =
        s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    values.push_back(std::strtoll(item.c_str(), nullptr, 10));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::int64_t> checkpoints = {1000, 8000, 65536};
  std::int64_t seqs = 2;
  unsigned seed = 1;
  bool slow = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--slow-gates") {
      slow = true;
      --i;
    } else if (flag != "--steps" && flag != "--seqs" && flag != "--seed") {
      std::fprintf(stderr,
                   "usage: pool_drift [--steps 1000,8000,65536] [--seqs 2] [--seed 1] "
                   "[--slow-gates]\n");
      return 2;
    } else if (i + 1 >= argc) {
      std::fprintf(stderr, "pool_drift: %s needs a value\n", argv[i]);
      return 2;
    } else if (flag == "--steps") {
      checkpoints = parse_list(argv[i + 1]);
    } else if (flag == "--seqs") {
      seqs = std::strtoll(argv[i + 1], nullptr, 10);
    } else {
      seed = static_cast<unsigned>(std::strtoul(argv[i + 1], nullptr, 10));
    }
  }
  using gdn::DType;
  const std::int64_t slots = seqs + 1;  // slot 0 is the null slot
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(1.0, 16.0);

  std::vector<double> weight(kChannels * kTaps), a_log(kHv), dt_bias(kHv, 0.0);
  for (double& w : weight) w = normal(rng) / std::sqrt(static_cast<double>(kTaps));
  for (double& x : a_log) x = std::log(uniform(rng));
  std::uniform_real_distribution<double> log_dt(std::log(0.001), std::log(0.1));
  if (slow) {
    for (double& x : dt_bias) x = std::log(std::expm1(std::exp(log_dt(rng))));
  }

  Run runs[] = {{"f64", DType::f64, DType::f64, DType::f64, {}, {}, {}},
                {"f32 pools", DType::f32, DType::f32, DType::f32, {}, {}, {}},
                {"bf16 recurrent pool", DType::f32, DType::f32, DType::bf16, {}, {}, {}},
                {"bf16 pools", DType::f32, DType::bf16, DType::bf16, {}, {}, {}}};
  for (Run& r : runs) {
    r.conv = gdn::Tensor(r.conv_dtype, {slots, kTaps - 1, kChannels});
    r.rec = gdn::Tensor(r.rec_dtype, {slots, kHv, kDk, kDv});
    std::memset(r.conv.raw(), 0, r.conv.bytes());
    std::memset(r.rec.raw(), 0, r.rec.bytes());
    r.out = gdn::Tensor(r.inputs, {seqs, kWidth});
  }
  std::vector<std::int64_t> qsl(static_cast<std::size_t>(seqs + 1)), slot(seqs), lens(seqs);
  const std::vector<std::int64_t> distribution = {seqs, seqs, seqs};
  for (std::int64_t s = 0; s <= seqs; ++s) qsl[static_cast<std::size_t>(s)] = s;
  for (std::int64_t s = 0; s < seqs; ++s) slot[static_cast<std::size_t>(s)] = s + 1;

  gdn::StepOptions options;
  options.hk = kHk;
  options.hv = kHv;
  options.dk = kDk;
  options.dv = kDv;
  std::printf(
      "| steps | out: f32 pools vs f64 | out: bf16 recurrent pool vs f32 pools | vs f64 "
      "| out: bf16 pools vs f32 pools | state: bf16 vs f32 pools |\n");
  std::printf("|---|---|---|---|---|---|\n");
  Window w;
  std::size_t next = 0;
  const std::int64_t last = checkpoints.back();
  std::vector<double> qkv(static_cast<std::size_t>(seqs * kChannels)), a(seqs * kHv), b(seqs * kHv);
  for (std::int64_t step = 1; step <= last; ++step) {
    for (double& x : qkv) x = normal(rng);
    for (double& x : a) x = normal(rng);
    for (double& x : b) x = normal(rng);
    for (std::int64_t s = 0; s < seqs; ++s) lens[static_cast<std::size_t>(s)] = step;
    for (Run& r : runs) {
      const gdn::Tensor tq = filled(r.inputs, {seqs, kChannels}, qkv);
      const gdn::Tensor ta = filled(r.inputs, {seqs, kHv}, a),
                        tb = filled(r.inputs, {seqs, kHv}, b);
      const gdn::Tensor tw = filled(r.inputs, {kChannels, kTaps}, weight);
      const gdn::Tensor tl = filled(r.inputs, {kHv}, a_log), td = filled(r.inputs, {kHv}, dt_bias);
      gdn::StepInputs in;
      in.qkv = tq.view();
      in.a = ta.view();
      in.b = tb.view();
      in.conv_weight = tw.view();
      in.A_log = tl.view();
      in.dt_bias = td.view();
      in.query_start_loc = gdn::TensorView(qsl.data(), {seqs + 1});
      in.state_indices = gdn::TensorView(slot.data(), {seqs});
      in.seq_lens = gdn::TensorView(lens.data(), {seqs});
      in.distribution = gdn::TensorView(distribution.data(), {3});
      gdn::fused_gdn_step(in, {r.conv.mutable_view(), r.rec.mutable_view()}, r.out.mutable_view(),
                          options);
    }
    const std::int64_t window_start = checkpoints[next] - kWindow;
    if (step > window_start) {
      for (std::int64_t i = 0; i < seqs * kWidth; ++i) {
        const double ref = value(runs[0].out, i), f32 = value(runs[1].out, i);
        const double rec = value(runs[2].out, i), both = value(runs[3].out, i);
        w.ref += ref * ref;
        w.f32_f64 += (f32 - ref) * (f32 - ref);
        w.rec_f32 += (rec - f32) * (rec - f32);
        w.rec_f64 += (rec - ref) * (rec - ref);
        w.both_f32 += (both - f32) * (both - f32);
      }
    }
    if (step == checkpoints[next]) {
      double state_diff2 = 0, state2 = 0;
      for (std::int64_t i = 0; i < runs[1].rec.numel(); ++i) {
        if (i < kHv * kDk * kDv) continue;  // the null slot
        state2 += std::pow(value(runs[1].rec, i), 2);
        state_diff2 += std::pow(value(runs[2].rec, i) - value(runs[1].rec, i), 2);
      }
      std::printf("| %lld | %.2e | %.2e | %.2e | %.2e | %.2e |\n", static_cast<long long>(step),
                  std::sqrt(w.f32_f64 / w.ref), std::sqrt(w.rec_f32 / w.ref),
                  std::sqrt(w.rec_f64 / w.ref), std::sqrt(w.both_f32 / w.ref),
                  std::sqrt(state_diff2 / state2));
      std::fflush(stdout);
      w = Window{};
      if (++next == checkpoints.size()) break;
    }
  }
  return 0;
}
