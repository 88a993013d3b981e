// What the 7x7 stride-2 stem's folded-tap loads cost, alone, against loading the block
// tile's input patch once and gathering the taps from shared memory.
//
// ResNet-50's stem at batch 8: x NHWC int8 with C padded to 4 (one 4-byte word per pixel),
// 224x224, pad 3, stride 2 -> 112x112 output pixels; a block tile of 256 output pixels (one
// per thread, 49 per image: no tile crosses an image) and its 49 taps, as the tuned stem's
// FOLD_TAPS=1 schedule reads them (wgmma, block_m 256, 7 stages of 8 taps). No MMA, no
// epilogue: each thread sums its row's words into one output word, which the variants must
// agree on. Per variant, a CUDA graph of kChain launches, replayed; time per launch:
//   taps     the folded loads: a 4-byte cp.async per (row, tap), zero-filled outside the
//            image, 7 groups of 8 taps, into a [256][56] word tile (what FOLD_TAPS does)
//   patch    the tile's input rows (at most 13 of 224 + 2 x 4 pad pixels) copied once with
//            16-byte cp.async, then each row's taps read from the patch and written into the
//            same [256][57] tile (an A operand in shared memory, as wgmma reads it)
//   patch_r  the patch, each row's taps read into registers only (an A operand in registers)
//   empty    the grid alone
//   store    each row's 64 output bytes written (16-byte stores), nothing loaded: the
//            epilogue's writes alone
//   taps_store  taps, then its rows' 64 output bytes written
//   store_coalesced  the tile's 16 KB of output written by consecutive threads in consecutive
//            16-byte vectors (as a staged epilogue writes it), nothing loaded
// Every variant asks for the same dynamic shared memory (80 KB: the stem record's two blocks
// per SM), and runs twice: a block per tile (392 blocks, 1.48 waves), then a persistent grid
// of two blocks an SM, each looping over tiles.
//
//   nvcc -O3 -gencode=arch=compute_90,code=sm_90 -o stem_loader_probe bench/gpu/stem_loader_probe.cu
//   ./stem_loader_probe > stem_loader_probe.json
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

constexpr int kN = 8, kH = 224, kW = 224, kP = 112, kQ = 112, kPad = 3, kR = 7, kS = 7;
constexpr int kTaps = kR * kS, kTapSlots = 56, kBM = 256;
constexpr int kRowStride = kTapSlots + 1;  // words a tile row: odd, so rows fall in other banks
constexpr int kPatchPad = 4;                   // pixels left and right: 16-byte aligned rows
constexpr int kPatchW = kW + 2 * kPatchPad;    // 232 words a patch row
constexpr int kPatchRows = 13;                 // (4 output rows - 1) x 2 + 7
constexpr int kSmem = 80 * 1024;
constexpr int kChain = 50;
static_assert(kBM * kRowStride % 4 == 0 && kPatchW % 4 == 0, "16-byte patch rows");
static_assert(kBM * kRowStride * 4 + kPatchRows * kPatchW * 4 <= kSmem, "the tiles fit");
enum Variant { TAPS, PATCH, PATCH_R, EMPTY, STORE, TAPS_STORE, STORE_C, VARIANTS };
static const char* kNames[] = {"taps", "patch", "patch_r", "empty", "store", "taps_store",
                                "store_coalesced"};

__device__ __forceinline__ void cp_async4(uint32_t* dst, const uint32_t* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(d), "l"(src),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src));
}

__device__ __forceinline__ void tile_loads(int variant, int tile_m, const uint32_t* __restrict__ x,
                                           uint32_t* __restrict__ out, uint4* __restrict__ y,
                                           uint32_t* smem) {
  const int m0 = tile_m * kBM, m = m0 + threadIdx.x;  // the thread's output pixel (GEMM row)
  if (variant == STORE) {
#pragma unroll
    for (int i = 0; i < 4; ++i) y[m * 4 + i] = make_uint4(m, i, 0, 0);
    return;
  }
  if (variant == STORE_C) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      y[m0 * 4 + i * kBM + threadIdx.x] = make_uint4(m, i, 0, 0);
    return;
  }
  uint32_t* tile = smem;                        // [kBM][kRowStride]
  uint32_t* patch = smem + kBM * kRowStride;  // [kPatchRows][kPatchW], 16-byte aligned
  const int img = m0 / (kP * kQ), pix = m - img * kP * kQ, oh = pix / kQ, ow = pix % kQ;
  const uint32_t* xi = x + static_cast<size_t>(img) * kH * kW;
  uint32_t sum = 0;
  if (variant == TAPS || variant == TAPS_STORE) {
    for (int g = 0; g < kTapSlots / 8; ++g) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int t = g * 8 + j, r = t / kS, s = t % kS;
        const int ih = oh * 2 - kPad + r, iw = ow * 2 - kPad + s;
        const bool ok = t < kTaps && ih >= 0 && ih < kH && iw >= 0 && iw < kW;
        cp_async4(&tile[threadIdx.x * kRowStride + t], ok ? xi + ih * kW + iw : xi, ok);
      }
      asm volatile("cp.async.commit_group;");
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncwarp();
    for (int t = 0; t < kTaps; ++t) sum += tile[threadIdx.x * kRowStride + t];
  } else {
    const int oh0 = (m0 - img * kP * kQ) / kQ, ih0 = oh0 * 2 - kPad;
    // Copy the patch: whole 16-byte vectors of x's rows; rows outside the image and the
    // pad columns zeroed.
    constexpr int kVecs = kW / 4;  // 56 a row
    for (int v = threadIdx.x; v < kPatchRows * kVecs; v += kBM) {
      const int pr = v / kVecs, c = v % kVecs, ih = ih0 + pr;
      uint32_t* dst = patch + pr * kPatchW + kPatchPad + c * 4;
      if (ih >= 0 && ih < kH)
        cp_async16(dst, xi + ih * kW + c * 4);
      else
        *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
    for (int v = threadIdx.x; v < kPatchRows * 2; v += kBM)
      *reinterpret_cast<uint4*>(patch + (v / 2) * kPatchW + (v % 2) * (kPatchW - kPatchPad)) =
          make_uint4(0, 0, 0, 0);
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncthreads();
    const uint32_t* base = patch + (oh * 2 - kPad - ih0) * kPatchW + ow * 2 - kPad + kPatchPad;
    if (variant == PATCH) {
#pragma unroll
      for (int t = 0; t < kTaps; ++t)
        tile[threadIdx.x * kRowStride + t] = base[(t / kS) * kPatchW + t % kS];
      __syncwarp();
      for (int t = 0; t < kTaps; ++t) sum += tile[threadIdx.x * kRowStride + t];
    } else {
#pragma unroll
      for (int t = 0; t < kTaps; ++t) sum += base[(t / kS) * kPatchW + t % kS];
    }
  }
  out[m] = sum;
  if (variant == TAPS_STORE) {
#pragma unroll
    for (int i = 0; i < 4; ++i) y[m * 4 + i] = make_uint4(sum, i, 0, 0);
  }
}

