#include "rpc/metrics_server.h"

#include <exception>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"

namespace ckptd {

absl::StatusOr<std::string> MetricsBindAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string port = colon == std::string::npos ? address : address.substr(colon + 1);
  uint32_t n = 0;
  if (!absl::SimpleAtoi(port, &n) || n > 65535 || port.empty() ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("option metrics_address = \"", address,
                     "\": expected PORT, :PORT (loopback) or HOST:PORT, with PORT 0..65535"));
  }
  if (host.find_first_of(" /") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("option metrics_address = \"", address, "\": \"", host, "\" is no host"));
  }
  return absl::StrCat(host.empty() ? "127.0.0.1" : host, ":", n);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    Metrics* metrics) {
  absl::StatusOr<std::string> bind = MetricsBindAddress(address);
  if (!bind.ok()) return bind.status();
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  s->bind_ = *bind;
  try {  // prometheus-cpp (civetweb) reports a bind failure by throwing
    s->exposer_ = std::make_unique<prometheus::Exposer>(s->bind_, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint: cannot listen on ", s->bind_, ": ", e.what()));
  }
  for (const std::weak_ptr<prometheus::Collectable>& c : metrics->Collectables()) {
    s->exposer_->RegisterCollectable(c);
  }
  const std::vector<int> ports = s->exposer_->GetListeningPorts();
  s->port_ = ports.empty() ? 0 : ports.front();
  return s;
}

MetricsServer::~MetricsServer() = default;

}  // namespace ckptd
