// ReaderPool: reads through the Io seam on long-lived, named reader threads, split into pieces,
// with a bounded queue, per-request errors (FaultIo) and shutdown.
#include "io/reader_pool.h"

#include <fcntl.h>
#include <pthread.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "ckptd/storage.h"
#include "io/fault_io.h"
#include "storage/posix/posix_storage.h"
#include "test_buffers.h"
#include "test_dir.h"

namespace ckptd {
namespace {

using testing::Aligned;
using testing::AlignedBuf;
using testing::Fill;
using testing::TestDir;
using WhenFull = WorkerPool::WhenFull;
using Mode = WorkerPool::ShutdownMode;

constexpr uint64_t kPage = 4096;

// The Io of the tests that read from several threads: io_uring, except under ThreadSanitizer,
// which cannot see liburing map its rings (raw mmap syscalls, not libc's): a ring mapped where an
// earlier thread's ring was reads as a race. The pool's own synchronization is the same either way.
std::unique_ptr<Io> ThreadedTestIo(uint32_t depth) {
#if defined(__SANITIZE_THREAD__)
  (void)depth;
  return NewPosixIo();
#else
  return NewUringIo(depth);
#endif
}

// A FaultIo that also records which threads read, and can hold every read at a gate.
class ProbeIo : public FaultIo {
 public:
  explicit ProbeIo(std::unique_ptr<Io> base) : FaultIo(std::move(base)) {}
  absl::Status ReadAll(const FileHandle& file, std::span<const IoSlice> slices) override {
    char name[32] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    {
      absl::MutexLock lock(&mu_);
      threads_.insert(name);
      ++reads_;
    }
    entered_++;
    if (gated_.load()) gate_.WaitForNotification();
    return FaultIo::ReadAll(file, slices);
  }
  void Hold() { gated_ = true; }
  void Release() { gate_.Notify(); }
  int entered() const { return entered_.load(); }
  std::set<std::string> threads() const {
    absl::MutexLock lock(&mu_);
    return threads_;
  }
  uint64_t reads() const {
    absl::MutexLock lock(&mu_);
    return reads_;
  }

