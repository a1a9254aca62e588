#include "checkpoint/cli.h"

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string_view>

#include "checkpoint/fs_util.h"
#include "checkpoint/reader.h"
#include "checkpoint/writer.h"
#include "common/error.h"

namespace railyard::ckpt {
namespace {

constexpr const char* kUsage =
    "usage: railyard ckpt <command> DIR [options]\n"
    "  ls DIR                        checkpoints with size, time and whether complete\n"
    "  inspect DIR [--step N] [--json]  the manifest of the newest (or given) step\n"
    "  verify DIR [--step N]         check every checksum (all complete steps unless --step); exit 1 on damage\n"
    "  reshard DIR --to-dp A --to-tp B --to-pp C [--to-zero Z] [--step N] --out DIR2\n"
    "                                write a copy laid out for another world (GPT tensor rules)\n";

struct Args {
  std::string command;
  std::string dir;
  std::map<std::string, std::string> opts;
};

Args parse_args(int argc, char** argv) {
  Args a;
  if (argc < 2) throw ConfigError("missing command");
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0) {
      std::string key = s.substr(2), value;
      size_t eq = key.find('=');
      if (eq != std::string::npos) {
        value = key.substr(eq + 1);
        key = key.substr(0, eq);
      } else if (key == "json") {
        value = "1";
      } else {
        if (i + 1 >= argc) throw ConfigError("option --" + key + " needs a value");
        value = argv[++i];
      }
      a.opts[key] = value;
    } else if (a.dir.empty()) {
      a.dir = s;
    } else {
      throw ConfigError("unexpected argument '" + s + "'");
    }
  }
  if (a.dir.empty()) throw ConfigError("missing checkpoint directory");
  return a;
}

int64_t int_opt(const Args& a, const std::string& key, std::optional<int64_t> fallback) {
  auto it = a.opts.find(key);
  if (it == a.opts.end()) {
    if (!fallback) throw ConfigError("missing --" + key);
    return *fallback;
  }
  try {
    size_t used = 0;
    long long v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing");
    return v;
  } catch (const std::exception&) {
    throw ConfigError("--" + key + " '" + it->second + "' is not an integer");
  }
}

