// GpuMetricsSource: where a host agent reads its GPUs' health for the fail-slow detector
// (fail_slow_detector.h; docs/GUIDE.md, "Fail-slow hosts"): per GPU, its duty cycle (% of the
// last sample period a kernel ran), power draw (W), SM clock (MHz) and memory-bandwidth
// utilisation (% of the period device memory was read or written). An interface, so that tests
// feed the sampler a fake GPU that loses clocks on a machine without one.
//
// NvmlGpuMetricsSource reads them through NVML, loaded at run time with dlopen() from
// libnvidia-ml.so.1 (the NVIDIA driver's library): trainguard has no link-time dependency on the
// driver, and a host without one simply has no source (Open() says why).
//
// GpuDevicesOfRanks: which GPUs a host's ranks use, from the agent's CUDA_VISIBLE_DEVICES (which
// its ranks inherit) and each rank's local rank: local rank r uses the r-th visible device
// (modulo their number, as ranks sharing GPUs do), or NVML index r when CUDA_VISIBLE_DEVICES is
// unset. Entries are NVML indices or GPU UUIDs ("GPU-..."); CUDA's default order is fastest
// first, NVML's is PCI bus order: on a host of identical GPUs (any training host) they agree,
// and CUDA_DEVICE_ORDER=PCI_BUS_ID makes them agree on any host.
//
// Thread safety: a source is not thread-safe (one agent loop thread samples it); the function is.
#ifndef TRAINGUARD_SDK_HEALTH_GPU_METRICS_SOURCE_H_
#define TRAINGUARD_SDK_HEALTH_GPU_METRICS_SOURCE_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace trainguard {

// A reading the GPU does not support (NVML_ERROR_NOT_SUPPORTED: power on some boards) is empty.
struct GpuSample {
  std::optional<double> util_pct;      // duty cycle: % of the sample period a kernel was running
  std::optional<double> power_w;       // power draw
  std::optional<double> sm_clock_mhz;  // current SM clock
  std::optional<double> mem_util_pct;  // % of the sample period device memory was read/written
};

class GpuMetricsSource {
 public:
  GpuMetricsSource() = default;
  GpuMetricsSource(const GpuMetricsSource&) = delete;
  GpuMetricsSource& operator=(const GpuMetricsSource&) = delete;
  virtual ~GpuMetricsSource() = default;

  // The GPUs the source sees.
  virtual int device_count() const = 0;
  // One GPU now. `device`: an index in [0, device_count()) or a GPU UUID ("GPU-..."). NotFound
  // or Unavailable naming the device and why.
  virtual absl::StatusOr<GpuSample> Sample(const std::string& device) = 0;
};

class NvmlGpuMetricsSource : public GpuMetricsSource {
 public:
  // Loads `library` and initialises NVML. Unavailable with the reason (no such library: no
  // NVIDIA driver; nvmlInit failed: its error string) when the host has no usable GPU.
  static absl::StatusOr<std::unique_ptr<GpuMetricsSource>> Open(
      const std::string& library = "libnvidia-ml.so.1");
  ~NvmlGpuMetricsSource() override;  // nvmlShutdown, dlclose

  int device_count() const override { return device_count_; }
  absl::StatusOr<GpuSample> Sample(const std::string& device) override;

 private:
  struct Api;
  NvmlGpuMetricsSource(void* handle, std::unique_ptr<Api> api, int device_count);
  void* handle_;
  std::unique_ptr<Api> api_;
  int device_count_;
};

// The devices (as GpuMetricsSource::Sample takes them) that ranks of `local_ranks` use, each once,
// in order of first use. `cuda_visible_devices`: the variable's value, or nullptr when unset (an
// empty value hides every GPU: none). Without it, local rank r is index r when r < device_count.
std::vector<std::string> GpuDevicesOfRanks(const std::vector<int>& local_ranks,
                                           const char* cuda_visible_devices, int device_count);

}  // namespace trainguard

#endif  // TRAINGUARD_SDK_HEALTH_GPU_METRICS_SOURCE_H_
