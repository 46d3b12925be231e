// The metrics endpoint (option metrics_address): Prometheus' text format over HTTP at /metrics,
// served by prometheus-cpp's exposer (civetweb, its own threads) from a Metrics registry.
//
// Ownership: borrows `metrics` (it outlives the server). The server stops serving when destroyed.
// A scrape reads the levels through Metrics::LevelsFn on a civetweb thread.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/metrics.h"

namespace prometheus {
class Exposer;
}

namespace ckptd {

class MetricsServer {
 public:
  // "PORT" or ":PORT" listens on 127.0.0.1 (loopback, the default); "HOST:PORT" on HOST as
  // given (an operator's choice, e.g. 0.0.0.0:9464 for a cluster's Prometheus). Port 0: any free
  // port (port() says which). INVALID_ARGUMENT for an address that does not parse, UNAVAILABLE
  // when it cannot be listened on.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              Metrics* metrics);
  ~MetricsServer();

  int port() const { return port_; }
  const std::string& bind_address() const { return bind_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string bind_;
  int port_ = 0;
};

// The address Start listens on for `address` ("9464" -> "127.0.0.1:9464"); INVALID_ARGUMENT
// naming what is wrong.
absl::StatusOr<std::string> MetricsBindAddress(const std::string& address);

}  // namespace ckptd
