// tctune: one templated implicit-GEMM conv2d on Tensor Cores (mma.sync, inline PTX).
//
// GEMM view: M = N*P*Q output pixels, N = K output channels, reduced over R*S*C.
// Every build is one (shape, precision, sm, schedule, epilogue): all of them arrive as
// integer -D defines written by kernels/build.py from the enumerated schedule space, never
// as free text. The shape is a compile-time constant because the duplicate-aware load
// (paper 3.1) indexes the receptive field statically.
// The paper: Choi, Kwon, Lee, Choi and Lim, "Learning from Distinctive Candidates to Optimize
// Reduced-Precision Convolution Program on Tensor Cores", 2022 (docs/design.md, "Sources").
//
// Hardware levels, as in CUTLASS:
//   instruction_tile.cuh  mma.sync / ldmatrix / cp.async wrappers
//   block_tile.cuh        global -> shared loads of a stage (im2col, duplicate-aware, or
//                         folded taps), cp.async or staged through registers; which output
//                         pixel a tile row is (HALO's tiles are runs of a band's positions)
//   tma.cuh               bulk tensor copies and mbarriers (TMA=1, 2), the math warps' barrier
//   pipeline*.cuh         the main loop: one header per pipeline (TMA, its copies issued by a
//                         math warp's thread or by a producer warp, whose tiles two
//                         ping-pong consumers may take in turn; fp32_tc split, cp.async
//                         multistage, register-staged), one entry point each
//   warp_tile.cuh         shared -> register fragments and the warp's mma loop
//   warpgroup_tile.cuh    the same for wgmma (MMA=wgmma): warpgroup tiles read from shared
//                         (SWAP_AB: the weights as the instruction's A, the pixels as its B)
//   epilogue.cuh          split-K fix-up, requantize / bias / residual / ReLU, packing, stores
//                         (16-byte vectors, or bulk tensor stores with PACK_OUT=2)
//   b2b.cuh               a back-to-back 1x1 conv over the block's staged output tile (B2B)
//
// Tensor contracts (kernels/reference.py builds them):
//   x: NHWC [N][H][W][Cp] or NHWCnc [N/8][H][W][Cp/c][8][c]; Cp = C rounded up to the
//      16-byte channel vector c (zero channels added by the harness: any C works); with
//      FOLD_TAPS, C rounded up to one tap vector of 4, 8 or 16 bytes (the stem's 3 -> 4).
//   w: KRSC [K][R][S][Cp].  int4 is packed two per byte, element 2i in the low nibble.
//   y: NHWC [N][P][Q][K] or NHWCnc [N/8][P][Q][K/co][8][co] of the epilogue's output type.
//   ready (after the counters): which inputs were complete before the kernel just before this
//      one on the stream started (their writers ran before it), so that with PDL the block
//      reads them before its grid-dependency wait: READY_W the weights (the first stages'
//      weights: W_EARLY), READY_X a CAT build's x (x's channels are reduced first: CAT_EARLY),
//      READY_RES the residual (a residual tile copied ahead: RES_EARLY). 0: none.
//   x1 (CAT builds only, after `ready`): [N][P][Q][CAT], the first CAT reduction channels;
//      x then holds the other C - CAT, read at the layer's stride (a 1x1 unpadded NHWC layer).
//   res, res_scale (residual builds only, after x1 or `ready`): a tensor of y's shape, layout
//      and type added in the epilogue, y = act(acc * scale + bias + res * res_scale) (int8;
//      fp16: + res, res_scale unused).
//   w2, scale2, bias2, y2 (B2B builds only, after res): a 1x1 conv of B2B output channels
//      over y, run by the same block on its staged output rows: w2 [B2B][K] of x's type,
//      y2 [N][P][Q][B2B] = act(acc2 * scale2 + bias2) as y's epilogue without a residual.
//   maps (TMA=1 builds only, by value after the other arguments): the tensor maps of x
//      (im2col; tiled [N*H*W][Cp] with PLAIN_A) and w, and with PACK_OUT=2 of y (tiled,
//      bytes), 128 bytes each
//      (kernels/launch.py encodes them per tensor pointer).
//   fp32_tc (PREC 3): x, w and y are float32; `scale` points to two floats {amax_x, amax_w}
//      (max |x|, max |w|, or any bounds of them) from which every thread derives the same
//      per-tensor power-of-two exponents (tc_exp_for, below); 0 means "do not scale".

#ifndef TC_PREC
#error "built by kernels/build.py: the shape, schedule and epilogue are -D defines"
#endif
#ifndef TC_SPLIT
#define TC_SPLIT 0  // defined by the build for fp32_tc only (other builds keep their keys)
#endif
#ifndef TC_MMA
#define TC_MMA 0  // 1: the wgmma instruction tile (sm_90a), see warpgroup_tile.cuh
#endif
#ifndef TC_TMA
#define TC_TMA 0  // 1: stages loaded by the Tensor Memory Accelerator (wgmma only), see tma.cuh;
                  // 2: the same, issued by a producer warp of its own (pipeline_tma.cuh)
