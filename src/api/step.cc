// step.cc: a serving step (gdn/step.h). Validate the whole batch first; then, run by run of
// consecutive sequences that take the same path (ValidatedStep::decode_path: decode windows and
// every one-token sequence through the decode kernel, whatever their place in the batch)
//   prefills: their start states gathered from the read slots (zeros without history), the
//     fused layer op over all of the run at once (gdn/layer.h), the final states scattered to
//     their slots;
//   decodes: the conv + SiLU of their tokens (src/cpu/conv1d-inl.h, the conv state from the
//     read slot), the gates, the conv states after each window position written to their
//     slots, and the decode kernel (src/cpu/decode-inl.h) updating the recurrent states in
//     the pool directly;
//   padding tokens: zero output rows.
// Each sequence's arithmetic is fixed by the sequence alone: its path, the chunk size (the
// options' or the ISA's) and its length decide it; the work split (threads, head groups, value
// column blocks) changes no bit (gdn/plan.h), and so neither do the other sequences.
// A bf16 pool is read into float32 and each state rounded once as it is written (gdn/step.h):
// prefills through their gathered float32 states, decodes in the decode kernel (the recurrent
// state) and below (the conv state: raw inputs, rounded). No live sequence reads a slot another
// one writes (validated), so the order of these parts does not matter. The float64 reference runs
// every live sequence alone through gdn::ref::fused_gdn_fwd, a decode window one token at a time.
#include "gdn/step.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <vector>

#include "api/check_finite.h"
#include "api/layer_parts.h"
#include "api/step_plan.h"
#include "api/validate.h"
#include "common/half_bits.h"
#include "cpu/float_env.h"
#include "cpu/layer.h"
#include "cpu/profile.h"

namespace gdn {
namespace {

using detail::ValidatedStep;

// Rows [t0, t1) of a [T, ...] view.
TensorView rows(const TensorView& v, std::int64_t t0, std::int64_t t1) {
  TensorView r = v;
  r.data = static_cast<const char*>(v.data) +
           t0 * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  r.sizes[0] = t1 - t0;
  return r;
}
MutableTensorView rows(const MutableTensorView& v, std::int64_t t0, std::int64_t t1) {
  MutableTensorView r = v;
  r.data = static_cast<char*>(v.data) +
           t0 * v.strides[0] * static_cast<std::int64_t>(dtype_size(v.dtype));
  r.sizes[0] = t1 - t0;
  return r;
}

template <class Real>
Real element(const TensorView& v, std::int64_t i0, std::int64_t i1) {
  return detail::element<Real>(v, i0 * v.strides[0] + i1 * v.strides[1]);
}

template <class Real>
void copy(Real* to, const Real* from, std::int64_t n) {
  if (n > 0) std::memcpy(to, from, static_cast<std::size_t>(n) * sizeof(Real));
}

// A pool as slot blocks, of the compute type Real or bf16: each slot dense, slots `stride`
// elements apart (validated: at least a slot, so they never overlap; vLLM's pages pad them and
// interleave two pools). Slots are read and written where they are, never gathered. The
// speculative layout's other sequences see the first K - 1 columns of each K - 1 + n wide
// conv buffer as a pool of their own (first_conv_columns).
template <class Real>
struct Pool {
  std::byte* data;
  bool bf16;
  std::int64_t slot;    // elements per slot
  std::int64_t stride;  // elements from a slot to the next

