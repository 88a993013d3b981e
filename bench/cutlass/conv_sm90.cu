// CUTLASS 3.x sm90 implicit-GEMM convolution (fprop) behind a C ABI, loaded with ctypes by
// bench/cutlass_conv.py: the second baseline of our benchmarks next to cuDNN.
//
// Tensors: x NHWC, w KRSC, y NPQK (NHWC), all packed. Shapes are runtime arguments.
// Precisions:
//   fp16: fp16 in, fp32 accumulate, fp16 out:  y = half(alpha * acc)            (alpha = 1)
//   int8: int8 in, int32 accumulate, int8 out: y = sat8(rint(float(acc) * alpha))
//         The sm90 collective epilogue's LinearCombination does the requantization: acc is
//         converted to float (round to nearest), multiplied by the float scalar alpha, rounded
//         half to even and saturated to [-128, 127] (cvt.rni + cvt.pack.sat). One scale for
//         the whole tensor, no bias (our kernels take a per-channel scale and a bias).
//
// Kernels: CollectiveBuilder<Sm90, ..., Operator::kFprop, ..., KernelImplicitTmaWarpSpecializedSm90>
// with ConvUniversal and ConvUniversalAdapter. CUTLASS 4.2 offers only this schedule for sm90
// conv (its dispatch policy static_asserts "Persistent schedules not support for conv yet"
// for the cooperative and ping-pong ones): one TMA producer warpgroup and one wgmma consumer
// warpgroup, non-persistent (one CTA per output tile), TMA im2col loads of the activations.
// With one consumer warpgroup a 128x256 fp32/int32 accumulator tile needs 256 registers per
// thread for the accumulators alone, so the widest tiles are 128x128 and 64x256.
//
// Graph capture: run() allocates nothing and never synchronizes. It builds the kernel
// parameters (TMA descriptors) on the host, sets the kernel's dynamic shared memory size once
// per device (the first run on a device; the benchmark's warm-up runs before any capture) and
// launches on the caller's stream (cudaLaunchKernelExC for clusters of 2).
//
// Build (bench/cutlass_conv.py `build` does it): nvcc -arch sm_90a, -O3, -std=c++17,
// --expt-relaxed-constexpr, -shared, static cudart. Every config compiles in any translation
// unit; the build compiles one part per config in parallel (-DTCTUNE_PART=i) plus the
// registry (-DTCTUNE_PART=-1) and links them. Without TCTUNE_PART one nvcc call builds all.

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>

// The include order of CUTLASS's own sm90 conv tests (the collective headers rely on it).
#include "cutlass/cutlass.h"
#include "cute/tensor.hpp"
#include "cute/atom/mma_atom.hpp"
#include "cutlass/numeric_types.h"
#include "cutlass/conv/device/conv_universal_adapter.hpp"
#include "cutlass/conv/kernel/conv_universal.hpp"
#include "cutlass/conv/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"

#define TCTUNE_API extern "C" __attribute__((visibility("default")))

// Bumped whenever an exported signature changes; bench/cutlass_conv.py checks it.
#define TCTUNE_CUTLASS_ABI 1

// Status codes returned by can_implement and run (tctune_cutlass_status_string names them).
enum TctuneStatus : int {
  kOk = 0,
  kBadConfig = 1,        // config index out of range
  kBadShape = 2,         // non-positive extents, empty output, or sizes past int32
  kChannelsAlign = 3,    // C not a multiple of one 16-byte TMA vector (8 fp16 / 16 int8)
  kOutputAlign = 4,      // K not a multiple of one 16-byte output vector (8 fp16 / 16 int8)
  kCutlassRefused = 5,   // TMA im2col limits: CUTLASS's can_implement, and stride <= 8
  kWorkspace = 6,        // workspace smaller than workspace_size
  kPointerAlign = 7,     // x, w or y not 16-byte aligned (TMA descriptors need it)
  kSetup = 8,            // cudaGetDevice / cudaFuncSetAttribute before the launch failed
  kLaunch = 9,           // the launch failed (tctune_cutlass_last_error says why)
};

