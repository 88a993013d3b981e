// Instruction tile: the PTX wrappers the warp and block tiles are made of.
// mma.sync per (precision, sm), ldmatrix, stmatrix, cp.async, and small bit helpers.
// Everything is inline PTX so that NVRTC needs no CUDA headers (compile time matters).
#pragma once

typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char s8;
typedef unsigned char u8;

struct alignas(16) V4 { u32 x, y, z, w; };

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

// ---- ldmatrix: 8x8 b16 matrices, i.e. 8 rows of 16 bytes; lane l gets word (l%4) of row l/4.
// The byte layout is the same for fp16, s8 and s4 fragments, so one loader serves all.
__device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(u32 addr, u32& r0, u32& r1) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x1(u32 addr, u32& r0) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r0) : "r"(addr));
}

// ---- stmatrix (sm_90): the same 8x8 b16 matrices from the mma fragment layout (lane l holds
// word l%4 of row l/4) to shared memory, .trans: row i of what is stored is column i of the
// fragment; lanes 8k..8k+7 give the addresses of matrix k's eight stored rows.
__device__ __forceinline__ void stsm_x4_trans(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
#if TC_SM >= 90
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n"
               :: "r"(addr), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
#endif
}

// ---- cp.async (sm_80+): 16 bytes global -> shared; src_bytes = 0 zero-fills (padding, tails).
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
#if TC_SM >= 80
  int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(n));
#endif
}
// Narrower copies (FOLD_TAPS loads one filter tap of a few channels): 4 or 8 bytes exist only
// as .ca (through L1), which also keeps a tap's neighbours for the next stage.
template <int BYTES>
__device__ __forceinline__ void cp_async_tv(u32 dst, const void* src, bool valid) {
#if TC_SM >= 80
  if constexpr (BYTES == 16) {
    cp_async16(dst, src, valid);
  } else {
    int n = valid ? BYTES : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                 :: "r"(dst), "l"(src), "n"(BYTES), "r"(n));
  }
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if TC_SM >= 80
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if TC_SM >= 80
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
#endif
}

