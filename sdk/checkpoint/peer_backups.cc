#include "sdk/checkpoint/peer_backups.h"

#include <sys/statvfs.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "sdk/checkpoint/generation_wait.h"
#include "trainguard/store.h"

namespace trainguard {
namespace {

std::string MiB(uint64_t bytes) {
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string AddrKey(int rank) { return absl::StrCat("backup/addr/", rank); }
std::string SizeKey(int rank) { return PeerBackups::ArenaSizeKey(rank); }

}  // namespace

std::string PeerBackups::ArenaSizeKey(int rank) { return absl::StrCat("backup/size/", rank); }

absl::StatusOr<std::unique_ptr<PeerBackups>> PeerBackups::Create(const PeerBackupsOptions& options,
                                                                 Store* job_store,
                                                                 uint64_t arena_bytes) {
  BackupServiceOptions so;
  so.job_id = options.job_id;
  so.rank = options.rank;
  so.bind_address = options.host_addr.empty() ? "127.0.0.1" : options.host_addr;
  so.token = options.token;
  so.env = options.env;
  so.transport = options.transport;
  absl::StatusOr<std::unique_ptr<BackupService>> service = BackupService::Start(so);
  if (!service.ok()) return service.status();
  std::unique_ptr<PeerBackups> peers(new PeerBackups(options, job_store, *std::move(service)));
  const std::string address = absl::StrCat(peers->service_->address(), " ", options.host_name);
  Store* store = peers->store_.get();
  if (absl::Status s = store->Set(AddrKey(options.rank), address, options.timeout); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(peers->Where(), ": publishing the address of its "
                                                               "backup service: ",
                                               s.message()));
  }
  if (absl::Status s = store->Set(SizeKey(options.rank), absl::StrCat(arena_bytes), options.timeout);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = peers->CheckMemoryBudget(arena_bytes); !s.ok()) return s;
  return peers;
}

PeerBackups::PeerBackups(PeerBackupsOptions options, Store* job_store,
                         std::unique_ptr<BackupService> service)
    : options_(std::move(options)),
      store_(std::make_unique<PrefixStore>("ckpt", job_store)),
      service_(std::move(service)),
      limiter_(options_.rate_bytes_per_second) {}

PeerBackups::~PeerBackups() { cancel_.store(true); }

std::string PeerBackups::Where() const {
  return absl::StrFormat("peer backups (job %s, rank %d)", options_.job_id, options_.rank);
}

absl::Status PeerBackups::CheckMemoryBudget(uint64_t arena_bytes) {
  const BackupPlacement& p = options_.placement;
  const int per_host = p.ranks_per_host();
  const int host = options_.rank / per_host;
  std::vector<int> own;
  std::vector<int> held;
  for (int l = host * per_host; l < (host + 1) * per_host; ++l) {
    own.push_back(l);
    for (int s : p.SourceRanks(l)) held.push_back(s);
  }
  std::set<int> needed(own.begin(), own.end());
  needed.insert(held.begin(), held.end());
  std::vector<std::string> keys;
  for (int r : needed) keys.push_back(SizeKey(r));
  if (absl::Status s = WaitUnlessSuperseded(*store_, keys, options_.timeout, options_.superseded);
      !s.ok()) {
    // The ranks that never published (each fails at start-up before it does: its own shared memory
    // too small, a bad option) are the cause to name.
    std::vector<int> missing;
    absl::StatusOr<std::vector<std::optional<std::string>>> seen =
        store_->MultiGet(keys, absl::Seconds(1));
    int i = 0;
    for (int r : needed) {
      if (seen.ok() && !(*seen)[i].has_value()) missing.push_back(r);
      ++i;
    }
    return absl::Status(
        s.code(),
        absl::StrCat(Where(), ": waiting for the arena sizes of ranks ", absl::StrJoin(needed, ","),
                     " (the memory-budget check): ", s.message(),
                     missing.empty() ? ""
                                     : absl::StrCat("; rank(s) ", absl::StrJoin(missing, ","),
                                                    " never published theirs (did they fail at "
                                                    "start-up?)")));
  }
  absl::StatusOr<std::vector<std::optional<std::string>>> values =
      store_->MultiGet(keys, options_.timeout);
  if (!values.ok()) return values.status();
  std::map<int, uint64_t> size;
  int i = 0;
  for (int r : needed) {
    uint64_t bytes = 0;
    const std::optional<std::string>& v = (*values)[i++];
    if (!v.has_value() || !absl::SimpleAtoi(*v, &bytes)) {
      return absl::DataLossError(absl::StrCat(Where(), ": the store key ckpt/", SizeKey(r),
                                              " holds \"", v.value_or("(missing)"),
                                              "\", not a size in bytes"));
    }
    size[r] = bytes;
  }
  size[options_.rank] = arena_bytes;
  uint64_t own_bytes = 0;
  uint64_t held_bytes = 0;
  for (int r : own) own_bytes += size[r];
  for (int r : held) held_bytes += size[r];
  const uint64_t footprint = own_bytes + held_bytes;
  const std::string what = absl::StrFormat(
      "host slot %d needs %s of shared memory: %d own arena(s) of %s and %d backup(s) of %s it "
      "holds for ranks %s (%d copies, two slots each)",
      host, MiB(footprint), own.size(), MiB(own_bytes), held.size(), MiB(held_bytes),
      absl::StrJoin(held, ","), p.copies());
  if (options_.memory_budget_bytes > 0 && footprint > options_.memory_budget_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Where(), ": ", what, ", over the budget backup_memory_budget_mib = ",
                     MiB(options_.memory_budget_bytes)));
  }
  struct statvfs fs {};
  if (statvfs(options_.shm_dir.c_str(), &fs) == 0) {
    const uint64_t capacity = static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize;
    if (footprint > capacity) {
      return absl::ResourceExhaustedError(absl::StrCat(Where(), ": ", what, ", and ",
                                                       options_.shm_dir, " holds only ",
                                                       MiB(capacity)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, std::string>> PeerBackups::AddressOf(int rank) {
  absl::StatusOr<std::string> v = store_->Get(AddrKey(rank), options_.timeout);
  if (!v.ok()) {
    return absl::Status(v.status().code(),
                        absl::StrCat("the address of rank ", rank,
                                     "'s backup service (ckpt/", AddrKey(rank),
                                     "): ", v.status().message()));
  }
  std::pair<std::string, std::string> parts = absl::StrSplit(*v, absl::MaxSplits(' ', 1));
  if (parts.first.empty()) {
    return absl::DataLossError(absl::StrCat("ckpt/", AddrKey(rank), " holds \"", *v,
                                            "\", not \"ADDRESS:PORT HOST\""));
  }
  return parts;
}

absl::Status PeerBackups::Replicate(const Snapshotter::View& view, uint64_t chunk_bytes,
                                    uint64_t payload_capacity, uint64_t keep_fingerprint) {
  for (int holder : options_.placement.HolderRanks(options_.rank)) {
    absl::StatusOr<std::pair<std::string, std::string>> addr = AddressOf(holder);
    absl::Status status = addr.status();
    if (addr.ok()) {
      PushRequest request;
      request.holder_address = addr->first;
      request.token = options_.token;
      request.source_address = options_.host_addr;
      request.job_id = options_.job_id;
      request.source_rank = options_.rank;
      request.view = &view;
      request.chunk_bytes = chunk_bytes;
      request.payload_capacity = payload_capacity;
      request.keep_fingerprint = keep_fingerprint;
      request.limiter = &limiter_;
      request.deadline = absl::Now() + options_.timeout;
      request.cancel = &cancel_;
      request.transport = options_.transport;
      status = PushBackup(request).status();
    }
    if (!status.ok()) {
      return absl::Status(
          status.code(),
          absl::StrFormat("%s: the backup of step %d to rank %d%s: %s", Where(), view.info.step,
                          holder, addr.ok() ? absl::StrCat(" on host ", addr->second) : "",
                          status.message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PeerRestore> PeerBackups::Restore(int64_t step, uint64_t fingerprint,
                                                 Snapshotter* snapshotter,
                                                 StateRegistry* restore_into) {
  std::vector<std::string> why;
  std::vector<int> ranks;
  std::vector<std::string> addresses, hosts;
  for (int holder : options_.placement.HolderRanks(options_.rank)) {
    absl::StatusOr<std::pair<std::string, std::string>> addr = AddressOf(holder);
    if (!addr.ok()) {
      why.push_back(absl::StrCat("rank ", holder, ": ", addr.status().ToString()));
      continue;
    }
    ranks.push_back(holder);
    addresses.push_back(addr->first);
    hosts.push_back(addr->second);
  }
  if (!addresses.empty()) {
    FetchRequest request;
    request.token = options_.token;
    request.source_address = options_.host_addr;
    request.job_id = options_.job_id;
    request.source_rank = options_.rank;
    request.step = step;
    request.fingerprint = fingerprint;
    request.deadline = absl::Now() + options_.timeout;
    request.cancel = &cancel_;
    request.transport = options_.transport;
    // From every holder at once, straight into the arena, each chunk checked once as it lands
    // (and copied into the buffers at once, with `restore_into`; else the RestoreStep that
    // follows copies it out without hashing it again).
    absl::StatusOr<FetchedFromHolders> fetched =
        FetchBackupFromHolders(request, addresses, snapshotter, restore_into);
    if (fetched.ok()) {
      PeerRestore restore;
      for (size_t i = 0; i < fetched->holders.size(); ++i) {
        const HolderShare& share = fetched->holders[i];
        if (share.bytes > 0) {
          restore.holder_ranks.push_back(ranks[i]);
          restore.holder_hosts.push_back(hosts[i]);
        }
        if (!share.status.ok()) {
          // The others served its chunks; said once, for the operator who wonders about it.
          const std::string line = absl::StrFormat(
              "trainguard: %s: backup holder rank %d on host %s stopped serving step %d, the "
              "other holders served the rest: %s\n",
              Where(), ranks[i], hosts[i], step, share.status.ToString());
          std::fputs(line.c_str(), stderr);
        }
      }
      return restore;
    }
    why.push_back(absl::StrCat("holder rank(s) ", absl::StrJoin(ranks, ","), " on host(s) ",
                               absl::StrJoin(hosts, ","), ": ", fetched.status().ToString()));
  }
  return absl::NotFoundError(absl::StrFormat(
      "no backup holder of rank %d served step %d with fingerprint %016x (%s)", options_.rank,
      step, fingerprint, why.empty() ? "no holders" : absl::StrJoin(why, "; ")));
}

}  // namespace trainguard
