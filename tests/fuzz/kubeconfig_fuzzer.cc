// Kubeconfig parsing (common/kube/config.cc): YAML from the user's disk. Anything wrong is a ConfigError (a
// railyard::Error) naming the file and field; any other exception or a crash is a finding.
#include <cstdint>

#include "common/error.h"
#include "common/kube/client.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Relative file references (certificate-authority: ca.crt) resolve against this directory.
  static const std::string path = railyard::fuzz::scratch_dir() + "/kubeconfig";
  try {
    railyard::kube::Config cfg = railyard::kube::parse_kubeconfig(railyard::fuzz::as_string(data, size), path);
    if (cfg.server.empty()) __builtin_trap();  // an accepted config always names a server
  } catch (const railyard::Error&) {
  }
  return 0;
}
