#include "trainguard/options.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "sdk/core/job_id.h"
#include "sdk/core/parallel_shape.h"
#include "sdk/proto/options.pb.h"
#include "trainguard/env.h"

extern char** environ;

namespace trainguard {
namespace {

using ::google::protobuf::Descriptor;
using ::google::protobuf::FieldDescriptor;
using ::trainguard::proto::OptionsProto;

constexpr absl::string_view kEnvPrefix = "TRAINGUARD_";
constexpr absl::string_view kConfigVariable = "TRAINGUARD_CONFIG";
// `trainguard run` names itself to the Runtime's launcher watch (sdk/runtime/launcher_watch.h)
// with TRAINGUARD_LAUNCHER_*: not options.
constexpr absl::string_view kLauncherPrefix = "TRAINGUARD_LAUNCHER_";

// torchrun (and torch.distributed.launch) export these; a job launched by torchrun needs no
// TRAINGUARD_ variables for them.
struct TorchrunVariable {
  const char* variable;
  const char* field;
};
constexpr TorchrunVariable kTorchrunVariables[] = {{"RANK", "rank"},
                                                   {"WORLD_SIZE", "world_size"},
                                                   {"LOCAL_RANK", "local_rank"},
                                                   {"LOCAL_WORLD_SIZE", "local_world_size"}};

// Collects the text-format parser's errors as "origin:line:column: message", one-based like
// compilers. The offending line is quoted because protobuf's message for a bad value does not name
// the field ("Expected integer, got: \"four\"").
class TextprotoErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  TextprotoErrorCollector(absl::string_view text, absl::string_view origin)
      : lines_(absl::StrSplit(text, '\n')), origin_(origin) {}

  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    std::string error = absl::StrCat(origin_, ":", line + 1, ":", column + 1, ": ", message);
    if (line >= 0 && line < static_cast<int>(lines_.size())) {
      constexpr size_t kMaxQuoted = 120;
      absl::StrAppend(&error, " (line ", line + 1, ": ",
                      absl::StripAsciiWhitespace(lines_[line]).substr(0, kMaxQuoted), ")");
    }
    errors_.push_back(std::move(error));
  }

  std::string Joined() const { return absl::StrJoin(errors_, "; "); }

 private:
  std::vector<absl::string_view> lines_;
  std::string origin_;
  std::vector<std::string> errors_;
};

absl::StatusOr<OptionsProto> ParseTextproto(absl::string_view text, absl::string_view origin) {
  TextprotoErrorCollector errors(text, origin);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  OptionsProto proto;
  if (!parser.ParseFromString(std::string(text), &proto)) {
    return absl::InvalidArgumentError(errors.Joined());
  }
  return proto;
}

// `named_by` says where the path came from, for the error message; empty when the caller passed it.
absl::StatusOr<OptionsProto> ReadTextprotoFile(const std::string& path, absl::string_view named_by,
                                               Env* env) {
  if (env == nullptr) {
    env = Env::Default();
  }
  absl::StatusOr<std::string> text = env->ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat("cannot read options file ", path,
                     named_by.empty() ? "" : absl::StrCat(" (named by ", named_by, ")"), ": ",
                     text.status().message()));
  }
  return ParseTextproto(*text, path);
}

