// A CA bundle that cpp-httplib's clients trust exclusively. httplib loads CAs only from a path (a CA store handed
// to it is mixed with the system roots), so the bundle lives in an anonymous memory file reached as
// /proc/self/fd/N: nothing on disk, nothing left behind after a crash, works on a read-only root file system.
#pragma once

#include <string>

namespace railyard::tls {

class CaFile {
 public:
  // Validates `pem` (at least one certificate) and throws ConfigError naming `where` when it is not PEM.
  CaFile(const std::string& pem, const std::string& where);
  ~CaFile();
  CaFile(const CaFile&) = delete;
  CaFile& operator=(const CaFile&) = delete;

  const std::string& path() const { return path_; }  // for httplib's set_ca_cert_path

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace railyard::tls
