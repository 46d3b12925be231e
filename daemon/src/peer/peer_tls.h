// The peer channel's certificates (docs/PEERS.md "Certificates"): the CA, this daemon's
// certificate and its key, read from the files the options name and checked once at start, so a
// missing, unreadable, malformed, expired or not-yet-valid file, a key that is not the
// certificate's, or a certificate the CA did not sign is an error naming the option and the file
// - there is no plaintext mode. The same checks serve the sender (PeerClient).
//
// Identity: a daemon's node id must be its certificate's subject CN or one of its DNS
// subjectAltNames (NamesInCertificate). The receiver checks the node id a request carries against
// the names gRPC's AuthContext reports for the connection (CheckPeerIdentity).
//
// Pure functions; any thread. A certificate that expires while the daemon runs is not noticed
// here (the TLS handshake refuses it).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace grpc {
class AuthContext;
}

namespace ckptd::peer {

struct TlsFiles {
  std::string ca_path;    // option peer_tls_ca_path: PEM, one or more CA certificates
  std::string cert_path;  // option peer_tls_cert_path: PEM, this daemon's certificate (chain)
  std::string key_path;   // option peer_tls_key_path: PEM, its private key
};

struct TlsMaterial {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  std::vector<std::string> names;  // the certificate's subject CN and DNS subjectAltNames
};

// Reads and checks the three files at time `now`. INVALID_ARGUMENT naming the option and the file
// (and the reason: cannot read, not PEM, expired at, not valid before, key does not match, not
// signed by the CA).
absl::StatusOr<TlsMaterial> LoadTls(const TlsFiles& files, absl::Time now);

// OK iff `node_id` is one of material.names; INVALID_ARGUMENT naming the file and the names.
absl::Status CheckOwnIdentity(const TlsFiles& files, const TlsMaterial& material,
                              absl::string_view node_id);

// The names the connection's verified client certificate carries (CN, DNS SANs).
std::vector<std::string> PeerNames(const grpc::AuthContext& auth);

// OK iff the connection presented a verified certificate naming `claimed`; UNAUTHENTICATED
// when it presented none, PERMISSION_DENIED naming the claimed id and the certificate's names.
absl::Status CheckPeerIdentity(const grpc::AuthContext& auth, absl::string_view claimed);

}  // namespace ckptd::peer
