// The scripted daemon of the client's unit tests (fake_daemon.h).
#include "fake_daemon.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "convert.h"

namespace ckptd::testing {

namespace {

// The fake's own set-up failing is a broken test machine, not a behaviour under test.
void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fake daemon: %s failed: %s\n", what, std::strerror(errno));
  std::abort();
}

}  // namespace

grpc::Status GrpcDeadline() {
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
}

grpc::Status UnknownSession(const std::string& session_id) {
  v1::ErrorDetail detail;
  detail.set_reason(v1::UNKNOWN_SESSION);
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      absl::StrCat("unknown session ", session_id), detail.SerializeAsString());
}

FakeDaemon::FakeDaemon(uint64_t arena_bytes) : arena_bytes_(arena_bytes) {
  absl::MutexLock l(&mu_);
  limits_.set_extent_alignment_bytes(4096);
  NewArena();
}

FakeDaemon::~FakeDaemon() {
  absl::MutexLock l(&mu_);
  EndStreams(grpc::Status(grpc::StatusCode::UNAVAILABLE, "daemon gone"));
  if (arena_fd_ >= 0) (void)close(arena_fd_);
}

void FakeDaemon::NewArena() {
  if (arena_fd_ >= 0) (void)close(arena_fd_);  // the old mappings stay valid
  arena_fd_ = memfd_create("fake-ckptd-arena", MFD_CLOEXEC);
  Require(arena_fd_ >= 0 && ftruncate(arena_fd_, static_cast<off_t>(arena_bytes_)) == 0,
          "memfd_create + ftruncate");
  absl::StatusOr<std::shared_ptr<internal::ArenaMapping>> view = internal::ArenaMapping::MapFd(
      dup(arena_fd_), absl::StrCat("/fake-arena-", instance_), arena_bytes_, false, false);
  Require(view.ok(), "mapping the arena");
  arena_ = *std::move(view);
}

void FakeDaemon::EndStreams(grpc::Status why) {
  for (const std::shared_ptr<StreamState>& s : streams_) s->End(why);
  streams_.clear();
}

// --- scripting
// -------------------------------------------------------------------------------------

void FakeDaemon::FailNext(const std::string& method, grpc::Status status, int times) {
  absl::MutexLock l(&mu_);
  for (int i = 0; i < times; ++i) fail_next_[method].push_back(status);
}

void FakeDaemon::SetDown(bool down) {
  absl::MutexLock l(&mu_);
  down_ = down;
}

