// cunorm shared device code: storage types, compute-type traits, 16-byte packs,
// LOAD/STORE functors, warp/block/cluster all-reduce and the online (max, sum) pair.
//
// Every op kernel (softmax.cu, norm.cu, ...) is compiled with this header inlined in front
// of it (see cunorm/_kernels.py): CuPy's disk cache keys on the source string only, so an
// #include would let an edited header load a stale binary.
#pragma once

namespace cunorm {

typedef long long i64;

// Half and bfloat16 are carried as raw 16-bit storage so that no CUDA half header is
// needed under NVRTC or nvcc; conversions are single PTX instructions.
struct __align__(2) half_t { unsigned short bits; };
struct __align__(2) bf16_t { unsigned short bits; };

template <typename A, typename B> struct IsSame { static constexpr bool value = false; };
template <typename A> struct IsSame<A, A> { static constexpr bool value = true; };
template <bool B, typename T, typename F> struct Conditional { typedef T type; };
template <typename T, typename F> struct Conditional<false, T, F> { typedef F type; };
template <typename T> struct RemoveCvRef { typedef T type; };
template <typename T> struct RemoveCvRef<const T> { typedef T type; };
template <typename T> struct RemoveCvRef<T&> { typedef typename RemoveCvRef<T>::type type; };

// Arithmetic type for a storage type: float for the 16-bit types, itself otherwise.
template <typename T> struct ComputeOf { typedef T type; };
template <> struct ComputeOf<half_t> { typedef float type; };
template <> struct ComputeOf<bf16_t> { typedef float type; };

// Wider of two compute types (float64 wins): used when the output dtype differs from the input.
template <typename A, typename B> struct Wider { typedef float type; };
template <typename B> struct Wider<double, B> { typedef double type; };
template <typename A> struct Wider<A, double> { typedef double type; };
template <> struct Wider<double, double> { typedef double type; };

__device__ __forceinline__ float to_float(half_t v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}
__device__ __forceinline__ float to_float(bf16_t v) {
  return __uint_as_float(static_cast<unsigned>(v.bits) << 16);
}

// Convert a storage value to compute type C.
template <typename C> __device__ __forceinline__ C to_compute(half_t v) { return static_cast<C>(to_float(v)); }
template <typename C> __device__ __forceinline__ C to_compute(bf16_t v) { return static_cast<C>(to_float(v)); }
template <typename C> __device__ __forceinline__ C to_compute(float v) { return static_cast<C>(v); }
template <typename C> __device__ __forceinline__ C to_compute(double v) { return static_cast<C>(v); }

// Convert a compute value to storage type T, rounding to nearest even.
template <typename T> struct FromCompute;
template <> struct FromCompute<float> {
  static __device__ __forceinline__ float cvt(float v) { return v; }
  static __device__ __forceinline__ float cvt(double v) { return static_cast<float>(v); }
};
template <> struct FromCompute<double> {
  static __device__ __forceinline__ double cvt(float v) { return v; }
  static __device__ __forceinline__ double cvt(double v) { return v; }
};
template <> struct FromCompute<half_t> {
  static __device__ __forceinline__ half_t cvt(float v) {
    half_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(v));
    return h;
  }
  static __device__ __forceinline__ half_t cvt(double v) {
    half_t h;
    asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(v));
    return h;
  }
};
template <> struct FromCompute<bf16_t> {
  static __device__ __forceinline__ bf16_t cvt(float v) {
    bf16_t b;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b.bits) : "f"(v));
#else
    unsigned u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      b.bits = static_cast<unsigned short>((u >> 16) | 0x40u);  // quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
      b.bits = static_cast<unsigned short>(u >> 16);
    }
#endif
    return b;
  }
  // double -> float -> bf16: the double rounding is below bf16's resolution in practice.
  static __device__ __forceinline__ bf16_t cvt(double v) { return cvt(static_cast<float>(v)); }
};
template <typename T, typename C> __device__ __forceinline__ T from_compute(C v) {
  return FromCompute<T>::cvt(v);
}

// ---------------------------------------------------------------------------------------
// Math in the compute type. float uses the accurate expf/logf (float32 error budget is
// 2e-6); the 16-bit types only need the fast hardware approximation.
template <typename C> struct Math;
template <> struct Math<float> {
  static __device__ __forceinline__ float exp(float x) { return ::expf(x); }
  static __device__ __forceinline__ float log(float x) { return ::logf(x); }
  static __device__ __forceinline__ float rsqrt(float x) { return ::rsqrtf(x); }
  // 1/x: approximate reciprocal and one Newton step (no out-of-line slow path as 1.0f / x has).
  static __device__ __forceinline__ float rcp(float x) {
    const float y = __fdividef(1.0f, x);
    if (!(y > 0.0f && y < 3.4e38f)) return y;
    return fmaf(y, fmaf(-x, y, 1.0f), y);
  }
  static __device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
  static __device__ __forceinline__ float inf() { return __int_as_float(0x7f800000); }
};
// A row length known at compile time (rows.cuh rows_warp EXACT); it converts to i64 where a
// count is taken, and rcp_cols folds its reciprocal to the correctly rounded constant (ptxas
// keeps div.approx of constants).
template <i64 N> struct FixedCols {
  __host__ __device__ constexpr operator i64() const { return N; }
};
// 1 / n in the compute type, for the means of the row paths.
template <typename C> __device__ __forceinline__ C rcp_cols(i64 n) {
  return Math<C>::rcp(static_cast<C>(n));
}
template <typename C, i64 N> __device__ __forceinline__ C rcp_cols(FixedCols<N>) {
  constexpr C kInv = C(1) / C(N);
  return kInv;
}
// exp for double without the library's out-of-line slow path (whose call forces register
// spills in unrolled kernels): Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, degree-12
// Taylor polynomial (truncation < 2e-16 relative), 2^k applied in two halves so that results
// near the overflow and subnormal edges stay exact.
__device__ __forceinline__ double exp_f64(double x) {
  if (!(x > -745.2)) return x != x ? x : 0.0;         // NaN stays NaN; -inf and underflow -> 0
  if (x > 709.79) return __longlong_as_double(0x7ff0000000000000ll);  // overflow -> inf
  const double k = rint(x * 1.4426950408889634);
  double r = fma(-k, 6.93147180369123816490e-01, x);  // ln2 high part: k * hi is exact
  r = fma(-k, 1.90821492927058770002e-10, r);         // ln2 low part
  double p = 2.08767569878680989792e-09;              // 1/12!
  p = fma(p, r, 2.50521083854417187751e-08);          // 1/11!
  p = fma(p, r, 2.75573192239858906526e-07);
  p = fma(p, r, 2.75573192239858906526e-06);
  p = fma(p, r, 2.48015873015873015873e-05);
  p = fma(p, r, 1.98412698412698412698e-04);
  p = fma(p, r, 1.38888888888888888889e-03);
  p = fma(p, r, 8.33333333333333333333e-03);
  p = fma(p, r, 4.16666666666666666667e-02);
  p = fma(p, r, 1.66666666666666666667e-01);
  p = fma(p, r, 0.5);
  p = fma(p, r, 1.0);
  p = fma(p, r, 1.0);
  const int ki = static_cast<int>(k);
  const int k1 = ki / 2;
  const int k2 = ki - k1;
  return p * __longlong_as_double(static_cast<long long>(k1 + 1023) << 52) *
         __longlong_as_double(static_cast<long long>(k2 + 1023) << 52);
}

// 1/x for double without the division's out-of-line slow path: float seed, two Newton steps
// (relative error ~1e-16). For x within float's range; 0, inf and NaN map to inf, 0 and NaN.
__device__ __forceinline__ double rcp_f64(double x) {
  double y = static_cast<double>(1.0f / static_cast<float>(x));
  if (!(y > 0.0 && y < 3.4e38)) return y;  // x == 0, inf, NaN or out of float range
  y = fma(y, fma(-x, y, 1.0), y);
  return fma(y, fma(-x, y, 1.0), y);
}

