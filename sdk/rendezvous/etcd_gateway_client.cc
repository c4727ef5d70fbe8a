#include "sdk/rendezvous/etcd_gateway_client.h"

#include <curl/curl.h>
#include <sys/socket.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "sdk/core/socket_address.h"
#include "sdk/proto/etcd_gateway.pb.h"

namespace trainguard::etcd_internal {
namespace {

// Handles kept for reuse; more than this many concurrent calls close their extra handles after.
constexpr size_t kMaxIdleHandles = 16;
// How much of an unexpected reply an error message quotes.
constexpr size_t kQuotedBodyBytes = 200;
// The pause before an idempotent call is sent again: doubles from the first to the second.
constexpr absl::Duration kRetryBackoffInitial = absl::Milliseconds(10);
constexpr absl::Duration kRetryBackoffMax = absl::Milliseconds(500);
// What etcd answers, before processing the request, on a member without a leader when the request
// carries the "hasleader" metadata: a request so refused was surely not applied.
constexpr absl::string_view kNoLeader = "etcdserver: no leader";

std::string Quote(std::string_view body) {
  if (body.size() <= kQuotedBodyBytes) return std::string(body);
  return absl::StrFormat("%s... (%d bytes)", body.substr(0, kQuotedBodyBytes), body.size());
}

absl::StatusCode CodeFromGrpc(int code) {
  if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::StatusCode::kUnknown;
  }
  return static_cast<absl::StatusCode>(code);
}

// The status of a reply whose HTTP status is not 200: etcd's own code and message when the body is
// the gateway's error object, else the HTTP status and the start of the body.
absl::Status GatewayErrorStatus(std::string_view where, long http_status, std::string_view body) {
  proto::etcd::GatewayError error;
  if (EtcdGatewayClient::ParseJson(body, &error).ok() &&
      (error.code() != 0 || !error.message().empty())) {
    return absl::Status(CodeFromGrpc(error.code()),
                        absl::StrFormat("%s: HTTP %d: %s", where, http_status,
                                        error.message().empty() ? error.error() : error.message()));
  }
  const absl::StatusCode code =
      http_status == 503 ? absl::StatusCode::kUnavailable : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrFormat("%s: HTTP %d: %s", where, http_status, Quote(body)));
}

absl::Status WithContext(const absl::Status& status, std::string_view where) {
  return absl::Status(status.code(), absl::StrFormat("%s: %s", where, status.message()));
}

}  // namespace

// The state of one POST, shared with libcurl's write callback.
struct EtcdGatewayClient::Transfer {
  using FrameSink = absl::FunctionRef<absl::StatusOr<StreamControl>(std::string_view)>;

  Transfer(CURL* curl, size_t limit, const FrameSink* on_frame)
      : curl(curl), limit(limit), on_frame(on_frame) {}

  void Reset() {
    body.clear();
    http_status = 0;
    over_limit = false;
    stopped = false;
    frame_status = absl::OkStatus();
  }

  CURL* const curl;
  const size_t limit;
  const FrameSink* const on_frame;  // nullptr: a unary call, keep the whole body

  std::string endpoint;  // where the last attempt went
  size_t endpoint_index = 0;
  bool maybe_sent =
      false;             // an endpoint accepted the connection: the request may have reached etcd
  std::string body;      // a unary reply, an error reply, or a stream's incomplete frame
  long http_status = 0;
  bool over_limit = false;
  bool stopped = false;  // the frame sink ended the stream (frame_status says how)
  absl::Status frame_status;

  static size_t OnBody(char* data, size_t size, size_t count, void* user) {
    return static_cast<Transfer*>(user)->Append(std::string_view(data, size * count));
  }

  // Returns how much was consumed; anything less than data.size() makes libcurl abort the call.
  size_t Append(std::string_view data) {
    if (http_status == 0) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &http_status);
    if (on_frame == nullptr || http_status != 200) {
      if (body.size() + data.size() > limit) {
        over_limit = true;
        return 0;
      }
      body.append(data);
      return data.size();
    }

