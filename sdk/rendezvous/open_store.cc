// OpenStore: from a store URL to a connected Store.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "sdk/rendezvous/etcd_store.h"
#include "sdk/rendezvous/tcp_store.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

absl::Status BadUrl(std::string_view url, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat("store URL '%s': %s", url, why));
}

// "HOST:PORT" with a port in 1..65535.
absl::StatusOr<std::pair<std::string, int>> HostPort(std::string_view url,
                                                     absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return BadUrl(url, absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  return std::make_pair(std::string(address.substr(0, colon)), port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenStore(std::string_view url, std::string_view job_id,
                                                 std::string_view token, absl::Duration timeout) {
  return OpenStore(url, job_id, token, timeout, OpenStoreOptions{});
}

absl::StatusOr<std::unique_ptr<Store>> OpenStore(std::string_view url, std::string_view job_id,
                                                 std::string_view token, absl::Duration timeout,
                                                 const OpenStoreOptions& open_options) {
  absl::string_view rest(url.data(), url.size());
  if (absl::ConsumePrefix(&rest, "tcp://")) {
    absl::StatusOr<std::pair<std::string, int>> address = HostPort(url, rest);
    if (!address.ok()) return address.status();
    TcpStoreOptions options;
    options.host = address->first;
    options.port = address->second;
    options.job_id = std::string(job_id);
    options.job_token = std::string(token);
    options.connect_timeout = timeout;
    options.source_address = open_options.source_address;
    absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect(options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<Store>(std::move(*store));
  }
  if (absl::ConsumePrefix(&rest, "etcd://")) {
    EtcdStoreOptions options;
    for (absl::string_view endpoint : absl::StrSplit(rest, ',')) {
      absl::StatusOr<std::pair<std::string, int>> address = HostPort(url, endpoint);
      if (!address.ok()) return address.status();
      options.endpoints.push_back(absl::StrCat("http://", endpoint));
    }
    options.job_id = std::string(job_id);
    options.connect_timeout = timeout;
    options.source_address = open_options.source_address;
    absl::StatusOr<std::unique_ptr<EtcdStore>> store = EtcdStore::Connect(options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<Store>(std::move(*store));
  }
  return BadUrl(url, "the scheme must be tcp:// or etcd://");
}

}  // namespace trainguard
