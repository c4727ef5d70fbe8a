#include "sdk/core/event_log.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/proto/event.pb.h"
#include "tests/support/own_process.h"
#include "tests/support/temp_dir.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using testing::SignalOwnProcess;
using testing::TempDir;

Event MakeEvent(int64_t step) {
  Event e;
  e.time = absl::FromUnixMicros(1'700'000'000'000'000 + step);
  e.rank = 3;
  e.step = step;
  e.generation = 2;
  e.type = EventType::kStepFault;
  e.message = absl::StrCat("step ", step, " failed");
  e.attributes = {{"fault", "step_failure"}, {"what", "bad batch"}};
  return e;
}

std::vector<int64_t> Steps(const EventLogContents& contents) {
  std::vector<int64_t> steps;
  for (const Event& e : contents.events) steps.push_back(e.step);
  return steps;
}

std::string WriteEvents(const TempDir& dir, int count) {
  const std::string path = EventLogPath(dir.path(), 3);
  auto log = EventLog::Open(Env::Default(), path);
  EXPECT_TRUE(log.ok()) << log.status();
  for (int i = 0; i < count; ++i) EXPECT_TRUE((*log)->Append(MakeEvent(i)).ok());
  return path;
}

TEST(EventLog, PathIsPerRankUnderTheRunDir) {
  EXPECT_EQ(EventLogPath("/runs/job", 42), "/runs/job/events/rank-00042.tgev");
}

TEST(EventLog, JsonIsTheEventRecordInProto3JsonWithEveryCharacterEscaped) {
  Event e;
  e.time = absl::FromUnixMicros(1'700'000'000'123'456);
  e.rank = 3;
  e.step = 12;
  e.generation = 0;
  e.type = EventType::kStepFault;
  e.message = "say \"hi\"\n\tback\\slash \x01";
  e.attributes = {{"fault", "nan"}, {"duration_us", "7"}};
  absl::StatusOr<std::string> json = EventToJson(e);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(*json,
            R"({"time_unix_micros":"1700000000123456","rank":3,"step":"12","generation":"0",)"
            R"("type":3,"message":"say \"hi\"\n\tback\\slash \u0001",)"
            R"("attributes":[{"key":"fault","value":"nan"},{"key":"duration_us","value":"7"}]})");
}

TEST(EventLog, AppendedEventsReadBackWithEveryField) {
  TempDir dir;
  const std::string path = WriteEvents(dir, 3);
  auto contents = ReadEventLog(Env::Default(), path);
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_TRUE(contents->tail.ok()) << contents->tail;
  ASSERT_EQ(contents->events.size(), 3u);
  const Event& e = contents->events[1];
  EXPECT_EQ(e.time, MakeEvent(1).time);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.step, 1);
  EXPECT_EQ(e.generation, 2);
  EXPECT_EQ(e.type, EventType::kStepFault);
  EXPECT_EQ(e.message, "step 1 failed");
  EXPECT_EQ(e.Attribute("what"), "bad batch");
  EXPECT_EQ(e.Attribute("absent"), "");
}

