// conv_update_test.cc: gdn::conv_update (gdn/conv.h), the conv's decode step on a pool of conv
// states updated in place, on every compiled ISA variant:
//   - out bit-identical to causal_conv1d_fwd from the slots' last K - 1 inputs, and the slots
//     shifted exactly (raw inputs, rounded once into a 16-bit pool); float64 within 1e-12 of
//     the float64 reference;
//   - a pool carved from padded pages (a slot stride past the slot, a storage offset, canary
//     bytes between the slots) gives the bytes a contiguous pool gives, in both slot layouts
//     (channel-last [S, D] and channel-first [D, S]) and every pool dtype, and no canary changes;
//   - every refusal names its argument and leaves the pool and out as they were.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/problem.h"
#include "common/validation.h"

namespace gdn {
namespace {

constexpr unsigned char kCanary = 0x5A;

void set(Tensor& t, std::int64_t i, double v) {
  switch (t.dtype()) {
    case DType::f32:
      t.data<float>()[i] = static_cast<float>(v);
      break;
    case DType::bf16:
      static_cast<std::uint16_t*>(t.raw())[i] = bf16_bits(static_cast<float>(v));
      break;
    case DType::f16:
      static_cast<std::uint16_t*>(t.raw())[i] = f16_bits(static_cast<float>(v));
      break;
    default:
      t.data<double>()[i] = v;
  }
}

Tensor random(DType dtype, const Dims& sizes, int rank, std::uint64_t seed) {
  Tensor t(dtype, rank, sizes);
  test::Random rng(seed);
  for (std::int64_t i = 0; i < t.numel(); ++i) set(t, i, rng.normal());
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// A batch: sequences of `lengths` new tokens (0 included), each continuing slot `slots[s]` of
// a pool [num_slots, rows, D] of `pool_dtype`, stored channel-last (as [slots][rows][D]) or
// channel-first ([slots][D][rows]).
struct UpdateSpec {
  std::vector<std::int64_t> lengths = {1, 3, 0, 1, 6, 1};
  std::vector<std::int64_t> slots = {5, 0, 2, 7, 3, 1};
  std::int64_t num_slots = 8, channels = 40, taps = 4, rows = 3;
  DType x_dtype = DType::f32, pool_dtype = DType::f32;
  bool channel_first = false;
};

struct UpdateCase {
  UpdateSpec spec;
  std::int64_t tokens = 0;
  Tensor x, weight, bias, cu, slots, pool;  // pool: dense, in the spec's storage order

  ConvUpdateInputs inputs() const {
    return {x.view(), weight.view(), bias.view(), cu.view(), slots.view()};
  }
  // The pool's [num_slots, rows, D] view of `data` (a pool or a copy of it) with slot stride
  // `stride` elements.
  MutableTensorView view(void* data, std::int64_t stride) const {
    const std::int64_t r = spec.rows, d = spec.channels;
    const Dims inner = spec.channel_first ? Dims{stride, 1, r, 0} : Dims{stride, d, 1, 0};
    return MutableTensorView(data, spec.pool_dtype, 3, {spec.num_slots, r, d, 0}, inner);
  }
  std::int64_t slot_elements() const { return spec.rows * spec.channels; }
};

UpdateCase make_case(const UpdateSpec& spec) {
  UpdateCase c;
  c.spec = spec;
  const auto n = static_cast<std::int64_t>(spec.lengths.size());
  c.cu = Tensor(DType::i64, {n + 1});
  c.cu.data<std::int64_t>()[0] = 0;
  for (std::int64_t s = 0; s < n; ++s) {
    c.cu.data<std::int64_t>()[s + 1] = c.cu.data<std::int64_t>()[s] + spec.lengths[s];
  }
  c.tokens = c.cu.data<std::int64_t>()[n];
  c.slots = Tensor(DType::i64, {n});
  for (std::int64_t s = 0; s < n; ++s) c.slots.data<std::int64_t>()[s] = spec.slots[s];
  const DType compute = spec.x_dtype == DType::f64 ? DType::f64 : DType::f32;
  c.x = random(spec.x_dtype, {c.tokens, spec.channels, 0, 0}, 2, 11);
  c.weight = random(compute, {spec.channels, spec.taps, 0, 0}, 2, 12);
  c.bias = random(compute, {spec.channels, 0, 0, 0}, 1, 13);
  c.pool = random(spec.pool_dtype, {spec.num_slots, spec.rows, spec.channels, 0}, 3, 14);
  return c;
}

struct Outcome {
  Tensor out, pool;
};

// conv_update over a copy of the case's pool, dense (slot stride = a slot).
Outcome run_dense(const UpdateCase& c, const ConvOptions& o) {
  Outcome r{Tensor(c.spec.x_dtype, {c.tokens, c.spec.channels}),
            Tensor(c.pool.dtype(), 3, c.pool.sizes())};
  std::memcpy(r.pool.raw(), c.pool.raw(), c.pool.bytes());
  conv_update(c.inputs(), c.view(r.pool.raw(), c.slot_elements()), r.out.mutable_view(), o);
  return r;
}

// Element (slot, row, channel) of the case's dense pool as double.
double pool_at(const UpdateCase& c, const Tensor& pool, std::int64_t x, std::int64_t r,
               std::int64_t ch) {
  const std::int64_t at = x * c.slot_elements() +
                          (c.spec.channel_first ? ch * c.spec.rows + r : r * c.spec.channels + ch);
  return test::value_at(pool, at);
}

// out equals causal_conv1d_fwd from the slots' last K - 1 inputs (gathered here), bit for bit;
// each slot holds its last `rows` inputs, exactly (the new ones rounded once to the pool's
// dtype), and slots no sequence names are unchanged.
TEST(CpuConvUpdate, EqualsConvForwardFromTheSlotsAndShiftsThem) {
  for (const bool channel_first : {false, true}) {
    for (const std::int64_t rows : {3, 5}) {  // S = K - 1, and S > K - 1 (transformers: K)
      for (const DType pool_dtype : {DType::f32, DType::bf16}) {
        UpdateSpec spec;
        spec.rows = rows;
        spec.channel_first = channel_first;
        spec.pool_dtype = pool_dtype;
        const UpdateCase c = make_case(spec);
        const std::int64_t n = static_cast<std::int64_t>(spec.lengths.size()), k = spec.taps;
        const std::int64_t d = spec.channels;
        Tensor state(DType::f32, {n, k - 1, d});
        for (std::int64_t s = 0; s < n; ++s) {
          for (std::int64_t r = 0; r + 1 < k; ++r) {
            for (std::int64_t ch = 0; ch < d; ++ch) {
              state.data<float>()[(s * (k - 1) + r) * d + ch] =
                  static_cast<float>(pool_at(c, c.pool, spec.slots[s], rows - (k - 1) + r, ch));
            }
          }
        }
        const std::string what = std::string(channel_first ? "channel-first" : "channel-last") +
                                 ", S = " + std::to_string(rows) + ", pool " +
                                 dtype_name(pool_dtype);
        for (CpuIsa isa : test::runnable_isas()) {
          ConvOptions o;
          o.isa = isa;
          const Outcome got = run_dense(c, o);
          const ConvForwardResult want = causal_conv1d_fwd(
              {c.x.view(), c.weight.view(), c.bias.view(), state.view(), c.cu.view()}, o);
          EXPECT_TRUE(
              test::bit_identical(got.out, want.out, "out, " + what + ", " + cpu_isa_name(isa)));
          std::vector<bool> named(static_cast<std::size_t>(spec.num_slots), false);
          for (std::int64_t s = 0; s < n; ++s) {
            named[spec.slots[s]] = true;
            const std::int64_t len = spec.lengths[s], start = c.cu.data<std::int64_t>()[s];
            for (std::int64_t r = 0; r < rows; ++r) {
              const std::int64_t j = len - rows + r;
              for (std::int64_t ch = 0; ch < d; ++ch) {
                Tensor one(pool_dtype, {1});
                set(one, 0, j >= 0 ? test::value_at(c.x, (start + j) * d + ch) : 0.0);
                const double expected = j >= 0 ? test::value_at(one, 0)
                                               : pool_at(c, c.pool, spec.slots[s], r + len, ch);
                const double actual = pool_at(c, got.pool, spec.slots[s], r, ch);
                if (actual != expected) {
                  ADD_FAILURE() << what << ": slot " << spec.slots[s] << " row " << r << " channel "
                                << ch << " is " << actual << ", expected " << expected;
                  return;
                }
              }
            }
          }
          const std::int64_t slot_bytes =
              c.slot_elements() * static_cast<std::int64_t>(dtype_size(pool_dtype));
          for (std::int64_t x = 0; x < spec.num_slots; ++x) {
            if (named[x]) continue;
            EXPECT_EQ(std::memcmp(static_cast<const char*>(got.pool.raw()) + x * slot_bytes,
                                  static_cast<const char*>(c.pool.raw()) + x * slot_bytes,
                                  static_cast<std::size_t>(slot_bytes)),
                      0)
                << what << ": slot " << x << " changed";
          }
        }
      }
    }
  }
}

// The pool carved from padded pages: a lead before the first slot (a storage offset), the slot
// stride a slot plus `pad` elements, canaries everywhere else. Same bytes as the dense pool.
void expect_paged_matches_dense(const UpdateCase& c, const ConvOptions& o, std::int64_t lead,
                                std::int64_t pad, const std::string& what) {
  const Outcome want = run_dense(c, o);
  const std::int64_t elem = static_cast<std::int64_t>(dtype_size(c.spec.pool_dtype));
  const std::int64_t stride = c.slot_elements() + pad;
  const std::int64_t bytes = (lead + stride * c.spec.num_slots) * elem;
  std::vector<double> storage(static_cast<std::size_t>(bytes / 8 + 1));
  auto* buffer = reinterpret_cast<char*>(storage.data());
  std::memset(buffer, kCanary, static_cast<std::size_t>(bytes));
  const std::int64_t slot_bytes = c.slot_elements() * elem;
  for (std::int64_t x = 0; x < c.spec.num_slots; ++x) {
    std::memcpy(buffer + (lead + x * stride) * elem,
                static_cast<const char*>(c.pool.raw()) + x * slot_bytes,
                static_cast<std::size_t>(slot_bytes));
  }
  Tensor out(c.spec.x_dtype, {c.tokens, c.spec.channels});
  conv_update(c.inputs(), c.view(buffer + lead * elem, stride), out.mutable_view(), o);
  EXPECT_TRUE(same_bytes(out, want.out)) << "out, " << what;
  std::int64_t slots_differ = 0, canaries_changed = 0;
  for (std::int64_t b = 0; b < bytes; ++b) {
    const std::int64_t e = b / elem - lead;
    const bool in_slot = e >= 0 && e % stride < c.slot_elements();
    if (in_slot) {
      const std::int64_t x = e / stride, within = (e % stride) * elem + b % elem;
      slots_differ +=
          buffer[b] != static_cast<const char*>(want.pool.raw())[x * slot_bytes + within];
    } else {
      canaries_changed += static_cast<unsigned char>(buffer[b]) != kCanary;
    }
  }
  EXPECT_EQ(slots_differ, 0) << "pool slots, " << what;
  EXPECT_EQ(canaries_changed, 0) << "bytes outside the slots, " << what;
  EXPECT_FALSE(same_bytes(want.pool, c.pool)) << what;  // it wrote, so the checks could fail
}

TEST(CpuConvUpdate, PaddedPagesMatchDenseBitForBit) {
  for (const bool channel_first : {false, true}) {
    for (const DType pool_dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (const DType x_dtype : {DType::f32, DType::bf16}) {
        for (const std::int64_t taps : {1, 2, 4}) {
          UpdateSpec spec;
          spec.channel_first = channel_first;
          spec.pool_dtype = pool_dtype;
          spec.x_dtype = x_dtype;
          spec.taps = taps;
          spec.rows = taps == 1 ? 2 : taps;  // S >= K - 1
          const UpdateCase c = make_case(spec);
          for (CpuIsa isa : test::runnable_isas()) {
            ConvOptions o;
            o.isa = isa;
            expect_paged_matches_dense(
                c, o, 12, 37,
                std::string(channel_first ? "channel-first" : "channel-last") + ", pool " +
                    dtype_name(pool_dtype) + ", x " + dtype_name(x_dtype) +
                    ", K = " + std::to_string(taps) + ", " + cpu_isa_name(isa));
          }
        }
      }
    }
  }
}

// float64 x over a paged f64 pool: the dense pool's bytes, and out within 1e-12 of the float64
// reference conv from the slots' inputs.
TEST(CpuConvUpdate, Float64PagedPoolAgainstTheReference) {
  UpdateSpec spec;
  spec.x_dtype = spec.pool_dtype = DType::f64;
  const UpdateCase c = make_case(spec);
  expect_paged_matches_dense(c, {}, 3, 5, "f64");
  const std::int64_t n = static_cast<std::int64_t>(spec.lengths.size()), k = spec.taps;
  Tensor state(DType::f64, {n, k - 1, spec.channels});
  for (std::int64_t s = 0; s < n; ++s) {
    for (std::int64_t r = 0; r + 1 < k; ++r) {
      for (std::int64_t ch = 0; ch < spec.channels; ++ch) {
        state.data<double>()[(s * (k - 1) + r) * spec.channels + ch] =
            pool_at(c, c.pool, spec.slots[s], spec.rows - (k - 1) + r, ch);
      }
    }
  }
  const ConvForwardResult want = ref::causal_conv1d_fwd(
      {c.x.view(), c.weight.view(), c.bias.view(), state.view(), c.cu.view()});
  EXPECT_TRUE(test::within(run_dense(c, {}).out, want.out, 1e-12, "out against the reference"));
}

// ---------------------------------------------------------------------------------------------
// Refusals: each names its argument, and leaves the pool and out as they were.

struct UpdateCall {
  const UpdateCase& c;
  Tensor pool, out;
  ConvUpdateInputs in;
  MutableTensorView pool_view, out_view;
  std::vector<std::int64_t> slots;

  explicit UpdateCall(const UpdateCase& base) : c(base) {
    pool = Tensor(c.pool.dtype(), 3, c.pool.sizes());
    std::memcpy(pool.raw(), c.pool.raw(), c.pool.bytes());
    out = Tensor(c.spec.x_dtype, {c.tokens, c.spec.channels});
    std::memset(out.raw(), test::kSentinel, out.bytes());
    in = c.inputs();
    slots = c.spec.slots;
    in.state_indices = TensorView(slots.data(), {static_cast<std::int64_t>(slots.size())});
    pool_view = c.view(pool.raw(), c.slot_elements());
    out_view = out.mutable_view();
  }
};

using UpdateRule = test::Rule<UpdateCall>;

// The base case: 6 sequences over slots {5, 0, 2, 7, 3, 1} of 8, S = 3, D = 40, K = 4.
const std::vector<UpdateRule>& update_rules() {
  static const std::vector<UpdateRule> all = {
      {"InnerDimsNotDense",
       "conv_state",
       {"each slot one dense block: strides [*, 40, 1] (channel-last) or [*, 1, 3]",
        "strides [120, 1, 40]"},
       [](UpdateCall& u) {
         u.pool_view.strides[1] = 1;
         u.pool_view.strides[2] = 40;
       }},
      {"SlotStrideBelowASlot",
       "conv_state",
       {"a slot stride (dim 0) of at least one slot, 120 elements", "stride 119 with 8 slots"},
       [](UpdateCall& u) { u.pool_view.strides[0] = 119; }},
      {"SlotStrideZeroWithManySlots",
       "conv_state",
       {"0 only with num_slots = 1", "stride 0 with 8 slots"},
       [](UpdateCall& u) { u.pool_view.strides[0] = 0; }},
      {"SlotStrideNegative",
       "conv_state",
       {"a slot stride (dim 0) of at least one slot", "stride -120 with 8 slots"},
       [](UpdateCall& u) {
         u.pool_view.data = static_cast<float*>(u.pool_view.data) + 7 * 120;
         u.pool_view.strides[0] = -120;
       }},
      {"RowsBelowKMinus1",
       "conv_state",
       {"S >= K - 1 = 3", "[8, 2, 40]"},
       [](UpdateCall& u) { u.pool_view.sizes[1] = 2; }},
      {"PoolOverlapsOut",
       "out",
       {"memory that does not overlap 'conv_state'"},
       [](UpdateCall& u) { u.out_view.data = u.pool_view.data; }},
      {"PoolOverlapsX",
       "conv_state",
       {"does not overlap the input 'x'"},
       // x (fewer bytes) inside the pool's buffer: no other overlap.
       [](UpdateCall& u) { u.in.x.data = u.pool_view.data; }},
      {"SlotPastThePool",
       "state_indices",
       {"a slot in [0, 8)", "state_indices[3] = 8"},
       [](UpdateCall& u) { u.slots[3] = 8; }},
      {"SlotNegative",
       "state_indices",
       {"a slot in [0, 8)", "state_indices[0] = -1"},
       [](UpdateCall& u) { u.slots[0] = -1; }},
      {"SlotTwice",
       "state_indices",
       {"a distinct slot for every sequence", "sequences 1 and 4 both update slot 0"},
       [](UpdateCall& u) { u.slots[4] = 0; }},
      {"StateIndicesLength",
       "state_indices",
       {"[N] with N = 6", "[5]"},
       [](UpdateCall& u) { u.in.state_indices.sizes[0] = 5; }},
      {"PoolDtypeInteger",
       "conv_state",
       {"dtype f32, f64, bf16 or f16", "i32"},
       [](UpdateCall& u) { u.pool_view.dtype = DType::i32; }},
  };
  return all;
}

class ConvUpdateValidation : public ::testing::TestWithParam<UpdateRule> {};

TEST_P(ConvUpdateValidation, RejectsAndLeavesThePool) {
  const UpdateRule& rule = GetParam();
  const UpdateCase base = make_case(UpdateSpec{});
  UpdateCall u(base);
  rule.breaks(u);
  test::expect_rejected([&u] { conv_update(u.in, u.pool_view, u.out_view, {}); }, rule.name,
                        rule.argument, rule.words);
  EXPECT_TRUE(same_bytes(u.pool, u.c.pool)) << "pool changed";
  EXPECT_TRUE(test::hold_sentinel({&u.out})) << "out written";
}

INSTANTIATE_TEST_SUITE_P(ConvUpdate, ConvUpdateValidation, ::testing::ValuesIn(update_rules()),
                         test::RuleName());

// The unbroken call runs and writes (so the checks above can fail); one slot with stride 0.
TEST(ConvUpdateValidation, TheValidCallRunsAndOneSlotTakesStrideZero) {
  const UpdateCase base = make_case(UpdateSpec{});
  UpdateCall u(base);
  conv_update(u.in, u.pool_view, u.out_view, {});
  EXPECT_FALSE(same_bytes(u.pool, u.c.pool));
  UpdateSpec one;
  one.lengths = {2};
  one.slots = {0};
  one.num_slots = 1;
  const UpdateCase single = make_case(one);
  UpdateCall v(single);
  v.pool_view.strides[0] = 0;
  EXPECT_NO_THROW(conv_update(v.in, v.pool_view, v.out_view, {}));
  EXPECT_FALSE(same_bytes(v.pool, v.c.pool));
}

}  // namespace
}  // namespace gdn
