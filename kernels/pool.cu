// Max-pool over NHWC int8 / fp16 tensors (deploy's KernelMaxPool2d; kernels/pool.py builds
// and launches it). A thread owns one 16-byte vector of channels of one output pixel and
// reads its window's taps as 16-byte vectors, so every load and store is whole and
// coalesced (a warp covers neighbouring vectors of a pixel's channels, then the next
// pixels'); the maximum is taken per lane: four int8 or two fp16 values a 32-bit word.
// Taps outside the input are skipped, which is what padding with the lowest value does.
//
// Band mode (TP_BANDS, after a conv whose blocks signal the bands they wrote: epilogue.cuh's
// signal_bands): a block owns one output row and waits for its band's counter (the pixels
// times channels of the input rows under its window) instead of for the whole layer before,
// then sets it back to zero for the next forward; a thread a vector of the row (kernels/pool.py
// sizes the block, up to 512 threads that then take the rest in turn).
// The input is read by plain loads after the acquire (not the read-only path: other blocks wrote
// it while this kernel ran).
//
// Defines (kernels/pool.py, pool_defines; TK_SM: kernels/small_kernel.py): TP_FP16 (0: int8,
// 1: fp16), TP_N, TP_H, TP_W, TP_V (16-byte vectors a pixel), TP_OH, TP_OW, TP_KH, TP_KW,
// TP_SH, TP_SW, TP_PH, TP_PW, TP_DH, TP_DW, TP_BANDS.

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

// One input vector: read-only for the whole kernel (through the non-coherent path), or (band
// mode) written by other blocks before this one's acquire, read as a plain load.
template <bool BANDS>
__device__ __forceinline__ uint4 load_vector(const uint4* a) {
  if constexpr (BANDS) {
    uint4 q;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(q.x), "=r"(q.y), "=r"(q.z), "=r"(q.w) : "l"(a));
    return q;
  } else {
    return __ldg(a);
  }
}

// The window's maximum of input vector v around output pixel (n, oh, ow). The loads of a group
// of window rows are all issued before its first maximum (one memory round trip a group, not
// one a tap or a row): a tap in the padding loads the nearest input vector and is left out.
constexpr int GROUP_ROWS = TP_KW >= 16 ? 1 : (16 / TP_KW < TP_KH ? 16 / TP_KW : TP_KH);
template <bool BANDS>
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
      if (g + t / TP_KW < TP_KH) q[t] = load_vector<BANDS>(x + ((n * TP_H + hc) * TP_W + wc) * TP_V + v);
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

#if TP_BANDS
extern "C" __global__ void __launch_bounds__(512, 1)
    tc_max_pool(const uint4* __restrict__ x, uint4* __restrict__ y, u32* __restrict__ bands) {
  const int row = blockIdx.x, n = row / TP_OH, oh = row % TP_OH;
  if (threadIdx.x == 0) {
    int rows = 0;  // input rows under the window
#pragma unroll
    for (int kh = 0; kh < TP_KH; ++kh) {
      const int ih = oh * TP_SH - TP_PH + kh * TP_DH;
      rows += ih >= 0 && ih < TP_H;
    }
    const u32 want = (u32)rows * TP_W * TP_V * (TP_FP16 ? 8 : 16);
    u32 have;
    for (;;) {  // relaxed polls: an acquire each time would invalidate the SM's L1 each time
      asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(have) : "l"(bands + row) : "memory");
      if (have >= want) break;
      __nanosleep(128);
    }
    asm volatile("fence.acq_rel.gpu;" ::: "memory");  // then the conv's stores are visible
    bands[row] = 0;  // the next forward's conv signals after this kernel has finished
  }
  __syncthreads();
#if TK_SM >= 90
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  for (int i = threadIdx.x; i < TP_OW * TP_V; i += blockDim.x)
    y[(long long)row * TP_OW * TP_V + i] = window_max<true>(x, n, oh, i / TP_V, i % TP_V);
}
#else
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
  y[i] = window_max<false>(x, pix / TP_OH, oh, ow, v);
}
#endif
