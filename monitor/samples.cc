#include "monitor/samples.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace railyard::monitor {
namespace {

bool name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':'; }
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }
bool blank(char c) { return c == ' ' || c == '\t'; }

class LineParser {
 public:
  LineParser(const std::string& line, std::string where) : s_(line), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(where_ + ": " + what + " (at column " + std::to_string(pos_ + 1) + ")");
  }
  void skip_blanks() {
    while (pos_ < s_.size() && blank(s_[pos_])) ++pos_;
  }
  bool done() const { return pos_ >= s_.size(); }
  char peek() const { return done() ? '\0' : s_[pos_]; }

  std::string name(bool allow_colon) {
    size_t start = pos_;
    if (done() || !name_start(s_[pos_]) || (!allow_colon && s_[pos_] == ':')) fail("expected a name");
    while (pos_ < s_.size() && name_char(s_[pos_]) && (allow_colon || s_[pos_] != ':')) ++pos_;
    return s_.substr(start, pos_ - start);
  }

  std::string quoted() {
    if (peek() != '"') fail("expected '\"' to open a label value");
    ++pos_;
    std::string out;
    while (true) {
      if (done()) fail("unterminated label value");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (c == '\\') {
        if (done()) fail("unterminated escape in label value");
        char e = s_[pos_++];
        if (e == '\\')
          out += '\\';
        else if (e == '"')
          out += '"';
        else if (e == 'n')
          out += '\n';
        else
          fail(std::string("invalid escape sequence '\\") + e + "' in label value (only \\\\, \\\" and \\n)");
      } else {
        out += c;
      }
    }
  }

  std::map<std::string, std::string> labels() {
    std::map<std::string, std::string> out;
    ++pos_;  // '{'
    skip_blanks();
    while (peek() != '}') {
      std::string key = name(false);
      skip_blanks();
      if (peek() != '=') fail("expected '=' after label name '" + key + "'");
      ++pos_;
      skip_blanks();
      std::string value = quoted();
      if (!out.emplace(key, value).second) fail("duplicate label '" + key + "'");
      skip_blanks();
      if (peek() == ',') {
        ++pos_;
        skip_blanks();
      } else if (peek() != '}') {
        fail("expected ',' or '}' after label '" + key + "'");
      }
    }
    ++pos_;
    return out;
  }

  std::string token() {
    size_t start = pos_;
    while (pos_ < s_.size() && !blank(s_[pos_])) ++pos_;
    return s_.substr(start, pos_ - start);
  }

 private:
  const std::string& s_;
  std::string where_;
  size_t pos_ = 0;
};

}  // namespace

