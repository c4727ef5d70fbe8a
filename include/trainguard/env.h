// Env: the file-system seam of trainguard.
//
// The SDK never calls the OS file API directly: it goes through an Env, in the manner of LevelDB.
// Tests wrap the default Env in an EnvWrapper subclass and inject faults (a full disk, a failing
// fsync, a short write) without touching production code. Every error names the path and the
// operation.
//
// Thread safety: Env::Default() and every method of an Env may be called concurrently. A
// WritableFile is not thread-safe: one owner uses it at a time.
#ifndef TRAINGUARD_ENV_H_
#define TRAINGUARD_ENV_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace trainguard {

// The Status for a failed system call: `message` (which names the operation and what it acted on)
// followed by ": " and strerror(error). ENOENT is NotFound, EEXIST AlreadyExists, EACCES and EPERM
// PermissionDenied, ENOSPC, EDQUOT and ENOMEM ResourceExhausted (a full disk or /dev/shm), anything
// else Internal.
absl::Status ErrnoToStatus(int error, absl::string_view message);

// A file opened for sequential writing. Close() is called by the destructor if the owner did not
// call it; call it explicitly to see its error.
class WritableFile {
 public:
  WritableFile() = default;
  WritableFile(const WritableFile&) = delete;
  WritableFile& operator=(const WritableFile&) = delete;
  virtual ~WritableFile() = default;

  // Writes all of `data` at the end of the file, retrying short writes and EINTR.
  virtual absl::Status Append(absl::string_view data) = 0;
  // Forces the data to the storage device (fdatasync).
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
  virtual const std::string& path() const = 0;
};

// A file descriptor an Env opened for positioned I/O that the caller issues itself (io_uring,
// pwritev, pread): checkpoint shards. The caller owns `fd` and closes it.
struct OpenedFile {
  int fd = -1;
  bool direct = false;  // opened O_DIRECT (false where the file system refuses it, e.g. tmpfs)
};

class Env {
 public:
  virtual ~Env() = default;

  // Creates `path`, truncating an existing file.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Opens `path` for appending, creating it if it does not exist.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) = 0;
  virtual absl::StatusOr<std::string> ReadFileToString(const std::string& path) = 0;
  // NotFound when the path does not exist.
  virtual absl::StatusOr<uint64_t> GetFileSize(const std::string& path) = 0;
  virtual bool FileExists(const std::string& path) = 0;
  // Creates `path` and its missing parents; OK when it exists already.
  virtual absl::Status CreateDirs(const std::string& path) = 0;
  // The names (not paths) of the entries of `dir`, without "." and "..", in no particular order.
  virtual absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Atomically replaces `to` with `from` (rename(2)).
  virtual absl::Status RenameFile(const std::string& from, const std::string& to) = 0;
  virtual absl::Status TruncateFile(const std::string& path, uint64_t size) = 0;
  // Makes a rename or file creation inside `dir` durable (fsync on the directory).
  virtual absl::Status SyncDir(const std::string& dir) = 0;

  // Creates or truncates `path` for writing a checkpoint shard, O_DIRECT where the file system
  // allows it, and reserves `bytes` for it (fallocate), so that a full disk fails here, before
  // any write, with ResourceExhausted naming the path; the file is then removed again.
  virtual absl::StatusOr<OpenedFile> OpenForPreallocatedWrite(const std::string& path,
                                                              uint64_t bytes) = 0;
  // Opens `path` read-only, O_DIRECT where the file system allows it.
  virtual absl::StatusOr<OpenedFile> OpenForDirectRead(const std::string& path) = 0;

  // Named POSIX shared-memory segments (shm_open): the snapshot arena and the flight-recorder
  // ring. The caller owns the descriptor it gets, maps it and closes it.
  // Opens an existing segment; NotFound when there is none.
  virtual absl::StatusOr<int> OpenSharedMemory(const std::string& name, bool writable) = 0;
  // Creates `name`, mode 0600 whatever the umask; AlreadyExists when it exists.
  virtual absl::StatusOr<int> CreateSharedMemory(const std::string& name) = 0;
  // Sizes the segment behind `fd` to `bytes` and reserves its memory, so that a full /dev/shm
  // fails here (ResourceExhausted) rather than with SIGBUS at a later store into the mapping.
  virtual absl::Status ReserveSharedMemory(int fd, const std::string& name, uint64_t bytes) = 0;
  // NotFound when there is no such segment.
  virtual absl::Status RemoveSharedMemory(const std::string& name) = 0;
  // Gives segment `from` the name `to`; AlreadyExists (nothing renamed) when `to` exists. Open
  // descriptors and mappings of the segment stay valid.
  virtual absl::Status RenameSharedMemory(const std::string& from, const std::string& to) = 0;

  // The POSIX file system. Never deleted.
  static Env* Default();
};

// Forwards every call to another Env. Subclass it and override the calls a test wants to break.
class EnvWrapper : public Env {
 public:
  // REQUIRES: `target` outlives this wrapper.
  explicit EnvWrapper(Env* target) : target_(target) {}
  Env* target() const { return target_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return target_->NewWritableFile(path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    return target_->NewAppendableFile(path);
  }
  absl::StatusOr<std::string> ReadFileToString(const std::string& path) override {
    return target_->ReadFileToString(path);
  }
  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    return target_->GetFileSize(path);
  }
  bool FileExists(const std::string& path) override { return target_->FileExists(path); }
  absl::Status CreateDirs(const std::string& path) override { return target_->CreateDirs(path); }
  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    return target_->GetChildren(dir);
  }
  absl::Status RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    return target_->RenameFile(from, to);
  }
  absl::Status TruncateFile(const std::string& path, uint64_t size) override {
    return target_->TruncateFile(path, size);
  }
  absl::Status SyncDir(const std::string& dir) override { return target_->SyncDir(dir); }
  absl::StatusOr<OpenedFile> OpenForPreallocatedWrite(const std::string& path,
                                                      uint64_t bytes) override {
    return target_->OpenForPreallocatedWrite(path, bytes);
  }
  absl::StatusOr<OpenedFile> OpenForDirectRead(const std::string& path) override {
    return target_->OpenForDirectRead(path);
  }
  absl::StatusOr<int> OpenSharedMemory(const std::string& name, bool writable) override {
    return target_->OpenSharedMemory(name, writable);
  }
  absl::StatusOr<int> CreateSharedMemory(const std::string& name) override {
    return target_->CreateSharedMemory(name);
  }
  absl::Status ReserveSharedMemory(int fd, const std::string& name, uint64_t bytes) override {
    return target_->ReserveSharedMemory(fd, name, bytes);
  }
  absl::Status RemoveSharedMemory(const std::string& name) override {
    return target_->RemoveSharedMemory(name);
  }
  absl::Status RenameSharedMemory(const std::string& from, const std::string& to) override {
    return target_->RenameSharedMemory(from, to);
  }

 private:
  Env* const target_;
};

}  // namespace trainguard

#endif  // TRAINGUARD_ENV_H_