// log for double, also free of out-of-line calls: x = 2^e * m with m in [sqrt(1/2), sqrt(2)),
// log(m) = 2 atanh(t), t = (m - 1) / (m + 1), |t| < 0.172, odd series to t^23.
__device__ __forceinline__ double log_f64(double x) {
  if (!(x > 0.0)) return x == 0.0 ? -__longlong_as_double(0x7ff0000000000000ll) : __longlong_as_double(0x7ff8000000000000ll);
  if (x == __longlong_as_double(0x7ff0000000000000ll)) return x;
  int e = 0;
  if (x < 2.2250738585072014e-308) { x *= 18014398509481984.0; e = -54; }  // subnormal: * 2^54
  long long bits = __double_as_longlong(x);
  e += static_cast<int>((bits >> 52) & 0x7ff) - 1023;
  double m = __longlong_as_double((bits & 0x000fffffffffffffll) | 0x3ff0000000000000ll);
  if (m > 1.4142135623730951) { m *= 0.5; e += 1; }
  const double t = (m - 1.0) * rcp_f64(m + 1.0);
  const double t2 = t * t;
  double p = 1.0 / 23;
#pragma unroll
  for (int n = 21; n >= 1; n -= 2) p = fma(p, t2, 1.0 / n);
  return fma(static_cast<double>(e), 6.93147180369123816490e-01,
             fma(static_cast<double>(e), 1.90821492927058770002e-10, 2.0 * t * p));
}

// expm1 for |x| < 0.7 (further out exp(x) - 1 cancels nothing): the Taylor series to
// x^TERMS in Horner form, free of out-of-line calls and branches. Double, to x^17
// (truncation below 1e-17; within 3 ulps on 3e5 samples against long double; the library's
// expm1 call spilled a 64-register kernel); float, to x^10 (truncation 1.4e-9 relative;
// within 2.3 ulps of float64 on 2.2e6 points, without the fma, in NumPy; the library's
// expm1f in log_softmax_backward's rare branch spilled 104 bytes of the float16 cluster
// kernel, nvcc 13, sm_90).
template <typename V, int TERMS> __device__ __forceinline__ V expm1_taylor(V x) {
  double f = 1.0;
#pragma unroll
  for (int k = 2; k <= TERMS; ++k) f *= k;  // TERMS!, folded at compile time
  V p = static_cast<V>(1.0 / f);
#pragma unroll
  for (int k = TERMS; k > 1; --k) {
    f /= k;  // (k-1)!
    p = fma(p, x, static_cast<V>(1.0 / f));
  }
  return p * x;
}
__device__ __forceinline__ float expm1_near0(float x) { return expm1_taylor<float, 10>(x); }
__device__ __forceinline__ double expm1_near0(double x) { return expm1_taylor<double, 17>(x); }

template <> struct Math<double> {
  static __device__ __forceinline__ double exp(double x) { return exp_f64(x); }
  static __device__ __forceinline__ double log(double x) { return log_f64(x); }
  static __device__ __forceinline__ double rsqrt(double x) { return ::rsqrt(x); }
  static __device__ __forceinline__ double rcp(double x) { return rcp_f64(x); }
  static __device__ __forceinline__ double max(double a, double b) { return fmax(a, b); }
  static __device__ __forceinline__ double inf() { return __longlong_as_double(0x7ff0000000000000ll); }
};

// 1/sqrt(x) rounded once for all but about 1 input in 5 million (H200: 3 of 2^24 log-uniform
// inputs in [e^-40, e^40] differ from the double result rounded to float, where rsqrtf alone,
// up to 2 ulps off, differs on 22%): rsqrtf and one Newton step on the residual 1 - x y^2,
// with y^2 carried as a float pair so that the step's only rounding is its last. Where y^2
// would leave the normal range, rsqrtf's value.
__device__ __forceinline__ float rsqrt_rn(float x) {
  const float y = ::rsqrtf(x);
  if (!(y > 1e-15f && y < 1e15f)) return y;
  const float yy = y * y;
  const float yy_lo = fmaf(y, y, -yy);
  const float residual = fmaf(-x, yy_lo, fmaf(-x, yy, 1.0f));
  return fmaf(0.5f * y, residual, y);
}
// s / n rounded once (but at near-ties) from inv_n, a reciprocal of n within an ulp or two:
// the quotient s * inv_n corrected by its residual s - q n, which one fma forms exactly. Two
// instructions where s / n also takes a slow-path branch. A non-finite quotient is returned
// as it is. float or double.
template <typename C> __device__ __forceinline__ C div_rn(C s, C n, C inv_n) {
  const C q = s * inv_n;
  if (!(q - q == C(0))) return q;
  return fma(fma(-q, n, s), inv_n, q);
}
// a + b rounded, its rounding error added to err (Knuth's TwoSum: exact for any a, b).
template <typename C> __device__ __forceinline__ C two_sum_into(C a, C b, C& err) {
  const C s = a + b;
  const C bb = s - a;
  err += (a - (s - bb)) + (b - bb);
  return s;
}
// The exponential an output type needs: float32/float64 outputs use the accurate library
// exp (their error budget is 2e-6 / 1e-12 and must not exceed PyTorch's); 16-bit outputs use
// the hardware ex2 approximation (~2 ulp of float, far below 16-bit rounding), which keeps the
// 16-bit kernels memory-bound: they move half the bytes per element of float32.
template <typename C, typename OUT> struct ExpFor {
  static __device__ __forceinline__ C exp(C x) { return Math<C>::exp(x); }
};
template <> struct ExpFor<float, half_t> {
  static __device__ __forceinline__ float exp(float x) { return __expf(x); }
};
template <> struct ExpFor<float, bf16_t> {
  static __device__ __forceinline__ float exp(float x) { return __expf(x); }
};

// a / b for an output type: correctly rounded for float32/float64 outputs (a reciprocal and
// one residual correction: no out-of-line slow path, so no register spills), a single
// multiply by the reciprocal for 16-bit outputs. `inv` is rcp(b), computed once per row.
template <typename C, typename OUT> struct DivFor {
  static __device__ __forceinline__ C div(C a, C b, C inv) {
    const C q = a * inv;
    return fma(inv, fma(-b, q, a), q);
  }
};
template <> struct DivFor<float, half_t> {
  static __device__ __forceinline__ float div(float a, float, float inv) { return a * inv; }
};
template <> struct DivFor<float, bf16_t> {
  static __device__ __forceinline__ float div(float a, float, float inv) { return a * inv; }
};

// a / b and a % b for 0 <= a < 2^52, b > 0 given inv_b = rcp(double(b)): a 64-bit integer
// division is an out-of-line call, whose register spills show in the double kernels.
__device__ __forceinline__ void divmod_i64(i64 a, i64 b, double inv_b, i64* q, i64* r) {
  i64 qq = static_cast<i64>(static_cast<double>(a) * inv_b);
  i64 rr = a - qq * b;
  if (rr < 0) { --qq; rr += b; }
  else if (rr >= b) { ++qq; rr -= b; }
  *q = qq;
  *r = rr;
}

// Accumulator for a row sum of exponentials. A float32 output sums in double: the sum then
// carries no rounding error worth counting and the result is as accurate as its exp and its
// division allow (PyTorch sums in float). 16-bit outputs need no more than float.
template <typename C, typename OUT> struct AccFor { typedef C type; };
template <> struct AccFor<float, float> { typedef double type; };

// Programmatic dependent launch (sm_90+; no-ops below). A kernel calls
// griddep_launch_dependents() once the grid launched after it with programmatic stream
// serialization (cunorm/_pdl.py) may be scheduled, and that kernel calls griddep_wait() before
// it reads anything the first one writes: the wait returns once the first grid has completed
// and its memory is visible. Launched the ordinary way, neither does anything.
__device__ __forceinline__ void griddep_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------
// Packs: N consecutive elements moved as one vector access (16 bytes at most).
template <typename T, int N> struct __align__(sizeof(T) * N) Pack { T v[N]; };

