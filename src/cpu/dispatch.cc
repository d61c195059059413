// dispatch.cc: which ISA variant runs, and the helpers every variant shares.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/workspace.h"
#include "gdn/error.h"
#include "gdn/runtime.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace gdn {
namespace cpu {

#ifndef GDN_HAVE_AVX2
const KernelTable* kernels_avx2() { return nullptr; }
#endif
#ifndef GDN_HAVE_AVX512
const KernelTable* kernels_avx512() { return nullptr; }
#endif
#ifndef GDN_HAVE_AVX512_BF16
const KernelTable* kernels_avx512_bf16() { return nullptr; }
#endif

namespace {

#if defined(__x86_64__) || defined(__i386__)
// CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports does not know "f16c"). Read
// once: every call resolves its variant (plan, conv, decode: three times a step), and in a
// virtual machine CPUID traps to the hypervisor. On the 2-vCPU development VM (AMD EPYC) each
// CPUID cost about 7 us, 14 % of a 0.16 ms one-token decode step before it was cached.
bool has_f16c() {
  static const bool value = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
  }();
  return value;
}
#endif

// The first CPU feature `isa` needs that this CPU lacks (as /proc/cpuinfo spells it), or null.
const char* missing_feature(CpuIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  switch (isa) {
    case CpuIsa::avx2:
      if (!__builtin_cpu_supports("avx2")) return "avx2";
      if (!__builtin_cpu_supports("fma")) return "fma";
      if (!has_f16c()) return "f16c";
      return nullptr;
    case CpuIsa::avx512_bf16:
      if (const char* base = missing_feature(CpuIsa::avx512)) return base;
      if (!__builtin_cpu_supports("avx512bf16")) return "avx512_bf16";
      return nullptr;
    case CpuIsa::avx512:
      if (!__builtin_cpu_supports("avx512f")) return "avx512f";
      if (!__builtin_cpu_supports("avx512bw")) return "avx512bw";
      if (!__builtin_cpu_supports("avx512dq")) return "avx512dq";
      if (!__builtin_cpu_supports("avx512vl")) return "avx512vl";
      if (!has_f16c()) return "f16c";
      return nullptr;
    default:
      return nullptr;
  }
#else
  return isa == CpuIsa::generic || isa == CpuIsa::automatic ? nullptr : "x86-64";
#endif
}

}  // namespace

// Whether a 512-bit vdpbf16ps (two products per float32 lane) issues as often as a 512-bit FMA,
// so that bf16 operands can double the products' rate. Measured with `gdn bench --matmul
// both`, one thread, Qwen3-Next shape, 8192 tokens: AMD EPYC Zen 4, vdpbf16ps peak 227.5
// GFLOP/s against fp32 FMA 114.9, forward with bf16 operands 1.35x faster than float32 (the
// avx512 variant's emulation: slower than float32); Intel Xeon (family 6 model 207, Emerald
// Rapids, AMX not exposed), vdpbf16ps 85.0 against fp32 FMA 173.6 (it issues half as often as
// an FMA), forward 1.87x slower than float32 on it against 1.23x slower with the emulation.
// The vendor decides, not a timing taken at run time, so that the variant (and so the results'
// bits) does not depend on how busy the machine was. GDN_CPU_ISA / options.isa still force it.
bool bf16_dot_runs_at_full_rate() {
#if defined(__x86_64__) || defined(__i386__)
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

namespace {

const KernelTable* compiled_table(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::generic:
      return kernels_generic();
    case CpuIsa::avx2:
      return kernels_avx2();
    case CpuIsa::avx512:
      return kernels_avx512();
    case CpuIsa::avx512_bf16:
      return kernels_avx512_bf16();
    case CpuIsa::automatic:
      return nullptr;
  }
  return nullptr;
}

// $GDN_CPU_ISA, read once; automatic when unset or empty.
CpuIsa environment_isa() {
  static const CpuIsa isa = [] {
    const char* value = std::getenv("GDN_CPU_ISA");
    if (value == nullptr || *value == '\0' || std::strcmp(value, "automatic") == 0) {
      return CpuIsa::automatic;
    }
    for (CpuIsa candidate : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16}) {
      if (std::strcmp(value, cpu_isa_name(candidate)) == 0) return candidate;
    }
    throw RuntimeError(std::string("environment variable GDN_CPU_ISA: expected automatic, "
                                   "generic, avx2, avx512 or avx512_bf16, given '") +
                       value + "'");
  }();
  return isa;
}

}  // namespace

const KernelTable& kernel_table(CpuIsa isa) {
  const KernelTable* table = compiled_table(resolve_cpu_isa(isa));
  if (table == nullptr) throw RuntimeError("no CPU kernels for the requested ISA");
  return *table;
}

std::size_t forward_workspace_bytes(const detail::ForwardProblem& p, std::int64_t heads) {
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(p.shape.compute_dtype));
  const std::int64_t chunked =
      chunked_layout(p.shape.dk, p.shape.dv, p.chunk_size, heads).total +
      (p.bf16_operands ? bf16_key_words(p.shape.dk, p.shape.dv, p.chunk_size).end : 0);
  const std::int64_t recurrent = recurrent_layout(p.shape.dk, p.shape.dv).total;
  // The fused layer op's conv rows come after either (workspace.h: conv_rows_elements).
  const std::int64_t conv =
      p.conv != nullptr ? conv_rows_elements(p.conv->taps, p.shape.dk, p.shape.dv) : 0;
  return static_cast<std::size_t>(((chunked > recurrent ? chunked : recurrent) + conv) * elem);
}

