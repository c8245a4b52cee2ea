// PTX wrappers that kernels of more than one stage use (sm_90 and later): shared-memory addresses,
// mbarriers, bulk copies, clusters, wgmma's fences, L2 prefetch. A stage's own wrappers stay in its folder.
// Every wrapper with a side effect is asm volatile with a "memory" clobber, so the compiler keeps it in
// program order relative to shared-memory code. A CUDA source builds with this header as with its folder's
// (kernels/cuda_library.py), and a bundle of it carries it.
#pragma once

#include <cstdint>

namespace ptx {

// The shared-window address of a shared-memory pointer.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier ----------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Arrive (release semantics at CTA scope: this thread's prior writes are visible to the waiter).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(bar) : "memory");
}
// Arrive (as mbar_arrive) and expect `bytes` more of complete_tx before the phase can complete.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Spin until the phase of the given parity has completed (acquire semantics at CTA scope).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// ---- bulk copies (the TMA engine) --------------------------------------------------------------
// `bytes` (a multiple of 16) from 16-byte aligned global memory into this CTA's shared memory at dst,
// completing on this CTA's mbarrier bar.
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// ---- thread-block clusters ---------------------------------------------------------------------
// Every thread of every CTA of the cluster; release/acquire at cluster scope (also a CTA barrier).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// ---- wgmma -------------------------------------------------------------------------------------
// Before the first wgmma of a batch: orders prior register and shared-memory accesses of this
// warpgroup before the asynchronous MMAs read them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// A register the asynchronous MMA writes: the compiler must not move its reads or writes across
// the wgmma issue / wait (the asm statements are volatile, so they stay in order).
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// ---- L2 --------------------------------------------------------------------------------------------
// Asks the L2 for the 128-byte line holding `p`: no register, no completion to wait for, nothing to the SM.
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

}  // namespace ptx
