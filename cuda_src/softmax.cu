// softmax / log_softmax kernels over a (rows, cols) view (the shared row paths of rows.cuh
// with the SoftmaxOp policy), and over an (outer, dim, inner) view for a non-last axis (the
// strided path below). Paths are chosen by cunorm/_dispatch.py.
namespace cunorm {

// Per-row finishing constants. softmax: y = exp(x - m) / s; log_softmax: y = (x - m) - log s
// (subtracting m first keeps x - m exact for x near m, so a constant row of 1e4 gives exactly
// -log(n) instead of inheriting the rounding of m + log s).
template <typename C, typename OUT, bool LOG> struct SoftmaxOut {
  typedef ExpFor<C, OUT> E;
  C m, s, k;  // k: 1/s (softmax) or log(s) (log_softmax)
  SoftmaxOut() = default;
  // s_ may be wider than C (a double sum for float32 output); log and 1/s are taken in C:
  // rounding s first costs half an ulp of s, 6e-8 absolute in log(s), while a double log
  // per row dominated the time of short float32 rows (log_softmax at 64 cols).
  template <typename A>
  __device__ __forceinline__ SoftmaxOut(C m_, A s_) : m(m_), s(static_cast<C>(s_)) {
    k = LOG ? Math<C>::log(s) : Math<C>::rcp(s);
  }
  // From online statistics: +inf in the row must give NaN (NumPy: exp(inf - inf) in the sum).
  template <typename MS> static __device__ __forceinline__ SoftmaxOut from(const MS& st) {
    return SoftmaxOut(st.m, st.m == Math<C>::inf() ? st.m - st.m : st.s);
  }
  // y from x.
  __device__ __forceinline__ C operator()(C x) const {
    if (LOG) return (x - m) - k;
    return DivFor<C, OUT>::div(E::exp(x - m), s, k);
  }
  // y from the value SoftmaxOp::second kept: exp(x - m) for softmax, x for log_softmax.
  __device__ __forceinline__ C kept(C v) const {
    return LOG ? (*this)(v) : DivFor<C, OUT>::div(v, s, k);
  }
};

// The softmax policy of the row paths (rows.cuh): the max, then the sum of exp(x - max) in
// AccFor (double for a float32 output: as accurate as PyTorch or better). softmax keeps each
// exponential, so every element is exponentiated once; a padding slot is -inf, whose
// exponential adds exactly 0.
template <typename C_, typename OUT, bool LOG> struct SoftmaxOp {
  typedef C_ C;
  typedef typename AccFor<C, OUT>::type A;
  typedef C S1;
  typedef MaxOp<C> R1;
  typedef MaxSum<C, ExpFor<C, OUT>> Online;
  typedef SoftmaxOut<C, OUT, LOG> Fin;
  static constexpr bool kFirst = true;
  static constexpr bool kOnePass = false;
  static constexpr bool kOnePassSmem = false;
  static constexpr bool kShiftHead = false;
  // float64 rows: the cluster's partials fold as a tree (common.cuh Fold); H200, one
  // process, against the chain: 20000 / 40000 / 131072 cols +0.5 / +2.9 / +1.5%, 262144
  // (uncached) +7% (benchmarks/results/nvidia-h200-2026-11-27-f64-stats-profile.txt).
  static constexpr Fold kFold = sizeof(C) == 8 ? Fold::kTree : Fold::kChain;
  static constexpr bool kZeroPad = false;
  static constexpr bool kPadSafe = true;
  // With float32/float64 input the cached raw packs can hold the exponentials: the write pass
  // then only divides (one exp per element instead of two).
  template <typename R> struct Keeps { static constexpr bool value = !LOG && IsSame<R, C>::value; };
  static __device__ __forceinline__ C pad() { return -Math<C>::inf(); }
  __device__ __forceinline__ C first(C m, C x) const { return MaxOp<C>::apply(m, x); }
  __device__ __forceinline__ C middle(C m, i64) const { return m; }
  // A padded or all -inf row has m = -inf: exp(-inf - -inf) = NaN, the NumPy answer.
  __device__ __forceinline__ A second(C& v, C m) const {
    const C e = ExpFor<C, OUT>::exp(v - m);
    if (!LOG) v = e;
    return e;
  }
  __device__ __forceinline__ Fin finish(C m, A s, i64) const { return Fin(m, s); }
  __device__ __forceinline__ Fin finish_online(const Online& st, i64) const { return Fin::from(st); }
  __device__ __forceinline__ void write_stats(i64, const Fin&) const {}
};

// ---------------------------------------------------------------------------------------
// Strided path for a non-last axis: x viewed as (outer, dim, inner) with strides
// (ld_outer, ld_dim, 1). A tile is TX * PACK consecutive inner positions of one outer index
// over the whole of dim; a block of TX * TY threads (a cluster of CLUSTER blocks on sm_90,
// each owning a slice of dim) reduces it: thread (tx, ty) walks dim indices ty, ty + TY, ...
// for its pack, the TY partial states meet in shared memory, and a cluster's blocks mail each
// other their tile rows of states (st.async into every peer's slots, counted by its
// mbarrier). CACHE keeps the block's (dim slice, TX * PACK) slab in dynamic shared memory (x
// read once); otherwise x is read twice.
// Dynamic shared memory, in MaxSum states of width = TX * PACK: W rows of partials, W =
// blockDim.x / max(TX, 32) (one per warp's worth of TY), the final row, and on a cluster the
// CLUSTER mail rows; then, cached, the slice's rows past the first HELD of each thread
// (ceil(dim / CLUSTER) - HELD * TY rows of width values of SRC), which stay in registers.
// cp.async groups of a cached slice (below); CUNORM_STRIDED_CHUNKS overrides it for measurement.
#ifndef CUNORM_STRIDED_CHUNKS
#define CUNORM_STRIDED_CHUNKS 2
#endif
template <typename SRC, typename DST, typename C, bool LOG, int PACK, bool CACHE, int CLUSTER,
          int HELD>
__device__ __forceinline__ void softmax_strided_impl(const SRC* x, DST* y, i64 outer, i64 dim,
                                                     i64 inner, i64 ldx_outer, i64 ldx_dim,
                                                     i64 ldy_outer, i64 ldy_dim, int tx_count) {
  CUNORM_DYNAMIC_SMEM(smem_raw);
  __shared__ MailBar mail;  // cluster: counts the bytes of the peers' rows
  const int ty_count = blockDim.x / tx_count;
  const int tx = threadIdx.x % tx_count;
  const int ty = threadIdx.x / tx_count;
  const int width = tx_count * PACK;
  const int ty_per_warp = tx_count < 32 ? 32 / tx_count : 1;  // TY rows one warp holds
  const int nparts = ty_count / ty_per_warp;
  typedef MaxSum<C, ExpFor<C, DST>> MS;
  MS* part = reinterpret_cast<MS*>(smem_raw);  // [nparts][width]
  MS* final_row = part + static_cast<i64>(nparts) * width;
  MS* mail_rows = final_row + width;  // [CLUSTER][width] on a cluster: row r from block r
  SRC* cache = reinterpret_cast<SRC*>(mail_rows + (CLUSTER > 1 ? CLUSTER * width : 0));
  const unsigned rank = Cluster<CLUSTER>::rank();
  const i64 dim_per_block = (dim + CLUSTER - 1) / CLUSTER;
  const i64 d_begin = rank * dim_per_block;
  const i64 d_end = min(dim, d_begin + dim_per_block);
  const i64 tiles_per_outer = (inner + width - 1) >> (__ffs(width) - 1);  // width: a power of 2
  const i64 ntiles = outer * tiles_per_outer;
  const double inv_tiles = rcp_f64(static_cast<double>(tiles_per_outer));
  if (CLUSTER > 1) open_mail<CLUSTER>(mail);  // its lifetime: ClusterMail
  unsigned k = 0;  // tiles so far (mail phase)
  const i64 tile_step = gridDim.x / CLUSTER;
  for (i64 tile = blockIdx.x / CLUSTER; tile < ntiles; tile += tile_step, ++k) {
    i64 o, t;
    divmod_i64(tile, tiles_per_outer, inv_tiles, &o, &t);
    const i64 i0 = t * width + static_cast<i64>(tx) * PACK;
    const bool active = i0 < inner;  // PACK divides inner, so a pack is all in or all out
    const SRC* xo = x + o * ldx_outer + i0;
    // slab[d * width] for d in this block's slice past its HELD rows a thread
    SRC* slab = cache + tx * PACK - (d_begin + static_cast<i64>(HELD) * ty_count) * width;
    Pack<SRC, PACK> held[HELD > 0 ? HELD : 1];
    // f(d, v) with the row index and values of each row held in registers
    const auto each_held = [&](auto&& f) {
#pragma unroll
      for (int r = 0; r < HELD; ++r) {
        const i64 d = d_begin + ty + static_cast<i64>(r) * ty_count;
        if (d < d_end) {
          C v[PACK];
          pack_to_compute<C>(held[r], v);
          f(d, v);
        }
      }
    };
    MS st[PACK];
#pragma unroll
    for (int j = 0; j < PACK; ++j) st[j].init();
    const unsigned active_lanes = CACHE ? __ballot_sync(0xffffffffu, active) : 0u;
    if (active && CACHE) {
      // Cached: the slice streams into shared memory by cp.async (every pack in flight at
      // once), then the max and the sum come from shared memory. Each thread reads back only
      // what it copied: its own wait suffices, no barrier. The copies go in CH groups and
      // the max pass takes each group's rows as it lands, so the first half's max overlaps
      // the second half's loads; each copy asks the L2 for the whole 128-byte line (a tile
      // is 32-64 bytes of it, the rest read by the neighbouring tiles' clusters). H200, one
      // process, GB/s: float16 (16, 4096, 1024) 2846 -> 2892, (16, 2048, 2048) 2890 -> 3001,
      // (8, 512, 8192) 2789 -> 2903, (4, 8192, 512) 1575 -> 1673; bfloat16 (16, 4096, 1024)
      // 2822 -> 2847; float32 (32, 21, 256, 256) 3502 -> 3554, (8, 4096, 1024) 2568 -> 2548.
      // A copy of the same walk, without the softmax, runs at 3321 GB/s on 64-byte tiles,
      // 3500 with the L2 hint, 3765 on 128-byte tiles (which fit no portable cluster's 32 KB
      // slices). 4 groups without the hint gained less (2858); an online pass, folding the
      // sum in as each group lands (one rescale a group), lost: 2865 with 2 groups, 2843
      // with 3, 2741 with 4 (and 10-20% with 2-4-row groups, before); benchmarks/results/
      // nvidia-h200-2026-11-23-strided-walk-profile.txt. The passes unroll by 2: by 4,
      // bfloat16 cluster kernels spilled under their 80 registers, at the same speed otherwise.
      constexpr int CH = CUNORM_STRIDED_CHUNKS;
      const i64 d0 = d_begin + ty;
      const int n_all = d0 < d_end ? static_cast<int>((d_end - d0 + ty_count - 1) / ty_count) : 0;
      // The thread's first HELD rows go to registers (softmax_strided_cluster says why).
#pragma unroll
      for (int r = 0; r < HELD; ++r) {
        if (r < n_all)
          held[r] = load_pack_l2<L2Hint::kLine, SRC, PACK>(
              xo + (d0 + static_cast<i64>(r) * ty_count) * ldx_dim);
      }
      const i64 ds = d0 + static_cast<i64>(HELD) * ty_count;  // first row in shared memory
      const int n = n_all > HELD ? n_all - HELD : 0;
#pragma unroll
      for (int g = 0; g < CH; ++g) {
        for (int i = g * n / CH; i < (g + 1) * n / CH; ++i) {
          const i64 d = ds + static_cast<i64>(i) * ty_count;
          copy_async<sizeof(Pack<SRC, PACK>), L2Hint::kLine>(slab + d * width, xo + d * ldx_dim);
        }
        copy_async_commit();
      }
      each_held([&](i64, const C* v) {
#pragma unroll
        for (int j = 0; j < PACK; ++j) st[j].m = MaxOp<C>::apply(st[j].m, v[j]);
      });
#pragma unroll
      for (int g = 0; g < CH; ++g) {
        copy_async_wait_dyn<CH>(CH - 1 - g);
#pragma unroll 2
        for (int i = g * n / CH; i < (g + 1) * n / CH; ++i) {
          C v[PACK];
          pack_to_compute<C>(load_pack<SRC, PACK>(slab + (ds + static_cast<i64>(i) * ty_count) * width), v);
#pragma unroll
          for (int j = 0; j < PACK; ++j) st[j].m = MaxOp<C>::apply(st[j].m, v[j]);
        }
      }
      // The lanes holding the same columns (TX apart, so all active or none) share their
      // maxima before the sum pass, and their sums then add without the combine's rescaling
      // (below), which took two exponentials a column and shuffle step: 48 a thread on
      // 64-byte float16 tiles against the sum pass's 128. The sum pass is the longest phase
      // of a cached block's life (per-block timeline: load 4.3 us, sum 4.6, exchange 1.5,
      // store 3.1; float16 (16, 4096, 1024)). H200, one process, GB/s: float16 (16, 4096,
      // 1024) 2955 -> 3080, (32, 4096, 1024) 3199 -> 3338, (4, 8192, 512) 1647 -> 1725,
      // bfloat16 (16, 4096, 1024) 2911 -> 3026, float32 (8, 4096, 1024) 2650 -> 2822, float64
      // (8, 2048, 1024) 1624 -> 1809 (benchmarks/results/nvidia-h200-2026-11-27-strided-
      // sum-profile.txt).
      for (int lanes = tx_count; lanes < 32; lanes *= 2) {
#pragma unroll
        for (int j = 0; j < PACK; ++j)
          st[j].m = MaxOp<C>::apply(st[j].m, __shfl_xor_sync(active_lanes, st[j].m, lanes));
      }
      // No term tests for -inf: each column's max is replaced by the base its terms are taken
      // about (MS::sum_base's rule: 0 where the max is -inf), and a max of -inf is put back
      // after the pass (one bit a column). Same process, against the
      // shuffled maxima alone: float16 (16, 4096, 1024) 3085 -> 3131 GB/s, bfloat16 3035 ->
      // 3131, float32 (32, 21, 256, 256) 3524 -> 3808, (8, 4096, 1024) 2838 -> 2993.
      unsigned no_max = 0;
#pragma unroll
      for (int j = 0; j < PACK; ++j) {
        if (st[j].m == -Math<C>::inf()) {  // (a branch: as a select it compiled to other PTX)
          no_max |= 1u << j;
          st[j].m = C(0);
        }
      }
      each_held([&](i64, const C* v) {
#pragma unroll
        for (int j = 0; j < PACK; ++j) st[j].s += ExpFor<C, DST>::exp(v[j] - st[j].m);
      });
#pragma unroll 2
      for (i64 d = ds; d < d_end; d += ty_count) {
        C v[PACK];
        pack_to_compute<C>(load_pack<SRC, PACK>(slab + d * width), v);
#pragma unroll
        for (int j = 0; j < PACK; ++j) st[j].s += ExpFor<C, DST>::exp(v[j] - st[j].m);
      }
#pragma unroll
      for (int j = 0; j < PACK; ++j) {
        if (no_max >> j & 1u) st[j].m = -Math<C>::inf();
      }
    } else if (active) {
      // Uncached: online statistics over chunks of U dim rows, so loads overlap and each
      // chunk rescales once.
      // (Scalar packs: 8 rows, not 16: each load keeps a 64-bit address live, and 16 of them
      // spilled under the 64-register cap of the 16-bit kernels.)
      constexpr int U = PACK == 1 ? 8 : kUnrollValues * 4 / (PACK * static_cast<int>(sizeof(C)));
      for (i64 d0 = d_begin + ty; d0 < d_end; d0 += U * ty_count) {
        C v[PACK][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const i64 d = d0 + u * ty_count;
          if (d < d_end) {
            C c[PACK];
            pack_to_compute<C>(load_pack<SRC, PACK>(xo + d * ldx_dim), c);
#pragma unroll
            for (int j = 0; j < PACK; ++j) v[j][u] = c[j];
          } else {
#pragma unroll
            for (int j = 0; j < PACK; ++j) v[j][u] = -Math<C>::inf();
          }
        }
#pragma unroll
        for (int j = 0; j < PACK; ++j) st[j].template add<U>(v[j]);
      }
    }
    // Combine the TY partial states of each inner position: first inside each warp (lanes
    // TX apart hold the same columns), by shuffles; then the warps' results, one column per
    // thread from shared memory; then, on a cluster, the blocks' rows, which each block mails
    // to every peer (a cluster barrier with peer loads instead cost a GPU-scope fence that
    // waited for the block's stores). A tree over TY rows of `part` with each thread walking
    // its PACK columns serialized on bank conflicts and remote-load latency.
    for (int lanes = tx_count; lanes < 32; lanes *= 2) {
#pragma unroll
      for (int j = 0; j < PACK; ++j) {
        if constexpr (CACHE) {
          st[j].s += shfl_xor(st[j].s, lanes, 32);  // one max a column (the sum pass's)
        } else {
          st[j] = MS::combine(st[j], st[j].shfl_xor(lanes, 32));
        }
      }
    }
    if (ty % ty_per_warp == 0) {
#pragma unroll
      for (int j = 0; j < PACK; ++j) part[ty / ty_per_warp * width + tx * PACK + j] = st[j];
    }
    __syncthreads();
    if (CLUSTER > 1) {
      if (k == 0) Cluster<CLUSTER>::wait();  // the peers' mail is open
      if (threadIdx.x == 0) mail_expect(&mail.bar, CLUSTER * width * static_cast<unsigned>(sizeof(MS)));
    }
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
      MS all = part[c];
      for (int r = 1; r < nparts; ++r) all = MS::combine(all, part[r * width + c]);
      if constexpr (CLUSTER == 1) {
        final_row[c] = all;
      } else {
#pragma unroll
        for (unsigned peer = 0; peer < CLUSTER; ++peer)
          mail_post<CLUSTER>(&mail_rows[rank * width + c], peer, all, &mail.bar);
      }
    }
    if (CLUSTER > 1) {
      mail_wait(&mail.bar, k & 1u);
      for (int c = threadIdx.x; c < width; c += blockDim.x) {
        MS all = mail_rows[c];  // in rank order: the same bits in every block
#pragma unroll
        for (int r = 1; r < CLUSTER; ++r) all = MS::combine(all, mail_rows[r * width + c]);
        final_row[c] = all;
      }
    }
    __syncthreads();
    SoftmaxOut<C, DST, LOG> fin[PACK] = {};
#pragma unroll
    for (int j = 0; j < PACK; ++j) fin[j] = SoftmaxOut<C, DST, LOG>::from(final_row[tx * PACK + j]);
    if (active) {
      // Row d of the tile. The pointer is built term by term: from `y + i0` (one 64-bit sum)
      // NVVM could not tell the pack's 4-byte pieces were contiguous and stored each alone
      // (four 32-bit stores a 16-byte pack).
      const DirectStore<C, DST> out(y + o * ldy_outer + t * width + tx * PACK, ldy_dim);
      if constexpr (CACHE) {
        each_held([&](i64 d, const C* held_v) {
          C v[PACK];
#pragma unroll
          for (int j = 0; j < PACK; ++j) v[j] = fin[j](held_v[j]);
          out.template store<PACK>(v, d, 0);
        });
      }
#pragma unroll 4
      for (i64 d = d_begin + ty + (CACHE ? static_cast<i64>(HELD) * ty_count : 0); d < d_end;
           d += ty_count) {
        const Pack<SRC, PACK> p = CACHE ? load_pack<SRC, PACK>(slab + d * width)
                                        : load_pack<SRC, PACK>(xo + d * ldx_dim);
        C v[PACK];
        pack_to_compute<C>(p, v);
#pragma unroll
        for (int j = 0; j < PACK; ++j) v[j] = fin[j](v[j]);
        out.template store<PACK>(v, d, 0);
      }
    }
    // A next tile rewrites `part`, the final row, the slab and the mail rows: every thread of
    // the block (and on a cluster every peer, whose next post lands in this block's mail
    // rows) must be done reading them. Without a next tile no barrier is needed: every post
    // to this block arrived before its mail wait ended.
    if (tile + tile_step < ntiles) Cluster<CLUSTER>::sync();
  }
}

