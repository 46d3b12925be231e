// Catch2 main of the integration tests, plus one maintenance mode that is not a test (ctest runs
// every discovered case, hidden ones included, so a generator must not be a test case):
//   ckptd_integration_tests --write-golden   regenerates tests/data/golden (see golden_test.cc)
//   ckptd_integration_tests --fair-share-hog NAME ...   a hog process of fair_share_test.cc (it
//                                            runs exec'd, not forked: a forked child would share
//                                            the test process's gRPC descriptors)
//   ckptd_integration_tests --as-uid-child NAME ...  a test's process of another uid (as_uid.h:
//                                            exec'd for the same reason)
#include <cstring>
#include <exception>
#include <iostream>

#include "as_uid.h"
#include "catch_session.h"

namespace ckptd_it {
int WriteGolden();                        // portability_test.cc
int FairShareHog(int argc, char** argv);  // fair_share_test.cc
}  // namespace ckptd_it

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--write-golden") == 0) {
    try {
      return ckptd_it::WriteGolden();
    } catch (const std::exception& e) {
      std::cerr << "write-golden: " << e.what() << "\n";
      return 1;
    }
  }
  if (argc >= 2 && std::strcmp(argv[1], "--fair-share-hog") == 0) {
    return ckptd_it::FairShareHog(argc, argv);
  }
  if (argc >= 2 && std::strcmp(argv[1], "--as-uid-child") == 0) {
    return ckptd_it::RunChild(argc, argv);
  }
  return ckptd::testing::RunCatchSession(argc, argv);
}