#endif
#ifndef TC_RES
#define TC_RES 0  // 1: the epilogue adds a residual tensor of the output's shape (epilogue.cuh)
#endif
#ifndef TC_RES_AHEAD
#define TC_RES_AHEAD 0  // 1: its tile is copied in while the main loop runs (kernels/space.py)
#endif
#ifndef TC_FOLD_TAPS
#define TC_FOLD_TAPS 0  // 1: few channels, (r, s, c) packed densely (block_tile.cuh: fold)
#endif
#ifndef TC_PERSIST
#define TC_PERSIST 0  // n >= 1: a persistent grid of n blocks per SM (conv_persistent below)
#endif
#ifndef TC_PLAIN_A
#define TC_PLAIN_A 0  // 1: TMA copies A as the plain [N*H*W][C] matrix (1x1, stride 1, pad 0)
#endif
#ifndef TC_PINGPONG
#define TC_PINGPONG 0  // 1: two consumers take the persistent block's tiles in turn
#endif
#ifndef TC_HALO
#define TC_HALO 0  // 1: a stage is one input patch read by every filter tap (block_tile.cuh)
#endif
#ifndef TC_HALO_COLS
#define TC_HALO_COLS 1  // HALO: output columns of a band (kernels/space.py: halo_tiling)
#endif
#ifndef TC_SWAP_AB
#define TC_SWAP_AB 0  // 1: wgmma's M: 64 output channels, its N: pixels (warpgroup_tile.cuh)
#endif
#ifndef TC_CAT
#define TC_CAT 0  // n > 0: the first n reduction channels come from a second input x1
#endif
#ifndef TC_B2B
#define TC_B2B 0  // n > 0: a back-to-back 1x1 conv of n output channels over y (b2b.cuh)
#endif
#ifndef TC_B2B_RELU
#define TC_B2B_RELU 0  // the back-to-back conv's ReLU
#endif
#ifndef TC_B2B_AHEAD
#define TC_B2B_AHEAD 0  // 1: its weights are copied in while the main loop runs (kernels/space.py)
#endif

#include "instruction_tile.cuh"

