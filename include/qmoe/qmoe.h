/*
 * libqmoe: quantized mixture-of-experts kernels with CPU/GPU expert offload.
 *
 * The stable C ABI: what a runtime links against. C99-clean; C++ callers include it as it is.
 * Introspection and measurement calls are in qmoe/qmoe_experimental.h (no stability promise),
 * the CUDA calls in qmoe/qmoe_cuda.h.
 *
 * Conventions that hold for every function below:
 *  - Every function that can fail returns a qmoe_status. On failure it writes nothing through
 *    its output pointers except where stated, and qmoe_last_error_message() on the calling
 *    thread describes the failure in one line.
 *  - Public enum values are fixed forever: new values are appended, none is renumbered.
 *  - Structs passed in start with `struct_size`, set by the caller to sizeof the struct it was
 *    compiled against, so a newer library can read an older caller's struct (missing trailing
 *    fields take their defaults) and an older library rejects nothing it understands. A size
 *    below the struct's first version, above 64 KiB, or ending inside a field (no version had
 *    that size) is INVALID_ARGUMENT.
 *  - A NULL out-pointer, or a NULL input with a nonzero count, is INVALID_ARGUMENT; a NULL,
 *    destroyed or foreign context is INVALID_CONTEXT (a set: INVALID_ARGUMENT). An enum value
 *    the function does not take is INVALID_ARGUMENT (an unknown weight format:
 *    UNSUPPORTED_FORMAT). Sizes and strides whose byte span overflows size_t or runs past the
 *    end of the address space are INVALID_ARGUMENT, as are outputs that overlap the inputs
 *    where a function says they must not.
 *  - The *_init functions and qmoe_free_weight_memory take NULL and do nothing.
 */
#ifndef QMOE_QMOE_H_
#define QMOE_QMOE_H_

#include <stddef.h>
#include <stdint.h>

#include "qmoe/qmoe_export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Version
 * ------------------------------------------------------------------------------------------- */

#define QMOE_VERSION_MAJOR 0
#define QMOE_VERSION_MINOR 2
#define QMOE_VERSION_PATCH 0
/** MAJOR * 10000 + MINOR * 100 + PATCH, comparable with qmoe_version_number(). */
#define QMOE_VERSION_NUMBER \
  (QMOE_VERSION_MAJOR * 10000 + QMOE_VERSION_MINOR * 100 + QMOE_VERSION_PATCH)
#define QMOE_VERSION_STRINGIFY_(x) #x
#define QMOE_VERSION_STRINGIFY(x) QMOE_VERSION_STRINGIFY_(x)
#define QMOE_VERSION_STRING                  \
  QMOE_VERSION_STRINGIFY(QMOE_VERSION_MAJOR) \
  "." QMOE_VERSION_STRINGIFY(QMOE_VERSION_MINOR) "." QMOE_VERSION_STRINGIFY(QMOE_VERSION_PATCH)

/// Version number of the library actually loaded (compare with QMOE_VERSION_NUMBER).
QMOE_API unsigned qmoe_version_number(void);
/// Version string of the library actually loaded, "MAJOR.MINOR.PATCH"; static storage.
QMOE_API const char* qmoe_version_string(void);

/* ---------------------------------------------------------------------------------------------
 * Status and errors
 * ------------------------------------------------------------------------------------------- */

/** Result of every fallible call. Values are fixed; new ones are appended. */
typedef enum qmoe_status {
  QMOE_STATUS_OK = 0,
  /** A pointer, size, stride or enum value is outside what the call accepts. */
  QMOE_STATUS_INVALID_ARGUMENT = 1,
  /** The host CPU (or GPU) cannot run what was asked, e.g. an ISA tier it lacks. */
  QMOE_STATUS_UNSUPPORTED_HARDWARE = 2,
  /** A data format or option this build does not implement. */
  QMOE_STATUS_UNSUPPORTED_FORMAT = 3,
  /** An allocation failed. */
  QMOE_STATUS_OUT_OF_MEMORY = 4,
  /** The context handle is null, was destroyed, or is not a qmoe context. */
  QMOE_STATUS_INVALID_CONTEXT = 5,
  /** A CUDA runtime call failed; the message names it. */
  QMOE_STATUS_CUDA_ERROR = 6,
  /** No CUDA: the build has no CUDA support, or there is no device or usable driver. */
  QMOE_STATUS_CUDA_UNAVAILABLE = 7,
  /** A wait exceeded its deadline. */
  QMOE_STATUS_TIMEOUT = 8,
  /** A bug in libqmoe; please report it with the message. */
  QMOE_STATUS_INTERNAL_ERROR = 9,
  /** The OS failed a file operation (open, read, write, flush, rename); the message has its
   * reason. */
  QMOE_STATUS_IO_ERROR = 10,
  /** A file's bytes fail its format's checks (magic, sizes, checksums); the message names the
   * field. */
  QMOE_STATUS_CORRUPT_DATA = 11
} qmoe_status;

/// Name of a status ("QMOE_STATUS_OK", ...); "QMOE_STATUS_<unknown>" for other values.
QMOE_API const char* qmoe_status_string(qmoe_status status);
/// One-line detail of the last failure on the calling thread; "" when none. Valid until the
/// thread's next failing qmoe call.
QMOE_API const char* qmoe_last_error_message(void);

