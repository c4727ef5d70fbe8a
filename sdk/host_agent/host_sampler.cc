#include "sdk/host_agent/host_sampler.h"

#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "sdk/core/proc_stat.h"
#include "sdk/health/fail_slow_detector.h"

namespace trainguard {

int64_t ProcessCpuTicks(pid_t pid) {
  absl::StatusOr<ProcStat> stat = ReadProcStat(pid);
  return stat.ok() ? stat->cpu_ticks() : -1;
}

int64_t ProcessRunDelayNs(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/task/", pid, "/schedstat"));
  int64_t on_cpu = 0, waited = -1;
  if (!(in >> on_cpu >> waited)) return -1;
  return waited;
}

std::optional<TcpSocketTotals> ProcessTcpTotals(pid_t pid, int64_t active_ms) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return std::nullopt;
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* dir = opendir(fd_dir.c_str());
  if (dir == nullptr) {
    close(pidfd);
    return std::nullopt;
  }
  TcpSocketTotals totals;
  std::vector<double> active_rtts_ms;
  bool any_readable = false;
  while (dirent* entry = readdir(dir)) {
    int target_fd = -1;
    if (!absl::SimpleAtoi(entry->d_name, &target_fd)) continue;
    char link[64];
    const ssize_t n =
        readlink(absl::StrCat(fd_dir, "/", entry->d_name).c_str(), link, sizeof(link) - 1);
    if (n <= 0 || std::string_view(link, static_cast<size_t>(n)).rfind("socket:", 0) != 0) {
      continue;
    }
    const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, target_fd, 0));
    if (fd < 0) continue;
    any_readable = true;
    tcp_info info{};
    socklen_t length = sizeof(info);
    // Not TCP (a Unix socket, UDP): ENOPROTOOPT. A listening socket has no peer to measure.
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) == 0 &&
        info.tcpi_state != TCP_LISTEN && info.tcpi_state != TCP_CLOSE) {
      ++totals.sockets;
      totals.retransmits += info.tcpi_total_retrans;
      if (static_cast<int64_t>(info.tcpi_last_data_sent) <= active_ms) {
        active_rtts_ms.push_back(static_cast<double>(info.tcpi_rtt) / 1000.0);
      }
    }
    close(fd);
  }
  closedir(dir);
  close(pidfd);
  // No socket duplicated: none is open, or pidfd_getfd was refused. Either way there is nothing to
  // compare this rank's counters with, rather than a rank that retransmits nothing.
  if (!any_readable) return std::nullopt;
  if (!active_rtts_ms.empty()) {
    totals.active_sockets = static_cast<int>(active_rtts_ms.size());
    totals.active_rtt_ms = UpperMedian(std::move(active_rtts_ms));
  }
  return totals;
}

double ProcProcessProbe::TicksPerSecond() {
  static const double kTicksPerSecond = static_cast<double>(sysconf(_SC_CLK_TCK));
  return kTicksPerSecond;
}

HostSampler::HostSampler(std::unique_ptr<GpuMetricsSource> gpus,
                         std::optional<std::string> cuda_visible_devices,
                         std::unique_ptr<ProcessProbe> processes)
    : gpus_(std::move(gpus)),
      processes_(processes != nullptr ? std::move(processes)
                                      : std::make_unique<ProcProcessProbe>()),
      cuda_visible_devices_(std::move(cuda_visible_devices)) {}

