// Row-wise kernel bodies shared by every op over a (rows, cols) view: softmax and log_softmax
// (softmax.cu), layer_norm and rms_norm (norm.cu). Paths (chosen by cunorm/_dispatch.py):
//   warp      a group of GROUP lanes holds ROWS rows in registers
//   block     a whole block holds one row in registers
//   smem      one block (or a cluster of CLUSTER blocks, sm_90) caches a row in shared memory
//   uncached  one block (or cluster) per row, two reads: an online pass, then the write pass
// Inlined after common.cuh (cunorm/_kernels.py), like it.
//
// What differs between ops is an OP policy with two statistics, reduced one after the other
// over a row held in registers or shared memory:
//   first:  S1 s1 = R1-reduce of first(s1, x); s1 = middle(s1, cols)   (skipped if !kFirst)
//   second: A s2 = sum of second(v, s1) (which may replace v by a value to keep)
//   output: Fin fin = finish(s1, s2, cols); y = fin.kept(v) from the kept value, fin(x) from x
// softmax: max, then the sum of exp(x - max) (keeping the exps); layer_norm: the mean, then the
// sum of squared deviations (the exact two-pass variance: no cancellation; keeping the
// deviations); rms_norm: the sum of squares only. The uncached paths fold a row once into
// OP::Online instead (online softmax, Welford/Chan, sum of squares) and end with
// finish_online(state, cols).
//   typedefs  C (compute), A (accumulator), S1, R1 (reduction of S1), Online, Fin
//   constants kFirst; kOnePass (the block path skips the first reduction, summing second()
//             about 0, and sums again about recenter() where redo() says the mean lies too far
//             from 0: 16-bit layer_norm); kOnePassSmem (the same on the shared-memory and
//             cluster paths: layer_norm in float compute), there about head_mean(load, row,
//             cols) where kShiftHead (float32 layer_norm); kPadSafe (second() of the padding value
//             adds nothing, so padding slots need no mask); kZeroPad (pad() is 0, the value
//             of a zeroed raw pack, so the warp path leaves padding slots as loaded);
//             Keeps<RAW>::value (the smem path may overwrite its cached raw packs with the
//             kept values)
//   pad()     value of the register slots past the end of a row
//   write_stats(row, fin)  per-row outputs (mean, rstd), by one thread per row
// The LOAD functor moves the input (DirectLoad; ResidualLoad forms x + r), the STORE functor
// writes y (DirectStore; AffineStore applies weight and bias).
namespace cunorm {

// Values a thread loads before using the first one, in the block-per-row paths: enough bytes
// in flight per thread to cover memory latency, few enough registers for 512-thread blocks.
constexpr int kUnrollValues = 16;

// The N packs a thread of a register path holds of a row (or of a chunk of it): pack u is
// at(u) = {row, col, valid}. Every valid raw pack is fetched before any is converted; then
// every pack is converted (element by element: common.cuh pack_to_compute) and the invalid
// ones overwritten with OP::pad() (raw packs start zeroed: with !PAD, which the block path
// passes for kZeroPad ops, they stay as converted, 16 selects fewer a row-thread in the 16-bit
// layer_norm kernels; without them ptxas spilled the uncached float32 layer_norm kernels with
// scalar packs, which keep them). With the conversion inside each
// pack's bounds test, nvcc 13 branched around the bfloat16 ones instead of predicating them,
// and each load waited for the one before: half the bytes in flight, 3636 GB/s against
// float16's 4220 on the same block kernel (H200, 8192 columns). Returns the number of valid
// values (the valid packs of a chunk are a prefix).
template <typename COL> struct PackAt {
  i64 row;
  COL col;
  bool valid;
};
// The valid ones of N packs at(u) fetched, put(u, raw pack). A LOAD that fetches in two steps
// (LOAD::kStaged: common.cuh ResidualLoad, whose stores of h would otherwise hold each next
// load back) issues the loads of STAGE packs before it lands the first of them. Registers
// bound STAGE (stage_packs): the staged raw x and r of 16-byte packs take 8 a pack.
template <int N, int PACK, int STAGE, class LOAD, class AT, class PUT>
__device__ __forceinline__ void fetch_packs(const LOAD& load, const AT& at, const PUT& put) {
  if constexpr (STAGE > 1) {
#pragma unroll
    for (int u0 = 0; u0 < N; u0 += STAGE) {
      // zeroed: with the slots of invalid packs left undefined, ptxas spilled the warp kernels
      typename LOAD::template Staged<PACK> staged[STAGE] = {};
#pragma unroll
      for (int u = u0; u < u0 + STAGE && u < N; ++u) {
        const auto a = at(u);
        if (a.valid) staged[u - u0] = load.template stage<PACK>(a.row, a.col);
      }
#pragma unroll
      for (int u = u0; u < u0 + STAGE && u < N; ++u) {
        const auto a = at(u);
        if (a.valid) put(u, load.template land<PACK>(staged[u - u0], a.row, a.col));
      }
    }
  } else {
#pragma unroll
    for (int u = 0; u < N; ++u) {
      const auto a = at(u);
      if (a.valid) put(u, load.template fetch<PACK>(a.row, a.col));
    }
  }
}
// STAGE of fetch_packs: `packs` 16-byte packs at a time where the kernel has the registers
// (`room`), else one by one as fetch does. What each path stages and why, H200, with a
// residual, weight and bias, one process against the unstaged kernels (GB/s, 49152 rows;
// benchmarks/results/nvidia-h200-2026-11-26-staged-loads-profile.txt):
//   warp path, 4 packs (CUNORM_STAGE_PACKS), 2 where a lane holds 128 bytes of row or more:
//     layer_norm float16 1000 / 1024 cols 3728 -> 3881 / 3887 -> 3996, bfloat16 3717 -> 3906
//     / 3882 -> 3984, float32 512 3894 -> 3995, rms_norm float16 1024 3882 -> 3960 (2 packs:
//     about half of that); a group's two rows of one pack each staged together: float32 32
//     cols 1996 -> 2117, 16-bit 32 cols +2%, 64-128 within 1%;
//   block path, rows of at most 2 packs a thread (CUNORM_BLOCK_STAGE_PACKS), 4- and 8-byte
//     elements (the 16-bit kernels have 32 registers): float32 1024 cols 4090 -> 4137;
//     float32 rows of 4 packs gained at 8192 cols (4032 -> 4130) and lost at 4096 (4206 ->
//     4070-4140: the registers left 4 resident 256-thread blocks, not 5), so they fetch as
//     before;
//   one-block shared-memory rows, 2 packs (CUNORM_SMEM_STAGE_PACKS), float32 on 512-thread
//     blocks (cunorm/_dispatch.py _plan_smem): layer_norm float32 12288 cols 3825 -> 4118,
//     16384 3918 -> 4097, rms_norm 3761 -> 4130 / 4018 -> 4118; 4 packs took 77 registers
//     (16384: 3710) and 16-bit rows 60 (12288: 3428-3801 against 4080); 16-bit rows stay at
//     40 registers with 2 and as fast as before (4071 against 4080);
//   cluster and uncached rows fetch as before (registers capped for resident blocks; an
//     uncached row reads h back).
// No spills on sm_80 or sm_90 (nvcc 13, tests/test_nvcc.py). The macros are for measurement.
#ifndef CUNORM_STAGE_PACKS
#define CUNORM_STAGE_PACKS 4
#endif
#ifndef CUNORM_BLOCK_STAGE_PACKS
#define CUNORM_BLOCK_STAGE_PACKS 2
#endif
#ifndef CUNORM_SMEM_STAGE_PACKS
#define CUNORM_SMEM_STAGE_PACKS 2
#endif
template <class LOAD, int PACK>
__host__ __device__ constexpr int stage_packs(bool room, int packs) {
  return LOAD::kStaged && room && sizeof(Pack<typename LOAD::raw_t, PACK>) == 16 ? packs : 1;
}
template <int N, int PACK, class OP, bool PAD = true, int STAGE = 1, class LOAD, class AT,
          class DST>
__device__ __forceinline__ int load_packs(const LOAD& load, const AT& at, const DST& dst) {
  Pack<typename LOAD::raw_t, PACK> raw[N] = {};
  fetch_packs<N, PACK, STAGE>(load, at, [&](int u, const auto& p) { raw[u] = p; });
  int nvalid = 0;
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const auto a = at(u);
    typename OP::C* const v = dst(u);
    load.template convert<PACK, false>(raw[u], v, a.row, a.col);
    if (a.valid) {
      nvalid += PACK;
    } else if constexpr (PAD) {
#pragma unroll
      for (int i = 0; i < PACK; ++i) v[i] = OP::pad();
    }
  }
  return nvalid;
}