void ApplySetFields(const OptionsProto& proto, Options& options) {
  if (proto.has_job_id()) {
    options.job_id = proto.job_id();
  }
  if (proto.has_rank()) {
    options.rank = proto.rank();
  }
  if (proto.has_world_size()) {
    options.world_size = proto.world_size();
  }
  if (proto.has_local_rank()) {
    options.local_rank = proto.local_rank();
  }
  if (proto.has_local_world_size()) {
    options.local_world_size = proto.local_world_size();
  }
  if (proto.has_tp()) {
    options.tp = proto.tp();
  }
  if (proto.has_cp()) {
    options.cp = proto.cp();
  }
  if (proto.has_pp()) {
    options.pp = proto.pp();
  }
  if (proto.has_run_dir()) {
    options.run_dir = proto.run_dir();
  }
  if (proto.has_max_consecutive_step_failures()) {
    options.max_consecutive_step_failures = proto.max_consecutive_step_failures();
  }
  if (proto.has_max_rollbacks_per_step()) {
    options.max_rollbacks_per_step = proto.max_rollbacks_per_step();
  }
  if (proto.has_repeated_fault_action()) {
    options.repeated_fault_action = proto.repeated_fault_action();
  }
  if (proto.has_store()) {
    options.store = proto.store();
  }
  if (proto.has_store_token_file()) {
    options.store_token_file = proto.store_token_file();
  }
  if (proto.has_role()) {
    options.role = proto.role();
  }
  if (proto.has_member_id()) {
    options.member_id = proto.member_id();
  }
  if (proto.has_host_addr()) {
    options.host_addr = proto.host_addr();
  }
  if (proto.has_backup_copies()) {
    options.backup_copies = proto.backup_copies();
  }
  if (proto.has_backup_evict()) {
    options.backup_evict = proto.backup_evict();
  }
  if (proto.has_silent_corruption()) {
    options.silent_corruption = proto.silent_corruption();
  }
  if (proto.has_silent_corruption_canary()) {
    options.silent_corruption_canary = proto.silent_corruption_canary();
  }
  if (proto.has_silent_corruption_every_steps()) {
    options.silent_corruption_every_steps = proto.silent_corruption_every_steps();
  }
  if (proto.has_backup_racks()) {
    options.backup_racks = proto.backup_racks();
  }
  if (proto.has_backup_rate_mib_s()) {
    options.backup_rate_mib_s = proto.backup_rate_mib_s();
  }
  if (proto.has_backup_memory_budget_mib()) {
    options.backup_memory_budget_mib = proto.backup_memory_budget_mib();
  }
  if (proto.has_rendezvous_timeout_ms()) {
    options.rendezvous_timeout_ms = proto.rendezvous_timeout_ms();
  }
  if (proto.has_heartbeat_interval_ms()) {
    options.heartbeat_interval_ms = proto.heartbeat_interval_ms();
  }
  if (proto.has_checkpoint_dir()) {
    options.checkpoint_dir = proto.checkpoint_dir();
  }
  if (proto.has_checkpoint_every_steps()) {
    options.checkpoint_every_steps = proto.checkpoint_every_steps();
  }
  if (proto.has_checkpoint_every_seconds()) {
    options.checkpoint_every_seconds = proto.checkpoint_every_seconds();
  }
  if (proto.has_checkpoint_keep_last()) {
    options.checkpoint_keep_last = proto.checkpoint_keep_last();
  }
  if (proto.has_checkpoint_persist_every()) {
    options.checkpoint_persist_every = proto.checkpoint_persist_every();
  }
  if (proto.has_checkpoint_copy_threads()) {
    options.checkpoint_copy_threads = proto.checkpoint_copy_threads();
  }
  if (proto.has_watchdog_poll_ms()) {
    options.watchdog_poll_ms = proto.watchdog_poll_ms();
  }
  if (proto.has_watchdog_warmup_samples()) {
    options.watchdog_warmup_samples = proto.watchdog_warmup_samples();
  }
  if (proto.has_watchdog_warmup_bound_ms()) {
    options.watchdog_warmup_bound_ms = proto.watchdog_warmup_bound_ms();
  }
  if (proto.has_watchdog_bound_factor_pct()) {
    options.watchdog_bound_factor_pct = proto.watchdog_bound_factor_pct();
  }
  if (proto.has_watchdog_floor_ms()) {
    options.watchdog_floor_ms = proto.watchdog_floor_ms();
  }
  if (proto.has_watchdog_history()) {
    options.watchdog_history = proto.watchdog_history();
  }
  if (proto.has_flight_recorder_records()) {
    options.flight_recorder_records = proto.flight_recorder_records();
  }
  if (proto.has_hang_dump_wait_ms()) {
    options.hang_dump_wait_ms = proto.hang_dump_wait_ms();
  }
  if (proto.has_watchdog_peer_progress_ms()) {
    options.watchdog_peer_progress_ms = proto.watchdog_peer_progress_ms();
  }
  if (proto.has_superseded_step_exit_ms()) {
    options.superseded_step_exit_ms = proto.superseded_step_exit_ms();
  }
  if (proto.has_loss_spike_window()) {
    options.loss_spike_window = proto.loss_spike_window();
  }
  if (proto.has_loss_spike_mads()) {
    options.loss_spike_mads = proto.loss_spike_mads();
  }
  if (proto.has_loss_spike_warmup()) {
    options.loss_spike_warmup = proto.loss_spike_warmup();
  }
}

