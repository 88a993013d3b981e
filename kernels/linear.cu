// y[n][j] = x[n] . w[j] + bias[j] for the few rows of a classifier (deploy's KernelLinear;
// kernels/linear.py builds and launches it): fp16 x and w, fp32 sums, fp16 or fp32 y. A
// warp owns one output feature and the grid has a block per 8 of them, so the weights, the
// bytes that matter at a few rows, stream through every SM at once. The warp's lanes load
// the weight row w[j] as 16-byte vectors before the grid-dependency wait (the weights are
// no kernel's output; the pooling kernel before lets this one in early for that,
// kernels/avg_pool.cu), the block copies x into shared memory once, and each lane's partial
// sums meet through shuffles.
//
// Defines (kernels/linear.py; TK_SM: kernels/small_kernel.py): TL_N (rows of x), TL_C (in
// features, a multiple of 8), TL_J (out features), TL_F32 (1: fp32 y, 0: fp16).

typedef unsigned int u32;
typedef unsigned short u16;

constexpr int WARPS = 8;
constexpr int VEC = TL_C / 8;                 // 16-byte vectors of a row
constexpr int PER_LANE = (VEC + 31) / 32;     // a lane's vectors of the weight row

__device__ __forceinline__ float lo_f32(u32 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((u16)(v & 0xFFFFu)));
  return f;
}
__device__ __forceinline__ float hi_f32(u32 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((u16)(v >> 16)));
  return f;
}
__device__ __forceinline__ u16 to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
// acc += the 8 products of one 16-byte vector of x and of w.
__device__ __forceinline__ float dot8(const uint4& a, const float (&b)[8], float acc) {
  const u32 v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(lo_f32(v[i]), b[2 * i], acc);
    acc = fmaf(hi_f32(v[i]), b[2 * i + 1], acc);
  }
  return acc;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    tc_linear(const uint4* __restrict__ x, const uint4* __restrict__ w,
              const float* __restrict__ bias, void* __restrict__ y) {
  __shared__ uint4 xs[TL_N * VEC];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int j = blockIdx.x * WARPS + warp;
  uint4 wv[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int v = lane + 32 * i;
    wv[i] = (j < TL_J && v < VEC) ? __ldg(w + (long long)j * VEC + v) : make_uint4(0, 0, 0, 0);
  }
#if TK_SM >= 90
  // Programmatic dependent launch (kernels/launch.py): x is the kernel before's output.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  for (int i = threadIdx.x; i < TL_N * VEC; i += WARPS * 32) xs[i] = x[i];
  __syncthreads();
  if (j >= TL_J) return;
  float acc[TL_N];
#pragma unroll
  for (int n = 0; n < TL_N; ++n) acc[n] = 0.f;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int v = lane + 32 * i;
    if (v >= VEC) break;
    const u32 q[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
    float wf[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      wf[2 * k] = lo_f32(q[k]);
      wf[2 * k + 1] = hi_f32(q[k]);
    }
#pragma unroll
    for (int n = 0; n < TL_N; ++n) acc[n] = dot8(xs[n * VEC + v], wf, acc[n]);
  }
#pragma unroll
  for (int n = 0; n < TL_N; ++n) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[n] += __shfl_xor_sync(0xFFFFFFFFu, acc[n], o);
  }
  if (lane == 0) {
    const float b = bias[j];
#pragma unroll
    for (int n = 0; n < TL_N; ++n) {
#if TL_F32
      static_cast<float*>(y)[n * TL_J + j] = acc[n] + b;
#else
      static_cast<u16*>(y)[n * TL_J + j] = to_f16(acc[n] + b);
#endif
    }
  }
}