// Packs a thread of the shared-memory path stores per batch: the STORE functor's parameter
// loads (weight and bias) of a batch go out together before its stores, so a row pays one L2
// latency per batch instead of one per pack (the compiler may not move those loads above a
// store to y, which might alias). A batch holds at most kStoreBatchBytes of parameters in
// registers, and only functors with kBatchParams batch at all. H200, layer_norm with weight
// and bias, one run (tools/gpu_profile.py store-batch): float32 16384 cols 2731 -> 3466 GB/s,
// 65536 cols 2432 -> 3094. 16-bit rows gained nothing and their kernels grew past the 40
// registers the block-size choice keys on (float16 16384-262144 cols lost 9-23% in a bench
// run), and the warp and block paths (whole row unrolled in registers) lost up to 3x, so
// those store pack by pack, each store loading its own parameters.
// CUNORM_STORE_BATCH_BYTES overrides the byte budget for measurement (0: no batching).
#ifndef CUNORM_STORE_BATCH_BYTES
#define CUNORM_STORE_BATCH_BYTES 64
#endif
// A kernel may give its own budget (norm.cu norm_cluster_batch_bytes).
constexpr int kStoreBatchBytes = CUNORM_STORE_BATCH_BYTES;
template <class STORE, int PACK, int BUDGET = kStoreBatchBytes> struct StoreBatch {
  static constexpr int bytes = static_cast<int>(sizeof(typename STORE::template Params<PACK>));
  static constexpr int value = !STORE::kBatchParams || bytes >= BUDGET ? 1
                               : (BUDGET / bytes > 4 ? 4 : BUDGET / bytes);
};

// The parameters of the B packs p0, p0 + step, ... below pack_end (a STORE with kBatchParams).
template <int B, int PACK, class STORE>
__device__ __forceinline__ void load_params(const STORE& store,
                                            typename STORE::template Params<PACK>* prm, i64 p0,
                                            int step, i64 pack_end) {
#pragma unroll
  for (int u = 0; u < B; ++u) {
    if (p0 + u * step < pack_end) prm[u] = store.template params<PACK>((p0 + u * step) * PACK);
  }
}

