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
//   attn_wg<T, DP, BN, WG>  float16 / bfloat16 on sm_90a: warpgroup MMA (wgmma), WG
//                        warpgroups x 64 query rows, Q / K / V tiles in 128-byte-swizzled
//                        shared memory, S = Q K^T from shared memory, O += P V with P from
//                        registers; the next tile's S and this tile's P V overlap the softmax.
//                        DP = head dim padded to a multiple of 64, BN keys per tile. WG = 1
//                        blocks are compiled for 2 resident per SM. A block takes one row
//                        tile, or several in rounds on a persistent grid (attn_wg_item).
//   attn_tc<T, DP, BN, MW, KS, ST>  float16 / bfloat16 on tensor cores: mma.sync m16n8k16
//                        with float32 accumulation, ldmatrix from swizzled shared memory,
//                        cp.async pipelining of the K/V tiles over ST stages. 4 warps x 16 * MW
//                        query rows (KS = 4: one 16-row tile, each key tile split 4 ways);
//                        DP = head dim padded to a multiple of 32, BN keys per tile.
//   attn_simt<T, DPL>    float32 / float64 on the CUDA cores, accumulating in double: one
//                        warp per query row, 8 rows per block sharing each K/V tile
//                        (float64: a first pass for the row max, compensated sums).
//   attn_combine<T>      split-KV (FlashDecoding): blocks of one row tile take disjoint key
//                        ranges (gridDim.z splits) and write their unnormalized partial
//                        outputs acc_s with the row max m_s and sum l_s; this kernel merges
//                        them: y = sum_s e_s acc_s / sum_s e_s l_s, e_s = exp(m_s - max m).
//                        (Merging through each split's log-sum-exp instead would round
//                        m + log(l) and subtract it again: about |lse| units of error.)
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

// The forward kernels' scalar arguments. A CuPy launch costs ~0.5 us of host time per
// argument (tools/gpu_profile.py launch-cost on an H200: 38 arguments 14-24 us, 8 pointers
// and one struct 6-9 us), so attn_tc and attn_simt (decoding, small problems: host-bound)
// take them as one struct passed by value after the 8 pointers and copy the fields into
// local constants first (CUNORM_ATTN_UNPACK), so the bodies are the same for either form.
// attn_wg keeps plain parameters in the struct's order: on an H200 the struct made it 2.4x
// slower (bf16 D = 128, L = 16384: 184 against 440 TFLOP/s; same registers, no stack, no
// wgmma serialization reported; cause not found). _attn_launch.ATTN_ARGS is the struct as
// a NumPy structured dtype (a CPU test compares the two); _attn_dispatch.packed_args says
// which kernels take it. items: the row tiles, B * Hkv * row_tiles (attn_wg's persistent grids
// take them in rounds). kv_stream: attn_tc / attn_tc_cluster read K/V under L2 evict_first
// (else evict_unchanged; the other kernels ignore it).
struct AttnArgs {
  i64 lq, lk, q_sb, q_sh, q_sl, k_sb, k_sh, k_sl, v_sb, v_sh, v_sl, o_sb, o_sh, o_sl, lse_sb,
      lse_sh, lse_sl, m_sb, m_sh, m_sq, m_sk, row_tiles;
  double scale;
  int mask_kind, hkv, group, d, dv, causal, vec, items, kv_stream;
};

#define CUNORM_ATTN_POINTERS                                                                \
  const T *q, const T *k, const T *v, T *o, float *lse, typename AttnWork<T>::type *o_part,  \
      typename AttnWork<T>::type *stat_part, const void *mask

#define CUNORM_ATTN_PACKED_PARAMS CUNORM_ATTN_POINTERS, const AttnArgs args

#define CUNORM_ATTN_PARAMS                                                                  \
  CUNORM_ATTN_POINTERS, i64 lq, i64 lk, i64 q_sb, i64 q_sh, i64 q_sl, i64 k_sb, i64 k_sh,    \
      i64 k_sl, i64 v_sb, i64 v_sh, i64 v_sl, i64 o_sb, i64 o_sh, i64 o_sl, i64 lse_sb,      \
      i64 lse_sh, i64 lse_sl, i64 m_sb, i64 m_sh, i64 m_sq, i64 m_sk, i64 row_tiles,        \
      double scale, int mask_kind, int hkv, int group, int d, int dv, int causal, int vec,   \
      int items, int kv_stream

#define CUNORM_ATTN_UNPACK                                                                  \
  const i64 lq = args.lq, lk = args.lk, q_sb = args.q_sb, q_sh = args.q_sh, q_sl = args.q_sl, \
            k_sb = args.k_sb, k_sh = args.k_sh, k_sl = args.k_sl, v_sb = args.v_sb,          \
            v_sh = args.v_sh, v_sl = args.v_sl, o_sb = args.o_sb, o_sh = args.o_sh,          \
            o_sl = args.o_sl, lse_sb = args.lse_sb, lse_sh = args.lse_sh,                    \
            lse_sl = args.lse_sl, m_sb = args.m_sb, m_sh = args.m_sh, m_sq = args.m_sq,      \
            m_sk = args.m_sk, row_tiles = args.row_tiles;                                    \
  const double scale = args.scale;                                                          \
  const int mask_kind = args.mask_kind, hkv = args.hkv, group = args.group, d = args.d,     \
            dv = args.dv, causal = args.causal, vec = args.vec;                              \
  (void)vec /* attn_simt has no 16-byte path */

// Where a block is: its (batch, KV head), first flattened row, key-tile range and split.
struct AttnTile {
  i64 b;
  int kvh;
  i64 r0;     // first flattened row of the tile
  i64 rows;   // G * Lq
  i64 g0;     // query head (within the group) of row r0
  i64 i_min;  // smallest / largest query position i among the tile's valid rows
  i64 i_max;
  bool one_head;  // every valid row in query head g0 (then i_min = r0 % Lq)

  // The query head (within the group) and position of valid row r: with FAST, no division
  // where the tile lies in one head. (A 64-bit division is a call of about 70 instructions;
  // a computing thread of attn_ws made about 10 a row tile.) The kernels with the explicit
  // mask's code pass FAST = false: the tile's fields kept live for it spilled attn_ws and
  // attn_wg at D = 128 (ptxas sm_90a: 4-68 bytes).
  template <bool FAST = true> __device__ __forceinline__ i64 head_of(i64 r, i64 lq) const {
    return FAST && one_head ? g0 : r / lq;
  }
  template <bool FAST = true> __device__ __forceinline__ i64 pos_of(i64 r, i64 lq) const {
    return FAST && one_head ? r - r0 + i_min : r % lq;
  }
};

// item: the row tile's index in [0, B * Hkv * row_tiles), the block index of a launch with one
// block per row tile (a persistent attn_wg block takes several, attn_wg_item).
__device__ __forceinline__ AttnTile attn_tile(int hkv, int group, i64 lq, i64 row_tiles, int bm,
                                              unsigned item) {
  AttnTile t;
  // fewer than 2^31 row tiles: the tile's coordinates in 32-bit division
  const unsigned bid = item, tiles = static_cast<unsigned>(row_tiles);
  const unsigned bh = bid / tiles;
  // Heaviest tiles first under a causal mask: the last row tile of a head sees most keys.
  const i64 tile = static_cast<i64>(tiles - 1 - (bid - bh * tiles));
  t.b = bh / static_cast<unsigned>(hkv);
  t.kvh = static_cast<int>(bh - static_cast<unsigned>(t.b) * hkv);
  t.rows = static_cast<i64>(group) * lq;
  t.r0 = tile * bm;
  const i64 r_last = min(t.r0 + bm, t.rows) - 1;
  t.g0 = t.r0 / lq;
  const i64 g_last = r_last / lq;
  t.one_head = t.g0 == g_last;
  t.i_min = t.one_head ? t.r0 - t.g0 * lq : 0;
  t.i_max = t.one_head ? r_last - g_last * lq : lq - 1;
  return t;
}

// The last key query position i sees: Lk - 1, and under the causal mask (aligned bottom-right)
// at most i + Lk - Lq (negative: none). Keys past it are masked.
__device__ __forceinline__ i64 attn_last_key(i64 i, i64 lq, i64 lk, int causal) {
  return causal ? min(lk - 1, i + lk - lq) : lk - 1;
}

// Key tiles [begin, end) of split blockIdx.z, out of the tiles the block's rows can see.
__device__ __forceinline__ void attn_key_range(const AttnTile& t, i64 lq, i64 lk, int causal,
                                               int bn, i64& begin, i64& end) {
  const i64 last_key = attn_last_key(t.i_max, lq, lk, causal);
  const i64 ntiles = last_key < 0 ? 0 : last_key / bn + 1;
  const i64 per = (ntiles + gridDim.z - 1) / gridDim.z;
  begin = min(ntiles, static_cast<i64>(blockIdx.z) * per);
  end = min(ntiles, begin + per);
}

// An additive mask's value in log2 units.
template <typename T> __device__ __forceinline__ float attn_bias_log2(T value) {
  return to_compute<float>(value) * 1.4426950408889634f;
}

// Where results go: the output and lse of a launch with one split, else the float32 / float64
// workspace of split blockIdx.z (row (split * B * Hkv + b * Hkv + kvh) * G * Lq + r): the
// unnormalized output row in o_part, (row max in natural-log units, row sum) in stat_part.
template <typename T> struct AttnOut {
  T* o;
  float* lse;
  typename AttnWork<T>::type* o_part;
  typename AttnWork<T>::type* stat_part;
  i64 o_sb, o_sh, o_sl, lse_sb, lse_sh, lse_sl, row_tiles;
  int dv;
  bool vec;

  // One query row from the tensor-core fragment layout: this thread holds columns
  // 8j + 2 (lane % 4) + {0, 1} of flattened row r in acc[4j + 2h], acc[4j + 2h + 1] (j < ND),
  // the row max m in log2 units and its share l of the row sum; the lane quad that shares the
  // row adds the shares, so every lane must call (ok = false for rows past the tile's end).
  template <int ND, bool FAST = true>
  __device__ __forceinline__ void tc_row(const float* acc, int h, float m, float l, i64 r, bool ok,
                                         const AttnTile& t, int group, i64 lq) const {
    const int lane = threadIdx.x & 31;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (!ok) return;
    // (l == 0: a fully masked row, 0; a NaN l, from a NaN score, stays NaN in out and lse)
    const float inv = l == 0.0f ? 0.0f : 1.0f / l;
    if (gridDim.z > 1) {
      const i64 prow =
          (static_cast<i64>(blockIdx.z) * (gridDim.x / row_tiles) + blockIdx.x / row_tiles) * t.rows + r;
      float* dst = o_part + prow * dv;  // float workspace (AttnWork<T>)
#pragma unroll
      for (int j = 0; j < ND; ++j) {
        const int col = j * 8 + (lane & 3) * 2;
        if (col < dv) dst[col] = acc[4 * j + 2 * h];
        if (col + 1 < dv) dst[col + 1] = acc[4 * j + 2 * h + 1];
      }
      if ((lane & 3) == 0) {
        stat_part[2 * prow] = l > 0.0f ? m * 0.6931471805599453f : -Math<float>::inf();
        stat_part[2 * prow + 1] = l;
      }
      return;
    }
    T* const dst = row_out<FAST>(t, group, lq, r);
#pragma unroll
    for (int j = 0; j < ND; ++j) {
      const int col = j * 8 + (lane & 3) * 2;
      const float y0 = acc[4 * j + 2 * h] * inv, y1 = acc[4 * j + 2 * h + 1] * inv;
      if (vec && col + 1 < dv) {
        *reinterpret_cast<unsigned*>(dst + col) = PairFromFloat<T>::cvt(y0, y1);
      } else {
        if (col < dv) dst[col] = from_compute<T>(y0);
        if (col + 1 < dv) dst[col + 1] = from_compute<T>(y1);
      }
    }
    if ((lane & 3) == 0) row_lse<FAST>(t, group, lq, r, m, l);
  }
  // The output row of flattened row r of tile t (query head kvh * G + r / Lq, position r % Lq).
  template <bool FAST = true>
  __device__ __forceinline__ T* row_out(const AttnTile& t, int group, i64 lq, i64 r) const {
    return o + t.b * o_sb + (static_cast<i64>(t.kvh) * group + t.head_of<FAST>(r, lq)) * o_sh +
           t.pos_of<FAST>(r, lq) * o_sl;
  }
  // Its lse, if asked for, from the row max m (log2 units) and row sum l: -inf for l = 0.
  template <bool FAST = true>
  __device__ __forceinline__ void row_lse(const AttnTile& t, int group, i64 lq, i64 r, float m,
                                          float l) const {
    if (lse == nullptr) return;
    lse[t.b * lse_sb + (static_cast<i64>(t.kvh) * group + t.head_of<FAST>(r, lq)) * lse_sh +
        t.pos_of<FAST>(r, lq) * lse_sl] =
        l == 0.0f ? -Math<float>::inf() : (m + log2f(l)) * 0.6931471805599453f;
  }
};

