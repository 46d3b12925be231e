#include "peer/replicator.h"

#include <algorithm>
#include <cctype>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ckptd/status.h"
#include "ckptd/v1/cluster.pb.h"
#include "ckptd/v1/peer.pb.h"
#include "common/align.h"
#include "format/manifest.h"
#include "format/names.h"
#include "peer/placement.h"
#include "spdlog/spdlog.h"

namespace ckptd::peer {
namespace {

// The block size of the checksums a copy is checked with on arrival (the manifest's own are
// checked again by every load).
constexpr uint32_t kTransferBlockBytes = 1 << 20;

// A node id as option node_id allows it: letters, digits, '.', '-', '_', at most 64.
bool IsNodeId(const std::string& s) {
  return !s.empty() && s.size() <= 64 && s[0] != '.' && std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
}

std::string RegistrationPath(const std::string& node) {
  return absl::StrCat(kPeerRegistryDir, "/", node);
}

// (job, step, blob) of a blob path "<job>/step-<20 digits>/<blob>".
struct BlobPath {
  std::string job;
  uint64_t step = 0;
  std::string blob;
};

absl::StatusOr<BlobPath> ParseBlobPath(const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(path, '/');
  if (parts.size() != 3) {
    return absl::NotFoundError(absl::StrCat("peers hold blobs of checkpoints only, not ", path));
  }
  absl::StatusOr<uint64_t> step = ParseStepDirName(parts[1]);
  if (!step.ok()) {
    return absl::NotFoundError(absl::StrCat("peers hold blobs of checkpoints only, not ", path));
  }
  return BlobPath{parts[0], *step, parts[2]};
}

}  // namespace

// `node`'s record of where its part of the checkpoint in `dir` is copied now (v1::NodeCopies),
// or none. DATA_LOSS for a record that is not one of (job, step, node).
absl::StatusOr<std::optional<v1::NodeCopies>> ReadNodeCopies(Storage* shared,
                                                             const std::string& job, uint64_t step,
                                                             const std::string& node) {
  const std::string path = NodeCopiesPath(CheckpointDir(job, step), node);
  absl::StatusOr<std::string> bytes = shared->Get(path);
  if (absl::IsNotFound(bytes.status())) return std::nullopt;
  CKPTD_RETURN_IF_ERROR(bytes.status());
  v1::NodeCopies rec;
  if (bytes->size() > limits::kNodeCopiesBytesMax || !rec.ParseFromString(*bytes) ||
      rec.node() != node || rec.job() != job || rec.step() != step) {
    return absl::DataLossError(absl::StrCat(shared->Describe(), "/", path,
                                            " is not a record of node ", node, "'s copies of ", job,
                                            "/", step));
  }
  return rec;
}

// Where the copies of one blob are: its origin node (the key of the copies) and the nodes
// holding them, in the order the manifest lists them, then the origin node itself.
struct Holders {
  std::string origin;
  std::vector<std::string> peers;
  uint64_t size_bytes = 0;
};

// Reads a blob from the first of its holders that serves each range; the loader verifies every
// block it gets.
class BlobFromPeers : public BlobReader {
 public:
  BlobFromPeers(Replicator* r, BlobPath path, Holders holders)
      : r_(r), path_(std::move(path)), holders_(std::move(holders)) {}