absl::StatusOr<Options> OptionsFromProto(const OptionsProto& proto) {
  Options options;
  ApplySetFields(proto, options);
  if (absl::Status status = options.Validate(); !status.ok()) {
    return status;
  }
  return options;
}

std::string EnvironmentName(const FieldDescriptor& field) {
  return absl::StrCat(kEnvPrefix, absl::AsciiStrToUpper(field.name()));
}

std::string KnownEnvironmentKeys() {
  std::vector<std::string> keys = {std::string(kConfigVariable)};
  const Descriptor* descriptor = OptionsProto::descriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    keys.push_back(EnvironmentName(*descriptor->field(i)));
  }
  return absl::StrJoin(keys, ", ");
}

bool LooksLikeAnInteger(absl::string_view value) {
  absl::string_view digits = absl::StripAsciiWhitespace(value);
  if (!absl::ConsumePrefix(&digits, "-")) {
    absl::ConsumePrefix(&digits, "+");
  }
  return !digits.empty() && std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit);
}

absl::StatusOr<int32_t> ParseInt32(absl::string_view variable, absl::string_view value) {
  int32_t parsed;
  if (absl::SimpleAtoi(value, &parsed)) {
    return parsed;
  }
  // SimpleAtoi fails both on junk and on overflow; the two deserve different messages.
  if (!LooksLikeAnInteger(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(variable, "='", value, "' (environment): not an integer"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      variable, "='", value, "' (environment): out of range for a 32-bit integer [",
      std::numeric_limits<int32_t>::min(), ", ", std::numeric_limits<int32_t>::max(), "]"));
}

absl::Status SetFieldFromString(const FieldDescriptor& field, absl::string_view variable,
                                absl::string_view value, OptionsProto& proto) {
  const google::protobuf::Reflection& reflection = *proto.GetReflection();
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      reflection.SetString(&proto, &field, std::string(value));
      return absl::OkStatus();
    case FieldDescriptor::CPPTYPE_INT32: {
      absl::StatusOr<int32_t> parsed = ParseInt32(variable, value);
      if (!parsed.ok()) {
        return parsed.status();
      }
      reflection.SetInt32(&proto, &field, *parsed);
      return absl::OkStatus();
    }
    default:
      // Reached only when options.proto gains a field of a new type: extend the switch with it.
      return absl::UnimplementedError(
          absl::StrCat(variable, " (environment): option field ", field.name(), " has type ",
                       field.cpp_type_name(), ", which cannot be set from the environment"));
  }
}

