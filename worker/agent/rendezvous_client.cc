#include "worker/agent/rendezvous_client.h"

#include <httplib.h>

#include <algorithm>
#include <thread>

#include "common/log.h"

namespace railyard::worker {
namespace {

namespace st = rdzv::status;
using Outcome = RendezvousClient::Outcome;

Outcome outcome_of(const std::string& s) {
  if (s == st::kReady) return Outcome::Ready;
  if (s == st::kWaiting) return Outcome::Waiting;
  if (s == st::kRunning) return Outcome::Running;
  if (s == st::kDone) return Outcome::Done;
  if (s == st::kSuperseded) return Outcome::Superseded;
  if (s == st::kNotMember) return Outcome::NotMember;
  if (s == st::kFenced) return Outcome::Fenced;
  if (s == st::kStarted) return Outcome::Started;
  if (s == st::kTimeout) return Outcome::Timeout;
  if (s == st::kUnknownJob) return Outcome::UnknownJob;
  if (s == st::kClosed) return Outcome::Closed;
  if (s == st::kRecorded) return Outcome::Recorded;
  if (s == st::kDuplicate) return Outcome::Duplicate;
  if (s == st::kStale) return Outcome::Stale;
  throw RendezvousUnavailable("rendezvous service answered an unknown status \"" + s + "\"");
}

}  // namespace

const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::Ready:
      return "ready";
    case Outcome::Waiting:
      return "waiting";
    case Outcome::Running:
      return "running";
    case Outcome::Done:
      return "done";
    case Outcome::Superseded:
      return "superseded";
    case Outcome::NotMember:
      return "not_member";
    case Outcome::Fenced:
      return "fenced";
    case Outcome::Started:
      return "already_started";
    case Outcome::Timeout:
      return "timeout";
    case Outcome::UnknownJob:
      return "unknown_job";
    case Outcome::Closed:
      return "closed";
    case Outcome::Recorded:
      return "recorded";
    case Outcome::Duplicate:
      return "duplicate";
    case Outcome::Stale:
      return "stale";
  }
  return "?";
}

RendezvousClient::RendezvousClient(const std::string& address, std::string token, RendezvousClientOptions options)
    : token_(std::move(token)), options_(options) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    throw ConfigError("RAILYARD_RENDEZVOUS_ADDR \"" + address + "\" must be host:port (e.g. 10.0.0.5:8477)");
  }
  host_ = address.substr(0, colon);
  if (host_.size() > 2 && host_.front() == '[' && host_.back() == ']') host_ = host_.substr(1, host_.size() - 2);
  const std::string port = address.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 || std::stoi(port) < 1 ||
      std::stoi(port) > 65535) {
    throw ConfigError("RAILYARD_RENDEZVOUS_ADDR \"" + address + "\": port must be a number in [1, 65535]");
  }
  port_ = std::stoi(port);
  if (token_.empty()) {
    throw ConfigError("RAILYARD_RENDEZVOUS_TOKEN is empty: set it from the job's Secret <job>-rendezvous (key token)");
  }
  if (!options_.ca_pem.empty())
    ca_ = std::make_shared<const tls::CaFile>(options_.ca_pem,
                                              "RAILYARD_RENDEZVOUS_CA (Secret <job>-rendezvous, key ca.crt)");
}

std::unique_ptr<httplib::ClientImpl> RendezvousClient::connect() const {
  if (!ca_) return std::make_unique<httplib::ClientImpl>(host_, port_);
  auto c = std::make_unique<httplib::SSLClient>(host_, port_);
  c->set_ca_cert_path(ca_->path().c_str());  // exactly this CA, no system roots
  c->enable_server_certificate_verification(true);
  return c;
}

