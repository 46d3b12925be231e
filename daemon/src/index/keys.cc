#include "index/keys.h"

#include "absl/status/status.h"

namespace ckptd::keys {
namespace {

void PutBe(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetBe(std::string_view in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | static_cast<uint8_t>(in[i]);
  return v;
}

// tag job '\0' [be64(step)]
std::string JobScoped(char tag, std::string_view job) {
  std::string key;
  key.reserve(2 + job.size() + 8 + 4);
  key.push_back(tag);
  key.append(job);
  key.push_back('\0');
  return key;
}

std::string StepScoped(char tag, std::string_view job, uint64_t step) {
  std::string key = JobScoped(tag, job);
  PutBe(key, step, 8);
  return key;
}

absl::Status Malformed(const char* kind, std::string_view key, const char* why) {
  std::string msg = "malformed ";
  msg += kind;
  msg += " key (";
  msg += std::to_string(key.size());
  msg += " bytes): ";
  msg += why;
  return absl::InvalidArgumentError(msg);
}

struct JobStep {
  std::string job;
  uint64_t step;
  std::string_view rest;
};

// Splits tag job '\0' be64(step) rest.
absl::StatusOr<JobStep> SplitStepScoped(const char* kind, char tag, std::string_view key) {
  if (key.empty() || key[0] != tag) return Malformed(kind, key, "wrong tag");
  size_t nul = key.find('\0', 1);
  if (nul == std::string_view::npos) return Malformed(kind, key, "no job terminator");
  if (nul == 1) return Malformed(kind, key, "empty job name");
  if (key.size() - nul - 1 < 8) return Malformed(kind, key, "truncated step");
  JobStep out;
  out.job = std::string(key.substr(1, nul - 1));
  out.step = GetBe(key.substr(nul + 1), 8);
  out.rest = key.substr(nul + 1 + 8);
  return out;
}

}  // namespace

std::string Job(std::string_view job) {
  std::string key(1, kJobTag);
  key.append(job);
  return key;
}
std::string JobPrefix() { return std::string(1, kJobTag); }

std::string Checkpoint(std::string_view job, uint64_t step) {
  return StepScoped(kCheckpointTag, job, step);
}
std::string CheckpointPrefix(std::string_view job) { return JobScoped(kCheckpointTag, job); }
std::string AllCheckpointsPrefix() { return std::string(1, kCheckpointTag); }

std::string Rank(std::string_view job, uint64_t step, uint32_t rank) {
  std::string key = StepScoped(kRankTag, job, step);
  PutBe(key, rank, 4);
  return key;
}
std::string RankPrefix(std::string_view job, uint64_t step) {
  return StepScoped(kRankTag, job, step);
}

std::string Item(std::string_view job, uint64_t step, std::string_view item) {
  std::string key = StepScoped(kItemTag, job, step);
  key.append(item);
  return key;
}
std::string ItemPrefix(std::string_view job, uint64_t step) {
  return StepScoped(kItemTag, job, step);
}

std::string Blob(std::string_view job, uint64_t step, std::string_view blob) {
  std::string key = StepScoped(kBlobTag, job, step);
  key.append(blob);
  return key;
}
std::string BlobPrefix(std::string_view job, uint64_t step) {
  return StepScoped(kBlobTag, job, step);
}

std::string Upload(std::string_view job, uint64_t step) {
  return StepScoped(kUploadTag, job, step);
}
std::string UploadPrefix(std::string_view job) { return JobScoped(kUploadTag, job); }
std::string AllUploadsPrefix() { return std::string(1, kUploadTag); }

std::string Hot(std::string_view job, uint64_t step) { return StepScoped(kHotTag, job, step); }
std::string AllHotPrefix() { return std::string(1, kHotTag); }

std::string Meta(std::string_view name) {
  std::string key(1, kMetaTag);
  key.append(name);
  return key;
}

absl::StatusOr<std::string> DecodeJob(std::string_view key) {
  if (key.empty() || key[0] != kJobTag) return Malformed("job", key, "wrong tag");
  if (key.size() == 1) return Malformed("job", key, "empty job name");
  if (key.find('\0') != std::string_view::npos) return Malformed("job", key, "NUL in job name");
  return std::string(key.substr(1));
}

absl::StatusOr<std::pair<std::string, uint64_t>> DecodeCheckpoint(std::string_view key) {
  auto parts = SplitStepScoped("checkpoint", kCheckpointTag, key);
  if (!parts.ok()) return parts.status();
  if (!parts->rest.empty()) return Malformed("checkpoint", key, "trailing bytes");
  return std::make_pair(std::move(parts->job), parts->step);
}

absl::StatusOr<std::pair<std::string, uint64_t>> DecodeUpload(std::string_view key) {
  auto parts = SplitStepScoped("upload", kUploadTag, key);
  if (!parts.ok()) return parts.status();
  if (!parts->rest.empty()) return Malformed("upload", key, "trailing bytes");
  return std::make_pair(std::move(parts->job), parts->step);
}

absl::StatusOr<std::pair<std::string, uint64_t>> DecodeHot(std::string_view key) {
  auto parts = SplitStepScoped("hot", kHotTag, key);
  if (!parts.ok()) return parts.status();
  if (!parts->rest.empty()) return Malformed("hot", key, "trailing bytes");
  return std::make_pair(std::move(parts->job), parts->step);
}

absl::StatusOr<std::tuple<std::string, uint64_t, uint32_t>> DecodeRank(std::string_view key) {
  auto parts = SplitStepScoped("rank", kRankTag, key);
  if (!parts.ok()) return parts.status();
  if (parts->rest.size() != 4) return Malformed("rank", key, "rank is not 4 bytes");
  auto rank = static_cast<uint32_t>(GetBe(parts->rest, 4));
  return std::make_tuple(std::move(parts->job), parts->step, rank);
}

absl::StatusOr<std::string> DecodeItem(std::string_view key) {
  auto parts = SplitStepScoped("item", kItemTag, key);
  if (!parts.ok()) return parts.status();
  if (parts->rest.empty()) return Malformed("item", key, "empty item name");
  return std::string(parts->rest);
}

absl::StatusOr<std::string> DecodeBlob(std::string_view key) {
  auto parts = SplitStepScoped("blob", kBlobTag, key);
  if (!parts.ok()) return parts.status();
  if (parts->rest.empty()) return Malformed("blob", key, "empty blob name");
  return std::string(parts->rest);
}

}  // namespace ckptd::keys
