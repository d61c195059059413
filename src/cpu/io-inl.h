// io-inl.h: moving rows and matrices between the caller's strided tensors and the padded,
// contiguous workspace of one ISA variant, converting the element type on the way.

// dst[0..n) = src[0, stride, 2 stride, ...] converted to Real; dst[n..padded) = 0.
template <class Real, class In>
inline void gather_row(Real* dst, const In* src, std::int64_t stride, std::int64_t n,
                       std::int64_t padded_n) {
  if constexpr (__is_same(In, BFloat16) || __is_same(In, Float16)) {
    if (stride == 1) {
      widen_row(dst, src, n);
      for (std::int64_t j = n; j < padded_n; ++j) dst[j] = 0;
      return;
    }
  }
  if (stride == 1) {
    for (std::int64_t j = 0; j < n; ++j) dst[j] = static_cast<Real>(src[j]);
  } else {
    for (std::int64_t j = 0; j < n; ++j) dst[j] = static_cast<Real>(src[j * stride]);
  }
  for (std::int64_t j = n; j < padded_n; ++j) dst[j] = 0;
}

template <class Out, class Real>
inline void scatter_row(Out* dst, std::int64_t stride, const Real* src, std::int64_t n) {
  if constexpr (__is_same(Out, BFloat16) || __is_same(Out, Float16)) {
    if (stride == 1) return narrow_row(dst, src, n);
  }
  if (stride == 1) {
    for (std::int64_t j = 0; j < n; ++j) dst[j] = static_cast<Out>(src[j]);
  } else {
    for (std::int64_t j = 0; j < n; ++j) dst[j * stride] = static_cast<Out>(src[j]);
  }
}

// Whether row `row` of `cols` elements of Real can be written with whole aligned vectors.
template <class Real>
inline bool vector_row(const Real* row, std::int64_t stride, std::int64_t cols) {
  return stride == 1 && cols % kLanes<Real> == 0 &&
         reinterpret_cast<std::uintptr_t>(row) % sizeof(Vec<Real>) == 0;
}

// Writes a row as scatter_row does, with non-temporal stores (simd-inl.h: stream) when
// `streamed` and the row is whole aligned vectors of Real (kOutputStreamBytes). The caller
// calls stream_fence() before another thread may read the rows.
template <class Out, class Real>
inline void write_row(Out* dst, std::int64_t stride, const Real* src, std::int64_t n,
                      bool streamed) {
  if constexpr (__is_same(Out, Real)) {
    if (streamed && vector_row(dst, stride, n)) {
      for (std::int64_t j = 0; j < n; j += kLanes<Real>) stream(dst + j, load(src + j));
      return;
    }
  }
  scatter_row(dst, stride, src, n);
}

// Whether write_row streams the rows of a token tensor of `heads` x `dim` elements of Out per
// token: Out is Real (16-bit rows are narrowed on the way, by ordinary stores) and the tensor
// takes at least kOutputStreamBytes.
template <class Out, class Real>
inline bool stream_rows(const ForwardShape& shape, std::int64_t heads, std::int64_t dim) {
  if constexpr (!__is_same(Out, Real)) return false;
  const std::int64_t tokens = (shape.batch > 0 ? shape.batch : 1) * shape.tokens;
  return tokens * heads * dim * static_cast<std::int64_t>(sizeof(Out)) >= kOutputStreamBytes;
}

template <class Pointer>
inline std::int64_t matrix_offset(const detail::MatrixTensor<Pointer>& m, std::int64_t index,
                                  std::int64_t h) {
  return index * m.outer + h * m.head;
}
template <class Pointer>
inline std::int64_t token_offset(const detail::TokenTensor<Pointer>& x, const detail::Sequence& s,
                                 std::int64_t t, std::int64_t h) {
  return s.batch * x.batch + (s.start + t) * x.token + h * x.head;
}

// The address of element 0 of (index, head) of a matrix tensor, typed.
template <class T>
inline const T* matrix_at(const detail::MatrixTensor<const std::byte*>& m, std::int64_t index,
                          std::int64_t h) {
  return reinterpret_cast<const T*>(m.data) + matrix_offset(m, index, h);
}
template <class T>
inline T* matrix_at(const detail::MatrixTensor<std::byte*>& m, std::int64_t index, std::int64_t h) {
  return reinterpret_cast<T*>(m.data) + matrix_offset(m, index, h);
}

// S[rows][ld] = the (index, head) matrix of `src`, or zeros when src is absent.
template <class Real, class In>
inline void load_matrix(Real* s, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                        const detail::MatrixTensor<const std::byte*>& src, std::int64_t index,
                        std::int64_t h) {
  if (src.data == nullptr) {
    for (std::int64_t r = 0; r < rows; ++r) fill<Real>(s + r * ld, ld, 0);
    return;
  }
  const In* base = matrix_at<In>(src, index, h);
  for (std::int64_t r = 0; r < rows; ++r)
    gather_row(s + r * ld, base + r * src.row, src.col, cols, ld);
}

// The (index, head) matrix of `dst` = S[0..rows)[0..cols); absent dst: nothing.
template <class Out, class Real>
inline void store_matrix(const detail::MatrixTensor<std::byte*>& dst, std::int64_t index,
                         std::int64_t h, const Real* s, std::int64_t rows, std::int64_t cols,
                         std::int64_t ld) {
  if (dst.data == nullptr) return;
  Out* base = matrix_at<Out>(dst, index, h);
  for (std::int64_t r = 0; r < rows; ++r)
    scatter_row(base + r * dst.row, dst.col, s + r * ld, cols);
}

