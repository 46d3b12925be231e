// Runs the Catch2 session of a test binary. Catch2's implementation is compiled once, in
// ckptd_catch (tests/catch_impl.cc), and linked into every test binary: each main.cc calls this
// instead of compiling the framework again (a copy cost ~90 s of compile per binary under the
// sanitizers).
#pragma once

namespace ckptd::testing {

// Catch::Session().run(argc, argv): the binary's exit status.
int RunCatchSession(int argc, char** argv);

}  // namespace ckptd::testing
