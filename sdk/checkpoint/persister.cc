// Persister: shards written through a DirectWriter, committed by a manifest through the Env.
#include "sdk/checkpoint/persister.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "sdk/checkpoint/direct_writer.h"
#include "sdk/checkpoint/shard_format.h"
#include "sdk/core/scoped_fd.h"
#include "sdk/proto/checkpoint.pb.h"
#include "trainguard/env.h"

namespace trainguard {
namespace {

using checkpoint::DirectWriter;

constexpr char kTempSuffix[] = ".tmp";
constexpr uint64_t kReadBytes = 32 << 20;  // per read(2) when verifying or restoring

std::string JoinPath(const std::string& dir, const std::string& name) { return dir + "/" + name; }

std::string ShardContext(const ShardRecord& r) {
  return absl::StrFormat("shard %s (rank %d, step %d)", r.shard_path, r.rank, r.step);
}

// Reads `length` bytes at `offset` (fewer at the end of the file).
absl::StatusOr<size_t> ReadAt(int fd, const std::string& path, uint64_t offset, char* into,
                              size_t length) {
  size_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, into + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return ErrnoToStatus(errno, absl::StrFormat("pread %s at offset %d", path, offset + done));
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// Checks one shard file against its commit record, region by region. Each Check* step returns
// true when scanning should stop (the first corruption when `stop_at_first`).
class ShardScanner {
 public:
  ShardScanner(const ShardRecord& record, bool stop_at_first)
      : record_(record), path_(record.shard_path), stop_at_first_(stop_at_first) {}

  absl::StatusOr<std::vector<CorruptChunk>> Scan(
      Env* env, std::string* payload, const std::function<void(uint64_t, uint64_t)>& progress) {
    if (absl::Status s = Open(env); !s.ok()) return s;
    absl::StatusOr<bool> stop = CheckHeader();
    if (stop.ok() && !*stop) stop = CheckChunks(payload, progress);
    if (stop.ok() && !*stop) stop = CheckTrailer();
    if (!stop.ok()) return stop.status();
    return std::move(corrupt_);
  }

 private:
  absl::Status Open(Env* env) {
    using checkpoint::ChunkCount;
    if (record_.chunk_bytes == 0 || record_.chunk_bytes % checkpoint::kShardAlignment != 0 ||
        record_.chunk_checksums.size() != ChunkCount(record_.payload_bytes, record_.chunk_bytes)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: inconsistent record (%d chunks of %d bytes for a %d-byte payload)",
                          ShardContext(record_), record_.chunk_checksums.size(),
                          record_.chunk_bytes, record_.payload_bytes));
    }
    absl::StatusOr<uint64_t> size = env->GetFileSize(path_);
    if (!size.ok()) return size.status();
    file_bytes_ = *size;
    absl::StatusOr<OpenedFile> file = env->OpenForDirectRead(path_);
    if (!file.ok()) return file.status();
    fd_ = std::make_unique<ScopedFd>(file->fd);
    chunk_count_ = record_.chunk_checksums.size();
    // Reads span several chunks: one large O_DIRECT read keeps the device busier than a chunk at
    // a time. Two buffers: the next read runs on a prefetch thread while the current is checked.
    chunks_per_read_ = std::max<uint64_t>(1, kReadBytes / record_.chunk_bytes);
    const size_t buffer_bytes =
        std::max<size_t>(chunks_per_read_ * record_.chunk_bytes,
                         checkpoint::AlignUp(checkpoint::TrailerBytes(chunk_count_)));
    for (int i = 0; i < 2; ++i) {
      void* raw = nullptr;
      if (int rc = posix_memalign(&raw, checkpoint::kShardAlignment, buffer_bytes); rc != 0) {
        return ErrnoToStatus(rc, absl::StrFormat("posix_memalign for reading %s", path_));
      }
      buffers_.emplace_back(static_cast<char*>(raw), &std::free);
    }
    return absl::OkStatus();
  }

  bool Add(uint64_t offset, std::string what) {
    corrupt_.push_back({offset, std::move(what)});
    return stop_at_first_;
  }

