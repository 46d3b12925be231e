// The session, extent and region calls of CheckpointService (the SessionTable, the arena and
// the region registry own the state; these check the caller and translate).
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/limits.h"
#include "format/names.h"
#include "index/keys.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"

namespace ckptd {

absl::StatusOr<std::string> CheckpointService::SessionOf(const Caller& caller,
                                                         const std::string& id) const {
  CKPTD_RETURN_IF_ERROR(sessions_.Check(caller, id));
  return id;
}

absl::Status CheckpointService::Hello(const Caller& caller, const v1::HelloRequest& req,
                                      v1::HelloResponse* resp) {
  CKPTD_ASSIGN_OR_RETURN(std::string id, sessions_.Open(caller, req.client_name()));
  resp->set_session_id(id);
  // The segment is made when the uid first maps or reserves staging memory, not here: a client
  // that only inspects (ckptctl ls) never costs one.
  if (std::optional<ArenaSegmentInfo> seg = deps_.arena->ExistingSegment(caller.uid)) {
    resp->set_arena_shm_name(seg->name);
    resp->set_arena_generation(seg->generation);
    resp->set_arena_resident(deps_.arena->FullyResident(caller.uid));
  }
  resp->set_arena_bytes(deps_.arena->size_bytes());
  resp->set_daemon_instance(instance_id_);
  resp->set_manifest_format_version(kManifestFormatVersion);
  v1::Limits* l = resp->mutable_limits();
  l->set_extent_alignment_bytes(limits::kAlignmentBytes);
  l->set_max_shards_per_save(limits::kShardsPerSaveMax);
  l->set_max_extents_per_reserve(limits::kExtentsPerReserveMax);
  l->set_max_regions_per_client(limits::kRegionsPerSessionMax);
  l->set_max_job_name_bytes(limits::kJobNameBytesMax);
  l->set_max_item_name_bytes(limits::kItemNameBytesMax);
  l->set_max_load_requests(limits::kLoadRequestsMax);
  l->set_max_object_bytes(limits::kObjectBytesMax);
  spdlog::debug("session {} opened by {} on connection {} ({})", id, DescribeCaller(caller),
                caller.connection, req.client_name().substr(0, 256));
  return absl::OkStatus();
}

absl::StatusOr<ArenaGrant> CheckpointService::ArenaFd(uint32_t uid, const std::string& session) {
  CKPTD_RETURN_IF_ERROR(sessions_.CheckUid(uid, session));
  CKPTD_ASSIGN_OR_RETURN(ArenaSegmentInfo seg, deps_.arena->Segment(uid));
  CKPTD_ASSIGN_OR_RETURN(int fd, deps_.arena->SegmentFd(uid));
  sessions_.SetArenaGeneration(session, seg.generation);
  return ArenaGrant{fd, seg.name, seg.generation, deps_.arena->FullyResident(uid)};
}

absl::Status CheckpointService::SessionArenaStatus(const std::string& session) const {
  const std::string generation = sessions_.ArenaGeneration(session);
  if (generation.empty() || !deps_.arena->Retired(generation)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "session ", session, ": the staging arena segment it mapped (generation ", generation,
      ") was truncated or resized by a process of its uid and is retired; its mapping and the "
      "extents it reserved are gone: start a new session (reconnect) to map the new segment"));
}

absl::Status CheckpointService::Attach(const Caller& caller, const std::string& id) {
  return sessions_.Attach(caller, id);
}

void CheckpointService::EndSession(const std::string& id) { sessions_.End(id); }

absl::Status CheckpointService::Goodbye(const Caller& caller, const v1::GoodbyeRequest& req) {
  CKPTD_ASSIGN_OR_RETURN(std::string session, SessionOf(caller, req.session_id()));
  sessions_.End(session);
  return absl::OkStatus();
}

absl::Status CheckpointService::ReserveExtents(const Caller& caller,
                                               const v1::ReserveExtentsRequest& req,
                                               v1::ReserveExtentsResponse* resp) {
  CKPTD_ASSIGN_OR_RETURN(std::string session, SessionOf(caller, req.session_id()));
  if (req.sizes_bytes_size() == 0) return absl::InvalidArgumentError("no extent sizes given");
  if (static_cast<uint64_t>(req.sizes_bytes_size()) > limits::kExtentsPerReserveMax) {
    return absl::InvalidArgumentError(absl::StrCat("asked for ", req.sizes_bytes_size(),
                                                   " extents in one call; the limit is ",
                                                   limits::kExtentsPerReserveMax));
  }
  // Reserving also checks the uid's segment (StagingArena::Segment: a damaged one is retired).
  CKPTD_RETURN_IF_ERROR(deps_.arena->Segment(caller.uid).status());
  CKPTD_RETURN_IF_ERROR(SessionArenaStatus(session));
  uint64_t timeout_ms = req.timeout_ms() == 0 ? deps_.options->reserve_timeout_ms
                                              : std::min<uint64_t>(req.timeout_ms(), 3600000);
  CKPTD_ASSIGN_OR_RETURN(std::vector<ExtentInfo> extents,
                         deps_.arena->Reserve(session, caller.uid,
                                              std::span<const uint64_t>(req.sizes_bytes().data(),
                                                                        req.sizes_bytes().size()),
                                              absl::Milliseconds(timeout_ms)));
  for (const ExtentInfo& e : extents) {
    v1::Extent* out = resp->add_extents();
    out->set_id(e.id);
    out->set_offset(e.offset);
    out->set_length(e.length);
  }
  return absl::OkStatus();
}

absl::Status CheckpointService::ReleaseExtents(const Caller& caller,
                                               const v1::ReleaseExtentsRequest& req) {
  CKPTD_ASSIGN_OR_RETURN(std::string session, SessionOf(caller, req.session_id()));
  absl::Status st = deps_.arena->Release(
      session, std::span<const uint64_t>(req.extent_ids().data(), req.extent_ids().size()));
  for (uint64_t id : req.hot_lease_ids()) {
    absl::StatusOr<Key> key = hot_leases_.Release(session, id);
    if (!key.ok() && st.ok()) st = key.status();
  }
  for (uint64_t id : req.hot_mismatch_lease_ids()) {
    absl::StatusOr<Key> key = hot_leases_.Release(session, id);
    if (!key.ok()) {
      if (st.ok()) st = key.status();
      continue;
    }
    // The client's copy of a hot block did not verify: never used again, as when the daemon's
    // own copy does not (load.cc).
    spdlog::error(
        "{}: hot bytes {} copied did not verify (crc32c mismatch); dropped from the "
        "RAM tier, the client is reading it from storage",
        CkptName(key->first, key->second), DescribeCaller(caller));
    ram_tier_.Drop(*key);
    if (deps_.metrics != nullptr) deps_.metrics->ChecksumFailure("ram");
  }
  return st;
}

absl::Status CheckpointService::RegisterRegion(const Caller& caller,
                                               const v1::RegisterRegionRequest& req,
                                               v1::RegisterRegionResponse* resp) {
  CKPTD_ASSIGN_OR_RETURN(std::string session, SessionOf(caller, req.session_id()));
  CKPTD_ASSIGN_OR_RETURN(uint64_t id, deps_.regions->Register(session, caller.uid, req));
  resp->set_region_id(id);
  return absl::OkStatus();
}

absl::Status CheckpointService::UnregisterRegion(const Caller& caller,
                                                 const v1::UnregisterRegionRequest& req) {
  CKPTD_ASSIGN_OR_RETURN(std::string session, SessionOf(caller, req.session_id()));
  return deps_.regions->Unregister(session, req.region_id(), absl::Seconds(30));
}

}  // namespace ckptd
