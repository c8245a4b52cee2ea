// Sparse MLA decode attention for 16 and 32 heads with FP8 KV: a memory-bound kernel on mma.sync.
//
// Contract (C ABI dsa_mma_mla_decode below; docs/design.md, Contracts; the same operator as
// triton_sparse_mla.py), per query token t and head h:
//   q_nope [T, H, 512] bf16, q_pe [T, H, 64] bf16: last dim contiguous, token/head strides free
//     (multiples of 8 elements), 16-byte aligned base. H in {16, 32}.
//   kv: the FP8 cache, 656 contiguous bytes per token (512 e4m3, 4 fp32 scales one per 128 values,
//     64 bf16 rope values), 16-byte aligned base; cache_tokens of them.
//   indices [T, topk] int32 physical token ids, topk in [1, 2048]; -1 is padding anywhere; an id
//     outside [0, cache_tokens) is masked like -1 (never dereferenced) and counted in *bad_index_count.
//   topk_length [T] (nullable): only the first topk_length[t] positions of row t count.
//   sink [H] fp32 (nullable): the output is scaled by 1 / (1 + exp(sink[h] - lse_e)); lse is not.
//   Split s of S takes the row positions s, s + S, s + 2S, ... (as the Triton kernel, whose combine
//     kernel reduces the partials).
//   S == 1, or reduce_in_cluster (2 <= S <= 8: the splits of a token are one cluster, merged in it):
//     output [T, H, 512] bf16 = softmax(sm_scale * q.k) . ckv and lse [T, H] fp32
//     (lse_scale 1: base 2; 1/log2(e): base e); a row with no valid id gives 0 and -inf.
//   else S > 1: fp32 partials, row (t * S + s) * H + h: part_acc [., 512] unnormalized output, part_m [.]
//     running max and part_l [.] running sum of the log2-domain logits (empty: -inf, 0).
//
// Why this shape: at 16 heads a gathered 656-byte token feeds 16 x 1088 x 2 FLOPs (~53 FLOP a byte),
// so the kernel is bound by memory and built like a copy: each CTA keeps kStages - 1 tiles of gathered
// rows in flight (bulk copies, one instruction a 656-byte row, completed on an mbarrier a stage) while
// it computes one. CTA = one token x one split x 16 heads (4 warps, two CTAs an SM) or 32 heads (two
// head groups of 4 warps sharing the gathered rows, one CTA an SM). Warp w of a head group owns scale
// group w: the logits' partial over ckv columns 128w .. 128w + 127 (plus rope columns 16w .. 16w + 15),
// and the output columns of the same group. The four partial logits meet in shared memory; every warp
// sums them in the same order and runs the same online softmax, so the only wait on other warps is one
// barrier a tile (the partials' buffer is reused once every thread of the head group has arrived on
// its reduce_free barrier). What bounds it at 16 heads is latency, not a pipe (docs/design.md, "Measured
// choices").
//
// Numerics: the e4m3 values feed fp16 MMAs undequantized (exact in fp16; one cvt per two values)
// and each group's fp32 scale multiplies that group's partial logits and its share of P instead.
// Q is rounded to fp16 once, each row of each group scaled by a power of two (its largest value into
// [2^14, 2^15)), undone in fp32 on the logits: exact, so fp16's range never clips a q value and its
// 11-bit mantissa is never wasted on a row of small values. The rope part multiplies in bf16 as it
// is stored. P times a token's scale is kept relative to a running per-row reference (the largest
// such product so far, rescaled with the softmax), so the fp16 P' of a warp stays in [0, 1]; its
// accumulator is in units of that reference and multiplied back at the end.
//
// Fragment layouts (mma.sync m16n8k16; g = lane / 4, c = lane % 4): MMA columns and reduction
// positions are permuted so that each thread reads whole 16-byte pieces of the token rows:
//   S = Q K^T, k-step j of group w: MMA k positions {2c, 2c+1, 2c+8, 2c+9} are the group's columns
//     32c + 4j + {0, 1, 2, 3}: two 16-byte loads of token g's row give all eight k-steps' B registers.
//   O = P V, chunk q of group w: n-tile (q, i), column n is the group's column 16n + 4q + i, so one
//     16-byte load per token row holds all sixteen n-tiles' values of B column g; tokens pair up by
//     a byte permute, and a thread's accumulators hold 32 consecutive output columns of each row.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "hopper_mla_ptx.cuh"

