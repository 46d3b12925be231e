#include "common/owner_map.h"

#include <pwd.h>

#include <cerrno>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/limits.h"

namespace ckptd {
namespace {

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > limits::kOwnerNameBytesMax || name[0] == '-') return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

// getpwuid_r / getpwnam_r with a buffer that grows on ERANGE; nullopt when there is no entry
// (or the lookup fails: an owner that cannot be named is recorded without a name).
std::optional<std::pair<uint32_t, std::string>> Passwd(std::optional<uint32_t> uid,
                                                       const std::string& name) {
  std::vector<char> buf(4096);
  while (true) {
    passwd pw{};
    passwd* found = nullptr;
    const int rc = uid ? getpwuid_r(*uid, &pw, buf.data(), buf.size(), &found)
                       : getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found);
    if (rc == ERANGE && buf.size() < (1u << 20)) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (rc != 0 || found == nullptr) return std::nullopt;
    return std::make_pair(static_cast<uint32_t>(found->pw_uid), std::string(found->pw_name));
  }
}

}  // namespace

absl::StatusOr<OwnerMap> OwnerMap::Parse(absl::string_view mode_name, absl::string_view table_text,
                                         const std::string& origin) {
  OwnerMap map;
  if (mode_name == "uid") {
    map.mode_ = Mode::kUid;
  } else if (mode_name == "name") {
    map.mode_ = Mode::kName;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("option owner_map = \"", mode_name, "\": expected uid or name"));
  }
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(table_text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto fail = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("option owner_map_file: ", origin, " line ",
                                                     line_no, " (\"", line, "\"): ", why));
    };
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 2) return fail("expected \"NAME UID\"");
    uint32_t uid = 0;
    if (!ValidName(fields[0])) {
      return fail(absl::StrCat("the name is not 1 to ", limits::kOwnerNameBytesMax,
                               " letters, digits, '.', '_' or '-' (not starting with '-')"));
    }
    if (!absl::SimpleAtoi(fields[1], &uid) || uid == UINT32_MAX) {
      return fail("the uid is not a number below 4294967295");
    }
    if (map.by_name_.size() >= limits::kOwnerMapEntriesMax) {
      return fail(absl::StrCat("more than ", limits::kOwnerMapEntriesMax, " entries"));
    }
    const std::string name(fields[0]);
    if (!map.by_name_.emplace(name, uid).second) return fail("the name is mapped twice");
    if (!map.by_uid_.emplace(uid, name).second) {
      return fail(absl::StrCat("uid ", uid, " is mapped twice (a uid has one name)"));
    }
  }
  return map;
}

v1::Owner OwnerMap::Record(uint32_t uid) const {
  v1::Owner owner;
  owner.set_uid(uid);
  if (auto it = by_uid_.find(uid); it != by_uid_.end()) {
    owner.set_name(it->second);
  } else if (auto pw = Passwd(uid, ""); pw && ValidName(pw->second)) {
    owner.set_name(pw->second);
  }
  return owner;
}

absl::StatusOr<uint32_t> OwnerMap::LocalUid(const v1::Owner& recorded) const {
  if (mode_ == Mode::kUid) return recorded.uid();
  if (recorded.name().empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat("the owner recorded (", Describe(recorded),
                     ") has no user name on the node that wrote it, and owner_map = name maps "
                     "owners by name"));
  }
  if (auto it = by_name_.find(recorded.name()); it != by_name_.end()) return it->second;
  if (ValidName(recorded.name())) {
    if (auto pw = Passwd(std::nullopt, recorded.name())) return pw->first;
  }
  return absl::PermissionDeniedError(
      absl::StrCat("the owner recorded (", Describe(recorded), ") has no uid here: its name is in ",
                   by_name_.empty() ? "no owner_map_file" : "neither owner_map_file",
                   by_name_.empty() ? " and not in" : " nor", " this host's passwd database"));
}

std::string OwnerMap::Describe(const v1::Owner& recorded) {
  return recorded.name().empty() ? absl::StrCat("uid ", recorded.uid())
                                 : absl::StrCat("uid ", recorded.uid(), " (", recorded.name(), ")");
}

}  // namespace ckptd
