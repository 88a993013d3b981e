// The TMA pipeline (TMA=1 and 2, wgmma, sm_90a): one thread issues each stage's bulk tensor
// copies (tma.cuh) STAGES ahead; the copies complete on the stage's "full" mbarrier, and the
// math warps' arrivals on its "empty" mbarrier tell the issuing thread when the slot can be
// refilled. TMA=1: the issuing thread is thread 0, which also does math, so its warp waits
// for every warp's release before it issues its next MMAs. TMA=2: it is the one working
// thread of a producer warp after the math warps (CUTLASS's warp-specialized kernels), and no
// math warp waits on anything but its data.
#pragma once

// A persistent block's tiles: blockIdx.x, + gridDim.x, ... The grid has at most one block per
// tile (kernels/launch.py): every block has one.
__device__ __forceinline__ int block_tiles() {
  return (cfg::TILES - 1 - (int)blockIdx.x) / (int)gridDim.x + 1;
}
__device__ __forceinline__ int block_tile(int k) { return (int)blockIdx.x + k * (int)gridDim.x; }

// The stages' mbarriers (a full and an empty one per stage, after the stages) and the copies
// that fill a stage: shared by the one-tile and the persistent main loop.
struct TmaRing {
  StageRing sr;
  u32 bars;
  const void* xmap;
  const void* wmap;
  __device__ __forceinline__ TmaRing(const StageRing s, const TensorMaps* maps)
      : sr(s), bars(s.base + (u32)(cfg::STAGES * (cfg::A_STAGE + cfg::B_STAGE))),
        xmap(maps->x), wmap(maps->w) {}
  __device__ __forceinline__ u32 full(int st) const { return bars + 8u * (u32)st; }
  __device__ __forceinline__ u32 empty(int st) const {
    return bars + 8u * (u32)(cfg::STAGES + st);
  }
  // PINGPONG: consumer g may start its next tile's main loop (pingpong_tma).
  __device__ __forceinline__ u32 turn(int g) const {
    return bars + 8u * (u32)(2 * cfg::STAGES + g);
  }
  // Thread 0, before a block-wide barrier: one arrival fills a stage, one per warp of the
  // consuming tile empties it (and hands a consumer its turn).
  __device__ __forceinline__ void init() const {
    for (int st = 0; st < cfg::STAGES; ++st) {
      mbar_init(full(st), 1);
      mbar_init(empty(st), cfg::WARPS);
    }
    if constexpr (cfg::PP) { mbar_init(turn(0), cfg::WARPS); mbar_init(turn(1), cfg::WARPS); }
    mbar_init_fence();
    tmap_prefetch(xmap);
    tmap_prefetch(wmap);
  }
  __device__ __forceinline__ void inval() const {
    for (int st = 0; st < cfg::STAGES; ++st) { mbar_inval(full(st)); mbar_inval(empty(st)); }
    if constexpr (cfg::PP) { mbar_inval(turn(0)); mbar_inval(turn(1)); }
  }
  // Where a tile's copies start: its first output pixel as the input coordinate the im2col
  // walk starts from, and its first output channel.
  struct Origin { int img, h0, w0, n0, m0; };
  __device__ __forceinline__ static Origin origin(int m0, int n0) {
    using namespace cfg;
    if constexpr (HALO) {  // the patch's corner: the band's input row of the tile's first
      const HaloTile t = halo_tile(m0);  // position, and its first input column
      return {t.img, t.v0 / HPITCH - PH, t.q0 - PW, n0, m0};
    }
    const int img = m0 / (P * Q), pq = m0 - img * (P * Q);
    return {img, (pq / Q) * SH - PH, (pq % Q) * SW - PW, n0, m0};
  }
  // Stage j of a persistent block's stream of tiles (nit stages each) into slot st.
  __device__ __forceinline__ void produce_stream(int st, int j, int nit,
                                                 int part = PART_AB) const {
    const int k = j / nit, tile = block_tile(k);
    produce(st, origin(tile_m0(tile), tile_n0(tile)), j - k * nit, part);
  }
  // Stage `it` of the tile at `o` into slot st: per swizzle atom, the im2col rows of A and
  // the weight rows of B (HALO: the patch and the weight rows of every tap). `part`: both
  // (PART_AB), or the stage's weights with its byte count first (PART_B) and its
  // activations later (PART_A: W_EARLY, start_ring).
  __device__ __forceinline__ void produce(int st, const Origin o, int it,
                                          int part = PART_AB) const {
    using namespace cfg;
    const int img = o.img, h0 = o.h0, w0 = o.w0, n0 = o.n0;
    const StageIdx sx = stage_idx(it);
    if (part & PART_B) mbar_arrive_expect_tx(full(st), (u32)(A_TX + B_STAGE));
    if constexpr (HALO) {  // per atom: the patch, then the weight rows of every tap
#pragma unroll
      for (int a = 0; a < NATOM; ++a) {
        const int c = sx.cb * BKC + a * (ATOM * 8 / ELEM_BITS);
        if (part & PART_A)
          tma_tile4(sr.a(st) + (u32)(a * A_ROWS * ATOM), xmap, full(st), c, w0, h0, img);
        if (part & PART_B) {
#pragma unroll
          for (int t = 0; t < R * S; ++t)
            tma_tile3(sr.b(st) + (u32)((a * TAPS + t) * BN * ATOM), wmap, full(st), c, t, n0);
        }
      }
    } else {
#pragma unroll
      for (int a = 0; a < NATOM; ++a) {
        const int c = sx.cb * BKC + a * (ATOM * 8 / ELEM_BITS);
        if (part & PART_A) {
          if constexpr (PLAIN_A) {
            tma_tile2(sr.a(st) + (u32)(a * BM * ATOM), xmap, full(st), c, o.m0);
          } else {
            tma_im2col(sr.a(st) + (u32)(a * BM * ATOM), xmap, full(st), c, w0, h0, img,
                       (unsigned short)(sx.s * DW), (unsigned short)(sx.r * DH));
          }
        }
        if (part & PART_B)
          tma_tile3(sr.b(st) + (u32)(a * BN * ATOM), wmap, full(st), c, sx.r * S + sx.s, n0);
      }
    }
  }
};

