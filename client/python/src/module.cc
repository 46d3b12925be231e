// ckptd._ckptd: the pybind11 binding over libckptd-client, and only a binding: it converts Python
// values to the library's types and calls it with the GIL released. Plain tuples and ints in,
// dicts out. The Python layer (ckptd/_client.py) turns numpy arrays and torch tensors into views
// (address, shape, byte strides, itemsize), so the binding depends on neither.
//
// Copies: none here. The library's Save()/Load() make the one copy between caller memory and the
// arena (gathering/scattering strided views), recognise views in daemon memory (stage()d arena
// buffers, registered shm slabs) by themselves and copy nothing for them, and batch loads by
// their one policy.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckptd/client.h"
#include "ckptd/strided_copy.h"
#include "convert.h"
#include "nogil.h"
#include "slab.h"

namespace py = pybind11;

namespace ckptd::py_binding {
namespace {

using ckptd::StridedView;

class PyClient {
 public:
  PyClient(const std::string& socket_path, int rpc_timeout_ms, int connect_timeout_ms,
           const std::string& client_name, bool pin_cuda, const std::string& tier_policy,
           uint32_t local_world_size) {
    ClientOptions o;
    o.pin_arena_for_cuda = pin_cuda;
    o.local_world_size = local_world_size;
    if (tier_policy == "local") {
      o.tier_policy = TierPolicy::kLocal;
    } else if (tier_policy == "local+remote") {
      o.tier_policy = TierPolicy::kLocalAndRemote;
    } else if (tier_policy == "remote") {
      o.tier_policy = TierPolicy::kRemote;
    } else if (tier_policy == "local+peer") {
      o.tier_policy = TierPolicy::kLocalAndPeer;
    } else if (!tier_policy.empty() && tier_policy != "default") {
      throw py::value_error("tier_policy \"" + tier_policy +
                            "\": expected \"default\", \"local\", \"local+remote\", \"remote\" "
                            "or \"local+peer\"");
    }
    o.socket_path = socket_path;
    o.rpc_timeout_ms = rpc_timeout_ms;
    o.connect_timeout_ms = connect_timeout_ms;
    o.client_name = client_name;
    absl::StatusOr<std::unique_ptr<Client>> c;
    {
      ReleasedGil released;
      c = Client::Connect(o);
    }
    client_ = std::shared_ptr<Client>(Check(std::move(c)).release());
  }

  std::shared_ptr<Client> client() const { return client_; }

  // Reserves arena buffers without filling them (the caller copies into them, e.g. from a GPU).
  std::vector<ArenaBuffer> Allocate(const std::vector<uint64_t>& sizes) {
    absl::StatusOr<std::vector<ArenaBuffer>> got;
    {
      ReleasedGil released;
      got = client_->AllocateMany(sizes);
    }
    return Check(std::move(got));
  }

  // Copies each view once into an arena buffer of its own (Client::Stage).
  std::vector<ArenaBuffer> Stage(const py::list& sources) {
    std::vector<StridedView> views;
    for (py::handle h : sources) views.push_back(ParseView(h));
    absl::StatusOr<std::vector<ArenaBuffer>> got;
    {
      ReleasedGil released;
      got = client_->Stage(views);
    }
    return Check(std::move(got));
  }

  void ReleaseBuffers(const std::vector<ArenaBuffer>& buffers) {
    ReleasedGil released;
    client_->ReleaseMany(buffers);
  }

  // Gives back the arena buffers holding these addresses (views of stage()/allocate() buffers).
  void ReleaseAt(const std::vector<uintptr_t>& addresses) {
    std::vector<const void*> at;
    at.reserve(addresses.size());
    for (uintptr_t a : addresses) at.push_back(reinterpret_cast<const void*>(a));
    ReleasedGil released;
    client_->ReleaseAt(at);
  }

  // Client::Close (the session ends; views of arena buffers stay readable).
  void Close() {
    ReleasedGil released;
    client_->Close();
  }