#define CUNORM_ATTN_OUT \
  AttnOut<T> { o, lse, o_part, stat_part, o_sb, o_sh, o_sl, lse_sb, lse_sh, lse_sl, row_tiles, dv, vec != 0 }

// 2^x on the special-function unit alone (exp2f adds a range check and two multiplies per
// call for inputs below -126, whose results flush to 0 here: the probabilities are rounded
// to 16 bits, where such values are 0 anyway). 2^-inf = 0.
__device__ __forceinline__ float attn_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// How far (log2 units) a row's scores may exceed its reference max before the warpgroup
// kernels move it (AttnScores::softmax_step's LAZY): probabilities up to 2^8.
constexpr float kLazyRescale = 8.0f;

// Scores of the tensor-core paths (mma.sync and wgmma share the fragment layout): this
// thread holds, for its rows r0 and r0 + 8 (h = 0, 1) of an m16 row tile, keys
// n0 + 8j + 2 (lane % 4) + {0, 1} in s[4j + 2h], s[4j + 2h + 1] (j < NB), and the output
// columns likewise in acc[4j + 2h + {0, 1}] (j < ND).
template <typename T> struct AttnScores {
  const void* mask;
  int mask_kind, causal;
  i64 lq, lk, m_sb, m_sh, m_sq, m_sk;
  int group;
  float scale_log2;

  // Whether a key tile needs per-score masking: it runs past the last key the tile's first row
  // sees (past Lk, or across its causal bound), or an explicit mask exists.
  __device__ __forceinline__ bool edge(const AttnTile& t, i64 n0, int bn) const {
    return mask_kind != kMaskNone || cut(t, n0, bn);
  }
  // Whether Lk or the causal bound of some row of the tile falls among keys n0 .. n0 + bn - 1
  // (t.i_min: the tile's first query position, whose bound comes first).
  __device__ __forceinline__ bool cut(const AttnTile& t, i64 n0, int bn) const {
    return n0 + bn - 1 > attn_last_key(t.i_min, lq, lk, causal);
  }

  // How many of a row's keys from c0 on, out of this thread's 8 NB of a tile, are not past
  // Lk or its causal bound: one 32-bit limit a row.
  template <int NB> __device__ __forceinline__ int key_limit(i64 pos, i64 c0) const {
    const i64 last = attn_last_key(pos, lq, lk, causal);
    return static_cast<int>(max(static_cast<i64>(0), min(last - c0 + 1, static_cast<i64>(8 * NB))));
  }

  // Scale to log2 units, mask, then one online-softmax step: the new row max over the lane quad
  // that shares a row, alpha = exp2(m_old - m_new), l = l * alpha + sum(s), s = exp2(s - m_new).
  // The caller rescales its output accumulator by alpha (rescale()).
  // FOLD (scale_log2 > 0: the planner's condition for the kernels that pass it): the scores
  // stay unscaled, the row max is scaled once (c max(s) = max(c s) for c > 0) and the scale
  // folds into the exponent, exp2(fma(s, c, -m_new)): one instruction a score fewer. A tile
  // through the explicit mask's path is scaled there (its bias adds in log2 units), c = 1.
  //
  // LAZY (with FOLD: the warpgroup kernels): m is a row's reference, not its running max. It
  // moves only where the row's scores exceed it by more than kLazyRescale (log2 units), so the
  // probabilities stay below 2^kLazyRescale (fp32 holds them exactly enough, a 16-bit P keeps
  // its relative precision, and out = acc / l and lse = m + log2 l hold for any reference).
  // Past the first key tiles it rarely moves: alpha is exactly 1 for the whole warp, which
  // then skips the rescale of its accumulator (WgRows::step).
  template <int NB, bool FOLD = false, bool LAZY = false>
  __device__ __forceinline__ void softmax_step(float* s, float m[2], float l[2], float alpha[2],
                                               const AttnTile& t, i64 r0, const bool ok[2],
                                               const i64 pos[2], i64 n0, bool edge) const {
    static_assert(FOLD || !LAZY, "the lazy reference is for the folded warpgroup kernels");
    const int lane = threadIdx.x & 31;
    float mul = FOLD ? scale_log2 : 1.0f;  // what the scores still need multiplying by
    if (edge && mask_kind == kMaskNone) {
      // Keys past Lk and the causal bound only: each row keeps a prefix of the tile, so one
      // 32-bit limit a row against the score's column. Through the general form below (64-bit
      // key arithmetic and the explicit mask's code at every score) the causal kernels were
      // bound by instruction fetch: ncu on H200, bf16 D = 64, L = 512, one warpgroup, put 4.7
      // of the 8.3 cycles between a warp's instructions on fetching them (non-causal: 4.5
      // cycles in all), and the limit took that launch from 75 to 136 TFLOP/s.
      const i64 c0 = n0 + (lane & 3) * 2;  // this thread's first key in the tile
      int lim[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) lim[h] = key_limit<NB>(pos[h], c0);
#pragma unroll
      for (int j = 0; j < NB; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float x = FOLD ? s[4 * j + e] : s[4 * j + e] * scale_log2;
          s[4 * j + e] = j * 8 + (e & 1) < lim[e >> 1] ? x : -Math<float>::inf();
        }
      }
    } else if (NB >= 16 && edge && m_sk == 1 && (mask_kind == kMaskBool || !cut(t, n0, 8 * NB))) {
      // An explicit mask, contiguous along the keys: each row's mask offset once a tile (its
      // query head is a 64-bit division, ~70 instructions, which the general form below
      // leaves at every score), then the mask's values at constant offsets from it, the loads
      // predicated: 2.7-5.6x the general form's speed (H200, bf16, D = 64 and 128). The
      // strides pass through an empty asm so that no part of the offsets is hoisted out of
      // the key loop to stay live across it. The kernels sit at the register limit, and
      // ptxas spilled 80-1300 bytes for forms that select after each load (a score past the
      // causal bound taken out whatever its value: so an additive mask takes this form only on
      // tiles that no row's causal bound or Lk cuts, the tile's every key then seen by every
      // row, and keys past lim lie past the rows of the tile; their values never count), that
      // read aligned pairs as one word, or (4 bytes) on the 64-key tiles of head dims above
      // 128, which keep the general form.
      i64 lq_here = lq, sb = m_sb, sh = m_sh, sq = m_sq;
      asm volatile("" : "+l"(lq_here), "+l"(sb), "+l"(sh), "+l"(sq));
      const i64 c0 = n0 + (lane & 3) * 2;  // this thread's first key in the tile
      // (a row past the tile's rows reads nothing: its head may lie past the mask's)
      int lim[2];
      i64 row_at[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        lim[h] = ok[h] ? key_limit<NB>(pos[h], c0) : 0;
        const i64 head = static_cast<i64>(t.kvh) * group + (r0 + h * 8) / lq_here;
        row_at[h] = t.b * sb + head * sh + pos[h] * sq + c0;
      }
      if (mask_kind == kMaskBool) {
        const unsigned char* row[2] = {static_cast<const unsigned char*>(mask) + row_at[0],
                                       static_cast<const unsigned char*>(mask) + row_at[1]};
#pragma unroll
        for (int j = 0; j < NB; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = j * 8 + (e & 1);
            const bool keep = col < lim[e >> 1] && row[e >> 1][col];
            s[4 * j + e] = keep ? s[4 * j + e] * scale_log2 : -Math<float>::inf();
          }
        }
      } else {
        const T* row[2] = {static_cast<const T*>(mask) + row_at[0],
                           static_cast<const T*>(mask) + row_at[1]};
#pragma unroll
        for (int j = 0; j < NB; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = j * 8 + (e & 1);
            const float bias = col < lim[e >> 1] ? attn_bias_log2(row[e >> 1][col]) : -Math<float>::inf();
            s[4 * j + e] = s[4 * j + e] * scale_log2 + bias;
          }
        }
      }
      mul = 1.0f;
    } else if (edge) {  // an explicit mask, any strides
      const i64 last[2] = {attn_last_key(pos[0], lq, lk, causal),
                           attn_last_key(pos[1], lq, lk, causal)};
#pragma unroll
      for (int j = 0; j < NB; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[4 * j + e] * scale_log2;
          const int h = e >> 1;
          const i64 key = n0 + j * 8 + (lane & 3) * 2 + (e & 1);
          bool keep = key <= last[h];
          if (keep && ok[h]) {
            const i64 r = r0 + h * 8;
            const i64 head = static_cast<i64>(t.kvh) * group + r / lq;
            const i64 off = t.b * m_sb + head * m_sh + pos[h] * m_sq + key * m_sk;
            // a bool mask selects (a NaN score it drops, from an unwritten KV-cache slot say,
            // stays out, as in the contiguous form above); an additive one adds
            if (mask_kind == kMaskBool) {
              keep = static_cast<const unsigned char*>(mask)[off] != 0;
            } else {
              x += attn_bias_log2(static_cast<const T*>(mask)[off]);
            }
          }
          s[4 * j + e] = keep ? x : -Math<float>::inf();
        }
      }
      mul = 1.0f;
    } else if (!FOLD) {
#pragma unroll
      for (int i = 0; i < 4 * NB; ++i) s[i] *= scale_log2;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -Math<float>::inf();
#pragma unroll
      for (int j = 0; j < NB; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * h], s[4 * j + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx *= mul;  // (1 without FOLD or on a mask-path tile)
      // (LAZY: -inf + kLazyRescale is -inf, so the first unmasked score always moves it)
      const float m_new = LAZY ? (mx > m[h] + kLazyRescale ? mx : m[h]) : fmaxf(m[h], mx);
      const float m_use = m_new == -Math<float>::inf() ? 0.0f : m_new;  // all masked so far
      alpha[h] = attn_exp2(m[h] - m_use);  // exactly 1 where the reference stays
      m[h] = m_new;
      l[h] *= alpha[h];
#pragma unroll
      for (int j = 0; j < NB; ++j) {
        // (fma(s, 1, -m) is s - m exactly)
        s[4 * j + 2 * h] = attn_exp2(fmaf(s[4 * j + 2 * h], mul, -m_use));
        s[4 * j + 2 * h + 1] = attn_exp2(fmaf(s[4 * j + 2 * h + 1], mul, -m_use));
        l[h] += s[4 * j + 2 * h] + s[4 * j + 2 * h + 1];
      }
    }
  }
};

