// fuzz_regression_test.cc: every finding of the fuzz targets (fuzz/, scripts/fuzz.sh) as a
// test named after its case: the smallest call that crashed, hung or misbehaved, and what
// the library does now (docs/fuzzing.md).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>

#include "gdn/gdn.h"

namespace gdn {
namespace {

// A small valid forward: T = 4 tokens, Hk = Hv = 1, Dk = Dv = 2, float32.
struct Core {
  Tensor q{DType::f32, {4, 1, 2}}, k{DType::f32, {4, 1, 2}}, v{DType::f32, {4, 1, 2}};
  Tensor g{DType::f32, {4, 1}}, beta{DType::f32, {4, 1}};
  Tensor o{DType::f32, {4, 1, 2}}, ht{DType::f32, {1, 1, 2, 2}};
  ForwardInputs in{q.view(), k.view(), v.view(), g.view(), beta.view(), {}, {}};
  ForwardOutputs out{o.mutable_view(), ht.mutable_view(), {}, {}};
};

// The argument an InvalidArgument names, or "" when `call` returns or throws anything else.
template <class Fn>
std::string rejected_argument(Fn&& call) {
  try {
    call();
  } catch (const InvalidArgument& e) {
    return e.argument();
  } catch (...) {
    return "(another exception)";
  }
  return "";
}

// A DType value outside the enum made dtype_size 0 and the alignment check divide by zero
// (UBSan: division by zero in check_extent). Now: InvalidArgument naming the view.
TEST(FuzzRegression, DTypeOutsideTheEnumIsRejected) {
  Core c;
  c.in.q.dtype = static_cast<DType>(7);
  EXPECT_EQ(rejected_argument([&] { chunk_gated_delta_rule_fwd(c.in, c.out); }), "q");
  Core d;
  d.out.o.dtype = static_cast<DType>(200);
  EXPECT_EQ(rejected_argument([&] { chunk_gated_delta_rule_fwd(d.in, d.out); }), "o");
  try {
    chunk_gated_delta_rule_fwd(c.in, c.out);
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DType value 7"), std::string::npos) << e.what();
  }
}

// A stride of INT64_MIN was negated (UBSan: negation overflow in check_extent), and a reach
// of INT64_MAX had 1 added to it. Now: InvalidArgument ("byte offsets that fit in int64").
TEST(FuzzRegression, StrideOfInt64MinIsRejected) {
  Core c;
  c.in.k.strides[0] = std::numeric_limits<std::int64_t>::min();
  EXPECT_EQ(rejected_argument([&] { chunk_gated_delta_rule_fwd(c.in, c.out); }), "k");
  Core d;
  d.in.v.strides[2] = std::numeric_limits<std::int64_t>::max();  // reach = INT64_MAX
  EXPECT_EQ(rejected_argument([&] { chunk_gated_delta_rule_fwd(d.in, d.out); }), "v");
  Core e;  // a size-1 dimension's stride is never used: any value passes
  e.in.q.strides[1] = std::numeric_limits<std::int64_t>::min();
  EXPECT_EQ(rejected_argument([&] { chunk_gated_delta_rule_fwd(e.in, e.out); }), "");
}

// A one-token o whose token stride was INT64_MAX / 2 (a size-1 dimension's stride is free,
// so validation accepts it): the forward's prefetch queue multiplied it by the element size
// (UBSan: signed overflow in queue_tokens, src/cpu/io-inl.h). Now a single row's stride is
// not used, and the call writes what it writes with a plain o.
TEST(FuzzRegression, OneTokenOutputWithHugeTokenStrideRuns) {
  Tensor q(DType::f32, {1, 1, 2}), k(DType::f32, {1, 1, 2}), v(DType::f32, {1, 1, 2});
  Tensor g(DType::f32, {1, 1}), beta(DType::f32, {1, 1});
  for (Tensor* t : {&q, &k, &v}) t->data<float>()[0] = t->data<float>()[1] = 0.5f;
  g.data<float>()[0] = -0.1f;
  beta.data<float>()[0] = 0.5f;
  const ForwardInputs in{q.view(), k.view(), v.view(), g.view(), beta.view(), {}, {}};
  Tensor plain(DType::f32, {1, 1, 2}), strided(DType::f32, {1, 1, 2});
  for (CpuIsa isa : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::avx512_bf16}) {
    if (!cpu_isa_available(isa)) continue;
    ForwardOptions o;
    o.isa = isa;
    chunk_gated_delta_rule_fwd(in, {plain.mutable_view(), {}, {}, {}}, o);
    MutableTensorView out = strided.mutable_view();
    out.strides[0] = std::numeric_limits<std::int64_t>::max() / 2;
    EXPECT_EQ(rejected_argument([&] {
                chunk_gated_delta_rule_fwd(in, {out, {}, {}, {}}, o);
              }),
              "")
        << cpu_isa_name(isa);
    EXPECT_EQ(strided.data<float>()[0], plain.data<float>()[0]) << cpu_isa_name(isa);
    EXPECT_EQ(strided.data<float>()[1], plain.data<float>()[1]) << cpu_isa_name(isa);
  }
}

// A broadcast cu_seqlens (stride 0) of 2^40 zeros over T = 0 tokens described 2^40 - 1
// sequences in 8 bytes, and validation reserved a record for each (out of memory). Now: at
// most 2^20 sequences per call.
TEST(FuzzRegression, BroadcastCuSeqlensOfHugeNIsRejected) {
  Core c;
  const std::int64_t zero = 0;
  for (TensorView* t : {&c.in.q, &c.in.k, &c.in.v, &c.in.g, &c.in.beta}) t->sizes[0] = 0;
  c.out.o.sizes[0] = 0;
  c.out.final_state = {};
  c.in.cu_seqlens = TensorView(&zero, DType::i64, 1, {std::int64_t{1} << 40}, {0});
  EXPECT_EQ(rejected_argument([&] { chunk_gated_delta_rule_fwd(c.in, c.out); }), "cu_seqlens");
  EXPECT_EQ(rejected_argument([&] { forward_shape(c.in); }), "cu_seqlens");
}

// Batched inputs [B, 0, H, D] hold no element for any B, and validation pushed B sequence
// records (out of memory for B = 2^40). Now: B at most 2^20.
TEST(FuzzRegression, EmptyBatchedInputsOfHugeBAreRejected) {
  Tensor x(DType::f32, {1});
  const std::int64_t b = std::int64_t{1} << 40;
  ForwardInputs in;
  in.q = TensorView(x.raw(), DType::f32, 4, {b, 0, 1, 2}, {2, 2, 2, 1});
  in.k = in.q;
  in.v = in.q;
  in.g = TensorView(x.raw(), DType::f32, 3, {b, 0, 1}, {1, 1, 1});
  in.beta = in.g;
  ForwardOutputs out;
  out.o = MutableTensorView(x.raw(), DType::f32, 4, {b, 0, 1, 2}, {2, 2, 2, 1});
  EXPECT_EQ(rejected_argument([&] { chunk_gated_delta_rule_fwd(in, out); }), "q");
}

// The serving step's smallest batch (one decode, Hk = Hv = Dk = Dv = 1, K = 1) with the
// tensors the validation does not read at placeholder addresses (gdn/step.h allows that for
// check_fused_gdn_step) and pools of `slots` slots.
struct StepCheck {
  std::int64_t qsl[2] = {0, 1}, slot[1] = {1}, lens[1] = {1}, dist[3] = {1, 1, 1};
  StepInputs in;
  StatePools pools;
  MutableTensorView out;
  StepOptions options;
  explicit StepCheck(std::int64_t slots) {
    auto at = [](std::uintptr_t address) { return reinterpret_cast<void*>(address); };
    in.qkv = TensorView(at(0x10000), DType::f32, {1, 3});
    in.a = TensorView(at(0x20000), DType::f32, {1, 1});
    in.b = TensorView(at(0x30000), DType::f32, {1, 1});
    in.conv_weight = TensorView(at(0x40000), DType::f32, {3, 1});
    in.A_log = TensorView(at(0x50000), DType::f32, {1});
    in.dt_bias = TensorView(at(0x60000), DType::f32, {1});
    in.query_start_loc = TensorView(qsl, {2});
    in.state_indices = TensorView(slot, {1});
    in.seq_lens = TensorView(lens, {1});
    in.distribution = TensorView(dist, {3});
    out = MutableTensorView(at(0x70000), DType::f32, {1, 1});
    // Far above the placeholders, below the heap and the stack.
    pools.conv_state = MutableTensorView(at(std::uintptr_t{1} << 43), DType::f32, {slots, 0, 3});
    pools.recurrent_state =
        MutableTensorView(at(std::uintptr_t{1} << 44), DType::f32, {slots, 1, 1, 1});
    options.hk = options.hv = options.dk = options.dv = 1;
  }
};

// check_fused_gdn_step kept a vector of num_slots entries (who writes each slot): pools of
// 2^40 slots, which a binding may describe at trace time, ran out of memory. Now: the
// validation's memory follows the live sequences, not the pools.
TEST(FuzzRegression, StepValidationMemoryDoesNotGrowWithNumSlots) {
  StepCheck c(std::int64_t{1} << 40);
  EXPECT_EQ(rejected_argument([&] { check_fused_gdn_step(c.in, c.pools, c.out, c.options); }), "");
  StepCheck twice(std::int64_t{1} << 40);  // still sees two writers of one slot
  std::int64_t two[2] = {5, 5}, qsl[3] = {0, 1, 2}, lens[2] = {1, 1}, dist[3] = {2, 2, 2};
  twice.in.state_indices = TensorView(two, {2});
  twice.in.query_start_loc = TensorView(qsl, {3});
  twice.in.seq_lens = TensorView(lens, {2});
  twice.in.distribution = TensorView(dist, {3});
  twice.in.qkv = TensorView(reinterpret_cast<void*>(0x10000), DType::f32, {2, 3});
  twice.in.a = TensorView(reinterpret_cast<void*>(0x20000), DType::f32, {2, 1});
  twice.in.b = TensorView(reinterpret_cast<void*>(0x30000), DType::f32, {2, 1});
  twice.out = MutableTensorView(reinterpret_cast<void*>(0x70000), DType::f32, {2, 1});
  EXPECT_EQ(rejected_argument(
                [&] { check_fused_gdn_step(twice.in, twice.pools, twice.out, twice.options); }),
            "state_indices");
}

// A broadcast state_indices (stride 0) of 2^40 entries: the step read each index tensor into
// a vector of N (out of memory). Now: at most 2^20 sequences.
TEST(FuzzRegression, StepOfHugeBroadcastBatchIsRejected) {
  StepCheck c(8);
  const std::int64_t one = 1;
  c.in.state_indices = TensorView(&one, DType::i64, 1, {std::int64_t{1} << 40}, {0});
  EXPECT_EQ(rejected_argument([&] { check_fused_gdn_step(c.in, c.pools, c.out, c.options); }),
            "state_indices");
}

// LayerOptions with Hk = Hv = 2^62: the width D = 2 Hk Dk + Hv Dv overflowed int64 (UBSan:
// signed overflow in validate_layer_inputs). Now: InvalidArgument naming the options.
TEST(FuzzRegression, LayerHeadCountsOverflowingTheWidthAreRejected) {
  Tensor qkv(DType::f32, {2, 4}), ab(DType::f32, {2, 1}), w(DType::f32, {4, 2}), h(DType::f32, {1});
  LayerInputs in;
  in.qkv = qkv.view();
  in.a = ab.view();
  in.b = ab.view();
  in.conv_weight = w.view();
  in.A_log = h.view();
  in.dt_bias = h.view();
  LayerOptions options;
  options.hk = options.hv = std::int64_t{1} << 62;
  options.dk = options.dv = 1;
  EXPECT_EQ(rejected_argument([&] { fused_gdn_shape(in, options); }), "options.hk");
  options.hk = 1;
  options.hv = std::int64_t{1} << 62;
  options.dv = 4;
  EXPECT_EQ(rejected_argument([&] { fused_gdn_shape(in, options); }), "options.hv");
}

// A layer call over T = 0 tokens whose out [0, Hv Dv] had a column stride of INT64_MIN (an
// empty view's strides are not checked): the core op's view of it, dv * stride, overflowed
// (UBSan, in heads_view). Now: the call returns, nothing to write.
TEST(FuzzRegression, EmptyLayerOutWithInt64MinStrideRuns) {
  Tensor qkv(DType::f32, {0, 6}), ab(DType::f32, {0, 1}), w(DType::f32, {6, 2}), h(DType::f32, {1});
  Tensor out(DType::f32, {1, 2});
  LayerInputs in;
  in.qkv = qkv.view();
  in.a = ab.view();
  in.b = ab.view();
  in.conv_weight = w.view();
  in.A_log = h.view();
  in.dt_bias = h.view();
  LayerOptions options;
  options.hk = options.hv = 1;
  options.dk = options.dv = 2;
  LayerOutputs outs;
  outs.out = MutableTensorView(out.raw(), DType::f32, 2, {0, 2},
                               {2, std::numeric_limits<std::int64_t>::min()});
  EXPECT_EQ(rejected_argument([&] { fused_gdn_fwd(in, outs, options); }), "");
}

}  // namespace
}  // namespace gdn
