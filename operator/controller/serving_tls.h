// Where the rendezvous service's TLS comes from (--rendezvous-tls): the operator's own CA kept in a Secret
// (auto, the default), a mounted cert-manager Secret (files), or nothing (off: plain HTTP). docs/hardening.md.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/kube/client.h"
#include "common/tls/pki.h"

namespace railyard::op {

enum class RendezvousTlsMode { kAuto, kFiles, kOff };
std::optional<RendezvousTlsMode> rendezvous_tls_mode_from_string(const std::string& s);

// Keys of the CA Secret (auto). Deliberately not kubernetes.io/tls: nothing else should mistake the CA for a
// serving certificate.
inline constexpr const char* kCaCertKey = "ca.crt";
inline constexpr const char* kCaKeyKey = "ca.key";

struct ServingTls {
  tls::CertKey serving;  // what the rendezvous service presents
  std::string ca_pem;    // what the pods trust (copied into each job's Secret <job>-rendezvous, key ca.crt)
};

// The names the server certificate carries: the host of the address pods dial (--rendezvous-addr, or the bound
// one), the bind host unless a wildcard, then `extra` (--rendezvous-tls-names); no duplicates.
std::vector<std::string> certificate_names(const std::string& advertised_host, const std::string& bind_host,
                                           const std::vector<std::string>& extra);

// auto: reads the CA from Secret ns/name, creating it when missing (the first replica to get there wins; the
// others read its CA), and issues a server certificate for `names` with a fresh key that never leaves memory.
// A Secret without readable ca.crt/ca.key is a ConfigError naming it and the fix (delete it).
ServingTls serving_tls_from_secret(kube::Client& client, const std::string& ns, const std::string& name,
                                   const std::vector<std::string>& names);

// files: dir/tls.crt, dir/tls.key and dir/ca.crt (a cert-manager Certificate's Secret, mounted). ConfigError names
// the file when one is missing or unreadable, or when tls.crt is not signed by ca.crt or not usable for a day more.
ServingTls serving_tls_from_dir(const std::string& dir);

}  // namespace railyard::op
