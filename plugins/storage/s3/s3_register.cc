// The S3 plugin's entry in the storage registry (s3_storage.h: RegisterS3Storage): a URI
// "s3://bucket[/prefix]" and the settings the daemon passes (its remote_s3_* options) turned
// into S3Options.
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "storage/s3/s3_storage.h"

namespace ckptd {
namespace {

using Setter = std::function<bool(const std::string& value, S3Options& o)>;

// One setter per setting; false: the value does not parse.
const std::map<std::string, Setter, std::less<>>& Setters() {
  static const auto* setters = new std::map<std::string, Setter, std::less<>>{
      {"endpoint",
       [](const std::string& v, S3Options& o) {
         o.endpoint = v;
         return true;
       }},
      {"region",
       [](const std::string& v, S3Options& o) {
         o.region = v;
         return true;
       }},
      {"ca_path",
       [](const std::string& v, S3Options& o) {
         o.ca_path = v;
         return true;
       }},
      {"path_style",
       [](const std::string& v, S3Options& o) { return absl::SimpleAtob(v, &o.path_style); }},
      {"tls_verify",
       [](const std::string& v, S3Options& o) { return absl::SimpleAtob(v, &o.tls_verify); }},
      {"part_size_bytes",
       [](const std::string& v, S3Options& o) { return absl::SimpleAtoi(v, &o.part_size_bytes); }},
      {"parts_in_flight",
       [](const std::string& v, S3Options& o) { return absl::SimpleAtoi(v, &o.parts_in_flight); }},
  };
  return *setters;
}

absl::StatusOr<std::unique_ptr<Storage>> OpenS3(const StorageUri& uri,
                                                const StorageContext& context) {
  S3Options options;
  const size_t slash = uri.location.find('/');
  options.bucket = uri.location.substr(0, slash);
  if (slash != std::string::npos) options.prefix = uri.location.substr(slash + 1);
  while (!options.prefix.empty() && options.prefix.back() == '/') options.prefix.pop_back();
  for (const auto& [name, value] : context.settings) {
    auto it = Setters().find(name);
    if (it == Setters().end() || !it->second(value, options)) {
      return absl::InvalidArgumentError(absl::StrCat("s3 storage s3://", uri.location,
                                                     ": bad setting ", name, " = \"", value, "\""));
    }
  }
  return NewS3Storage(std::move(options));
}

}  // namespace

absl::Status RegisterS3Storage(StorageRegistry& registry) {
  return registry.Register("s3", OpenS3);
}

}  // namespace ckptd