  absl::Status Read(std::span<const IoSlice> slices) override {
    for (const IoSlice& s : slices) {
      if (s.offset + s.len > holders_.size_bytes) {
        return absl::DataLossError(absl::StrCat("blob ", path_.blob, " of ", path_.job, "/",
                                                path_.step, " is ", holders_.size_bytes,
                                                " bytes; read of ", s.len, " at ", s.offset));
      }
      absl::Status last = absl::NotFoundError("no peer holds it");
      bool done = false;
      for (; next_ < holders_.peers.size() && !done;) {
        absl::StatusOr<std::shared_ptr<Client>> c = r_->ClientFor(holders_.peers[next_]);
        if (c.ok()) {
          last = (*c)->GetBlob(holders_.origin, path_.job, path_.step, path_.blob, s.offset,
                               std::span<char>(static_cast<char*>(s.buf), s.len));
          if (absl::IsDeadlineExceeded(last)) r_->ForgetClient(holders_.peers[next_], *c);
        } else {
          last = c.status();
        }
        if (last.ok()) {
          done = true;
        } else {
          spdlog::warn("peer tier: reading {} of {}/{} from {}: {}; trying the next holder",
                       path_.blob, path_.job, path_.step, holders_.peers[next_], last.ToString());
          ++next_;
        }
      }
      if (!done) {
        // NOT_FOUND whatever the peers said: the loader then reads the blob from the next tier.
        return absl::NotFoundError(absl::StrCat("no peer served blob ", path_.blob, " of ",
                                                path_.job, "/", path_.step, ": ", last.message()));
      }
    }
    return absl::OkStatus();
  }
  uint64_t size_bytes() const override { return holders_.size_bytes; }

 private:
  Replicator* const r_;
  const BlobPath path_;
  const Holders holders_;
  size_t next_ = 0;  // the holder in use
};

// The copies peers hold as a read-only Storage: a blob's holders come from the manifest of its
// checkpoint on the shared tier (cached per checkpoint, at most kCachedMax).
class Replicator::Reader : public Storage {
 public:
  Reader(Replicator* r, Storage* shared) : r_(r), shared_(shared) {}

  std::string Describe() const override { return "peers"; }
  absl::StatusOr<std::unique_ptr<BlobWriter>> CreateBlob(const std::string& path) override {
    return ReadOnly(path);
  }
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& path) override {
    CKPTD_ASSIGN_OR_RETURN(BlobPath p, ParseBlobPath(path));
    absl::StatusOr<Holders> h = HoldersOf(p);
    if (!h.ok()) {  // NOT_FOUND whatever it was: the loader reads the blob from the next tier
      return absl::NotFoundError(
          absl::StrCat("the holders of ", path, " are unknown: ", h.status().message()));
    }
    if (h->peers.empty()) {
      return absl::NotFoundError(absl::StrCat("no peer holds a copy of ", path));
    }
    return std::unique_ptr<BlobReader>(new BlobFromPeers(r_, std::move(p), *std::move(h)));
  }
  absl::Status PutAtomic(const std::string& path, std::string_view) override {
    return ReadOnly(path).status();
  }
  absl::Status PutIfAbsent(const std::string& path, std::string_view) override {
    return ReadOnly(path).status();
  }
  // Peers hold blobs only: manifests and control files are read from the other tiers.
  absl::StatusOr<std::string> Get(const std::string& path) override {
    return absl::NotFoundError(absl::StrCat("peers hold blobs only, not ", path));
  }
  absl::StatusOr<bool> Exists(const std::string&) override { return false; }
  absl::StatusOr<std::vector<std::string>> List(const std::string&) override {
    return std::vector<std::string>{};
  }
  absl::Status RemoveAll(const std::string& path) override { return ReadOnly(path).status(); }