  explicit Pool(const MutableTensorView& p)
      : data(static_cast<std::byte*>(p.data)), bf16(p.dtype == DType::bf16), slot(p.sizes[1]) {
    for (int i = 2; i < p.rank; ++i) slot *= p.sizes[i];
    stride = p.sizes[0] > 1 ? p.strides[0] : slot;  // one slot: its stride is never used
  }
  Real* typed(std::int64_t x) const { return reinterpret_cast<Real*>(data) + x * stride; }
  std::uint16_t* half(std::int64_t x) const {
    return reinterpret_cast<std::uint16_t*>(data) + x * stride;
  }
  // Elements [from, from + count) of slot x <- from, rounded once into a bf16 pool.
  void write_part(std::int64_t x, std::int64_t from, std::int64_t count, const Real* values) const {
    if (!bf16) return copy(typed(x) + from, values, count);
    std::uint16_t* h = half(x) + from;
    for (std::int64_t i = 0; i < count; ++i)
      h[i] = detail::bf16_from_float(static_cast<float>(values[i]));
  }
  // Elements [from, from + count) of slot x, widened.
  void read_part(std::int64_t x, std::int64_t from, std::int64_t count, Real* to) const {
    if (!bf16) return copy(to, typed(x) + from, count);
    const std::uint16_t* h = half(x) + from;
    for (std::int64_t i = 0; i < count; ++i) to[i] = detail::float_from_bf16(h[i]);
  }
  // Slot x, widened.
  void read(std::int64_t x, Real* to) const {
    if (!bf16) return copy(to, typed(x), slot);
    const std::uint16_t* from = half(x);
    for (std::int64_t i = 0; i < slot; ++i) to[i] = detail::float_from_bf16(from[i]);
  }
  // Slot x <- from, rounded once into a bf16 pool.
  void write(std::int64_t x, const Real* from) const {
    if (!bf16) return copy(typed(x), from, slot);
    std::uint16_t* to = half(x);
    for (std::int64_t i = 0; i < slot; ++i)
      to[i] = detail::bf16_from_float(static_cast<float>(from[i]));
  }
};

// Output rows [t0, t1) set to zero (every float dtype's zero is all zero bits).
void zero_rows(const MutableTensorView& out, std::int64_t t0, std::int64_t t1) {
  const std::size_t size = dtype_size(out.dtype);
  char* o = static_cast<char*>(out.data);
  for (std::int64_t t = t0; t < t1; ++t) {
    for (std::int64_t c = 0; c < out.sizes[1]; ++c)
      std::memset(o + (t * out.strides[0] + c * out.strides[1]) * static_cast<std::int64_t>(size),
                  0, size);
  }
}

// The prefills [first, last) through `forward` (the CPU layer op) in one call, their states
// gathered from and scattered to the pools.
template <class Real, class Forward>
void run_prefills(const StepInputs& in, const StatePools& pools, const MutableTensorView& out,
                  const StepOptions& o, const ValidatedStep& v, std::int64_t first,
                  std::int64_t last, Forward&& forward) {
  const std::int64_t count = last - first;
  if (count == 0) return;
  cpu::StageLaps laps;
  const std::int64_t k = v.layer.taps, d = v.layer.channels, first_token = v.query_start[first];
  const std::int64_t t1 = v.query_start[last];
  const DType dtype = v.layer.compute_dtype;  // of the gathered states
  const Pool<Real> conv_pool(pools.conv_state), rec_pool(pools.recurrent_state);
  Tensor cu(DType::i64, {count + 1});
  Tensor conv(dtype, {count, k - 1, d});
  Tensor rec(dtype, {count, o.hv, o.dk, o.dv});
  for (std::int64_t p = 0; p <= count; ++p)
    cu.data<std::int64_t>()[p] = v.query_start[first + p] - first_token;
  for (std::int64_t p = 0; p < count; ++p) {
    const std::int64_t read = v.read_slot[first + p];
    if (read < 0) continue;  // no history: zeros, whatever the slot holds
    conv_pool.read(read, static_cast<Real*>(conv.raw()) + p * conv_pool.slot);
    rec_pool.read(read, static_cast<Real*>(rec.raw()) + p * rec_pool.slot);
  }
  const LayerInputs layer{rows(in.qkv, first_token, t1),
                          rows(in.a, first_token, t1),
                          rows(in.b, first_token, t1),
                          in.conv_weight,
                          in.conv_bias,
                          in.A_log,
                          in.dt_bias,
                          conv.view(),
                          rec.view(),
                          cu.view()};
  laps.lap(cpu::Stage::step_slots);
  forward(layer, LayerOutputs{rows(out, first_token, t1), conv.mutable_view(), rec.mutable_view(),
                              MutableTensorView{}, MutableTensorView{}});
  laps.skip();  // the layer op's own stages
  for (std::int64_t p = 0; p < count; ++p) {
    const std::int64_t write = v.write_slot[first + p];
    conv_pool.write(write, static_cast<const Real*>(conv.raw()) + p * conv_pool.slot);
    rec_pool.write(write, static_cast<const Real*>(rec.raw()) + p * rec_pool.slot);
  }
  laps.lap(cpu::Stage::step_slots);
}

// The conv state after each window position of the decodes into the conv pool, of elements
// Elem: Real, or bf16 bits (the raw inputs rounded once; the history's rows copied as they are).
//
// The conv state after window position t: inputs t - (K - 2) .. t of the window, the
// negative ones from the history (the read slot's rows, or zeros). Position t writes slot
// write_slot + t in increasing t and rows in increasing order: a plain decode (one position,
// reading its own slot) shifts its slot in place, reading each row before it is written. A
// window whose read slot is among the slots it writes gets a copy of the history first.
template <class Real, class Elem>
void write_conv_states(const StepInputs& in, const Pool<Real>& pool, const ValidatedStep& v,
                       std::int64_t first, std::int64_t last) {
  constexpr bool half = !std::is_same_v<Elem, Real>;
  const std::int64_t k = v.layer.taps, d = v.layer.channels;
  // Raw inputs copied as they are: qkv contiguous in the pool's type.
  const bool same =
      in.qkv.strides[1] == 1 && v.layer.dtype == (half ? DType::bf16 : v.layer.compute_dtype);
  Elem* base = reinterpret_cast<Elem*>(pool.data);
  std::vector<Elem> saved;
  const std::vector<Elem> zeros(static_cast<std::size_t>(k > 1 ? d : 0), Elem{0});
  for (std::int64_t s = first; s < last; ++s) {
    const std::int64_t len = v.query_start[s + 1] - v.query_start[s];
    const std::int64_t read = v.read_slot[s], first_write = v.write_slot[s];
    const Elem* history = read >= 0 ? base + read * pool.stride : nullptr;
    if (history != nullptr && len > 1 && read >= first_write && read < first_write + len) {
      saved.assign(history, history + pool.slot);
      history = saved.data();
    }
    for (std::int64_t t = 0; t < len; ++t) {
      Elem* to = base + (first_write + t) * pool.stride;
      for (std::int64_t r = 0; r + 1 < k; ++r) {
        const std::int64_t j = t - (k - 2) + r;  // input index within the window
        if (j < 0) {
          copy(to + r * d, history != nullptr ? history + (k - 1 + j) * d : zeros.data(), d);
        } else if (same) {
          copy(to + r * d,
               static_cast<const Elem*>(in.qkv.data) + (v.query_start[s] + j) * in.qkv.strides[0],
               d);
        } else {
          for (std::int64_t c = 0; c < d; ++c) {
            const Real x = element<Real>(in.qkv, v.query_start[s] + j, c);
            if constexpr (half) {
              to[r * d + c] = detail::bf16_from_float(static_cast<float>(x));
            } else {
              to[r * d + c] = x;
            }
          }
        }
      }
    }
  }
}

// The speculative layout's windows [first, last): the conv state after each window token t
// into columns [t, t + K - 1) of the window's buffer, i.e. columns [0, K - 2 + q) rewritten
// with the window's inputs from history row 1 on (gdn/step.h). `history` [last - first, K - 1,
// D] holds the buffers' history columns as read before the step (zeros without history);
// a bf16 buffer gets its values back exactly and the raw inputs rounded once.
template <class Real, class Elem>
void write_spec_conv_states(const StepInputs& in, const Pool<Real>& pool, const ValidatedStep& v,
                            std::int64_t first, std::int64_t last, const Real* history) {
  constexpr bool half = !std::is_same_v<Elem, Real>;
  const std::int64_t k = v.layer.taps, d = v.layer.channels;
  if (k < 2) return;  // no conv state
  auto store = [](Elem* to, Real x) {
    if constexpr (half) {
      *to = detail::bf16_from_float(static_cast<float>(x));
    } else {
      *to = x;
    }
  };
  for (std::int64_t s = first; s < last; ++s) {
    const std::int64_t t0 = v.query_start[s], q = v.query_start[s + 1] - t0;
    Elem* buffer = reinterpret_cast<Elem*>(pool.data) + v.write_slot[s] * pool.stride;
    const Real* h = history + (s - first) * (k - 1) * d;
    for (std::int64_t r = 0; r < k - 2 + q; ++r) {
      const std::int64_t j = r + 1 - (k - 1);  // window input j; negative: history row k - 1 + j
      for (std::int64_t c = 0; c < d; ++c) {
        store(buffer + r * d + c,
              j < 0 ? h[(k - 1 + j) * d + c] : element<Real>(in.qkv, t0 + j, c));
      }
    }
  }
}

// The decodes [first, last) on the CPU: conv + SiLU, gates, conv states, then the decode
// kernel, its items split as `plan` says. Their tokens, rows [t0, t1) of the batch, are rows
// [0, t1 - t0) of every temporary.
template <class Real>
void run_decodes(const StepInputs& in, const StatePools& pools, const MutableTensorView& batch_out,
                 const StepOptions& o, const ValidatedStep& v, const Plan& plan, std::int64_t first,
                 std::int64_t last) {
  const std::int64_t n = last - first;
  if (n == 0) return;
  const std::int64_t k = v.layer.taps, d = v.layer.channels, cpad = (d + 15) / 16 * 16;
  const std::int64_t t0 = v.query_start[first], tokens = v.query_start[last] - t0, hv = o.hv;
  const TensorView qkv = rows(in.qkv, t0, t0 + tokens);
  const MutableTensorView out = rows(batch_out, t0, t0 + tokens);
  std::vector<std::int64_t> token_start(static_cast<std::size_t>(n + 1));
  for (std::int64_t s = 0; s <= n; ++s) token_start[s] = v.query_start[first + s] - t0;
  const std::int64_t* read_slot = v.read_slot.data() + first;
  const DType dtype = v.layer.compute_dtype;   // of every temporary
  const bool narrow = v.layer.dtype != dtype;  // 16-bit qkv and out
  const Pool<Real> conv_pool(pools.conv_state), rec_pool(pools.recurrent_state);
  // Conv inputs: transposed weights and bias; the conv states are read from the read slots
  // in place (a bf16 pool's rows widened as the conv kernel stages them).
  Tensor weight(dtype, {k, cpad}), bias(dtype, {cpad});
  detail::conv_parameters(in.conv_weight, in.conv_bias, k, d, cpad,
                          static_cast<Real*>(weight.raw()), static_cast<Real*>(bias.raw()));
  std::vector<detail::Sequence> seqs(static_cast<std::size_t>(n));
  for (std::int64_t s = 0; s < n; ++s) {
    seqs[static_cast<std::size_t>(s)] = {0, token_start[s], token_start[s + 1] - token_start[s], 0};
  }
  Tensor xh(dtype, {tokens, d});
  detail::ConvProblem conv;
  conv.tokens = tokens;
  conv.channels = d;
  conv.taps = k;
  conv.cpad = cpad;
  conv.num_seqs = n;
  conv.seqs = seqs.data();
  conv.dtype = dtype;
  conv.x_dtype = v.layer.dtype;
  conv.x = static_cast<const std::byte*>(qkv.data);
  conv.x_token = qkv.strides[0];
  conv.x_channel = qkv.strides[1];
  conv.weight = static_cast<const std::byte*>(weight.raw());
  conv.bias = static_cast<const std::byte*>(bias.raw());
  // The speculative layout's windows read their conv history from columns conv_column[s] on
  // of their own buffer, which they rewrite: always through a copy, also kept for the writes.
  const bool windows = v.spec_layout && first < v.decode_end;
  Tensor history;
  std::vector<std::int64_t> history_block;
  if (k > 1 && windows) {
    history = Tensor(dtype, {n, k - 1, d});
    history_block.assign(static_cast<std::size_t>(n), -1);
    Real* h = static_cast<Real*>(history.raw());
    std::fill(h, h + n * (k - 1) * d, Real{0});
    for (std::int64_t s = 0; s < n; ++s) {
      if (read_slot[s] < 0) continue;
      conv_pool.read_part(v.write_slot[first + s], v.conv_column[first + s] * d, (k - 1) * d,
                          h + s * (k - 1) * d);
      history_block[static_cast<std::size_t>(s)] = s;
    }
    conv.state_in = static_cast<const std::byte*>(history.raw());
    conv.state_block = history_block.data();
  } else {
    conv.state_in = k > 1 ? static_cast<const std::byte*>(conv_pool.data) : nullptr;
    conv.state_block = read_slot;
    conv.state_stride = conv_pool.stride;
    conv.state_bf16 = conv_pool.bf16;
  }
  conv.xh = static_cast<std::byte*>(xh.raw());
  cpu::conv_forward(conv, o.isa, o.threads);

  if (windows) {
    const Real* h = static_cast<const Real*>(history.raw());
    if (conv_pool.bf16) {
      write_spec_conv_states<Real, std::uint16_t>(in, conv_pool, v, first, last, h);
    } else {
      write_spec_conv_states<Real, Real>(in, conv_pool, v, first, last, h);
    }
  } else if (conv_pool.bf16) {
    write_conv_states<Real, std::uint16_t>(in, conv_pool, v, first, last);
  } else {
    write_conv_states<Real, Real>(in, conv_pool, v, first, last);
  }

  Tensor g(dtype, {tokens, hv}), beta(dtype, {tokens, hv});
  detail::layer_gates(rows(in.a, t0, t0 + tokens), rows(in.b, t0, t0 + tokens), in.A_log,
                      in.dt_bias, tokens, hv, static_cast<Real*>(g.raw()),
                      static_cast<Real*>(beta.raw()));

  detail::DecodeProblem p;
  p.num_seqs = n;
  p.hk = o.hk;
  p.hv = hv;
  p.dk = o.dk;
  p.dv = o.dv;
  p.channels = d;
  p.dtype = dtype;
  p.scale = 1.0 / std::sqrt(static_cast<double>(o.dk));
  p.vblocks = plan.vblocks;
  p.token_start = token_start.data();
  p.write_slot = v.write_slot.data() + first;
  p.read_slot = read_slot;
  p.token_slot = windows ? v.token_slot.data() + t0 : nullptr;
  p.xh = static_cast<const std::byte*>(xh.raw());
  p.g = static_cast<const std::byte*>(g.raw());
  p.beta = static_cast<const std::byte*>(beta.raw());
  p.state_dtype = pools.recurrent_state.dtype;
  p.state = rec_pool.data;
  p.slot_stride = rec_pool.stride;
  // 16-bit out: the decode kernel writes float32 rows, rounded into out once.
  const std::int64_t width = hv * o.dv;
  Tensor out32 = narrow ? Tensor(dtype, {tokens, width}) : Tensor{};
  p.out = narrow ? static_cast<std::byte*>(out32.raw()) : static_cast<std::byte*>(out.data);
  p.out_token = narrow ? width : out.strides[0];
  p.out_channel = narrow ? 1 : out.strides[1];
  cpu::decode(p, plan.isa, plan.threads);
  if (narrow) {
    const Real* from = static_cast<const Real*>(out32.raw());
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t c = 0; c < width; ++c) {
        detail::store_element<Real>(out, t * out.strides[0] + c * out.strides[1],
                                    from[t * width + c]);
      }
    }
  }
}

