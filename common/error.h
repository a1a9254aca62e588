// Errors shared by every module. Messages name the field or file at fault and the fix.
#pragma once

#include <stdexcept>
#include <string>

namespace railyard {

// A user-facing error: bad configuration, bad input file, bad manifest. what() is one line meant for
// people ("kubeconfig /x: users[0].user.token is empty: set a token or client certificate").
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Configuration or input that can never work as given: retrying will not help.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Reads a whole file; throws ConfigError("<what> <path>: <strerror>") when it cannot.
std::string read_file(const std::string& path, const std::string& what = "file");

// Environment variable or fallback.
std::string env_or(const char* name, const std::string& fallback);

}  // namespace railyard
