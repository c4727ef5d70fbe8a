#include "trainguard/options.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using Variables = std::map<std::string, std::string>;

// Sets (or unsets) a process environment variable for the life of the object, then restores it.
// The tests are single-threaded, so touching the environment is safe here.
class ScopedEnvironmentVariable {
 public:
  ScopedEnvironmentVariable(std::string name, const std::optional<std::string>& value)
      : name_(std::move(name)) {
    const char* old = std::getenv(name_.c_str());  // NOLINT(concurrency-mt-unsafe)
    if (old != nullptr) {
      old_ = old;
    }
    Set(value);
  }
  ScopedEnvironmentVariable(const ScopedEnvironmentVariable&) = delete;
  ScopedEnvironmentVariable& operator=(const ScopedEnvironmentVariable&) = delete;
  ~ScopedEnvironmentVariable() { Set(old_); }

 private:
  void Set(const std::optional<std::string>& value) {
    if (value.has_value()) {
      setenv(name_.c_str(), value->c_str(), /*overwrite=*/1);  // NOLINT(concurrency-mt-unsafe)
    } else {
      unsetenv(name_.c_str());  // NOLINT(concurrency-mt-unsafe)
    }
  }

  std::string name_;
  std::optional<std::string> old_;
};

// Each test gets a fresh directory for its config files.
class OptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "options_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern;
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteFile(const std::string& name, const std::string& contents) {
    std::string path = dir_ + "/" + name;
    std::ofstream file(path);
    file << contents;
    EXPECT_TRUE(file.good()) << "writing " << path;
    return path;
  }

  std::string dir_;
};

Options MustParse(const Variables& variables, Env* env = nullptr) {
  absl::StatusOr<Options> options = Options::FromEnvironment(variables, env);
  EXPECT_TRUE(options.ok()) << options.status();
  return *std::move(options);
}

absl::Status ParseStatus(const Variables& variables) {
  return Options::FromEnvironment(variables).status();
}

// --- Defaults.

TEST_F(OptionsTest, DefaultsDescribeAValidSingleRankJob) {
  const Options options;
  EXPECT_EQ(options.job_id, "default");
  EXPECT_EQ(options.rank, 0);
  EXPECT_EQ(options.world_size, 1);
  EXPECT_EQ(options.local_rank, 0);
  EXPECT_EQ(options.local_world_size, 0);
  EXPECT_EQ(options.tp, 1);
  EXPECT_EQ(options.cp, 1);
  EXPECT_EQ(options.pp, 1);
  EXPECT_EQ(options.run_dir, "");
  EXPECT_EQ(options.max_consecutive_step_failures, 3);
  EXPECT_EQ(options.env, nullptr);
  EXPECT_EQ(options.clock, nullptr);
  EXPECT_TRUE(options.Validate().ok()) << options.Validate();
}

TEST_F(OptionsTest, EmptyEnvironmentGivesTheDefaults) {
  const Options options = MustParse({});
  EXPECT_EQ(options.job_id, "default");
  EXPECT_EQ(options.world_size, 1);
  EXPECT_EQ(options.max_consecutive_step_failures, 3);
}

