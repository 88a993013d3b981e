// Global average pool over NHWC int8 / fp16 tensors (deploy's KernelGlobalAvgPool;
// kernels/pool.py builds and launches it): y[n][c] = scale * sum over the pixels of
// x[n, :, :, c], fp16 out as [N, C] (a classifier's rows); scale is the int8 value's scale
// over the pixel count (fp16: one over it). A block owns VB 16-byte vectors of one image's
// channels, few enough that a batch of ResNet-50's 2048 channels fills the GPU with blocks;
// its GROUPS thread groups split the pixels, each thread summing its vector over every
// GROUPS-th pixel (whole, coalesced 16-byte loads: a warp reads 128 adjacent bytes of each of
// 4 pixels), and the groups' partial sums meet in shared memory. int8 sums are exact in int32
// and, below 2^24, in the float32 they meet in (kernels/pool.py limits the pixels).
//
// Defines (kernels/pool.py, avg_pool_defines; TK_SM: kernels/small_kernel.py): TG_FP16 (0:
// int8, 1: fp16), TG_HW (pixels of an image), TG_V (16-byte vectors a pixel).

typedef unsigned int u32;
typedef unsigned short u16;

constexpr int VB = 8;                         // vectors of a pixel a block sums
constexpr int GROUPS = 32;                    // thread groups of a block, each over a share of
                                              // the pixels (VB * GROUPS threads)
constexpr int PART = VB + 1;                  // shared row stride, padded against bank conflicts
constexpr int LANES = TG_FP16 ? 8 : 16;       // channels a vector
constexpr int CHUNKS = (TG_V + VB - 1) / VB;  // blocks an image

__device__ __forceinline__ float half_f32(u32 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((u16)h));
  return f;
}

extern "C" __global__ void __launch_bounds__(VB * GROUPS)
    tc_global_avg_pool(const uint4* __restrict__ x, u16* __restrict__ y, float scale) {
  // [group][channel of the vector][vector], rows padded: a warp's stores and the final
  // reads hit distinct banks but for a few pairs.
  __shared__ float part[GROUPS * LANES * PART];
#if TK_SM >= 90
  // Programmatic dependent launch (kernels/launch.py). The kernel after this one (a
  // classifier's, kernels/linear.cu) prefetches its weights before it waits, so it is let in
  // first: those loads then overlap this kernel and the one before it.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  const int n = blockIdx.x / CHUNKS, chunk = blockIdx.x % CHUNKS;
  const int vl = threadIdx.x % VB, g = threadIdx.x / VB;
  const int v = chunk * VB + vl;
#if TG_FP16
  float acc[LANES];
#else
  int acc[LANES];
#endif
#pragma unroll
  for (int i = 0; i < LANES; ++i) acc[i] = 0;
  if (v < TG_V) {
    const uint4* px = x + (long long)n * TG_HW * TG_V + v;
#pragma unroll 2
    for (int p = g; p < TG_HW; p += GROUPS) {
      const uint4 q = __ldg(px + (long long)p * TG_V);
      const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
#if TG_FP16
        acc[2 * k] += half_f32(w[k] & 0xFFFFu);
        acc[2 * k + 1] += half_f32(w[k] >> 16);
#else
#pragma unroll
        for (int b = 0; b < 4; ++b) acc[4 * k + b] += (int)(signed char)(w[k] >> (8 * b));
#endif
      }
    }
  }
#pragma unroll
  for (int i = 0; i < LANES; ++i) part[(g * LANES + i) * PART + vl] = (float)acc[i];
  __syncthreads();
  // Thread t finishes the block's t-th channel (and every VB * GROUPS-th after it): the
  // channels of vector t / LANES, in order, so the fp16 stores are coalesced.
  for (int t = threadIdx.x; t < VB * LANES; t += VB * GROUPS) {
    const int tv = t / LANES, i = t % LANES;
    if (chunk * VB + tv >= TG_V) break;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < GROUPS; ++k) s += part[(k * LANES + i) * PART + tv];
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(s * scale));
    y[((long long)n * TG_V + chunk * VB) * LANES + t] = h;
  }
}
