// `railyard report`: parsing the trainer's logs and rendering the page (report.h).
#include "cli/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>

#include "common/error.h"
#include "common/goodput.h"

namespace railyard::cli::report {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return kNaN;
  return it->get<double>();
}

// key=value fields of a text log line after its message ("step=3/20 loss=5.1 ..."); quoted values unescaped.
std::map<std::string, std::string> fields_after(const std::string& line, size_t pos) {
  std::map<std::string, std::string> out;
  size_t i = pos;
  while (i < line.size()) {
    while (i < line.size() && line[i] == ' ') ++i;
    size_t eq = line.find('=', i), sp = line.find(' ', i);
    if (eq == std::string::npos || (sp != std::string::npos && sp < eq)) {
      if (sp == std::string::npos) break;
      i = sp + 1;
      continue;
    }
    std::string key = line.substr(i, eq - i), value;
    i = eq + 1;
    if (i < line.size() && line[i] == '"') {
      for (++i; i < line.size() && line[i] != '"'; ++i) {
        if (line[i] == '\\' && i + 1 < line.size()) {  // common/log.cc escapes '"', '\\' and newline
          ++i;
          value += line[i] == 'n' ? '\n' : line[i];
          continue;
        }
        value += line[i];
      }
      ++i;
    } else {
      size_t end = line.find(' ', i);
      value = line.substr(i, end == std::string::npos ? std::string::npos : end - i);
      i = end == std::string::npos ? line.size() : end;
    }
    out[key] = value;
  }
  return out;
}

double to_double(const std::map<std::string, std::string>& f, const char* key) {
  auto it = f.find(key);
  if (it == f.end()) return kNaN;
  char* end = nullptr;
  double v = std::strtod(it->second.c_str(), &end);
  return end != it->second.c_str() ? v : kNaN;
}

}  // namespace

void append_step(RunLog& log, const StepPoint& p, std::string start) {
  if (!log.steps.empty() && start.empty() && p.step <= log.steps.back().step) {
    start =
        "restart (step went back from " + std::to_string(log.steps.back().step) + " to " + std::to_string(p.step) + ")";
  }
  if (!start.empty() || log.segments.empty()) {
    log.segments.push_back({p.step, p.step, 0, start.empty() ? "start" : start});
  }
  log.segments.back().last_step = p.step;
  ++log.segments.back().steps;
  log.steps.push_back(p);
}

RunLog parse_run_log(std::istream& in, const std::string& name) {
  RunLog log;
  log.name = name;
  std::string line, pending_start = "start";
  size_t lineno = 0;
  auto add_step = [&](const StepPoint& p) {
    append_step(log, p, pending_start);
    pending_start.clear();
  };
  while (std::getline(in, line)) {
    ++lineno;
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    if (line[first] == '{') {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        throw Error(name + ":" + std::to_string(lineno) + ": not a JSON object of --log-json (" + e.what() + ")");
      }
      const std::string event = j.value("event", "");
      if (event == "step") {
        StepPoint p;
        p.step = j.value("step", int64_t{0});
        p.loss = num(j, "loss");
        p.tokens_per_s = num(j, "tokens_per_s");
        p.step_ms = num(j, "step_ms");
        p.mfu = num(j, "mfu");
        p.lr = num(j, "lr");
        p.grad_norm = num(j, "grad_norm");
        const char* split[5] = {"compute_ms", "tp_comm_ms", "pp_wait_ms", "dp_comm_ms", "optimizer_ms"};
        for (int k = 0; k < 5; ++k) p.split_ms[k] = num(j, split[k]);
        add_step(p);
      } else if (event == "validation") {
        log.val.push_back({j.value("step", int64_t{0}), num(j, "val_loss")});
      } else if (event == "sample") {
        log.samples.push_back({j.value("step", int64_t{0}), j.value("text", "")});
      }
      continue;
    }
    // Text log: "<time> INFO  worker: step step=3/20 loss=..." (common/log.h), maybe behind a "[rank R] " prefix.
    if (size_t at = line.find(" worker: step "); at != std::string::npos) {
      auto f = fields_after(line, at + 14);
      StepPoint p;
      const std::string s = f["step"];
      const size_t slash = s.find('/');
      p.step = std::strtoll(s.c_str(), nullptr, 10);
      if (slash != std::string::npos) log.total_steps = std::strtoll(s.c_str() + slash + 1, nullptr, 10);
      if (p.step <= 0) continue;
      p.loss = to_double(f, "loss");
      p.tokens_per_s = to_double(f, "tok_per_s");
      p.step_ms = to_double(f, "step_ms");
      p.mfu = to_double(f, "mfu");
      p.lr = to_double(f, "lr");
      p.grad_norm = to_double(f, "grad_norm");
      std::fill(std::begin(p.split_ms), std::end(p.split_ms), kNaN);
      std::istringstream split(f["split_ms"]);
      std::string part;
      for (int k = 0; k < 5 && std::getline(split, part, '/'); ++k) p.split_ms[k] = std::strtod(part.c_str(), nullptr);
      add_step(p);
    } else if (size_t v = line.find(" worker: validation "); v != std::string::npos) {
      auto f = fields_after(line, v + 20);
      log.val.push_back({static_cast<int64_t>(to_double(f, "step")), to_double(f, "val_loss")});
    } else if (size_t smp = line.find(" worker: sample "); smp != std::string::npos) {
      auto f = fields_after(line, smp + 16);
      log.samples.push_back({static_cast<int64_t>(to_double(f, "step")), f["text"]});
    } else if (size_t r = line.find(" checkpoint: restored "); r != std::string::npos) {
      auto f = fields_after(line, r + 22);
      if (!log.steps.empty()) pending_start = "restored checkpoint step " + f["step"];
    } else if (size_t g = line.find(" agent: joined "); g != std::string::npos) {
      auto f = fields_after(line, g + 15);
      pending_start = "generation " + f["generation"] + " (world size " + f["world_size"] + ")";
    }
  }
  if (log.steps.empty()) {
    throw Error(name + ": no training steps found (expected the JSON lines of `railyard-worker train --log-json` or " +
                "the worker's text log with \"worker: step\" lines)");
  }
  return log;
}

