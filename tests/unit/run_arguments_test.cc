// ParseRunArguments (tools/launcher.h): which --restart-all combinations `trainguard run` takes,
// and the message that names the flag when it refuses one; --host-timeout's default per store.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/launcher.h"

namespace trainguard::tools {
namespace {

using ::testing::HasSubstr;

// An agent of a 2-host job, with `extra` before the command.
std::vector<std::string> AgentArgs(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--nnodes",      "2",          "--nproc-per-node", "2",
                                   "--rdzv-endpoint", "tcp://127.0.0.1:1", "--token-file",
                                   "/token",        "--job-id",   "job",   "--host-id", "host1"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"--", "trainer"});
  return args;
}

TEST(RunArguments, RestartAllIsTakenOnOneHostWithTheLaunchersOwnStore) {
  absl::StatusOr<LaunchConfig> config =
      ParseRunArguments({"--nproc", "2", "--restart-all", "3", "--", "trainer"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->restart_all, 3);
  EXPECT_EQ(config->nnodes_min, 0);
}

TEST(RunArguments, RestartAllWithAnExternalStoreOnOneHostIsRefused) {
  absl::StatusOr<LaunchConfig> config =
      ParseRunArguments({"--nproc", "2", "--restart-all", "3", "--store", "tcp://127.0.0.1:1",
                         "--token-file", "/token", "--", "trainer"});
  ASSERT_TRUE(absl::IsInvalidArgument(config.status())) << config.status();
  EXPECT_THAT(config.status().message(),
              HasSubstr("--restart-all needs one host and the launcher's own store"));
}

TEST(RunArguments, RestartAllIsTakenByTheAgentsOfAMultiHostJob) {
  absl::StatusOr<LaunchConfig> config = ParseRunArguments(AgentArgs({"--restart-all", "100000"}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->restart_all, 100000);
  EXPECT_EQ(config->nnodes_min, 2);
  EXPECT_EQ(config->standby, 0);
}

TEST(RunArguments, RestartAllIsTakenByAStandbyHostsAgent) {
  absl::StatusOr<LaunchConfig> config =
      ParseRunArguments(AgentArgs({"--restart-all", "5", "--role", "standby"}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->standby_host);
  EXPECT_EQ(config->restart_all, 5);
}

TEST(RunArguments, RestartAllOnSeveralHostsRefusesSpareProcesses) {
  absl::StatusOr<LaunchConfig> config =
      ParseRunArguments(AgentArgs({"--restart-all", "5", "--standby", "1"}));
  ASSERT_TRUE(absl::IsInvalidArgument(config.status())) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr("no --standby spare processes"));
}

TEST(RunArguments, RestartAllOnSeveralHostsTakesNoStandbyZero) {
  absl::StatusOr<LaunchConfig> config =
      ParseRunArguments(AgentArgs({"--restart-all", "5", "--standby", "0"}));
  EXPECT_TRUE(config.ok()) << config.status();
}

TEST(RunArguments, RestartAllOnSeveralHostsRefusesPeerBackups) {
  absl::StatusOr<LaunchConfig> config =
      ParseRunArguments(AgentArgs({"--restart-all", "5", "--backup-copies", "2"}));
  ASSERT_TRUE(absl::IsInvalidArgument(config.status())) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr("no --backup-copies"));
  EXPECT_TRUE(ParseRunArguments(AgentArgs({"--restart-all", "5", "--backup-copies", "1"})).ok());
}

TEST(RunArguments, RestartAllOnSeveralHostsRefusesAJobIdTooLongForItsRounds) {
  std::vector<std::string> args = AgentArgs({"--restart-all", "5"});
  args[9] = std::string(181, 'j');  // the value of --job-id
  absl::StatusOr<LaunchConfig> config = ParseRunArguments(args);
  ASSERT_TRUE(absl::IsInvalidArgument(config.status())) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr("<job id>.round<K>"));
}

