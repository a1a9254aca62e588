#include "checkpoint/reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "checkpoint/crc32c.h"
#include "checkpoint/fs_util.h"
#include "common/error.h"

namespace railyard::ckpt {

namespace fs = std::filesystem;

namespace {

class FdCache {
 public:
  explicit FdCache(std::string dir) : dir_(std::move(dir)) {}
  ~FdCache() {
    for (auto& [name, fd] : fds_) ::close(fd);
  }
  FdCache(const FdCache&) = delete;
  FdCache& operator=(const FdCache&) = delete;
  int get(const std::string& file, const std::string& label) {
    auto it = fds_.find(file);
    if (it != fds_.end()) return it->second;
    int fd = ::open((dir_ + "/" + file).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(label + ": shard " + file + ": cannot open: " + detail::errno_text(errno));
    fds_[file] = fd;
    return fd;
  }

 private:
  std::string dir_;
  std::map<std::string, int> fds_;
};

// When `inner` (inside `outer`) is one contiguous run of outer's row-major layout: its first element's index.
std::optional<int64_t> contiguous_offset(const Box& inner, const Box& outer) {
  const size_t nd = inner.size.size();
  size_t k = 0;  // dimensions before k have extent 1 in inner; dimensions after k are full
  while (k < nd && inner.size[k] == 1) ++k;
  for (size_t d = k + 1; d < nd; ++d) {
    if (inner.size[d] != outer.size[d]) return std::nullopt;
  }
  int64_t index = 0;
  for (size_t d = 0; d < nd; ++d) index = index * outer.size[d] + (inner.offset[d] - outer.offset[d]);
  return index;
}

std::string base_name(const std::string& path) { return fs::path(path).filename().string(); }

// Files present with the sizes the manifest records; returns problems.
std::vector<std::string> check_files(const std::string& step_dir, const Manifest& m) {
  std::vector<std::string> problems;
  const std::string label = base_name(step_dir);
  for (const auto& [file, bytes] : m.files) {
    std::error_code ec;
    auto size = fs::file_size(step_dir + "/" + file, ec);
    if (ec) {
      problems.push_back(label + ": shard " + file + " is missing (" + ec.message() + ")");
    } else if (size != bytes) {
      problems.push_back(label + ": shard " + file + " has " + std::to_string(size) + " bytes, manifest says " +
                         std::to_string(bytes) + (size < bytes ? " (truncated)" : ""));
    }
  }
  return problems;
}

// Reads one slice into buf and checks its checksum.
void read_slice(FdCache& fds, const std::string& label, const SliceRecord& s, std::vector<unsigned char>& buf) {
  buf.resize(s.bytes);
  int fd = fds.get(s.file, label);
  try {
    detail::pread_all(fd, buf.data(), s.bytes, s.offset, s.file);
  } catch (const Error& e) {
    throw Error(label + ": shard " + s.file + ": slice " + slice_label(s) + ": " + e.what());
  }
  if (crc32c(buf.data(), buf.size()) != s.crc32c) {
    throw Error(label + ": shard " + s.file + ": CRC32C mismatch at slice " + slice_label(s));
  }
}

}  // namespace

std::vector<CheckpointInfo> list_checkpoints(const std::string& root) {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    CheckpointInfo info;
    info.name = name;
    size_t dot = name.find('.');
    auto step = parse_step_dir(name.substr(0, dot));
    if (!step) continue;
    info.step = *step;
    if (dot != std::string::npos) {
      info.temporary = true;
      info.problem = name.find(".tmp-") != std::string::npos ? "not committed (save in progress or abandoned)"
                                                             : "leftover of a replaced checkpoint";
    } else {
      const std::string m = entry.path().string() + "/" + kManifestName;
      if (!detail::exists(m)) {
        info.problem = "incomplete: no manifest.json";
      } else {
        try {
          Manifest man = parse_manifest(read_file(m), m);
          auto problems = check_files(entry.path().string(), man);
          if (problems.empty()) {
            info.complete = true;
          } else {
            info.problem = problems.front();
          }
        } catch (const Error& e) {
          info.problem = e.what();
        }
      }
    }
    for (const auto& f : fs::directory_iterator(entry.path(), ec)) {
      if (f.is_regular_file()) info.bytes += f.file_size(ec);
    }
    struct stat st;
    if (::stat(entry.path().c_str(), &st) == 0) info.modified = st.st_mtime;
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.step != b.step ? a.step < b.step : a.name < b.name; });
  return out;
}

