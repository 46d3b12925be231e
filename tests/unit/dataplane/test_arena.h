// A staging arena for in-process tests (dataplane/arena.h): its segments are named
// "<prefix>arena-u<uid>-..." and journaled nowhere; a restart that keeps them (a daemon crash)
// passes what segments() returned to the next OpenTestArena, which adopts them.
#pragma once

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "dataplane/arena.h"

namespace ckptd {

inline std::unique_ptr<StagingArena> OpenTestArena(
    const std::string& prefix, uint64_t size_bytes,
    const std::vector<ArenaSegmentInfo>& adopt = {}) {
  auto a = StagingArena::Create(ArenaOptions{prefix, size_bytes, true, false},
                                [](const ArenaSegmentInfo&) { return absl::OkStatus(); });
  REQUIRE(a.ok());
  for (const ArenaSegmentInfo& s : adopt) {
    absl::Status st = (*a)->Adopt(s.uid, s.name, s.generation);
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  return std::move(*a);
}

}  // namespace ckptd