// ---------------------------------------------------------------------------------------------------------------
namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// A short human number: 1234567 -> "1.23M", 0.000123 -> "1.23e-04".
std::string human(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt("%.3gG", v / 1e9);
  if (a >= 1e6) return fmt("%.3gM", v / 1e6);
  if (a >= 1e4) return fmt("%.3gk", v / 1e3);
  if (a == 0 || a >= 0.01) return fmt("%.4g", v);
  return fmt("%.2e", v);
}

// Each chart's first line has a colour used nowhere else on the page (report_render finds the lines by colour); further
// logs (ranks) take kOthers. Markers: restarts red, checkpoints green.
constexpr const char* kLoss = "#1f77b4";
constexpr const char* kValLoss = "#ff7f0e";
constexpr const char* kTokens = "#9467bd";
constexpr const char* kStepTime = "#8c564b";
constexpr const char* kMfu = "#17becf";
constexpr const char* kRestart = "#d62728";
constexpr const char* kCheckpoint = "#2ca02c";
const char* kOthers[] = {"#e377c2", "#7f7f7f", "#bcbd22", "#aec7e8", "#ffbb78", "#98df8a"};
// compute, tp comm, pp wait, dp comm, optimizer
const char* kSplit[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#edc948"};

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> pts;
  bool dots = false;
};
struct Marker {
  double x;
  std::string label, color;
};

// Round tick spacing (1, 2, 5 x 10^k) giving about n ticks over [lo, hi].
double nice_step(double lo, double hi, int n) {
  const double raw = (hi - lo) / n;
  const double mag = std::pow(10, std::floor(std::log10(raw)));
  const double r = raw / mag;
  return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
}

