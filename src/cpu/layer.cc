// layer.cc: the conv1d + SiLU drivers and the decode driver (see layer.h).
#include "cpu/layer.h"

#include <algorithm>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/workspace.h"

namespace gdn::cpu {
namespace {

struct ConvItem {
  std::int64_t seq, t0, t1;
};

// Blocks of kConvTokens tokens of each sequence, in order; an empty sequence gets one empty
// item (its backward still passes d conv_state_out through to d conv_state).
std::vector<ConvItem> conv_items(const detail::ConvProblem& p) {
  std::vector<ConvItem> items;
  for (std::int64_t s = 0; s < p.num_seqs; ++s) {
    const std::int64_t len = p.seqs[s].length;
    if (len == 0) items.push_back({s, 0, 0});
    for (std::int64_t t0 = 0; t0 < len; t0 += kConvTokens) {
      items.push_back({s, t0, t0 + kConvTokens < len ? t0 + kConvTokens : len});
    }
  }
  return items;
}

template <class Real>
void sum_partials(const detail::ConvProblem& p, const std::byte* partials, std::int64_t items) {
  const std::int64_t n = conv_partial_elements(p), kcp = p.taps * p.cpad;
  const Real* src = reinterpret_cast<const Real*>(partials);
  Real* dw = reinterpret_cast<Real*>(p.dweight);
  Real* db = reinterpret_cast<Real*>(p.dbias);
  for (std::int64_t e = 0; e < n; ++e) (e < kcp ? dw[e] : db[e - kcp]) = 0;
  for (std::int64_t item = 0; item < items; ++item) {
    const Real* part = src + item * n;
    for (std::int64_t e = 0; e < kcp; ++e) dw[e] += part[e];
    for (std::int64_t e = kcp; e < n; ++e) db[e - kcp] += part[e];
  }
}

}  // namespace

void conv_forward(const detail::ConvProblem& p, CpuIsa isa, int threads) {
  const KernelTable& table = kernel_table(isa);
  const ConvForwardFn fn = table.conv_forward[activations(p.x_dtype)];
  const std::vector<ConvItem> items = conv_items(p);
  for_each_item(threads > 0 ? threads : default_threads(), static_cast<std::int64_t>(items.size()),
                conv_workspace_bytes(p, false), [&](std::int64_t i, std::byte* workspace) {
                  const ConvItem& item = items[static_cast<std::size_t>(i)];
                  fn(p, item.seq, item.t0, item.t1, workspace);
                });
}

void conv_backward(const detail::ConvProblem& p, CpuIsa isa, int threads) {
  const KernelTable& table = kernel_table(isa);
  const ConvBackwardFn fn = table.conv_backward[activations(p.x_dtype)];
  const std::vector<ConvItem> items = conv_items(p);
  const auto count = static_cast<std::int64_t>(items.size());
  const std::size_t partial_bytes =
      static_cast<std::size_t>(conv_partial_elements(p)) * dtype_size(p.dtype);
  std::vector<std::byte> partials(partial_bytes * static_cast<std::size_t>(count));
  for_each_item(threads > 0 ? threads : default_threads(), count, conv_workspace_bytes(p, true),
                [&](std::int64_t i, std::byte* workspace) {
                  const ConvItem& item = items[static_cast<std::size_t>(i)];
                  fn(p, item.seq, item.t0, item.t1,
                     partials.data() + static_cast<std::size_t>(i) * partial_bytes, workspace);
                });
  if (p.dtype == DType::f64) {
    sum_partials<double>(p, partials.data(), count);
  } else {
    sum_partials<float>(p, partials.data(), count);
  }
}

void decode(const detail::DecodeProblem& p, CpuIsa isa, int threads) {
  const KernelTable& table = kernel_table(isa);
  const DecodeItemFn fn = p.dtype == DType::f64          ? table.decode_f64
                          : p.state_dtype == DType::bf16 ? table.decode_f32_bf16_state
                                                         : table.decode_f32;
  const std::int64_t items = p.num_seqs * p.hv * p.vblocks;
  threads = detail::usable_threads(threads > 0 ? threads : default_threads());
  // Items go out in runs of consecutive ones, a run to a thread, so that an item can prefetch
  // the state of the next one it will take: handed out one at a time, item + 1 would most
  // likely be another thread's, read and written in place while this one prefetched it (its
  // lines moving between the cores' caches; on a Xeon, 2 threads, a step over a bf16 pool was
  // then slower than on one), and without that prefetch the first pass over each state waits
  // on memory (docs/perf.md, "bf16 pools"). About 8 runs a thread keep the threads balanced;
  // at most 16 items a run. Items are independent, so the runs change no bit.
  detail::DecodeProblem run = p;
  run.run = threads == 1 ? std::max<std::int64_t>(items, 1)
                         : std::clamp<std::int64_t>(items / (8 * threads), 1, 16);
  const std::int64_t runs = (items + run.run - 1) / run.run;
  for_each_item(threads, runs, decode_workspace_bytes(p),
                [&](std::int64_t r, std::byte* workspace) {
                  const std::int64_t end = std::min(items, (r + 1) * run.run);
                  for (std::int64_t item = r * run.run; item < end; ++item)
                    fn(run, item, workspace);
                });
}

}  // namespace gdn::cpu
