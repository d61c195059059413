// step_layout_test.cc: a serving step's result for one sequence depends on that sequence alone
// (gdn/step.h): its tokens, its start states and the options, not its place in the batch, the
// other sequences, its slot number, the batch size or the thread count. Each request below is
// stepped alone and in several batch layouts (before and after decodes and prefills, with
// padding, other slot numbers, 1 and 2 threads, every compiled ISA variant), and its output
// rows and written slots must be the same bytes every time; every layout also answers to the
// float64 oracle (tests/cpu/step_harness.h).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "step_harness.h"

namespace gdn {
namespace {

using namespace step_test;

// One request: its tokens, and whether it continues from a state (history) and is a decode
// window (a decode of more than one token; a one-token request is a decode at the front of a
// batch and a prefill after a prefill, as vLLM's and sglang's batches put it).
struct Request {
  std::int64_t len = 1;
  bool history = false;
  bool window = false;
};

// Every request's tokens and start states, drawn once, placed into each layout's batch.
struct Requests {
  StepSpec shape;
  std::vector<Request> list;
  std::vector<std::int64_t> first_row;  // of each request in `data`
  test::LayerProblem data;              // tokens of every request back to back, the parameters
  Tensor conv_start, rec_start;         // [requests, K - 1, D], [requests, Hv, Dk, Dv]
};

Requests make_requests(const StepSpec& shape, const std::vector<Request>& list) {
  Requests r;
  r.shape = shape;
  r.list = list;
  test::LayerSpec ls;
  ls.lengths.clear();
  std::int64_t rows = 0;
  for (const Request& q : list) {
    r.first_row.push_back(rows);
    rows += q.len;
  }
  ls.lengths = {rows};
  ls.hk = shape.hk;
  ls.hv = shape.hv;
  ls.dk = shape.dk;
  ls.dv = shape.dv;
  ls.taps = shape.taps;
  ls.dtype = shape.dtype;
  ls.seed = shape.seed;
  r.data = test::make_layer_problem(ls);
  const auto n = static_cast<std::int64_t>(list.size());
  const DType pool = shape.dtype == DType::f64 ? DType::f64 : DType::f32;
  r.conv_start =
      Tensor(shape.bf16_conv_pool ? DType::bf16 : pool, {n, shape.taps - 1, shape.channels()});
  r.rec_start = Tensor(shape.bf16_rec_pool ? DType::bf16 : pool, {n, shape.hv, shape.dk, shape.dv});
  test::Random rng(shape.seed * 7919 + 3);
  for (std::int64_t i = 0; i < r.conv_start.numel(); ++i) set_value(r.conv_start, i, rng.normal());
  for (std::int64_t i = 0; i < r.rec_start.numel(); ++i) {
    set_value(r.rec_start, i, 0.5 * rng.normal());
  }
  return r;
}

// A request's place in a batch: its slot, and whether the batch calls it a decode.
struct Placed {
  int request;
  std::int64_t slot;
  bool decode;
};

struct Layout {
  std::string name;
  std::vector<Placed> live;  // decodes first
  std::int64_t num_slots = 0;
  std::int64_t padding = 0, trailing = 0;  // padding sequences (one token each), rows past them
};

void copy_rows(const Tensor& from, std::int64_t from_row, Tensor& to, std::int64_t to_row,
               std::int64_t count) {
  const std::size_t row = from.bytes() / static_cast<std::size_t>(from.size(0));
  std::memcpy(static_cast<char*>(to.raw()) + static_cast<std::size_t>(to_row) * row,
              static_cast<const char*>(from.raw()) + static_cast<std::size_t>(from_row) * row,
              static_cast<std::size_t>(count) * row);
}

// The batch of a layout: the requests' tokens at their rows (padding and trailing rows random),
// their start states in their slots, every other slot random (slot 0 NaN).
StepProblem make_layout(const Requests& r, const Layout& layout) {
  StepSpec spec = r.shape;
  spec.num_slots = layout.num_slots;
  spec.decodes.clear();
  spec.prefills.clear();
  spec.padding.clear();
  for (const Placed& p : layout.live) {
    const Request& q = r.list[static_cast<std::size_t>(p.request)];
    (p.decode ? spec.decodes : spec.prefills).push_back({q.len, p.slot, q.history ? 11 : 0});
  }
  for (std::int64_t i = 0; i < layout.padding; ++i) spec.padding.push_back({1, -1});
  spec.trailing = layout.trailing;
  spec.seed = r.shape.seed + 101;
  StepProblem p = make_step_problem(spec);  // random tokens and slots everywhere ...
  std::int64_t row = 0;
  for (const Placed& placed : layout.live) {  // ... then each request's own
    const auto i = static_cast<std::size_t>(placed.request);
    const Request& q = r.list[i];
    copy_rows(r.data.qkv, r.first_row[i], p.qkv, row, q.len);
    copy_rows(r.data.a, r.first_row[i], p.a, row, q.len);
    copy_rows(r.data.b, r.first_row[i], p.b, row, q.len);
    copy_rows(r.conv_start, placed.request, p.conv_pool, placed.slot, 1);
    copy_rows(r.rec_start, placed.request, p.rec_pool, placed.slot, 1);
    row += q.len;
  }
  p.conv_weight = clone(r.data.conv_weight);
  p.conv_bias = clone(r.data.conv_bias);
  p.A_log = clone(r.data.A_log);
  p.dt_bias = clone(r.data.dt_bias);
  return p;
}

// What a step gave one request: its output rows and the slots it wrote.
struct Seen {
  Tensor out, conv, rec;
};

Seen seen(const StepProblem& p, const StepResult& got, std::int64_t s, bool decode) {
  const std::int64_t first = p.query_start_loc[s], len = p.query_start_loc[s + 1] - first;
  const std::int64_t slot = p.state_indices[s], written = decode ? len : 1;
  std::vector<std::int64_t> rows_of, slots_of;
  for (std::int64_t t = 0; t < len; ++t) rows_of.push_back(first + t);
  for (std::int64_t t = 0; t < written; ++t) slots_of.push_back(slot + t);
  return {gather(got.out, rows_of), gather(got.conv_pool, slots_of),
          gather(got.rec_pool, slots_of)};
}

void expect_same(const Seen& got, const Seen& alone, const std::string& what) {
  EXPECT_TRUE(test::bit_identical(got.out, alone.out, "out rows, " + what));
  EXPECT_TRUE(test::bit_identical(got.conv, alone.conv, "conv_state slots, " + what));
  EXPECT_TRUE(test::bit_identical(got.rec, alone.rec, "recurrent_state slots, " + what));
}

// Each request alone (a one-token request both as a decode and as a prefill, in a slot of its
// own number), then in every layout, on every ISA variant, 1 and 2 threads: the same bytes.
// Each layout also against the float64 oracle.
void check_layouts(const Requests& r, const std::vector<Layout>& layouts, int chunk_size) {
  for (CpuIsa isa : compiled_isas()) {
    for (int threads : {1, 2}) {
      const std::string where = std::string(cpu_isa_name(isa)) + ", " + std::to_string(threads) +
                                " threads, chunk_size " + std::to_string(chunk_size);
      auto options = [&](const StepProblem& p) {
        StepOptions o = p.options();
        o.isa = isa;
        o.threads = threads;
        o.chunk_size = chunk_size;
        return o;
      };
      std::vector<Seen> alone;
      for (std::size_t i = 0; i < r.list.size(); ++i) {
        const Request& q = r.list[i];
        const bool decode = q.window || q.len == 1;
        Layout solo{"alone", {{static_cast<int>(i), 3, decode}}, 6 + q.len};
        const StepProblem p = make_layout(r, solo);
        alone.push_back(seen(p, run_step(p, options(p)), 0, decode));
        if (q.len == 1) {  // the same request called a prefill, in another slot
          solo.live[0] = {static_cast<int>(i), 1, false};
          const StepProblem p2 = make_layout(r, solo);
          expect_same(seen(p2, run_step(p2, options(p2)), 0, false), alone.back(),
                      "request " + std::to_string(i) + " as a prefill vs as a decode, " + where);
        }
      }
      for (const Layout& layout : layouts) {
        const StepProblem p = make_layout(r, layout);
        const StepResult got = run_step(p, options(p));
        for (std::size_t s = 0; s < layout.live.size(); ++s) {
          const Placed& placed = layout.live[s];
          expect_same(seen(p, got, static_cast<std::int64_t>(s), placed.decode),
                      alone[static_cast<std::size_t>(placed.request)],
                      "request " + std::to_string(placed.request) + " in layout " + layout.name +
                          " vs alone, " + where);
        }
      }
    }
  }
  for (const Layout& layout : layouts) {
    SCOPED_TRACE("layout " + layout.name);
    check_case(make_layout(r, layout));
  }
}

// The requests: one-token decodes with history (the case that took the prefill path when it
// followed a prefill), a fresh one-token request, a speculative window, and prefills shorter
// and longer than a chunk (the token recurrence and the chunked form: 31, 32, 33 around C = 32,
// 70 and 130 past 64), fresh and continued.
std::vector<Request> requests() {
  return {{1, true, false},   {1, false, false},  {3, true, true},  {5, true, false},
          {2, false, false},  {70, false, false}, {1, true, false}, {33, true, false},
          {130, true, false}, {31, false, false}, {32, true, false}};
}

std::vector<Layout> layouts() {
  return {
      // Decodes at the front, prefills after: every one-token request a decode.
      {"decodes first",
       {{0, 1, true},
        {2, 2, true},
        {6, 5, true},
        {1, 6, true},
        {5, 7, false},
        {3, 8, false},
        {4, 9, false},
        {8, 10, false}},
       11,
       0,
       0},
      // One-token requests after prefills (prefills to the batch), padding, trailing rows.
      {"one-token requests among prefills",
       {{2, 12, true},
        {5, 3, false},
        {0, 8, false},
        {3, 1, false},
        {6, 17, false},
        {1, 9, false},
        {7, 2, false},
        {4, 6, false},
        {9, 15, false}},
       18,
       2,
       3},
      // No decode at all; every request in one batch, other slots.
      {"no decodes",
       {{1, 2, false},
        {0, 19, false},
        {4, 7, false},
        {6, 4, false},
        {8, 11, false},
        {3, 20, false},
        {10, 1, false},
        {9, 16, false},
        {7, 13, false},
        {5, 9, false}},
       21,
       1,
       0},
      // Two prefills; a small batch changes the plan's head grouping, not the result.
      {"two prefills", {{8, 1, false}, {0, 2, false}}, 3, 0, 0},
      // A window and a one-token decode behind a single prefill.
      {"window, decode, prefill",
       {{6, 9, true}, {2, 3, true}, {10, 8, false}, {0, 1, false}},
       12,
       1,
       1},
  };
}

TEST(CpuStepLayout, EachSequenceBitIdenticalAloneAndInAnyBatchLayout) {
  StepSpec shape;
  shape.hk = 1;
  shape.hv = 4;
  shape.dk = 16;
  shape.dv = 20;  // a tail of columns past the last whole vector, at every vector width
  shape.num_spec = 3;
  const Requests r = make_requests(shape, requests());
  check_layouts(r, layouts(), 64);
  check_layouts(r, layouts(), 0);  // the plan's chunk size: the ISA's, whatever the batch
}

// Two key heads, K = 2, bf16 pools (each written slot rounded once).
TEST(CpuStepLayout, BitIdenticalWithBf16Pools) {
  StepSpec shape;
  shape.hk = 2;
  shape.hv = 2;
  shape.dk = 12;
  shape.dv = 20;
  shape.taps = 2;
  shape.num_spec = 3;
  shape.bf16_conv_pool = true;
  shape.bf16_rec_pool = true;
  shape.seed = 5;
  const Requests r = make_requests(shape, requests());
  check_layouts(r, layouts(), 64);
}

}  // namespace
}  // namespace gdn