namespace tctune_cutlass {

struct ConvShape2d {
  int n, h, w, c, k, r, s;
  int pad_h, pad_w, stride_h, stride_w, dil_h, dil_w;
};

struct Entry {
  const char* name;
  const char* precision;  // "fp16" or "int8", as kernels.spec.Precision spells them
  int tile_m, tile_n, tile_k, cluster_m, cluster_n, cluster_k;
  int smem_bytes, threads, stages;
  int (*can_implement)(const ConvShape2d&);
  size_t (*workspace_size)(const ConvShape2d&);
  int (*run)(const ConvShape2d&, const void*, const void*, void*, float, void*, size_t,
             cudaStream_t);
};

// The last CUDA error of a failed run on this thread, for tctune_cutlass_last_error.
inline thread_local char g_last_error[256] = "";

inline void set_last_error(const char* what, cudaError_t err) {
  std::snprintf(g_last_error, sizeof(g_last_error), "%s: %s (%s)", what,
                cudaGetErrorName(err), cudaGetErrorString(err));
}

inline int64_t out_extent(int in, int pad, int dil, int f, int stride) {
  return (int64_t(in) + 2 * int64_t(pad) - (int64_t(dil) * (f - 1) + 1)) / stride + 1;
}

// Checks that do not depend on the config beyond its element sizes; the reasons the Python side
// reports come from these codes.
inline int check_shape(const ConvShape2d& s, int in_align, int out_align) {
  if (s.n < 1 || s.h < 1 || s.w < 1 || s.c < 1 || s.k < 1 || s.r < 1 || s.s < 1 ||
      s.pad_h < 0 || s.pad_w < 0 || s.stride_h < 1 || s.stride_w < 1 || s.dil_h < 1 ||
      s.dil_w < 1) {
    return kBadShape;
  }
  int64_t p = out_extent(s.h, s.pad_h, s.dil_h, s.r, s.stride_h);
  int64_t q = out_extent(s.w, s.pad_w, s.dil_w, s.s, s.stride_w);
  if (p < 1 || q < 1) {
    return kBadShape;
  }
  constexpr int64_t kMax = INT32_MAX;
  if (int64_t(s.n) * s.h * s.w * s.c > kMax || int64_t(s.k) * s.r * s.s * s.c > kMax ||
      int64_t(s.n) * p * q * s.k > kMax) {
    return kBadShape;
  }
  if (s.c % in_align != 0) {
    return kChannelsAlign;
  }
  if (s.k % out_align != 0) {
    return kOutputAlign;
  }
  // The conv stride is the TMA im2col traversal stride, at most 8; CUTLASS's can_implement does
  // not check it and the descriptor encoding would fail (unchecked with NDEBUG).
  if (s.stride_h > 8 || s.stride_w > 8) {
    return kCutlassRefused;
  }
  return kOk;
}

template <class ElementIn_, class ElementAcc_, class ElementOut_, int TileM, int TileN, int TileK,
          int ClusterM>
struct Fprop {
  using ElementIn = ElementIn_;
  using ElementAcc = ElementAcc_;
  using ElementOut = ElementOut_;
  using ElementCompute = float;  // the epilogue's arithmetic and alpha's type
  static constexpr int kAlignIn = 128 / cutlass::sizeof_bits<ElementIn>::value;
  static constexpr int kAlignOut = 128 / cutlass::sizeof_bits<ElementOut>::value;

  // The K mode of a conv tile is itself a shape (CUTLASS's sm90 conv tests spell it so).
  using TileShape = cute::Shape<cute::Int<TileM>, cute::Int<TileN>, cute::Shape<cute::Int<TileK>>>;
  using ClusterShape = cute::Shape<cute::Int<ClusterM>, cute::_1, cute::_1>;

  // No source tensor C (void): D = alpha * acc only, so the epilogue never loads C.
  using FusionOp =
      cutlass::epilogue::fusion::LinearCombination<ElementOut, ElementCompute, void, ElementCompute>;

  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, ElementAcc, ElementCompute,
      void, cutlass::layout::TensorNHWC, kAlignOut,
      ElementOut, cutlass::layout::TensorNHWC, kAlignOut,
      cutlass::epilogue::TmaWarpSpecialized, FusionOp>::CollectiveOp;

