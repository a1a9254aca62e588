// Kubeconfig, in-cluster and default configuration.
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>

#include "common/kube/client.h"

namespace railyard::kube {

namespace {

std::string base64_decode(const std::string& in, const std::string& where) {
  static const auto table = [] {
    std::array<int, 256> t{};
    t.fill(-1);
    const std::string chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < chars.size(); ++i) t[static_cast<unsigned char>(chars[i])] = static_cast<int>(i);
    t['-'] = 62;  // URL-safe alphabet, accepted too
    t['_'] = 63;
    return t;
  }();
  std::string out;
  int val = 0, bits = 0;
  for (unsigned char c : in) {
    if (c == '=' || std::isspace(c)) continue;
    int d = table[c];
    if (d < 0) throw ConfigError(where + ": not valid base64 (unexpected character '" + std::string(1, c) + "')");
    val = (val << 6) | d;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((val >> bits) & 0xff);
    }
  }
  return out;
}

std::string resolve(const std::string& p, const std::filesystem::path& dir) {
  std::filesystem::path fp(p);
  if (fp.is_relative()) fp = dir / fp;
  return fp.string();
}

std::string str(const YAML::Node& n, const char* key) {
  if (!n || !n.IsMap() || !n[key]) return "";
  const YAML::Node v = n[key];
  if (!v.IsScalar()) return "";
  return v.as<std::string>();
}

// Finds the entry named `name` in a kubeconfig list (clusters, users, contexts); returns its index or -1.
int find_named(const YAML::Node& list, const std::string& name) {
  if (!list || !list.IsSequence()) return -1;
  for (size_t i = 0; i < list.size(); ++i) {
    if (str(list[i], "name") == name) return static_cast<int>(i);
  }
  return -1;
}

void check_tls_pem(const std::string& pem, const std::string& where) {
  if (pem.find("-----BEGIN") == std::string::npos) {
    throw ConfigError(where + ": not a PEM block (expected '-----BEGIN ...'); check the path or the base64 data");
  }
}

}  // namespace

