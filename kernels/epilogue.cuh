// Epilogue: split-K fix-up, then the output transform and the stores.
//
// Accumulator fragment of an instruction tile (m16n8 / m8n8): thread (g = lane/4, t = lane%4)
// holds rows g (and g+8 for m16) at columns 2t, 2t+1.
//
// PACK_OUT=0: raw 32-bit accumulators go to shared memory; a second pass reads them back,
//   runs the epilogue and writes 16-byte vectors.
// PACK_OUT=1 (paper 3.2): the epilogue runs in registers; int8 / int4 values are packed into
//   32-bit words across the quad with warp shuffles before the (4-8x smaller) shared store;
//   raw int32 output goes straight from registers to global memory.
// PACK_OUT=2: as 1, but the staged tile is swizzled for the TMA unit, and one thread writes
//   it with bulk tensor stores that drain while the block goes on (the next tile's main
//   loop, with PERSIST); no second pass through the threads.
// The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize
// Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources").
#pragma once

namespace cfg {
constexpr int ROWS_H = IM / 8;              // row halves (g, g+8) per instruction tile
constexpr int HALVES = EWCT * ROWS_H;        // (tile column, row half) pairs per warp row tile
constexpr int VPRO = TB / VW;                // store vectors per output row of the tile
constexpr int EV = VW * 8 / OUT_BITS;        // elements per store vector
// SWAP_AB, fp16: the staging tile written by stmatrix.trans (stage_swapped_f16).
constexpr bool SWAP_STSM = SWAP && PACK && PREC == 0 && SM >= 90 && K % 8 == 0;
}  // namespace cfg

// The residual epilogue's input (conv.cu's tensor contract): y's shape, layout and type.
struct Residual { const u8* p; float scale; };

// Byte offset of output element (m, n) in y (n must start a vector for int4).
__device__ __forceinline__ long long out_off(int m, int n) {
  using namespace cfg;
  if constexpr (LAYOUT) {
    const int mp = m >> 3, ni = m & 7;
    return ((long long)(mp * (K / CVO) + n / CVO) * 8 + ni) * 16 + (n % CVO) * OUT_BITS / 8;
  } else {
    return ((long long)m * K + n) * OUT_BITS / 8;
  }
}

// An int8 residual's byte as a float, exactly, by full-rate adds: (byte ^ 0x80) = value + 128
// in the low mantissa bits of 1.5 * 2^23 (a conversion instruction runs at a quarter of
// their rate, once per output element of a residual layer).
__device__ __forceinline__ float s8_byte_to_f32(u32 byte) {
  return f_add_rn(__uint_as_float(byte ^ 0x4B400080u), -12583040.f);  // -(1.5 * 2^23 + 128)
}

// The residual of output element (m, n), scaled (int8: res * res_scale; fp16: res); 0 without.
__device__ __forceinline__ float res_at(const Residual& res, int m, int n) {
  using namespace cfg;
  if constexpr (!RES) {
    return 0.f;
  } else if constexpr (PREC == 0) {
    return ldg_f16(res.p + out_off(m, n));
  } else {
    return f_mul_rn(s8_byte_to_f32(ldg_u8(res.p + out_off(m, n))), res.scale);
  }
}
// The same from the residual tile staged in shared memory (PACK_OUT; row, col in the tile).
__device__ __forceinline__ float res_tile(const u8* rs, const Residual& res, int row, int col) {
  using namespace cfg;
  if constexpr (PREC == 0) {
    float lo, hi;
    unpack_f16x2((u32)*reinterpret_cast<const unsigned short*>(rs + row * E_ROW + col * 2), lo, hi);
    return lo;
  } else {
    return f_mul_rn(s8_byte_to_f32(rs[row * E_ROW + col]), res.scale);
  }
}

// VW bytes from src to dst (both VW-aligned).
template <int VW_>
__device__ __forceinline__ void copy_vw(u8* dst, const u8* src) {
  if constexpr (VW_ == 16) *reinterpret_cast<V4*>(dst) = *reinterpret_cast<const V4*>(src);
  else if constexpr (VW_ == 8) *reinterpret_cast<u64*>(dst) = *reinterpret_cast<const u64*>(src);
  else if constexpr (VW_ == 4) *reinterpret_cast<u32*>(dst) = *reinterpret_cast<const u32*>(src);
  else if constexpr (VW_ == 2)
    *reinterpret_cast<unsigned short*>(dst) = *reinterpret_cast<const unsigned short*>(src);
  else *dst = *src;
}

