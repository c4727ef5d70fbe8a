// One job-id rule (sdk/core/job_id.h) for every component that takes a job id: an id refused by one
// is refused by all, and the longest id accepted names every shared-memory segment.
#include "sdk/core/job_id.h"

#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sdk/checkpoint/snapshotter.h"
#include "sdk/rendezvous/etcd_store.h"
#include "sdk/rendezvous/tcp_store.h"
#include "sdk/watchdog/flight_recorder.h"
#include "trainguard/checkpoint.h"
#include "trainguard/options.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

TEST(JobId, AcceptsLettersDigitsDotsUnderscoresAndDashesUpToTheLimit) {
  EXPECT_TRUE(ValidateJobId("Llama-3.1_70B.run-42").ok());
  EXPECT_TRUE(ValidateJobId(std::string(kMaxJobIdBytes, 'x')).ok());
}

TEST(JobId, RefusalsNameTheReason) {
  EXPECT_THAT(Message(ValidateJobId("")), HasSubstr("job_id must not be empty"));
  EXPECT_THAT(Message(ValidateJobId(".")), HasSubstr("job_id \".\" is not allowed"));
  EXPECT_THAT(Message(ValidateJobId("a/b")),
              HasSubstr("job_id \"a/b\" has character '/' at position 1"));
  EXPECT_THAT(Message(ValidateJobId(std::string(kMaxJobIdBytes + 1, 'x'))),
              HasSubstr("job_id has 201 characters; at most 200 are allowed"));
  // A control byte (from a peer's handshake, say) is printed escaped.
  EXPECT_THAT(Message(ValidateJobId("a\nb")),
              HasSubstr("job_id \"a\\nb\" has character '\\n' at position 1"));
}

TEST(JobId, EveryComponentRefusesTheSameIds) {
  StateRegistry registry;
  for (const std::string& id : std::vector<std::string>{"", "..", "a/b", "a:b", "a b",
                                                        std::string(kMaxJobIdBytes + 1, 'x')}) {
    SCOPED_TRACE(absl::StrCat("job id \"", id, "\""));
    Options options;
    options.job_id = id;
    EXPECT_TRUE(absl::IsInvalidArgument(options.Validate()));

    EXPECT_TRUE(absl::IsInvalidArgument(FlightRecorder::Create(id, 0, 16).status()));

    SnapshotterOptions snapshotter;
    snapshotter.job_id = id;
    EXPECT_TRUE(absl::IsInvalidArgument(Snapshotter::Create(&registry, snapshotter).status()));

    TcpStoreServerOptions server;
    server.job_tokens = {{id, "token"}};
    EXPECT_TRUE(absl::IsInvalidArgument(TcpStoreServer::Start(server).status()));

    // Refused before any connection is tried (nothing listens on port 1).
    TcpStoreOptions client;
    client.port = 1;
    client.job_id = id;
    client.job_token = "token";
    EXPECT_TRUE(absl::IsInvalidArgument(TcpStore::Connect(client).status()));

    EtcdStoreOptions etcd;
    etcd.endpoints = {"http://127.0.0.1:1"};
    etcd.job_id = id;
    EXPECT_TRUE(absl::IsInvalidArgument(EtcdStore::Connect(etcd).status()));
  }
}

TEST(JobId, TheLongestIdNamesEverySegmentAndAStoreNamespace) {
  const std::string id = [] {
    std::string prefix = absl::StrCat("jobid-", getpid(), "-");
    return prefix + std::string(kMaxJobIdBytes - prefix.size(), 'x');
  }();
  Options options;
  options.job_id = id;
  EXPECT_TRUE(options.Validate().ok());

  auto recorder = FlightRecorder::Create(id, 0, 16);
  EXPECT_TRUE(recorder.ok()) << recorder.status();

  StateRegistry registry;
  SnapshotterOptions snapshotter;
  snapshotter.job_id = id;
  auto created = Snapshotter::Create(&registry, snapshotter);
  EXPECT_TRUE(created.ok()) << created.status();
  if (created.ok()) created->reset();  // unmapped before the segment is removed
  EXPECT_TRUE(Snapshotter::RemoveArena(id, 0).ok());

  TcpStoreServerOptions server_options;
  server_options.job_tokens = {{id, "token"}};
  auto server = TcpStoreServer::Start(server_options);
  ASSERT_TRUE(server.ok()) << server.status();
  TcpStoreOptions client;
  client.port = (*server)->port();
  client.job_id = id;
  client.job_token = "token";
  client.connect_timeout = absl::Seconds(30);
  auto store = TcpStore::Connect(client);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Set("k", "v", absl::Seconds(30)).ok());
}

}  // namespace
}  // namespace trainguard
