#include "convert.h"

#include <pybind11/stl.h>

#include "ckptd/v1/common.pb.h"
#include "ckptd/v1/dtype_table.h"

namespace ckptd::py_binding {

void Throw(const absl::Status& s) {
  py::object cls = py::module_::import("ckptd._errors").attr("error_class")(int(s.code()));
  PyErr_SetString(cls.ptr(), std::string(s.message()).c_str());
  throw py::error_already_set();
}

DType ParseDType(const std::string& name) {
  absl::StatusOr<DType> dtype = ckptd::DTypeFromName(name);
  if (!dtype.ok()) throw py::value_error("ckptd: unsupported dtype \"" + name + "\"");
  return *dtype;
}

py::tuple DTypeTable() {
  py::list rows;
#define CKPTD_PY_DTYPE_ROW(proto, client, name, size, safetensors, numpy_native)          \
  rows.append(py::make_tuple(py::str(name), (size), static_cast<int>(::ckptd::v1::proto), \
                             py::str(safetensors), (numpy_native)));
  CKPTD_DTYPES(CKPTD_PY_DTYPE_ROW)
#undef CKPTD_PY_DTYPE_ROW
  return py::tuple(rows);
}

std::vector<uint64_t> ToU64(const py::handle& seq) {
  std::vector<uint64_t> out;
  for (py::handle h : seq) out.push_back(h.cast<uint64_t>());
  return out;
}
std::vector<int64_t> ToI64(const py::handle& seq) {
  std::vector<int64_t> out;
  for (py::handle h : seq) out.push_back(h.cast<int64_t>());
  return out;
}

Region ParseRegion(const py::handle& h) {
  auto t = h.cast<py::tuple>();
  auto kind = t[0].cast<std::string>();
  if (kind == "whole") return Region::Whole();
  if (kind == "box") return Region::Box(ToU64(t[1]), ToU64(t[2]));
  if (kind == "flat") return Region::Flat(t[1].cast<uint64_t>(), t[2].cast<uint64_t>());
  throw py::value_error("ckptd: unknown region kind \"" + kind + "\"");
}

StridedView ParseView(const py::handle& h) {
  auto t = h.cast<py::tuple>();
  StridedView v;
  v.data = t[0].cast<uintptr_t>();
  v.shape = ToI64(t[1]);
  v.strides = ToI64(t[2]);
  v.itemsize = t[3].cast<int64_t>();
  if (v.shape.size() != v.strides.size()) throw py::value_error("ckptd: shape/strides rank");
  return v;
}

py::dict InfoDict(const CheckpointInfo& c) {
  py::dict d;
  d["job"] = c.job;
  d["step"] = c.step;
  d["state"] = CheckpointStateName(c.state);
  d["world_size"] = c.world_size;
  d["bytes"] = c.bytes;
  d["tiers"] = py::dict(
      py::arg("staged") = c.tiers.staged, py::arg("ram") = c.tiers.ram,
      py::arg("ram_bytes") = c.tiers.ram_bytes, py::arg("local") = c.tiers.local,
      py::arg("remote") = c.tiers.remote, py::arg("peer_nodes") = c.tiers.peer_nodes,
      py::arg("blobs_without_peer_copy") = c.tiers.blobs_without_peer_copy,
      py::arg("local_part") = c.tiers.local_part, py::arg("part_peers") = c.tiers.part_peers,
      py::arg("peer_degraded") = c.tiers.peer_degraded);
  if (c.tiers.upload.state != UploadProgress::kNone) {
    static const char* kStates[] = {"none", "pending", "running", "retrying", "durable", "refused"};
    const UploadProgress& u = c.tiers.upload;
    d["upload"] =
        py::dict(py::arg("state") = kStates[u.state], py::arg("bytes_done") = u.bytes_done,
                 py::arg("bytes_total") = u.bytes_total, py::arg("error") = u.error,
                 py::arg("attempts") = u.attempts, py::arg("store") = u.store);
  }
  d["created_unix_ms"] = c.created_unix_ms;
  d["committed_unix_ms"] = c.committed_unix_ms;
  d["partial"] = c.partial;
  d["error"] = c.error;
  d["item_count"] = c.item_count;
  py::list ranks;
  for (const RankProgress& r : c.ranks) {
    ranks.append(py::dict(
        py::arg("rank") = r.rank, py::arg("staged") = r.staged, py::arg("persisted") = r.persisted,
        py::arg("bytes_staged") = r.bytes_staged, py::arg("bytes_persisted") = r.bytes_persisted,
        py::arg("shard_count") = r.shard_count));
  }
  d["ranks"] = ranks;
  d["missing_ranks"] = c.missing_ranks;
  d["bytes_staged"] = c.bytes_staged;
  d["bytes_persisted"] = c.bytes_persisted;
  return d;
}

std::optional<uint64_t> StepArg(const py::object& step) {
  if (step.is_none()) return std::nullopt;
  return step.cast<uint64_t>();
}

std::optional<CudaView> ParseCudaView(const py::handle& h) {
  if (!py::isinstance<py::tuple>(h)) return std::nullopt;
  auto t = h.cast<py::tuple>();
  if (t.size() != 3 || !py::isinstance<py::str>(t[0]) || t[0].cast<std::string>() != "cuda") {
    return std::nullopt;
  }
  return CudaView{t[1].cast<int>(), reinterpret_cast<void*>(t[2].cast<uintptr_t>())};
}

}  // namespace ckptd::py_binding
