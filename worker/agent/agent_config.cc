#include "worker/agent/agent_config.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/error.h"

namespace railyard::worker {

std::shared_ptr<const tls::PodIdentity> pod_identity(const std::string& pod_ip) {
  const tls::CertKey ca{env_or(tls::kJobCaCertEnv, ""), env_or(tls::kJobCaKeyEnv, "")};
  if (ca.cert_pem.empty() && ca.key_pem.empty()) return nullptr;
  const std::string from =
      std::string(" (secretKeyRef <job>-rendezvous/") + tls::kJobCaCertKey + ", " + tls::kJobCaKeyKey + ")";
  if (ca.cert_pem.empty() || ca.key_pem.empty())
    throw ConfigError(std::string(tls::kJobCaCertEnv) + " and " + tls::kJobCaKeyEnv + " go together" + from +
                      ": only one is set");
  tls::check_job_ca(ca, tls::kJobCaCertEnv + from, tls::kJobCaKeyEnv + from);
  return std::make_shared<const tls::PodIdentity>(tls::issue_pod_identity(ca, {pod_ip}));
}

namespace {

// Hex HMAC-SHA256 keyed by the job's rendezvous token: a credential for one purpose, from which the token cannot be
// recovered, so only the derived value ever leaves the agent.
std::string derive_token(const std::string& rendezvous_token, const std::string& msg, const char* what) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), rendezvous_token.data(), static_cast<int>(rendezvous_token.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len) == nullptr) {
    throw Error(std::string("agent: HMAC-SHA256 of the ") + what + " failed (OpenSSL)");
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out.push_back(hex[mac[i] >> 4]);
    out.push_back(hex[mac[i] & 15]);
  }
  return out;
}

}  // namespace

std::string store_token(const std::string& rendezvous_token, const std::string& ns, const std::string& job,
                        int64_t generation) {
  return derive_token(rendezvous_token,
                      "railyard bootstrap store\n" + ns + "/" + job + "\n" + std::to_string(generation),
                      "bootstrap store token");
}

std::string peer_copy_token(const std::string& rendezvous_token, const std::string& ns, const std::string& job) {
  return derive_token(rendezvous_token, "railyard peer copy\n" + ns + "/" + job, "peer copy token");
}

}  // namespace railyard::worker
