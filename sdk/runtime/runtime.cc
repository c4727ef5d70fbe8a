#include "trainguard/runtime.h"

#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "sdk/checkpoint/backup_placement.h"
#include "sdk/checkpoint/checkpointer.h"
#include "sdk/core/event_log.h"
#include "sdk/core/store_keys.h"
#include "sdk/health/compute_canary.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/rendezvous/rendezvous.h"
#include "sdk/runtime/peer_progress.h"
#include "sdk/runtime/runtime_impl.h"
#include "sdk/watchdog/flight_recorder.h"
#include "sdk/watchdog/stack_trace.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"
#include "trainguard/version.h"

namespace trainguard {
namespace {

// Bounds membership()'s read of the member ids: an accessor must not block for the rendezvous
// timeout (minutes) on a store that does not answer; the next call tries again.
constexpr absl::Duration kMemberIdsReadTimeout = absl::Seconds(10);

// Set by the SIGUSR2 handler; the Runtime's duty thread dumps the ring and stacks when it sees
// it.
std::atomic<bool> dump_requested{false};
void RequestDump(int) { dump_requested.store(true, std::memory_order_relaxed); }

// Installs the dump-on-signal handler unless the application handles SIGUSR2 itself.
void InstallDumpSignal() {
  struct sigaction current {};
  if (sigaction(SIGUSR2, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction action {};
  action.sa_handler = RequestDump;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  (void)sigaction(SIGUSR2, &action, nullptr);
}

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
  total_step_ns_.fetch_add(duration_ns, std::memory_order_relaxed);
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
  s.total_step_ns = total_step_ns_.load(std::memory_order_relaxed);
  return s;
}

Runtime::~Runtime() = default;

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const Options& options) {
  return RuntimeImpl::Create(options);
}

absl::StatusOr<std::unique_ptr<Runtime>> RuntimeImpl::Create(const Options& options) {
  if (absl::Status s = options.Validate(); !s.ok()) return WithContext(s, "invalid options");
  if (options.job_id == Options().job_id &&
      (options.checkpoint_every_steps > 0 || options.checkpoint_every_seconds > 0)) {
    // Two unrelated runs under the default id would share one arena and one run dir: the second
    // would resume the first's state, or replace it.
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid options: job_id is not set (it is the default \"", Options().job_id,
        "\"), and a Runtime that checkpoints needs an id that names its job, so that another "
        "run never resumes or overwrites its state: set TRAINGUARD_JOB_ID (Options::job_id, "
        "job_id=...); `trainguard run` and torchrun (TORCHELASTIC_RUN_ID) give each run one"));
  }
  TopologySpec spec;
  spec.world_size = options.world_size;
  spec.tp = options.tp;
  spec.cp = options.cp;
  spec.pp = options.pp;
  spec.ranks_per_host = options.local_world_size;
  absl::StatusOr<Topology> topology = Topology::Create(spec);
  if (!topology.ok()) return WithContext(topology.status(), "invalid topology");