  // tensors: [(item, dtype, global_shape, region, view)], objects: [(item, per_rank, bytes)]
  py::dict Save(const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
                const py::list& tensors, const py::list& objects) {
    std::vector<TensorShard> ts;
    for (py::handle h : tensors) {
      auto t = h.cast<py::tuple>();
      TensorShard shard;
      shard.item = t[0].cast<std::string>();
      shard.dtype = ParseDType(t[1].cast<std::string>());
      shard.global_shape = ToU64(t[2]);
      shard.region = ParseRegion(t[3]);
      if (std::optional<CudaView> cuda = ParseCudaView(t[4])) {
        shard.data = cuda->address;
        shard.device = cuda->device;
      } else {
        shard.strided = ParseView(t[4]);
      }
      absl::StatusOr<uint64_t> n = shard.region.ElementCount(shard.global_shape);
      if (!n.ok()) {
        Throw(absl::Status(n.status().code(),
                           "item " + shard.item + ": " + std::string(n.status().message())));
      }
      shard.bytes = *n * DTypeSize(shard.dtype);
      ts.push_back(std::move(shard));
    }
    std::vector<ObjectShard> objs;  // borrowed views of immutable bytes objects held by `objects`
    for (py::handle h : objects) {
      auto t = h.cast<py::tuple>();
      ObjectShard o;
      o.item = t[0].cast<std::string>();
      o.per_rank = t[1].cast<bool>();
      o.borrowed = t[2].cast<std::string_view>();
      objs.push_back(std::move(o));
    }
    absl::StatusOr<SaveResult> result;
    {
      ReleasedGil released;
      result = client_->Save(job, step, rank, world_size, ts, objs);
    }
    SaveResult r = Check(std::move(result));
    return py::dict(py::arg("bytes_staged") = r.bytes_staged,
                    py::arg("state") = CheckpointStateName(r.state));
  }

  // targets: [(item, region, view, nbytes)]; returns {step, bytes_read, item_bytes, ...}. One call
  // of the library's Load: it batches (one Load RPC per batch, two in flight) and copies.
  py::dict Load(const std::string& job, const py::object& step, uint32_t rank,
                const py::list& targets, bool prefetch, bool hot_direct) {
    std::vector<LoadTarget> ts;
    for (py::handle h : targets) {
      auto t = h.cast<py::tuple>();
      LoadTarget target;
      target.item = t[0].cast<std::string>();
      target.region = ParseRegion(t[1]);
      if (std::optional<CudaView> cuda = ParseCudaView(t[2])) {
        target.dest = cuda->address;
        target.device = cuda->device;
      } else {
        target.strided = ParseView(t[2]);
      }
      target.bytes = t[3].cast<uint64_t>();
      ts.push_back(std::move(target));
    }
    std::optional<uint64_t> s = StepArg(step);
    absl::StatusOr<LoadResult> result;
    {
      ReleasedGil released;
      result = client_->Load(job, s, rank, ts,
                             LoadOptions{.prefetch = prefetch, .hot_direct = hot_direct});
    }
    LoadResult r = Check(std::move(result));
    return py::dict(py::arg("step") = r.step, py::arg("bytes_read") = r.bytes_read,
                    py::arg("bytes_read_remote") = r.bytes_read_remote,
                    py::arg("bytes_read_peer") = r.bytes_read_peer,
                    py::arg("bytes_from_ram") = r.bytes_from_ram,
                    py::arg("bytes_prefetched") = r.bytes_prefetched,
                    py::arg("item_bytes") = r.item_bytes);
  }

  py::bytes LoadObject(const std::string& job, const py::object& step, uint32_t rank,
                       const std::string& item) {
    absl::StatusOr<std::string> r;
    std::optional<uint64_t> s = StepArg(step);
    {
      ReleasedGil released;
      r = client_->LoadObject(job, s, rank, item);
    }
    return py::bytes(Check(std::move(r)));
  }

  py::list Inspect(const std::string& job, uint64_t step) {
    absl::StatusOr<std::vector<ItemInfo>> r;
    {
      ReleasedGil released;
      r = client_->Inspect(job, step);
    }
    py::list out;
    for (const ItemInfo& i : Check(std::move(r))) {
      py::dict d;
      d["name"] = i.name;
      d["kind"] = i.kind == ItemInfo::kTensor ? "tensor" : "object";
      d["dtype"] =
          i.kind == ItemInfo::kTensor ? py::object(py::str(DTypeName(i.dtype))) : py::none();
      d["shape"] = i.shape;
      d["per_rank"] = i.per_rank;
      d["shard_count"] = i.shard_count;
      d["bytes"] = i.bytes;
      d["object_ranks"] = i.object_ranks;
      out.append(d);
    }
    return out;
  }

