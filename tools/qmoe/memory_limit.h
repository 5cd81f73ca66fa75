// How much memory `qmoe run` may fill with weights: physical memory, or less where a cgroup
// (a container, a systemd slice) limits the process. Without the cgroup limit a run that fits
// the host but not the container is killed by the OOM killer halfway through generating its
// weights instead of being refused up front with the number of layers that fit.
#ifndef QMOE_TOOLS_QMOE_MEMORY_LIMIT_H_
#define QMOE_TOOLS_QMOE_MEMORY_LIMIT_H_

#include <string>

// The smallest memory limit on the cgroup path named in `proc_self_cgroup` (the text of
// /proc/self/cgroup) and on each of its ancestors, read under `cgroup_root` (/sys/fs/cgroup):
// cgroup v2 `memory.max` ("max": none), cgroup v1 `memory/.../memory.limit_in_bytes` (values
// of 2^62 and above: none). Infinity where no level sets a limit or nothing can be read.
double cgroup_memory_limit_bytes(const std::string& proc_self_cgroup,
                                 const std::string& cgroup_root);

// Physical memory, capped by this process's cgroup limit; 0 if neither is known.
double usable_memory_bytes();

#endif  // QMOE_TOOLS_QMOE_MEMORY_LIMIT_H_
