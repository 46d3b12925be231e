// BatchedLoad's hot-direct part (batched_load.h): items asked with hot_direct may be answered
// as spans of a hot copy in this uid's own arena segment instead of bytes in scratch; the library
// copies them once into the caller's memory, verifying each block as it copies (hot_spans.h),
// releases the batch's hot lease with its scratch, and loads the pieces whose blocks did not
// verify again through the daemon's own verified copy.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "batched_load.h"
#include "hot_spans.h"

namespace ckptd::internal {

void BatchedLoad::ReleaseUnwritten(Batch& b) {
  b.done.WaitForNotification();
  if (!b.status.ok() || b.resp.items_size() != b.req.items_size()) return;  // Finish's to say
  std::vector<uint64_t> ids;
  size_t next = 0;
  for (size_t k = 0; k < b.pieces.size(); ++k) {
    if (!pieces_[b.pieces[k]].via_arena()) continue;
    MappedExtent& e = b.scratch[next++];
    if (!b.resp.items(static_cast<int>(k)).hot_direct()) continue;
    ids.push_back(e.id);
    e.id = 0;  // released
  }
  core_.ReleaseQuietly(session_, ids);
}

void BatchedLoad::ReleaseScratch(Batch& b, bool hot_mismatch) {
  std::vector<uint64_t> ids;
  ids.reserve(b.scratch.size());
  for (const MappedExtent& e : b.scratch) {
    if (e.id != 0) ids.push_back(e.id);
  }
  b.scratch.clear();
  if (b.resp.hot_lease_id() == 0) {
    core_.ReleaseQuietly(session_, ids);  // the daemon frees them at Goodbye too
    return;
  }
  // The hot lease with the scratch, in one call; failing leaks nothing for long: the daemon
  // ends the lease when the session ends or hot_lease_ms passes.
  v1::ReleaseExtentsRequest req;
  req.set_session_id(session_.session_id);
  req.mutable_extent_ids()->Add(ids.begin(), ids.end());
  if (hot_mismatch) {
    req.add_hot_mismatch_lease_ids(b.resp.hot_lease_id());
  } else {
    req.add_hot_lease_ids(b.resp.hot_lease_id());
  }
  v1::ReleaseExtentsResponse resp;
  (void)core_.Call("ReleaseExtents", core_.rpc_timeout_ms(), &Connection::ReleaseExtents, req,
                   &resp);
}

bool BatchedLoad::CopyHot(const Batch& b, const std::vector<uint64_t>& written) {
  std::vector<HotDest> dests(b.pieces.size());
  std::vector<size_t> direct;
  for (size_t k = 0; k < b.pieces.size(); ++k) {
    const Piece& p = pieces_[b.pieces[k]];
    if (!b.resp.items(static_cast<int>(k)).hot_direct()) continue;
    direct.push_back(k);
    if (p.direct_ok()) dests[k] = HotDest{p.dest, p.bytes};  // else: refused below
  }
  if (direct.empty()) return true;
  absl::StatusOr<std::vector<bool>> ok =
      session_.arena == nullptr  // never after a reservation: an answer nobody asked for
          ? absl::InternalError("Load answered hot spans to a session with no arena mapped")
          : CopyHotSpans(*session_.arena, b.resp, dests, HotCopyThreads());
  bool all = ok.ok();
  for (size_t k : direct) all = all && dests[k].data != nullptr && (*ok)[k];
  uint64_t direct_bytes = 0;
  for (size_t k : direct) {
    const Piece& p = pieces_[b.pieces[k]];
    direct_bytes += p.bytes;
    if (all) {
      CountCopy(written[k], /*is_load=*/true);
    } else {
      again_.push_back(b.pieces[k]);
    }
  }
  if (!all) result_.bytes_from_ram -= std::min(result_.bytes_from_ram, direct_bytes);
  return all;
}

bool BatchedLoad::AskedHot(const Batch& b) const {
  return std::any_of(b.req.items().begin(), b.req.items().end(),
                     [](const v1::LoadItemRequest& i) { return i.hot_direct(); });
}

absl::Status BatchedLoad::LoadAgain(size_t target_count) {
  std::vector<Piece> pieces;
  pieces.reserve(again_.size());
  for (size_t i : again_) pieces.push_back(pieces_[i]);
  LoadOptions options = options_;
  options.hot_direct = false;
  BatchedLoad again(core_, session_, job_, step_, rank_, std::move(pieces), options);
  absl::StatusOr<LoadResult> r = again.Run(target_count);
  if (!r.ok()) return r.status();
  for (size_t t = 0; t < target_count; ++t) result_.item_bytes[t] += r->item_bytes[t];
  result_.step = r->step;
  result_.bytes_read += r->bytes_read;
  result_.bytes_read_remote += r->bytes_read_remote;
  result_.bytes_read_peer += r->bytes_read_peer;
  result_.bytes_from_ram += r->bytes_from_ram;
  return absl::OkStatus();
}

}  // namespace ckptd::internal
