// The S3 plugin against a real SeaweedFS: blob round trips across part boundaries (with the
// caller's buffer reused between Writes), ranged reads, the writer's order contract, aborts,
// PutIfAbsent races, and NewS3Storage's start-up errors.
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "s3_env.h"

namespace ckptd {
namespace {

using testing::MemoryReader;
using testing::TestOptions;

std::string Bytes(uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(s.data() + i, &v, std::min<uint64_t>(8, n - i));
  }
  return s;
}

std::unique_ptr<Storage> Open(const S3Options& o) {
  auto s = NewS3Storage(o);
  REQUIRE(s.ok());
  return std::move(*s);
}

// Writes `data` in Writes of `chunk` bytes (each split in two slices), through one buffer that
// is scribbled over after every Write: the writer must not read a slice after Write returns.
absl::Status WriteReusingBuffer(BlobWriter& w, const std::string& data, uint64_t chunk) {
  std::vector<char> buf(chunk);
  for (uint64_t off = 0; off < data.size(); off += chunk) {
    uint64_t n = std::min(chunk, data.size() - off);
    std::memcpy(buf.data(), data.data() + off, n);
    uint64_t half = n / 3;
    IoSlice slices[2] = {{buf.data(), half, off}, {buf.data() + half, n - half, off + half}};
    CKPTD_RETURN_IF_ERROR(w.Write(slices));
    std::memset(buf.data(), 0xEE, buf.size());
  }
  return absl::OkStatus();
}

TEST_CASE("S3 blobs round trip across part boundaries with a reused caller buffer", "[s3]") {
  CKPTD_REQUIRE_WEED(weed);
  S3Options o = TestOptions("");
  auto storage = Open(o);
  const uint64_t part = o.part_size_bytes;
  struct Case {
    const char* name;
    uint64_t size;
    uint64_t chunk;
  };
  const Case cases[] = {
      {"empty", 0, 4096},
      {"under one part", 100'000, 7'777},
      {"exactly one part", part, 1'000'003},
      {"exactly three parts", 3 * part, 3 * part},  // one Write, three parts at once
      {"three parts and a tail", 3 * part + 12'345, 1'300'001},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      const std::string data = Bytes(c.size, c.size + 1);
      const std::string path = std::string("job/step/") + c.name + ".blob";
      auto w = storage->CreateBlob(path);
      REQUIRE(w.ok());
      REQUIRE(WriteReusingBuffer(**w, data, c.chunk).ok());
      CHECK_FALSE(*storage->Exists(path));  // nothing visible before Sync
      REQUIRE((*w)->Sync().ok());
      CHECK(absl::IsFailedPrecondition((*w)->Sync()));
      auto r = storage->OpenBlob(path);
      REQUIRE(r.ok());
      CHECK((*r)->size_bytes() == c.size);
      std::string back(c.size, '\0');
      IoSlice all{back.data(), c.size, 0};
      REQUIRE((*r)->Read(std::span<const IoSlice>(&all, 1)).ok());
      CHECK(back == data);
      auto got = storage->Get(path);
      REQUIRE(got.ok());
      CHECK(*got == data);
      auto uploads = weed->ListUploads(o.bucket, o.prefix);
      REQUIRE(uploads.ok());
      CHECK(uploads->empty());
    }
  }
}

TEST_CASE("S3 CopyBlobsFrom streams blobs of any size, parts in flight across them", "[s3]") {
  CKPTD_REQUIRE_WEED(weed);
  S3Options o = TestOptions("");
  o.parts_in_flight = 3;
  auto storage = Open(o);
  const uint64_t part = o.part_size_bytes;
  // Empty, under one part, exactly one part, and several parts with a tail, in one batch.
  const uint64_t sizes[] = {0, 100'000, part, 7 * part + 12'345, 2 * part};
  std::vector<std::string> data;
  std::vector<MemoryReader> sources;
  std::vector<BlobCopy> copies;
  uint64_t total = 0;
  for (uint64_t size : sizes) data.push_back(Bytes(size, size + 7));
  for (const std::string& d : data) sources.emplace_back(d);
  for (size_t i = 0; i < data.size(); ++i) {
    copies.push_back({absl::StrCat("copy/", i, ".blob"), &sources[i]});
    total += data[i].size();
  }
  std::atomic<uint64_t> progress{0};
  REQUIRE(storage->CopyBlobsFrom(copies, &progress, [] { return false; }).ok());
  CHECK(progress == total);
  for (size_t i = 0; i < data.size(); ++i) {
    auto got = storage->Get(copies[i].path);
    REQUIRE(got.ok());
    CHECK(*got == data[i]);
  }
  CHECK(weed->ListUploads(o.bucket, o.prefix)->empty());
}

TEST_CASE("S3 CopyBlobsFrom: stopped or a failing source leaves no upload and no blob", "[s3]") {
  CKPTD_REQUIRE_WEED(weed);
  S3Options o = TestOptions("");
  auto storage = Open(o);
  const uint64_t part = o.part_size_bytes;
  const std::string data = Bytes(5 * part, 3);
  std::atomic<uint64_t> progress{0};
  SECTION("stopped after two parts: CANCELLED") {
    MemoryReader a(data), b(data);
    std::vector<BlobCopy> copies = {{"stopped/a.blob", &a}, {"stopped/b.blob", &b}};
    int asked = 0;
    CHECK(
        absl::IsCancelled(storage->CopyBlobsFrom(copies, &progress, [&] { return ++asked > 2; })));
    CHECK(weed->ListUploads(o.bucket, o.prefix)->empty());
    CHECK_FALSE(*storage->Exists("stopped/a.blob"));
    CHECK_FALSE(*storage->Exists("stopped/b.blob"));
  }
  SECTION("the second blob's source fails in its fourth part: its error") {
    MemoryReader a(data), b(data, 3 * part + 1);
    std::vector<BlobCopy> copies = {{"failing/a.blob", &a}, {"failing/b.blob", &b}};
    CHECK(absl::IsDataLoss(storage->CopyBlobsFrom(copies, &progress, nullptr)));
    CHECK(weed->ListUploads(o.bucket, o.prefix)->empty());
    CHECK_FALSE(*storage->Exists("failing/a.blob"));
    CHECK_FALSE(*storage->Exists("failing/b.blob"));
  }
}

TEST_CASE("S3 ranged reads of random slices are bit-exact", "[s3]") {
  CKPTD_REQUIRE_WEED(weed);
  S3Options o = TestOptions("");
  auto storage = Open(o);
  const uint64_t size = 2 * o.part_size_bytes + 4321;
  const std::string data = Bytes(size, 7);
  auto w = storage->CreateBlob("r.blob");
  REQUIRE(w.ok());
  IoSlice whole{const_cast<char*>(data.data()), size, 0};
  REQUIRE((*w)->Write(std::span<const IoSlice>(&whole, 1)).ok());
  REQUIRE((*w)->Sync().ok());
  auto r = storage->OpenBlob("r.blob");
  REQUIRE(r.ok());
  std::mt19937_64 rng(11);
  for (int round = 0; round < 5; ++round) {
    // 40 random slices into one buffer, some adjacent in the blob and in memory (merged).
    std::vector<IoSlice> slices;
    std::vector<std::pair<uint64_t, uint64_t>> want;  // (buffer offset, blob offset)
    std::string buf(8 << 20, '\0');
    uint64_t at = 0;
    for (int i = 0; i < 40; ++i) {
      uint64_t len = 1 + rng() % 150'000;
      uint64_t off = rng() % (size - len + 1);
      if (i > 0 && rng() % 3 == 0 && slices.back().offset + slices.back().len + len <= size) {
        off = slices.back().offset + slices.back().len;
      }
      slices.push_back({buf.data() + at, len, off});
      want.emplace_back(at, off);
      at += len;
    }
    slices.push_back({buf.data() + at, size - (size - 10), size - 10});  // the last bytes
    want.emplace_back(at, size - 10);
    REQUIRE((*r)->Read(slices).ok());
    for (size_t i = 0; i < slices.size(); ++i) {
      INFO("slice " << i << " offset " << slices[i].offset << " len " << slices[i].len);
      CHECK(std::memcmp(buf.data() + want[i].first, data.data() + want[i].second, slices[i].len) ==
            0);
    }
  }
  char b[16];
  IoSlice past{b, 16, size - 8};
  CHECK(absl::IsDataLoss((*r)->Read(std::span<const IoSlice>(&past, 1))));
  CHECK(absl::IsNotFound(storage->OpenBlob("absent.blob").status()));
}

TEST_CASE("S3 writer: gaps and disorder are INVALID_ARGUMENT, a dropped writer leaves no upload",
          "[s3]") {
  CKPTD_REQUIRE_WEED(weed);
  S3Options o = TestOptions("");
  auto storage = Open(o);
  const std::string data = Bytes(2 * o.part_size_bytes + 10, 3);
  auto slice = [&](uint64_t off, uint64_t len) {
    return IoSlice{const_cast<char*>(data.data()) + off, len, off};
  };
  SECTION("a gap") {
    auto w = storage->CreateBlob("gap.blob");
    REQUIRE(w.ok());
    IoSlice s[2] = {slice(0, 100), slice(200, 100)};
    absl::Status st = (*w)->Write(s);
    CHECK(absl::IsInvalidArgument(st));
    CHECK(absl::StrContains(st.message(), "contiguously"));
    CHECK(absl::IsFailedPrecondition((*w)->Sync()));
  }
  SECTION("out of order after a multipart upload started") {
    auto w = storage->CreateBlob("order.blob");
    REQUIRE(w.ok());
    IoSlice first = slice(0, o.part_size_bytes + 5);
    REQUIRE((*w)->Write(std::span<const IoSlice>(&first, 1)).ok());
    REQUIRE(weed->ListUploads(o.bucket, o.prefix)->size() == 1);
    IoSlice back = slice(0, 10);
    CHECK(absl::IsInvalidArgument((*w)->Write(std::span<const IoSlice>(&back, 1))));
    CHECK(weed->ListUploads(o.bucket, o.prefix)->empty());  // aborted at once
  }
  SECTION("destroyed without Sync") {
    {
      auto w = storage->CreateBlob("dropped.blob");
      REQUIRE(w.ok());
      IoSlice first = slice(0, 2 * o.part_size_bytes);
      REQUIRE((*w)->Write(std::span<const IoSlice>(&first, 1)).ok());
      REQUIRE(weed->ListUploads(o.bucket, o.prefix)->size() == 1);
    }
    CHECK(weed->ListUploads(o.bucket, o.prefix)->empty());
    CHECK_FALSE(*storage->Exists("dropped.blob"));
  }
}

TEST_CASE("S3 RemoveAll aborts multipart uploads left under the path", "[s3]") {
  CKPTD_REQUIRE_WEED(weed);
  S3Options o = TestOptions("");
  auto storage = Open(o);
  // An upload a crashed writer left: started by hand, never completed.
  const std::string key = o.prefix + "/job/step/r0.blob";
  auto started = testing::SignedRequest(
      "POST", absl::StrCat(weed->endpoint(), "/", o.bucket, "/", key, "?uploads="));
  REQUIRE(started.ok());
  REQUIRE(started->status == 200);
  REQUIRE(weed->ListUploads(o.bucket, o.prefix)->size() == 1);
  REQUIRE(storage->PutAtomic("job/step/manifest", "m").ok());
  REQUIRE(storage->PutAtomic("job2/x", "keep").ok());
  REQUIRE(storage->RemoveAll("job").ok());
  CHECK(weed->ListUploads(o.bucket, o.prefix)->empty());
  CHECK(*storage->List("") == std::vector<std::string>{"job2"});
}

TEST_CASE("S3 PutIfAbsent: of two racing writers exactly one wins", "[s3]") {
  CKPTD_REQUIRE_WEED(weed);
  auto storage = Open(TestOptions(""));
  for (int round = 0; round < 8; ++round) {
    const std::string path = absl::StrCat("commit/", round);
    std::atomic<int> wins{0};
    std::atomic<int> exists{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        absl::Status s = storage->PutIfAbsent(path, absl::StrCat("writer ", t));
        if (s.ok()) ++wins;
        if (absl::IsAlreadyExists(s)) ++exists;
      });
    }
    for (std::thread& th : threads) th.join();
    CHECK(wins == 1);
    CHECK(exists == 1);
    auto got = storage->Get(path);
    REQUIRE(got.ok());
    CHECK(absl::StartsWith(*got, "writer "));
  }
}