/* ---------------------------------------------------------------------------------------------
 * CPU instruction-set tiers and host information
 * ------------------------------------------------------------------------------------------- */

/** Kernel tiers. Each tier implies the ones below it. Values 4-15 are reserved for further x86
 * tiers, 16-31 for Arm (NEON, SVE) and 32-47 for other architectures; a tier a build does not
 * have is UNSUPPORTED_HARDWARE wherever one is asked for. */
typedef enum qmoe_isa {
  /** In options: "the process default" (best tier, capped by QMOE_MAX_ISA). */
  QMOE_ISA_DEFAULT = 0,
  /** Portable C++; the only tier on non-x86 hosts. */
  QMOE_ISA_SCALAR = 1,
  /** AVX2 + FMA + F16C with OS-enabled YMM state. */
  QMOE_ISA_AVX2 = 2,
  /** AVX-512 F + BW + DQ + VL with OS-enabled ZMM/opmask state. */
  QMOE_ISA_AVX512 = 3
} qmoe_isa;

/// Lower-case name of a tier ("scalar", "avx2", "avx512", "default"); "unknown" otherwise.
QMOE_API const char* qmoe_isa_name(qmoe_isa isa);
/// The tier named `name` (qmoe_isa_name's names but "default", ASCII case-insensitive), for a
/// runtime's own configuration strings: INVALID_ARGUMENT for any other name or NULL. Whether
/// the host runs it is another question (qmoe_context_create answers it).
QMOE_API qmoe_status qmoe_isa_from_name(const char* name, qmoe_isa* isa);

/** CPU feature bits of qmoe_host_info.cpu_features; each set bit means the CPU has the
 * feature and the OS saves its register state. Bit positions are fixed. */
enum {
  QMOE_CPU_FEATURE_AVX = 1u << 0,
  QMOE_CPU_FEATURE_AVX2 = 1u << 1,
  QMOE_CPU_FEATURE_FMA = 1u << 2,
  QMOE_CPU_FEATURE_F16C = 1u << 3,
  QMOE_CPU_FEATURE_AVX512F = 1u << 4,
  QMOE_CPU_FEATURE_AVX512BW = 1u << 5,
  QMOE_CPU_FEATURE_AVX512DQ = 1u << 6,
  QMOE_CPU_FEATURE_AVX512VL = 1u << 7,
  QMOE_CPU_FEATURE_AVX512VNNI = 1u << 8,
  QMOE_CPU_FEATURE_AVX512BF16 = 1u << 9,
  QMOE_CPU_FEATURE_AVXVNNI = 1u << 10,
  QMOE_CPU_FEATURE_AVX512VBMI = 1u << 11,
  QMOE_CPU_FEATURE_GFNI = 1u << 12
};

/// Name of one QMOE_CPU_FEATURE_* bit ("avx2", ...); NULL for a value that is not one bit.
QMOE_API const char* qmoe_cpu_feature_name(uint32_t feature_bit);

/** What the library found about the host. Filled by qmoe_get_host_info(). */
typedef struct qmoe_host_info {
  size_t struct_size;          /**< caller sets sizeof(qmoe_host_info) */
  char cpu_brand[64];          /**< CPUID brand string, NUL-terminated; "" if unknown */
  uint32_t cpu_features;       /**< QMOE_CPU_FEATURE_* bits */
  qmoe_isa best_supported_isa; /**< best tier the host can run */
  qmoe_isa default_isa;        /**< process default: best tier capped by QMOE_MAX_ISA */
  /** QMOE_MAX_ISA as read once at init, "" when unset; and a one-line reason the default is
   * below the best tier (or why the variable was ignored), "" when it is not. */
  char max_isa_env[16];
  char default_isa_reason[128];
  uint32_t logical_processors; /**< from cpuinfo */
  uint32_t physical_cores;     /**< from cpuinfo */
  uint32_t l1d_cache_bytes;    /**< per core; 0 if unknown */
  uint32_t l2_cache_bytes;     /**< per instance; 0 if unknown */
  uint32_t l3_cache_bytes;     /**< per instance (last level); 0 if unknown */
  uint32_t l3_cache_instances; /**< number of L3 instances; 0 if unknown */
} qmoe_host_info;

/// Fill `info` (struct_size must be set and at least the size of the first fields).
/// INVALID_ARGUMENT for a NULL info or a struct_size that no version of the struct had.
QMOE_API qmoe_status qmoe_get_host_info(qmoe_host_info* info);

/* ---------------------------------------------------------------------------------------------
 * Context: the tier its kernels use and the threads it runs them on
 * ------------------------------------------------------------------------------------------- */

typedef struct qmoe_context qmoe_context;

/** The most threads a context accepts (qmoe_context_options.num_threads). */
#define QMOE_MAX_THREADS 1024u

/** One unit of parallel work: run item `index` of a range. */
typedef void (*qmoe_parallel_task_fn)(void* task_state, size_t index);
/** A host runtime's parallel-for: call task(task_state, i) once for every i in [0, range),
 * on any threads, and return when all calls have returned. */
typedef void (*qmoe_parallel_for_fn)(void* runtime_state, qmoe_parallel_task_fn task,
                                     void* task_state, size_t range);

