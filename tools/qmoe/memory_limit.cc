#include "memory_limit.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace {

constexpr double kUnlimited = std::numeric_limits<double>::infinity();

// The first line of `path` as a limit in bytes: a decimal count, or infinity for "max", for
// v1's "no limit" values (2^62 and above, page-rounded LONG_MAX) and for anything unreadable.
double read_limit(const std::string& path) {
  std::ifstream file(path);
  std::string text;
  if (!file || !std::getline(file, text) || text.empty() || text == "max") return kUnlimited;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str() || value >= (1ull << 62)) return kUnlimited;
  return static_cast<double>(value);
}

// The smallest limit in `file` of directory root + path and of each of its ancestors up to
// root itself ("/a/b": root/a/b, root/a, root).
double smallest_on_path(const std::string& root, std::string path, const std::string& file) {
  double limit = kUnlimited;
  while (true) {
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    const std::string dir = path == "/" || path.empty() ? root : root + path;
    limit = std::min(limit, read_limit(dir + "/" + file));
    const size_t slash = path.rfind('/');
    if (path.empty() || path == "/" || slash == std::string::npos) break;
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return limit;
}

}  // namespace

double cgroup_memory_limit_bytes(const std::string& proc_self_cgroup,
                                 const std::string& cgroup_root) {
  double limit = kUnlimited;
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  // Lines are "hierarchy-id:controllers:path"; v2 is "0::path", v1 names "memory" among its
  // comma-separated controllers.
  while (std::getline(lines, line)) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      limit = std::min(limit, smallest_on_path(cgroup_root, path, "memory.max"));
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      limit =
          std::min(limit, smallest_on_path(cgroup_root + "/memory", path, "memory.limit_in_bytes"));
    }
  }
  return limit;
}

double usable_memory_bytes() {
  const double physical =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  std::ifstream file("/proc/self/cgroup");
  std::stringstream text;
  text << file.rdbuf();
  const double cgroup = cgroup_memory_limit_bytes(text.str(), "/sys/fs/cgroup");
  if (physical <= 0) return std::isfinite(cgroup) ? cgroup : 0.0;
  return std::min(physical, cgroup);
}