TEST_F(OptionsTest, SilentCorruptionIsRepairWithTheCanaryByDefaultAndOtherValuesAreRefused) {
  EXPECT_EQ(Options().silent_corruption, "repair");
  EXPECT_EQ(Options().silent_corruption_canary, 1);
  const Options alert = MustParse(
      {{"TRAINGUARD_SILENT_CORRUPTION", "alert"}, {"TRAINGUARD_SILENT_CORRUPTION_CANARY", "0"}});
  EXPECT_EQ(alert.silent_corruption, "alert");
  EXPECT_EQ(alert.silent_corruption_canary, 0);
  EXPECT_EQ(MustParse({{"TRAINGUARD_SILENT_CORRUPTION", "off"}}).silent_corruption, "off");
  EXPECT_EQ(MustParse({{"TRAINGUARD_SILENT_CORRUPTION", "evict"}}).silent_corruption, "evict");
  const absl::Status bad = ParseStatus({{"TRAINGUARD_SILENT_CORRUPTION", "replace"}});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("silent_corruption must be off, alert, repair or evict"));
  EXPECT_THAT(ParseStatus({{"TRAINGUARD_SILENT_CORRUPTION_CANARY", "2"}}).message(),
              HasSubstr("silent_corruption_canary must be 0 or 1"));
  EXPECT_EQ(Options().silent_corruption_every_steps, 0);
  EXPECT_EQ(
      MustParse({{"TRAINGUARD_SILENT_CORRUPTION_EVERY_STEPS", "20"}}).silent_corruption_every_steps,
      20);
  EXPECT_THAT(ParseStatus({{"TRAINGUARD_SILENT_CORRUPTION_EVERY_STEPS", "-1"}}).message(),
              HasSubstr("silent_corruption_every_steps"));
}

// --- Text-format files.

TEST_F(OptionsTest, TorchrunsRunIdNamesTheJobUnlessTrainguardsDoes) {
  EXPECT_EQ(MustParse(Variables{{"TORCHELASTIC_RUN_ID", "run-7"}}).job_id, "run-7");
  // torchrun's default id, shared by every run: not a name.
  EXPECT_EQ(MustParse(Variables{{"TORCHELASTIC_RUN_ID", "none"}}).job_id, "default");
  EXPECT_EQ(MustParse(Variables{{"TORCHELASTIC_RUN_ID", "run-7"}, {"TRAINGUARD_JOB_ID", "mine"}})
                .job_id,
            "mine");
}

TEST_F(OptionsTest, TextprotoOverridesOnlyTheFieldsItSets) {
  absl::StatusOr<Options> options =
      Options::FromTextproto("job_id: \"llama-7b\" world_size: 16 tp: 2 pp: 2", "inline");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job_id, "llama-7b");
  EXPECT_EQ(options->world_size, 16);
  EXPECT_EQ(options->tp, 2);
  EXPECT_EQ(options->pp, 2);
  EXPECT_EQ(options->cp, 1);
  EXPECT_EQ(options->rank, 0);
  EXPECT_EQ(options->max_consecutive_step_failures, 3);
}

TEST_F(OptionsTest, TextprotoFileSetsEveryField) {
  const std::string path = WriteFile("options.textproto", R"pb(
    job_id: "gpt"
    rank: 5
    world_size: 16
    local_rank: 1
    local_world_size: 4
    tp: 2
    cp: 2
    pp: 2
    run_dir: "/scratch/gpt"
    max_consecutive_step_failures: 0
    checkpoint_dir: "/scratch/ckpt"
    checkpoint_every_steps: 50
    checkpoint_copy_threads: 16
    watchdog_floor_ms: 500
  )pb");
  absl::StatusOr<Options> options = Options::FromTextprotoFile(path);
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job_id, "gpt");
  EXPECT_EQ(options->rank, 5);
  EXPECT_EQ(options->world_size, 16);
  EXPECT_EQ(options->local_rank, 1);
  EXPECT_EQ(options->local_world_size, 4);
  EXPECT_EQ(options->tp, 2);
  EXPECT_EQ(options->cp, 2);
  EXPECT_EQ(options->pp, 2);
  EXPECT_EQ(options->run_dir, "/scratch/gpt");
  EXPECT_EQ(options->max_consecutive_step_failures, 0);
  EXPECT_EQ(options->checkpoint_dir, "/scratch/ckpt");
  EXPECT_EQ(options->checkpoint_every_steps, 50);
  EXPECT_EQ(options->checkpoint_copy_threads, 16);
  EXPECT_EQ(options->watchdog_floor_ms, 500);
}

