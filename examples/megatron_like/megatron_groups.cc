#include "megatron_groups.h"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "trainguard/collectives.h"
#include "trainguard/errors.h"
#include "trainguard/gloo_collectives.h"
#include "trainguard/gloo_store.h"
#include "trainguard/store.h"

namespace megatron_like {
namespace {

using trainguard::ParallelDim;

std::chrono::milliseconds ToChrono(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// One gloo context over `size` ranks, this one being `rank`, meeting under `name` in the
// generation's store. Throws what gloo throws.
std::shared_ptr<gloo::Context> ConnectContext(trainguard::Store* store, const std::string& name,
                                              int rank, int size, absl::Duration timeout) {
  gloo::transport::tcp::attr attr;
  // A host simulated on its own loopback address (TRAINGUARD_HOST_ADDR) listens on it, so that
  // cutting the host off cuts its groups too.
  const char* host_addr = std::getenv("TRAINGUARD_HOST_ADDR");  // NOLINT(concurrency-mt-unsafe)
  attr.hostname = host_addr != nullptr && host_addr[0] != '\0' ? host_addr : "127.0.0.1";
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(ToChrono(timeout));
  trainguard::PrefixStore scoped(name, store);
  trainguard::GlooStore gloo_store(&scoped, timeout);
  std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
  context->connectFullMesh(gloo_store, device);
  return context;
}

int IndexIn(const std::vector<int>& group, int rank) {
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] == rank) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

MegatronGroups::MegatronGroups(int rank, absl::Duration timeout) : rank_(rank), timeout_(timeout) {}

absl::StatusOr<std::unique_ptr<MegatronGroups>> MegatronGroups::Connect(
    const trainguard::CommunicatorSpec& spec, const trainguard::Topology& topology,
    absl::Duration timeout) {
  const int rank = spec.rank;
  if (spec.store == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank,
                     ": the megatron_like example meets its groups through the job's store: run "
                     "it under `trainguard run`"));
  }
  auto groups = std::unique_ptr<MegatronGroups>(new MegatronGroups(rank, timeout));
  groups->tracker_ = spec.tracker;
  // Every rank connects its groups in the same order of kinds (tensor, data, the link to the
  // previous stage, the one to the next): each group's members all reach it, so none waits for a
  // member busy connecting another.
  std::string step = "finding its groups";
  try {
    absl::StatusOr<trainguard::RankCoordinates> at = topology.CoordinatesOf(rank);
    absl::StatusOr<std::vector<int>> tp = topology.GroupOf(rank, ParallelDim::kTensor);
    absl::StatusOr<std::vector<int>> dp = topology.GroupOf(rank, ParallelDim::kData);
    absl::StatusOr<std::vector<int>> pp = topology.GroupOf(rank, ParallelDim::kPipeline);
    absl::StatusOr<int> tp_index = topology.GroupIndexOf(rank, ParallelDim::kTensor);
    absl::StatusOr<int> dp_index = topology.GroupIndexOf(rank, ParallelDim::kData);
    absl::StatusOr<int> pp_index = topology.GroupIndexOf(rank, ParallelDim::kPipeline);
    for (const absl::Status& s : {at.status(), tp.status(), dp.status(), pp.status(),
                                  tp_index.status(), dp_index.status(), pp_index.status()}) {
      if (!s.ok()) return s;
    }
    const int world = topology.world_size();
    const int tp_groups = world / topology.tp();
    const int dp_groups = world / topology.dp();
    const int stages = topology.pp();

    step = "connecting its tensor-parallel group";
    groups->tp_ = {ConnectContext(spec.store, absl::StrCat("tp", *tp_index), IndexIn(*tp, rank),
                                  static_cast<int>(tp->size()), timeout),
                   spec.GroupId(*tp_index), absl::StrCat("tp", *tp_index), 0};
    step = "connecting its data-parallel group";
    groups->dp_group_ = *dp;
    groups->dp_rank_ = IndexIn(*dp, rank);
    groups->dp_ = {ConnectContext(spec.store, absl::StrCat("dp", *dp_index), groups->dp_rank_,
                                  static_cast<int>(dp->size()), timeout),
                   spec.GroupId(tp_groups + *dp_index), absl::StrCat("dp", *dp_index), 0};
    // The link between stages s and s + 1 of pipeline group g.
    auto link = [&](int stage) {
      const std::string name = absl::StrCat("pp", *pp_index, ".link", stage);
      const int lower = (*pp)[stage];
      const int upper = (*pp)[stage + 1];
      auto l = std::make_unique<Link>();
      l->channel = {ConnectContext(spec.store, name, rank == lower ? 0 : 1, 2, timeout),
                    spec.GroupId(tp_groups + dp_groups + *pp_index * (stages - 1) + stage), name,
                    0};
      l->peer_rank = rank == lower ? upper : lower;
      l->peer = rank == lower ? 1 : 0;
      return l;
    };
    if (at->pp > 0) {
      step = "connecting the link to the previous stage";
      groups->prev_ = link(at->pp - 1);
    }
    if (at->pp + 1 < stages) {
      step = "connecting the link to the next stage";
      groups->next_ = link(at->pp);
    }
  } catch (...) {
    return absl::UnavailableError(absl::StrCat("rank ", rank, ": ", step, " in ", spec.name,
                                               " (timeout ", absl::FormatDuration(timeout),
                                               ") failed: ", trainguard::DescribeGlooException()));
  }
  return groups;
}