std::string committed_dir_name(const std::string& root, int64_t step) {
  const std::string name = step_dir_name(step);
  if (detail::exists(root + "/" + name)) return name;
  // A writer on a file system without RENAME_EXCHANGE that died between moving the old copy of a re-saved step
  // aside and moving the new one in: the old copy is still the committed step (the next writer puts it back).
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string n = entry.path().filename().string();
    if (n.rfind(name + ".old-", 0) == 0 && detail::exists(entry.path().string() + "/" + kManifestName)) return n;
  }
  return name;
}

VerifyReport verify_checkpoint(const std::string& root, int64_t step, bool checksums) {
  VerifyReport r;
  r.step = step;
  const std::string label = committed_dir_name(root, step);
  const std::string dir = root + "/" + label;
  Manifest m;
  try {
    const std::string path = dir + "/" + kManifestName;
    if (!detail::exists(path)) throw Error(label + ": incomplete: no manifest.json");
    m = parse_manifest(read_file(path), label + "/" + kManifestName);
    validate_coverage(m);
  } catch (const Error& e) {
    r.ok = false;
    r.problems.push_back(e.what());
    return r;
  }
  auto file_problems = check_files(dir, m);
  r.problems.insert(r.problems.end(), file_problems.begin(), file_problems.end());
  if (checksums) {
    FdCache fds(dir);
    std::vector<unsigned char> buf;
    for (const auto& s : m.slices) {
      try {
        read_slice(fds, label, s, buf);
        r.bytes_checked += s.bytes;
      } catch (const Error& e) {
        r.problems.push_back(e.what());
      }
    }
  }
  r.ok = r.problems.empty();
  return r;
}

uint64_t load_from_manifest(const std::string& step_dir, const Manifest& m, const std::vector<LoadTarget>& targets) {
  const std::string label = base_name(step_dir);
  struct Use {
    size_t target;
    Box region;
  };
  std::vector<std::vector<Use>> uses(m.slices.size());
  std::vector<int64_t> covered(targets.size(), 0);
  for (size_t ti = 0; ti < targets.size(); ++ti) {
    const LoadTarget& t = targets[ti];
    const TensorRecord* rec = m.find_tensor(t.name);
    if (rec == nullptr) throw Error(label + ": tensor '" + t.name + "' is not in the checkpoint");
    if (rec->dtype != t.dtype) {
      throw Error(label + ": tensor '" + t.name + "' is " + std::string(dtype_name(rec->dtype)) + ", asked for " +
                  std::string(dtype_name(t.dtype)));
    }
    if (!box_within(t.box, rec->shape)) {
      throw Error(label + ": tensor '" + t.name + "': requested box " + box_to_string(t.box) + " is outside " +
                  shape_to_string(rec->shape));
    }
    if (t.data == nullptr && t.box.volume() > 0) throw Error("load target '" + t.name + "' has no destination");
    for (size_t si = 0; si < m.slices.size(); ++si) {
      if (m.slices[si].tensor != t.name) continue;
      if (auto region = intersect(m.slices[si].box, t.box)) {
        covered[ti] += region->volume();
        uses[si].push_back({ti, *region});
      }
    }
    if (covered[ti] != t.box.volume()) {
      throw Error(label + ": tensor '" + t.name + "' box " + box_to_string(t.box) + ": stored slices cover " +
                  std::to_string(covered[ti]) + " of " + std::to_string(t.box.volume()) + " elements");
    }
  }
  // Read in file order so each shard is read sequentially.
  std::vector<size_t> order;
  for (size_t si = 0; si < m.slices.size(); ++si) {
    if (!uses[si].empty()) order.push_back(si);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = m.slices[a], &y = m.slices[b];
    return x.file != y.file ? x.file < y.file : x.offset < y.offset;
  });
  FdCache fds(step_dir);
  std::vector<unsigned char> buf;
  uint64_t bytes = 0;
  for (size_t si : order) {
    const SliceRecord& s = m.slices[si];
    // Common case (same layout, or a slice that is one contiguous run of the destination): read straight into
    // place and checksum there. On a mismatch the destination holds junk, but the load fails and whichever
    // checkpoint loads next overwrites every element of every target.
    if (uses[si].size() == 1 && uses[si][0].region == s.box) {
      const LoadTarget& t = targets[uses[si][0].target];
      if (auto at = contiguous_offset(s.box, t.box)) {
        unsigned char* dst = static_cast<unsigned char*>(t.data) + *at * static_cast<int64_t>(dtype_size(t.dtype));
        try {
          detail::pread_all(fds.get(s.file, label), dst, s.bytes, s.offset, s.file);
        } catch (const Error& e) {
          throw Error(label + ": shard " + s.file + ": slice " + slice_label(s) + ": " + e.what());
        }
        if (crc32c(dst, s.bytes) != s.crc32c) {
          throw Error(label + ": shard " + s.file + ": CRC32C mismatch at slice " + slice_label(s));
        }
        bytes += s.bytes;
        continue;
      }
    }
    read_slice(fds, label, s, buf);
    bytes += s.bytes;
    for (const Use& u : uses[si]) {
      const LoadTarget& t = targets[u.target];
      copy_region(buf.data(), s.box, t.data, t.box, u.region, dtype_size(t.dtype));
    }
  }
  return bytes;
}

