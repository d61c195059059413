// validate_test.cc: every bad argument is a gdn::InvalidArgument that names the argument,
// says what was expected and what was given, and leaves every output untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "common/problem.h"

namespace gdn {
namespace {

using test::make_problem;
using test::Problem;
using test::ProblemSpec;

// A valid problem with preallocated outputs filled with a sentinel byte pattern.
struct Fixture {
  Problem p;
  Tensor o, ht, chunk_states, t_inv;
  ForwardInputs in;
  ForwardOutputs out;
  ForwardOptions options;

  Fixture() {
    ProblemSpec spec;
    spec.lengths = {40, 0, 30};
    spec.hk = 2;
    spec.hv = 4;
    spec.dk = 16;
    spec.dv = 8;
    spec.initial_state = true;
    p = make_problem(spec);
    in = p.inputs();
    options.chunk_size = 16;
    const ForwardShape shape = forward_shape(in, options);
    o = Tensor(DType::f32, 3, shape.o_sizes());
    ht = Tensor(DType::f32, 4, shape.state_sizes());
    chunk_states = Tensor(DType::f32, 4, shape.chunk_states_sizes());
    t_inv = Tensor(DType::f32, 4, shape.t_inv_sizes());
    for (Tensor* t : {&o, &ht, &chunk_states, &t_inv}) std::memset(t->raw(), 0xA5, t->bytes());
    out = {o.mutable_view(), ht.mutable_view(), chunk_states.mutable_view(), t_inv.mutable_view()};
  }

