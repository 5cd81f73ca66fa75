// Tier identity: which kernel each entry of a tier's assembled table must be, by a rule written
// here rather than computed by the library's dispatch. An AVX-512 table quietly assembled from
// AVX2 kernels passes every numeric test (the AVX2 kernels are correct), so the tier's tests
// must check whose kernels they ran. IsaTest (tests/cpu/isa_test_util.h) checks its tier's
// table once per TEST_P, and make_context checks every context a test makes through the ABI.
#ifndef QMOE_TESTS_CPU_TIER_KERNELS_H_
#define QMOE_TESTS_CPU_TIER_KERNELS_H_

#include <string>
#include <vector>

#include "lib/cpu/kernel_table.h"
#include "qmoe/qmoe.h"

namespace qmoe::testing {

/// One entry of a tier's table and the kernel it must hold.
struct ExpectedKernel {
  std::string entry;          // "convert_f16_to_f32", "gemm[int4][fast]"
  std::string operation;      // "convert_f16_to_f32", "gemm"
  qmoe_weight_format format;  // GEMMs: their format; 0 otherwise
  qmoe_accuracy accuracy;     // GEMMs: their level; 0 otherwise
  std::string name;           // "qmoe_gemm_int4_fast_8x32__avx512vnni"; "" when the rule finds none
  const void* fn;             // the function that name belongs to; nullptr when none
};

/// The rule: an entry of `tier`'s table holds the kernel of the tier's extension ISA where the
/// host has the extension's feature and the extension provides the entry, else the kernel of
/// the tier's own ISA. Names and addresses come from this file's own expansion of
/// lib/cpu/kernel_list.inc (the naming rule "qmoe_<op>__<isa>" is written out here too), not
/// from lib/cpu/kernel_tables.cc. Computed once per tier.
const std::vector<ExpectedKernel>& expected_tier_kernels(Isa tier);

/// Adds a failure for every entry of `table` whose name or function is not the rule's, and for
/// an ISA of lib/cpu/isa_list.inc the rule does not know; `where` prefixes the messages.
/// Returns the number of failures.
int check_tier_kernels(Isa tier, const KernelTable& table, const std::string& where);

/// The same through the C ABI: the context's tier is `tier`, and its kernel listing
/// (qmoe_context_get_kernel_count / _info) names exactly the rule's kernels.
int check_context_kernels(const qmoe_context* context, Isa tier, const std::string& where);

}  // namespace qmoe::testing

#endif  // QMOE_TESTS_CPU_TIER_KERNELS_H_
