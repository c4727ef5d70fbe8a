// ExportShardAsSafetensors: a verified shard payload, cut into tensors by its recorded layout.
#include "tools/safetensors_export.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sdk/checkpoint/payload_layout.h"
#include "trainguard/checkpoint.h"
#include "trainguard/env.h"

namespace trainguard::tools {
namespace {

// One tensor of the file: where its bytes are in the payload.
struct Entry {
  std::string name;
  std::string_view dtype;  // safetensors' name
  size_t element_bytes = 1;
  std::vector<int64_t> shape;
  std::string_view data;
};

std::string ShardContext(const ShardRecord& r) {
  return absl::StrFormat("shard %s (rank %d, step %d)", r.shard_path, r.rank, r.step);
}

// safetensors' dtype names; empty for a dtype it has no name for.
std::string_view SafetensorsDType(DType dtype) {
  switch (dtype) {
    case DType::kU8:
      return "U8";
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF64:
      return "F64";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "";
}

std::string JsonString(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
    } else {
      out += c;  // UTF-8 passes through: JSON text is UTF-8
    }
  }
  return out + "\"";
}

// The registered buffers as tensors, after checking that the recorded layout is the one the
// shard's layout hash names and that every buffer lies inside the payload's buffer region.
absl::StatusOr<std::vector<Entry>> BufferEntries(const ShardRecord& shard,
                                                 const std::string& payload) {
  const PayloadLayout& layout = *shard.layout;
  if (layout.offsets.size() != layout.buffers.size() ||
      LayoutHashOf(layout.buffers) != shard.layout_hash) {
    return absl::DataLossError(absl::StrFormat(
        "%s: the payload layout in its manifest does not hash to the shard's layout hash %016x",
        ShardContext(shard), shard.layout_hash));
  }
  if (layout.blob_offset > payload.size()) {
    return absl::DataLossError(
        absl::StrFormat("%s: the recorded blob area starts at %d, past the %d-byte payload",
                        ShardContext(shard), layout.blob_offset, payload.size()));
  }
  std::vector<Entry> entries;
  uint64_t end_of_previous = 0;
  for (size_t i = 0; i < layout.buffers.size(); ++i) {
    const StateBuffer& b = layout.buffers[i];
    const uint64_t offset = layout.offsets[i];
    Entry e;
    e.name = b.name;
    e.dtype = SafetensorsDType(b.dtype);
    e.element_bytes = DTypeSize(b.dtype);
    if (e.dtype.empty() || e.element_bytes == 0) {
      return absl::DataLossError(absl::StrFormat("%s: buffer \"%s\" has unknown dtype %d",
                                                 ShardContext(shard), b.name,
                                                 static_cast<int>(b.dtype)));
    }
    if (offset < end_of_previous || offset > layout.blob_offset ||
        b.bytes > layout.blob_offset - offset) {
      return absl::DataLossError(absl::StrFormat(
          "%s: buffer \"%s\" (%d bytes at payload offset %d) lies outside the buffer region "
          "[%d, %d) or overlaps the buffer before it",
          ShardContext(shard), b.name, b.bytes, offset, end_of_previous, layout.blob_offset));
    }
    end_of_previous = offset + b.bytes;
    if (b.shape.empty()) {
      // Registered without a shape: one element is a scalar, more a vector.
      const uint64_t elements = b.bytes / e.element_bytes;
      if (elements != 1) e.shape = {static_cast<int64_t>(elements)};
    } else {
      e.shape = b.shape;
    }
    uint64_t elements = 1;
    for (int64_t dim : e.shape) elements *= static_cast<uint64_t>(std::max<int64_t>(dim, 0));
    if (elements * e.element_bytes != b.bytes) {
      return absl::DataLossError(absl::StrFormat(
          "%s: buffer \"%s\" has shape [%s] of %s but %d bytes", ShardContext(shard), b.name,
          absl::StrJoin(e.shape, ","), DTypeName(b.dtype), b.bytes));
    }
    e.data = std::string_view(payload).substr(offset, b.bytes);
    entries.push_back(std::move(e));
  }
  return entries;
}

// The JSON header, padded with spaces to a multiple of 8 bytes (as safetensors' writers do).
std::string Header(const std::vector<Entry>& entries,
                   const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::vector<std::string> fields;
  std::vector<std::string> meta;
  for (const auto& [key, value] : metadata) {
    meta.push_back(absl::StrCat(JsonString(key), ":", JsonString(value)));
  }
  fields.push_back(absl::StrCat("\"__metadata__\":{", absl::StrJoin(meta, ","), "}"));
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    fields.push_back(absl::StrFormat(
        "%s:{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%d,%d]}", JsonString(e.name),
        e.dtype, absl::StrJoin(e.shape, ","), offset, offset + e.data.size()));
    offset += e.data.size();
  }
  std::string header = absl::StrCat("{", absl::StrJoin(fields, ","), "}");
  header.append((8 - header.size() % 8) % 8, ' ');
  return header;
}

