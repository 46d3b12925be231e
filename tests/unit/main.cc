// Main of the unit binaries (the framework is ckptd_catch: tests/catch_impl.cc).
#include "catch_session.h"

int main(int argc, char** argv) { return ckptd::testing::RunCatchSession(argc, argv); }