namespace mma_mla {
namespace {

// ---- problem and tile constants ---------------------------------------------------------------
constexpr int kCkvDim = 512;
constexpr int kKpeDim = 64;
constexpr int kTokenBytes = 656;
constexpr int kScaleOffset = 512;  // 4 fp32 scales
constexpr int kKpeOffset = 528;    // 64 bf16 rope values
constexpr int kGroups = 4;
constexpr int kGroupDim = kCkvDim / kGroups;  // 128 values share a scale
constexpr int kHeadsPerGroup = 16;            // mma.sync M: a head group's warps own 16 heads
constexpr int kGroupWarps = kGroups;          // warp w of a head group: scale group w
constexpr int kBlockTokens = 64;              // tokens a tile: 8 MMA n-tiles of logits, 4 k-steps of P V
constexpr int kNTiles = kBlockTokens / 8;
constexpr int kKSteps = kBlockTokens / 16;
constexpr int kGroupKSteps = kGroupDim / 16;  // 8
constexpr int kRopePerWarp = kKpeDim / kGroupWarps;  // 16: one k-step
constexpr int kChunks = 4;                    // the 4 x 4 n-tiles of a warp's 128 output columns
constexpr int kStageBytes = kBlockTokens * kTokenBytes;  // 41,984
constexpr int kMaxTopk = 2048;
constexpr int kMaxSplits = 64;     // the Triton combine's largest split count (MAX_SPLITS)
// Splits merged in a cluster instead of by the combine kernel: at most a portable cluster's 8 CTAs.
constexpr int kMaxClusterSplits = 8;
constexpr int kMaxTokens = 65535;  // tokens are the grid's z dimension
constexpr int kIdsBytes = kMaxTopk * 4;
constexpr int kReduceBytes = kGroupWarps * kNTiles * 32 * 16;  // a head group's partial logits, a float4 a lane
// Q's per-row power of two puts its largest value in [2^kQTopExp, 2^(kQTopExp + 1)): under fp16's 65504.
constexpr int kQTopExp = 14;
// ... limited so that 2^e and 2^-e stay normal fp32 (a row with every value under 2^-86 loses fp16
// precision; such logits are below any softmax's resolution).
constexpr int kQMinShift = -100;
constexpr int kQMaxShift = 113;  // bf16's largest exponent (127) - kQTopExp

// The two launches: 16 heads, two CTAs an SM; 32 heads, one CTA of two head groups sharing its
// gathered rows. Stages: the tiles in flight while one is computed (kStages - 1) fill what shared memory
// is left, 84 and 126 KB of requests per SM.
template <int kHeadGroups>
struct Shape {
  static constexpr int kWarps = kGroupWarps * kHeadGroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kCtasPerSm = kHeadGroups == 1 ? 2 : 1;
  static constexpr int kStages = kHeadGroups == 1 ? 2 : 4;
  static constexpr int kRingBytes = kStages * kStageBytes;
  static constexpr int kReduceOffset = kRingBytes + kIdsBytes;
  // Barriers: full[stage], then reduce_free[head group] (its partial logits were read by all its threads).
  static constexpr int kBarrierOffset = kReduceOffset + kHeadGroups * kReduceBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (kStages + kHeadGroups) * 8;
  static_assert(kSmemBytes * kCtasPerSm + kCtasPerSm * 1024 <= 228 * 1024, "the CTAs fit in an SM's shared memory");
};

static_assert(kTokenBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
static_assert(kScaleOffset == kCkvDim && kKpeOffset == kScaleOffset + 4 * kGroups, "the 656-byte token layout");
static_assert(kGroupDim == 128 && kKpeDim == 16 * kGroupWarps, "the fragment permutations below");
static_assert(kMaxTopk % kBlockTokens == 0, "the ids buffer holds whole tiles");
static_assert(kBlockTokens % 32 == 0, "the lanes of warp 0 copy a tile's tokens");

// A masked token's row: zeros, so its logit inputs are finite and its P (0) multiplies zeros.
__device__ __align__(16) uint8_t g_zero_row[kTokenBytes];

struct Params {
  const __nv_bfloat16* q_nope;
  long long q_nope_stride_t, q_nope_stride_h;
  const __nv_bfloat16* q_pe;
  long long q_pe_stride_t, q_pe_stride_h;
  const uint8_t* kv;
  const int* indices;
  long long indices_stride_t;
  const int* topk_length;
  const float* sink;
  int topk, num_splits, heads;
  float sm_scale_log2, lse_scale;
  __nv_bfloat16* out;
  long long out_stride_t, out_stride_h;
  float* lse;
  long long lse_stride_t, lse_stride_h;
  float* part_acc;
  float* part_m;
  float* part_l;
  long long cache_tokens;
  int* bad_index_count;
  float sm_abs;  // |sm_scale_log2|, 0 as the smallest denormal (the kernel's logit scaling, see row_up)
  int reduce_in_cluster;  // the num_splits splits of a (token, head block) are one cluster: merged here
};

// ---- PTX -----------------------------------------------------------------------------------------
// The shared-memory address, mbarrier and bulk-copy wrappers of the Hopper kernel's header and kernels/ptx.cuh;
// the rest here.
using hopper_mla::cluster_sync;
using hopper_mla::fence_mbarrier_init_cluster;
using hopper_mla::ld_cluster_v4_f32;
using hopper_mla::mapa_shared;
using hopper_mla::mbar_arrive;
using hopper_mla::mbar_arrive_expect_tx;
using hopper_mla::mbar_init;
using hopper_mla::mbar_wait;
using hopper_mla::smem_addr;
using ptx::bulk_copy;  // one row, its bytes completed on bar

// Four e4m3 values (low byte first) -> two fp16x2 (bytes 0-1, bytes 2-3), exact: one cvt each, reading
// the register's halves in place (no shift).
__device__ __forceinline__ uint2 e4m3x4_to_f16x2x2(uint32_t four) {
  uint2 out;
  asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.rn.f16x2.e4m3x2 %0, lo;\ncvt.rn.f16x2.e4m3x2 %1, hi;\n}\n"
      : "=r"(out.x), "=r"(out.y)
      : "r"(four));
  return out;
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Max / sum over the four lanes (c = 0..3) that hold one row of a fragment.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xFFFFFFFFu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xFFFFFFFFu, x, 1);
  return x + __shfl_xor_sync(0xFFFFFFFFu, x, 2);
}