// ---------------------------------------------------------------------------------------
// Entry points: plain pointers and strides in; policy and functors built here. C is the wider
// of the input's and the output's compute types.
// KEEP: x loads under the L2 evict_last policy (common.cuh load_pack_l2; not the warp path).
#define CUNORM_SOFTMAX_ROWS(BODY, KEEP)                                                        \
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C; \
  BODY(SoftmaxOp<C, DST, LOG>(), DirectLoad<SRC, C, KEEP>(x, ldx), DirectStore<C, DST>(y, ldy),  \
       rows, cols)

// Resident 128-thread blocks the warp kernels are compiled for: 4 (up to 128 registers),
// and 16 (32 registers) for float32 rows of 16 values a lane on the exact kernels (rows of
// exactly 512 columns, no padding or row loop), which ptxas fits in 32 without spilling (nvcc
// 13, sm_80 and sm_90; tests/test_nvcc.py; the looped kernels of 385-511 columns spilled 8-12
// bytes on sm_90 and keep 4; not measured at 40). At the 48 (softmax) and 56 (log_softmax)
// it chose on sm_90, 21 and 18 of the planner's 64-thread blocks fit an SM (42 and 36 warps,
// 84 and 72 KB of row in flight); at 32, 32 of them (64 warps, 128 KB). H200, 49152 rows,
// one process, three rounds against the shipped kernel, GB/s (ratio to torch.compile), three
// H200s: softmax float32 512 cols 3848 -> 3874 (0.987 -> 0.994), 3813 -> 3844 (0.987 ->
// 0.995), 3804 -> 3843 (0.984 -> 0.995); log_softmax 3847 -> 3872, 3795 -> 3848, 3813 ->
// 3846 (0.989 -> 0.998). Every warp kernel capped at 32 moved nothing at float32 64, 256 and
// 1024 columns or float16 512, and spilled float16 1024 (0.45x); a cap of 40 (12 blocks)
// gained as much at 512 in the one run that tried it.
// Inductor's kernel there (one warp of two rows a program, 64 registers) has a shorter fixed
// part: t = fixed + bytes / steady over 49152 and 196608 rows, cunorm 5.6-6.1 us against
// 4.5-4.9 at the same steady rate (4270-4300 GB/s); splitting the row's max and sum chains
// in two or four and Inductor's shape at 64 registers (0.977-0.995) did not close it
// (benchmarks/results/nvidia-h200-2026-11-28-session70-f32-512-profile.txt).
// CUNORM_SOFTMAX_WARP_BLOCKS overrides the count for measurement.
__host__ __device__ constexpr int softmax_warp_blocks(int src_bytes, int dst_bytes, int pack,
                                                      int cols, int group, int rows,
                                                      bool exact) {
#ifdef CUNORM_SOFTMAX_WARP_BLOCKS
  return CUNORM_SOFTMAX_WARP_BLOCKS;
#else
  return src_bytes == 4 && dst_bytes == 4 && pack * src_bytes == 16 && cols == 16 &&
                 group == 32 && rows == 1 && exact
             ? 16
             : 4;
#endif
}
template <typename SRC, typename DST, bool LOG, int PACK, int COLS, int GROUP, int ROWS,
          bool EXACT>
