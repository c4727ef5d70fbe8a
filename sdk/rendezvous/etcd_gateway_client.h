// EtcdGatewayClient: calls etcd's v3 JSON gateway (HTTP/1.1 POST of a JSON body to /v3/...) with
// libcurl, mapping the JSON onto protobuf messages. Private to sdk/rendezvous; EtcdStore is its
// only user.
//
// Every call has a deadline, which bounds connecting, sending and receiving. Replies are bounded in
// size (max_response_bytes per reply, or per frame of a stream). Errors name the endpoint and path:
//   - Unavailable: no endpoint accepted a connection, or the connection broke mid-call;
//   - DeadlineExceeded: no complete reply before the deadline;
//   - etcd's own gRPC code (NotFound, InvalidArgument, ...) with etcd's message when the gateway
//     answers with an error;
//   - Internal: a reply that is not the JSON expected, or one over the size bound.
// Endpoints: the endpoint that last worked is tried first; one that refuses the connection
// (nothing was sent) is skipped for the next at once. Once a request may have reached etcd and the
// call still failed with Unavailable (the connection broke mid-call, e.g. the member was killed; or
// etcd answered Unavailable: no leader, leader changed, request timed out), the next call starts at
// the next endpoint, and the call itself is sent again only if the caller says it is idempotent
// (Retry::kIdempotent): with a short backoff, until it succeeds or its deadline passes. A call
// that is not (Retry::kOnlyIfUnsent) fails with Unavailable saying that its outcome is unknown,
// except when etcd answered "no leader", which it says before processing the request. Every
// request asks etcd (metadata "hasleader") to refuse it, and to cancel a watch, on a member that
// has lost its leader, so that a member cut off from the quorum does not hold a call or a watch
// until its deadline.
//
// Thread safety: thread-safe. Each call borrows a libcurl handle (which keeps its HTTP keep-alive
// connection) from a pool for its duration; concurrent calls use separate handles.
#ifndef TRAINGUARD_SDK_RENDEZVOUS_ETCD_GATEWAY_CLIENT_H_
#define TRAINGUARD_SDK_RENDEZVOUS_ETCD_GATEWAY_CLIENT_H_

#include <curl/curl.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "sdk/core/mutex.h"

namespace trainguard::etcd_internal {

class EtcdGatewayClient {
 public:
  // What a stream consumer says after each frame.
  enum class StreamControl { kContinue, kStop };
  // Whether Call may send a request again after it may have reached etcd.
  enum class Retry {
    kIdempotent,    // applying it twice is the same as once (a read, a put of a given value)
    kOnlyIfUnsent,  // it must not apply twice (a compare-and-swap that a retry would see fail)
  };

  // REQUIRES: `endpoints` non-empty, each "http://host:port" (or https) with no trailing path.
  // `source_address`: the numeric local address connections leave from (empty: the kernel's
  // choice); InvalidArgument, naming it, when it is not a numeric IPv4 or IPv6 address.
  static absl::StatusOr<std::unique_ptr<EtcdGatewayClient>> Create(
      std::vector<std::string> endpoints, size_t max_response_bytes,
      std::string source_address = "");
  ~EtcdGatewayClient();

  EtcdGatewayClient(const EtcdGatewayClient&) = delete;
  EtcdGatewayClient& operator=(const EtcdGatewayClient&) = delete;

  // POSTs `request` as JSON to `path` (e.g. "/v3/kv/range") and parses the reply into `*response`.
  // `retry` says whether it may be sent again once it may have reached etcd (see above).
  absl::Status Call(std::string_view path, const google::protobuf::Message& request,
                    google::protobuf::Message* response, absl::Time deadline, Retry retry);

  // POSTs `request` to a server-streaming `path` (/v3/watch, /v3/lease/keepalive) and hands each
  // newline-terminated JSON frame to `on_frame` until it returns kStop (then OK) or an error (then
  // that error). A stream the server ends first, or whose connection breaks, is Unavailable; it is
  // not sent again (the caller knows what it has seen) but the next call starts at the next
  // endpoint.
  absl::Status Stream(
      std::string_view path, const google::protobuf::Message& request, absl::Time deadline,
      absl::FunctionRef<absl::StatusOr<StreamControl>(std::string_view frame)> on_frame);

  // The status for gRPC status `code` (as etcd reports it), e.g. from an error frame of a stream.
  static absl::Status StatusFromGrpc(int code, std::string_view message);

  // Parses one JSON object (a reply or a stream frame) into `*message`, ignoring unknown fields.
  static absl::Status ParseJson(std::string_view json, google::protobuf::Message* message);

  // The endpoint calls go to first (the one that last accepted a connection).
  std::string CurrentEndpoint() const;

 private:
  struct Transfer;

  EtcdGatewayClient(std::vector<std::string> endpoints, size_t max_response_bytes,
                    std::string source_address);

  // Sends one POST, trying endpoints in turn while they refuse connections. `transfer` carries the
  // body sink (plain or streaming) and receives the HTTP status.
  absl::Status Post(std::string_view path, const std::string& body, absl::Time deadline,
                    Transfer& transfer);
  // One Call: one Post and its reply.
  absl::Status CallOnce(std::string_view path, const std::string& body,
                        google::protobuf::Message* response, absl::Time deadline, CURL* curl,
                        bool& maybe_applied);
  // After a failure that may have been etcd's or the member's: later calls start at the endpoint
  // after `index` (unless another call has moved on already).
  void MoveOnFrom(size_t index);

  // A handle from the pool, or a new one; nullptr when libcurl cannot make one.
  CURL* TakeHandle();
  void ReturnHandle(CURL* curl);

  const std::vector<std::string> endpoints_;
  const size_t max_response_bytes_;
  const std::string interface_;  // CURLOPT_INTERFACE: "host!<source address>", or empty
  curl_slist* const headers_;  // shared, read-only, by every handle
  std::atomic<size_t> preferred_{0};

  Mutex mu_;
  std::vector<CURL*> idle_handles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainguard::etcd_internal

#endif  // TRAINGUARD_SDK_RENDEZVOUS_ETCD_GATEWAY_CLIENT_H_
