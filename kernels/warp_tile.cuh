// Warp tile: WARP_ROW_TILES x WARP_COL_TILES instruction tiles per warp; ldmatrix from the
// swizzled shared rows into fragments, then mma.sync. With DUP_AWARE the A rows of the warp
// are pixels of the receptive field: a row's base pixel is decoded once per block and each
// filter tap adds a compile-time-shaped offset (the paper's static duplicate indexing).
// The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize
// Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources").
#pragma once

namespace cfg {
constexpr int NA = WRT * AM;      // A matrices per k-step
constexpr int NBM = WCT * BMAT;   // B matrices per k-step
constexpr int GA = NA / 4 + ((NA % 4) >= 2) + (NA % 2);  // ldmatrix instructions for A
constexpr int GBn = NBM / 4 + ((NBM % 4) >= 2) + (NBM % 2);
}  // namespace cfg

// Matrix index that this lane addresses in ldmatrix instruction g of a fragment of `total`.
template <int TOTAL>
__device__ __forceinline__ int lane_mat(int g, int lane) {
  constexpr int X4 = TOTAL / 4;
  if (g < X4) return 4 * g + (lane >> 3);
  if ((TOTAL % 4) >= 2 && g == X4) return 4 * X4 + ((lane >> 3) & 1);
  return TOTAL - 1;
}
template <int TOTAL>
__device__ __forceinline__ void ldsm_group(int g, u32 addr, u32* fr) {
  constexpr int X4 = TOTAL / 4;
  if (g < X4) {
    ldsm_x4(addr, fr[4 * g], fr[4 * g + 1], fr[4 * g + 2], fr[4 * g + 3]);
  } else if ((TOTAL % 4) >= 2 && g == X4) {
    ldsm_x2(addr, fr[4 * X4], fr[4 * X4 + 1]);
  } else {
    ldsm_x1(addr, fr[TOTAL - 1]);
  }
}

// fp32_tc sizes of the extra accumulator sets (1 element where a set does not exist).
namespace cfg {
constexpr int X2R = ACC_SETS >= 2 ? WRT : 1, X2C = ACC_SETS >= 2 ? WCT : 1;
constexpr int X3R = ACC_SETS >= 3 ? WRT : 1, X3C = ACC_SETS >= 3 ? WCT : 1;
}  // namespace cfg

struct WarpTile {
  // fp32_tc: acc holds hi*hi, summed outside the Tensor Core (round to nearest) per k-step;
  // acc2 the corrections hi*lo + lo*hi (binomial4: + lo*lo*2^-11; karatsuba: the product of
  // the sums (hi+lo)(hi+lo)); acc3 karatsuba's lo*lo. Both chained in the Tensor Core: their
  // truncation errors are scaled by 2^-11 in the result.
  acc_t acc[cfg::WRT][cfg::WCT][cfg::ACC_T];
  acc_t acc2[cfg::X2R][cfg::X2C][cfg::ACC_T];
  acc_t acc3[cfg::X3R][cfg::X3C][cfg::ACC_T];
  int a_row[cfg::GA];  // shared row (non-dup) or base row of the receptive field (dup)
  int a_ke[cfg::GA];   // 16-byte k chunk of this lane's matrix
  int b_row[cfg::GBn];
  int b_ke[cfg::GBn];
  int wm0, wn0, lane;

