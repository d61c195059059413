// gemm_compare.cc: lab harness comparing matrix-product libraries with our register-tiled
// product (src/cpu/gemm-inl.h) on the shapes of the chunked GDN forward at chunk C = 64 and
// head dim d = 128. Single-threaded, float32, row-major operands that stay in L1/L2 (the same
// small buffers reused for every call), median of several trials of many calls each; every
// library's result is first checked against a float64 product of the same operands, and a
// call that fails the check is not timed. Not part of the library or the test suite; build
// with -DGDN_BUILD_DEV=ON (each library only when CMake finds it, see dev/CMakeLists.txt):
//
//   build/.../dev/gemm_compare [--json] [--trials N] [--isa avx2|avx512|generic] [--bf16]
//
// --bf16: the operands are bf16 values (float32 buffers holding bf16-rounded numbers, so the
// float64 reference is that of the bf16 operands), and beside the float32 rows it times our
// bf16-operand product (the avx512_bf16 variant's vdpbf16ps kernel, packing from the float32
// buffers included) and the libraries' bf16 products: oneDNN's matmul and BRGeMM ukernel,
// oneMKL's cblas_gemm_bf16bf16f32 (bf16 copies made outside the timed call, float32 output).
// The % peak of a bf16 row is of the vdpbf16ps peak measured in the run.
//
// The libraries: OpenBLAS, libxsmm, oneDNN (2.x or 3.x; its ukernel rows when it was built
// with ONEDNN_EXPERIMENTAL_UKERNEL=ON), Highway, and oneMKL from a prefix given as
// -DGDN_DEV_MKL_ROOT (docs/perf_matmul.md says how each was installed).
//
// The figures it prints are the comparison quoted in docs/perf_matmul.md.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/workspace.h"
#include "gdn/runtime.h"
#include "gdn/tensor.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef GDN_DEV_HAVE_OPENBLAS
#include <cblas.h>
#endif
#ifdef GDN_DEV_HAVE_LIBXSMM
#include <libxsmm.h>
#endif
#ifdef GDN_DEV_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#ifdef DNNL_EXPERIMENTAL_UKERNEL  // a oneDNN 3.x built with ONEDNN_EXPERIMENTAL_UKERNEL=ON
#include <oneapi/dnnl/dnnl_ukernel.hpp>
#endif
#endif

namespace gdn::dev {
// dev/gemm_compare_ours.cc, compiled once per ISA variant of the build.
#define GDN_DEV_OURS(variant)                                                              \
  void ours_gemm_##variant(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, \
                           std::int64_t a_row, std::int64_t a_col, const float* b,         \
                           std::int64_t ldb, float* c, std::int64_t ldc);                  \
  const char* ours_tile_##variant();
GDN_DEV_OURS(generic)
#ifdef GDN_DEV_HAVE_OURS_AVX2
GDN_DEV_OURS(avx2)
#endif
#ifdef GDN_DEV_HAVE_OURS_AVX512
GDN_DEV_OURS(avx512)
#endif
#undef GDN_DEV_OURS
using OursGemm = decltype(&ours_gemm_generic);
#ifdef GDN_DEV_HAVE_HWY
// dev/gemm_compare_hwy.cc: the same product written with Highway, dispatched at run time.
void hwy_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t a_row,
              std::int64_t a_col, const float* b, std::int64_t ldb, float* c, std::int64_t ldc);
const char* hwy_target();
int hwy_tile_rows();
#endif
#ifdef GDN_DEV_HAVE_MKL
// dev/gemm_compare_mkl.cc.
std::string mkl_init_sequential();
void mkl_sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c,
               std::int64_t ldc);
void mkl_gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b,
                   std::int64_t ldb, float* c, std::int64_t ldc);
void* mkl_jit_sgemm_create(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                           std::int64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldc,
                           const char** kind);
void mkl_jit_sgemm_run(void* jitter, const float* a, const float* b, float* c);
void mkl_jit_destroy_kernel(void* jitter);
#endif
}  // namespace gdn::dev

