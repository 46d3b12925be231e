// Structured logging (common/log.h): scopes add fields to their thread's lines and take them away
// when they end; JSON lines stay valid whatever the message holds; text lines quote what needs it.
#include "common/log.h"

#include <catch2/catch.hpp>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "common/json_escape.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

TEST_CASE("LogScope: fields nest, render in order and end with their scope", "[unit]") {
  CHECK(RenderLogFields(LogFormat::kJson).empty());
  {
    LogScope rpc;
    rpc.Str("request_id", "d1f").Str("method", "Save");
    {
      LogScope ckpt;
      ckpt.Str("job", "j").Num("step", 7);
      CHECK(RenderLogFields(LogFormat::kJson) ==
            R"(,"request_id":"d1f","method":"Save","job":"j","step":7)");
      CHECK(RenderLogFields(LogFormat::kText) == "  request_id=d1f method=Save job=j step=7");
    }
    CHECK(RenderLogFields(LogFormat::kJson) == R"(,"request_id":"d1f","method":"Save")");
  }
  CHECK(RenderLogFields(LogFormat::kJson).empty());
}

TEST_CASE("LogScope: another thread sees none of this thread's fields", "[unit]") {
  LogScope mine;
  mine.Str("job", "j");
  std::string theirs = "unset";
  std::thread t([&] { theirs = RenderLogFields(LogFormat::kJson); });
  t.join();
  CHECK(theirs.empty());
  CHECK(RenderLogFields(LogFormat::kJson) == R"(,"job":"j")");
}

TEST_CASE("JsonEscape: quotes, backslashes, control bytes and invalid UTF-8", "[unit]") {
  CHECK(JsonEscape("plain") == "plain");
  CHECK(JsonEscape("a \"b\" c\\d") == R"(a \"b\" c\\d)");
  CHECK(JsonEscape("l1\nl2\tx\r") == R"(l1\nl2\tx\r)");
  CHECK(JsonEscape(std::string("nul\0bel\x07", 8)) == R"(nul\u0000bel\u0007)");
  CHECK(JsonEscape("caf\xc3\xa9 \xe2\x9c\x93") == "caf\xc3\xa9 \xe2\x9c\x93");  // valid: kept
  CHECK(JsonEscape("bad \xff\xc3 end") == R"(bad \u00ff\u00c3 end)");           // invalid: escaped
  CHECK(JsonEscape("cut \xe2\x9c") == R"(cut \u00e2\u009c)");  // truncated sequence
  // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8: escaped bytewise.
  CHECK(JsonEscape("\xe0\x80\xaf") == "\\u00e0\\u0080\\u00af");
  CHECK(JsonEscape("\xed\xa0\x80") == "\\u00ed\\u00a0\\u0080");
  CHECK(JsonEscape("\xf4\x90\x80\x80") == "\\u00f4\\u0090\\u0080\\u0080");
  CHECK(JsonEscape("\xf4\x8f\xbf\xbf") == "\xf4\x8f\xbf\xbf");  // U+10FFFF passes
}

TEST_CASE("Text fields: strings with spaces, quotes or '=' are quoted", "[unit]") {
  LogScope s;
  s.Str("error", "disk full").Str("path", "a=b").Str("empty", "").Str("ok", "x");
  CHECK(RenderLogFields(LogFormat::kText) == R"(  error="disk full" path="a=b" empty="" ok=x)");
}

// One line logged through the installed format, as the daemon writes it.
std::string LogOneLine(LogFormat format, const std::string& msg) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  auto logger = std::make_shared<spdlog::logger>("log_test", sink);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(logger);
  InstallLogFormat(format);
  spdlog::info("{}", msg);
  spdlog::set_default_logger(previous);
  return out.str();
}

TEST_CASE("InstallLogFormat: a JSON line carries the escaped message and the fields", "[unit]") {
  LogScope s;
  s.Str("job", "j\"x").Num("step", 3).Str("event", "committed");
  const std::string line = LogOneLine(LogFormat::kJson, "say \"hi\"\nbye");
  CHECK(line.rfind(R"({"time":")", 0) == 0);
  CHECK(line.find(R"("level":"info")") != std::string::npos);
  CHECK(line.find(R"("msg":"say \"hi\"\nbye","job":"j\"x","step":3,"event":"committed"})") !=
        std::string::npos);
  CHECK(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);  // one line, whatever the message held
}

TEST_CASE("InstallLogFormat: a text line ends with the fields", "[unit]") {
  LogScope s;
  s.Str("job", "j").Num("step", 3);
  const std::string line = LogOneLine(LogFormat::kText, "committed");
  CHECK(line.find("committed  job=j step=3\n") != std::string::npos);
}

}  // namespace
}  // namespace ckptd
