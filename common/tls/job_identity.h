// A job's own TLS identity, for the connections between its pods (the bootstrap store of the trainers, the peer
// copies of the in-memory checkpoint tier): docs/hardening.md "Credentials derived from the token".
//
// The operator makes one CA per job (make_job_ca: EC P-256, CN railyard-job/<namespace>/<name>) and keeps it in the
// job's Secret (job-ca.crt, job-ca.key). Each pod's agent issues itself a leaf under it for its pod IP
// (issue_pod_identity: serverAuth and clientAuth) and hands its workers the leaf, the leaf's key and the job CA's
// certificate, never the CA's key. Both ends of a connection present their leaf and trust exactly the job's CA (no
// system roots): a peer of another job, one without a certificate, or one with a publicly signed certificate fails
// the handshake, before a token or a byte of data moves.
#pragma once

#include <openssl/ssl.h>

#include <memory>
#include <string>
#include <vector>

#include "common/tls/pki.h"

namespace railyard::tls {

// The job CA in the job's Secret <job>-rendezvous.
inline constexpr const char* kJobCaCertKey = "job-ca.crt";
inline constexpr const char* kJobCaKeyKey = "job-ca.key";
// The agent's environment (secretKeyRef to those keys).
inline constexpr const char* kJobCaCertEnv = "RAILYARD_JOB_CA";
inline constexpr const char* kJobCaKeyEnv = "RAILYARD_JOB_CA_KEY";
// A worker's environment (set by its agent): the job CA's certificate, the pod's leaf and its key.
inline constexpr const char* kPeerCaEnv = "RAILYARD_PEER_TLS_CA";
inline constexpr const char* kPeerCertEnv = "RAILYARD_PEER_TLS_CERT";
inline constexpr const char* kPeerKeyEnv = "RAILYARD_PEER_TLS_KEY";

struct SslCtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxFree>;

// One pod's identity: the job CA's certificate and the pod's leaf under it, all PEM.
struct PodIdentity {
  std::string ca_pem;
  CertKey leaf;
};

// A new job CA, "railyard-job/<ns>/<name>", valid for ten years (a job's life; it dies with the job's Secret).
CertKey make_job_ca(const std::string& ns, const std::string& name);

// True when `ca` is a readable CA certificate with its key, valid for a day more: what a Secret must hold to be kept.
bool usable_job_ca(const CertKey& ca);

// Reads and checks a job CA; ConfigError naming `where_cert` / `where_key` when one is not PEM or they do not match.
void check_job_ca(const CertKey& ca, const std::string& where_cert, const std::string& where_key);

// This pod's leaf under `job_ca` for `names` (the pod IP), valid for a year.
PodIdentity issue_pod_identity(const CertKey& job_ca, const std::vector<std::string>& names);

// The worker's side: null when none of RAILYARD_PEER_TLS_{CA,CERT,KEY} is set (plain TCP); ConfigError naming the
// variable when only some are set, one is not PEM, or the leaf is not the CA's or not its key's.
std::shared_ptr<const PodIdentity> pod_identity_from_env();

// Checks an identity read from elsewhere; the where_* name the source in the ConfigError.
void check_pod_identity(const PodIdentity& id, const std::string& where_ca, const std::string& where_cert,
                        const std::string& where_key);

// TLS 1.3 contexts presenting id.leaf and trusting only id.ca_pem. The server requires a client certificate; the
// client checks the server's chain but not its host name (peers are dialled by pod IP or MASTER_ADDR; the job CA's
// signature is the proof). ConfigError when the material is unreadable.
SslCtxPtr server_context(const PodIdentity& id);
SslCtxPtr client_context(const PodIdentity& id);

// A new X509_STORE holding only `ca_pem` (for httplib's SSLServer, which takes ownership).
X509_STORE* new_store(const std::string& ca_pem, const std::string& where);

}  // namespace railyard::tls
