/* The C ABI under bad and random arguments: every function of qmoe.h, qmoe_experimental.h,
 * qmoe_cuda.h and qmoe_cache.h (abi.fuzz_covers_every_function checks that this file names each
 * one).
 *
 * First the refusals the headers state, one call each with the exact status. Then a randomised
 * loop that calls the functions with arguments drawn from pools of good and bad values: NULL,
 * destroyed and foreign handles, misaligned and overlapping buffers, sizes on both sides of
 * every limit, enum values outside their enums, struct sizes of no version, NaN and infinite
 * floats. Every drawn argument that a call may accept stays inside real memory (sizes the
 * library would reject are the only huge ones), so a crash, a hang or a sanitizer report is a
 * library bug. Each call must return a known status, leave a message when it fails, and write
 * nothing it was given to write on failure. Runs in every suite, the ASan+UBSan and TSan ones
 * included. QMOE_TEST_SEED replays a run (the seed is printed); QMOE_FUZZ_ITERATIONS sets the
 * loop's length (default 20000). */
#define _POSIX_C_SOURCE 200809L /* posix_memalign, mkstemp */
#include <math.h>
#include <qmoe/qmoe.h>
#include <qmoe/qmoe_cache.h>
#include <qmoe/qmoe_cuda.h>
#include <qmoe/qmoe_experimental.h>
#include <qmoe/qmoe_store.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Huge allocations are part of the test (qmoe_alloc_weight_memory(SIZE_MAX) must be
 * OUT_OF_MEMORY): the sanitizers' allocators must return NULL for them, as libc's does. Their
 * runtimes look these hooks up dynamically: default visibility, whatever the build's preset. */
#define QMOE_FUZZ_HOOK __attribute__((visibility("default"), used))
QMOE_FUZZ_HOOK const char* __asan_default_options(void);
QMOE_FUZZ_HOOK const char* __tsan_default_options(void);
QMOE_FUZZ_HOOK const char* __asan_default_options(void) {
  return "allocator_may_return_null=1";
}
QMOE_FUZZ_HOOK const char* __tsan_default_options(void) {
  return "allocator_may_return_null=1";
}

static int failures = 0;
static const char* current_call = "";

#define CHECK(cond)                                                                             \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      if (failures < 50) {                                                                      \
        fprintf(stderr, "%s:%d: check failed in %s: %s (last error: %s)\n", __FILE__, __LINE__, \
                current_call, #cond, qmoe_last_error_message());                                \
      }                                                                                         \
      ++failures;                                                                               \
    }                                                                                           \
  } while (0)

