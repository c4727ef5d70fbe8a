// EtcdStore: the Store interface (store.h) on an etcd v3 cluster, for jobs that already run etcd or
// that want the store to outlive any one host. It speaks etcd's v3 JSON gateway (HTTP/1.1, part of
// every etcd v3 server) with libcurl; docs/ETCD.md says why and how each operation maps onto etcd.
//
// Every key of a job lives under "/trainguard/<job_id>/kv/", and the job's fence under
// "/trainguard/<job_id>/fence", so several jobs can share one etcd without seeing each other's keys
// or fences. Compare-and-set and fencing are etcd transactions; Wait is an etcd watch; leases
// (GrantLease, SetWithLease) give keys that disappear when their owner stops renewing them.
//
// Errors: Unavailable names the endpoint(s) when etcd cannot be reached; an error etcd reports
// carries etcd's own code and message, with the endpoint and the HTTP path; every error names the
// operation, its store key (or lease) and the job.
//
// Several members: a call goes to the endpoint that last worked. When a member refuses the
// connection (it is down), the call moves on to the next at once. When a member fails a call that
// it may have received (it died mid-call, or answered Unavailable: no leader, leader changed,
// request timed out), later calls start at the next endpoint, and the call is sent again, with a
// short backoff within its timeout, if it is idempotent:
//   - Get, MultiGet, ListKeys, Wait's reads and KeepAliveOnce's renewal: reads;
//   - Set and SetWithLease: a put of the caller's value; applied twice, the key holds that value
//     (a write of another client between the two is overwritten, as it would be a moment later);
//   - Delete: a retry of a delete that applied reports false (the key is gone either way), as
//     TcpStore's does; RevokeLease likewise reports NotFound;
//   - RaiseFence: raises only from below, so a second raise to the same generation is a no-op.
// Not idempotent, so not sent again once they may have reached etcd: CompareAndSet (a retry of
// a swap that applied would see its own value and report a lost swap), Add (a retry would add
// twice) and GrantLease (a second lease). They fail with Unavailable saying "outcome unknown"; the
// caller decides, e.g. by reading the key. The one exception: etcd's "no leader", which a member
// answers before it processes the request, is retried for every call.
// Wait's watch, when its member dies or loses its leader, is made again on the next endpoint
// (after checking the keys again) until the keys exist or the wait's timeout passes. So with a
// cluster of three, losing any one member (the leader included) costs a call at most a retry;
// losing two leaves no quorum, and calls fail with Unavailable or DeadlineExceeded naming the
// endpoint they last tried.
//
// Thread safety: thread-safe. One EtcdStore may be used from several threads at once; each call
// uses its own HTTP connection from a small pool. No background threads: a lease is kept alive
// only by calls to KeepAliveOnce.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_ETCD_STORE_H_
#define TRAINGUARD_SDK_RENDEZVOUS_ETCD_STORE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "trainguard/store.h"

namespace trainguard {

namespace etcd_internal {
class EtcdGatewayClient;
}  // namespace etcd_internal

struct EtcdStoreOptions {
  // Client URLs of the etcd members, e.g. "http://127.0.0.1:2379". A call goes to the endpoint
  // that last worked; see above for when it moves on to the next.
  std::vector<std::string> endpoints;
  // Names the job's namespace in etcd: a job id as Options::job_id (1 to 200 of A-Z a-z 0-9 . _ -).
  std::string job_id;
  // Bounds Connect's round trip to etcd.
  absl::Duration connect_timeout = absl::Seconds(10);
  // The largest reply (or watch frame) accepted from etcd. Replies are base64 JSON, about 4/3 of
  // the values they carry.
  size_t max_response_bytes = size_t{64} << 20;
  // The local address connections to etcd leave from: a numeric IPv4 or IPv6 address of this host.
  // Empty: the kernel's choice. (Simulated hosts sharing a network namespace each have their own,
  // e.g. 127.0.1.N, so that a test can cut one off by address.)
  std::string source_address;
};

// A granted etcd lease.
struct EtcdLease {
  int64_t id = 0;
  absl::Duration ttl;  // as etcd granted it (whole seconds, at least etcd's minimum)
};

class EtcdStore final : public Store {
 public:
  // Checks the options and that an endpoint answers (Unavailable naming each endpoint if none
  // does; InvalidArgument for a bad job id, endpoint or source address, naming it; Unavailable
  // naming the source address when it is not an address of this host).
  static absl::StatusOr<std::unique_ptr<EtcdStore>> Connect(const EtcdStoreOptions& options);
  ~EtcdStore() override;

