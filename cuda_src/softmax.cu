// softmax / log_softmax kernels over a (rows, cols) view, and over an (outer, dim, inner)
// view for a non-last axis. Paths (chosen by cunorm/_dispatch.py):
//   warp      a group of GROUP lanes holds ROWS rows in registers (cols <= warp limit)
//   smem      one block (or a cluster of CLUSTER blocks, sm_90) caches a row in shared memory
//   uncached  one block per row, two reads: online (max, sum) pass, then the write pass
//   strided   (outer, dim, inner): a block owns an inner tile, reduces down `dim`
// All take LOAD/STORE functors so fused variants reuse the same bodies.
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
  // y from e = exp(x - m) already computed.
  __device__ __forceinline__ C from_exp(C e) const { return DivFor<C, OUT>::div(e, s, k); }
};

// Values a thread loads before using the first one, in the block-per-row paths: enough bytes
// in flight per thread to cover memory latency, few enough registers for 512-thread blocks.
constexpr int kUnrollValues = 16;

// ---------------------------------------------------------------------------------------
// Warp path. Launch: 1-D block of blockDim.x threads (a multiple of 32), GROUP lanes per
// row group, ROWS rows per group per step; grid-stride over row groups. COLS values per
// thread; packs past `cols` are padding (one compare per pack, cheaper than a second
// instantiation of every configuration). The row stays in registers, so the classic two
// reductions (max, then sum) cost shuffles only and each element is exponentiated once.
template <typename LOAD, typename STORE, typename C, typename OUT, bool LOG, int PACK, int COLS,
          int GROUP, int ROWS>
