// Streaming atomic file writer (shared by every module that publishes files): data goes to a temp file next to the target, and commit() fsyncs it, renames it
// over the target and fsyncs the directory, so readers see either the old file or the complete new one.
#pragma once

#include <cstddef>
#include <string>

namespace railyard {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);  // throws railyard::Error naming the temp file
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();  // removes the temp file unless committed

  void write(const void* data, size_t bytes);
  void commit();
  size_t bytes_written() const { return written_; }

 private:
  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  size_t written_ = 0;
  bool committed_ = false;
};

// fsync a directory so renames inside it survive a crash; throws railyard::Error.
void fsync_directory(const std::string& dir);

}  // namespace railyard
