// Exact top-k of score rows fused with page-table translation (DSA stage 2).
//
// Contract (C ABI, see dsa_topk_page_transform below):
//   scores       [rows, max_len] fp32 or bf16, row stride scores_stride (elements), unit column stride
//   lengths      [rows] int32: row r's valid scores are its first lengths[r]
//   block_table  [batch_rows, max_pages] int32, row stride block_table_stride
//   row_to_batch [rows] int32 or NULL (NULL: row r uses block-table row r)
//   out          [rows, topk] int32, row stride out_stride: physical ids
//                block_table[b, i / 64] * 64 + i % 64 of the top min(topk, length) positions
//                i, -1 padded, in no particular order (set semantics, no duplicates); rows of
//                max_len <= kRowMaxLen give the same ids in the same order on every call.
//   1 <= topk <= kMaxTopk; 0 <= num_pages <= 2^25 (every id then fits int32).
// Masking: a selected position whose block-table entry is outside [0, num_pages) is written as
// -1, and a row whose row_to_batch value is outside [0, batch_rows) is all -1 (its block-table
// row is never read); each such -1 in place of a due id adds 1 to *bad_count (atomics on that path
// only). Selection itself never depends on the page ids.
// Order: scores are ranked by an order-preserving unsigned key (fp32: 32 bits, bf16: 16 bits)
// in which -0.0 equals +0.0 and every NaN ranks below -inf; ties at the threshold are broken
// exactly (topk ids in total): in thread order by the row kernel, first come first served across
// the cluster kernel's CTAs. Lengths are clamped to
// [0, min(max_len, max_pages * 64)] so a malformed length never reads outside the buffers; the
// operator's contract requires them in range. Rows with length <= topk take the structural
// mapping (no histogram).
//
// Algorithm: radix select with 11-bit digits (fp32: 11+11+10 bits, bf16: 11+5), two kernels:
// - topk_row.cuh, max_len <= kRowMaxLen: one CTA per row with the row's keys in registers, every
//   load issued before the first wait (short rows are latency-bound);
// - topk_cluster.cuh, longer rows: a thread-block cluster per row, as large as keeps every row's
//   cluster resident at once (one wave, by the occupancy API) and every CTA >= kMinChunk scores;
//   keys cached in shared memory when a chunk fits, else compacted candidates, else re-reads of
//   global memory with the prefix filter: exact for every input, never a clamp.
// Neither kernel needs a global workspace or a host synchronization per call, so calls are
// CUDA-graph capturable.

#include <cuda_runtime.h>

#include "topk_cluster.cuh"
#include "topk_common.cuh"
#include "topk_row.cuh"

namespace topk {
namespace {

enum ErrorCode : int {
  kOk = 0,
  kBadTopk = -1,
  kBadDtype = -2,
  kBadShape = -3,
  kNullPointer = -4,
  kBadPages = -5,
};

// Ids of pages [0, kMaxPages) fit int32.
constexpr int kMaxPages = 1 << 25;
static_assert(static_cast<long long>(kMaxPages) * kPageSize - 1 == 0x7fffffffLL, "the largest id is INT32_MAX");

enum Dtype : int { kFloat32 = 0, kBfloat16 = 1 };

// Cluster sizes tried: 1 << i for i < kClusterSizeCount.
constexpr int kClusterSizeCount = 4;
static_assert(kMaxCluster == 1 << (kClusterSizeCount - 1), "one occupancy entry per allowed cluster size");

struct DeviceInfo {
  int region_bytes = 0;  // the largest region this device's per-block shared memory allows
  // Clusters of 1 << i CTAs of the fp32 / bf16 kernel resident at once (0: a size the device
  // cannot run). A cluster must fit in one GPC, so this can be less than sm_count >> i.
  int max_clusters[2][kClusterSizeCount] = {};
  bool configured = false;
};

constexpr int kMaxDevices = 64;
DeviceInfo g_devices[kMaxDevices];

template <class S>
cudaError_t configure(DeviceInfo& info, int* max_clusters) {
  const auto kernel = topk_page_transform_kernel<S>;
  const int smem_bytes = kFixedDynamicSmem + info.region_bytes;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  for (int i = 0; i < kClusterSizeCount; ++i) {
    const int cluster_size = 1 << i;
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(static_cast<unsigned>(cluster_size));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim = {static_cast<unsigned>(cluster_size), 1, 1};
    config.attrs = attr;
    config.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&max_clusters[i], kernel, &config) != cudaSuccess) {
      max_clusters[i] = 0;  // a size this device cannot run
      cudaGetLastError();   // the refused query must not surface at the caller's next error check
    }
  }
  return cudaSuccess;
}