TEST(RunArguments, SparesAndPeerBackupsAreStillTakenWithoutRestartAll) {
  absl::StatusOr<LaunchConfig> config =
      ParseRunArguments(AgentArgs({"--standby", "1", "--backup-copies", "2"}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->restart_all, -1);
  EXPECT_EQ(config->standby, 1);
}

// An agent of a 2-host job meeting at an etcd cluster, with `extra` before the command.
std::vector<std::string> EtcdAgentArgs(std::vector<std::string> extra) {
  std::vector<std::string> args = {
      "--nnodes", "2",   "--nproc-per-node", "2",    "--rdzv-endpoint", "etcd://127.0.0.1:2379",
      "--job-id", "job", "--host-id",        "host1"};
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), {"--", "trainer"});
  return args;
}

// Issue 36: with 3 s, an etcd leader election under load let the coordinator's lease lapse.
TEST(RunArguments, TheHostTimeoutIsTenSecondsWithAnEtcdStoreAndThreeWithATcpStore) {
  absl::StatusOr<LaunchConfig> etcd = ParseRunArguments(EtcdAgentArgs({}));
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  EXPECT_EQ(etcd->host_timeout, absl::Seconds(10));
  absl::StatusOr<LaunchConfig> tcp = ParseRunArguments(AgentArgs({}));
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ(tcp->host_timeout, absl::Seconds(3));
  absl::StatusOr<LaunchConfig> own_store = ParseRunArguments({"--nproc", "2", "--", "trainer"});
  ASSERT_TRUE(own_store.ok()) << own_store.status();
  EXPECT_EQ(own_store->host_timeout, absl::Seconds(3));

  EXPECT_EQ(DefaultHostTimeout("etcd://10.0.0.1:2379,10.0.0.2:2379"), absl::Seconds(10));
  EXPECT_EQ(DefaultHostTimeout("tcp://10.0.0.1:29400"), absl::Seconds(3));
  EXPECT_EQ(DefaultHostTimeout(""), absl::Seconds(3));
}

TEST(RunArguments, AGivenHostTimeoutIsKeptWhateverTheStoreAndWhereverTheFlagIs) {
  absl::StatusOr<LaunchConfig> etcd = ParseRunArguments(EtcdAgentArgs({"--host-timeout", "3"}));
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  EXPECT_EQ(etcd->host_timeout, absl::Seconds(3));
  std::vector<std::string> before_the_endpoint = EtcdAgentArgs({});
  before_the_endpoint.insert(before_the_endpoint.begin(), {"--host-timeout", "2.5"});
  absl::StatusOr<LaunchConfig> first = ParseRunArguments(before_the_endpoint);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->host_timeout, absl::Milliseconds(2500));
  absl::StatusOr<LaunchConfig> tcp = ParseRunArguments(AgentArgs({"--host-timeout", "10"}));
  ASSERT_TRUE(tcp.ok()) << tcp.status();
  EXPECT_EQ(tcp->host_timeout, absl::Seconds(10));
}

// Which parked standbys take a dead rank or a dead host's ranks first (the coordinator's choice).
TEST(ChooseStandbys, OneRankTakesASpareOnItsOwnHostFirst) {
  const std::vector<std::string> parked = {"host1:9:standby0", "host2:7:standby0",
                                           "host3:5:standby0", "host3:6:standby1"};
  EXPECT_THAT(ChooseStandbys(parked, {}, "host2", 1, {"host1"}),
              ::testing::ElementsAre("host2:7:standby0"));
}

// Rank 2's backups are on host1 (and it holds host1's): with no spare on its own host, a spare on
// host1 would put the snapshot and its backup on one host, which one host fault then loses both
// of. The standby host is chosen instead, though host1's member id sorts first.
TEST(ChooseStandbys, OneRankNeverGoesToAHostSharingItsBackupsWhileAnotherHasAStandby) {
  const std::vector<std::string> parked = {"host1:9:standby0", "host3:5:standby0",
                                           "host3:6:standby1", "host4:5:standby0"};
  // Of the safe hosts, the one with the fewest parked standbys: host3 stays whole.
  EXPECT_THAT(ChooseStandbys(parked, {}, "host2", 1, {"host1"}),
              ::testing::ElementsAre("host4:5:standby0"));
  // A dead host is never chosen.
  EXPECT_THAT(ChooseStandbys(parked, {"host4"}, "host2", 1, {"host1"}),
              ::testing::ElementsAre("host3:5:standby0", "host3:6:standby1"));
  // Only unsafe hosts have standbys: no preference (the coordinator takes any, rather than fail).
  EXPECT_THAT(ChooseStandbys({"host1:9:standby0"}, {}, "host2", 1, {"host1"}),
              ::testing::IsEmpty());
  // Without peer backups nothing is unsafe: no preference either.
  EXPECT_THAT(ChooseStandbys(parked, {}, "host2", 1, {}), ::testing::IsEmpty());
}

