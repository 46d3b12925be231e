// FakeGpu: the Gpu seam (dataplane/gpu.h) over host memory, for tests without a GPU — "device
// memory" is host buffers, a handle names one of them, copies are memcpy. It counts opens,
// closes and pins, and can refuse (Available), fail the next copies, or report a GPU the daemon
// cannot see. Thread-safe.
#pragma once

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "dataplane/gpu.h"

namespace ckptd::testing {

class FakeGpu final : public Gpu {
 public:
  static std::string Uuid() { return std::string("fake-gpu-uuid-00", 16); }

  // A new "allocation" of `bytes`; returns its 64-byte handle, *data its bytes.
  std::string Allocate(uint64_t bytes, uint8_t** data) {
    absl::MutexLock lock(&mu_);
    std::string handle(64, '\0');
    std::string id = absl::StrCat("alloc-", next_++);
    std::memcpy(handle.data(), id.data(), id.size());
    auto& mem = allocs_[handle];
    mem = std::make_unique<std::vector<uint8_t>>(bytes);
    *data = mem->data();
    return handle;
  }

  absl::Status Available() override {
    absl::MutexLock lock(&mu_);
    return unavailable_;
  }
  absl::StatusOr<int> DeviceOf(std::string_view uuid) override {
    if (uuid == Uuid()) return 0;
    return absl::FailedPreconditionError("GPU is not visible to the daemon (fake)");
  }
  absl::StatusOr<GpuMapping> OpenIpc(int, std::string_view handle) override {
    absl::MutexLock lock(&mu_);
    if (!fail_opens_.ok()) return fail_opens_;
    auto it = allocs_.find(std::string(handle));
    if (it == allocs_.end()) return absl::InvalidArgumentError("cuIpcOpenMemHandle: bad handle");
    ++opens_;
    ++open_now_;
    return GpuMapping{reinterpret_cast<uint64_t>(it->second->data()), it->second->size()};
  }
  void CloseIpc(int, uint64_t) override {
    absl::MutexLock lock(&mu_);
    ++closes_;
    --open_now_;
  }
  absl::Status PinHost(void*, uint64_t) override {
    absl::MutexLock lock(&mu_);
    ++pins_;
    return absl::OkStatus();
  }
  void UnpinHost(void*) override {
    absl::MutexLock lock(&mu_);
    ++unpins_;
  }
  absl::Status CopyToHost(int, std::span<const GpuCopy> copies) override {
    return Copy(copies, true);
  }
  absl::Status CopyToDevice(int, std::span<const GpuCopy> copies) override {
    return Copy(copies, false);
  }

  void SetUnavailable(absl::Status why) {
    absl::MutexLock lock(&mu_);
    unavailable_ = std::move(why);
  }
  void FailOpens(absl::Status why) {
    absl::MutexLock lock(&mu_);
    fail_opens_ = std::move(why);
  }
  void FailCopies(absl::Status why) {
    absl::MutexLock lock(&mu_);
    fail_copies_ = std::move(why);
  }
  int opens() {
    absl::MutexLock l(&mu_);
    return opens_;
  }
  int closes() {
    absl::MutexLock l(&mu_);
    return closes_;
  }
  int open_now() {
    absl::MutexLock l(&mu_);
    return open_now_;
  }
  int pins() {
    absl::MutexLock l(&mu_);
    return pins_;
  }
  int unpins() {
    absl::MutexLock l(&mu_);
    return unpins_;
  }
  uint64_t copied_bytes() {
    absl::MutexLock l(&mu_);
    return copied_bytes_;
  }

 private:
  absl::Status Copy(std::span<const GpuCopy> copies, bool to_host) {
    absl::MutexLock lock(&mu_);
    if (!fail_copies_.ok()) return fail_copies_;
    for (const GpuCopy& c : copies) {
      auto* dev = reinterpret_cast<uint8_t*>(c.device_addr);
      if (to_host) {
        std::memcpy(c.host, dev, c.bytes);
      } else {
        std::memcpy(dev, c.host, c.bytes);
      }
      copied_bytes_ += c.bytes;
    }
    return absl::OkStatus();
  }

  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<std::vector<uint8_t>>> allocs_ ABSL_GUARDED_BY(mu_);
  int next_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status unavailable_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_copies_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_opens_ ABSL_GUARDED_BY(mu_);
  int opens_ ABSL_GUARDED_BY(mu_) = 0;
  int closes_ ABSL_GUARDED_BY(mu_) = 0;
  int open_now_ ABSL_GUARDED_BY(mu_) = 0;
  int pins_ ABSL_GUARDED_BY(mu_) = 0;
  int unpins_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t copied_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ckptd::testing
