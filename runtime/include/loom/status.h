// loom/status.h: error-propagation macros used at every host boundary.
//
// Abseil 20220623 ships absl::Status but no propagation macros, so loom has its
// own, prefixed to stay out of the way of other libraries':
//
//   absl::StatusOr<Plan> Build(Runtime& rt, const GemmGraph& g) {
//     LOOM_RETURN_IF_ERROR(g.Validate());
//     LOOM_ASSIGN_OR_RETURN(Plan plan, rt.Compile(g));
//     return plan;
//   }
#ifndef LOOM_STATUS_H_
#define LOOM_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LOOM_STATUS_CONCAT_INNER_(a, b) a##b
#define LOOM_STATUS_CONCAT_(a, b) LOOM_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if
// it is not OK.
#define LOOM_RETURN_IF_ERROR(expr)                   \
  do {                                               \
    ::absl::Status loom_status_ = (expr);            \
    if (!loom_status_.ok()) return loom_status_;     \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else
// move-assigns its value to `lhs` (which may be a declaration).
#define LOOM_ASSIGN_OR_RETURN(lhs, rexpr) \
  LOOM_ASSIGN_OR_RETURN_IMPL_(LOOM_STATUS_CONCAT_(loom_statusor_, __LINE__), lhs, rexpr)

#define LOOM_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                \
  if (!statusor.ok()) return statusor.status();           \
  lhs = std::move(statusor).value()

#endif  // LOOM_STATUS_H_
