// Cluster radix select for rows of any length: a row runs on a thread-block cluster of C CTAs
// (C = 1 when rows are many or short), each CTA owning one chunk of the row.
//
// Per level, every CTA builds a shared-memory histogram of the digit of its active elements
// (those whose higher digits equal the threshold prefix found so far), the cluster sums them
// through distributed shared memory, and every CTA finds the same threshold bin. The row is read
// from global memory once when the chunk fits the shared-memory region (keys cached there);
// otherwise the CTA compacts the threshold bin's candidates (key, index) into that region as soon
// as they fit, emitting the strictly-greater elements in the same pass, and refines on chip. When
// they never fit it keeps re-reading its chunk from global memory with the prefix filter: exact
// for every input, never a clamp. The search stops when the threshold bin holds exactly the
// number of elements still needed, or when all key bits are resolved (then ties take the
// remaining slots, counted with an atomic). Physical ids are computed when written.
// Cluster barriers are hardware co-scheduled (no spin-waits); no global workspace.
#pragma once

#include <cooperative_groups.h>

#include "topk_common.cuh"

namespace topk {

namespace cg = cooperative_groups;

constexpr int kThreads = 1024;                       // one CTA per SM for long rows; 2 bins per thread
constexpr int kWarps = kThreads / 32;
constexpr int kBinsPerThread = kBins / kThreads;
static_assert(kBinsPerThread == 2, "find_threshold gives each thread exactly two bins");
constexpr int kMaxCluster = 8;                       // portable; 16 (non-portable) measured 1.5x slower at 1 x 131072
constexpr int kMinChunk = 8192;                      // 1 x 32768: 4 CTAs of 8192 beat 8 of 4096 (H200)
constexpr int kChunkAlign = 8;                       // chunk starts stay 16-byte aligned for fp32 and bf16
constexpr int kCandidateBytes = 8;                   // candidate = (uint32 key, int32 index)
constexpr int kMaxPageCache = 1024;                  // block-table entries staged in shared memory (64K tokens)
constexpr int kHistBytes = 2 * kBins * 4;            // double-buffered histogram (levels alternate)
constexpr int kFixedDynamicSmem = kHistBytes + kMaxPageCache * 4;
constexpr int kStaticSmemReserve = 1024;             // Scratch (checked below) within the per-block opt-in limit
static_assert(kMaxPageCache % 4 == 0, "the region after the staged pages stays 16-byte aligned");

// Block-uniform state shared by the threads of one CTA.
struct Scratch {
  unsigned long long warp_sum[kWarps];
  int bin, above_total, count_total, above_local, count_local;  // find_threshold's answer
  int greater_base, tie_base;                                    // this CTA's output offsets
  int greater_slot, tie_slot, cand_count;                        // CTA-local running counters
  int cluster_greater, cluster_ties;                             // used on rank 0 only, via DSMEM
};

// Slot of this lane among the lanes of its warp that set `pred`, reserved from a shared counter
// with one atomic per warp. Every lane of the warp must call it.
__device__ __forceinline__ int warp_slot(bool pred, int* counter) {
  const unsigned mask = __ballot_sync(0xffffffffu, pred);
  if (mask == 0u) return -1;
  const int leader = __ffs(mask) - 1;
  const int lane = threadIdx.x & 31;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(mask));
  base = __shfl_sync(0xffffffffu, base, leader);
  return base + __popc(mask & lanemask_lt());
}

