#include "checkpoint/peer_held.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "checkpoint/fs_util.h"
#include "common/error.h"

namespace railyard::ckpt {
namespace {

constexpr uint64_t kMagic = 0x7065657268656c64ULL;  // "peerheld"

// One fixed-size record, rewritten in place by one pwrite. A reader that catches it half written sees a check word
// that does not match and takes it as "nothing recorded" (one put waits one more step, nothing worse).
struct Record {
  int64_t steps[2];
  uint64_t check;
};

uint64_t check_of(const Record& r) {
  return kMagic ^ static_cast<uint64_t>(r.steps[0]) ^ (static_cast<uint64_t>(r.steps[1]) * 0x9e3779b97f4a7c15ULL);
}

}  // namespace

std::string peer_held_name(const std::string& base) { return base + "-held"; }

void write_peer_held(const std::string& name, const std::vector<int64_t>& steps) {
  std::vector<int64_t> kept;
  for (int64_t s : steps)
    if (s >= 0) kept.push_back(s);
  std::sort(kept.rbegin(), kept.rend());
  Record r{{-1, -1}, 0};
  for (size_t i = 0; i < kept.size() && i < 2; ++i) r.steps[i] = kept[i];
  r.check = check_of(r);
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("shared memory " + name + ": cannot open (" + detail::errno_text(errno) + ")");
  const ssize_t n = ::pwrite(fd, &r, sizeof r, 0);
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof r))
    throw Error("shared memory " + name + ": cannot write (" + detail::errno_text(err) + ")");
}

std::vector<int64_t> read_peer_held(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return {};
  Record r{};
  const ssize_t n = ::pread(fd, &r, sizeof r, 0);
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof r) || r.check != check_of(r)) return {};
  std::vector<int64_t> out;
  for (int64_t s : r.steps)
    if (s >= 0) out.push_back(s);
  return out;
}

}  // namespace railyard::ckpt