// Runs of consecutive live sequences that take the same path, in batch order (no live
// sequence reads a slot that another writes, so the order does not matter).
// The speculative layout's pools for the sequences other than its windows: the conv pool's
// first K - 1 columns of every slot, a pool with a slot stride of K - 1 + n columns.
StatePools first_conv_columns(const StatePools& pools, const ValidatedStep& v) {
  StatePools narrow = pools;
  if (v.spec_layout) narrow.conv_state.sizes[1] = v.layer.taps - 1;
  return narrow;
}

template <class Real>
void step_cpu(const StepInputs& in, const StatePools& pools, const MutableTensorView& out,
              const StepOptions& o, const ValidatedStep& v, const Plan& decode_plan) {
  const StatePools narrow = first_conv_columns(pools, v);
  for (std::int64_t first = 0; first < v.mixed_end;) {
    const bool decode = v.decode_path(first);
    // The speculative layout's windows, [0, decode_end), run apart from the other sequences.
    const bool windows = v.spec_layout && first < v.decode_end;
    std::int64_t last = first + 1;
    while (last < v.mixed_end && v.decode_path(last) == decode &&
           (!v.spec_layout || (last < v.decode_end) == windows))
      ++last;
    if (decode) {
      run_decodes<Real>(in, windows ? pools : narrow, out, o, v, decode_plan, first, last);
    } else {
      run_prefills<Real>(in, narrow, out, o, v, first, last,
                         [&](const LayerInputs& li, const LayerOutputs& lo) {
                           detail::fused_gdn_fwd_unchecked(li, lo, o);
                         });
    }
    first = last;
  }
  zero_rows(out, v.query_start[v.mixed_end], v.layer.tokens);
}

