// The on-disk vocabulary of a checkpoint: dtypes, boxes (hyper-rectangles of a global tensor), slice and manifest
// records, and the JSON they are stored as. docs/checkpoint-format.md is the human-readable spec of the same thing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace railyard::ckpt {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kLatestName = "latest";
// Held (flock) by the writer that commits a step, moves `latest`, applies retention or cleans orphans, so these never
// interleave between writers, and anything temporary found while holding it belongs to a dead writer.
inline constexpr const char* kCommitLockName = ".commit.lock";

enum class DType { F32, BF16, F16, F64, I32, I64, U8, I8 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);      // "f32", "bf16", ...
DType parse_dtype(std::string_view name);  // throws railyard::Error listing the accepted names

using Shape = std::vector<int64_t>;

// A hyper-rectangle of a global tensor: offset[d] .. offset[d]+size[d] on every dimension d. Data for a box is
// always stored row-major and dense.
struct Box {
  Shape offset;
  Shape size;

  int64_t volume() const;
  bool empty() const { return volume() == 0; }
  bool operator==(const Box&) const = default;
};

Box full_box(const Shape& shape);
int64_t shape_volume(const Shape& shape);
bool box_within(const Box& b, const Shape& shape);
std::optional<Box> intersect(const Box& a, const Box& b);  // nullopt when they share no element
std::string box_to_string(const Box& b);                   // "[0:4,768:1536]" (half-open ranges)
std::string shape_to_string(const Shape& s);               // "(12,2304,768)"

// Part `index` of `parts` near-equal contiguous parts of b along dimension dim (may be empty).
Box split_box(const Box& b, int dim, int parts, int index);

// The row-major element range [begin, end) of box b (counted inside b) as a short list of boxes (at most 2 per
// dimension + 1). This is how a flat ZeRO range of a parameter maps onto hyper-rectangles.
std::vector<Box> flat_range_to_boxes(const Box& b, int64_t begin, int64_t end);

// Copies the elements of `region` (global coordinates, inside both boxes) from src, the dense contents of src_box,
// into dst, the dense contents of dst_box.
void copy_region(const void* src, const Box& src_box, void* dst, const Box& dst_box, const Box& region,
                 size_t elem_size);

struct TensorRecord {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;  // global shape
  bool operator==(const TensorRecord&) const = default;
};

// One stored hyper-rectangle: which file holds it, where, and its checksum.
struct SliceRecord {
  std::string tensor;
  Box box;
  std::string file;  // relative to the step directory
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// What one rank wrote for one save; the "done" record of the commit protocol.
struct RankRecord {
  int rank = 0;
  int64_t step = 0;
  std::string run_id;
  std::string file;  // shard file name, "" when this rank had nothing to write
  uint64_t file_bytes = 0;
  std::vector<TensorRecord> tensors;
  std::vector<SliceRecord> slices;
  nlohmann::json state;  // opaque per-rank state (RNG, data loader position, ...)
};

struct Manifest {
  int format_version = kFormatVersion;
  int64_t step = 0;
  std::string run_id;
  std::string created;  // UTC, ISO 8601
  // The job and the job's generation (rendezvous round) that wrote the step; "" / 0 when not recorded (a run by
  // hand, the reshard tool, a manifest written before issue 40). A writer of an older generation of the same job
  // than the one `latest` names is superseded: it commits nothing and deletes nothing.
  std::string job;
  int64_t generation = 0;
  int world_size = 1;
  nlohmann::json layout;  // {"dp":..,"tp":..,"pp":..,"zero":..} as given by the writer
  std::vector<TensorRecord> tensors;
  std::vector<SliceRecord> slices;
  std::map<std::string, uint64_t> files;  // shard file -> size in bytes
  std::map<int, nlohmann::json> rank_state;

  const TensorRecord* find_tensor(std::string_view name) const;
};

nlohmann::json to_json(const RankRecord& r);
RankRecord rank_record_from_json(const nlohmann::json& j, const std::string& where);

// Serialised manifest: JSON with a "manifest_crc32c" field over the canonical (compact, key-sorted) form of the
// rest, so a flipped byte is a parse error or a checksum mismatch, never a silently different manifest.
std::string serialize_manifest(const Manifest& m);
Manifest parse_manifest(const std::string& text, const std::string& where);  // throws railyard::Error

// Checks that the slices cover every tensor exactly once (in bounds, volumes add up, no overlaps); throws
// railyard::Error naming the tensor.
void validate_coverage(const Manifest& m);

std::string step_dir_name(int64_t step);  // "step-00001000"
std::optional<int64_t> parse_step_dir(std::string_view name);
std::string rank_file_name(int rank);           // "rank-00003.bin"
std::string slice_label(const SliceRecord& s);  // "qkvw[0:4,0:2304,0:768]"

}  // namespace railyard::ckpt
