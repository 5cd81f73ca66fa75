#include "tests/cpu/tier_kernels.h"

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "lib/cpu/kernels.h"
#include "lib/cpu_features.h"
#include "lib/dispatch.h"
#include "qmoe/qmoe_experimental.h"

namespace qmoe::testing {
namespace {

// The rule, written out: each tier's own ISA and the extensions that may replace its kernels,
// by the feature the host must have. A new ISA in lib/cpu/isa_list.inc needs its line here
// (check_tier_kernels says so), so a tier cannot start taking another ISA's kernels unnoticed.
struct Extension {
  const char* isa;
  uint32_t feature;
};
struct TierRule {
  Isa tier;
  const char* own;
  std::vector<Extension> extensions;  // the first one the host has and that has the entry wins
};
const std::vector<TierRule>& tier_rules() {
  static const std::vector<TierRule> rules = {
      {Isa::kScalar, "scalar", {}},
      {Isa::kAvx2, "avx2", {{"avxvnni", QMOE_CPU_FEATURE_AVXVNNI}}},
      {Isa::kAvx512,
       "avx512",
       {{"avx512gfni", QMOE_CPU_FEATURE_AVX512VNNI | QMOE_CPU_FEATURE_GFNI},
        {"avx512vbmi", QMOE_CPU_FEATURE_AVX512VNNI | QMOE_CPU_FEATURE_AVX512VBMI},
        {"avx512vnni", QMOE_CPU_FEATURE_AVX512VNNI}}},
  };
  return rules;
}

// lib/cpu/kernel_list.inc expanded here: each row's ISA, table entry, name (by the naming rule
// of docs/dispatch.md, written out again) and the address of the function the row names.
struct ListedKernel {
  const char* isa;
  const char* operation;
  qmoe_weight_format format;
  qmoe_accuracy accuracy;
  const char* name;
  const void* fn;
};
// Function pointers as data pointers, only for comparison (GCC and Clang define the cast).
template <typename Fn>
const void* address_of(Fn* fn) {
  return reinterpret_cast<const void*>(fn);
}
const ListedKernel kListed[] = {
#define QMOE_CPU_KERNEL(isa, op)       \
  {#isa,                               \
   #op,                                \
   static_cast<qmoe_weight_format>(0), \
   static_cast<qmoe_accuracy>(0),      \
   "qmoe_" #op "__" #isa,              \
   address_of(&::qmoe::isa::op)},
#define QMOE_CPU_GEMM_KERNEL(isa, format, accuracy, tile)  \
  {#isa,                                                   \
   "gemm",                                                 \
   list_format::format,                                    \
   list_accuracy::accuracy,                                \
   "qmoe_gemm_" #format "_" #accuracy "_" #tile "__" #isa, \
   address_of(&::qmoe::isa::gemm_##format##_##accuracy##_##tile)},
#include "lib/cpu/kernel_list.inc"
#undef QMOE_CPU_GEMM_KERNEL
#undef QMOE_CPU_KERNEL
};

// The ISAs of lib/cpu/isa_list.inc, by name.
const char* const kListedIsas[] = {
#define QMOE_CPU_ISA(token, tier, feature) #token,
#include "lib/cpu/isa_list.inc"
#undef QMOE_CPU_ISA
};

// The formats of lib/formats/format_list.inc, by value and token.
struct ListedFormat {
  qmoe_weight_format value;
  const char* token;
};
const ListedFormat kListedFormats[] = {
#define QMOE_FORMAT(token, value, traits) {value, #token},
#include "lib/formats/format_list.inc"
#undef QMOE_FORMAT
};

const char* accuracy_token(qmoe_accuracy a) {
  return a == QMOE_ACCURACY_EXACT ? "exact" : "fast";
}

const ListedKernel* find_listed(const char* isa, const std::string& operation,
                                qmoe_weight_format format, qmoe_accuracy accuracy) {
  for (const ListedKernel& k : kListed) {
    if (std::strcmp(k.isa, isa) == 0 && operation == k.operation && k.format == format &&
        k.accuracy == accuracy) {
      return &k;
    }
  }
  return nullptr;
}

const TierRule* rule_for(Isa tier) {
  for (const TierRule& r : tier_rules()) {
    if (r.tier == tier) return &r;
  }
  return nullptr;
}

ExpectedKernel expect(Isa tier, const std::string& entry, const std::string& operation,
                      qmoe_weight_format format, qmoe_accuracy accuracy) {
  ExpectedKernel e{entry, operation, format, accuracy, "", nullptr};
  const TierRule* rule = rule_for(tier);
  if (rule == nullptr) return e;
  const uint32_t have = host_cpu_features().bits;
  const ListedKernel* k = nullptr;
  for (const Extension& x : rule->extensions) {
    if ((have & x.feature) == x.feature) k = find_listed(x.isa, operation, format, accuracy);
    if (k != nullptr) break;
  }
  if (k == nullptr) k = find_listed(rule->own, operation, format, accuracy);
  if (k != nullptr) {
    e.name = k->name;
    e.fn = k->fn;
  }
  return e;
}

std::vector<ExpectedKernel> compute_expected(Isa tier) {
  std::vector<ExpectedKernel> out;
  const auto none_format = static_cast<qmoe_weight_format>(0);
  const auto none_accuracy = static_cast<qmoe_accuracy>(0);
#define QMOE_EXPECT_ENTRY_(member, type) \
  out.push_back(expect(tier, #member, #member, none_format, none_accuracy));
  QMOE_CPU_OPS(QMOE_EXPECT_ENTRY_)
#undef QMOE_EXPECT_ENTRY_
  for (const ListedFormat& f : kListedFormats) {
    for (qmoe_accuracy a : {QMOE_ACCURACY_EXACT, QMOE_ACCURACY_FAST}) {
      out.push_back(expect(tier, std::string("gemm[") + f.token + "][" + accuracy_token(a) + "]",
                           "gemm", f.value, a));
    }
  }
  return out;
}

// The table's entry for an expected one: its name and function.
struct Held {
  const char* name;
  const void* fn;
};
Held held(const KernelTable& table, const ExpectedKernel& e) {
  if (e.operation == "gemm") {
    const auto& entry = gemm_kernel(table, e.format, e.accuracy);
    return {entry.name, address_of(entry.fn)};
  }
#define QMOE_HELD_ENTRY_(member, type) \
  if (e.operation == #member) return {table.member.name, address_of(table.member.fn)};
  QMOE_CPU_OPS(QMOE_HELD_ENTRY_)
#undef QMOE_HELD_ENTRY_
  return {nullptr, nullptr};
}

std::string or_none(const char* s) {
  return s != nullptr ? s : "(null)";
}

}  // namespace

const std::vector<ExpectedKernel>& expected_tier_kernels(Isa tier) {
  static std::mutex mutex;
  static std::map<Isa, std::vector<ExpectedKernel>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(tier);
  if (it == cache.end()) it = cache.emplace(tier, compute_expected(tier)).first;
  return it->second;
}

int check_tier_kernels(Isa tier, const KernelTable& table, const std::string& where) {
  int failures = 0;
  const TierRule* rule = rule_for(tier);
  if (rule == nullptr) {
    ADD_FAILURE() << where << ": tests/cpu/tier_kernels.cc has no rule for tier " << isa_name(tier);
    return 1;
  }
  for (const char* isa : kListedIsas) {
    bool known = false;
    for (const TierRule& r : tier_rules()) {
      known = known || std::strcmp(r.own, isa) == 0;
      for (const Extension& x : r.extensions) known = known || std::strcmp(x.isa, isa) == 0;
    }
    if (!known) {
      ++failures;
      ADD_FAILURE()
          << where << ": ISA " << isa << " of lib/cpu/isa_list.inc has no line in "
          << "tests/cpu/tier_kernels.cc's tier rules: which tier's kernels may it replace?";
    }
  }
  for (const ExpectedKernel& e : expected_tier_kernels(tier)) {
    const Held h = held(table, e);
    if (e.name.empty()) {
      ++failures;
      ADD_FAILURE() << where << ": tier " << isa_name(tier) << " entry " << e.entry
                    << ": the kernel list has no kernel of the tier's own ISA (" << rule->own
                    << ") for it; the table holds " << or_none(h.name);
      continue;
    }
    if (h.name == nullptr || e.name != h.name || e.fn != h.fn) {
      ++failures;
      ADD_FAILURE() << where << ": tier " << isa_name(tier) << " entry " << e.entry << " holds "
                    << or_none(h.name) << " at " << h.fn << ", expected " << e.name << " at "
                    << e.fn << " (not the tier's own kernel)";
    }
  }
  return failures;
}

int check_context_kernels(const qmoe_context* context, Isa tier, const std::string& where) {
  int failures = 0;
  qmoe_isa got = QMOE_ISA_DEFAULT;
  if (qmoe_context_get_isa(context, &got) != QMOE_STATUS_OK || got != static_cast<qmoe_isa>(tier)) {
    ADD_FAILURE() << where << ": context runs tier " << qmoe_isa_name(got) << ", asked for "
                  << isa_name(tier);
    return 1;
  }
  const std::vector<ExpectedKernel>& expected = expected_tier_kernels(tier);
  uint32_t count = 0;
  if (qmoe_context_get_kernel_count(context, &count) != QMOE_STATUS_OK ||
      count != expected.size()) {
    ADD_FAILURE() << where << ": context lists " << count << " kernels, expected "
                  << expected.size();
    return 1;
  }
  for (uint32_t i = 0; i < count; ++i) {
    qmoe_kernel_info info;
    std::memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    if (qmoe_context_get_kernel_info(context, i, &info) != QMOE_STATUS_OK) {
      ++failures;
      ADD_FAILURE() << where << ": qmoe_context_get_kernel_info(" << i
                    << ") failed: " << qmoe_last_error_message();
      continue;
    }
    const ExpectedKernel* e = nullptr;
    for (const ExpectedKernel& candidate : expected) {
      if (info.operation != nullptr && candidate.operation == info.operation &&
          candidate.format == info.format && candidate.accuracy == info.accuracy) {
        e = &candidate;
      }
    }
    if (e == nullptr || info.name == nullptr || e->name != info.name) {
      ++failures;
      ADD_FAILURE() << where << ": tier " << isa_name(tier) << " context lists "
                    << or_none(info.name) << " for " << or_none(info.operation) << ", expected "
                    << (e != nullptr ? e->name : std::string("no such entry"));
    }
  }
  return failures;
}

}  // namespace qmoe::testing