// ---------------------------------------------------------------------------------------
// Warp path. Launch: 1-D block of blockDim.x threads (a multiple of 32), GROUP lanes per
// row group, ROWS rows per group per step; grid-stride over row groups. COLS values per
// thread; packs past `cols` are padding (one compare per pack). EXACT kernels take rows of
// exactly GROUP x COLS columns (no padding) in a grid with a group for every row group: the
// compares, the row loop and the runtime 1/cols go (cunorm/_dispatch.py WARP_EXACT_FAMILIES:
// H200, layer_norm bfloat16 512 columns +5.7%, most other rows +0.4-2.5%; layer_norm rows
// without a residual that load their parameters early lost 2-6% and are not planned EXACT,
// nor are float64 rms_norm's; nvidia-h200-2026-11-27-exact-warp-profile.txt; 16-bit
// layer_norm rows of 256 columns are, on large grids: warp_exact_min_blocks). The row stays in
// registers, so both reductions cost shuffles only.
//
// Where the parameters are all present the STORE functor's type says so (AffineStore::
// with_known_params), so no pack tests them, and a 32-lane group of one row skips the row
// test: sm_90, float16 layer_norm 1024 columns, a pack's store went from ~56 SASS instructions
// to 36. Rows of at most 256 columns on one row a group (warp_early_params: the group's
// columns, GROUP x COLS, 64-256) also load the lane's parameters right after its row, so their
// latency passes under the row's instead of following the reductions. H200, weight and bias,
// one process against the previous sources (tools/gpu_profile.py warp-row-sources;
// benchmarks/results/nvidia-h200-2026-11-23-warp-params-profile.txt), GB/s: layer_norm float16
// 128 / 256 / 1024 cols 1996 -> 2141 / 2696 -> 2801 / 3710 -> 3748, bfloat16 1966 -> 2143 /
// 2718 -> 2796 / 3716 -> 3750, float32 64 / 128 / 256 2141 -> 2211 / 2752 -> 2865 / 3336 ->
// 3411, rms_norm float16 128 2062 -> 2185; softmax within 0.5%. Parameters loaded early
// elsewhere cost more than they hid (a build loading them early on every row of at most 16
// values a lane): 16 registers more on 512 16-bit columns (float16 layer_norm 3308 -> 3276),
// a spill on float32 rows of 16 values a lane (3787 -> 3511), and 32-column 16-bit rows (16 a
// warp) and 64-column ones (two a group) lost 2-5%.
// WIDE (norm.cu norm_warp_wide_early: 16-bit rms_norm without a residual in full packs, one
// weight vector and no bias) extends the rule to groups of up to 1024 columns. H200, one
// process, two rounds, GB/s (benchmarks/results/nvidia-h200-2026-11-28-early-params-profile.txt):
// rms_norm float16 512 cols 3401 -> 3457, bfloat16 1000 3697 -> 3758, 1024 (at 80 registers,
// norm.cu norm_warp_blocks) float16 3797 -> 3834, bfloat16 3807 -> 3846, outputs
// bit-identical. layer_norm's weight and bias early lost 0.8-1.3% at 512 columns, and at
// 1000-1024 spilled at 64 and 80 registers and lost 2.2-2.6% at 96; the residual forms and
// softmax did not move.
// TINY (norm.cu norm_warp_tiny_early: the 16-bit norms in full packs, exact kernels) extends
// the rule down to groups of 32 columns (two lanes of 16 values a row), where the store had
// waited on the weight's load after the row's reductions. H200, 49152 rows, one
// process, three rounds, GB/s, outputs bit-identical (benchmarks/results/nvidia-h200-2026-11-
// 28-session70-f32-512-profile.txt section 7): rms_norm bfloat16 32 cols 910 -> 950, float16
// 910 -> 950, with a residual 1409 -> 1456 / 1414 -> 1456, layer_norm with a residual float16
// 1404 -> 1456, bfloat16 1414 -> 1462; the shipped form against the previous sources on
// another H200: rms_norm and its residual form +2.6-4%, layer_norm's +0.7-1.4%; 40-56
// registers on sm_90, 38-63 on sm_80, no spills. 16-bit layer_norm without a residual staged
// its weight and bias there (STAGE, below) until session 72; staged / early / neither, one
// process, three rounds, median GB/s, outputs bit-identical (benchmarks/results/
// nvidia-h200-2026-11-28-session72-ln32-early-profile.txt): 49152 rows float16 945 / 959 /
// 954, bfloat16 932 / 969 / 950; 196608 rows float16 2053 / 2222 / 2120, bfloat16 2027 /
// 2228 / 2143 (torch.compile 1003 and 2234-2247); staged -> early on a second H200 +2.5-3.4%
// and +9.0-9.2%; 55-56 registers (staged 48).
__host__ __device__ constexpr bool warp_early_params(int cols, int group, int rows,
                                                     bool wide = false, bool tiny = false) {
  return rows == 1 && group * cols >= (tiny ? 32 : 64) && group * cols <= (wide ? 1024 : 256);
}
// STAGE (norm.cu norm_warp_stages_params: 16-bit layer_norm rows without a residual in full
// packs, one row a group, parameters not loaded early): where weight and bias are both
// present, each lane copies its parameter packs into the kernel's dynamic shared memory by
// cp.async (through L1) before the row loop, and reads them back at the stores. Their latency
// then passes under the row's, as EARLY's, without EARLY's registers: the copy holds none,
// and each pack is read back at its store (the lane reads only what it copied, so no barrier).
// The block needs blockDim.x x 2 x COLS parameter values of shared memory where both are
// given (cunorm/_dispatch.py warp_stage_bytes); a launch with less traps. H200, 49152 rows, one
// process, three rounds, GB/s, plain -> staged, outputs bit-identical (benchmarks/results/
// nvidia-h200-2026-11-28-session68-staged-params-profile.txt): layer_norm float16 512 / 768 /
// 1000 / 1024 cols 3343 -> 3434, 3616 -> 3710, 3692 -> 3762, 3756 -> 3825, bfloat16 3347 ->
// 3434, 3586 -> 3647, 3683 -> 3749, 3758 -> 3825. Not staged: float32 rows (layer_norm 768
// -6.6% and rms_norm 512 -4.2%: ptxas read every pack's parameters back at once, 46 -> 64 and
// 32 -> 39 registers), the residual forms (+0.3-0.5%, and float16 rms_norm's at 1024 columns
// spilled), and 16-bit rms_norm, whose full-pack rows load their weight early (WIDE).
template <int PACK, int COLS, int GROUP, int ROWS, bool EXACT = false, bool WIDE = false,
          bool STAGE = false, bool TINY = false, class OP, class LOAD, class STORE>
