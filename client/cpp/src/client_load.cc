// Client: the load path. Load() and LoadInPlace() go through BatchedLoad: one batching policy
// (BatchBytes), one Load RPC per batch, two in flight; the daemon writes into arena scratch (copied
// or scattered once into the caller's memory) or straight into daemon-visible destinations. Bytes
// hot in the RAM tier in this uid's own segment are not copied into scratch: the daemon answers
// where they lie and the library copies them once into the caller's memory, verifying as it
// copies (hot_spans.h); items whose blocks do not verify are loaded again without that (that
// part of BatchedLoad is client_load_hot.cc). LoadObject(s)/LoadAll() are built on Load.
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "batched_load.h"
#include "ckptd/client.h"
#include "client_core.h"
#include "convert.h"
#include "shard_check.h"

namespace ckptd {

using internal::BatchedLoad;
using internal::MappedExtent;
using internal::Piece;
using internal::Session;

namespace {

void FillLoadHeader(const Session& session, const std::string& job, std::optional<uint64_t> step,
                    uint32_t rank, v1::LoadRequest* req) {
  req->set_session_id(session.session_id);
  req->set_job(job);
  if (step.has_value()) {
    req->set_step(*step);
  } else {
    req->set_latest(true);
  }
  req->set_rank(rank);
}

v1::LoadItemRequest* AddItem(const std::string& item, const Region& region,
                             std::optional<uint32_t> object_rank, v1::LoadRequest* req) {
  v1::LoadItemRequest* r = req->add_items();
  r->set_item(item);
  if (region.kind != Region::kWhole) internal::ToProto(region, r->mutable_region());
  if (object_rank.has_value()) r->set_saved_by_rank(*object_rank);
  return r;
}

// Bytes written per request item, in request order. The daemon answers items in request order;
// matching by position keeps two regions of one item apart.
absl::StatusOr<std::vector<uint64_t>> ItemBytes(const v1::LoadRequest& req,
                                                const v1::LoadResponse& resp) {
  if (resp.items_size() != req.items_size()) {
    return absl::InternalError(absl::StrCat("Load answered ", resp.items_size(), " items for ",
                                            req.items_size(), " requested"));
  }
  std::vector<uint64_t> out;
  for (int i = 0; i < req.items_size(); ++i) {
    const v1::LoadedItem& got = resp.items(i);
    const v1::LoadItemRequest& asked = req.items(i);
    if (got.item() != asked.item() || got.bytes() > asked.dest().length()) {
      return absl::InternalError(absl::StrCat("Load answered item ", got.item(), " (", got.bytes(),
                                              " bytes) for ", asked.item(), " (room for ",
                                              asked.dest().length(), ")"));
    }
    out.push_back(got.bytes());
  }
  return out;
}

}  // namespace

namespace {

// Items of (job, step) named in `names` (all when empty), every page.
absl::StatusOr<std::vector<ItemInfo>> InspectItems(internal::ClientCore& core,
                                                   const std::string& job, uint64_t step,
                                                   const std::vector<std::string>& names) {
  std::vector<ItemInfo> items;
  v1::InspectRequest req;
  req.set_job(job);
  req.set_step(step);
  for (const std::string& n : names) req.add_items(n);
  do {
    v1::InspectResponse resp;
    CKPTD_CLIENT_RETURN_IF_ERROR(
        core.Call("Inspect", core.rpc_timeout_ms(), &internal::Connection::Inspect, req, &resp));
    for (const v1::ItemInfo& i : resp.items()) items.push_back(internal::FromProto(i));
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return items;
}

// The load batching policy (Client::load_batch_bytes): a batch uses at most this much arena
// scratch, and at most a quarter of the arena, so that the two batches in flight leave half of it
// to other clients' saves and loads.
constexpr uint64_t kLoadBatchBytesMax = 128ull << 20;
constexpr uint64_t kLoadArenaShareDivisor = 4;
constexpr uint64_t kExtentAlignmentDefault = 4096;  // used if Hello's limits leave it 0
constexpr uint64_t kLoadRequestsDefault = 262144;   // daemon's limits::kLoadRequestsMax

uint64_t Alignment(const Session& session) {
  uint64_t a = session.limits.extent_alignment_bytes();
  return a == 0 ? kExtentAlignmentDefault : a;
}

uint64_t BatchBytes(const Session& session) {
  const uint64_t align = Alignment(session);
  const uint64_t arena = session.arena != nullptr ? session.arena->size() : 0;
  const uint64_t bytes = std::min(kLoadBatchBytesMax, arena / kLoadArenaShareDivisor);
  return std::max(align, bytes / align * align);
}

uint64_t RoundUp(uint64_t bytes, uint64_t align) { return (bytes + align - 1) / align * align; }

}  // namespace

namespace internal {

absl::Status BatchedLoad::SliceLarge() {
  const uint64_t budget = BatchBytes(session_);
  std::vector<std::string> names;
  for (const Piece& p : pieces_) {
    if (Sliceable(p, budget)) names.push_back(*p.item);
  }
  if (names.empty()) return absl::OkStatus();
  CKPTD_CLIENT_RETURN_IF_ERROR(Resolve());
  absl::StatusOr<std::vector<ItemInfo>> infos = InspectItems(core_, job_, *step_, names);
  if (!infos.ok()) return infos.status();
  std::vector<Piece> out;
  for (Piece& p : pieces_) {
    auto info = std::find_if(infos->begin(), infos->end(),
                             [&](const ItemInfo& i) { return i.name == *p.item; });
    if (!Sliceable(p, budget) || info == infos->end() || info->kind != ItemInfo::kTensor) {
      out.push_back(std::move(p));
      continue;
    }
    const uint64_t esize = DTypeSize(info->dtype);
    const uint64_t first = p.region.kind == Region::kFlat ? p.region.flat_start : 0;
    const uint64_t elements = p.bytes / esize;
    const uint64_t per_slice = std::max<uint64_t>(budget / esize, 1);
    for (uint64_t done = 0; done < elements; done += per_slice) {
      Piece slice = p;
      const uint64_t count = std::min(per_slice, elements - done);
      slice.region = Region::Flat(first + done, count);
      slice.bytes = count * esize;
      slice.dest = p.dest + done * esize;
      out.push_back(std::move(slice));
    }
  }
  pieces_ = std::move(out);
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> BatchedLoad::Run(size_t target_count) {
  Plan();
  if (batches_.size() > 1) CKPTD_CLIENT_RETURN_IF_ERROR(Resolve());  // every batch, one step
  result_.item_bytes.assign(target_count, 0);
  absl::Status status = Start(*batches_[0]);
  for (size_t i = 0; i < batches_.size(); ++i) {
    // A batch that may be answered with hot spans: its answer before the next batch reserves
    // scratch, and the scratch of its direct items (never written) released, so the next
    // reservation never waits for hot bytes this load's own lease pins (the daemon still reads
    // batch i+1 while the library copies batch i).
    if (batches_[i]->started && AskedHot(*batches_[i])) ReleaseUnwritten(*batches_[i]);
    if (status.ok() && i + 1 < batches_.size()) status = Start(*batches_[i + 1]);
    absl::Status finished = Finish(*batches_[i]);
    if (status.ok()) status = finished;
  }
  if (status.ok() && !again_.empty()) status = LoadAgain(target_count);
  if (!status.ok()) return status;
  return std::move(result_);
}

bool BatchedLoad::Sliceable(const Piece& p, uint64_t budget) {
  return p.via_arena() && p.strided == nullptr && !p.object_rank.has_value() && p.bytes > budget &&
         p.region.kind != Region::kBox;
}

absl::Status BatchedLoad::Resolve() {
  if (step_.has_value()) return absl::OkStatus();
  v1::LatestRequest req;
  req.set_job(job_);
  v1::LatestResponse resp;
  CKPTD_CLIENT_RETURN_IF_ERROR(
      core_.Call("Latest", core_.rpc_timeout_ms(), &internal::Connection::Latest, req, &resp));
  step_ = resp.step();
  return absl::OkStatus();
}

void BatchedLoad::Plan() {
  const uint64_t budget = BatchBytes(session_);
  const uint64_t align = Alignment(session_);
  uint64_t max_items = session_.limits.max_load_requests();
  if (max_items == 0) max_items = kLoadRequestsDefault;
  batches_.push_back(std::make_unique<Batch>());
  uint64_t used = 0;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    const uint64_t cost = pieces_[i].via_arena() ? RoundUp(pieces_[i].bytes, align) : 0;
    Batch& open = *batches_.back();
    if (!open.pieces.empty() && (used + cost > budget || open.pieces.size() >= max_items)) {
      batches_.push_back(std::make_unique<Batch>());
      used = 0;
    }
    batches_.back()->pieces.push_back(i);
    used += cost;
  }
}

absl::Status BatchedLoad::Start(Batch& b) {
  std::vector<uint64_t> sizes;
  for (size_t i : b.pieces) {
    if (pieces_[i].via_arena()) sizes.push_back(pieces_[i].bytes);
  }
  absl::StatusOr<std::vector<MappedExtent>> scratch = core_.Reserve(session_, sizes);
  if (!scratch.ok()) return scratch.status();
  b.scratch = *std::move(scratch);
  FillLoadHeader(session_, job_, step_, rank_, &b.req);
  b.req.set_prefetch(options_.prefetch);
  size_t next = 0;
  for (size_t i : b.pieces) {
    const Piece& p = pieces_[i];
    v1::LoadItemRequest* item = AddItem(*p.item, p.region, p.object_rank, &b.req);
    if (p.via_arena()) {
      item->mutable_dest()->set_extent_id(b.scratch[next++].id);
      item->mutable_dest()->set_length(p.bytes);
      item->set_hot_direct(options_.hot_direct && p.direct_ok());
    } else if (p.gpu_dest.has_value()) {
      *item->mutable_dest() = *p.gpu_dest;
    } else if (p.in_daemon.has_value()) {
      absl::Status s = core_.ToMemRef(session_, *p.in_daemon, p.bytes, item->mutable_dest());
      if (!s.ok()) {
        ReleaseScratch(b);
        return absl::Status(s.code(), absl::StrCat("item ", *p.item, ": ", s.message()));
      }
    }
  }
  internal::CallOptions o;
  o.timeout_ms = core_.rpc_timeout_ms();
  b.started = true;
  b.call = core_.connection().LoadAsync(o, &b.req, &b.resp, [&b](grpc::Status s) {
    b.status = std::move(s);
    b.done.Notify();
  });
  return absl::OkStatus();
}

absl::Status BatchedLoad::Finish(Batch& b) {
  if (!b.started) return absl::OkStatus();
  b.done.WaitForNotification();
  absl::Status s = core_.Convert("Load", core_.rpc_timeout_ms(), b.status);
  if (absl::IsResourceExhausted(s) && AskedHot(b)) {
    // The session holds its most hot leases (other threads' loads, limits.h): these pieces go
    // the daemon's way instead (LoadAgain).
    again_.insert(again_.end(), b.pieces.begin(), b.pieces.end());
    ReleaseScratch(b);
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<uint64_t>> written =
      s.ok() ? ItemBytes(b.req, b.resp) : absl::StatusOr<std::vector<uint64_t>>(s);
  bool hot_ok = true;
  if (written.ok()) {
    result_.bytes_from_ram += b.resp.bytes_from_ram();
    hot_ok = CopyHot(b, *written);
    size_t next = 0;
    for (size_t k = 0; k < b.pieces.size(); ++k) {
      const Piece& p = pieces_[b.pieces[k]];
      const uint64_t got = (*written)[k];
      const bool hot = b.resp.items(static_cast<int>(k)).hot_direct();
      if (hot_ok || !hot) result_.item_bytes[p.target] += got;  // else LoadAgain counts it
      if (!p.via_arena()) continue;
      const MappedExtent& e = b.scratch[next++];
      if (hot) continue;  // CopyHot's
      if (p.device >= 0) {
        internal::CountGpuFallback(got);
        absl::Status copied = internal::GpuRegions::CopyToDevice(p.dest, e.data, got, p.device);
        if (!copied.ok() && written.ok()) {
          written =
              absl::Status(copied.code(), absl::StrCat("item ", *p.item, ": ", copied.message()));
        }
      } else if (p.strided == nullptr) {
        internal::CountedCopy(p.dest, e.data, got, /*is_load=*/true);
      } else if (got == p.bytes) {  // else the caller reports the size mismatch
        Scatter(e.data, *p.strided);
      }
    }
    result_.step = b.resp.step();
    result_.bytes_read += b.resp.bytes_read();
    result_.bytes_read_remote += b.resp.bytes_read_remote();
    result_.bytes_read_peer += b.resp.bytes_read_peer();
    result_.bytes_prefetched += b.resp.bytes_prefetched();
    result_.bytes_needed += b.resp.bytes_needed();
    result_.bytes_needed_aligned += b.resp.bytes_needed_aligned();
  }
  ReleaseScratch(b, /*hot_mismatch=*/!hot_ok);
  return written.status();
}

}  // namespace internal

namespace {

// The piece that is all of target `i` (its memory filled in by the caller).
template <typename Target>
Piece PieceOf(size_t i, const Target& t) {
  Piece p;
  p.target = i;
  p.item = &t.item;
  p.region = t.region;
  p.object_rank = t.object_rank;
  p.bytes = t.bytes;
  return p;
}

// A GPU destination: the daemon writes it over CUDA IPC, or (the fallback) the library copies the
// loaded scratch into it.
absl::Status LocateGpuDest(internal::ClientCore& core, const Session& session, const LoadTarget& t,
                           Piece* p) {
  if (t.strided.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("load target ", t.item, ": GPU memory must be contiguous (no strided view)"));
  }
  p->dest = static_cast<uint8_t*>(t.dest);
  if (t.bytes == 0) return absl::OkStatus();
  absl::StatusOr<v1::MemRef> gpu = core.gpu().Locate(core, session, t.dest, t.device, t.bytes);
  if (gpu.ok()) {
    p->gpu_dest = *std::move(gpu);
    return absl::OkStatus();
  }
  if (!core.gpu().FallBack(gpu.status())) {
    return absl::Status(gpu.status().code(), absl::StrCat("load target ", t.item, " (GPU ",
                                                          t.device, "): ", gpu.status().message()));
  }
  p->device = t.device;
  return absl::OkStatus();
}

absl::StatusOr<LoadResult> RunLoad(internal::ClientCore& core, const Session& session,
                                   const std::string& job, std::optional<uint64_t> step,
                                   uint32_t rank, std::vector<Piece> pieces, size_t targets,
                                   const LoadOptions& options) {
  BatchedLoad load(core, session, job, step, rank, std::move(pieces), options);
  CKPTD_CLIENT_RETURN_IF_ERROR(load.SliceLarge());
  return load.Run(targets);
}

}  // namespace

uint64_t Client::load_batch_bytes() const {
  absl::StatusOr<Session> session = core_->EnsureSession();
  return session.ok() && session->arena != nullptr ? BatchBytes(*session) : 0;
}

absl::StatusOr<LoadResult> Client::Load(const std::string& job, std::optional<uint64_t> step,
                                        uint32_t rank, std::span<const LoadTarget> targets,
                                        const LoadOptions& options) {
  for (const LoadTarget& t : targets) {
    if (t.item.empty()) return absl::InvalidArgumentError("load target with an empty item name");
    CKPTD_CLIENT_RETURN_IF_ERROR(internal::CheckCallerMemory(
        absl::StrCat("load target ", t.item), t.dest, t.strided ? &*t.strided : nullptr, t.bytes));
  }
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  std::vector<Piece> pieces;
  pieces.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    const LoadTarget& t = targets[i];
    Piece p = PieceOf(i, t);
    if (t.device >= 0) {
      CKPTD_CLIENT_RETURN_IF_ERROR(LocateGpuDest(*core_, *session, t, &p));
      pieces.push_back(std::move(p));
      continue;
    }
    const StridedView* strided = t.strided.has_value() ? &*t.strided : nullptr;
    void* flat = internal::ContiguousAddress(t.dest, strided);
    if (flat != nullptr) {
      p.dest = static_cast<uint8_t*>(flat);
      p.in_daemon = core_->Locate(*session, flat, t.bytes);
    } else {
      p.strided = strided;
    }
    pieces.push_back(std::move(p));
  }
  absl::StatusOr<LoadResult> result =
      RunLoad(*core_, *session, job, step, rank, std::move(pieces), targets.size(), options);
  if (std::any_of(targets.begin(), targets.end(),
                  [](const LoadTarget& t) { return t.device >= 0; })) {
    core_->gpu().EndOperation(*core_, *session);
  }
  return result;
}

absl::StatusOr<LoadResult> Client::LoadInPlace(const std::string& job, std::optional<uint64_t> step,
                                               uint32_t rank,
                                               std::span<const InPlaceLoadTarget> targets,
                                               const LoadOptions& options) {
  std::vector<Piece> pieces;
  pieces.reserve(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    const InPlaceLoadTarget& t = targets[i];
    if (t.item.empty()) return absl::InvalidArgumentError("load target with an empty item name");
    Piece p = PieceOf(i, t);
    if (t.bytes > 0) p.in_daemon = t.dest;
    pieces.push_back(std::move(p));
  }
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  return RunLoad(*core_, *session, job, step, rank, std::move(pieces), targets.size(), options);
}

namespace {

bool ObjectVisibleTo(const ItemInfo& info, uint32_t rank) {
  if (!info.per_rank || info.object_ranks.empty()) return true;
  return std::find(info.object_ranks.begin(), info.object_ranks.end(), rank) !=
         info.object_ranks.end();
}

}  // namespace

namespace {

// The ItemInfo of object `item` of job/step.
absl::StatusOr<ItemInfo> ObjectInfo(internal::ClientCore& core, const std::string& job,
                                    uint64_t step, const std::string& item) {
  CKPTD_CLIENT_RETURN_IF_ERROR(core.EnsureSession().status());
  absl::StatusOr<std::vector<ItemInfo>> items = InspectItems(core, job, step, {item});
  if (!items.ok()) return items.status();
  auto it =
      std::find_if(items->begin(), items->end(), [&](const ItemInfo& i) { return i.name == item; });
  if (it == items->end()) {
    return absl::NotFoundError(absl::StrCat("no item ", item, " in checkpoint ", job, "/", step));
  }
  if (it->kind != ItemInfo::kObject) {
    return absl::InvalidArgumentError(
        absl::StrCat("item ", item, " of checkpoint ", job, "/", step, " is a tensor"));
  }
  return *it;
}

}  // namespace

absl::StatusOr<uint64_t> Client::ResolveStep(const std::string& job, std::optional<uint64_t> step) {
  if (step.has_value()) return *step;
  return Latest(job);
}

absl::StatusOr<std::string> Client::LoadObject(const std::string& job, std::optional<uint64_t> step,
                                               uint32_t rank, const std::string& item) {
  absl::StatusOr<uint64_t> resolved = ResolveStep(job, step);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<ItemInfo> info = ObjectInfo(*core_, job, *resolved, item);
  if (!info.ok()) return info.status();
  // ItemInfo.bytes counts every rank's copy of a per-rank object: an upper bound for one.
  std::string bytes(info->bytes, '\0');
  LoadTarget target{item, Region::Whole(), bytes.data(), bytes.size(), std::nullopt};
  absl::StatusOr<LoadResult> r =
      Load(job, *resolved, rank, std::span<const LoadTarget>(&target, 1));
  if (!r.ok()) return r.status();
  bytes.resize(r->item_bytes.front());
  return bytes;
}

absl::StatusOr<std::map<uint32_t, std::string>> Client::LoadObjects(const std::string& job,
                                                                    std::optional<uint64_t> step,
                                                                    const std::string& item) {
  absl::StatusOr<uint64_t> resolved = ResolveStep(job, step);
  if (!resolved.ok()) return resolved.status();
  absl::StatusOr<ItemInfo> info = ObjectInfo(*core_, job, *resolved, item);
  if (!info.ok()) return info.status();
  std::vector<uint32_t> ranks = info->per_rank ? info->object_ranks : std::vector<uint32_t>{0};
  std::vector<std::string> bytes(ranks.size(), std::string(info->bytes, '\0'));
  std::vector<LoadTarget> targets;
  for (size_t i = 0; i < ranks.size(); ++i) {
    targets.push_back(
        LoadTarget{item, Region::Whole(), bytes[i].data(), bytes[i].size(),
                   info->per_rank ? std::optional<uint32_t>(ranks[i]) : std::nullopt});
  }
  absl::StatusOr<LoadResult> r = Load(job, *resolved, ranks.front(), targets);
  if (!r.ok()) return r.status();
  std::map<uint32_t, std::string> out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    bytes[i].resize(r->item_bytes[i]);
    out[ranks[i]] = std::move(bytes[i]);
  }
  return out;
}

