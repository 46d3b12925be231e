// The replicator: the peer tier's implementation of tier/peer_tier.h over the peer channel
// (docs/PEERS.md "Replication").
//
// The registry: at Start, this daemon writes <store>/.ckptd-peers/<node_id> (a
// v1::PeerRegistration naming its peer listener's address) on the shared tier; the other daemons
// find it there. The registry is listed at most every kRegistryRefresh (cached between); a
// node's registration is read only when this daemon talks to it (its address, cached as long).
// Placement: peer/placement.h over the registered node ids.
//
// Who owns what, and what ends its life:
//  - Clients (peer/peer_client.h), one per peer node, created on first use and kept (a gRPC
//    channel reconnects by itself); an address that changed in the registry replaces the client,
//    and so does a call on it that stalled (no progress for stall_timeout: its connection may be
//    stuck, docs/PEERS.md "Failures between peers"). Owned here; they end with the Replicator.
//  - A copy placed on a peer: owned by that peer's store (peer/peer_store.h), keyed by this node
//    as origin. Its life ends by Drop (this node's Delete of the checkpoint), the peer's budget
//    eviction, or the peer's stop (the tier is memory only). A peer that dies takes its copies
//    with it: the load goes to the next holder, then the store.
//  - A copy in flight (a Replicate, from the cluster thread, or a repair, from the repair thread:
//    at most these two at once) holds one chunk of one blob in memory (kPeerChunkBytes), read from
//    local storage twice - once for the block checksums of the put's header, once to send it - and
//    gRPC's window of it in flight; a peer that fails mid-blob gets nothing of it (its put is
//    dropped, peer/peer_store.h) and the next candidate is tried from that blob's first byte on.
//  - Readers (reader()'s BlobReaders) hold their peer's client; a peer that dies mid-read fails
//    that read (UNAVAILABLE) and the reader moves to the next holder of the blob.
//  - Watched parts (Watch): one per job, its newest step's; owned here. A part's life ends when a
//    newer step of its job is watched, by Drop (the checkpoint's Delete) or with the Replicator.
//  - The repair thread (docs/PEERS.md "Repair"), started when repair_interval is not zero and
//    joined by the destructor (a pass in flight ends its current call first: each check is
//    bounded by kPeerCheckTimeoutMs, each copy by kPeerCallTimeoutMs). Every interval it asks
//    each watched part's holders what they hold (HeldBlobs); a holder that does not answer, or
//    holds less than the whole part, lost it, and the part is copied to the next nodes in
//    placement order (skipping those still holding it) until `replicas` hold it. The new holders
//    are written to <dir>/cluster/<node>.copies on the shared tier (PutAtomic; the part's own
//    node is its only writer; it goes with the checkpoint's directory at Delete), which every
//    reader takes over the manifest's peers for this node's blobs. A holder that comes back
//    holding the part again is counted again: nothing is ever copied twice to one node.
//
// When the other side lies: every block a peer sends back is verified by the loader against the
// manifest's checksums (the peer store also verified it on arrival); a peer answering bad bytes
// costs a fallback to the next tier for that blob, never a wrong byte. A peer whose certificate
// does not name the node the registry says is refused by TLS (peer/peer_client.h).
//
// Threads: every method from any thread; mu_ guards the clients, the registry cache and the
// holders cache, never held across I/O.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ckptd/storage.h"
#include "ckptd/v1/cluster.pb.h"
#include "common/align.h"
#include "peer/peer_client.h"
#include "peer/peer_tls.h"
#include "tier/peer_tier.h"

namespace ckptd::peer {

struct ReplicatorOptions {
  std::string node_id;         // this daemon's (a name of its certificate)
  std::string advertise_addr;  // host:port registered for the other daemons
  std::string failure_domain;  // registered; "" none (peer_failure_domain)
  TlsFiles tls;
  uint64_t chunk_bytes = limits::kPeerChunkBytes;
  absl::Duration repair_interval = absl::ZeroDuration();  // 0: no repair thread
  // A call to a peer with no progress for this long is cancelled (peer/peer_client.h); the
  // client of that peer is then replaced, so the next call opens a new connection.
  absl::Duration stall_timeout = absl::Milliseconds(limits::kPeerStallTimeoutMs);
};

// `node`'s record of where its part of the checkpoint (job, step) is copied now, on `shared`
// (<dir>/cluster/<node>.copies), or none; DATA_LOSS for a record that is not one of (job, step,
// node). Read by the reader (every node's) and by repair (this node's, after a restart).
absl::StatusOr<std::optional<v1::NodeCopies>> ReadNodeCopies(Storage* shared,
                                                             const std::string& job, uint64_t step,
                                                             const std::string& node);

class Replicator : public PeerTier {
 public:
  // Registers this daemon on `shared` (UNAVAILABLE naming the store when it cannot be written).
  // `local` is read for the blobs to copy, `shared` for the registry and the manifests that name
  // each blob's holders. Both outlive the Replicator.
  static absl::StatusOr<std::unique_ptr<Replicator>> Start(ReplicatorOptions options,
                                                           Storage* local, Storage* shared);
  ~Replicator() override;