__device__ __forceinline__ void rows_warp(const OP& op, const LOAD& load, const STORE& store,
                                          i64 rows, i64 row_cols) {
  static_assert(COLS % PACK == 0, "COLS is a multiple of PACK");
  typedef typename OP::C C;
  typedef typename OP::A A;
  typedef typename OP::S1 S1;
  constexpr int NPACK = COLS / PACK;
  constexpr int ROWS_PER_WARP = 32 / GROUP * ROWS;
  constexpr bool EARLY = warp_early_params(COLS, GROUP, ROWS, WIDE, TINY);
  static_assert(!EARLY || ROWS == 1, "the early stores below name row 0 only");
  const int lane = threadIdx.x % GROUP;
  const int group_in_warp = (threadIdx.x % 32) / GROUP;
  const i64 warp = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x / 32 * ROWS_PER_WARP;
  // EXACT: rows of exactly GROUP x COLS columns in a grid of a group a row group (one step, no
  // row loop), so the columns, their predicates and 1/cols are compile-time constants.
  const auto cols = [&] {
    if constexpr (EXACT) return FixedCols<static_cast<i64>(GROUP) * COLS>{};
    else return row_cols;
  }();
  // Column of pack p: 32-bit, as on the block path (a warp-path row has at most 32 x 48).
  const unsigned ncols = static_cast<unsigned>(cols);
  const auto in_row = [&](unsigned col) { return EXACT || col < ncols; };
  const auto pack_col = [&](int p) { return (static_cast<unsigned>(p) * GROUP + lane) * PACK; };
  // EXACT kernels of 16-bit rows whose loads write nothing read a row group past the end
  // from the last row instead (its results are never stored), so no load is predicated on a
  // row test: ptxas had built the zeros of a missing row half by half (sm_90, float16
  // rms_norm 128 columns: 64 PRMT of 368 instructions). H200, same process, bit-identical
  // (benchmarks/results/nvidia-h200-2026-11-27-rms-store-profile.txt): 16-bit rows of 32-128
  // columns +0.5-2.7%, others within 0.1%; float32 rows gained at 32 columns (+1.1-1.5%) but
  // lost 2-2.5% on rms_norm's 64-128 (31 -> 37 registers), so they keep the row test.
  // (Written as branches of their own: folded into the other kernels' tests, the same
  // conditions changed their code enough for ptxas to spill 16-bit and float64 warp kernels
  // on sm_80.)
  constexpr bool CLAMP_ROWS = EXACT && !LOAD::kStaged && sizeof(typename LOAD::raw_t) == 2;
  static_assert(!STAGE || (!EARLY && ROWS == 1 && STORE::kParams), "STAGE: see above");
  // STAGE: lane l of warp w keeps parameter kind k (0 weight, 1 bias) of pack p at slot
  // ((w * 2 + k) * NPACK + p) * 32 + l, so a warp reads 32 consecutive packs.
  typedef Pack<typename LOAD::raw_t, PACK> ParamPack;
  CUNORM_DYNAMIC_SMEM(stage_smem);
  const auto slot = [&](int kind, int p) {
    return reinterpret_cast<ParamPack*>(stage_smem) +
           (((threadIdx.x / 32) * 2 + kind) * NPACK + p) * 32 + threadIdx.x % 32;
  };
  // The row loop on STORE functor st: the one of with_known_params for the whole loop where
  // EARLY (whose parameter loads precede each row's stores, and in a grid-stride loop follow
  // the previous row's: y never overlaps the parameters, cunorm/norm.py _direct_out), else
  // the kernel's, which takes with_known_params per row group at its stores.
  const auto row_loop = [&](const auto& st) {
    typedef typename RemoveCvRef<decltype(st)>::type ST;
    constexpr bool STAGED = STAGE && ST::kKnown == kParamsBoth;
    if constexpr (STAGED) {
      unsigned dynamic_bytes;
      asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
      if (dynamic_bytes < blockDim.x * 2 * COLS * sizeof(typename LOAD::raw_t)) __trap();
#pragma unroll
      for (int p = 0; p < NPACK; ++p) {
        if (in_row(pack_col(p)))
          st.template stage_params<PACK>(slot(0, p), slot(1, p), pack_col(p));
      }
      copy_async_commit();
    }
    // The loop bound is uniform across the warp (the shuffles below name all 32 lanes); rows
    // past the end are masked instead.
    for (i64 base = warp * ROWS_PER_WARP; base < rows; base += step) {
      const i64 row0 = base + group_in_warp * ROWS;
      // load_packs over the ROWS x NPACK packs, written out: through the helper (pack u of
      // row u / NPACK) ptxas allocated the warp kernels differently, 2270 more registers
      // summed over the norm warp instantiations and 5 of them spilling (nvcc 13, sm_90). The
      // packs are held as 32-bit words and converted (and the parameters at the stores) by
      // words (pack_to_compute WORDS): sm_90, float16 layer_norm 256 columns 599 -> 571 SASS
      // instructions, bfloat16 643 -> 616, softmax float16 1024 836 -> 781.
      typedef Pack<typename LOAD::raw_t, PACK> RawPack;
      Words<RawPack> raw[ROWS][NPACK] = {};
      C buf[ROWS][COLS];
      // (a lane of one pack fetches it as before: nothing to issue ahead)
      constexpr int STAGE = ROWS * NPACK == 1 ? 1 : stage_packs<LOAD, PACK>(
          true, COLS * sizeof(typename LOAD::raw_t) >= 128 ? 2 : CUNORM_STAGE_PACKS);
      // Pack at row, col of a staged LOAD (only ResidualLoad stages, and CLAMP_ROWS excludes
      // it: its landing writes h, so rows past the end are tested, not read from the last)
      const auto staged_at = [&](i64 row, unsigned col) {
        return PackAt<unsigned>{row, col, row < rows && in_row(col)};
      };
      if constexpr (STAGE > 1 && NPACK < STAGE) {
        // rows of fewer packs than STAGE: the group's rows together (pack u of row u / NPACK;
        // float32 32 columns, two rows a group, 1996 -> 2117 GB/s)
        fetch_packs<ROWS * NPACK, PACK, STAGE>(
            load, [&](int u) { return staged_at(row0 + u / NPACK, pack_col(u % NPACK)); },
            [&](int u, const RawPack& v) { raw[u / NPACK][u % NPACK] = to_words(v); });
      } else if constexpr (STAGE > 1) {
        // row by row (one fetch_packs over all the group's packs spilled the 1024-column
        // 16-bit kernels)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          fetch_packs<NPACK, PACK, STAGE>(
              load, [&](int p) { return staged_at(row0 + r, pack_col(p)); },
              [&](int p, const RawPack& v) { raw[r][p] = to_words(v); });
        }
      } else {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
#pragma unroll
          for (int p = 0; p < NPACK; ++p) {
            const unsigned col = pack_col(p);
            if constexpr (CLAMP_ROWS) {
              const i64 row = row0 + r >= rows ? rows - 1 : row0 + r;
              raw[r][p] = to_words(load.template fetch<PACK>(row, col));
            } else if (row0 + r < rows && in_row(col)) {
              raw[r][p] = to_words(load.template fetch<PACK>(row0 + r, col));
            }
          }
        }
      }
      typename ST::template Params<PACK> prm[EARLY ? NPACK : 1];
      if constexpr (EARLY) {
#pragma unroll
        for (int p = 0; p < NPACK; ++p) {
          if (in_row(pack_col(p))) prm[p] = st.template params<PACK>(pack_col(p));
        }
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int p = 0; p < NPACK; ++p) {
          const unsigned col = pack_col(p);
          load.template convert<PACK, true>(from_words<RawPack>(raw[r][p]), buf[r] + p * PACK,
                                            row0 + r, col);
          if (!CLAMP_ROWS && !OP::kZeroPad && (row0 + r >= rows || !in_row(col))) {
#pragma unroll
            for (int i = 0; i < PACK; ++i) buf[r][p * PACK + i] = OP::pad();
          }
        }
      }
      S1 s1[ROWS] = {};
      if constexpr (OP::kFirst) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          s1[r] = OP::R1::identity();
