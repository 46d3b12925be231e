// libckptd-client: the C++ client of ckptd, the node-local checkpoint daemon, and the only public
// C++ API of the project. Plain C++ types only: no generated protobuf/gRPC type appears here.
//
// A Client is one session with the daemon on this node (unix socket). Saving one rank's state:
//
//   auto client = ckptd::Client::Connect({});            // $CKPTD_SOCKET or the default socket
//   std::vector<ckptd::TensorShard> shards = {...};      // item, dtype, shape, region, bytes
//   auto saved = (*client)->Save("run42", step, rank, world_size, shards, objects);
//   // Returns once the daemon has staged the bytes: the tensors may be changed again. The daemon
//   // commits the checkpoint by itself once ranks 0..world_size-1 have saved.
//   (*client)->WaitCommitted("run42", step, 600000);     // optional: block until durable
//
// Copies: the one native data path. Save() copies each shard's bytes exactly once, straight into
// the daemon's shared-memory staging arena (a strided source is gathered in that same pass) — or
// not at all when they already are in daemon-visible memory: an Allocate()d arena buffer or a
// region registered with its mapping (RegisterShm(..., mapped_at)). Load() batches its targets by
// one policy (load_batch_bytes(), one Load RPC per batch, two batches in flight so the daemon
// reads one while the library copies the other out) and copies each byte once from the arena into
// the caller's buffer (scattering a strided destination in the same pass), or not at all for a
// destination in daemon-visible memory. SaveInPlace()/LoadInPlace() name daemon memory
// explicitly. copy_stats() counts the library's copies so tests can check these claims. The
// Python binding and ckptctl are layers over these calls; they copy nothing themselves.
//
// Threads. Every method of Client is thread-safe; RPCs of different threads run concurrently (the
// internal mutex is held only around session state, and while re-connecting). copy_stats() is
// process-wide and thread-safe.
//
// Errors. Every failing call returns a canonical absl::Status. Codes of the daemon's answers are
// mapped 1:1 from gRPC, with the daemon's message (which names the job, step, item and region):
//   INVALID_ARGUMENT   bad input (also detected locally before any RPC: size mismatches, unknown
//                      handles, null buffers);
//   NOT_FOUND          no such job / checkpoint / item / region;
//   FAILED_PRECONDITION checkpoint in the wrong state (e.g. loading one not COMMITTED), an
//                      ArenaBuffer from a previous daemon instance or already consumed;
//   RESOURCE_EXHAUSTED arena full after the daemon's bounded wait, or a limit breached;
//   PERMISSION_DENIED  the job belongs to another user;
//   ABORTED            WaitCommitted() on a checkpoint that was aborted;
//   DEADLINE_EXCEEDED  a per-RPC deadline (ClientOptions::rpc_timeout_ms) or a Wait timeout;
//   UNAVAILABLE        the daemon is not reachable: "ckptd at unix:<path> is unavailable: <why>".
//   INTERNAL           the daemon answered something inconsistent (e.g. an extent outside the
//                      arena) or a local syscall (shm_open, mmap) failed unexpectedly.
//
// Daemon restarts. After any UNAVAILABLE answer the next call first says Hello again. If the
// daemon is a new instance (it restarted), the client maps the new arena and re-registers every
// shm region it had registered; region handles returned by RegisterShm() stay valid. ArenaBuffers
// allocated from the old instance are invalid (saving from them is FAILED_PRECONDITION; their
// memory stays mapped while any copy of the buffer exists, so stray writes are harmless).
// Calls in flight during a restart fail (every RPC has a deadline); none hangs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/strided_copy.h"
#include "ckptd/v1/dtype_table.h"

