// Sparse MLA decode attention for Hopper (sm_90a): warp-specialized, wgmma + mbarrier + cp.async + TMA.
//
// Contract (C ABI dsa_hopper_mla_decode below; docs/design.md, Contracts; the same operator as
// triton_sparse_mla.py), per query token t and head h of a group of 64:
//   q_nope [T, H, 512] bf16, q_pe [T, H, 64] bf16: last dim contiguous, token/head strides free
//     (multiples of 8 elements), 16-byte aligned base. H in {16, 32, 64, 128}: below 64 heads the one
//     group's tile still has 64 rows, the missing ones zero Q, computed and never written (what padding q
//     to 64 heads would cost, without the padded copies). q and indices may instead be requests
//     [T / positions, positions, ...] that do not view as tokens (a request stride and a position stride).
//   KV, one latent head shared by all query heads, either
//     bf16: ckv rows of 512 and kpe rows of 64 values (row strides multiples of 8 elements,
//           16-byte aligned bases), indexed by physical token id; or
//     FP8:  656 contiguous bytes per token (512 e4m3, 4 fp32 scales one per 128 values, 64 bf16
//           rope values), 16-byte aligned base; or
//     FP8 staged: that cache dequantized ahead of the kernel into fp16 rows of 576 (ckv then rope; row
//           stride a multiple of 8 elements, 16-byte aligned base), each token scaled down by 2^-shift as
//           the FP8 path scales it (below), and the fp32 factors 2^shift [tokens] (produce_rows).
//   The cache's rows in pages of 2^page_shift tokens, page_rows rows apart (page_rows > 2^page_shift:
//     pages padded by rows, as FlashMLA's tests allocate them; 0 and 1: ids are rows): id i is row
//     (i >> page_shift) * page_rows + (i & (2^page_shift - 1)) (token_row). Staged rows are ids.
//   indices [T, topk] int32 physical token ids, topk a multiple of 64 in [64, 16384]; any negative
//     id (the contract's -1) is masked anywhere in the row: score -inf, row never dereferenced.
//     Optional topk_length [T / tokens_per_length] int32: token t's row ends at
//     topk_length[t / tokens_per_length] (clamped to [0, topk]); the positions past it are masked.
//   Split s of S takes the row positions s, s + S, s + 2S, ... (as the Triton kernel, so the
//     partials feed its combine kernel unchanged).
//   S == 1: output [T, H, 512] bf16 = softmax(sm_scale * q.k) . ckv and lse [T, H] fp32
//     (lse_scale 1: base 2; 1/log2(e): base e); a row with no valid id gives 0 and empty_lse. Optional
//     attn_sink [H] fp32 scales a row's output by 1 / (1 + exp(sink[h] - lse_e)), lse unchanged; optional
//     max_logits [T, H] fp32 (lse's strides) gets the row's largest sm_scale * q.k (-inf when empty).
//   S > 1: partials, row (t * S + s) * H + h: part_acc [., 512] fp16, the unnormalized output times
//     2^-k, one k per 256 columns, and part_scale [., 2] fp32 those 2^k; part_m [.] running max and
//     part_l [.] running sum of the log2-domain logits (empty: -inf, 0), fp32, which the combine kernel
//     finalizes (sink, max_logits and empty_lse there); or, with reduce_in_cluster and S == 2, everything
//     as with S == 1, the two splits of a (token, head group) merged in a 2-CTA cluster (no partials).
//
// CTA = one token x one group of 64 heads x one split; 3 warpgroups (384 threads). FP8 KV with 128
// heads: the two head-group CTAs of a (token, split) form a 2-CTA cluster sharing one gather (below).
//   warpgroup 0, producer: gathers the 64 selected KV rows of each block by index into a 2-stage
//     shared-memory ring (bf16: cp.async 16-byte chunks, which complete full[stage] as they land; FP8:
//     16-byte loads, dequantized with st.shared), signals full[stage]; waits empty[stage] before reusing
//     a stage.
//   warpgroup 1, consumer 0: S = Q . K^T over the block's 64 tokens (m64n64k16, Q resident), the
//     online softmax in the log2 domain, P (bf16; fp16 on the FP8 path) and the rescale factors to
//     shared memory for consumer 1, then O[:, 0 .. 255] += P . V[64 x 256] with P from registers
//     (m64n256k16, V = the first 512 columns of the K tile read MN-major).
//   warpgroup 2, consumer 1: rescales its O and adds P . V[:, 256 .. 511] (P from shared memory)
//     while consumer 0 goes on to the next block's S; it normalizes with consumer 0's row sums.
// Why this shape:
//   - Hopper's TMA has no gather: the producer moves rows by index with cp.async (bf16) or plain
//     loads it can dequantize on the way (FP8), and publishes them with an mbarrier.
//   - The consumers split the work instead of duplicating it: each MMA runs once per CTA (Triton's
//     8-warp tl.dot gave both warpgroups the whole Q.K^T: 1.53x the tensor work). One
//     warpgroup owns S, so Q is read from shared memory once a block (twice when each consumer
//     took half the tokens: shared-memory reads then ~300 KB a block) and whole rows need no
//     exchange of maxima; consumer 1's PV overlaps consumer 0's next S.
//   - Hand-offs are mbarriers (producer <-> consumers) and named barriers of the 256 consumer
//     threads; no block-wide barrier after the prologue.
//   - setmaxnreg moves registers from the producer to the consumers, whose O accumulator alone is
//     128 fp32 registers a thread.
//   - FP8 at 128 heads, both head groups need the same dequantized rows, and the producer's CUDA-core
//     dequantization bounds the FP8 path (ncu: the consumers wait on it). So each CTA of
//     the cluster loads and dequantizes half of every block's tokens into its own ring, and the
//     bulk-copy engine copies them, pass by pass, into the peer's ring, completing their bytes on
//     the peer's full barrier (no fence or remote arrival that would wait for the producer's
//     loads). A stage is refilled only when both CTAs' consumers have released it (every consumer
//     thread on its own CTA's empty barrier, one arrival per consumer warp on the peer's). Only with
//     2+ blocks per CTA (kClusterMinBlocks). bf16 keeps one gather per CTA: cp.async cannot write a
//     peer's memory, and that path is consumer-bound anyway.
//   - Split-KV (grid y) fills the SMs when tokens x head groups are few; the partials are reduced by
//     triton_sparse_mla's combine kernel. They are fp16 with a power-of-two scale per half row: off
//     by 2^-11 of a half row's largest value at most, the order of the rounding the FP8 path's fp16 P
//     already has, so splits that cancel in the merge keep the tolerance (bf16, 2^-9 of each value,
//     did not), at half fp32's traffic. They leave through shared memory, a warp storing 512
//     contiguous bytes (write_result). Two splits instead merge in their cluster through distributed
//     shared memory (reduce_cluster; kClusterSplits says why only two).
//   - Q: bf16 loads it by TMA (two tensor maps built per call, one thread issuing nine 64 x 64 boxes,
//     128-byte swizzled as the resident tile is), overlapping the first block's gather, only consumer 0
//     waiting for it; below 64 heads or with several positions a request, by every thread before the
//     roles start (cp.async); FP8 by the consumers, converting it to fp16 (see the kernel).
//
// FP8 KV runs the MMAs in fp16, not bf16: e4m3 x fp32 scale rounded to bf16 (8-bit mantissa) fails
// the contest tolerance (1e-2 abs and rel; modelled in hopper_model.py for the CPU tests, counted in
// docs/design.md, "Measured choices"), rounded to fp16 (11 bits) it passes. So that path converts Q to
// fp16 once (exact for bf16 values in fp16's normal range), dequantizes K/V to fp16 and rounds P to
// fp16. fp16 ends at 65504, bf16 and the fp32 scales do not; values past it are moved into range by
// powers of two, which are exact and undone in fp32: a head (row of Q) with a value at 2^16 or more
// is stored scaled by 2^-j (load_q_f16) and consumer 0 multiplies its logits by 2^j; a token whose
// dequantized or rope values reach 65504 is stored scaled by 2^-k (store_fp8), and consumer 0
// multiplies its logits and, before rounding P to fp16, its P by 2^k. k stops at 15 (P <= 1 times
// 2^15 stays in fp16): tokens with values of 2^31 or more still overflow to inf. Scales fp16 holds
// exactly (powers of two: DeepSeek V3.2's ue8m0 cache) dequantize on HMUL2, to the same bits.
//
// Shared-memory tiles are 128-byte-swizzled K-major: a [rows x 576] bf16 tile is 9 chunks of
// [rows x 64] (one 128-byte row per matrix row), element (r, 8k + e) of a chunk at byte
// r * 128 + ((k ^ (r % 8)) * 16) + 2e, every chunk 1024-byte aligned (the swizzle is taken on
// address bits, and descriptor base offset 0 assumes aligned atoms).

#include <cuda.h>  // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled, fetched through the runtime (no -lcuda)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "hopper_mla_ptx.cuh"

