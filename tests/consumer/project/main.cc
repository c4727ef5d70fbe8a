// Uses the installed SDK end to end: options, runtime, the communicator seam and Start(), a good
// step and a failing one, the event file. Usage: consumer RUN_DIR. Prints "consumer ok" and exits
// 0 on success.
#include <trainguard/sdk.h>

#include <cstdio>
#include <memory>

namespace {

// A one-rank job's communicator: nothing to exchange.
class LoopbackCommunicator : public sdk::Communicator {
 public:
  void Abort() override {}
  absl::Status Broadcast(void*, size_t, sdk::Device, int) override { return absl::OkStatus(); }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  sdk::Options options;
  options.job_id = "consumer";
  options.run_dir = argv[1];
  auto rt = sdk::Runtime::Create(options);
  if (!rt.ok()) {
    std::fprintf(stderr, "%s\n", rt.status().ToString().c_str());
    return 1;
  }
  int built = 0;
  (*rt)->SetCommunicatorFactory(
      [&](const sdk::CommunicatorSpec& spec) -> absl::StatusOr<std::unique_ptr<sdk::Communicator>> {
        built += spec.world_size == 1 && spec.generation == 0 ? 1 : 100;
        return std::make_unique<LoopbackCommunicator>();
      });
  absl::StatusOr<int64_t> start = (*rt)->Start();
  if (!start.ok() || *start != 0 || built != 1 || (*rt)->communicator() == nullptr) {
    std::fprintf(stderr, "Start() did not build the communicator: %s\n",
                 start.status().ToString().c_str());
    return 1;
  }
  int ran = 0;
  sdk::StepResult good = sdk::guard(**rt, 0, [&] { ++ran; });
  sdk::StepResult bad =
      sdk::guard(**rt, 1, [](sdk::Step&) { throw sdk::RecoverableError("bad batch"); });
  if (!good.ok() || ran != 1 || bad.fault != sdk::FaultKind::kStepFailure) {
    std::fprintf(stderr, "unexpected step results\n");
    return 1;
  }
  auto events = sdk::ReadEventLog(&(*rt)->env(), sdk::EventLogPath(argv[1], 0));
  if (!events.ok() || events->events.size() < 2) {
    std::fprintf(stderr, "event file unreadable\n");
    return 1;
  }
  std::printf("consumer ok (trainguard %s)\n", sdk::VersionString());
  return 0;
}