TEST(EventLog, TextThatIsNotUtf8IsWrittenReadablyWithReplacementCharacters) {
  // A rank's reason cut to a byte budget inside gloo's closing emoji: proto3 would write it and
  // then refuse to parse the record, and every later event of the file with it.
  TempDir dir;
  const std::string path = EventLogPath(dir.path(), 3);
  auto log = EventLog::Open(Env::Default(), path);
  ASSERT_TRUE(log.ok()) << log.status();
  Event cut = MakeEvent(1);
  cut.message = "Connection closed by peer. GLHF! \xf0\x9f\x8f\x96\xef\xb8";
  cut.attributes = {{"why", "\xff"}};
  ASSERT_TRUE((*log)->Append(MakeEvent(0)).ok());
  ASSERT_TRUE((*log)->Append(cut).ok());
  ASSERT_TRUE((*log)->Append(MakeEvent(2)).ok());
  auto contents = ReadEventLog(Env::Default(), path);
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_TRUE(contents->tail.ok()) << contents->tail;
  EXPECT_THAT(Steps(*contents), ::testing::ElementsAre(0, 1, 2));
  EXPECT_EQ(contents->events[1].message,
            "Connection closed by peer. GLHF! \xf0\x9f\x8f\x96\xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(contents->events[1].Attribute("why"), "\xef\xbf\xbd");
}

TEST(EventLog, ARecordAnOlderWriterWroteWithTextThatIsNotUtf8IsReadWithItsTextMadeValid) {
  TempDir dir;
  const std::string path = EventLogPath(dir.path(), 3);
  {
    auto log = EventLog::Open(Env::Default(), path);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Append(MakeEvent(0)).ok());
  }
  // Such a record framed as the file format frames it (docs/FORMATS.md), as the older writer did.
  proto::EventBytes old;
  old.set_step(1);
  old.set_rank(3);
  old.set_message("cut: \xf0\x9f");
  proto::AttributeBytes* a = old.add_attributes();
  a->set_key("what");
  a->set_value("restart_all");
  const std::string payload = old.SerializeAsString();
  std::string record(8, '\0');
  const uint32_t length = static_cast<uint32_t>(payload.size());
  const uint32_t checksum = XXH32(payload.data(), payload.size(), 0);
  for (int i = 0; i < 4; ++i) {
    record[i] = static_cast<char>((length >> (8 * i)) & 0xff);
    record[4 + i] = static_cast<char>((checksum >> (8 * i)) & 0xff);
  }
  record += payload;
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    out << record;
  }
  {
    auto log = EventLog::Open(Env::Default(), path);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE((*log)->Append(MakeEvent(2)).ok());
  }
  auto contents = ReadEventLog(Env::Default(), path);
  ASSERT_TRUE(contents.ok()) << contents.status();
  ASSERT_TRUE(contents->tail.ok()) << contents->tail;
  EXPECT_THAT(Steps(*contents), ::testing::ElementsAre(0, 1, 2));
  EXPECT_EQ(contents->events[1].message, "cut: \xef\xbf\xbd\xef\xbf\xbd");
  EXPECT_EQ(contents->events[1].Attribute("what"), "restart_all");
}

TEST(EventLog, ReopeningAppendsAfterExistingRecords) {
  TempDir dir;
  const std::string path = WriteEvents(dir, 2);
  auto log = EventLog::Open(Env::Default(), path);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ((*log)->set_aside_path(), "");
  ASSERT_TRUE((*log)->Append(MakeEvent(2)).ok());
  EXPECT_THAT(Steps(*ReadEventLog(Env::Default(), path)), ::testing::ElementsAre(0, 1, 2));
}

TEST(EventLog, EveryTruncationOfTheFinalRecordIsReportedAsATornTail) {
  TempDir dir;
  const std::string path = WriteEvents(dir, 3);
  const std::string full = *Env::Default()->ReadFileToString(path);
  const uint64_t two_records = [&] {
    TempDir other;
    return *Env::Default()->GetFileSize(WriteEvents(other, 2));
  }();
  for (uint64_t size = two_records + 1; size < full.size(); ++size) {
    ASSERT_TRUE(Env::Default()->TruncateFile(path, size).ok());
    auto contents = ReadEventLog(Env::Default(), path);
    ASSERT_TRUE(contents.ok()) << "size " << size << ": " << contents.status();
    EXPECT_EQ(contents->events.size(), 2u) << "size " << size;
    EXPECT_TRUE(absl::IsDataLoss(contents->tail)) << "size " << size;
    EXPECT_THAT(contents->tail.message(), HasSubstr(absl::StrCat("offset ", two_records)));
    EXPECT_THAT(contents->tail.message(), HasSubstr(path));
    ASSERT_TRUE((*Env::Default()->NewWritableFile(path))->Append(full).ok());
  }
}