  absl::StatusOr<bool> CheckHeader() {
    using checkpoint::kShardHeaderBytes;
    const uint64_t expected =
        checkpoint::ShardFileBytes(record_.payload_bytes, record_.chunk_bytes);
    if (file_bytes_ != expected &&
        Add(std::min<uint64_t>(record_.payload_bytes, file_bytes_ > kShardHeaderBytes
                                                          ? file_bytes_ - kShardHeaderBytes
                                                          : 0),
            absl::StrFormat("file %s: %d bytes, expected %d",
                            file_bytes_ < expected ? "truncated" : "too long", file_bytes_,
                            expected))) {
      return true;
    }
    absl::StatusOr<size_t> got = ReadAt(fd_->get(), path_, 0, buffers_[0].get(), kShardHeaderBytes);
    if (!got.ok()) return got.status();
    absl::StatusOr<checkpoint::ShardHeader> header =
        checkpoint::DecodeShardHeader(absl::string_view(buffers_[0].get(), *got), path_);
    if (!header.ok()) return Add(0, absl::StrFormat("header: %s", header.status().message()));
    if (header->step != record_.step || header->rank != record_.rank ||
        header->generation != record_.generation || header->layout_hash != record_.layout_hash ||
        header->payload_bytes != record_.payload_bytes ||
        header->chunk_bytes != record_.chunk_bytes || header->chunk_count != chunk_count_) {
      return Add(
          0, absl::StrFormat("header does not match the manifest (step %d rank %d generation %d in "
                             "the header)",
                             header->step, header->rank, header->generation));
    }
    return false;
  }

  // Reads chunks [first, first + chunks_per_read_) into `into`: the bytes it got, or the error.
  absl::StatusOr<size_t> ReadWindow(uint64_t first, char* into) const {
    const uint64_t last = std::min(chunk_count_, first + chunks_per_read_);
    const uint64_t read_offset = first * record_.chunk_bytes;
    const uint64_t read_end =
        checkpoint::AlignUp(std::min(record_.payload_bytes, last * record_.chunk_bytes));
    return ReadAt(fd_->get(), path_, checkpoint::kShardHeaderBytes + read_offset, into,
                  read_end - read_offset);
  }

  absl::StatusOr<bool> CheckChunks(std::string* payload,
                                   const std::function<void(uint64_t, uint64_t)>& progress) {
    if (payload != nullptr) payload->reserve(payload->size() + record_.payload_bytes);
    absl::StatusOr<size_t> current = chunk_count_ > 0 ? ReadWindow(0, buffers_[0].get()) : 0;
    for (uint64_t first = 0, window = 0; first < chunk_count_;
         first += chunks_per_read_, ++window) {
      if (!current.ok()) return current.status();
      absl::StatusOr<size_t> next = 0;
      std::jthread prefetch;  // declared after `next`: joined before `next` goes away
      if (first + chunks_per_read_ < chunk_count_) {
        prefetch = std::jthread([this, &next, first, window] {
          next = ReadWindow(first + chunks_per_read_, buffers_[(window + 1) % 2].get());
        });
      }
      if (CheckWindow(first, buffers_[window % 2].get(), *current, payload, progress)) return true;
      if (prefetch.joinable()) prefetch.join();
      current = std::move(next);
    }
    return false;
  }

  bool CheckWindow(uint64_t first, const char* data, size_t got, std::string* payload,
                   const std::function<void(uint64_t, uint64_t)>& progress) {
    const uint64_t last = std::min(chunk_count_, first + chunks_per_read_);
    const uint64_t read_offset = first * record_.chunk_bytes;
    for (uint64_t i = first; i < last; ++i) {
      const uint64_t offset = i * record_.chunk_bytes;
      const size_t length = std::min<uint64_t>(record_.chunk_bytes, record_.payload_bytes - offset);
      const size_t padded = checkpoint::AlignUp(length);
      const char* chunk = data + (offset - read_offset);
      if (offset - read_offset + padded > got) {
        if (Add(offset, "file truncated")) return true;
      } else if (checkpoint::ChunkChecksum(absl::string_view(chunk, length)) !=
                 record_.chunk_checksums[i]) {
        if (Add(offset, "checksum mismatch")) return true;
      } else if (std::any_of(chunk + length, chunk + padded, [](char c) { return c != '\0'; })) {
        if (Add(offset, "nonzero padding after the last chunk")) return true;
      } else if (payload != nullptr) {
        payload->append(chunk, length);
      }
      if (progress) progress(offset + length, record_.payload_bytes);
    }
    return false;
  }