// The reference of window s of the speculative layout, token by token from gdn/step.h's rules:
// token t starts from the recurrent state in slot token_slot[t - 1] (t = 0: the read slot) and
// the conv state in columns [t - 1, t - 1 + K - 1) of the buffer (t = 0: from column a - 1),
// and writes its states to slot token_slot[t] and columns [t, t + K - 1).
void spec_window_reference(const StepInputs& in, const StatePools& pools,
                           const MutableTensorView& out, const StepOptions& o,
                           const ValidatedStep& v, std::int64_t s) {
  const Pool<double> buffer(pools.conv_state), rec_pool(pools.recurrent_state);
  const std::int64_t k = v.layer.taps, d = v.layer.channels, c = v.write_slot[s];
  const std::int64_t t0 = v.query_start[s], t1 = v.query_start[s + 1];
  const bool history = v.read_slot[s] >= 0;
  for (std::int64_t t = 0; t0 + t < t1; ++t) {
    Tensor conv(DType::f64, {1, k - 1, d}), rec(DType::f64, {1, o.hv, o.dk, o.dv});
    auto* conv_values = static_cast<double*>(conv.raw());
    auto* rec_values = static_cast<double*>(rec.raw());
    if (t > 0) {
      buffer.read_part(c, (t - 1) * d, (k - 1) * d, conv_values);
      rec_pool.read(v.token_slot[t0 + t - 1], rec_values);
    } else if (history) {
      buffer.read_part(c, v.conv_column[s] * d, (k - 1) * d, conv_values);
      rec_pool.read(v.read_slot[s], rec_values);
    }
    const std::int64_t a = t0 + t, b = a + 1;
    ref::fused_gdn_fwd(
        LayerInputs{rows(in.qkv, a, b), rows(in.a, a, b), rows(in.b, a, b), in.conv_weight,
                    in.conv_bias, in.A_log, in.dt_bias, conv.view(), rec.view(), TensorView{}},
        LayerOutputs{rows(out, a, b), conv.mutable_view(), rec.mutable_view(), MutableTensorView{},
                     MutableTensorView{}},
        o);
    buffer.write_part(c, t * d, (k - 1) * d, conv_values);
    rec_pool.write(v.token_slot[a], rec_values);
  }
}

