#include "gloo_data_parallel.h"

#include <chrono>
#include <exception>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "trainguard/errors.h"

namespace cpp_trainer {
namespace {

// gloo throws gloo::Exception subclasses for I/O errors and timeouts, and gloo::EnforceNotMet (not a
// std::runtime_error) for failed internal checks; this gives both, and anything else, one message.
std::string DescribeCurrentException() {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    return absl::StrCat("gloo I/O error: ", e.what());
  } catch (const gloo::EnforceNotMet& e) {
    return absl::StrCat("gloo check failed: ", e.what());
  } catch (const gloo::Exception& e) {
    return absl::StrCat("gloo error: ", e.what());
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooDataParallel>> GlooDataParallel::Connect(const Config& config) {
  const std::string where = absl::StrCat("rank ", config.rank, ": gloo rendezvous in ", config.store_dir,
                                         " with id '", config.rendezvous_id, "'");
  std::error_code ec;
  std::filesystem::create_directories(config.store_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(where, ": cannot create the directory: ", ec.message()));
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";  // every rank of this example runs on this machine
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(config.store_dir);
    gloo::rendezvous::PrefixStore store(config.rendezvous_id, file_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(config.rank, config.world_size);
    // The context's timeout bounds connectFullMesh's wait for the peers' addresses and, as the default
    // of every collective's options, each collective.
    context->setTimeout(ToChrono(config.timeout));
    context->connectFullMesh(store, device);
    return std::unique_ptr<GlooDataParallel>(
        new GlooDataParallel(config.rank, config.world_size, std::move(context)));
  } catch (...) {
    const std::string what = DescribeCurrentException();
    // gloo's FileStore refuses to overwrite a key: that is a previous launch's leftover, not a peer.
    const char* hint = absl::StrContains(what, "already exists")
                           ? " (files of an earlier launch: use a new rendezvous id or run dir)"
                           : "";
    return absl::UnavailableError(absl::StrCat(where, " failed (timeout ",
                                               absl::FormatDuration(config.timeout), "): ", what,
                                               hint));
  }
}

GlooDataParallel::GlooDataParallel(int rank, int world_size, std::shared_ptr<gloo::Context> context)
    : rank_(rank), world_size_(world_size), context_(std::move(context)) {}

GlooDataParallel::~GlooDataParallel() = default;

void GlooDataParallel::AllreduceSum(std::span<float> data) {
  const uint64_t sequence = collectives_++;
  try {
    gloo::AllreduceOptions options(context_);
    options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    options.setOutput(data.data(), data.size());
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    // Operations in flight at the same time need distinct tags; this communicator runs one at a time,
    // so the sequence number is only a help when reading gloo's messages.
    options.setTag(static_cast<uint32_t>(sequence));
    gloo::allreduce(options);
  } catch (...) {
    throw trainguard::CommunicationError(
        absl::StrCat("rank ", rank_, ": gloo allreduce #", sequence, " of ", data.size(),
                     " floats across ", world_size_, " ranks failed: ", DescribeCurrentException()));
  }
}

}  // namespace cpp_trainer
