#include "options.h"

#include <fnmatch.h>
#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/limits.h"

namespace ckptd {
namespace {

using Setter = std::function<absl::Status(DaemonOptions&, absl::string_view)>;
// An option's value in `o` as the configuration reference shows a default (Markdown).
using Getter = std::function<std::string(const DaemonOptions&)>;

struct Field {
  Setter set;
  Getter get;
};

// One option: its name, a line for --help, its documentation for the configuration reference
// (README "Configuration", printed by --help-config), and its field. `default_doc` is the
// default as the reference shows it when the field's own default is not it (a derived default:
// "`<state_dir>/data`", "(none)"); empty: the default-constructed DaemonOptions' value.
struct OptionDef {
  std::string name;
  std::string help;
  std::string doc;
  Field field;
  std::string default_doc;
};

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

// A group name or number; -1 for "".
absl::StatusOr<int64_t> ResolveGroup(const std::string& name, const char* option) {
  if (name.empty()) return -1;
  uint32_t gid = 0;
  if (absl::SimpleAtoi(name, &gid)) return gid;
  struct group g;
  struct group* found = nullptr;
  std::vector<char> buf(16384);
  if (getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("option ", option, ": no group named \"", name, "\""));
  }
  return found->gr_gid;
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

// Every option, in the order of the configuration reference.
const std::vector<OptionDef>& Defs() {
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
       "port ([Metrics](#metrics-prometheus))",
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
      {"index_reserve_bytes", "free bytes kept on the index volume; saves refused below",
       "free bytes kept on the index's volume: a Save (new work) is `RESOURCE_EXHAUSTED` "
       "naming this option when less is free, so commits, aborts and deletes of work already "
       "journaled can still be written",
       IntField(&O::index_reserve_bytes, "index_reserve_bytes")},
      {"shutdown_grace_s", "SIGTERM waits this long for flushes",
       "SIGTERM waits this long for flushes", IntField(&O::shutdown_grace_s, "shutdown_grace_s")},
      {"tier_policy", "tiers of a checkpoint whose Save names none: local | local+remote | remote",
       "tiers of a checkpoint whose Save names none: `local`, `local+remote` or `remote` (the "
       "last two need a remote tier: `remote_dir` or `remote_s3_bucket`); see "
       "[Tiers](#tiers-local-and-remote)",
       StringField(&O::tier_policy)},
      {"remote_dir", "remote tier: a directory on a shared file system",
       "the remote tier: a directory on a shared file system; must exist at start",
       StringField(&O::remote_dir), "(none)"},
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
       "[retention](#retention): local copies kept per job (0: all)",
       IntField(&O::keep_local, "keep_local")},
      {"keep_remote", "retention: remote copies kept per job (0: all)",
       "[retention](#retention): remote copies kept per job (0: all); needs a remote tier",
       IntField(&O::keep_remote, "keep_remote")},
      {"keep_every", "retention: every copy of steps that are multiples of this is kept (0: none)",
       "[retention](#retention): milestones — checkpoints whose step is a multiple of this keep "
       "every copy (they count among the newest `keep_local` / `keep_remote`); 0: none",
       IntField(&O::keep_every, "keep_every")},
      {"retention_rules", "per-job retention: PATTERN: key=N, ...; ...",
       "[retention](#retention) per job: `PATTERN: keep_local=N, keep_remote=N, keep_every=N; "
       "PATTERN2: ...` — the first rule whose shell glob matches the job name sets what it names; "
       "the rest, and jobs no rule matches, take the options above",
       StringField(&O::retention_rules), "(none)"},
      {"gc_interval_ms", "how often retention is applied",
       "how often housekeeping applies retention", IntField(&O::gc_interval_ms, "gc_interval_ms")},
      {"node_id", "this daemon's name on the shared tier (default: the host name)",
       "[spanning nodes](#checkpoints-that-span-nodes): this daemon's name on the shared tier "
       "(letters, digits, `.-_`, ≤ 64); one per daemon of a job",
       StringField(&O::node_id), "the host name"},
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
      {"debug_crash_at",
       "testing: <point>[:<nth>] kills the daemon at a crash point (test builds only)",
       "testing only: `<point>[:<nth>]` — the daemon SIGKILLs itself the nth time (default 1) "
       "it reaches that [crash point](#crash-point-matrix); refused by a build without test "
       "hooks",
       StringField(&O::debug_crash_at), "(none)"},
  };
  return *defs;
}

