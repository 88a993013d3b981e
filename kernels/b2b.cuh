// Back to back (B2B > 0): a 1x1 conv of B2B output channels over this layer's output, run by
// the same block: once the epilogue has staged the block's BM output rows (PACK_OUT=1, the
// whole K channels of each: one column tile), they are the second GEMM's A operand, read
// from shared memory with ldmatrix; its weights [B2B][K] were copied in while the main loop
// ran (B2B_AHEAD) or are copied after the epilogue (conv.cu says where). A ResNet bottleneck's
// last conv and the next block's first are such a pair: the second layer then needs no launch,
// no wait for the first and no trip of its input through L2.
//
// Warp level: the block's math warps take items of one instruction-tile row (IM pixels) by
// CW n8 tiles of output channels in turn, each reducing over the K channels in KB-byte
// k-steps with the precision's mma.sync tile (instruction_tile.cuh), then requantizing (int8)
// or biasing (fp16) with the back-to-back conv's own per-channel values and ReLU into a staged
// output tile, which the block writes in 16-byte vectors.
#pragma once

namespace cfg {
// n8 tiles per item: the widest that divides B2B / 8 and still leaves an item for every
// math warp (the second GEMM runs after the block's main loop: idle warps lengthen it).
constexpr int b2b_cw() {
  for (int cw = 8; cw > 1; cw /= 2)
    if (B2B > 0 && (B2B / 8) % cw == 0 && (BM / IM) * (B2B / (8 * cw)) >= WARPS) return cw;
  return 1;
}
constexpr int CW = b2b_cw();
constexpr int C_ITEMS = (BM / IM) * (B2B / (8 * CW));  // items of the block tile
constexpr int C_NB = CW * BMAT;          // B matrices per k-step of an item
constexpr int C_KSTEPS = K * EB / KB;    // k-steps over the staged rows
constexpr int C_GA = AM / 4 + ((AM % 4) >= 2) + (AM % 2);
constexpr int C_GB = C_NB / 4 + ((C_NB % 4) >= 2) + (C_NB % 2);
// (1, not 0, without a back-to-back conv: b2b_conv is compiled, never run, in every build)
constexpr int C_VPR = B2B ? B2B * EB / 16 : 1;  // 16-byte vectors per output row
constexpr int C_GROUPS = B2B ? B2B / (8 * CW) : 1;  // column groups of CW n8 tiles
}  // namespace cfg

// The back-to-back weights into their region by cp.async (sm_80+; sm_75: plain copies),
// one group.
__device__ __forceinline__ void b2b_copy_weights(u8* smem, const B2b& ch, int tid) {
  using namespace cfg;
  constexpr int VPR = K * EB / 16;
#pragma unroll 1
  for (int v = tid; v < B2B * VPR; v += THREADS) {
    const int row = v / VPR, cv = v - row * VPR;
    u8* const dst = smem + W2_OFF + row * W2_ROW + cv * 16;
    if constexpr (SM >= 80) cp_async16(smem_addr(dst), ch.w + (long long)v * 16, true);
    else copy_vw<16>(dst, ch.w + (long long)v * 16);
  }
  if constexpr (SM >= 80) cp_async_commit();
}

// Before the main loop (B2B_AHEAD): one group that the pipeline's first wait or b2b_conv's
// covers.
__device__ __forceinline__ void b2b_weights_ahead(u8* smem, const B2b& ch, int tid) {
  if constexpr (cfg::B2B > 0 && cfg::B2B_AHEAD) {
    if (tid >= cfg::THREADS) return;  // the producer warp
    b2b_copy_weights(smem, ch, tid);
  }
}