  py::list ListJobs() {
    absl::StatusOr<std::vector<JobInfo>> r;
    {
      ReleasedGil released;
      r = client_->ListJobs();
    }
    py::list out;
    for (const JobInfo& j : Check(std::move(r))) {
      py::object latest =
          j.latest_committed_step ? py::object(py::int_(*j.latest_committed_step)) : py::none();
      out.append(py::dict(py::arg("job") = j.job, py::arg("owner_uid") = j.owner_uid,
                          py::arg("checkpoint_count") = j.checkpoint_count,
                          py::arg("latest_committed_step") = latest));
    }
    return out;
  }

  py::list ListCheckpoints(const std::string& job) {
    absl::StatusOr<std::vector<CheckpointInfo>> r;
    {
      ReleasedGil released;
      r = client_->ListCheckpoints(job);
    }
    py::list out;
    for (const CheckpointInfo& c : Check(std::move(r))) out.append(InfoDict(c));
    return out;
  }

  template <typename Fn>
  py::dict InfoCall(Fn&& fn) {
    absl::StatusOr<CheckpointInfo> r;
    {
      ReleasedGil released;
      r = fn();
    }
    return InfoDict(Check(std::move(r)));
  }

  py::object Latest(const std::string& job, const std::string& durable) {
    Durability d = Durability::kCommitted;
    if (durable == "peer") {
      d = Durability::kPeer;
    } else if (durable == "store") {
      d = Durability::kStore;
    } else if (durable != "committed") {
      throw py::value_error("durable \"" + durable +
                            "\": expected \"committed\", \"peer\" or \"store\"");
    }
    absl::StatusOr<uint64_t> r;
    {
      ReleasedGil released;
      r = client_->Latest(job, d);
    }
    if (!r.ok() && r.status().code() == absl::StatusCode::kNotFound) return py::none();
    return py::int_(Check(std::move(r)));
  }

  // None: "latest" (NotFoundError when the job has no committed checkpoint).
  uint64_t ResolveStep(const std::string& job, const py::object& step) {
    std::optional<uint64_t> s = StepArg(step);
    absl::StatusOr<uint64_t> r;
    {
      ReleasedGil released;
      r = client_->ResolveStep(job, s);
    }
    return Check(std::move(r));
  }

  void Delete(const std::string& job, uint64_t step) {
    absl::Status s;
    {
      ReleasedGil released;
      s = client_->Delete(job, step);
    }
    Check(s);
  }

  uint64_t ArenaBytes() {
    ReleasedGil released;
    return client_->arena_bytes();
  }

 private:
  std::shared_ptr<Client> client_;
};

// The library's counters, which count the binding's strided copies too (ckptd/strided_copy.h).
py::dict CopyStatsDict() {
  CopyStats c = Client::copy_stats();
  return py::dict(py::arg("save_bytes") = c.save_bytes, py::arg("save_calls") = c.save_calls,
                  py::arg("load_bytes") = c.load_bytes, py::arg("load_calls") = c.load_calls,
                  py::arg("gpu_fallback_bytes") = c.gpu_fallback_bytes);
}

// The buffers the binding hands out: ckptd::ArenaBuffer itself (it shares the arena mapping:
// views over it keep it mapped) and ShmSlab.
void BindBuffers(py::module_& m) {
  py::class_<ckptd::ArenaBuffer>(m, "ArenaBuffer", py::buffer_protocol())
      .def_buffer([](ckptd::ArenaBuffer& b) {
        return py::buffer_info(b.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size)}, {1});
      })
      .def_property_readonly("size", [](const ckptd::ArenaBuffer& b) { return b.size; })
      .def_property_readonly(
          "address",
          [](const ckptd::ArenaBuffer& b) { return reinterpret_cast<uintptr_t>(b.data); })
      .def_property_readonly("extent_id", [](const ckptd::ArenaBuffer& b) { return b.extent_id; });

  py::class_<ShmSlab, std::shared_ptr<ShmSlab>>(m, "ShmSlab", py::buffer_protocol())
      .def_buffer([](ShmSlab& s) {
        return py::buffer_info(s.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(s.bytes())}, {1});
      })
      .def_property_readonly("size", &ShmSlab::bytes)
      .def_property_readonly("address",
                             [](const ShmSlab& s) { return reinterpret_cast<uintptr_t>(s.data()); })
      .def_property_readonly("handle", &ShmSlab::handle)
      .def_property_readonly("name", &ShmSlab::name);
}