namespace cfg {
// ---- precision and instruction tile
constexpr int PREC = TC_PREC;  // 0 fp16, 1 int8, 2 int4, 3 fp32_tc
constexpr int SM = TC_SM;
constexpr bool INT4_S8 = TC_INT4_S8 != 0;  // int4 unpacked to s8 in shared memory (sm_90)
// fp32_tc: fp32 in global memory, split on the way into shared memory into two fp16 planes,
// hi = fp16(x) and lo = fp16((x - hi) * 2^11); the Tensor Cores see fp16 operands.
constexpr bool F32TC = PREC == 3;
constexpr int SPLIT = TC_SPLIT;  // fp32_tc products: 0 scaled3, 1 binomial4, 2 karatsuba
constexpr int ACC_SETS = !F32TC ? 1 : SPLIT == 2 ? 3 : 2;  // accumulator sets per tile
constexpr int PLANES = F32TC ? 2 : 1;                      // hi and lo planes in shared memory
constexpr int ELEM_BITS = PREC == 0 ? 16 : PREC == 1 ? 8 : PREC == 3 ? 32 : 4;  // global
constexpr int SMEM_BITS = INT4_S8 ? 8 : F32TC ? 16 : ELEM_BITS;               // shared
// fp32_tc with STAGES=3 on sm_80+: cp.async copies raw fp32 stages into a 3-deep staging
// ring and each thread splits the vectors it copied itself into double-buffered hi/lo
// planes (two stages of loads in flight); STAGES=1/2 split on the register-staged path.
constexpr bool F32_ASYNC = F32TC && SM >= 80 && TC_STAGES == 3;
// No cp.async (sm_75), or a transform on the way into shared memory (s4 -> s8, fp32 split).
constexpr bool REGPATH = SM < 80 || INT4_S8 || (F32TC && !F32_ASYNC);
constexpr int KB = SM >= 80 ? 32 : 16;          // bytes of k per instruction (16 -> k8/k16/k32)
constexpr int IM = (PREC == 0 || F32TC || SM >= 80) ? 16 : 8;  // instruction rows (m8: sm_75 int)
constexpr int INST_K = KB * 8 / SMEM_BITS;
constexpr int AM = (IM / 8) * (KB / 16);  // 8x8 matrices in an A fragment
constexpr int BMAT = KB / 16;             // 8x8 matrices in a B fragment
constexpr int ACC_T = IM * 8 / 32;        // accumulators per thread per instruction tile
// wgmma (MMA=wgmma): warpgroup-wide m64 x WN x KB tiles; the knobs' "warps" are warpgroups.
constexpr bool WG = TC_MMA != 0;
constexpr int WGM = 64;                   // rows of one wgmma tile
constexpr bool TMA = TC_TMA != 0;         // TMA loads paced by mbarriers (tma.cuh)
// TMA=2: one more warp, after the math warps, only issues the stages' copies, so no math
// warp ever waits on an empty slot or spends issue slots on copies (pipeline_tma.cuh).
constexpr bool WS = TC_TMA == 2;

// ---- shape (C is the padded channel count; C_REAL the layer's)
constexpr int N = TC_N, H = TC_H, W = TC_W, C = TC_C, C_REAL = TC_C_REAL, K = TC_K;
constexpr int R = TC_R, S = TC_S;
constexpr int SH = TC_STR_H, SW = TC_STR_W, PH = TC_PAD_H, PW = TC_PAD_W;
constexpr int DH = TC_DIL_H, DW = TC_DIL_W;
constexpr int P = (H + 2 * PH - DH * (R - 1) - 1) / SH + 1;
constexpr int Q = (W + 2 * PW - DW * (S - 1) - 1) / SW + 1;
constexpr int M = N * P * Q;

// ---- schedule knobs
constexpr int BRW = TC_BLK_ROW_WARPS, BCW = TC_BLK_COL_WARPS;
constexpr int WRT = TC_WARP_ROW_TILES, WCT = TC_WARP_COL_TILES;
constexpr int CHUNK = TC_CHUNK, REORDER = TC_REORDER_INNER, DUP = TC_DUP_AWARE;
constexpr int PACK = TC_PACK_OUT, LAYOUT = TC_LAYOUT, STAGES = TC_STAGES, SPLITK = TC_SPLIT_K;
// SPLIT_CLUSTER (sm_90): a tile's SPLITK blocks are one thread-block cluster (tc_conv's
// __cluster_dims__), and the first sums the others' partial tiles from their shared memory
// (epilogue.cuh), where the other split-K blocks sum through global memory and a counter.
constexpr bool SPLIT_CLUSTER = TC_SPLIT_CLUSTER != 0;

// ---- block tile
constexpr int WN = WG ? 32 * WCT : 0;  // columns of one wgmma tile (kernels/space.py: WGMMA_*)
constexpr int BM = BRW * WRT * (WG ? WGM : IM), BN = BCW * (WG ? WN : WCT * 8);
constexpr int WARPS = BRW * BCW * (WG ? 4 : 1), THREADS = WARPS * 32;  // one tile's math warps
// PINGPONG: two consumers, each THREADS math threads with a tile of its own, take the
// persistent block's tiles in turn, one's main loop running while the other's epilogue does
// (pipeline_tma.cuh: pingpong_tma; CUTLASS's ping-pong warp-specialized schedule).
constexpr bool PP = TC_PINGPONG != 0;
constexpr int CONSUMERS = PP ? 2 : 1;
constexpr int MATH_THREADS = CONSUMERS * THREADS;
constexpr int BLOCK_THREADS = MATH_THREADS + (WS ? 32 : 0);  // + the producer warp
// What the epilogue sees of a warp's accumulators: WRT row tiles ROWSTEP rows apart, each
// EWCT m16n8-shaped column tiles wide (wgmma's fragment is that of n8 tiles side by side).
constexpr int EWCT = WG ? WN / 8 : WCT;
constexpr int ROWSTEP = WG ? WGM : IM;
// SWAP_AB: the same warpgroup tile (WRT x 64 pixels by WN channels) as WN / 64 instructions
// of 64 channels (the weights as wgmma's A) by all its pixels (x as B): where WN is small,
// fewer, wider instructions that read less of shared memory per multiply-add; the epilogue
// transposes through the staging tile.
constexpr bool SWAP = TC_SWAP_AB != 0;
constexpr int SWAP_N = SWAP ? WRT * WGM : 0;  // pixels (the N) of a swapped instruction
constexpr int SB = CHUNK * KB;       // shared bytes of one row (pixel or channel) per tap
// Swizzle atom: wgmma swizzles rows of at most 128 bytes, so a wider stage row (CHUNK 8) is
// stored as 128-byte atoms side by side per 8-row group (block_tile.cuh: soff).
constexpr int ATOM = (WG && SB > 128) ? 128 : SB;
constexpr int NCA = ATOM / 16;       // 16-byte chunks per atom row
constexpr int BKC = CHUNK * INST_K;  // channels per stage
constexpr int GB = BKC * ELEM_BITS / 8, VPR = GB / 16;  // global bytes / vectors per row
constexpr int CV16 = 128 / ELEM_BITS;                   // channels per 16-byte vector
constexpr int CB = C * ELEM_BITS / 8;                   // bytes per weight row tap
// CAT (a 1x1 conv over two inputs concatenated along channels): the first CAT reduction
// channels are x1's, [N][P][Q][CAT] at the output's resolution (read at the output pixel),
// the other C - CAT x's, read at the layer's stride; the weights are [K][C] as for one input.
// A ResNet bottleneck's last conv and its projection shortcut are one such GEMM.
constexpr int CAT = TC_CAT;
constexpr int XB = (C - CAT) * ELEM_BITS / 8;           // bytes per pixel of x
constexpr int CAT_B = CAT * ELEM_BITS / 8;              // bytes per pixel of x1
constexpr int NCB = (C + BKC - 1) / BKC;                // channel blocks
constexpr int NB = LAYOUT ? 8 : 1;                      // images per pixel row of M
constexpr int NBT = N / NB;
constexpr int BMP = BM / NB;                            // pixel positions per block
constexpr int PIXSTRIDE = LAYOUT ? XB * 8 : XB;
constexpr int CVSTRIDE = LAYOUT ? 128 : 16;
constexpr int IMGSTRIDE = H * W * PIXSTRIDE;
// HALO: the output is cut into HBANDS bands of HCOLS columns; a band of one image is a run of
// HVIRT positions, row after row at a pitch of HPITCH = HCOLS + S - 1 (position v: output
// (v / HPITCH, v % HPITCH) of the band, a pixel where v % HPITCH < HCOLS), and a tile is BM
// consecutive positions. Tap (r, s) of position v reads the band's input pixel
// v + r * HPITCH + s (from -pad): a tile's A operand is one patch of HBOX_ROWS input rows of
// HPITCH pixels (one TMA box per channel atom), each tap's view of it a constant offset from
// the tile's first position (warpgroup_tile.cuh: issue_halo).
constexpr bool HALO = TC_HALO != 0;
constexpr int HCOLS = TC_HALO_COLS, HPITCH = HCOLS + S - 1;
constexpr int HBANDS = (Q + HCOLS - 1) / HCOLS, HVIRT = (P - 1) * HPITCH + HCOLS;
constexpr int HTILES = (HVIRT + BM - 1) / BM;  // tiles per band and image
constexpr int HBOX_ROWS = R + (BM + S - 2 + HPITCH - 1) / HPITCH;
constexpr int TILES_N = (K + BN - 1) / BN;
constexpr int TILES = (HALO ? N * HBANDS * HTILES : (M + BM - 1) / BM) * TILES_N;
// PERSIST: blocks walk the tiles (kernels/launch.py sizes the grid to PERSIST per SM).
constexpr int PERSIST = TC_PERSIST;
constexpr bool PLAIN_A = TC_PLAIN_A != 0;

// ---- duplicate-aware receptive field (paper 3.1), see block_tile.cuh
constexpr int cmin(int a, int b) { return a < b ? a : b; }
constexpr int cmax(int a, int b) { return a > b ? a : b; }
constexpr bool FULLROW = BMP >= Q;  // the block covers whole output rows
constexpr int ROWS_OUT = cmin(FULLROW ? (BMP + Q - 1) / Q + 1 : 2, NBT * P);
constexpr int NIMG = cmin(NBT, (ROWS_OUT + P - 2) / P + 1);
constexpr int GAP = cmax(0, (R - 1) * DH - SH + 1);  // slots between images' rows
constexpr int PG = P * SH + GAP;
constexpr int IN_COLS = ((FULLROW ? Q : BMP) - 1) * SW + (S - 1) * DW + 1;
constexpr int SLOTS = REORDER ? (FULLROW ? (ROWS_OUT - 1) * SH + (R - 1) * DH + 1 + (NIMG - 1) * GAP
                                         : ROWS_OUT * R)
                              : ROWS_OUT;
constexpr int TAPS = DUP ? (REORDER ? R * S : S) : HALO ? R * S : 1;  // filter taps per stage
// HALO: the patch's pixel rows in shared memory, in whole 1024-byte units of every atom width.
constexpr int HPLANE_ROWS = (HBOX_ROWS * HPITCH + 31) / 32 * 32;
constexpr int A_ROWS = DUP ? SLOTS * IN_COLS * NB : HALO ? HPLANE_ROWS : BM;
constexpr int A_PLANE = A_ROWS * SB, B_PLANE = BN * TAPS * SB;  // one fp16 plane (fp32_tc: hi)
constexpr int A_STAGE = PLANES * A_PLANE, B_STAGE = PLANES * B_PLANE;
// FOLD_TAPS: the reduction is the R*S taps of TV bytes each (C is padded to one tap vector),
// TPS of them per stage row; the last stage's taps past R*S are zero-filled.
constexpr bool FOLD = TC_FOLD_TAPS != 0;
constexpr int TV = FOLD ? CB : 16;
constexpr int TPS = FOLD ? SB / TV : 1;
constexpr int NIT = FOLD ? (R * S + TPS - 1) / TPS
                         : DUP ? (REORDER ? NCB : R * NCB) : HALO ? NCB : R * S * NCB;  // stages

// ---- epilogue (compile-time options of the build, not knobs)
constexpr int EPI = TC_EPI;    // int: 0 raw int32 acc, 1 requantize; fp16: 0 plain, 1 + bias
constexpr int RELU = TC_RELU;
constexpr bool RES = TC_RES != 0;  // + residual (int8: times res_scale) before ReLU / clamp
constexpr int OUT_BITS = PREC == 0 ? 16 : F32TC ? 32 : (EPI == 0 ? 32 : ELEM_BITS);
constexpr int STAGE_BITS = PACK ? OUT_BITS : 32;
constexpr bool DIRECT_OUT = PACK && OUT_BITS == 32;  // raw int32: registers -> global
constexpr int TB = BN * OUT_BITS / 8;                // output tile row bytes
constexpr int E_ROW = BN * STAGE_BITS / 8 + 16;      // staging row (+16 B against conflicts)
// PACK_OUT=2: the staged tile is written by bulk tensor stores (TMA) instead of the threads'
// 16-byte stores: column boxes of SWB bytes x 64 rows, each stored dense and swizzled as
// the tensor map's SWB-byte swizzle reads it (no padding, few bank conflicts), from a
// 1024-byte-aligned base (the slack is part of the region).
constexpr bool TMA_ST = PACK == 2;
constexpr int SWB = TB % 128 == 0 ? 128 : TB % 64 == 0 ? 64 : 32;
constexpr int NBOX = TB / SWB, BOX_ROWS = 64;
// B2B_WG: a back-to-back conv (B2B, below) of a wgmma build runs on wgmma too (n32 tiles or
// wider; narrower ones on mma.sync), its A operand the staged tile itself: the tile is then
// staged in TMA_ST's swizzled boxes, which are wgmma's K-major operand layout, whatever
// stores it.
constexpr int B2B = TC_B2B;
constexpr bool B2B_WG = B2B > 0 && WG && B2B % 32 == 0;
constexpr bool SWZ_STG = TMA_ST || B2B_WG;
constexpr int STG_SMEM = SWZ_STG ? BM * TB + 1024 : BM * E_ROW;
// The residual epilogue with PACK_OUT stages the block's residual tile beside the output tile
// (coalesced loads; the register epilogue then reads it from shared memory). RES_AHEAD: the
// tile's copies are issued before the main loop into a region past the pipeline's and
// waited on by the epilogue, so their latency hides behind the loop, not after it.
// The block's columns' scale and bias (fp16: bias) are copied past the residual tile
// (RES_TILE) with it, in its copies' group: the epilogue's staging loops read them from
// shared memory, where loads from global memory wait one round trip per column group (the
// compiler cannot move them past the staging stores) after the residual tile's own wait.
constexpr int RES_TILE = BM * E_ROW;
constexpr int PARAM_ARRAYS = PREC == 0 ? 1 : 2;
constexpr int RES_SMEM = (RES && PACK) ? RES_TILE + PARAM_ARRAYS * BN * 4 : 0;
constexpr int EPI_SMEM = DIRECT_OUT ? 0 : STG_SMEM + RES_SMEM;
constexpr bool RES_AHEAD = TC_RES_AHEAD != 0;
// F32_ASYNC: two hi/lo plane buffers, then STAGES fp32 staging slots of the same size.
// wgmma: room to round the base up to the 1024-byte alignment of its swizzled tiles.
// TMA: a full and an empty mbarrier per stage after the stages (PINGPONG: and a turn
// mbarrier per consumer).
constexpr int SMEM_ALIGN = WG ? 1024 : 0;
constexpr int MBAR_SMEM = TMA ? 16 * STAGES + (PP ? 16 : 0) : 0;
constexpr int PIPE_SMEM = (F32_ASYNC ? 2 + STAGES : STAGES) * (A_STAGE + B_STAGE) + SMEM_ALIGN +
                          MBAR_SMEM;
constexpr int NATOM = SB / ATOM;  // swizzle atoms per stage row (TMA: one box each)
// Bytes the TMA copies of A deliver per stage (HALO: the boxes, not the plane's slack).
constexpr int A_TX = HALO ? NATOM * HBOX_ROWS * HPITCH * ATOM : A_STAGE;
// A persistent block's epilogue has its own region after the pipeline (one per consumer):
// the next tile's first stages land while it runs.
constexpr int EPI_OFF = PERSIST ? PIPE_SMEM : 0;
// The residual tile's offset in the epilogue's region.
constexpr int RES_OFF = RES_AHEAD ? (cmax(PIPE_SMEM, STG_SMEM) + 15) / 16 * 16 : STG_SMEM;
// SPLIT_CLUSTER: a block's partial tile, one 32-bit accumulator per output, at 0.
constexpr int PART_SMEM = SPLIT_CLUSTER ? BM * BN * 4 : 0;
constexpr int BASE_SMEM = PERSIST ? PIPE_SMEM + CONSUMERS * EPI_SMEM
                        : RES_AHEAD ? RES_OFF + RES_SMEM
                                    : cmax(cmax(PIPE_SMEM, EPI_SMEM), PART_SMEM);
// B2B (b2b.cuh): the back-to-back conv's weights [B2B][K] and its staged output tile, in
// rows padded by 16 bytes (ldmatrix reads 8 rows in 8 different bank groups); B2B_WG: the
// weights dense in swizzled planes of W2_SW-byte atoms (wgmma's B operand) from a
// 1024-byte-aligned base (the slack is part of the region). B2B_AHEAD: the weights are
// copied in while the main loop runs, into a region past the rest; else after the epilogue,
// past the staged output tile (at 0) in the pipeline's dead region. The output tile goes
// past the staged one where that fits, else after the weights.
constexpr bool B2B_RELU = TC_B2B_RELU != 0;
constexpr bool B2B_AHEAD = TC_B2B_AHEAD != 0 && SM >= 80;  // (sm_75: no cp.async)
constexpr int EB = ELEM_BITS / 8;  // bytes per element of the back-to-back conv (int8, fp16)
constexpr int W2_SW = (K * EB) % 128 == 0 ? 128 : (K * EB) % 64 == 0 ? 64 : 32;
constexpr int W2_ROW = B2B_WG ? W2_SW : K * EB + 16, O2_ROW = B2B * EB + 16;
constexpr int W2_BYTES = B2B_WG ? B2B * K * EB + 1024 : B2B * W2_ROW, O2_BYTES = BM * O2_ROW;
constexpr int STG_END = (STG_SMEM + 15) / 16 * 16;
constexpr int W2_OFF = B2B_AHEAD ? (BASE_SMEM + 15) / 16 * 16 : STG_END;
// (PERSIST: the next tile's stages land at 0 meanwhile: the output tile past the weights)
constexpr int O2_OFF = !B2B_AHEAD ? STG_END + W2_BYTES
                     : !PERSIST && STG_END + O2_BYTES <= W2_OFF ? STG_END : W2_OFF + W2_BYTES;
constexpr int SMEM = B2B ? cmax(BASE_SMEM, cmax(W2_OFF + W2_BYTES, O2_OFF + O2_BYTES))
                         : BASE_SMEM;
constexpr int CVO = 128 / OUT_BITS;  // output channels per 16-byte vector (NHWCnc out)
constexpr int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }
constexpr int pow2_le16(int v) { return (v % 16 == 0) ? 16 : (v % 8 == 0) ? 8 : (v % 4 == 0) ? 4
                                        : (v % 2 == 0) ? 2 : 1; }
