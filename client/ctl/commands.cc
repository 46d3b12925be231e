// ckptctl's commands: one RPC (or one paginated series) each, printed as a table or JSON.
#include "commands.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_escape.h"
#include "json.h"
#include "safetensors.h"
#include "table.h"

namespace ckptctl {

namespace v1 = ::ckptd::v1;

namespace {

constexpr int64_t kWaitMarginMs = 10000;

absl::Status PrintJson(const google::protobuf::Message& msg) {
  std::cout << MessageJson(msg) << "\n";
  return absl::OkStatus();
}

// "local,remote", or with an upload under way "local,remote (uploading 61%)", "local,remote
// (pending)", "local,remote (retrying, 3 failed: <error>)"; a checkpoint spanning nodes whose
// blobs peers hold "peer (node-b, node-c)" ("; degraded: N blobs on no peer"), committed at the
// peer tier "local (this node's part),peer (node-b, node-c)" (and, its own blobs uploaded
// under remote_every, "remote (this node's part)"; this node's part copied again by repair
// "peer (node-b, node-c; this node's part on node-d)", short of copies "...; degraded: <why>").
std::string TiersString(const v1::Tiers& t) {
  std::vector<std::string> parts;
  if (t.staged()) parts.push_back("staged");
  if (t.ram()) parts.push_back("ram");
  if (t.local()) parts.push_back("local");
  if (t.local_part()) parts.push_back("local (this node's part)");
  if (t.peer_nodes_size() > 0) {
    std::string peers = absl::StrCat("peer (", absl::StrJoin(t.peer_nodes(), ", "));
    if (t.blobs_without_peer_copy() > 0) {
      absl::StrAppend(&peers, "; degraded: ", t.blobs_without_peer_copy(), " blobs on no peer");
    }
    if (t.part_peers_size() > 0 || !t.peer_degraded().empty()) {
      absl::StrAppend(&peers, "; this node's part on ",
                      t.part_peers_size() > 0 ? absl::StrJoin(t.part_peers(), ", ") : "no peer");
    }
    if (!t.peer_degraded().empty()) absl::StrAppend(&peers, "; degraded: ", t.peer_degraded());
    parts.push_back(peers + ")");
  }
  const v1::Upload& u = t.upload();
  if (t.remote() && u.node_part()) {
    parts.push_back("remote (this node's part)");
  } else if (t.remote()) {
    parts.push_back("remote");
  } else if (t.has_upload()) {
    const uint64_t pct = u.bytes_total() == 0 ? 0 : u.bytes_done() * 100 / u.bytes_total();
    switch (u.state()) {
      case v1::UPLOAD_RUNNING:
        parts.push_back(absl::StrCat("remote (uploading ", pct, "%)"));
        break;
      case v1::UPLOAD_RETRYING:
        parts.push_back(
            absl::StrCat("remote (retrying, ", u.attempts(), " failed: ", u.error(), ")"));
        break;
      case v1::UPLOAD_REFUSED:
        parts.push_back(absl::StrCat("remote (refused: ", u.error(), ")"));
        break;
      default:
        parts.push_back("remote (pending)");
    }
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

std::string StateString(const v1::CheckpointSummary& s) {
  std::string state = v1::CheckpointState_Name(s.state());
  return s.partial() ? state + " (partial)" : state;
}

std::string Lower(const std::string& s) { return absl::AsciiStrToLower(s); }

void PrintSummary(const v1::CheckpointSummary& s) {
  std::cout << s.job() << "/" << s.step() << ": " << StateString(s) << "\n"
            << "  world size: " << s.world_size() << "   items: " << s.item_count()
            << "   bytes: " << HumanBytes(s.bytes()) << "\n"
            << "  tiers: " << TiersString(s.tiers()) << "\n"
            << "  created: " << FormatUnixMs(s.created_unix_ms())
            << "   committed: " << FormatUnixMs(s.committed_unix_ms()) << "\n";
  if (!s.origin().empty()) std::cout << "  origin: " << s.origin() << "\n";
  if (!s.error().empty()) std::cout << "  error: " << s.error() << "\n";
}

// "+12.0 ms" after the checkpoint was created; "+0 ms" when `reached` within its first ms.
std::string At(uint64_t ms, bool reached) {
  if (ms == 0) return reached ? "+0 ms" : "-";
  return "+" + HumanMicros(ms * 1000);
}

// A checkpoint's phases: its own (after it was created), the remote tier's, then one row per
// rank. Nothing when none is known (a checkpoint saved before timings were recorded).
void PrintTimings(const v1::CheckpointTimings& t, const v1::Tiers& tiers, uint64_t created_ms) {
  const uint64_t kMs = 1000;
  std::vector<std::string> phases;
  auto after = [&](const char* what, uint64_t ms) {
    if (ms != 0) phases.push_back(absl::StrCat(what, " +", HumanMicros(ms * kMs)));
  };
  after("all staged", t.all_staged_ms());
  after("all persisted", t.all_persisted_ms());
  if (t.manifest_us() != 0) phases.push_back("manifest " + HumanMicros(t.manifest_us()));
  after("committed", t.committed_ms());
  const v1::Upload& up = tiers.upload();
  if (up.state() == v1::UPLOAD_DURABLE && up.durable_unix_ms() > created_ms && created_ms != 0) {
    phases.push_back(absl::StrCat("remote durable +",
                                  HumanMicros((up.durable_unix_ms() - created_ms) * kMs),
                                  " (upload ", HumanMicros(up.upload_ms() * kMs), ")"));
  }
  if (!phases.empty()) std::cout << "  timings: " << absl::StrJoin(phases, ", ") << "\n";
  if (t.ranks().empty()) return;
  Table rt({">RANK", ">RESERVE", ">COPY", ">STAGED", ">QUEUED", ">FLUSH", ">FSYNC", ">STAGED_AT",
            ">PERSISTED_AT"});
  for (const v1::RankTimings& r : t.ranks()) {
    rt.AddRow({std::to_string(r.rank()), HumanMicros(r.reserve_us()), HumanMicros(r.copy_us()),
               HumanMicros(r.staged_us()), HumanMicros(r.queued_us()), HumanMicros(r.flush_us()),
               HumanMicros(r.fsync_us()), At(r.staged_at_ms(), r.staged_us() != 0),
               At(r.persisted_at_ms(), false)});
  }
  std::cout << "\n" << rt.Render();
}

}  // namespace

absl::Status DaemonStatus(const Context& ctx, const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(s.error_code());  // same canonical numbering
  if (code == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(
        absl::StrCat("ckptd at ", ctx.target, " is unavailable: ", s.error_message()));
  }
  return absl::Status(code, s.error_message());
}

absl::StatusOr<v1::ListJobsResponse> AllJobs(Context& ctx) {
  v1::ListJobsResponse all;
  v1::ListJobsRequest req;
  do {
    v1::ListJobsResponse page;
    absl::Status s = Call(ctx, ctx.rpc_timeout_ms, [&](grpc::ClientContext* c) {
      return ctx.stub->ListJobs(c, req, &page);
    });
    if (!s.ok()) return s;
    all.mutable_jobs()->MergeFrom(page.jobs());
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  return all;
}

absl::StatusOr<v1::ListCheckpointsResponse> AllCheckpoints(Context& ctx, const std::string& job) {
  v1::ListCheckpointsResponse all;
  v1::ListCheckpointsRequest req;
  req.set_job(job);
  do {
    v1::ListCheckpointsResponse page;
    absl::Status s = Call(ctx, ctx.rpc_timeout_ms, [&](grpc::ClientContext* c) {
      return ctx.stub->ListCheckpoints(c, req, &page);
    });
    if (!s.ok()) return s;
    all.mutable_checkpoints()->MergeFrom(page.checkpoints());
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  return all;
}

absl::Status ListJobs(Context& ctx) {
  absl::StatusOr<v1::ListJobsResponse> all = AllJobs(ctx);
  if (!all.ok()) return all.status();
  if (ctx.json) return PrintJson(*all);
  Table t({"JOB", ">OWNER", ">CHECKPOINTS", ">LATEST"});
  for (const v1::JobSummary& j : all->jobs()) {
    t.AddRow({j.job(), std::to_string(j.owner_uid()), std::to_string(j.checkpoint_count()),
              j.has_committed() ? std::to_string(j.latest_committed_step()) : "-"});
  }
  std::cout << t.Render();
  return absl::OkStatus();
}

absl::Status ListCheckpoints(Context& ctx, const std::string& job) {
  absl::StatusOr<v1::ListCheckpointsResponse> all = AllCheckpoints(ctx, job);
  if (!all.ok()) return all.status();
  if (ctx.json) return PrintJson(*all);
  Table t({">STEP", "STATE", ">SIZE", "TIERS", ">WORLD", "CREATED", "ERROR"});
  for (const v1::CheckpointSummary& c : all->checkpoints()) {
    t.AddRow({std::to_string(c.step()), StateString(c), HumanBytes(c.bytes()),
              TiersString(c.tiers()), std::to_string(c.world_size()),
              FormatUnixMs(c.created_unix_ms()), c.error()});
  }
  std::cout << t.Render();
  return absl::OkStatus();
}

absl::Status DiskUsage(Context& ctx, const std::string& job) {
  std::vector<std::string> jobs;
  if (!job.empty()) {
    jobs.push_back(job);
  } else {
    absl::StatusOr<v1::ListJobsResponse> all = AllJobs(ctx);
    if (!all.ok()) return all.status();
    for (const v1::JobSummary& j : all->jobs()) jobs.push_back(j.job());
  }
  struct Usage {
    std::string job;
    uint64_t checkpoints = 0, local = 0, remote = 0, ram = 0;
  };
  std::vector<Usage> rows;
  Usage total{.job = "total"};
  for (const std::string& j : jobs) {
    absl::StatusOr<v1::ListCheckpointsResponse> all = AllCheckpoints(ctx, j);
    if (!all.ok()) return all.status();
    Usage u{.job = j};
    for (const v1::CheckpointSummary& c : all->checkpoints()) {
      ++u.checkpoints;
      if (c.tiers().local()) u.local += c.bytes();
      if (c.tiers().remote()) u.remote += c.bytes();
      u.ram += c.tiers().ram_bytes();
    }
    total.checkpoints += u.checkpoints;
    total.local += u.local;
    total.remote += u.remote;
    total.ram += u.ram;
    rows.push_back(u);
  }
  if (ctx.json) {
    auto doc = [](const Usage& u) {
      return absl::StrCat("{\"job\": ", ckptd::JsonString(u.job),
                          ", \"checkpoints\": ", u.checkpoints, ", \"local_bytes\": ", u.local,
                          ", \"remote_bytes\": ", u.remote, ", \"ram_bytes\": ", u.ram, "}");
    };
    std::vector<std::string> items;
    items.reserve(rows.size());
    for (const Usage& u : rows) items.push_back(doc(u));
    std::cout << "{\"jobs\": [" << absl::StrJoin(items, ", ") << "], \"total\": " << doc(total)
              << "}\n";
    return absl::OkStatus();
  }
  Table t({"JOB", ">CHECKPOINTS", ">LOCAL", ">REMOTE", ">RAM"});
  for (const Usage& u : rows) {
    t.AddRow({u.job, std::to_string(u.checkpoints), HumanBytes(u.local), HumanBytes(u.remote),
              HumanBytes(u.ram)});
  }
  if (job.empty()) {
    t.AddRow({"total", std::to_string(total.checkpoints), HumanBytes(total.local),
              HumanBytes(total.remote), HumanBytes(total.ram)});
  }
  std::cout << t.Render();
  return absl::OkStatus();
}

absl::Status Status(Context& ctx, const std::string& job, uint64_t step) {
  v1::GetStatusRequest req;
  req.set_job(job);
  req.set_step(step);
  v1::CheckpointStatus resp;
  absl::Status s = Call(ctx, ctx.rpc_timeout_ms,
                        [&](grpc::ClientContext* c) { return ctx.stub->GetStatus(c, req, &resp); });
  if (!s.ok()) return s;
  if (ctx.json) return PrintJson(resp);
  PrintSummary(resp.summary());
  if (!resp.summary().origin().empty() && resp.summary().state() == v1::PERSISTING) {
    uint64_t total = std::max<uint64_t>(resp.summary().bytes(), 1);
    std::cout << "  progress: " << HumanBytes(resp.bytes_persisted()) << " of "
              << HumanBytes(resp.summary().bytes()) << " (" << resp.bytes_persisted() * 100 / total
              << "%)\n";
  }
  std::cout << "  staged: " << HumanBytes(resp.bytes_staged())
            << "   persisted: " << HumanBytes(resp.bytes_persisted()) << "\n"
            << "  ranks missing: "
            << (resp.missing_ranks().empty() ? "none" : absl::StrJoin(resp.missing_ranks(), ","))
            << "\n";
  PrintTimings(resp.timings(), resp.summary().tiers(), resp.summary().created_unix_ms());
  if (!resp.nodes().empty()) {
    // Spanning nodes: this daemon first, then the parts it read from the shared tier.
    std::cout << "  spans nodes (" << resp.summary().local_world_size()
              << " ranks through this daemon)"
              << (resp.waiting_for().empty() ? "" : "; waiting for " + resp.waiting_for()) << "\n";
    Table nodes({"NODE", "RANKS", "PART", "ROLE"});
    for (const v1::NodeStatus& n : resp.nodes()) {
      nodes.AddRow({n.node(), n.ranks().empty() ? "-" : absl::StrJoin(n.ranks(), ","),
                    n.part_durable() ? "on the shared tier" : "not yet",
                    n.coordinator() ? "coordinator" : ""});
    }
    std::cout << "\n" << nodes.Render();
  }
  if (resp.ranks().empty()) return absl::OkStatus();
  Table t({">RANK", "STAGED", "PERSISTED", ">BYTES_STAGED", ">BYTES_PERSISTED", ">SHARDS"});
  for (const v1::RankStatus& r : resp.ranks()) {
    t.AddRow({std::to_string(r.rank()), r.staged() ? "yes" : "no", r.persisted() ? "yes" : "no",
              HumanBytes(r.bytes_staged()), HumanBytes(r.bytes_persisted()),
              std::to_string(r.shard_count())});
  }
  std::cout << "\n" << t.Render();
  return absl::OkStatus();
}

absl::Status Inspect(Context& ctx, const std::string& job, uint64_t step) {
  v1::InspectResponse all;
  v1::InspectRequest req;
  req.set_job(job);
  req.set_step(step);
  do {
    v1::InspectResponse page;
    absl::Status s = Call(ctx, ctx.rpc_timeout_ms,
                          [&](grpc::ClientContext* c) { return ctx.stub->Inspect(c, req, &page); });
    if (!s.ok()) return s;
    if (!all.has_summary()) *all.mutable_summary() = page.summary();
    all.mutable_items()->MergeFrom(page.items());
    req.set_page_token(page.next_page_token());
  } while (!req.page_token().empty());
  if (ctx.json) return PrintJson(all);
  PrintSummary(all.summary());
  Table t({"NAME", "KIND", "DTYPE", "SHAPE", ">SHARDS", ">BYTES"});
  for (const v1::ItemInfo& i : all.items()) {
    bool object = i.kind() == v1::OBJECT;
    std::string dtype =
        object ? Lower(v1::ObjectScope_Name(i.scope())) : Lower(v1::DType_Name(i.dtype()));
    std::string shape = object ? "-" : absl::StrCat("[", absl::StrJoin(i.shape(), ","), "]");
    t.AddRow({i.name(), Lower(v1::ItemKind_Name(i.kind())), dtype, shape,
              std::to_string(i.shard_count()), HumanBytes(i.bytes())});
  }
  std::cout << "\n" << t.Render();
  return absl::OkStatus();
}

absl::Status Remove(Context& ctx, const std::string& job, uint64_t step) {
  v1::DeleteRequest req;
  req.set_job(job);
  req.set_step(step);
  v1::DeleteResponse resp;
  absl::Status s = Call(ctx, ctx.rpc_timeout_ms,
                        [&](grpc::ClientContext* c) { return ctx.stub->Delete(c, req, &resp); });
  if (!s.ok()) return s;
  if (ctx.json) return PrintJson(resp);
  std::cout << "deleted " << job << "/" << step << "\n";
  return absl::OkStatus();
}

absl::Status CollectGarbage(Context& ctx, const std::string& job, bool dry_run) {
  v1::GcRequest req;
  req.set_job(job);
  req.set_dry_run(dry_run);
  v1::GcResponse resp;
  absl::Status s = Call(ctx, ctx.rpc_timeout_ms, [&](grpc::ClientContext* c) {
    return ctx.stub->CollectGarbage(c, req, &resp);
  });
  if (!s.ok()) return s;
  absl::Status first = absl::OkStatus();
  for (const v1::GcAction& a : resp.actions()) {
    if (!a.error().empty() && first.ok()) {
      first = absl::AbortedError(
          absl::StrCat(a.action(), " ", a.job(), "/", a.step(), ": ", a.error()));
    }
  }
  if (ctx.json) {
    absl::Status printed = PrintJson(resp);
    return printed.ok() ? first : printed;
  }
  if (resp.actions().empty()) std::cout << "nothing to collect\n";
  Table t({"JOB", ">STEP", "ACTION", "WHY", "RESULT"});
  for (const v1::GcAction& a : resp.actions()) {
    t.AddRow({a.job(), std::to_string(a.step()), a.action(), a.why(),
              dry_run ? "(dry run)" : (a.error().empty() ? "done" : a.error())});
  }
  if (!resp.actions().empty()) std::cout << t.Render();
  return first;
}

absl::Status Prefetch(Context& ctx, const std::string& job, std::optional<uint64_t> step) {
  v1::PrefetchRequest req;
  req.set_job(job);
  if (step) {
    req.set_step(*step);
  } else {
    req.set_latest(true);
  }
  v1::PrefetchResponse resp;
  absl::Status s = Call(ctx, ctx.rpc_timeout_ms,
                        [&](grpc::ClientContext* c) { return ctx.stub->Prefetch(c, req, &resp); });
  if (!s.ok()) return s;
  if (ctx.json) return PrintJson(resp);
  std::cout << job << "/" << resp.step() << " is in the RAM tier (" << resp.ram_bytes()
            << " bytes; " << resp.bytes_read() << " read from storage now)\n";
  return absl::OkStatus();
}

absl::Status Latest(Context& ctx, const std::string& job, const std::string& durable) {
  v1::LatestRequest req;
  req.set_job(job);
  req.set_durable(durable == "store"  ? v1::DURABLE_STORE
                  : durable == "peer" ? v1::DURABLE_PEER
                                      : v1::DURABLE_COMMITTED);
  v1::LatestResponse resp;
  absl::Status s = Call(ctx, ctx.rpc_timeout_ms,
                        [&](grpc::ClientContext* c) { return ctx.stub->Latest(c, req, &resp); });
  if (!s.ok()) return s;
  if (ctx.json) return PrintJson(resp);
  std::cout << resp.step() << "\n";
  return absl::OkStatus();
}

absl::Status Wait(Context& ctx, const std::string& job, uint64_t step, uint32_t timeout_ms,
                  const std::string& until) {
  const bool until_staged = until == "staged";
  v1::WaitRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_until(until_staged        ? v1::WAIT_FOR_ALL_STAGED
                : until == "remote" ? v1::WAIT_FOR_REMOTE
                                    : v1::WAIT_FOR_COMMITTED);
  req.set_timeout_ms(timeout_ms);
  v1::CheckpointStatus resp;
  absl::Status s = Call(ctx, int64_t{timeout_ms} + kWaitMarginMs,
                        [&](grpc::ClientContext* c) { return ctx.stub->Wait(c, req, &resp); });
  if (!s.ok()) return s;
  if (ctx.json) {
    s = PrintJson(resp);
  } else {
    std::cout << job << "/" << step << ": " << StateString(resp.summary())
              << "   tiers: " << TiersString(resp.summary().tiers()) << "\n";
  }
  if (!s.ok()) return s;
  const v1::CheckpointState state = resp.summary().state();
  const bool reached = state == v1::CheckpointState::COMMITTED ||
                       (until_staged && state == v1::CheckpointState::PERSISTING);
  if (reached) return absl::OkStatus();
  if (state == v1::CheckpointState::ABORTED) {
    return absl::AbortedError(
        absl::StrCat(job, "/", step, " was aborted: ", resp.summary().error()));
  }
  std::string missing =
      resp.missing_ranks().empty()
          ? ""
          : absl::StrCat("; ranks missing: ", absl::StrJoin(resp.missing_ranks(), ","));
  return absl::DeadlineExceededError(absl::StrCat(job, "/", step, " is still ",
                                                  v1::CheckpointState_Name(state), " after ",
                                                  timeout_ms, " ms", missing));
}

absl::Status Reshard(Context& ctx, const std::string& job, uint64_t step,
                     const std::string& target_job, uint64_t target_step, const std::string& spec) {
  v1::ReshardRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_target_job(target_job);
  req.set_target_step(target_step);
  req.set_spec(spec);
  v1::CheckpointStatus resp;
  absl::Status s = Call(ctx, ctx.rpc_timeout_ms,
                        [&](grpc::ClientContext* c) { return ctx.stub->Reshard(c, req, &resp); });
  if (!s.ok()) return s;
  if (ctx.json) return PrintJson(resp);
  const v1::CheckpointSummary& t = resp.summary();
  std::cout << t.job() << "/" << t.step() << ": " << StateString(t) << " (" << t.origin()
            << ", world size " << t.world_size() << ")\n"
            << "follow it with: ckptctl status " << t.job() << " " << t.step()
            << "; cancel with: ckptctl abort " << t.job() << " " << t.step() << "\n";
  return absl::OkStatus();
}

absl::Status Abort(Context& ctx, const std::string& job, uint64_t step, const std::string& reason) {
  v1::AbortRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_reason(reason);
  v1::CheckpointStatus resp;
  absl::Status s = Call(ctx, ctx.rpc_timeout_ms,
                        [&](grpc::ClientContext* c) { return ctx.stub->Abort(c, req, &resp); });
  if (!s.ok()) return s;
  if (ctx.json) return PrintJson(resp);
  std::cout << job << "/" << step << ": " << StateString(resp.summary()) << "\n";
  return absl::OkStatus();
}

}  // namespace ckptctl