TEST_F(OptionsTest, UnknownTextprotoFieldIsAnErrorNamingOriginLineAndKey) {
  const absl::Status status =
      Options::FromTextproto("job_id: \"x\"\nworld_size: 2\n    wrold_size: 4\n", "my.textproto")
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              AllOf(StartsWith("my.textproto:3:"), HasSubstr("wrold_size")));
}

TEST_F(OptionsTest, UnknownFieldInTextprotoFileNamesThePathAndLine) {
  const std::string path = WriteFile("bad.textproto", "world_size: 2\nranks: 1\n");
  const absl::Status status = Options::FromTextprotoFile(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr(path + ":2:"), HasSubstr("\"ranks\"")));
}

TEST_F(OptionsTest, MalformedTextprotoValueIsAnErrorQuotingTheLineWithTheKey) {
  const absl::Status status =
      Options::FromTextproto("job_id: \"x\"\nworld_size: \"four\"\n", "cfg").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(status.message()),
      StartsWith("cfg:2:13: Expected integer, got: \"four\" (line 2: world_size: \"four\")"));
}

TEST_F(OptionsTest, TextprotoIntegerOverflowIsAnError) {
  const absl::Status status = Options::FromTextproto("tp: 2147483648", "cfg").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), StartsWith("cfg:1:"));
}

TEST_F(OptionsTest, TextprotoThatFailsValidationNamesItsOriginAndTheField) {
  const absl::Status status = Options::FromTextproto("world_size: 4 rank: 4", "cfg").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("cfg: rank 4 is out of range [0, world_size=4)"));
}

TEST_F(OptionsTest, MissingTextprotoFileIsAnErrorNamingThePath) {
  const std::string path = dir_ + "/absent.textproto";
  const absl::Status status = Options::FromTextprotoFile(path).status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr(path));
}

// --- Environment variables.

TEST_F(OptionsTest, EveryFieldHasATrainguardEnvironmentVariable) {
  const Options options = MustParse({{"TRAINGUARD_JOB_ID", "bert"},
                                     {"TRAINGUARD_RANK", "7"},
                                     {"TRAINGUARD_WORLD_SIZE", "8"},
                                     {"TRAINGUARD_LOCAL_RANK", "3"},
                                     {"TRAINGUARD_LOCAL_WORLD_SIZE", "4"},
                                     {"TRAINGUARD_TP", "2"},
                                     {"TRAINGUARD_CP", "2"},
                                     {"TRAINGUARD_PP", "2"},
                                     {"TRAINGUARD_RUN_DIR", "/runs/bert"},
                                     {"TRAINGUARD_MAX_CONSECUTIVE_STEP_FAILURES", "10"}});
  EXPECT_EQ(options.job_id, "bert");
  EXPECT_EQ(options.rank, 7);
  EXPECT_EQ(options.world_size, 8);
  EXPECT_EQ(options.local_rank, 3);
  EXPECT_EQ(options.local_world_size, 4);
  EXPECT_EQ(options.tp, 2);
  EXPECT_EQ(options.cp, 2);
  EXPECT_EQ(options.pp, 2);
  EXPECT_EQ(options.run_dir, "/runs/bert");
  EXPECT_EQ(options.max_consecutive_step_failures, 10);
}

TEST_F(OptionsTest, HostAddrFromTheEnvironmentIsTheStoreConnectionsSourceAddress) {
  EXPECT_EQ(MustParse({}).host_addr, "");
  EXPECT_EQ(MustParse({{"TRAINGUARD_HOST_ADDR", "127.0.1.3"}}).host_addr, "127.0.1.3");
}

TEST_F(OptionsTest, AHostAddrThatIsNotAnIpv4AddressIsAnErrorNamingTheVariableAndValue) {
  for (const char* bad : {"host1", "127.0.1", "::1", "127.0.1.3 ", "300.0.0.1"}) {
    const absl::Status status = ParseStatus({{"TRAINGUARD_HOST_ADDR", bad}});
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << bad << ": " << status;
    EXPECT_THAT(std::string(status.message()),
                ::testing::HasSubstr(absl::StrCat("host_addr \"", bad, "\" is not an IPv4")));
    EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("TRAINGUARD_HOST_ADDR"));
  }
}

