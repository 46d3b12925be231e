#include "common/log.h"

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json_escape.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace ckptd {
namespace {

struct Field {
  std::string key;
  std::string value;
  bool number = false;
};

std::vector<Field>& Fields() {
  thread_local std::vector<Field> fields;
  return fields;
}

bool NeedsQuotes(std::string_view v) {
  return v.empty() || v.find_first_of(" \"=\t\n") != std::string_view::npos;
}

// The fields flag (%&): the thread's fields as the format writes them.
class FieldsFlag final : public spdlog::custom_flag_formatter {
 public:
  explicit FieldsFlag(LogFormat format) : format_(format) {}
  void format(const spdlog::details::log_msg&, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string s = RenderLogFields(format_);
    dest.append(s.data(), s.data() + s.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<FieldsFlag>(format_);
  }

 private:
  LogFormat format_;
};

// The escaped message flag (%*): the message as the body of a JSON string.
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string s = JsonEscape(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(s.data(), s.data() + s.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

}  // namespace

LogScope::LogScope() : mark_(Fields().size()) {}

LogScope::~LogScope() { Fields().resize(mark_); }

LogScope& LogScope::Str(std::string_view key, std::string_view value) {
  Fields().push_back(Field{std::string(key), std::string(value), false});
  return *this;
}

LogScope& LogScope::Num(std::string_view key, uint64_t value) {
  Fields().push_back(Field{std::string(key), std::to_string(value), true});
  return *this;
}

std::string RenderLogFields(LogFormat format) {
  std::string out;
  const std::vector<Field>& fields = Fields();
  if (format == LogFormat::kJson) {
    for (const Field& f : fields) {
      absl::StrAppend(&out, ",\"", JsonEscape(f.key), "\":");
      if (f.number) {
        absl::StrAppend(&out, f.value);
      } else {
        absl::StrAppend(&out, "\"", JsonEscape(f.value), "\"");
      }
    }
    return out;
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    const Field& f = fields[i];
    absl::StrAppend(&out, i == 0 ? "  " : " ", f.key, "=");
    if (!f.number && NeedsQuotes(f.value)) {
      absl::StrAppend(&out, "\"", JsonEscape(f.value), "\"");
    } else {
      absl::StrAppend(&out, f.value);
    }
  }
  return out;
}

void InstallLogFormat(LogFormat format) {
  auto f = std::make_unique<spdlog::pattern_formatter>();
  f->add_flag<FieldsFlag>('&', format);
  if (format == LogFormat::kJson) {
    f->add_flag<JsonMessageFlag>('*');
    f->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","thread":%t,"msg":"%*"%&})");
  } else {
    f->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [%t] %v%&");
  }
  spdlog::set_formatter(std::move(f));
}

}  // namespace ckptd
