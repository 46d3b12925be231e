// Client: the overlapped save (SaveAsync, PendingSave), over AsyncSaves' threads.
#include <utility>

#include "absl/strings/str_cat.h"
#include "async_saves.h"
#include "ckptd/client.h"
#include "client_core.h"

namespace ckptd {

PendingSave::PendingSave(std::shared_ptr<internal::AsyncSaveState> state)
    : state_(std::move(state)) {}

PendingSave::~PendingSave() {
  if (state_ != nullptr) (void)internal::AwaitSave(*state_);
}

PendingSave& PendingSave::operator=(PendingSave&& other) noexcept {
  if (this != &other) {
    if (state_ != nullptr) (void)internal::AwaitSave(*state_);
    state_ = std::move(other.state_);
  }
  return *this;
}

absl::StatusOr<SaveResult> PendingSave::WaitStaged() {
  if (state_ == nullptr) {
    return absl::FailedPreconditionError("PendingSave holds no save (moved from or default)");
  }
  return internal::AwaitSave(*state_);
}

bool PendingSave::staged() const { return state_ != nullptr && internal::SaveDone(*state_); }

absl::StatusOr<PendingSave> Client::SaveAsync(std::string job, uint64_t step, uint32_t rank,
                                              uint32_t world_size, std::vector<TensorShard> tensors,
                                              std::vector<ObjectShard> objects) {
  const ClientOptions& options = core_->options();  // checked by Connect
  std::call_once(async_once_, [this, &options] {
    async_ = std::make_unique<internal::AsyncSaves>(options.save_threads, options.save_thread_nice,
                                                    options.async_saves_max);
  });
  absl::StatusOr<std::shared_ptr<internal::AsyncSaveState>> state = async_->Submit(
      [this, job = std::move(job), step, rank, world_size, tensors = std::move(tensors),
       objects = std::move(objects)]() -> absl::StatusOr<SaveResult> {
        return Save(job, step, rank, world_size, tensors, objects);
      });
  if (!state.ok()) return state.status();
  return PendingSave(*std::move(state));
}

}  // namespace ckptd
