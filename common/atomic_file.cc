#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace railyard {

namespace {
std::string errno_text(int e) { return std::strerror(e); }
}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path, Durability d) : path_(std::move(path)), durability_(d) {
  // pid + counter: several writers in one process (prepare writes train and val) never share a temp name.
  static std::atomic<uint64_t> counter{0};
  tmp_ = path_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot create " + tmp_ + ": " + errno_text(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot write " + tmp_ + ": " + errno_text(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  const bool durable = durability_ == Durability::Durable;
  if (durable && ::fsync(fd_) != 0) throw Error("cannot flush " + tmp_ + ": " + errno_text(errno));
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) throw Error("cannot close " + tmp_ + ": " + errno_text(errno));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0)
    throw Error("cannot rename " + tmp_ + " to " + path_ + ": " + errno_text(errno));
  committed_ = true;
  if (!durable) return;
  std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  fsync_directory(parent.empty() ? "." : parent.string());
}

void write_file_atomic(const std::string& path, const std::string& data, Durability durability) {
  AtomicFileWriter w(path, durability);
  w.write(data.data(), data.size());
  w.commit();
}

void fsync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open directory " + dir + ": " + errno_text(errno));
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (rc != 0) throw Error("cannot fsync directory " + dir + ": " + errno_text(e));
}

}  // namespace railyard