// acc[4j + 2h + {0, 1}] *= alpha[h]: the output of rows h = 0, 1 follows their new max.
// SKIP: the warp skips it where every alpha of its lanes is exactly 1 (once the row maxima,
// or the warpgroup kernels' lazy references, settle: most tiles), so every lane must call.
template <int ND, bool SKIP = false>
__device__ __forceinline__ void attn_rescale(float* acc, const float alpha[2]) {
  if (SKIP && !__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
  for (int j = 0; j < ND; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[4 * j + e] *= alpha[e >> 1];
  }
}

// KIND: the mask kind the kernel handles (mask_kind, or kMaskNone in a kernel built without
// the explicit mask's code)
#define CUNORM_ATTN_SCORES(KIND)                                                           \
  AttnScores<T> { mask, KIND, causal, lq, lk, m_sb, m_sh, m_sq, m_sk, group,              \
                  static_cast<float>(scale * 1.4426950408889634) }

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
  static constexpr int kRowStride = DP;  // offset(r + 8n, c) = offset(r, c) + 8n * kRowStride
  static __device__ __forceinline__ int offset(int row, int chunk) {  // in elements
    return row * DP + ((chunk ^ (row & kMask)) << 3);
  }
};

// Copy rows [0, nrows) of a tile from global memory (row rr at src + row_off(rr)), columns
// [0, ncols), zero-filling the rest of the ROWS x DP tile; 16-byte chunk c of row rr goes to
// LAYOUT::offset(rr, c) (Swizzle for ldmatrix, Sw128 for wgmma). vec: every row start is 16-byte
// aligned and ncols % 8 == 0, so whole chunks go by cp.async (zero-filled by src-size 0).
template <int ROWS, int DP, class LAYOUT, int THREADS, typename T, class ROWOFF>
__device__ __forceinline__ void attn_load_tile(T* tile, const T* src, const ROWOFF& row_off,
                                               int nrows, int ncols, bool vec) {
  constexpr int kChunks = DP / 8;
#pragma unroll 1  // the general path: rolled, it keeps few registers live (attn_ws's loader)
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += THREADS) {
    const int rr = idx / kChunks;
    const int c = idx % kChunks;
    T* dst = tile + LAYOUT::offset(rr, c);
    const int col = c * 8;
    if (vec) {
      const bool ok = rr < nrows && col < ncols;
      const T* g = ok ? src + row_off(rr) + col : src;
      const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
      copy_async_zfill16(s, g, ok ? 16 : 0);
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

// attn_load_tile for rows at a fixed stride (K and V tiles: row rr at src + rr * ld), by
// THREADS threads. When the threads cover whole rows and step by a multiple of 8 rows (so
// the swizzle of a thread's chunk never changes), each thread keeps one chunk column and
// walks down the tile with two pointer increments per 16-byte cp.async; otherwise, or
// without 16-byte alignment, the general loop.
template <int ROWS, int DP, class LAYOUT, int THREADS, typename T>
__device__ __forceinline__ void attn_load_rows(T* tile, const T* src, i64 ld, int nrows, int ncols,
                                               bool vec) {
  constexpr int kChunks = DP / 8;
  constexpr int kStep = THREADS / kChunks;  // rows between a thread's chunks
  if constexpr (THREADS % kChunks == 0 && kStep % 8 == 0 && ROWS % kStep == 0) {
    if (vec) {
      const int c = threadIdx.x % kChunks;
      const int r = threadIdx.x / kChunks;
      const T* g = src + r * ld + c * 8;
      unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(tile + LAYOUT::offset(r, c)));
      const bool col_ok = c * 8 < ncols;
#pragma unroll
      for (int i = 0; i < ROWS / kStep; ++i) {
        const bool ok = col_ok && r + i * kStep < nrows;
        copy_async_zfill16(dst, ok ? g : src, ok ? 16 : 0);
        g += kStep * ld;
        dst += kStep * LAYOUT::kRowStride * static_cast<int>(sizeof(T));
      }
      return;
    }
  }
  attn_load_tile<ROWS, DP, LAYOUT, THREADS>(tile, src, [&](int rr) { return rr * ld; }, nrows, ncols, vec);
}

// A thread's share of the K (or V) tiles of one (batch, KV head) for attn_tc: rows at stride
// ld from base, columns [0, ncols). attn_load_rows recomputes every chunk's address and row
// and column bounds per tile: ~95 instructions per tile and operand in a 128-thread block at
// DP = 128 (SASS, sm_90), a third of the decoding kernel's loop. The loader fixes the thread's
// chunk column, shared-memory offset and column bound once, so a full tile costs a pointer
// increment per cp.async; a partial tile (the last one) or unaligned rows go the general way.
// HINTED: the full tiles' copies carry an L2 policy (l2_read_once_policy): attn_tc's, whose
// launches may read K/V once.
template <int ROWS, int DP, class LAYOUT, int THREADS, typename T, bool HINTED = false>
struct AttnTileLoader {
  static constexpr int kChunks = DP / 8;
  static constexpr int kStep = THREADS / kChunks;  // rows between a thread's chunks
  static constexpr bool kFast = THREADS % kChunks == 0 && kStep % 8 == 0 && ROWS % kStep == 0;
  const T* base;
  const T* thread_src;  // row threadIdx / kChunks; its chunk, or column 0 past ncols
  i64 ld;
  int ncols, dst_off;
  unsigned bytes;       // 16, or 0 past ncols (zero-filled)
  bool vec;
  unsigned long long l2_policy;  // HINTED only

  __device__ __forceinline__ AttnTileLoader(const T* base_, i64 ld_, int ncols_, bool vec_,
                                            unsigned long long l2_policy_ = 0)
      : base(base_), ld(ld_), ncols(ncols_), vec(vec_), l2_policy(l2_policy_) {
    const int c = threadIdx.x % kChunks, r = threadIdx.x / kChunks;
    const bool col_ok = c * 8 < ncols;
    thread_src = base + r * ld + (col_ok ? c * 8 : 0);
    dst_off = LAYOUT::offset(r, c);
    bytes = col_ok ? 16u : 0u;
  }

  // Rows [n0, n0 + nrows) into tile (zero-filling rows past nrows).
  __device__ __forceinline__ void load(T* tile, i64 n0, int nrows) const {
    if constexpr (kFast) {
      if (vec && nrows == ROWS) {
        const T* g = thread_src + n0 * ld;
        const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(tile + dst_off));
#pragma unroll
        for (int i = 0; i < ROWS / kStep; ++i) {
          const unsigned d = dst + i * kStep * LAYOUT::kRowStride * static_cast<int>(sizeof(T));
          if constexpr (HINTED) {
            copy_async_zfill16(d, g, bytes, l2_policy);
          } else {
            copy_async_zfill16(d, g, bytes);
          }
          g += kStep * ld;
        }
        return;
      }
    }
    attn_load_rows<ROWS, DP, LAYOUT, THREADS>(tile, base + n0 * ld, ld, nrows, ncols, vec);
  }
};

// The block's Q tile (rows r0 .. r0 + nrows - 1 into tile, zero-filled past nrows): rows of one
// query head sit at a fixed stride, so they take attn_load_rows' pointer walk; a tile that
// spans heads (grouped queries, Lq below the tile) maps each row to its head and position.
template <int BM, int DP, class LAYOUT, int THREADS, typename T>
__device__ __forceinline__ void attn_load_q(T* tile, const T* q, const AttnTile& t, i64 lq,
                                            int group, i64 q_sb, i64 q_sh, i64 q_sl, int nrows,
                                            int ncols, bool vec) {
  const i64 head0 = static_cast<i64>(t.kvh) * group;
  if (t.one_head) {
    attn_load_rows<BM, DP, LAYOUT, THREADS>(
        tile, q + t.b * q_sb + (head0 + t.g0) * q_sh + t.i_min * q_sl, q_sl, nrows, ncols, vec);
    return;
  }
  attn_load_tile<BM, DP, LAYOUT, THREADS>(
      tile, q, [&](int rr) {
        const i64 r = t.r0 + rr;
        return t.b * q_sb + (head0 + r / lq) * q_sh + (r % lq) * q_sl;
      },
      nrows, ncols, vec);
}

// The end of a clustered key split (attn_tc_cluster): every block of the cluster holds the
// unnormalized state of the row tile's 16 rows over its key range (warp 0, `mine`: acc in the
// fragment layout of AttnOut::tc_row, the row max m in log2 units, this lane's share of the
// row sum l). Each block posts it to `state` (its own shared memory, [16][DP + 2] floats: the
// columns, m, the row sum), and after a cluster barrier block c merges columns
// [c DP / CM, (c + 1) DP / CM) of every row from all CM posts, as attn_combine merges the
// workspace: y = sum_s e_s acc_s / sum_s e_s l_s, e_s = 2^(m_s - max m). Block 0 writes lse.
// A second barrier keeps each block's post alive until its peers have read it. Every thread
// of the block must call (the barriers are the cluster's).
template <typename T, int DP, int ND, int CM>
__device__ __forceinline__ void attn_cluster_merge(float* state, const float* acc, const float* m,
                                                   const float* l, bool mine, const AttnTile& t,
                                                   int group, i64 lq, const AttnOut<T>& out) {
  static_assert(DP % CM == 0, "a block merges DP / CM columns");
  constexpr int SW = DP + 2;
  constexpr int CW = DP / CM;
  const int lane = threadIdx.x & 31;
  if (mine) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      float* const row = state + (lane / 4 + 8 * h) * SW;
#pragma unroll
      for (int j = 0; j < ND; ++j) {
        const int col = j * 8 + (lane & 3) * 2;
        row[col] = acc[4 * j + 2 * h];
        row[col + 1] = acc[4 * j + 2 * h + 1];
      }
      if ((lane & 3) == 0) {
        row[DP] = m[h];
        row[DP + 1] = sum;
      }
    }
  }
  Cluster<CM>::sync();
  const unsigned rank = Cluster<CM>::rank();
  for (int idx = threadIdx.x; idx < 16 * CW; idx += blockDim.x) {
    const int rr = idx / CW, col = static_cast<int>(rank) * CW + idx % CW;
    const i64 r = t.r0 + rr;
    if (r >= t.rows) continue;
    const float* const row = state + rr * SW;
    float ms[CM];
    float mx = -Math<float>::inf();
#pragma unroll
    for (int c = 0; c < CM; ++c) {
      ms[c] = cluster_load(Cluster<CM>::remote_addr(row + DP, c));
      mx = fmaxf(mx, ms[c]);
    }
    const float m_use = mx == -Math<float>::inf() ? 0.0f : mx;
    float sum = 0.0f, y = 0.0f;
#pragma unroll
    for (int c = 0; c < CM; ++c) {
      const float e = attn_exp2(ms[c] - m_use);
      sum += e * cluster_load(Cluster<CM>::remote_addr(row + DP + 1, c));
      y += e * cluster_load(Cluster<CM>::remote_addr(row + col, c));
    }
    if (col < out.dv) out.row_out(t, group, lq, r)[col] = from_compute<T>(sum == 0.0f ? 0.0f : y / sum);
    if (rank == 0 && idx % CW == 0) out.row_lse(t, group, lq, r, mx, sum);
  }
  Cluster<CM>::sync();
}