namespace ckptd {

namespace internal {
class ClientCore;
class AsyncSaves;
struct AsyncSaveState;
class ClientFactory;  // builds a Client over a given connection (tests; not part of the API)
}  // namespace internal

// Element type of a tensor (ckptd.v1.DType): kFloat32, kFloat64, kFloat16, kBFloat16,
// kFloat8E4M3FN, kFloat8E5M2, kInt8, kUInt8, kInt16, kInt32, kInt64, kBool, kUInt16, kUInt32,
// kUInt64 — one enumerator per row of ckptd/v1/dtype_table.h (the one dtype table), in its order.
enum class DType {
#define CKPTD_CLIENT_DTYPE(proto, client, name, size, safetensors, numpy_native) client,
  CKPTD_DTYPES(CKPTD_CLIENT_DTYPE)
#undef CKPTD_CLIENT_DTYPE
};
// Every DType, in order (kDTypes[i] has the value i).
inline constexpr DType kDTypes[] = {
#define CKPTD_CLIENT_DTYPE_ALL(proto, client, name, size, safetensors, numpy_native) DType::client,
    CKPTD_DTYPES(CKPTD_CLIENT_DTYPE_ALL)
#undef CKPTD_CLIENT_DTYPE_ALL
};
inline constexpr size_t kDTypeCount = std::size(kDTypes);

// Bytes per element: 8, 4, 2 or 1 (the table's SIZE).
size_t DTypeSize(DType dtype);
// "float32", "bfloat16", ... (the table's NAME: lower case, as numpy/torch spell them).
const char* DTypeName(DType dtype);
// "F32", "BF16", ... (the table's SAFETENSORS: the Hugging Face safetensors dtype string).
const char* DTypeSafetensorsName(DType dtype);
// Inverse of DTypeName: INVALID_ARGUMENT for a name that is not in the table. (Not ParseDType:
// that is the daemon's, on v1::DType, and a binary may link both.)
absl::StatusOr<DType> DTypeFromName(std::string_view name);

// Which part of a tensor item a shard covers or a load asks for, in global coordinates.
struct Region {
  enum Kind { kWhole, kBox, kFlat };
  Kind kind = kWhole;
  // kBox: one entry per dimension of the global tensor.
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> lengths;
  // kFlat: elements [flat_start, flat_start + flat_count) in row-major order of the global tensor.
  uint64_t flat_start = 0;
  uint64_t flat_count = 0;

  static Region Whole();
  static Region Box(std::vector<uint64_t> offsets, std::vector<uint64_t> lengths);
  static Region Flat(uint64_t start, uint64_t count);

  // Elements this region covers in a tensor of `global_shape`, or INVALID_ARGUMENT when it does
  // not fit in it (wrong rank, out of bounds, overflow).
  absl::StatusOr<uint64_t> ElementCount(std::span<const uint64_t> global_shape) const;
};

// One tensor shard. `data` holds the region's row-major bytes; `bytes` must equal the region's
// element count * DTypeSize(dtype). The caller owns `data`; it is only read during the call —
// unless it lies in daemon-visible memory (see Save()).
struct TensorShard {
  std::string item;
  DType dtype = DType::kFloat32;
  std::vector<uint64_t> global_shape;
  Region region;
  const void* data = nullptr;
  uint64_t bytes = 0;
  // Set for a source that is not contiguous (a numpy array or torch tensor view): its elements
  // are read through it, in row-major order (`data` is then not used); strided->Bytes() must
  // equal `bytes`.
  std::optional<StridedView> strided;
  // >= 0: `data` is contiguous GPU memory of this CUDA device (this process's ordinal). The daemon
  // copies it into the staging arena itself over CUDA IPC before Save returns (the allocation is
  // registered once per session); where it cannot (no GPU it can use, memory that cannot be
  // exported such as expandable segments) the library copies it instead, saying so once on
  // stderr. Either way the caller may change it once Save returns. The daemon's copy runs on its
  // own stream, unordered with the caller's: synchronize the streams writing `data` before Save
  // (the Python client does). Default: -1 (host memory)
  int device = -1;
};

// An opaque object (pickled state, RNG, dataloader position). per_rank: one copy per saving rank;
// otherwise replicated (one copy for the job; the lowest saving rank's is kept).
struct ObjectShard {
  std::string item;
  bool per_rank = false;
  std::string bytes;
  // Set instead of `bytes` to save bytes the caller keeps alive during the call, without first
  // copying them into `bytes` (the binding's pickled objects).
  std::optional<std::string_view> borrowed;
  std::string_view data() const { return borrowed.has_value() ? *borrowed : bytes; }
};

// An extent of the daemon's staging arena, mapped into this process (see Allocate()). The data is
// valid while any copy of this struct exists (it shares the mapping).
struct ArenaBuffer {
  uint64_t extent_id = 0;
  void* data = nullptr;
  uint64_t size = 0;        // usable bytes (the request rounded up to 4 KiB)
  uint64_t generation = 0;  // which daemon instance's arena it belongs to
  std::shared_ptr<const void> mapping;
};

// A registered shm region (RegisterShm()) at a byte offset.
struct RegionRef {
  uint64_t handle = 0;
  uint64_t offset = 0;
};

// A place in daemon-visible memory — the one name for it on the client side: an arena buffer or a
// registered region, at a byte offset into it. (On the wire it is a v1::MemRef; in the daemon an
// arena buffer is an extent, ExtentInfo.)
struct BufferRef {
  enum Kind { kArena, kRegion };
  Kind kind = kArena;
  uint64_t id = 0;          // kArena: ArenaBuffer::extent_id; kRegion: the RegisterShm() handle
  uint64_t offset = 0;      // bytes from the start of the buffer or region
  uint64_t generation = 0;  // kArena: ArenaBuffer::generation

