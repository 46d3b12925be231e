// The POSIX shm slabs behind ckptd.empty(): memory this process creates and registers with the
// daemon, which reads (save) and writes (load) it in place.
//
// Resource: one shm object per slab, named "/ckptd-py-<pid>-<n>-<random>" (random: names never
// collide, whatever pids other processes or pid namespaces sharing /dev/shm had), mode 0600.
// Owner: the ShmSlab (the Python views over it keep it alive). Ends: the last view goes (the
// destructor unregisters, unmaps and unlinks; in a forked child it only unmaps its copy), or
// the interpreter exits (UnlinkSlabsAtExit
// unlinks every live slab's name: the objects themselves may never be destroyed then), or the
// process dies: while it lives it holds an exclusive flock on each slab, so the next process of
// the same uid that creates a slab (SweepOrphanSlabs, once per process) finds the slabs nobody
// holds and unlinks them — across pid namespaces too, which a pid liveness check would get wrong.
// The daemon: its region registration ends with the session; a daemon restart re-registers the
// slab by name (the client library does it).
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <memory>
#include <string>

#include "ckptd/client.h"

namespace ckptd::py_binding {

class ShmSlab {
 public:
  // Creates, sizes, maps and registers a slab of `bytes` (raises on failure, leaving nothing).
  ShmSlab(std::shared_ptr<Client> client, uint64_t bytes);
  ~ShmSlab();
  ShmSlab(const ShmSlab&) = delete;
  ShmSlab& operator=(const ShmSlab&) = delete;

  void* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t handle() const { return handle_; }
  const std::string& name() const { return name_; }

 private:
  std::shared_ptr<Client> client_;
  std::string name_;
  int fd_ = -1;  // held open, with the flock that marks the slab as alive
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
  uint64_t handle_ = 0;
  pid_t pid_ = getpid();  // the process that made it: only it unregisters and unlinks
};

// Unlinks the names of every slab still alive (registered with atexit by the module).
void UnlinkSlabsAtExit();
// Unlinks the slabs of this uid that no live process holds (left by processes that were killed).
// Skips objects of size 0 (a slab being created). Best effort: errors are ignored.
void SweepOrphanSlabs();

}  // namespace ckptd::py_binding
