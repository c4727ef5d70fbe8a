// `trainguard shm`: the shared-memory segments trainguard leaves in /dev/shm (snapshot arenas,
// flight-recorder rings, peer-backup arenas), which process holds each, and their removal.
//
//   trainguard shm list [--job J]            every trainguard segment (or job J's): its job, kind,
//                                            rank, size, and the live processes that map or hold it
//   trainguard shm remove --job J            removes job J's segments that no live process holds
//   trainguard shm remove --unused           removes every trainguard segment no live process holds
//
// A segment outlives the process that made it on purpose (a restarted rank restores from its
// arena; a dead rank's ring is read after its death), so segments of a crashed run stay until the
// job's launcher cleans up or this command removes them. One held by a live process is never
// removed: the command names the process instead.
//
// Exit codes: 0 success; 1 a segment could not be removed or is in use (`remove --job`); 2 bad
// usage. --help or -h prints the usage and exits 0.
#ifndef TRAINGUARD_TOOLS_SHM_COMMAND_H_
#define TRAINGUARD_TOOLS_SHM_COMMAND_H_

#include <string>
#include <vector>

namespace trainguard::tools {

// `args` are the words after "shm". Prints to stdout, errors to stderr.
int RunShmCommand(const std::vector<std::string>& args);
std::string ShmUsage();

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_SHM_COMMAND_H_
