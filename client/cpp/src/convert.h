// Internal to libckptd-client: conversions between client.h's plain types and ckptd.v1 messages.
#pragma once

#include "absl/status/statusor.h"
#include "ckptd/client.h"
#include "ckptd/v1/ckptd.pb.h"

namespace ckptd::internal {

ckptd::v1::DType ToProto(DType dtype);
// INVALID_ARGUMENT for DTYPE_UNSPECIFIED or a value this client does not know.
absl::StatusOr<DType> FromProto(ckptd::v1::DType dtype);
void ToProto(const Region& region, ckptd::v1::Region* out);
CheckpointState FromProto(ckptd::v1::CheckpointState state);
CheckpointInfo FromProto(const ckptd::v1::CheckpointSummary& summary);
CheckpointInfo FromProto(const ckptd::v1::CheckpointStatus& status);
JobInfo FromProto(const ckptd::v1::JobSummary& job);
ItemInfo FromProto(const ckptd::v1::ItemInfo& item);

}  // namespace ckptd::internal
