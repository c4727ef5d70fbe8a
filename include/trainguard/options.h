// Options: everything a trainguard Runtime is configured with.
//
// Options come from three places, later ones overriding earlier ones:
//   1. the defaults below;
//   2. a text-format protobuf file (schema: sdk/proto/options.proto), named by TRAINGUARD_CONFIG or
//   passed
//      to FromTextprotoFile(), e.g.   job_id: "llama-7b"  world_size: 16  tp: 2  pp: 2
//   3. environment variables TRAINGUARD_<FIELD>, the field name in upper case, e.g.
//   TRAINGUARD_WORLD_SIZE.
//      torchrun's RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE are read when the TRAINGUARD_
//      variable is absent; when both are set and disagree, that is an error.
// An unknown TRAINGUARD_* variable, an unknown field in the file and a malformed value are errors
// that name the key and where it came from; nothing is silently ignored. docs/GUIDE.md lists every
// key.
//
// Thread safety: a plain value type.
#ifndef TRAINGUARD_OPTIONS_H_
#define TRAINGUARD_OPTIONS_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace trainguard {

class Clock;
class Env;
class Store;

struct Options {
  // Names the job: namespaces its files, shared-memory segments and store keys. 1 to 200 of
  // A-Z a-z 0-9 . _ -, and neither "." nor ".." (every component that takes a job id checks this
  // one rule).
  std::string job_id = "default";
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Ranks per host. 0 means world_size (a single-host job).
  int local_world_size = 0;
  // Parallel degrees; the data-parallel degree is world_size / (tp * cp * pp). See topology.h.
  int tp = 1;
  int cp = 1;
  int pp = 1;
  // Directory for this job's per-rank files (events, later checkpoints). Empty means
  // "$TMPDIR/trainguard/<job_id>" ("/tmp" when TMPDIR is unset).
  std::string run_dir = {};
  // recover() gives up (returns an error) after this many consecutive failed-and-skipped steps.
  int max_consecutive_step_failures = 3;
  // A fault that replaying does not cure (a NaN on every rank, a diverging learning rate):
  // recover() rolls back to the same committed step at most `max_rollbacks_per_step` times (>= 1).
  // When the fault recurs after that, `repeated_fault_action` decides: "stop" ends the job with one
  // message naming the step and the limit (published as the store key job/stop, so that the
  // launcher stops the job instead of replacing ranks); "skip" rolls back once more and resumes
  // after the step that failed first, skipping the batches from the committed step to it, and
  // stops the job if the fault recurs even then.
  int max_rollbacks_per_step = 1;
  std::string repeated_fault_action = "stop";

  // Rendezvous. Empty `store`: a static job (no rank replacement). Otherwise the job's coordination
  // service: "tcp://HOST:PORT" (a TcpStore server, e.g. hosted by `trainguard run`) or
  // "etcd://HOST:PORT[,HOST:PORT...]".
  std::string store = {};
  // A file holding the job's shared token (TcpStore authentication). Required with a tcp:// store.
  std::string store_token_file = {};
  // "rank": an initial rank (`rank` says which). "standby": a warm spare that parks until it is
  // assigned a dead rank's id (`rank` is then ignored).
  std::string role = "rank";
  // Names this process in the rendezvous; empty means "<hostname>:<pid>". No '/' or newline.
  std::string member_id = {};
  // The IPv4 address of this host that the store's connections leave from (their source address),
  // e.g. "127.0.1.3" for a host simulated on its own loopback address. Empty: the kernel's choice.
  std::string host_addr = {};
  // Bounds each rendezvous wait (joining, re-rendezvous after a failure, one period of a standby's
  // parking, which repeats until it is assigned or stopped).
  int rendezvous_timeout_ms = 300'000;
  // How often the rank's heartbeat thread writes its heartbeat to the store. 0: by the job's size,
  // 1 s up to 4,096 ranks, then world_size / 4,096 seconds, at most 5 s (16,384 ranks: 4 s), so
  // that the store takes about 4,096 rank heartbeats a second at any size.
  int heartbeat_interval_ms = 0;

