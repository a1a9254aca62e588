// Checkpoint manifests and the slices they point at (checkpoint/format.cc parse_manifest, validate_coverage,
// rank_record_from_json; checkpoint/reader.cc load_from_manifest). A manifest carries a CRC32C over its canonical
// form, so random bytes would almost never get past the checksum: when the input is a JSON object this target
// recomputes that CRC (and each slice's CRC over the zero-filled shard it writes) so the fuzzer reaches the
// structural checks and the reader. Bad manifests are a railyard::Error; anything else is a finding.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/crc32c.h"
#include "checkpoint/format.h"
#include "checkpoint/reader.h"
#include "common/error.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using nlohmann::json;
namespace ckpt = railyard::ckpt;

constexpr uint64_t kMaxFileBytes = 1 << 20;    // shard files this target is willing to create
constexpr int64_t kMaxLoadElements = 1 << 18;  // elements it is willing to allocate for a load

std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// Slices of a zero-filled file: the CRC depends only on the length.
void fix_slice_crcs(json& j) {
  if (!j.contains("slices") || !j["slices"].is_array()) return;
  for (auto& s : j["slices"]) {
    if (!s.is_object() || !s.contains("bytes") || !s["bytes"].is_number_unsigned()) continue;
    uint64_t bytes = s["bytes"].get<uint64_t>();
    if (bytes > kMaxFileBytes) continue;
    std::vector<char> zeros(bytes, 0);
    s["crc32c"] = hex8(railyard::ckpt::crc32c(zeros.data(), zeros.size()));
  }
}

std::string with_valid_crc(json j) {
  j.erase("manifest_crc32c");
  fix_slice_crcs(j);
  std::string canonical = j.dump();
  j["manifest_crc32c"] = hex8(railyard::ckpt::crc32c(canonical.data(), canonical.size()));
  return j.dump();
}

void load_everything(const ckpt::Manifest& m) {
  const std::string dir = railyard::fuzz::scratch_dir() + "/step";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  uint64_t total = 0;
  for (const auto& [file, bytes] : m.files) {
    total += bytes;
    // Names come from the manifest: only plain names inside the step directory are materialised.
    if (total > kMaxFileBytes || file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      return;
    std::filesystem::resize_file(railyard::fuzz::write_scratch("step/" + file, ""), bytes);
  }
  int64_t elements = 0;
  for (const auto& t : m.tensors) {
    int64_t v = ckpt::shape_volume(t.shape);
    if (v < 0 || v > kMaxLoadElements - elements) return;
    elements += v;
  }
  std::vector<std::vector<char>> buffers;
  std::vector<ckpt::LoadTarget> targets;
  for (const auto& t : m.tensors) {
    buffers.emplace_back(static_cast<size_t>(ckpt::shape_volume(t.shape)) * ckpt::dtype_size(t.dtype));
    targets.push_back({t.name, t.dtype, ckpt::full_box(t.shape), buffers.back().data()});
  }
  (void)ckpt::load_from_manifest(dir, m, targets);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text = railyard::fuzz::as_string(data, size);
  json j = json::parse(text, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    try {
      (void)ckpt::rank_record_from_json(j, "rank-00000.done");
    } catch (const railyard::Error&) {
    }
    text = with_valid_crc(std::move(j));
  }
  try {
    ckpt::Manifest m = ckpt::parse_manifest(text, "fuzz/manifest.json");
    ckpt::validate_coverage(m);
    load_everything(m);
  } catch (const railyard::Error&) {
  }
  return 0;
}