// The ring's first stages (`produce(j, slot, part)`): W_EARLY (`w_early`), their weights, the
// wait for the kernel before (pipeline.cuh), then their activations; else whole.
template <class Produce>
__device__ __forceinline__ int first_stages(const int total, const bool w_early,
                                            Produce&& produce) {
  const int first = total < cfg::STAGES ? total : cfg::STAGES;
  if (cfg::W_EARLY && w_early) {
#pragma unroll 1
    for (int s = 0; s < first; ++s) produce(s, s, PART_B);
    grid_dependency_wait();
#pragma unroll 1
    for (int s = 0; s < first; ++s) produce(s, s, PART_A);
  } else {
#pragma unroll 1
    for (int s = 0; s < first; ++s) produce(s, s, PART_AB);
  }
  return first;
}

// TMA=2: the producer thread fills stage j (of `total`) into slot j % STAGES once the math
// warps have released the slot's previous stage (the empty barrier's phase of the round
// before); the first STAGES without waiting.
template <class Produce>
__device__ __forceinline__ void producer_loop(const TmaRing& ring, const int total,
                                              const bool w_early, Produce&& produce) {
  int st = 0;
  u32 ph = 1;  // (the first round's slots were filled without waiting)
#pragma unroll 1
  for (int j = first_stages(total, w_early, produce); j < total; ++j) {
    mbar_wait(ring.empty(st), ph ^ 1u);
    produce(j, st, PART_AB);
    if (++st == cfg::STAGES) { st = 0; ph ^= 1u; }
  }
}

// The ring's start: thread 0 initializes the barriers; then with a producer warp (TMA=2) its
// first lane issues all `total` stages and the warp is done (false), else thread 0 issues the
// first STAGES of them (`produce(j, slot, part)`) and the refills come with the releases.
template <class Produce>
__device__ __forceinline__ bool start_ring(const TmaRing& ring, const int tid, const int total,
                                           const bool w_early, Produce&& produce) {
  if (tid == 0) ring.init();
  __syncthreads();  // the whole block, the producer warp included
  if constexpr (cfg::WS) {
    if (tid >= cfg::MATH_THREADS) {
      if (tid == cfg::MATH_THREADS) producer_loop(ring, total, w_early, produce);
      return false;
    }
  } else if (tid == 0) {
    first_stages(total, w_early, produce);
  }
  return true;
}

