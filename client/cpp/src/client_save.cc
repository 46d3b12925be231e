// Client: the save paths. Save() makes the one copy of each shard into the staging arena;
// Allocate()/SaveInPlace() make none.
#include <set>

#include "absl/strings/str_cat.h"
#include "ckptd/client.h"
#include "client_core.h"
#include "convert.h"
#include "shard_check.h"

namespace ckptd {

using internal::MappedExtent;
using internal::Session;

namespace {

void FillTensorSpec(const std::string& item, DType dtype, const std::vector<uint64_t>& shape,
                    const Region& region, v1::ShardSpec* spec) {
  spec->set_item(item);
  v1::TensorShardSpec* t = spec->mutable_tensor();
  t->set_dtype(internal::ToProto(dtype));
  t->mutable_global_shape()->Add(shape.begin(), shape.end());
  if (region.kind != Region::kWhole) internal::ToProto(region, t->mutable_region());
}

void FillObjectSpec(const std::string& item, bool per_rank, v1::ShardSpec* spec) {
  spec->set_item(item);
  spec->mutable_object()->set_scope(per_rank ? v1::PER_RANK : v1::REPLICATED);
}

void FillHeader(const Session& session, const std::string& job, uint64_t step, uint32_t rank,
                uint32_t world_size, v1::SaveRequest* req) {
  req->set_session_id(session.session_id);
  req->set_job(job);
  req->set_step(step);
  req->set_rank(rank);
  req->set_world_size(world_size);
}

absl::Status CheckSaveInputs(std::span<const TensorShard> tensors,
                             std::span<const ObjectShard> objects) {
  for (const TensorShard& t : tensors) {
    CKPTD_CLIENT_RETURN_IF_ERROR(
        internal::CheckTensorBytes(t.item, t.dtype, t.global_shape, t.region, t.bytes));
    if (t.bytes > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor shard of item ", t.item, ": data is null for ", t.bytes, " bytes"));
    }
  }
  for (const ObjectShard& o : objects) {
    if (o.item.empty()) return absl::InvalidArgumentError("object shard with an empty item name");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SaveResult> Client::Save(const std::string& job, uint64_t step, uint32_t rank,
                                        uint32_t world_size, std::span<const TensorShard> tensors,
                                        std::span<const ObjectShard> objects) {
  CKPTD_CLIENT_RETURN_IF_ERROR(CheckSaveInputs(tensors, objects));
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();

  // One extent per non-empty shard, all in one reservation.
  std::vector<uint64_t> sizes;
  for (const TensorShard& t : tensors) {
    if (t.bytes > 0) sizes.push_back(t.bytes);
  }
  for (const ObjectShard& o : objects) {
    if (!o.bytes.empty()) sizes.push_back(o.bytes.size());
  }
  absl::StatusOr<std::vector<MappedExtent>> extents = core_->Reserve(*session, sizes);
  if (!extents.ok()) return extents.status();
  std::vector<uint64_t> ids;
  for (const MappedExtent& e : *extents) ids.push_back(e.id);

  v1::SaveRequest req;
  FillHeader(*session, job, step, rank, world_size, &req);
  size_t next = 0;
  auto attach = [&](const void* src, uint64_t bytes, v1::ShardSpec* spec) {
    if (bytes == 0) return;  // an empty MemRef: no target, length 0
    const MappedExtent& e = (*extents)[next++];
    internal::CountedCopy(e.data, src, bytes, /*is_load=*/false);
    v1::MemRef* ref = spec->mutable_data();
    ref->set_extent_id(e.id);
    ref->set_offset(0);
    ref->set_length(bytes);
  };
  for (const TensorShard& t : tensors) {
    v1::ShardSpec* spec = req.add_shards();
    FillTensorSpec(t.item, t.dtype, t.global_shape, t.region, spec);
    attach(t.data, t.bytes, spec);
  }
  for (const ObjectShard& o : objects) {
    v1::ShardSpec* spec = req.add_shards();
    FillObjectSpec(o.item, o.per_rank, spec);
    attach(o.bytes.data(), o.bytes.size(), spec);
  }

  v1::SaveResponse resp;
  absl::Status s = core_->Call("Save", core_->rpc_timeout_ms(), [&](grpc::ClientContext* c) {
    return core_->stub().Save(c, req, &resp);
  });
  if (!s.ok()) {
    // The daemon refuses to release extents it took ownership of, so this is safe even when the
    // failure was only the answer getting lost.
    core_->ReleaseQuietly(*session, ids);
    return s;
  }
  return SaveResult{resp.bytes_staged(), internal::FromProto(resp.state())};
}

absl::StatusOr<ArenaBuffer> Client::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("Allocate(0): an arena buffer needs bytes");
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  absl::StatusOr<std::vector<MappedExtent>> extents = core_->Reserve(*session, {bytes});
  if (!extents.ok()) return extents.status();
  const MappedExtent& e = extents->front();
  core_->AddOutstanding(session->generation, e.id, e.length);
  ArenaBuffer buffer;
  buffer.extent_id = e.id;
  buffer.data = e.data;
  buffer.size = e.length;
  buffer.generation = session->generation;
  buffer.mapping = session->arena;
  return buffer;
}

absl::StatusOr<std::vector<ArenaBuffer>> Client::AllocateMany(std::span<const uint64_t> sizes) {
  std::vector<uint64_t> asked(sizes.begin(), sizes.end());
  for (uint64_t bytes : asked) {
    if (bytes == 0) return absl::InvalidArgumentError("AllocateMany: a size is 0");
  }
  std::vector<ArenaBuffer> out;
  if (asked.empty()) return out;
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  absl::StatusOr<std::vector<MappedExtent>> extents = core_->Reserve(*session, asked);
  if (!extents.ok()) return extents.status();
  out.reserve(extents->size());
  for (const MappedExtent& e : *extents) {
    core_->AddOutstanding(session->generation, e.id, e.length);
    out.push_back(ArenaBuffer{e.id, e.data, e.length, session->generation, session->arena});
  }
  return out;
}

void Client::ReleaseMany(std::span<const ArenaBuffer> buffers) {
  uint64_t generation = core_->generation();
  std::vector<uint64_t> ids;
  for (const ArenaBuffer& b : buffers) {
    if (b.generation != generation) continue;  // died with its daemon
    if (core_->TakeOutstanding(b.generation, b.extent_id).ok()) ids.push_back(b.extent_id);
  }
  if (ids.empty()) return;
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok() || session->generation != generation) return;
  core_->ReleaseQuietly(*session, ids);
}

absl::Status Client::Release(const ArenaBuffer& buffer) {
  if (buffer.generation != core_->generation()) return absl::OkStatus();  // died with its daemon
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->TakeOutstanding(buffer.generation, buffer.extent_id));
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  if (session->generation != buffer.generation) return absl::OkStatus();
  v1::ReleaseExtentsRequest req;
  req.set_session_id(session->session_id);
  req.add_extent_ids(buffer.extent_id);
  v1::ReleaseExtentsResponse resp;
  return core_->Call("ReleaseExtents", core_->rpc_timeout_ms(), [&](grpc::ClientContext* c) {
    return core_->stub().ReleaseExtents(c, req, &resp);
  });
}

absl::StatusOr<SaveResult> Client::SaveInPlace(const std::string& job, uint64_t step, uint32_t rank,
                                               uint32_t world_size,
                                               std::span<const InPlaceTensorShard> tensors,
                                               std::span<const InPlaceObjectShard> objects) {
  for (const InPlaceTensorShard& t : tensors) {
    CKPTD_CLIENT_RETURN_IF_ERROR(
        internal::CheckTensorBytes(t.item, t.dtype, t.global_shape, t.region, t.bytes));
  }
  for (const InPlaceObjectShard& o : objects) {
    if (o.item.empty()) return absl::InvalidArgumentError("object shard with an empty item name");
  }
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();

  v1::SaveRequest req;
  FillHeader(*session, job, step, rank, world_size, &req);
  std::set<uint64_t> consumed;  // arena buffers the daemon will own
  auto attach = [&](const std::string& item, const BufferRef& ref, uint64_t bytes,
                    v1::ShardSpec* spec) -> absl::Status {
    absl::Status s = core_->ToMemRef(*session, ref, bytes, spec->mutable_data());
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("item ", item, ": ", s.message()));
    if (bytes > 0 && ref.kind == BufferRef::kArena) consumed.insert(ref.id);
    return absl::OkStatus();
  };
  for (const InPlaceTensorShard& t : tensors) {
    v1::ShardSpec* spec = req.add_shards();
    FillTensorSpec(t.item, t.dtype, t.global_shape, t.region, spec);
    CKPTD_CLIENT_RETURN_IF_ERROR(attach(t.item, t.data, t.bytes, spec));
  }
  for (const InPlaceObjectShard& o : objects) {
    v1::ShardSpec* spec = req.add_shards();
    FillObjectSpec(o.item, o.per_rank, spec);
    CKPTD_CLIENT_RETURN_IF_ERROR(attach(o.item, o.data, o.bytes, spec));
  }

  v1::SaveResponse resp;
  CKPTD_CLIENT_RETURN_IF_ERROR(
      core_->Call("Save", core_->rpc_timeout_ms(),
                  [&](grpc::ClientContext* c) { return core_->stub().Save(c, req, &resp); }));
  for (uint64_t id : consumed) {
    (void)core_->TakeOutstanding(session->generation, id);  // the daemon owns it now
  }
  return SaveResult{resp.bytes_staged(), internal::FromProto(resp.state())};
}

}  // namespace ckptd
