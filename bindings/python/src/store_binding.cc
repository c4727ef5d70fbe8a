// trainguard._C.Store, open_store and TcpStoreServer. Every Store call releases the GIL: a wait may
// last its whole timeout, and torch's process-group threads call back into Python meanwhile.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "sdk/rendezvous/tcp_store.h"
#include "status_error.h"
#include "store_binding.h"
#include "trainguard/store.h"

namespace nb = nanobind;

namespace trainguard::python {
namespace {

std::string BytesToString(const nb::bytes& b) { return std::string(b.c_str(), b.size()); }
nb::bytes StringToBytes(const std::string& s) { return nb::bytes(s.data(), s.size()); }

// A TcpStoreServer for tests and single-host jobs run without `trainguard run`.
class PyTcpStoreServer {
 public:
  PyTcpStoreServer(const std::string& token, const std::string& host, int port) {
    TcpStoreServerOptions options;
    options.host = host;
    options.port = port;
    options.job_token = token;
    server_ = ValueOrThrow(TcpStoreServer::Start(options));
  }
  int port() const { return Get().port(); }
  std::string address() const { return Get().address(); }
  void Close() {
    nb::gil_scoped_release release;
    server_.reset();
  }

 private:
  const TcpStoreServer& Get() const {
    if (server_ == nullptr) throw StatusError(absl::FailedPreconditionError("TcpStoreServer: closed"));
    return *server_;
  }
  std::unique_ptr<TcpStoreServer> server_;
};

}  // namespace

Store& PyStore::get() const {
  if (store_ == nullptr) throw StatusError(absl::FailedPreconditionError("trainguard Store: closed"));
  return *store_;
}

void BindStore(nb::module_& m) {
  nb::class_<PyStore>(m, "Store",
                      "The job's key-value store (thread-safe). Timeouts are in seconds.")
      .def(
          "set",
          [](PyStore& s, const std::string& key, const nb::bytes& value, double timeout) {
            std::string v = BytesToString(value);
            absl::Duration t = SecondsToDuration(timeout);
            nb::gil_scoped_release release;
            ThrowIfError(s.get().Set(key, v, t));
          },
          nb::arg("key"), nb::arg("value"), nb::arg("timeout"))
      .def(
          "get",
          [](PyStore& s, const std::string& key, double timeout) {
            absl::Duration t = SecondsToDuration(timeout);
            std::string value;
            {
              nb::gil_scoped_release release;
              value = ValueOrThrow(s.get().Get(key, t));
            }
            return StringToBytes(value);
          },
          nb::arg("key"), nb::arg("timeout"), "NotFoundError (a KeyError) when absent; no wait.")
      .def(
          "add",
          [](PyStore& s, const std::string& key, int64_t delta, double timeout) {
            absl::Duration t = SecondsToDuration(timeout);
            nb::gil_scoped_release release;
            return ValueOrThrow(s.get().Add(key, delta, t));
          },
          nb::arg("key"), nb::arg("delta"), nb::arg("timeout"))
      .def(
          "compare_set",
          [](PyStore& s, const std::string& key, std::optional<nb::bytes> expected,
             const nb::bytes& desired, double timeout) {
            std::optional<std::string> e;
            if (expected.has_value()) e = BytesToString(*expected);
            std::string d = BytesToString(desired);
            absl::Duration t = SecondsToDuration(timeout);
            CompareAndSetResult r;
            {
              nb::gil_scoped_release release;
              r = ValueOrThrow(s.get().CompareAndSet(key, e, d, t));
            }
            nb::object current = nb::none();
            if (r.current.has_value()) current = StringToBytes(*r.current);
            return nb::make_tuple(r.swapped, current);
          },
          nb::arg("key"), nb::arg("expected").none(), nb::arg("desired"), nb::arg("timeout"),
          "Sets key to desired if it holds expected (None: if absent). Returns (swapped, current).")
      .def(
          "delete",
          [](PyStore& s, const std::string& key, double timeout) {
            absl::Duration t = SecondsToDuration(timeout);
            nb::gil_scoped_release release;
            return ValueOrThrow(s.get().Delete(key, t));
          },
          nb::arg("key"), nb::arg("timeout"))
      .def(
          "multi_get",
          [](PyStore& s, const std::vector<std::string>& keys, double timeout) {
            absl::Duration t = SecondsToDuration(timeout);
            std::vector<std::optional<std::string>> values;
            {
              nb::gil_scoped_release release;
              values = ValueOrThrow(s.get().MultiGet(keys, t));
            }
            nb::list out;
            for (const auto& v : values) {
              if (v.has_value()) {
                out.append(StringToBytes(*v));
              } else {
                out.append(nb::none());
              }
            }
            return out;
          },
          nb::arg("keys"), nb::arg("timeout"))
      .def(
          "list_keys",
          [](PyStore& s, const std::string& prefix, double timeout) {
            absl::Duration t = SecondsToDuration(timeout);
            nb::gil_scoped_release release;
            return ValueOrThrow(s.get().ListKeys(prefix, t));
          },
          nb::arg("prefix"), nb::arg("timeout"))
      .def(
          "wait",
          [](PyStore& s, const std::vector<std::string>& keys, double timeout) {
            absl::Duration t = SecondsToDuration(timeout);
            nb::gil_scoped_release release;
            ThrowIfError(s.get().Wait(keys, t));
          },
          nb::arg("keys"), nb::arg("timeout"),
          "Blocks (without the GIL) until every key exists; DeadlineExceededError names the "
          "missing ones.")
      .def("close", [](PyStore& s) {
        nb::gil_scoped_release release;
        s.Close();
      });

  m.def(
      "open_store",
      [](const std::string& url, const std::string& job_id, const std::string& token,
         double timeout, const std::string& source_address) {
        absl::Duration t = SecondsToDuration(timeout);
        std::unique_ptr<Store> store;
        {
          nb::gil_scoped_release release;
          OpenStoreOptions options;
          options.source_address = source_address;
          store = ValueOrThrow(OpenStore(url, job_id, token, t, options));
        }
        return new PyStore(std::move(store));
      },
      nb::arg("url"), nb::arg("job_id"), nb::arg("token") = "", nb::arg("timeout") = 30.0,
      nb::arg("source_address") = "", nb::rv_policy::take_ownership);

  nb::class_<PyTcpStoreServer>(m, "TcpStoreServer",
                               "A store server in this process (tests, single-host jobs).")
      .def(nb::init<const std::string&, const std::string&, int>(), nb::arg("token"),
           nb::arg("host") = "127.0.0.1", nb::arg("port") = 0)
      .def_prop_ro("port", &PyTcpStoreServer::port)
      .def_prop_ro("address", &PyTcpStoreServer::address)
      .def("close", &PyTcpStoreServer::Close);
}

}  // namespace trainguard::python