namespace hopper_mla {
namespace {

// ---- problem and tile constants ---------------------------------------------------------------
constexpr int kCkvDim = 512;
constexpr int kKpeDim = 64;
constexpr int kQkDim = kCkvDim + kKpeDim;  // 576
constexpr int kMaxTopk = 16384;            // the operator's largest topk (FlashMLA's tests' largest)
constexpr int kMaxSplits = 32;             // a 64-token block a split; the combine's limit for fp16 partials
constexpr int kMaxTokens = 65535;          // tokens are the grid's z dimension
constexpr int kHeadsPerCta = 64;           // wgmma M: one warpgroup's accumulator rows
constexpr int kBlockTokens = 64;           // tokens per ring stage (a 64-token page of indices)
constexpr int kConsumers = 2;
constexpr int kColsPerConsumer = kCkvDim / kConsumers;         // O: wgmma N = 256 per consumer
constexpr int kWarpgroupThreads = 128;
constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers);  // 384
constexpr int kConsumerThreads = kWarpgroupThreads * kConsumers;
constexpr int kStages = 2;  // all that fits beside the resident Q (static_assert below)
constexpr int kClusterHeads = 128;  // FP8 at this many heads: the two head groups share the gather
// ... when a CTA has at least this many blocks: with one, the cluster's barriers and launch cost more
// than the halved dequantization saves (docs/design.md, "Measured choices").
constexpr int kClusterMinBlocks = 2;
// FP8 without the cluster: the producer asks the L2 for its tokens a block ahead (produce_fp8) when a
// split has at least this many: a split of a whole row gains the bytes in flight, shorter splits and the
// cluster's producers measured slower with it (counts in between unmeasured; docs/design.md, "Measured
// choices").
constexpr int kL2PrefetchMinTokens = 32 * kBlockTokens;
constexpr int kMmaK = 16;   // wgmma K for bf16
// Two splits merged in a cluster (Params::reduce_in_cluster): the 2 split CTAs of one (token, head
// group) form one cluster (dims (1, 2, 1)); each stages its fp32 partial in its own shared memory and,
// after a cluster barrier, merges half of the columns from both CTAs' (reduce_cluster), so no partial
// goes through global memory and no combine launch follows. Only 2: distributed shared memory moves a
// CTA's fp32 partial slowly, so with more splits the merge costs more than the combine kernel, while at
// 2 splits on a full grid it saves the combine's traffic (docs/design.md, "Measured choices").
constexpr int kClusterSplits = 2;

// FP8 token layout (kernels/fp8.py).
constexpr int kFp8TokenBytes = 656;
constexpr int kFp8ScaleOffset = 512;
constexpr int kFp8KpeOffset = 528;
constexpr int kScaleGroup = 128;
constexpr int kNumScales = kCkvDim / kScaleGroup;  // 4

// ---- shared-memory layout -------------------------------------------------------------------------
constexpr int kSwizzleBytes = 128;                  // one swizzled row: 64 bf16
constexpr int kChunkElems = kSwizzleBytes / 2;      // 64
constexpr int kChunks = kQkDim / kChunkElems;       // 9 (8 ckv + 1 kpe)
constexpr int kSwizzleAtomBytes = 8 * kSwizzleBytes;  // 8 rows: the stride between core-matrix groups
constexpr int kAtomAlign = 1024;
constexpr int kChunkBytes = 64 * kSwizzleBytes;     // a [64 x 64] chunk: 8 KB
constexpr int kTileBytes = kChunks * kChunkBytes;   // a [64 x 576] tile: 72 KB
constexpr int kPBytes = kHeadsPerCta * kSwizzleBytes;  // P [64 heads x 64 tokens] bf16: 8 KB

constexpr int kQOffset = 0;
constexpr int kKOffset = kQOffset + kTileBytes;
constexpr int kPOffset = kKOffset + kStages * kTileBytes;
constexpr int kCodeOffset = kPOffset + kPBytes;  // int [kStages][64] column codes (column_code)
// Consumer 0 -> 1: float [64] rescale factors and [64] row sums; then, for the cluster reduction,
// the row sums and [64] row maxima of the split.
constexpr int kScaleOffset = kCodeOffset + kStages * kBlockTokens * 4;
constexpr int kSumOffset = kScaleOffset + kHeadsPerCta * 4;
constexpr int kMaxOffset = kSumOffset + kHeadsPerCta * 4;
constexpr int kBarOffset = kMaxOffset + kHeadsPerCta * 4;   // u64 full[2], empty[2]
constexpr int kQOverOffset = kBarOffset + 2 * kStages * 8;  // int: FP8, Q has a value past fp16's range
constexpr int kQBarOffset = kQOverOffset + 8;               // u64 (8-aligned): bf16, Q's TMA boxes landed
constexpr int kLayoutBytes = kQBarOffset + 8;
// The dynamic shared-memory base is only 16-byte aligned by the language: 1 KB of slack to align.
constexpr int kSmemBytes = kLayoutBytes + kAtomAlign;
constexpr int kSmemLimit = 227 * 1024;  // sm_90's per-block opt-in maximum

static_assert(kSmemBytes <= kSmemLimit, "Q + 2 stages + P + small must fit the 227 KB of an sm_90 block");
constexpr int kDriverSmemBytes = 1024;  // reserved by the driver below the dynamic allocation (ncu)
static_assert(kSmemLimit + kDriverSmemBytes <= kDescAddressMask + 1,
              "every shared address is inside the 256 KB a wgmma descriptor's address field covers, so "
              "desc_advance never carries into the next field");
static_assert(kKOffset % kAtomAlign == 0 && kTileBytes % kAtomAlign == 0 && kPOffset % kAtomAlign == 0 &&
                  kChunkBytes % kAtomAlign == 0,
              "every swizzled tile starts 1024-byte aligned (descriptor base offset 0)");
static_assert(kBarOffset % 8 == 0, "mbarriers are 8-byte aligned");
static_assert(kHeadsPerCta == 64 && kWarpgroupThreads / 32 * 16 == kHeadsPerCta,
              "wgmma M = 64: each of a warpgroup's 4 warps holds 16 accumulator rows (one head each)");
static_assert(kBlockTokens % 8 == 0 && kBlockTokens <= 256 && kColsPerConsumer <= 256,
              "wgmma N (S: a block's tokens; O: a consumer's columns) is a multiple of 8 up to 256");
static_assert(kQkDim % kChunkElems == 0 && kCkvDim % kChunkElems == 0, "the dims tile into 64-wide chunks");
static_assert(kColsPerConsumer == 4 * kChunkElems, "a consumer's V columns are 4 whole chunks (LBO = one chunk)");
static_assert(kBlockTokens % kMmaK == 0 && (kMmaK / 8) * kSwizzleAtomBytes == 2048,
              "a PV k-step of 16 tokens is two 8-row atoms: the V descriptor advances by 2048 bytes");
static_assert(kNumScales * kScaleGroup == kCkvDim && kScaleGroup == 2 * kChunkElems,
              "an FP8 scale group is two chunks");
static_assert(kFp8TokenBytes % 16 == 0 && kFp8ScaleOffset % 16 == 0 && kFp8KpeOffset % 16 == 0,
              "FP8 token fields are 16-byte aligned for vector loads");
static_assert(kFp8KpeOffset == kFp8ScaleOffset + kNumScales * 4 && kFp8TokenBytes == kFp8KpeOffset + kKpeDim * 2,
              "the 656-byte token layout of dsactl/fp8.py");

// Register split (setmaxnreg): the consumers hold O (64 x 256 fp32 over 128 threads: 128
// registers) plus S and the softmax state; the producer only addresses (bf16) or one raw token
// slice in flight plus the next and, in a cluster, the peer's addresses (FP8: 72 spilled there; 80
// spilled in the unclustered FP8 kernel once it merged two splits in a cluster, and 88 once it mapped
// ids through padded pages, so 16 came from consumer 1, which holds O and, before it, the FP8 Q load's
// 18 pieces: fp8_q_piece addresses them with no division, which 184 needed).
constexpr uint32_t kRegisterFile = 65536;
constexpr uint32_t kEntryRegs = kRegisterFile / kThreads / 8 * 8;  // __launch_bounds__(384, 1): 168
template <bool kFp8>
struct Regs {
  static constexpr uint32_t kProducer = kFp8 ? 96 : 40;
  static constexpr uint32_t kSoftmax = kFp8 ? 232 : 240;  // consumer 0: O, S and P's A fragments
  static constexpr uint32_t kPv = kFp8 ? 176 : 224;       // consumer 1: O
  static_assert(kProducer <= kEntryRegs && kSoftmax >= kEntryRegs && kPv >= kEntryRegs,
                "setmaxnreg.dec lowers, .inc raises");
};
// setmaxnreg.inc waits until the registers are free in the CTA's own allocation (kEntryRegs per
// thread at launch), not the SM's whole file: a split that asks for more than the producer gave back
// never completes (the consumers hang).
template <bool kFp8>
constexpr bool kSplitFits = Regs<kFp8>::kProducer * kWarpgroupThreads +
                                (Regs<kFp8>::kSoftmax + Regs<kFp8>::kPv) * (kConsumerThreads / kConsumers) <=
                            kEntryRegs * kThreads;
static_assert(kSplitFits<false> && kSplitFits<true>, "the register split fits the CTA's launch allocation");
static_assert(Regs<false>::kSoftmax % 8 == 0 && Regs<true>::kSoftmax % 8 == 0 && Regs<false>::kPv % 8 == 0 &&
                  Regs<true>::kPv % 8 == 0 && Regs<false>::kProducer % 8 == 0 && Regs<true>::kProducer % 8 == 0,
              "setmaxnreg counts are multiples of 8");

struct Params {
  const __nv_bfloat16* q_nope;
  long long q_nope_stride_t, q_nope_stride_h;
  const __nv_bfloat16* q_pe;
  long long q_pe_stride_t, q_pe_stride_h;
  const void* kv_a;  // bf16: ckv rows; FP8: the 656-byte token cache; staged: fp16 rows of 576
  long long kv_a_stride;  // bf16, staged: row stride in elements
  const void* kv_b;  // bf16: kpe rows; FP8: unused; staged: each token's factor 2^shift (fp32)
  long long kv_b_stride;
  const int* indices;
  long long indices_stride_t;
  int topk, num_splits, heads;
  int reduce_in_cluster;  // the splits are one cluster and merge their partials there (no partials out)
  float sm_scale_log2, lse_scale;
  __nv_bfloat16* out;
  long long out_stride_t, out_stride_h;
  float* lse;
  long long lse_stride_t, lse_stride_h;
  __half* part_acc;
  float* part_m;
  float* part_l;
  // Ids are valid below this (the cache's tokens); the rest are masked and counted in *bad_index_count.
  // Last, so that the offsets of the fields above stay as they were.
  uint32_t cache_tokens;
  int* bad_index_count;
  float* part_scale;  // 2^k of each partial half row (write_result)
  // FlashMLA's conventions (null: none): per-head sink, per-row largest logit, per-request row lengths.
  const float* attn_sink;
  float* max_logits;
  const int* topk_length;
  int tokens_per_length;  // query tokens a topk_length entry covers (a request's)
  float empty_lse;        // the lse of a row with no valid id
  // Pages of 2^page_shift tokens, page_rows token rows apart (a page padded by rows: FlashMLA's tests);
  // page_shift 0 with page_rows 1: ids are rows.
  uint32_t page_shift, page_mask, page_rows;
  // q and the ids as requests of `positions` tokens (token t is position t % positions of request
  // t / positions) that do not view as tokens: the *_stride_t above step a request, these a position.
  // positions 1: the tokens are flat and these are unused.
  int positions;
  long long q_nope_stride_s, q_pe_stride_s, indices_stride_s;
};

// bf16 with Q by TMA: q_nope and q_pe as [tokens][heads][512 | 64] tensor maps, 64 x 64 boxes, 128-byte
// swizzle (q_tensor_maps); read by TMA from the kernel's parameter space (__grid_constant__). A second
// parameter of that kernel alone (and its barrier after FP8's slot), so that the other kernels' SASS
// stays as it was: with the maps in Params and the barrier before that slot, the FP8 kernels ran slower
// at small T (docs/design.md, "Measured choices").
struct QMaps {
  CUtensorMap nope, pe;
};
struct NoQMaps {};
template <bool kQTma>
using QMapsOf = std::conditional_t<kQTma, QMaps, NoQMaps>;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

constexpr int kCkvChunks = kCkvDim / kChunkElems;  // 8

// fp16's range on the FP8 path (top of the file). A bf16 value rounds to fp16 infinity from 2^16 up;
// below it, bf16's 8-bit significand keeps it at most 65280, which fp16 holds.
constexpr float kFp16Max = 65504.f;
constexpr uint32_t kBf16Pow16 = 0x4780;  // 2^16 as bf16 bits
constexpr int kBf16MaxExponentInFp16 = 15;  // a row whose largest value has exponent E: scaled by 2^-(E - 15)
constexpr float kE4m3Max = 448.f;
constexpr int kMaxTokenShift = 15;  // P (<= 1) times 2^15 stays inside fp16
constexpr int kPiecesPerRow = kSwizzleBytes / 16;  // 16-byte pieces of a swizzled row: 8

// Named barriers (0 is __syncthreads'): consumer 0 -> 1 and back, and the FP8 producer's own.
constexpr uint32_t kBarPReady = 1;      // consumer 0 wrote a block's P and rescale factors
constexpr uint32_t kBarPFree = 2;       // consumer 1 is done with them (its PV completed)
constexpr uint32_t kBarPassReady = 3;   // FP8 in a cluster: a producer pass written (before its copy)
constexpr uint32_t kBarStatsReady = 4;  // consumer 0 wrote the row sums
constexpr uint32_t kBarPartialStaged = 5;  // + c: consumer c's warpgroup staged its partial
constexpr uint32_t kBarQReady = 7;         // FP8: the consumers loaded Q

// A partial leaves through shared memory: written straight from the accumulator layout, a store
// of a quad covers a fraction of a sector in each of 8 rows and the warps stall on the store queue
// ("lg throttle"; docs/design.md, "Measured choices"); staged, each warp stores 512 contiguous bytes,
// 16 a thread. Rows are padded by 8 floats so the 8 rows of a warp's staging store fall on distinct
// bank octets (two wavefronts for its 256 bytes, the least); the padding's first float holds the row's
// 2^-k. The cluster merge reads the same staged fp32 partials.
constexpr int kStageRowFloats = kColsPerConsumer + 8;
constexpr int kStageBytes = kHeadsPerCta * kStageRowFloats * 4;
constexpr int kPartialPieces = kHeadsPerCta * kColsPerConsumer / 8;  // 16-byte fp16 pieces of a consumer's partial
constexpr int kPartialHalves = kCkvDim / kColsPerConsumer;  // scales a partial row: one per consumer
static_assert(kStageBytes <= kTileBytes, "a consumer's staged partial fits in the Q tile or a ring stage");
static_assert(kStages == 2, "consumer 0 stages its partial in the stage the last block did not use");
static_assert(kPartialPieces % kWarpgroupThreads == 0 && (kColsPerConsumer / 8) % 32 == 0,
              "the pieces divide over a warpgroup, and a warp's 32 pieces lie in one row");

struct Smem {
  uint32_t base;  // shared-window address of the 1024-aligned layout
  uint8_t* ptr;   // the same, generic
  __device__ uint32_t q() const { return base + kQOffset; }
  __device__ uint32_t k(int stage) const { return base + kKOffset + stage * kTileBytes; }
  __device__ uint32_t p() const { return base + kPOffset; }
  __device__ int* codes(int stage) const { return reinterpret_cast<int*>(ptr + kCodeOffset) + stage * kBlockTokens; }
  __device__ uint32_t code_addr(int stage, int token) const {
    return base + kCodeOffset + (stage * kBlockTokens + token) * 4;
  }
  __device__ float* row_scale() const { return reinterpret_cast<float*>(ptr + kScaleOffset); }
  __device__ float* row_sum() const { return reinterpret_cast<float*>(ptr + kSumOffset); }
  __device__ float* row_max() const { return reinterpret_cast<float*>(ptr + kMaxOffset); }
  __device__ uint32_t full(int stage) const { return base + kBarOffset + stage * 8; }
  __device__ uint32_t empty(int stage) const { return base + kBarOffset + (kStages + stage) * 8; }
  __device__ uint32_t q_full() const { return base + kQBarOffset; }
  // The bits of the row maxima, reused by the FP8 Q load for the rows' largest |q| (load_q_f16).
  __device__ int* row_bits() const { return reinterpret_cast<int*>(ptr + kMaxOffset); }
  __device__ int* q_over() const { return reinterpret_cast<int*>(ptr + kQOverOffset); }
};

// Byte offset of 16-byte piece `piece` (0..7) of row `row` in a swizzled [rows x 64] chunk.
__device__ __forceinline__ uint32_t swizzled(int row, int piece) {
  return row * kSwizzleBytes + ((piece ^ (row & 7)) << 4);  // rows are >= 0: & 7, not a signed % 8
}

struct Work {
  int group, split, n_mine, num_blocks;
};

// The positions of token t's row that are read: topk, or its request's topk_length clamped to [0, topk].
__device__ __forceinline__ int row_length(const Params& p, int t) {
  return p.topk_length == nullptr ? p.topk
                                  : min(max(__ldg(p.topk_length + t / p.tokens_per_length), 0), p.topk);
}

// How many of them split s of S owns: s, s + S, ... below n (>= 0, as s < S).
__device__ __forceinline__ int split_share(const Params& p, int n, int split) {
  return (n - split + p.num_splits - 1) / p.num_splits;
}

// The grid: x = position * groups + group (a position's head groups adjacent: the 128-head cluster's two
// CTAs), y = split, z = request (Params::positions); log2 of the groups, 0 or 1 (at most 128 heads).
__device__ __forceinline__ int group_bits(const Params& p) { return p.heads > kHeadsPerCta ? 1 : 0; }
__device__ __forceinline__ int grid_position(const Params& p) {
  return static_cast<int>(blockIdx.x) >> group_bits(p);
}

// This CTA's query token, and its offset in q or the ids: read from the grid where used (no division;
// held in a register through the kernel, the token spilled).
__device__ __forceinline__ int cta_token(const Params& p) {
  return static_cast<int>(blockIdx.z) * p.positions + grid_position(p);
}
__device__ __forceinline__ long long token_offset(const Params& p, long long stride_t, long long stride_s) {
  return static_cast<long long>(blockIdx.z) * stride_t + static_cast<long long>(grid_position(p)) * stride_s;
}

// Where the id at position j of this CTA's split s of S lies: row position s + j * S.
__device__ __forceinline__ const int* split_id_ptr(const Params& p, const Work& w, int j) {
  return p.indices + token_offset(p, p.indices_stride_t, p.indices_stride_s) + w.split +
         static_cast<long long>(j) * p.num_splits;
}

__device__ __forceinline__ int split_id(const Params& p, const Work& w, int j) { return __ldg(split_id_ptr(p, w, j)); }

// Block b's token i: split position b * 64 + i, valid below n_mine. The id is returned as loaded and
// tested where it is used (in_cache): a test here would make the producer wait for each index load on
// the spot instead of keeping it in flight until the gather needs it.
__device__ __forceinline__ int gather_index(const Params& p, const Work& w, int b, int token) {
  const int j = b * kBlockTokens + token;
  return j < w.n_mine ? split_id(p, w, j) : -1;
}

// The row of token id idx (< cache_tokens): page idx >> page_shift, token idx & (2^page_shift - 1) in it.
// 32-bit, as the id was: the launcher checks that every row of the cache fits.
__device__ __forceinline__ uint32_t token_row(const Params& p, int idx) {
  const uint32_t u = static_cast<uint32_t>(idx);
  return (u >> p.page_shift) * p.page_rows + (u & p.page_mask);
}

// Whether an id is gathered: one unsigned compare masks -1 and every id outside [0, cache_tokens), so
// no input value makes a gather leave the cache.
__device__ __forceinline__ bool in_cache(const Params& p, int idx) {
  return static_cast<uint32_t>(idx) < p.cache_tokens;
}

// The masked ids of this CTA's split other than the contract's -1, into the device counter: read again
// (from L2) by the producer after its gather: counting among the index loads would take registers
// and issue slots from the 40-register bf16 producer's gather. One CTA per (token, split) counts:
// head group 0's.
__device__ void count_bad_ids(const Params& p, const Work& w) {
  if (w.group != 0) return;
  int bad = 0;
  for (int j = threadIdx.x; j < w.n_mine; j += kWarpgroupThreads) {
    const int idx = split_id(p, w, j);
    bad += !in_cache(p, idx) && idx != -1;
  }
  if (bad > 0) atomicAdd(p.bad_index_count, bad);
}

// ---- producer: bf16 -------------------------------------------------------------------------------
// 8 lanes per token row (lane % 8 = 16-byte piece): a quarter warp writes one whole 128-byte
// swizzled row (conflict-free) and reads 128 contiguous bytes. 4 tokens per warp, 16 per pass.
constexpr int kLanesPerToken = 8;
constexpr int kTokensPerPass = kWarpgroupThreads / kLanesPerToken;  // 16
constexpr int kPasses = kBlockTokens / kTokensPerPass;              // 4
static_assert(kLanesPerToken == kPiecesPerRow, "one lane per 16-byte piece of a swizzled row");
static_assert(kBlockTokens % kTokensPerPass == 0, "whole passes fill a block");

// 2^e as an fp32, exactly (-126 <= e <= 127), and the exponent of a positive normal fp32's bits: the
// powers of two that keep the FP8 path in fp16's range (top of the file).
__device__ __forceinline__ float pow2(int e) { return __int_as_float((127 + e) << 23); }
__device__ __forceinline__ int exponent_of(int bits) { return (bits >> 23) - 127; }

__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// What the producer tells consumer 0 about each token of a block (Smem::codes): kMaskedColumn, or the fp32
// bits of the factor 2^shift its logits and P are multiplied by (store_fp8; shift 0 on the bf16 path).
constexpr int kMaskedColumn = -1;
__device__ __forceinline__ int column_code(int shift) { return __float_as_int(pow2(shift)); }

// This lane's token index of pass q (kPasses passes per block).
__device__ __forceinline__ int pass_index(const Params& p, const Work& w, int q) {
  return gather_index(p, w, q / kPasses, (q % kPasses) * kTokensPerPass + threadIdx.x / kLanesPerToken);
}

// Rows of 16-bit values, copied as they are (cp.async): bf16 ckv and kpe rows, or (kStaged) the FP8 cache
// staged ahead of the kernel (kernels/attention/fp8_staging.py) as what store_fp8 would have written: fp16
// rows of 576 (ckv, then rope) scaled down by each token's 2^-shift, whose factors 2^shift are the column
// codes. Staged rows then run the FP8 path's fp16 MMAs, which undo the shifts.
template <bool kStaged>
__device__ void produce_rows(const Params& p, const Smem& sm, const Work& w) {
  const int piece = threadIdx.x % kLanesPerToken;
  const uint16_t* ckv = static_cast<const uint16_t*>(p.kv_a);
  const uint16_t* kpe = kStaged ? ckv + kCkvDim : static_cast<const uint16_t*>(p.kv_b);
  const long long kpe_stride = kStaged ? p.kv_a_stride : p.kv_b_stride;
  const float* factors = static_cast<const float*>(p.kv_b);
  for (int b = 0; b < w.num_blocks; ++b) {
    const int stage = b % kStages;
    // Every index first: their loads are independent and in flight together.
    int idx[kPasses];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) idx[pass] = pass_index(p, w, b * kPasses + pass);
    if (b >= kStages) mbar_wait(sm.empty(stage), ((b / kStages) - 1) & 1);  // consumers done with block b - 2
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int token = pass * kTokensPerPass + threadIdx.x / kLanesPerToken;
      const bool valid = in_cache(p, idx[pass]);
      // A masked row is zero-filled without a read: P = 0 there, and 0 * garbage could be NaN.
      const uint32_t bytes = valid ? 16 : 0;
      const long long row = valid ? token_row(p, idx[pass]) : 0;
      const uint16_t* ckv_row = ckv + row * p.kv_a_stride + piece * 8;
      const uint32_t dst = sm.k(stage) + swizzled(token, piece);
#pragma unroll
      for (int chunk = 0; chunk < kCkvChunks; ++chunk) {
        cp_async_16(dst + chunk * kChunkBytes, ckv_row + chunk * kChunkElems, bytes);
      }
      cp_async_16(dst + kCkvChunks * kChunkBytes, kpe + row * kpe_stride + piece * 8, bytes);
      if (piece == 0) {
        const int code = kStaged ? __float_as_int(__ldg(factors + row)) : column_code(0);
        sm.codes(stage)[token] = valid ? code : kMaskedColumn;
      }
    }
    // Published when the copies land, without waiting for them: the producer goes on to the next
    // block's indices and copies while these are in flight (the consumers fence, wait_stage), which
    // beats waiting for them here (docs/design.md, "Measured choices").
    cp_async_mbar_arrive(sm.full(stage));
    mbar_arrive(sm.full(stage));  // release: the column codes above
  }
  cp_async_wait_all();  // no copy outlives its issuing thread
  count_bad_ids(p, w);
}