constexpr int VW = pow2_le16(gcd(K * OUT_BITS / 8, TB));  // bytes per output store
// The residual tile copied after the main loop by cp.async too, every copy in flight at once,
// where the pipeline has no cp.async groups of its own in flight behind the epilogue's back
// (all but the persistent multistage one, whose next tile's first stages are).
constexpr bool RES_ASYNC = RES && PACK && !DIRECT_OUT && SM >= 80 && VW >= 4 && (!PERSIST || TMA);
// RES_EARLY: with PDL and res_ready, RES_AHEAD's copies are issued before the grid-dependency
// wait; 16-byte copies only (cp.async.cg, through L2: the residual is another kernel's output,
// read while the kernel before this one may still run).
constexpr bool RES_EARLY = SM >= 90 && RES_AHEAD && VW == 16;
// CAT_EARLY: with PDL and x_ready, a CAT build's reduction takes x's channels first, before
// the grid-dependency wait, and x1's (the kernel before's output) after it: the stages are
// x's channel blocks, then x1's (block_tile.cuh: stage_idx), and the loader waits before
// x1's first (IT_X1). One tile a block, without split-K, on the cp.async pipeline.
constexpr bool CAT_EARLY = CAT && SM >= 90 && !REGPATH && !PERSIST && SPLITK == 1 && !RES;
constexpr int IT_X1 = NCB - CAT / BKC;
constexpr int ACC_N = WRT * EWCT * ACC_T;

