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
// keep exp(y), at most 1/2 (two near 1/2 cancel nothing).
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
template <typename T, bool LOG, int PACK, int BLOCK, int GROUP, int N, bool HOLD>
__global__ void __launch_bounds__(BLOCK, HOLD || CUNORM_GRAD_UNCACHED_THREADS <= BLOCK
                                             ? 1 : CUNORM_GRAD_UNCACHED_THREADS / BLOCK)
    softmax_grad(const T* y, const T* dy, T* dx, i64 rows, i64 cols, i64 ld_y, i64 ld_dy,
                 i64 ld_dx) {
  static_assert(GROUP == 0 || (GROUP <= 32 && (GROUP & (GROUP - 1)) == 0 && BLOCK % 32 == 0),
                "a row takes lanes of one warp or the whole block");
  typedef SoftmaxGrad<T, LOG> G;
  typedef typename G::C C;
  typedef typename G::A A;
  constexpr int ROWS = GROUP > 0 ? BLOCK / GROUP : 1;     // rows a block takes at a time
  constexpr int WARP_ROWS = GROUP > 0 ? 32 / GROUP : 1;   // rows a warp takes at a time
  __shared__ A scratch[GROUP > 0 ? 1 : 33];
  const int group = GROUP > 0 ? GROUP : static_cast<int>(blockDim.x);  // threads a row
  const int lane = threadIdx.x % group;
  const int slot = threadIdx.x / group;
  const i64 npacks = cols / PACK;
  const i64 step = static_cast<i64>(gridDim.x) * ROWS;
  for (i64 base = static_cast<i64>(blockIdx.x) * ROWS; base < rows; base += step) {
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
        if (valid && j < npacks) {
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
        if (valid && j < npacks) {
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
        int top = 0;  // the pack's largest y (selects: one expm1 a pack, few registers)
#pragma unroll
        for (int i = 0; i < PACK; ++i) {
          d[i] = G::dx(a[i], b[i], s);
          if (i > 0 && (a[i] > a[top] || a[top] != a[top])) top = i;  // (past a NaN)
        }
        C y_top = a[0], dy_top = b[0];
#pragma unroll
        for (int i = 1; i < PACK; ++i) {
          if (i == top) y_top = a[i], dy_top = b[i];
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
      fetch(lane, py, pd, true);
      packs(lane, py, pd, add(acc));
      const A s = grad_row_sum<GROUP>(acc, scratch);
      packs(lane, py, pd, write(s));
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

}  // namespace cunorm