// After the epilogue: the back-to-back conv over the staged tile at smem (rows E_ROW apart).
__device__ __forceinline__ void b2b_conv(u8* smem, const B2b& ch, int m0, int tid) {
  using namespace cfg;
  if (tid >= THREADS) return;  // the producer warp
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  if constexpr (!B2B_AHEAD) {
    block_sync();  // the epilogue is done with the region the weights take
    b2b_copy_weights(smem, ch, tid);
  }
  if constexpr (SM >= 80) cp_async_wait<0>();
  block_sync();  // every thread's weights, and the staged tile, are in place
  const u32 a_base = smem_addr(smem), b_base = smem_addr(smem + W2_OFF);
  u8* const o2 = smem + O2_OFF;
#pragma unroll 1
  for (int item = warp; item < C_ITEMS; item += WARPS) {
    const int r0 = (item / C_GROUPS) * IM, c0 = (item % C_GROUPS) * CW * 8;
    acc_t acc[CW][ACC_T];
#pragma unroll
    for (int j = 0; j < CW; ++j)
#pragma unroll
      for (int c = 0; c < ACC_T; ++c) acc[j][c] = 0;
    // This lane's row and 16-byte k chunk in each ldmatrix of A and of B (warp_tile.cuh's
    // fragment order: A matrix e is row half e % (IM / 8), k chunk e / (IM / 8)).
    u32 a_addr[C_GA], b_addr[C_GB];
#pragma unroll
    for (int q = 0; q < C_GA; ++q) {
      const int e = lane_mat<AM>(q, lane);
      a_addr[q] = a_base + (r0 + (e % (IM / 8)) * 8 + (lane & 7)) * E_ROW + (e / (IM / 8)) * 16;
    }
#pragma unroll
    for (int q = 0; q < C_GB; ++q) {
      const int mat = lane_mat<C_NB>(q, lane);
      b_addr[q] = b_base + (c0 + (mat / BMAT) * 8 + (lane & 7)) * W2_ROW + (mat % BMAT) * 16;
    }
#pragma unroll 2
    for (int ks = 0; ks < C_KSTEPS; ++ks) {
      u32 afr[AM], bfr[C_NB];
#pragma unroll
      for (int q = 0; q < C_GA; ++q) ldsm_group<AM>(q, a_addr[q] + ks * KB, afr);
#pragma unroll
      for (int q = 0; q < C_GB; ++q) ldsm_group<C_NB>(q, b_addr[q] + ks * KB, bfr);
#pragma unroll
      for (int j = 0; j < CW; ++j) mma_tile(acc[j], afr, &bfr[j * BMAT]);
    }
    // Requantize / bias + ReLU, each value into the staged output tile.
#pragma unroll
    for (int j = 0; j < CW; ++j) {
      const int col = c0 + j * 8 + 2 * t;
      const float b0 = ch.bias[col], b1 = ch.bias[col + 1];
      float s0 = 0.f, s1 = 0.f;
      if constexpr (PREC == 1) { s0 = ch.scale[col]; s1 = ch.scale[col + 1]; }
#pragma unroll
      for (int rh = 0; rh < IM / 8; ++rh) {
        const int row = r0 + rh * 8 + g;
        u8* const dst = o2 + row * O2_ROW + col * EB;
        const acc_t v0 = acc[j][2 * rh], v1 = acc[j][2 * rh + 1];
        // The epilogue's arithmetic (epilogue.cuh) with this conv's ReLU and no residual.
        if constexpr (PREC == 1) {
          const u32 q0 = requant_bits<B2B_RELU, false>((int)v0, s0, b0);
          const u32 q1 = requant_bits<B2B_RELU, false>((int)v1, s1, b1);
          *reinterpret_cast<unsigned short*>(dst) = (unsigned short)byte_perm(q0, q1, 0x0040);
        } else {
          *reinterpret_cast<u32*>(dst) = pack_f16x2(fp_epi<B2B_RELU, false>((float)v0, b0),
                                                    fp_epi<B2B_RELU, false>((float)v1, b1));
        }
      }
    }
  }
  block_sync();
#pragma unroll 1
  for (int v = tid; v < BM * C_VPR; v += THREADS) {
    const int row = v / C_VPR, cv = v - row * C_VPR;
    if (m0 + row >= M) continue;
    copy_vw<16>(ch.y + (long long)(m0 + row) * B2B * EB + cv * 16,
                o2 + row * O2_ROW + cv * 16);
  }
}
