// huge_pages.h: transparent huge pages advised over a fresh output buffer.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace gdn::bindings {

// XLA and torch allocate a large result afresh for every call, usually as a new mapping that
// the op's first writes fault in 4 KiB at a time (an 8k-token forward's o: 32768 faults);
// transparent huge pages advised over its whole 2 MiB pages take 2 MiB a fault (the library's
// own Tensor does the same). Advice only: without THP nothing changes.
inline void advise_huge_pages(void* data, std::size_t bytes) {
  constexpr std::uintptr_t kHuge = std::uintptr_t{1} << 21;
  const auto begin = (reinterpret_cast<std::uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const auto end = (reinterpret_cast<std::uintptr_t>(data) + bytes) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

}  // namespace gdn::bindings
