// Warpgroup tile (MMA=wgmma, sm_90a): WARP_ROW_TILES x one wgmma tile of 64 rows x WN
// columns per warpgroup (4 consecutive warps). The instruction reads A and B straight from
// the stage's shared rows through matrix descriptors: the block tile's XOR swizzle (soff)
// is wgmma's 32/64/128-byte swizzle for rows of that many bytes, so the loader is shared
// with the mma.sync path. No ldmatrix, no fragments in registers: per k-step a warpgroup
// issues WRT instructions instead of each warp issuing WRT x WCT x (k-steps of 16-32 B).
#pragma once

#include "wgmma.cuh"

namespace cfg {
// Operand tiles are K-major rows of swizzle atoms. cp.async stores a row's atoms side by side
// per 8-row group (block_tile.cuh: soff); TMA writes one box per atom, i.e. all rows of the
// first atom, then all rows of the second ("planes"). WG_ROWB: bytes from a row to the next.
constexpr int WG_ROWB = TMA ? ATOM : SB;
constexpr u32 WG_SBO = 8 * WG_ROWB;  // bytes between 8-row groups of a K-major operand tile
static_assert(!WG || (SB == 32 || SB == 64 || SB == 128 || SB == 256),
              "a wgmma stage row is 32, 64 or 128 bytes, or two 128-byte atoms");
// Byte offset of k-step ks in a tile of `rows` rows: its atom, then its place in the atom row.
constexpr int wg_koff(int ks, int rows) {
  return (ks * KB / ATOM) * (TMA ? rows * ATOM : 8 * ATOM) + (ks * KB) % ATOM;
}
static_assert(!WG || SM == 90, "wgmma is an sm_90a instruction");
}  // namespace cfg

// Shared-memory matrix descriptor of a K-major tile starting at `addr` (see PTX ISA,
// "Matrix Descriptor Format"): start >> 4, leading offset (unused for swizzled K-major),
// stride offset `sbo` = one 8-row group, swizzle mode of `atom`-byte atoms (1 = 128 B,
// 2 = 64 B, 3 = 32 B).
__device__ __forceinline__ u64 wg_desc_of(u32 addr, u32 sbo, int atom) {
  const u64 mode = atom == 128 ? 1 : atom == 64 ? 2 : 3;
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(sbo >> 4) << 32) |
         (mode << 62);
}
// The main loop's operand tiles (WG_ROWB bytes from a row to the next).
__device__ __forceinline__ u64 wg_desc(u32 addr) {
  return wg_desc_of(addr, cfg::WG_SBO, cfg::ATOM);
}

struct GroupTile {
  // SWAP_AB: the same registers hold WN / 64 swapped instructions' fragments in turn, each
  // SWAP_N / 2 values (for_each_swapped in epilogue.cuh says which output each is).
  acc_t acc[cfg::WRT][cfg::EWCT][cfg::ACC_T];
  int wm0, wn0;
  int wq;            // the warp's place in its warpgroup (its 16 rows of each instruction)
  u32 a_off, b_off;  // this warpgroup's first A row and B row in a stage, in bytes
  u32 a_view;        // HALO: the tile's first position in its patch (bytes), 0 otherwise

  // Before each tile (m0: its first GEMM row): zeroed accumulators.
  __device__ __forceinline__ void init(int m0, int tid, const BlockLoader& /*ld*/) {
    using namespace cfg;
    if constexpr (HALO) a_view = (u32)((halo_tile(m0).v0 % HPITCH) * ATOM);
    else a_view = 0;
    // The warpgroup index through a shuffle: ptxas then knows it is warp-uniform and keeps
    // the descriptors in uniform registers (main loop of the stage3 int8 best: 119 -> 105
    // instructions per stage).
    const int wgi = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;
    const int wg_m = wgi / BCW, wg_n = wgi % BCW;
    // The epilogue sees each warp's 16 rows of every 64-row tile (ROWSTEP apart).
    wm0 = wg_m * WRT * WGM + wq * IM;
    wn0 = wg_n * WN;
    this->wq = wq;
    a_off = (u32)(wg_m * WRT * WGM * WG_ROWB);
    b_off = (u32)(wn0 * WG_ROWB);
#pragma unroll
    for (int i = 0; i < WRT; ++i)
#pragma unroll
      for (int j = 0; j < EWCT; ++j)
#pragma unroll
        for (int c = 0; c < ACC_T; ++c) acc[i][j][c] = 0;
  }