// ---- plain 16-byte global load / shared store (register-staged pipeline).
__device__ __forceinline__ V4 ldg16(const void* p, bool valid) {
  V4 v = {0u, 0u, 0u, 0u};
  if (valid) {
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}
struct U2 { u32 x, y; };
__device__ __forceinline__ U2 ldg8(const void* p, bool valid) {
  U2 v = {0u, 0u};
  if (valid) asm volatile("ld.global.nc.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 ldg4(const void* p, bool valid) {
  u32 v = 0u;
  if (valid) asm volatile("ld.global.nc.u32 %0, [%1];\n" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void sts8(u32 addr, u32 a, u32 b) {
  asm volatile("st.shared.v2.u32 [%0], {%1,%2};\n" :: "r"(addr), "r"(a), "r"(b));
}
__device__ __forceinline__ void unpack_f16x2(u32 v, float& lo, float& hi) {
  asm("{\n .reg .f16 l, h;\n mov.b32 {l, h}, %2;\n cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}"
      : "=f"(lo), "=f"(hi) : "r"(v));
}
__device__ __forceinline__ void sts4(u32 addr, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;\n" :: "r"(addr), "r"(v));
}
__device__ __forceinline__ V4 lds16(u32 addr) {
  V4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void sts16(u32 addr, const V4& v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};\n"
               :: "r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
}

// s4 x8 (one word) -> two words of s8 x4: low nibbles and high nibbles, sign-extended.
// The k order inside a fragment does not matter as long as A and B are permuted alike,
// and both operands go through this same function.
__device__ __forceinline__ u32 sext_nibbles(u32 v) {
  // v holds 0..15 per byte; bit 3 set -> set bits 4..7 of that byte (0x08 * 0x1E = 0xF0,
  // no carry into the next byte).
  return v | ((v & 0x08080808u) * 0x1Eu);
}
__device__ __forceinline__ void unpack_s4_word(u32 w, u32& lo, u32& hi) {
  lo = sext_nibbles(w & 0x0F0F0F0Fu);
  hi = sext_nibbles((w >> 4) & 0x0F0F0F0Fu);
}

// ---- mma.sync: one instruction tile. A: (IM x KB bytes) row, B: (KB bytes x 8) col.
// ACC is float for fp16, int for integer precisions.
#if TC_PREC == 0 || TC_PREC == 3
typedef float acc_t;
#else
typedef int acc_t;
#endif

__device__ __forceinline__ void mma_tile(acc_t* d, const u32* a, const u32* b) {
#if (TC_PREC == 0 || TC_PREC == 3) && TC_SM >= 80
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif TC_PREC == 0 || TC_PREC == 3
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(b[0]));
#elif (TC_PREC == 1 || TC_INT4_S8) && TC_SM >= 80
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif TC_PREC == 1
  asm volatile("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 "
               "{%0,%1}, {%2}, {%3}, {%0,%1};\n"
               : "+r"(d[0]), "+r"(d[1]) : "r"(a[0]), "r"(b[0]));
#elif TC_PREC == 2 && TC_SM >= 80
  asm volatile("mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif TC_PREC == 2
  asm volatile("mma.sync.aligned.m8n8k32.row.col.s32.s4.s4.s32 "
               "{%0,%1}, {%2}, {%3}, {%0,%1};\n"
               : "+r"(d[0]), "+r"(d[1]) : "r"(a[0]), "r"(b[0]));
#else
#error "no mma.sync path for this precision"
#endif
}


// ---- epilogue arithmetic, written in PTX so that nothing is contracted into an FMA: the
// integer reference (kernels/reference.py) reproduces these roundings bit for bit.
__device__ __forceinline__ float f_mul_rn(float a, float b) {
  float d; asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d;
}
__device__ __forceinline__ float f_add_rn(float a, float b) {
  float d; asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b)); return d;
}
__device__ __forceinline__ float s32_to_f32(int a) {
  float d; asm("cvt.rn.f32.s32 %0, %1;" : "=f"(d) : "r"(a)); return d;
}
__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
  u32 d;
#if TC_SM >= 80
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));  // hi -> upper half
#else
  unsigned short l, h;  // cvt.rn.f16x2.f32 needs sm_80
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(l) : "f"(lo));
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(hi));
  d = (u32)l | ((u32)h << 16);
