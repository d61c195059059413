// layer.cc: the conv1d + SiLU drivers (see layer.h).
#include "cpu/layer.h"

#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace gdn::cpu {

void conv_forward(const detail::ConvProblem& p, CpuIsa isa, int threads) {
  const KernelTable& table = kernel_table(isa);
  const ConvForwardFn fn = p.dtype == DType::f64 ? table.conv_forward_f64 : table.conv_forward_f32;
  const std::int64_t block = conv_channel_block();
  const std::int64_t blocks = (p.channels + block - 1) / block;
  for_each_item(threads > 0 ? threads : default_threads(), p.num_seqs * blocks,
                conv_workspace_bytes(p), [&](std::int64_t item, std::byte* workspace) {
                  const std::int64_t s = item / blocks, c0 = item % blocks * block;
                  fn(p, s, c0, c0 + block < p.channels ? c0 + block : p.channels, workspace);
                });
}

void conv_backward(const detail::ConvProblem& p, CpuIsa isa, int threads) {
  const KernelTable& table = kernel_table(isa);
  const ConvBackwardFn fn =
      p.dtype == DType::f64 ? table.conv_backward_f64 : table.conv_backward_f32;
  const std::int64_t block = conv_channel_block();
  const std::int64_t blocks = (p.channels + block - 1) / block;
  for_each_item(threads > 0 ? threads : default_threads(), blocks, conv_workspace_bytes(p),
                [&](std::int64_t item, std::byte* workspace) {
                  const std::int64_t c0 = item * block;
                  fn(p, c0, c0 + block < p.channels ? c0 + block : p.channels, workspace);
                });
}

}  // namespace gdn::cpu
