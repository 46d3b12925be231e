// Structured logging: the fields a log line carries beside its message (docs/OPERATIONS.md
// "Where a checkpoint's time went, and logs").
//
// A LogScope adds fields — job, step, rank, request_id, an event and its timings — to every line
// its thread logs while the scope lives; scopes nest (an RPC's request_id and method, then the
// checkpoint's job and step, then one event's fields). InstallLogFormat sets the process's
// spdlog format:
//   json: one JSON object per line: {"time","level","thread","msg", then the fields}; the message
//         and every string field escaped (a message may hold quotes, newlines, any byte);
//   text: "2026-11-27 10:00:00.123 info [tid] message  job=j step=7 rank=0 ..." (fields after
//         two spaces, strings quoted when they hold a space, a quote or '=').
// Numbers are written as numbers in JSON. Field order: outer scopes first, each in the order
// added.
//
// Ownership: a LogScope's fields live in thread-local storage from its construction to its
// destruction; it must be destroyed on the thread that made it, in reverse order of
// construction (it is a stack object: not movable or copyable).
// Thread safety: each thread sees only its own scopes; InstallLogFormat once at start-up, before
// other threads log.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ckptd {

class LogScope {
 public:
  LogScope();
  ~LogScope();
  LogScope(const LogScope&) = delete;
  LogScope& operator=(const LogScope&) = delete;

  LogScope& Str(std::string_view key, std::string_view value);
  LogScope& Num(std::string_view key, uint64_t value);

 private:
  size_t mark_;  // the thread's field count when this scope began
};

enum class LogFormat { kText, kJson };

// Installs the pattern of `format` (with the fields) on spdlog's default logger.
void InstallLogFormat(LogFormat format);

// The fields of the calling thread's scopes, rendered as `format` writes them after the message
// (JSON: `,"job":"j","step":7`; text: `  job=j step=7`; "" with none). For tests and the formatter.
std::string RenderLogFields(LogFormat format);

}  // namespace ckptd
