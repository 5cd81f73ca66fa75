/* The public headers (stable, experimental, CUDA, cache) as strict C99 (-std=c99 -pedantic
 * -Werror), and the ABI called from C: versions, statuses, contexts, kernels, conversions, the
 * GEMM, the MoE layer, and their bad-input statuses. */
#include <math.h>
#include <qmoe/qmoe.h>
#include <qmoe/qmoe_cache.h>
#include <qmoe/qmoe_cuda.h>
#include <qmoe/qmoe_experimental.h>
#include <qmoe/qmoe_store.h>
#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", __FILE__, __LINE__, #cond, \
              qmoe_last_error_message());                                                      \
      ++failures;                                                                              \
    }                                                                                          \
  } while (0)

static void serial_parallel_for(void* runtime_state, qmoe_parallel_task_fn task, void* task_state,
                                size_t range) {
  size_t i;
  ++*(int*)runtime_state;
  for (i = 0; i < range; ++i) task(task_state, i);
}

int main(void) {
  qmoe_context* context = NULL;
  qmoe_context_options options;
  qmoe_host_info info;
  qmoe_isa isa = QMOE_ISA_DEFAULT;
  const uint16_t halves[4] = {0x3C00, 0xC000, 0x7C00, 0x0001};
  const float floats[4] = {1.0f, -2.0f, 65520.0f, 1.0f / 3.0f};
  float wide[4];
  uint16_t narrow[4];
  const char* name = NULL;
  int parallel_calls = 0;
  int available = 0;
  uint32_t kernel_count = 0, i;

  CHECK(qmoe_version_number() == QMOE_VERSION_NUMBER);
  CHECK(strcmp(qmoe_version_string(), QMOE_VERSION_STRING) == 0);
  CHECK(strcmp(qmoe_status_string(QMOE_STATUS_UNSUPPORTED_HARDWARE),
               "QMOE_STATUS_UNSUPPORTED_HARDWARE") == 0);

  memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  CHECK(qmoe_get_host_info(&info) == QMOE_STATUS_OK);
  CHECK(info.best_supported_isa >= QMOE_ISA_SCALAR);

  qmoe_context_options_init(&options);
  CHECK(options.struct_size == sizeof(options));
  options.parallel_for = serial_parallel_for;
  options.parallel_for_state = &parallel_calls;
  options.num_threads = 4;
  CHECK(qmoe_context_create(&options, &context) == QMOE_STATUS_OK);
  CHECK(qmoe_context_get_isa(context, &isa) == QMOE_STATUS_OK);
  CHECK(isa == info.default_isa);
  CHECK(qmoe_context_get_kernel_count(context, &kernel_count) == QMOE_STATUS_OK);
  CHECK(kernel_count > 0);
  for (i = 0; i < kernel_count; ++i) {
    qmoe_kernel_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    CHECK(qmoe_context_get_kernel_info(context, i, &info) == QMOE_STATUS_OK);
    CHECK(info.name != NULL && strncmp(info.name, "qmoe_", 5) == 0);
  }
  CHECK(qmoe_gemm_kernel_available(context, QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_ACCURACY_FAST,
                                   &available, &name) == QMOE_STATUS_OK);
  CHECK(available == 1 && name != NULL && strncmp(name, "qmoe_gemm_int4_fast", 19) == 0);
  CHECK(qmoe_isa_from_name("avx2", &isa) == QMOE_STATUS_OK && isa == QMOE_ISA_AVX2);
  {
    int devices = -1;
    const qmoe_status cuda = qmoe_cuda_get_device_count(&devices);
    CHECK(cuda == QMOE_STATUS_OK || cuda == QMOE_STATUS_CUDA_UNAVAILABLE ||
          cuda == QMOE_STATUS_CUDA_ERROR);
    CHECK(qmoe_cuda_get_device_count(NULL) == QMOE_STATUS_INVALID_ARGUMENT);
  }
  {
    /* The offload session from C: defaults, and a description without layers refused. */
    qmoe_cuda_offload_desc desc;
    qmoe_cuda_offload* session = (qmoe_cuda_offload*)&desc;
    qmoe_cuda_offload_telemetry telemetry;
    qmoe_cuda_offload_desc_init(&desc);
    CHECK(desc.struct_size == sizeof desc && desc.ring_size == 4 && desc.short_circuit == 1);
    desc.context = context;
    CHECK(qmoe_cuda_offload_create(&desc, &session) == QMOE_STATUS_INVALID_ARGUMENT);
    CHECK(session == NULL);
    memset(&telemetry, 0, sizeof telemetry);
    telemetry.struct_size = sizeof telemetry;
    CHECK(qmoe_cuda_offload_get_telemetry(NULL, NULL, &telemetry) == QMOE_STATUS_INVALID_ARGUMENT);
    CHECK(qmoe_cuda_offload_destroy(NULL) == QMOE_STATUS_OK);
    CHECK(QMOE_CUDA_OFFLOAD_HISTOGRAM_BUCKETS == 24);
  }

  CHECK(qmoe_convert_f16_to_f32(context, halves, wide, 4) == QMOE_STATUS_OK);
  CHECK(wide[0] == 1.0f && wide[1] == -2.0f && isinf(wide[2]) && wide[3] == ldexpf(1.0f, -24));
  CHECK(qmoe_convert_f32_to_f16(context, floats, narrow, 4) == QMOE_STATUS_OK);
  CHECK(narrow[0] == 0x3C00 && narrow[1] == 0xC000 && narrow[2] == 0x7C00 && narrow[3] == 0x3555);
  CHECK(qmoe_convert_f32_to_bf16(context, floats, narrow, 4) == QMOE_STATUS_OK);
  CHECK(narrow[0] == 0x3F80 && narrow[1] == 0xC000 && narrow[3] == 0x3EAB);
  CHECK(qmoe_convert_bf16_to_f32(context, narrow, wide, 2) == QMOE_STATUS_OK);
  CHECK(wide[0] == 1.0f && wide[1] == -2.0f);

  /* The caller's parallel-for is used for long rows. */
  {
    static float big_in[200000];
    static uint16_t big_out[200000];
    CHECK(qmoe_convert_f32_to_bf16(context, big_in, big_out, 200000) == QMOE_STATUS_OK);
    CHECK(parallel_calls > 0);
  }

  /* INT4 GEMM from C: one 8 x 32 matrix, every code 9 (zero point 8), scale 0.5 in FP16:
   * every weight is 0.5, so y[j] = 0.5 * sum(x). */
  {
    unsigned char codes[128];
    uint16_t scales[8];
    float x[32], y[8];
    uint16_t x16[32], y16[8];
    static const uint16_t bf16_0123[4] = {0x0000, 0x3F80, 0x4000, 0x4040}; /* 0, 1, 2, 3 */
    qmoe_quant_matrix w;
    size_t bytes = 0;
    memset(codes, 0x99, sizeof codes);
    for (i = 0; i < 8; ++i) scales[i] = 0x3800; /* 0.5 */
    for (i = 0; i < 32; ++i) x[i] = (float)(i % 4);
    memset(&w, 0, sizeof w);
    w.struct_size = sizeof w;
    w.format = QMOE_WEIGHT_FORMAT_INT4;
    w.n = 8;
    w.k = 32;
    w.block_size = 32;
    w.codes = codes;
    w.scale_dtype = QMOE_DTYPE_F16;
    w.scales = scales;
    w.scale_row_stride = 1;
    w.scale_block_stride = 8;
    CHECK(qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, 8, 32, &bytes) == QMOE_STATUS_OK);
    CHECK(bytes == sizeof codes);
    CHECK(qmoe_gemm(context, &w, QMOE_ACCURACY_EXACT, 1, x, 32, y, 8, 0, 8) == QMOE_STATUS_OK);
    CHECK(y[0] == 24.0f && y[7] == 24.0f); /* 0.5 * 8 * (0 + 1 + 2 + 3) */
    /* The same with BF16 X and FP16 Y: 24 is 0x4E00 in FP16. */
    for (i = 0; i < 32; ++i) x16[i] = bf16_0123[i % 4];
    CHECK(qmoe_gemm_typed(context, &w, QMOE_ACCURACY_EXACT, 1, QMOE_DTYPE_BF16, x16, 32,
                          QMOE_DTYPE_F16, y16, 8, 0, 8) == QMOE_STATUS_OK);
    CHECK(y16[0] == 0x4E00 && y16[7] == 0x4E00);
    w.block_size = 24;
    CHECK(qmoe_gemm(context, &w, QMOE_ACCURACY_EXACT, 1, x, 32, y, 8, 0, 8) ==
          QMOE_STATUS_INVALID_ARGUMENT);
  }

  /* Routing from C: top-2 of 4 experts, renormalised. */
  {
    const float logits[4] = {0.0f, 2.0f, 1.0f, 2.0f};
    int32_t ids[2] = {-1, -1};
    float weights[2] = {0.0f, 0.0f};
    CHECK(qmoe_moe_route_topk(logits, 1, 4, 2, 1, ids, weights) == QMOE_STATUS_OK);
    CHECK(ids[0] == 1 && ids[1] == 3); /* equal logits: the lower id first */
    CHECK(fabsf(weights[0] - 0.5f) < 1e-6f && fabsf(weights[1] - 0.5f) < 1e-6f);
    CHECK(qmoe_moe_route_topk(logits, 1, 4, 5, 1, ids, weights) == QMOE_STATUS_INVALID_ARGUMENT);
  }

  /* The MoE layer from C, through qmoe_moe_params: two experts, H = 32, I = 16, every weight
   * 0.5 (code 9, zero point 8, scale 0.5), X = 1/32: h = 0.5, a = 0.5 * sigmoid(0.5) * 0.5,
   * y = 0.5 * 16 * a for every output of the one expert a token is routed to. */
  {
    static unsigned char codes1[4 * 128], codes2[4 * 128]; /* K = 16 still fills whole tiles */
    static uint16_t scales1[32 * 2], scales2[32];
    qmoe_quant_matrix fc1, fc2;
    const qmoe_quant_matrix* fc1s[2];
    const qmoe_quant_matrix* fc2s[2];
    qmoe_expert_set_desc desc;
    qmoe_expert_set* set = NULL;
    qmoe_moe_params params;
    float x[2 * 32], y[2 * 32];
    const int32_t ids[2] = {1, 0};
    const float weights[2] = {1.0f, 1.0f};
    const double a = 0.5 * (1.0 / (1.0 + exp(-0.5))) * 0.5;
    memset(codes1, 0x99, sizeof codes1);
    memset(codes2, 0x99, sizeof codes2);
    for (i = 0; i < 64; ++i) scales1[i] = 0x3800;
    for (i = 0; i < 32; ++i) scales2[i] = 0x3800;
    for (i = 0; i < 64; ++i) x[i] = 1.0f / 32.0f;
    memset(&fc1, 0, sizeof fc1);
    fc1.struct_size = sizeof fc1;
    fc1.format = QMOE_WEIGHT_FORMAT_INT4;
    fc1.n = 32;
    fc1.k = 32;
    fc1.block_size = 32;
    fc1.codes = codes1;
    fc1.scale_dtype = QMOE_DTYPE_F16;
    fc1.scales = scales1;
    fc1.scale_row_stride = 1;
    fc1.scale_block_stride = 32;
    fc2 = fc1;
    fc2.n = 32;
    fc2.k = 16;
    fc2.block_size = 16;
    fc2.codes = codes2;
    fc2.scales = scales2;
    fc1s[0] = fc1s[1] = &fc1;
    fc2s[0] = fc2s[1] = &fc2;
    qmoe_expert_set_desc_init(&desc);
    desc.num_experts = 2;
    desc.hidden = 32;
    desc.intermediate = 16;
    desc.fc1 = fc1s;
    desc.fc2 = fc2s;
    {
      size_t fc1_bytes = 0, fc2_bytes = 0;
      CHECK(qmoe_quant_matrix_codes_size(fc1.format, fc1.n, fc1.k, &fc1_bytes) == QMOE_STATUS_OK);
      CHECK(qmoe_quant_matrix_codes_size(fc2.format, fc2.n, fc2.k, &fc2_bytes) == QMOE_STATUS_OK);
      CHECK(fc1_bytes == sizeof codes1 && fc2_bytes == sizeof codes2);
    }
    CHECK(qmoe_expert_set_create(&desc, &set) == QMOE_STATUS_OK);
    qmoe_moe_params_init(&params);
    params.accuracy = QMOE_ACCURACY_EXACT;
    params.m = 2;
    params.x = x;
    params.ldx = 32;
    params.y = y;
    params.ldy = 32;
    params.k = 1;
    params.ids = ids;
    params.weights = weights;
    CHECK(qmoe_moe_forward(context, set, &params) == QMOE_STATUS_OK);
    CHECK(fabs(y[0] - 8.0 * a) < 1e-5 && fabs(y[63] - 8.0 * a) < 1e-5);
    params.logits = weights; /* both routings: refused */
    CHECK(qmoe_moe_forward(context, set, &params) == QMOE_STATUS_INVALID_ARGUMENT);
    CHECK(qmoe_expert_set_destroy(set) == QMOE_STATUS_OK);
  }

  /* Read bandwidth over the caller's memory. */
  {
    static unsigned char memory[8192];
    double bytes_per_second = 0.0;
    CHECK(qmoe_measure_read_bandwidth_over(context, memory, sizeof memory, 2, 1,
                                           &bytes_per_second) == QMOE_STATUS_OK);
    CHECK(bytes_per_second > 0.0);
  }

  /* The expert cache: two steps of LRU over one layer of four experts in two slots. */
  {
    qmoe_expert_cache_desc cache_desc;
    qmoe_expert_cache* cache = NULL;
    qmoe_expert_cache_stats stats;
    const int32_t first[3] = {2, 3, -1}, second[2] = {0, 0};
    uint32_t resident[4] = {0, 0, 0, 0}, count = 0;
    qmoe_expert_cache_desc_init(&cache_desc);
    cache_desc.num_layers = 1;
    cache_desc.num_experts = 4;
    cache_desc.num_slots = 2;
    cache_desc.policy = QMOE_CACHE_POLICY_LRU;
    CHECK(qmoe_expert_cache_create(&cache_desc, &cache) == QMOE_STATUS_OK);
    CHECK(qmoe_expert_cache_observe(cache, 0, first, 3) == QMOE_STATUS_OK);
    CHECK(qmoe_expert_cache_end_step(cache) == QMOE_STATUS_OK);
    {
      const uint32_t counts[4] = {2, 0, 0, 0}; /* the same as ids {0, 0} */
      (void)second;
      CHECK(qmoe_expert_cache_observe_counts(cache, 0, counts, 4) == QMOE_STATUS_OK);
    }
    CHECK(qmoe_expert_cache_end_step(cache) == QMOE_STATUS_OK);
    CHECK(qmoe_expert_cache_get_residency(cache, 0, resident, 4, &count) == QMOE_STATUS_OK);
    CHECK(count == 2 && resident[0] == 0 && resident[1] == 2); /* 3 (higher id) left for 0 */
    stats.struct_size = sizeof stats;
    CHECK(qmoe_expert_cache_get_stats(cache, QMOE_EXPERT_CACHE_ALL_LAYERS, &stats) ==
          QMOE_STATUS_OK);
    CHECK(stats.steps == 2 && stats.selections == 4 && stats.hits == 0);
    CHECK(stats.promotions == 3 && stats.evictions == 1);
    CHECK(qmoe_expert_cache_set_residency(cache, 0, resident, 3) == QMOE_STATUS_INVALID_ARGUMENT);
    CHECK(qmoe_expert_cache_destroy(cache) == QMOE_STATUS_OK);
  }

  /* The expert store from C: its info struct, and its refusals' statuses. */
  {
    qmoe_expert_store* store = NULL;
    qmoe_expert_store_info info;
    info.struct_size = sizeof info;
    CHECK(qmoe_expert_store_open("/nonexistent-qmoe-dir/model.qmoe", &store) ==
          QMOE_STATUS_IO_ERROR);
    CHECK(store == NULL);
    CHECK(qmoe_expert_store_get_info(store, &info) == QMOE_STATUS_INVALID_ARGUMENT);
    CHECK(qmoe_expert_store_close(NULL) == QMOE_STATUS_OK);
    CHECK(strcmp(qmoe_status_string(QMOE_STATUS_CORRUPT_DATA), "QMOE_STATUS_CORRUPT_DATA") == 0);
  }

  /* Bad input: statuses, never crashes. */
  CHECK(qmoe_convert_f16_to_f32(NULL, halves, wide, 4) == QMOE_STATUS_INVALID_CONTEXT);
  CHECK(strlen(qmoe_last_error_message()) > 0);
  CHECK(qmoe_convert_f16_to_f32(context, NULL, wide, 4) == QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(qmoe_convert_f32_to_f16(context, floats, NULL, 4) == QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(qmoe_convert_f32_to_f16(context, NULL, NULL, 0) == QMOE_STATUS_OK);
  CHECK(qmoe_context_get_kernel_info(context, kernel_count, NULL) == QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(qmoe_gemm_kernel_available(context, QMOE_WEIGHT_FORMAT_INT4, 32, QMOE_ACCURACY_FAST, NULL,
                                   NULL) == QMOE_STATUS_INVALID_ARGUMENT);

  CHECK(qmoe_context_destroy(context) == QMOE_STATUS_OK);
  CHECK(qmoe_convert_f16_to_f32(context, halves, wide, 4) == QMOE_STATUS_INVALID_CONTEXT);
  CHECK(qmoe_context_destroy(NULL) == QMOE_STATUS_OK);

  if (failures == 0) printf("c_abi_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
