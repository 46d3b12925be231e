// Internal to libckptd-client: building a Client over a given Connection. Client::Connect uses it
// with the production connection (MakeUnixConnection); the unit tests (tests/unit/client) with a
// scripted daemon, so that the client's logic — batching, re-connection, deadlines, the mapping of
// errors — is tested without a daemon. Not part of the public API (include/ckptd/client.h).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "ckptd/client.h"
#include "connection.h"

namespace ckptd::internal {

class ClientFactory {
 public:
  // Checks `options` (INVALID_ARGUMENT), then opens the session over `connection` as Connect does
  // (Hello, Attach, the arena mapped): its errors are Connect's. options.socket_path is not used
  // (the connection knows its daemon).
  static absl::StatusOr<std::unique_ptr<Client>> Create(ClientOptions options,
                                                        std::unique_ptr<Connection> connection);
};

}  // namespace ckptd::internal
