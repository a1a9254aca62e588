// Confinement of job paths (data, checkpoints) to configured roots. Pure except resolve_within, which asks the
// filesystem. An empty root means "no restriction".
#pragma once

#include <optional>
#include <string>

namespace railyard::paths {

// "/a/b/../c/" -> "/a/c"; relative paths come back relative. Lexical only: no symlinks, no filesystem access.
std::string lexically_normal(const std::string& path);

// True when `path` is `root` or below it, compared component by component after lexical normalisation ("/data2"
// is not under "/data"; "/data/../etc" is not under "/data"). Both must be absolute; a relative path is outside.
bool lexically_within(const std::string& path, const std::string& root);

// The path the filesystem would reach: realpath of the longest existing prefix, then the rest lexically (so a
// symlink inside the root that points out of it counts as outside, and paths not created yet still resolve).
std::string resolve(const std::string& path);

// nullopt when `path` is confined to `root` (or root is empty); otherwise a message naming `what` (the field or
// flag), the resolved path, the root and `root_name` (its flag/variable).
std::optional<std::string> check_within(const std::string& what, const std::string& path, const std::string& root,
                                        const std::string& root_name, bool follow_symlinks);

}  // namespace railyard::paths
