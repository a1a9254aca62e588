// Small POSIX file helpers shared by the writer, reader and shared-memory tier (internal to checkpoint/).
#pragma once

#include <cstdint>
#include <string>

namespace railyard::ckpt::detail {

std::string errno_text(int e);
void fsync_path(const std::string& path);  // file or directory; throws railyard::Error
void pwrite_all(int fd, const void* data, uint64_t size, uint64_t offset, const std::string& path);
// Reads exactly size bytes at offset; throws railyard::Error ("... is truncated" on short reads).
void pread_all(int fd, void* data, uint64_t size, uint64_t offset, const std::string& path);
void write_file_durable(const std::string& path, const std::string& data, bool fsync_file);  // temp+rename
void remove_all_quiet(const std::string& path);
bool exists(const std::string& path);
std::string now_iso8601();
std::string random_hex(int bytes);

}  // namespace railyard::ckpt::detail