TEST_F(OptionsTest, StringVariablesAreTakenAsIs) {
  const Options options = MustParse({{"TRAINGUARD_RUN_DIR", " /a dir/with spaces "}});
  EXPECT_EQ(options.run_dir, " /a dir/with spaces ");
}

TEST_F(OptionsTest, VariablesWithoutTheTrainguardPrefixAreIgnored) {
  const Options options =
      MustParse({{"PATH", "/usr/bin"}, {"TRAINGUARDX", "1"}, {"MY_TRAINGUARD_TP", "8"}});
  EXPECT_EQ(options.tp, 1);
}

TEST_F(OptionsTest, UnknownTrainguardVariableIsAnErrorListingTheKnownKeys) {
  const absl::Status status = ParseStatus({{"TRAINGUARD_FOO", "1"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("unknown option TRAINGUARD_FOO (environment); known keys: "),
                    HasSubstr("TRAINGUARD_CONFIG"), HasSubstr("TRAINGUARD_WORLD_SIZE"),
                    HasSubstr("TRAINGUARD_MAX_CONSECUTIVE_STEP_FAILURES")));
}

TEST_F(OptionsTest, MalformedIntegerVariableIsAnErrorNamingVariableAndValue) {
  for (const std::string value : {"abc", "", "1.5", "12abc", "0x10"}) {
    const absl::Status status = ParseStatus({{"TRAINGUARD_RANK", value}});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(
        std::string(status.message()),
        HasSubstr(absl::StrCat("TRAINGUARD_RANK='", value, "' (environment): not an integer")));
  }
}

TEST_F(OptionsTest, IntegerVariableOutsideInt32IsAnError) {
  for (const std::string value : {"2147483648", "-2147483649", "99999999999999999999999"}) {
    const absl::Status status = ParseStatus({{"TRAINGUARD_WORLD_SIZE", value}});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << value;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat("TRAINGUARD_WORLD_SIZE='", value,
                                       "' (environment): out of range for a 32-bit integer")));
  }
}

TEST_F(OptionsTest, EnvironmentIsValidated) {
  const absl::Status status =
      ParseStatus({{"TRAINGUARD_WORLD_SIZE", "4"}, {"TRAINGUARD_RANK", "4"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("rank 4 is out of range [0, world_size=4)"));
}

// --- TRAINGUARD_CONFIG and layering.

TEST_F(OptionsTest, ConfigVariableNamesATextprotoFileToRead) {
  const std::string path = WriteFile("job.textproto", "job_id: \"from-file\" world_size: 4 tp: 2");
  const Options options = MustParse({{"TRAINGUARD_CONFIG", path}});
  EXPECT_EQ(options.job_id, "from-file");
  EXPECT_EQ(options.world_size, 4);
  EXPECT_EQ(options.tp, 2);
}

TEST_F(OptionsTest, EnvironmentVariablesOverrideTheConfigFile) {
  const std::string path = WriteFile("job.textproto", "job_id: \"from-file\" world_size: 4 tp: 2");
  const Options options = MustParse(
      {{"TRAINGUARD_CONFIG", path}, {"TRAINGUARD_JOB_ID", "from-env"}, {"TRAINGUARD_RANK", "3"}});
  EXPECT_EQ(options.job_id, "from-env");
  EXPECT_EQ(options.rank, 3);
  EXPECT_EQ(options.world_size, 4);
  EXPECT_EQ(options.tp, 2);
}

TEST_F(OptionsTest, ConfigNamingAMissingFileIsAnErrorNamingThePath) {
  const std::string path = dir_ + "/no-such.textproto";
  const absl::Status status = ParseStatus({{"TRAINGUARD_CONFIG", path}});
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr(path), HasSubstr("TRAINGUARD_CONFIG")));
}

