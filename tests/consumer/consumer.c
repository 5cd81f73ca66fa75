/* Outside consumer of an installed libqmoe: header/library versions agree and a call works. */
#include <qmoe/qmoe.h>
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
  qmoe_context_destroy(context);
  printf("libqmoe %s ok\n", qmoe_version_string());
  return 0;
}
