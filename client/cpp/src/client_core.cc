// The session with the daemon: Hello, re-connection, regions, extents (the arena's mapping:
// arena_mapping.cc).
#include "client_core.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ckptd::internal {

namespace {

constexpr uint64_t kExtentsPerReserveDefault = 65536;  // used if Hello's limits leave it 0
constexpr int kGoodbyeTimeoutMs = 1000;
constexpr uint32_t kSaveThreadsMax = 16;
constexpr int kSaveThreadNiceMax = 19;
constexpr uint32_t kAsyncSavesMax = 64;

// SaveAsync's options (client.h).
absl::Status CheckAsyncOptions(const ClientOptions& o) {
  if (o.save_threads < 1 || o.save_threads > kSaveThreadsMax || o.save_thread_nice < 0 ||
      o.save_thread_nice > kSaveThreadNiceMax || o.async_saves_max < 1 ||
      o.async_saves_max > kAsyncSavesMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions: save_threads (", o.save_threads, ") must be in [1, ", kSaveThreadsMax,
        "], save_thread_nice (", o.save_thread_nice, ") in [0, ", kSaveThreadNiceMax,
        "], async_saves_max (", o.async_saves_max, ") in [1, ", kAsyncSavesMax, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

// --- ClientCore: creation, channel watch ----------------------------------------------------

absl::StatusOr<std::unique_ptr<ClientCore>> ClientCore::Create(
    ClientOptions options, std::unique_ptr<Connection> connection) {
  if (options.rpc_timeout_ms <= 0 || options.connect_timeout_ms <= 0 ||
      options.reserve_timeout_ms < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions: rpc_timeout_ms (", options.rpc_timeout_ms,
                     ") and connect_timeout_ms (", options.connect_timeout_ms,
                     ") must be > 0, reserve_timeout_ms (", options.reserve_timeout_ms, ") >= 0"));
  }
  CKPTD_CLIENT_RETURN_IF_ERROR(CheckAsyncOptions(options));
  std::unique_ptr<ClientCore> core(new ClientCore(std::move(options), std::move(connection)));
  absl::StatusOr<Session> session = core->EnsureSession();
  if (!session.ok()) return session.status();
  return core;
}

ClientCore::ClientCore(ClientOptions options, std::unique_ptr<Connection> connection)
    : options_(std::move(options)), connection_(std::move(connection)) {}

ClientCore::~ClientCore() { Close(); }

void ClientCore::Close() {
  absl::MutexLock l(&mu_);
  if (closed_) return;
  closed_ = true;
  if (!session_.session_id.empty() && !need_hello_.load()) GoodbyeQuietly(session_.session_id);
  DetachLocked();
  // The mapping stays (buffers the caller holds point into it) until the last Session copy goes.
  session_.session_id.clear();
}

absl::Status ClientCore::AttachLocked(const std::string& session_id) {
  v1::AttachRequest req;
  req.set_session_id(session_id);
  attach_ = connection_->Attach(req);
  v1::SessionEvent first;
  if (!attach_->Read(&first)) {
    grpc::Status gs = attach_->Finish();
    attach_.reset();
    return Convert("Attach", options_.connect_timeout_ms,
                   gs.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "Attach ended at once") : gs);
  }
  if (!first.attached()) {
    // Still open: cancelled first, so that Finish does not wait for an end that may never come.
    attach_->Cancel();
    while (attach_->Read(&first)) {
    }
    (void)attach_->Finish();
    attach_.reset();
    return absl::InternalError(
        absl::StrCat("ckptd at ", target(), " answered Attach with an event other than attached"));
  }
  SessionStream* reader = attach_.get();
  const uint64_t epoch = attach_epoch_.load();
  attach_thread_ = std::thread([this, reader, epoch] {
    v1::SessionEvent e;
    while (reader->Read(&e)) {
    }
    // The stream ended: so did the session (connection dropped, daemon stopped or restarted).
    if (attach_epoch_.load() == epoch) need_hello_ = true;
  });
  return absl::OkStatus();
}

void ClientCore::DetachLocked() {
  attach_epoch_.fetch_add(1);
  if (attach_ != nullptr) attach_->Cancel();
  if (attach_thread_.joinable()) attach_thread_.join();
  if (attach_ != nullptr) (void)attach_->Finish();
  attach_.reset();
}

absl::Status ClientCore::Convert(const char* name, int64_t timeout_ms, const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  // gRPC and absl share the canonical code numbers.
  auto code = static_cast<absl::StatusCode>(status.error_code());
  std::string msg = status.error_message();
  if (code == absl::StatusCode::kUnavailable) {
    need_hello_ = true;
    msg = absl::StrCat("ckptd at ", target(), " is unavailable: ", msg);
  } else if (code == absl::StatusCode::kFailedPrecondition &&
             ReasonOf(status) == v1::UNKNOWN_SESSION) {
    // The daemon restarted between two of our calls without the drop being noticed: this call
    // fails, the next one says Hello again.
    need_hello_ = true;
  } else if (code == absl::StatusCode::kDeadlineExceeded && msg == "Deadline Exceeded") {
    msg = absl::StrCat("ckptd at ", target(), " did not answer ", name, " within ", timeout_ms,
                       " ms");
  }
  return absl::Status(code, msg);
}

v1::ErrorReason ReasonOf(const grpc::Status& status) {
  v1::ErrorDetail detail;
  if (status.error_details().empty() || !detail.ParseFromString(status.error_details())) {
    return v1::ERROR_REASON_UNSPECIFIED;
  }
  return detail.reason();
}

void ClientCore::GoodbyeQuietly(const std::string& session_id) {
  v1::GoodbyeRequest req;
  req.set_session_id(session_id);
  v1::GoodbyeResponse resp;
  (void)Call("Goodbye", kGoodbyeTimeoutMs, &Connection::Goodbye, req, &resp);
}

// --- session -----------------------------------------------------------------------------------

absl::StatusOr<Session> ClientCore::EnsureSession() {
  absl::MutexLock l(&mu_);
  return EnsureSessionLocked();
}

absl::StatusOr<Session> ClientCore::EnsureSessionLocked() {
  if (closed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("this client of ckptd at ", target(), " is closed"));
  }
  if (need_hello_.load() || session_.session_id.empty()) {
    CKPTD_CLIENT_RETURN_IF_ERROR(HelloLocked());
  }
  return session_;
}

absl::Status ClientCore::HelloLocked() {
  v1::HelloRequest req;
  req.set_pid(static_cast<uint32_t>(getpid()));
  req.set_client_name(options_.client_name.empty() ? absl::StrCat("ckptd-cpp/", getpid())
                                                   : options_.client_name);
  v1::HelloResponse resp;
  need_hello_ = false;  // a drop noticed from here on marks it again
  CallOptions o;
  o.timeout_ms = options_.connect_timeout_ms;
  o.wait_for_ready = true;  // ride out a daemon restart, within connect_timeout_ms
  grpc::Status gs = connection_->Hello(o, req, &resp);
  if (!gs.ok()) {
    need_hello_ = true;
    if (gs.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::UnavailableError(absl::StrCat("ckptd at ", target(),
                                                 " is unavailable: no answer to Hello within ",
                                                 options_.connect_timeout_ms, " ms"));
    }
    return Convert("Hello", options_.connect_timeout_ms, gs);
  }
  // The old session (if any) is over: its stream ended, or a call found it unknown.
  DetachLocked();
  if (absl::Status attached = AttachLocked(resp.session_id()); !attached.ok()) {
    need_hello_ = true;
    return attached;
  }
  // Within one daemon instance a uid's segment never changes; a new instance means new segments.
  std::shared_ptr<ArenaMapping> mapping = session_.arena;
  if (mapping == nullptr || resp.daemon_instance() != daemon_instance_) {
    absl::StatusOr<std::shared_ptr<ArenaMapping>> arena =
        connection_->MapArena(resp.session_id(), resp.arena_bytes(), options_.pin_arena_for_cuda);
    if (!arena.ok()) {
      GoodbyeQuietly(resp.session_id());
      DetachLocked();
      need_hello_ = true;
      return absl::Status(arena.status().code(),
                          absl::StrCat("mapping the staging arena of ckptd at ", target(), ": ",
                                       arena.status().message()));
    }
    mapping = *std::move(arena);
  }
  const bool restarted = !session_.session_id.empty();
  session_.session_id = resp.session_id();
  session_.arena = std::move(mapping);
  session_.generation += 1;
  session_.limits = resp.limits();
  daemon_instance_ = resp.daemon_instance();
  outstanding_.clear();  // extents of the old session were released with it
  outstanding_at_.clear();
  ReregisterLocked();
  if (restarted) reconnects_.fetch_add(1);
  return absl::OkStatus();
}

void ClientCore::ReregisterLocked() {
  for (auto& [handle, region] : regions_) {
    v1::RegisterRegionRequest req;
    req.set_session_id(session_.session_id);
    req.set_kind(v1::SHM);
    req.set_shm_name(region.shm_name);
    req.set_size_bytes(region.size_bytes);
    v1::RegisterRegionResponse resp;
    absl::Status s =
        Call("RegisterRegion", options_.rpc_timeout_ms, &Connection::RegisterRegion, req, &resp);
    region.server_id = s.ok() ? resp.region_id() : 0;
    region.error = s.ok() ? "" : s.ToString();
  }
}

// --- extents -----------------------------------------------------------------------------------

absl::StatusOr<std::vector<MappedExtent>> ClientCore::Reserve(const Session& session,
                                                              const std::vector<uint64_t>& sizes) {
  uint64_t chunk = session.limits.max_extents_per_reserve();
  if (chunk == 0) chunk = kExtentsPerReserveDefault;
  std::vector<MappedExtent> out;
  out.reserve(sizes.size());
  auto fail = [&](absl::Status s) {
    std::vector<uint64_t> ids;
    ids.reserve(out.size());
    for (const MappedExtent& e : out) ids.push_back(e.id);
    ReleaseQuietly(session, ids);
    return s;
  };
  for (size_t begin = 0; begin < sizes.size(); begin += chunk) {
    size_t end = std::min<size_t>(sizes.size(), begin + chunk);
    v1::ReserveExtentsRequest req;
    req.set_session_id(session.session_id);
    req.mutable_sizes_bytes()->Add(sizes.begin() + begin, sizes.begin() + end);
    req.set_timeout_ms(static_cast<uint32_t>(options_.reserve_timeout_ms));
    v1::ReserveExtentsResponse resp;
    absl::Status s = Call("ReserveExtents", options_.rpc_timeout_ms + options_.reserve_timeout_ms,
                          &Connection::ReserveExtents, req, &resp);
    if (!s.ok()) return fail(s);
    for (const v1::Extent& e : resp.extents()) {
      out.push_back(MappedExtent{e.id(), nullptr, e.length()});
    }
    if (out.size() != end) {
      return fail(absl::InternalError(absl::StrCat("ReserveExtents answered ", resp.extents_size(),
                                                   " extents for ", end - begin, " sizes")));
    }
    for (size_t i = begin; i < end; ++i) {
      const v1::Extent& e = resp.extents(static_cast<int>(i - begin));
      absl::StatusOr<uint8_t*> p = session.arena->At(e.offset(), e.length());
      if (!p.ok()) return fail(p.status());
      if (e.length() < sizes[i]) {
        return fail(absl::InternalError(absl::StrCat("extent ", e.id(), " has ", e.length(),
                                                     " bytes, ", sizes[i], " were asked")));
      }
      out[i].data = *p;
    }
  }
  return out;
}

void ClientCore::ReleaseQuietly(const Session& session, const std::vector<uint64_t>& ids) {
  if (ids.empty()) return;
  v1::ReleaseExtentsRequest req;
  req.set_session_id(session.session_id);
  req.mutable_extent_ids()->Add(ids.begin(), ids.end());
  v1::ReleaseExtentsResponse resp;
  // Failing here leaks nothing for long: the daemon frees a session's extents at Goodbye or exit.
  (void)Call("ReleaseExtents", options_.rpc_timeout_ms, &Connection::ReleaseExtents, req, &resp);
}

void ClientCore::AddOutstanding(uint64_t generation, const MappedExtent& extent) {
  absl::MutexLock l(&mu_);
  if (generation != session_.generation) return;
  const auto at = reinterpret_cast<uintptr_t>(extent.data);
  outstanding_[extent.id] = Outstanding{at, extent.length};
  outstanding_at_[at] = extent.id;
}

absl::Status ClientCore::TakeOutstanding(uint64_t generation, uint64_t extent_id) {
  absl::MutexLock l(&mu_);
  if (generation != session_.generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "arena buffer ", extent_id, " belongs to a previous daemon instance (generation ",
        generation, ", now ", session_.generation, ")"));
  }
  auto it = outstanding_.find(extent_id);
  if (it == outstanding_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena buffer ", extent_id, " is not allocated: already saved or released"));
  }
  outstanding_at_.erase(it->second.data);
  outstanding_.erase(it);
  return absl::OkStatus();
}

