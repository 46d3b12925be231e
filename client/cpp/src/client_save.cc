// Client: the save path. Save() and SaveInPlace() go through SaveSources: the one copy of each
// shard in caller memory into the staging arena (strided sources gathered in that pass), none for
// shards in daemon-visible memory; Allocate()/Release*() manage the caller's arena buffers.
#include <algorithm>
#include <chrono>
#include <set>

#include "absl/strings/str_cat.h"
#include "ckptd/client.h"
#include "client_core.h"
#include "convert.h"
#include "gpu_regions.h"
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

v1::TierPolicy ToProto(TierPolicy p) {
  switch (p) {
    case TierPolicy::kLocal:
      return v1::TIER_LOCAL;
    case TierPolicy::kLocalAndRemote:
      return v1::TIER_LOCAL_AND_REMOTE;
    case TierPolicy::kRemote:
      return v1::TIER_REMOTE;
    case TierPolicy::kLocalAndPeer:
      return v1::TIER_LOCAL_AND_PEER;
    case TierPolicy::kDefault:
      break;
  }
  return v1::TIER_POLICY_DEFAULT;
}

void FillHeader(const Session& session, const ClientOptions& options, const std::string& job,
                uint64_t step, uint32_t rank, uint32_t world_size, v1::SaveRequest* req) {
  req->set_session_id(session.session_id);
  req->set_tier_policy(ToProto(options.tier_policy));
  req->set_local_world_size(options.local_world_size);
  req->set_job(job);
  req->set_step(step);
  req->set_rank(rank);
  req->set_world_size(world_size);
}

// Where one shard's bytes come from: caller memory (contiguous `data` or `strided`), copied once
// into an extent of its own, or daemon-visible memory (`in_daemon`), not copied.
struct Source {
  const std::string* item = nullptr;
  uint64_t bytes = 0;
  const void* data = nullptr;
  const StridedView* strided = nullptr;
  std::optional<BufferRef> in_daemon;
  int device = -1;  // >= 0: `data` is GPU memory, copied into the extent by the daemon (IPC)
};

// Fills the extent of a GPU source: names the source's CUDA region for the daemon to copy from, or
// (the fallback) copies it here.
absl::Status StageGpuSource(internal::ClientCore& core, const Session& session, const Source& src,
                            const MappedExtent& e, v1::ShardSpec* spec) {
  absl::StatusOr<v1::MemRef> gpu =
      core.gpu().Locate(core, session, src.data, src.device, src.bytes);
  if (gpu.ok()) {
    *spec->mutable_gpu_source() = *std::move(gpu);
    return absl::OkStatus();
  }
  if (!core.gpu().FallBack(gpu.status())) return gpu.status();
  internal::CountGpuFallback(src.bytes);
  return internal::GpuRegions::CopyToHost(e.data, src.data, src.bytes, src.device);
}

