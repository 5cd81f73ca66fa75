/* The public header as strict C99 (-std=c99 -pedantic -Werror), and the ABI called from C:
 * versions, statuses, contexts, conversions and their bad-input statuses. */
#include <math.h>
#include <qmoe/qmoe.h>
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
  uint32_t slot;

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
  for (slot = 0; slot < qmoe_kernel_slot_count(); ++slot) {
    CHECK(qmoe_context_get_kernel_name(context, (qmoe_kernel_slot)slot, &name) == QMOE_STATUS_OK);
    CHECK(name != NULL && strncmp(name, "qmoe_", 5) == 0);
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

  /* Bad input: statuses, never crashes. */
  CHECK(qmoe_convert_f16_to_f32(NULL, halves, wide, 4) == QMOE_STATUS_INVALID_CONTEXT);
  CHECK(strlen(qmoe_last_error_message()) > 0);
  CHECK(qmoe_convert_f16_to_f32(context, NULL, wide, 4) == QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(qmoe_convert_f32_to_f16(context, floats, NULL, 4) == QMOE_STATUS_INVALID_ARGUMENT);
  CHECK(qmoe_convert_f32_to_f16(context, NULL, NULL, 0) == QMOE_STATUS_OK);
  CHECK(qmoe_context_get_kernel_name(context, (qmoe_kernel_slot)9999, &name) ==
        QMOE_STATUS_INVALID_ARGUMENT);

  CHECK(qmoe_context_destroy(context) == QMOE_STATUS_OK);
  CHECK(qmoe_convert_f16_to_f32(context, halves, wide, 4) == QMOE_STATUS_INVALID_CONTEXT);
  CHECK(qmoe_context_destroy(NULL) == QMOE_STATUS_OK);

  if (failures == 0) printf("c_abi_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