  absl::StatusOr<bool> CheckTrailer() {
    const size_t padded = checkpoint::AlignUp(checkpoint::TrailerBytes(chunk_count_));
    absl::StatusOr<size_t> got =
        ReadAt(fd_->get(), path_, checkpoint::TrailerOffset(record_.payload_bytes),
               buffers_[0].get(), padded);
    if (!got.ok()) return got.status();
    absl::StatusOr<std::vector<uint64_t>> table = checkpoint::DecodeShardTrailer(
        absl::string_view(buffers_[0].get(), *got), chunk_count_, path_);
    if (!table.ok()) {
      return Add(record_.payload_bytes, absl::StrFormat("trailer: %s", table.status().message()));
    }
    if (*table != record_.chunk_checksums) {
      return Add(record_.payload_bytes, "trailer checksum table does not match the manifest");
    }
    return false;
  }

  const ShardRecord& record_;
  const std::string& path_;
  const bool stop_at_first_;
  std::unique_ptr<ScopedFd> fd_;
  uint64_t file_bytes_ = 0;
  uint64_t chunk_count_ = 0;
  uint64_t chunks_per_read_ = 1;
  std::vector<std::unique_ptr<char, decltype(&std::free)>> buffers_;
  std::vector<CorruptChunk> corrupt_;
};

proto::PayloadLayout LayoutToProto(const PayloadLayout& layout) {
  proto::PayloadLayout out;
  for (size_t i = 0; i < layout.buffers.size(); ++i) {
    const StateBuffer& b = layout.buffers[i];
    proto::PayloadLayout::Buffer* buffer = out.add_buffers();
    buffer->set_name(b.name);
    buffer->set_group(b.group);
    buffer->set_dtype(static_cast<int32_t>(b.dtype));
    for (int64_t dim : b.shape) buffer->add_shape(dim);
    buffer->set_device_kind(static_cast<int32_t>(b.device.kind));
    buffer->set_device_index(b.device.index);
    buffer->set_payload_offset(layout.offsets[i]);
    buffer->set_bytes(b.bytes);
    buffer->set_replicated(b.replicated);
  }
  out.set_blob_offset(layout.blob_offset);
  return out;
}

// As recorded: a reader checks it against the payload and the layout hash before trusting it.
PayloadLayout LayoutFromProto(const proto::PayloadLayout& recorded) {
  PayloadLayout layout;
  for (const proto::PayloadLayout::Buffer& b : recorded.buffers()) {
    StateBuffer buffer;
    buffer.name = b.name();
    buffer.group = b.group();
    buffer.dtype = static_cast<DType>(b.dtype());
    buffer.shape.assign(b.shape().begin(), b.shape().end());
    buffer.device = Device{static_cast<Device::Kind>(b.device_kind()), b.device_index()};
    buffer.bytes = b.bytes();
    buffer.replicated = b.replicated();
    layout.buffers.push_back(std::move(buffer));
    layout.offsets.push_back(b.payload_offset());
  }
  layout.blob_offset = recorded.blob_offset();
  return layout;
}

absl::Status ValidateOptions(const PersisterOptions& o) {
  if (o.dir.empty()) return absl::InvalidArgumentError("PersisterOptions.dir is empty");
  if (o.chunk_bytes == 0 || o.chunk_bytes % checkpoint::kShardAlignment != 0 ||
      o.chunk_bytes > (1u << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "PersisterOptions.chunk_bytes %d is not a positive multiple of 4096 up to 1 GiB",
        o.chunk_bytes));
  }
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PersisterOptions.queue_depth %d is not in [1, 4096]", o.queue_depth));
  }
  if (o.keep_last < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("PersisterOptions.keep_last %d is below 1", o.keep_last));
  }
  return absl::OkStatus();
}

}  // namespace

