// The Hugging Face safetensors format, as pure code (no I/O): dtype names, JSON strings, and the
// plan of an export — which tensors go into which file, each file's header bytes and size.
//
// A safetensors file is: an 8-byte little-endian header length H; H bytes of a JSON object
// {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// padded with spaces to a multiple of 8; then the tensors' row-major little-endian bytes, back to
// back, [b, e) counted from the end of the header. The reader (the `safetensors` library) wants
// the offsets to tile the data exactly, with no gap and nothing after the last tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ckptd/client.h"

namespace ckptctl::safetensors {

// The safetensors reader refuses headers over 100 MB; files are closed well before that.
inline constexpr uint64_t kHeaderBytesMax = 64ull << 20;
// "model-%05d-of-%05d": past this the names would change width.
inline constexpr uint64_t kFilesMax = 99999;
// Hugging Face's default max_shard_size ("5GB" there; binary here).
inline constexpr uint64_t kMaxFileBytesDefault = 5ull << 30;
// Room for the header of a file with one tensor: a smaller limit could never be met.
inline constexpr uint64_t kMaxFileBytesMin = 4096;

// "F32", "BF16", "F8_E4M3", ...
absl::StatusOr<std::string> SafetensorsDType(ckptd::DType dtype);

// INVALID_ARGUMENT naming `what` and the byte offset when `s` is not valid UTF-8 (JSON, and so
// the safetensors header, can only hold UTF-8).
absl::Status ValidateUtf8(const std::string& s, const std::string& what);

// Parses a byte size: a positive integer with an optional unit, B, KB/MB/GB/TB (powers of 1000,
// as Hugging Face's max_shard_size) or KiB/MiB/GiB/TiB (powers of 1024); "5GiB", "500MB", "1000".
// INVALID_ARGUMENT for anything else, zero, or an overflow.
absl::StatusOr<uint64_t> ParseByteSize(const std::string& text);

struct Tensor {
  std::string name;
  ckptd::DType dtype = ckptd::DType::kFloat32;
  std::vector<uint64_t> shape;
  uint64_t bytes = 0;  // numel * dtype size
};

struct TensorPlacement {
  size_t tensor = 0;        // index into the tensors given to Plan()
  uint64_t data_begin = 0;  // offsets from the end of the header
  uint64_t data_end = 0;
};

struct FilePlan {
  std::string name;                      // "model-00001-of-00003.safetensors"
  std::vector<TensorPlacement> tensors;  // in name order, data back to back
  std::string header;                    // 8-byte length + padded JSON, written first
  uint64_t data_bytes = 0;
  uint64_t file_bytes() const { return header.size() + data_bytes; }
};

// Packs `tensors` in name order into files of at most `max_file_bytes` each (header included),
// greedily; a tensor that cannot fit in a file of its own at that limit gets a file of its own.
// One file is named "model.safetensors", several "model-%05d-of-%05d.safetensors" (Hugging
// Face's names). `metadata` goes into every header's "__metadata__" (it should hold
// "format": "pt"). INVALID_ARGUMENT for an empty list, duplicate names, a tensor named
// "__metadata__", non-UTF-8 names or metadata, a size that disagrees with dtype and shape,
// max_file_bytes below kMaxFileBytesMin, or more than kFilesMax files.
absl::StatusOr<std::vector<FilePlan>> Plan(const std::vector<Tensor>& tensors,
                                           uint64_t max_file_bytes,
                                           const std::map<std::string, std::string>& metadata);

// model.safetensors.index.json: {"metadata": {"total_size": N}, "weight_map": {name: file}},
// N = the tensors' data bytes (headers not counted, as Hugging Face does).
std::string IndexJson(const std::vector<FilePlan>& files, const std::vector<Tensor>& tensors);

}  // namespace ckptctl::safetensors