// The block's residual tile into shared memory at rs, and its columns' scale and bias (fp16:
// bias) past it (conv.cu: RES_TILE). By cp.async (sm_80+, ASYNC): every copy in flight at
// once, as one group (conv.cu: RES_AHEAD, RES_ASYNC); otherwise a load -> store round trip
// per vector.
template <bool ASYNC>
__device__ __forceinline__ void residual_copies(u8* rs, const Residual& res, const float* scale,
                                                const float* bias, int m0, int n0, int tid) {
  using namespace cfg;
#pragma unroll 1
  for (int v = tid; v < BM * VPRO; v += THREADS) {
    const int row = v / VPRO, cv = v - row * VPRO;
    const int m = out_row(m0, row), n = n0 + cv * EV;
    if (m < 0 || n >= K) continue;
    u8* const dst = rs + row * E_ROW + cv * VW;
    if constexpr (ASYNC) cp_async_tv<VW>(smem_addr(dst), res.p + out_off(m, n), true);
    else copy_vw<VW>(dst, res.p + out_off(m, n));
  }
  float* const ps = reinterpret_cast<float*>(rs + RES_TILE);
#pragma unroll 1
  for (int v = tid; v < PARAM_ARRAYS * BN; v += THREADS) {
    const int col = v % BN, n = n0 + col;
    if (n >= K) continue;
    const float* const src = (PREC != 0 && v < BN ? scale : bias) + n;
    if constexpr (ASYNC) cp_async_tv<4>(smem_addr(ps + v), src, true);
    else ps[v] = *src;
  }
  if constexpr (ASYNC) cp_async_commit();
}

// RES_AHEAD: the math threads issue the block's residual tile's copies into its region
// (RES_OFF of the epilogue's, which the main loop does not touch) before the main loop (tc_conv:
// before or after the grid-dependency wait); the epilogue waits for them. The multistage
// pipeline's first wait covers them too (the oldest group), while the tile's first stage is in
// flight beside them.
__device__ __forceinline__ void residual_ahead(u8* smem, const Residual& res, const float* scale,
                                               const float* bias, int tid) {
  using namespace cfg;
  if constexpr (RES_AHEAD) {
    if (tid >= THREADS) return;  // the producer warp
    const int tile = blockIdx.x;  // (one tile a block)
    residual_copies<true>(smem + RES_OFF, res, scale, bias, tile_m0(tile), tile_n0(tile), tid);
  }
}

// Byte offset of (row, byte column) in the staging tile. PACK_OUT=2 (and B2B_WG): column
// boxes of SWB bytes x BM rows, each row's 16-byte chunks permuted as the tensor map's (and
// wgmma's) SWB-byte swizzle expects (chunk ^ address bits 7.., relative to the
// 1024-byte-aligned base).
// Rows 8 apart share their swizzle (r0 is a multiple of 8): stg_off(row + 8i, c) =
// stg_off(row, c) + 8i * STG_ROW.
constexpr int STG_ROW = cfg::SWZ_STG ? cfg::SWB : cfg::E_ROW;
// A swizzle atom's XOR pattern (`atom`-byte rows): the row's bits that its 16-byte chunk
// index is XORed with (b2b.cuh lays out the back-to-back weights the same way).
__device__ __forceinline__ int swz_of(int row, int atom) {
  return atom == 128 ? (row & 7) : atom == 64 ? ((row >> 1) & 3) : ((row >> 2) & 1);
}
__device__ __forceinline__ u32 align1024(u32 a) { return (a + 1023u) & ~1023u; }
__device__ __forceinline__ int stg_off(int row, int colb) {
  using namespace cfg;
  if constexpr (SWZ_STG) {
    const int box = colb / SWB, inb = colb % SWB;
    return box * (BM * SWB) + row * SWB + ((((inb >> 4) ^ swz_of(row, SWB))) << 4) + (inb & 15);
  } else {
    return row * E_ROW + colb;
  }
}