RendezvousClient::Result RendezvousClient::call(const char* path, const nlohmann::json& body, int64_t wait_ms) const {
  const httplib::Headers headers = {{"Authorization", "Bearer " + token_}};
  const std::string payload = body.dump();
  auto backoff = options_.backoff_initial;
  std::string last_error;
  for (int attempt = 1; attempt <= std::max(1, options_.max_attempts); ++attempt) {
    if (attempt > 1) {
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, options_.backoff_max);
    }
    std::unique_ptr<httplib::ClientImpl> cli = connect();
    cli->set_keep_alive(false);
    cli->set_connection_timeout(options_.connect_timeout);
    cli->set_read_timeout(options_.read_timeout + std::chrono::milliseconds(wait_ms));
    cli->set_write_timeout(options_.read_timeout);
    auto res = cli->Post(path, headers, payload, "application/json");
    if (!res && res.error() == httplib::Error::SSLServerVerification) {
      const auto* ssl = static_cast<const httplib::SSLClient*>(cli.get());
      const long v = ssl->get_openssl_verify_result();
      throw RendezvousTlsError(
          "rendezvous service " + host_ + ":" + std::to_string(port_) + " failed TLS verification (" +
          (v != X509_V_OK ? std::string(X509_verify_cert_error_string(v)) : "its certificate does not name " + host_) +
          "): it must present a certificate for that name signed by RAILYARD_RENDEZVOUS_CA (Secret <job>-rendezvous, "
          "key ca.crt; the operator's --rendezvous-tls CA)");
    }
    if (!res) {
      last_error = httplib::to_string(res.error());
      continue;
    }
    nlohmann::json reply = nlohmann::json::parse(res->body, nullptr, false);
    const std::string message = reply.is_object() && reply.contains("error") && reply["error"].is_string()
                                    ? reply["error"].get<std::string>()
                                    : res->body;
    if (res->status >= 500) {
      last_error = "HTTP " + std::to_string(res->status) + ": " + message;
      continue;
    }
    if (res->status == 401 || res->status == 403) {
      throw RendezvousAuthError("rendezvous service refused the token (HTTP " + std::to_string(res->status) +
                                "): " + message);
    }
    if (res->status == 400) throw RendezvousRequestError("rendezvous service refused the request: " + message);
    if (!reply.is_object() || !reply.contains("status") || !reply["status"].is_string()) {
      last_error = "HTTP " + std::to_string(res->status) + " without a JSON status: " + res->body.substr(0, 200);
      continue;
    }
    Result r;
    r.http_status = res->status;
    r.outcome = outcome_of(reply["status"].get<std::string>());
    r.message = message;
    if (reply.contains("generation") && reply["generation"].is_number_integer()) {
      r.generation = reply["generation"].get<int64_t>();
    }
    if (reply.contains("missing") && reply["missing"].is_array()) {
      for (const auto& m : reply["missing"])
        if (m.is_string()) r.missing.push_back(m.get<std::string>());
    }
    r.missing_count = r.missing.size();
    if (reply.contains(rdzv::kMissingCountKey) && reply[rdzv::kMissingCountKey].is_number_unsigned())
      r.missing_count = std::max(r.missing_count, reply[rdzv::kMissingCountKey].get<size_t>());
    if (r.outcome == Outcome::Ready) {
      try {
        r.assignment = rdzv::parse_assignment(reply);
      } catch (const rdzv::ProtocolError& e) {
        throw RendezvousUnavailable(std::string("rendezvous service sent a malformed assignment: ") + e.what());
      }
    }
    return r;
  }
  throw RendezvousUnavailable("rendezvous service " + host_ + ":" + std::to_string(port_) + path +
                              " unreachable after " + std::to_string(options_.max_attempts) +
                              " attempts: " + last_error);
}

RendezvousClient::Result RendezvousClient::join(const rdzv::JoinRequest& request) const {
  return call(rdzv::kJoinPath, rdzv::to_json(request), request.wait_ms);
}

RendezvousClient::Result RendezvousClient::status(const rdzv::StatusRequest& request) const {
  return call(rdzv::kStatusPath, rdzv::to_json(request), request.wait_ms);
}

RendezvousClient::Result RendezvousClient::report_exit(const rdzv::ExitReport& report) const {
  return call(rdzv::kExitPath, rdzv::to_json(report), 0);
}

RendezvousClient::Result RendezvousClient::report_progress(const rdzv::ProgressReport& report) const {
  return call(rdzv::kProgressPath, rdzv::to_json(report), 0);
}

}  // namespace railyard::worker