  static BufferRef InArena(const ArenaBuffer& buffer, uint64_t offset = 0);
  static BufferRef InRegion(RegionRef region);
};

// Zero-copy shards: the bytes already are in daemon-visible memory.
struct InPlaceTensorShard {
  std::string item;
  DType dtype = DType::kFloat32;
  std::vector<uint64_t> global_shape;
  Region region;
  BufferRef data;
  uint64_t bytes = 0;
};
struct InPlaceObjectShard {
  std::string item;
  bool per_rank = false;
  BufferRef data;
  uint64_t bytes = 0;
};

// kDeleting: a Delete is removing it (gone once the Delete returns; a crash mid-delete leaves it
// here until the Delete is repeated or the daemon restarts). kCorrupt: committed, but its manifest
// no longer verifies — never `latest`, and a load is DATA_LOSS. kMissing: committed, but a restart
// found its manifest gone and no other tier holding a copy; its files are kept for the operator
// (Delete removes it) — never `latest`, and a load is DATA_LOSS.
enum class CheckpointState {
  kUnspecified,
  kStaging,
  kPersisting,
  kCommitted,
  kAborted,
  kDeleting,
  kCorrupt,
  kMissing
};
const char* CheckpointStateName(CheckpointState state);  // "STAGING", ...

// kRemote: COMMITTED and durable on the remote tier (FAILED_PRECONDITION for a checkpoint saved
// without one).
enum class WaitFor { kAllStaged, kCommitted, kRemote };

// What a committed checkpoint survives (Latest): kCommitted, as its tier policy says; kPeer, the
// loss of any one node (every blob on a peer or on the store); kStore, the loss of every node
// (whole on the remote store). docs/PEERS.md "What survives what".
enum class Durability { kCommitted, kPeer, kStore };

// Which tiers a checkpoint is made durable on (the daemon's tier_policy when kDefault).
// kLocalAndRemote: COMMITTED on local storage, then uploaded to the daemon's remote tier in the
// background (FAILED_PRECONDITION from Save when the daemon has none). kRemote: flushed from the
// staging arena straight to the remote tier and COMMITTED there, no local copy (nodes without
// local disks).
// kLocalAndPeer: a checkpoint spanning nodes, committed once every node's ranks are on its local
// storage and its part on its peers; the store holds its control files only (docs/PEERS.md).
enum class TierPolicy { kDefault, kLocal, kLocalAndRemote, kRemote, kLocalAndPeer };

// The upload of a checkpoint to the remote tier.
struct UploadProgress {
  // kRefused: the store refused it for good (the job there belongs to another owner; `error`
  // names it); not retried until the daemon restarts.
  enum State { kNone, kPending, kRunning, kRetrying, kDurable, kRefused };
  State state = kNone;
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;
  std::string error;  // the last attempt's failure (kRetrying, kRefused)
  uint32_t attempts = 0;
  std::string store;  // e.g. "posix:/mnt/shared/ckpt"
};

struct SaveResult {
  uint64_t bytes_staged = 0;
  CheckpointState state = CheckpointState::kUnspecified;  // of the checkpoint after this rank
};

struct Tiers {
  bool staged = false;  // some bytes are in the staging arena
  bool local = false;   // durable on local storage
  bool remote = false;  // durable on the remote store
  bool ram = false;     // hot in the daemon's RAM tier: loads copy from memory
  uint64_t ram_bytes = 0;
  UploadProgress upload;  // kNone unless the checkpoint's policy has a remote tier
  // A checkpoint spanning nodes (docs/PEERS.md "Replication"): the nodes whose peer stores hold
  // copies of its blobs, and how many of its blobs no peer holds.
  std::vector<std::string> peer_nodes;
  uint32_t blobs_without_peer_copy = 0;
  // Committed at the peer tier (kLocalAndPeer): this node's own blobs are on its local storage.
  bool local_part = false;
  // Repair (docs/PEERS.md "Repair"), for this node's part of its job's newest checkpoint at the
  // peer tier: the peers holding it at the last check, and why it is short of copies ("": not).
  std::vector<std::string> part_peers;
  std::string peer_degraded;
};

struct RankProgress {
  uint32_t rank = 0;
  bool staged = false;
  bool persisted = false;
  uint64_t bytes_staged = 0;
  uint64_t bytes_persisted = 0;
  uint32_t shard_count = 0;
};

// A checkpoint spanning nodes, one daemon's view (GetStatus, Wait): this daemon first, then the
// node parts it read from the shared tier.
struct NodeProgress {
  std::string node;             // the daemon's node_id
  std::vector<uint32_t> ranks;  // this daemon's staged ranks; another's ranks in its part
  bool part_durable = false;    // its part is on the shared tier
  bool coordinator = false;     // holds rank 0: decides commit or abort
};

// A checkpoint's summary, plus per-rank progress where the call returns it (GetStatus, Wait,
// Commit, Abort; empty in ListCheckpoints and once COMMITTED from a manifest).
struct CheckpointInfo {
  std::string job;
  uint64_t step = 0;
  CheckpointState state = CheckpointState::kUnspecified;
  uint32_t world_size = 0;
  uint64_t bytes = 0;  // tensor + object bytes (replicas counted once)
  Tiers tiers;
  uint64_t created_unix_ms = 0;
  uint64_t committed_unix_ms = 0;
  bool partial = false;
  std::string error;  // why it was aborted
  uint64_t item_count = 0;
  std::vector<RankProgress> ranks;
  std::vector<uint32_t> missing_ranks;
  uint64_t bytes_staged = 0;
  uint64_t bytes_persisted = 0;
  // Being saved across nodes: the ranks saving through this daemon (0: single node), the nodes
  // seen, and what the commit waits for, in words.
  uint32_t local_world_size = 0;
  std::vector<NodeProgress> nodes;
  std::string waiting_for;
};

struct JobInfo {
  std::string job;
  uint32_t owner_uid = 0;
  uint64_t checkpoint_count = 0;
  std::optional<uint64_t> latest_committed_step;
};

struct ItemInfo {
  enum Kind { kTensor, kObject };
  std::string name;
  Kind kind = kTensor;
  DType dtype = DType::kFloat32;  // tensors
  std::vector<uint64_t> shape;    // tensors
  bool per_rank = false;          // objects
  uint64_t shard_count = 0;
  uint64_t bytes = 0;                  // stored bytes (objects: all ranks' copies)
  std::vector<uint32_t> object_ranks;  // per-rank objects: the saving ranks
};

// One item (or a region of a tensor item) to load into the caller's memory. Tensors: `bytes` must
// equal the region's element count * dtype size. Objects: `bytes` is the capacity of `dest`.
struct LoadTarget {
  std::string item;
  Region region;
  void* dest = nullptr;
  uint64_t bytes = 0;
  // Per-rank objects: load the copy saved by this rank instead of the loading rank's.
  std::optional<uint32_t> object_rank;
  // Set for a destination that is not contiguous: the loaded row-major bytes are scattered into
  // its elements (`dest` is then not used); strided->Bytes() must equal `bytes`.
  std::optional<StridedView> strided;
  // >= 0: `dest` is contiguous GPU memory of this CUDA device. The daemon writes it itself over
  // CUDA IPC (verified bytes, host → device), or — the fallback, as for TensorShard::device — the
  // library copies the loaded bytes in. Default: -1 (host memory)
  int device = -1;
};
// The same, into daemon-visible memory (no copy by the library).
struct InPlaceLoadTarget {
  std::string item;
  Region region;
  BufferRef dest;
  uint64_t bytes = 0;
  std::optional<uint32_t> object_rank;  // as in LoadTarget
};

// How a Load runs (both fields are hints: a load never fails because of them).
struct LoadOptions {
  // Bring the whole checkpoint into the daemon's RAM tier first (as ckptctl prefetch does), then
  // copy this load from there. For restores where several local ranks load the same checkpoint
  // (replicated parameters, data-parallel ranks): the first rank's load reads it from storage,
  // the others wait for that read and copy from memory, so it is read once; and the next restart
  // finds it hot. With the RAM tier off, or a checkpoint beyond its budget, the load reads
  // storage as without it. Default: false
  bool prefetch = false;
  // Where bytes are hot in the daemon's RAM tier in this uid's own arena segment, copy them from
  // there straight into contiguous caller memory (one copy, each checksum block verified as it
  // is copied; blocks that do not verify are loaded again through the daemon's verified copy).
  // false: the daemon copies them into arena scratch and the library copies that out (two
  // copies; for comparison). Default: true
  bool hot_direct = true;
};

struct LoadResult {
  uint64_t step = 0;               // the step loaded (resolves "latest")
  uint64_t bytes_read = 0;         // bytes the daemon read from storage
  uint64_t bytes_read_remote = 0;  // of bytes_read, those read from the remote tier
  uint64_t bytes_read_peer = 0;    // of bytes_read, those read from other nodes' peer stores
  uint64_t bytes_from_ram = 0;     // copied from the daemon's RAM tier (not in bytes_read)
  // Read from storage into the RAM tier by this load's prefetch (LoadOptions::prefetch) before it
  // copied them from there; 0 when another load's prefetch read them.
  uint64_t bytes_prefetched = 0;
  std::vector<uint64_t> item_bytes;   // bytes written per target, in the order given
  uint64_t bytes_needed = 0;          // distinct stored bytes the targets use
  uint64_t bytes_needed_aligned = 0;  // the same with each contiguous range rounded to 4 KiB
};

struct LoadedTensor {
  DType dtype = DType::kFloat32;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;  // row-major
};
struct LoadedCheckpoint {
  uint64_t step = 0;
  std::map<std::string, LoadedTensor> tensors;
  std::map<std::string, std::string> objects;
};

// Bytes and calls of memcpy done by the library, process-wide, since start or the last reset.
struct CopyStats {
  uint64_t save_bytes = 0;
  uint64_t save_calls = 0;
  uint64_t load_bytes = 0;
  uint64_t load_calls = 0;
  // GPU bytes the library copied itself (device <-> host) because the daemon could not over CUDA
  // IPC (TensorShard::device); 0 when every GPU byte went through the daemon.
  uint64_t gpu_fallback_bytes = 0;
};

struct ClientOptions {
  // Path of the daemon's unix socket. Empty: $CKPTD_SOCKET, else the default.
  // Default: "/var/lib/ckptd/ckptd.sock"
  std::string socket_path;
  // Deadline of each RPC. Wait() uses its own timeout plus a margin instead. Default: 60000
  int rpc_timeout_ms = 60000;
  // How long Connect() and a re-check after UNAVAILABLE wait for the socket to accept.
  // Default: 5000
  int connect_timeout_ms = 5000;
  // How long the daemon may wait for arena space before RESOURCE_EXHAUSTED; 0 = the daemon's
  // reserve_timeout_ms. Must be below rpc_timeout_ms. Default: 0
  int reserve_timeout_ms = 0;
  // Free text for the daemon's logs. Empty: "ckptd-cpp/<pid>". Default: ""
  std::string client_name;
  // Page-lock this process's mapping of the staging arena for CUDA (cudaHostRegister, portable),
  // so cudaMemcpy(Async) from GPU memory into Allocate()d buffers runs as DMA at full link speed
  // and a GPU tensor's save is one device-to-arena copy. Connect() fails with FAILED_PRECONDITION
  // when no CUDA runtime loads or it refuses (no GPU). Costs about 0.1-0.3 s per GiB once per
  // connection (and again after a daemon restart re-maps the arena). Default: false
  bool pin_arena_for_cuda = false;
  // The tier policy of every checkpoint this client saves. Default: kDefault (the daemon's)
  TierPolicy tier_policy = TierPolicy::kDefault;
  // The ranks of a checkpoint that save through this client's daemon (torchrun's
  // LOCAL_WORLD_SIZE), the same in every client of the node. Fewer than a save's world_size: the
  // checkpoint spans nodes, one daemon each, committed through their shared tier (needs
  // kLocalAndRemote; docs/OPERATIONS.md "Checkpoints that span nodes"). 0: all of them. Default: 0
  uint32_t local_world_size = 0;
  // The overlapped save (SaveAsync): the threads that run its saves, at most this many at once
  // (1..16). Default: 1
  uint32_t save_threads = 1;
  // The nice value (0..19) the save threads lower their CPU priority to, so the copy they make
  // yields the cores to the training compute it overlaps; 0 keeps the caller's. Default: 10
  int save_thread_nice = 10;
  // How many SaveAsync saves may be queued or running at once (1..64); one more is refused with
  // RESOURCE_EXHAUSTED naming this limit. Default: 4
  uint32_t async_saves_max = 4;
};

// A save started by Client::SaveAsync (the overlapped save). Move-only. It reads the caller's
// shard memory until WaitStaged() returns, so destroying (or assigning over) one that is not
// staged yet waits for it first, as a std::future of std::async does.
class PendingSave {
 public:
  PendingSave() = default;  // holds no save: WaitStaged() is FAILED_PRECONDITION
  ~PendingSave();
  PendingSave(PendingSave&& other) noexcept = default;
  PendingSave& operator=(PendingSave&& other) noexcept;
  PendingSave(const PendingSave&) = delete;
  PendingSave& operator=(const PendingSave&) = delete;