 private:
  static constexpr size_t kCachedMax = 256;
  static absl::StatusOr<std::unique_ptr<BlobWriter>> ReadOnly(const std::string& path) {
    return absl::FailedPreconditionError(absl::StrCat("the peer tier is read-only here: ", path));
  }
  absl::StatusOr<Holders> HoldersOf(const BlobPath& p) {
    const std::pair<std::string, uint64_t> key{p.job, p.step};
    {
      absl::MutexLock lock(&mu_);
      auto it = cache_.find(key);
      // Read again after a while: repair may have moved a node's copies since.
      if (it != cache_.end() && absl::Now() - it->second.read < kRegistryRefresh) {
        return Find(it->second.blobs, p);
      }
    }
    const std::string dir = CheckpointDir(p.job, p.step);
    const std::string path = absl::StrCat(dir, "/", kManifestFileName);
    CKPTD_ASSIGN_OR_RETURN(std::string bytes, shared_->Get(path));
    CKPTD_ASSIGN_OR_RETURN(Manifest m, DecodeManifest(bytes, path));
    const std::map<std::string, std::vector<std::string>> moved = MovedCopies(p, dir);
    std::map<std::string, Holders> blobs;
    for (const v1::BlobInfo& b : m.header.blobs()) {
      auto r = moved.find(b.node());
      Holders& h = blobs[b.name()] =
          r != moved.end()
              ? Holders{b.node(), r->second, b.size_bytes()}
              : Holders{b.node(), {b.peers().begin(), b.peers().end()}, b.size_bytes()};
      // Then the blob's own node, which serves it from its local storage (committed at the peer
      // tier, it keeps its own blobs: peer/peer_server.h) — never this node itself.
      if (!b.node().empty() && b.node() != r_->node_id()) h.peers.push_back(b.node());
    }
    absl::MutexLock lock(&mu_);
    if (cache_.size() >= kCachedMax) cache_.clear();
    Cached& c = cache_[key] = Cached{absl::Now(), std::move(blobs)};
    return Find(c.blobs, p);
  }
  // The nodes whose part repair copied again since the manifest (their <node>.copies records on
  // the shared tier): node -> its holders now. A record that does not verify is skipped (the
  // manifest's holders are tried for that node's blobs).
  std::map<std::string, std::vector<std::string>> MovedCopies(const BlobPath& p,
                                                              const std::string& dir) {
    std::map<std::string, std::vector<std::string>> moved;
    absl::StatusOr<std::vector<std::string>> names = shared_->List(absl::StrCat(dir, "/cluster"));
    if (!names.ok()) return moved;
    for (const std::string& name : *names) {
      absl::string_view node = name;
      if (!absl::ConsumeSuffix(&node, kNodeCopiesSuffix) || !IsNodeId(std::string(node))) {
        continue;
      }
      absl::StatusOr<std::optional<v1::NodeCopies>> rec =
          ReadNodeCopies(shared_, p.job, p.step, std::string(node));
      if (!rec.ok()) {
        spdlog::warn("peer tier: {}", rec.status().ToString());
      } else if (rec->has_value()) {
        moved[std::string(node)] = {(*rec)->replica_nodes().begin(), (*rec)->replica_nodes().end()};
      }
    }
    return moved;
  }
  static absl::StatusOr<Holders> Find(const std::map<std::string, Holders>& blobs,
                                      const BlobPath& p) {
    auto it = blobs.find(p.blob);
    if (it == blobs.end()) {
      return absl::NotFoundError(
          absl::StrCat("the manifest of ", p.job, "/", p.step, " has no blob ", p.blob));
    }
    return it->second;
  }

  struct Cached {
    absl::Time read;
    std::map<std::string, Holders> blobs;
  };
  Replicator* const r_;
  Storage* const shared_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, uint64_t>, Cached> cache_ ABSL_GUARDED_BY(mu_);
};

Replicator::Replicator(ReplicatorOptions options, Storage* local, Storage* shared)
    : options_(std::move(options)),
      local_(local),
      shared_(shared),
      reader_(std::make_unique<Reader>(this, shared)) {
  if (options_.repair_interval > absl::ZeroDuration()) {
    repairer_ = std::thread([this] { RepairLoop(); });
  }
}

Replicator::~Replicator() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    wake_.SignalAll();
  }
  if (repairer_.joinable()) repairer_.join();
}

Storage* Replicator::reader() { return reader_.get(); }