__device__ __forceinline__ void cp_async_4(int* smem, const int* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

__device__ __forceinline__ void cluster_barrier(const cg::cluster_group& cluster, int cluster_size) {
  if (cluster_size > 1) {
    cluster.sync();  // release/acquire: every CTA's histogram writes are visible cluster-wide
  } else {
    __syncthreads();
  }
}

// Logical position -> physical id. `pages` points at the row's block-table entries, either the
// staged shared-memory copy (offset so that it is indexed by logical page) or global memory;
// generic addressing serves both.
struct PageMap {
  const int* pages;
  __device__ int physical(int i) const { return pages[i / kPageSize] * kPageSize + i % kPageSize; }
};

// Calls f(i, key, valid) for every position of [begin, end) read from global memory, with a
// trip count uniform across the block so that f may use warp collectives.
template <class S, class F>
__device__ __forceinline__ void visit_global(const typename S::Raw* row, int begin, int end, F&& f) {
  constexpr int kUnroll = S::kUnroll;
  constexpr int kPerIter = kThreads * S::kVec * kUnroll;
  const bool aligned = (reinterpret_cast<uintptr_t>(row + begin) & 15u) == 0u;
  const int iters = ceil_div(end - begin, kPerIter);
  for (int it = 0; it < iters; ++it) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int e = begin + it * kPerIter + (u * kThreads + static_cast<int>(threadIdx.x)) * S::kVec;
      if (aligned && e + S::kVec <= end) {
        raw[u] = __ldg(reinterpret_cast<const uint4*>(row + e));
      } else {
        raw[u] = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int j = 0; j < S::kVec; ++j) {
          if (e + j < end) S::set_lane(raw[u], j, row[e + j]);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int e = begin + it * kPerIter + (u * kThreads + static_cast<int>(threadIdx.x)) * S::kVec;
#pragma unroll
      for (int j = 0; j < S::kVec; ++j) f(e + j, S::key(S::lane(raw[u], j)), e + j < end);
    }
  }
}

template <class F>
__device__ __forceinline__ void visit_shared(int n, F&& f) {
  const int iters = ceil_div(n, kThreads);
  for (int it = 0; it < iters; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x);
    f(i, i < n);
  }
}

enum class Source { kCache, kGlobal, kCandidates };

// Thread t owns bins 2t and 2t+1. Sums the cluster's histograms, finds the bin T with
// count(bins above T) < k_rem <= count(bins >= T), and stores in s the cluster-wide and
// CTA-local counts above and in T. Two block barriers; the answer is read after return, and
// s.warp_sum is rewritten only after the caller's next barrier.
__device__ void find_threshold(int* hist, int k_rem, const cg::cluster_group& cluster, int cluster_size,
                               Scratch& s) {
  const int t = threadIdx.x;
  const int lane = t & 31, warp = t >> 5;
  const int2 local = reinterpret_cast<const int2*>(hist)[t];
  int2 total = local;
  if (cluster_size > 1) {
    total = make_int2(0, 0);
#pragma unroll
    for (int r = 0; r < kMaxCluster; ++r) {  // unrolled: the remote loads are issued together
      if (r < cluster_size) {
        const int2 v = reinterpret_cast<const int2*>(cluster.map_shared_rank(hist, r))[t];
        total.x += v.x;
        total.y += v.y;
      }
    }
  }
  // (cluster count << 32) | local count: both fit 32 bits, so packed sums never carry.
  auto pack = [](int hi, int lo) {
    return (static_cast<unsigned long long>(static_cast<unsigned>(hi)) << 32) | static_cast<unsigned>(lo);
  };
  const unsigned long long own = pack(total.x + total.y, local.x + local.y);
  unsigned long long incl = own;  // inclusive suffix sum over lanes >= lane
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long v = __shfl_down_sync(0xffffffffu, incl, o);
    if (lane + o < 32) incl += v;
  }
  if (lane == 0) s.warp_sum[warp] = incl;
  __syncthreads();
  // Every warp scans the 32 warp totals itself (no third barrier) and takes its own suffix.
  const unsigned long long w = s.warp_sum[lane];
  unsigned long long wincl = w;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long v = __shfl_down_sync(0xffffffffu, wincl, o);
    if (lane + o < 32) wincl += v;
  }
  const unsigned long long warp_above = __shfl_sync(0xffffffffu, wincl - w, warp);
  const unsigned long long above_hi_bin = incl - own + warp_above;  // bins above 2t+1
  const unsigned long long above_lo_bin = above_hi_bin + pack(total.y, local.y);
  auto check = [&](unsigned long long above, int count_total, int count_local, int bin) {
    const int above_total = static_cast<int>(above >> 32);
    if (above_total < k_rem && k_rem <= above_total + count_total) {
      s.bin = bin;
      s.above_total = above_total;
      s.count_total = count_total;
      s.above_local = static_cast<int>(above & 0xffffffffull);
      s.count_local = count_local;
    }
  };
  check(above_hi_bin, total.y, local.y, 2 * t + 1);
  check(above_lo_bin, total.x, local.x, 2 * t);
  __syncthreads();
}