    // A stream: `limit` bounds each frame, so what may wait for its newline. (libcurl hands over at
    // most CURL_MAX_WRITE_SIZE bytes at a time, so the append itself is bounded.)
    body.append(data);

    size_t start = 0;
    for (size_t newline; (newline = body.find('\n', start)) != std::string::npos;) {
      std::string_view frame(body.data() + start, newline - start);
      start = newline + 1;
      if (!frame.empty() && frame.back() == '\r') frame.remove_suffix(1);
      if (frame.empty()) continue;
      absl::StatusOr<StreamControl> control = (*on_frame)(frame);
      if (!control.ok() || *control == StreamControl::kStop) {
        stopped = true;
        frame_status = control.status();
        return 0;
      }
    }
    body.erase(0, start);
    if (body.size() > limit) {
      over_limit = true;
      return 0;
    }
    return data.size();
  }
};

absl::StatusOr<std::unique_ptr<EtcdGatewayClient>> EtcdGatewayClient::Create(
    std::vector<std::string> endpoints, size_t max_response_bytes, std::string source_address) {
  if (endpoints.empty()) {
    return absl::InvalidArgumentError("etcd gateway client: no endpoints given");
  }
  for (const std::string& endpoint : endpoints) {
    if (endpoint.rfind("http://", 0) != 0 && endpoint.rfind("https://", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("etcd endpoint '", endpoint,
                                                     "' must start with http:// or https:// (e.g. ",
                                                     "http://127.0.0.1:2379)"));
    }
  }
  if (!source_address.empty()) {
    if (absl::StatusOr<sockaddr_storage> parsed =
            NumericSockaddr(source_address, "etcd source address");
        !parsed.ok()) {
      return parsed.status();
    }
  }
  static std::once_flag curl_initialized;
  static CURLcode init_code = CURLE_OK;
  std::call_once(curl_initialized, [] { init_code = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (init_code != CURLE_OK) {
    return absl::InternalError(
        absl::StrCat("libcurl failed to initialize: ", curl_easy_strerror(init_code)));
  }
  for (std::string& endpoint : endpoints) {
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  }
  return std::unique_ptr<EtcdGatewayClient>(
      new EtcdGatewayClient(std::move(endpoints), max_response_bytes, std::move(source_address)));
}

namespace {

curl_slist* JsonHeaders() {
  curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  // Without this, libcurl holds back bodies over 1 MiB for up to a second waiting for a
  // "100 Continue" that Go's server does not need to send.
  headers = curl_slist_append(headers, "Expect:");
  // gRPC metadata "hasleader" (the gateway forwards Grpc-Metadata-* headers): a member that has
  // lost its leader refuses the request at once with "no leader" instead of holding it, and
  // cancels a watch instead of leaving it silent.
  return curl_slist_append(headers, "Grpc-Metadata-hasleader: true");
}

}  // namespace

EtcdGatewayClient::EtcdGatewayClient(std::vector<std::string> endpoints, size_t max_response_bytes,
                                     std::string source_address)
    : endpoints_(std::move(endpoints)),
      max_response_bytes_(max_response_bytes),
      interface_(source_address.empty() ? "" : absl::StrCat("host!", source_address)),
      headers_(JsonHeaders()) {}

EtcdGatewayClient::~EtcdGatewayClient() {
  MutexLock lock(&mu_);
  for (CURL* curl : idle_handles_) curl_easy_cleanup(curl);
  curl_slist_free_all(headers_);
}

CURL* EtcdGatewayClient::TakeHandle() {
  {
    MutexLock lock(&mu_);
    if (!idle_handles_.empty()) {
      CURL* curl = idle_handles_.back();
      idle_handles_.pop_back();
      return curl;
    }
  }
  return curl_easy_init();
}

void EtcdGatewayClient::ReturnHandle(CURL* curl) {
  {
    MutexLock lock(&mu_);
    if (idle_handles_.size() < kMaxIdleHandles) {
      idle_handles_.push_back(curl);
      return;
    }
  }
  curl_easy_cleanup(curl);
}

void EtcdGatewayClient::MoveOnFrom(size_t index) {
  size_t expected = index;
  preferred_.compare_exchange_strong(expected, (index + 1) % endpoints_.size(),
                                     std::memory_order_relaxed);
}

std::string EtcdGatewayClient::CurrentEndpoint() const {
  return endpoints_[preferred_.load(std::memory_order_relaxed) % endpoints_.size()];
}

absl::Status EtcdGatewayClient::Post(std::string_view path, const std::string& body,
                                     absl::Time deadline, Transfer& transfer) {
  std::vector<std::string> refused;
  const size_t first = preferred_.load(std::memory_order_relaxed);
  for (size_t attempt = 0; attempt < endpoints_.size(); ++attempt) {
    const size_t index = (first + attempt) % endpoints_.size();
    transfer.endpoint = endpoints_[index];
    transfer.endpoint_index = index;
    const std::string where = absl::StrFormat("etcd %s POST %s", transfer.endpoint, path);
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(where, ": deadline passed before sending"));
    }
    const long timeout_ms = static_cast<long>(
        std::max<int64_t>(1, absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)))));
    const std::string url = absl::StrFormat("%s%s", transfer.endpoint, path);
    char error_buffer[CURL_ERROR_SIZE] = {};

    CURL* curl = transfer.curl;
    curl_easy_reset(curl);
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Transfer::OnBody);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // several threads; no SIGALRM games
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(curl, CURLOPT_TCP_KEEPALIVE, 1L);  // a watch may sit idle for long
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error_buffer);
    if (!interface_.empty()) curl_easy_setopt(curl, CURLOPT_INTERFACE, interface_.c_str());
    transfer.Reset();

    const CURLcode code = curl_easy_perform(curl);
    const std::string detail =
        error_buffer[0] != '\0' ? std::string(error_buffer) : curl_easy_strerror(code);
    if (code == CURLE_COULDNT_CONNECT || code == CURLE_COULDNT_RESOLVE_HOST) {
      refused.push_back(absl::StrFormat("%s (%s)", transfer.endpoint, detail));
      continue;
    }
    if (code == CURLE_INTERFACE_FAILED) {
      return absl::UnavailableError(
          absl::StrFormat("%s: cannot bind the source address %s (EtcdStoreOptions::"
                          "source_address; is it an address of this host?): %s",
                          where, interface_.substr(5), detail));
    }
    transfer.maybe_sent = true;
    if (code == CURLE_OK || (code == CURLE_WRITE_ERROR && transfer.stopped)) {
      preferred_.store(index, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    if (code == CURLE_WRITE_ERROR && transfer.over_limit) {
      return absl::InternalError(absl::StrFormat(
          "%s: reply exceeds the bound of %d bytes (EtcdStoreOptions::max_response_bytes)", where,
          max_response_bytes_));
    }
    if (code == CURLE_OPERATION_TIMEDOUT) {
      return absl::DeadlineExceededError(
          absl::StrFormat("%s: no complete reply before the deadline (%s)", where, detail));
    }
    MoveOnFrom(index);
    return absl::UnavailableError(absl::StrFormat("%s: %s", where, detail));
  }
  return absl::UnavailableError(
      absl::StrFormat("no etcd endpoint accepted a connection for POST %s: %s", path,
                      absl::StrJoin(refused, "; ")));
}