  std::unique_ptr<RuntimeImpl> runtime(
      new RuntimeImpl(options, *std::move(topology), options.ResolvedRunDir()));
  // First: a standby parks in JoinRendezvous, and must leave with its launcher too.
  absl::StatusOr<std::unique_ptr<LauncherWatch>> watch =
      LauncherWatch::FromEnvironment(runtime->clock_);
  if (!watch.ok()) return watch.status();
  runtime->launcher_watch_ = *std::move(watch);
  if (absl::Status s = runtime->ConnectStore(); !s.ok()) return s;
  if (absl::Status s = runtime->JoinRendezvous(); !s.ok()) return s;
  if (absl::Status s = runtime->OpenEvents(); !s.ok()) return s;
  if (runtime->launcher_watch_ != nullptr) {
    runtime->launcher_watch_->SetObserver([rt = runtime.get()](absl::string_view why) {
      Event event = EventOfKind(EventKind::kLauncherLost, absl::StrCat(why, ": leaving the job"));
      (void)rt->EmitEvent(std::move(event));
    });
  }
  if (absl::Status s = runtime->StartDetection(); !s.ok()) return s;
  runtime->CreateGenerationEntry();
  if (runtime->member_ != nullptr) {
    GenerationWatcherOptions watch{
        .member = runtime->member_.get(),
        .store = runtime->store_,
        .park = kGenerationWatchPark,
        .hang_recheck = kHangRecheckPeriod,
        .on_superseded = [rt = runtime.get()](int64_t generation) { rt->OnSuperseded(generation); },
        .on_hang_key = nullptr,
        .notices = {}};
    // A peer's hang is answered with a dump only by a rank with a watchdog (its duties publish the
    // progress records the hang's diagnosis reads).
    if (runtime->watchdog_ != nullptr) {
      watch.on_hang_key = [rt = runtime.get()](int64_t generation,
                                               const absl::StatusOr<std::string>& who,
                                               absl::Time asked) {
        rt->hang_responder_->OnHangKey(generation, who, asked);
      };
    }
    // The progress records of a generation start once a rank of it asks for them
    // (ExplainPeerWait), the work records once a host agent does (fail-slow detection).
    if (runtime->rank_publisher_ != nullptr && options.watchdog_peer_progress_ms > 0) {
      watch.notices.push_back(
          {.key = [](int64_t generation) { return store_keys::HangProgressWanted(generation); },
           .on_seen = [rt = runtime.get()](
                          int64_t generation) { rt->rank_publisher_->WantProgress(generation); }});
    }
    if (runtime->rank_publisher_ != nullptr) {
      watch.notices.push_back(
          {.key = [](int64_t) { return std::string(kRankWorkWantedKey); },
           .on_seen = [rt = runtime.get()](int64_t) { rt->rank_publisher_->WantWorkRecords(); }});
    }
    runtime->generation_watcher_ = std::make_unique<GenerationWatcher>(std::move(watch));
  }
  if (runtime->takeover_.has_value()) runtime->takeover_->created = runtime->clock_->Now();
  return std::unique_ptr<Runtime>(std::move(runtime));
}

RuntimeImpl::RuntimeImpl(Options options, Topology topology, std::string run_dir)
    : options_(std::move(options)),
      topology_(std::move(topology)),
      run_dir_(std::move(run_dir)),
      env_(options_.env != nullptr ? options_.env : Env::Default()),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      rank_(options_.rank),
      recovery_policy_(RecoveryLimits::FromOptions(options_)),
      checkpointing_(options_.checkpoint_every_steps > 0 || options_.checkpoint_every_seconds > 0) {
  // The guard's happy path does not allocate: room for the losses a step checks.
  accepted_losses_.reserve(8);
}

absl::Status RuntimeImpl::ConnectStore() {
  if (options_.store_client != nullptr) {
    store_ = options_.store_client;
    return absl::OkStatus();
  }
  if (options_.store.empty()) return absl::OkStatus();
  std::string token;
  if (!options_.store_token_file.empty()) {
    absl::StatusOr<std::string> contents = env_->ReadFileToString(options_.store_token_file);
    if (!contents.ok()) {
      return WithContext(contents.status(),
                         absl::StrCat("rank ", options_.rank, ": reading store_token_file"));
    }
    token = std::string(absl::StripTrailingAsciiWhitespace(*contents));
  }
  store_token_ = token;
  OpenStoreOptions open_options;
  open_options.source_address = options_.host_addr;
  absl::StatusOr<std::unique_ptr<Store>> store =
      OpenStore(options_.store, options_.job_id, token,
                absl::Milliseconds(options_.rendezvous_timeout_ms), open_options);
  if (!store.ok()) {
    return WithContext(store.status(), absl::StrCat("rank ", options_.rank,
                                                    ": connecting to store ", options_.store));
  }
  owned_store_ = *std::move(store);
  store_ = owned_store_.get();
  return absl::OkStatus();
}

absl::Status RuntimeImpl::JoinRendezvous() {
  if (store_ == nullptr) return absl::OkStatus();  // a static job
  const std::string member_id =
      options_.member_id.empty() ? absl::StrCat(HostName(), ":", getpid()) : options_.member_id;
  const absl::Duration timeout = absl::Milliseconds(options_.rendezvous_timeout_ms);
  const absl::Duration heartbeat = options_.heartbeat_interval_ms > 0
                                       ? absl::Milliseconds(options_.heartbeat_interval_ms)
                                       : RankHeartbeatInterval(options_.world_size);
  member_ = std::make_unique<RendezvousMember>(store_, member_id, heartbeat);
  if (options_.role == "rank") {
    absl::StatusOr<Membership> m =
        member_->JoinInitial(options_.rank, options_.world_size, timeout);
    if (!m.ok()) return m.status();
    current_.Adopt(*std::move(m), std::nullopt);
    return absl::OkStatus();
  }
  // While it is parked, a standby of a job with peer backups prepares the memory of the arena it
  // will restore into (the rank it takes lost its arena with its host), so that the restore
  // starts receiving at once.
  std::optional<SpareArenaPreparer> spare;
  if (checkpointing_ && options_.backup_copies > 1 && topology_.num_hosts() >= 2) {
    spare.emplace(store_, SpareArenaPreparerOptions{.job_id = options_.job_id,
                                                    .world_size = options_.world_size,
                                                    .env = options_.env,
                                                    .name = SpareArena::Name(options_.job_id,
                                                                             getpid())});
  }
  // A standby parks, one bounded wait after another, until the launcher assigns it or stops it.
  absl::StatusOr<Membership> m = member_->ParkAsStandby(timeout);
  while (absl::IsDeadlineExceeded(m.status())) m = member_->ParkAsStandby(timeout);
  const absl::Time assigned = clock_->Now();
  if (spare.has_value()) {
    spare->Stop();
    spare_arena_ = spare->Take();
  }
  if (!m.ok()) return m.status();
  absl::StatusOr<RecoveryPlan> plan = member_->AgreeOnResume(*m, /*next_step=*/-1, timeout);
  while (absl::IsAborted(
      plan.status())) {  // another rank died meanwhile: meet in the newer generation
    m = member_->AwaitGeneration(m->generation, timeout);
    if (!m.ok()) return m.status();
    plan = member_->AgreeOnResume(*m, /*next_step=*/-1, timeout);
  }
  if (!plan.ok()) return plan.status();
  rank_ = m->rank;
  resume_step_ = plan->resume_step;
  current_.Adopt(*std::move(m), *std::move(plan));
  takeover_ = TakeoverTimes{.assigned = assigned, .agreed = clock_->Now(), .created = {}};
  return absl::OkStatus();
}

absl::Status RuntimeImpl::OpenEvents() {
  absl::StatusOr<std::unique_ptr<EventLog>> events =
      EventLog::Open(env_, EventLogPath(run_dir_, rank_));
  if (!events.ok()) {
    return WithContext(events.status(), absl::StrCat("rank ", rank_, ": opening the event file"));
  }
  events_ = *std::move(events);
  Event started;
  started.type = EventType::kRuntimeStarted;
  started.message = absl::StrCat("trainguard ", VersionString(), " started");
  started.attributes = {{"version", VersionString()},       {"job_id", options_.job_id},
                        {"topology", topology_.ToString()}, {"host", HostName()},
                        {"pid", absl::StrCat(getpid())},    {"role", options_.role}};
  if (member_ != nullptr) started.attributes.emplace_back("member_id", member_->member_id());
  if (const std::optional<RecoveryPlan>& plan = current_.plan(); plan.has_value()) {
    started.message =
        absl::StrCat("standby ", member_->member_id(), " replaced rank ", rank_, " in generation ",
                     generation(), "; resuming at step ", resume_step_);
    started.attributes.emplace_back("replaced_rank", absl::StrCat(rank_));
    started.attributes.emplace_back("state_source_rank", absl::StrCat(plan->state_source_rank));
  }
  if (!events_->set_aside_path().empty()) {
    started.attributes.emplace_back("damaged_event_log_saved_to", events_->set_aside_path());
  }
  return EmitEvent(std::move(started));
}

RuntimeImpl::~RuntimeImpl() {
  launcher_watch_.reset();
  CloseCommunicator();  // before the tracker its abort hook is registered in
  // A hang's wait for the peers' dumps ends; the generation watcher and the duty thread stop
  // together, and each destructor joins its own thread.
  if (hang_responder_ != nullptr) hang_responder_->Stop();
  if (generation_watcher_ != nullptr) generation_watcher_->Stop();
  if (duty_thread_ != nullptr) duty_thread_->Stop();
  generation_watcher_.reset();
  duty_thread_.reset();
  watchdog_.reset();  // its thread calls back into this object
  Event stopped;
  stopped.type = EventType::kRuntimeStopped;
  stopped.step = heartbeat_.Read().step;
  stopped.message = "runtime stopped";
  (void)EmitEvent(std::move(stopped));  // nothing to report to from a destructor
}

absl::Status RuntimeImpl::EmitEvent(Event event) {
  return EmitEventOf(generation(), std::move(event));
}

absl::Status RuntimeImpl::EmitEventOf(int64_t generation, Event event) {
  if (events_ == nullptr) {  // Create() failed before the event file was opened
    return absl::FailedPreconditionError("the runtime has no event file");
  }
  if (event.time == absl::InfinitePast()) event.time = clock_->Now();
  event.rank = rank();
  event.generation = generation;
  return events_->Append(event);
}

void RuntimeImpl::AddObserver(StepObserver* observer) { observers_.push_back(observer); }

void RuntimeImpl::AddSupersededHandler(std::function<void(int64_t generation)> handler) {
  MutexLock lock(&superseded_handlers_mu_);
  superseded_handlers_.push_back(std::move(handler));
}

bool RuntimeImpl::TryBeginStep() {
  bool expected = false;
  if (!step_active_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) {
    return false;
  }
  hang_responder_->NoteStepBegun();
  steps_begun_.fetch_add(1, std::memory_order_acq_rel);
  return true;
}

void RuntimeImpl::EndStep() { step_active_.store(false, std::memory_order_release); }

void RuntimeImpl::AnnounceResumed(int64_t step) {
  const int64_t generation = current_.generation();
  announced_generation_ = generation;
  if (store_ == nullptr) return;
  // Best effort: a launcher that misses it reports no recovery time and watches the superseded
  // generations for a late hang until a later generation is announced by every rank.
  (void)PublishResumed(store_, generation, rank_, step,
                       absl::Milliseconds(options_.rendezvous_timeout_ms));
}

void RuntimeImpl::RecordStepFault(const StepResult& result) {
  if (result.fault == FaultKind::kFatalDeviceError) {
    MarkFatal(absl::StrCat("step ", result.step, ": ", result.status.message()));
  }
  Event event;
  event.type = EventType::kStepFault;
  event.step = result.step;
  event.message = std::string(result.status.message());
  event.attributes = {{"fault", std::string(FaultKindName(result.fault))},
                      {"action", std::string(StepActionName(result.action))},
                      {"duration_us", absl::StrCat(absl::ToInt64Microseconds(result.duration))}};
  event.attributes.insert(event.attributes.end(), result.evidence.begin(), result.evidence.end());
  // Without a store, nobody tells this rank that a peer declared a hang: its collective just fails
  // when the peer aborts. It dumps its own ring and stacks now (once per generation, like a hang),
  // so that every rank of a static job leaves its evidence. With a store, the hang key does that.
  if (store_ == nullptr && result.fault == FaultKind::kCommunicationFailure &&
      flight_recorder_ != nullptr) {
    if (std::optional<std::string> dump =
            hang_responder_->DumpCommunicationFailure(generation(), event.message)) {
      event.attributes.emplace_back("dump", *std::move(dump));
    }
  }
  // A fault whose event cannot be written is still returned to the trainer in the StepResult.
  (void)EmitEvent(std::move(event));
}

void RuntimeImpl::SetCommunicatorFactory(CommunicatorFactory factory) {
  entry_->SetCommunicatorFactory(std::move(factory));
}

void RuntimeImpl::CloseCommunicator() {
  if (entry_ != nullptr) entry_->CloseCommunicator();
}

void RuntimeImpl::CreateGenerationEntry() {
  entry_ = std::make_unique<GenerationEntry>(GenerationEntryOptions{
      .rank = rank_,
      .world_size = options_.world_size,
      .store = store_,
      .member = member_.get(),
      .tracker = collectives_.get(),
      .state = &state_,
      .current = &current_,
      .rendezvous_timeout = absl::Milliseconds(options_.rendezvous_timeout_ms),
      .max_attempts = kMaxGenerationAttempts,
      .hooks = {
          .checkpointing = [this] { return checkpointing_; },
          .restore = [this] { return RestoreNewestCommitted(); },
          .loss_window = [this] { return LossWindowState(); },
          .load_loss_window = [this](std::string_view window) { return LoadLossWindow(window); },
          .emit = [this](Event event) { (void)EmitEvent(std::move(event)); },
          .stop_job = [this](const std::string& reason,
                             RecoveryReport& report) { return StopJob(reason, report); },
          .adopted = [this] { recovery_policy_.EndFailureRun(); },
          .replaced = [this](std::string reason) { MarkFatal(std::move(reason)); },
      }});
}

std::string RuntimeImpl::LossWindowState() {
  return loss_spike_detector_.has_value() ? loss_spike_detector_->SaveState() : std::string();
}

absl::Status RuntimeImpl::LoadLossWindow(std::string_view state) {
  if (state.empty() && !loss_spike_detector_.has_value()) return absl::OkStatus();
  return loss_spike_detector().LoadState(state);
}

absl::Status RuntimeImpl::RestoreLossWindow(int64_t step) {
  absl::StatusOr<std::string> saved = state_.GetBlob(kLossWindowBlob);
  absl::Status s = LoadLossWindow(saved.ok() ? *saved : std::string());
  if (s.ok()) return s;
  return absl::DataLossError(absl::StrCat("rank ", rank_, ": the snapshot of step ", step,
                                          ": blob \"", kLossWindowBlob, "\": ", s.message()));
}

absl::StatusOr<int64_t> RuntimeImpl::Start() {
  if (started_) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_, ": Runtime::Start() was called already"));
  }
  started_ = true;
  RecoveryReport report;
  report.decision = "start";
  report.joined_generation = current_.plan().has_value();
  absl::StatusOr<int64_t> next = entry_->Enter(resume_step_, resume_step_, report);
  if (next.ok()) resume_step_ = *next;
  if (!next.ok() && !report.job_stopped) report.decision = "give_up";
  report.status = next.status();
  report.next_step = next.ok() ? *next : -1;
  ReportRecovery(nullptr, report);
  return next;
}

