// check_finite.h: the optional non-finite check mode (ForwardOptions::check_finite,
// LayerOptions::check_finite, $GDN_CHECK_FINITE): the first NaN or Inf of a call's inputs
// (before anything is written) or outputs (after the call), named with its position.
#pragma once

#include <initializer_list>

#include "gdn/tensor.h"

namespace gdn::detail {

// True when `option` is set or the environment variable GDN_CHECK_FINITE is "1" (read once).
bool check_finite_enabled(bool option);

struct NamedTensor {
  const char* name;
  TensorView view;  // absent views are skipped
  // Rows of the first dimension to look at (a step's live tokens); -1: all of them.
  std::int64_t rows = -1;
};

// Throws gdn::NonFiniteError for the first non-finite element, in row-major order, of the first
// listed tensor that has one. `outputs`: the tensors are the call's results (already written).
void check_finite(std::initializer_list<NamedTensor> tensors, bool outputs);

// Check mode, the core op without the in-kernel L2 norm: writes one warning line to stderr when
// some token and value head has beta ||k||^2 > 2, where the transition I - beta k k^T expands
// the state along k (docs/numerics.md "Under stress": keys that keep their direction then make
// the state grow without bound, in exact arithmetic too). k [(B,) T, Hk, Dk], beta [(B,) T, Hv].
void warn_expanding_keys(const TensorView& k, const TensorView& beta);

}  // namespace gdn::detail
