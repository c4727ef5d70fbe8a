// SimCluster (tests/support/sim_cluster.h): simulated hosts made of Linux namespaces, and network
// partitions made with nftables, for the multi-host tests of `trainguard run`. Needs root: where
// namespaces are not permitted, Create() fails and so do these tests.
#include "tests/support/sim_cluster.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace trainguard::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kDeadline = absl::Seconds(10);
// How long a connect across a partition is given to (wrongly) succeed. On loopback an allowed
// connect completes at once; a dropped SYN is retransmitted only after a second.
constexpr absl::Duration kDroppedConnectWait = absl::Milliseconds(300);

std::unique_ptr<SimCluster> MakeCluster() {
  absl::StatusOr<std::unique_ptr<SimCluster>> cluster = SimCluster::Create();
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

SimCluster::HostSpec Host(const std::string& hostname, std::vector<std::string> argv) {
  return {.hostname = hostname, .argv = std::move(argv), .env = {}, .log_path = ""};
}

SimCluster::HostSpec Sleeper(const std::string& hostname) {
  return Host(hostname, {"/bin/sleep", "1000"});
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A listening TCP socket on `address`, port chosen by the kernel.
struct Listener {
  int fd = -1;
  int port = 0;
  ~Listener() {
    if (fd >= 0) close(fd);
  }
};

sockaddr_in SocketAddress(const std::string& address, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.c_str(), &a.sin_addr);
  return a;
}

void Listen(const std::string& address, Listener* listener) {
  listener->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener->fd, 0) << std::strerror(errno);
  sockaddr_in a = SocketAddress(address, 0);
  ASSERT_EQ(bind(listener->fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0)
      << "bind " << address << ": " << std::strerror(errno);
  ASSERT_EQ(listen(listener->fd, 64), 0) << std::strerror(errno);
  socklen_t length = sizeof(a);
  ASSERT_EQ(getsockname(listener->fd, reinterpret_cast<sockaddr*>(&a), &length), 0);
  listener->port = ntohs(a.sin_port);
}

// Whether a TCP connect from `from` to `to`:`port` completes within `wait`.
bool Connects(const std::string& from, const std::string& to, int port, absl::Duration wait) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in source = SocketAddress(from, 0);
  sockaddr_in target = SocketAddress(to, port);
  bool connected = false;
  if (bind(fd, reinterpret_cast<sockaddr*>(&source), sizeof(source)) == 0) {
    if (connect(fd, reinterpret_cast<sockaddr*>(&target), sizeof(target)) == 0) {
      connected = true;
    } else if (errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      int error = -1;
      socklen_t length = sizeof(error);
      connected = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(wait))) == 1 &&
                  getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 && error == 0;
    }
  }
  close(fd);
  return connected;
}

TEST(SimCluster, AHostHasItsOwnHostnameAndItsAddressInTheEnvironment) {
  TempDir dir;
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->StartHost(2, {.hostname = "host2",
                                   .argv = {"/bin/sh", "-c", "hostname; echo $TG_SIM_HOST_ADDR $K"},
                                   .env = {"K=from-the-spec"},
                                   .log_path = dir.File("host2.log")}),
            absl::OkStatus());
  absl::StatusOr<int> status = cluster->WaitHost(2, kDeadline);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  EXPECT_EQ(ReadFile(dir.File("host2.log")), "host2\n127.0.1.2 from-the-spec\n");

  ASSERT_EQ(cluster->StartHost(3, Sleeper("host3")), absl::OkStatus());
  EXPECT_EQ(cluster->RunInHost(3, {"/bin/hostname"}, kDeadline).value_or("?"), "host3\n");
  char own[256] = {};
  gethostname(own, sizeof(own) - 1);
  EXPECT_NE(std::string(own), "host3");
}

