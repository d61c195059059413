// reference.h (internal): helpers of the float64 reference shared by its two forms.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "api/validate.h"
#include "common/half_bits.h"
#include "common/kernel_problem.h"
#include "common/work_items.h"
#include "gdn/backward.h"
#include "gdn/conv.h"
#include "gdn/forward.h"
#include "gdn/layer.h"

namespace gdn {
namespace detail {
// Allocation helpers shared with the CPU entry points (src/api/forward.cc).
ForwardResult allocate_forward_result(const ForwardShape& shape, DType out, DType residual,
                                      Residuals residuals, bool t_inv);
ForwardOutputs outputs_of(ForwardResult& result);
BackwardResult allocate_backward_result(const BackwardInputs& inputs, const ForwardShape& shape,
                                        DType dtype);
BackwardOutputs outputs_of(BackwardResult& result);
// The layer op's gradients for `inputs` (src/api/layer.cc).
LayerBackwardResult allocate_layer_grads(const LayerInputs& inputs, const ValidatedLayer& layer,
                                         const LayerOptions& options, DType dtype);
LayerBackwardOutputs outputs_of(LayerBackwardResult& result);
// The conv op's gradients (src/api/conv.cc): d_x in `dtype`, the rest in its compute dtype.
ConvBackwardResult allocate_conv_grads(const ConvInputs& inputs, const ValidatedConv& conv,
                                       DType dtype);
}  // namespace detail

namespace ref {

inline std::int64_t matrix_offset(const detail::MatrixTensor<const std::byte*>& m,
                                  std::int64_t index, std::int64_t h) {
  return index * m.outer + h * m.head;
}
inline std::int64_t matrix_offset(const detail::MatrixTensor<std::byte*>& m, std::int64_t index,
                                  std::int64_t h) {
  return index * m.outer + h * m.head;
}
template <class Pointer>
inline std::int64_t token_offset(const detail::TokenTensor<Pointer>& x, const detail::Sequence& s,
                                 std::int64_t t, std::int64_t h) {
  return s.batch * x.batch + (s.start + t) * x.token + h * x.head;
}

// Element `offset` of a float tensor, as double (exact for every float dtype).
inline double read_real(const std::byte* data, DType dtype, std::int64_t offset) {
  switch (dtype) {
    case DType::f32:
      return reinterpret_cast<const float*>(data)[offset];
    case DType::bf16:
      return detail::float_from_bf16(reinterpret_cast<const std::uint16_t*>(data)[offset]);
    case DType::f16:
      return detail::float_from_f16(reinterpret_cast<const std::uint16_t*>(data)[offset]);
    default:
      return reinterpret_cast<const double*>(data)[offset];
  }
}

// Row (sequence s, token t, head h) of a token tensor: n elements as double.
inline void read_row(const detail::TokenTensor<const std::byte*>& x, const detail::Sequence& s,
                     std::int64_t t, std::int64_t h, std::int64_t n, double* out) {
  const std::int64_t base = token_offset(x, s, t, h);
  for (std::int64_t j = 0; j < n; ++j) out[j] = read_real(x.data, x.dtype, base + j * x.dim);
}

inline double read_scalar(const detail::TokenTensor<const std::byte*>& x, const detail::Sequence& s,
                          std::int64_t t, std::int64_t h) {
  return read_real(x.data, x.dtype, token_offset(x, s, t, h));
}

// x / sqrt(sum(x^2) + 1e-6), in place.
inline void l2_normalize(double* x, std::int64_t n) {
  double ss = 0;
  for (std::int64_t j = 0; j < n; ++j) ss += x[j] * x[j];
  const double inv = 1.0 / std::sqrt(ss + 1e-6);
  for (std::int64_t j = 0; j < n; ++j) x[j] *= inv;
}

// Outputs of the reference are f64.
inline void write_row(const detail::TokenTensor<std::byte*>& x, const detail::Sequence& s,
                      std::int64_t t, std::int64_t h, std::int64_t n, const double* values) {
  double* base = reinterpret_cast<double*>(x.data) + token_offset(x, s, t, h);
  for (std::int64_t j = 0; j < n; ++j) base[j * x.dim] = values[j];
}

// state[rows * cols] (row-major) from matrix (index, h), or zeros when absent.
inline void read_matrix(const detail::MatrixTensor<const std::byte*>& m, std::int64_t index,
                        std::int64_t h, std::int64_t rows, std::int64_t cols, double* out) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) {
      out[r * cols + c] =
          m.data == nullptr
              ? 0.0
              : read_real(m.data, m.dtype, matrix_offset(m, index, h) + r * m.row + c * m.col);
    }
  }
}