// Every TRAINGUARD_<FIELD> variable, into the fields of `proto`.
absl::Status ApplyTrainguardVariables(const std::map<std::string, std::string>& variables,
                                      OptionsProto& proto) {
  for (const auto& [variable, value] : variables) {
    if (!absl::StartsWith(variable, kEnvPrefix) || variable == kConfigVariable ||
        absl::StartsWith(variable, kLauncherPrefix)) {
      continue;
    }
    const std::string field_name =
        absl::AsciiStrToLower(absl::string_view(variable).substr(kEnvPrefix.size()));
    const FieldDescriptor* field = OptionsProto::descriptor()->FindFieldByName(field_name);
    if (field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown option ", variable, " (environment); known keys: ", KnownEnvironmentKeys()));
    }
    if (absl::Status status = SetFieldFromString(*field, variable, value, proto); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

// torchrun's variables fill the fields that no TRAINGUARD_ variable set. When both are set they
// must agree: silently preferring one would hide a launcher misconfiguration that desynchronises
// ranks.
absl::Status ApplyTorchrunVariables(const std::map<std::string, std::string>& variables,
                                    OptionsProto& proto) {
  for (const TorchrunVariable& torchrun : kTorchrunVariables) {
    const auto it = variables.find(torchrun.variable);
    if (it == variables.end()) {
      continue;
    }
    absl::StatusOr<int32_t> value = ParseInt32(torchrun.variable, it->second);
    if (!value.ok()) {
      return value.status();
    }
    const FieldDescriptor& field = *OptionsProto::descriptor()->FindFieldByName(torchrun.field);
    const std::string own_variable = EnvironmentName(field);
    const auto own = variables.find(own_variable);
    if (own == variables.end()) {
      proto.GetReflection()->SetInt32(&proto, &field, *value);
    } else if (proto.GetReflection()->GetInt32(proto, &field) != *value) {
      return absl::InvalidArgumentError(
          absl::StrCat(own_variable, "='", own->second, "' and ", torchrun.variable, "='",
                       it->second, "' (environment) disagree; unset one or make them equal"));
    }
  }
  // torchrun's run id names the job where trainguard's does not ("none" is torchrun's default,
  // shared by every run: not a name; --standalone makes a fresh one per run).
  const auto run_id = variables.find("TORCHELASTIC_RUN_ID");
  if (!proto.has_job_id() && run_id != variables.end() && !run_id->second.empty() &&
      run_id->second != "none") {
    proto.set_job_id(run_id->second);
  }
  return absl::OkStatus();
}

absl::Status CheckInRange(absl::string_view field, int value, int limit,
                          absl::string_view limit_name) {
  if (value < 0 || value >= limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", value, " is out of range [0, ", limit_name, "=", limit, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckAtLeast(absl::string_view field, int value, int minimum) {
  if (value < minimum) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be >= ", minimum, ", got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckRanks(const Options& options) {
  if (absl::Status s = CheckAtLeast("world_size", options.world_size, 1); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckInRange("rank", options.rank, options.world_size, "world_size");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("local_world_size", options.local_world_size, 0); !s.ok()) {
    return s;
  }
  if (options.local_world_size == 0) {
    // local_world_size 0 means a single host: local ranks are then global ranks.
    return CheckInRange("local_rank", options.local_rank, options.world_size, "world_size");
  }
  if (options.world_size % options.local_world_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("local_world_size ", options.local_world_size,
                                                   " does not divide world_size ",
                                                   options.world_size));
  }
  return CheckInRange("local_rank", options.local_rank, options.local_world_size,
                      "local_world_size");
}

absl::Status CheckCheckpointAndWatchdog(const Options& options) {
  if (absl::Status s = CheckAtLeast("checkpoint_every_steps", options.checkpoint_every_steps, 0); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("checkpoint_every_seconds", options.checkpoint_every_seconds, 0); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("checkpoint_keep_last", options.checkpoint_keep_last, 1); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("checkpoint_persist_every", options.checkpoint_persist_every, 0); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("checkpoint_copy_threads", options.checkpoint_copy_threads, 1);
      !s.ok()) {
    return s;
  }
  if (options.checkpoint_copy_threads > 256) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint_copy_threads must be <= 256, got ",
                                                   options.checkpoint_copy_threads));
  }
  if (absl::Status s = CheckAtLeast("backup_copies", options.backup_copies, 1); !s.ok()) {
    return s;
  }
  if (options.silent_corruption != "off" && options.silent_corruption != "alert" &&
      options.silent_corruption != "repair" && options.silent_corruption != "evict") {
    return absl::InvalidArgumentError(
        absl::StrCat("silent_corruption must be off, alert, repair or evict, got \"",
                     options.silent_corruption, "\""));
  }
  if (absl::Status s =
          CheckAtLeast("silent_corruption_every_steps", options.silent_corruption_every_steps, 0);
      !s.ok()) {
    return s;
  }
  if (options.silent_corruption_canary != 0 && options.silent_corruption_canary != 1) {
    return absl::InvalidArgumentError(absl::StrCat("silent_corruption_canary must be 0 or 1, got ",
                                                   options.silent_corruption_canary));
  }
  if (absl::Status s = CheckAtLeast("backup_rate_mib_s", options.backup_rate_mib_s, 0); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckAtLeast("backup_memory_budget_mib", options.backup_memory_budget_mib, 0);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("watchdog_poll_ms", options.watchdog_poll_ms, 0); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("watchdog_warmup_samples", options.watchdog_warmup_samples, 1); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("watchdog_warmup_bound_ms", options.watchdog_warmup_bound_ms, 1); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("watchdog_bound_factor_pct", options.watchdog_bound_factor_pct, 100); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("watchdog_floor_ms", options.watchdog_floor_ms, 1); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("watchdog_history", options.watchdog_history, 1); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("flight_recorder_records", options.flight_recorder_records, 16); !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckAtLeast("watchdog_peer_progress_ms", options.watchdog_peer_progress_ms, 0);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("hang_dump_wait_ms", options.hang_dump_wait_ms, 0); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("superseded_step_exit_ms", options.superseded_step_exit_ms, 0);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("loss_spike_warmup", options.loss_spike_warmup, 20); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("loss_spike_window", options.loss_spike_window,
                                    options.loss_spike_warmup);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("loss_spike_mads", options.loss_spike_mads, 1); !s.ok()) {
    return s;
  }
  if (options.watchdog_warmup_bound_ms < options.watchdog_floor_ms) {
    return absl::InvalidArgumentError(absl::StrCat(
        "watchdog_warmup_bound_ms ", options.watchdog_warmup_bound_ms,
        " is below watchdog_floor_ms ", options.watchdog_floor_ms));
  }
  return absl::OkStatus();
}

absl::Status CheckRendezvous(const Options& options) {
  if (options.role != "rank" && options.role != "standby") {
    return absl::InvalidArgumentError(
        absl::StrCat("role \"", options.role, "\" is neither \"rank\" nor \"standby\""));
  }
  if (options.member_id.find_first_of("/\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("member_id \"", options.member_id, "\" must not contain '/' or a newline"));
  }
  if (in_addr parsed{};
      !options.host_addr.empty() && inet_pton(AF_INET, options.host_addr.c_str(), &parsed) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host_addr \"", options.host_addr, "\" is not an IPv4 address (e.g. 127.0.1.3) or empty"));
  }
  if (absl::Status s = CheckAtLeast("rendezvous_timeout_ms", options.rendezvous_timeout_ms, 1);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckAtLeast("heartbeat_interval_ms", options.heartbeat_interval_ms, 0);
      !s.ok()) {
    return s;
  }
  if (options.store.empty()) {
    if (options.role == "standby" && options.store_client == nullptr) {
      return absl::InvalidArgumentError(
          "role \"standby\" needs a store to park in (store is empty)");
    }
    return absl::OkStatus();
  }
  if (absl::StartsWith(options.store, "tcp://")) {
    if (options.store_token_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store ", options.store, " needs store_token_file (the job's shared token)"));
    }
    return absl::OkStatus();
  }
  if (absl::StartsWith(options.store, "etcd://")) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("store \"", options.store, "\" must start with tcp:// or etcd://"));
}

