// layer_norm and rms_norm over a (rows, cols) view: the shared row paths of rows.cuh with the
// NormOp policy, the affine transform as a STORE functor (AffineStore) and the fused residual
// (h = x + r, normalized and written out in the same pass) as a LOAD functor (ResidualLoad).
// Paths are chosen by cunorm/_dispatch.py.
namespace cunorm {

// Per-row output: y = (x - mean) * rstd (rms_norm: x * rstd), before the affine store. The
// mean is carried as a sum of two compute-type values (hi + lo) so a float32 row far from zero
// (1e4 + N(0, 1)) subtracts a double-accurate mean in float arithmetic: x - hi is exact when x
// is near the mean (Sterbenz), and lo corrects it.
template <typename C, bool RMS> struct NormOut {
  C hi, lo, rstd;
  __device__ __forceinline__ C operator()(C x) const { return RMS ? x * rstd : ((x - hi) - lo) * rstd; }
  __device__ __forceinline__ C kept(C x) const { return (*this)(x); }
};

// The norm policy of the row paths (rows.cuh). layer_norm: the mean, then the sum of squared
// deviations from it (two passes over a row held in registers or shared memory: the exact
// variance, no cancellation), Welford/Chan on the streaming paths; rms_norm: the sum of
// squares only. Accumulation in double for every dtype (16-bit data too: 1e4 + N(0, 1) in
// float16 rounds to a few distinct values whose variance is ~1e-3, and a float32 mean's
// rounding, ~5e-4 at 1e4, would then cost 1e-4 relative in rstd), variance clamped at 0.
template <typename C_, typename SRC, bool RMS> struct NormOp {
  typedef C_ C;
  typedef double A;
  typedef A S1;
  typedef SumOp<A> R1;
  typedef typename Conditional<RMS, SumSq<A>, MeanM2<A>>::type Online;
  typedef NormOut<C, RMS> Fin;
  static constexpr bool kFirst = !RMS;
  static constexpr bool kPadSafe = RMS;  // 0 adds nothing to a sum of squares; it does to
                                         // a sum of squared deviations
  template <typename R> struct Keeps { static constexpr bool value = false; };
  A eps;
  C* mean_out;  // per-row statistics in the compute type, or null
  C* rstd_out;
  static __device__ __forceinline__ C pad() { return C(0); }
  __device__ __forceinline__ A first(A s, C x) const { return s + static_cast<A>(x); }
  __device__ __forceinline__ A middle(A s, i64 cols) const {
    return s * Math<A>::rcp(static_cast<A>(cols));
  }
  __device__ __forceinline__ A second(C& v, A mean) const {
    const A d = RMS ? static_cast<A>(v) : static_cast<A>(v) - mean;
    return d * d;
  }
  __device__ __forceinline__ Fin finish(A mean, A ss, i64 cols) const {
    A var = ss * Math<A>::rcp(static_cast<A>(cols));
    var = (var > A(0) || var != var) ? var : A(0);  // clamp rounding below 0, keep NaN
    Fin f;
    f.hi = static_cast<C>(mean);
    f.lo = static_cast<C>(mean - static_cast<A>(f.hi));
    f.rstd = static_cast<C>(Math<A>::rsqrt(var + eps));
    if (RMS) f.hi = f.lo = C(0);
    return f;
  }
  template <typename S> __device__ __forceinline__ Fin finish_online(const S& st, i64 cols) const {
    if constexpr (RMS) {
      return finish(A(0), st.s, cols);
    } else {
      return finish(st.mean, st.m2, cols);
    }
  }
  __device__ __forceinline__ void write_stats(i64 row, const Fin& f) const {
    if (mean_out != nullptr) mean_out[row] = f.hi + f.lo;
    if (rstd_out != nullptr) rstd_out[row] = f.rstd;
  }
};

// ---------------------------------------------------------------------------------------
// Entry points. One parameter list for every path; a null weight / bias / mean / rstd is
// absent, and the residual arguments are read only when RESIDUAL. The block path runs at most
// 256 threads (softmax: 512): its values per thread then get up to 255 registers, which the
// affine and residual variants need at 24 float values per thread.
#define CUNORM_NORM_PARAMS                                                                 \
  const SRC *x, SRC *y, i64 rows, i64 cols, i64 ldx, i64 ldy, const SRC *weight,           \
      const SRC *bias, const SRC *res, i64 ldr, SRC *h, i64 ldh,                           \
      typename ComputeOf<SRC>::type *mean_out, typename ComputeOf<SRC>::type *rstd_out,    \
      double eps

#define CUNORM_NORM_ROWS(BODY)                                                              \
  typedef typename ComputeOf<SRC>::type C;                                                  \
  NormOp<C, SRC, RMS> op;                                                                        \
  op.eps = eps;                                                                             \
  op.mean_out = mean_out;                                                                   \
  op.rstd_out = rstd_out;                                                                   \
  const AffineStore<C, SRC> store(y, ldy, weight, bias);                                    \
  if constexpr (RESIDUAL) {                                                                 \
    BODY(op, ResidualLoad<SRC, C>(x, ldx, res, ldr, h, ldh), store, rows, cols);            \
  } else {                                                                                  \
    BODY(op, DirectLoad<SRC, C>(x, ldx), store, rows, cols);                                \
  }

template <typename SRC, bool RMS, bool RESIDUAL, int PACK, int COLS, int GROUP, int ROWS>
__global__ void __launch_bounds__(128, 4) norm_warp(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_warp<PACK, COLS, GROUP, ROWS>));
}

template <typename SRC, bool RMS, bool RESIDUAL, int PACK, int COLS>
__global__ void __launch_bounds__(256, 1) norm_block(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_block<PACK, COLS>));
}

template <typename SRC, bool RMS, bool RESIDUAL, int PACK>
__global__ void __launch_bounds__(512, 1) norm_smem(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_smem<PACK, 1>));
}

template <typename SRC, bool RMS, bool RESIDUAL, int PACK>
__global__ void __launch_bounds__(512, 1) norm_uncached(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_uncached<PACK, 1>));
}

#ifdef CUNORM_SM90
template <typename SRC, bool RMS, bool RESIDUAL, int PACK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(512, 1)
    norm_smem_cluster(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_smem<PACK, CLUSTER>));
}

template <typename SRC, bool RMS, bool RESIDUAL, int PACK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(512, 1)
    norm_uncached_cluster(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_uncached<PACK, CLUSTER>));
}
#endif

}  // namespace cunorm