// MW m16 row tiles per warp (BM = 64 * MW rows per block): each K and V fragment read from
// shared memory feeds MW mma instructions, so MW = 2 halves the shared-memory traffic per
// FLOP where the registers allow it (head dims up to 128).
// KS = 4 (decoding: at most 16 query rows per KV head): the four warps share one m16 row tile
// and split each key tile instead, warp w taking keys [w BN / 4, (w + 1) BN / 4), and merge
// their (max, sum, output) at the end. Each warp then does a quarter of the MMA and softmax
// work per tile (with KS = 1 three warps would compute on padding rows), so a block spends
// its time waiting on K/V loads, and the 16-row Q tile leaves room for more blocks per SM.
// ST stages of K/V tiles: ST - 1 tiles are in flight while the block computes on one.
// CM > 1 (attn_tc_cluster): the gridDim.z = CM key splits of a row tile are one thread-block
// cluster, which merges them through distributed shared memory (attn_cluster_merge) instead of
// the workspace and attn_combine.
template <typename T, int DP, int BN, int MW, int KS, int ST, int CM>
__device__ __forceinline__ void attn_tc_rows(CUNORM_ATTN_PACKED_PARAMS) {
  CUNORM_ATTN_UNPACK;
  griddep_launch_dependents();  // a key split's attn_combine may wait on the SMs (attn_combine)
  static_assert(KS == 1 || (KS == 4 && MW == 1), "key split: 4 warps on one m16 row tile");
  static_assert(CM == 1 || KS == 4, "a cluster merges the key splits of decoding rows");
  static_assert(ST >= 2, "at least double buffering");
  constexpr int BM = 64 * MW / KS;
  constexpr int WM = 16 * MW;       // rows per warp
  constexpr int WN = BN / KS;       // keys per warp and tile
  constexpr int NB = WN / 8;        // n8 blocks of scores
  constexpr int ND = DP / 8;        // n8 blocks of output
  static_assert(WN % 16 == 0, "a warp's keys are whole k16 steps of P V");
  CUNORM_DYNAMIC_SMEM(smem_raw);
  T* const qs = reinterpret_cast<T*>(smem_raw);
  T* const ks = qs + BM * DP;       // ST stages
  T* const vs = ks + ST * BN * DP;  // ST stages
  const int lane = threadIdx.x & 31;
  const int warp = KS == 1 ? threadIdx.x >> 5 : 0;  // the warp's m16 row tile(s)
  const int kw = KS == 1 ? 0 : threadIdx.x >> 5;    // its share of each key tile

  const AttnTile t = attn_tile(hkv, group, lq, row_tiles, BM, blockIdx.x);
  i64 tb, te;
  attn_key_range(t, lq, lk, causal, BN, tb, te);
  const T* const kb = k + t.b * k_sb + t.kvh * k_sh;
  const T* const vb = v + t.b * v_sb + t.kvh * v_sh;
  const int q_rows = static_cast<int>(min(static_cast<i64>(BM), t.rows - t.r0));
  attn_load_q<BM, DP, Swizzle<DP>, 128>(qs, q, t, lq, group, q_sb, q_sh, q_sl, q_rows, d, vec != 0);
  // Where one row tile holds every query row of a (batch, KV head) (decoding: the key-split
  // kernels, and KS = 1 rows of up to 64), a block is the only reader of its K/V tiles:
  // kv_stream (_attn_dispatch.kv_stream) then reads them under L2 evict_first.
  const unsigned long long kv_policy = l2_read_once_policy(args.kv_stream != 0);
  const AttnTileLoader<BN, DP, Swizzle<DP>, 128, T, true> k_loader(kb, k_sl, d, vec != 0,
                                                                   kv_policy);
  const AttnTileLoader<BN, DP, Swizzle<DP>, 128, T, true> v_loader(vb, v_sl, dv, vec != 0,
                                                                   kv_policy);
  auto load_kv = [&](i64 tile, int stage) {
    const i64 n0 = tile * BN;
    const int nk = static_cast<int>(min(static_cast<i64>(BN), lk - n0));
    k_loader.load(ks + stage * BN * DP, n0, nk);
    v_loader.load(vs + stage * BN * DP, n0, nk);
  };
  // One commit group per tile (the Q tile rides with the first), empty past the range, so
  // "all but the newest ST - 2 groups done" always means "this tile has landed".
#pragma unroll
  for (int i = 0; i < ST - 1; ++i) {
    if (tb + i < te) load_kv(tb + i, i);
    copy_async_commit();
  }

  // This thread's rows: in each m16 tile mi, lane / 4 and lane / 4 + 8; their positions i.
  i64 pos[MW][2];
  bool row_ok[MW][2];
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i64 r = t.r0 + warp * WM + mi * 16 + lane / 4 + h * 8;
      row_ok[mi][h] = r < t.rows;
      pos[mi][h] = row_ok[mi][h] ? t.pos_of(r, lq) : 0;
    }
  }
  const AttnScores<T> scores = CUNORM_ATTN_SCORES(mask_kind);
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
    const int stage = static_cast<int>((tile - tb) % ST);
    copy_async_wait<ST - 2>();
    // Publishes this tile, and every warp is past the previous one, whose stage refills now.
    __syncthreads();
    {
      const i64 next = tile + ST - 1;
      if (next < te) load_kv(next, static_cast<int>((next - tb) % ST));
      copy_async_commit();
    }
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
        ldsm_x4(bfr, ks_addr + 2 * Swizzle<DP>::offset(kw * WN + j2 * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                       kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          Mma<T>::run(s[mi][2 * j2], a[mi], bfr[0], bfr[1]);
          Mma<T>::run(s[mi][2 * j2 + 1], a[mi], bfr[2], bfr[3]);
        }
      }
    }

    const i64 n0 = tile * BN + kw * WN;  // the warp's first key
    const bool edge = scores.edge(t, n0, WN);
#pragma unroll
    for (int mi = 0; mi < MW; ++mi) {
      const i64 r0 = t.r0 + warp * WM + mi * 16 + lane / 4;
      float alpha[2];
      scores.template softmax_step<NB>(&s[mi][0][0], m[mi], l[mi], alpha, t, r0, row_ok[mi],
                                       pos[mi], n0, edge);
      // (skipped by a warp whose alphas are all 1: decoding spent 4 * ND multiplies a tile on it)
      attn_rescale<ND, true>(&acc[mi][0][0], alpha);
    }

    // O += P V: the score accumulators of two n8 blocks are the A fragment of one k16 step.
#pragma unroll
    for (int kt = 0; kt < WN / 16; ++kt) {
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
        ldsm_x4_trans(bfr, vs_addr + 2 * Swizzle<DP>::offset(kw * WN + kt * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                             j2 * 2 + (lane >> 4)));
#pragma unroll
        for (int mi = 0; mi < MW; ++mi) {
          Mma<T>::run(acc[mi][2 * j2], a[mi], bfr[0], bfr[1]);
          Mma<T>::run(acc[mi][2 * j2 + 1], a[mi], bfr[2], bfr[3]);
        }
      }
    }
  }
  copy_async_wait<0>();

  if constexpr (KS > 1) {
    // Merge the warps' states into warp 0 through the (now idle) K tiles: each lane holds the
    // same rows and columns in every warp, so states merge lane by lane, each rescaled to the
    // largest max: acc = sum_w acc_w 2^(m_w - M), likewise the lane's share of the row sum.
    __syncthreads();
    float* const xch = reinterpret_cast<float*>(ks);  // [warp - 1][4 ND + 4][32]
    constexpr int kVals = 4 * ND + 4;
    if (kw > 0) {
      float* const mine = xch + (kw - 1) * kVals * 32 + lane;
#pragma unroll
      for (int e = 0; e < 4 * ND; ++e) mine[e * 32] = (&acc[0][0][0])[e];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mine[(4 * ND + h) * 32] = m[0][h];
        mine[(4 * ND + 2 + h) * 32] = l[0][h];
      }
    }
    __syncthreads();
    if (CM == 1 && kw > 0) return;
    if (CM == 1 || kw == 0) {  // (the cluster merge below needs every warp)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = m[0][h];
#pragma unroll
        for (int w = 1; w < KS; ++w) mx = fmaxf(mx, xch[((w - 1) * kVals + 4 * ND + h) * 32 + lane]);
        const float m_use = mx == -Math<float>::inf() ? 0.0f : mx;
        const float self = attn_exp2(m[0][h] - m_use);
        l[0][h] *= self;
#pragma unroll
        for (int j = 0; j < ND; ++j) {
          acc[0][j][2 * h] *= self;
          acc[0][j][2 * h + 1] *= self;
        }
#pragma unroll
        for (int w = 1; w < KS; ++w) {
          const float* const other = xch + (w - 1) * kVals * 32 + lane;
          const float f = attn_exp2(other[(4 * ND + h) * 32] - m_use);
          l[0][h] += f * other[(4 * ND + 2 + h) * 32];
#pragma unroll
          for (int j = 0; j < ND; ++j) {
            acc[0][j][2 * h] += f * other[(4 * j + 2 * h) * 32];
            acc[0][j][2 * h + 1] += f * other[(4 * j + 2 * h + 1) * 32];
          }
        }
        m[0][h] = mx;
      }
    }
  }

  const AttnOut<T> out = CUNORM_ATTN_OUT;
  if constexpr (CM > 1) {
    attn_cluster_merge<T, DP, ND, CM>(reinterpret_cast<float*>(vs), &acc[0][0][0], m[0], l[0],
                                      kw == 0, t, group, lq, out);
    return;
  }
#pragma unroll
  for (int mi = 0; mi < MW; ++mi) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
      out.template tc_row<ND>(&acc[mi][0][0], h, m[mi][h], l[mi][h],
                              t.r0 + warp * WM + mi * 16 + lane / 4 + h * 8, row_ok[mi][h], t, group, lq);
  }
}

template <typename T, int DP, int BN, int MW, int KS, int ST>
__global__ void __launch_bounds__(128, 1) attn_tc(CUNORM_ATTN_PACKED_PARAMS) {
  attn_tc_rows<T, DP, BN, MW, KS, ST, 1>(q, k, v, o, lse, o_part, stat_part, mask, args);
}

#ifdef CUNORM_SM90
// Decoding rows (KS = 4) whose CM key splits form a cluster (gridDim.z == CM): no workspace, no
// attn_combine launch (cunorm/_attn_dispatch.py tc_cluster).
template <typename T, int DP, int BN, int ST, int CM>
__global__ void __cluster_dims__(1, 1, CM) __launch_bounds__(128, 1)
    attn_tc_cluster(CUNORM_ATTN_PACKED_PARAMS) {
  attn_tc_rows<T, DP, BN, 1, 4, ST, CM>(q, k, v, o, lse, o_part, stat_part, mask, args);
}
#endif

// ---------------------------------------------------------------------------------------
// Warpgroup tensor-core path (float16 / bfloat16 on sm_90a: wgmma). Compiled only where the
// source is built for the arch-specific sm_90a target (CUNORM_SM90A, see _kernels.py).
//
// Shared-memory tiles use wgmma's 128-byte swizzle: a ROWS x DP tile is DP / 64 column blocks
// of ROWS rows x 128 bytes, and 16-byte chunk c of a row sits at chunk c ^ (row % 8) within
// its 128-byte line (the pattern repeats every 8 rows = 1024 bytes from a 1024-byte aligned
// base). Q and K are read K-major (head dim contiguous); V is read N-major through the same
// layout (its rows are keys, the reduction dim of P V).
template <int ROWS> struct Sw128 {
  static constexpr int kRowStride = 64;  // offset(r + 8n, c) = offset(r, c) + 8n * kRowStride
  static __device__ __forceinline__ int offset(int row, int chunk) {  // in elements
    return ((chunk >> 3) * ROWS + row) * 64 + (((chunk & 7) ^ (row & 7)) << 3);
  }
};