// ---- what cannot be built, each with its reason (kernels/space.py:validity mirrors these)
static_assert(!F32TC || (SPLIT >= 0 && SPLIT <= 2), "fp32_tc SPLIT is 0, 1 or 2");
static_assert(F32TC || SPLIT == 0, "SPLIT is an fp32_tc knob");
static_assert(FOLD ? (TV == 4 || TV == 8 || TV == 16) && SB % TV == 0 : C % CV16 == 0,
              "channels are padded to whole 16-byte vectors (FOLD_TAPS: one tap vector)");
static_assert(!FOLD || ((PREC == 0 || PREC == 1) && !INT4_S8 && !DUP && !LAYOUT && !REORDER &&
                        !TMA && THREADS % TPS == 0),
              "FOLD_TAPS loads NHWC taps of fp16 or int8, one tap slot per thread");
static_assert(!LAYOUT || (N % 8 == 0 && C_REAL % CV16 == 0 && K % CVO == 0 && K % CV16 == 0),
              "NHWCnc stores 8 images x one 16-byte channel vector: batch and channels must fill them");
static_assert(!REGPATH || STAGES <= 2,
              "the register-staged pipeline (sm_75, int4 via s8) is double-buffered at most");
static_assert(!RES_AHEAD || (RES && PACK && !DIRECT_OUT && !PERSIST && SPLITK == 1 && SM >= 80 &&
                             VW >= 4),
              "the residual tile is copied in ahead by cp.async (4-16 bytes) into a region of "
              "its own, for a block that runs one tile without split-K");
