#include "checkpoint/format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

#include "checkpoint/crc32c.h"
#include "common/error.h"

namespace railyard::ckpt {
namespace {

struct DTypeInfo {
  DType type;
  const char* name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {{DType::F32, "f32", 4}, {DType::BF16, "bf16", 2}, {DType::F16, "f16", 2},
                                 {DType::F64, "f64", 8}, {DType::I32, "i32", 4},   {DType::I64, "i64", 8},
                                 {DType::U8, "u8", 1},   {DType::I8, "i8", 1}};

nlohmann::json box_json(const Box& b) { return {{"offset", b.offset}, {"size", b.size}}; }

// Dimensions must be JSON integers: nlohmann converts a float like 6.7e21 to int64_t with undefined behaviour
// (found by fuzz_checkpoint_manifest).
// The same for every scalar count of the manifest (rank, step, sizes, offsets): a JSON integer within T's range,
// else Error naming the field.
template <class T>
T integer_at(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                    : v.is_number_integer()
                        ? v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                              v.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max())
                        : false;
  if (!fits) throw Error(std::string("field ") + key + " holds " + v.dump() + ", not an integer in range");
  return v.get<T>();
}

Shape shape_from(const nlohmann::json& j, const char* what) {
  if (!j.is_array()) throw Error(std::string(what) + " is not an array of integers");
  Shape out;
  for (const auto& d : j) {
    if (!d.is_number_integer() || (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
      throw Error(std::string(what) + " holds " + d.dump() + ", not an integer dimension");
    out.push_back(d.get<int64_t>());
  }
  return out;
}

Box box_from(const nlohmann::json& j) {
  Box b;
  b.offset = shape_from(j.at("offset"), "box offset");
  b.size = shape_from(j.at("size"), "box size");
  if (b.offset.size() != b.size.size()) throw Error("box offset and size have different ranks");
  return b;
}

nlohmann::json tensor_json(const TensorRecord& t) {
  return {{"name", t.name}, {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}};
}

TensorRecord tensor_from(const nlohmann::json& j) {
  TensorRecord t;
  t.name = j.at("name").get<std::string>();
  t.dtype = parse_dtype(j.at("dtype").get<std::string>());
  t.shape = shape_from(j.at("shape"), "tensor shape");
  for (int64_t d : t.shape) {
    if (d < 0) throw Error("tensor " + t.name + " has a negative dimension");
  }
  return t;
}

nlohmann::json slice_json(const SliceRecord& s) {
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", s.crc32c);
  return {{"tensor", s.tensor}, {"box", box_json(s.box)}, {"file", s.file},
          {"offset", s.offset}, {"bytes", s.bytes},       {"crc32c", crc}};
}

SliceRecord slice_from(const nlohmann::json& j) {
  SliceRecord s;
  s.tensor = j.at("tensor").get<std::string>();
  s.box = box_from(j.at("box"));
  s.file = j.at("file").get<std::string>();
  s.offset = integer_at<uint64_t>(j, "offset");
  s.bytes = integer_at<uint64_t>(j, "bytes");
  std::string crc = j.at("crc32c").get<std::string>();
  char* end = nullptr;
  unsigned long v = std::strtoul(crc.c_str(), &end, 16);
  if (crc.size() != 8 || end == nullptr || *end != '\0') throw Error("slice crc32c '" + crc + "' is not 8 hex digits");
  s.crc32c = static_cast<uint32_t>(v);
  if (s.file.empty() || s.file.find('/') != std::string::npos || s.file[0] == '.') {
    throw Error("slice file name '" + s.file + "' is not a plain file name");
  }
  return s;
}

std::string crc_hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

}  // namespace

size_t dtype_size(DType t) {
  for (const auto& d : kDTypes) {
    if (d.type == t) return d.size;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  for (const auto& d : kDTypes) {
    if (d.type == t) return d.name;
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return d.type;
  }
  throw Error("unknown dtype '" + std::string(name) + "': use one of f32, bf16, f16, f64, i32, i64, u8, i8");
}

int64_t Box::volume() const {
  int64_t v = 1;
  for (int64_t s : size) v *= s;
  return v;
}

Box full_box(const Shape& shape) { return Box{Shape(shape.size(), 0), shape}; }

int64_t shape_volume(const Shape& shape) {
  int64_t v = 1;
  for (int64_t s : shape) v *= s;
  return v;
}

bool box_within(const Box& b, const Shape& shape) {
  if (b.offset.size() != shape.size() || b.size.size() != shape.size()) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    // Written so that no sum can overflow: the numbers may come from a damaged file or segment.
    if (shape[d] < 0 || b.offset[d] < 0 || b.size[d] < 0 || b.offset[d] > shape[d] ||
        b.size[d] > shape[d] - b.offset[d])
      return false;
  }
  return true;
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  if (a.offset.size() != b.offset.size()) return std::nullopt;
  Box r{Shape(a.offset.size()), Shape(a.offset.size())};
  for (size_t d = 0; d < a.offset.size(); ++d) {
    int64_t lo = std::max(a.offset[d], b.offset[d]);
    int64_t hi = std::min(a.offset[d] + a.size[d], b.offset[d] + b.size[d]);
    if (hi <= lo) return std::nullopt;
    r.offset[d] = lo;
    r.size[d] = hi - lo;
  }
  return r;
}

std::string box_to_string(const Box& b) {
  // A box read from a file or a peer may have offsets and sizes of different lengths; it is named, not trusted, so
  // such a box is printed as its two lists (the caller's error says what is wrong with it).
  if (b.offset.size() != b.size.size())
    return "offset " + shape_to_string(b.offset) + " size " + shape_to_string(b.size);
  std::string s = "[";
  for (size_t d = 0; d < b.offset.size(); ++d) {
    if (d > 0) s += ",";
    // Unsigned: the end of a hostile box may pass INT64_MAX, and only the text of it is wanted here.
    s += std::to_string(b.offset[d]) + ":" +
         std::to_string(static_cast<uint64_t>(b.offset[d]) + static_cast<uint64_t>(b.size[d]));
  }
  return s + "]";
}

std::string shape_to_string(const Shape& sh) {
  std::string s = "(";
  for (size_t d = 0; d < sh.size(); ++d) {
    if (d > 0) s += ",";
    s += std::to_string(sh[d]);
  }
  return s + ")";
}

Box split_box(const Box& b, int dim, int parts, int index) {
  Box r = b;
  if (b.offset.empty()) return r;  // a scalar cannot be split; callers give it to part 0
  int64_t n = b.size[static_cast<size_t>(dim)];
  int64_t lo = n * index / parts;
  int64_t hi = n * (index + 1) / parts;
  r.offset[static_cast<size_t>(dim)] = b.offset[static_cast<size_t>(dim)] + lo;
  r.size[static_cast<size_t>(dim)] = hi - lo;
  return r;
}

std::vector<Box> flat_range_to_boxes(const Box& b, int64_t begin, int64_t end) {
  std::vector<Box> out;
  begin = std::max<int64_t>(begin, 0);
  end = std::min(end, b.volume());
  if (begin >= end) return out;
  const size_t nd = b.size.size();
  if (nd == 0) {
    out.push_back(b);
    return out;
  }
  // inner = elements per step of dimension 0.
  int64_t inner = 1;
  for (size_t d = 1; d < nd; ++d) inner *= b.size[d];
  Box rest = b;
  rest.offset.erase(rest.offset.begin());
  rest.size.erase(rest.size.begin());
  auto with_row = [&](int64_t row, int64_t rows, const Box& sub) {
    Box r;
    r.offset.push_back(b.offset[0] + row);
    r.size.push_back(rows);
    r.offset.insert(r.offset.end(), sub.offset.begin(), sub.offset.end());
    r.size.insert(r.size.end(), sub.size.begin(), sub.size.end());
    return r;
  };
  int64_t first_row = begin / inner, last_row = (end - 1) / inner;
  if (first_row == last_row) {
    for (const Box& sub : flat_range_to_boxes(rest, begin - first_row * inner, end - first_row * inner)) {
      out.push_back(with_row(first_row, 1, sub));
    }
    return out;
  }
  int64_t full_lo = first_row, full_hi = last_row + 1;  // rows fully covered: [full_lo, full_hi)
  if (begin % inner != 0) {
    for (const Box& sub : flat_range_to_boxes(rest, begin % inner, inner)) out.push_back(with_row(first_row, 1, sub));
    full_lo = first_row + 1;
  }
  bool partial_last = end % inner != 0;
  if (partial_last) full_hi = last_row;
  if (full_hi > full_lo) out.push_back(with_row(full_lo, full_hi - full_lo, rest));
  if (partial_last) {
    for (const Box& sub : flat_range_to_boxes(rest, 0, end % inner)) out.push_back(with_row(last_row, 1, sub));
  }
  return out;
}

void copy_region(const void* src, const Box& src_box, void* dst, const Box& dst_box, const Box& region,
                 size_t elem_size) {
  const size_t nd = region.size.size();
  if (region.volume() == 0) return;
  if (nd == 0) {
    std::memcpy(dst, src, elem_size);
    return;
  }
  // Merge trailing dimensions that are contiguous in both boxes into one run of bytes.
  size_t run_dims = 1;  // dimensions [nd-run_dims, nd) form one contiguous run
  int64_t run = region.size[nd - 1];
  while (run_dims < nd) {
    size_t d = nd - run_dims;  // the innermost dimension already in the run
    bool full = region.size[d] == src_box.size[d] && region.size[d] == dst_box.size[d];
    if (!full) break;
    run *= region.size[d - 1];
    ++run_dims;
  }
  const size_t outer_dims = nd - run_dims;
  std::vector<int64_t> src_stride(nd), dst_stride(nd);
  src_stride[nd - 1] = dst_stride[nd - 1] = 1;
  for (size_t d = nd - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src_box.size[d];
    dst_stride[d - 1] = dst_stride[d] * dst_box.size[d];
  }
  int64_t src_base = 0, dst_base = 0;
  for (size_t d = 0; d < nd; ++d) {
    src_base += (region.offset[d] - src_box.offset[d]) * src_stride[d];
    dst_base += (region.offset[d] - dst_box.offset[d]) * dst_stride[d];
  }
  const auto* s = static_cast<const unsigned char*>(src);
  auto* t = static_cast<unsigned char*>(dst);
  const size_t run_bytes = static_cast<size_t>(run) * elem_size;
  std::vector<int64_t> idx(outer_dims, 0);
  while (true) {
    int64_t so = src_base, to = dst_base;
    for (size_t d = 0; d < outer_dims; ++d) {
      so += idx[d] * src_stride[d];
      to += idx[d] * dst_stride[d];
    }
    std::memcpy(t + static_cast<size_t>(to) * elem_size, s + static_cast<size_t>(so) * elem_size, run_bytes);
    size_t d = outer_dims;
    while (d > 0) {
      --d;
      if (++idx[d] < region.size[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (outer_dims == 0) return;
  }
}

const TensorRecord* Manifest::find_tensor(std::string_view name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

nlohmann::json to_json(const RankRecord& r) {
  nlohmann::json j{
      {"rank", r.rank},  {"step", r.step}, {"run_id", r.run_id}, {"file", r.file}, {"file_bytes", r.file_bytes},
      {"state", r.state}};
  j["tensors"] = nlohmann::json::array();
  for (const auto& t : r.tensors) j["tensors"].push_back(tensor_json(t));
  j["slices"] = nlohmann::json::array();
  for (const auto& s : r.slices) j["slices"].push_back(slice_json(s));
  return j;
}

RankRecord rank_record_from_json(const nlohmann::json& j, const std::string& where) {
  try {
    RankRecord r;
    r.rank = integer_at<int>(j, "rank");
    r.step = integer_at<int64_t>(j, "step");
    r.run_id = j.at("run_id").get<std::string>();
    r.file = j.at("file").get<std::string>();
    r.file_bytes = integer_at<uint64_t>(j, "file_bytes");
    r.state = j.value("state", nlohmann::json());
    for (const auto& t : j.at("tensors")) r.tensors.push_back(tensor_from(t));
    for (const auto& s : j.at("slices")) r.slices.push_back(slice_from(s));
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": bad rank record: " + e.what());
  }
}

std::string serialize_manifest(const Manifest& m) {
  nlohmann::json j;
  j["format"] = "railyard-checkpoint";
  j["format_version"] = m.format_version;
  j["step"] = m.step;
  j["run_id"] = m.run_id;
  j["created"] = m.created;
  // Only when set, so manifests without them keep their bytes (and their CRC) as before.
  if (!m.job.empty()) j["job"] = m.job;
  if (m.generation != 0) j["generation"] = m.generation;
  j["world_size"] = m.world_size;
  j["layout"] = m.layout.is_null() ? nlohmann::json::object() : m.layout;
  j["tensors"] = nlohmann::json::array();
  for (const auto& t : m.tensors) j["tensors"].push_back(tensor_json(t));
  j["slices"] = nlohmann::json::array();
  for (const auto& s : m.slices) j["slices"].push_back(slice_json(s));
  j["files"] = nlohmann::json::object();
  for (const auto& [f, n] : m.files) j["files"][f] = n;
  j["rank_state"] = nlohmann::json::object();
  for (const auto& [r, st] : m.rank_state) j["rank_state"][std::to_string(r)] = st;
  std::string canonical = j.dump();
  j["manifest_crc32c"] = crc_hex(crc32c(canonical.data(), canonical.size()));
  return j.dump(1) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": manifest is not valid JSON (" + e.what() + ")");
  }
  try {
    if (!j.is_object() || j.value("format", "") != "railyard-checkpoint") {
      throw Error(where + ": not a railyard checkpoint manifest (field 'format' missing or wrong)");
    }
    std::string want = j.at("manifest_crc32c").get<std::string>();
    j.erase("manifest_crc32c");
    std::string canonical = j.dump();
    std::string got = crc_hex(crc32c(canonical.data(), canonical.size()));
    if (got != want) throw Error(where + ": manifest CRC32C mismatch (stored " + want + ", computed " + got + ")");
    Manifest m;
    m.format_version = integer_at<int>(j, "format_version");
    if (m.format_version > kFormatVersion) {
      throw Error(where + ": format_version " + std::to_string(m.format_version) + " is newer than this reader (" +
                  std::to_string(kFormatVersion) + "): upgrade railyard");
    }
    m.step = integer_at<int64_t>(j, "step");
    m.run_id = j.at("run_id").get<std::string>();
    m.created = j.at("created").get<std::string>();
    if (j.contains("job")) m.job = j.at("job").get<std::string>();
    if (j.contains("generation")) {
      m.generation = integer_at<int64_t>(j, "generation");
      if (m.generation < 0) throw Error(where + ": generation " + std::to_string(m.generation) + " is negative");
    }
    m.world_size = integer_at<int>(j, "world_size");
    m.layout = j.at("layout");
    for (const auto& t : j.at("tensors")) m.tensors.push_back(tensor_from(t));
    for (const auto& s : j.at("slices")) m.slices.push_back(slice_from(s));
    for (const auto& [f, n] : j.at("files").items()) {
      if (!n.is_number_unsigned() && !(n.is_number_integer() && n.get<int64_t>() >= 0))
        throw Error("field files." + f + " holds " + n.dump() + ", not a byte count");
      m.files[f] = n.get<uint64_t>();
    }
    for (const auto& [r, st] : j.at("rank_state").items()) m.rank_state[std::stoi(r)] = st;
    for (const auto& s : m.slices) {
      const TensorRecord* t = m.find_tensor(s.tensor);
      if (t == nullptr) throw Error(where + ": slice of unknown tensor '" + s.tensor + "'");
      if (!box_within(s.box, t->shape)) {
        throw Error(where + ": slice " + slice_label(s) + " lies outside " + s.tensor + shape_to_string(t->shape));
      }
      if (s.bytes != static_cast<uint64_t>(s.box.volume()) * dtype_size(t->dtype)) {
        throw Error(where + ": slice " + slice_label(s) + " has " + std::to_string(s.bytes) + " bytes, box needs " +
                    std::to_string(s.box.volume() * static_cast<int64_t>(dtype_size(t->dtype))));
      }
      auto f = m.files.find(s.file);
      if (f == m.files.end() || s.offset + s.bytes > f->second) {
        throw Error(where + ": slice " + slice_label(s) + " points outside file " + s.file);
      }
    }
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": malformed manifest: " + e.what());
  } catch (const std::invalid_argument&) {
    throw Error(where + ": malformed manifest: rank_state keys must be rank numbers");
  }
}

void validate_coverage(const Manifest& m) {
  std::map<std::string, std::vector<const SliceRecord*>> by_tensor;
  for (const auto& s : m.slices) by_tensor[s.tensor].push_back(&s);
  for (const auto& t : m.tensors) {
    const auto& slices = by_tensor[t.name];
    int64_t covered = 0;
    for (const auto* s : slices) {
      if (!box_within(s->box, t.shape))
        throw Error("tensor " + t.name + ": slice " + slice_label(*s) + " out of bounds");
      covered += s->box.volume();
    }
    if (covered != shape_volume(t.shape)) {
      throw Error("tensor " + t.name + shape_to_string(t.shape) + ": slices cover " + std::to_string(covered) + " of " +
                  std::to_string(shape_volume(t.shape)) +
                  " elements: every element must be written by exactly one rank (check replica_index/num_replicas)");
    }
    if (slices.size() <= 4096) {
      for (size_t i = 0; i < slices.size(); ++i) {
        for (size_t k = i + 1; k < slices.size(); ++k) {
          if (intersect(slices[i]->box, slices[k]->box)) {
            throw Error("tensor " + t.name + ": slices " + slice_label(*slices[i]) + " and " + slice_label(*slices[k]) +
                        " overlap");
          }
        }
      }
    }
  }
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> parse_step_dir(std::string_view name) {
  if (name.size() < 6 || name.substr(0, 5) != "step-") return std::nullopt;
  int64_t v = 0;
  for (char c : name.substr(5)) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", rank);
  return buf;
}

std::string slice_label(const SliceRecord& s) { return s.tensor + box_to_string(s.box); }

}  // namespace railyard::ckpt
