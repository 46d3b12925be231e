#include "options.h"

#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "ckptd/status.h"
#include "ckptd/sync_point.h"
#include "common/limits.h"

namespace ckptd {
namespace {

using Setter = std::function<absl::Status(DaemonOptions&, absl::string_view)>;

struct OptionDef {
  std::string help;
  Setter set;
};

Setter StringSetter(std::string DaemonOptions::*field) {
  return [field](DaemonOptions& o, absl::string_view v) {
    o.*field = std::string(v);
    return absl::OkStatus();
  };
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

const std::map<std::string, OptionDef>& Defs() {
  using O = DaemonOptions;
  static const auto* defs = new std::map<std::string, OptionDef>{
      {"state_dir", {"index, socket and default data dir", StringSetter(&O::state_dir)}},
      {"data_dir", {"blobs and manifests (default <state_dir>/data)", StringSetter(&O::data_dir)}},
      {"socket",
       {"unix socket path (default <state_dir>/ckptd.sock)", StringSetter(&O::socket_path)}},
      {"staging_bytes_max",
       {"staging arena bytes", IntSetter(&O::staging_bytes_max, "staging_bytes_max")}},
      {"staging_prefault",
       {"pre-fault the arena", BoolSetter(&O::staging_prefault, "staging_prefault")}},
      {"ram_tier_bytes_max",
       {"arena bytes kept hot for restores (0: up to the whole arena)",
        IntSetter(&O::ram_tier_bytes_max, "ram_tier_bytes_max")}},
      {"ram_tier_keep_per_job",
       {"hot checkpoints per job (0: no RAM tier)",
        IntSetter(&O::ram_tier_keep_per_job, "ram_tier_keep_per_job")}},
      {"staging_mlock", {"mlock the arena", BoolSetter(&O::staging_mlock, "staging_mlock")}},
      {"stage_timeout_ms",
       {"abort checkpoints short of ranks after this",
        IntSetter(&O::stage_timeout_ms, "stage_timeout_ms")}},
      {"reserve_timeout_ms",
       {"wait for arena space at most this",
        IntSetter(&O::reserve_timeout_ms, "reserve_timeout_ms")}},
      {"io_queue_depth",
       {"I/Os in flight per batch", IntSetter(&O::io_queue_depth, "io_queue_depth")}},
      {"direct_io", {"use O_DIRECT", BoolSetter(&O::direct_io, "direct_io")}},
      {"load_io",
       {"loads read the local tier auto (what the page cache holds through it, the rest "
        "O_DIRECT), direct (O_DIRECT) or buffered (the page cache)",
        StringSetter(&O::load_io)}},
      {"flush_threads", {"flush/commit threads", IntSetter(&O::flush_threads, "flush_threads")}},
      {"flush_gate_ms",
       {"max wait for a checkpoint's other ranks before flushing",
        IntSetter(&O::flush_gate_ms, "flush_gate_ms")}},
      {"checksum_block_bytes",
       {"bytes per shard checksum block",
        IntSetter(&O::checksum_block_bytes, "checksum_block_bytes")}},
      {"load_buffer_bytes",
       {"read buffer per load", IntSetter(&O::load_buffer_bytes, "load_buffer_bytes")}},
      {"load_threads", {"load threads", IntSetter(&O::load_threads, "load_threads")}},
      {"load_into_destination",
       {"read whole shards straight into their destinations",
        BoolSetter(&O::load_into_destination, "load_into_destination")}},
      {"load_copy_threads",
       {"threads verifying and copying one load (0: one per CPU, at most 16)",
        IntSetter(&O::load_copy_threads, "load_copy_threads")}},
      {"rpc_threads", {"quick RPC threads", IntSetter(&O::rpc_threads, "rpc_threads")}},
      {"rpc_queue_max",
       {"queued RPCs before RESOURCE_EXHAUSTED", IntSetter(&O::rpc_queue_max, "rpc_queue_max")}},
      {"waiters_max", {"RPCs blocked at once", IntSetter(&O::waiters_max, "waiters_max")}},
      {"shutdown_grace_s",
       {"SIGTERM waits this long for flushes",
        IntSetter(&O::shutdown_grace_s, "shutdown_grace_s")}},
      {"log_format", {"text or json", StringSetter(&O::log_format)}},
      {"tier_policy",
       {"tiers of a checkpoint whose Save names none: local | local+remote | remote",
        StringSetter(&O::tier_policy)}},
      {"remote_dir",
       {"remote tier: a directory on a shared file system", StringSetter(&O::remote_dir)}},
      {"remote_s3_bucket",
       {"remote tier: an S3 bucket (with remote_s3_endpoint)", StringSetter(&O::remote_s3_bucket)}},
      {"remote_s3_endpoint",
       {"remote tier: the S3 endpoint, http(s)://host[:port]",
        StringSetter(&O::remote_s3_endpoint)}},
      {"remote_s3_prefix",
       {"remote tier: key prefix in the bucket", StringSetter(&O::remote_s3_prefix)}},
      {"remote_s3_region", {"remote tier: SigV4 region", StringSetter(&O::remote_s3_region)}},
      {"remote_s3_path_style",
       {"remote tier: path-style addressing",
        BoolSetter(&O::remote_s3_path_style, "remote_s3_path_style")}},
      {"remote_s3_tls_verify",
       {"remote tier: verify TLS certificates",
        BoolSetter(&O::remote_s3_tls_verify, "remote_s3_tls_verify")}},
      {"remote_s3_ca_path", {"remote tier: CA bundle file", StringSetter(&O::remote_s3_ca_path)}},
      {"remote_s3_part_size_bytes",
       {"remote tier: multipart part size",
        IntSetter(&O::remote_s3_part_size_bytes, "remote_s3_part_size_bytes")}},
      {"remote_s3_parts_in_flight",
       {"remote tier: parts uploaded at once per blob",
        IntSetter(&O::remote_s3_parts_in_flight, "remote_s3_parts_in_flight")}},
      {"keep_local",
       {"retention: local copies kept per job (0: all)", IntSetter(&O::keep_local, "keep_local")}},
      {"keep_remote",
       {"retention: remote copies kept per job (0: all)",
        IntSetter(&O::keep_remote, "keep_remote")}},
      {"gc_interval_ms",
       {"how often retention is applied", IntSetter(&O::gc_interval_ms, "gc_interval_ms")}},
      {"node_id",
       {"this daemon's name on the shared tier (default: the host name)",
        StringSetter(&O::node_id)}},
      {"cluster_poll_ms",
       {"how often a checkpoint spanning nodes reads the shared tier",
        IntSetter(&O::cluster_poll_ms, "cluster_poll_ms")}},
      {"store_discovery_wait_ms",
       {"how long a question about a job waits for a scan of the store (0: at start only)",
        IntSetter(&O::store_discovery_wait_ms, "store_discovery_wait_ms")}},
      {"upload_threads",
       {"threads uploading to the remote tier", IntSetter(&O::upload_threads, "upload_threads")}},
      {"upload_chunk_bytes",
       {"bytes per upload read/write", IntSetter(&O::upload_chunk_bytes, "upload_chunk_bytes")}},
      {"upload_retry_max_ms",
       {"longest backoff between upload attempts",
        IntSetter(&O::upload_retry_max_ms, "upload_retry_max_ms")}},
      {"socket_mode",
       {"socket permission bits, octal (0600 or 0660)", OctalSetter(&O::socket_mode)}},
      {"socket_group",
       {"group that may connect and map the arena", StringSetter(&O::socket_group)}},
      {"metrics_address",
       {"Prometheus endpoint: PORT or :PORT (loopback), HOST:PORT; empty: off",
        StringSetter(&O::metrics_address)}},
      {"admin_group", {"group that may read and delete every job", StringSetter(&O::admin_group)}},
      {"log_level", {"trace|debug|info|warn|error", StringSetter(&O::log_level)}},
      {"debug_flush_delay_ms",
       {"testing: delay every flush", IntSetter(&O::debug_flush_delay_ms, "debug_flush_delay_ms")}},
      {"index_reserve_bytes",
       {"free bytes kept on the index volume; saves refused below",
        IntSetter(&O::index_reserve_bytes, "index_reserve_bytes")}},
      {"debug_load_delay_ms",
       {"testing: delay every load after leasing its destinations",
        IntSetter(&O::debug_load_delay_ms, "debug_load_delay_ms")}},
      {"debug_reshard_delay_ms",
       {"testing: delay every reshard chunk",
        IntSetter(&O::debug_reshard_delay_ms, "debug_reshard_delay_ms")}},
      {"debug_crash_at",
       {"testing: <point>[:<nth>] kills the daemon at a crash point (test "
        "builds only)",
        StringSetter(&O::debug_crash_at)}},
  };
  return *defs;
}

absl::Status SetOption(DaemonOptions& o, std::string name, absl::string_view value,
                       absl::string_view where) {
  absl::StrReplaceAll({{"-", "_"}}, &name);
  auto it = Defs().find(name);
  if (it == Defs().end()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unknown option \"", name, "\" (see --help)"));
  }
  return Annotate(it->second.set(o, value), std::string(where));
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

absl::Status DaemonOptions::Validate() {
  CKPTD_RETURN_IF_ERROR(ValidatePaths(*this));
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
  CKPTD_RETURN_IF_ERROR(Range("gc_interval_ms", gc_interval_ms, 1000, 86'400'000));
  CKPTD_RETURN_IF_ERROR(Range("cluster_poll_ms", cluster_poll_ms, 10, 60'000));
  CKPTD_RETURN_IF_ERROR(Range("store_discovery_wait_ms", store_discovery_wait_ms, 0, 600'000));

  return Range("upload_retry_max_ms", upload_retry_max_ms, 1000, 3'600'000);
}

std::string OptionsUsage() {
  std::ostringstream out;
  out << "usage: ckptd [--config=PATH] [--name=value ...]\n\noptions:\n";
  for (const auto& [name, def] : Defs()) out << "  --" << name << "  " << def.help << "\n";
  out << "  --config  file of \"name = value\" lines (flags override it)\n";
  return out.str();
}

absl::StatusOr<DaemonOptions> ParseOptions(const std::vector<std::string>& args) {
  DaemonOptions o;
  std::vector<std::pair<std::string, std::string>> flags;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view a = args[i];
    if (a == "--help" || a == "-h") return absl::NotFoundError(OptionsUsage());
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