static_assert(!B2B || ((PREC == 0 || PREC == 1) && EPI == 1 && (PACK == 1 || B2B_WG) &&
                       !LAYOUT && SPLITK == 1 && (!PERSIST || (B2B_WG && B2B_AHEAD && !PP)) &&
                       !HALO && TILES_N == 1 &&
                       (BN * EB) % 16 == 0 && (K * EB) % KB == 0 && B2B % 8 == 0 &&
                       (B2B * EB) % 16 == 0),
              "a back-to-back 1x1 conv reads the block's whole staged output rows (one column "
              "tile, PACK_OUT=1 (wgmma: or 2), NHWC, int8 requant / fp16 bias) in whole "
              "instruction k-steps, and writes whole 16-byte vectors of its own output; a "
              "persistent block (wgmma, one consumer) keeps its weights, copied ahead");
static_assert(!B2B_WG || (TB % 32 == 0 && VW == 16),
              "a back-to-back conv on wgmma reads 32-byte k-steps of the swizzled staged tile");
static_assert(SMEM == TC_SMEM_BYTES, "kernels/space.py:geometry must equal what the kernel allocates");
static_assert(PREC != 2 || K % 2 == 0, "int4 output packs two channels per byte");
static_assert(!RES || ((PREC == 0 || PREC == 1) && EPI == 1),
              "the residual epilogue adds to requantized int8 or fp16 + bias outputs");
static_assert(!WG || (!DUP && (PREC == 0 || PREC == 1)),
              "the wgmma path reads whole swizzled tiles of fp16 or int8 operands");
static_assert(!WG || THREADS <= 1024, "a block holds at most 8 warpgroups");
static_assert(!TMA || (WG && !LAYOUT && !DUP), "TMA loads whole NHWC im2col and weight tiles for wgmma");
static_assert(!TMA || BN <= 256, "a TMA weight box spans at most 256 rows");
static_assert(TC_TMA >= 0 && TC_TMA <= 2, "TMA is 0, 1 or 2 (a producer warp)");
static_assert(!TMA_ST || (TMA && !LAYOUT && SPLITK == 1 && (OUT_BITS == 8 || OUT_BITS == 16) &&
                          (K * OUT_BITS / 8) % 16 == 0 && TB % 32 == 0 && BM % BOX_ROWS == 0),
              "TMA stores write NHWC int8 / fp16 tiles whose rows are 16-byte multiples, "
              "through the TMA build's tensor maps, without split-K");
static_assert(!PLAIN_A || (TMA && R == 1 && S == 1 && SH == 1 && SW == 1 && PH == 0 && PW == 0 &&
                           BM <= 256),
              "the plain-matrix copy of A is the TMA path of 1x1, stride-1, unpadded layers, "
              "one box of at most 256 rows");
static_assert(!HALO || (TMA && !TMA_ST && SPLITK == 1 && !REORDER && SH == 1 && SW == 1 &&
                        DH == 1 && DW == 1 && R * S > 1 && !CAT && HPITCH <= 256 &&
                        HBOX_ROWS <= 256 && HCOLS <= Q),
              "the halo patch: a stride-1 TMA build whose tile's patch is one box of at most "
              "256 x 256 pixels, reduced by one block, stored by the threads");
static_assert(!SWAP || (WG && !HALO && WN % 64 == 0 && (SWAP_N == 64 || SWAP_N == 128 ||
                                                          SWAP_N == 256)),
              "swapped operands: wgmma tiles of whole 64-channel blocks by 64, 128 or 256 "
              "pixels, read as im2col or plain rows (not the halo patch's views)");
static_assert(!SPLIT_CLUSTER || (SM >= 90 && SPLITK > 1 && !F32TC && ACC_N * THREADS == BM * BN),
              "a cluster's split-K blocks (sm_90) sum one 32-bit accumulator per output");
static_assert(!PERSIST || (!F32TC && !REGPATH && SPLITK == 1),
              "a persistent grid runs the TMA or cp.async multistage pipeline without split-K");
static_assert(!PP || (WS && PERSIST), "the consumers take turns behind a producer warp, "
              "on a persistent grid");
static_assert(!CAT || ((PREC == 0 || PREC == 1) && !TMA && !FOLD && !DUP && !LAYOUT &&
                       R == 1 && S == 1 && PH == 0 && PW == 0 && CAT % BKC == 0 && CAT < C),
              "two inputs: an int8 / fp16 1x1 unpadded NHWC layer on the cp.async or "
              "register-staged loads, whose stages hold channels of one input each");
// Implied by the register rule and kernels/spec.py's shape limits (tests/test_kernels_build.py):
static_assert(!TMA || (BM <= 1024 && SH <= 8 && SW <= 8 && PH <= 127 && PW <= 127 &&
                       (R - 1) * DH - PH <= 128 && (S - 1) * DW - PW <= 128),
              "the im2col walk spans at most 1024 pixels with a stride of at most 8, and its "
              "bounding-box corners lie within [-128, 127]");
}  // namespace cfg

// The layer's inputs: x (and with CAT, x1) and the weights.
// The launch's `ready` bits (the tensor contract above).
constexpr int READY_W = 1, READY_X = 2, READY_RES = 4;
// Where the grid-dependency wait is when not at the kernel's start: x_early (CAT_EARLY), before
// the first stage of x1's channels (the loader's); w_early (W_EARLY), after the first stages'
// weights are issued (the pipeline's prologue).
struct Inputs { const u8* x; const u8* x1; const u8* w; bool x_early, w_early; };
// B2B: the back-to-back 1x1 conv's weights [B2B][K], per-channel scale (int8) and bias, and
// its output [N][P][Q][B2B].
struct B2b { const u8* w; const float* scale; const float* bias; u8* y; };