// ---- producer: FP8 --------------------------------------------------------------------------------
// kPeers CTAs (1, or a 2-CTA cluster at 128 heads) share each block's gather: CTA `rank` takes
// passes rank * kPasses / kPeers .. +kPasses / kPeers - 1 of every block, writes them into its ring,
// and one thread bulk-copies each pass to the same offsets of the peer's ring (peer address = local
// address + peer_delta), completing kPeerBytes a block on the peer's full barrier, which its own
// producer expects. (Per-thread st.async to the peer throttled the producer on its store queue.)
// One token slice per lane: its 16-byte piece of each of the 4 scale groups (16 e4m3 values), the
// 4 scales, and its 16-byte piece of the rope values. Software pipeline over passes (across blocks
// too): the next pass's slice and the index after it are loaded before this pass is converted, so
// the loads' latency hides behind the conversion, in 2 x 24 registers.
struct Fp8Slice {
  uint4 e[kNumScales];
  float4 scale;
  uint4 kpe;
  int idx;
};

__device__ __forceinline__ Fp8Slice load_fp8(const Params& p, int idx) {
  const int piece = threadIdx.x % kLanesPerToken;
  Fp8Slice s;
  s.idx = in_cache(p, idx) ? idx : -1;
  if (s.idx >= 0) {
    const uint8_t* token =
        static_cast<const uint8_t*>(p.kv_a) + static_cast<long long>(token_row(p, s.idx)) * kFp8TokenBytes;
#pragma unroll
    for (int g = 0; g < kNumScales; ++g) s.e[g] = ld_global_nc_v4(token + g * kScaleGroup + piece * 16);
    const uint4 raw = ld_global_nc_v4(token + kFp8ScaleOffset);
    s.scale = make_float4(__uint_as_float(raw.x), __uint_as_float(raw.y), __uint_as_float(raw.z),
                          __uint_as_float(raw.w));
    s.kpe = ld_global_nc_v4(token + kFp8KpeOffset + piece * 16);
  } else {
    // Masked: zeros, never a read (P = 0 there, and 0 * garbage could be NaN).
#pragma unroll
    for (int g = 0; g < kNumScales; ++g) s.e[g] = make_uint4(0, 0, 0, 0);
    s.scale = make_float4(0.f, 0.f, 0.f, 0.f);
    s.kpe = make_uint4(0, 0, 0, 0);
  }
  return s;
}

// Two e4m3 values (low byte first) times scale -> two fp16 in one word (low half first). e4m3 ->
// fp16 is exact; the product is rounded once, in fp32 -> fp16.
__device__ __forceinline__ uint32_t dequant2(uint32_t pair, float scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __half2 r = __floats2half2_rn(f.x * scale, f.y * scale);
  return *reinterpret_cast<const uint32_t*>(&r);
}

// The same with a scale fp16 holds exactly: one HMUL2 a pair. The exact product (at most 4 + 11
// significant bits) is rounded once to fp16, as above: the same bits in a third of the instructions.
__device__ __forceinline__ uint32_t dequant2(uint32_t pair, __half2 scale) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
  const __half2 r = __hmul2(__half2(h), scale);
  return *reinterpret_cast<const uint32_t*>(&r);
}

template <bool kFp16>
__device__ __forceinline__ auto group_scale(float scale) {
  if constexpr (kFp16) {
    return __float2half2_rn(scale);
  } else {
    return scale;
  }
}

// 8 e4m3 values (two words) -> 8 fp16 (one 16-byte piece).
template <typename Scale>
__device__ __forceinline__ uint4 dequant8(uint32_t lo, uint32_t hi, Scale scale) {
  return make_uint4(dequant2(lo & 0xFFFF, scale), dequant2(lo >> 16, scale), dequant2(hi & 0xFFFF, scale),
                    dequant2(hi >> 16, scale));
}

// Two bf16 times `scale` (a power of two: exact) -> two fp16, rounded to nearest.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v, float scale) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
  const __half2 h = __floats2half2_rn(f.x * scale, f.y * scale);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint4 bf16x8_to_f16x8(uint4 v, float scale = 1.f) {
  return make_uint4(bf16x2_to_f16x2(v.x, scale), bf16x2_to_f16x2(v.y, scale), bf16x2_to_f16x2(v.z, scale),
                    bf16x2_to_f16x2(v.w, scale));
}

// The largest magnitude of 8 bf16 values, as the bits of an fp32 (which order as the values do).
__device__ __forceinline__ uint32_t bf16x8_absmax_bits(uint4 v) {
  constexpr uint32_t kAbs = 0x7FFF7FFF;
  const uint32_t halves = __vmaxu2(__vmaxu2(v.x & kAbs, v.y & kAbs), __vmaxu2(v.z & kAbs, v.w & kAbs));
  return max(halves << 16, halves & 0xFFFF0000u);
}

// How far row values whose largest has fp32 bits `bits` are scaled down for fp16: 2^-shift with
// shift = max(0, exponent - 15), which leaves a bf16 value at most 65280.
__device__ __forceinline__ int q_row_shift(int bits) { return max(0, exponent_of(bits) - kBf16MaxExponentInFp16); }

// fp16's range (top of the file): the largest magnitude this lane's slice of a token can dequantize
// to (448 times its largest scale) or holds (its rope values).
__device__ __forceinline__ float slice_largest(const Fp8Slice& s) {
  const float scale = fmaxf(fmaxf(fabsf(s.scale.x), fabsf(s.scale.y)), fmaxf(fabsf(s.scale.z), fabsf(s.scale.w)));
  return fmaxf(scale * kE4m3Max, __uint_as_float(bf16x8_absmax_bits(s.kpe)));
}

