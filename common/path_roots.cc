#include "common/path_roots.h"

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <vector>

namespace railyard::paths {
namespace fs = std::filesystem;

std::string lexically_normal(const std::string& path) {
  if (path.empty()) return path;
  std::string out = fs::path(path).lexically_normal().string();
  // "/a/b/" normalises to "/a/b/"; "/.." to "/": drop the trailing separator so comparisons are by component.
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

bool lexically_within(const std::string& path, const std::string& root) {
  if (path.empty() || root.empty() || path.front() != '/' || root.front() != '/') return false;
  const std::string p = lexically_normal(path), r = lexically_normal(root);
  if (r == "/") return true;
  return p == r || (p.size() > r.size() && p.compare(0, r.size(), r) == 0 && p[r.size()] == '/');
}

std::string resolve(const std::string& path) {
  if (path.empty() || path.front() != '/') return lexically_normal(path);
  fs::path p = fs::path(lexically_normal(path));
  // Walk up to the longest existing prefix; the missing tail is appended as written (normalised, so no "..").
  std::vector<fs::path> tail;
  fs::path cur = p;
  while (true) {
    char buf[PATH_MAX];
    if (::realpath(cur.c_str(), buf) != nullptr) {
      fs::path out = buf;
      for (auto it = tail.rbegin(); it != tail.rend(); ++it) out /= *it;
      return lexically_normal(out.string());
    }
    if (!cur.has_relative_path()) return p.string();
    tail.push_back(cur.filename());
    cur = cur.parent_path();
  }
}

std::optional<std::string> check_within(const std::string& what, const std::string& path, const std::string& root,
                                        const std::string& root_name, bool follow_symlinks) {
  if (root.empty()) return std::nullopt;
  if (path.empty() || path.front() != '/') {
    return what + " '" + path + "' must be an absolute path under " + root_name + " " + root;
  }
  const std::string p = follow_symlinks ? resolve(path) : lexically_normal(path);
  const std::string r = follow_symlinks ? resolve(root) : lexically_normal(root);
  if (lexically_within(p, r)) return std::nullopt;
  std::string msg = what + " '" + path + "'";
  if (p != path) msg += " (resolves to " + p + ")";
  return msg + " is outside " + root_name + " " + root + ": use a path under " + root +
         " or ask the platform team to widen " + root_name;
}

}  // namespace railyard::paths
