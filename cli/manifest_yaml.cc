#include "cli/manifest_yaml.h"

#include <yaml-cpp/yaml.h>

#include <regex>
#include <sstream>
#include <string_view>

#include "common/error.h"

namespace railyard::cli {
namespace {

using nlohmann::json;

// YAML 1.2 core schema (what the API server's sigs.k8s.io/yaml reader uses, bar YAML 1.1's yes/no and octal).
const std::regex kInt(R"([-+]?[0-9]+|0x[0-9a-fA-F]+|0o[0-7]+)");
const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN))");

json scalar(const YAML::Node& n) {
  const std::string& s = n.Scalar();
  if (n.Tag() != "?") return s;  // quoted ("!") or explicitly tagged: a string
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  if (std::regex_match(s, kInt)) {
    try {
      size_t used = 0;
      const long long v = std::stoll(s, &used, 0);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
  }
  if (std::regex_match(s, kFloat)) {
    try {
      return std::stod(s);
    } catch (const std::exception&) {
    }
  }
  return s;
}

json to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json j = json::object();
      for (const auto& kv : n) j[kv.first.as<std::string>()] = to_json(kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      json j = json::array();
      for (const auto& v : n) j.push_back(to_json(v));
      return j;
    }
    case YAML::NodeType::Scalar:
      return scalar(n);
    default:
      return nullptr;
  }
}

// A string that can be written plain: read back, it is the same string (not a number, bool or null), and it holds
// nothing YAML gives a meaning to.
bool plain_ok(const std::string& s) {
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL" || s == "true" || s == "True" || s == "TRUE" ||
      s == "false" || s == "False" || s == "FALSE" || s == "yes" || s == "no" || s == "on" || s == "off" || s == "y" ||
      s == "n")
    return false;
  if (std::regex_match(s, kInt) || std::regex_match(s, kFloat)) return false;
  static const std::regex safe(R"([A-Za-z0-9_./$(){}\[\]=+@,;%][A-Za-z0-9_./$(){}\[\]=+@,;% :-]*)");
  if (!std::regex_match(s, safe)) return false;
  if (s.back() == ' ' || s.back() == ':' || s.find(": ") != std::string::npos || s.find(" #") != std::string::npos)
    return false;
  // YAML's indicators cannot start a plain scalar.
  return std::string_view("[]{},@%").find(s.front()) == std::string_view::npos;
}

std::string quoted(const std::string& s) { return json(s).dump(); }  // JSON strings are YAML double-quoted scalars

std::string scalar_text(const json& v) {
  if (v.is_string()) return plain_ok(v.get<std::string>()) ? v.get<std::string>() : quoted(v.get<std::string>());
  if (v.is_null()) return "null";
  return v.dump();
}

void emit(const json& v, int indent, std::ostringstream& out);

bool empty_container(const json& v) { return (v.is_object() || v.is_array()) && v.empty(); }

void emit_entry_value(const json& v, int indent, std::ostringstream& out) {
  if (empty_container(v)) {
    out << ' ' << (v.is_object() ? "{}" : "[]") << '\n';
  } else if (v.is_object()) {
    out << '\n';
    emit(v, indent + 2, out);
  } else if (v.is_array()) {
    out << '\n';
    emit(v, indent, out);  // a list under a key sits at the key's indentation, as kubectl writes it
  } else {
    out << ' ' << scalar_text(v) << '\n';
  }
}

void emit(const json& v, int indent, std::ostringstream& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  if (v.is_object()) {
    for (const auto& [k, x] : v.items()) {
      out << pad << (plain_ok(k) ? k : quoted(k)) << ':';
      emit_entry_value(x, indent, out);
    }
  } else if (v.is_array()) {
    for (const json& x : v) {
      if (x.is_object() && !x.empty()) {
        // "- " then the map's first entry on the same line, the rest aligned under it.
        std::ostringstream inner;
        emit(x, indent + 2, inner);
        std::string text = inner.str();
        out << pad << "- " << text.substr(static_cast<size_t>(indent) + 2);
      } else if (x.is_array() && !x.empty()) {
        out << pad << "-\n";
        emit(x, indent + 2, out);
      } else {
        out << pad << "- " << (empty_container(x) ? (x.is_object() ? "{}" : "[]") : scalar_text(x)) << '\n';
      }
    }
  } else {
    out << pad << scalar_text(v) << '\n';
  }
}

}  // namespace

std::vector<json> parse_manifests(const std::string& text, const std::string& origin) {
  std::vector<json> out;
  try {
    for (const YAML::Node& doc : YAML::LoadAll(text)) {
      if (!doc || doc.IsNull()) continue;
      out.push_back(to_json(doc));
    }
  } catch (const YAML::Exception& e) {
    throw Error(origin + ": not YAML (line " + std::to_string(e.mark.line + 1) + "): " + e.msg);
  }
  return out;
}

std::string to_yaml(const json& value) {
  std::ostringstream out;
  emit(value, 0, out);
  return out.str();
}

}  // namespace railyard::cli
