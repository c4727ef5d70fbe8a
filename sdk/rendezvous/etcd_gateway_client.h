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
// A call moves on to the next endpoint only when the current one refuses the connection (nothing
// was sent, so no request can apply twice); the endpoint that last worked is tried first.
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

  // REQUIRES: `endpoints` non-empty, each "http://host:port" (or https) with no trailing path.
  static absl::StatusOr<std::unique_ptr<EtcdGatewayClient>> Create(
      std::vector<std::string> endpoints, size_t max_response_bytes);
  ~EtcdGatewayClient();

  EtcdGatewayClient(const EtcdGatewayClient&) = delete;
  EtcdGatewayClient& operator=(const EtcdGatewayClient&) = delete;

  // POSTs `request` as JSON to `path` (e.g. "/v3/kv/range") and parses the reply into `*response`.
  absl::Status Call(std::string_view path, const google::protobuf::Message& request,
                    google::protobuf::Message* response, absl::Time deadline);

  // POSTs `request` to a server-streaming `path` (/v3/watch, /v3/lease/keepalive) and hands each
  // newline-terminated JSON frame to `on_frame` until it returns kStop (then OK) or an error (then
  // that error). A stream the server ends first is Unavailable.
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

  EtcdGatewayClient(std::vector<std::string> endpoints, size_t max_response_bytes);

  // Sends one POST, trying endpoints in turn while they refuse connections. `transfer` carries the
  // body sink (plain or streaming) and receives the HTTP status.
  absl::Status Post(std::string_view path, const std::string& body, absl::Time deadline,
                    Transfer& transfer);

  // A handle from the pool, or a new one; nullptr when libcurl cannot make one.
  CURL* TakeHandle();
  void ReturnHandle(CURL* curl);

  const std::vector<std::string> endpoints_;
  const size_t max_response_bytes_;
  curl_slist* const headers_;  // shared, read-only, by every handle
  std::atomic<size_t> preferred_{0};

  Mutex mu_;
  std::vector<CURL*> idle_handles_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainguard::etcd_internal

#endif  // TRAINGUARD_SDK_RENDEZVOUS_ETCD_GATEWAY_CLIENT_H_