// The one save path (Save and SaveInPlace): `req` holds the header and one spec per source, in
// order. Sources in caller memory that lie in daemon-visible memory are not copied; the others are
// copied once into extents reserved together. On success the arena buffers the daemon took are
// no longer outstanding; on failure the extents reserved here are released.
absl::StatusOr<SaveResult> SaveSources(internal::ClientCore& core, const Session& session,
                                       v1::SaveRequest& req, std::vector<Source>& sources) {
  std::vector<uint64_t> sizes;
  for (Source& src : sources) {
    if (src.bytes == 0 || src.in_daemon.has_value()) continue;
    if (src.device >= 0) {  // GPU memory always goes through an extent
      sizes.push_back(src.bytes);
      continue;
    }
    const void* flat = internal::ContiguousAddress(src.data, src.strided);
    if (flat != nullptr) src.in_daemon = core.Locate(session, flat, src.bytes);
    if (!src.in_daemon.has_value()) sizes.push_back(src.bytes);
  }
  // The daemon records what the client spent (RankTimings: reserve, copy) with the checkpoint.
  using Clock = std::chrono::steady_clock;
  auto micros_since = [](Clock::time_point t0) {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count());
  };
  const Clock::time_point reserve_start = Clock::now();
  absl::StatusOr<std::vector<MappedExtent>> extents = core.Reserve(session, sizes);
  if (!extents.ok()) return extents.status();
  req.set_client_reserve_us(sizes.empty() ? 0 : micros_since(reserve_start));
  const Clock::time_point copy_start = Clock::now();
  std::vector<uint64_t> ids;
  for (const MappedExtent& e : *extents) ids.push_back(e.id);
  auto fail = [&](const absl::Status& s) {
    // The daemon refuses to release extents it took ownership of, so this is safe even when the
    // failure was only the answer getting lost.
    core.ReleaseQuietly(session, ids);
    return s;
  };

  std::set<uint64_t> consumed;  // arena buffers the daemon will own
  size_t next = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const Source& src = sources[i];
    v1::MemRef* ref = req.mutable_shards(static_cast<int>(i))->mutable_data();
    if (src.bytes == 0) continue;  // an empty MemRef: no target, length 0
    if (src.in_daemon.has_value()) {
      absl::Status s = core.ToMemRef(session, *src.in_daemon, src.bytes, ref);
      if (!s.ok()) {
        return fail(absl::Status(s.code(), absl::StrCat("item ", *src.item, ": ", s.message())));
      }
      if (src.in_daemon->kind == BufferRef::kArena) consumed.insert(src.in_daemon->id);
      continue;
    }
    const MappedExtent& e = (*extents)[next++];
    if (src.device >= 0) {
      absl::Status st =
          StageGpuSource(core, session, src, e, req.mutable_shards(static_cast<int>(i)));
      if (!st.ok()) {
        return fail(absl::Status(st.code(), absl::StrCat("item ", *src.item, " (GPU ", src.device,
                                                         "): ", st.message())));
      }
    } else if (src.strided != nullptr) {
      Gather(*src.strided, e.data);  // counted by strided_copy
    } else {
      internal::CountedCopy(e.data, src.data, src.bytes, /*is_load=*/false);
    }
    ref->set_extent_id(e.id);
    ref->set_offset(0);
    ref->set_length(src.bytes);
  }
  req.set_client_copy_us(micros_since(copy_start));

  v1::SaveResponse resp;
  absl::Status s =
      core.Call("Save", core.rpc_timeout_ms(), &internal::Connection::Save, req, &resp);
  if (std::any_of(sources.begin(), sources.end(), [](const Source& x) { return x.device >= 0; })) {
    core.gpu().EndOperation(core, session);
  }
  if (!s.ok()) return fail(s);
  for (uint64_t id : consumed) {
    (void)core.TakeOutstanding(session.generation, id);  // the daemon owns it now
  }
  return SaveResult{resp.bytes_staged(), internal::FromProto(resp.state())};
}

absl::Status CheckObjectName(const std::string& item) {
  if (item.empty()) return absl::InvalidArgumentError("object shard with an empty item name");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SaveResult> Client::Save(const std::string& job, uint64_t step, uint32_t rank,
                                        uint32_t world_size, std::span<const TensorShard> tensors,
                                        std::span<const ObjectShard> objects) {
  std::vector<Source> sources;
  sources.reserve(tensors.size() + objects.size());
  for (const TensorShard& t : tensors) {
    CKPTD_CLIENT_RETURN_IF_ERROR(
        internal::CheckTensorBytes(t.item, t.dtype, t.global_shape, t.region, t.bytes));
    const StridedView* strided = t.strided.has_value() ? &*t.strided : nullptr;
    CKPTD_CLIENT_RETURN_IF_ERROR(internal::CheckCallerMemory(absl::StrCat("shard of item ", t.item),
                                                             t.data, strided, t.bytes));
    if (t.device >= 0 && strided != nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard of item ", t.item, ": GPU memory must be contiguous (no strided view)"));
    }
    sources.push_back(Source{&t.item, t.bytes, t.data, strided, std::nullopt, t.device});
  }
  for (const ObjectShard& o : objects) {
    CKPTD_CLIENT_RETURN_IF_ERROR(CheckObjectName(o.item));
    sources.push_back(Source{&o.item, o.data().size(), o.data().data(), nullptr, std::nullopt});
  }
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  v1::SaveRequest req;
  FillHeader(*session, core_->options(), job, step, rank, world_size, &req);
  for (const TensorShard& t : tensors) {
    FillTensorSpec(t.item, t.dtype, t.global_shape, t.region, req.add_shards());
  }
  for (const ObjectShard& o : objects) FillObjectSpec(o.item, o.per_rank, req.add_shards());
  return SaveSources(*core_, *session, req, sources);
}

absl::StatusOr<ArenaBuffer> Client::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("Allocate(0): an arena buffer needs bytes");
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  absl::StatusOr<std::vector<MappedExtent>> extents = core_->Reserve(*session, {bytes});
  if (!extents.ok()) return extents.status();
  const MappedExtent& e = extents->front();
  core_->AddOutstanding(session->generation, e);
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
    core_->AddOutstanding(session->generation, e);
    out.push_back(ArenaBuffer{e.id, e.data, e.length, session->generation, session->arena});
  }
  return out;
}

