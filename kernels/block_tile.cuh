// Block tile: global -> shared memory loads of one pipeline stage.
//
// A stage holds BKC channels of A and B. Without DUP_AWARE it holds one filter tap (r, s):
// A is BM im2col rows (one per output pixel), B is BN weight rows. With DUP_AWARE the stage
// holds the block's receptive field instead (paper 3.1): each input pixel that the block's
// output pixels touch is loaded once into a "slot row" of the field, and the warps index
// duplicates statically (warp_tile.cuh). REORDER_INNER=1 (channels outer) puts all R*S taps
// of a channel block in one stage, so rows of the field shared by neighbouring output rows
// are also loaded once; REORDER_INNER=0 (filter rows outer) loads one filter row r per
// stage and dedups along the width only.
// The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize
// Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources").
//
// Shared rows are 16-byte chunks, XOR-swizzled so that the 8 rows of an ldmatrix phase
// land in distinct banks.
#pragma once

namespace cfg {
constexpr int JPR = FOLD ? TPS : VPR;                  // loads per shared row and stage
constexpr int A_VECS = BM * JPR;                       // im2col jobs per stage
constexpr int A_IT = (A_VECS + THREADS - 1) / THREADS;
constexpr bool A_PRE = A_IT <= 8;                      // keep pixel decodes in registers
constexpr int B_VECS = BN * TAPS * JPR;
constexpr int B_IT = (B_VECS + THREADS - 1) / THREADS;
constexpr int D_VECS = SLOTS * IN_COLS * NB * VPR;     // duplicate-aware jobs per stage
constexpr int D_IT = (D_VECS + THREADS - 1) / THREADS;
// Register-staged prefetch: at most 8 vectors (32 registers) are held across the math.
constexpr int PF_A = (REGPATH && !DUP && !FOLD) ? cmin(A_IT, 8) : 0;
constexpr int PF_B = (REGPATH && !FOLD) ? cmin(B_IT, 8 - PF_A) : 0;
constexpr int PF = PF_A + PF_B;
// fp32_tc: the loads past the prefetch go in batches of RB (RB loads in flight, then their
// splits and stores) instead of one load -> split -> store at a time.
constexpr int RB = 4;
// Incremental im2col addressing (cp.async im2col loads): a thread's jobs are THREADS vectors,
// i.e. RPP shared rows, apart in the same 16-byte column, so each job's destination and
// weight row are a compile-time stride from the first; per im2col job a pixel pointer and a
// mask of the filter taps that fall inside the image are set up once. A stage then costs one
// tap offset and, per job, a mask test and an address add (it was ~25 instructions per job).
constexpr bool INCR = !DUP && !FOLD && !REGPATH && !F32TC && A_PRE && B_IT <= 8 && R * S <= 32 &&
                      THREADS % (8 * VPR) == 0;
constexpr int RPP = THREADS / JPR;
// The im2col matrix of a 1x1, stride-1, unpadded NHWC layer is x itself ([N*H*W][Cp]).
constexpr bool PLAIN_M = !LAYOUT && !DUP && !FOLD && R == 1 && S == 1 && SH == 1 && SW == 1 &&
                         PH == 0 && PW == 0;
static_assert((NIT + SPLITK - 1) / SPLITK == TC_K_ITERS,
              "kernels/space.py:geometry's k_iters must equal the kernel's stages per block");
}  // namespace cfg

__device__ __forceinline__ int swz(int row) {
  using namespace cfg;
  if constexpr (NCA >= 8) return row & 7;
  else if constexpr (NCA == 4) return (row >> 1) & 3;
  else if constexpr (NCA == 2) return (row >> 2) & 1;
  else return 0;
}
// Shared byte offset of chunk `chunk` of row `row` in a buffer of SB-byte rows. Rows wider
// than one swizzle atom (wgmma, CHUNK 8) are stored per 8-row group as ATOM-byte atoms side
// by side; with one atom per row (every other build) this is row * SB + swizzled chunk.
__device__ __forceinline__ u32 soff(int row, int chunk) {
  using namespace cfg;
  return (u32)((row >> 3) * (8 * SB) + (chunk / NCA) * (8 * ATOM) + (row & 7) * ATOM +
               (((chunk % NCA) ^ swz(row)) << 4));
}

// A tile's first GEMM row and first output channel (TILES_N tiles along N per row of tiles).
__device__ __forceinline__ int tile_m0(int tile) { return (tile / cfg::TILES_N) * cfg::BM; }
__device__ __forceinline__ int tile_n0(int tile) { return (tile % cfg::TILES_N) * cfg::BN; }