// Where a consumer is in the ring: the slot and phase of its next stage, and of the stage
// before (in flight until the next one's MMAs are issued).
struct RingPos {
  int st = 0, pst = 0;
  u32 ph = 0, pph = 0;
  __device__ __forceinline__ void advance() {
    pst = st;
    pph = ph;
    if (++st == cfg::STAGES) { st = 0; ph ^= 1u; }
  }
};

// One stage of a consumer's main loop: wait for the slot's data, issue its MMAs and release a
// slot, `release(slot, phase, j)`. With two or more stages the MMAs of a stage stay in flight
// while the next stage's are issued, so the slot of the stage before is released (against
// waiting for each stage's MMAs: median 0.88-1.00 per batch-8 layer and precision); with one
// its own, once its MMAs are done. `i`: the stage within its tile (the first releases
// nothing), `j`: within the consumer's stream, `kit`: its k-iteration (the one-stage path's).
template <class Tile, class Release>
__device__ __forceinline__ void consume_stage(Tile& wt, const StageRing sr, const TmaRing& ring,
                                              RingPos& pos, const int i, const int j,
                                              const int kit, Release&& release) {
  mbar_wait(ring.full(pos.st), pos.ph);
  if constexpr (cfg::STAGES >= 2) {
    wt.issue(sr.a(pos.st), sr.b(pos.st));
    if (i > 0) {
      wgmma_wait<1>();
      release(pos.pst, pos.pph, j - 1);
    }
  } else {
    wt.compute_stage(sr.a(pos.st), sr.b(pos.st), kit);  // issue, then wait for the MMAs
    release(pos.st, pos.ph, j);
  }
  pos.advance();
}

// Stages [it0, it0 + nit) of the block whose output tile starts at (m0, n0); the mbarriers
// are invalidated before the epilogue reuses shared memory. False for the producer warp
// (TMA=2), which has nothing left to do: the math warps alone run the epilogue.
template <class Tile>
__device__ __forceinline__ bool mainloop_tma(Tile& wt, const StageRing sr, const int it0,
                                             const int nit, const int m0, const int n0,
                                             const int tid, const TensorMaps* maps,
                                             const bool w_early) {
  using namespace cfg;
  // The issuing thread runs STAGES stages ahead; every math warp waits on the stage's full
  // barrier, runs its MMAs, and releases the slot on its empty barrier (one arrival per
  // warp); the issuing thread refills a slot once all math warps have released it.
  const TmaRing ring(sr, maps);
  const TmaRing::Origin at = TmaRing::origin(m0, n0);
  if (!start_ring(ring, tid, nit, w_early,
                  [&](int j, int st, int part) { ring.produce(st, at, it0 + j, part); }))
    return false;
  // A stage's slot is released once its MMAs are done; thread 0 then refills it with the
  // stage STAGES later.
  auto release = [&](int s, u32 p, int j) {
    __syncwarp();
    if ((tid & 31) == 0) mbar_arrive(ring.empty(s));
    if constexpr (!WS) {
      if (tid == 0 && j + STAGES < nit) {
        mbar_wait(ring.empty(s), p);
        ring.produce(s, at, it0 + j + STAGES);
      }
    }
  };
  RingPos pos;
#pragma unroll 1
  for (int i = 0; i < nit; ++i) consume_stage(wt, sr, ring, pos, i, i, it0 + i, release);
  if constexpr (STAGES >= 2) wt.retire();
  block_sync();  // every wait is done: the barriers' memory returns to the epilogue
  if (tid == 0) ring.inval();
  return true;
}

