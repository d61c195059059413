// bug_classes_scale_test.cc: the size, indexing and padding bug classes that shipped in other
// GDN kernels (docs/peers.md, section 4: A5, B1, B3; issue 16), each as a test:
//   A5  gradients of a padding tail past cu_seqlens[N]: gdn has no such tail (cu_seqlens[N]
//       must equal T), so the call is refused with an error naming cu_seqlens and writes
//       nothing; a tail of empty sequences gets every gradient written;
//   B1  element offsets beyond 2^31 (strided views and state pools spread over 8 GiB of
//       address space that is never touched) and more than 65535 sequences in one call;
//   B3  a batched decode reading another sequence's parameter or slot: every sequence of a
//       batch against the float64 oracle on its own, and bit for bit equal to its step alone.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/compare.h"
#include "common/isas.h"
#include "common/problem.h"
#include "step_harness.h"

namespace gdn {
namespace {

constexpr std::int64_t k2Pow31 = std::int64_t{1} << 31;

// Address space for a view whose largest element offset passes 2^31: mapped without reserving
// memory (MAP_NORESERVE), so only the pages the op touches cost anything.
class SparseBuffer {
 public:
  explicit SparseBuffer(std::int64_t bytes) : bytes_(static_cast<std::size_t>(bytes)) {
    data_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (data_ == MAP_FAILED) data_ = nullptr;
  }
  ~SparseBuffer() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  SparseBuffer(const SparseBuffer&) = delete;
  SparseBuffer& operator=(const SparseBuffer&) = delete;
  float* floats() const { return static_cast<float*>(data_); }
  bool ok() const { return data_ != nullptr; }

