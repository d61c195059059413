// gdn/runtime.h: what this build contains and which CPU code path a call will take.
#pragma once

#include <cstdint>

namespace gdn {

inline constexpr const char* kVersion = "0.1.0";

// The instruction-set variants of the CPU kernels. Every variant compiled into the library
// answers to the same float64 reference; results are bit-identical across thread counts for
// one variant, not across variants (FMA contraction and vector width differ).
enum class CpuIsa : std::uint8_t {
  automatic,    // the best variant this CPU supports, or the one named by $GDN_CPU_ISA
  generic,      // portable C++ with 16-byte vector extensions: runs anywhere
  avx2,         // x86-64 AVX2 + FMA + F16C
  avx512,       // x86-64 AVX-512 F/BW/DQ/VL + F16C
  avx512_bf16,  // avx512 + AVX512_BF16: bf16-operand products (MatmulPrecision::bf16) on
                // vdpbf16ps; every other kernel is avx512's. `automatic` takes it only where
                // vdpbf16ps issues as often as an FMA (AMD); on an Intel Xeon it issues half as
                // often, and automatic takes avx512 (its emulation is faster there)
};

// "automatic", "generic", "avx2", "avx512", "avx512_bf16".
const char* cpu_isa_name(CpuIsa isa);

// True when the variant is compiled into this library and this CPU can run it.
// `automatic` is always available.
bool cpu_isa_available(CpuIsa isa);

// Why the variant is unavailable: null when available, else "not compiled into this build" or
// "this CPU lacks <feature>" naming the first missing CPU feature as /proc/cpuinfo spells it
// (e.g. "avx512_bf16"). The text lives until the calling thread's next call.
const char* cpu_isa_unavailable_reason(CpuIsa isa);

// The variant a call with `requested` runs. `automatic` resolves to the environment variable
// GDN_CPU_ISA when it is set (to generic, avx2, avx512 or avx512_bf16), else to the best
// available variant (avx512_bf16 on AMD only, see above; then avx512, avx2, generic).
// Throws gdn::RuntimeError when the requested (or environment-named) variant is unavailable.
CpuIsa resolve_cpu_isa(CpuIsa requested);

// Threads a call with `threads = 0` uses: the first number of OMP_NUM_THREADS when it is set
// (the variable kept the meaning it had when the library ran on OpenMP), else the CPUs this
// process may run on (its affinity mask), at most 1024; 1 in a build with GDN_THREADS=OFF.
// gdn/threads.h says where the threads come from.
int default_threads();

// False in a build configured with GDN_THREADS=OFF, where every call runs on its caller alone.
bool built_with_threads();

// True when the environment variable GDN_CHECK_FINITE was "1" when the library first read it
// (once per process): every call then runs in check mode (gdn/error.h). A binding that donates
// a caller's buffers asks this to keep them in check mode, where a call may fail after running.
bool check_finite_from_environment();

}  // namespace gdn