#if defined(CUNORM_SM90A)
// Matrix descriptor of a swizzled (128-byte) shared-memory operand: start address, leading
// and stride byte offsets (K-major: lbo unused, sbo = 1024 between 8-row groups; N-major:
// lbo = bytes between 64-column blocks, sbo = 1024 between 8-row groups of the K dim), kept
// as its two 32-bit words. Every shared address lies below 2^18 (228 KB at most on sm_90),
// so the start field (address / 16, 14 bits) never carries into the lbo field and the
// descriptor of an operand `off` bytes further is one 32-bit add (at()). Built in place for
// each wgmma, the masking, shift and merge cost ~5 instructions each, 12 a key tile at
// D = 64, issued while the warpgroup holds its MMA turn.
struct WgDesc {
  unsigned lo, hi;
  __device__ __forceinline__ WgDesc(unsigned addr, unsigned lbo, unsigned sbo)
      : lo((addr >> 4) | (((lbo >> 4) & 0x3FFF) << 16)), hi(((sbo >> 4) & 0x3FFF) | (1u << 30)) {}
  __device__ __forceinline__ unsigned long long at(unsigned off) const {
    return (static_cast<unsigned long long>(hi) << 32) | (lo + (off >> 4));
  }
};
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of wgmma operand registers across issue / wait, and
// keeps registers that an in-flight wgmma reads (its A fragments) live until the wait: were
// they reused earlier, ptxas would have to wait for the wgmma before the reuse.
template <int N> __device__ __forceinline__ void wg_pin(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void wg_pin(unsigned* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}
// Shared memory written by the threads (cp.async, stores) becomes visible to wgmma's async
// proxy; each writing thread fences before the barrier that publishes the tile.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

#define CUNORM_F32(o)                                                                          \
  "+f"(d[o + 0]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]),  \
  "+f"(d[o + 6]), "+f"(d[o + 7]), "+f"(d[o + 8]), "+f"(d[o + 9]), "+f"(d[o + 10]),                 \
  "+f"(d[o + 11]), "+f"(d[o + 12]), "+f"(d[o + 13]), "+f"(d[o + 14]), "+f"(d[o + 15]),             \
  "+f"(d[o + 16]), "+f"(d[o + 17]), "+f"(d[o + 18]), "+f"(d[o + 19]), "+f"(d[o + 20]),             \
  "+f"(d[o + 21]), "+f"(d[o + 22]), "+f"(d[o + 23]), "+f"(d[o + 24]), "+f"(d[o + 25]),             \
  "+f"(d[o + 26]), "+f"(d[o + 27]), "+f"(d[o + 28]), "+f"(d[o + 29]), "+f"(d[o + 30]),             \
  "+f"(d[o + 31])
#define CUNORM_R32                                                                           \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
  "%25,%26,%27,%28,%29,%30,%31}"
#define CUNORM_R64                                                                           \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24," \
  "%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"   \
  "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

// D (64 x N, float) (+)= A (64 x 16) B (16 x N), for one warpgroup. ss: A and B from shared
// memory, both K-major. rs: A from registers (the accumulator layout of a previous wgmma,
// converted to 16-bit pairs), B N-major. accumulate = 0 overwrites D.
template <typename T, int N> struct Wgmma;
#define CUNORM_WGMMA(TYPE, TSTR)                                                                  \
  template <> struct Wgmma<TYPE, 64> {                                                           \
    static __device__ __forceinline__ void ss(float* d, unsigned long long a, unsigned long long b, \
                                              int accumulate) {                                  \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                   \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." TSTR "." TSTR " " CUNORM_R32     \
                   ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                              \
                   : CUNORM_F32(0)                                                                \
                   : "l"(a), "l"(b), "r"(accumulate));                                            \
    }                                                                                             \
    static __device__ __forceinline__ void rs(float* d, const unsigned a[4], unsigned long long b) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                  \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." TSTR "." TSTR " " CUNORM_R32     \
                   ", {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n"                                  \
                   : CUNORM_F32(0)                                                                \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                 \
    }                                                                                             \
  };                                                                                              \
  template <> struct Wgmma<TYPE, 128> {                                                          \
    static __device__ __forceinline__ void ss(float* d, unsigned long long a, unsigned long long b, \
                                              int accumulate) {                                  \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                   \
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32." TSTR "." TSTR " " CUNORM_R64    \
                   ", %64, %65, p, 1, 1, 0, 0;\n}\n"                                              \
                   : CUNORM_F32(0), CUNORM_F32(32)                                                \
                   : "l"(a), "l"(b), "r"(accumulate));                                            \
    }                                                                                             \
    static __device__ __forceinline__ void rs(float* d, const unsigned a[4], unsigned long long b) { \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                  \
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32." TSTR "." TSTR " " CUNORM_R64    \
                   ", {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"                                  \
                   : CUNORM_F32(0), CUNORM_F32(32)                                                \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));                 \
    }                                                                                             \
  };
CUNORM_WGMMA(half_t, "f16")
CUNORM_WGMMA(bf16_t, "bf16")
#undef CUNORM_WGMMA
#undef CUNORM_F32
#undef CUNORM_R32
#undef CUNORM_R64
#endif  // CUNORM_SM90A

#if defined(CUNORM_SM90A)
// One warpgroup's 64 query rows in attn_wg and attn_ws: the shared-memory addresses of its
// wgmma operands (its Q rows, the K and V stages), the scores S of a key tile, their
// probabilities P (16-bit A fragments, one per k16 slice of the keys), the output accumulator
// and the online-softmax state of this thread's rows r0 and r0 + 8 (AttnScores' layout).
// BM: the block's query rows (the Q tile's column-block stride). MK: the kernel has the
// explicit mask's code (AttnTile::head_of's FAST = !MK).
template <typename T, int DP, int BN, int BM, bool MK> struct WgRows {
  static constexpr int NB = BN / 8;  // n8 blocks of scores
  static constexpr int ND = DP / 8;  // n8 blocks of output
  static constexpr int ON = DP % 128 == 0 ? 128 : 64;  // output columns per P V instruction
  // A lazy reference max (AttnScores::softmax_step's LAZY) where the MMAs bound the kernel: at
  // D = 128 it skips the rescale of most tiles, +0-3% (H200, bf16, 16k tokens, same process);
  // at D = 64, bound by the softmax, it cost 2-6%: its warp vote and branch sit on the path
  // from the exponentials to the next MMAs (a vote ahead of the exponentials: 8-9%).
  static constexpr bool kLazy = DP >= 128;
  unsigned q_addr, k_addr, v_addr;
  float s[BN / 2];
  unsigned p[BN / 16][4];
  float acc[DP / 2];
  float m[2], l[2], alpha[2];
  i64 r0;
  bool row_ok[2];
  i64 pos[2];

  // A row tile's start: warp w of the warpgroup's block (w / 4: its warpgroup) owns rows
  // 16 w .. 16 w + 15 of tile t.
  __device__ __forceinline__ void start(const AttnTile& t, i64 lq, int warp) {
    r0 = t.r0 + warp * 16 + (threadIdx.x & 31) / 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_ok[h] = r0 + 8 * h < t.rows;
      pos[h] = row_ok[h] ? t.pos_of<!MK>(r0 + 8 * h, lq) : 0;
    }
    m[0] = m[1] = -Math<float>::inf();
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int i = 0; i < DP / 2; ++i) acc[i] = 0.0f;
  }
  // S = Q K^T of the tile in K stage `stage` (issued, not waited).
  __device__ __forceinline__ void qk(int stage) {
    wg_pin<BN / 2>(s);
    wg_fence();
    const WgDesc qd(q_addr, 16, 1024), kd(k_addr + stage * BN * DP * 2, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < DP / 16; ++kk) {
      const unsigned col = (kk & 3) * 32;  // byte offset of the k16 slice in a 128-byte line
      Wgmma<T, BN>::ss(s, qd.at((kk >> 2) * BM * 128 + col), kd.at((kk >> 2) * BN * 128 + col), kk > 0);
    }
    wg_commit();
  }
  __device__ __forceinline__ void to_p() {
#pragma unroll
    for (int kt = 0; kt < BN / 16; ++kt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) p[kt][e] = PairFromFloat<T>::cvt(s[8 * kt + 2 * e], s[8 * kt + 2 * e + 1]);
    }
  }
  // O += P V with V in stage `stage` (issued, not waited).
  __device__ __forceinline__ void pv(int stage) {
    wg_pin<DP / 2>(acc);
    wg_fence();
    const WgDesc vd(v_addr + stage * BN * DP * 2, BN * 128, 1024);
#pragma unroll
    for (int kt = 0; kt < BN / 16; ++kt) {
#pragma unroll
      for (int n = 0; n < DP / ON; ++n) {
        Wgmma<T, ON>::rs(acc + n * (ON / 2), p[kt], vd.at(kt * 16 * 128 + n * (ON / 64) * BN * 128));
      }
    }
    wg_commit();
  }
  // P of a row tile's first key tile (keys from n0), its S issued: s_done() runs once S is in.
  template <class DONE>
  __device__ __forceinline__ void first(const AttnScores<T>& scores, const AttnTile& t, i64 n0,
                                        DONE s_done) {
    wg_wait<0>();
    wg_pin<BN / 2>(s);
    s_done();
    scores.template softmax_step<NB, true, kLazy>(s, m, l, alpha, t, r0, row_ok, pos, n0,
                                                  scores.edge(t, n0, BN));
    to_p();
  }
  // With S of the next key tile (keys from n0) and this tile's P V issued, in that order: the
  // softmax of the new S, then the output rescaled once P V is done, and P of the new S.
  // s_done() and pv_done() run as each completes.
  template <class S_DONE, class PV_DONE>
  __device__ __forceinline__ void step(const AttnScores<T>& scores, const AttnTile& t, i64 n0,
                                       S_DONE s_done, PV_DONE pv_done) {
    wg_wait<1>();
    wg_pin<BN / 2>(s);
    s_done();
    scores.template softmax_step<NB, true, kLazy>(s, m, l, alpha, t, r0, row_ok, pos, n0,
                                                  scores.edge(t, n0, BN));
    // Pin the softmax results before the wait so the compiler front end keeps the source
    // order. (ptxas still schedules its wgmma wait ahead of the row maxima and exponentials,
    // so the softmax runs after P V. Behind a never-taken warp-uniform branch the wait stays
    // below them, and every attn_wg kernel measured the same: attention profile record,
    // section 12.)
    wg_pin<BN / 2>(s);
    wg_pin<2>(alpha);
    wg_pin<2>(l);
    wg_wait<0>();
    wg_pin<DP / 2>(acc);
    wg_pin<BN / 4>(&p[0][0]);
    pv_done();
    attn_rescale<ND, kLazy>(acc, alpha);
    to_p();
  }
  // The last key tile's P V, issued (then issued() runs) and waited for.
  template <class ISSUED> __device__ __forceinline__ void last(int stage, ISSUED issued) {
    pv(stage);
    issued();
    wg_wait<0>();
    wg_pin<DP / 2>(acc);
  }
  // The rows' output (and lse) of tile t, normalized by the row sums (AttnOut::tc_row).
  __device__ __forceinline__ void store(const AttnOut<T>& out, const AttnTile& t, int group,
                                        i64 lq) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      out.template tc_row<ND, !MK>(acc, h, m[h], l[h], r0 + 8 * h, row_ok[h], t, group, lq);
    }
  }
};
#endif  // CUNORM_SM90A

// Row tile `round` of a persistent attn_wg block: rounds of gridDim.x tiles, in block order on
// even rounds and in reverse on odd ones. A head's row tiles come heaviest first under a causal
// mask (attn_tile); with a grid of a multiple of row_tiles blocks, taking every round in block
// order would give each block the same position, heaviest or lightest, in every round.
__device__ __forceinline__ unsigned attn_wg_item(unsigned round, unsigned grid) {
  return round * grid + ((round & 1) ? grid - 1 - blockIdx.x : blockIdx.x);
}
__device__ __forceinline__ unsigned attn_wg_item(unsigned round) { return attn_wg_item(round, gridDim.x); }

