#include "tier/encoded_store.h"

#include <algorithm>
#include <cstring>
#include <future>
#include <limits>

#include "absl/strings/str_cat.h"
#include "ckptd/status.h"
#include "common/align.h"
#include "common/limits.h"
#include "format/codec.h"
#include "format/manifest.h"
#include "format/names.h"

namespace ckptd {
namespace {

constexpr uint64_t kNoChunk = std::numeric_limits<uint64_t>::max();

// "dir/name" -> {"dir", "name"}; a path without '/' is in the root ("").
std::pair<std::string, std::string> SplitPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {"", path};
  return {path.substr(0, slash), path.substr(slash + 1)};
}

// The raw bytes of an encoded object, decoded on demand. Keeps the last chunk it decoded for a
// read that only partly covers one (a strided load reads many small runs of one chunk).
class DecodingBlobReader : public BlobReader {
 public:
  DecodingBlobReader(std::unique_ptr<BlobReader> object, BlobFrames frames, std::string path)
      : object_(std::move(object)), frames_(std::move(frames)), path_(std::move(path)) {}

  uint64_t size_bytes() const override { return frames_.size_bytes; }

  absl::Status Read(std::span<const IoSlice> slices) override {
    absl::MutexLock lock(&mu_);
    absl::Status st;
    for (const IoSlice& s : slices) {
      st = ReadSlice(s);
      if (!st.ok()) break;
    }
    // The fetched frames (up to kEncodedFetchBytesMax) are not kept between reads: an open
    // reader holds only its cached chunk.
    std::vector<uint8_t>().swap(frames_buf_);
    return st;
  }

 private:
  absl::Status ReadSlice(const IoSlice& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (s.len == 0) return absl::OkStatus();
    if (s.offset > frames_.size_bytes || s.len > frames_.size_bytes - s.offset) {
      return absl::DataLossError(absl::StrCat("blob ", path_, " is ", frames_.size_bytes,
                                              " bytes; bytes [", s.offset, ", +", s.len,
                                              ") were asked"));
    }
    auto* out = static_cast<uint8_t*>(s.buf);
    const uint64_t end = s.offset + s.len;
    for (uint64_t c = s.offset / frames_.chunk_bytes; c * frames_.chunk_bytes < end;) {
      if (c == cached_) {
        CopyOut(c, chunk_.data(), s, out);
        ++c;
        continue;
      }
      // Chunks [c, last) not cached, their frames fetched in one read of at most
      // kEncodedFetchBytesMax (one frame at least).
      uint64_t last = c + 1;
      while (last * frames_.chunk_bytes < end && last != cached_ &&
             frames_.offsets[last + 1] - frames_.offsets[c] <= limits::kEncodedFetchBytesMax) {
        ++last;
      }
      CKPTD_RETURN_IF_ERROR(Fetch(c, last));
      for (; c < last; ++c) CKPTD_RETURN_IF_ERROR(DecodeChunk(c, s, out));
    }
    return absl::OkStatus();
  }

  // Reads the frames of chunks [first, last) into frames_buf_.
  absl::Status Fetch(uint64_t first, uint64_t last) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t from = frames_.offsets[first], n = frames_.offsets[last] - from;
    frames_buf_.resize(n);
    first_fetched_ = first;
    IoSlice slice{frames_buf_.data(), n, from};
    return Annotate(
        object_->Read(std::span<const IoSlice>(&slice, 1)),
        absl::StrCat("reading the encoded chunks ", first, "..", last - 1, " of ", path_));
  }

  // Decodes chunk c (fetched) straight into the slice when it covers the chunk, else into the
  // cache and copies the part asked.
  absl::Status DecodeChunk(uint64_t c, const IoSlice& s, uint8_t* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t begin = c * frames_.chunk_bytes, n = frames_.DecodedBytes(c);
    const std::span<const uint8_t> frame(
        frames_buf_.data() + (frames_.offsets[c] - frames_.offsets[first_fetched_]),
        frames_.offsets[c + 1] - frames_.offsets[c]);
    const std::string context =
        absl::StrCat("blob ", path_, " chunk ", c, " (bytes [", begin, ", +", n, ") of the blob)");
    if (begin >= s.offset && begin + n <= s.offset + s.len) {
      return decoder_.Decode(frame, std::span<uint8_t>(out + (begin - s.offset), n), context);
    }
    chunk_.resize(n);
    cached_ = kNoChunk;
    CKPTD_RETURN_IF_ERROR(decoder_.Decode(frame, std::span<uint8_t>(chunk_.data(), n), context));
    cached_ = c;
    CopyOut(c, chunk_.data(), s, out);
    return absl::OkStatus();
  }

