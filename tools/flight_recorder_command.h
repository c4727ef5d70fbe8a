// `trainguard flight-recorder`: reads a rank's flight recorder
// (sdk/watchdog/flight_recorder.h) from shared memory while the rank runs, hangs, is stopped
// or after it died, and reads dumps.
//
//   trainguard flight-recorder show --job J --rank R [--json] [--last N]   the live ring
//   trainguard flight-recorder show FILE [--json] [--last N]               a dump file
//   trainguard flight-recorder dump --job J --rank R --out FILE            ring -> protobuf dump
//   trainguard flight-recorder remove --job J [--rank R]                   remove segments (all of
//                                                                          the job's without
//                                                                          --rank)
//   trainguard flight-recorder diagnose RUN_DIR [--job J] [--world-size N] [--generation G]
//                                       [--json]
//       reads the hang dumps in RUN_DIR/flight_recorder (and, with --job, the live rings of ranks
//       that wrote none) and names the suspects (sdk/watchdog/hang_diagnosis.h)
//
// Exit codes: 0 success; 1 a segment or file is missing, unreadable or not a flight recorder's (the
// message names it); 2 bad usage (the usage on stderr). --help or -h prints the usage of the verb
// named, or of all, and exits 0.
#ifndef TRAINGUARD_TOOLS_FLIGHT_RECORDER_COMMAND_H_
#define TRAINGUARD_TOOLS_FLIGHT_RECORDER_COMMAND_H_

#include <string>
#include <vector>

namespace trainguard::tools {

// `args` are the words after "flight-recorder". Prints to stdout, errors to stderr.
int RunFlightRecorderCommand(const std::vector<std::string>& args);
std::string FlightRecorderUsage();

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_FLIGHT_RECORDER_COMMAND_H_