double parse_value(const std::string& text, const std::string& what) {
  if (text == "NaN" || text == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (text == "+Inf" || text == "Inf" || text == "+inf" || text == "inf")
    return std::numeric_limits<double>::infinity();
  if (text == "-Inf" || text == "-inf") return -std::numeric_limits<double>::infinity();
  if (text.empty()) throw Error(what + ": empty value");
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(begin, &end);
  // strtod also takes "nan(...)", hex and "infinity"; the formats only allow the spellings handled above.
  if (end != begin + text.size() || errno == ERANGE || !std::isfinite(v) ||
      text.find_first_of("xXnN") != std::string::npos)
    throw Error(what + ": '" + text + "' is not a number (expected a decimal, NaN, +Inf or -Inf)");
  return v;
}

std::vector<Sample> parse_text_format(const std::string& text, const std::string& source) {
  std::vector<Sample> out;
  if (!text.empty() && text.back() != '\n') throw Error(source + ": the exposition does not end with a newline");
  size_t line_no = 0;
  size_t start = 0;
  std::map<std::string, std::string> types;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    std::string line = text.substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string where = source + " line " + std::to_string(line_no);
    LineParser p(line, where);
    p.skip_blanks();
    if (p.done()) continue;
    if (p.peek() == '#') {
      LineParser c(line, where);
      c.skip_blanks();
      c.token();  // '#'
      c.skip_blanks();
      std::string kind = c.token();
      if (kind != "HELP" && kind != "TYPE") continue;  // other comments are allowed and ignored
      c.skip_blanks();
      std::string metric = c.name(true);
      if (kind == "TYPE") {
        c.skip_blanks();
        std::string type = c.token();
        if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" && type != "untyped")
          c.fail("unknown metric type '" + type + "' for " + metric);
        if (!types.emplace(metric, type).second) c.fail("second TYPE line for " + metric);
      }
      continue;
    }
    Sample s;
    s.name = p.name(true);
    if (p.peek() == '{') s.labels = p.labels();
    if (!p.done() && !blank(p.peek())) p.fail("expected a blank after the metric name or labels");
    p.skip_blanks();
    std::string value = p.token();
    if (value.empty()) p.fail("missing value for " + s.name);
    s.value = parse_value(value, where);
    p.skip_blanks();
    if (!p.done()) {
      std::string ts = p.token();
      char* end = nullptr;
      errno = 0;
      (void)std::strtoll(ts.c_str(), &end, 10);
      if (ts.empty() || end != ts.c_str() + ts.size() || errno == ERANGE)
        p.fail("timestamp '" + ts + "' is not an integer (milliseconds)");
      p.skip_blanks();
      if (!p.done()) p.fail("unexpected text after the timestamp");
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<Sample> parse_query_response(const std::string& body, const std::string& source) {
  using nlohmann::json;
  json doc;
  try {
    doc = json::parse(body);
  } catch (const json::exception& e) {
    throw Error(source + ": response is not JSON: " + e.what());
  }
  auto fail = [&](const std::string& what) -> void { throw Error(source + ": " + what); };
  if (!doc.is_object()) fail("response is not a JSON object");
  if (!doc.contains("status") || !doc["status"].is_string()) fail("response has no string field 'status'");
  if (doc["status"] != "success") {
    std::string type = doc.value("errorType", std::string("?"));
    std::string msg = doc.contains("error") && doc["error"].is_string() ? doc["error"].get<std::string>() : "";
    fail("query failed (" + type + "): " + msg);
  }
  if (!doc.contains("data") || !doc["data"].is_object()) fail("response has no object field 'data'");
  const json& data = doc["data"];
  if (!data.contains("resultType") || !data["resultType"].is_string()) fail("data.resultType is missing");
  if (!data.contains("result")) fail("data.result is missing");
  std::string type = data["resultType"];
  auto point = [&](const json& v, const std::string& path) {
    if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_string())
      fail(path + " is not [<unix time>, \"<value>\"]");
    return parse_value(v[1].get<std::string>(), source + ": " + path);
  };
  std::vector<Sample> out;
  if (type == "scalar") {
    Sample s;
    s.value = point(data["result"], "data.result");
    out.push_back(s);
    return out;
  }
  if (type != "vector") fail("data.resultType is '" + type + "', expected 'vector' (an instant query)");
  if (!data["result"].is_array()) fail("data.result is not an array");
  for (size_t i = 0; i < data["result"].size(); ++i) {
    const json& r = data["result"][i];
    std::string path = "data.result[" + std::to_string(i) + "]";
    if (!r.is_object()) fail(path + " is not an object");
    if (!r.contains("metric") || !r["metric"].is_object()) fail(path + ".metric is missing or not an object");
    if (!r.contains("value")) fail(path + ".value is missing");
    Sample s;
    for (auto it = r["metric"].begin(); it != r["metric"].end(); ++it) {
      if (!it.value().is_string()) fail(path + ".metric." + it.key() + " is not a string");
      if (it.key() == "__name__")
        s.name = it.value();
      else
        s.labels[it.key()] = it.value();
    }
    s.value = point(r["value"], path + ".value");
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace railyard::monitor