  // Copies the part of chunk c (decoded at `chunk`) that slice s asks for.
  void CopyOut(uint64_t c, const uint8_t* chunk, const IoSlice& s, uint8_t* out) const {
    const uint64_t begin = c * frames_.chunk_bytes, n = frames_.DecodedBytes(c);
    const uint64_t from = std::max(begin, s.offset);
    const uint64_t to = std::min(begin + n, s.offset + s.len);
    std::memcpy(out + (from - s.offset), chunk + (from - begin), to - from);
  }

  absl::Mutex mu_;
  const std::unique_ptr<BlobReader> object_;
  const BlobFrames frames_;
  const std::string path_;
  ChunkDecoder decoder_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> frames_buf_ ABSL_GUARDED_BY(mu_);
  uint64_t first_fetched_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<uint8_t> chunk_ ABSL_GUARDED_BY(mu_);
  uint64_t cached_ ABSL_GUARDED_BY(mu_) = kNoChunk;
};

// Encodes the `len` raw bytes at `raw` (blob bytes [off, off + len): whole chunks, the blob's
// last may be short) chunk by chunk into *frames (replacing it), each frame's size added to *enc.
absl::Status EncodePiece(const EncodeBlobJob& job, ChunkEncoder& encoder, const uint8_t* raw,
                         uint64_t off, uint64_t len, std::string* frames, v1::BlobEncoding* enc) {
  frames->clear();
  for (uint64_t at = 0; at < len; at += job.chunk_bytes) {
    const uint64_t n = std::min(job.chunk_bytes, len - at);
    const uint64_t chunk = (off + at) / job.chunk_bytes;
    const size_t before = frames->size();
    CKPTD_RETURN_IF_ERROR(
        Annotate(encoder.Encode(std::span<const uint8_t>(raw + at, n), job.planes[chunk], frames),
                 absl::StrCat("encoding ", job.path, " chunk ", chunk)));
    enc->add_frame_bytes(static_cast<uint32_t>(frames->size() - before));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlobReader>> EncodedStore::OpenBlob(const std::string& path) {
  bool stale = false;
  absl::StatusOr<std::unique_ptr<BlobReader>> r = Open(path, /*fresh=*/false, &stale);
  // The object disagrees with a cached record: the manifest may have been rewritten meanwhile.
  if (stale) return Open(path, /*fresh=*/true, &stale);
  return r;
}

absl::StatusOr<std::unique_ptr<BlobReader>> EncodedStore::Open(const std::string& path, bool fresh,
                                                               bool* stale) {
  auto [dir, name] = SplitPath(path);
  CKPTD_ASSIGN_OR_RETURN(std::shared_ptr<const Encodings> encodings, EncodingsOf(dir, fresh));
  auto it = encodings->find(name);
  if (it == encodings->end()) return store_->OpenBlob(path);
  CKPTD_ASSIGN_OR_RETURN(std::unique_ptr<BlobReader> object, store_->OpenBlob(path));
  if (object->size_bytes() != it->second.encoded_bytes()) {
    *stale = !fresh;
    return absl::DataLossError(absl::StrCat(
        "encoded blob ", path, " on ", store_->Describe(), " is ", object->size_bytes(),
        " bytes; the store's manifest records ", it->second.encoded_bytes()));
  }
  return std::make_unique<DecodingBlobReader>(std::move(object), it->second, path);
}

absl::StatusOr<std::shared_ptr<const EncodedStore::Encodings>> EncodedStore::EncodingsOf(
    const std::string& dir, bool fresh) {
  if (!fresh) {
    absl::MutexLock lock(&mu_);
    if (auto it = cache_.find(dir); it != cache_.end()) return it->second;
  }
  const std::string manifest_path = absl::StrCat(dir, "/", kManifestFileName);
  absl::StatusOr<std::string> bytes = store_->Get(manifest_path);
  // No manifest (a node part's blobs before the merge): nothing there is encoded yet.
  if (absl::IsNotFound(bytes.status())) return std::make_shared<const Encodings>();
  CKPTD_RETURN_IF_ERROR(Annotate(
      bytes.status(), absl::StrCat("reading ", manifest_path, " on ", store_->Describe())));
  CKPTD_ASSIGN_OR_RETURN(
      Manifest m, DecodeManifest(*bytes, absl::StrCat(store_->Describe(), "/", manifest_path)));
  auto encodings = std::make_shared<Encodings>();
  for (const v1::BlobInfo& b : m.header.blobs()) {
    if (b.has_encoding()) encodings->emplace(b.name(), FramesOf(b));
  }
  absl::MutexLock lock(&mu_);
  if (cache_.size() >= limits::kEncodedStoreDirsCachedMax) cache_.clear();
  cache_[dir] = encodings;
  return encodings;
}

absl::Status EncodedStore::PutAtomic(const std::string& path, std::string_view data) {
  {
    absl::MutexLock lock(&mu_);
    cache_.erase(SplitPath(path).first);
  }
  return store_->PutAtomic(path, data);
}

absl::Status EncodedStore::RemoveAll(const std::string& path) {
  {
    absl::MutexLock lock(&mu_);
    cache_.clear();  // removals are rare; a directory or anything above it may go
  }
  return store_->RemoveAll(path);
}

absl::StatusOr<v1::BlobEncoding> EncodeBlob(const EncodeBlobJob& job, BlobReader& src,
                                            BlobWriter& dst, WorkerPool* readers,
                                            std::atomic<uint64_t>* progress,
                                            const std::function<bool()>& stop) {
  CKPTD_CHECK(job.chunk_bytes > 0 && job.piece_bytes % job.chunk_bytes == 0 &&
              job.piece_bytes % limits::kAlignmentBytes == 0);
  CKPTD_CHECK(job.planes.size() == (job.size_bytes + job.chunk_bytes - 1) / job.chunk_bytes);
  if (src.size_bytes() < job.size_bytes) {
    return absl::DataLossError(absl::StrCat(job.path, " is ", src.size_bytes(),
                                            " bytes; its manifest says ", job.size_bytes));
  }
  const uint64_t piece = std::min(job.piece_bytes, RoundUp(job.size_bytes, job.chunk_bytes));
  const std::string what = absl::StrCat("reading ", job.path, " from local storage");
  AlignedBuffer bufs[2] = {AllocateAligned(RoundUp(piece, limits::kAlignmentBytes)),
                           job.size_bytes > piece
                               ? AllocateAligned(RoundUp(piece, limits::kAlignmentBytes))
                               : AlignedBuffer()};
  if (bufs[0] == nullptr || (job.size_bytes > piece && bufs[1] == nullptr)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("encoding ", job.path, ": no memory for two ", piece, "-byte buffers"));
  }
  // Destroyed before the buffers: an early return waits for the read in flight.
  struct ReadAhead {
    std::future<absl::Status> done;
    ~ReadAhead() {
      if (done.valid()) done.wait();
    }
  } ahead;
  BlobReader* const r = &src;
  auto start_read = [&](int buf, uint64_t off) -> absl::Status {
    // Whole pages (O_DIRECT), never past the source's end.
    const uint64_t len =
        std::min(RoundUp(std::min(piece, job.size_bytes - off), limits::kAlignmentBytes),
                 src.size_bytes() - off);
    IoSlice slice{bufs[buf].get(), len, off};
    CKPTD_ASSIGN_OR_RETURN(
        ahead.done,
        Annotate(
            readers->Submit([r, slice] { return r->Read(std::span<const IoSlice>(&slice, 1)); },
                            WorkerPool::WhenFull::kWait),
            what));
    return absl::OkStatus();
  };
  ChunkEncoder encoder(job.zstd_level);
  v1::BlobEncoding enc;
  enc.set_codec(kBlobCodecCkc1);
  enc.set_chunk_bytes(static_cast<uint32_t>(job.chunk_bytes));
  std::string frames;
  uint64_t written = 0;
  if (job.size_bytes > 0) CKPTD_RETURN_IF_ERROR(start_read(0, 0));
  int cur = 0;
  for (uint64_t off = 0; off < job.size_bytes;) {
    CKPTD_RETURN_IF_ERROR(Annotate(ahead.done.get(), what));
    const uint64_t len = std::min(piece, job.size_bytes - off);
    if (off + len < job.size_bytes) CKPTD_RETURN_IF_ERROR(start_read(1 - cur, off + len));
    if (stop && stop())
      return absl::CancelledError(absl::StrCat("upload of ", job.path, " stopped"));
    CKPTD_RETURN_IF_ERROR(EncodePiece(job, encoder, bufs[cur].get(), off, len, &frames, &enc));
    IoSlice slice{frames.data(), frames.size(), written};
    CKPTD_RETURN_IF_ERROR(dst.Write(std::span<const IoSlice>(&slice, 1)));
    written += frames.size();
    if (progress != nullptr) *progress += len;
    off += len;
    cur = 1 - cur;
  }
  CKPTD_RETURN_IF_ERROR(dst.Sync());
  enc.set_encoded_bytes(written);
  return enc;
}

}  // namespace ckptd