// A pack held as 32-bit words: zeroed and merged with a predicated load word by word, where
// 16-bit elements were merged one by one (a PRMT each). Packs narrower than a word stay as
// they are.
template <typename P, bool WHOLE = sizeof(P) % 4 == 0> struct __align__(alignof(P)) Words {
  unsigned w[sizeof(P) / 4];
};
template <typename P> struct __align__(alignof(P)) Words<P, false> { P p; };
template <typename P> __device__ __forceinline__ Words<P> to_words(const P& p) {
  Words<P> w;
  *reinterpret_cast<P*>(&w) = p;
  return w;
}
template <typename P> __device__ __forceinline__ P from_words(const Words<P>& w) {
  return *reinterpret_cast<const P*>(&w);
}
template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}
// A 16-byte pack loaded with an L2 hint (other packs, and kNone, load plainly).
// kLine: the L2 asked for the whole 128-byte line on a miss (as copy_async takes it): the
// strided path's rows held in registers, whose line neighbours another tile's cluster reads.
// kEvictLast: the L2 told to evict the line last (createpolicy evict_last), as Inductor's
// reduction kernels load a row they read twice: the LOAD functors of the block-wide paths
// (DirectLoad<..., true>; softmax.cu softmax_block_keeps_l2 names the one block kernel left
// plain). Those rows read x once, yet the policy moves them closer to the DRAM's peak. H200,
// every bench cell, one process, the benchmark's timer,
// plain -> kept, last of two rounds, outputs bit-identical (tools/gpu_profile.py l2-keep and
// the .exp sweeps of benchmarks/results/nvidia-h200-2026-11-26-l2-policy-profile.txt), GB/s:
// rms_norm float32 4096 4131 -> 4268, 16384 4177 -> 4333, float16 12288 4113 -> 4263;
// softmax float32 8192 4164 -> 4330; layer_norm float32 4096 4153 -> 4291, float16 32768
// 3771 -> 3854. Of 210 block-wide cells, 106 gained 2-4.5% and 75 0.5-2%; six lost 0.6-1.8%
// (rms_norm 16-bit 32768 columns -1%, its residual form at 16-bit 262144 -1.8%). The same
// gains without the flush and after a read-only flush. The warp path keeps plain loads (up to
// 8% slower with the policy: layer_norm float16 256 columns 2951 -> 2712 GB/s); evict_first
// lost 2-6% and a store policy, either way, nothing. CUNORM_X_L2_KEEP=0 builds every load
// plain (measurement).
#ifndef CUNORM_X_L2_KEEP
#define CUNORM_X_L2_KEEP 1
#endif
enum class L2Hint { kNone, kLine, kEvictLast };
__device__ __forceinline__ unsigned long long l2_evict_last_policy() {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
template <L2Hint HINT, typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack_l2(const T* p) {
  if constexpr (sizeof(Pack<T, N>) != 16 || HINT == L2Hint::kNone) {
    return load_pack<T, N>(p);
  } else {
    Pack<T, N> v;
    unsigned* w = reinterpret_cast<unsigned*>(&v);
    if constexpr (HINT == L2Hint::kLine) {
      asm volatile("ld.global.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
          : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
    } else {
      asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p), "l"(l2_evict_last_policy()));
    }
    return v;
  }
}
template <typename T, int N>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}
// Asks the L2 for the line holding p, without waiting for it or holding a register.
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// A raw pack's N values in compute type C. bfloat16 is the upper half of a float, so with
// WORDS a 32-bit word holding two converts in one instruction a value (the first shifted up,
// the second masked). Element by element, nvcc 13 extracted each upper half (PRMT) before
// shifting it back, two instructions and a register move: the bfloat16 layer_norm cluster
// kernel had 1120 SASS instructions against float16's 832, and 832 this way (sm_90). H200,
// one process against the element-wise sources (tools/gpu_profile.py convert-sources),
// bfloat16 layer_norm with weight and bias 32768 columns 3426 -> 3675 GB/s, 65536 3348 ->
// 3562, 262144 3210 -> 3390, rms_norm 65536 3709 -> 3870, layer_norm with a residual 65536
// 3937 -> 4017; rms_norm 32768 (one block, 64 KB) 3952 -> 3874: 40 registers instead of 45
// let a third 512-thread block in per SM, and two ran faster. The word is formed in PTX:
// written in C++, nvcc took the pair apart again. The rows held in registers on the block
// path (rows.cuh rows_block) convert their loaded packs element by element (WORDS false:
// the 16-value float16 layer_norm kernel spilled at 32 registers with words), and their
// parameters too except in the 16-bit layer_norm kernels. The warp path (64 registers or
// more) and the residual's x + r (ResidualLoad::fetch) convert by words (no spills).
template <typename C, bool WORDS = true, typename T, int N>
__device__ __forceinline__ void pack_to_compute(const Pack<T, N>& p, C* dst) {
  if constexpr (WORDS && IsSame<T, bf16_t>::value && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      unsigned w;
      asm("mov.b32 %0, {%1, %2};" : "=r"(w) : "h"(p.v[2 * i].bits), "h"(p.v[2 * i + 1].bits));
      dst[2 * i] = static_cast<C>(__uint_as_float(w << 16));
      dst[2 * i + 1] = static_cast<C>(__uint_as_float(w & 0xffff0000u));
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) dst[i] = to_compute<C>(p.v[i]);
  }
}

// LOAD functor: N compute values of (row, col..col+N) of a row-major view with a row stride
// (elements). Split in two so kernels can move the bytes early (into registers or, with
// cp.async, straight into shared memory) and convert later: fetch<N> returns the raw pack,
// address() is where it lives, convert<N> turns a raw pack into compute values (a fusion such
// as scale or mask is another functor with this shape, doing its work in convert).
// L2_KEEP: loads under the L2 evict_last policy (load_pack_l2).
template <typename SRC, typename C, bool L2_KEEP = false> struct DirectLoad {
  static constexpr L2Hint kHint = L2_KEEP && CUNORM_X_L2_KEEP ? L2Hint::kEvictLast : L2Hint::kNone;
  typedef SRC raw_t;
  const SRC* src;
  i64 ld;
  __device__ DirectLoad(const SRC* s, i64 l) : src(s), ld(l) {}
  __device__ __forceinline__ const SRC* address(i64 row, i64 col) const { return src + row * ld + col; }
  template <int N> __device__ __forceinline__ Pack<SRC, N> fetch(i64 row, i64 col) const {
    return load_pack_l2<kHint, SRC, N>(address(row, col));
  }
  // Whether fetch comes in two steps (ResidualLoad, below): a plain load writes nothing, so
  // the compiler may already issue a thread's loads together.
  static constexpr bool kStaged = false;
  template <int N, bool WORDS = true>
  __device__ __forceinline__ void convert(const Pack<SRC, N>& p, C* dst, i64, i64) const {
    pack_to_compute<C, WORDS>(p, dst);
  }
  // Start moving the raw pack at (row, col) into shared memory (cp.async: wait before use).
  template <int N> __device__ __forceinline__ void fill(Pack<SRC, N>* dst, i64 row, i64 col) const;
  // The compute value at (row, col), read on its own and written nowhere.
  __device__ __forceinline__ C value(i64 row, i64 col) const { return to_compute<C>(*address(row, col)); }
  // The functor for a second read of the row (the uncached paths): the same one.
  __device__ __forceinline__ const DirectLoad& second() const { return *this; }
};

// A kernel's dynamic shared memory, declared on a 128-byte boundary. It follows the kernel's
// static shared memory (reduction scratch, cluster mail), which ends on a 16-byte boundary:
// where that left the cp.async destinations 16 bytes off the 32-byte sectors of their global
// sources, every 16-byte pack cost two L2 sector reads (ncu, H200, layer_norm float16 (3072,
// 65536): 25.2M L2 sectors read for a 12.6M-sector input, against rms_norm's 12.6M with 192
// bytes of static shared memory). Aligned, softmax float32 (12288, 32768) went from 3732 to
// 4150 GB/s and layer_norm float16 (3072, 65536) from 3550 to 4006
// (benchmarks/results/nvidia-h200-2026-11-22-smem-align-profile.txt).
#define CUNORM_DYNAMIC_SMEM(name) extern __shared__ __align__(128) unsigned char name[]