void FakeDaemon::Restart() {
  absl::MutexLock l(&mu_);
  instance_ += 1;
  sessions_.clear();
  extents_.clear();
  regions_.clear();
  NewArena();
  EndStreams(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed"));
}

void FakeDaemon::DropSessions() {
  absl::MutexLock l(&mu_);
  sessions_.clear();
  extents_.clear();
  regions_.clear();
  EndStreams(grpc::Status(grpc::StatusCode::UNAVAILABLE, "Socket closed"));
}

void FakeDaemon::ForgetSessions() {
  absl::MutexLock l(&mu_);
  sessions_.clear();
  extents_.clear();
  regions_.clear();
}

void FakeDaemon::OnSave(SaveHook hook) {
  absl::MutexLock l(&mu_);
  save_hook_ = std::move(hook);
}

void FakeDaemon::OnReserve(ReserveHook hook) {
  absl::MutexLock l(&mu_);
  reserve_hook_ = std::move(hook);
}

void FakeDaemon::SetLimits(const v1::Limits& limits) {
  absl::MutexLock l(&mu_);
  limits_ = limits;
  if (limits_.extent_alignment_bytes() == 0) limits_.set_extent_alignment_bytes(4096);
}

void FakeDaemon::SetPageSize(size_t page_size) {
  absl::MutexLock l(&mu_);
  page_size_ = page_size;
}

// --- the store
// -------------------------------------------------------------------------------------

void FakeDaemon::AddTensor(const std::string& job, uint64_t step, const std::string& item,
                           DType dtype, std::vector<uint64_t> shape, std::string bytes) {
  absl::MutexLock l(&mu_);
  Item& it = store_[{job, step}][item];
  it.tensor = true;
  it.dtype = internal::ToProto(dtype);
  it.shape = std::move(shape);
  it.element_bytes = DTypeSize(dtype);
  it.bytes = std::move(bytes);
}

void FakeDaemon::AddObject(const std::string& job, uint64_t step, const std::string& item,
                           std::string bytes) {
  absl::MutexLock l(&mu_);
  Item& it = store_[{job, step}][item];
  it.tensor = false;
  it.bytes = std::move(bytes);
}

void FakeDaemon::SetStatus(const std::string& job, uint64_t step, v1::CheckpointStatus status) {
  absl::MutexLock l(&mu_);
  statuses_[{job, step}] = std::move(status);
}

std::string FakeDaemon::Stored(const std::string& job, uint64_t step, const std::string& item) {
  absl::MutexLock l(&mu_);
  auto c = store_.find({job, step});
  if (c == store_.end()) return "";
  auto it = c->second.find(item);
  return it == c->second.end() ? "" : it->second.bytes;
}

// --- what happened
// ---------------------------------------------------------------------------------

std::vector<Received> FakeDaemon::calls() {
  absl::MutexLock l(&mu_);
  return calls_;
}

std::vector<std::string> FakeDaemon::methods() {
  absl::MutexLock l(&mu_);
  std::vector<std::string> out;
  for (const Received& r : calls_) out.push_back(r.method);
  return out;
}

int FakeDaemon::count(const std::string& method) {
  absl::MutexLock l(&mu_);
  return static_cast<int>(std::count_if(calls_.begin(), calls_.end(),
                                        [&](const Received& r) { return r.method == method; }));
}

std::vector<v1::SaveRequest> FakeDaemon::saves() {
  absl::MutexLock l(&mu_);
  return saves_;
}
std::vector<v1::LoadRequest> FakeDaemon::loads() {
  absl::MutexLock l(&mu_);
  return loads_;
}
std::vector<v1::ReserveExtentsRequest> FakeDaemon::reserves() {
  absl::MutexLock l(&mu_);
  return reserves_;
}
std::vector<v1::ReleaseExtentsRequest> FakeDaemon::releases() {
  absl::MutexLock l(&mu_);
  return releases_;
}
std::vector<v1::RegisterRegionRequest> FakeDaemon::registrations() {
  absl::MutexLock l(&mu_);
  return registrations_;
}
size_t FakeDaemon::extents_held() {
  absl::MutexLock l(&mu_);
  return extents_.size();
}
size_t FakeDaemon::extents_held_max() {
  absl::MutexLock l(&mu_);
  return extents_held_max_;
}
int FakeDaemon::arena_maps() {
  absl::MutexLock l(&mu_);
  return arena_maps_;
}
std::string FakeDaemon::session_id() {
  absl::MutexLock l(&mu_);
  return last_session_;
}
int FakeDaemon::open_streams() {
  absl::MutexLock l(&mu_);
  return static_cast<int>(
      std::count_if(streams_.begin(), streams_.end(),
                    [](const std::shared_ptr<StreamState>& s) { return !s->Ended(); }));
}

// --- the calls
// -------------------------------------------------------------------------------------

grpc::Status FakeDaemon::Enter(const std::string& method, const CallOptions& o,
                               const std::string* session) {
  calls_.push_back(Received{method, o.timeout_ms, o.wait_for_ready, session ? *session : ""});
  if (down_) {
    return o.wait_for_ready
               ? GrpcDeadline()
               : grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses");
  }
  auto script = fail_next_.find(method);
  if (script != fail_next_.end() && !script->second.empty()) {
    grpc::Status s = script->second.front();
    script->second.erase(script->second.begin());
    if (!s.ok()) return s;
  }
  if (session != nullptr && sessions_.count(*session) == 0) return UnknownSession(*session);
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::Hello(const CallOptions& o, const v1::HelloRequest& /*req*/,
                               v1::HelloResponse* resp) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter("Hello", o, nullptr); !s.ok()) return s;
  last_session_ = absl::StrCat("s", instance_, "-", next_session_++);
  sessions_.insert(last_session_);
  resp->set_session_id(last_session_);
  resp->set_arena_bytes(arena_bytes_);
  resp->set_daemon_instance(absl::StrCat("instance-", instance_));
  *resp->mutable_limits() = limits_;
  return grpc::Status::OK;
}

