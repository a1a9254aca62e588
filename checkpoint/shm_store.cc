#include "checkpoint/shm_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>

#include "checkpoint/crc32c.h"
#include "checkpoint/fs_util.h"
#include "common/error.h"

namespace railyard::ckpt {
namespace {

constexpr char kMagic[8] = {'R', 'Y', 'C', 'K', 'S', 'H', 'M', '1'};
// Version 1: the C++ writers' images, checksummed with CRC32C. Version 2: the same layout written by the Python flash
// checkpoint module (worker/agent/python/railyard_flash.py), checksummed with zlib's CRC-32, which Python computes at
// memory speed (zlib.crc32) where a CRC32C would need a compiled extension. Both are read, copied and verified alike.
constexpr uint32_t kVersion = 1;
constexpr uint32_t kVersionZlib = 2;
constexpr uint32_t kStateWriting = 1;
constexpr uint32_t kStateComplete = 2;
constexpr uint64_t kHeaderBytes = 4096;

struct Header {
  char magic[8];
  uint32_t version;
  uint32_t state;       // written last (release) when complete; kStateWriting while a put runs
  uint64_t generation;  // bumped by every put, so a reader can notice a put that ran while it read
  int64_t step;
  uint64_t meta_bytes;
  uint64_t data_offset;
  uint64_t data_bytes;
  uint32_t crc;         // CRC32C of meta and data
  uint32_t header_crc;  // CRC32C of the fields above, state set to complete
};
static_assert(sizeof(Header) <= kHeaderBytes);

bool known_version(uint32_t v) { return v == kVersion || v == kVersionZlib; }

// The checksum of an image of version v: CRC32C (1) or zlib's CRC-32 (2), extending `crc` like crc32c() does.
uint32_t checksum(uint32_t version, const void* data, uint64_t size, uint32_t crc = 0) {
  if (version != kVersionZlib) return crc32c(data, size, crc);
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (size > 0) {  // crc32() takes a uInt length
    const uInt n = static_cast<uInt>(std::min<uint64_t>(size, 1u << 30));
    c = ::crc32(c, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(c);
}

std::string version_problem(uint32_t v) {
  return "version " + std::to_string(v) + " not supported (this build reads 1 and 2)";
}

uint32_t header_crc(Header h) {
  h.state = kStateComplete;
  h.header_crc = 0;
  return checksum(h.version, &h, offsetof(Header, header_crc));
}

// The checksum over an image's metadata and data (not the padding between them), as its version computes it.
uint32_t contents_crc(const Header& h, const unsigned char* base) {
  const uint32_t crc = checksum(h.version, base + kHeaderBytes, h.meta_bytes);
  return checksum(h.version, base + h.data_offset, h.data_bytes, crc);
}

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The header's sizes against the bytes there are: "" when metadata and data lie inside `size` bytes, else the reason.
// Every sum is checked for overflow first (the fields are read from memory another process wrote).
std::string header_size_problem(const Header& h, uint64_t size) {
  if (h.meta_bytes > size || kHeaderBytes > size - h.meta_bytes) {
    return "metadata of " + std::to_string(h.meta_bytes) + " bytes exceeds the segment's " + std::to_string(size);
  }
  if (h.data_offset < kHeaderBytes + h.meta_bytes) return "data offset overlaps the metadata";
  if (h.data_offset > size || h.data_bytes > size - h.data_offset) {
    return "data at " + std::to_string(h.data_offset) + " + " + std::to_string(h.data_bytes) +
           " bytes exceeds the segment's " + std::to_string(size);
  }
  return "";
}

// The bytes of a box's dense contents, or nullopt when the count does not fit 64 bits.
std::optional<uint64_t> box_bytes(const Box& b, size_t elem_size) {
  uint64_t v = elem_size;
  for (int64_t s : b.size) {
    if (s < 0 || __builtin_mul_overflow(v, static_cast<uint64_t>(s), &v)) return std::nullopt;
  }
  return v;
}

}  // namespace

ShmStore::ShmStore(std::string name) : name_(std::move(name)) {
  if (name_.size() < 2 || name_[0] != '/' || name_.find('/', 1) != std::string::npos || name_.size() > 250) {
    throw ConfigError("shared-memory name '" + name_ + "' must be '/' followed by a name without '/' (see name_for)");
  }
}

ShmStore::~ShmStore() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  if (fd_ >= 0) ::close(fd_);
}

std::string ShmStore::name_for(std::string_view job, int rank) {
  std::string s = "/railyard-";
  for (char c : job) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  return s + "-r" + std::to_string(rank);
}

void ShmStore::remove(const std::string& name) { ::shm_unlink(name.c_str()); }

int ShmStore::remove_prefix(const std::string& prefix) {
  if (prefix.size() < 2 || prefix[0] != '/' || prefix.find('/', 1) != std::string::npos) return 0;
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    std::string n(1, '/');
    n.append(e.path().filename().string());
    if (n.compare(0, prefix.size(), prefix) == 0 && ::shm_unlink(n.c_str()) == 0) ++removed;
  }
  return removed;
}

std::optional<int64_t> ShmStore::peek(std::string* why, uint64_t* writes) const {
  auto fail = [&](const std::string& reason) -> std::optional<int64_t> {
    if (why != nullptr) *why = "shared memory " + name_ + ": " + reason;
    return std::nullopt;
  };
  int fd = ::shm_open(name_.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return fail("no snapshot (" + detail::errno_text(errno) + ")");
  Header h{};
  const ssize_t n = ::pread(fd, &h, sizeof h, 0);
  ::close(fd);
  if (n != static_cast<ssize_t>(sizeof h)) return fail("segment smaller than its header: torn or never written");
  if (h.state != kStateComplete) return fail("torn snapshot: a writer started but did not finish");
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return fail("bad magic: not a railyard snapshot");
  if (!known_version(h.version)) return fail(version_problem(h.version));
  if (h.header_crc != header_crc(h)) return fail("torn snapshot: header checksum mismatch");
  if (writes != nullptr) *writes = h.generation;
  return h.step;
}

void ShmStore::reserve(uint64_t total) {
  if (fd_ < 0) {
    fd_ = ::shm_open(name_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd_ < 0) throw Error("shm_open " + name_ + ": " + detail::errno_text(errno));
  }
  struct stat st;
  if (::fstat(fd_, &st) != 0) throw Error("fstat " + name_ + ": " + detail::errno_text(errno));
  if (static_cast<uint64_t>(st.st_size) < total) {
    // Reserve the pages now: writing into an unbacked page of a full tmpfs would kill us with SIGBUS.
    int rc = ::posix_fallocate(fd_, 0, static_cast<off_t>(total));
    if (rc != 0) {
      throw Error("shared memory " + name_ + ": cannot reserve " + std::to_string(total) +
                  " bytes: " + detail::errno_text(rc) + " (is /dev/shm large enough?)");
    }
  }
  if (map_ == nullptr || map_size_ < total) {
    if (map_ != nullptr) ::munmap(map_, map_size_);
    map_ = nullptr;
    if (::fstat(fd_, &st) != 0) throw Error("fstat " + name_ + ": " + detail::errno_text(errno));
    map_size_ = static_cast<uint64_t>(st.st_size);
    void* p = ::mmap(nullptr, map_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw Error("mmap " + name_ + ": " + detail::errno_text(errno));
    map_ = p;
  }
}

void ShmStore::put(int64_t step, const std::vector<TensorShard>& shards, const nlohmann::json& state) {
  nlohmann::json meta;
  meta["state"] = state;
  meta["tensors"] = nlohmann::json::array();
  meta["slices"] = nlohmann::json::array();
  uint64_t data_bytes = 0;
  for (const auto& s : shards) {
    if (!box_within(s.box, s.global_shape)) {
      throw Error("shared-memory snapshot: tensor '" + s.name + "' box " + box_to_string(s.box) +
                  " is outside its shape " + shape_to_string(s.global_shape));
    }
    const uint64_t bytes = static_cast<uint64_t>(s.box.volume()) * dtype_size(s.dtype);
    meta["tensors"].push_back(
        {{"name", s.name}, {"dtype", std::string(dtype_name(s.dtype))}, {"shape", s.global_shape}});
    meta["slices"].push_back(
        {{"tensor", s.name}, {"offset", s.box.offset}, {"size", s.box.size}, {"at", data_bytes}, {"bytes", bytes}});
    data_bytes = align_up(data_bytes + bytes, 64);
  }
  const std::string meta_text = meta.dump();
  const uint64_t data_offset = align_up(kHeaderBytes + meta_text.size(), 4096);
  const uint64_t total = data_offset + data_bytes;

  reserve(total);
  auto* base = static_cast<unsigned char*>(map_);
  auto* h = reinterpret_cast<Header*>(base);
  __atomic_store_n(&h->state, kStateWriting, __ATOMIC_SEQ_CST);
  const uint64_t generation = h->generation + 1;
  __atomic_store_n(&h->generation, generation, __ATOMIC_SEQ_CST);
  std::memcpy(base + kHeaderBytes, meta_text.data(), meta_text.size());
  uint64_t at = 0;
  for (const auto& s : shards) {
    const uint64_t bytes = static_cast<uint64_t>(s.box.volume()) * dtype_size(s.dtype);
    if (bytes > 0) std::memcpy(base + data_offset + at, s.data, bytes);
    at = align_up(at + bytes, 64);
  }
  Header nh{};
  std::memcpy(nh.magic, kMagic, sizeof kMagic);
  nh.version = kVersion;
  nh.state = kStateWriting;
  nh.generation = generation;
  nh.step = step;
  nh.meta_bytes = meta_text.size();
  nh.data_offset = data_offset;
  nh.data_bytes = data_bytes;
  uint32_t crc = crc32c(base + kHeaderBytes, meta_text.size());
  nh.crc = crc32c(base + data_offset, data_bytes, crc);
  nh.header_crc = header_crc(nh);
  std::memcpy(h, &nh, sizeof nh);
  __atomic_store_n(&h->state, kStateComplete, __ATOMIC_RELEASE);
}

std::optional<int64_t> ShmStore::get(const std::vector<LoadTarget>& targets, nlohmann::json* state, std::string* why,
                                     bool verify) const {
  const std::unique_ptr<Image> img = map_image(why);  // checks the state word, the header and its sizes
  if (!img) return std::nullopt;
  // The image's bytes are parsed under the header as it was validated when mapped (the live one may change under a
  // new put; the generation check below then rejects what was read).
  auto step = read_image(name_, img->data(), img->map_size_, targets, state, why, verify);
  if (!step) return std::nullopt;
  // A put that started while we copied would have bumped the generation.
  if (!img->unchanged()) {
    if (why != nullptr) *why = "shared memory " + name_ + ": torn snapshot: overwritten while reading";
    return std::nullopt;
  }
  return step;
}

std::optional<int64_t> ShmStore::read_image(const std::string& name, const unsigned char* base, uint64_t size,
                                            const std::vector<LoadTarget>& targets, nlohmann::json* state,
                                            std::string* why, bool verify) {
  auto fail = [&](const std::string& reason) -> std::optional<int64_t> {
    if (why != nullptr) *why = "shared memory " + name + ": " + reason;
    return std::nullopt;
  };
  if (size < kHeaderBytes) return fail("segment smaller than its header: torn or never written");
  Header h;
  std::memcpy(&h, base, sizeof h);
  if (h.state != kStateComplete) return fail("torn snapshot: a writer started but did not finish");
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return fail("bad magic: not a railyard snapshot");
  if (!known_version(h.version)) return fail(version_problem(h.version));
  if (h.header_crc != header_crc(h)) return fail("torn snapshot: header checksum mismatch");
  if (const std::string p = header_size_problem(h, size); !p.empty()) {
    return fail("torn snapshot: header sizes exceed the segment: " + p);
  }
  if (verify && contents_crc(h, base) != h.crc) {
    return fail(std::string(h.version == kVersionZlib ? "CRC-32" : "CRC32C") +
                " mismatch over the snapshot contents (step " + std::to_string(h.step) + ")");
  }
  nlohmann::json meta = nlohmann::json::parse(base + kHeaderBytes, base + kHeaderBytes + h.meta_bytes, nullptr, false);
  if (meta.is_discarded() || !meta.is_object()) return fail("snapshot metadata is not a JSON object");
  const unsigned char* data = base + h.data_offset;
  try {
    for (const auto& t : targets) {
      const nlohmann::json* tensor = nullptr;
      for (const auto& tj : meta.at("tensors")) {
        if (tj.at("name") == t.name) tensor = &tj;
      }
      if (tensor == nullptr) return fail("tensor '" + t.name + "' not stored");
      const DType dtype = parse_dtype(tensor->at("dtype").get<std::string>());
      if (dtype != t.dtype) return fail("tensor '" + t.name + "' dtype differs");
      const Shape shape = tensor->at("shape").get<Shape>();
      const size_t es = dtype_size(dtype);
      int64_t covered = 0;
      for (const auto& sj : meta.at("slices")) {
        if (sj.at("tensor") != t.name) continue;
        const Box b{sj.at("offset").get<Shape>(), sj.at("size").get<Shape>()};
        const uint64_t at = sj.at("at").get<uint64_t>(), bytes = sj.at("bytes").get<uint64_t>();
        const std::string what = "slice " + box_to_string(b) + " of '" + t.name + "'";
        // Every number below comes from the image: the box must lie in the tensor's shape (so its volume cannot
        // overflow), its bytes must be what the box needs (copy_region reads volume * element size), and those bytes
        // must lie inside the data section, hence inside the mapping.
        if (b.offset.size() != shape.size() || b.size.size() != shape.size() || !box_within(b, shape)) {
          return fail(what + " is not inside the tensor's shape " + shape_to_string(shape));
        }
        if (b.offset.size() != t.box.offset.size()) {
          return fail(what + " has " + std::to_string(b.offset.size()) + " dimensions, the target box " +
                      std::to_string(t.box.offset.size()));
        }
        const auto need = box_bytes(b, es);
        if (!need || bytes != *need) {
          return fail(what + " holds " + std::to_string(bytes) + " bytes, its box needs " +
                      (need ? std::to_string(*need) : std::string("more than 2^64")));
        }
        if (at > h.data_bytes || bytes > h.data_bytes - at) {
          return fail(what + " at " + std::to_string(at) + " + " + std::to_string(bytes) +
                      " bytes lies outside the segment's data section (" + std::to_string(h.data_bytes) + " bytes)");
        }
        if (auto region = intersect(b, t.box)) {
          copy_region(data + at, b, t.data, t.box, *region, es);
          covered += region->volume();
        }
      }
      if (covered != t.box.volume()) {
        return fail("tensor '" + t.name + "' box " + box_to_string(t.box) + " is not fully stored (layout changed?)");
      }
    }
    if (state != nullptr) *state = meta.value("state", nlohmann::json());
  } catch (const std::exception& e) {
    return fail(std::string("bad snapshot metadata: ") + e.what());
  }
  return h.step;
}

void ShmStore::seal_image(unsigned char* base, uint64_t size) {
  if (size < kHeaderBytes) return;
  Header h;
  std::memcpy(&h, base, sizeof h);
  if (header_size_problem(h, size).empty()) h.crc = contents_crc(h, base);
  h.header_crc = header_crc(h);
  std::memcpy(base, &h, sizeof h);
}

ShmStore::Image::~Image() {
  if (base_ != nullptr) ::munmap(const_cast<unsigned char*>(base_), map_size_);
}

bool ShmStore::Image::unchanged() const {
  const auto* h = reinterpret_cast<const Header*>(base_);
  return __atomic_load_n(&h->generation, __ATOMIC_ACQUIRE) == generation_ &&
         __atomic_load_n(&h->state, __ATOMIC_ACQUIRE) == kStateComplete;
}

std::unique_ptr<ShmStore::Image> ShmStore::map_image(std::string* why) const {
  auto fail = [&](const std::string& reason) -> std::unique_ptr<Image> {
    if (why != nullptr) *why = "shared memory " + name_ + ": " + reason;
    return nullptr;
  };
  int fd = ::shm_open(name_.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return fail("no snapshot (" + detail::errno_text(errno) + ")");
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < kHeaderBytes) {
    ::close(fd);
    return fail("segment smaller than its header: torn or never written");
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return fail("mmap: " + detail::errno_text(errno));
  std::unique_ptr<Image> img(new Image());
  img->base_ = static_cast<const unsigned char*>(p);
  img->map_size_ = size;
  const auto* hp = reinterpret_cast<const Header*>(img->base_);
  if (__atomic_load_n(&hp->state, __ATOMIC_ACQUIRE) != kStateComplete) {
    return fail("torn snapshot: a writer started but did not finish (state word not complete)");
  }
  Header h;
  std::memcpy(&h, hp, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return fail("bad magic: not a railyard snapshot");
  if (!known_version(h.version)) return fail(version_problem(h.version));
  if (h.header_crc != header_crc(h)) return fail("torn snapshot: header checksum mismatch");
  if (const std::string problem = header_size_problem(h, size); !problem.empty()) {
    return fail("torn snapshot: header sizes exceed the segment: " + problem);
  }
  img->size_ = h.data_offset + h.data_bytes;
  img->generation_ = h.generation;
  img->step_ = h.step;
  img->meta_bytes_ = h.meta_bytes;
  img->data_offset_ = h.data_offset;
  img->data_bytes_ = h.data_bytes;
  img->crc_ = h.crc;
  return img;
}

void ShmStore::begin_image(uint64_t size) {
  if (size < kHeaderBytes) {
    throw Error("shared memory " + name_ + ": a copy of " + std::to_string(size) + " bytes is smaller than a header");
  }
  reserve(size);
  auto* h = static_cast<Header*>(map_);
  __atomic_store_n(&h->state, kStateWriting, __ATOMIC_SEQ_CST);
  __atomic_store_n(&h->generation, h->generation + 1, __ATOMIC_SEQ_CST);
  image_size_ = size;
  image_at_ = 0;
  image_header_.assign(kHeaderBytes, 0);
}

void ShmStore::write_image(const void* data, size_t n) {
  if (image_at_ + n > image_size_) {
    throw Error("shared memory " + name_ + ": copy longer than the " + std::to_string(image_size_) +
                " bytes announced");
  }
  const auto* src = static_cast<const unsigned char*>(data);
  // The header goes to a side buffer, not the segment: its state word says "complete", which must be written last.
  if (image_at_ < kHeaderBytes) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(n, kHeaderBytes - image_at_));
    std::memcpy(image_header_.data() + image_at_, src, k);
    image_at_ += k;
    src += k;
    n -= k;
  }
  if (n == 0) return;
  std::memcpy(static_cast<unsigned char*>(map_) + image_at_, src, n);
  image_at_ += n;
}

std::optional<int64_t> ShmStore::commit_image(std::string* why) {
  auto fail = [&](const std::string& reason) -> std::optional<int64_t> {
    if (why != nullptr) *why = "copy into shared memory " + name_ + ": " + reason;
    return std::nullopt;
  };
  if (image_at_ != image_size_) {
    return fail("torn copy: " + std::to_string(image_at_) + " of " + std::to_string(image_size_) + " bytes received");
  }
  Header h;
  std::memcpy(&h, image_header_.data(), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return fail("bad magic: not a railyard snapshot");
  if (!known_version(h.version)) return fail(version_problem(h.version));
  if (h.state != kStateComplete || h.header_crc != header_crc(h)) return fail("header checksum mismatch");
  if (!header_size_problem(h, image_size_).empty() || h.data_offset + h.data_bytes != image_size_) {
    return fail("header sizes do not match the " + std::to_string(image_size_) + " bytes received");
  }
  // The same ranges put() checksums (metadata and data, not the padding between them).
  const auto* base = static_cast<const unsigned char*>(map_);
  if (contents_crc(h, base) != h.crc) {
    return fail(std::string(h.version == kVersionZlib ? "CRC-32" : "CRC32C") +
                " mismatch over the copied contents (step " + std::to_string(h.step) + ")");
  }
  auto* hp = static_cast<Header*>(map_);
  h.generation = __atomic_load_n(&hp->generation, __ATOMIC_ACQUIRE);  // this segment's own count of writes
  h.state = kStateWriting;
  h.header_crc = header_crc(h);
  std::memcpy(hp, &h, sizeof h);
  __atomic_store_n(&hp->state, kStateComplete, __ATOMIC_RELEASE);
  image_size_ = image_at_ = 0;
  return h.step;
}

}  // namespace railyard::ckpt
