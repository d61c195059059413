// gemm_test.cc: the matrix product of every compiled ISA variant (src/cpu/gemm-inl.h, reached
// through KernelTable::gemm_f32), in float32 and with bf16 operands (the float32 emulation, or
// vdpbf16ps in the avx512_bf16 variant), against a float64 product of the same operands: the
// float32 ones, or the ones rounded to bf16 (round to nearest even). The only difference left
// is float32 summation, so the bound is tight: per element, 2 k eps32 times the sum of |A B|
// terms (plus |c_scale C|), which no misplaced pair, skipped row or wrong triangle stays under.
//
// Shapes: odd m and k (one pair short, an MR remainder), n an odd number of vectors (n must be
// a multiple of the lane count: rows are padded), every GemmShape, A read row-wise and
// transposed, Accumulate with c_scale != 1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/isas.h"
#include "cpu/kernels.h"
#include "cpu/workspace.h"
#include "gdn/gdn.h"

namespace gdn {
namespace {

constexpr double kEpsF32 = 1.1920928955078125e-07;

float bf16_round(float x) { return bf16_value(bf16_bits(x)); }

struct Case {
  std::int64_t m, n, k;
  unsigned shape;
  bool transposed_a;
  bool accumulate;
};

std::string describe(CpuIsa isa, const Case& c, bool bf16) {
  return std::string(cpu_isa_name(isa)) + (bf16 ? " bf16" : " f32") + " m=" + std::to_string(c.m) +
         " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " shape=" + std::to_string(c.shape) + (c.transposed_a ? " A^T" : " A") +
         (c.accumulate ? " accumulate" : "");
}

// Runs one case on `isa` and checks every wanted element of C.
void check_case(CpuIsa isa, const Case& c, bool bf16, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::int64_t lda = cpu::padded(c.transposed_a ? c.m : c.k) + 16;  // rows of memory
  const std::int64_t ldb = c.n + 16, ldc = c.n + 16;
  const std::int64_t a_rows = c.transposed_a ? c.k : c.m;
  std::vector<float> a(a_rows * lda), b(c.k * ldb), cmat(c.m * ldc);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  for (float& x : cmat) x = dist(rng);
  const std::int64_t a_row = c.transposed_a ? 1 : lda, a_col = c.transposed_a ? lda : 1;
  auto a_at = [&](std::int64_t i, std::int64_t p) -> float& { return a[i * a_row + p * a_col]; };
  // The shape's zero triangle holds zeros, as the stages' buffers do.
  for (std::int64_t i = 0; i < c.m; ++i)
    for (std::int64_t p = 0; p < c.k; ++p)
      if (((c.shape & cpu::kGemmLowerA) && p > i) || ((c.shape & cpu::kGemmUpperA) && p < i))
        a_at(i, p) = 0;
  const float c_scale = c.accumulate ? 0.75f : 1.0f;
  const std::vector<float> c0 = cmat;
  std::vector<float> scratch(
      bf16 ? static_cast<std::size_t>(cpu::bf16_scratch_elements(c.k, c.n, c.m)) + 64 : 0);
  // The scratch starts 64-byte aligned, as the workspace's buffers do.
  float* scratch_at = nullptr;
  if (bf16) {
    auto address = reinterpret_cast<std::uintptr_t>(scratch.data());
    scratch_at = scratch.data() + ((64 - address % 64) % 64) / sizeof(float);
  }
  cpu::kernel_table(isa).gemm_f32(c.accumulate, c.m, c.n, c.k, a.data(), a_row, a_col, b.data(),
                                  ldb, cmat.data(), ldc, c_scale, c.shape, scratch_at);

  double worst = 0;
  std::int64_t worst_i = -1, worst_j = -1;
  for (std::int64_t i = 0; i < c.m; ++i) {
    for (std::int64_t j = 0; j < c.n; ++j) {
      if ((c.shape & cpu::kGemmLowerC) && j > i) continue;
      double sum = 0, magnitude = 0;
      if (c.accumulate) {
        sum = static_cast<double>(c_scale) * c0[i * ldc + j];
        magnitude = std::fabs(sum);
      }
      for (std::int64_t p = 0; p < c.k; ++p) {
        float x = a_at(i, p), y = b[p * ldb + j];
        if (bf16) {
          x = bf16_round(x);
          y = bf16_round(y);
        }
        sum += static_cast<double>(x) * y;
        magnitude += std::fabs(static_cast<double>(x) * y);
      }
      const double bound = 2.0 * (c.k + 2) * kEpsF32 * magnitude + 1e-30;
      const double ratio = std::fabs(cmat[i * ldc + j] - sum) / bound;
      if (!(ratio <= worst) && !std::isnan(worst)) {
        worst = ratio;
        worst_i = i;
        worst_j = j;
      }
    }
  }
  EXPECT_LE(worst, 1.0) << describe(isa, c, bf16) << ": worst error at C(" << worst_i << ", "
                        << worst_j << ") is " << worst << " x the float32 summation bound";
}

TEST(Gemm, EveryVariantShapeAndPrecisionAgainstFloat64) {
  std::mt19937 rng(17);
  std::vector<Case> cases;
  for (unsigned shape : {cpu::kGemmFull, cpu::kGemmLowerA, cpu::kGemmLowerC, cpu::kGemmUpperA,
                         cpu::kGemmLowerA | cpu::kGemmLowerC}) {
    for (bool transposed : {false, true}) {
      for (bool accumulate : {false, true}) {
        const bool square = shape != cpu::kGemmFull && shape != cpu::kGemmLowerC;
        // Triangular A is square (k = m); odd sizes leave a pair short and an MR remainder.
        cases.push_back({37, 48, square ? 37 : 29, shape, transposed, accumulate});
        cases.push_back({64, 80, square ? 64 : 128, shape, transposed, accumulate});
        cases.push_back({1, 16, 1, shape, transposed, accumulate});
        cases.push_back({9, 32, square ? 9 : 3, shape, transposed, accumulate});
      }
    }
  }
  int ran = 0;
  for (CpuIsa isa : test::runnable_isas()) {
    for (const Case& c : cases) {
      for (bool bf16 : {false, true}) {
        // n is a multiple of every variant's lanes (16 floats is the widest).
        check_case(isa, c, bf16, rng);
      }
    }
    ++ran;
  }
  EXPECT_GE(ran, 1);
}

// The avx512_bf16 variant's own product runs only where the CPU has the instruction; elsewhere
// this says so, by name, instead of passing.
TEST(Gemm, Avx512Bf16KernelRuns) {
  if (!cpu_isa_available(CpuIsa::avx512_bf16)) {
    GTEST_SKIP() << "avx512_bf16 variant: " << cpu_isa_unavailable_reason(CpuIsa::avx512_bf16);
  }
  std::mt19937 rng(5);
  check_case(CpuIsa::avx512_bf16, {65, 144, 127, cpu::kGemmFull, false, true}, true, rng);
}

}  // namespace
}  // namespace gdn