// 2^x and 1/x by the special-function unit, without IEEE's subnormal fixups or division subroutine:
// their inputs are logit differences (<= 0; under -126 the result is 0 either way) and positive references.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t two) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&two));
}

// ---- the kernel ------------------------------------------------------------------------------------
template <int kHeadGroups>
__global__ void __launch_bounds__(Shape<kHeadGroups>::kThreads, Shape<kHeadGroups>::kCtasPerSm)
    mma_mla_fp8_kernel(const Params p) {
#if __CUDA_ARCH__ >= 900
  using S = Shape<kHeadGroups>;
  constexpr int kStages = S::kStages;
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* ring = smem;
  int* ids = reinterpret_cast<int*>(smem + S::kRingBytes);
  const uint32_t full = smem_addr(smem + S::kBarrierOffset);  // full[stage] at + 8 * stage

  const int split = blockIdx.y;
  const int t = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;
  const int c = lane % 4;
  const int group = warp % kGroupWarps;  // scale group: ckv columns 128 group ..
  const int head_group = warp / kGroupWarps;
  const int head0 = (blockIdx.x * kHeadGroups + head_group) * kHeadsPerGroup;
  float4* reduce = reinterpret_cast<float4*>(smem + S::kReduceOffset) + head_group * kGroupWarps * kNTiles * 32;
  const uint32_t reduce_free = full + 8 * (kStages + head_group);

  // The split's ids, once: positions split, split + S, ... below the row's length; an id outside the
  // cache becomes -1 here, the one place ids enter (counted by the CTAs of the first head groups only).
  const int n_valid = p.topk_length == nullptr ? p.topk : max(min(p.topk_length[t], p.topk), 0);
  const int n_mine = (n_valid - split + p.num_splits - 1) / p.num_splits;  // >= 0 as split < num_splits
  const int tiles = (n_mine + kBlockTokens - 1) / kBlockTokens;
  const int* row = p.indices + t * p.indices_stride_t + split;
  int bad = 0;
  for (int j = threadIdx.x; j < tiles * kBlockTokens; j += S::kThreads) {
    int id = -1;
    if (j < n_mine) {
      id = row[static_cast<long long>(j) * p.num_splits];
      const bool outside = id < 0 || id >= p.cache_tokens;
      bad += outside && id != -1;
      id = outside ? -1 : id;
    }
    ids[j] = id;
  }
  if (bad > 0 && blockIdx.x == 0) atomicAdd(p.bad_index_count, bad);
  if (threadIdx.x < kStages) mbar_init(full + 8 * threadIdx.x, S::kWarps);  // each warp copies a share
  if (threadIdx.x < kHeadGroups) mbar_init(full + 8 * (kStages + threadIdx.x), 32 * kGroupWarps);
  fence_mbarrier_init_cluster();

  // Q: this warp's group, rows g and g + 8, as fp16 A fragments scaled per row by 2^-shift. k-step j's
  // positions {2c, 2c+1, 2c+8, 2c+9} are the group's columns 32c + 4j + {0..3}: a thread's 8 k-steps
  // read 32 consecutive values (of q here, and of each token's row below).
  uint32_t qa[kGroupKSteps][4];
  float row_up[2];  // 2^shift of rows g, g + 8 (negated with sm_scale_log2)
  // The logits are sm_abs * (partial sums of sign(sm_scale_log2) q.k): the sign folded exactly into
  // row_up and q_pe, the magnitude into one FFMA with the running max below. 0 becomes the smallest
  // denormal, so that a masked -inf stays -inf (every finite sum still gives a logit of 0 after ftz).
  const bool sm_negative = p.sm_scale_log2 < 0.f;
  const float sm_abs = p.sm_abs;  // a kernel parameter: no register across the loop
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const __nv_bfloat16* q = p.q_nope + t * p.q_nope_stride_t + (head0 + g + 8 * r) * p.q_nope_stride_h +
                             group * kGroupDim + 32 * c;
    uint4 raw[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) raw[k] = reinterpret_cast<const uint4*>(q)[k];
    const uint32_t* words = reinterpret_cast<const uint32_t*>(raw);  // word 2j, 2j + 1: k-step j
    float row_max = 0.f;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const float2 v = bf16x2_to_float2(words[k]);
      row_max = fmaxf(row_max, fmaxf(fabsf(v.x), fabsf(v.y)));
    }
    // fmaxf drops NaN; a NaN or inf q still reaches the logits through its fp16 value.
    const float m = quad_max(row_max);
    const int shift = m > 0.f && m <= 3.0e38f ? min(max(ilogbf(m) - kQTopExp, kQMinShift), kQMaxShift) : 0;
    row_up[r] = exp2f(static_cast<float>(shift));
    if (sm_negative) row_up[r] = -row_up[r];  // exact: the logits' sign flip, see sm_abs
