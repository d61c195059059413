// prefetch-inl.h: asking for the caller's token rows ahead of their use, a few cache lines at a
// time between the register tiles of the chunk's products.
//
// A chunk gathers q, k, v, g, beta (and d_o) row by row and scatters o (dq, dk, dv, ...) row by
// row, and token rows lie a token stride apart (Hk Dk or Hv Dv elements: 8 or 16 KiB at the
// Qwen3-Next shape), each in its own page, where the hardware prefetchers do not follow. So
// every row waited on memory: at 8192 tokens x 16/32 heads on one Intel Xeon thread the
// forward's gathers and scatter took 65 of its 307 ms. Asking for all of a chunk's rows at
// once does not help either: the requests outnumber the core's line-fill buffers and stall
// the instruction stream as long as the gathers did. The queue spreads them over the products
// (gemm_panels issues a few lines before each tile), so memory runs under the arithmetic.
// Prefetches are hints: no result depends on them.

// One cache line toward L2, for reading or for writing. In asm on x86: GCC at -O2 deletes a
// loop of __builtin_prefetch calls (-ffinite-loops takes it as free of side effects).
inline void prefetch_line(const char* line, bool write) {
#if defined(__x86_64__)
  if (write) {
    asm volatile("prefetchw %0" : : "m"(*line));
  } else {
    asm volatile("prefetcht1 %0" : : "m"(*line));
  }
#else
  if (write) {
    __builtin_prefetch(line, 1, 2);
  } else {
    __builtin_prefetch(line, 0, 2);
  }
#endif
}

class PrefetchQueue {
 public:
  // Lines issued before each register tile of a product (a tile of the chunk shapes takes
  // about 100 ns). 6 was the best of 4, 6, 8, 12 and 16 on the Intel Xeon (docs/perf_matmul.md,
  // "Float32 on an Intel Xeon"): fewer leave rows unfetched, more contend with the tiles' loads.
  static constexpr int kLinesPerTile = 6;

  void clear() { count_ = run_ = row_ = line_ = 0; }

  // `rows` rows of `bytes` bytes each, the first at `first`, `stride` bytes apart. Runs past
  // the queue's capacity are dropped (only a hint).
  void add(const void* first, std::int64_t stride, std::int64_t rows, std::int64_t bytes,
           bool write) {
    if (count_ == kRuns || rows <= 0 || bytes <= 0) return;
    runs_[count_++] = Run{static_cast<const char*>(first), stride, rows, bytes, write};
  }

  // The next `lines` lines of the queue (fewer when it runs out).
  void issue(int lines) {
    while (lines > 0 && run_ < count_) {
      const Run& r = runs_[run_];
      const auto start = reinterpret_cast<std::uintptr_t>(r.first + row_ * r.stride);
      const auto first_line = start & ~std::uintptr_t{63};
      const std::int64_t row_lines =
          static_cast<std::int64_t>((start + r.bytes - 1 - first_line) / 64) + 1;
      for (; line_ < row_lines && lines > 0; ++line_, --lines) {
        prefetch_line(reinterpret_cast<const char*>(first_line) + 64 * line_, r.write);
      }
      if (line_ == row_lines) {
        line_ = 0;
        if (++row_ == r.rows) {
          row_ = 0;
          ++run_;
        }
      }
    }
  }

 private:
  struct Run {
    const char* first;
    std::int64_t stride, rows, bytes;
    bool write;
  };
  static constexpr int kRuns = 16;
  Run runs_[kRuns];
  int count_ = 0, run_ = 0;
  std::int64_t row_ = 0, line_ = 0;
};

// The calling thread's queue: the chunk kernels fill it, the products drain it.
inline PrefetchQueue& prefetch_queue() {
  static thread_local PrefetchQueue queue;
  return queue;
}
