// Deterministic snapshot payloads, and a Snapshotter::View of a payload as a Snapshotter would hand it to peer backups: the chunk
// checksums (XXH3-64 of each `chunk` bytes) and the fingerprint computed here. For the backup
// holder's and the backup service's tests.
#ifndef TRAINGUARD_TESTS_SUPPORT_SNAPSHOT_VIEW_H_
#define TRAINGUARD_TESTS_SUPPORT_SNAPSHOT_VIEW_H_

#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "sdk/checkpoint/snapshotter.h"

namespace trainguard::testing {

// `bytes` deterministic bytes of a snapshot of `step` (an xorshift stream seeded by `seed` and the
// step).
inline std::string SnapshotPayload(int64_t step, size_t bytes, uint64_t seed) {
  std::string out(bytes, '\0');
  uint64_t x = seed * static_cast<uint64_t>(step + 1);
  for (size_t i = 0; i < bytes; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<char>(x);
  }
  return out;
}

inline Snapshotter::View MakeSnapshotView(int64_t step, const std::string& payload, uint64_t chunk,
                                          uint64_t layout_hash, int64_t generation) {
  Snapshotter::View view;
  view.payload = payload;
  for (uint64_t at = 0; at < payload.size(); at += chunk) {
    view.chunk_checksums.push_back(
        XXH3_64bits(payload.data() + at, std::min<uint64_t>(chunk, payload.size() - at)));
  }
  view.info.step = step;
  view.info.generation = generation;
  view.info.layout_hash = layout_hash;
  view.info.bytes = payload.size();
  view.info.fingerprint =
      SnapshotFingerprint(step, layout_hash, payload.size(), view.chunk_checksums);
  return view;
}

}  // namespace trainguard::testing

#endif  // TRAINGUARD_TESTS_SUPPORT_SNAPSHOT_VIEW_H_
