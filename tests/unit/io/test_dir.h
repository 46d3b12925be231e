// A fresh directory per test under $CKPTD_TEST_TMP (or /tmp), removed when the test ends.
#pragma once

#include <stdlib.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace ckptd::testing {

class TestDir {
 public:
  explicit TestDir(const std::string& name) {
    const char* base = std::getenv("CKPTD_TEST_TMP");
    std::string root = base != nullptr && *base != '\0' ? base : "/tmp";
    std::error_code ec;
    std::filesystem::create_directories(root, ec);
    std::string tmpl = root + "/" + name + ".XXXXXX";
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TestDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ckptd::testing
