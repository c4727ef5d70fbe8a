// GPU metrics through NVML, loaded at run time: see gpu_metrics_source.h.
#include "sdk/health/gpu_metrics_source.h"

#include <dlfcn.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace trainguard {
namespace {

// The few NVML declarations used, as nvml.h declares them (a stable C ABI since NVML's v2
// entry points, CUDA 5): copied rather than included, so that building needs no NVML header.
using NvmlReturn = int;  // nvmlReturn_t
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlNotSupported = 3;  // NVML_ERROR_NOT_SUPPORTED
struct NvmlDeviceSt;
using NvmlDevice = NvmlDeviceSt*;  // nvmlDevice_t
struct NvmlUtilization {           // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};
constexpr int kNvmlClockSm = 1;  // NVML_CLOCK_SM in nvmlClockType_t

}  // namespace

struct NvmlGpuMetricsSource::Api {
  NvmlReturn (*init)() = nullptr;
  NvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(NvmlReturn) = nullptr;
  NvmlReturn (*device_count)(unsigned int*) = nullptr;
  NvmlReturn (*by_index)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*by_uuid)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*power_mw)(NvmlDevice, unsigned int*) = nullptr;
  NvmlReturn (*clock_mhz)(NvmlDevice, int, unsigned int*) = nullptr;
  std::map<std::string, NvmlDevice> devices;  // resolved handles, by the name Sample got

  std::string Error(NvmlReturn r) const {
    return absl::StrCat(error_string != nullptr ? error_string(r) : "NVML error", " (", r, ")");
  }
};

absl::StatusOr<std::unique_ptr<GpuMetricsSource>> NvmlGpuMetricsSource::Open(
    const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat("no NVML: cannot load ", library, " (",
                                               why != nullptr ? why : "?",
                                               "): no NVIDIA driver on this host"));
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", name);
  };
  bind(api->init, "nvmlInit_v2");
  bind(api->shutdown, "nvmlShutdown");
  bind(api->error_string, "nvmlErrorString");
  bind(api->device_count, "nvmlDeviceGetCount_v2");
  bind(api->by_index, "nvmlDeviceGetHandleByIndex_v2");
  bind(api->by_uuid, "nvmlDeviceGetHandleByUUID");
  bind(api->utilization, "nvmlDeviceGetUtilizationRates");
  bind(api->power_mw, "nvmlDeviceGetPowerUsage");
  bind(api->clock_mhz, "nvmlDeviceGetClockInfo");
  if (!missing.empty()) {
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat(library, " lacks ", missing));
  }
  if (NvmlReturn r = api->init(); r != kNvmlSuccess) {
    const std::string why = api->Error(r);
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat("nvmlInit_v2 (", library, "): ", why));
  }
  unsigned int count = 0;
  if (NvmlReturn r = api->device_count(&count); r != kNvmlSuccess) {
    const std::string why = api->Error(r);
    api->shutdown();
    dlclose(handle);
    return absl::UnavailableError(absl::StrCat("nvmlDeviceGetCount_v2: ", why));
  }
  return std::unique_ptr<GpuMetricsSource>(
      new NvmlGpuMetricsSource(handle, std::move(api), static_cast<int>(count)));
}

NvmlGpuMetricsSource::NvmlGpuMetricsSource(void* handle, std::unique_ptr<Api> api, int device_count)
    : handle_(handle), api_(std::move(api)), device_count_(device_count) {}

NvmlGpuMetricsSource::~NvmlGpuMetricsSource() {
  api_->shutdown();
  dlclose(handle_);
}

absl::StatusOr<GpuSample> NvmlGpuMetricsSource::Sample(const std::string& device) {
  auto found = api_->devices.find(device);
  if (found == api_->devices.end()) {
    NvmlDevice d = nullptr;
    unsigned int index = 0;
    NvmlReturn r = 0;
    if (absl::StartsWith(device, "GPU-")) {
      r = api_->by_uuid(device.c_str(), &d);
    } else if (absl::SimpleAtoi(device, &index)) {
      r = api_->by_index(index, &d);
    } else {
      return absl::NotFoundError(
          absl::StrCat("GPU \"", device, "\": neither an NVML index nor a GPU-<uuid>"));
    }
    if (r != kNvmlSuccess) {
      return absl::NotFoundError(absl::StrCat("GPU ", device, ": ", api_->Error(r)));
    }
    found = api_->devices.emplace(device, d).first;
  }
  const NvmlDevice d = found->second;
  GpuSample sample;
  // A reading the board does not support stays empty; any other error fails the sample.
  auto read = [&](const char* what, NvmlReturn r) -> absl::Status {
    if (r == kNvmlSuccess || r == kNvmlNotSupported) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("GPU ", device, ": ", what, ": ", api_->Error(r)));
  };
  NvmlUtilization util{};
  NvmlReturn r = api_->utilization(d, &util);
  if (absl::Status s = read("nvmlDeviceGetUtilizationRates", r); !s.ok()) return s;
  if (r == kNvmlSuccess) {
    sample.util_pct = util.gpu;
    sample.mem_util_pct = util.memory;
  }
  unsigned int value = 0;
  r = api_->power_mw(d, &value);
  if (absl::Status s = read("nvmlDeviceGetPowerUsage", r); !s.ok()) return s;
  if (r == kNvmlSuccess) sample.power_w = value / 1000.0;
  r = api_->clock_mhz(d, kNvmlClockSm, &value);
  if (absl::Status s = read("nvmlDeviceGetClockInfo(SM)", r); !s.ok()) return s;
  if (r == kNvmlSuccess) sample.sm_clock_mhz = value;
  return sample;
}

std::vector<std::string> GpuDevicesOfRanks(const std::vector<int>& local_ranks,
                                           const char* cuda_visible_devices, int device_count) {
  std::vector<std::string> visible;
  if (cuda_visible_devices != nullptr) {
    // CUDA stops at the first entry it cannot use; so does this.
    for (absl::string_view entry : absl::StrSplit(cuda_visible_devices, ',')) {
      entry = absl::StripAsciiWhitespace(entry);
      int index = 0;
      if (absl::StartsWith(entry, "GPU-")) {
        visible.emplace_back(entry);
      } else if (absl::SimpleAtoi(entry, &index) && index >= 0 && index < device_count) {
        visible.push_back(absl::StrCat(index));
      } else {
        break;
      }
    }
  } else {
    for (int i = 0; i < device_count; ++i) visible.push_back(absl::StrCat(i));
  }
  std::vector<std::string> devices;
  if (visible.empty()) return devices;
  for (int r : local_ranks) {
    if (r < 0) continue;
    // With CUDA_VISIBLE_DEVICES set, ranks beyond the visible GPUs share them (r modulo their
    // number); without it, a rank beyond the host's GPUs has none.
    if (cuda_visible_devices == nullptr && r >= static_cast<int>(visible.size())) continue;
    const std::string& d = visible[static_cast<size_t>(r) % visible.size()];
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  }
  return devices;
}

}  // namespace trainguard