  // Checkpointing (checkpoint.h, persister.h). The guard snapshots the registered state every
  // `checkpoint_every_steps` steps and/or every `checkpoint_every_seconds` seconds (0 turns a
  // trigger off; both 0: only explicit Runtime::Checkpoint() calls). Every
  // `checkpoint_persist_every`-th snapshot is also written to `checkpoint_dir` (0: arena only).
  // Empty checkpoint_dir means
  // "<run_dir>/checkpoints". Disk keeps the last `checkpoint_keep_last` committed steps.
  // `checkpoint_copy_threads` threads copy and checksum each snapshot into the arena, and verify
  // it on restore, in 1..256.
  // With GPU state the checksum (XXH3, about 8 GB/s a thread) bounds the snapshot: on an H100,
  // 4 threads reach 0.47x the device-to-host copy rate and 16 threads 0.94x
  // (docs/PERFORMANCE.md); give it the cores the trainer can spare.
  std::string checkpoint_dir = {};
  int checkpoint_every_steps = 0;
  int checkpoint_every_seconds = 0;
  int checkpoint_keep_last = 3;
  int checkpoint_persist_every = 1;
  int checkpoint_copy_threads = 4;

  // Peer backups of the in-memory snapshots (jobs that span hosts, local_world_size <
  // world_size, with a store). Every rank's snapshot is kept in `backup_copies` places in all (its
  // own arena and backup_copies - 1 ranks on other hosts, chosen by BackupPlacement so that no
  // single eviction unit of `backup_evict` removes every copy); a step is committed in memory
  // only when every rank's backups are complete, and a rank replacing a lost host restores from a
  // holder before it tries the disk. 1: no peer backups. `backup_evict`: a comma-separated list of
  // host, rack, tp, cp, dp, pp (host is always included; when no placement honours them all, the
  // last ones are dropped and the start-up event says so). `backup_racks`: one rack label per host
  // slot, comma-separated (empty: no racks). `backup_rate_mib_s`: the replication rate of one
  // rank in MiB/s (0: unlimited). `backup_memory_budget_mib`: the shared memory one host may use
  // for its ranks' arenas and the backups it holds (0: /dev/shm's size is the only limit);
  // start-up fails, naming both figures, when the footprint does not fit.
  int backup_copies = 2;
  std::string backup_evict = "host";
  std::string backup_racks = {};
  int backup_rate_mib_s = 0;
  int backup_memory_budget_mib = 0;

  // Silent data corruption (docs/GUIDE.md): with a store, the buffers registered as replicated
  // (StateBuffer::replicated) are compared across each data-parallel group at every snapshot (the
  // snapshot's own checksums, no extra pass) and a step whose replicas disagree is never
  // committed. What then: "alert" (a silent_corruption event and a line of `trainguard run`),
  // "repair" (the same, then every rank goes back to the last committed snapshot, whose replicas
  // agreed, and replays the steps since), "evict" (repair, and `trainguard run` evicts the host of
  // a rank named, as a fail-slow host), or "off" (not compared). A host named twice is handed over
  // for eviction whatever the action.
  std::string silent_corruption = "repair";
  // With silent_corruption on: every rank also runs the compute canary at each snapshot (a fixed
  // matrix product on its GPU, or its CPU (about 0.1 ms), on the checkpointer's thread) and a rank
  // whose result differs from the job's majority is named: its machine's arithmetic is wrong. 0 or
  // 1.
  int silent_corruption_canary = 1;
  // With silent_corruption on: every N steps between snapshots too, the replicated host buffers
  // are hashed (a pass over their bytes, on the training thread) and compared across each
  // data-parallel group through the store, as Step::CheckReplicated does. 0: at snapshots only.
  int silent_corruption_every_steps = 0;

