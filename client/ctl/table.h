// ckptctl's text output: aligned tables and human-readable sizes and times.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ckptctl {

// Columns padded to their widest cell, two spaces apart; numeric columns right-aligned.
class Table {
 public:
  // A header starting with '>' marks a right-aligned column (the '>' is not printed).
  explicit Table(std::vector<std::string> headers);
  void AddRow(std::vector<std::string> cells);
  std::string Render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

// "512 B", "1.5 KiB", "12.0 MiB", "3.2 GiB", "1.1 TiB".
std::string HumanBytes(uint64_t bytes);
// "850 us", "12.3 ms", "2.45 s", "3m05s", or "-" for 0 (a phase not reached or not measured).
std::string HumanMicros(uint64_t us);
// Local time "2024-05-01 12:34:56", or "-" for 0.
std::string FormatUnixMs(uint64_t unix_ms);

}  // namespace ckptctl