const OptionDef* FindDef(const std::string& name) {
  for (const OptionDef& d : Defs()) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

absl::Status SetOption(DaemonOptions& o, std::string name, absl::string_view value,
                       absl::string_view where) {
  absl::StrReplaceAll({{"-", "_"}}, &name);
  const OptionDef* def = FindDef(name);
  if (def == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown option \"", name, "\" (see --help)"));
  }
  return Annotate(def->field.set(o, value), std::string(where));
}

absl::Status LoadConfigFile(DaemonOptions& o, const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config file ", path, " cannot be read"));
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#') continue;
    size_t eq = l.find('=');
    std::string where = absl::StrCat(path, ":", lineno);
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected \"name = value\""));
    }
    std::string name(absl::StripAsciiWhitespace(l.substr(0, eq)));
    absl::string_view value = absl::StripAsciiWhitespace(l.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    CKPTD_RETURN_IF_ERROR(SetOption(o, name, value, where));
  }
  return absl::OkStatus();
}

absl::Status Range(absl::string_view name, uint64_t v, uint64_t lo, uint64_t hi) {
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("option ", name, " = ", v, " is outside [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

// retention_rules, each key not named taking the option's value.
absl::StatusOr<std::vector<DaemonOptions::RetentionRule>> ParseRetentionRules(
    const DaemonOptions& o) {
  std::vector<DaemonOptions::RetentionRule> rules;
  int n = 0;
  for (absl::string_view text : absl::StrSplit(o.retention_rules, ';')) {
    text = absl::StripAsciiWhitespace(text);
    if (text.empty()) continue;
    ++n;
    auto fail = [&](absl::string_view why) {
      return absl::InvalidArgumentError(
          absl::StrCat("option retention_rules: rule ", n, " (\"", text, "\"): ", why));
    };
    const size_t colon = text.find(':');
    if (colon == absl::string_view::npos) return fail("expected \"PATTERN: key=N, ...\"");
    DaemonOptions::RetentionRule r{
        .pattern = std::string(absl::StripAsciiWhitespace(text.substr(0, colon))),
        .keep_local = o.keep_local,
        .keep_remote = o.keep_remote,
        .keep_every = o.keep_every};
    if (r.pattern.empty()) return fail("the job pattern is empty");
    for (absl::string_view kv :
         absl::StrSplit(text.substr(colon + 1), ',', absl::SkipWhitespace())) {
      const size_t eq = kv.find('=');
      const absl::string_view key = absl::StripAsciiWhitespace(kv.substr(0, eq));
      const absl::string_view value =
          eq == absl::string_view::npos ? "" : absl::StripAsciiWhitespace(kv.substr(eq + 1));
      uint64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) {
        return fail(absl::StrCat("\"", kv, "\" is not key=N with N a non-negative integer"));
      }
      if (key == "keep_local" || key == "keep_remote") {
        if (v > UINT32_MAX) return fail(absl::StrCat(key, " = ", v, " is too large"));
        (key == "keep_local" ? r.keep_local : r.keep_remote) = static_cast<uint32_t>(v);
      } else if (key == "keep_every") {
        r.keep_every = v;
      } else {
        return fail(
            absl::StrCat("unknown key \"", key, "\" (keep_local, keep_remote, keep_every)"));
      }
    }
    rules.push_back(std::move(r));
  }
  return rules;
}

// Validate's parts.
// The state dir, socket and groups; fills in the derived paths and group ids.
absl::Status ValidatePaths(DaemonOptions& o) {
  if (o.state_dir.empty()) return absl::InvalidArgumentError("option state_dir is empty");
  if ((o.socket_mode & 0600) != 0600 || (o.socket_mode & 0007) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "option socket_mode = 0%o must give the owner read+write and others nothing (0600, "
        "0660 ...)",
        o.socket_mode));
  }
  CKPTD_ASSIGN_OR_RETURN(o.socket_gid, ResolveGroup(o.socket_group, "socket_group"));
  CKPTD_ASSIGN_OR_RETURN(o.admin_gid, ResolveGroup(o.admin_group, "admin_group"));
  while (o.state_dir.size() > 1 && o.state_dir.back() == '/') o.state_dir.pop_back();
  if (o.data_dir.empty()) o.data_dir = o.state_dir + "/data";
  if (o.socket_path.empty()) o.socket_path = o.state_dir + "/ckptd.sock";
  // sockaddr_un.sun_path holds 108 bytes including the terminating NUL, and the arena socket
  // beside it appends ".arena" (rpc/arena_fd_server.h).
  if (o.socket_path.size() > 101) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option socket: path \"", o.socket_path, "\" is ", o.socket_path.size(),
        " bytes; it must fit in 101 bytes (a unix socket path holds 107, and the arena socket "
        "beside it appends \".arena\"; set --socket to a shorter path)"));
  }
  return absl::OkStatus();
}

