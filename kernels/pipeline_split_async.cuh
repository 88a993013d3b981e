// The fp32_tc pipeline with STAGES=3 on sm_80+ (F32_ASYNC): cp.async copies raw fp32 stages
// into a 3-deep staging ring after two hi/lo plane buffers; each thread splits the vectors
// it copied itself into the double-buffered hi/lo planes (two stages of loads in flight).
#pragma once

template <class Tile>
__device__ __forceinline__ void mainloop_split_async(BlockLoader& ld, Tile& wt,
                                                     const StageRing sr, const int it0,
                                                     const int nit) {
  using namespace cfg;
  const u32 sbase = sr.base;
  auto stg = [&](int s) { return sbase + (u32)((2 + s) * (A_STAGE + B_STAGE)); };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nit) ld.stage_async(it0 + s, stg(s));
    cp_async_commit();
  }
#pragma unroll 1
  for (int i = 0; i < nit; ++i) {
    cp_async_wait<STAGES - 2>();  // this thread's copies of stage i have landed
    // Only the copying thread reads a staging vector: no barrier before the split.
    ld.split_stage(it0 + i, stg(i % STAGES), sr.a(i & 1), sr.b(i & 1));
    // Every thread's hi/lo planes of stage i are written, every read of the slot that
    // the next copy reuses (stage i-1's) and of the planes it overwrites is done.
    __syncthreads();
    const int nx = i + STAGES - 1;
    if (nx < nit) ld.stage_async(it0 + nx, stg(nx % STAGES));
    cp_async_commit();
    wt.compute_stage(sr.a(i & 1), sr.b(i & 1), it0 + i);
  }
  cp_async_wait<0>();
}