// The epilogue of one value: int -> requantized int (clamped), fp -> float with bias; `rv`
// is the residual (res_at), added last: acc * scale + bias + rv, each step rounded to float.
// The result is the bit pattern of (clamped value + 1.5 * 2^23): the add rounds to the nearest
// even integer (as cvt.rni) and leaves it in the low mantissa bits, so its low 8 (4) bits are
// the int8 (int4) value. A float -> int conversion runs 16 per clock per SM against 128 adds,
// and output-bound layers do one per output element.
// The ReLU and residual flags are the layer's unless given (b2b.cuh: the back-to-back conv's
// own ReLU, no residual).
constexpr float ROUND_MAGIC = 12582912.f;  // 1.5 * 2^23
constexpr int ROUND_MAGIC_BITS = 0x4B400000;
template <bool RELU_ = cfg::RELU != 0, bool RES_ = cfg::RES>
__device__ __forceinline__ u32 requant_bits(int a, float sc, float bi, float rv = 0.f) {
  using namespace cfg;
  constexpr float LO = ELEM_BITS == 8 ? -128.f : -8.f, HI = ELEM_BITS == 8 ? 127.f : 7.f;
  float v = f_add_rn(f_mul_rn(s32_to_f32(a), sc), bi);
  if constexpr (RES_) v = f_add_rn(v, rv);
  v = fminf(fmaxf(v, RELU_ ? 0.f : LO), HI);
  return __float_as_uint(f_add_rn(v, ROUND_MAGIC));
}
__device__ __forceinline__ int requant(int a, float sc, float bi, float rv = 0.f) {
  return (int)requant_bits(a, sc, bi, rv) - ROUND_MAGIC_BITS;
}
template <bool RELU_ = cfg::RELU != 0, bool RES_ = cfg::RES>
__device__ __forceinline__ float fp_epi(float a, float bi, float rv = 0.f) {
  using namespace cfg;
  float v = EPI ? f_add_rn(a, bi) : a;
  if constexpr (RES_) v = f_add_rn(v, rv);
  return RELU_ ? fmaxf(v, 0.f) : v;
}

// Half `h` of a warp row tile: which tile column and which row half (g or g+8).
__device__ __forceinline__ void half_pos(int h, int& j, int& rh) {
  j = h / cfg::ROWS_H;
  rh = h % cfg::ROWS_H;
}

// SWAP_AB: value c of the n8 column group jj of swapped instruction q is output channel
// (tile column) wn0 + 64q + 16wq + 8(c/2) + g of pixel (tile row) r0 + 8jj + 2t + c%2,
// where r0 is the warpgroup's first row: the fragment of an m64 instruction whose rows are
// channels, each warp's 16 of them (wgmma.cuh), transposed.
template <class WT, class F>
__device__ __forceinline__ void for_each_swapped(WT& wt, int lane, F&& f) {
  using namespace cfg;
  const int g = lane >> 2, t = lane & 3, r0 = wt.wm0 - wt.wq * IM;
  acc_t* flat = &wt.acc[0][0][0];
#pragma unroll
  for (int q = 0; q < WN / 64; ++q) {
    const int col0 = wt.wn0 + q * 64 + wt.wq * 16 + g;
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int jj = 0; jj < SWAP_N / 8; ++jj)
#pragma unroll
        for (int c = 2 * half; c < 2 * half + 2; ++c)
          f(r0 + 8 * jj + 2 * t + (c & 1), col0 + 8 * half, flat[q * (SWAP_N / 2) + 4 * jj + c]);
  }
}

