// How the client maps the daemon's answers onto its errors, and the deadline it puts on each
// call, over the scripted daemon: codes 1:1 with the daemon's message, gRPC's own deadline and
// UNAVAILABLE named with the socket and the call, what re-opens the session and what does not,
// WaitCommitted's errors, and paging of the catalog calls.
#include "client_rig.h"

using namespace ckptd;
using namespace ckptd::testing;

namespace {

v1::CheckpointStatus StatusOf(const std::string& job, uint64_t step, v1::CheckpointState state) {
  v1::CheckpointStatus s;
  s.mutable_summary()->set_job(job);
  s.mutable_summary()->set_step(step);
  s.mutable_summary()->set_state(state);
  return s;
}

}  // namespace

TEST_CASE("the daemon's error codes and messages reach the caller unchanged", "[unit]") {
  const grpc::StatusCode codes[] = {
      grpc::StatusCode::INVALID_ARGUMENT,
      grpc::StatusCode::NOT_FOUND,
      grpc::StatusCode::ALREADY_EXISTS,
      grpc::StatusCode::PERMISSION_DENIED,
      grpc::StatusCode::RESOURCE_EXHAUSTED,
      grpc::StatusCode::FAILED_PRECONDITION,
      grpc::StatusCode::ABORTED,
      grpc::StatusCode::OUT_OF_RANGE,
      grpc::StatusCode::UNIMPLEMENTED,
      grpc::StatusCode::INTERNAL,
      grpc::StatusCode::DATA_LOSS,
      grpc::StatusCode::CANCELLED,
  };
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  for (grpc::StatusCode code : codes) {
    const std::string message = "checkpoint job/3 item w region [0, 8): daemon says no";
    daemon->FailNext("GetStatus", grpc::Status(code, message));
    absl::StatusOr<CheckpointInfo> got = client->GetStatus("job", 3);
    INFO("gRPC code " << static_cast<int>(code));
    CHECK(static_cast<int>(got.status().code()) == static_cast<int>(code));
    CHECK(got.status().message() == message);
  }
  // None of them is a reason to open a new session.
  CHECK(daemon->count("Hello") == 1);
  CHECK(daemon->count("GetStatus") == static_cast<int>(std::size(codes)));
}

TEST_CASE("FAILED_PRECONDITION re-opens the session only with reason UNKNOWN_SESSION", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  daemon->FailNext("Delete", grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                          "checkpoint job/1 is STAGING, not COMMITTED"));
  CHECK(client->Delete("job", 1).code() == absl::StatusCode::kFailedPrecondition);
  (void)client->Latest("job");
  CHECK(daemon->count("Hello") == 1);

  // The same code with the reason in the status details (decided on the code, never the text).
  daemon->FailNext("Delete", UnknownSession("s1-1"));
  absl::Status deleted = client->Delete("job", 1);
  CHECK(deleted.code() == absl::StatusCode::kFailedPrecondition);
  CHECK(deleted.message() == "unknown session s1-1");
  CHECK(daemon->count("Hello") == 1);  // this call is not repeated...
  (void)client->Latest("job");
  CHECK(daemon->count("Hello") == 2);  // ...the next one says Hello first
  CHECK(daemon->count("Delete") == 2);
}