absl::Status RuntimeImpl::StopJob(const std::string& reason, RecoveryReport& report) {
  // One line, as the launcher prints it.
  std::string line = reason;
  std::replace(line.begin(), line.end(), '\n', ' ');
  report.job_stopped = true;
  report.decision = "give_up";
  if (store_ != nullptr) {
    const absl::Duration timeout =
        std::min(absl::Milliseconds(options_.rendezvous_timeout_ms), absl::Seconds(10));
    // First writer wins: every rank may reach the same verdict, the launcher needs one.
    absl::StatusOr<CompareAndSetResult> published =
        store_->CompareAndSet(kJobStopKey, std::nullopt, line, timeout);
    if (!published.ok()) {
      Event event = EventOfKind(
          EventKind::kJobStopUnpublished,
          absl::StrCat("publishing ", kJobStopKey, " failed: ", published.status().message(),
                       "; the launcher may take this "
                       "rank's exit for a death"));
      (void)EmitEvent(std::move(event));
    }
  }
  return absl::FailedPreconditionError(line);
}

absl::Status RuntimeImpl::StartDetection() {
  const std::string where = absl::StrCat("rank ", rank_, ": starting hang detection");
  absl::StatusOr<std::unique_ptr<FlightRecorder>> recorder =
      FlightRecorder::Create(options_.job_id, rank_, options_.flight_recorder_records, env_);
  if (recorder.ok()) {
    flight_recorder_ = *std::move(recorder);
  } else {
    // Diagnostics must not stop training: the watchdog and the tracker work without a ring.
    Event event =
        EventOfKind(EventKind::kFlightRecorderUnavailable,
                    absl::StrCat("flight recorder unavailable: ", recorder.status().message()));
    (void)EmitEvent(std::move(event));
  }
  // Removed when the Runtime is destroyed; a rank that is killed or crashes runs no destructor, so
  // its ring stays behind as the evidence.
  CollectiveTrackerOptions to = CollectiveTrackerOptions::FromOptions(options_);
  to.clock = clock_;
  to.recorder = flight_recorder_.get();
  absl::StatusOr<std::unique_ptr<CollectiveTracker>> tracker = CollectiveTracker::Create(to);
  if (!tracker.ok()) return WithContext(tracker.status(), where);
  collectives_ = *std::move(tracker);
  hang_evidence_ = std::make_unique<FlightRecorderEvidence>(FlightRecorderEvidenceOptions{
      .job_id = options_.job_id,
      .rank = rank_,
      .run_dir = run_dir_,
      .env = env_,
      .clock = clock_,
      .step_thread = [this] {
        return phase_watchdog_ != nullptr ? phase_watchdog_->phase_thread_id() : 0;
      }});
  hang_responder_ = std::make_unique<HangResponder>(HangResponderOptions{
      .rank = rank_,
      .store = store_,
      .evidence = hang_evidence_.get(),
      // Real time, not clock_: its instants are ordered against the generation watcher's reads,
      // which that thread stamps with real time, and its wait for the peers' dumps must end
      // whatever clock the trainer gave.
      .clock = Clock::Real(),
      .generation = [this] { return generation(); },
      .step = [this] { return heartbeat_.Read().step; },
      .emit = [this](int64_t generation,
                     Event event) { (void)EmitEventOf(generation, std::move(event)); },
      .withdraw_hang_if_ended = [this] { return phase_watchdog_->WithdrawHangIfEnded(); },
      .dump_wait = absl::Milliseconds(options_.hang_dump_wait_ms)});
  if (options_.watchdog_poll_ms == 0) {
    // No watchdog and none of its duties, but a step that outlives its generation still ends the
    // process (superseded_step_exit_ms): without it, a rank blocked in a superseded generation's
    // collective on a peer gone without closing its connections would hold the next generation's
    // agreement for that collective's whole timeout.
    if (member_ != nullptr && options_.superseded_step_exit_ms > 0) {
      duty_thread_ = std::make_unique<DutyThread>(DutyThreadOptions{
          .period = kDutyPeriod, .duties = [this] { ExitIfStepOutlivesGeneration(); }});
    }
    return absl::OkStatus();
  }
  WatchdogOptions wo = WatchdogOptions::FromOptions(options_);
  wo.clock = clock_;
  wo.recorder = flight_recorder_.get();
  wo.tracker = collectives_.get();
  if (store_ != nullptr && options_.watchdog_peer_progress_ms > 0) {
    wo.peer_progress = [this](const InFlightCollective& c) { return ExplainPeerWait(c); };
  }
  absl::StatusOr<std::unique_ptr<Watchdog>> watchdog = Watchdog::Create(wo);
  if (!watchdog.ok()) return WithContext(watchdog.status(), where);
  watchdog_ = *std::move(watchdog);
  phase_watchdog_ = watchdog_.get();
  watchdog_->AddHangHandler([this](const HangReport& report) { OnHang(report); });
  InstallDumpSignal();
  rank_publisher_ = std::make_unique<RankPublisher>(RankPublisherOptions{
      .store = store_,
      .rank = rank_,
      .clock = clock_,
      .progress_period = absl::Milliseconds(options_.watchdog_peer_progress_ms),
      .heartbeat = &heartbeat_,
      .watchdog = phase_watchdog_,
      .collectives = collectives_.get(),
      .generation = [this] { return generation(); }});
  // It wakes every half publication period (when shorter), so that a progress record goes out
  // between one and 1.5 periods after the last.
  absl::Duration period = kDutyPeriod;
  if (options_.watchdog_peer_progress_ms > 0) {
    period = std::min(period, absl::Milliseconds(options_.watchdog_peer_progress_ms) / 2);
  }
  duty_thread_ = std::make_unique<DutyThread>(
      DutyThreadOptions{.period = period, .duties = [this] { RunWatcherDuties(); }});
  return absl::OkStatus();
}

