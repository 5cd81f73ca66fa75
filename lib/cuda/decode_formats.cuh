// The weight formats the decode kernels (the GEMV, int4_gemv.cu; the MoE layer, moe_layer.cu)
// read, each a compile-time decode policy, and the one place a run-time format picks one.
//
// A policy F is a type with, all static:
//   kFormat                        the qmoe_weight_format it reads
//   Walk, Row, Batch<U>            a walk's matrix fields, a lane's row pointers, a batch of
//                                  loads in flight (registers)
//   batch_quads(L, MAXM, params)   quads per batch under the kernels' register cap
//   valid(w)                       whether a description is one the policy's code may read
//   scale_bytes(w)                 bytes of one scale-plane element
//   walk(w), row(w, group, r)      the walk's fields and a lane's row of a group
//   prime<U, kAhead>(a, b, ...), run<L, MAXM, U, kAhead>(a, b, ...)
//                                  the walk (int4_tile.cuh's two-batch pipeline; kAhead, 0
//                                  by default, batches more in flight as L1 prefetches)
//   finish<L>(sum, w)              a row's sum turned into the output before its bias
// The kernels take F as a template parameter, so every format's walk is its own straight-line
// code and no format test runs inside a loop; the launchers pick the instantiation once per
// launch with with_decode_format(). A new format is its policy (its loads and arithmetic) and
// one row of QMOE_CUDA_DECODE_FORMATS.
#ifndef QMOE_LIB_CUDA_DECODE_FORMATS_CUH_
#define QMOE_LIB_CUDA_DECODE_FORMATS_CUH_

#include "lib/cuda/e2m1_tile.cuh"
#include "lib/cuda/int3_tile.cuh"
#include "lib/cuda/int4_tile.cuh"

namespace qmoe::cuda {

// INT4 (int4_tile.cuh): FP32/FP16/BF16 scales per 16..128 k, optional zero points.
struct Int4Decode {
  static constexpr qmoe_weight_format kFormat = QMOE_WEIGHT_FORMAT_INT4;
  using Walk = WalkMatrix;
  using Row = LaneRow;
  template <int U>
  using Batch = cuda::Batch<U>;

  __host__ __device__ static constexpr int batch_quads(Level level, int max_m, bool params_matrix) {
    return cuda::batch_quads(level, max_m, params_matrix);
  }
  __host__ __device__ static bool valid(const DeviceQuantMatrix& w) {
    return w.format == kFormat && quant_matrix_is_valid(w);
  }
  __device__ __forceinline__ static uint32_t scale_bytes(const DeviceQuantMatrix& w) {
    return cuda::scale_bytes(w.scale_dtype);
  }
  __device__ __forceinline__ static Walk walk(const DeviceQuantMatrix& w) { return walk_matrix(w); }
  __device__ __forceinline__ static Row row(const DeviceQuantMatrix& w, uint32_t group,
                                            uint32_t r) {
    return lane_row(w, group, r);
  }
  template <int U, int kAhead = 0>
  __device__ __forceinline__ static void prime(Batch<U>& a, Batch<U>& b, const Walk& w,
                                               const Row& lr, const QuadWalk& qw, uint32_t q0) {
    prime_walk<U, kAhead>(a, b, w, lr, qw, q0);
  }
  template <Level L, int MAXM, int U, int kAhead = 0>
  __device__ __forceinline__ static void run(Batch<U>& a, Batch<U>& b, const Walk& w, const Row& lr,
                                             const QuadWalk& qw, uint32_t q0,
                                             const unsigned char* xs, float acc[MAXM]) {
    run_walk<L, MAXM, U, kAhead>(a, b, w, lr, qw, q0, xs, acc);
  }
  // The sums are the outputs: scales and zero points were applied per block.
  template <Level L>
  __device__ __forceinline__ static float finish(float sum, const DeviceQuantMatrix&) {
    return sum;
  }
};

// INT3 (int3_tile.cuh): INT4's walk, description, planes and arithmetic over INT3's 96-byte
// tiles, whose codes the lanes rebuild into INT4's nibble words (Int3Codes; zero point 4 without
// a plane). A slot holds the same 16 code bytes a lane, so INT4's batch sizes fit the register
// cap; but the GEMV at M <= 2 walks two quads a batch where INT4 walks three: with the rebuild's
// work per quad, three were 6% slower at gpt-oss's shape at both levels, and one no faster
// (docs/results/2026-12-05-int3-gpu-decode.md).
struct Int3Decode : Int4Decode {
  static constexpr qmoe_weight_format kFormat = QMOE_WEIGHT_FORMAT_INT3;
  __host__ __device__ static constexpr int batch_quads(Level level, int max_m, bool params_matrix) {
    return params_matrix && max_m <= 2 ? 2 : cuda::batch_quads(level, max_m, params_matrix);
  }
  __host__ __device__ static bool valid(const DeviceQuantMatrix& w) {
    return w.format == kFormat && quant_matrix_is_valid(w);
  }
  __device__ __forceinline__ static Row row(const DeviceQuantMatrix& w, uint32_t group,
                                            uint32_t r) {
    return int3_lane_row(w, group, r);
  }
  template <int U, int kAhead = 0>
  __device__ __forceinline__ static void prime(Batch<U>& a, Batch<U>& b, const Walk& w,
                                               const Row& lr, const QuadWalk& qw, uint32_t q0) {
    prime_walk<U, kAhead, Int3Codes>(a, b, w, lr, qw, q0);
  }
  template <Level L, int MAXM, int U, int kAhead = 0>
  __device__ __forceinline__ static void run(Batch<U>& a, Batch<U>& b, const Walk& w, const Row& lr,
                                             const QuadWalk& qw, uint32_t q0,
                                             const unsigned char* xs, float acc[MAXM]) {
    run_walk<L, MAXM, U, kAhead, Int3Codes>(a, b, w, lr, qw, q0, xs, acc);
  }
};

// INT4 or INT3 whose every matrix has the lean layout (int4_lean_layout): the same walk as
// Base's lean path, without its general path. The MoE kernels take it when every expert of the
// set has that layout (MoeLayerParams::lean_walk). Why a policy of its own: those kernels run at
// the register cap of int4_tile.cuh, and a kernel that holds both walks allocates for the larger
// one, which pushed the lean walk's state to local memory (the spill counts are in
// docs/results/2026-12-03-h200-moe-lean-walk.md, INT3's in
// docs/results/2026-12-05-int3-gpu-decode.md). A description that is not lean is not valid here,
// so a slot that breaks the promise is reported, never read with the wrong walk.
template <class Base, class Codes>
struct LeanDecode : Base {
  using typename Base::Row;
  using typename Base::Walk;
  template <int U>
  using Batch = typename Base::template Batch<U>;