// WG warpgroups x 64 query rows (BM = 64 WG), BN keys per tile, DP = head dim padded to 64.
// K and V tiles are double-buffered by cp.async. Within an iteration the warpgroup issues
// S' = Q K'^T for the next tile, then computes the online softmax of the current tile while
// the tensor cores work, then issues O += P V; one barrier per key tile.
// A block's loads of Q and of its first K / V tiles, its first softmax and its last P V and
// output stores do not overlap its own MMAs: with one block per SM they cost about 5 us a
// block (H200, D = 64, ncu), much of the gap to FlashAttention-2 on short rows. One-warpgroup
// blocks, 2 per SM, hide them behind each other (each block loads K / V for 64 rows only).
// A persistent grid (fewer blocks than the `items` row tiles; the planner's choice, never with
// a key split, whose workspace rows follow blockIdx.x) also loads each row tile's first
// operands under the previous tile's end.
// MK: built with the explicit mask's code (the planner's choice for a call with a mask); the
// default build treats mask_kind as kMaskNone, has no code for it and finds each row's head
// without a division (AttnTile::head_of): +5-7% at D = 64 on short rows (H200, dispatch docs).
template <typename T, int DP, int BN, int WG, bool MK = false>
__global__ void __launch_bounds__(128 * WG, WG == 1 ? 2 : 1) attn_wg(CUNORM_ATTN_PARAMS) {
#if defined(CUNORM_SM90A)
  griddep_launch_dependents();  // as in attn_tc
  constexpr int BM = 64 * WG;
  constexpr int THREADS = 128 * WG;
  // a persistent grid's loop (attn_wg_item): at DP = 256 it spilled (28 bytes, ptxas sm_90a)
  constexpr bool kPersistent = DP <= 192;
  CUNORM_DYNAMIC_SMEM(smem_raw);
  const unsigned raw_addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_raw));
  T* const qs = reinterpret_cast<T*>(smem_raw + ((1024 - (raw_addr & 1023)) & 1023));
  T* const ks = qs + BM * DP;      // 2 stages of BN x DP
  T* const vs = ks + 2 * BN * DP;  // 2 stages
  const int warp = threadIdx.x >> 5;  // warpgroup warp / 4 owns rows 64 (warp / 4) + 16 (warp % 4)

  // The block's row tiles: one when the grid has a block per tile, else (a persistent grid)
  // several, attn_wg_item's. Each tile's loads of Q and of its first K / V tiles are issued
  // before the previous tile's last P V and output stores, into Q and the stages those no
  // longer read, so they land while the block finishes the previous tile.
  unsigned round = 0;
  AttnTile t = attn_tile(hkv, group, lq, row_tiles, BM, blockIdx.x);
  i64 tb, te;
  attn_key_range(t, lq, lk, causal, BN, tb, te);
  typedef AttnTileLoader<BN, DP, Sw128<BN>, THREADS, T> Loader;
  Loader k_loader(k + t.b * k_sb + t.kvh * k_sh, k_sl, d, vec != 0);
  Loader v_loader(v + t.b * v_sb + t.kvh * v_sh, v_sl, dv, vec != 0);
  auto load_k = [&](i64 tile, int stage) {
    const i64 n0 = tile * BN;
    k_loader.load(ks + stage * BN * DP, n0, static_cast<int>(min(static_cast<i64>(BN), lk - n0)));
  };
  auto load_v = [&](i64 tile, int stage) {
    const i64 n0 = tile * BN;
    v_loader.load(vs + stage * BN * DP, n0, static_cast<int>(min(static_cast<i64>(BN), lk - n0)));
  };
  int base = 0;  // K / V stage of the row tile's first key tile; the next ones alternate
  // Q and the first K tile in one cp.async group, the second K tile and the first V tile in
  // another: the first S = Q K^T waits for the first group only.
  auto load_first = [&]() {
    const int q_rows = static_cast<int>(min(static_cast<i64>(BM), t.rows - t.r0));
    attn_load_q<BM, DP, Sw128<BM>, THREADS>(qs, q, t, lq, group, q_sb, q_sh, q_sl, q_rows, d, vec != 0);
    if (tb < te) load_k(tb, base);
    copy_async_commit();
    if (tb + 1 < te) load_k(tb + 1, base ^ 1);
    if (tb < te) load_v(tb, base);
    copy_async_commit();
  };
  load_first();
  const AttnScores<T> scores = CUNORM_ATTN_SCORES(MK ? mask_kind : kMaskNone);
  WgRows<T, DP, BN, BM, MK> rows;
  rows.q_addr = smem_addr(qs) + (warp >> 2) * 64 * 128;
  rows.k_addr = smem_addr(ks);
  rows.v_addr = smem_addr(vs);
  const auto nothing = [] {};

  // Key tile `tile`: P holds its probabilities; K of tile + 1 and V of tile are resident (or
  // landing). The tensor cores run S = Q K^T of the next tile, then P V, while the softmax of
  // the new S runs under P V (WgRows::step). (The last tile, with no next, is peeled off so
  // that every wgmma group here is unconditional: ptxas serializes wgmma when it cannot match
  // a wait to its group.)
  auto publish = [&]() {
    copy_async_wait<0>();  // K of tile + 1 and V of tile, issued one step ago
    fence_proxy_async();
    __syncthreads();  // ... visible to all, and every warpgroup is done with the stages refilled next
  };
  for (;;) {
    rows.start(t, lq, warp);
    // P of the first key tile, once Q and its K have landed.
    copy_async_wait<1>();
    fence_proxy_async();
    __syncthreads();
    if (tb < te) {
      rows.qk(base);
      rows.first(scores, t, tb * BN, nothing);
    }
    for (i64 tile = tb; tile + 1 < te; ++tile) {
      const int st = static_cast<int>((tile - tb) & 1) ^ base;
      publish();
      rows.qk(st ^ 1);
      rows.pv(st);
      // The next loads go to the stages this iteration does not read, issued under the MMAs.
      if (tile + 2 < te) load_k(tile + 2, st);
      load_v(tile + 1, st ^ 1);
      copy_async_commit();
      rows.step(scores, t, (tile + 1) * BN, nothing, nothing);
    }
    const bool any_keys = tb < te;
    const int last_stage = static_cast<int>((te - 1 - tb) & 1) ^ base;
    if (any_keys) publish();  // every warpgroup is done with Q and the K stages
    const AttnTile done = t;
    const unsigned next = kPersistent ? attn_wg_item(++round) : static_cast<unsigned>(items);
    if (next < static_cast<unsigned>(items)) {
      // The setup above, for the next row tile. (One lambda for both measured 2-3% slower on
      // short rows: attention profile record, section 10e.)
      t = attn_tile(hkv, group, lq, row_tiles, BM, next);
      attn_key_range(t, lq, lk, causal, BN, tb, te);
      k_loader = Loader(k + t.b * k_sb + t.kvh * k_sh, k_sl, d, vec != 0);
      v_loader = Loader(v + t.b * v_sb + t.kvh * v_sh, v_sl, dv, vec != 0);
      if (any_keys) base = last_stage ^ 1;  // the V stage the last P V does not read
      load_first();
    }
    if (any_keys) rows.last(last_stage, nothing);
    rows.store(CUNORM_ATTN_OUT, done, group, lq);
    if (next >= static_cast<unsigned>(items)) break;
  }
  copy_async_wait<0>();
#else
  __trap();  // planned only for sm_90a builds
#endif
}

