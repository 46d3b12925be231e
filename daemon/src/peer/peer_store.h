// The peer store: the blobs other nodes' daemons copied to this one (the receiving half of the
// peer tier, docs/PEERS.md), held in memory within a budget of their own (option peer_bytes_max,
// apart from the staging arena; 0 = this node holds no copies). Spilling copies to disk is not
// built.
//
// A copy is keyed by (origin node, job, step, blob); the origin is the authenticated sender
// (peer/peer_server.h), so a node can only place and drop its own copies. Each checksummed span
// of a blob (a shard, as the manifest records it) is verified block by block as its bytes arrive:
// a copy is stored only whole and verified.
//
// Who owns what, and what ends its life:
//  - Stream (an admission ticket): owned by the RPC handler serving one PutBlob or GetBlob; it
//    holds one of the node's stream slots and one count on the caller's connection until the
//    handler returns. Refused with RESOURCE_EXHAUSTED naming the limit and the node beyond
//    streams_per_node_max streams or connections_per_node_max connections with a call in flight.
//  - Put (one blob arriving): owned by its PutBlob handler; it holds a reservation of the blob's
//    bytes in the budget and in the node's bytes in flight (inflight_bytes_per_node_max) and the
//    key (a second put of the same key meanwhile is ABORTED). Finish() publishes the copy; a Put
//    destroyed unfinished - the sender died or hung up mid-stream, sent a bad block, sent more or
//    fewer bytes than its header said - frees the partial copy and its reservations, and nothing
//    of it is ever visible.
//  - A stored copy: owned by the store's index; a GetBlob holds a shared_ptr while it streams.
//    Its life ends by DropBlobs (the origin drops a step), by budget eviction, or when the daemon
//    stops (the tier is memory only). A copy dropped or evicted while a GetBlob streams it is
//    freed when that stream ends: until then its bytes are outside the budget (bounded by the
//    streams in flight).
//
// Eviction, only to make room for a put that does not fit: the store cannot know which step
// committed (the commit is decided on the shared tier), so it never evicts any copy of the
// kPeerProtectedStepsPerJob newest steps it holds (or is receiving) of each job: the newest may
// still be arriving, and the one before it is then the newest that can have committed - so the
// last copy of the newest committed checkpoint held here is never evicted. Other copies go
// oldest stored first; a put that does not fit even then is RESOURCE_EXHAUSTED naming
// peer_bytes_max, the bytes asked and those held, and evicts nothing.
//
// Races: two puts of the same key - the second, while the first is in flight, is ABORTED (retry:
// it then deduplicates); once stored, a put with the same header is deduplicated (OK, nothing
// received) and one with another header is ALREADY_EXISTS (a blob is immutable). A DropBlobs of
// a step while puts of it are in flight marks them: their Finish() is ABORTED and stores nothing.
// A sender lying about sizes gets INVALID_ARGUMENT (more bytes than total_bytes, or fewer at the
// end); about checksums, DATA_LOSS naming job, step, blob, span, block and byte range.
//
// Thread safety: every Store method may be called from any thread; a Put or Stream is used by one
// thread at a time (its handler's). The store outlives its Streams and Puts (CHECKed).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ckptd {
class Metrics;
}

namespace ckptd::peer {

struct BlobKey {
  std::string origin_node;
  std::string job;
  uint64_t step = 0;
  std::string blob;
  bool operator==(const BlobKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const BlobKey& k) {
    return H::combine(std::move(h), k.origin_node, k.job, k.step, k.blob);
  }
  std::string ToString() const;  // "job J step S blob B from node N"
};

// A checksummed range of a blob: BlockCount(length, block_bytes) unmasked crc32c values.
struct Span {
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<uint32_t> crcs;
  bool operator==(const Span&) const = default;
};

struct BlobHeader {
  BlobKey key;
  uint64_t total_bytes = 0;
  uint32_t block_bytes = 0;
  std::vector<Span> spans;
  bool operator==(const BlobHeader&) const = default;
};

// OK iff the names are valid (job as a job name, blob at most kPeerBlobNameBytesMax printable
// characters, node ids as option node_id), the block size is valid, and the spans are sorted,
// disjoint, inside the blob, carry one crc per block and stay within the limits.
// INVALID_ARGUMENT naming the key and the rule otherwise.
absl::Status ValidateHeader(const BlobHeader& h);
// Letters, digits, '.', '-', '_', 1 to 64 (as option node_id).
absl::Status ValidateNodeId(std::string_view node_id);

// A stored, verified copy. Immutable.
struct StoredBlob {
  BlobHeader header;
  std::unique_ptr<char[]> data;
  uint64_t seq = 0;  // the store's insertion order (eviction: oldest first)
  std::span<const char> bytes() const { return {data.get(), header.total_bytes}; }
};

class Store {
 public:
  struct Limits {
    uint64_t bytes_max = 0;  // peer_bytes_max; 0: the tier is off (puts FAILED_PRECONDITION)
    uint64_t streams_per_node_max = 8;
    uint64_t inflight_bytes_per_node_max = 0;
    uint64_t connections_per_node_max = 0;
  };
  struct Usage {
    uint64_t bytes_max = 0;
    uint64_t bytes_used = 0;      // bytes of stored copies in the index
    uint64_t bytes_reserved = 0;  // bytes of puts in flight
    uint64_t blobs = 0;
    uint64_t evictions = 0;  // copies evicted since start
  };
  struct DropResult {
    uint64_t blobs = 0;
    uint64_t bytes = 0;
  };

