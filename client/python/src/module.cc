// ckptd._ckptd: the pybind11 binding over libckptd-client. Deliberately low level: plain tuples
// and ints in, dicts out. The Python layer (ckptd/_client.py) turns numpy arrays and torch
// tensors into (address, shape, strides) triples, so the binding depends on neither.
//
// Copies. Tensor bytes are gathered straight into reserved arena extents (strided sources in the
// same pass) with the GIL released, then saved with SaveInPlace: one copy per byte, counted in
// copy_stats(). Sources already in daemon memory (arena buffers, registered shm slabs) are saved
// without any copy.

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

namespace py = pybind11;

namespace ckptd::py_binding {
namespace {

using ckptd::StridedView;

class PyClient {
 public:
  PyClient(const std::string& socket_path, int rpc_timeout_ms, int connect_timeout_ms,
           const std::string& client_name, bool pin_cuda) {
    ClientOptions o;
    o.pin_arena_for_cuda = pin_cuda;
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
  std::vector<PyArenaBuffer> Allocate(const std::vector<uint64_t>& sizes) {
    absl::StatusOr<std::vector<ArenaBuffer>> got;
    {
      ReleasedGil released;
      got = client_->AllocateMany(sizes);
    }
    std::vector<PyArenaBuffer> out;
    for (ArenaBuffer& b : Check(std::move(got))) out.push_back(PyArenaBuffer{std::move(b)});
    return out;
  }

  // Reserves arena buffers and gathers each source into its own: the one copy of a save.
  std::vector<PyArenaBuffer> Stage(const py::list& sources) {
    std::vector<StridedView> views;
    std::vector<uint64_t> sizes;
    for (py::handle h : sources) {
      Memory m = ParseMemory(h);
      if (m.kind != Memory::kMem) throw py::value_error("stage(): only caller memory");
      sizes.push_back(std::max<uint64_t>(m.view.Bytes(), 1));
      views.push_back(m.view);
    }
    std::vector<PyArenaBuffer> out = Allocate(sizes);
    ReleasedGil released;
    for (size_t i = 0; i < views.size(); ++i) Gather(views[i], out[i].buffer.data);
    return out;
  }

  void ReleaseBuffers(const std::vector<PyArenaBuffer*>& buffers) {
    std::vector<ArenaBuffer> bufs;
    for (const PyArenaBuffer* b : buffers) bufs.push_back(b->buffer);
    ReleasedGil released;
    client_->ReleaseMany(bufs);
  }

  // tensors: [(item, dtype, global_shape, region, memory)], objects: [(item, per_rank, bytes)]
  py::dict Save(const std::string& job, uint64_t step, uint32_t rank, uint32_t world_size,
                const py::list& tensors, const py::list& objects) {
    std::vector<TensorIn> ts;
    for (py::handle h : tensors) {
      auto t = h.cast<py::tuple>();
      TensorIn in{t[0].cast<std::string>(),
                  ParseDType(t[1].cast<std::string>()),
                  ToU64(t[2]),
                  ParseRegion(t[3]),
                  ParseMemory(t[4]),
                  0};
      absl::StatusOr<uint64_t> n = in.region.ElementCount(in.global_shape);
      if (!n.ok())
        Throw(absl::Status(n.status().code(),
                           "item " + in.item + ": " + std::string(n.status().message())));
      in.bytes = *n * DTypeSize(in.dtype);
      if (in.mem.kind == Memory::kMem && static_cast<uint64_t>(in.mem.view.Bytes()) != in.bytes) {
        throw py::value_error("ckptd: item " + in.item + ": the array has " +
                              std::to_string(in.mem.view.Bytes()) + " bytes, its region needs " +
                              std::to_string(in.bytes));
      }
      ts.push_back(std::move(in));
    }
    std::vector<std::string> obj_items;
    std::vector<bool> obj_per_rank;
    std::vector<std::string_view> obj_bytes;  // views of immutable bytes objects held by `objects`
    for (py::handle h : objects) {
      auto t = h.cast<py::tuple>();
      obj_items.push_back(t[0].cast<std::string>());
      obj_per_rank.push_back(t[1].cast<bool>());
      obj_bytes.push_back(t[2].cast<std::string_view>());
    }
    absl::StatusOr<SaveResult> result;
    {
      ReleasedGil released;
      result = SaveLocked(job, step, rank, world_size, ts, obj_items, obj_per_rank, obj_bytes);
    }
    SaveResult r = Check(std::move(result));
    return py::dict(py::arg("bytes_staged") = r.bytes_staged,
                    py::arg("state") = CheckpointStateName(r.state));
  }

  // targets: [(item, region, memory, nbytes)]; returns {step, bytes_read, item_bytes}.
  py::dict Load(const std::string& job, const py::object& step, uint32_t rank,
                const py::list& targets) {
    struct Target {
      std::string item;
      Region region;
      Memory mem;
      uint64_t bytes;
    };
    std::vector<Target> ts;
    for (py::handle h : targets) {
      auto t = h.cast<py::tuple>();
      ts.push_back(Target{t[0].cast<std::string>(), ParseRegion(t[1]), ParseMemory(t[2]),
                          t[3].cast<uint64_t>()});
    }
    std::optional<uint64_t> s = StepArg(step);
    LoadResult total;
    total.item_bytes.assign(ts.size(), 0);
    absl::Status status;
    {
      ReleasedGil released;
      // Contiguous caller memory: Load() (the library's one copy). Strided caller memory: into
      // arena buffers, then scattered (our one copy). Daemon memory: in place.
      std::vector<LoadTarget> direct;
      std::vector<size_t> direct_idx;
      std::vector<InPlaceLoadTarget> inplace;
      std::vector<size_t> inplace_idx;
      std::vector<size_t> strided_idx;
      std::vector<uint64_t> strided_sizes;
      for (size_t i = 0; i < ts.size(); ++i) {
        Target& t = ts[i];
        if (t.mem.kind != Memory::kMem) {
          inplace.push_back(InPlaceLoadTarget{t.item, t.region, t.mem.ref, t.bytes});
          inplace_idx.push_back(i);
        } else if (t.mem.view.Contiguous() || t.bytes == 0) {
          direct.push_back(
              LoadTarget{t.item, t.region, reinterpret_cast<void*>(t.mem.view.data), t.bytes});
          direct_idx.push_back(i);
        } else {
          strided_idx.push_back(i);
          strided_sizes.push_back(t.bytes);
        }
      }
      std::vector<ArenaBuffer> scratch;
      if (!strided_sizes.empty()) {
        absl::StatusOr<std::vector<ArenaBuffer>> got = client_->AllocateMany(strided_sizes);
        status = got.status();
        if (got.ok()) scratch = *std::move(got);
        for (size_t k = 0; k < scratch.size(); ++k) {
          const Target& t = ts[strided_idx[k]];
          inplace.push_back(
              InPlaceLoadTarget{t.item, t.region, BufferRef::InArena(scratch[k]), t.bytes});
          inplace_idx.push_back(strided_idx[k]);
        }
      }
      auto merge = [&](const LoadResult& r, const std::vector<size_t>& idx) {
        total.step = r.step;
        total.bytes_read += r.bytes_read;
        for (size_t k = 0; k < idx.size() && k < r.item_bytes.size(); ++k) {
          total.item_bytes[idx[k]] = r.item_bytes[k];
        }
      };
      if (status.ok() && !direct.empty()) {
        absl::StatusOr<LoadResult> r = client_->Load(job, s, rank, direct);
        status = r.status();
        if (r.ok()) {
          merge(*r, direct_idx);
          if (!s.has_value()) s = r->step;  // both calls read the same checkpoint
        }
      }
      if (status.ok() && !inplace.empty()) {
        absl::StatusOr<LoadResult> r = client_->LoadInPlace(job, s, rank, inplace);
        status = r.status();
        if (r.ok()) merge(*r, inplace_idx);
      }
      if (status.ok()) {
        for (size_t k = 0; k < scratch.size(); ++k) {
          ckptd::Scatter(scratch[k].data, ts[strided_idx[k]].mem.view);
        }
      }
      client_->ReleaseMany(scratch);
    }
    Check(status);
    return py::dict(py::arg("step") = total.step, py::arg("bytes_read") = total.bytes_read,
                    py::arg("item_bytes") = total.item_bytes);
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

  py::object Latest(const std::string& job) {
    absl::StatusOr<uint64_t> r;
    {
      ReleasedGil released;
      r = client_->Latest(job);
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
  absl::StatusOr<SaveResult> SaveLocked(const std::string& job, uint64_t step, uint32_t rank,
                                        uint32_t world_size, std::vector<TensorIn>& ts,
                                        const std::vector<std::string>& obj_items,
                                        const std::vector<bool>& obj_per_rank,
                                        const std::vector<std::string_view>& obj_bytes) {
    std::vector<uint64_t> sizes;
    for (const TensorIn& t : ts) {
      if (t.mem.kind == Memory::kMem && t.bytes > 0) sizes.push_back(t.bytes);
    }
    for (std::string_view b : obj_bytes) {
      if (!b.empty()) sizes.push_back(b.size());
    }
    absl::StatusOr<std::vector<ArenaBuffer>> bufs = client_->AllocateMany(sizes);
    if (!bufs.ok()) return bufs.status();
    size_t next = 0;
    std::vector<InPlaceTensorShard> shards;
    for (TensorIn& t : ts) {
      BufferRef ref = t.mem.ref;
      if (t.mem.kind == Memory::kMem) {
        ref = BufferRef{};
        if (t.bytes > 0) {
          const ArenaBuffer& b = (*bufs)[next++];
          Gather(t.mem.view, b.data);
          ref = BufferRef::InArena(b);
        }
      }
      shards.push_back(InPlaceTensorShard{t.item, t.dtype, t.global_shape, t.region, ref, t.bytes});
    }
    std::vector<InPlaceObjectShard> objs;
    for (size_t i = 0; i < obj_items.size(); ++i) {
      BufferRef ref{};
      if (!obj_bytes[i].empty()) {
        const ArenaBuffer& b = (*bufs)[next++];
        const auto n = static_cast<int64_t>(obj_bytes[i].size());
        Gather(StridedView{reinterpret_cast<uintptr_t>(obj_bytes[i].data()), {n}, {1}, 1}, b.data);
        ref = BufferRef::InArena(b);
      }
      objs.push_back(InPlaceObjectShard{obj_items[i], obj_per_rank[i], ref, obj_bytes[i].size()});
    }
    absl::StatusOr<SaveResult> r = client_->SaveInPlace(job, step, rank, world_size, shards, objs);
    client_->ReleaseMany(*bufs);  // no-op for the buffers the daemon took
    return r;
  }

  std::shared_ptr<Client> client_;
};

// The library's counters, which count the binding's strided copies too (ckptd/strided_copy.h).
py::dict CopyStatsDict() {
  CopyStats c = Client::copy_stats();
  return py::dict(py::arg("save_bytes") = c.save_bytes, py::arg("save_calls") = c.save_calls,
                  py::arg("load_bytes") = c.load_bytes, py::arg("load_calls") = c.load_calls);
}

}  // namespace
}  // namespace ckptd::py_binding

PYBIND11_MODULE(_ckptd, m) {
  using namespace ckptd::py_binding;
  m.doc() = "Low-level binding over libckptd-client; use the ckptd package instead.";
  // The one dtype table; ckptd/_arrays.py builds its maps from it.
  m.attr("DTYPES") = DTypeTable();

  py::class_<PyArenaBuffer>(m, "ArenaBuffer", py::buffer_protocol())
      .def_buffer([](PyArenaBuffer& b) {
        return py::buffer_info(b.buffer.data, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.buffer.size)}, {1});
      })
      .def_property_readonly("size", [](const PyArenaBuffer& b) { return b.buffer.size; })
      .def_property_readonly(
          "address",
          [](const PyArenaBuffer& b) { return reinterpret_cast<uintptr_t>(b.buffer.data); })
      .def_property_readonly("extent_id",
                             [](const PyArenaBuffer& b) { return b.buffer.extent_id; });

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

