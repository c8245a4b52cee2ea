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
// Clusters of at most the portable size: a non-portable 16 CTAs spreads a long row wider but slows it;
// chunks of at least kMinChunk: fewer CTAs of longer chunks beat more CTAs of shorter ones
// (docs/design.md, "Measured choices").
constexpr int kMaxCluster = 8;
constexpr int kMinChunk = 8192;
constexpr int kChunkAlign = 8;                       // chunk starts stay 16-byte aligned for fp32 and bf16
constexpr int kCandidateBytes = 8;                   // candidate = (uint32 key, int32 index)
constexpr int kMaxPageCache = 1024;                  // block-table entries staged in shared memory (64K tokens)
constexpr int kHistBytes = 2 * kBins * 4;            // double-buffered histogram (levels alternate)
// Clusters of at least this many CTAs sum their histograms by reduce-scatter + all-gather: each
// CTA reads 16 KB of remote shared memory a level instead of cluster_size * 8 KB (the SM-to-SM
// network, not the arithmetic, bounds the direct sum at 8 CTAs).
constexpr int kScatterMinCluster = 8;
constexpr int kReducedBytes = kBins / kScatterMinCluster * 4;  // this CTA's slice of the cluster's sum
constexpr int kFixedDynamicSmem = kHistBytes + kReducedBytes + kMaxPageCache * 4;
constexpr int kStaticSmemReserve = 1024;             // Scratch (checked below) within the per-block opt-in limit
static_assert(kMaxPageCache % 4 == 0 && kReducedBytes % 16 == 0,
              "the region after the staged pages stays 16-byte aligned");
static_assert(kMaxCluster <= kBins / 2 && kBins / kScatterMinCluster <= kThreads,
              "a reduce-scatter slice is at most one bin a thread");

// Block-uniform state shared by the threads of one CTA.
struct Scratch {
  unsigned long long warp_sum[kWarps];
  int sink[32];  // count_if's per-lane words for elements outside the active prefix
  int bin, above_total, count_total, above_local, count_local;  // find_threshold's answer
  int greater_base, tie_base;                                    // this CTA's output offsets
  int cand_count;                                                // candidates compacted
  unsigned long long slots;  // CTA-local running counters: greater elements << 32 | equal elements
  int cluster_greater, cluster_ties;                             // used on rank 0 only, via DSMEM
};

// One thread's elements of one iteration of visit_global: kVecs vectors of kVec consecutive
// positions from first[u]; positions at or past `end` are invalid. Indices and validity are
// recomputed where used, not held: registers are at their cap (1024 threads).
template <int kVecs, int kVec>
struct GlobalBatch {
  static_assert(kVecs * kVec <= 32, "classify's bit masks");
  uint32_t key[kVecs * kVec];
  int first[kVecs];
  int end;
};

template <int kVecs, int kVec, class F>
__device__ __forceinline__ void for_each_element(const GlobalBatch<kVecs, kVec>& b, F&& f) {
#pragma unroll
  for (int u = 0; u < kVecs; ++u) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) f(u * kVec + j, b.first[u] + j, b.key[u * kVec + j], b.first[u] + j < b.end);
  }
}

// One thread's elements of one iteration of visit_shared: element u is array entry
// first + u * kThreads, valid below n.
template <int N>
struct SharedBatch {
  static_assert(N <= 32, "classify's bit masks");
  uint32_t key[N];
  int index[N];
  int first, n;
};

template <int N, class F>
__device__ __forceinline__ void for_each_element(const SharedBatch<N>& b, F&& f) {
#pragma unroll
  for (int u = 0; u < N; ++u) f(u, b.index[u], b.key[u], b.first + u * kThreads < b.n);
}

// Adapts a per-element f(i, key, valid) to the batch visitors.
template <class F>
__device__ __forceinline__ auto each(F&& f) {
  return [&f](const auto& b) { for_each_element(b, [&f](int, int i, uint32_t key, bool valid) { f(i, key, valid); }); };
}

// Bit n of .x / .y: the batch's element n is above / equal to the threshold prefix.
template <class B>
__device__ __forceinline__ uint2 classify(const B& b, uint32_t mask, uint32_t value) {
  uint2 bits = make_uint2(0u, 0u);
  for_each_element(b, [&](int n, int, uint32_t key, bool valid) {
    bits.x |= static_cast<uint32_t>(valid && (key & mask) > value) << n;
    bits.y |= static_cast<uint32_t>(valid && (key & mask) == value) << n;
  });
  return bits;
}

