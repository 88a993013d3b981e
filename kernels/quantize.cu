// A model's input into the first fused layer's domain (deploy's Quantize; kernels/quantize.py
// builds and launches it): float32 or fp16 values of any layout in, NHWC out with the
// layer's channel count (a stem's 3 padded with zeros to the 4 its loads read), int8 as
// clamp(round-half-even(x / scale), -128, 127) in float32, as calibrate.quantize, or fp16
// as the cast. A thread owns one output pixel: its reads are the few channels of a pixel
// (strided in NCHW, adjacent in NHWC), all issued before the first conversion (one memory
// round trip), its write one 4-, 8- or 16-byte word. Each output row may have zero pixels
// before and after the input's (a stem over pixel pairs, kernels.spec.pixel_pairs, reads the
// rows so padded as pairs).
//
// Defines (kernels/quantize.py; TK_SM: kernels/small_kernel.py): TQ_IN_FP16, TQ_OUT_FP16,
// TQ_PIXELS (n * h * output row), TQ_H, TQ_W (input row), TQ_PADL, TQ_WO (zero pixels
// before a row, output row), TQ_C (input channels), TQ_CP (output channels: a pixel of 4,
// 8 or 16 bytes).

typedef unsigned int u32;
typedef unsigned short u16;

constexpr int WORDS = TQ_CP * (TQ_OUT_FP16 ? 2 : 1) / 4;  // 32-bit words a pixel
static_assert((WORDS == 1 || WORDS == 2 || WORDS == 4) && TQ_C <= TQ_CP, "a pixel is a word");

__device__ __forceinline__ float load(const void* x, long long i) {
#if TQ_IN_FP16
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(__ldg(static_cast<const u16*>(x) + i)));
  return f;
#else
  return __ldg(static_cast<const float*>(x) + i);
#endif
}

__device__ __forceinline__ void store(void* y, long long p, const u32 (&w)[4]) {
  if constexpr (WORDS == 4) {
    static_cast<uint4*>(y)[p] = make_uint4(w[0], w[1], w[2], w[3]);
  } else if constexpr (WORDS == 2) {
    static_cast<uint2*>(y)[p] = make_uint2(w[0], w[1]);
  } else {
    static_cast<u32*>(y)[p] = w[0];
  }
}

extern "C" __global__ void __launch_bounds__(256)
    tc_quantize(const void* __restrict__ x, long long sn, long long sc, long long sh,
                long long sw, void* __restrict__ y, float scale) {
#if TK_SM >= 90
  // Programmatic dependent launch (kernels/launch.py): y's memory may be what the kernel
  // before still reads, so nothing is touched before it has finished.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= TQ_PIXELS) return;
  const long long n = p / (TQ_H * TQ_WO);
  const int hw = (int)(p % (TQ_H * TQ_WO)), h = hw / TQ_WO, w = hw % TQ_WO - TQ_PADL;
  const long long base = n * sn + h * sh + w * sw;
  u32 word[4] = {0, 0, 0, 0};
  if (TQ_WO == TQ_W || (unsigned)w < (unsigned)TQ_W) {  // else a padding pixel: zeros
    float v[TQ_C];  // every channel's load issued before the first conversion waits on one
#pragma unroll
    for (int c = 0; c < TQ_C; ++c) v[c] = load(x, base + c * sc);
#pragma unroll
    for (int c = 0; c < TQ_C; ++c) {
#if TQ_OUT_FP16
      u16 b;
      asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(v[c]));
      word[c / 2] |= (u32)b << (16 * (c % 2));
#else
      const float q = fminf(fmaxf(rintf(__fdiv_rn(v[c], scale)), -128.f), 127.f);
      word[c / 4] |= ((u32)(int)q & 0xFFu) << (8 * (c % 4));
#endif
    }
  }
  store(y, p, word);
}