namespace {

using Clock = std::chrono::steady_clock;

// One product C[m x n] = op(A) op(B), row-major. A is stored m x k (lda = k), or k x m
// (lda = m) when trans_a; B is stored k x n (ldb = n), or n x k (ldb = k) when trans_b.
struct Shape {
  const char* name;  // what the chunked forward computes with it
  std::int64_t m, n, k;
  bool trans_a, trans_b;
};

// Chunk C = 64, head dims Dk = Dv = 128 (src/cpu/chunked_fwd-inl.h).
const Shape kShapes[] = {
    {"Q S (C x d . d x d)", 64, 128, 128, false, false},
    {"[Q;K] S (2C x d . d x d)", 128, 128, 128, false, false},
    {"Q K^T, K^T packed (C x d . d x C)", 64, 64, 128, false, false},
    {"Q K^T, K as is (A B^T)", 64, 64, 128, false, true},
    {"A V (C x C . C x d)", 64, 128, 64, false, false},
    {"K^T V (A^T B)", 128, 128, 64, true, false},
    {"K^T V, K^T packed (NN)", 128, 128, 64, false, false},
    {"tiny: per-call overhead", 8, 16, 8, false, false},
};

const char* op_name(const Shape& s) {
  if (s.trans_a) return s.trans_b ? "TT" : "TN";
  return s.trans_b ? "NT" : "NN";
}

struct Operands {
  std::int64_t lda, ldb, ldc;
  float* a;
  float* b;
  float* c;
  std::vector<double> ref;  // C in float64 from the same float operands
  double ref_rms;
};

float* alloc_floats(std::int64_t n) {
  const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(float) + 63) / 64 * 64;
  return static_cast<float*>(std::aligned_alloc(64, bytes));
}

// With bf16, every operand element is rounded to bf16 (nearest even) before use.
Operands make_operands(const Shape& s, bool bf16) {
  Operands o;
  o.lda = s.trans_a ? s.m : s.k;
  o.ldb = s.trans_b ? s.k : s.n;
  o.ldc = s.n;
  o.a = alloc_floats(s.m * s.k);
  o.b = alloc_floats(s.k * s.n);
  o.c = alloc_floats(s.m * s.n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(s.m * 131 + s.n * 7 + s.k);
  auto uniform = [&x]() {  // xorshift64*, values in [-1, 1)
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    return static_cast<float>(static_cast<double>((x * 0x2545f4914f6cdd1dull) >> 40) /
                                  static_cast<double>(1ull << 23) -
                              1.0);
  };
  auto value = [&]() {
    const float u = uniform();
    return bf16 ? gdn::bf16_value(gdn::bf16_bits(u)) : u;
  };
  for (std::int64_t i = 0; i < s.m * s.k; ++i) o.a[i] = value();
  for (std::int64_t i = 0; i < s.k * s.n; ++i) o.b[i] = value();
  auto a_at = [&](std::int64_t i, std::int64_t p) {
    return static_cast<double>(s.trans_a ? o.a[p * o.lda + i] : o.a[i * o.lda + p]);
  };
  auto b_at = [&](std::int64_t p, std::int64_t j) {
    return static_cast<double>(s.trans_b ? o.b[j * o.ldb + p] : o.b[p * o.ldb + j]);
  };
  o.ref.assign(static_cast<std::size_t>(s.m * s.n), 0.0);
  double sum_sq = 0;
  for (std::int64_t i = 0; i < s.m; ++i) {
    for (std::int64_t j = 0; j < s.n; ++j) {
      double acc = 0;
      for (std::int64_t p = 0; p < s.k; ++p) acc += a_at(i, p) * b_at(p, j);
      o.ref[i * s.n + j] = acc;
      sum_sq += acc * acc;
    }
  }
  o.ref_rms = std::sqrt(sum_sq / static_cast<double>(s.m * s.n));
  return o;
}

void free_operands(Operands& o) {
  std::free(o.a);
  std::free(o.b);
  std::free(o.c);
}

// The project's error measure (docs/numerics.md): max |c - ref| / rms(ref); NaN or an
// unwritten element (C is filled with NaN before the checked call) gives infinity.
double check_error(const Shape& s, const Operands& o) {
  double worst = 0;
  for (std::int64_t i = 0; i < s.m; ++i) {
    for (std::int64_t j = 0; j < s.n; ++j) {
      const double d = std::fabs(static_cast<double>(o.c[i * o.ldc + j]) - o.ref[i * s.n + j]);
      if (!(d <= std::numeric_limits<double>::max())) return INFINITY;
      worst = std::max(worst, d);
    }
  }
  return worst / o.ref_rms;
}

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
  std::int64_t calls_per_trial = 0;
};

struct Row {
  const Shape* shape = nullptr;
  std::string library;
  std::string kernel;  // which kernel the library chose, or why there is no figure
  bool ran = false;
  bool bf16 = false;  // a bf16-operand kernel: % peak of the vdpbf16ps peak
  double error = 0;
  std::function<void(std::int64_t)> run;  // the checked call, `reps` times in a row
  Timing timing;
};

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown CPU";
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out;
}

