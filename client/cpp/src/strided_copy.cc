#include "ckptd/strided_copy.h"

#include <cstring>

#include "client_core.h"

namespace ckptd {
namespace {

// Drops size-1 dimensions and merges dimensions that are contiguous with the next one, so that
// the inner loop is one memcpy as long as possible.
StridedView Collapse(const StridedView& in) {
  StridedView out;
  out.data = in.data;
  out.itemsize = in.itemsize;
  for (size_t i = 0; i < in.shape.size(); ++i) {
    if (in.shape[i] == 1) continue;
    if (!out.shape.empty() && out.strides.back() == in.strides[i] * in.shape[i]) {
      out.shape.back() *= in.shape[i];
      out.strides.back() = in.strides[i];
      continue;
    }
    out.shape.push_back(in.shape[i]);
    out.strides.push_back(in.strides[i]);
  }
  return out;
}

template <bool kGather>
void CopyRuns(const StridedView& raw, uint8_t* flat) {
  if (raw.Elements() == 0) return;
  StridedView v = Collapse(raw);
  auto* base = reinterpret_cast<uint8_t*>(v.data);
  if (v.shape.empty()) {  // one element
    kGather ? std::memcpy(flat, base, v.itemsize) : std::memcpy(base, flat, v.itemsize);
    return;
  }
  const size_t dims = v.shape.size();
  const bool inner_contiguous = v.strides.back() == v.itemsize;
  // With a contiguous innermost dimension each run is one memcpy; otherwise element by element.
  const int64_t run_elems = inner_contiguous ? v.shape.back() : 1;
  const size_t outer_dims = inner_contiguous ? dims - 1 : dims;
  const int64_t run_bytes = run_elems * v.itemsize;
  std::vector<int64_t> index(outer_dims, 0);
  uint8_t* p = base;
  for (;;) {
    kGather ? std::memcpy(flat, p, run_bytes) : std::memcpy(p, flat, run_bytes);
    flat += run_bytes;
    // Advance the odometer over the outer dimensions.
    size_t d = outer_dims;
    while (d > 0) {
      --d;
      if (++index[d] < v.shape[d]) {
        p += v.strides[d];
        break;
      }
      p -= v.strides[d] * (v.shape[d] - 1);
      index[d] = 0;
      if (d == 0) return;
    }
    if (outer_dims == 0) return;
  }
}

}  // namespace

int64_t StridedView::Elements() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool StridedView::Contiguous() const {
  int64_t expected = itemsize;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

void Gather(const StridedView& view, void* dst) {
  CopyRuns<true>(view, static_cast<uint8_t*>(dst));
  internal::CountCopy(static_cast<uint64_t>(view.Bytes()), /*is_load=*/false);
}

void Scatter(const void* src, const StridedView& view) {
  CopyRuns<false>(view, const_cast<uint8_t*>(static_cast<const uint8_t*>(src)));
  internal::CountCopy(static_cast<uint64_t>(view.Bytes()), /*is_load=*/true);
}

}  // namespace ckptd
