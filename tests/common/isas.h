// isas.h: the CPU variants the tests run, and a note for each one they cannot.
#pragma once

#include <cstdio>
#include <vector>

#include "gdn/runtime.h"

namespace gdn::test {

// Every ISA variant, widest last.
inline std::vector<CpuIsa> all_isas() {
  return {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16};
}

// The variants this build compiled and this CPU runs. Each one it cannot run is named once per
// test program with the reason ("this CPU lacks avx512_bf16", "not compiled into this build"),
// so that a variant left out never reads as one that passed.
inline std::vector<CpuIsa> runnable_isas() {
  static bool noted = false;
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : all_isas()) {
    if (cpu_isa_available(isa)) {
      isas.push_back(isa);
    } else if (!noted) {
      std::printf("[ SKIPPED  ] CPU variant %s: %s\n", cpu_isa_name(isa),
                  cpu_isa_unavailable_reason(isa));
    }
  }
  noted = true;
  return isas;
}

}  // namespace gdn::test
