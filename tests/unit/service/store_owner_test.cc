// The job's owner on the store (tier/remote_tier.h, docs/SECURITY.md "Ownership"): the first write
// of a job's data claims <job>/owner.ckj; a write for another owner is refused before anything is
// written; a delete leaves the store's copy of another owner's job; an owner file that does not
// parse refuses every write. Issue 33: a uid that claimed a job name on a node that had not seen it
// overwrote and deleted another uid's steps on the shared store.
#include <catch2/catch.hpp>

#include "format/names.h"
#include "index/committer.h"
#include "index/meta_store.h"
#include "storage/memory/memory_storage.h"
#include "tier/remote_tier.h"

namespace ckptd {
namespace {

v1::Owner OwnerOf(uint32_t uid) {
  v1::Owner o;
  o.set_uid(uid);
  return o;
}

// A remote tier over two in-memory storages (its threads not started: the calls tested run on
// the caller's thread).
struct TierRig {
  explicit TierRig(MemoryStorage* shared) {
    options.state_dir = "/tmp/ckptd-unit-store-owner";
    options.socket_path = "/tmp/ckptd-unit-test.sock";
    REQUIRE(options.Validate().ok());
    tier = std::make_unique<RemoteTier>(&options, meta.get(), &committer, &local, shared);
  }
  DaemonOptions options;
  std::unique_ptr<MetaStore> meta = NewMemoryMetaStore();
  Committer committer{meta.get()};
  MemoryStorage local;
  std::unique_ptr<RemoteTier> tier;
};

}  // namespace

TEST_CASE("store owner: the first write claims the job, the same owner passes, another is refused",
          "[unit]") {
  MemoryStorage store;
  TierRig a(&store);
  REQUIRE(a.tier->ClaimStoreOwner("job", OwnerOf(60001)).ok());
  absl::StatusOr<std::string> file = store.Get(std::string("job/") + kJobOwnerFileName);
  REQUIRE(file.ok());
  v1::Owner recorded;
  REQUIRE(recorded.ParseFromString(*file));
  CHECK(recorded.uid() == 60001);
  CHECK(a.tier->ClaimStoreOwner("job", OwnerOf(60001)).ok());  // cached
  // Another node (no cache) of the same owner passes; of another owner is refused, naming both.
  TierRig b(&store);
  CHECK(b.tier->ClaimStoreOwner("job", OwnerOf(60001)).ok());
  const absl::Status refused = b.tier->ClaimStoreOwner("job", OwnerOf(60002));
  CHECK(absl::IsPermissionDenied(refused));
  CHECK(refused.message().find("belongs to uid 60001") != std::string::npos);
  CHECK(refused.message().find("uid 60002") != std::string::npos);
  // Even on the node that cached the first owner.
  CHECK(absl::IsPermissionDenied(a.tier->ClaimStoreOwner("job", OwnerOf(60002))));
  // The record is unchanged, and another job is another claim.
  REQUIRE(recorded.ParseFromString(*store.Get(std::string("job/") + kJobOwnerFileName)));
  CHECK(recorded.uid() == 60001);
  CHECK(b.tier->ClaimStoreOwner("other", OwnerOf(60002)).ok());
}

TEST_CASE("store owner: an owner file that does not parse refuses every write", "[unit][fault]") {
  MemoryStorage store;
  REQUIRE(store.PutAtomic(std::string("job/") + kJobOwnerFileName, "\xff\xff\xff garbage").ok());
  TierRig a(&store);
  const absl::Status st = a.tier->ClaimStoreOwner("job", OwnerOf(60001));
  CHECK(absl::IsDataLoss(st));
  CHECK(st.message().find("is not an owner record") != std::string::npos);
}

TEST_CASE("store owner: a delete leaves the store's copy of another owner's job", "[unit]") {
  MemoryStorage store;
  TierRig a(&store);
  REQUIRE(a.tier->ClaimStoreOwner("job", OwnerOf(60001)).ok());
  const std::string dir = CheckpointDir("job", 1);
  const std::string manifest = dir + "/" + kManifestFileName;
  REQUIRE(store.PutAtomic(manifest, "uid 60001's manifest").ok());
  // uid 60002 owns "job" on node b: its delete of step 1 removes only its own copy.
  TierRig b(&store);
  REQUIRE(b.tier->Remove("job", 1, dir, 60002).ok());
  CHECK(*store.Exists(manifest));
  // The store's owner deletes it; a delete without an owner (recovery) too.
  REQUIRE(a.tier->Remove("job", 1, dir, 60001).ok());
  CHECK_FALSE(*store.Exists(manifest));
  REQUIRE(store.PutAtomic(manifest, "again").ok());
  REQUIRE(b.tier->Remove("job", 1, dir).ok());
  CHECK_FALSE(*store.Exists(manifest));
}

}  // namespace ckptd