#pragma unroll
    for (int j = 0; j < kGroupKSteps; ++j) {
      const float2 lo = bf16x2_to_float2(words[2 * j]), hi = bf16x2_to_float2(words[2 * j + 1]);
      qa[j][r] = pack_f16x2(ldexpf(lo.x, -shift), ldexpf(lo.y, -shift));
      qa[j][r + 2] = pack_f16x2(ldexpf(hi.x, -shift), ldexpf(hi.y, -shift));
    }
  }
  // Rope, bf16 as stored: positions {2c, 2c+1, 2c+8, 2c+9} are rope columns 16 group + 4c + {0..3}.
  uint32_t qpe[4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint2 raw = *reinterpret_cast<const uint2*>(p.q_pe + t * p.q_pe_stride_t +
                                                      (head0 + g + 8 * r) * p.q_pe_stride_h +
                                                      group * kRopePerWarp + 4 * c);
    const uint32_t sign = sm_negative ? 0x80008000u : 0u;  // bf16 negation, exact
    qpe[r] = raw.x ^ sign;
    qpe[r + 2] = raw.y ^ sign;
  }

  // This warp's share of tile `tile`'s rows (tokens kShare warp ..) into its ring stage, one bulk copy a
  // token: every warp copies as many rows every tile (the copies of one warp are issued one lane at a time).
  constexpr int kShare = kBlockTokens / S::kWarps;  // 16 or 8
  static_assert(kShare * S::kWarps == kBlockTokens && kShare <= 32, "a lane a token");
  const auto issue = [&](int tile) {
    const int stage = tile % kStages;
    const uint32_t bar = full + 8 * stage;
    if (lane == 0) mbar_arrive_expect_tx(bar, kShare * kTokenBytes);
    __syncwarp();
    if (lane < kShare) {
      const int k = warp * kShare + lane;
      const int id = ids[tile * kBlockTokens + k];
      const uint8_t* src = id >= 0 ? p.kv + static_cast<long long>(id) * kTokenBytes : g_zero_row;
      bulk_copy(smem_addr(ring + stage * kStageBytes + k * kTokenBytes), src, kTokenBytes, bar);
    }
  };

  __syncthreads();  // the ids and the barriers
  for (int s = 0; s < kStages - 1 && s < tiles; ++s) issue(s);

  float acc[kChunks][4][4];  // [chunk q][n-tile i][fragment] (columns: the write below)