// Checks one library's call against the float64 product and, when it passes, calibrates its
// trial (about 20 ms of calls) and appends it to be timed.
template <class F>
void add(std::vector<Row>& rows, const Shape& s, Operands& o, std::string library,
         std::string kernel, F call) {
  Row row;
  row.shape = &s;
  row.library = std::move(library);
  row.kernel = std::move(kernel);
  std::fill(o.c, o.c + s.m * o.ldc, std::numeric_limits<float>::quiet_NaN());
  call();
  row.error = check_error(s, o);
  if (row.error <= 1e-4) {
    row.ran = true;
    row.run = [call](std::int64_t reps) {
      for (std::int64_t r = 0; r < reps; ++r) call();
    };
    row.run(3);  // warm: operands into cache, lazy setup done
    std::int64_t reps = 1;
    for (;;) {
      const auto t0 = Clock::now();
      row.run(reps);
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      if (seconds >= 2e-3) {
        reps = std::max<std::int64_t>(1, static_cast<std::int64_t>(reps * 20e-3 / seconds));
        break;
      }
      reps *= 4;
    }
    row.timing.calls_per_trial = reps;
  } else {
    row.kernel += " [FAILED the check: not timed]";
  }
  rows.push_back(std::move(row));
}

// Times the rows [first, end) of one shape in interleaved trials (each trial runs every
// library once, starting with a different one each time), so that a disturbance of the
// shared machine falls on all of them alike: median, min and max time per call.
void time_rows(std::vector<Row>& rows, std::size_t first, int trials) {
  const std::size_t count = rows.size() - first;
  std::vector<std::vector<double>> us(count);
  for (int t = 0; t < trials; ++t) {
    for (std::size_t i = 0; i < count; ++i) {
      Row& row = rows[first + (i + static_cast<std::size_t>(t)) % count];
      if (!row.ran) continue;
      const auto t0 = Clock::now();
      row.run(row.timing.calls_per_trial);
      us[(i + static_cast<std::size_t>(t)) % count].push_back(
          std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
          static_cast<double>(row.timing.calls_per_trial));
    }
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (us[i].empty()) continue;
    std::sort(us[i].begin(), us[i].end());
    Timing& timing = rows[first + i].timing;
    timing.median_us = us[i][us[i].size() / 2];
    timing.min_us = us[i].front();
    timing.max_us = us[i].back();
  }
}

void skip(std::vector<Row>& rows, const Shape& s, std::string library, std::string why) {
  Row row;
  row.shape = &s;
  row.library = std::move(library);
  row.kernel = std::move(why);
  rows.push_back(std::move(row));
}

#ifdef GDN_DEV_HAVE_DNNL
#ifdef DNNL_EXPERIMENTAL_UKERNEL
constexpr bool kDnnlUkernel = true;
#else
constexpr bool kDnnlUkernel = false;
#endif

dnnl::matmul::primitive_desc matmul_pd(const dnnl::engine& engine, const dnnl::memory::desc& a,
                                       const dnnl::memory::desc& b, const dnnl::memory::desc& c) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(engine, a, b, c);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), engine);
#endif
}
#endif

