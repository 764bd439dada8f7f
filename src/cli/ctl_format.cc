#include "cli/ctl_format.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

namespace corral::cli {

namespace {

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string short_version(const nlohmann::json& v) {
  if (!v.is_string() || v.get<std::string>().empty()) return "";
  return v.get<std::string>().substr(0, 12);
}

std::string text(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Rows of cells as left-aligned columns two spaces apart; the last column is not padded.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      width[i] = std::max(width[i], row[i].size());
    }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string error_detail(const nlohmann::json& error) {
  if (!error.is_object()) return dump(error);
  std::string code = text(error, "code"), message = text(error, "message");
  if (!code.empty() && !message.empty()) return code + ": " + message;
  return code.empty() ? message : code;
}

}  // namespace

std::string rollout_result(const nlohmann::json& entry) {
  if (entry.contains("error")) return "error";
  if (entry.value("stopped", false)) return "stopped";
  auto it = entry.find("report");
  if (it != entry.end() && it->is_object() && it->value("restarted", false)) return "restarted";
  return "reloaded";
}

std::string format_rollout(const nlohmann::json& report) {
  std::vector<std::vector<std::string>> rows{{"ADDRESS", "RESULT", "DETAIL"}};
  size_t counts[4] = {0, 0, 0, 0};  // reloaded, restarted, stopped, error
  const auto& workers = report.contains("workers") ? report["workers"] : nlohmann::json::array();
  for (const auto& e : workers) {
    std::string result = rollout_result(e);
    std::string detail;
    if (result == "error") {
      detail = error_detail(e["error"]);
      ++counts[3];
    } else if (result == "stopped") {
      ++counts[2];
    } else if (result == "restarted") {
      ++counts[1];
    } else {
      const auto& r = e.contains("report") ? e["report"] : nlohmann::json();
      if (!r.is_null() && !(r.is_object() && r.empty())) detail = dump(r);
      ++counts[0];
    }
    rows.push_back({text(e, "address"), result, detail});
  }
  std::string out = workers.empty() ? std::string() : table(rows);
  std::string previous = short_version(report.value("previous", nlohmann::json()));
  std::string version = short_version(report.value("version", nlohmann::json()));
  // The version that was already current (a rollout to repair a dirty kind, or a repeated one)
  // is said so, not "was" itself.
  std::string head = fmt::format("{}: {} ({})", text(report, "kind"), version,
                                 previous.empty()      ? "was none"
                                 : previous == version ? "already current"
                                                       : "was " + previous);
  size_t cleared =
      report.contains("cleared") && report["cleared"].is_array() ? report["cleared"].size() : 0;
  uint64_t took = report.value("took_ms", uint64_t{0});
  if (workers.empty())
    out += fmt::format("{}: no live worker was on another version; {} cleared; {} ms\n", head,
                       cleared, took);
  else
    out += fmt::format(
        "{}: {} worker{}: {} reloaded, {} restarted, {} stopped, {} failed; {} cleared; {} ms\n",
        head, workers.size(), workers.size() == 1 ? "" : "s", counts[0], counts[1], counts[2],
        counts[3], cleared, took);
  return out;
}

std::string format_kinds(const nlohmann::json& kinds) {
  std::vector<std::vector<std::string>> rows{
      {"KIND", "VERSION", "DIRTY", "ROLLING", "WORKERS", "STALE", "KEPT"}};
  if (kinds.is_object())
    for (const auto& item : kinds.items()) {
      const std::string& name = item.key();
      const nlohmann::json& k = item.value();
      std::string version = short_version(k.value("version", nlohmann::json()));
      std::string kept;
      if (k.contains("versions") && k["versions"].is_array())
        for (const auto& v : k["versions"]) {
          if (!kept.empty()) kept += ' ';
          kept += short_version(v.value("version", nlohmann::json()));
          if (v.value("current", false)) kept += '*';
        }
      auto yes_no = [&k](const char* key) { return k.value(key, false) ? "yes" : "no"; };
      auto number = [&k](const char* key) { return std::to_string(k.value(key, uint64_t{0})); };
      rows.push_back({name, version.empty() ? "-" : version, yes_no("dirty"), yes_no("rolling"),
                      number("workers"), number("stale"), kept.empty() ? "-" : kept});
    }
  return table(rows);
}

std::string format_workers(const nlohmann::json& state) {
  std::vector<std::vector<std::string>> rows{
      {"ADDRESS", "STATUS", "PID", "HOLDS", "IDLE STOP", "DETAIL"}};
  if (state.is_object())
    for (const auto& [address, e] : state.items()) {
      if (!e.is_object()) continue;
      std::string pid = "-", holds = "-", idle_stop = "-", detail;
      if (auto p = e.find("pid"); p != e.end() && p->is_number_integer())
        pid = std::to_string(p->get<int64_t>());
      if (auto h = e.find("holds"); h != e.end() && h->is_object())
        holds = fmt::format("requests={} upgraded={} busy={}", h->value("requests", uint64_t{0}),
                            h->value("upgraded", uint64_t{0}), h->value("busy", uint64_t{0}));
      std::string stop_at = text(e, "idle_stop_at");
      if (!stop_at.empty())
        idle_stop = stop_at + (e.contains("idle_stop_delayed") ? " (delayed)" : "");
      if (e.contains("error")) {
        detail = error_detail(e["error"]) + " (see: corral ctl logs " + address + ")";
      } else if (e.value("suspended", false)) {
        detail = "suspended";
      } else if (std::string queued = text(e, "queuedAt"); !queued.empty()) {
        detail = "queued at " + queued;
      } else if (std::string v = short_version(e.value("version", nlohmann::json())); !v.empty()) {
        detail = "version " + v;
      }
      rows.push_back({address, text(e, "status"), pid, holds, idle_stop, detail});
    }
  return table(rows);
}

std::string format_duration(int64_t seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds < 60) return fmt::format("{}s", seconds);
  if (seconds < 3600) return fmt::format("{}m{:02}s", seconds / 60, seconds % 60);
  if (seconds < 86400) return fmt::format("{}h{:02}m", seconds / 3600, seconds % 3600 / 60);
  return fmt::format("{}d{:02}h", seconds / 86400, seconds % 86400 / 3600);
}

