#include "ckptd/storage_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ckptd {
namespace {

// RFC 3986's scheme, lower case only: "S3://" is refused rather than quietly matched.
bool ValidScheme(std::string_view scheme) {
  if (scheme.empty() || scheme.front() < 'a' || scheme.front() > 'z') return false;
  for (char c : scheme) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<StorageUri> ParseStorageUri(std::string_view uri) {
  if (uri.empty()) return absl::InvalidArgumentError("empty storage URI");
  const size_t sep = uri.find("://");
  if (sep == std::string_view::npos) return StorageUri{"file", std::string(uri)};
  StorageUri out{std::string(uri.substr(0, sep)), std::string(uri.substr(sep + 3))};
  if (!ValidScheme(out.scheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage URI \"", std::string(uri), "\": \"", out.scheme,
                     "\" is not a scheme (lower case letters, digits, '+', '-', '.')"));
  }
  if (out.location.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage URI \"", std::string(uri), "\" names no location after \"://\""));
  }
  return out;
}

absl::Status StorageRegistry::Register(std::string scheme, StorageFactory factory) {
  if (!ValidScheme(scheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage plugin scheme \"", scheme, "\" is not a scheme name"));
  }
  if (!factory) {
    return absl::InvalidArgumentError(
        absl::StrCat("storage plugin \"", scheme, "\" registered without a factory"));
  }
  if (factories_.contains(scheme)) {
    return absl::AlreadyExistsError(
        absl::StrCat("a storage plugin for scheme \"", scheme, "\" is already registered"));
  }
  factories_.emplace(std::move(scheme), std::move(factory));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Storage>> StorageRegistry::Open(
    std::string_view uri, const StorageContext& context) const {
  absl::StatusOr<StorageUri> parsed = ParseStorageUri(uri);
  if (!parsed.ok()) return parsed.status();
  auto it = factories_.find(parsed->scheme);
  if (it == factories_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "storage URI \"", std::string(uri), "\": unknown scheme \"", parsed->scheme,
        "\" (known: ", factories_.empty() ? "none" : absl::StrJoin(schemes(), ", "), ")"));
  }
  return it->second(*parsed, context);
}

std::vector<std::string> StorageRegistry::schemes() const {
  std::vector<std::string> out;
  out.reserve(factories_.size());
  for (const auto& [scheme, factory] : factories_) out.push_back(scheme);
  return out;
}

}  // namespace ckptd
