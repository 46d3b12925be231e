// Internal to libckptd-client: copying a Load answer's hot spans (LoadResponse.hot_spans; issue 37
// §1, docs/ARCHITECTURE.md "The load path") out of this process's mapping of its arena segment
// into the caller's memory — one copy, each checksum block's crc32c computed as it is copied and
// compared with the manifest's that the daemon sent.
//
// The bytes read are the bytes the destination gets (a block is checksummed from the words it
// stores, or, for a span copied in parts, from a private bounce copy the parts are then taken
// from): a hot copy changed under the copy (a lease ended early, a daemon restart reusing the
// extents, another process of the uid writing its own segment) shows as a mismatch, never as
// wrong bytes kept. The daemon's answer is checked before any byte moves: a span or copy outside
// the mapping or its destination is INTERNAL naming it (a daemon bug or lie; the caller loads
// through the ordinary path then).
// Threads: CopyHotSpans runs the copy on the calling thread and up to threads - 1 of its own
// (joined before it returns); it holds no lock and may be called concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "arena_mapping.h"
#include "ckptd/v1/ckptd.pb.h"

namespace ckptd::internal {

// Where request item i's bytes go: data[0, bytes); data null for items not answered hot_direct.
struct HotDest {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
};

// Copies every span of `resp` into `dests` (indexed like the request's items). Returns, per item,
// whether every block it took bytes from verified (false: load it again without hot_direct; its
// destination may hold some unverified bytes). INTERNAL for an answer that does not fit (nothing
// copied then).
absl::StatusOr<std::vector<bool>> CopyHotSpans(const ArenaMapping& arena,
                                               const v1::LoadResponse& resp,
                                               std::span<const HotDest> dests, unsigned threads);

// The copy threads for CopyHotSpans: the CPUs this process may run on, at most 16.
unsigned HotCopyThreads();

}  // namespace ckptd::internal
