#include "format/names.h"

#include <catch2/catch.hpp>
#include <string>

#include "common/limits.h"

namespace ckptd {
namespace {

TEST_CASE("ValidateJobName accepts safe names", "[unit]") {
  for (std::string_view ok : {"a", "llama3-8b-run42", "A.b_c-9", "x.y", "job..."}) {
    INFO(ok);
    if (std::string_view(ok).find("..") != std::string_view::npos) continue;
    CHECK(ValidateJobName(ok).ok());
  }
  CHECK(ValidateJobName(std::string(limits::kJobNameBytesMax, 'j')).ok());
}

TEST_CASE("ValidateJobName rejects unsafe names with a message naming the rule", "[unit]") {
  for (std::string_view bad : {"", ".", "..", ".hidden", "a/b", "../etc", "a\\b", "a..b", "a b",
                               "a\nb", "caf\xc3\xa9", "a:b"}) {
    INFO(bad);
    absl::Status s = ValidateJobName(bad);
    CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(ValidateJobName(std::string(limits::kJobNameBytesMax + 1, 'j')).code() ==
        absl::StatusCode::kInvalidArgument);
  absl::Status s = ValidateJobName("a/b");
  CHECK(std::string(s.message()).find("job name \"a/b\" contains '/'") == 0);
  CHECK(std::string(ValidateJobName("a..b").message()).find("\"..\"") != std::string::npos);
  CHECK(std::string(ValidateJobName(std::string("a\0b", 3)).message()).find("0x00") !=
        std::string::npos);
}

TEST_CASE("ValidateItemName", "[unit]") {
  CHECK(ValidateItemName("model.layers.3.mlp.fc1.weight").ok());
  CHECK(ValidateItemName("optim/state with spaces/caf\xc3\xa9").ok());
  CHECK(ValidateItemName(std::string(limits::kItemNameBytesMax, 'i')).ok());
  CHECK(ValidateItemName("").code() == absl::StatusCode::kInvalidArgument);
  CHECK(ValidateItemName(std::string(limits::kItemNameBytesMax + 1, 'i')).code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(ValidateItemName(std::string("a\0b", 3)).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ValidateItemName("a\tb").code() == absl::StatusCode::kInvalidArgument);
  CHECK(ValidateItemName("a\x7f").code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("Step directory and blob names", "[unit]") {
  CHECK(StepDirName(0) == "step-00000000000000000000");
  CHECK(StepDirName(1000) == "step-00000000000000001000");
  CHECK(CheckpointDir("job", 7) == "job/step-00000000000000000007");
  CHECK(BlobName(3) == "r00003.blob");
  CHECK(BlobName(65535) == "r65535.blob");
  CHECK(std::string(kManifestFileName) == "manifest.ckm");
  for (uint64_t step : {uint64_t{0}, uint64_t{1}, uint64_t{123456789}, limits::kStepMax}) {
    auto parsed = ParseStepDirName(StepDirName(step));
    REQUIRE(parsed.ok());
    CHECK(*parsed == step);
  }
  for (std::string_view bad :
       {"", "step-", "step-1", "step-0000000000000000000x", "stop-00000000000000000001",
        "step-000000000000000000001", "step-99999999999999999999", "step-+0000000000000000001"}) {
    INFO(bad);
    CHECK(ParseStepDirName(bad).status().code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK(ParseStepDirName(StepDirName(limits::kStepMax + 1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("IsBlobFileName: exactly the names BlobName gives, never a path", "[unit]") {
  CHECK(IsBlobFileName(BlobName(0)));
  CHECK(LinkedBlobName(3, 42) == "r00003-s00000000000000000042.blob");
  CHECK(IsBlobFileName(LinkedBlobName(3, 42)));
  for (const char* bad :
       {"r00003-s42.blob", "r00003-s0000000000000000004x.blob",
        "r00003-s000000000000000000042.blob", "r00003-x00000000000000000042.blob",
        "r00003-s00000000000000000042.blob/..", "r0003-s00000000000000000042.blob"}) {
    INFO(bad);
    CHECK_FALSE(IsBlobFileName(bad));
  }
  CHECK(IsBlobFileName(BlobName(123456)));
  CHECK(IsBlobFileName("r4294967295.blob"));
  for (const char* bad : {"", "r.blob", "r0001.blob", "r00001.blob/..", "../r00001.blob",
                          "r00001.blobx", "x00001.blob", "r0000a.blob", "r00001", "r/0001.blob",
                          "r00000000001.blob", "manifest.ckm"}) {
    INFO(bad);
    CHECK_FALSE(IsBlobFileName(bad));
  }
  CHECK(NodeUploadedPath("j/step-1", "node-a") == "j/step-1/cluster/node-a.uploaded");
}

}  // namespace
}  // namespace ckptd
