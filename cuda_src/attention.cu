// Fused attention forward, FlashAttention-2 formulation: each block owns a tile of query rows,
// streams the keys and values of one KV head in tiles, keeps a running row max m and row sum
// l of exp(s - m) (online softmax), rescales its output accumulator when m grows and divides
// by l once at the end. The Lq x Lk score matrix never exists outside registers.
//
// Rows. The query rows a KV head serves (its G = Hq / Hkv query heads, Lq rows each) are one
// flattened index r in [0, G * Lq): r -> (g = r / Lq, i = r % Lq), query head kvh * G + g.
// A block's tile may span query heads, so grouped-query attention reads each K/V tile once for
// the whole group (FlashDecoding packs decoding heads the same way), with no copy of K/V.
// Causal: query i sees key j iff j <= i + Lk - Lq (aligned bottom-right).
//
// Kernels (chosen by cunorm/_attn_dispatch.py):
//   attn_tc<T, DP, BN, MW>  float16 / bfloat16 on tensor cores: mma.sync m16n8k16 with float32
//                        accumulation, ldmatrix from swizzled shared memory, cp.async double
//                        buffering of the K/V tiles. 4 warps x 16 * MW query rows; DP = head
//                        dim padded to a multiple of 32, BN keys per tile.
//   attn_simt<T, DPL>    float32 / float64 on the CUDA cores, accumulating in double: one
//                        warp per query row, 8 rows per block sharing each K/V tile.
//   attn_combine<T>      split-KV (FlashDecoding): blocks of one row tile take disjoint key
//                        ranges (gridDim.z splits) and write float32 partial outputs and
//                        log-sum-exps; this kernel merges them, weighting each by exp(lse_s -
//                        lse).
// A fully masked query row (every key masked, or causal with i + Lk - Lq < 0) gives 0 and
// lse = -inf.
namespace cunorm {

// Accumulation type: float on the tensor-core path; double on the SIMT path for float32 too
// (its rounding then stays within 2x of a blocked float32 matmul's even over long rows), which
// is also the type of the split-KV workspace.
template <typename T> struct AttnWork { typedef float type; };
template <> struct AttnWork<float> { typedef double type; };
template <> struct AttnWork<double> { typedef double type; };

constexpr int kMaskNone = 0;  // mask_kind: no mask
constexpr int kMaskBool = 1;  // bool / uint8, nonzero = keep
constexpr int kMaskAdd = 2;   // additive, in the input dtype

#define CUNORM_ATTN_PARAMS                                                                  \
  const T *q, const T *k, const T *v, T *o, float *lse, typename AttnWork<T>::type *o_part,  \
      typename AttnWork<T>::type *lse_part,                                                 \
      const void *mask, int mask_kind, int hkv, int group, i64 lq, i64 lk, int d, int dv,   \
      i64 q_sb, i64 q_sh, i64 q_sl, i64 k_sb, i64 k_sh, i64 k_sl, i64 v_sb, i64 v_sh,       \
      i64 v_sl, i64 o_sb, i64 o_sh, i64 o_sl, i64 lse_sb, i64 lse_sh, i64 lse_sl, i64 m_sb, \
      i64 m_sh, i64 m_sq, i64 m_sk, double scale, int causal, int vec, i64 row_tiles

// Where a block is: its (batch, KV head), first flattened row, key-tile range and split.
struct AttnTile {
  i64 b;
  int kvh;
  i64 r0;     // first flattened row of the tile
  i64 rows;   // G * Lq
  i64 i_min;  // smallest / largest query position i among the tile's valid rows
  i64 i_max;
};

__device__ __forceinline__ AttnTile attn_tile(int hkv, int group, i64 lq, i64 row_tiles, int bm) {
  AttnTile t;
  const i64 bid = blockIdx.x;
  // Heaviest tiles first under a causal mask: the last row tile of a head sees most keys.
  const i64 tile = row_tiles - 1 - bid % row_tiles;
  const i64 bh = bid / row_tiles;
  t.b = bh / hkv;
  t.kvh = static_cast<int>(bh % hkv);
  t.rows = static_cast<i64>(group) * lq;
  t.r0 = tile * bm;
  const i64 r_last = min(t.r0 + bm, t.rows) - 1;
  const bool one_head = t.r0 / lq == r_last / lq;
  t.i_min = one_head ? t.r0 % lq : 0;
  t.i_max = one_head ? r_last % lq : lq - 1;
  return t;
}

// Key tiles [begin, end) of split blockIdx.z, out of the tiles the block's rows can see.
__device__ __forceinline__ void attn_key_range(const AttnTile& t, i64 lq, i64 lk, int causal,
                                               int bn, i64& begin, i64& end) {
  i64 last_key = lk - 1;
  if (causal) last_key = min(last_key, t.i_max + lk - lq);
  const i64 ntiles = last_key < 0 ? 0 : last_key / bn + 1;
  const i64 per = (ntiles + gridDim.z - 1) / gridDim.z;
  begin = min(ntiles, static_cast<i64>(blockIdx.z) * per);
  end = min(ntiles, begin + per);
}

// Whether score (row i, key j) is kept, and its additive bias (log2 units), from the explicit
// mask; keys past Lk and the causal mask are the caller's.
template <typename T>
__device__ __forceinline__ float attn_mask_bias(const void* mask, int kind, i64 off) {
  if (kind == kMaskBool) {
    return static_cast<const unsigned char*>(mask)[off] ? 0.0f : -Math<float>::inf();
  }
  return to_compute<float>(static_cast<const T*>(mask)[off]) * 1.4426950408889634f;
}

// Final or partial output of one query row: y = acc / l and lse = m + log(l) (natural log;
// the caller gives m and l in the units it used). Written to o / lse when the launch has one
// split, else to the float32 workspace of split blockIdx.z.
struct AttnRowOut {
  i64 o_off, lse_off, part_row;  // part_row: row index in the workspace (without the split)
  bool valid;
};

// ---------------------------------------------------------------------------------------
// Tensor-core path (float16 / bfloat16).
template <typename T> struct Mma;
template <> struct Mma<half_t> {
  static __device__ __forceinline__ void run(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<bf16_t> {
  static __device__ __forceinline__ void run(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ void ldsm_x4(unsigned r[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned r[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// A tile of ROWS x DP 16-bit values in shared memory, rows of DP / 8 16-byte chunks. Chunk c
// of row r sits at chunk c ^ (r & SW): the 8 rows an ldmatrix reads at one logical chunk land
// in different banks (SW = 7 when a row has a multiple of 8 chunks, else 3: 2-way conflicts).
template <int DP> struct Swizzle {
  static constexpr int kChunks = DP / 8;
  static constexpr int kMask = kChunks % 8 == 0 ? 7 : 3;
  static __device__ __forceinline__ int offset(int row, int chunk) {  // in elements
    return row * DP + ((chunk ^ (row & kMask)) << 3);
  }
};

// Copy rows [0, nrows) of a tile from global memory (row rr at src + row_off(rr)), columns
// [0, ncols), zero-filling the rest of the ROWS x DP tile. vec: every row start is 16-byte
// aligned and ncols % 8 == 0, so whole chunks go by cp.async (zero-filled by src-size 0).
template <int ROWS, int DP, typename T, class ROWOFF>
__device__ __forceinline__ void attn_load_tile(T* tile, const T* src, const ROWOFF& row_off,
                                               int nrows, int ncols, bool vec) {
  constexpr int kChunks = DP / 8;
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += blockDim.x) {
    const int rr = idx / kChunks;
    const int c = idx % kChunks;
    T* dst = tile + Swizzle<DP>::offset(rr, c);
    const int col = c * 8;
    if (vec) {
      const bool ok = rr < nrows && col < ncols;
      const T* g = ok ? src + row_off(rr) + col : src;
      const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(g), "r"(ok ? 16 : 0)
                   : "memory");
    } else {
      Pack<T, 8> p;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        p.v[e].bits = 0;
        if (rr < nrows && col + e < ncols) p.v[e] = src[row_off(rr) + col + e];
      }
      *reinterpret_cast<Pack<T, 8>*>(dst) = p;
    }
  }
}

// MW m16 row tiles per warp (BM = 64 * MW rows per block): each K and V fragment read from
// shared memory feeds MW mma instructions, so MW = 2 halves the shared-memory traffic per
// FLOP where the registers allow it (head dims up to 128).
template <typename T, int DP, int BN, int MW>
__global__ void __launch_bounds__(128, 1) attn_tc(CUNORM_ATTN_PARAMS) {
  constexpr int BM = 64 * MW;
  constexpr int WM = 16 * MW;  // rows per warp
  constexpr int NB = BN / 8;   // n8 blocks of scores
  constexpr int ND = DP / 8;   // n8 blocks of output
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* const qs = reinterpret_cast<T*>(smem_raw);
  T* const ks = qs + BM * DP;      // 2 stages
  T* const vs = ks + 2 * BN * DP;  // 2 stages
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;

  const AttnTile t = attn_tile(hkv, group, lq, row_tiles, BM);
  i64 tb, te;
  attn_key_range(t, lq, lk, causal, BN, tb, te);
  const T* const kb = k + t.b * k_sb + t.kvh * k_sh;
  const T* const vb = v + t.b * v_sb + t.kvh * v_sh;
  const i64 q_head0 = static_cast<i64>(t.kvh) * group;
  auto q_row = [&](int rr) {
    const i64 r = t.r0 + rr;
    return t.b * q_sb + (q_head0 + r / lq) * q_sh + (r % lq) * q_sl;
  };
  const int q_rows = static_cast<int>(min(static_cast<i64>(BM), t.rows - t.r0));
  attn_load_tile<BM, DP>(qs, q, q_row, q_rows, d, vec != 0);
  auto load_kv = [&](i64 tile, int stage) {
    const i64 n0 = tile * BN;
    const int nk = static_cast<int>(min(static_cast<i64>(BN), lk - n0));
    attn_load_tile<BN, DP>(ks + stage * BN * DP, kb, [&](int rr) { return (n0 + rr) * k_sl; }, nk,
                           d, vec != 0);
    attn_load_tile<BN, DP>(vs + stage * BN * DP, vb, [&](int rr) { return (n0 + rr) * v_sl; }, nk,
                           dv, vec != 0);
  };
  if (tb < te) load_kv(tb, 0);
  copy_async_commit();

  // This thread's rows: in each m16 tile mi, lane / 4 and lane / 4 + 8; their positions i.
  i64 pos[MW][2];
  bool row_ok[MW][2];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i64 r = t.r0 + warp * WM + mi * 16 + lane / 4 + h * 8;
      row_ok[mi][h] = r < t.rows;
      pos[mi][h] = row_ok[mi][h] ? r % lq : 0;
    }
  }
  const float scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  const unsigned qs_addr = static_cast<unsigned>(__cvta_generic_to_shared(qs));
  float acc[MW][ND][4];
  float m[MW][2], l[MW][2];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int j = 0; j < ND; ++j) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.0f;
    m[mi][0] = m[mi][1] = -Math<float>::inf();
    l[mi][0] = l[mi][1] = 0.0f;
  }

  for (i64 tile = tb; tile < te; ++tile) {
    const int stage = static_cast<int>((tile - tb) & 1);
    if (tile + 1 < te) load_kv(tile + 1, stage ^ 1);
    copy_async_commit();
    copy_async_wait<1>();
    __syncthreads();
    const unsigned ks_addr = static_cast<unsigned>(__cvta_generic_to_shared(ks + stage * BN * DP));
    const unsigned vs_addr = static_cast<unsigned>(__cvta_generic_to_shared(vs + stage * BN * DP));

    // S = Q K^T for the warp's rows and the tile's BN keys.
    float s[MW][NB][4];
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int j = 0; j < NB; ++j) s[mi][j][0] = s[mi][j][1] = s[mi][j][2] = s[mi][j][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      unsigned a[MW][4];
#pragma unroll
      for (int mi = 0; mi < MW; ++mi)
        ldsm_x4(a[mi], qs_addr + 2 * Swizzle<DP>::offset(warp * WM + mi * 16 + (lane & 15),
                                                         kk * 2 + (lane >> 4)));
#pragma unroll
      for (int j2 = 0; j2 < NB / 2; ++j2) {
        unsigned bfr[4];
        ldsm_x4(bfr, ks_addr + 2 * Swizzle<DP>::offset(j2 * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                       kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          Mma<T>::run(s[mi][2 * j2], a[mi], bfr[0], bfr[1]);
          Mma<T>::run(s[mi][2 * j2 + 1], a[mi], bfr[2], bfr[3]);
        }
      }
    }

    // Scale to log2 units and mask: keys past Lk, the causal bound, the explicit mask.
    const i64 n0 = tile * BN;
    const bool edge = n0 + BN > lk || mask_kind != kMaskNone ||
                      (causal && n0 + BN - 1 > t.i_min + lk - lq);
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int j = 0; j < NB; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mi][j][e] * scale_log2;
          if (edge) {
            const int h = e >> 1;
            const i64 key = n0 + j * 8 + (lane & 3) * 2 + (e & 1);
            const bool keep = key < lk && (!causal || key <= pos[mi][h] + lk - lq);
            if (keep && mask_kind != kMaskNone && row_ok[mi][h]) {
              const i64 r = t.r0 + warp * WM + mi * 16 + lane / 4 + h * 8;
              const i64 off =
                  t.b * m_sb + (q_head0 + r / lq) * m_sh + pos[mi][h] * m_sq + key * m_sk;
              x += attn_mask_bias<T>(mask, mask_kind, off);
            }
            if (!keep) x = -Math<float>::inf();
          }
          s[mi][j][e] = x;
        }
      }
    }

    // Online softmax: new row max over the quad that shares a row, rescale, exponentiate.
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -Math<float>::inf();
#pragma unroll
        for (int j = 0; j < NB; ++j) mx = fmaxf(mx, fmaxf(s[mi][j][2 * h], s[mi][j][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mi][h], mx);
        const float m_use = m_new == -Math<float>::inf() ? 0.0f : m_new;  // all masked so far
        const float alpha = exp2f(m[mi][h] - m_use);
        m[mi][h] = m_new;
        l[mi][h] *= alpha;
#pragma unroll
        for (int j = 0; j < ND; ++j) {
          acc[mi][j][2 * h] *= alpha;
          acc[mi][j][2 * h + 1] *= alpha;
        }
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          s[mi][j][2 * h] = exp2f(s[mi][j][2 * h] - m_use);
          s[mi][j][2 * h + 1] = exp2f(s[mi][j][2 * h + 1] - m_use);
          l[mi][h] += s[mi][j][2 * h] + s[mi][j][2 * h + 1];
        }
      }
    }

    // O += P V: the score accumulators of two n8 blocks are the A fragment of one k16 step.