// One inline SVG line chart: x = step, y = the series; markers are vertical dashed lines (restarts, checkpoints).
std::string line_chart(const std::string& id, const std::string& title, const std::string& unit,
                       const std::vector<Series>& series, const std::vector<Marker>& markers) {
  const double W = 920, H = 270, L = 70, R = 20, T = 34, B = 40;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series) {
    for (auto [x, y] : s.pts) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  std::ostringstream o;
  o << "<figure class=\"chart\"><svg id=\"" << id << "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W
    << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H << "\" role=\"img\" aria-label=\"" << esc(title)
    << "\">\n<text x=\"" << L << "\" y=\"20\" class=\"title\">" << esc(title) << (unit.empty() ? "" : " (" + unit + ")")
    << "</text>\n";
  if (!std::isfinite(x0)) {
    o << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\" class=\"nodata\">no data in the "
      << "inputs</text></svg></figure>\n";
    return o.str();
  }
  if (x1 == x0) x0 -= 1, x1 += 1;
  if (y1 == y0) y0 -= std::max(1e-9, std::fabs(y0) * 0.1), y1 += std::max(1e-9, std::fabs(y1) * 0.1);
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;
  if (y0 < 0 && y1 - pad >= 0 && y0 + pad >= 0) y0 = 0;  // do not invent negative values for non-negative data
  const auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  const auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  o << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B
    << "\" class=\"plot\"/>\n";
  const double ys = nice_step(y0, y1, 5);
  for (double y = std::ceil(y0 / ys) * ys; y <= y1 + 1e-12; y += ys) {
    o << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << fmt("%.1f", py(y)) << "\" y2=\""
      << fmt("%.1f", py(y)) << "\" class=\"grid\"/><text x=\"" << L - 6 << "\" y=\"" << fmt("%.1f", py(y) + 4)
      << "\" text-anchor=\"end\" class=\"tick\">" << human(std::fabs(y) < ys * 1e-6 ? 0 : y) << "</text>\n";
  }
  const double xs = std::max(1.0, nice_step(x0, x1, 8));
  for (double x = std::ceil(x0 / xs) * xs; x <= x1 + 1e-9; x += xs) {
    o << "<line x1=\"" << fmt("%.1f", px(x)) << "\" x2=\"" << fmt("%.1f", px(x)) << "\" y1=\"" << H - B << "\" y2=\""
      << H - B + 5 << "\" class=\"axis\"/><text x=\"" << fmt("%.1f", px(x)) << "\" y=\"" << H - B + 18
      << "\" text-anchor=\"middle\" class=\"tick\">" << human(x) << "</text>\n";
  }
  o << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 6
    << "\" text-anchor=\"middle\" class=\"tick\">step</text>\n";
  for (const auto& m : markers) {
    if (m.x < x0 || m.x > x1) continue;
    o << "<line x1=\"" << fmt("%.1f", px(m.x)) << "\" x2=\"" << fmt("%.1f", px(m.x)) << "\" y1=\"" << T << "\" y2=\""
      << H - B << "\" stroke=\"" << m.color << "\" class=\"marker\"><title>" << esc(m.label) << "</title></line>\n";
  }
  for (const auto& s : series) {
    if (s.dots) {
      for (auto [x, y] : s.pts) {
        if (!std::isfinite(y)) continue;
        o << "<circle cx=\"" << fmt("%.1f", px(x)) << "\" cy=\"" << fmt("%.1f", py(y)) << "\" r=\"4\" fill=\""
          << s.color << "\"/>\n";
      }
      continue;
    }
    // A path broken where the value is missing (a non-finite loss) or the step goes back (a restart replays steps).
    o << "<path fill=\"none\" stroke=\"" << s.color << "\" stroke-width=\"2.5\" d=\"";
    bool pen = false;
    double last_x = -std::numeric_limits<double>::infinity();
    for (auto [x, y] : s.pts) {
      if (!std::isfinite(y)) {
        pen = false;
        continue;
      }
      o << (pen && x > last_x ? "L" : "M") << fmt("%.1f", px(x)) << "," << fmt("%.1f", py(y)) << " ";
      pen = true;
      last_x = x;
    }
    o << "\"/>\n";
  }
  // The legend sits in the title row, right of the title, so it never covers data.
  double lx = L + 24 + 8.6 * static_cast<double>(title.size() + (unit.empty() ? 0 : unit.size() + 3));
  for (const auto& s : series) {
    o << "<rect x=\"" << fmt("%.0f", lx) << "\" y=\"13\" width=\"14\" height=\"4\" fill=\"" << s.color
      << "\"/><text x=\"" << fmt("%.0f", lx + 18) << "\" y=\"19\" class=\"legend\">" << esc(s.name) << "</text>\n";
    lx += 26 + 7.0 * static_cast<double>(s.name.size());
  }
  o << "</svg></figure>\n";
  return o.str();
}