// How far a token is scaled down, from this lane's slice_largest: 0 while the largest over the token's
// kLanesPerToken adjacent lanes stays under 65504, else k with it times 2^-k below 2^15, at most
// kMaxTokenShift.
__device__ __forceinline__ int token_shift(float largest) {
  static_assert(kLanesPerToken == 8 && 32 % kLanesPerToken == 0, "a token's lanes: 3 xor-shuffle steps in a warp");
#pragma unroll
  for (int lane = 1; lane < kLanesPerToken; lane *= 2) {
    largest = fmaxf(largest, __shfl_xor_sync(0xFFFFFFFF, largest, lane));
  }
  if (!(largest >= kFp16Max)) return 0;
  return min(exponent_of(__float_as_int(largest)) - 14, kMaxTokenShift);  // the exponent is >= 15 here
}

// What a pass sends to the peer: its 16 tokens' rows of every chunk (one contiguous run of 128-byte
// rows: the swizzle depends only on the row) and their 16 column codes. A block's full barrier
// expects the peer's passes of that block.
constexpr uint32_t kPassRowBytes = kTokensPerPass * kSwizzleBytes;  // 2 KB per chunk
constexpr uint32_t kPassCodeBytes = kTokensPerPass * 4;
template <int kPeers>
constexpr uint32_t kPeerBytes = (kPasses - kPasses / kPeers) * (kChunks * kPassRowBytes + kPassCodeBytes);
static_assert(kPassRowBytes % 16 == 0 && kPassCodeBytes % 16 == 0 && kCodeOffset % 16 == 0 &&
                  (kStages * kBlockTokens * 4) % 16 == 0,
              "bulk copies move 16-byte multiples between 16-byte aligned addresses");

// The slice scaled down by 2^shift (shift 0: the compiler drops the multiplies); kFp16Scales: every
// scale is exact in fp16 and shift is 0 (store_fp8).
template <bool kFp16Scales>
__device__ __forceinline__ void store_fp8_shifted(const Smem& sm, int stage, int token, const Fp8Slice& s, int shift) {
  const int piece = threadIdx.x % kLanesPerToken;
  const float down = pow2(-shift);
  const float scales[kNumScales] = {s.scale.x * down, s.scale.y * down, s.scale.z * down, s.scale.w * down};
  // Group g's 16 values of this lane are dims g*128 + piece*16 .. +15: chunk 2g + piece/4, pieces
  // 2 (piece % 4) and +1. Lanes 4-7 store their odd piece first so that a quarter warp's 8 stores
  // hit 8 distinct 16-byte bank groups.
  const int chunk_half = piece / 4;
  const int first = chunk_half;
#pragma unroll
  for (int g = 0; g < kNumScales; ++g) {
    const uint32_t chunk_base = sm.k(stage) + (2 * g + chunk_half) * kChunkBytes;
    const uint4 v = s.e[g];
    const auto scale = group_scale<kFp16Scales>(scales[g]);
    // The words of the piece stored first (values 0..7 for lanes 0-3, 8..15 for lanes 4-7) are chosen
    // before the conversion: 4 selects a group instead of 8 on the converted words.
    const uint4 a = dequant8(first ? v.z : v.x, first ? v.w : v.y, scale);
    const uint4 c = dequant8(first ? v.x : v.z, first ? v.y : v.w, scale);
    const int piece0 = 2 * (piece % 4);
    st_shared_v4(chunk_base + swizzled(token, piece0 + first), a);
    st_shared_v4(chunk_base + swizzled(token, piece0 + 1 - first), c);
  }
  st_shared_v4(sm.k(stage) + kCkvChunks * kChunkBytes + swizzled(token, piece), bf16x8_to_f16x8(s.kpe, down));
  if (piece == 0) sm.codes(stage)[token] = s.idx >= 0 ? column_code(shift) : kMaskedColumn;
}

// Conservatively whether all 4 scales are exact in fp16 (store_fp8 has already sent scales of 2^16 / 448
// and more elsewhere): at most 11 significant bits (the low 13 of the fp32 significand zero) and magnitudes
// of at least 2^-14 (fp16's smallest normal). A false negative only takes the fp32 path, which rounds to
// the same bits.
__device__ __forceinline__ bool scales_fp16_exact(float4 s) {
  const uint32_t x = __float_as_uint(s.x), y = __float_as_uint(s.y), z = __float_as_uint(s.z),
                 w = __float_as_uint(s.w);
  constexpr uint32_t kAbs = 0x7FFFFFFFu, kLowBits = 0x1FFFu, kMinNormal = 0x38800000u;  // 2^-14
  const uint32_t smallest = min(min(x & kAbs, y & kAbs), min(z & kAbs, w & kAbs));
  return ((x | y | z | w) & kLowBits) == 0 && smallest >= kMinNormal;
}

// One vote a warp keeps the common case (every value inside fp16's range) free of the shift's work, and
// a second the commonest (scales exact in fp16, as the power-of-two scales DeepSeek V3.2 writes are) on
// HMUL2.
__device__ __forceinline__ void store_fp8(const Smem& sm, int stage, int token, const Fp8Slice& s) {
  const float largest = slice_largest(s);
  if (__any_sync(0xFFFFFFFF, largest >= kFp16Max)) {
    store_fp8_shifted<false>(sm, stage, token, s, token_shift(largest));
  } else if (__all_sync(0xFFFFFFFF, s.idx < 0 || scales_fp16_exact(s.scale))) {  // masked: all zeros
    store_fp8_shifted<true>(sm, stage, token, s, 0);
  } else {
    store_fp8_shifted<false>(sm, stage, token, s, 0);
  }
}

// The pass of tokens first_token .. +15 of `stage` -> the same offsets of the peer's ring, by the
// bulk-copy engine (issued by one thread), completing its bytes on the peer's full[stage].
__device__ __forceinline__ void send_pass(const Smem& sm, int stage, int first_token, uint32_t peer_delta) {
  const uint32_t rows = sm.k(stage) + first_token * kSwizzleBytes;
  const uint32_t peer_full = sm.full(stage) + peer_delta;
#pragma unroll
  for (int chunk = 0; chunk < kChunks; ++chunk) {
    const uint32_t src = rows + chunk * kChunkBytes;
    bulk_copy_to_peer(src + peer_delta, src, kPassRowBytes, peer_full);
  }
  const uint32_t codes = sm.code_addr(stage, first_token);
  bulk_copy_to_peer(codes + peer_delta, codes, kPassCodeBytes, peer_full);
}

// kL2Prefetch: besides the pass in registers, ask the L2 for this lane's tokens a block ahead (below).
template <int kPeers, bool kL2Prefetch>
__device__ void produce_fp8(const Params& p, const Smem& sm, const Work& w, int rank, uint32_t peer_delta) {
  constexpr int kMyPasses = kPasses / kPeers;
  static_assert(kPasses % kPeers == 0, "the peers split every block's passes evenly");
  static_assert(kMyPasses % 2 == 0, "the passes go in pairs, the two slices alternating (no copies)");
  static_assert(kPeerBytes<kPeers> < (1u << 20), "an mbarrier's tx-count holds under 2^20 bytes");
  if (w.num_blocks == 0) return;
  const int lane_token = static_cast<int>(threadIdx.x) / kLanesPerToken;
  // This lane's index stream, two passes ahead of the conversion: block b, pass k is split position
  // b * 64 + (rank * kMyPasses + k) * 16 + lane_token. A pointer stepped by one pass (after a block's
  // last pass: to the next block's first) and the positions left before n_mine; past the last block
  // they are >= n_mine: -1, no read.
  const int j0 = rank * kMyPasses * kTokensPerPass + lane_token;
  const int* idx_ptr = split_id_ptr(p, w, j0);
  int j_left = w.n_mine - j0;
  constexpr int kBlockStepTokens = kBlockTokens - (kMyPasses - 1) * kTokensPerPass;
  const int pass_step = kTokensPerPass * p.num_splits;     // < 2^31: num_splits <= 32
  const int block_step = kBlockStepTokens * p.num_splits;
  const auto next_index = [&](const int*& ptr, int& left, bool block_end) {
    const int idx = left > 0 ? __ldg(ptr) : -1;
    ptr += block_end ? block_step : pass_step;
    left -= block_end ? kBlockStepTokens : kTokensPerPass;
    return idx;
  };
  // The L2 prefetch stream: the same lane's positions one block (kMyPasses passes) ahead, asked of the
  // L2 while the pass a block before them is converted, each of a token's lanes naming one 128-byte line
  // of its 656 bytes (they span 6 or 7). The pass in registers keeps 16 tokens (10.5 KB) in flight a CTA,
  // which at a microsecond's latency bounds the GPU's gather near the rate this producer reaches without
  // the stream (docs/design.md, "Measured choices"). Each prefetch's index is read a pass before it is
  // used, so the prefetch never waits for it.
  const int* pf_ptr = idx_ptr + kBlockTokens * p.num_splits;
  int pf_left = j_left - kBlockTokens;
  static_assert(kLanesPerToken * 128 >= kFp8TokenBytes + 127, "a token's lanes name every line it touches");
  const int pf_offset = min(static_cast<int>(threadIdx.x % kLanesPerToken) * 128, kFp8TokenBytes - 1);
  const auto prefetch = [&](int idx) {
    if (in_cache(p, idx)) {
      prefetch_l2(static_cast<const uint8_t*>(p.kv_a) + static_cast<long long>(token_row(p, idx)) * kFp8TokenBytes +
                  pf_offset);
    }
  };
  Fp8Slice even = load_fp8(p, next_index(idx_ptr, j_left, kMyPasses == 1));
  int idx_next = next_index(idx_ptr, j_left, kMyPasses == 2);
  int pf_next = -1;
  if constexpr (kL2Prefetch) {
    pf_next = next_index(pf_ptr, pf_left, kMyPasses == 1);
    // The first block's passes past the two the registers take (the stream starts a block ahead).
    static_assert(kMyPasses > 2, "the registers take two passes of the first block; the stream the rest");
    int first_block[kMyPasses - 2];
#pragma unroll
    for (int k = 2; k < kMyPasses; ++k) {
      const int j = j0 + k * kTokensPerPass;
      first_block[k - 2] = j < w.n_mine ? split_id(p, w, j) : -1;
    }
#pragma unroll
    for (int k = 2; k < kMyPasses; ++k) prefetch(first_block[k - 2]);
  }
  const int passes = w.num_blocks * kMyPasses;
  // One pass: convert and store `cur` (pass q), after loading the next pass's slice into `nxt`.
  const auto pass = [&](int q, const Fp8Slice& cur, Fp8Slice& nxt) {
    const int k = q % kMyPasses;
    const int b = q / kMyPasses;
    const int stage = b % kStages;
    const int idx_after = next_index(idx_ptr, j_left, (q + 2) % kMyPasses == kMyPasses - 1);
    if constexpr (kL2Prefetch) {
      const int pf_after = next_index(pf_ptr, pf_left, (q + 1) % kMyPasses == kMyPasses - 1);
      prefetch(pf_next);
      pf_next = pf_after;
    }
    nxt = load_fp8(p, idx_next);  // past the last block: masked, zeros, no read
    idx_next = idx_after;
    if (k == 0 && b >= kStages) {
      // Both CTAs' consumers are done with block b - 2 (every local thread and every peer warp arrived).
      mbar_wait(sm.empty(stage), ((b / kStages) - 1) & 1);
    }
    const int first_token = (rank * kMyPasses + k) * kTokensPerPass;
    store_fp8(sm, stage, first_token + lane_token, cur);
    if constexpr (kPeers > 1) {
      // Each pass goes to the peer as soon as it is written, so the copy of one overlaps the
      // conversion of the next (docs/design.md, "Measured choices"). st.shared (generic proxy) is read
      // by wgmma and the bulk copy (async proxy).
      fence_proxy_async();
      named_barrier_sync(kBarPassReady, kWarpgroupThreads);  // the whole pass is written
      if (threadIdx.x == 0) send_pass(sm, stage, first_token, peer_delta);
      if (k == kMyPasses - 1) {
        // One thread's arrival also expects the bytes the peer's copies deliver here (the tx-count
        // may dip below zero first; the phase cannot complete before every local arrival).
        if (threadIdx.x == 0) {
          mbar_arrive_expect_tx(sm.full(stage), kPeerBytes<kPeers>);
        } else {
          mbar_arrive(sm.full(stage));
        }
      }
    } else if (k == kMyPasses - 1) {
      fence_proxy_async();
      mbar_arrive(sm.full(stage));
    }
  };
  Fp8Slice odd;
  for (int q = 0; q < passes; q += 2) {
    pass(q, even, odd);
    pass(q + 1, odd, even);
  }
  count_bad_ids(p, w);
}

// Two floats -> two fp16 or bf16 in one word (low half first), rounded to nearest.
template <bool kF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kF16) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&b);
  }
}