namespace {

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;  // the names etcd's gateway itself emits
  std::string json;
  if (auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
      !status.ok()) {
    return absl::InternalError(
        absl::StrFormat("cannot encode %s as JSON: %s", message.GetTypeName(), status.ToString()));
  }
  return json;
}

}  // namespace

absl::Status EtcdGatewayClient::StatusFromGrpc(int code, std::string_view message) {
  return absl::Status(CodeFromGrpc(code), absl::string_view(message.data(), message.size()));
}

absl::Status EtcdGatewayClient::ParseJson(std::string_view json,
                                          google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  message->Clear();
  if (auto status = google::protobuf::util::JsonStringToMessage(
          google::protobuf::StringPiece(json.data(), json.size()), message, options);
      !status.ok()) {
    return absl::InternalError(absl::StrFormat("reply is not a %s: %s: %s", message->GetTypeName(),
                                               status.ToString(), Quote(json)));
  }
  return absl::OkStatus();
}

absl::Status EtcdGatewayClient::Call(std::string_view path,
                                     const google::protobuf::Message& request,
                                     google::protobuf::Message* response, absl::Time deadline,
                                     Retry retry) {
  absl::StatusOr<std::string> body = ToJson(request);
  if (!body.ok()) return body.status();
  CURL* curl = TakeHandle();
  if (curl == nullptr) return absl::ResourceExhaustedError("libcurl cannot create a handle");
  absl::Cleanup give_back = [&] { ReturnHandle(curl); };

  for (absl::Duration backoff = kRetryBackoffInitial;;
       backoff = std::min(2 * backoff, kRetryBackoffMax)) {
    bool maybe_sent = false;
    absl::Status status = CallOnce(path, *body, response, deadline, curl, maybe_sent);
    if (status.ok() || !absl::IsUnavailable(status) || !maybe_sent) return status;
    const bool unprocessed = absl::StrContains(status.message(), kNoLeader);
    if (retry == Retry::kOnlyIfUnsent && !unprocessed) {
      return absl::UnavailableError(
          absl::StrCat(status.message(), " (the request may have been applied: outcome unknown)"));
    }
    if (absl::Now() + backoff >= deadline) return status;
    absl::SleepFor(backoff);
  }
}