TEST(EventLog, OpenSavesATornTailAsideSoLaterRecordsStayReadable) {
  TempDir dir;
  const std::string path = WriteEvents(dir, 3);
  const std::string full = *Env::Default()->ReadFileToString(path);
  ASSERT_TRUE(Env::Default()->TruncateFile(path, full.size() - 5).ok());
  const std::string torn = *Env::Default()->ReadFileToString(path);
  auto log = EventLog::Open(Env::Default(), path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ((*log)->set_aside_path(), path + ".torn");
  const std::string saved = *Env::Default()->ReadFileToString(path + ".torn");
  EXPECT_EQ(*Env::Default()->ReadFileToString(path) + saved, torn) << "no byte was lost";
  ASSERT_TRUE((*log)->Append(MakeEvent(10)).ok());
  auto contents = ReadEventLog(Env::Default(), path);
  ASSERT_TRUE(contents.ok());
  EXPECT_TRUE(contents->tail.ok()) << contents->tail;
  EXPECT_THAT(Steps(*contents), ::testing::ElementsAre(0, 1, 10));
}

TEST(EventLog, ATornHeaderIsRewritten) {
  TempDir dir;
  const std::string path = dir.File("events/rank-00000.tgev");
  ASSERT_TRUE(Env::Default()->CreateDirs(dir.File("events")).ok());
  ASSERT_TRUE((*Env::Default()->NewWritableFile(path))->Append("TGEV").ok());
  EXPECT_TRUE(absl::IsDataLoss(ReadEventLog(Env::Default(), path)->tail));
  auto log = EventLog::Open(Env::Default(), path);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE((*log)->Append(MakeEvent(0)).ok());
  EXPECT_EQ(ReadEventLog(Env::Default(), path)->events.size(), 1u);
}

TEST(EventLog, ABadHeaderIsDataLossAndOpenSavesTheFileAsideBeforeStartingAnew) {
  TempDir dir;
  const std::string path = dir.File("not-events");
  ASSERT_TRUE((*Env::Default()->NewWritableFile(path))->Append("PK\x03\x04 a zip file").ok());
  auto contents = ReadEventLog(Env::Default(), path);
  EXPECT_TRUE(absl::IsDataLoss(contents.status()));
  EXPECT_THAT(contents.status().message(), HasSubstr("bad header"));
  auto log = EventLog::Open(Env::Default(), path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ((*log)->set_aside_path(), path + ".corrupt");
  EXPECT_EQ(*Env::Default()->ReadFileToString(path + ".corrupt"), "PK\x03\x04 a zip file");
  ASSERT_TRUE((*log)->Append(MakeEvent(0)).ok());
  EXPECT_EQ(ReadEventLog(Env::Default(), path)->events.size(), 1u);
}

TEST(EventLog, ACorruptRecordBeforeTheEndIsNeverCutAway) {
  TempDir dir;
  const std::string path = WriteEvents(dir, 3);
  std::string data = *Env::Default()->ReadFileToString(path);
  data[20] = static_cast<char>(data[20] ^ 0x10);  // inside the first record's payload
  ASSERT_TRUE((*Env::Default()->NewWritableFile(path))->Append(data).ok());
  auto contents = ReadEventLog(Env::Default(), path);
  EXPECT_TRUE(absl::IsDataLoss(contents.status()));
  EXPECT_THAT(contents.status().message(), HasSubstr("checksum mismatch at offset 8"));
  auto log = EventLog::Open(Env::Default(), path);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(*Env::Default()->ReadFileToString((*log)->set_aside_path()), data);
}

TEST(EventLog, AFlippedByteAnywhereIsNeverReadAsValid) {
  TempDir dir;
  const std::string path = WriteEvents(dir, 3);
  const std::string good = *Env::Default()->ReadFileToString(path);
  for (size_t i = 0; i < good.size(); ++i) {
    for (unsigned char mask : {0x01, 0x80}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      ASSERT_TRUE((*Env::Default()->NewWritableFile(path))->Append(bad).ok());
      auto contents = ReadEventLog(Env::Default(), path);
      const bool clean = contents.ok() && contents->tail.ok();
      EXPECT_FALSE(clean) << "flip of byte " << i << " went unnoticed";
      if (!contents.ok()) {
        EXPECT_TRUE(absl::IsDataLoss(contents.status())) << contents.status();
        EXPECT_THAT(contents.status().message(), HasSubstr("offset"));
      }
    }
  }
}

TEST(EventLog, AHugeLengthFieldBeforeTheEndIsCorruptionNotAnAllocation) {
  TempDir dir;
  const std::string path = WriteEvents(dir, 2);
  std::string data = *Env::Default()->ReadFileToString(path);
  data[8] = data[9] = data[10] = data[11] = '\x7f';  // first record's length: ~2 GiB
  ASSERT_TRUE((*Env::Default()->NewWritableFile(path))->Append(data).ok());
  auto contents = ReadEventLog(Env::Default(), path);
  EXPECT_TRUE(absl::IsDataLoss(contents.status()));
  EXPECT_THAT(contents.status().message(), HasSubstr("offset 8"));
}

TEST(EventLog, ConcurrentAppendsAllLandIntact) {
  TempDir dir;
  const std::string path = EventLogPath(dir.path(), 0);
  auto log = EventLog::Open(Env::Default(), path);
  ASSERT_TRUE(log.ok());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i)
        ASSERT_TRUE((*log)->Append(MakeEvent(t * kPerThread + i)).ok());
    });
  }
  for (std::thread& t : threads) t.join();
  auto contents = ReadEventLog(Env::Default(), path);
  ASSERT_TRUE(contents.ok());
  EXPECT_TRUE(contents->tail.ok());
  std::vector<int64_t> steps = Steps(*contents);
  std::sort(steps.begin(), steps.end());
  ASSERT_EQ(steps.size(), size_t{kThreads * kPerThread});
  for (int i = 0; i < kThreads * kPerThread; ++i) EXPECT_EQ(steps[i], i);
}