// ---- consumers ------------------------------------------------------------------------------------
// wgmma accumulator layout (m64nN, fp32): thread (warp w, lane l) of the warpgroup holds rows
// r0 = 16w + l/4 and r0 + 8, columns 8n + 2(l%4) + {0, 1} for n < N/8, in d[4n + 2i + j]
// (i: row r0 + 8i, j: column +j). The A fragment of a register-sourced wgmma k-step (m64k16) is
// a0 = (r0, 2(l%4)), a1 = (r0 + 8, 2(l%4)), a2 = (r0, 8 + 2(l%4)), a3 = (r0 + 8, 8 + 2(l%4)), two
// values a register: columns 16k .. 16k + 15 of the accumulator above, so P feeds the PV MMA from
// the registers S was computed in.
constexpr int kSRegs = kBlockTokens / 2;     // 32: S [64 heads x 64 tokens]
constexpr int kORegs = kColsPerConsumer / 2;  // 128
constexpr int kPvSteps = kBlockTokens / kMmaK;  // 4

struct Rows {
  int r[2];   // this thread's two accumulator rows (heads of the group)
  int quad;   // lane % 4: its column pair
  __device__ explicit Rows(int tid) : r{16 * (tid / 32) + (tid % 32) / 4, 16 * (tid / 32) + (tid % 32) / 4 + 8},
                                      quad(tid % 4) {}
};

// O's rows times the block's rescale factors. Once the rows' maxima settle the factors are exactly 1
// (ex2(0)) in every lane of a warp, which then skips the 128 multiplies (the same vote in every
// thread of the warp: its rows are the warp's own). Only with kSkipOnes: on the bf16 path the vote
// costs more than the multiplies it saves (docs/design.md, "Measured choices").
template <bool kSkipOnes>
__device__ __forceinline__ void rescale_rows(float (&o)[kORegs], const float (&alpha)[2]) {
  if constexpr (kSkipOnes) {
    if (!__any_sync(0xFFFFFFFF, alpha[0] != 1.f || alpha[1] != 1.f)) return;
  }
#pragma unroll
  for (int n = 0; n < kColsPerConsumer / 8; ++n) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      o[4 * n + 2 * i] *= alpha[i];
      o[4 * n + 2 * i + 1] *= alpha[i];
    }
  }
}

// kCopied: the producer's cp.async rows, which the barrier completes for it (produce_rows), fenced here
// for this thread's wgmma.
template <bool kCopied>
__device__ __forceinline__ void wait_stage(const Smem& sm, int b) {
  mbar_wait(sm.full(b % kStages), (b / kStages) & 1);
  if constexpr (kCopied) fence_proxy_async();
}

// This consumer warpgroup is done with block b's stage (K, V, codes), for every CTA's producer that
// writes it: every thread arrives on its own CTA's empty barrier and, in a cluster, one lane per warp
// (after the warp's wgmma wait) on the peer's. (With one lane per warp on both, racecheck reported the
// other lanes' reads of a reused stage against the producer's next writes of it.)
template <int kPeers>
__device__ __forceinline__ void release_stage(const Smem& sm, int b, uint32_t peer_delta) {
  const int stage = b % kStages;
  mbar_arrive(sm.empty(stage));
  if constexpr (kPeers > 1) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbar_arrive_cluster(sm.empty(stage) + peer_delta);
  }
}

// Whether row r of the CTA's 64 is one of the call's heads (below 64 heads the tile's other rows are
// computed on zero Q and never written).
__device__ __forceinline__ bool live_row(const Params& p, const Work& w, int r) {
  return w.group * kHeadsPerCta + r < p.heads;
}

// The power of two a partial's half row is divided by before it is rounded to fp16 (partial_exponent:
// its largest magnitude lands in [2^14, 2^15), below fp16's 65504, every value keeping fp16's 11 bits
// whatever the row's range; clamped where 2^k and 2^-k are normal floats).
constexpr int kPartialTopExponent = 14;
constexpr int kMinPartialExponent = -126, kMaxPartialExponent = 126;

__device__ __forceinline__ int partial_exponent(float amax) {
  const int e = exponent_of(__float_as_int(amax));  // floor(log2) of a normal amax
  return amax > 0.f ? min(max(e - kPartialTopExponent, kMinPartialExponent), kMaxPartialExponent) : 0;
}

constexpr float kLog2e = 1.4426950408889634f;

// 1 / (l + sink term) of a whole row with log2-domain max m and sum l: the output's normalization, the
// sink's exp(sink - lse_e) = 2^(sink log2(e) - m) / l folded in; 0 for an empty row (l = 0), whose
// output stays 0 whatever the sink (a -inf sink would make its term NaN).
__device__ __forceinline__ float row_normalizer(const Params& p, int head, float m, float l) {
  if (l == 0.f) return 0.f;
  const float sink = p.attn_sink == nullptr ? 0.f : exp2f(fmaf(__ldg(p.attn_sink + head), kLog2e, -m));
  return 1.f / (l + sink);
}

// A finished row's lse and (max_logits) largest logit, by one thread of the row.
__device__ __forceinline__ void write_row_stats(const Params& p, int t, int head, float m, float l) {
  const long long at = t * p.lse_stride_t + head * p.lse_stride_h;
  p.lse[at] = l == 0.f ? p.empty_lse : (m + log2f(l)) * p.lse_scale;
  if (p.max_logits != nullptr) p.max_logits[at] = l == 0.f ? -INFINITY : m / kLog2e;
}

// Columns 256c .. 256c + 255 of the CTA's 64 rows: the normalized bf16 output with one split, else the
// partial, staged in fp32 through `staging` (kStageBytes of shared memory no one reads or writes any
// more, 2^-k in each row's padding) and stored as fp16 times 2^-k per half row (consumer), 16 bytes (8
// columns) a thread, with 2^k in part_scale; with_stats: also the lse and max_logits (or the partial's
// max and sum). m_run: the rows' maxima (with one split the sink's normalization needs them).
// Reduced in the cluster, the partial is only staged (its row maxima and sums are in shared memory
// already): reduce_cluster reads it there.
__device__ __forceinline__ void write_result(const Params& p, const Work& w, const Rows& rows, const float (&o)[kORegs],
                                             int c, const float (&l_all)[2], const float (&m_run)[2],
                                             bool with_stats, uint32_t staging) {
  const int col0 = c * kColsPerConsumer + 2 * rows.quad;
  if (p.num_splits == 1) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!live_row(p, w, rows.r[i])) continue;
      const int head = w.group * kHeadsPerCta + rows.r[i];
      const float inv = row_normalizer(p, head, m_run[i], l_all[i]);
      __nv_bfloat16* out = p.out + cta_token(p) * p.out_stride_t + head * p.out_stride_h + col0;
#pragma unroll
      for (int n = 0; n < kColsPerConsumer / 8; ++n) {
        *reinterpret_cast<__nv_bfloat162*>(out + 8 * n) =
            __floats2bfloat162_rn(o[4 * n + 2 * i] * inv, o[4 * n + 2 * i + 1] * inv);
      }
      if (with_stats && rows.quad == 0) write_row_stats(p, cta_token(p), head, m_run[i], l_all[i]);
    }
    return;
  }
  // The fp32 partial goes to shared memory first (the cluster merge reads it there), then leaves in
  // 16-byte fp16 pieces, each row scaled by its own 2^-k.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int n = 0; n < kColsPerConsumer / 8; ++n) {
      st_shared_v2_f32(staging + (rows.r[i] * kStageRowFloats + 8 * n + 2 * rows.quad) * 4, o[4 * n + 2 * i],
                       o[4 * n + 2 * i + 1]);
    }
  }
  if (p.reduce_in_cluster) return;
  const long long part0 =
      (static_cast<long long>(cta_token(p)) * p.num_splits + w.split) * p.heads + w.group * kHeadsPerCta;
  // A row's 256 columns lie in the 4 threads of its quad.
  float amax[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
#pragma unroll
    for (int n = 0; n < kColsPerConsumer / 8; ++n) {
      amax[i] = fmaxf(amax[i], fmaxf(fabsf(o[4 * n + 2 * i]), fabsf(o[4 * n + 2 * i + 1])));
    }
    amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xFFFFFFFF, amax[i], 1));
    amax[i] = fmaxf(amax[i], __shfl_xor_sync(0xFFFFFFFF, amax[i], 2));
  }
  if (rows.quad == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int k = partial_exponent(amax[i]);
      st_shared_b32(staging + (rows.r[i] * kStageRowFloats + kColsPerConsumer) * 4, __float_as_uint(pow2(-k)));
      if (!live_row(p, w, rows.r[i])) continue;
      p.part_scale[(part0 + rows.r[i]) * kPartialHalves + c] = pow2(k);
      if (with_stats) {
        p.part_m[part0 + rows.r[i]] = m_run[i];
        p.part_l[part0 + rows.r[i]] = l_all[i];
      }
    }
  }
  named_barrier_sync(kBarPartialStaged + c, kWarpgroupThreads);
  const int tid = threadIdx.x % kWarpgroupThreads;
  // Not unrolled: this epilogue runs once, and unrolled its code costs the FP8 kernels more in instruction
  // fetch than the loop costs (docs/design.md, "Measured choices").
#pragma unroll 1
  for (int k = 0; k < kPartialPieces / kWarpgroupThreads; ++k) {
    const int piece = k * kWarpgroupThreads + tid;
    const int row = piece / (kColsPerConsumer / 8);
    const int col = piece % (kColsPerConsumer / 8) * 8;
    if (!live_row(p, w, row)) continue;
    const uint32_t src = staging + (row * kStageRowFloats + col) * 4;
    const float f = ld_shared_f32(staging + (row * kStageRowFloats + kColsPerConsumer) * 4);
    const float4 lo = ld_shared_v4_f32(src);
    const float4 hi = ld_shared_v4_f32(src + 16);
    __half* acc = p.part_acc + (part0 + row) * kCkvDim + c * kColsPerConsumer;
    *reinterpret_cast<uint4*>(acc + col) = make_uint4(pack2<true>(lo.x * f, lo.y * f), pack2<true>(lo.z * f, lo.w * f),
                                                      pack2<true>(hi.x * f, hi.y * f), pack2<true>(hi.z * f, hi.w * f));
  }
}

// Where consumer c of a CTA with `num_blocks` blocks staged its partial (write_result's callers): consumer
// 0 in the ring stage its last block did not use, consumer 1 in the Q tile.
__device__ __forceinline__ uint32_t staged_partial(uint32_t base, int c, int num_blocks) {
  return c == 0 ? base + kKOffset + (num_blocks % kStages) * kTileBytes : base + kQOffset;
}

// The cluster's split merge, by the 256 consumer threads of each of its 2 CTAs once both have staged
// their partials and row statistics and passed a cluster barrier. CTA `rank` (its split) owns the
// output columns [256 rank, 256 rank + 256): 4 threads a row, each with 16 16-byte pieces of it, read
// from both CTAs' staged partials (distributed shared memory; all 32 loads issued before their sums)
// and merged exactly as the combine kernel does (fp32 log-sum-exp weights, each thread computing its
// row's from the two row maxima and sums); rank 0 also writes the lse. Both CTAs staged at the same
// offsets: with topk a multiple of 64, the splits' token counts (ceil and floor of topk / 2) never
// straddle a multiple of 64, so both have the same blocks.
constexpr int kMergeThreadsPerRow = kConsumerThreads / kHeadsPerCta;  // 4
constexpr int kRowPieces = kCkvDim / 4;                                // 16-byte (4-float) pieces of a row
static_assert(kColsPerConsumer % 4 == 0, "a piece never straddles the two consumers' partials");

__device__ __forceinline__ void reduce_cluster(const Params& p, const Smem& sm, const Work& w, int rank) {
  constexpr int kSplits = kClusterSplits;
  constexpr int kPieces = kRowPieces / kSplits / kMergeThreadsPerRow;  // this thread's pieces of its row
  static_assert(kPieces >= 1 && kRowPieces % (kSplits * kMergeThreadsPerRow) == 0,
                "every CTA's column share divides evenly over its row's threads");
  const int ct = threadIdx.x - kWarpgroupThreads;  // 0 .. 255 over both consumers
  const int row = ct / kMergeThreadsPerRow;
  uint32_t peer[kSplits];
#pragma unroll
  for (int s = 0; s < kSplits; ++s) peer[s] = mapa_shared(sm.base, s);

  // The row's weights w_s / l, l = sum_s w_s l_s, w_s = 2^(m_s - max m) (the sink's term added to l);
  // exponents against a finite reference, and an empty row (l = 0) gets weights 0 (output 0).
  float m[kSplits], weight[kSplits];
  float m_all = -INFINITY;
#pragma unroll
  for (int s = 0; s < kSplits; ++s) {
    m[s] = ld_cluster_f32(peer[s] + kMaxOffset + row * 4);
    weight[s] = ld_cluster_f32(peer[s] + kSumOffset + row * 4);  // l_s for now
    m_all = fmaxf(m_all, m[s]);
  }
  const float ref = m_all == -INFINITY ? 0.f : m_all;
  float l_all = 0.f;
#pragma unroll
  for (int s = 0; s < kSplits; ++s) {
    m[s] = exp2f(m[s] - ref);
    l_all += m[s] * weight[s];
  }
  if (!live_row(p, w, row)) return;
  const int head = w.group * kHeadsPerCta + row;
  const float inv = row_normalizer(p, head, m_all, l_all);
#pragma unroll
  for (int s = 0; s < kSplits; ++s) weight[s] = m[s] * inv;
  if (rank == 0 && ct % kMergeThreadsPerRow == 0) write_row_stats(p, cta_token(p), head, m_all, l_all);

  // Piece k of this thread: rank's share, then k * 4 + this thread's place in the row, so a warp's
  // 8 rows are each read and written as runs of 4 neighboring pieces.
  __nv_bfloat16* out = p.out + cta_token(p) * p.out_stride_t + head * p.out_stride_h;
#pragma unroll
  for (int k = 0; k < kPieces; ++k) {
    const int col = (rank * kRowPieces / kSplits + k * kMergeThreadsPerRow + ct % kMergeThreadsPerRow) * 4;
    const int c = col / kColsPerConsumer;
    const uint32_t offset = staged_partial(0, c, w.num_blocks) + (row * kStageRowFloats + col % kColsPerConsumer) * 4;
    float4 v[kSplits];
#pragma unroll
    for (int s = 0; s < kSplits; ++s) v[s] = ld_cluster_v4_f32(peer[s] + offset);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int s = 0; s < kSplits; ++s) {
      acc.x += weight[s] * v[s].x;
      acc.y += weight[s] * v[s].y;
      acc.z += weight[s] * v[s].z;
      acc.w += weight[s] * v[s].w;
    }
    const __nv_bfloat162 lo = __floats2bfloat162_rn(acc.x, acc.y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(acc.z, acc.w);
    *reinterpret_cast<uint2*>(out + col) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  }
}

