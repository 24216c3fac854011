// layer_norm and rms_norm over a (rows, cols) view: the shared row paths of rows.cuh with the
// NormOp policy, the affine transform as a STORE functor (AffineStore) and the fused residual
// (h = x + r, normalized and written out in the same pass) as a LOAD functor (ResidualLoad).
// Paths are chosen by cunorm/_dispatch.py.
namespace cunorm {

// Per-row output: y = (x - mean) * rstd (rms_norm: x * rstd), before the affine store. The
// mean is carried as a sum of two compute-type values (hi + lo: the provisional mean and its
// correction) so a row far from zero (1e4 + N(0, 1)) subtracts a mean more accurate than one
// float: x - hi is exact when x is near the mean (Sterbenz), and lo corrects it. The register
// paths keep d = x - hi from the second reduction (the block path's one-pass kernels form it
// again at the stores, rows.cuh rows_block) and write fma(d, rstd, shift) with shift =
// -lo * rstd: one instruction a value instead of three, and one rounding instead of two. H200,
// with 32-bit warp-path columns and no padding selects (rows.cuh), weight and bias: layer_norm
// bfloat16 512 / 1024 / 2048 / 4096 cols 2959 -> 3078, 3581 -> 3692, 3534 -> 3636, 3660 -> 3753
// GB/s, float16 2048 3694 -> 3728; the float16 1024-column warp kernel 1000 -> 936 SASS
// instructions (rowops-profile section 10).
template <typename C, bool RMS> struct NormOut {
  C hi, lo, rstd, shift;
  __device__ __forceinline__ C operator()(C x) const { return RMS ? x * rstd : ((x - hi) - lo) * rstd; }
  __device__ __forceinline__ C kept(C d) const { return RMS ? d * rstd : fma(d, rstd, shift); }
  // hi + lo carried as the float nearest their sum and the remainder (TwoSum), for rows summed
  // about a shift (rows.cuh rows_smem, kShiftHead) whose lo is not small: x - hi is then exact
  // near the mean, as after two passes (without it, one more rounding of x - hi: float32
  // errors up to 40% above the two-pass ones on N(0, 1) rows).
  __device__ __forceinline__ void fold() {
    const C s = hi + lo;
    const C b = s - hi;
    lo = (hi - (s - b)) + (lo - b);
    hi = s;
    shift = -lo * rstd;
  }
};

// The norm policy of the row paths (rows.cuh), in the compute type C (float for 16-bit and
// float32 data, double for float64). layer_norm: a provisional mean m = sum(x) / n, then in
// one reduction the sums of d = x - m and of d^2 (the corrected two-pass algorithm): var =
// (sum d^2 - (sum d)^2 / n) / n removes exactly the n * dm^2 by which sum d^2 exceeds the
// true sum of squared deviations when m is off by dm, and the mean is m + sum(d) / n (carried
// as hi + lo). So 1e4 + N(0, 1) keeps full float accuracy: x - m is exact near the mean
// (Sterbenz), no value is squared before the mean is removed, and nothing is accumulated in
// double (which measured half the bandwidth on short rows). rms_norm: the sum of squares.
// 16-bit rows on the block-wide paths (block, smem, cluster: kOnePass) skip the provisional
// mean's reduction: the same sums about 0 (sum x, sum x^2) give the same formula, with a
// relative variance error of (1 + mean^2 / var) float roundings, far below a 16-bit result's
// rounding while the mean lies within 4 standard deviations of 0; a row whose mean lies
// further (redo) is summed again about the mean so found (recenter), as before. One block
// reduction (one cluster exchange) instead of two: H200, 16-bit layer_norm with weight and
// bias, +2-11% at 2048-262144 columns (benchmarks/results/nvidia-h200-2026-11-22-rowops-
// profile.txt section 11). The warp path keeps both passes (shuffles: no gain), and so does
// the fused residual on the block path (no gain, and its 16-bit block kernels spilled under 32
// registers). The shared-memory and cluster rows (kOnePassSmem) sum once for the residual and
// for float32 rows too, float32 about the mean of the row's first 128 values (kShiftHead)
// and again about the mean where that lies more than half a standard deviation off. H200,
// weight and bias, same process against both passes: float32 32768 / 65536 / 131072 /
// 262144 columns +3 / +2-4 / +3-5 / +2%, the residual float32 -1% to +2%, 16-bit 65536-131072
// +2-3%; float32 maximum errors on N(mu, 1) rows 2.7% above the two passes' on average and
// 0.5% below torch's (benchmarks/results/nvidia-h200-2026-11-26-one-exchange-profile.txt).
// CUNORM_NORM_SMEM_ONE_EXCHANGE=0 builds both passes there, for measurement. float64 rows
// keep both passes everywhere.
// The streaming paths fold a row into a double Welford/Chan (or sum-of-squares) state: their
// per-thread runs are long, and they only serve rows past shared memory. Variance clamped at
// 0 (NaN kept).
#ifndef CUNORM_NORM_SMEM_ONE_EXCHANGE
#define CUNORM_NORM_SMEM_ONE_EXCHANGE 1
#endif
template <typename C_, typename SRC, bool RMS, bool RESIDUAL> struct NormOp {
  typedef C_ C;
  typedef typename Conditional<RMS, C, Sum2<C>>::type A;
  typedef C S1;
  typedef SumOp<C> R1;
  typedef typename Conditional<RMS, SumSq<double>, MeanM2<double>>::type Online;
  typedef NormOut<C, RMS> Fin;
  static constexpr bool kFirst = !RMS;
  static constexpr bool kOnePass = !RMS && !RESIDUAL && sizeof(SRC) == 2;
  static constexpr bool kOnePassSmem =
      kOnePass || (!RMS && sizeof(C) == 4 && CUNORM_NORM_SMEM_ONE_EXCHANGE);
  static constexpr bool kShiftHead = kOnePassSmem && sizeof(SRC) == 4;  // float32 layer_norm
  // How a cluster folds its blocks' sums (common.cuh Fold): float64 rows as a tree, rms_norm's
  // sum of squares compensated. The chain's up to 15 roundings of the running sum had left
  // float64 rows on clusters less accurate than torch's. H200, long double reference, rows
  // N(2, 5), mean row error (x1e-16) chain -> now (torch), 20000 / 40000 / 65536 / 131072
  // cols: layer_norm 1.64 / 1.72 / 1.73 / 1.72 -> 1.60 / 1.61 / 1.63 / 1.62 (1.62 / 1.64 /
  // 1.67 / 1.67); rms_norm 1.53 / 1.56 / 1.47 / 1.49 -> 1.42 / 1.38 / 1.36 / 1.38 (1.43 /
  // 1.40 / 1.44 / 1.47); a plain tree left rms_norm at 1.52 / 1.50, the compensated fold
  // for layer_norm's pair of sums cost 12-15% (70 -> 88 registers). Same process: rms_norm
  // +3% / +3% / +7% at 20000 / 40000 / 131072 cols, layer_norm -0.9% to +0.2%, at 262144
  // (uncached) +5% (benchmarks/results/nvidia-h200-2026-11-27-f64-stats-profile.txt).
  static constexpr Fold kFold =
      sizeof(C) != 8 ? Fold::kChain : RMS ? Fold::kCompensated : Fold::kTree;
  static constexpr bool kZeroPad = true;  // pad() is 0, what a zeroed raw pack converts to
  static constexpr bool kPadSafe = RMS;  // 0 adds nothing to a sum of squares; it does to
                                         // the sums of deviations
  template <typename R> struct Keeps { static constexpr bool value = false; };
  double eps;
  C* mean_out;  // per-row statistics in the compute type, or null
  C* rstd_out;
  static __device__ __forceinline__ C pad() { return C(0); }
  __device__ __forceinline__ C first(C s, C x) const { return s + x; }
  template <typename N> __device__ __forceinline__ C middle(C s, N cols) const {
    return s * rcp_cols<C>(cols);
  }
  // kOnePass / kOnePassSmem: whether the sums about s1 (0, or the head mean) are to be redone
  // about the mean they give, where it lies more than sqrt(ratio) standard deviations from s1
  // (false for a NaN row, which stays NaN; true where rounding left var below 0), and that
  // mean. The relative variance error of sums about s1 is (1 + (mean - s1)^2 / var) float
  // roundings: 16-bit data allow 17 (far below their result's rounding), float32 1.25.
  __device__ __forceinline__ bool redo(A s2, i64 cols) const {
    constexpr float kRatio = sizeof(SRC) == 2 ? 16.0f : 0.25f;
    const C inv_n = Math<C>::rcp(static_cast<C>(cols));  // one reciprocal for both means
    const C mean = s2.a * inv_n;
    return mean * mean > C(kRatio) * fma(-mean, mean, s2.b * inv_n);
  }
  __device__ __forceinline__ C recenter(C s1, A s2, i64 cols) const {
    return s1 + middle(s2.a, cols);
  }
  // kShiftHead: the provisional mean of a row summed once (rows.cuh rows_smem), the mean of
  // its first min(cols, 128) values (lane i of each warp reads values i, i + 32, ...),
  // bit-identical in every thread and every block of a cluster (the same loads; a butterfly
  // sum adds the same pairs in every lane). For independent values it lies about
  // std / sqrt(128) from the row's mean, so sum(d) stays small and rounds little (a 32-value
  // head left float32 maximum errors 3.5% above the two passes'); where it lies further than
  // redo() allows, the row is summed again about the mean it gave.
  template <class LOAD>
  __device__ __forceinline__ C head_mean(const LOAD& load, i64 row, i64 cols) const {
    constexpr int kHead = 128;
    const int lane = threadIdx.x % 32;
    C v[kHead / 32];
#pragma unroll
    for (int j = 0; j < kHead / 32; ++j) {
      v[j] = lane + 32 * j < cols ? load.value(row, lane + 32 * j) : C(0);
    }
    C s = v[0];
#pragma unroll
    for (int j = 1; j < kHead / 32; ++j) s += v[j];
    return group_all_reduce<SumOp<C>, 32>(s) *
           Math<C>::rcp(static_cast<C>(cols < kHead ? cols : kHead));
  }
  __device__ __forceinline__ A second(C& v, C mean) const {
    if constexpr (RMS) {
      return v * v;
    } else {
      const C d = v - mean;
      v = d;  // kept: the output is fma(d, rstd, -lo * rstd) (NormOut::kept)
      return {d, d * d};
    }
  }
  // float32 data: the means of the sums (s / n) and rstd each rounded once (common.cuh
  // div_rn, rsqrt_rn), not through the approximate reciprocal and rsqrtf (1 and 2 ulps more
  // at most). H200, rows N(2, 5), weight N(1, 0.5), bias N(0, 0.5): mean over draws of the
  // largest error of 64 rows (x1e-7), before -> after (torch): layer_norm 32 / 1000 / 40000 /
  // 100000 cols 1.52 -> 1.41 (1.66), 1.58 -> 1.43 (1.61), 1.60 -> 1.49 (1.56), 1.78 -> 1.62
  // (1.82); rms_norm 1000 / 40000 cols 1.68 -> 1.32 (1.46), 1.40 -> 1.41 (1.51). Mean row
  // error against torch's, 1000 columns, layer_norm 0.98 -> 0.92, rms_norm 1.15 -> 0.95.
  // Cost, (49152, cols) in one process: layer_norm -2.3% and rms_norm and the residual forms
  // -1.2% at 32 cols (the finish's ~10 more dependent instructions show in a 4 us kernel),
  // -0.4% at 5120-8192, none measurable elsewhere (benchmarks/results/nvidia-h200-2026-11-
  // 26-rstd-rounding-profile.txt). float64 data round the means once too (where n is not a
  // power of two, s * inv_n rounds twice): rms_norm mean row error at 1000 / 40000 cols (the
  // latter on the plain tree) 1.32 -> 1.30 / 1.50 -> 1.43 (x1e-16; torch 1.34 / 1.40), for
  // -0.4% to -0.6% of layer_norm's bandwidth at 32-128 cols. Their rsqrt stays the library's:
  // a Newton step changed no measured result and cost another 0.7%. Carrying var + eps as a
  // pair into that step (rstd rounded once from the sums) gained 1-3% of error and cost the
  // 32-128-column rows 4-5%. 16-bit results round far coarser and keep the cheaper forms.
  static constexpr bool kRoundMeansOnce = sizeof(SRC) >= 4;  // float32 and float64 data
  static constexpr bool kRoundRstdOnce = sizeof(SRC) == 4;  // float32 data: C is float
  template <typename N> __device__ __forceinline__ Fin finish(C mean, A s2, N cols) const {
    const C n = static_cast<C>(static_cast<i64>(cols));
    const C inv_n = rcp_cols<C>(cols);
    const auto mean_of = [&](C sum) {
      if constexpr (kRoundMeansOnce) return div_rn(sum, n, inv_n);
      else return sum * inv_n;
    };
    Fin f;
    C var;
    if constexpr (RMS) {
      var = mean_of(s2);
      f.hi = f.lo = C(0);
    } else {
      f.hi = mean;
      f.lo = mean_of(s2.a);
      var = fma(-f.lo, f.lo, mean_of(s2.b));
    }
    var = (var > C(0) || var != var) ? var : C(0);  // clamp rounding below 0, keep NaN
    if constexpr (kRoundRstdOnce) {
      f.rstd = rsqrt_rn(var + static_cast<C>(eps));
    } else {
      f.rstd = Math<C>::rsqrt(var + static_cast<C>(eps));
    }
    f.shift = -f.lo * f.rstd;
    return f;
  }
  template <typename S> __device__ __forceinline__ Fin finish_online(const S& st, i64 cols) const {
    const double n = static_cast<double>(cols);
    const double inv_n = rcp_f64(n);
    double mean = 0.0, var;
    if constexpr (RMS) {
      var = div_rn(st.s, n, inv_n);
    } else {
      mean = st.mean;
      var = div_rn(st.m2, n, inv_n);
    }
    var = (var > 0.0 || var != var) ? var : 0.0;
    Fin f;
    f.hi = static_cast<C>(mean);
    f.lo = static_cast<C>(mean - static_cast<double>(f.hi));
    f.rstd = static_cast<C>(::rsqrt(var + eps));
    f.shift = -f.lo * f.rstd;
    return f;
  }
  __device__ __forceinline__ void write_stats(i64 row, const Fin& f) const {
    if (mean_out != nullptr) mean_out[row] = f.hi + f.lo;
    if (rstd_out != nullptr) rstd_out[row] = f.rstd;
  }
};

// ---------------------------------------------------------------------------------------
// Entry points. One parameter list for every path; a null weight / bias / mean / rstd is
// absent, and the residual arguments are read only when RESIDUAL. The launch bounds are
// softmax's; the block path's (512, 1) also keeps ptxas from spilling a register or two at
// low pressure, as it did under a bare (512).
#define CUNORM_NORM_PARAMS                                                                 \
  const SRC *x, SRC *y, i64 rows, i64 cols, i64 ldx, i64 ldy, const SRC *weight,           \
      const SRC *bias, const SRC *res, i64 ldr, SRC *h, i64 ldh,                           \
      typename ComputeOf<SRC>::type *mean_out, typename ComputeOf<SRC>::type *rstd_out,    \
      double eps

// KEEP: x (and r) loads under the L2 evict_last policy (common.cuh load_pack_l2; not the
// warp path).
#define CUNORM_NORM_ROWS(BODY, KEEP)                                                        \
  typedef typename ComputeOf<SRC>::type C;                                                  \
  NormOp<C, SRC, RMS, RESIDUAL> op;                                                         \
  op.eps = eps;                                                                             \
  op.mean_out = mean_out;                                                                   \
  op.rstd_out = rstd_out;                                                                   \
  const AffineStore<C, SRC, RMS ? kParamsNoBias : kParamsTested> store(y, ldy, weight, bias); \
  if constexpr (RESIDUAL) {                                                                 \
    BODY(op, ResidualLoad<SRC, C, KEEP>(x, ldx, res, ldr, h, ldh), store, rows, cols);      \
  } else {                                                                                  \
    BODY(op, DirectLoad<SRC, C, KEEP>(x, ldx), store, rows, cols);                          \
  }

// 16-bit and float32 rows in full 16-byte packs of at most 32 values a lane get the registers
// of 8 resident 128-thread blocks (64), the others those of 4 (128): narrower packs (an address
// per value) and double spill at 64 (nvcc 13, sm_90). H200, one process (tools/gpu_profile.py
// warp-norm-sources): layer_norm float16 with a residual 1000 cols 3646 -> 3721 GB/s, 1024
// 3813 -> 3867, rms_norm float16 with a residual 3699 -> 3751, 3865 -> 3911; within -0.5% and
// +1.5% without one (rms_norm bfloat16 1024 3749 -> 3736, layer_norm bfloat16 512 3084 -> 3127).
// 16-bit groups of 4 rows (rows of 8 packs, cunorm/_dispatch.py WARP_SPREAD_ROWS) get those
// of 6 (80): at 64 they spilled 44-124 bytes, and at 73-80 registers a 64-thread block of 32
// rows still fits 12 times an SM (49152 rows: one wave of 1536 blocks). float32 groups of 4
// rows keep 64 (53-64 registers; 80 measured -1.6% to +1.2%). H200, the same process
// (benchmarks/results/nvidia-h200-2026-11-26-spread-rows-profile.txt): 16-bit 64 columns
// +5-8%, with a residual +1-4%.
// 16-bit rms_norm rows of more than 16 values a lane that load their weight with the row
// (wide_early: 520-1024 columns, rows.cuh warp_early_params) get those of 6 (80): at 64 the
// 1024-column rows measured 0.3% (float16) and 0% (bfloat16) faster than plain, at 80 1.0%
// (profile named at warp_early_params; the 24-value kernels, 520-768 columns, not measured).
__host__ __device__ constexpr int norm_warp_blocks(int src_bytes, int pack, int cols, int rows,
                                                   bool wide_early = false) {
  return src_bytes < 8 && pack * src_bytes == 16 && cols <= 32
             ? (src_bytes == 2 && (rows >= 4 || (wide_early && cols > 16)) ? 6 : 8)
             : 4;
}
// Rows whose parameters rows.cuh warp_early_params may load early up to 1024 columns (WIDE):
// 16-bit rms_norm without a residual, whose store loads one weight pack a pack and no bias,
// in full 16-byte packs (as measured; narrower packs, for unaligned operands or column counts
// that are no multiple of 8, would take 24-35 more registers, up to 121 at 32 values a lane).
__host__ __device__ constexpr bool norm_warp_wide_early(bool rms, bool residual, int src_bytes,
                                                        int pack) {
  return rms && !residual && src_bytes == 2 && pack * src_bytes == 16;
}
// Rows whose parameters rows.cuh warp_early_params may load early from 32 columns (TINY, two
// lanes of 16 values a row): the 16-bit norms in full packs, on the exact kernels (rows of
// exactly 32 columns), as measured (the general kernels, rows of 17-31 columns or more rows
// than one grid covers, not measured; 16-bit layer_norm without a residual stages its weight
// and bias there).
__host__ __device__ constexpr bool norm_warp_tiny_early(int src_bytes, int pack, bool exact) {
  return src_bytes == 2 && pack * src_bytes == 16 && exact;
}
// Rows whose weight and bias rows.cuh rows_warp stages in shared memory (STAGE, with the
// measurements): 16-bit layer_norm without a residual in full 16-byte packs, one row a group,
// where warp_early_params does not load them early: group columns past 256, and 32-column
// rows (a group of 2 lanes) on the general kernel (the exact one loads them early, TINY).
// cunorm/_dispatch.py warp_stage_bytes mirrors the rule and plans the shared memory.
__host__ __device__ constexpr bool norm_warp_stages_params(bool rms, bool residual,
                                                           int src_bytes, int pack, int cols,
                                                           int group, int rows, bool exact) {
  return !rms && !residual && src_bytes == 2 && pack * src_bytes == 16 && rows == 1 &&
         !warp_early_params(cols, group, rows, false,
                            norm_warp_tiny_early(src_bytes, pack, exact));
}
#define CUNORM_NORM_WARP_WIDE norm_warp_wide_early(RMS, RESIDUAL, sizeof(SRC), PACK)
#define CUNORM_NORM_WARP_TINY norm_warp_tiny_early(sizeof(SRC), PACK, EXACT)
template <typename SRC, bool RMS, bool RESIDUAL, int PACK, int COLS, int GROUP, int ROWS,
          bool EXACT>
__global__ void __launch_bounds__(
    128, norm_warp_blocks(sizeof(SRC), PACK, COLS, ROWS,
                          CUNORM_NORM_WARP_WIDE && warp_early_params(COLS, GROUP, ROWS, true)))
    norm_warp(CUNORM_NORM_PARAMS) {
  // cunorm/_dispatch.py warp_exact mirrors this rule (and tests/test_nvcc.py compiles every
  // name it plans): the exact form lost 0.5-6% on these rows of layer_norm (64-128 columns,
  // float32 256) and 1% on float64 rms_norm's, and won 0.3-2.1% on 16-bit and float32
  // rms_norm's, whose store has no bias, and up to 4.3% on 16-bit layer_norm's of 256
  // columns (16 lanes of 16 values), planned on large grids only (3-4% slower on small ones:
  // warp_exact_min_blocks). 32-column 16-bit rows load them early only on the exact kernel
  // (TINY).
  static_assert(!EXACT || RESIDUAL || (RMS && sizeof(SRC) < 8) ||
                    (!RMS && sizeof(SRC) == 2 && PACK * sizeof(SRC) == 16 &&
                     COLS * GROUP == 256 && ROWS == 1) ||
                    !warp_early_params(COLS, GROUP, ROWS, CUNORM_NORM_WARP_WIDE),
                "only 16-bit and float32 rms_norm rows and 16-bit layer_norm rows of 256 "
                "columns load their parameters early in exact kernels without a residual (and "
                "16-bit rows of 32 columns)");
  CUNORM_NORM_ROWS(
      (rows_warp<PACK, COLS, GROUP, ROWS, EXACT, CUNORM_NORM_WARP_WIDE,
                 norm_warp_stages_params(RMS, RESIDUAL, sizeof(SRC), PACK, COLS, GROUP, ROWS,
                                         EXACT),
                 CUNORM_NORM_WARP_TINY>),
      false);
}
#undef CUNORM_NORM_WARP_WIDE
#undef CUNORM_NORM_WARP_TINY

// Resident 512-thread blocks the block kernels are compiled for, rows in full packs of at most
// 16 values a thread (rows.cuh CUNORM_BLOCK_BOUNDS): 4 for 16-bit rows (32 registers), 2 for
// float32 (64). H200, weight and bias, one run each (tools/gpu_profile.py norm-variants):
// from 3 to 4 blocks float16 layer_norm 8192 cols 3432 -> 3742 GB/s, bfloat16 3499 -> 3595,
// float16 rms_norm 3885 -> 4141; 2 blocks for 16-bit rows lost 8-23%, and 3 for float32 rows
// won 2% at 8192 cols and lost 3% at 4096 (spilling 8 bytes). float32 layer_norm rows of at
// most 8 values a thread take 4 (32 registers; one process, tools/gpu_profile.py
// short-block-sources: 1000 cols 3864 -> 3996 GB/s, 1024 3952 -> 4016); rms_norm keeps 2
// there (4039 -> 3995, 4042 -> 4023 at 4).
// CUNORM_NORM_BLOCKS16 / CUNORM_NORM_BLOCKS32 override the counts for measurement.
#ifndef CUNORM_NORM_BLOCKS16
#define CUNORM_NORM_BLOCKS16 4
#endif
#ifndef CUNORM_NORM_BLOCKS32
#define CUNORM_NORM_BLOCKS32 2
#endif
__host__ __device__ constexpr int norm_block_full(int src_bytes) {
  return src_bytes == 2 ? CUNORM_NORM_BLOCKS16 : src_bytes == 4 ? CUNORM_NORM_BLOCKS32 : 1;
}
// EXACT: the row fills the block's packs (cols == blockDim.x * COLS), so no column is tested
// (rows.cuh rows_block; cunorm/_dispatch.py block_exact has the rule and its measurements).
// norm_block's launch bounds and rows, written once for it and norm_block_capped below (the
// template parameters SRC, RMS, PACK, COLS and EXACT in scope).
#define CUNORM_NORM_BLOCK_BOUNDS                                                      \
  CUNORM_BLOCK_BOUNDS(PACK * sizeof(SRC), COLS, norm_block_full(sizeof(SRC)),         \
                      sizeof(SRC) == 4 && !RMS ? 4 : norm_block_full(sizeof(SRC)))
#define CUNORM_NORM_BLOCK_ROWS \
  CUNORM_NORM_ROWS((rows_block<PACK, COLS, BlockRow<PACK * sizeof(SRC), COLS>, EXACT>), true)
template <typename SRC, bool RMS, bool RESIDUAL, int PACK, int COLS, bool EXACT = false>
__global__ void CUNORM_NORM_BLOCK_BOUNDS norm_block(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_BLOCK_ROWS;
}

// float32 layer_norm rows (no residual) of 16 values a thread in 16-byte packs run the same
// rows on a kernel held to 48 registers by __maxnreg__, without launch bounds (the CUDA C++
// Programming Guide allows no kernel both), so its blocks may still take 1024 threads; launch
// bounds of (640, 2) reach the same 47-48 registers but no block past 640 threads.
// cunorm/_dispatch.py block_capped mirrors the rule. NVRTC (CUDA 13) gave norm_block's build
// 53, so blocks of 320 threads fit 3 an SM and of 416 2; at 48, 4 and 3, without spills
// (448-512 threads still fit 2). H200, one process, three rounds, 49152 rows, weight and
// bias, GB/s (benchmarks/results/nvidia-h200-2026-11-29-session75-profile.txt): as shipped,
// against the same kernel uncapped (69 registers): 5120 cols 3346-3351 -> 4276 (torch.compile
// 4274-4276), 6656 3855-3858 -> 4295-4297 (4270-4272), 4096 3893-3895 -> 4250-4253
// (4256-4259), 2048 4179-4182 -> 4162-4164 (4027-4040); the cap beside norm_block's launch
// bounds (47 registers), against norm_block, on other H200s: 5120 4197-4207 -> 4296-4297,
// 6200 3683-3726 -> 4301-4302, 2048-6144 within -0.3%. A cap of 40 (3 blocks of 480 threads)
// took 7200 from 4004-4007 to 4310-4311 but lost 0.2-0.6% at 3000-6144.
// CUNORM_NORM_LN32_REGS overrides the cap for measurement (at most 64, or 1024-thread blocks
// fail to launch: uncapped, NVRTC took 69); at 0, and on compilers before CUDA 12.4 (no
// __maxnreg__), the kernel takes norm_block's launch bounds for these rows.
#ifndef CUNORM_NORM_LN32_REGS
#define CUNORM_NORM_LN32_REGS 48
#endif
#if CUNORM_NORM_LN32_REGS > 0 && defined(__CUDACC_VER_MAJOR__) && \
    __CUDACC_VER_MAJOR__ * 100 + __CUDACC_VER_MINOR__ >= 1204
#define CUNORM_NORM_CAPPED __maxnreg__(CUNORM_NORM_LN32_REGS)
#else
#define CUNORM_NORM_CAPPED CUNORM_NORM_BLOCK_BOUNDS
#endif
template <typename SRC, bool RMS, bool RESIDUAL, int PACK, int COLS, bool EXACT = false>
__global__ void CUNORM_NORM_CAPPED norm_block_capped(CUNORM_NORM_PARAMS) {
  static_assert(sizeof(SRC) == 4 && !RMS && !RESIDUAL && PACK == 4 && COLS == 16,
                "norm_block_capped holds float32 layer_norm rows of 16 values a thread");
  static_assert(CUNORM_NORM_LN32_REGS <= 64, "1024-thread blocks need at most 64 registers");
  CUNORM_NORM_BLOCK_ROWS;
}
#undef CUNORM_NORM_CAPPED
#undef CUNORM_NORM_BLOCK_ROWS
#undef CUNORM_NORM_BLOCK_BOUNDS

// The parameter lines the shared-memory and cluster rows ask L1 for (rows.cuh Prefetch):
// layer_norm's 4- and 8-byte parameters. H200, one process, two rounds (tools/gpu_profile.py
// smem-store-sources, and the same row_sources on float32 and float64 cases), GB/s:
//   kSlice, against none: float32 32768 cols 3640 -> 3756, 65536 3592 -> 3672, 131072
//     3435 -> 3496, 262144 3196 -> 3182, 12288-16384 (one block a row) unchanged; float64
//     32768 3406 -> 3461. 16-bit layer_norm lost up to 7% (float16 12288 cols 3973 -> 3701),
//     rms_norm float32 1.7% and the float32 residual form 1%.
//   kAhead, against kSlice: float64 32768 3462 -> 3718, 131072 2795 -> 3173; float32 lost
//     up to 3% (131072 3491 -> 3381).
//   With the rows summed in one exchange (kOnePassSmem), float32 rows on clusters of 16
//   (262144 cols) lost 5% under kSlice and gained 2% under kAhead (one-exchange profile).
__host__ __device__ constexpr Prefetch norm_prefetch(int itemsize, bool rms, bool residual,
                                                     int cluster = 1) {
  return rms || residual || itemsize < 4       ? Prefetch::kNone
         : itemsize == 4 && cluster < 16       ? Prefetch::kSlice
                                               : Prefetch::kAhead;
}

template <typename SRC, bool RMS, bool RESIDUAL, int PACK>
__global__ void __launch_bounds__(512, 1) norm_smem(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_smem<PACK, 1, norm_prefetch(sizeof(SRC), RMS, RESIDUAL)>), true);
}