  // metrics may be null (unit tests).
  Store(Limits limits, Metrics* metrics);
  ~Store();  // CHECKs that no Stream or Put is alive
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  class Stream;
  class Put;

  // Admits one stream of `node` over `connection` (any string naming the connection, e.g. gRPC's
  // peer address). RESOURCE_EXHAUSTED naming the limit and the node.
  absl::StatusOr<std::unique_ptr<Stream>> OpenStream(const std::string& node,
                                                     const std::string& connection);

  // Starts a put on `stream` (whose node must be header.key.origin_node, a bug otherwise).
  // OK with a Put, or OK with null when the same copy is already stored (deduplicated).
  // INVALID_ARGUMENT (ValidateHeader), FAILED_PRECONDITION (the tier is off), ABORTED (the same
  // key is arriving), ALREADY_EXISTS (stored with another header), RESOURCE_EXHAUSTED (budget,
  // bytes in flight of the node, kPeerBlobsMax).
  absl::StatusOr<std::unique_ptr<Put>> BeginPut(Stream& stream, BlobHeader header);

  // The stored copy, or NOT_FOUND naming the key.
  absl::StatusOr<std::shared_ptr<const StoredBlob>> Find(const BlobKey& key) const;
  // The stored copies of (origin_node, job, step): (blob, total bytes), sorted by blob (copies
  // still arriving are not listed).
  std::vector<std::pair<std::string, uint64_t>> Held(const std::string& origin_node,
                                                     const std::string& job, uint64_t step) const;
  // Drops every copy of (origin_node, job, step); puts of it in flight store nothing.
  DropResult Drop(const std::string& origin_node, const std::string& job, uint64_t step);
  Usage usage() const;
  const Limits& limits() const { return limits_; }

 private:
  struct NodeAccount {
    uint64_t streams = 0;
    uint64_t inflight_bytes = 0;
    absl::flat_hash_map<std::string, uint64_t> connections;  // connection -> streams
  };
  struct Arriving {
    uint64_t bytes = 0;
    bool dropped = false;
  };

  void CloseStream(const std::string& node, const std::string& connection);
  // Publishes (or, when dropped meanwhile, discards) a finished put.
  absl::Status EndPut(const BlobHeader& header, std::unique_ptr<char[]>* data, bool store);
  // Evicts unprotected copies, oldest first, until `bytes` more fit; false (nothing evicted)
  // when they cannot. Evicted copies are moved to *evicted (freed by the caller, unlocked).
  bool MakeRoomLocked(uint64_t bytes, std::vector<std::shared_ptr<const StoredBlob>>* evicted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Limits limits_;
  Metrics* const metrics_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<BlobKey, std::shared_ptr<const StoredBlob>> blobs_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<BlobKey, Arriving> arriving_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, NodeAccount> nodes_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t bytes_reserved_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t live_streams_ ABSL_GUARDED_BY(mu_) = 0;
};

class Store::Stream {
 public:
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  const std::string& node() const { return node_; }

 private:
  friend class Store;
  Stream(Store* store, std::string node, std::string connection)
      : store_(store), node_(std::move(node)), connection_(std::move(connection)) {}
  Store* store_;
  std::string node_;
  std::string connection_;
};

class Store::Put {
 public:
  ~Put();  // unfinished: the partial copy and its reservations are dropped
  Put(const Put&) = delete;
  Put& operator=(const Put&) = delete;

  // The next bytes of the blob, in order. Verifies every block they complete. INVALID_ARGUMENT
  // past total_bytes; DATA_LOSS on a block whose crc32c differs. After an error the put is dead
  // (every later call repeats it).
  absl::Status Append(std::span<const char> bytes);
  // Publishes the copy. INVALID_ARGUMENT when fewer than total_bytes arrived; ABORTED when the
  // step was dropped meanwhile.
  absl::Status Finish();
  uint64_t received() const { return received_; }
  const BlobHeader& header() const { return header_; }

 private:
  friend class Store;
  Put(Store* store, BlobHeader header);
  absl::Status VerifyCompleteBlocks();

  Store* store_;
  BlobHeader header_;
  std::unique_ptr<char[]> data_;
  uint64_t received_ = 0;
  size_t span_ = 0;  // the span whose block `block_` is the next to verify
  uint64_t block_ = 0;
  absl::Status failed_;  // sticky
  bool ended_ = false;   // Finish() published or discarded it
};

}  // namespace ckptd::peer