// Asynchronous global -> shared copy of one pack (sm_80+ cp.async; 4, 8 or 16 bytes), and the
// commit / wait of a group of them. A 2-byte pack is copied through a register instead.
// HINT (16-byte packs), as load_pack_l2's: kLine for walks that read a line's 32-byte sectors
// from several blocks (the strided path's narrow tiles), kEvictLast for the block-wide rows.
// L1: a 16-byte copy cached in L1 too (.ca; AffineStore::stage_params).
template <int BYTES, L2Hint HINT = L2Hint::kNone, bool L1 = false>
__device__ __forceinline__ void copy_async(void* smem_dst, const void* gmem_src) {
  if (BYTES >= 4) {
    const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
    if (BYTES == 16 && L1) {
      asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem_src) : "memory");
    } else if (BYTES == 16 && HINT == L2Hint::kLine) {
      asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;" ::"r"(dst), "l"(gmem_src)
                   : "memory");
    } else if (BYTES == 16 && HINT == L2Hint::kEvictLast) {
      asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(dst),
                   "l"(gmem_src), "l"(l2_evict_last_policy()) : "memory");
    } else if (BYTES == 16) {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem_src) : "memory");
    } else {
      asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(gmem_src), "n"(BYTES)
                   : "memory");
    }
  } else {
    *reinterpret_cast<unsigned short*>(smem_dst) = *reinterpret_cast<const unsigned short*>(gmem_src);
  }
}
// 16 bytes into shared memory (a 32-bit shared address) by cp.async, the first src_bytes (0
// or 16) read from gmem_src and the rest zero-filled: a tile's padding rows and columns cost
// the same instruction as its data.
__device__ __forceinline__ void copy_async_zfill16(unsigned smem_dst, const void* gmem_src,
                                                   unsigned src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
// The same under an L2 cache policy (createpolicy).
__device__ __forceinline__ void copy_async_zfill16(unsigned smem_dst, const void* gmem_src,
                                                   unsigned src_bytes,
                                                   unsigned long long l2_policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;"
               ::"r"(smem_dst), "l"(gmem_src), "r"(src_bytes), "l"(l2_policy)
               : "memory");
}
// L2 policy for bytes a kernel reads once: evict_first (their lines go before any other, so
// a stream through L2 leaves the lines already there, dirty ones included, in place), or
// evict_unchanged (the lines keep whatever priority they had: as a plain load).
__device__ __forceinline__ unsigned long long l2_read_once_policy(bool evict_first) {
  unsigned long long first, unchanged;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(first));
  asm("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;" : "=l"(unchanged));
  return evict_first ? first : unchanged;
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING> __device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}
// The same with `pending` a constant only after unrolling (a loop over N groups): at most
// min(pending, 3) groups left in flight.
template <int N> __device__ __forceinline__ void copy_async_wait_dyn(int pending) {
  if (N > 3 && pending >= 3) {
    copy_async_wait<3>();
  } else if (N > 2 && pending == 2) {
    copy_async_wait<2>();
  } else if (N > 1 && pending == 1) {
    copy_async_wait<1>();
  } else {
    copy_async_wait<0>();
  }
}

template <typename SRC, typename C, bool L2_KEEP>
template <int N>
__device__ __forceinline__ void DirectLoad<SRC, C, L2_KEEP>::fill(Pack<SRC, N>* dst, i64 row,
                                                                 i64 col) const {
  copy_async<sizeof(Pack<SRC, N>), kHint>(dst, address(row, col));
}

// Residual LOAD functor (pre-norm transformer block): h = x + r, rounded to the storage type
// as a framework adding the two tensors would, is written to `h` as it is read, and the kernel
// normalizes h. Every element of x and r is read once and h written once on the paths that
// hold the row; the uncached paths read h back for their second pass (second()).
template <typename SRC, typename C, bool L2_KEEP = false> struct ResidualLoad {
  typedef SRC raw_t;
  DirectLoad<SRC, C, L2_KEEP> x, r;
  SRC* h;
  i64 ldh;
  __device__ ResidualLoad(const SRC* x_, i64 ldx, const SRC* r_, i64 ldr, SRC* h_, i64 ldh_)
      : x(x_, ldx), r(r_, ldr), h(h_), ldh(ldh_) {}
  // fetch in two steps: stage<N> issues the loads, land<N> forms the sum and writes it to h.
  // The store to h orders every later load after it (h might alias x or r as far as the
  // compiler knows; cunorm/norm.py allocates it fresh), so kernels holding several packs
  // stage all of them before landing the first (rows.cuh fetch_packs); fetched one after the
  // other, each pack waited on memory in turn (PTX of norm_warp<half_t, false, true, 8, 32,
  // 32, 1>: ld x, ld r, st h, four times over). The staged packs are held as 32-bit words
  // (Words; fetch_packs zeroes them and fills the valid ones under a test): held as 16-bit
  // elements, ptxas moved each tested pack's halves into the zeroed slots right after its
  // loads, so each next pack's loads waited on memory (sm_90, 16-bit rows of 64 columns: four
  // rows a lane, four round trips instead of one). H200, 49152 rows, one process, three
  // rounds, GB/s, outputs (y and h) bit-identical, three GPUs (benchmarks/results/nvidia-h200-
  // 2026-11-28-session71-staged-words-profile.txt): 16-bit rows of 64 columns +5.3-8.7%
  // (layer_norm float16 2092 -> 2203, bfloat16 2097 -> 2280; rms_norm float16 2155 -> 2280,
  // bfloat16 2108 -> 2280), 96 +4.9-9.8%, 128 +0-5.0%; 32 and 256-1024 columns and float32
  // rows within 0.4%.
  static constexpr bool kStaged = true;
  template <int N> struct Staged { Words<Pack<SRC, N>> a, b; };
  template <int N> __device__ __forceinline__ Staged<N> stage(i64 row, i64 col) const {
    return Staged<N>{to_words(x.template fetch<N>(row, col)),
                     to_words(r.template fetch<N>(row, col))};
  }
  template <int N>
  __device__ __forceinline__ Pack<SRC, N> land(const Staged<N>& s, i64 row, i64 col) const {
    C ca[N], cb[N];
    pack_to_compute<C>(from_words(s.a), ca);
    pack_to_compute<C>(from_words(s.b), cb);
    Pack<SRC, N> sum;
#pragma unroll
    for (int i = 0; i < N; ++i) sum.v[i] = from_compute<SRC>(ca[i] + cb[i]);
    store_pack<SRC, N>(h + row * ldh + col, sum);
    return sum;
  }
  template <int N> __device__ __forceinline__ Pack<SRC, N> fetch(i64 row, i64 col) const {
    return land<N>(stage<N>(row, col), row, col);
  }
  template <int N, bool WORDS = true>
  __device__ __forceinline__ void convert(const Pack<SRC, N>& p, C* dst, i64 row, i64 col) const {
    x.template convert<N, WORDS>(p, dst, row, col);
  }
  // x + r as h holds it (rounded to SRC), without writing h.
  __device__ __forceinline__ C value(i64 row, i64 col) const {
    return to_compute<C>(from_compute<SRC>(x.value(row, col) + r.value(row, col)));
  }
  // Through registers: the sum must be formed before it can be cached.
  template <int N> __device__ __forceinline__ void fill(Pack<SRC, N>* dst, i64 row, i64 col) const {
    *dst = fetch<N>(row, col);
  }
  __device__ __forceinline__ DirectLoad<SRC, C, L2_KEEP> second() const {
    return DirectLoad<SRC, C, L2_KEEP>(h, ldh);
  }
};