  using CollectiveMainloop = typename cutlass::conv::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, cutlass::conv::Operator::kFprop,
      ElementIn, cutlass::layout::TensorNHWC, kAlignIn,   // activations NHWC
      ElementIn, cutlass::layout::TensorNHWC, kAlignIn,   // filters KRSC (same 4-D tag)
      ElementAcc, TileShape, ClusterShape,
      cutlass::conv::collective::StageCountAutoCarveout<
          static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>::CollectiveOp;

  using ProblemShape = cutlass::conv::ConvProblemShape<cutlass::conv::Operator::kFprop,
                                                       CollectiveMainloop::NumSpatialDimensions>;
  static_assert(ProblemShape::RankS == 2, "2-D convolution");
  using Kernel = cutlass::conv::kernel::ConvUniversal<ProblemShape, CollectiveMainloop,
                                                      CollectiveEpilogue>;
  using Conv = cutlass::conv::device::ConvUniversalAdapter<Kernel>;
  using Arguments = typename Conv::Arguments;

  static ProblemShape problem(const ConvShape2d& s) {
    // PyTorch's conv2d is a cross-correlation; padding is symmetric.
    return ProblemShape(cutlass::conv::Mode::kCrossCorrelation,
                        {s.n, s.h, s.w, s.c}, {s.k, s.r, s.s, s.c},
                        {s.pad_h, s.pad_w}, {s.pad_h, s.pad_w},
                        {s.stride_h, s.stride_w}, {s.dil_h, s.dil_w}, 1);
  }

  static Arguments arguments(const ConvShape2d& s, const void* x, const void* w, void* y,
                             float alpha) {
    ProblemShape ps = problem(s);
    // The output's (Q, P, N) strides in CUTLASS's mode order, from the packed NPQK strides
    // (as CUTLASS's conv testbed sets them).
    typename Kernel::StrideC stride_c{};
    typename Kernel::StrideD stride_d{};
    cute::for_each(cute::make_seq<cute::rank<0>(typename Kernel::StrideD{})>{}, [&](auto i) {
      cute::get<0, i>(stride_c) = ps.stride_C[ProblemShape::RankT - 2 - i];
      cute::get<0, i>(stride_d) = ps.stride_C[ProblemShape::RankT - 2 - i];
    });
    typename Kernel::MainloopArguments mainloop{static_cast<const ElementIn*>(x),
                                                static_cast<const ElementIn*>(w)};
    typename Kernel::EpilogueArguments epilogue{{}, nullptr, stride_c,
                                                static_cast<ElementOut*>(y), stride_d};
    epilogue.thread.alpha = alpha;
    epilogue.thread.beta = 0.0f;
    return Arguments(ps, mainloop, epilogue);
  }

  static int can_implement(const ConvShape2d& s) {
    int st = check_shape(s, kAlignIn, kAlignOut);
    if (st != kOk) {
      return st;
    }
    // Aligned dummy pointers: only the shape matters here.
    alignas(128) static char dummy[128];
    Arguments args = arguments(s, dummy, dummy, dummy, 1.0f);
    return Conv::can_implement(args) == cutlass::Status::kSuccess ? kOk : kCutlassRefused;
  }

  static size_t workspace_size(const ConvShape2d& s) {
    alignas(128) static char dummy[128];
    return Conv::get_workspace_size(arguments(s, dummy, dummy, dummy, 1.0f));
  }

  // Sets the kernel's dynamic shared memory limit once per device (it is per device, and the
  // first run happens in the benchmark's warm-up, outside any graph capture).
  static int prepare() {
    static std::atomic<bool> done[64];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) {
      set_last_error("cudaGetDevice", err);
      return kSetup;
    }
    if (dev >= 0 && dev < 64 && done[dev].load(std::memory_order_acquire)) {
      return kOk;
    }
    int smem = Kernel::SharedStorageSize;
    if (smem >= (48 << 10)) {
      err = cudaFuncSetAttribute(cutlass::device_kernel<Kernel>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (err != cudaSuccess) {
        set_last_error("cudaFuncSetAttribute", err);
        return kSetup;
      }
    }
    if (dev >= 0 && dev < 64) {
      done[dev].store(true, std::memory_order_release);
    }
    return kOk;
  }