__device__ __forceinline__ void softmax_warp_impl(const LOAD& load, const STORE& store, i64 rows,
                                                  i64 cols) {
  static_assert(COLS % PACK == 0, "COLS is a multiple of PACK");
  typedef ExpFor<C, OUT> E;
  typedef typename AccFor<C, OUT>::type A;
  constexpr int NPACK = COLS / PACK;
  constexpr int ROWS_PER_WARP = 32 / GROUP * ROWS;
  const int lane = threadIdx.x % GROUP;
  const int group_in_warp = (threadIdx.x % 32) / GROUP;
  const i64 warp = (static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const i64 step = static_cast<i64>(gridDim.x) * blockDim.x / 32 * ROWS_PER_WARP;
  C buf[ROWS][COLS];
  // The loop bound is uniform across the warp (the shuffles below name all 32 lanes); rows
  // past the end are masked instead.
  for (i64 base = warp * ROWS_PER_WARP; base < rows; base += step) {
    const i64 row0 = base + group_in_warp * ROWS;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
      for (int p = 0; p < NPACK; ++p) {
        const i64 col = (static_cast<i64>(p) * GROUP + lane) * PACK;
        if (row0 + r < rows && col < cols) {
          load.template load<PACK>(buf[r] + p * PACK, row0 + r, col);
        } else {
#pragma unroll
          for (int i = 0; i < PACK; ++i) buf[r][p * PACK + i] = -Math<C>::inf();
        }
      }
    }
    C m[ROWS];
    A s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      m[r] = buf[r][0];
#pragma unroll
      for (int i = 1; i < COLS; ++i) m[r] = MaxOp<C>::apply(m[r], buf[r][i]);
      m[r] = group_all_reduce<MaxOp, C, GROUP>(m[r]);
    }
    // A padded or all -inf row has m = -inf: exp(-inf - -inf) = NaN, the NumPy answer.
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      s[r] = A(0);
#pragma unroll
      for (int i = 0; i < COLS; ++i) {
        const C e = E::exp(buf[r][i] - m[r]);
        if (!LOG) buf[r][i] = e;
        s[r] += e;
      }
      s[r] = group_all_reduce<SumOp, A, GROUP>(s[r]);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const i64 row = row0 + r;
      if (row >= rows) break;
      const SoftmaxOut<C, OUT, LOG> fin(m[r], s[r]);
#pragma unroll
      for (int i = 0; i < COLS; ++i) buf[r][i] = LOG ? fin(buf[r][i]) : fin.from_exp(buf[r][i]);
#pragma unroll
      for (int p = 0; p < NPACK; ++p) {
        const i64 col = (static_cast<i64>(p) * GROUP + lane) * PACK;
        if (col < cols) store.template store<PACK>(buf[r] + p * PACK, row, col);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Block-register path: the row lives in the registers of a whole block (COLS values per
// thread, packs strided by blockDim.x), as the warp path keeps it in one warp's; the two
// reductions go through shared memory. For rows too long for a warp and short enough that
// each of up to 1024 threads holds a few dozen values: one read, one exp per element.
template <typename LOAD, typename STORE, typename C, typename OUT, bool LOG, int PACK, int COLS>
__device__ __forceinline__ void softmax_block_impl(const LOAD& load, const STORE& store, i64 rows,
                                                   i64 cols) {
  static_assert(COLS % PACK == 0, "COLS is a multiple of PACK");
  typedef ExpFor<C, OUT> E;
  typedef typename AccFor<C, OUT>::type A;
  constexpr int NPACK = COLS / PACK;
  __shared__ C scratch[33];
  __shared__ A scratch_sum[33];
  C buf[COLS];
  for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
#pragma unroll
    for (int p = 0; p < NPACK; ++p) {
      const i64 col = (static_cast<i64>(p) * blockDim.x + threadIdx.x) * PACK;
      if (col < cols) {
        load.template load<PACK>(buf + p * PACK, row, col);
      } else {
#pragma unroll
        for (int i = 0; i < PACK; ++i) buf[p * PACK + i] = -Math<C>::inf();
      }
    }
    C m = buf[0];
#pragma unroll
    for (int i = 1; i < COLS; ++i) m = MaxOp<C>::apply(m, buf[i]);
    m = block_all_reduce<MaxOp, C>(m, scratch);
    A s = A(0);
#pragma unroll
    for (int i = 0; i < COLS; ++i) {
      const C e = E::exp(buf[i] - m);
      if (!LOG) buf[i] = e;
      s += e;
    }
    s = block_all_reduce<SumOp, A>(s, scratch_sum);
    const SoftmaxOut<C, OUT, LOG> fin(m, s);
#pragma unroll
    for (int i = 0; i < COLS; ++i) buf[i] = LOG ? fin(buf[i]) : fin.from_exp(buf[i]);
#pragma unroll
    for (int p = 0; p < NPACK; ++p) {
      const i64 col = (static_cast<i64>(p) * blockDim.x + threadIdx.x) * PACK;
      if (col < cols) store.template store<PACK>(buf + p * PACK, row, col);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Shared-memory path: a cluster of CLUSTER blocks per row (CLUSTER == 1: one block), each
// caching its slice of the row in shared memory as raw input packs, moved there by cp.async
// (no registers, every pack of the slice in flight at once). Statistics in two passes (max,
// then the sum of exp(x - max)) as PyTorch does, so the float32 result is as accurate.
// Dynamic shared memory: ceil(cols / PACK / CLUSTER) * PACK * sizeof(raw_t). Launched with one
// block (cluster) per row: measured faster on H200 than a persistent grid double-buffering the
// next row (benchmarks/results/thresholds-*.md).
template <typename LOAD, typename STORE, typename C, typename OUT, bool LOG, int PACK, int CLUSTER>
__device__ __forceinline__ void softmax_smem_impl(const LOAD& load, const STORE& store, i64 rows,
                                                  i64 cols) {
  typedef typename LOAD::raw_t R;
  typedef Pack<R, PACK> RawPack;
  typedef ExpFor<C, OUT> E;
  typedef typename AccFor<C, OUT>::type A;
  // With float32/float64 input the exponentials overwrite the cached inputs in place and the
  // write pass only divides: one exp per element instead of two.
  constexpr bool KEEP_EXP = !LOG && IsSame<R, C>::value;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ C scratch[33];
  __shared__ A scratch_sum[33];
  __shared__ C max_slot;  // this block's partial max / sum, read by the cluster's peers
  __shared__ A sum_slot;
  const i64 npacks = cols / PACK;
  const i64 packs_per_block = (npacks + CLUSTER - 1) / CLUSTER;
  const unsigned rank = Cluster<CLUSTER>::rank();
  const i64 pack_begin = rank * packs_per_block;
  const i64 pack_end = min(npacks, pack_begin + packs_per_block);
  const int step = blockDim.x;
  const i64 nclusters = gridDim.x / CLUSTER;
  RawPack* const cache = reinterpret_cast<RawPack*>(smem_raw);
  // Each thread copies, reads and writes the same packs: its own cp.async wait makes them
  // visible to it, no block barrier is needed for the data.
  for (i64 row = blockIdx.x / CLUSTER; row < rows; row += nclusters) {
    for (i64 p = pack_begin + threadIdx.x; p < pack_end; p += step)
      copy_async<sizeof(RawPack)>(cache + (p - pack_begin), load.address(row, p * PACK));
    copy_async_commit();
    copy_async_wait<0>();
    C tmax = -Math<C>::inf();
    for (i64 p = pack_begin + threadIdx.x; p < pack_end; p += step) {
      C v[PACK];
      load.template convert<PACK>(cache[p - pack_begin], v, row, p * PACK);
#pragma unroll
      for (int i = 0; i < PACK; ++i) tmax = MaxOp<C>::apply(tmax, v[i]);
    }
    const C m = cluster_all_reduce<MaxOp, CLUSTER>(block_all_reduce<MaxOp, C>(tmax, scratch),
                                                   &max_slot);
    A tsum = A(0);
    for (i64 p = pack_begin + threadIdx.x; p < pack_end; p += step) {
      C v[PACK];
      load.template convert<PACK>(cache[p - pack_begin], v, row, p * PACK);
#pragma unroll
      for (int i = 0; i < PACK; ++i) {
        v[i] = E::exp(v[i] - m);
        tsum += v[i];
      }
      if constexpr (KEEP_EXP) {
        RawPack e;
#pragma unroll
        for (int i = 0; i < PACK; ++i) e.v[i] = v[i];
        cache[p - pack_begin] = e;
      }
    }
    const A s = cluster_all_reduce<SumOp, CLUSTER>(block_all_reduce<SumOp, A>(tsum, scratch_sum),
                                                   &sum_slot);
    const SoftmaxOut<C, OUT, LOG> fin(m, s);
    for (i64 p = pack_begin + threadIdx.x; p < pack_end; p += step) {
      C v[PACK];
      if constexpr (KEEP_EXP) {
        const RawPack e = cache[p - pack_begin];
#pragma unroll
        for (int i = 0; i < PACK; ++i) v[i] = fin.from_exp(e.v[i]);
      } else {
        load.template convert<PACK>(cache[p - pack_begin], v, row, p * PACK);
#pragma unroll
        for (int i = 0; i < PACK; ++i) v[i] = fin(v[i]);
      }
      store.template store<PACK>(v, row, p * PACK);
    }
  }
  // No block may leave while a peer can still read its `slots`.
  if (CLUSTER > 1) Cluster<CLUSTER>::sync();
}

// ---------------------------------------------------------------------------------------
// Uncached path: rows of any length, read twice: an online (max, sum) pass, then the write
// pass, which finds the row in L2 as long as the rows in flight fit there. On sm_90 a cluster
// of CLUSTER blocks shares a row (each streams its slice; the partial statistics meet through
// distributed shared memory), so few rows are in flight and the second read hits L2.
template <typename LOAD, typename STORE, typename C, typename OUT, bool LOG, int PACK, int CLUSTER>
__device__ __forceinline__ void softmax_uncached_impl(const LOAD& load, const STORE& store,
                                                      i64 rows, i64 cols) {
  typedef MaxSum<C, ExpFor<C, OUT>> MS;
  constexpr int kUnroll = kUnrollValues / PACK;
  __shared__ MS scratch[33];
  __shared__ C slot_m[2];  // this block's partial statistics, by row parity, for the peers
  __shared__ C slot_s[2];
  const i64 npacks = cols / PACK;
  const i64 packs_per_block = (npacks + CLUSTER - 1) / CLUSTER;
  const i64 pack_begin = Cluster<CLUSTER>::rank() * packs_per_block;
  const i64 pack_end = min(npacks, pack_begin + packs_per_block);
  const int step = blockDim.x;
  int parity = 0;
  for (i64 row = blockIdx.x / CLUSTER; row < rows; row += gridDim.x / CLUSTER, parity ^= 1) {
    MS st;
    st.init();
    for (i64 p0 = pack_begin + threadIdx.x; p0 < pack_end; p0 += kUnroll * step) {
      C v[kUnroll][PACK];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (p0 + u * step < pack_end) {
          load.template load<PACK>(v[u], row, (p0 + u * step) * PACK);
        } else {
#pragma unroll
          for (int i = 0; i < PACK; ++i) v[u][i] = -Math<C>::inf();  // adds exactly 0
        }
      }
      st.template add<kUnroll * PACK>(&v[0][0]);  // one rescale per chunk
    }
    st = block_all_reduce_maxsum(st, scratch);
    if (CLUSTER > 1) {
      // Slots alternate by row: a block rewrites one only after the next row's barrier, which
      // every peer reaches after reading it.
      if (threadIdx.x == 0) {
        slot_m[parity] = st.m;
        slot_s[parity] = st.s;
      }
      Cluster<CLUSTER>::sync();
      st.init();
#pragma unroll
      for (unsigned peer = 0; peer < CLUSTER; ++peer) {
        MS o;
        o.m = Cluster<CLUSTER>::read_peer(&slot_m[parity], peer);
        o.s = Cluster<CLUSTER>::read_peer(&slot_s[parity], peer);
        st = MS::combine(st, o);
      }
    }
    const SoftmaxOut<C, OUT, LOG> fin = SoftmaxOut<C, OUT, LOG>::from(st);
    for (i64 p0 = pack_begin + threadIdx.x; p0 < pack_end; p0 += kUnroll * step) {
      C v[kUnroll][PACK];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (p0 + u * step < pack_end) load.template load<PACK>(v[u], row, (p0 + u * step) * PACK);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (p0 + u * step < pack_end) {
#pragma unroll
          for (int i = 0; i < PACK; ++i) v[u][i] = fin(v[u][i]);
          store.template store<PACK>(v[u], row, (p0 + u * step) * PACK);
        }
      }
    }
  }
  if (CLUSTER > 1) Cluster<CLUSTER>::sync();  // peers may still read this block's slots
}

// ---------------------------------------------------------------------------------------
// Strided path for a non-last axis: x viewed as (outer, dim, inner) with strides
// (ld_outer, ld_dim, 1). A tile is TX * PACK consecutive inner positions of one outer index
// over the whole of dim; a block of TX * TY threads (a cluster of CLUSTER blocks on sm_90,
// each owning a slice of dim) reduces it: thread (tx, ty) walks dim indices ty, ty + TY, ...
// for its pack, the TY partial states meet in shared memory, a cluster's blocks exchange theirs
// through distributed shared memory. CACHE keeps the block's (dim slice, TX * PACK) slab in
// dynamic shared memory (x read once); otherwise x is read twice.
// Dynamic shared memory: (TY + 1) * TX * PACK * sizeof(MaxSum) [+ ceil(dim / CLUSTER) * TX *
// PACK * sizeof(SRC)].
template <typename SRC, typename DST, typename C, bool LOG, int PACK, bool CACHE, int CLUSTER>
__device__ __forceinline__ void softmax_strided_impl(const SRC* x, DST* y, i64 outer, i64 dim,
                                                     i64 inner, i64 ldx_outer, i64 ldx_dim,
                                                     i64 ldy_outer, i64 ldy_dim, int tx_count) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ty_count = blockDim.x / tx_count;
  const int tx = threadIdx.x % tx_count;
  const int ty = threadIdx.x / tx_count;
  const int width = tx_count * PACK;
  typedef MaxSum<C, ExpFor<C, DST>> MS;
  MS* part = reinterpret_cast<MS*>(smem_raw);  // [TY][width], then the final row [width]
  MS* final_row = part + static_cast<i64>(ty_count) * width;
  SRC* cache = reinterpret_cast<SRC*>(final_row + width);
  const i64 dim_per_block = (dim + CLUSTER - 1) / CLUSTER;
  const i64 d_begin = Cluster<CLUSTER>::rank() * dim_per_block;
  const i64 d_end = min(dim, d_begin + dim_per_block);
  const i64 tiles_per_outer = (inner + width - 1) >> (__ffs(width) - 1);  // width: a power of 2
  const i64 ntiles = outer * tiles_per_outer;
  const double inv_tiles = rcp_f64(static_cast<double>(tiles_per_outer));
  for (i64 tile = blockIdx.x / CLUSTER; tile < ntiles; tile += gridDim.x / CLUSTER) {
    i64 o, t;
    divmod_i64(tile, tiles_per_outer, inv_tiles, &o, &t);
    const i64 i0 = t * width + static_cast<i64>(tx) * PACK;
    const bool active = i0 < inner;  // PACK divides inner, so a pack is all in or all out
    const SRC* xo = x + o * ldx_outer + i0;
    SRC* slab = cache + tx * PACK - d_begin * width;  // slab[d * width] for d in this block's slice
    MS st[PACK];
#pragma unroll
    for (int j = 0; j < PACK; ++j) st[j].init();
    if (active && CACHE) {
      // Cached: the slice streams into shared memory by cp.async (every pack in flight at
      // once), then the max and the sum come from shared memory. Each thread reads back only
      // what it copied: its own wait suffices, no barrier.
      for (i64 d = d_begin + ty; d < d_end; d += ty_count)
        copy_async<sizeof(Pack<SRC, PACK>)>(slab + d * width, xo + d * ldx_dim);
      copy_async_commit();
      copy_async_wait<0>();
#pragma unroll 4
      for (i64 d = d_begin + ty; d < d_end; d += ty_count) {
        const Pack<SRC, PACK> p = load_pack<SRC, PACK>(slab + d * width);
#pragma unroll
        for (int j = 0; j < PACK; ++j) st[j].m = MaxOp<C>::apply(st[j].m, to_compute<C>(p.v[j]));
      }
#pragma unroll 4
      for (i64 d = d_begin + ty; d < d_end; d += ty_count) {
        const Pack<SRC, PACK> p = load_pack<SRC, PACK>(slab + d * width);
#pragma unroll
        for (int j = 0; j < PACK; ++j) st[j].s += MS::term(to_compute<C>(p.v[j]), st[j].m);
      }
    } else if (active) {
      // Uncached: online statistics over chunks of U dim rows, so loads overlap and each
      // chunk rescales once.
      constexpr int U = kUnrollValues * 4 / (PACK * static_cast<int>(sizeof(C)));
      for (i64 d0 = d_begin + ty; d0 < d_end; d0 += U * ty_count) {
        C v[PACK][U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const i64 d = d0 + u * ty_count;
          if (d < d_end) {
            const Pack<SRC, PACK> p = load_pack<SRC, PACK>(xo + d * ldx_dim);
#pragma unroll
            for (int j = 0; j < PACK; ++j) v[j][u] = to_compute<C>(p.v[j]);
          } else {
#pragma unroll
            for (int j = 0; j < PACK; ++j) v[j][u] = -Math<C>::inf();
          }
        }
#pragma unroll
        for (int j = 0; j < PACK; ++j) st[j].template add<U>(v[j]);
      }
    }
    // Tree-combine the TY partial states of each inner position.
#pragma unroll
    for (int j = 0; j < PACK; ++j) part[ty * width + tx * PACK + j] = st[j];
    __syncthreads();
    for (int stride = ty_count / 2; stride > 0; stride /= 2) {
      if (ty < stride) {
#pragma unroll
        for (int j = 0; j < PACK; ++j) {
          const int a = ty * width + tx * PACK + j;
          part[a] = MS::combine(part[a], part[a + stride * width]);
        }
      }
      __syncthreads();
    }
    if (CLUSTER > 1) {
      // Combine the cluster's blocks: row 0 of every block's `part` holds its slice's states.
      Cluster<CLUSTER>::sync();
      if (ty == 0) {
#pragma unroll
        for (int j = 0; j < PACK; ++j) {
          const int col = tx * PACK + j;
          MS all;
          all.init();
#pragma unroll
          for (unsigned peer = 0; peer < CLUSTER; ++peer) {
            MS o;
            o.m = Cluster<CLUSTER>::read_peer(&part[col].m, peer);
            o.s = Cluster<CLUSTER>::read_peer(&part[col].s, peer);
            all = MS::combine(all, o);
          }
          final_row[col] = all;
        }
      }
      __syncthreads();
    }
    const MS* fin_states = CLUSTER > 1 ? final_row : part;
    SoftmaxOut<C, DST, LOG> fin[PACK] = {};
#pragma unroll
    for (int j = 0; j < PACK; ++j) fin[j] = SoftmaxOut<C, DST, LOG>::from(fin_states[tx * PACK + j]);
    if (active) {
      DST* yo = y + o * ldy_outer + i0;
#pragma unroll 4
      for (i64 d = d_begin + ty; d < d_end; d += ty_count) {
        const Pack<SRC, PACK> p = CACHE ? load_pack<SRC, PACK>(slab + d * width)
                                        : load_pack<SRC, PACK>(xo + d * ldx_dim);
        Pack<DST, PACK> q;
#pragma unroll
        for (int j = 0; j < PACK; ++j) q.v[j] = from_compute<DST>(fin[j](to_compute<C>(p.v[j])));
        store_pack<DST, PACK>(yo + d * ldy_dim, q);
      }
    }
    // `part` and the slab are reused by the next tile; a cluster's peers may still be reading
    // this block's `part`.
    Cluster<CLUSTER>::sync();
  }
}

// ---------------------------------------------------------------------------------------
// Entry points: plain pointers and strides in, functors built here.
template <typename SRC, typename DST, bool LOG, int PACK, int COLS, int GROUP, int ROWS>
__global__ void __launch_bounds__(128, 4) softmax_warp(const SRC* x, DST* y, i64 rows, i64 cols,
                                                    i64 ldx, i64 ldy) {
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_warp_impl<DirectLoad<SRC, C>, DirectStore<C, DST>, C, DST, LOG, PACK, COLS, GROUP, ROWS>(
      DirectLoad<SRC, C>(x, ldx), DirectStore<C, DST>(y, ldy), rows, cols);
}

template <typename SRC, typename DST, bool LOG, int PACK, int COLS>
__global__ void __launch_bounds__(512) softmax_block(const SRC* x, DST* y, i64 rows, i64 cols,
                                                     i64 ldx, i64 ldy) {
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_block_impl<DirectLoad<SRC, C>, DirectStore<C, DST>, C, DST, LOG, PACK, COLS>(
      DirectLoad<SRC, C>(x, ldx), DirectStore<C, DST>(y, ldy), rows, cols);
}

template <typename SRC, typename DST, bool LOG, int PACK>
__global__ void __launch_bounds__(512, 1) softmax_smem(const SRC* x, DST* y, i64 rows, i64 cols,
                                                     i64 ldx, i64 ldy) {
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_smem_impl<DirectLoad<SRC, C>, DirectStore<C, DST>, C, DST, LOG, PACK, 1>(
      DirectLoad<SRC, C>(x, ldx), DirectStore<C, DST>(y, ldy), rows, cols);
}

#ifdef CUNORM_SM90
template <typename SRC, typename DST, bool LOG, int PACK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(512, 1)
    softmax_smem_cluster(const SRC* x, DST* y, i64 rows, i64 cols, i64 ldx, i64 ldy) {
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_smem_impl<DirectLoad<SRC, C>, DirectStore<C, DST>, C, DST, LOG, PACK, CLUSTER>(
      DirectLoad<SRC, C>(x, ldx), DirectStore<C, DST>(y, ldy), rows, cols);
}
#endif

template <typename SRC, typename DST, bool LOG, int PACK>
__global__ void __launch_bounds__(512, 1) softmax_uncached(const SRC* x, DST* y, i64 rows, i64 cols,
                                                         i64 ldx, i64 ldy) {
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_uncached_impl<DirectLoad<SRC, C>, DirectStore<C, DST>, C, DST, LOG, PACK, 1>(
      DirectLoad<SRC, C>(x, ldx), DirectStore<C, DST>(y, ldy), rows, cols);
}

#ifdef CUNORM_SM90
template <typename SRC, typename DST, bool LOG, int PACK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(512, 1)
    softmax_uncached_cluster(const SRC* x, DST* y, i64 rows, i64 cols, i64 ldx, i64 ldy) {
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_uncached_impl<DirectLoad<SRC, C>, DirectStore<C, DST>, C, DST, LOG, PACK, CLUSTER>(
      DirectLoad<SRC, C>(x, ldx), DirectStore<C, DST>(y, ldy), rows, cols);
}
#endif

template <typename SRC, typename DST, bool LOG, int PACK, bool CACHE>
__global__ void __launch_bounds__(256, 4) softmax_strided(const SRC* x, DST* y, i64 outer, i64 dim,
                                                        i64 inner, i64 ldx_outer, i64 ldx_dim,
                                                        i64 ldy_outer, i64 ldy_dim, int tx_count) {
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_strided_impl<SRC, DST, C, LOG, PACK, CACHE, 1>(x, y, outer, dim, inner, ldx_outer,
                                                        ldx_dim, ldy_outer, ldy_dim, tx_count);
}

#ifdef CUNORM_SM90
template <typename SRC, typename DST, bool LOG, int PACK, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(256, 2)
    softmax_strided_cluster(const SRC* x, DST* y, i64 outer, i64 dim, i64 inner, i64 ldx_outer,
                            i64 ldx_dim, i64 ldy_outer, i64 ldy_dim, int tx_count) {
  typedef typename Wider<typename ComputeOf<SRC>::type, typename ComputeOf<DST>::type>::type C;
  softmax_strided_impl<SRC, DST, C, LOG, PACK, true, CLUSTER>(x, y, outer, dim, inner, ldx_outer,
                                                             ldx_dim, ldy_outer, ldy_dim, tx_count);
}
#endif

}  // namespace cunorm