#if defined(GDN_DEV_HAVE_DNNL) && defined(DNNL_EXPERIMENTAL_UKERNEL)
// oneDNN's BRGeMM ukernel (its experimental API over the kernels its own matmul runs on x64).
// It reads A by rows only, and B either as is or as its transform ukernel packs it (bf16: in
// pairs along K), in blocks of at most 64 columns (the transform's widest; one kernel call per
// block). Where B needs the transform there are two rows: with the transform timed (in the
// forward B is new every chunk: the state, K^T or V) and with B packed once, untimed.
void add_ukernel_rows(std::vector<Row>& rows, const Shape& s, Operands& o, bool use_bf16,
                      const std::uint16_t* a16 = nullptr, const std::uint16_t* b16 = nullptr) {
  namespace uk = dnnl::ukernel;
  using dt = dnnl::memory::data_type;
  const std::string library = use_bf16 ? "oneDNN uk bf16" : "oneDNN uk";
  const dt type = use_bf16 ? dt::bf16 : dt::f32;
  const std::size_t first = rows.size();
  if (s.trans_a) {
    skip(rows, s, library, "n/a: the ukernel reads A by rows");
    return;
  }
  const uk::pack_type pack = uk::brgemm::get_B_pack_type(type, type);
  if (pack == uk::pack_type::undef) {
    skip(rows, s, library, "n/a: no ukernel for this data type on this CPU");
    return;
  }
  const bool transform = pack != uk::pack_type::no_trans || s.trans_b;
  const std::int64_t nb = transform ? std::min<std::int64_t>(s.n, 64) : s.n;  // block columns
  if (s.n % nb != 0) {
    skip(rows, s, library, "n/a: n is not a multiple of the 64-column block");
    return;
  }
  const std::int64_t ldb = transform ? nb : o.ldb;
  try {
    uk::brgemm brg(s.m, nb, s.k, 1, o.lda, ldb, o.ldc, type, type, dt::f32);
    brg.set_add_C(false);
    if (!brg.finalize()) {
      skip(rows, s, library, "n/a: the ukernel refused the shape");
      return;
    }
    brg.generate();
    auto scratch = std::make_shared<std::vector<unsigned char>>(brg.get_scratchpad_size() + 64);
    const void* a = use_bf16 ? static_cast<const void*>(a16) : o.a;
    const void* b = use_bf16 ? static_cast<const void*>(b16) : o.b;
    const std::vector<std::pair<dnnl::memory::dim, dnnl::memory::dim>> offsets = {{0, 0}};
    if (!transform) {
      add(rows, s, o, library, "brgemm ukernel, B as is", [brg, a, b, offsets, scratch, &o] {
        // AMX's tile configuration (nothing elsewhere), set per call: the rows timed in
        // between (oneDNN's matmul, MKL) may configure or release the tiles.
        brg.set_hw_context();
        brg.execute(a, b, offsets, o.c, scratch->data());
      });
    } else {
      // One transform per block of nb columns (the layout of a wider one is its own).
      uk::transform tf(s.k, nb, s.trans_b ? uk::pack_type::trans : uk::pack_type::no_trans, o.ldb,
                       ldb, type, type);
      tf.generate();
      // Block j of nb columns at j * block bytes; K rounded up to a pair for the bf16 layout.
      const std::size_t block =
          static_cast<std::size_t>((s.k + 1) / 2 * 2 * nb) * (use_bf16 ? 2 : 4);
      const std::int64_t blocks = s.n / nb;
      auto packed = std::make_shared<std::vector<unsigned char>>(block * blocks + 64);
      const std::string how =
          std::string(pack == uk::pack_type::pack32 ? "B packed in K pairs" : "B as rows") +
          (blocks > 1 ? ", one call per 64 columns" : "");
      auto run = [brg, a, offsets, scratch, packed, block, blocks, nb, &o] {
        brg.set_hw_context();
        for (std::int64_t j = 0; j < blocks; ++j) {
          brg.execute(a, packed->data() + j * block, offsets, o.c + j * nb, scratch->data());
        }
      };
      // Block j's columns start at column j nb of B: a row offset when B is stored transposed.
      const std::size_t b_step =
          static_cast<std::size_t>(s.trans_b ? nb * o.ldb : nb) * (use_bf16 ? 2 : 4);
      auto pack_b = [tf, b, packed, block, blocks, b_step] {
        for (std::int64_t j = 0; j < blocks; ++j) {
          tf.execute(static_cast<const unsigned char*>(b) + j * b_step, packed->data() + j * block);
        }
      };
      add(rows, s, o, library, "transform (timed) + brgemm ukernel, " + how, [pack_b, run] {
        pack_b();
        run();
      });
      pack_b();
      add(rows, s, o, library + " pre", "brgemm ukernel, " + how + ", packed once (untimed)", run);
    }
  } catch (const dnnl::error& e) {
    skip(rows, s, library, std::string("n/a: ") + e.what());
  }
  for (std::size_t i = first; i < rows.size(); ++i) rows[i].bf16 = use_bf16;
}
#endif

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  bool bf16 = false;
  int trials = 9;
  gdn::CpuIsa requested = gdn::CpuIsa::automatic;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--bf16") == 0) {
      bf16 = true;
    } else if (std::strcmp(argv[i], "--trials") == 0 && i + 1 < argc) {
      trials = std::max(1, std::atoi(argv[++i]));
    } else if (std::strcmp(argv[i], "--isa") == 0 && i + 1 < argc &&
               (std::strcmp(argv[i + 1], "avx512") == 0 || std::strcmp(argv[i + 1], "avx2") == 0 ||
                std::strcmp(argv[i + 1], "generic") == 0)) {
      const char* name = argv[++i];
      requested = std::strcmp(name, "avx512") == 0 ? gdn::CpuIsa::avx512
                  : std::strcmp(name, "avx2") == 0 ? gdn::CpuIsa::avx2
                                                   : gdn::CpuIsa::generic;
    } else {
      std::fprintf(stderr, "usage: %s [--json] [--trials N] [--isa avx2|avx512|generic] [--bf16]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!gdn::cpu_isa_available(requested)) {
    std::fprintf(stderr, "gemm_compare: ISA %s is not available here\n",
                 gdn::cpu_isa_name(requested));
    return 1;
  }
  // `isa` picks our variant; the peak is always that of the best ISA this CPU has (the one
  // the libraries use).
  const gdn::CpuIsa isa = gdn::resolve_cpu_isa(requested);
  const gdn::CpuIsa peak_isa = gdn::cpu_isa_available(gdn::CpuIsa::avx512) ? gdn::CpuIsa::avx512
                               : gdn::cpu_isa_available(gdn::CpuIsa::avx2) ? gdn::CpuIsa::avx2
                                                                           : gdn::CpuIsa::generic;
  gdn::dev::OursGemm ours = &gdn::dev::ours_gemm_generic;
  const char* ours_tile = gdn::dev::ours_tile_generic();
#ifdef GDN_DEV_HAVE_OURS_AVX2
  if (isa == gdn::CpuIsa::avx2) {
    ours = &gdn::dev::ours_gemm_avx2;
    ours_tile = gdn::dev::ours_tile_avx2();
  }
#endif
#ifdef GDN_DEV_HAVE_OURS_AVX512
  // avx512_bf16's float32 product is avx512's (only its bf16-operand path differs).
  if (isa == gdn::CpuIsa::avx512 || isa == gdn::CpuIsa::avx512_bf16) {
    ours = &gdn::dev::ours_gemm_avx512;
    ours_tile = gdn::dev::ours_tile_avx512();
  }
#endif

  // One thread everywhere: OpenMP (our peak loop; oneDNN's CPU runtime in Debian's build is
  // OpenMP, so it follows omp_set_num_threads) and OpenBLAS's own pthreads.
#ifdef _OPENMP
  omp_set_num_threads(1);
#endif
#ifdef GDN_DEV_HAVE_OPENBLAS
  openblas_set_num_threads(1);
#endif
#ifdef GDN_DEV_HAVE_LIBXSMM
  libxsmm_init();
#endif
#ifdef GDN_DEV_HAVE_MKL
  const std::string mkl_version = gdn::dev::mkl_init_sequential();
#endif
#ifdef GDN_DEV_HAVE_DNNL
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const dnnl_version_t* dv = dnnl_version();
  std::string dnnl_runtime = dv->cpu_runtime == DNNL_RUNTIME_OMP   ? "OpenMP"
                             : dv->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                                                                   : "other runtime";
#ifdef _OPENMP
  if (dv->cpu_runtime == DNNL_RUNTIME_OMP) {
    dnnl_runtime += ", " + std::to_string(omp_get_max_threads()) + " thread";
  }
#endif
#endif

  // The FMA peak of the best ISA on one core, measured before and after the products; the
  // higher of the two counts (the machine is shared: a disturbed measurement only drops).
  double peak = gdn::cpu::measure_fma_peak_gflops(peak_isa, 1);
  const bool have_dot = gdn::cpu_isa_available(gdn::CpuIsa::avx512_bf16);
  double dot_peak =
      bf16 && have_dot ? gdn::cpu::measure_bf16_dot_peak_gflops(gdn::CpuIsa::avx512_bf16, 1) : 0;

  std::vector<Row> rows;
  for (const Shape& s : kShapes) {
    Operands o = make_operands(s, bf16);
    const std::size_t first = rows.size();
    // bf16 rows: our scratch; the libraries' bf16 copies of the operands, made here, not
    // timed (alive until the shape's rows are timed).
    std::vector<float> bf16_scratch;
    std::vector<std::uint16_t> a16, b16;
    if (bf16) {
      a16.resize(static_cast<std::size_t>(s.m * s.k));
      b16.resize(static_cast<std::size_t>(s.k * s.n));
      for (std::size_t i = 0; i < a16.size(); ++i) a16[i] = gdn::bf16_bits(o.a[i]);
      for (std::size_t i = 0; i < b16.size(); ++i) b16[i] = gdn::bf16_bits(o.b[i]);
    }
    // Ours: A may be read transposed (a_row, a_col); B's rows must be contiguous along n.
    if (s.trans_b) {
      skip(rows, s, "ours", "n/a: B is read by rows (the forward packs K^T, chunk_pack_qk)");
    } else if (s.n % 16 != 0) {
      skip(rows, s, "ours", "n/a: n not a multiple of 16");
    } else {
      const std::int64_t a_row = s.trans_a ? 1 : o.lda, a_col = s.trans_a ? o.lda : 1;
      add(rows, s, o, "ours",
          std::string("gemm-inl.h ") + gdn::cpu_isa_name(isa) + ", " + ours_tile,
          [ours, &s, &o, a_row, a_col] {
            ours(s.m, s.n, s.k, o.a, a_row, a_col, o.b, o.ldb, o.c, o.ldc);
          });
    }
    if (bf16 && !have_dot) {
      skip(rows, s, "ours bf16",
           std::string("n/a: avx512_bf16 ") +
               gdn::cpu_isa_unavailable_reason(gdn::CpuIsa::avx512_bf16));
    } else if (bf16 && (s.trans_b || s.n % 16 != 0)) {
      skip(rows, s, "ours bf16", "n/a: as ours");
    } else if (bf16) {
      const std::int64_t a_row = s.trans_a ? 1 : o.lda, a_col = s.trans_a ? o.lda : 1;
      bf16_scratch.assign(
          static_cast<std::size_t>(gdn::cpu::bf16_scratch_elements(s.k, s.n, s.m) + 16), 0.0f);
      float* scratch = bf16_scratch.data();
      scratch += (16 - reinterpret_cast<std::uintptr_t>(scratch) / sizeof(float) % 16) % 16;
      const gdn::cpu::GemmFn dot = gdn::cpu::kernel_table(gdn::CpuIsa::avx512_bf16).gemm_f32;
      add(rows, s, o, "ours bf16",
          "gemm_bf16-inl.h avx512_bf16, vdpbf16ps 8 x 2 vectors, packing from float32 timed",
          [dot, &s, &o, a_row, a_col, scratch] {
            dot(false, s.m, s.n, s.k, o.a, a_row, a_col, o.b, o.ldb, o.c, o.ldc, 1.0f, 0, scratch);
          });
      rows.back().bf16 = true;
    }
#ifdef GDN_DEV_HAVE_HWY
    if (s.trans_b || s.n % 16 != 0) {
      skip(rows, s, "Highway", "n/a: as ours (the same algorithm)");
    } else {
      const std::int64_t a_row = s.trans_a ? 1 : o.lda, a_col = s.trans_a ? o.lda : 1;
      add(rows, s, o, "Highway",
          std::string("gemm-inl.h's tile in Highway 1.0.3, ") + gdn::dev::hwy_target() + ", " +
              std::to_string(gdn::dev::hwy_tile_rows()) + " x 2 vectors",
          [&s, &o, a_row, a_col] {
            gdn::dev::hwy_gemm(s.m, s.n, s.k, o.a, a_row, a_col, o.b, o.ldb, o.c, o.ldc);
          });
    }
#endif
#ifdef GDN_DEV_HAVE_OPENBLAS
    add(rows, s, o, "OpenBLAS", std::string("cblas_sgemm, core ") + openblas_get_corename(),
        [&s, &o] {
          cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                      s.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(s.m),
                      static_cast<int>(s.n), static_cast<int>(s.k), 1.0f, o.a,
                      static_cast<int>(o.lda), o.b, static_cast<int>(o.ldb), 0.0f, o.c,
                      static_cast<int>(o.ldc));
        });
#endif
#ifdef GDN_DEV_HAVE_MKL
    add(rows, s, o, "MKL", "cblas_sgemm, sequential", [&s, &o] {
      gdn::dev::mkl_sgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, o.a, o.lda, o.b, o.ldb, o.c, o.ldc);
    });
    const char* jit_kind = nullptr;
    void* jitter = gdn::dev::mkl_jit_sgemm_create(s.trans_a, s.trans_b, s.m, s.n, s.k, o.lda, o.ldb,
                                                  o.ldc, &jit_kind);
    if (jitter != nullptr) {
      add(rows, s, o, "MKL JIT", std::string("mkl_jit_create_sgemm: ") + jit_kind,
          [jitter, &o] { gdn::dev::mkl_jit_sgemm_run(jitter, o.a, o.b, o.c); });
    } else {
      skip(rows, s, "MKL JIT", "n/a: mkl_jit_create_sgemm failed");
    }
    if (bf16) {
      add(rows, s, o, "MKL bf16", "cblas_gemm_bf16bf16f32, bf16 in (converted untimed), f32 out",
          [&s, &o, &a16, &b16] {
            gdn::dev::mkl_gemm_bf16(s.trans_a, s.trans_b, s.m, s.n, s.k, a16.data(), o.lda,
                                    b16.data(), o.ldb, o.c, o.ldc);
          });
      rows.back().bf16 = true;
    }