FiniteChecker* RuntimeImpl::finite_checker() {
  if (finite_checker_ == nullptr) {
    absl::StatusOr<std::unique_ptr<FiniteChecker>> c = FiniteChecker::Create(256);
    if (!c.ok()) return nullptr;
    finite_checker_ = *std::move(c);
  }
  return finite_checker_.get();
}

LossSpikeDetector& RuntimeImpl::loss_spike_detector() {
  if (!loss_spike_detector_.has_value()) {
    LossSpikeOptions o;
    o.window = options_.loss_spike_window;
    o.threshold = options_.loss_spike_mads;
    o.warmup = options_.loss_spike_warmup;
    // The options were validated with the detector's own rules (Options::Validate).
    absl::StatusOr<LossSpikeDetector> detector = LossSpikeDetector::Create(o);
    loss_spike_detector_.emplace(detector.ok() ? *std::move(detector)
                                               : *LossSpikeDetector::Create(LossSpikeOptions{}));
  }
  return *loss_spike_detector_;
}

void RuntimeImpl::OnHang(const HangReport& report) {
  hang_responder_->OnOwnHang(report, generation());
}

const Membership& RuntimeImpl::membership() const {
  if (member_ == nullptr) return current_.membership();  // a static job: no table to read
  return current_.MembershipWithIds([&](int64_t generation) {
    return member_->ReadRankTable(generation, kMemberIdsReadTimeout);
  });
}