// Two floats to a 16-bit pair in one instruction (cvt.rn.{f16,bf16}x2.f32, sm_80+), as the
// 32-bit word holding lo at the lower address.
template <typename T> struct PairFromFloat { static constexpr bool ok = false; };
template <> struct PairFromFloat<half_t> {
  static constexpr bool ok = true;
  static __device__ __forceinline__ unsigned cvt(float lo, float hi) {
    unsigned w;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
    return w;
  }
};
template <> struct PairFromFloat<bf16_t> {
  static constexpr bool ok = true;
  static __device__ __forceinline__ unsigned cvt(float lo, float hi) {
    unsigned w;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(hi), "f"(lo));
#else
    w = FromCompute<bf16_t>::cvt(lo).bits | (static_cast<unsigned>(FromCompute<bf16_t>::cvt(hi).bits) << 16);
#endif
    return w;
  }
};

// STORE functors: store<N>(values, row, col) writes N compute values to (row, col..col+N),
// store_rows<N, R>(values, stride, row, count, col) the same columns of R rows (the first
// `count` of them; the warp path's lane groups hold several rows).
// Each names its per-column parameters Params<N> (empty for DirectStore) and splits its store
// in two, params<N>(col) loading them and store<N>(values, row, col, params) using them, so
// a caller can put parameter loads in flight early: the streaming paths those of several
// packs before the first store (for a functor with kBatchParams: rows.cuh StoreBatch), the
// warp path a short row's with the row (rows.cuh warp_early_params). The compiler cannot move
// a load above an earlier store to y by itself, as y might alias the parameters.
// kParams: whether it has any. with_known_params(f) calls f with the functor, or with one
// whose type says that all its parameters are present (AffineStore with weight and bias, or
// rms_norm's with its weight).
// AffineStore alone has prefetch_params(col), the L1 hint of rows.cuh rows_smem's PREFETCH.
template <typename C, typename DST> struct DirectStore {
  DST* dst;
  i64 ld;
  static constexpr bool kParams = false;
  static constexpr int kKnown = -1;  // no ParamsKnown: nothing to know
  static constexpr bool kBatchParams = false;
  template <int N> struct Params {};
  __device__ DirectStore(DST* d, i64 l) : dst(d), ld(l) {}
  // (WORDS and SPLIT, here and in store: AffineStore's interface; no parameters to load.)
  template <int N, int R, bool WORDS = true, bool SPLIT = true>
  __device__ __forceinline__ void store_rows(const C* src, int stride, i64 row, i64 count,
                                             i64 col) const {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r < count) store<N>(src + r * stride, row + r, col);
    }
  }
  template <class F> __device__ __forceinline__ void with_known_params(const F& f) const { f(*this); }
  template <int N> __device__ __forceinline__ Params<N> params(i64) const { return {}; }
  template <int N>
  __device__ __forceinline__ void store(const C* src, i64 row, i64 col, const Params<N>&) const {
    store<N>(src, row, col);
  }
  template <int N, bool WORDS = true>
  __device__ __forceinline__ void store(const C* src, i64 row, i64 col) const {
    if constexpr (PairFromFloat<DST>::ok && IsSame<C, float>::value && N % 2 == 0) {
      // 16-bit output from float: convert two at a time and store the words.
      Pack<unsigned, N / 2> w;
#pragma unroll
      for (int i = 0; i < N / 2; ++i) w.v[i] = PairFromFloat<DST>::cvt(src[2 * i], src[2 * i + 1]);
      store_pack<unsigned, N / 2>(reinterpret_cast<unsigned*>(dst + row * ld + col), w);
    } else {
      Pack<DST, N> p;
#pragma unroll
      for (int i = 0; i < N; ++i) p.v[i] = from_compute<DST>(src[i]);
      store_pack<DST, N>(dst + row * ld + col, p);
    }
  }
};

// What an AffineStore's type says about its parameters: nothing (each store tests both
// pointers), weight and bias both present, bias absent (rms_norm, which has none; the weight is
// tested), weight present and bias absent.
enum ParamsKnown { kParamsTested, kParamsBoth, kParamsNoBias, kParamsWeight };

// Affine STORE functor (layer_norm / rms_norm): y = v * weight[col] + bias[col], either
// parameter optional (a null pointer; the test is uniform across the block). The parameters
// have the output's storage type and are read as packs; they stay in L1/L2 across rows. KNOWN
// (ParamsKnown): what needs no test. rms_norm's kParamsNoBias drops the bias code from every
// store: its weight-only rows had run the tested form, converting a zero bias per pack.
template <typename C, typename DST, int KNOWN = kParamsTested> struct AffineStore {
  DirectStore<C, DST> out;
  const DST* weight;
  const DST* bias;
  // The raw parameter packs of N columns (unset where the parameter is absent). Batched
  // (rows.cuh StoreBatch) for 4- and 8-byte parameters only: 16-bit rows gained nothing and
  // paid in registers.
  static constexpr bool kParams = true;
  static constexpr bool kBatchParams = sizeof(DST) >= 4;
  template <int N> struct Params { Pack<DST, N> w, b; };
  __device__ AffineStore(DST* d, i64 l, const DST* w, const DST* b) : out(d, l), weight(w), bias(b) {}
  __device__ __forceinline__ bool has_weight() const {
    return KNOWN == kParamsBoth || KNOWN == kParamsWeight || weight != nullptr;
  }
  __device__ __forceinline__ bool has_bias() const {
    return KNOWN == kParamsBoth || (KNOWN == kParamsTested && bias != nullptr);
  }
  // f(functor) with the functor for these parameters: where all are present (weight and bias,
  // or rms_norm's weight), one whose type says so, for a caller that stores many packs (the
  // warp path's row of up to 32 packs a lane, the shared-memory path's 16-bit slice) and so
  // tests their presence once instead of at every pack: sm_90, float16 layer_norm
  // 1024-column warp kernel, 578 instructions a row against Inductor's 342, ~24 a pack of them
  // in the store phase's tests, branches and addresses
  // (benchmarks/results/nvidia-h200-2026-11-23-warp-vs-inductor-profile.txt).
  template <class F> __device__ __forceinline__ void with_known_params(const F& f) const {
    if constexpr (KNOWN == kParamsTested) {
      if (weight != nullptr && bias != nullptr) {
        f(AffineStore<C, DST, kParamsBoth>(out.dst, out.ld, weight, bias));
      } else {
        f(*this);
      }
    } else if constexpr (KNOWN == kParamsNoBias) {
      if (weight != nullptr) {
        f(AffineStore<C, DST, kParamsWeight>(out.dst, out.ld, weight, bias));
      } else {
        f(*this);
      }
    } else {
      f(*this);
    }
  }
  // Ask L1 for the line of each parameter holding column col (a hint: no registers, nothing
  // waits for it); a pack, aligned to its at most 16 bytes, never straddles two lines.
  __device__ __forceinline__ void prefetch_params(i64 col) const {
    if (has_weight()) asm volatile("prefetch.global.L1 [%0];" ::"l"(weight + col));
    if (has_bias()) asm volatile("prefetch.global.L1 [%0];" ::"l"(bias + col));
  }
  static constexpr int kKnown = KNOWN;  // which parameters the type knows present
  // Start copying the parameter packs of column col into shared memory (cp.async through L1,
  // where the block's other warps read the same packs; the caller commits and waits): the
  // weight's into w, the bias's into b (rows.cuh rows_warp STAGE). Through L2 only (.cg) the
  // staged 16-bit layer_norm rows ran 5-31% slower than plain.
  template <int N>
  __device__ __forceinline__ void stage_params(Pack<DST, N>* w, Pack<DST, N>* b, i64 col) const {
    if (has_weight()) copy_async<sizeof(Pack<DST, N>), L2Hint::kNone, true>(w, weight + col);
    if (has_bias()) copy_async<sizeof(Pack<DST, N>), L2Hint::kNone, true>(b, bias + col);
  }
  template <int N> __device__ __forceinline__ Params<N> params(i64 col) const {
    Params<N> prm;
    if (has_weight()) prm.w = load_pack<DST, N>(weight + col);
    if (has_bias()) prm.b = load_pack<DST, N>(bias + col);
    return prm;
  }
  template <int N>
  __device__ __forceinline__ void store(const C* src, i64 row, i64 col, const Params<N>& prm) const {
    // v * w + b in one rounding (fma); an absent parameter is w = 1 or b = 0.
    C w[N], b[N], v[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      w[i] = C(1);
      b[i] = C(0);
    }
    if (has_weight()) pack_to_compute<C>(prm.w, w);
    if (has_bias()) pack_to_compute<C>(prm.b, b);
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = fma(src[i], w[i], b[i]);
    out.template store<N>(v, row, col);
  }
  // The same, loading the parameters here: in the register paths' unrolled stores the form
  // above held every pack's parameters at once (63 -> 93 registers in a float32 block).
  template <int N, bool WORDS = true>
  __device__ __forceinline__ void store(const C* src, i64 row, i64 col) const {
    store_rows<N, 1, WORDS, false>(src, 0, row, 1, col);
  }
  // R rows' N values (row + r from src + r * stride) for the rows r < count, each pack of
  // parameters loaded and converted once for all of them (the warp path's lane groups hold
  // several rows of the same columns). SPLIT: a branch of its own for weight and bias both
  // present, without the defaults' moves and predicated conversions (sm_90: 28 of 599
  // instructions in the float16 256-column warp kernel), for callers that have not split
  // that case off with with_known_params (which spilled the block kernels at 32 registers):
  // the 16-bit layer_norm block kernels (rows.cuh rows_block).
  template <int N, int R, bool WORDS = true, bool SPLIT = true>
  __device__ __forceinline__ void store_rows(const C* src, int stride, i64 row, i64 count,
                                             i64 col) const {
    C w[N], b[N];
    const auto put = [&]() {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < count) {
          C v[N];
#pragma unroll
          for (int i = 0; i < N; ++i) v[i] = fma(src[r * stride + i], w[i], b[i]);
          out.template store<N>(v, row + r, col);
        }
      }
    };
    if (KNOWN == kParamsBoth ||
        (SPLIT && KNOWN == kParamsTested && weight != nullptr && bias != nullptr)) {
      pack_to_compute<C, WORDS>(load_pack<DST, N>(weight + col), w);
      pack_to_compute<C, WORDS>(load_pack<DST, N>(bias + col), b);
      put();
      return;
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      w[i] = C(1);
      b[i] = C(0);
    }
    // (The tests written out: through has_weight() and has_bias() the PTX of 122 norm
    // kernels changed.)
    if (KNOWN == kParamsWeight || weight != nullptr)
      pack_to_compute<C, WORDS>(load_pack<DST, N>(weight + col), w);
    if (KNOWN == kParamsTested && bias != nullptr)
      pack_to_compute<C, WORDS>(load_pack<DST, N>(bias + col), b);
    put();
  }
};

