#include "checkpoint/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "checkpoint/crc32c.h"
#include "checkpoint/fs_util.h"
#include "checkpoint/reader.h"
#include "common/error.h"
#include "common/log.h"

namespace railyard::ckpt {

namespace fs = std::filesystem;
using detail::errno_text;

namespace {

constexpr uint64_t kAlign = 64;  // slices start on cache-line boundaries in shard files and snapshot buffers

uint64_t align_up(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string done_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.done", rank);
  return buf;
}

std::string failed_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.failed", rank);
  return buf;
}

// Parses "step-00001000.tmp-RUN" into (step, RUN).
bool parse_temp_dir(const std::string& name, int64_t* step, std::string* run) {
  size_t dot = name.find(".tmp-");
  if (dot == std::string::npos) return false;
  auto s = parse_step_dir(name.substr(0, dot));
  if (!s) return false;
  *step = *s;
  *run = name.substr(dot + 5);
  return true;
}

std::optional<int64_t> latest_step(const std::string& root) {
  std::error_code ec;
  if (!fs::exists(root + "/" + kLatestName, ec)) return std::nullopt;
  try {
    std::string t = read_file(root + "/" + kLatestName);
    while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
    return parse_step_dir(t);
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

std::string_view save_state_name(SaveState s) {
  switch (s) {
    case SaveState::Queued:
      return "queued";
    case SaveState::Persisting:
      return "persisting";
    case SaveState::Committed:
      return "committed";
    case SaveState::Failed:
      return "failed";
  }
  return "?";
}

std::string temp_dir_name(int64_t step, const std::string& run_id) { return step_dir_name(step) + ".tmp-" + run_id; }

Box replica_part(const Box& box, int index, int replicas) {
  if (replicas <= 1) return box;
  if (box.size.empty()) return index == 0 ? box : Box{{0}, {0}};
  int dim = static_cast<int>(std::max_element(box.size.begin(), box.size.end()) - box.size.begin());
  return split_box(box, dim, replicas, index);
}

uint64_t snapshot_bytes(const std::vector<TensorShard>& shards) {
  uint64_t total = 0;
  for (const auto& s : shards) {
    Box part = replica_part(s.box, s.replica_index, s.num_replicas);
    total = align_up(total + static_cast<uint64_t>(part.volume()) * dtype_size(s.dtype));
  }
  return total;
}

// ---------------------------------------------------------------------------------------------------------------
// FsCoordinator

std::vector<RankRecord> FsCoordinator::gather(const std::string& tmp_dir, const RankRecord& mine, int world_size,
                                              Clock::time_point deadline) {
  detail::write_file_durable(tmp_dir + "/" + done_name(mine.rank), to_json(mine).dump(), true);
  if (mine.rank != 0) return {};
  std::vector<RankRecord> records(static_cast<size_t>(world_size));
  std::vector<bool> have(static_cast<size_t>(world_size), false);
  have[0] = true;
  records[0] = mine;
  while (true) {
    std::string missing;
    for (int r = 1; r < world_size; ++r) {
      if (have[static_cast<size_t>(r)]) continue;
      std::string failed = tmp_dir + "/" + failed_name(r);
      if (detail::exists(failed)) {
        std::string why;
        try {
          why = read_file(failed);
        } catch (const Error&) {
        }
        throw Error("rank " + std::to_string(r) + " failed to write its shard: " + why);
      }
      std::string done = tmp_dir + "/" + done_name(r);
      if (detail::exists(done)) {
        auto rec = rank_record_from_json(nlohmann::json::parse(read_file(done), nullptr, false), done);
        if (rec.rank != r || rec.step != mine.step || rec.run_id != mine.run_id) {
          throw Error(done + ": record is for rank " + std::to_string(rec.rank) + " step " + std::to_string(rec.step) +
                      " run " + rec.run_id + ", expected rank " + std::to_string(r) + " step " +
                      std::to_string(mine.step) + " run " + mine.run_id + " (are two jobs sharing the directory?)");
        }
        records[static_cast<size_t>(r)] = std::move(rec);
        have[static_cast<size_t>(r)] = true;
        continue;
      }
      if (!missing.empty()) missing.push_back(',');
      missing.append(std::to_string(r));
    }
    if (missing.empty()) return records;
    if (cancelled_) {
      throw Error("commit barrier abandoned waiting for rank(s) " + missing + " to finish step " +
                  std::to_string(mine.step) + " (this process is stopping)");
    }
    if (Clock::now() > deadline) {
      throw Error("commit barrier timed out waiting for rank(s) " + missing + " to finish step " +
                  std::to_string(mine.step) + " in " + tmp_dir);
    }
    std::this_thread::sleep_for(poll_);
  }
}

void FsCoordinator::report_failure(const std::string& tmp_dir, int rank, const std::string& error) {
  try {
    std::error_code ec;
    fs::create_directories(tmp_dir, ec);
    detail::write_file_durable(tmp_dir + "/" + failed_name(rank), error, false);
  } catch (const Error&) {
    // The directory may be gone (rank 0 aborted) or the disk full; rank 0 then times out or has already aborted.
  }
}

bool FsCoordinator::wait_commit(const std::string& step_dir, const std::string& tmp_dir, const std::string& run_id,
                                Clock::time_point deadline) {
  auto committed = [&]() {
    std::string m = step_dir + "/" + kManifestName;
    if (!detail::exists(m)) return false;
    try {
      return parse_manifest(read_file(m), m).run_id == run_id;
    } catch (const Error&) {
      return false;
    }
  };
  while (true) {
    if (committed()) return true;
    if (!detail::exists(tmp_dir)) return committed();
    if (cancelled_ || Clock::now() > deadline) return false;
    std::this_thread::sleep_for(poll_);
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Protocol pieces

RankRecord write_rank_shard(const std::string& dir, int rank, int64_t step, const std::string& run_id,
                            const std::vector<TensorRecord>& tensors, std::vector<PendingSlice>& slices,
                            bool fsync_files) {
  RankRecord rec;
  rec.rank = rank;
  rec.step = step;
  rec.run_id = run_id;
  rec.tensors = tensors;
  if (slices.empty()) return rec;
  rec.file = rank_file_name(rank);
  const std::string path = dir + "/" + rec.file;
  uint64_t offset = 0;
  for (auto& s : slices) {
    const TensorRecord* t = nullptr;
    for (const auto& tr : tensors) {
      if (tr.name == s.record.tensor) t = &tr;
    }
    if (t == nullptr) throw Error("slice of tensor " + s.record.tensor + " has no tensor record");
    s.record.file = rec.file;
    s.record.offset = offset;
    s.record.bytes = static_cast<uint64_t>(s.record.box.volume()) * dtype_size(t->dtype);
    offset = align_up(offset + s.record.bytes);
  }
  // Checksums are computed on a second thread while this one writes: persist time is then max(CRC, I/O), not the
  // sum (the CRC runs at a few GB/s, about the speed of a fast disk).
  std::thread crc_thread([&slices] {
    for (auto& s : slices) s.record.crc32c = crc32c(s.data, s.record.bytes);
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{crc_thread};
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot create " + path + ": " + errno_text(errno));
  try {
    uint64_t end = 0;
    for (const auto& s : slices) {
      detail::pwrite_all(fd, s.data, s.record.bytes, s.record.offset, path);
      end = s.record.offset + s.record.bytes;
    }
    if (fsync_files && ::fsync(fd) != 0) throw Error("fsync " + path + ": " + errno_text(errno));
    rec.file_bytes = end;
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    int e = errno;
    ::unlink(path.c_str());
    throw Error("close " + path + ": " + errno_text(e));
  }
  crc_thread.join();
  for (const auto& s : slices) rec.slices.push_back(s.record);
  return rec;
}

namespace {

// The manifest of a committed step, or nullopt when it is missing or does not parse.
std::optional<Manifest> manifest_of(const std::string& root, int64_t step) {
  const std::string path = root + "/" + step_dir_name(step) + "/" + kManifestName;
  if (!detail::exists(path)) return std::nullopt;
  try {
    return parse_manifest(read_file(path), path);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::vector<int64_t> steps_with_manifest(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    auto s = parse_step_dir(entry.path().filename().string());
    if (s && entry.is_directory() && detail::exists(entry.path().string() + "/" + kManifestName)) steps.push_back(*s);
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Throws SupersededError when `m` was written by an older generation of its job than the one `latest` names.
void check_fence(const std::string& root, const Manifest& m) {
  if (m.generation <= 0 || m.job.empty()) return;
  const auto current = current_generation(root, m.job);
  if (current && *current > m.generation) {
    throw SupersededError("generation " + std::to_string(m.generation) + " of job " + m.job +
                          " is superseded by generation " + std::to_string(*current) + " (the step 'latest' names in " +
                          root + "): step " + std::to_string(m.step) + " is not committed, nothing is deleted");
  }
}

}  // namespace

std::optional<int64_t> current_generation(const std::string& root, const std::string& job) {
  if (const auto lp = latest_step(root)) {
    if (const auto m = manifest_of(root, *lp)) {
      if (m->job != job) return std::nullopt;
      return m->generation > 0 ? std::optional<int64_t>(m->generation) : std::nullopt;
    }
  }
  // No readable `latest` (never written, or its step is damaged): the newest generation this job committed.
  std::optional<int64_t> newest;
  for (int64_t step : steps_with_manifest(root)) {
    const auto m = manifest_of(root, step);
    if (m && m->job == job && m->generation > 0 && (!newest || m->generation > *newest)) newest = m->generation;
  }
  return newest;
}

void commit_checkpoint(const std::string& root, const std::string& tmp_dir, Manifest manifest, int keep,
                       bool fsync_files) {
  validate_coverage(manifest);
  for (const auto& [file, bytes] : manifest.files) {
    std::error_code ec;
    auto size = fs::file_size(tmp_dir + "/" + file, ec);
    if (ec || size != bytes) {
      throw Error("shard " + tmp_dir + "/" + file + " is missing or has the wrong size before commit");
    }
  }
  const std::string text = serialize_manifest(manifest);
  detail::write_file_durable(tmp_dir + "/" + kManifestName, text, fsync_files);
  if (fsync_files) detail::fsync_path(tmp_dir);
  detail::crash_point("commit-manifest-written");
  // One committer at a time: the fence check and the moves below are one step for every other writer.
  detail::FileLock lock(root + "/" + kCommitLockName);
  check_fence(root, manifest);
  const std::string final_dir = root + "/" + step_dir_name(manifest.step);
  // Where the replaced step ends up after the swap (removed once `latest` is durable), and how to undo the swap.
  std::string replaced;
  bool swapped = false;
  if (detail::exists(final_dir)) {
    // The same step saved again (e.g. after a restart): the committed copy is never absent. RENAME_EXCHANGE swaps
    // the two directories in one step; without it (NFS) the old copy is moved aside first and a crash between the
    // two renames leaves it as step-N.old-RUN, which clean_orphans puts back.
    if (detail::exchange_paths(tmp_dir, final_dir)) {
      replaced = tmp_dir;
      swapped = true;
      detail::crash_point("commit-exchanged");
    } else {
      replaced = final_dir + ".old-" + manifest.run_id;
      detail::remove_all_quiet(replaced);
      if (::rename(final_dir.c_str(), replaced.c_str()) != 0) {
        throw Error("rename " + final_dir + " to " + replaced + ": " + errno_text(errno));
      }
      detail::crash_point("commit-old-moved-aside");
      if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
        const int e = errno;
        ::rename(replaced.c_str(), final_dir.c_str());
        throw Error("rename " + tmp_dir + " to " + final_dir + ": " + errno_text(e));
      }
    }
  } else if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    throw Error("rename " + tmp_dir + " to " + final_dir + ": " + errno_text(errno));
  }
  detail::crash_point("commit-renamed");
  try {
    if (fsync_files) detail::fsync_path(root);
    detail::write_file_durable(root + "/" + kLatestName, step_dir_name(manifest.step) + "\n", fsync_files);
    if (fsync_files) detail::fsync_path(root);
  } catch (...) {
    // Without `latest` moved the save has failed: take the step back out so nothing half-done stays visible, and
    // put a replaced step back where it was.
    if (swapped) {
      try {
        detail::exchange_paths(replaced, final_dir);
      } catch (const Error&) {
        // Cannot swap back: the new step stays in place, complete (the caller then removes the old copy).
      }
    } else {
      detail::remove_all_quiet(final_dir);
      if (!replaced.empty()) ::rename(replaced.c_str(), final_dir.c_str());
    }
    throw;
  }
  detail::crash_point("commit-latest-moved");
  if (!replaced.empty()) detail::remove_all_quiet(replaced);
  detail::crash_point("commit-replaced-removed");
  try {
    apply_retention(root, keep);
  } catch (const std::exception& e) {
    log::warn("ckpt", "retention failed", {{"root", root}, {"error", e.what()}});
  }
}

std::vector<std::string> clean_orphans(const std::string& root, const std::string& current_run_id) {
  std::vector<std::string> removed;
  // Under the commit lock no live writer is between its moves: a temporary of `latest` or a step moved aside now
  // belongs to a writer that died there.
  detail::FileLock lock(root + "/" + kCommitLockName);
  std::error_code ec;
  std::vector<fs::directory_entry> entries;
  for (const auto& entry : fs::directory_iterator(root, ec)) entries.push_back(entry);
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    const std::string path = entry.path().string();
    int64_t step = 0;
    std::string run;
    bool orphan = false;
    if (parse_temp_dir(name, &step, &run)) {
      // A live writer of another run (another job on the same directory, a generation not yet stopped) holds a
      // shared flock on its temporary directory until its save ends.
      orphan = run != current_run_id && !detail::FileLock::held(path);
    } else if (const size_t old = name.find(".old-"); old != std::string::npos && name.rfind("step-", 0) == 0) {
      const auto s = parse_step_dir(name.substr(0, old));
      const std::string step_path = root + "/" + name.substr(0, old);
      if (s && !detail::exists(step_path) && detail::exists(path + "/" + kManifestName) &&
          ::rename(path.c_str(), step_path.c_str()) == 0) {
        removed.push_back(name + " (put back as " + name.substr(0, old) + ")");
        continue;
      }
      orphan = true;
    } else if (parse_step_dir(name)) {
      orphan = entry.is_directory() && !detail::exists(path + "/" + kManifestName);
    } else if (detail::is_temp_of(name, kLatestName)) {
      orphan = true;
    }
    if (orphan) {
      detail::remove_all_quiet(path);
      removed.push_back(name);
    }
  }
  return removed;
}

std::vector<std::string> apply_retention(const std::string& root, int keep) {
  std::vector<std::string> removed;
  std::vector<int64_t> complete;
  std::vector<std::pair<int64_t, std::string>> temps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t step = 0;
    std::string run;
    if (auto s = parse_step_dir(name); s && detail::exists(entry.path().string() + "/" + kManifestName)) {
      complete.push_back(*s);
    } else if (parse_temp_dir(name, &step, &run)) {
      temps.emplace_back(step, name);
    }
  }
  std::sort(complete.rbegin(), complete.rend());
  const auto latest = latest_step(root);
  // A manifest alone does not make a step loadable: the newest step that verifies (manifest checksum, every file
  // present with its size) is kept even when `keep` newer ones exist, so retention never removes the last good step.
  std::optional<int64_t> newest_valid;
  for (int64_t step : complete) {
    if (verify_checkpoint(root, step, /*checksums=*/false).ok) {
      newest_valid = step;
      break;
    }
  }
  if (keep > 0) {
    for (size_t i = static_cast<size_t>(keep); i < complete.size(); ++i) {
      if (latest && *latest == complete[i]) continue;
      if (newest_valid && *newest_valid == complete[i]) continue;
      detail::remove_all_quiet(root + "/" + step_dir_name(complete[i]));
      removed.push_back(step_dir_name(complete[i]));
    }
  }
  // Every rank persists in step order and rank 0 commits a step only after all ranks wrote it, so a temporary
  // directory of a step at or below the newest committed one belongs to an abandoned save, unless a live writer of
  // another run still holds it.
  if (!complete.empty()) {
    for (const auto& [step, name] : temps) {
      if (step <= complete.front() && !detail::FileLock::held(root + "/" + name)) {
        detail::remove_all_quiet(root + "/" + name);
        removed.push_back(name);
      }
    }
  }
  return removed;
}

// ---------------------------------------------------------------------------------------------------------------
// Writer

struct Writer::Buffer {
  std::unique_ptr<std::byte[]> data;
  uint64_t capacity = 0;
  bool busy = false;
};

struct Writer::Job {
  int64_t step = 0;
  Buffer* buffer = nullptr;
  std::vector<TensorRecord> tensors;
  std::vector<PendingSlice> slices;
  nlohmann::json state;
  double snapshot_seconds = 0;
};

Writer::Writer(WriterOptions options) : options_(std::move(options)) {
  if (options_.root.empty()) throw ConfigError("checkpoint writer: root directory is empty: set WriterOptions.root");
  if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size) {
    throw ConfigError("checkpoint writer: rank " + std::to_string(options_.rank) + " is outside world_size " +
                      std::to_string(options_.world_size));
  }
  if (options_.buffers < 1 || options_.buffers > 2) {
    throw ConfigError("checkpoint writer: buffers=" + std::to_string(options_.buffers) + " must be 1 or 2");
  }
  if (options_.run_id.empty()) {
    if (options_.world_size > 1) {
      throw ConfigError("checkpoint writer: run_id is required when world_size > 1 (use the same id on every rank)");
    }
    options_.run_id = detail::random_hex(8);
  }
  for (char c : options_.run_id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
      throw ConfigError("checkpoint writer: run_id '" + options_.run_id + "' may only hold letters, digits, - and _");
    }
  }
  if (!options_.coordinator) options_.coordinator = std::make_shared<FsCoordinator>();
  std::error_code ec;
  fs::create_directories(options_.root, ec);
  if (ec) throw ConfigError("checkpoint directory " + options_.root + ": cannot create: " + ec.message());
  if (options_.rank == 0) {
    const auto current = options_.generation > 0 && !options_.job.empty()
                             ? current_generation(options_.root, options_.job)
                             : std::nullopt;
    if (current && *current > options_.generation) {
      // A superseded generation deletes nothing: what looks orphaned may be the newer generation's save in flight.
      log::warn("ckpt", "this generation is superseded: no orphan cleanup, saves will not commit",
                {{"root", options_.root},
                 {"generation", std::to_string(options_.generation)},
                 {"latest_generation", std::to_string(*current)}});
    } else {
      for (const auto& name : clean_orphans(options_.root, options_.run_id)) {
        log::info("ckpt", "removed orphan", {{"root", options_.root}, {"entry", name}});
      }
    }
  }
  for (int i = 0; i < options_.buffers; ++i) buffers_.push_back(std::make_unique<Buffer>());
  thread_ = std::thread([this] { run(); });
}

Writer::~Writer() {
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty(); });
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SaveStatus Writer::snapshot(int64_t step, const std::vector<TensorShard>& shards, const nlohmann::json& state) {
  const auto t0 = Clock::now();
  if (step < 0) throw Error("checkpoint step " + std::to_string(step) + " must be >= 0");
  // Validate and plan everything before touching a buffer, so a bad call changes nothing.
  auto job = std::make_unique<Job>();
  job->step = step;
  job->state = state;
  struct Part {
    const TensorShard* shard;
    Box box;
  };
  std::vector<Part> parts;
  uint64_t total = 0;
  for (const auto& s : shards) {
    const std::string what = "checkpoint tensor '" + s.name + "'";
    if (s.name.empty()) throw Error("checkpoint tensor with an empty name: every TensorShard needs a name");
    if (s.data == nullptr && s.box.volume() > 0) throw Error(what + ": data is null");
    if (!box_within(s.box, s.global_shape)) {
      throw Error(what + ": box " + box_to_string(s.box) + " is not inside the global shape " +
                  shape_to_string(s.global_shape));
    }
    if (s.num_replicas < 1 || s.replica_index < 0 || s.replica_index >= s.num_replicas) {
      throw Error(what + ": replica_index " + std::to_string(s.replica_index) + " is outside num_replicas " +
                  std::to_string(s.num_replicas));
    }
    auto it = std::find_if(job->tensors.begin(), job->tensors.end(), [&](const auto& t) { return t.name == s.name; });
    if (it == job->tensors.end()) {
      job->tensors.push_back({s.name, s.dtype, s.global_shape});
    } else if (it->dtype != s.dtype || it->shape != s.global_shape) {
      throw Error(what + ": shards disagree on dtype or global shape");
    }
    // Replicas split the box; each writes one part, so every element is written once.
    Box mine = replica_part(s.box, s.replica_index, s.num_replicas);
    if (mine.volume() == 0) continue;
    parts.push_back({&s, mine});
    total = align_up(total + static_cast<uint64_t>(mine.volume()) * dtype_size(s.dtype));
  }
  Buffer* buf = nullptr;
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] {
      for (auto& b : buffers_) {
        if (!b->busy) return true;
      }
      return false;
    });
    for (auto& b : buffers_) {
      if (!b->busy) {
        buf = b.get();
        break;
      }
    }
    buf->busy = true;
  }
  if (buf->capacity < total) {
    buf->data.reset();
    buf->capacity = 0;
    try {
      buf->data.reset(new std::byte[std::max<uint64_t>(total, 1)]);
    } catch (const std::bad_alloc&) {
      {
        std::lock_guard lock(mu_);
        buf->busy = false;
      }
      cv_.notify_all();
      throw Error("checkpoint snapshot of step " + std::to_string(step) + ": cannot allocate " + std::to_string(total) +
                  " bytes of host memory for the snapshot buffer");
    }
    buf->capacity = total;
  }
  uint64_t offset = 0;
  for (const auto& p : parts) {
    const size_t es = dtype_size(p.shard->dtype);
    std::byte* dst = buf->data.get() + offset;
    copy_region(p.shard->data, p.shard->box, dst, p.box, p.box, es);
    PendingSlice ps;
    ps.record.tensor = p.shard->name;
    ps.record.box = p.box;
    ps.data = dst;
    job->slices.push_back(std::move(ps));
    offset = align_up(offset + static_cast<uint64_t>(p.box.volume()) * es);
  }
  job->buffer = buf;
  job->snapshot_seconds = seconds_since(t0);
  SaveStatus st;
  st.step = step;
  st.state = SaveState::Queued;
  st.snapshot_seconds = job->snapshot_seconds;
  {
    std::lock_guard lock(mu_);
    statuses_[step] = st;
    last_step_ = step;
    while (statuses_.size() > 64) statuses_.erase(statuses_.begin());
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
  return st;
}

SaveStatus Writer::save_now_and_wait(int64_t step, const std::vector<TensorShard>& shards, const nlohmann::json& state,
                                     Clock::time_point deadline) {
  snapshot(step, shards, state);
  return wait(step, deadline);
}

SaveStatus Writer::status(int64_t step) const {
  std::lock_guard lock(mu_);
  auto it = statuses_.find(step);
  if (it != statuses_.end()) return it->second;
  SaveStatus s;
  s.step = step;
  s.state = SaveState::Failed;
  s.error = "unknown step " + std::to_string(step) + ": no snapshot was taken";
  return s;
}

SaveStatus Writer::last_status() const {
  int64_t step;
  {
    std::lock_guard lock(mu_);
    step = last_step_;
  }
  return status(step);
}

SaveStatus Writer::wait(int64_t step, Clock::time_point deadline) const {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, deadline, [&] {
    auto it = statuses_.find(step);
    return it == statuses_.end() || it->second.done();
  });
  auto it = statuses_.find(step);
  if (it != statuses_.end()) return it->second;
  SaveStatus s;
  s.step = step;
  s.state = SaveState::Failed;
  s.error = "unknown step " + std::to_string(step);
  return s;
}

