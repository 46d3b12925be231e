#include "common/json_escape.h"

#include "absl/strings/str_cat.h"

namespace ckptd {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when the byte there does not start one.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = 0;
  if (b >= 0xc2 && b <= 0xdf) {
    n = 2;
  } else if (b >= 0xe0 && b <= 0xef) {
    n = 3;
  } else if (b >= 0xf0 && b <= 0xf4) {
    n = 4;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  // The second byte's range excludes overlong forms (E0 80..9F, F0 80..8F), UTF-16 surrogates
  // (ED A0..BF) and code points past U+10FFFF (F4 90..BF).
  const auto b1 = static_cast<unsigned char>(s[i + 1]);
  if ((b == 0xe0 && b1 < 0xa0) || (b == 0xed && b1 > 0x9f) || (b == 0xf0 && b1 < 0x90) ||
      (b == 0xf4 && b1 > 0x8f)) {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  }
  return n;
}

}  // namespace

std::string JsonEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const size_t n = Utf8Length(s, i);
      if (n > 0) {
        out.append(s.substr(i, n));
        i += n;
      } else {
        absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
        ++i;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  return out;
}

std::string JsonString(std::string_view s) { return absl::StrCat("\"", JsonEscape(s), "\""); }

}  // namespace ckptd