  // The compiler must not move accumulator reads or writes across the asynchronous MMA:
  // each register is tied to an empty volatile asm after the wait.
  __device__ __forceinline__ void pin() {
    using namespace cfg;
#pragma unroll
    for (int i = 0; i < WRT; ++i)
#pragma unroll
      for (int j = 0; j < EWCT; ++j)
#pragma unroll
        for (int c = 0; c < ACC_T; ++c) reg_fence(acc[i][j][c]);
  }

  // Issue the stage's MMAs (asynchronous: the caller loads the next stage meanwhile).
  __device__ __forceinline__ void issue(u32 abuf, u32 bbuf) {
    if constexpr (cfg::HALO) issue_halo(abuf, bbuf);
    else issue_tap(abuf, bbuf);
  }
  // One filter tap's stage. One descriptor per operand; the k-steps and row tiles are offsets
  // in its start-address field (16-byte units; shared addresses stay below 2^18, so no carry).
  __device__ __forceinline__ void issue_tap(u32 abuf, u32 bbuf) {
    using namespace cfg;
    const u64 da = wg_desc(abuf + a_off), db = wg_desc(bbuf + b_off);
    wgmma_fence();
    if constexpr (SWAP) {
      // Instruction q: weight rows q * 64.. as A, the warpgroup's WRT * 64 pixel rows as B.
#pragma unroll
      for (int ks = 0; ks < CHUNK; ++ks)
#pragma unroll
        for (int q = 0; q < WN / 64; ++q)
          wgmma_tile<SWAP_N>(&acc[0][0][0] + q * (SWAP_N / 2),
                             db + (u64)((q * 64 * WG_ROWB + wg_koff(ks, BN)) >> 4),
                             da + (u64)(wg_koff(ks, BM) >> 4));
    } else {
#pragma unroll
      for (int ks = 0; ks < CHUNK; ++ks)
#pragma unroll
        for (int i = 0; i < WRT; ++i)
          wgmma_tile<WN>(&acc[i][0][0], da + (u64)((i * WGM * WG_ROWB + wg_koff(ks, BM)) >> 4),
                         db + (u64)(wg_koff(ks, BN) >> 4));
    }
    wgmma_commit();
  }
  // HALO: every tap, the patch from the tile's first position plus the tap's offset, and the
  // tap's weight rows. A view may start at any pixel row of the patch: the hardware applies
  // the swizzle to the address bits (as TMA wrote them into the 1024-byte-aligned plane), so
  // the descriptor's base offset stays 0 (with (addr >> 7) & 7 there, every output was wrong).
  __device__ __forceinline__ void issue_halo(u32 abuf, u32 bbuf) {
    using namespace cfg;
    const u32 a0 = abuf + a_off + a_view, b0 = bbuf + b_off;
    wgmma_fence();
#pragma unroll
    for (int t = 0; t < R * S; ++t)
#pragma unroll
      for (int ks = 0; ks < CHUNK; ++ks)
#pragma unroll
        for (int i = 0; i < WRT; ++i) {
          const int row = i * WGM + (t / S) * HPITCH + t % S;
          wgmma_tile<WN>(&acc[i][0][0], wg_desc(a0 + (u32)(row * ATOM + wg_koff(ks, A_ROWS))),
                         wg_desc(b0 + (u32)(wg_koff(ks, TAPS * BN) + t * BN * ATOM)));
        }
    wgmma_commit();
  }
  // Wait for them: the stage's buffer is reloaded after the next barrier.
  __device__ __forceinline__ void retire() {
    wgmma_wait<0>();
    pin();
  }
  __device__ __forceinline__ void compute_stage(u32 abuf, u32 bbuf, int /*it*/) {
    issue(abuf, bbuf);
    retire();
  }
};
