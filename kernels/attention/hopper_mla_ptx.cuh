// PTX wrappers of the Hopper (sm_90a) primitives hopper_mla.cu uses (mma_mla.cu uses its mbarrier ones):
// wgmma, mbarrier, cp.async, clusters and distributed shared memory, proxy fences, named barriers,
// register reallocation; those the top-k kernels use too come from kernels/ptx.cuh.
// Every wrapper is asm volatile with a "memory" clobber so the compiler keeps them in program
// order relative to shared-memory code.
// Only the sm_90a pass of hopper_mla.cu includes the bodies that use them (see HOPPER_MLA_BODY).
#pragma once

#include <cstdint>

#include "../ptx.cuh"

namespace hopper_mla {

using ptx::cluster_sync;
using ptx::fence_operand;
using ptx::mbar_arrive;
using ptx::mbar_arrive_expect_tx;
using ptx::mbar_init;
using ptx::mbar_wait;
using ptx::prefetch_l2;
using ptx::smem_addr;
using ptx::wgmma_commit;
using ptx::wgmma_fence;

// ---- shared-memory matrix descriptors (PTX ISA, "Matrix Descriptor Format" of wgmma) ----------
// bits 0-13: start address >> 4; 16-29: leading-dimension byte offset >> 4; 32-45: stride-dimension
// byte offset >> 4; 49-51: base offset (0: every swizzle atom starts 1024-byte aligned);
// 62-63: swizzle mode (1 = 128-byte swizzle).
constexpr uint64_t kSwizzle128B = 1;
constexpr uint32_t kDescAddressMask = 0x3FFFF;  // 14 bits of (address >> 4): the 256 KB shared window

__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  return static_cast<uint64_t>((smem_addr & kDescAddressMask) >> 4) |
         (static_cast<uint64_t>(leading_bytes >> 4) << 16) | (static_cast<uint64_t>(stride_bytes >> 4) << 32) |
         (kSwizzle128B << 62);
}

// The descriptor of the operand `byte_offset` bytes further on: the start-address field is the low
// 14 bits and every operand ends inside the 256 KB window, so the add never carries out of it.
// Built once from a base descriptor, it costs one add per wgmma instead of make_desc's masks and
// shifts on a runtime address.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t byte_offset) {
  return desc + (byte_offset >> 4);
}

// ---- wgmma ----------------------------------------------------------------------------------
// Wait until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The MMA shapes the kernel issues. The instruction text of the fp16 and bf16 forms differs
// only in the operand type (a string literal, TYPE), so one macro per shape writes both. The
// accumulator operands (%0 .. %31 or %127 in the text, d[0 ..] bound to them) are written once.
#define HOPPER_MLA_D32_TEXT \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define HOPPER_MLA_D128_TEXT \
  HOPPER_MLA_D32_TEXT ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define HOPPER_MLA_D32_OPERANDS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define HOPPER_MLA_D128_OPERANDS \
  HOPPER_MLA_D32_OPERANDS, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
  "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
  "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
  "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
  "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
  "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
  "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
  "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
  "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

#define HOPPER_MLA_WGMMA_M64N256K16_KMN(TYPE) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {" HOPPER_MLA_D128_TEXT \
               "}, %128, %129, p, 1, 1, 0, 1;\n}\n" \
               : HOPPER_MLA_D128_OPERANDS \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))

#define HOPPER_MLA_WGMMA_M64N64K16_KK(TYPE) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " {" HOPPER_MLA_D32_TEXT \
               "}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
               : HOPPER_MLA_D32_OPERANDS \
               : "l"(desc_a), "l"(desc_b), "r"(scale_d))

#define HOPPER_MLA_WGMMA_M64N256K16_RS(TYPE) \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " {" HOPPER_MLA_D128_TEXT \
               "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n" \
               : HOPPER_MLA_D128_OPERANDS \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1))

// D[64x256] (+)= A[64x16] . B[16x256] with fp32 accumulators, A and B from shared memory by descriptor,
// B MN-major (transpose bit set); operands fp16 (kF16) or bf16. scale_d = 0 overwrites D.
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n256k16_kmn(float (&d)[128], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (kF16) {
    HOPPER_MLA_WGMMA_M64N256K16_KMN("f16");
  } else {
    HOPPER_MLA_WGMMA_M64N256K16_KMN("bf16");
  }
}

