#include <algorithm>
#include <string>

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using testing::TempDir;
using ::testing::UnorderedElementsAre;

TEST(PosixEnv, WrittenAndAppendedDataReadsBack) {
  TempDir dir;
  Env* env = Env::Default();
  const std::string path = dir.File("data");
  {
    auto file = env->NewWritableFile(path);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->Append("hello ").ok());
    ASSERT_TRUE((*file)->Sync().ok());
    ASSERT_TRUE((*file)->Close().ok());
  }
  {
    auto file = env->NewAppendableFile(path);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE((*file)->Append("world").ok());
  }
  EXPECT_EQ(*env->ReadFileToString(path), "hello world");
  EXPECT_EQ(*env->GetFileSize(path), 11u);
}

TEST(PosixEnv, NewWritableFileTruncatesAnExistingFile) {
  TempDir dir;
  Env* env = Env::Default();
  const std::string path = dir.File("data");
  ASSERT_TRUE((*env->NewWritableFile(path))->Append("long old contents").ok());
  ASSERT_TRUE((*env->NewWritableFile(path))->Append("new").ok());
  EXPECT_EQ(*env->ReadFileToString(path), "new");
}

TEST(PosixEnv, CreateDirsMakesParentsAndIsIdempotent) {
  TempDir dir;
  Env* env = Env::Default();
  const std::string nested = dir.File("a/b/c");
  ASSERT_TRUE(env->CreateDirs(nested).ok());
  ASSERT_TRUE(env->CreateDirs(nested).ok());
  EXPECT_TRUE(env->FileExists(nested));
  ASSERT_TRUE(env->SyncDir(nested).ok());
}

TEST(PosixEnv, CreateDirsOverARegularFileFailsNamingThePath) {
  TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE((*env->NewWritableFile(dir.File("file")))->Close().ok());
  absl::Status s = env->CreateDirs(dir.File("file/sub"));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(dir.File("file")));
}

TEST(PosixEnv, ErrorsNameTheOperationAndThePath) {
  TempDir dir;
  Env* env = Env::Default();
  auto missing = env->ReadFileToString(dir.File("missing"));
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_THAT(missing.status().message(), HasSubstr("open " + dir.File("missing")));
  EXPECT_TRUE(absl::IsNotFound(env->GetFileSize(dir.File("missing")).status()));
  EXPECT_TRUE(absl::IsNotFound(env->RemoveFile(dir.File("missing"))));
  EXPECT_FALSE(env->FileExists(dir.File("missing")));
}

TEST(PosixEnv, AFullDeviceIsResourceExhaustedNamingThePath) {
  Env* env = Env::Default();
  if (!env->FileExists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  auto file = env->NewWritableFile("/dev/full");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::Status s = (*file)->Append(std::string(4096, 'x'));
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("/dev/full"));
}

// More than /dev/shm holds (tmpfs refuses a reservation beyond its size at once, without filling
// it): the error names the segment and its file, the bytes asked for (also as a person reads them),
// what the file system holds and has free, and the errno's text.
TEST(PosixEnv, ASharedMemoryReservationThatCannotFitNamesTheSegmentItsSizeAndTheFreeSpace) {
  Env* env = Env::Default();
  const std::string name = absl::StrCat("/trainguard.env-test-", getpid(), ".rank0");
  absl::StatusOr<int> fd = env->CreateSharedMemory(name);
  ASSERT_TRUE(fd.ok()) << fd.status();
  const uint64_t too_much = uint64_t{1} << 50;  // 1 PiB
  absl::Status s = env->ReserveSharedMemory(*fd, name, too_much);
  close(*fd);
  (void)env->RemoveSharedMemory(name);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("posix_fallocate of ", too_much,
                                     " bytes (1024.00 TiB) for shared-memory segment ", name,
                                     " (/dev/shm", name, "; its file system holds ")));
  EXPECT_THAT(std::string(s.message()), ContainsRegex(" free\\): No space left on device$"));
}

// A standby's spare becomes a rank's arena by this rename; it must never replace an arena that is
// already there (another process's snapshot).
TEST(PosixEnv, ASharedMemoryRenameKeepsTheSegmentsBytesAndNeverReplacesTheTarget) {
  Env* env = Env::Default();
  const std::string from = absl::StrCat("/trainguard.env-test-", getpid(), ".spare.pid1");
  const std::string to = absl::StrCat("/trainguard.env-test-", getpid(), ".rank1");
  const std::string taken = absl::StrCat("/trainguard.env-test-", getpid(), ".rank2");
  for (const std::string& name : {from, taken}) {
    absl::StatusOr<int> fd = env->CreateSharedMemory(name);
    ASSERT_TRUE(fd.ok()) << fd.status();
    ASSERT_EQ(write(*fd, name.data(), name.size()), static_cast<ssize_t>(name.size()));
    close(*fd);
  }
  absl::Status refused = env->RenameSharedMemory(from, taken);
  EXPECT_TRUE(absl::IsAlreadyExists(refused)) << refused;
  ASSERT_TRUE(env->RenameSharedMemory(from, to).ok());
  EXPECT_TRUE(absl::IsNotFound(env->OpenSharedMemory(from, false).status()));
  absl::StatusOr<int> fd = env->OpenSharedMemory(to, false);
  ASSERT_TRUE(fd.ok()) << fd.status();
  std::string bytes(from.size(), '\0');
  EXPECT_EQ(read(*fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  close(*fd);
  EXPECT_EQ(bytes, from);
  absl::StatusOr<int> other = env->OpenSharedMemory(taken, false);
  ASSERT_TRUE(other.ok());
  std::string kept(taken.size(), '\0');
  EXPECT_EQ(read(*other, kept.data(), kept.size()), static_cast<ssize_t>(kept.size()));
  close(*other);
  EXPECT_EQ(kept, taken);
  (void)env->RemoveSharedMemory(to);
  (void)env->RemoveSharedMemory(taken);
}

TEST(PosixEnv, RenameReplacesTheTargetAndChildrenAreListed) {
  TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE((*env->NewWritableFile(dir.File("new")))->Append("new").ok());
  ASSERT_TRUE((*env->NewWritableFile(dir.File("old")))->Append("old").ok());
  ASSERT_TRUE(env->RenameFile(dir.File("new"), dir.File("old")).ok());
  EXPECT_EQ(*env->ReadFileToString(dir.File("old")), "new");
  EXPECT_THAT(*env->GetChildren(dir.path()), UnorderedElementsAre("old"));
}

TEST(PosixEnv, TruncateShortensAFile) {
  TempDir dir;
  Env* env = Env::Default();
  ASSERT_TRUE((*env->NewWritableFile(dir.File("f")))->Append("0123456789").ok());
  ASSERT_TRUE(env->TruncateFile(dir.File("f"), 4).ok());
  EXPECT_EQ(*env->ReadFileToString(dir.File("f")), "0123");
}

TEST(PosixEnv, WritingAClosedFileIsAnErrorNotACrash) {
  TempDir dir;
  auto file = Env::Default()->NewWritableFile(dir.File("f"));
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition((*file)->Append("x")));
  EXPECT_TRUE(absl::IsFailedPrecondition((*file)->Sync()));
}

}  // namespace
}  // namespace trainguard
