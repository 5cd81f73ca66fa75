// `qmoe run`'s memory limit (tools/qmoe/memory_limit.h) on hand-built cgroup trees in a
// temporary directory: v2 and v1 files, limits on ancestors, "no limit" spellings, and the
// /proc/self/cgroup text as a container or a systemd slice shows it.
#include "tools/qmoe/memory_limit.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

namespace fs = std::filesystem;

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "qmoe_cgroup_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  // Writes `text` to root/relative, creating its directories.
  void put(const std::string& relative, const std::string& text) {
    const fs::path path = fs::path(root_) / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  double limit(const std::string& proc_self_cgroup) const {
    return cgroup_memory_limit_bytes(proc_self_cgroup, root_);
  }

  std::string root_;
};

TEST_F(CgroupTree, V2LimitOfTheProcessGroup) {
  put("memory.max", "max\n");
  put("user.slice/memory.max", "max\n");
  put("user.slice/job.scope/memory.max", "17179869184\n");
  EXPECT_EQ(limit("0::/user.slice/job.scope\n"), 17179869184.0);
}

TEST_F(CgroupTree, V2SmallestLimitOnThePathWins) {
  put("a/memory.max", "1000000\n");
  put("a/b/memory.max", "max\n");
  put("a/b/c/memory.max", "5000000\n");
  EXPECT_EQ(limit("0::/a/b/c"), 1000000.0);
  EXPECT_EQ(limit("0::/a/b/c/"), 1000000.0);
}

TEST_F(CgroupTree, V2ContainerSeesItsOwnRoot) {
  put("memory.max", "8589934592\n");
  EXPECT_EQ(limit("0::/\n"), 8589934592.0);
}

TEST_F(CgroupTree, V1MemoryControllerAmongOthers) {
  put("memory/docker/abc/memory.limit_in_bytes", "2147483648\n");
  put("memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  EXPECT_EQ(limit("12:pids:/docker/abc\n4:cpuacct,memory:/docker/abc\n1:name=systemd:/\n"),
            2147483648.0);
}

TEST_F(CgroupTree, NoLimitAnywhereIsInfinite) {
  put("memory.max", "max\n");
  put("memory/memory.limit_in_bytes", "9223372036854771712\n");
  EXPECT_TRUE(std::isinf(limit("0::/\n4:memory:/\n")));
  // Files missing, unreadable text, a path that does not exist, no memory controller.
  EXPECT_TRUE(std::isinf(limit("0::/nowhere/at/all\n")));
  EXPECT_TRUE(std::isinf(limit("3:cpu:/x\n")));
  EXPECT_TRUE(std::isinf(limit("")));
  put("odd/memory.max", "lots\n");
  EXPECT_TRUE(std::isinf(limit("0::/odd")));
}

TEST(UsableMemory, AtMostPhysicalMemoryAndTheCgroupLimit) {
  const double usable = usable_memory_bytes();
  EXPECT_GT(usable, 0.0);
  EXPECT_TRUE(std::isfinite(usable));
  const double physical =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  EXPECT_LE(usable, physical);
  std::ifstream file("/proc/self/cgroup");
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_LE(usable, cgroup_memory_limit_bytes(text.str(), "/sys/fs/cgroup"));
}

}  // namespace