std::optional<std::string> RuntimeImpl::ExplainPeerWait(const InFlightCollective& waiting_in) {
  const int64_t generation = this->generation();
  // A record is written at most 1.5 periods after the previous one (the duty thread wakes every
  // half period). The window also allows a loaded machine to delay a publication by a period more,
  // and the store round trips: a peer still generating must not look silent because its duty thread
  // was descheduled for a moment.
  const absl::Duration window =
      3 * absl::Milliseconds(options_.watchdog_peer_progress_ms) + absl::Milliseconds(500);
  // The peers publish their records once asked (peer_progress.h): the first question of the
  // generation is this rank's unless another rank asked first; for a window after it, their
  // first records may still be on their way, and the wait is postponed without an event.
  if (progress_question_.generation != generation) {
    const std::string key = store_keys::HangProgressWanted(generation);
    absl::StatusOr<CompareAndSetResult> asked = store_->CompareAndSet(
        key, std::nullopt, runtime_internal::EncodeProgressQuestion(rank_, clock_->Now()),
        absl::Milliseconds(500));
    std::optional<std::string> question;
    if (asked.ok()) {
      question = asked->current;
    } else if (absl::IsFailedPrecondition(asked.status())) {
      // The fence refuses this rank's write (its generation was superseded): the peers may have
      // been asked by a rank that can still write.
      absl::StatusOr<std::string> value = store_->Get(key, absl::Milliseconds(500));
      if (value.ok()) question = *value;
    }
    // A store that does not answer quickly gives no excuse: the hang is declared.
    if (!question.has_value()) return std::nullopt;
    absl::StatusOr<absl::Time> when = runtime_internal::ParseProgressQuestion(*question);
    progress_question_ = {.generation = generation,
                          .asked = when.ok() ? *when : absl::InfinitePast()};
  }
  if (std::optional<std::string> awaiting =
          runtime_internal::AwaitingFirstRecords(progress_question_.asked, clock_->Now(), window);
      awaiting.has_value()) {
    return awaiting;
  }
  // A store that does not answer quickly gives no excuse: the hang is declared.
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  // The member ids, read once per generation and only here: a rank does not read the rank table
  // when it joins a generation.
  if (member_ != nullptr && current_.MemberIdsOf(generation).empty()) {
    absl::StatusOr<Membership> table =
        member_->ReadRankTable(generation, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (table.ok()) current_.SetMemberIds(generation, std::move(table->members));
  }
  std::vector<std::string> keys;
  for (int r = 0; r < options_.world_size; ++r) {
    keys.push_back(runtime_internal::ProgressKey(generation, r));
  }
  // In the same round trip: which peers their launcher (one host) or host agent sees stopped.
  if (const std::vector<std::string> members = current_.MemberIdsOf(generation);
      members.size() == static_cast<size_t>(options_.world_size)) {
    for (const std::string& member : members) {
      keys.push_back(absl::StrCat(runtime_internal::kStoppedMemberPrefix, member));
    }
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> records =
      store_->MultiGet(keys, std::max(deadline - absl::Now(), absl::ZeroDuration()));
  if (!records.ok()) return std::nullopt;
  std::vector<bool> stopped;
  for (size_t i = options_.world_size; i < records->size(); ++i) {
    stopped.push_back((*records)[i].has_value());
  }
  records->resize(options_.world_size);
  std::optional<std::string> peer =
      runtime_internal::ExplainWait(*records, rank_, waiting_in.op, waiting_in.comm_id,
                                    waiting_in.comm_seq, clock_->Now(), window, stopped);
  if (peer.has_value() && waiting_in.instance != excused_collective_) {
    excused_collective_ = waiting_in.instance;
    auto ms = [](absl::Duration d) {
      return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
    };
    Event event = EventOfKind(EventKind::kHangPostponed,
                              absl::StrCat("hang postponed: waiting in ", waiting_in.op, " #",
                                           waiting_in.comm_seq, " for ", ms(waiting_in.age),
                                           " (bound ", ms(waiting_in.bound), "), but ", *peer));
    event.step = waiting_in.step;
    event.attributes.emplace_back("peer", *peer);
    (void)EmitEvent(std::move(event));
  }
  return peer;
}

void RuntimeImpl::RunWatcherDuties() {
  rank_publisher_->PublishProgress();
  rank_publisher_->PublishWork();
  ExitIfStepOutlivesGeneration();
  if (dump_requested.exchange(false, std::memory_order_relaxed)) hang_responder_->DumpOnDemand();
}

void RuntimeImpl::OnSuperseded(int64_t generation) {
  // The factory's communicator is left alone: a rank that left its collective at once would wait
  // in the next generation's rendezvous for every member, and on one host nothing but the heartbeat
  // timeout replaces a member that is stopped there. Waiting in the collective, it declares the
  // hang, which names the stopped rank (Launcher.AHangsSuspectIsReplacedThough...). A peer's hang
  // of this generation that this rank has not dumped is captured before the handlers let it go
  // (HangResponder::OnSuperseded).
  std::vector<std::function<void(int64_t)>> handlers;
  {
    MutexLock lock(&superseded_handlers_mu_);
    handlers = superseded_handlers_;
  }
  hang_responder_->OnSuperseded(generation, [&] {
    for (const std::function<void(int64_t)>& handler : handlers) handler(generation);
  });
  Event event = EventOfKind(
      EventKind::kGenerationSuperseded,
      absl::StrFormat("generation %d was superseded (a newer one is published: a peer died or a "
                      "rank asked for a re-rendezvous); %d handler%s called",
                      generation, handlers.size(), handlers.size() == 1 ? "" : "s"));
  event.step = heartbeat_.Read().step;
  (void)EmitEventOf(generation, std::move(event));
}

void RuntimeImpl::ExitIfStepOutlivesGeneration() {
  if (member_ == nullptr || options_.superseded_step_exit_ms == 0) return;
  const int64_t generation = this->generation();
  const int64_t step = steps_begun_.load(std::memory_order_acquire);
  if (member_->superseded_generation() != generation ||
      !step_active_.load(std::memory_order_acquire)) {
    superseded_step_since_ns_ = -1;
    return;
  }
  const int64_t now_ns = clock_->MonotonicNanos();
  if (superseded_step_since_ns_ < 0 || superseded_step_ != step) {
    superseded_step_since_ns_ = now_ns;
    superseded_step_ = step;
    return;
  }
  const int64_t waited_ms = (now_ns - superseded_step_since_ns_) / 1'000'000;
  if (waited_ms < options_.superseded_step_exit_ms) return;
  // The other ranks met in a newer generation without this one, and its step cannot end: a
  // collective waits on a peer that is gone (its host cut off or powered off: no connection was
  // closed) and aborting it did not wake it. The launcher would kill it once its refused heartbeat
  // counts as stale (--heartbeat-timeout); exiting now hands its rank to a standby sooner.
  const int64_t step_number = heartbeat_.Read().step;
  const std::string message = absl::StrFormat(
      "step %d of generation %d still running %d ms after this rank learned that a newer "
      "generation "
      "superseded it: exiting with status %d so that a standby takes rank %d",
      step_number, generation, waited_ms, Runtime::kSupersededStepExitCode, rank_);
  Event event = EventOfKind(EventKind::kSupersededStepExit, message);
  event.step = step_number;
  event.attributes.emplace_back("waited_ms", absl::StrCat(waited_ms));
  (void)EmitEventOf(generation, std::move(event));
  std::fprintf(stderr, "trainguard: rank %d: %s\n", rank_, message.c_str());
  std::fflush(stderr);
  std::_Exit(Runtime::kSupersededStepExitCode);
}

absl::Status RuntimeImpl::EnsureCheckpointer() {
  if (checkpointer_ != nullptr) return absl::OkStatus();
  checkpointing_ = true;
  CheckpointerOptions o;
  o.job_id = options_.job_id;
  o.rank = rank_;
  o.world_size = options_.world_size;
  o.generation = generation();
  o.dir = options_.checkpoint_dir.empty() ? absl::StrCat(run_dir_, "/checkpoints")
                                          : options_.checkpoint_dir;
  o.keep_last = options_.checkpoint_keep_last;
  o.persist_every = options_.checkpoint_persist_every;
  o.copy_threads = options_.checkpoint_copy_threads;
  o.store = store_;
  o.env = options_.env;
  // A rerun of the job with another model must not start from step 0 with its state gone.
  o.keep_arena_of_other_layout = true;
  o.timeout = absl::Milliseconds(options_.rendezvous_timeout_ms);
  absl::StatusOr<std::optional<PeerBackupsOptions>> peers = PeerBackupOptions();
  if (!peers.ok())
    return WithContext(peers.status(), absl::StrCat("rank ", rank_, ": peer backups"));
  o.peer_backups = *std::move(peers);
  if (member_ != nullptr) o.superseded = [this] { return member_->superseded(); };
  state_.Freeze();
  o.spare_arena = spare_arena_.get();
  if (options_.silent_corruption != "off") {
    o.replica_group = ReplicaGroup();
    o.host = ReplicaHost();
    if (options_.silent_corruption_canary == 1) {
      // On the device of the rank's first CUDA buffer when it has one (its product equals the CPU
      // twin's on a healthy GPU); a device that cannot run it falls back to the CPU twin.
      std::optional<int> ordinal;
      for (const StateBuffer& b : state_.buffers()) {
        if (b.device.kind == Device::Kind::kCuda) {
          ordinal = b.device.index;
          break;
        }
      }
      o.canary = [ordinal] {
        if (ordinal.has_value()) {
          if (absl::StatusOr<uint64_t> fp = ComputeDeviceCanary(*ordinal); fp.ok()) return *fp;
        }
        return ComputeCanary();
      };
    }
  }
  absl::StatusOr<std::unique_ptr<Checkpointer>> c = Checkpointer::Create(&state_, o);
  spare_arena_.reset();  // adopted as the arena, or not needed: its memory goes back
  if (!c.ok()) return WithContext(c.status(), absl::StrCat("rank ", rank_, ": checkpointing"));
  checkpointer_ = *std::move(c);
  checkpointer_->set_observer([this](const SaveOutcome& outcome) {
    if (outcome.protected_again) {
      Event event = EventOfKind(EventKind::kProtected,
                                absl::StrCat("protected: every rank's snapshot of step ",
                                             outcome.step, " is in memory with all its backups"));
      event.step = outcome.step;
      (void)EmitEvent(std::move(event));
    }
    if (outcome.reprotect) {
      if (outcome.status.ok()) return;
      Event event = EventOfKind(EventKind::kReprotectFailed, std::string(outcome.status.message()));
      event.step = outcome.step;
      (void)EmitEvent(std::move(event));
      return;
    }
    Event event = EventOfKind(outcome.status.ok() ? EventKind::kSaved : EventKind::kSaveFailed,
                              outcome.status.ok()
                                  ? absl::StrCat("saved the state to resume at step ", outcome.step)
                                  : std::string(outcome.status.message()));
    event.step = outcome.step;
    event.attributes.insert(
        event.attributes.end(),
        {{"committed", outcome.committed ? "true" : "false"},
         {"persisted", outcome.persisted ? "true" : "false"},
         {"durable_committed", outcome.durable_committed ? "true" : "false"},
         {"copy_us", absl::StrCat(absl::ToInt64Microseconds(outcome.copy_time))},
         {"replicated", outcome.replicated ? "true" : "false"},
         {"replicate_us", absl::StrCat(absl::ToInt64Microseconds(outcome.replicate_time))},
         {"persist_us", absl::StrCat(absl::ToInt64Microseconds(outcome.persist_time))}});
    (void)EmitEvent(std::move(event));
    if (!outcome.disagreements.empty()) OnSilentCorruption(outcome.step, outcome.disagreements);
  });
  return absl::OkStatus();
}

void RuntimeImpl::OnSilentCorruption(int64_t step,
                                     const std::vector<ReplicaDisagreement>& disagreements) {
  // repair and evict roll every rank back; evict also asks the coordinator to replace the host.
  const bool evict = options_.silent_corruption == "evict";
  const bool repair = options_.silent_corruption == "repair" || evict;
  // A compute canary that differs names a machine whose arithmetic is wrong; the state its ranks
  // hold is judged by the replicas' comparison, so the canary alone rolls nothing back.
  bool state_disagrees = false;
  std::vector<std::string> lines;
  for (const ReplicaDisagreement& d : disagreements) {
    const bool canary = d.group == kCanaryGroup;
    state_disagrees |= !canary;
    const std::string line = DescribeDisagreement(step, d);
    lines.push_back(line);
    // One event per rank named; one for the group when no majority decides.
    const std::vector<int> named = d.majority.has_value() ? d.minority : std::vector<int>{-1};
    for (size_t m = 0; m < named.size(); ++m) {
      const size_t i = named[m] < 0 ? 0 : d.IndexOf(named[m]);
      Event event = EventOfKind(EventKind::kSilentCorruption, line);
      event.step = step;
      event.attributes.insert(
          event.attributes.end(),
          {{"group", d.group},
           {"ranks", absl::StrJoin(d.ranks, ",")},
           {"corrupt_rank", named[m] < 0 ? "" : absl::StrCat(named[m])},
           {"corrupt_host", named[m] < 0 ? "" : d.hosts[i]},
           {"buffers", m < d.buffers.size() ? absl::StrJoin(d.buffers[m], ",") : ""},
           {"fingerprint", named[m] < 0 ? "" : absl::StrFormat("%016x", d.fingerprints[i])},
           {"majority", d.majority.has_value() ? absl::StrFormat("%016x", *d.majority) : ""},
           {"action", evict               ? "evict"
                      : repair && !canary ? "repair"
                                          : "alert"}});
      (void)EmitEvent(std::move(event));
    }
  }
  // Every naming of a host is counted (job/silent_corruption_named/). The host is handed to the
  // coordinator for eviction (job/silent_corruption_evict/<host>; it evicts it as a fail-slow host
  // is, or stops the job when it cannot and the host was named twice) under evict, and under any
  // action from its second naming: a rollback does not cure a machine that corrupts again. A group
  // without a majority undecided twice (nobody to evict) stops the job under repair.
  std::string stop;
  if (store_ != nullptr) {
    const absl::Duration timeout = absl::Milliseconds(options_.rendezvous_timeout_ms);
    for (const ReplicaDisagreement& d : disagreements) {
      for (int r : d.minority) {
        const std::string& host = d.hosts[d.IndexOf(r)];
        absl::StatusOr<int64_t> times = store_->Add(
            absl::StrCat(store_keys::kJobSilentCorruptionNamedPrefix, "host ", host), 1, timeout);
        if (times.ok() && (evict || *times >= 2)) {
          (void)store_->Set(absl::StrCat(store_keys::kJobSilentCorruptionEvictPrefix, host),
                            absl::StrCat(*times, " ", options_.silent_corruption, "\n",
                                         DescribeDisagreement(step, d)),
                            timeout);
        }
      }
      if (repair && !d.majority.has_value() && d.group != kCanaryGroup) {
        absl::StatusOr<int64_t> times = store_->Add(
            absl::StrCat(store_keys::kJobSilentCorruptionNamedPrefix, "group ", d.group), 1,
            timeout);
        if (times.ok() && *times >= 2 && stop.empty()) {
          stop = absl::StrCat("group ", d.group, " was found without a majority ", *times,
                              " times (the last at step ", step,
                              "): a rollback does not cure it; replace its hosts");
        }
      }
    }
  }
  if (!repair || (!state_disagrees && stop.empty())) return;
  RequestRepair(
      absl::StrCat("silent data corruption: ", absl::StrJoin(lines, " | "),
                   stop.empty() ? "; repairing: every rank goes back to the last committed snapshot"
                                : absl::StrCat("; ", stop)),
      std::move(stop));
}

std::string RuntimeImpl::ReplicaGroup() const {
  // The replicas of a data-parallel group share every coordinate but dp.
  absl::StatusOr<RankCoordinates> c = topology_.CoordinatesOf(rank_);
  return c.ok() ? absl::StrFormat("tp%d.cp%d.pp%d", c->tp, c->cp, c->pp) : std::string();
}

std::string RuntimeImpl::ReplicaHost() const {
  // The host as trainguard run's agents name it (the member id's), which the coordinator evicts.
  return member_ != nullptr ? store_keys::MemberHost(member_->member_id()) : HostName();
}

absl::Status RuntimeImpl::CheckReplicated(int64_t step, std::string_view name, const void* data,
                                          size_t bytes) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank_, " step ", step, ": CheckReplicated needs a buffer name"));
  }
  if (store_ == nullptr || options_.silent_corruption == "off") return absl::OkStatus();
  return CheckReplicatedFingerprint(step, name, XXH3_64bits(data, bytes));
}