// This thread's first slots for `greater` and `equal` elements, reserved from the packed shared
// counter (greater << 32 | equal) with one warp scan and one atomic per warp: per element this
// costs two adds, where a ballot-based slot a class costs a dozen instructions. Every lane of the
// warp must call it.
__device__ __forceinline__ int2 reserve_slots(int greater, int equal, unsigned long long* counter) {
  const unsigned long long mine = (static_cast<unsigned long long>(greater) << 32) | static_cast<unsigned>(equal);
  if (__ballot_sync(0xffffffffu, mine != 0ull) == 0u) return make_int2(0, 0);
  const int lane = threadIdx.x & 31;
  unsigned long long incl = mine;  // inclusive prefix sum over lanes <= lane
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += v;
  }
  unsigned long long base = 0;
  if (lane == 31) base = atomicAdd(counter, incl);
  const unsigned long long start = __shfl_sync(0xffffffffu, base, 31) + incl - mine;
  return make_int2(static_cast<int>(start >> 32), static_cast<int>(start & 0xffffffffull));
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

// Logical position -> physical id, -1 for a page outside the cache (added to `masked`). `pages`
// points at the row's block-table entries, either the staged shared-memory copy (offset so that it
// is indexed by logical page) or global memory; generic addressing serves both.
struct PageMap {
  const int* pages;
  __device__ int physical(const Params& p, int i, int& masked) const {  // i >= 0: unsigned division is a shift
    const unsigned u = static_cast<unsigned>(i);
    const int id = physical_id(p, pages[u / kPageSize], static_cast<int>(u % kPageSize));
    masked += id < 0;
    return id;
  }
};

// Calls f(batch) with every position of [begin, end) read from global memory, kUnroll vectors a
// thread an iteration, with a trip count uniform across the block so that f may use warp
// collectives.
template <class S, int kUnroll, class F>
__device__ __forceinline__ void visit_global(const typename S::Raw* row, int begin, int end, F&& f) {
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
    GlobalBatch<kUnroll, S::kVec> b;
    b.end = end;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      b.first[u] = begin + it * kPerIter + (u * kThreads + static_cast<int>(threadIdx.x)) * S::kVec;
#pragma unroll
      for (int j = 0; j < S::kVec; ++j) b.key[u * S::kVec + j] = S::key(S::lane(raw[u], j));
    }
    f(b);
  }
}

template <int N>
struct Unroll {  // a compile-time vectors-per-iteration argument
  static constexpr int value = N;
};

constexpr int kSharedBatch = 8;  // elements a thread per iteration of visit_shared

// Calls f(batch) with elements 0 .. n-1 of a shared-memory array, load(i, key, index) reading
// element i, kSharedBatch a thread an iteration, with a trip count uniform across the block.
template <class Load, class F>
__device__ __forceinline__ void visit_shared(int n, Load&& load, F&& f) {
  const int iters = ceil_div(n, kThreads * kSharedBatch);
  for (int it = 0; it < iters; ++it) {
    SharedBatch<kSharedBatch> b;
    b.first = it * kSharedBatch * kThreads + static_cast<int>(threadIdx.x);
    b.n = n;
#pragma unroll
    for (int u = 0; u < kSharedBatch; ++u) {
      const int i = b.first + u * kThreads;
      b.key[u] = 0u;
      b.index[u] = 0;
      if (i < n) load(i, b.key[u], b.index[u]);
    }
    f(b);
  }
}

enum class Source { kCache, kGlobal, kCandidates };

// The cluster-wide counts of bins 2t and 2t+1 (thread t). Below kScatterMinCluster CTAs, every
// CTA sums every CTA's histogram. From there on, CTA r first sums slice r of the bins over the
// cluster into `reduced`, and after a cluster barrier every CTA reads each slice from its owner.
// `reduced` is rewritten only after the caller's next cluster barrier, which every CTA reaches
// after its reads here.
__device__ __forceinline__ int2 cluster_counts(const int* hist, int* reduced, const cg::cluster_group& cluster,
                                               int cluster_size) {
  const int t = threadIdx.x;
  if (cluster_size < kScatterMinCluster) {
    int2 total = make_int2(0, 0);
#pragma unroll
    for (int r = 0; r < kScatterMinCluster - 1; ++r) {  // unrolled: the remote loads are issued together
      if (r < cluster_size) {
        const int2 v = reinterpret_cast<const int2*>(cluster.map_shared_rank(hist, r))[t];
        total.x += v.x;
        total.y += v.y;
      }
    }
    return total;
  }
  const int slice = kBins / cluster_size;  // even, so bins 2t and 2t+1 share an owner
  const int rank = static_cast<int>(cluster.block_rank());
  if (t < slice) {
    int sum = 0;
#pragma unroll
    for (int r = 0; r < kMaxCluster; ++r) {
      if (r < cluster_size) sum += cluster.map_shared_rank(hist, r)[rank * slice + t];
    }
    reduced[t] = sum;
  }
  cluster.sync();
  const int owner = 2 * t / slice;
  return reinterpret_cast<const int2*>(cluster.map_shared_rank(reduced, owner))[t - owner * slice / 2];
}