#endif
#ifdef GDN_DEV_HAVE_LIBXSMM
    std::vector<float> xsmm_scratch(static_cast<std::size_t>(s.k * std::max(s.m, s.n)));
    {
      // libxsmm is column-major: row-major C = op(A) op(B) is column-major
      // C^T = op(B)^T op(A)^T, so B's buffer is its first operand and A's the second, and a
      // row-major transposed B is its TRANS_A (a transposed A its TRANS_B).
      const libxsmm_blasint m = s.n, n = s.m, k = s.k;
      const libxsmm_blasint lda = o.ldb, ldb = o.lda, ldc = o.ldc;
      const float alpha = 1, beta = 0;
      const int flags =
          (s.trans_b ? LIBXSMM_GEMM_FLAG_TRANS_A : 0) | (s.trans_a ? LIBXSMM_GEMM_FLAG_TRANS_B : 0);
      const std::string kernel = std::string("smmdispatch JIT, ") + libxsmm_get_target_arch();
      const libxsmm_smmfunction f =
          libxsmm_smmdispatch(m, n, k, &lda, &ldb, &ldc, &alpha, &beta, &flags, nullptr);
      // Without a JIT kernel for a transposed operand: transpose it into a scratch buffer
      // (libxsmm_otrans) and run the NN kernel; both are timed.
      const int nn = 0;
      const libxsmm_blasint lda_nn = s.trans_b ? m : lda, ldb_nn = s.trans_a ? k : ldb;
      const libxsmm_smmfunction g =
          f != nullptr || flags == 0
              ? nullptr
              : libxsmm_smmdispatch(m, n, k, &lda_nn, &ldb_nn, &ldc, &alpha, &beta, &nn, nullptr);
      float* scratch = xsmm_scratch.data();
      const std::string otrans = "otrans + " + kernel + " (no JIT kernel for TRANS)";
      if (f != nullptr) {
        add(rows, s, o, "libxsmm", kernel, [f, &o] { f(o.b, o.a, o.c); });
      } else if (g != nullptr && s.trans_b) {
        // B's buffer (k x m column-major) becomes m x k column-major.
        add(rows, s, o, "libxsmm", otrans, [g, &o, scratch, k, m, lda] {
          libxsmm_otrans(scratch, o.b, sizeof(float), k, m, lda, m);
          g(scratch, o.a, o.c);
        });
      } else if (g != nullptr) {
        // A's buffer (n x k column-major) becomes k x n column-major.
        add(rows, s, o, "libxsmm", otrans, [g, &o, scratch, k, n, ldb] {
          libxsmm_otrans(scratch, o.a, sizeof(float), n, k, ldb, k);
          g(o.b, scratch, o.c);
        });
      } else {
        skip(rows, s, "libxsmm", "n/a: no JIT kernel");
      }
    }
