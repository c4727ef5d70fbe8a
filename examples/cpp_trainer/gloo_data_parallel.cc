#include "gloo_data_parallel.h"

#include <chrono>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gloo/allreduce.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "trainguard/collectives.h"
#include "trainguard/errors.h"
#include "trainguard/gloo_collectives.h"
#include "trainguard/gloo_store.h"
#include "trainguard/store.h"

namespace cpp_trainer {
namespace {

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooDataParallel>> GlooDataParallel::Connect(const Config& config) {
  const std::string where = absl::StrCat("rank ", config.rank, ": gloo rendezvous in ",
                                         config.store_dir, " with id '", config.rendezvous_id, "'");
  std::error_code ec;
  if (config.store == nullptr) std::filesystem::create_directories(config.store_dir, ec);
  if (ec) {
    return absl::UnavailableError(
        absl::StrCat(where, ": cannot create the directory: ", ec.message()));
  }
  try {
    gloo::transport::tcp::attr attr;
    // Every rank of this example runs on this machine; a host simulated on its own loopback
    // address (TRAINGUARD_HOST_ADDR, e.g. 127.0.1.3) listens and connects from that address, so
    // that cutting the host off by address cuts its collectives too.
    const char* host_addr = std::getenv("TRAINGUARD_HOST_ADDR");
    attr.hostname = host_addr != nullptr && host_addr[0] != '\0' ? host_addr : "127.0.0.1";
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(config.rank, config.world_size);
    // The context's timeout bounds connectFullMesh's wait for the peers' addresses and, as the
    // default of every collective's options, each collective.
    context->setTimeout(ToChrono(config.timeout));
    if (config.store != nullptr) {
      trainguard::PrefixStore scoped(config.rendezvous_id, config.store);
      trainguard::GlooStore store(&scoped, config.timeout);
      context->connectFullMesh(store, device);
    } else {
      gloo::rendezvous::FileStore file_store(config.store_dir);
      gloo::rendezvous::PrefixStore store(config.rendezvous_id, file_store);
      context->connectFullMesh(store, device);
    }
    return std::unique_ptr<GlooDataParallel>(new GlooDataParallel(
        config.rank, config.world_size, std::move(context), config.tracker, config.comm_id));
  } catch (...) {
    const std::string what = trainguard::DescribeGlooException();
    // gloo's FileStore refuses to overwrite a key: that is a previous launch's leftover, not a
    // peer.
    const char* hint = absl::StrContains(what, "already exists")
                           ? " (files of an earlier launch: use a new rendezvous id or run dir)"
                           : "";
    return absl::UnavailableError(absl::StrCat(
        where, " failed (timeout ", absl::FormatDuration(config.timeout), "): ", what, hint));
  }
}

GlooDataParallel::GlooDataParallel(int rank, int world_size, std::shared_ptr<gloo::Context> context,
                                   trainguard::CollectiveTracker* tracker, uint64_t comm_id)
    : rank_(rank),
      world_size_(world_size),
      context_(std::move(context)),
      tracker_(tracker),
      comm_id_(comm_id) {}

GlooDataParallel::~GlooDataParallel() {
  if (failed_collectives_.empty()) {
    return;
  }
  // The failed collectives hold the context too (gloo's options keep a shared_ptr to it), so it
  // would outlive their buffers. Closing every pair unregisters it from gloo's I/O thread, which
  // waits for that thread to let go of it: after this, nothing touches the buffers.
  try {
    context_->closeConnections();
  } catch (...) {
    // Already broken; the buffers are freed below either way.
  }
}

void GlooDataParallel::AllreduceSum(std::span<float> data) {
  const uint64_t sequence = collectives_++;
  trainguard::ScopedCollective tracked(tracker_, "all_reduce", comm_id_, data.size_bytes());
  if (next_delay_ > absl::ZeroDuration()) absl::SleepFor(std::exchange(next_delay_, {}));
  auto options = std::make_unique<gloo::AllreduceOptions>(context_);
  try {
    options->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    options->setOutput(data.data(), data.size());
    options->setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    // Operations in flight at the same time need distinct tags; this communicator runs one at a
    // time, so the sequence number is only a help when reading gloo's messages.
    options->setTag(static_cast<uint32_t>(sequence));
    if (std::exchange(drop_next_, false)) context_->closeConnections();
    gloo::allreduce(*options);
  } catch (...) {
    failed_collectives_.push_back(std::move(options));
    throw trainguard::CommunicationError(absl::StrCat(
        "rank ", rank_, ": gloo allreduce #", sequence, " of ", data.size(), " floats across ",
        world_size_, " ranks failed: ", trainguard::DescribeGlooException()));
  }
}

void GlooDataParallel::Abort() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (std::exchange(aborted_, true)) return;
  trainguard::AbortGlooContext(*context_, absl::StrCat("rank ", rank_, ": communicator ", comm_id_,
                                                       " aborted by trainguard"));
}

absl::Status GlooDataParallel::Broadcast(void* data, size_t bytes, trainguard::Device device,
                                         int root) {
  if (device.kind != trainguard::Device::Kind::kHost) {
    return absl::UnimplementedError(absl::StrCat(
        "rank ", rank_, ": the example's gloo communicator broadcasts host memory only"));
  }
  const uint64_t sequence = collectives_++;
  trainguard::ScopedCollective tracked(tracker_, "broadcast", comm_id_, bytes, root);
  auto options = std::make_unique<gloo::BroadcastOptions>(context_);
  try {
    options->setOutput(static_cast<uint8_t*>(data), bytes);
    options->setRoot(root);
    options->setTag(static_cast<uint32_t>(sequence));
    gloo::broadcast(*options);
  } catch (...) {
    failed_collectives_.push_back(std::move(options));
    return absl::UnavailableError(absl::StrCat("rank ", rank_, ": gloo broadcast #", sequence,
                                               " of ", bytes, " bytes from rank ", root,
                                               " failed: ", trainguard::DescribeGlooException()));
  }
  return absl::OkStatus();
}

}  // namespace cpp_trainer
