// The POSIX implementation of Env. Every error names the operation, the path and errno's text.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "sdk/core/human_bytes.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

// Where glibc's shm_open keeps the segment "/<name>": the file /dev/shm/<name>.
constexpr char kShmDir[] = "/dev/shm";

absl::Status PosixError(absl::string_view operation, absl::string_view path, int error) {
  return ErrnoToStatus(error, absl::StrCat(operation, " ", path));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override { (void)Close(); }

  absl::Status Append(absl::string_view data) override {
    if (fd_ < 0)
      return absl::FailedPreconditionError(absl::StrCat("append to closed file ", path_));
    const char* p = data.data();
    size_t left = data.size();
    while (left > 0) {
      ssize_t n = ::write(fd_, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        return PosixError("write", path_, errno);
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat("sync of closed file ", path_));
    if (::fdatasync(fd_) != 0) return PosixError("fdatasync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    if (fd_ < 0) return absl::OkStatus();
    int fd = fd_;
    fd_ = -1;
    // The descriptor is released even when close() reports an error, so it is never retried.
    if (::close(fd) != 0) return PosixError("close", path_, errno);
    return absl::OkStatus();
  }

  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  int fd_;
};

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    return Open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    return Open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC);
  }

  absl::StatusOr<std::string> ReadFileToString(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path, errno);
    std::string contents;
    char buffer[1 << 16];
    while (true) {
      ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n < 0) {
        if (errno == EINTR) continue;
        int error = errno;
        ::close(fd);
        return PosixError("read", path, error);
      }
      if (n == 0) break;
      contents.append(buffer, static_cast<size_t>(n));
    }
    ::close(fd);
    return contents;
  }

  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("stat", path, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  bool FileExists(const std::string& path) override { return ::access(path.c_str(), F_OK) == 0; }

  absl::Status CreateDirs(const std::string& path) override {
    if (path.empty()) return absl::InvalidArgumentError("create directory: empty path");
    // Create each prefix in turn; EEXIST from a concurrent creator is fine.
    for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
      std::string prefix = path.substr(0, slash);
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return PosixError("mkdir", prefix, errno);
      }
      if (slash == std::string::npos) break;
    }
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("stat", path, errno);
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("mkdir ", path, ": exists and is not a directory"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> GetChildren(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError("opendir", dir, errno);
    std::vector<std::string> names;
    while (dirent* entry = ::readdir(d)) {
      std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(std::move(name));
    }
    ::closedir(d);
    return names;
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("unlink", path, errno);
    return absl::OkStatus();
  }

  absl::Status RenameFile(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError("rename", absl::StrCat(from, " -> ", to), errno);
    }
    return absl::OkStatus();
  }

  absl::Status TruncateFile(const std::string& path, uint64_t size) override {
    if (::truncate(path.c_str(), static_cast<off_t>(size)) != 0) {
      return PosixError("truncate", path, errno);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PosixError("open directory", dir, errno);
    int rc = ::fsync(fd);
    int error = errno;
    ::close(fd);
    if (rc != 0) return PosixError("fsync directory", dir, error);
    return absl::OkStatus();
  }

  absl::StatusOr<OpenedFile> OpenForPreallocatedWrite(const std::string& path,
                                                      uint64_t bytes) override {
    constexpr int kFlags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
    OpenedFile file{::open(path.c_str(), kFlags | O_DIRECT, 0644), true};
    if (file.fd < 0 && errno == EINVAL) {
      WarnBufferedOnce(path);
      file = {::open(path.c_str(), kFlags, 0644), false};
    }
    if (file.fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
    // Preallocated, so the writes neither extend the file nor allocate blocks.
    if (::fallocate(file.fd, 0, 0, static_cast<off_t>(bytes)) != 0 && errno != EOPNOTSUPP) {
      const int error = errno;
      ::close(file.fd);
      ::unlink(path.c_str());
      return ErrnoToStatus(error, absl::StrCat("fallocate ", path, " (", bytes, " bytes)"));
    }
    return file;
  }

  absl::StatusOr<OpenedFile> OpenForDirectRead(const std::string& path) override {
    OpenedFile file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT), true};
    if (file.fd < 0 && errno == EINVAL) file = {::open(path.c_str(), O_RDONLY | O_CLOEXEC), false};
    if (file.fd < 0) return ErrnoToStatus(errno, absl::StrCat("open ", path));
    return file;
  }

  absl::StatusOr<int> OpenSharedMemory(const std::string& name, bool writable) override {
    const int fd = ::shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("shm_open ", name));
    return fd;
  }

  absl::StatusOr<int> CreateSharedMemory(const std::string& name) override {
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) return ErrnoToStatus(errno, absl::StrCat("shm_open (create) ", name));
    // shm_open applies the umask; the mode is part of the segments' contract.
    if (::fchmod(fd, 0600) != 0) {
      const int error = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      return ErrnoToStatus(error, absl::StrCat("fchmod ", name));
    }
    return fd;
  }

  absl::Status ReserveSharedMemory(int fd, const std::string& name, uint64_t bytes) override {
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("ftruncate ", name, " to ", bytes, " bytes"));
    }
    if (int error = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
      // Where the segment lives, and what its file system holds: the size to give /dev/shm (or
      // a smaller state to ask for).
      std::string where = absl::StrCat(kShmDir, name);
      struct statvfs fs;
      if (::fstatvfs(fd, &fs) == 0) {
        absl::StrAppend(&where, "; its file system holds ",
                        HumanBytes(static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize), ", ",
                        HumanBytes(static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize), " free");
      }
      return ErrnoToStatus(error,
                           absl::StrCat("posix_fallocate of ", bytes, " bytes (", HumanBytes(bytes),
                                        ") for shared-memory segment ", name, " (", where, ")"));
    }
    return absl::OkStatus();
  }

  absl::Status RemoveSharedMemory(const std::string& name) override {
    if (::shm_unlink(name.c_str()) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("shm_unlink ", name));
    }
    return absl::OkStatus();
  }

  absl::Status RenameSharedMemory(const std::string& from, const std::string& to) override {
    // shm_open names are files under /dev/shm on Linux; RENAME_NOREPLACE so that a segment
    // another process created under `to` meanwhile is never replaced.
    const std::string source = absl::StrCat(kShmDir, "/", absl::StripPrefix(from, "/"));
    const std::string target = absl::StrCat(kShmDir, "/", absl::StripPrefix(to, "/"));
    if (::renameat2(AT_FDCWD, source.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("rename shared memory ", from, " to ", to));
    }
    return absl::OkStatus();
  }

 private:
  // Where O_DIRECT is refused (tmpfs: EINVAL), shards are written buffered + fdatasync; said once.
  static void WarnBufferedOnce(const std::string& path) {
    static std::atomic<bool> warned{false};
    if (warned.exchange(true)) return;
    std::fprintf(stderr,
                 "trainguard: O_DIRECT refused for %s (EINVAL): checkpoint shards are written "
                 "buffered + fdatasync\n",
                 path.c_str());
  }

  static absl::StatusOr<std::unique_ptr<WritableFile>> Open(const std::string& path, int flags) {
    int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return PosixError("open", path, errno);
    return std::make_unique<PosixWritableFile>(path, fd);
  }
};

}  // namespace

absl::Status ErrnoToStatus(int error, absl::string_view message) {
  std::string text = absl::StrCat(message, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(text);
    case EEXIST:
      return absl::AlreadyExistsError(text);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(text);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
      return absl::ResourceExhaustedError(text);
    default:
      return absl::InternalError(text);
  }
}

Env* Env::Default() {
  static Env* const env = new PosixEnv();  // never destroyed: may be used until exit
  return env;
}

}  // namespace trainguard