// The (index, head) matrix of `dst` = S[0..rows)[0..cols) like store_matrix, with
// non-temporal stores (simd-inl.h: stream) where every row is whole aligned vectors: a row is
// written start to end, so each cache line's write-combining buffer fills before the next.
// The caller calls stream_fence() before its results may be read by another thread.
template <class Real>
inline void stream_matrix(const detail::MatrixTensor<std::byte*>& dst, std::int64_t index,
                          std::int64_t h, const Real* s, std::int64_t rows, std::int64_t cols,
                          std::int64_t ld) {
  if (dst.data == nullptr) return;
  Real* base = matrix_at<Real>(dst, index, h);
  const bool whole =
      vector_row(base, dst.col, cols) && (dst.row * sizeof(Real)) % sizeof(Vec<Real>) == 0;
  if (!whole) return store_matrix<Real>(dst, index, h, s, rows, cols, ld);
  for (std::int64_t r = 0; r < rows; ++r) {
    Real* row = base + r * dst.row;
    for (std::int64_t j = 0; j < cols; j += kLanes<Real>) stream(row + j, load(s + r * ld + j));
  }
}

// t_inv block of one chunk: A's top-left n x n, zeros in the rest of the C x C block. With
// `streamed`, a full chunk's block of whole aligned vector rows goes out with non-temporal
// stores (see stream_matrix).
template <class Out, class Real>
inline void store_t_inv(const detail::MatrixTensor<std::byte*>& dst, std::int64_t chunk,
                        std::int64_t h, const Real* a, std::int64_t n, std::int64_t c,
                        std::int64_t ld, bool streamed = false) {
  if (dst.data == nullptr) return;
  if constexpr (__is_same(Out, Real)) {
    if (streamed && n == c) return stream_matrix<Real>(dst, chunk, h, a, c, c, ld);
  }
  Out* base = matrix_at<Out>(dst, chunk, h);
  for (std::int64_t r = 0; r < c; ++r) {
    Out* row = base + r * dst.row;
    const std::int64_t valid = r < n ? n : 0;
    for (std::int64_t j = 0; j < valid; ++j) row[j * dst.col] = static_cast<Out>(a[r * ld + j]);
    for (std::int64_t j = valid; j < c; ++j) row[j * dst.col] = 0;
  }
}

// The address of element 0 of (sequence, token t, head h) of a token tensor, typed.
template <class T>
inline const T* token_at(const detail::TokenTensor<const std::byte*>& x, const detail::Sequence& s,
                         std::int64_t t, std::int64_t h) {
  return reinterpret_cast<const T*>(x.data) + token_offset(x, s, t, h);
}
template <class T>
inline T* token_at(const detail::TokenTensor<std::byte*>& x, const detail::Sequence& s,
                   std::int64_t t, std::int64_t h) {
  return reinterpret_cast<T*>(x.data) + token_offset(x, s, t, h);
}

// Queues tokens [t, t + n) of head h of x (the part of the sequence among them) for the
// products to prefetch (prefetch-inl.h): `elements` of each row, or the first element where
// the elements are strided.
template <class T, class Pointer>
inline void queue_tokens(const detail::TokenTensor<Pointer>& x, const detail::Sequence& s,
                         std::int64_t t, std::int64_t n, std::int64_t h, std::int64_t elements,
                         bool write) {
  const std::int64_t end = min64(t + n, s.length);
  if (x.data == nullptr || t >= end) return;
  const auto size = static_cast<std::int64_t>(sizeof(T));
  // One row: its stride is never stepped, and may be any value (a size-1 dimension's stride
  // is free), so x.token * size could overflow. Over two rows or more, validation bounds it.
  const std::int64_t stride = end - t > 1 ? x.token * size : 0;
  prefetch_queue().add(token_at<T>(x, s, t, h), stride, end - t, (x.dim == 1 ? elements : 1) * size,
                       write);
}

inline float sqrt_real(float x) { return __builtin_sqrtf(x); }
inline double sqrt_real(double x) { return __builtin_sqrt(x); }

// A packed q or k row (zeros past its elements) scaled in place as pack_qk_row scales it.
template <class Real>
inline void normalize_qk_row(Real* dst, std::int64_t padded_n, bool l2norm, Real scale,
                             Real* inv_norm = nullptr) {
  if (l2norm) {
    const Real norm = sqrt_real(dot(dst, dst, padded_n) + static_cast<Real>(1e-6));
    if (inv_norm != nullptr) *inv_norm = 1 / norm;
    scale /= norm;
  }
  scale_row(dst, padded_n, scale);
}

// A q or k row into the workspace: dst[0..n) = src * scale, or with l2norm
// src * scale / sqrt(sum(src^2) + 1e-6) (the sum of squares in Real); dst[n..padded_n) = 0.
// Contiguous rows of the compute type take a vector path (the sum of squares accumulated in
// the same lanes, so both paths round alike). With l2norm and inv_norm given, *inv_norm =
// 1 / sqrt(sum(src^2) + 1e-6): the backward's L2-norm backward then needs no second read of
// the row.
template <class Real, class In>
inline void pack_qk_row(Real* dst, const In* src, std::int64_t stride, std::int64_t n,
                        std::int64_t padded_n, bool l2norm, Real scale, Real* inv_norm = nullptr) {
  constexpr int W = kLanes<Real>;
  if (__is_same(Real, In) && stride == 1 && n % W == 0) {
    for (std::int64_t j = 0; j < n; j += W)
      store(dst + j, load(reinterpret_cast<const Real*>(src) + j));
    for (std::int64_t j = n; j < padded_n; j += W) store(dst + j, Vec<Real>{});
  } else {
    gather_row(dst, src, stride, n, padded_n);
  }
  normalize_qk_row(dst, padded_n, l2norm, scale, inv_norm);
}
