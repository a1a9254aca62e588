// CRC32C (Castagnoli, the iSCSI/ext4 polynomial 0x1EDC6F41): every shard slice and the manifest carry one.
#pragma once

#include <cstddef>
#include <cstdint>

namespace railyard::ckpt {

// Extends `crc` (the CRC of the bytes before) over data; crc32c(b, crc32c(a)) == crc32c(a+b).
// Uses the SSE4.2 crc32 instruction when the CPU has it, else slicing-by-8 tables.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// The portable path, always available (tests compare both).
uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc = 0);

// True when crc32c() runs on the SSE4.2 instruction.
bool crc32c_hardware();

}  // namespace railyard::ckpt