// Every thread of a CTA whose splits reduce in the cluster, after its role's work: a cluster barrier
// once every CTA has staged its partial (release/acquire: the peers' reads see it), the merge by the
// consumers, and a barrier before any CTA exits, as its shared memory must outlive the peers' reads.
// The split is the CTA's rank in the cluster (dims (1, 2, 1): rank = blockIdx.y = split). The launcher
// never sets reduce_in_cluster for the head-group cluster kernels (kPeers = 2).
__device__ __forceinline__ void merge_in_cluster(const Params& p, const Smem& sm, const Work& w, bool consumer) {
  if (!p.reduce_in_cluster) return;
  cluster_sync();
  if (consumer) reduce_cluster(p, sm, w, w.split);  // the launcher checked num_splits == kClusterSplits
  cluster_sync();
}

// O[:, 256c ..] += P [64 x 64] . V[64 tokens x 256 cols] descriptor of consumer c's V columns at
// PV k-step kk: the K tile read MN-major, LBO = one 64-column chunk (8 KB), SBO = one 8-token atom.
__device__ __forceinline__ uint64_t v_desc(const Smem& sm, int stage, int c) {
  return make_desc(sm.k(stage) + c * (kColsPerConsumer / kChunkElems) * kChunkBytes, kChunkBytes, kSwizzleAtomBytes);
}
constexpr uint32_t kVStepBytes = (kMmaK / 8) * kSwizzleAtomBytes;  // 16 tokens: two 8-row atoms

// FP8: multiplies this thread's S (or P) values by their tokens' factors 2^shift (store_fp8): masked
// columns (code -1) stay as they are.
__device__ __forceinline__ void scale_columns(float (&s)[kSRegs], const int* code, const Rows& rows) {
#pragma unroll
  for (int n = 0; n < kBlockTokens / 8; ++n) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int c = code[8 * n + 2 * rows.quad + j];
      const float factor = c == kMaskedColumn ? 1.f : __int_as_float(c);
#pragma unroll
      for (int i = 0; i < 2; ++i) s[4 * n + 2 * i + j] *= factor;
    }
  }
}

// Consumer 0 (the softmax warpgroup): S = Q . K^T over all 64 tokens of a block (m64n64: Q is read
// from shared memory once a block, not once per consumer), the online softmax with whole rows (no
// exchange of row maxima), P to shared memory for consumer 1 and, from registers, its own
// O[:, 0 .. 255] += P . V. It does not wait for consumer 1's PV: the tensor pipe runs consumer 1's
// PV of block b beside this warpgroup's S of block b + 1 (FlashMLA's sm90 decode split).
// FP8: the logits of a row scaled down for fp16 (q_rows_shifted, load_q_f16) and of a scaled-down
// token (its column code) are scaled back here, as is that token's P before it is rounded to fp16.
template <bool kF16, int kPeers, bool kQTma, bool kCopied>
__device__ void consume_softmax(const Params& p, const Smem& sm, const Work& w, uint32_t peer_delta,
                                bool q_rows_shifted) {
  const int tid = threadIdx.x - kWarpgroupThreads;
  const Rows rows(tid);
  float logit_scale[2] = {p.sm_scale_log2, p.sm_scale_log2};
  if (q_rows_shifted) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      logit_scale[i] *= pow2(q_row_shift(sm.row_bits()[rows.r[i]]));
    }
  }
  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.f;
  float s[kSRegs];
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) s[i] = 0.f;  // overwritten by the first k-step (scale_d = 0)
  float m_run[2] = {-INFINITY, -INFINITY};  // log2-domain running max of whole rows
  float l_run[2] = {0.f, 0.f};              // this thread's share of the running sum

  const uint64_t q_desc = make_desc(sm.q(), 16, kSwizzleAtomBytes);
  // Q's TMA boxes. Also with no block to consume, so that the CTA never exits under them and
  // consumer 1 stages its partial in the Q tile only after they landed (kBarStatsReady orders it).
  if constexpr (kQTma) mbar_wait(sm.q_full(), 0);
  for (int b = 0; b < w.num_blocks; ++b) {
    const int stage = b % kStages;
    wait_stage<kCopied>(sm, b);

    // S = Q [64 x 576] . K[0 .. 63]^T: both operands K-major, 36 k-steps of 16.
    const uint64_t k_desc = make_desc(sm.k(stage), 16, kSwizzleAtomBytes);
    wgmma_fence();
#pragma unroll
    for (int chunk = 0; chunk < kChunks; ++chunk) {
#pragma unroll
      for (int kk = 0; kk < kChunkElems / kMmaK; ++kk) {
        const uint32_t offset = chunk * kChunkBytes + kk * kMmaK * 2;  // k_bytes inside the 128-byte row
        wgmma_m64n64k16_kk<kF16>(s, desc_advance(q_desc, offset), desc_advance(k_desc, offset), (chunk | kk) != 0);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) fence_operand(s[i]);

    // Scale into the log2 domain, mask invalid tokens, row maxima (a row's 64 values: 16 here, the
    // rest in the quad's other 3 threads).
    const int* code = sm.codes(stage);
    // FP8: scaled-down tokens among this warp's columns (one vote; their logits and P scaled back).
    bool shifted_columns = false;
    if constexpr (kF16) {
      int largest = kMaskedColumn;
#pragma unroll
      for (int n = 0; n < kBlockTokens / 8; ++n) {
#pragma unroll
        for (int j = 0; j < 2; ++j) largest = max(largest, code[8 * n + 2 * rows.quad + j]);
      }
      shifted_columns = __any_sync(0xFFFFFFFF, largest > column_code(0));
      if (shifted_columns) scale_columns(s, code, rows);
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kBlockTokens / 8; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool valid = code[8 * n + 2 * rows.quad + j] != kMaskedColumn;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float& v = s[4 * n + 2 * i + j];
          v = valid ? v : -INFINITY;  // raw logits: the scale (> 0) is applied to the max and in the FFMA
          mx[i] = fmaxf(mx[i], v);
        }
      }
    }
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFF, mx[i], 1));
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xFFFFFFFF, mx[i], 2));
      const float m_new = fmaxf(m_run[i], mx[i] * logit_scale[i]);
      // Exponents against a finite reference: exp2(-inf - ref) = 0, never (-inf) - (-inf).
      const float ref = m_new == -INFINITY ? 0.f : m_new;
      alpha[i] = ex2_ftz(m_run[i] - ref);
      m_run[i] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kBlockTokens / 8; ++n) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float& v = s[4 * n + 2 * i + j];
          v = ex2_ftz(fmaf(v, logit_scale[i], -ref));
          sum += v;
        }
      }
      l_run[i] = l_run[i] * alpha[i] + sum;
    }
    rescale_rows<kF16>(o, alpha);

    // P as this warpgroup's A fragments (bf16; fp16 on the FP8 path), and to shared memory with the
    // rescale factors for consumer 1, once it has finished with the previous block's.
    if (shifted_columns) scale_columns(s, code, rows);  // P of scaled-down tokens, after the row sums
    uint32_t pa[kPvSteps][4];
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int n = 2 * kk + h;
          pa[kk][2 * h + i] = pack2<kF16>(s[4 * n + 2 * i], s[4 * n + 2 * i + 1]);
        }
      }
    }
    if (b > 0) named_barrier_sync(kBarPFree, kConsumerThreads);
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
      for (int f = 0; f < 4; ++f) {  // fragment register f: row r[f % 2], 8-token piece 2kk + f / 2
        st_shared_b32(sm.p() + swizzled(rows.r[f % 2], 2 * kk + f / 2) + rows.quad * 4, pa[kk][f]);
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (rows.quad == 0) sm.row_scale()[rows.r[i]] = alpha[i];
    }
    fence_proxy_async();  // st.shared (generic proxy) is read by consumer 1's wgmma (async proxy)
    // An arrive, not a sync: bar.arrive orders this thread's writes above before the reads that follow
    // consumer 1's bar.sync. racecheck reports the factors' write and read as a hazard: it does not model that.
    named_barrier_arrive(kBarPReady, kConsumerThreads);

    const uint64_t v0 = v_desc(sm, stage, 0);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) wgmma_m64n256k16_rs<kF16>(o, pa[kk], desc_advance(v0, kk * kVStepBytes));
    wgmma_commit();
    // Waited here rather than after the next block's S: a PV group still in flight across the
    // loop's back edge makes ptxas serialize every wgmma of the kernel (C7514/C7515).
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kORegs; ++i) fence_operand(o[i]);
    release_stage<kPeers>(sm, b, peer_delta);
  }

  // Whole row sums (the quad's 4 threads) to consumer 1, which normalizes its columns with them.
  float l_all[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_all[i] = l_run[i] + __shfl_xor_sync(0xFFFFFFFF, l_run[i], 1);
    l_all[i] += __shfl_xor_sync(0xFFFFFFFF, l_all[i], 2);
    if (rows.quad == 0) {
      sm.row_sum()[rows.r[i]] = l_all[i];
      sm.row_max()[rows.r[i]] = m_run[i];  // read by consumer 1 (the sink) and the cluster merge
    }
  }
  named_barrier_arrive(kBarStatsReady, kConsumerThreads);
  // Staged in the ring stage the last block did not use (kStages == 2): unused with one block, else
  // block num_blocks - 2's, which consumer 1 finished reading before this warpgroup passed kBarPFree
  // for the last block; no producer (nor a cluster peer's) has a block left to put there.
  write_result(p, w, rows, o, 0, l_all, m_run, true, staged_partial(sm.base, 0, w.num_blocks));
  merge_in_cluster(p, sm, w, true);
}

