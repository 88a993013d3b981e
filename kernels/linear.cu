// y[n][j] = x[n] . w[j] + bias[j] for the few rows of a classifier (deploy's KernelLinear;
// kernels/linear.py builds and launches it): fp16 x and w, fp32 sums on the Tensor Cores,
// fp16 or fp32 y. At a few rows the weights are the bytes that matter, so the grid spreads
// them over every SM: a block owns OUTS output features, its warps split the reduction in
// 64-wide k blocks (a warp every WARPS-th), and their partial sums meet in shared memory.
//
// Instruction tile: mma m16n8k16 (two m16n8k8 before sm_80) with the rows of x as M (up to
// 16; rows past TL_N are zero) and the block's output features as N. A sum is the same in any
// order of k, so each k block's columns are permuted such that a thread's fragments of both
// operands are 32 contiguous bytes of its row: thread t of a quad holds k 16t..16t+15 of the
// block, its k step s being k 16t+4s..16t+4s+3 (the fragment's k 2t, 2t+1, 2t+8, 2t+9). So
// every load is a whole 16-byte vector and no shared memory stages the operands. On sm_90 the
// block's weight rows are prefetched into L2 by one bulk copy before the grid-dependency wait
// (the weights are no kernel's output; the pooling kernel before lets this one in early for
// that, kernels/avg_pool.cu): ptxas moves plain loads past the wait, a bulk prefetch stays.
//
// Defines (kernels/linear.py; TK_SM: kernels/small_kernel.py): TL_N (rows of x, at most
// 16), TL_C (in features, a multiple of 8), TL_J (out features), TL_F32 (1: fp32 y, 0: fp16).

typedef unsigned int u32;
typedef unsigned short u16;

constexpr int WARPS = 8;
constexpr int OUTS = 8;                             // output features a block: the mma's N
constexpr int KB = 64;                              // k a block of the reduction
constexpr int K_BLOCKS = (TL_C + KB - 1) / KB;
constexpr int K_PER_WARP = (K_BLOCKS + WARPS - 1) / WARPS;  // a warp's k blocks
constexpr int VEC = TL_C / 8;                       // 16-byte vectors of a row
constexpr int M_HALVES = TL_N > 8 ? 2 : 1;          // rows g and, past 8 rows, g + 8

__device__ __forceinline__ void mma_f16(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                        u32 b1) {
#if TK_SM >= 80
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else  // sm_75: the k step as two of k 8 (fragment k 2t, 2t+1, then 2t+8, 2t+9)
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(b0));
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a2), "r"(a3), "r"(b1));
#endif
}

// The two 16-byte vectors of `row` (VEC vectors) at the thread's 32 bytes of k block kb;
// zeros past the row's end (TL_C is a multiple of 8, so a vector is whole or absent).
__device__ __forceinline__ void load_run(const uint4* row, int kb, int t, bool live,
                                         uint4 (&v)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int i = kb * (KB / 8) + 2 * t + h;
    v[h] = live && i < VEC ? row[i] : make_uint4(0, 0, 0, 0);
  }
}

__device__ __forceinline__ u32 word(const uint4 (&v)[2], int i) {  // i: 0..7, constant
  const uint4& q = v[i / 4];
  return (i & 3) == 0 ? q.x : (i & 3) == 1 ? q.y : (i & 3) == 2 ? q.z : q.w;
}

// One block an SM's worth of registers: ptxas then issues a warp's loads before its first mma.
extern "C" __global__ void __launch_bounds__(WARPS * 32, 1)
    tc_linear(const uint4* __restrict__ x, const uint4* __restrict__ w,
              const float* __restrict__ bias, void* __restrict__ y) {
  __shared__ float part[WARPS][32 * 4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;  // the fragment's row group and thread of a quad
  const int j0 = blockIdx.x * OUTS;
  const bool w_live = j0 + g < TL_J;
  const uint4* w_row = w + (long long)(j0 + g) * VEC;
#if TK_SM >= 90
  if (threadIdx.x == 0) {
    const int outs = TL_J - j0 < OUTS ? TL_J - j0 : OUTS;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;"
                 :: "l"(w + (long long)j0 * VEC), "r"(outs * VEC * 16) : "memory");
  }
  // Programmatic dependent launch (kernels/launch.py): x is the kernel before's output.
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  // Every load of the warp before its first mma: one round trip, not one a k block.
  uint4 wv[K_PER_WARP][2], xv[K_PER_WARP][M_HALVES][2];
#pragma unroll
  for (int i = 0; i < K_PER_WARP; ++i) {
    load_run(w_row, warp + i * WARPS, t, w_live, wv[i]);
#pragma unroll
    for (int m = 0; m < M_HALVES; ++m)
      load_run(x + (8 * m + g) * VEC, warp + i * WARPS, t, 8 * m + g < TL_N, xv[i][m]);
  }
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < K_PER_WARP; ++i) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const u32 a1 = M_HALVES > 1 ? word(xv[i][M_HALVES - 1], 2 * s) : 0u;  // rows g + 8
      const u32 a3 = M_HALVES > 1 ? word(xv[i][M_HALVES - 1], 2 * s + 1) : 0u;
      mma_f16(acc, word(xv[i][0], 2 * s), a1, word(xv[i][0], 2 * s + 1), a3,
              word(wv[i], 2 * s), word(wv[i], 2 * s + 1));
    }
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) part[warp][lane * 4 + r] = acc[r];
  __syncthreads();
  // Thread e < 128 sums element e of every warp's accumulator: lane e / 4's c[e % 4], which
  // is row g (+ 8 for c2, c3) of x and output feature 2t (+ 1 for c1, c3) of the block.
  const int e = threadIdx.x;
  if (e >= 32 * 4) return;
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < WARPS; ++k) sum += part[k][e];
  const int el = e >> 2, r = e & 3;
  const int n = (el >> 2) + 8 * (r >> 1), j = j0 + 2 * (el & 3) + (r & 1);
  if (n >= TL_N || j >= TL_J) return;
  sum += bias[j];
#if TL_F32
  static_cast<float*>(y)[n * TL_J + j] = sum;
#else
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(sum));
  static_cast<u16*>(y)[n * TL_J + j] = h;
#endif
}
