// ckptctl: the operator CLI of ckptd. Parses the command line, connects to the daemon's unix
// socket and runs one command (commands.cc). Exit codes: 0 ok, 1 the daemon (or the connection)
// answered an error, 2 usage error, 3 verify found damage.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "commands.h"
#include "export.h"
#include "verify.h"
#include "watch.h"

namespace {

constexpr const char* kDefaultSocket = "/var/lib/ckptd/ckptd.sock";
constexpr int kRpcMessageBytesMax = 64 * 1024 * 1024;
constexpr uint32_t kWaitTimeoutMsDefault = 600000;
constexpr int kExitDamaged = 3;  // verify found something that does not verify

constexpr const char* kUsage = R"(usage: ckptctl [--socket PATH] [--json] COMMAND [ARGS]

commands:
  ls [JOB]                 jobs (name, owner, checkpoints, latest committed step), or with JOB its
                           checkpoints (step, state, size, tiers, world size, created, error)
  du [JOB]                 bytes per job and tier: checkpoints, bytes on local storage, on the
                           remote tier and in the RAM tier (with no JOB: every job and a total)
  status JOB STEP          state, per-rank progress (staged/persisted bytes), missing ranks, error,
                           and where the time went: each rank's phases (reserve, copy, staged,
                           queued, flush, fsync) and the checkpoint's (all staged, all persisted,
                           manifest, committed, remote durable)
  watch [JOB] [--interval_ms N] [--until_idle] [--plain]
                           live progress of the checkpoints being saved and uploaded: bytes done
                           of the total, rate, ETA, ranks missing, per tier; redrawn in place on a
                           terminal (--plain, or not a terminal: changed lines printed as they
                           change; --json: one JSON object per line); one line when each ends;
                           until interrupted, or with --until_idle until nothing is in flight
  inspect JOB STEP         items: name, kind, dtype (or object scope), shape, shards, bytes
  rm JOB STEP              delete a checkpoint
  latest JOB [--durable committed|peer|store]
                           the newest committed step (that survives the loss of a node: peer, of
                           every node: store; docs/PEERS.md "What survives what")
  wait JOB STEP [--timeout_ms N] [--until committed|staged|remote]
                           block until the checkpoint is committed (or all ranks staged, or also
                           durable on the remote tier); exit 1
                           if it was aborted or the timeout (default 600000 ms) passed
  reshard JOB STEP TARGET_STEP SPEC [--target_job JOB2]
                           write a new checkpoint JOB2/TARGET_STEP (JOB2 defaults to JOB) holding
                           JOB/STEP in the layout SPEC, e.g. "consolidated", "rows:4",
                           "*.bias=consolidated; *=grid:2x4" (docs/USER_GUIDE.md: "Offline reshard"); runs in
                           the daemon: follow it with status, cancel it with abort
  abort JOB STEP [REASON]  abort a checkpoint being saved, or cancel a reshard writing it
  gc [JOB] [--dry_run]     apply the daemon's retention (keep_local, keep_remote) now, to JOB or
                           every job you may delete; prints each copy dropped or checkpoint
                           deleted (exit 1 if any failed); --dry_run only lists them
  prefetch JOB [STEP]      bring a committed checkpoint (default: the latest) into the daemon's RAM
                           tier ahead of a restart, so the restore copies from memory
  export JOB STEP|latest [--format safetensors] [--max_file_bytes SIZE] [--force] DIR
                           write the checkpoint's tensors, consolidated, as Hugging Face
                           safetensors: model-0000i-of-0000N.safetensors (model.safetensors if
                           one) of at most SIZE each (default 5GiB; units B KB MB GB KiB MiB GiB)
                           plus model.safetensors.index.json; object items are skipped. DIR is
                           created if missing; one holding an export is refused without --force
  verify JOB STEP|latest [--sample FRACTION] [--seed N] [--tier local|remote|ram|peer]
                         [--timeout_ms N]
                           re-read the checkpoint on every tier it is on (or only TIER) and check
                           each tier's manifest and every block's crc32c, or FRACTION (0 < F <= 1)
                           of the blocks (each shard's first and last always; --seed N repeats a
                           sample); prints a BAD line per damaged block (tier, item, saving rank,
                           blob, block, byte offset), missing or truncated blob, or bad manifest,
                           then a line per tier; waits up to --timeout_ms (default 3600000);
                           exit 3 if anything did not verify

