// ckptd: flags/config → DaemonOptions::Validate() → recover → serve on the unix socket until
// SIGTERM/SIGINT, then finish or journal in-flight work and exit.
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "ckptd/status.h"
#include "ckptd/storage.h"
#include "ckptd/storage_registry.h"
#include "ckptd/sync_point.h"
#include "common/executor.h"
#include "common/fair_executor.h"
#include "common/limits.h"
#include "common/log.h"
#include "dataplane/arena.h"
#include "dataplane/buffered_io.h"
#include "dataplane/memory_guard.h"
#include "dataplane/region_registry.h"
#include "format/crc32c.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "index/keys.h"
#include "index/meta_store.h"
#include "options.h"
#include "peer/peer_server.h"
#include "peer/replicator.h"
#include "rpc/arena_fd_server.h"
#include "rpc/grpc_service.h"
#include "rpc/metrics_server.h"
#include "rpc/peer_listener.h"
#include "service/checkpoint_service.h"
#include "spdlog/spdlog.h"
#include "storage/posix/posix_storage.h"
#include "storage/s3/s3_storage.h"

namespace ckptd {
namespace {

void SetUpLogging(const DaemonOptions& o) {
  InstallLogFormat(o.log_format == "json" ? LogFormat::kJson : LogFormat::kText);
  spdlog::set_level(spdlog::level::from_str(o.log_level));
}

// Shared-memory names carry a prefix derived from the state dir, so two daemons on one machine
// never collide and a restarted daemon finds (and cleans up) what its predecessor left.
std::string ShmPrefix(const std::string& state_dir) {
  std::error_code ec;
  std::string canon = std::filesystem::weakly_canonical(state_dir, ec).string();
  if (ec) canon = state_dir;
  return absl::StrFormat("ckptd-%08x-", Crc32c(canon.data(), canon.size()));
}

void RemoveOrphanSegments(const std::string& prefix, const StagingArena& arena) {
  absl::flat_hash_set<std::string> keep;
  for (const ArenaSegmentInfo& s : arena.segments()) keep.insert(s.name);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || keep.contains("/" + name)) continue;
    if (shm_unlink(("/" + name).c_str()) == 0) {
      spdlog::info("removed orphan shared-memory segment /{}", name);
    }
  }
}

// The staging arena (dataplane/arena.h): segments the journal names are adopted if each is
// still exactly what this daemon created (owner, mode, size, uid, generation); a uid without one
// gets a new segment under a fresh random name when it first connects, journaled (synced)
// before anyone can use it. A random name means nobody can pre-create the segment a daemon will
// use.
absl::StatusOr<std::unique_ptr<StagingArena>> OpenArena(const DaemonOptions& o, MetaStore& meta,
                                                        const std::string& prefix) {
  auto journal = [&meta](const ArenaSegmentInfo& s) {
    MetaStore::Write w{keys::Meta(absl::StrCat("arena.u", s.uid)),
                       absl::StrCat(s.name, " ", s.generation)};
    return meta.Commit({&w, 1}, /*sync=*/true);
  };
  CKPTD_ASSIGN_OR_RETURN(
      std::unique_ptr<StagingArena> arena,
      StagingArena::Create(
          ArenaOptions{"/" + prefix, o.staging_bytes_max, o.staging_prefault, o.staging_mlock,
                       std::filesystem::absolute(o.state_dir).string(), o.uid_arena_share_percent},
          journal));
  std::vector<std::pair<std::string, std::string>> rows;
  CKPTD_RETURN_IF_ERROR(
      meta.Scan(keys::Meta("arena.u"), "", 0, [&rows](std::string_view k, std::string_view v) {
        rows.emplace_back(k, v);
        return true;
      }));
  const std::string key_prefix = keys::Meta("arena.u");
  for (const auto& [key, value] : rows) {
    std::vector<std::string> parts = absl::StrSplit(value, ' ');
    uint32_t uid = 0;
    absl::Status st = absl::DataLossError(absl::StrCat("unparsable row \"", value, "\""));
    if (parts.size() == 2 && absl::SimpleAtoi(key.substr(key_prefix.size()), &uid)) {
      st = arena->Adopt(uid, parts[0], parts[1]);
    }
    if (!st.ok()) {
      spdlog::warn("not adopting the journaled staging arena segment {}: {}", value, st.ToString());
    }
  }
  return arena;
}

