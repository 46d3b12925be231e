// The crash-point matrix (issue 10), against the real daemon: for every named crash point of
// daemon/include/ckptd/sync_point.h in turn, a daemon started over a copy of a state dir holding
// two committed checkpoints (known bytes) is armed with --debug_crash_at=<point>[:<nth>] and
// driven through a workload that reaches the point (a 4-rank save, an abort, a delete, an offline
// reshard, a cancelled reshard, a restart with work to recover, an upload, or a save spanning two
// nodes, committed on the store or at the peer tier). It must kill itself there
// (SIGKILL: a kill -9 at exactly that step). It is then restarted without a crash armed, and:
//   - it starts;
//   - at the crash (read from the killed daemon's index before anything restarts), every
//     COMMITTED row names a checkpoint whose manifest is on the tier the row says: the index
//     never shows a key COMMITTED before its manifest is durable; and every upload row DURABLE
//     names one whose manifest (or its node's upload marker) is on the remote tier;
//   - every checkpoint committed before still loads bit-exact (the one being deleted may instead
//     be absent, with its directory gone — never DELETING, never half there);
//   - the checkpoint in flight, from the point its manifest is durable on (`ManifestDurable`), is
//     COMMITTED and loads bit-exact; before it, it is COMMITTED and bit-exact (recovery resumed
//     it, or the test's retried ranks completed it) or ABORTED / absent with its directory gone;
//   - `ckptctl ls` shows only COMMITTED and ABORTED checkpoints once recovery has settled them
//     (never MISSING or CORRUPT: no manifest of the matrix is lost or damaged).
//   - committed at the peer tier (kPeerCluster, two daemons with peer listeners under local+peer):
//     at the crash every node part on the store names the peer that acknowledged its copy, and no
//     blob is on the store; after the restart, once COMMITTED, node-a's status names its part on
//     its disk and every blob on a peer, and node-b's part, whose copy died with node-a's memory,
//     is copied to node-a again by node-b's repair (its status degraded only meanwhile);
// Every point of kSyncPoints must appear in the matrix and be reached (a point no workload reaches
// fails the test), so the list stays honest. Prints "crash matrix: N crash points x M
// checkpoints checked". The power-loss variant (unsynced writes dropped) runs in-process:
// tests/unit/service/power_loss_test.cc.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "ckptd/sync_point.h"
#include "ckptd/v1/cluster.pb.h"
#include "harness.h"
#include "index_rows.h"
#include "multi_node.h"
#include "peer_certs.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;

#if CKPTD_TEST_HOOKS