std::vector<int64_t> Reader::complete_steps() const {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root_, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t old = name.find(".old-");
    auto s = parse_step_dir(old == std::string::npos ? name : name.substr(0, old));
    if (!s || !entry.is_directory() || !detail::exists(entry.path().string() + "/" + kManifestName)) continue;
    if (old != std::string::npos && committed_dir_name(root_, *s) != name) continue;  // step-N itself is there
    steps.push_back(*s);
  }
  std::sort(steps.rbegin(), steps.rend());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  return steps;
}

std::optional<int64_t> Reader::latest_pointer() const {
  const std::string p = root_ + "/" + kLatestName;
  if (!detail::exists(p)) return std::nullopt;
  try {
    std::string t = read_file(p);
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    return parse_step_dir(t);
  } catch (const Error&) {
    return std::nullopt;
  }
}

Manifest Reader::read_manifest(int64_t step) const {
  const std::string label = committed_dir_name(root_, step);
  const std::string path = root_ + "/" + label + "/" + kManifestName;
  if (!detail::exists(path)) throw Error(label + ": incomplete: no manifest.json");
  return parse_manifest(read_file(path), label + "/" + kManifestName);
}

std::optional<int64_t> Reader::newest_valid_step(std::vector<std::string>* skipped) const {
  for (int64_t step : complete_steps()) {
    VerifyReport v = verify_checkpoint(root_, step, true);
    if (v.ok) return step;
    if (skipped != nullptr) skipped->push_back(v.problems.front());
  }
  return std::nullopt;
}

LoadResult Reader::load_step(int64_t step, const std::vector<LoadTarget>& targets) const {
  LoadResult r;
  r.manifest = read_manifest(step);
  const std::string dir = root_ + "/" + committed_dir_name(root_, step);
  auto problems = check_files(dir, r.manifest);
  if (!problems.empty()) throw Error(problems.front());
  r.bytes_read = load_from_manifest(dir, r.manifest, targets);
  r.step = step;
  return r;
}

LoadResult Reader::load_latest(const std::vector<LoadTarget>& targets, const LoadOptions& options) const {
  std::vector<int64_t> steps = complete_steps();
  // Everything passed over, with its step, so the result lists what is newer than the step loaded.
  std::vector<std::pair<int64_t, std::string>> passed;
  if (auto lp = latest_pointer(); lp && std::find(steps.begin(), steps.end(), *lp) == steps.end()) {
    passed.emplace_back(*lp, step_dir_name(*lp) + ": named by 'latest' but not a complete checkpoint directory");
  }
  for (const auto& info : list_checkpoints(root_)) {
    if (!info.complete && !detail::exists(root_ + "/" + info.name + "/" + kManifestName)) {
      passed.emplace_back(info.step, info.name + ": " + info.problem);
    }
  }
  auto report = [&](int64_t loaded) {
    std::stable_sort(passed.begin(), passed.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::string> out;
    for (const auto& [step, why] : passed) {
      if (step > loaded) out.push_back(why);
    }
    return out;
  };
  for (int64_t step : steps) {
    if (options.max_step && step > *options.max_step) continue;
    try {
      if (options.full_verify) {
        VerifyReport v = verify_checkpoint(root_, step, true);
        if (!v.ok) throw Error(v.problems.front());
      }
      LoadResult r = load_step(step, targets);
      r.skipped = report(step);
      return r;
    } catch (const Error& e) {
      passed.emplace_back(step, e.what());
    }
  }
  std::string all;
  for (const auto& s : report(-1)) all += "\n  " + s;
  throw Error("no loadable checkpoint under " + root_ + (all.empty() ? ": the directory holds none" : ":" + all));
}

}  // namespace railyard::ckpt
