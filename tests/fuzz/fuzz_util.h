// Helpers shared by the fuzz targets: the documented-error policy and a scratch directory for parsers that read files.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

namespace railyard::fuzz {

inline std::string as_string(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

// One directory per fuzzing process (libFuzzer may run several jobs side by side), removed at exit.
inline const std::string& scratch_dir() {
  // Leaked on purpose: the atexit cleanup runs after static destructors would have freed a plain static string.
  static const std::string* dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "railyard-fuzz-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::perror("railyard fuzz: mkdtemp");
      std::abort();
    }
    std::atexit([] { std::filesystem::remove_all(scratch_dir()); });
    return new std::string(tmpl);
  }();
  return *dir;
}

// Writes bytes to <scratch>/<name> (replacing it) and returns the path. Aborts on I/O errors: those are the test
// machine's problem, not a finding.
inline std::string write_scratch(const std::string& name, std::string_view bytes) {
  const std::string path = scratch_dir() + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0) {
    std::perror(("railyard fuzz: write " + path).c_str());
    std::abort();
  }
  return path;
}

}  // namespace railyard::fuzz
