// Fused lightning indexer + top-k (DSA stages 1 and 2 in one launch) for rows of up to
// kMaxFusedPages pages: a row's keys are scored on a thread-block cluster and selected on its first
// CTA, and no score goes through global memory.
//
// Contract (C ABI dsa_indexer_topk below; the indexer's, kernels/indexer/score.py):
//   q            e4m3 [B, N, H, 128] contiguous, H = 32 or 64, N = next_n >= 1
//   cache        [num_pages] pages of kPageBytes: 64 x 128 e4m3 keys, then 64 fp32 per-token scales
//   weights      fp32 [B, N, H] contiguous (q scale and softmax scale folded in)
//   seq_lens     int32 [B]; block_table int32 [B, max_pages], row stride block_table_stride
//   out          int32 [B * N, topk] contiguous. Row r = b * N + j sees
//                length = clamp(seq_lens[b] - N + j + 1, 0, max_pages * 64) tokens and gets the physical
//                ids block_table[b, i / 64] * 64 + i % 64 of its top min(topk, length) positions i by
//                score(i) = scale(i) * sum_h w[b, j, h] * relu(q[b, j, h] . k8(i)), -1 padded, in no
//                particular order; the same ids in the same order on every call, ties included.
//   q, cache and weights 16-byte aligned (bulk copies); 1 <= topk <= kMaxTopk; max_pages <= kMaxFusedPages.
// Bad values: a block-table entry outside [0, num_pages) is never read. Its keys score -inf, and a
// selected one is written as -1 and added to *bad_ids (as the top-k counts them); the entries of a
// request with seq_len > topk are added to *bad_pages once per request (as the scoring kernel counts
// them). Ranking as the top-k's (topk_common.cuh): NaN below -inf, -0.0 equal to +0.0.
//
// One cluster of C CTAs per row (the launcher picks C). A row that fits in topk takes the structural
// mapping, split over the cluster, without reading a key. Otherwise CTA c of the cluster bulk-copies its
// share of the row's pages (consecutive, at most kMaxPagesPerCta) and the row's weights into its shared
// memory on one mbarrier, scores its keys (fp32 accumulation), and stores each score's radix key into the
// first CTA's shared memory (distributed shared memory); after one cluster barrier the first CTA selects
// with the top-k row kernel's register-resident radix select (topk_row.cuh), whose thread-order slots make
// the output deterministic. Scoring:
// - sm_90a: a warpgroup scores a page (64 keys) with wgmma m64nHk32 e4m3, the keys from registers, q from
//   shared memory in the 128-byte swizzle;
// - other archs: mma.sync m16n8k32 e4m3 on 16-key tiles, the warps in two groups each summing half of the
//   heads (q stays in registers), the groups' sums added in shared memory.
//
// Reduction order: each thread holds the 32 bytes [tig * 32, tig * 32 + 32) of a key row (and, with
// mma.sync, of a q row), and k-step s takes bytes s * 8 .. s * 8 + 7 of them as its k = tig * 4 .. + 3 and
// 16 + tig * 4 .. + 3: q is read with the same permutation of the 128 dimensions (wgmma: stored permuted),
// so the dot products are unchanged while each thread reads a row with two 16-byte shared loads.

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "../ptx.cuh"
#include "topk_common.cuh"
#include "topk_row.cuh"