#pragma unroll
          for (int i = 0; i < COLS; ++i) s1[r] = op.first(s1[r], buf[r][i]);
          s1[r] = op.middle(group_all_reduce<typename OP::R1, GROUP>(s1[r]), cols);
        }
      }
      A s2[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        s2[r] = A{};
#pragma unroll
        for (int p = 0; p < NPACK; ++p) {
          const bool valid = OP::kPadSafe || in_row(pack_col(p));
#pragma unroll
          for (int i = 0; i < PACK; ++i) {
            const A t = op.second(buf[r][p * PACK + i], s1[r]);
            if (valid) s2[r] += t;
          }
        }
        s2[r] = group_all_reduce<SumOp<A>, GROUP>(s2[r]);
      }
      // The kept values in place; EARLY at each pack's store, each finish unconditional (with
      // the finishes after the row test and the kept values formed here ptxas spilled 336
      // bytes of bfloat16 layer_norm at 128 columns, 8 of three others).
      typename OP::Fin fin[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        if (!EARLY && row0 + r >= rows) break;
        fin[r] = op.finish(s1[r], s2[r], cols);
        if (lane == 0 && row0 + r < rows) op.write_stats(row0 + r, fin[r]);
#pragma unroll
        for (int i = 0; i < COLS; ++i) {
          if (!EARLY) buf[r][i] = fin[r].kept(buf[r][i]);
        }
      }
      // Pack by pack, each pack's parameters loaded (unless EARLY) and converted once for the
      // group's rows (cunorm/_dispatch.py WARP_SPREAD_PACKS). A 32-lane group of one row holds
      // a row below `rows` (row0 = base), so a STORE with parameters skips the row test (a
      // float32 layer_norm kernel with a residual spilled 8 bytes on sm_90 with it); one
      // without keeps it (ptxas spilled 8-16 bytes of 16-bit to float32 log_softmax of 40-48
      // values a lane on sm_80 without it).
      const i64 count = ST::kParams && GROUP == 32 && ROWS == 1 ? 1 : rows - row0;
      if constexpr (EARLY) {
#pragma unroll
        for (int p = 0; p < NPACK; ++p) {
          const unsigned col = pack_col(p);
          if (in_row(col) && count > 0) {
#pragma unroll
            for (int i = 0; i < PACK; ++i) buf[0][p * PACK + i] = fin[0].kept(buf[0][p * PACK + i]);
            st.template store<PACK>(buf[0] + p * PACK, row0, col, prm[p]);
          }
        }
      } else if constexpr (STAGED) {
        copy_async_wait<0>();
#pragma unroll
        for (int p = 0; p < NPACK; ++p) {
          const unsigned col = pack_col(p);
          if (in_row(col) && count > 0) {
            typename ST::template Params<PACK> prm;
            prm.w = *slot(0, p);
            prm.b = *slot(1, p);
            st.template store<PACK>(buf[0] + p * PACK, row0, col, prm);
          }
        }
      } else {
        st.with_known_params([&](const auto& known) {
#pragma unroll
          for (int p = 0; p < NPACK; ++p) {
            const unsigned col = pack_col(p);
            if (in_row(col)) {
              // (SPLIT false: with_known_params has split off the parameters all present)
              known.template store_rows<PACK, ROWS, true, false>(buf[0] + p * PACK, COLS, row0,
                                                                 count, col);
            }
          }
        });
      }
      if constexpr (EXACT) break;  // the grid has a group for every row group
    }
    if constexpr (STAGED) copy_async_wait<0>();  // a group without a row copied them too
  };
  if constexpr (EARLY || STAGE) {
    store.with_known_params(row_loop);
  } else {
    row_loop(store);
  }
}

// Launch bounds of the block-register kernels, CUNORM_BLOCK_BOUNDS(pack bytes, COLS, full,
// short): rows held in full 16-byte packs, at most 16 values a thread, get the registers of
// `full` resident 512-thread blocks per SM, and those of at most 8 values a thread the
// registers of `short` blocks (each kernel's largest counts that compile without spills on
// sm_80 and sm_90 with nvcc 13, tests/test_nvcc.py, or fewer where more lost); the others one
// block. Without the cap nvcc gave the float16 8192-column softmax 32 registers and NVRTC 34,
// one resident block fewer: ncu on H200, 71% occupancy against the Triton peer's 95% with the
// same loads and reductions. When full is even the same cap is written (1024, full / 2), so
// those kernels also take blocks of up to 1024 threads (cunorm/_dispatch.py block_wide), which
// hold a 16384-column row at the 16 values a thread of an 8192-column one. (__maxnreg__ with
// the same cap made ptxas spill and use more registers: nvcc 13, sm_90.)
__host__ __device__ constexpr bool block_row_in_full_packs(int pack_bytes, int cols) {
  return pack_bytes == 16 && cols <= 16;
}
// Rows in full packs of 17 to 32 values a thread get the registers of 2 resident 512-thread
// blocks (64), as the Triton peer's 16-warp programs hold 24-32 values: cunorm/_dispatch.py
// BLOCK_MID has the measurements.
__host__ __device__ constexpr bool block_row_mid(int pack_bytes, int cols) {
  return pack_bytes == 16 && cols > 16 && cols <= 32;
}
__host__ __device__ constexpr int block_max_threads(int pack_bytes, int cols, int full) {
  return block_row_in_full_packs(pack_bytes, cols) && full % 2 == 0 ? 1024 : 512;
}
__host__ __device__ constexpr int block_min_blocks(int pack_bytes, int cols, int full,
                                                   int short_rows) {
  return block_row_in_full_packs(pack_bytes, cols)
             ? (cols <= 8 ? short_rows : full) * 512 / block_max_threads(pack_bytes, cols, full)
             : (block_row_mid(pack_bytes, cols) ? 2 : 1);
}
#define CUNORM_BLOCK_BOUNDS(PACK_BYTES, COLS, FULL, SHORT)                                   \
  __launch_bounds__(block_max_threads(PACK_BYTES, COLS, FULL),                               \
                    block_min_blocks(PACK_BYTES, COLS, FULL, SHORT))

// Row index of the block kernels (ROW of rows_block): 32-bit for rows in full packs of at most
// 16 values a thread (the kernels compiled for 32-40 registers; the dispatcher keeps the block
// path to rows < 2^31, cunorm/_dispatch.py BLOCK_MAX_ROWS), where a 64-bit row took a register
// pair and 12-29 SASS instructions of 470-770 (sm_90) and the 16-bit layer_norm kernels need
// the registers (word stores, below); 64-bit for the others, whose 32-bit ones spilled 12 bytes
// (softmax of 24 16-bit values a thread to float32 on sm_90, float32 layer_norm with a
// residual in scalar packs on sm_80).
template <int PACK_BYTES, int COLS>
using BlockRow = typename Conditional<block_row_in_full_packs(PACK_BYTES, COLS), unsigned,
                                      i64>::type;