  // Blocks until this rank's save is staged (the daemon owns its bytes) and returns Save()'s
  // answer; the same answer on every call. Only once it has returned may the caller change or
  // free the memory of the shards it saved (with SaveAsync before optimizer.step(), call it just
  // before the step).
  absl::StatusOr<SaveResult> WaitStaged();
  // Whether WaitStaged() would return at once.
  bool staged() const;
  bool valid() const { return state_ != nullptr; }

 private:
  friend class Client;
  explicit PendingSave(std::shared_ptr<internal::AsyncSaveState> state);
  std::shared_ptr<internal::AsyncSaveState> state_;
};

class Client {
 public:
  // Opens a session (Hello) and maps the staging arena. UNAVAILABLE when the daemon is not there.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(ClientOptions options);
  // Close(), then unmaps the arena.
  ~Client();
  // Ends the session now: Goodbye to the daemon (best effort, short deadline: the daemon then
  // releases this session's extents, regions and leases as when the process exits) and the
  // session's Attach stream closed, so no thread of this client is left waiting on it. The arena
  // stays mapped until destruction, so touching a buffer the caller still holds never faults;
  // but its extent is the daemon's again (another session may be handed it). Every later call
  // that needs the daemon answers FAILED_PRECONDITION; Close again does nothing.
  // Concurrent calls still in flight finish or fail with the session's end.
  void Close();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // --- save -----------------------------------------------------------------------------------
  // Stages one rank's shards: reserves one extent per non-empty shard in caller memory, copies
  // each such shard into it once, and sends Save. Returns once staged; the caller's buffers may
  // then be reused. A shard whose bytes lie in daemon-visible memory (Locate()) is not copied: an
  // Allocate()d buffer holding it then belongs to the daemon (as with SaveInPlace), a registered
  // region's bytes must stay unchanged until the checkpoint is committed. On failure the extents
  // reserved are released.
  absl::StatusOr<SaveResult> Save(const std::string& job, uint64_t step, uint32_t rank,
                                  uint32_t world_size, std::span<const TensorShard> tensors,
                                  std::span<const ObjectShard> objects = {});

