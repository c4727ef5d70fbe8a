// The names and default actions of step results (guard.h). They live with the Runtime, which
// records and acts on results, so that the guard sits above the Runtime and nothing below it.
#include <string_view>

#include "trainguard/guard.h"

namespace trainguard {

std::string_view FaultKindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kNone:
      return "none";
    case FaultKind::kStepFailure:
      return "step_failure";
    case FaultKind::kCommunicationFailure:
      return "communication_failure";
    case FaultKind::kFatalDeviceError:
      return "fatal_device_error";
    case FaultKind::kUnclassified:
      return "unclassified";
    case FaultKind::kUsageError:
      return "usage_error";
  }
  return "unknown";
}

std::string_view StepActionName(StepAction action) {
  switch (action) {
    case StepAction::kContinue:
      return "continue";
    case StepAction::kSkip:
      return "skip";
    case StepAction::kRollback:
      return "rollback";
    case StepAction::kReRendezvous:
      return "re_rendezvous";
    case StepAction::kFatal:
      return "fatal";
  }
  return "unknown";
}

StepAction DefaultActionFor(FaultKind kind) {
  switch (kind) {
    case FaultKind::kNone:
      return StepAction::kContinue;
    case FaultKind::kStepFailure:
      return StepAction::kSkip;
    case FaultKind::kCommunicationFailure:
      return StepAction::kReRendezvous;
    case FaultKind::kFatalDeviceError:
    case FaultKind::kUnclassified:
    case FaultKind::kUsageError:
      return StepAction::kFatal;
  }
  return StepAction::kFatal;
}

std::string_view StepResult::Evidence(std::string_view key) const {
  for (const auto& [k, v] : evidence) {
    if (k == key) return v;
  }
  return {};
}

}  // namespace trainguard
