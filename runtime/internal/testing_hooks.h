// testing_hooks.h (internal): ways for loom's own tests to break a Plan on
// purpose. Not part of the public API.
#ifndef LOOM_RUNTIME_INTERNAL_TESTING_HOOKS_H_
#define LOOM_RUNTIME_INTERNAL_TESTING_HOOKS_H_

#include "absl/status/status.h"
#include "loom/runtime.h"

namespace loom::internal {

// Makes `node` stop publishing its tile flags, so any node that depends on it
// waits forever (until the watchdog's time-out).
absl::Status SuppressFlagPublishingForTesting(Plan& plan, int node);

}  // namespace loom::internal

#endif  // LOOM_RUNTIME_INTERNAL_TESTING_HOOKS_H_