// Thread t owns bins 2t and 2t+1. Sums the cluster's histograms, finds the bin T with
// count(bins above T) < k_rem <= count(bins >= T), and stores in s the cluster-wide and
// CTA-local counts above and in T. Two block barriers; the answer is read after return, and
// s.warp_sum is rewritten only after the caller's next barrier.
__device__ void find_threshold(int* hist, int* reduced, int k_rem, const cg::cluster_group& cluster,
                               int cluster_size, Scratch& s) {
  const int t = threadIdx.x;
  const int lane = t & 31, warp = t >> 5;
  const int2 local = reinterpret_cast<const int2*>(hist)[t];
  const int2 total = cluster_size > 1 ? cluster_counts(hist, reduced, cluster, cluster_size) : local;
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
  int* out = p.out + row * p.out_stride;
  const int per_rank = ceil_div(k, cluster_size);
  const int stop = min(k, (rank + 1) * per_rank);
  if (!batch_in_table(p, batch)) {
    mask_row(p, out, length, rank * per_rank + static_cast<int>(threadIdx.x), stop, kThreads, rank == 0);
    return;  // uniform over the cluster
  }
  const int* table = p.block_table + batch * p.block_table_stride;

  if (length <= k) {  // every valid position is selected: structural mapping, no histogram
    map_structurally(p, table, out, length, rank * per_rank + static_cast<int>(threadIdx.x), stop, kThreads);
    return;  // uniform over the cluster (one cluster per row): no CTA waits on a barrier
  }

  int* const hist = reinterpret_cast<int*>(smem);  // level l accumulates into hist + (l & 1) * kBins
  int* const reduced = reinterpret_cast<int*>(smem + kHistBytes);
  int* staged_pages = reinterpret_cast<int*>(smem + kHistBytes + kReducedBytes);
  unsigned char* region = smem + kHistBytes + kReducedBytes + p.page_cache * 4;
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

  const uint32_t sink = smem_addr(s.sink + (threadIdx.x & 31));
  Source source = chunk * static_cast<int>(sizeof(CacheKey)) <= p.region_bytes ? Source::kCache : Source::kGlobal;
  {
    const bool cache_it = source == Source::kCache;
    const uint32_t hist_addr = smem_addr(hist);
    visit_global<S, S::kUnroll>(scores, begin, end, each([&](int i, uint32_t key, bool valid) {
      if (cache_it && valid) cache[i - begin] = static_cast<CacheKey>(key);
      count_if(valid, hist_addr + digit_offset<L>(key, 0), sink);
    }));
  }
  cp_async_wait_all();

  // The passes that reserve output slots hold a batch's keys across a warp scan: half the loads
  // in flight of the histogram passes keeps them within the 64 registers of 1024 threads.
  constexpr int kSlotUnroll = S::kUnroll / 2;
  static_assert(kSlotUnroll >= 1, "at least one vector a thread an iteration");
  // Calls f(batch) with every element of the current source, uniformly across the block,
  // `unroll` vectors a thread an iteration when the source is global memory.
  auto visit_source = [&](auto unroll, auto&& f) {
    if (source == Source::kCache) {
      visit_shared(end - begin, [&](int i, uint32_t& key, int& index) {
        key = cache[i];
        index = begin + i;
      }, f);
    } else if (source == Source::kCandidates) {
      visit_shared(s.cand_count, [&](int i, uint32_t& key, int& index) {
        key = cand_key[i];
        index = cand_idx[i];
      }, f);
    } else {
      visit_global<S, decltype(unroll)::value>(scores, begin, end, f);
    }
  };

  // The threshold prefix: active elements satisfy (key & mask) == value.
  uint32_t mask = 0, value = 0;
  int k_rem = k;
  int greater_pending = 0;  // local elements above the prefix not yet written
  int local_eq = 0;
  int* remote_greater = cluster.map_shared_rank(&s.cluster_greater, 0);
  int* remote_ties = cluster.map_shared_rank(&s.cluster_ties, 0);
  int masked = 0;  // ids this thread wrote as -1 (pages outside the cache)

  for (int l = 0;; ++l) {
    cluster_barrier(cluster, cluster_size);
    find_threshold(hist + (l & 1) * kBins, reduced, k_rem, cluster, cluster_size, s);
    greater_pending += s.above_local;
    k_rem -= s.above_total;
    mask |= L::digit_mask(l);
    value |= static_cast<uint32_t>(s.bin) << L::shift(l);
    local_eq = s.count_local;
    if (s.count_total == k_rem || l + 1 == L::kCount) break;

    int* next = hist + ((l + 1) & 1) * kBins;
    const uint32_t next_addr = smem_addr(next);
    if (l >= 1) {  // its previous contents were last read by the cluster before this level's barrier
      for (int i = threadIdx.x; i < kBins; i += kThreads) next[i] = 0;
    }
    const bool compact = source == Source::kGlobal && local_eq <= cand_capacity;
    if (compact && threadIdx.x == 0) {
      s.greater_base = atomicAdd(remote_greater, greater_pending);
      s.slots = 0;
    }
    __syncthreads();
    const int nl = l + 1;
    if (compact) {
      // One pass over the chunk: write every element above the prefix, keep the prefix's
      // candidates (they fit: local_eq <= capacity) and histogram their next digit.
      const int greater_base = s.greater_base;
      visit_global<S, kSlotUnroll>(scores, begin, end, [&](const auto& b) {
        const uint2 bits = classify(b, mask, value);
        int2 slot = reserve_slots(__popc(bits.x), __popc(bits.y), &s.slots);
        for_each_element(b, [&](int n, int i, uint32_t key, bool) {
          const bool is_equal = (bits.y >> n) & 1u;
          if ((bits.x >> n) & 1u) out[greater_base + slot.x++] = pages.physical(p, i, masked);
          if (is_equal) {
            cand_key[slot.y] = key;
            cand_idx[slot.y++] = i;
          }
          count_if(is_equal, next_addr + digit_offset<L>(key, nl), sink);
        });
      });
      __syncthreads();
      if (threadIdx.x == 0) s.cand_count = static_cast<int>(s.slots & 0xffffffffull);
      greater_pending = 0;
      source = Source::kCandidates;
    } else {
      visit_source(Unroll<S::kUnroll>{}, each([&](int, uint32_t key, bool valid) {
        count_if(valid && (key & mask) == value, next_addr + digit_offset<L>(key, nl), sink);
      }));
    }
  }

  // Emit: elements above the prefix take [0, k - k_rem); elements equal to it share the
  // k_rem remaining slots, first come first served across the cluster.
  if (threadIdx.x == 0) {
    s.greater_base = atomicAdd(remote_greater, greater_pending);
    s.tie_base = atomicAdd(remote_ties, local_eq);
    s.slots = 0;
  }
  __syncthreads();
  const int greater_base = s.greater_base;
  const int tie_base = k - k_rem + s.tie_base;
  const int tie_take = min(local_eq, k_rem - s.tie_base);  // <= 0: all ties taken by other CTAs
  visit_source(Unroll<kSlotUnroll>{}, [&](const auto& b) {
    const uint2 bits = classify(b, mask, value);
    int2 slot = reserve_slots(__popc(bits.x), __popc(bits.y), &s.slots);
    for_each_element(b, [&](int n, int i, uint32_t, bool) {
      const bool is_equal = (bits.y >> n) & 1u;
      if ((bits.x >> n) & 1u) out[greater_base + slot.x++] = pages.physical(p, i, masked);
      if (is_equal && slot.y < tie_take) out[tie_base + slot.y] = pages.physical(p, i, masked);
      slot.y += is_equal;
    });
  });
  count_masked(p, masked);
  // Rank 0's counters and every CTA's histograms must outlive the cluster's last remote access.
  if (cluster_size > 1) cluster.sync();
}

static_assert(sizeof(Scratch) <= kStaticSmemReserve, "Scratch outgrew its shared-memory reserve");

}  // namespace topk
