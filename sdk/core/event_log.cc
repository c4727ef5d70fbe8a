// The per-rank event file: "TGEVLOG1", then [u32 length][u32 XXH32(payload)][payload] records
// (little-endian), each payload a serialized trainguard.proto.Event. See docs/FORMATS.md.
#include "sdk/core/event_log.h"

#include <xxhash.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "sdk/core/proto_json.h"
#include "sdk/core/utf8.h"
#include "sdk/proto/event.pb.h"
#include "trainguard/env.h"
#include "trainguard/events.h"

namespace trainguard {
namespace {

constexpr absl::string_view kMagic = "TGEVLOG1";
constexpr size_t kRecordHeaderBytes = 8;
// A length field above this is corruption, not an event: it must not make the reader allocate
// gigabytes.
constexpr uint32_t kMaxPayloadBytes = 1 << 20;

uint32_t LoadLittleEndian32(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

void StoreLittleEndian32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t Checksum(absl::string_view payload) { return XXH32(payload.data(), payload.size(), 0); }

proto::Event ToProto(const Event& event) {
  proto::Event p;
  p.set_time_unix_micros(absl::ToUnixMicros(event.time));
  p.set_rank(event.rank);
  p.set_step(event.step);
  p.set_generation(event.generation);
  p.set_type(static_cast<int32_t>(event.type));
  // proto3 would write text that is not UTF-8, and then refuse to read the record back.
  p.set_message(ValidUtf8(event.message));
  for (const auto& [key, value] : event.attributes) {
    proto::Attribute* a = p.add_attributes();
    a->set_key(ValidUtf8(key));
    a->set_value(ValidUtf8(value));
  }
  return p;
}

// A record, read as proto::EventBytes (its text as bytes) and made valid UTF-8: writers before
// 2026-11-26 could write text that is not UTF-8, which a proto::Event parse refuses (and logs).
// nullopt when the payload does not parse.
std::optional<Event> ParseRecord(absl::string_view payload) {
  proto::EventBytes p;
  if (!p.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) return std::nullopt;
  Event event;
  event.time = absl::FromUnixMicros(p.time_unix_micros());
  event.rank = p.rank();
  event.step = p.step();
  event.generation = p.generation();
  event.type = static_cast<EventType>(p.type());
  event.message = ValidUtf8(p.message());
  for (const proto::AttributeBytes& a : p.attributes()) {
    event.attributes.emplace_back(ValidUtf8(a.key()), ValidUtf8(a.value()));
  }
  return event;
}

// What a scan of a whole event file found.
struct Scan {
  std::vector<Event> events;
  uint64_t valid_bytes = 0;  // header plus every complete, verified record
  absl::Status tail;         // OK, or why the bytes after valid_bytes are not a record
};

absl::Status Corrupt(absl::string_view path, uint64_t offset, absl::string_view what) {
  return absl::DataLossError(absl::StrFormat("event file %s: %s at offset %d", path, what, offset));
}

// Parses `data`. A defect in the final record is a torn tail (a write cut short); a defect followed
// by more data is corruption of the file and fails the scan.
absl::StatusOr<Scan> ScanEventFile(absl::string_view path, absl::string_view data) {
  Scan scan;
  if (data.size() < kMagic.size()) {
    if (kMagic.substr(0, data.size()) != data) return Corrupt(path, 0, "bad header");
    if (!data.empty())
      scan.tail = Corrupt(path, 0, absl::StrCat("torn header (", data.size(), " bytes)"));
    return scan;
  }
  if (data.substr(0, kMagic.size()) != kMagic) return Corrupt(path, 0, "bad header");
  uint64_t offset = kMagic.size();
  while (offset < data.size()) {
    const uint64_t left = data.size() - offset;
    if (left < kRecordHeaderBytes) {
      scan.tail = Corrupt(path, offset, absl::StrCat("torn final record (", left, " bytes)"));
      break;
    }
    const uint32_t length = LoadLittleEndian32(data.data() + offset);
    const uint32_t checksum = LoadLittleEndian32(data.data() + offset + 4);
    const bool is_last = kRecordHeaderBytes + uint64_t{length} >= left;
    // The writer never produces such a length, so it is corruption even where it runs past the end.
    if (length > kMaxPayloadBytes) {
      return Corrupt(path, offset, absl::StrCat("record length ", length, " over the limit"));
    }
    if (kRecordHeaderBytes + uint64_t{length} > left) {
      scan.tail = Corrupt(path, offset,
                          absl::StrCat("torn final record (", left, " bytes of ",
                                       kRecordHeaderBytes + length, ")"));
      break;
    }
    absl::string_view payload = data.substr(offset + kRecordHeaderBytes, length);
    std::optional<Event> event;
    absl::string_view defect;
    if (Checksum(payload) != checksum) {
      defect = "checksum mismatch";
    } else if (event = ParseRecord(payload); !event.has_value()) {
      defect = "unparsable record";
    }
    if (!defect.empty()) {
      if (!is_last) return Corrupt(path, offset, defect);
      scan.tail = Corrupt(path, offset, absl::StrCat(defect, " in the final record"));
      break;
    }
    scan.events.push_back(*std::move(event));
    offset += kRecordHeaderBytes + length;
  }
  scan.valid_bytes = offset;
  return scan;
}

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::string_view EventTypeName(EventType type) {
  switch (type) {
    case EventType::kRuntimeStarted:
      return "runtime_started";
    case EventType::kRuntimeStopped:
      return "runtime_stopped";
    case EventType::kStepFault:
      return "step_fault";
    case EventType::kRecoveryDecision:
      return "recovery_decision";
    case EventType::kCustom:
      return "custom";
    case EventType::kCheckpoint:
      return "checkpoint";
    case EventType::kHang:
      return "hang";
    case EventType::kSuspectHost:
      return "suspect_host";
  }
  return "unknown";
}

std::string_view Event::Attribute(std::string_view key) const {
  for (const auto& [k, v] : attributes) {
    if (k == key) return v;
  }
  return {};
}

absl::StatusOr<std::string> EventToJson(const Event& event) { return ProtoToJson(ToProto(event)); }

std::string EventLogPath(std::string_view run_dir, int rank) {
  return absl::StrFormat("%s/events/rank-%05d.tgev", run_dir, rank);
}

// Moves a damaged file or tail out of the way under a new name, so Open() never destroys a byte.
absl::StatusOr<std::string> SetAside(Env* env, const std::string& path, absl::string_view kind,
                                     absl::string_view bytes) {
  std::string aside;
  for (int n = 0;; ++n) {
    aside = absl::StrCat(path, ".", kind, n == 0 ? "" : absl::StrCat(".", n));
    if (!env->FileExists(aside)) break;
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(aside);
  if (!file.ok()) return file.status();
  if (absl::Status s = (*file)->Append(bytes); !s.ok()) return s;
  if (absl::Status s = (*file)->Sync(); !s.ok()) return s;
  if (absl::Status s = (*file)->Close(); !s.ok()) return s;
  return aside;
}

absl::StatusOr<std::unique_ptr<EventLog>> EventLog::Open(Env* env, const std::string& path) {
  if (absl::Status s = env->CreateDirs(Dirname(path)); !s.ok()) return s;
  std::string set_aside;
  uint64_t valid_bytes = 0;
  if (env->FileExists(path)) {
    absl::StatusOr<std::string> data = env->ReadFileToString(path);
    if (!data.ok()) return data.status();
    absl::StatusOr<Scan> scan = ScanEventFile(path, *data);
    // A corrupt file is kept whole under another name and a new log is started: an unreadable event
    // file must not stop a training job.
    absl::string_view keep = *data;
    absl::string_view kind = "corrupt";
    if (scan.ok()) {
      valid_bytes = scan->valid_bytes;
      keep = keep.substr(valid_bytes);
      kind = "torn";
    }
    if (!keep.empty()) {
      absl::StatusOr<std::string> aside = SetAside(env, path, kind, keep);
      if (!aside.ok()) return aside.status();
      set_aside = *std::move(aside);
      if (absl::Status s = env->TruncateFile(path, valid_bytes); !s.ok()) return s;
    }
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewAppendableFile(path);
  if (!file.ok()) return file.status();
  if (valid_bytes < kMagic.size()) {
    if (absl::Status s = (*file)->Append(kMagic); !s.ok()) return s;
  }
  return std::unique_ptr<EventLog>(new EventLog(path, std::move(*file), std::move(set_aside)));
}

EventLog::EventLog(std::string path, std::unique_ptr<WritableFile> file, std::string set_aside_path)
    : path_(std::move(path)), set_aside_path_(std::move(set_aside_path)), file_(std::move(file)) {}

EventLog::~EventLog() {
  MutexLock lock(&mu_);
  (void)file_->Close();
}

absl::Status EventLog::Append(const Event& event) {
  std::string payload = ToProto(event).SerializeAsString();
  if (payload.size() > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("event of ", payload.size(), " bytes for ",
                                                   path_, " is over the limit of ",
                                                   kMaxPayloadBytes));
  }
  std::string record(kRecordHeaderBytes, '\0');
  StoreLittleEndian32(record.data(), static_cast<uint32_t>(payload.size()));
  StoreLittleEndian32(record.data() + 4, Checksum(payload));
  record += payload;
  // One write per record: a kill can tear only the record being written, never an earlier one.
  MutexLock lock(&mu_);
  return file_->Append(record);
}

absl::StatusOr<EventLogContents> ReadEventLog(Env* env, const std::string& path) {
  absl::StatusOr<std::string> data = env->ReadFileToString(path);
  if (!data.ok()) return data.status();
  absl::StatusOr<Scan> scan = ScanEventFile(path, *data);
  if (!scan.ok()) return scan.status();
  return EventLogContents{std::move(scan->events), std::move(scan->tail)};
}

}  // namespace trainguard