  absl::StatusOr<std::vector<std::string>> Replicate(
      const std::string& job, uint64_t step, const std::string& dir,
      const std::vector<std::pair<std::string, uint64_t>>& blobs, uint32_t replicas) override;
  Storage* reader() override;
  void Drop(const std::string& job, uint64_t step, const std::vector<std::string>& nodes) override;
  void Watch(Part part) override ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<Copies> CopiesOf(const std::string& job, uint64_t step) override
      ABSL_LOCKS_EXCLUDED(mu_);
  // One repair pass over every watched part, now (the repair thread's body; tests call it).
  void RepairPass() ABSL_LOCKS_EXCLUDED(mu_);

  // The registered node ids (sorted), listed again when older than kRegistryRefresh or `fresh`:
  // one LIST of the registry, no registration read.
  absl::StatusOr<std::vector<std::string>> Registry(bool fresh = false) ABSL_LOCKS_EXCLUDED(mu_);
  // What `node` registered, read from its registration when not read in the last
  // kRegistryRefresh (a node that restarted may listen elsewhere); UNAVAILABLE when it has none
  // or it is not a registration of that node.
  struct PeerInfo {
    std::string address;
    std::string failure_domain;  // "" none
    absl::Time read;             // when its registration was read
  };
  absl::StatusOr<PeerInfo> Lookup(const std::string& node,
                                  absl::Duration max_age = kRegistryRefresh)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> AddressOf(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // Where this node's copies go, in the order to try: PlacementOrder over `registered`, with this
  // node's failure domain (if it declared one) DomainOrder's reordering (the registrations of the
  // nodes it walks are read: at most limits::kPeerDomainLookupsMax, each again only after
  // kDomainRefresh: a node's domain changes only when it is moved).
  std::vector<std::string> Candidates(const std::vector<std::string>& registered)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The client of `node` (UNAVAILABLE when the registry does not name it); shared, so that one
  // replaced meanwhile (its address changed) lives until its last caller lets go.
  absl::StatusOr<std::shared_ptr<Client>> ClientFor(const std::string& node)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets `client` as `node`'s (a call on it stalled: its connection may be stuck), so the
  // next ClientFor connects again; callers still holding it keep it until they let go.
  void ForgetClient(const std::string& node, const std::shared_ptr<Client>& client)
      ABSL_LOCKS_EXCLUDED(mu_);
  const std::string& node_id() const { return options_.node_id; }

  static constexpr absl::Duration kRegistryRefresh = absl::Seconds(5);
  static constexpr absl::Duration kDomainRefresh = absl::Minutes(10);

 private:
  class Reader;
  struct Watched {
    Part part;
    Copies copies;
    bool record_read = false;  // the store's record of the holders was read (after a restart)
  };
  Replicator(ReplicatorOptions options, Storage* local, Storage* shared);
  // Copies every blob to `node`; the first error (*local_failure: reading a local blob failed,
  // which another node would not change).
  absl::Status CopyPart(const std::string& node, const std::string& job, uint64_t step,
                        const std::string& dir,
                        const std::vector<std::pair<std::string, uint64_t>>& blobs,
                        bool* local_failure);
  // Repair of one part (a snapshot of its entry): its copies as they are after the pass.
  Copies Repair(const Watched& w);
  // The holders of `part` among `holders` that hold every blob of it whole; why the others do not
  // (appended to *lost).
  std::vector<std::string> LiveHolders(const Part& part, const std::vector<std::string>& holders,
                                       std::vector<std::string>* lost);
  // Repair's phases. The holders to check: the entry's, or after a restart those the store's
  // record names.
  std::vector<std::string> RecordedHolders(const Watched& w);
  // Copies `part` to the registered nodes in placement order that do not hold it, until *live
  // has part.replicas nodes (each copied to is appended); why the others failed, in *failed.
  // Returns whether it copied to any.
  bool CopyToNextNodes(const Part& part, std::vector<std::string>* live,
                       std::vector<std::string>* failed) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes the store's record of the nodes holding `part` (<dir>/cluster/<node>.copies).
  absl::Status RecordHolders(const Part& part, const std::vector<std::string>& live);
  void RepairLoop() ABSL_LOCKS_EXCLUDED(mu_);

  const ReplicatorOptions options_;
  Storage* const local_;
  Storage* const shared_;
  std::unique_ptr<Reader> reader_;
  mutable absl::Mutex mu_;
  std::vector<std::string> registry_ ABSL_GUARDED_BY(mu_);
  absl::Time registry_read_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::map<std::string, PeerInfo> peers_ ABSL_GUARDED_BY(mu_);  // Lookup's cache
  // node -> (address, client)
  std::map<std::string, std::pair<std::string, std::shared_ptr<Client>>> clients_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, Watched> watched_ ABSL_GUARDED_BY(mu_);  // job -> its newest part
  // The part a repair pass works on now (Drop waits for it: no record is written after it).
  std::optional<std::pair<std::string, uint64_t>> repairing_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar wake_;
  std::thread repairer_;  // last: started after every member it reads is built
};

}  // namespace ckptd::peer
