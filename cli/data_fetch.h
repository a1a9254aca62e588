// `railyard data prepare` inputs that are URLs (what a job's initializer pod fetches: docs/storage.md
// "Initializer"), and the content digests by which --reuse knows shards it made before.
#pragma once

#include <string>
#include <vector>

#include "worker/data/prepare.h"

namespace railyard::cli {

// http:// or https://
bool is_url(const std::string& s);

// GETs `url` into the file `path` (created or replaced), following redirects; HTTPS verifies the server against the
// system's CA bundle. Throws railyard::ConfigError naming the URL and the cause (HTTP status, connection, TLS).
void fetch_url(const std::string& url, const std::string& path);

// The inputs with each local directory replaced by the regular files under it, recursively, in path order (a corpus
// copied out of an image by a job's initializer: spec.initializer.data.image); URLs and files as they are. Throws
// railyard::ConfigError naming a directory that holds no file.
std::vector<std::string> expand_directories(const std::vector<std::string>& inputs);

// The SHA-256 of a file's content, in hex.
std::string sha256_file(const std::string& path);

// Whether `o.output_dir`/prepare.json records inputs of exactly `o.sha256` (in order) prepared with o's tokenizer,
// validation fraction and shard size, and every shard it lists is there: nothing to do again.
bool prepared_already(const worker::PrepareOptions& o);

}  // namespace railyard::cli
