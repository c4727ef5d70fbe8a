// Specification of the fail-slow dumps (sdk/health/fail_slow_dump.h): the coordinator's bounded history
// of every host's per-second record, written atomically around a detection, a bounded number of
// times per run, and read back by `trainguard report`.
#include "sdk/health/fail_slow_dump.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::map<std::string, std::string> Records(int64_t seq) {
  return {{"hostA", absl::StrCat("v1 ", seq, " 10 compute_ms=20 cpu_util=0.9")},
          {"hostB", absl::StrCat("v1 ", seq, " 5 compute_ms=40 cpu_util=0.5")}};
}

FailSlowDumpHeader Header(int64_t unix_second, const std::string& host) {
  FailSlowDumpHeader h;
  h.host = host;
  h.metric = "compute_ms";
  h.z = 1.5;
  h.deviation = 0.75;
  h.windows = 2;
  h.second = 42;
  h.unix_second = unix_second;
  h.action = "alert (not evicted: 0 parked standby(s) elsewhere, 2 needed)";
  return h;
}

TEST(HostMetricsHistory, KeepsOnlyTheLastSecondsItWasSizedFor) {
  HostMetricsHistory history(3);
  for (int64_t s = 1; s <= 5; ++s) history.Record(s, Records(s));
  EXPECT_EQ(history.seconds_held(), 3u);
  EXPECT_EQ(history.Lines(),
            "3 hostA v1 3 10 compute_ms=20 cpu_util=0.9\n"
            "3 hostB v1 3 5 compute_ms=40 cpu_util=0.5\n"
            "4 hostA v1 4 10 compute_ms=20 cpu_util=0.9\n"
            "4 hostB v1 4 5 compute_ms=40 cpu_util=0.5\n"
            "5 hostA v1 5 10 compute_ms=20 cpu_util=0.9\n"
            "5 hostB v1 5 5 compute_ms=40 cpu_util=0.5\n");
}

TEST(HostMetricsHistory, ASecondNotAfterTheLastIsIgnored) {
  HostMetricsHistory history(10);
  history.Record(5, Records(5));
  history.Record(5, Records(6));
  history.Record(4, Records(7));
  EXPECT_EQ(history.seconds_held(), 1u);
  EXPECT_THAT(history.Lines(), HasSubstr("5 hostA v1 5 "));
}