void RuntimeImpl::CompareReplicasBetweenSnapshots(int64_t step) {
  if (store_ == nullptr || options_.silent_corruption == "off") return;
  if (checkpointer_ != nullptr && snapshot_unfenced_) return;  // this step's snapshot compares them
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  bool any = false;
  for (const StateBuffer& b : state_.buffers()) {
    if (!b.replicated || b.device.kind != Device::Kind::kHost) continue;
    XXH3_64bits_update(state, b.data, b.bytes);
    any = true;
  }
  const uint64_t fingerprint = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  if (!any) return;
  if (absl::Status s = CheckReplicatedFingerprint(step, "replicated buffers", fingerprint);
      !s.ok()) {
    Event event = EventOfKind(
        EventKind::kSkipped,
        absl::StrCat("comparing the replicated buffers between snapshots: ", s.message()));
    event.step = step;
    (void)EmitEvent(std::move(event));
  }
}

absl::Status RuntimeImpl::CheckReplicatedFingerprint(int64_t step, std::string_view name,
                                                     uint64_t fingerprint) {
  absl::StatusOr<std::vector<int>> group = topology_.GroupOf(rank_, ParallelDim::kData);
  if (!group.ok() || group->size() < 2) return absl::OkStatus();  // nobody to agree with
  const std::string group_name = ReplicaGroup();
  const std::string buffer(name);
  const std::string base =
      absl::StrCat("sdc/check/", generation(), "/", step, "/", buffer, "/", group_name, "/");
  const absl::Duration timeout = absl::Milliseconds(options_.rendezvous_timeout_ms);
  if (absl::Status set =
          store_->Set(absl::StrCat(base, rank_),
                      EncodeReplicaVote({rank_, group_name, ReplicaHost(), fingerprint}), timeout);
      !set.ok()) {
    return WithContext(
        set, absl::StrCat("rank ", rank_, " step ", step, ": CheckReplicated(\"", buffer, "\")"));
  }
  absl::StatusOr<int64_t> arrived = store_->Add(absl::StrCat(base, "count"), 1, timeout);
  if (!arrived.ok()) {
    return WithContext(arrived.status(), absl::StrCat("rank ", rank_, " step ", step,
                                                      ": CheckReplicated(\"", buffer, "\")"));
  }
  if (*arrived != static_cast<int64_t>(group->size())) return absl::OkStatus();
  // The group's last: every fingerprint is in.
  std::vector<std::string> keys;
  for (int r : *group) keys.push_back(absl::StrCat(base, r));
  absl::StatusOr<std::vector<std::optional<std::string>>> values = store_->MultiGet(keys, timeout);
  if (!values.ok()) return values.status();
  std::vector<ReplicaReport> reports;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!(*values)[i].has_value()) continue;
    absl::StatusOr<std::optional<ReplicaReport>> report =
        DecodeReplicaVote((*group)[i], *(*values)[i]);
    if (report.ok() && report->has_value()) reports.push_back(**report);
  }
  keys.push_back(absl::StrCat(base, "count"));
  for (const std::string& key : keys) (void)store_->Delete(key, timeout);
  std::vector<ReplicaDisagreement> judged = JudgeReplicas(reports);
  if (judged.empty()) return absl::OkStatus();
  for (ReplicaDisagreement& d : judged) {
    const size_t named = d.majority.has_value() ? d.minority.size() : 1;
    d.buffers.assign(named, std::vector<std::string>{buffer});
  }
  (void)store_->Set(store_keys::kJobSilentCorruption, VerdictRecord(base, step, judged),
                    std::min(timeout, absl::Seconds(10)));
  OnSilentCorruption(step, judged);
  return absl::OkStatus();
}

void RuntimeImpl::RequestRepair(std::string why, std::string stop) {
  MutexLock lock(&repair_mu_);
  repair_why_ = std::move(why);
  if (!stop.empty()) repair_stop_ = std::move(stop);
  repair_requested_.store(true, std::memory_order_release);
}

