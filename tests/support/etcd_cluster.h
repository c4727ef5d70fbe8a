// EtcdCluster: a real N-member etcd cluster (/usr/bin/etcd, Debian package etcd-server) for tests,
// every member on a loopback address with free ports and its data in one fresh temporary
// directory. Each member may listen on its own address (e.g. 127.0.1.201..203, one per simulated
// host); by default all use 127.0.0.1.
//
// Start() launches every member and waits (bounded) until each serves a linearizable read through
// itself, so the cluster has a leader and every member has joined it. The faults a test injects:
// Kill(i) (SIGKILL, as a crash would be), then Restart(i) on the same data and ports. The
// destructor stops every member (SIGTERM, then SIGKILL), reaps it and removes the directory; each
// member also gets SIGKILL if the process that started it dies, so a crashed test leaves no server.
// Leader() asks the members over HTTP (/v3/maintenance/status) which one leads, and MoveLeader()
// hands the leadership to another member (/v3/maintenance/transfer-leadership); WatcherCount(i)
// reads a member's /metrics, so that a test can find the member that holds a client's watch.
//
// Not thread-safe: one thread drives an EtcdCluster (others may talk to its members).
#ifndef TRAINGUARD_TESTS_SUPPORT_ETCD_CLUSTER_H_
#define TRAINGUARD_TESTS_SUPPORT_ETCD_CLUSTER_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "sdk/rendezvous/etcd_store.h"
#include "tests/support/etcd_process.h"
#include "tests/support/own_process.h"
#include "tests/support/temp_dir.h"

namespace trainguard::testing {

// One HTTP/1.0 request ("Connection: close", so the reply is never chunked) to address:port,
// bounded by `timeout` per socket operation. Returns the reply's body; Unavailable when nothing
// answers, Internal for a reply that is not HTTP 200.
inline absl::StatusOr<std::string> HttpRequest(const std::string& address, int port,
                                               const std::string& method, const std::string& path,
                                               const std::string& body, absl::Duration timeout) {
  const std::string where = absl::StrCat(method, " http://", address, ":", port, path);
  sockaddr_in peer{};
  peer.sin_family = AF_INET;
  peer.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, address.c_str(), &peer.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat(where, ": socket: ", std::strerror(errno)));
  const timeval bound = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof(bound));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &bound, sizeof(bound));
  if (connect(fd, reinterpret_cast<const sockaddr*>(&peer), sizeof(peer)) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    return absl::UnavailableError(absl::StrCat(where, ": connect: ", error));
  }
  const std::string request = absl::StrCat(
      method, " ", path, " HTTP/1.0\r\nHost: ", address, ":", port,
      "\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
      "\r\n\r\n", body);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      const std::string error = std::strerror(errno);
      close(fd);
      return absl::UnavailableError(absl::StrCat(where, ": send: ", error));
    }
    sent += static_cast<size_t>(n);
  }
  std::string reply;
  char buffer[16384];
  for (;;) {
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      const std::string error = std::strerror(errno);
      close(fd);
      return absl::UnavailableError(absl::StrCat(where, ": recv: ", error));
    }
    reply.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  const size_t head_end = reply.find("\r\n\r\n");
  if (head_end == std::string::npos || reply.compare(0, 7, "HTTP/1.") != 0 ||
      reply.compare(9, 3, "200") != 0) {
    return absl::InternalError(absl::StrCat(
        where, ": not an HTTP 200 reply: ", reply.substr(0, std::min<size_t>(reply.size(), 300))));
  }
  return reply.substr(head_end + 4);
}

// The decimal digits of the first JSON field "`name`":"<digits>" (the gateway writes uint64 as
// strings) or "`name`":<digits>, or 0 when absent.
inline uint64_t JsonUint(const std::string& json, const std::string& name) {
  const std::string field = absl::StrCat("\"", name, "\":");
  const size_t at = json.find(field);
  if (at == std::string::npos) return 0;
  size_t begin = at + field.size();
  if (begin < json.size() && json[begin] == '"') ++begin;
  size_t end = begin;
  while (end < json.size() && json[end] >= '0' && json[end] <= '9') ++end;
  uint64_t value = 0;
  if (!absl::SimpleAtoi(json.substr(begin, end - begin), &value)) return 0;
  return value;
}

