// qmoe_alloc_weight_memory / qmoe_free_weight_memory: statuses, alignment, the whole range
// writable (ASan checks the bounds), and on Linux the huge-page advice on the mapping itself.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "qmoe/qmoe.h"

namespace {

constexpr size_t kHuge = size_t{2} << 20;

TEST(WeightMemory, BadArgumentsGetAStatusAndLeaveTheOutPointer) {
  void* memory = &memory;
  EXPECT_EQ(qmoe_alloc_weight_memory(0, &memory), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_NE(std::string(qmoe_last_error_message()).find("bytes is 0"), std::string::npos);
  EXPECT_EQ(memory, &memory);
  EXPECT_EQ(qmoe_alloc_weight_memory(64, nullptr), QMOE_STATUS_INVALID_ARGUMENT);
  EXPECT_EQ(qmoe_alloc_weight_memory(SIZE_MAX, &memory), QMOE_STATUS_OUT_OF_MEMORY);
  EXPECT_EQ(qmoe_alloc_weight_memory(SIZE_MAX - 4096, &memory), QMOE_STATUS_OUT_OF_MEMORY);
  EXPECT_EQ(memory, &memory);
  qmoe_free_weight_memory(nullptr);  // a no-op
}

TEST(WeightMemory, AlignedAndWritableOverTheWholeRange) {
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{4095}, size_t{4096}, kHuge - 1, kHuge,
                       kHuge + 1, 5 * kHuge + 12345}) {
    SCOPED_TRACE(bytes);
    void* memory = nullptr;
    ASSERT_EQ(qmoe_alloc_weight_memory(bytes, &memory), QMOE_STATUS_OK);
    ASSERT_NE(memory, nullptr);
    const auto address = reinterpret_cast<uintptr_t>(memory);
    EXPECT_EQ(address % 4096, 0u);
    if (bytes >= kHuge) {
      EXPECT_EQ(address % kHuge, 0u);
    }
    std::memset(memory, 0xA5, bytes);
    EXPECT_EQ(static_cast<unsigned char*>(memory)[bytes - 1], 0xA5);
    qmoe_free_weight_memory(memory);
  }
}

// The VmFlags line of the /proc/self/smaps mapping that holds `address`, "" when not found.
std::string vm_flags_of(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto target = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > 20) {
      inside = lo <= target && target < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(WeightMemory, LargeAllocationsAreAdvisedForHugePages) {
#if defined(__linux__)
  std::ifstream mode_file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string mode;
  std::getline(mode_file, mode);
  if (mode.empty() || mode.find("[never]") != std::string::npos) {
    GTEST_SKIP() << "transparent huge pages are off on this host (\"" << mode << "\")";
  }
  void* memory = nullptr;
  ASSERT_EQ(qmoe_alloc_weight_memory(3 * kHuge, &memory), QMOE_STATUS_OK);
  std::memset(memory, 1, 3 * kHuge);
  const std::string flags = vm_flags_of(memory);
  // "hg": the mapping carries MADV_HUGEPAGE (whether a huge page was free is up to the OS).
  EXPECT_NE(flags.find(" hg"), std::string::npos) << "VmFlags: \"" << flags << "\"";
  qmoe_free_weight_memory(memory);
#else
  GTEST_SKIP() << "huge-page advice is Linux only";
#endif
}

}  // namespace