#endif
#ifdef GDN_DEV_HAVE_DNNL
    {
      using dnnl::memory;
      const memory::desc a_md({s.m, s.k}, memory::data_type::f32,
                              s.trans_a ? memory::dims{1, o.lda} : memory::dims{o.lda, 1});
      const memory::desc b_md({s.k, s.n}, memory::data_type::f32,
                              s.trans_b ? memory::dims{1, o.ldb} : memory::dims{o.ldb, 1});
      const memory::desc c_md({s.m, s.n}, memory::data_type::f32, memory::dims{o.ldc, 1});
      // Created once per shape; the timed call is execute() alone (and the stream's wait).
      const dnnl::matmul::primitive_desc pd = matmul_pd(engine, a_md, b_md, c_md);
      const dnnl::matmul prim(pd);
      const std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, memory(a_md, engine, o.a)},
                                                    {DNNL_ARG_WEIGHTS, memory(b_md, engine, o.b)},
                                                    {DNNL_ARG_DST, memory(c_md, engine, o.c)}};
      add(rows, s, o, "oneDNN", std::string("matmul ") + pd.impl_info_str() + ", " + dnnl_runtime,
          [prim, args, &stream] {
            prim.execute(stream, args);
            stream.wait();
          });
    }
    if (bf16) {
      using dnnl::memory;
      const memory::desc a_md({s.m, s.k}, memory::data_type::bf16,
                              s.trans_a ? memory::dims{1, o.lda} : memory::dims{o.lda, 1});
      const memory::desc b_md({s.k, s.n}, memory::data_type::bf16,
                              s.trans_b ? memory::dims{1, o.ldb} : memory::dims{o.ldb, 1});
      const memory::desc c_md({s.m, s.n}, memory::data_type::f32, memory::dims{o.ldc, 1});
      const dnnl::matmul::primitive_desc pd = matmul_pd(engine, a_md, b_md, c_md);
      const dnnl::matmul prim(pd);
      const std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, memory(a_md, engine, a16.data())},
          {DNNL_ARG_WEIGHTS, memory(b_md, engine, b16.data())},
          {DNNL_ARG_DST, memory(c_md, engine, o.c)}};
      add(rows, s, o, "oneDNN bf16",
          std::string("matmul ") + pd.impl_info_str() + ", bf16 in (converted untimed), f32 out",
          [prim, args, &stream] {
            prim.execute(stream, args);
            stream.wait();
          });
      rows.back().bf16 = true;
    }