template <typename SRC, bool RMS, bool RESIDUAL, int PACK>
__global__ void __launch_bounds__(512, CUNORM_UNCACHED_BLOCKS) norm_uncached(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_uncached<PACK, 1>), true);
}

#ifdef CUNORM_SM90
// Resident 512-thread blocks the shared-memory cluster kernels are compiled for (the
// registers of 1 block: up to 128; of 3: 40; of 4: 32), by item size and variant: no spills
// on sm_90 (tests/test_nvcc.py). Under a bare (512, 1) ptxas gave them 40-48 registers
// (16-bit) and 53-72 (float32), which kept 5-6 resident 256-thread blocks or 3 of 128
// threads. A tighter cap lets more threads in, which pays where a row's stores wait on one
// parameter (rms_norm) or its loads are many (the residual reads x and r and writes y and
// x + r). layer_norm with weight and bias gains only where the cap lets one more 32 KB
// slice in per SM (bfloat16: 5 -> 6 blocks of 256 threads); its stores wait on two parameter
// loads from L2 a pack, and 4 blocks of 512 threads cache fewer slices than 6 of 256. H200,
// one process, GB/s as the benchmark counts them, mean of two runs, rows = 201326592 / cols,
// (512, 1) -> this table's count (tools/gpu_profile.py cluster-blocks;
// benchmarks/results/nvidia-h200-2026-11-22-cluster-blocks-profile.txt):
//   rms_norm w        float32  32768 3935 -> 4056, 65536 3840 -> 4057, 262144 3341 -> 3691
//                     bfloat16 65536 3688 -> 3717, 262144 3512 -> 3579 (4: 3375)
//   layer_norm res    float16  65536 3739 -> 3978, 262144 3522 -> 3760
//                     bfloat16 131072 3351 -> 3861; float32 65536 3101 -> 3791 (4: 3176)
//   rms_norm res      float16 262144 3283 -> 3872, bfloat16 3311 -> 3842, float32 3188 -> 3584
//   layer_norm w, b   bfloat16 131072 3126 -> 3259, 262144 2913 -> 3015, 32768 3335 -> 3283;
//                     float16 262144 3191 -> 3189 (4: 2814); float32 3181 (3: 3120, 4: 2323)
// Holding 2 or 4 packs' weight and bias ahead of the stores (StoreBatch for 16-bit rows)
// took 61-111 registers and lost 8-35% on the same cells. float32 rms_norm and residual
// kernels with 8-byte packs (rows aligned to 8 bytes only) batch 4 packs' parameters at the
// stores (rows.cuh StoreBatch) and spilled at 40 registers: they keep (512, 1). The float32
// residual's scalar-pack kernels (rows aligned to 4 bytes only) spilled 16 bytes at 40 once
// their rows were summed in one exchange (kOnePassSmem): they take the registers of 2 blocks.
// float32 layer_norm without a residual stores pack by pack (norm_cluster_batch_bytes) and
// so fits 3 blocks (scalar packs 2, as the residual's: 3 spilled 8 bytes on clusters of 8).
// ncu had put its 78-register (512, 1) build at 21 resident warps an SM against rms_norm's
// 48, with stores that wait on two parameter loads a pack from L2 (without weight and bias
// the same rows ran at 97% of copy, with them 77%); 3 blocks with batched stores spilled 8
// bytes. H200, one process, two rounds, rows = 201326592 / cols, (512, 1) with batches ->
// 3 blocks without (benchmarks/results/nvidia-h200-2026-11-26-ln32-cluster-profile.txt):
//   layer_norm w, b   float32  32768 3790 -> 3981, 65536 3770 -> 3949, 131072 3591 -> 3699,
//                     262144 3188 -> 3339 (76.9% -> 80.6% of copy)
// rms_norm lost 2-10% without its batches (float32 262144 3724 -> 3370).
// CUNORM_NORM_CLUSTER_BLOCKS overrides every count for measurement.
__host__ __device__ constexpr int norm_cluster_blocks(int itemsize, int pack_bytes, bool rms,
                                                      bool residual) {
#ifdef CUNORM_NORM_CLUSTER_BLOCKS
  return CUNORM_NORM_CLUSTER_BLOCKS;
#else
  // float32 by pack size: scalar packs 2 (rms_norm without a residual 3), 8-byte packs of
  // rms_norm and the residual forms 1, the rest 3
  return itemsize == 2                           ? (residual ? 4 : 3)
         : itemsize != 4                         ? 1
         : pack_bytes == 4                       ? (rms && !residual ? 3 : 2)
         : pack_bytes == 8 && (rms || residual) ? 1
                                                 : 3;
#endif
}
// The StoreBatch budget (rows.cuh) of the cluster rows: none for float32 layer_norm without a
// residual (above), rows.cuh's elsewhere. CUNORM_NORM_CLUSTER_BATCH_BYTES overrides the
// former for measurement (64: as before).
#ifndef CUNORM_NORM_CLUSTER_BATCH_BYTES
#define CUNORM_NORM_CLUSTER_BATCH_BYTES 0
#endif
__host__ __device__ constexpr int norm_cluster_batch_bytes(int itemsize, bool rms, bool residual) {
  return itemsize == 4 && !rms && !residual ? CUNORM_NORM_CLUSTER_BATCH_BYTES : kStoreBatchBytes;
}
template <typename SRC, bool RMS, bool RESIDUAL, int PACK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1)
    __launch_bounds__(512, norm_cluster_blocks(sizeof(SRC), PACK * sizeof(SRC), RMS, RESIDUAL))
    norm_smem_cluster(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_smem<PACK, CLUSTER, norm_prefetch(sizeof(SRC), RMS, RESIDUAL, CLUSTER),
                              norm_cluster_batch_bytes(sizeof(SRC), RMS, RESIDUAL)>),
                   true);
}

template <typename SRC, bool RMS, bool RESIDUAL, int PACK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(512, 1)
    norm_uncached_cluster(CUNORM_NORM_PARAMS) {
  CUNORM_NORM_ROWS((rows_uncached<PACK, CLUSTER>), true);
}
#endif

}  // namespace cunorm