namespace topk {
namespace {

namespace cg = cooperative_groups;
using ptx::bulk_copy;
using ptx::cluster_sync;
using ptx::fence_operand;
using ptx::mbar_arrive_expect_tx;
using ptx::mbar_init;
using ptx::mbar_wait;
using ptx::wgmma_commit;
using ptx::wgmma_fence;

constexpr int kDim = 128;                                 // index head dimension, one e4m3 byte each
constexpr int kScaleOffset = kPageSize * kDim;            // a page's scales follow its keys
constexpr int kPageBytes = kScaleOffset + kPageSize * 4;  // 8448
constexpr int kMaxFusedPages = kRowMaxLen / kPageSize;    // the select holds at most kRowMaxLen keys
constexpr int kMaxCluster = 8;                            // portable cluster size
constexpr int kMaxPagesPerCta = 16;                       // one lane of warp 0 stages each page
constexpr int kFusedThreads = kRowThreads;                // the select is the row kernel's
constexpr int kFusedWarps = kFusedThreads / 32;
constexpr int kTileKeys = 16;                             // mma.sync path: keys a tile (its M)
// The mma.sync path's warps split the heads in two groups, each scoring every tile for its half: a warp's q
// operands stay in registers (ptxas keeps them converted for the fp16 tensor cores sm_90 runs e4m3 mma.sync
// on), which for all 64 heads would not fit 512 threads of 128 registers.
constexpr int kHeadGroups = 2;
constexpr int kTilesPerPage = kPageSize / kTileKeys;
constexpr int kQAlign = 1024;                             // wgmma's 128-byte swizzle atoms (8 rows of q)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool kWgmma = true;  // sm_90a: wgmma scores a page a warpgroup in e4m3 natively
#else
constexpr bool kWgmma = false;
#endif
constexpr int kMaxIds = 1 << 25;                          // pages whose ids fit int32, as topk.cu
static_assert(kMaxFusedPages <= kMaxCluster * kMaxPagesPerCta, "every row's pages fit its cluster");
static_assert(kMaxPagesPerCta <= 32, "one lane of warp 0 per page");
static_assert(kPageBytes % 128 == 0, "pages keep the 128-byte row alignment the shared loads rely on");
static_assert(kTilesPerPage * kTileKeys == kPageSize, "mma.sync tiles cover a page");

enum ErrorCode : int {
  kOk = 0,
  kBadTopk = -1,
  kBadHeads = -2,
  kBadShape = -3,
  kNullPointer = -4,
  kBadPages = -5,
  kMisaligned = -6,
};

struct FusedParams {
  const uint8_t* q;
  const uint8_t* cache;
  const float* weights;
  const int* seq_lens;
  const int* block_table;
  long long block_table_stride;
  int next_n;
  int max_pages;
  int pages_per_cta;  // shared-memory page slots: ceil(max_pages / cluster size)
  int num_pages;
  int* bad_pages;
  int* bad_ids;
  int* out;
  int topk;
};

// The radix key of -inf (a key on a page outside the cache).
constexpr uint32_t kMinusInfKey = 0x007fffffu;

__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }

__device__ __forceinline__ uint32_t map_to_rank0(uint32_t addr) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n" : "=r"(out) : "r"(addr));
  return out;
}

__device__ __forceinline__ void st_cluster_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared::cluster.u32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// The 32 bytes [tig * 32, tig * 32 + 32) of the 128-byte row at `row` (shared address, 128-byte aligned
// rows), as 8 words in order. Odd rows load their halves in the other order: the 8 threads of a quarter
// warp (rows g, g + 1) then touch all 32 banks once.
__device__ __forceinline__ void load_row32(uint32_t row, int tig, int g, uint32_t (&w)[8]) {
  const uint32_t first = (g & 1) * 16, second = first ^ 16u;
  uint4 a, b;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a.x), "=r"(a.y), "=r"(a.z), "=r"(a.w)
               : "r"(row + tig * 32 + first));
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(b.x), "=r"(b.y), "=r"(b.z), "=r"(b.w)
               : "r"(row + tig * 32 + second));
  const uint4 lo = (g & 1) ? b : a, hi = (g & 1) ? a : b;
  w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w;
  w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma's shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format") of a K-major operand in the
// 128-byte swizzle, its 8-row atoms 1024 bytes apart: start address >> 4, leading byte offset 16 (unused by
// this layout), stride byte offset 1024, swizzle mode 1.
__device__ __forceinline__ uint64_t q_descriptor(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

#define INDEXER_TOPK_D16_TEXT "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define INDEXER_TOPK_D32_TEXT \
  INDEXER_TOPK_D16_TEXT ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define INDEXER_TOPK_D16_OPERANDS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define INDEXER_TOPK_D32_OPERANDS \
  INDEXER_TOPK_D16_OPERANDS, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
      "+f"(d[30]), "+f"(d[31])

// D[64 keys x kHeads] (+)= A[64 x 32] (registers: this warp's 16 keys) . q[kHeads x 32] (the descriptor's).
template <int kHeads>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[kHeads / 2], const uint32_t (&a)[4], uint64_t desc,
                                           int scale_d);