  __device__ __forceinline__ void init(int m0, int tid, const BlockLoader& ld) {
    using namespace cfg;
    const int warp = tid >> 5;
    lane = tid & 31;
    wm0 = (warp / BCW) * WRT * IM;
    wn0 = (warp % BCW) * WCT * 8;
#pragma unroll
    for (int i = 0; i < WRT; ++i)
#pragma unroll
      for (int j = 0; j < WCT; ++j)
#pragma unroll
        for (int c = 0; c < ACC_T; ++c) {
          acc[i][j][c] = 0;
          if constexpr (ACC_SETS >= 2) acc2[i % X2R][j % X2C][c] = 0;
          if constexpr (ACC_SETS >= 3) acc3[i % X3R][j % X3C][c] = 0;
        }
#pragma unroll
    for (int g = 0; g < GA; ++g) {
      const int mat = lane_mat<NA>(g, lane);
      const int i = mat / AM, e = mat % AM;
      const int m_loc = wm0 + i * IM + (e % (IM / 8)) * 8 + (lane & 7);
      a_ke[g] = e / (IM / 8);
      if constexpr (!DUP) {
        a_row[g] = m_loc;
      } else {
        const int mpl = m_loc / NB, ni = m_loc % NB;
        const int mp = m0 / NB + mpl;
        const int L = mp / Q, q = mp - (mp / Q) * Q, j = L - ld.L0;
        int pix;
        if constexpr (FULLROW) {
          const int t0 = REORDER ? j * SH + (L / P - ld.nb0) * GAP : j;
          pix = t0 * IN_COLS + q * SW;
        } else {
          pix = (REORDER ? j * R : j) * IN_COLS + mpl * SW;
        }
        if (m0 + m_loc >= M) pix = 0;  // rows past the end read any in-range cell
        a_row[g] = pix * NB + ni;
      }
    }
#pragma unroll
    for (int g = 0; g < GBn; ++g) {
      const int mat = lane_mat<NBM>(g, lane);
      b_row[g] = wn0 + (mat / BMAT) * 8 + (lane & 7);
      b_ke[g] = mat % BMAT;
    }
  }

  // Pixel offset of filter tap `tap` inside the receptive field (dup only).
  __device__ __forceinline__ int tap_offset(int tap) const {
    using namespace cfg;
    if constexpr (!DUP) return 0;
    else if constexpr (REORDER) {
      const int r = tap / S, s = tap - (tap / S) * S;
      return (FULLROW ? r * DH : r) * IN_COLS + s * DW;
    } else {
      return tap * DW;
    }
  }

  __device__ __forceinline__ void compute_taps(u32 abuf, u32 bbuf, int tap) {
    using namespace cfg;
    const int toff = tap_offset(tap) * NB;
    if constexpr (F32TC) {
      compute_taps_split(abuf, bbuf, tap, toff);
    } else {
#pragma unroll
      for (int ks = 0; ks < CHUNK; ++ks) {
        u32 afr[NA], bfr[NBM];
#pragma unroll
        for (int g = 0; g < GA; ++g) {
          const int row = a_row[g] + toff;
          ldsm_group<NA>(g, abuf + soff(row, ks * (KB / 16) + a_ke[g]), afr);
        }
#pragma unroll
        for (int g = 0; g < GBn; ++g) {
          ldsm_group<NBM>(g, bbuf + soff(tap * BN + b_row[g], ks * BMAT + b_ke[g]), bfr);
        }
#pragma unroll
        for (int i = 0; i < WRT; ++i)
#pragma unroll
          for (int j = 0; j < WCT; ++j) mma_tile(acc[i][j], &afr[i * AM], &bfr[j * BMAT]);
      }
    }
  }

