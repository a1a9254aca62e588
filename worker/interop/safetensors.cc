#include "worker/interop/safetensors.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "common/atomic_file.h"
#include "common/error.h"

namespace railyard::worker {

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // nlohmann's ordered_json keeps insertion order, so the header lists tensors in file order (readers need not,
  // but a person reading the header does).
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    if (t.name.empty() || t.name == "__metadata__" || !seen.insert(t.name).second)
      throw Error(path + ": tensor name '" + t.name + "' is empty, reserved or repeated");
    if (n < 0 || static_cast<size_t>(n) != t.data.size())
      throw Error(path + ": tensor " + t.name + " holds " + std::to_string(t.data.size()) +
                  " values but its shape needs " + std::to_string(n));
    const uint64_t bytes = t.data.size() * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data part starts 8-byte aligned
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));  // little-endian on any host
  AtomicFileWriter w(path);
  w.write(len, sizeof(len));
  w.write(text.data(), text.size());
  for (const SafetensorsTensor& t : tensors) w.write(t.data.data(), t.data.size() * sizeof(float));
  w.commit();
}

}  // namespace railyard::worker