template <>
__device__ __forceinline__ void wgmma_e4m3<64>(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" INDEXER_TOPK_D32_TEXT
               "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
               : INDEXER_TOPK_D32_OPERANDS
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<32>(float (&d)[16], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {" INDEXER_TOPK_D16_TEXT
               "}, {%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
               : INDEXER_TOPK_D16_OPERANDS
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
#undef INDEXER_TOPK_D16_TEXT
#undef INDEXER_TOPK_D32_TEXT
#undef INDEXER_TOPK_D16_OPERANDS
#undef INDEXER_TOPK_D32_OPERANDS
#endif

#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mma_e4m3(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The weighted relu sums over one group of kGroupHeads heads of tile keys g and g + 8 (every lane of group g
// returns both). kp: the tile's page (shared address), t0: the tile's first key in it; bq: this thread's q
// operands of the group's heads, ws: the group's weights.
template <int kGroupHeads>
__device__ __forceinline__ float2 score_tile(uint32_t kp, int t0, int tig, int g,
                                             const uint32_t (&bq)[kGroupHeads / 8][8], const float* ws) {
  uint32_t lo[8], hi[8];  // key rows t0 + g and t0 + g + 8
  load_row32(kp + (t0 + g) * kDim, tig, g, lo);
  load_row32(kp + (t0 + g + 8) * kDim, tig, g, hi);
  float acc_lo = 0.0f, acc_hi = 0.0f;  // this thread's heads n * 8 + tig * 2 + {0, 1}
#pragma unroll
  for (int n = 0; n < kGroupHeads / 8; ++n) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < kDim / 32; ++s) {
      mma_e4m3(c, lo[2 * s], hi[2 * s], lo[2 * s + 1], hi[2 * s + 1], bq[n][2 * s], bq[n][2 * s + 1]);
    }
    const float2 w = *reinterpret_cast<const float2*>(ws + n * 8 + tig * 2);
    acc_lo += fmaxf(c[0], 0.0f) * w.x + fmaxf(c[1], 0.0f) * w.y;
    acc_hi += fmaxf(c[2], 0.0f) * w.x + fmaxf(c[3], 0.0f) * w.y;
  }
  acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 1);
  acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 1);
  acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 2);
  acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 2);
  return make_float2(acc_lo, acc_hi);
}
#endif

