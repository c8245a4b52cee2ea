// Register-resident radix select for short rows (max_len <= kRowMaxLen): one CTA of kRowThreads
// threads per row, each thread holding kPerThread keys in registers for the whole search.
//
// Built for latency, as short rows are bound by dependent steps, not bytes:
// - every load the row needs is issued before the first one is waited on: the scores up to
//   max_len (not up to the row's length, which is still loading), the length and batch, then the
//   block-table entries of this thread's positions as soon as the batch arrives; physical ids
//   need no staging and no extra barrier;
// - a position at or past the length gets key 0 (NaN's key is 1), which no histogram counts and
//   no emission selects;
// - each level costs three barriers: histogram, per-warp scan totals, threshold; each thread
//   clears the bins it scanned, ready for two levels later (levels alternate two histograms);
// - output slots come from a block-wide scan of packed (greater, tie) counts in thread order, so a
//   row's ids, their order and the ties chosen at the threshold are the same on every call (the
//   scan's barrier costs a little time over one atomic a warp, whose arrival order changed the ids'
//   order on every call and the chosen ties on nearly every one; docs/design.md, "Measured choices").
#pragma once

#include "topk_common.cuh"

namespace topk {

// 4 bins per thread in the scan; half or twice as many threads are slower (docs/design.md, "Measured choices").
constexpr int kRowThreads = 512;
constexpr int kRowWarps = kRowThreads / 32;
constexpr int kRowMaxLen = 8192;  // longer rows take the cluster kernel (16 keys a thread here)
constexpr int kRowBinGroups = kBins / kRowThreads / 4;  // int4 groups of bins per thread in the scan
constexpr int kSlotShift = 16;  // packed slot counter: greater count << 16 | tie count
static_assert(kRowBinGroups >= 1 && kRowBinGroups * 4 * kRowThreads == kBins, "whole int4 bin groups a thread");
static_assert(kRowMaxLen < (1 << kSlotShift), "packed slot counts must not carry into each other");
static_assert(kRowWarps <= 32, "one lane per warp total");

struct RowScratch {
  int sink[32];  // count_if's per-lane words for keys outside the active prefix
  int warp_total[kRowWarps];
  int bin, above, count;  // the threshold of the current level
};

// Finds the bin T of histogram h with count(bins above T) < k_rem <= count(bins >= T) and stores
// it in s; clears the bins it reads. Thread t owns the consecutive bins from t * 4 * kRowBinGroups.
// Two barriers; s.bin/above/count are read after return and rewritten only after the caller's
// next barrier.
__device__ __forceinline__ void row_find_threshold(int* h, int k_rem, RowScratch& s) {
  const int t = threadIdx.x;
  const int lane = t & 31, warp = t >> 5;
  int4* mine = reinterpret_cast<int4*>(h) + t * kRowBinGroups;
  int4 c[kRowBinGroups];
  int own = 0;
#pragma unroll
  for (int g = 0; g < kRowBinGroups; ++g) {
    c[g] = mine[g];
    mine[g] = make_int4(0, 0, 0, 0);
    own += c[g].x + c[g].y + c[g].z + c[g].w;
  }
  int incl = own;  // suffix sum over lanes >= lane
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_down_sync(0xffffffffu, incl, o);
    if (lane + o < 32) incl += v;
  }
  if (lane == 0) s.warp_total[warp] = incl;
  __syncthreads();
  int above = incl - own;
#pragma unroll
  for (int w = 0; w < kRowWarps; ++w) above += w > warp ? s.warp_total[w] : 0;
  auto check = [&](int count, int bin) {
    if (above < k_rem && k_rem <= above + count) {
      s.bin = bin;
      s.above = above;
      s.count = count;
    }
    above += count;
  };
#pragma unroll
  for (int g = kRowBinGroups - 1; g >= 0; --g) {  // highest bin first
    const int first = (t * kRowBinGroups + g) * 4;
    check(c[g].w, first + 3);
    check(c[g].z, first + 2);
    check(c[g].y, first + 1);
    check(c[g].x, first);
  }
  __syncthreads();
}