TEST(SimCluster, AHostsNameResolvesToItsOwnAddress) {
  // As on a real host, where torch's gloo binds to the address its hostname resolves to.
  const std::string machines = ReadFile("/etc/hosts");
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->StartHost(3, Sleeper("host3")), absl::OkStatus());
  ASSERT_EQ(cluster->StartHost(4, Sleeper("host4")), absl::OkStatus());
  EXPECT_EQ(cluster->RunInHost(3, {"/usr/bin/getent", "hosts", "host3"}, kDeadline)
                .value_or("?")
                .substr(0, 10),
            "127.0.1.3 ");
  EXPECT_EQ(
      cluster->RunInHost(4, {"/bin/grep", "-c", "^127.0.0.1\tlocalhost$", "/etc/hosts"}, kDeadline)
          .value_or("?"),
      "1\n");
  // The staged file is gone from the host's /tmp, and this machine's /etc/hosts is untouched.
  EXPECT_EQ(cluster
                ->RunInHost(4, {"/bin/sh", "-c", "test -e /tmp/.tg-sim-etc-hosts || echo gone"},
                            kDeadline)
                .value_or("?"),
            "gone\n");
  EXPECT_FALSE(cluster->RunInHost(3, {"/usr/bin/getent", "hosts", "host4"}, kDeadline).ok());
  EXPECT_EQ(ReadFile("/etc/hosts"), machines);
}

TEST(SimCluster, WaitHostReturnsTheCommandsExitCodeOrSignal) {
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->StartHost(1, Host("h1", {"/bin/sh", "-c", "exit 7"})), absl::OkStatus());
  ASSERT_EQ(cluster->StartHost(2, Host("h2", {"/bin/sh", "-c", "kill -TERM $$"})),
            absl::OkStatus());
  absl::StatusOr<int> exited = cluster->WaitHost(1, kDeadline);
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 7) << *exited;
  absl::StatusOr<int> killed = cluster->WaitHost(2, kDeadline);
  ASSERT_TRUE(killed.ok()) << killed.status();
  EXPECT_TRUE(WIFSIGNALED(*killed) && WTERMSIG(*killed) == SIGTERM) << *killed;
  EXPECT_FALSE(cluster->Running(1));
}