class Persister::Impl {
 public:
  Impl(PersisterOptions options, Env* env, std::unique_ptr<DirectWriter> writer)
      : options_(std::move(options)), env_(env), writer_(std::move(writer)) {}

  absl::StatusOr<ShardRecord> Persist(int64_t step, int rank, int64_t generation,
                                      uint64_t layout_hash, std::string_view payload,
                                      const std::vector<uint64_t>& chunk_checksums,
                                      const PayloadLayout* layout);
  bool using_io_uring() const { return writer_->using_io_uring(); }

 private:
  absl::Status CheckPayload(int64_t step, int rank, std::string_view payload,
                            const std::vector<uint64_t>& chunk_checksums) const;
  absl::Status WriteShard(const std::string& path, const checkpoint::ShardHeader& header,
                          std::string_view payload, const std::vector<uint64_t>& chunk_checksums);
  absl::Status CommitManifest(const std::string& step_dir, int rank,
                              const proto::ShardManifest& manifest);
  void ApplyRetention(int rank);

  const PersisterOptions options_;
  Env* const env_;
  const std::unique_ptr<DirectWriter> writer_;
};

absl::Status Persister::Impl::CheckPayload(int64_t step, int rank, std::string_view payload,
                                           const std::vector<uint64_t>& chunk_checksums) const {
  const uint64_t chunks = checkpoint::ChunkCount(payload.size(), options_.chunk_bytes);
  if (chunk_checksums.size() != chunks) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "persist step %d rank %d: %d chunk checksums for a %d-byte payload in %d-byte chunks "
        "(expected %d)",
        step, rank, chunk_checksums.size(), payload.size(), options_.chunk_bytes, chunks));
  }
  for (uint64_t i = 0; i < chunks; ++i) {
    const uint64_t offset = i * options_.chunk_bytes;
    const absl::string_view chunk(
        payload.data() + offset, std::min<uint64_t>(options_.chunk_bytes, payload.size() - offset));
    if (checkpoint::ChunkChecksum(chunk) != chunk_checksums[i]) {
      return absl::DataLossError(absl::StrFormat(
          "persist step %d rank %d: the payload's chunk %d (offset %d) does not match its "
          "checksum: the snapshot changed or was corrupted in memory",
          step, rank, i, offset));
    }
  }
  return absl::OkStatus();
}

absl::Status Persister::Impl::WriteShard(const std::string& path,
                                         const checkpoint::ShardHeader& header,
                                         std::string_view payload,
                                         const std::vector<uint64_t>& chunk_checksums) {
  using checkpoint::WriteSegment;
  // Through the Env (a test's Env fills the disk here); preallocated, so the writes neither extend
  // the file nor allocate blocks, and a full disk shows before any write.
  const uint64_t file_bytes = checkpoint::ShardFileBytes(payload.size(), options_.chunk_bytes);
  absl::StatusOr<OpenedFile> file = env_->OpenForPreallocatedWrite(path, file_bytes);
  if (!file.ok()) return file.status();
  const int fd = file->fd;
  ScopedFd closer(fd);
  const std::string header_block = checkpoint::EncodeShardHeader(header);
  const std::string trailer = checkpoint::EncodeShardTrailer(chunk_checksums);
  std::vector<WriteSegment> segments;
  segments.push_back({0, header_block});
  for (uint64_t offset = 0; offset < payload.size(); offset += options_.chunk_bytes) {
    segments.push_back(
        {checkpoint::kShardHeaderBytes + offset,
         absl::string_view(payload.data() + offset,
                           std::min<uint64_t>(options_.chunk_bytes, payload.size() - offset))});
  }
  const uint64_t trailer_offset = checkpoint::TrailerOffset(payload.size());
  for (uint64_t at = 0; at < trailer.size(); at += options_.chunk_bytes) {
    segments.push_back({trailer_offset + at,
                        absl::string_view(trailer).substr(
                            at, std::min<uint64_t>(options_.chunk_bytes, trailer.size() - at))});
  }
  if (absl::Status s = writer_->WriteAndSync(fd, path, segments); !s.ok()) return s;
  if (::close(closer.release()) != 0) return ErrnoToStatus(errno, absl::StrFormat("close %s", path));
  return absl::OkStatus();
}