  // fp32_tc: fragments of the hi and lo planes (same addressing), then per tile
  //   scaled3    hh -> acc (fresh mma + FADD), hl + lh -> acc2
  //   binomial4  as scaled3, + l * (l * 2^-11) -> acc2 (the 2^-22 term, in acc2's scale)
  //   karatsuba  hh -> acc, (h+l)(h+l) -> acc2, ll -> acc3; D = acc2 - acc - acc3 at the end
  __device__ __forceinline__ void compute_taps_split(u32 abuf, u32 bbuf, int tap, int toff) {
#if TC_PREC == 3
    using namespace cfg;
#pragma unroll
    for (int ks = 0; ks < CHUNK; ++ks) {
      u32 ah[NA], al[NA], bh[NBM], bl[NBM];
#pragma unroll
      for (int g = 0; g < GA; ++g) {
        const u32 off = soff(a_row[g] + toff, ks * (KB / 16) + a_ke[g]);
        ldsm_group<NA>(g, abuf + off, ah);
        ldsm_group<NA>(g, abuf + A_PLANE + off, al);
      }
#pragma unroll
      for (int g = 0; g < GBn; ++g) {
        const u32 off = soff(tap * BN + b_row[g], ks * BMAT + b_ke[g]);
        ldsm_group<NBM>(g, bbuf + off, bh);
        ldsm_group<NBM>(g, bbuf + B_PLANE + off, bl);
      }
      // binomial4: lo(w) * 2^-11 in fp16, so that the lo*lo product lands in acc2's scale
      // (it loses bits only where that falls below fp16's normal range: a 2^-22 term).
      // karatsuba: the operand sums hi + lo, rounded to fp16 (their rounding, scaled by
      // 2^-11 in the result, is what karatsuba trades for its missing fourth product).
      u32 bq[SPLIT == 1 ? NBM : 1], as[SPLIT == 2 ? NA : 1], bs[SPLIT == 2 ? NBM : 1];
      if constexpr (SPLIT == 1) {
#pragma unroll
        for (int k = 0; k < NBM; ++k) bq[k] = hmul2(bl[k], 0x10001000u);  // 2^-11 = 0x1000
      }
      if constexpr (SPLIT == 2) {
#pragma unroll
        for (int k = 0; k < NA; ++k) as[k] = hadd2(ah[k], al[k]);
#pragma unroll
        for (int k = 0; k < NBM; ++k) bs[k] = hadd2(bh[k], bl[k]);
      }
#pragma unroll
      for (int i = 0; i < WRT; ++i)
#pragma unroll
        for (int j = 0; j < WCT; ++j) {
          const u32* a_h = &ah[i * AM]; const u32* a_l = &al[i * AM];
          const u32* b_h = &bh[j * BMAT]; const u32* b_l = &bl[j * BMAT];
          float t[ACC_T];
          mma_f16_fresh(t, a_h, b_h);
#pragma unroll
          for (int c = 0; c < ACC_T; ++c) acc[i][j][c] += t[c];
          if constexpr (SPLIT == 2) {
            mma_tile(acc2[i % X2R][j % X2C], &as[i * AM], &bs[j * BMAT]);
            mma_tile(acc3[i % X3R][j % X3C], a_l, b_l);
          } else {
            mma_tile(acc2[i % X2R][j % X2C], a_h, b_l);
            mma_tile(acc2[i % X2R][j % X2C], a_l, b_h);
            if constexpr (SPLIT == 1) mma_tile(acc2[i % X2R][j % X2C], a_l, &bq[j * BMAT]);
          }
        }
    }
#endif
  }

  // fp32_tc: the sets -> one fp32 value per element, scaled back by 2^-(ex + ew).
  __device__ __forceinline__ void finalize(const float* amax) {
#if TC_PREC == 3
    using namespace cfg;
    // -(ex + ew) lies in [-324, 228]: three factors of at most 2^+-108 each.
    const int r = -(tc_exp_for(amax[0]) + tc_exp_for(amax[1]));
    const int r1 = r / 3, r2 = (r - r1) / 2, r3 = r - r1 - r2;
    const float d1 = pow2i(r1), d2 = pow2i(r2), d3 = pow2i(r3);
    constexpr float S11 = 1.f / 2048.f, S22 = S11 * S11;
#pragma unroll
    for (int i = 0; i < WRT; ++i)
#pragma unroll
      for (int j = 0; j < WCT; ++j)
#pragma unroll
        for (int c = 0; c < ACC_T; ++c) {
          const float h = acc[i][j][c], c2 = acc2[i % X2R][j % X2C][c];
          float v;
          if constexpr (SPLIT == 2) {
            const float l = acc3[i % X3R][j % X3C][c];
            const float d = (c2 - h) - l;  // the cross terms hl + lh
            v = fmaf(l, S22, fmaf(d, S11, h));
          } else {
            v = fmaf(c2, S11, h);
          }
          acc[i][j][c] = v * d1 * d2 * d3;
        }
#endif
  }

  __device__ __forceinline__ void compute_stage(u32 abuf, u32 bbuf, int /*it*/) {
    using namespace cfg;
    if constexpr (TAPS == 1) {
      compute_taps(abuf, bbuf, 0);
    } else {
#pragma unroll 1
      for (int tap = 0; tap < TAPS; ++tap) compute_taps(abuf, bbuf, tap);
    }
  }
};
