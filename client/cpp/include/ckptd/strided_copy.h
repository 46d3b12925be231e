// Part of libckptd-client. Gather/scatter between a caller's strided array and a contiguous
// row-major buffer in daemon memory: the one copy of a save (strided source -> arena buffer) or of
// a load into a strided destination, for callers that hand the library arrays of any layout (the
// Python binding). Counted in Client::copy_stats() with the library's own copies: one set of
// counters per process. Pure code, thread-safe, no RPC.
#pragma once

#include <cstdint>
#include <vector>

namespace ckptd {

// A strided view: `data` is the address of element [0,...,0]; strides are in bytes and may be
// negative (numpy) or zero (broadcast).
struct StridedView {
  uintptr_t data = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int64_t itemsize = 1;

  int64_t Elements() const;
  int64_t Bytes() const { return Elements() * itemsize; }
  // Row-major contiguous (size-1 dims ignored).
  bool Contiguous() const;
};

// Copies the view's elements, in row-major order, to `dst` (view.Bytes() bytes): a save's copy.
void Gather(const StridedView& view, void* dst);
// Copies view.Bytes() row-major bytes from `src` into the view's elements: a load's copy.
void Scatter(const void* src, const StridedView& view);

}  // namespace ckptd