options:
  --socket PATH   the daemon's socket (default: $CKPTD_SOCKET, else /var/lib/ckptd/ckptd.sock)
  --json          print the daemon's answer as one JSON document
  --help          this text

exit codes: 0 ok, 1 daemon error ("ckptctl: CODE: message" on stderr), 2 usage error,
            3 verify found damage
)";

struct Args {
  std::string socket;
  bool json = false;
  bool help = false;
  bool dry_run = false;  // gc
  uint32_t timeout_ms = kWaitTimeoutMsDefault;
  bool timeout_given = false;
  std::string until = "committed";
  bool until_given = false;
  std::string durable = "committed";  // latest
  bool durable_given = false;
  std::vector<std::string> positional;
  // export
  std::string format = "safetensors";
  uint64_t max_file_bytes = ckptctl::safetensors::kMaxFileBytesDefault;
  bool force = false;
  bool export_flag_given = false;
  std::string target_job;  // reshard
  // watch
  uint32_t interval_ms = 500;
  bool until_idle = false;
  bool plain = false;
  bool watch_flag_given = false;
  // verify
  double sample = 0;
  uint64_t seed = 0;
  std::string tier;
  bool verify_flag_given = false;
};

int Usage(const std::string& problem) {
  if (!problem.empty()) std::cerr << "ckptctl: " << problem << "\n";
  std::cerr << kUsage;
  return 2;
}

// One command-line flag: its name, and its value from "--flag=value" or (Take) the next
// argument.
struct Flag {
  std::string name;
  std::string value;
  bool has_value = false;
  int argc = 0;
  char** argv = nullptr;
  int* i = nullptr;  // the argument being parsed; Take moves it past the value

  bool Take() {
    if (has_value) return true;
    if (*i + 1 >= argc) return false;
    value = argv[++*i];
    return true;
  }
};

// The flag parsers of each command group: nullopt when `f` is not theirs, else an error text
// (empty when fine).
std::optional<std::string> ParseGeneralFlag(Flag& f, Args* args) {
  if (f.name == "--help" || f.name == "-h") {
    args->help = true;
  } else if (f.name == "--json") {
    args->json = true;
  } else if (f.name == "--socket") {
    if (!f.Take() || f.value.empty()) return "--socket needs a path";
    args->socket = f.value;
  } else if (f.name == "--timeout_ms") {
    if (!f.Take() || !absl::SimpleAtoi(f.value, &args->timeout_ms)) {
      return "--timeout_ms needs a number of milliseconds";
    }
    args->timeout_given = true;
  } else if (f.name == "--durable") {
    if (!f.Take() || (f.value != "committed" && f.value != "peer" && f.value != "store")) {
      return "--durable needs committed, peer or store";
    }
    args->durable = f.value;
    args->durable_given = true;
  } else if (f.name == "--until") {
    if (!f.Take() || (f.value != "committed" && f.value != "staged" && f.value != "remote")) {
      return "--until needs committed, staged or remote";
    }
    args->until = f.value;
    args->until_given = true;
  } else if (f.name == "--target_job") {
    if (!f.Take() || f.value.empty()) return "--target_job needs a job name";
    args->target_job = f.value;
  } else if (f.name == "--dry_run" || f.name == "--dry-run") {
    args->dry_run = true;
  } else {
    return std::nullopt;
  }
  return "";
}

