#include "cli/config.h"

#include <toml++/toml.h>

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "cluster/etcd_client.h"
#include "control/admin.h"
#include "workers/containment.h"

namespace corral::cli {

namespace {

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// Levenshtein distance, ignoring case (keys are short: the table is one row).
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      size_t change = diagonal + (lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1);
      row[j] = std::min({change, above + 1, row[j - 1] + 1});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known key `key` is most likely a typo of, or "": one that differs only in case, one that
// starts with the other (3 characters at least, "max_work" for "max_workers"), or one at most 2
// edits away (and fewer edits than `key` has characters: "ab" is no typo of "pin").
std::string closest_key(std::string_view key, const std::set<std::string>& known) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& k : known) {
    size_t d = edit_distance(key, k);
    std::string_view shorter = key.size() < k.size() ? key : std::string_view(k);
    std::string_view longer = key.size() < k.size() ? std::string_view(k) : key;
    bool prefix =
        shorter.size() >= 3 && edit_distance(shorter, longer.substr(0, shorter.size())) == 0;
    bool close = d == 0 || prefix || (d <= 2 && d < key.size());
    if (close && d < best_distance) {
      best = k;
      best_distance = d;
    }
  }
  return best;
}

class Reader {
 public:
  Reader(const toml::table& root, ConfigErrors& errors) : root_(root), errors_(errors) {}

  // Each key of `table` not in `known` is a problem, with the known key it is probably a typo of.
  void check_unknown(const toml::table& table, const std::string& prefix,
                     const std::set<std::string>& known) {
    for (const auto& [k, v] : table) {
      std::string key(k.str());
      if (known.count(key)) continue;
      std::string near = closest_key(key, known);
      errors_.problems.push_back(
          near.empty() ? fmt::format("{}{}: unknown key", prefix, key)
                       : fmt::format("{}{}: unknown key; did you mean \"{}\"?", prefix, key, near));
    }
  }

  template <typename T>
  void integer(const toml::table& t, const std::string& prefix, const char* key, T& out,
               int64_t min, int64_t max) {
    auto node = t.get(key);
    if (!node) return;
    auto v = node->value<int64_t>();
    if (!node->is_integer() || !v) {
      errors_.problems.push_back(fmt::format("{}{}: expected an integer", prefix, key));
      return;
    }
    if (*v < min || *v > max) {
      errors_.problems.push_back(
          fmt::format("{}{}: {} is out of range ({}..{})", prefix, key, *v, min, max));
      return;
    }
    out = static_cast<T>(*v);
  }

  void string(const toml::table& t, const char* key, std::string& out) {
    auto node = t.get(key);
    if (!node) return;
    if (!node->is_string()) {
      errors_.problems.push_back(fmt::format("{}: expected a string", key));
      return;
    }
    out = *node->value<std::string>();
  }

  void boolean(const toml::table& t, const char* key, bool& out) {
    auto node = t.get(key);
    if (!node) return;
    if (!node->is_boolean()) {
      errors_.problems.push_back(fmt::format("{}: expected true or false", key));
      return;
    }
    out = *node->value<bool>();
  }

  void strings(const toml::table& t, const char* key, std::vector<std::string>& out) {
    auto node = t.get(key);
    if (!node) return;
    auto* arr = node->as_array();
    if (!arr) {
      errors_.problems.push_back(fmt::format("{}: expected an array of strings", key));
      return;
    }
    out.clear();
    for (size_t i = 0; i < arr->size(); ++i) {
      auto s = (*arr)[i].value<std::string>();
      if (!s) {
        errors_.problems.push_back(fmt::format("{}[{}]: expected a string", key, i));
        continue;
      }
      out.push_back(*s);
    }
  }

  const toml::table& root_;
  ConfigErrors& errors_;
};

// Why the launcher (workers/launcher.cc: execvpe in the supervisor's working directory, which
// nothing changes) could not run `program`, or nothing: a name with a '/' is that path (a relative
// one from the working directory), a bare name is searched in the supervisor's PATH as glibc's
// execvpe does ("/bin:/usr/bin" when PATH is unset; an empty entry is the working directory).
std::optional<std::string> command_problem(const std::string& program) {
  auto unusable = [](const std::string& path) -> std::optional<std::string> {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0)
      return errno == ENOENT ? std::string("does not exist") : std::string(std::strerror(errno));
    if (S_ISDIR(st.st_mode)) return "is a directory";
    if (!S_ISREG(st.st_mode)) return "is not a regular file";
    if (::access(path.c_str(), X_OK) != 0) return "is not executable";
    return std::nullopt;
  };
  if (program.empty()) return "'' is not a program";
  if (program.find('/') != std::string::npos) {
    if (auto why = unusable(program)) return "'" + program + "' " + *why;
    return std::nullopt;
  }
  const char* env = std::getenv("PATH");
  std::string path = env ? env : "/bin:/usr/bin";
  for (size_t begin = 0;;) {
    size_t end = path.find(':', begin);
    std::string dir = path.substr(begin, end == std::string::npos ? end : end - begin);
    if (!unusable((dir.empty() ? "." : dir) + "/" + program)) return std::nullopt;
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return "'" + program + "' is not an executable file in PATH (" + path + ")";
}

}  // namespace