// Creates `dir` if missing and sets its mode (and group, when gid >= 0).
absl::Status MakeDir(const std::string& dir, mode_t mode, int64_t gid) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("creating ", dir, ": ", ec.message()));
  if (gid >= 0 && chown(dir.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0) {
    return ErrnoStatus(errno, absl::StrCat("chown ", dir, " to gid ", gid));
  }
  if (chmod(dir.c_str(), mode) != 0) return ErrnoStatus(errno, absl::StrCat("chmod ", dir));
  return absl::OkStatus();
}

// The state dir is private (0700). When the socket lies in it and is opened to a group
// (socket_mode 0660), that group may pass through the directory to reach it (0710, group
// socket_group) — never list it; the index and data dirs under it stay 0700.
absl::Status MakeStateDirs(const DaemonOptions& o) {
  const bool socket_inside =
      std::filesystem::path(o.socket_path).parent_path() == std::filesystem::path(o.state_dir);
  const bool group_socket = socket_inside && (o.socket_mode & 0060) != 0;
  CKPTD_RETURN_IF_ERROR(
      MakeDir(o.state_dir, group_socket ? 0710 : 0700, group_socket ? o.socket_gid : -1));
  return MakeDir(o.data_dir, 0700, -1);
}

// Every storage plugin the daemon can open, by scheme (ckptd/storage_registry.h). This list
// is the only place the daemon names a plugin; the core sees a Storage only. (The memory plugin
// is for tests: a store a restart forgets is no tier.)
absl::StatusOr<StorageRegistry> StoragePlugins() {
  StorageRegistry registry;
  CKPTD_RETURN_IF_ERROR(RegisterPosixStorage(registry));
  CKPTD_RETURN_IF_ERROR(RegisterS3Storage(registry));
  return registry;
}

// The remote tier's URI: remote_s3_bucket as "s3://bucket[/prefix]", else remote_dir (a path,
// or a URI of any registered scheme); empty without a remote tier.
std::string RemoteUri(const DaemonOptions& o) {
  if (o.remote_s3_bucket.empty()) return o.remote_dir;
  std::string uri = absl::StrCat("s3://", o.remote_s3_bucket);
  if (!o.remote_s3_prefix.empty()) absl::StrAppend(&uri, "/", o.remote_s3_prefix);
  return uri;
}

// The plugin settings the remote tier's options give the store of `scheme`.
std::map<std::string, std::string> RemoteSettings(const DaemonOptions& o,
                                                  const std::string& scheme) {
  if (scheme != "s3") return {};
  return {{"endpoint", o.remote_s3_endpoint},
          {"region", o.remote_s3_region},
          {"path_style", o.remote_s3_path_style ? "true" : "false"},
          {"tls_verify", o.remote_s3_tls_verify ? "true" : "false"},
          {"ca_path", o.remote_s3_ca_path},
          {"part_size_bytes", absl::StrCat(o.remote_s3_part_size_bytes)},
          {"parts_in_flight", absl::StrCat(o.remote_s3_parts_in_flight)}};
}