// HALO: the image, band (its first output column) and first position in the band of the tile
// whose rows start at GEMM row m0 (tiles in image, band, position order: neighbours share
// input rows in L2).
struct HaloTile { int img, q0, v0; };
__device__ __forceinline__ HaloTile halo_tile(int m0) {
  using namespace cfg;
  const int mt = m0 / BM, img = mt / (HBANDS * HTILES), rem = mt - img * (HBANDS * HTILES);
  const int band = rem / HTILES;
  return {img, band * HCOLS, (rem - band * HTILES) * BM};
}
// The output pixel (GEMM row) of row `row` of the tile that starts at m0, or -1 where there is
// none (past M; HALO: a halo column, or past the band's last row).
__device__ __forceinline__ int out_row(int m0, int row) {
  using namespace cfg;
  if constexpr (HALO) {
    const HaloTile t = halo_tile(m0);
    const int v = t.v0 + row, p = v / HPITCH, ql = v - p * HPITCH, q = t.q0 + ql;
    return (ql < HCOLS && q < Q && p < P) ? (t.img * P + p) * Q + q : -1;
  } else {
    return m0 + row < M ? m0 + row : -1;
  }
}

struct StageIdx { int r, s, cb; };

__device__ __forceinline__ StageIdx stage_idx(int it) {
  using namespace cfg;
  StageIdx st;
  if constexpr (FOLD || HALO) {
    st.r = 0; st.s = 0; st.cb = it;  // the taps of stage it (fold_tap), or all of them (HALO)
  } else if constexpr (DUP) {
    if constexpr (REORDER) { st.r = 0; st.s = 0; st.cb = it; }
    else { st.cb = it % NCB; st.r = it / NCB; st.s = 0; }
  } else if constexpr (REORDER) {  // channels outer: (cb, r, s)
    st.s = it % S; st.r = (it / S) % R; st.cb = it / (R * S);
  } else {  // filter outer: (r, s, cb)
    st.cb = it % NCB; const int rs = it / NCB; st.r = rs / S; st.s = rs % S;
  }
  // CAT (1x1): x's channel blocks first, then x1's (conv.cu: CAT_EARLY)
  if constexpr (CAT) st.cb = st.cb < IT_X1 ? st.cb + CAT / BKC : st.cb - IT_X1;
  return st;
}

// A stage's operands, apart (W_EARLY: the weights before the grid-dependency wait).
constexpr int PART_A = 1, PART_B = 2, PART_AB = 3;

struct BlockLoader {
  const u8* x;
  const u8* x1;  // CAT: the input of the first CAT channels
  bool x_early;  // CAT_EARLY: wait for the kernel before ahead of x1's first stage
  bool w_early;  // W_EARLY: the prologue's weights before that wait (multistage_prologue)
  const u8* w;
  int m0, n0, tid;
  // duplicate-aware block origin: first output row (linear over images) and its column
  int L0, q0, nb0, p0;
  // im2col pixel decodes (A_PRE)
  const u8* a_ptr[cfg::A_PRE ? cfg::A_IT : 1];
  int a_ih[cfg::A_PRE ? cfg::A_IT : 1];
  int a_iw[cfg::A_PRE ? cfg::A_IT : 1];
  V4 pf[cfg::PF > 0 ? cfg::PF : 1];
  // INCR: in-image filter taps of each im2col job (bit r*S + s), the first jobs' shared
  // offsets, the weight pointer and output channel of the first B job, the channel vectors.
  u32 a_taps[cfg::INCR ? cfg::A_IT : 1];
  u32 a_dst, b_dst;
  const u8* b_src;
  int b_n, a_ch, b_ch;
  // fp32_tc: x * 2^ex and w * 2^ew as two power-of-two factors each (|e| may exceed 126).
  float xm1, xm2, wm1, wm2;

