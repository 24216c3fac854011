// Gradients of softmax and log_softmax over a (rows, cols) view with row strides (elements),
// planned by cunorm/_grad_dispatch.py:
//   softmax:     dx = y * (dy - sum(y * dy))
//   log_softmax: dx = dy - exp(y) * sum(dy)
// where y is the forward's output. A row is taken by GROUP lanes of one warp (GROUP <= 32:
// BLOCK / GROUP rows a block) or by a whole block (GROUP = 0, blockDim.x threads, BLOCK the
// most). With HOLD its threads keep their N packs of y and of dy in registers between the sum
// and the write, so the row is read once (cols <= threads * N * PACK); otherwise the row is
// read twice, N packs a thread at a time: the sum, then the write (the second read finds what
// the L2 kept of the first). Every pack is whole: the planner's PACK divides cols.
// In place (dx = dy or dx = y) is safe: each element is read and written by one thread, and
// a row's writes start after its sum, which every thread of the row has passed.
namespace cunorm {

// What the two ops differ in: the term of the row sum and the gradient from it, both in A.
// float32 works in double (AccFor, as the forward's sum of exponentials): the sum then carries
// no rounding worth counting whatever the row length, and dy - s no cancellation error. In
// float, a row of two columns with y = (0.999, 0.001) has dy_0 - s = 0.001 (dy_0 - dy_1) off
// by half an ulp of s, 3e-5 of the result (torch computes so); in double, the result is off
// by its last rounding alone. 16-bit inputs work in float, float64 in double.
// log_softmax's exp(y) near 1 cancels against dy where dy is (close to) one-hot, as under a
// cross-entropy loss with a confident prediction: dx_t = p_t - 1. There exp(y) off by its
// rounding (1e-7 of 1 in float) is 1e-2 of a result of 1e-5 (torch computes so). The largest
// y of a pack, where it lies in (-0.7, 0.7) (p > 1/2: one element a row, or two at 1/2), takes
// dx = (dy - s) - expm1(y) s instead, whose expm1 keeps its relative accuracy; the others
// keep exp(y), at most 1/2 (two near 1/2 cancel nothing). The pack's largest y is found by
// selects (softmax_grad_body's write says why); taking every y of (-0.7, 0.7) to expm1, as
// the NumPy path does, spilled the 16-bit kernels of four packs a thread (nvcc 13, sm_90).
template <typename T, bool LOG> struct SoftmaxGrad {
  typedef typename ComputeOf<T>::type C;
  typedef typename AccFor<C, T>::type A;
  static __device__ __forceinline__ A term(C y, C dy) {
    return LOG ? static_cast<A>(dy) : static_cast<A>(y) * static_cast<A>(dy);
  }
  static __device__ __forceinline__ C dx(C y, C dy, A s) {
    if (LOG) return static_cast<C>(fma(-static_cast<A>(ExpFor<C, T>::exp(y)), s, static_cast<A>(dy)));
    return static_cast<C>(static_cast<A>(y) * (static_cast<A>(dy) - s));
  }
  // Whether dx_near_one() takes over from dx(): |y| < 0.7 (y >= 0.7 is no log-probability,
  // and exp(y) >= 2 cancels nothing); never for softmax; NaN y stays with dx().
  static __device__ __forceinline__ bool near_one(C y) {
    return LOG && y > C(-0.7) && y < C(0.7);
  }
  static __device__ __forceinline__ C dx_near_one(C y, C dy, A s) {
    return static_cast<C>(fma(-static_cast<A>(expm1_near0(y)), s, static_cast<A>(dy) - s));
  }
};

// The row sum in every thread of the row's group.
template <int GROUP, typename A> __device__ __forceinline__ A grad_row_sum(A v, A* scratch) {
  if constexpr (GROUP > 0) {
    return group_all_reduce<SumOp<A>, GROUP>(v);
  } else {
    return block_all_reduce<SumOp<A>>(v, scratch);
  }
}

// The two-read path asks for CUNORM_GRAD_UNCACHED_THREADS resident threads an SM (1024: 64
// registers a thread): its blocks wait on a barrier between the reads, which another block's
// reads can fill. The macro is for measurement.
// y and dy load under the L2 evict_last policy (common.cuh load_pack_l2), as the forward's
// block-wide paths load x, on every path: H200, one process, softmax_backward GB/s against
// plain loads (benchmarks/results/nvidia-h200-2026-11-29-session76-grad-profile.txt):
// float16 1024 cols (warp) 3960 -> 4059, 2048 4190 -> 4268, 4096 4267 -> 4332, 16384 4279 ->
// 4348; float32 512 (warp) 3939 -> 4050, 3000 4278 -> 4335, 5120 4309 -> 4363, 65536
// (uncached) 2621 -> 2627. Rows of 64-128 columns moved within their run-to-run spread
// (float16 128: 2403 / 2657 plain, 2553 / 2564 kept). The block-wide paths alone under the
// policy gained the same there and nothing on the warp path. float64 rows load plainly
// (unmeasured; the policy's register spilled the 4-pack float64 block kernel under its 64).
// 0 builds plain loads (measurement).
#ifndef CUNORM_GRAD_L2_KEEP
#define CUNORM_GRAD_L2_KEEP 1
#endif
#ifndef CUNORM_GRAD_UNCACHED_THREADS
#define CUNORM_GRAD_UNCACHED_THREADS 1024
#endif
// CLUSTER > 1 (softmax_grad_cluster; HOLD, GROUP = 0): the CLUSTER blocks of a cluster share
// each row, a block holding the slice [first, end) of its packs; the blocks' row sums meet
// through ClusterMail, two mails in turn, as norm_grad_body's (below, which says why no
// cluster barrier is needed between rows), folded in rank order (the same bits in every
// block). Threads of up to two packs ask the L2 for their lines of the row they take next
// once their row's loads are issued, as norm_grad_body's cluster kernels do. H200, one
// process, GB/s (benchmarks/results/nvidia-h200-2026-11-29-session81-grad-profile.txt),
// without -> with: two packs a thread, softmax_backward float16 131072 columns 3439 -> 3791,
// float32 32768 3669 -> 3789, 65536 3216 -> 3330, log_softmax_backward float16 131072 3183
// -> 3405 (float16 65536 3882 -> 3787); four (1024-thread slices), float32 131072 3662 ->
// 3268, log_softmax_backward float16 262144 3697 -> 3260. CUNORM_GRAD_CLUSTER_PREFETCH
// overrides the rule (measurement): 0 never, 1 always.
#ifndef CUNORM_GRAD_CLUSTER_PREFETCH
#define CUNORM_GRAD_CLUSTER_PREFETCH -1
#endif
#define CUNORM_SOFTMAX_GRAD_PARAMS \
  const T *y, const T *dy, T *dx, i64 rows, i64 cols, i64 ld_y, i64 ld_dy, i64 ld_dx
#define CUNORM_SOFTMAX_GRAD_ARGS y, dy, dx, rows, cols, ld_y, ld_dy, ld_dx
template <typename T, bool LOG, int PACK, int BLOCK, int GROUP, int N, bool HOLD, int CLUSTER>
__device__ __forceinline__ void softmax_grad_body(CUNORM_SOFTMAX_GRAD_PARAMS) {
  static_assert(GROUP == 0 || (GROUP <= 32 && (GROUP & (GROUP - 1)) == 0 && BLOCK % 32 == 0),
                "a row takes lanes of one warp or the whole block");
  static_assert(CLUSTER == 1 || (HOLD && GROUP == 0), "clusters hold whole-block rows");
  typedef SoftmaxGrad<T, LOG> G;
  typedef typename G::C C;
  typedef typename G::A A;
  constexpr int ROWS = GROUP > 0 ? BLOCK / GROUP : 1;     // rows a block takes at a time
  constexpr int WARP_ROWS = GROUP > 0 ? 32 / GROUP : 1;   // rows a warp takes at a time
  __shared__ A scratch[GROUP > 0 ? 1 : 33];
  constexpr int MAILS = CLUSTER > 1 ? 2 : 1;
  __shared__ ClusterMail<A, CLUSTER> mail[MAILS];  // the cluster's blocks' row sums
  const int group = GROUP > 0 ? GROUP : static_cast<int>(blockDim.x);  // threads a row
  const int lane = threadIdx.x % group;
  const int slot = threadIdx.x / group;
  const i64 npacks = cols / PACK;
  const i64 slice = (npacks + CLUSTER - 1) / CLUSTER;  // packs a block of a cluster
  const i64 first = CLUSTER > 1 ? Cluster<CLUSTER>::rank() * slice : 0;
  const i64 end = CLUSTER > 1 ? min(npacks, first + slice) : npacks;
  const i64 step = static_cast<i64>(gridDim.x / CLUSTER) * ROWS;
  if constexpr (MAILS == 2) {
    open_mail<CLUSTER>(mail[0], mail[1]);
  }
  unsigned k = 0;  // exchanges so far (the mail's phase)
  for (i64 base = static_cast<i64>(blockIdx.x / CLUSTER) * ROWS; base < rows;
       base += step, ++k) {
    // A warp leaves the loop as a whole (its rows' sums shuffle over the full warp): once its
    // first row is past the end.
    if (base + (slot - slot % WARP_ROWS) >= rows) break;
    const i64 row = base + slot;
    const bool valid = row < rows;
    const T* yr = y + row * ld_y;
    const T* dyr = dy + row * ld_dy;
    T* dxr = dx + row * ld_dx;
    // f(pack index, y values, dy values) for the packs j = j0 + u * group, u < N, of the row
    const auto packs = [&](i64 j0, const Pack<T, PACK>* py, const Pack<T, PACK>* pd,
                           auto&& f) {
#pragma unroll
      for (int u = 0; u < N; ++u) {
        const i64 j = j0 + static_cast<i64>(u) * group;
        if (valid && j < end) {
          C a[PACK], b[PACK];
          pack_to_compute<C>(py[u], a);
          pack_to_compute<C>(pd[u], b);
          f(j, a, b);
        }
      }
    };
    // Every pack of the chunk in flight before the first is used. with_y false: dy alone
    // (log_softmax's sum reads no y; the hinted loads are asm volatile, so ptxas would not
    // drop unused ones, as it dropped plain loads: the first read of a two-read row then
    // moves a third fewer bytes).
    constexpr L2Hint kHint =
        CUNORM_GRAD_L2_KEEP && sizeof(T) < 8 ? L2Hint::kEvictLast : L2Hint::kNone;
    const auto fetch = [&](i64 j0, Pack<T, PACK>* py, Pack<T, PACK>* pd, bool with_y) {
#pragma unroll
      for (int u = 0; u < N; ++u) {
        const i64 j = j0 + static_cast<i64>(u) * group;
        if (valid && j < end) {
          if (with_y) py[u] = load_pack_l2<kHint, T, PACK>(yr + j * PACK);
          pd[u] = load_pack_l2<kHint, T, PACK>(dyr + j * PACK);
        }
      }
    };
    const auto add = [&](A& acc) {
      return [&acc](i64, const C* a, const C* b) {
#pragma unroll
        for (int i = 0; i < PACK; ++i) acc += G::term(a[i], b[i]);
      };
    };
    const auto write = [&](A s) {
      return [s, dxr](i64 j, const C* a, const C* b) {
        C d[PACK];
        // the pack's largest y, its dy and index, past a NaN (selects, no indexing by a
        // variable: a[top] put the array in local memory, 32 bytes of stack in the float16
        // cluster kernel, nvcc 13, sm_90)
        C y_top = a[0], dy_top = b[0];
        int top = 0;
#pragma unroll
        for (int i = 0; i < PACK; ++i) {
          d[i] = G::dx(a[i], b[i], s);
          if (i > 0 && (a[i] > y_top || y_top != y_top)) y_top = a[i], dy_top = b[i], top = i;
        }
        if (G::near_one(y_top)) {  // rare: a branch off the common path
          const C d_top = G::dx_near_one(y_top, dy_top, s);
#pragma unroll
          for (int i = 0; i < PACK; ++i) {
            if (i == top) d[i] = d_top;
          }
        }
        Pack<T, PACK> o;
#pragma unroll
        for (int i = 0; i < PACK; ++i) o.v[i] = from_compute<T>(d[i]);
        store_pack<T, PACK>(dxr + j * PACK, o);
      };
    };
    A acc = A(0);
    if constexpr (HOLD) {
      Pack<T, PACK> py[N], pd[N];
      fetch(first + lane, py, pd, true);
      if constexpr (CLUSTER > 1 && (CUNORM_GRAD_CLUSTER_PREFETCH < 0
                                        ? N <= 2 : CUNORM_GRAD_CLUSTER_PREFETCH != 0)) {
        constexpr int LINE_PACKS = 128 / static_cast<int>(sizeof(Pack<T, PACK>));
#pragma unroll
        for (int u = 0; u < N; ++u) {
          const i64 j = first + lane + static_cast<i64>(u) * group;
          if (row + step < rows && j < end && j % LINE_PACKS == 0) {
            prefetch_l2(y + (row + step) * ld_y + j * PACK);
            prefetch_l2(dy + (row + step) * ld_dy + j * PACK);
          }
        }
      }
      packs(first + lane, py, pd, add(acc));
      A s = grad_row_sum<GROUP>(acc, scratch);
      if constexpr (CLUSTER > 1) {
        if (k == 0) Cluster<CLUSTER>::wait();  // the peers' mail is open
        s = mail[k % MAILS].template exchange<SumOp<A>>(s, k / MAILS);
      }
      packs(first + lane, py, pd, write(s));
    } else {
      for (i64 j0 = lane; j0 < npacks; j0 += static_cast<i64>(N) * group) {
        Pack<T, PACK> py[N] = {}, pd[N];  // (py unread by log_softmax's sum)
        fetch(j0, py, pd, !LOG);
        packs(j0, py, pd, add(acc));
      }
      const A s = grad_row_sum<GROUP>(acc, scratch);
      for (i64 j0 = lane; j0 < npacks; j0 += static_cast<i64>(N) * group) {
        Pack<T, PACK> py[N], pd[N];
        fetch(j0, py, pd, true);
        packs(j0, py, pd, write(s));
      }
    }
  }
}

template <typename T, bool LOG, int PACK, int BLOCK, int GROUP, int N, bool HOLD>
__global__ void __launch_bounds__(BLOCK, HOLD || CUNORM_GRAD_UNCACHED_THREADS <= BLOCK
                                             ? 1 : CUNORM_GRAD_UNCACHED_THREADS / BLOCK)
    softmax_grad(CUNORM_SOFTMAX_GRAD_PARAMS) {
  softmax_grad_body<T, LOG, PACK, BLOCK, GROUP, N, HOLD, 1>(CUNORM_SOFTMAX_GRAD_ARGS);
}

#ifdef CUNORM_SM90
template <typename T, bool LOG, int PACK, int BLOCK, int N, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(BLOCK)
    softmax_grad_cluster(CUNORM_SOFTMAX_GRAD_PARAMS) {
  softmax_grad_body<T, LOG, PACK, BLOCK, 0, N, true, CLUSTER>(CUNORM_SOFTMAX_GRAD_ARGS);
}
#endif

}  // namespace cunorm

