// The agent's side of the rendezvous protocol (docs/rendezvous.md): one HTTP call per method, each with a
// connect/read timeout and bounded retries with exponential backoff for transport errors and 5xx.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/rendezvous_protocol.h"
#include "common/tls/ca_file.h"

namespace httplib {
class ClientImpl;
}

namespace railyard::worker {

// 401/403: the token is missing or belongs to another job. Retrying will not help.
class RendezvousAuthError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};
// 400: the service refused a field of the request (message names it).
class RendezvousRequestError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};
// TLS: the service's certificate is not signed by the CA the pod was given, or does not name the address dialled.
// Retrying will not help (the pod needs the operator's current CA; a restart gives it one).
class RendezvousTlsError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};
// The service could not be reached (or kept answering 5xx) within the attempts allowed.
class RendezvousUnavailable : public Error {
 public:
  using Error::Error;
};

struct RendezvousClientOptions {
  std::chrono::milliseconds connect_timeout{3000};
  std::chrono::milliseconds read_timeout{5000};  // added to a long-poll's wait_ms
  int max_attempts = 4;
  std::chrono::milliseconds backoff_initial{200};
  std::chrono::milliseconds backoff_max{3000};
  // PEM bundle of the CA that signed the service's certificate (RAILYARD_RENDEZVOUS_CA). Set: every call is HTTPS,
  // verified against exactly this CA and the host of the address. Empty: plain HTTP (--rendezvous-tls off).
  std::string ca_pem;
};

class RendezvousClient {
 public:
  // address is "host:port" (RAILYARD_RENDEZVOUS_ADDR); throws ConfigError naming it when malformed.
  RendezvousClient(const std::string& address, std::string token, RendezvousClientOptions options = {});

  enum class Outcome {
    Ready,       // 200 join: assignment is set
    Waiting,     // 202 join / status: world incomplete (missing is set for join)
    Running,     // status: generation current and started
    Done,        // status: every rank of the generation exited 0
    Superseded,  // a newer generation exists (generation is set)
    NotMember,   // 409 join: this pod is not in the generation
    Fenced,      // 409 join / status: another pod (UID) holds this pod's name: stop for good
    Started,     // 409 join: the generation started without this agent
    Timeout,     // 408 join: message names the missing pods
    UnknownJob,  // 404: the service does not know the job (operator restarting?)
    Closed,      // 410 / status closed
    Recorded,    // exit/progress accepted
    Duplicate,   // exit already recorded
    Stale,       // exit/progress for an older generation
  };
  struct Result {
    Outcome outcome = Outcome::Waiting;
    int http_status = 0;
    int64_t generation = 0;  // the service's current generation, when it said
    std::string message;
    std::vector<std::string> missing;  // the first rdzv::kMaxPodsNamed missing pods
    size_t missing_count = 0;          // how many are missing in all
    rdzv::Assignment assignment;
  };

  Result join(const rdzv::JoinRequest& request) const;
  Result status(const rdzv::StatusRequest& request) const;
  Result report_exit(const rdzv::ExitReport& report) const;
  Result report_progress(const rdzv::ProgressReport& report) const;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  bool tls() const { return ca_ != nullptr; }

 private:
  Result call(const char* path, const nlohmann::json& body, int64_t wait_ms) const;
  std::unique_ptr<httplib::ClientImpl> connect() const;  // HTTPS when ca_ is set

  std::string host_;
  int port_ = 0;
  std::string token_;
  RendezvousClientOptions options_;
  std::shared_ptr<const tls::CaFile> ca_;  // set when options_.ca_pem is
};

const char* to_string(RendezvousClient::Outcome outcome);

}  // namespace railyard::worker
