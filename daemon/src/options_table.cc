// The option table (options_table.h): every daemon option's name, help, reference text and field.
#include "options_table.h"

#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckptd {
namespace options_internal {
namespace {

// "1 GiB", "64 MiB": a byte count that is a whole number of KiB, MiB, GiB or TiB; else digits.
std::string BinarySize(uint64_t v) {
  static constexpr const char* kUnits[] = {"TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 4; ++i) {
    const uint64_t unit = uint64_t{1} << (10 * (4 - i));
    if (v != 0 && v % unit == 0) return absl::StrCat(v / unit, " ", kUnits[i]);
  }
  return absl::StrCat(v);
}

Field StringField(std::string DaemonOptions::*field) {
  return {[field](DaemonOptions& o, absl::string_view v) {
            o.*field = std::string(v);
            return absl::OkStatus();
          },
          [field](const DaemonOptions& o) {
            return (o.*field).empty() ? std::string("(none)") : absl::StrCat("`", o.*field, "`");
          }};
}

template <typename T>
Setter IntSetter(T DaemonOptions::*field, std::string name) {
  return [field, name = std::move(name)](DaemonOptions& o, absl::string_view v) {
    uint64_t parsed = 0;
    if (!absl::SimpleAtoi(v, &parsed) || parsed > std::numeric_limits<T>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("option ", name, ": \"", v, "\" is not a non-negative integer in range"));
    }
    o.*field = static_cast<T>(parsed);
    return absl::OkStatus();
  };
}

template <typename T>
Field IntField(T DaemonOptions::*field, std::string name) {
  const bool bytes = absl::EndsWith(name, "_bytes") || absl::EndsWith(name, "_bytes_max");
  return {IntSetter(field, name), [field, bytes](const DaemonOptions& o) {
            const auto v = static_cast<uint64_t>(o.*field);
            return bytes ? BinarySize(v) : absl::StrCat(v);
          }};
}

Field SignedIntField(int32_t DaemonOptions::*field, std::string name) {
  return {[field, name = std::move(name)](DaemonOptions& o, absl::string_view v) {
            int32_t parsed = 0;
            if (!absl::SimpleAtoi(v, &parsed)) {
              return absl::InvalidArgumentError(
                  absl::StrCat("option ", name, ": \"", v, "\" is not an integer in range"));
            }
            o.*field = parsed;
            return absl::OkStatus();
          },
          [field](const DaemonOptions& o) { return absl::StrCat(o.*field); }};
}

Setter OctalSetter(uint32_t DaemonOptions::*field) {
  return [field](DaemonOptions& o, absl::string_view v) {
    uint32_t parsed = 0;
    if (v.empty() || v.size() > 4) parsed = 010000;
    for (char c : v) parsed = (c >= '0' && c <= '7') ? parsed * 8 + (c - '0') : 010000;
    if (parsed > 0777) {
      return absl::InvalidArgumentError(
          absl::StrCat("option socket_mode: \"", v, "\" is not octal permission bits (e.g. 0660)"));
    }
    o.*field = parsed;
    return absl::OkStatus();
  };
}

Field OctalField(uint32_t DaemonOptions::*field) {
  return {OctalSetter(field),
          [field](const DaemonOptions& o) { return absl::StrFormat("`0%o`", o.*field); }};
}

Setter BoolSetter(bool DaemonOptions::*field, std::string name) {
  return [field, name = std::move(name)](DaemonOptions& o, absl::string_view v) {
    std::string s = absl::AsciiStrToLower(v);
    if (s == "true" || s == "1" || s == "yes" || s.empty()) {
      o.*field = true;
    } else if (s == "false" || s == "0" || s == "no") {
      o.*field = false;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("option ", name, ": \"", v, "\" is not true or false"));
    }
    return absl::OkStatus();
  };
}

Field BoolField(bool DaemonOptions::*field, std::string name) {
  return {BoolSetter(field, std::move(name)),
          [field](const DaemonOptions& o) { return std::string(o.*field ? "true" : "false"); }};
}

}  // namespace