template <class S>
__global__ void __launch_bounds__(kThreads, 1) topk_page_transform_kernel(const Params p) {
  using L = Levels<S>;
  using CacheKey = typename S::CacheKey;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ Scratch s;

  const cg::cluster_group cluster = cg::this_cluster();
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int row = blockIdx.x / cluster_size;
  const int k = p.topk;

  const int length = clamped_length(p, p.lengths[row]);
  const int batch = p.row_to_batch != nullptr ? p.row_to_batch[row] : row;
  const int* table = p.block_table + batch * p.block_table_stride;
  int* out = p.out + row * p.out_stride;

  if (length <= k) {  // every valid position is selected: structural mapping, no histogram
    const int per_rank = ceil_div(k, cluster_size);
    const int stop = min(k, (rank + 1) * per_rank);
    for (int i = rank * per_rank + static_cast<int>(threadIdx.x); i < stop; i += kThreads) {
      out[i] = i < length ? table[i / kPageSize] * kPageSize + i % kPageSize : -1;
    }
    return;  // uniform over the cluster (one cluster per row): no CTA waits on a barrier
  }

  int* const hist = reinterpret_cast<int*>(smem);  // level l accumulates into hist + (l & 1) * kBins
  int* staged_pages = reinterpret_cast<int*>(smem + kHistBytes);
  unsigned char* region = smem + kHistBytes + p.page_cache * 4;
  CacheKey* cache = reinterpret_cast<CacheKey*>(region);
  const int cand_capacity = p.region_bytes / kCandidateBytes;
  uint32_t* cand_key = reinterpret_cast<uint32_t*>(region);
  int* cand_idx = reinterpret_cast<int*>(region) + cand_capacity;

  const int chunk = ceil_div(ceil_div(length, cluster_size), kChunkAlign) * kChunkAlign;
  const int begin = min(rank * chunk, length);
  const int end = min(begin + chunk, length);
  const typename S::Raw* scores = static_cast<const typename S::Raw*>(p.scores) + row * p.scores_stride;

  PageMap pages{table};
  const int first_page = begin / kPageSize;
  const int page_count = ceil_div(end, kPageSize) - first_page;
  if (page_count <= p.page_cache) {
    for (int i = threadIdx.x; i < page_count; i += kThreads) cp_async_4(staged_pages + i, table + first_page + i);
    pages.pages = staged_pages - first_page;
  }
  for (int i = threadIdx.x; i < 2 * kBins; i += kThreads) hist[i] = 0;
  if (threadIdx.x == 0) {
    s.cluster_greater = 0;
    s.cluster_ties = 0;
  }
  __syncthreads();

  Source source = chunk * static_cast<int>(sizeof(CacheKey)) <= p.region_bytes ? Source::kCache : Source::kGlobal;
  {
    const bool cache_it = source == Source::kCache;
    visit_global<S>(scores, begin, end, [&](int i, uint32_t key, bool valid) {
      if (!valid) return;
      if (cache_it) cache[i - begin] = static_cast<CacheKey>(key);
      atomicAdd(&hist[L::digit(key, 0)], 1);
    });
  }
  cp_async_wait_all();

  // Calls f(i, key, valid) for every element of the current source, uniformly across the block.
  auto visit_source = [&](auto&& f) {
    if (source == Source::kCache) {
      visit_shared(end - begin, [&](int i, bool valid) { f(begin + i, valid ? uint32_t(cache[i]) : 0u, valid); });
    } else if (source == Source::kCandidates) {
      visit_shared(s.cand_count, [&](int i, bool valid) {
        f(valid ? cand_idx[i] : 0, valid ? cand_key[i] : 0u, valid);
      });
    } else {
      visit_global<S>(scores, begin, end, f);
    }
  };

  // The threshold prefix: active elements satisfy (key & mask) == value.
  uint32_t mask = 0, value = 0;
  int k_rem = k;
  int greater_pending = 0;  // local elements above the prefix not yet written
  int local_eq = 0;
  int* remote_greater = cluster.map_shared_rank(&s.cluster_greater, 0);
  int* remote_ties = cluster.map_shared_rank(&s.cluster_ties, 0);

  for (int l = 0;; ++l) {
    cluster_barrier(cluster, cluster_size);
    find_threshold(hist + (l & 1) * kBins, k_rem, cluster, cluster_size, s);
    greater_pending += s.above_local;
    k_rem -= s.above_total;
    mask |= L::digit_mask(l);
    value |= static_cast<uint32_t>(s.bin) << L::shift(l);
    local_eq = s.count_local;
    if (s.count_total == k_rem || l + 1 == L::kCount) break;

    int* next = hist + ((l + 1) & 1) * kBins;
    if (l >= 1) {  // its previous contents were last read by the cluster before this level's barrier
      for (int i = threadIdx.x; i < kBins; i += kThreads) next[i] = 0;
    }
    const bool compact = source == Source::kGlobal && local_eq <= cand_capacity;
    if (compact && threadIdx.x == 0) {
      s.greater_base = atomicAdd(remote_greater, greater_pending);
      s.greater_slot = 0;
      s.cand_count = 0;
    }
    __syncthreads();
    const int nl = l + 1;
    if (compact) {
      // One pass over the chunk: write every element above the prefix, keep the prefix's
      // candidates (they fit: local_eq <= capacity) and histogram their next digit.
      const int greater_base = s.greater_base;
      visit_global<S>(scores, begin, end, [&](int i, uint32_t key, bool valid) {
        const uint32_t masked = key & mask;
        const bool greater = valid && masked > value;
        const bool equal = valid && masked == value;
        const int g = warp_slot(greater, &s.greater_slot);
        if (greater) out[greater_base + g] = pages.physical(i);
        const int c = warp_slot(equal, &s.cand_count);
        if (equal) {
          cand_key[c] = key;
          cand_idx[c] = i;
          atomicAdd(&next[L::digit(key, nl)], 1);
        }
      });
      greater_pending = 0;
      source = Source::kCandidates;
    } else {
      visit_source([&](int, uint32_t key, bool valid) {
        if (valid && (key & mask) == value) atomicAdd(&next[L::digit(key, nl)], 1);
      });
    }
  }

  // Emit: elements above the prefix take [0, k - k_rem); elements equal to it share the
  // k_rem remaining slots, first come first served across the cluster.
  if (threadIdx.x == 0) {
    s.greater_base = atomicAdd(remote_greater, greater_pending);
    s.tie_base = atomicAdd(remote_ties, local_eq);
    s.greater_slot = 0;
    s.tie_slot = 0;
  }
  __syncthreads();
  const int greater_base = s.greater_base;
  const int tie_base = k - k_rem + s.tie_base;
  const int tie_take = min(local_eq, k_rem - s.tie_base);  // <= 0: all ties taken by other CTAs
  visit_source([&](int i, uint32_t key, bool valid) {
    const uint32_t masked = key & mask;
    const bool greater = valid && masked > value;
    const bool equal = valid && masked == value;
    const int g = warp_slot(greater, &s.greater_slot);
    if (greater) out[greater_base + g] = pages.physical(i);
    const int e = warp_slot(equal, &s.tie_slot);
    if (equal && e < tie_take) out[tie_base + e] = pages.physical(i);
  });
  // Rank 0's counters and every CTA's histograms must outlive the cluster's last remote access.
  if (cluster_size > 1) cluster.sync();
}

static_assert(sizeof(Scratch) <= kStaticSmemReserve, "Scratch outgrew its shared-memory reserve");

}  // namespace topk