std::optional<HostMetricsRecord> HostSampler::Sample(absl::Time now,
                                                     const std::vector<RankProcess>& ranks) {
  const double seconds = absl::ToDoubleSeconds(now - last_);
  const bool have_interval = last_ != absl::InfinitePast() && seconds > 0;
  last_ = now;
  const double ticks_per_second = processes_->TicksPerSecond();
  double compute_ms = 0, collective_ms = 0, steps = 0, cpu = 0, wait_ms = 0, retrans = 0, rtt = 0,
         collective_mb_s = 0;
  int with_work = 0, with_cpu = 0, with_wait = 0, with_retrans = 0, with_rtt = 0,
      with_throughput = 0;
  std::map<std::string, std::pair<double, int>> phase_ms;  // name -> (sum over ranks, ranks)
  std::map<int, Previous> current;
  for (const RankProcess& r : ranks) {
    Previous now_seen;
    now_seen.pid = r.pid;
    now_seen.cpu_ticks = processes_->CpuTicks(r.pid);
    now_seen.run_delay_ns = processes_->RunDelayNs(r.pid);
    const std::optional<TcpSocketTotals> tcp = processes_->TcpTotals(r.pid);
    if (tcp.has_value()) {
      now_seen.tcp_retransmits = tcp->retransmits;
      if (tcp->active_sockets > 0) {
        rtt += tcp->active_rtt_ms;
        ++with_rtt;
      }
    }
    if (r.work_record.has_value()) {
      absl::StatusOr<RankWorkRecord> parsed = ParseRankWorkRecord(*r.work_record);
      if (parsed.ok()) now_seen.work = *parsed;
    }
    const auto before = previous_.find(r.rank);
    if (have_interval && before != previous_.end() && before->second.pid == r.pid) {
      const Previous& p = before->second;
      if (p.work.has_value() && now_seen.work.has_value() &&
          now_seen.work->steps >= p.work->steps && now_seen.work->step_ns >= p.work->step_ns &&
          now_seen.work->collective_ns >= p.work->collective_ns) {
        const double step_ms = static_cast<double>(now_seen.work->step_ns - p.work->step_ns) / 1e6;
        const double coll_ms =
            static_cast<double>(now_seen.work->collective_ns - p.work->collective_ns) / 1e6;
        compute_ms += std::max(0.0, step_ms - coll_ms);
        collective_ms += coll_ms;
        steps += static_cast<double>(now_seen.work->steps - p.work->steps);
        ++with_work;
        // Bytes per second spent in collectives: a rank that did no collective (or whose agent
        // reads an older record without bytes) has no throughput to compare.
        const int64_t bytes = now_seen.work->collective_bytes - p.work->collective_bytes;
        if (coll_ms > 0 && bytes > 0) {
          collective_mb_s += static_cast<double>(bytes) / 1e6 / (coll_ms / 1e3);
          ++with_throughput;
        }
        // The trainer's phases: milliseconds of each in this interval, per rank that has it.
        for (const auto& [name, ns] : now_seen.work->phase_ns) {
          int64_t before_ns = 0;
          for (const auto& [old_name, old_ns] : p.work->phase_ns) {
            if (old_name == name) before_ns = old_ns;
          }
          if (ns < before_ns) continue;
          auto& [sum_ms, count] = phase_ms[name];
          sum_ms += static_cast<double>(ns - before_ns) / 1e6 / seconds;
          ++count;
        }
      }
      if (p.cpu_ticks >= 0 && now_seen.cpu_ticks >= p.cpu_ticks) {
        cpu += static_cast<double>(now_seen.cpu_ticks - p.cpu_ticks) / ticks_per_second / seconds;
        ++with_cpu;
      }
      if (p.run_delay_ns >= 0 && now_seen.run_delay_ns >= 0) {
        // A thread that ended takes its delay with it: a negative delta counts as none.
        wait_ms +=
            std::max<double>(0, static_cast<double>(now_seen.run_delay_ns - p.run_delay_ns)) / 1e6 /
            seconds;
        ++with_wait;
      }
      if (p.tcp_retransmits >= 0 && now_seen.tcp_retransmits >= 0) {
        // A socket that closed takes its count with it: a negative delta counts as none.
        retrans +=
            std::max<double>(0, static_cast<double>(now_seen.tcp_retransmits - p.tcp_retransmits)) /
            seconds;
        ++with_retrans;
      }
    }
    current[r.rank] = now_seen;
  }
  previous_ = std::move(current);
  if (with_work == 0 && with_cpu == 0 && with_wait == 0 && with_retrans == 0) return std::nullopt;
  HostMetricsRecord record;
  record.seq = ++seq_;
  // The ranks' work records are written once a second each, not in step with this sample: the
  // per-second values are scaled to the interval the records cover only on average, which the
  // detector's moving median absorbs.
  if (with_work > 0) {
    record.work = steps / with_work;
    record.metrics.emplace_back("compute_ms", compute_ms / with_work);
    record.metrics.emplace_back("collective_ms", collective_ms / with_work);
  }
  if (with_throughput > 0) {
    record.metrics.emplace_back("collective_mb_s", collective_mb_s / with_throughput);
  }
  for (const auto& [name, sum] : phase_ms) {
    record.metrics.emplace_back(absl::StrCat("phase_", name, "_ms"), sum.first / sum.second);
  }
  if (with_wait > 0) record.metrics.emplace_back("cpu_wait_ms", wait_ms / with_wait);
  if (with_cpu > 0) record.metrics.emplace_back("cpu_util", cpu / with_cpu);
  if (with_retrans > 0) record.metrics.emplace_back("tcp_retrans", retrans / with_retrans);
  if (with_rtt > 0) record.metrics.emplace_back("tcp_rtt_ms", rtt / with_rtt);
  if (gpus_ != nullptr) SampleGpus(ranks, record);
  return record;
}

void HostSampler::SampleGpus(const std::vector<RankProcess>& ranks, HostMetricsRecord& record) {
  std::vector<int> local_ranks;
  for (const RankProcess& r : ranks) local_ranks.push_back(r.local_rank);
  const std::vector<std::string> devices = GpuDevicesOfRanks(
      local_ranks, cuda_visible_devices_ ? cuda_visible_devices_->c_str() : nullptr,
      gpus_->device_count());
  // Per metric: the sum over the devices that gave it, and how many did.
  double sum[4] = {0, 0, 0, 0};
  int n[4] = {0, 0, 0, 0};
  for (const std::string& device : devices) {
    absl::StatusOr<GpuSample> s = gpus_->Sample(device);
    if (!s.ok()) continue;  // a GPU that fell off the bus stops reporting; its ranks will fail
    const std::optional<double> values[4] = {s->util_pct, s->power_w, s->sm_clock_mhz,
                                             s->mem_util_pct};
    for (int i = 0; i < 4; ++i) {
      if (values[i].has_value()) {
        sum[i] += *values[i];
        ++n[i];
      }
    }
  }
  const char* names[4] = {"gpu_util", "gpu_power_w", "gpu_sm_clock_mhz", "gpu_mem_util"};
  for (int i = 0; i < 4; ++i) {
    if (n[i] > 0) record.metrics.emplace_back(names[i], sum[i] / n[i]);
  }
}

}  // namespace trainguard