MegatronGroups::~MegatronGroups() {
  if (failed_.empty()) return;
  // A failed operation's buffers may still be written by gloo's I/O thread until its context's
  // pairs are closed.
  for (Channel* c :
       {&tp_, &dp_, next_ ? &next_->channel : nullptr, prev_ ? &prev_->channel : nullptr}) {
    if (c == nullptr || c->context == nullptr) continue;
    try {
      c->context->closeConnections();
    } catch (...) {
      // Already broken.
    }
  }
}

std::vector<trainguard::Communicator::Group> MegatronGroups::Groups() const {
  std::vector<Group> groups = {{tp_.comm_id, tp_.name}, {dp_.comm_id, dp_.name}};
  if (prev_) groups.push_back({prev_->channel.comm_id, prev_->channel.name});
  if (next_) groups.push_back({next_->channel.comm_id, next_->channel.name});
  return groups;
}

void MegatronGroups::Abort() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (std::exchange(aborted_, true)) return;
  const std::string why = absl::StrCat("rank ", rank_, ": groups aborted by trainguard");
  for (const Channel* c :
       {&tp_, &dp_, next_ ? &next_->channel : nullptr, prev_ ? &prev_->channel : nullptr}) {
    if (c != nullptr && c->context != nullptr) trainguard::AbortGlooContext(*c->context, why);
  }
}

absl::Status MegatronGroups::Broadcast(void*, size_t bytes, trainguard::Device, int root) {
  return absl::UnimplementedError(absl::StrCat(
      "rank ", rank_, ": cannot take ", bytes, " bytes of state from rank ", root,
      ": a megatron_like rank's state is its own shard of the model and of the optimizer; it is "
      "restored from a checkpoint (checkpoint_every_steps)"));
}

void MegatronGroups::Fail(const std::string& what, uint64_t seq) {
  throw trainguard::CommunicationError(absl::StrCat(
      "rank ", rank_, ": ", what, " #", seq, " failed: ", trainguard::DescribeGlooException()));
}

void MegatronGroups::TpAllreduce(std::span<float> data) {
  if (tp_.context->size == 1) return;
  const uint64_t seq = tp_.seq++;
  trainguard::ScopedCollective tracked(tracker_, "all_reduce", tp_.comm_id, data.size_bytes());
  auto options = std::make_shared<gloo::AllreduceOptions>(tp_.context);
  try {
    options->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    options->setOutput(data.data(), data.size());
    options->setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    options->setTag(static_cast<uint32_t>(seq));
    gloo::allreduce(*options);
  } catch (...) {
    failed_.push_back(options);
    Fail(absl::StrCat(tp_.name, " all_reduce of ", data.size(), " floats"), seq);
  }
}

