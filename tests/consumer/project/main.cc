// Uses the installed SDK end to end: options, runtime, a good step and a failing one, the event
// file. Usage: consumer RUN_DIR. Prints "consumer ok" and exits 0 on success.
#include <trainguard/sdk.h>

#include <cstdio>

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