  __device__ __forceinline__ void a_decode(int i, int& row, int& ch, const u8*& ptr, int& ih0,
                                           int& iw0) const {
    using namespace cfg;
    const int v = tid + i * THREADS;
    int ni = 0, mpl;
    if constexpr (LAYOUT) {
      ni = v & 7; ch = (v >> 3) % VPR; mpl = v / (8 * VPR); row = mpl * 8 + ni;
    } else {
      ch = v % VPR; row = v / VPR; mpl = row;
    }
    const int m = m0 + row;
    if constexpr (PLAIN_M) {
      // A 1x1, stride-1, unpadded layer: the im2col row of pixel m is row m of the
      // [N*H*W][Cp] matrix, with no pixel decode (its divisions by P*Q and Q).
      ih0 = (m >= M || v >= A_VECS) ? -(1 << 20) : 0;
      iw0 = 0;
      ptr = x + (long long)m * PIXSTRIDE + ch * 16;
      return;
    }
    const int mp = m0 / NB + mpl;
    const int nb = mp / (P * Q);
    const int rem = mp - nb * (P * Q);
    const int p = rem / Q, q = rem - (rem / Q) * Q;
    ih0 = p * SH - PH;
    iw0 = q * SW - PW;
    if (m >= M || v >= A_VECS) ih0 = -(1 << 20);  // never in bounds
    ptr = x + (long long)nb * IMGSTRIDE + (LAYOUT ? ni * 16 : 0) + ch * CVSTRIDE +
          (long long)(ih0 * W + iw0) * PIXSTRIDE;
  }

  // ---- FOLD_TAPS: job i of a thread is shared row tid / TPS + i * RPP, tap slot tid % TPS
  // (the same slot in every row and stage, so the tap's (r, s) is decoded once per stage).
  __device__ __forceinline__ void fold_decode(int i, const u8*& ptr, int& ih0, int& iw0) const {
    using namespace cfg;
    const int row = tid / TPS + i * RPP, m = m0 + row;
    const int nb = m / (P * Q), rem = m - nb * (P * Q);
    const int p = rem / Q, q = rem - p * Q;
    ih0 = p * SH - PH;
    iw0 = q * SW - PW;
    if (m >= M || tid + i * THREADS >= A_VECS) ih0 = -(1 << 20);  // never in bounds
    ptr = x + (long long)nb * IMGSTRIDE + (long long)(ih0 * W + iw0) * CB;
  }
  // Tap vector copy (TV bytes) into shared memory; invalid ones are zeros.
  __device__ __forceinline__ void fold_put(u32 dst, const u8* src, bool valid) {
    using namespace cfg;
    if constexpr (REGPATH) {
      if constexpr (TV == 16) sts16(dst, ldg16(src, valid));
      else if constexpr (TV == 8) { const U2 v = ldg8(src, valid); sts8(dst, v.x, v.y); }
      else sts4(dst, ldg4(src, valid));
    } else {
      cp_async_tv<TV>(dst, valid ? (const void*)src : (const void*)x, valid);
    }
  }
  template <int PART>
  __device__ __forceinline__ void load_stage_fold(int it, u32 abuf, u32 bbuf) {
    using namespace cfg;
    const int j = tid % TPS, tap = it * TPS + j, row0 = tid / TPS;
    const int r = tap / S, s = tap - r * S;
    const bool in_k = tap < R * S;
    const long long xoff = (long long)(r * DH * W + s * DW) * CB;
    const u32 col = soff(row0, j * TV / 16) + (u32)(j * TV % 16);
    auto a_one = [&](int i, const u8* ptr, int ih0, int iw0) {
      // Rows RPP apart keep their swizzle phase when RPP is a multiple of 8: one add.
      const int row = row0 + i * RPP;
      const u32 dst = (RPP % 8 == 0) ? col + (u32)(i * RPP / 8) * (u32)(8 * SB)
                                     : soff(row, j * TV / 16) + (u32)(j * TV % 16);
      const bool ok = in_k && (unsigned)(ih0 + r * DH) < (unsigned)H &&
                      (unsigned)(iw0 + s * DW) < (unsigned)W;
      if (A_VECS % THREADS == 0 || tid + i * THREADS < A_VECS) fold_put(abuf + dst, ptr + xoff, ok);
    };
    if constexpr (!(PART & PART_A)) {
    } else if constexpr (A_PRE) {
#pragma unroll
      for (int i = 0; i < A_IT; ++i) a_one(i, a_ptr[i], a_ih[i], a_iw[i]);
    } else {
#pragma unroll 1
      for (int i = 0; i < A_IT; ++i) {
        const u8* ptr; int ih0, iw0;
        fold_decode(i, ptr, ih0, iw0);
        a_one(i, ptr, ih0, iw0);
      }
    }
    if constexpr (!(PART & PART_B)) return;
    // Weights: row n holds the R*S taps of TV bytes back to back (KRSC, C padded to TV).
    const u8* wsrc = w + ((long long)(n0 + row0) * (R * S) + tap) * TV;
#pragma unroll 4
    for (int i = 0; i < B_IT; ++i) {
      const int row = row0 + i * RPP;
      const u32 dst = (RPP % 8 == 0) ? col + (u32)(i * RPP / 8) * (u32)(8 * SB)
                                     : soff(row, j * TV / 16) + (u32)(j * TV % 16);
      const bool ok = in_k && n0 + row < K;
      if (B_VECS % THREADS == 0 || tid + i * THREADS < B_VECS)
        fold_put(bbuf + dst, wsrc + (long long)i * RPP * (R * S) * TV, ok);
    }
  }

