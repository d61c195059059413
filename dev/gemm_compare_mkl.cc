// gemm_compare_mkl.cc: oneMKL's products for dev/gemm_compare, in a file of their own because
// mkl_cblas.h and OpenBLAS's cblas.h declare the same names (and the two libraries export
// them: dev/CMakeLists.txt links one or the other). Row-major throughout, one thread.
#include <mkl.h>

#include <cstdint>
#include <string>

namespace gdn::dev {

// MKL's threading layer must be chosen before its first call.
std::string mkl_init_sequential() {
  mkl_set_threading_layer(MKL_THREADING_SEQUENTIAL);
  char version[256] = {};
  mkl_get_version_string(version, sizeof version);
  return version;
}

namespace {
CBLAS_TRANSPOSE op(bool trans) { return trans ? CblasTrans : CblasNoTrans; }
}  // namespace

void mkl_sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
               const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float* c,
               std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, op(trans_a), op(trans_b), static_cast<MKL_INT>(m),
              static_cast<MKL_INT>(n), static_cast<MKL_INT>(k), 1.0f, a, static_cast<MKL_INT>(lda),
              b, static_cast<MKL_INT>(ldb), 0.0f, c, static_cast<MKL_INT>(ldc));
}

// bf16 operands (raw bits), float32 accumulation and output.
void mkl_gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                   const std::uint16_t* a, std::int64_t lda, const std::uint16_t* b,
                   std::int64_t ldb, float* c, std::int64_t ldc) {
  cblas_gemm_bf16bf16f32(CblasRowMajor, op(trans_a), op(trans_b), static_cast<MKL_INT>(m),
                         static_cast<MKL_INT>(n), static_cast<MKL_INT>(k), 1.0f,
                         reinterpret_cast<const MKL_BF16*>(a), static_cast<MKL_INT>(lda),
                         reinterpret_cast<const MKL_BF16*>(b), static_cast<MKL_INT>(ldb), 0.0f, c,
                         static_cast<MKL_INT>(ldc));
}

// MKL's JIT sgemm for one fixed shape (its small-matrix path). `kind` says what MKL made:
// "JIT kernel", or "no JIT (standard sgemm behind the JIT call)"; null when it failed.
void* mkl_jit_sgemm_create(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                           std::int64_t k, std::int64_t lda, std::int64_t ldb, std::int64_t ldc,
                           const char** kind) {
  void* jitter = nullptr;
  const mkl_jit_status_t status = mkl_jit_create_sgemm(
      &jitter, MKL_ROW_MAJOR, trans_a ? MKL_TRANS : MKL_NOTRANS, trans_b ? MKL_TRANS : MKL_NOTRANS,
      static_cast<MKL_INT>(m), static_cast<MKL_INT>(n), static_cast<MKL_INT>(k), 1.0f,
      static_cast<MKL_INT>(lda), static_cast<MKL_INT>(ldb), 0.0f, static_cast<MKL_INT>(ldc));
  if (status == MKL_JIT_ERROR) {
    *kind = nullptr;
    return nullptr;
  }
  *kind = status == MKL_JIT_SUCCESS ? "JIT kernel" : "no JIT (standard sgemm behind the JIT call)";
  return jitter;
}

void mkl_jit_sgemm_run(void* jitter, const float* a, const float* b, float* c) {
  mkl_jit_get_sgemm_ptr(jitter)(jitter, const_cast<float*>(a), const_cast<float*>(b), c);
}

void mkl_jit_destroy_kernel(void* jitter) { mkl_jit_destroy(jitter); }

}  // namespace gdn::dev