#endif
  return d;
}
// Byte i of the result is byte (sel >> 4i) & 7 of {b:a} (a = bytes 0-3): one PRMT.
__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 sel) {
  u32 d; asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel)); return d;
}
__device__ __forceinline__ u32 shfl_xor(u32 v, int m) {
  u32 d; asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(d) : "r"(v), "r"(m));
  return d;
}
__device__ __forceinline__ u32 shfl_idx(u32 v, int src) {
  u32 d; asm volatile("shfl.sync.idx.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(d) : "r"(v), "r"(src));
  return d;
}
// One fp16 from global memory as a float (the residual epilogue's input).
__device__ __forceinline__ float ldg_f16(const void* p) {
  unsigned short h;
  asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(h) : "l"(p));
  float lo, hi;
  unpack_f16x2((u32)h, lo, hi);
  return lo;
}
__device__ __forceinline__ u32 ldg_u8(const void* p) {
  u32 v;
  asm volatile("ld.global.nc.u8 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ u32 ldcg_u32(const u32* p) {  // L2 only: other blocks' partials
  u32 d; asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(d) : "l"(p)); return d;
}
#if TC_SM >= 90
// Thread-block clusters (SPLIT_CLUSTER): every thread of the cluster's blocks arrives, then
// waits (release / acquire: the shared-memory writes before it are seen by the blocks after
// it; threads that have exited count as arrived); a shared-memory address of this block as
// the same address in block `rank` of the cluster, and a 32-bit load from there.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ u32 cluster_addr(u32 addr, int rank) {
  u32 d; asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"(addr), "r"(rank));
  return d;
}
__device__ __forceinline__ u32 ld_cluster_u32(u32 addr) {
  u32 d; asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(d) : "r"(addr) : "memory");
  return d;
}
#endif
// Programmatic dependent launch (kernels/launch.py, pdl): wait for the kernel before this one
// on the stream to finish (its writes visible), then let the next be scheduled; a no-op for
// launches without the attribute. conv.cu: where it is called.
__device__ __forceinline__ void grid_dependency_wait() {
#if TC_SM >= 90
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

#if TC_PREC == 3
// ---- fp32_tc ------------------------------------------------------------------------------
// d = A*B with a zero accumulator: the hi*hi products of one k-step leave the Tensor Core as
// a fresh fp32 sum, and the caller adds it to its running sum with a round-to-nearest FADD.
// (Chained in the Tensor Core accumulator the running sum is truncated at every k-step;
// emulated in numpy that is 6-30x the error at K = 576..8192, see docs/kernels/fp32_tc.md.)
__device__ __forceinline__ void mma_f16_fresh(float* d, const u32* a, const u32* b) {
  const float z = 0.f;
#if TC_SM >= 80
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(z));
#else
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};\n"
               : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(b[0]), "f"(z));
#endif
}
__device__ __forceinline__ u32 hadd2(u32 a, u32 b) {  // two fp16 sums, round to nearest
  u32 d; asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
  u32 d; asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b)); return d;
}
// 2^e as a float, e in [-126, 127] (callers split larger exponents into several factors).
__device__ __forceinline__ float pow2i(int e) { return __int_as_float((e + 127) << 23); }
// The per-tensor exponent e such that amax * 2^e lies in [2^13, 2^14): hi = fp16(x * 2^e)
// then never overflows (fp16 max 65504 leaves 4x headroom: karatsuba's hi+lo sums reach
// 2^15) and values down to 2^-28 of amax stay normal fp16. amax = 0, inf or NaN: e = 0.
// kernels/reference.py:fp32_tc_exponent is the same function in numpy.
__device__ __forceinline__ int tc_exp_for(float amax) {
  if (!(amax > 0.f) || !(amax <= 3.40282347e38f)) return 0;
  int adj = 0;
  if (amax < 1.17549435e-38f) { amax *= 18446744073709551616.f; adj = 64; }  // fp32 subnormal
  const int e2 = ((__float_as_int(amax) >> 23) & 0xFF) - 126;  // amax = m * 2^e2, m in [.5, 1)
  return 14 - (e2 - adj);
}
// Split two fp32 values (already scaled by 2^e) into hi and 2^11-scaled lo fp16 pairs.
// x - hi is exact in fp32 (hi holds x's leading bits), and so is the product by 2^11.
__device__ __forceinline__ void split_f32x2(float a, float b, u32& hi, u32& lo) {
  hi = pack_f16x2(a, b);
  float ah, bh;
  unpack_f16x2(hi, ah, bh);
  lo = pack_f16x2((a - ah) * 2048.f, (b - bh) * 2048.f);
}
#endif

// ---- wgmma path (sm_90a) synchronisation; the instruction wrappers are in wgmma.cuh.
// (Defined in every build, emitted only where the wgmma path calls them.)
__device__ __forceinline__ void wgmma_fence() {  // accumulators written before -> MMA after
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory");
}
// Shared memory written through the generic proxy (cp.async, st.shared) and read next by
// wgmma (the async proxy): each writing thread fences before the barrier.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void reg_fence(float& r) { asm volatile("" : "+f"(r) :: "memory"); }
__device__ __forceinline__ void reg_fence(int& r) { asm volatile("" : "+r"(r) :: "memory"); }
