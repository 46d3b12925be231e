// Every limit of ckptd in one place (docs/STYLE.md). A breach is RESOURCE_EXHAUSTED or
// INVALID_ARGUMENT naming the limit, never a crash. Units are last in each name.
#pragma once

#include <cstdint>

#include "ckptd/io.h"

namespace ckptd::limits {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;
inline constexpr uint64_t kGiB = 1024 * kMiB;

// Staging extents and blob offsets are aligned to this for O_DIRECT (the Io seam's alignment).
inline constexpr uint64_t kAlignmentBytes = 4 * kKiB;
static_assert(kAlignmentBytes == kIoAlignmentBytes);
// The arena's first page holds its header (magic, generation); extents come after it.
inline constexpr uint64_t kArenaHeaderBytes = 4 * kKiB;
// Staging arena segments, one per uid that ever reserved staging memory since the daemon started.
inline constexpr uint64_t kArenaSegmentsMax = 64;
// Damaged (truncated) segments one uid may have replaced before a restart (StagingArena::
// Segment): each retired one stays mapped (address space, one descriptor) until the daemon exits.
inline constexpr uint32_t kArenaSegmentRetiresMax = 4;
inline constexpr uint64_t kStagingBytesMin = 16 * kMiB;
inline constexpr uint64_t kStagingBytesMax = 1024 * kGiB;

inline constexpr uint64_t kJobNameBytesMax = 128;
// The owner map (common/owner_map.h): a user name's length (POSIX tools allow 32), and the
// entries of owner_map_file.
inline constexpr uint64_t kOwnerNameBytesMax = 32;
inline constexpr uint64_t kOwnerMapEntriesMax = 65536;
inline constexpr uint64_t kItemNameBytesMax = 1024;
inline constexpr uint32_t kWorldSizeMax = 65536;
inline constexpr uint64_t kStepMax = (uint64_t{1} << 62);
inline constexpr uint32_t kTensorDimsMax = 16;
inline constexpr uint64_t kShardsPerSaveMax = 262144;
inline constexpr uint64_t kExtentsPerReserveMax = 65536;
inline constexpr uint64_t kExtentsPerSessionMax = 1 << 20;
inline constexpr uint64_t kRegionsPerSessionMax = 64;
// CUDA IPC regions (one per allocation of the caching allocator a client saves from or loads
// into) are counted apart from shm regions: a model's tensors span many allocations.
inline constexpr uint64_t kCudaRegionsPerSessionMax = 4096;
// Streams kept per GPU for the daemon's copy batches (more are created while more batches run at
// once, and destroyed after).
inline constexpr uint64_t kGpuStreamsPerDeviceMax = 8;
inline constexpr uint64_t kSessionsMax = 4096;
inline constexpr uint64_t kSessionsPerUidMax = 1024;
// A session must open its Attach stream within this long after Hello, or it ends.
inline constexpr uint64_t kSessionAttachTimeoutMs = 10000;
inline constexpr uint64_t kLoadRequestsMax = 262144;
// Hot leases one session may hold at once (service/hot_leases.h): a client keeps two loads in
// flight, each holding one until its bytes are copied out.
inline constexpr uint64_t kHotLeasesPerSessionMax = 8;
// Copies one Load may answer as hot spans (LoadResponse.hot_spans); a load with more (a finely
// sliced region) is copied by the daemon as before, so the answer stays well under
// kRpcMessageBytesMax.
inline constexpr uint64_t kHotSpanCopiesMax = 262144;
inline constexpr uint64_t kObjectBytesMax = 256 * kMiB;
inline constexpr uint64_t kItemsPerCheckpointMax = uint64_t{16} * 1024 * 1024;
// A tensor's element count, so byte sizes never overflow uint64.
inline constexpr uint64_t kTensorElementsMax = uint64_t{1} << 56;

// gRPC: largest message either way (Save of kShardsPerSaveMax shards fits).
inline constexpr int kRpcMessageBytesMax = 64 * 1024 * 1024;
inline constexpr uint32_t kListPageSizeDefault = 100;
inline constexpr uint32_t kListPageSizeMax = 1000;
inline constexpr uint32_t kInspectPageSizeDefault = 1000;
inline constexpr uint32_t kInspectPageSizeMax = 10000;
inline constexpr uint32_t kWaitTimeoutMsMax = 24 * 3600 * 1000;

// Manifest records are split so no segment exceeds this.
inline constexpr uint64_t kManifestSegmentBytesTarget = 4 * kMiB;
inline constexpr uint64_t kManifestRecordBytesMax = 64 * kMiB;
inline constexpr uint64_t kManifestSegmentsMax = 1 << 20;
// Checksum block size of journal records written before it was recorded (RankRecord).
inline constexpr uint32_t kLegacyChecksumBlockBytes = 1 * 1024 * 1024;

// Checkpoints being saved (staging or persisting) at once, per job and in all; a Save that
// would open one more is RESOURCE_EXHAUSTED naming the limit (commit or abort older ones).
inline constexpr uint64_t kOpenCheckpointsPerJobMax = 16;
inline constexpr uint64_t kOpenCheckpointsMax = 256;

// --- per-uid shares (docs/SECURITY.md "Per-uid shares"; options uid_share_percent,
// uid_arena_share_percent) ---
// One uid's share of a shared count `total`: `percent` of it, at least 1, and (below 100%) at
// most total - 1, so another uid always finds one left.
inline constexpr uint64_t UidShare(uint64_t total, uint64_t percent) {
  const uint64_t share = total * percent / 100;
  if (percent >= 100) return total;
  if (share >= total) return total > 1 ? total - 1 : 1;
  return share > 0 ? share : 1;
}
static_assert(UidShare(256, 50) == 128 && UidShare(1, 50) == 1 && UidShare(2, 99) == 1);
static_assert(UidShare(64, 100) == 64 && UidShare(4096, 1) == 40);
// A Save of more shards than this validates and journals on its own pool ("save-large"), off
// the pool that serves Hello and small Saves: 100,000 items take about a second there.
inline constexpr uint64_t kLargeSaveShardsMin = 4096;
// Threads of the "save-large" pool beyond the one kept for other uids: one uid runs at most this
// many large Saves at once.
inline constexpr uint64_t kLargeSaveThreads = 2;
// Main-socket connections when connections_max is 0 and the descriptor limit cannot be read.
inline constexpr uint64_t kConnectionsDefault = 512;
// Zeroed bounce pages one flush holds for the partial last pages of its shards; a rank with more
// such shards is written in batches reusing them.
inline constexpr uint64_t kFlushBounceBytesMax = 4 * kMiB;
// Deltas (tier/delta.h): earlier blob files one rank's flush may link into its checkpoint, and
// the buffer one comparison of a referenced shard with its earlier bytes reads at a time.
inline constexpr uint32_t kDeltaLinkedBlobsPerRankMax = 8;
inline constexpr uint64_t kDeltaCompareBytes = 4 * kMiB;

// How long Abort waits for the abort to be durable (its ABORTED row written) before answering
// DEADLINE_EXCEEDED.
inline constexpr uint64_t kAbortDurableWaitMs = 30000;
// An abort whose ABORTED row could not be written is tried again this often.
inline constexpr uint64_t kAbortRetryMs = 250;

// Offline reshards running at once; more are RESOURCE_EXHAUSTED.
inline constexpr uint64_t kReshardJobsMax = 2;
// Offline reshards copy through buffers of this size.
inline constexpr uint64_t kReshardChunkBytes = 16 * kMiB;

// Decoded manifests the daemon keeps for loads (least recently used evicted).
inline constexpr uint64_t kManifestCacheMax = 8;

// I/O: one request is at most this many bytes; larger ones are split.
inline constexpr uint64_t kIoChunkBytesMax = 8 * kMiB;
inline constexpr uint32_t kIoQueueDepthMax = 1024;

// --- blobs (format/blob_layout.h) ---
// Shard checksum blocks: a power of two in this range (options.checksum_block_bytes).
inline constexpr uint32_t kChecksumBlockBytesMin = 4 * 1024;
inline constexpr uint32_t kChecksumBlockBytesMax = 16 * 1024 * 1024;
// Largest blob: a layout that would grow past it is RESOURCE_EXHAUSTED. Far above any rank's
// data, low enough that no offset + padding arithmetic can overflow uint64.
inline constexpr uint64_t kBlobBytesMax = uint64_t{1} << 60;
static_assert(kBlobBytesMax % kAlignmentBytes == 0);
static_assert(kStagingBytesMax <= kBlobBytesMax, "a flushed rank's blob always fits");
static_assert(kTensorElementsMax * 16 <= kBlobBytesMax, "any one tensor shard fits a blob");
static_assert(kChecksumBlockBytesMin % kAlignmentBytes == 0);
static_assert((kChecksumBlockBytesMin & (kChecksumBlockBytesMin - 1)) == 0);
static_assert((kChecksumBlockBytesMax & (kChecksumBlockBytesMax - 1)) == 0);
static_assert(kChecksumBlockBytesMin <= kChecksumBlockBytesMax);

// --- the chunk codec (format/codec.h: byte grouping + zstd for the remote and peer tiers) ---
// Decoded bytes of one encoded chunk: a frame that claims more is DATA_LOSS before anything is
// allocated. The largest checksum block, so a chunk can be one block of a shard.
inline constexpr uint64_t kCodecChunkBytesMax = kChecksumBlockBytesMax;
// zstd levels an operator may choose: negative levels are zstd's fast ones (the codec keeps the
// entropy coding of literals on for them, format/codec.h), 19 its slowest that keeps the window
// at or under a chunk.
inline constexpr int kCodecZstdLevelMin = -1000;
inline constexpr int kCodecZstdLevelMax = 19;
// Decoding refuses a zstd frame whose window is larger than 2^this (a chunk's size): memory a
// corrupt or hostile frame can make the decoder take stays bounded.
inline constexpr int kCodecZstdWindowLogMax = 24;
static_assert((uint64_t{1} << kCodecZstdWindowLogMax) == kCodecChunkBytesMax);
// Encoded blobs on the store (format/blob_encoding.h): a chunk is at least this many bytes (the
// checksum block when that is larger; zstd gains little on smaller planes), and a manifest
// records at most this many frames (about 4 bytes each in its header record, which holds at most
// kManifestRecordBytesMax): past it the chunks grow, and past kCodecChunkBytesMax chunks the
// blobs are stored raw.
inline constexpr uint64_t kEncodedChunkBytesMin = 4 * kMiB;
inline constexpr uint64_t kEncodedFramesPerManifestMax = uint64_t{4} << 20;
static_assert(kEncodedChunkBytesMin <= kCodecChunkBytesMax);
// A reader of encoded blobs (tier/encoded_store.h) fetches at most this many bytes of frames per
// read of the object, and caches the encodings of at most this many checkpoints' blobs.
inline constexpr uint64_t kEncodedFetchBytesMax = 64 * kMiB;
inline constexpr uint64_t kEncodedStoreDirsCachedMax = 256;
static_assert(kEncodedFramesPerManifestMax * 5 < kManifestRecordBytesMax / 2);

// --- bounded workers (common/worker_pool.h, io/reader_pool.h) ---
// Every pool has a fixed number of long-lived, named threads and a bounded queue; a full queue
// either blocks the submitter (backpressure) or answers RESOURCE_EXHAUSTED, as each use chooses.
// Pool thread names are at most this long (pthread_setname_np's limit, without the NUL).
inline constexpr uint64_t kThreadNameBytesMax = 15;
// A pool's threads: the daemon's "wait" pool runs one per RPC blocked at once (waiters_max, at
// most 4096).
inline constexpr uint64_t kWorkerPoolThreadsMax = 4096;

// The checksum pool: crc32c of shard blocks off the flush thread, in tasks of whole blocks of
// about kChecksumTaskBytes (so a 4 GiB shard is many tasks and a 4 KiB one is one).
inline constexpr uint64_t kChecksumPoolThreads = 4;
inline constexpr uint64_t kChecksumPoolQueueMax = 256;
inline constexpr uint64_t kChecksumTaskBytes = 4 * kMiB;
// One load's verify-and-copy work runs in pieces of about kCopyPieceBytes (service/run_copy.h)
// on the load's thread and up to load_copy_threads - 1 of the copy pool's; the pool has at most
// kLoadCopyThreadsMax threads.
inline constexpr uint64_t kCopyPieceBytes = 8 * kMiB;
inline constexpr uint32_t kLoadCopyThreadsMax = 64;
// load_copy_threads = 0: one per CPU the daemon may run on, at most this many.
inline constexpr uint32_t kLoadCopyThreadsAuto = 16;
static_assert(kLoadCopyThreadsAuto <= kLoadCopyThreadsMax);
// A load reads a whole-shard copy of at least this many bytes from storage straight into its
// destination (no read buffer, no copy); smaller ones go through the read buffer.
inline constexpr uint64_t kDirectReadBytesMin = 256 * kKiB;
// Below this many bytes in all, a flush checksums on its own thread (a task costs more).
inline constexpr uint64_t kChecksumParallelBytesMin = 1 * kMiB;
static_assert(kChecksumTaskBytes % kChecksumBlockBytesMin == 0);
static_assert(kChecksumTaskBytes >= kChecksumParallelBytesMin);

// The reader pool: long-lived readers (each thread keeps its io_uring ring for its life), fed
// from one queue of pieces; a read request larger than kReaderPieceBytes is split into pieces
// that several readers read at once. Each piece keeps up to kReaderPieceBytes/kIoChunkBytesMax
// transfers in flight, so the disk queue holds up to kReaderPoolThreads times that.
inline constexpr uint64_t kReaderPoolThreads = 4;
inline constexpr uint64_t kReaderPieceBytes = 4 * kIoChunkBytesMax;
inline constexpr uint64_t kReaderQueueMax = 256;
// Bytes of reads queued or in flight at once (in the callers' buffers): the queue's bound in
// memory.
inline constexpr uint64_t kReaderQueuedBytesMax = 8 * kGiB;
static_assert(kReaderQueueMax * kReaderPieceBytes <= kReaderQueuedBytesMax);
static_assert(kReaderPieceBytes % kIoChunkBytesMax == 0 &&
              kReaderPieceBytes % kAlignmentBytes == 0);
static_assert(kReaderPieceBytes / kIoChunkBytesMax <= kIoQueueDepthMax,
              "one piece's transfers fit in flight on one reader's ring");

// The reshard pool: one thread per reshard that may run at once (kReshardJobsMax); a reshard
// beyond that is refused RESOURCE_EXHAUSTED before it is queued.
inline constexpr uint64_t kReshardPoolThreads = kReshardJobsMax;
inline constexpr uint64_t kReshardQueueMax = kReshardJobsMax;

static_assert(kChecksumPoolThreads >= 1 && kReaderPoolThreads >= 1 && kReshardPoolThreads >= 1,
              "every pool has a thread");
static_assert(kChecksumPoolQueueMax >= kChecksumPoolThreads &&
                  kReaderQueueMax >= kReaderPoolThreads && kReshardQueueMax >= kReshardPoolThreads,
              "every queue can feed all of its pool's threads");
static_assert(kChecksumPoolThreads <= kWorkerPoolThreadsMax &&
              kReaderPoolThreads <= kWorkerPoolThreadsMax &&
              kReshardPoolThreads <= kWorkerPoolThreadsMax);

// Discovery of checkpoints other daemons committed to the store (service/store_discovery.h): one
// thread; scopes (jobs) queued for a scan at once; a scope scanned OK is not scanned again for
// this long (ranks asking at once join one scan; this also folds the questions that follow it
// in a burst, at the cost of "latest" missing a commit for this long).
inline constexpr uint64_t kDiscoveryQueueMax = 64;
inline constexpr uint64_t kDiscoveryMinIntervalMs = 250;
// A store that stays down: the "answering from this node's index" warning at most this often.
inline constexpr uint64_t kDiscoveryWarnIntervalMs = 10'000;

// The remote tier (tier/remote_tier.h): upload threads, the bytes each moves at a time, and the
// uploads it tracks in memory at once (beyond that a checkpoint's upload stays PENDING in the
// index and is taken up when one finishes: the tracked set is refilled from the index).
inline constexpr uint64_t kUploadThreadsMax = 16;
inline constexpr uint64_t kUploadChunkBytesMax = 256 * kMiB;
inline constexpr uint64_t kUploadsTrackedMax = 1024;
// Blobs (open local files) an upload hands a streaming store at once (Storage::CopyBlobsFrom).
inline constexpr uint64_t kUploadBatchBlobsMax = 64;
static_assert(kUploadThreadsMax <= kWorkerPoolThreadsMax);
static_assert(kUploadChunkBytesMax % kAlignmentBytes == 0);
static_assert(kUploadsTrackedMax >= kUploadThreadsMax, "every upload thread can have work");
// Jobs whose owner on the store the remote tier remembers as verified (beyond that the cache is
// emptied and each job's owner file is read again at its next write).
inline constexpr uint64_t kStoreOwnersCachedMax = 4096;
// The bytes of a job's owner file on the store (<job>/owner.ckj) a daemon reads.
inline constexpr uint64_t kStoreOwnerFileBytesMax = 4096;

// Verify (service/verify.cc): the bytes one verify reads at a time (its one buffer; a checksum
// block larger than this is read alone), and the failures one answer lists (the rest are counted).
inline constexpr uint64_t kVerifyBatchBytes = 16 * kMiB;
inline constexpr uint64_t kVerifyFailuresMax = 1000;
static_assert(kVerifyBatchBytes % kAlignmentBytes == 0);

// The peer channel (peer/; docs/PEERS.md). One PutBlob/GetBlob chunk: at most kPeerChunkBytesMax
// (what a receiver accepts), kPeerChunkBytes what ckptd sends. A header's checksums are bounded by
// kPeerBlockCrcsPerBlobMax (4 bytes each: the message limit below holds them) and its spans by
// kShardsPerSaveMax; a blob's bytes by kPeerBlobBytesMax, its name by kPeerBlobNameBytesMax.
inline constexpr uint64_t kPeerChunkBytes = 1 * kMiB;
inline constexpr uint64_t kPeerChunkBytesMax = 4 * kMiB;
inline constexpr uint64_t kPeerBlockCrcsPerBlobMax = uint64_t{1} << 22;
inline constexpr uint64_t kPeerMessageBytesMax = 32 * kMiB;
inline constexpr uint64_t kPeerBlobBytesMax = 256 * kGiB;
inline constexpr uint64_t kPeerBlobNameBytesMax = 256;
// The peer store: copies it holds at once; nodes it keeps accounts for (a node with no stream in
// flight holds no account); the newest steps of each job it never evicts (peer/peer_store.h).
inline constexpr uint64_t kPeerBlobsMax = uint64_t{1} << 20;
inline constexpr uint64_t kPeerNodesMax = 4096;
inline constexpr uint64_t kPeerProtectedStepsPerJob = 2;
// Per sending node: streams (PutBlob, GetBlob) in flight and the bytes of the puts in flight
// (options peer_streams_per_node_max, peer_inflight_bytes_per_node_max are capped by these), and
// connections with a call in flight. Per connection: concurrent HTTP/2 streams. The listener's
// threads (gRPC's resource quota: a call beyond them is RESOURCE_EXHAUSTED by gRPC itself).
inline constexpr uint64_t kPeerStreamsPerNodeMax = 256;
inline constexpr uint64_t kPeerInflightBytesPerNodeMax = 1024 * kGiB;
inline constexpr uint64_t kPeerConnectionsPerNodeMax = 8;
inline constexpr uint64_t kPeerStreamsPerConnectionMax = 64;
inline constexpr uint64_t kPeerServerThreadsMax = 128;
// Replication (service/replication.cc): copies of a node's part (option peer_replicas), the
// peers registered on the shared tier a daemon reads (the rest are not placed on), and the bytes
// of one registration file. The handshake and a copy's time limits.
inline constexpr uint64_t kPeerReplicasMax = 8;
inline constexpr uint64_t kPeerRegistryNodesMax = 16384;
inline constexpr uint64_t kPeerRegistrationBytesMax = 4096;
// Registrations a node reads to order its candidates by failure domain (peer_failure_domain):
// the first this many nodes of its ring are looked at (each read again every 10 minutes), the
// rest keep their ring order. Enough to see several racks past its own; the nodes of one rack
// spread their copies over the other racks' nodes in it.
inline constexpr uint64_t kPeerDomainLookupsMax = 128;
inline constexpr uint64_t kPeerCallTimeoutMs = uint64_t{10} * 60 * 1000;
// A peer call that makes no progress (no chunk sent or received, no answer) for
// peer_stall_timeout_ms is cancelled (peer/peer_client.h), and the peer listener closes a
// connection whose keepalive ping is not answered within it: a link that stops without closing
// holds a copy, a stream slot and a reservation that long, not kPeerCallTimeoutMs. The option's
// default and bounds.
inline constexpr uint64_t kPeerStallTimeoutMs = 30'000;
inline constexpr uint64_t kPeerStallTimeoutMsMin = 100;
// Repair (peer/replicator.h): one check of what a holder holds (HeldBlobs), and the bytes of a
// node's record of its part's holders on the shared tier.
inline constexpr uint64_t kPeerCheckTimeoutMs = 5000;
inline constexpr uint64_t kNodeCopiesBytesMax = 4096;
static_assert(kPeerChunkBytes <= kPeerChunkBytesMax);
static_assert(kPeerStallTimeoutMsMin <= kPeerStallTimeoutMs &&
              kPeerStallTimeoutMs <= kPeerCallTimeoutMs);
static_assert(kPeerChunkBytesMax + 64 * kKiB <= kPeerMessageBytesMax);
static_assert(kPeerBlockCrcsPerBlobMax * 4 + 4 * kMiB <= kPeerMessageBytesMax);

}  // namespace ckptd::limits