  bool outputs_untouched() const {
    for (const Tensor* t : {&o, &ht, &chunk_states, &t_inv}) {
      const auto* b = static_cast<const unsigned char*>(t->raw());
      for (std::size_t i = 0; i < t->bytes(); ++i) {
        if (b[i] != 0xA5) return false;
      }
    }
    return true;
  }
};

// Runs `mutate` on a fresh setup, calls the op (CPU and reference) and checks the error.
void expect_invalid(const std::string& argument, const std::vector<std::string>& fragments,
                    const std::function<void(Fixture&)>& mutate) {
  for (int which = 0; which < 2; ++which) {
    Fixture s;
    mutate(s);
    try {
      if (which == 0) {
        chunk_gated_delta_rule_fwd(s.in, s.out, s.options);
      } else {
        ForwardOutputs out64;  // the reference checks inputs before outputs: same message
        Tensor o64(DType::f64, 3, s.o.sizes()), ht64(DType::f64, 4, s.ht.sizes());
        out64.o = o64.mutable_view();
        out64.final_state = ht64.mutable_view();
        if (argument == "o" || argument == "final_state" || argument == "chunk_states" ||
            argument == "t_inv") {
          continue;  // output checks differ for the reference (f64 outputs)
        }
        if (argument == "options.algorithm" || argument == "options.isa") {
          continue;  // the reference ignores both (gdn/reference.h)
        }
        ref::recurrent_fwd(s.in, out64, s.options);
      }
      ADD_FAILURE() << "no error for a bad '" << argument << "' (" << (which ? "reference" : "cpu")
                    << ")";
    } catch (const InvalidArgument& e) {
      EXPECT_EQ(e.argument(), argument) << e.what();
      const std::string what = e.what();
      EXPECT_NE(what.find("argument '" + argument + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("expected"), std::string::npos) << what;
      EXPECT_NE(what.find("given"), std::string::npos) << what;
      for (const std::string& f : fragments)
        EXPECT_NE(what.find(f), std::string::npos) << "'" << f << "' not in: " << what;
    }
    EXPECT_TRUE(s.outputs_untouched())
        << "an output was written before the '" << argument << "' error";
  }
}

TEST(Validation, ValidSetupRuns) {
  Fixture s;
  chunk_gated_delta_rule_fwd(s.in, s.out, s.options);
  EXPECT_FALSE(s.outputs_untouched());
}

TEST(Validation, Q) {
  expect_invalid("q", {"rank 3", "rank 2"}, [](Fixture& s) { s.in.q.rank = 2; });
  expect_invalid("q", {"f32, f64, bf16 or f16", "i64"},
                 [](Fixture& s) { s.in.q.dtype = DType::i64; });
  expect_invalid("q", {"Dk in [1, 256]", "300"}, [](Fixture& s) { s.in.q.sizes[2] = 300; });
  expect_invalid("q", {"non-null"}, [](Fixture& s) { s.in.q.data = nullptr; });
  expect_invalid("q", {"non-negative"}, [](Fixture& s) { s.in.q.sizes[0] = -1; });
  expect_invalid("q", {"Hk >= 1"}, [](Fixture& s) { s.in.q.sizes[1] = 0; });
}

TEST(Validation, KAndV) {
  expect_invalid("k", {"equal to q", "[70, 2, 16]", "[70, 2, 8]"},
                 [](Fixture& s) { s.in.k.sizes[2] = 8; });
  expect_invalid("k", {"f32", "f64"}, [](Fixture& s) { s.in.k.dtype = DType::f64; });
  expect_invalid("v", {"multiple of Hk = 2", "Hv = 3"}, [](Fixture& s) { s.in.v.sizes[1] = 3; });
  expect_invalid("v", {"[70]", "[69, 4, 8]"}, [](Fixture& s) { s.in.v.sizes[0] = 69; });
  expect_invalid("v", {"Dv in [1, 256]", "Dv = 0"}, [](Fixture& s) { s.in.v.sizes[2] = 0; });
  expect_invalid("v", {"rank 3"}, [](Fixture& s) { s.in.v.rank = 4; });
}

TEST(Validation, GatesAndState) {
  expect_invalid("g", {"[T, Hv]", "[70, 4]", "[70, 2]"}, [](Fixture& s) { s.in.g.sizes[1] = 2; });
  expect_invalid("beta", {"f32"}, [](Fixture& s) { s.in.beta.dtype = DType::f64; });
  expect_invalid("initial_state", {"[N, Hv, Dk, Dv]", "[3, 4, 16, 8]", "[2, 4, 16, 8]"},
                 [](Fixture& s) { s.in.initial_state.sizes[0] = 2; });
}

TEST(Validation, CuSeqlens) {
  static std::vector<std::int64_t> values;
  auto with = [](std::vector<std::int64_t> v) {
    return [v](Fixture& s) {
      values = v;
      s.in.cu_seqlens = TensorView(values.data(), {static_cast<std::int64_t>(values.size())});
    };
  };
  expect_invalid("cu_seqlens", {"cu_seqlens[0] = 0", "5"}, with({5, 40, 70}));
  expect_invalid("cu_seqlens", {"non-decreasing", "cu_seqlens[2] = 30 < cu_seqlens[1] = 40"},
                 with({0, 40, 30, 70}));
  expect_invalid("cu_seqlens", {"cu_seqlens[N] = T = 70", "68"}, with({0, 40, 68}));
  expect_invalid("cu_seqlens", {"values <= T = 70", "90"}, with({0, 90, 70}));
  expect_invalid("cu_seqlens", {"N >= 1", "[1]"}, with({0}));
  expect_invalid("cu_seqlens", {"i64", "i32"},
                 [](Fixture& s) { s.in.cu_seqlens.dtype = DType::i32; });
}

TEST(Validation, Options) {
  // 0 lets the tiling plan choose (tests/cpu/plan_test.cc); below 0 is an error.
  expect_invalid("options.chunk_size",
                 {"0 (the tiling plan chooses) or an integer in [1, 256]", "-1"},
                 [](Fixture& s) { s.options.chunk_size = -1; });
  expect_invalid("options.chunk_size", {"[1, 256]", "512"},
                 [](Fixture& s) { s.options.chunk_size = 512; });
  expect_invalid("options.scale", {"finite", "nan"},
                 [](Fixture& s) { s.options.scale = std::nan(""); });
  expect_invalid("options.threads", {"0 (all cores) to 1024", "-2"},
                 [](Fixture& s) { s.options.threads = -2; });
  expect_invalid("options.threads", {"0 (all cores) to 1024", "100000"},
                 [](Fixture& s) { s.options.threads = 100000; });
  expect_invalid("options.scale", {"representable in float32", "1e+300"},
                 [](Fixture& s) { s.options.scale = 1e300; });
  expect_invalid("options.algorithm", {"automatic, chunked or recurrent", "9"},
                 [](Fixture& s) { s.options.algorithm = static_cast<Algorithm>(9); });
  expect_invalid("options.isa", {"automatic, generic, avx2, avx512 or avx512_bf16", "9"},
                 [](Fixture& s) { s.options.isa = static_cast<CpuIsa>(9); });
}

TEST(Validation, Outputs) {
  expect_invalid("o", {"absent"}, [](Fixture& s) { s.out.o = {}; });
  expect_invalid("o", {"[T, Hv, Dv]", "[70, 4, 8]"}, [](Fixture& s) { s.out.o.sizes[1] = 5; });
  expect_invalid("o", {"dtype f32", "f64"}, [](Fixture& s) { s.out.o.dtype = DType::f64; });
  expect_invalid("final_state", {"[N, Hv, Dk, Dv]"},
                 [](Fixture& s) { s.out.final_state.sizes[3] = 9; });
  expect_invalid("chunk_states", {"[total_chunks, Hv, Dk, Dv]", "[5, 4, 16, 8]"},
                 [](Fixture& s) { s.out.chunk_states.sizes[0] = 4; });
  expect_invalid("t_inv", {"[total_chunks, Hv, C, C]", "[5, 4, 16, 16]", "[5, 4, 16, 8]"},
                 [](Fixture& s) { s.out.t_inv.sizes[3] = 8; });
  expect_invalid("t_inv", {"recurrent"},
                 [](Fixture& s) { s.options.algorithm = Algorithm::recurrent; });
  expect_invalid("o", {"own address"}, [](Fixture& s) { s.out.o.strides[1] = 0; });
}

TEST(Validation, Aliasing) {
  expect_invalid("o", {"does not overlap the input 'v'"},
                 [](Fixture& s) { s.out.o.data = const_cast<void*>(s.in.v.data); });
  expect_invalid("o", {"does not overlap 'final_state'"},
                 [](Fixture& s) { s.out.final_state.data = s.out.o.data; });
  expect_invalid("final_state", {"exactly the view of initial_state"}, [](Fixture& s) {
    // Overlapping initial_state but not the same view: shifted by one element (the tensor's
    // allocation is padded to whole cache lines, and nothing is written on error anyway).
    s.out.final_state.data = static_cast<float*>(const_cast<void*>(s.in.initial_state.data)) + 1;
  });
}

// Views that no framework would produce: impossible ranks, misaligned pointers, sizes whose
// element count or byte offsets overflow.
TEST(Validation, MalformedViews) {
  expect_invalid("q", {"rank from 0 (absent) to 4", "100000"},
                 [](Fixture& s) { s.in.q.rank = 100000; });
  expect_invalid("v", {"rank from 0 (absent) to 4", "5"}, [](Fixture& s) { s.in.v.rank = 5; });
  expect_invalid("cu_seqlens", {"rank from 0 (absent) to 4", "9"},
                 [](Fixture& s) { s.in.cu_seqlens.rank = 9; });
  expect_invalid("o", {"rank from 0 (absent) to 4", "9"}, [](Fixture& s) { s.out.o.rank = 9; });
  expect_invalid("final_state", {"rank from 0 (absent) to 4", "-1"},
                 [](Fixture& s) { s.out.final_state.rank = -1; });
  expect_invalid("q", {"aligned to 4 bytes (f32)"},
                 [](Fixture& s) { s.in.q.data = static_cast<const char*>(s.in.q.data) + 2; });
  expect_invalid("o", {"aligned to 4 bytes (f32)"},
                 [](Fixture& s) { s.out.o.data = static_cast<char*>(s.out.o.data) + 1; });
  expect_invalid("k", {"byte offsets that fit in int64"},
                 [](Fixture& s) { s.in.k.strides[0] = std::int64_t{1} << 62; });
  expect_invalid("q", {"element count that fits in int64"}, [](Fixture& s) {
    s.in.q.sizes = {std::int64_t{1} << 40, std::int64_t{1} << 30, 16, 0};
  });
}

// The allocating API never allocates a tensor whose byte size does not fit.
TEST(Validation, HugeAllocationIsRefused) {
  EXPECT_THROW(Tensor(DType::f64, {std::int64_t{1} << 31, std::int64_t{1} << 30, 4}),
               InvalidArgument);
  EXPECT_THROW(Tensor(DType::f32, {std::int64_t{1} << 62, 4}), InvalidArgument);
  // T = 0 with absurd head counts passes validation (nothing to read), but the final states
  // it implies cannot be allocated: a clear error, not a wrapped size.
  std::vector<std::int64_t> cu(33, 0);
  const std::int64_t hv = std::int64_t{1} << 40;
  ForwardInputs in;
  in.q = TensorView(static_cast<const double*>(nullptr), {0, 1, 256});
  in.k = in.q;
  in.v = TensorView(static_cast<const double*>(nullptr), {0, hv, 256});
  in.g = TensorView(static_cast<const double*>(nullptr), {0, hv});
  in.beta = in.g;
  in.cu_seqlens = TensorView(cu.data(), {33});
  EXPECT_THROW(chunk_gated_delta_rule_fwd(in, ForwardOptions{}), InvalidArgument);
  EXPECT_THROW(ref::recurrent_fwd(in, ForwardOptions{}), InvalidArgument);
}

// Gradients written into one fused buffer: dq and dk interleaved row by row share no element
// (accepted); shifted by one element they would (rejected).
TEST(Validation, InterleavedOutputsAreExact) {
  ProblemSpec spec;
  spec.lengths = {33};
  spec.hk = 2;
  spec.hv = 2;
  spec.dk = 8;
  spec.dv = 8;
  const Problem p = make_problem(spec);
  const test::Cotangents c = test::make_cotangents(p, 3);
  BackwardInputs in = BackwardInputs::from(p.inputs());
  in.d_o = c.d_o.view();
  const std::int64_t t = 33, row = 2 * 2 * 8;  // [T, (q | k), Hk, Dk]
  std::vector<float> fused(t * row + 1);
  Tensor dv(DType::f32, {t, 2, 8}), dg(DType::f32, {t, 2}), dbeta(DType::f32, {t, 2});
  BackwardOutputs out{MutableTensorView(fused.data(), {t, 2, 8}, {row, 8, 1}),
                      MutableTensorView(fused.data() + 16, {t, 2, 8}, {row, 8, 1}),
                      dv.mutable_view(),
                      dg.mutable_view(),
                      dbeta.mutable_view(),
                      {}};
  EXPECT_NO_THROW(chunk_gated_delta_rule_bwd(in, out, ForwardOptions{}));
  const BackwardResult separate = chunk_gated_delta_rule_bwd(in, ForwardOptions{});
  for (std::int64_t i = 0; i < t; ++i) {
    EXPECT_EQ(
        std::memcmp(fused.data() + i * row, separate.dq.data<float>() + i * 16, 16 * sizeof(float)),
        0);
    EXPECT_EQ(std::memcmp(fused.data() + i * row + 16, separate.dk.data<float>() + i * 16,
                          16 * sizeof(float)),
              0);
  }
  out.dk = MutableTensorView(fused.data() + 15, {t, 2, 8}, {row, 8, 1});
  try {
    chunk_gated_delta_rule_bwd(in, out, ForwardOptions{});
    ADD_FAILURE() << "overlapping dq and dk accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "dq");
  }
}

TEST(Validation, BatchedLayoutRejectsCuSeqlens) {
  ProblemSpec spec;
  spec.lengths = {8, 8};
  spec.batched = true;
  const Problem p = make_problem(spec);
  std::vector<std::int64_t> cu = {0, 8, 16};
  ForwardInputs in = p.inputs();
  in.cu_seqlens = TensorView(cu.data(), {3});
  try {
    chunk_gated_delta_rule_fwd(in, ForwardOptions{});
    ADD_FAILURE() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.argument(), "cu_seqlens");
  }
}

}  // namespace
}  // namespace gdn