#pragma unroll
  for (int q = 0; q < kChunks; ++q)
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[q][i][e] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};  // log2-domain row maxima (identical in the head group's warps)
  float l_run[2] = {0.f, 0.f};               // row sums (identical in the head group's warps)
  float ref[2] = {0.f, 0.f};                 // this warp's P x scale reference: acc is in its units

  for (int tile = 0; tile < tiles; ++tile) {
    const int stage = tile % kStages;
    mbar_wait(full + 8 * stage, (tile / kStages) & 1);
    const uint8_t* rows = ring + stage * kStageBytes;

    // Partial logits of this warp's group: tokens 8n + g as the B columns.
    float s[kNTiles][4];
    float scale[kNTiles][2];  // this group's scale of tokens 8n + 2c, 8n + 2c + 1
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      const uint8_t* tok = rows + (8 * n + g) * kTokenBytes;
      const uint4 k0 = *reinterpret_cast<const uint4*>(tok + group * kGroupDim + 32 * c);
      const uint4 k1 = *reinterpret_cast<const uint4*>(tok + group * kGroupDim + 32 * c + 16);
      const uint32_t kw[8] = {k0.x, k0.y, k0.z, k0.w, k1.x, k1.y, k1.z, k1.w};
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int j = 0; j < kGroupKSteps; ++j) {
        const uint2 b = e4m3x4_to_f16x2x2(kw[j]);
        mma_f16(s[n], qa[j], b.x, b.y);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        scale[n][e] = *reinterpret_cast<const float*>(rows + (8 * n + 2 * c + e) * kTokenBytes + kScaleOffset +
                                                      4 * group);
      }
      s[n][0] *= scale[n][0] * row_up[0];
      s[n][1] *= scale[n][1] * row_up[0];
      s[n][2] *= scale[n][0] * row_up[1];
      s[n][3] *= scale[n][1] * row_up[1];
      const uint2 rope = *reinterpret_cast<const uint2*>(tok + kKpeOffset + 2 * (group * kRopePerWarp + 4 * c));
      mma_bf16(s[n], qpe, rope.x, rope.y);
    }
    if (tile > 0) mbar_wait(reduce_free, (tile - 1) & 1);  // the previous tile's partials were read
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      reduce[(group * kNTiles + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
    }
    __syncthreads();  // every group's partial logits; every warp is done with the previous tile's stage
    // The refill, a share by every warp, so that no one warp's copies delay the next barrier.
    if (tile + kStages - 1 < tiles) issue(tile + kStages - 1);

    // Whole logits, summed in one order by every warp of the head group; masked tokens -inf.
    const int* tile_ids = ids + tile * kBlockTokens;
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      float4 sum = reduce[n * 32 + lane];
#pragma unroll
      for (int w = 1; w < kGroupWarps; ++w) {
        const float4 part = reduce[(w * kNTiles + n) * 32 + lane];
        sum.x += part.x;
        sum.y += part.y;
        sum.z += part.z;
        sum.w += part.w;
      }
      const bool valid0 = tile_ids[8 * n + 2 * c] >= 0;
      const bool valid1 = tile_ids[8 * n + 2 * c + 1] >= 0;
      // Unscaled (sm_abs >= 0 commutes with the max: sm_abs * max rounds to the max of the products).
      s[n][0] = valid0 ? sum.x : -INFINITY;
      s[n][1] = valid1 ? sum.y : -INFINITY;
      s[n][2] = valid0 ? sum.z : -INFINITY;
      s[n][3] = valid1 ? sum.w : -INFINITY;
      tile_max[0] = fmaxf(tile_max[0], fmaxf(s[n][0], s[n][1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(s[n][2], s[n][3]));
    }
    mbar_arrive(reduce_free);
    // The online softmax, and this warp's P x scale relative to its running reference.
    float beta[2], inv_ref[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m_run[r], quad_max(tile_max[r]) * sm_abs);
      const float m_ref = m_new == -INFINITY ? 0.f : m_new;  // finite: exp2(-inf - m_ref) = 0, never NaN
      const float alpha = fast_exp2(m_run[r] - m_ref);
      m_run[r] = m_new;
      float row_sum = 0.f, ps_max = 0.f;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = fast_exp2(fmaf(s[n][2 * r + e], sm_abs, -m_ref));  // one rounding, not two
          row_sum += pe;
          s[n][2 * r + e] = pe * scale[n][e];
          ps_max = fmaxf(ps_max, s[n][2 * r + e]);
        }
      }
      l_run[r] = l_run[r] * alpha + quad_sum(row_sum);
      const float ref_kept = ref[r] * alpha;  // the old reference in the new maximum's units
      const float ref_new = fmaxf(ref_kept, quad_max(ps_max));
      inv_ref[r] = ref_new > 0.f ? fast_rcp(ref_new) : 0.f;
      // Kept (the common case once the maxima settle): acc is already in its units, so beta is exactly
      // 1 (ref_kept * rcp(ref_new) would be 1 only up to rcp's rounding, defeating the skip below).
      beta[r] = ref_new == ref_kept ? 1.f : ref_kept * inv_ref[r];
      ref[r] = ref_new;
    }

    // P' = P x scale / reference in fp16, as A fragments (two n-tiles of logits per k-step).
    uint32_t pa[kKSteps][4];
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int n = 2 * kk + half;
        pa[kk][2 * half] = pack_f16x2(s[n][0] * inv_ref[0], s[n][1] * inv_ref[0]);
        pa[kk][2 * half + 1] = pack_f16x2(s[n][2] * inv_ref[1], s[n][3] * inv_ref[1]);
      }
    }
    // Once the maxima settle beta is 1 in every lane: the rescale is skipped, warp-uniformly.
    if (__any_sync(0xFFFFFFFFu, beta[0] != 1.f || beta[1] != 1.f)) {
#pragma unroll
      for (int q = 0; q < kChunks; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          acc[q][i][0] *= beta[0];
          acc[q][i][1] *= beta[0];
          acc[q][i][2] *= beta[1];
          acc[q][i][3] *= beta[1];
        }
    }
    // O += P' V: n-tile (q, i), column n is the group's column 16n + 4q + i, so B column g reads the
    // group's columns 16g .. 16g + 15 of a token: one 16-byte load a row, word q holding n-tiles (q, 0..3).
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      const uint8_t* v = rows + (16 * kk + 2 * c) * kTokenBytes + group * kGroupDim + 16 * g;
      const uint4 r0 = *reinterpret_cast<const uint4*>(v);
      const uint4 r1 = *reinterpret_cast<const uint4*>(v + kTokenBytes);
      const uint4 r8 = *reinterpret_cast<const uint4*>(v + 8 * kTokenBytes);
      const uint4 r9 = *reinterpret_cast<const uint4*>(v + 9 * kTokenBytes);
      const uint32_t w0[4] = {r0.x, r0.y, r0.z, r0.w}, w1[4] = {r1.x, r1.y, r1.z, r1.w};
      const uint32_t w8[4] = {r8.x, r8.y, r8.z, r8.w}, w9[4] = {r9.x, r9.y, r9.z, r9.w};