absl::StatusOr<std::vector<ArenaBuffer>> Client::Stage(std::span<const StridedView> sources) {
  std::vector<uint64_t> sizes;
  sizes.reserve(sources.size());
  for (const StridedView& v : sources) {
    if (v.Bytes() < 0) return absl::InvalidArgumentError("Stage: a source has a negative size");
    if (v.Bytes() > 0 && v.data == 0) return absl::InvalidArgumentError("Stage: a source is null");
    sizes.push_back(std::max<uint64_t>(static_cast<uint64_t>(v.Bytes()), 1));
  }
  absl::StatusOr<std::vector<ArenaBuffer>> bufs = AllocateMany(sizes);
  if (!bufs.ok()) return bufs.status();
  for (size_t i = 0; i < sources.size(); ++i) Gather(sources[i], (*bufs)[i].data);
  return bufs;
}

namespace {

// Forgets the outstanding buffers `ids` of `generation` and releases them, best effort.
void ReleaseOutstanding(internal::ClientCore& core, uint64_t generation,
                        const std::vector<uint64_t>& ids) {
  std::vector<uint64_t> taken;
  for (uint64_t id : ids) {
    if (core.TakeOutstanding(generation, id).ok()) taken.push_back(id);
  }
  if (taken.empty()) return;
  absl::StatusOr<Session> session = core.EnsureSession();
  if (!session.ok() || session->generation != generation) return;
  core.ReleaseQuietly(*session, taken);
}

}  // namespace

void Client::ReleaseMany(std::span<const ArenaBuffer> buffers) {
  const uint64_t generation = core_->generation();
  std::vector<uint64_t> ids;
  for (const ArenaBuffer& b : buffers) {
    if (b.generation == generation) ids.push_back(b.extent_id);  // else: died with its daemon
  }
  ReleaseOutstanding(*core_, generation, ids);
}

void Client::ReleaseAt(std::span<const void* const> addresses) {
  const uint64_t generation = core_->generation();
  ReleaseOutstanding(*core_, generation, core_->OutstandingAt(addresses));
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
  return core_->Call("ReleaseExtents", core_->rpc_timeout_ms(),
                     &internal::Connection::ReleaseExtents, req, &resp);
}

absl::StatusOr<SaveResult> Client::SaveInPlace(const std::string& job, uint64_t step, uint32_t rank,
                                               uint32_t world_size,
                                               std::span<const InPlaceTensorShard> tensors,
                                               std::span<const InPlaceObjectShard> objects) {
  std::vector<Source> sources;
  sources.reserve(tensors.size() + objects.size());
  for (const InPlaceTensorShard& t : tensors) {
    CKPTD_CLIENT_RETURN_IF_ERROR(
        internal::CheckTensorBytes(t.item, t.dtype, t.global_shape, t.region, t.bytes));
    sources.push_back(Source{&t.item, t.bytes, nullptr, nullptr, t.data});
  }
  for (const InPlaceObjectShard& o : objects) {
    CKPTD_CLIENT_RETURN_IF_ERROR(CheckObjectName(o.item));
    sources.push_back(Source{&o.item, o.bytes, nullptr, nullptr, o.data});
  }
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  v1::SaveRequest req;
  FillHeader(*session, core_->options(), job, step, rank, world_size, &req);
  for (const InPlaceTensorShard& t : tensors) {
    FillTensorSpec(t.item, t.dtype, t.global_shape, t.region, req.add_shards());
  }
  for (const InPlaceObjectShard& o : objects) FillObjectSpec(o.item, o.per_rank, req.add_shards());
  return SaveSources(*core_, *session, req, sources);
}

}  // namespace ckptd