// D[64x64] (+)= A[64x16] . B[16x64], both from shared memory, B K-major (the softmax warpgroup's S).
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n64k16_kk(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  if constexpr (kF16) {
    HOPPER_MLA_WGMMA_M64N64K16_KK("f16");
  } else {
    HOPPER_MLA_WGMMA_M64N64K16_KK("bf16");
  }
}

// D[64x256] += A[64x16] . B[16x256] with A from registers (the fragment layout in hopper_mla.cu's
// consumers) and B from shared memory, MN-major (transpose bit set).
template <bool kF16>
__device__ __forceinline__ void wgmma_m64n256k16_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kF16) {
    HOPPER_MLA_WGMMA_M64N256K16_RS("f16");
  } else {
    HOPPER_MLA_WGMMA_M64N256K16_RS("bf16");
  }
}

#undef HOPPER_MLA_WGMMA_M64N64K16_KK
#undef HOPPER_MLA_WGMMA_M64N256K16_RS
#undef HOPPER_MLA_WGMMA_M64N256K16_KMN
#undef HOPPER_MLA_D128_OPERANDS
#undef HOPPER_MLA_D32_OPERANDS
#undef HOPPER_MLA_D128_TEXT
#undef HOPPER_MLA_D32_TEXT

// ---- thread-block clusters (distributed shared memory) ---------------------------------------------
// A shared::cta address is also a valid shared::cluster address of this CTA's own memory; mapa
// gives the same offset in a peer CTA's memory (the cluster window is linear per CTA).
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  return rank;
}
__device__ __forceinline__ uint32_t mapa_shared(uint32_t addr, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}
// Loads from the shared memory of this CTA or a peer, by shared::cluster address (mapa_shared).
__device__ __forceinline__ float ld_cluster_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ float4 ld_cluster_v4_f32(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
// Makes this thread's mbarrier.init visible to the cluster's other CTAs (before cluster_sync).
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Arrive on an mbarrier of this CTA or a peer (shared::cluster address), release at CTA scope as
// mbar_arrive: used only to release a stage the peer's producer overwrites next, after this thread's
// reads of it have completed (wgmma waited on, shared loads returned). A .release.cluster arrival
// would cost a MEMBAR.ALL.GPU that waits for every memory operation in flight (ncu).
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(cluster_bar) : "memory");
}
// Bulk copy (the TMA engine) of `bytes` (a multiple of 16, 16-byte aligned) from this CTA's shared
// memory to a peer's, completing the bytes on the peer's mbarrier (complete_tx): the peer's waiter
// sees the data once that barrier's phase completes. The source is read through the async proxy.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t cluster_dst, uint32_t src, uint32_t bytes,
                                                  uint32_t cluster_bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   cluster_dst),
               "r"(src), "r"(bytes), "r"(cluster_bar)
               : "memory");
}
// TMA: the box at (x, y, z) of a 3D tensor map (a __grid_constant__ parameter's address) into this CTA's
// shared memory at dst, completing its bytes on this CTA's mbarrier bar.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* tensor_map, int x, int y, int z, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst), "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
}


// ---- copies and fences ----------------------------------------------------------------------------
// 16-byte global -> shared copy that bypasses L1 (the gathered rows are used once per CTA);
// src_bytes = 0 writes 16 zero bytes and reads nothing (a masked row is never dereferenced).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// One arrival on the barrier once this thread's cp.async copies issued so far have landed, without the
// thread waiting for them; the barrier's count includes it (.noinc). (Without .noinc, which raises the
// count by one at issue, synccheck reported missing waits and racecheck a race on the later hand-offs.)
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Shared memory written through the generic proxy (st.shared, cp.async) that wgmma (the async
// proxy) reads next: a writing thread that waited for its writes fences before the barrier that
// publishes them; writes a barrier completes for the writer (cp_async_mbar_arrive) are fenced by
// each reader after its wait.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void st_shared_v4(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ void st_shared_v2_f32(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ float4 ld_shared_v4_f32(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_b32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ float ld_shared_f32(uint32_t addr) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
// 16-byte read-only global load that does not allocate in L1 (streamed once).
__device__ __forceinline__ uint4 ld_global_nc_v4(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Barrier among the threads of some warps only (id 0 is __syncthreads'). Not .aligned (bar.sync is
// barrier.sync.aligned): the two sides of a hand-off between warpgroups are different instructions,
// and .aligned requires every participating thread to execute the same one (synccheck reports it).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrive at a named barrier without waiting (the other side syncs): a one-way signal.
__device__ __forceinline__ void named_barrier_arrive(uint32_t id, uint32_t threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- register reallocation between warpgroups ----------------------------------------------------
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace hopper_mla