// The client's construction and data path: slabs, staging, saves and loads.
void BindClientData(py::class_<PyClient>& cls) {
  cls.def(py::init<const std::string&, int, int, const std::string&, bool, const std::string&,
                   uint32_t>(),
          py::arg("socket_path"), py::arg("rpc_timeout_ms"), py::arg("connect_timeout_ms"),
          py::arg("client_name"), py::arg("pin_cuda"), py::arg("tier_policy"),
          py::arg("local_world_size"))
      .def("new_slab",
           [](PyClient& c, uint64_t bytes) { return std::make_shared<ShmSlab>(c.client(), bytes); })
      .def("stage", &PyClient::Stage)
      .def("allocate", &PyClient::Allocate)
      .def("release", &PyClient::ReleaseBuffers)
      .def("release_at", &PyClient::ReleaseAt)
      .def("close", &PyClient::Close)
      .def("save", &PyClient::Save)
      .def("load", &PyClient::Load, py::arg("job"), py::arg("step"), py::arg("rank"),
           py::arg("targets"), py::arg("prefetch") = false, py::arg("hot_direct") = true)
      .def("load_object", &PyClient::LoadObject)
      .def("inspect", &PyClient::Inspect)
      .def("list_jobs", &PyClient::ListJobs)
      .def("list_checkpoints", &PyClient::ListCheckpoints);
}

// The client's queries and checkpoint control: status, wait, commit, abort, latest, delete, and
// what it reports of itself.
void BindClientControl(py::class_<PyClient>& cls) {
  cls.def("status",
          [](PyClient& c, const std::string& job, uint64_t step) {
            return c.InfoCall([&] { return c.client()->GetStatus(job, step); });
          })
      .def("wait",
           [](PyClient& c, const std::string& job, uint64_t step, const std::string& until_name,
              uint32_t timeout_ms) {
             ckptd::WaitFor until = ckptd::WaitFor::kCommitted;
             if (until_name == "staged") {
               until = ckptd::WaitFor::kAllStaged;
             } else if (until_name == "remote") {
               until = ckptd::WaitFor::kRemote;
             } else if (until_name != "committed") {
               throw py::value_error("until \"" + until_name +
                                     "\": expected \"staged\", \"committed\" or \"remote\"");
             }
             return c.InfoCall([&] { return c.client()->Wait(job, step, until, timeout_ms); });
           })
      .def("commit",
           [](PyClient& c, const std::string& job, uint64_t step) {
             return c.InfoCall([&] { return c.client()->Commit(job, step, true); });
           })
      .def("abort",
           [](PyClient& c, const std::string& job, uint64_t step, const std::string& reason) {
             return c.InfoCall([&] { return c.client()->Abort(job, step, reason); });
           })
      .def("latest", &PyClient::Latest, py::arg("job"), py::arg("durable") = "committed")
      .def("resolve_step", &PyClient::ResolveStep)
      .def("delete", &PyClient::Delete)
      .def("arena_bytes", &PyClient::ArenaBytes)
      .def("load_batch_bytes",
           [](PyClient& c) {
             ReleasedGil released;
             return c.client()->load_batch_bytes();
           })
      .def("arena_pinned_for_cuda",
           [](PyClient& c) {
             ReleasedGil released;
             return c.client()->arena_pinned_for_cuda();
           })
      .def("target", [](PyClient& c) { return c.client()->target(); })
      .def("reconnect_count", [](PyClient& c) { return c.client()->reconnect_count(); });
}

}  // namespace
}  // namespace ckptd::py_binding

PYBIND11_MODULE(_ckptd, m) {
  using namespace ckptd::py_binding;
  m.doc() = "Low-level binding over libckptd-client; use the ckptd package instead.";
  // The one dtype table; ckptd/_arrays.py builds its maps from it.
  m.attr("DTYPES") = DTypeTable();
  BindBuffers(m);
  py::class_<PyClient> client(m, "Client");
  BindClientData(client);
  BindClientControl(client);

  // Before finalization: from then on a thread finishing a call of ours parks instead of taking
  // the GIL back (nogil.h).
  py::module_::import("atexit").attr("register")(py::cpp_function(&OnPythonExit));
  // Slabs (ckptd.empty) whose objects outlive finalization are unlinked by name at exit.
  py::module_::import("atexit").attr("register")(py::cpp_function(&UnlinkSlabsAtExit));

  m.def("copy_stats", &CopyStatsDict);
  m.def("reset_copy_stats", &ckptd::Client::reset_copy_stats);
}