typedef struct qmoe_context_options {
  size_t struct_size; /**< caller sets sizeof(qmoe_context_options) */
  /** Highest tier this context may use. QMOE_ISA_DEFAULT takes the process default; a tier
   * the host cannot run makes qmoe_context_create fail with UNSUPPORTED_HARDWARE. */
  qmoe_isa max_isa;
  /** Threads for the context's own pool; 0 = one per physical core; at most
   * QMOE_MAX_THREADS. Ignored when parallel_for is set (then it is the number of workers the
   * callback brings, 0 = unknown, used only to size work splits). */
  uint32_t num_threads;
  /** Optional: run parallel work on the caller's pool instead of an owned pthreadpool. */
  qmoe_parallel_for_fn parallel_for;
  void* parallel_for_state;
} qmoe_context_options;

/// Fill `options` with the defaults (struct_size set, process-default tier, all cores). NULL is
/// a no-op.
QMOE_API void qmoe_context_options_init(qmoe_context_options* options);
/// Create a context. `options` may be NULL for the defaults. On failure *context is NULL.
/// INVALID_ARGUMENT for a NULL `context`, a bad struct_size, a max_isa that is not a
/// qmoe_isa, or num_threads above QMOE_MAX_THREADS; UNSUPPORTED_HARDWARE for a tier the build
/// or host cannot run; OUT_OF_MEMORY when the context or its pool cannot be made.
QMOE_API qmoe_status qmoe_context_create(const qmoe_context_options* options,
                                         qmoe_context** context);
/// Destroy a context and its pool. NULL is accepted (OK); a destroyed handle is rejected
/// (INVALID_CONTEXT) for at least the next 64 context destructions.
QMOE_API qmoe_status qmoe_context_destroy(qmoe_context* context);
/// Tier the context's kernels use. INVALID_ARGUMENT for a NULL `isa`.
QMOE_API qmoe_status qmoe_context_get_isa(const qmoe_context* context, qmoe_isa* isa);
/// Number of threads the context splits work over (1 when it runs everything inline).
/// INVALID_ARGUMENT for a NULL `num_threads`.
QMOE_API qmoe_status qmoe_context_get_num_threads(const qmoe_context* context,
                                                  uint32_t* num_threads);

/* ---------------------------------------------------------------------------------------------
 * Row conversions (any count, any alignment; src and dst must not overlap)
 *
 * Round to nearest even; overflow to infinity; subnormals kept whatever MXCSR says; a NaN
 * stays a quiet NaN with its sign (docs/formats.md gives the payload rule). FP16 and BF16
 * values are passed as their raw uint16_t bit patterns. n == 0 is a no-op (pointers may then
 * be NULL; the context is still checked). INVALID_ARGUMENT for a NULL src or dst with n > 0,
 * n above SIZE_MAX / 4, or src and dst overlapping. Large rows are split over the context's
 * threads.
 * ------------------------------------------------------------------------------------------- */

/// dst[i] = (float)fp16 src[i], for i < n.
QMOE_API qmoe_status qmoe_convert_f16_to_f32(qmoe_context* context, const uint16_t* src, float* dst,
                                             size_t n);
/// dst[i] = fp16(src[i]) rounded to nearest even, for i < n.
QMOE_API qmoe_status qmoe_convert_f32_to_f16(qmoe_context* context, const float* src, uint16_t* dst,
                                             size_t n);
/// dst[i] = (float)bf16 src[i] (exact), for i < n.
QMOE_API qmoe_status qmoe_convert_bf16_to_f32(qmoe_context* context, const uint16_t* src,
                                              float* dst, size_t n);
