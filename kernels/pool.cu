// Max-pool over NHWC int8 / fp16 tensors (deploy's KernelMaxPool2d; kernels/pool.py builds
// and launches it). A thread owns one 16-byte vector of channels of one output pixel and
// reads its window's taps as 16-byte vectors, so every load and store is whole and
// coalesced (a warp covers neighbouring vectors of a pixel's channels, then the next
// pixels'); the maximum is taken per lane: four int8 or two fp16 values a 32-bit word.
// Taps outside the input are skipped, which is what padding with the lowest value does.
// A window's loads are issued together (window_max), so that a thread waits for one memory
// round trip, not one a window row.
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

// The window's maximum of input vector v around output pixel (n, oh, ow). The loads of a group
// of window rows are all issued before its first maximum (one memory round trip a group, not
// one a tap or a row): a tap in the padding loads the nearest input vector and is left out.
constexpr int GROUP_ROWS = TP_KW >= 16 ? 1 : (16 / TP_KW < TP_KH ? 16 / TP_KW : TP_KH);
__device__ __forceinline__ uint4 window_max(const uint4* __restrict__ x, long long n, int oh,
                                            int ow, int v) {
  constexpr int TAPS = GROUP_ROWS * TP_KW;
  u32 m0 = LOWEST, m1 = LOWEST, m2 = LOWEST, m3 = LOWEST;
#pragma unroll
  for (int g = 0; g < TP_KH; g += GROUP_ROWS) {
    uint4 q[TAPS];
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
      const int ih = oh * TP_SH - TP_PH + (g + t / TP_KW) * TP_DH;
      const int iw = ow * TP_SW - TP_PW + (t % TP_KW) * TP_DW;
      const int hc = min(max(ih, 0), TP_H - 1), wc = min(max(iw, 0), TP_W - 1);
      if (g + t / TP_KW < TP_KH)
        q[t] = __ldg(x + ((n * TP_H + hc) * TP_W + wc) * TP_V + v);
    }
#pragma unroll
    for (int t = 0; t < TAPS; ++t) {
      const int ih = oh * TP_SH - TP_PH + (g + t / TP_KW) * TP_DH;
      const int iw = ow * TP_SW - TP_PW + (t % TP_KW) * TP_DW;
      if (g + t / TP_KW >= TP_KH || ih < 0 || ih >= TP_H || iw < 0 || iw >= TP_W) continue;
      m0 = lane_max(m0, q[t].x);
      m1 = lane_max(m1, q[t].y);
      m2 = lane_max(m2, q[t].z);
      m3 = lane_max(m3, q[t].w);
    }
  }
  return make_uint4(m0, m1, m2, m3);
}

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
  y[i] = window_max(x, pix / TP_OH, oh, ow, v);
}
