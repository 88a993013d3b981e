// Tensor Memory Accelerator loads and the mbarriers that pace them (TMA=1, sm_90a).
//
// A stage is two bulk tensor copies per 128-byte swizzle atom: the im2col rows of A (the
// hardware walks BM output pixels from the block's first one, applies the filter tap as an
// offset and zero-fills padding and tails; with PLAIN_A a plain box of BM rows of x; with
// HALO one box of the tile's input patch for all taps) and the weight rows of B. One thread
// issues them;
// the copies complete on the stage's "full" mbarrier with a byte count, and the consumers'
// arrivals on its "empty" mbarrier tell the issuing thread when the slot can be refilled.
// No cp.async, no CTA-wide barrier and no proxy fence per stage: TMA writes and wgmma reads
// shared memory through the same (async) proxy.
//
// The tensor maps arrive as a kernel parameter (kernels/launch.py encodes them on the host
// per input pointer): the activations' im2col map, then the weights' tiled map, then with
// PACK_OUT=2 the output's tiled map, which the epilogue's bulk tensor stores write through.
#pragma once

struct __align__(64) TensorMaps {
  u64 x[16];
  u64 w[16];
#if TC_PACK_OUT == 2
  u64 y[16];  // the output's tiled map: the epilogue's bulk tensor stores (PACK_OUT=2)
#endif
};

// The barrier of the threads that run one tile's math and epilogue: the whole block, or with
// a producer warp (TMA=2) every warp but that one (named barrier 1, which it never reaches);
// with PINGPONG each consumer's own (named barriers 1 and 2).
__device__ __forceinline__ void block_sync() {
  if constexpr (cfg::PP)
    asm volatile("bar.sync %0, %1;\n" :: "r"(1 + (int)threadIdx.x / cfg::THREADS),
                 "n"(cfg::THREADS) : "memory");
  else if constexpr (cfg::WS) asm volatile("bar.sync 1, %0;\n" :: "n"(cfg::THREADS) : "memory");
  else __syncthreads();
}
// Every math thread of the block, both consumers' (named barrier 3).
__device__ __forceinline__ void math_sync() {
  asm volatile("bar.sync 3, %0;\n" :: "n"(cfg::MATH_THREADS) : "memory");
}

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_inval(u32 bar) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" :: "r"(bar) : "memory");
}
// The inits are visible to the other threads (after the next barrier) and to the TMA unit.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
               :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}
// Wait until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  u32 done;
  do {
    asm volatile("{\n .reg .pred p;\n"
                 " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 " selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void tmap_prefetch(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" :: "l"(map) : "memory");
}
// BM im2col rows of `channels` elements from input coordinate (c, w, h, n) with the filter
// tap (off_w, off_h) into a swizzled tile at `dst`.
__device__ __forceinline__ void tma_im2col(u32 dst, const void* map, u32 bar, int c, int w, int h,
                                           int n, unsigned short off_w, unsigned short off_h) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n"
      :: "r"(dst), "l"(map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar), "h"(off_w), "h"(off_h)
      : "memory");
}
// PLAIN_A: BM rows of x seen as the matrix [N*H*W][C] (a 1x1, stride-1, unpadded layer's
// im2col rows), from row m; rows past the end are zero-filled.
__device__ __forceinline__ void tma_tile2(u32 dst, const void* map, u32 bar, int c, int m) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n"
      :: "r"(dst), "l"(map), "r"(c), "r"(m), "r"(bar) : "memory");
}
// HALO: the patch box of x at input coordinate (c, w, h, n), zeros past the image.
__device__ __forceinline__ void tma_tile4(u32 dst, const void* map, u32 bar, int c, int w, int h,
                                          int n) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];\n"
      :: "r"(dst), "l"(map), "r"(c), "r"(w), "r"(h), "r"(n), "r"(bar) : "memory");
}
// A box of weight rows: (c, tap, k) of the KRSC weights seen as [K][R*S][C].
__device__ __forceinline__ void tma_tile3(u32 dst, const void* map, u32 bar, int c, int tap,
                                          int k) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n"
      :: "r"(dst), "l"(map), "r"(c), "r"(tap), "r"(k), "r"(bar) : "memory");
}

// PACK_OUT=2: a box of the staged output tile (shared) -> y at (byte column c, row m). The
// copies of one tile form a bulk group: the issuing thread commits it, and waits for the
// group to have read shared memory before the staging tile is written again.
__device__ __forceinline__ void tma_store2(const void* map, u32 src, int c, int m) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
      :: "l"(map), "r"(c), "r"(m), "r"(src) : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Generic-proxy writes to shared memory, made visible to the async proxy (the TMA unit).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