/// dst[i] = bf16(src[i]) rounded to nearest even, for i < n.
QMOE_API qmoe_status qmoe_convert_f32_to_bf16(qmoe_context* context, const float* src,
                                              uint16_t* dst, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Block-quantized weights and the dequant-GEMM
 *
 * A weight matrix W[N, K] (N output features, K input features) is stored as 4-bit codes in
 * the canonical INT4 layout (docs/formats.md gives it byte by byte), plus a plane of scales and
 * optionally a plane of zero points, one per (row, block of `block_size` consecutive k):
 *   W[n, k] = (code[n, k] - zero_point[n, k / block_size]) * scale[n, k / block_size]
 * Canonical codes are tiled by 8 rows and 32 k: for row n, code k the byte is at
 *   ((n / 8) * ceil(K / 32) + k / 32) * 128 + (n % 8) * 16 + (k % 16)
 * holding code k in its low nibble when k % 32 < 16 and in its high nibble otherwise; rows
 * and codes past N and K are zero padding. The layout is read as it is by the CUDA kernels too
 * (a warp's 32 lanes read four whole chunks), so that an expert moves between host and device
 * with a plain copy. Every format uses the same tiling (8 rows by 32 k, a group's tiles
 * contiguous); docs/formats.md gives each format's bytes inside a tile. MXFP4 and NVFP4 store
 * E2M1 codes in these same nibbles, with no zero point:
 *   W[n, k] = E2M1(code[n, k]) * scale[n, k / block_size] * global_scale
 * (E2M1 codes 0-7: 0, 0.5, 1, 1.5, 2, 3, 4, 6; codes 8-15 their negatives). A NaN scale (E8M0
 * 0xFF, E4M3 0x7F or 0xFF) makes every output of its row NaN, on every tier and level.
 * ------------------------------------------------------------------------------------------- */

/** Weight formats; fixed values. qmoe_gemm_kernel_available says which this build runs (a
 * format it does not is UNSUPPORTED_FORMAT wherever a matrix is described). */
typedef enum qmoe_weight_format {
  QMOE_WEIGHT_FORMAT_INT4 = 1,  /**< unsigned 4-bit codes 0..15, default zero point 8 */
  QMOE_WEIGHT_FORMAT_INT3 = 2,  /**< unsigned 3-bit codes 0..7, default zero point 4 */
  QMOE_WEIGHT_FORMAT_MXFP4 = 3, /**< OCP MX E2M1 codes, one E8M0 scale per 32 */
  QMOE_WEIGHT_FORMAT_NVFP4 = 4  /**< E2M1 codes, one E4M3 scale per 16, one FP32 global scale */
} qmoe_weight_format;

/** Element types of activations, scale and bias planes; fixed values. */
typedef enum qmoe_dtype {
  QMOE_DTYPE_F32 = 1,
  QMOE_DTYPE_F16 = 2,    /**< IEEE binary16 bits in uint16_t */
  QMOE_DTYPE_BF16 = 3,   /**< bfloat16 bits in uint16_t */
  QMOE_DTYPE_E8M0 = 4,   /**< scales only: uint8 e, the value 2^(e - 127); 0xFF is NaN */
  QMOE_DTYPE_F8_E4M3 = 5 /**< scales only: OCP FP8 E4M3 bits in uint8 (no infinities) */
} qmoe_dtype;

/** Accuracy levels of the dequant-GEMM; fixed values. */
typedef enum qmoe_accuracy {
  /** FP32 activations and accumulation: every output within 1e-5 of an FP64 reference,
   * relative to sum_k |x_k * w_k|. */
  QMOE_ACCURACY_EXACT = 1,
  /** Activations quantized to int8 per 32 k once per call, integer dot products; the error
   * bound is in docs/formats.md. */
  QMOE_ACCURACY_FAST = 2
} qmoe_accuracy;

/** The largest N and K of a quantized matrix (and of the imports' n and k): 2^31. Larger
 * values are INVALID_ARGUMENT, so that the row-group and chunk counts (N rounded up to 8 rows,
 * K to 32 codes) stay exact in 32 bits. */
#define QMOE_MAX_MATRIX_DIM 0x80000000u

/** A quantized weight matrix W[N, K]: pointers to caller-owned memory, described once and
 * reused for every call (nothing is copied or repacked per call). */
typedef struct qmoe_quant_matrix {
  size_t struct_size;        /**< caller sets sizeof(qmoe_quant_matrix) */
  qmoe_weight_format format; /**< a QMOE_WEIGHT_FORMAT_* value */
  uint32_t n;                /**< rows (output features), 1 to QMOE_MAX_MATRIX_DIM */
  uint32_t k;                /**< columns (input features), a multiple of block_size, at most
                                  QMOE_MAX_MATRIX_DIM */
  uint32_t block_size;       /**< k of one scale: what the format takes (INT4 and INT3: 16,
                                  32, 64 or 128; MXFP4: 32; NVFP4: 16) */
  /** Canonical codes, qmoe_quant_matrix_codes_size() bytes (64-byte alignment recommended). */
  const void* codes;
  /** Scales: element (n, b) at scales[n * scale_row_stride + b * scale_block_stride], in
   * elements; [N, K/block] order is (K/block, 1), [K/block, N] order is (1, N). With a
   * nonzero scale_group_stride (below) the row term is instead
   * (n / 8) * scale_group_stride + (n % 8) * scale_row_stride. */
  qmoe_dtype scale_dtype;
  const void* scales;
  size_t scale_row_stride;
  size_t scale_block_stride;
  /** Optional zero points, one uint8 code per (n, b) at zero_points[n * zero_point_row_stride
   * + b * zero_point_block_stride] (row term as for scales when zero_point_group_stride is
   * nonzero); NULL means the format's default (8 for INT4, 4 for INT3); MXFP4 and NVFP4 take
   * none. */
  const uint8_t* zero_points;
  size_t zero_point_row_stride;
  size_t zero_point_block_stride;
  /** Optional bias, N elements of bias_dtype; NULL for none. */
  qmoe_dtype bias_dtype;
  const void* bias;
  /** Elements between consecutive 8-row groups of the scale / zero-point plane; 0 (the default,
   * and what a caller whose struct_size ends before these fields gets) means 8 * row stride,
   * the plain strided plane above. Nonzero, it must be at least one group's extent. The
   * grouped order (row stride 1, block stride 8, group stride 8 * K/block: for each group of
   * the codes, its K/block x 8 scales in a row) is the one the kernels stream best: the scales
   * then follow the codes group by group instead of touching a new cache line per block
   * (docs/formats.md has the measurement). */
  size_t scale_group_stride;
  size_t zero_point_group_stride;
  /** One scale multiplying every weight: NVFP4's per-tensor FP32 scale. 0 (the default, and
   * what a caller whose struct_size ends before this field gets) means none; otherwise finite
   * and > 0, for the formats that take one (qmoe_gemm_kernel_available's format table in
   * docs/formats.md): a value other than 0 or 1 for another format is INVALID_ARGUMENT. */
  float global_scale;
} qmoe_quant_matrix;

/// Bytes of canonical codes for an N x K matrix of `format` (padding included).
/// UNSUPPORTED_FORMAT for a format the build does not have; INVALID_ARGUMENT for a NULL
/// `bytes`, or n or k of 0 or above QMOE_MAX_MATRIX_DIM.
QMOE_API qmoe_status qmoe_quant_matrix_codes_size(qmoe_weight_format format, uint32_t n, uint32_t k,
                                                  size_t* bytes);

/// Whether `context` runs the dequant-GEMM (and so qmoe_gemm and the MoE layer) for weights of
/// `format` with `block_size` at `accuracy`: *available is 1 or 0. *kernel_name, when
/// kernel_name is not NULL, is the name of the kernel its tier uses ("qmoe_gemm_int4_fast_8x32__
/// avx512vnni"; static storage), or NULL when not available. INVALID_ARGUMENT for a NULL
/// `available` or an accuracy that is not a qmoe_accuracy; any format and block size value is
/// an answer (0 for unknown ones).
QMOE_API qmoe_status qmoe_gemm_kernel_available(const qmoe_context* context,
                                                qmoe_weight_format format, uint32_t block_size,
                                                qmoe_accuracy accuracy, int* available,
                                                const char** kernel_name);

/// Y[m, j] = sum_k X[m, k] * W[j, k] (+ bias[j]) for m < M and n_begin <= j < n_end, with
/// X row m at x + m * ldx (K floats) and Y row m at y + m * ldy. Writes only columns
/// [n_begin, n_end) of each Y row; splits the columns over the context's threads, and the
/// result does not depend on the thread count. INVALID_ARGUMENT (nothing written) for: a
/// `weights` description the format does not accept (block size, k not a multiple of it, NULL
/// codes or scales, strides that alias rows or blocks or run past the address space, scales
/// or bias not aligned to their element size, dtypes, global_scale), an unknown accuracy,
/// m = 0, NULL x or y, an empty column range or n_end > N, ldx < K or ldy < n_end when M > 1,
/// M * ld overflowing, x overlapping the written part of y, or y overlapping the weights
/// (codes, scales, zero points, bias). UNSUPPORTED_FORMAT for a format or scale dtype the
/// build does not run; OUT_OF_MEMORY when scratch cannot grow.
QMOE_API qmoe_status qmoe_gemm(qmoe_context* context, const qmoe_quant_matrix* weights,
                               qmoe_accuracy accuracy, uint32_t m, const float* x, size_t ldx,
                               float* y, size_t ldy, uint32_t n_begin, uint32_t n_end);

/// qmoe_gemm with X and Y in any of F32, F16 and BF16 (x_dtype, y_dtype; ldx and ldy count
/// elements of those types). X is widened to FP32 (exactly), the product runs as qmoe_gemm's,
/// and Y is rounded to y_dtype to nearest even: the bits are those of qmoe_convert_*_to_f32 on
/// X, qmoe_gemm, then qmoe_convert_f32_to_* on the written columns, on the same context. Writes
/// only columns [n_begin, n_end) of each Y row. An unknown dtype is INVALID_ARGUMENT.
QMOE_API qmoe_status qmoe_gemm_typed(qmoe_context* context, const qmoe_quant_matrix* weights,
                                     qmoe_accuracy accuracy, uint32_t m, qmoe_dtype x_dtype,
                                     const void* x, size_t ldx, qmoe_dtype y_dtype, void* y,
                                     size_t ldy, uint32_t n_begin, uint32_t n_end);

/// Import ONNX Runtime's MatMulNBits/QMoE INT4 codes: uint8 [N, K/2] rows, byte j of a row
/// holding k = 2j in its low nibble and k = 2j + 1 in its high nibble. Writes the whole
/// canonical buffer (padding zeroed); `dst_bytes` must be at least the codes size. src and dst
/// must not overlap. INVALID_ARGUMENT for NULL pointers, an odd k, n or k of 0 or above
/// QMOE_MAX_MATRIX_DIM, a dst_bytes below the codes size, or overlap.
QMOE_API qmoe_status qmoe_import_int4_onnx(const uint8_t* src, uint32_t n, uint32_t k, void* dst,
                                           size_t dst_bytes);

/// Import ONNX Runtime's packed INT4 zero points: uint8 [N, ceil(K/block / 2)] rows, block 2j
/// in the low nibble and 2j + 1 in the high nibble, into one byte per (n, b) at
/// dst[n * dst_row_stride + b * dst_block_stride]; src and dst must not overlap.
/// INVALID_ARGUMENT for NULL pointers, n or k of 0 or above QMOE_MAX_MATRIX_DIM, a block_size
/// of 0 or one that does not divide k, dst strides that alias or run past the address space
/// (each at most 2^48), or overlap.
QMOE_API qmoe_status qmoe_import_int4_onnx_zero_points(const uint8_t* src, uint32_t n, uint32_t k,
                                                       uint32_t block_size, uint8_t* dst,
                                                       size_t dst_row_stride,
                                                       size_t dst_block_stride);

/// Import ggml Q4_0 rows (per 32 k: FP16 scale d, then 16 bytes; byte j holds code j in its
/// low nibble and code j + 16 in its high nibble; value (code - 8) * d), N rows of K / 32
/// blocks, 18 bytes each, contiguous. Writes canonical codes (block size 32, zero point 8) and
/// FP16 scales at scales[n * scale_row_stride + b * scale_block_stride]. src, dst_codes and
/// the scale plane must not overlap. INVALID_ARGUMENT for NULL pointers, n or k of 0 or above
/// QMOE_MAX_MATRIX_DIM, k not a multiple of 32, a dst_bytes below the codes size, scales not
/// 2-byte aligned, scale strides that alias or run past the address space, or overlap.
QMOE_API qmoe_status qmoe_import_int4_q4_0(const void* src, uint32_t n, uint32_t k, void* dst_codes,
                                           size_t dst_bytes, uint16_t* scales,
                                           size_t scale_row_stride, size_t scale_block_stride);

/// Import 3-bit codes packed as upstream runtimes store them (ONNX Runtime's QMoE INT3
/// weights): N rows of 3K/8 bytes, code k of a row in bits 3k..3k+2 of the row's byte stream,
/// least significant bit first (codes 0, 1, ..., 7 pack to 88 c6 fa). K must be a multiple of 8.
/// Writes the whole canonical INT3 buffer (padding zeroed); `dst_bytes` must be at least the
/// codes size. src and dst must not overlap (INVALID_ARGUMENT).
QMOE_API qmoe_status qmoe_import_int3_packed(const uint8_t* src, uint32_t n, uint32_t k, void* dst,
                                             size_t dst_bytes);

/// Import gpt-oss MXFP4 codes (a checkpoint's "<name>.blocks" tensor: uint8 [N, K/32, 16], byte
/// j of block b holding k = 32b + 2j in its low nibble and k = 32b + 2j + 1 in its high nibble)
/// into the canonical layout, padding zeroed. K must be a multiple of 32. The "<name>.scales"
/// tensor, uint8 [N, K/32], is an E8M0 scale plane as it is (row stride K/32, block stride 1;
/// qmoe_group_plane with element_bytes 1 regroups it). src and dst must not overlap
/// (INVALID_ARGUMENT).
QMOE_API qmoe_status qmoe_import_mxfp4_gpt_oss(const uint8_t* blocks, uint32_t n, uint32_t k,
                                               void* dst, size_t dst_bytes);

/// Import ggml block_mxfp4 rows (per 32 k: one E8M0 byte e, then 16 bytes; byte j holds code j
/// in its low nibble and code j + 16 in its high nibble; value E2M1(code) * 2^(e - 127), which
/// ggml computes as its doubled codes times 2^(e - 128)), N rows of K / 32 blocks, 17 bytes
/// each, contiguous. Writes canonical codes and the E8M0 bytes at scales[n * scale_row_stride +
/// b * scale_block_stride]. A block with e = 0xFF (NaN in E8M0, a finite scale to ggml; ggml's
/// quantizer never writes it) is INVALID_ARGUMENT and nothing is written; so are overlapping
/// src, dst_codes and scale plane.
QMOE_API qmoe_status qmoe_import_mxfp4_ggml(const void* src, uint32_t n, uint32_t k,
                                            void* dst_codes, size_t dst_bytes, uint8_t* scales,
                                            size_t scale_row_stride, size_t scale_block_stride);

/// Import NVFP4 codes in the packed layout of NVIDIA ModelOpt / TensorRT-LLM checkpoints
/// ("weight": uint8 [N, K/2], byte i holding k = 2i in its low nibble and k = 2i + 1 in its high
/// nibble) into the canonical layout, padding zeroed. K must be a multiple of 16. The E4M3
/// "weight_scale" [N, K/16] is a scale plane as it is and "weight_scale_2" the global scale.
/// src and dst must not overlap (INVALID_ARGUMENT).
QMOE_API qmoe_status qmoe_import_nvfp4_modelopt(const uint8_t* src, uint32_t n, uint32_t k,
                                                void* dst, size_t dst_bytes);

/// Elements of an [n, blocks] plane in the grouped order (docs/formats.md): ceil(n / 8) * 8 *
/// blocks, the last group padded to 8 rows. 0 when n or blocks is 0 or the count overflows.
QMOE_API size_t qmoe_grouped_plane_elements(uint32_t n, uint32_t blocks);

/// Copies an [n, blocks] scale or zero-point plane of `element_bytes`-byte elements (4: FP32
/// scales, 2: FP16/BF16 scales, 1: zero points), element (r, b) read at
/// src[r * src_row_stride + b * src_block_stride] (in elements), into the grouped order: dst
/// element (r / 8) * 8 * blocks + b * 8 + r % 8, padding rows zero. Describe the result with
/// row stride 1, block stride 8 and group stride 8 * blocks. For runtimes whose planes come in
/// another order (ONNX Runtime's [N, K/block], ggml's per-block scales): once, at load time.
/// dst_bytes must hold qmoe_grouped_plane_elements(n, blocks) elements; src and dst must not
/// overlap. INVALID_ARGUMENT for NULL pointers, n or blocks of 0, an element_bytes other than
/// 1, 2 or 4, src strides that alias or run past the address space, a dst_bytes too small, or
/// overlap.
QMOE_API qmoe_status qmoe_group_plane(const void* src, uint32_t n, uint32_t blocks,
                                      size_t element_bytes, size_t src_row_stride,
                                      size_t src_block_stride, void* dst, size_t dst_bytes);

/* ---------------------------------------------------------------------------------------------
 * Memory for weights
 * ------------------------------------------------------------------------------------------- */

/// Allocates `bytes` (>= 1) of uninitialised memory for expert weights (codes and scale planes)
/// that the CPU kernels will stream: 4096-byte aligned, and from 2 MiB up 2 MiB aligned and
/// advised for transparent huge pages (Linux MADV_HUGEPAGE). Cold experts read from huge pages
/// run markedly faster (fewer TLB misses; docs/results/2026-11-30-moe-layer-and-decode.md has
/// the figures); a runtime with its own allocator gets the same by 2 MiB alignment and that
/// advice. Huge pages are advice: where the OS gives none the memory is ordinary and every call
/// works the same.
/// Free with qmoe_free_weight_memory. INVALID_ARGUMENT for bytes = 0 or a NULL `memory`;
/// OUT_OF_MEMORY when the allocation fails.
QMOE_API qmoe_status qmoe_alloc_weight_memory(size_t bytes, void** memory);

/// Frees memory from qmoe_alloc_weight_memory; NULL is a no-op.
QMOE_API void qmoe_free_weight_memory(void* memory);

/* ---------------------------------------------------------------------------------------------
 * Expert FFN and MoE layer
 *
 * An expert e computes, for an activation row x of H floats:
 *   h   = FC1_e x                  FC1_e: [2 * I, H], gate and up rows fused
 *   g   = gate rows of h, u = up rows of h (by the set's qmoe_swiglu_fusion)
 *   g   = min(g, limit),  u = clamp(u, -limit, limit)           (when limit is finite)
 *   a_i = g_i * sigmoid(alpha * g_i) * (u_i + beta)              (ONNX Runtime's QMoE SwiGLU)
 *   out = FC2_e a                  FC2_e: [H, I]
 * and a MoE layer sums, per token t, routing_weight[t, j] * out_{ids[t, j]}(x_t) over its k
 * routing slots j = 0 .. k-1, in slot order, so the result does not depend on the thread count.
 * ------------------------------------------------------------------------------------------- */

/** How FC1's 2 * I rows hold gate and up; fixed values (those of ONNX Runtime's
 * swiglu_fusion attribute). */
typedef enum qmoe_swiglu_fusion {
  /** Row 2i is gate i and row 2i + 1 is up i (swiglu_fusion = 1; gpt-oss). */
  QMOE_SWIGLU_INTERLEAVED = 1,
  /** Rows [0, I) are gate, rows [I, 2I) are up (swiglu_fusion = 2). */
  QMOE_SWIGLU_CONCATENATED = 2
} qmoe_swiglu_fusion;

/** Description of the experts of one MoE layer, read once by qmoe_expert_set_create. */
typedef struct qmoe_expert_set_desc {
  size_t struct_size;    /**< caller sets sizeof(qmoe_expert_set_desc) */
  uint32_t num_experts;  /**< E >= 1 */
  uint32_t hidden;       /**< H: model width (FC1 k, FC2 n) */
  uint32_t intermediate; /**< I: expert width (FC1 n is 2 * I, FC2 k is I) */
  qmoe_swiglu_fusion swiglu_fusion;
  /** Per expert, its FC1 [2 * I, H] and FC2 [H, I] descriptions: num_experts pointers each.
   * Each projection carries its own format; the descriptions are copied at create, the
   * weights they point at are not and must outlive the set. */
  const qmoe_quant_matrix* const* fc1;
  const qmoe_quant_matrix* const* fc2;
  float swiglu_alpha; /**< sigmoid slope, finite: 1 (Qwen3, SiLU) or 1.702 (gpt-oss) */
  float swiglu_beta;  /**< added to up, finite: 0 (Qwen3) or 1 (gpt-oss) */
  /** Clamp limit > 0 (gpt-oss: 7), or +infinity (INFINITY, the default) for none. */
  float swiglu_limit;
} qmoe_expert_set_desc;

/** The experts of one layer, validated and ready to run: an opaque, immutable handle that any
 * number of threads and contexts may use at once. */
typedef struct qmoe_expert_set qmoe_expert_set;

/// Fill `desc` with the defaults: struct_size set, interleaved fusion, alpha 1, beta 0, no
/// limit, everything else 0/NULL. NULL is a no-op.
QMOE_API void qmoe_expert_set_desc_init(qmoe_expert_set_desc* desc);
/// Validate every expert (shapes against hidden/intermediate, formats, planes) and create the
/// set; on failure *set is NULL and the message names the expert and field. INVALID_ARGUMENT
/// for NULL `desc`, `set`, fc1 or fc2, a bad struct_size, E, H or I of 0, 2 * I above
/// UINT32_MAX, an unknown fusion, a non-finite alpha or beta, a limit that is NaN or <= 0, or
/// an expert whose FC1 is not [2I, H], whose FC2 is not [H, I], or whose description
/// qmoe_gemm would refuse; OUT_OF_MEMORY when the set cannot be allocated.
QMOE_API qmoe_status qmoe_expert_set_create(const qmoe_expert_set_desc* desc,
                                            qmoe_expert_set** set);
/// Destroy a set. NULL is accepted (OK); a destroyed handle is rejected (INVALID_ARGUMENT) for
/// at least the next 64 set destructions.
QMOE_API qmoe_status qmoe_expert_set_destroy(qmoe_expert_set* set);

/// Route M tokens: per row i of logits [M, E], the k experts with the largest logits into
/// ids[i * k + j] (descending; equal logits: lower expert id first) and their softmax weights
/// into weights[i * k + j]: exp(l - max) over the sum of exp(l - max) over the k selected
/// (renormalize != 0: the weights sum to 1, as ONNX Runtime's QMoE) or over all E experts.
/// NaN or +infinity logits, or a row of -infinity only, are INVALID_ARGUMENT (nothing written),
/// and so are m or num_experts of 0, num_experts above INT32_MAX (ids are int32_t), k of 0
/// or above num_experts, NULL pointers, m * num_experts overflowing, and logits, ids and
/// weights overlapping one another (the outputs must be separate buffers).
QMOE_API qmoe_status qmoe_moe_route_topk(const float* logits, uint32_t m, uint32_t num_experts,
                                         uint32_t k, int renormalize, int32_t* ids, float* weights);

/** One MoE layer call: its activations, routing and options (MLAS's DataParams). Fill it with
 * qmoe_moe_params_init first: later versions append fields whose defaults keep today's
 * behaviour. */
typedef struct qmoe_moe_params {
  size_t struct_size;     /**< caller sets sizeof(qmoe_moe_params) */
  qmoe_accuracy accuracy; /**< EXACT or FAST (default FAST) */
  uint32_t m;             /**< tokens, >= 1 */
  /** Element type of x, y and logits: F32 (the default), F16 or BF16. */
  qmoe_dtype dtype;
  /** X row t at x + t * ldx elements (H of them); Y row t at y + t * ldy (H written, the rest
   * of the row untouched). y may be x itself (ldy == ldx): x is read before y is written. */
  const void* x;
  size_t ldx;
  void* y;
  size_t ldy;
  uint32_t k; /**< routing slots per token, 1 to E */
  /** The routing, one of two ways: ids and weights [m, k] (int32 expert ids in [0, E), finite
   * FP32 weights), or logits [m, E] in `dtype` (ids and weights NULL), routed as
   * qmoe_moe_route_topk does with `renormalize`, the logits widened to FP32 first. */
  const int32_t* ids;
  const float* weights;
  const void* logits;
  int renormalize;
  /** NULL: every routed expert runs. Otherwise num_experts bytes: only experts e with
   * run_mask[e] != 0 run (the offload "cold subset"); the others contribute nothing. */
  const uint8_t* run_mask;
  /** 0: y = result. Nonzero: y += result (y must then be initialised). */
  int accumulate;
  /** Optional scratch of at least qmoe_moe_workspace_size() bytes, any alignment, not
   * overlapping the other arguments, used by one call at a time. NULL: the context's
   * scratch, grown to the largest call, reused, freed with the context (a call that finds it
   * held by a concurrent call on the same context uses scratch private to its thread). */
  void* workspace;
  size_t workspace_bytes;
} qmoe_moe_params;

/// Fill `params` with the defaults: struct_size set, FAST, F32, renormalize 1, everything
/// else 0/NULL. NULL is a no-op.
QMOE_API void qmoe_moe_params_init(qmoe_moe_params* params);

/// Bytes of workspace qmoe_moe_forward needs for M tokens with k slots at `accuracy` on this
/// context (any dtype and routing; its thread count sizes per-thread scratch).
/// INVALID_ARGUMENT for a NULL `bytes`, an unknown accuracy, m = 0, k of 0 or above E, or a
/// size that overflows; INVALID_CONTEXT / INVALID_ARGUMENT for a bad context / set.
QMOE_API qmoe_status qmoe_moe_workspace_size(const qmoe_context* context,
                                             const qmoe_expert_set* set, qmoe_accuracy accuracy,
                                             uint32_t m, uint32_t k, size_t* bytes);

/// The MoE layer for params->m tokens: y_t (+)= sum over slots j in order of weight[t, j] *
/// expert_{id[t, j]}(x_t); slots with weight 0, or whose expert params->run_mask leaves out,
/// are skipped (a token with none gets 0, or keeps y). Tokens are grouped by expert; FC1,
/// SwiGLU and FC2 run at params->accuracy on the context's threads, and the result does not
/// depend on the thread count. A 16-bit X is widened to FP32 exactly, and each Y element is
/// rounded to dtype once (with accumulate, from y widened plus the FP32 sum): the bits of
/// qmoe_convert_* around an FP32 layer. y overlapping any other input, the run mask, the
/// workspace or the set's weights is INVALID_ARGUMENT, as are ids outside [0, E), non-finite
/// weights, NaN or +infinity logits or a row of -infinity only, both routings or neither,
/// k = 0 or k > E; so are a NULL params, a struct_size below sizeof(qmoe_moe_params) (one
/// version so far) or above 64 KiB, an unknown accuracy or dtype (only F32, F16 and BF16),
/// m = 0, NULL x or y, ldx or ldy below H when M > 1, M * ld overflowing, and a workspace that
/// is too small, runs past the address space or overlaps x, y or the weights. A NULL,
/// destroyed or foreign set is INVALID_ARGUMENT, a bad context INVALID_CONTEXT;
/// OUT_OF_MEMORY when scratch cannot grow.
QMOE_API qmoe_status qmoe_moe_forward(qmoe_context* context, const qmoe_expert_set* set,
                                      const qmoe_moe_params* params);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* QMOE_QMOE_H_ */