// Consumer 1: O[:, 256 .. 511] += P . V with P and the rescale factors from consumer 0.
template <bool kF16, int kPeers, bool kCopied>
__device__ void consume_pv(const Params& p, const Smem& sm, const Work& w, uint32_t peer_delta) {
  const int tid = threadIdx.x - 2 * kWarpgroupThreads;
  const Rows rows(tid);
  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.f;

  const uint64_t p_desc = make_desc(sm.p(), 16, kSwizzleAtomBytes);
  for (int b = 0; b < w.num_blocks; ++b) {
    const int stage = b % kStages;
    wait_stage<kCopied>(sm, b);  // this warpgroup's own acquire of the stage it reads
    named_barrier_sync(kBarPReady, kConsumerThreads);
    float alpha[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) alpha[i] = sm.row_scale()[rows.r[i]];
    rescale_rows<kF16>(o, alpha);
    const uint64_t v1 = v_desc(sm, stage, 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
      wgmma_m64n256k16_kmn<kF16>(o, desc_advance(p_desc, kk * kMmaK * 2), desc_advance(v1, kk * kVStepBytes), 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < kORegs; ++i) fence_operand(o[i]);
    release_stage<kPeers>(sm, b, peer_delta);
    // P and the factors are read (the MMAs completed): consumer 0 may write the next block's. A sync
    // on both sides, not an arrive here: racecheck does not order this warpgroup's reads before
    // consumer 0's later writes through bar.arrive. It costs nothing, as this warpgroup would wait
    // for the next block's P right after anyway.
    if (b + 1 < w.num_blocks) named_barrier_sync(kBarPFree, kConsumerThreads);
  }

  named_barrier_sync(kBarStatsReady, kConsumerThreads);
  float l_all[2], m_all[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_all[i] = sm.row_sum()[rows.r[i]];
    m_all[i] = sm.row_max()[rows.r[i]];
  }
  // Staged in the Q tile: consumer 0's last S (its only reader) completed before the last P it
  // passed this warpgroup (kBarPReady).
  write_result(p, w, rows, o, 1, l_all, m_all, false, staged_partial(sm.base, 1, w.num_blocks));
  merge_in_cluster(p, sm, w, true);
}

// Q [64 heads x 576] -> the resident swizzled tile (64 rows x 9 chunks x 8 pieces): where piece `piece`
// of chunk `chunk` of row `row` comes from, where it goes, its row.
struct QPiece {
  const __nv_bfloat16* src;
  uint32_t dst;
  int row;
  bool live;  // a row of the call's heads; below 64 heads the rows past them are zeros, never read
};
constexpr int kQPieces = kHeadsPerCta * kChunks * kPiecesPerRow;

__device__ __forceinline__ QPiece q_piece(const Params& p, const Smem& sm, const Work& w, int row, int chunk,
                                          int piece) {
  const int head = w.group * kHeadsPerCta + row;
  const bool live = head < p.heads;
  const long long read_head = live ? head : 0;
  const __nv_bfloat16* src =
      chunk < kCkvChunks
          ? p.q_nope + token_offset(p, p.q_nope_stride_t, p.q_nope_stride_s) + read_head * p.q_nope_stride_h +
                chunk * kChunkElems + piece * 8
          : p.q_pe + token_offset(p, p.q_pe_stride_t, p.q_pe_stride_s) + read_head * p.q_pe_stride_h + piece * 8;
  return {src, sm.q() + chunk * kChunkBytes + swizzled(row, piece), row, live};
}

// The q-th piece of the tile in row-major order (chunks, then pieces): consecutive threads, consecutive
// 16 bytes of a row.
__device__ __forceinline__ QPiece q_piece(const Params& p, const Smem& sm, const Work& w, int q) {
  return q_piece(p, sm, w, q / (kChunks * kPiecesPerRow), (q / kPiecesPerRow) % kChunks, q % kPiecesPerRow);
}

// FP8's Q loaders (the 256 consumer threads): loader l reads piece l % 8 of every chunk of rows l / 8 and
// l / 8 + 32, so its k-th piece's row and chunk are constants of k and it addresses two heads, where the
// row-major order took a division per piece (with the page map in the gather, that spilled).
constexpr int kQLoaderRowStep = kConsumerThreads / kPiecesPerRow;  // 32
constexpr int kQLoaderPieces = kQPieces / kConsumerThreads;        // 18: kChunks pieces of 2 rows
static_assert(kQLoaderRowStep * (kQLoaderPieces / kChunks) == kHeadsPerCta && kQLoaderPieces % kChunks == 0,
              "the FP8 Q loaders cover every row once");
__device__ __forceinline__ QPiece fp8_q_piece(const Params& p, const Smem& sm, const Work& w, int loader, int k) {
  return q_piece(p, sm, w, loader / kPiecesPerRow + (k / kChunks) * kQLoaderRowStep, k % kChunks,
                 loader % kPiecesPerRow);
}

// bf16: Q as it is, by every thread of the CTA (cp.async), fenced for wgmma (the async proxy); the
// caller's barrier publishes it.
__device__ __forceinline__ void load_q_bf16(const Params& p, const Smem& sm, const Work& w) {
  static_assert(kQPieces % kThreads == 0, "the Q pieces divide evenly over the CTA's threads");
#pragma unroll
  for (int k = 0; k < kQPieces / kThreads; ++k) {
    const QPiece q = q_piece(p, sm, w, k * kThreads + threadIdx.x);
    cp_async_16(q.dst, q.src, q.live ? 16 : 0);
  }
  cp_async_commit();
  cp_async_wait_all();
  fence_proxy_async();
}

// bf16 (whole 64-head groups of flat tokens): Q as it is, by TMA from one thread: the 8 ckv chunks and the kpe
// chunk of this head group, one 64 x 64 box each, completing their bytes on q_full (initialized by this thread just
// before). TMA's 128-byte swizzle puts element (r, 8k + e) of a box at r * 128 + ((k ^ (r % 8)) * 16) + 2e of its
// 1024-aligned destination: the resident tile's layout (top of the file). Flat tokens only (positions 1), so the
// token is the grid's z.
__device__ __forceinline__ void load_q_bf16_tma(const QMaps& maps, const Smem& sm, const Work& w) {
  static_assert(kChunkElems * 2 == kSwizzleBytes && kChunkBytes == kHeadsPerCta * kSwizzleBytes,
                "a box is one swizzled chunk: 64 heads x 128 bytes");
  mbar_arrive_expect_tx(sm.q_full(), kTileBytes);
  const int head0 = w.group * kHeadsPerCta;
  const int token = static_cast<int>(blockIdx.z);
#pragma unroll
  for (int chunk = 0; chunk < kCkvChunks; ++chunk) {
    tma_load_3d(sm.q() + chunk * kChunkBytes, &maps.nope, chunk * kChunkElems, head0, token, sm.q_full());
  }
  tma_load_3d(sm.q() + kCkvChunks * kChunkBytes, &maps.pe, 0, head0, token, sm.q_full());
}

// FP8: Q converted to fp16 by the consumers' 256 threads (this one `loader`; all loads issued before
// the first store) and published to both consumer warpgroups (kBarQReady). fp16 overflows where bf16
// reaches 2^16; a CTA with such a value (Smem::q_over, set by any thread that saw one, read by all
// after the barrier) reads Q again for the rows' largest magnitudes (Smem::row_bits) and once more to
// store each row scaled by 2^-q_row_shift (exact), and consumer 0 scales the row's logits back
// (reloaded rather than kept: 72 registers live across the barrier spilled). Returns whether it did.
// The rows' maxima are cleared in the kernel's prologue: cleared here, behind a barrier of their own,
// racecheck reported consumer 0's later write of the rescale factors against consumer 1's read (that
// hand-off is ordered by kBarPFree / kBarPReady).
// The check's cost shows only at a few tokens; 4 threads a row finding each row's shift by shuffles,
// with no second pass, cost more: every load then lands before the first store (docs/design.md,
// "Measured choices").
__device__ __forceinline__ uint4 q_load(const QPiece& q) {
  return q.live ? ld_global_nc_v4(q.src) : make_uint4(0, 0, 0, 0);
}

__device__ __forceinline__ bool load_q_f16(const Params& p, const Smem& sm, const Work& w, int loader) {
  constexpr int kPerThread = kQLoaderPieces;
  uint4 raw[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) raw[k] = q_load(fp8_q_piece(p, sm, w, loader, k));
  uint32_t largest = 0;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    st_shared_v4(fp8_q_piece(p, sm, w, loader, k).dst, bf16x8_to_f16x8(raw[k]));
    largest = max(largest, bf16x8_absmax_bits(raw[k]));
  }
  fence_proxy_async();
  if (largest >= (kBf16Pow16 << 16)) atomicOr(sm.q_over(), 1);
  named_barrier_sync(kBarQReady, kConsumerThreads);
  if (!*sm.q_over()) return false;
  int* row_bits = sm.row_bits();  // cleared in the kernel's prologue
#pragma unroll 1
  for (int k = 0; k < kPerThread; ++k) {
    const QPiece q = fp8_q_piece(p, sm, w, loader, k);
    atomicMax(&row_bits[q.row], bf16x8_absmax_bits(q_load(q)));
  }
  named_barrier_sync(kBarQReady, kConsumerThreads);
#pragma unroll 1
  for (int k = 0; k < kPerThread; ++k) {
    const QPiece q = fp8_q_piece(p, sm, w, loader, k);
    st_shared_v4(q.dst, bf16x8_to_f16x8(q_load(q), pow2(-q_row_shift(row_bits[q.row]))));
  }
  fence_proxy_async();
  named_barrier_sync(kBarQReady, kConsumerThreads);
  return true;
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// Grid (head group, split, token); the head groups of one (token, split) are adjacent so that
// their identical gathers hit L2, and form the cluster when kPeers = 2 (cluster dims (kPeers, 1, 1)).
// kStaged: FP8 KV staged as fp16 rows (produce_rows); the rest of the kernel is the FP8 path's.
template <bool kFp8, int kPeers, bool kQTma, bool kStaged, bool kL2Prefetch>
__global__ void __launch_bounds__(kThreads, 1) hopper_mla_kernel(const __grid_constant__ Params p,
                                                                  const __grid_constant__ QMapsOf<kQTma> q_maps) {
  static_assert(kPeers == 1 || (kPeers == 2 && kFp8 && !kStaged),
                "only the FP8 producer shares its gather, with one peer");
  static_assert(!kStaged || kFp8, "staged rows run the FP8 path's fp16 consumers");
  static_assert(!(kFp8 && kQTma), "FP8 converts Q in its consumers; only bf16 loads it by TMA");
  static_assert(!kL2Prefetch || (kFp8 && !kStaged && kPeers == 1), "only the unshared FP8 gather prefetches");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // The producer copies rows by cp.async (produce_rows), which complete their stage's full barrier as
  // they land: bf16 and staged rows.
  constexpr bool kCopied = !kFp8 || kStaged;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t aligned = (raw + kAtomAlign - 1) & ~static_cast<uint32_t>(kAtomAlign - 1);
  const Smem sm{aligned, smem_raw + (aligned - raw)};

  Work w;
  w.group = static_cast<int>(blockIdx.x) & ((1 << group_bits(p)) - 1);
  w.split = blockIdx.y;
  // Every role runs the blocks of the split's whole share of the row, whose bounds come from the launch's
  // constants (read from topk_length, they took registers the FP8 consumers' Q load does not have: it
  // spilled); topk_length only shortens what the producer reads (below), the rest masked.
  w.n_mine = split_share(p, p.topk, w.split);
  w.num_blocks = (w.n_mine + kBlockTokens - 1) / kBlockTokens;

  if (threadIdx.x == 0) {
    *sm.q_over() = 0;
    for (int r = 0; r < kHeadsPerCta; ++r) sm.row_bits()[r] = 0;  // FP8's Q rows' maxima (load_q_f16)
    for (int s = 0; s < kStages; ++s) {
      // Every local producer thread arrives (the peer: bytes), and its copies once more (kCopied).
      mbar_init(sm.full(s), kCopied ? 2 * kWarpgroupThreads : kWarpgroupThreads);
      // Every local consumer thread and, in a cluster, every consumer warp of the peer.
      mbar_init(sm.empty(s), kConsumerThreads + (kPeers - 1) * kConsumerThreads / 32);
    }
    if constexpr (kPeers > 1) fence_mbarrier_init_cluster();
    if constexpr (kQTma) {
      mbar_init(sm.q_full(), 1);  // this thread's expect_tx; the TMA completes the bytes
      fence_proxy_async();  // the initialized barrier visible to the TMA unit (async proxy)
      load_q_bf16_tma(q_maps, sm, w);
    }
  }
  // The peer's ring, at the same offsets of its (identically laid out) shared memory.
  const int rank = kPeers > 1 ? static_cast<int>(cluster_ctarank()) : 0;
  const uint32_t peer_delta = kPeers > 1 ? mapa_shared(sm.base, rank ^ 1) - sm.base : 0;
  // bf16: Q by TMA (above), landing while the producer gathers the first block; only consumer 0, its
  // reader, waits for it. Both ways of overlapping it by cp.async lost (the consumers loading it, or the
  // producer issuing it ahead of block 0): their copies competed with the gather's. Below 64 heads or
  // with several positions a request (no whole 64-head box of flat tokens): by every thread first.
  // FP8: by the consumers, converting it while the producer gathers the first block, which beats every
  // thread loading it first (docs/design.md, "Measured choices").
  if constexpr (!kFp8 && !kQTma) load_q_bf16(p, sm, w);
  // The initialized barriers (and the cp.async Q) are visible to every warpgroup, and to the peer, whose
  // producer arrives and copies into them, before any role starts.
  if constexpr (kPeers > 1) {
    cluster_sync();
  } else {
    __syncthreads();
  }

  // Roles: each is one branch of a single if/else, as setmaxnreg requires.
  const int warpgroup = threadIdx.x / kWarpgroupThreads;
  if (warpgroup == 0) {
    setmaxnreg_dec<Regs<kFp8>::kProducer>();
    // The prefetching producer reads whole rows: with the row length's code it spilled (the launcher sends
    // calls with topk_length to the plain FP8 producer).
    if constexpr (!kL2Prefetch) w.n_mine = split_share(p, row_length(p, cta_token(p)), w.split);
    if constexpr (kFp8 && !kStaged) {
      produce_fp8<kPeers, kL2Prefetch>(p, sm, w, rank, peer_delta);
    } else {
      produce_rows<kStaged>(p, sm, w);
    }
    merge_in_cluster(p, sm, w, false);
  } else if (warpgroup == 1) {
    setmaxnreg_inc<Regs<kFp8>::kSoftmax>();
    bool q_rows_shifted = false;
    if constexpr (kFp8) q_rows_shifted = load_q_f16(p, sm, w, threadIdx.x - kWarpgroupThreads);
    consume_softmax<kFp8, kPeers, kQTma, kCopied>(p, sm, w, peer_delta, q_rows_shifted);
  } else {
    setmaxnreg_inc<Regs<kFp8>::kPv>();
    // This warpgroup never reads Q but loads half of it, through the same barriers (with bar.arrive on
    // kBarQReady here racecheck reported the consumers' later hand-off of the rescale factors as a race).
    if constexpr (kFp8) load_q_f16(p, sm, w, threadIdx.x - kWarpgroupThreads);
    consume_pv<kFp8, kPeers, kCopied>(p, sm, w, peer_delta);
  }
  // A CTA's shared memory must outlive the peer's last store and arrivals into it.
  if constexpr (kPeers > 1) cluster_sync();
#else
  // Built for another arch: the launcher refuses before launching; reaching here is a bug.
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
  kNoTensorMaps = -6,
  kBadLogitScale = -7,
  kBadKvFormat = -8,
  kBadPages = -9,
};

// The KV forms dsa_hopper_mla_decode takes (kv_format).
enum KvFormat : int { kKvBf16 = 0, kKvFp8 = 1, kKvStaged = 2 };

constexpr int kMaxDevices = 64;
template <bool kFp8, int kPeers, bool kQTma, bool kStaged, bool kL2Prefetch>
bool g_configured[kMaxDevices] = {};

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// A row stride (in bf16 elements) that keeps every row 16-byte aligned.
bool row_aligned(long long stride) { return stride % 8 == 0; }

// bf16: the TMA view of q_nope / q_pe as [tokens][heads][dim] bf16 with
// 64-wide x 64-head boxes and 128-byte swizzle (load_q_bf16_tma). Built per call (the pointers change;
// encoding is host-only work). The alignment checks before it are TMA's: 16-byte base and strides.
int q_tensor_maps(const Params& p, int num_tokens, QMaps& maps) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (encode == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess) return err;
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) return kNoTensorMaps;
    encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }
  const auto map = [&](CUtensorMap* out, const __nv_bfloat16* base, int dim, long long stride_t,
                       long long stride_h) {
    constexpr long long kElemBytes = 2;
    // A token stride is never stepped over with one token; TMA still wants a valid one.
    const long long token_stride = num_tokens == 1 ? stride_h * p.heads : stride_t;
    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(dim), static_cast<cuuint64_t>(p.heads),
                                static_cast<cuuint64_t>(num_tokens)};
    const cuuint64_t strides[2] = {static_cast<cuuint64_t>(stride_h * kElemBytes),
                                   static_cast<cuuint64_t>(token_stride * kElemBytes)};
    const cuuint32_t box[3] = {kChunkElems, kHeadsPerCta, 1};
    const cuuint32_t unit[3] = {1, 1, 1};
    return encode(out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(base), dims, strides, box,
                  unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  };
  if (map(&maps.nope, p.q_nope, kCkvDim, p.q_nope_stride_t, p.q_nope_stride_h) != CUDA_SUCCESS ||
      map(&maps.pe, p.q_pe, kKpeDim, p.q_pe_stride_t, p.q_pe_stride_h) != CUDA_SUCCESS) {
    return kNoTensorMaps;
  }
  return kOk;
}

