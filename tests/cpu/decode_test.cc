// decode_test.cc: the decode kernel of the serving step (src/cpu/decode-inl.h) over a bf16
// pool, called directly (src/cpu/layer.h: cpu::decode) so that the float32 values it rounds can
// be chosen: ties to even at both parities, a tie that rounds past the largest finite bf16,
// NaNs whose rounding would carry into the sign, infinities. On every compiled ISA
// variant and every path of the kernel (blocks of vector pairs, of single vectors, with a
// tail), each slot value must be the float32 pool's, rounded once by gdn::bf16_bits, and out
// the float32 pool's out. The step-level rules (every mode, every split, the float64 oracle)
// are step_pools_test.cc's and plan_test.cc's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/isas.h"
#include "cpu/layer.h"
#include "gdn/gdn.h"

namespace gdn {
namespace {

float from_bits(std::uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}
std::uint32_t bits_of(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

// The float32 values whose rounding the test pins: ties (even and odd lsb, both signs), values
// next to a tie, the tie above the largest finite bf16 (rounds to infinity) and the value under
// it. (No subnormals: the step runs with them flushed, src/cpu/float_env.h.)
const std::uint32_t kTargets[] = {0x3f808000u, 0x3f818000u, 0xbf818000u, 0x3f808001u,
                                  0x3f817fffu, 0x7f7f8000u, 0x7f7f7fffu, 0xc0008000u};
// v values that make a column non-finite: NaNs (0xffffffff and 0x7fffffff round to zero if their
// rounding carries), a signalling NaN, infinities.
const std::uint32_t kNonFinite[] = {0x7fffffffu, 0xffffffffu, 0x7f800001u, 0x7f800000u,
                                    0xff800000u};

// One sequence, one head, one token: k = e0, g = 0 (alpha = 1), beta = 1, row 0 of the read
// slot zero, so that S'[0][j] = k0 v[j] (k0: e0 after the kernel's L2 norm, 1 / sqrt(1 +
// 1e-6)) and S'[r][j] = S[r][j] + 0 v[j] below it. v[j] is chosen so that k0 v[j] is a target
// (every float32 is k0 times some float32, k0 being just under 1); some columns get a
// non-finite v instead, the rest random values.
struct DecodeCase {
  std::int64_t dk = 16, dv = 0, channels = 0;
  std::vector<float> xh, g{0.0f}, beta{1.0f};
  std::vector<std::uint16_t> pool16;        // slots 0 (read) and 1 (written)
  std::vector<float> pool32;                // the same values, widened
  std::vector<std::int64_t> target_column;  // per kTargets entry: its first column
  std::vector<std::int64_t> token_start{0, 1}, write_slot{1}, read_slot{0};

  explicit DecodeCase(std::int64_t columns) : dv(columns), channels(2 * dk + columns) {
    const float k0 = 1.0f / std::sqrt(1.0f + 1e-6f);
    xh.assign(static_cast<std::size_t>(channels), 0.0f);
    std::uint32_t seed = 12345;
    auto random = [&] {
      seed = seed * 1664525u + 1013904223u;
      return static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
    };
    for (std::int64_t i = 0; i < dk; ++i) xh[static_cast<std::size_t>(i)] = random();
    xh[static_cast<std::size_t>(dk)] = 1.0f;  // k = e0
    float* v = xh.data() + 2 * dk;
    for (std::int64_t j = 0; j < dv; ++j) v[j] = random();
    // Targets from column 0 on, then non-finite values; each at an even and an odd column
    // where there is room.
    std::int64_t j = 0;
    for (const std::uint32_t t : kTargets) {
      target_column.push_back(j < dv ? j : -1);
      for (int copy = 0; copy < 2 && j < dv; ++copy, ++j) {
        // The float32 whose product with k0 rounds to the target: next to t / k0.
        float x = from_bits(t) / k0;
        while (bits_of(k0 * x) != t) x = std::nextafter(x, k0 * x < from_bits(t) ? 1e38f : -1e38f);
        v[j] = x;
      }
    }
    for (const std::uint32_t t : kNonFinite) {
      if (j < dv) v[j++] = from_bits(t);
    }
    const std::int64_t slot = dk * dv;
    pool16.assign(static_cast<std::size_t>(2 * slot), 0);
    for (std::int64_t i = dv; i < slot; ++i)
      pool16[static_cast<std::size_t>(i)] = bf16_bits(random());
    for (std::int64_t i = slot; i < 2 * slot; ++i)
      pool16[static_cast<std::size_t>(i)] = 0x7fc0;  // NaN
    for (const std::uint16_t h : pool16) pool32.push_back(bf16_value(h));
  }

  detail::DecodeProblem problem(bool bf16, std::byte* state, float* out) const {
    detail::DecodeProblem p;
    p.num_seqs = 1;
    p.hk = 1;
    p.hv = 1;
    p.dk = dk;
    p.dv = dv;
    p.channels = channels;
    p.dtype = DType::f32;
    p.state_dtype = bf16 ? DType::bf16 : DType::f32;
    p.scale = 1.0 / std::sqrt(static_cast<double>(dk));
    p.token_start = token_start.data();
    p.write_slot = write_slot.data();
    p.read_slot = read_slot.data();
    p.xh = reinterpret_cast<const std::byte*>(xh.data());
    p.g = reinterpret_cast<const std::byte*>(g.data());
    p.beta = reinterpret_cast<const std::byte*>(beta.data());
    p.state = state;
    p.slot_stride = dk * dv;
    p.out = reinterpret_cast<std::byte*>(out);
    p.out_token = dv;
    p.out_channel = 1;
    return p;
  }
};

// dv 64: blocks of vector pairs on every variant; 24: pairs on generic (4 lanes), three single
// vectors on avx2; 20: a tail on avx2 and avx512, single vectors on generic; 36: pairs and a
// tail nowhere whole.
TEST(CpuDecode, Bf16PoolRoundsTiesNansAndOverflowAsBf16Bits) {
  for (const std::int64_t dv : {64, 24, 20, 36}) {
    const DecodeCase c(dv);
    for (const CpuIsa isa : test::runnable_isas()) {
      const std::string what = "Dv " + std::to_string(dv) + ", " + cpu_isa_name(isa);
      std::vector<std::uint16_t> pool16 = c.pool16;
      std::vector<float> pool32 = c.pool32, out16(static_cast<std::size_t>(dv)),
                         out32(static_cast<std::size_t>(dv));
      cpu::decode(c.problem(true, reinterpret_cast<std::byte*>(pool16.data()), out16.data()), isa,
                  1);
      cpu::decode(c.problem(false, reinterpret_cast<std::byte*>(pool32.data()), out32.data()), isa,
                  1);
      // The test reaches what it means to: the float32 pool holds each target exactly.
      const std::int64_t slot = c.dk * dv;
      for (std::size_t i = 0; i < c.target_column.size(); ++i) {
        const std::int64_t j = c.target_column[i];
        if (j < 0) continue;
        EXPECT_EQ(bits_of(pool32[static_cast<std::size_t>(slot + j)]), kTargets[i])
            << "column " << j << ", " << what;
      }
      int mismatches = 0;
      for (std::int64_t i = 0; i < 2 * slot; ++i) {
        const std::uint16_t want = bf16_bits(pool32[static_cast<std::size_t>(i)]);
        const std::uint16_t got = pool16[static_cast<std::size_t>(i)];
        if (got != want && mismatches++ < 5) {
          ADD_FAILURE() << "slot " << i / slot << ", row " << i % slot / dv << ", column " << i % dv
                        << ": bf16 pool 0x" << std::hex << got << ", float32 pool 0x"
                        << bits_of(pool32[static_cast<std::size_t>(i)]) << " rounded 0x" << want
                        << std::dec << ", " << what;
        }
      }
      EXPECT_EQ(mismatches, 0) << what;
      EXPECT_EQ(std::memcmp(out16.data(), out32.data(), out16.size() * sizeof(float)), 0)
          << "out, " << what;
    }
  }
}

}  // namespace
}  // namespace gdn