  // The overlapped save (docs/USER_GUIDE.md "Overlapping the save with compute"): returns at once
  // and does what Save() does on one of this client's save threads (ClientOptions::save_threads,
  // at the lower CPU priority save_thread_nice): the one copy of host shards into the arena, the
  // daemon's own device-to-arena copy of GPU shards (on its low-priority streams), the Save RPC.
  // Issue it right after the optimizer step and call WaitStaged() before the next one: the copy
  // overlaps the forward and backward passes in between. The shards' metadata is copied here;
  // their bytes (and borrowed object bytes) are read until WaitStaged() returns and must stay
  // alive and unchanged until then. Saves of one client run in submission order when
  // save_threads is 1. RESOURCE_EXHAUSTED when async_saves_max saves are already in flight;
  // every other error (bad shards, the daemon's answers) comes from WaitStaged().
  absl::StatusOr<PendingSave> SaveAsync(std::string job, uint64_t step, uint32_t rank,
                                        uint32_t world_size, std::vector<TensorShard> tensors,
                                        std::vector<ObjectShard> objects = {});

  // Zero-copy: reserves an arena extent of at least `bytes` for the caller to fill.
  absl::StatusOr<ArenaBuffer> Allocate(uint64_t bytes);
  // Saves shards whose bytes are already in arena buffers or registered regions; copies nothing.
  // On success every arena buffer referenced belongs to the daemon: do not write or Release it.
  // Registered-region bytes are flushed from where they are: write them again only once the
  // checkpoint is committed (WaitCommitted), when the daemon has released them.
  absl::StatusOr<SaveResult> SaveInPlace(const std::string& job, uint64_t step, uint32_t rank,
                                         uint32_t world_size,
                                         std::span<const InPlaceTensorShard> tensors,
                                         std::span<const InPlaceObjectShard> objects = {});
  // Alias of SaveInPlace() (the name used by the design notes).
  absl::StatusOr<SaveResult> SaveFromArena(const std::string& job, uint64_t step, uint32_t rank,
                                           uint32_t world_size,
                                           std::span<const InPlaceTensorShard> tensors,
                                           std::span<const InPlaceObjectShard> objects = {}) {
    return SaveInPlace(job, step, rank, world_size, tensors, objects);
  }
  // Gives back an unused buffer. Buffers of a previous daemon instance are only forgotten.
  // FAILED_PRECONDITION when it was consumed by a save or released already.
  absl::Status Release(const ArenaBuffer& buffer);
  // Gives back the Allocate()d buffers holding these addresses (views handed out by a binding);
  // addresses in no outstanding buffer are skipped. Best effort, like ReleaseMany().
  void ReleaseAt(std::span<const void* const> addresses);
  // Where [data, data + bytes) lies in daemon-visible memory of the current session: an
  // outstanding Allocate()d buffer, or a region registered with its mapping. nullopt for caller
  // memory (and for bytes == 0). Save() and Load() use it to copy nothing for such memory.
  std::optional<BufferRef> Locate(const void* data, uint64_t bytes);
  // Allocate() for several buffers in one reservation (all or none); each size must be > 0.
  absl::StatusOr<std::vector<ArenaBuffer>> AllocateMany(std::span<const uint64_t> sizes);
  // Allocates one buffer per source (one reservation, all or none) and copies each source into
  // its own, gathering strided ones: the one copy of a save, done ahead (the binding's stage()).
  // Saving the buffers' bytes later copies nothing. An empty source gets a 1-byte buffer.
  absl::StatusOr<std::vector<ArenaBuffer>> Stage(std::span<const StridedView> sources);
  // Release() for several buffers in one call; buffers consumed or released already are skipped
  // (best effort: the daemon also frees a session's extents when it ends).
  void ReleaseMany(std::span<const ArenaBuffer> buffers);