absl::StatusOr<std::unique_ptr<Replicator>> Replicator::Start(ReplicatorOptions options,
                                                              Storage* local, Storage* shared) {
  v1::PeerRegistration reg;
  reg.set_node_id(options.node_id);
  reg.set_address(options.advertise_addr);
  reg.set_registered_unix_ms(static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
  reg.set_failure_domain(options.failure_domain);
  CKPTD_RETURN_IF_ERROR(
      Annotate(shared->PutAtomic(RegistrationPath(options.node_id), reg.SerializeAsString()),
               absl::StrCat("registering this daemon's peer listener on ", shared->Describe())));
  spdlog::info("peer tier: registered node {} at {} on {}", options.node_id, options.advertise_addr,
               shared->Describe());
  return std::unique_ptr<Replicator>(new Replicator(std::move(options), local, shared));
}

absl::StatusOr<std::vector<std::string>> Replicator::Registry(bool fresh) {
  {
    absl::MutexLock lock(&mu_);
    if (!fresh && absl::Now() - registry_read_ < kRegistryRefresh) return registry_;
  }
  // One listing: the ids are the file names. A registration is read only for a node this daemon
  // talks to (AddressOf), so a refresh costs each node one LIST (a page per 1,000 ids), not a
  // GET per node — N^2 requests to the store over the cluster (bench/placement_sim_bench.cc).
  CKPTD_ASSIGN_OR_RETURN(std::vector<std::string> listed,
                         Annotate(shared_->List(kPeerRegistryDir),
                                  absl::StrCat("listing the peers on ", shared_->Describe())));
  std::vector<std::string> found;
  for (std::string& node : listed) {
    if (found.size() >= limits::kPeerRegistryNodesMax) break;
    if (IsNodeId(node)) found.push_back(std::move(node));  // not a temporary file of PutAtomic
  }
  std::sort(found.begin(), found.end());
  absl::MutexLock lock(&mu_);
  registry_ = found;
  registry_read_ = absl::Now();
  return found;
}

absl::StatusOr<Replicator::PeerInfo> Replicator::Lookup(const std::string& node,
                                                        absl::Duration max_age) {
  {
    absl::MutexLock lock(&mu_);
    auto it = peers_.find(node);
    if (it != peers_.end() && absl::Now() - it->second.read < max_age) {
      return it->second;
    }
  }
  const std::string path = RegistrationPath(node);
  absl::StatusOr<std::string> bytes = shared_->Get(path);
  if (absl::IsNotFound(bytes.status())) {
    return absl::UnavailableError(
        absl::StrCat("peer ", node, " is not registered on ", shared_->Describe()));
  }
  CKPTD_RETURN_IF_ERROR(
      Annotate(bytes.status(), absl::StrCat("reading ", path, " on ", shared_->Describe())));
  v1::PeerRegistration reg;
  if (bytes->size() > limits::kPeerRegistrationBytesMax || !reg.ParseFromString(*bytes) ||
      reg.node_id() != node || reg.address().empty()) {
    spdlog::warn("peer tier: {}/{} is not a peer registration; skipped", shared_->Describe(), path);
    return absl::UnavailableError(absl::StrCat("peer ", node, ": ", shared_->Describe(), "/", path,
                                               " is not a peer registration"));
  }
  PeerInfo info{
      .address = reg.address(), .failure_domain = reg.failure_domain(), .read = absl::Now()};
  absl::MutexLock lock(&mu_);
  peers_[node] = info;
  return info;
}

absl::StatusOr<std::string> Replicator::AddressOf(const std::string& node) {
  CKPTD_ASSIGN_OR_RETURN(PeerInfo info, Lookup(node));
  return info.address;
}

std::vector<std::string> Replicator::Candidates(const std::vector<std::string>& registered) {
  std::vector<std::string> order = PlacementOrder(registered, options_.node_id);
  if (options_.failure_domain.empty()) return order;
  return DomainOrder(
      order, options_.failure_domain,
      [this](const std::string& node) -> std::optional<std::string> {
        absl::StatusOr<PeerInfo> info = Lookup(node, kDomainRefresh);
        if (!info.ok()) return std::nullopt;
        return info->failure_domain;
      },
      limits::kPeerDomainLookupsMax);
}

absl::StatusOr<std::shared_ptr<Client>> Replicator::ClientFor(const std::string& node) {
  CKPTD_ASSIGN_OR_RETURN(std::string address, AddressOf(node));
  absl::MutexLock lock(&mu_);
  auto& [connected_to, client] = clients_[node];
  if (client == nullptr || connected_to != address) {
    ClientOptions o;
    o.address = address;
    o.self_node_id = options_.node_id;
    o.peer_node_id = node;
    o.tls = options_.tls;
    o.chunk_bytes = options_.chunk_bytes;
    o.call_timeout = absl::Milliseconds(limits::kPeerCallTimeoutMs);
    o.stall_timeout = options_.stall_timeout;
    CKPTD_ASSIGN_OR_RETURN(client, Client::Connect(o));
    connected_to = address;
  }
  return client;
}

void Replicator::ForgetClient(const std::string& node, const std::shared_ptr<Client>& client) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(node);
  if (it != clients_.end() && it->second.second == client) clients_.erase(it);
}