// SWAP_AB, int8: requantize and stage each value at its (pixel row, channel column). A
// thread's values of instruction q belong to two channels (half 0, 1): their scales and
// biases are loaded once per channel, before its values' staging stores (the compiler cannot
// move a load of `scale` past a store to the staging tile, so a load per value runs once per
// value, or all of them hoisted ahead of every store: 20+ live registers, which spilled on
// tiles of 64 output channels).
template <class WT>
__device__ __forceinline__ void stage_swapped_s8(WT& wt, u8* stg, const u8* rs,
                                                 const Residual& res, int n0, int lane,
                                                 const float* scale, const float* bias) {
  using namespace cfg;
  const int g = lane >> 2, t = lane & 3, r0 = wt.wm0 - wt.wq * IM;
  const acc_t* flat = &wt.acc[0][0][0];
#pragma unroll
  for (int q = 0; q < WN / 64; ++q)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int col = wt.wn0 + q * 64 + wt.wq * 16 + g + 8 * half, n = n0 + col;
      if (n >= K) continue;
      const float sc = scale[n], bi = bias[n];
#pragma unroll
      for (int c = 2 * half; c < 2 * half + 2; ++c) {
        // One address per column and row parity; the jj rows are 8 apart, which keeps the
        // swizzle (stg_off): constant offsets from it.
        const int row0 = r0 + 2 * t + (c & 1);
        u8* const p = stg + stg_off(row0, col);
#pragma unroll
        for (int jj = 0; jj < SWAP_N / 8; ++jj) {
          const float rv = RES ? res_tile(rs, res, row0 + 8 * jj, col) : 0.f;
          p[8 * jj * STG_ROW] =
              (u8)(requant_bits(flat[q * (SWAP_N / 2) + 4 * jj + c], sc, bi, rv) & 0xFFu);
        }
      }
    }
}

// SWAP_AB, fp16 (cfg::SWAP_STSM): the fragment of instruction q as 8x8 matrices [channel]
// [pixel] of f16x2 pixel pairs (a warp's channels 16wq + 8 half + g at pixels 8jj + 2t, +1),
// stored transposed (stmatrix.trans): eight staging rows of 8 channels, 16 bytes a pixel,
// four matrices an instruction, where value by value takes a two-byte store each, with bank
// conflicts. Whole 16-byte rows: K % 8 == 0 (rows past K are staged, never stored).
template <class WT>
__device__ __forceinline__ void stage_swapped_f16(WT& wt, u8* stg, const u8* rs,
                                                  const Residual& res, int n0, int lane,
                                                  const float* bias) {
  using namespace cfg;
  const int g = lane >> 2, t = lane & 3, r0 = wt.wm0 - wt.wq * IM;
  const int mat = lane >> 3, mrow = lane & 7;  // the stored row this lane addresses
  const acc_t* flat = &wt.acc[0][0][0];
#pragma unroll
  for (int q = 0; q < WN / 64; ++q) {
    const int cb = wt.wn0 + q * 64 + wt.wq * 16;  // the warp's 16 channels of instruction q
    float b[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int n = n0 + cb + 8 * half + g;
      b[half] = (EPI && n < K) ? bias[n] : 0.f;
    }
#pragma unroll
    for (int jj = 0; jj < SWAP_N / 8; jj += 2) {
      u32 r[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // matrix k: channel half k % 2, pixel group jj + k / 2
        const int half = k & 1, jk = jj + (k >> 1);
        const acc_t* a = flat + q * (SWAP_N / 2) + 4 * jk + 2 * half;
        float rv0 = 0.f, rv1 = 0.f;
        if constexpr (RES) {
          const int row = r0 + 8 * jk + 2 * t, col = cb + 8 * half + g;
          rv0 = res_tile(rs, res, row, col);
          rv1 = res_tile(rs, res, row + 1, col);
        }
        r[k] = pack_f16x2(fp_epi(a[0], b[half], rv0), fp_epi(a[1], b[half], rv1));
      }
      const int row = r0 + 8 * (jj + (mat >> 1)) + mrow, colb = (cb + 8 * (mat & 1)) * 2;
      stsm_x4_trans(smem_addr(stg + stg_off(row, colb)), r[0], r[1], r[2], r[3]);
    }
  }
}