__global__ void __launch_bounds__(128, softmax_warp_blocks(sizeof(SRC), sizeof(DST), PACK, COLS,
                                                           GROUP, ROWS, EXACT))
    softmax_warp(const SRC* x, DST* y, i64 rows, i64 cols, i64 ldx, i64 ldy) {
  CUNORM_SOFTMAX_ROWS((rows_warp<PACK, COLS, GROUP, ROWS, EXACT>), false);
}

// Rows in full packs of at most 16 values a thread (rows.cuh CUNORM_BLOCK_BOUNDS): 32
// registers for 16-bit rows, 40 with a float output (which sums in double), one block for
// double. At most 8 values a thread: 32 registers for every pair but double; H200, 49152 rows,
// one process (tools/gpu_profile.py short-block-sources), float32 softmax 1000 cols 3878 ->
// 4051 GB/s, 1024 3955 -> 4071, log_softmax 3895 -> 4047, 3973 -> 4070.
// The one block kernel that loads x plainly (KEEP false): float32 softmax rows of 17-32
// values a thread (64 registers, 2 resident blocks), where the L2 policy's register pair
// spilled 16 bytes (nvcc 13, sm_90; its log_softmax twin does not).
__host__ __device__ constexpr bool softmax_block_keeps_l2(int src_bytes, int dst_bytes, bool log,
                                                          int pack_bytes, int cols) {
  return !(src_bytes == 4 && dst_bytes == 4 && !log && block_row_mid(pack_bytes, cols));
}
template <typename SRC, typename DST, bool LOG, int PACK, int COLS>
__global__ void CUNORM_BLOCK_BOUNDS(
    PACK * (sizeof(SRC) > sizeof(DST) ? sizeof(SRC) : sizeof(DST)), COLS,
    sizeof(SRC) == 2 && sizeof(DST) == 2 ? 4 : sizeof(SRC) < 8 && sizeof(DST) < 8 ? 3 : 1,
    sizeof(SRC) < 8 && sizeof(DST) < 8 ? 4 : 1)
    softmax_block(const SRC* x, DST* y, i64 rows, i64 cols, i64 ldx, i64 ldy) {
  CUNORM_SOFTMAX_ROWS(
      (rows_block<PACK, COLS,
                  BlockRow<PACK * (sizeof(SRC) > sizeof(DST) ? sizeof(SRC) : sizeof(DST)), COLS>>),
      (softmax_block_keeps_l2(sizeof(SRC), sizeof(DST), LOG, PACK * sizeof(SRC), COLS)));
}

