#include "format/names.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/limits.h"
#include "format/text.h"

namespace ckptd {
namespace {

constexpr size_t kStepDigits = 20;

bool IsJobChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

absl::Status JobError(std::string_view job, std::string_view rule) {
  return absl::InvalidArgumentError(
      absl::StrCat("job name \"", EscapeName(job), "\" ", AbslView(rule), ": job names are 1..",
                   limits::kJobNameBytesMax, " bytes of [A-Za-z0-9._-], not starting with '.'"));
}

}  // namespace

absl::Status ValidateJobName(std::string_view job) {
  if (job.empty()) return JobError(job, "is empty");
  if (job.size() > limits::kJobNameBytesMax) {
    return JobError(job.substr(0, 32), absl::StrFormat("(truncated) is %d bytes long", job.size()));
  }
  if (job.find('/') != std::string_view::npos) return JobError(job, "contains '/'");
  if (job.find('\\') != std::string_view::npos) return JobError(job, "contains '\\'");
  if (job.find("..") != std::string_view::npos) return JobError(job, "contains \"..\"");
  if (job.front() == '.') return JobError(job, "starts with '.'");
  for (char c : job) {
    if (!IsJobChar(c)) {
      return JobError(job, absl::StrCat("contains byte 0x",
                                        absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2)));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateItemName(std::string_view item) {
  if (item.empty()) return absl::InvalidArgumentError("item name is empty");
  if (item.size() > limits::kItemNameBytesMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("item name \"", EscapeName(item.substr(0, 64)), "...\" is ", item.size(),
                     " bytes long; the limit is ", limits::kItemNameBytesMax));
  }
  for (size_t i = 0; i < item.size(); ++i) {
    auto c = static_cast<unsigned char>(item[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(
          absl::StrCat("item name \"", EscapeName(item), "\" contains control byte 0x",
                       absl::Hex(c, absl::kZeroPad2), " at offset ", i));
    }
  }
  return absl::OkStatus();
}

std::string StepDirName(uint64_t step) { return absl::StrFormat("step-%020d", step); }

std::string CheckpointDir(std::string_view job, uint64_t step) {
  return absl::StrCat(AbslView(job), "/", StepDirName(step));
}

absl::StatusOr<uint64_t> ParseStepDirName(std::string_view name) {
  std::string_view prefix(kStepDirPrefix);
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", EscapeName(name), "\" is not a step directory name: ", AbslView(why)));
  };
  if (name.size() != prefix.size() + kStepDigits || name.substr(0, prefix.size()) != prefix) {
    return bad("want \"step-\" followed by 20 digits");
  }
  uint64_t step = 0;
  for (char c : name.substr(prefix.size())) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return bad("non-digit in step");
    uint64_t digit = static_cast<uint64_t>(c - '0');
    if (step > (limits::kStepMax - digit) / 10) return bad("step exceeds the limit");
    step = step * 10 + digit;
  }
  return step;
}

std::string BlobName(uint32_t rank) { return absl::StrFormat("r%05d.blob", rank); }

std::string NodeUploadedPath(const std::string& dir, const std::string& node) {
  return absl::StrCat(dir, "/cluster/", node, ".uploaded");
}

std::string NodeCopiesPath(const std::string& dir, const std::string& node) {
  return absl::StrCat(dir, "/cluster/", node, kNodeCopiesSuffix);
}

std::string LinkedBlobName(uint32_t rank, uint64_t step) {
  return absl::StrFormat("r%05d-s%020d.blob", rank, step);
}

bool IsBlobFileName(std::string_view name) {
  absl::string_view digits(name.data(), name.size());
  if (!absl::ConsumePrefix(&digits, "r") || !absl::ConsumeSuffix(&digits, ".blob")) return false;
  auto all_digits = [](absl::string_view d) {
    return std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const size_t dash = digits.find("-s");
  if (dash != absl::string_view::npos) {
    const absl::string_view step = digits.substr(dash + 2);
    if (step.size() != 20 || !all_digits(step)) return false;
    digits = digits.substr(0, dash);
  }
  return digits.size() >= 5 && digits.size() <= 10 && all_digits(digits);
}

}  // namespace ckptd
