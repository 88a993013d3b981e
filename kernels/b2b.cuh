// Back to back (B2B > 0): a 1x1 conv of B2B output channels over this layer's output, run by
// the same block: once the epilogue has staged the block's BM output rows (PACK_OUT=1, the
// whole K channels of each: one column tile), they are the second GEMM's A operand, read
// from shared memory with ldmatrix; its weights [B2B][K] were copied in while the main loop
// ran (B2B_AHEAD) or are copied after the epilogue (conv.cu says where). A ResNet bottleneck's
// last conv and the next block's first are such a pair: the second layer then needs no launch,
// no wait for the first and no trip of its input through L2.
//
// B2B_WG (a wgmma build): the second GEMM runs on wgmma as well. Its A operand is the staged
// tile in place (epilogue.cuh stages it in swizzled SWB-byte boxes, wgmma's K-major layout),
// its B operand the weights copied into swizzled W2_SW-byte planes; each warpgroup takes items
// of 64 rows x B2B_N channels and issues the K / 32-byte k-steps back to back (b2b_conv_wg).
//
// mma.sync builds: the block's math warps take items of one instruction-tile row (IM pixels) by
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
// B2B_WG: channels per wgmma item (at most 128: 64 accumulator registers a thread), the
// widest that still leaves an item for every warpgroup where there are enough, and the items
// of the block tile, 64 rows each.
constexpr int b2b_n() {
  for (int n = 128; n > 32; n /= 2)
    if (B2B % n == 0 && (BM / WGM) * (B2B / n) >= WARPS / 4) return n;
  return 32;
}
constexpr int B2B_N = b2b_n();
constexpr int WG_ITEMS = B2B_WG ? (BM / WGM) * (B2B / B2B_N) : 0;
constexpr int WG_KSTEPS = K * EB / 32;  // 32-byte k-steps (m64nNk32 s8, m64nNk16 f16)
}  // namespace cfg

// Descriptor of a K-major tile of dense `atom`-byte rows in swizzled planes (warpgroup_tile.cuh).
__device__ __forceinline__ u64 b2b_desc(u32 addr, int atom) {
  return wg_desc_of(addr, 8 * atom, atom);
}
// Byte offset of k-step ks (32 bytes) in a tile of `rows` rows of `atom`-byte planes.
__device__ __forceinline__ u32 b2b_koff(int ks, int rows, int atom) {
  return (u32)((ks * 32 / atom) * rows * atom + (ks * 32) % atom);
}

// The back-to-back weights into their region by cp.async (sm_80+; sm_75: plain copies),
// one group.
__device__ __forceinline__ void b2b_copy_weights(u8* smem, const B2b& ch, int tid) {
  using namespace cfg;
  constexpr int VPR = K * EB / 16;
  constexpr int CPA = W2_SW / 16;  // (B2B_WG) 16-byte chunks of an atom row
  const u32 wg_base = align1024(smem_addr(smem + W2_OFF));
#pragma unroll 1
  for (int v = tid; v < B2B * VPR; v += THREADS) {
    const int row = v / VPR, cv = v - row * VPR;
    if constexpr (B2B_WG) {
      const u32 off = (u32)((cv / CPA) * B2B * W2_SW + row * W2_SW +
                            (((cv % CPA) ^ swz_of(row, W2_SW)) << 4));
      cp_async16(wg_base + off, ch.w + (long long)v * 16, true);
      continue;
    }
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

// Two neighbouring channels' values into the second output's staged tile: the epilogue's
// arithmetic (epilogue.cuh) with this conv's ReLU and no residual.
__device__ __forceinline__ void b2b_value_pair(u8* dst, acc_t v0, acc_t v1, float s0, float s1,
                                               float b0, float b1) {
  using namespace cfg;
  if constexpr (PREC == 1) {
    const u32 q0 = requant_bits<B2B_RELU, false>((int)v0, s0, b0);
    const u32 q1 = requant_bits<B2B_RELU, false>((int)v1, s1, b1);
    *reinterpret_cast<unsigned short*>(dst) = (unsigned short)byte_perm(q0, q1, 0x0040);
  } else {
    *reinterpret_cast<u32*>(dst) = pack_f16x2(fp_epi<B2B_RELU, false>((float)v0, b0),
                                              fp_epi<B2B_RELU, false>((float)v1, b1));
  }
}

// The second output's staged tile, once every item is in it, in 16-byte vectors.
__device__ __forceinline__ void b2b_store(const u8* o2, const B2b& ch, int m0, int tid) {
  using namespace cfg;
  block_sync();
#pragma unroll 1
  for (int v = tid; v < BM * C_VPR; v += THREADS) {
    const int row = v / C_VPR, cv = v - row * C_VPR;
    if (m0 + row >= M) continue;
    copy_vw<16>(ch.y + (long long)(m0 + row) * B2B * EB + cv * 16,
                o2 + row * O2_ROW + cv * 16);
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
        b2b_value_pair(o2 + row * O2_ROW + col * EB, acc[j][2 * rh], acc[j][2 * rh + 1], s0,
                       s1, b0, b1);
      }
    }
  }
  b2b_store(o2, ch, m0, tid);
}

