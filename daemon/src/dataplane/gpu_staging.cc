#include "dataplane/gpu_staging.h"

#include <map>

#include "spdlog/spdlog.h"

namespace ckptd {

GpuStaging::~GpuStaging() {
  absl::MutexLock lock(&mu_);
  if (pinned_) gpu_->UnpinHost(pinned_base_);
}

bool GpuStaging::pinned(uint32_t uid) const {
  absl::ReaderMutexLock lock(&mu_);
  return pinned_ && pinned_uid_ == uid;
}

void GpuStaging::UpdatePin(uint32_t uid) {
  const size_t segments = arena_->segments().size();
  {
    absl::ReaderMutexLock lock(&mu_);
    const bool want = segments == 1 && !pin_failed_ && !unpinned_for_segments_;
    if (pinned_ == want && (!pinned_ || pinned_uid_ == uid)) return;
    if (!want && !pinned_) return;
  }
  absl::MutexLock lock(&mu_);  // no batch in flight from here on
  if (pinned_ && (segments > 1 || pinned_uid_ != uid)) {
    gpu_->UnpinHost(pinned_base_);
    pinned_ = false;
    if (segments > 1 && !unpinned_for_segments_) {
      unpinned_for_segments_ = true;
      spdlog::warn(
          "staging arena: a second uid's segment exists, so the daemon's GPU copies no longer "
          "use a pinned arena (pages move between segments); device-to-host staging continues "
          "from pageable memory, at lower speed");
    }
  }
  if (pinned_ || segments != 1 || pin_failed_ || unpinned_for_segments_) return;
  uint8_t* base = arena_->At(uid, 0);
  absl::Status st = gpu_->PinHost(base, arena_->size_bytes());
  if (!st.ok()) {
    pin_failed_ = true;
    spdlog::warn("staging arena: pinning it for GPU copies failed ({}); copies use pageable memory",
                 st.ToString());
    return;
  }
  pinned_ = true;
  pinned_uid_ = uid;
  pinned_base_ = base;
  spdlog::info("staging arena: uid {}'s segment ({} bytes) pinned for the daemon's GPU copies", uid,
               arena_->size_bytes());
}

absl::Status GpuStaging::Run(std::span<const DeviceCopy> copies, bool to_host) {
  std::map<int, std::vector<GpuCopy>> by_device;
  for (const DeviceCopy& c : copies) by_device[c.device].push_back(c.copy);
  absl::Status first;
  for (const auto& [device, batch] : by_device) {
    absl::Status st = to_host ? gpu_->CopyToHost(device, batch) : gpu_->CopyToDevice(device, batch);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

absl::Status GpuStaging::CopyToArena(uint32_t uid, std::span<const DeviceCopy> copies) {
  if (copies.empty()) return absl::OkStatus();
  UpdatePin(uid);
  absl::ReaderMutexLock lock(&mu_);
  return Run(copies, /*to_host=*/true);
}

absl::Status GpuStaging::CopyToDevice(std::span<const DeviceCopy> copies) {
  if (copies.empty()) return absl::OkStatus();
  absl::ReaderMutexLock lock(&mu_);
  return Run(copies, /*to_host=*/false);
}

}  // namespace ckptd
