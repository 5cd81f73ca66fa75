/* qmoe_gemm_latency: the distribution of one qmoe_gemm call's time on warm weights.
 *
 * Why beside qmoe_bench: on shared hosts the clock a thread gets moves by 2x within seconds,
 * so a median of a few hundred calls compares two builds poorly. For a compute-bound call
 * (weights in cache) the fastest of thousands of calls is the figure least touched by other
 * tenants; this prints it with the 10th percentile and the median, and is what the per-call
 * overhead figures in docs/results (the int4-gemm-limits files) were measured with.
 * Run two builds alternately (LD_LIBRARY_PATH) to compare them. It uses only the public C ABI
 * (C99), like any adopting runtime would.
 *
 *   qmoe_gemm_latency [--n N] [--k K] [--m M] [--accuracy fast|exact] [--threads T]
 *                     [--isa scalar|avx2|avx512] [--calls C] [--activations f32|f16|bf16]
 *
 * --activations f16 or bf16 gives X and Y in that type (qmoe_gemm_typed), to see what the
 * conversions add to a call.
 *
 * Weights: N x K INT4 codes from a fixed pattern, block 32, FP16 scales in the grouped order
 * (docs/formats.md), no zero points, no bias: the form `qmoe run` uses.
 */
#include <qmoe/qmoe.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int compare_doubles(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static int usage(const char* why) {
  fprintf(stderr,
          "qmoe_gemm_latency: %s\n"
          "usage: qmoe_gemm_latency [--n N] [--k K] [--m M] [--accuracy fast|exact]\n"
          "                         [--threads T] [--isa scalar|avx2|avx512] [--calls C]\n"
          "                         [--activations f32|f16|bf16]\n",
          why);
  return 2;
}

static int parse_u32(const char* text, unsigned long max, uint32_t* out) {
  char* end = NULL;
  const unsigned long v = strtoul(text, &end, 10);
  if (end == text || *end != '\0' || v > max) return 0;
  *out = (uint32_t)v;
  return 1;
}