std::unique_ptr<internal::SessionStream> FakeDaemon::Attach(const v1::AttachRequest& req) {
  absl::MutexLock l(&mu_);
  auto stream = std::make_shared<StreamState>();
  if (grpc::Status s = Enter("Attach", CallOptions{}, &req.session_id()); !s.ok()) {
    stream->End(s);
  } else {
    streams_.push_back(stream);
  }
  return MakeStream(stream);
}

grpc::Status FakeDaemon::Goodbye(const CallOptions& o, const v1::GoodbyeRequest& req,
                                 v1::GoodbyeResponse* /*resp*/) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter("Goodbye", o, &req.session_id()); !s.ok()) return s;
  sessions_.erase(req.session_id());
  std::erase_if(extents_, [&](const auto& e) { return e.second.session == req.session_id(); });
  return grpc::Status::OK;
}

absl::StatusOr<std::shared_ptr<internal::ArenaMapping>> FakeDaemon::MapArena(
    const std::string& session_id, uint64_t bytes) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter("MapArena", CallOptions{}, &session_id); !s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  absl::StatusOr<std::shared_ptr<internal::ArenaMapping>> m = internal::ArenaMapping::MapFd(
      dup(arena_fd_), absl::StrCat("/fake-arena-", instance_), bytes, false, false);
  if (m.ok()) arena_maps_ += 1;
  return m;
}

grpc::Status FakeDaemon::ReserveExtents(const CallOptions& o, const v1::ReserveExtentsRequest& req,
                                        v1::ReserveExtentsResponse* resp) {
  ReserveHook hook;
  int call = 0;
  {
    absl::MutexLock l(&mu_);
    hook = reserve_hook_;
    call = reserve_calls_++;
  }
  if (hook) hook(call);  // unlocked, as OnSave's
  absl::MutexLock l(&mu_);
  reserves_.push_back(req);
  if (grpc::Status s = Enter("ReserveExtents", o, &req.session_id()); !s.ok()) return s;
  const uint64_t per_call = limits_.max_extents_per_reserve();
  if (per_call != 0 && static_cast<uint64_t>(req.sizes_bytes_size()) > per_call) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat(req.sizes_bytes_size(), " extents in one ReserveExtents, at most ", per_call));
  }
  const uint64_t align = limits_.extent_alignment_bytes();
  std::vector<uint64_t> taken;
  for (uint64_t size : req.sizes_bytes()) {
    const uint64_t length = std::max<uint64_t>(align, (size + align - 1) / align * align);
    std::vector<std::pair<uint64_t, uint64_t>> used;  // offset, length
    for (const auto& [id, e] : extents_) used.emplace_back(e.offset, e.length);
    std::sort(used.begin(), used.end());
    uint64_t at = 0;
    for (const auto& [offset, len] : used) {
      if (offset >= at + length) break;
      at = std::max(at, offset + len);
    }
    if (at + length > arena_bytes_) {
      for (uint64_t id : taken) extents_.erase(id);  // all or none
      resp->Clear();
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("staging arena full: ", length, " bytes asked"));
    }
    const uint64_t id = next_extent_++;
    extents_[id] = Extent{at, length, req.session_id()};
    taken.push_back(id);
    v1::Extent* e = resp->add_extents();
    e->set_id(id);
    e->set_offset(at);
    e->set_length(length);
  }
  extents_held_max_ = std::max(extents_held_max_, extents_.size());
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::ReleaseExtents(const CallOptions& o, const v1::ReleaseExtentsRequest& req,
                                        v1::ReleaseExtentsResponse* /*resp*/) {
  absl::MutexLock l(&mu_);
  releases_.push_back(req);
  if (grpc::Status s = Enter("ReleaseExtents", o, &req.session_id()); !s.ok()) return s;
  grpc::Status result = grpc::Status::OK;
  for (uint64_t id : req.extent_ids()) {
    auto it = extents_.find(id);
    if (it == extents_.end() || it->second.session != req.session_id()) {
      result = grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("no extent ", id, " in session ", req.session_id()));
      continue;
    }
    extents_.erase(it);
  }
  return result;
}