  // --- registered shared memory ---------------------------------------------------------------
  // Lets the daemon read/write `size_bytes` of the POSIX shm object `shm_name` (created by the
  // caller). Returns a handle that stays valid across daemon restarts. mapped_at: where this
  // process maps the object, so that Save()/Load() recognise memory in it and copy nothing.
  absl::StatusOr<uint64_t> RegisterShm(const std::string& shm_name, uint64_t size_bytes,
                                       const void* mapped_at = nullptr);
  absl::Status Unregister(uint64_t handle);

  // --- commit ---------------------------------------------------------------------------------
  // Waits until the checkpoint reaches `until` and returns its status. An ABORTED checkpoint is
  // the error ABORTED carrying the reason; a timeout is DEADLINE_EXCEEDED naming the state and
  // the ranks still missing (GetStatus() gives the full status at any time).
  absl::StatusOr<CheckpointInfo> Wait(const std::string& job, uint64_t step, WaitFor until,
                                      uint32_t timeout_ms);
  // OK once COMMITTED; ABORTED (with the reason) if it was aborted; DEADLINE_EXCEEDED naming the
  // missing ranks after timeout_ms.
  absl::Status WaitCommitted(const std::string& job, uint64_t step, uint32_t timeout_ms);
  // Commits the ranks staged so far; `partial` must be true (an explicit partial checkpoint).
  absl::StatusOr<CheckpointInfo> Commit(const std::string& job, uint64_t step, bool partial);
  absl::StatusOr<CheckpointInfo> Abort(const std::string& job, uint64_t step,
                                       const std::string& reason);