TEST_CASE("NewS3Storage: wrong credentials, a missing bucket, no store", "[s3]") {
  CKPTD_REQUIRE_WEED(weed);
  SECTION("wrong secret: PERMISSION_DENIED naming endpoint and bucket, not the secret") {
    S3Options o = TestOptions("");
    o.credentials->secret_access_key = "wrong-secret-xyzzy";
    auto s = NewS3Storage(o);
    REQUIRE(absl::IsPermissionDenied(s.status()));
    std::string msg(s.status().message());
    CHECK(absl::StrContains(msg, weed->endpoint()));
    CHECK(absl::StrContains(msg, o.bucket));
    CHECK_FALSE(absl::StrContains(msg, "xyzzy"));
    CHECK_FALSE(absl::StrContains(msg, testing::kWeedAccessKey));
  }
  SECTION("unknown access key") {
    S3Options o = TestOptions("");
    o.credentials->access_key_id = "AKIDNOSUCHKEY";
    CHECK(absl::IsPermissionDenied(NewS3Storage(o).status()));
  }
  SECTION("missing bucket: NOT_FOUND naming it") {
    S3Options o = TestOptions("");
    o.bucket = "ckptd-no-such-bucket";
    auto s = NewS3Storage(o);
    REQUIRE(absl::IsNotFound(s.status()));
    CHECK(absl::StrContains(s.status().message(), "ckptd-no-such-bucket"));
    CHECK(absl::StrContains(s.status().message(), "does not exist"));
  }
  SECTION("nothing listening: UNAVAILABLE") {
    S3Options o = TestOptions("http://127.0.0.1:1");
    o.retries_max = 1;
    auto s = NewS3Storage(o);
    REQUIRE(absl::IsUnavailable(s.status()));
    CHECK(absl::StrContains(s.status().message(), "127.0.0.1:1"));
  }
  SECTION("Describe names the store, never a credential") {
    S3Options o = TestOptions("");
    auto storage = Open(o);
    CHECK(storage->Describe() ==
          absl::StrCat("s3:", weed->endpoint(), "/", o.bucket, "/", o.prefix));
  }
}

