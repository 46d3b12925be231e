// CRC-32C (Castagnoli) for shard blocks and manifest records, plus the per-block checksums that
// let a partial read of a shard be verified. Pure functions, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ckptd {

// Extends `crc` (the crc32c of the bytes before `data`; 0 to start) with n bytes at `data`.
// Uses SSE4.2 when the CPU has it (checked once at run time), a table otherwise.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// The two implementations, exposed so tests cover both whatever the CPU. Crc32cHardware must only
// be called when Crc32cHardwareAvailable().
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc = 0);
uint32_t Crc32cHardware(const void* data, size_t n, uint32_t crc = 0);
bool Crc32cHardwareAvailable();

// LevelDB-style masking, so a crc stored next to the data it covers is not itself a likely crc.
uint32_t MaskCrc(uint32_t crc);
uint32_t UnmaskCrc(uint32_t masked_crc);

// Number of blocks of `block_bytes` in `bytes` bytes (the last one may be short); 0 for 0 bytes.
// block_bytes must be > 0 (a bug otherwise).
uint64_t BlockCount(uint64_t bytes, uint32_t block_bytes);

// One crc32c per block_bytes block of data[0, n) (the last block may be short); empty for n == 0.
std::vector<uint32_t> BlockCrcs(const void* data, uint64_t n, uint32_t block_bytes);
// The same into out[0, BlockCount(n, block_bytes)): three blocks at a time where the CPU has
// crc32c instructions.
void BlockCrcsInto(const void* data, uint64_t n, uint32_t block_bytes, uint32_t* out);

// Copies n bytes from src to dst (not overlapping) and writes one crc32c per block_bytes block of
// them to out[0, BlockCount(n, block_bytes)), as BlockCrcsInto: in one pass over the bytes where
// the CPU has crc32c instructions (each word checksummed as it is stored, non-temporal stores).
void CopyAndBlockCrcs(void* dst, const void* src, uint64_t n, uint32_t block_bytes, uint32_t* out);

// Verifies part of a shard. `data` holds n_bytes of the shard starting at shard byte offset
// first_block * block_bytes; the shard is shard_bytes long and crcs[i] is the crc of its block i.
// n_bytes must cover whole blocks (only the shard's last block may be short).
// INVALID_ARGUMENT if the range is not whole blocks of the shard or crcs has the wrong count;
// DATA_LOSS "<context>: block <i> crc32c mismatch: expected 0x.., actual 0x.." on a mismatch.
absl::Status VerifyBlocks(const void* data, uint64_t first_block, uint64_t n_bytes,
                          uint64_t shard_bytes, std::span<const uint32_t> crcs,
                          uint32_t block_bytes, std::string_view context);

}  // namespace ckptd
