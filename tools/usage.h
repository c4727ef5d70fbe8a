// What every `trainguard` command does with --help and -h: print its usage on stdout and exit 0.
// A usage error prints the usage on stderr and exits 2 instead.
#ifndef TRAINGUARD_TOOLS_USAGE_H_
#define TRAINGUARD_TOOLS_USAGE_H_

#include <algorithm>
#include <string>
#include <vector>

namespace trainguard::tools {

// True when --help or -h is among `args`, before a "--" (what follows "--" is a child's command
// line, whose own --help is not ours). A flag value or path spelled "-h" counts as a request for
// help too, as with most tools: a directory of that name is written ./-h.
inline bool AsksForHelp(const std::vector<std::string>& args) {
  const auto end = std::find(args.begin(), args.end(), "--");
  return std::any_of(args.begin(), end,
                     [](const std::string& a) { return a == "--help" || a == "-h"; });
}

}  // namespace trainguard::tools

#endif  // TRAINGUARD_TOOLS_USAGE_H_
