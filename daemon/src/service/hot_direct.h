// Hot bytes the client copies itself (LoadItemRequest.hot_direct; issue 37 §1;
// docs/ARCHITECTURE.md "The load path"): which runs of a load plan qualify, and the Load answer's
// spans for them.
//
// A run qualifies when every block it checks and every byte it copies lies in one range of the
// hot copy that is in the caller's own arena segment (`uid`: never another uid's bytes, which the
// client cannot map), each copy inside one of the run's checks, and every request it copies to may
// go direct (direct_ok: the item asked for it and its destination is arena scratch in host
// memory). A request goes direct only when every run it takes bytes from does, so its
// destination is either written by the daemon or left to the client, never half of each.
// Pure code over the plan and the hot copy (pinned by the caller); no lock, any thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ckptd/v1/ckptd.pb.h"
#include "format/load_plan.h"
#include "tier/ram_tier.h"

namespace ckptd {

struct HotDirectPlan {
  std::vector<bool> run;      // indexed like plan.runs: the client copies it
  std::vector<bool> request;  // indexed like the plan's requests: its bytes come from the client
  uint64_t bytes = 0;         // bytes the client copies
  uint64_t copies = 0;        // copies in the direct runs
};

HotDirectPlan PlanHotDirect(const HotCopy& hot, uint32_t uid, const LoadPlan& plan,
                            const std::vector<bool>& direct_ok, uint32_t block_bytes);
// Appends the spans of the runs `d` marks to resp->hot_spans (each check of those runs is one
// span, with the copies that lie in it) and sets hot_direct on resp's items `d` marks.
void AddHotSpans(const HotCopy& hot, const LoadPlan& plan, const HotDirectPlan& d,
                 uint32_t block_bytes, v1::LoadResponse* resp);

}  // namespace ckptd