// Selects and writes row `out`'s top p.topk keys, held kPerThread a thread in registers at the row
// kernel's positions (vector u of thread t: positions (u * kRowThreads + t) * S::kVec onward); keys at or
// past the row's length are kInvalidKey. page[u] is the block-table entry of vector u's page (read only
// where a key of it is selected). hist (2 * kBins counters) must be zero and visible to every thread.
template <class S, int kPerThread>
__device__ __forceinline__ void row_select_emit(const Params& p, const uint32_t (&key)[kPerThread],
                                                const int (&page)[kPerThread / S::kVec], int* out, int* hist,
                                                RowScratch& s) {
  using L = Levels<S>;
  constexpr int kVec = S::kVec;
  constexpr int kVecs = kPerThread / kVec;
  const int t = threadIdx.x;
  const int k = p.topk;
  auto pos = [&](int u) { return (u * kRowThreads + t) * kVec; };

  // The threshold prefix: active keys satisfy (key & mask) == value.
  uint32_t mask = 0, value = 0;
  int k_rem = k;
  const uint32_t hist_addr = smem_addr(hist);
  const uint32_t sink = smem_addr(s.sink + (t & 31));
#pragma unroll
  for (int l = 0; l < L::kCount; ++l) {
    int* h = hist + (l & 1) * kBins;
    const uint32_t h_addr = hist_addr + (l & 1) * kBins * 4;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      count_if(key[j] != kInvalidKey && (key[j] & mask) == value, h_addr + digit_offset<L>(key[j], l), sink);
    }
    __syncthreads();
    row_find_threshold(h, k_rem, s);
    k_rem -= s.above;
    mask |= L::digit_mask(l);
    value |= static_cast<uint32_t>(s.bin) << L::shift(l);
    if (s.count == k_rem) break;  // the whole threshold bin is selected
  }

  // Emit: keys above the prefix take slots [0, k - k_rem), keys equal to it the first k_rem of
  // [k - k_rem, k) (ties: exactly k_rem of them, the first in thread order).
  int packed = 0;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const uint32_t masked = key[j] & mask;
    packed += masked > value ? 1 << kSlotShift : 0;
    packed += key[j] != kInvalidKey && masked == value ? 1 : 0;
  }
  const int lane = t & 31;
  int incl = packed;  // prefix sum over lanes <= lane
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  // warp_total is free again: the last level's readers passed row_find_threshold's closing barrier.
  const int warp = t >> 5;
  if (lane == 31) s.warp_total[warp] = incl;
  __syncthreads();
  int start = incl - packed;
#pragma unroll
  for (int w = 0; w < kRowWarps; ++w) start += w < warp ? s.warp_total[w] : 0;
  int greater_slot = start >> kSlotShift;
  int tie_slot = start & ((1 << kSlotShift) - 1);
  const int tie_base = k - k_rem;
  int id[kVecs];  // physical id of each vector's first position (a vector lies in one page), or -1
#pragma unroll
  for (int u = 0; u < kVecs; ++u) id[u] = physical_id(p, page[u], pos(u) % kPageSize);
  int masked_ids = 0;
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {  // one predicated store a key: selects, no branch regions
      const uint32_t kj = key[u * kVec + j];
      const uint32_t masked = kj & mask;
      const bool greater = masked > value;
      const bool tie = kj != kInvalidKey && masked == value;
      const int slot = greater ? greater_slot : tie_base + tie_slot;
      const bool write = greater || (tie && tie_slot < k_rem);
      if (write) out[slot] = id[u] < 0 ? -1 : id[u] + j;
      masked_ids += write && id[u] < 0;
      greater_slot += greater;
      tie_slot += tie;
    }
  }
  count_masked(p, masked_ids);
}

template <class S, int kPerThread>
__global__ void __launch_bounds__(kRowThreads, 1) topk_row_kernel(const Params p) {
  using Raw = typename S::Raw;
  constexpr int kVec = S::kVec;
  constexpr int kVecs = kPerThread / kVec;
  static_assert(kPerThread % kVec == 0 && kPageSize % kVec == 0, "a vector lies in one page");
  __shared__ __align__(16) int hist[2 * kBins];  // level l counts into hist + (l & 1) * kBins
  __shared__ RowScratch s;

  const int t = threadIdx.x;
  const int row = blockIdx.x;
  const int k = p.topk;
  const Raw* scores = static_cast<const Raw*>(p.scores) + row * p.scores_stride;
  int* out = p.out + row * p.out_stride;
  // Vector u of this thread holds positions pos(u) .. pos(u) + kVec - 1.
  auto pos = [&](int u) { return (u * kRowThreads + t) * kVec; };

  if (t == 0) prefetch_l2(out);
  const int raw_length = __ldg(p.lengths + row);
  const int batch = p.row_to_batch != nullptr ? __ldg(p.row_to_batch + row) : row;
  uint4 raw[kVecs];
  const bool aligned = (reinterpret_cast<uintptr_t>(scores) & 15u) == 0u;
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
    if (aligned && pos(u) + kVec <= p.max_len) {
      raw[u] = load_early_v4(scores + pos(u));
    } else {
      raw[u] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (pos(u) + j < p.max_len) S::set_lane(raw[u], j, scores[pos(u) + j]);
      }
    }
  }
#pragma unroll
  for (int i = t; i < 2 * kBins / 4; i += kRowThreads) reinterpret_cast<int4*>(hist)[i] = make_int4(0, 0, 0, 0);

  const int length = clamped_length(p, raw_length);
  if (!batch_in_table(p, batch)) {
    mask_row(p, out, length, t, k, kRowThreads, true);
    return;  // uniform over the CTA
  }
  const int* table = p.block_table + batch * p.block_table_stride;
  if (length <= k) {  // every valid position is selected: structural mapping, no histogram
    map_structurally(p, table, out, length, t, k, kRowThreads);
    return;  // uniform over the CTA: no thread waits on a barrier
  }
  int page[kVecs];
#pragma unroll
  for (int u = 0; u < kVecs; ++u) page[u] = pos(u) < length ? load_early_s32(table + pos(u) / kPageSize) : 0;

  uint32_t key[kPerThread];
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const uint32_t valid = pos(u) + j < length ? ~0u : 0u;  // a mask, so no branch skips the key's math
      key[u * kVec + j] = S::key(S::lane(raw[u], j)) & valid;
    }
  }
  __syncthreads();  // cleared histograms

  row_select_emit<S, kPerThread>(p, key, page, out, hist, s);
}

}  // namespace topk