#endif
#if defined(GDN_DEV_HAVE_DNNL) && defined(DNNL_EXPERIMENTAL_UKERNEL)
    add_ukernel_rows(rows, s, o, false);
    if (bf16) add_ukernel_rows(rows, s, o, true, a16.data(), b16.data());
#endif
    time_rows(rows, first, trials);
#if defined(GDN_DEV_HAVE_DNNL) && defined(DNNL_EXPERIMENTAL_UKERNEL)
    dnnl::ukernel::brgemm::release_hw_context();
#endif
#ifdef GDN_DEV_HAVE_MKL
    if (jitter != nullptr) gdn::dev::mkl_jit_destroy_kernel(jitter);
#endif
    free_operands(o);
  }
  peak = std::max(peak, gdn::cpu::measure_fma_peak_gflops(peak_isa, 1));
  if (bf16 && have_dot) {
    dot_peak =
        std::max(dot_peak, gdn::cpu::measure_bf16_dot_peak_gflops(gdn::CpuIsa::avx512_bf16, 1));
  }

  const std::string machine = cpu_model();
  if (json) {
    for (const Row& r : rows) {
      const Shape& s = *r.shape;
      const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
      std::printf(
          "{\"machine\": \"%s\", \"isa\": \"%s\", \"ours_isa\": \"%s\", \"threads\": 1, "
          "\"peak_gflops\": %.2f, "
          "\"shape\": \"%s\", \"op\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, "
          "\"library\": \"%s\", \"kernel\": \"%s\", \"ran\": %s",
          json_escape(machine).c_str(), gdn::cpu_isa_name(peak_isa), gdn::cpu_isa_name(isa), peak,
          json_escape(s.name).c_str(), op_name(s), static_cast<long long>(s.m),
          static_cast<long long>(s.n), static_cast<long long>(s.k), json_escape(r.library).c_str(),
          json_escape(r.kernel).c_str(), r.ran ? "true" : "false");
      if (r.ran) {
        std::printf(
            ", \"error\": %.3e, \"median_us\": %.4f, \"min_us\": %.4f, \"max_us\": %.4f, "
            "\"calls_per_trial\": %lld, \"gflops\": %.2f, \"pct_peak\": %.2f",
            r.error, r.timing.median_us, r.timing.min_us, r.timing.max_us,
            static_cast<long long>(r.timing.calls_per_trial), flops / r.timing.median_us * 1e-3,
            100.0 * flops / r.timing.median_us * 1e-3 / (r.bf16 ? dot_peak : peak));
      }
      std::printf("}\n");
    }
    return 0;
  }

  std::printf(
      "matrix products on the chunk shapes (C = 64, d = 128): %s, row-major, 1 thread,"
      " in cache, median of %d trials\n",
      bf16 ? "bf16 operand values (float32 and bf16 kernels)" : "float32", trials);
  std::printf("machine: %s; ISA %s%s%s%s\n", machine.c_str(), gdn::cpu_isa_name(peak_isa),
              isa != peak_isa ? " (ours: " : "", isa != peak_isa ? gdn::cpu_isa_name(isa) : "",
              isa != peak_isa ? ")" : "");
  std::printf("fp32 FMA peak, measured now (%s, 1 thread): %.1f GFLOP/s\n",
              gdn::cpu_isa_name(peak_isa), peak);
  if (dot_peak > 0) {
    std::printf(
        "bf16 dot peak (vdpbf16ps), measured now (avx512_bf16, 1 thread): %.1f GFLOP/s "
        "(the %% peak of the bf16 rows)\n",
        dot_peak);
  }