// ---------------------------------------------------------------------------------------
// Reductions. An op is a tiny class R with R::apply(a, b) and R::identity(), so one all-reduce
// template serves max and sum of any type.
// max ignores a NaN operand (one instruction); a NaN in a row still reaches the result through
// the sum of exponentials, exp(NaN - m) = NaN.
template <typename C> struct MaxOp {
  static constexpr bool kCommutes = true;
  static __device__ __forceinline__ C apply(C a, C b) { return Math<C>::max(a, b); }
  static __device__ __forceinline__ C identity() { return -Math<C>::inf(); }
};
template <typename C> struct SumOp {
  static constexpr bool kCommutes = true;
  static __device__ __forceinline__ C apply(C a, C b) { return a + b; }
  static __device__ __forceinline__ C identity() { return C{}; }
};

// Two sums reduced as one value (layer_norm: the deviations from a provisional mean and their
// squares), so they share every shuffle step, barrier and cluster exchange. Trivial, so it
// may live in __shared__ memory; T{} is the zero of both.
template <typename T> struct Sum2 {
  T a, b;
  __device__ __forceinline__ Sum2 operator+(const Sum2& o) const { return {a + o.a, b + o.b}; }
  __device__ __forceinline__ Sum2& operator+=(const Sum2& o) {
    a += o.a;
    b += o.b;
    return *this;
  }
};

template <typename C> __device__ __forceinline__ C shfl_xor(C v, int mask, int width) {
  return __shfl_xor_sync(0xffffffffu, v, mask, width);
}
template <typename T> __device__ __forceinline__ Sum2<T> shfl_xor(Sum2<T> v, int mask, int width) {
  return {shfl_xor(v.a, mask, width), shfl_xor(v.b, mask, width)};
}

// A sum and the rounding error of its additions (TwoSum), as a reduction op over Sum2<P>
// values (value, error): attention's softmax denominators and ClusterMail's compensated fold.
template <typename P> struct CompensatedSumOp {
  static constexpr bool kCommutes = true;  // TwoSum's error is exact, whatever the order
  static __device__ __forceinline__ Sum2<P> apply(Sum2<P> x, Sum2<P> y) {
    P err = x.b + y.b;
    const P s = two_sum_into(x.a, y.a, err);
    return {s, err};
  }
  static __device__ __forceinline__ Sum2<P> identity() { return {P(0), P(0)}; }
};

// All-reduce over groups of GROUP consecutive lanes (GROUP a power of two <= 32), returned in
// every lane: a butterfly whose every step applies R to the lower lane's value first, so both
// lanes of a pair, and every group holding the same values, get the same bits even where R
// is not commutative (CombineOp's merge; a commutative R takes the plain step). Each value
// passes through log2(GROUP) operations, not up to GROUP - 1 as in a chain. ClusterMail's
// kTree folds its slots this way rather than as a tree in each thread, for which ptxas loaded
// all 16 slots of a float64 layer_norm cluster at once (70 -> 108 registers, -21% bandwidth).
template <class R, int GROUP, typename V> __device__ __forceinline__ V group_all_reduce(V v) {
#pragma unroll
  for (int mask = GROUP / 2; mask > 0; mask /= 2) {
    const V other = shfl_xor(v, mask, GROUP);
    if constexpr (R::kCommutes) {
      v = R::apply(v, other);
    } else {
      v = (threadIdx.x & mask) ? R::apply(other, v) : R::apply(v, other);
    }
  }
  return v;
}

// Block-wide all-reduce; blockDim.x is a multiple of 32 and at most 1024. `scratch` holds 33
// values in shared memory. Ends with every thread holding the result; safe to call again
// right after (the trailing barrier protects scratch).
template <class R, typename C>
__device__ __forceinline__ C block_all_reduce(C v, C* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = group_all_reduce<R, 32>(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    C w = lane < nwarps ? scratch[lane] : R::identity();
    w = group_all_reduce<R, 32>(w);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  const C r = scratch[32];
  __syncthreads();
  return r;
}

// ---------------------------------------------------------------------------------------
// Online statistics: states that fold a row in one pass and merge, for the paths that stream
// a row instead of holding it. Each state type S offers init(), add<N>(values, nvalid),
// S::combine(a, b) and shfl_xor(mask, width) (the state of another lane); they share the
// all-reduces below and the cluster mail.
//
// Online softmax: running max m and sum s of exp(x - m), with the exponential of policy E.
// Merging two partial states rescales the sum of the smaller max. Special values follow NumPy:
// a NaN anywhere makes s NaN; an all -inf row keeps m = -inf and s = 0 (the caller's
// exp(x - m) / s then gives NaN); +inf gives exp(inf - inf) = NaN.
template <typename C, typename E = ExpFor<C, C>> struct MaxSum {
  C m, s;
  __device__ __forceinline__ void init() { m = -Math<C>::inf(); s = C(0); }
  // exp(x - m) with -inf contributing exactly 0 even when m is -inf too.
  static __device__ __forceinline__ C term(C x, C m) {
    return x == -Math<C>::inf() ? C(0) : E::exp(x - m);
  }
  // The value a sum's terms exp(x - base) are taken about, for a max m over them: m, or 0
  // where m is -inf. exp(-inf - m) is 0 for any m above -inf, and a max of -inf means every
  // value is -inf (or NaN), whose terms exp(x - 0) are 0 (or NaN): no term tests for -inf.
  static __device__ __forceinline__ C sum_base(C m) { return m == -Math<C>::inf() ? C(0) : m; }
  // Fold N values (padding is -inf, which adds 0): one rescale per chunk, one exp per value.
  template <int N> __device__ __forceinline__ void add(const C* v, int = N) {
    C cm = v[0];
#pragma unroll
    for (int i = 1; i < N; ++i) cm = MaxOp<C>::apply(cm, v[i]);
    if (cm > m) {
      s = s * term(m, cm);
      m = cm;
    }
    const C base = sum_base(m);
#pragma unroll
    for (int i = 0; i < N; ++i) s += E::exp(v[i] - base);
  }
  static __device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
    MaxSum r;
    r.m = MaxOp<C>::apply(a.m, b.m);
    // A side whose max is -inf holds s = 0 (or NaN, which must survive): add it unscaled.
    const C sa = a.m == -Math<C>::inf() ? a.s : a.s * E::exp(a.m - r.m);
    const C sb = b.m == -Math<C>::inf() ? b.s : b.s * E::exp(b.m - r.m);
    r.s = sa + sb;
    return r;
  }
  __device__ __forceinline__ MaxSum shfl_xor(int mask, int width) const {
    MaxSum o;
    o.m = cunorm::shfl_xor(m, mask, width);
    o.s = cunorm::shfl_xor(s, mask, width);
    return o;
  }
};