TEST(SimCluster, WaitHostOnARunningHostTimesOut) {
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->StartHost(1, Sleeper("h1")), absl::OkStatus());
  EXPECT_EQ(cluster->WaitHost(1, absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(cluster->Running(1));
}

TEST(SimCluster, StartHostRefusesABadNumberAHostAlreadyRunningAndACommandThatCannotRun) {
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  EXPECT_EQ(cluster->StartHost(0, Sleeper("h0")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cluster->StartHost(255, Sleeper("h255")).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(cluster->StartHost(1, Sleeper("h1")), absl::OkStatus());
  const absl::Status again = cluster->StartHost(1, Sleeper("h1"));
  EXPECT_EQ(again.code(), absl::StatusCode::kInvalidArgument) << again;
  EXPECT_THAT(again.message(), HasSubstr("already running"));
  const absl::Status missing = cluster->StartHost(2, Host("h2", {"/nonexistent/trainguard"}));
  EXPECT_THAT(missing.message(), HasSubstr("execve of the command: ENOENT")) << missing;
  EXPECT_FALSE(cluster->Running(2));
}

TEST(SimCluster, FilesInDevShmAndTmpOfAHostAreInvisibleToTheTestAndToOtherHostsAndVanishWithIt) {
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->StartHost(2, Sleeper("host2")), absl::OkStatus());
  ASSERT_EQ(cluster->StartHost(3, Sleeper("host3")), absl::OkStatus());
  const std::string name = absl::StrCat("tg-sim-cluster-test-", getpid());
  absl::StatusOr<std::string> wrote = cluster->RunInHost(
      2,
      {"/bin/sh", "-c", absl::StrCat("echo shm > /dev/shm/", name, " && echo tmp > /tmp/", name)},
      kDeadline);
  ASSERT_TRUE(wrote.ok()) << wrote.status();
  EXPECT_EQ(cluster->RunInHost(2, {"/bin/cat", "/dev/shm/" + name, "/tmp/" + name}, kDeadline)
                .value_or("?"),
            "shm\ntmp\n");

  EXPECT_NE(access(("/dev/shm/" + name).c_str(), F_OK), 0);
  EXPECT_NE(access(("/tmp/" + name).c_str(), F_OK), 0);
  for (const char* dir : {"/dev/shm", "/tmp"}) {
    absl::StatusOr<std::string> listed = cluster->RunInHost(3, {"/bin/ls", "-A", dir}, kDeadline);
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_THAT(*listed, Not(HasSubstr(name))) << dir;
  }

  // A host started again after a kill is a rebooted machine: its memory and /tmp are empty.
  ASSERT_TRUE(cluster->KillHost(2).ok());
  ASSERT_EQ(cluster->StartHost(2, Sleeper("host2")), absl::OkStatus());
  // (Only the test's own checkout is there, when it lives under /tmp: see the next test.)
  std::string kept;
  for (const std::string& tree : trainguard::testing::sim_cluster_internal::TmpTreesToKeep({})) {
    absl::StrAppend(&kept, tree.substr(5), "\n");
  }
  EXPECT_EQ(cluster->RunInHost(2, {"/bin/ls", "-A", "/dev/shm", "/tmp"}, kDeadline).value_or("?"),
            absl::StrCat("/dev/shm:\n\n/tmp:\n", kept));
}

TEST(SimCluster, ATmpTreeNamedInTheHostsEnvironmentOrArgvIsSharedAtItsOwnPath) {
  // A checkout under /tmp (`git clone . /tmp/x && .ci/run`) must stay visible to the hosts: the
  // binaries and run directories they are given live in it.
  const std::string tree = absl::StrCat("/tmp/tg-sim-cluster-kept-", getpid());
  const std::string other = absl::StrCat("/tmp/tg-sim-cluster-private-", getpid());
  ASSERT_EQ(mkdir(tree.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(other.c_str(), 0755), 0);
  {
    std::unique_ptr<SimCluster> cluster = MakeCluster();
    ASSERT_NE(cluster, nullptr);
    SimCluster::HostSpec spec = Sleeper("host2");
    spec.env.push_back("TG_PROBE_DIR=" + tree + "/run");
    ASSERT_EQ(cluster->StartHost(2, spec), absl::OkStatus());
    absl::StatusOr<std::string> wrote = cluster->RunInHost(
        2, {"/bin/sh", "-c", absl::StrCat("echo from-host2 > ", tree, "/probe && ls -A ", other)},
        kDeadline);
    EXPECT_FALSE(wrote.ok()) << "a /tmp tree the host was not given is visible: " << *wrote;
    absl::StatusOr<std::string> shared = cluster->RunInHost(
        2, {"/bin/sh", "-c", absl::StrCat("echo from-host2 > ", tree, "/probe")}, kDeadline);
    ASSERT_TRUE(shared.ok()) << shared.status();
    EXPECT_EQ(ReadFile(tree + "/probe"), "from-host2\n");
  }
  unlink((tree + "/probe").c_str());
  rmdir(tree.c_str());
  rmdir(other.c_str());
}

TEST(SimCluster, KillHostEndsEveryProcessOfTheHostAtOnce) {
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  ASSERT_EQ(cluster->StartHost(
                2, Host("host2", {"/bin/sh", "-c", "sleep 1000 & sleep 1000 & exec sleep 1000"})),
            absl::OkStatus());
  // Inside, its /proc is its own: it lists the three sleeps (and the init, the command's parent).
  const std::vector<std::string> list_sleeps = {
      "/bin/sh", "-c", "cd /proc && for p in [0-9]*; do cat $p/comm; done | grep -c '^sleep$'"};
  std::string sleeping;
  for (absl::Time end = absl::Now() + kDeadline; absl::Now() < end && sleeping != "3\n";) {
    sleeping = cluster->RunInHost(2, list_sleeps, kDeadline).value_or("?");
    if (sleeping != "3\n") absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(sleeping, "3\n");
  const std::vector<pid_t> before = cluster->Processes(2);
  EXPECT_EQ(before.size(), 4u) << "the init and three sleeps";

  absl::StatusOr<absl::Time> killed_at = cluster->KillHost(2);
  ASSERT_TRUE(killed_at.ok()) << killed_at.status();
  EXPECT_LE(*killed_at, absl::Now());
  EXPECT_FALSE(cluster->Running(2));
  EXPECT_TRUE(cluster->Processes(2).empty());
  absl::StatusOr<int> status = cluster->WaitHost(2, kDeadline);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << *status;
  EXPECT_EQ(cluster->RunInHost(2, {"/bin/true"}, kDeadline).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cluster->KillHost(2).status().code(), absl::StatusCode::kFailedPrecondition);
}

// The pids, in this process's view, of every live process whose PID namespace is `id`.
std::vector<pid_t> ProcessesInPidNamespace(const sim_cluster_internal::NamespaceId& id) {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (const dirent* entry = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    sim_cluster_internal::NamespaceId of;
    char state = 0;
    pid_t parent = 0;
    // A zombie is dead: it waits only for whoever inherited it (here, the machine's init) to reap
    // it.
    if (pid > 0 &&
        sim_cluster_internal::StatNamespace(absl::StrCat("/proc/", pid, "/ns/pid"), &of) &&
        of == id && own_process_internal::ReadStat(pid, &state, &parent) && state != 'Z') {
      pids.push_back(pid);
    }
  }
  closedir(proc);
  return pids;
}

TEST(SimCluster, HostsDieWithATestProcessThatCrashesWithoutTearingDown) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const pid_t crashing_test = fork();
  ASSERT_GE(crashing_test, 0) << std::strerror(errno);
  if (crashing_test == 0) {  // the test process is single-threaded here: the child may use the heap
    close(pipe_fds[0]);
    sim_cluster_internal::NamespaceId id;
    absl::StatusOr<std::unique_ptr<SimCluster>> cluster = SimCluster::Create();
    if (cluster.ok() && (*cluster)->StartHost(2, Sleeper("host2")).ok() &&
        sim_cluster_internal::StatNamespace(
            absl::StrCat("/proc/", (*cluster)->InitPid(2), "/ns/pid"), &id)) {
      (void)!write(pipe_fds[1], &id, sizeof(id));
    }
    _exit(0);  // no destructor runs: the crash
  }
  close(pipe_fds[1]);
  sim_cluster_internal::NamespaceId host;
  const ssize_t got = read(pipe_fds[0], &host, sizeof(host));
  close(pipe_fds[0]);
  ASSERT_TRUE(
      sim_cluster_internal::ReapBefore(crashing_test, absl::Now() + kDeadline, "the crashing test")
          .ok());
  ASSERT_EQ(got, static_cast<ssize_t>(sizeof(host))) << "the child could not start its host";
  std::vector<pid_t> left = ProcessesInPidNamespace(host);
  for (absl::Time end = absl::Now() + kDeadline; !left.empty() && absl::Now() < end;) {
    absl::SleepFor(absl::Milliseconds(5));
    left = ProcessesInPidNamespace(host);
  }
  EXPECT_TRUE(left.empty()) << left.size() << " processes of the host outlived the test";
}

TEST(SimCluster, HostsShareTheClustersNetwork) {
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  Listener server;
  ASSERT_NO_FATAL_FAILURE(Listen(SimCluster::Address(2), &server));
  ASSERT_EQ(cluster->StartHost(3, Sleeper("host3")), absl::OkStatus());
  // /proc/net/tcp lists the listening sockets of the reader's network namespace, little-endian
  // hex: 127.0.1.2 is 0201007F.
  absl::StatusOr<std::string> sockets =
      cluster->RunInHost(3, {"/bin/cat", "/proc/net/tcp"}, kDeadline);
  ASSERT_TRUE(sockets.ok()) << sockets.status();
  EXPECT_THAT(*sockets, HasSubstr(absl::StrFormat("0201007F:%04X", server.port)));
}

TEST(SimCluster, PartitionDropsTrafficBetweenTwoAddressesUntilHealAll) {
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  const std::string a2 = SimCluster::Address(2), a3 = SimCluster::Address(3),
                    a4 = SimCluster::Address(4);
  Listener server2, server3;
  ASSERT_NO_FATAL_FAILURE(Listen(a2, &server2));
  ASSERT_NO_FATAL_FAILURE(Listen(a3, &server3));
  EXPECT_TRUE(Connects(a3, a2, server2.port, kDeadline));

  ASSERT_EQ(cluster->Partition(2, 3), absl::OkStatus());
  EXPECT_FALSE(Connects(a3, a2, server2.port, kDroppedConnectWait))
      << cluster->Rules().value_or("");
  EXPECT_FALSE(Connects(a2, a3, server3.port, kDroppedConnectWait));
  EXPECT_TRUE(Connects(a4, a2, server2.port, kDeadline)) << "only 2 and 3 are cut from each other";
  EXPECT_TRUE(Connects(a4, a3, server3.port, kDeadline));

  ASSERT_EQ(cluster->HealAll(), absl::OkStatus());
  EXPECT_TRUE(Connects(a3, a2, server2.port, kDeadline));
  EXPECT_TRUE(Connects(a2, a3, server3.port, kDeadline));
  EXPECT_EQ(cluster->Partition(2, 0).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SimCluster, RunInNetworkShapesTheClustersLoopbackAndNeverTheMachines) {
  const std::vector<std::string> show = {"/usr/sbin/tc", "qdisc", "show", "dev", "lo"};
  absl::StatusOr<sim_cluster_internal::Captured> machine_before = sim_cluster_internal::RunCaptured(
      show, sim_cluster_internal::EnvironmentWith({}), {}, false, kDeadline);
  ASSERT_TRUE(machine_before.ok()) << machine_before.status();
  {
    std::unique_ptr<SimCluster> cluster = MakeCluster();
    ASSERT_NE(cluster, nullptr);
    ASSERT_TRUE(cluster
                    ->RunInNetwork({"/usr/sbin/tc", "qdisc", "add", "dev", "lo", "root", "handle",
                                    "1:", "htb", "default", "10"},
                                   kDeadline)
                    .ok());
    EXPECT_THAT(cluster->RunInNetwork(show, kDeadline).value_or(""), HasSubstr("htb 1:"));
    absl::StatusOr<std::string> unknown = cluster->RunInNetwork(
        {"/usr/sbin/tc", "qdisc", "add", "dev", "no-such-device", "root", "htb"}, kDeadline);
    EXPECT_FALSE(unknown.ok());
    EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("no-such-device"));
  }
  absl::StatusOr<sim_cluster_internal::Captured> machine_after = sim_cluster_internal::RunCaptured(
      show, sim_cluster_internal::EnvironmentWith({}), {}, false, kDeadline);
  ASSERT_TRUE(machine_after.ok()) << machine_after.status();
  EXPECT_EQ(machine_after->out, machine_before->out);
}

TEST(SimCluster, IsolateCutsAnAddressFromEveryOtherUntilHealAll) {
  std::unique_ptr<SimCluster> cluster = MakeCluster();
  ASSERT_NE(cluster, nullptr);
  const std::string a2 = SimCluster::Address(2), a3 = SimCluster::Address(3),
                    a4 = SimCluster::Address(4);
  Listener server2, server3;
  ASSERT_NO_FATAL_FAILURE(Listen(a2, &server2));
  ASSERT_NO_FATAL_FAILURE(Listen(a3, &server3));

  ASSERT_EQ(cluster->Isolate(2), absl::OkStatus());
  EXPECT_FALSE(Connects(a3, a2, server2.port, kDroppedConnectWait))
      << cluster->Rules().value_or("");
  EXPECT_FALSE(Connects("127.0.0.1", a2, server2.port, kDroppedConnectWait));
  EXPECT_FALSE(Connects(a2, a3, server3.port, kDroppedConnectWait));
  EXPECT_TRUE(Connects(a2, a2, server2.port, kDeadline)) << "a host still reaches itself";
  EXPECT_TRUE(Connects(a4, a3, server3.port, kDeadline)) << "the rest of the cluster is whole";

  ASSERT_EQ(cluster->HealAll(), absl::OkStatus());
  EXPECT_TRUE(Connects(a3, a2, server2.port, kDeadline));
  EXPECT_TRUE(Connects(a2, a3, server3.port, kDeadline));
}

// `nft list tables` run in the network namespace `netns` (an open /proc/.../ns/net).
std::string NftTablesIn(int netns) {
  absl::StatusOr<sim_cluster_internal::Captured> listed = sim_cluster_internal::RunCaptured(
      {"/usr/sbin/nft", "list", "tables"}, sim_cluster_internal::EnvironmentWith({}),
      {{netns, CLONE_NEWNET}}, false, kDeadline);
  if (!listed.ok()) return listed.status().ToString();
  return listed->out + listed->err;
}

TEST(SimCluster, TheClustersNetworkIsPrivateToTheTestAndGoesAwayWithIt) {
  sim_cluster_internal::NamespaceId original, inside, after;
  ASSERT_TRUE(sim_cluster_internal::StatNamespace("/proc/thread-self/ns/net", &original));
  const int original_fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(original_fd, 0) << std::strerror(errno);
  int cluster_fd = -1;
  {
    std::unique_ptr<SimCluster> cluster = MakeCluster();
    ASSERT_NE(cluster, nullptr);
    ASSERT_TRUE(sim_cluster_internal::StatNamespace("/proc/thread-self/ns/net", &inside));
    EXPECT_FALSE(inside == original);
    cluster_fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    ASSERT_GE(cluster_fd, 0) << std::strerror(errno);
    ASSERT_EQ(cluster->Partition(2, 3), absl::OkStatus());
    EXPECT_THAT(NftTablesIn(cluster_fd), HasSubstr("table ip trainguard_sim"));
    EXPECT_THAT(NftTablesIn(original_fd), Not(HasSubstr("trainguard_sim")));
    Listener server;
    ASSERT_NO_FATAL_FAILURE(Listen(SimCluster::Address(2), &server));
    EXPECT_FALSE(
        Connects(SimCluster::Address(3), SimCluster::Address(2), server.port, kDroppedConnectWait));
  }
  ASSERT_TRUE(sim_cluster_internal::StatNamespace("/proc/thread-self/ns/net", &after));
  EXPECT_TRUE(after == original) << "the destructor moves the thread back";
  EXPECT_THAT(NftTablesIn(cluster_fd), Not(HasSubstr("trainguard_sim")))
      << "the destructor deletes the table";
  close(cluster_fd);
  close(original_fd);
}

// Drops every capability of the calling process (a forked child's): what a test run by an
// unprivileged user, or in an unprivileged container, has.
bool DropAllCapabilities() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  return syscall(SYS_capset, &header, data) == 0;
}

TEST(SimCluster, CreateWithoutThePrivilegeFailsSayingWhichSyscallAndWhatIsNeeded) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {  // the test process is single-threaded here: the child may use the heap
    close(pipe_fds[0]);
    std::string message = "capset failed";
    if (DropAllCapabilities()) {
      absl::StatusOr<std::unique_ptr<SimCluster>> cluster = SimCluster::Create();
      message = cluster.ok() ? "created" : cluster.status().ToString();
    }
    (void)!write(pipe_fds[1], message.data(), message.size());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string message;
  char buffer[1024];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof(buffer))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    message.append(buffer, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  absl::StatusOr<int> status =
      sim_cluster_internal::ReapBefore(child, absl::Now() + kDeadline, "the unprivileged child");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_THAT(message, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(message, HasSubstr("unshare(CLONE_NEWNET): EPERM"));
  EXPECT_THAT(message, HasSubstr("root / CAP_SYS_ADMIN"));
}

}  // namespace
}  // namespace trainguard::testing
