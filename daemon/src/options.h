// DaemonOptions: every setting of ckptd, from flags (--name=value) and an optional config file
// (--config=PATH, lines "name = value", '#' comments; flags win). Validated once at start-up.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/owner_map.h"

namespace ckptd {

struct DaemonOptions {
  // Directory for the RocksDB index, the socket and (by default) the data. Created if missing.
  // Default: /var/lib/ckptd
  std::string state_dir = "/var/lib/ckptd";
  // Where blobs and manifests are written: <data_dir>/<job>/step-<20 digits>/.
  // Default: <state_dir>/data
  std::string data_dir;
  // The unix socket clients connect to (mode 0600). At most 101 bytes: beside it the daemon
  // listens on the same path with ".arena" appended, where clients fetch their arena segment.
  // Default: <state_dir>/ckptd.sock
  std::string socket_path;
  // Permission bits of the unix socket (octal). 0600 lets only the daemon's uid connect; 0660
  // with socket_group lets that group's members connect too. Default: 0600
  uint32_t socket_mode = 0600;
  // Group (name or number) given the socket and the arena socket, so its members can connect.
  // Each uid maps only its own arena segment (dataplane/arena.h). Empty: the daemon's own group.
  // Default: ""
  std::string socket_group;
  // The Prometheus metrics endpoint (HTTP, /metrics): "PORT" or ":PORT" listens on loopback,
  // "HOST:PORT" on HOST (e.g. 0.0.0.0:9464 for a cluster's Prometheus; the metrics name jobs).
  // Port 0 picks a free port (logged). Empty: no endpoint. Default: ""
  std::string metrics_address;
  // Members of this group (name or number), and root, may read, abort and delete every job;
  // anyone else only the jobs they own. Empty: root only. Default: ""
  std::string admin_group;
  // Resolved by Validate() from socket_group / admin_group; -1 when empty.
  int64_t socket_gid = -1;
  int64_t admin_gid = -1;
  // Size of the shared-memory staging arena: the physical budget shared by every uid's segment.
  // Default: 1073741824 (1 GiB)
  uint64_t staging_bytes_max = uint64_t{1} << 30;
  // Fault arena pages in when they become a uid's (the whole arena, in the background, for the
  // first uid that maps it), so a client's copy never faults and a full /dev/shm is a clean
  // error.
  // Default: true
  bool staging_prefault = true;
  // The RAM tier (tier/ram_tier.h): a committed checkpoint's bytes stay in the arena extents that
  // staged them, so a restore copies from memory. At most this many bytes of the arena hold hot
  // checkpoints; 0: up to the whole arena (staging always wins: a reservation that needs the
  // space evicts the oldest hot checkpoint first). Default: 0
  uint64_t ram_tier_bytes_max = 0;
  // Hot checkpoints kept per job (its newest steps); 0 turns the RAM tier off. Default: 1
  uint32_t ram_tier_keep_per_job = 1;
  // A hot lease (a load's hot bytes the client copies itself) ends this long after it was
  // granted if the client has not released it (1 ms to 1 hour). Default: 60000
  uint64_t hot_lease_ms = 60000;
  // mlock() the arena's resident pages (MLOCK_ONFAULT) so they are never swapped. Default: false
  bool staging_mlock = false;
  // A checkpoint still short of ranks this long after its first Save is ABORTED.
  // Default: 600000 (10 minutes)
  uint64_t stage_timeout_ms = 600000;
  // How long a ReserveExtents waits for arena space before RESOURCE_EXHAUSTED. Default: 30000
  uint64_t reserve_timeout_ms = 30000;
  // Free bytes kept in reserve on the index's volume: a Save (new work) is refused with
  // RESOURCE_EXHAUSTED when less is free, so commits, aborts and deletes of work already
  // journaled can still be written. Default: 16777216 (16 MiB)
  uint64_t index_reserve_bytes = 16ull << 20;
  // Transfers in flight per I/O batch (io_uring queue depth), each of at most 8 MiB: 64 MiB in
  // flight saturates the disk without queueing a synced journal write behind gigabytes. Default: 8
  uint32_t io_queue_depth = 8;
  // Use O_DIRECT where the file system accepts it. Default: true
  bool direct_io = true;
  // How loads read the local tier: "auto" (each aligned read the page cache holds whole is
  // copied out of it, every other one is O_DIRECT: a warm checkpoint costs no device read, a cold
  // one reads at the device's speed without filling the cache), "direct" (O_DIRECT always) or
  // "buffered" (through the page cache: several local ranks restoring the same bytes at about
  // the same time read them from the device once, and the kernel's readahead applies; the load
  // hint `prefetch` does that for any mode, through the RAM tier). Default: "auto"
  std::string load_io = "auto";
  // A staged rank's flush waits until every rank of its checkpoint is staged, or at most this
  // long after the first one staged: flushing beside ranks still copying slows their copies (the
  // training stall). 0 flushes every rank as soon as it is staged. Default: 1000
  uint64_t flush_gate_ms = 1000;
  // Threads that flush staged ranks and commit. Default: 2
  uint32_t flush_threads = 2;
  // Shards carry one crc32c per block of this many bytes (a power of two from 4 KiB to 16 MiB), so
  // a load that reads part of a shard still verifies every byte it uses. Smaller blocks let
  // resharded loads read less; larger ones make manifests smaller (4 bytes per block).
  // Default: 4096
  uint32_t checksum_block_bytes = 4096;
  // Each of the two read buffers of one load: the runs of a load are read in batches of at most
  // this many bytes (io_uring keeps a batch's runs in flight at once), the next batch while the
  // last one is verified and copied. Default: 67108864 (64 MiB)
  uint64_t load_buffer_bytes = 64ull << 20;
  // Threads that serve loads. Default: 2
  uint32_t load_threads = 2;
  // Threads that verify and copy one load's bytes (its thread and load_copy_threads - 1 of a
  // shared pool; 1: each load on its own thread). 0: one per CPU the daemon may run on, at most
  // 16. Default: 0
  uint32_t load_copy_threads = 0;
  // Whole shards of at least 256 KiB whose destination is 4 KiB-aligned are read from storage
  // straight into it and verified there (no read buffer, no copy); off: every byte goes through
  // the read buffer. Default: true
  bool load_into_destination = true;
  // Threads that run quick RPCs (catalog, reserve, save's journal write). Default: 4
  uint32_t rpc_threads = 4;
  // Queued RPCs beyond which new ones get RESOURCE_EXHAUSTED. Default: 4096
  uint32_t rpc_queue_max = 4096;
  // RPCs that may block at once (Wait, ReserveExtents on a full arena). Default: 64
  uint32_t waiters_max = 64;
  // Per-uid shares (docs/SECURITY.md "Per-uid shares"): the percentage of each shared count one
  // uid may hold at once — open checkpoints (of limits::kOpenCheckpointsMax), blocked Waits and
  // blocked reservations (each of waiters_max), queued RPCs (of rpc_queue_max), connections on
  // the main socket (of connections_max) and exchanges on the arena socket (of its 64) — so that
  // one uid always leaves the rest to the others. 100 turns the shares off. Default: 50
  uint32_t uid_share_percent = 50;
  // The percentage of the staging arena one uid may hold reserved or staged (not yet persisted;
  // the RAM tier's hot copies are not counted: any reservation evicts them). 100 turns it off.
  // Default: 80
  uint32_t uid_arena_share_percent = 80;
  // Connections on the main socket at once (each holds a descriptor); 0: half the daemon's
  // descriptor limit (RLIMIT_NOFILE), so its own files always have room. A uid past its share
  // (uid_share_percent of this) has its new connections closed at once. Default: 0
  uint32_t connections_max = 0;
  // Seconds SIGTERM gives the work in flight before exiting: flushes and commits of checkpoints
  // whose ranks are all staged, this node's part of a checkpoint spanning nodes, uploads to the
  // remote tier. The RPC server keeps answering (status, list, wait; new saves are refused)
  // meanwhile; what is left stays journaled and resumes at the next start. Default: 30
  uint32_t shutdown_grace_s = 30;
  // The tiers a checkpoint is made durable on when its Save names none: "local",
  // "local+remote" (COMMITTED on local storage, then uploaded to the remote tier in the
  // background) or "remote" (flushed from the arena straight to the remote tier and COMMITTED
  // there: nodes without local disks). The last two need a remote tier. Default: local
  std::string tier_policy = "local";
  // The remote tier: a directory on a shared file system (NFS, Lustre, a mounted bucket), written
  // through the posix storage plugin. Checkpoints keep their relative paths there
  // (<job>/step-<20 digits>/), so the directory is self-contained: any daemon configured with it
  // lists and loads them. Empty: no remote tier. Default: ""
  std::string remote_dir;
  // remote_dir's PutIfAbsent (the node parts and the commit decision of checkpoints spanning
  // nodes) always takes the link(2) fallback (ckptd/io.h LinkNoReplace) instead of
  // renameat2(RENAME_NOREPLACE). The fallback is taken by itself where the file system answers
  // EINVAL or ENOSYS; this is for one that refuses the flag otherwise, and for tests of the
  // fallback on any file system. Default: false
  bool remote_dir_link_fallback = false;
  // The remote tier on an S3-compatible store (AWS S3, MinIO, Ceph RGW, SeaweedFS) through the S3
  // plugin (plugins/storage/s3/s3_storage.h): the bucket, under remote_s3_prefix. Exclusive with
  // remote_dir. Credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
  // AWS_SESSION_TOKEN, else the shared credentials file (AWS_SHARED_CREDENTIALS_FILE or
  // ~/.aws/credentials, profile AWS_PROFILE); they are never logged. The daemon checks at start
  // that the bucket answers. Empty: no S3 tier. Default: ""
  std::string remote_s3_bucket;
  // "http(s)://host[:port]" of the store; required with remote_s3_bucket. Default: ""
  std::string remote_s3_endpoint;
  // Key prefix inside the bucket (no leading or trailing '/'). Default: ""
  std::string remote_s3_prefix;
  // SigV4 region. Default: us-east-1
  std::string remote_s3_region = "us-east-1";
  // Path-style addressing (MinIO, Ceph, SeaweedFS); false: virtual-host style (AWS).
  // Default: true
  bool remote_s3_path_style = true;
  // Verify the store's TLS certificate (https). Default: true
  bool remote_s3_tls_verify = true;
  // CA bundle for TLS verification; empty: the system's. Default: ""
  std::string remote_s3_ca_path;
  // Multipart part size (5 MiB..5 GiB) and parts in flight per blob upload. Default: 8388608, 8
  uint64_t remote_s3_part_size_bytes = 8ull << 20;
  uint32_t remote_s3_parts_in_flight = 8;
  // Threads that upload committed checkpoints to the remote tier. Default: 2
  uint32_t upload_threads = 2;
  // Bytes each upload thread reads from local storage and hands the store at a time (a multiple
  // of 4096; two buffers per copy in flight: the next chunk is read while this one is sent,
  // tier/remote_tier.h). The S3 plugin sends only the whole parts of one
  // write at once, so a chunk of remote_s3_part_size_bytes x remote_s3_parts_in_flight keeps
  // every part in flight (bench/RESULTS.md: 8 MiB chunks kept one part in flight).
  // Default: 67108864 (64 MiB: 8 parts of 8 MiB)
  uint64_t upload_chunk_bytes = 64ull << 20;
  // A failed upload is retried after a backoff doubling from 1 s up to this, forever (the store
  // may be down for hours; the checkpoint stays COMMITTED locally meanwhile). Default: 60000
  uint64_t upload_retry_max_ms = 60000;
  // The remote tier's codec (docs/BLOB_FORMAT.md "Encoded blobs on the store"): "zstd" stores
  // each blob the remote tier uploads encoded (chunk by chunk: byte planes of the item's dtype,
  // then zstd) and records the encoding in the store's manifest, which every reader of the store
  // decodes; "none" stores the raw bytes. The local and RAM tiers never encode, nor do the remote
  // policy's flush and the node uploads of checkpoints committed at the peer tier (remote_every).
  // Default: "none"
  std::string remote_codec = "none";
  // The zstd level of remote_codec = zstd, -1000..19 (negative: zstd's fast levels; the default
  // is format/codec.h's kCodecZstdLevelDefault). Default: -1000
  int32_t remote_codec_level = -1000;
  // Retention (docs/OPERATIONS.md "Tiers"): per job, keep the local copies of the newest keep_local
  // checkpoints that have one and the remote copies of the newest keep_remote; older copies go
  // (a checkpoint whose only durable copy goes is deleted; a local copy whose upload is under
  // way stays). 0: keep all. Applied every gc_interval_ms and by `ckptctl gc`. Default: 0, 0
  uint32_t keep_local = 0;
  uint32_t keep_remote = 0;
  // Retention milestones: the checkpoints whose step is a multiple of keep_every keep every copy
  // (they count among the newest keep_local / keep_remote, and are never dropped). 0: none.
  // Default: 0
  uint64_t keep_every = 0;
  // The store's cadence for checkpoints committed at the peer tier (policy local+peer): those
  // whose step is a multiple of remote_every are also copied to the remote tier after their
  // commit, in the background, each node its own blobs (the step, not a count, so that every node
  // picks the same checkpoints without asking). 0: none goes to the store.
  // Default: 0
  uint64_t remote_every = 0;
  // Deltas (docs/USER_GUIDE.md "Deltas"): a rank's flush compares each shard with the same
  // shard of the job's previous committed checkpoint on this node (block checksums, then the
  // bytes themselves, read back from that checkpoint's blob) and, where nothing changed,
  // references it there (the blob file shared by a hard link) instead of writing it again. For
  // fine-tuning (frozen or LoRA-only training). Per job in retention_rules (deltas=0|1).
  // Default: false
  bool deltas = false;
  // Deltas: an earlier blob is shared only when the shards referenced in it are at least this
  // percent of its bytes (else they are written again), so that a checkpoint never keeps alive
  // much more than it uses. 1..100. Default: 50
  uint32_t delta_live_min_percent = 50;
  // Per-job retention: "PATTERN: key=N, key=N; PATTERN2: ..." — a job matching PATTERN (a shell
  // glob over the job name, fnmatch(3)) takes these keep_local, keep_remote, keep_every and
  // remote_every; a key
  // a rule does not name, and a job no rule matches, takes the option's value. The first
  // matching rule wins. Default: ""
  std::string retention_rules;
  // Parsed from retention_rules by Validate(), in order.
  struct RetentionRule {
    std::string pattern;
    uint32_t keep_local = 0;
    uint32_t keep_remote = 0;
    uint64_t keep_every = 0;
    uint64_t remote_every = 0;
    bool deltas = false;
  };
  std::vector<RetentionRule> retention;
  // The retention of `job`: the first rule matching it, else keep_local, keep_remote, keep_every.
  RetentionRule RetentionOf(const std::string& job) const;
  // Some job may have copies dropped: keep_local or keep_remote set, in the options or a rule.
  bool RetentionOn() const;
  // How often housekeeping applies retention (when RetentionOn()).
  // Default: 60000
  uint64_t gc_interval_ms = 60000;
  // Checkpoints that span nodes (docs/OPERATIONS.md "Checkpoints that span nodes"): this daemon's
  // name on the shared tier (its node part is <dir>/cluster/<node_id>.part; letters, digits, '.',
  // '-', '_', at most 64). Every daemon of a job needs its own. Default: the host name
  std::string node_id;
  // The peer channel between daemons (docs/PEERS.md): host:port of a TCP listener for other
  // daemons only (never the client API), gRPC over mutual TLS; empty: off. Default: "" (off)
  std::string peer_listen_addr;
  // PEM files of the peer channel, required when peer_listen_addr is set and checked at start
  // (a missing, unreadable, malformed or expired one stops the daemon naming it): the CA that
  // signs every daemon's certificate, this daemon's certificate (its subject CN or a DNS
  // subjectAltName must be node_id) and its key. Default: "" (none)
  std::string peer_tls_ca_path;
  std::string peer_tls_cert_path;
  std::string peer_tls_key_path;
  // Memory for the copies other nodes place here (the peer store), apart from the staging arena;
  // 0: this node holds none (puts are refused). Needs peer_listen_addr. Default: 0
  uint64_t peer_bytes_max = 0;
  // Per peer node: PutBlob and GetBlob streams in flight here (at most kPeerStreamsPerNodeMax).
  // Default: 8
  uint64_t peer_streams_per_node_max = 8;
  // Per peer node: bytes of the copies it is sending here at once (at most
  // kPeerInflightBytesPerNodeMax). Default: 4 GiB
  uint64_t peer_inflight_bytes_per_node_max = uint64_t{4} << 30;
  // Replication (docs/PEERS.md "Replication"): how many other nodes' peer stores receive a copy
  // of this node's part of each checkpoint spanning nodes (0: none). Needs peer_listen_addr and
  // a remote tier (the peers register there). Default: 1
  uint64_t peer_replicas = 1;
  // Repair (docs/PEERS.md "Repair"): how often this node checks that the peers holding its part
  // of each job's newest checkpoint committed at the peer tier still hold it, and copies it to
  // the next nodes when one lost it (0: never). Default: 5000
  uint64_t peer_repair_interval_ms = 5000;
  // A call to a peer (a copy, a read, a check) that makes no progress for this long is cancelled,
  // and the peer listener closes a connection whose pings go unanswered this long: a link or a
  // peer that stalls without closing is given up on, the copy going to the next node
  // (docs/PEERS.md "Failures between peers"). At least kPeerStallTimeoutMsMin (100), at most
  // kPeerCallTimeoutMs; the default is kPeerStallTimeoutMs. Default: 30000
  uint64_t peer_stall_timeout_ms = 30000;
  // host:port other daemons reach this one's peer listener at (registered on the shared tier);
  // empty: peer_listen_addr. Default: "" (peer_listen_addr)
  std::string peer_advertise_addr;
  // This node's failure domain (a rack, a switch, a power feed: letters, digits, ".-_", at most
  // 64), registered on the shared tier: this node's copies go first to nodes of other domains
  // (docs/PEERS.md "Replication"). Default: "" (none: the ring order alone)
  std::string peer_failure_domain;
  // How a job's owner recorded in a manifest or node part (written by a daemon on any node)
  // becomes a uid here when this daemon adopts the checkpoint (docs/SECURITY.md "Ownership"):
  // "uid" (the recorded numeric uid: every node shares one uid space) or "name" (the recorded
  // user name, looked up in owner_map_file, then in this host's passwd database).
  // Default: uid
  std::string owner_map = "uid";
  // A table of "NAME UID" lines (# comments), read once at start: in owner_map = name, the uid of
  // each name on this node (before the passwd database); in both modes, the name recorded for a
  // uid. Default: "" (none)
  std::string owner_map_file;
  // Built from owner_map and owner_map_file by Validate().
  OwnerMap owners;
  // How often a daemon reads the shared tier for a checkpoint spanning nodes (the coordinator:
  // the other nodes' parts; the others: the coordinator's decision). Bounds the commit latency
  // across nodes. Default: 200
  uint64_t cluster_poll_ms = 200;
  // How long a question about a job (Load of "latest", Latest, List, Status, Inspect, a Load of a
  // step this node has no row of) waits for a scan of the store for checkpoints other daemons
  // committed there since this one started (service/store_catalog.cc); the answer comes from the
  // index either way. 0: the store is scanned at start only. Default: 2000
  uint64_t store_discovery_wait_ms = 2000;
  // "text" or "json". Default: text
  std::string log_format = "text";
  // trace, debug, info, warn, error. Default: info
  std::string log_level = "info";
  // Testing only: each flush waits this long before it starts, to make crash windows
  // deterministic. Default: 0
  uint64_t debug_flush_delay_ms = 0;
  // Testing only: each load waits this long after its destinations are leased and before it
  // reads, so tests can release or unregister them mid-load. Default: 0
  uint64_t debug_load_delay_ms = 0;
  // Testing only: an offline reshard waits this long before each chunk it copies, so tests can
  // watch its progress, cancel it or crash the daemon during it. Default: 0
  uint64_t debug_reshard_delay_ms = 0;
  // Testing only: each chunk an upload to the remote tier (or a node part's blob copy) writes
  // waits this long first: a slow store, so tests can stop the daemon mid-upload. Default: 0
  uint64_t debug_upload_delay_ms = 0;
  // Testing only: "<point>[:<nth>]" kills the daemon (SIGKILL to itself, nothing flushed) the nth
  // time (default 1) it reaches the named crash point (daemon/include/ckptd/sync_point.h lists
  // them; the crash-point matrix of tests/integration/crash_matrix_test.cc drives them). Refused by
  // a build without test hooks (CKPTD_TEST_HOOKS=OFF, the release build). Default: "" (none)
  std::string debug_crash_at;

  // Fills derived defaults and checks every field; INVALID_ARGUMENT naming the option.
  absl::Status Validate();

 private:
  absl::Status ValidateTiers() const;
};

// Parses argv (argv[0] skipped). --help returns NOT_FOUND with the usage text as message,
// --help-config with OptionsReference().
absl::StatusOr<DaemonOptions> ParseOptions(const std::vector<std::string>& args);
std::string OptionsUsage();
// The configuration reference: a Markdown table of every option (name, default, meaning), made
// from the options' declarations. docs/CONFIGURATION.md "Configuration" holds it verbatim (a test
// compares).
std::string OptionsReference();

}  // namespace ckptd
