// JSON string escaping, the one implementation: the daemon's JSON log lines (common/log.h) and
// ckptctl's --json output and safetensors headers (client/ctl) both write strings through it.
#pragma once

#include <string>
#include <string_view>

namespace ckptd {

// `s` as the body of a JSON string: quotes, backslashes and control bytes escaped; valid UTF-8
// passes through; bytes that are not valid UTF-8 are written as \u00XX of the byte, so the output
// is always valid JSON.
std::string JsonEscape(std::string_view s);
// The same, quoted: a whole JSON string value.
std::string JsonString(std::string_view s);

}  // namespace ckptd
