// Shared pieces of the top-k kernels (topk.cu): radix keys, digit levels, launch parameters and
// small device helpers. See topk.cu for the operator's contract.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../ptx.cuh"

namespace topk {

using ptx::prefetch_l2;
using ptx::smem_addr;

constexpr int kDigitBits = 11;  // 2048-bin histograms: 8 KB, few levels (fp32 11+11+10, bf16 11+5)
constexpr int kBins = 1 << kDigitBits;
constexpr int kPageSize = 64;  // tokens per page of the paged KV cache
constexpr int kMaxTopk = 2048;  // the contract's largest k

// Keys: a > b as scores (with -0 == +0 and NaN below -inf) iff key(a) > key(b). NaN takes key 1
// (the bit patterns that would map below -inf's key are all NaNs, so 1..key(-inf)-1 are free),
// which leaves key 0 to mark positions at or past a row's length in the register-resident kernel.
constexpr uint32_t kNanKey = 1u;
constexpr uint32_t kInvalidKey = 0u;

struct Fp32 {
  using Raw = uint32_t;
  using CacheKey = uint32_t;
  static constexpr int kKeyBits = 32;
  static constexpr int kVec = 4;     // elements per 16-byte load
  static constexpr int kUnroll = 4;  // 16-byte loads in flight per thread per global pass
  // Negative: all bits flipped, else the sign bit set. The finite keys and the infinities span
  // [key(-inf), key(+inf)] = [0x007fffff, 0xff800000]; NaNs land outside (one unsigned compare).
  __device__ static uint32_t key(uint32_t u) {  // selects, no branches
    u = u == 0x80000000u ? 0u : u;
    const uint32_t k = u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
    return k - 0x007fffffu > 0xff800000u - 0x007fffffu ? kNanKey : k;
  }
  __device__ static uint32_t lane(const uint4& v, int j) { return (&v.x)[j]; }
  __device__ static void set_lane(uint4& v, int j, Raw x) { (&v.x)[j] = x; }
};

struct Bf16 {
  using Raw = uint16_t;
  using CacheKey = uint16_t;
  static constexpr int kKeyBits = 16;
  static constexpr int kVec = 8;
  static constexpr int kUnroll = 2;  // 16 keys per thread as for fp32: more spills registers at 1024 threads
  // As Fp32::key on 16 bits (u < 1 << 16): finite keys and infinities span [0x007f, 0xff80].
  __device__ static uint32_t key(uint32_t u) {
    u = u == 0x8000u ? 0u : u;
    const uint32_t k = u ^ ((static_cast<uint32_t>(static_cast<int32_t>(u << 16) >> 31) & 0x7fffu) | 0x8000u);
    return k - 0x007fu > 0xff80u - 0x007fu ? kNanKey : k;
  }
  __device__ static uint32_t lane(const uint4& v, int j) { return ((&v.x)[j >> 1] >> ((j & 1) * 16)) & 0xffffu; }
  __device__ static void set_lane(uint4& v, int j, Raw x) {
    (&v.x)[j >> 1] |= static_cast<uint32_t>(x) << ((j & 1) * 16);
  }
};

// Level l refines the key bits [shift(l), shift(l - 1)), most significant first.
template <class S>
struct Levels {
  static constexpr int kCount = (S::kKeyBits + kDigitBits - 1) / kDigitBits;
  __host__ __device__ static constexpr int shift(int l) {
    return S::kKeyBits - kDigitBits * (l + 1) > 0 ? S::kKeyBits - kDigitBits * (l + 1) : 0;
  }
  __host__ __device__ static constexpr uint32_t digit_mask(int l) {
    return ((1u << ((l == 0 ? S::kKeyBits : shift(l - 1)) - shift(l))) - 1u) << shift(l);
  }
  __device__ static int digit(uint32_t key, int l) { return (key & digit_mask(l)) >> shift(l); }
};

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

struct Params {
  const void* scores;
  long long scores_stride;
  const int* lengths;
  const int* block_table;
  long long block_table_stride;
  int max_pages;
  const int* row_to_batch;
  int batch_rows;  // block_table's rows: a row_to_batch value outside [0, batch_rows) masks its row
  int num_pages;   // pages in the cache: a block-table entry outside [0, num_pages) translates to -1
  int* bad_count;  // adds the ids written as -1 for either reason
  int* out;
  long long out_stride;
  int max_len;
  int topk;
  int region_bytes;  // cluster kernel: key cache / candidate region
  int page_cache;    // cluster kernel: block-table entries staged in shared memory
};

// Launches kernel(p) on `blocks` CTAs of `threads` threads in thread-block clusters of `cluster_size`, with
// `smem_bytes` of dynamic shared memory, on `stream`.
template <class P>
cudaError_t launch_clusters(void (*kernel)(P), const P& p, int blocks, int threads, int cluster_size, int smem_bytes,
                            cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim = {static_cast<unsigned>(cluster_size), 1, 1};
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, p);
}