  py::class_<PyClient>(m, "Client")
      .def(py::init<const std::string&, int, int, const std::string&, bool>(),
           py::arg("socket_path"), py::arg("rpc_timeout_ms"), py::arg("connect_timeout_ms"),
           py::arg("client_name"), py::arg("pin_cuda"))
      .def("new_slab",
           [](PyClient& c, uint64_t bytes) { return std::make_shared<ShmSlab>(c.client(), bytes); })
      .def("stage", &PyClient::Stage)
      .def("allocate", &PyClient::Allocate)
      .def("release", &PyClient::ReleaseBuffers)
      .def("save", &PyClient::Save)
      .def("load", &PyClient::Load)
      .def("load_object", &PyClient::LoadObject)
      .def("inspect", &PyClient::Inspect)
      .def("list_jobs", &PyClient::ListJobs)
      .def("list_checkpoints", &PyClient::ListCheckpoints)
      .def("status",
           [](PyClient& c, const std::string& job, uint64_t step) {
             return c.InfoCall([&] { return c.client()->GetStatus(job, step); });
           })
      .def("wait",
           [](PyClient& c, const std::string& job, uint64_t step, bool committed,
              uint32_t timeout_ms) {
             auto until = committed ? ckptd::WaitFor::kCommitted : ckptd::WaitFor::kAllStaged;
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
      .def("latest", &PyClient::Latest)
      .def("resolve_step", &PyClient::ResolveStep)
      .def("delete", &PyClient::Delete)
      .def("arena_bytes", &PyClient::ArenaBytes)
      .def("extent_alignment_bytes",
           [](PyClient& c) {
             ReleasedGil released;
             return c.client()->extent_alignment_bytes();
           })
      .def("arena_pinned_for_cuda",
           [](PyClient& c) {
             ReleasedGil released;
             return c.client()->arena_pinned_for_cuda();
           })
      .def("target", [](PyClient& c) { return c.client()->target(); })
      .def("reconnect_count", [](PyClient& c) { return c.client()->reconnect_count(); });

  // Before finalization: from then on a thread finishing a call of ours parks instead of taking
  // the GIL back (nogil.h).
  py::module_::import("atexit").attr("register")(py::cpp_function(&OnPythonExit));

  m.def("copy_stats", &CopyStatsDict);
  m.def("reset_copy_stats", &ckptd::Client::reset_copy_stats);
}