/* values[j] for the names[j] that equals text; 0 when none does. */
static int parse_choice(const char* text, const char* const* names, const int* values, int count,
                        int* out) {
  for (int j = 0; j < count; ++j) {
    if (strcmp(text, names[j]) == 0) {
      *out = values[j];
      return 1;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  uint32_t n = 1536, k = 2048, m = 1, threads = 1, calls = 3000;
  qmoe_accuracy accuracy = QMOE_ACCURACY_FAST;
  qmoe_isa isa = QMOE_ISA_DEFAULT;
  qmoe_dtype activations = QMOE_DTYPE_F32;
  for (int i = 1; i < argc; ++i) {
    const char* flag = argv[i];
    if (i + 1 >= argc) return usage("every option takes a value");
    const char* value = argv[++i];
    int ok = 1;
    if (strcmp(flag, "--n") == 0) {
      ok = parse_u32(value, 1u << 20, &n) && n > 0;
    } else if (strcmp(flag, "--k") == 0) {
      ok = parse_u32(value, 1u << 20, &k) && k > 0 && k % 32 == 0;
    } else if (strcmp(flag, "--m") == 0) {
      ok = parse_u32(value, 1024, &m) && m > 0;
    } else if (strcmp(flag, "--threads") == 0) {
      ok = parse_u32(value, 4096, &threads);
    } else if (strcmp(flag, "--calls") == 0) {
      ok = parse_u32(value, 10000000, &calls) && calls > 0;
    } else if (strcmp(flag, "--accuracy") == 0) {
      static const char* const names[] = {"fast", "exact"};
      static const int values[] = {QMOE_ACCURACY_FAST, QMOE_ACCURACY_EXACT};
      int choice = 0;
      ok = parse_choice(value, names, values, 2, &choice);
      if (ok) accuracy = (qmoe_accuracy)choice;
    } else if (strcmp(flag, "--isa") == 0) {
      static const char* const names[] = {"scalar", "avx2", "avx512"};
      static const int values[] = {QMOE_ISA_SCALAR, QMOE_ISA_AVX2, QMOE_ISA_AVX512};
      int choice = 0;
      ok = parse_choice(value, names, values, 3, &choice);
      if (ok) isa = (qmoe_isa)choice;
    } else if (strcmp(flag, "--activations") == 0) {
      static const char* const names[] = {"f32", "f16", "bf16"};
      static const int values[] = {QMOE_DTYPE_F32, QMOE_DTYPE_F16, QMOE_DTYPE_BF16};
      int choice = 0;
      ok = parse_choice(value, names, values, 3, &choice);
      if (ok) activations = (qmoe_dtype)choice;
    } else {
      return usage("unknown option");
    }
    if (!ok) return usage("bad value (k must be a multiple of 32; n, m, calls >= 1)");
  }

  qmoe_context_options options;
  qmoe_context_options_init(&options);
  options.max_isa = isa;
  options.num_threads = threads;
  qmoe_context* context = NULL;
  if (qmoe_context_create(&options, &context) != QMOE_STATUS_OK) {
    fprintf(stderr, "qmoe_gemm_latency: %s\n", qmoe_last_error_message());
    return 1;
  }

  const uint32_t blocks = k / 32;
  size_t code_bytes = 0;
  qmoe_quant_matrix_codes_size(QMOE_WEIGHT_FORMAT_INT4, n, k, &code_bytes);
  const size_t scale_count = qmoe_grouped_plane_elements(n, blocks);
  uint8_t* codes = malloc(code_bytes);
  uint16_t* scales = malloc(scale_count * sizeof(uint16_t));
  float* x = malloc(sizeof(float) * m * k);
  float* y = malloc(sizeof(float) * m * n);
  uint16_t* x16 = malloc(sizeof(uint16_t) * m * k);
  uint16_t* y16 = malloc(sizeof(uint16_t) * m * n);
  double* times = malloc(sizeof(double) * calls);
  if (codes == NULL || scales == NULL || x == NULL || y == NULL || x16 == NULL || y16 == NULL ||
      times == NULL) {
    fprintf(stderr, "qmoe_gemm_latency: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < code_bytes; ++i) codes[i] = (uint8_t)((i * 2654435761u) >> 13);
  for (size_t i = 0; i < scale_count; ++i) scales[i] = (uint16_t)(0x2000 + i % 97); /* ~0.008 */
  for (size_t i = 0; i < (size_t)m * k; ++i) x[i] = (float)((int)(i * 7919 % 201) - 100) / 37.0f;
  if (activations == QMOE_DTYPE_F16) qmoe_convert_f32_to_f16(context, x, x16, (size_t)m * k);
  if (activations == QMOE_DTYPE_BF16) qmoe_convert_f32_to_bf16(context, x, x16, (size_t)m * k);

  qmoe_quant_matrix w;
  memset(&w, 0, sizeof w);
  w.struct_size = sizeof w;
  w.format = QMOE_WEIGHT_FORMAT_INT4;
  w.n = n;
  w.k = k;
  w.block_size = 32;
  w.codes = codes;
  w.scale_dtype = QMOE_DTYPE_F16;
  w.scales = scales;
  w.scale_row_stride = 1; /* grouped order: (1, 8, 8 * K/32) */
  w.scale_block_stride = 8;
  w.scale_group_stride = (size_t)8 * blocks;

  for (uint32_t i = 0; i < calls; ++i) {
    const double start = now_us();
    const qmoe_status status = activations == QMOE_DTYPE_F32
                                   ? qmoe_gemm(context, &w, accuracy, m, x, k, y, n, 0, n)
                                   : qmoe_gemm_typed(context, &w, accuracy, m, activations, x16, k,
                                                     activations, y16, n, 0, n);
    if (status != QMOE_STATUS_OK) {
      fprintf(stderr, "qmoe_gemm_latency: %s\n", qmoe_last_error_message());
      return 1;
    }
    times[i] = now_us() - start;
  }
  qsort(times, calls, sizeof(double), compare_doubles);

  qmoe_isa tier = QMOE_ISA_DEFAULT;
  uint32_t context_threads = 0;
  qmoe_context_get_isa(context, &tier);
  qmoe_context_get_num_threads(context, &context_threads);
  const double best = times[0], p10 = times[calls / 10], median = times[calls / 2];
  printf(
      "n %u k %u m %u %s %s%s threads %u calls %u: best %.1f us, p10 %.1f us, median %.1f us"
      " (%.2f GB/s of codes at best)\n",
      n, k, m, accuracy == QMOE_ACCURACY_FAST ? "fast" : "exact", qmoe_isa_name(tier),
      activations == QMOE_DTYPE_F32   ? ""
      : activations == QMOE_DTYPE_F16 ? " f16"
                                      : " bf16",
      context_threads, calls, best, p10, median, (double)code_bytes / best / 1e3);

  free(times);
  free(y16);
  free(x16);
  free(y);
  free(x);
  free(scales);
  free(codes);
  qmoe_context_destroy(context);
  return 0;
}
