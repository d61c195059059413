// step_strided_test.cc: the serving step (gdn/step.h) over state pools carved from one larger
// buffer the way vLLM's hybrid allocator carves them: slot x of both pools in page x of the
// buffer, the conv slot at some byte of the page, the recurrent slot after it (a storage offset)
// and padding after both, so that the pools' slot strides are the page and the pools interleave
// without sharing a byte. Every result (out and every slot) must be bit-identical to the same
// step over contiguous pools, on every compiled ISA variant and for the float64 reference, and
// no byte outside the slots (the padding, the gap between the pools) may change. Plus the
// validation of such pools: thousands of interleaved slots pass, overlapping ones are refused
// with the pools left as they were.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/validation.h"
#include "step_harness.h"

namespace gdn {
namespace {

using namespace step_test;

constexpr unsigned char kCanary = 0x5A;

// Where each pool's slot lies in a page, in bytes (multiples of 8, so that every dtype stays
// aligned): the conv slot at conv_at, the recurrent slot at rec_at, pages `page` bytes apart.
struct PageLayout {
  std::int64_t conv_at = 0, rec_at = 0, page = 0;
};

// The layout vLLM's allocator gives (conv slot first, the recurrent slot right after it: the
// storage offset is the conv slot's bytes), with `lead` bytes before the conv slot, `gap`
// between the slots and `pad` after them.
PageLayout layout_of(const Tensor& conv, const Tensor& rec, std::int64_t lead, std::int64_t gap,
                     std::int64_t pad) {
  auto up8 = [](std::int64_t x) { return (x + 7) / 8 * 8; };
  const std::int64_t conv_bytes =
      slot_numel(conv) * static_cast<std::int64_t>(dtype_size(conv.dtype()));
  const std::int64_t rec_bytes =
      slot_numel(rec) * static_cast<std::int64_t>(dtype_size(rec.dtype()));
  PageLayout l;
  l.conv_at = lead;
  l.rec_at = up8(lead + conv_bytes + gap);
  l.page = up8(l.rec_at + rec_bytes + pad);
  return l;
}

// Both pools in one buffer of pages, every other byte the canary.
struct PagedPools {
  PageLayout layout;
  std::int64_t slots = 0, conv_bytes = 0, rec_bytes = 0;
  std::vector<double> storage;  // 8-byte aligned
  MutableTensorView conv, rec;

  PagedPools(const Tensor& conv0, const Tensor& rec0, const PageLayout& l) : layout(l) {
    slots = conv0.size(0);
    conv_bytes = slot_numel(conv0) * static_cast<std::int64_t>(dtype_size(conv0.dtype()));
    rec_bytes = slot_numel(rec0) * static_cast<std::int64_t>(dtype_size(rec0.dtype()));
    storage.resize(static_cast<std::size_t>(slots * l.page / 8));
    std::memset(bytes(), kCanary, static_cast<std::size_t>(slots * l.page));
    for (std::int64_t x = 0; x < slots; ++x) {
      std::memcpy(bytes() + x * l.page + l.conv_at,
                  static_cast<const char*>(conv0.raw()) + x * conv_bytes,
                  static_cast<std::size_t>(conv_bytes));
      std::memcpy(bytes() + x * l.page + l.rec_at,
                  static_cast<const char*>(rec0.raw()) + x * rec_bytes,
                  static_cast<std::size_t>(rec_bytes));
    }
    conv = view_of(conv0, l.conv_at);
    rec = view_of(rec0, l.rec_at);
  }
  char* bytes() { return reinterpret_cast<char*>(storage.data()); }
  const char* bytes() const { return reinterpret_cast<const char*>(storage.data()); }

