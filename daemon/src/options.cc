#include "options.h"

#include <fnmatch.h>
#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <functional>
#include <sstream>

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
#include "options_table.h"

namespace ckptd {
namespace {

using options_internal::FindOptionDef;
using options_internal::OptionDef;
using options_internal::OptionDefs;

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

absl::Status SetOption(DaemonOptions& o, std::string name, absl::string_view value,
                       absl::string_view where) {
  absl::StrReplaceAll({{"-", "_"}}, &name);
  const OptionDef* def = FindOptionDef(name);
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
        .keep_every = o.keep_every,
        .remote_every = o.remote_every,
        .deltas = o.deltas};
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
      } else if (key == "remote_every") {
        r.remote_every = v;
      } else if (key == "deltas") {
        if (v > 1) return fail(absl::StrCat("deltas = ", v, " is not 0 or 1"));
        r.deltas = v == 1;
      } else {
        return fail(absl::StrCat("unknown key \"", key,
                                 "\" (keep_local, keep_remote, keep_every, remote_every, deltas)"));
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

// remote_codec and its level.
absl::Status ValidateRemoteCodec(const DaemonOptions& o) {
  if (o.remote_codec != "none" && o.remote_codec != "zstd") {
    return absl::InvalidArgumentError(
        absl::StrCat("option remote_codec = \"", o.remote_codec, "\": expected none or zstd"));
  }
  if (o.remote_codec_level < limits::kCodecZstdLevelMin ||
      o.remote_codec_level > limits::kCodecZstdLevelMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("option remote_codec_level = ", o.remote_codec_level, ": a zstd level is ",
                     limits::kCodecZstdLevelMin, "..", limits::kCodecZstdLevelMax));
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
  CKPTD_RETURN_IF_ERROR(Range("delta_live_min_percent", o.delta_live_min_percent, 1, 100));
  CKPTD_RETURN_IF_ERROR(Range("hot_lease_ms", o.hot_lease_ms, 1, 3'600'000));
  CKPTD_RETURN_IF_ERROR(Range("stage_timeout_ms", o.stage_timeout_ms, 100, 604'800'000));  // 7 days
  CKPTD_RETURN_IF_ERROR(Range("peer_stall_timeout_ms", o.peer_stall_timeout_ms,
                              limits::kPeerStallTimeoutMsMin, limits::kPeerCallTimeoutMs));
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
  CKPTD_RETURN_IF_ERROR(Range("uid_share_percent", o.uid_share_percent, 1, 100));
  CKPTD_RETURN_IF_ERROR(Range("uid_arena_share_percent", o.uid_arena_share_percent, 1, 100));
  CKPTD_RETURN_IF_ERROR(Range("connections_max", o.connections_max, 0, 1 << 20));
  CKPTD_RETURN_IF_ERROR(Range("shutdown_grace_s", o.shutdown_grace_s, 0, 3600));
  CKPTD_RETURN_IF_ERROR(Range("debug_flush_delay_ms", o.debug_flush_delay_ms, 0, 3'600'000));
  CKPTD_RETURN_IF_ERROR(Range("debug_load_delay_ms", o.debug_load_delay_ms, 0, 3'600'000));
  CKPTD_RETURN_IF_ERROR(Range("debug_reshard_delay_ms", o.debug_reshard_delay_ms, 0, 60'000));
  CKPTD_RETURN_IF_ERROR(Range("debug_upload_delay_ms", o.debug_upload_delay_ms, 0, 60'000));
  return absl::OkStatus();
}

// owner_map and owner_map_file (common/owner_map.h): the table read once, here.
absl::StatusOr<OwnerMap> ParseOwnerMap(const DaemonOptions& o) {
  std::string table;
  if (!o.owner_map_file.empty()) {
    std::ifstream in(o.owner_map_file, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("option owner_map_file = \"", o.owner_map_file, "\": cannot be read"));
    }
    std::ostringstream text;
    text << in.rdbuf();
    table = text.str();
    if (table.size() > limits::kOwnerMapEntriesMax * (limits::kOwnerNameBytesMax + 16)) {
      return absl::InvalidArgumentError(absl::StrCat("option owner_map_file = \"", o.owner_map_file,
                                                     "\": too large (", table.size(), " bytes)"));
    }
  }
  return OwnerMap::Parse(o.owner_map, table, o.owner_map_file);
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
  auto name_ok = [](const std::string& v) {
    return v.size() <= 64 && std::all_of(v.begin(), v.end(), [](char c) {
             return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
           });
  };
  if (!name_ok(o.node_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("option node_id = \"", o.node_id,
                     "\": at most 64 letters, digits, '.', '-' or '_' (it names a file on the "
                     "shared tier)"));
  }
  if (!name_ok(o.peer_failure_domain)) {
    return absl::InvalidArgumentError(
        absl::StrCat("option peer_failure_domain = \"", o.peer_failure_domain,
                     "\": at most 64 letters, digits, '.', '-' or '_'"));
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
                       .keep_every = keep_every,
                       .remote_every = remote_every,
                       .deltas = deltas};
}

bool DaemonOptions::RetentionOn() const {
  if (keep_local > 0 || keep_remote > 0) return true;
  return std::any_of(retention.begin(), retention.end(),
                     [](const RetentionRule& r) { return r.keep_local > 0 || r.keep_remote > 0; });
}

// The peer channel's options (the certificate files themselves are read and checked when the
// listener starts, peer/peer_tls.h).
static absl::Status ValidatePeer(const DaemonOptions& o) {
  if (o.peer_listen_addr.empty()) {
    if (o.peer_bytes_max > 0) {
      return absl::InvalidArgumentError(
          "option peer_bytes_max: set, but peer_listen_addr is not (no peer can reach the store)");
    }
    return absl::OkStatus();
  }
  for (const auto& [name, value] :
       {std::pair<const char*, const std::string*>{"peer_tls_ca_path", &o.peer_tls_ca_path},
        {"peer_tls_cert_path", &o.peer_tls_cert_path},
        {"peer_tls_key_path", &o.peer_tls_key_path}}) {
    if (value->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "option ", name, ": required with peer_listen_addr (there is no plaintext mode)"));
    }
  }
  if (o.peer_streams_per_node_max == 0 ||
      o.peer_streams_per_node_max > limits::kPeerStreamsPerNodeMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("option peer_streams_per_node_max = ", o.peer_streams_per_node_max,
                     ": expected 1 to kPeerStreamsPerNodeMax = ", limits::kPeerStreamsPerNodeMax));
  }
  if (o.peer_replicas > limits::kPeerReplicasMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("option peer_replicas = ", o.peer_replicas,
                     ": expected 0 to kPeerReplicasMax = ", limits::kPeerReplicasMax));
  }
  if (o.peer_inflight_bytes_per_node_max == 0 ||
      o.peer_inflight_bytes_per_node_max > limits::kPeerInflightBytesPerNodeMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option peer_inflight_bytes_per_node_max = ", o.peer_inflight_bytes_per_node_max,
        ": expected 1 to kPeerInflightBytesPerNodeMax = ", limits::kPeerInflightBytesPerNodeMax));
  }
  return absl::OkStatus();
}

