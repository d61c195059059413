// forward.cc: the CPU forward driver. Splits a validated problem into (sequence, value head)
// items and runs them on a static pool of OpenMP threads, one workspace per thread.
//
// Every item is computed start to finish by one thread with the same code, and items share
// no output, so the result is bit-identical for any thread count and any schedule. Items
// are handed out dynamically (sequences of a packed batch differ in length).
#include "cpu/forward.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "gdn/error.h"

namespace gdn::cpu {
namespace {

struct FreeDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<std::byte[], FreeDeleter>;

Buffer allocate(std::size_t bytes) {
  bytes = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (p == nullptr) throw RuntimeError("out of memory allocating a workspace of " + std::to_string(bytes) + " bytes");
  return Buffer(static_cast<std::byte*>(p));
}

}  // namespace

void forward(const detail::ForwardProblem& p, CpuIsa isa) {
  const KernelTable& table = kernel_table(isa);
  const bool f64 = p.shape.compute_dtype == DType::f64;
  const ForwardItemFn chunked = f64 ? table.chunked_f64 : table.chunked_f32;
  const ForwardItemFn recurrent = f64 ? table.recurrent_f64 : table.recurrent_f32;
  const bool residuals = p.wants_residuals();

  const std::int64_t items = p.shape.num_seqs * p.shape.hv;
  int threads = p.threads > 0 ? p.threads : default_threads();
  if (threads > items) threads = static_cast<int>(items > 0 ? items : 1);

  // Allocate before the parallel region: an exception cannot leave an OpenMP region.
  const std::size_t bytes = forward_workspace_bytes(p);
  std::vector<Buffer> workspaces;
  for (int t = 0; t < threads; ++t) workspaces.push_back(allocate(bytes));

#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
#endif
  for (std::int64_t item = 0; item < items; ++item) {
#ifdef _OPENMP
    std::byte* workspace = workspaces[static_cast<std::size_t>(omp_get_thread_num())].get();
#else
    std::byte* workspace = workspaces[0].get();
#endif
    const std::int64_t s = item / p.shape.hv, h = item % p.shape.hv;
    const std::int64_t length = p.seqs[s].length;
    const bool use_recurrent =
        p.algorithm == Algorithm::recurrent ||
        (p.algorithm == Algorithm::automatic && !residuals && length < p.chunk_size);
    (use_recurrent ? recurrent : chunked)(p, s, h, workspace);
  }
}

}  // namespace gdn::cpu
