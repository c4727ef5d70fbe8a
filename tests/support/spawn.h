// SpawnWithOutput: forks and execs a command for a multi-process test, its stdout and stderr in a
// file the test reads back, with extra environment variables. Header-only.
#ifndef TRAINGUARD_TESTS_SUPPORT_SPAWN_H_
#define TRAINGUARD_TESTS_SUPPORT_SPAWN_H_

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace trainguard::testing {

// Returns the child's pid (> 0), or -1 when fork failed. The child writes what it prints to
// `output` (truncated) and exits 127 when `args[0]` cannot be executed.
inline pid_t SpawnWithOutput(std::vector<std::string> args, const std::string& output,
                             const std::vector<std::pair<std::string, std::string>>& environment) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  const int fd = open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(fd, STDOUT_FILENO);
  dup2(fd, STDERR_FILENO);
  for (const auto& [name, value] : environment) setenv(name.c_str(), value.c_str(), 1);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv(argv[0], argv.data());
  _exit(127);
}

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_SPAWN_H_
