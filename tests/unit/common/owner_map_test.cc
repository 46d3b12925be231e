// The owner map (common/owner_map.h): what a manifest records of a job's owner, and how a daemon
// maps a recorded owner to one of its uids — by number (owner_map = uid) or by name (an explicit
// table first, then the passwd database), refusing an owner it cannot map.
#include "common/owner_map.h"

#include <pwd.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

namespace ckptd {
namespace {

v1::Owner OwnerOf(uint32_t uid, const std::string& name) {
  v1::Owner o;
  o.set_uid(uid);
  o.set_name(name);
  return o;
}

TEST_CASE("OwnerMap: uid mode keeps the recorded uid, and the record names it", "[unit]") {
  absl::StatusOr<OwnerMap> map = OwnerMap::Parse("uid", "# names\nalice 60001\n\n", "t");
  REQUIRE(map.ok());
  CHECK(map->mode() == OwnerMap::Mode::kUid);
  CHECK(map->table_size() == 1);
  CHECK(*map->LocalUid(OwnerOf(60001, "bob")) == 60001);  // the number, whatever the name
  CHECK(*map->LocalUid(OwnerOf(42, "")) == 42);
  v1::Owner rec = map->Record(60001);
  CHECK(rec.uid() == 60001);
  CHECK(rec.name() == "alice");            // the table's name first
  CHECK(map->Record(0).name() == "root");  // then the passwd database's
  CHECK(OwnerMap::Describe(rec) == "uid 60001 (alice)");
  CHECK(OwnerMap::Describe(OwnerOf(7, "")) == "uid 7");
}

TEST_CASE("OwnerMap: name mode maps through the table, then passwd, else refuses", "[unit]") {
  absl::StatusOr<OwnerMap> map = OwnerMap::Parse("name", "alice 60002\nbob\t60003\n", "t");
  REQUIRE(map.ok());
  CHECK(*map->LocalUid(OwnerOf(60001, "alice")) == 60002);  // another node's uid, this one's
  CHECK(*map->LocalUid(OwnerOf(99, "bob")) == 60003);
  CHECK(*map->LocalUid(OwnerOf(12345, "root")) == 0);  // not in the table: passwd
  absl::StatusOr<uint32_t> unknown = map->LocalUid(OwnerOf(60001, "no-such-user-ckptd"));
  CHECK(absl::IsPermissionDenied(unknown.status()));
  CHECK(unknown.status().message().find("no-such-user-ckptd") != std::string::npos);
  absl::StatusOr<uint32_t> nameless = map->LocalUid(OwnerOf(60001, ""));
  CHECK(absl::IsPermissionDenied(nameless.status()));
  CHECK(nameless.status().message().find("no user name") != std::string::npos);
  // Without a table: passwd alone.
  absl::StatusOr<OwnerMap> bare = OwnerMap::Parse("name", "", "");
  REQUIRE(bare.ok());
  CHECK(*bare->LocalUid(OwnerOf(5, "root")) == 0);
  CHECK(absl::IsPermissionDenied(bare->LocalUid(OwnerOf(5, "alice")).status()));
}

TEST_CASE("OwnerMap: a bad mode or table is refused naming the file and line", "[unit]") {
  CHECK(absl::IsInvalidArgument(OwnerMap::Parse("gid", "", "").status()));
  const char* bad[] = {
      "alice",                                 // no uid
      "alice 1 2",                             // three fields
      "alice x",                               // not a number
      "alice -1",                              // negative
      "alice 4294967295",                      // (uid_t)-1
      "-alice 1",                              // leading '-'
      "al/ice 1",                              // a character names never hold
      "a234567890123456789012345678901234 1",  // longer than 32
      "alice 1\nalice 2",                      // a name twice
      "alice 1\nbob 1",                        // a uid twice
  };
  for (const char* text : bad) {
    absl::StatusOr<OwnerMap> map = OwnerMap::Parse("name", text, "/etc/ckptd/owners");
    INFO(text);
    REQUIRE(absl::IsInvalidArgument(map.status()));
    CHECK(map.status().message().find("owner_map_file: /etc/ckptd/owners line ") !=
          std::string::npos);
  }
}

}  // namespace
}  // namespace ckptd
