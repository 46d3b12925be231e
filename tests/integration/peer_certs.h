// The peer channel's test certificates (docs/PEERS.md "Certificates"), made once per test process
// with integration/peer_certs.sh: a CA "ca" and node certificates node-a, node-b and node-c
// signed by it, node-old (expired as soon as made), and under other/ a second CA with its own
// node-a. The directory lives until the process exits.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "harness.h"

namespace ckptd_it {

inline const std::string& PeerCerts() {
  static TempDir* dir = [] {
    auto* d = new TempDir();
    std::vector<std::vector<std::string>> steps = {{"ca", d->path(), "ca"}};
    for (const char* n : {"node-a", "node-b", "node-c"}) {
      steps.push_back({"node", d->path(), "ca", n});
    }
    steps.push_back({"node", d->path(), "ca", "node-old", "0"});  // expired as soon as made
    steps.push_back({"ca", d->path() + "/other", "ca"});
    steps.push_back({"node", d->path() + "/other", "ca", "node-a"});
    for (const std::vector<std::string>& args : steps) {
      std::vector<std::string> argv{"/bin/sh", CKPTD_PEER_CERTS_SH};
      argv.insert(argv.end(), args.begin(), args.end());
      CommandResult r = RunCommand(argv);
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
    }
    return d;
  }();
  return dir->path();
}

}  // namespace ckptd_it