// Every option, in the order of the configuration reference.
const std::vector<OptionDef>& OptionDefs() {
  using O = DaemonOptions;
  static const auto* defs = new std::vector<OptionDef>{
      {"state_dir", "index, socket and default data dir",
       "RocksDB index, socket and default data dir (created, mode 0700)",
       StringField(&O::state_dir)},
      {"data_dir", "blobs and manifests (default <state_dir>/data)",
       "where blobs and manifests are written", StringField(&O::data_dir), "`<state_dir>/data`"},
      {"socket", "unix socket path (default <state_dir>/ckptd.sock)",
       "unix socket, at most 101 bytes (the arena socket `<socket>.arena` lies beside it); no "
       "TCP listener yet",
       StringField(&O::socket_path), "`<state_dir>/ckptd.sock`"},
      {"socket_mode", "socket permission bits, octal (0600 or 0660)",
       "permission bits of the socket (octal; the owner needs rw, others nothing); `0660` with "
       "`socket_group` opens it to a group",
       OctalField(&O::socket_mode)},
      {"socket_group", "group that may connect and map the arena",
       "group (name or number) of the socket and the arena socket", StringField(&O::socket_group),
       "(daemon's)"},
      {"metrics_address", "Prometheus endpoint: PORT or :PORT (loopback), HOST:PORT; empty: off",
       "Prometheus endpoint: `PORT` or `:PORT` on loopback, `HOST:PORT` as given, 0 for a free "
       "port ([Metrics](OPERATIONS.md#metrics-prometheus))",
       StringField(&O::metrics_address), "(off)"},
      {"admin_group", "group that may read and delete every job",
       "members (and root) may read, abort and delete every job", StringField(&O::admin_group),
       "(none)"},
      {"staging_bytes_max", "staging arena bytes",
       "size of the shared-memory staging arena (multiple of 4096, ≥ 16 MiB)",
       IntField(&O::staging_bytes_max, "staging_bytes_max")},
      {"staging_prefault", "pre-fault the arena",
       "fault arena pages in when they become a uid's (the whole arena, in the background, for "
       "the first uid that maps it), not in a client's copy",
       BoolField(&O::staging_prefault, "staging_prefault")},
      {"staging_mlock", "mlock the arena", "mlock the arena's resident pages (`MLOCK_ONFAULT`)",
       BoolField(&O::staging_mlock, "staging_mlock")},
      {"ram_tier_keep_per_job", "hot checkpoints per job (0: no RAM tier)",
       "committed checkpoints of each job kept hot in the arena for restores (its newest); 0 "
       "turns the RAM tier off",
       IntField(&O::ram_tier_keep_per_job, "ram_tier_keep_per_job")},
      {"ram_tier_bytes_max", "arena bytes kept hot for restores (0: up to the whole arena)",
       "at most this many arena bytes hold hot checkpoints (0: up to the whole arena); staging "
       "always evicts them first",
       IntField(&O::ram_tier_bytes_max, "ram_tier_bytes_max")},
      {"hot_lease_ms", "how long a client may copy hot bytes itself",
       "a load from the RAM tier into the caller's own memory hands the client where the hot "
       "bytes lie in its arena segment, pinned by a lease; a lease the client has not released "
       "ends this long after it was granted (its bytes may then be reused)",
       IntField(&O::hot_lease_ms, "hot_lease_ms")},
      {"stage_timeout_ms", "abort checkpoints short of ranks after this",
       "abort a checkpoint still short of ranks this long after its first save",
       IntField(&O::stage_timeout_ms, "stage_timeout_ms")},
      {"reserve_timeout_ms", "wait for arena space at most this",
       "how long a reservation waits for arena space before RESOURCE_EXHAUSTED",
       IntField(&O::reserve_timeout_ms, "reserve_timeout_ms")},
      {"io_queue_depth", "I/Os in flight per batch",
       "I/Os in flight per batch, each of at most 8 MiB",
       IntField(&O::io_queue_depth, "io_queue_depth")},
      {"direct_io", "use O_DIRECT", "O_DIRECT where the file system accepts it",
       BoolField(&O::direct_io, "direct_io")},
      {"flush_threads", "flush/commit threads", "threads that flush and commit",
       IntField(&O::flush_threads, "flush_threads")},
      {"flush_gate_ms", "max wait for a checkpoint's other ranks before flushing",
       "a staged rank's flush waits until every rank of its checkpoint is staged, or at most "
       "this long (flushing beside ranks still copying slows their copies); 0 flushes at once",
       IntField(&O::flush_gate_ms, "flush_gate_ms")},
      {"load_threads", "load threads", "threads that serve loads",
       IntField(&O::load_threads, "load_threads")},
      {"load_copy_threads", "threads verifying and copying one load (0: one per CPU, at most 16)",
       "threads verifying and copying one load (the load's own and `load_copy_threads` − 1 of "
       "a shared pool); 0: one per CPU the daemon may run on, at most 16; 1: each load on its "
       "own thread",
       IntField(&O::load_copy_threads, "load_copy_threads")},
      {"load_into_destination", "read whole shards straight into their destinations",
       "read whole shards (≥ 256 KiB, 4 KiB-aligned destination) from the local tier straight "
       "into the destination and verify them there; `false`: every byte through the read buffer",
       BoolField(&O::load_into_destination, "load_into_destination")},
      {"load_io",
       "loads read the local tier auto (what the page cache holds through it, the rest "
       "O_DIRECT), direct (O_DIRECT) or buffered (the page cache)",
       "how loads read the local tier: `auto` (each aligned read the page cache holds whole is "
       "copied out of it, every other one O_DIRECT), `direct` (O_DIRECT always) or `buffered` "
       "(the page cache always: several local ranks restoring the same bytes at about the same "
       "time read them from the device once; the kernel's readahead applies)",
       StringField(&O::load_io)},
      {"checksum_block_bytes", "bytes per shard checksum block",
       "one crc32c per block of this many bytes (a power of two, 4 KiB–16 MiB): smaller blocks "
       "let partial loads read less, larger ones shrink manifests (4 bytes per block)",
       IntField(&O::checksum_block_bytes, "checksum_block_bytes")},
      {"load_buffer_bytes", "read buffer per load",
       "each of the two read buffers of one load (one batch is read while the other is "
       "verified and copied); kept for reuse, at most two per load thread",
       IntField(&O::load_buffer_bytes, "load_buffer_bytes")},
      {"rpc_threads", "quick RPC threads", "threads for quick RPCs",
       IntField(&O::rpc_threads, "rpc_threads")},
      {"rpc_queue_max", "queued RPCs before RESOURCE_EXHAUSTED",
       "queued RPCs beyond which new ones get RESOURCE_EXHAUSTED",
       IntField(&O::rpc_queue_max, "rpc_queue_max")},
      {"waiters_max", "RPCs blocked at once",
       "Waits that may block at once, and separately reservations/unregisters that may wait "
       "(each on its own pool, so Waits never starve saves)",
       IntField(&O::waiters_max, "waiters_max")},
      {"uid_share_percent", "one uid's share of each shared count (percent)",
       "the percentage of each shared count one uid may hold at once: open checkpoints (of "
       "256), blocked Waits and blocked reservations (each of `waiters_max`), queued RPCs (of "
       "`rpc_queue_max`), connections (of `connections_max`), arena-socket exchanges (of 64); "
       "past it `RESOURCE_EXHAUSTED` naming the limit and the uid (docs/SECURITY.md); 100: off",
       IntField(&O::uid_share_percent, "uid_share_percent")},
      {"uid_arena_share_percent", "one uid's share of the staging arena (percent)",
       "the percentage of the staging arena one uid may hold reserved or staged (hot copies "
       "not counted); past it a reservation waits for the uid's own bytes, then "
       "`RESOURCE_EXHAUSTED` naming this option and the uid; 100: off",
       IntField(&O::uid_arena_share_percent, "uid_arena_share_percent")},
      {"connections_max", "connections at once on the main socket (0: half RLIMIT_NOFILE)",
       "connections on the main socket at once; 0: half the daemon's descriptor limit. A uid "
       "past its share of them has its new connections closed at once",
       IntField(&O::connections_max, "connections_max")},
      {"index_reserve_bytes", "free bytes kept on the index volume; saves refused below",
       "free bytes kept on the index's volume: a Save (new work) is `RESOURCE_EXHAUSTED` "
       "naming this option when less is free, so commits, aborts and deletes of work already "
       "journaled can still be written",
       IntField(&O::index_reserve_bytes, "index_reserve_bytes")},
      {"shutdown_grace_s", "SIGTERM drains flushes, node parts and uploads this long",
       "SIGTERM gives flushes and commits, node parts and uploads in flight this long, answering "
       "status meanwhile; the rest resumes at the next start",
       IntField(&O::shutdown_grace_s, "shutdown_grace_s")},
      {"tier_policy",
       "tiers of a checkpoint whose Save names none: local | local+remote | remote | local+peer",
       "tiers of a checkpoint whose Save names none: `local`, `local+remote`, `remote` or "
       "`local+peer` (all but `local` need a remote tier: `remote_dir` or `remote_s3_bucket`; "
       "`local+peer` commits checkpoints spanning nodes at the peer tier and needs "
       "`peer_listen_addr`); see [Tiers](OPERATIONS.md#tiers-local-and-remote) and "
       "[Committing at the peer tier](PEERS.md#committing-at-the-peer-tier)",
       StringField(&O::tier_policy)},
      {"remote_dir", "remote tier: a directory on a shared file system, or a storage URI",
       "the remote tier: a directory on a shared file system (a path or a `file://` URI; must "
       "exist at start), or another storage URI (`s3://bucket/prefix`, with the `remote_s3_*` "
       "options); a scheme the daemon has no plugin for stops the start",
       StringField(&O::remote_dir), "(none)"},
      {"remote_dir_link_fallback", "remote tier: link(2) instead of RENAME_NOREPLACE",
       "`remote_dir`'s conditional writes (the commit of checkpoints spanning nodes) always take "
       "the `link(2)` fallback instead of `renameat2(RENAME_NOREPLACE)` (taken by itself where "
       "the file system answers EINVAL or ENOSYS)",
       BoolField(&O::remote_dir_link_fallback, "remote_dir_link_fallback")},
      {"upload_threads", "threads uploading to the remote tier",
       "threads uploading committed checkpoints to the remote tier (1–16)",
       IntField(&O::upload_threads, "upload_threads")},
      {"upload_chunk_bytes", "bytes per upload read/write",
       "for a remote store without streaming copies (the posix plugin on a shared mount): "
       "bytes an upload reads locally and hands the store at a time, two buffers per upload "
       "(the next chunk is read while this one is written); the S3 plugin streams each blob "
       "with `remote_s3_part_size_bytes` x `remote_s3_parts_in_flight` of buffers instead",
       IntField(&O::upload_chunk_bytes, "upload_chunk_bytes")},
      {"upload_retry_max_ms", "longest backoff between upload attempts",
       "a failed upload is retried forever, after a backoff doubling from 1 s up to this",
       IntField(&O::upload_retry_max_ms, "upload_retry_max_ms")},
      {"remote_codec", "remote tier: none, or zstd (uploads stored encoded)",
       "`none`, or `zstd`: each blob the remote tier uploads is stored encoded, chunk by chunk "
       "(byte planes of its dtype, then zstd), and the store's manifest records where each chunk's "
       "frame lies; every reader of the store decodes it "
       "([BLOB_FORMAT.md](BLOB_FORMAT.md#encoded-blobs-on-the-store)). The local and RAM tiers, "
       "the `remote` policy's flush and `local+peer` node uploads store raw bytes",
       StringField(&O::remote_codec)},
      {"remote_codec_level", "remote tier: zstd level of remote_codec=zstd (-1000..19)",
       "the zstd level of `remote_codec = zstd`, -1000..19; negative levels are zstd's fast "
       "ones (bench/RESULTS.md \"Codecs\")",
       SignedIntField(&O::remote_codec_level, "remote_codec_level")},
      {"remote_s3_bucket", "remote tier: an S3 bucket (with remote_s3_endpoint)",
       "the remote tier: an S3 bucket (exclusive with `remote_dir`; needs `remote_s3_endpoint`)",
       StringField(&O::remote_s3_bucket), "(none)"},
      {"remote_s3_endpoint", "remote tier: the S3 endpoint, http(s)://host[:port]",
       "`http(s)://host[:port]` of the S3-compatible store", StringField(&O::remote_s3_endpoint),
       "(none)"},
      {"remote_s3_prefix", "remote tier: key prefix in the bucket", "key prefix inside the bucket",
       StringField(&O::remote_s3_prefix), "(none)"},
      {"remote_s3_region", "remote tier: SigV4 region", "SigV4 region",
       StringField(&O::remote_s3_region)},
      {"remote_s3_path_style", "remote tier: path-style addressing",
       "path-style addressing (MinIO, Ceph, SeaweedFS); false: virtual-host (AWS)",
       BoolField(&O::remote_s3_path_style, "remote_s3_path_style")},
      {"remote_s3_tls_verify", "remote tier: verify TLS certificates",
       "verify the store's TLS certificate",
       BoolField(&O::remote_s3_tls_verify, "remote_s3_tls_verify")},
      {"remote_s3_ca_path", "remote tier: CA bundle file", "CA bundle for TLS verification",
       StringField(&O::remote_s3_ca_path), "(system)"},
      {"remote_s3_part_size_bytes", "remote tier: multipart part size",
       "multipart part size (5 MiB–5 GiB)",
       IntField(&O::remote_s3_part_size_bytes, "remote_s3_part_size_bytes")},
      {"remote_s3_parts_in_flight", "remote tier: parts uploaded at once per blob",
       "parts uploaded at once per blob",
       IntField(&O::remote_s3_parts_in_flight, "remote_s3_parts_in_flight")},
      {"keep_local", "retention: local copies kept per job (0: all)",
       "[retention](OPERATIONS.md#retention): local copies kept per job (0: all)",
       IntField(&O::keep_local, "keep_local")},
      {"keep_remote", "retention: remote copies kept per job (0: all)",
       "[retention](OPERATIONS.md#retention): remote copies kept per job (0: all); needs a remote "
       "tier",
       IntField(&O::keep_remote, "keep_remote")},
      {"keep_every", "retention: every copy of steps that are multiples of this is kept (0: none)",
       "[retention](OPERATIONS.md#retention): milestones — checkpoints whose step is a multiple of "
       "this keep "
       "every copy (they count among the newest `keep_local` / `keep_remote`); 0: none",
       IntField(&O::keep_every, "keep_every")},
      {"remote_every",
       "local+peer: steps that are multiples of this are also copied to the store (0: none)",
       "[committing at the peer tier](PEERS.md#committing-at-the-peer-tier): a checkpoint "
       "committed under `local+peer` whose step is a multiple of this is also copied to the "
       "remote tier after its commit, in the background, each node its own blobs; 0: none goes "
       "to the store",
       IntField(&O::remote_every, "remote_every")},
      {"deltas", "reference the shards a checkpoint did not change in the previous one",
       "[deltas](USER_GUIDE.md#deltas): a rank's flush references the shards that did not change "
       "since the job's previous checkpoint on this node (checked by checksum, then byte by byte "
       "against that checkpoint's blob) instead of writing them again; per job in "
       "`retention_rules` (`deltas=0|1`)",
       BoolField(&O::deltas, "deltas")},
      {"delta_live_min_percent",
       "deltas: share an earlier blob only when this percent of it is referenced",
       "[deltas](USER_GUIDE.md#deltas): an earlier checkpoint's blob is shared only when the "
       "shards referenced in it are at least this percent of its bytes (1..100); else they are "
       "written again",
       IntField(&O::delta_live_min_percent, "delta_live_min_percent")},
      {"retention_rules", "per-job retention: PATTERN: key=N, ...; ...",
       "[retention](OPERATIONS.md#retention) per job: `PATTERN: keep_local=N, keep_remote=N, "
       "keep_every=N, remote_every=N, deltas=0|1; "
       "PATTERN2: ...` — the first rule whose shell glob matches the job name sets what it names; "
       "the rest, and jobs no rule matches, take the options above",
       StringField(&O::retention_rules), "(none)"},
      {"gc_interval_ms", "how often retention is applied",
       "how often housekeeping applies retention", IntField(&O::gc_interval_ms, "gc_interval_ms")},
      {"node_id", "this daemon's name on the shared tier (default: the host name)",
       "[spanning nodes](OPERATIONS.md#checkpoints-that-span-nodes): this daemon's name on the "
       "shared tier "
       "(letters, digits, `.-_`, ≤ 64); one per daemon of a job",
       StringField(&O::node_id), "the host name"},
      {"peer_listen_addr",
       "host:port of the peer channel for other daemons (mutual TLS; empty: off)",
       "[peers](PEERS.md): host:port of a TCP listener for other daemons only (never the "
       "client API), gRPC over mutual TLS; empty: off",
       StringField(&O::peer_listen_addr), "(off)"},
      {"peer_tls_ca_path", "PEM file of the CA signing every daemon's peer certificate",
       "[peers](PEERS.md): PEM file of the CA that signs every daemon's certificate; "
       "required with `peer_listen_addr`",
       StringField(&O::peer_tls_ca_path)},
      {"peer_tls_cert_path", "PEM file of this daemon's peer certificate (names node_id)",
       "[peers](PEERS.md): PEM file of this daemon's certificate; its subject CN or a DNS "
       "subjectAltName is `node_id`",
       StringField(&O::peer_tls_cert_path)},
      {"peer_tls_key_path", "PEM file of the peer certificate's key",
       "[peers](PEERS.md): PEM file of the certificate's private key",
       StringField(&O::peer_tls_key_path)},
      {"peer_bytes_max", "memory for copies other nodes place here (0: none)",
       "[peers](PEERS.md): memory for the copies other nodes place here, apart from "
       "staging; 0: none (puts refused)",
       IntField(&O::peer_bytes_max, "peer_bytes_max")},
      {"peer_streams_per_node_max", "peer streams in flight per peer node",
       "[peers](PEERS.md): PutBlob and GetBlob streams in flight per peer node",
       IntField(&O::peer_streams_per_node_max, "peer_streams_per_node_max")},
      {"peer_inflight_bytes_per_node_max", "bytes a peer node may be sending here at once",
       "[peers](PEERS.md): bytes of the copies one peer node may be sending here at once",
       IntField(&O::peer_inflight_bytes_per_node_max, "peer_inflight_bytes_per_node_max")},
      {"peer_replicas", "other nodes receiving a copy of this node's part (0: none)",
       "[peers](PEERS.md#replication): how many other nodes' peer stores receive a copy of this "
       "node's part of each checkpoint spanning nodes; 0: none",
       IntField(&O::peer_replicas, "peer_replicas")},
      {"peer_repair_interval_ms", "how often this node checks its peers still hold its part",
       "[peers](PEERS.md#repair): how often this node checks that the peers holding its part "
       "of each job's newest checkpoint committed at the peer tier still hold it, and copies "
       "it to the next nodes when one lost it; 0: never",
       IntField(&O::peer_repair_interval_ms, "peer_repair_interval_ms")},
      {"peer_stall_timeout_ms", "a peer call without progress this long is cancelled",
       "[peers](PEERS.md#failures-between-peers): a call to a peer (a copy, a read, a check) with "
       "no progress this long is cancelled and the copy goes to the next node; the peer listener "
       "closes a connection whose pings go unanswered this long",
       IntField(&O::peer_stall_timeout_ms, "peer_stall_timeout_ms")},
      {"peer_advertise_addr", "host:port other daemons reach this peer listener at",
       "[peers](PEERS.md#replication): host:port other daemons reach this daemon's peer "
       "listener at, registered on the shared tier; empty: `peer_listen_addr`",
       StringField(&O::peer_advertise_addr), "(peer_listen_addr)"},
      {"peer_failure_domain",
       "this node's failure domain (a rack...); copies go to other domains first",
       "[peers](PEERS.md#replication): this node's failure domain (a rack, a switch, a power "
       "feed; letters, digits, `.-_`, at most 64), registered on the shared tier: its copies go "
       "first to nodes of other domains, then to the rest in ring order; empty: none",
       StringField(&O::peer_failure_domain), "(none)"},
      {"owner_map", "how an adopted checkpoint's recorded owner maps to a uid here: uid|name",
       "how the owner recorded in a checkpoint another node wrote becomes a uid here when it "
       "is adopted (docs/SECURITY.md \"Ownership\"): `uid` (the numeric uid: nodes share one uid "
       "space) or `name` (the user name, looked up in `owner_map_file`, then the passwd database)",
       StringField(&O::owner_map)},
      {"owner_map_file", "a file of NAME UID lines naming owners (read once at start)",
       "a file of `NAME UID` lines (`#` comments), read once at start: the uid of each name "
       "here (owner_map = name, before the passwd database) and the name recorded for each uid",
       StringField(&O::owner_map_file), "(none)"},
      {"cluster_poll_ms", "how often a checkpoint spanning nodes reads the shared tier",
       "spanning nodes: how often the shared tier is read (the parts, or the decision); bounds "
       "the commit latency across nodes",
       IntField(&O::cluster_poll_ms, "cluster_poll_ms")},
      {"store_discovery_wait_ms",
       "how long a question about a job waits for a scan of the store (0: at start only)",
       "how long a question about a job (Load of `latest`, Latest, List, Status, Inspect, a "
       "Load of an unknown step) waits for a scan of the store for checkpoints other daemons "
       "committed; the answer comes from the index either way; 0: the store is scanned at "
       "start only",
       IntField(&O::store_discovery_wait_ms, "store_discovery_wait_ms")},
      {"log_format", "text or json", "`text` or `json`", StringField(&O::log_format)},
      {"log_level", "trace|debug|info|warn|error", "trace, debug, info, warn, error",
       StringField(&O::log_level)},
      {"debug_flush_delay_ms", "testing: delay every flush",
       "testing only: delay every flush (makes crash windows deterministic)",
       IntField(&O::debug_flush_delay_ms, "debug_flush_delay_ms")},
      {"debug_load_delay_ms", "testing: delay every load after leasing its destinations",
       "testing only: delay every load after its destinations are leased",
       IntField(&O::debug_load_delay_ms, "debug_load_delay_ms")},
      {"debug_reshard_delay_ms", "testing: delay every reshard chunk",
       "testing only: delay every chunk an offline reshard copies",
       IntField(&O::debug_reshard_delay_ms, "debug_reshard_delay_ms")},
      {"debug_upload_delay_ms", "testing: delay every upload chunk",
       "testing only: delay every chunk an upload to the remote tier writes (a slow store)",
       IntField(&O::debug_upload_delay_ms, "debug_upload_delay_ms")},
      {"debug_crash_at",
       "testing: <point>[:<nth>] kills the daemon at a crash point (test builds only)",
       "testing only: `<point>[:<nth>]` — the daemon SIGKILLs itself the nth time (default 1) "
       "it reaches that [crash point](DEVELOPMENT.md#crash-point-matrix); refused by a build "
       "without test "
       "hooks",
       StringField(&O::debug_crash_at), "(none)"},
  };
  return *defs;
}

const OptionDef* FindOptionDef(const std::string& name) {
  for (const OptionDef& d : OptionDefs()) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

}  // namespace options_internal
}  // namespace ckptd
