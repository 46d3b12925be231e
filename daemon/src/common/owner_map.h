// OwnerMap: how a job's owner is written into manifests and node parts, and how an owner recorded
// there (possibly by a daemon on another node, where uids differ) becomes a uid on this node
// (docs/SECURITY.md "Ownership"). Built once at start from the owner_map and owner_map_file
// options (DaemonOptions::Validate); immutable afterwards, so any thread may use it.
//
// Modes:
//   uid   (default) the recorded numeric uid is the owner here too: nodes share one uid space.
//   name  the recorded user name is looked up: in the table of owner_map_file when given, else
//         in this host's passwd database (getpwnam_r). An owner that records no name, or a name
//         found nowhere, maps to no uid: PERMISSION_DENIED, and the checkpoint is not adopted.
// Either way the record carries both: the uid, and the uid's name (the table's, else the passwd
// database's, else empty), so a daemon in either mode can read it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ckptd/v1/manifest.pb.h"

namespace ckptd {

class OwnerMap {
 public:
  enum class Mode { kUid, kName };

  // Mode kUid with no table.
  OwnerMap() = default;
  // `mode_name`: "uid" or "name". `table_text`: the owner_map_file's contents: one "NAME UID"
  // per line (blank lines and lines starting with '#' skipped); names are 1 to
  // limits::kOwnerNameBytesMax letters, digits, '.', '_' or '-' (not starting with '-'), and
  // neither a name nor a uid may appear twice. `origin` names the file in errors.
  // INVALID_ARGUMENT naming the option, the file and the line.
  static absl::StatusOr<OwnerMap> Parse(absl::string_view mode_name, absl::string_view table_text,
                                        const std::string& origin);

  Mode mode() const { return mode_; }
  size_t table_size() const { return by_name_.size(); }

  // What to record for a job owned by `uid` on this node.
  v1::Owner Record(uint32_t uid) const;
  // The uid on this node of an owner `recorded` in a manifest or node part (see the modes above).
  // PERMISSION_DENIED saying why when it maps to none.
  absl::StatusOr<uint32_t> LocalUid(const v1::Owner& recorded) const;
  // "uid 1000 (alice)" / "uid 1000": an owner as messages name it.
  static std::string Describe(const v1::Owner& recorded);

 private:
  Mode mode_ = Mode::kUid;
  absl::flat_hash_map<std::string, uint32_t> by_name_;
  absl::flat_hash_map<uint32_t, std::string> by_uid_;
};

}  // namespace ckptd