static core::Result<uint32_t> parse_duration_ms(const toml::node& n) {
  // An integer is seconds; a string is a number with a unit: "500ms", "30s", "5m", "1h".
  if (auto i = n.value<int64_t>(); i && n.is_integer()) {
    if (*i < 0 || *i > 86'400) return core::Error{EINVAL, "expected 0..86400 seconds"};
    return static_cast<uint32_t>(*i * 1000);
  }
  auto s = n.value<std::string>();
  if (!s)
    return core::Error{EINVAL, "expected seconds or a duration like \"500ms\", \"30s\", \"5m\""};
  size_t digits = 0;
  while (digits < s->size() && isdigit(static_cast<unsigned char>((*s)[digits]))) ++digits;
  if (digits == 0 || digits > 9) return core::Error{EINVAL, "'" + *s + "' is not a duration"};
  uint64_t v = std::stoull(s->substr(0, digits));
  std::string unit = s->substr(digits);
  uint64_t ms = unit == "ms"  ? v
                : unit == "s" ? v * 1000
                : unit == "m" ? v * 60'000
                : unit == "h" ? v * 3'600'000
                              : UINT64_MAX;
  if (ms == UINT64_MAX) return core::Error{EINVAL, "'" + *s + "': the unit is ms, s, m or h"};
  if (ms > 86'400'000) return core::Error{EINVAL, "'" + *s + "' is longer than a day"};
  return static_cast<uint32_t>(ms);
}

namespace {

// The directory of the configuration file `path`, absolute (a relative path is the working
// directory's): what the paths in the file are relative to.
std::string config_dir(const std::string& path) {
  std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  if (dir.empty()) dir = "/";
  if (dir[0] == '/') return dir;
  char cwd[4096];
  if (!::getcwd(cwd, sizeof cwd)) return dir;
  return dir == "." ? std::string(cwd) : std::string(cwd) + "/" + dir;
}

// The readers below, one per part of the file, append their problems to `errors` in the order
// load_config calls them: the order the messages are reported in.

// Parses `path` into `root`; false, with the parser's message, when it is not TOML.
bool parse_toml(const std::string& path, toml::table& root, ConfigErrors& errors) {
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    errors.problems.push_back(
        fmt::format("{}:{}:{}: {}", path, where.line, where.column, e.description()));
    return false;
  } catch (const std::exception& e) {
    errors.problems.push_back(fmt::format("{}: {}", path, e.what()));
    return false;
  }
  return true;
}

// [workers.<name>] command and routes: both required, the program runnable, each route keyed.
void check_worker_command_and_routes(const WorkerKind& k, const std::string& prefix,
                                     ConfigErrors& errors) {
  if (k.command.empty())
    errors.problems.push_back(prefix + "command: required (the worker's argv)");
  else if (auto why = command_problem(k.command[0]))
    errors.problems.push_back(prefix + "command: " + *why);
  if (k.routes.empty())
    errors.problems.push_back(prefix + "routes: required (e.g. [\"/" + k.name + "/{id}/*\"])");
  for (const auto& route : k.routes) {
    if (route.empty() || route[0] != '/')
      errors.problems.push_back(prefix + "routes: '" + route + "' must start with / (\"/" + route +
                                "\")");
    else if (route.find('{') == std::string::npos)
      errors.problems.push_back(prefix + "routes: '" + route +
                                "' must be a path with at least one {param} (the address key)");
  }
}

// [workers.<name>] env: a table of strings.
void read_worker_env(const toml::table& t, const std::string& prefix, WorkerKind& k,
                     ConfigErrors& errors) {
  auto* n = t.get("env");
  if (!n) return;
  if (auto* envt = n->as_table()) {
    for (const auto& [ek, ev] : *envt) {
      auto v = ev.value<std::string>();
      if (!v)
        errors.problems.push_back(prefix + "env." + std::string(ek.str()) + ": expected a string");
      else
        k.env[std::string(ek.str())] = *v;
    }
  } else {
    errors.problems.push_back(prefix + "env: expected a table of strings");
  }
}

// [workers.<name>] code (a directory, from the file's directory) and reload (a word).
void read_worker_code(const toml::table& t, const std::string& prefix, const std::string& base_dir,
                      WorkerKind& k, ConfigErrors& errors) {
  if (auto* n = t.get("code")) {
    auto v = n->value<std::string>();
    if (!n->is_string() || !v || v->empty()) {
      errors.problems.push_back(prefix + "code: expected a directory (a non-empty string)");
    } else {
      k.code = (*v)[0] == '/' ? *v : base_dir + "/" + *v;
      struct stat st;
      if (::stat(k.code.c_str(), &st) != 0)
        errors.problems.push_back(
            prefix + "code: '" + k.code + "' " +
            (errno == ENOENT ? std::string("does not exist") : std::string(std::strerror(errno))));
      else if (!S_ISDIR(st.st_mode))
        errors.problems.push_back(prefix + "code: '" + k.code + "' is not a directory");
    }
  }
  if (auto* n = t.get("reload")) {
    auto v = n->value<std::string>();
    if (!n->is_string() || !v)
      errors.problems.push_back(prefix + "reload: expected \"auto\", \"in-place\" or \"restart\"");
    else if (*v != "auto" && *v != "in-place" && *v != "restart")
      errors.problems.push_back(prefix + "reload: '" + *v +
                                "' is not one of auto, in-place, restart");
    else
      k.reload = *v;
  }
}

// --- Containment (issue 14): [workers.<name>] memory_max, pids_max, cpu_weight, log_max_size,
// log_keep (docs/config.md "Containment"). A size is bytes (an integer) or a string with a unit,
// "256M" (workers::parse_size).
void read_worker_containment(Reader& r, const toml::table& t, const std::string& prefix,
                             WorkerKind& k, ConfigErrors& errors) {
  auto size = [&](const char* key, uint64_t& out, uint64_t min) {
    auto* n = t.get(key);
    if (!n) return;
    core::Result<uint64_t> v = core::Error{EINVAL, "expected bytes or a size like \"256M\""};
    if (auto i = n->value<int64_t>(); i && n->is_integer())
      v = *i > 0 ? core::Result<uint64_t>(static_cast<uint64_t>(*i))
                 : core::Error{EINVAL, "a size is at least 1 byte"};
    else if (auto str = n->value<std::string>())
      v = workers::parse_size(*str);
    if (v && *v < min) v = core::Error{EINVAL, fmt::format("at least {} bytes", min)};
    if (!v)
      errors.problems.push_back(prefix + key + ": " + v.error().reason);
    else
      out = *v;
  };
  // Below a megabyte no worker runtime starts; a log file below 4 KiB would hold a line or two.
  size("memory_max", k.memory_max, 1024 * 1024);
  r.integer(t, prefix, "pids_max", k.pids_max, 1, 4'194'304);
  r.integer(t, prefix, "cpu_weight", k.cpu_weight, 1, 10'000);
  size("log_max_size", k.log_max_size, 4096);
  r.integer(t, prefix, "log_keep", k.log_keep, 0, 100);
}
// --- end of Containment ---
// --- Streamed request bodies (issue 14) ---
// [workers.<name>] max_body: bytes or a size ("64M", "2G"; workers::parse_size), at most 1T as
// [limits] max_body.
void read_worker_max_body(const toml::table& t, const std::string& prefix, WorkerKind& k,
                          ConfigErrors& errors) {
  auto* n = t.get("max_body");
  if (!n) return;
  constexpr uint64_t kMax = uint64_t{1} << 40;
  core::Result<uint64_t> v = core::Error{EINVAL, "expected bytes or a size like \"64M\", \"2G\""};
  if (auto i = n->value<int64_t>(); i && n->is_integer())
    v = *i >= 0 ? core::Result<uint64_t>(static_cast<uint64_t>(*i))
                : core::Error{EINVAL, "expected 0..1T bytes"};
  else if (auto str = n->value<std::string>())
    v = workers::parse_size(*str);
  if (v && *v > kMax) v = core::Error{EINVAL, "more than 1T"};
  if (!v)
    errors.problems.push_back(prefix + "max_body: " + v.error().reason);
  else
    k.max_body = v.value();
}
// --- end streamed request bodies ---

// One [workers.<name>] table, appended to c.workers. `base_dir`: the configuration file's
// directory (absolute), what `code` is relative to.
void read_worker_kind(Reader& r, std::string_view name, const toml::table& t,
                      const std::string& prefix, const std::string& base_dir, Config& c,
                      ConfigErrors& errors) {
  WorkerKind k;
  k.name = std::string(name);
  bool name_ok = !k.name.empty();
  for (char ch : k.name)
    name_ok = name_ok && (isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-');
  if (!name_ok)
    errors.problems.push_back(prefix.substr(0, prefix.size() - 1) +
                              ": a kind name is letters, digits, '-' and '_'");
  r.check_unknown(
      t, prefix,
      {"command",          "env",         "routes",       "idle",          "start_timeout",
       "stop_grace",       "max_workers", "code",         "reload",        "reload_timeout",
       "response_timeout", "heartbeat",   "spares",       "ready_timeout", "memory_max",
       "pids_max",         "cpu_weight",  "log_max_size", "log_keep",      "max_body"});
  auto strings = [&](const char* key, std::vector<std::string>& out) {
    auto* n = t.get(key);
    if (!n) return;
    auto* arr = n->as_array();
    if (!arr) {
      errors.problems.push_back(prefix + key + ": expected an array of strings");
      return;
    }
    for (size_t i = 0; i < arr->size(); ++i) {
      auto v = (*arr)[i].value<std::string>();
      if (!v)
        errors.problems.push_back(fmt::format("{}{}[{}]: expected a string", prefix, key, i));
      else
        out.push_back(*v);
    }
  };
  strings("command", k.command);
  strings("routes", k.routes);
  check_worker_command_and_routes(k, prefix, errors);
  read_worker_env(t, prefix, k, errors);
  auto duration = [&](const char* key, uint32_t& out) {
    auto* n = t.get(key);
    if (!n) return;
    auto ms = parse_duration_ms(*n);
    if (!ms)
      errors.problems.push_back(prefix + key + ": " + ms.error().reason);
    else
      out = ms.value();
  };
  duration("idle", k.idle_ms);
  duration("start_timeout", k.start_timeout_ms);
  if (t.get("ready_timeout")) {  // unset: 3 x start_timeout (workers::KindConfig)
    size_t problems = errors.problems.size();
    uint32_t ms = 0;
    duration("ready_timeout", ms);
    if (errors.problems.size() == problems && ms == 0)
      errors.problems.push_back(prefix + "ready_timeout: must be more than 0");
    k.ready_timeout_ms = ms;
  }
  duration("stop_grace", k.stop_grace_ms);
  r.integer(t, prefix, "max_workers", k.max_workers, 1, 1'000'000);
  r.integer(t, prefix, "spares", k.spares, 0, 1'000);
  read_worker_code(t, prefix, base_dir, k, errors);
  if (t.get("reload_timeout")) {
    uint32_t ms = k.reload_timeout_ms;
    duration("reload_timeout", ms);
    if (ms == 0)
      errors.problems.push_back(prefix + "reload_timeout: must be more than 0");
    else
      k.reload_timeout_ms = ms;
  }
  if (t.get("response_timeout")) {
    uint32_t ms = k.response_timeout_ms;
    duration("response_timeout", ms);
    if (ms == 0)
      errors.problems.push_back(prefix + "response_timeout: must be more than 0");
    else
      k.response_timeout_ms = ms;
  }
  duration("heartbeat", k.heartbeat_ms);
  read_worker_containment(r, t, prefix, k, errors);
  read_worker_max_body(t, prefix, k, errors);  // streamed request bodies (issue 14)
  c.workers.push_back(std::move(k));
}

// [workers]: the kinds' tables, and beside them the bounds of all kinds together and `watch`.
void read_workers(Reader& r, const toml::node& node, const std::string& base_dir, Config& c,
                  ConfigErrors& errors) {
  auto* kinds = node.as_table();
  if (!kinds) {
    errors.problems.push_back("workers: expected a table of worker kinds ([workers.<name>])");
    return;
  }
  for (const auto& [name, kind_node] : *kinds) {
    std::string prefix = "workers." + std::string(name.str()) + ".";
    if (name.str() == "watch") {
      if (kind_node.is_table())
        errors.problems.push_back(
            "workers.watch: a worker kind may not have this name (it is a switch, true or false)");
      else if (!kind_node.is_boolean())
        errors.problems.push_back("workers.watch: expected true or false");
      else
        c.watch = *kind_node.value<bool>();
      continue;
    }
    if (name.str() == "max_workers" || name.str() == "max_starting") {
      if (kind_node.is_table()) {
        errors.problems.push_back(prefix.substr(0, prefix.size() - 1) +
                                  ": a worker kind may not have this name (it is the bound "
                                  "of all kinds, an integer)");
      } else {
        auto& out = name.str() == "max_workers" ? c.worker_bounds.max_workers
                                                : c.worker_bounds.max_starting;
        r.integer(*kinds, "workers.", std::string(name.str()).c_str(), out, 1,
                  name.str() == "max_workers" ? 1'000'000 : 10'000);
      }
      continue;
    }
    auto* t = kind_node.as_table();
    if (!t) {
      errors.problems.push_back(prefix.substr(0, prefix.size() - 1) + ": expected a table");
      continue;
    }
    read_worker_kind(r, name.str(), *t, prefix, base_dir, c, errors);
  }
}

// log_format, access_log (true, false or a path), access_log_format.
// A word a careless operator writes for a boolean: as a quoted string it would name a file.
bool is_boolean_word(std::string_view s) {
  for (std::string_view w : {"yes", "no", "true", "false", "on", "off"}) {
    if (s.size() == w.size() && std::equal(s.begin(), s.end(), w.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) == b;
        }))
      return true;
  }
  return false;
}

void read_logs(Reader& r, const toml::table& root, const std::string& base_dir, Config& c,
               ConfigErrors& errors) {
  std::string format;
  r.string(root, "log_format", format);
  if (format == "json")
    c.log_format = core::LogFormat::kJson;
  else if (format == "text")
    c.log_format = core::LogFormat::kText;
  else if (!format.empty())
    errors.problems.push_back("log_format: expected \"text\" or \"json\"");
  if (auto* v = root.get("access_log")) {
    if (v->is_boolean()) {
      c.server.access_log = *v->value<bool>();
    } else if (v->is_string() && is_boolean_word(*v->value<std::string>())) {
      errors.problems.push_back("access_log: \"" + *v->value<std::string>() +
                                "\" would be a file name: write true or false without quotes, or "
                                "a file path such as \"access.log\"");
    } else if (v->is_string() && !v->value<std::string>()->empty()) {
      std::string path = *v->value<std::string>();
      c.access_log_path = path.front() == '/' ? path : base_dir + "/" + path;
      c.server.access_log = true;
    } else {
      errors.problems.push_back("access_log: expected true, false or a file path");
    }
  }
  format.clear();
  r.string(root, "access_log_format", format);
  if (format == "combined")
    c.access_log_format = core::AccessFormat::kCombined;
  else if (format == "corral")
    c.access_log_format = core::AccessFormat::kCorral;
  else if (!format.empty())
    errors.problems.push_back("access_log_format: expected \"corral\" or \"combined\"");
}

void read_log_level(Reader& r, const toml::table& root, Config& c, ConfigErrors& errors) {
  std::string level;
  r.string(root, "log_level", level);
  if (level.empty()) return;
  if (level == "debug")
    c.log_level = core::LogLevel::kDebug;
  else if (level == "info")
    c.log_level = core::LogLevel::kInfo;
  else if (level == "warn")
    c.log_level = core::LogLevel::kWarn;
  else if (level == "error")
    c.log_level = core::LogLevel::kError;
  else
    errors.problems.push_back("log_level: expected one of debug, info, warn, error");
}

// [limits]
void read_limits(Reader& r, const toml::node& node, Config& c, ConfigErrors& errors) {
  auto* t = node.as_table();
  if (!t) {
    errors.problems.push_back("limits: expected a table");
    return;
  }
  r.check_unknown(
      *t, "limits.",
      {"max_request_line", "max_head_bytes", "max_headers", "max_body", "max_connections"});
  auto& l = c.server.limits;
  r.integer(*t, "limits.", "max_request_line", l.max_request_line, 64, 1 << 20);
  r.integer(*t, "limits.", "max_head_bytes", l.max_head_bytes, 256, 1 << 24);
  r.integer(*t, "limits.", "max_headers", l.max_headers, 1, 10'000);
  r.integer(*t, "limits.", "max_body", l.max_body, 0, int64_t{1} << 40);
  r.integer(*t, "limits.", "max_connections", c.server.max_connections, 1, 10'000'000);
  if (l.max_request_line > l.max_head_bytes)
    errors.problems.push_back("limits.max_request_line: larger than limits.max_head_bytes");
}

// [timeouts]
void read_timeouts(Reader& r, const toml::node& node, Config& c, ConfigErrors& errors) {
  auto* t = node.as_table();
  if (!t) {
    errors.problems.push_back("timeouts: expected a table");
    return;
  }
  r.check_unknown(*t, "timeouts.",
                  {"header_ms", "body_ms", "keepalive_ms", "write_ms", "ready_ms", "close_ms",
                   "drain_ms", "linger_ms"});
  auto& s = c.server;
  constexpr int64_t kDay = 86'400'000;
  r.integer(*t, "timeouts.", "header_ms", s.header_timeout_ms, 1, kDay);
  r.integer(*t, "timeouts.", "body_ms", s.body_timeout_ms, 1, kDay);
  r.integer(*t, "timeouts.", "keepalive_ms", s.keepalive_timeout_ms, 1, kDay);
  r.integer(*t, "timeouts.", "write_ms", s.write_timeout_ms, 1, kDay);
  r.integer(*t, "timeouts.", "ready_ms", s.ready_timeout_ms, 1, kDay);
  r.integer(*t, "timeouts.", "close_ms", s.close_timeout_ms, 0, kDay);
  r.integer(*t, "timeouts.", "drain_ms", s.drain_timeout_ms, 0, kDay);
  r.integer(*t, "timeouts.", "linger_ms", s.linger_timeout_ms, 0, kDay);
}

// [tls] acme = { ... }
void read_acme(Reader& r, const toml::node& node, Config& c, ConfigErrors& errors) {
  auto* t = node.as_table();
  if (!t) {
    errors.problems.push_back("tls.acme: expected a table");
    return;
  }
  r.check_unknown(*t, "tls.acme.",
                  {"directory", "email", "domains", "ca_file", "challenges", "until_issued"});
  AcmeConfig a;
  for (auto [key, out] :
       {std::pair{"directory", &a.directory}, std::pair{"email", &a.email},
        std::pair{"ca_file", &a.ca_file}, std::pair{"until_issued", &a.until_issued}}) {
    if (auto* v = t->get(key)) {
      if (v->is_string())
        *out = *v->value<std::string>();
      else
        errors.problems.push_back(fmt::format("tls.acme.{}: expected a string", key));
    }
  }
  for (auto [key, out] :
       {std::pair{"domains", &a.domains}, std::pair{"challenges", &a.challenges}}) {
    auto* v = t->get(key);
    if (!v) continue;
    auto* arr = v->as_array();
    if (!arr) {
      errors.problems.push_back(fmt::format("tls.acme.{}: expected an array of strings", key));
      continue;
    }
    out->clear();
    for (size_t i = 0; i < arr->size(); ++i) {
      if (auto s = (*arr)[i].value<std::string>(); s && !s->empty())
        out->push_back(*s);
      else
        errors.problems.push_back(fmt::format("tls.acme.{}[{}]: expected a string", key, i));
    }
  }
  if (a.directory.rfind("https://", 0) != 0 && a.directory.rfind("http://", 0) != 0)
    errors.problems.push_back("tls.acme.directory: expected the CA's directory URL (https://...)");
  if (a.domains.empty())
    errors.problems.push_back("tls.acme.domains: expected at least one domain");
  for (const auto& d : a.domains)
    if (d.find_first_of("/ *:") != std::string::npos)
      errors.problems.push_back(fmt::format("tls.acme.domains: \"{}\" is not a DNS name", d));
  if (a.challenges.empty())
    errors.problems.push_back("tls.acme.challenges: expected \"http-01\" and/or \"tls-alpn-01\"");
  for (const auto& ch : a.challenges)
    if (ch != "http-01" && ch != "tls-alpn-01")
      errors.problems.push_back(
          fmt::format("tls.acme.challenges: \"{}\": expected \"http-01\" or \"tls-alpn-01\"", ch));
  if (a.until_issued != "dev" && a.until_issued != "refuse")
    errors.problems.push_back("tls.acme.until_issued: expected \"dev\" or \"refuse\"");
  if (!c.tls.cert.empty() || !c.tls.key.empty())
    errors.problems.push_back("tls.acme: set either acme or cert and key, not both");
  if (c.tls.listen.empty())
    errors.problems.push_back("tls.acme: needs tls.listen (the port the certificate is for)");
  c.tls.acme = std::move(a);
}

// [tls]
void read_tls(Reader& r, const toml::node& node, Config& c, ConfigErrors& errors) {
  auto* t = node.as_table();
  if (!t) {
    errors.problems.push_back("tls: expected a table");
    return;
  }
  r.check_unknown(*t, "tls.", {"listen", "cert", "key", "acme"});
  for (auto [key, out] : {std::pair{"listen", &c.tls.listen}, std::pair{"cert", &c.tls.cert},
                          std::pair{"key", &c.tls.key}}) {
    auto* v = t->get(key);
    if (!v) continue;
    if (!v->is_string()) {
      errors.problems.push_back(fmt::format("tls.{}: expected a string", key));
      continue;
    }
    *out = *v->value<std::string>();
  }
  if (!c.tls.listen.empty())
    if (auto p = core::parse_address(c.tls.listen); !p)
      errors.problems.push_back(fmt::format("tls.listen: {}", p.error().reason));
  if (c.tls.cert.empty() != c.tls.key.empty())
    errors.problems.push_back("tls.cert, tls.key: set both (or neither: the dev certificate)");
  if (auto* acme = t->get("acme")) read_acme(r, *acme, c, errors);
}

// [http3]
void read_http3(Reader& r, const toml::node& node, Config& c, ConfigErrors& errors) {
  auto* t = node.as_table();
  if (!t) {
    errors.problems.push_back("http3: expected a table");
    return;
  }
  r.check_unknown(*t, "http3.", {"enabled", "steering", "retry", "idle_ms"});
  r.boolean(*t, "enabled", c.http3.enabled);
  r.string(*t, "steering", c.http3.steering);
  r.string(*t, "retry", c.http3.retry);
  r.integer(*t, "http3.", "idle_ms", c.http3.idle_ms, 1'000, 600'000);
  check_http3(c.http3, errors);
}

// [admin]
void read_admin(Reader& r, const toml::node& node, const std::string& base_dir, Config& c,
                ConfigErrors& errors) {
  auto* t = node.as_table();
  if (!t) {
    errors.problems.push_back("admin: expected a table");
    return;
  }
  r.check_unknown(*t, "admin.", {"listen", "allow", "token_file"});
  for (auto [key, out] :
       {std::pair{"listen", &c.admin.listen}, std::pair{"token_file", &c.admin.token_file}}) {
    if (auto* v = t->get(key)) {
      if (v->is_string())
        *out = *v->value<std::string>();
      else
        errors.problems.push_back(fmt::format("admin.{}: expected a string", key));
    }
  }
  if (auto* v = t->get("allow")) {
    auto* arr = v->as_array();
    for (size_t i = 0; arr && i < arr->size(); ++i) {
      auto s = (*arr)[i].value<std::string>();
      if (!s) {
        errors.problems.push_back(fmt::format("admin.allow[{}]: expected a string", i));
        continue;
      }
      if (auto cidr = http::parse_relay(*s); !cidr)
        errors.problems.push_back(fmt::format("admin.allow[{}]: {}", i, cidr.error().reason));
      c.admin.allow.push_back(*s);
    }
    if (!arr) errors.problems.push_back("admin.allow: expected an array of CIDRs");
  }
  if (!c.admin.listen.empty())
    if (auto p = core::parse_address(c.admin.listen); !p)
      errors.problems.push_back(fmt::format("admin.listen: {}", p.error().reason));
  if (!c.admin.token_file.empty()) {
    if (c.admin.token_file.front() != '/') c.admin.token_file = base_dir + "/" + c.admin.token_file;
    auto token = control::read_token_file(c.admin.token_file);
    if (token)
      c.admin.token = std::move(token.value());
    else
      errors.problems.push_back("admin.token_file: " + token.error().reason);
  } else if (!c.admin.allow.empty()) {
    errors.problems.push_back(
        "admin.token_file: required with admin.allow (every request from those peers needs the "
        "token)");
  }
}

// [cluster] etcd = [...], name, node, advertise, ttl
void read_cluster(Reader& r, const toml::node& node, Config& c, ConfigErrors& errors) {
  auto* t = node.as_table();
  if (!t) {
    errors.problems.push_back("cluster: expected a table");
    return;
  }
  r.check_unknown(*t, "cluster.", {"etcd", "name", "node", "advertise", "ttl"});
  ClusterConfig& k = c.cluster;
  for (auto [key, out] : {std::pair{"name", &k.name}, std::pair{"node", &k.node},
                          std::pair{"advertise", &k.advertise}}) {
    if (auto* v = t->get(key)) {
      if (v->is_string())
        *out = *v->value<std::string>();
      else
        errors.problems.push_back(fmt::format("cluster.{}: expected a string", key));
    }
  }
  r.integer(*t, "cluster.", "ttl", k.ttl, 2, 3600);  // etcd grants 2 s at least
  if (auto* v = t->get("etcd")) {
    auto* arr = v->as_array();
    for (size_t i = 0; arr && i < arr->size(); ++i) {
      auto s = (*arr)[i].value<std::string>();
      if (!s) {
        errors.problems.push_back(fmt::format("cluster.etcd[{}]: expected a string", i));
        continue;
      }
      if (auto e = cluster::parse_endpoint(*s); !e)
        errors.problems.push_back(fmt::format("cluster.etcd[{}]: {}", i, e.error().reason));
      k.etcd.push_back(*s);
    }
    if (!arr) errors.problems.push_back("cluster.etcd: expected an array of http://IP:port");
  }
  if (k.etcd.empty()) errors.problems.push_back("cluster.etcd: expected at least one endpoint");
  if (k.name.empty() || k.name.find('/') != std::string::npos)
    errors.problems.push_back("cluster.name: expected a non-empty key prefix without '/'");
  if (k.node.empty()) {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) == 0) k.node = host;
  }
  if (k.node.empty() || k.node.find('/') != std::string::npos)
    errors.problems.push_back("cluster.node: expected a node id without '/'");
  if (k.advertise.empty()) k.advertise = c.listen;
}

}  // namespace

ConfigErrors load_config(const std::string& path, Config& c) {
  ConfigErrors errors;
  toml::table root;
  if (!parse_toml(path, root, errors)) return errors;
  Reader r(root, errors);
  r.check_unknown(root, "",
                  {"listen",
                   "root",
                   "processes",
                   "pin",
                   "max_draining_generations",
                   "state_dir",
                   "workers",
                   "log_level",
                   "log_format",
                   "access_log",
                   "access_log_format",
                   "allowed_hosts",
                   "relays",
                   "limits",
                   "timeouts",
                   "server_name",
                   "referrer_policy",
                   "tls",
                   "http3",
                   "process_header",
                   "serve_dotfiles",
                   "admin",
                   "cluster"});
  r.string(root, "listen", c.listen);
  if (auto p = core::parse_address(c.listen); !p)
    errors.problems.push_back(fmt::format("listen: {}", p.error().reason));
  r.string(root, "root", c.root);
  r.boolean(root, "serve_dotfiles", c.serve_dotfiles);
  r.integer(root, "", "processes", c.processes, 0, 64);
  r.integer(root, "", "max_draining_generations", c.max_draining_generations, 0, 3);
  r.string(root, "state_dir", c.state_dir);
  if (auto* node = root.get("workers")) read_workers(r, *node, config_dir(path), c, errors);
  r.boolean(root, "pin", c.pin);
  read_log_level(r, root, c, errors);
  read_logs(r, root, config_dir(path), c, errors);
  r.boolean(root, "process_header", c.process_header);
  r.string(root, "server_name", c.server.server_name);
  r.string(root, "referrer_policy", c.server.referrer_policy);
  r.strings(root, "allowed_hosts", c.allowed_hosts);
  r.strings(root, "relays", c.relays);
  if (auto* node = root.get("limits")) read_limits(r, *node, c, errors);
  if (auto* node = root.get("timeouts")) read_timeouts(r, *node, c, errors);
  if (auto* node = root.get("tls")) read_tls(r, *node, c, errors);
  if (auto* node = root.get("http3")) read_http3(r, *node, c, errors);
  if (auto* node = root.get("admin")) read_admin(r, *node, config_dir(path), c, errors);
  if (auto* node = root.get("cluster")) read_cluster(r, *node, c, errors);
  build_policy(c, errors);
  return errors;
}

void check_http3(const Http3Config& h, ConfigErrors& errors) {
  if (h.steering != "auto" && h.steering != "bpf" && h.steering != "forward" && h.steering != "off")
    errors.problems.push_back(
        fmt::format("http3.steering: '{}' is not one of auto, bpf, forward, off", h.steering));
  if (h.retry != "auto" && h.retry != "on" && h.retry != "off")
    errors.problems.push_back(
        fmt::format("http3.retry: '{}' is not one of auto, on, off", h.retry));
}

std::shared_ptr<const http::AdmissionPolicy> build_policy(const Config& c, ConfigErrors& errors) {
  auto policy = std::make_shared<http::AdmissionPolicy>();
  for (size_t i = 0; i < c.allowed_hosts.size(); ++i) {
    auto host = http::normalize_allowed_host(c.allowed_hosts[i]);
    if (!host) {
      errors.problems.push_back(fmt::format("allowed_hosts[{}]: {}", i, host.error().reason));
      continue;
    }
    policy->allowed_hosts.push_back(std::move(host.value()));
  }
  for (size_t i = 0; i < c.relays.size(); ++i) {
    auto relay = http::parse_relay(c.relays[i]);
    if (!relay) {
      errors.problems.push_back(fmt::format("relays[{}]: {}", i, relay.error().reason));
      continue;
    }
    policy->relays.push_back(relay.value());
  }
  return policy;
}

}  // namespace corral::cli
