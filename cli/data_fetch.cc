#include "cli/data_fetch.h"

#include <httplib.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace railyard::cli {

namespace fs = std::filesystem;

bool is_url(const std::string& s) { return s.rfind("http://", 0) == 0 || s.rfind("https://", 0) == 0; }

void fetch_url(const std::string& url, const std::string& path) {
  // scheme://host[:port] and the rest (path and query), as httplib takes them.
  const size_t host_start = url.find("://") + 3;
  const size_t path_start = url.find('/', host_start);
  const std::string origin = url.substr(0, path_start);
  const std::string target = path_start == std::string::npos ? "/" : url.substr(path_start);
  if (origin.size() <= host_start) throw ConfigError("data prepare: input " + url + ": no host in the URL");
  httplib::Client client(origin);
  client.set_follow_location(true);
  client.set_connection_timeout(10);
  client.set_read_timeout(60);
  client.enable_server_certificate_verification(true);
  for (const char* bundle : {"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"})
    if (fs::exists(bundle)) {
      client.set_ca_cert_path(bundle);
      break;
    }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw ConfigError("data prepare: cannot write " + path + " (fetching " + url + ")");
  int status = 0;
  auto res = client.Get(
      target,
      [&](const httplib::Response& r) {
        status = r.status;
        return r.status == 200;
      },
      [&](const char* data, size_t n) {
        out.write(data, static_cast<std::streamsize>(n));
        return static_cast<bool>(out);
      });
  out.close();
  if (status != 0 && status != 200)
    throw ConfigError("data prepare: input " + url + ": the server answered HTTP " + std::to_string(status) +
                      ": check the URL (spec.initializer.data.sources)");
  if (!res)
    throw ConfigError("data prepare: input " + url + ": the request failed (" + httplib::to_string(res.error()) + ")" +
                      ": check that the host is reachable from the pod (DNS, NetworkPolicy, TLS certificate)");
  if (!out) throw ConfigError("data prepare: writing " + path + " failed (fetching " + url + "): disk full?");
}

std::vector<std::string> expand_directories(const std::vector<std::string>& inputs) {
  std::vector<std::string> out;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (is_url(in) || !fs::is_directory(in, ec)) {
      out.push_back(in);
      continue;
    }
    std::vector<std::string> files;
    for (fs::recursive_directory_iterator it(in, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file(ec)) files.push_back(it->path().string());
    if (ec) throw ConfigError("data prepare: cannot list input directory " + in + ": " + ec.message());
    if (files.empty()) throw ConfigError("data prepare: input directory " + in + " holds no files");
    std::sort(files.begin(), files.end());
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

std::string sha256_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("data prepare: cannot read input " + path);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  char b[3];
  for (unsigned int i = 0; i < len; ++i) {
    std::snprintf(b, sizeof b, "%02x", md[i]);
    hex += b;
  }
  return hex;
}

bool prepared_already(const worker::PrepareOptions& o) {
  const fs::path dir(o.output_dir);
  std::ifstream in(dir / "prepare.json");
  if (!in) return false;
  const nlohmann::json m = nlohmann::json::parse(in, nullptr, false);
  if (!m.is_object() || m.value("tokenizer", "") != o.tokenizer || !m.contains("val_fraction") ||
      !m["val_fraction"].is_number() || m["val_fraction"].get<double>() != o.val_fraction ||
      m.value("shard_tokens", uint64_t{0}) != o.shard_tokens || !m.contains("inputs") || !m["inputs"].is_array() ||
      m["inputs"].size() != o.sha256.size())
    return false;
  for (size_t i = 0; i < o.sha256.size(); ++i)
    if (!m["inputs"][i].is_object() || m["inputs"][i].value("sha256", "") != o.sha256[i]) return false;
  for (const char* split : {"train_shards", "val_shards"}) {
    if (!m.contains(split) || !m[split].is_array()) return false;
    for (const auto& name : m[split])
      if (!name.is_string() || !fs::is_regular_file(dir / name.get<std::string>())) return false;
  }
  return true;
}

}  // namespace railyard::cli
