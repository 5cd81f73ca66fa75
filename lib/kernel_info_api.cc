// Which kernels a context runs: the stable availability query (qmoe.h) and the experimental
// kernel introspection (qmoe_experimental.h).
#include "lib/abi_enum.h"
#include "lib/context.h"
#include "lib/dispatch.h"
#include "lib/error.h"
#include "lib/formats/format_traits.h"
#include "lib/struct_size.h"
#include "qmoe/qmoe_experimental.h"

namespace qmoe {
namespace {

// The table's entries in the order qmoe_context_get_kernel_info numbers them: the operations of
// QMOE_CPU_OPS, then per format (format_list.inc order) its exact and fast GEMMs.
struct KernelListing {
  const char* operation;
  qmoe_weight_format format;
  qmoe_accuracy accuracy;
  const char* name;
};

constexpr uint32_t kOperationCount = 0
#define QMOE_COUNT_(member, type) +1
    QMOE_CPU_OPS(QMOE_COUNT_)
#undef QMOE_COUNT_
    ;

uint32_t kernel_count() {
  return kOperationCount + format_count() * kAccuracySlots;
}

KernelListing kernel_at(const KernelTable& table, uint32_t index) {
  uint32_t i = 0;
#define QMOE_LISTING_(member, type)                                                     \
  if (index == i++)                                                                     \
    return {#member, static_cast<qmoe_weight_format>(0), static_cast<qmoe_accuracy>(0), \
            table.member.name};
  QMOE_CPU_OPS(QMOE_LISTING_)
#undef QMOE_LISTING_
  const uint32_t g = index - kOperationCount;
  const FormatTraits& format = format_at(g / kAccuracySlots);
  const auto accuracy = static_cast<qmoe_accuracy>(QMOE_ACCURACY_EXACT + g % kAccuracySlots);
  return {"gemm", format.format, accuracy, gemm_kernel(table, format.format, accuracy).name};
}

}  // namespace
}  // namespace qmoe

extern "C" {

QMOE_API qmoe_status qmoe_gemm_kernel_available(const qmoe_context* context,
                                                qmoe_weight_format format, uint32_t block_size,
                                                qmoe_accuracy accuracy, int* available,
                                                const char** kernel_name) {
  using namespace qmoe;
  QMOE_RESOLVE_CONTEXT(ctx, context);
  if (available == nullptr) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "available out-pointer is NULL");
  }
  const int32_t level = enum_bits(accuracy);
  if (level != QMOE_ACCURACY_EXACT && level != QMOE_ACCURACY_FAST) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "accuracy %d is not a qmoe_accuracy", level);
  }
  const FormatTraits* traits = find_format(enum_bits(format));
  const char* name = nullptr;
  if (traits != nullptr && format_accepts_block_size(*traits, block_size)) {
    name = gemm_kernel(ctx->kernels(), traits->format, accuracy).name;
  }
  *available = name != nullptr;
  if (kernel_name != nullptr) *kernel_name = name;
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_context_get_kernel_count(const qmoe_context* context, uint32_t* count) {
  QMOE_RESOLVE_CONTEXT(ctx, context);
  if (count == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "count out-pointer is NULL");
  *count = qmoe::kernel_count();
  return QMOE_STATUS_OK;
}

QMOE_API qmoe_status qmoe_context_get_kernel_info(const qmoe_context* context, uint32_t index,
                                                  qmoe_kernel_info* info) {
  using namespace qmoe;
  QMOE_RESOLVE_CONTEXT(ctx, context);
  if (info == nullptr) QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "info is NULL");
  if (!struct_size_ok(info->struct_size, sizeof(qmoe_kernel_info))) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT,
              "info->struct_size is %zu, not the size of any version of the struct; set it to "
              "sizeof(qmoe_kernel_info) (%zu)",
              info->struct_size, sizeof(qmoe_kernel_info));
  }
  if (index >= kernel_count()) {
    QMOE_FAIL(QMOE_STATUS_INVALID_ARGUMENT, "index %u is not below the kernel count %u", index,
              kernel_count());
  }
  const KernelListing k = kernel_at(ctx->kernels(), index);
  info->operation = k.operation;
  info->format = k.format;
  info->accuracy = k.accuracy;
  info->name = k.name;
  return QMOE_STATUS_OK;
}

}  // extern "C"
