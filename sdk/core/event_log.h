// EventLog: the append-only writer of one rank's event file (format: include/trainguard/events.h
// and docs/FORMATS.md).
//
// Thread safety: Append may be called from any thread.
#ifndef TRAINGUARD_SDK_CORE_EVENT_LOG_H_
#define TRAINGUARD_SDK_CORE_EVENT_LOG_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sdk/core/mutex.h"
#include "trainguard/events.h"

namespace trainguard {

class Env;
class WritableFile;

// Append-only writer of one rank's event file. Not copyable.
class EventLog {
 public:
  // Opens (creating it and its directory if needed) the event file at `path` for appending. An
  // existing file is validated first. A torn final record is moved to "<path>.torn" and cut off; a
  // corrupt file (bad header, or a bad record before the end) is copied whole to "<path>.corrupt"
  // and a new log is started, because a damaged log must not stop training. set_aside_path() says
  // where the bytes went.
  static absl::StatusOr<std::unique_ptr<EventLog>> Open(Env* env, const std::string& path);

  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  ~EventLog();

  // Serializes and writes one record; the bytes reach the OS before it returns (they survive a kill
  // of the process, not a power loss). Errors name the path.
  absl::Status Append(const Event& event);

  const std::string& path() const { return path_; }
  // Where Open() saved a torn tail or a corrupt file; empty when the file was clean.
  const std::string& set_aside_path() const { return set_aside_path_; }

 private:
  EventLog(std::string path, std::unique_ptr<WritableFile> file, std::string set_aside_path);

  const std::string path_;
  const std::string set_aside_path_;
  Mutex mu_;
  std::unique_ptr<WritableFile> file_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_CORE_EVENT_LOG_H_
