// Catch2's implementation (CATCH_CONFIG_RUNNER: the framework, without a main), once for every
// test binary; see catch_session.h.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.h"

namespace ckptd::testing {

int RunCatchSession(int argc, char** argv) { return Catch::Session().run(argc, argv); }

}  // namespace ckptd::testing