absl::StatusOr<LoadedCheckpoint> Client::LoadAll(const std::string& job,
                                                 std::optional<uint64_t> step, uint32_t rank) {
  LoadedCheckpoint out;
  absl::StatusOr<uint64_t> resolved = ResolveStep(job, step);
  if (!resolved.ok()) return resolved.status();
  out.step = *resolved;
  CKPTD_CLIENT_RETURN_IF_ERROR(core_->EnsureSession().status());
  absl::StatusOr<std::vector<ItemInfo>> items = InspectItems(*core_, job, out.step, {});
  if (!items.ok()) return items.status();

  std::vector<LoadTarget> targets;
  std::vector<std::string*> object_of;  // per target: the object string, or null
  for (const ItemInfo& info : *items) {
    if (info.kind == ItemInfo::kObject) {
      if (!ObjectVisibleTo(info, rank)) continue;
      std::string& bytes = out.objects[info.name];
      bytes.assign(info.bytes, '\0');
      targets.push_back(LoadTarget{info.name, Region::Whole(), bytes.data(), bytes.size()});
      object_of.push_back(&bytes);
      continue;
    }
    absl::StatusOr<uint64_t> total =
        internal::TensorBytes(info.name, info.dtype, info.shape, Region::Whole());
    if (!total.ok()) return total.status();
    LoadedTensor& tensor = out.tensors[info.name];
    tensor.dtype = info.dtype;
    tensor.shape = info.shape;
    tensor.bytes.resize(*total);
    targets.push_back(LoadTarget{info.name, Region::Whole(), tensor.bytes.data(), *total});
    object_of.push_back(nullptr);
  }
  absl::StatusOr<LoadResult> r = Load(job, out.step, rank, targets);
  if (!r.ok()) return r.status();
  for (size_t i = 0; i < targets.size(); ++i) {
    if (object_of[i] != nullptr) object_of[i]->resize(r->item_bytes[i]);
  }
  return out;
}

}  // namespace ckptd