void Writer::flush() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] {
    if (!queue_.empty()) return false;
    for (const auto& b : buffers_) {
      if (b->busy) return false;
    }
    return true;
  });
}

bool Writer::idle() const {
  std::lock_guard lock(mu_);
  if (!queue_.empty()) return false;
  for (const auto& b : buffers_)
    if (b->busy) return false;
  return true;
}

void Writer::abandon() {
  abandoned_ = true;
  options_.coordinator->cancel();
}

void Writer::reserve(uint64_t bytes) {
  flush();
  std::lock_guard lock(mu_);
  for (auto& b : buffers_) {
    if (b->capacity >= bytes) continue;
    b->data.reset();
    b->data.reset(new std::byte[bytes]);
    b->capacity = bytes;
    std::memset(b->data.get(), 0, bytes);
  }
}

void Writer::set_status(const SaveStatus& s) {
  {
    std::lock_guard lock(mu_);
    statuses_[s.step] = s;
  }
  cv_.notify_all();
}

void Writer::run() {
  while (true) {
    Job* job = nullptr;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = queue_.front().get();
    }
    const SaveStatus st = persist(*job);
    if (options_.on_finished) {
      try {
        options_.on_finished(st);
      } catch (const std::exception& e) {
        log::warn("ckpt", "on_finished callback threw", {{"error", e.what()}});
      }
    }
    {
      // The final status and the buffer's release are one change, after the callback: a caller whose wait() saw
      // the save end also sees the writer idle and the callback's effects (it may reuse the buffer or stop at once).
      std::lock_guard lock(mu_);
      statuses_[st.step] = st;
      job->buffer->busy = false;
      queue_.pop_front();
    }
    cv_.notify_all();
  }
}