absl::Status Persister::Impl::CommitManifest(const std::string& step_dir, int rank,
                                             const proto::ShardManifest& manifest) {
  const std::string final_path = JoinPath(step_dir, checkpoint::ManifestFileName(rank));
  const std::string temp_path = final_path + kTempSuffix;
  absl::Status status = [&]() -> absl::Status {
    absl::StatusOr<std::unique_ptr<WritableFile>> file = env_->NewWritableFile(temp_path);
    if (!file.ok()) return file.status();
    if (absl::Status s = (*file)->Append(checkpoint::EncodeManifest(manifest)); !s.ok()) return s;
    if (absl::Status s = (*file)->Sync(); !s.ok()) return s;
    if (absl::Status s = (*file)->Close(); !s.ok()) return s;
    return env_->RenameFile(temp_path, final_path);
  }();
  if (!status.ok()) {
    env_->RemoveFile(temp_path).IgnoreError();
    return status;
  }
  // Until the directory is synced the commit may not survive a power loss; if that fails, undo
  // it so the previous step stays the latest rather than a commit of unknown durability.
  if (absl::Status s = env_->SyncDir(step_dir); !s.ok()) {
    env_->RemoveFile(final_path).IgnoreError();
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardRecord> Persister::Impl::Persist(int64_t step, int rank, int64_t generation,
                                                     uint64_t layout_hash, std::string_view payload,
                                                     const std::vector<uint64_t>& chunk_checksums,
                                                     const PayloadLayout* layout) {
  if (step < 0 || step > 999'999'999'999 || rank < 0 || rank > 99'999) {
    return absl::InvalidArgumentError(
        absl::StrFormat("persist: step %d or rank %d out of range", step, rank));
  }
  if (layout != nullptr && layout->blob_offset > payload.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "persist step %d rank %d: the layout's blob area starts at %d, past the %d-byte payload",
        step, rank, layout->blob_offset, payload.size()));
  }
  if (absl::Status s = CheckPayload(step, rank, payload, chunk_checksums); !s.ok()) return s;
  const std::string step_dir = JoinPath(options_.dir, checkpoint::StepDirName(step));
  if (absl::Status s = env_->CreateDirs(step_dir); !s.ok()) return s;
  if (absl::Status s = env_->SyncDir(options_.dir); !s.ok()) return s;
  const std::string manifest_path = JoinPath(step_dir, checkpoint::ManifestFileName(rank));
  // Persisting a committed step again: uncommit it first, so no manifest ever names a shard
  // that is being rewritten.
  if (env_->FileExists(manifest_path)) {
    if (absl::Status s = env_->RemoveFile(manifest_path); !s.ok()) return s;
    if (absl::Status s = env_->SyncDir(step_dir); !s.ok()) return s;
  }

  checkpoint::ShardHeader header;
  header.step = step;
  header.rank = rank;
  header.generation = generation;
  header.layout_hash = layout_hash;
  header.payload_bytes = payload.size();
  header.chunk_bytes = options_.chunk_bytes;
  header.chunk_count = chunk_checksums.size();
  const std::string shard_name = checkpoint::ShardFileName(rank);
  const std::string shard_path = JoinPath(step_dir, shard_name);
  if (absl::Status s = WriteShard(shard_path, header, payload, chunk_checksums); !s.ok()) {
    env_->RemoveFile(shard_path).IgnoreError();
    return s;
  }

  proto::ShardManifest manifest;
  manifest.set_format_version(checkpoint::kShardFormatVersion);
  manifest.set_step(step);
  manifest.set_rank(rank);
  manifest.set_generation(generation);
  manifest.set_layout_hash(layout_hash);
  manifest.set_shard_file(shard_name);
  manifest.set_payload_bytes(payload.size());
  manifest.set_chunk_bytes(options_.chunk_bytes);
  for (uint64_t c : chunk_checksums) manifest.add_chunk_checksums(c);
  manifest.set_shard_file_bytes(checkpoint::ShardFileBytes(payload.size(), options_.chunk_bytes));
  manifest.set_world_size(options_.world_size);
  manifest.set_shard_header_checksum(
      checkpoint::StoredHeaderChecksum(checkpoint::EncodeShardHeader(header)));
  if (layout != nullptr) *manifest.mutable_layout() = LayoutToProto(*layout);
  if (absl::Status s = CommitManifest(step_dir, rank, manifest); !s.ok()) {
    env_->RemoveFile(shard_path).IgnoreError();
    return s;
  }
  ApplyRetention(rank);

  ShardRecord record;
  record.step = step;
  record.rank = rank;
  record.generation = generation;
  record.layout_hash = layout_hash;
  record.shard_path = shard_path;
  record.payload_bytes = payload.size();
  record.chunk_bytes = options_.chunk_bytes;
  record.chunk_checksums = chunk_checksums;
  record.world_size = options_.world_size;
  if (layout != nullptr) record.layout = *layout;
  return record;
}

