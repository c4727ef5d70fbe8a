#include "sdk/coordinator/hang_dump_reader.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "sdk/watchdog/flight_recorder.h"

namespace trainguard {
namespace {

// How long one wait of a reading thread lasts before it checks again.
constexpr absl::Duration kIdleSlice = absl::Seconds(1);

}  // namespace

HangDumpReader::HangDumpReader(std::string dir, Env* env, Clock* clock, int threads)
    : dir_(std::move(dir)), env_(env), clock_(clock), threads_(threads) {}

HangDumpReader::~HangDumpReader() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) worker.join();
}

void HangDumpReader::ReadOne(Dump& dump) const {
  // The rank's digest of its dump, written beside it (WriteHangDump), when it is there and reads
  // back as this rank's: a few kilobytes, where the dump is its whole ring.
  if (dump.digest_listed) {
    absl::StatusOr<HangDumpDigest> digest =
        ReadHangDumpDigest(absl::StrCat(dir_, "/", HangDumpDigestPath(dump.name)), env_);
    if (digest.ok() && digest->rank == dump.rank) {
      dump.digest = *std::move(digest);
      dump.outcome = Dump::Outcome::kRead;
      return;
    }
  }
  // Without its records: only their positions are kept (HangDumpDigest).
  absl::StatusOr<FlightRecorderDumpPositions> read =
      ReadFlightRecorderDumpPositions(absl::StrCat(dir_, "/", dump.name), env_);
  if (read.ok()) {
    dump.digest = DigestHangDump(*read);
    dump.outcome = Dump::Outcome::kRead;
  } else {
    dump.outcome =
        absl::IsDataLoss(read.status()) ? Dump::Outcome::kNotADump : Dump::Outcome::kUnreadable;
  }
}

std::optional<size_t> HangDumpReader::Take() {
  if (batch_ == nullptr || batch_->closed) return std::nullopt;
  if (batch_->next >= batch_->dumps->size() ||
      (batch_->next > 0 && clock_->Now() >= batch_->deadline)) {
    batch_->closed = true;
    return std::nullopt;
  }
  ++running_;
  return batch_->next++;
}

void HangDumpReader::Drain() {
  while (std::optional<size_t> i = Take()) {
    // Each thread writes only the dump it took; the caller reads them once none is running.
    Dump& dump = (*batch_->dumps)[*i];
    mu_.Unlock();
    ReadOne(dump);
    mu_.Lock();
    if (--running_ == 0) {
      // Released once more, so that a caller waiting for none to run re-checks now: a waiter
      // re-checks when the mutex is released (Mutex::Unlock), and this thread's next wait
      // releases it without telling anyone.
      mu_.Unlock();
      mu_.Lock();
    }
  }
}

bool HangDumpReader::BatchOpenOrStopping() const {
  return stopping_ || (batch_ != nullptr && !batch_->closed);
}

bool HangDumpReader::NoneRunning() const { return running_ == 0; }

void HangDumpReader::Work() {
  MutexLock lock(&mu_);
  while (true) {
    // Idle until a batch has dumps to take, or the reader stops (its destructor), in bounded
    // slices: an idle thread has nothing else to give up.
    while (!mu_.AwaitWithTimeout(
        [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return BatchOpenOrStopping(); }, kIdleSlice)) {
    }
    if (stopping_) break;
    Drain();
  }
}

size_t HangDumpReader::Read(std::vector<Dump>& dumps, absl::Time deadline) {
  if (dumps.empty()) return 0;
  // Started at the first batch they can share: every agent has a coordinator's hang watch, and
  // most never read a dump.
  if (workers_.empty() && dumps.size() > 1) {
    for (int i = 1; i < threads_; ++i) workers_.emplace_back([this] { Work(); });
  }
  Batch batch{&dumps, deadline};
  MutexLock lock(&mu_);
  batch_ = &batch;  // the workers wake to it
  Drain();
  // Closed now: the dumps the workers took are read once none is running (each read is one file's,
  // as the caller's own are, so each slice ends with one).
  while (!mu_.AwaitWithTimeout([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return NoneRunning(); },
                               kIdleSlice)) {
  }
  batch_ = nullptr;
  return batch.next;
}

}  // namespace trainguard