std::optional<std::string> ParseExportFlag(Flag& f, Args* args) {
  if (f.name == "--format") {
    if (!f.Take() || f.value != "safetensors") {
      return "--format needs safetensors (the only export format), got \"" + f.value + "\"";
    }
    args->format = f.value;
  } else if (f.name == "--max_file_bytes") {
    if (!f.Take()) return "--max_file_bytes needs a size";
    auto size = ckptctl::safetensors::ParseByteSize(f.value);
    if (!size.ok()) return "--max_file_bytes: " + std::string(size.status().message());
    if (*size < ckptctl::safetensors::kMaxFileBytesMin) {
      return absl::StrCat("--max_file_bytes must be at least ",
                          ckptctl::safetensors::kMaxFileBytesMin, " bytes");
    }
    args->max_file_bytes = *size;
  } else if (f.name == "--force") {
    args->force = true;
  } else {
    return std::nullopt;
  }
  args->export_flag_given = true;
  return "";
}

std::optional<std::string> ParseWatchFlag(Flag& f, Args* args) {
  if (f.name == "--interval_ms") {
    if (!f.Take() || !absl::SimpleAtoi(f.value, &args->interval_ms) || args->interval_ms < 50 ||
        args->interval_ms > 3600000) {
      return "--interval_ms needs a number of milliseconds from 50 to 3600000";
    }
  } else if (f.name == "--until_idle" || f.name == "--until-idle") {
    args->until_idle = true;
  } else if (f.name == "--plain") {
    args->plain = true;
  } else {
    return std::nullopt;
  }
  args->watch_flag_given = true;
  return "";
}

std::optional<std::string> ParseVerifyFlag(Flag& f, Args* args) {
  if (f.name == "--sample") {
    if (!f.Take() || !absl::SimpleAtod(f.value, &args->sample) ||
        !(args->sample > 0 && args->sample <= 1)) {
      return "--sample needs a fraction of the blocks, 0 < F <= 1";
    }
  } else if (f.name == "--seed") {
    if (!f.Take() || !absl::SimpleAtoi(f.value, &args->seed)) {
      return "--seed needs a non-negative integer";
    }
  } else if (f.name == "--tier") {
    if (!f.Take() ||
        (f.value != "local" && f.value != "remote" && f.value != "ram" && f.value != "peer")) {
      return "--tier needs local, remote, ram or peer";
    }
    args->tier = f.value;
  } else {
    return std::nullopt;
  }
  args->verify_flag_given = true;
  return "";
}

// Flags may come before or after the command. Returns an error text, empty when fine.
std::string Parse(int argc, char** argv, Args* args) {
  for (int i = 1; i < argc; ++i) {
    Flag f{.name = argv[i], .argc = argc, .argv = argv, .i = &i};
    if (f.name.rfind("--", 0) == 0 && f.name.find('=') != std::string::npos) {
      f.value = f.name.substr(f.name.find('=') + 1);
      f.name = f.name.substr(0, f.name.find('='));
      f.has_value = true;
    }
    std::optional<std::string> problem = ParseGeneralFlag(f, args);
    if (!problem) problem = ParseExportFlag(f, args);
    if (!problem) problem = ParseWatchFlag(f, args);
    if (!problem) problem = ParseVerifyFlag(f, args);
    if (problem) {
      if (!problem->empty()) return *problem;
    } else if (f.name.size() > 1 && f.name[0] == '-') {
      return "unknown flag " + f.name;
    } else {
      args->positional.push_back(f.name);
    }
  }
  return "";
}

std::string SocketPath(const Args& args) {
  if (!args.socket.empty()) return args.socket;
  const char* env = std::getenv("CKPTD_SOCKET");
  if (env != nullptr && env[0] != '\0') return env;
  return kDefaultSocket;
}

ckptctl::Context MakeContext(const Args& args) {
  ckptctl::Context ctx;
  std::string path = SocketPath(args);
  ctx.target = path.rfind("unix:", 0) == 0 ? path : "unix:" + path;
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(kRpcMessageBytesMax);
  channel_args.SetMaxSendMessageSize(kRpcMessageBytesMax);
  ctx.stub = ckptd::v1::Checkpoint::NewStub(
      grpc::CreateCustomChannel(ctx.target, grpc::InsecureChannelCredentials(), channel_args));
  ctx.json = args.json;
  return ctx;
}