void check_known(const Args& a, std::initializer_list<const char*> known) {
  for (const auto& [k, v] : a.opts) {
    bool ok = false;
    for (const char* n : known) ok = ok || k == n;
    if (!ok) throw ConfigError("unknown option --" + k + " for '" + a.command + "'");
  }
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string time_text(std::time_t t) {
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int64_t newest_step(const Reader& r) {
  auto steps = r.complete_steps();
  if (steps.empty()) throw Error("no complete checkpoint under " + r.root());
  return steps.front();
}

int cmd_ls(const Args& a) {
  check_known(a, {});
  if (!std::filesystem::is_directory(a.dir)) throw ConfigError("checkpoint directory " + a.dir + " does not exist");
  Reader reader(a.dir);
  auto latest = reader.latest_pointer();
  auto infos = list_checkpoints(a.dir);
  std::printf("%-34s %-10s %12s  %-20s %s\n", "CHECKPOINT", "STATUS", "SIZE", "MODIFIED", "NOTE");
  for (const auto& i : infos) {
    std::string note = i.problem;
    if (latest && *latest == i.step && !i.temporary) note = note.empty() ? "latest" : "latest; " + note;
    std::printf("%-34s %-10s %12s  %-20s %s\n", i.name.c_str(),
                i.complete ? "complete" : (i.temporary ? "temporary" : "incomplete"), human_bytes(i.bytes).c_str(),
                time_text(i.modified).c_str(), note.c_str());
  }
  if (infos.empty()) std::printf("(no checkpoints)\n");
  return 0;
}

int cmd_inspect(const Args& a) {
  check_known(a, {"step", "json"});
  Reader reader(a.dir);
  int64_t step = a.opts.count("step") ? int_opt(a, "step", std::nullopt) : newest_step(reader);
  Manifest m = reader.read_manifest(step);
  if (a.opts.count("json")) {
    std::cout << nlohmann::json::parse(serialize_manifest(m)).dump(2) << "\n";
    return 0;
  }
  std::printf("checkpoint  %s/%s\n", a.dir.c_str(), step_dir_name(step).c_str());
  std::printf("format      railyard-checkpoint v%d\n", m.format_version);
  std::printf("step        %lld\n", static_cast<long long>(m.step));
  std::printf("run         %s\ncreated     %s\n", m.run_id.c_str(), m.created.c_str());
  std::printf("world       %d ranks, layout %s\n", m.world_size, m.layout.dump().c_str());
  uint64_t total = 0;
  for (const auto& [f, n] : m.files) total += n;
  std::printf("files       %zu shard files, %s\n", m.files.size(), human_bytes(total).c_str());
  std::printf("\n%-24s %-6s %-22s %7s %12s\n", "TENSOR", "DTYPE", "SHAPE", "SLICES", "BYTES");
  for (const auto& t : m.tensors) {
    int n = 0;
    for (const auto& s : m.slices) n += s.tensor == t.name;
    std::printf("%-24s %-6s %-22s %7d %12s\n", t.name.c_str(), std::string(dtype_name(t.dtype)).c_str(),
                shape_to_string(t.shape).c_str(), n,
                human_bytes(static_cast<uint64_t>(shape_volume(t.shape)) * dtype_size(t.dtype)).c_str());
  }
  if (!m.rank_state.empty()) {
    std::printf("\nrank state:\n");
    for (const auto& [r, st] : m.rank_state) std::printf("  rank %d: %s\n", r, st.dump().c_str());
  }
  return 0;
}

int cmd_verify(const Args& a) {
  check_known(a, {"step"});
  Reader reader(a.dir);
  std::vector<int64_t> steps;
  if (a.opts.count("step")) {
    steps.push_back(int_opt(a, "step", std::nullopt));
  } else {
    steps = reader.complete_steps();
    if (steps.empty()) throw Error("no complete checkpoint under " + a.dir);
  }
  int bad = 0;
  for (int64_t step : steps) {
    VerifyReport r = verify_checkpoint(a.dir, step, true);
    if (r.ok) {
      std::printf("%s: OK (%s checked)\n", step_dir_name(step).c_str(), human_bytes(r.bytes_checked).c_str());
    } else {
      ++bad;
      for (const auto& p : r.problems) std::fprintf(stderr, "%s\n", p.c_str());
      std::printf("%s: DAMAGED (%zu problem(s))\n", step_dir_name(step).c_str(), r.problems.size());
    }
  }
  return bad == 0 ? 0 : 1;
}

int cmd_reshard(const Args& a) {
  check_known(a, {"to-dp", "to-tp", "to-pp", "to-zero", "step", "out"});
  Layout to;
  to.dp = static_cast<int>(int_opt(a, "to-dp", 1));
  to.tp = static_cast<int>(int_opt(a, "to-tp", 1));
  to.pp = static_cast<int>(int_opt(a, "to-pp", 1));
  to.zero = static_cast<int>(int_opt(a, "to-zero", 0));
  to.validate();
  auto out = a.opts.find("out");
  if (out == a.opts.end()) throw ConfigError("missing --out DIR2 (where the resharded copy goes)");
  Reader reader(a.dir);
  int64_t step = a.opts.count("step") ? int_opt(a, "step", std::nullopt) : newest_step(reader);
  Manifest m = reshard_checkpoint(a.dir, step, out->second, to);
  std::printf("wrote %s/%s for dp=%d tp=%d pp=%d zero=%d (%d ranks, %zu slices)\n", out->second.c_str(),
              step_dir_name(step).c_str(), to.dp, to.tp, to.pp, to.zero, to.world_size(), m.slices.size());
  return 0;
}

}  // namespace

Manifest reshard_checkpoint(const std::string& src_root, int64_t step, const std::string& dst_root, const Layout& to,
                            const std::vector<SplitRule>& rules) {
  namespace fs = std::filesystem;
  to.validate();
  std::error_code ec;
  if (fs::exists(src_root, ec) && fs::exists(dst_root, ec) && fs::equivalent(src_root, dst_root, ec)) {
    throw ConfigError("reshard: --out must differ from the source directory " + src_root);
  }
  Reader reader(src_root);
  Manifest src = reader.read_manifest(step);
  VerifyReport v = verify_checkpoint(src_root, step, true);
  if (!v.ok) throw Error("reshard: source is damaged: " + v.problems.front());
  const std::string src_dir = src_root + "/" + step_dir_name(step);
  std::vector<TensorDef> defs;
  for (const auto& t : src.tensors) defs.push_back({t.name, t.dtype, t.shape});
  fs::create_directories(dst_root, ec);
  if (ec) throw Error("reshard: cannot create " + dst_root + ": " + ec.message());
  const std::string run_id = "reshard-" + detail::random_hex(6);
  clean_orphans(dst_root, run_id);
  const std::string tmp_dir = dst_root + "/" + temp_dir_name(step, run_id);
  fs::create_directories(tmp_dir, ec);
  if (ec) throw Error("reshard: cannot create " + tmp_dir + ": " + ec.message());
  Manifest m;
  m.step = step;
  m.run_id = run_id;
  m.created = detail::now_iso8601();
  m.world_size = to.world_size();
  m.layout = to.to_json();
  m.tensors = src.tensors;
  try {
    for (int rank = 0; rank < to.world_size(); ++rank) {
      std::vector<std::unique_ptr<unsigned char[]>> buffers;
      std::vector<LoadTarget> targets;
      std::vector<PendingSlice> slices;
      for (const PlacedBox& pb : rank_boxes(to, rank, defs, rules)) {
        Box part = replica_part(pb.box, pb.replica_index, pb.num_replicas);
        if (part.volume() == 0) continue;
        const TensorRecord* t = src.find_tensor(pb.tensor);
        buffers.emplace_back(new unsigned char[static_cast<size_t>(part.volume()) * dtype_size(t->dtype)]);
        targets.push_back({pb.tensor, t->dtype, part, buffers.back().get()});
        PendingSlice ps;
        ps.record.tensor = pb.tensor;
        ps.record.box = part;
        ps.data = buffers.back().get();
        slices.push_back(std::move(ps));
      }
      load_from_manifest(src_dir, src, targets);
      std::vector<TensorRecord> tensors;
      for (const auto& s : slices) {
        if (!m.find_tensor(s.record.tensor)) continue;
        bool have = false;
        for (const auto& t : tensors) have = have || t.name == s.record.tensor;
        if (!have) tensors.push_back(*m.find_tensor(s.record.tensor));
      }
      RankRecord rec = write_rank_shard(tmp_dir, rank, step, run_id, tensors, slices, true);
      m.slices.insert(m.slices.end(), rec.slices.begin(), rec.slices.end());
      if (!rec.file.empty()) m.files[rec.file] = rec.file_bytes;
      // Per-rank state (RNG streams) has no meaning in another layout; carry the old rank's, else rank 0's.
      auto st = src.rank_state.find(rank);
      if (st == src.rank_state.end()) st = src.rank_state.find(0);
      if (st != src.rank_state.end()) m.rank_state[rank] = st->second;
    }
    commit_checkpoint(dst_root, tmp_dir, m, 0, true);
  } catch (...) {
    detail::remove_all_quiet(tmp_dir);
    throw;
  }
  return m;
}

int cli_main(int argc, char** argv) {
  // --help or -h anywhere (railyard ckpt --help, railyard ckpt ls --help): the usage on stdout, exit 0.
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--help" || std::string_view(argv[i]) == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  Args a;
  try {
    a = parse_args(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "railyard ckpt: %s\n%s", e.what(), kUsage);
    return 2;
  }
  try {
    if (a.command == "ls") return cmd_ls(a);
    if (a.command == "inspect") return cmd_inspect(a);
    if (a.command == "verify") return cmd_verify(a);
    if (a.command == "reshard") return cmd_reshard(a);
    std::fprintf(stderr, "railyard ckpt: unknown command '%s'\n%s", a.command.c_str(), kUsage);
    return 2;
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "railyard ckpt %s: %s\n", a.command.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "railyard ckpt %s: %s\n", a.command.c_str(), e.what());
    return 1;
  }
}

}  // namespace railyard::ckpt
