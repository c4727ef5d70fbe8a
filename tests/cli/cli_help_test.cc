// Specification of `trainguard --help`: every command and every verb of a command prints its usage
// on stdout for --help and -h and exits 0; a usage error prints the usage on stderr and exits 2.
// The commands and verbs are read from the usage the binary prints, so a command added later is
// held to the same rule.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace trainguard {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::IsSupersetOf;
using ::testing::StartsWith;

struct Result {
  int exit_code = -1;
  std::string out;
  std::string err;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs the CLI with `args`; stdout and stderr go to files, so neither can fill a pipe.
Result RunCli(const std::vector<std::string>& args) {
  testing::TempDir dir;
  const std::string out_path = dir.File("stdout"), err_path = dir.File("stderr");
  std::vector<std::string> argv_strings = {TRAINGUARD_CLI_PATH};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (out < 0 || err < 0 || dup2(out, STDOUT_FILENO) < 0 || dup2(err, STDERR_FILENO) < 0) {
      _exit(127);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  Result r;
  if (pid < 0) return r;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

// The synopsis lines of a usage text ("usage: trainguard ckpt list DIR", "       trainguard ckpt
// inspect ..."): for each, the words after `prefix` ("trainguard ckpt"), up to the blank line.
std::vector<std::vector<std::string>> SynopsisWords(const std::string& usage,
                                                    const std::string& prefix) {
  std::vector<std::vector<std::string>> lines;
  for (absl::string_view line : absl::StrSplit(usage, '\n')) {
    if (line.empty()) break;
    line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, "usage: ")) line = absl::StripLeadingAsciiWhitespace(line);
    if (!absl::ConsumePrefix(&line, prefix + " ")) continue;
    lines.push_back(absl::StrSplit(line, ' ', absl::SkipEmpty()));
  }
  return lines;
}

// The commands `trainguard --help` lists ("ckpt" from "trainguard ckpt list|inspect|verify DIR").
std::set<std::string> Commands() {
  std::set<std::string> commands;
  for (const auto& words : SynopsisWords(RunCli({"--help"}).out, "trainguard")) {
    if (!words.empty()) commands.insert(words[0]);
  }
  return commands;
}

// The verbs of `command`, from its --help: a first word that is neither a flag nor a placeholder
// (placeholders are upper case: DIR, FILE).
std::set<std::string> Verbs(const std::string& command) {
  std::set<std::string> verbs;
  for (const auto& words :
       SynopsisWords(RunCli({command, "--help"}).out, "trainguard " + command)) {
    if (!words.empty() && words[0][0] >= 'a' && words[0][0] <= 'z') verbs.insert(words[0]);
  }
  return verbs;
}

TEST(CliHelp, TheTopLevelPrintsItsUsageForHelpAndH) {
  for (const char* flag : {"--help", "-h"}) {
    Result r = RunCli({flag});
    EXPECT_EQ(r.exit_code, 0) << flag << "\n" << r.err;
    EXPECT_THAT(r.out, StartsWith("usage: trainguard ")) << flag;
    EXPECT_THAT(r.err, IsEmpty()) << flag;
  }
}

TEST(CliHelp, TheUsageListsEveryCommandAndVerb) {
  // What the tests below walk: not less than what exists today.
  EXPECT_THAT(Commands(), IsSupersetOf({"version", "events", "run", "ckpt", "flight-recorder"}));
  EXPECT_THAT(Verbs("ckpt"), IsSupersetOf({"list", "inspect", "verify"}));
  EXPECT_THAT(Verbs("flight-recorder"), IsSupersetOf({"show", "dump", "remove", "diagnose"}));
}

TEST(CliHelp, EveryCommandPrintsItsUsageForHelpAndH) {
  for (const std::string& command : Commands()) {
    for (const char* flag : {"--help", "-h"}) {
      Result r = RunCli({command, flag});
      EXPECT_EQ(r.exit_code, 0) << command << " " << flag << "\n" << r.err;
      EXPECT_THAT(r.out, StartsWith("usage: trainguard " + command)) << command << " " << flag;
      EXPECT_THAT(r.err, IsEmpty()) << command << " " << flag;
    }
  }
}

TEST(CliHelp, EveryVerbPrintsItsOwnUsageForHelpAndH) {
  for (const std::string& command : Commands()) {
    for (const std::string& verb : Verbs(command)) {
      for (const char* flag : {"--help", "-h"}) {
        const std::string what = absl::StrJoin({command, verb, std::string(flag)}, " ");
        Result r = RunCli({command, verb, flag});
        EXPECT_EQ(r.exit_code, 0) << what << "\n" << r.err;
        EXPECT_THAT(r.out, StartsWith("usage: trainguard " + command + " " + verb)) << what;
        EXPECT_THAT(r.err, IsEmpty()) << what;
      }
    }
  }
}

TEST(CliHelp, HelpAfterOtherArgumentsStillPrintsTheUsage) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"run", "--nproc", "2", "--help"},
           {"ckpt", "verify", "/nonexistent", "--step", "3", "-h"},
           {"flight-recorder", "show", "--job", "j", "--rank", "0", "--help"},
           {"events", "--json", "/nonexistent", "-h"}}) {
    const std::string what = absl::StrJoin(args, " ");
    Result r = RunCli(args);
    EXPECT_EQ(r.exit_code, 0) << what << "\n" << r.err;
    EXPECT_THAT(r.out, StartsWith("usage: trainguard " + args[0])) << what;
  }
}