 private:
  std::size_t bytes_;
  void* data_;
};

// A view of `rows` rows of `width` floats each, row r at r * stride: the last row lies past
// element 2^31 when stride * (rows - 1) does.
struct SpreadRows {
  SparseBuffer buffer;
  std::int64_t rows, width, stride;
  SpreadRows(std::int64_t r, std::int64_t w, std::int64_t s)
      : buffer(((r - 1) * s + w) * static_cast<std::int64_t>(sizeof(float))),
        rows(r),
        width(w),
        stride(s) {}
  float* row(std::int64_t r) const { return buffer.floats() + r * stride; }
  void fill_from(const Tensor& t) {  // t contiguous, rows x width
    for (std::int64_t r = 0; r < rows; ++r) {
      std::memcpy(row(r), t.data<float>() + r * width, width * sizeof(float));
    }
  }
  void fill_nan() {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < width; ++j) row(r)[j] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  bool equals(const Tensor& t) const {  // bit for bit
    for (std::int64_t r = 0; r < rows; ++r) {
      if (std::memcmp(row(r), t.data<float>() + r * width, width * sizeof(float)) != 0) {
        return false;
      }
    }
    return true;
  }
  // rows x sizes... as a view: dimension 0 strided, the rest contiguous within a row.
  TensorView view(std::initializer_list<std::int64_t> inner) const {
    return TensorView(mutable_view(inner));
  }
  MutableTensorView mutable_view(std::initializer_list<std::int64_t> inner) const {
    Dims sizes{}, strides{};
    sizes[0] = rows;
    int rank = 1;
    for (std::int64_t d : inner) sizes[rank++] = d;
    const Dims within = contiguous_strides(Dims{sizes[1], sizes[2], sizes[3], 0}, rank - 1);
    strides[0] = stride;
    for (int i = 1; i < rank; ++i) strides[i] = within[i - 1];
    return MutableTensorView(buffer.floats(), DType::f32, rank, sizes, strides);
  }
};

// B1 (fla #1080, #911, #818, #1082; mamba #883): the core op's forward (with residuals) and
// backward over views whose last token, chunk and gradient rows sit past element 2^31 (each
// view spans 8 GiB of address space) equal the same call on contiguous copies, bit for bit.
TEST(PeerBugB1, CoreForwardAndBackwardWithOffsetsPast2Pow31EqualContiguous) {
  test::ProblemSpec spec;
  spec.lengths = {5};
  spec.hk = spec.hv = 1;
  spec.dk = spec.dv = 16;
  spec.initial_state = true;
  spec.seed = 81;
  const test::Problem p = test::make_problem(spec);
  const test::Cotangents ct = test::make_cotangents(p, 82);
  ForwardOptions o = p.options();
  o.chunk_size = 1;  // five chunks: the residuals' last chunk lies past 2^31 too
  const std::int64_t rows = 5, stride = (k2Pow31 >> 2) + 64;  // 4 * stride > 2^31
  ASSERT_GT((rows - 1) * stride, k2Pow31);

  ForwardResult want = chunk_gated_delta_rule_fwd(p.inputs(), o, Residuals::all);
  BackwardInputs bin = BackwardInputs::from(p.inputs());
  bin.d_o = ct.d_o.view();
  bin.d_final_state = ct.d_ht.view();
  bin.chunk_states = want.chunk_states.view();
  bin.t_inv = want.t_inv.view();
  const BackwardResult want_grads = chunk_gated_delta_rule_bwd(bin, o);

  SpreadRows q(rows, 16, stride), k(rows, 16, stride), v(rows, 16, stride), g(rows, 1, stride),
      beta(rows, 1, stride), out(rows, 16, stride), states(rows, 256, stride),
      t_inv(rows, 1, stride), d_o(rows, 16, stride), dq(rows, 16, stride), dk(rows, 16, stride),
      dv(rows, 16, stride), dg(rows, 1, stride), dbeta(rows, 1, stride);
  for (const SpreadRows* r :
       {&q, &k, &v, &g, &beta, &out, &states, &t_inv, &d_o, &dq, &dk, &dv, &dg, &dbeta}) {
    ASSERT_TRUE(r->buffer.ok()) << "could not map 8 GiB of address space";
  }
  q.fill_from(p.q);
  k.fill_from(p.k);
  v.fill_from(p.v);
  g.fill_from(p.g);
  beta.fill_from(p.beta);
  d_o.fill_from(ct.d_o);
  for (SpreadRows* r : {&out, &states, &t_inv, &dq, &dk, &dv, &dg, &dbeta}) r->fill_nan();

  ForwardInputs in = p.inputs();
  in.q = q.view({1, 16});
  in.k = k.view({1, 16});
  in.v = v.view({1, 16});
  in.g = g.view({1});
  in.beta = beta.view({1});
  Tensor final_state(DType::f32, {1, 1, 16, 16});
  chunk_gated_delta_rule_fwd(in,
                             {out.mutable_view({1, 16}), final_state.mutable_view(),
                              states.mutable_view({1, 16, 16}), t_inv.mutable_view({1, 1, 1})},
                             o);
  EXPECT_TRUE(out.equals(want.o)) << "o";
  EXPECT_TRUE(states.equals(want.chunk_states)) << "chunk_states";
  EXPECT_TRUE(t_inv.equals(want.t_inv)) << "t_inv";
  EXPECT_EQ(0, std::memcmp(final_state.data<float>(), want.final_state.data<float>(),
                           256 * sizeof(float)))
      << "final_state";

  BackwardInputs spread = BackwardInputs::from(in);
  spread.d_o = d_o.view({1, 16});
  spread.d_final_state = ct.d_ht.view();
  spread.chunk_states = states.view({1, 16, 16});
  spread.t_inv = t_inv.view({1, 1, 1});
  Tensor dh0(DType::f32, {1, 1, 16, 16});
  chunk_gated_delta_rule_bwd(
      spread,
      {dq.mutable_view({1, 16}), dk.mutable_view({1, 16}), dv.mutable_view({1, 16}),
       dg.mutable_view({1}), dbeta.mutable_view({1}), dh0.mutable_view()},
      o);
  EXPECT_TRUE(dq.equals(want_grads.dq)) << "dq";
  EXPECT_TRUE(dk.equals(want_grads.dk)) << "dk";
  EXPECT_TRUE(dv.equals(want_grads.dv)) << "dv";
  EXPECT_TRUE(dg.equals(want_grads.dg)) << "dg";
  EXPECT_TRUE(dbeta.equals(want_grads.dbeta)) << "dbeta";
  EXPECT_EQ(0, std::memcmp(dh0.data<float>(), want_grads.d_initial_state.data<float>(),
                           256 * sizeof(float)))
      << "d_initial_state";
}

// B1 for the serving step: state pools of more than 2^21 slots of 1024 floats, so that the
// slots used (past 2^21) start past element 2^31, give the same out and slot contents as the
// same step over a 3-slot pool, bit for bit (decodes and a prefill; the pools' untouched pages
// cost nothing).
TEST(PeerBugB1, StepWithSlotsPast2Pow31ElementsEqualsSmallPool) {
  step_test::StepSpec spec;  // Hv 4, Dk = Dv = 16: 1024 floats per recurrent slot
  spec.decodes = {{1, 1, 12}};
  spec.prefills = {{9, 2, 5}};
  spec.num_slots = 3;
  spec.seed = 83;
  const step_test::StepProblem p = step_test::make_step_problem(spec);
  const StepOptions o = p.options();
  const step_test::StepResult want = step_test::run_step(p, o);

  const std::int64_t rec_slot = step_test::slot_numel(p.rec_pool);
  const std::int64_t conv_slot = step_test::slot_numel(p.conv_pool);
  const std::int64_t big_slots = k2Pow31 / rec_slot + 8;
  const std::int64_t far[3] = {0, big_slots - 5, big_slots - 2};  // small slot -> big slot
  ASSERT_GT(far[1] * rec_slot, k2Pow31);
  SparseBuffer conv(big_slots * conv_slot * 4), rec(big_slots * rec_slot * 4);
  ASSERT_TRUE(conv.ok() && rec.ok()) << "could not map the pools' address space";
  for (std::int64_t s = 1; s < 3; ++s) {
    std::memcpy(conv.floats() + far[s] * conv_slot, p.conv_pool.data<float>() + s * conv_slot,
                conv_slot * sizeof(float));
    std::memcpy(rec.floats() + far[s] * rec_slot, p.rec_pool.data<float>() + s * rec_slot,
                rec_slot * sizeof(float));
  }
  StepInputs in = p.inputs();
  const std::int64_t slots[2] = {far[1], far[2]};
  in.state_indices = TensorView(slots, {2});
  const StatePools pools{
      MutableTensorView(conv.floats(), DType::f32, {big_slots, spec.taps - 1, spec.channels()}),
      MutableTensorView(rec.floats(), DType::f32, {big_slots, spec.hv, spec.dk, spec.dv})};
  const Tensor out = fused_gdn_step(in, pools, o);
  EXPECT_EQ(0, std::memcmp(out.data<float>(), want.out.data<float>(),
                           static_cast<std::size_t>(out.numel()) * sizeof(float)))
      << "out";
  for (std::int64_t s = 1; s < 3; ++s) {
    EXPECT_EQ(0, std::memcmp(conv.floats() + far[s] * conv_slot,
                             want.conv_pool.data<float>() + s * conv_slot, conv_slot * 4))
        << "conv_state of slot " << far[s];
    EXPECT_EQ(0, std::memcmp(rec.floats() + far[s] * rec_slot,
                             want.rec_pool.data<float>() + s * rec_slot, rec_slot * 4))
        << "recurrent_state of slot " << far[s];
  }
}

// B1 (fla #1077, #1096 hit CUDA's 65535 grid limit): 65537 one-token sequences with initial
// states in one forward equal the float64 reference (first, middle and last sequences checked
// in full, every output finite), and the same call split in two, bit for bit.
TEST(PeerBugB1, ForwardOf65537SequencesEqualsReferenceAndTwoCalls) {
  test::ProblemSpec spec;
  spec.lengths.assign(65537, 1);
  spec.hk = spec.hv = 1;
  spec.dk = spec.dv = 4;
  spec.initial_state = true;
  spec.seed = 84;
  const test::Problem p = test::make_problem(spec);
  const ForwardOptions o = p.options();
  const ForwardResult whole = chunk_gated_delta_rule_fwd(p.inputs(), o);
  const ForwardResult ref64 = ref::recurrent_fwd(p.inputs(), o);
  EXPECT_TRUE(test::within(whole.o, ref64.o, 1e-4, "o, 65537 sequences"));
  EXPECT_TRUE(
      test::within(whole.final_state, ref64.final_state, 1e-4, "final_state, 65537 sequences"));
  const std::int64_t n = 65537, half = 32768, state = 16;
  for (int part = 0; part < 2; ++part) {
    const std::int64_t s0 = part == 0 ? 0 : half, s1 = part == 0 ? half : n;
    std::vector<std::int64_t> cu;
    for (std::int64_t s = s0; s <= s1; ++s) cu.push_back(s - s0);
    ForwardInputs in = p.inputs();
    const std::int64_t len = s1 - s0;
    in.q = TensorView(p.q.data<float>() + s0 * 4, {len, 1, 4});
    in.k = TensorView(p.k.data<float>() + s0 * 4, {len, 1, 4});
    in.v = TensorView(p.v.data<float>() + s0 * 4, {len, 1, 4});
    in.g = TensorView(p.g.data<float>() + s0, {len, 1});
    in.beta = TensorView(p.beta.data<float>() + s0, {len, 1});
    in.initial_state = TensorView(p.h0.data<float>() + s0 * state, {len, 1, 4, 4});
    in.cu_seqlens = TensorView(cu.data(), {len + 1});
    const ForwardResult r = chunk_gated_delta_rule_fwd(in, o);
    EXPECT_EQ(0, std::memcmp(r.o.data<float>(), whole.o.data<float>() + s0 * 4,
                             static_cast<std::size_t>(len * 4) * sizeof(float)))
        << "o of part " << part;
    EXPECT_EQ(0,
              std::memcmp(r.final_state.data<float>(), whole.final_state.data<float>() + s0 * state,
                          static_cast<std::size_t>(len * state) * sizeof(float)))
        << "final states of part " << part;
  }
}

// B1 for the step: 65537 decodes in one step (each in its own slot) against the oracle, the
// float64 reference step included (step_harness.h checks every sequence on its own).
TEST(PeerBugB1, StepOf65537DecodesMatchesOracle) {
  step_test::StepSpec spec;
  spec.hk = spec.hv = 1;
  spec.dk = spec.dv = 4;
  spec.taps = 2;
  for (std::int64_t s = 0; s < 65537; ++s) spec.decodes.push_back({1, 1 + s, 3 + s % 5});
  spec.num_slots = 65538;
  spec.seed = 85;
  step_test::check_case(step_test::make_step_problem(spec));
}

// B3 (SGLang shipped a decode kernel that read sequence 0's beta for every sequence): 24
// decodes and 2 prefills whose slots run in scrambled order over 64 slots, every one with its
// own a, b and history, against the oracle sequence by sequence on every ISA variant; and each
// decode's out row and slots equal the same decode run alone, bit for bit.
TEST(PeerBugB3, EverySequenceOfABatchedDecodeReadsItsOwnParametersAndSlot) {
  step_test::StepSpec spec;
  for (std::int64_t s = 0; s < 24; ++s) {
    spec.decodes.push_back({1, 1 + (s * 37) % 61, s % 3 == 0 ? 0 : 4 + s});
  }
  spec.prefills = {{7, 62, 3}, {5, 63, 0}};
  spec.num_slots = 64;
  spec.seed = 86;
  const step_test::StepProblem p = step_test::make_step_problem(spec);
  step_test::check_case(p);

  const step_test::StepResult batch = step_test::run_step(p, p.options());
  const std::int64_t width = spec.hv * spec.dv;
  for (std::int64_t s = 0; s < 24; ++s) {
    // Token row s of the batch as the one token of a step of its own.
    const std::int64_t qsl[2] = {0, 1}, dist[3] = {1, 1, 1};
    StepInputs in = p.inputs();
    in.qkv = step_test::rows(p.qkv, s, 1);
    in.a = step_test::rows(p.a, s, 1);
    in.b = step_test::rows(p.b, s, 1);
    in.query_start_loc = TensorView(qsl, {2});
    in.state_indices = TensorView(&p.state_indices[s], {1});
    in.seq_lens = TensorView(&p.seq_lens[s], {1});
    in.distribution = TensorView(dist, {3});
    Tensor conv = step_test::clone(p.conv_pool), rec = step_test::clone(p.rec_pool);
    const Tensor out = fused_gdn_step(in, {conv.mutable_view(), rec.mutable_view()}, p.options());
    const std::int64_t slot = p.state_indices[s];
    EXPECT_EQ(0, std::memcmp(out.data<float>(), batch.out.data<float>() + s * width,
                             width * sizeof(float)))
        << "out of decode " << s << " (slot " << slot << ")";
    EXPECT_TRUE(step_test::rows_identical(rec, batch.rec_pool, slot, 1))
        << "recurrent_state of decode " << s << " (slot " << slot << ")";
    EXPECT_TRUE(step_test::rows_identical(conv, batch.conv_pool, slot, 1))
        << "conv_state of decode " << s << " (slot " << slot << ")";
  }
}

// A5 (FlashQLA #28: fla's varlen backward left the gradients past cu_seqlens[-1] unwritten):
// a padding tail is refused, not half-served. The backward with cu_seqlens[N] < T throws
// gdn::InvalidArgument naming cu_seqlens and leaves every gradient buffer (NaN before the call)
// untouched; the same for the layer op's backward.
TEST(PeerBugA5, PaddingTailPastCuSeqlensIsRefusedAndNothingWritten) {
  test::ProblemSpec spec;
  spec.lengths = {7, 9};
  spec.seed = 87;
  const test::Problem p = test::make_problem(spec);
  const test::Cotangents ct = test::make_cotangents(p, 88);
  std::int64_t short_cu[3] = {0, 7, 12};  // 4 tokens of padding after cu_seqlens[2]
  BackwardInputs in = BackwardInputs::from(p.inputs());
  in.cu_seqlens = TensorView(short_cu, {3});
  in.d_o = ct.d_o.view();
  const BackwardResult shapes = chunk_gated_delta_rule_bwd(
      [&] {
        BackwardInputs ok = in;
        ok.cu_seqlens = p.cu_seqlens.view();
        return ok;
      }(),
      p.options());
  std::vector<Tensor> grads;
  for (const Tensor* t : {&shapes.dq, &shapes.dk, &shapes.dv, &shapes.dg, &shapes.dbeta}) {
    Tensor nan(t->dtype(), t->rank(), t->sizes());
    for (std::int64_t i = 0; i < nan.numel(); ++i) {
      nan.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    }
    grads.push_back(std::move(nan));
  }
  const std::vector<Tensor> before = [&] {
    std::vector<Tensor> c;
    for (const Tensor& t : grads) c.push_back(step_test::clone(t));
    return c;
  }();
  try {
    chunk_gated_delta_rule_bwd(in,
                               {grads[0].mutable_view(),
                                grads[1].mutable_view(),
                                grads[2].mutable_view(),
                                grads[3].mutable_view(),
                                grads[4].mutable_view(),
                                {}},
                               p.options());
    ADD_FAILURE() << "a backward with cu_seqlens[N] = 12 < T = 16 was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("cu_seqlens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cu_seqlens[N] = T = 16"), std::string::npos) << e.what();
  }
  for (std::size_t i = 0; i < grads.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(grads[i].raw(), before[i].raw(),
                             static_cast<std::size_t>(grads[i].numel()) * sizeof(float)))
        << "gradient " << i << " was written by a refused call";
  }
}

// A5, the other side: a batch whose last sequences are empty (the nearest gdn has to a tail)
// gets every gradient written: the buffers hold NaN before the call and only finite values
// after it, the empty sequences' d_initial_state is their d_final_state (the state passes
// through), and the gradients match the float64 reference.
TEST(PeerBugA5, TrailingEmptySequencesGetEveryGradientWritten) {
  test::ProblemSpec spec;
  spec.lengths = {9, 7, 0, 0};
  spec.initial_state = true;
  spec.seed = 89;
  const test::Problem p = test::make_problem(spec);
  const test::Cotangents ct = test::make_cotangents(p, 90);
  BackwardInputs in = BackwardInputs::from(p.inputs());
  in.d_o = ct.d_o.view();
  in.d_final_state = ct.d_ht.view();
  const BackwardResult want = ref::recurrent_bwd(in, p.options());
  for (CpuIsa isa : test::runnable_isas()) {
    ForwardOptions o = p.options();
    o.isa = isa;
    std::vector<Tensor> got;
    for (const Tensor* t :
         {&want.dq, &want.dk, &want.dv, &want.dg, &want.dbeta, &want.d_initial_state}) {
      Tensor nan(DType::f32, t->rank(), t->sizes());
      for (std::int64_t i = 0; i < nan.numel(); ++i) {
        nan.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
      }
      got.push_back(std::move(nan));
    }
    chunk_gated_delta_rule_bwd(
        in,
        {got[0].mutable_view(), got[1].mutable_view(), got[2].mutable_view(), got[3].mutable_view(),
         got[4].mutable_view(), got[5].mutable_view()},
        o);
    const char* names[6] = {"dq", "dk", "dv", "dg", "dbeta", "d_initial_state"};
    const Tensor* wants[6] = {&want.dq, &want.dk,    &want.dv,
                              &want.dg, &want.dbeta, &want.d_initial_state};
    for (int i = 0; i < 6; ++i) {
      EXPECT_TRUE(
          test::within(got[i], *wants[i], 1e-4, std::string(names[i]) + ", " + cpu_isa_name(isa)));
    }
    const std::int64_t state = spec.hv * spec.dk * spec.dv;
    for (std::int64_t s = 2; s < 4; ++s) {
      EXPECT_EQ(0, std::memcmp(got[5].data<float>() + s * state, ct.d_ht.data<float>() + s * state,
                               state * sizeof(float)))
          << "d_initial_state of empty sequence " << s << ", " << cpu_isa_name(isa);
    }
  }
}

}  // namespace
}  // namespace gdn