absl::Status EtcdGatewayClient::CallOnce(std::string_view path, const std::string& body,
                                         google::protobuf::Message* response, absl::Time deadline,
                                         CURL* curl, bool& maybe_sent) {
  Transfer transfer(curl, max_response_bytes_, nullptr);
  absl::Status posted = Post(path, body, deadline, transfer);
  maybe_sent = transfer.maybe_sent;
  if (!posted.ok()) return posted;
  const std::string where = absl::StrFormat("etcd %s POST %s", transfer.endpoint, path);
  if (transfer.http_status != 200) {
    absl::Status error = GatewayErrorStatus(where, transfer.http_status, transfer.body);
    if (absl::IsUnavailable(error)) MoveOnFrom(transfer.endpoint_index);
    return error;
  }
  if (absl::Status s = ParseJson(transfer.body, response); !s.ok()) return WithContext(s, where);
  return absl::OkStatus();
}

absl::Status EtcdGatewayClient::Stream(
    std::string_view path, const google::protobuf::Message& request, absl::Time deadline,
    absl::FunctionRef<absl::StatusOr<StreamControl>(std::string_view frame)> on_frame) {
  absl::StatusOr<std::string> body = ToJson(request);
  if (!body.ok()) return body.status();
  CURL* curl = TakeHandle();
  if (curl == nullptr) return absl::ResourceExhaustedError("libcurl cannot create a handle");
  absl::Cleanup give_back = [&] { ReturnHandle(curl); };

  Transfer transfer(curl, max_response_bytes_, &on_frame);
  if (absl::Status s = Post(path, *body, deadline, transfer); !s.ok()) return s;
  const std::string where = absl::StrFormat("etcd %s POST %s", transfer.endpoint, path);
  absl::Status status;
  if (transfer.http_status != 200) {
    status = GatewayErrorStatus(where, transfer.http_status, transfer.body);
  } else if (transfer.stopped) {
    if (transfer.frame_status.ok()) return absl::OkStatus();
    status = WithContext(transfer.frame_status, where);
  } else {
    status = absl::UnavailableError(absl::StrCat(where, ": etcd ended the stream"));
  }
  if (absl::IsUnavailable(status)) MoveOnFrom(transfer.endpoint_index);
  return status;
}

}  // namespace trainguard::etcd_internal
