// Test data for integration tests that save and load flat float32 tensors through the C++ client.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ckptd/client.h"

namespace ckptd_it {

// n floats, a repeating ramp starting at `seed` (every tensor of a test distinct).
inline std::vector<float> Pattern(size_t n, float seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = seed + static_cast<float>(i % 100003) * 0.5f;
  return v;
}

// A whole 1-D float32 tensor `item` saved from `data` (which must outlive the shard).
inline ckptd::TensorShard Whole(const std::string& item, const std::vector<float>& data) {
  ckptd::TensorShard t;
  t.item = item;
  t.dtype = ckptd::DType::kFloat32;
  t.global_shape = {data.size()};
  t.region = ckptd::Region::Whole();
  t.data = data.data();
  t.bytes = data.size() * sizeof(float);
  return t;
}

}  // namespace ckptd_it