// Keeps the newest keep_last committed steps of `rank`; removes older commits and every leftover
// of `rank` (shard without manifest, temporary files) older than the newest commit. Best effort: a
// failure here does not undo the commit that was just made, so it is only reported.
void Persister::Impl::ApplyRetention(int rank) {
  absl::StatusOr<std::vector<std::string>> children = env_->GetChildren(options_.dir);
  if (!children.ok()) return;
  std::map<int64_t, bool> steps;  // step -> committed for `rank`
  for (const std::string& name : *children) {
    int64_t step;
    if (!checkpoint::ParseStepDirName(name, &step)) continue;
    const std::string manifest_path =
        JoinPath(JoinPath(options_.dir, name), checkpoint::ManifestFileName(rank));
    absl::StatusOr<std::string> bytes = env_->ReadFileToString(manifest_path);
    steps[step] = bytes.ok() && checkpoint::DecodeManifest(*bytes, manifest_path).ok();
  }
  int kept = 0;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const bool newest_commit_seen = kept > 0;
    if (it->second && kept < options_.keep_last) {
      ++kept;
      continue;
    }
    if (!newest_commit_seen) continue;  // a step being written after the newest commit
    const std::string step_dir = JoinPath(options_.dir, checkpoint::StepDirName(it->first));
    const std::string manifest = JoinPath(step_dir, checkpoint::ManifestFileName(rank));
    const std::string shard = JoinPath(step_dir, checkpoint::ShardFileName(rank));
    for (const std::string& path : {manifest, manifest + kTempSuffix, shard}) {
      if (!env_->FileExists(path)) continue;
      if (absl::Status s = env_->RemoveFile(path); !s.ok()) {
        std::fprintf(stderr, "trainguard: checkpoint retention: %s\n",
                     std::string(s.message()).c_str());
      }
    }
    std::error_code ignored;  // removes the step directory once no rank has files left in it
    std::filesystem::remove(step_dir, ignored);
  }
}

absl::StatusOr<std::unique_ptr<Persister>> Persister::Create(const PersisterOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  PersisterOptions resolved = options;
  std::error_code ec;
  resolved.dir = std::filesystem::absolute(options.dir, ec).lexically_normal().string();
  if (ec)
    return absl::InvalidArgumentError(absl::StrFormat("dir %s: %s", options.dir, ec.message()));
  while (resolved.dir.size() > 1 && resolved.dir.back() == '/') resolved.dir.pop_back();
  Env* env = options.env != nullptr ? options.env : Env::Default();
  if (absl::Status s = env->CreateDirs(resolved.dir); !s.ok()) return s;

  checkpoint::DirectWriterOptions writer_options;
  writer_options.buffer_bytes = options.chunk_bytes;
  writer_options.queue_depth = options.queue_depth;
  absl::StatusOr<std::unique_ptr<DirectWriter>> writer;
  if (checkpoint::DirectWriterFactory factory = checkpoint::DirectWriterFactoryForTesting()) {
    writer = factory(writer_options);
  } else if (options.use_io_uring) {
    writer = checkpoint::NewIoUringWriter(writer_options);
    if (absl::IsUnavailable(writer.status())) {
      std::fprintf(stderr, "trainguard: io_uring unavailable (%s): using pwritev\n",
                   std::string(writer.status().message()).c_str());
      writer = checkpoint::NewPwritevWriter(writer_options);
    }
  } else {
    writer = checkpoint::NewPwritevWriter(writer_options);
  }
  if (!writer.ok()) return writer.status();
  return std::unique_ptr<Persister>(
      new Persister(std::make_unique<Impl>(std::move(resolved), env, *std::move(writer))));
}