std::optional<std::string> RuntimeImpl::TakeRepairRequestSlow() {
  MutexLock lock(&repair_mu_);
  if (!repair_requested_.exchange(false, std::memory_order_acq_rel)) return std::nullopt;
  return std::exchange(repair_why_, std::string());
}

absl::StatusOr<std::optional<PeerBackupsOptions>> RuntimeImpl::PeerBackupOptions() {
  if (store_ == nullptr || options_.backup_copies <= 1 || topology_.num_hosts() < 2) {
    return std::nullopt;
  }
  absl::StatusOr<std::vector<EvictionClass>> classes = ParseEvictionClasses(options_.backup_evict);
  if (!classes.ok()) return WithContext(classes.status(), "backup_evict");
  std::vector<std::string> racks;
  if (!options_.backup_racks.empty()) racks = absl::StrSplit(options_.backup_racks, ',');
  absl::StatusOr<BackupPlacement> placement =
      BackupPlacement::Place(BackupPlacementSpec{.topology = topology_,
                                                 .copies = options_.backup_copies,
                                                 .classes = *classes,
                                                 .racks = racks});
  if (!placement.ok()) return placement.status();
  if (!placement->dropped().empty()) {
    Event event = EventOfKind(EventKind::kPlacementClassesDropped,
                              absl::StrCat("backup placement: ", placement->why_dropped()));
    (void)EmitEvent(std::move(event));
  }
  PeerBackupsOptions o;
  o.job_id = options_.job_id;
  o.rank = rank_;
  o.placement = *std::move(placement);
  o.host_addr = options_.host_addr;
  o.host_name = HostName();
  o.token = store_token_;
  o.rate_bytes_per_second = uint64_t{static_cast<uint32_t>(options_.backup_rate_mib_s)} << 20;
  o.memory_budget_bytes = uint64_t{static_cast<uint32_t>(options_.backup_memory_budget_mib)} << 20;
  o.timeout = std::min(absl::Milliseconds(options_.rendezvous_timeout_ms), absl::Minutes(1));
  o.env = options_.env;
  return o;
}

absl::Status RuntimeImpl::Checkpoint(int64_t resume_step) {
  if (absl::Status s = EnsureCheckpointer(); !s.ok()) return s;
  if (loss_spike_detector_.has_value()) {
    if (absl::Status s = state_.SetBlob(kLossWindowBlob, loss_spike_detector_->SaveState());
        !s.ok()) {
      return s;
    }
  }
  std::optional<bool> persist;
  const int every = options_.checkpoint_every_steps;
  if (every > 0 && resume_step % every == 0) {
    const int k = options_.checkpoint_persist_every;
    persist = k > 0 && (resume_step / every) % k == 0;
  }
  if (absl::Status s = checkpointer_->Save(resume_step, persist); !s.ok()) return s;
  snapshot_unfenced_ = true;
  last_checkpoint_ns_ = clock_->MonotonicNanos();
  return absl::OkStatus();
}

absl::Status RuntimeImpl::FenceStateBuffer(const std::string& name, absl::Duration timeout) {
  bool registered = false;
  for (const StateBuffer& buffer : state_.buffers()) registered |= buffer.name == name;
  if (!registered) {
    return absl::NotFoundError(
        absl::StrCat("rank ", rank_, ": no state buffer \"", name, "\" is registered"));
  }
  if (checkpointer_ == nullptr) return absl::OkStatus();
  return checkpointer_->snapshotter().FenceBuffer(name, timeout);
}

absl::Status RuntimeImpl::WaitForCheckpoints(absl::Duration timeout) {
  if (checkpointer_ == nullptr) return absl::OkStatus();
  snapshot_unfenced_ = false;
  return checkpointer_->WaitIdle(timeout);
}

bool RuntimeImpl::CheckpointDueAfter(int64_t step) const {
  const int every = options_.checkpoint_every_steps;
  if (every > 0 && (step + 1) % every == 0) return true;
  // The clock of the time policy starts at the first step that asks MaybeCheckpoint.
  return options_.checkpoint_every_seconds > 0 && last_checkpoint_ns_ != 0 &&
         clock_->MonotonicNanos() - last_checkpoint_ns_ >=
             int64_t{options_.checkpoint_every_seconds} * 1'000'000'000;
}

void RuntimeImpl::MaybeCheckpointSlow(int64_t step) {
  const int64_t resume = step + 1;
  if (last_checkpoint_ns_ == 0) {
    last_checkpoint_ns_ = clock_->MonotonicNanos();  // the clock starts at the first step
  }
  if (!CheckpointDueAfter(step)) return;
  if (absl::Status s = Checkpoint(resume); !s.ok()) {
    Event event = EventOfKind(EventKind::kSkipped, std::string(s.message()));
    event.step = resume;
    (void)EmitEvent(std::move(event));
  }
}

void RuntimeImpl::FenceSnapshotSlow() {
  snapshot_unfenced_ = false;
  absl::Status s = checkpointer_->Fence(absl::Milliseconds(options_.rendezvous_timeout_ms));
  if (s.ok()) return;
  Event event =
      EventOfKind(EventKind::kFenceFailed,
                  absl::StrCat("fencing the snapshot before the next step: ", s.message()));
  (void)EmitEvent(std::move(event));
}

absl::StatusOr<int64_t> RuntimeImpl::RestoreCheckpoint() {
  absl::StatusOr<RestoreResult> r = RestoreNewestCommitted();
  if (!r.ok()) return r.status();
  return r->step;
}

absl::StatusOr<RestoreResult> RuntimeImpl::RestoreNewestCommitted() {
  // A replacement's first restore creates the checkpointer (its arena, its backup service, the
  // size exchange): part of what its recovery costs, so the event says it.
  const bool first = checkpointer_ == nullptr;
  const absl::Time setup_start = clock_->Now();
  // A standby's first restore also says where its time went since it was assigned a rank.
  std::vector<std::pair<std::string, std::string>> takeover;
  if (std::optional<TakeoverTimes> t = std::exchange(takeover_, std::nullopt); t.has_value()) {
    takeover = {{"agree_us", absl::StrCat(absl::ToInt64Microseconds(t->agreed - t->assigned))},
                {"start_us", absl::StrCat(absl::ToInt64Microseconds(t->created - t->agreed))},
                {"trainer_us", absl::StrCat(absl::ToInt64Microseconds(setup_start - t->created))}};
  }
  if (absl::Status s = EnsureCheckpointer(); !s.ok()) return s;
  const absl::Duration setup = first ? clock_->Now() - setup_start : absl::ZeroDuration();
  snapshot_unfenced_ = false;
  last_restore_source_.clear();
  last_restore_skipped_.clear();
  checkpointer_->SetGeneration(generation());
  // A snapshot without the loss window (taken before the first CheckLoss) restores as an empty
  // one, not as whatever this process saved last.
  if (state_.GetBlob(kLossWindowBlob).ok()) (void)state_.SetBlob(kLossWindowBlob, "");
  absl::StatusOr<RestoreResult> r = checkpointer_->RestoreNewestCommitted();
  Event event;
  if (r.ok()) {
    event = EventOfKind(EventKind::kRestored, absl::StrCat("restored the state of step ", r->step,
                                                           " from the ", r->source));
    event.step = r->step;
    event.attributes.insert(
        event.attributes.end(),
        {{"source", r->source},
         {"fingerprint", absl::StrFormat("%016x", r->fingerprint)},
         {"skipped", absl::StrJoin(r->skipped, " | ")},
         {"setup_us", absl::StrCat(absl::ToInt64Microseconds(setup))},
         {"fetch_us", absl::StrCat(absl::ToInt64Microseconds(r->fetch_time))},
         {"copy_us", absl::StrCat(absl::ToInt64Microseconds(r->copy_time))},
         {"held_bytes", absl::StrCat(r->bytes_held)},
         {"copied_ahead", r->copied_ahead ? "true" : "false"},
         {"candidates_wait_us", absl::StrCat(absl::ToInt64Microseconds(r->candidates_wait))},
         {"restore_us", absl::StrCat(absl::ToInt64Microseconds(r->took))}});
    event.attributes.insert(event.attributes.end(), takeover.begin(), takeover.end());
  } else if (absl::IsNotFound(r.status())) {
    // A fresh job: nothing is committed yet. Not a failure.
    event = EventOfKind(EventKind::kNothingToRestore, std::string(r.status().message()));
  } else {
    event = EventOfKind(EventKind::kRestoreFailed, std::string(r.status().message()));
  }
  (void)EmitEvent(std::move(event));
  if (!r.ok()) return r.status();
  if (absl::Status s = RestoreLossWindow(r->step); !s.ok()) return s;
  accepted_losses_.clear();
  last_restore_source_ = r->source;
  last_restore_skipped_ = r->skipped;
  // Every rank holds the restored state: nothing to broadcast after a re-rendezvous.
  current_.ForgetStateSource();
  return r;
}