#pragma unroll
      for (int q = 0; q < kChunks; ++q) {
        // Tokens paired per column: (row 2c, row 2c + 1) for b0, (row 2c + 8, row 2c + 9) for b1.
        const uint32_t lo01 = __byte_perm(w0[q], w1[q], 0x5140), hi01 = __byte_perm(w0[q], w1[q], 0x7362);
        const uint32_t lo89 = __byte_perm(w8[q], w9[q], 0x5140), hi89 = __byte_perm(w8[q], w9[q], 0x7362);
        const uint2 b0_lo = e4m3x4_to_f16x2x2(lo01), b1_lo = e4m3x4_to_f16x2x2(lo89);
        const uint2 b0_hi = e4m3x4_to_f16x2x2(hi01), b1_hi = e4m3x4_to_f16x2x2(hi89);
        mma_f16(acc[q][0], pa[kk], b0_lo.x, b1_lo.x);
        mma_f16(acc[q][1], pa[kk], b0_lo.y, b1_lo.y);
        mma_f16(acc[q][2], pa[kk], b0_hi.x, b1_hi.x);
        mma_f16(acc[q][3], pa[kk], b0_hi.y, b1_hi.y);
      }
    }
  }

  // Splits of one cluster merge here (reduce_in_cluster): each split but 0 stages its partial in its own
  // ring (idle: every tile was waited on) in absolute units, thread by thread as a float4 column per
  // value pair, with the rows' maxima and sums; split 0 pulls them in rank order and merges them into its
  // own state (online, as the softmax merges tiles), then writes the final output.
  const bool in_cluster = p.reduce_in_cluster != 0;
  constexpr int kStagedPairs = kChunks * 4;  // float4 columns of acc, then one of (m, m, l, l)
  static_assert((kStagedPairs + 1) * S::kThreads * 16 <= S::kRingBytes, "the staged partial fits in the ring");
  if (in_cluster) {
    float4* staged = reinterpret_cast<float4*>(ring);
    if (split != 0) {
      __syncthreads();  // every warp is done with the ring's last tile
#pragma unroll
      for (int q = 0; q < kChunks; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          staged[(4 * q + i) * S::kThreads + threadIdx.x] =
              make_float4(acc[q][i][0] * ref[0], acc[q][i][1] * ref[0], acc[q][i][2] * ref[1], acc[q][i][3] * ref[1]);
        }
      staged[kStagedPairs * S::kThreads + threadIdx.x] = make_float4(m_run[0], m_run[1], l_run[0], l_run[1]);
    }
    cluster_sync();  // every split's partial staged (release/acquire at cluster scope)
    if (split == 0) {
#pragma unroll
      for (int q = 0; q < kChunks; ++q)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[q][i][e] *= ref[e / 2];
      for (int peer = 1; peer < p.num_splits; ++peer) {
        const uint32_t base = mapa_shared(smem_addr(ring), peer) + threadIdx.x * 16;
        const float4 ml = ld_cluster_v4_f32(base + kStagedPairs * S::kThreads * 16);
        const float peer_m[2] = {ml.x, ml.y}, peer_l[2] = {ml.z, ml.w};
        float keep[2], take[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float m_new = fmaxf(m_run[r], peer_m[r]);
          const float m_ref = m_new == -INFINITY ? 0.f : m_new;  // exp2(-inf - m_ref) = 0, never NaN
          keep[r] = exp2f(m_run[r] - m_ref);
          take[r] = exp2f(peer_m[r] - m_ref);
          l_run[r] = l_run[r] * keep[r] + peer_l[r] * take[r];
          m_run[r] = m_new;
        }
#pragma unroll
        for (int q = 0; q < kChunks; ++q)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float4 v = ld_cluster_v4_f32(base + (4 * q + i) * S::kThreads * 16);
            acc[q][i][0] = acc[q][i][0] * keep[0] + v.x * take[0];
            acc[q][i][1] = acc[q][i][1] * keep[0] + v.y * take[0];
            acc[q][i][2] = acc[q][i][2] * keep[1] + v.z * take[1];
            acc[q][i][3] = acc[q][i][3] * keep[1] + v.w * take[1];
          }
      }
      ref[0] = ref[1] = 1.f;  // acc in absolute units
    }
  }

  // Write: the final output with one split or in a cluster's split 0, else the fp32 partial
  // (unnormalized, in absolute units). acc[q][i][e] is row g (e < 2) or g + 8, column 32c + 16 (e % 2) +
  // 4q + i of the group: a thread holds 32 consecutive columns of each of its rows.
  const bool final_output = p.num_splits == 1 || in_cluster;
  if (!in_cluster || split == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int head = head0 + g + 8 * r;
      const bool empty = l_run[r] == 0.f;
      const float lse2 = empty ? -INFINITY : m_run[r] + log2f(l_run[r]);
      float factor = ref[r];
      if (final_output) {
        factor = empty ? 0.f : ref[r] / l_run[r];
        if (p.sink != nullptr) {
          // 1 / (1 + exp(sink - lse_e)) in base 2; an empty row: 1 / (1 + inf) = 0 on an output of 0.
          factor /= 1.f + exp2f(p.sink[head] * 1.4426950408889634f - lse2);
        }
      }
      const long long part_row = (static_cast<long long>(t) * p.num_splits + split) * p.heads + head;
      const int col0 = group * kGroupDim + 32 * c;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float v[16];
#pragma unroll
        for (int q = 0; q < kChunks; ++q)
#pragma unroll
          for (int i = 0; i < 4; ++i) v[4 * q + i] = acc[q][i][2 * r + half] * factor;
        const int col = col0 + 16 * half;
        if (final_output) {
          uint4 packed[2];
          __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(packed);
#pragma unroll
          for (int e = 0; e < 8; ++e) h[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
          uint4* dst = reinterpret_cast<uint4*>(p.out + t * p.out_stride_t + head * p.out_stride_h + col);
          dst[0] = packed[0];
          dst[1] = packed[1];
        } else {
          float4* dst = reinterpret_cast<float4*>(p.part_acc + part_row * kCkvDim + col);
#pragma unroll
          for (int k = 0; k < 4; ++k) dst[k] = make_float4(v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
        }
      }
      if (group == 0 && c == 0) {
        if (final_output) {
          p.lse[t * p.lse_stride_t + head * p.lse_stride_h] = lse2 * p.lse_scale;
        } else {
          p.part_m[part_row] = m_run[r];
          p.part_l[part_row] = l_run[r];
        }
      }
    }
  }
  // A split's shared memory outlives split 0's reads of it.
  if (in_cluster) cluster_sync();
