// Credentials from the standard places (s3_storage.h). The shared credentials file is the AWS
// INI format: "[profile]" sections of "key = value" lines, '#' and ';' comments.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "storage/s3/s3_storage.h"

namespace ckptd {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

absl::StatusOr<S3Credentials> FromFile(const std::string& path, const std::string& profile) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("no S3 credentials: AWS_ACCESS_KEY_ID is not set and ",
                                            path, " cannot be read"));
  }
  S3Credentials c;
  bool in_profile = false;
  bool found = false;
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view l = absl::StripAsciiWhitespace(line);
    if (l.empty() || l[0] == '#' || l[0] == ';') continue;
    if (l.front() == '[') {
      if (l.back() != ']') {
        return absl::InvalidArgumentError(
            absl::StrCat("S3 credentials file ", path, ": a section line does not end in ']'"));
      }
      in_profile = absl::StripAsciiWhitespace(l.substr(1, l.size() - 2)) == profile;
      found = found || in_profile;
      continue;
    }
    if (!in_profile) continue;
    size_t eq = l.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("S3 credentials file ", path, ", profile ",
                                                     profile, ": a line without '='"));
    }
    std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(l.substr(0, eq)));
    std::string value(absl::StripAsciiWhitespace(l.substr(eq + 1)));
    if (key == "aws_access_key_id") c.access_key_id = value;
    if (key == "aws_secret_access_key") c.secret_access_key = value;
    if (key == "aws_session_token") c.session_token = value;
  }
  if (!found) {
    return absl::NotFoundError(
        absl::StrCat("S3 credentials file ", path, " has no profile \"", profile, "\""));
  }
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("S3 credentials file ", path, ", profile ", profile,
                     ": aws_access_key_id and aws_secret_access_key are both required"));
  }
  return c;
}

}  // namespace

absl::StatusOr<S3Credentials> LoadS3Credentials() {
  S3Credentials c;
  c.access_key_id = Env("AWS_ACCESS_KEY_ID");
  c.secret_access_key = Env("AWS_SECRET_ACCESS_KEY");
  if (!c.access_key_id.empty() || !c.secret_access_key.empty()) {
    if (c.access_key_id.empty() || c.secret_access_key.empty()) {
      return absl::InvalidArgumentError(
          "S3 credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together");
    }
    c.session_token = Env("AWS_SESSION_TOKEN");
    return c;
  }
  std::string path = Env("AWS_SHARED_CREDENTIALS_FILE");
  if (path.empty()) {
    std::string home = Env("HOME");
    if (home.empty()) {
      return absl::NotFoundError(
          "no S3 credentials: neither AWS_ACCESS_KEY_ID, AWS_SHARED_CREDENTIALS_FILE nor HOME is "
          "set");
    }
    path = home + "/.aws/credentials";
  }
  std::string profile = Env("AWS_PROFILE");
  return FromFile(path, profile.empty() ? "default" : profile);
}

}  // namespace ckptd