absl::Status DaemonOptions::Validate() {
  CKPTD_RETURN_IF_ERROR(ValidatePaths(*this));
  CKPTD_ASSIGN_OR_RETURN(retention, ParseRetentionRules(*this));
  CKPTD_ASSIGN_OR_RETURN(owners, ParseOwnerMap(*this));
  CKPTD_RETURN_IF_ERROR(ValidateRanges(*this));
  CKPTD_RETURN_IF_ERROR(ValidateTiers());
  CKPTD_RETURN_IF_ERROR(ValidatePeer(*this));
  return ValidateNodeAndLogging(*this);
}

absl::Status DaemonOptions::ValidateTiers() const {
  if (tier_policy != "local" && tier_policy != "local+remote" && tier_policy != "remote" &&
      tier_policy != "local+peer") {
    return absl::InvalidArgumentError(
        absl::StrCat("option tier_policy = \"", tier_policy,
                     "\": expected local, local+remote, remote or local+peer"));
  }
  if (tier_policy == "local+peer" && (peer_listen_addr.empty() || peer_replicas == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("option tier_policy = \"local+peer\" needs the peer tier (peer_listen_addr "
                     "and peer_replicas of at least 1; peer_replicas is ",
                     peer_replicas, ")"));
  }
  if (!remote_dir.empty() && !remote_s3_bucket.empty()) {
    return absl::InvalidArgumentError(
        "options remote_dir and remote_s3_bucket both name a remote tier; give one");
  }
  if (tier_policy != "local" && remote_dir.empty() && remote_s3_bucket.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("option tier_policy = \"", tier_policy,
                                                   "\" needs a remote tier (remote_dir or "
                                                   "remote_s3_bucket; under local+peer it holds "
                                                   "the control files only)"));
  }
  if (remote_dir_link_fallback && remote_dir.empty()) {
    return absl::InvalidArgumentError("option remote_dir_link_fallback needs remote_dir");
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
  CKPTD_RETURN_IF_ERROR(ValidateRemoteCodec(*this));
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
  if (peer_repair_interval_ms != 0) {
    CKPTD_RETURN_IF_ERROR(Range("peer_repair_interval_ms", peer_repair_interval_ms, 50, 3'600'000));
  }
  CKPTD_RETURN_IF_ERROR(Range("store_discovery_wait_ms", store_discovery_wait_ms, 0, 600'000));

  return Range("upload_retry_max_ms", upload_retry_max_ms, 1000, 3'600'000);
}

std::string OptionsUsage() {
  std::ostringstream out;
  out << "usage: ckptd [--config=PATH] [--name=value ...]\n\noptions:\n";
  for (const OptionDef& def : OptionDefs()) out << "  --" << def.name << "  " << def.help << "\n";
  out << "  --config  file of \"name = value\" lines (flags override it)\n";
  out << "  --help-config  the configuration reference (docs/CONFIGURATION.md \"Configuration\"), "
         "as Markdown\n";
  return out.str();
}

std::string OptionsReference() {
  const DaemonOptions defaults;
  std::ostringstream out;
  out << "| option | default | meaning |\n|---|---|---|\n";
  for (const OptionDef& def : OptionDefs()) {
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