TEST(ChooseStandbys, AHostsRanksGoToTheFullestStandbyHostInStandbyOrder) {
  const std::vector<std::string> parked = {"host1:9:standby0", "host3:6:standby1",
                                           "host3:5:standby0", "host4:5:standby0"};
  EXPECT_THAT(ChooseStandbys(parked, {}, "host2", 2, {}),
              ::testing::ElementsAre("host3:5:standby0", "host3:6:standby1"));
  EXPECT_THAT(ChooseStandbys(parked, {"host3"}, "host2", 2, {}), ::testing::IsEmpty());
}

// A rank with no host of its own to prefer a spare on (one host queues its dead ranks so) and no
// backup to keep away from gets no preference, whatever is parked: the coordinator then skips
// reading the parked standbys (Job::PreferredStandbys), and any parked standby takes it.
TEST(ChooseStandbys, ARankWithNoHostAndNothingToAvoidHasNoPreference) {
  const std::vector<std::string> parked = {"m:9:standby0", "m:9:standby1", "h3:5:standby0"};
  EXPECT_THAT(ChooseStandbys(parked, {}, "", 1, {}), ::testing::IsEmpty());
  EXPECT_THAT(ChooseStandbys(parked, {"m"}, "", 1, {}), ::testing::IsEmpty());
}

// A dead host's ranks avoid a host that runs their backup holders (or sources), when another host
// has enough standbys; a host that lost its only rank is no exception.
TEST(ChooseStandbys, AHostsRanksAvoidAHostSharingTheirBackups) {
  const std::vector<std::string> parked = {"host1:9:standby0", "host1:8:standby1",
                                           "host1:7:standby2", "host3:5:standby0",
                                           "host3:6:standby1"};
  EXPECT_THAT(ChooseStandbys(parked, {"host2"}, "host2", 2, {"host1"}),
              ::testing::ElementsAre("host3:5:standby0", "host3:6:standby1"));
  EXPECT_THAT(ChooseStandbys(parked, {"host2"}, "host2", 1, {"host1"}),
              ::testing::ElementsAre("host3:5:standby0", "host3:6:standby1"));
  // No safe host has enough: the fullest host, as without backups.
  EXPECT_THAT(ChooseStandbys(parked, {"host2"}, "host2", 3, {"host1"}),
              ::testing::ElementsAre("host1:9:standby0", "host1:8:standby1", "host1:7:standby2"));
}

// The standby index is read with the member-id codec: a restart round's standbys sort by it too,
// and a parked member that is no standby of `trainguard run` (a rank's own "<host>:<pid>", a
// malformed id) is never preferred.
TEST(ChooseStandbys, StandbysAreOrderedByTheIndexTheirIdsNameAndNoOtherMemberIsChosen) {
  const std::vector<std::string> parked = {"host3:5:round2:standby10", "host3:5:round2:standby9",
                                           "host3:5", "host3:5:rank1", "host3:5:standbyX"};
  EXPECT_THAT(ChooseStandbys(parked, {}, "host2", 2, {}),
              ::testing::ElementsAre("host3:5:round2:standby9", "host3:5:round2:standby10"));
  EXPECT_THAT(ChooseStandbys(parked, {}, "host2", 3, {}), ::testing::IsEmpty());
}