// Every numeric option within its range (and the sizes' alignment).
absl::Status ValidateRanges(const DaemonOptions& o) {
  CKPTD_RETURN_IF_ERROR(Range("staging_bytes_max", o.staging_bytes_max, limits::kStagingBytesMin,
                              limits::kStagingBytesMax));
  if (o.staging_bytes_max % limits::kAlignmentBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option staging_bytes_max = ", o.staging_bytes_max, " is not a multiple of 4096"));
  }
  if (o.load_io != "auto" && o.load_io != "direct" && o.load_io != "buffered") {
    return absl::InvalidArgumentError(
        absl::StrCat("option load_io = \"", o.load_io, "\": expected auto, direct or buffered"));
  }
  CKPTD_RETURN_IF_ERROR(Range("ram_tier_bytes_max", o.ram_tier_bytes_max, 0, o.staging_bytes_max));
  CKPTD_RETURN_IF_ERROR(Range("ram_tier_keep_per_job", o.ram_tier_keep_per_job, 0, 64));
  CKPTD_RETURN_IF_ERROR(Range("stage_timeout_ms", o.stage_timeout_ms, 100, 604'800'000));  // 7 days
  CKPTD_RETURN_IF_ERROR(Range("reserve_timeout_ms", o.reserve_timeout_ms, 0, 3'600'000));
  CKPTD_RETURN_IF_ERROR(Range("io_queue_depth", o.io_queue_depth, 1, limits::kIoQueueDepthMax));
  CKPTD_RETURN_IF_ERROR(Range("checksum_block_bytes", o.checksum_block_bytes, 4096, 16 << 20));
  if ((o.checksum_block_bytes & (o.checksum_block_bytes - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option checksum_block_bytes = ", o.checksum_block_bytes, " is not a power of two"));
  }
  CKPTD_RETURN_IF_ERROR(Range("load_buffer_bytes", o.load_buffer_bytes,
                              uint64_t{2} * o.checksum_block_bytes, uint64_t{1} << 34));
  if (o.load_buffer_bytes % limits::kAlignmentBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option load_buffer_bytes = ", o.load_buffer_bytes, " is not a multiple of 4096"));
  }
  CKPTD_RETURN_IF_ERROR(Range("flush_threads", o.flush_threads, 1, 256));
  CKPTD_RETURN_IF_ERROR(Range("flush_gate_ms", o.flush_gate_ms, 0, 600000));
  CKPTD_RETURN_IF_ERROR(Range("load_threads", o.load_threads, 1, 256));
  CKPTD_RETURN_IF_ERROR(
      Range("load_copy_threads", o.load_copy_threads, 0, limits::kLoadCopyThreadsMax));
  CKPTD_RETURN_IF_ERROR(Range("rpc_threads", o.rpc_threads, 1, 256));
  CKPTD_RETURN_IF_ERROR(Range("rpc_queue_max", o.rpc_queue_max, 1, 1 << 20));
  CKPTD_RETURN_IF_ERROR(Range("waiters_max", o.waiters_max, 1, 4096));
  CKPTD_RETURN_IF_ERROR(Range("shutdown_grace_s", o.shutdown_grace_s, 0, 3600));
  CKPTD_RETURN_IF_ERROR(Range("debug_flush_delay_ms", o.debug_flush_delay_ms, 0, 3'600'000));
  CKPTD_RETURN_IF_ERROR(Range("debug_load_delay_ms", o.debug_load_delay_ms, 0, 3'600'000));
  CKPTD_RETURN_IF_ERROR(Range("debug_reshard_delay_ms", o.debug_reshard_delay_ms, 0, 60'000));
  return absl::OkStatus();
}

// The node's name on a shared tier (the host name unless given), logging and the test hooks.
absl::Status ValidateNodeAndLogging(DaemonOptions& o) {
  if (!o.debug_crash_at.empty()) {
    if (!kTestHooks) {
      return absl::InvalidArgumentError(
          absl::StrCat("option debug_crash_at = \"", o.debug_crash_at,
                       "\": this ckptd was built without test "
                       "hooks (CKPTD_TEST_HOOKS=OFF, a release build), so it has no crash points"));
    }
    CKPTD_RETURN_IF_ERROR(
        Annotate(ParseSyncPointCrash(o.debug_crash_at).status(), "option debug_crash_at"));
  }
  if (o.node_id.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
      return absl::InvalidArgumentError("option node_id: not given, and the host has no name");
    }
    o.node_id = host;
  }
  const bool node_id_ok =
      o.node_id.size() <= 64 && std::all_of(o.node_id.begin(), o.node_id.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
      });
  if (!node_id_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("option node_id = \"", o.node_id,
                     "\": at most 64 letters, digits, '.', '-' or '_' (it names a file on the "
                     "shared tier)"));
  }
  if (o.log_format != "text" && o.log_format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("option log_format = \"", o.log_format, "\": expected text or json"));
  }
  static const char* kLevels[] = {"trace", "debug", "info", "warn", "error"};
  bool level_ok = false;
  for (const char* l : kLevels) level_ok |= (o.log_level == l);
  if (!level_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option log_level = \"", o.log_level, "\": expected trace, debug, info, warn or error"));
  }
  return absl::OkStatus();
}

}  // namespace