// Welford / Chan statistics: count n, mean and m2 = sum of squared deviations from the mean,
// in the accumulator type A. A chunk of values is folded exactly (its own mean, then the
// squared deviations from it, both from registers) and merged with Chan's update, so large
// offsets (1e4 + N(0, 1)) never cancel: the variance is never formed as E[x^2] - E[x]^2.
template <typename A> struct MeanM2 {
  A n, mean, m2;
  __device__ __forceinline__ void init() { n = A(0); mean = A(0); m2 = A(0); }
  // Fold the first nvalid of N values.
  template <int N, typename C> __device__ __forceinline__ void add(const C* v, int nvalid) {
    if (nvalid <= 0) return;
    A sum = A(0);
#pragma unroll
    for (int i = 0; i < N; ++i) if (i < nvalid) sum += static_cast<A>(v[i]);
    const A cn = static_cast<A>(nvalid);
    const A cmean = sum * Math<A>::rcp(cn);
    A cm2 = A(0);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const A d = static_cast<A>(v[i]) - cmean;
      if (i < nvalid) cm2 = fma(d, d, cm2);
    }
    MeanM2 c;
    c.n = cn;
    c.mean = cmean;
    c.m2 = cm2;
    *this = combine(*this, c);
  }
  static __device__ __forceinline__ MeanM2 combine(MeanM2 a, MeanM2 b) {
    if (b.n == A(0)) return a;
    if (a.n == A(0)) return b;
    MeanM2 r;
    r.n = a.n + b.n;
    const A wb = b.n * Math<A>::rcp(r.n);  // b's share of the merged count
    const A delta = b.mean - a.mean;
    r.mean = fma(delta, wb, a.mean);
    r.m2 = a.m2 + b.m2 + delta * delta * a.n * wb;
    return r;
  }
  __device__ __forceinline__ MeanM2 shfl_xor(int mask, int width) const {
    MeanM2 o;
    o.n = cunorm::shfl_xor(n, mask, width);
    o.mean = cunorm::shfl_xor(mean, mask, width);
    o.m2 = cunorm::shfl_xor(m2, mask, width);
    return o;
  }
};

// Sum of squares (RMS norm): padding is 0, which adds 0.
template <typename A> struct SumSq {
  A s;
  __device__ __forceinline__ void init() { s = A(0); }
  template <int N, typename C> __device__ __forceinline__ void add(const C* v, int = N) {
#pragma unroll
    for (int i = 0; i < N; ++i) s = fma(static_cast<A>(v[i]), static_cast<A>(v[i]), s);
  }
  static __device__ __forceinline__ SumSq combine(SumSq a, SumSq b) {
    SumSq r;
    r.s = a.s + b.s;
    return r;
  }
  __device__ __forceinline__ SumSq shfl_xor(int mask, int width) const {
    SumSq o;
    o.s = cunorm::shfl_xor(s, mask, width);
    return o;
  }
};
// The states' lane exchange as a free function, as for values (group_all_reduce).
template <typename C, typename E>
__device__ __forceinline__ MaxSum<C, E> shfl_xor(const MaxSum<C, E>& v, int mask, int width) {
  return v.shfl_xor(mask, width);
}
template <typename A>
__device__ __forceinline__ MeanM2<A> shfl_xor(const MeanM2<A>& v, int mask, int width) {
  return v.shfl_xor(mask, width);
}
template <typename A>
__device__ __forceinline__ SumSq<A> shfl_xor(const SumSq<A>& v, int mask, int width) {
  return v.shfl_xor(mask, width);
}

// An online state's merge as a reduction op (group_all_reduce, ClusterMail::exchange).
template <typename S> struct CombineOp {
  static constexpr bool kCommutes = false;
  static __device__ __forceinline__ S apply(const S& a, const S& b) { return S::combine(a, b); }
};

// A states' butterfly whose result is read in lane 0 only (block_all_reduce_state): the merge
// in each lane's own order, without group_all_reduce's operand selects, which made two float32
// uncached cluster kernels spill 12 bytes. Lane 0's bits are group_all_reduce's.
template <int GROUP, typename S>
__device__ __forceinline__ S group_reduce_state_to_lane0(S v) {
#pragma unroll
  for (int mask = GROUP / 2; mask > 0; mask /= 2) v = S::combine(v, v.shfl_xor(mask, GROUP));
  return v;
}

// Block-wide all-reduce of an online state; `scratch` holds 33 states.
template <typename S>
__device__ __forceinline__ S block_all_reduce_state(S v, S* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  v = group_reduce_state_to_lane0<32>(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    S w;
    if (lane < nwarps) w = scratch[lane]; else w.init();
    w = group_reduce_state_to_lane0<32>(w);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
  const S r = scratch[32];
  __syncthreads();
  return r;
}

// ---------------------------------------------------------------------------------------
// Thread-block clusters (sm_90): a row too long for one block's shared memory is split over
// the CLUSTER blocks of a cluster, which exchange partial results through distributed shared
// memory. With CLUSTER == 1 these compile to nothing.
template <int CLUSTER> struct Cluster {
  static __device__ __forceinline__ unsigned rank() {
#if __CUDA_ARCH__ >= 900
    if (CLUSTER > 1) {
      unsigned r;
      asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
      return r;
    }
#endif
    return 0;
  }
  // Full barrier over every thread of the cluster, ordering shared-memory writes before it.
  static __device__ __forceinline__ void sync() {
#if __CUDA_ARCH__ >= 900
    if (CLUSTER > 1) {
      asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
      return;
    }
#endif
    __syncthreads();
  }
  // The same barrier in two halves, for work between them: arrive orders nothing by itself
  // (an mbarrier init is published by its own fence, mail_init); wait acquires.
  static __device__ __forceinline__ void arrive_relaxed() {
#if __CUDA_ARCH__ >= 900
    if (CLUSTER > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
  }
  static __device__ __forceinline__ void wait() {
#if __CUDA_ARCH__ >= 900
    if (CLUSTER > 1) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
  }
  // The shared::cluster address of `local`'s counterpart in block `peer` of the cluster.
  static __device__ __forceinline__ unsigned remote_addr(const void* local, unsigned peer) {
    unsigned remote = static_cast<unsigned>(__cvta_generic_to_shared(local));
#if __CUDA_ARCH__ >= 900
    if (CLUSTER > 1) asm volatile("mapa.shared::cluster.u32 %0, %0, %1;" : "+r"(remote) : "r"(peer));
#endif
    return remote;
  }
};

// A float of a cluster peer's shared memory at `addr` (Cluster::remote_addr), ordered after
// the cluster barrier that published it.
__device__ __forceinline__ float cluster_load(unsigned addr) {
  float v = 0.0f;
#if __CUDA_ARCH__ >= 900
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr) : "memory");
#endif
  return v;
}

