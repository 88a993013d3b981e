// Max-pool over NHWC int8 / fp16 tensors (deploy's KernelMaxPool2d; kernels/pool.py builds
// and launches it). A thread owns one 16-byte vector of channels of one output pixel and
// reads its window's taps as 16-byte vectors, so every load and store is whole and
// coalesced (a warp covers neighbouring vectors of a pixel's channels, then the next
// pixels'); the maximum is taken per lane: four int8 or two fp16 values a 32-bit word.
// Taps outside the input are skipped, which is what padding with the lowest value does.
//
// Defines (kernels/pool.py, pool_defines; TK_SM: kernels/small_kernel.py): TP_FP16 (0: int8,
// 1: fp16), TP_N, TP_H, TP_W, TP_V (16-byte vectors a pixel), TP_OH, TP_OW, TP_KH, TP_KW,
// TP_SH, TP_SW, TP_PH, TP_PW, TP_DH, TP_DW.

typedef unsigned int u32;

// The lowest value in every lane: int8 -128, fp16 -inf.
constexpr u32 LOWEST = TP_FP16 ? 0xFC00FC00u : 0x80808080u;

#if TP_FP16
#if TK_SM >= 80
__device__ __forceinline__ u32 lane_max(u32 a, u32 b) {
  u32 r;  // NaN-propagating, as PyTorch's max-pool
  asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
#else
// sm_75 has no f16x2 max: each half compared as a float, NaN kept (a NaN compares false).
__device__ __forceinline__ u32 half_max(u32 a, u32 b) {
  float fa, fb;
  asm("cvt.f32.f16 %0, %1;" : "=f"(fa) : "h"((unsigned short)a));
  asm("cvt.f32.f16 %0, %1;" : "=f"(fb) : "h"((unsigned short)b));
  return (fa >= fb || fa != fa) ? a : b;
}
__device__ __forceinline__ u32 lane_max(u32 a, u32 b) {
  return half_max(a & 0xFFFFu, b & 0xFFFFu) | (half_max(a >> 16, b >> 16) << 16);
}
#endif
#else
__device__ __forceinline__ u32 lane_max(u32 a, u32 b) { return __vmaxs4(a, b); }
#endif

extern "C" __global__ void __launch_bounds__(256)
    tc_max_pool(const uint4* __restrict__ x, uint4* __restrict__ y) {
#if TK_SM >= 90
  // Programmatic dependent launch (kernels/launch.py): wait for the layer before, let the
  // next one's blocks be scheduled (as kernels/conv.cu).
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  constexpr long long TOTAL = (long long)TP_N * TP_OH * TP_OW * TP_V;
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= TOTAL) return;
  const int v = (int)(i % TP_V);
  long long pix = i / TP_V;
  const int ow = (int)(pix % TP_OW);
  pix /= TP_OW;
  const int oh = (int)(pix % TP_OH);
  const long long n = pix / TP_OH;
  u32 m0 = LOWEST, m1 = LOWEST, m2 = LOWEST, m3 = LOWEST;
#pragma unroll
  for (int kh = 0; kh < TP_KH; ++kh) {
    const int ih = oh * TP_SH - TP_PH + kh * TP_DH;
    if (ih < 0 || ih >= TP_H) continue;
#pragma unroll
    for (int kw = 0; kw < TP_KW; ++kw) {
      const int iw = ow * TP_SW - TP_PW + kw * TP_DW;
      if (iw < 0 || iw >= TP_W) continue;
      const uint4 q = __ldg(x + ((n * TP_H + ih) * TP_W + iw) * TP_V + v);
      m0 = lane_max(m0, q.x);
      m1 = lane_max(m1, q.y);
      m2 = lane_max(m2, q.z);
      m3 = lane_max(m3, q.w);
    }
  }
  y[i] = make_uint4(m0, m1, m2, m3);
}
