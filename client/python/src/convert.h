// Conversions between Python values and libckptd-client types for the ckptd._ckptd binding:
// errors, dtypes, regions, views of memory and status dicts.
// Called with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckptd/client.h"
#include "ckptd/strided_copy.h"

namespace ckptd::py_binding {

namespace py = pybind11;

// Raises the ckptd._errors class for the status code, with the daemon's message.
[[noreturn]] void Throw(const absl::Status& s);

template <typename T>
T Check(absl::StatusOr<T> v) {
  if (!v.ok()) Throw(v.status());
  return *std::move(v);
}
inline void Check(const absl::Status& s) {
  if (!s.ok()) Throw(s);
}

// "float32", "bfloat16", ... (ckptd::DTypeFromName, the dtype table's names); ValueError otherwise.
DType ParseDType(const std::string& name);
// The one dtype table (ckptd/v1/dtype_table.h) as Python sees it, exported as `_ckptd.DTYPES`:
// a tuple of (name, itemsize, wire value, safetensors name, numpy_native) rows in wire order.
py::tuple DTypeTable();
std::vector<uint64_t> ToU64(const py::handle& seq);
std::vector<int64_t> ToI64(const py::handle& seq);
// ("whole",) | ("box", offsets, lengths) | ("flat", start, count)
Region ParseRegion(const py::handle& h);

// A view of caller memory, parsed from Python: (address, shape, byte strides, itemsize).
// ValueError when shape and strides differ in rank.
StridedView ParseView(const py::handle& h);

// A contiguous CUDA tensor, from ("cuda", device, address) (ckptd/_arrays.py cuda_view); nullopt
// for anything else.
struct CudaView {
  int device = 0;
  void* address = nullptr;
};
std::optional<CudaView> ParseCudaView(const py::handle& h);

// A checkpoint's status as the dict ckptd/_client.py documents.
py::dict InfoDict(const CheckpointInfo& c);
// None → latest, else the step.
std::optional<uint64_t> StepArg(const py::object& step);

}  // namespace ckptd::py_binding
