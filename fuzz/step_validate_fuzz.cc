// step_validate_fuzz.cc: the serving step's validation (fused_gdn_step, its float64
// reference, check_fused_gdn_step) driven from fuzzed bytes: a batch of decodes (with
// speculative windows), prefills and padding; query_start_loc, state_indices, seq_lens,
// distribution, read_offsets, read_state_indices; pool shapes and dtypes (f32, bf16, f64);
// num_spec; qkv, gates, parameters and out. fuzz_views.h has the views and the oracle: a
// rejected step leaves both pools (the arena) bit-identical.
#include "fuzz_views.h"

using gdn::DType;
using gdn::fuzz::Case;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider f(data, size);
  Case c(f);
  const int op = f.ConsumeIntegralInRange<int>(0, 2);  // step, ref step, check only
  const bool ref = op == 1;
  constexpr DType kActs[] = {DType::f32, DType::f64, DType::bf16, DType::f16};
  const DType act = ref ? DType::f64 : kActs[f.ConsumeIntegralInRange<int>(0, 3)];
  const DType cmp = act == DType::f64 ? DType::f64 : DType::f32;
  const std::int64_t hk = f.ConsumeIntegralInRange<std::int64_t>(1, 2);
  const std::int64_t hv = hk * f.ConsumeIntegralInRange<std::int64_t>(1, 2);
  const std::int64_t dk = f.ConsumeIntegralInRange<std::int64_t>(1, 4);
  const std::int64_t dv = f.ConsumeIntegralInRange<std::int64_t>(1, 4);
  const std::int64_t d = 2 * hk * dk + hv * dv;
  const std::int64_t taps = f.ConsumeIntegralInRange<std::int64_t>(1, 4);
  const std::int64_t num_spec = f.ConsumeIntegralInRange<std::int64_t>(0, 2);

  // The batch: decodes, then prefills, then padding sequences.
  const std::int64_t n = f.ConsumeIntegralInRange<std::int64_t>(0, 4);
  const std::int64_t decodes = f.ConsumeIntegralInRange<std::int64_t>(0, n);
  const std::int64_t live = f.ConsumeIntegralInRange<std::int64_t>(decodes, n);
  const std::int64_t prefill_end = f.ConsumeIntegralInRange<std::int64_t>(decodes, live);
  std::vector<std::int64_t> qsl = {0}, slots, lens, offsets, reads;
  std::int64_t next_slot = 1;
  for (std::int64_t s = 0; s < n; ++s) {
    const bool decode = s < decodes;
    const std::int64_t len = s >= live ? 0
                             : decode  ? f.ConsumeIntegralInRange<std::int64_t>(1, 1 + num_spec)
                                       : f.ConsumeIntegralInRange<std::int64_t>(1, 4);
    qsl.push_back(qsl.back() + len);
    slots.push_back(next_slot);
    next_slot += decode ? 1 + num_spec : 1;
    lens.push_back(len + f.ConsumeIntegralInRange<std::int64_t>(0, 2));  // history
    offsets.push_back(0);
    reads.push_back(slots.back());
  }
  const std::int64_t t = qsl.back() + f.ConsumeIntegralInRange<std::int64_t>(0, 2);  // a tail
  const std::int64_t num_slots = next_slot + f.ConsumeIntegralInRange<std::int64_t>(0, 2);

  gdn::StepOptions options;
  options.hk = c.pick(hk, {0, -1, hk + 1});
  options.hv = c.pick(hv, {0, -1, hv + 1});
  options.dk = c.pick(dk, {0, dk + 1, 257});
  options.dv = c.pick(dv, {0, dv + 1, 257});
  options.chunk_size = static_cast<int>(c.pick(64, {0, 1, 2, -1, 257}));
  options.threads = static_cast<int>(c.pick(1, {0, -1, 1025}));
  options.isa = static_cast<gdn::CpuIsa>(c.pick(0, {1, 2, 3, 4, 9}));
  options.matmul_precision = static_cast<gdn::MatmulPrecision>(c.pick(0, {1, 2}));
  options.num_spec = c.pick(num_spec, {num_spec + 1, 0, -1, 1024, 1025});

  gdn::StepInputs in;
  in.qkv = c.view(act, {t, d});
  in.a = c.view(act, {t, hv});
  in.b = c.view(act, {t, hv});
  in.conv_weight = c.view(cmp, f.ConsumeBool() ? std::vector<std::int64_t>{d, 1, taps}
                                               : std::vector<std::int64_t>{d, taps});
  if (f.ConsumeBool()) in.conv_bias = c.view(cmp, {d});
  in.A_log = c.view(cmp, {hv});
  in.dt_bias = c.view(cmp, {hv});
  in.query_start_loc = c.index(qsl);
  in.state_indices = c.index(slots);
  in.seq_lens = c.index(lens);
  in.distribution = c.index({decodes, prefill_end, live});
  in.read_offsets = c.index(offsets, f.ConsumeBool());
  in.read_state_indices = c.index(reads, f.ConsumeBool());
  // Pools: f32 or bf16 (each on its own), f64 for f64 inputs; maybe the wrong one.
  const DType conv_pool = act == DType::f64 ? DType::f64 : (f.ConsumeBool() ? DType::bf16 : DType::f32);
  const DType rec_pool = act == DType::f64 ? DType::f64 : (f.ConsumeBool() ? DType::bf16 : DType::f32);
  gdn::StatePools pools;
  pools.conv_state = c.out(conv_pool, {num_slots, taps - 1, d});
  pools.recurrent_state = c.out(rec_pool, {num_slots, hv, dk, dv});
  const gdn::MutableTensorView out = c.out(ref ? DType::f64 : act, {t, hv * dv});
  c.finish();

  if (op == 2 || !c.safe()) {
    // Validation alone: it reads only the index tensors.
    Case::check_validation([&] { gdn::check_fused_gdn_step(in, pools, out, options); });
    return 0;
  }
  const bool allocating = f.ConsumeBool() && in.qkv.rank == 2 && in.qkv.sizes[0] <= 64;
  c.check_call(
      [&] {
        if (allocating) {  // out is its own
          if (ref) {
            gdn::ref::fused_gdn_step(in, pools, options);
          } else {
            gdn::fused_gdn_step(in, pools, options);
          }
        } else if (ref) {
          gdn::ref::fused_gdn_step(in, pools, out, options);
        } else {
          gdn::fused_gdn_step(in, pools, out, options);
        }
      },
      {&pools.conv_state, &pools.recurrent_state, allocating ? nullptr : &out});
  return 0;
}
