// Streaming atomic file writer (shared by every module that publishes files): data goes to a temp file next to the
// target, and commit() fsyncs it, renames it over the target and fsyncs the directory (no fsyncs for
// Durability::ProcessCrash), so readers see either the old file or the complete new one.
#pragma once

#include <cstddef>
#include <string>

namespace railyard {

// What commit() guarantees: Durable survives a machine crash (fsync of the file and its directory); ProcessCrash only
// the writer's own crash (temp file + rename, no fsync: the page cache holds it), for state that a machine crash
// makes moot anyway, such as the local node agent's pids and pod addresses, saved once or twice per pod start.
enum class Durability { Durable, ProcessCrash };

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path, Durability d = Durability::Durable);  // throws naming the temp file
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();  // removes the temp file unless committed

  void write(const void* data, size_t bytes);
  void commit();
  size_t bytes_written() const { return written_; }

 private:
  std::string path_;
  std::string tmp_;
  Durability durability_;
  int fd_ = -1;
  size_t written_ = 0;
  bool committed_ = false;
};

// Writes a whole file atomically (temp file in the same directory, fsync, rename, fsync the directory unless
// durability says otherwise); throws Error.
void write_file_atomic(const std::string& path, const std::string& data, Durability durability = Durability::Durable);

// fsync a directory so renames inside it survive a crash; throws railyard::Error.
void fsync_directory(const std::string& dir);

}  // namespace railyard