// Block-scope mbarriers by 32-bit shared address (smem_addr): mbar_init(bar, count) completes
// a phase after `count` arrivals (mbar_arrive, release semantics; its users publish the init
// with a block barrier); phase k completes with parity k & 1, and a wait for parity 1 before
// the first phase returns at once. mbar_test: whether phase `parity` has completed, without
// waiting; mbar_wait: until it has (both acquire).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ bool mbar_test(unsigned bar, unsigned parity) {
  unsigned done = 1;
#if __CUDA_ARCH__ >= 900
  asm volatile("{\n\t.reg .pred p;\n\t"
               "mbarrier.test_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n\t"
               "selp.u32 %0, 1, 0, p;\n\t}"
               : "=r"(done) : "r"(bar), "r"(parity) : "memory");
#endif
  return done != 0;
}
// CLUSTER: acquire at cluster scope, for ClusterMail, whose peers' posts complete the phase.
// Block scope otherwise: a cluster-scope acquire invalidates the SM's L1 at every wait
// (CCTL.IVALL: 4% of attn_ws's computing warps' stall samples, ncu, H200, bf16 D = 64,
// L = 512; at block scope attn_ws ran 1.1-1.6% faster at D = 64, 0.97-1.02x at D = 128,
// within the base's round-to-round spread there).
template <bool CLUSTER = false> __device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
#if __CUDA_ARCH__ >= 900
  unsigned done = 0;
  do {
    if (CLUSTER) {
      asm volatile("{\n\t.reg .pred p;\n\t"
                   "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                   "selp.u32 %0, 1, 0, p;\n\t}"
                   : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } else {
      asm volatile("{\n\t.reg .pred p;\n\t"
                   "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n\t"
                   "selp.u32 %0, 1, 0, p;\n\t}"
                   : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    }
  } while (!done);
#endif
}
// Named block barriers 1..15 over `threads` threads (a multiple of 32; barrier 0 is
// __syncthreads): bar_sync waits until that many have arrived or synced; bar_arrive counts
// this warp's threads without waiting.
__device__ __forceinline__ void bar_sync(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(unsigned id, unsigned threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// Mail primitives (sm_90), shared by ClusterMail and the strided softmax's row exchange. A
// block's mbarrier (initialized with one arrival) completes a phase once its one thread has
// called mail_expect for the phase and the peers' st.async posts have brought that many bytes;
// the posts may land before the expect.
__device__ __forceinline__ void mail_init(unsigned long long* bar) {
#if __CUDA_ARCH__ >= 900
  mbar_init(smem_addr(bar), 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mail_expect(unsigned long long* bar, unsigned bytes) {
#if __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))), "r"(bytes) : "memory");
#endif
}
// Writes v into block `peer`'s copy of *slot and counts its bytes on the peer's copy of *bar.
template <int CLUSTER, typename V>
__device__ __forceinline__ void mail_post(V* slot, unsigned peer, const V& v, unsigned long long* bar) {
  static_assert(sizeof(V) % 4 == 0, "posted as 32-bit words");
#if __CUDA_ARCH__ >= 900
  const unsigned dst = Cluster<CLUSTER>::remote_addr(slot, peer);
  const unsigned peer_bar = Cluster<CLUSTER>::remote_addr(bar, peer);
  const unsigned* const words = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
  for (int w = 0; w < static_cast<int>(sizeof(V) / 4); ++w) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [%0], %1, [%2];"
                 ::"r"(dst + 4 * w), "r"(words[w]), "r"(peer_bar) : "memory");
  }
#endif
}
// Every thread that reads the mail: wait for phase `parity` (the k-th exchange: k & 1).
__device__ __forceinline__ void mail_wait(unsigned long long* bar, unsigned parity) {
  mbar_wait<true>(smem_addr(bar), parity);
}

// Cluster all-reduce by message (sm_90). Each block posts its block-reduced value to every
// block of the cluster (itself included) with st.async, which counts the bytes on the
// receiving block's mbarrier; a block then waits only until the CLUSTER values addressed to it
// have landed, and every thread folds them in one fixed order (the same bits in every block). It
// replaced a cluster-wide barrier followed by CLUSTER remote loads per thread: on H200 the
// smem-cluster rows of 65536-262144 columns ran 1.18-1.32x faster (softmax float16 262144:
// 3033 -> 3850 GB/s; benchmarks/results/*-cluster-mail-profile.txt).
// Lifetime: open() (thread 0 initializes the mbarrier) at kernel start, then every thread
// calls Cluster::arrive_relaxed(), and Cluster::wait() before the first post: a peer may post
// only to an initialized mbarrier. The k-th exchange (k = 0, 1, ...) waits for phase parity
// k & 1. Slots are rewritten by the next exchange: a caller that exchanges again through the
// same mail (another row) must first pass a Cluster::sync(), so no block still reads them,
// or take two mails in turn with a block-wide barrier between a block's read of an exchange
// and its next post (grad.cu norm_grad_body says why that is enough).
// A block needs no barrier before exit: every post to it completes before its own wait ends.
// A block's mail counter: all of ClusterMail's state but its slots, for a caller that keeps
// them elsewhere (the strided softmax's state rows, in dynamic shared memory).
struct MailBar {
  unsigned long long bar;
  __device__ __forceinline__ void open() { mail_init(&bar); }
};

// How ClusterMail folds a cluster's CLUSTER partial results. kChain: in rank order, one
// value after another (the fewest registers: the butterfly made ptxas spill 8-28 bytes in
// the 16-bit and float32 residual cluster kernels, capped at 32-40 registers, and cost them
// up to 6%). kTree: group_all_reduce, each value through log2(CLUSTER) roundings. kCompensated:
// a sum of doubles as a tree whose additions carry their rounding errors (TwoSum), the error
// of a sum of CLUSTER partial sums left to the final addition; other reductions as kTree.
// The fold's cost is paid once a row; which a kernel uses is its op's kFold, measured there.
enum class Fold { kChain, kTree, kCompensated };

template <typename V, int CLUSTER> struct ClusterMail : MailBar {
  V slot[CLUSTER];
  // All threads: post v (threads 0 .. CLUSTER - 1, one peer each), then the fold of the
  // CLUSTER slots under R once they have all arrived.
  // FOLD: how the slots fold (Fold).
  template <class R, Fold FOLD = Fold::kChain>
  __device__ __forceinline__ V exchange(const V& v, unsigned k) {
    const unsigned rank = Cluster<CLUSTER>::rank();
    if (threadIdx.x == 0) mail_expect(&bar, CLUSTER * static_cast<unsigned>(sizeof(V)));
    if (threadIdx.x < CLUSTER) mail_post<CLUSTER>(&slot[rank], threadIdx.x, v, &bar);
    mail_wait(&bar, k & 1u);
    const V mine = slot[threadIdx.x % CLUSTER];
    if constexpr (FOLD == Fold::kCompensated && IsSame<R, SumOp<double>>::value) {
      const Sum2<V> r = group_all_reduce<CompensatedSumOp<V>, CLUSTER>(Sum2<V>{mine, V(0)});
      return r.a - r.a == V(0) ? r.a + r.b : r.a;  // an infinite sum's error is NaN
    } else if constexpr (FOLD != Fold::kChain) {
      return group_all_reduce<R, CLUSTER>(mine);
    } else {
      V r = slot[0];
#pragma unroll
      for (int p = 1; p < CLUSTER; ++p) r = R::apply(r, slot[p]);
      return r;
    }
  }
};
// The mail of a one-block "cluster": nothing to exchange.
template <typename V> struct ClusterMail<V, 1> {
  __device__ __forceinline__ void open() {}
  template <class R, Fold FOLD = Fold::kChain>
  __device__ __forceinline__ V exchange(const V& v, unsigned) { return v; }
};

// Opens a kernel's mail (the ClusterMail lifetime): thread 0 initializes each mbarrier, then
// every thread arrives on the cluster barrier whose wait must come before the first exchange.
template <int CLUSTER, class... MAIL> __device__ __forceinline__ void open_mail(MAIL&... mail) {
  if (threadIdx.x == 0) (mail.open(), ...);
  Cluster<CLUSTER>::arrive_relaxed();
}

}  // namespace cunorm