Persister::Persister(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Persister::~Persister() = default;

absl::StatusOr<ShardRecord> Persister::Persist(int64_t step, int rank, int64_t generation,
                                               uint64_t layout_hash, std::string_view payload,
                                               const std::vector<uint64_t>& chunk_checksums,
                                               const PayloadLayout* layout) {
  return impl_->Persist(step, rank, generation, layout_hash, payload, chunk_checksums, layout);
}

bool Persister::using_io_uring() const { return impl_->using_io_uring(); }

absl::StatusOr<std::vector<ShardRecord>> ListCommittedShards(Env* env, const std::string& dir) {
  if (env == nullptr) env = Env::Default();
  absl::StatusOr<std::vector<std::string>> steps = env->GetChildren(dir);
  if (!steps.ok()) return steps.status();
  std::vector<ShardRecord> records;
  for (const std::string& step_name : *steps) {
    int64_t step;
    if (!checkpoint::ParseStepDirName(step_name, &step)) continue;
    const std::string step_dir = JoinPath(dir, step_name);
    absl::StatusOr<std::vector<std::string>> files = env->GetChildren(step_dir);
    if (!files.ok()) continue;  // not a directory, or removed meanwhile by retention
    for (const std::string& file : *files) {
      int rank;
      if (!checkpoint::ParseRankFileName(file, ".manifest", &rank)) continue;
      const std::string path = JoinPath(step_dir, file);
      absl::StatusOr<std::string> bytes = env->ReadFileToString(path);
      if (!bytes.ok()) continue;
      absl::StatusOr<proto::ShardManifest> m = checkpoint::DecodeManifest(*bytes, path);
      if (!m.ok() || m->step() != step || m->rank() != rank ||
          m->format_version() != checkpoint::kShardFormatVersion || m->chunk_bytes() == 0 ||
          static_cast<uint64_t>(m->chunk_checksums_size()) !=
              checkpoint::ChunkCount(m->payload_bytes(), m->chunk_bytes())) {
        continue;
      }
      ShardRecord r;
      r.step = step;
      r.rank = rank;
      r.generation = m->generation();
      r.layout_hash = m->layout_hash();
      r.shard_path = JoinPath(step_dir, m->shard_file());
      r.payload_bytes = m->payload_bytes();
      r.chunk_bytes = m->chunk_bytes();
      r.chunk_checksums.assign(m->chunk_checksums().begin(), m->chunk_checksums().end());
      r.world_size = m->world_size();
      if (m->has_layout()) r.layout = LayoutFromProto(m->layout());
      records.push_back(std::move(r));
    }
  }
  std::sort(records.begin(), records.end(), [](const ShardRecord& a, const ShardRecord& b) {
    return std::pair(a.step, a.rank) < std::pair(b.step, b.rank);
  });
  return records;
}

absl::StatusOr<std::vector<CorruptChunk>> VerifyShard(
    Env* env, const ShardRecord& record, const std::function<void(uint64_t, uint64_t)>& progress) {
  return ShardScanner(record, /*stop_at_first=*/false)
      .Scan(env != nullptr ? env : Env::Default(), nullptr, progress);
}

absl::StatusOr<std::string> ReadShardPayload(Env* env, const ShardRecord& record) {
  std::string payload;
  absl::StatusOr<std::vector<CorruptChunk>> corrupt =
      ShardScanner(record, /*stop_at_first=*/true)
          .Scan(env != nullptr ? env : Env::Default(), &payload, nullptr);
  if (!corrupt.ok()) {
    return absl::Status(corrupt.status().code(), absl::StrFormat("%s: %s", ShardContext(record),
                                                                 corrupt.status().message()));
  }
  if (!corrupt->empty()) {
    const CorruptChunk& c = corrupt->front();
    return absl::DataLossError(
        absl::StrFormat("%s: %s at payload offset %d", ShardContext(record), c.what, c.offset));
  }
  return payload;
}

}  // namespace trainguard