SaveStatus Writer::persist(Job& job) {
  const auto t0 = Clock::now();
  SaveStatus st;
  st.step = job.step;
  st.snapshot_seconds = job.snapshot_seconds;
  st.state = SaveState::Persisting;
  set_status(st);
  const std::string tmp_dir = options_.root + "/" + temp_dir_name(job.step, options_.run_id);
  const std::string step_dir = options_.root + "/" + step_dir_name(job.step);
  const auto deadline = Clock::now() + options_.commit_timeout;
  bool shard_written = false;
  bool handed_over = false;
  std::unique_ptr<detail::FileLock> held;
  std::string shard_path;
  try {
    if (abandoned_) throw Error("save abandoned: the process is stopping");
    std::error_code ec;
    fs::create_directories(tmp_dir, ec);
    if (ec) throw Error("cannot create " + tmp_dir + ": " + ec.message());
    // Tells clean_orphans of another run that this directory is in use, until the save ends (or the process dies).
    held = detail::FileLock::shared(tmp_dir);
    RankRecord rec =
        write_rank_shard(tmp_dir, options_.rank, job.step, options_.run_id, job.tensors, job.slices, options_.fsync);
    rec.state = job.state;
    shard_written = !rec.file.empty();
    shard_path = tmp_dir + "/" + rec.file;
    st.bytes = rec.file_bytes;
    if (options_.fsync) detail::fsync_path(tmp_dir);
    std::vector<RankRecord> records = options_.coordinator->gather(tmp_dir, rec, options_.world_size, deadline);
    // From here on the shard belongs to the coordinator's commit: deleting it after a local timeout could race
    // with a late commit and leave a committed step without its file.
    handed_over = true;
    if (options_.rank == 0) {
      Manifest m;
      m.step = job.step;
      m.run_id = options_.run_id;
      m.created = detail::now_iso8601();
      m.job = options_.job;
      m.generation = options_.generation;
      m.world_size = options_.world_size;
      m.layout = options_.layout;
      for (const auto& r : records) {
        for (const auto& t : r.tensors) {
          const TensorRecord* have = m.find_tensor(t.name);
          if (have == nullptr) {
            m.tensors.push_back(t);
          } else if (!(*have == t)) {
            throw Error("ranks disagree on tensor " + t.name + ": " + std::string(dtype_name(have->dtype)) +
                        shape_to_string(have->shape) + " vs " + std::string(dtype_name(t.dtype)) +
                        shape_to_string(t.shape));
          }
        }
        m.slices.insert(m.slices.end(), r.slices.begin(), r.slices.end());
        if (!r.file.empty()) m.files[r.file] = r.file_bytes;
        if (!r.state.is_null()) m.rank_state[r.rank] = r.state;
      }
      commit_checkpoint(options_.root, tmp_dir, std::move(m), options_.keep, options_.fsync);
      // One line per committed step: how far the disk is behind the training is otherwise invisible (a restore
      // from disk loses the steps since the newest *committed* step, not since the newest started save).
      log::info("ckpt", "committed",
                {{"step", std::to_string(job.step)}, {"persist_seconds", std::to_string(seconds_since(t0))}});
    } else if (!options_.coordinator->wait_commit(step_dir, tmp_dir, options_.run_id, deadline)) {
      throw Error("rank 0 did not commit step " + std::to_string(job.step) + " (see rank 0's status)");
    }
    st.state = SaveState::Committed;
  } catch (const std::exception& e) {
    st.state = SaveState::Failed;
    st.error = e.what();
    if (options_.rank == 0) {
      detail::remove_all_quiet(tmp_dir);  // abandons the save for every rank
    } else {
      if (!handed_over) {
        if (shard_written) ::unlink(shard_path.c_str());
        options_.coordinator->report_failure(tmp_dir, options_.rank, e.what());
      }
    }
    log::error("ckpt", "save failed",
               {{"step", std::to_string(job.step)}, {"rank", std::to_string(options_.rank)}, {"error", e.what()}});
  }
  st.persist_seconds = seconds_since(t0);
  return st;
}

}  // namespace railyard::ckpt
