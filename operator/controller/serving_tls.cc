#include "operator/controller/serving_tls.h"

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "common/log.h"

namespace railyard::op {
namespace {

constexpr const char* kLog = "operator";
// Ten years: the CA outlives any job; rotating it is deleting the Secret (docs/hardening.md, "Rendezvous TLS").
constexpr std::chrono::hours kCaValidity{24 * 3650};
// The server certificate's key never leaves the leader's memory and a new one is issued at every start of
// leadership, so it may live as long as the CA it chains to.
constexpr std::chrono::hours kServingValidity = kCaValidity;

std::string data_value(const kube::Json& secret, const char* key) {
  const kube::Json data = secret.value("data", kube::Json::object());
  if (!data.contains(key) || !data[key].is_string()) return "";
  return kube::base64_decode(data[key].get<std::string>());
}

}  // namespace

std::optional<RendezvousTlsMode> rendezvous_tls_mode_from_string(const std::string& s) {
  if (s == "auto") return RendezvousTlsMode::kAuto;
  if (s == "files") return RendezvousTlsMode::kFiles;
  if (s == "off") return RendezvousTlsMode::kOff;
  return std::nullopt;
}

std::vector<std::string> certificate_names(const std::string& advertised_host, const std::string& bind_host,
                                           const std::vector<std::string>& extra) {
  std::vector<std::string> out;
  auto add = [&out](const std::string& n) {
    if (!n.empty() && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  };
  add(advertised_host);
  if (bind_host != "0.0.0.0" && bind_host != "::" && bind_host != "[::]") add(bind_host);
  for (const std::string& n : extra) add(n);
  return out;
}

ServingTls serving_tls_from_secret(kube::Client& client, const std::string& ns, const std::string& name,
                                   const std::vector<std::string>& names) {
  const std::string where = "Secret " + ns + "/" + name + " (--rendezvous-ca-secret)";
  std::optional<kube::Json> secret = client.try_get(kube::resources::secrets, ns, name);
  if (!secret) {
    const tls::CertKey ca = tls::make_ca("railyard-rendezvous-ca", kCaValidity);
    const kube::Json want = {
        {"apiVersion", "v1"},
        {"kind", "Secret"},
        {"type", "Opaque"},
        {"metadata",
         {{"name", name},
          {"namespace", ns},
          {"labels", {{"app.kubernetes.io/name", "railyard"}, {"app.kubernetes.io/component", "rendezvous-ca"}}}}},
        {"stringData", {{kCaCertKey, ca.cert_pem}, {kCaKeyKey, ca.key_pem}}}};
    try {
      secret = client.create(kube::resources::secrets, ns, want);
      log::info(kLog, "created the rendezvous CA", {{"secret", ns + "/" + name}});
    } catch (const kube::AlreadyExists&) {
      secret = client.get(kube::resources::secrets, ns, name);  // another replica was first: use its CA
    } catch (const kube::NotFound& e) {
      throw ConfigError(where + ": cannot create it (" + e.what() + "): create the namespace " + ns +
                        " or name another with --rendezvous-ca-secret NAMESPACE/NAME");
    } catch (const kube::Forbidden& e) {
      throw ConfigError(where + ": cannot create it (" + e.what() +
                        "): grant the operator get on that Secret and create on secrets in " + ns +
                        " (the chart's Role <release>-operator-rendezvous-ca)");
    }
  }
  tls::CertKey ca{data_value(*secret, kCaCertKey), data_value(*secret, kCaKeyKey)};
  if (ca.cert_pem.empty() || ca.key_pem.empty())
    throw ConfigError(where + " has no data." + kCaCertKey + " and data." + kCaKeyKey +
                      ": delete it (kubectl delete secret -n " + ns + " " + name +
                      ") and the operator creates a new CA");
  tls::read_cert(ca.cert_pem, where + " data." + kCaCertKey);
  tls::read_key(ca.key_pem, where + " data." + kCaKeyKey);
  ServingTls out{tls::issue_server_cert(ca, names, kServingValidity), ca.cert_pem};
  if (!tls::usable(out.serving, ca.cert_pem, std::chrono::hours(24)))
    throw ConfigError(where + ": its CA expires within a day or " + kCaKeyKey + " does not match " + kCaCertKey +
                      ": delete the Secret and restart the operator (running pods then restart with the new CA)");
  return out;
}

ServingTls serving_tls_from_dir(const std::string& dir) {
  auto file = [&dir](const char* f) { return read_file(dir + "/" + f, "--rendezvous-tls-dir: file"); };
  ServingTls out{{file("tls.crt"), file("tls.key")}, file("ca.crt")};
  tls::read_cert(out.serving.cert_pem, dir + "/tls.crt");
  tls::read_key(out.serving.key_pem, dir + "/tls.key");
  tls::read_cert(out.ca_pem, dir + "/ca.crt");
  if (!tls::usable(out.serving, out.ca_pem, std::chrono::hours(24)))
    throw ConfigError("--rendezvous-tls-dir " + dir +
                      ": tls.crt is not signed by ca.crt, does not match tls.key, or expires within a day (is the "
                      "cert-manager Certificate issued and its Secret mounted?)");
  return out;
}

}  // namespace railyard::op