  __device__ __forceinline__ void init(const Inputs& in, int m0_, int n0_, int tid_) {
    using namespace cfg;
    x = in.x; x1 = in.x1; w = in.w; x_early = in.x_early; w_early = in.w_early;
    m0 = m0_; n0 = n0_; tid = tid_;
    const int mp0 = m0 / NB;
    L0 = mp0 / Q; q0 = mp0 - L0 * Q; nb0 = L0 / P; p0 = L0 - nb0 * P;
    if constexpr (FOLD) {
      if constexpr (A_PRE) {
#pragma unroll
        for (int i = 0; i < A_IT; ++i) fold_decode(i, a_ptr[i], a_ih[i], a_iw[i]);
      }
      return;
    }
    if constexpr (A_PRE && !DUP) {
#pragma unroll
      for (int i = 0; i < A_IT; ++i) {
        int row, ch;
        a_decode(i, row, ch, a_ptr[i], a_ih[i], a_iw[i]);
        if (i == 0) { a_dst = soff(row, ch); a_ch = ch; }
      }
    }
    if constexpr (INCR) {
#pragma unroll
      for (int i = 0; i < A_IT; ++i) {
        u32 cols = 0, m = 0;  // in-image filter columns, then rows x columns
        for (int s = 0; s < S; ++s)
          cols |= (u32)((unsigned)(a_iw[i] + s * DW) < (unsigned)W) << s;
        for (int r = 0; r < R; ++r)
          if ((unsigned)(a_ih[i] + r * DH) < (unsigned)H) m |= cols << (r * S);
        a_taps[i] = m;
      }
      b_ch = tid % VPR;
      const int row = tid / VPR;
      b_n = n0 + row;
      b_dst = soff(row, b_ch);
      b_src = w + (long long)b_n * R * S * CB + b_ch * 16;
    }
  }

  // fp32_tc: the per-tensor exponents from {amax_x, amax_w} (conv.cu's tensor contract).
  __device__ __forceinline__ void init_split(const float* amax) {
#if TC_PREC == 3
    const int ex = tc_exp_for(amax[0]), ew = tc_exp_for(amax[1]);
    xm1 = pow2i(ex / 2); xm2 = pow2i(ex - ex / 2);
    wm1 = pow2i(ew / 2); wm2 = pow2i(ew - ew / 2);
#endif
  }

