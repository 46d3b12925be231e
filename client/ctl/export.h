// `ckptctl export`: writes a COMMITTED checkpoint's tensors, consolidated (each tensor whole,
// whatever layout it was saved in), as Hugging Face safetensors files plus
// model.safetensors.index.json. It runs in ckptctl through the C++ client: the daemon reshards,
// this streams each tensor in bounded chunks from Load() to the file, so memory stays at one
// chunk whatever the model size.
//
// Crash safety: every file is written under a temporary name, fsync'd and renamed; the index is
// written last the same way, then the directory is fsync'd. A failed export removes its temporary
// files and never leaves a file under a final name that is not complete.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "commands.h"
#include "safetensors.h"

namespace ckptctl {

struct ExportOptions {
  std::string job;
  // nullopt: the latest COMMITTED step.
  std::optional<uint64_t> step;
  // Only "safetensors" exists. Default: "safetensors"
  std::string format = "safetensors";
  // Created (with its parents) when missing.
  std::string dir;
  // Each file's size limit, header included; a tensor larger than that gets a file of its own.
  // Default: safetensors::kMaxFileBytesDefault (5 GiB)
  uint64_t max_file_bytes = safetensors::kMaxFileBytesDefault;
  // Overwrite an earlier export in `dir` (and remove its files the new one does not rewrite).
  // Without it, a `dir` holding *.safetensors or the index is FAILED_PRECONDITION. Default: false
  bool force = false;
};

// Runs the export and prints what was written (and which object items were skipped: safetensors
// holds tensors only) to stdout, as a table or, with ctx.json, one JSON document.
// Errors: INVALID_ARGUMENT (bad options, names JSON cannot hold), NOT_FOUND (job / step),
// FAILED_PRECONDITION (not COMMITTED, nothing to export, `dir` holds an export and no --force),
// the errno's code for local I/O (naming the path), and the daemon's codes for its answers.
absl::Status Export(Context& ctx, const ExportOptions& options);

}  // namespace ckptctl
