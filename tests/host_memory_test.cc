// The host-memory budget RunReference checks its state against
// (runtime/internal/host_memory.h): which figure bounds it, and what is left
// out when a file is missing or does not parse.
#include "internal/host_memory.h"

#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace loom::internal {
namespace {

constexpr size_t kGiB = size_t{1} << 30;

std::string MemInfo(const std::string& available_line) {
  return "MemTotal:       263842140 kB\nMemFree:         1000000 kB\n" + available_line +
         "\nBuffers:          123456 kB\n";
}

// Whether `facts` give a budget of `bytes`, bounded by `source`.
::testing::AssertionResult BudgetIs(const HostMemoryFacts& facts, size_t bytes, const std::string& source) {
  const std::optional<HostMemoryBudget> budget = HostMemoryBudgetOf(facts);
  if (!budget) return ::testing::AssertionFailure() << "no budget";
  if (budget->bytes != bytes || budget->source != source) {
    return ::testing::AssertionFailure() << "budget " << budget->bytes << " bytes from " << budget->source;
  }
  return ::testing::AssertionSuccess();
}

TEST(HostMemoryBudgetTest, NothingKnownGivesNoBudget) {
  EXPECT_FALSE(HostMemoryBudgetOf(HostMemoryFacts{}).has_value());
}

TEST(HostMemoryBudgetTest, PhysicalMemoryAloneBoundsIt) {
  HostMemoryFacts facts;
  facts.physical = 64 * kGiB;
  EXPECT_TRUE(BudgetIs(facts, 64 * kGiB, "the host's physical memory"));
}

TEST(HostMemoryBudgetTest, AvailableMemoryBelowPhysicalBoundsIt) {
  HostMemoryFacts facts;
  facts.physical = 64 * kGiB;
  facts.meminfo = MemInfo("MemAvailable:    2097152 kB");  // 2 GiB
  EXPECT_TRUE(BudgetIs(facts, 2 * kGiB, "MemAvailable in /proc/meminfo"));
}

TEST(HostMemoryBudgetTest, AMalformedOrMissingAvailableLineIsLeftOut) {
  for (const char* line : {"MemAvailable:    2097152 MB", "MemAvailable:    lots kB", "MemAvailable:",
                           "MemAvailabl:    2097152 kB", "MemAvailable:    99999999999999999999999 kB"}) {
    HostMemoryFacts facts;
    facts.physical = 64 * kGiB;
    facts.meminfo = MemInfo(line);
    EXPECT_TRUE(BudgetIs(facts, 64 * kGiB, "the host's physical memory")) << line;
  }
}

TEST(HostMemoryBudgetTest, TheTightestCgroupBoundsIt) {
  HostMemoryFacts facts;
  facts.physical = 64 * kGiB;
  facts.meminfo = MemInfo("MemAvailable:   33554432 kB");  // 32 GiB
  facts.cgroups = {
      {"/sys/fs/cgroup/job/memory.max", "max\n", "123\n", std::nullopt},  // no limit
      {"/sys/fs/cgroup/memory.max", std::to_string(20 * kGiB) + "\n", std::to_string(12 * kGiB) + "\n", std::nullopt},
      // v1, whose "no limit" is a huge number
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n", "1131937792\n", std::nullopt},
  };
  EXPECT_TRUE(BudgetIs(facts, 8 * kGiB, "the room left under /sys/fs/cgroup/memory.max"));
}

TEST(HostMemoryBudgetTest, ACgroupOverItsLimitLeavesNothing) {
  HostMemoryFacts facts;
  facts.physical = 64 * kGiB;
  facts.cgroups = {{"/sys/fs/cgroup/memory.max", "1000", "1200", std::nullopt}};
  EXPECT_TRUE(BudgetIs(facts, 0, "the room left under /sys/fs/cgroup/memory.max"));
}

// Page cache is use the kernel reclaims before it kills: a cgroup full of it
// still has room (memory.stat's file lines; v1's hierarchical total_ lines
// before the cgroup's own).
TEST(HostMemoryBudgetTest, ACgroupsReclaimablePageCacheCountsAsRoom) {
  const std::string v2_stat = "anon 1000\nactive_file " + std::to_string(4 * kGiB) + "\ninactive_file " +
                              std::to_string(6 * kGiB) + "\nshmem 0\n";
  const std::string v1_stat = "cache 5\ninactive_file 16384\nactive_file 8192\ntotal_active_file " +
                              std::to_string(4 * kGiB) + "\ntotal_inactive_file " + std::to_string(6 * kGiB) + "\n";
  for (const auto& [path, stat] : {std::pair<std::string, std::string>{"/sys/fs/cgroup/memory.max", v2_stat},
                                   {"/sys/fs/cgroup/memory/memory.limit_in_bytes", v1_stat}}) {
    HostMemoryFacts facts;
    facts.physical = 64 * kGiB;
    facts.cgroups = {{path, std::to_string(20 * kGiB), std::to_string(19 * kGiB), stat}};
    EXPECT_TRUE(BudgetIs(facts, 11 * kGiB, "the room left under " + path)) << path;
  }
  // More cache than use (the files read at different moments): all room.
  HostMemoryFacts facts;
  facts.physical = 64 * kGiB;
  facts.cgroups = {{"/sys/fs/cgroup/memory.max", std::to_string(20 * kGiB), std::to_string(kGiB), v2_stat}};
  EXPECT_TRUE(BudgetIs(facts, 20 * kGiB, "the room left under /sys/fs/cgroup/memory.max"));
}

// Page-cache figures whose sum overflows (a memory.stat that does not add
// up) count as no page cache: the cgroup's room is its limit less its whole use.
TEST(HostMemoryBudgetTest, PageCacheThatOverflowsCountsAsNone) {
  const std::string stat = "active_file 18446744073709551615\ninactive_file " + std::to_string(2 * kGiB) + "\n";
  HostMemoryFacts facts;
  facts.physical = 64 * kGiB;
  facts.cgroups = {{"/sys/fs/cgroup/memory.max", std::to_string(20 * kGiB), std::to_string(19 * kGiB), stat}};
  EXPECT_TRUE(BudgetIs(facts, kGiB, "the room left under /sys/fs/cgroup/memory.max"));
}

TEST(HostMemoryBudgetTest, ACgroupWithAFileMissingOrUnparsedIsLeftOut) {
  HostMemoryFacts facts;
  facts.physical = 64 * kGiB;
  facts.cgroups = {{"/a/memory.max", "1000", std::nullopt, "inactive_file 0"},
                   {"/b/memory.max", std::nullopt, "10", std::nullopt},
                   {"/c/memory.max", "1k", "10", std::nullopt},
                   {"/d/memory.max", "1000", "-5", std::nullopt}};
  EXPECT_TRUE(BudgetIs(facts, 64 * kGiB, "the host's physical memory"));
}

// On this host (Linux): the physical memory is read, and the budget is no
// more than it.
TEST(HostMemoryBudgetTest, ThisHostsFactsGiveABudgetWithinItsPhysicalMemory) {
  const HostMemoryFacts facts = ReadHostMemoryFacts();
  ASSERT_TRUE(facts.physical.has_value());
  ASSERT_TRUE(facts.meminfo.has_value());
  const std::optional<HostMemoryBudget> budget = HostMemoryBudgetOf(facts);
  ASSERT_TRUE(budget.has_value());
  EXPECT_GT(budget->bytes, 0u);
  EXPECT_LE(budget->bytes, *facts.physical);
}

}  // namespace
}  // namespace loom::internal
