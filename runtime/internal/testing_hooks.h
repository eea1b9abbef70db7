// testing_hooks.h (internal): ways for loom's own tests to break a Plan on
// purpose, or to look inside one. Not part of the public API.
#ifndef LOOM_RUNTIME_INTERNAL_TESTING_HOOKS_H_
#define LOOM_RUNTIME_INTERNAL_TESTING_HOOKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "loom/runtime.h"

namespace loom::internal {

// Makes `node` stop publishing its tile flags (and writing its tagged copy,
// CompileOptions::tagged_handoff), so any node that depends on it waits
// forever (until the watchdog's time-out).
absl::Status SuppressFlagPublishingForTesting(Plan& plan, int node);

// Marks every output tile of `node` but tile `except_tile` (m_block *
// n_blocks + n_block) complete for the plan's next launch, as if the node
// had published them (its tagged copy too, zeros tagged with that launch's
// epoch but for that tile's columns). With SuppressFlagPublishingForTesting
// on the same node, a consumer then finds exactly one of its producer tiles
// missing.
absl::Status PublishFlagsForTesting(Plan& plan, int node, int except_tile);

// The device (and mapped host) allocations of every plan alive in this
// process, on every device: each Plan holds several (records, queue, flags,
// state, the time-out record; a workspace, packed weights, tagged copies and a
// trace where it needs them), all given back when it is destroyed.
int64_t LiveAllocationsForTesting();

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_TESTING_HOOKS_H_