// The remote tier's storage (null without one), opened by its URI through the registry. A
// directory must exist (a shared mount the operator set up); a missing one is an error at start
// naming it, not a directory silently made on the local disk. An unknown scheme is an error
// naming it and the known ones.
absl::StatusOr<std::unique_ptr<Storage>> OpenRemoteTier(const DaemonOptions& o,
                                                        const StorageRegistry& plugins, Io* io) {
  const std::string uri = RemoteUri(o);
  if (uri.empty()) return std::unique_ptr<Storage>();
  CKPTD_ASSIGN_OR_RETURN(StorageUri parsed, ParseStorageUri(uri));
  // What only the options can say (the plugin would name its own setting, not the option).
  if (parsed.scheme == "s3" && o.remote_s3_endpoint.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(uri, " needs option remote_s3_endpoint"));
  }
  if (parsed.scheme != "file" && o.remote_dir_link_fallback) {
    return absl::InvalidArgumentError(
        absl::StrCat("option remote_dir_link_fallback applies to a directory, not to ", uri));
  }
  if (parsed.scheme == "file") {
    std::error_code ec;
    if (!std::filesystem::is_directory(parsed.location, ec)) {
      return absl::FailedPreconditionError(
          absl::StrCat("remote_dir ", parsed.location,
                       " is not a directory (mount the shared file system first)"));
    }
    if (o.remote_dir_link_fallback) {
      spdlog::info(
          "remote tier: conditional writes take the link() fallback "
          "(remote_dir_link_fallback)");
    }
  }
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<Storage> remote,
                         plugins.Open(uri, StorageContext{io, RemoteSettings(o, parsed.scheme)}));
  if (parsed.scheme == "file") {
    CKPTD_RETURN_IF_ERROR(Annotate(remote->List("").status(), remote->Describe()));
  }
  spdlog::info("remote tier: {} (default tier policy {})", remote->Describe(), o.tier_policy);
  return remote;
}

// --debug_crash_at (test builds): armed before recovery, so recovery's crash points count too.
absl::Status ArmCrashPoint(const DaemonOptions& o) {
  if (o.debug_crash_at.empty()) return absl::OkStatus();
  CKPTD_ASSIGN_OR_RETURN(SyncPointCrash crash, ParseSyncPointCrash(o.debug_crash_at));
  CKPTD_RETURN_IF_ERROR(ArmSyncPointCrash(crash));
  spdlog::warn("debug_crash_at = {}: this daemon kills itself (SIGKILL) at that crash point",
               o.debug_crash_at);
  return absl::OkStatus();
}

// What the daemon stores into, opened in order (the destructor closes them in reverse): the index,
// the staging arena (orphan segments of this state dir removed), the I/O engine, local storage and
// the remote tier (null without one). Errors name the part that failed.
struct Stores {
  std::unique_ptr<MetaStore> meta;
  std::unique_ptr<StagingArena> arena;
  std::unique_ptr<Io> io;
  std::unique_ptr<Storage> storage;
  // load_io = buffered (with direct_io): the same data dir through the page cache, for loads;
  // load_io = auto: the same data dir, reading what the page cache holds through it.
  std::unique_ptr<Io> load_io;
  std::unique_ptr<Storage> load_storage;
  std::unique_ptr<Io> remote_io;  // remote_dir_link_fallback: `io` with the link() fallback
  std::unique_ptr<Storage> remote;
};

