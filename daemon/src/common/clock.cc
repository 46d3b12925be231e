#include "common/clock.h"

namespace ckptd {
namespace {

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

const Clock* RealClock() {
  static const SystemClock* const clock = new SystemClock();  // never destroyed
  return clock;
}

}  // namespace ckptd