std::size_t backward_workspace_bytes(const detail::BackwardProblem& p, std::int64_t heads,
                                     std::int64_t chunks, std::int64_t segment) {
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(p.fwd.shape.compute_dtype));
  const std::int64_t slots = segment == 0 ? 0 : (chunks + segment - 1) / segment + segment;
  const std::int64_t scratch =
      p.fwd.bf16_operands ? bf16_scratch_elements(p.fwd.shape.dk, p.fwd.shape.dv, p.fwd.chunk_size)
                          : 0;
  return static_cast<std::size_t>(
      (backward_layout(p.fwd.shape.dk, p.fwd.shape.dv, p.fwd.chunk_size, heads, slots).total +
       scratch) *
      elem);
}

std::size_t conv_workspace_bytes(const detail::ConvProblem& p, bool backward) {
  return static_cast<std::size_t>(conv_workspace_elements(p.taps, p.cpad, backward)) *
         dtype_size(p.dtype);
}

std::int64_t conv_partial_elements(const detail::ConvProblem& p) { return (p.taps + 1) * p.cpad; }

std::size_t decode_workspace_bytes(const detail::DecodeProblem& p) {
  // q and k [Dk], u, ks and qs [Dv] (src/cpu/decode-inl.h), padded; for a bf16 pool, its
  // widened block [Dk][Dv] at most and v in pair order [Dv].
  const std::int64_t widened = p.state_dtype == p.dtype ? 0 : (p.dk + 1) * padded(p.dv);
  return static_cast<std::size_t>(2 * padded(p.dk) + 3 * padded(p.dv) + widened) *
         dtype_size(p.dtype);
}

namespace {

// The best of a few short runs of `loop` on `threads` threads, in GFLOP/s.
double measure_peak(float (*loop)(std::int64_t), std::int64_t flops_per_round, int threads,
                    double seconds) {
  if (threads < 1) threads = default_threads();
  constexpr int kTrials = 5;
  // About seconds / kTrials per trial at ~4 G rounds/s; the best trial counts.
  const auto iterations = static_cast<std::int64_t>(seconds / kTrials * 4e9 / 8);
  double best = 0;
  volatile float sink = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const auto start = std::chrono::steady_clock::now();
    // Every thread must run at once (a peak is all cores busy), so these are plain threads
    // started per trial, not the call pool, whose caller would take every round alone when a
    // helper is late.
    std::vector<float> values(static_cast<std::size_t>(threads), 0.0f);
    std::vector<std::thread> others;
    for (int t = 1; t < threads; ++t) {
      others.emplace_back([&values, t, loop, iterations] {
        values[static_cast<std::size_t>(t)] = loop(iterations);
      });
    }
    values[0] = loop(iterations);
    for (std::thread& other : others) other.join();
    for (const float value : values) sink = sink + value;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double gflops =
        static_cast<double>(iterations) * flops_per_round * threads / elapsed * 1e-9;
    if (gflops > best) best = gflops;
  }
  return best;
}

}  // namespace

double measure_fma_peak_gflops(CpuIsa isa, int threads, double seconds) {
  const KernelTable& table = kernel_table(isa);
  return measure_peak(table.fma_peak_loop, table.fma_flops_per_round, threads, seconds);
}

double measure_bf16_dot_peak_gflops(CpuIsa isa, int threads, double seconds) {
  const KernelTable& table = kernel_table(isa);
  if (table.bf16_dot_peak_loop == nullptr) return 0;
  return measure_peak(table.bf16_dot_peak_loop, table.bf16_dot_flops_per_round, threads, seconds);
}

}  // namespace cpu

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::automatic:
      return "automatic";
    case CpuIsa::generic:
      return "generic";
    case CpuIsa::avx2:
      return "avx2";
    case CpuIsa::avx512:
      return "avx512";
    case CpuIsa::avx512_bf16:
      return "avx512_bf16";
  }
  return "unknown";
}

bool cpu_isa_available(CpuIsa isa) {
  if (isa == CpuIsa::automatic) return true;
  return cpu::compiled_table(isa) != nullptr && cpu::missing_feature(isa) == nullptr;
}

const char* cpu_isa_unavailable_reason(CpuIsa isa) {
  if (isa == CpuIsa::automatic) return nullptr;
  if (cpu::compiled_table(isa) == nullptr) return "not compiled into this build";
  if (const char* feature = cpu::missing_feature(isa)) {
    static thread_local std::string reason;
    reason = std::string("this CPU lacks ") + feature;
    return reason.c_str();
  }
  return nullptr;
}

CpuIsa resolve_cpu_isa(CpuIsa requested) {
  const char* origin = "requested";
  if (requested == CpuIsa::automatic) {
    requested = cpu::environment_isa();
    origin = "named by GDN_CPU_ISA";
  }
  if (requested == CpuIsa::automatic) {
    if (cpu_isa_available(CpuIsa::avx512_bf16) && cpu::bf16_dot_runs_at_full_rate()) {
      return CpuIsa::avx512_bf16;
    }
    for (CpuIsa best : {CpuIsa::avx512, CpuIsa::avx2}) {
      if (cpu_isa_available(best)) return best;
    }
    return CpuIsa::generic;
  }
  if (!cpu_isa_available(requested)) {
    throw RuntimeError(std::string("CPU ISA '") + cpu_isa_name(requested) + "' " + origin +
                       " is not available: " + cpu_isa_unavailable_reason(requested));
  }
  return requested;
}

}  // namespace gdn