// B2B_WG: the back-to-back conv on wgmma over the tile staged in the epilogue's region `epi`
// (the epilogue fenced its staging writes for the async proxy); N2 = B2B_N channels an item.
// PERSIST: the weights stay resident for the block's tiles; `first`: its first tile, which
// waits for their copies.
template <int N2>
__device__ __forceinline__ void b2b_conv_wg(u8* smem, const u8* epi, const B2b& ch, int m0,
                                            int tid, bool first = true) {
  using namespace cfg;
  if (tid >= THREADS) return;  // the producer warp
  if constexpr (!B2B_AHEAD) {
    block_sync();  // the epilogue is done with the region the weights take
    b2b_copy_weights(smem, ch, tid);
  }
  if (first) {
    cp_async_wait<0>();
    fence_proxy_async();  // this thread's weight copies, for the Tensor Cores' reads
  }
  block_sync();  // every thread's weights, and the staged tile, are in place
  const u32 a_base = align1024(smem_addr(epi)), b_base = align1024(smem_addr(smem + W2_OFF));
  const int wgi = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;
  const int lane = tid & 31, g = lane >> 2, t = lane & 3;
  u8* const o2 = smem + O2_OFF;
#pragma unroll 1
  for (int item = wgi; item < WG_ITEMS; item += WARPS / 4) {
    const int r0 = (item / (B2B / N2)) * WGM, c0 = (item % (B2B / N2)) * N2;
    acc_t acc[N2 / 2];
#pragma unroll
    for (int c = 0; c < N2 / 2; ++c) acc[c] = 0;
    const u32 a0 = a_base + (u32)(r0 * SWB), b0 = b_base + (u32)(c0 * W2_SW);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < WG_KSTEPS; ++ks)
      wgmma_tile<N2>(acc, b2b_desc(a0 + b2b_koff(ks, BM, SWB), SWB),
                     b2b_desc(b0 + b2b_koff(ks, B2B, W2_SW), W2_SW));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int c = 0; c < N2 / 2; ++c) reg_fence(acc[c]);
    // acc[4j + 2rh + e]: row 16wq + 8rh + g of the item, channel 8j + 2t + e (wgmma.cuh).
#pragma unroll
    for (int j = 0; j < N2 / 8; ++j) {
      const int col = c0 + j * 8 + 2 * t;
      const float b0f = ch.bias[col], b1f = ch.bias[col + 1];
      float s0 = 0.f, s1 = 0.f;
      if constexpr (PREC == 1) { s0 = ch.scale[col]; s1 = ch.scale[col + 1]; }
#pragma unroll
      for (int rh = 0; rh < 2; ++rh) {
        u8* const dst = o2 + (r0 + wq * 16 + rh * 8 + g) * O2_ROW + col * EB;
        b2b_value_pair(dst, acc[4 * j + 2 * rh], acc[4 * j + 2 * rh + 1], s0, s1, b0f, b1f);
      }
    }
  }
  b2b_store(o2, ch, m0, tid);
}