  // ---- one job of each kind: where it comes from, where it goes, whether it is real
  __device__ __forceinline__ bool a_job(int i, const StageIdx& st, const u8*& src, int& row,
                                        int& ch) const {
    using namespace cfg;
    const u8* ptr; int ih0, iw0;
    if constexpr (A_PRE) {
      ptr = a_ptr[i]; ih0 = a_ih[i]; iw0 = a_iw[i];
      const int v = tid + i * THREADS;
      if constexpr (LAYOUT) { ch = (v >> 3) % VPR; row = (v / (8 * VPR)) * 8 + (v & 7); }
      else { ch = v % VPR; row = v / VPR; }
    } else {
      a_decode(i, row, ch, ptr, ih0, iw0);
    }
    const int ih = ih0 + st.r * DH, iw = iw0 + st.s * DW;
    if constexpr (CAT) {
      // 1x1 and unpadded: ih is in the image exactly for the tile's rows inside M
      src = st.cb < CAT / BKC
                ? x1 + (long long)(m0 + row) * CAT_B + (st.cb * VPR + ch) * 16
                : ptr + (st.cb - CAT / BKC) * VPR * 16;
    } else {
      src = ptr + (st.r * DH * W + st.s * DW) * PIXSTRIDE + st.cb * VPR * CVSTRIDE;
    }
    return (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W &&
           st.cb * BKC + ch * CV16 < C;
  }

  // Duplicate-aware job v: returns false if the slot cell is never read (skip it);
  // `valid` false means zero-fill (padding, tails).
  __device__ __forceinline__ bool d_job(int v, const StageIdx& st, const u8*& src, bool& valid,
                                        int& row, int& ch) const {
    using namespace cfg;
    int ni = 0, pix;
    if constexpr (LAYOUT) { ni = v & 7; ch = (v >> 3) % VPR; pix = v / (8 * VPR); }
    else { ch = v % VPR; pix = v / VPR; }
    const int t = pix / IN_COLS, c = pix - t * IN_COLS;
    row = pix * NB + ni;
    int nb, ih, iw;
    bool needed;
    if constexpr (FULLROW) {
      iw = c - PW;
      if constexpr (REORDER) {
        const int u = t + p0 * SH, b = u / PG, uu = u - b * PG;
        nb = nb0 + b; ih = uu - PH;
        needed = nb < NBT && uu <= (P - 1) * SH + (R - 1) * DH;
      } else {
        const int L = L0 + t; nb = L / P;
        ih = (L - nb * P) * SH - PH + st.r * DH;
        needed = L < NBT * P;
      }
    } else {
      int j, rr;
      if constexpr (REORDER) { j = t / R; rr = t - j * R; } else { j = t; rr = st.r; }
      const int L = L0 + j; nb = L / P;
      ih = (L - nb * P) * SH - PH + rr * DH;
      iw = (q0 - j * Q) * SW - PW + c;
      needed = L < NBT * P &&
               (j == 0 ? c < (Q - q0 - 1) * SW + (S - 1) * DW + 1 : c >= (Q - q0) * SW);
    }
    needed = needed && v < D_VECS;
    valid = (unsigned)ih < (unsigned)H && (unsigned)iw < (unsigned)W &&
            st.cb * BKC + ch * CV16 < C;
    src = x + (long long)nb * IMGSTRIDE + (LAYOUT ? ni * 16 : 0) +
          (long long)(ih * W + iw) * PIXSTRIDE + (st.cb * VPR + ch) * CVSTRIDE;
    return needed;
  }

  __device__ __forceinline__ bool b_job(int i, const StageIdx& st, const u8*& src, int& row,
                                        int& ch) const {
    using namespace cfg;
    const int v = tid + i * THREADS;
    ch = v % VPR;
    row = v / VPR;
    const int tap = row / BN, n = n0 + (row - tap * BN);
    int r = st.r, s = st.s;
    if constexpr (DUP) {
      if constexpr (REORDER) { r = tap / S; s = tap - r * S; } else { s = tap; }
    }
    src = w + ((long long)(n * R + r) * S + s) * CB + st.cb * GB + ch * 16;
    return v < B_VECS && n < K && st.cb * BKC + ch * CV16 < C;
  }

  // ---- sinks
  __device__ __forceinline__ void put_async(u32 buf, int row, int ch, const u8* src, bool valid) {
    cp_async16(buf + soff(row, ch), valid ? (const void*)src : (const void*)x, valid);
  }
  // op: 0 for A (activations), 1 for B (weights).
  __device__ __forceinline__ void put_regs(u32 buf, int row, int ch, const V4& v, int op) {
    using namespace cfg;
    if constexpr (F32TC) {
#if TC_PREC == 3
      // 4 floats -> 4 hi halves (8 bytes) in the hi plane and 4 lo halves at the same place
      // of the lo plane; global vector ch holds channels 4ch..4ch+3 = half of chunk ch/2.
      const float m1 = op ? wm1 : xm1, m2 = op ? wm2 : xm2;
      u32 h0, l0, h1, l1;
      split_f32x2(__int_as_float((int)v.x) * m1 * m2, __int_as_float((int)v.y) * m1 * m2, h0, l0);
      split_f32x2(__int_as_float((int)v.z) * m1 * m2, __int_as_float((int)v.w) * m1 * m2, h1, l1);
      const u32 off = soff(row, ch >> 1) + (u32)((ch & 1) << 3);
      sts8(buf + off, h0, h1);
      sts8(buf + (u32)(op ? B_PLANE : A_PLANE) + off, l0, l1);
#endif
    } else if constexpr (INT4_S8) {
      V4 lo, hi;
      unpack_s4_word(v.x, lo.x, lo.y);
      unpack_s4_word(v.y, lo.z, lo.w);
      unpack_s4_word(v.z, hi.x, hi.y);
      unpack_s4_word(v.w, hi.z, hi.w);
      sts16(buf + soff(row, 2 * ch), lo);
      sts16(buf + soff(row, 2 * ch + 1), hi);
    } else {
      sts16(buf + soff(row, ch), v);
    }
  }

  // ---- cp.async path: the whole stage; with incremental addressing or folded taps PART says
  // which operands (W_EARLY's prologue issues B first)
  template <int PART = PART_AB>
  __device__ __forceinline__ void load_stage(int it, u32 abuf, u32 bbuf) {
    using namespace cfg;
    static_assert(PART == PART_AB || INCR || FOLD,
                  "the operands of a stage apart: incremental addressing or folded taps");
    if constexpr (CAT_EARLY) {
      if (x_early && it == IT_X1) grid_dependency_wait();
    }
    if constexpr (FOLD) {
      load_stage_fold<PART>(it, abuf, bbuf);
      return;
    }
    const StageIdx st = stage_idx(it);
    if constexpr (INCR) {
      // Jobs whose address lands outside the tensors (padding, tails) copy 0 bytes: cp.async
      // zero-fills and reads nothing.
      const int tap = st.r * S + st.s;
      const long long xoff = (long long)(st.r * DH * W + st.s * DW) * PIXSTRIDE +
                             (st.cb - CAT / BKC) * VPR * CVSTRIDE;
      const int woff = tap * CB + st.cb * GB;
      const bool a_c = C % BKC == 0 || st.cb * BKC + a_ch * CV16 < C;
      const bool b_c = C % BKC == 0 || st.cb * BKC + b_ch * CV16 < C;
      if constexpr (!(PART & PART_A)) {
      } else if (CAT && st.cb < CAT / BKC) {
        // x1's rows are RPP pixels apart as the jobs' shared rows are
        const u8* s1 = x1 + (long long)(m0 + tid / VPR) * CAT_B + (st.cb * VPR + a_ch) * 16;
#pragma unroll
        for (int i = 0; i < A_IT; ++i)
          if (A_VECS % THREADS == 0 || tid + i * THREADS < A_VECS)
            cp_async16(abuf + a_dst + (u32)(i * RPP * SB), s1 + (long long)i * RPP * CAT_B,
                       a_c && (a_taps[i] & 1u));
      } else {
#pragma unroll
        for (int i = 0; i < A_IT; ++i)
          if (A_VECS % THREADS == 0 || tid + i * THREADS < A_VECS)
            cp_async16(abuf + a_dst + (u32)(i * RPP * SB), a_ptr[i] + xoff,
                       a_c && ((a_taps[i] >> tap) & 1u));
      }
      if constexpr ((PART & PART_B) != 0) {
#pragma unroll
        for (int i = 0; i < B_IT; ++i)
          if (B_VECS % THREADS == 0 || tid + i * THREADS < B_VECS)
            cp_async16(bbuf + b_dst + (u32)(i * RPP * SB),
                       b_src + woff + (long long)i * RPP * R * S * CB, b_c && b_n + i * RPP < K);
      }
      return;
    }
    const u8* src; int row, ch;
    if constexpr (DUP) {
#pragma unroll 2
      for (int i = 0; i < D_IT; ++i) {
        bool valid;
        if (d_job(tid + i * THREADS, st, src, valid, row, ch)) put_async(abuf, row, ch, src, valid);
      }
    } else if constexpr (A_PRE) {
#pragma unroll
      for (int i = 0; i < A_IT; ++i) {
        const bool valid = a_job(i, st, src, row, ch);
        if (tid + i * THREADS < A_VECS) put_async(abuf, row, ch, src, valid);
      }
    } else {
      // Many jobs per thread: a rolled loop that decodes each pixel where it is used, so
      // that the compiler cannot hoist A_IT decodes into live registers (they would spill).
#pragma unroll 1
      for (int i = 0; i < A_IT; ++i) {
        const bool valid = a_job(i, st, src, row, ch);
        if (tid + i * THREADS < A_VECS) put_async(abuf, row, ch, src, valid);
      }
    }
    if constexpr (B_IT <= 8) {
#pragma unroll
      for (int i = 0; i < B_IT; ++i) {
        const bool valid = b_job(i, st, src, row, ch);
        if (tid + i * THREADS < B_VECS) put_async(bbuf, row, ch, src, valid);
      }
    } else {
#pragma unroll 1
      for (int i = 0; i < B_IT; ++i) {
        const bool valid = b_job(i, st, src, row, ch);
        if (tid + i * THREADS < B_VECS) put_async(bbuf, row, ch, src, valid);
      }
    }
  }

  // ---- fp32_tc staging ring (F32_ASYNC): job v's 16 bytes land at sbuf + v*16 (A jobs, then
  // B jobs from sbuf + A_STAGE: fp32 stages are exactly as large as their hi + lo planes);
  // each thread later splits exactly the jobs it copied, so no barrier sits in between.
  __device__ __forceinline__ void stage_async(int it, u32 sbuf) {
    using namespace cfg;
    const StageIdx st = stage_idx(it);
    const u8* src; int row, ch;
    auto put = [&](u32 dst, bool valid) {
      cp_async16(dst, valid ? (const void*)src : (const void*)x, valid);
    };
    if constexpr (DUP) {
#pragma unroll 2
      for (int i = 0; i < D_IT; ++i) {
        const int v = tid + i * THREADS;
        bool valid;
        if (d_job(v, st, src, valid, row, ch)) put(sbuf + (u32)(v * 16), valid);
      }
    } else if constexpr (A_PRE) {
#pragma unroll
      for (int i = 0; i < A_IT; ++i) {
        const bool valid = a_job(i, st, src, row, ch);
        const int v = tid + i * THREADS;
        if (v < A_VECS) put(sbuf + (u32)(v * 16), valid);
      }
    } else {
#pragma unroll 1
      for (int i = 0; i < A_IT; ++i) {
        const bool valid = a_job(i, st, src, row, ch);
        const int v = tid + i * THREADS;
        if (v < A_VECS) put(sbuf + (u32)(v * 16), valid);
      }
    }
#pragma unroll 2
    for (int i = 0; i < B_IT; ++i) {
      const bool valid = b_job(i, st, src, row, ch);
      const int v = tid + i * THREADS;
      if (v < B_VECS) put(sbuf + (u32)(A_STAGE + v * 16), valid);
    }
  }
  __device__ __forceinline__ void split_stage(int it, u32 sbuf, u32 abuf, u32 bbuf) {
    using namespace cfg;
    if constexpr (DUP) {
      const StageIdx st = stage_idx(it);
      const u8* src; int row, ch;
#pragma unroll 2
      for (int i = 0; i < D_IT; ++i) {
        const int v = tid + i * THREADS;
        bool valid;
        if (d_job(v, st, src, valid, row, ch)) put_regs(abuf, row, ch, lds16(sbuf + (u32)(v * 16)), 0);
      }
    } else {
#pragma unroll 2
      for (int i = 0; i < A_IT; ++i) {
        const int v = tid + i * THREADS;
        int row, ch;  // as a_job places job v
        if constexpr (LAYOUT) { ch = (v >> 3) % VPR; row = (v / (8 * VPR)) * 8 + (v & 7); }
        else { ch = v % VPR; row = v / VPR; }
        if (v < A_VECS) put_regs(abuf, row, ch, lds16(sbuf + (u32)(v * 16)), 0);
      }
    }
#pragma unroll 2
    for (int i = 0; i < B_IT; ++i) {
      const int v = tid + i * THREADS;  // as b_job places job v
      if (v < B_VECS) put_regs(bbuf, v / VPR, v % VPR, lds16(sbuf + (u32)(A_STAGE + v * 16)), 1);
    }
  }

  // ---- register path
  template <int FROM>
  __device__ __forceinline__ void a_rest_sync(const StageIdx& st, u32 abuf) {
    using namespace cfg;
    const u8* src; int row, ch;
    if constexpr (F32TC) {
      // Batches of RB jobs: loads first (ldg16 is volatile, so they issue in this order),
      // then the splits and stores.
      auto batch = [&](int i0) {
        V4 v[RB]; int rr[RB], cc[RB]; bool put[RB];
#pragma unroll
        for (int b = 0; b < RB; ++b) {
          const int i = i0 + b;
          bool valid = false;
          src = x; row = 0; ch = 0;
          if constexpr (DUP) {
            put[b] = i < D_IT && d_job(tid + i * THREADS, st, src, valid, row, ch);
          } else {
            put[b] = i < A_IT && tid + i * THREADS < A_VECS;
            valid = put[b] && a_job(i, st, src, row, ch);
          }
          v[b] = ldg16(src, put[b] && valid);
          rr[b] = row; cc[b] = ch;
        }
#pragma unroll
        for (int b = 0; b < RB; ++b)
          if (put[b]) put_regs(abuf, rr[b], cc[b], v[b], 0);
      };
      if constexpr (A_PRE && !DUP) {
        // the pixel decodes are register arrays: their index must be a constant
#pragma unroll
        for (int i0 = FROM; i0 < A_IT; i0 += RB) batch(i0);
      } else {
#pragma unroll 1
        for (int i0 = DUP ? 0 : FROM; i0 < (DUP ? D_IT : A_IT); i0 += RB) batch(i0);
      }
    } else if constexpr (DUP) {
#pragma unroll 1
      for (int i = 0; i < D_IT; ++i) {
        bool valid;
        if (d_job(tid + i * THREADS, st, src, valid, row, ch))
          put_regs(abuf, row, ch, ldg16(src, valid), 0);
      }
    } else {
#pragma unroll 1
      for (int i = FROM; i < A_IT; ++i) {
        const bool valid = a_job(i, st, src, row, ch);
        if (tid + i * THREADS < A_VECS) put_regs(abuf, row, ch, ldg16(src, valid), 0);
      }
    }
  }
  template <int FROM>
  __device__ __forceinline__ void b_rest_sync(const StageIdx& st, u32 bbuf) {
    using namespace cfg;
    const u8* src; int row, ch;
    if constexpr (F32TC) {
#pragma unroll 1
      for (int i0 = FROM; i0 < B_IT; i0 += RB) {
        V4 v[RB]; int rr[RB], cc[RB]; bool put[RB];
#pragma unroll
        for (int b = 0; b < RB; ++b) {
          const int i = i0 + b;
          src = w; row = 0; ch = 0;
          put[b] = i < B_IT && tid + i * THREADS < B_VECS;
          const bool valid = put[b] && b_job(i, st, src, row, ch);
          v[b] = ldg16(src, valid);
          rr[b] = row; cc[b] = ch;
        }
#pragma unroll
        for (int b = 0; b < RB; ++b)
          if (put[b]) put_regs(bbuf, rr[b], cc[b], v[b], 1);
      }
    } else {
#pragma unroll 1
      for (int i = FROM; i < B_IT; ++i) {
        const bool valid = b_job(i, st, src, row, ch);
        if (tid + i * THREADS < B_VECS) put_regs(bbuf, row, ch, ldg16(src, valid), 1);
      }
    }
  }
  __device__ __forceinline__ void load_stage_sync(int it, u32 abuf, u32 bbuf) {
    if constexpr (cfg::FOLD) {
      load_stage_fold<PART_AB>(it, abuf, bbuf);
      return;
    }
    const StageIdx st = stage_idx(it);
    a_rest_sync<0>(st, abuf);
    b_rest_sync<0>(st, bbuf);
  }
  // Issue the next stage's first PF loads into registers (they fly during the math).
  __device__ __forceinline__ void prefetch_regs(int it) {
    using namespace cfg;
    const StageIdx st = stage_idx(it);
    const u8* src; int row, ch;
#pragma unroll
    for (int i = 0; i < PF_A; ++i) {
      const bool valid = a_job(i, st, src, row, ch) && tid + i * THREADS < A_VECS;
      pf[i] = ldg16(src, valid);
    }
#pragma unroll
    for (int i = 0; i < PF_B; ++i) {
      const bool valid = b_job(i, st, src, row, ch) && tid + i * THREADS < B_VECS;
      pf[PF_A + i] = ldg16(src, valid);
    }
  }
  __device__ __forceinline__ void finish_regs(int it, u32 abuf, u32 bbuf) {
    using namespace cfg;
    if constexpr (FOLD) {  // no register prefetch: the next stage's taps load after the math
      load_stage_fold<PART_AB>(it, abuf, bbuf);
      return;
    }
    const StageIdx st = stage_idx(it);
    const u8* src; int row, ch;
#pragma unroll
    for (int i = 0; i < PF_A; ++i) {
      a_job(i, st, src, row, ch);
      if (tid + i * THREADS < A_VECS) put_regs(abuf, row, ch, pf[i], 0);
    }
#pragma unroll
    for (int i = 0; i < PF_B; ++i) {
      b_job(i, st, src, row, ch);
      if (tid + i * THREADS < B_VECS) put_regs(bbuf, row, ch, pf[PF_A + i], 1);
    }
    a_rest_sync<PF_A>(st, abuf);
    b_rest_sync<PF_B>(st, bbuf);
  }
};