// Warp-specialized forward (sm_90a; FlashAttention-3's division of labour): warpgroup 0
// loads, warpgroups 1 .. CW compute, 64 query rows each (BM = 64 CW; the planner uses CW = 2),
// on a persistent grid (or a block per row tile, when the planner says). The loader gives its
// registers to the others (setmaxnreg) and keeps QS stages of Q (a row tile each), ST of K and
// ST of V filled with cp.async; each buffer has a `full` mbarrier (128 arrivals: every loader thread once its
// copies have landed and been fenced for wgmma's proxy) and an `empty` one (128 CW arrivals:
// every computing thread once the wgmma that read it has completed). So the
// compute warpgroups hold no load addresses and issue no loads, and a row tile's Q and first
// K / V tiles land while the previous tile's last P V and output stores run. Each compute
// warpgroup runs attn_wg's loop on its rows, and the compute warpgroups take turns to issue
// their MMAs (ping-pong, below), so that one's softmax runs under the others' S and P V.
// Every role walks the same row tiles (attn_wg_item) and the same
// K / V sequence, so buffer b's k-th use is the same load everywhere: slot k % ST, phase
// (k / ST) & 1. MK: as attn_wg's.
template <typename T, int DP, int BN, int ST, int CW, int QS, bool MK = false>
__global__ void __launch_bounds__(128 * (CW + 1), 1) attn_ws(CUNORM_ATTN_PARAMS) {
#if defined(CUNORM_SM90A)
  griddep_launch_dependents();  // as in attn_tc
  constexpr int BM = 64 * CW;
  // registers a thread: the launch's share, 56 for the loader, the rest for the computers
  constexpr int kLaunchRegs = (65536 / (128 * (CW + 1))) & ~7;
  constexpr int kLoaderRegs = 56;
  constexpr int kComputeRegs = ((kLaunchRegs * (CW + 1) - kLoaderRegs) / CW) & ~7;
  static_assert(kLoaderRegs >= 24 && kComputeRegs <= 256 && kLoaderRegs % 8 == 0 &&
                    kLoaderRegs + CW * kComputeRegs <= (CW + 1) * kLaunchRegs,
                "setmaxnreg: multiples of 8 in [24, 256], within the launch's registers");
  constexpr unsigned kLoaders = 128, kComputers = 128 * CW;
  CUNORM_DYNAMIC_SMEM(smem_raw);
  const unsigned raw_addr = static_cast<unsigned>(__cvta_generic_to_shared(smem_raw));
  T* const qs = reinterpret_cast<T*>(smem_raw + ((1024 - (raw_addr & 1023)) & 1023));
  T* const ks = qs + QS * BM * DP;  // ST stages of BN x DP (after QS of Q)
  T* const vs = ks + ST * BN * DP;  // ST stages
  // mbarriers (shared addresses, 8 bytes apart): Q full and empty per Q stage, then K full /
  // empty and V full / empty per K / V stage
  const unsigned q_full = smem_addr(vs + ST * BN * DP), q_empty = q_full + 8 * QS;
  const unsigned k_full = q_empty + 8 * QS, k_empty = k_full + 8 * ST;
  const unsigned v_full = k_empty + 8 * ST, v_empty = v_full + 8 * ST;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < QS; ++s) {
      mbar_init(q_full + 8 * s, kLoaders);
      mbar_init(q_empty + 8 * s, kComputers);
    }
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      mbar_init(k_full + 8 * s, kLoaders);
      mbar_init(k_empty + 8 * s, kComputers);
      mbar_init(v_full + 8 * s, kLoaders);
      mbar_init(v_empty + 8 * s, kComputers);
    }
  }
  __syncthreads();
  const int role = threadIdx.x >> 7;  // 0 loads; r > 0 computes rows 64 (r - 1) ...
  if (role == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kLoaderRegs) : "memory");
    typedef AttnTileLoader<BN, DP, Sw128<BN>, 128, T> Loader;
    // A load is signalled one load late: its copies are waited for (cp.async groups) after the
    // next one is issued, then fenced for the async proxy and published by the arrival. Before
    // waiting for a buffer to empty, the loader publishes what it holds back unless the buffer
    // is free already: the computing warpgroups may need that load to free it.
    unsigned pending = 0;  // the full barrier of the load held back (0: none)
    auto issued = [&](unsigned full) {
      copy_async_commit();
      if (pending != 0) {
        copy_async_wait<1>();
        fence_proxy_async();
        mbar_arrive(pending);
      }
      pending = full;
    };
    auto wait_empty = [&](unsigned empty, unsigned parity) {
      if (pending != 0 && !mbar_test(empty, parity)) {
        copy_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(pending);
        pending = 0;
      }
      mbar_wait(empty, parity);
    };
    // Q is loaded once a round; K and V tiles go in pairs, one count for both. The loaders'
    // state is rebuilt for every tile, from the strides and column counts as opaque values:
    // computed once a row tile, or hoisted out of the loop over row tiles, it spilled the
    // loading warpgroup's registers to local memory.
    unsigned kv_uses = 0;
    for (unsigned round = 0, item = blockIdx.x; item < static_cast<unsigned>(items);) {
      const AttnTile t = attn_tile(hkv, group, lq, row_tiles, BM, item);
      i64 tb, te;
      attn_key_range(t, lq, lk, causal, BN, tb, te);
      const unsigned q_stage = round % QS;
      wait_empty(q_empty + 8 * q_stage, ((round / QS) & 1) ^ 1);
      const int q_rows = static_cast<int>(min(static_cast<i64>(BM), t.rows - t.r0));
      i64 q_ld = q_sl;
      asm volatile("" : "+l"(q_ld));
      attn_load_q<BM, DP, Sw128<BM>, 128>(qs + q_stage * BM * DP, q, t, lq, group, q_sb, q_sh, q_ld,
                                          q_rows, d, vec != 0);
      issued(q_full + 8 * q_stage);
      const T* const k_rows = k + t.b * k_sb + t.kvh * k_sh;
      const T* const v_rows = v + t.b * v_sb + t.kvh * v_sh;
      // (key tiles fit 32 bits: 2^31 tiles of 64 keys would be 2^37 keys)
      for (int tile = static_cast<int>(tb); tile < static_cast<int>(te); ++tile, ++kv_uses) {
        const i64 n0 = static_cast<i64>(tile) * BN;
        const int nrows = static_cast<int>(min(static_cast<i64>(BN), lk - n0));
        const unsigned stage = kv_uses % ST, empty_parity = ((kv_uses / ST) & 1) ^ 1;
        i64 k_ld = k_sl, v_ld = v_sl;
        int k_cols = d, v_cols = dv;
        asm volatile("" : "+l"(k_ld), "+l"(v_ld), "+r"(k_cols), "+r"(v_cols));
        wait_empty(k_empty + 8 * stage, empty_parity);
        Loader(k_rows, k_ld, k_cols, vec != 0).load(ks + stage * BN * DP, n0, nrows);
        issued(k_full + 8 * stage);
        wait_empty(v_empty + 8 * stage, empty_parity);
        Loader(v_rows, v_ld, v_cols, vec != 0).load(vs + stage * BN * DP, n0, nrows);
        issued(v_full + 8 * stage);
      }
      unsigned grid;  // (the grid size, kept through the round, was spilled too)
      asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(grid));
      item = attn_wg_item(++round, grid);
    }
    copy_async_wait<0>();
    fence_proxy_async();
    if (pending != 0) mbar_arrive(pending);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kComputeRegs) : "memory");
  const int warp = (threadIdx.x >> 5) - 4;  // computing warp: rows 16 warp of the tile
  const AttnScores<T> scores = CUNORM_ATTN_SCORES(MK ? mask_kind : kMaskNone);
  WgRows<T, DP, BN, BM, MK> rows;
  const unsigned q_addr = smem_addr(qs) + (warp >> 2) * 64 * 128;
  rows.k_addr = smem_addr(ks);
  rows.v_addr = smem_addr(vs);
  unsigned kv_uses = 0;  // as the loader's
  // Ping-pong: the computing warpgroups take turns to issue their wgmma, in a ring (named
  // barrier r is warpgroup r's turn, 256 threads: it syncs, the warpgroup before it arrives
  // once it has issued), so one's softmax runs under the others' MMAs. In step, as they were
  // before, they all ran their softmax at once while the tensor cores idled: H200, bf16,
  // 16k tokens, 5-12% slower at D = 64 and 5-8% at D = 128 (warp-specialized record).
  const unsigned my_turn = static_cast<unsigned>(role), next_turn = role % CW + 1;
  const auto turn = [&] { bar_sync(my_turn, 256); };
  const auto pass = [&] { bar_arrive(next_turn, 256); };
  // (barrier 1 named as a constant here and below: through `role`, ptxas spilled 24 bytes at
  // D = 128)
  if (role == CW) bar_arrive(1, 256);  // the first turn is warpgroup 1's
  for (unsigned round = 0, item = blockIdx.x; item < static_cast<unsigned>(items);
       item = attn_wg_item(++round)) {
    const AttnTile t = attn_tile(hkv, group, lq, row_tiles, BM, item);
    i64 tb, te;
    attn_key_range(t, lq, lk, causal, BN, tb, te);
    rows.start(t, lq, warp);
    const unsigned q_stage = round % QS;
    rows.q_addr = q_addr + q_stage * BM * DP * 2;
    mbar_wait(q_full + 8 * q_stage, (round / QS) & 1);
    if (tb < te) {
      const unsigned stage = kv_uses % ST;
      mbar_wait(k_full + 8 * stage, (kv_uses / ST) & 1);
      turn();
      rows.qk(stage);
      pass();
      rows.first(scores, t, tb * BN, [&] { mbar_arrive(k_empty + 8 * stage); });
    }
    // Key tile `tile` (K / V use kv_uses): S of the next tile and this one's P V in flight
    // under the softmax, each buffer freed as its wgmma completes.
    for (int tile = static_cast<int>(tb); tile + 1 < static_cast<int>(te); ++tile, ++kv_uses) {
      const unsigned stage = kv_uses % ST, next = (kv_uses + 1) % ST;
      mbar_wait(k_full + 8 * next, ((kv_uses + 1) / ST) & 1);
      turn();
      rows.qk(next);
      mbar_wait(v_full + 8 * stage, (kv_uses / ST) & 1);
      rows.pv(stage);
      pass();
      rows.step(scores, t, static_cast<i64>(tile + 1) * BN, [&] { mbar_arrive(k_empty + 8 * next); },
                [&] { mbar_arrive(v_empty + 8 * stage); });
    }
    mbar_arrive(q_empty + 8 * q_stage);  // every S of the tile is done
    if (tb < te) {
      const unsigned stage = kv_uses % ST;
      mbar_wait(v_full + 8 * stage, (kv_uses / ST) & 1);
      turn();
      rows.last(stage, pass);
      mbar_arrive(v_empty + 8 * stage);
      ++kv_uses;
    }
    rows.store(CUNORM_ATTN_OUT, t, group, lq);
  }
  if (role == 1) bar_sync(1, 256);  // takes the last warpgroup's last pass
#else
  __trap();  // planned only for sm_90a builds
#endif
}

// ---------------------------------------------------------------------------------------
// SIMT path (float32 / float64): one warp per query row, 8 rows per block. Lanes own keys for
// the scores (lane j: the dot product of the row with key j of a 32-key tile held in shared
// memory) and head-dim columns for the output (lane c: columns c, c + 32, ...). DPL = columns
// per lane = ceil(max(D, Dv) / 32).
template <typename T, int DPL>
__global__ void __launch_bounds__(256, 1) attn_simt(CUNORM_ATTN_PACKED_PARAMS) {
  CUNORM_ATTN_UNPACK;
  griddep_launch_dependents();  // as in attn_tc
  typedef typename AttnWork<T>::type C;  // double
  constexpr int ROWS = 8;
  constexpr int BN = 32;
  CUNORM_DYNAMIC_SMEM(smem_raw);
  const int ksd = (d % 2 == 0) ? d + 1 : d;  // odd row stride: lanes read distinct banks
  C* const ks = reinterpret_cast<C*>(smem_raw);
  C* const vs = ks + BN * ksd;
  C* const qsh = vs + BN * dv;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;

  const AttnTile t = attn_tile(hkv, group, lq, row_tiles, ROWS, blockIdx.x);
  i64 tb, te;
  attn_key_range(t, lq, lk, causal, BN, tb, te);
  const i64 r = t.r0 + warp;
  const bool row_ok = r < t.rows;
  const i64 pos = row_ok ? r % lq : 0;
  const i64 last_key = attn_last_key(pos, lq, lk, causal);
  const i64 head = static_cast<i64>(t.kvh) * group + (row_ok ? r / lq : 0);
  C* const qrow = qsh + warp * d;
  for (int c = lane; c < d; c += 32)
    qrow[c] = row_ok ? static_cast<C>(q[t.b * q_sb + head * q_sh + pos * q_sl + c]) : C(0);
  const T* const kb = k + t.b * k_sb + t.kvh * k_sh;
  const T* const vb = v + t.b * v_sb + t.kvh * v_sh;

  C acc[DPL];
  // float64 accumulates with compensated sums (the naive float64 matmul it is held to is
  // blocked; a plain running sum over Lk keys would round up to ~3x worse). float32 inputs
  // accumulate in double, far below their own rounding, and skip it.
  constexpr bool kCompensated = IsSame<T, double>::value;
  C comp[DPL];
#pragma unroll
  for (int u = 0; u < DPL; ++u) acc[u] = comp[u] = C(0);
  C m = -Math<C>::inf();
  C l = C(0);  // this lane's share of the row sum
  C l_comp = C(0);
  auto load_k = [&](i64 n0, int nk) {  // K tile in double, odd row stride
    for (int idx = threadIdx.x; idx < BN * d; idx += blockDim.x) {
      const int j = idx / d, c = idx % d;
      ks[j * ksd + c] = j < nk ? static_cast<C>(kb[(n0 + j) * k_sl + c]) : C(0);
    }
  };
  // Scaled, masked score of this lane's key n0 + lane (-inf where masked).
  auto score = [&](i64 n0) {
    const i64 key = n0 + lane;
    const C* const krow = ks + lane * ksd;
    C s;
    if (kCompensated) {
      // float64: the dot product as if in twice the precision (Ogita-Rump-Oishi Dot2: each
      // product's error by FMA, each sum's by TwoSum), and the scale applied to both halves,
      // so the score is rounded once. A plain sum of D products errs by up to ~sqrt(D) units,
      // which exp() turns into the same relative error of every weight: at D = 128-256 that
      // alone exceeded a blocked float64 matmul's error (the bound the tests hold us to).
      C hi = C(0), lo = C(0);
      for (int c = 0; c < d; ++c) {
        const C x = qrow[c] * krow[c];
        lo += fma(qrow[c], krow[c], -x);
        hi = two_sum_into(hi, x, lo);
      }
      const C sc = static_cast<C>(scale), hs = hi * sc;
      s = hs + (fma(hi, sc, -hs) + lo * sc);
    } else {
      // Four interleaved partial dot products: shorter rounding chains and independent FMAs
      // (double sums of float32 products: far below float32's own rounding).
      C s4[4] = {C(0), C(0), C(0), C(0)};
      int c4 = 0;
      for (; c4 + 4 <= d; c4 += 4) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s4[e] = fma(qrow[c4 + e], krow[c4 + e], s4[e]);
      }
      for (; c4 < d; ++c4) s4[0] = fma(qrow[c4], krow[c4], s4[0]);
      s = (s4[0] + s4[1]) + (s4[2] + s4[3]);
      s *= static_cast<C>(scale);  // scaled once, after the dot product, as q @ k.T * scale
    }
    bool keep = key <= last_key;
    if (keep && mask_kind != kMaskNone && row_ok) {
      const i64 off = t.b * m_sb + head * m_sh + pos * m_sq + key * m_sk;
      if (mask_kind == kMaskBool) {
        keep = static_cast<const unsigned char*>(mask)[off] != 0;
      } else {
        s += static_cast<C>(static_cast<const T*>(mask)[off]);
      }
    }
    return keep ? s : -Math<C>::inf();
  };
  if (kCompensated) {
    // float64: the row max first (one more pass over K), so that the main pass never
    // rescales: each rescale would multiply the sums by an inexact exp(m_old - m_new).
    for (i64 tile = tb; tile < te; ++tile) {
      const i64 n0 = tile * BN;
      __syncthreads();
      load_k(n0, static_cast<int>(min(static_cast<i64>(BN), lk - n0)));
      __syncthreads();
      C mx = score(n0);
#pragma unroll
      for (int w = 16; w > 0; w /= 2) mx = Math<C>::max(mx, __shfl_xor_sync(0xffffffffu, mx, w));
      m = Math<C>::max(m, mx);
    }
  }
  for (i64 tile = tb; tile < te; ++tile) {
    const i64 n0 = tile * BN;
    const int nk = static_cast<int>(min(static_cast<i64>(BN), lk - n0));
    __syncthreads();  // the previous tile is consumed (and qrow written, on the first)
    load_k(n0, nk);
    for (int idx = threadIdx.x; idx < BN * dv; idx += blockDim.x) {
      const int j = idx / dv, c = idx % dv;
      vs[j * dv + c] = j < nk ? static_cast<C>(vb[(n0 + j) * v_sl + c]) : C(0);
    }
    __syncthreads();
    const C s = score(n0);
    C mx = s;
#pragma unroll
    for (int w = 16; w > 0; w /= 2) mx = Math<C>::max(mx, __shfl_xor_sync(0xffffffffu, mx, w));
    const C m_new = Math<C>::max(m, mx);
    const C m_use = m_new == -Math<C>::inf() ? C(0) : m_new;
    const C alpha = Math<C>::exp(m - m_use);
    m = m_new;
    const C p = Math<C>::exp(s - m_use);
    if (kCompensated) {
      // acc and l carry their rounding errors in comp / l_comp (TwoSum, and FMA for the exact
      // product error), so the error stays near one rounding however many keys the row has.
      const C la = l * alpha;
      l_comp = fma(l_comp, alpha, fma(l, alpha, -la));
      l = two_sum_into(la, p, l_comp);
#pragma unroll
      for (int u = 0; u < DPL; ++u) {
        const C a = acc[u] * alpha;
        comp[u] = fma(comp[u], alpha, fma(acc[u], alpha, -a));
        acc[u] = a;
      }
      for (int j = 0; j < nk; ++j) {
        const C pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int u = 0; u < DPL; ++u) {
          const int c = lane + 32 * u;
          if (c < dv) {
            const C x = pj * vs[j * dv + c];
            comp[u] += fma(pj, vs[j * dv + c], -x);
            acc[u] = two_sum_into(acc[u], x, comp[u]);
          }
        }
      }
      continue;
    }
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
  if (kCompensated) {
    l += l_comp;
#pragma unroll
    for (int u = 0; u < DPL; ++u) acc[u] += comp[u];
  }
