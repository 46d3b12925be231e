#include "peer/peer_tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/security/auth_context.h"

namespace ckptd::peer {
namespace {

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;

std::string Where(absl::string_view option, const std::string& path) {
  return absl::StrCat("option ", option, " = \"", path, "\"");
}

absl::StatusOr<std::string> ReadWhole(absl::string_view option, const std::string& path) {
  if (path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "option ", option, ": not given (the peer listener needs the CA, certificate and key)"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(option, path), ": cannot read: ", std::strerror(errno)));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(option, path), ": cannot read"));
  }
  return ss.str();
}

std::string TimeText(const ASN1_TIME* t) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return "?";
  ASN1_TIME_print(bio, t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string out(data, n > 0 ? static_cast<size_t>(n) : 0);
  BIO_free(bio);
  return out;
}

// Every certificate in a PEM text; INVALID_ARGUMENT when there is none.
absl::StatusOr<std::vector<X509Ptr>> ParseCerts(absl::string_view option, const std::string& path,
                                                const std::string& pem) {
  std::vector<X509Ptr> out;
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new_mem_buf");
  while (X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) out.emplace_back(x);
  BIO_free(bio);
  ERR_clear_error();  // the end of the text reads as an error
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(option, path), ": no PEM certificate in it (malformed?)"));
  }
  return out;
}

absl::Status CheckDates(absl::string_view option, const std::string& path, X509* x, time_t now) {
  if (X509_cmp_time(X509_get0_notAfter(x), &now) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(Where(option, path), ": the certificate expired",
                                                   " at ", TimeText(X509_get0_notAfter(x))));
  }
  if (X509_cmp_time(X509_get0_notBefore(x), &now) >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(Where(option, path),
                                                   ": the certificate is not valid before ",
                                                   TimeText(X509_get0_notBefore(x))));
  }
  return absl::OkStatus();
}

std::vector<std::string> CertNames(X509* x) {
  std::vector<std::string> names;
  char cn[256] = {};
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, cn, sizeof(cn)) > 0) {
    names.emplace_back(cn);
  }
  auto* sans =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(x, NID_subject_alt_name, nullptr, nullptr));
  if (sans != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
      if (g->type != GEN_DNS) continue;
      const unsigned char* d = ASN1_STRING_get0_data(g->d.dNSName);
      names.emplace_back(reinterpret_cast<const char*>(d), ASN1_STRING_length(g->d.dNSName));
    }
    GENERAL_NAMES_free(sans);
  }
  return names;
}

// The certificate chains to a CA of `cas` at `now`.
absl::Status VerifyChain(const TlsFiles& f, const std::vector<X509Ptr>& cas,
                         const std::vector<X509Ptr>& chain, time_t now) {
  X509_STORE* store = X509_STORE_new();
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  STACK_OF(X509)* untrusted = sk_X509_new_null();
  absl::Status st;
  if (store == nullptr || ctx == nullptr || untrusted == nullptr) {
    st = absl::ResourceExhaustedError("cannot allocate an X509 store");
  } else {
    for (const X509Ptr& ca : cas) X509_STORE_add_cert(store, ca.get());
    for (size_t i = 1; i < chain.size(); ++i) sk_X509_push(untrusted, chain[i].get());
    if (X509_STORE_CTX_init(ctx, store, chain[0].get(), untrusted) != 1) {
      st = absl::InternalError("X509_STORE_CTX_init failed");
    } else {
      X509_STORE_CTX_set_time(ctx, 0, now);
      if (X509_verify_cert(ctx) != 1) {
        st = absl::InvalidArgumentError(
            absl::StrCat(Where("peer_tls_cert_path", f.cert_path), ": not signed by a CA of ",
                         Where("peer_tls_ca_path", f.ca_path), ": ",
                         X509_verify_cert_error_string(X509_STORE_CTX_get_error(ctx))));
      }
    }
  }
  sk_X509_free(untrusted);
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  ERR_clear_error();
  return st;
}

absl::Status CheckKey(const TlsFiles& f, const std::string& key_pem, X509* cert) {
  BIO* bio = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
  if (bio == nullptr) return absl::ResourceExhaustedError("BIO_new_mem_buf");
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  absl::Status st;
  if (key == nullptr) {
    st = absl::InvalidArgumentError(absl::StrCat(Where("peer_tls_key_path", f.key_path),
                                                 ": no PEM private key in it (malformed, or "
                                                 "encrypted with a passphrase?)"));
  } else if (X509_check_private_key(cert, key) != 1) {
    st = absl::InvalidArgumentError(absl::StrCat(Where("peer_tls_key_path", f.key_path),
                                                 ": not the key of the certificate in ",
                                                 Where("peer_tls_cert_path", f.cert_path)));
  }
  EVP_PKEY_free(key);
  ERR_clear_error();
  return st;
}

}  // namespace

absl::StatusOr<TlsMaterial> LoadTls(const TlsFiles& f, absl::Time now_time) {
  const time_t now = absl::ToTimeT(now_time);
  TlsMaterial m;
  absl::StatusOr<std::string> ca = ReadWhole("peer_tls_ca_path", f.ca_path);
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert = ReadWhole("peer_tls_cert_path", f.cert_path);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadWhole("peer_tls_key_path", f.key_path);
  if (!key.ok()) return key.status();
  absl::StatusOr<std::vector<X509Ptr>> cas = ParseCerts("peer_tls_ca_path", f.ca_path, *ca);
  if (!cas.ok()) return cas.status();
  for (const X509Ptr& x : *cas) {
    if (absl::Status st = CheckDates("peer_tls_ca_path", f.ca_path, x.get(), now); !st.ok()) {
      return st;
    }
  }
  absl::StatusOr<std::vector<X509Ptr>> chain = ParseCerts("peer_tls_cert_path", f.cert_path, *cert);
  if (!chain.ok()) return chain.status();
  X509* leaf = (*chain)[0].get();
  if (absl::Status st = CheckDates("peer_tls_cert_path", f.cert_path, leaf, now); !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckKey(f, *key, leaf); !st.ok()) return st;
  if (absl::Status st = VerifyChain(f, *cas, *chain, now); !st.ok()) return st;
  m.names = CertNames(leaf);
  m.ca_pem = *std::move(ca);
  m.cert_pem = *std::move(cert);
  m.key_pem = *std::move(key);
  return m;
}

absl::Status CheckOwnIdentity(const TlsFiles& f, const TlsMaterial& m, absl::string_view node_id) {
  if (std::find(m.names.begin(), m.names.end(), node_id) != m.names.end()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      Where("peer_tls_cert_path", f.cert_path), ": names [", absl::StrJoin(m.names, ", "),
      "] (subject CN and DNS subjectAltNames), not this daemon's node id \"", node_id,
      "\": peers would refuse it"));
}

std::vector<std::string> PeerNames(const grpc::AuthContext& auth) {
  std::vector<std::string> names;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& v : auth.FindPropertyValues(property)) {
      names.emplace_back(v.data(), v.size());
    }
  }
  return names;
}

absl::Status CheckPeerIdentity(const grpc::AuthContext& auth, absl::string_view claimed) {
  if (!auth.IsPeerAuthenticated()) {
    return absl::UnauthenticatedError(
        absl::StrCat("node \"", claimed, "\": the connection presented no verified certificate"));
  }
  const std::vector<std::string> names = PeerNames(auth);
  if (std::find(names.begin(), names.end(), claimed) != names.end()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("the peer says it is node \"", claimed, "\" but its certificate names [",
                   absl::StrJoin(names, ", "), "] (subject CN and subjectAltNames)"));
}

}  // namespace ckptd::peer
