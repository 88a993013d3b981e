// The register-staged pipeline (no cp.async on sm_75, or a transform on the way into shared
// memory: int4 unpacked to s8, the fp32_tc split with STAGES 1-2). STAGES=1 loads, then
// computes; STAGES=2 holds the next stage's vectors in registers while one is computed.
#pragma once

template <class Tile>
__device__ __forceinline__ void mainloop_regstaged(BlockLoader& ld, Tile& wt,
                                                   const StageRing sr, const int it0,
                                                   const int nit) {
  using namespace cfg;
  if constexpr (STAGES == 1) {
#pragma unroll 1
    for (int i = 0; i < nit; ++i) {
      ld.load_stage_sync(it0 + i, sr.a(0), sr.b(0));
      stage_barrier();
      wt.compute_stage(sr.a(0), sr.b(0), it0 + i);
      __syncthreads();
    }
  } else {
    if (nit > 0) ld.load_stage_sync(it0, sr.a(0), sr.b(0));
    stage_barrier();
#pragma unroll 1
    for (int i = 0; i < nit; ++i) {
      const int st = i & 1;
      const bool more = i + 1 < nit;
      if (more) ld.prefetch_regs(it0 + i + 1);
      wt.compute_stage(sr.a(st), sr.b(st), it0 + i);
      if (more) ld.finish_regs(it0 + i + 1, sr.a(st ^ 1), sr.b(st ^ 1));
      stage_barrier();
    }
  }
}