// A flag given to a command it does not apply to (an error text), or "".
std::string MisappliedFlag(const Args& args, const std::string& cmd) {
  if (args.until_given && cmd != "wait") return "--until applies to wait only";
  if (args.durable_given && cmd != "latest") return "--durable applies to latest only";
  if (args.timeout_given && cmd != "wait" && cmd != "verify") {
    return "--timeout_ms applies to wait and verify only";
  }
  if (args.verify_flag_given && cmd != "verify") {
    return "--sample, --seed and --tier apply to verify only";
  }
  if (!args.target_job.empty() && cmd != "reshard") return "--target_job applies to reshard only";
  if (args.dry_run && cmd != "gc") return "--dry_run applies to gc only";
  if (args.watch_flag_given && cmd != "watch") {
    return "--interval_ms, --until_idle and --plain apply to watch only";
  }
  if (args.export_flag_given && cmd != "export") {
    return "--format, --max_file_bytes and --force apply to export only";
  }
  return "";
}

// The exit status of a command that answered `s`: 0, or 1 with the error on stderr.
int ExitStatus(const absl::Status& s) {
  if (s.ok()) return 0;
  std::cerr << "ckptctl: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  return 1;
}

// STEP|latest of export and verify: false (usage reported) when it is neither.
bool ParseStepOrLatest(const std::string& text, std::optional<uint64_t>* step) {
  if (text == "latest") return true;
  uint64_t parsed = 0;
  if (!absl::SimpleAtoi(text, &parsed)) {
    Usage(absl::StrCat("STEP must be a non-negative integer or latest, got \"", text, "\""));
    return false;
  }
  *step = parsed;
  return true;
}

// The commands with more than a job and a step: their arguments checked, then run.
int RunReshard(ckptctl::Context& ctx, const Args& args) {
  const std::vector<std::string>& p = args.positional;
  uint64_t step = 0;
  uint64_t target_step = 0;
  if (p.size() != 5) return Usage("reshard takes JOB STEP TARGET_STEP SPEC");
  if (!absl::SimpleAtoi(p[2], &step) || !absl::SimpleAtoi(p[3], &target_step)) {
    return Usage("STEP and TARGET_STEP must be non-negative integers");
  }
  return ExitStatus(ckptctl::Reshard(ctx, p[1], step, args.target_job, target_step, p[4]));
}

int RunAbort(ckptctl::Context& ctx, const Args& args) {
  const std::vector<std::string>& p = args.positional;
  uint64_t step = 0;
  if (p.size() != 3 && p.size() != 4) return Usage("abort takes JOB STEP [REASON]");
  if (!absl::SimpleAtoi(p[2], &step)) return Usage("STEP must be a non-negative integer");
  return ExitStatus(ckptctl::Abort(ctx, p[1], step, p.size() == 4 ? p[3] : ""));
}

int RunPrefetch(ckptctl::Context& ctx, const Args& args) {
  const std::vector<std::string>& p = args.positional;
  if (p.size() != 2 && p.size() != 3) return Usage("prefetch takes JOB [STEP]");
  std::optional<uint64_t> at;
  if (p.size() == 3) {
    uint64_t step = 0;
    if (!absl::SimpleAtoi(p[2], &step)) return Usage("STEP must be a non-negative integer");
    at = step;
  }
  return ExitStatus(ckptctl::Prefetch(ctx, p[1], at));
}

int RunExport(ckptctl::Context& ctx, const Args& args) {
  const std::vector<std::string>& p = args.positional;
  if (p.size() != 4) return Usage("export takes JOB STEP|latest DIR");
  ckptctl::ExportOptions o{.job = p[1],
                           .format = args.format,
                           .dir = p[3],
                           .max_file_bytes = args.max_file_bytes,
                           .force = args.force};
  if (!ParseStepOrLatest(p[2], &o.step)) return 2;
  return ExitStatus(ckptctl::Export(ctx, o));
}