  static int run(const ConvShape2d& s, const void* x, const void* w, void* y, float alpha,
                 void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    int st = check_shape(s, kAlignIn, kAlignOut);
    if (st != kOk) {
      return st;
    }
    auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
    if (misaligned(x) || misaligned(w) || misaligned(y)) {
      return kPointerAlign;
    }
    Arguments args = arguments(s, x, w, y, alpha);
    // Cheap host checks; a refused shape would otherwise give bad TMA descriptors.
    if (Conv::can_implement(args) != cutlass::Status::kSuccess) {
      return kCutlassRefused;
    }
    if (Conv::get_workspace_size(args) > workspace_bytes) {
      return kWorkspace;
    }
    st = prepare();
    if (st != kOk) {
      return st;
    }
    // Params (TMA descriptors) on the host, then the static launch: no allocation, no sync.
    typename Kernel::Params params = Kernel::to_underlying_arguments(args, workspace);
    cutlass::Status launched = Conv::run(params, stream);
    if (launched != cutlass::Status::kSuccess) {
      cudaError_t err = cudaGetLastError();
      set_last_error("launch", err);
      return kLaunch;
    }
    return kOk;
  }

  static Entry entry(const char* name, const char* precision) {
    using Mma = CollectiveMainloop;
    return Entry{name, precision, TileM, TileN, TileK, ClusterM, 1, 1,
                 int(Kernel::SharedStorageSize), int(Kernel::MaxThreadsPerBlock),
                 int(Mma::DispatchPolicy::Stages), &can_implement, &workspace_size, &run};
  }
};

}  // namespace tctune_cutlass

// The configs: X(index, name, precision, input, accumulator, output, tile M, N, K, cluster M).
// Tile K is 128 bytes of input (64 fp16, 128 int8): one 128-byte swizzled row per stage.
#define TCTUNE_CUTLASS_CONFIGS(X)                                                            \
  X(0, "fp16_128x128x64_c1x1x1", "fp16", cutlass::half_t, float, cutlass::half_t, 128, 128, 64, 1) \
  X(1, "fp16_128x128x64_c2x1x1", "fp16", cutlass::half_t, float, cutlass::half_t, 128, 128, 64, 2) \
  X(2, "fp16_64x128x64_c1x1x1", "fp16", cutlass::half_t, float, cutlass::half_t, 64, 128, 64, 1)   \
  X(3, "fp16_64x256x64_c1x1x1", "fp16", cutlass::half_t, float, cutlass::half_t, 64, 256, 64, 1)   \
  X(4, "int8_128x128x128_c1x1x1", "int8", int8_t, int32_t, int8_t, 128, 128, 128, 1)              \
  X(5, "int8_128x128x128_c2x1x1", "int8", int8_t, int32_t, int8_t, 128, 128, 128, 2)              \
  X(6, "int8_64x128x128_c1x1x1", "int8", int8_t, int32_t, int8_t, 64, 128, 128, 1)                \
  X(7, "int8_64x256x128_c1x1x1", "int8", int8_t, int32_t, int8_t, 64, 256, 128, 1)

namespace tctune_cutlass {
// The entry of a config compiled in this translation unit; naming Cfg in MaybeEntry<false, Cfg>
// does not instantiate its kernel, so a part compiles one config's device code only.
template <bool On, class Cfg>
struct MaybeEntry {
  static const Entry* get(const char*, const char*) { return nullptr; }
};
template <class Cfg>
struct MaybeEntry<true, Cfg> {
  static const Entry* get(const char* name, const char* precision) {
    static const Entry e = Cfg::entry(name, precision);
    return &e;
  }
};
}  // namespace tctune_cutlass