TEST(CliHelp, AHelpFlagAfterDashDashBelongsToTheRankCommand) {
  // `run`'s own flags end at "--": this --help is the trainer's, and --nproc is still missing.
  Result r = RunCli({"run", "--", "./trainer", "--help"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, IsEmpty());
  EXPECT_THAT(r.err, HasSubstr("--nproc N is required"));
  EXPECT_THAT(r.err, HasSubstr("usage: trainguard run"));
}

TEST(CliHelp, UsageErrorsExitTwoWithTheUsageOnStderr) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{},
                                             {"frobnicate"},
                                             {"version", "extra"},
                                             {"events"},
                                             {"events", "--bogus", "file"},
                                             {"run"},
                                             {"run", "--bogus", "1", "--", "true"},
                                             {"ckpt"},
                                             {"ckpt", "list"},
                                             {"ckpt", "list", "--bogus"},
                                             {"ckpt", "frobnicate", "--help"},
                                             {"flight-recorder"},
                                             {"flight-recorder", "frobnicate", "-h"},
                                             {"chaos", "--bogus", "1"},
                                             {"chaos", "--mix", "kill=1,boom=1"},
                                             {"chaos", "--duration", "-3s"},
                                             {"report"},
                                             {"report", "--bogus"}}) {
    const std::string what = absl::StrJoin(args, " ");
    Result r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << what;
    EXPECT_THAT(r.out, IsEmpty()) << what;
    EXPECT_THAT(r.err, HasSubstr("usage: trainguard")) << what;
  }
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

// The multi-host flags are checked before anything starts, each error naming the flag.
TEST(CliHelp, MultiHostUsageErrorsNameWhatIsMissingOrWrong) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"run", "--nnodes", "2", "--nproc-per-node", "2", "--job-id", "j", "--", "x"},
       "--nnodes needs --rdzv-endpoint"},
      {{"run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", "etcd://h:1", "--",
        "x"},
       "--nnodes needs --job-id"},
      {{"run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", "tcp://h:1",
        "--job-id", "j", "--", "x"},
       "--rdzv-endpoint tcp:// needs --token-file"},
      {{"run", "--nnodes", "3:2", "--nproc-per-node", "2", "--", "x"}, "--nnodes '3:2'"},
      {{"run", "--nnodes", "0", "--nproc-per-node", "2", "--", "x"}, "--nnodes '0'"},
      {{"run", "--role", "boss", "--nproc-per-node", "2", "--", "x"}, "--role 'boss'"},
      {{"run", "--role", "standby", "--nproc-per-node", "2", "--", "x"},
       "--role standby and --standby-nodes need --nnodes"},
      {{"run", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", "etcd://h:1",
        "--job-id", "j", "--host-id", "a/b", "--", "x"},
       "host id 'a/b'"},
      {{"run", "--nnodes", "2", "--nproc-per-node", "2", "--host-timeout", "0.1", "--", "x"},
       "--host-timeout '0.1'"},
  };
  for (const auto& [args, message] : cases) {
    const std::string what = absl::StrJoin(args, " ");
    Result r = RunCli(args);
    EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << what;
    EXPECT_THAT(r.err, HasSubstr("usage: trainguard run")) << what;
  }
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

// --restart-all restarts what this launcher started, with its own store: refused with --store or
// --nnodes before anything starts.
TEST(CliHelp, RestartAllWithAnExternalStoreIsAUsageErrorNamingTheFlag) {
  Result r = RunCli({"run", "--nproc", "2", "--restart-all", "1", "--store", "tcp://127.0.0.1:1",
                     "--token-file", "/nonexistent", "--", "true"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--restart-all needs one host and the launcher's own store"));
}

}  // namespace
}  // namespace trainguard
