// OpenStore: from a store URL to a connected Store.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "sdk/core/socket_address.h"
#include "sdk/rendezvous/etcd_store.h"
#include "sdk/rendezvous/tcp_store.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

absl::Status BadUrl(std::string_view url, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat("store URL '%s': %s", url, why));
}

// "HOST:PORT" with a port in 1..65535.
absl::StatusOr<HostPort> StoreHostPort(std::string_view url, absl::string_view address) {
  absl::StatusOr<HostPort> split =
      SplitHostPort(std::string_view(address.data(), address.size()), "the address");
  if (!split.ok()) {
    const absl::string_view why = split.status().message();
    return BadUrl(url, std::string_view(why.data(), why.size()));
  }
  return split;
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
    absl::StatusOr<HostPort> address = StoreHostPort(url, rest);
    if (!address.ok()) return address.status();
    TcpStoreOptions options;
    options.host = address->host;
    options.port = address->port;
    options.job_id = std::string(job_id);
    options.job_token = std::string(token);
    options.connect_timeout = timeout;
    options.source_address = open_options.source_address;
    options.control = open_options.control;
    absl::StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::Connect(options);
    if (!store.ok()) return store.status();
    return std::unique_ptr<Store>(std::move(*store));
  }
  if (absl::ConsumePrefix(&rest, "etcd://")) {
    EtcdStoreOptions options;
    for (absl::string_view endpoint : absl::StrSplit(rest, ',')) {
      absl::StatusOr<HostPort> address = StoreHostPort(url, endpoint);
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
