// EncodeManifest / DecodeManifest: the record framing of the manifest file. ValidateManifest is
// in manifest_validate.cc.
#include "format/manifest.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "ckptd/status.h"
#include "common/limits.h"
#include "format/crc32c.h"
#include "format/text.h"

namespace ckptd {
namespace {

void PutLe32(uint32_t v, char* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetLe32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

// Splits items into segments of at most kManifestSegmentBytesTarget serialized bytes each
// (an item bigger than that alone gets its own segment).
absl::StatusOr<std::vector<v1::ManifestSegment>> SplitSegments(std::vector<v1::ItemEntry> items) {
  std::vector<v1::ManifestSegment> segments;
  uint64_t segment_bytes = 0;
  for (v1::ItemEntry& item : items) {
    // Field tag + length varint of the embedded message: at most 1 + 10 bytes.
    uint64_t item_bytes = item.ByteSizeLong() + 11;
    if (item_bytes > limits::kManifestRecordBytesMax) {
      return absl::InvalidArgumentError(
          absl::StrFormat("item \"%s\" needs %d manifest bytes; the limit is %d",
                          EscapeName(item.name()), item_bytes, limits::kManifestRecordBytesMax));
    }
    if (segments.empty() || segment_bytes + item_bytes > limits::kManifestSegmentBytesTarget) {
      if (segments.size() == limits::kManifestSegmentsMax) {
        return absl::InvalidArgumentError(
            absl::StrFormat("manifest needs more than %d segments", limits::kManifestSegmentsMax));
      }
      segments.emplace_back();
      segment_bytes = 0;
    }
    segment_bytes += item_bytes;
    *segments.back().add_items() = std::move(item);
  }
  return segments;
}

absl::Status DataLoss(std::string_view context, std::string_view what) {
  return absl::DataLossError(absl::StrFormat("manifest %s: %s", context, what));
}

// Reads record `index` at *pos; advances *pos past it.
absl::StatusOr<std::string_view> ReadRecord(std::string_view bytes, size_t* pos, uint64_t index,
                                            std::string_view context) {
  if (bytes.size() - *pos < kManifestRecordHeaderBytes) {
    return DataLoss(
        context, absl::StrFormat("record %d is truncated (file of %d bytes)", index, bytes.size()));
  }
  uint32_t len = GetLe32(bytes.data() + *pos);
  uint32_t masked_crc = GetLe32(bytes.data() + *pos + 4);
  if (len > limits::kManifestRecordBytesMax) {
    return DataLoss(context, absl::StrFormat("record %d claims %d bytes; the limit is %d", index,
                                             len, limits::kManifestRecordBytesMax));
  }
  size_t start = *pos + kManifestRecordHeaderBytes;
  if (bytes.size() - start < len) {
    return DataLoss(context, absl::StrFormat("record %d is truncated: %d bytes of %d", index,
                                             bytes.size() - start, len));
  }
  std::string_view payload = bytes.substr(start, len);
  if (Crc32c(payload.data(), payload.size()) != UnmaskCrc(masked_crc)) {
    return DataLoss(context, absl::StrFormat("record %d checksum mismatch", index));
  }
  *pos = start + len;
  return payload;
}

absl::StatusOr<v1::ManifestHeader> ReadHeader(std::string_view bytes, size_t* pos,
                                              std::string_view context) {
  CKPTD_ASSIGN_OR_RETURN(std::string_view payload, ReadRecord(bytes, pos, 0, context));
  v1::ManifestHeader header;
  if (!header.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return DataLoss(context, "header record does not parse");
  }
  if (header.format_version() != kManifestFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrFormat("manifest %s has format version %d; this build reads version %d", context,
                        header.format_version(), kManifestFormatVersion));
  }
  if (header.segment_count() > limits::kManifestSegmentsMax ||
      header.item_count() > limits::kItemsPerCheckpointMax) {
    return DataLoss(context, absl::StrFormat("header claims %d segments and %d items",
                                             header.segment_count(), header.item_count()));
  }
  return header;
}

}  // namespace

void AppendManifestRecord(std::string_view payload, std::string* out) {
  char head[kManifestRecordHeaderBytes];
  PutLe32(static_cast<uint32_t>(payload.size()), head);
  PutLe32(MaskCrc(Crc32c(payload.data(), payload.size())), head + 4);
  out->append(head, sizeof(head));
  out->append(payload.data(), payload.size());
}

absl::StatusOr<std::string> EncodeManifest(Manifest manifest) {
  manifest.header.set_format_version(kManifestFormatVersion);
  manifest.header.set_item_count(manifest.items.size());
  CKPTD_RETURN_IF_ERROR(ValidateManifest(manifest));
  CKPTD_ASSIGN_OR_RETURN(std::vector<v1::ManifestSegment> segments,
                         SplitSegments(std::move(manifest.items)));
  manifest.header.set_segment_count(segments.size());
  std::string out(kManifestMagic, sizeof(kManifestMagic));
  std::string payload;
  if (!manifest.header.SerializeToString(&payload) ||
      payload.size() > limits::kManifestRecordBytesMax) {
    return absl::InvalidArgumentError(
        absl::StrFormat("manifest header of %d bytes does not serialize within %d bytes",
                        manifest.header.ByteSizeLong(), limits::kManifestRecordBytesMax));
  }
  AppendManifestRecord(payload, &out);
  for (const v1::ManifestSegment& segment : segments) {
    payload.clear();
    CKPTD_CHECK(segment.SerializeToString(&payload));
    AppendManifestRecord(payload, &out);
  }
  return out;
}

absl::StatusOr<Manifest> DecodeManifest(std::string_view bytes, std::string_view context) {
  if (bytes.size() < sizeof(kManifestMagic) ||
      std::memcmp(bytes.data(), kManifestMagic, sizeof(kManifestMagic)) != 0) {
    return DataLoss(context, "bad magic (not a ckptd manifest)");
  }
  size_t pos = sizeof(kManifestMagic);
  Manifest manifest;
  CKPTD_ASSIGN_OR_RETURN(manifest.header, ReadHeader(bytes, &pos, context));
  // Bounded: the count is not trusted until the manifest validates.
  manifest.items.reserve(std::min<uint64_t>(manifest.header.item_count(), 1 << 16));
  for (uint64_t i = 0; i < manifest.header.segment_count(); ++i) {
    CKPTD_ASSIGN_OR_RETURN(std::string_view payload, ReadRecord(bytes, &pos, i + 1, context));
    v1::ManifestSegment segment;
    if (!segment.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
      return DataLoss(context, absl::StrFormat("record %d does not parse", i + 1));
    }
    for (v1::ItemEntry& item : *segment.mutable_items()) manifest.items.push_back(std::move(item));
  }
  if (pos != bytes.size()) {
    return DataLoss(context, absl::StrFormat("%d trailing bytes after %d segments",
                                             bytes.size() - pos, manifest.header.segment_count()));
  }
  absl::Status valid = ValidateManifest(manifest);
  if (!valid.ok()) return DataLoss(context, std::string(valid.message()));
  return manifest;
}

const v1::ItemEntry* FindItem(const Manifest& manifest, std::string_view name) {
  auto it = std::lower_bound(
      manifest.items.begin(), manifest.items.end(), name,
      [](const v1::ItemEntry& item, std::string_view n) { return item.name() < n; });
  if (it == manifest.items.end() || it->name() != name) return nullptr;
  return &*it;
}

}  // namespace ckptd
