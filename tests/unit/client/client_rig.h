// Helpers of the client's unit tests: a Client over a FakeDaemon (fake_daemon.h).
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "client_factory.h"
#include "fake_daemon.h"

namespace ckptd::testing {

inline std::unique_ptr<Client> ConnectTo(const std::shared_ptr<FakeDaemon>& daemon,
                                         ClientOptions options = {}) {
  absl::StatusOr<std::unique_ptr<Client>> client =
      internal::ClientFactory::Create(std::move(options), daemon->Connect());
  INFO(client.status().ToString());
  REQUIRE(client.ok());
  return *std::move(client);
}

// Calls poke() until done() holds, for at most 5 s (the client notices an ended Attach stream on
// its own reader thread; this waits for that, it does not emulate a race). False on timeout.
template <typename Done, typename Poke>
bool Eventually(Done done, Poke poke) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    poke();
    std::this_thread::yield();
  }
  return true;
}

// `n` bytes of a pattern that differs per `seed`.
inline std::string Pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 7 + i / 4096) & 0xff);
  return s;
}

// The calls among `only` in the order the daemon received them, from the `from`-th call on.
inline std::vector<std::string> MethodsAmong(FakeDaemon& daemon,
                                             const std::vector<std::string>& only,
                                             size_t from = 0) {
  std::vector<std::string> all = daemon.methods();
  std::vector<std::string> out;
  for (size_t i = from; i < all.size(); ++i) {
    if (std::find(only.begin(), only.end(), all[i]) != only.end()) out.push_back(all[i]);
  }
  return out;
}

inline TensorShard Tensor(const std::string& item, const std::string& bytes) {
  TensorShard t;
  t.item = item;
  t.dtype = DType::kUInt8;
  t.global_shape = {bytes.size()};
  t.data = bytes.data();
  t.bytes = bytes.size();
  return t;
}

}  // namespace ckptd::testing
