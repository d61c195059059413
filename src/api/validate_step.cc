// validate_step.cc: the argument checks of the serving step (gdn/step.h lists the rules).
// Everything is checked before anything is written; every check names the argument, what was
// expected and what was given.
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/validate.h"
#include "api/validate_checks.h"

namespace gdn::detail {

namespace {

// The values of a rank-1 int64 view of `count` elements (any stride).
std::vector<std::int64_t> index_values(const char* name, const TensorView& view, std::int64_t count,
                                       const std::string& what) {
  check_rank(name, view);
  expect_shape(name, view, 1, {count, 0, 0, 0}, what);
  expect_dtype(name, view, DType::i64, "");
  check_extent(name, view);
  std::vector<std::int64_t> values(static_cast<std::size_t>(count));
  const auto* data = static_cast<const std::int64_t*>(view.data);
  for (std::int64_t i = 0; i < count; ++i)
    values[static_cast<std::size_t>(i)] = data[i * view.strides[0]];
  return values;
}

std::string at(const char* name, std::int64_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

// A pool: the given shape; f64 for f64 inputs, else f32 or bf16 (float32 compute, a bf16
// state rounded once per write: gdn/step.h). Read and written in place, slot by slot, so each
// slot must be one dense row-major block, and the slots must not overlap (pool_slots).
void expect_pool(const char* name, const MutableTensorView& pool, int rank, const Dims& sizes,
                 const std::string& what, DType inputs) {
  check_rank(name, pool);
  if (!pool.present()) fail(name, "a pool " + what, "absent");
  if (pool.rank != rank || pool.sizes[0] < 1) fail(name, "a pool " + what, shape_of(pool));
  Dims full = sizes;
  full[0] = pool.sizes[0];
  expect_shape(name, pool, rank, full, what);
  if (inputs == DType::f64) {
    expect_dtype(name, pool, DType::f64, " (float64 inputs keep float64 state pools)");
  } else if (pool.dtype != DType::f32 && pool.dtype != DType::bf16) {
    fail(name,
         std::string("dtype f32 or bf16 (the state pools of ") + dtype_name(inputs) +
             " inputs: float32 compute, a bf16 pool rounded once per write)",
         dtype_name(pool.dtype));
  }
  check_extent(name, pool);
  check_pool_slots(name, pool);
}

// The speculative layout's block table, int64 [R, row] with R <= n (any strides), row-major.
std::vector<std::int64_t> spec_table(const TensorView& view, std::int64_t n, std::int64_t row,
                                     const std::string& n_is) {
  const char* name = "spec_state_indices";
  if (view.rank != 2) {
    fail(name, "a rank-2 array [R, 1 + num_spec] (each decode window's block-table row)",
         "rank " + std::to_string(view.rank) + ", " + shape_of(view));
  }
  const std::int64_t rows = view.sizes[0];
  if (rows < 0 || rows > n || view.sizes[1] != row) {
    fail(name,
         "[R, 1 + num_spec] = [R, " + std::to_string(row) + "], R at most N" + n_is +
             " (a row for each decode window)",
         shape_of(view));
  }
  expect_dtype(name, view, DType::i64, "");
  check_extent(name, view);
  std::vector<std::int64_t> values(static_cast<std::size_t>(rows * row));
  const auto* data = static_cast<const std::int64_t*>(view.data);
  for (std::int64_t s = 0; s < rows; ++s) {
    for (std::int64_t t = 0; t < row; ++t)
      values[static_cast<std::size_t>(s * row + t)] =
          data[s * view.strides[0] + t * view.strides[1]];
  }
  return values;
}

std::string at2(const char* name, std::int64_t i, std::int64_t j) {
  return std::string(name) + "[" + std::to_string(i) + ", " + std::to_string(j) + "]";
}

// Decode window s of the speculative layout: q tokens, `accepted` (a) of the previous window,
// its block-table row `slots_of` [1 + num_spec]. Claims the slots it writes in `owner`.
void spec_window(std::int64_t s, std::int64_t q, bool history, std::int64_t accepted,
                 const std::int64_t* slots_of, std::int64_t slots, const StepOptions& options,
                 const std::string& slot_range,
                 std::unordered_map<std::int64_t, std::int64_t>* owner, ValidatedStep* result) {
  ValidatedStep& r = *result;
  const auto i = static_cast<std::size_t>(s);
  if (accepted < 1 || accepted > 1 + options.num_spec) {
    fail("num_accepted_tokens",
         "1 to 1 + num_spec = " + std::to_string(1 + options.num_spec) +
             " accepted tokens for each decode window (s < decode_end)",
         at("num_accepted_tokens", s) + " = " + std::to_string(accepted));
  }
  auto in_range = [&](std::int64_t t, const std::string& role) {
    if (slots_of[t] < 1 || slots_of[t] >= slots) {
      fail("spec_state_indices", slot_range + " for " + role,
           at2("spec_state_indices", s, t) + " = " + std::to_string(slots_of[t]));
    }
  };
  for (std::int64_t t = 0; t < q; ++t) {
    in_range(t, "each window token's state (t < " + std::to_string(q) + " tokens)");
    const auto [it, fresh] = owner->try_emplace(slots_of[t], s);
    if (!fresh) {
      fail("spec_state_indices", "a distinct slot for every state a live sequence writes",
           "sequences " + std::to_string(it->second) + " and " + std::to_string(s) +
               " both write slot " + std::to_string(slots_of[t]) + " (" +
               at2("spec_state_indices", s, t) + ")");
    }
    r.token_slot[static_cast<std::size_t>(r.query_start[i] + t)] = slots_of[t];
  }
  r.write_slot[i] = slots_of[0];
  r.conv_column[i] = accepted - 1;
  if (history) {
    in_range(accepted - 1, "the state it starts from (column num_accepted_tokens[s] - 1 = " +
                               std::to_string(accepted - 1) + ")");
    r.read_slot[i] = slots_of[accepted - 1];
  }
}

}  // namespace

void validate_step(const StepInputs& in, const StatePools& pools, const MutableTensorView& out,
                   const StepOptions& options, OutputPrecision precision, ValidatedStep* result) {
  ValidatedStep& r = *result;
  const LayerInputs layer{in.qkv,   in.a,       in.b,         in.conv_weight, in.conv_bias,
                          in.A_log, in.dt_bias, TensorView{}, TensorView{},   TensorView{}};
  validate_layer_inputs(layer, options, &r.layer);
  const ValidatedLayer& l = r.layer;
  if (options.matmul_precision != MatmulPrecision::compute) {
    fail("options.matmul_precision",
         "compute (the serving step keeps float32 products: a decode is matrix-vector work, and "
         "a prefill in the same step must match it)",
         matmul_precision_name(options.matmul_precision));
  }
  if (options.num_spec < 0 || options.num_spec > 1024) {
    fail("options.num_spec", "0 to 1024 speculative tokens per decode window",
         std::to_string(options.num_spec));
  }
  const bool f64 = precision == OutputPrecision::float64;
  if (f64 && l.dtype != DType::f64)
    fail("qkv", "dtype f64 (the reference runs in float64)", dtype_name(l.dtype));
  const std::string why = " (the dtype of qkv)";
  // vLLM's speculative layout: both of its tensors, and a conv buffer K - 1 + n wide.
  check_rank("spec_state_indices", in.spec_state_indices);
  check_rank("num_accepted_tokens", in.num_accepted_tokens);
  const bool spec = in.spec_state_indices.present();
  if (spec != in.num_accepted_tokens.present()) {
    const char* missing = spec ? "num_accepted_tokens" : "spec_state_indices";
    fail(missing,
         std::string("present with ") + (spec ? "spec_state_indices" : "num_accepted_tokens") +
             " (vLLM's speculative layout takes both)",
         "absent");
  }
  if (spec && in.read_state_indices.present()) {
    fail("read_state_indices", "absent in the speculative layout (spec_state_indices given)",
         shape_of(in.read_state_indices));
  }
  if (spec && in.read_offsets.present()) {
    fail("read_offsets", "absent in the speculative layout (spec_state_indices given)",
         shape_of(in.read_offsets));
  }
  r.spec_layout = spec;
  const std::int64_t columns = l.taps - 1 + (spec ? options.num_spec : 0);
  expect_pool("conv_state", pools.conv_state, 3, {0, columns, l.channels, 0},
              spec ? "[num_slots, K - 1 + num_spec, D] = [num_slots, " + std::to_string(columns) +
                         ", " + std::to_string(l.channels) +
                         "] (vLLM's rolling buffer: the speculative layout)"
                   : "[num_slots, K - 1, D] = [num_slots, " + std::to_string(l.taps - 1) + ", " +
                         std::to_string(l.channels) + "]",
              l.dtype);
  expect_pool("recurrent_state", pools.recurrent_state, 4, {0, options.hv, options.dk, options.dv},
              "[num_slots, Hv, Dk, Dv] = [num_slots, " + std::to_string(options.hv) + ", " +
                  std::to_string(options.dk) + ", " + std::to_string(options.dv) + "]",
              l.dtype);
  const std::int64_t slots = pools.recurrent_state.sizes[0];
  if (pools.conv_state.sizes[0] != slots) {
    fail("conv_state", "as many slots as recurrent_state (" + std::to_string(slots) + ")",
         shape_of(pools.conv_state));
  }
  r.num_slots = slots;
  check_rank("out", out);
  expect_output("out", out, 2, {l.tokens, options.hv * options.dv, 0, 0}, "[T, Hv Dv]", l.dtype,
                why, true);

  // The batch.
  check_rank("state_indices", in.state_indices);
  if (!in.state_indices.present() || in.state_indices.rank != 1) {
    // Its dtype is checked with its values; a binding's int32 is widened before this.
    fail("state_indices", "a rank-1 array [N] (a slot per sequence)",
         in.state_indices.present()
             ? "rank " + std::to_string(in.state_indices.rank) + ", " + shape_of(in.state_indices)
             : shape_of(in.state_indices));
  }
  const std::int64_t n = in.state_indices.sizes[0];
  check_sequence_count("state_indices", n, "N");
  const std::string n_is = " with N = " + std::to_string(n) + " (the length of state_indices)";
  const std::vector<std::int64_t> slot = index_values("state_indices", in.state_indices, n, "[N]");
  const std::vector<std::int64_t> qsl =
      index_values("query_start_loc", in.query_start_loc, n + 1, "[N + 1]" + n_is);
  const std::vector<std::int64_t> lens = index_values("seq_lens", in.seq_lens, n, "[N]" + n_is);
  std::vector<std::int64_t> dist = index_values("distribution", in.distribution, 3,
                                                "[3] = [decode_end, prefill_end, mixed_end]");
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(n), 0);
  check_rank("read_offsets", in.read_offsets);
  if (in.read_offsets.present())
    offsets = index_values("read_offsets", in.read_offsets, n, "[N]" + n_is);
  std::vector<std::int64_t> read_base = slot;
  check_rank("read_state_indices", in.read_state_indices);
  const bool read_indices = in.read_state_indices.present();
  if (read_indices)
    read_base = index_values("read_state_indices", in.read_state_indices, n, "[N]" + n_is);
  // The speculative layout's block table [R][1 + n] (R from decode_end to N: a row for each
  // window) and accepted counts [R].
  std::vector<std::int64_t> accepted, table;
  const std::int64_t row = 1 + options.num_spec;
  std::int64_t table_rows = 0;
  if (spec) {
    table = spec_table(in.spec_state_indices, n, row, n_is);
    table_rows = in.spec_state_indices.sizes[0];
    accepted = index_values(
        "num_accepted_tokens", in.num_accepted_tokens, table_rows,
        "[R] with R = " + std::to_string(table_rows) + " (the rows of spec_state_indices)");
  }
  // Tokamax's padded batches carry distribution values past N (its own tests pass N = 1 with
  // [0, 0, 3]) and clamp them to N; clamping here accepts exactly those, nothing else.
  const std::vector<std::int64_t> given = dist;
  for (std::int64_t& x : dist) x = std::min(x, n);
  if (!(0 <= dist[0] && dist[0] <= dist[1] && dist[1] <= dist[2])) {
    fail("distribution",
         "0 <= decode_end <= prefill_end <= mixed_end (each value past N = " + std::to_string(n) +
             " counting as N)",
         "[" + std::to_string(given[0]) + ", " + std::to_string(given[1]) + ", " +
             std::to_string(given[2]) + "]");
  }
  // Only the live entries [0, mixed_end]: Tokamax pads the tail with anything (its tests pass
  // a decreasing one).
  const std::int64_t live = dist[2];
  if (qsl[0] != 0) fail("query_start_loc", "query_start_loc[0] = 0", std::to_string(qsl[0]));
  for (std::int64_t s = 0; s < live; ++s) {
    const auto i = static_cast<std::size_t>(s);
    if (qsl[i + 1] < qsl[i]) {
      fail("query_start_loc",
           "non-decreasing values up to query_start_loc[mixed_end = " + std::to_string(live) + "]",
           at("query_start_loc", s + 1) + " = " + std::to_string(qsl[i + 1]) + " < " +
               at("query_start_loc", s) + " = " + std::to_string(qsl[i]));
    }
  }
  if (qsl[static_cast<std::size_t>(live)] > l.tokens) {
    fail("query_start_loc",
         "values at most T = " + std::to_string(l.tokens) + " (the tokens of qkv) up to " +
             at("query_start_loc", live) + " (mixed_end)",
         at("query_start_loc", live) + " = " + std::to_string(qsl[static_cast<std::size_t>(live)]));
  }
  r.decode_end = dist[0];
  if (spec && table_rows < r.decode_end) {
    fail("spec_state_indices",
         "a row for each decode window: at least decode_end = " + std::to_string(r.decode_end) +
             " rows",
         shape_of(in.spec_state_indices));
  }
  r.mixed_end = live;
  r.query_start.assign(qsl.begin(), qsl.begin() + live + 1);
  r.write_slot.assign(static_cast<std::size_t>(live), 0);
  r.read_slot.assign(static_cast<std::size_t>(live), -1);
  if (spec) {
    r.token_slot.assign(static_cast<std::size_t>(qsl[static_cast<std::size_t>(r.decode_end)]), 0);
    r.conv_column.assign(static_cast<std::size_t>(r.decode_end), 0);
  }
  // owner[x]: the live sequence that writes slot x (absent: none). A map, not a vector of
  // num_slots: the pools' size must not decide the validation's memory (found by fuzz/).
  std::unordered_map<std::int64_t, std::int64_t> owner;
  const std::string slot_range =
      "a slot in [1, " + std::to_string(slots) +
      ") (slot 0 is the null slot; num_slots = " + std::to_string(slots) + ")";
  for (std::int64_t s = 0; s < live; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const std::int64_t len = qsl[i + 1] - qsl[i];
    const bool decode = s < r.decode_end;
    if (decode && (len < 1 || len > 1 + options.num_spec)) {
      fail("query_start_loc",
           "decodes of 1 to 1 + num_spec = " + std::to_string(1 + options.num_spec) + " tokens",
           "sequence " + std::to_string(s) + " (a decode: s < decode_end = " +
               std::to_string(r.decode_end) + ") has " + std::to_string(len) + " tokens");
    }
    if (!decode && len < 1) {
      fail("query_start_loc", "at least one token for each prefill (decode_end <= s < mixed_end)",
           "sequence " + std::to_string(s) + " has none");
    }
    if (lens[i] < len) {
      fail("seq_lens", "each live sequence's total length at least its tokens in this step",
           at("seq_lens", s) + " = " + std::to_string(lens[i]) + " < " + std::to_string(len));
    }
    if (spec && decode) {
      spec_window(s, len, lens[i] > len, accepted[i], table.data() + s * row, slots, options,
                  slot_range, &owner, &r);
      continue;
    }
    const std::int64_t writes = spec || !decode ? 1 : len;
    if (slot[i] < 1 || slot[i] > slots - writes) {
      fail("state_indices",
           writes == 1 ? slot_range
                       : slot_range + ", with the " + std::to_string(writes) +
                             " slots of its window from it",
           at("state_indices", s) + " = " + std::to_string(slot[i]));
    }
    for (std::int64_t w = 0; w < writes; ++w) {
      const auto [it, fresh] = owner.try_emplace(slot[i] + w, s);
      const std::int64_t o = it->second;
      if (!fresh) {
        fail("state_indices", "a distinct slot for every live sequence",
             "sequences " + std::to_string(o) + " and " + std::to_string(s) + " both write slot " +
                 std::to_string(slot[i] + w));
      }
    }
    r.write_slot[i] = slot[i];
    if (lens[i] > len) {
      // |base|, |offset| <= slots are checked before the sum, which then cannot overflow.
      const bool near = read_base[i] >= -slots && read_base[i] <= slots && offsets[i] >= -slots &&
                        offsets[i] <= slots;
      const std::int64_t read = near ? read_base[i] + offsets[i] : -1;
      if (!near || read < 1 || read >= slots) {
        // Blame the offset when it moved the read slot, else the read index.
        const bool offset = offsets[i] != 0 || !read_indices;
        fail(offset ? "read_offsets" : "read_state_indices",
             slot_range + " at " + (read_indices ? "read_state_indices" : "state_indices") +
                 "[s] + read_offsets[s]",
             (offset ? at("read_offsets", s) + " = " + std::to_string(offsets[i])
                     : at("read_state_indices", s) + " = " + std::to_string(read_base[i])) +
                 " (slot " + std::to_string(read_base[i]) + " + " + std::to_string(offsets[i]) +
                 ")");
      }
      r.read_slot[i] = read;
    }
  }
  for (std::int64_t s = 0; s < live; ++s) {
    const std::int64_t read = r.read_slot[static_cast<std::size_t>(s)];
    if (read < 0) continue;
    const auto it = owner.find(read);
    const std::int64_t o = it == owner.end() ? -1 : it->second;
    if (o >= 0 && o != s) {
      const bool window = spec && s < r.decode_end;
      fail(window                      ? "spec_state_indices"
           : read_indices              ? "read_state_indices"
           : in.read_offsets.present() ? "read_offsets"
                                       : "state_indices",
           "a read slot that no other live sequence writes",
           "sequence " + std::to_string(s) + " reads slot " + std::to_string(read) +
               ", which sequence " + std::to_string(o) + " writes");
    }
  }
  // The layer's inputs (its absent states and cu_seqlens are skipped) and the index tensors.
  std::vector<NamedInput> inputs = named_layer_inputs(layer);
  inputs.insert(inputs.end(), {{"query_start_loc", &in.query_start_loc},
                               {"state_indices", &in.state_indices},
                               {"seq_lens", &in.seq_lens},
                               {"distribution", &in.distribution},
                               {"read_offsets", &in.read_offsets},
                               {"read_state_indices", &in.read_state_indices},
                               {"spec_state_indices", &in.spec_state_indices},
                               {"num_accepted_tokens", &in.num_accepted_tokens}});
  check_aliasing({{"out", &out},
                  {"conv_state", &pools.conv_state},
                  {"recurrent_state", &pools.recurrent_state}},
                 inputs, {});
}

}  // namespace gdn::detail