  // --- load -----------------------------------------------------------------------------------
  // Loads items (or regions of them) of a COMMITTED checkpoint (nullopt: the latest) into the
  // caller's buffers, through arena extents (one copy per byte; none for a destination in
  // daemon-visible memory). Any number of targets of any size: they are loaded in batches of at
  // most load_batch_bytes() of arena scratch, two in flight; a contiguous whole or flat target
  // larger than a batch is read in flat slices. item_bytes has one entry per target; bytes_read,
  // bytes_needed(_aligned) are summed over the batches.
  absl::StatusOr<LoadResult> Load(const std::string& job, std::optional<uint64_t> step,
                                  uint32_t rank, std::span<const LoadTarget> targets,
                                  const LoadOptions& options = {});
  // The same into arena buffers or registered regions, named explicitly; copies nothing.
  absl::StatusOr<LoadResult> LoadInPlace(const std::string& job, std::optional<uint64_t> step,
                                         uint32_t rank, std::span<const InPlaceLoadTarget> targets,
                                         const LoadOptions& options = {});
  // One object item (for per-rank objects, `rank`'s copy).
  absl::StatusOr<std::string> LoadObject(const std::string& job, std::optional<uint64_t> step,
                                         uint32_t rank, const std::string& item);
  // Every saved copy of a per-rank object keyed by the rank that saved it (for a load with
  // another world size: the framework redistributes them); a replicated object as {0: bytes}.
  absl::StatusOr<std::map<uint32_t, std::string>> LoadObjects(const std::string& job,
                                                              std::optional<uint64_t> step,
                                                              const std::string& item);
  // Every tensor (whole) and every object visible to `rank` (one Load, batched by its policy).
  absl::StatusOr<LoadedCheckpoint> LoadAll(const std::string& job, std::optional<uint64_t> step,
                                           uint32_t rank);

