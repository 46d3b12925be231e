// Reads the checkpoint rows ('C' job '\0' be64(step), daemon/src/index/keys.h) and upload rows
// ('U' job '\0' be64(step)) of a stopped (or
// killed) daemon's RocksDB index, read-only, through RocksDB's C API loaded at run time (the test
// binary does not link RocksDB). A read-only open replays the WAL: what a kill -9 left synced is
// what the next start would see. For the crash matrix: "was the key COMMITTED in the index at the
// moment of the crash?", without letting a restart's recovery rewrite the answer first.
#pragma once

#include <dlfcn.h>
#include <rocksdb/c.h>

#include <string>
#include <vector>

#include "ckptd/v1/index.pb.h"

namespace ckptd_it {

// Every row of key tag `tag` (keys.h: 'C' checkpoint, 'U' upload, ...) that parses as a
// `Record`, in key order; "" or the error in *error.
template <typename Record>
std::vector<Record> ReadRows(const std::string& index_dir, char tag, std::string* error) {
  std::vector<Record> rows;
  void* lib = dlopen("librocksdb.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("librocksdb.so.7.8", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    *error = std::string("dlopen librocksdb: ") + dlerror();
    return rows;
  }
#define CKPTD_IT_SYM(name) auto name##_fn = reinterpret_cast<decltype(&name)>(dlsym(lib, #name))
  CKPTD_IT_SYM(rocksdb_options_create);
  CKPTD_IT_SYM(rocksdb_options_destroy);
  CKPTD_IT_SYM(rocksdb_readoptions_create);
  CKPTD_IT_SYM(rocksdb_readoptions_destroy);
  CKPTD_IT_SYM(rocksdb_open_for_read_only);
  CKPTD_IT_SYM(rocksdb_create_iterator);
  CKPTD_IT_SYM(rocksdb_iter_seek);
  CKPTD_IT_SYM(rocksdb_iter_valid);
  CKPTD_IT_SYM(rocksdb_iter_next);
  CKPTD_IT_SYM(rocksdb_iter_key);
  CKPTD_IT_SYM(rocksdb_iter_value);
  CKPTD_IT_SYM(rocksdb_iter_destroy);
  CKPTD_IT_SYM(rocksdb_close);
  CKPTD_IT_SYM(rocksdb_free);
#undef CKPTD_IT_SYM
  if (!rocksdb_options_create_fn || !rocksdb_options_destroy_fn || !rocksdb_readoptions_create_fn ||
      !rocksdb_readoptions_destroy_fn || !rocksdb_open_for_read_only_fn ||
      !rocksdb_create_iterator_fn || !rocksdb_iter_seek_fn || !rocksdb_iter_valid_fn ||
      !rocksdb_iter_next_fn || !rocksdb_iter_key_fn || !rocksdb_iter_value_fn ||
      !rocksdb_iter_destroy_fn || !rocksdb_close_fn || !rocksdb_free_fn) {
    dlclose(lib);
    *error = "librocksdb lacks a C API function";
    return rows;
  }
  rocksdb_options_t* options = rocksdb_options_create_fn();
  char* err = nullptr;
  rocksdb_t* db = rocksdb_open_for_read_only_fn(options, index_dir.c_str(), 0, &err);
  if (err != nullptr) {
    *error = std::string("open ") + index_dir + " read-only: " + err;
    rocksdb_free_fn(err);
  } else {
    rocksdb_readoptions_t* ro = rocksdb_readoptions_create_fn();
    rocksdb_iterator_t* it = rocksdb_create_iterator_fn(db, ro);
    for (rocksdb_iter_seek_fn(it, &tag, 1); rocksdb_iter_valid_fn(it); rocksdb_iter_next_fn(it)) {
      size_t klen = 0, vlen = 0;
      const char* key = rocksdb_iter_key_fn(it, &klen);
      if (klen == 0 || key[0] != tag) break;
      const char* value = rocksdb_iter_value_fn(it, &vlen);
      Record rec;
      if (rec.ParseFromArray(value, static_cast<int>(vlen))) rows.push_back(std::move(rec));
    }
    rocksdb_iter_destroy_fn(it);
    rocksdb_readoptions_destroy_fn(ro);
    rocksdb_close_fn(db);
  }
  rocksdb_options_destroy_fn(options);
  dlclose(lib);
  return rows;
}

// Every checkpoint row that parses, in key order; "" or the error in *error.
inline std::vector<ckptd::v1::CheckpointRecord> ReadCheckpointRows(const std::string& index_dir,
                                                                   std::string* error) {
  return ReadRows<ckptd::v1::CheckpointRecord>(index_dir, 'C', error);
}

// Every upload row (the remote tier's state of one checkpoint's upload) that parses.
inline std::vector<ckptd::v1::UploadRecord> ReadUploadRows(const std::string& index_dir,
                                                           std::string* error) {
  return ReadRows<ckptd::v1::UploadRecord>(index_dir, 'U', error);
}

}  // namespace ckptd_it