/* The call returned `want`; a failure left a message. */
#define EXPECT_STATUS(call, want)                                                             \
  do {                                                                                        \
    qmoe_status got_;                                                                         \
    current_call = #call;                                                                     \
    got_ = (call);                                                                            \
    if (got_ != (want) && failures < 50) {                                                    \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s (%s)\n", __FILE__, __LINE__, #call, \
              qmoe_status_string(got_), qmoe_status_string(want), qmoe_last_error_message()); \
    }                                                                                         \
    failures += got_ != (want);                                                               \
    if (got_ != QMOE_STATUS_OK) CHECK(qmoe_last_error_message()[0] != '\0');                  \
  } while (0)

/* ---- random numbers (splitmix64) ---------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t next_u64(void) {
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static uint32_t below(uint32_t n) {
  return (uint32_t)(next_u64() % n);
}
#define PICK(array) (array)[below((uint32_t)(sizeof(array) / sizeof((array)[0])))]

/* ---- memory the drawn pointers point into --------------------------------------------------- */

enum { kArenaBytes = 1 << 20 };
static unsigned char* arena;        /* 64-byte aligned; pointers into its first 256 KiB */
static unsigned char* weights;      /* the fuzzed matrices' planes: codes, scales, zero points */
static unsigned char* workspace;    /* a MoE workspace and more */
static size_t workspace_need;       /* qmoe_moe_workspace_size of the largest drawn call */
static unsigned char* scratch_copy; /* a snapshot of an output region */

/* A pointer into the arena's first 64 KiB, aligned to `align` (1: any address; more than half
 * of those misaligned for anything wider). Every size drawn for it fits in the 256 KiB behind
 * it, and pointers overlap each other freely. A typed pointer (float*, uint16_t*) is always
 * aligned to its type: a misaligned one is the caller's undefined behaviour, not a test. */
static void* arena_at(size_t align) {
  size_t offset = below(64 * 1024);
  if (align > 1) offset &= ~(align - 1);
  return arena + offset;
}
/* The alignment of a drawn activation dtype: 4 for FP32, none for the 16-bit types, whose rows
 * may start at any address (docs/abi.md), and none for the values that are no dtype. */
static size_t dtype_align(qmoe_dtype d) {
  return d == QMOE_DTYPE_F32 ? 4 : 1;
}
static void* maybe_null(void* p) {
  return below(8) == 0 ? NULL : p;
}

/* ---- handles ------------------------------------------------------------------------------- */

static void serial_parallel_for(void* state, qmoe_parallel_task_fn task, void* task_state,
                                size_t range) {
  size_t i;
  (void)state;
  for (i = range; i-- > 0;) task(task_state, i);
}

static qmoe_context* contexts[3];  /* scalar 1 thread; default 2 threads; caller pool */
static qmoe_context* dead_context; /* destroyed */
static uint64_t foreign[32];       /* zeros: not a handle */

static qmoe_context* any_context(void) {
  switch (below(6)) {
    case 0:
      return NULL;
    case 1:
      return dead_context;
    case 2:
      return (qmoe_context*)(void*)foreign;
    default:
      return contexts[below(3)];
  }
}

enum { kExperts = 4, kHidden = 32, kInter = 16 };
static qmoe_quant_matrix fc1_desc, fc2_desc, bad_desc;
static const qmoe_quant_matrix* fc1[kExperts];
static const qmoe_quant_matrix* fc2[kExperts];
static const qmoe_quant_matrix* fc_bad[kExperts];
static qmoe_expert_set* live_set;
static qmoe_expert_set* dead_set;
static qmoe_expert_cache* live_cache; /* 2 layers of 6 experts, 3 slots, LFRU */
static qmoe_expert_cache* dead_cache;

/* The expert store: a file of 2 layers of live_set, open (live_store) and closed (dead_store);
 * its layer 1 read whole into store_records; a file that is not a store; a path for writes. */
static char store_path[256], junk_path[256], write_path[256];
static qmoe_expert_store* live_store;
static qmoe_expert_store* dead_store;
static unsigned char* store_records;
static size_t store_expert_bytes;

static qmoe_expert_store* any_store(void) {
  switch (below(8)) {
    case 0:
      return NULL;
    case 1:
      return dead_store;
    case 2:
      return (qmoe_expert_store*)(void*)foreign;
    default:
      return live_store;
  }
}

static qmoe_expert_cache* any_cache(void) {
  switch (below(8)) {
    case 0:
      return NULL;
    case 1:
      return dead_cache;
    case 2:
      return (qmoe_expert_cache*)(void*)foreign;
    default:
      return live_cache;
  }
}

static const qmoe_expert_set* any_set(void) {
  switch (below(5)) {
    case 0:
      return NULL;
    case 1:
      return dead_set;
    case 2:
      return (const qmoe_expert_set*)(const void*)foreign;
    default:
      return live_set;
  }
}

/* ---- value pools ---------------------------------------------------------------------------- */

static const int32_t kEnums[] = {-1, 0, 1, 2, 3, 4, 5, 6, 9, 47, 48, 1000, 0x7FFFFFFF};
static const uint32_t kDims[] = {0, 1, 7, 8, 13, 24, 0x80000001u, 0xFFFFFFFFu};
static const uint32_t kKs[] = {0, 16, 32, 48, 64, 96, 128, 0x80000020u, 0xFFFFFFF0u};
static const uint32_t kBlocks[] = {0, 1, 3, 16, 32, 33, 64, 128, 256};
static const size_t kStrides[] = {0, 1, 2, 3, 4, 8, 16, 24, 32, 64, (size_t)1 << 49, SIZE_MAX};
static const size_t kCounts[] = {0, 1, 5, 31, 64, 1000, SIZE_MAX / 4 + 1, SIZE_MAX};
static const size_t kLds[] = {0, 1, 16, 32, 64, 128, 256};
static const float kFloats[] = {0.0f, 1.0f, -2.5f, 0.125f, 7.0f, 1e30f, -1e-30f};

static float any_float(void) {
  switch (below(10)) {
    case 0:
      return NAN;
    case 1:
      return INFINITY;
    case 2:
      return -INFINITY;
    default:
      return PICK(kFloats);
  }
}
static size_t any_struct_size(size_t size) {
  const size_t sizes[] = {0, 1, 8, size - 1, size, size, size, size + 8, 65536, 65537, SIZE_MAX};
  return PICK(sizes);
}

/* ---- snapshots: a failed call must not write its outputs ------------------------------------ */

static void snapshot(const void* p, size_t bytes) {
  if (p != NULL && bytes <= kArenaBytes) memcpy(scratch_copy, p, bytes);
}
static int unchanged(const void* p, size_t bytes) {
  return p == NULL || bytes > kArenaBytes || memcmp(scratch_copy, p, bytes) == 0;
}

/* ---- the weights of the fuzzed matrices ----------------------------------------------------- */

/* A valid INT4 matrix [n, k] with FP16 scales [k/32, n] in `weights`. */
static void valid_matrix(qmoe_quant_matrix* w, uint32_t n, uint32_t k, size_t codes_offset) {
  uint16_t* scales = (uint16_t*)(void*)(weights + 512 * 1024 + codes_offset);
  uint32_t i;
  memset(w, 0, sizeof *w);
  w->struct_size = sizeof *w;
  w->format = QMOE_WEIGHT_FORMAT_INT4;
  w->n = n;
  w->k = k;
  w->block_size = 32;
  w->codes = weights + codes_offset;
  w->scale_dtype = QMOE_DTYPE_F16;
  w->scales = scales;
  w->scale_row_stride = 1;
  w->scale_block_stride = n;
  for (i = 0; i < n * (k / 32); ++i) scales[i] = 0x2C00; /* 1/16 */
}

/* How often a call's arguments leave their valid base: drawn per call, from never (a call
 * that must work) to every other field, so both the work and the checks are reached. */
static uint32_t mutation_rate;
static void draw_mutation_rate(void) {
  static const uint32_t rates[] = {0, 0, 24, 8, 3, 2};
  mutation_rate = PICK(rates);
}
static int mutate(void) {
  return mutation_rate != 0 && below(mutation_rate) == 0;
}

/* A valid description of up to 24 x 128 codes with some fields mutated (the planes hold any
 * drawn strides). */
static qmoe_quant_matrix fuzzed_matrix(void) {
  static const qmoe_dtype dtypes[] = {(qmoe_dtype)0,   QMOE_DTYPE_F32,  QMOE_DTYPE_F16,
                                      QMOE_DTYPE_BF16, QMOE_DTYPE_E8M0, QMOE_DTYPE_F8_E4M3,
                                      (qmoe_dtype)9,   (qmoe_dtype)-1};
  static const uint32_t ns[] = {1, 8, 13, 24};
  static const uint32_t ks[] = {32, 64, 96, 128};
  static const float globals[] = {0.0f, 1.0f, 2.0f, -1.0f};
  qmoe_quant_matrix w;
  valid_matrix(&w, PICK(ns), PICK(ks), 0);
  if (mutate()) w.n = PICK(kDims);
  if (mutate()) w.k = PICK(kKs);
  if (mutate()) w.block_size = PICK(kBlocks);
  if (mutate()) w.format = (qmoe_weight_format)PICK(kEnums);
  if (mutate()) w.struct_size = any_struct_size(sizeof w);
  if (mutate()) w.scale_dtype = PICK(dtypes);
  if (mutate()) w.scale_row_stride = PICK(kStrides);
  if (mutate()) w.scale_block_stride = PICK(kStrides);
  if (mutate()) w.scale_group_stride = PICK(kStrides);
  if (mutate()) w.codes = below(2) ? NULL : weights + 1;
  if (mutate()) w.scales = below(2) ? NULL : (const void*)((const unsigned char*)w.scales + 1);
  if (below(3) == 0) { /* zero points: valid ones, maybe mutated */
    w.zero_points = weights + 768 * 1024;
    w.zero_point_row_stride = 1;
    w.zero_point_block_stride = 24;
    if (mutate()) w.zero_point_row_stride = PICK(kStrides);
    if (mutate()) w.zero_point_block_stride = PICK(kStrides);
    if (mutate()) w.zero_point_group_stride = PICK(kStrides);
  }
  if (below(3) == 0) { /* bias */
    w.bias = weights + 900 * 1024;
    w.bias_dtype = QMOE_DTYPE_F32;
    if (mutate()) w.bias = weights + 900 * 1024 + 2; /* misaligned for FP32 */
    if (mutate()) w.bias_dtype = PICK(dtypes);
  }
  if (mutate()) w.global_scale = below(2) ? NAN : PICK(globals);
  return w;
}

/* ---- the refusals the headers state --------------------------------------------------------- */

/* The CUDA entry points' host-side refusals, which come before any question of a device, so
 * they hold in every build, with or without a GPU; and the _init functions' defaults. */
static void cuda_documented_refusals(void) {
  qmoe_cuda_expert_set_desc sd;
  qmoe_cuda_expert_set* cset = (qmoe_cuda_expert_set*)(void*)foreign;
  const qmoe_cuda_expert_set* foreign_cset = (const qmoe_cuda_expert_set*)(const void*)foreign;
  const int32_t* map = (const int32_t*)(void*)foreign;
  qmoe_cuda_moe_params mp;
  qmoe_cuda_offload_desc od;
  qmoe_cuda_offload* session = (qmoe_cuda_offload*)(void*)foreign;
  qmoe_cuda_offload* foreign_session = (qmoe_cuda_offload*)(void*)foreign;
  qmoe_cuda_offload_telemetry telemetry;
  const uint32_t out_of_range[1] = {kExperts};
  size_t bytes = 0;

  memset(&sd, 0xFF, sizeof sd);
  qmoe_cuda_expert_set_desc_init(&sd);
  CHECK(sd.struct_size == sizeof sd && sd.device == 0 && sd.experts == NULL &&
        sd.resident == NULL && sd.num_resident == 0 && sd.copy_mode == QMOE_CUDA_COPY_BATCHED &&
        sd.num_slots == 0);
  EXPECT_STATUS(qmoe_cuda_expert_set_create(NULL, &cset), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(cset == NULL);
  EXPECT_STATUS(qmoe_cuda_expert_set_create(&sd, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  cset = (qmoe_cuda_expert_set*)(void*)foreign;
  EXPECT_STATUS(qmoe_cuda_expert_set_create(&sd, &cset), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(cset == NULL); /* no host set */
  sd.experts = dead_set;
  EXPECT_STATUS(qmoe_cuda_expert_set_create(&sd, &cset), QMOE_STATUS_INVALID_ARGUMENT);
  sd.experts = live_set;
  sd.copy_mode = (qmoe_cuda_copy_mode)5;
  EXPECT_STATUS(qmoe_cuda_expert_set_create(&sd, &cset), QMOE_STATUS_INVALID_ARGUMENT);
  sd.copy_mode = QMOE_CUDA_COPY_LOOP;
  sd.resident = out_of_range;
  sd.num_resident = 1;
  EXPECT_STATUS(qmoe_cuda_expert_set_create(&sd, &cset), QMOE_STATUS_INVALID_ARGUMENT);
  sd.resident = NULL;
  sd.num_resident = 0;
  sd.device = -1;
  EXPECT_STATUS(qmoe_cuda_expert_set_create(&sd, &cset), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(cset == NULL);
  EXPECT_STATUS(qmoe_cuda_expert_set_destroy(NULL), QMOE_STATUS_OK);
  EXPECT_STATUS(qmoe_cuda_expert_set_destroy((qmoe_cuda_expert_set*)(void*)foreign),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_expert_set_residency(NULL, &map), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_expert_set_residency(foreign_cset, &map), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_expert_set_update_residency(NULL, live_set, NULL, 0, NULL, NULL),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_expert_set_update_residency((qmoe_cuda_expert_set*)(void*)foreign,
                                                      live_set, NULL, 0, NULL, NULL),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(
      qmoe_cuda_expert_set_begin_residency_update(NULL, live_set, NULL, 0, NULL, NULL, NULL),
      QMOE_STATUS_INVALID_ARGUMENT);
  {
    int finished = 7;
    EXPECT_STATUS(qmoe_cuda_expert_set_finish_residency_update(
                      (qmoe_cuda_expert_set*)(void*)foreign, NULL, 1, &finished),
                  QMOE_STATUS_INVALID_ARGUMENT);
    CHECK(finished == 7);
  }

  memset(&mp, 0xFF, sizeof mp);
  qmoe_cuda_moe_params_init(&mp);
  CHECK(mp.struct_size == sizeof mp && mp.accuracy == QMOE_ACCURACY_FAST &&
        mp.dtype == QMOE_DTYPE_F32 && mp.renormalize == 1 && mp.m_capacity == 0 && mp.m == NULL &&
        mp.x == NULL && mp.ids == NULL && mp.workspace == NULL && mp.accumulate == 0 &&
        mp.expected_tokens_per_expert == 0.0f && mp.expert_counts == NULL);
  EXPECT_STATUS(qmoe_cuda_moe_workspace_size(NULL, QMOE_ACCURACY_FAST, 1, 1, &bytes),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_moe_workspace_size(foreign_cset, QMOE_ACCURACY_FAST, 1, 1, &bytes),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_moe_forward(NULL, &mp, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_moe_forward(foreign_cset, &mp, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_moe_check(NULL, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_gemm(NULL, QMOE_ACCURACY_FAST, 1, QMOE_DTYPE_F32, arena, 32,
                               QMOE_DTYPE_F32, arena + 4096, 32, 0, 8, NULL),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_gemm(&fc1_desc, (qmoe_accuracy)7, 1, QMOE_DTYPE_F32, arena, 32,
                               QMOE_DTYPE_F32, arena + 4096, 32, 0, 8, NULL),
                QMOE_STATUS_INVALID_ARGUMENT);

  memset(&od, 0xFF, sizeof od);
  qmoe_cuda_offload_desc_init(&od);
  CHECK(od.struct_size == sizeof od && od.device == 0 && od.context == NULL && od.num_layers == 0 &&
        od.host_layers == NULL && od.gpu_layers == NULL && od.m_capacity == 4 && od.k == 8 &&
        od.ring_size == 4 && od.timeout_us == 1000000 && od.spin_us == 2000 &&
        od.park_poll_us == 100 && od.short_circuit == 1);
  EXPECT_STATUS(qmoe_cuda_offload_create(NULL, &session), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(session == NULL);
  EXPECT_STATUS(qmoe_cuda_offload_create(&od, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  session = foreign_session;
  EXPECT_STATUS(qmoe_cuda_offload_create(&od, &session), QMOE_STATUS_INVALID_CONTEXT);
  CHECK(session == NULL); /* no CPU context */
  od.context = contexts[0];
  session = foreign_session;
  EXPECT_STATUS(qmoe_cuda_offload_create(&od, &session), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(session == NULL); /* no layers */
  EXPECT_STATUS(qmoe_cuda_offload_destroy(NULL), QMOE_STATUS_OK);
  EXPECT_STATUS(qmoe_cuda_offload_destroy(foreign_session), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_offload_forward(NULL, 0, &mp, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_offload_forward(foreign_session, 0, &mp, NULL),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_offload_wake(NULL), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_offload_check(NULL, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  telemetry.struct_size = sizeof telemetry;
  EXPECT_STATUS(qmoe_cuda_offload_get_telemetry(NULL, NULL, &telemetry),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_cuda_offload_get_telemetry(foreign_session, NULL, &telemetry),
                QMOE_STATUS_INVALID_ARGUMENT);
}

/* The expert cache's refusals: bad shapes and policies at create, bad ids and layers after. */
static void cache_documented_refusals(void) {
  qmoe_expert_cache_desc d;
  qmoe_expert_cache_stats st;
  qmoe_expert_cache* out = (qmoe_expert_cache*)(void*)foreign;
  const int32_t bad_ids[2] = {1, 6};
  const uint32_t twice[2] = {2, 2};
  uint32_t ids[6] = {9, 9, 9, 9, 9, 9};
  uint32_t count = 77;
  qmoe_expert_cache_desc_init(&d);
  d.num_layers = 2;
  d.num_experts = 6;
  d.num_slots = 7;
  EXPECT_STATUS(qmoe_expert_cache_create(&d, &out), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(out == NULL);
  d.num_slots = 3;
  d.half_life_steps = NAN;
  EXPECT_STATUS(qmoe_expert_cache_create(&d, &out), QMOE_STATUS_INVALID_ARGUMENT);
  d.half_life_steps = 32.0f;
  d.policy = (qmoe_cache_policy)0;
  EXPECT_STATUS(qmoe_expert_cache_create(&d, &out), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_expert_cache_observe(live_cache, 0, bad_ids, 2), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_expert_cache_observe(live_cache, 2, bad_ids, 1), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_expert_cache_observe_counts(live_cache, 0, ids, 5),
                QMOE_STATUS_INVALID_ARGUMENT); /* E is 6 */
  EXPECT_STATUS(qmoe_expert_cache_set_residency(live_cache, 0, twice, 2),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_expert_cache_get_residency(dead_cache, 0, ids, 6, &count),
                QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(count == 77 && ids[0] == 9);
  EXPECT_STATUS(qmoe_expert_cache_end_step(dead_cache), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_expert_cache_destroy(dead_cache), QMOE_STATUS_INVALID_ARGUMENT);
  st.struct_size = sizeof st + 1;
  EXPECT_STATUS(qmoe_expert_cache_get_stats(live_cache, 0, &st), QMOE_STATUS_OK);
  st.struct_size = sizeof st - 1;
  EXPECT_STATUS(qmoe_expert_cache_get_stats(live_cache, QMOE_EXPERT_CACHE_ALL_LAYERS, &st),
                QMOE_STATUS_INVALID_ARGUMENT);
}

/* The expert store's refusals: bad paths and files at open, bad layers, ids and buffers after. */
static void store_documented_refusals(void) {
  qmoe_expert_store* out = (qmoe_expert_store*)(void*)foreign;
  qmoe_expert_store_info info;
  const uint32_t ids[2] = {0, kExperts};
  const void* records[kExperts];
  qmoe_expert_set* set = (qmoe_expert_set*)(void*)foreign;
  uint32_t e;
  EXPECT_STATUS(qmoe_expert_store_open(junk_path, &out), QMOE_STATUS_CORRUPT_DATA);
  CHECK(out == NULL);
  EXPECT_STATUS(qmoe_expert_store_open("/nonexistent-qmoe-dir/store", &out), QMOE_STATUS_IO_ERROR);
  EXPECT_STATUS(qmoe_expert_store_open(NULL, &out), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_expert_store_close(dead_store), QMOE_STATUS_INVALID_ARGUMENT);
  info.struct_size = sizeof info - 1;
  EXPECT_STATUS(qmoe_expert_store_get_info(live_store, &info), QMOE_STATUS_INVALID_ARGUMENT);
  info.struct_size = sizeof info;
  EXPECT_STATUS(qmoe_expert_store_get_info(live_store, &info), QMOE_STATUS_OK);
  CHECK(info.num_layers == 2 && info.num_experts == kExperts && info.hidden == kHidden);
  EXPECT_STATUS(
      qmoe_expert_store_read(live_store, 0, ids, 2, 1, store_records, 2 * store_expert_bytes),
      QMOE_STATUS_INVALID_ARGUMENT); /* ids[1] is E */
  EXPECT_STATUS(qmoe_expert_store_read(live_store, 2, ids, 1, 1, store_records, store_expert_bytes),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(
      qmoe_expert_store_read(live_store, 1, ids, 1, 1, store_records + 8, store_expert_bytes),
      QMOE_STATUS_INVALID_ARGUMENT);
  for (e = 0; e < kExperts; ++e) records[e] = store_records + e * store_expert_bytes;
  EXPECT_STATUS(qmoe_expert_store_create_set(live_store, 0, records, &set),
                QMOE_STATUS_INVALID_ARGUMENT); /* layer 1's records */
  CHECK(set == NULL);
  EXPECT_STATUS(qmoe_expert_store_create_set(live_store, 1, records, &set), QMOE_STATUS_OK);
  qmoe_expert_set_destroy(set);
  EXPECT_STATUS(qmoe_expert_store_write(write_path, NULL, 1), QMOE_STATUS_INVALID_ARGUMENT);
}

static void documented_refusals(void) {
  qmoe_context* ctx = contexts[0];
  qmoe_context_options options;
  qmoe_host_info info;
  qmoe_kernel_info kinfo;
  qmoe_moe_params params;
  qmoe_expert_set_desc desc;
  qmoe_quant_matrix w;
  qmoe_context* out_ctx = (qmoe_context*)(void*)foreign;
  qmoe_expert_set* out_set = (qmoe_expert_set*)(void*)foreign;
  float logits[8] = {0.5f, 1.0f, -1.0f, 2.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  float* fa = (float*)(void*)arena;
  int32_t ids[4];
  float wts[4];
  double bw = -1.0;
  uint32_t count = 0;
  size_t bytes = 0;
  void* memory = NULL;
  int devices = -1;
  qmoe_isa isa = QMOE_ISA_DEFAULT;

  /* The *_init calls and the frees take NULL quietly. */
  qmoe_context_options_init(NULL);
  qmoe_expert_set_desc_init(NULL);
  qmoe_moe_params_init(NULL);
  qmoe_free_weight_memory(NULL);
  EXPECT_STATUS(qmoe_context_destroy(NULL), QMOE_STATUS_OK);
  EXPECT_STATUS(qmoe_expert_set_destroy(NULL), QMOE_STATUS_OK);

  /* Handles. */
  EXPECT_STATUS(qmoe_context_get_isa(NULL, &isa), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_STATUS(qmoe_context_get_isa(dead_context, &isa), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_STATUS(qmoe_context_get_isa((qmoe_context*)(void*)foreign, &isa),
                QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_STATUS(qmoe_context_destroy(dead_context), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_STATUS(qmoe_expert_set_destroy(dead_set), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_moe_workspace_size(ctx, dead_set, QMOE_ACCURACY_FAST, 1, 1, &bytes),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_context_get_isa(ctx, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_context_get_num_threads(ctx, NULL), QMOE_STATUS_INVALID_ARGUMENT);

  /* Contexts: struct sizes, tiers, thread counts. */
  qmoe_context_options_init(&options);
  EXPECT_STATUS(qmoe_context_create(&options, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  options.struct_size = 65537;
  EXPECT_STATUS(qmoe_context_create(&options, &out_ctx), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(out_ctx == NULL);
  options.struct_size = sizeof options;
  options.max_isa = (qmoe_isa)4;
  EXPECT_STATUS(qmoe_context_create(&options, &out_ctx), QMOE_STATUS_INVALID_ARGUMENT);
  options.max_isa = QMOE_ISA_DEFAULT;
  options.num_threads = QMOE_MAX_THREADS + 1;
  EXPECT_STATUS(qmoe_context_create(&options, &out_ctx), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_get_host_info(NULL), QMOE_STATUS_INVALID_ARGUMENT);
  memset(&info, 0, sizeof info);
  info.struct_size = 65537;
  EXPECT_STATUS(qmoe_get_host_info(&info), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_isa_from_name(NULL, &isa), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_isa_from_name("default", &isa), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(qmoe_cpu_feature_name(3u) == NULL);
  CHECK(strcmp(qmoe_isa_name((qmoe_isa)99), "unknown") == 0);
  CHECK(strcmp(qmoe_status_string((qmoe_status)99), "QMOE_STATUS_<unknown>") == 0);

  /* Conversions: n == 0 with NULL pointers is a no-op; overlap and huge n are refused. */
  EXPECT_STATUS(qmoe_convert_f16_to_f32(ctx, NULL, NULL, 0), QMOE_STATUS_OK);
  EXPECT_STATUS(qmoe_convert_f16_to_f32(NULL, NULL, NULL, 0), QMOE_STATUS_INVALID_CONTEXT);
  EXPECT_STATUS(qmoe_convert_f16_to_f32(ctx, NULL, fa, 4), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_convert_f32_to_f16(ctx, fa, (uint16_t*)(void*)(fa + 1), 8),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_convert_bf16_to_f32(ctx, (uint16_t*)(void*)arena, fa + 4096, SIZE_MAX / 4 + 1),
                QMOE_STATUS_INVALID_ARGUMENT);

  /* Formats. */
  EXPECT_STATUS(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, 8, 32, NULL),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_quant_matrix_codes_size((qmoe_weight_format)99, 8, 32, &bytes),
                QMOE_STATUS_UNSUPPORTED_FORMAT);
  EXPECT_STATUS(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, 0, 32, &bytes),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_import_int4_onnx(arena, 8, 33, arena + 4096, 4096),
                QMOE_STATUS_INVALID_ARGUMENT); /* odd k */
  EXPECT_STATUS(qmoe_import_int4_onnx(arena, 8, 32, arena + 64, 4096),
                QMOE_STATUS_INVALID_ARGUMENT); /* overlap */
  EXPECT_STATUS(qmoe_import_int4_onnx(arena, 8, 32, arena + 4096, 127),
                QMOE_STATUS_INVALID_ARGUMENT); /* dst too small */
  EXPECT_STATUS(qmoe_import_int4_onnx_zero_points(arena, 8, 64, 0, arena + 4096, 2, 1),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_import_int4_q4_0(arena, 8, 48, arena + 4096, 4096,
                                      (uint16_t*)(void*)(arena + 8192), 1, 8),
                QMOE_STATUS_INVALID_ARGUMENT); /* k % 32 */
  EXPECT_STATUS(qmoe_import_int4_q4_0(arena, 8, 32, arena + 4096, 4096,
                                      (uint16_t*)(void*)(arena + 8193), 1, 8),
                QMOE_STATUS_INVALID_ARGUMENT); /* misaligned scales */
  EXPECT_STATUS(qmoe_import_int3_packed(arena, 8, 12, arena + 4096, 4096),
                QMOE_STATUS_INVALID_ARGUMENT); /* k % 8 */
  EXPECT_STATUS(qmoe_import_int3_packed(arena, 8, 32, arena + 32, 4096),
                QMOE_STATUS_INVALID_ARGUMENT); /* overlap */
  EXPECT_STATUS(qmoe_import_int3_packed(NULL, 8, 32, arena + 4096, 4096),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_import_mxfp4_gpt_oss(arena, 8, 48, arena + 4096, 4096),
                QMOE_STATUS_INVALID_ARGUMENT); /* k % 32 */
  EXPECT_STATUS(qmoe_import_mxfp4_gpt_oss(arena, 8, 32, arena + 4096, 1),
                QMOE_STATUS_INVALID_ARGUMENT); /* dst too small */
  EXPECT_STATUS(qmoe_import_mxfp4_ggml(arena, 8, 48, arena + 4096, 4096, arena + 8192, 1, 8),
                QMOE_STATUS_INVALID_ARGUMENT); /* k % 32 */
  EXPECT_STATUS(qmoe_import_mxfp4_ggml(arena, 8, 32, arena + 4096, 4096, arena + 64, 1, 8),
                QMOE_STATUS_INVALID_ARGUMENT); /* scales overlap src */
  EXPECT_STATUS(qmoe_import_nvfp4_modelopt(arena, 8, 24, arena + 4096, 4096),
                QMOE_STATUS_INVALID_ARGUMENT); /* k % 16 */
  EXPECT_STATUS(qmoe_import_nvfp4_modelopt(arena, 8, 32, NULL, 4096), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(qmoe_grouped_plane_elements(0, 4) == 0);
  CHECK(qmoe_grouped_plane_elements(9, 4) == 64);
  EXPECT_STATUS(qmoe_group_plane(arena, 8, 2, 3, 2, 1, arena + 4096, 4096),
                QMOE_STATUS_INVALID_ARGUMENT); /* element_bytes */
  EXPECT_STATUS(qmoe_group_plane(arena, 8, 2, 2, 2, 1, arena + 16, 64),
                QMOE_STATUS_INVALID_ARGUMENT); /* overlap */

  /* GEMM. */
  valid_matrix(&w, 8, 32, 0);
  EXPECT_STATUS(qmoe_gemm(ctx, &w, QMOE_ACCURACY_EXACT, 1, fa, 32, fa + 8192, 8, 0, 8),
                QMOE_STATUS_OK);
  EXPECT_STATUS(qmoe_gemm(ctx, &w, (qmoe_accuracy)3, 1, fa, 32, fa + 8192, 8, 0, 8),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_gemm(ctx, &w, QMOE_ACCURACY_EXACT, 1, fa, 32, fa + 8, 8, 0, 8),
                QMOE_STATUS_INVALID_ARGUMENT); /* x and y overlap */
  EXPECT_STATUS(qmoe_gemm(ctx, &w, QMOE_ACCURACY_EXACT, 1, fa, 32, (float*)(void*)weights, 8, 0, 8),
                QMOE_STATUS_INVALID_ARGUMENT); /* y over the codes */
  EXPECT_STATUS(qmoe_gemm(ctx, &w, QMOE_ACCURACY_EXACT, 1, fa, 32, fa + 8192, 8, 4, 4),
                QMOE_STATUS_INVALID_ARGUMENT); /* empty range */
  w.scale_row_stride = (size_t)1 << 49;
  EXPECT_STATUS(qmoe_gemm(ctx, &w, QMOE_ACCURACY_EXACT, 1, fa, 32, fa + 8192, 8, 0, 8),
                QMOE_STATUS_INVALID_ARGUMENT);
  w.scale_row_stride = 1;
  EXPECT_STATUS(qmoe_gemm_typed(ctx, &w, QMOE_ACCURACY_EXACT, 1, QMOE_DTYPE_E8M0, fa, 32,
                                QMOE_DTYPE_F32, fa + 8192, 8, 0, 8),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(
      qmoe_gemm_kernel_available(ctx, QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_ACCURACY_FAST, NULL, NULL),
      QMOE_STATUS_INVALID_ARGUMENT);

  /* Weight memory. */
  EXPECT_STATUS(qmoe_alloc_weight_memory(0, &memory), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_alloc_weight_memory(64, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_alloc_weight_memory(SIZE_MAX, &memory), QMOE_STATUS_OUT_OF_MEMORY);
  CHECK(memory == NULL);

  /* Expert sets and routing. */
  qmoe_expert_set_desc_init(&desc);
  EXPECT_STATUS(qmoe_expert_set_create(NULL, &out_set), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(out_set == NULL);
  desc.num_experts = kExperts;
  desc.hidden = kHidden;
  desc.intermediate = kInter;
  desc.fc1 = fc1;
  desc.fc2 = fc2;
  desc.swiglu_limit = 0.0f;
  EXPECT_STATUS(qmoe_expert_set_create(&desc, &out_set), QMOE_STATUS_INVALID_ARGUMENT);
  desc.swiglu_limit = INFINITY;
  desc.fc2 = fc_bad;
  EXPECT_STATUS(qmoe_expert_set_create(&desc, &out_set), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_moe_route_topk(logits, 1, 4, 2, 1, ids, (float*)(void*)ids),
                QMOE_STATUS_INVALID_ARGUMENT); /* the outputs overlap */
  EXPECT_STATUS(qmoe_moe_route_topk(logits, 1, 4, 2, 1, ids, logits + 3),
                QMOE_STATUS_INVALID_ARGUMENT); /* weights over the logits */
  EXPECT_STATUS(qmoe_moe_route_topk(logits, 1, 0x80000000u, 1, 1, ids, wts),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_moe_route_topk(logits, 1, 4, 2, 1, ids, wts), QMOE_STATUS_OK);
  qmoe_moe_params_init(&params);
  params.m = 1;
  params.k = 2;
  params.x = fa;
  params.y = fa + 1024;
  params.logits = logits;
  EXPECT_STATUS(qmoe_moe_forward(ctx, live_set, &params), QMOE_STATUS_OK);
  params.struct_size = sizeof params - 1;
  EXPECT_STATUS(qmoe_moe_forward(ctx, live_set, &params), QMOE_STATUS_INVALID_ARGUMENT);
  params.struct_size = sizeof params;
  params.ids = ids;
  params.weights = wts;
  EXPECT_STATUS(qmoe_moe_forward(ctx, live_set, &params), QMOE_STATUS_INVALID_ARGUMENT);
  params.logits = NULL;
  params.workspace = workspace;
  params.workspace_bytes = SIZE_MAX;
  EXPECT_STATUS(qmoe_moe_forward(ctx, live_set, &params), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_moe_forward(ctx, live_set, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_moe_workspace_size(ctx, live_set, QMOE_ACCURACY_FAST, 0, 1, &bytes),
                QMOE_STATUS_INVALID_ARGUMENT);

  /* Experimental: kernel listing and bandwidth. */
  EXPECT_STATUS(qmoe_context_get_kernel_count(ctx, NULL), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_context_get_kernel_count(ctx, &count), QMOE_STATUS_OK);
  memset(&kinfo, 0, sizeof kinfo);
  kinfo.struct_size = sizeof kinfo;
  EXPECT_STATUS(qmoe_context_get_kernel_info(ctx, count, &kinfo), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(kinfo.name == NULL);
  EXPECT_STATUS(qmoe_measure_read_bandwidth(ctx, ((size_t)1 << 40) + 1, 1, 0, &bw),
                QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_measure_read_bandwidth(ctx, 4095, 1, 0, &bw), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_STATUS(qmoe_measure_read_bandwidth(ctx, 4096, 0, 0, &bw), QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(bw == -1.0);
  EXPECT_STATUS(qmoe_measure_read_bandwidth_over(ctx, arena + 64, SIZE_MAX, 1, 0, &bw),
                QMOE_STATUS_INVALID_ARGUMENT); /* wraps */
  EXPECT_STATUS(qmoe_measure_read_bandwidth_over(ctx, arena + 1, 4096, 1, 0, &bw),
                QMOE_STATUS_INVALID_ARGUMENT); /* 4032 bytes of whole lines */

  /* CUDA: host-side arguments first, in every build. */
  EXPECT_STATUS(qmoe_cuda_get_device_count(NULL), QMOE_STATUS_INVALID_ARGUMENT);
  current_call = "qmoe_cuda_get_device_count";
  {
    const qmoe_status s = qmoe_cuda_get_device_count(&devices);
    CHECK(s == QMOE_STATUS_OK || s == QMOE_STATUS_CUDA_UNAVAILABLE || s == QMOE_STATUS_CUDA_ERROR);
    if (s != QMOE_STATUS_OK) CHECK(devices == -1);
  }
  cuda_documented_refusals();
  cache_documented_refusals();
  store_documented_refusals();
}

/* ---- the randomised loop -------------------------------------------------------------------- */

enum { kFunctions = 60 };

static uint32_t accepted[kFunctions]; /* calls that returned OK, per function */

/* One call of function `f` with drawn arguments. */
static void fuzz_one(uint32_t f) {
  qmoe_status s = QMOE_STATUS_OK;
  int checked_output = 0; /* set where a failure must leave the snapshot untouched */
  const void* out = NULL;
  size_t out_bytes = 0;
  switch (f) {
    case 0:
      current_call = "qmoe_version_number";
      CHECK(qmoe_version_number() == QMOE_VERSION_NUMBER);
      return;
    case 1:
      current_call = "qmoe_version_string";
      CHECK(strcmp(qmoe_version_string(), QMOE_VERSION_STRING) == 0);
      return;
    case 2:
      current_call = "qmoe_status_string";
      CHECK(qmoe_status_string((qmoe_status)PICK(kEnums)) != NULL);
      return;
    case 3:
      current_call = "qmoe_last_error_message";
      CHECK(qmoe_last_error_message() != NULL);
      return;
    case 4:
      current_call = "qmoe_isa_name";
      CHECK(qmoe_isa_name((qmoe_isa)PICK(kEnums)) != NULL);
      return;
    case 5: {
      static const char* const names[] = {
          NULL,     "avx2",    "AVX512",
          "Scalar", "default", "",
          "avx",    "avx2 ",   "a very long name that is no tier at all, not even close"};
      qmoe_isa isa = (qmoe_isa)77;
      current_call = "qmoe_isa_from_name";
      s = qmoe_isa_from_name(PICK(names), below(4) ? &isa : NULL);
      if (s != QMOE_STATUS_OK) CHECK(isa == (qmoe_isa)77);
      break;
    }
    case 6: {
      const uint32_t bit = below(2) ? 1u << below(32) : (uint32_t)next_u64();
      const char* name;
      current_call = "qmoe_cpu_feature_name";
      name = qmoe_cpu_feature_name(bit);
      if (bit != 0 && (bit & (bit - 1)) == 0 && bit <= QMOE_CPU_FEATURE_GFNI) {
        CHECK(name != NULL);
      }
      return;
    }
    case 7: {
      qmoe_host_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = any_struct_size(sizeof info);
      current_call = "qmoe_get_host_info";
      s = qmoe_get_host_info(below(6) ? &info : NULL);
      break;
    }
    case 8: {
      qmoe_context_options o;
      current_call = "qmoe_context_options_init";
      qmoe_context_options_init(below(3) ? &o : NULL);
      return;
    }
    case 9: {
      static const uint32_t threads[] = {0, 1, 2, 3, QMOE_MAX_THREADS + 1, 0xFFFFFFFFu};
      qmoe_context_options o;
      qmoe_context* c = (qmoe_context*)(void*)foreign;
      qmoe_context_options_init(&o);
      if (below(3) == 0) o.struct_size = any_struct_size(sizeof o);
      if (below(2)) o.max_isa = (qmoe_isa)PICK(kEnums);
      o.num_threads = PICK(threads);
      if (below(2)) o.parallel_for = serial_parallel_for;
      current_call = "qmoe_context_create";
      s = qmoe_context_create(below(8) ? &o : NULL, below(8) ? &c : NULL);
      if (s == QMOE_STATUS_OK) {
        EXPECT_STATUS(qmoe_context_destroy(c), QMOE_STATUS_OK);
      } else if (c != (qmoe_context*)(void*)foreign) {
        CHECK(c == NULL);
      }
      break;
    }
    case 10: {
      /* Never a context the loop still uses: the dead one, a foreign one, NULL. */
      qmoe_context* victims[3];
      victims[0] = NULL;
      victims[1] = dead_context;
      victims[2] = (qmoe_context*)(void*)foreign;
      current_call = "qmoe_context_destroy";
      s = qmoe_context_destroy(PICK(victims));
      break;
    }
    case 11: {
      qmoe_isa isa = (qmoe_isa)77;
      current_call = "qmoe_context_get_isa";
      s = qmoe_context_get_isa(any_context(), below(6) ? &isa : NULL);
      if (s != QMOE_STATUS_OK) CHECK(isa == (qmoe_isa)77);
      break;
    }
    case 12: {
      uint32_t n = 77;
      current_call = "qmoe_context_get_num_threads";
      s = qmoe_context_get_num_threads(any_context(), below(6) ? &n : NULL);
      if (s != QMOE_STATUS_OK) CHECK(n == 77);
      break;
    }
    case 13:
    case 14:
    case 15:
    case 16: {
      const size_t n = PICK(kCounts);
      const size_t src_align = f == 13 || f == 15 ? 2 : 4, dst_align = 6 - src_align;
      void* src = maybe_null(arena_at(src_align));
      void* dst = maybe_null(arena_at(dst_align));
      qmoe_context* c = any_context();
      if (n <= 1000) {
        out = dst;
        out_bytes = n * 4;
        snapshot(out, out_bytes);
        checked_output = 1;
      }
      if (f == 13) {
        current_call = "qmoe_convert_f16_to_f32";
        s = qmoe_convert_f16_to_f32(c, (const uint16_t*)src, (float*)dst, n);
      } else if (f == 14) {
        current_call = "qmoe_convert_f32_to_f16";
        s = qmoe_convert_f32_to_f16(c, (const float*)src, (uint16_t*)dst, n);
      } else if (f == 15) {
        current_call = "qmoe_convert_bf16_to_f32";
        s = qmoe_convert_bf16_to_f32(c, (const uint16_t*)src, (float*)dst, n);
      } else {
        current_call = "qmoe_convert_f32_to_bf16";
        s = qmoe_convert_f32_to_bf16(c, (const float*)src, (uint16_t*)dst, n);
      }
      break;
    }
    case 17: {
      size_t bytes = 77;
      current_call = "qmoe_quant_matrix_codes_size";
      s = qmoe_quant_matrix_codes_size((qmoe_weight_format)PICK(kEnums), PICK(kDims), PICK(kKs),
                                       below(6) ? &bytes : NULL);
      if (s != QMOE_STATUS_OK) CHECK(bytes == 77);
      break;
    }
    case 18: {
      int available = 77;
      const char* name = "poison";
      current_call = "qmoe_gemm_kernel_available";
      s = qmoe_gemm_kernel_available(any_context(), (qmoe_weight_format)PICK(kEnums), PICK(kBlocks),
                                     (qmoe_accuracy)PICK(kEnums), below(6) ? &available : NULL,
                                     below(2) ? &name : NULL);
      if (s == QMOE_STATUS_OK) CHECK(available == 0 || available == 1);
      break;
    }
    case 19:
    case 20: {
      static const uint32_t ms[] = {0, 1, 2, 3, 4};
      static const uint32_t columns[] = {0, 1, 7, 8, 13, 24, 25, 0xFFFFFFFFu};
      static const qmoe_dtype act[] = {QMOE_DTYPE_F32,  QMOE_DTYPE_F16, QMOE_DTYPE_BF16,
                                       QMOE_DTYPE_E8M0, (qmoe_dtype)0,  (qmoe_dtype)7};
      const qmoe_quant_matrix w = fuzzed_matrix();
      /* The valid base: x in the arena's first 16 KiB, y in its second 32 KiB, lds that fit. */
      uint32_t m = 1 + below(4), n0 = below(w.n > 0 && w.n < 64 ? w.n : 1), n1;
      size_t ldx = below(2) ? w.k : 256, ldy = below(2) ? w.n : 256;
      qmoe_dtype x_dtype = QMOE_DTYPE_F32, y_dtype = QMOE_DTYPE_F32;
      qmoe_accuracy level = (qmoe_accuracy)(1 + below(2));
      const void* x;
      void* y;
      qmoe_context* c = below(4) ? contexts[below(3)] : any_context();
      const qmoe_quant_matrix* wp = mutate() ? NULL : &w;
      n1 = w.n > 0 && w.n < 64 ? n0 + 1 + below(w.n - n0) : 1;
      if (f == 20 && below(2)) x_dtype = PICK(act);
      if (f == 20 && below(2)) y_dtype = PICK(act);
      if (mutate()) m = PICK(ms);
      if (mutate()) ldx = PICK(kLds);
      if (mutate()) ldy = PICK(kLds);
      if (mutate()) n0 = PICK(columns);
      if (mutate()) n1 = PICK(columns);
      if (mutate()) level = (qmoe_accuracy)PICK(kEnums);
      x = arena + (below(4096) & ~(dtype_align(x_dtype) - 1));
      y = arena + 32 * 1024 + (below(4096) & ~(dtype_align(y_dtype) - 1));
      if (mutate()) x = maybe_null(arena_at(dtype_align(x_dtype)));
      if (mutate())
        y = below(3) ? (void*)(weights + 512 * 1024) : maybe_null(arena_at(dtype_align(y_dtype)));
      out = y;
      out_bytes = 4 * (3 * 256 + 32);
      snapshot(out, out_bytes);
      checked_output = 1;
      if (f == 19) {
        current_call = "qmoe_gemm";
        s = qmoe_gemm(c, wp, level, m, (const float*)x, ldx, (float*)y, ldy, n0, n1);
      } else {
        current_call = "qmoe_gemm_typed";
        s = qmoe_gemm_typed(c, wp, level, m, x_dtype, x, ldx, y_dtype, y, ldy, n0, n1);
      }
      break;
    }
    case 21: {
      static const size_t dst_bytes[] = {0, 64, 127, 768, 1536, 4096};
      void* dst = maybe_null(arena_at(1));
      current_call = "qmoe_import_int4_onnx";
      out = dst;
      out_bytes = 4096;
      snapshot(out, out_bytes);
      checked_output = 1;
      s = qmoe_import_int4_onnx((const uint8_t*)maybe_null(arena_at(1)), PICK(kDims), PICK(kKs),
                                dst, PICK(dst_bytes));
      break;
    }
    case 22: {
      uint8_t* dst = (uint8_t*)maybe_null(arena_at(1));
      current_call = "qmoe_import_int4_onnx_zero_points";
      s = qmoe_import_int4_onnx_zero_points((const uint8_t*)maybe_null(arena_at(1)), PICK(kDims),
                                            PICK(kKs), PICK(kBlocks), dst, PICK(kStrides),
                                            PICK(kStrides));
      break;
    }
    case 23: {
      static const size_t dst_bytes[] = {0, 127, 1536, 4096};
      current_call = "qmoe_import_int4_q4_0";
      /* Scales at any even address, or an odd one (refused: "scales is not aligned"). */
      uint16_t* scales = (uint16_t*)maybe_null(arena_at(2));
      if (scales != NULL && below(4) == 0) scales = (uint16_t*)(void*)((unsigned char*)scales + 1);
      s = qmoe_import_int4_q4_0(maybe_null(arena_at(1)), PICK(kDims), PICK(kKs),
                                maybe_null(arena_at(1)), PICK(dst_bytes), scales, PICK(kStrides),
                                PICK(kStrides));
      break;
    }
    case 24: {
      const uint32_t n = PICK(kDims), b = PICK(kBlocks);
      current_call = "qmoe_grouped_plane_elements";
      if (n == 0 || b == 0) CHECK(qmoe_grouped_plane_elements(n, b) == 0);
      if (n == 13 && b == 3) CHECK(qmoe_grouped_plane_elements(n, b) == 48);
      return;
    }
    case 25: {
      static const size_t elements[] = {0, 1, 2, 3, 4, 8};
      static const size_t dst_bytes[] = {0, 100, 1024, 4096};
      static const uint32_t blocks[] = {0, 1, 2, 4, 8};
      current_call = "qmoe_group_plane";
      s = qmoe_group_plane(maybe_null(arena_at(1)), PICK(kDims), PICK(blocks), PICK(elements),
                           PICK(kStrides), PICK(kStrides), maybe_null(arena_at(1)),
                           PICK(dst_bytes));
      break;
    }
    case 26: {
      static const size_t sizes[] = {0, 1, 4096, (size_t)3 << 20, (size_t)1 << 62, SIZE_MAX};
      void* memory = (void*)foreign;
      const size_t bytes = PICK(sizes);
      current_call = "qmoe_alloc_weight_memory";
      s = qmoe_alloc_weight_memory(bytes, below(8) ? &memory : NULL);
      if (s == QMOE_STATUS_OK) {
        memset(memory, 0x5A, bytes); /* all of it is ours */
        qmoe_free_weight_memory(memory);
      } else if (memory != (void*)foreign) {
        CHECK(memory == NULL);
      }
      break;
    }
    case 27:
      current_call = "qmoe_free_weight_memory";
      qmoe_free_weight_memory(NULL);
      return;
    case 28: {
      qmoe_expert_set_desc d;
      current_call = "qmoe_expert_set_desc_init";
      qmoe_expert_set_desc_init(below(3) ? &d : NULL);
      return;
    }
    case 29: {
      static const uint32_t experts[] = {0, 1, 2, kExperts};
      static const uint32_t hidden[] = {0, 16, kHidden, 64, 0xFFFFFFFFu};
      static const uint32_t inter[] = {0, 8, kInter, 32, 0x80000000u};
      qmoe_expert_set_desc d;
      qmoe_expert_set* set = (qmoe_expert_set*)(void*)foreign;
      qmoe_expert_set_desc_init(&d);
      d.num_experts = below(2) ? kExperts : PICK(experts);
      d.hidden = below(2) ? kHidden : PICK(hidden);
      d.intermediate = below(2) ? kInter : PICK(inter);
      d.swiglu_fusion = (qmoe_swiglu_fusion)(below(3) ? (int32_t)(1 + below(2)) : PICK(kEnums));
      d.fc1 = below(8) ? fc1 : below(2) ? fc_bad : NULL;
      d.fc2 = below(8) ? fc2 : below(2) ? fc_bad : NULL;
      if (below(4) == 0) d.swiglu_alpha = any_float();
      if (below(4) == 0) d.swiglu_beta = any_float();
      if (below(4) == 0) d.swiglu_limit = any_float();
      if (below(4) == 0) d.struct_size = any_struct_size(sizeof d);
      current_call = "qmoe_expert_set_create";
      s = qmoe_expert_set_create(below(10) ? &d : NULL, below(10) ? &set : NULL);
      if (s == QMOE_STATUS_OK) {
        EXPECT_STATUS(qmoe_expert_set_destroy(set), QMOE_STATUS_OK);
      } else if (set != (qmoe_expert_set*)(void*)foreign) {
        CHECK(set == NULL);
      }
      break;
    }
    case 30: {
      qmoe_expert_set* victims[3];
      victims[0] = NULL;
      victims[1] = dead_set;
      victims[2] = (qmoe_expert_set*)(void*)foreign;
      current_call = "qmoe_expert_set_destroy";
      s = qmoe_expert_set_destroy(PICK(victims));
      break;
    }
    case 31: {
      static const uint32_t ms[] = {0, 1, 3};
      static const uint32_t es[] = {0, 1, 4, 8, 0x80000000u};
      static const uint32_t ks[] = {0, 1, 2, 8, 9};
      float* logits = (float*)arena_at(4);
      int32_t* ids = (int32_t*)maybe_null(arena_at(4));
      float* w = (float*)maybe_null(arena_at(4));
      uint32_t i;
      for (i = 0; i < 24; ++i) logits[i] = below(8) ? PICK(kFloats) : any_float();
      current_call = "qmoe_moe_route_topk";
      s = qmoe_moe_route_topk((const float*)maybe_null(logits), PICK(ms), PICK(es), PICK(ks),
                              (int)below(3), ids, w);
      break;
    }
    case 32: {
      qmoe_moe_params p;
      current_call = "qmoe_moe_params_init";
      qmoe_moe_params_init(below(3) ? &p : NULL);
      return;
    }
    case 33: {
      static const uint32_t ms[] = {0, 1, 3, 0xFFFFFFFFu};
      static const uint32_t ks[] = {0, 1, 2, kExperts, kExperts + 1};
      size_t bytes = 77;
      current_call = "qmoe_moe_workspace_size";
      s = qmoe_moe_workspace_size(any_context(), any_set(), (qmoe_accuracy)(1 + below(3)), PICK(ms),
                                  PICK(ks), below(8) ? &bytes : NULL);
      if (s != QMOE_STATUS_OK) CHECK(bytes == 77);
      break;
    }
    case 34: {
      static const uint32_t ms[] = {0, 1, 2, 3};
      static const uint32_t ks[] = {0, 1, 2, kExperts, kExperts + 1};
      static const qmoe_dtype dt[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16,
                                      QMOE_DTYPE_E8M0, (qmoe_dtype)0};
      static const size_t lds[] = {0, 16, kHidden, 64, 256};
      qmoe_moe_params p;
      int32_t* ids = (int32_t*)(void*)(arena + 200 * 1024);
      float* w = (float*)(void*)(arena + 201 * 1024);
      float* logits = (float*)(void*)(arena + 202 * 1024);
      uint8_t* mask = arena + 203 * 1024;
      uint32_t i;
      qmoe_moe_params_init(&p);
      /* The valid base: x and y apart, lds that fit, one routing; then mutations. */
      p.accuracy = (qmoe_accuracy)(1 + below(2));
      p.dtype = below(2) ? QMOE_DTYPE_F32 : dt[below(3)];
      p.m = 1 + below(3);
      p.k = 1 + below(kExperts);
      p.ldx = p.ldy = below(2) ? kHidden : 64;
      if (mutate()) p.struct_size = any_struct_size(sizeof p);
      if (mutate()) p.accuracy = (qmoe_accuracy)PICK(kEnums);
      if (mutate()) p.dtype = PICK(dt);
      if (mutate()) p.m = PICK(ms);
      if (mutate()) p.k = PICK(ks);
      if (mutate()) p.ldx = PICK(lds);
      if (mutate()) p.ldy = below(2) ? p.ldx : PICK(lds);
      p.x = arena + (below(4096) & ~(dtype_align(p.dtype) - 1));
      p.y = arena + 32 * 1024 + (below(4096) & ~(dtype_align(p.dtype) - 1));
      if (mutate()) p.x = maybe_null(arena_at(dtype_align(p.dtype)));
      /* Sometimes y over the set's own weights (FC1's codes): refused. */
      if (mutate()) {
        p.y = below(3) ? maybe_null(arena_at(dtype_align(p.dtype))) : (void*)(weights + 16 * 1024);
      }
      if (below(8) == 0) p.y = (void*)p.x; /* in place */
      for (i = 0; i < 3 * (kExperts + 1); ++i) {
        ids[i] = (int32_t)below(kExperts);
        w[i] = PICK(kFloats);
        logits[i] = PICK(kFloats);
        mask[i] = (uint8_t)below(2);
        if (mutate()) ids[i] = (int32_t)below(3) - 1 + (int32_t)(kExperts * below(2));
        if (mutate()) w[i] = any_float();
        if (mutate()) logits[i] = any_float();
      }
      if (below(2)) {
        p.ids = ids;
        p.weights = w;
        if (mutate()) p.ids = NULL;
        if (mutate()) p.weights = NULL;
        if (mutate()) p.logits = logits;
      } else {
        p.logits = logits;
        if (mutate()) p.logits = NULL;
        if (mutate()) p.ids = ids;
      }
      p.renormalize = (int)below(2);
      p.run_mask = below(3) == 0 ? mask : NULL;
      p.accumulate = (int)below(2);
      if (below(3) == 0) {
        const size_t sizes[] = {0, 100, workspace_need, workspace_need - 1, SIZE_MAX};
        p.workspace = workspace + below(64);
        p.workspace_bytes = workspace_need;
        if (mutate()) p.workspace_bytes = PICK(sizes);
        if (mutate()) p.workspace = arena + 210 * 1024;
        if (mutate()) p.workspace = (void*)p.x; /* over x: refused */
      }
      out = p.y;
      out_bytes = p.y == p.x ? 0 : 4 * (3 * 256 + kHidden);
      snapshot(out, out_bytes);
      checked_output = 1;
      current_call = "qmoe_moe_forward";
      s = qmoe_moe_forward(mutate() ? any_context() : contexts[below(3)],
                           mutate() ? any_set() : live_set, mutate() ? NULL : &p);
      break;
    }
    case 35: {
      uint32_t count = 77;
      current_call = "qmoe_context_get_kernel_count";
      s = qmoe_context_get_kernel_count(any_context(), below(6) ? &count : NULL);
      if (s != QMOE_STATUS_OK) CHECK(count == 77);
      break;
    }
    case 36: {
      static const uint32_t index[] = {0, 1, 7, 8, 9, 0xFFFFFFFFu};
      qmoe_kernel_info info;
      memset(&info, 0, sizeof info);
      info.struct_size = any_struct_size(sizeof info);
      current_call = "qmoe_context_get_kernel_info";
      s = qmoe_context_get_kernel_info(any_context(), PICK(index), below(6) ? &info : NULL);
      if (s == QMOE_STATUS_OK) {
        CHECK(info.name != NULL && strncmp(info.name, "qmoe_", 5) == 0);
      } else {
        CHECK(info.name == NULL);
      }
      break;
    }
    case 37: {
      static const size_t sizes[] = {0, 4095, 4096, 8192, ((size_t)1 << 40) + 1, SIZE_MAX};
      double bw = -1.0;
      current_call = "qmoe_measure_read_bandwidth";
      s = qmoe_measure_read_bandwidth(any_context(), PICK(sizes), below(3), (int)below(2),
                                      below(6) ? &bw : NULL);
      if (s == QMOE_STATUS_OK) {
        CHECK(bw > 0.0);
      } else {
        CHECK(bw == -1.0);
      }
      break;
    }
    case 38: {
      static const size_t sizes[] = {0, 4095, 4096, 4160, 8192, SIZE_MAX};
      double bw = -1.0;
      current_call = "qmoe_measure_read_bandwidth_over";
      s = qmoe_measure_read_bandwidth_over(any_context(), maybe_null(arena_at(1)), PICK(sizes),
                                           below(3), (int)below(2), below(6) ? &bw : NULL);
      if (s != QMOE_STATUS_OK) CHECK(bw == -1.0);
      break;
    }
    case 39: {
      int n = -1;
      current_call = "qmoe_cuda_get_device_count";
      s = qmoe_cuda_get_device_count(below(4) ? &n : NULL);
      if (s != QMOE_STATUS_OK) CHECK(n == -1);
      break;
    }
    case 40:
    case 41:
    case 42:
    case 43: {
      /* The other formats' importers; each writes only into dst (and the ggml one its scale
       * plane), so a refusal must leave 4 KiB there as it was. */
      static const size_t dst_bytes[] = {0, 64, 127, 768, 1536, 4096};
      const uint8_t* src = (const uint8_t*)maybe_null(arena_at(1));
      void* dst = maybe_null(arena_at(1));
      const uint32_t n = PICK(kDims), k = PICK(kKs);
      const size_t bytes = PICK(dst_bytes);
      out = dst;
      out_bytes = 4096;
      snapshot(out, out_bytes);
      checked_output = 1;
      if (f == 40) {
        current_call = "qmoe_import_int3_packed";
        s = qmoe_import_int3_packed(src, n, k, dst, bytes);
      } else if (f == 41) {
        current_call = "qmoe_import_mxfp4_gpt_oss";
        s = qmoe_import_mxfp4_gpt_oss(src, n, k, dst, bytes);
      } else if (f == 42) {
        current_call = "qmoe_import_nvfp4_modelopt";
        s = qmoe_import_nvfp4_modelopt(src, n, k, dst, bytes);
      } else {
        current_call = "qmoe_import_mxfp4_ggml";
        checked_output = 0; /* the scale plane is a second output */
        s = qmoe_import_mxfp4_ggml(src, n, k, dst, bytes, (uint8_t*)maybe_null(arena_at(1)),
                                   PICK(kStrides), PICK(kStrides));
      }
      break;
    }
    case 44: {
      /* create, from a valid description with fields mutated to drawn values (bad ones among
       * them); destroyed at once when accepted. Every field drawn at once was accepted about 5
       * times in 330 calls, and none at all for some seeds, so a run could fail its check that
       * this function did work. */
      static const uint32_t dims[] = {0, 1, 3, 6, 128, 0xFFFFFFFFu};
      qmoe_expert_cache_desc d;
      qmoe_expert_cache* cache = (qmoe_expert_cache*)(void*)foreign;
      qmoe_expert_cache_desc_init(&d);
      d.num_layers = 1 + below(6);
      d.num_experts = 1 + below(128);
      d.num_slots = 1 + below(d.num_experts);
      d.policy = (qmoe_cache_policy)(QMOE_CACHE_POLICY_STATIC + below(4));
      if (mutate()) {
        d.struct_size = any_struct_size(sizeof d);
        if (d.struct_size > sizeof d) d.struct_size = sizeof d; /* the struct is this big */
      }
      if (mutate()) d.num_layers = PICK(dims) % 64; /* never an allocation beyond 64 x 2^32 */
      if (mutate()) d.num_experts = PICK(dims) % 4096;
      if (mutate()) d.num_slots = PICK(dims);
      if (mutate()) d.policy = (qmoe_cache_policy)PICK(kEnums);
      if (mutate()) d.half_life_steps = any_float();
      if (mutate()) d.max_promotions_per_step = PICK(dims);
      if (mutate()) d.admission_margin = any_float();
      current_call = "qmoe_expert_cache_create";
      s = qmoe_expert_cache_create(below(8) ? &d : NULL, below(8) ? &cache : NULL);
      if (s == QMOE_STATUS_OK) {
        CHECK(qmoe_expert_cache_destroy(cache) == QMOE_STATUS_OK);
      } else if (cache != (qmoe_expert_cache*)(void*)foreign) {
        CHECK(cache == NULL);
      }
      break;
    }
    case 45: {
      /* observe: ids mostly in range, some padding, now and then one outside [-1, 6). */
      static const int32_t pool[] = {0, 1, 2, 3, 4, 5, -1, 2, 3, 6, -2, 0x7FFFFFFF};
      int32_t ids[24];
      const size_t n = below(25);
      size_t i;
      for (i = 0; i < n; ++i) ids[i] = below(4) ? (int32_t)below(6) : PICK(pool);
      current_call = "qmoe_expert_cache_observe";
      s = qmoe_expert_cache_observe(any_cache(), below(3), below(8) ? ids : NULL, n);
      break;
    }
    case 46:
      current_call = "qmoe_expert_cache_end_step";
      s = qmoe_expert_cache_end_step(any_cache());
      break;
    case 47: {
      uint32_t ids[8], count = 77;
      const uint32_t capacity = below(8);
      uint32_t* dst = below(4) ? ids : NULL;
      memset(ids, 0x5A, sizeof ids);
      out = ids;
      out_bytes = sizeof ids;
      snapshot(out, out_bytes);
      current_call = "qmoe_expert_cache_get_residency";
      s = qmoe_expert_cache_get_residency(any_cache(), below(3), dst, capacity,
                                          below(8) ? &count : NULL);
      if (s != QMOE_STATUS_OK) {
        CHECK(count == 77);
        CHECK(unchanged(out, out_bytes));
      } else {
        uint32_t i;
        CHECK(count <= 3);
        for (i = 1; dst != NULL && i < count; ++i) CHECK(ids[i - 1] < ids[i]);
        if (dst == NULL) CHECK(unchanged(out, out_bytes));
      }
      out = NULL;
      break;
    }
    case 48: {
      uint32_t ids[5];
      const uint32_t n = below(6);
      uint32_t i;
      for (i = 0; i < n; ++i) ids[i] = below(8) ? below(6) : PICK(kDims);
      current_call = "qmoe_expert_cache_set_residency";
      s = qmoe_expert_cache_set_residency(any_cache(), below(3), below(8) ? ids : NULL, n);
      break;
    }
    case 49: {
      qmoe_expert_cache_stats st;
      static const uint32_t layers[] = {0, 1, 2, QMOE_EXPERT_CACHE_ALL_LAYERS, 0x7FFFFFFFu};
      memset(&st, 0x5A, sizeof st);
      st.struct_size = any_struct_size(sizeof st);
      if (st.struct_size > sizeof st) st.struct_size = sizeof st;
      current_call = "qmoe_expert_cache_get_stats";
      s = qmoe_expert_cache_get_stats(any_cache(), PICK(layers), below(8) ? &st : NULL);
      if (s == QMOE_STATUS_OK) CHECK(st.hits <= st.selections);
      break;
    }
    case 50: {
      /* per-expert counts: the cache's 6 entries or a wrong count, values small or huge. */
      static const uint32_t values[] = {0, 1, 3, 1000, 0x7FFFFFFFu, 0xFFFFFFFFu};
      uint32_t counts[8];
      uint32_t i;
      for (i = 0; i < 8; ++i) counts[i] = below(8) ? below(4) : PICK(values);
      current_call = "qmoe_expert_cache_observe_counts";
      s = qmoe_expert_cache_observe_counts(any_cache(), below(3), below(8) ? counts : NULL,
                                           below(4) ? 6 : below(9));
      break;
    }
    case 51: {
      const char* paths[6];
      qmoe_expert_store* store = (qmoe_expert_store*)(void*)foreign;
      paths[0] = NULL;
      paths[1] = "";
      paths[2] = store_path;
      paths[3] = junk_path;
      paths[4] = "/nonexistent-qmoe-dir/store";
      paths[5] = "/";
      current_call = "qmoe_expert_store_open";
      s = qmoe_expert_store_open(PICK(paths), below(8) ? &store : NULL);
      if (s == QMOE_STATUS_OK) {
        CHECK(qmoe_expert_store_close(store) == QMOE_STATUS_OK);
      } else if (store != (qmoe_expert_store*)(void*)foreign) {
        CHECK(store == NULL);
      }
      break;
    }
    case 52: {
      /* never the live store: the loop goes on using it */
      qmoe_expert_store* handles[3];
      handles[0] = NULL;
      handles[1] = dead_store;
      handles[2] = (qmoe_expert_store*)(void*)foreign;
      current_call = "qmoe_expert_store_close";
      s = qmoe_expert_store_close(PICK(handles));
      break;
    }
    case 53: {
      static const size_t sizes[] = {0,
                                     8,
                                     sizeof(qmoe_expert_store_info) - 1,
                                     sizeof(qmoe_expert_store_info),
                                     sizeof(qmoe_expert_store_info) + 16,
                                     (size_t)1 << 40};
      qmoe_expert_store_info info;
      info.struct_size = below(4) ? sizeof info : PICK(sizes);
      current_call = "qmoe_expert_store_get_info";
      s = qmoe_expert_store_get_info(any_store(), below(8) ? &info : NULL);
      if (s == QMOE_STATUS_OK) CHECK(info.num_experts == kExperts);
      break;
    }
    case 54: {
      /* into the arena: aligned or not, room for the ids or less */
      uint32_t ids[4];
      uint32_t i, n = below(5);
      const size_t offset = below(4) ? 0 : 8 * below(8);
      const size_t room = below(4) ? n * store_expert_bytes : below(3) * store_expert_bytes + 64;
      for (i = 0; i < 4; ++i) ids[i] = below(8) ? below(kExperts) : (uint32_t)next_u64();
      if ((n + 1) * store_expert_bytes > kArenaBytes) n = 1;
      current_call = "qmoe_expert_store_read";
      s = qmoe_expert_store_read(any_store(), below(3), below(8) ? ids : NULL, n, (int)below(2),
                                 below(8) ? arena + offset : NULL, room);
      break;
    }
    case 55: {
      /* layer 1's records, one sometimes out of place, misaligned or NULL */
      const void* records[kExperts];
      qmoe_expert_set* set = (qmoe_expert_set*)(void*)foreign;
      uint32_t e;
      for (e = 0; e < kExperts; ++e) records[e] = store_records + e * store_expert_bytes;
      if (below(3) == 0) {
        const uint32_t a = below(kExperts), b = below(kExperts);
        const void* t = records[a];
        records[a] = records[b];
        records[b] = t;
      }
      if (below(6) == 0) records[below(kExperts)] = below(2) ? NULL : store_records + 8;
      current_call = "qmoe_expert_store_create_set";
      s = qmoe_expert_store_create_set(any_store(), below(3), below(8) ? records : NULL,
                                       below(8) ? &set : NULL);
      if (s == QMOE_STATUS_OK) {
        CHECK(qmoe_expert_set_destroy(set) == QMOE_STATUS_OK);
      } else if (set != (qmoe_expert_set*)(void*)foreign) {
        CHECK(set == NULL);
      }
      break;
    }
    case 56: {
      const qmoe_expert_set* layers[3];
      uint32_t i;
      for (i = 0; i < 3; ++i) layers[i] = below(6) ? live_set : any_set();
      current_call = "qmoe_expert_store_write";
      s = qmoe_expert_store_write(below(8) ? write_path : "", below(8) ? layers : NULL, below(4));
      break;
    }
    case 57: {
      qmoe_expert_set* set = (qmoe_expert_set*)(void*)foreign;
      current_call = "qmoe_expert_store_map_layer";
      s = qmoe_expert_store_map_layer(any_store(), below(3), below(8) ? &set : NULL);
      if (s == QMOE_STATUS_OK) {
        CHECK(qmoe_expert_set_destroy(set) == QMOE_STATUS_OK);
      } else if (set != (qmoe_expert_set*)(void*)foreign) {
        CHECK(set == NULL);
      }
      break;
    }
    case 58:
    case 59: {
      uint32_t ids[4];
      uint8_t ready[5] = {9, 9, 9, 9, 9};
      uint32_t i, n = below(5);
      for (i = 0; i < 4; ++i) ids[i] = below(8) ? below(kExperts) : (uint32_t)next_u64();
      if (f == 58) {
        current_call = "qmoe_expert_store_prefetch";
        s = qmoe_expert_store_prefetch(any_store(), below(3), below(8) ? ids : NULL, n);
      } else {
        current_call = "qmoe_expert_store_ready";
        s = qmoe_expert_store_ready(any_store(), below(3), below(8) ? ids : NULL, n,
                                    below(8) ? ready : NULL);
        CHECK(ready[4] == 9);
        if (s == QMOE_STATUS_OK) {
          for (i = 0; i < n; ++i) CHECK(ready[i] <= 1);
        }
      }
      break;
    }
    default:
      return;
  }
  accepted[f] += s == QMOE_STATUS_OK;
  CHECK((int)s >= 0 && (int)s <= QMOE_STATUS_CORRUPT_DATA);
  CHECK(s != QMOE_STATUS_INTERNAL_ERROR);
  if (s != QMOE_STATUS_OK) CHECK(qmoe_last_error_message()[0] != '\0');
  if (s != QMOE_STATUS_OK && checked_output) CHECK(unchanged(out, out_bytes));
}

/* ---- setup ---------------------------------------------------------------------------------- */

static unsigned char* aligned_block(size_t bytes);

/* A unique file name under TMPDIR (or /tmp), the file created empty. */
static void temp_name(char* path, size_t size, const char* what) {
  const char* dir = getenv("TMPDIR");
  int fd;
  snprintf(path, size, "%s/qmoe_fuzz_%s_XXXXXX", dir != NULL && *dir ? dir : "/tmp", what);
  fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
}

static void make_store(void) {
  const qmoe_expert_set* layers[2];
  qmoe_expert_store_info info;
  uint32_t all[kExperts], e;
  FILE* junk;
  temp_name(store_path, sizeof store_path, "store");
  temp_name(junk_path, sizeof junk_path, "junk");
  temp_name(write_path, sizeof write_path, "write");
  layers[0] = live_set;
  layers[1] = live_set;
  CHECK(qmoe_expert_store_write(store_path, layers, 2) == QMOE_STATUS_OK);
  junk = fopen(junk_path, "wb");
  CHECK(junk != NULL);
  if (junk != NULL) {
    for (e = 0; e < 5000; ++e) fputc((int)below(256), junk);
    fclose(junk);
  }
  CHECK(qmoe_expert_store_open(store_path, &live_store) == QMOE_STATUS_OK);
  CHECK(qmoe_expert_store_open(store_path, &dead_store) == QMOE_STATUS_OK);
  CHECK(qmoe_expert_store_close(dead_store) == QMOE_STATUS_OK);
  info.struct_size = sizeof info;
  CHECK(qmoe_expert_store_get_info(live_store, &info) == QMOE_STATUS_OK);
  store_expert_bytes = info.expert_bytes;
  store_records = aligned_block(kExperts * store_expert_bytes);
  CHECK(store_records != NULL);
  for (e = 0; e < kExperts; ++e) all[e] = e;
  CHECK(qmoe_expert_store_read(live_store, 1, all, kExperts, 1, store_records,
                               kExperts * store_expert_bytes) == QMOE_STATUS_OK);
}

static void make_handles(void) {
  qmoe_context_options o;
  qmoe_expert_set_desc d;
  uint32_t e;
  qmoe_context_options_init(&o);
  o.max_isa = QMOE_ISA_SCALAR;
  o.num_threads = 1;
  CHECK(qmoe_context_create(&o, &contexts[0]) == QMOE_STATUS_OK);
  qmoe_context_options_init(&o);
  o.num_threads = 2;
  CHECK(qmoe_context_create(&o, &contexts[1]) == QMOE_STATUS_OK);
  qmoe_context_options_init(&o);
  o.num_threads = 3;
  o.parallel_for = serial_parallel_for;
  CHECK(qmoe_context_create(&o, &contexts[2]) == QMOE_STATUS_OK);
  CHECK(qmoe_context_create(NULL, &dead_context) == QMOE_STATUS_OK);
  CHECK(qmoe_context_destroy(dead_context) == QMOE_STATUS_OK);

  /* Experts: FC1 [2I, H], FC2 [H, I] (block 32 needs I = 32: use block 16 for FC2). */
  valid_matrix(&fc1_desc, 2 * kInter, kHidden, 16 * 1024);
  valid_matrix(&fc2_desc, kHidden, 32, 32 * 1024);
  fc2_desc.k = kInter;
  fc2_desc.block_size = 16;
  fc2_desc.scale_block_stride = kHidden;
  bad_desc = fc2_desc;
  bad_desc.n = kHidden + 8; /* the wrong shape */
  for (e = 0; e < kExperts; ++e) {
    fc1[e] = &fc1_desc;
    fc2[e] = &fc2_desc;
    fc_bad[e] = e == 2 ? &bad_desc : &fc2_desc;
  }
  qmoe_expert_set_desc_init(&d);
  d.num_experts = kExperts;
  d.hidden = kHidden;
  d.intermediate = kInter;
  d.fc1 = fc1;
  d.fc2 = fc2;
  CHECK(qmoe_expert_set_create(&d, &live_set) == QMOE_STATUS_OK);
  CHECK(qmoe_expert_set_create(&d, &dead_set) == QMOE_STATUS_OK);
  CHECK(qmoe_expert_set_destroy(dead_set) == QMOE_STATUS_OK);
  {
    qmoe_expert_cache_desc cd;
    qmoe_expert_cache_desc_init(&cd);
    cd.num_layers = 2;
    cd.num_experts = 6;
    cd.num_slots = 3;
    CHECK(qmoe_expert_cache_create(&cd, &live_cache) == QMOE_STATUS_OK);
    CHECK(qmoe_expert_cache_create(&cd, &dead_cache) == QMOE_STATUS_OK);
    CHECK(qmoe_expert_cache_destroy(dead_cache) == QMOE_STATUS_OK);
  }
  make_store();
  {
    size_t bytes = 0;
    uint32_t c;
    for (c = 0; c < 3; ++c) {
      CHECK(qmoe_moe_workspace_size(contexts[c], live_set, QMOE_ACCURACY_EXACT, 3, kExperts,
                                    &bytes) == QMOE_STATUS_OK);
      if (bytes > workspace_need) workspace_need = bytes;
    }
  }
}

static unsigned char* aligned_block(size_t bytes) {
  void* p = NULL;
  if (posix_memalign(&p, 64, bytes) != 0) return NULL;
  memset(p, 0, bytes);
  return (unsigned char*)p;
}

int main(void) {
  const char* seed_text = getenv("QMOE_TEST_SEED");
  const char* iterations_text = getenv("QMOE_FUZZ_ITERATIONS");
  const uint64_t seed = seed_text != NULL && *seed_text
                            ? strtoull(seed_text, NULL, 0)
                            : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
  const long iterations = iterations_text != NULL ? strtol(iterations_text, NULL, 0) : 20000;
  uint32_t calls[kFunctions];
  long i;
  uint32_t c;

  printf("c_abi_fuzz_test: seed %llu (replay: QMOE_TEST_SEED=%llu), %ld iterations\n",
         (unsigned long long)seed, (unsigned long long)seed, iterations);
  fflush(stdout);
  rng_state = seed;
  arena = aligned_block(kArenaBytes);
  weights = aligned_block(kArenaBytes);
  scratch_copy = aligned_block(kArenaBytes);
  make_handles();
  workspace = aligned_block(workspace_need + 256);
  if (workspace_need > 512 * 1024) {
    fprintf(stderr, "c_abi_fuzz_test: a workspace of %zu bytes does not fit the arena's tail\n",
            workspace_need);
    return 1;
  }
  if (arena == NULL || weights == NULL || scratch_copy == NULL || workspace == NULL) {
    fprintf(stderr, "c_abi_fuzz_test: allocation failed\n");
    return 1;
  }
  documented_refusals();

  memset(calls, 0, sizeof calls);
  for (i = 0; i < iterations && failures < 50; ++i) {
    const uint32_t f = below(kFunctions);
    draw_mutation_rate();
    ++calls[f];
    fuzz_one(f);
  }
  /* The loop reached every function, and the work behind the ones that do work: a fuzzer
   * whose every call is refused tests the checks only. */
  printf("c_abi_fuzz_test: calls (accepted) per function:");
  for (c = 0; c < kFunctions; ++c) printf(" %u:%u(%u)", c, calls[c], accepted[c]);
  printf("\n");
  if (iterations >= 2000) {
    static const uint32_t must_work[] = {13, 14, 15, 16, 19, 20, 21, 23, 25, 29, 31, 34, 37,
                                         44, 45, 46, 47, 48, 49, 50, 51, 53, 54, 55, 56};
    for (c = 0; c < kFunctions; ++c) {
      if (calls[c] == 0) {
        fprintf(stderr, "c_abi_fuzz_test: function %u was never drawn\n", c);
        ++failures;
      }
    }
    for (c = 0; c < sizeof must_work / sizeof must_work[0]; ++c) {
      if (accepted[must_work[c]] == 0) {
        fprintf(stderr, "c_abi_fuzz_test: no call of function %u was accepted\n", must_work[c]);
        ++failures;
      }
    }
  }

  for (c = 0; c < 3; ++c) qmoe_context_destroy(contexts[c]);
  qmoe_expert_set_destroy(live_set);
  qmoe_expert_cache_destroy(live_cache);
  qmoe_expert_store_close(live_store);
  remove(store_path);
  remove(junk_path);
  remove(write_path);
  free(store_records);
  free(arena);
  free(weights);
  free(scratch_copy);
  free(workspace);
  if (failures != 0) {
    fprintf(stderr, "c_abi_fuzz_test: %d failures (seed %llu: QMOE_TEST_SEED=%llu replays)\n",
            failures, (unsigned long long)seed, (unsigned long long)seed);
    return 1;
  }
  printf("c_abi_fuzz_test: all checks passed\n");
  return 0;
}