class EtcdCluster {
 public:
  // How long Start() and Restart() wait for members to serve.
  static constexpr absl::Duration kStartTimeout = absl::Seconds(60);
  // Bounds one HTTP request of Leader() and WatcherCount().
  static constexpr absl::Duration kRequestTimeout = absl::Seconds(5);

  // REQUIRES: members >= 1; `addresses` empty (every member on 127.0.0.1) or one numeric IPv4
  // loopback address per member.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> Start(
      int members, std::vector<std::string> addresses = {}) {
    if (absl::Status s = CheckEtcdInstalled(); !s.ok()) return s;
    if (members < 1) {
      return absl::InvalidArgumentError(absl::StrCat("EtcdCluster of ", members, " members"));
    }
    if (addresses.empty()) addresses.assign(static_cast<size_t>(members), "127.0.0.1");
    if (addresses.size() != static_cast<size_t>(members)) {
      return absl::InvalidArgumentError(absl::StrCat("EtcdCluster of ", members, " members given ",
                                                     addresses.size(), " addresses"));
    }
    // A port another process bound first (FreeTcpPorts) makes its member exit: the whole cluster
    // starts again, on new ports and a new data directory.
    absl::StatusOr<std::unique_ptr<EtcdCluster>> cluster;
    for (int attempt = 0; attempt < kPortAttempts; ++attempt) {
      cluster = TryStart(addresses);
      if (cluster.ok() || !IsAddressInUse(cluster.status())) return cluster;
    }
    return cluster;
  }

  ~EtcdCluster() {
    for (int i = 0; i < size(); ++i) Stop(i);
  }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }

  // "http://<address>:<client port>" of member i.
  std::string endpoint(int i) const {
    return absl::StrCat("http://", member(i).address, ":", member(i).client_port);
  }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> all;
    for (int i = 0; i < size(); ++i) all.push_back(endpoint(i));
    return all;
  }
  // "<address>:<port>,..." for an etcd:// store URL (OpenStore).
  std::string StoreUrl() const {
    std::vector<std::string> all;
    for (int i = 0; i < size(); ++i) {
      all.push_back(absl::StrCat(member(i).address, ":", member(i).client_port));
    }
    return absl::StrCat("etcd://", absl::StrJoin(all, ","));
  }
  // The member whose endpoint is `endpoint`, or -1.
  int MemberAt(const std::string& url) const {
    for (int i = 0; i < size(); ++i) {
      if (endpoint(i) == url) return i;
    }
    return -1;
  }
  bool running(int i) const { return member(i).pid > 0; }

  // The crash: SIGKILL to member i, reaped; its data directory stays.
  void Kill(int i) {
    Member& m = member(i);
    if (m.pid <= 0) return;
    // Reaped only once the kill went out: a blocking wait for a server not signalled would hang.
    if (Signal(m, SIGKILL)) waitpid(m.pid, nullptr, 0);
    m.pid = -1;
  }

  // Starts member i again on its data directory and ports (it rejoins the cluster from its log)
  // and waits until it serves a linearizable read.
  absl::Status Restart(int i) {
    Kill(i);
    if (absl::Status s = Launch(i); !s.ok()) return s;
    return WaitUntilServing(i);
  }

  // The index of the member that leads, as the running members report it, once a majority of them
  // agree on one that runs (polled until `timeout`).
  absl::StatusOr<int> Leader(absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    std::string last = "no member answered";
    for (;;) {
      std::vector<uint64_t> ids(members_.size(), 0);
      std::vector<uint64_t> leaders;
      for (int i = 0; i < size(); ++i) {
        if (!running(i)) continue;
        absl::StatusOr<std::string> status =
            HttpRequest(member(i).address, member(i).client_port, "POST", "/v3/maintenance/status",
                        "{}", kRequestTimeout);
        if (!status.ok()) {
          last = status.status().ToString();
          continue;
        }
        ids[static_cast<size_t>(i)] = JsonUint(*status, "member_id");
        leaders.push_back(JsonUint(*status, "leader"));
      }
      for (int i = 0; i < size(); ++i) {
        const uint64_t id = ids[static_cast<size_t>(i)];
        if (id == 0) continue;
        const auto votes = std::count(leaders.begin(), leaders.end(), id);
        if (2 * votes > static_cast<long>(members_.size())) return i;
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "no running member of the etcd cluster was reported leader by a majority within ",
            absl::FormatDuration(timeout), " (last error: ", last, ")"));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  // Hands the leadership from member `from`, which must lead now, to member `to` (etcd's
  // MoveLeader: `to` campaigns at once, without waiting out an election timeout), then waits until
  // a majority reports `to` as the leader (bounded by `timeout`).
  absl::Status MoveLeader(int from, int to, absl::Duration timeout) {
    absl::StatusOr<std::string> status =
        HttpRequest(member(to).address, member(to).client_port, "POST", "/v3/maintenance/status",
                    "{}", kRequestTimeout);
    if (!status.ok()) return status.status();
    const uint64_t target = JsonUint(*status, "member_id");
    if (target == 0) {
      return absl::InternalError(absl::StrCat(endpoint(to), " reported no member_id: ", *status));
    }
    absl::StatusOr<std::string> moved =
        HttpRequest(member(from).address, member(from).client_port, "POST",
                    "/v3/maintenance/transfer-leadership",
                    absl::StrCat("{\"targetID\":\"", target, "\"}"), timeout);
    if (!moved.ok()) return moved.status();
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      absl::StatusOr<int> leader = Leader(deadline - absl::Now());
      if (leader.ok() && *leader == to) return absl::OkStatus();
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "the leadership did not pass from member ", from, " to member ", to, " within ",
            absl::FormatDuration(timeout), " (leader now: ",
            leader.ok() ? absl::StrCat(*leader) : leader.status().ToString(), ")"));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }

  // The watchers member i holds now (etcd's metric etcd_debugging_mvcc_watcher_total).
  absl::StatusOr<int64_t> WatcherCount(int i) const {
    absl::StatusOr<std::string> metrics = HttpRequest(member(i).address, member(i).client_port,
                                                      "GET", "/metrics", "", kRequestTimeout);
    if (!metrics.ok()) return metrics.status();
    static constexpr char kMetric[] = "\netcd_debugging_mvcc_watcher_total ";
    const size_t at = metrics->find(kMetric);
    if (at == std::string::npos) {
      return absl::InternalError(absl::StrCat(endpoint(i), "/metrics has no ", kMetric + 1));
    }
    const size_t begin = at + std::strlen(kMetric);
    const size_t end = metrics->find('\n', begin);
    double value = 0;
    if (!absl::SimpleAtod(metrics->substr(begin, end - begin), &value)) {
      return absl::InternalError(
          absl::StrCat(endpoint(i), "/metrics: bad value for ", kMetric + 1));
    }
    return static_cast<int64_t>(value);
  }

  // The end of member i's log, for failure messages.
  std::string LogTail(int i) const {
    return FileTail(dir_.File(absl::StrCat(member(i).name, ".log")));
  }

 private:
  struct Member {
    std::string name;
    std::string address;
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = -1;
  };

  EtcdCluster() = default;

  // One start of Start(): the members' ports are drawn per address, distinct on each.
  static absl::StatusOr<std::unique_ptr<EtcdCluster>> TryStart(
      const std::vector<std::string>& addresses) {
    const int members = static_cast<int>(addresses.size());
    std::unique_ptr<EtcdCluster> cluster(new EtcdCluster());
    for (int i = 0; i < members; ++i) {
      Member member;
      member.name = absl::StrCat("member", i);
      member.address = addresses[static_cast<size_t>(i)];
      cluster->members_.push_back(std::move(member));
    }
    for (int i = 0; i < members; ++i) {
      Member& member = cluster->member(i);
      if (member.client_port != 0) continue;  // drawn with an earlier member on its address
      // Every member on this address at once, so no two of them draw the same port.
      std::vector<int> sharing;
      for (int j = i; j < members; ++j) {
        if (cluster->member(j).address == member.address) sharing.push_back(j);
      }
      absl::StatusOr<std::vector<int>> ports =
          FreeTcpPorts(member.address, 2 * static_cast<int>(sharing.size()));
      if (!ports.ok()) return ports.status();
      for (size_t k = 0; k < sharing.size(); ++k) {
        cluster->member(sharing[k]).client_port = (*ports)[2 * k];
        cluster->member(sharing[k]).peer_port = (*ports)[2 * k + 1];
      }
    }
    cluster->token_ = absl::StrCat("tg-cluster-", getpid(), "-", cluster->members_[0].client_port);
    // Every member first: none can elect a leader before a majority runs.
    for (int i = 0; i < members; ++i) {
      if (absl::Status s = cluster->Launch(i); !s.ok()) return s;
    }
    for (int i = 0; i < members; ++i) {
      if (absl::Status s = cluster->WaitUntilServing(i); !s.ok()) return s;
    }
    return cluster;
  }

  const Member& member(int i) const { return members_.at(static_cast<size_t>(i)); }
  Member& member(int i) { return members_.at(static_cast<size_t>(i)); }

  std::string PeerUrl(int i) const {
    return absl::StrCat("http://", member(i).address, ":", member(i).peer_port);
  }

  absl::Status Launch(int i) {
    std::vector<std::string> initial_cluster;
    for (int j = 0; j < size(); ++j) {
      initial_cluster.push_back(absl::StrCat(member(j).name, "=", PeerUrl(j)));
    }
    const std::string client_url = endpoint(i);
    const std::string peer_url = PeerUrl(i);
    // On a restart the data directory holds the member's identity; etcd then ignores the
    // --initial-* flags.
    // clang-format off
    std::vector<std::string> args = {
        kEtcdBinary,
        "--name", member(i).name,
        "--data-dir", dir_.File(absl::StrCat(member(i).name, ".data")),
        "--listen-client-urls", client_url,
        "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", absl::StrJoin(initial_cluster, ","),
        "--initial-cluster-state", "new",
        "--initial-cluster-token", token_,
        "--logger", "zap",
        "--log-level", "warn",
        "--log-outputs", "stderr",
    };
    // clang-format on
    absl::StatusOr<pid_t> pid =
        SpawnEtcd(std::move(args), dir_.File(absl::StrCat(member(i).name, ".log")));
    if (!pid.ok()) return pid.status();
    member(i).pid = *pid;
    return absl::OkStatus();
  }

  // Polls member i alone with a real client (EtcdStore::Connect's read is linearizable: it needs a
  // leader) until it answers, it exits, or kStartTimeout passes.
  absl::Status WaitUntilServing(int i) {
    const absl::Time deadline = absl::Now() + kStartTimeout;
    EtcdStoreOptions options;
    options.endpoints = {endpoint(i)};
    options.job_id = "etcd-cluster-probe";
    options.connect_timeout = absl::Seconds(1);
    absl::Status last;
    while (absl::Now() < deadline) {
      int wait_status = 0;
      if (waitpid(member(i).pid, &wait_status, WNOHANG) == member(i).pid) {
        member(i).pid = -1;
        return absl::InternalError(absl::StrCat("etcd member ", i,
                                                " exited before serving (status ", wait_status,
                                                "); its log:\n", LogTail(i)));
      }
      absl::StatusOr<std::unique_ptr<EtcdStore>> probe = EtcdStore::Connect(options);
      if (probe.ok()) return absl::OkStatus();
      last = probe.status();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "etcd member ", i, " did not serve at ", endpoint(i), " within ",
        absl::FormatDuration(kStartTimeout), ": ", last.ToString(), "; its log:\n", LogTail(i)));
  }

  void Stop(int i) {
    Member& m = member(i);
    if (m.pid <= 0) return;
    Signal(m, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      if (waitpid(m.pid, nullptr, WNOHANG) == m.pid) {
        m.pid = -1;
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    Kill(i);
  }

  // Every signal goes through SignalOwnProcess (a member this object forked); a refusal is
  // reported on stderr, where the test's log shows it.
  static bool Signal(const Member& m, int signal) {
    const absl::Status sent = SignalOwnProcess(m.pid, signal);
    if (!sent.ok()) std::fprintf(stderr, "EtcdCluster: %s\n", sent.ToString().c_str());
    return sent.ok();
  }

  TempDir dir_;
  std::string token_;
  std::vector<Member> members_;
};

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_ETCD_CLUSTER_H_
