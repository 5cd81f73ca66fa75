/* Outside consumer of an installed libqmoe: the five headers are installed, header and library
 * versions agree, and calls work. */
#include <qmoe/qmoe.h>
#include <qmoe/qmoe_cache.h>
#include <qmoe/qmoe_cuda.h>
#include <qmoe/qmoe_experimental.h>
#include <qmoe/qmoe_store.h>
#include <stdio.h>

int main(void) {
  qmoe_context* context = NULL;
  const uint16_t one_fp16 = 0x3C00;
  float out = 0.0f;
  if (qmoe_version_number() != QMOE_VERSION_NUMBER) {
    fprintf(stderr, "header %s but library %s\n", QMOE_VERSION_STRING, qmoe_version_string());
    return 1;
  }
  if (qmoe_context_create(NULL, &context) != QMOE_STATUS_OK ||
      qmoe_convert_f16_to_f32(context, &one_fp16, &out, 1) != QMOE_STATUS_OK || out != 1.0f) {
    fprintf(stderr, "call failed: %s\n", qmoe_last_error_message());
    return 1;
  }
  {
    uint32_t kernels = 0;
    int devices = 0;
    const qmoe_status cuda = qmoe_cuda_get_device_count(&devices);
    if (qmoe_context_get_kernel_count(context, &kernels) != QMOE_STATUS_OK || kernels == 0 ||
        (cuda != QMOE_STATUS_OK && cuda != QMOE_STATUS_CUDA_UNAVAILABLE &&
         cuda != QMOE_STATUS_CUDA_ERROR)) {
      fprintf(stderr, "call failed: %s\n", qmoe_last_error_message());
      return 1;
    }
  }
  {
    qmoe_expert_cache_desc desc;
    qmoe_expert_cache* cache = NULL;
    qmoe_expert_cache_desc_init(&desc);
    desc.num_layers = 1;
    desc.num_experts = 8;
    desc.num_slots = 2;
    if (qmoe_expert_cache_create(&desc, &cache) != QMOE_STATUS_OK ||
        qmoe_expert_cache_end_step(cache) != QMOE_STATUS_OK ||
        qmoe_expert_cache_destroy(cache) != QMOE_STATUS_OK) {
      fprintf(stderr, "call failed: %s\n", qmoe_last_error_message());
      return 1;
    }
  }
  {
    qmoe_expert_store* store = NULL;
    if (qmoe_expert_store_open("/nonexistent-qmoe-dir/model.qmoe", &store) !=
            QMOE_STATUS_IO_ERROR ||
        store != NULL) {
      fprintf(stderr, "qmoe_expert_store_open of a missing file did not fail as documented\n");
      return 1;
    }
  }
  qmoe_context_destroy(context);
  printf("libqmoe %s ok\n", qmoe_version_string());
  return 0;
}
