// How much host memory this process can still expect (host_memory.h).
#include "internal/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace loom::internal {
namespace {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return text.str();
}

std::optional<size_t> ParseBytes(absl::string_view text) {
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value)) return std::nullopt;
  return static_cast<size_t>(value);
}

// What follows `key` on the line of `text` whose first word is `key` (the
// "key value" lines of /proc/meminfo and memory.stat), spaces stripped;
// null where no line has it.
std::optional<absl::string_view> ValueOf(absl::string_view text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const std::pair<absl::string_view, absl::string_view> field =
        absl::StrSplit(line, absl::MaxSplits(absl::ByAnyChar(" \t"), 1));
    if (field.first == key) return absl::StripAsciiWhitespace(field.second);
  }
  return std::nullopt;
}

// /proc/meminfo's "MemAvailable:   123 kB" line, in bytes.
std::optional<size_t> MemAvailableBytes(absl::string_view meminfo) {
  const std::optional<absl::string_view> rest = ValueOf(meminfo, "MemAvailable:");
  constexpr absl::string_view kUnit = "kB";
  if (!rest || !absl::EndsWith(*rest, kUnit)) return std::nullopt;
  const std::optional<size_t> kib = ParseBytes(rest->substr(0, rest->size() - kUnit.size()));
  size_t bytes = 0;
  if (!kib || __builtin_mul_overflow(*kib, size_t{1024}, &bytes)) return std::nullopt;
  return bytes;
}

// The bytes of `key` in a memory.stat text; 0 where it is absent or does
// not parse.
size_t StatBytes(absl::string_view stat, absl::string_view key) {
  const std::optional<absl::string_view> value = ValueOf(stat, key);
  return value ? ParseBytes(*value).value_or(0) : 0;
}

// The page cache a cgroup's use counts that the kernel reclaims before it
// would kill: its file-backed LRU pages (v1's hierarchical total_ lines
// where present, else the cgroup's own).
size_t ReclaimableFileBytes(absl::string_view stat) {
  size_t bytes = 0;
  for (absl::string_view key : {"active_file", "inactive_file"}) {
    const size_t total = StatBytes(stat, absl::StrCat("total_", key));
    const size_t own = total > 0 ? total : StatBytes(stat, key);
    if (__builtin_add_overflow(bytes, own, &bytes)) return 0;
  }
  return bytes;
}

// A cgroup's limit less its use (its reclaimable page cache not counted);
// null where the limit or use is missing or does not parse, as v2's "max"
// (no limit) does not.
std::optional<size_t> CgroupRoom(const CgroupMemoryFiles& files) {
  if (!files.limit || !files.usage) return std::nullopt;
  const std::optional<size_t> limit = ParseBytes(*files.limit);
  std::optional<size_t> usage = ParseBytes(*files.usage);
  if (!limit || !usage) return std::nullopt;
  if (files.stat) *usage -= std::min(*usage, ReclaimableFileBytes(*files.stat));
  return *limit > *usage ? *limit - *usage : 0;
}

void TakeSmaller(std::optional<HostMemoryBudget>& budget, std::optional<size_t> bytes, std::string source) {
  if (!bytes || (budget && budget->bytes <= *bytes)) return;
  budget = HostMemoryBudget{*bytes, std::move(source)};
}

}  // namespace

std::optional<HostMemoryBudget> HostMemoryBudgetOf(const HostMemoryFacts& facts) {
  std::optional<HostMemoryBudget> budget;
  TakeSmaller(budget, facts.physical, "the host's physical memory");
  if (facts.meminfo) TakeSmaller(budget, MemAvailableBytes(*facts.meminfo), "MemAvailable in /proc/meminfo");
  for (const CgroupMemoryFiles& cgroup : facts.cgroups) {
    TakeSmaller(budget, CgroupRoom(cgroup), absl::StrCat("the room left under ", cgroup.limit_path));
  }
  return budget;
}

HostMemoryFacts ReadHostMemoryFacts() {
  HostMemoryFacts facts;
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  size_t physical = 0;
  if (pages > 0 && page_bytes > 0 &&
      !__builtin_mul_overflow(static_cast<size_t>(pages), static_cast<size_t>(page_bytes), &physical)) {
    facts.physical = physical;
  }
  facts.meminfo = ReadFile("/proc/meminfo");
  const std::string v1 = "/sys/fs/cgroup/memory/";
  facts.cgroups.push_back({v1 + "memory.limit_in_bytes", ReadFile(v1 + "memory.limit_in_bytes"),
                           ReadFile(v1 + "memory.usage_in_bytes"), ReadFile(v1 + "memory.stat")});
  // cgroup v2: the line "0::<path>".
  const std::optional<std::string> self = ReadFile("/proc/self/cgroup");
  if (!self) return facts;
  for (absl::string_view line : absl::StrSplit(*self, '\n')) {
    if (line.substr(0, 3) != "0::") continue;
    std::string path(absl::StripAsciiWhitespace(line.substr(3)));
    if (path.empty() || path[0] != '/' || path.find("..") != std::string::npos) break;
    while (true) {  // the cgroup, then each ancestor up to the root
      const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
      facts.cgroups.push_back({dir + "/memory.max", ReadFile(dir + "/memory.max"), ReadFile(dir + "/memory.current"),
                               ReadFile(dir + "/memory.stat")});
      if (path == "/") break;
      const size_t slash = path.rfind('/');
      path = slash == 0 ? "/" : path.substr(0, slash);
    }
    break;
  }
  return facts;
}

}  // namespace loom::internal
