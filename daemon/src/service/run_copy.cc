#include "service/run_copy.h"

namespace ckptd {

const v1::ItemEntry* ItemOfShard(const Manifest& m, const v1::ShardEntry* s) {
  for (const v1::ItemEntry& item : m.items) {
    for (const v1::ShardEntry& e : item.shards()) {
      if (&e == s) return &item;
    }
  }
  return nullptr;
}

uint64_t CheckedBytes(const BlockCheck& chk, uint32_t block) {
  return std::min<uint64_t>(chk.end_block * block, chk.shard->length()) - chk.first_block * block;
}

absl::Status CopyToDevice(const Manifest& m, const LoadDests& dst,
                          const std::vector<DeviceCopy>& to_device) {
  if (to_device.empty()) return absl::OkStatus();
  CKPTD_CHECK(dst.gpu != nullptr);  // ResolveDest hands out device destinations only with one
  return Annotate(dst.gpu->CopyToDevice(to_device),
                  absl::StrCat("checkpoint ", m.header.job(), "/", m.header.step(),
                               ": copying into GPU memory"));
}

}  // namespace ckptd
