// HangDumpReader: reads the hang dumps a coordinator has not read yet (HangCoordinator), each
// reduced to its digest (HangDumpDigest, sdk/watchdog/hang_diagnosis.h), on a bounded pool of
// threads it owns. A job of thousands of ranks leaves thousands of dumps of a hang, and reading and
// parsing them is most of a coordinator's work on it when the ranks wrote no digests beside them
// (WriteHangDump: an older version's ranks), or when many dumps appear at once.
//
// Each dump is read as the coordinator reads it: the digest beside it when one is listed and reads
// back as the dump's rank's, else the dump itself without its records
// (ReadFlightRecorderDumpPositions).
//
// A batch (Read) is taken in order, one dump at a time by whichever thread is free, each one only
// while its deadline has not passed (the first whatever the time): the dumps taken are the batch's
// first n, and Read returns once every one of them is read. With one thread everything is read on
// the caller's, in order, as a test drives it.
//
// Thread safety: Read is called by one thread at a time (the coordinator's); `env` and `clock` are
// used from every thread of the pool, and must allow it. Not copyable.
#ifndef TRAINGUARD_SDK_COORDINATOR_HANG_DUMP_READER_H_
#define TRAINGUARD_SDK_COORDINATOR_HANG_DUMP_READER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "sdk/core/mutex.h"
#include "sdk/watchdog/hang_diagnosis.h"
#include "trainguard/clock.h"
#include "trainguard/env.h"

namespace trainguard {

class HangDumpReader {
 public:
  // One dump to read: what the listing said of it, then what reading it gave.
  struct Dump {
    std::string name;            // rank-RRRRR.N.pb
    int rank = -1;               // RRRRR
    bool digest_listed = false;  // rank-RRRRR.N.digest is listed beside it
    enum class Outcome {
      kNotRead,     // not taken: the deadline passed first
      kRead,        // `digest` holds it
      kNotADump,    // it does not parse as a flight recorder dump (DataLoss): not read again
      kUnreadable,  // vanished since the listing, or not readable now: looked for again
    };
    Outcome outcome = Outcome::kNotRead;
    std::optional<HangDumpDigest> digest;
  };

  // REQUIRES: threads >= 1; `env` and `clock` outlive the reader. threads - 1 workers (the caller
  // of Read is the other) are started by the first Read of more than one dump.
  HangDumpReader(std::string dir, Env* env, Clock* clock, int threads);
  // Stops and joins the workers.
  ~HangDumpReader();
  HangDumpReader(const HangDumpReader&) = delete;
  HangDumpReader& operator=(const HangDumpReader&) = delete;

  // Reads dumps[0], dumps[1], ... in `dir`, each taken while the clock is before `deadline` (the
  // first whatever the time), and returns how many were taken: those, a prefix of `dumps`, have
  // their outcome.
  size_t Read(std::vector<Dump>& dumps, absl::Time deadline);

 private:
  struct Batch {
    std::vector<Dump>* dumps;
    absl::Time deadline;
    size_t next = 0;      // the next to take
    bool closed = false;  // no more is taken from it
  };

  void ReadOne(Dump& dump) const;
  // The index of the next dump of the batch for the calling thread to read (counted as running);
  // nullopt when there is no batch, or it is closed, or it closes now.
  std::optional<size_t> Take() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads what it can Take of the batch, the lock released while reading.
  void Drain() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Work();  // a worker's loop, until the reader stops
  // The conditions the threads wait for.
  bool BatchOpenOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NoneRunning() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  Env* const env_;
  Clock* const clock_;
  const int threads_;
  Mutex mu_;
  Batch* batch_ ABSL_GUARDED_BY(mu_) = nullptr;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // dumps being read, by every thread
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // started by Read, joined by the destructor
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_COORDINATOR_HANG_DUMP_READER_H_