#pragma unroll
  for (int w = 16; w > 0; w /= 2) l += __shfl_xor_sync(0xffffffffu, l, w);
  if (!row_ok) return;
  if (gridDim.z > 1) {  // unnormalized partial row, its max and sum (see AttnOut)
    const i64 prow = (static_cast<i64>(blockIdx.z) * (gridDim.x / row_tiles) + blockIdx.x / row_tiles) *
                         t.rows + r;
#pragma unroll
    for (int u = 0; u < DPL; ++u) {
      const int c = lane + 32 * u;
      if (c < dv) o_part[prow * dv + c] = acc[u];
    }
    if (lane == 0) {
      stat_part[2 * prow] = l > C(0) ? m : -Math<C>::inf();
      stat_part[2 * prow + 1] = l;
    }
  } else {
    T* dst = o + t.b * o_sb + head * o_sh + pos * o_sl;
#pragma unroll
    for (int u = 0; u < DPL; ++u) {
      const int c = lane + 32 * u;
      if (c < dv) dst[c] = static_cast<T>(l == C(0) ? C(0) : acc[u] / l);
    }
    if (lse != nullptr && lane == 0) {
      const C row_lse = l == C(0) ? -Math<C>::inf() : m + Math<C>::log(l);
      lse[t.b * lse_sb + head * lse_sh + pos * lse_sl] = static_cast<float>(row_lse);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Split-KV merge: one block per flattened row (batch, KV head, r). With M the largest split
// max and e_s = exp(m_s - M): y = sum_s e_s acc_s / L, L = sum_s e_s l_s, lse = M + log(L), in
// the workspace's type (float; double for the SIMT dtypes). Splits with l_s = 0 (no key, or
// every key masked) are skipped; a row with none left gives 0 and -inf.
constexpr int kMaxSplits = 128;  // _attn_dispatch.MAX_SPLITS
constexpr int MAX_HEAD_DIM_ATTN = 256;  // _attn_dispatch.MAX_HEAD_DIM

// attn_combine's scalar arguments, passed by value as one parameter: a CuPy launch costs
// ~0.5 us of host time per argument (tools/gpu_profile.py launch-cost on an H200: 38
// arguments 14-24 us, 8 pointers and one struct 6-9 us), and decoding merges every step.
// _attn_launch.COMBINE_ARGS is the same layout as a NumPy structured dtype (a CPU test
// compares the two).
struct CombineArgs {
  i64 part_rows, lq, o_sb, o_sh, o_sl, lse_sb, lse_sh, lse_sl;
  int splits, hkv, group, dv;
};

template <typename T>
__global__ void __launch_bounds__(256) attn_combine(const typename AttnWork<T>::type* o_part,
                                                    const typename AttnWork<T>::type* stat_part,
                                                    T* o, float* lse, const CombineArgs args) {
  const i64 part_rows = args.part_rows, lq = args.lq;
  const int splits = args.splits, hkv = args.hkv, group = args.group, dv = args.dv;
  typedef typename AttnWork<T>::type P;
  // One block per row and the partial rows in L2 (just written): the time is the chain of
  // dependent round trips, so every load is issued before the first result is needed. A
  // thread reads its split's (m_s, l_s) and its warp's share of the partial rows at once,
  // then the block reduces. The old 4-warp loop, which loaded each split's row after testing
  // its weight, made one round trip per 4 splits: 10.6-14.4 us for 32 rows of 32-50 splits
  // (ncu, H200, bf16 decoding), as long as the attention kernel itself.
  constexpr int kWarps = 8;                     // 256 threads (COMBINE_THREADS)
  constexpr int kBatch = 8;                     // splits a warp loads at once
  constexpr int kCols = MAX_HEAD_DIM_ATTN / 32;  // columns lane + 32 j
  static_assert(kMaxSplits <= 2 * kWarps * kBatch && kMaxSplits <= 32 * kWarps,
                "two load batches and one thread per split's statistics");
  __shared__ P weight[kMaxSplits];  // e_s, 0 for a skipped split
  __shared__ P max_scratch[33];
  __shared__ Sum2<P> sum_scratch[33];
  __shared__ Sum2<P> part[kWarps][MAX_HEAD_DIM_ATTN];
  const i64 prow = blockIdx.x;  // (b * hkv + kvh) * (group * lq) + r
  // prow < 2^31 (a grid dimension), so 32-bit divisions suffice (64-bit ones are ~70
  // instructions each): a row count or Lq beyond 2^31 divides prow as 2^31 would.
  const unsigned p32 = blockIdx.x;
  const i64 rows = static_cast<i64>(group) * lq;
  const unsigned rows32 = static_cast<unsigned>(min(rows, i64(1) << 31));
  const unsigned lq32 = static_cast<unsigned>(min(lq, i64(1) << 31));
  const unsigned bh = p32 / rows32, r = p32 % rows32;
  const i64 b = bh / static_cast<unsigned>(hkv);
  const i64 head = static_cast<i64>(bh % static_cast<unsigned>(hkv)) * group + r / lq32;
  const i64 pos = r % lq32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Launched with programmatic stream serialization (cunorm/_pdl.py) on sm_90, the blocks are
  // resident while the attention kernel runs (it lets them in as it starts) and pass this
  // wait as soon as its partial rows are complete: the launch and scheduling of this small
  // grid no longer follow the attention kernel's end.
  griddep_wait();

  P m_s = -Math<P>::inf(), l_s = P(0);
  if (tid < splits) {
    m_s = stat_part[2 * (tid * part_rows + prow)];
    l_s = stat_part[2 * (tid * part_rows + prow) + 1];
  }
  // Split s = warp + kWarps (kBatch * batch + i) of the warp's batch, columns lane + 32 j.
  // Every split wrote every row of its tile (zeros where it saw no key), so the loads need
  // no weight.
  const P* const src = o_part + prow * dv;
  const i64 split_stride = part_rows * dv;
  P a[kBatch][kCols];
  auto load_batch = [&](int batch) {
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int s = warp + kWarps * (kBatch * batch + i);
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int c = lane + 32 * j;
        a[i][j] = s < splits && c < dv ? src[s * split_stride + c] : P(0);
      }
    }
  };
  load_batch(0);

  const P mx = block_all_reduce<MaxOp<P>>(l_s > P(0) ? m_s : -Math<P>::inf(), max_scratch);
  const P e = l_s > P(0) ? Math<P>::exp(m_s - mx) : P(0);
  if (tid < splits) weight[tid] = e;
  // float64 sums carry each product's error (FMA) and each addition's (TwoSum): one rounding
  // however many splits, as the float64 path's accuracy needs. The other dtypes sum in a
  // wider type than their own (float for 16-bit, double for float32) and skip it.
  constexpr bool kCompensated = IsSame<T, double>::value;
  Sum2<P> total = {e * l_s, kCompensated ? fma(e, l_s, -(e * l_s)) : P(0)};
  total = block_all_reduce<CompensatedSumOp<P>>(total, sum_scratch);  // its barriers publish weight
  const P denom = total.a + total.b;

  P y[kCols], y_err[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) y[j] = y_err[j] = P(0);
  for (int batch = 0; batch * kBatch * kWarps < splits; ++batch) {
    if (batch > 0) load_batch(batch);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int s = warp + kWarps * (kBatch * batch + i);
      const P w = s < splits ? weight[s] : P(0);
      if (w == P(0)) continue;  // warp-uniform, and the loads are already issued
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        if (kCompensated) {
          const P x = w * a[i][j];
          y_err[j] += fma(w, a[i][j], -x);
          y[j] = two_sum_into(y[j], x, y_err[j]);
        } else {
          y[j] = fma(w, a[i][j], y[j]);
        }
      }
    }
  }
  // The warps' sums meet in shared memory; thread c finishes column c.
#pragma unroll
  for (int j = 0; j < kCols; ++j) part[warp][lane + 32 * j] = {y[j], y_err[j]};
  __syncthreads();
  T* const dst = o + b * args.o_sb + head * args.o_sh + pos * args.o_sl;
  if (tid < dv) {
    Sum2<P> acc = part[0][tid];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) acc = CompensatedSumOp<P>::apply(acc, part[w][tid]);
    // (denom == 0: every split empty; NaN, from a split's NaN sum l_s, whose weight is 0 but
    // whose e * l_s = 0 * NaN made the total NaN: the row is NaN, as unsplit)
    dst[tid] = from_compute<T>(denom == P(0) ? P(0) : (acc.a + acc.b) / denom);
  }
  if (lse != nullptr && tid == 0)
    lse[b * args.lse_sb + head * args.lse_sh + pos * args.lse_sl] =
        static_cast<float>(denom == P(0) ? -Math<P>::inf() : mx + Math<P>::log(denom));
}

}  // namespace cunorm