#define TCTUNE_CAT_(a, b) a##b
#define TCTUNE_CAT(a, b) TCTUNE_CAT_(a, b)

#if defined(TCTUNE_PART) && TCTUNE_PART >= 0
// One part of a parallel build: config TCTUNE_PART's kernel and its entry.
#define TCTUNE_PART_ENTRY(I, NAME, PREC, IN, ACC, OUT, TM, TN, TK, CM)                         \
  if (I == TCTUNE_PART)                                                                      \
    return tctune_cutlass::MaybeEntry<I == TCTUNE_PART,                                      \
        tctune_cutlass::Fprop<IN, ACC, OUT, TM, TN, TK, CM>>::get(NAME, PREC);
const tctune_cutlass::Entry* TCTUNE_CAT(tctune_cutlass_part_entry_, TCTUNE_PART)() {
  TCTUNE_CUTLASS_CONFIGS(TCTUNE_PART_ENTRY)
  return nullptr;
}
#else
// The registry and the C API: a plain build (every config here) or the registry part (-1).
// TCTUNE_BUILT_MASK (bit i: config i) leaves configs out of a quick build; the library then
// numbers the configs it has from 0.
#ifndef TCTUNE_BUILT_MASK
#define TCTUNE_BUILT_MASK 0xFFFFFFFFu
#endif
#define TCTUNE_BUILT(I) ((((TCTUNE_BUILT_MASK) >> (I)) & 1u) != 0)
#define TCTUNE_COUNT_ONE(...) +1
static constexpr int kNumConfigs = 0 TCTUNE_CUTLASS_CONFIGS(TCTUNE_COUNT_ONE);