// Once per device: the attribute queries and settings are host-only calls.
int device_info(DeviceInfo** out) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices) return kBadShape;
  DeviceInfo& info = g_devices[device];
  if (!info.configured) {
    int optin = 0;
    err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (err != cudaSuccess) return err;
    // The key cache / candidate region takes what the per-block limit leaves (sm_90/sm_100:
    // 227 KB -> 205 KB, 52K fp32 keys; sm_120: 99 KB -> 77 KB).
    info.region_bytes = (optin - kFixedDynamicSmem - kStaticSmemReserve) / 16 * 16;
    err = configure<Fp32>(info, info.max_clusters[kFloat32]);
    if (err == cudaSuccess) err = configure<Bf16>(info, info.max_clusters[kBfloat16]);
    if (err != cudaSuccess) return err;
    info.configured = true;
  }
  *out = &info;
  return kOk;
}

// Cluster size of the cluster kernel: spread a row over more SMs while every row's cluster is
// resident at once (one wave) and every CTA keeps at least kMinChunk scores.
int cluster_size_for(const DeviceInfo& info, int dtype, int rows, int max_len) {
  int cluster_size = 1;
  for (int i = 1; i < kClusterSizeCount; ++i) {
    if (rows > info.max_clusters[dtype][i] || ceil_div(max_len, 1 << i) < kMinChunk) break;
    cluster_size = 1 << i;
  }
  return cluster_size;
}

// Keys per thread of the register-resident kernel: half the largest for rows up to half of
// kRowMaxLen, but at least one 16-byte vector.
template <class S>
constexpr int row_per_thread_small() {
  return kRowMaxLen / kRowThreads / 2 > S::kVec ? kRowMaxLen / kRowThreads / 2 : S::kVec;
}
constexpr int kRowPerThreadLarge = kRowMaxLen / kRowThreads;

template <class S>
int launch_rows(const Params& p, int rows, cudaStream_t stream) {
  constexpr int kSmall = row_per_thread_small<S>();
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(rows));
  config.blockDim = dim3(kRowThreads);
  config.stream = stream;
  if (p.max_len <= kSmall * kRowThreads) return cudaLaunchKernelEx(&config, topk_row_kernel<S, kSmall>, p);
  return cudaLaunchKernelEx(&config, topk_row_kernel<S, kRowPerThreadLarge>, p);
}

template <class S>
int launch(const Params& p, int dtype, int rows, cudaStream_t stream) {
  if (p.max_len <= kRowMaxLen) return launch_rows<S>(p, rows, stream);
  DeviceInfo* info = nullptr;
  const int status = device_info(&info);
  if (status != kOk) return status;
  const int cluster_size = cluster_size_for(*info, dtype, rows, p.max_len);
  Params q = p;
  const int chunk = ceil_div(ceil_div(p.max_len, cluster_size), kChunkAlign) * kChunkAlign;
  const int cache_bytes = chunk * static_cast<int>(sizeof(typename S::CacheKey));
  // A region that caches the longest chunk is enough; otherwise the full candidate region.
  q.region_bytes = cache_bytes <= info->region_bytes ? ceil_div(cache_bytes, 16) * 16 : info->region_bytes;
  q.page_cache = min(ceil_div(ceil_div(chunk, kPageSize) + 1, 4) * 4, kMaxPageCache);
  const int smem_bytes = kHistBytes + kReducedBytes + q.page_cache * 4 + q.region_bytes;

  return launch_clusters(topk_page_transform_kernel<S>, q, rows * cluster_size, kThreads, cluster_size, smem_bytes,
                         stream);
}