absl::StatusOr<Stores> OpenStores(const DaemonOptions& o, const std::string& shm_prefix) {
  CKPTD_ASSIGN_OR_RETURN(const StorageRegistry plugins, StoragePlugins());
  Stores s;
  CKPTD_RETURN_IF_ERROR(MakeStateDirs(o));
  CKPTD_ASSIGN_OR_RETURN(
      s.meta, Annotate(OpenRocksDbMetaStore(o.state_dir + "/index"), "opening the index"));
  CKPTD_ASSIGN_OR_RETURN(s.arena, Annotate(OpenArena(o, *s.meta, shm_prefix), "staging arena"));
  RemoveOrphanSegments(shm_prefix, *s.arena);
  RemoveAbandonedSegments();
  s.io = NewUringIo(o.io_queue_depth);
  if (!o.direct_io) s.io = NewBufferedIo(std::move(s.io));
  // The data dir is a local directory: the file plugin, whatever the path looks like.
  const std::string data_uri = "file://" + o.data_dir;
  CKPTD_ASSIGN_OR_RETURN(s.storage, plugins.Open(data_uri, StorageContext{s.io.get()}));
  if (o.load_io == "buffered" && o.direct_io) {
    s.load_io = NewBufferedIo(NewUringIo(o.io_queue_depth));
    CKPTD_ASSIGN_OR_RETURN(s.load_storage, plugins.Open(data_uri, StorageContext{s.load_io.get()}));
  } else if (o.load_io == "auto" && o.direct_io) {
    CKPTD_ASSIGN_OR_RETURN(
        s.load_storage,
        plugins.Open(data_uri,
                     StorageContext{s.io.get(), {{"read_cached_through_cache", "true"}}}));
  }
  if (o.remote_dir_link_fallback) s.remote_io = NewLinkNoReplaceIo(s.io.get());
  CKPTD_ASSIGN_OR_RETURN(
      s.remote, Annotate(OpenRemoteTier(o, plugins, s.remote_io ? s.remote_io.get() : s.io.get()),
                         "remote tier"));
  return s;
}

// Connections the main socket takes at once: connections_max, or half the descriptor limit.
uint64_t ConnectionsMax(const DaemonOptions& o) {
  if (o.connections_max != 0) return o.connections_max;
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) != 0 || nofile.rlim_cur == RLIM_INFINITY) {
    return limits::kConnectionsDefault;
  }
  return std::max<uint64_t>(nofile.rlim_cur / 2, 2);
}

// The RPC front over `svc`: the peer-checking listener, the arena descriptor server and the gRPC
// server, serving until SIGTERM or SIGINT; then, still serving (status, list and waits answer;
// new saves are refused), it drains the work in flight within shutdown_grace_s
// (CheckpointService::Drain; *grace_left is what is left of it), and only then stops taking
// connections, ends the sessions and shuts the server down (5 s for calls in flight) before it
// returns. Errors: a socket that cannot be listened on, a server that does not start.
absl::Status ServeUntilSignal(const DaemonOptions& o, CheckpointService& svc, const RpcPools& pools,
                              size_t segments, Metrics* metrics, absl::Duration* grace_left) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  CKPTD_ASSIGN_OR_RETURN(
      std::unique_ptr<PeerListener> listener,
      Annotate(PeerListener::Listen(ListenOptions{
                   o.socket_path, o.socket_mode, o.socket_gid, o.admin_gid, ConnectionsMax(o),
                   limits::UidShare(ConnectionsMax(o), o.uid_share_percent)}),
               absl::StrCat("cannot listen on ", o.socket_path)));
  const std::string fd_path = o.socket_path + ArenaFdServer::kPathSuffix;
  // (svc outlives the server: the server is stopped, then destroyed, before it.)
  CKPTD_ASSIGN_OR_RETURN(
      std::unique_ptr<ArenaFdServer> arena_fds,
      Annotate(ArenaFdServer::Listen(
                   fd_path, o.socket_mode, o.socket_gid,
                   [&svc](uint32_t uid, const std::string& session) {
                     return svc.ArenaFd(uid, session);
                   },
                   limits::UidShare(ArenaFdServer::kConnectionsMax, o.uid_share_percent)),
               absl::StrCat("cannot listen on ", fd_path)));
  GrpcCheckpointService rpc(&svc, listener.get(), pools, metrics);
  grpc::ServerBuilder builder;
  // No listening port: connections come from PeerListener, which asks the kernel who they are.
  builder.RegisterService(&rpc);
  builder.SetMaxReceiveMessageSize(limits::kRpcMessageBytesMax);
  builder.SetMaxSendMessageSize(limits::kRpcMessageBytesMax);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return absl::InternalError("cannot start the gRPC server");
  arena_fds->Start();
  listener->Start(server.get());
  spdlog::info(
      "ckptd ready on unix:{} (mode 0{:o}; data {}, staging arena of {} bytes, {} "
      "segment(s) adopted, instance {})",
      o.socket_path, o.socket_mode, o.data_dir, o.staging_bytes_max, segments, svc.instance_id());

  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int sig = 0;
  sigwait(&set, &sig);
  spdlog::info("signal {}: stopping (grace {} s)", sig, o.shutdown_grace_s);
  *grace_left = svc.Drain(absl::Seconds(o.shutdown_grace_s));
  listener->Stop();
  arena_fds->Stop();
  rpc.CloseSessions();
  // The calls in flight get up to 5 s to finish; then the connections left (clients that keep
  // their channel open) are closed at once rather than waited for until a deadline.
  if (!rpc.WaitIdle(absl::Seconds(5))) spdlog::warn("stopping with calls still in flight");
  server->Shutdown(std::chrono::system_clock::now());
  return absl::OkStatus();
}

