// Small POSIX file helpers shared by the writer, reader and shared-memory tier (internal to checkpoint/).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace railyard::ckpt::detail {

std::string errno_text(int e);
void fsync_path(const std::string& path);  // file or directory; throws railyard::Error
void pwrite_all(int fd, const void* data, uint64_t size, uint64_t offset, const std::string& path);
// Reads exactly size bytes at offset; throws railyard::Error ("... is truncated" on short reads).
void pread_all(int fd, void* data, uint64_t size, uint64_t offset, const std::string& path);
// Writes path through a temporary name of its own (path + ".tmp-<pid>-<random>", so two writers of the same file
// never share one) and one rename(2) over path: readers see the old or the new contents, never a mix or nothing.
void write_file_durable(const std::string& path, const std::string& data, bool fsync_file);
// True for a name write_file_durable uses as the temporary of `base` ("latest" -> "latest.tmp-...").
bool is_temp_of(const std::string& name, const std::string& base);

// Swaps two existing paths (files or directories) in one renameat2(RENAME_EXCHANGE): at every instant each name
// holds one of the two. Returns false with errno EINVAL/ENOSYS/ENOTSUP where the file system or kernel cannot
// (e.g. NFS); throws railyard::Error for any other failure.
bool exchange_paths(const std::string& a, const std::string& b);

// An exclusive flock(2) on path (created if missing), released when the object dies or the process exits (also
// by SIGKILL), so a lock never outlives a dead writer.
class FileLock {
 public:
  explicit FileLock(const std::string& path);  // blocks; throws railyard::Error
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  // A shared lock on an existing file or directory (a writer's temporary directory, while it is in use); nullptr
  // where it cannot be taken (the caller goes on without it).
  static std::unique_ptr<FileLock> shared(const std::string& path);
  // True when some process holds a lock on path (a live writer); false when nobody does or it does not exist.
  static bool held(const std::string& path);

 private:
  FileLock() = default;
  int fd_ = -1;
};

// Fault injection for crash tests: when the environment variable RAILYARD_CKPT_CRASH_AT equals `point`, the process
// kills itself with SIGKILL right here (no destructor, no buffered write runs: what a power cut or kill -9 leaves).
// One getenv per call; the points are on the commit path only, not per byte.
void crash_point(const char* point);
void remove_all_quiet(const std::string& path);
bool exists(const std::string& path);
std::string now_iso8601();
std::string random_hex(int bytes);

}  // namespace railyard::ckpt::detail