// ---------------------------------------------------------------------------------------
// Block-register path: the row lives in the registers of a whole block (COLS values per
// thread, packs strided by blockDim.x), as the warp path keeps it in one warp's; the two
// reductions go through shared memory. For rows too long for a warp and short enough that
// each of up to 512 threads holds a few dozen values: one read per element. ROW counts rows
// (BlockRow, above).
//
// The one-pass ops (16-bit layer_norm) keep x in buf through both sums and form y from
// x - s1 at the stores (s1 = 0 unless the row was summed again about its mean): where a redo
// replaced buf by its deviations, the two versions of the row met at the stores and took 2-3
// registers more (spills at 32, nvcc 13, sm_90). That costs one add a value. With them free,
// those kernels store by words, weight and bias in a branch of their own (AffineStore
// store_rows WORDS and SPLIT: bfloat16 parameters convert two a word in one instruction each,
// not three). H200, one process against the previous sources, weight and bias, GB/s
// (tools/gpu_profile.py block-row-sources; benchmarks/results/nvidia-h200-2026-11-23-block-
// rows-profile.txt): bfloat16 2048 / 3000 / 4096 / 8192 cols 3748 -> 3881 / 3646 -> 3785 /
// 3847 -> 3993 / 3830 -> 3965, float16 3926 -> 3976 / 3819 -> 3904 / 4045 -> 4107 / 4000 ->
// 4023, rows 200 off 0 (every row summed again) float16 4096 3698 -> 3762, bfloat16 3500 ->
// 3667; but 16384 cols (the same kernels on 1024-thread blocks) float16 3885 -> 3857,
// bfloat16 3956 -> 3890. The others keep element-wise stores: rms_norm lost 2.5% with word
// stores (weight only: no split branch), and the float32 layer_norm kernel of 32 values a
// thread spilled 24 bytes.
// EXACT (norm_block, where cunorm/_dispatch.py block_exact says): the row fills every thread's
// COLS values (cols == blockDim.x * COLS), so the loads, sums and stores test no column.
template <int PACK, int COLS, typename ROW, bool EXACT = false, class OP, class LOAD,
          class STORE>
__device__ __forceinline__ void rows_block(const OP& op, const LOAD& load, const STORE& store,
                                           i64 rows, i64 cols) {
  static_assert(COLS % PACK == 0, "COLS is a multiple of PACK");
  typedef typename OP::C C;
  typedef typename OP::A A;
  typedef typename OP::S1 S1;
  constexpr int NPACK = COLS / PACK;
  __shared__ S1 scratch1[33];
  __shared__ A scratch2[33];
  C buf[COLS];
  // Column of pack p. A row here has at most 512 * COLS columns, so 32-bit indices do: 64-bit
  // ones took the register that kept the 16-bit norms under 32 (4 resident blocks), and with
  // signed ones nvcc 13 spilled 4 bytes of 16-bit log_softmax on sm_80 (and of rms_norm).
  const unsigned ncols = static_cast<unsigned>(cols);
  const auto pack_col = [](int p) {
    return (p * blockDim.x + threadIdx.x) * PACK;
  };
  const auto in_row = [&](unsigned col) { return EXACT || col < ncols; };  // as rows_warp's
  // The sum of second() over the row about s1, block-reduced.
  const auto second_sum = [&](S1 s1) {
    A s2 = A{};
#pragma unroll
    for (int p = 0; p < NPACK; ++p) {
      const bool valid = OP::kPadSafe || in_row(pack_col(p));
#pragma unroll
      for (int i = 0; i < PACK; ++i) {
        C v = buf[p * PACK + i];
        const A t = op.second(v, s1);
        if (!OP::kOnePass) buf[p * PACK + i] = v;  // the kept value (kOnePass: x stays)
        if (valid) s2 += t;
      }
    }
    return block_all_reduce<SumOp<A>>(s2, scratch2);
  };
  for (ROW row = blockIdx.x; row < static_cast<ROW>(rows); row += gridDim.x) {
    // (the 16-bit kernels of rows in full packs have 32 registers: CUNORM_BLOCK_BOUNDS)
    constexpr bool kRoom = sizeof(typename LOAD::raw_t) >= 4 && NPACK <= 2;
    constexpr int STAGE = stage_packs<LOAD, PACK>(kRoom, CUNORM_BLOCK_STAGE_PACKS);
    load_packs<NPACK, PACK, OP, !OP::kZeroPad, STAGE>(load, [&](int p) {
      const unsigned col = pack_col(p);
      return PackAt<unsigned>{row, col, in_row(col)};
    }, [&](int p) { return buf + p * PACK; });
    S1 s1 = S1();  // kOnePass: 0
    if constexpr (OP::kFirst && !OP::kOnePass) {
      s1 = OP::R1::identity();
#pragma unroll
      for (int i = 0; i < COLS; ++i) s1 = op.first(s1, buf[i]);
      s1 = op.middle(block_all_reduce<typename OP::R1>(s1, scratch1), cols);
    }
    A s2 = second_sum(s1);
    if constexpr (OP::kOnePass) {
      if (op.redo(s2, cols)) {  // block-uniform: every thread has the reduced bits
        s1 = op.recenter(s1, s2, cols);  // buf holds x still
        s2 = second_sum(s1);
      }
    }
    const typename OP::Fin fin = op.finish(s1, s2, cols);
    if (threadIdx.x == 0) op.write_stats(row, fin);
#pragma unroll
    for (int i = 0; i < COLS; ++i) buf[i] = fin.kept(OP::kOnePass ? buf[i] - s1 : buf[i]);
#pragma unroll
    for (int p = 0; p < NPACK; ++p) {
      const unsigned col = pack_col(p);
      if (in_row(col)) {
        store.template store_rows<PACK, 1, OP::kOnePass, OP::kOnePass>(buf + p * PACK, 0, row,
                                                                        1, col);
      }
    }
  }
}

// Parameter lines the shared-memory path asks L1 for (STORE::prefetch_params), so that its
// stores find them there and do not wait on L2: none; the whole slice's as a row's loads go
// out; or the first kPrefetchBatches batches' then, and each batch's that many batches ahead
// of its stores. H200, two processes, kAhead's cells (tools/gpu_profile.py
// prefetch-distance; benchmarks/results/nvidia-h200-2026-11-26-ln32-cluster-profile.txt),
// first two rounds of each, 1 / 2 / 4 / 6 batches ahead: float32 layer_norm 262144 cols
// 3383/3382, 3413/3402, 3424/3409, 3443/3435 GB/s and 3361/3360, 3397/3383, 3398/3399,
// 3430/3430; float64 layer_norm 16384-262144 cols within +-1% (outliers aside).
enum class Prefetch { kNone, kSlice, kAhead };
#ifndef CUNORM_PREFETCH_BATCHES
#define CUNORM_PREFETCH_BATCHES 6
#endif
constexpr int kPrefetchBatches = CUNORM_PREFETCH_BATCHES;

// ---------------------------------------------------------------------------------------
// Shared-memory path: a cluster of CLUSTER blocks per row (CLUSTER == 1: one block), each
// caching its slice of the row in shared memory as raw input packs (LOAD::fill: cp.async for
// a plain input, so no registers and every pack of the slice in flight at once). Both
// statistics are then reduced from shared memory; partial results of a cluster's blocks meet
// through distributed shared memory. Dynamic shared memory: ceil(cols / PACK / CLUSTER) * PACK
// * sizeof(raw_t). Launched with one block (cluster) per row: measured faster on H200 than a
// persistent grid double-buffering the next row (benchmarks/results/thresholds-*.md).
// PREFETCH: which of the slice's parameter lines the row asks L1 for (STORE::prefetch_params;
// norm.cu norm_prefetch). BATCH_BYTES: the StoreBatch budget of its stores.
template <int PACK, int CLUSTER, Prefetch PREFETCH = Prefetch::kNone,
          int BATCH_BYTES = kStoreBatchBytes, class OP, class LOAD, class STORE>