// The RPC pools, fair among uids (common/fair_executor.h). Pools of short or data-moving calls
// have one thread more than a uid may use, kept for the other uids; the blocking ones (Waits, and
// reservations, on their own pools so Waits that may last an hour never starve the reservations a
// save needs) give each uid uid_share_percent of their waiters_max threads.
struct FairPools {
  explicit FairPools(const DaemonOptions& o)
      : quick("rpc", Short(o.rpc_threads, o)),
        large_save("save-large", Short(limits::kLargeSaveThreads, o)),
        wait("wait", Blocking(o)),
        reserve("reserve", Blocking(o)),
        load("load", Short(o.load_threads, o)) {}

  // A pool of `threads` + 1 threads, queued calls bounded by rpc_queue_max.
  static FairExecutor::Shares Short(uint64_t threads, const DaemonOptions& o) {
    const uint64_t queued_share = limits::UidShare(o.rpc_queue_max, o.uid_share_percent);
    return {.threads = threads + 1u,
            .queue_max = o.rpc_queue_max,
            .uid_running_max = threads,
            .uid_inflight_max = std::max<uint64_t>(queued_share, threads),
            .inflight_name = "uid_share_percent of rpc_queue_max"};
  }
  static FairExecutor::Shares Blocking(const DaemonOptions& o) {
    const uint64_t waiter_share = limits::UidShare(o.waiters_max, o.uid_share_percent);
    return {.threads = o.waiters_max,
            .queue_max = o.waiters_max,
            .uid_running_max = waiter_share,
            .uid_inflight_max = waiter_share,
            .inflight_name = "uid_share_percent of waiters_max"};
  }
  RpcPools pools() { return RpcPools{&quick, &wait, &reserve, &load, &large_save}; }
  void AddLevels(Metrics::Levels* l) const {
    l->queued.emplace_back("rpc", quick.queued());
    l->queued.emplace_back("wait", wait.queued());
    l->queued.emplace_back("reserve", reserve.queued());
    l->queued.emplace_back("load", load.queued());
    l->queued.emplace_back("save-large", large_save.queued());
  }
  void Stop() {
    quick.Stop();
    large_save.Stop();
    wait.Stop();
    reserve.Stop();
    load.Stop();
  }

  FairExecutor quick;
  FairExecutor large_save;
  FairExecutor wait;
  FairExecutor reserve;
  FairExecutor load;
};

// The peer channel (docs/PEERS.md): other daemons' copies; its certificates are checked here, at
// start, and a bad one stops the daemon naming the file. Null without peer_listen_addr.
absl::StatusOr<std::unique_ptr<peer::Server>> StartPeerServer(const DaemonOptions& o,
                                                              Storage* local, Metrics* metrics) {
  if (o.peer_listen_addr.empty()) return nullptr;
  return peer::Server::Start(
      peer::ServerOptions{
          .listen_addr = o.peer_listen_addr,
          .node_id = o.node_id,
          .tls = {o.peer_tls_ca_path, o.peer_tls_cert_path, o.peer_tls_key_path},
          .store = {.bytes_max = o.peer_bytes_max,
                    .streams_per_node_max = o.peer_streams_per_node_max,
                    .inflight_bytes_per_node_max = o.peer_inflight_bytes_per_node_max,
                    .connections_per_node_max = limits::kPeerConnectionsPerNodeMax},
          .local = local,
          .stall_timeout_ms = o.peer_stall_timeout_ms},
      metrics);
}