TEST_F(OptionsTest, ErrorInTheConfigFileNamesTheFileAndLine) {
  const std::string path = WriteFile("job.textproto", "world_size: 4\njob_idd: \"x\"\n");
  const absl::Status status = ParseStatus({{"TRAINGUARD_CONFIG", path}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), AllOf(HasSubstr(path + ":2:"), HasSubstr("job_idd")));
}

TEST_F(OptionsTest, EmptyConfigVariableMeansNoFile) {
  const Options options = MustParse({{"TRAINGUARD_CONFIG", ""}});
  EXPECT_EQ(options.job_id, "default");
}

// Serves one file from memory; every other call would go to a null target, so it must not be made.
class InMemoryConfigEnv : public EnvWrapper {
 public:
  InMemoryConfigEnv(std::string path, std::string contents)
      : EnvWrapper(nullptr), path_(std::move(path)), contents_(std::move(contents)) {}

  absl::StatusOr<std::string> ReadFileToString(const std::string& path) override {
    ++reads_;
    if (path != path_) {
      return absl::NotFoundError(absl::StrCat("no file ", path));
    }
    return contents_;
  }
  int reads() const { return reads_; }

 private:
  std::string path_;
  std::string contents_;
  int reads_ = 0;
};

TEST_F(OptionsTest, ConfigFileIsReadThroughTheGivenEnv) {
  InMemoryConfigEnv env("/virtual/job.textproto", "job_id: \"virtual\"");
  const Options options = MustParse({{"TRAINGUARD_CONFIG", "/virtual/job.textproto"}}, &env);
  EXPECT_EQ(options.job_id, "virtual");
  EXPECT_EQ(env.reads(), 1);
}

TEST_F(OptionsTest, EnvFailureReadingTheConfigIsReportedWithThePathAndItsCode) {
  InMemoryConfigEnv env("/virtual/job.textproto", "");
  const absl::Status status =
      Options::FromEnvironment({{"TRAINGUARD_CONFIG", "/virtual/other.textproto"}}, &env).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("/virtual/other.textproto"));
}

// --- torchrun variables.