  EtcdStore(const EtcdStore&) = delete;
  EtcdStore& operator=(const EtcdStore&) = delete;

  absl::Status Set(std::string_view key, std::string_view value, absl::Duration timeout) override;
  absl::StatusOr<std::string> Get(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta, absl::Duration timeout) override;
  absl::StatusOr<CompareAndSetResult> CompareAndSet(std::string_view key,
                                                    const std::optional<std::string>& expected,
                                                    std::string_view desired,
                                                    absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::optional<std::string>>> MultiGet(
      const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::string>> ListKeys(std::string_view prefix,
                                                    absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  // A poll, not a watch: one read of the keys' presence (one transaction of count-only ranges)
  // every kWaitAnyPoll until one exists. etcd's JSON gateway takes one watch per stream, over one
  // key range; the range spanning unrelated keys (a rank's next table and its hang key) would carry
  // every write between them (every rank's heartbeat), and a watch per key would need a thread
  // each.
  absl::StatusOr<size_t> WaitAny(const std::vector<std::string>& keys,
                                 absl::Duration timeout) override;
  absl::Status RaiseFence(int64_t generation, absl::Duration timeout) override;
  // One transaction (its compare-and-sets and fence raise nested transactions: etcd 3.3 or later).
  absl::StatusOr<std::vector<CompareAndSetResult>> WriteBatch(const std::vector<BatchWrite>& writes,
                                                              absl::Duration timeout) override;
  // REQUIRES: generation >= 0 or kUnfenced. A write carrying another negative generation fails
  // with InvalidArgument.
  void SetWriterGeneration(int64_t generation) override;

  // Leases: liveness for keys such as "rank 3 is alive". A lease expires `ttl` (rounded up to whole
  // seconds) after it was granted or last kept alive, and etcd then deletes every key set with it.
  absl::StatusOr<EtcdLease> GrantLease(absl::Duration ttl, absl::Duration timeout);
  // Renews the lease once and returns its new TTL. NotFound when it has expired or was revoked.
  absl::StatusOr<absl::Duration> KeepAliveOnce(int64_t lease_id, absl::Duration timeout);
  // Ends the lease now, deleting its keys. NotFound when it has already expired or been revoked.
  absl::Status RevokeLease(int64_t lease_id, absl::Duration timeout);
  // Set, with the key attached to the lease (and fenced like every write). NotFound when the lease
  // has expired or was revoked.
  absl::Status SetWithLease(std::string_view key, std::string_view value, int64_t lease_id,
                            absl::Duration timeout);

  const std::string& job_id() const { return job_id_; }
  // The endpoint the next call goes to first (for tests and diagnostics: it changes as members
  // fail).
  std::string current_endpoint() const;

 private:
  EtcdStore(std::unique_ptr<etcd_internal::EtcdGatewayClient> client, std::string job_id);

  std::string EtcdKey(std::string_view key) const;
  // Set (lease_id 0) or SetWithLease.
  absl::Status Put(std::string_view key, std::string_view value, int64_t lease_id,
                   absl::Duration timeout);
  // `status` of `what` (e.g. "Set of store key a/b"), with the job and, for a deadline, the
  // timeout added.
  absl::Status Annotate(const absl::Status& status, std::string_view what,
                        absl::Duration timeout) const;

  const std::unique_ptr<etcd_internal::EtcdGatewayClient> client_;
  const std::string job_id_;
  const std::string key_prefix_;  // "/trainguard/<job_id>/kv/"
  const std::string fence_key_;   // "/trainguard/<job_id>/fence"
  std::atomic<int64_t> generation_{kUnfenced};
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_RENDEZVOUS_ETCD_STORE_H_