// Valid positions of a row: lengths are clamped so that a malformed one never reads outside the
// buffers (the operator's contract requires them in range).
__device__ __forceinline__ int clamped_length(const Params& p, int raw) {
  return min(max(raw, 0), min(p.max_len, p.max_pages * kPageSize));
}

// One unsigned compare each: a negative value wraps above every bound.
__device__ __forceinline__ bool batch_in_table(const Params& p, int batch) {
  return static_cast<unsigned>(batch) < static_cast<unsigned>(p.batch_rows);
}

__device__ __forceinline__ bool page_in_cache(const Params& p, int page) {
  return static_cast<unsigned>(page) < static_cast<unsigned>(p.num_pages);
}

// The physical id of slot `slot` of `page`, or -1 (counted by the caller) for a page outside the cache:
// such an entry never becomes an id that could be dereferenced.
__device__ __forceinline__ int physical_id(const Params& p, int page, int slot) {
  return page_in_cache(p, page) ? page * kPageSize + slot : -1;
}

// Adds a thread's masked ids to the device counter: an atomic on the bad path only.
__device__ __forceinline__ void count_masked(const Params& p, int masked) {
  if (masked > 0) atomicAdd(p.bad_count, masked);
}

// A row whose valid positions all fit in topk (the structural mapping): out[i] for i in [begin, stop), every
// stride-th, is the physical id of position i below `length` and -1 past it. Each -1 in place of a due id is
// counted per id, on the bad path: a per-thread sum then one atomic costs the row kernel 9 registers.
__device__ __forceinline__ void map_structurally(const Params& p, const int* table, int* out, int length, int begin,
                                                 int stop, int stride) {
  for (int i = begin; i < stop; i += stride) {
    const int id = i < length ? physical_id(p, table[i / kPageSize], i % kPageSize) : -1;
    out[i] = id;
    if (i < length && id < 0) atomicAdd(p.bad_count, 1);
  }
}

// A row whose row_to_batch value is outside the block table: every slot -1, its min(length, k)
// due ids counted once by thread 0 of the row's first CTA (first_cta). The block table is not read.
__device__ __forceinline__ void mask_row(const Params& p, int* out, int length, int begin, int stop, int stride,
                                         bool first_cta) {
  for (int i = begin; i < stop; i += stride) out[i] = -1;
  if (first_cta && threadIdx.x == 0) count_masked(p, min(length, p.topk));
}

// Loads the compiler may neither sink below a later branch nor delay to their first use
// (volatile), so that they are in flight while the row's length and batch are still loading.
__device__ __forceinline__ uint4 load_early_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ int load_early_s32(const int* p) {
  int v;
  asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

// Adds 1 to the shared-memory counter at `addr` (shared window) when `pred`, else to `sink`, a
// word of this lane's own (no bank conflict): one red.shared a call and no branch. Predicating
// it instead makes ptxas wrap each call in a branch region, which histogram loops of a dozen to a
// hundred calls a thread cannot afford.
__device__ __forceinline__ void count_if(bool pred, uint32_t addr, uint32_t sink) {
  asm volatile("red.shared.add.u32 [%0], 1;" ::"r"(pred ? addr : sink) : "memory");
}

// The byte offset of key's level-l digit in a histogram of 4-byte counters.
template <class L>
__device__ __forceinline__ uint32_t digit_offset(uint32_t key, int l) {
  return static_cast<uint32_t>(L::digit(key, l)) * 4u;
}

}  // namespace topk
