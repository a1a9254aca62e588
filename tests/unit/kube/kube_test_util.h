// Shared by the kube tests (tests/unit/kube, tests/e2e/kube): what a test needs to write the data the client reads.
#pragma once

#include <string>

namespace railyard::kube::testing {

// Standard base64 with padding: kubeconfig *-data fields, Secret data, etcd gateway keys (the client only decodes,
// common/kube/client.h base64_decode).
inline std::string b64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  int val = 0, bits = -6;
  for (unsigned char c : in) {
    val = (val << 8) + c;
    bits += 8;
    while (bits >= 0) {
      out.push_back(t[(val >> bits) & 0x3F]);
      bits -= 6;
    }
  }
  if (bits > -6) out.push_back(t[((val << 8) >> (bits + 8)) & 0x3F]);
  while (out.size() % 4) out.push_back('=');
  return out;
}

}  // namespace railyard::kube::testing