template <typename SRC, typename DST, bool LOG, int PACK>
__global__ void __launch_bounds__(512, 1) softmax_smem(const SRC* x, DST* y, i64 rows, i64 cols,
                                                     i64 ldx, i64 ldy) {
  CUNORM_SOFTMAX_ROWS((rows_smem<PACK, 1>), true);
}

template <typename SRC, typename DST, bool LOG, int PACK>
__global__ void __launch_bounds__(512, CUNORM_UNCACHED_BLOCKS)
    softmax_uncached(const SRC* x, DST* y, i64 rows, i64 cols, i64 ldx, i64 ldy) {
  CUNORM_SOFTMAX_ROWS((rows_uncached<PACK, 1>), true);
}

#ifdef CUNORM_SM90
template <typename SRC, typename DST, bool LOG, int PACK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(512, 1)
    softmax_smem_cluster(const SRC* x, DST* y, i64 rows, i64 cols, i64 ldx, i64 ldy) {
  CUNORM_SOFTMAX_ROWS((rows_smem<PACK, CLUSTER>), true);
}

template <typename SRC, typename DST, bool LOG, int PACK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(512, 1)
    softmax_uncached_cluster(const SRC* x, DST* y, i64 rows, i64 cols, i64 ldx, i64 ldy) {
  CUNORM_SOFTMAX_ROWS((rows_uncached<PACK, CLUSTER>), true);
}
#endif

