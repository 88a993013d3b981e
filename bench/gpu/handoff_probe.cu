// What one kernel boundary costs in a CUDA graph, and what a hand-off by flags would save.
//
// A chain of N kernels of G blocks, each block busy W ns (a spin on the global timer), captured
// in one CUDA graph and replayed; per mode, the time per kernel over W:
//   plain    stream order (each kernel starts after the one before has finished)
//   pdl      programmatic dependent launch, griddepcontrol.wait at the top (what conv.cu does)
//   flags    PDL, no grid wait: each block waits for a counter the kernel before bumps once
//            per finished block (release/acquire), i.e. for all of its blocks
//   tile     PDL, no grid wait: block b waits only for block b of the kernel before
//   none     PDL, no wait at all (no dependency kept: a floor, not a valid schedule)
// SMEM forces blocks per SM the way a conv's shared memory does.
//
//   nvcc -O2 -gencode=arch=compute_90,code=sm_90 -o handoff_probe bench/gpu/handoff_probe.cu
//   ./handoff_probe > handoff_probe.json
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "cuda_check.h"

enum Mode { PLAIN, PDL, FLAGS, TILE, NONE, MODES };
static const char* kNames[] = {"plain", "pdl", "flags", "tile", "none"};

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void link(int mode, unsigned* flags, int layer, unsigned ns, float jitter) {
  extern __shared__ unsigned char smem[];
  const int g = gridDim.x, b = blockIdx.x;
  if (mode == PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (mode != PLAIN) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0 && layer > 0) {
    if (mode == FLAGS)
      while (ld_acquire(&flags[(layer - 1) * 1024]) < (unsigned)g) __nanosleep(32);
    if (mode == TILE)
      while (ld_acquire(&flags[(layer - 1) * 1024 + 1 + b]) == 0) __nanosleep(32);
  }
  __syncthreads();
  // blocks of one kernel finish apart by up to `jitter` of W, as tiles of unequal cost do
  const unsigned h = (b * 2654435761u) >> 16;
  const unsigned long long t_end = now_ns() + ns + (unsigned)(jitter * ns * (h & 1023) / 1024.f);
  while (now_ns() < t_end) {
  }
  smem[threadIdx.x] = (unsigned char)layer;  // keep the shared-memory request
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (mode == FLAGS) atomicAdd(&flags[layer * 1024], 1u);
    if (mode == TILE) atomicExch(&flags[layer * 1024 + 1 + b], 1u);
  }
}

static float run(int mode, int n, int g, unsigned ns, int smem, float jitter, unsigned* flags,
                 cudaStream_t s) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  CK(cudaMemsetAsync(flags, 0, sizeof(unsigned) * 1024 * n, s));
  for (int i = 0; i < n; ++i) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(g);
    cfg.blockDim = dim3(128);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = (mode != PLAIN && i > 0) ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, link, mode, flags, i, ns, jitter));
  }
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(exec, s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const int reps = 20;
  CK(cudaEventRecord(a, s));
  for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(exec, s));
  CK(cudaEventRecord(b, s));
  CK(cudaEventSynchronize(b));
  float ms;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return ms * 1000.f / (reps * n);  // µs per kernel
}

int main() {
  const int n = 50;
  unsigned* flags;
  CK(cudaMalloc(&flags, sizeof(unsigned) * 1024 * n));
  CK(cudaFuncSetAttribute(link, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  const int sms = p.multiProcessorCount;
  printf("{\"gpu\": \"%s\", \"kernels\": %d, \"rows\": [\n", p.name, n);
  bool first = true;
  for (int per_sm : {1, 2}) {
    const int smem = per_sm == 1 ? 120 * 1024 : 80 * 1024;  // blocks resident per SM
    for (int waves : {1, 2})
      for (unsigned ns : {2000u, 5000u})
        for (float jitter : {0.f, 0.3f}) {
          const int g = sms * per_sm * waves;
          if (g + 1 > 1024) continue;
          printf("%s  {\"blocks_per_sm\": %d, \"blocks\": %d, \"work_ns\": %u, \"jitter\": %.1f",
                 first ? "" : ",\n", per_sm, g, ns, jitter);
          first = false;
          for (int m = 0; m < MODES; ++m)
            printf(", \"%s_us\": %.3f", kNames[m], run(m, n, g, ns, smem, jitter, flags, s));
          printf("}");
        }
  }
  printf("\n]}\n");
  CK(cudaDeviceSynchronize());
  return 0;
}