  // --- catalog --------------------------------------------------------------------------------
  absl::StatusOr<std::vector<JobInfo>> ListJobs();  // all pages
  absl::StatusOr<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& job);
  absl::StatusOr<CheckpointInfo> GetStatus(const std::string& job, uint64_t step);
  absl::StatusOr<std::vector<ItemInfo>> Inspect(const std::string& job, uint64_t step);
  // The newest COMMITTED step (that survives at least `durable`); NOT_FOUND when there is none.
  absl::StatusOr<uint64_t> Latest(const std::string& job,
                                  Durability durable = Durability::kCommitted);
  // The step a read of `step` means: `step` itself, or (nullopt: "latest") the newest COMMITTED
  // step of the job; NOT_FOUND when it has none. The client side's one resolution of "latest":
  // LoadObject(s), LoadAll, ckptctl export and the Python client use it (Load and LoadInPlace
  // send nullopt to the daemon, which resolves it within the same call).
  absl::StatusOr<uint64_t> ResolveStep(const std::string& job, std::optional<uint64_t> step);
  absl::Status Delete(const std::string& job, uint64_t step);

  // --- introspection --------------------------------------------------------------------------
  static CopyStats copy_stats();
  static void reset_copy_stats();
  // How many times this client found a new daemon instance and re-mapped / re-registered.
  uint64_t reconnect_count() const;
  bool reconnected() const { return reconnect_count() > 0; }
  // "unix:<path>".
  const std::string& target() const;
  // Size of the daemon's staging arena in bytes (0 before the first session). Load() targets
  // and one Save() must fit in it at once.
  uint64_t arena_bytes() const;
  // Whether this process's mapping of the arena is pinned for CUDA (pin_arena_for_cuda).
  bool arena_pinned_for_cuda() const;
  // The granularity of arena extents, as the daemon announced it in Hello (Limits); 0 before the
  // first session. Callers that size batches of extents (the Python client) round to it.
  uint64_t extent_alignment_bytes() const;
  // The load batching policy's batch size: the arena scratch one Load RPC uses at most,
  // min(128 MiB, a quarter of the arena), in whole extents. Two batches are in flight, so a load
  // leaves at least half of the arena to other clients. Streaming readers (ckptctl export) read
  // chunks of this size. 0 before the first session.
  uint64_t load_batch_bytes() const;

 private:
  friend class internal::ClientFactory;
  explicit Client(std::unique_ptr<internal::ClientCore> core);
  std::unique_ptr<internal::ClientCore> core_;
  // SaveAsync's threads, made by its first call; declared after core_ so that it is destroyed
  // first: every queued save runs (against core_) before the client goes.
  std::once_flag async_once_;
  std::unique_ptr<internal::AsyncSaves> async_;
};

}  // namespace ckptd