  // A pool's view: its own sizes, the page as slot stride, inner dims row-major.
  MutableTensorView view_of(const Tensor& pool, std::int64_t at) {
    const auto elem = static_cast<std::int64_t>(dtype_size(pool.dtype()));
    Dims strides = contiguous_strides(pool.sizes(), pool.rank());
    strides[0] = layout.page / elem;
    return MutableTensorView(bytes() + at, pool.dtype(), pool.rank(), pool.sizes(), strides);
  }
  // A pool's slots back as a contiguous tensor shaped like `like`.
  Tensor unpaged(const Tensor& like, std::int64_t at, std::int64_t slot_bytes) const {
    Tensor t(like.dtype(), like.rank(), like.sizes());
    for (std::int64_t x = 0; x < slots; ++x) {
      std::memcpy(static_cast<char*>(t.raw()) + x * slot_bytes, bytes() + x * layout.page + at,
                  static_cast<std::size_t>(slot_bytes));
    }
    return t;
  }
  // The number of bytes outside every slot that are no longer the canary.
  std::int64_t canaries_changed() const {
    std::int64_t changed = 0;
    for (std::int64_t x = 0; x < slots; ++x) {
      for (std::int64_t b = 0; b < layout.page; ++b) {
        const bool in_conv = b >= layout.conv_at && b < layout.conv_at + conv_bytes;
        const bool in_rec = b >= layout.rec_at && b < layout.rec_at + rec_bytes;
        if (!in_conv && !in_rec &&
            static_cast<unsigned char>(bytes()[x * layout.page + b]) != kCanary) {
          ++changed;
        }
      }
    }
    return changed;
  }
};

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.bytes() == b.bytes() && std::memcmp(a.raw(), b.raw(), a.bytes()) == 0;
}

// The step over paged pools against the same step over contiguous pools (run_step): out and
// both pools bit-identical, no canary changed.
void expect_paged_matches_contiguous(const StepProblem& p, const StepOptions& o, bool reference,
                                     const PageLayout& l, const std::string& what) {
  const StepResult want = run_step(p, o, reference);
  PagedPools paged(p.conv_pool, p.rec_pool, l);
  Tensor out(p.spec.dtype, {p.tokens, p.spec.hv * p.spec.dv});
  for (std::int64_t i = 0; i < out.numel(); ++i) set_value(out, i, kNaN);
  const StatePools pools{paged.conv, paged.rec};
  if (reference) {
    ref::fused_gdn_step(p.inputs(), pools, out.mutable_view(), o);
  } else {
    fused_gdn_step(p.inputs(), pools, out.mutable_view(), o);
  }
  EXPECT_TRUE(same_bytes(out, want.out)) << "out, " << what;
  EXPECT_TRUE(same_bytes(paged.unpaged(p.conv_pool, l.conv_at, paged.conv_bytes), want.conv_pool))
      << "conv_state slots, " << what;
  EXPECT_TRUE(same_bytes(paged.unpaged(p.rec_pool, l.rec_at, paged.rec_bytes), want.rec_pool))
      << "recurrent_state slots, " << what;
  EXPECT_EQ(paged.canaries_changed(), 0) << "bytes outside the slots changed, " << what;
  // The step wrote something, so the comparison above could fail.
  EXPECT_FALSE(same_bytes(want.rec_pool, p.rec_pool)) << what;
}

// 6 decodes (one fresh), a fresh prefill, a continuation, a one-token prefill, padding.
StepSpec mixed() {
  StepSpec spec;
  spec.num_slots = 14;
  spec.decodes = {{1, 3, 7}, {1, 1, 2}, {1, 12, 0}, {1, 5, 30}, {1, 6, 1}, {1, 9, 4}};
  spec.prefills = {{37, 11, 0}, {1, 2, 0}};
  spec.continued = {{65, 10, 100}};
  spec.padding = {{2, -1}};
  spec.trailing = 2;
  return spec;
}

std::vector<std::pair<std::string, StepSpec>> cases() {
  std::vector<std::pair<std::string, StepSpec>> all;
  StepSpec decode;  // 16 one-token decodes
  decode.num_slots = 20;
  for (std::int64_t s = 0; s < 16; ++s) decode.decodes.push_back({1, 19 - s, s % 3 == 0 ? 0 : 8});
  all.emplace_back("decode", decode);
  StepSpec prefill;
  prefill.num_slots = 6;
  prefill.prefills = {{70, 4, 0}, {33, 1, 0}};
  all.emplace_back("prefill", prefill);
  StepSpec chunked;
  chunked.num_slots = 6;
  chunked.continued = {{65, 2, 64}, {9, 5, 130}};
  all.emplace_back("chunked continuation", chunked);
  all.emplace_back("mixed batch", mixed());
  all.emplace_back("num_spec windows", speculative_spec());
  return all;
}

struct Pools {
  bool conv, rec;  // bf16
  const char* name;
};
const Pools kPoolDtypes[] = {{false, false, "f32 / f32"},
                             {true, true, "bf16 / bf16"},
                             {true, false, "bf16 / f32"},
                             {false, true, "f32 / bf16"}};

// Paged pools (a lead, a gap between the conv and recurrent slots, padding after: odd byte
// counts rounded to 8) give the contiguous pools' bytes: every batch shape, every pool dtype,
// f32 and bf16 activations, every ISA variant.
TEST(CpuStepStridedPools, InterleavedPagesMatchContiguousBitForBit) {
  for (const auto& [name, base] : cases()) {
    for (const Pools& pools : kPoolDtypes) {
      for (const DType activations : {DType::f32, DType::bf16}) {
        StepSpec spec = base;
        spec.bf16_conv_pool = pools.conv;
        spec.bf16_rec_pool = pools.rec;
        StepProblem p = make_step_problem(spec);
        if (activations != DType::f32) {  // the same values rounded to bf16
          p.spec.dtype = activations;
          for (Tensor* t : {&p.qkv, &p.a, &p.b}) {
            Tensor r(activations, t->rank(), t->sizes());
            for (std::int64_t i = 0; i < t->numel(); ++i) set_value(r, i, t->data<float>()[i]);
            *t = std::move(r);
          }
        }
        const PageLayout l = layout_of(p.conv_pool, p.rec_pool, 24, 40, 200);
        for (CpuIsa isa : compiled_isas()) {
          StepOptions o = p.options();
          o.isa = isa;
          expect_paged_matches_contiguous(p, o, false, l,
                                          name + ", pools " + pools.name + ", " +
                                              dtype_name(activations) + ", " + cpu_isa_name(isa));
        }
      }
    }
  }
}

// vLLM's own page: the conv slot at the page's start, the recurrent slot right after it (a
// storage offset of one conv slot), bf16 conv and f32 recurrent pools, the rest of the page
// padding; and the same with the recurrent slot first.
TEST(CpuStepStridedPools, VllmPageLayoutMatchesContiguousBitForBit) {
  StepSpec spec = mixed();
  spec.bf16_conv_pool = true;
  const StepProblem p = make_step_problem(spec);
  const PageLayout conv_first = layout_of(p.conv_pool, p.rec_pool, 0, 0, 512);
  PageLayout rec_first;
  rec_first.rec_at = 0;
  rec_first.conv_at = slot_numel(p.rec_pool) * 4;
  rec_first.page = conv_first.page;
  for (const PageLayout& l : {conv_first, rec_first}) {
    for (CpuIsa isa : compiled_isas()) {
      StepOptions o = p.options();
      o.isa = isa;
      expect_paged_matches_contiguous(
          p, o, false, l,
          std::string(l.conv_at == 0 ? "conv first" : "recurrent first") + ", " +
              cpu_isa_name(isa));
    }
  }
}

// The float64 reference and the float64 CPU step over paged f64 pools: the contiguous pools'
// bytes; and the reference's within 1e-12 of the oracle (so the paged path answers to float64).
TEST(CpuStepStridedPools, Float64ReferenceOverPagedPoolsMatchesContiguous) {
  for (const auto& [name, base] : cases()) {
    const StepProblem p = as_f64(make_step_problem(base));
    const PageLayout l = layout_of(p.conv_pool, p.rec_pool, 8, 16, 64);
    expect_paged_matches_contiguous(p, p.options(), true, l, "ref::fused_gdn_step, " + name);
    expect_paged_matches_contiguous(p, p.options(), false, l, "f64 fused_gdn_step, " + name);
  }
}

// Thread counts split the decode and prefill work differently; none changes a bit over paged
// pools.
TEST(CpuStepStridedPools, ThreadCountsGiveTheSameBytes) {
  const StepProblem p = make_step_problem(mixed());
  const PageLayout l = layout_of(p.conv_pool, p.rec_pool, 16, 8, 96);
  for (const int threads : {1, 2, 3, 5}) {
    StepOptions o = p.options();
    o.threads = threads;
    expect_paged_matches_contiguous(p, o, false, l, std::to_string(threads) + " threads");
  }
}

// Check mode over paged pools: every slot the step writes is backed up and scanned where it
// lies; the clean step's bytes are those of unchecked mode.
TEST(CpuStepStridedPools, CheckModeMatchesContiguous) {
  const StepProblem p = make_step_problem(speculative_spec());
  const PageLayout l = layout_of(p.conv_pool, p.rec_pool, 16, 8, 96);
  StepOptions o = p.options();
  o.check_finite = true;
  expect_paged_matches_contiguous(p, o, false, l, "check mode");
}

// With one slot the slot stride is never used: 0 passes (the batch all padding, slot 0 being
// the null slot); with more slots it is refused.
TEST(CpuStepStridedPools, SlotStrideZeroOnlyWithOneSlot) {
  StepSpec spec;
  spec.num_slots = 1;
  spec.padding = {{2, -1}};
  StepProblem p = make_step_problem(spec);
  Tensor out(DType::f32, {p.tokens, spec.hv * spec.dv});
  MutableTensorView conv = p.conv_pool.mutable_view(), rec = p.rec_pool.mutable_view();
  conv.strides[0] = 0;
  rec.strides[0] = 0;
  EXPECT_NO_THROW(fused_gdn_step(p.inputs(), {conv, rec}, out.mutable_view(), p.options()));

  const StepProblem q = make_step_problem(mixed());
  Tensor conv_pool = clone(q.conv_pool), rec_pool = clone(q.rec_pool);
  Tensor out2(DType::f32, {q.tokens, q.spec.hv * q.spec.dv});
  MutableTensorView rec2 = rec_pool.mutable_view();
  rec2.strides[0] = 0;
  test::expect_rejected(
      [&] {
        fused_gdn_step(q.inputs(), {conv_pool.mutable_view(), rec2}, out2.mutable_view(),
                       q.options());
      },
      "SlotStrideZeroOnlyWithOneSlot", "recurrent_state",
      {"0 only with num_slots = 1", "stride 0 with 14 slots"});
  EXPECT_TRUE(same_bytes(conv_pool, q.conv_pool));
  EXPECT_TRUE(same_bytes(rec_pool, q.rec_pool));
}

// Thousands of interleaved slots: the validation's exact overlap test (one byte interval per
// slot, swept) accepts the disjoint pools, quickly.
TEST(StepStridedPoolsValidation, ThousandsOfInterleavedSlotsPass) {
  StepSpec spec;
  spec.hk = spec.hv = 1;
  spec.num_slots = 8192;
  spec.decodes = {{1, 8191, 3}, {1, 17, 0}};
  const StepProblem p = make_step_problem(spec);
  PagedPools paged(p.conv_pool, p.rec_pool, layout_of(p.conv_pool, p.rec_pool, 0, 8, 8));
  Tensor out(DType::f32, {p.tokens, spec.hv * spec.dv});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(
      check_fused_gdn_step(p.inputs(), {paged.conv, paged.rec}, out.mutable_view(), p.options()));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  // About 1 ms on a 2-core EPYC host; the bound only catches a quadratic sweep.
  EXPECT_LT(ms, 500.0) << "validating 8192 interleaved slots took " << ms << " ms";
}

// Paged pools that overlap (the recurrent slot starting inside the conv slot, or the pages
// closer than a slot) are refused, naming the pool, and no byte of the buffer changes.
TEST(StepStridedPoolsValidation, OverlappingPagedPoolsAreRefusedAndUnchanged) {
  const StepProblem p = make_step_problem(mixed());
  const PageLayout good = layout_of(p.conv_pool, p.rec_pool, 16, 0, 32);
  PageLayout into_conv = good;  // the recurrent slot starts 8 bytes before the conv slot ends
  into_conv.rec_at -= 8;
  struct Case {
    const char* name;
    PageLayout layout;
    std::function<void(PagedPools&)> breaks;
    const char* argument;
    std::vector<const char*> words;
  };
  const std::vector<Case> all = {
      {"RecurrentSlotInsideTheConvSlot",
       into_conv,
       [](PagedPools&) {},
       "conv_state",
       {"memory that does not overlap 'recurrent_state'"}},
      {"RecurrentPageStrideBelowASlot",
       good,
       [](PagedPools& x) {
         x.rec.strides[0] = x.rec.sizes[1] * x.rec.sizes[2] * x.rec.sizes[3] - 1;
       },
       "recurrent_state",
       {"a slot stride (dim 0) of at least one slot"}},
      {"ConvPoolOverlapsOut",
       good,
       [](PagedPools&) {},
       "out",
       {"memory that does not overlap 'conv_state'"}},
  };
  for (const Case& c : all) {
    PagedPools paged(p.conv_pool, p.rec_pool, c.layout);
    c.breaks(paged);
    const std::vector<char> before(paged.bytes(), paged.bytes() + paged.slots * c.layout.page);
    Tensor out(DType::f32, {p.tokens, p.spec.hv * p.spec.dv});
    MutableTensorView out_view = out.mutable_view();
    // out over the second page: its conv slot, among others.
    if (std::string(c.name) == "ConvPoolOverlapsOut") out_view.data = paged.bytes() + c.layout.page;
    test::expect_rejected(
        [&] {
          fused_gdn_step(p.inputs(), {paged.conv, paged.rec}, out_view, p.options());
        },
        c.name, c.argument, c.words);
    EXPECT_EQ(std::memcmp(before.data(), paged.bytes(), before.size()), 0) << c.name;
  }
}

}  // namespace
}  // namespace gdn
