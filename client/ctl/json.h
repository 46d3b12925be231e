// A protobuf message as JSON for `ckptctl --json`: field names as in the .proto, every scalar
// field printed (defaults too; unset message and oneof fields omitted), and integers — 64-bit
// ones included — as JSON numbers, not the strings protobuf's JSON mapping uses for 64-bit
// values (steps, byte counts and ids are integers a script compares). Enums by name, bytes in
// base64, maps as objects, non-finite floats as "NaN"/"Infinity"/"-Infinity".
#pragma once

#include <google/protobuf/message.h>

#include <string>

namespace ckptctl {

// Two-space indented, ending without a newline.
std::string MessageJson(const google::protobuf::Message& msg);

}  // namespace ckptctl