// Validate() messages start with the field at fault ("rank 7 is out of range ..."). Says where that
// field's value came from, as " [from TRAINGUARD_RANK='7' in the environment]", or "" if unknown.
std::string SourceOfInvalidField(absl::string_view message,
                                 const std::map<std::string, std::string>& variables,
                                 const std::string& config_path, const OptionsProto& from_file) {
  const std::string field(message.substr(0, message.find(' ')));
  const FieldDescriptor* descriptor = OptionsProto::descriptor()->FindFieldByName(field);
  if (descriptor == nullptr) {
    return "";
  }
  std::vector<std::string> names = {EnvironmentName(*descriptor)};
  for (const TorchrunVariable& torchrun : kTorchrunVariables) {
    if (field == torchrun.field) {
      names.push_back(torchrun.variable);
    }
  }
  for (const std::string& name : names) {
    const auto it = variables.find(name);
    if (it != variables.end()) {
      return absl::StrCat(" [from ", name, "='", it->second, "' in the environment]");
    }
  }
  if (from_file.GetReflection()->HasField(from_file, descriptor)) {
    return absl::StrCat(" [from ", config_path, ", named by ", kConfigVariable, "]");
  }
  return "";
}

}  // namespace

absl::StatusOr<Options> Options::FromEnv() {
  std::map<std::string, std::string> variables;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const absl::string_view assignment(*entry);
    const size_t equals = assignment.find('=');
    if (equals != absl::string_view::npos) {
      variables.emplace(assignment.substr(0, equals), assignment.substr(equals + 1));
    }
  }
  return FromEnvironment(variables);
}