template <int kHeads, int kPerThread>
__global__ void __launch_bounds__(kFusedThreads, 1) indexer_topk_kernel(const FusedParams p) {
  constexpr int kVecs = kPerThread / Fp32::kVec;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(16) int hist[2 * kBins];  // the select's, first CTA only
  __shared__ RowScratch s;
  __shared__ __align__(8) uint64_t loaded;    // this CTA's bulk copies
  __shared__ int staged[kMaxPagesPerCta];     // its pages' block-table entries, -1 outside the cache
  __shared__ int row_pages[kMaxFusedPages];   // the row's block-table entries, first CTA only

  const int cluster_size = static_cast<int>(cg::this_cluster().num_blocks());
  const int rank = static_cast<int>(cg::this_cluster().block_rank());
  const int row = blockIdx.x / cluster_size;
  const int b = row / p.next_n;
  const int j = row - b * p.next_n;
  const int t = threadIdx.x;
  const int lane = t & 31, warp = t >> 5, g = lane >> 2, tig = lane & 3;
  const int max_len = p.max_pages * kPageSize;
  const int seq_len = __ldg(p.seq_lens + b);
  // seq_len clamped first (same result) so that one near INT32_MIN cannot wrap to a long row.
  const int seen = min(max(seq_len, 0), max_len + p.next_n);
  const int length = min(max(seen - p.next_n + j + 1, 0), max_len);
  const int* table = p.block_table + b * p.block_table_stride;
  int* out = p.out + static_cast<long long>(row) * p.topk;
  Params tp{};  // the row select's view: topk, the cache's pages, the -1 counter
  tp.num_pages = p.num_pages;
  tp.bad_count = p.bad_ids;
  tp.topk = p.topk;

  if (length <= p.topk) {  // every visible position is selected: structural mapping, no key read
    const int per_rank = ceil_div(p.topk, cluster_size);
    const int stop = min(p.topk, (rank + 1) * per_rank);
    map_structurally(tp, table, out, length, rank * per_rank + t, stop, kFusedThreads);
    return;  // uniform over the cluster: no CTA waits on a cluster barrier
  }
  cluster_arrive_relaxed();  // the first remote store waits until every CTA of the cluster runs

  const int pages = ceil_div(length, kPageSize);
  const int per_cta = ceil_div(pages, cluster_size);
  const int first = min(rank * per_cta, pages);
  const int count = min(first + per_cta, pages) - first;  // this CTA's pages, <= p.pages_per_cta
  // Shared memory: the pages, the weights, q (1024-byte aligned: wgmma's swizzle atoms), the head groups'
  // sums (mma.sync), the row's keys (first CTA).
  const uint32_t page_base = smem_addr(smem);
  const uint32_t w_base = page_base + p.pages_per_cta * kPageBytes;
  const uint32_t q_base = (w_base + kHeads * 4 + kQAlign - 1) / kQAlign * kQAlign;
  const float* ws = reinterpret_cast<const float*>(smem + (w_base - page_base));
  float* partial = reinterpret_cast<float*>(smem + (q_base - page_base) + kHeads * kDim);
  uint32_t* keys = reinterpret_cast<uint32_t*>(partial + kHeadGroups * p.pages_per_cta * kPageSize);
  const uint32_t bar = smem_addr(&loaded);

  if (t == 0) {
    mbar_init(bar, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (warp == 0 && count > 0) {
    int entry = -1;
    if (lane < count) {
      entry = __ldg(table + first + lane);
      entry = page_in_cache(tp, entry) ? entry : -1;
      staged[lane] = entry;
    }
    const unsigned outside = __ballot_sync(0xffffffffu, lane < count && entry < 0);
    if (lane == 0 && j == p.next_n - 1 && outside != 0u) atomicAdd(p.bad_pages, __popc(outside));
    const unsigned inside = __ballot_sync(0xffffffffu, entry >= 0);
    if (lane == 0) mbar_arrive_expect_tx(bar, __popc(inside) * kPageBytes + kHeads * 4 + (kWgmma ? 0 : kHeads * kDim));
    __syncwarp();
    if (entry >= 0) {
      bulk_copy(page_base + lane * kPageBytes, p.cache + static_cast<long long>(entry) * kPageBytes, kPageBytes, bar);
    }
    if (lane == 0 && !kWgmma) bulk_copy(q_base, p.q + static_cast<long long>(row) * kHeads * kDim, kHeads * kDim, bar);
    if (lane == 1) bulk_copy(w_base, p.weights + static_cast<long long>(row) * kHeads, kHeads * 4, bar);
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if (count > 0) {  // q, its dimensions permuted as the A fragments' are, in the 128-byte swizzle wgmma reads
    const uint32_t* qg = reinterpret_cast<const uint32_t*>(p.q + static_cast<long long>(row) * kHeads * kDim);
    for (int i = t; i < kHeads * kDim / 4; i += kFusedThreads) {
      const int n = i / 32, word = i % 32;  // head, word of its permuted row: k-step word / 8, word % 8 of it
      const int s = word / 8, w = word % 8;
      const uint32_t v = __ldg(qg + n * 32 + (w % 4) * 8 + s * 2 + w / 4);
      const int chunk = word / 4;
      const uint32_t dst = q_base + (n / 8) * 1024 + (n % 8) * 128 + ((chunk ^ (n % 8)) * 16) + (word % 4) * 4;
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(v) : "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // read next by wgmma (the async proxy)
  }
#endif
  if (rank == 0) {  // the row's block-table entries for the select, staged while the keys are scored
    for (int i = t; i < pages; i += kFusedThreads) row_pages[i] = __ldg(table + i);
  }
  __syncthreads();  // staged[] and row_pages[] written

  cluster_wait();
  if (count > 0) {
    mbar_wait(bar, 0);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    const uint64_t desc = q_descriptor(q_base);
    const int wg = warp / 4, wq = warp % 4;
    const uint32_t remote = map_to_rank0(smem_addr(keys));
    for (int local = wg; local < count; local += kFusedWarps / 4) {
      if (staged[local] < 0) {  // warpgroup-uniform
        for (int i = (wq * 32 + lane); i < kPageSize; i += 128) {
          st_cluster_u32(remote + ((first + local) * kPageSize + i) * 4, kMinusInfKey);
        }
        continue;
      }
      const uint32_t kp = page_base + local * kPageBytes;
      uint32_t lo[8], hi[8];
      load_row32(kp + (wq * 16 + g) * kDim, tig, g, lo);
      load_row32(kp + (wq * 16 + g + 8) * kDim, tig, g, hi);
      float d[kHeads / 2];
#pragma unroll
      for (int i = 0; i < kHeads / 2; ++i) d[i] = 0.0f;
      wgmma_fence();
#pragma unroll
      for (int s = 0; s < kDim / 32; ++s) {
        const uint32_t a[4] = {lo[2 * s], hi[2 * s], lo[2 * s + 1], hi[2 * s + 1]};
        wgmma_e4m3<kHeads>(d, a, desc + ((s * 32) >> 4), s);  // k-step s: 32 bytes on
      }
      wgmma_commit();
      wgmma_wait_all();
#pragma unroll
      for (int i = 0; i < kHeads / 2; ++i) fence_operand(d[i]);
      float acc_lo = 0.0f, acc_hi = 0.0f;
#pragma unroll
      for (int n = 0; n < kHeads / 8; ++n) {
        const float2 w = *reinterpret_cast<const float2*>(ws + n * 8 + tig * 2);
        acc_lo += fmaxf(d[4 * n], 0.0f) * w.x + fmaxf(d[4 * n + 1], 0.0f) * w.y;
        acc_hi += fmaxf(d[4 * n + 2], 0.0f) * w.x + fmaxf(d[4 * n + 3], 0.0f) * w.y;
      }
      acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 1);
      acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 1);
      acc_lo += __shfl_xor_sync(0xffffffffu, acc_lo, 2);
      acc_hi += __shfl_xor_sync(0xffffffffu, acc_hi, 2);
      const float* scales = reinterpret_cast<const float*>(smem + local * kPageBytes + kScaleOffset);
      const int r = wq * 16 + g;
      const int position = (first + local) * kPageSize + r;
      if (tig == 0) st_cluster_u32(remote + position * 4, Fp32::key(__float_as_uint(acc_lo * scales[r])));
      if (tig == 1) st_cluster_u32(remote + (position + 8) * 4, Fp32::key(__float_as_uint(acc_hi * scales[r + 8])));
    }
#else
    constexpr int kGroupHeads = kHeads / kHeadGroups;
    constexpr int kGroupWarps = kFusedWarps / kHeadGroups;
    const int group = warp / kGroupWarps;
    uint32_t bq[kGroupHeads / 8][8];
#pragma unroll
    for (int n = 0; n < kGroupHeads / 8; ++n) {
      load_row32(q_base + (group * kGroupHeads + n * 8 + g) * kDim, tig, g, bq[n]);
    }
    for (int tile = warp % kGroupWarps; tile < count * kTilesPerPage; tile += kGroupWarps) {
      const int local = tile / kTilesPerPage;
      const int t0 = (tile % kTilesPerPage) * kTileKeys;
      if (staged[local] < 0) continue;  // warp-uniform
      const float2 sum =
          score_tile<kGroupHeads>(page_base + local * kPageBytes, t0, tig, g, bq, ws + group * kGroupHeads);
      float* mine = partial + group * p.pages_per_cta * kPageSize + local * kPageSize + t0 + g;
      if (tig == 0) mine[0] = sum.x;
      if (tig == 1) mine[8] = sum.y;
    }
    __syncthreads();  // every group's sums written
    // Keys to the first CTA, in order: the head groups' sums times the token's scale (positive, so it
    // factors out of the relu, as in the scoring kernel).
    const uint32_t remote = map_to_rank0(smem_addr(keys)) + first * kPageSize * 4;
    for (int i = t; i < count * kPageSize; i += kFusedThreads) {
      const int local = i / kPageSize;
      uint32_t key = kMinusInfKey;
      if (staged[local] >= 0) {
        float sum = 0.0f;
#pragma unroll
        for (int h = 0; h < kHeadGroups; ++h) sum += partial[h * p.pages_per_cta * kPageSize + i];
        const float scale =
            *reinterpret_cast<const float*>(smem + local * kPageBytes + kScaleOffset + (i % kPageSize) * 4);
        key = Fp32::key(__float_as_uint(sum * scale));
      }
      st_cluster_u32(remote + i * 4, key);
    }
#endif
  }
  if (rank == 0) {  // cleared here, not before scoring, so that no address of it is live across the scoring loop
    for (int i = t; i < 2 * kBins / 4; i += kFusedThreads) reinterpret_cast<int4*>(hist)[i] = make_int4(0, 0, 0, 0);
  }
  cluster_sync();  // every score's key is in the first CTA's shared memory (and hist cleared: a CTA barrier too)
  if (rank != 0) return;

  // Laundered: otherwise ptxas computes the key array's address before the scoring loop and spills it there.
  const uint32_t* row_keys = keys;
  asm volatile("" : "+l"(row_keys));
  auto pos = [&](int u) { return (u * kFusedThreads + t) * Fp32::kVec; };
  int page[kVecs];
  uint32_t key[kPerThread];
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    page[u] = pos(u) < length ? row_pages[pos(u) / kPageSize] : 0;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (pos(u) < length) v = *reinterpret_cast<const uint4*>(row_keys + pos(u));
#pragma unroll
    for (int e = 0; e < Fp32::kVec; ++e) key[u * Fp32::kVec + e] = pos(u) + e < length ? Fp32::lane(v, e) : kInvalidKey;
  }
  row_select_emit<Fp32, kPerThread>(tp, key, page, out, hist, s);
}

// Keys per thread of the select: half of kRowMaxLen's share for rows of up to half of it.
constexpr int kSmallPerThread = kRowMaxLen / kRowThreads / 2;
constexpr int kLargePerThread = kRowMaxLen / kRowThreads;

int cluster_size_for(int max_pages) { return max_pages < kMaxCluster ? max_pages : kMaxCluster; }

int dynamic_smem_bytes(int heads, int max_pages) {
  const int per_cta = ceil_div(max_pages, cluster_size_for(max_pages));
  return per_cta * kPageBytes + heads * 4 + kQAlign + heads * kDim + kHeadGroups * per_cta * kPageSize * 4 +
         max_pages * kPageSize * 4;
}

template <int kHeads, int kPerThread>
int launch_kernel(const FusedParams& p, int rows, cudaStream_t stream) {
  const auto kernel = indexer_topk_kernel<kHeads, kPerThread>;
  const int smem_bytes = dynamic_smem_bytes(kHeads, p.max_pages);
  // Per call: a host-side attribute, cheap, and right for whichever device is current.
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  const int cluster_size = cluster_size_for(p.max_pages);
  return launch_clusters(kernel, p, rows * cluster_size, kFusedThreads, cluster_size, smem_bytes, stream);
}

template <int kHeads>
int launch_heads(const FusedParams& p, int rows, cudaStream_t stream) {
  if (p.max_pages * kPageSize <= kSmallPerThread * kRowThreads) {
    return launch_kernel<kHeads, kSmallPerThread>(p, rows, stream);
  }
  return launch_kernel<kHeads, kLargePerThread>(p, rows, stream);
}

template <int kHeads, int kPerThread>
int static_smem_bytes(int* bytes) {
  cudaFuncAttributes attr{};
  const cudaError_t err = cudaFuncGetAttributes(&attr, indexer_topk_kernel<kHeads, kPerThread>);
  if (err != cudaSuccess) return err;
  *bytes = static_cast<int>(attr.sharedSizeBytes);
  return kOk;
}

int check_shape(int heads, int max_pages) {
  if (heads != 32 && heads != 64) return kBadHeads;
  if (max_pages < 1 || max_pages > kMaxFusedPages) return kBadShape;
  return kOk;
}

}  // namespace
}  // namespace topk

