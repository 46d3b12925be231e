// Text formatting for ckptctl.
#include "table.h"

#include <time.h>

#include <algorithm>
#include <cstdio>

namespace ckptctl {

Table::Table(std::vector<std::string> headers) {
  for (std::string& h : headers) {
    bool right = !h.empty() && h[0] == '>';
    right_.push_back(right);
    headers_.push_back(right ? h.substr(1) : h);
  }
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> width(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) width[c] = headers_[c].size();
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l;
    for (size_t c = 0; c < cells.size(); ++c) {
      std::string pad(width[c] - cells[c].size(), ' ');
      if (c > 0) l += "  ";
      l += right_[c] ? pad + cells[c] : cells[c] + (c + 1 < cells.size() ? pad : "");
    }
    l.erase(l.find_last_not_of(' ') + 1);  // an empty last cell leaves no trailing blanks
    out += l + "\n";
  };
  line(headers_);
  for (const auto& row : rows_) line(row);
  return out;
}

std::string HumanBytes(uint64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < sizeof(kUnits) / sizeof(kUnits[0])) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string HumanMicros(uint64_t us) {
  if (us == 0) return "-";
  char buf[32];
  if (us < 1000) {
    std::snprintf(buf, sizeof(buf), "%llu us", static_cast<unsigned long long>(us));
  } else if (us < 1000ull * 1000) {
    std::snprintf(buf, sizeof(buf), "%.1f ms", static_cast<double>(us) / 1e3);
  } else if (us < 60ull * 1000 * 1000) {
    std::snprintf(buf, sizeof(buf), "%.2f s", static_cast<double>(us) / 1e6);
  } else {
    const unsigned long long s = us / (1000ull * 1000);
    std::snprintf(buf, sizeof(buf), "%llum%02llus", s / 60, s % 60);
  }
  return buf;
}

std::string FormatUnixMs(uint64_t unix_ms) {
  if (unix_ms == 0) return "-";
  time_t secs = static_cast<time_t>(unix_ms / 1000);
  struct tm tm;
  if (localtime_r(&secs, &tm) == nullptr) return std::to_string(unix_ms) + " ms";
  char buf[32];
  if (strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm) == 0) {
    return std::to_string(unix_ms) + " ms";
  }
  return buf;
}

}  // namespace ckptctl