int RunVerify(ckptctl::Context& ctx, const Args& args) {
  const std::vector<std::string>& p = args.positional;
  if (p.size() != 3) return Usage("verify takes JOB STEP|latest");
  ckptctl::VerifyOptions o{
      .job = p[1], .sample = args.sample, .seed = args.seed, .tier = args.tier};
  if (args.timeout_given) o.timeout_ms = args.timeout_ms;
  if (!ParseStepOrLatest(p[2], &o.step)) return 2;
  bool damaged = false;
  absl::Status s = ckptctl::Verify(ctx, o, &damaged);
  if (s.ok() && damaged) return kExitDamaged;
  return ExitStatus(s);
}

// Runs the command; 2 for a usage error (already reported), else its exit status.
int Run(const Args& args) {
  const std::vector<std::string>& p = args.positional;
  const std::string& cmd = p[0];
  const size_t n = p.size() - 1;
  uint64_t step = 0;
  auto need = [&](size_t count, const char* shape) -> bool {
    if (n != count) {
      Usage(absl::StrCat(cmd, " takes ", shape));
      return false;
    }
    if (count == 2 && !absl::SimpleAtoi(p[2], &step)) {
      Usage(absl::StrCat("STEP must be a non-negative integer, got \"", p[2], "\""));
      return false;
    }
    return true;
  };
  if (std::string misapplied = MisappliedFlag(args, cmd); !misapplied.empty()) {
    return Usage(misapplied);
  }
  absl::Status s;
  ckptctl::Context ctx = MakeContext(args);
  if (cmd == "ls") {
    if (n > 1) return Usage("ls takes [JOB]");
    s = n == 0 ? ckptctl::ListJobs(ctx) : ckptctl::ListCheckpoints(ctx, p[1]);
  } else if (cmd == "du") {
    if (n > 1) return Usage("du takes [JOB]");
    s = ckptctl::DiskUsage(ctx, n == 0 ? "" : p[1]);
  } else if (cmd == "status") {
    if (!need(2, "JOB STEP")) return 2;
    s = ckptctl::Status(ctx, p[1], step);
  } else if (cmd == "watch") {
    if (n > 1) return Usage("watch takes [JOB]");
    const ckptctl::WatchOptions o{.job = n == 1 ? p[1] : "",
                                  .interval_ms = args.interval_ms,
                                  .until_idle = args.until_idle,
                                  .tty = !args.plain && isatty(STDOUT_FILENO) == 1};
    s = ckptctl::Watch(ctx, o, std::cout);
  } else if (cmd == "inspect") {
    if (!need(2, "JOB STEP")) return 2;
    s = ckptctl::Inspect(ctx, p[1], step);
  } else if (cmd == "rm") {
    if (!need(2, "JOB STEP")) return 2;
    s = ckptctl::Remove(ctx, p[1], step);
  } else if (cmd == "latest") {
    if (!need(1, "JOB")) return 2;
    s = ckptctl::Latest(ctx, p[1], args.durable);
  } else if (cmd == "wait") {
    if (!need(2, "JOB STEP")) return 2;
    s = ckptctl::Wait(ctx, p[1], step, args.timeout_ms, args.until);
  } else if (cmd == "gc") {
    if (n > 1) return Usage("gc takes [JOB]");
    s = ckptctl::CollectGarbage(ctx, n == 1 ? p[1] : "", args.dry_run);
  } else if (cmd == "reshard") {
    return RunReshard(ctx, args);
  } else if (cmd == "abort") {
    return RunAbort(ctx, args);
  } else if (cmd == "prefetch") {
    return RunPrefetch(ctx, args);
  } else if (cmd == "export") {
    return RunExport(ctx, args);
  } else if (cmd == "verify") {
    return RunVerify(ctx, args);
  } else {
    return Usage("unknown command " + cmd);
  }
  return ExitStatus(s);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  std::string problem = Parse(argc, argv, &args);
  if (!problem.empty()) return Usage(problem);
  if (args.help) {
    std::cout << kUsage;
    return 0;
  }
  if (args.positional.empty()) return Usage("missing command");
  return Run(args);
}