std::vector<uint64_t> ClientCore::OutstandingAt(std::span<const void* const> addresses) {
  absl::MutexLock l(&mu_);
  std::vector<uint64_t> ids;
  for (const void* p : addresses) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    auto it = outstanding_at_.upper_bound(at);
    if (it == outstanding_at_.begin()) continue;
    --it;
    const Outstanding& o = outstanding_.at(it->second);
    if (at - o.data >= o.bytes) continue;
    if (std::find(ids.begin(), ids.end(), it->second) == ids.end()) ids.push_back(it->second);
  }
  return ids;
}

std::optional<BufferRef> ClientCore::Locate(const Session& session, const void* data,
                                            uint64_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(data);
  if (bytes == 0 || at == 0) return std::nullopt;
  absl::MutexLock l(&mu_);
  if (session.generation != session_.generation) return std::nullopt;
  auto fits = [&](uintptr_t start, uint64_t size) {
    return at >= start && at - start <= size && bytes <= size - (at - start);
  };
  auto it = outstanding_at_.upper_bound(at);
  if (it != outstanding_at_.begin()) {
    --it;
    const Outstanding& o = outstanding_.at(it->second);
    if (fits(o.data, o.bytes)) {
      BufferRef ref;
      ref.kind = BufferRef::kArena;
      ref.id = it->second;
      ref.offset = at - o.data;
      ref.generation = session.generation;
      return ref;
    }
  }
  for (const auto& [handle, r] : regions_) {
    if (r.mapped_at != 0 && fits(r.mapped_at, r.size_bytes)) {
      return BufferRef::InRegion(RegionRef{handle, at - r.mapped_at});
    }
  }
  return std::nullopt;
}

// --- regions -----------------------------------------------------------------------------------

absl::StatusOr<uint64_t> ClientCore::RegisterShm(const std::string& shm_name, uint64_t size_bytes,
                                                 const void* mapped_at) {
  if (shm_name.empty() || size_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RegisterShm(\"", shm_name, "\", ", size_bytes, "): need a name and a size"));
  }
  // Under mu_, so a re-connection cannot interleave and lose the registration.
  absl::MutexLock l(&mu_);
  absl::StatusOr<Session> session = EnsureSessionLocked();
  if (!session.ok()) return session.status();
  v1::RegisterRegionRequest req;
  req.set_session_id(session->session_id);
  req.set_kind(v1::SHM);
  req.set_shm_name(shm_name);
  req.set_size_bytes(size_bytes);
  v1::RegisterRegionResponse resp;
  CKPTD_CLIENT_RETURN_IF_ERROR(
      Call("RegisterRegion", options_.rpc_timeout_ms, &Connection::RegisterRegion, req, &resp));
  uint64_t handle = next_handle_++;
  regions_[handle] =
      ShmRegion{shm_name, size_bytes, resp.region_id(), "", reinterpret_cast<uintptr_t>(mapped_at)};
  return handle;
}

absl::Status ClientCore::Unregister(uint64_t handle) {
  absl::MutexLock l(&mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("no registered region with handle ", handle));
  }
  ShmRegion region = it->second;
  regions_.erase(it);
  // A region the current instance never knew needs no RPC.
  if (region.server_id == 0 || need_hello_.load()) return absl::OkStatus();
  v1::UnregisterRegionRequest req;
  req.set_session_id(session_.session_id);
  req.set_region_id(region.server_id);
  v1::UnregisterRegionResponse resp;
  return Call("UnregisterRegion", options_.rpc_timeout_ms, &Connection::UnregisterRegion, req,
              &resp);
}