#pragma unroll
    for (int kt = 0; kt < BN / 16; ++kt) {
      unsigned a[MW][4];
#pragma unroll
      for (int mi = 0; mi < MW; ++mi) {
        a[mi][0] = PairFromFloat<T>::cvt(s[mi][2 * kt][0], s[mi][2 * kt][1]);
        a[mi][1] = PairFromFloat<T>::cvt(s[mi][2 * kt][2], s[mi][2 * kt][3]);
        a[mi][2] = PairFromFloat<T>::cvt(s[mi][2 * kt + 1][0], s[mi][2 * kt + 1][1]);
        a[mi][3] = PairFromFloat<T>::cvt(s[mi][2 * kt + 1][2], s[mi][2 * kt + 1][3]);
      }
#pragma unroll
      for (int j2 = 0; j2 < ND / 2; ++j2) {
        unsigned bfr[4];
        ldsm_x4_trans(bfr, vs_addr + 2 * Swizzle<DP>::offset(kt * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                             j2 * 2 + (lane >> 4)));
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          Mma<T>::run(acc[mi][2 * j2], a[mi], bfr[0], bfr[1]);
          Mma<T>::run(acc[mi][2 * j2 + 1], a[mi], bfr[2], bfr[3]);
        }
      }
    }
    __syncthreads();  // the next iteration refills this stage
  }
  copy_async_wait<0>();

  // Row sums over the quad, then y = acc / l and lse.
  const bool split = gridDim.z > 1;
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float lsum = l[mi][h];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
      if (!row_ok[mi][h]) continue;
      const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
      const i64 r = t.r0 + warp * WM + mi * 16 + lane / 4 + h * 8;
      const i64 head = q_head0 + r / lq;
      const float row_lse = lsum > 0.0f ? (m[mi][h] + log2f(lsum)) * 0.6931471805599453f
                                        : -Math<float>::inf();
      if (split) {
        const i64 prow = (static_cast<i64>(blockIdx.z) * (gridDim.x / row_tiles) +
                          blockIdx.x / row_tiles) * t.rows + r;
        float* dst = o_part + prow * dv;  // float workspace (AttnWork<T>)
#pragma unroll
        for (int j = 0; j < ND; ++j) {
          const int col = j * 8 + (lane & 3) * 2;
          if (col < dv) dst[col] = acc[mi][j][2 * h] * inv;
          if (col + 1 < dv) dst[col + 1] = acc[mi][j][2 * h + 1] * inv;
        }
        if ((lane & 3) == 0) lse_part[prow] = row_lse;
      } else {
        T* dst = o + t.b * o_sb + head * o_sh + pos[mi][h] * o_sl;
#pragma unroll
        for (int j = 0; j < ND; ++j) {
          const int col = j * 8 + (lane & 3) * 2;
          if (vec && col + 1 < dv) {
            *reinterpret_cast<unsigned*>(dst + col) =
                PairFromFloat<T>::cvt(acc[mi][j][2 * h] * inv, acc[mi][j][2 * h + 1] * inv);
          } else {
            if (col < dv) dst[col] = from_compute<T>(acc[mi][j][2 * h] * inv);
            if (col + 1 < dv) dst[col + 1] = from_compute<T>(acc[mi][j][2 * h + 1] * inv);
          }
        }
        if (lse != nullptr && (lane & 3) == 0)
          lse[t.b * lse_sb + head * lse_sh + pos[mi][h] * lse_sl] = row_lse;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// SIMT path (float32 / float64): one warp per query row, 8 rows per block. Lanes own keys for
// the scores (lane j: the dot product of the row with key j of a 32-key tile held in shared
// memory) and head-dim columns for the output (lane c: columns c, c + 32, ...). DPL = columns
// per lane = ceil(max(D, Dv) / 32).
template <typename T, int DPL>
__global__ void __launch_bounds__(256, 1) attn_simt(CUNORM_ATTN_PARAMS) {
  typedef typename AttnWork<T>::type C;  // double
  constexpr int ROWS = 8;
  constexpr int BN = 32;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ksd = (d % 2 == 0) ? d + 1 : d;  // odd row stride: lanes read distinct banks
  C* const ks = reinterpret_cast<C*>(smem_raw);
  C* const vs = ks + BN * ksd;
  C* const qsh = vs + BN * dv;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;

  const AttnTile t = attn_tile(hkv, group, lq, row_tiles, ROWS);
  i64 tb, te;
  attn_key_range(t, lq, lk, causal, BN, tb, te);
  const i64 r = t.r0 + warp;
  const bool row_ok = r < t.rows;
  const i64 pos = row_ok ? r % lq : 0;
  const i64 head = static_cast<i64>(t.kvh) * group + (row_ok ? r / lq : 0);
  C* const qrow = qsh + warp * d;
  for (int c = lane; c < d; c += 32)
    qrow[c] = row_ok ? static_cast<C>(q[t.b * q_sb + head * q_sh + pos * q_sl + c]) : C(0);
  const T* const kb = k + t.b * k_sb + t.kvh * k_sh;
  const T* const vb = v + t.b * v_sb + t.kvh * v_sh;

  C acc[DPL];
#pragma unroll
  for (int u = 0; u < DPL; ++u) acc[u] = C(0);
  C m = -Math<C>::inf();
  C l = C(0);  // this lane's share of the row sum
  for (i64 tile = tb; tile < te; ++tile) {
    const i64 n0 = tile * BN;
    const int nk = static_cast<int>(min(static_cast<i64>(BN), lk - n0));
    __syncthreads();  // the previous tile is consumed (and qrow written, on the first)
    for (int idx = threadIdx.x; idx < BN * d; idx += blockDim.x) {
      const int j = idx / d, c = idx % d;
      ks[j * ksd + c] = j < nk ? static_cast<C>(kb[(n0 + j) * k_sl + c]) : C(0);
    }
    for (int idx = threadIdx.x; idx < BN * dv; idx += blockDim.x) {
      const int j = idx / dv, c = idx % dv;
      vs[j * dv + c] = j < nk ? static_cast<C>(vb[(n0 + j) * v_sl + c]) : C(0);
    }
    __syncthreads();
    const i64 key = n0 + lane;
    C s = C(0);
    for (int c = 0; c < d; ++c) s = fma(qrow[c], ks[lane * ksd + c], s);
    s *= static_cast<C>(scale);  // scaled once, after the dot product, as q @ k.T * scale
    bool keep = key < lk && (!causal || key <= pos + lk - lq);
    if (keep && mask_kind != kMaskNone && row_ok) {
      const i64 off = t.b * m_sb + head * m_sh + pos * m_sq + key * m_sk;
      if (mask_kind == kMaskBool) {
        keep = static_cast<const unsigned char*>(mask)[off] != 0;
      } else {
        s += static_cast<C>(static_cast<const T*>(mask)[off]);
      }
    }
    if (!keep) s = -Math<C>::inf();
    C mx = s;
#pragma unroll
    for (int w = 16; w > 0; w /= 2) mx = Math<C>::max(mx, __shfl_xor_sync(0xffffffffu, mx, w));
    const C m_new = Math<C>::max(m, mx);
    const C m_use = m_new == -Math<C>::inf() ? C(0) : m_new;
    const C alpha = Math<C>::exp(m - m_use);
    m = m_new;
    const C p = Math<C>::exp(s - m_use);
    l = l * alpha + p;
    // The tile's sum first, then one add to the running sum: rounding grows with 32 + Lk / 32
    // terms instead of Lk (a long decoding row stays within 2x of a blocked matmul's error).
    C part[DPL];
#pragma unroll
    for (int u = 0; u < DPL; ++u) part[u] = C(0);
    for (int j = 0; j < nk; ++j) {
      const C pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int u = 0; u < DPL; ++u) {
        const int c = lane + 32 * u;
        if (c < dv) part[u] = fma(pj, vs[j * dv + c], part[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < DPL; ++u) acc[u] = fma(acc[u], alpha, part[u]);
  }
#pragma unroll
  for (int w = 16; w > 0; w /= 2) l += __shfl_xor_sync(0xffffffffu, l, w);
  if (!row_ok) return;
  const C row_lse = l > C(0) ? m + Math<C>::log(l) : -Math<C>::inf();
  if (gridDim.z > 1) {
    const i64 prow = (static_cast<i64>(blockIdx.z) * (gridDim.x / row_tiles) + blockIdx.x / row_tiles) *
                         t.rows + r;
#pragma unroll
    for (int u = 0; u < DPL; ++u) {
      const int c = lane + 32 * u;
      if (c < dv) o_part[prow * dv + c] = l > C(0) ? acc[u] / l : C(0);
    }
    if (lane == 0) lse_part[prow] = row_lse;
  } else {
    T* dst = o + t.b * o_sb + head * o_sh + pos * o_sl;
#pragma unroll
    for (int u = 0; u < DPL; ++u) {
      const int c = lane + 32 * u;
      if (c < dv) dst[c] = static_cast<T>(l > C(0) ? acc[u] / l : C(0));
    }
    if (lse != nullptr && lane == 0)
      lse[t.b * lse_sb + head * lse_sh + pos * lse_sl] = static_cast<float>(row_lse);
  }
}

// ---------------------------------------------------------------------------------------
// Split-KV merge: one block per flattened row (batch, KV head, r); the splits' partial rows
// weighted by exp(lse_s - lse), lse = log(sum exp(lse_s)), in the compute type (the
// workspace's: float, double for float64). Rows with every split empty or fully masked give
// 0 and -inf.
template <typename T>
__global__ void __launch_bounds__(128) attn_combine(const typename AttnWork<T>::type* o_part,
                                                    const typename AttnWork<T>::type* lse_part,
                                                    int splits, i64 part_rows, T* o, float* lse,
                                                    int hkv, int group, i64 lq, int dv, i64 o_sb,
                                                    i64 o_sh, i64 o_sl, i64 lse_sb, i64 lse_sh,
                                                    i64 lse_sl) {
  typedef typename AttnWork<T>::type P;
  const i64 prow = blockIdx.x;  // (b * hkv + kvh) * (group * lq) + r
  const i64 rows = static_cast<i64>(group) * lq;
  const i64 bh = prow / rows, r = prow % rows;
  const i64 b = bh / hkv, head = (bh % hkv) * group + r / lq, pos = r % lq;
  P mx = -Math<P>::inf();
  for (int s = 0; s < splits; ++s) mx = Math<P>::max(mx, lse_part[s * part_rows + prow]);
  P total = P(0);
  if (mx != -Math<P>::inf()) {
    for (int s = 0; s < splits; ++s) total += Math<P>::exp(lse_part[s * part_rows + prow] - mx);
  }
  const P row_lse = total > P(0) ? mx + Math<P>::log(total) : -Math<P>::inf();
  T* dst = o + b * o_sb + head * o_sh + pos * o_sl;
  for (int c = threadIdx.x; c < dv; c += blockDim.x) {
    P y = P(0);
    if (total > P(0)) {
      for (int s = 0; s < splits; ++s) {
        const P ls = lse_part[s * part_rows + prow];
        if (ls != -Math<P>::inf()) y += Math<P>::exp(ls - row_lse) * o_part[(s * part_rows + prow) * dv + c];
      }
    }
    dst[c] = from_compute<T>(y);
  }
  if (lse != nullptr && threadIdx.x == 0)
    lse[b * lse_sb + head * lse_sh + pos * lse_sl] = static_cast<float>(row_lse);
}

}  // namespace cunorm