absl::Status Replicator::CopyPart(const std::string& node, const std::string& job, uint64_t step,
                                  const std::string& dir,
                                  const std::vector<std::pair<std::string, uint64_t>>& blobs,
                                  bool* local_failure) {
  *local_failure = false;
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<Client> c, ClientFor(node));
  for (const auto& [name, size] : blobs) {
    const std::string path = absl::StrCat(dir, "/", name);
    absl::StatusOr<std::unique_ptr<BlobReader>> r = local_->OpenBlob(path);
    // A rank whose shards were all replicas wrote no blob.
    if (!r.ok() && absl::IsNotFound(r.status()) && size == 0) continue;
    if (!r.ok()) {
      *local_failure = true;
      return Annotate(r.status(), absl::StrCat("reading ", path));
    }
    // Streamed from local storage a chunk at a time (peer/peer_client.h PutBlobFrom): a copy
    // holds one chunk in memory, whatever the blob's size.
    bool source_failed = false;
    absl::Status st = c->PutBlobFrom(job, step, name, **r, (*r)->size_bytes(), kTransferBlockBytes,
                                     &source_failed)
                          .status();
    if (source_failed) {
      *local_failure = true;
      return Annotate(st, absl::StrCat("reading ", path));
    }
    if (absl::IsDeadlineExceeded(st)) ForgetClient(node, c);  // its connection may be stuck
    CKPTD_RETURN_IF_ERROR(st);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Replicator::Replicate(
    const std::string& job, uint64_t step, const std::string& dir,
    const std::vector<std::pair<std::string, uint64_t>>& blobs, uint32_t replicas) {
  std::vector<std::string> took;
  if (replicas == 0) return took;
  CKPTD_ASSIGN_OR_RETURN(std::vector<std::string> ids, Registry());
  for (const std::string& node : Candidates(ids)) {
    if (took.size() >= replicas) break;
    bool local_failure = false;
    absl::Status st = CopyPart(node, job, step, dir, blobs, &local_failure);
    if (st.ok()) {
      took.push_back(node);
      continue;
    }
    if (local_failure) return st;  // a local blob that cannot be read fails every node alike
    spdlog::warn(
        "peer tier: copying this node's part of {}/{} to {} failed, trying the next "
        "node: {}",
        job, step, node, st.ToString());
  }
  if (took.size() < replicas) {
    spdlog::warn("peer tier: this node's part of {}/{} has {} of {} peer copies (degraded)", job,
                 step, took.size(), replicas);
  }
  return took;
}

void Replicator::Drop(const std::string& job, uint64_t step,
                      const std::vector<std::string>& nodes) {
  std::set<std::string> all(nodes.begin(), nodes.end());
  {
    absl::MutexLock lock(&mu_);
    // A repair of this part in flight ends first: it may still place a copy or write its record.
    const std::pair<std::string, uint64_t> key{job, step};
    auto done = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return repairing_ != key; };
    mu_.Await(absl::Condition(&done));
    auto it = watched_.find(job);
    if (it != watched_.end() && it->second.part.step == step) {
      all.insert(it->second.copies.holders.begin(), it->second.copies.holders.end());
      all.insert(it->second.part.holders.begin(), it->second.part.holders.end());
      watched_.erase(it);
    }
  }
  all.erase(options_.node_id);
  for (const std::string& node : all) {
    absl::StatusOr<std::shared_ptr<Client>> c = ClientFor(node);
    absl::Status st = c.ok() ? (*c)->DropBlobs(job, step).status() : c.status();
    if (!st.ok()) {
      spdlog::info("peer tier: dropping the copies of {}/{} on {}: {} (its budget evicts them)",
                   job, step, node, st.ToString());
    }
  }
}

}  // namespace ckptd::peer
