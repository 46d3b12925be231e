// Conversions between client.h types and ckptd.v1 messages. DType's conversions are expanded from
// the one dtype table (ckptd/v1/dtype_table.h), which names both enumerators of each row.
#include "convert.h"

#include "absl/strings/str_cat.h"

namespace ckptd::internal {

namespace v1 = ::ckptd::v1;

v1::DType ToProto(DType dtype) {
  switch (dtype) {
#define CKPTD_DTYPE_TO_PROTO(proto, client, name, size, safetensors, numpy_native) \
  case DType::client:                                                              \
    return v1::proto;
    CKPTD_DTYPES(CKPTD_DTYPE_TO_PROTO)
#undef CKPTD_DTYPE_TO_PROTO
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> FromProto(v1::DType dtype) {
  switch (dtype) {
#define CKPTD_DTYPE_FROM_PROTO(proto, client, name, size, safetensors, numpy_native) \
  case v1::proto:                                                                    \
    return DType::client;
    CKPTD_DTYPES(CKPTD_DTYPE_FROM_PROTO)
#undef CKPTD_DTYPE_FROM_PROTO
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("dtype ", static_cast<int>(dtype), " is not known to this client"));
  }
}

void ToProto(const Region& region, v1::Region* out) {
  out->Clear();
  switch (region.kind) {
    case Region::kWhole:
      return;  // unset oneof: the whole tensor
    case Region::kBox: {
      v1::Box* box = out->mutable_box();
      box->mutable_offsets()->Add(region.offsets.begin(), region.offsets.end());
      box->mutable_lengths()->Add(region.lengths.begin(), region.lengths.end());
      return;
    }
    case Region::kFlat:
      out->mutable_flat()->set_start(region.flat_start);
      out->mutable_flat()->set_count(region.flat_count);
      return;
  }
}

CheckpointState FromProto(v1::CheckpointState state) {
  switch (state) {
    case v1::STAGING:
      return CheckpointState::kStaging;
    case v1::PERSISTING:
      return CheckpointState::kPersisting;
    case v1::COMMITTED:
      return CheckpointState::kCommitted;
    case v1::ABORTED:
      return CheckpointState::kAborted;
    case v1::DELETING:
      return CheckpointState::kDeleting;
    case v1::CORRUPT:
      return CheckpointState::kCorrupt;
    case v1::MISSING:
      return CheckpointState::kMissing;
    default:
      return CheckpointState::kUnspecified;
  }
}

CheckpointInfo FromProto(const v1::CheckpointSummary& s) {
  CheckpointInfo info;
  info.job = s.job();
  info.step = s.step();
  info.state = FromProto(s.state());
  info.world_size = s.world_size();
  info.bytes = s.bytes();
  info.tiers.staged = s.tiers().staged();
  info.tiers.local = s.tiers().local();
  info.tiers.remote = s.tiers().remote();
  info.tiers.ram = s.tiers().ram();
  info.tiers.ram_bytes = s.tiers().ram_bytes();
  info.tiers.peer_nodes.assign(s.tiers().peer_nodes().begin(), s.tiers().peer_nodes().end());
  info.tiers.blobs_without_peer_copy = s.tiers().blobs_without_peer_copy();
  info.tiers.part_peers.assign(s.tiers().part_peers().begin(), s.tiers().part_peers().end());
  info.tiers.peer_degraded = s.tiers().peer_degraded();
  info.tiers.local_part = s.tiers().local_part();
  if (s.tiers().has_upload()) {
    const v1::Upload& u = s.tiers().upload();
    UploadProgress& p = info.tiers.upload;
    switch (u.state()) {
      case v1::UPLOAD_PENDING:
        p.state = UploadProgress::kPending;
        break;
      case v1::UPLOAD_RUNNING:
        p.state = UploadProgress::kRunning;
        break;
      case v1::UPLOAD_RETRYING:
        p.state = UploadProgress::kRetrying;
        break;
      case v1::UPLOAD_DURABLE:
        p.state = UploadProgress::kDurable;
        break;
      case v1::UPLOAD_REFUSED:
        p.state = UploadProgress::kRefused;
        break;
      default:
        p.state = UploadProgress::kNone;
    }
    p.bytes_done = u.bytes_done();
    p.bytes_total = u.bytes_total();
    p.error = u.error();
    p.attempts = u.attempts();
    p.store = u.store();
  }
  info.created_unix_ms = s.created_unix_ms();
  info.committed_unix_ms = s.committed_unix_ms();
  info.partial = s.partial();
  info.error = s.error();
  info.item_count = s.item_count();
  info.local_world_size = s.local_world_size();
  return info;
}

CheckpointInfo FromProto(const v1::CheckpointStatus& status) {
  CheckpointInfo info = FromProto(status.summary());
  for (const v1::RankStatus& r : status.ranks()) {
    RankProgress p;
    p.rank = r.rank();
    p.staged = r.staged();
    p.persisted = r.persisted();
    p.bytes_staged = r.bytes_staged();
    p.bytes_persisted = r.bytes_persisted();
    p.shard_count = r.shard_count();
    info.ranks.push_back(p);
  }
  info.missing_ranks.assign(status.missing_ranks().begin(), status.missing_ranks().end());
  info.bytes_staged = status.bytes_staged();
  info.bytes_persisted = status.bytes_persisted();
  for (const v1::NodeStatus& n : status.nodes()) {
    info.nodes.push_back(NodeProgress{.node = n.node(),
                                      .ranks = {n.ranks().begin(), n.ranks().end()},
                                      .part_durable = n.part_durable(),
                                      .coordinator = n.coordinator()});
  }
  info.waiting_for = status.waiting_for();
  return info;
}

JobInfo FromProto(const v1::JobSummary& j) {
  JobInfo info;
  info.job = j.job();
  info.owner_uid = j.owner_uid();
  info.checkpoint_count = j.checkpoint_count();
  if (j.has_committed()) info.latest_committed_step = j.latest_committed_step();
  return info;
}

ItemInfo FromProto(const v1::ItemInfo& i) {
  ItemInfo info;
  info.name = i.name();
  info.kind = i.kind() == v1::OBJECT ? ItemInfo::kObject : ItemInfo::kTensor;
  if (absl::StatusOr<DType> d = FromProto(i.dtype()); d.ok()) info.dtype = *d;
  info.shape.assign(i.shape().begin(), i.shape().end());
  info.per_rank = i.scope() == v1::PER_RANK;
  info.shard_count = i.shard_count();
  info.bytes = i.bytes();
  info.object_ranks.assign(i.object_ranks().begin(), i.object_ranks().end());
  return info;
}

}  // namespace ckptd::internal