 private:
  mutable absl::Mutex mu_;
  std::set<std::string> threads_ ABSL_GUARDED_BY(mu_);
  uint64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int> entered_{0};
  std::atomic<bool> gated_{false};
  absl::Notification gate_;
};

// A file of `bytes` seeded bytes; `content` gets them too.
struct TestFile {
  TestFile(Io& io, const std::string& path, uint64_t bytes, bool direct) : io_(io) {
    AlignedBuf data = Aligned(bytes);
    Fill(data.get(), bytes, 7);
    content.assign(data.get(), data.get() + bytes);
    auto w = io.Open(path, O_RDWR | O_CREAT | O_TRUNC, 0600, false);
    REQUIRE(w.ok());
    IoSlice s{data.get(), bytes, 0};
    REQUIRE(io.WriteAll(*w, std::span(&s, 1)).ok());
    REQUIRE(io.Close(*w).ok());
    auto r = io.Open(path, O_RDONLY, 0, direct);
    REQUIRE(r.ok());
    handle = *r;
  }
  ~TestFile() { (void)io_.Close(handle); }
  Io& io_;
  FileHandle handle;
  std::vector<char> content;
};

ReaderPool::Options SmallPieces(size_t readers = 3, size_t queue = 16) {
  ReaderPool::Options o;
  o.readers = readers;
  o.queue_max = queue;
  o.piece_bytes = 16 * kPage;
  return o;
}

TEST_CASE("reader pool: reads split across named long-lived readers, bit-exact", "[unit]") {
  TestDir dir("reader_pool");
  ProbeIo io(ThreadedTestIo(8));
  bool direct = GENERATE(true, false);
  DYNAMIC_SECTION((direct ? "O_DIRECT" : "buffered")) {
    const uint64_t size = 300 * kPage;  // 18.75 pieces of 16 pages
    TestFile f(io, dir.path() + "/f", size, direct);
    ReaderPool pool(&io, SmallPieces());
    AlignedBuf buf = Aligned(size);
    // Whole file, then an aligned range in the middle, many times: the same three readers.
    for (int round = 0; round < 5; ++round) {
      std::memset(buf.get(), 0, size);
      auto t = pool.Submit(ReadRequest{f.handle, 0, size, buf.get()}, WhenFull::kWait);
      REQUIRE(t.ok());
      REQUIRE(t->Wait().ok());
      CHECK(t->done());
      CHECK(std::memcmp(buf.get(), f.content.data(), size) == 0);
      auto mid =
          pool.Submit(ReadRequest{f.handle, 40 * kPage, 100 * kPage, buf.get()}, WhenFull::kRefuse);
      REQUIRE(mid.ok());
      REQUIRE(mid->Wait().ok());
      CHECK(std::memcmp(buf.get(), f.content.data() + 40 * kPage, 100 * kPage) == 0);
    }
    CHECK(io.reads() == 5 * (19 + 7));
    std::set<std::string> threads = io.threads();
    CHECK(threads.size() <= 3);
    for (const std::string& t : threads) CHECK(t.rfind("reader-", 0) == 0);
    if (!direct) {
      // Unaligned offsets and lengths on a buffered file.
      auto odd = pool.Submit(ReadRequest{f.handle, 12345, 99999, buf.get()}, WhenFull::kWait);
      REQUIRE(odd.ok());
      REQUIRE(odd->Wait().ok());
      CHECK(std::memcmp(buf.get(), f.content.data() + 12345, 99999) == 0);
    }
  }
}

TEST_CASE("reader pool: empty and invalid requests", "[unit]") {
  TestDir dir("reader_pool");
  auto io = NewPosixIo();
  TestFile f(*io, dir.path() + "/f", kPage, false);
  ReaderPool pool(io.get(), SmallPieces());
  auto empty = pool.Submit(ReadRequest{f.handle, 0, 0, nullptr}, WhenFull::kRefuse);
  REQUIRE(empty.ok());
  CHECK(empty->done());
  CHECK(empty->Wait().ok());
  CHECK(pool.Submit(ReadRequest{f.handle, 0, 10, nullptr}, WhenFull::kRefuse).status().code() ==
        absl::StatusCode::kInvalidArgument);
  char c;
  CHECK(pool.Submit(ReadRequest{f.handle, UINT64_MAX, 2, &c}, WhenFull::kRefuse).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("reader pool: errors are per request (EIO through FaultIo, short file)",
          "[unit][fault]") {
  TestDir dir("reader_pool");
  ProbeIo io(ThreadedTestIo(8));
  const uint64_t size = 64 * kPage;
  TestFile f(io, dir.path() + "/f", size, true);
  ReaderPool pool(&io, SmallPieces(1, 16));  // one reader: the requests run in order
  AlignedBuf a = Aligned(size), b = Aligned(size), c = Aligned(size);
  io.FailNextRead(EIO);
  std::vector<ReadRequest> reqs = {{f.handle, 0, 16 * kPage, a.get()},
                                   {f.handle, 0, size, b.get()},
                                   {f.handle, 32 * kPage, 64 * kPage, c.get()}};
  std::vector<absl::Status> st = pool.ReadAll(reqs);
  REQUIRE(st.size() == 3);
  CHECK(st[0].code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(st[0].message()).find("(injected)") != std::string::npos);
  CHECK(std::string(st[0].message()).find(f.handle.path) != std::string::npos);
  CHECK(st[1].ok());
  CHECK(std::memcmp(b.get(), f.content.data(), size) == 0);
  CHECK(st[2].code() == absl::StatusCode::kDataLoss);  // the file ends at page 64, not 96

  SECTION("after a piece fails, the request's pieces not yet started are skipped") {
    io.Hold();
    const int base = io.entered();
    auto t = pool.Submit(ReadRequest{f.handle, 0, size, a.get()}, WhenFull::kWait);
    REQUIRE(t.ok());
    while (io.entered() < base + 1) std::this_thread::yield();  // its first piece is held
    uint64_t before = io.reads();
    io.FailNextRead(EIO);
    // The held piece fails (its injected error); the other three of the request never read.
    io.Release();
    CHECK(t->Wait().code() == absl::StatusCode::kDataLoss);
    CHECK(io.reads() == before);
  }
}

TEST_CASE("reader pool: a full queue refuses or waits (backpressure)", "[unit]") {
  TestDir dir("reader_pool");
  ProbeIo io(NewPosixIo());
  const uint64_t size = 128 * kPage;
  TestFile f(io, dir.path() + "/f", size, false);
  ReaderPool pool(&io, SmallPieces(1, 4));
  AlignedBuf buf = Aligned(8 * size);
  io.Hold();
  auto first = pool.Submit(ReadRequest{f.handle, 0, 16 * kPage, buf.get()}, WhenFull::kRefuse);
  REQUIRE(first.ok());
  while (io.entered() < 1) std::this_thread::yield();  // the one reader is held
  // 3 pieces fit the queue of 4; a 2-piece request then does not.
  auto three =
      pool.Submit(ReadRequest{f.handle, 0, 48 * kPage, buf.get() + size}, WhenFull::kRefuse);
  REQUIRE(three.ok());
  auto refused =
      pool.Submit(ReadRequest{f.handle, 0, 32 * kPage, buf.get() + 2 * size}, WhenFull::kRefuse);
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(pool.workers().queued() == 3);
  // A request of more pieces than the whole queue still goes in with kWait, as room frees.
  std::atomic<bool> returned{false};
  absl::Status big_status;
  std::thread waiter([&] {
    auto big = pool.Submit(ReadRequest{f.handle, 0, 80 * kPage, buf.get() + 3 * size},
                           WhenFull::kWait);  // 5 pieces
    big_status = big.ok() ? big->Wait() : big.status();
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  CHECK_FALSE(returned.load());
  io.Release();
  waiter.join();
  CHECK(big_status.ok());
  CHECK(first->Wait().ok());
  CHECK(three->Wait().ok());
  CHECK(std::memcmp(buf.get() + 3 * size, f.content.data(), 80 * kPage) == 0);
}

TEST_CASE("reader pool: shutdown with queued requests cancels or drains them", "[unit]") {
  TestDir dir("reader_pool");
  ProbeIo io(NewPosixIo());
  const uint64_t size = 16 * kPage;
  TestFile f(io, dir.path() + "/f", size, false);
  AlignedBuf buf = Aligned(8 * size);
  const bool drain = GENERATE(false, true);
  DYNAMIC_SECTION((drain ? "drain" : "cancel")) {
    auto pool = std::make_unique<ReaderPool>(&io, SmallPieces(1, 8));
    io.Hold();
    std::vector<ReadTicket> tickets;
    for (int i = 0; i < 5; ++i) {
      auto t =
          pool->Submit(ReadRequest{f.handle, 0, size, buf.get() + i * size}, WhenFull::kRefuse);
      REQUIRE(t.ok());
      tickets.push_back(*t);
      if (i == 0) {
        while (io.entered() < 1) std::this_thread::yield();
      }
    }
    std::thread stopper([&] { pool->Shutdown(drain ? Mode::kDrain : Mode::kCancel); });
    if (!drain) {
      // The queued ones are cancelled before the held one finishes.
      for (int i = 1; i < 5; ++i) CHECK(tickets[i].Wait().code() == absl::StatusCode::kCancelled);
      CHECK_FALSE(tickets[0].done());
    }
    io.Release();
    stopper.join();
    CHECK(tickets[0].Wait().ok());
    for (int i = 1; i < 5; ++i) {
      CHECK(tickets[i].Wait().code() ==
            (drain ? absl::StatusCode::kOk : absl::StatusCode::kCancelled));
    }
    CHECK(
        pool->Submit(ReadRequest{f.handle, 0, size, buf.get()}, WhenFull::kWait).status().code() ==
        absl::StatusCode::kUnavailable);
    pool.reset();
  }
}

TEST_CASE("reader pool: many submitters at once, every byte where it belongs", "[unit]") {
  TestDir dir("reader_pool");
  auto io = ThreadedTestIo(16);
  const uint64_t size = 256 * kPage;
  TestFile f(*io, dir.path() + "/f", size, true);
  ReaderPool pool(io.get(), SmallPieces(4, 8));
  std::atomic<int> wrong{0};
  std::vector<std::thread> submitters;
  std::vector<AlignedBuf> bufs;  // allocated here: Catch2 asserts only on the test's thread
  for (int s = 0; s < 8; ++s) bufs.push_back(Aligned(size));
  for (int s = 0; s < 8; ++s) {
    submitters.emplace_back([&, s] {
      std::mt19937_64 rng(s);
      AlignedBuf& buf = bufs[s];
      for (int i = 0; i < 30; ++i) {
        uint64_t first = rng() % 256, pages = 1 + rng() % (256 - first);
        auto t = pool.Submit(ReadRequest{f.handle, first * kPage, pages * kPage, buf.get()},
                             WhenFull::kWait);
        if (!t.ok() || !t->Wait().ok() ||
            std::memcmp(buf.get(), f.content.data() + first * kPage, pages * kPage) != 0) {
          wrong++;
        }
      }
    });
  }
  for (std::thread& t : submitters) t.join();
  CHECK(wrong.load() == 0);
}

}  // namespace
}  // namespace ckptd

namespace ckptd {
namespace {

TEST_CASE("reader pool: reads through a Storage plugin's BlobReader on a reader", "[unit]") {
  TestDir dir("reader_pool");
  ProbeIo io(ThreadedTestIo(8));
  auto storage = NewPosixStorage(dir.path(), &io);
  const uint64_t size = 40 * kPage;
  AlignedBuf data = Aligned(size);
  Fill(data.get(), size, 3);
  {
    auto w = storage->CreateBlob("j/b");
    REQUIRE(w.ok());
    IoSlice s{data.get(), size, 0};
    REQUIRE((*w)->Write(std::span(&s, 1)).ok());
    REQUIRE((*w)->Sync().ok());
  }
  auto reader = storage->OpenBlob("j/b");
  REQUIRE(reader.ok());
  ReaderPool::Options o = SmallPieces(2, 4);
  ReaderPool pool(nullptr, o);  // Storage reads only
  AlignedBuf buf = Aligned(size);
  std::vector<IoSlice> slices = {{buf.get(), 8 * kPage, 32 * kPage},
                                 {buf.get() + 8 * kPage, 16 * kPage, 0}};
  auto t = pool.SubmitBlobRead(reader->get(), slices, "j/b", WhenFull::kWait);
  REQUIRE(t.ok());
  REQUIRE(t->Wait().ok());
  CHECK(std::memcmp(buf.get(), data.get() + 32 * kPage, 8 * kPage) == 0);
  CHECK(std::memcmp(buf.get() + 8 * kPage, data.get(), 16 * kPage) == 0);
  for (const std::string& name : io.threads()) CHECK(name.rfind("reader-", 0) == 0);

  // The plugin's errors are the ticket's (EIO through FaultIo under the posix plugin).
  io.FailNextRead(EIO);
  auto failed = pool.SubmitBlobRead(reader->get(), slices, "j/b", WhenFull::kWait);
  REQUIRE(failed.ok());
  absl::Status st = failed->Wait();
  CHECK(st.code() == absl::StatusCode::kDataLoss);
  CHECK(std::string(st.message()).find("(injected)") != std::string::npos);

  // An empty read is done at once; a file range needs an Io this pool does not have.
  auto none = pool.SubmitBlobRead(reader->get(), {}, "j/b", WhenFull::kRefuse);
  REQUIRE(none.ok());
  CHECK(none->done());
  CHECK(pool.Submit(ReadRequest{FileHandle{}, 0, kPage, buf.get()}, WhenFull::kRefuse)
            .status()
            .code() == absl::StatusCode::kFailedPrecondition);

  // Cancelled with the queue at shutdown. Each read below has buffers of its own: two run at once.
  AlignedBuf buf2 = Aligned(size), buf3 = Aligned(size);
  auto into = [&](char* b) {
    return std::vector<IoSlice>{{b, 8 * kPage, 32 * kPage}, {b + 8 * kPage, 16 * kPage, 0}};
  };
  io.Hold();
  int base = io.entered();
  auto held = pool.SubmitBlobRead(reader->get(), slices, "j/b", WhenFull::kRefuse);
  REQUIRE(held.ok());
  while (io.entered() == base) std::this_thread::yield();  // one reader held
  auto reader2 = storage->OpenBlob("j/b");  // a second reader: one thread per BlobReader
  REQUIRE(reader2.ok());
  auto queued =
      pool.SubmitBlobRead(reader2->get(), into(buf2.get()), "j/b queued", WhenFull::kRefuse);
  REQUIRE(queued.ok());
  // The second reader thread takes it: hold it too, then cancel a third that stays queued.
  while (io.entered() == base + 1) std::this_thread::yield();
  auto reader3 = storage->OpenBlob("j/b");
  REQUIRE(reader3.ok());
  auto third =
      pool.SubmitBlobRead(reader3->get(), into(buf3.get()), "j/b third", WhenFull::kRefuse);
  REQUIRE(third.ok());
  std::thread stopper([&] { pool.Shutdown(Mode::kCancel); });
  st = third->Wait();
  CHECK(st.code() == absl::StatusCode::kCancelled);
  CHECK(std::string(st.message()).find("j/b third") != std::string::npos);
  io.Release();
  stopper.join();
  CHECK(held->Wait().ok());
  CHECK(queued->Wait().ok());
}

}  // namespace
}  // namespace ckptd