// The peer tier (docs/PEERS.md "Replication"): registered on the shared tier, it copies this
// node's parts of checkpoints spanning nodes to its peers and reads their copies for loads. Null
// without a peer channel or a shared (remote) tier.
absl::StatusOr<std::unique_ptr<peer::Replicator>> StartReplicator(const DaemonOptions& o,
                                                                  const peer::Server* peer_server,
                                                                  const Stores& stores) {
  if (peer_server == nullptr || stores.remote == nullptr) return nullptr;
  std::string advertise = o.peer_advertise_addr;
  if (advertise.empty()) {
    advertise = absl::StrCat(o.peer_listen_addr.substr(0, o.peer_listen_addr.rfind(':')), ":",
                             peer_server->port());
  }
  return peer::Replicator::Start(
      peer::ReplicatorOptions{
          .node_id = o.node_id,
          .advertise_addr = advertise,
          .failure_domain = o.peer_failure_domain,
          .tls = {o.peer_tls_ca_path, o.peer_tls_cert_path, o.peer_tls_key_path},
          .repair_interval = absl::Milliseconds(o.peer_repair_interval_ms),
          .stall_timeout = absl::Milliseconds(o.peer_stall_timeout_ms)},
      stores.storage.get(), stores.remote.get());
}

// The metrics endpoint (null without metrics_address).
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServer(const DaemonOptions& o,
                                                                  Metrics* metrics) {
  if (o.metrics_address.empty()) return nullptr;
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<MetricsServer> server,
                         MetricsServer::Start(o.metrics_address, metrics));
  spdlog::info("metrics on http://{}:{}/metrics",
               server->bind_address().substr(0, server->bind_address().rfind(':')), server->port());
  return server;
}

// After serving: the service shut down within what is left of the grace period, the pools
// stopped, the arena's segments unlinked when nothing stays staged in them. Exits at once when
// flushes are still in flight past the grace period.
int StopAfterServing(const DaemonOptions& o, CheckpointService& svc, FairPools& pools,
                     StagingArena* arena, absl::Duration grace_left) {
  bool drained = true;
  bool nothing_staged = svc.Shutdown(grace_left, &drained);
  if (!drained) {
    // Flush threads are still inside a write: leave them (their work is journaled and resumes
    // from the arena at the next start) rather than overrun the grace period.
    std::filesystem::remove(o.socket_path);
    spdlog::warn(
        "exiting with flushes in flight; they resume from the staging arena at the "
        "next start");
    spdlog::shutdown();
    std::_Exit(0);
  }
  pools.Stop();
  if (nothing_staged) {
    arena->Unlink();
  } else {
    spdlog::info(
        "staged checkpoints stay journaled in the staging arena's segments; the next "
        "start resumes them");
  }
  std::filesystem::remove(o.socket_path);
  spdlog::info("stopped");
  return 0;
}