TEST_CASE("S3Options::Validate refuses bad options", "[s3]") {
  S3Options good = TestOptions("http://127.0.0.1:9");
  REQUIRE(good.Validate().ok());
  auto bad = [&](auto change) {
    S3Options o = good;
    change(o);
    return absl::IsInvalidArgument(o.Validate());
  };
  CHECK(bad([](S3Options& o) { o.endpoint = "127.0.0.1:9"; }));
  CHECK(bad([](S3Options& o) { o.endpoint = "http://127.0.0.1:9/"; }));
  CHECK(bad([](S3Options& o) { o.bucket = ""; }));
  CHECK(bad([](S3Options& o) { o.prefix = "/a"; }));
  CHECK(bad([](S3Options& o) { o.prefix = "a/../b"; }));
  CHECK(bad([](S3Options& o) { o.part_size_bytes = 1 << 20; }));
  CHECK(bad([](S3Options& o) { o.parts_in_flight = 0; }));
  CHECK(bad([](S3Options& o) { o.get_in_flight = 1000; }));
  CHECK(bad([](S3Options& o) { o.backoff_max_ms = 1; }));
  CHECK(bad([](S3Options& o) { o.credentials->secret_access_key = ""; }));
}

TEST_CASE("LoadS3Credentials: environment first, then the shared credentials file", "[s3]") {
  const char* names[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                         "AWS_SHARED_CREDENTIALS_FILE", "AWS_PROFILE"};
  for (const char* n : names) unsetenv(n);
  char dir[] = "/tmp/ckptd-creds.XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string file = std::string(dir) + "/credentials";
  {
    std::ofstream out(file);
    out << "# comment\n[default]\naws_access_key_id = AKIDDEFAULT\n"
           "aws_secret_access_key=sdefault\n\n[ops]\naws_access_key_id = AKIDOPS\n"
           "aws_secret_access_key = sops\naws_session_token = tops\n";
  }
  setenv("AWS_SHARED_CREDENTIALS_FILE", file.c_str(), 1);
  auto c = LoadS3Credentials();
  REQUIRE(c.ok());
  CHECK(c->access_key_id == "AKIDDEFAULT");
  CHECK(c->secret_access_key == "sdefault");
  setenv("AWS_PROFILE", "ops", 1);
  c = LoadS3Credentials();
  REQUIRE(c.ok());
  CHECK(c->session_token == "tops");
  setenv("AWS_PROFILE", "nope", 1);
  CHECK(absl::IsNotFound(LoadS3Credentials().status()));
  setenv("AWS_ACCESS_KEY_ID", "AKIDENV", 1);
  CHECK(absl::IsInvalidArgument(LoadS3Credentials().status()));  // the secret is missing
  setenv("AWS_SECRET_ACCESS_KEY", "senv", 1);
  c = LoadS3Credentials();
  REQUIRE(c.ok());
  CHECK(c->access_key_id == "AKIDENV");
  CHECK(c->session_token.empty());
  for (const char* n : names) unsetenv(n);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckptd
