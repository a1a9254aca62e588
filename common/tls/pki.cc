#include "common/tls/pki.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include <ctime>

#include "common/error.h"

namespace railyard::tls {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;

[[noreturn]] void fail(const std::string& what) { throw Error(what + ": " + openssl_error()); }

PkeyPtr new_key() {
  PkeyPtr k(EVP_EC_gen("P-256"));
  if (!k) fail("cannot generate an EC P-256 key");
  return k;
}

std::string to_pem(X509* x) {
  BioPtr b(BIO_new(BIO_s_mem()));
  if (!b || PEM_write_bio_X509(b.get(), x) != 1) fail("cannot write a certificate as PEM");
  char* data = nullptr;
  long n = BIO_get_mem_data(b.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string to_pem(EVP_PKEY* k) {
  BioPtr b(BIO_new(BIO_s_mem()));
  if (!b || PEM_write_bio_PrivateKey(b.get(), k, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    fail("cannot write a private key as PEM");
  char* data = nullptr;
  long n = BIO_get_mem_data(b.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

bool is_ip(const std::string& s) {
  unsigned char buf[16];
  return inet_pton(AF_INET, s.c_str(), buf) == 1 || inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

// A fresh certificate for `key`: random 128-bit serial, subject CN, validity [now - 1 h, now + validity].
X509Ptr new_cert(EVP_PKEY* key, const std::string& cn, std::chrono::hours validity) {
  X509Ptr x(X509_new());
  if (!x || X509_set_version(x.get(), 2) != 1) fail("cannot create a certificate");
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof serial) != 1) fail("cannot draw a serial number");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  if (bn == nullptr || BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x.get())) == nullptr) {
    BN_free(bn);
    fail("cannot set the serial number");
  }
  BN_free(bn);
  // An hour of slack for clocks that differ between the operator and the pods.
  if (X509_gmtime_adj(X509_getm_notBefore(x.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(x.get()), static_cast<long>(validity.count()) * 3600) == nullptr)
    fail("cannot set the validity");
  X509_NAME* name = X509_get_subject_name(x.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                 0) != 1)
    fail("cannot set the subject '" + cn + "'");
  if (X509_set_pubkey(x.get(), key) != 1) fail("cannot set the public key");
  return x;
}

void add_ext(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) fail("cannot build the extension " + std::string(OBJ_nid2sn(nid)) + "=" + value);
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  if (ok != 1) fail("cannot add the extension " + std::string(OBJ_nid2sn(nid)));
}

}  // namespace

std::string openssl_error() {
  unsigned long e = ERR_get_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return buf;
}

X509Ptr read_cert(const std::string& pem, const std::string& where) {
  BioPtr b(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr x(b ? PEM_read_bio_X509(b.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!x) throw ConfigError(where + ": not a PEM certificate (" + openssl_error() + ")");
  return x;
}

PkeyPtr read_key(const std::string& pem, const std::string& where) {
  BioPtr b(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  PkeyPtr k(b ? PEM_read_bio_PrivateKey(b.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!k) throw ConfigError(where + ": not a PEM private key (" + openssl_error() + ")");
  return k;
}

CertKey make_ca(const std::string& common_name, std::chrono::hours validity) {
  PkeyPtr key = new_key();
  X509Ptr x = new_cert(key.get(), common_name, validity);
  if (X509_set_issuer_name(x.get(), X509_get_subject_name(x.get())) != 1) fail("cannot set the issuer");
  add_ext(x.get(), x.get(), NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  add_ext(x.get(), x.get(), NID_key_usage, "critical,keyCertSign,cRLSign");
  add_ext(x.get(), x.get(), NID_subject_key_identifier, "hash");
  if (X509_sign(x.get(), key.get(), EVP_sha256()) <= 0) fail("cannot sign the CA certificate");
  return {to_pem(x.get()), to_pem(key.get())};
}

// A leaf signed by `ca` for `names` with extendedKeyUsage `key_usage`.
static CertKey issue_leaf(const CertKey& ca, const std::vector<std::string>& names, std::chrono::hours validity,
                          const std::string& key_usage) {
  if (names.empty()) throw ConfigError("a server certificate needs at least one DNS name or IP address");
  X509Ptr ca_cert = read_cert(ca.cert_pem, "CA certificate");
  PkeyPtr ca_key = read_key(ca.key_pem, "CA key");
  PkeyPtr key = new_key();
  X509Ptr x = new_cert(key.get(), names.front(), validity);
  if (X509_set_issuer_name(x.get(), X509_get_subject_name(ca_cert.get())) != 1) fail("cannot set the issuer");
  std::string san;
  for (const std::string& n : names) {
    if (n.empty() || n.find_first_of(", ") != std::string::npos)
      throw ConfigError("server certificate name '" + n + "' is empty or holds a comma or space");
    if (!san.empty()) san += ',';
    san += is_ip(n) ? "IP:" : "DNS:";
    san += n;
  }
  add_ext(x.get(), ca_cert.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_ext(x.get(), ca_cert.get(), NID_key_usage, "critical,digitalSignature");
  add_ext(x.get(), ca_cert.get(), NID_ext_key_usage, key_usage);
  add_ext(x.get(), ca_cert.get(), NID_subject_alt_name, san);
  add_ext(x.get(), ca_cert.get(), NID_authority_key_identifier, "keyid:always");
  if (X509_sign(x.get(), ca_key.get(), EVP_sha256()) <= 0) fail("cannot sign the server certificate");
  return {to_pem(x.get()), to_pem(key.get())};
}

CertKey issue_server_cert(const CertKey& ca, const std::vector<std::string>& names, std::chrono::hours validity) {
  return issue_leaf(ca, names, validity, "serverAuth");
}

CertKey issue_peer_cert(const CertKey& ca, const std::vector<std::string>& names, std::chrono::hours validity) {
  return issue_leaf(ca, names, validity, "serverAuth,clientAuth");
}

bool usable(const CertKey& leaf, const std::string& ca_pem, std::chrono::hours margin) {
  X509Ptr cert = read_cert(leaf.cert_pem, "certificate");
  PkeyPtr key = read_key(leaf.key_pem, "key");
  X509Ptr ca = read_cert(ca_pem, "CA certificate");
  if (X509_check_private_key(cert.get(), key.get()) != 1) return false;
  PkeyPtr ca_pub(X509_get_pubkey(ca.get()));
  if (!ca_pub || X509_verify(cert.get(), ca_pub.get()) != 1) {
    ERR_clear_error();
    return false;
  }
  time_t until = std::time(nullptr) + static_cast<time_t>(margin.count()) * 3600;
  return X509_cmp_time(X509_get0_notAfter(cert.get()), &until) > 0 &&
         X509_cmp_time(X509_get0_notAfter(ca.get()), &until) > 0;
}

}  // namespace railyard::tls