// The reference: each live sequence alone; a decode window token by token, each position's
// states into the next slot.
void step_reference(const StepInputs& in, const StatePools& pools, const MutableTensorView& out,
                    const StepOptions& o, const ValidatedStep& v) {
  const Pool<double> conv_pool(first_conv_columns(pools, v).conv_state),
      rec_pool(pools.recurrent_state);
  const std::int64_t k = v.layer.taps, d = v.layer.channels;
  for (std::int64_t s = 0; s < v.mixed_end; ++s) {
    const bool decode = s < v.decode_end;
    if (v.spec_layout && decode) {
      spec_window_reference(in, pools, out, o, v, s);
      continue;
    }
    const std::int64_t t0 = v.query_start[s], t1 = v.query_start[s + 1];
    std::int64_t read = v.read_slot[s];
    for (std::int64_t a = t0; a < t1; a = decode ? a + 1 : t1) {
      const std::int64_t b = decode ? a + 1 : t1;
      Tensor conv(DType::f64, {1, k - 1, d}), rec(DType::f64, {1, o.hv, o.dk, o.dv});
      if (read >= 0) {
        conv_pool.read(read, static_cast<double*>(conv.raw()));
        rec_pool.read(read, static_cast<double*>(rec.raw()));
      }
      ref::fused_gdn_fwd(
          LayerInputs{rows(in.qkv, a, b), rows(in.a, a, b), rows(in.b, a, b), in.conv_weight,
                      in.conv_bias, in.A_log, in.dt_bias, conv.view(), rec.view(), TensorView{}},
          LayerOutputs{rows(out, a, b), conv.mutable_view(), rec.mutable_view(),
                       MutableTensorView{}, MutableTensorView{}},
          o);
      const std::int64_t write = v.write_slot[s] + (decode ? a - t0 : 0);
      conv_pool.write(write, static_cast<const double*>(conv.raw()));
      rec_pool.write(write, static_cast<const double*>(rec.raw()));
      read = write;
    }
  }
  zero_rows(out, v.query_start[v.mixed_end], v.layer.tokens);
}

