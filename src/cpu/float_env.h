// float_env.h: the floating-point mode every fast-path call runs in.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace gdn::cpu {

// While alive, subnormal numbers are read and written as zero on this thread (x86: MXCSR DAZ
// and FTZ); the caller's mode is restored on destruction, exceptions included. Why: strong
// gates drive the decays, the states and the products that touch them into the subnormal
// range, where every operation takes a microcode assist on Intel cores (the layer forward at
// 8k tokens with A_log up to 2.7 ran 3x slower on one Xeon core), yet a value below 1.2e-38
// changes no float32 result by more than that. Setting it on every call and on every worker
// thread also makes the results independent of the caller's mode (XLA runs its threads with
// FTZ and DAZ on; a plain C++ or Python thread has them off). Elsewhere it does nothing.
class SubnormalsAsZero {
 public:
#if defined(__x86_64__) || defined(__i386__)
  SubnormalsAsZero() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFtz | kDaz); }
  ~SubnormalsAsZero() { _mm_setcsr(saved_); }
#else
  SubnormalsAsZero() = default;
#endif
  SubnormalsAsZero(const SubnormalsAsZero&) = delete;
  SubnormalsAsZero& operator=(const SubnormalsAsZero&) = delete;

 private:
#if defined(__x86_64__) || defined(__i386__)
  static constexpr unsigned kFtz = 0x8000, kDaz = 0x0040;
  unsigned saved_;
#endif
};

}  // namespace gdn::cpu