  __host__ __device__ static bool valid(const DeviceQuantMatrix& w) {
    return Base::valid(w) && int4_lean_layout(w);
  }
  template <int U, int kAhead = 0>
  __device__ __forceinline__ static void prime(Batch<U>& a, Batch<U>& b, const Walk& w,
                                               const Row& lr, const QuadWalk& qw, uint32_t q0) {
    prime_walk_with<Int4BatchOps<true, Codes>, U, kAhead>(a, b, w, lr, qw, q0);
  }
  template <Level L, int MAXM, int U, int kAhead = 0>
  __device__ __forceinline__ static void run(Batch<U>& a, Batch<U>& b, const Walk& w, const Row& lr,
                                             const QuadWalk& qw, uint32_t q0,
                                             const unsigned char* xs, float acc[MAXM]) {
    run_walk_with<Int4BatchOps<true, Codes>, L, MAXM, U, kAhead>(a, b, w, lr, qw, q0, xs, acc);
  }
};
using Int4LeanDecode = LeanDecode<Int4Decode, Int4Codes>;
using Int3LeanDecode = LeanDecode<Int3Decode, Int3Codes>;

// The formats with a lean policy: the layout test both sides share (the host, when a device
// expert set is made; the kernels' launcher, when it picks them).
__host__ __device__ constexpr bool has_lean_decode(qmoe_weight_format format) {
  return format == QMOE_WEIGHT_FORMAT_INT4 || format == QMOE_WEIGHT_FORMAT_INT3;
}

// The list: one row per format, (qmoe_weight_format value, policy).
#define QMOE_CUDA_DECODE_FORMATS(X)        \
  X(QMOE_WEIGHT_FORMAT_INT4, Int4Decode)   \
  X(QMOE_WEIGHT_FORMAT_INT3, Int3Decode)   \
  X(QMOE_WEIGHT_FORMAT_MXFP4, Mxfp4Decode) \
  X(QMOE_WEIGHT_FORMAT_NVFP4, Nvfp4Decode)

// Calls fn(F{}) with the policy of `format` and returns true, or returns false for a format the
// decode kernels do not read. Host side: the launchers' one choice per launch.
template <class Fn>
bool with_decode_format(qmoe_weight_format format, Fn&& fn) {
#define QMOE_CUDA_DECODE_FORMAT_CASE(value, Policy) \
  case value:                                       \
    fn(Policy{});                                   \
    return true;
  switch (format) {
    QMOE_CUDA_DECODE_FORMATS(QMOE_CUDA_DECODE_FORMAT_CASE)
    default:
      return false;
  }
#undef QMOE_CUDA_DECODE_FORMAT_CASE
}

// Whether a description is one the decode kernels read (its format's valid()).
__host__ __device__ inline bool decode_matrix_is_valid(const DeviceQuantMatrix& w) {
#define QMOE_CUDA_DECODE_FORMAT_CASE(value, Policy) \
  case value:                                       \
    return Policy::valid(w);
  switch (w.format) {
    QMOE_CUDA_DECODE_FORMATS(QMOE_CUDA_DECODE_FORMAT_CASE)
    default:
      return false;
  }
#undef QMOE_CUDA_DECODE_FORMAT_CASE
}

}  // namespace qmoe::cuda

#endif  // QMOE_LIB_CUDA_DECODE_FORMATS_CUH_