__device__ __forceinline__ void rows_smem(const OP& op, const LOAD& load, const STORE& store,
                                          i64 rows, i64 cols) {
  typedef typename OP::C C;
  typedef typename OP::A A;
  typedef typename OP::S1 S1;
  typedef typename LOAD::raw_t R;
  typedef Pack<R, PACK> RawPack;
  constexpr bool KEEP = OP::template Keeps<R>::value;
  CUNORM_DYNAMIC_SMEM(smem_raw);
  __shared__ S1 scratch1[33];
  __shared__ A scratch2[33];
  // the blocks' partial statistics (kOnePassSmem: mail1 carries the sums of a redo)
  __shared__ ClusterMail<typename Conditional<OP::kOnePassSmem, A, S1>::type, CLUSTER> mail1;
  __shared__ ClusterMail<A, CLUSTER> mail2;
  const i64 npacks = cols / PACK;
  const i64 packs_per_block = (npacks + CLUSTER - 1) / CLUSTER;
  const unsigned rank = Cluster<CLUSTER>::rank();
  const i64 pack_begin = rank * packs_per_block;
  const i64 pack_end = min(npacks, pack_begin + packs_per_block);
  const int step = blockDim.x;
  const i64 nclusters = gridDim.x / CLUSTER;
  RawPack* const cache = reinterpret_cast<RawPack*>(smem_raw);
  open_mail<CLUSTER>(mail1, mail2);
  unsigned k = 0;  // exchanges so far (mail phase)
  unsigned k1 = 0;  // kOnePassSmem: redo exchanges so far (mail1's phase)
  // The sum of second() over the slice about s1, reduced over the cluster through `mail`.
  const auto second_sum = [&](S1 s1, auto& mail, unsigned phase, i64 row) {
    A t2 = A{};
    for (i64 p = pack_begin + threadIdx.x; p < pack_end; p += step) {
      C v[PACK];
      load.template convert<PACK>(cache[p - pack_begin], v, row, p * PACK);
#pragma unroll
      for (int i = 0; i < PACK; ++i) t2 += op.second(v[i], s1);
      if constexpr (KEEP) {
        RawPack e;
#pragma unroll
        for (int i = 0; i < PACK; ++i) e.v[i] = v[i];
        cache[p - pack_begin] = e;
      }
    }
    return mail.template exchange<SumOp<A>, OP::kFold>(
        block_all_reduce<SumOp<A>>(t2, scratch2), phase);
  };
  // Each thread fills, reads and writes the same packs: its own cp.async wait makes them
  // visible to it, no block barrier is needed for the data.
  for (i64 row = blockIdx.x / CLUSTER; row < rows; row += nclusters, ++k) {
    constexpr int STAGE = stage_packs<LOAD, PACK>(CLUSTER == 1, CUNORM_SMEM_STAGE_PACKS);
    if constexpr (STAGE > 1) {  // through registers (ResidualLoad::fill), STAGE packs at a time
      for (i64 p0 = pack_begin + threadIdx.x; p0 < pack_end; p0 += STAGE * step) {
        fetch_packs<STAGE, PACK, STAGE>(
            load,
            [&](int u) {
              const i64 p = p0 + u * step;
              return PackAt<i64>{row, p * PACK, p < pack_end};
            },
            [&](int u, const RawPack& v) { cache[p0 + u * step - pack_begin] = v; });
      }
    } else {
      for (i64 p = pack_begin + threadIdx.x; p < pack_end; p += step)
        load.template fill<PACK>(cache + (p - pack_begin), row, p * PACK);
    }
    copy_async_commit();
    constexpr int kStoreBatch = StoreBatch<STORE, PACK, BATCH_BYTES>::value;
    static_assert(PREFETCH == Prefetch::kNone || STORE::kParams, "nothing to prefetch");
    // (kAhead's next batches are prefetched in the batched store loop only)
    static_assert(PREFETCH != Prefetch::kAhead || STORE::kBatchParams, "kAhead needs batches");
    if constexpr (PREFETCH != Prefetch::kNone) {
      // the whole slice, or the first kPrefetchBatches batches of stores
      const i64 end = PREFETCH == Prefetch::kSlice
                          ? pack_end
                          : min(pack_end,
                                pack_begin + threadIdx.x + kPrefetchBatches * kStoreBatch * step);
      for (i64 p = pack_begin + threadIdx.x; p < end; p += step)
        store.prefetch_params(p * PACK);
    }
    S1 s1 = S1();  // kOnePassSmem: 0 or the head mean (its loads under the row's)
    if constexpr (OP::kShiftHead) s1 = op.head_mean(load, row, cols);
    if (k == 0) Cluster<CLUSTER>::wait();  // the peers' mail is open (with the loads in flight)
    copy_async_wait<0>();
    if constexpr (OP::kFirst && !OP::kOnePassSmem) {
      S1 t = OP::R1::identity();
      for (i64 p = pack_begin + threadIdx.x; p < pack_end; p += step) {
        C v[PACK];
        load.template convert<PACK>(cache[p - pack_begin], v, row, p * PACK);
#pragma unroll
        for (int i = 0; i < PACK; ++i) t = op.first(t, v[i]);
      }
      s1 = op.middle(mail1.template exchange<typename OP::R1, OP::kFold>(
                         block_all_reduce<typename OP::R1>(t, scratch1), k),
                     cols);
    }
    A s2 = second_sum(s1, mail2, k, row);
    if constexpr (OP::kOnePassSmem) {
      // cluster-uniform: the exchange folds the slots in one fixed order, the same bits everywhere
      if (op.redo(s2, cols)) {
        s1 = op.recenter(s1, s2, cols);
        s2 = second_sum(s1, mail1, k1++, row);
      }
    }
    typename OP::Fin fin = op.finish(s1, s2, cols);
    if constexpr (OP::kShiftHead) fin.fold();
    if (threadIdx.x == 0 && rank == 0) op.write_stats(row, fin);
    // Pack p's finished values, in v.
    const auto finish_pack = [&](i64 p, C* v) {
      if constexpr (KEEP) {
        const RawPack e = cache[p - pack_begin];
#pragma unroll
        for (int i = 0; i < PACK; ++i) v[i] = fin.kept(e.v[i]);
      } else {
        load.template convert<PACK>(cache[p - pack_begin], v, row, p * PACK);
#pragma unroll
        for (int i = 0; i < PACK; ++i) v[i] = fin(v[i]);
      }
    };
    // Parameters stored pack by pack (16-bit: !kBatchParams) are tested once a row through
    // with_known_params, not at every pack: H200, 16-bit layer_norm with weight and bias,
    // 12288-262144 cols +0.4-1.6%, bit-identical (tools/gpu_profile.py smem-store-sources).
    // The batched stores keep the loop below: through the same split (or with that loop in a
    // lambda) nvcc compiled the float32 cluster kernels differently, 1-10% slower at
    // 32768-262144 cols (benchmarks/results/nvidia-h200-2026-11-23-smem-stores-profile.txt).
    if constexpr (STORE::kParams && !STORE::kBatchParams) {
      store.with_known_params([&](const auto& st) {
        for (i64 p = pack_begin + threadIdx.x; p < pack_end; p += step) {
          C v[PACK];
          finish_pack(p, v);
          st.template store<PACK>(v, row, p * PACK);  // loads its parameters itself
        }
      });
    } else {
      for (i64 p0 = pack_begin + threadIdx.x; p0 < pack_end; p0 += kStoreBatch * step) {
        typename STORE::template Params<PACK> prm[kStoreBatch];
        if constexpr (kStoreBatch > 1) load_params<kStoreBatch, PACK>(store, prm, p0, step, pack_end);
        if constexpr (PREFETCH == Prefetch::kAhead) {  // the batch kPrefetchBatches ahead's
#pragma unroll
          for (int u = 0; u < kStoreBatch; ++u) {
            const i64 p = p0 + (kPrefetchBatches * kStoreBatch + u) * step;
            if (p < pack_end) store.prefetch_params(p * PACK);
          }
        }
#pragma unroll
        for (int u = 0; u < kStoreBatch; ++u) {
          const i64 p = p0 + u * step;
          if (p >= pack_end) break;
          C v[PACK];
          finish_pack(p, v);
          if constexpr (kStoreBatch > 1) {
            store.template store<PACK>(v, row, p * PACK, prm[u]);
          } else {
            store.template store<PACK>(v, row, p * PACK);  // loads its parameters itself
          }
        }
      }
    }
    // The next row's exchanges rewrite the peers' slots: every block must be done reading.
    if (CLUSTER > 1 && row + nclusters < rows) Cluster<CLUSTER>::sync();
  }
}