#else
  // Built for an arch without bulk copies: the launcher refuses before launching.
  __trap();
#endif
}

// ---- host side ------------------------------------------------------------------------------------
enum ErrorCode : int {
  kOk = 0,
  kBadShape = -1,
  kBadAlignment = -2,
  kNullPointer = -3,
  kUnsupportedArch = -4,
  kBadClusterSplits = -5,
};

constexpr int kMaxDevices = 64;
template <int kHeadGroups>
bool g_configured[kMaxDevices] = {};

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }
bool row_aligned(long long stride) { return stride % 8 == 0; }  // bf16 elements: rows stay 16-byte aligned

template <int kHeadGroups>
int launch(const Params& p, int num_tokens, cudaStream_t stream) {
  using S = Shape<kHeadGroups>;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices) return kBadShape;
  // Once per device and kernel: the arch check and the shared-memory opt-in.
  if (!g_configured<kHeadGroups>[device]) {
    int major = 0, smem_optin = 0;
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    // Bulk copies and mbarrier transactions: sm_90 and later; and the ring (sm_120's 99 KB a CTA is too little).
    if (major < 9 || smem_optin < S::kSmemBytes) return kUnsupportedArch;
    err = cudaFuncSetAttribute(mma_mla_fp8_kernel<kHeadGroups>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               S::kSmemBytes);
    if (err != cudaSuccess) return err;
    g_configured<kHeadGroups>[device] = true;
  }
  const dim3 grid(p.heads / (kHeadsPerGroup * kHeadGroups), p.num_splits, num_tokens);
  if (!p.reduce_in_cluster) {
    mma_mla_fp8_kernel<kHeadGroups><<<grid, S::kThreads, S::kSmemBytes, stream>>>(p);
    return cudaGetLastError();
  }
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = p.num_splits;  // the splits of one (token, head block)
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(S::kThreads);
  config.dynamicSmemBytes = S::kSmemBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, mma_mla_fp8_kernel<kHeadGroups>, p);
}

}  // namespace
}  // namespace mma_mla

