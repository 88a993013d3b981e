// The cp.async multistage pipeline (sm_80+): STAGES-1 stages in flight while one is
// computed; with wgmma, a stage's MMAs are issued before the thread's loads of a later stage.
#pragma once

// The first STAGES-1 stages' loads (a persistent block issues the next tile's before the
// current tile's epilogue). A template, like every entry point: only the pipeline a build
// uses is instantiated. W_EARLY (ld.w_early): their weights first, then the wait for the
// kernel before (pipeline.cuh), then their activations; the weights join the first stage's
// copy group.
template <class Loader>
__device__ __forceinline__ void multistage_prologue(Loader& ld, const StageRing sr,
                                                    const int it0, const int nit) {
  using namespace cfg;
  if constexpr (W_EARLY && !TMA) {  // (a TMA build instantiates this unused: conv_persistent)
    if (ld.w_early) {
#pragma unroll
      for (int s = 0; s < STAGES - 1; ++s)
        if (s < nit) ld.template load_stage<PART_B>(it0 + s, sr.a(s), sr.b(s));
      grid_dependency_wait();
#pragma unroll
      for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nit) ld.template load_stage<PART_A>(it0 + s, sr.a(s), sr.b(s));
        cp_async_commit();
      }
      return;
    }
  }
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nit) ld.load_stage(it0 + s, sr.a(s), sr.b(s));
    cp_async_commit();
  }
}

// The stages after the prologue, computed in order; every copy has landed on return.
template <class Tile>
__device__ __forceinline__ void multistage_body(BlockLoader& ld, Tile& wt, const StageRing sr,
                                                const int it0, const int nit) {
  using namespace cfg;
#pragma unroll 1
  for (int i = 0; i < nit; ++i) {
    const int st = i % STAGES;
    if constexpr (STAGES == 1) {
      ld.load_stage(it0 + i, sr.a(0), sr.b(0));
      cp_async_commit();
      cp_async_wait<0>();
      stage_barrier();
    } else {
      cp_async_wait<STAGES - 2>();
      stage_barrier();
      // wgmma runs asynchronously: start it before this thread's loads of a later stage
      // (into the buffer every warpgroup finished reading before the barrier).
      if constexpr (WG) wt.issue(sr.a(st), sr.b(st));
      const int nx = i + STAGES - 1;
      if (nx < nit) ld.load_stage(it0 + nx, sr.a(nx % STAGES), sr.b(nx % STAGES));
      cp_async_commit();
    }
    if constexpr (WG && STAGES > 1) wt.retire();
    else wt.compute_stage(sr.a(st), sr.b(st), it0 + i);
    if constexpr (STAGES == 1) __syncthreads();
  }
  cp_async_wait<0>();
}

template <class Tile>
__device__ __forceinline__ void mainloop_multistage(BlockLoader& ld, Tile& wt,
                                                    const StageRing sr, const int it0,
                                                    const int nit) {
  multistage_prologue(ld, sr, it0, nit);
  multistage_body(ld, wt, sr, it0, nit);
}
