// The error vocabulary of the daemon, its plugins and (privately) the C++ client: absl::Status /
// absl::StatusOr with the canonical codes end to end, no exceptions across a module boundary;
// one errno mapping (ErrnoStatus); CKPTD_CHECK for bugs only (client input must never reach
// one). Note: Debian's abseil has its own absl::string_view (not std::string_view): convert
// before passing one to absl::StrCat.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#define CKPTD_CONCAT_INNER_(a, b) a##b
#define CKPTD_CONCAT_(a, b) CKPTD_CONCAT_INNER_(a, b)

#define CKPTD_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status ckptd_status_ = (expr);         \
    if (!ckptd_status_.ok()) return ckptd_status_; \
  } while (0)

// tmp is a name and lhs a declaration (`auto x`): neither can be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define CKPTD_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(*tmp)
// NOLINTEND(bugprone-macro-parentheses)

#define CKPTD_ASSIGN_OR_RETURN(lhs, expr) \
  CKPTD_ASSIGN_OR_RETURN_IMPL_(CKPTD_CONCAT_(ckptd_statusor_, __LINE__), lhs, expr)

// Always-on assertion for invariants of our own code (never for client input).
#define CKPTD_CHECK(cond)                                                             \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "CHECK failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

namespace ckptd {

// Maps an errno value onto the canonical code that says what a caller can do about it, with a
// message "<context>: <strerror> (errno N)".
inline absl::Status ErrnoStatus(int err, std::string_view context) {
  std::string msg =
      absl::StrCat(std::string(context), ": ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EEXIST:
      return absl::AlreadyExistsError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case ENOSPC:
    case EDQUOT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(msg);
    case EINVAL:
    case ENAMETOOLONG:
    case ENOTDIR:
    case EISDIR:
      return absl::InvalidArgumentError(msg);
    case EAGAIN:
    case EINTR:
      return absl::UnavailableError(msg);
    case EIO:
      return absl::DataLossError(msg);
    default:
      return absl::InternalError(msg);
  }
}

// Prefixes a status's message with context, keeping its code.
inline absl::Status Annotate(const absl::Status& s, std::string_view context) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(std::string(context), ": ", s.message()));
}
// The same for a StatusOr: its value passes through untouched.
template <typename T>
absl::StatusOr<T> Annotate(absl::StatusOr<T> s, std::string_view context) {
  if (s.ok()) return s;
  return Annotate(s.status(), context);
}

}  // namespace ckptd