grpc::Status FakeDaemon::RegisterRegion(const CallOptions& o, const v1::RegisterRegionRequest& req,
                                        v1::RegisterRegionResponse* resp) {
  absl::MutexLock l(&mu_);
  registrations_.push_back(req);
  if (grpc::Status s = Enter("RegisterRegion", o, &req.session_id()); !s.ok()) return s;
  const uint64_t id = next_region_++;
  regions_[id] = req.session_id();
  resp->set_region_id(id);
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::UnregisterRegion(const CallOptions& o,
                                          const v1::UnregisterRegionRequest& req,
                                          v1::UnregisterRegionResponse* /*resp*/) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter("UnregisterRegion", o, &req.session_id()); !s.ok()) return s;
  if (regions_.erase(req.region_id()) == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, absl::StrCat("no region ", req.region_id()));
  }
  return grpc::Status::OK;
}

absl::StatusOr<uint8_t*> FakeDaemon::ExtentBytes(const std::string& session,
                                                 const v1::MemRef& ref) {
  auto it = extents_.find(ref.extent_id());
  if (it == extents_.end() || it->second.session != session) {
    return absl::NotFoundError(
        absl::StrCat("no extent ", ref.extent_id(), " in session ", session));
  }
  if (ref.offset() > it->second.length || ref.length() > it->second.length - ref.offset()) {
    return absl::InvalidArgumentError(absl::StrCat("bytes [", ref.offset(), ", +", ref.length(),
                                                   ") outside extent ", ref.extent_id()));
  }
  return arena_->At(it->second.offset + ref.offset(), ref.length());
}

grpc::Status FakeDaemon::Save(const CallOptions& o, const v1::SaveRequest& req,
                              v1::SaveResponse* resp) {
  SaveHook hook;
  int call = 0;
  {
    absl::MutexLock l(&mu_);
    hook = save_hook_;
    call = save_calls_++;
  }
  if (hook) hook(call, req);  // unlocked: it may block, and the test may call in meanwhile
  absl::MutexLock l(&mu_);
  saves_.push_back(req);
  if (grpc::Status s = Enter("Save", o, &req.session_id()); !s.ok()) return s;
  std::map<std::string, Item> items;
  std::set<uint64_t> consumed;
  uint64_t staged = 0;
  for (const v1::ShardSpec& shard : req.shards()) {
    Item item;
    item.tensor = shard.has_tensor();
    if (item.tensor) {
      item.dtype = shard.tensor().dtype();
      item.shape.assign(shard.tensor().global_shape().begin(), shard.tensor().global_shape().end());
      absl::StatusOr<DType> dtype = internal::FromProto(item.dtype);
      item.element_bytes = dtype.ok() ? DTypeSize(*dtype) : 1;
    }
    const v1::MemRef& ref = shard.data();
    if (ref.has_region_id()) {
      if (regions_.count(ref.region_id()) == 0) {
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            absl::StrCat("item ", shard.item(), ": no region ", ref.region_id()));
      }
      item.bytes.assign(ref.length(), '\0');  // the fake cannot read the caller's shm
    } else if (ref.length() > 0) {
      absl::StatusOr<uint8_t*> p = ExtentBytes(req.session_id(), ref);
      if (!p.ok()) {
        return grpc::Status(static_cast<grpc::StatusCode>(p.status().code()),
                            absl::StrCat("item ", shard.item(), ": ", p.status().message()));
      }
      item.bytes.assign(reinterpret_cast<const char*>(*p), ref.length());
      consumed.insert(ref.extent_id());
    }
    staged += ref.length();
    items[shard.item()] = std::move(item);
  }
  for (uint64_t id : consumed) extents_.erase(id);  // flushed at once: the daemon's now
  for (auto& [name, item] : items) store_[{req.job(), req.step()}][name] = std::move(item);
  resp->set_bytes_staged(staged);
  resp->set_state(v1::STAGING);
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::LoadItem(const std::string& session, const Key& key,
                                  const v1::LoadItemRequest& r, v1::LoadedItem* out) {
  auto c = store_.find(key);
  auto it = c->second.find(r.item());
  if (it == c->second.end()) {
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("no item ", r.item(), " in checkpoint ", key.first, "/", key.second));
  }
  const Item& item = it->second;
  uint64_t begin = 0;
  uint64_t length = item.bytes.size();
  if (r.region().has_box()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "the fake daemon loads no boxes");
  }
  if (r.region().has_flat()) {
    begin = r.region().flat().start() * item.element_bytes;
    length = r.region().flat().count() * item.element_bytes;
    if (begin > item.bytes.size() || length > item.bytes.size() - begin) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("item ", r.item(), ": flat range out of bounds"));
    }
  }
  out->set_item(r.item());
  if (r.dest().length() == 0) return grpc::Status::OK;
  if (!r.dest().has_extent_id()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "the fake daemon loads into extents only");
  }
  if (length > r.dest().length()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("item ", r.item(), ": ", length, " bytes, room for ", r.dest().length()));
  }
  absl::StatusOr<uint8_t*> p = ExtentBytes(session, r.dest());
  if (!p.ok()) {
    return grpc::Status(static_cast<grpc::StatusCode>(p.status().code()),
                        std::string(p.status().message()));
  }
  std::memcpy(*p, item.bytes.data() + begin, length);
  out->set_bytes(length);
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::Load(const CallOptions& o, const v1::LoadRequest& req,
                              v1::LoadResponse* resp) {
  absl::MutexLock l(&mu_);
  loads_.push_back(req);
  if (grpc::Status s = Enter("Load", o, &req.session_id()); !s.ok()) return s;
  Key key{req.job(), req.step()};
  if (req.latest()) {
    auto newest = store_.lower_bound({req.job() + '\0', 0});
    if (newest == store_.begin() || std::prev(newest)->first.first != req.job()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("job ", req.job(), " has no checkpoint"));
    }
    key = std::prev(newest)->first;
  }
  if (store_.count(key) == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no checkpoint ", key.first, "/", key.second));
  }
  uint64_t bytes = 0;
  for (const v1::LoadItemRequest& r : req.items()) {
    v1::LoadedItem* out = resp->add_items();
    if (grpc::Status s = LoadItem(req.session_id(), key, r, out); !s.ok()) return s;
    bytes += out->bytes();
  }
  resp->set_step(key.second);
  resp->set_bytes_read(bytes);
  resp->set_bytes_needed(bytes);
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::StatusCall(const std::string& method, const CallOptions& o,
                                    const std::string& job, uint64_t step,
                                    v1::CheckpointStatus* resp) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter(method, o, nullptr); !s.ok()) return s;
  auto it = statuses_.find({job, step});
  if (it == statuses_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no checkpoint ", job, "/", step));
  }
  *resp = it->second;
  return grpc::Status::OK;
}

namespace {

// The page of `all` a token names ("" or an index), and the next token.
template <typename T>
std::pair<std::vector<T>, std::string> Page(const std::vector<T>& all, const std::string& token,
                                            size_t page_size) {
  const size_t begin = token.empty() ? 0 : std::stoul(token);
  const size_t end = std::min(all.size(), begin + page_size);
  std::vector<T> page(all.begin() + static_cast<ptrdiff_t>(std::min(begin, end)),
                      all.begin() + static_cast<ptrdiff_t>(end));
  return {page, end < all.size() ? std::to_string(end) : ""};
}

}  // namespace

grpc::Status FakeDaemon::ListJobs(const CallOptions& o, const v1::ListJobsRequest& req,
                                  v1::ListJobsResponse* resp) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter("ListJobs", o, nullptr); !s.ok()) return s;
  std::vector<std::string> jobs;
  for (const auto& [key, items] : store_) {
    if (jobs.empty() || jobs.back() != key.first) jobs.push_back(key.first);
  }
  auto [page, next] = Page(jobs, req.page_token(), page_size_);
  for (const std::string& j : page) resp->add_jobs()->set_job(j);
  resp->set_next_page_token(next);
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::ListCheckpoints(const CallOptions& o,
                                         const v1::ListCheckpointsRequest& req,
                                         v1::ListCheckpointsResponse* resp) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter("ListCheckpoints", o, nullptr); !s.ok()) return s;
  std::vector<uint64_t> steps;
  for (const auto& [key, items] : store_) {
    if (key.first == req.job()) steps.push_back(key.second);
  }
  auto [page, next] = Page(steps, req.page_token(), page_size_);
  for (uint64_t step : page) {
    v1::CheckpointSummary* c = resp->add_checkpoints();
    c->set_job(req.job());
    c->set_step(step);
    c->set_state(v1::COMMITTED);
  }
  resp->set_next_page_token(next);
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::Inspect(const CallOptions& o, const v1::InspectRequest& req,
                                 v1::InspectResponse* resp) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter("Inspect", o, nullptr); !s.ok()) return s;
  auto c = store_.find({req.job(), req.step()});
  if (c == store_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no checkpoint ", req.job(), "/", req.step()));
  }
  std::vector<v1::ItemInfo> infos;
  for (const auto& [name, item] : c->second) {
    if (req.items_size() > 0 &&
        std::find(req.items().begin(), req.items().end(), name) == req.items().end()) {
      continue;
    }
    v1::ItemInfo info;
    info.set_name(name);
    info.set_kind(item.tensor ? v1::TENSOR : v1::OBJECT);
    if (item.tensor) {
      info.set_dtype(item.dtype);
      info.mutable_shape()->Add(item.shape.begin(), item.shape.end());
    } else {
      info.set_scope(v1::REPLICATED);
    }
    info.set_bytes(item.bytes.size());
    infos.push_back(std::move(info));
  }
  auto [page, next] = Page(infos, req.page_token(), page_size_);
  for (v1::ItemInfo& i : page) *resp->add_items() = std::move(i);
  resp->set_next_page_token(next);
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::Delete(const CallOptions& o, const v1::DeleteRequest& req,
                                v1::DeleteResponse* /*resp*/) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter("Delete", o, nullptr); !s.ok()) return s;
  if (store_.erase({req.job(), req.step()}) == 0) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no checkpoint ", req.job(), "/", req.step()));
  }
  return grpc::Status::OK;
}

grpc::Status FakeDaemon::Latest(const CallOptions& o, const v1::LatestRequest& req,
                                v1::LatestResponse* resp) {
  absl::MutexLock l(&mu_);
  if (grpc::Status s = Enter("Latest", o, nullptr); !s.ok()) return s;
  auto newest = store_.lower_bound({req.job() + '\0', 0});
  if (newest == store_.begin() || std::prev(newest)->first.first != req.job()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("job ", req.job(), " has no committed checkpoint"));
  }
  resp->set_step(std::prev(newest)->first.second);
  return grpc::Status::OK;
}

}  // namespace ckptd::testing
