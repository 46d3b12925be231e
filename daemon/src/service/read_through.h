// ReadThrough: several Storage tiers read as one (service/verify.cc's tier "peer").
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "ckptd/storage.h"

namespace ckptd {

// The copy of a checkpoint committed at the peer tier, spread over the nodes, as one read-only
// Storage: each path is read from the first of `tiers` that has it (ReadTiers + WithPeers: this
// node's own blobs from local storage, the others' from the peers and their nodes, the manifest
// from the store). A tier answering NOT_FOUND passes to the next; any other error is the answer.
class ReadThrough : public Storage {
 public:
  explicit ReadThrough(std::vector<Storage*> tiers) : tiers_(std::move(tiers)) {}
  std::string Describe() const override { return "nodes"; }
  absl::StatusOr<std::unique_ptr<BlobWriter>> CreateBlob(const std::string& path) override {
    return ReadOnly(path);
  }
  absl::StatusOr<std::unique_ptr<BlobReader>> OpenBlob(const std::string& path) override {
    return First<std::unique_ptr<BlobReader>>([&](Storage* t) { return t->OpenBlob(path); });
  }
  absl::Status PutAtomic(const std::string& path, std::string_view) override {
    return ReadOnly(path).status();
  }
  absl::Status PutIfAbsent(const std::string& path, std::string_view) override {
    return ReadOnly(path).status();
  }
  absl::StatusOr<std::string> Get(const std::string& path) override {
    return First<std::string>([&](Storage* t) { return t->Get(path); });
  }
  absl::StatusOr<bool> Exists(const std::string& path) override {
    for (Storage* t : tiers_) {
      absl::StatusOr<bool> e = t->Exists(path);
      if (!e.ok() || *e) return e;
    }
    return false;
  }
  absl::StatusOr<std::vector<std::string>> List(const std::string& dir) override {
    if (tiers_.empty()) return std::vector<std::string>{};
    return tiers_.back()->List(dir);
  }
  absl::Status RemoveAll(const std::string& path) override { return ReadOnly(path).status(); }

 private:
  static absl::StatusOr<std::unique_ptr<BlobWriter>> ReadOnly(const std::string& path) {
    return absl::FailedPreconditionError(absl::StrCat("verify reads only: ", path));
  }
  template <typename T>
  absl::StatusOr<T> First(const std::function<absl::StatusOr<T>(Storage*)>& read) {
    absl::StatusOr<T> last = absl::NotFoundError("on no tier");
    for (Storage* t : tiers_) {
      last = read(t);
      if (!absl::IsNotFound(last.status())) return last;
    }
    return last;
  }
  const std::vector<Storage*> tiers_;
};

}  // namespace ckptd
