#include "checkpoint/fs_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>  // renameat2
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

#include "common/error.h"
#include "common/pod_env.h"

namespace railyard::ckpt::detail {

std::string errno_text(int e) { return std::strerror(e); }

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open " + path + " to fsync: " + errno_text(errno));
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) throw Error("fsync " + path + ": " + errno_text(e));
}

void pwrite_all(int fd, const void* data, uint64_t size, uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, uint64_t{1} << 30));
    ssize_t n = ::pwrite(fd, p, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("write " + path + ": " + errno_text(errno));
    }
    if (n == 0) throw Error("write " + path + ": no progress");
    p += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

void pread_all(int fd, void* data, uint64_t size, uint64_t offset, const std::string& path) {
  auto* p = static_cast<unsigned char*>(data);
  while (size > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(size, uint64_t{1} << 30));
    ssize_t n = ::pread(fd, p, chunk, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("read " + path + ": " + errno_text(errno));
    }
    if (n == 0) throw Error(path + " is truncated (ends before byte " + std::to_string(offset + size) + ")");
    p += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

void write_file_durable(const std::string& path, const std::string& data, bool fsync_file) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + random_hex(4);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot create " + tmp + ": " + errno_text(errno));
  try {
    pwrite_all(fd, data.data(), data.size(), 0, tmp);
    if (fsync_file && ::fsync(fd) != 0) throw Error("fsync " + tmp + ": " + errno_text(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw Error("close " + tmp + ": " + errno_text(e));
  }
  // Crash tests name the file: "before-rename:latest", "before-rename:manifest.json", ...
  crash_point(("before-rename:" + path.substr(path.find_last_of('/') + 1)).c_str());
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw Error("rename " + tmp + " to " + path + ": " + errno_text(e));
  }
}

bool is_temp_of(const std::string& name, const std::string& base) {
  // The pre-issue-40 name ("latest.tmp", shared by every writer) counts too, so its leftovers are cleaned.
  return name == base + ".tmp" || name.rfind(base + ".tmp-", 0) == 0;
}

bool exchange_paths(const std::string& a, const std::string& b) {
  if (std::getenv(pod_env::kCkptNoExchange) != nullptr) {  // tests: the path of file systems without it
    errno = EINVAL;
    return false;
  }
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return true;
  const int e = errno;
  if (e == EINVAL || e == ENOSYS || e == ENOTSUP) return false;
  throw Error("exchange " + a + " and " + b + ": " + errno_text(e));
}

FileLock::FileLock(const std::string& path) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open lock " + path + ": " + errno_text(errno));
  while (::flock(fd_, LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int e = errno;
    ::close(fd_);
    throw Error("flock " + path + ": " + errno_text(e));
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the only descriptor releases the flock
}

std::unique_ptr<FileLock> FileLock::shared(const std::string& path) {
  std::unique_ptr<FileLock> l(new FileLock());
  l->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (l->fd_ < 0) return nullptr;
  while (::flock(l->fd_, LOCK_SH) != 0) {
    if (errno == EINTR) continue;
    return nullptr;  // a file system without flock on directories: the save goes on without the mark
  }
  return l;
}

bool FileLock::held(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  // A lock of our own on a new descriptor, dropped by close. Only "would block" means held: a file system that
  // cannot lock at all reads as free (the cleanup then works as it did before the lock existed).
  const bool busy = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return busy;
}

void crash_point(const char* point) {
  const char* want = std::getenv(pod_env::kCkptCrashAt);
  if (want != nullptr && std::strcmp(want, point) == 0) ::kill(::getpid(), SIGKILL);
}

void remove_all_quiet(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string now_iso8601() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string random_hex(int bytes) {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < bytes; ++i) {
    unsigned v = rd() & 0xFFu;
    s += hex[v >> 4];
    s += hex[v & 15u];
  }
  return s;
}

}  // namespace railyard::ckpt::detail
