// Internal to libckptd-client: the staging arena segment mapped into this process.
// Resource: one MAP_SHARED mapping (and, when pinned, a CUDA host registration) per daemon
// instance. Owner: shared by the session and every ArenaBuffer handed out of it; unmapped when the
// last shared_ptr goes, so a buffer's memory never vanishes under the caller, even after the
// daemon restarted (the new instance gets a new mapping).
// Resource: the populating thread (a mapping made without MAP_POPULATE: the daemon was still
// faulting its arena in). Owner: the mapping; ends when every page of the mapping is populated,
// when no page came to exist for kPopulateIdle (another uid holds those ranges: the copies fault
// them), or when the mapping is destroyed (stopped and joined first, within one pass's sleep). In
// a forked child the thread does not exist: its handle is left behind, never joined.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace ckptd::internal {

// The staging arena segment of this process's uid in one daemon instance, mapped MAP_SHARED
// read/write. Unmapped when the last shared_ptr goes (ArenaBuffers share it, so their memory
// never vanishes under the caller).
class ArenaMapping {
 public:
  // Fetches the segment's descriptor from the daemon's arena socket `arena_socket` for
  // `session_id` (the protocol is in ckptd.proto, above HelloResponse) and maps `bytes` of it,
  // with MAP_POPULATE when the daemon says every page exists. pin_for_cuda: also page-lock the
  // mapping for CUDA (cudaHostRegister); FAILED_PRECONDITION when that fails (nothing stays mapped
  // then). Errors: the daemon's answer (its code and message), UNAVAILABLE when the socket cannot
  // be reached, INTERNAL for a malformed answer or a segment smaller than announced.
  static absl::StatusOr<std::shared_ptr<ArenaMapping>> Map(const std::string& arena_socket,
                                                           const std::string& session_id,
                                                           uint64_t bytes, bool pin_for_cuda);
  // Map()'s second half: maps `bytes` of the shared-memory object `fd` (taken: closed here,
  // mapped or not), named `shm_name` in errors; populate: MAP_POPULATE. Tests map a memfd of
  // their own as a scripted daemon's arena (tests/unit/client/fake_daemon.h).
  static absl::StatusOr<std::shared_ptr<ArenaMapping>> MapFd(int fd, const std::string& shm_name,
                                                             uint64_t bytes, bool populate,
                                                             bool pin_for_cuda);
  ~ArenaMapping();
  ArenaMapping(const ArenaMapping&) = delete;
  ArenaMapping& operator=(const ArenaMapping&) = delete;

  // [offset, offset + length) of the arena; INTERNAL when the daemon named bytes outside it.
  absl::StatusOr<uint8_t*> At(uint64_t offset, uint64_t length) const;
  const std::string& name() const { return name_; }
  uint64_t size() const { return bytes_; }
  bool pinned_for_cuda() const { return pinned_for_cuda_; }
  // Bytes of the mapping whose page tables the populating thread has filled so far (the whole
  // size when mapped with MAP_POPULATE or pinned; tests and the first-save bench read it).
  uint64_t populated_bytes() const;

 private:
  ArenaMapping(std::string name, uint8_t* base, uint64_t bytes)
      : name_(std::move(name)), base_(base), bytes_(bytes) {}
  // The first save after a daemon starts (docs/OPERATIONS.md "The first save"): a mapping made
  // before the daemon had faulted its arena in would take a page fault per 4 KiB in that save's
  // copy (about 1.5x the copy itself). This thread maps into this process, 2 MiB at a time, each
  // range whose pages already exist in the segment (mincore), so the copy finds them mapped. It
  // allocates nothing: a range without pages is left to the copy that writes it (the daemon
  // makes a reservation's pages exist before answering it). A range another uid takes between
  // the check and the populate is allocated in this uid's segment, as a client's own write into
  // a free range would be (arena.h: those pages are this uid's and are punched when it goes).
  // CKPTD_ARENA_POPULATE=0 in the environment turns it off.
  void StartPopulating();
  void PopulateLoop();
  std::string name_;
  uint8_t* base_;
  uint64_t bytes_;
  bool pinned_for_cuda_ = false;
  mutable absl::Mutex mu_;
  absl::CondVar stop_cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t populated_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<std::thread> populator_;
  pid_t creator_pid_ = 0;  // a forked child never joins the thread
};

}  // namespace ckptd::internal
