// Client: the load paths. Load() has the daemon write into arena extents and copies each byte once
// into the caller's buffer; LoadInPlace() copies nothing; LoadObject()/LoadAll() are built on Load.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "ckptd/client.h"
#include "client_core.h"
#include "convert.h"
#include "shard_check.h"

namespace ckptd {

using internal::MappedExtent;
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

LoadResult MakeResult(const v1::LoadResponse& resp, std::vector<uint64_t> item_bytes) {
  LoadResult r;
  r.step = resp.step();
  r.bytes_read = resp.bytes_read();
  r.item_bytes = std::move(item_bytes);
  r.bytes_needed = resp.bytes_needed();
  r.bytes_needed_aligned = resp.bytes_needed_aligned();
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

absl::StatusOr<LoadResult> Client::Load(const std::string& job, std::optional<uint64_t> step,
                                        uint32_t rank, std::span<const LoadTarget> targets) {
  std::vector<uint64_t> sizes;
  for (const LoadTarget& t : targets) {
    if (t.item.empty()) return absl::InvalidArgumentError("load target with an empty item name");
    if (t.bytes > 0 && t.dest == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("load target ", t.item, ": dest is null for ", t.bytes, " bytes"));
    }
    if (t.bytes > 0) sizes.push_back(t.bytes);
  }
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  absl::StatusOr<std::vector<MappedExtent>> extents = core_->Reserve(*session, sizes);
  if (!extents.ok()) return extents.status();
  std::vector<uint64_t> ids;
  for (const MappedExtent& e : *extents) ids.push_back(e.id);

  v1::LoadRequest req;
  FillLoadHeader(*session, job, step, rank, &req);
  std::vector<const MappedExtent*> extent_of;  // per target; null for empty ones
  size_t next = 0;
  for (const LoadTarget& t : targets) {
    v1::LoadItemRequest* item = AddItem(t.item, t.region, t.object_rank, &req);
    if (t.bytes == 0) {
      extent_of.push_back(nullptr);
      continue;
    }
    const MappedExtent& e = (*extents)[next++];
    item->mutable_dest()->set_extent_id(e.id);
    item->mutable_dest()->set_length(t.bytes);
    extent_of.push_back(&e);
  }
  v1::LoadResponse resp;
  absl::Status s = core_->Call("Load", core_->rpc_timeout_ms(), [&](grpc::ClientContext* c) {
    return core_->stub().Load(c, req, &resp);
  });
  absl::StatusOr<std::vector<uint64_t>> written =
      s.ok() ? ItemBytes(req, resp) : absl::StatusOr<std::vector<uint64_t>>(s);
  if (written.ok()) {
    for (size_t i = 0; i < targets.size(); ++i) {
      if (extent_of[i] != nullptr) {
        internal::CountedCopy(targets[i].dest, extent_of[i]->data, (*written)[i], /*is_load=*/true);
      }
    }
  }
  core_->ReleaseQuietly(*session, ids);  // scratch extents; the daemon frees them at Goodbye too
  if (!written.ok()) return written.status();
  return MakeResult(resp, *std::move(written));
}

absl::StatusOr<LoadResult> Client::LoadInPlace(const std::string& job, std::optional<uint64_t> step,
                                               uint32_t rank,
                                               std::span<const InPlaceLoadTarget> targets) {
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  v1::LoadRequest req;
  FillLoadHeader(*session, job, step, rank, &req);
  for (const InPlaceLoadTarget& t : targets) {
    if (t.item.empty()) return absl::InvalidArgumentError("load target with an empty item name");
    v1::LoadItemRequest* item = AddItem(t.item, t.region, t.object_rank, &req);
    absl::Status s = core_->ToMemRef(*session, t.dest, t.bytes, item->mutable_dest());
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("item ", t.item, ": ", s.message()));
  }
  v1::LoadResponse resp;
  CKPTD_CLIENT_RETURN_IF_ERROR(
      core_->Call("Load", core_->rpc_timeout_ms(),
                  [&](grpc::ClientContext* c) { return core_->stub().Load(c, req, &resp); }));
  absl::StatusOr<std::vector<uint64_t>> written = ItemBytes(req, resp);
  if (!written.ok()) return written.status();
  return MakeResult(resp, *std::move(written));
}

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
        core.Call("Inspect", core.rpc_timeout_ms(),
                  [&](grpc::ClientContext* c) { return core.stub().Inspect(c, req, &resp); }));
    for (const v1::ItemInfo& i : resp.items()) items.push_back(internal::FromProto(i));
    req.set_page_token(resp.next_page_token());
  } while (!req.page_token().empty());
  return items;
}

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
  absl::StatusOr<Session> session = core_->EnsureSession();
  if (!session.ok()) return session.status();
  absl::StatusOr<std::vector<ItemInfo>> items = InspectItems(*core_, job, out.step, {});
  if (!items.ok()) return items.status();

  // A quarter of the arena per batch leaves room for other ranks' saves and loads.
  const uint64_t budget = std::max<uint64_t>(session->arena->size() / 4, 1);
  uint64_t max_targets = session->limits.max_load_requests();
  if (max_targets == 0) max_targets = 262144;  // daemon's limits::kLoadRequestsMax

  std::vector<LoadTarget> batch;
  std::vector<std::string*> object_of;  // per target in batch: the object string, or null
  uint64_t batch_bytes = 0;
  auto flush = [&]() -> absl::Status {
    if (batch.empty()) return absl::OkStatus();
    absl::StatusOr<LoadResult> r = Load(job, out.step, rank, batch);
    if (!r.ok()) return r.status();
    for (size_t i = 0; i < batch.size(); ++i) {
      if (object_of[i] != nullptr) object_of[i]->resize(r->item_bytes[i]);
    }
    batch.clear();
    object_of.clear();
    batch_bytes = 0;
    return absl::OkStatus();
  };
  auto add = [&](LoadTarget t, std::string* object) -> absl::Status {
    if (!batch.empty() && (batch_bytes + t.bytes > budget || batch.size() >= max_targets)) {
      CKPTD_CLIENT_RETURN_IF_ERROR(flush());
    }
    batch_bytes += t.bytes;
    batch.push_back(std::move(t));
    object_of.push_back(object);
    return absl::OkStatus();
  };

  for (const ItemInfo& info : *items) {
    if (info.kind == ItemInfo::kObject) {
      if (!ObjectVisibleTo(info, rank)) continue;
      std::string& bytes = out.objects[info.name];
      bytes.assign(info.bytes, '\0');
      CKPTD_CLIENT_RETURN_IF_ERROR(
          add(LoadTarget{info.name, Region::Whole(), bytes.data(), bytes.size()}, &bytes));
      continue;
    }
    absl::StatusOr<uint64_t> total =
        internal::TensorBytes(info.name, info.dtype, info.shape, Region::Whole());
    if (!total.ok()) return total.status();
    LoadedTensor& tensor = out.tensors[info.name];
    tensor.dtype = info.dtype;
    tensor.shape = info.shape;
    tensor.bytes.resize(*total);
    if (*total <= budget) {
      CKPTD_CLIENT_RETURN_IF_ERROR(
          add(LoadTarget{info.name, Region::Whole(), tensor.bytes.data(), *total}, nullptr));
      continue;
    }
    // Larger than a batch: flat row-major slices, each written at its place in the tensor.
    const uint64_t elem = DTypeSize(info.dtype);
    const uint64_t elements = *total / elem;
    const uint64_t per_slice = std::max<uint64_t>(budget / elem, 1);
    for (uint64_t start = 0; start < elements; start += per_slice) {
      uint64_t count = std::min(per_slice, elements - start);
      CKPTD_CLIENT_RETURN_IF_ERROR(add(LoadTarget{info.name, Region::Flat(start, count),
                                                  tensor.bytes.data() + start * elem, count * elem},
                                       nullptr));
    }
  }
  CKPTD_CLIENT_RETURN_IF_ERROR(flush());
  return out;
}

}  // namespace ckptd