absl::StatusOr<uint64_t> ClientCore::RegionId(uint64_t handle, uint64_t offset, uint64_t length) {
  absl::MutexLock l(&mu_);
  auto it = regions_.find(handle);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrCat("no registered region with handle ", handle));
  }
  const ShmRegion& r = it->second;
  if (r.server_id == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("region handle ", handle, " (shm ", r.shm_name,
                     ") could not be registered again after the daemon restarted: ", r.error));
  }
  if (offset > r.size_bytes || length > r.size_bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat("bytes [", offset, ", +", length,
                                                   ") outside region handle ", handle, " (shm ",
                                                   r.shm_name, ", ", r.size_bytes, " bytes)"));
  }
  return r.server_id;
}

absl::Status ClientCore::ToMemRef(const Session& session, const BufferRef& ref, uint64_t length,
                                  v1::MemRef* out) {
  out->Clear();
  if (length == 0) return absl::OkStatus();  // no target: nothing to read or write
  {
    absl::MutexLock l(&mu_);
    if (session.generation != session_.generation) {
      return absl::UnavailableError(
          absl::StrCat("ckptd at ", target(), " restarted during the call"));
    }
  }
  if (ref.kind == BufferRef::kRegion) {
    absl::StatusOr<uint64_t> id = RegionId(ref.id, ref.offset, length);
    if (!id.ok()) return id.status();
    out->set_region_id(*id);
  } else {
    CKPTD_CLIENT_RETURN_IF_ERROR(ArenaMemRef(session, ref, length, out));
  }
  out->set_offset(ref.offset);
  out->set_length(length);
  return absl::OkStatus();
}

absl::Status ClientCore::ArenaMemRef(const Session& session, const BufferRef& ref, uint64_t length,
                                     v1::MemRef* out) {
  absl::MutexLock l(&mu_);
  if (ref.generation != session.generation) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena buffer ", ref.id, " belongs to a previous daemon instance (generation ",
                     ref.generation, ", now ", session.generation, ")"));
  }
  auto it = outstanding_.find(ref.id);
  if (it == outstanding_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena buffer ", ref.id, " is not allocated: already saved or released"));
  }
  const uint64_t size = it->second.bytes;
  if (ref.offset > size || length > size - ref.offset) {
    return absl::InvalidArgumentError(absl::StrCat("bytes [", ref.offset, ", +", length,
                                                   ") outside arena buffer ", ref.id, " of ", size,
                                                   " bytes"));
  }
  out->set_extent_id(ref.id);
  return absl::OkStatus();
}

}  // namespace ckptd::internal
