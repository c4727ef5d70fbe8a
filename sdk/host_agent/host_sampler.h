// HostSampler: a host agent's once-a-second sample of its own host, from what its rank processes
// already give: each rank's work record (sdk/health/fail_slow_metrics.h, health/rank/<rank>) and
// its CPU time (/proc/<pid>/stat utime + stime, read by the agent, which sees its host's /proc).
// The sample holds, per rank averaged over the host's ranks: compute_ms (step time outside
// collectives) and collective_ms in that second, with the steps done as the work they are divided
// by; collective_mb_s, the bytes its collectives moved per second spent in them (MB/s);
// phase_<name>_ms, the milliseconds per second in each watchdog phase the trainer opens inside its
// steps ("generate", "forward"...); cpu_wait_ms, the time its training (main) thread was runnable
// but not running (/proc/<pid>/task/<pid>/schedstat run delay, in ms per second: a throttled or
// oversubscribed CPU; the other threads, mostly asleep, add wake-up delays that any loaded machine
// has); cpu_util (CPU seconds per second); tcp_retrans, the TCP segments its sockets retransmitted
// per second, and tcp_rtt_ms, the median smoothed round-trip time of its TCP sockets that sent
// data in the last two seconds (both from getsockopt(TCP_INFO) on the rank's own sockets,
// duplicated with pidfd_getfd: per connection, so a lossy or slow link of one host shows on that
// host's ranks even where every host of a ring waits alike in the collective). With a
// GpuMetricsSource (sdk/health/gpu_metrics_source.h: NVML where the host has an NVIDIA driver),
// also the GPUs its ranks use (GpuDevicesOfRanks), averaged over them: gpu_util (duty cycle %),
// gpu_power_w, gpu_sm_clock_mhz and gpu_mem_util (memory-bandwidth utilisation %), read at the
// sample's time.
//
// The /proc and socket reads are behind ProcessProbe (ProcProcessProbe reads the real ones) and the
// GPUs behind GpuMetricsSource, so a test injects a host's metrics without processes.
//
// The coordinator's side: FailSlowCoordinator (sdk/coordinator/fail_slow_coordinator.h).
//
// Thread safety: HostSampler is not thread-safe; the agent's loop thread (HostAgent::
// PublishHostSample) uses it. The functions are safe to call from any thread.
#ifndef TRAINGUARD_SDK_HOST_AGENT_HOST_SAMPLER_H_
#define TRAINGUARD_SDK_HOST_AGENT_HOST_SAMPLER_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "sdk/health/fail_slow_metrics.h"
#include "sdk/health/gpu_metrics_source.h"

namespace trainguard {

// utime + stime of `pid` in clock ticks (/proc/<pid>/stat fields 14 and 15); -1 if unreadable.
int64_t ProcessCpuTicks(pid_t pid);
// The run-queue delay of `pid`'s main thread (/proc/<pid>/task/<pid>/schedstat field 2, ns): time
// runnable but not running, which includes time a CPU cgroup throttled it. -1 if unreadable.
int64_t ProcessRunDelayNs(pid_t pid);

// The TCP sockets `pid` holds open, read through getsockopt(TCP_INFO) on a duplicate of each
// (pidfd_getfd: needs the right to ptrace `pid`, which a host agent has over its own ranks).
// nullopt when no socket of it can be read (it holds none, it is gone, no permission, a kernel
// before 5.6). Cost: a readlink per open fd and, per socket, two syscalls and a close.
struct TcpSocketTotals {
  int sockets = 0;          // TCP sockets neither listening nor closed
  int64_t retransmits = 0;  // their tcpi_total_retrans, summed
  // The (upper) median of the smoothed RTT (tcpi_rtt) of the sockets that sent data within the
  // last `active_ms` (tcpi_last_data_sent), and how many did. Only those: a collective library
  // connects every pair of ranks and a ring uses two of them, so the idle rest keep the RTT of
  // their handshake and would outvote the connections the job's traffic crosses.
  int active_sockets = 0;
  double active_rtt_ms = 0;  // 0 with no active socket
};
std::optional<TcpSocketTotals> ProcessTcpTotals(pid_t pid, int64_t active_ms = 2000);

// What a sample reads of a rank's process from the OS. ProcProcessProbe reads the real ones (the
// functions above); a test's probe returns the values it injects, for processes that need not
// exist.
class ProcessProbe {
 public:
  virtual ~ProcessProbe() = default;
  // utime + stime in clock ticks; -1 if unreadable.
  virtual int64_t CpuTicks(pid_t pid) = 0;
  // Clock ticks per second (sysconf(_SC_CLK_TCK) for /proc).
  virtual double TicksPerSecond() = 0;
  // The run-queue delay of its main thread in ns; -1 if unreadable.
  virtual int64_t RunDelayNs(pid_t pid) = 0;
  // Its TCP sockets' totals; nullopt when none can be read.
  virtual std::optional<TcpSocketTotals> TcpTotals(pid_t pid) = 0;
};

class ProcProcessProbe : public ProcessProbe {
 public:
  int64_t CpuTicks(pid_t pid) override { return ProcessCpuTicks(pid); }
  double TicksPerSecond() override;
  int64_t RunDelayNs(pid_t pid) override { return ProcessRunDelayNs(pid); }
  std::optional<TcpSocketTotals> TcpTotals(pid_t pid) override { return ProcessTcpTotals(pid); }
};

class HostSampler {
 public:
  struct RankProcess {
    int rank = -1;
    pid_t pid = -1;
    std::optional<std::string> work_record;  // its health/rank/<rank> value, if any
    int local_rank = -1;                     // which of the host's GPUs it uses; -1: none
  };
  // Samples `gpus` too (none when null), the devices of the ranks' local ranks under
  // `cuda_visible_devices` (the agent's CUDA_VISIBLE_DEVICES, which its ranks inherit; nullopt
  // when unset), and reads the ranks' processes through `processes` (null: ProcProcessProbe).
  explicit HostSampler(std::unique_ptr<GpuMetricsSource> gpus = nullptr,
                       std::optional<std::string> cuda_visible_devices = std::nullopt,
                       std::unique_ptr<ProcessProbe> processes = nullptr);

  // The sample of the time since the previous call, or nullopt on the first call and when no rank
  // has two records to compare yet. A rank whose process changed (replaced) starts over.
  std::optional<HostMetricsRecord> Sample(absl::Time now, const std::vector<RankProcess>& ranks);

 private:
  struct Previous {
    pid_t pid = -1;
    std::optional<RankWorkRecord> work;
    int64_t cpu_ticks = -1;
    int64_t run_delay_ns = -1;
    int64_t tcp_retransmits = -1;
  };
  // Appends the GPU metrics of `ranks`' devices to `record` (nothing when no device sampled).
  void SampleGpus(const std::vector<RankProcess>& ranks, HostMetricsRecord& record);

  std::unique_ptr<GpuMetricsSource> gpus_;
  std::unique_ptr<ProcessProbe> processes_;
  std::optional<std::string> cuda_visible_devices_;
  std::map<int, Previous> previous_;
  absl::Time last_ = absl::InfinitePast();
  int64_t seq_ = 0;
};

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HOST_AGENT_HOST_SAMPLER_H_