template <typename SRC, typename DST, bool LOG, int PACK, bool CACHE>
__global__ void __launch_bounds__(256, 4) softmax_strided(const SRC* x, DST* y, i64 outer, i64 dim,
                                                        i64 inner, i64 ldx_outer, i64 ldx_dim,
                                                        i64 ldy_outer, i64 ldy_dim, int tx_count) {
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_strided_impl<SRC, DST, C, LOG, PACK, CACHE, 1, 0>(x, y, outer, dim, inner, ldx_outer,
                                                           ldx_dim, ldy_outer, ldy_dim, tx_count);
}

#ifdef CUNORM_SM90
// Cached, each thread holds its first HELD rows of the slice in registers and the block is
// built for 7 resident 128-thread blocks (72 registers): with HELD = 2 the 64-byte tiles' 32 KB
// slices shrink to 28 KB, 7 blocks fit an SM's shared memory instead of 6, and the SM keeps
// more of x in flight. H200, one process, GB/s, held 0 on (256, 3) bounds -> held 2 on
// (128, 7): float16 (16, 4096, 1024) 2904 -> 2954, bfloat16 2868 -> 2907, float16 (32,
// 4096, 1024) 3110 -> 3192, (16, 2048, 2048) 3004 -> 3052, (64, 1024, 1024) 3185 -> 3242,
// float32 (8, 4096, 1024) 2551 -> 2676, float16 (4, 8192, 512) 1663 -> 1650; 4 rows held
// (8 blocks by shared memory, 7 by registers) lost 2-4%, and 3 on 64 registers spilled
// (benchmarks/results/nvidia-h200-2026-11-26-strided-held-profile.txt). The held rows load
// with the L2 asked for the whole line, as the cp.async copies do (+0.3-1.3%). Uncached
// kernels keep their (256, 3) bounds.
template <typename SRC, typename DST, bool LOG, int PACK, bool CACHE, int CLUSTER, int HELD>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(CACHE ? 128 : 256, CACHE ? 7 : 3)
    softmax_strided_cluster(const SRC* x, DST* y, i64 outer, i64 dim, i64 inner, i64 ldx_outer,
                            i64 ldx_dim, i64 ldy_outer, i64 ldy_dim, int tx_count) {
  static_assert(CACHE || HELD == 0, "only a cached slice holds rows in registers");
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_strided_impl<SRC, DST, C, LOG, PACK, CACHE, CLUSTER, HELD>(
      x, y, outer, dim, inner, ldx_outer, ldx_dim, ldy_outer, ldy_dim, tx_count);
}
#endif

}  // namespace cunorm