// Writes the top-left rows x cols of values (leading dimension ld) into matrix (index, h),
// and zeros into the rest of a padded_rows x padded_cols block; absent matrix: nothing.
inline void write_matrix(const detail::MatrixTensor<std::byte*>& m, std::int64_t index,
                         std::int64_t h, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                         const double* values, std::int64_t padded_rows, std::int64_t padded_cols) {
  if (m.data == nullptr) return;
  double* base = reinterpret_cast<double*>(m.data) + matrix_offset(m, index, h);
  for (std::int64_t r = 0; r < padded_rows; ++r) {
    for (std::int64_t c = 0; c < padded_cols; ++c) {
      base[r * m.row + c * m.col] = (r < rows && c < cols) ? values[r * ld + c] : 0.0;
    }
  }
}

// Runs fn(i) for i in [0, items) on up to `threads` threads (0: default_threads(); never
// more than there are items), as the fast path hands out its items (common/work_items.h).
template <class Fn>
void parallel_for(int threads, std::int64_t items, Fn&& fn) {
  auto run = [&fn](std::int64_t item, int) { fn(item); };
  detail::run_items(threads > 0 ? threads : default_threads(), items, run);
}

// Runs fn(s, h) for every (sequence, value head) with problem.threads threads.
template <class Fn>
void for_each_item(const detail::ForwardProblem& p, Fn&& fn) {
  parallel_for(p.threads, p.shape.num_seqs * p.shape.hv,
               [&p, &fn](std::int64_t item) { fn(item / p.shape.hv, item % p.shape.hv); });
}

// A reference entry point: validate (float64 outputs; `algorithm` decides whether a t_inv
// output is accepted), then item(problem, s, h) for every (sequence, value head).
template <class Item>
void run_reference(const ForwardInputs& inputs, const ForwardOutputs& outputs,
                   ForwardOptions options, Algorithm algorithm, Item item) {
  options.algorithm = algorithm;  // options.algorithm, .isa and .matmul_precision are ignored
  options.isa = CpuIsa::automatic;
  options.matmul_precision = MatmulPrecision::compute;
  detail::ValidatedForward validated;
  detail::validate_forward(inputs, outputs, options, detail::OutputPrecision::float64, &validated);
  const detail::ForwardProblem& p = validated.problem;
  for_each_item(p, [&p, &item](std::int64_t s, std::int64_t h) { item(p, s, h); });
}

// The allocating form of a reference entry point.
template <class Fn>
ForwardResult run_reference_allocating(const ForwardInputs& inputs, ForwardOptions options,
                                       Residuals residuals, bool t_inv, Fn fn) {
  options.algorithm = Algorithm::automatic;  // ignored by the reference
  options.isa = CpuIsa::automatic;
  options.matmul_precision = MatmulPrecision::compute;
  const ForwardShape shape = forward_shape(inputs, options);
  ForwardResult r =
      detail::allocate_forward_result(shape, DType::f64, DType::f64, residuals, t_inv);
  fn(inputs, detail::outputs_of(r), options);
  return r;
}

}  // namespace ref
}  // namespace gdn