int check_args(int dtype, int rows, int max_len) {
  if (dtype != kFloat32 && dtype != kBfloat16) return kBadDtype;
  if (rows < 0 || max_len < 0) return kBadShape;
  return kOk;
}

}  // namespace
}  // namespace topk

using namespace topk;

extern "C" {

int dsa_topk_max_topk() { return kMaxTopk; }

int dsa_topk_max_pages() { return kMaxPages; }

// Writes out[rows, topk]; see the contract at the top of this file. Returns 0, a CUDA error
// code (> 0), or a negative ErrorCode; dsa_topk_error_string names either.
int dsa_topk_page_transform(const void* scores, int dtype, long long scores_stride, const int* lengths,
                            const int* block_table, long long block_table_stride, int batch_rows, int max_pages,
                            const int* row_to_batch, int num_pages, int* bad_count, int* out,
                            long long out_stride, int rows, int max_len, int topk, cudaStream_t stream) {
  if (topk < 1 || topk > kMaxTopk) return kBadTopk;
  const int status = check_args(dtype, rows, max_len);
  if (status != kOk) return status;
  if (max_pages < 0 || batch_rows < 0 || scores_stride < max_len || out_stride < topk ||
      block_table_stride < max_pages || (row_to_batch == nullptr && batch_rows < rows)) {
    return kBadShape;
  }
  if (num_pages < 0 || num_pages > kMaxPages) return kBadPages;
  if (rows == 0) return kOk;
  // An empty scores or block_table matrix is never read (lengths clamp to 0), so it may be null.
  const bool no_scores = scores == nullptr && max_len > 0;
  const bool no_table = block_table == nullptr && static_cast<long long>(batch_rows) * max_pages > 0;
  if (no_scores || no_table || lengths == nullptr || out == nullptr || bad_count == nullptr) return kNullPointer;
  const Params p{scores, scores_stride, lengths, block_table, block_table_stride, max_pages, row_to_batch,
                 batch_rows, num_pages, bad_count, out, out_stride, max_len, topk, 0, 0};
  return dtype == kFloat32 ? launch<Fp32>(p, dtype, rows, stream) : launch<Bf16>(p, dtype, rows, stream);
}

// Which kernel dsa_topk_page_transform launches on the current device for this shape: writes 0
// for the register-resident row kernel, else the cluster kernel's cluster size. Returns as
// dsa_topk_page_transform does.
int dsa_topk_launch_plan(int dtype, int rows, int max_len, int* cluster_size) {
  const int status = check_args(dtype, rows, max_len);
  if (status != kOk) return status;
  if (cluster_size == nullptr) return kNullPointer;
  if (max_len <= kRowMaxLen) {
    *cluster_size = 0;
    return kOk;
  }
  DeviceInfo* info = nullptr;
  const int err = device_info(&info);
  if (err == kOk) *cluster_size = cluster_size_for(*info, dtype, rows, max_len);
  return err;
}

const char* dsa_topk_error_string(int code) {
  switch (code) {
    case kOk: return "ok";
    case kBadTopk: return "topk must be in [1, 2048]";
    case kBadDtype: return "scores dtype must be float32 or bfloat16";
    case kBadShape: return "inconsistent shapes or strides";
    case kNullPointer: return "null device pointer";
    case kBadPages: return "num_pages must be in [0, 2^25]";
    default: return code > 0 ? cudaGetErrorString(static_cast<cudaError_t>(code)) : "unknown error";
  }
}

}  // extern "C"
