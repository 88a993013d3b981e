// What every main loop shares: the ring of shared-memory stages and the barrier before the
// math on a stage. Each pipeline has its own header with one entry point, which conv.cu's
// block function calls:
//   pipeline_tma.cuh          mainloop_tma: TMA copies paced by mbarriers (wgmma, sm_90a)
//   pipeline_split_async.cuh  mainloop_split_async: fp32_tc, cp.async into an fp32 staging
//                             ring, split into hi/lo planes by the copying thread (sm_80+)
//   pipeline_multistage.cuh   mainloop_multistage: cp.async, STAGES-1 stages in flight (sm_80+)
//   pipeline_regstaged.cuh    mainloop_regstaged: loads staged through registers (sm_75, or a
//                             transform on the way into shared memory), double-buffered at most
#pragma once

// W_EARLY: with PDL and the weights ready (conv.cu: READY_W), the prologue issues the first
// stages' weight copies, then waits for the kernel before (grid_dependency_wait), then issues
// their activation copies: the weights land while that kernel finishes (a persistent block:
// its first tile's). Without a second input, or split-K through global memory (a cluster's
// splits touch none), on the TMA pipelines or the cp.async one with incremental addressing
// or folded taps and two stages or more; sm_90 (PDL).
namespace cfg {
constexpr bool W_EARLY = SM >= 90 && (SPLITK == 1 || SPLIT_CLUSTER) && !CAT &&
                         (TMA ? true : (!REGPATH && !F32TC && (INCR || FOLD) && STAGES >= 2));
}  // namespace cfg

// Stage st holds its A tile, then its B tile.
struct StageRing {
  u32 base;
  __device__ __forceinline__ u32 a(int st) const {
    return base + (u32)(st * (cfg::A_STAGE + cfg::B_STAGE));
  }
  __device__ __forceinline__ u32 b(int st) const {
    return base + (u32)(st * (cfg::A_STAGE + cfg::B_STAGE) + cfg::A_STAGE);
  }
};

// The barrier before the math on a stage: with wgmma, the Tensor Cores read shared memory
// through the async proxy, so every thread's own writes (cp.async, st.shared) are fenced first.
__device__ __forceinline__ void stage_barrier() {
#if TC_MMA
  fence_proxy_async();
#endif
  __syncthreads();
}
