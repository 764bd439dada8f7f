#include "cli/config.h"

#include <toml++/toml.h>

#include <fmt/format.h>

#include <set>

namespace corral::cli {

namespace {

class Reader {
 public:
  Reader(const toml::table& root, ConfigErrors& errors) : root_(root), errors_(errors) {}

  void check_unknown(const toml::table& table, const std::string& prefix,
                     const std::set<std::string>& known) {
    for (const auto& [k, v] : table) {
      std::string key(k.str());
      if (!known.count(key))
        errors_.problems.push_back(fmt::format("{}{}: unknown key", prefix, key));
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

}  // namespace

ConfigErrors load_config(const std::string& path, Config& c) {
  ConfigErrors errors;
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    errors.problems.push_back(
        fmt::format("{}:{}:{}: {}", path, where.line, where.column, e.description()));
    return errors;
  } catch (const std::exception& e) {
    errors.problems.push_back(fmt::format("{}: {}", path, e.what()));
    return errors;
  }
  Reader r(root, errors);
  r.check_unknown(root, "",
                  {"listen", "root", "processes", "pin", "log_level", "access_log", "allowed_hosts",
                   "relays", "limits", "timeouts", "server_name", "referrer_policy"});
  r.string(root, "listen", c.listen);
  if (auto p = core::parse_address(c.listen); !p)
    errors.problems.push_back(fmt::format("listen: {}", p.error().reason));
  r.string(root, "root", c.root);
  r.integer(root, "", "processes", c.processes, 0, 64);
  r.boolean(root, "pin", c.pin);
  std::string level;
  r.string(root, "log_level", level);
  if (!level.empty()) {
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
  r.boolean(root, "access_log", c.server.access_log);
  r.string(root, "server_name", c.server.server_name);
  r.string(root, "referrer_policy", c.server.referrer_policy);
  r.strings(root, "allowed_hosts", c.allowed_hosts);
  r.strings(root, "relays", c.relays);

  if (auto* node = root.get("limits")) {
    if (auto* t = node->as_table()) {
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
    } else {
      errors.problems.push_back("limits: expected a table");
    }
  }
  if (auto* node = root.get("timeouts")) {
    if (auto* t = node->as_table()) {
      r.check_unknown(*t, "timeouts.",
                      {"header_ms", "body_ms", "keepalive_ms", "write_ms", "ready_ms", "close_ms",
                       "linger_ms"});
      auto& s = c.server;
      constexpr int64_t kDay = 86'400'000;
      r.integer(*t, "timeouts.", "header_ms", s.header_timeout_ms, 1, kDay);
      r.integer(*t, "timeouts.", "body_ms", s.body_timeout_ms, 1, kDay);
      r.integer(*t, "timeouts.", "keepalive_ms", s.keepalive_timeout_ms, 1, kDay);
      r.integer(*t, "timeouts.", "write_ms", s.write_timeout_ms, 1, kDay);
      r.integer(*t, "timeouts.", "ready_ms", s.ready_timeout_ms, 1, kDay);
      r.integer(*t, "timeouts.", "close_ms", s.close_timeout_ms, 0, kDay);
      r.integer(*t, "timeouts.", "linger_ms", s.linger_timeout_ms, 0, kDay);
    } else {
      errors.problems.push_back("timeouts: expected a table");
    }
  }
  build_policy(c, errors);
  return errors;
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