// Run's second phase, from a recovered and started service to the exit code: the metrics'
// levels and endpoint, the RPC front until SIGTERM or SIGINT (ServeUntilSignal), then the peer
// channel (null without one) stopped and StopAfterServing. Everything it is given outlives it.
int ServeAndStop(const DaemonOptions& o, CheckpointService& svc, FairPools& pools, Metrics& metrics,
                 StagingArena* arena, peer::Server* peer_server) {
  metrics.SetLevels([&] {
    Metrics::Levels l = svc.MetricLevels();
    pools.AddLevels(&l);
    return l;
  });
  // Declared after what its scrapes read (the service, the pools): destroyed, so stopped, first.
  absl::StatusOr<std::unique_ptr<MetricsServer>> metrics_server = StartMetricsServer(o, &metrics);
  if (!metrics_server.ok()) {
    spdlog::critical("{}", metrics_server.status().ToString());
    return 1;
  }
  absl::Duration grace_left = absl::Seconds(o.shutdown_grace_s);
  if (absl::Status st =
          ServeUntilSignal(o, svc, pools.pools(), arena->segments().size(), &metrics, &grace_left);
      !st.ok()) {
    spdlog::critical("{}", st.ToString());
    return 1;
  }
  if (peer_server != nullptr) peer_server->Stop();
  return StopAfterServing(o, svc, pools, arena, grace_left);
}

// The daemon's life: options applied, the stores opened, the parts built over them and the
// service recovered and started (this phase), then ServeAndStop. The exit code.
int Run(const DaemonOptions& o) {
  SetUpLogging(o);
  if (absl::Status st = ArmCrashPoint(o); !st.ok()) {
    spdlog::critical("debug_crash_at: {}", st.ToString());
    return 2;
  }
  umask(077);
  const std::string prefix = ShmPrefix(o.state_dir);
  absl::StatusOr<Stores> stores = OpenStores(o, prefix);
  if (!stores.ok()) {
    spdlog::critical("{}", stores.status().ToString());
    return 1;
  }
  StagingArena* arena = stores->arena.get();
  // CUDA is loaded at the first CUDA IPC registration, never on a node that has none. Declared
  // before the registry (which closes handles through it) and after the arena (unpinned first).
  std::unique_ptr<Gpu> gpu = NewCudaGpu();
  GpuStaging gpu_staging(gpu.get(), arena);
  RegionRegistry regions(
      ForbiddenRegions{"/" + prefix,
                       [arena](uint64_t dev, uint64_t ino) { return arena->IsSegment(dev, ino); }},
      gpu.get());
  Executor flush_pool("flush", o.flush_threads, 1 << 20);
  FairPools pools(o);
  Metrics metrics;
  // Stopped when serving ends.
  absl::StatusOr<std::unique_ptr<peer::Server>> peer_server =
      StartPeerServer(o, stores->storage.get(), &metrics);
  if (!peer_server.ok()) {
    spdlog::critical("peer channel: {}", peer_server.status().ToString());
    return 1;
  }
  // Declared before the service, which uses it: destroyed after it.
  absl::StatusOr<std::unique_ptr<peer::Replicator>> replicator =
      StartReplicator(o, peer_server->get(), *stores);
  if (!replicator.ok()) {
    spdlog::critical("peer tier: {}", replicator.status().ToString());
    return 1;
  }
  ServiceDeps deps{&o, stores->meta.get(), stores->storage.get(), arena, &regions, &flush_pool};
  deps.peers = replicator->get();
  deps.remote = stores->remote.get();
  deps.gpu = &gpu_staging;
  deps.load_storage = stores->load_storage.get();
  deps.metrics = &metrics;
  CheckpointService svc(deps);
  if (absl::Status st = svc.Recover(); !st.ok()) {
    spdlog::critical("recovery failed: {}", st.ToString());
    return 1;
  }
  svc.Start();
  return ServeAndStop(o, svc, pools, metrics, arena, peer_server->get());
}

}  // namespace
}  // namespace ckptd

int main(int argc, char** argv) {
  // Signals are taken by sigwait in main; every thread created later inherits the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  ckptd::InstallMemoryGuard();
  std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<ckptd::DaemonOptions> o = ckptd::ParseOptions(args);
  if (!o.ok()) {
    if (o.status().code() == absl::StatusCode::kNotFound) {
      std::fputs(std::string(o.status().message()).c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "ckptd: %s\n", std::string(o.status().message()).c_str());
    return 2;
  }
  return ckptd::Run(*o);
}
