// BatchedLoad: the client's one load path (Client::Load, LoadInPlace, LoadObject(s), LoadAll):
// it plans a load's pieces into batches of arena scratch and runs them, one Load RPC per batch
// with two in flight. client_load.cc holds the batching (slicing, planning, starting and
// finishing a batch); client_load_hot.cc the hot-direct part (the spans of a hot copy in the
// caller's own segment copied and verified by the library, the hot lease released with the
// scratch, and the pieces whose copy did not verify loaded again without it).
//
// Ownership: a BatchedLoad lives for one call on the caller's thread; it borrows the core and
// the session (which outlive it) and the caller's destinations. Not thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "ckptd/client.h"
#include "client_core.h"

namespace ckptd::internal {

// One request item of a load: a whole target, or a flat slice of one too large for a batch.
struct Piece {
  size_t target = 0;  // index of the caller's target it fills
  const std::string* item = nullptr;
  Region region;
  std::optional<uint32_t> object_rank;
  uint64_t bytes = 0;
  std::optional<BufferRef> in_daemon;    // daemon-visible destination: written in place
  std::optional<v1::MemRef> gpu_dest;    // GPU memory the daemon writes over CUDA IPC
  uint8_t* dest = nullptr;               // contiguous caller memory (device memory: see device)
  const StridedView* strided = nullptr;  // strided caller memory
  int device = -1;  // >= 0: dest is GPU memory the library copies the scratch into (fallback)
  bool via_arena() const { return bytes > 0 && !in_daemon.has_value() && !gpu_dest.has_value(); }
  // The library may copy it straight from a hot copy in the arena (LoadItemRequest.hot_direct):
  // contiguous host memory it would otherwise copy scratch into.
  bool direct_ok() const { return via_arena() && strided == nullptr && device < 0 && dest; }
};

// One Load RPC: its pieces, their arena scratch, the call in flight.
struct Batch {
  std::vector<size_t> pieces;
  std::vector<MappedExtent> scratch;  // one per piece with via_arena(), in order
  v1::LoadRequest req;
  v1::LoadResponse resp;
  std::unique_ptr<PendingCall> call;  // the Load in flight, kept until `done`
  grpc::Status status;
  absl::Notification done;
  bool started = false;
};

class BatchedLoad {
 public:
  BatchedLoad(ClientCore& core, const Session& session, std::string job,
              std::optional<uint64_t> step, uint32_t rank, std::vector<Piece> pieces,
              const LoadOptions& options)
      : core_(core),
        session_(session),
        job_(std::move(job)),
        step_(step),
        rank_(rank),
        pieces_(std::move(pieces)),
        options_(options) {}

  // Splits caller-memory pieces larger than a batch into flat slices (whole and flat regions of
  // tensors, contiguous destinations: the slices are consecutive bytes of the destination).
  absl::Status SliceLarge();

  // Runs the batches, two in flight; LoadResult::item_bytes has target_count entries.
  absl::StatusOr<LoadResult> Run(size_t target_count);

 private:
  static bool Sliceable(const Piece& p, uint64_t budget);

  // Turns "latest" into the step it is now (one Latest call), so that every batch reads one step.
  absl::Status Resolve();

  // Consecutive pieces into batches of at most BatchBytes() of scratch and the daemon's limit of
  // items per Load; a piece larger than a batch (a box, a strided destination, an object) goes
  // alone. Always at least one batch (an empty load still checks that the checkpoint exists).
  void Plan();

  // Reserves the batch's scratch, builds its request and sends it (async: the caller's thread goes
  // on copying the previous batch out).
  absl::Status Start(Batch& b);

  // Waits for a started batch, copies its scratch out (or scatters it) and releases the scratch.
  absl::Status Finish(Batch& b);

  // Waits for b's answer and releases the scratch of its items answered hot_direct.
  void ReleaseUnwritten(Batch& b);

  // Releases the scratch b still holds and, in the same call, its hot lease (reporting that its
  // spans did not verify when hot_mismatch).
  void ReleaseScratch(Batch& b, bool hot_mismatch = false);

  // The hot spans of a finished batch copied into the caller's memory (hot_spans.h). When a
  // block does not verify (or the answer does not fit), every direct piece of the batch is loaded
  // again (again_) without hot_direct, as the daemon reads a whole load from storage when its own
  // copy from the RAM tier finds one; they leave bytes_from_ram. False when some must be.
  // `written`: the bytes the answer gives each item (what the spans copy; a destination may be
  // larger).
  bool CopyHot(const Batch& b, const std::vector<uint64_t>& written);

  // Whether b asked for any item hot_direct.
  bool AskedHot(const Batch& b) const;

  // Loads the pieces in again_ once more through the daemon's own verified copy.
  absl::Status LoadAgain(size_t target_count);

  ClientCore& core_;
  const Session& session_;
  const std::string job_;
  std::optional<uint64_t> step_;
  const uint32_t rank_;
  std::vector<Piece> pieces_;
  const LoadOptions options_;
  std::vector<std::unique_ptr<Batch>> batches_;
  LoadResult result_;
  std::vector<size_t> again_;  // pieces whose hot copy did not verify (CopyHot)
};

}  // namespace ckptd::internal
