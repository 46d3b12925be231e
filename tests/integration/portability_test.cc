// A committed checkpoint directory is self-contained: copied into another data dir, a daemon
// with an empty state dir adopts and loads it; and the golden checkpoint under tests/data,
// written by an earlier build, must load on every later build.
#include <catch2/catch.hpp>
#include <filesystem>
#include <iostream>

#include "harness.h"
#include "testclient/rank_io.h"

using namespace ckptd_it;
using Catch::Matchers::Contains;

namespace {
// The golden checkpoint: written once by WriteGolden() below (ckptd_testclient golden-write),
// with the state dict of testclient/state_dict.h. Never change that state dict's items or
// FillElements without regenerating it deliberately.
const std::string kGoldenJob = "golden";
constexpr uint64_t kGoldenStep = 7;
constexpr uint64_t kGoldenSeed = 7;
const std::string kGoldenDir = std::string(CKPTD_TEST_DATA) + "/golden";
}  // namespace

TEST_CASE("portability: a copied checkpoint directory loads on a fresh daemon", "[integration]") {
  TempDir new_data;
  std::string copied;
  {
    Daemon d;
    SaveCommitted(d, "port", 3, 33);
    SaveCommitted(d, "port", 4, 44);
    d.Stop();
    const std::string rel = "port/" + StepDir(3);
    copied = new_data.path() + "/" + rel;
    CopyTree(d.data_dir() + "/" + rel, copied);
  }
  DaemonConfig cfg;
  cfg.data_dir = new_data.path();
  Daemon d2(cfg);
  REQUIRE(VerifyInProcess(d2, "port", 3, 33) == "");
  auto client = d2.Connect();
  auto latest = client->Latest("port");
  REQUIRE(latest.ok());
  REQUIRE(*latest == 3);  // step 4 was not copied
  CommandResult ls = RunCtl(d2, {"ls", "port"});
  INFO(ls.output);
  REQUIRE(ls.exit_code == 0);
  REQUIRE_THAT(ls.output, Contains("COMMITTED"));
  CommandResult r = RunTestClient(d2, "load", {"--job", "port", "--step", "3", "--seed", "33"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

TEST_CASE("golden: the checkpoint under tests/data loads bit-exact", "[integration]") {
  REQUIRE(PathExists(kGoldenDir + "/" + kGoldenJob + "/" + StepDir(kGoldenStep)));
  TempDir data;
  CopyTree(kGoldenDir, data.path());
  DaemonConfig cfg;
  cfg.data_dir = data.path();
  Daemon d(cfg);
  std::string verify = VerifyInProcess(d, kGoldenJob, kGoldenStep, kGoldenSeed);
  INFO(d.Log());
  REQUIRE(verify == "");
  auto items = d.Connect()->Inspect(kGoldenJob, kGoldenStep);
  REQUIRE(items.ok());
  REQUIRE(items->size() == StateDict().size() + 2);  // + the two objects
}

namespace ckptd_it {
// Regenerates tests/data/golden: `ckptd_integration_tests --write-golden` (not a test case, so
// ctest never rewrites the golden data). Only for a deliberate format change.
int WriteGolden() {
  Daemon d;
  CommandResult r = RunTestClient(d, "golden-write",
                                  {"--job", kGoldenJob, "--step", std::to_string(kGoldenStep),
                                   "--seed", std::to_string(kGoldenSeed)});
  if (r.exit_code != 0) {
    std::cerr << r.output << "\n" << d.Log();
    return 1;
  }
  d.Stop();
  const std::string rel = kGoldenJob + "/" + StepDir(kGoldenStep);
  std::filesystem::remove_all(kGoldenDir);
  CopyTree(d.data_dir() + "/" + rel, kGoldenDir + "/" + rel);
  for (const auto& e : std::filesystem::directory_iterator(kGoldenDir + "/" + rel)) {
    std::filesystem::permissions(e.path(), std::filesystem::perms(0644));
  }
  std::cout << "wrote " << kGoldenDir << "/" << rel << "\n";
  return 0;
}
}  // namespace ckptd_it