template <bool kFp8, int kPeers, bool kQTma, bool kStaged = false, bool kL2Prefetch = false>
int launch(const Params& p, int num_tokens, cudaStream_t stream, const QMapsOf<kQTma>& q_maps = {}) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices) return kBadShape;
  // Once per device and kernel: a device that passed the arch check keeps passing it.
  if (!g_configured<kFp8, kPeers, kQTma, kStaged, kL2Prefetch>[device]) {
    int major = 0, minor = 0;
    err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (err != cudaSuccess) return err;
    if (major != 9 || minor != 0) return kUnsupportedArch;  // the wgmma body is compiled for sm_90a only
    err = cudaFuncSetAttribute(hopper_mla_kernel<kFp8, kPeers, kQTma, kStaged, kL2Prefetch>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
    g_configured<kFp8, kPeers, kQTma, kStaged, kL2Prefetch>[device] = true;
  }
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kPeers;  // the head groups of one (token, split); grid_position
  cluster.val.clusterDim.y = p.reduce_in_cluster ? p.num_splits : 1;  // the splits of one (token, group)
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3((p.heads + kHeadsPerCta - 1) / kHeadsPerCta * p.positions, p.num_splits,
                        num_tokens / p.positions);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, hopper_mla_kernel<kFp8, kPeers, kQTma, kStaged, kL2Prefetch>, p, q_maps);
}

}  // namespace
}  // namespace hopper_mla

using namespace hopper_mla;

// Every non-negative int32 id is below this: a larger cache bounds nothing more.
constexpr long long kMaxCacheTokens = 1LL << 31;
constexpr int kMaxPageShift = 30;  // a page of 2^30 tokens already spans every int32 id

extern "C" {

int dsa_hopper_mla_smem_bytes() { return kSmemBytes; }
int dsa_hopper_mla_max_splits() { return kMaxSplits; }
int dsa_hopper_mla_max_tokens() { return kMaxTokens; }
int dsa_hopper_mla_cluster_splits() { return kClusterSplits; }

// See the contract at the top of this file. Returns 0, a CUDA error code (> 0) or a negative
// ErrorCode; dsa_hopper_mla_error_string names either. Argument checks come before any CUDA call.
int dsa_hopper_mla_decode(const void* q_nope, long long q_nope_stride_t, long long q_nope_stride_h,
                          const void* q_pe, long long q_pe_stride_t, long long q_pe_stride_h, int kv_format,
                          const void* kv_a, long long kv_a_stride, const void* kv_b, long long kv_b_stride,
                          const int* indices, long long indices_stride_t, int num_tokens, int heads, int topk,
                          int num_splits, int reduce_in_cluster, float sm_scale_log2,
                          float lse_scale, void* out, long long out_stride_t, long long out_stride_h, float* lse,
                          long long lse_stride_t, long long lse_stride_h,
                          void* part_acc, float* part_m, float* part_l, float* part_scale, long long cache_tokens,
                          int* bad_index_count, const float* attn_sink, float* max_logits, const int* topk_length,
                          int tokens_per_length, float empty_lse, int page_shift, long long page_rows,
                          int positions, long long q_nope_stride_s, long long q_pe_stride_s,
                          long long indices_stride_s, cudaStream_t stream) {
  if (kv_format != kKvBf16 && kv_format != kKvFp8 && kv_format != kKvStaged) return kBadKvFormat;
  if (heads != 16 && heads != 32 && heads != 64 && heads != 128) return kBadShape;
  if (topk < kBlockTokens || topk > kMaxTopk || topk % kBlockTokens != 0) return kBadShape;
  if (num_splits < 1 || num_splits > kMaxSplits || num_tokens < 0 || num_tokens > kMaxTokens || cache_tokens < 0 ||
      (topk_length != nullptr && tokens_per_length < 1) || positions < 1 || num_tokens % positions != 0) {
    return kBadShape;
  }
  // Pages of 2^page_shift tokens page_rows rows apart: every row of the cache's ids fits 32 bits (token_row).
  if (page_shift < 0 || page_shift > kMaxPageShift || page_rows < (1LL << page_shift) || page_rows > UINT32_MAX ||
      (kv_format == kKvStaged && page_shift != 0)) {
    return kBadPages;
  }
  const long long ids = std::min(cache_tokens, kMaxCacheTokens);
  const long long page_mask = (1LL << page_shift) - 1;
  if (ids > 0 && ((ids - 1) >> page_shift) > (UINT32_MAX - page_mask) / page_rows) return kBadPages;
  if (num_tokens == 0) return kOk;
  if (q_nope == nullptr || q_pe == nullptr || kv_a == nullptr || indices == nullptr || out == nullptr ||
      lse == nullptr || bad_index_count == nullptr || (kv_format != kKvFp8 && kv_b == nullptr)) {
    return kNullPointer;
  }
  if (reduce_in_cluster && num_splits != kClusterSplits) return kBadClusterSplits;
  const bool partials = num_splits > 1 && !reduce_in_cluster;
  if (partials && (part_acc == nullptr || part_m == nullptr || part_l == nullptr || part_scale == nullptr)) {
    return kNullPointer;
  }
  // consume_softmax scales each block's raw maximum, which is the scaled maximum only for a positive scale.
  if (!(sm_scale_log2 > 0.f)) return kBadLogitScale;
  const bool kv_ok = kv_format == kKvFp8 ? aligned16(kv_a)
                     : kv_format == kKvStaged
                         ? aligned16(kv_a) && row_aligned(kv_a_stride) && reinterpret_cast<uintptr_t>(kv_b) % 4 == 0
                         : aligned16(kv_a) && aligned16(kv_b) && row_aligned(kv_a_stride) && row_aligned(kv_b_stride);
  // A stride is never stepped over along a dim of one (torch gives size-1 dims any stride): the token
  // strides with one token, q's request strides with one request, its position strides with one position.
  const auto token_aligned = [num_tokens](long long stride) { return num_tokens == 1 || row_aligned(stride); };
  const auto request_aligned = [num_tokens, positions](long long stride) {
    return num_tokens == positions || row_aligned(stride);
  };
  const auto position_aligned = [positions](long long stride) { return positions == 1 || row_aligned(stride); };
  if (!aligned16(q_nope) || !aligned16(q_pe) || !request_aligned(q_nope_stride_t) ||
      !position_aligned(q_nope_stride_s) || !row_aligned(q_nope_stride_h) || !request_aligned(q_pe_stride_t) ||
      !position_aligned(q_pe_stride_s) || !row_aligned(q_pe_stride_h) || !kv_ok || !aligned16(out) ||
      !token_aligned(out_stride_t) || !row_aligned(out_stride_h) || (partials && !aligned16(part_acc))) {
    return kBadAlignment;
  }
  const Params p{static_cast<const __nv_bfloat16*>(q_nope), q_nope_stride_t, q_nope_stride_h,
                 static_cast<const __nv_bfloat16*>(q_pe), q_pe_stride_t, q_pe_stride_h, kv_a, kv_a_stride, kv_b,
                 kv_b_stride, indices, indices_stride_t, topk, num_splits, heads, reduce_in_cluster != 0,
                 sm_scale_log2, lse_scale, static_cast<__nv_bfloat16*>(out), out_stride_t, out_stride_h, lse,
                 lse_stride_t, lse_stride_h, static_cast<__half*>(part_acc), part_m, part_l,
                 static_cast<uint32_t>(ids), bad_index_count, part_scale,
                 attn_sink, max_logits, topk_length, tokens_per_length, empty_lse, static_cast<uint32_t>(page_shift),
                 static_cast<uint32_t>(page_mask), static_cast<uint32_t>(page_rows), positions, q_nope_stride_s,
                 q_pe_stride_s, indices_stride_s};
  const int split0_tokens = (topk + num_splits - 1) / num_splits;  // the most any split takes
  if (kv_format == kKvStaged) return launch<true, 1, false, true>(p, num_tokens, stream);
  if (kv_format == kKvBf16) {
    // Q by TMA takes whole 64-head boxes of flat tokens: below 64 heads Q comes by cp.async, the missing rows
    // zero-filled, and so does Q in requests of several positions.
    if (heads < kHeadsPerCta || positions > 1) {
      return launch<false, 1, false>(p, num_tokens, stream);
    }
    QMaps maps{};
    const int made = q_tensor_maps(p, num_tokens, maps);
    return made != kOk ? made : launch<false, 1, true>(p, num_tokens, stream, maps);
  }
  static_assert(kClusterHeads == 2 * kHeadsPerCta, "the cluster is the two head groups of 128 heads");
  // The head groups' shared gather and the splits' merge are two kinds of cluster; one at a time.
  const bool cluster = heads == kClusterHeads && split0_tokens > kBlockTokens * (kClusterMinBlocks - 1) &&
                       !reduce_in_cluster;
  if (cluster) return launch<true, 2, false>(p, num_tokens, stream);
  return split0_tokens >= kL2PrefetchMinTokens && topk_length == nullptr  // the prefetch reads whole rows
             ? launch<true, 1, false, false, true>(p, num_tokens, stream)
             : launch<true, 1, false>(p, num_tokens, stream);
}

const char* dsa_hopper_mla_error_string(int code) {
  switch (code) {
    case kOk: return "ok";
    case kBadShape:
      static_assert(kBlockTokens == 64 && kMaxTopk == 16384 && kMaxSplits == 32 && kMaxTokens == 65535,
                    "the message below spells these limits out");
      return "heads must be 16, 32, 64 or 128, topk a multiple of 64 in [64, 16384], num_splits in [1, 32], "
             "tokens <= 65535, cache_tokens >= 0, tokens_per_length >= 1 with topk_length, positions >= 1 "
             "dividing the tokens";
    case kBadAlignment: return "pointers must be 16-byte aligned and row strides multiples of 8 elements";
    case kNullPointer: return "null device pointer";
    case kUnsupportedArch: return "the Hopper sparse MLA kernel runs only on compute capability 9.0 (sm_90a)";
    case kBadClusterSplits:
      static_assert(kClusterSplits == 2, "the message below spells the count out");
      return "splits merged in a cluster must number exactly 2";
    case kNoTensorMaps: return "q could not be described as a TMA tensor map (cuTensorMapEncodeTiled refused it)";
    case kBadLogitScale: return "sm_scale_log2 must be positive (the launcher turns sm_scale <= 0 into that)";
    case kBadKvFormat: return "kv_format must be 0 (bf16), 1 (FP8) or 2 (FP8 staged as fp16 rows)";
    case kBadPages:
      static_assert(kMaxPageShift == 30, "the message below spells the limit out");
      return "pages must hold 2^page_shift tokens (page_shift in [0, 30], 0 when staged), page_rows >= "
             "2^page_shift rows apart, every row of the cache below 2^32";
    default: return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown error";
  }
}

}  // extern "C"
