#include "json.h"

#include <charconv>
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/json_escape.h"

namespace ckptctl {
namespace {

using ckptd::JsonString;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

void Indent(int depth, std::string* out) { out->append(2 * static_cast<size_t>(depth), ' '); }

std::string Double(double v) {
  if (std::isnan(v)) return "\"NaN\"";
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
  return ec == std::errc() ? std::string(buf, end) : absl::StrCat(v);
}

void WriteMessage(const Message& m, int depth, std::string* out);

// Element `index` of repeated field `f` (index < 0: the singular field).
void WriteValue(const Message& m, const FieldDescriptor* f, int index, int depth,
                std::string* out) {
  const Reflection* r = m.GetReflection();
  const bool rep = index >= 0;
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(out, rep ? r->GetRepeatedInt32(m, f, index) : r->GetInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(out, rep ? r->GetRepeatedInt64(m, f, index) : r->GetInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(out, rep ? r->GetRepeatedUInt32(m, f, index) : r->GetUInt32(m, f));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(out, rep ? r->GetRepeatedUInt64(m, f, index) : r->GetUInt64(m, f));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      out->append(Double(rep ? r->GetRepeatedDouble(m, f, index) : r->GetDouble(m, f)));
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      out->append(Double(rep ? r->GetRepeatedFloat(m, f, index) : r->GetFloat(m, f)));
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out->append((rep ? r->GetRepeatedBool(m, f, index) : r->GetBool(m, f)) ? "true" : "false");
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      const int v = rep ? r->GetRepeatedEnumValue(m, f, index) : r->GetEnumValue(m, f);
      const auto* e = f->enum_type()->FindValueByNumber(v);
      out->append(e != nullptr ? JsonString(e->name()) : absl::StrCat(v));
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string s = rep ? r->GetRepeatedString(m, f, index) : r->GetString(m, f);
      out->append(f->type() == FieldDescriptor::TYPE_BYTES ? JsonString(absl::Base64Escape(s))
                                                           : JsonString(s));
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      WriteMessage(rep ? r->GetRepeatedMessage(m, f, index) : r->GetMessage(m, f), depth, out);
      break;
  }
}

// A map entry's key as a JSON object key (JSON keys are strings).
std::string MapKey(const Message& entry) {
  const FieldDescriptor* k = entry.GetDescriptor()->map_key();
  std::string v;
  WriteValue(entry, k, -1, 0, &v);
  return k->cpp_type() == FieldDescriptor::CPPTYPE_STRING ? v : JsonString(v);
}

void WriteMessage(const Message& m, int depth, std::string* out) {
  const Reflection* r = m.GetReflection();
  const auto* d = m.GetDescriptor();
  out->append("{");
  bool first = true;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const bool present_only = f->message_type() != nullptr || f->containing_oneof() != nullptr;
    if (!f->is_repeated() && present_only && !r->HasField(m, f)) continue;
    out->append(first ? "\n" : ",\n");
    first = false;
    Indent(depth + 1, out);
    absl::StrAppend(out, JsonString(f->name()), ": ");
    if (!f->is_repeated()) {
      WriteValue(m, f, -1, depth + 1, out);
      continue;
    }
    const int n = r->FieldSize(m, f);
    const bool map = f->is_map();
    if (n == 0) {
      out->append(map ? "{}" : "[]");
      continue;
    }
    out->append(map ? "{" : "[");
    for (int j = 0; j < n; ++j) {
      out->append(j == 0 ? "\n" : ",\n");
      Indent(depth + 2, out);
      if (map) {
        const Message& entry = r->GetRepeatedMessage(m, f, j);
        absl::StrAppend(out, MapKey(entry), ": ");
        WriteValue(entry, f->message_type()->map_value(), -1, depth + 2, out);
      } else {
        WriteValue(m, f, j, depth + 2, out);
      }
    }
    out->append("\n");
    Indent(depth + 1, out);
    out->append(map ? "}" : "]");
  }
  if (!first) {
    out->append("\n");
    Indent(depth, out);
  }
  out->append("}");
}

}  // namespace

std::string MessageJson(const google::protobuf::Message& msg) {
  std::string out;
  WriteMessage(msg, 0, &out);
  return out;
}

}  // namespace ckptctl