absl::StatusOr<int64_t> RuntimeImpl::Rollback(const StepResult& result, int64_t first_failed_step,
                                               RecoveryReport& report) {
  report.decision = "give_up";
  absl::StatusOr<int64_t> step = RestoreCheckpoint();
  if (absl::IsNotFound(step.status())) {
    // A new generation could not do better: it would start from scratch.
    return StopJob(absl::StrCat("rank ", rank(), ": step ", result.step,
                                " failed and cannot be rolled back: ", step.status().message(),
                                "; last fault: ", result.status.message()),
                   report);
  }
  if (!step.ok()) {
    return WithContext(step.status(),
                       absl::StrCat("rank ", rank(), " step ", result.step,
                                    ": rolling back after: ", result.status.message()));
  }
  report.restored_from = last_restore_source_;
  report.restore_skipped = last_restore_skipped_;
  const RecoveryPolicy::RestoreDecision d =
      recovery_policy_.OnRestored(*step, result.step, first_failed_step);
  switch (d.verdict) {
    case RecoveryPolicy::RestoreVerdict::kResume:
      report.decision = "rollback";
      return d.next_step;
    case RecoveryPolicy::RestoreVerdict::kSkipBatches:
      report.decision = "skip_batches";
      return d.next_step;
    case RecoveryPolicy::RestoreVerdict::kStopJob:
      break;
  }
  return StopJob(
      absl::StrCat("rank ", rank(), ": step ", result.step, " failed again after ",
                   d.rollbacks_before, " rollback(s) to step ", *step, " (limit ",
                   recovery_policy_.limits().max_rollbacks_per_step, ": max_rollbacks_per_step",
                   d.skipped_batches ? "; the batches up to the first failed step were skipped" : "",
                   "): the fault recurs after rollback, so the job stops; last fault: ",
                   result.status.message()),
      report);
}

void RuntimeImpl::MarkFatal(std::string reason) {
  if (fatal()) return;
  fatal_reason_ = std::move(reason);
  fatal_.store(true, std::memory_order_release);
}

absl::StatusOr<int64_t> RuntimeImpl::RecoverOnce(const StepResult& result, RecoveryReport& report) {
  const RecoveryPolicy::FaultDecision d =
      recovery_policy_.OnStepFailed(result.action, result.step, checkpointing_);
  switch (d.verdict) {
    case RecoveryPolicy::FaultVerdict::kContinue:
      report.decision = "continue";
      return result.step + 1;
    case RecoveryPolicy::FaultVerdict::kSkip:
      report.decision = "skip";
      return result.step + 1;
    case RecoveryPolicy::FaultVerdict::kRollback:
      return Rollback(result, d.first_failed_step, report);
    case RecoveryPolicy::FaultVerdict::kRollbackOff:
      report.decision = "give_up";
      return absl::UnimplementedError(
          absl::StrCat("rank ", rank(), " step ", result.step,
                       ": rollback needs a committed checkpoint, and checkpointing is off (set "
                       "checkpoint_every_steps or call Checkpoint()); last: ",
                       result.status.message()));
    case RecoveryPolicy::FaultVerdict::kStopJob:
      return StopJob(
          absl::StrCat("rank ", rank(), ": ", d.consecutive_failures,
                       " consecutive steps failed (limit ",
                       recovery_policy_.limits().max_consecutive_step_failures,
                       ": max_consecutive_step_failures), the last at step ", result.step,
                       ", and checkpointing is off, so there is nothing to roll back to; last "
                       "fault: ",
                       result.status.message()),
          report);
    case RecoveryPolicy::FaultVerdict::kReRendezvous: {
      report.decision = "give_up";
      absl::StatusOr<int64_t> next = entry_->Recover(result, report);
      if (next.ok()) report.decision = "re_rendezvous";
      return next;
    }
    case RecoveryPolicy::FaultVerdict::kFatal:
      report.decision = "give_up";
      return result.status.ok()
                 ? absl::InternalError(
                       absl::StrCat("rank ", rank(), " step ", result.step, ": fatal step result"))
                 : result.status;
    case RecoveryPolicy::FaultVerdict::kUnknown:
      break;
  }
  return absl::InternalError(absl::StrCat("rank ", rank(), " step ", result.step,
                                          ": unknown step action ",
                                          static_cast<int>(result.action)));
}

absl::StatusOr<int64_t> RuntimeImpl::recover(const StepResult& result) {
  if (result.action == StepAction::kContinue) {
    recovery_policy_.EndFailureRun();
    return result.step + 1;
  }
  RecoveryReport report;
  report.failed_step = result.step;
  std::string corruption_stop;
  {
    MutexLock lock(&repair_mu_);
    corruption_stop = std::exchange(repair_stop_, std::string());
  }
  absl::StatusOr<int64_t> next = corruption_stop.empty()
                                     ? RecoverOnce(result, report)
                                     : absl::StatusOr<int64_t>(StopJob(corruption_stop, report));
  report.status = next.status();
  report.next_step = next.ok() ? *next : -1;
  report.generation = generation();
  ReportRecovery(&result, report);
  return next;
}

void RuntimeImpl::ReportRecovery(const StepResult* result, RecoveryReport& report) {
  Event event;
  event.type = EventType::kRecoveryDecision;
  event.step = result != nullptr ? result->step : report.next_step;
  event.message = report.status.ok()
                      ? absl::StrCat(report.decision, ": resuming at step ", report.next_step)
                      : std::string(report.status.message());
  event.attributes = {{"decision", report.decision}};
  if (result != nullptr) {
    event.attributes.emplace_back("fault", std::string(FaultKindName(result->fault)));
    event.attributes.emplace_back("action", std::string(StepActionName(result->action)));
  }
  if (report.status.ok())
    event.attributes.emplace_back("next_step", absl::StrCat(report.next_step));
  if (!report.restored_from.empty())
    event.attributes.emplace_back("restored_from", report.restored_from);
  if (report.job_stopped) event.attributes.emplace_back("job_stop", "true");
  if (const std::optional<RecoveryPlan>& plan = current_.plan();
      report.joined_generation && plan.has_value()) {
    event.attributes.emplace_back("generation", absl::StrCat(generation()));
    event.attributes.emplace_back("state_source_rank", absl::StrCat(plan->state_source_rank));
    event.attributes.emplace_back("new_ranks", absl::StrJoin(plan->new_ranks, ","));
    event.attributes.emplace_back("generation_attempts", absl::StrCat(report.generation_attempts));
  }
  (void)EmitEvent(std::move(event));
  for (StepObserver* observer : observers_) observer->OnRecovery(report);
}

}  // namespace trainguard
