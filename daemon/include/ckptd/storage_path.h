// Storage path rules shared by every Storage plugin (plugin API). A path is relative to the
// storage root and '/'-separated, with no ".." component and no NUL, so it can never leave the
// root whatever the backend.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace ckptd {

// OK iff `path` follows the rules (the empty path, i.e. the root, only when allow_empty);
// INVALID_ARGUMENT naming the path and the rule broken otherwise.
inline absl::Status ValidateStoragePath(const std::string& path, bool allow_empty) {
  if (path.empty()) {
    if (allow_empty) return absl::OkStatus();
    return absl::InvalidArgumentError("storage path is empty");
  }
  if (path.front() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("storage path \"", path, "\" is absolute"));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("storage path contains a NUL byte");
  }
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("storage path \"", path, "\" has a \"..\" component"));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckptd
