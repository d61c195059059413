// check_finite.h: the optional non-finite check mode (ForwardOptions::check_finite,
// LayerOptions::check_finite, $GDN_CHECK_FINITE): the first NaN or Inf of a call's inputs
// (before anything is written) or outputs (after the call), named with its position; a call
// that throws after writing puts back the state it updates in place (StateBackup).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <vector>

#include "gdn/tensor.h"

namespace gdn::detail {

// True when `option` is set or the environment variable GDN_CHECK_FINITE is "1" (read once).
bool check_finite_enabled(bool option);

struct NamedTensor {
  const char* name;
  TensorView view;  // absent views are skipped
  // Rows of the first dimension to look at (a step's live tokens); -1: all of them.
  std::int64_t rows = -1;
  // The index of the view's row 0 in the caller's tensor, for the message (a pool slot).
  std::int64_t first_row = 0;
};

// What a call that throws gdn::NonFiniteError has written, said in its message.
enum class Written : std::uint8_t {
  nothing,          // the inputs' check, before the call
  outputs,          // the outputs' check: every output written
  states_restored,  // the same, and the states the call updates in place put back as they were
  pools_restored,   // a serving step: out written, every pool slot it wrote put back
};

// Throws gdn::NonFiniteError for the first non-finite element, in row-major order, of the first
// listed tensor that has one.
void check_finite(std::initializer_list<NamedTensor> tensors, Written written);

// Check mode: copies of the caller's state that a call updates in place (a pool's slots, a final
// state that is the view of the initial state), put back when the call throws after writing
// it (a non-finite output), so that a call that throws has changed no state. Only taken in
// check mode: the normal path pays nothing.
class StateBackup {
 public:
  // Keeps the elements of `view` (any strides).
  void save(const MutableTensorView& view);
  // Every saved view back as it was, in reverse order.
  void restore() const;
  bool empty() const { return saved_.empty(); }

 private:
  struct Saved {
    MutableTensorView view;
    std::vector<std::byte> bytes;
  };
  std::vector<Saved> saved_;
};

// Runs `call`; when it throws, puts `backup` back first.
template <class Call>
void restoring_on_error(const StateBackup& backup, Call&& call) {
  try {
    call();
  } catch (...) {
    backup.restore();
    throw;
  }
}

// Check mode, the core op without the in-kernel L2 norm: writes one warning line to stderr when
// some token and value head has beta ||k||^2 > 2, where the transition I - beta k k^T expands
// the state along k (docs/numerics.md "Under stress": keys that keep their direction then make
// the state grow without bound, in exact arithmetic too). k [(B,) T, Hk, Dk], beta [(B,) T, Hv].
void warn_expanding_keys(const TensorView& k, const TensorView& beta);

}  // namespace gdn::detail
