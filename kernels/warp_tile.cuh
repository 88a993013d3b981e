// Warp tile: WARP_ROW_TILES x WARP_COL_TILES instruction tiles per warp; ldmatrix from the
// swizzled shared rows into fragments, then mma.sync. With DUP_AWARE the A rows of the warp
// are pixels of the receptive field: a row's base pixel is decoded once per block and each
// filter tap adds a compile-time-shaped offset (the paper's static duplicate indexing).
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

struct WarpTile {
  acc_t acc[cfg::WRT][cfg::WCT][cfg::ACC_T];
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
        for (int c = 0; c < ACC_T; ++c) acc[i][j][c] = 0;
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
