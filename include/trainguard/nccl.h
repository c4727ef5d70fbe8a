// NCCL collectives that a CollectiveTracker sees: thin wrappers that bracket each NCCL call with
// CUDA events on its stream (CollectiveTracker::BeginOnStream/EndOnStream), so the watchdog knows
// which collective a rank is stuck in and for how long, without ever synchronising the stream.
//
//     tracker->EnableGpu(local_rank);
//     sdk::nccl::RegisterNcclComm(*tracker, kDp, "dp", comm);   // a hang calls ncclCommAbort(comm)
//     TRAINGUARD_NCCL_CHECK(sdk::nccl::AllReduce(*tracker, kDp, grads, grads, n, ncclFloat,
//     ncclSum,
//                                                comm, stream));
//
// Each wrapper takes the tracker and the communicator's tracker id, then exactly the arguments of
// the NCCL function it wraps, and returns NCCL's result. `bytes` in the records is the size of
// this rank's send buffer (count x element size; for ReduceScatter, recvcount x size x ranks).
// Inside ncclGroupStart/ncclGroupEnd the events bracket the enqueue of the group's members, which
// NCCL launches at ncclGroupEnd: wrap the group as a whole with BeginOnStream/EndOnStream instead.
//
// Header-only: it needs nccl.h and cuda_runtime_api.h, which only programs that use NCCL include
// (and link: -lnccl -lcudart). ncclCommAbort, called from the watchdog thread while the training
// thread is blocked in NCCL, is the documented way to unblock it; the communicator is unusable
// afterwards (rebuild it for the next generation and register the new one).
//
// Thread safety: as the tracker and NCCL.
#ifndef TRAINGUARD_NCCL_H_
#define TRAINGUARD_NCCL_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "trainguard/collectives.h"

namespace trainguard {
namespace nccl {

// Bytes per element of `type`; 0 for a type this header does not know.
inline size_t TypeSize(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
    case ncclBfloat16:
#endif
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 1;  // fp8 variants (NCCL >= 2.19) and later additions
  }
}

// Registers `comm` with the tracker under `comm_id`; a hang calls ncclCommAbort(comm) once.
// Unregister it (tracker.UnregisterCommunicator) before ncclCommDestroy.
inline absl::Status RegisterNcclComm(CollectiveTracker& tracker, uint64_t comm_id, std::string name,
                                     ncclComm_t comm) {
  return tracker.RegisterCommunicator(comm_id, std::move(name),
                                      [comm] { (void)ncclCommAbort(comm); });
}

namespace internal {

// Begin on the stream, run the NCCL call, End on the stream (also when the call failed: nothing
// was enqueued then, so the end event fires right after the start event).
template <typename Call>
ncclResult_t Tracked(CollectiveTracker& tracker, const char* op, uint64_t comm_id, size_t bytes,
                     int peer, cudaStream_t stream, Call&& call) {
  const CollectiveHandle handle = tracker.BeginOnStream(op, comm_id, bytes, peer, stream);
  const ncclResult_t result = call();
  tracker.EndOnStream(handle, stream);
  return result;
}

}  // namespace internal

inline ncclResult_t AllReduce(CollectiveTracker& tracker, uint64_t comm_id, const void* sendbuff,
                              void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                              ncclComm_t comm, cudaStream_t stream) {
  return internal::Tracked(
      tracker, "all_reduce", comm_id, count * TypeSize(datatype), -1, stream,
      [&] { return ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream); });
}

inline ncclResult_t Broadcast(CollectiveTracker& tracker, uint64_t comm_id, const void* sendbuff,
                              void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream) {
  return internal::Tracked(
      tracker, "broadcast", comm_id, count * TypeSize(datatype), root, stream,
      [&] { return ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream); });
}

inline ncclResult_t AllGather(CollectiveTracker& tracker, uint64_t comm_id, const void* sendbuff,
                              void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                              ncclComm_t comm, cudaStream_t stream) {
  return internal::Tracked(
      tracker, "all_gather", comm_id, sendcount * TypeSize(datatype), -1, stream,
      [&] { return ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream); });
}

inline ncclResult_t ReduceScatter(CollectiveTracker& tracker, uint64_t comm_id,
                                  const void* sendbuff, void* recvbuff, size_t recvcount,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream) {
  int ranks = 1;
  (void)ncclCommCount(comm, &ranks);
  return internal::Tracked(
      tracker, "reduce_scatter", comm_id,
      recvcount * TypeSize(datatype) * static_cast<size_t>(ranks), -1, stream,
      [&] { return ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream); });
}

inline ncclResult_t Send(CollectiveTracker& tracker, uint64_t comm_id, const void* sendbuff,
                         size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                         cudaStream_t stream) {
  return internal::Tracked(tracker, "send", comm_id, count * TypeSize(datatype), peer, stream,
                           [&] { return ncclSend(sendbuff, count, datatype, peer, comm, stream); });
}

inline ncclResult_t Recv(CollectiveTracker& tracker, uint64_t comm_id, void* recvbuff, size_t count,
                         ncclDataType_t datatype, int peer, ncclComm_t comm, cudaStream_t stream) {
  return internal::Tracked(tracker, "recv", comm_id, count * TypeSize(datatype), peer, stream,
                           [&] { return ncclRecv(recvbuff, count, datatype, peer, comm, stream); });
}

}  // namespace nccl
}  // namespace trainguard

#endif  // TRAINGUARD_NCCL_H_