double median_of(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double quantile_of(std::vector<double> v, double q) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return kNaN;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

std::string jstr(const nlohmann::json& j, const std::string& ptr) {
  try {
    const auto& v = j.at(nlohmann::json::json_pointer(ptr));
    return v.is_string() ? v.get<std::string>() : v.dump();
  } catch (const std::exception&) {
    return "";
  }
}

std::string card(const std::string& label, const std::string& value, const std::string& id) {
  return "<div class=\"card\" id=\"" + id + "\"><div class=\"label\">" + esc(label) + "</div><div class=\"value\">" +
         esc(value.empty() ? "-" : value) + "</div></div>\n";
}

// What the page's sections share: the first log (the summary: cards, markers, split, tables) and the TrainingJob
// (an empty object without --status).
struct Page {
  const Inputs& in;
  const RunLog* main_log;
  nlohmann::json st;
};

void write_head(std::ostream& o, const Inputs& in) {
  o << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" << esc(in.title)
    << "</title>\n<style>\n"
       "body{font-family:sans-serif;margin:24px;color:#222;background:#fff;max-width:980px}\n"
       "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}\n"
       ".sub{color:#666;font-size:13px}.cards{display:flex;flex-wrap:wrap;gap:10px;margin-top:16px}\n"
       ".card{border:1px solid #ccd;border-radius:6px;padding:8px 12px;min-width:120px;background:#f6f8fb}\n"
       ".card .label{font-size:12px;color:#567}.card .value{font-size:19px;font-weight:bold}\n"
       ".chart{margin:10px 0}.plot{fill:#fbfbfd;stroke:#999}.grid{stroke:#e3e3e8}.axis{stroke:#999}\n"
       ".tick{font-size:11px;fill:#555}.title{font-size:14px;font-weight:bold;fill:#222}.legend{font-size:12px;"
       "fill:#333}\n.marker{stroke-dasharray:5,4;stroke-width:1.5}.nodata{font-size:14px;fill:#999}\n"
       "table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{border:1px solid #ccc;padding:3px 8px;"
       "text-align:left}th{background:#eef}\n</style></head><body>\n";
  o << "<h1>" << esc(in.title) << "</h1>\n<div class=\"sub\">Generated by <code>railyard report</code> at "
    << esc(in.generated_at) << " from";
  for (const auto& l : in.logs) o << " " << esc(l.name);
  if (in.status) o << ", the TrainingJob status";
  if (!in.checkpoint_dir.empty()) o << ", " << esc(in.checkpoint_dir);
  o << ".</div>\n";
}

// The per-step rates of every log (for the medians) and the most restarts any one log shows.
struct Rates {
  std::vector<double> step_ms, tok, mfu;
  size_t restarts_in_logs = 0;
};

Rates rates_of(const std::vector<RunLog>& logs) {
  Rates r;
  for (const auto& l : logs) {
    for (const auto& p : l.steps)
      r.step_ms.push_back(p.step_ms), r.tok.push_back(p.tokens_per_s), r.mfu.push_back(p.mfu);
    r.restarts_in_logs = std::max(r.restarts_in_logs, l.segments.empty() ? 0 : l.segments.size() - 1);
  }
  return r;
}

// How far the first log got: its last step and losses; the status's totalSteps wins over the log's.
struct Progress {
  int64_t last_step = 0, total = 0;
  double last_loss = kNaN, min_loss = kNaN;
};

Progress progress_of(const Page& page) {
  Progress g;
  if (page.main_log != nullptr) {
    for (const auto& p : page.main_log->steps) {
      g.last_step = std::max(g.last_step, p.step);
      if (std::isfinite(p.loss)) g.min_loss = std::isfinite(g.min_loss) ? std::min(g.min_loss, p.loss) : p.loss;
    }
    g.last_loss = page.main_log->steps.back().loss;
    g.total = page.main_log->total_steps;
  }
  const nlohmann::json& st = page.st;
  if (page.in.status && st.contains("status") && st["status"].contains("totalSteps")) {
    g.total = st["status"]["totalSteps"].get<int64_t>();
  }
  return g;
}

void write_cards(std::ostream& o, const Page& page) {
  const Inputs& in = page.in;
  const nlohmann::json& st = page.st;
  const Rates r = rates_of(in.logs);
  const Progress g = progress_of(page);
  o << "<div class=\"cards\">\n";
  if (in.status) o << card("phase", jstr(st, "/status/phase"), "card-phase");
  o << card("steps", std::to_string(g.last_step) + (g.total > 0 ? " / " + std::to_string(g.total) : ""), "card-steps");
  o << card("final loss", human(g.last_loss), "card-loss") << card("lowest loss", human(g.min_loss), "card-min-loss");
  if (page.main_log != nullptr && !page.main_log->val.empty()) {
    o << card("validation loss", human(page.main_log->val.back().val_loss), "card-val-loss");
  }
  o << card("tokens/s (median)", human(median_of(r.tok)), "card-tokens");
  o << card("step time p50 / p90", human(median_of(r.step_ms)) + " / " + human(quantile_of(r.step_ms, 0.9)) + " ms",
            "card-step-time");
  o << card("MFU (median)", std::isfinite(median_of(r.mfu)) ? fmt("%.1f%%", 100 * median_of(r.mfu)) : "-", "card-mfu");
  const std::string status_restarts = jstr(st, "/status/restarts");
  o << card("restarts", in.status && !status_restarts.empty() ? status_restarts : std::to_string(r.restarts_in_logs),
            "card-restarts");
  if (in.status) o << card("generation", jstr(st, "/status/generation"), "card-generation");
  size_t complete = 0;
  for (const auto& c : in.checkpoints) complete += c.complete ? 1 : 0;
  if (!in.checkpoint_dir.empty()) o << card("checkpoints kept", std::to_string(complete), "card-checkpoints");
  if (in.status && !jstr(st, "/status/lastCheckpoint/step").empty()) {
    o << card("last checkpoint step", jstr(st, "/status/lastCheckpoint/step"), "card-last-checkpoint");
  }
  o << "</div>\n";
}

// Markers: restarts (where a segment starts after the first) and kept checkpoints.
std::vector<Marker> markers_of(const Page& page) {
  std::vector<Marker> markers;
  if (page.main_log != nullptr) {
    const auto& segments = page.main_log->segments;
    for (size_t i = 1; i < segments.size(); ++i) {
      markers.push_back({static_cast<double>(segments[i].first_step), segments[i].start, kRestart});
    }
  }
  for (const auto& c : page.in.checkpoints) {
    if (c.complete)
      markers.push_back({static_cast<double>(c.step), "checkpoint step " + std::to_string(c.step), kCheckpoint});
  }
  return markers;
}

// One series of value(step) per log, named after the log when there are several; the first log takes `color`.
template <typename Value>
std::vector<Series> per_log(const std::vector<RunLog>& logs, Value value, const std::string& suffix,
                            const char* color) {
  std::vector<Series> out;
  for (size_t i = 0; i < logs.size(); ++i) {
    Series s;
    s.name = (logs.size() > 1 ? logs[i].name + " " : "") + suffix;
    s.color = i == 0 ? color : kOthers[(i - 1) % 6];
    for (const auto& p : logs[i].steps) s.pts.emplace_back(static_cast<double>(p.step), value(p));
    out.push_back(std::move(s));
  }
  return out;
}

// The training loss of every log with its validation losses as dots.
std::vector<Series> loss_series(const std::vector<RunLog>& logs) {
  auto loss = per_log(
      logs, [](const StepPoint& p) { return p.loss; }, "training loss", kLoss);
  for (size_t i = 0; i < logs.size(); ++i) {
    if (logs[i].val.empty()) continue;
    Series v;
    v.name = (logs.size() > 1 ? logs[i].name + " " : "") + "validation loss";
    v.color = i == 0 ? kValLoss : kOthers[(i + 2) % 6];
    v.dots = true;
    for (const auto& p : logs[i].val) v.pts.emplace_back(static_cast<double>(p.step), p.val_loss);
    loss.push_back(std::move(v));
  }
  return loss;
}

void write_training_charts(std::ostream& o, const std::vector<RunLog>& logs, const std::vector<Marker>& markers) {
  o << "<h2>Training</h2>\n";
  o << line_chart("chart-loss", "Loss", "", loss_series(logs), markers);
  o << "<div class=\"sub\">Red dashed lines: restarts (the run resumed from a checkpoint and replayed steps); green: "
       "checkpoints kept on disk.</div>\n";
  o << line_chart("chart-tokens", "Throughput", "tokens/s",
                  per_log(
                      logs, [](const StepPoint& p) { return p.tokens_per_s; }, "tokens/s", kTokens),
                  markers);
  o << line_chart("chart-step-time", "Step time", "ms",
                  per_log(
                      logs, [](const StepPoint& p) { return p.step_ms; }, "step time", kStepTime),
                  markers);
  o << line_chart("chart-mfu", "Model FLOP utilisation", "%",
                  per_log(
                      logs, [](const StepPoint& p) { return 100 * p.mfu; }, "MFU", kMfu),
                  markers);
}

// Where a step's time goes (mean over steps of the first log).
void write_step_split(std::ostream& o, const RunLog& main_log) {
  const char* names[5] = {"compute", "tensor-parallel comm", "pipeline wait", "data-parallel comm", "optimizer"};
  double mean[5] = {0, 0, 0, 0, 0};
  size_t n = 0;
  for (const auto& p : main_log.steps) {
    if (!std::isfinite(p.split_ms[0])) continue;
    for (int k = 0; k < 5; ++k) mean[k] += std::isfinite(p.split_ms[k]) ? p.split_ms[k] : 0;
    ++n;
  }
  o << "<h2>Step time split</h2>\n";
  if (n == 0) {
    o << "<p class=\"sub\">The log has no per-phase times.</p>\n";
    return;
  }
  double sum = 0;
  for (double& m : mean) m /= static_cast<double>(n), sum += m;
  o << "<svg id=\"chart-split\" xmlns=\"http://www.w3.org/2000/svg\" width=\"920\" height=\"70\">\n";
  double x = 10;
  for (int k = 0; k < 5; ++k) {
    const double w = sum > 0 ? mean[k] / sum * 900 : 0;
    if (w <= 0) continue;
    o << "<rect x=\"" << fmt("%.1f", x) << "\" y=\"8\" width=\"" << fmt("%.1f", w) << "\" height=\"26\" fill=\""
      << kSplit[k] << "\"><title>" << names[k] << " " << fmt("%.2f", mean[k]) << " ms</title></rect>\n";
    x += w;
  }
  x = 10;
  for (int k = 0; k < 5; ++k) {
    o << "<rect x=\"" << x << "\" y=\"46\" width=\"12\" height=\"12\" fill=\"" << kSplit[k] << "\"/><text x=\""
      << x + 16 << "\" y=\"57\" class=\"legend\">" << names[k] << " " << fmt("%.1f", mean[k]) << " ms</text>\n";
    x += 180;
  }
  o << "</svg>\n";
}

void write_segments(std::ostream& o, const RunLog& main_log) {
  o << "<table id=\"segments\"><tr><th>#</th><th>started by</th><th>first step</th><th>last step</th>"
       "<th>steps logged</th></tr>\n";
  for (size_t i = 0; i < main_log.segments.size(); ++i) {
    const auto& s = main_log.segments[i];
    o << "<tr><td>" << i + 1 << "</td><td>" << esc(s.start) << "</td><td>" << s.first_step << "</td><td>" << s.last_step
      << "</td><td>" << s.steps << "</td></tr>\n";
  }
  o << "</table>\n";
}

// The TrainingJob's goodput ledger, status.lastRestart and conditions, where it has them.
void write_status_tables(std::ostream& o, const nlohmann::json& st) {
  double wall = 0;
  if (const std::vector<TimeRow> rows = time_rows(st, &wall); !rows.empty()) {
    o << "<p>Where the time went (status.goodput): " << fmt("%.1f", wall)
      << " s since the job's creation</p>"
         "<table id=\"goodput\"><tr><th>cause</th><th>seconds</th><th>share</th><th>what</th></tr>\n";
    for (const TimeRow& r : rows)
      o << "<tr><td>" << esc(r.cause) << "</td><td>" << fmt("%.1f", r.seconds) << "</td><td>"
        << fmt("%.1f", r.share * 100) << " %</td><td>" << esc(r.what) << "</td></tr>\n";
    o << "</table>\n";
  }
  const auto& s = st.value("status", nlohmann::json::object());
  if (s.contains("lastRestart")) {
    o << "<p>Last restart (status.lastRestart):</p><table id=\"last-restart\">";
    for (auto& [k, v] : s["lastRestart"].items()) {
      o << "<tr><th>" << esc(k) << "</th><td>" << esc(v.is_string() ? v.get<std::string>() : v.dump()) << "</td></tr>";
    }
    o << "</table>\n";
  }
  if (s.contains("conditions")) {
    o << "<p>Conditions:</p><table id=\"conditions\"><tr><th>type</th><th>status</th><th>reason</th><th>message</th>"
         "<th>last transition</th></tr>\n";
    for (const auto& c : s["conditions"]) {
      o << "<tr><td>" << esc(c.value("type", "")) << "</td><td>" << esc(c.value("status", "")) << "</td><td>"
        << esc(c.value("reason", "")) << "</td><td>" << esc(c.value("message", "")) << "</td><td>"
        << esc(c.value("lastTransitionTime", "")) << "</td></tr>\n";
    }
    o << "</table>\n";
  }
}

void write_samples(std::ostream& o, const RunLog& main_log) {
  o << "<h2>Samples</h2>\n<div class=\"sub\">Text the model generated while training (--sample-every, "
       "spec.training.sampleEvery), from the first log.</div>\n<table id=\"samples\"><tr><th>step</th><th>text</th>"
       "</tr>\n";
  for (const auto& smp : main_log.samples) {
    o << "<tr><td>" << smp.step << "</td><td><pre>" << esc(smp.text) << "</pre></td></tr>\n";
  }
  o << "</table>\n";
}

void write_checkpoints(std::ostream& o, const Inputs& in) {
  o << "<h2>Checkpoints</h2>\n<table id=\"checkpoints\"><tr><th>step</th><th>state</th><th>size</th><th>modified "
       "(UTC)</th></tr>\n";
  for (const auto& c : in.checkpoints) {
    char when[32] = "-";
    std::tm tm{};
    if (c.modified > 0 && gmtime_r(&c.modified, &tm) != nullptr) std::strftime(when, sizeof when, "%F %T", &tm);
    o << "<tr><td>" << c.step << "</td><td>" << (c.complete ? "complete" : esc("incomplete: " + c.problem))
      << "</td><td>" << human(static_cast<double>(c.bytes)) << "B</td><td>" << when << "</td></tr>\n";
  }
  o << "</table>\n";
  if (in.checkpoints.empty()) o << "<p class=\"sub\">No checkpoint in " << esc(in.checkpoint_dir) << ".</p>\n";
}

}  // namespace