// ---------------------------------------------------------------------------------------
// Gradients of layer_norm and rms_norm over a (rows, cols) view, planned by
// cunorm/_grad_dispatch.py (plan_norm_grad), from the forward's x, its statistics (mean and
// rstd, return_stats=True) and dy:
//   g = dy * weight (dy without a weight), xhat = (x - mean) * rstd (rms_norm: x * rstd)
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat))   (rms_norm: no mean(g) term)
//   dweight = sum over rows of dy * xhat, dbias = sum over rows of dy.
// The row sums mean(g) and mean(g * xhat) are added in AccFor (double for float32 rows:
// they then carry no rounding worth counting, as the softmax gradients' sum); NormGrad says
// the rest.
namespace cunorm {

// The types of a row kernel. 16-bit rows work in float and float64 rows in double. float32
// rows work in double where WIDE (rows of a few columns: the planner's NORM_GRAD_WIDE_BELOW),
// else each element and a thread's column sums in float (the double registers left one or
// two 512-thread blocks an SM: 0.60-0.98x of float on rows of 64-8192 columns, session 78)
// and the row sums in double (the product of two floats is exact in double). Short rows keep
// double: dx is g less its projection on 1 and xhat, and on a few columns that difference can
// be a small part of g, which float arithmetic then leaves with a large relative error.
template <typename T, bool RMS, bool WIDE = true> struct NormGrad {
  typedef typename ComputeOf<T>::type C;   // the statistics' type
  typedef typename AccFor<C, T>::type P;   // the row sums and the partial rows of column sums
  typedef typename Conditional<WIDE, P, C>::type A;  // each element and its column sums
};

// Sum of v over the GROUP threads of a row, in each of them: lanes of one warp (GROUP <= 32),
// GROUP / 32 warps of a BLOCK-thread block under their own named barrier (GROUP > 32, at most
// 8 rows a block: barriers 1-8 of 16), or the whole block (GROUP = 0). scratch: 33 values.
template <int GROUP, int BLOCK, typename V>
__device__ __forceinline__ V row_group_sum(V v, V* scratch) {
  if constexpr (GROUP == 0) {
    return block_all_reduce<SumOp<V>>(v, scratch);
  } else if constexpr (GROUP <= 32) {
    return group_all_reduce<SumOp<V>, GROUP>(v);
  } else {
    static_assert(GROUP % 32 == 0 && BLOCK % GROUP == 0 && BLOCK / GROUP <= 8, "row groups");
    constexpr int WARPS = GROUP / 32;
    const int slot = threadIdx.x / GROUP;
    v = group_all_reduce<SumOp<V>, 32>(v);
    V* mine = scratch + slot * WARPS;
    if ((threadIdx.x & 31) == 0) mine[(threadIdx.x % GROUP) / 32] = v;
    bar_sync(1 + slot, GROUP);
    V r = mine[0];
#pragma unroll
    for (int w = 1; w < WARPS; ++w) r += mine[w];  // the same order in every thread
    bar_sync(1 + slot, GROUP);  // scratch free again
    return r;
  }
}

// A row is taken by GROUP threads (see row_group_sum), BLOCK / GROUP rows a block at a time
// (GROUP = 0: one, blockDim.x threads, BLOCK the most). With HOLD a thread keeps its N packs
// of x and dy in registers from the sums to the write (cols <= threads * N * PACK) and adds
// dy * xhat and dy of its columns over every row it takes; at the end the block's rows' sums
// go in a fixed order to its partial row: partial[b][cols] (dweight's terms) and
// partial[n + b][cols] (dbias's; layer_norm only), b the block's index among the grid's n
// blocks (its cluster's among n clusters), which norm_grad_cols adds up. Blocks of several
// rows stage them in dynamic shared memory (rows * cols values).
// Without HOLD a row is read twice (the sums, then the write) and nothing else is written;
// norm_grad_cols takes the columns from x and dy then. Every pack is whole (PACK divides
// cols). In place (dx = dy or dx = x) is safe as for softmax_grad.
// CLUSTER > 1 (norm_grad_rows_cluster; HOLD, GROUP = 0): the CLUSTER blocks of a cluster
// share each row, a block holding the slice [first, end) of its packs; the blocks' row sums
// meet through ClusterMail, folded in rank order (the same bits in every block), and each
// cluster writes one partial row of column sums, a slice a block. Rows take two mails in
// turn, with no cluster barrier between rows: a block posts row r + 2's sums only after its
// wait for row r + 1's, which needs every peer's post of row r + 1, made after that peer's
// block-wide reduction of the row, so after every one of its threads read row r's slots.
// (One mail and a cluster barrier closing each row took 1.13-1.34x the time on an H200,
// session 80: benchmarks/results/nvidia-h200-2026-11-29-session80-cluster-profile.txt.)
// prefetch != 0: a holding thread, its row's loads issued, asks the L2 for the lines of its
// packs of the row it takes next, so that their loads wait on the L2 rather than DRAM while
// the row's sums meet. The planner asks for it where an SM has few bytes of rows in flight
// (_grad_dispatch.NORM_GRAD_PREFETCH_BELOW says where, from measurement). Rows of lane
// groups within a warp (the warp path, GROUP <= 32) never prefetch: float64 layer_norm's 2-
// and 4-lane kernels spilled 4 bytes with it (nvcc 13, sm_90), and the path has many rows in
// flight an SM. CUNORM_NORM_GRAD_PREFETCH (for measurement) overrides the argument: 0
// never, 1 always (the warp path too).
#ifndef CUNORM_NORM_GRAD_PREFETCH
#define CUNORM_NORM_GRAD_PREFETCH -1
#endif
#define CUNORM_NORM_GRAD_PARAMS                                                              \
  const T *dy, const T *x, const typename NormGrad<T, RMS>::C *mean,                        \
      const typename NormGrad<T, RMS>::C *rstd, const T *weight, T *dx,                     \
      typename NormGrad<T, RMS>::P *partial, i64 rows, i64 cols, i64 ld_dy, i64 ld_x,       \
      i64 ld_dx, i64 prefetch
#define CUNORM_NORM_GRAD_ARGS \
  dy, x, mean, rstd, weight, dx, partial, rows, cols, ld_dy, ld_x, ld_dx, prefetch
template <typename T, bool RMS, int PACK, int BLOCK, int GROUP, int N, bool HOLD, bool WIDE,
          int CLUSTER>
__device__ __forceinline__ void norm_grad_body(CUNORM_NORM_GRAD_PARAMS) {
  typedef typename NormGrad<T, RMS, WIDE>::C C;
  typedef typename NormGrad<T, RMS, WIDE>::P P;
  typedef typename NormGrad<T, RMS, WIDE>::A A;
  static_assert(CLUSTER == 1 || (HOLD && GROUP == 0), "clusters hold whole-block rows");
  constexpr int ROWS = GROUP > 0 ? BLOCK / GROUP : 1;
  constexpr int WARP_ROWS = GROUP > 0 && GROUP < 32 ? 32 / GROUP : 1;
  __shared__ Sum2<P> scratch[33];  // the row sums are P's
  constexpr int MAILS = CLUSTER > 1 ? 2 : 1;
  // whether the kernel has the prefetch code (then prefetch says whether it runs)
  constexpr bool PREFETCH =
      HOLD && (CUNORM_NORM_GRAD_PREFETCH < 0 ? GROUP == 0 || GROUP > 32
                                             : CUNORM_NORM_GRAD_PREFETCH != 0);
  if (CUNORM_NORM_GRAD_PREFETCH >= 0) prefetch = CUNORM_NORM_GRAD_PREFETCH;
  __shared__ ClusterMail<Sum2<P>, CLUSTER> mail[MAILS];  // the cluster's blocks' row sums
  const int group = GROUP > 0 ? GROUP : static_cast<int>(blockDim.x);
  const int lane = threadIdx.x % group;
  const int slot = threadIdx.x / group;
  const i64 npacks = cols / PACK;
  const i64 slice = (npacks + CLUSTER - 1) / CLUSTER;  // packs a block of a cluster
  const i64 first = CLUSTER > 1 ? Cluster<CLUSTER>::rank() * slice : 0;
  const i64 end = CLUSTER > 1 ? min(npacks, first + slice) : npacks;
  const P inv_cols = P(1) / static_cast<P>(cols);
  const i64 nclusters = gridDim.x / CLUSTER;
  const i64 cluster = blockIdx.x / CLUSTER;
  const i64 step = nclusters * ROWS;
  A col_w[HOLD ? N : 1][PACK] = {}, col_b[HOLD && !RMS ? N : 1][PACK] = {};
  if constexpr (MAILS == 2) {
    open_mail<CLUSTER>(mail[0], mail[1]);
  } else {
    open_mail<CLUSTER>(mail[0]);
  }
  unsigned k = 0;  // exchanges so far (the mail's phase)
  for (i64 base = cluster * ROWS; base < rows; base += step, ++k) {
    // A warp of lane groups leaves as a whole, once its first row is past the end. Row groups
    // past 32 lanes stay to the block's last round (their rows past the end do no loads or
    // stores): a group that left early waited at the staging's __syncthreads while others
    // still met on their named barriers, which compute-sanitizer racecheck reported as 245
    // hazards between the staged rows' writes and reads (session 78; none since).
    if (GROUP <= 32 && base + (slot - slot % WARP_ROWS) >= rows) break;
    const i64 row = base + slot;
    const bool valid = row < rows;
    const T* dyr = dy + row * ld_dy;
    const T* xr = x + row * ld_x;
    T* dxr = dx + row * ld_dx;
    const A mu = RMS || !valid ? A(0) : static_cast<A>(mean[row]);
    const A rs = valid ? static_cast<A>(rstd[row]) : A(0);
    // f(u, pack index, x, dy, g in A) for the packs j = j0 + u * group, u < N, of the row
    const auto packs = [&](i64 j0, const Pack<T, PACK>* px, const Pack<T, PACK>* pd,
                           auto&& f) {
#pragma unroll
      for (int u = 0; u < N; ++u) {
        const i64 j = j0 + static_cast<i64>(u) * group;
        if (valid && j < end) {
          C a[PACK], b[PACK], w[PACK];
          pack_to_compute<C>(px[u], a);
          pack_to_compute<C>(pd[u], b);
          if (weight != nullptr) {
            pack_to_compute<C>(load_pack<T, PACK>(weight + j * PACK), w);
          }
          A xh[PACK], g[PACK];
#pragma unroll
          for (int i = 0; i < PACK; ++i) {
            xh[i] = (static_cast<A>(a[i]) - mu) * rs;
            g[i] = weight != nullptr ? static_cast<A>(b[i]) * static_cast<A>(w[i])
                                     : static_cast<A>(b[i]);
          }
          f(u, j, b, xh, g);
        }
      }
    };
    const auto fetch = [&](i64 j0, Pack<T, PACK>* px, Pack<T, PACK>* pd) {
#pragma unroll
      for (int u = 0; u < N; ++u) {
        const i64 j = j0 + static_cast<i64>(u) * group;
        if (valid && j < end) {
          px[u] = load_pack<T, PACK>(xr + j * PACK);
          pd[u] = load_pack<T, PACK>(dyr + j * PACK);
        }
      }
    };
    Sum2<P> acc = {P(0), P(0)};  // sum of g, sum of g * xhat
    const auto add = [&acc](int, i64, const C*, const A* xh, const A* g) {
#pragma unroll
      for (int i = 0; i < PACK; ++i) {
        if (!RMS) acc.a += static_cast<P>(g[i]);
        acc.b += static_cast<P>(g[i]) * static_cast<P>(xh[i]);
      }
    };
    const auto write = [&](Sum2<P> s, bool columns) {
      const A mean_g = static_cast<A>(s.a * inv_cols);
      const A mean_gx = static_cast<A>(s.b * inv_cols);
      return [&, mean_g, mean_gx, columns](int u, i64 j, const C* b, const A* xh, const A* g) {
        Pack<T, PACK> o;
#pragma unroll
        for (int i = 0; i < PACK; ++i) {
          o.v[i] = from_compute<T>(static_cast<C>(rs * (g[i] - mean_g - xh[i] * mean_gx)));
          if (HOLD && columns) {
            col_w[HOLD ? u : 0][i] += static_cast<A>(b[i]) * xh[i];
            if (!RMS) col_b[HOLD && !RMS ? u : 0][i] += static_cast<A>(b[i]);
          }
        }
        store_pack<T, PACK>(dxr + j * PACK, o);
      };
    };
    if constexpr (HOLD) {
      Pack<T, PACK> px[N], pd[N];
      fetch(first + lane, px, pd);
      if constexpr (PREFETCH) {
        constexpr int LINE_PACKS = 128 / static_cast<int>(sizeof(Pack<T, PACK>));
#pragma unroll
        for (int u = 0; u < N; ++u) {
          const i64 j = first + lane + static_cast<i64>(u) * group;
          if (prefetch != 0 && row + step < rows && j < end && j % LINE_PACKS == 0) {
            prefetch_l2(x + (row + step) * ld_x + j * PACK);
            prefetch_l2(dy + (row + step) * ld_dy + j * PACK);
          }
        }
      }
      packs(first + lane, px, pd, add);
      Sum2<P> s = row_group_sum<GROUP, BLOCK>(acc, scratch);
      if constexpr (CLUSTER > 1) {
        if (k == 0) Cluster<CLUSTER>::wait();  // the peers' mail is open
        s = mail[k % MAILS].template exchange<SumOp<Sum2<P>>>(s, k / MAILS);
      }
      packs(first + lane, px, pd, write(s, true));
    } else {
      for (i64 j0 = lane; j0 < npacks; j0 += static_cast<i64>(N) * group) {
        Pack<T, PACK> px[N], pd[N];
        fetch(j0, px, pd);
        packs(j0, px, pd, add);
      }
      const Sum2<P> s = row_group_sum<GROUP, BLOCK>(acc, scratch);
      for (i64 j0 = lane; j0 < npacks; j0 += static_cast<i64>(N) * group) {
        Pack<T, PACK> px[N], pd[N];
        fetch(j0, px, pd);
        packs(j0, px, pd, write(s, false));
      }
    }
  }
  if constexpr (HOLD) {
    // The block's column sums, rows (slots) added in slot order, to its partial rows.
    extern __shared__ __align__(16) unsigned char norm_grad_stage[];
    P* stage = reinterpret_cast<P*>(norm_grad_stage);
#pragma unroll
    for (int which = 0; which < (RMS ? 1 : 2); ++which) {
      P* dst = partial + (static_cast<i64>(which) * nclusters + cluster) * cols;
      P* const to = ROWS > 1 ? stage + slot * cols : dst;
#pragma unroll
      for (int u = 0; u < N; ++u) {
        const i64 j = first + lane + static_cast<i64>(u) * group;
        if (j < end) {
#pragma unroll
          for (int i = 0; i < PACK; ++i) {
            to[j * PACK + i] = static_cast<P>(which == 0 ? col_w[u][i] : col_b[RMS ? 0 : u][i]);
          }
        }
      }
      if constexpr (ROWS > 1) {
        __syncthreads();
        for (i64 c = threadIdx.x; c < cols; c += BLOCK) {
          P t = stage[c];
#pragma unroll 4
          for (int r = 1; r < ROWS; ++r) t += stage[r * cols + c];
          dst[c] = t;
        }
        __syncthreads();  // stage free for the next sums
      }
    }
  }
}

template <typename T, bool RMS, int PACK, int BLOCK, int GROUP, int N, bool HOLD, bool WIDE>
__global__ void __launch_bounds__(BLOCK) norm_grad_rows(CUNORM_NORM_GRAD_PARAMS) {
  norm_grad_body<T, RMS, PACK, BLOCK, GROUP, N, HOLD, WIDE, 1>(CUNORM_NORM_GRAD_ARGS);
}

#ifdef CUNORM_SM90
template <typename T, bool RMS, int PACK, int BLOCK, int N, bool WIDE, int CLUSTER>
__global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(BLOCK)
    norm_grad_rows_cluster(CUNORM_NORM_GRAD_PARAMS) {
  norm_grad_body<T, RMS, PACK, BLOCK, 0, N, true, WIDE, CLUSTER>(CUNORM_NORM_GRAD_ARGS);
}
#endif

// Column sums over ranges of rows, 32 columns a block by 32 rows at a time (blockDim (32,
// 32)), each thread its own rows in order, then the 32 added in a fixed order. DIRECT: the
// terms dy * xhat (and dy) from x, dy and the statistics, for rows [blockIdx.y * chunk, ...
// + chunk), to the partial rows part_out[blockIdx.y] and part_out[gridDim.y + blockIdx.y].
// Otherwise: the terms are partial rows part_in[0 .. rows) (and part_in[rows .. 2 rows)),
// summed into dweight (and dbias) in T.
template <typename T, bool RMS, bool DIRECT>
__global__ void __launch_bounds__(1024) norm_grad_cols(
    const T* dy, const T* x, const typename NormGrad<T, RMS>::C* mean,
    const typename NormGrad<T, RMS>::C* rstd, const typename NormGrad<T, RMS>::P* part_in,
    typename NormGrad<T, RMS>::P* part_out, T* dweight, T* dbias, i64 rows, i64 cols,
    i64 ld_dy, i64 ld_x, i64 chunk) {
  typedef typename NormGrad<T, RMS>::C C;
  typedef typename NormGrad<T, RMS>::P A;  // the partial rows' type throughout
  __shared__ A sums[2][32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const i64 c = static_cast<i64>(blockIdx.x) * 32 + tx;
  const i64 first = DIRECT ? static_cast<i64>(blockIdx.y) * chunk : 0;
  const i64 last = DIRECT ? (first + chunk < rows ? first + chunk : rows) : rows;
  A w = A(0), b = A(0);
  if (c < cols) {
#pragma unroll 4
    for (i64 r = first + ty; r < last; r += 32) {
      if constexpr (DIRECT) {
        const A d = static_cast<A>(to_compute<C>(dy[r * ld_dy + c]));
        const A mu = RMS ? A(0) : static_cast<A>(mean[r]);
        w += d * ((static_cast<A>(to_compute<C>(x[r * ld_x + c])) - mu) *
                  static_cast<A>(rstd[r]));
        if (!RMS) b += d;
      } else {
        w += part_in[r * cols + c];
        if (!RMS) b += part_in[(rows + r) * cols + c];
      }
    }
  }
  sums[0][ty][tx] = w;
  sums[1][ty][tx] = b;
  __syncthreads();
  if (ty < (RMS ? 1 : 2) && c < cols) {
    A t = sums[ty][0][tx];
#pragma unroll
    for (int r = 1; r < 32; ++r) t += sums[ty][r][tx];
    if constexpr (DIRECT) {
      part_out[(static_cast<i64>(ty) * gridDim.y + blockIdx.y) * cols + c] = t;
    } else {
      (ty == 0 ? dweight : dbias)[c] = from_compute<T>(static_cast<C>(t));
    }
  }
}

}  // namespace cunorm