Config parse_kubeconfig(const std::string& yaml_text, const std::string& path, const std::string& context) {
  const std::string where = "kubeconfig " + path;
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(where + ": malformed YAML at line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsMap()) throw ConfigError(where + ": not a kubeconfig (the top level must be a mapping)");
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";

  std::string ctx_name = context.empty() ? str(root, "current-context") : context;
  if (ctx_name.empty()) {
    throw ConfigError(where + ": current-context is not set; set it or pass a context name");
  }
  int ci = find_named(root["contexts"], ctx_name);
  if (ci < 0) throw ConfigError(where + ": contexts: no context named '" + ctx_name + "'");
  const std::string cpath = "contexts[" + std::to_string(ci) + "].context";
  YAML::Node ctx = root["contexts"][ci]["context"];
  if (!ctx || !ctx.IsMap()) throw ConfigError(where + ": " + cpath + ": missing");
  std::string cluster_name = str(ctx, "cluster");
  std::string user_name = str(ctx, "user");
  if (cluster_name.empty()) throw ConfigError(where + ": " + cpath + ".cluster: not set");

  Config cfg;
  cfg.source = where + " context " + ctx_name;
  if (std::string ns = str(ctx, "namespace"); !ns.empty()) cfg.default_namespace = ns;

  int k = find_named(root["clusters"], cluster_name);
  if (k < 0) throw ConfigError(where + ": clusters: no cluster named '" + cluster_name + "' (used by " + cpath + ")");
  const std::string kpath = "clusters[" + std::to_string(k) + "].cluster";
  YAML::Node cluster = root["clusters"][k]["cluster"];
  if (!cluster || !cluster.IsMap()) throw ConfigError(where + ": " + kpath + ": missing");
  cfg.server = str(cluster, "server");
  if (cfg.server.empty()) throw ConfigError(where + ": " + kpath + ".server: not set");
  if (cfg.server.rfind("https://", 0) != 0) {
    throw ConfigError(where + ": " + kpath + ".server: '" + cfg.server + "' is not an https:// URL (TLS is required)");
  }
  if (str(cluster, "insecure-skip-tls-verify") == "true") {
    throw ConfigError(where + ": " + kpath +
                      ".insecure-skip-tls-verify: not supported; set certificate-authority(-data) instead");
  }
  if (std::string data = str(cluster, "certificate-authority-data"); !data.empty()) {
    cfg.ca_pem = base64_decode(data, where + ": " + kpath + ".certificate-authority-data");
    check_tls_pem(cfg.ca_pem, where + ": " + kpath + ".certificate-authority-data");
  } else if (std::string file = str(cluster, "certificate-authority"); !file.empty()) {
    cfg.ca_pem = read_file(resolve(file, dir), where + ": " + kpath + ".certificate-authority");
    check_tls_pem(cfg.ca_pem, where + ": " + kpath + ".certificate-authority " + resolve(file, dir));
  } else {
    throw ConfigError(where + ": " + kpath +
                      ": no certificate-authority or certificate-authority-data (TLS is always verified)");
  }

  if (!user_name.empty()) {
    int u = find_named(root["users"], user_name);
    if (u < 0) throw ConfigError(where + ": users: no user named '" + user_name + "' (used by " + cpath + ")");
    const std::string upath = "users[" + std::to_string(u) + "].user";
    YAML::Node user = root["users"][u]["user"];
    if (!user || !user.IsMap()) throw ConfigError(where + ": " + upath + ": missing");
    cfg.token = str(user, "token");
    if (std::string tf = str(user, "tokenFile"); !tf.empty()) {
      cfg.token_file = resolve(tf, dir);
      if (cfg.token.empty()) {
        cfg.token = read_file(cfg.token_file, where + ": " + upath + ".tokenFile");
        while (!cfg.token.empty() && std::isspace(static_cast<unsigned char>(cfg.token.back()))) cfg.token.pop_back();
      }
    }
    if (std::string d = str(user, "client-certificate-data"); !d.empty()) {
      cfg.client_cert_pem = base64_decode(d, where + ": " + upath + ".client-certificate-data");
    } else if (std::string f = str(user, "client-certificate"); !f.empty()) {
      cfg.client_cert_pem = read_file(resolve(f, dir), where + ": " + upath + ".client-certificate");
    }
    if (std::string d = str(user, "client-key-data"); !d.empty()) {
      cfg.client_key_pem = base64_decode(d, where + ": " + upath + ".client-key-data");
    } else if (std::string f = str(user, "client-key"); !f.empty()) {
      cfg.client_key_pem = read_file(resolve(f, dir), where + ": " + upath + ".client-key");
    }
    if (cfg.client_cert_pem.empty() != cfg.client_key_pem.empty()) {
      throw ConfigError(where + ": " + upath + ": client-certificate and client-key must be given together");
    }
    if (!cfg.client_cert_pem.empty()) {
      check_tls_pem(cfg.client_cert_pem, where + ": " + upath + ".client-certificate");
      check_tls_pem(cfg.client_key_pem, where + ": " + upath + ".client-key");
    }
    if (cfg.token.empty() && cfg.client_cert_pem.empty()) {
      throw ConfigError(where + ": " + upath + ": no token or client certificate");
    }
  } else {
    throw ConfigError(where + ": " + cpath + ".user: not set (anonymous access is not supported)");
  }
  return cfg;
}

Config load_kubeconfig(const std::string& path, const std::string& context) {
  return parse_kubeconfig(read_file(path, "kubeconfig"), path, context);
}

Config in_cluster_config() {
  const char* host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
  if (host == nullptr || *host == '\0' || port == nullptr || *port == '\0') {
    throw ConfigError("in-cluster config: KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set (not in a pod)");
  }
  const std::string dir = "/var/run/secrets/kubernetes.io/serviceaccount/";
  Config cfg;
  std::string h = host;
  if (h.find(':') != std::string::npos) h = "[" + h + "]";  // IPv6
  cfg.server = "https://" + h + ":" + port;
  cfg.ca_pem = read_file(dir + "ca.crt", "in-cluster CA");
  cfg.token_file = dir + "token";
  cfg.token = read_file(cfg.token_file, "in-cluster service-account token");
  while (!cfg.token.empty() && std::isspace(static_cast<unsigned char>(cfg.token.back()))) cfg.token.pop_back();
  try {
    std::string ns = read_file(dir + "namespace", "in-cluster namespace");
    while (!ns.empty() && std::isspace(static_cast<unsigned char>(ns.back()))) ns.pop_back();
    if (!ns.empty()) cfg.default_namespace = ns;
  } catch (const ConfigError&) {
    // The namespace file is optional; "default" stays.
  }
  cfg.source = "in-cluster service account";
  return cfg;
}

Config default_config() {
  std::vector<std::string> tried;
  if (const char* kc = std::getenv("KUBECONFIG"); kc != nullptr && *kc != '\0') {
    std::string first = kc;
    first = first.substr(0, first.find(':'));  // only the first file of a list is used
    return load_kubeconfig(first);
  }
  tried.push_back("$KUBECONFIG (unset)");
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    std::string p = std::string(home) + "/.kube/config";
    if (std::filesystem::exists(p)) return load_kubeconfig(p);
    tried.push_back(p + " (missing)");
  }
  try {
    return in_cluster_config();
  } catch (const ConfigError& e) {
    tried.push_back(e.what());
  }
  std::string msg = "no Kubernetes configuration found; tried:";
  for (const auto& t : tried) msg += " " + t + ";";
  msg += " set KUBECONFIG to a kubeconfig file";
  throw ConfigError(msg);
}

}  // namespace railyard::kube