#if defined(TCTUNE_PART)
// A part left out of the build is never referenced (only PartRef<true, I>::get names it).
template <bool Built, int I>
struct PartRef {
  static const tctune_cutlass::Entry* get() { return nullptr; }
};
#define TCTUNE_DECLARE_PART(I, ...)                                                           \
  const tctune_cutlass::Entry* tctune_cutlass_part_entry_##I();                              \
  template <>                                                                                \
  struct PartRef<true, I> {                                                                  \
    static const tctune_cutlass::Entry* get() { return tctune_cutlass_part_entry_##I(); }    \
  };
TCTUNE_CUTLASS_CONFIGS(TCTUNE_DECLARE_PART)
#define TCTUNE_TABLE_ROW(I, ...) PartRef<TCTUNE_BUILT(I), I>::get(),
#else
#define TCTUNE_TABLE_ROW(I, NAME, PREC, IN, ACC, OUT, TM, TN, TK, CM)                          \
  tctune_cutlass::MaybeEntry<TCTUNE_BUILT(I),                                                \
                             tctune_cutlass::Fprop<IN, ACC, OUT, TM, TN, TK, CM>>::get(NAME,  \
                                                                                       PREC),
#endif

namespace {
struct Table {
  const tctune_cutlass::Entry* rows[kNumConfigs];
  int count;
};

const Table& table() {
  static const Table t = [] {
    const tctune_cutlass::Entry* const all[] = {TCTUNE_CUTLASS_CONFIGS(TCTUNE_TABLE_ROW)};
    static_assert(sizeof(all) / sizeof(all[0]) == kNumConfigs, "one row per config");
    Table built{};
    for (const tctune_cutlass::Entry* e : all) {
      if (e != nullptr) {
        built.rows[built.count++] = e;
      }
    }
    return built;
  }();
  return t;
}

const tctune_cutlass::Entry* entry(int config) {
  const Table& t = table();
  return (config >= 0 && config < t.count) ? t.rows[config] : nullptr;
}

tctune_cutlass::ConvShape2d shape_of(int n, int h, int w, int c, int k, int r, int s, int pad_h,
                                     int pad_w, int stride_h, int stride_w, int dil_h,
                                     int dil_w) {
  return tctune_cutlass::ConvShape2d{n, h, w, c, k, r, s, pad_h, pad_w,
                                     stride_h, stride_w, dil_h, dil_w};
}
}  // namespace

#define TCTUNE_SHAPE_PARAMS                                                                   \
  int n, int h, int w, int c, int k, int r, int s, int pad_h, int pad_w, int stride_h,       \
      int stride_w, int dil_h, int dil_w
#define TCTUNE_SHAPE_ARGS n, h, w, c, k, r, s, pad_h, pad_w, stride_h, stride_w, dil_h, dil_w

TCTUNE_API int tctune_cutlass_abi_version(void) { return TCTUNE_CUTLASS_ABI; }

TCTUNE_API int tctune_cutlass_num_configs(void) { return table().count; }

TCTUNE_API const char* tctune_cutlass_config_name(int config) {
  const tctune_cutlass::Entry* e = entry(config);
  return e ? e->name : nullptr;
}

TCTUNE_API const char* tctune_cutlass_config_precision(int config) {
  const tctune_cutlass::Entry* e = entry(config);
  return e ? e->precision : nullptr;
}

// out[9] = tile M, N, K, cluster M, N, K, shared memory bytes, threads per CTA, stages.
TCTUNE_API int tctune_cutlass_config_info(int config, int* out) {
  const tctune_cutlass::Entry* e = entry(config);
  if (!e) {
    return kBadConfig;
  }
  const int v[9] = {e->tile_m, e->tile_n, e->tile_k, e->cluster_m, e->cluster_n,
                    e->cluster_k, e->smem_bytes, e->threads, e->stages};
  for (int i = 0; i < 9; ++i) {
    out[i] = v[i];
  }
  return kOk;
}

TCTUNE_API int tctune_cutlass_can_implement(int config, TCTUNE_SHAPE_PARAMS) {
  const tctune_cutlass::Entry* e = entry(config);
  return e ? e->can_implement(shape_of(TCTUNE_SHAPE_ARGS)) : kBadConfig;
}

TCTUNE_API size_t tctune_cutlass_workspace_size(int config, TCTUNE_SHAPE_PARAMS) {
  const tctune_cutlass::Entry* e = entry(config);
  return e ? e->workspace_size(shape_of(TCTUNE_SHAPE_ARGS)) : 0;
}

// Enqueues y = conv(x, w) on `stream` (a cudaStream_t; null: the legacy default stream).
// alpha: the epilogue's scale (1 for fp16; the requantization scale for int8).
TCTUNE_API int tctune_cutlass_run(int config, TCTUNE_SHAPE_PARAMS, const void* x_ptr,
                                  const void* w_ptr, void* y_ptr, float alpha, void* workspace,
                                  size_t workspace_bytes, void* stream) {
  const tctune_cutlass::Entry* e = entry(config);
  if (!e) {
    return kBadConfig;
  }
  return e->run(shape_of(TCTUNE_SHAPE_ARGS), x_ptr, w_ptr, y_ptr, alpha, workspace,
                workspace_bytes, static_cast<cudaStream_t>(stream));
}

TCTUNE_API const char* tctune_cutlass_status_string(int status) {
  switch (status) {
    case kOk: return "ok";
    case kBadConfig: return "no such config";
    case kBadShape: return "invalid shape (extents, empty output, or past int32)";
    case kChannelsAlign:
      return "C is not a multiple of a 16-byte vector (8 fp16 / 16 int8): TMA im2col needs it";
    case kOutputAlign:
      return "K is not a multiple of a 16-byte vector (8 fp16 / 16 int8): the TMA epilogue "
             "needs it";
    case kCutlassRefused:
      return "TMA im2col limits refuse the shape (padding and the corners it gives, "
             "(R-1)*dilation below 255, stride at most 8)";
    case kWorkspace: return "workspace smaller than workspace_size";
    case kPointerAlign: return "x, w or y is not 16-byte aligned";
    case kSetup:
      return "CUDA setup before the launch failed (cudaGetDevice or cudaFuncSetAttribute: see "
             "last_error)";
    case kLaunch: return "kernel launch failed (see last_error)";
    default: return "unknown status";
  }
}

TCTUNE_API const char* tctune_cutlass_last_error(void) { return tctune_cutlass::g_last_error; }
#endif
