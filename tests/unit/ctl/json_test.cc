// ckptctl's JSON (client/ctl/json.h): 64-bit integers as numbers, every scalar printed, unset
// messages and oneof members omitted, enums by name, repeated fields and maps, escaping.
#include "json.h"

#include <catch2/catch.hpp>

#include "ckptd/v1/ckptd.pb.h"
#include "ckptd/v1/index.pb.h"

namespace ckptctl {
namespace {

namespace v1 = ::ckptd::v1;
using Catch::Matchers::Contains;

TEST_CASE("ckptctl JSON: 64-bit integers are numbers, scalars all printed", "[unit]") {
  v1::LoadResponse r;
  r.set_step(uint64_t{1} << 62);
  r.set_bytes_read(18446744073709551615ull);
  v1::LoadedItem* item = r.add_items();
  item->set_item("w \"q\"\n");
  item->set_bytes(4096);
  const std::string j = MessageJson(r);
  INFO(j);
  CHECK_THAT(j, Contains("\"step\": 4611686018427387904,"));
  CHECK_THAT(j, Contains("\"bytes_read\": 18446744073709551615,"));
  CHECK_THAT(j, Contains("\"bytes_from_ram\": 0"));  // a default, printed
  CHECK_THAT(j, Contains("\"item\": \"w \\\"q\\\"\\n\""));
  CHECK_THAT(j, Contains("\"saved_by_rank\": 0"));
  CHECK(j.front() == '{');
  CHECK(j.back() == '}');
}

TEST_CASE("ckptctl JSON: enums by name, unset messages and oneofs omitted, empty lists", "[unit]") {
  v1::LoadRequest q;
  q.set_job("j");
  q.set_latest(true);
  std::string j = MessageJson(q);
  INFO(j);
  CHECK_THAT(j, Contains("\"latest\": true"));
  CHECK_THAT(j, !Contains("\"step\""));  // the other member of the oneof
  CHECK_THAT(j, Contains("\"items\": []"));
  v1::CheckpointSummary s;
  s.set_state(v1::COMMITTED);
  j = MessageJson(s);
  CHECK_THAT(j, Contains("\"state\": \"COMMITTED\""));
  CHECK_THAT(j, !Contains("\"tiers\""));  // unset message
  s.mutable_tiers()->set_local(true);
  CHECK_THAT(MessageJson(s), Contains("\"tiers\": {"));
}

TEST_CASE("ckptctl JSON: maps are objects keyed by strings", "[unit]") {
  v1::HotRecord h;
  (*h.mutable_generations())[7] = "gen-a";
  const std::string j = MessageJson(h);
  INFO(j);
  CHECK_THAT(j, Contains("\"generations\": {\n    \"7\": \"gen-a\"\n  }"));
}

}  // namespace
}  // namespace ckptctl