void MegatronGroups::DpReduceScatter(std::span<float> data) {
  const int members = dp();
  const uint64_t seq = dp_.seq++;
  trainguard::ScopedCollective tracked(tracker_, "reduce_scatter", dp_.comm_id, data.size_bytes());
  if (members == 1) return;
  const int shard = static_cast<int>(data.size() / members);
  std::shared_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs;
  try {
    rs = std::make_shared<gloo::ReduceScatterHalvingDoubling<float>>(
        dp_.context, std::vector<float*>{data.data()}, static_cast<int>(data.size()),
        std::vector<int>(members, shard));
    rs->run();
  } catch (...) {
    failed_.push_back(rs);
    Fail(absl::StrCat(dp_.name, " reduce_scatter of ", data.size(), " floats"), seq);
  }
}

void MegatronGroups::DpAllGather(std::span<float> data) {
  const int members = dp();
  const uint64_t seq = dp_.seq++;
  trainguard::ScopedCollective tracked(tracker_, "all_gather", dp_.comm_id, data.size_bytes());
  if (members == 1) return;
  const size_t shard = data.size() / members;
  auto input = std::make_shared<std::vector<float>>(data.begin() + dp_rank_ * shard,
                                                    data.begin() + (dp_rank_ + 1) * shard);
  auto options = std::make_shared<gloo::AllgatherOptions>(dp_.context);
  try {
    options->setInput(input->data(), shard);
    options->setOutput(data.data(), data.size());
    options->setTag(static_cast<uint32_t>(seq));
    options->setTimeout(ToChrono(timeout_));
    gloo::allgather(*options);
  } catch (...) {
    failed_.push_back(options);
    failed_.push_back(input);
    Fail(absl::StrCat(dp_.name, " all_gather of ", data.size(), " floats"), seq);
  }
}

void MegatronGroups::Send(Link& link, std::span<const float> data, const char* what) {
  Channel& c = link.channel;
  const uint64_t seq = c.seq++;
  trainguard::ScopedCollective tracked(tracker_, "send", c.comm_id, data.size_bytes(),
                                       link.peer_rank);
  if (std::exchange(stop_in_next_send_, false)) raise(SIGSTOP);
  std::shared_ptr<gloo::transport::UnboundBuffer> buffer;
  try {
    buffer = c.context->createUnboundBuffer(const_cast<float*>(data.data()), data.size_bytes());
    buffer->send(link.peer, seq);
    if (!buffer->waitSend(ToChrono(timeout_))) throw gloo::IoException("send aborted");
  } catch (...) {
    failed_.push_back(buffer);
    Fail(absl::StrCat(c.name, " send of ", what, " to rank ", link.peer_rank), seq);
  }
}

void MegatronGroups::Recv(Link& link, std::span<float> data, const char* what) {
  Channel& c = link.channel;
  const uint64_t seq = c.seq++;
  trainguard::ScopedCollective tracked(tracker_, "recv", c.comm_id, data.size_bytes(),
                                       link.peer_rank);
  std::shared_ptr<gloo::transport::UnboundBuffer> buffer;
  try {
    buffer = c.context->createUnboundBuffer(data.data(), data.size_bytes());
    buffer->recv(link.peer, seq);
    if (!buffer->waitRecv(ToChrono(timeout_))) throw gloo::IoException("receive aborted");
  } catch (...) {
    failed_.push_back(buffer);
    Fail(absl::StrCat(c.name, " receive of ", what, " from rank ", link.peer_rank), seq);
  }
}

void MegatronGroups::SendNext(std::span<const float> data) { Send(*next_, data, "activations"); }
void MegatronGroups::RecvPrev(std::span<float> data) { Recv(*prev_, data, "activations"); }
void MegatronGroups::SendPrev(std::span<const float> data) { Send(*prev_, data, "gradients"); }
void MegatronGroups::RecvNext(std::span<float> data) { Recv(*next_, data, "gradients"); }

}  // namespace megatron_like