template <class WT>
__device__ __forceinline__ void epilogue(WT& wt, u8* smem, int m0, int n0, int tid, int tile,
                                         int split, const float* scale, const float* bias,
                                         const Residual& res, u8* y, u32* ws, u32* counters,
                                         const TensorMaps* maps) {
  using namespace cfg;
  const int lane = tid & 31, g = lane >> 2, t = lane & 3;

  // ---- split-K in a cluster (SPLIT_CLUSTER): every split but the first leaves its partial
  // tile in its own shared memory (the main loop's, dead now); the first adds them to its
  // own in split order (deterministic) over distributed shared memory and runs the epilogue.
  // No round trip through global memory, no counter.
#if TC_SM >= 90
  if constexpr (SPLITK > 1 && SPLIT_CLUSTER) {
    u32* const part = reinterpret_cast<u32*>(smem);
    acc_t* const flat = &wt.acc[0][0][0];
    if (split != 0) {
#pragma unroll
      for (int k = 0; k < ACC_N; ++k) part[k * THREADS + tid] = *reinterpret_cast<u32*>(&flat[k]);
    }
    cluster_sync();  // the partial tiles are written
    if (split == 0) {
      const u32 mine = smem_addr(part + tid);
#pragma unroll
      for (int sp = 1; sp < SPLITK; ++sp) {
        const u32 theirs = cluster_addr(mine, sp);
#pragma unroll
        for (int k = 0; k < ACC_N; ++k) {
          u32 v = ld_cluster_u32(theirs + (u32)(k * THREADS * 4));
          flat[k] += *reinterpret_cast<acc_t*>(&v);
        }
      }
    }
    cluster_sync();  // and read: a block's shared memory lives as long as its threads
    if (split != 0) return;
  } else
#endif
  // ---- split-K: every split writes its partial tile; the last to arrive sums them in split
  // order (deterministic), resets the counter for the next launch, and runs the epilogue.
  if constexpr (SPLITK > 1) {
    u32* mine = ws + ((long long)tile * SPLITK + split) * (ACC_N * THREADS);
    int k = 0;
#pragma unroll
    for (int i = 0; i < WRT; ++i)
#pragma unroll
      for (int j = 0; j < EWCT; ++j)
#pragma unroll
        for (int c = 0; c < ACC_T; ++c, ++k)
          mine[k * THREADS + tid] = *reinterpret_cast<u32*>(&wt.acc[i][j][c]);
    __threadfence();
    block_sync();
    // The flag lives in the (now idle) dynamic shared memory: no static allocation, so the
    // shared-memory size stays exactly geometry()'s.
    volatile int* s_last = reinterpret_cast<volatile int*>(smem);
    if (tid == 0) *s_last = atomicAdd(&counters[tile], 1u) == SPLITK - 1;
    block_sync();
    const bool last = *s_last;
    block_sync();  // everyone has read the flag before the staging overwrites it
    if (!last) return;
    __threadfence();
    k = 0;
#pragma unroll
    for (int i = 0; i < WRT; ++i)
#pragma unroll
      for (int j = 0; j < EWCT; ++j)
#pragma unroll
        for (int c = 0; c < ACC_T; ++c, ++k) {
          const u32* base = ws + (long long)tile * SPLITK * (ACC_N * THREADS) + k * THREADS + tid;
          acc_t sum;
          u32 v0 = ldcg_u32(base);
          sum = *reinterpret_cast<acc_t*>(&v0);
#pragma unroll
          for (int sp = 1; sp < SPLITK; ++sp) {
            u32 v = ldcg_u32(base + (long long)sp * (ACC_N * THREADS));
            sum += *reinterpret_cast<acc_t*>(&v);
          }
          wt.acc[i][j][c] = sum;
        }
    if (tid == 0) counters[tile] = 0;
  }

  // ---- residual tile (PACK_OUT): rows of the output tile's layout, at RES_OFF (RES_AHEAD: in
  // flight since before the main loop).
  u8* const rs = smem + RES_OFF;
  if constexpr (RES && PACK) {
    if constexpr (!RES_AHEAD) residual_copies<RES_ASYNC>(rs, res, scale, bias, m0, n0, tid);
    if constexpr (RES_AHEAD || RES_ASYNC) cp_async_wait<0>();
    block_sync();
    // From here the columns' scale and bias are read from their copies (indexed by channel).
    const float* const ps = reinterpret_cast<const float*>(rs + RES_TILE) - n0;
    if constexpr (PREC != 0) scale = ps;
    bias = ps + (PARAM_ARRAYS - 1) * BN;
  }

  // ---- raw int32 with PACK_OUT and swapped operands: straight from registers, one value
  // at a time (a thread's values of a pixel are 8 channels apart).
  if constexpr (DIRECT_OUT && SWAP) {
    // NHWC: 32-bit offsets from the tile's first output (a tile is far below 2^31 bytes),
    // one 64-bit base rather than an address per value.
    acc_t* const yt = reinterpret_cast<acc_t*>(y) + (long long)m0 * K + n0;
    for_each_swapped(wt, lane, [&](int row, int col, acc_t& a) {
      if (m0 + row >= M || n0 + col >= K) return;
      if constexpr (LAYOUT) *reinterpret_cast<acc_t*>(y + out_off(m0 + row, n0 + col)) = a;
      else yt[row * K + col] = a;
    });
    return;
  }
  // ---- raw int32 (fp32_tc: fp32) with PACK_OUT: straight from registers.
  if constexpr (DIRECT_OUT) {
#pragma unroll
    for (int i = 0; i < WRT; ++i)
#pragma unroll
      for (int j = 0; j < EWCT; ++j)
#pragma unroll
        for (int rh = 0; rh < ROWS_H; ++rh) {
          const int m = out_row(m0, wt.wm0 + i * ROWSTEP + rh * 8 + g);
          const int n = n0 + wt.wn0 + j * 8 + 2 * t;
          if (m < 0 || n >= K) continue;
          int* dst = reinterpret_cast<int*>(y + out_off(m, n));
          int v0, v1;
          if constexpr (PREC == 3) {  // fp32 out: bias + ReLU in registers
            const float b0 = EPI ? bias[n] : 0.f, b1 = (EPI && n + 1 < K) ? bias[n + 1] : 0.f;
            v0 = __float_as_int(fp_epi(wt.acc[i][j][2 * rh], b0));
            v1 = __float_as_int(fp_epi(wt.acc[i][j][2 * rh + 1], b1));
          } else {
            v0 = wt.acc[i][j][2 * rh]; v1 = wt.acc[i][j][2 * rh + 1];
          }
          if (K % 2 == 0) {
            *reinterpret_cast<int2*>(dst) = make_int2(v0, v1);
          } else {
            dst[0] = v0;
            if (n + 1 < K) *reinterpret_cast<int*>(y + out_off(m, n + 1)) = v1;
          }
        }
    return;
  }

  // ---- stage the tile in shared memory
  // PACK_OUT=2: the 1024-byte-aligned staging tile, once the previous tile's bulk stores
  // (this block's, PERSIST) have read it.
  u8* const stg = SWZ_STG ? smem + (align1024(smem_addr(smem)) - smem_addr(smem)) : smem;
  if constexpr (TMA_ST) {
    if (tid == 0) bulk_wait_read();
    block_sync();
  }
  if constexpr (SWAP_STSM) {
    stage_swapped_f16(wt, stg, rs, res, n0, lane, bias);
  } else if constexpr (SWAP && PACK && PREC != 0) {
    stage_swapped_s8(wt, stg, rs, res, n0, lane, scale, bias);
  } else if constexpr (SWAP) {
    // Swapped operands: each value to its (pixel row, channel column) of the staging tile,
    // biased on the way where PACK_OUT (fp16 tiles whose K is no multiple of 8).
    for_each_swapped(wt, lane, [&](int row, int col, acc_t& a) {
      const int n = n0 + col;
      if (n >= K) return;
      if constexpr (!PACK) {
        *reinterpret_cast<acc_t*>(smem + row * E_ROW + col * 4) = a;
      } else {
        const float rv = RES ? res_tile(rs, res, row, col) : 0.f;
        *reinterpret_cast<unsigned short*>(stg + stg_off(row, col * 2)) =
            (unsigned short)(pack_f16x2(fp_epi(a, EPI ? bias[n] : 0.f, rv), 0.f) & 0xFFFFu);
      }
    });
  } else if constexpr (!PACK) {
#pragma unroll
    for (int i = 0; i < WRT; ++i)
#pragma unroll
      for (int j = 0; j < EWCT; ++j)
#pragma unroll
        for (int rh = 0; rh < ROWS_H; ++rh) {
          const int row = wt.wm0 + i * ROWSTEP + rh * 8 + g, col = wt.wn0 + j * 8 + 2 * t;
          u32* dst = reinterpret_cast<u32*>(smem + row * E_ROW + col * 4);
          dst[0] = *reinterpret_cast<u32*>(&wt.acc[i][j][2 * rh]);
          dst[1] = *reinterpret_cast<u32*>(&wt.acc[i][j][2 * rh + 1]);
        }
  } else if constexpr (PREC == 0) {
    // fp16: bias + ReLU + convert in registers, one f16x2 word per row half.
#pragma unroll
    for (int j = 0; j < EWCT; ++j) {
      // Tile columns past K are never stored: skip their work (warp-uniform; layers with
      // fewer output channels than a tile, such as a segmentation head's K = 2).
      if (K % BN != 0 && n0 + wt.wn0 + j * 8 >= K) continue;
      const int col = wt.wn0 + j * 8 + 2 * t, n = n0 + col;
      const float b0 = (EPI && n < K) ? bias[n] : 0.f, b1 = (EPI && n + 1 < K) ? bias[n + 1] : 0.f;
#pragma unroll
      for (int i = 0; i < WRT; ++i)
#pragma unroll
        for (int rh = 0; rh < ROWS_H; ++rh) {
          const int row = wt.wm0 + i * ROWSTEP + rh * 8 + g;
          float r0 = 0.f, r1 = 0.f;
          if constexpr (RES) { r0 = res_tile(rs, res, row, col); r1 = res_tile(rs, res, row, col + 1); }
          *reinterpret_cast<u32*>(stg + stg_off(row, col * 2)) =
              pack_f16x2(fp_epi(wt.acc[i][j][2 * rh], b0, r0),
                         fp_epi(wt.acc[i][j][2 * rh + 1], b1, r1));
        }
    }
  } else {
    // int8 / int4: requantize in registers, then pack across the quad.
    constexpr int GROUP = ELEM_BITS == 8 ? 2 : 4;  // halves that share one 32-bit word set
    // Columns outer, row tiles inner: a group's scale and bias values are live for one group
    // only (with the row tiles outer the compiler keeps every column's in registers). They
    // are loaded before the row tiles' loop: the compiler cannot move loads of `scale` past
    // the staging stores, so loads inside it run once per row tile.
#pragma unroll
    for (int h0 = 0; h0 < HALVES; h0 += GROUP) {
      constexpr int NJ = GROUP / ROWS_H;  // tile columns of the group's halves
      float s0[NJ], s1[NJ], c0[NJ], c1[NJ];
#pragma unroll
      for (int jj = 0; jj < NJ; ++jj) {
        const int j = h0 / ROWS_H + jj, n = n0 + wt.wn0 + j * 8 + 2 * t;
        const bool in0 = j < EWCT && n < K, in1 = j < EWCT && n + 1 < K;
        s0[jj] = in0 ? scale[n] : 0.f; s1[jj] = in1 ? scale[n + 1] : 0.f;
        c0[jj] = in0 ? bias[n] : 0.f; c1[jj] = in1 ? bias[n + 1] : 0.f;
      }
#pragma unroll
      for (int i = 0; i < WRT; ++i) {
        // Each thread's two values of every half in the group: int8 in the low two bytes
        // (the upper two are not zeroed), int4 in the low byte.
        u32 bits[GROUP];
#pragma unroll
        for (int k = 0; k < GROUP; ++k) {
          bits[k] = 0;
          int j, rh;
          half_pos(h0 + k, j, rh);
          if (h0 + k < HALVES && (K % BN == 0 || n0 + wt.wn0 + j * 8 < K)) {  // columns < K
            float r0 = 0.f, r1 = 0.f;
            if constexpr (RES) {
              const int row = wt.wm0 + i * ROWSTEP + rh * 8 + g, col = wt.wn0 + j * 8 + 2 * t;
              r0 = res_tile(rs, res, row, col);
              r1 = res_tile(rs, res, row, col + 1);
            }
            const int jj = k / ROWS_H;
            const u32 q0 = requant_bits(wt.acc[i][j][2 * rh], s0[jj], c0[jj], r0);
            const u32 q1 = requant_bits(wt.acc[i][j][2 * rh + 1], s1[jj], c1[jj], r1);
            bits[k] = ELEM_BITS == 8 ? byte_perm(q0, q1, 0x0040)
                                     : ((q0 & 0xFu) | ((q1 & 0xFu) << 4));
          }
        }
        if constexpr (ELEM_BITS == 8) {
          // Even t keeps half 0 and receives its neighbour's half-0 bytes; odd t does half 1.
          const u32 send = (t & 1) ? bits[0] : bits[1];
          const u32 recv = shfl_xor(send, 1);
          const u32 word = (t & 1) ? byte_perm(recv, bits[1], 0x5410)
                                   : byte_perm(bits[0], recv, 0x5410);
          const int h = h0 + (t & 1);
          if (h < HALVES) {
            int j, rh;
            half_pos(h, j, rh);
            const int row = wt.wm0 + i * ROWSTEP + rh * 8 + g;
            const int colb = wt.wn0 + j * 8 + 4 * (t >> 1);  // bytes == channels for int8
            *reinterpret_cast<u32*>(stg + stg_off(row, colb)) = word;
          }
        } else {
          // 4x4 byte transpose across the quad: thread t gathers half t's 8 channels.
          const u32 mine = bits[0] | (bits[1] << 8) | (bits[2] << 16) | (bits[3] << 24);
          u32 word = 0;
#pragma unroll
          for (int src = 0; src < 4; ++src) {
            const u32 v = shfl_idx(mine, (lane & ~3) | src);
            word |= ((v >> (8 * t)) & 0xFFu) << (8 * src);
          }
          const int h = h0 + t;
          if (h < HALVES) {
            int j, rh;
            half_pos(h, j, rh);
            const int row = wt.wm0 + i * ROWSTEP + rh * 8 + g;
            const int colb = (wt.wn0 + j * 8) / 2;
            *reinterpret_cast<u32*>(stg + stg_off(row, colb)) = word;
          }
        }
      }
    }
  }
  if constexpr (TMA_ST) {
    // ---- bulk tensor stores: one thread, one box per (column box, 64 rows); the map clips
    // rows past M and columns past K.
    fence_proxy_async_smem();
    block_sync();
#if TC_PACK_OUT == 2  // only these builds' TensorMaps hold y's map
    if (tid == 0) {
      const u32 base = smem_addr(stg);
#pragma unroll 1
      for (int b = 0; b < NBOX; ++b)
#pragma unroll 1
        for (int r0 = 0; r0 < BM; r0 += BOX_ROWS)
          tma_store2(maps->y, base + (u32)(b * BM * SWB + r0 * SWB), n0 * (OUT_BITS / 8) + b * SWB,
                     m0 + r0);
      bulk_commit();
    }
#endif
    return;
  }
  if constexpr (B2B_WG) fence_proxy_async();  // the back-to-back wgmma reads the staged tile
  block_sync();

  // ---- second pass: shared -> global in VW-byte vectors (coalesced along the rows)
#pragma unroll 1
  for (int v = tid; v < BM * VPRO; v += THREADS) {
    const int row = v / VPRO, cv = v - row * VPRO;
    const int m = out_row(m0, row), n = n0 + cv * EV;
    if (m < 0 || n >= K) continue;
    u8* dst = y + out_off(m, n);
    if constexpr (PACK) {
      copy_vw<VW>(dst, stg + stg_off(row, cv * VW));
    } else {
      const u32* src = reinterpret_cast<const u32*>(smem + row * E_ROW) + cv * EV;
      u32 out[(VW + 3) / 4];
#pragma unroll
      for (int k = 0; k < (VW + 3) / 4; ++k) out[k] = 0;
#pragma unroll
      for (int e = 0; e < EV; ++e) {
        const int nn = n + e;
        u32 val;
        if constexpr (PREC == 3) {
          val = (u32)__float_as_int(fp_epi(__int_as_float((int)src[e]), EPI ? bias[nn] : 0.f));
        } else if constexpr (OUT_BITS == 32) {
          val = src[e];
        } else if constexpr (PREC == 0) {
          const float a = __int_as_float((int)src[e]);
          val = pack_f16x2(fp_epi(a, EPI ? bias[nn] : 0.f, res_at(res, m, nn)), 0.f) & 0xFFFFu;
        } else {
          val = (u32)requant((int)src[e], scale[nn], bias[nn], res_at(res, m, nn)) &
                (u32)((1ull << OUT_BITS) - 1);
        }
        const int bit = e * OUT_BITS;
        out[bit / 32] |= val << (bit % 32);
      }
      if constexpr (VW >= 4) {
#pragma unroll
        for (int k = 0; k < VW / 4; ++k) reinterpret_cast<u32*>(dst)[k] = out[k];
      } else if constexpr (VW == 2) {
        *reinterpret_cast<unsigned short*>(dst) = (unsigned short)out[0];
      } else {
        *dst = (u8)out[0];
      }
    }
  }
}