// ---------------------------------------------------------------------------------------
// Uncached path: rows of any length, read twice: an online pass folding the row into an
// OP::Online state, then the write pass (through load.second(): the same input, or for a
// residual the x + r the first pass wrote), which finds the row in L2 as long as the rows in
// flight fit there. On sm_90 a cluster of CLUSTER blocks shares a row (each streams its slice;
// the partial states meet through distributed shared memory), so few rows are in flight and
// the second read hits L2.
// Resident 512-thread blocks softmax.cu's and norm.cu's uncached kernels are compiled for
// (1; other counts for measurement, tools/gpu_profile.py uncached-rows).
#ifndef CUNORM_UNCACHED_BLOCKS
#define CUNORM_UNCACHED_BLOCKS 1
#endif
template <int PACK, int CLUSTER, class OP, class LOAD, class STORE>
__device__ __forceinline__ void rows_uncached(const OP& op, const LOAD& load, const STORE& store,
                                              i64 rows, i64 cols) {
  typedef typename OP::C C;
  typedef typename OP::Online S;
  // kUnrollValues 4-byte values in flight per thread (half as many doubles: their addresses
  // and values would not fit the registers of a 512-thread block with scalar packs).
  constexpr int kUnroll = kUnrollValues * 4 / static_cast<int>(sizeof(C)) / PACK;
  __shared__ S scratch[33];
  __shared__ ClusterMail<S, CLUSTER> mail;  // the blocks' partial states
  const i64 npacks = cols / PACK;
  const i64 packs_per_block = (npacks + CLUSTER - 1) / CLUSTER;
  const unsigned rank = Cluster<CLUSTER>::rank();
  const i64 pack_begin = rank * packs_per_block;
  const i64 pack_end = min(npacks, pack_begin + packs_per_block);
  const int step = blockDim.x;
  const auto load2 = load.second();
  open_mail<CLUSTER>(mail);
  unsigned k = 0;  // exchanges so far (mail phase)
  const i64 nclusters = gridDim.x / CLUSTER;
  for (i64 row = blockIdx.x / CLUSTER; row < rows; row += nclusters, ++k) {
    S st;
    st.init();
    for (i64 p0 = pack_begin + threadIdx.x; p0 < pack_end; p0 += kUnroll * step) {
      C v[kUnroll][PACK];
      const int nvalid = load_packs<kUnroll, PACK, OP>(load, [&](int u) {
        const i64 p = p0 + u * step;
        return PackAt<i64>{row, p * PACK, p < pack_end};
      }, [&](int u) { return v[u]; });
      st.template add<kUnroll * PACK>(&v[0][0], nvalid);  // one merge per chunk
    }
    if (k == 0) Cluster<CLUSTER>::wait();  // the peers' mail is open
    st = mail.template exchange<CombineOp<S>, OP::kFold>(
        block_all_reduce_state(st, scratch), k);
    const typename OP::Fin fin = op.finish_online(st, cols);
    if (threadIdx.x == 0 && rank == 0) op.write_stats(row, fin);
    for (i64 p0 = pack_begin + threadIdx.x; p0 < pack_end; p0 += kUnroll * step) {
      C v[kUnroll][PACK];
      // The parameter loads go out with the chunk's input loads (StoreBatch's rule: for
      // functors with kBatchParams only).
      constexpr bool kBatch = STORE::kBatchParams;
      typename STORE::template Params<PACK> prm[kBatch ? kUnroll : 1];
      Pack<typename LOAD::raw_t, PACK> raw[kUnroll];  // fetched before any is converted (load_packs)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (p0 + u * step < pack_end) {
          raw[u] = load2.template fetch<PACK>(row, (p0 + u * step) * PACK);
          if constexpr (kBatch) prm[u] = store.template params<PACK>((p0 + u * step) * PACK);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (p0 + u * step < pack_end) {
          load2.template convert<PACK>(raw[u], v[u], row, (p0 + u * step) * PACK);
#pragma unroll
          for (int i = 0; i < PACK; ++i) v[u][i] = fin(v[u][i]);
          if constexpr (kBatch) {
            store.template store<PACK>(v[u], row, (p0 + u * step) * PACK, prm[u]);
          } else {
            store.template store<PACK>(v[u], row, (p0 + u * step) * PACK);
          }
        }
      }
    }
    // The next row's exchange rewrites the peers' slots: every block must be done reading.
    if (CLUSTER > 1 && row + nclusters < rows) Cluster<CLUSTER>::sync();
  }
}

}  // namespace cunorm
