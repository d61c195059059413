// layer_problem.h: seeded test problems for the fused layer op.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gdn/gdn.h"

namespace gdn::test {

struct LayerSpec {
  std::vector<std::int64_t> lengths = {16};  // one entry per sequence (packed)
  std::int64_t hk = 1, hv = 2, dk = 8, dv = 8, taps = 4;
  DType dtype = DType::f32;
  bool conv_bias = true;
  bool conv_state = false;
  bool recurrent_state = false;
  bool weight_rank3 = false;  // conv_weight as [D, 1, K]
  std::uint64_t seed = 1;

  std::int64_t channels() const { return 2 * hk * dk + hv * dv; }
  std::string name() const;
};

struct LayerProblem {
  LayerSpec spec;
  Tensor qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, recurrent_state, cu_seqlens;
  LayerInputs inputs() const;
  LayerOptions options() const;
  // Cotangents: d_out like out, and of both final states.
  Tensor d_out, d_conv_state_out, d_recurrent_state_out;
};

LayerProblem make_layer_problem(const LayerSpec& spec);

}  // namespace gdn::test