// out [T, Hv Dv] for the allocating forms: the dtype of qkv, or f64 for the reference (the
// inputs checked first, so that a bad qkv is reported as such).
Tensor allocate_out(const StepInputs& in, const StepOptions& options, bool reference) {
  detail::ValidatedLayer layer;
  detail::validate_layer_inputs(
      LayerInputs{in.qkv, in.a, in.b, in.conv_weight, in.conv_bias, in.A_log, in.dt_bias,
                  TensorView{}, TensorView{}, TensorView{}},
      options, &layer);
  return Tensor(reference ? DType::f64 : layer.dtype, {layer.tokens, options.hv * options.dv});
}

// Check mode in the speculative layout: the parts of the pools that the live sequences read
// (`reads`: the history they start from) or write, one slot at a time, each passed to `visit`
// as a NamedTensor (first_row: the slot). A conv buffer's columns that a sequence neither
// reads nor writes are never looked at: they may hold anything (a freed slot's leftovers).
template <class Visit>
void spec_parts(const StatePools& pools, const ValidatedStep& v, bool reads, Visit&& visit) {
  const std::int64_t k = v.layer.taps;
  auto conv = [&](std::int64_t slot, std::int64_t column, std::int64_t count) {
    MutableTensorView part = rows(pools.conv_state, slot, slot + 1);
    part.data = static_cast<char*>(part.data) +
                column * part.strides[1] * static_cast<std::int64_t>(dtype_size(part.dtype));
    part.sizes[1] = count;
    visit(detail::NamedTensor{"conv_state", part, -1, slot});
  };
  auto rec = [&](std::int64_t slot) {
    visit(detail::NamedTensor{"recurrent_state", rows(pools.recurrent_state, slot, slot + 1), -1,
                              slot});
  };
  for (std::int64_t s = 0; s < v.mixed_end; ++s) {
    const std::int64_t t0 = v.query_start[s], t1 = v.query_start[s + 1];
    const std::int64_t read = v.read_slot[s], write = v.write_slot[s];
    const bool window = s < v.decode_end;
    if (reads && read >= 0) {
      conv(window ? write : read, window ? v.conv_column[s] : 0, k - 1);
      rec(read);
    } else if (!reads) {
      conv(write, 0, window ? (k > 1 ? k - 2 + t1 - t0 : 0) : k - 1);
      if (!window) rec(write);
      for (std::int64_t t = t0; window && t < t1; ++t) rec(v.token_slot[t]);
    }
  }
}