  // Hang detection (watchdog.h). A phase is hung when it has run longer than its learned bound,
  // max(watchdog_floor_ms, watchdog_bound_factor_pct/100 x a high quantile of its recent
  // durations, over the last watchdog_history samples), and has stopped ticking. Until a phase has
  // watchdog_warmup_samples samples, its bound is watchdog_warmup_bound_ms. watchdog_poll_ms is the
  // monitor thread's period; 0 turns the watchdog off.
  int watchdog_poll_ms = 100;
  int watchdog_warmup_samples = 5;
  int watchdog_warmup_bound_ms = 600'000;
  int watchdog_bound_factor_pct = 300;
  int watchdog_floor_ms = 1'000;
  int watchdog_history = 200;
  // With a store: a rank publishes its progress (its last phase event or tick, and the collectives
  // it has entered) at most every watchdog_peer_progress_ms, when it changed, once a rank of its
  // generation asked for the records. A rank waiting in a collective past its bound asks the
  // peers' records first (the first of a generation asks every rank to publish, and gives their
  // first records one window to arrive), and postpones the hang while a peer that has not entered
  // that collective yet made progress within the window, 3 x watchdog_peer_progress_ms + 500 ms
  // (an RL rank still generating is slow, not hung). 0: no records, no postponement.
  int watchdog_peer_progress_ms = 200;
  // Records in the rank's shared-memory flight recorder ring (flight_recorder.h).
  int flight_recorder_records = 4'096;
  // On a hang, the rank that declared it waits this long (after publishing it through the store)
  // before it aborts its communicators: every rank dumps its ring and stacks meanwhile (the abort
  // wakes the other ranks' blocked collectives, and their stacks must show where they were
  // blocked), and a wait that ends by itself in that time (a machine-wide stall) withdraws the hang
  // (docs/GUIDE.md, "Hang detection"). It stops early when its step fails by itself. 0: abort at
  // once. Without a store the abort is immediate.
  int hang_dump_wait_ms = 1'000;
  // How long a step may go on after this rank learned that its generation was superseded (the
  // other ranks left for a newer one: its heartbeat was refused, or its generation watcher saw the
  // newer generation's table) before the process exits with Runtime::kSupersededStepExitCode, so
  // that the launcher gives its rank to a standby. A collective blocked on a peer that is gone
  // without closing its connections (a partitioned or powered-off host) may not return before its
  // own timeout, even once aborted (gloo fails only the operations of the connection that broke).
  // The launcher kills such a rank anyway once its heartbeat has been refused for
  // --heartbeat-timeout (30 s by default). Keep it above the time the launcher takes to kill a lost
  // peer, whose closed connections end the wait (a stopped rank: --host-timeout, 3 s by default, or
  // the watchdog's bound): a survivor waiting on a stopped peer would exit first, and need a
  // standby too. 0: never exit.
  int superseded_step_exit_ms = 10'000;
  // Step::CheckLoss (LossSpikeDetector, health.h): a loss more than loss_spike_mads scaled MADs
  // above the median of the last loss_spike_window accepted losses (on the log scale for positive
  // losses) fails the step, once loss_spike_warmup losses are in; a NaN or Inf loss always does.
  int loss_spike_window = 100;
  int loss_spike_mads = 8;
  int loss_spike_warmup = 20;

  // Seams for tests; not configurable from files or the environment. nullptr means the real ones.
  // REQUIRES: when set, they outlive every Runtime created from these Options.
  Env* env = nullptr;
  Clock* clock = nullptr;
  // A Store to rendezvous through instead of connecting to `store` (tests, embedders that own the
  // connection). Not owned.
  Store* store_client = nullptr;

  // Defaults, then the file named by TRAINGUARD_CONFIG (if set), then the process environment.
  static absl::StatusOr<Options> FromEnv();
  // The same from an explicit variable map (for tests and embedders); `env` reads the config file.
  static absl::StatusOr<Options> FromEnvironment(
      const std::map<std::string, std::string>& variables, Env* env = nullptr);
  // Defaults overridden by a text-format OptionsProto. `origin` names the source in error messages.
  static absl::StatusOr<Options> FromTextproto(absl::string_view text, absl::string_view origin);
  static absl::StatusOr<Options> FromTextprotoFile(const std::string& path, Env* env = nullptr);

  // Checks ranges and consistency (rank < world_size, degrees >= 1, ...). Errors name the field.
  absl::Status Validate() const;

  // run_dir, or its default when empty.
  std::string ResolvedRunDir() const;
};

}  // namespace trainguard

#endif  // TRAINGUARD_OPTIONS_H_