#include "block_tile.cuh"
#include "tma.cuh"
#include "warp_tile.cuh"
#include "warpgroup_tile.cuh"
#include "epilogue.cuh"
#include "pipeline.cuh"
#include "pipeline_tma.cuh"
#include "pipeline_split_async.cuh"
#include "pipeline_multistage.cuh"
#include "pipeline_regstaged.cuh"
#include "b2b.cuh"

template <bool C, class A, class B> struct Pick { typedef A T; };
template <class A, class B> struct Pick<false, A, B> { typedef B T; };

// W_EARLY: every thread waits before its epilogue's global reads and writes (on the TMA
// pipelines only the issuing thread waited, in first_stages; a no-op once it has waited).
__device__ __forceinline__ void w_early_wait(const Inputs& in) {
  if constexpr (cfg::W_EARLY) {
    if (in.w_early) grid_dependency_wait();
  }
}

// One block's work; a template over the tile below the block so that each path's calls
// (if constexpr) are only instantiated for the tile that has them.
template <class Tile>
__device__ __forceinline__ void conv_block(const Inputs in, const float* __restrict__ scale,
                                           const float* __restrict__ bias, u8* __restrict__ y,
                                           u32* __restrict__ ws, u32* __restrict__ counters,
                                           const Residual res, const TensorMaps* maps,
                                           const B2b b2b, u8* smem) {
  using namespace cfg;
  const int tid = threadIdx.x;
  const int tile = blockIdx.x;
  const int split = blockIdx.z;
  const int m0 = tile_m0(tile), n0 = tile_n0(tile);
  // Balanced split of the main loop: every split owns [it0, it1).
  const int it0 = split * NIT / SPLITK;
  const int it1 = (split + 1) * NIT / SPLITK;

  BlockLoader ld;
  if constexpr (!TMA) ld.init(in, m0, n0, tid);
  if constexpr (F32TC) ld.init_split(scale);
  Tile wt;
  wt.init(m0, tid, ld);

  // wgmma's swizzled tiles are addressed by absolute bits: align the pipeline to 1024 bytes.
  const u32 sbase = WG ? (smem_addr(smem) + SMEM_ALIGN - 1) & ~(u32)(SMEM_ALIGN - 1)
                       : smem_addr(smem);
  int nit = it1 - it0;
  // NVVM unrolls a wgmma main loop whose trip count it knows completely (past #pragma
  // unroll 1: 144 stages of stage5 took 12 s to compile and spilled): hide the count.
  if constexpr (WG) asm volatile("" : "+r"(nit));

  const StageRing sr{sbase};
  b2b_weights_ahead(smem, b2b, tid);  // (the residual tile's copies ahead: tc_conv)
  if constexpr (TMA) {
    // (false: the producer warp)
    if (!mainloop_tma(wt, sr, it0, nit, m0, n0, tid, maps, in.w_early)) return;
  } else if constexpr (F32_ASYNC) mainloop_split_async(ld, wt, sr, it0, nit);
  else if constexpr (!REGPATH) mainloop_multistage(ld, wt, sr, it0, nit);
  else mainloop_regstaged(ld, wt, sr, it0, nit);
  block_sync();  // shared memory is reused by the epilogue
  w_early_wait(in);
  if constexpr (F32TC) wt.finalize(scale);  // the accumulator sets -> one fp32 value each
  epilogue(wt, smem, m0, n0, tid, tile, split, scale, bias, res, y, ws, counters, maps);
  if constexpr (B2B_WG) b2b_conv_wg<B2B_N>(smem, smem, b2b, m0, tid);
  else if constexpr (B2B) b2b_conv(smem, b2b, m0, tid);
}

