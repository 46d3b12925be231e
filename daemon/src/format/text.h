// Small text helpers private to the format module. Debian's Abseil has its own string_view type
// (ABSL_OPTION_USE_STD_STRING_VIEW 0), so std::string_view must be converted before it reaches
// absl::StrCat or absl::CHexEscape; absl::StrFormat("%s") accepts it directly.
#pragma once

#include <string>
#include <string_view>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"

namespace ckptd {

inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

// C-style escaping of an untrusted name for an error message.
inline std::string EscapeName(std::string_view s) { return absl::CHexEscape(AbslView(s)); }

}  // namespace ckptd