TEST_F(OptionsTest, TorchrunVariablesAreReadWhenTrainguardOnesAreAbsent) {
  const Options options = MustParse(
      {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_EQ(options.rank, 5);
  EXPECT_EQ(options.world_size, 8);
  EXPECT_EQ(options.local_rank, 1);
  EXPECT_EQ(options.local_world_size, 4);
}

TEST_F(OptionsTest, TorchrunVariablesOverrideTheConfigFile) {
  const std::string path = WriteFile("job.textproto", "world_size: 2 rank: 1");
  const Options options =
      MustParse({{"TRAINGUARD_CONFIG", path}, {"RANK", "6"}, {"WORLD_SIZE", "8"}});
  EXPECT_EQ(options.rank, 6);
  EXPECT_EQ(options.world_size, 8);
}

TEST_F(OptionsTest, TorchrunAndTrainguardVariablesThatAgreeAreAccepted) {
  const Options options = MustParse({{"RANK", "3"},
                                     {"TRAINGUARD_RANK", "3"},
                                     {"WORLD_SIZE", "4"},
                                     {"TRAINGUARD_WORLD_SIZE", "4"}});
  EXPECT_EQ(options.rank, 3);
  EXPECT_EQ(options.world_size, 4);
}

TEST_F(OptionsTest, TorchrunAndTrainguardVariablesThatDisagreeAreAnErrorNamingBoth) {
  const absl::Status status = ParseStatus({{"WORLD_SIZE", "8"}, {"TRAINGUARD_WORLD_SIZE", "16"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              AllOf(HasSubstr("TRAINGUARD_WORLD_SIZE='16'"), HasSubstr("WORLD_SIZE='8'"),
                    HasSubstr("disagree")));
}

TEST_F(OptionsTest, MalformedTorchrunVariableIsAnErrorNamingIt) {
  const absl::Status status = ParseStatus({{"LOCAL_RANK", "first"}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("LOCAL_RANK='first' (environment): not an integer"));
}

TEST_F(OptionsTest, FromEnvReadsTheProcessEnvironment) {
  ScopedEnvironmentVariable job_id("TRAINGUARD_JOB_ID", "from-process");
  ScopedEnvironmentVariable config("TRAINGUARD_CONFIG", std::nullopt);
  absl::StatusOr<Options> options = Options::FromEnv();
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->job_id, "from-process");
}

// --- Validate().

struct InvalidCase {
  std::string what;
  std::function<void(Options&)> break_it;
  std::string expected_message;
};

TEST_F(OptionsTest, ValidateRejectsEachInvalidFieldNamingItAndItsValue) {
  const std::vector<InvalidCase> cases = {
      {"world_size zero", [](Options& o) { o.world_size = 0; }, "world_size must be >= 1, got 0"},
      {"rank negative", [](Options& o) { o.rank = -1; },
       "rank -1 is out of range [0, world_size=8)"},
      {"rank too large", [](Options& o) { o.rank = 8; },
       "rank 8 is out of range [0, world_size=8)"},
      {"local_world_size negative", [](Options& o) { o.local_world_size = -1; },
       "local_world_size must be >= 0, got -1"},
      {"local_rank too large", [](Options& o) { o.local_rank = 4; },
       "local_rank 4 is out of range [0, local_world_size=4)"},
      {"local_rank negative", [](Options& o) { o.local_rank = -1; },
       "local_rank -1 is out of range [0, local_world_size=4)"},
      {"local_rank beyond a single host",
       [](Options& o) {
         o.local_world_size = 0;
         o.local_rank = 8;
       },
       "local_rank 8 is out of range [0, world_size=8)"},
      {"local_world_size not dividing world_size", [](Options& o) { o.local_world_size = 3; },
       "local_world_size 3 does not divide world_size 8"},
      {"tp zero", [](Options& o) { o.tp = 0; }, "tp must be >= 1, got 0"},
      {"cp negative", [](Options& o) { o.cp = -2; }, "cp must be >= 1, got -2"},
      {"pp zero", [](Options& o) { o.pp = 0; }, "pp must be >= 1, got 0"},
      {"degrees not dividing world_size",
       [](Options& o) {
         o.tp = 4;
         o.pp = 4;
       },
       "world_size 8 is not divisible by tp*cp*pp = 16 (tp=4, cp=1, pp=4)"},
      {"job_id empty", [](Options& o) { o.job_id = ""; }, "job_id must not be empty"},
      {"job_id with a slash", [](Options& o) { o.job_id = "a/b"; },
       "job_id \"a/b\" has character '/' at position 1"},
      {"job_id with a space", [](Options& o) { o.job_id = "my job"; },
       "job_id \"my job\" has character ' ' at position 2"},
      {"job_id dot-dot", [](Options& o) { o.job_id = ".."; }, "job_id \"..\" is not allowed"},
      {"max_consecutive_step_failures negative",
       [](Options& o) { o.max_consecutive_step_failures = -1; },
       "max_consecutive_step_failures must be >= 0, got -1"},
      {"checkpoint_every_steps negative", [](Options& o) { o.checkpoint_every_steps = -5; },
       "checkpoint_every_steps must be >= 0, got -5"},
      {"checkpoint_keep_last zero", [](Options& o) { o.checkpoint_keep_last = 0; },
       "checkpoint_keep_last must be >= 1, got 0"},
      {"no checkpoint copy thread", [](Options& o) { o.checkpoint_copy_threads = 0; },
       "checkpoint_copy_threads must be >= 1, got 0"},
      {"too many checkpoint copy threads", [](Options& o) { o.checkpoint_copy_threads = 257; },
       "checkpoint_copy_threads must be <= 256, got 257"},
      {"watchdog factor below one", [](Options& o) { o.watchdog_bound_factor_pct = 50; },
       "watchdog_bound_factor_pct must be >= 100, got 50"},
      {"watchdog warm-up bound below the floor",
       [](Options& o) {
         o.watchdog_floor_ms = 5'000;
         o.watchdog_warmup_bound_ms = 1'000;
       },
       "watchdog_warmup_bound_ms 1000 is below watchdog_floor_ms 5000"},
      {"flight recorder too small", [](Options& o) { o.flight_recorder_records = 3; },
       "flight_recorder_records must be >= 16, got 3"},
      {"negative hang dump wait", [](Options& o) { o.hang_dump_wait_ms = -1; },
       "hang_dump_wait_ms must be >= 0, got -1"},
      {"loss spike warm-up too short", [](Options& o) { o.loss_spike_warmup = 5; },
       "loss_spike_warmup must be >= 20, got 5"},
      {"loss spike window below its warm-up", [](Options& o) { o.loss_spike_window = 30; o.loss_spike_warmup = 40; },
       "loss_spike_window must be >= 40, got 30"},
      {"loss spike threshold zero", [](Options& o) { o.loss_spike_mads = 0; },
       "loss_spike_mads must be >= 1, got 0"},
  };
  for (const InvalidCase& c : cases) {
    SCOPED_TRACE(c.what);
    Options options;
    options.world_size = 8;
    options.rank = 7;
    options.local_world_size = 4;
    options.local_rank = 3;
    options.tp = 2;
    ASSERT_TRUE(options.Validate().ok()) << options.Validate();
    c.break_it(options);
    const absl::Status status = options.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.expected_message));
  }
}

TEST_F(OptionsTest, ValidateAcceptsJobIdsMadeOfFileNameCharacters) {
  Options options;
  options.job_id = "Llama-3.1_70B.run-42";
  EXPECT_TRUE(options.Validate().ok()) << options.Validate();
}

// --- ResolvedRunDir().

TEST_F(OptionsTest, ResolvedRunDirIsRunDirWhenSet) {
  Options options;
  options.run_dir = "/scratch/run";
  EXPECT_EQ(options.ResolvedRunDir(), "/scratch/run");
}

TEST_F(OptionsTest, ResolvedRunDirDefaultsToTmpdirTrainguardJobId) {
  ScopedEnvironmentVariable tmpdir("TMPDIR", "/fast/tmp");
  Options options;
  options.job_id = "job-1";
  EXPECT_EQ(options.ResolvedRunDir(), "/fast/tmp/trainguard/job-1");
}

TEST_F(OptionsTest, ResolvedRunDirFallsBackToSlashTmpWhenTmpdirIsUnsetOrEmpty) {
  Options options;
  options.job_id = "job-1";
  {
    ScopedEnvironmentVariable tmpdir("TMPDIR", std::nullopt);
    EXPECT_EQ(options.ResolvedRunDir(), "/tmp/trainguard/job-1");
  }
  {
    ScopedEnvironmentVariable tmpdir("TMPDIR", "");
    EXPECT_EQ(options.ResolvedRunDir(), "/tmp/trainguard/job-1");
  }
}

}  // namespace
}  // namespace trainguard

namespace trainguard {
namespace {

TEST(OptionsSources, AnInvalidValueFromTheEnvironmentNamesTheVariable) {
  absl::StatusOr<Options> options =
      Options::FromEnvironment({{"TRAINGUARD_RANK", "7"}, {"TRAINGUARD_WORLD_SIZE", "4"}});
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(
      options.status().message(),
      "rank 7 is out of range [0, world_size=4) [from TRAINGUARD_RANK='7' in the environment]");
}

TEST(OptionsSources, AnInvalidValueFromTorchrunsVariableNamesIt) {
  absl::StatusOr<Options> options = Options::FromEnvironment({{"RANK", "9"}, {"WORLD_SIZE", "2"}});
  ASSERT_FALSE(options.ok());
  EXPECT_THAT(std::string(options.status().message()),
              ::testing::HasSubstr("[from RANK='9' in the environment]"));
}

}  // namespace
}  // namespace trainguard