// The pool a spec_parts part names.
const MutableTensorView& pools_view(const StatePools& pools, const char* name) {
  return std::string_view(name) == "conv_state" ? pools.conv_state : pools.recurrent_state;
}

}  // namespace

namespace detail {

Plan decode_plan(const StepOptions& o, const ValidatedStep& v, const cpu::PlanForce& force) {
  PlanProblem p;
  p.op = PlanOp::decode;
  // Every sequence on the decode path (a plan for one when there are none).
  p.num_seqs = 0;
  for (std::int64_t s = 0; s < v.mixed_end; ++s) {
    if (!v.decode_path(s)) continue;
    ++p.num_seqs;
    p.tokens = std::max(p.tokens, v.query_start[s + 1] - v.query_start[s]);
  }
  p.num_seqs = std::max<std::int64_t>(p.num_seqs, 1);
  p.hk = o.hk;
  p.hv = o.hv;
  p.dk = o.dk;
  p.dv = o.dv;
  p.dtype = v.layer.dtype;
  ForwardOptions f;
  f.threads = o.threads;
  f.isa = o.isa;
  return cpu::make_plan(p, f, force);
}

void fused_gdn_step(const StepInputs& inputs, const StatePools& pools, const MutableTensorView& out,
                    const StepOptions& options, const cpu::PlanForce& force) {
  ValidatedStep v;
  validate_step(inputs, pools, out, options, OutputPrecision::native, &v);
  // Planned before anything is written: a forced split the batch cannot take throws here.
  const Plan plan = decode_plan(options, v, force);
  const bool check = check_finite_enabled(options.check_finite);
  // Only the live tokens: Tokamax's padding rows may hold anything.
  const std::int64_t live = v.query_start[static_cast<std::size_t>(v.mixed_end)];
  // Check mode: the slots the step writes are kept, and put back when its results turn out
  // non-finite, so that a step that throws has changed no slot (an engine may retry it).
  StateBackup backup;
  // Slots [slot, slot + count) of both pools, scanned.
  auto check_slots = [&](std::int64_t slot, std::int64_t count, Written written) {
    check_finite({{"conv_state", rows(pools.conv_state, slot, slot + count), -1, slot},
                  {"recurrent_state", rows(pools.recurrent_state, slot, slot + count), -1, slot}},
                 written);
  };
  if (check) {
    check_finite({{"qkv", inputs.qkv, live},
                  {"a", inputs.a, live},
                  {"b", inputs.b, live},
                  {"conv_weight", inputs.conv_weight},
                  {"conv_bias", inputs.conv_bias},
                  {"A_log", inputs.A_log},
                  {"dt_bias", inputs.dt_bias}},
                 Written::nothing);
    if (v.spec_layout) {
      spec_parts(pools, v, true,
                 [&](const detail::NamedTensor& part) { check_finite({part}, Written::nothing); });
      spec_parts(pools, v, false, [&](const detail::NamedTensor& part) {
        backup.save(rows(pools_view(pools, part.name), part.first_row, part.first_row + 1));
      });
    } else {
      for (std::int64_t s = 0; s < v.mixed_end; ++s) {
        const std::int64_t read = v.read_slot[s];
        if (read >= 0) check_slots(read, 1, Written::nothing);
      }
      // Slot by slot: each is one dense block (one copy), whatever the pools' slot stride.
      for (std::int64_t s = 0; s < v.mixed_end; ++s) {
        for (std::int64_t x = v.write_slot[s]; x < v.write_slot[s] + v.slots_written(s); ++x) {
          backup.save(rows(pools.conv_state, x, x + 1));
          backup.save(rows(pools.recurrent_state, x, x + 1));
        }
      }
    }
  }
  restoring_on_error(backup, [&] {
    {
      const cpu::SubnormalsAsZero mode;
      if (v.layer.dtype == DType::f64) {
        step_cpu<double>(inputs, pools, out, options, v, plan);
      } else {
        step_cpu<float>(inputs, pools, out, options, v, plan);
      }
    }
    if (check) {
      check_finite({{"out", out, live}}, Written::pools_restored);
      if (v.spec_layout) {
        spec_parts(pools, v, false, [&](const detail::NamedTensor& part) {
          check_finite({part}, Written::pools_restored);
        });
      } else {
        for (std::int64_t s = 0; s < v.mixed_end; ++s) {
          check_slots(v.write_slot[s], v.slots_written(s), Written::pools_restored);
        }
      }
    }
  });
}

}  // namespace detail