#ifdef GDN_DEV_HAVE_OPENBLAS
  std::printf("OpenBLAS: %s; %d thread(s)\n", openblas_get_config(), openblas_get_num_threads());
#endif
#ifdef GDN_DEV_HAVE_LIBXSMM
  std::printf("libxsmm: %s (API v1), JIT target %s\n", LIBXSMM_CONFIG_VERSION,
              libxsmm_get_target_arch());
#endif
#ifdef GDN_DEV_HAVE_MKL
  std::printf("oneMKL: %s; sequential\n", mkl_version.c_str());
#endif
#ifdef GDN_DEV_HAVE_DNNL
  std::printf("oneDNN: %d.%d.%d, CPU runtime %s%s\n", dv->major, dv->minor, dv->patch,
              dnnl_runtime.c_str(), kDnnlUkernel ? "; BRGeMM ukernel API built in" : "");
#endif
  std::printf(
      "error = max|c - ref| / rms(ref) against a float64 product (1e-4 or the call is not"
      " timed)\n\n");
  std::printf("%-34s %-2s %4s %4s %4s  %-18s %9s %21s %8s %7s %9s  %s\n", "shape", "op", "M", "N",
              "K", "library", "median us", "(min - max)", "GFLOP/s", "% peak", "error", "kernel");
  const Shape* last = nullptr;
  for (const Row& r : rows) {
    const Shape& s = *r.shape;
    if (last != nullptr && last != &s) std::printf("\n");
    last = &s;
    std::printf("%-34s %-2s %4lld %4lld %4lld  %-18s ", s.name, op_name(s),
                static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k), r.library.c_str());
    if (!r.ran) {
      std::printf("%9s %21s %8s %7s %9s  %s\n", "-", "", "-", "-",
                  r.error > 0 ? (std::isinf(r.error) ? "inf" : "fail") : "-", r.kernel.c_str());
      continue;
    }
    const double flops = 2.0 * static_cast<double>(s.m * s.n * s.k);
    const double gflops = flops / r.timing.median_us * 1e-3;
    char range[64];
    std::snprintf(range, sizeof range, "(%.3f - %.3f)", r.timing.min_us, r.timing.max_us);
    std::printf("%9.3f %21s %8.1f %6.1f%% %9.2e  %s\n", r.timing.median_us, range, gflops,
                100.0 * gflops / (r.bf16 ? dot_peak : peak), r.error, r.kernel.c_str());
  }
  return 0;
}
