// A reason a caller decides on, beyond the canonical code (ckptd.v1.ErrorReason's number; the
// proto says which codes carry which reason). The daemon attaches it to an absl::Status as a
// payload (WithReason); its gRPC layer sends it as the status details, a serialized
// ckptd.v1.ErrorDetail (rpc/grpc_service.cc ToGrpcStatus), which the client reads back
// (client_core.h ReasonOf). Clients decide on it, never on message text. Header-only, no state.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace ckptd {

inline constexpr char kErrorReasonPayload[] = "ckptd.v1.ErrorReason";

// `s` with `reason` attached (s must not be OK).
inline absl::Status WithReason(absl::Status s, int reason) {
  s.SetPayload(kErrorReasonPayload, absl::Cord(absl::StrCat(reason)));
  return s;
}

// The reason attached to `s`; 0 (ERROR_REASON_UNSPECIFIED) when none.
inline int ReasonOf(const absl::Status& s) {
  auto payload = s.GetPayload(kErrorReasonPayload);
  int reason = 0;
  return payload.has_value() && absl::SimpleAtoi(std::string(*payload), &reason) ? reason : 0;
}

}  // namespace ckptd
