#include "common/tls/ca_file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "common/tls/pki.h"

namespace railyard::tls {

CaFile::CaFile(const std::string& pem, const std::string& where) {
  read_cert(pem, where);  // throws ConfigError naming `where` when the bundle is not PEM
  fd_ = ::memfd_create("railyard-ca", MFD_CLOEXEC);
  if (fd_ < 0) throw Error("cannot create an in-memory CA file: " + std::string(std::strerror(errno)));
  const char* p = pem.data();
  size_t left = pem.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd_);
      throw Error("cannot write the in-memory CA file: " + why);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

CaFile::~CaFile() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace railyard::tls