DaemonOptions::RetentionRule DaemonOptions::RetentionOf(const std::string& job) const {
  for (const RetentionRule& r : retention) {
    if (fnmatch(r.pattern.c_str(), job.c_str(), 0) == 0) return r;
  }
  return RetentionRule{.pattern = "",
                       .keep_local = keep_local,
                       .keep_remote = keep_remote,
                       .keep_every = keep_every};
}

bool DaemonOptions::RetentionOn() const {
  if (keep_local > 0 || keep_remote > 0) return true;
  return std::any_of(retention.begin(), retention.end(),
                     [](const RetentionRule& r) { return r.keep_local > 0 || r.keep_remote > 0; });
}

absl::Status DaemonOptions::Validate() {
  CKPTD_RETURN_IF_ERROR(ValidatePaths(*this));
  CKPTD_ASSIGN_OR_RETURN(retention, ParseRetentionRules(*this));
  CKPTD_RETURN_IF_ERROR(ValidateRanges(*this));
  CKPTD_RETURN_IF_ERROR(ValidateTiers());
  return ValidateNodeAndLogging(*this);
}

absl::Status DaemonOptions::ValidateTiers() const {
  if (tier_policy != "local" && tier_policy != "local+remote" && tier_policy != "remote") {
    return absl::InvalidArgumentError(absl::StrCat("option tier_policy = \"", tier_policy,
                                                   "\": expected local, local+remote or remote"));
  }
  if (!remote_dir.empty() && !remote_s3_bucket.empty()) {
    return absl::InvalidArgumentError(
        "options remote_dir and remote_s3_bucket both name a remote tier; give one");
  }
  if (tier_policy != "local" && remote_dir.empty() && remote_s3_bucket.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("option tier_policy = \"", tier_policy,
                                                   "\" needs a remote tier (remote_dir or "
                                                   "remote_s3_bucket)"));
  }
  if (!remote_s3_bucket.empty() && remote_s3_endpoint.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("option remote_s3_bucket = \"", remote_s3_bucket,
                                                   "\" needs remote_s3_endpoint"));
  }
  if (!remote_dir.empty() && (remote_dir == data_dir || remote_dir == state_dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("option remote_dir = \"", remote_dir,
                     "\" is the local data or state dir, not a remote tier"));
  }
  CKPTD_RETURN_IF_ERROR(Range("upload_threads", upload_threads, 1, limits::kUploadThreadsMax));
  CKPTD_RETURN_IF_ERROR(Range("upload_chunk_bytes", upload_chunk_bytes, limits::kAlignmentBytes,
                              limits::kUploadChunkBytesMax));
  if (upload_chunk_bytes % limits::kAlignmentBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option upload_chunk_bytes = ", upload_chunk_bytes, " is not a multiple of 4096"));
  }
  if (keep_remote > 0 && remote_dir.empty() && remote_s3_bucket.empty()) {
    return absl::InvalidArgumentError("option keep_remote needs a remote tier");
  }
  for (const RetentionRule& r : retention) {
    if (r.keep_remote > 0 && r.keep_remote != keep_remote && remote_dir.empty() &&
        remote_s3_bucket.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("option retention_rules: the rule for \"",
                                                     r.pattern,
                                                     "\" sets keep_remote, which needs a remote "
                                                     "tier"));
    }
  }
  CKPTD_RETURN_IF_ERROR(Range("gc_interval_ms", gc_interval_ms, 1000, 86'400'000));
  CKPTD_RETURN_IF_ERROR(Range("cluster_poll_ms", cluster_poll_ms, 10, 60'000));
  CKPTD_RETURN_IF_ERROR(Range("store_discovery_wait_ms", store_discovery_wait_ms, 0, 600'000));

  return Range("upload_retry_max_ms", upload_retry_max_ms, 1000, 3'600'000);
}

std::string OptionsUsage() {
  std::ostringstream out;
  out << "usage: ckptd [--config=PATH] [--name=value ...]\n\noptions:\n";
  for (const OptionDef& def : Defs()) out << "  --" << def.name << "  " << def.help << "\n";
  out << "  --config  file of \"name = value\" lines (flags override it)\n";
  out << "  --help-config  the configuration reference (README \"Configuration\"), as Markdown\n";
  return out.str();
}

std::string OptionsReference() {
  const DaemonOptions defaults;
  std::ostringstream out;
  out << "| option | default | meaning |\n|---|---|---|\n";
  for (const OptionDef& def : Defs()) {
    out << "| `" << def.name << "` | "
        << (def.default_doc.empty() ? def.field.get(defaults) : def.default_doc) << " | " << def.doc
        << " |\n";
  }
  return out.str();
}

absl::StatusOr<DaemonOptions> ParseOptions(const std::vector<std::string>& args) {
  DaemonOptions o;
  std::vector<std::pair<std::string, std::string>> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view a = args[i];
    if (a == "--help" || a == "-h") return absl::NotFoundError(OptionsUsage());
    if (a == "--help-config" || a == "--help_config") {
      return absl::NotFoundError(OptionsReference());
    }
    if (!absl::ConsumePrefix(&a, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", a, "\" (options are --name=value)"));
    }
    size_t eq = a.find('=');
    std::string name(a.substr(0, eq));
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(a.substr(eq + 1));
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      value = args[++i];
    }
    flags.emplace_back(name, value);
  }
  for (const auto& [name, value] : flags) {
    if (name == "config") CKPTD_RETURN_IF_ERROR(LoadConfigFile(o, value));
  }
  for (const auto& [name, value] : flags) {
    if (name == "config") continue;
    CKPTD_RETURN_IF_ERROR(SetOption(o, name, value, absl::StrCat("flag --", name)));
  }
  CKPTD_RETURN_IF_ERROR(o.Validate());
  return o;
}

}  // namespace ckptd