TEST(FailSlowDump, IsWrittenUnderItsUnixSecondAndHostAndReadsBackAsWritten) {
  testing::TempDir tmp;
  HostMetricsHistory history(120);
  for (int64_t s = 1; s <= 4; ++s) history.Record(s, Records(s));
  const std::string dir = FailSlowDumpDir(tmp.path());
  absl::StatusOr<std::string> path =
      WriteFailSlowDump(Env::Default(), dir, Header(1'700'000'123, "hostB"), history.Lines());
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, tmp.path() + "/events/fail_slow/1700000123-hostB.trace");
  // No temporary file is left beside it.
  EXPECT_THAT(*Env::Default()->GetChildren(dir), ElementsAre("1700000123-hostB.trace"));

  absl::StatusOr<std::string> text = Env::Default()->ReadFileToString(*path);
  ASSERT_TRUE(text.ok());
  // The header, then the --fail-slow-trace lines.
  EXPECT_TRUE(absl::StartsWith(
      *text,
      "# suspect_host host=hostB metric=compute_ms z=1.500 deviation=0.750 windows=2 "
      "second=42 unix=1700000123 action=alert (not evicted: 0 parked standby(s) "
      "elsewhere, 2 needed)\n1 hostA v1 1 10 compute_ms=20 cpu_util=0.9\n"))
      << *text;
  absl::StatusOr<FailSlowDump> dump = ParseFailSlowDump(*text);
  ASSERT_TRUE(dump.ok()) << dump.status();
  EXPECT_EQ(dump->header.host, "hostB");
  EXPECT_EQ(dump->header.metric, "compute_ms");
  EXPECT_DOUBLE_EQ(dump->header.z, 1.5);
  EXPECT_EQ(dump->header.windows, 2);
  EXPECT_EQ(dump->header.second, 42);
  EXPECT_EQ(dump->header.unix_second, 1'700'000'123);
  EXPECT_EQ(dump->header.action, "alert (not evicted: 0 parked standby(s) elsewhere, 2 needed)");
  ASSERT_EQ(dump->hosts.size(), 2u);
  ASSERT_EQ(dump->hosts["hostB"].size(), 4u);
  EXPECT_EQ(dump->hosts["hostB"][3].second, 4);
  EXPECT_DOUBLE_EQ(dump->hosts["hostB"][3].work, 5);
  EXPECT_DOUBLE_EQ(dump->hosts["hostB"][3].metrics["compute_ms"], 40);
  EXPECT_DOUBLE_EQ(dump->hosts["hostA"][0].metrics["cpu_util"], 0.9);
}

TEST(FailSlowDump, OnlyTheNewestDumpsAreKept) {
  testing::TempDir tmp;
  const std::string dir = FailSlowDumpDir(tmp.path());
  // Written out of order: the oldest by unix second go, whatever the order they were written in.
  for (int64_t s : {105, 101, 104, 102, 103, 100}) {
    ASSERT_TRUE(WriteFailSlowDump(Env::Default(), dir, Header(s, "h1"), "", 4).ok());
  }
  EXPECT_THAT(ListFailSlowDumps(Env::Default(), dir),
              ElementsAre(dir + "/102-h1.trace", dir + "/103-h1.trace", dir + "/104-h1.trace",
                          dir + "/105-h1.trace"));
}

// An Env whose files fail their second Append: a write that dies half-way.
class FailingSecondAppendEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = target()->NewWritableFile(path);
    if (!file.ok()) return file;
    return std::unique_ptr<WritableFile>(new Half(*std::move(file)));
  }

 private:
  class Half : public WritableFile {
   public:
    explicit Half(std::unique_ptr<WritableFile> file) : file_(std::move(file)) {}
    absl::Status Append(absl::string_view data) override {
      if (++appends_ == 2) return absl::ResourceExhaustedError("disk full (injected)");
      return file_->Append(data);
    }
    absl::Status Sync() override { return file_->Sync(); }
    absl::Status Close() override { return file_->Close(); }
    const std::string& path() const override { return file_->path(); }

   private:
    std::unique_ptr<WritableFile> file_;
    int appends_ = 0;
  };
};

TEST(FailSlowDump, AWriteThatFailsHalfWayLeavesNoFileAndNamesTheDump) {
  testing::TempDir tmp;
  FailingSecondAppendEnv env(Env::Default());
  const std::string dir = FailSlowDumpDir(tmp.path());
  absl::StatusOr<std::string> path =
      WriteFailSlowDump(&env, dir, Header(7, "hostC"), "1 hostC v1 1 1 compute_ms=1\n");
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(path.status().message(), HasSubstr(dir + "/7-hostC.trace"));
  // Neither the dump nor its temporary file: a reader never sees half a dump.
  EXPECT_TRUE(Env::Default()->GetChildren(dir)->empty());
}

TEST(FailSlowDump, ALineThatIsNoRecordIsRejectedByItsNumber) {
  absl::StatusOr<FailSlowDump> dump = ParseFailSlowDump(
      "# suspect_host host=h metric=compute_ms z=1 deviation=1 windows=1 second=2 unix=3 "
      "action=alert\n1 h v1 1 1 compute_ms=1\n2 h garbage\n");
  ASSERT_FALSE(dump.ok());
  EXPECT_EQ(dump.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(dump.status().message(), HasSubstr("line 3"));
  EXPECT_FALSE(ParseFailSlowDump("1 h v1 1 1 compute_ms=1\n").ok());  // no header
}

TEST(FailSlowDump, ListingADirectoryThatDoesNotExistGivesNone) {
  testing::TempDir tmp;
  EXPECT_TRUE(ListFailSlowDumps(Env::Default(), tmp.File("none")).empty());
}

}  // namespace
}  // namespace trainguard
