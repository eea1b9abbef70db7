// host_memory.h (internal): how many bytes of host memory this process can
// still expect to be given, for RunReference's guard against state that the
// OOM killer, not a Status, would answer.
#ifndef LOOM_RUNTIME_INTERNAL_HOST_MEMORY_H_
#define LOOM_RUNTIME_INTERNAL_HOST_MEMORY_H_

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace loom::internal {

// A cgroup's memory limit and use, as read: cgroup v2's memory.max ("max"
// or bytes), memory.current and memory.stat, or v1's memory.limit_in_bytes,
// memory.usage_in_bytes and memory.stat.
struct CgroupMemoryFiles {
  std::string limit_path;  // for messages
  std::optional<std::string> limit;
  std::optional<std::string> usage;
  std::optional<std::string> stat;  // its file-cache lines count as room (the kernel reclaims them)
};

// What the host says about its memory; each part absent where it cannot be
// read.
struct HostMemoryFacts {
  std::optional<size_t> physical;          // sysconf: physical pages x page size
  std::optional<std::string> meminfo;      // /proc/meminfo's text
  std::vector<CgroupMemoryFiles> cgroups;  // v1 controller's mount; v2: the cgroup, then each ancestor
};

struct HostMemoryBudget {
  size_t bytes = 0;
  std::string source;  // which figure bounds it, e.g. "MemAvailable in /proc/meminfo"
};

// The smallest of: the physical memory; MemAvailable (Linux's estimate of
// what can be allocated without swapping, reclaimable page cache included);
// and, for each cgroup with a limit, the limit less its current use, the
// page cache the kernel would reclaim first not counted as use (memory.stat's
// active_file and inactive_file; v1's total_ ones). Null
// where no part gives a figure; a part whose text does not parse is left
// out.
std::optional<HostMemoryBudget> HostMemoryBudgetOf(const HostMemoryFacts& facts);

// This process's facts: sysconf, /proc/meminfo, the cgroup v2 files from
// /proc/self/cgroup's path under /sys/fs/cgroup up to its root, and the
// cgroup v1 memory controller's files at its mount (/sys/fs/cgroup/memory,
// a container's own cgroup).
HostMemoryFacts ReadHostMemoryFacts();

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_HOST_MEMORY_H_