void fused_gdn_step(const StepInputs& inputs, const StatePools& pools, const MutableTensorView& out,
                    const StepOptions& options) {
  detail::fused_gdn_step(inputs, pools, out, options, cpu::PlanForce{});
}

void check_fused_gdn_step(const StepInputs& inputs, const StatePools& pools,
                          const MutableTensorView& out, const StepOptions& options) {
  ValidatedStep v;
  detail::validate_step(inputs, pools, out, options, detail::OutputPrecision::native, &v);
}

Tensor fused_gdn_step(const StepInputs& inputs, const StatePools& pools,
                      const StepOptions& options) {
  Tensor out = allocate_out(inputs, options, false);
  fused_gdn_step(inputs, pools, out.mutable_view(), options);
  return out;
}

namespace ref {

void fused_gdn_step(const StepInputs& inputs, const StatePools& pools, const MutableTensorView& out,
                    const StepOptions& options) {
  ValidatedStep v;
  detail::validate_step(inputs, pools, out, options, detail::OutputPrecision::float64, &v);
  step_reference(inputs, pools, out, options, v);
}

Tensor fused_gdn_step(const StepInputs& inputs, const StatePools& pools,
                      const StepOptions& options) {
  Tensor out = allocate_out(inputs, options, true);
  ref::fused_gdn_step(inputs, pools, out.mutable_view(), options);
  return out;
}

}  // namespace ref

}  // namespace gdn