std::string format_processes(const nlohmann::json& processes, int64_t now) {
  if (!processes.is_object()) return dump(processes) + "\n";
  auto number = [](const nlohmann::json& o, const char* key) -> std::string {
    auto it = o.find(key);
    return it != o.end() && it->is_number() ? dump(*it) : "-";
  };
  auto since = [now](const nlohmann::json& o, const char* key) -> std::string {
    auto it = o.find(key);
    if (it == o.end() || !it->is_number_integer() || it->get<int64_t>() <= 0) return "-";
    return format_duration(now - it->get<int64_t>());
  };
  std::string out = "generation " + number(processes, "generation");
  if (processes.value("terminating", false)) out += " (terminating)";
  out += "\n";
  std::vector<std::vector<std::string>> rows{
      {"SLOT", "PID", "CPU", "GEN", "STATUS", "UPTIME", "RESTARTS", "LAST EXIT", "BACKOFF"}};
  if (auto it = processes.find("processes"); it != processes.end() && it->is_array())
    for (const auto& p : *it) {
      bool live = p.value("pid", 0) > 0;
      std::string cpu = number(p, "cpu");
      std::string last_exit = text(p, "last_exit");
      uint64_t backoff = p.value("backoff_ms", uint64_t{0});
      rows.push_back({number(p, "index"), live ? number(p, "pid") : "-", cpu == "-1" ? "-" : cpu,
                      number(p, "generation"), text(p, "status"),
                      live ? since(p, "started_at") : "-", number(p, "restarts"),
                      last_exit.empty() ? "-" : last_exit,
                      backoff ? fmt::format("{} ms", backoff) : "-"});
    }
  out += table(rows);
  std::vector<std::vector<std::string>> draining{{"DRAINING", "PID", "GEN", "STATUS", "SINCE"}};
  if (auto it = processes.find("draining"); it != processes.end() && it->is_array())
    for (const auto& d : *it)
      draining.push_back({number(d, "index"), number(d, "pid"), number(d, "generation"),
                          text(d, "status"), since(d, "since")});
  if (draining.size() > 1) out += "\n" + table(draining);
  return out;
}

std::string format_action(const std::string& verb, const nlohmann::json& answer) {
  std::string address = text(answer, "address");
  const nlohmann::json& entry =
      answer.contains("entry") ? answer["entry"] : static_cast<const nlohmann::json&>(nullptr);
  std::string status = entry.is_object() ? text(entry, "status") : "";
  std::string pid;
  if (entry.is_object())
    if (auto p = entry.find("pid"); p != entry.end() && p->is_number_integer())
      pid = fmt::format(" (pid {})", p->get<int64_t>());
  std::string line;
  if (status == "failed") {
    line = fmt::format("{}: {}: failed: {}; see: corral ctl logs {}", address, verb,
                       error_detail(entry["error"]), address);
  } else if (verb == "retry") {
    line = status.empty() ? address + ": failure cleared; the next request starts its worker"
                          : fmt::format("{}: retried; {}{}", address, status, pid);
  } else if (verb == "stop") {
    line = status.empty() ? address + ": stopped" : fmt::format("{}: {}{}", address, status, pid);
  } else if (verb == "suspend") {
    line = fmt::format(
        "{}: suspended: its requests get 503 until corral ctl resume {}{}", address, address,
        status == "stopping" ? fmt::format("; its worker{} is stopping", pid) : std::string());
  } else if (verb == "resume") {
    line = status.empty() ? address + ": resumed; the next request starts its worker"
                          : fmt::format("{}: resumed; {}{}", address, status, pid);
  } else {
    line = fmt::format("{}: {}: {}", address, verb, status.empty() ? "done" : status);
  }
  return line + "\n";
}

std::string format_refusal(const std::string& what, int status, const std::string& body) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  std::string message = body, code;
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object()) {
    message = text(j["error"], "message");
    code = text(j["error"], "code");
  }
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) message.pop_back();
  // What to do next, by what was refused.
  std::string hint;
  if (code == "not_found")
    hint = "see: corral ctl workers";
  else if (code == "unknown_kind" || code == "no_code" || code == "unknown_version")
    hint = "see: corral ctl kinds";
  else if (status == 404 && code.empty())
    hint = "this corral has no worker kinds";
  std::string out = fmt::format("corral: {}: {}", what, message.empty() ? "refused" : message);
  out += " (" + (code.empty() ? std::string() : code + ", ") + std::to_string(status) + ")";
  return hint.empty() ? out : out + "; " + hint;
}

}  // namespace corral::cli