absl::Status WriteFile(Env* env, const std::string& out_path, const std::string& header,
                       const std::vector<Entry>& entries) {
  const std::string temp_path = absl::StrFormat("%s.tmp.%d", out_path, ::getpid());
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(temp_path);
    if (!file.ok()) return file.status();
    char length[8];
    const uint64_t header_bytes = header.size();
    std::memcpy(length, &header_bytes, sizeof(length));  // little-endian hosts only (FORMATS.md)
    if (absl::Status s = (*file)->Append(absl::string_view(length, sizeof(length))); !s.ok()) {
      return s;
    }
    if (absl::Status s = (*file)->Append(header); !s.ok()) return s;
    for (const Entry& e : entries) {
      if (absl::Status s = (*file)->Append(absl::string_view(e.data.data(), e.data.size()));
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = (*file)->Sync(); !s.ok()) return s;
    if (absl::Status s = (*file)->Close(); !s.ok()) return s;
    return env->RenameFile(temp_path, out_path);
  }();
  if (!status.ok()) {
    env->RemoveFile(temp_path).IgnoreError();
    return absl::Status(status.code(),
                        absl::StrFormat("writing %s: %s", out_path, status.message()));
  }
  const size_t slash = out_path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : out_path.substr(0, slash + 1);
  if (absl::Status s = env->SyncDir(dir); !s.ok()) {
    return absl::Status(s.code(), absl::StrFormat("writing %s: %s", out_path, s.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsExportSummary> ExportShardAsSafetensors(
    Env* env, const ShardRecord& shard,
    const std::vector<std::pair<std::string, std::string>>& metadata, const std::string& out_path) {
  if (env == nullptr) env = Env::Default();
  if (!shard.layout.has_value()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s: its manifest records no payload layout (it was persisted by a trainguard from before "
        "`ckpt export`, or without a registry), so its bytes cannot be named",
        ShardContext(shard)));
  }
  // Every chunk, the header, the padding and the trailer are checked before anything is written.
  absl::StatusOr<std::string> payload = ReadShardPayload(env, shard);
  if (!payload.ok()) return payload.status();
  absl::StatusOr<std::vector<Entry>> entries = BufferEntries(shard, *payload);
  if (!entries.ok()) return entries.status();
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> blobs =
      ParseBlobArea(std::string_view(*payload).substr(shard.layout->blob_offset));
  if (!blobs.ok()) {
    return absl::DataLossError(
        absl::StrFormat("%s: blob area: %s", ShardContext(shard), blobs.status().message()));
  }
  std::set<std::string> names;
  for (const Entry& e : *entries) {
    if (e.name == "__metadata__" || e.name.starts_with(kExportedBlobPrefix)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: buffer \"%s\" has a name the export reserves (__metadata__, %s...)",
                          ShardContext(shard), e.name, kExportedBlobPrefix));
    }
    names.insert(e.name);
  }
  SafetensorsExportSummary summary;
  summary.tensors = entries->size();
  summary.blobs = blobs->size();
  // Blobs point into the parsed copies, which outlive the write.
  for (const auto& [name, value] : *blobs) {
    Entry e;
    e.name = absl::StrCat(kExportedBlobPrefix, name);
    e.dtype = "U8";
    e.shape = {static_cast<int64_t>(value.size())};
    e.data = value;
    if (!names.insert(e.name).second) {
      return absl::DataLossError(
          absl::StrFormat("%s: blob \"%s\" appears twice", ShardContext(shard), name));
    }
    entries->push_back(std::move(e));
  }
  // Wider elements first (then registry order), so that every tensor starts at a multiple of its
  // element size once the header's length is a multiple of 8: readers may map it in place.
  std::stable_sort(entries->begin(), entries->end(), [](const Entry& a, const Entry& b) {
    return a.element_bytes > b.element_bytes;
  });
  const std::string header = Header(*entries, metadata);
  if (absl::Status s = WriteFile(env, out_path, header, *entries); !s.ok()) return s;
  summary.file_bytes = 8 + header.size();
  for (const Entry& e : *entries) summary.file_bytes += e.data.size();
  return summary;
}

}  // namespace trainguard::tools