// PERSIST: the block's tiles (blockIdx.x, + gridDim.x, ...) as one stream of stages. Thread 0
// runs STAGES stages ahead across tile boundaries, so the next tile's first stages are in
// flight while `finish_tile(tile)` (the epilogue, in shared memory of its own) stores this
// one. `finish_tile` leaves the tile's accumulators zeroed for the next.
template <class Tile, class Finish>
__device__ __forceinline__ void persistent_tma(Tile& wt, const StageRing sr, const int nit,
                                               const int tid, const TensorMaps* maps,
                                               const bool w_early, Finish&& finish_tile) {
  using namespace cfg;
  const TmaRing ring(sr, maps);
  const int total = block_tiles() * nit;
  auto tile_of = [&](int j) { return block_tile(j / nit); };
  auto produce = [&](int j, int st, int part = PART_AB) {
    ring.produce_stream(st, j, nit, part);
  };
  if (!start_ring(ring, tid, total, w_early, produce)) return;
  auto release = [&](int s, u32 p, int j) {  // as in mainloop_tma, over the whole stream
    __syncwarp();
    if ((tid & 31) == 0) mbar_arrive(ring.empty(s));
    if constexpr (!WS) {
      if (tid == 0 && j + STAGES < total) {
        mbar_wait(ring.empty(s), p);
        produce(j + STAGES, s);
      }
    }
  };
  RingPos pos;
  int i = 0;  // the stage's index within its tile
#pragma unroll 1
  for (int j = 0; j < total; ++j) {
    consume_stage(wt, sr, ring, pos, i, j, i, release);
    if (++i == nit) {  // the tile's last stage: its MMAs, then its epilogue
      if constexpr (STAGES >= 2) {
        wt.retire();
        release(pos.pst, pos.pph, j);
      }
      finish_tile(tile_of(j));
      i = 0;
    }
  }
  block_sync();
  if (tid == 0) ring.inval();
}

// PINGPONG: two consumers (tid / THREADS), each the math warps of one tile, take the block's
// tiles in turn, consumer g the tiles g, g + 2, ... of its stream, so that one's main loop
// runs while the other's epilogue does (CUTLASS's ping-pong schedule). The producer warp
// fills the one ring in stream order. A consumer starts a tile's main loop once the other
// has issued its previous tile's last MMAs (an arrival per warp on the turn mbarrier): the
// main loops do not interleave, and every wait on a stage's full barrier comes after every
// earlier stage's, at most one phase ahead of the barrier (a parity wait cannot tell two
// phases apart). `finish_tile(tile, g, ctid)` runs consumer g's epilogue (ctid: the thread
// within the consumer) and leaves the accumulators zeroed for its next tile.
template <class Tile, class Finish>
__device__ __forceinline__ void pingpong_tma(Tile& wt, const StageRing sr, const int nit,
                                             const int tid, const TensorMaps* maps,
                                             const bool w_early, Finish&& finish_tile) {
  using namespace cfg;
  const TmaRing ring(sr, maps);
  const int ntiles = block_tiles();
  if (!start_ring(ring, tid, ntiles * nit, w_early,
                  [&](int j, int st, int part) { ring.produce_stream(st, j, nit, part); }))
    return;  // the producer warp (PINGPONG implies TMA=2)
  const int g = __shfl_sync(0xffffffffu, tid / THREADS, 0);  // warp-uniform, as ptxas sees
  const int ctid = tid - g * THREADS;
  auto release = [&](int s, u32, int) {
    __syncwarp();
    if ((tid & 31) == 0) mbar_arrive(ring.empty(s));
  };
  u32 tph = 0;
#pragma unroll 1
  for (int k = g; k < ntiles; k += 2) {
    if (k > 0) {
      mbar_wait(ring.turn(g), tph);
      tph ^= 1u;
    }
    const int j0 = k * nit;  // the tile's first stage in the block's stream
    RingPos pos;
    pos.st = j0 % STAGES;
    pos.ph = (u32)(j0 / STAGES) & 1u;
#pragma unroll 1
    for (int i = 0; i < nit; ++i) consume_stage(wt, sr, ring, pos, i, j0 + i, i, release);
    __syncwarp();
    if ((tid & 31) == 0) mbar_arrive(ring.turn(g ^ 1));  // the other consumer's main loop
    if constexpr (STAGES >= 2) {
      wt.retire();
      release(pos.pst, pos.pph, 0);
    }
    finish_tile(block_tile(k), g, ctid);
  }
  math_sync();  // both consumers are done with the barriers
  if (tid == 0) ring.inval();
}
