#include "trainguard/runtime.h"

#include <unistd.h>

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"
#include "trainguard/version.h"

namespace trainguard {
namespace {

absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

}  // namespace

void Heartbeat::Enter(int64_t step, int64_t now_ns) {
  step_.store(step, std::memory_order_relaxed);
  in_step_.store(true, std::memory_order_relaxed);
  last_beat_ns_.store(now_ns, std::memory_order_relaxed);
  beats_.fetch_add(1, std::memory_order_release);
}

void Heartbeat::Exit(int64_t duration_ns, int64_t now_ns) {
  last_step_duration_ns_.store(duration_ns, std::memory_order_relaxed);
  in_step_.store(false, std::memory_order_relaxed);
  last_beat_ns_.store(now_ns, std::memory_order_relaxed);
  steps_completed_.fetch_add(1, std::memory_order_relaxed);
  beats_.fetch_add(1, std::memory_order_release);
}

HeartbeatSnapshot Heartbeat::Read() const {
  HeartbeatSnapshot s;
  s.beats = beats_.load(std::memory_order_acquire);
  s.step = step_.load(std::memory_order_relaxed);
  s.in_step = in_step_.load(std::memory_order_relaxed);
  s.last_beat_ns = last_beat_ns_.load(std::memory_order_relaxed);
  s.last_step_duration_ns = last_step_duration_ns_.load(std::memory_order_relaxed);
  s.steps_completed = steps_completed_.load(std::memory_order_relaxed);
  return s;
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const Options& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return WithContext(s, "invalid options");
  TopologySpec spec;
  spec.world_size = options.world_size;
  spec.tp = options.tp;
  spec.cp = options.cp;
  spec.pp = options.pp;
  spec.ranks_per_host = options.local_world_size;
  absl::StatusOr<Topology> topology = Topology::Create(spec);
  if (!topology.ok()) return WithContext(topology.status(), "invalid topology");

  Env* env = options.env != nullptr ? options.env : Env::Default();
  std::string run_dir = options.ResolvedRunDir();
  absl::StatusOr<std::unique_ptr<EventLog>> events =
      EventLog::Open(env, EventLogPath(run_dir, options.rank));
  if (!events.ok()) {
    return WithContext(events.status(),
                       absl::StrCat("rank ", options.rank, ": opening the event file"));
  }
  std::unique_ptr<Runtime> runtime(
      new Runtime(options, *std::move(topology), std::move(run_dir), *std::move(events)));

  Event started;
  started.type = EventType::kRuntimeStarted;
  started.message = absl::StrCat("trainguard ", VersionString(), " started");
  started.attributes = {{"version", VersionString()},
                        {"job_id", options.job_id},
                        {"topology", runtime->topology().ToString()},
                        {"host", HostName()},
                        {"pid", absl::StrCat(getpid())}};
  if (!runtime->events_->set_aside_path().empty()) {
    started.attributes.emplace_back("damaged_event_log_saved_to",
                                    runtime->events_->set_aside_path());
  }
  if (absl::Status s = runtime->EmitEvent(std::move(started)); !s.ok()) return s;
  return runtime;
}

Runtime::Runtime(Options options, Topology topology, std::string run_dir,
                 std::unique_ptr<EventLog> events)
    : options_(std::move(options)),
      topology_(std::move(topology)),
      run_dir_(std::move(run_dir)),
      env_(options_.env != nullptr ? options_.env : Env::Default()),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      events_(std::move(events)) {}

Runtime::~Runtime() {
  Event stopped;
  stopped.type = EventType::kRuntimeStopped;
  stopped.step = heartbeat_.Read().step;
  stopped.message = "runtime stopped";
  (void)EmitEvent(std::move(stopped));  // nothing to report to from a destructor
}

absl::Status Runtime::EmitEvent(Event event) {
  if (event.time == absl::InfinitePast()) event.time = clock_->Now();
  event.rank = rank();
  event.generation = generation_;
  return events_->Append(event);
}

void Runtime::AddObserver(StepObserver* observer) { observers_.push_back(observer); }

bool Runtime::TryBeginStep() {
  bool expected = false;
  return step_active_.compare_exchange_strong(expected, true, std::memory_order_acq_rel);
}

void Runtime::EndStep() { step_active_.store(false, std::memory_order_release); }

void Runtime::RecordStepFault(const StepResult& result) {
  if (result.fault == FaultKind::kFatalDeviceError && !fatal()) {
    fatal_reason_ = absl::StrCat("step ", result.step, ": ", result.status.message());
    fatal_.store(true, std::memory_order_release);
  }
  Event event;
  event.type = EventType::kStepFault;
  event.step = result.step;
  event.message = std::string(result.status.message());
  event.attributes = {{"fault", std::string(FaultKindName(result.fault))},
                      {"action", std::string(StepActionName(result.action))},
                      {"duration_us", absl::StrCat(absl::ToInt64Microseconds(result.duration))}};
  event.attributes.insert(event.attributes.end(), result.evidence.begin(), result.evidence.end());
  // A fault whose event cannot be written is still returned to the trainer in the StepResult.
  (void)EmitEvent(std::move(event));
}

absl::StatusOr<int64_t> Runtime::recover(const StepResult& result) {
  absl::StatusOr<int64_t> next;
  std::string decision;
  switch (result.action) {
    case StepAction::kContinue:
      consecutive_failures_ = 0;
      return result.step + 1;
    case StepAction::kSkip:
      ++consecutive_failures_;
      if (consecutive_failures_ > options_.max_consecutive_step_failures) {
        decision = "give_up";
        next = absl::FailedPreconditionError(absl::StrCat(
            "rank ", rank(), ": ", consecutive_failures_, " consecutive steps failed (limit ",
            options_.max_consecutive_step_failures, "); last: ", result.status.message()));
      } else {
        decision = "skip";
        next = result.step + 1;
      }
      break;
    case StepAction::kRollback:
      decision = "give_up";
      next = absl::UnimplementedError(absl::StrCat(
          "rank ", rank(), " step ", result.step,
          ": rollback needs a committed checkpoint, and checkpointing is not available yet; last: ",
          result.status.message()));
      break;
    case StepAction::kReRendezvous:
      decision = "give_up";
      next = absl::UnavailableError(absl::StrCat("rank ", rank(), " step ", result.step,
                                                 ": a communication failure needs a re-rendezvous, "
                                                 "which is not available yet; restart the "
                                                 "job; last: ",
                                                 result.status.message()));
      break;
    case StepAction::kFatal:
      decision = "give_up";
      next = result.status.ok()
                 ? absl::InternalError(
                       absl::StrCat("rank ", rank(), " step ", result.step, ": fatal step result"))
                 : result.status;
      break;
  }
  Event event;
  event.type = EventType::kRecoveryDecision;
  event.step = result.step;
  event.message = next.ok() ? absl::StrCat(decision, ": resuming at step ", *next)
                            : std::string(next.status().message());
  event.attributes = {{"decision", decision},
                      {"fault", std::string(FaultKindName(result.fault))},
                      {"action", std::string(StepActionName(result.action))}};
  if (next.ok()) event.attributes.emplace_back("next_step", absl::StrCat(*next));
  (void)EmitEvent(std::move(event));
  return next;
}

}  // namespace trainguard
