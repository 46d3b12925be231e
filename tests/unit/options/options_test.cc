#include "options.h"

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckptd/sync_point.h"

namespace ckptd {
namespace {

TEST_CASE("options: defaults derive from the state dir", "[unit]") {
  auto o = ParseOptions({"--state_dir=/tmp/x/"});
  REQUIRE(o.ok());
  CHECK(o->state_dir == "/tmp/x");
  CHECK(o->data_dir == "/tmp/x/data");
  CHECK(o->socket_path == "/tmp/x/ckptd.sock");
  CHECK(o->staging_bytes_max == (1u << 30));
}

TEST_CASE("options: flags override the config file, both validated", "[unit]") {
  std::string path = std::string(getenv("CKPTD_TEST_TMP") ? getenv("CKPTD_TEST_TMP") : "/tmp") +
                     "/ckptd-options-test.conf";
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  {
    std::ofstream f(path);
    f << "# comment\nstate_dir = /srv/ckptd\nstaging_bytes_max = 33554432\nlog_format = \"json\"\n";
  }
  auto o = ParseOptions({"--config", path, "--staging-bytes-max=67108864"});
  REQUIRE(o.ok());
  CHECK(o->state_dir == "/srv/ckptd");
  CHECK(o->staging_bytes_max == 67108864);
  CHECK(o->log_format == "json");
  {
    std::ofstream f(path);
    f << "no_such_option = 1\n";
  }
  auto bad = ParseOptions({"--config=" + path});
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find(":1: unknown option \"no_such_option\"") !=
        std::string::npos);
}

TEST_CASE("options: every invalid value is a clear error naming the option", "[unit]") {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  std::vector<Case> cases = {
      {{"--staging_bytes_max=100"}, "staging_bytes_max"},
      {{"--staging_bytes_max=16777217"}, "multiple of 4096"},
      {{"--staging_bytes_max=lots"}, "not a non-negative integer"},
      {{"--io_queue_depth=0"}, "io_queue_depth"},
      {{"--log_format=xml"}, "log_format"},
      {{"--log_level=loud"}, "log_level"},
      {{"--direct_io=maybe"}, "not true or false"},
      {{"--socket=/" + std::string(120, 'a')}, "101 bytes"},
      {{"--bogus=1"}, "unknown option"},
      {{"positional"}, "unexpected argument"},
      {{"--stage_timeout_ms=1"}, "stage_timeout_ms"},
      {{"--owner_map=gid"}, "option owner_map = \"gid\": expected uid or name"},
      {{"--owner_map_file=/nonexistent/owners"}, "owner_map_file = \"/nonexistent/owners\""},
  };
  for (const Case& c : cases) {
    INFO(c.args[0]);
    auto o = ParseOptions(c.args);
    REQUIRE_FALSE(o.ok());
    CHECK(o.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(o.status().message()).find(c.expect) != std::string::npos);
  }
  auto help = ParseOptions({"--help"});
  CHECK(help.status().code() == absl::StatusCode::kNotFound);
  CHECK(std::string(help.status().message()).find("--staging_bytes_max") != std::string::npos);
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

TEST_CASE("options: debug_crash_at names a crash point, and needs a build with test hooks",
          "[unit]") {
  auto o = ParseOptions({"--state_dir=/tmp/x", "--debug_crash_at=flush.rank_persisted:2"});
  if (kTestHooks) {
    REQUIRE(o.ok());
    CHECK(o->debug_crash_at == "flush.rank_persisted:2");
    auto unknown = ParseOptions({"--state_dir=/tmp/x", "--debug_crash_at=flush.nowhere"});
    REQUIRE_FALSE(unknown.ok());
    CHECK(std::string(unknown.status().message()).find("no crash point") != std::string::npos);
    auto zeroth = ParseOptions({"--state_dir=/tmp/x", "--debug_crash_at=save.journaled:0"});
    CHECK_FALSE(zeroth.ok());
  } else {
    REQUIRE_FALSE(o.ok());
    CHECK(std::string(o.status().message()).find("without test hooks") != std::string::npos);
  }
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

// The tier options (docs/OPERATIONS.md "Tiers"): a policy with a remote tier needs one; "remote" is
// refused as not built; the remote dir may not be the local data or state dir; upload limits hold.
TEST_CASE("options: retention rules parse in order, unnamed keys take the options' values",
          "[unit]") {
  auto o = ParseOptions({"--state_dir=/tmp/x", "--keep_local=3", "--keep_every=1000",
                         "--retention_rules= eval-*: keep_local=1, keep_every=0 ;; llama-?b: "
                         "keep_local=5 ;"});
  REQUIRE(o.ok());
  REQUIRE(o->retention.size() == 2);
  CHECK(o->retention[0].pattern == "eval-*");
  CHECK(o->RetentionOf("eval-7").keep_local == 1);
  CHECK(o->RetentionOf("eval-7").keep_every == 0);
  CHECK(o->RetentionOf("llama-7b").keep_local == 5);
  CHECK(o->RetentionOf("llama-7b").keep_every == 1000);  // not named: the option's
  CHECK(o->RetentionOf("llama-70b").keep_local == 3);    // no rule matches: the options
  CHECK(o->RetentionOf("train").keep_every == 1000);
  CHECK(o->RetentionOn());
  auto off = ParseOptions({"--state_dir=/tmp/x", "--keep_every=10"});
  REQUIRE(off.ok());
  CHECK(!off->RetentionOn());  // milestones alone drop nothing
  auto rule_only = ParseOptions({"--state_dir=/tmp/x", "--retention_rules=a*: keep_local=2"});
  REQUIRE(rule_only.ok());
  CHECK(rule_only->RetentionOn());
  CHECK(rule_only->RetentionOf("b").keep_local == 0);
  for (const char* bad : {"x", "x: keep=1", "x: keep_local=-1", ": keep_local=1",
                          "x: keep_local=99999999999", "x: keep_remote=1"}) {
    INFO(bad);
    auto r = ParseOptions({"--state_dir=/tmp/x", std::string("--retention_rules=") + bad});
    REQUIRE(!r.ok());
    CHECK(r.status().message().find("retention_rules") != std::string::npos);
  }
}

TEST_CASE("options: --help-config is a Markdown table of every option with its default", "[unit]") {
  auto o = ParseOptions({"--help-config"});
  REQUIRE(o.status().code() == absl::StatusCode::kNotFound);
  const std::string ref(o.status().message());
  CHECK(ref.rfind("| option | default | meaning |\n|---|---|---|\n", 0) == 0);
  CHECK(ref.find("| `staging_bytes_max` | 1 GiB | ") != std::string::npos);
  CHECK(ref.find("| `state_dir` | `/var/lib/ckptd` | ") != std::string::npos);
  CHECK(ref.find("| `socket_mode` | `0600` | ") != std::string::npos);
  CHECK(ref.find("| `direct_io` | true | ") != std::string::npos);
  CHECK(ref.find("| `data_dir` | `<state_dir>/data` | ") != std::string::npos);
  CHECK(ref.find("| `keep_every` | 0 | ") != std::string::npos);
  // Every option --help lists is in the reference, and nothing else.
  auto help = ParseOptions({"--help"});
  std::istringstream usage{std::string(help.status().message())};
  size_t options = 0;
  for (std::string line; std::getline(usage, line);) {
    if (line.rfind("  --", 0) != 0) continue;
    const std::string name = line.substr(4, line.find(' ', 4) - 4);
    if (name == "config" || name == "help-config") continue;
    ++options;
    CHECK(ref.find("| `" + name + "` |") != std::string::npos);
  }
  CHECK(options + 2 == static_cast<size_t>(std::count(ref.begin(), ref.end(), '\n')));
}

TEST_CASE("options: tier policy and remote tier are validated", "[unit]") {
  auto ok = ParseOptions({"--state_dir=/tmp/x", "--remote_dir=/mnt/shared",
                          "--tier_policy=local+remote", "--upload_threads=4"});
  REQUIRE(ok.ok());
  CHECK(ok->tier_policy == "local+remote");
  CHECK(ok->remote_dir == "/mnt/shared");
  CHECK(ok->upload_threads == 4);
  auto defaults = ParseOptions({"--state_dir=/tmp/x"});
  REQUIRE(defaults.ok());
  CHECK(defaults->tier_policy == "local");
  CHECK(defaults->remote_dir.empty());
  // The node's name on the shared tier: the host name unless given.
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof(host) - 1) == 0);
  CHECK(defaults->node_id == host);
  CHECK(defaults->cluster_poll_ms == 200);
  auto named = ParseOptions({"--state_dir=/tmp/x", "--node_id=rack2.node-17_a"});
  REQUIRE(named.ok());
  CHECK(named->node_id == "rack2.node-17_a");

  struct Bad {
    std::vector<std::string> args;
    const char* says;
  };
  const Bad bad[] = {
      {{"--tier_policy=local+remote"}, "needs a remote tier (remote_dir or"},
      {{"--tier_policy=remote"}, "needs a remote tier (remote_dir or"},
      {{"--tier_policy=cloud"}, "expected local, local+remote, remote or local+peer"},
      {{"--tier_policy=local+peer", "--remote_dir=/tmp"}, "needs the peer tier (peer_listen_addr"},
      {{"--remote_dir=/tmp/x/data"}, "is the local data or state dir"},
      {{"--peer_stall_timeout_ms=50"}, "peer_stall_timeout_ms"},
      {{"--remote_dir=/mnt/s", "--upload_threads=0"}, "upload_threads"},
      {{"--remote_dir=/mnt/s", "--upload_chunk_bytes=5000"}, "not a multiple of 4096"},
      {{"--remote_dir=/mnt/s", "--upload_retry_max_ms=10"}, "upload_retry_max_ms"},
      {{"--remote_dir=/mnt/s", "--remote_s3_bucket=b", "--remote_s3_endpoint=http://127.0.0.1:1"},
       "give one"},
      {{"--remote_s3_bucket=b"}, "needs remote_s3_endpoint"},
      {{"--node_id=a/b"}, "option node_id = \"a/b\": at most 64 letters"},
      {{"--node_id=" + std::string(65, 'n')}, "at most 64 letters"},
      {{"--cluster_poll_ms=1"}, "cluster_poll_ms"},
  };
  for (const Bad& b : bad) {
    std::vector<std::string> args = {"--state_dir=/tmp/x"};
    args.insert(args.end(), b.args.begin(), b.args.end());
    auto o = ParseOptions(args);
    INFO(b.args.back());
    REQUIRE_FALSE(o.ok());
    CHECK(o.status().code() == absl::StatusCode::kInvalidArgument);
    CHECK(std::string(o.status().message()).find(b.says) != std::string::npos);
  }
}

TEST_CASE("options: owner_map_file is read and checked once, at start", "[unit]") {
  const std::string path =
      std::string(getenv("CKPTD_TEST_TMP") ? getenv("CKPTD_TEST_TMP") : "/tmp") +
      "/ckptd-owners-test-" + std::to_string(getpid());
  {
    std::ofstream f(path);
    f << "# name uid\nalice 60001\n";
  }
  auto o = ParseOptions({"--state_dir=/tmp/x", "--owner_map=name", "--owner_map_file=" + path});
  REQUIRE(o.ok());
  CHECK(o->owners.mode() == OwnerMap::Mode::kName);
  CHECK(o->owners.table_size() == 1);
  CHECK(ParseOptions({"--state_dir=/tmp/x"})->owners.mode() == OwnerMap::Mode::kUid);
  {
    std::ofstream f(path);
    f << "alice 60001\nalice 60002\n";
  }
  auto bad = ParseOptions({"--state_dir=/tmp/x", "--owner_map_file=" + path});
  REQUIRE_FALSE(bad.ok());
  CHECK(std::string(bad.status().message()).find(path + " line 2") != std::string::npos);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ckptd