absl::StatusOr<Options> Options::FromEnvironment(
    const std::map<std::string, std::string>& variables, Env* env) {
  OptionsProto proto;
  // An empty TRAINGUARD_CONFIG counts as unset, so that `TRAINGUARD_CONFIG= cmd` turns the file
  // off.
  const auto config = variables.find(std::string(kConfigVariable));
  if (config != variables.end() && !config->second.empty()) {
    absl::StatusOr<OptionsProto> file = ReadTextprotoFile(config->second, kConfigVariable, env);
    if (!file.ok()) {
      return file.status();
    }
    proto = *std::move(file);
  }
  const OptionsProto from_file = proto;
  if (absl::Status status = ApplyTrainguardVariables(variables, proto); !status.ok()) {
    return status;
  }
  if (absl::Status status = ApplyTorchrunVariables(variables, proto); !status.ok()) {
    return status;
  }
  absl::StatusOr<Options> options = OptionsFromProto(proto);
  if (options.ok()) {
    return options;
  }
  const std::string source =
      SourceOfInvalidField(options.status().message(), variables,
                           config == variables.end() ? "" : config->second, from_file);
  return absl::Status(options.status().code(), absl::StrCat(options.status().message(), source));
}

absl::StatusOr<Options> Options::FromTextproto(absl::string_view text, absl::string_view origin) {
  absl::StatusOr<OptionsProto> proto = ParseTextproto(text, origin);
  if (!proto.ok()) {
    return proto.status();
  }
  absl::StatusOr<Options> options = OptionsFromProto(*proto);
  if (!options.ok()) {
    return absl::Status(options.status().code(),
                        absl::StrCat(origin, ": ", options.status().message()));
  }
  return options;
}

absl::StatusOr<Options> Options::FromTextprotoFile(const std::string& path, Env* env) {
  absl::StatusOr<OptionsProto> proto = ReadTextprotoFile(path, /*named_by=*/"", env);
  if (!proto.ok()) {
    return proto.status();
  }
  absl::StatusOr<Options> options = OptionsFromProto(*proto);
  if (!options.ok()) {
    return absl::Status(options.status().code(),
                        absl::StrCat(path, ": ", options.status().message()));
  }
  return options;
}

absl::Status Options::Validate() const {
  if (absl::Status status = CheckRanks(*this); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckParallelShape(world_size, tp, cp, pp); !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateJobId(job_id); !status.ok()) {
    return status;
  }
  if (absl::Status status =
          CheckAtLeast("max_consecutive_step_failures", max_consecutive_step_failures, 0);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckAtLeast("max_rollbacks_per_step", max_rollbacks_per_step, 1);
      !status.ok()) {
    return status;
  }
  if (repeated_fault_action != "stop" && repeated_fault_action != "skip") {
    return absl::InvalidArgumentError(absl::StrCat(
        "repeated_fault_action \"", repeated_fault_action, "\" is neither \"stop\" nor \"skip\""));
  }
  if (absl::Status status = CheckCheckpointAndWatchdog(*this); !status.ok()) {
    return status;
  }
  return CheckRendezvous(*this);
}

std::string Options::ResolvedRunDir() const {
  if (!run_dir.empty()) {
    return run_dir;
  }
  // Read-only use; trainguard never modifies the process environment.
  const char* tmpdir = std::getenv("TMPDIR");  // NOLINT(concurrency-mt-unsafe)
  const absl::string_view base = tmpdir == nullptr || *tmpdir == '\0' ? "/tmp" : tmpdir;
  return absl::StrCat(base, "/trainguard/", job_id);
}

}  // namespace trainguard