// PERSIST: one block walks the tiles blockIdx.x, + gridDim.x, ...; the next tile's first
// stages are issued before this tile's epilogue, which stages its output in a region of its
// own, so the loads are in flight while the tile is stored (TMA: pipeline_tma.cuh's
// persistent_tma; cp.async: the multistage prologue of the next tile, then the epilogue).
// B2B_WG: the back-to-back conv after each tile's epilogue, its weights copied once.
template <class Tile>
__device__ __forceinline__ void conv_persistent(const Inputs in,
                                                const float* __restrict__ scale,
                                                const float* __restrict__ bias,
                                                u8* __restrict__ y, u32* __restrict__ ws,
                                                u32* __restrict__ counters, const Residual res,
                                                const TensorMaps* maps, const B2b b2b,
                                                u8* smem) {
  using namespace cfg;
  const int tid = threadIdx.x;
  b2b_weights_ahead(smem, b2b, tid);  // (B2B_WG builds only: B2B_AHEAD)
  const u32 sbase = WG ? (smem_addr(smem) + SMEM_ALIGN - 1) & ~(u32)(SMEM_ALIGN - 1)
                       : smem_addr(smem);
  const StageRing sr{sbase};
  int nit = NIT;
  if constexpr (WG) asm volatile("" : "+r"(nit));  // as in conv_block
  // The wgmma tile's init takes the next tile's first row (HALO: its view of the patch).
  if constexpr (PP) {
    Tile wt;
    BlockLoader ld;  // unused by the wgmma tile
    const int g0 = tid / THREADS;  // consumer g takes the block's tiles g, g + 2, ...
    wt.init(tile_m0(block_tile(g0)), tid % THREADS, ld);
    pingpong_tma(wt, sr, nit, tid, maps, in.w_early, [&](int tile, int g, int ctid) {
      const int m0 = tile_m0(tile), n0 = tile_n0(tile);
      w_early_wait(in);
      epilogue(wt, smem + EPI_OFF + g * EPI_SMEM, m0, n0, ctid, tile, 0, scale, bias, res, y,
               ws, counters, maps);
      block_sync();  // the consumer's epilogue region is free for its next tile's
      wt.init(tile_m0(tile + 2 * (int)gridDim.x), ctid, ld);
    });
    return;
  }
  if constexpr (TMA) {
    Tile wt;
    BlockLoader ld;  // unused by the wgmma tile
    wt.init(tile_m0(blockIdx.x), tid, ld);
    persistent_tma(wt, sr, nit, tid, maps, in.w_early, [&](int tile) {
      const int m0 = tile_m0(tile), n0 = tile_n0(tile);
      w_early_wait(in);
      epilogue(wt, smem + EPI_OFF, m0, n0, tid, tile, 0, scale, bias, res, y, ws, counters,
               maps);
      if constexpr (B2B_WG)
        b2b_conv_wg<B2B_N>(smem, smem + EPI_OFF, b2b, m0, tid, tile == (int)blockIdx.x);
      block_sync();  // the epilogue's region is free for the next tile's
      wt.init(tile_m0(tile + (int)gridDim.x), tid, ld);
    });
    return;
  }
  int tile = blockIdx.x;
  BlockLoader ld;
  ld.init(in, tile_m0(tile), tile_n0(tile), tid);
  multistage_prologue(ld, sr, 0, nit);  // (W_EARLY: every thread waits in it)
  Inputs later = in;
  later.w_early = false;  // the wait is behind: the next tiles' prologues issue stages whole
#pragma unroll 1
  for (; tile < TILES; tile += gridDim.x) {
    const int m0 = tile_m0(tile), n0 = tile_n0(tile);
    Tile wt;
    wt.init(m0, tid, ld);
    multistage_body(ld, wt, sr, 0, nit);
    __syncthreads();  // every warp is done with the stages the next prologue overwrites
    const int next = tile + gridDim.x;
    if (next < TILES) {
      ld.init(later, tile_m0(next), tile_n0(next), tid);
      multistage_prologue(ld, sr, 0, nit);
    }
    epilogue(wt, smem + EPI_OFF, m0, n0, tid, tile, 0, scale, bias, res, y, ws, counters,
             maps);
    if constexpr (B2B_WG)
      b2b_conv_wg<B2B_N>(smem, smem + EPI_OFF, b2b, m0, tid, tile == (int)blockIdx.x);
    __syncthreads();  // the epilogue's region is free for the next tile's
  }
  cp_async_wait<0>();
}

// TMA builds take the tensor maps as a by-value kernel parameter (param space, read by the TMA
// unit without a trip to global memory).
extern "C" __global__ void __launch_bounds__(cfg::BLOCK_THREADS,
                                             cfg::PERSIST > 0 ? cfg::PERSIST : 1)
#if TC_SPLIT_CLUSTER
__cluster_dims__(1, 1, TC_SPLIT_K)  // the grid's z is the split: a tile's splits, one cluster
#endif
tc_conv(const u8* __restrict__ x, const u8* __restrict__ w, const float* __restrict__ scale,
        const float* __restrict__ bias, u8* __restrict__ y, u32* __restrict__ ws,
        u32* __restrict__ counters, int ready
#if TC_CAT
        , const u8* __restrict__ x1
#endif
#if TC_RES
        , const u8* __restrict__ res, float res_scale
#endif
#if TC_B2B
        , const u8* __restrict__ w2, const float* __restrict__ scale2,
        const float* __restrict__ bias2, u8* __restrict__ y2
#endif
#if TC_TMA
        , const __grid_constant__ TensorMaps maps
#endif
) {
  extern __shared__ __align__(128) u8 smem[];
#if TC_RES
  const Residual r = {res, res_scale};
#else
  const Residual r = {nullptr, 0.f};
#endif
  const bool early = cfg::RES_EARLY && (ready & READY_RES);
  const bool x_early = cfg::CAT_EARLY && (ready & READY_X);
  // (a residual tile copied ahead goes before the weights' wait only where it is ready too)
  const bool w_early = cfg::W_EARLY && (ready & READY_W) && (!cfg::RES_AHEAD || early);
#if TC_SM >= 90
  // Programmatic dependent launch (kernels/launch.py, pdl): a launch with the attribute may
  // start while the kernel before it on the stream still runs, so nothing global is read or
  // written before that kernel has finished (a no-op for launches without it), but inputs
  // that were complete before this launch (`ready`): a residual, whose tile's copies go
  // first; a CAT build's x, whose stages come first and are reduced before the wait (the
  // loader waits before x1's first stage: BlockLoader::load_stage); the weights, whose first
  // stages are issued before it (the pipeline's prologue waits after them).
  if (early) residual_ahead(smem, r, scale, bias, threadIdx.x);
  if (!x_early && !w_early) grid_dependency_wait();
#endif
  if (!early) residual_ahead(smem, r, scale, bias, threadIdx.x);
#if TC_TMA
  const TensorMaps* m = &maps;
#else
  const TensorMaps* m = nullptr;
#endif
#if !TC_CAT
  const u8* x1 = nullptr;
#endif
  const Inputs in{x, x1, w, x_early, w_early};
#if TC_B2B
  const B2b ch{w2, scale2, bias2, y2};
#else
  const B2b ch{nullptr, nullptr, nullptr, nullptr};
#endif
  using Tile = Pick<cfg::WG, GroupTile, WarpTile>::T;
  if constexpr (cfg::PERSIST) conv_persistent<Tile>(in, scale, bias, y, ws, counters, r, m, ch, smem);
  else conv_block<Tile>(in, scale, bias, y, ws, counters, r, m, ch, smem);
  // The block's shared memory must outlive the reads of its last bulk stores (each
  // consumer's first thread issued its own).
  if constexpr (cfg::TMA_ST) if (threadIdx.x % cfg::THREADS == 0) bulk_wait();
}