namespace {

constexpr char kJob[] = "matrix";
constexpr uint32_t kWorld = 4;  // VerifyInProcess checks 4 ranks' objects
constexpr uint64_t kSeed1 = 61;
constexpr uint64_t kSeed2 = 62;
constexpr uint64_t kSeed3 = 63;
constexpr uint64_t kNewStep = 3;      // saved (or aborted) by the workload
constexpr uint64_t kReshardStep = 9;  // the reshard target (a copy of step 1)

// What runs while the crash point is armed.
enum class Workload {
  kSave,          // all 4 ranks of step 3 save; the daemon flushes and commits it
  kAbort,         // 3 ranks of step 3 stage and persist, then a client aborts it
  kDelete,        // ckptctl rm of step 2
  kReshard,       // ckptctl reshard step 1 -> 9 (rows:2)
  kReshardAbort,  // the same, slowed down, then cancelled with ckptctl abort
  kRecovery,      // a delete crashes with a reshard running and step 3 staged; the restart
                  // (which has the point armed) then has every kind of work to recover
  kUpload,        // step 3 saved with local+remote: committed locally, then uploaded to the
                  // remote tier (a directory of the case); the restart keeps that tier
  kCluster,       // step 3 spans two nodes over that tier: the armed daemon (node-a, the
                  // coordinator) saves ranks 0 and 1, a second daemon (node-b, not armed) ranks
                  // 2 and 3; the restarted node-a must settle it with node-b still running
  kPeerCluster,   // kCluster committed at the peer tier (local+peer): both daemons have peer
                  // listeners (mutual TLS), each node's part is copied to the other's peer
                  // store before it is published, and no blob goes to the store. node-b saves
                  // first, so node-a receives node-b's copy (peer.copy_stored) before its own
                  // ranks come; the restarted node-a (its peer store empty, its listener on a
                  // new port) must settle it: copied again and COMMITTED, or ABORTED
};

struct Case {
  const char* point;
  uint64_t nth;
  Workload workload;
};

// nth > 1 where the 1st and the last hit leave different states (first rank vs all ranks).
const Case kCases[] = {
    {"save.before_journal", 1, Workload::kSave},
    {"save.before_journal", 4, Workload::kSave},
    {"save.journaled", 1, Workload::kSave},
    {"save.journaled", 4, Workload::kSave},
    {"flush.blob_written", 1, Workload::kSave},
    {"flush.blob_synced", 1, Workload::kSave},
    {"flush.rank_persisted", 1, Workload::kSave},
    {"flush.rank_persisted", 4, Workload::kSave},
    {"flush.extents_freed", 4, Workload::kSave},
    {"commit.manifest_built", 1, Workload::kSave},
    {"put_atomic.tmp_synced", 1, Workload::kSave},
    {"put_atomic.renamed", 1, Workload::kSave},
    {"put_atomic.dir_synced", 1, Workload::kSave},
    {"commit.manifest_durable", 1, Workload::kSave},
    {"commit.indexed", 1, Workload::kSave},
    {"abort.recorded", 1, Workload::kAbort},
    {"abort.files_removed", 1, Workload::kAbort},
    {"delete.tombstone_written", 1, Workload::kDelete},
    {"delete.remote_removed", 1, Workload::kDelete},
    {"delete.manifest_removed", 1, Workload::kDelete},
    {"delete.dir_removed", 1, Workload::kDelete},
    {"delete.rows_removed", 1, Workload::kDelete},
    {"delete.done", 1, Workload::kDelete},
    {"reshard.target_recorded", 1, Workload::kReshard},
    {"reshard.blob_written", 1, Workload::kReshard},
    {"put_atomic.renamed", 1, Workload::kReshard},
    {"commit.manifest_durable", 1, Workload::kReshard},
    {"commit.indexed", 1, Workload::kReshard},
    {"reshard.committed", 1, Workload::kReshard},
    {"reshard.abort_files_removed", 1, Workload::kReshardAbort},
    {"upload.blobs_copied", 1, Workload::kUpload},
    {"upload.manifest_put", 1, Workload::kUpload},
    {"upload.durable", 1, Workload::kUpload},
    {"cluster.part_published", 1, Workload::kCluster},
    {"cluster.decision_written", 1, Workload::kCluster},
    {"cluster.manifest_written", 1, Workload::kCluster},
    {"cluster.committed", 1, Workload::kCluster},
    {"peer.copy_stored", 1, Workload::kPeerCluster},
    {"cluster.part_replicated", 1, Workload::kPeerCluster},
    {"cluster.part_published", 1, Workload::kPeerCluster},
    {"cluster.manifest_written", 1, Workload::kPeerCluster},
    {"cluster.committed", 1, Workload::kPeerCluster},
    {"recovery.rows_repaired", 1, Workload::kRecovery},
    {"recovery.deletes_finished", 1, Workload::kRecovery},
    {"recovery.manifests_adopted", 1, Workload::kRecovery},
    {"recovery.aborted_files_removed", 1, Workload::kRecovery},
    {"recovery.pending_resumed", 1, Workload::kRecovery},
    {"recovery.committed_rows_checked", 1, Workload::kRecovery},
    {"recovery.newest_verified", 1, Workload::kRecovery},
};

// How a checkpoint may look after the restart.
enum class May {
  kStayCommitted,  // committed before: COMMITTED and bit-exact
  kBeDeleted,      // being deleted: COMMITTED and bit-exact, or absent with its directory gone
  kBeInFlight,     // being written: COMMITTED and bit-exact, or ABORTED / absent, files gone
  kBeDurable,      // being written, its manifest durable at the crash: COMMITTED and bit-exact
};

struct Expect {
  uint64_t step;
  uint64_t seed;
  May may;
};

// Whether the case crashes with the manifest of its checkpoint in flight durable (visible to the
// next process: a rename done is kept by a kill -9): from then on it must be COMMITTED.
bool ManifestDurable(const Case& c) {
  const std::string_view p = c.point;
  switch (c.workload) {
    case Workload::kSave:
    case Workload::kReshard:
      return p == "put_atomic.renamed" || p == "put_atomic.dir_synced" ||
             p == "commit.manifest_durable" || p == "commit.indexed" || p == "reshard.committed";
    case Workload::kUpload:  // committed locally before its upload starts
      return true;
    case Workload::kCluster:
    case Workload::kPeerCluster:
      return p == "cluster.manifest_written" || p == "cluster.committed";
    default:
      return false;
  }
}

std::string CrashFlag(const Case& c) {
  return absl::StrCat("--debug_crash_at=", c.point, ":", c.nth);
}

std::string CrashLine(const Case& c) {
  return absl::StrCat("crash point ", c.point, " reached (hit ", c.nth, ")");
}

std::string StepPath(const Daemon& d, uint64_t step) {
  return d.data_dir() + "/" + kJob + "/" + StepDir(step);
}

// Saves ranks [0, ranks) of step 3 from this process; stops at the first error (the daemon died).
void SaveRanks(const Daemon& d, uint32_t ranks) {
  auto client = d.Connect();
  for (uint32_t r = 0; r < ranks; ++r) {
    if (!SaveRank(*client, kJob, kNewStep, r, kWorld, kSeed3).ok()) return;
  }
}

// 3 of 4 ranks of step 3 staged and persisted (flush_gate_ms=0), then aborted by a client.
void StageThenAbort(const Daemon& d) {
  SaveRanks(d, 3);
  auto client = d.Connect();
  for (int i = 0; i < 200; ++i) {
    auto st = client->GetStatus(kJob, kNewStep);
    if (!st.ok() || (st->bytes_staged > 0 && st->bytes_persisted == st->bytes_staged)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  client->Abort(kJob, kNewStep, "crash matrix").IgnoreError();
}

void StartReshard(const Daemon& d) {
  RunCtl(d, {"reshard", kJob, "1", std::to_string(kReshardStep), "rows:2"});
}

// Saves `ranks` of step 3 through `d` as one node of a checkpoint spanning nodes (2 ranks here).
void SaveNodeRanks(const Daemon& d, std::initializer_list<uint32_t> ranks,
                   ckptd::TierPolicy policy = ckptd::TierPolicy::kLocalAndRemote) {
  auto client = ConnectNode(d, 2, policy);
  if (client == nullptr) return;
  for (uint32_t r : ranks) {
    if (!SaveRank(*client, kJob, kNewStep, r, kWorld, kSeed3).ok()) return;
  }
}

// Runs the workload on `d` (started with the case's flags; `peer` is kCluster's other node). For
// kRecovery it also restarts the daemon with the point armed; it returns with the daemon started
// for that last crash.
void RunWorkload(Daemon& d, const Case& c, Daemon* peer) {
  switch (c.workload) {
    case Workload::kCluster:
      SaveNodeRanks(*peer, {2, 3});
      SaveNodeRanks(d, {0, 1});
      return;
    case Workload::kPeerCluster:
      SaveNodeRanks(*peer, {2, 3}, ckptd::TierPolicy::kLocalAndPeer);
      SaveNodeRanks(d, {0, 1}, ckptd::TierPolicy::kLocalAndPeer);
      return;
    case Workload::kSave:
    case Workload::kUpload:
      SaveRanks(d, kWorld);
      return;
    case Workload::kAbort:
      StageThenAbort(d);
      return;
    case Workload::kDelete:
      RunCtl(d, {"rm", kJob, "2"});
      return;
    case Workload::kReshard:
      StartReshard(d);
      return;
    case Workload::kReshardAbort:
      StartReshard(d);
      RunCtl(d, {"abort", kJob, std::to_string(kReshardStep)});
      return;
    case Workload::kRecovery:
      StartReshard(d);       // slowed by --debug_reshard_delay_ms: still running at the crash
      SaveRanks(d, kWorld);  // staged; flushes held by --debug_flush_delay_ms
      RunCtl(d, {"rm", kJob, "2"});  // crashes at delete.tombstone_written
      if (d.WaitExit(20000) < 0) throw std::runtime_error("the first crash did not happen");
      d.Restart({CrashFlag(c)}, /*wait_ready=*/false);
      return;
  }
}

bool SpansNodes(const Case& c) {
  return c.workload == Workload::kCluster || c.workload == Workload::kPeerCluster;
}

// The remote tier of kUpload and the cluster cases (`node` names the daemon), and kPeerCluster's
// peer channel (a listener on any port, node `node`'s certificate), kept across the restart.
std::vector<std::string> RemoteTierFlags(const Case& c, const std::string& case_dir,
                                         const std::string& node = "node-a") {
  if (c.workload != Workload::kUpload && !SpansNodes(c)) return {};
  std::filesystem::create_directories(case_dir + "/remote");
  const bool at_peer = c.workload == Workload::kPeerCluster;
  std::vector<std::string> f = {
      "--remote_dir=" + case_dir + "/remote",
      at_peer ? "--tier_policy=local+peer" : "--tier_policy=local+remote"};
  if (SpansNodes(c)) f.insert(f.end(), {"--node_id=" + node, "--cluster_poll_ms=50"});
  if (at_peer) {
    const std::string& certs = PeerCerts();
    f.insert(f.end(), {"--peer_listen_addr=127.0.0.1:0", "--peer_tls_ca_path=" + certs + "/ca.pem",
                       "--peer_tls_cert_path=" + certs + "/" + node + ".pem",
                       "--peer_tls_key_path=" + certs + "/" + node + ".key",
                       "--peer_bytes_max=67108864", "--peer_replicas=1",
                       "--peer_repair_interval_ms=300", "--peer_stall_timeout_ms=5000"});
  }
  return f;
}

std::vector<std::string> WorkloadFlags(const Case& c) {
  switch (c.workload) {
    case Workload::kAbort:
      return {CrashFlag(c), "--flush_gate_ms=0"};
    case Workload::kReshardAbort:
      return {CrashFlag(c), "--debug_reshard_delay_ms=200"};
    case Workload::kRecovery:
      return {"--debug_crash_at=delete.tombstone_written", "--debug_flush_delay_ms=60000",
              "--debug_reshard_delay_ms=300"};
    default:
      return {CrashFlag(c)};
  }
}

std::vector<Expect> Expectations(const Case& c) {
  const Workload w = c.workload;
  const May in_flight = ManifestDurable(c) ? May::kBeDurable : May::kBeInFlight;
  std::vector<Expect> out = {{1, kSeed1, May::kStayCommitted}, {2, kSeed2, May::kStayCommitted}};
  if (w == Workload::kDelete || w == Workload::kRecovery) out[1].may = May::kBeDeleted;
  if (w == Workload::kSave || w == Workload::kAbort || w == Workload::kRecovery ||
      w == Workload::kUpload || w == Workload::kCluster || w == Workload::kPeerCluster) {
    out.push_back({kNewStep, kSeed3, in_flight});
  }
  if (w == Workload::kReshard || w == Workload::kReshardAbort || w == Workload::kRecovery) {
    out.push_back({kReshardStep, kSeed1, in_flight});  // a copy of step 1's bytes
  }
  return out;
}

// Files an interrupted write left in a committed checkpoint's directory ("" when none).
std::string StrayTemps(const std::string& dir) {
  std::string found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find(".tmp.") != std::string::npos) found += " " + name;
  }
  return found.empty() ? "" : absl::StrCat(dir, " holds leftovers:", found);
}

// Waits until `step` is settled — COMMITTED, or ABORTED / absent with its directory gone — and
// checks it against `e`. "" when it holds, else what is wrong. A save that recovery resumed
// still short of ranks gets them again, as a trainer retrying its step would: it must then commit
// bit-exact (or abort).
std::string Check(const Daemon& d, const Expect& e, std::map<std::string, int>* outcomes) {
  const std::string name = absl::StrCat(kJob, "/", e.step);
  const std::string dir = StepPath(d, e.step);
  auto client = d.Connect();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::string seen;
  bool completed = false;
  while (std::chrono::steady_clock::now() < deadline) {
    auto st = client->GetStatus(kJob, e.step);
    if (st.ok() && st->state == ckptd::CheckpointState::kStaging && e.step == kNewStep &&
        !completed) {
      for (uint32_t r = 0; r < kWorld; ++r) {
        SaveRank(*client, kJob, kNewStep, r, kWorld, kSeed3).status().IgnoreError();
      }
      completed = true;
      continue;
    }
    if (st.ok() && st->state == ckptd::CheckpointState::kCommitted) {
      if (e.may != May::kStayCommitted) {
        ++(*outcomes)[e.may == May::kBeDurable ? "COMMITTED (manifest durable at the crash)"
                                               : "COMMITTED"];
      }
      std::string verified = VerifyInProcess(d, kJob, e.step, e.seed);
      if (!verified.empty()) return absl::StrCat(name, " is COMMITTED but: ", verified);
      return StrayTemps(dir);
    }
    const bool gone = !st.ok() && st.status().code() == absl::StatusCode::kNotFound;
    const bool aborted = st.ok() && st->state == ckptd::CheckpointState::kAborted;
    seen = st.ok() ? ckptd::CheckpointStateName(st->state) : st.status().ToString();
    if ((gone || aborted) && !PathExists(dir)) {
      ++(*outcomes)[gone ? "absent" : "ABORTED"];
      if (e.may == May::kBeInFlight || (gone && e.may == May::kBeDeleted)) return "";
      if (e.may == May::kBeDurable) {
        return absl::StrCat(name, "'s manifest was durable at the crash, and it is now ", seen);
      }
      return absl::StrCat(name, " was committed before the crash and is now ", seen);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::StrCat(name, " did not settle within 20 s: ", seen,
                      PathExists(dir) ? " (its directory is still there)" : "");
}

// The node id a daemon started with `flags` has ("" when none: a single node, which writes no
// upload marker and needs the manifest).
std::string NodeIdOf(const std::vector<std::string>& flags) {
  constexpr std::string_view kFlag = "--node_id=";
  for (const std::string& f : flags) {
    if (f.rfind(kFlag, 0) == 0) return f.substr(kFlag.size());
  }
  return "";
}

// Whether the checkpoint directory `dir` of the remote tier holds `node`'s own upload marker
// (daemon/src/format/names.cc NodeUploadedPath): another node's marker says nothing of this
// node's part. Markers are written for parts committed under local+peer (remote_tier.cc
// own_part); the kCluster cases here run local+remote, whose uploads put the manifest.
bool HasUploadedMarker(const std::string& dir, const std::string& node) {
  return !node.empty() && PathExists(dir + "/cluster/" + node + ".uploaded");
}

// The index of the killed daemon (`state`), read before anything restarts: a COMMITTED row whose
// manifest is not on the tier the row names ("" when none). `remote` is the remote tier's
// directory ("" when the case has none); `node` the killed daemon's node id ("" when none).
std::string CommittedWithoutManifest(const std::string& state, const std::string& remote,
                                     const std::string& node) {
  std::string error;
  std::vector<ckptd::v1::CheckpointRecord> rows = ReadCheckpointRows(state + "/index", &error);
  if (!error.empty()) return absl::StrCat("reading the index at the crash: ", error);
  std::string bad;
  for (const ckptd::v1::CheckpointRecord& rec : rows) {
    const ckptd::v1::CheckpointSummary& s = rec.summary();
    if (s.state() != ckptd::v1::COMMITTED) continue;
    const std::string rel = absl::StrCat(s.job(), "/", StepDir(s.step()), "/manifest.ckm");
    const bool local = PathExists(state + "/data/" + rel);
    const bool remote_copy = !remote.empty() && PathExists(remote + "/" + rel);
    if (s.tiers().local() ? !local : !remote_copy) {
      bad += absl::StrCat(" ", s.job(), "/", s.step(), " (", s.tiers().local() ? "local" : "remote",
                          ")");
    }
  }
  // An upload row DURABLE: the manifest is on the remote tier (or, for a node's part of a
  // checkpoint spanning nodes, this node's own `cluster/<node>.uploaded` marker — not another
  // node's), or a local copy evicted as "durable elsewhere" would leave nothing to load.
  for (const ckptd::v1::UploadRecord& u : ReadUploadRows(state + "/index", &error)) {
    if (u.upload().state() != ckptd::v1::UPLOAD_DURABLE) continue;
    const std::string dir = remote + "/" + u.dir();
    if (!PathExists(dir + "/manifest.ckm") && !HasUploadedMarker(dir, node)) {
      bad += absl::StrCat(" ", u.dir(), " (upload DURABLE, no manifest on the remote tier",
                          node.empty() ? "" : absl::StrCat(" nor ", node, "'s upload marker"), ")");
    }
  }
  if (!error.empty()) return absl::StrCat("reading the index's upload rows at the crash: ", error);
  return bad.empty() ? ""
                     : absl::StrCat(
                           "the index said COMMITTED (or an upload DURABLE) before the manifest "
                           "was durable:",
                           bad);
}

// States `ckptctl --json ls` shows that are neither COMMITTED nor ABORTED.
std::string UnsettledInLs(const Daemon& d) {
  CommandResult ls = RunCtl(d, {"--json", "ls", kJob});
  if (ls.exit_code != 0) return absl::StrCat("ckptctl ls failed: ", ls.output);
  static const std::regex state_re("\"state\": \"([A-Z_]+)\"");
  std::string bad;
  for (std::sregex_iterator it(ls.output.begin(), ls.output.end(), state_re), end; it != end;
       ++it) {
    const std::string s = (*it)[1];
    if (s.rfind("UPLOAD_", 0) == 0) continue;  // the remote tier's upload state, not a checkpoint's
    if (s != "COMMITTED" && s != "ABORTED") bad += " " + s;
  }
  return bad.empty() ? "" : absl::StrCat("ckptctl ls shows", bad, ":\n", ls.output);
}

// kPeerCluster, on the store (`remote`): every node part published names the peer that took its
// copy (a part is published only once its copies are acknowledged: never more durable than it
// is), and no blob of step 3 is there (local+peer sends the store control files only). "" when
// that holds.
std::string PartsOnStore(const std::string& remote) {
  const std::string dir = absl::StrCat(remote, "/", kJob, "/", StepDir(kNewStep));
  std::string bad;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir, ec)) {
    if (f.path().extension() == ".blob") bad += " " + f.path().string() + " is on the store;";
  }
  for (const auto& f : std::filesystem::directory_iterator(dir + "/cluster", ec)) {
    if (f.path().extension() != ".part") continue;
    ckptd::v1::NodePart part;
    if (!part.ParseFromString(ReadFile(f.path().string()))) {
      bad += " " + f.path().string() + " does not parse;";
    } else if (part.replica_nodes().empty()) {
      bad += " " + f.path().string() + " is published naming no peer;";
    }
  }
  return bad;
}

// kPeerCluster after the restart: once step 3 is COMMITTED its status on node-a says where it
// is — this node's part on its own disk, each blob on a peer — and the store holds no blob of
// it. node-b's copy held in node-a's peer store was lost with node-a's memory: node-b's repair
// (every 300 ms) must see that and copy its part to node-a again, so that its status, degraded
// meanwhile, names node-a holding it within 15 s.
std::string PeerTierChecks(const Daemon& a, const Daemon& b, const std::string& remote) {
  auto st = a.Connect()->GetStatus(kJob, kNewStep);
  if (!st.ok() || st->state != ckptd::CheckpointState::kCommitted) return PartsOnStore(remote);
  std::string bad = PartsOnStore(remote);
  if (!st->tiers.local_part) bad += " the status does not name this node's part on its disk;";
  if (st->tiers.peer_nodes.empty() || st->tiers.blobs_without_peer_copy != 0) {
    bad += absl::StrCat(" the status names ", st->tiers.peer_nodes.size(), " peers and ",
                        st->tiers.blobs_without_peer_copy, " blobs on no peer;");
  }
  std::string seen;
  for (int i = 0; i < 300; ++i) {
    auto on_b = b.Connect()->GetStatus(kJob, kNewStep);
    if (on_b.ok() && on_b->state == ckptd::CheckpointState::kCommitted &&
        on_b->tiers.peer_degraded.empty() &&
        on_b->tiers.part_peers == std::vector<std::string>{"node-a"}) {
      return bad;
    }
    seen = on_b.ok() ? absl::StrCat(ckptd::CheckpointStateName(on_b->state), ", degraded: \"",
                                    on_b->tiers.peer_degraded, "\", ",
                                    on_b->tiers.part_peers.size(), " part peers")
                     : on_b.status().ToString();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::StrCat(bad, " node-b's part is not back on node-a after 15 s: ", seen);
}

// One case over a copy of `base_state`; appends what went wrong to *problems and returns the
// number of checkpoints checked.
int RunCase(const std::string& base_state, const Case& c, std::vector<std::string>* problems,
            std::map<std::string, int>* outcomes) {
  const std::string label = absl::StrCat(c.point, ":", c.nth);
  TempDir dir;
  const std::string state = dir.path() + "/state";
  CopyTree(base_state + "/index", state + "/index");
  CopyTree(base_state + "/data", state + "/data");
  std::vector<std::string> flags = WorkloadFlags(c);
  const std::vector<std::string> remote = RemoteTierFlags(c, dir.path());
  flags.insert(flags.end(), remote.begin(), remote.end());
  std::unique_ptr<Daemon> peer;  // the cluster cases' node-b: an empty state dir, never armed
  if (SpansNodes(c)) {
    peer = std::make_unique<Daemon>(
        DaemonConfig{.state_dir = dir.path() + "/peer",
                     .staging_bytes_max = 16ull << 20,
                     .extra_flags = RemoteTierFlags(c, dir.path(), "node-b")});
  }
  Daemon d(
      DaemonConfig{.state_dir = state, .staging_bytes_max = 16ull << 20, .extra_flags = flags});
  RunWorkload(d, c, peer.get());
  const int rc = d.WaitExit(30000);
  if (rc < 0 || d.Log().find(CrashLine(c)) == std::string::npos) {
    problems->push_back(absl::StrCat(label, ": the daemon did not die there (exit ", rc,
                                     "): the point was never reached; log:\n", d.Log()));
    d.Kill9();
    return 0;
  }
  if (std::string bad = CommittedWithoutManifest(
          state, remote.empty() ? "" : dir.path() + "/remote", NodeIdOf(remote));
      !bad.empty()) {
    problems->push_back(absl::StrCat(label, ": ", bad));
  }
  if (c.workload == Workload::kPeerCluster) {
    if (std::string bad = PartsOnStore(dir.path() + "/remote"); !bad.empty()) {
      problems->push_back(absl::StrCat(label, ": at the crash:", bad));
    }
  }
  std::vector<std::string> restart = {"--stage_timeout_ms=10000"};
  restart.insert(restart.end(), remote.begin(), remote.end());
  d.Restart(restart);
  int checked = 0;
  for (const Expect& e : Expectations(c)) {
    std::string wrong = Check(d, e, outcomes);
    ++checked;
    if (!wrong.empty()) problems->push_back(absl::StrCat(label, ": ", wrong));
  }
  if (std::string bad = UnsettledInLs(d); !bad.empty()) {
    problems->push_back(absl::StrCat(label, ": ", bad));
  }
  // Spanning nodes: once COMMITTED (read from the shared tier) no local blob of node-a is left.
  const std::string local = absl::StrCat(state, "/data/", kJob, "/", StepDir(kNewStep));
  if (c.workload == Workload::kCluster && PathExists(local)) {
    auto st = d.Connect()->GetStatus(kJob, kNewStep);
    if (st.ok() && st->state == ckptd::CheckpointState::kCommitted) {
      problems->push_back(absl::StrCat(label, ": ", local, " is left after the commit"));
    }
  }
  if (c.workload == Workload::kPeerCluster) {
    if (std::string bad = PeerTierChecks(d, *peer, dir.path() + "/remote"); !bad.empty()) {
      problems->push_back(absl::StrCat(label, ": ", bad));
    }
  }
  if (!problems->empty() && problems->back().rfind(label, 0) == 0) {
    problems->back() += absl::StrCat("\nlog:\n", d.Log());
  }
  return checked;
}

}  // namespace

TEST_CASE("crash matrix: kill -9 at every named crash point, restart, nothing torn or lost",
          "[integration][crash][crash-matrix]") {
  std::set<std::string> covered;
  for (const Case& c : kCases) covered.insert(c.point);
  for (std::string_view p : ckptd::kSyncPoints) {
    INFO("crash point " << p << " is in kSyncPoints but no case of the matrix reaches it");
    CHECK(covered.contains(std::string(p)));
  }
  CHECK(covered.size() == ckptd::kSyncPointCount);

  TempDir base;
  {
    Daemon d(DaemonConfig{.state_dir = base.path() + "/state", .staging_bytes_max = 16ull << 20});
    SaveCommitted(d, kJob, 1, kSeed1);
    SaveCommitted(d, kJob, 2, kSeed2);
    REQUIRE(d.Stop());
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> problems;
  int checked = 0;
  std::map<std::string, int> outcomes;  // of the checkpoints in flight or being deleted
  // CKPTD_CRASH_MATRIX_ONLY=<text>: only the cases whose point contains it (while working on
  // them; the full matrix is what make test runs).
  const char* only = std::getenv("CKPTD_CRASH_MATRIX_ONLY");
  for (const Case& c : kCases) {
    if (only != nullptr && std::string_view(c.point).find(only) == std::string_view::npos) {
      continue;
    }
    checked += RunCase(base.path() + "/state", c, &problems, &outcomes);
  }
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - t0)
          .count();
  std::cout << "crash matrix: " << std::size(kCases) << " crash points (" << covered.size()
            << " named points, kill -9 each) x 3-4 checkpoints: " << checked
            << " checkpoints checked in " << seconds << " s, " << problems.size()
            << " problems; in flight or being deleted at the crash, afterwards:";
  for (const auto& [outcome, n] : outcomes) std::cout << " " << outcome << " " << n;
  std::cout << "\n";
  for (const std::string& p : problems) FAIL_CHECK(p);
}

#else

TEST_CASE("crash matrix: a build without test hooks refuses --debug_crash_at",
          "[integration][crash][crash-matrix]") {
  CommandResult r =
      RunCommand({CKPTD_BIN, "--state_dir=/nonexistent", "--debug_crash_at=save.journaled"});
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("without test hooks") != std::string::npos);
}

#endif