// One tile a block, or (a grid of fewer blocks) tiles blockIdx.x, + gridDim.x, ...: a
// persistent grid of one wave.
__global__ void __launch_bounds__(kBM) stem_loads(int variant, int tiles,
                                                  const uint32_t* __restrict__ x,
                                                  uint32_t* __restrict__ out, uint4* __restrict__ y) {
  extern __shared__ __align__(128) uint32_t smem[];
  if (variant == EMPTY) return;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
    tile_loads(variant, t, x, out, y, smem);
    __syncthreads();  // the next tile's patch overwrites this one's
  }
}

int main() {
  const size_t in_words = static_cast<size_t>(kN) * kH * kW, m_rows = kN * kP * kQ;
  std::vector<uint32_t> hx(in_words);
  uint32_t seed = 12345;
  for (auto& w : hx) w = (seed = seed * 1664525u + 1013904223u);
  uint32_t *x, *out;
  uint4* y;  // the output: 64 int8 channels a pixel
  CK(cudaMalloc(&y, m_rows * 64));
  CK(cudaMalloc(&x, in_words * 4));
  CK(cudaMalloc(&out, m_rows * 4));
  CK(cudaMemcpy(x, hx.data(), in_words * 4, cudaMemcpyHostToDevice));
  CK(cudaFuncSetAttribute(stem_loads, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int grid = static_cast<int>(m_rows / kBM);
  // The reference: every row's 49 words summed on the host.
  std::vector<uint32_t> want(m_rows), got(m_rows);
  for (size_t m = 0; m < m_rows; ++m) {
    const int img = m / (kP * kQ), pix = m % (kP * kQ), oh = pix / kQ, ow = pix % kQ;
    uint32_t s = 0;
    for (int t = 0; t < kTaps; ++t) {
      const int ih = oh * 2 - kPad + t / kS, iw = ow * 2 - kPad + t % kS;
      if (ih >= 0 && ih < kH && iw >= 0 && iw < kW) s += hx[(static_cast<size_t>(img) * kH + ih) * kW + iw];
    }
    want[m] = s;
  }
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  printf("{\"gpu\": ");
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("\"%s\", \"tiles\": %d, \"threads\": %d, \"smem\": %d, \"chain\": %d, \"rows\": [", prop.name,
         grid, kBM, kSmem, kChain);
  // Every tile its own block (392: 1.48 waves of two blocks an SM), then a persistent grid of
  // one wave (two blocks an SM, each looping over tiles).
  bool first = true;
  for (int blocks : {grid, std::min(grid, 2 * prop.multiProcessorCount)}) {
    for (int v = 0; v < VARIANTS; ++v) {
      CK(cudaMemset(out, 0, m_rows * 4));
      stem_loads<<<blocks, kBM, kSmem, st>>>(v, grid, x, out, y);
      CK(cudaStreamSynchronize(st));
      CK(cudaMemcpy(got.data(), out, m_rows * 4, cudaMemcpyDeviceToHost));
      size_t wrong = 0;
      for (size_t m = 0; m < m_rows; ++m) wrong += got[m] != want[m];
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
      for (int i = 0; i < kChain; ++i) stem_loads<<<blocks, kBM, kSmem, st>>>(v, grid, x, out, y);
      CK(cudaStreamEndCapture(st, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(ge, st));
      std::vector<float> per;
      for (int rep = 0; rep < 20; ++rep) {
        CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        per.push_back(ms * 1000.f / kChain);
      }
      std::sort(per.begin(), per.end());
      printf("%s{\"variant\": \"%s\", \"blocks\": %d, \"us\": %.3f, \"wrong_rows\": %zu}",
             first ? "" : ", ", kNames[v], blocks, per[per.size() / 2],
             v == EMPTY || v == STORE || v == STORE_C ? 0 : wrong);
      first = false;
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
  }
  printf("]}\n");
  return 0;
}