std::vector<TimeRow> time_rows(const nlohmann::json& training_job, double* wall_seconds) {
  std::vector<TimeRow> rows;
  if (!training_job.is_object() || !training_job.contains("status") || !training_job["status"].is_object()) return rows;
  const nlohmann::json& s = training_job["status"];
  if (!s.contains("goodput") || !s["goodput"].is_object() || !s["goodput"].contains("seconds") ||
      !s["goodput"]["seconds"].is_object())
    return rows;
  const nlohmann::json& secs = s["goodput"]["seconds"];
  double wall = 0;
  for (const auto& [cause, v] : secs.items())
    if (v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0) wall += v.get<double>();
  for (const auto& c : goodput::kCauses) {
    const std::string name(c.name);
    if (!secs.contains(name) || !secs[name].is_number()) continue;
    const double v = secs[name].get<double>();
    if (!std::isfinite(v) || v <= 0) continue;
    rows.push_back({name, std::string(c.what), v, wall > 0 ? v / wall : 0});
  }
  if (wall_seconds) *wall_seconds = wall;
  return rows;
}

std::vector<std::string> time_summary(const nlohmann::json& training_job) {
  double wall = 0;
  const std::vector<TimeRow> rows = time_rows(training_job, &wall);
  std::vector<std::string> lines;
  if (rows.empty()) return lines;
  const nlohmann::json& g = training_job["status"]["goodput"];
  const std::string since = g.contains("since") && g["since"].is_string() ? g["since"].get<std::string>() : "?";
  lines.push_back("where the time went (status.goodput, as of " + since + "): " + fmt("%.1f", wall) + " s");
  for (const TimeRow& r : rows) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-19s %9.1f s %5.1f %%  %s", r.cause.c_str(), r.seconds, r.share * 100,
                  r.what.c_str());
    lines.push_back(line);
  }
  return lines;
}

std::string render_html(const Inputs& in) {
  const Page page{in, in.logs.empty() ? nullptr : &in.logs.front(), in.status ? *in.status : nlohmann::json::object()};
  std::ostringstream o;
  write_head(o, in);
  write_cards(o, page);
  write_training_charts(o, in.logs, markers_of(page));
  if (page.main_log != nullptr) write_step_split(o, *page.main_log);
  // Restarts and generations.
  o << "<h2>Restarts and generations</h2>\n";
  if (page.main_log != nullptr) write_segments(o, *page.main_log);
  if (in.status) write_status_tables(o, page.st);
  if (page.main_log != nullptr && !page.main_log->samples.empty()) write_samples(o, *page.main_log);
  if (!in.checkpoint_dir.empty()) write_checkpoints(o, in);
  o << "</body></html>\n";
  return o.str();
}

}  // namespace railyard::cli::report