using namespace mma_mla;

extern "C" {

int dsa_mma_mla_max_splits() { return kMaxSplits; }
int dsa_mma_mla_max_cluster_splits() { return kMaxClusterSplits; }
int dsa_mma_mla_max_tokens() { return kMaxTokens; }
int dsa_mma_mla_max_topk() { return kMaxTopk; }
int dsa_mma_mla_heads_per_group() { return kHeadsPerGroup; }

// See the contract at the top of this file. Returns 0, a CUDA error code (> 0) or a negative
// ErrorCode; dsa_mma_mla_error_string names either. Argument checks come before any CUDA call.
int dsa_mma_mla_decode(const void* q_nope, long long q_nope_stride_t, long long q_nope_stride_h, const void* q_pe,
                       long long q_pe_stride_t, long long q_pe_stride_h, const void* kv, const int* indices,
                       long long indices_stride_t, const int* topk_length, const float* sink, int num_tokens,
                       int heads, int topk, int num_splits, int reduce_in_cluster, float sm_scale_log2,
                       float lse_scale, void* out,
                       long long out_stride_t, long long out_stride_h, float* lse, long long lse_stride_t,
                       long long lse_stride_h, float* part_acc, float* part_m, float* part_l,
                       long long cache_tokens, int* bad_index_count, cudaStream_t stream) {
  if (heads != 16 && heads != 32) return kBadShape;
  if (topk < 1 || topk > kMaxTopk || num_splits < 1 || num_splits > kMaxSplits || num_tokens < 0 ||
      num_tokens > kMaxTokens || cache_tokens < 0) {
    return kBadShape;
  }
  if (num_tokens == 0) return kOk;
  if (q_nope == nullptr || q_pe == nullptr || kv == nullptr || indices == nullptr || out == nullptr ||
      lse == nullptr || bad_index_count == nullptr) {
    return kNullPointer;
  }
  if (reduce_in_cluster && (num_splits < 2 || num_splits > kMaxClusterSplits)) return kBadClusterSplits;
  const bool partials = num_splits > 1 && !reduce_in_cluster;
  if (partials && (part_acc == nullptr || part_m == nullptr || part_l == nullptr)) return kNullPointer;
  // A token stride is never stepped over with one token (torch gives size-1 dims any stride).
  const auto token_aligned = [num_tokens](long long stride) { return num_tokens == 1 || row_aligned(stride); };
  if (!aligned16(q_nope) || !aligned16(q_pe) || !aligned16(kv) || !aligned16(out) ||
      !token_aligned(q_nope_stride_t) || !row_aligned(q_nope_stride_h) || !token_aligned(q_pe_stride_t) ||
      !row_aligned(q_pe_stride_h) || !token_aligned(out_stride_t) || !row_aligned(out_stride_h) ||
      (partials && !aligned16(part_acc))) {
    return kBadAlignment;
  }
  const Params p{static_cast<const __nv_bfloat16*>(q_nope), q_nope_stride_t, q_nope_stride_h,
                 static_cast<const __nv_bfloat16*>(q_pe), q_pe_stride_t, q_pe_stride_h,
                 static_cast<const uint8_t*>(kv), indices, indices_stride_t, topk_length, sink, topk, num_splits,
                 heads, sm_scale_log2, lse_scale, static_cast<__nv_bfloat16*>(out), out_stride_t, out_stride_h, lse,
                 lse_stride_t, lse_stride_h, part_acc, part_m, part_l, cache_tokens, bad_index_count,
                 sm_scale_log2 == 0.f ? std::numeric_limits<float>::denorm_min() : std::fabs(sm_scale_log2),
                 reduce_in_cluster};
  return heads == 2 * kHeadsPerGroup ? launch<2>(p, num_tokens, stream) : launch<1>(p, num_tokens, stream);
}

const char* dsa_mma_mla_error_string(int code) {
  switch (code) {
    case kOk: return "ok";
    case kBadShape:
      static_assert(kMaxTopk == 2048 && kMaxSplits == 64 && kMaxTokens == 65535,
                    "the message below spells these limits out");
      return "heads must be 16 or 32, topk in [1, 2048], num_splits in [1, 64], tokens <= 65535, cache_tokens >= 0";
    case kBadAlignment: return "pointers must be 16-byte aligned and row strides multiples of 8 elements";
    case kNullPointer: return "null device pointer";
    case kUnsupportedArch: return "the small-head kernel needs compute capability 9.0 or later and the shared memory of sm_90/sm_100";
    case kBadClusterSplits:
      static_assert(kMaxClusterSplits == 8, "the message below spells the limit out");
      return "splits merged in a cluster must number 2 to 8";
    default: return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown error";
  }
}

}  // extern "C"