TEST_CASE("gRPC's deadline names the call and its deadline, the daemon's text is kept", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  ClientOptions options;
  options.rpc_timeout_ms = 1234;
  auto client = ConnectTo(daemon, options);

  daemon->FailNext("Commit", GrpcDeadline());
  absl::StatusOr<CheckpointInfo> got = client->Commit("job", 2, true);
  CHECK(got.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(got.status().message() ==
        "ckptd at unix:/fake/ckptd.sock did not answer Commit within "
        "1234 ms");
  CHECK(daemon->count("Commit") == 1);  // not repeated
  CHECK(daemon->count("Hello") == 1);   // a slow daemon is not a new daemon

  daemon->FailNext("Abort", grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                         "checkpoint job/2: rank 3 did not stage in 600 s"));
  got = client->Abort("job", 2, "operator");
  CHECK(got.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(got.status().message() == "checkpoint job/2: rank 3 did not stage in 600 s");
}

TEST_CASE("every call carries its deadline", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  ClientOptions options;
  options.rpc_timeout_ms = 2000;
  options.reserve_timeout_ms = 700;
  options.connect_timeout_ms = 900;
  auto client = ConnectTo(daemon, options);
  daemon->SetStatus("job", 1, StatusOf("job", 1, v1::COMMITTED));
  daemon->AddObject("job", 1, "rng", "seed");

  REQUIRE(client->GetStatus("job", 1).ok());
  REQUIRE(client->Wait("job", 1, WaitFor::kCommitted, 3000).ok());
  REQUIRE(client->Allocate(100).ok());
  REQUIRE(client->LoadObject("job", 1, 0, "rng").ok());
  std::map<std::string, int64_t> deadline;
  for (const Received& r : daemon->calls()) deadline[r.method] = r.timeout_ms;
  CHECK(deadline["Hello"] == 900);
  CHECK(deadline["GetStatus"] == 2000);
  // A Wait's deadline is its own timeout plus a margin of min(rpc_timeout_ms, 10 s).
  CHECK(deadline["Wait"] == 3000 + 2000);
  // The daemon may wait reserve_timeout_ms for space before answering.
  CHECK(deadline["ReserveExtents"] == 2000 + 700);
  CHECK(daemon->reserves().back().timeout_ms() == 700);
  CHECK(deadline["Inspect"] == 2000);
  CHECK(deadline["Load"] == 2000);
  CHECK(deadline["ReleaseExtents"] == 2000);
}

TEST_CASE("a long Wait gets a 10 s margin, and at most the daemon's 24 h", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);  // rpc_timeout_ms 60000
  daemon->SetStatus("job", 1, StatusOf("job", 1, v1::COMMITTED));
  REQUIRE(client->WaitCommitted("job", 1, 3000).ok());
  REQUIRE(client->WaitCommitted("job", 1, 4000000000u).ok());
  std::vector<int64_t> waits;
  for (const Received& r : daemon->calls()) {
    if (r.method == "Wait") waits.push_back(r.timeout_ms);
  }
  CHECK(waits == std::vector<int64_t>{3000 + 10000, 24ll * 3600 * 1000 + 10000});
}

TEST_CASE("WaitCommitted names an abort's reason and the ranks still missing", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);

  v1::CheckpointStatus aborted = StatusOf("job", 5, v1::ABORTED);
  aborted.mutable_summary()->set_error("rank 3 died");
  daemon->SetStatus("job", 5, aborted);
  absl::Status s = client->WaitCommitted("job", 5, 100);
  CHECK(s.code() == absl::StatusCode::kAborted);
  CHECK(s.message() == "checkpoint job/5 was aborted: rank 3 died");

  v1::CheckpointStatus staging = StatusOf("job", 6, v1::STAGING);
  staging.add_missing_ranks(1);
  staging.add_missing_ranks(3);
  daemon->SetStatus("job", 6, staging);
  s = client->WaitCommitted("job", 6, 100);
  CHECK(s.code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(s.message() == "checkpoint job/6 is still STAGING after 100 ms; ranks missing: 1,3");

  daemon->SetStatus("job", 7, StatusOf("job", 7, v1::COMMITTED));
  CHECK(client->WaitCommitted("job", 7, 100).ok());
}

TEST_CASE("catalog calls follow every page, and a failing page fails the call", "[unit]") {
  auto daemon = std::make_shared<FakeDaemon>();
  auto client = ConnectTo(daemon);
  daemon->SetPageSize(2);
  for (const char* job : {"a", "b", "c", "d", "e"}) daemon->AddObject(job, 1, "o", "x");
  for (uint64_t step = 1; step <= 3; ++step) daemon->AddObject("a", step * 10, "o", "x");

  absl::StatusOr<std::vector<JobInfo>> jobs = client->ListJobs();
  REQUIRE(jobs.ok());
  std::vector<std::string> names;
  for (const JobInfo& j : *jobs) names.push_back(j.job);
  CHECK(names == std::vector<std::string>{"a", "b", "c", "d", "e"});
  CHECK(daemon->count("ListJobs") == 3);

  absl::StatusOr<std::vector<CheckpointInfo>> steps = client->ListCheckpoints("a");
  REQUIRE(steps.ok());
  REQUIRE(steps->size() == 4);
  CHECK((*steps)[3].step == 30);
  CHECK(daemon->count("ListCheckpoints") == 2);

  // The first page is served, the second fails: the call fails, with no partial list.
  daemon->FailNext("ListJobs", grpc::Status::OK);
  daemon->FailNext("ListJobs", grpc::Status(grpc::StatusCode::INTERNAL, "index read failed"));
  jobs = client->ListJobs();
  CHECK(jobs.status().code() == absl::StatusCode::kInternal);
  CHECK(jobs.status().message() == "index read failed");
  CHECK(daemon->count("ListJobs") == 5);
}