using namespace topk;

extern "C" {

int dsa_indexer_topk_max_pages() { return kMaxFusedPages; }

// Shared memory one CTA of dsa_indexer_topk uses for this shape (static + dynamic), so that the caller
// can tell whether the current device runs it. Returns as dsa_indexer_topk does.
int dsa_indexer_topk_shared_bytes(int heads, int max_pages, int* bytes) {
  const int status = check_shape(heads, max_pages);
  if (status != kOk) return status;
  if (bytes == nullptr) return kNullPointer;
  int fixed = 0;
  const bool large = max_pages * kPageSize > kSmallPerThread * kRowThreads;
  const int err = heads == 32 ? (large ? static_smem_bytes<32, kLargePerThread>(&fixed)
                                       : static_smem_bytes<32, kSmallPerThread>(&fixed))
                              : (large ? static_smem_bytes<64, kLargePerThread>(&fixed)
                                       : static_smem_bytes<64, kSmallPerThread>(&fixed));
  if (err != kOk) return err;
  *bytes = fixed + dynamic_smem_bytes(heads, max_pages);
  return kOk;
}

// Writes out[batch * next_n, topk]; see the contract at the top of this file. Returns 0, a CUDA error
// code (> 0), or a negative ErrorCode; dsa_indexer_topk_error_string names either.
int dsa_indexer_topk(const void* q, const void* cache, const float* weights, const int* seq_lens,
                     const int* block_table, long long block_table_stride, int batch, int next_n, int heads,
                     int max_pages, int num_pages, int* bad_pages, int* bad_ids, int* out, int topk,
                     cudaStream_t stream) {
  if (topk < 1 || topk > kMaxTopk) return kBadTopk;
  const int status = check_shape(heads, max_pages);
  if (status != kOk) return status;
  if (batch < 0 || next_n < 1 || block_table_stride < max_pages) return kBadShape;
  if (num_pages < 0 || num_pages > kMaxIds) return kBadPages;
  if (batch == 0) return kOk;
  if (q == nullptr || (cache == nullptr && num_pages > 0) || weights == nullptr || seq_lens == nullptr ||
      block_table == nullptr || bad_pages == nullptr || bad_ids == nullptr || out == nullptr) {
    return kNullPointer;
  }
  const uintptr_t aligned = reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(cache) |
                            reinterpret_cast<uintptr_t>(weights);
  if ((aligned & 15u) != 0u) return kMisaligned;
  const FusedParams p{static_cast<const uint8_t*>(q), static_cast<const uint8_t*>(cache), weights, seq_lens,
                      block_table, block_table_stride, next_n, max_pages,
                      ceil_div(max_pages, cluster_size_for(max_pages)), num_pages, bad_pages, bad_ids, out, topk};
  const int rows = batch * next_n;
  return heads == 32 ? launch_heads<32>(p, rows, stream) : launch_heads<64>(p, rows, stream);
}

const char* dsa_indexer_topk_error_string(int code) {
  switch (code) {
    case kOk: return "ok";
    case kBadTopk: return "topk must be in [1, 2048]";
    case kBadHeads: return "heads must be 32 or 64";
    case kBadShape: return "inconsistent shapes or strides, or more block-table pages than the fused kernel takes";
    case kNullPointer: return "null device pointer";
    case kBadPages: return "num_pages must be in [0, 2^25]";
    case kMisaligned: return "q, the cache and the weights must be 16-byte aligned";
    default: return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown error";
  }
}

}  // extern "C"