// A real kill -9 of a process in the middle of appending: every record before the kill is intact
// and in order, and the file can be appended to afterwards.
TEST(EventLog, AWriterKilledWithSigkillLeavesEveryEarlierRecordReadable) {
  TempDir dir;
  const std::string path = EventLogPath(dir.path(), 0);
  for (int trial = 0; trial < 5; ++trial) {
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto log = EventLog::Open(Env::Default(), path);
      if (!log.ok()) _exit(3);
      int64_t base = (*ReadEventLog(Env::Default(), path)).events.size();
      for (int64_t i = base;; ++i) {
        if (!(*log)->Append(MakeEvent(i)).ok()) _exit(4);
      }
    }
    const uint64_t target = 4096 * (trial + 1) + 97 * trial;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      auto size = Env::Default()->GetFileSize(path);
      if (size.ok() && *size > target) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_EQ(SignalOwnProcess(child, SIGKILL), absl::OkStatus());
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer exited by itself: " << status;
    auto log = EventLog::Open(Env::Default(), path);  // cuts a torn tail, if the kill made one
    ASSERT_TRUE(log.ok()) << log.status();
  }
  auto contents = ReadEventLog(Env::Default(), path);
  ASSERT_TRUE(contents.ok()) << contents.status();
  EXPECT_TRUE(contents->tail.ok()) << contents->tail;
  ASSERT_GT(contents->events.size(), 100u);
  for (size_t i = 0; i < contents->events.size(); ++i)
    ASSERT_EQ(contents->events[i].step, int64_t(i));
}

// An Env whose files fail after writing part of a record, as a disk that fills up mid-write does.
class ShortWriteEnv : public EnvWrapper {
 public:
  using EnvWrapper::EnvWrapper;
  bool fail_writes = false;

  absl::StatusOr<std::unique_ptr<WritableFile>> NewAppendableFile(
      const std::string& path) override {
    auto file = EnvWrapper::NewAppendableFile(path);
    if (!file.ok()) return file;
    return std::unique_ptr<WritableFile>(new ShortWriteFile(std::move(*file), &fail_writes));
  }

 private:
  class ShortWriteFile : public WritableFile {
   public:
    ShortWriteFile(std::unique_ptr<WritableFile> base, const bool* fail)
        : base_(std::move(base)), fail_(fail) {}
    absl::Status Append(absl::string_view data) override {
      if (!*fail_) return base_->Append(data);
      (void)base_->Append(data.substr(0, data.size() / 2));
      return absl::ResourceExhaustedError(
          absl::StrCat("write ", base_->path(), ": No space left on device"));
    }
    absl::Status Sync() override { return base_->Sync(); }
    absl::Status Close() override { return base_->Close(); }
    const std::string& path() const override { return base_->path(); }

   private:
    std::unique_ptr<WritableFile> base_;
    const bool* fail_;
  };
};

TEST(EventLog, AFullDiskMidRecordFailsTheAppendAndLosesNoEarlierRecord) {
  TempDir dir;
  ShortWriteEnv env(Env::Default());
  const std::string path = EventLogPath(dir.path(), 0);
  auto log = EventLog::Open(&env, path);
  ASSERT_TRUE(log.ok());
  ASSERT_TRUE((*log)->Append(MakeEvent(0)).ok());
  env.fail_writes = true;
  absl::Status s = (*log)->Append(MakeEvent(1));
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
  auto contents = ReadEventLog(&env, path);
  ASSERT_TRUE(contents.ok());
  EXPECT_EQ(contents->events.size(), 1u);
  EXPECT_TRUE(absl::IsDataLoss(contents->tail));
  env.fail_writes = false;
  log->reset();
  auto reopened = EventLog::Open(&env, path);
  ASSERT_TRUE(reopened.ok());
  ASSERT_TRUE((*reopened)->Append(MakeEvent(2)).ok());
  EXPECT_THAT(Steps(*ReadEventLog(&env, path)), ::testing::ElementsAre(0, 2));
}

}  // namespace
}  // namespace trainguard