// One host and several differ in where the files go and how the agent names itself, worked out
// once (LayoutOf): one host keeps run_dir's own folders and the machine's name, sets no host address
// and serves no store it was given.
TEST(HostLayout, OneHostKeepsTheRunDirsOwnFoldersAndTheMachinesName) {
  absl::StatusOr<LaunchConfig> config = ParseRunArguments(
      {"--nproc", "2", "--store", "tcp://127.0.0.1:4000", "--token-file", "/token", "--run-dir",
       "/r", "--rendezvous-timeout", "40", "--", "trainer"});
  ASSERT_TRUE(config.ok()) << config.status();
  const HostLayout layout = LayoutOf(*config, "machine");
  EXPECT_FALSE(layout.several_hosts);
  EXPECT_EQ(layout.host_label, "machine");
  EXPECT_EQ(layout.events_file, "/r/events/launcher.tgev");
  EXPECT_EQ(layout.pid_dir, "/r/pids");
  EXPECT_EQ(layout.log_dir, "/r/logs");
  EXPECT_EQ(layout.source_address, "");
  EXPECT_EQ(layout.on_host, "");
  EXPECT_EQ(layout.host_addr, "");
  EXPECT_EQ(layout.serve_store_port, 0);
  EXPECT_EQ(layout.standby_wait, absl::Seconds(40));
  EXPECT_EQ(layout.superseded_step_exit, absl::ZeroDuration());
  EXPECT_EQ(layout.restart_scope, "every rank");
  // The store it was given may hold an earlier run's stop: this run starts afresh.
  EXPECT_TRUE(layout.clears_stale_job_keys);
  EXPECT_FALSE(layout.queues_killed_stopped_ranks);  // the kill's exit reaches it in process
  EXPECT_EQ(layout.start_line, "job " + config->job_id + ": 2 ranks, 0 standbys");
  // Its own store holds nothing of an earlier run.
  config = ParseRunArguments({"--nproc", "2", "--standby", "1", "--job-id", "j", "--", "trainer"});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(LayoutOf(*config, "machine").clears_stale_job_keys);
  EXPECT_EQ(LayoutOf(*config, "machine").start_line, "job j: 2 ranks, 1 standbys");
}

// An agent of several hosts names itself by --host-id, keeps its files in per-host folders of the
// shared run dir, and serves the tcp:// store whose endpoint is its own address.
TEST(HostLayout, AnAgentOfSeveralHostsKeepsPerHostFoldersAndServesTheStoreAtItsAddress) {
  std::vector<std::string> args = AgentArgs({"--run-dir", "/r", "--local-addr", "127.0.0.1"});
  absl::StatusOr<LaunchConfig> config = ParseRunArguments(args);
  ASSERT_TRUE(config.ok()) << config.status();
  const HostLayout layout = LayoutOf(*config, "machine");
  EXPECT_TRUE(layout.several_hosts);
  EXPECT_EQ(layout.host_label, "host1");
  EXPECT_EQ(layout.events_file, "/r/events/launcher-host1.tgev");
  EXPECT_EQ(layout.pid_dir, "/r/pids/host1");
  EXPECT_EQ(layout.log_dir, "/r/logs/host1");
  EXPECT_EQ(layout.source_address, "127.0.0.1");
  EXPECT_EQ(layout.on_host, "host1");
  EXPECT_EQ(layout.host_addr, "127.0.0.1");
  EXPECT_EQ(layout.serve_store_port, 1);
  EXPECT_EQ(layout.standby_wait, 2 * config->host_timeout + absl::Seconds(10));
  EXPECT_EQ(layout.restart_scope, "every rank on every host");
  // It may join a job whose other hosts run already: a stop in the store is theirs.
  EXPECT_FALSE(layout.clears_stale_job_keys);
  EXPECT_TRUE(layout.queues_killed_stopped_ranks);  // not waiting for its agent's report
  EXPECT_EQ(layout.start_line,
            "job job: host host1 (127.0.0.1) joined as a worker; 2 ranks per host");

  args = AgentArgs({"--local-addr", "127.0.0.2"});
  config = ParseRunArguments(args);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(LayoutOf(*config, "machine").serve_store_port, 0);  // another host serves it
}

// A step stuck in a superseded generation outlasts the kill of a stopped peer: twice
// --host-timeout once that is over the runtime's 10 s default, never less than it.
TEST(HostLayout, TheSupersededStepExitIsTwiceTheHostTimeoutOnlyAboveTheDefault) {
  absl::StatusOr<LaunchConfig> config = ParseRunArguments(AgentArgs({"--host-timeout", "5"}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(LayoutOf(*config, "m").superseded_step_exit, absl::ZeroDuration());
  config = ParseRunArguments(AgentArgs({"--host-timeout", "5.5"}));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(LayoutOf(*config, "m").superseded_step_exit, absl::Seconds(11));
}

}  // namespace
}  // namespace trainguard::tools
