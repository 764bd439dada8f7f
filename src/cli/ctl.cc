#include "cli/ctl.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <limits>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "app/app.h"
#include "cli/config.h"
#include "cli/ctl_format.h"
#include "cluster/etcd_client.h"
#include "core/event_loop.h"
#include "core/owned_path.h"
#include "core/socket.h"
#include "http/percent.h"

namespace corral::cli {

namespace {

// One request to the control socket: the status and body, or (status 0) `error` and the exit
// status that says why there is no answer.
struct ControlAnswer {
  int status = 0;
  std::string body;
  std::string error;
  int exit = 0;
};

std::string control_request(const std::string& method, const std::string& path,
                            const std::string& body = {}) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
  if (method != "GET") {
    if (!body.empty()) req += "Content-Type: application/json\r\n";
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return req + "\r\n" + body;
}

// Connects to <state_dir>/control.sock and sends `request`; the socket, or why not.
std::optional<core::UniqueFd> send_request(const std::string& state_dir, const std::string& request,
                                           ControlAnswer& a) {
  std::string path = state_dir + "/control.sock";
  auto fd = core::connect_unix(path);
  if (!fd) {
    int e = fd.error().code;
    if (e == EACCES || e == EPERM) {
      a.error = fmt::format(
          "{}: permission denied: run corral ctl as the user running corral (or as root)", path);
      a.exit = kCtlNotAllowed;
    } else {
      a.error = fmt::format(
          "no corral answers on {} ({}): is one running on this state directory (a supervisor "
          "listens there: with workers, --processes N or TLS)? Name its directory with --config "
          "FILE or --state-dir DIR",
          path, std::strerror(e));
      a.exit = kCtlUnavailable;
    }
    return std::nullopt;
  }
  if (::write(fd->get(), request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    a.error = fmt::format("{}: {}", path, std::strerror(errno));
    a.exit = kCtlUnavailable;
    return std::nullopt;
  }
  return std::move(fd.value());
}

// The status line of an HTTP/1.1 answer's head; 0 if it is not one.
int parse_status(const std::string& head) {
  if (head.rfind("HTTP/1.1 ", 0) != 0 || head.size() < 12) return 0;
  return std::atoi(head.c_str() + 9);
}

void closed_without_answer(const std::string& state_dir, ControlAnswer& a) {
  a.error = fmt::format(
      "{}/control.sock closed the connection without an answer: corral refuses a user other "
      "than the one running it (run corral ctl as that user)",
      state_dir);
  a.exit = kCtlNotAllowed;
}

ControlAnswer exchange(const std::string& state_dir, const std::string& request, int timeout_ms) {
  ControlAnswer a;
  auto fd = send_request(state_dir, request, a);
  if (!fd) return a;
  std::string resp;
  char buf[16384];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    pollfd p{fd->get(), POLLIN, 0};
    int n = left > 0 ? ::poll(&p, 1, static_cast<int>(left)) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      a.error =
          fmt::format("no answer from {}/control.sock within {} s", state_dir, timeout_ms / 1000);
      a.exit = kCtlNoAnswer;
      return a;
    }
    ssize_t got = ::read(fd->get(), buf, sizeof buf);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == ECONNRESET && resp.empty()) break;
    if (got <= 0) break;
    resp.append(buf, static_cast<size_t>(got));
  }
  if (resp.empty()) {
    closed_without_answer(state_dir, a);
    return a;
  }
  auto body = resp.find("\r\n\r\n");
  a.body = body == std::string::npos ? resp : resp.substr(body + 4);
  a.status = parse_status(resp);
  if (a.status == 0) {
    a.error = state_dir + "/control.sock: not an HTTP answer";
    a.exit = kCtlUnavailable;
  }
  return a;
}

// A failure without an answer: its line on stderr, its exit status.
int no_answer(const std::string& what, const ControlAnswer& a) {
  std::cerr << "corral: ctl " << what << ": " << a.error << "\n";
  return a.exit ? a.exit : kCtlUnavailable;
}

int refused(const std::string& what, const ControlAnswer& a) {
  std::cerr << format_refusal("ctl " + what, a.status, a.body) << "\n";
  return kCtlRefused;
}

std::string json_out(const nlohmann::json& j) {
  return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// The state directory the running corral uses, resolved as `corral serve` resolves it.
int find_state_dir(const CtlOptions& o, std::string& dir) {
  std::string configured = o.state_dir;
  if (configured.empty() && !o.config_path.empty()) {
    Config config;
    auto errors = load_config(o.config_path, config);
    if (!errors.empty()) {
      for (const auto& p : errors.problems)
        std::cerr << "corral: " << o.config_path << ": " << p << "\n";
      std::cerr << "corral: ctl: --config " << o.config_path
                << " has problems (corral check --config " << o.config_path
                << "); or name the state directory with --state-dir DIR\n";
      return kCtlBadConfig;
    }
    configured = config.state_dir;
  }
  auto resolved = app::state_directory(configured);
  if (!resolved) {
    std::cerr << "corral: state-dir: " << resolved.error().reason << "\n";
    return resolved.error().code == core::kErrorUnsafePath ? app::kExitUnsafeState : kCtlBadConfig;
  }
  dir = resolved.value();
  return 0;
}

// `corral ctl rollout KIND [--to VERSION] [--json]`: waits for the report (as long as the kind's
// rollout may take, from GET /workers/kinds, plus 30 s); exit 1 when a worker failed or the
// rollout was refused.
int run_rollout(const std::string& dir, const std::string& kind, const std::string& to, bool json) {
  if (kind.empty()) {
    std::cerr << "corral: ctl rollout needs a KIND (see: corral ctl kinds)\n";
    return kCtlUsage;
  }
  const std::string what = "rollout " + kind;
  int64_t bound_ms = 120'000;  // when the kinds cannot be read: a default rollout's bound
  ControlAnswer kinds = exchange(dir, control_request("GET", "/workers/kinds"), 10'000);
  if (!kinds.error.empty()) return no_answer(what, kinds);
  if (auto j = nlohmann::json::parse(kinds.body, nullptr, false);
      !j.is_discarded() && j.is_object() && j.contains(kind) && j[kind].is_object()) {
    int64_t per_run = j[kind].value("rollout_timeout_ms", int64_t{90'000});
    // One already under way runs first.
    bound_ms = per_run * (j[kind].value("rolling", false) ? 2 : 1) + 30'000;
  }
  std::string body = to.empty() ? std::string() : nlohmann::json({{"to", to}}).dump();
  std::string path = "/workers/kinds/" + http::percent_encode_name(kind) + "/rollout";
  ControlAnswer a =
      exchange(dir, control_request("POST", path, body),
               static_cast<int>(std::min<int64_t>(bound_ms, std::numeric_limits<int>::max())));
  if (!a.error.empty()) {
    if (a.exit == kCtlNoAnswer) a.error += " (the rollout goes on: see corral ctl kinds)";
    return no_answer(what, a);
  }
  if (a.status != 200) return refused(what, a);
  auto report = nlohmann::json::parse(a.body, nullptr, false);
  if (report.is_discarded() || !report.is_object()) {
    std::cerr << "corral: ctl " << what << ": not a report: " << a.body << "\n";
    return kCtlRefused;
  }
  std::cout << (json ? json_out(report) : format_rollout(report));
  return report.value("failed", 0) > 0 ? kCtlRefused : 0;
}

// Reads a chunked body from `fd` to stdout as it comes, until its end, EOF or a signal.
int follow_stream(int fd, const std::string& state_dir, std::string& in, const std::string& what) {
  bool chunked = false;
  std::string head;
  for (;;) {
    if (head.empty()) {
      auto end = in.find("\r\n\r\n");
      if (end != std::string::npos) {
        head = in.substr(0, end + 2);
        in.erase(0, end + 4);
        int status = parse_status(head);
        if (status != 200) {
          ControlAnswer a;
          a.status = status;
          for (char buf[4096];;) {  // a refusal's body, to the end (Connection: close)
            ssize_t got = ::read(fd, buf, sizeof buf);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break;
            in.append(buf, static_cast<size_t>(got));
          }
          a.body = in;
          if (status == 0) {
            closed_without_answer(state_dir, a);
            return no_answer(what, a);
          }
          return refused(what, a);
        }
        std::string lower = head;
        std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
        chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
      }
    }
    if (!head.empty()) {
      if (!chunked) {
        std::cout << in << std::flush;
        in.clear();
      }
      while (chunked) {
        auto crlf = in.find("\r\n");
        if (crlf == std::string::npos) break;
        size_t size = std::strtoul(in.c_str(), nullptr, 16);
        if (size == 0) return 0;  // the last chunk: the server ended the stream
        if (in.size() < crlf + 2 + size + 2) break;
        std::cout << std::string_view(in).substr(crlf + 2, size);
        in.erase(0, crlf + 2 + size + 2);
      }
      std::cout << std::flush;
    }
    char buf[16384];
    ssize_t got = ::read(fd, buf, sizeof buf);
    if (got < 0 && errno == EINTR) return 0;  // Ctrl-C
    if (got <= 0) break;
    in.append(buf, static_cast<size_t>(got));
  }
  if (head.empty()) {
    ControlAnswer a;
    closed_without_answer(state_dir, a);
    return no_answer(what, a);
  }
  return 0;
}

volatile sig_atomic_t g_stop = 0;
void on_stop_signal(int) {
  g_stop = 1;
}

// SIGINT and SIGTERM set g_stop and interrupt a blocking call (no SA_RESTART): `logs -f` and
// `top` end cleanly, restoring the terminal.
void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

// `corral ctl logs ADDRESS [-n N] [-f]`: the address's last lines in its kind's log, and with -f
// every new one until Ctrl-C.
int run_logs(const std::string& dir, const CtlOptions& o) {
  if (o.address.empty()) {
    std::cerr << "corral: ctl logs needs an ADDRESS (e.g. doc:42; see: corral ctl workers)\n";
    return kCtlUsage;
  }
  const std::string what = "logs " + o.address;
  std::string path =
      fmt::format("/workers/{}/log?lines={}", http::percent_encode_name(o.address), o.lines);
  if (!o.follow) {
    ControlAnswer a = exchange(dir, control_request("GET", path), 30'000);
    if (!a.error.empty()) return no_answer(what, a);
    if (a.status != 200) return refused(what, a);
    if (a.body.empty()) std::cerr << "corral: ctl " << what << ": nothing in its kind's log yet\n";
    std::cout << a.body;
    return 0;
  }
  catch_stop_signals();
  ControlAnswer a;
  auto fd = send_request(dir, control_request("GET", path + "&follow=1"), a);
  if (!fd) return no_answer(what, a);
  std::string in;
  return follow_stream(fd->get(), dir, in, what);
}

// The terminal, in a mode for `top` while it runs: no echo, no line buffering (q is read at
// once), the alternate screen, no cursor; restored by the destructor.
class TopScreen {
 public:
  explicit TopScreen(bool tty_out) : tty_out_(tty_out) {
    if (::isatty(STDIN_FILENO) && ::tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      raw_ = ::tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    if (tty_out_) std::cout << "\x1b[?1049h\x1b[?25l" << std::flush;
  }
  ~TopScreen() {
    if (raw_) ::tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
    if (tty_out_) std::cout << "\x1b[?25h\x1b[?1049l" << std::flush;
  }
  TopScreen(const TopScreen&) = delete;
  TopScreen& operator=(const TopScreen&) = delete;
  bool reads_keys() const { return raw_; }

 private:
  bool tty_out_;
  bool raw_ = false;
  termios saved_{};
};

// One frame of `top`: the processes, the kinds and as many addresses as `rows` leaves room for
// (0: all). Its exit status is non-zero when the corral could not be asked.
int top_frame(const std::string& dir, size_t rows, std::string& out) {
  ControlAnswer p = exchange(dir, control_request("GET", "/processes"), 10'000);
  if (!p.error.empty()) return no_answer("top", p);
  if (p.status != 200) return refused("top", p);
  auto now = static_cast<int64_t>(std::time(nullptr));
  char stamp[32];
  std::tm tm;
  gmtime_r(&now, &tm);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", &tm);
  out = fmt::format("corral top  {}  {}\n", stamp, dir);
  out += format_processes(nlohmann::json::parse(p.body, nullptr, false), now);
  ControlAnswer k = exchange(dir, control_request("GET", "/workers/kinds"), 10'000);
  if (k.status != 200) return 0;  // no worker kinds: the processes are all there is
  out += "\n" + format_kinds(nlohmann::json::parse(k.body, nullptr, false));
  ControlAnswer w = exchange(dir, control_request("GET", "/workers"), 10'000);
  if (w.status != 200) return 0;
  auto state = nlohmann::json::parse(w.body, nullptr, false);
  std::string table = format_workers(state);
  size_t used = static_cast<size_t>(std::count(out.begin(), out.end(), '\n')) + 2;
  if (rows > 0) {
    size_t room = rows > used + 1 ? rows - used - 1 : 1;
    size_t lines = static_cast<size_t>(std::count(table.begin(), table.end(), '\n'));
    if (lines > room) {  // the first rows, and how many more there are
      size_t cut = 0;
      for (size_t i = 0; i < room; ++i) cut = table.find('\n', cut) + 1;
      table = table.substr(0, cut) +
              fmt::format("... {} more addresses (corral ctl workers)\n", lines - room);
    }
  }
  out += "\n" + table;
  return 0;
}

// `corral ctl top`: the frame every --interval seconds; on a terminal in place until q or
// Ctrl-C, otherwise one frame after another (--count N of them, or until a signal).
int run_top(const std::string& dir, const CtlOptions& o) {
  catch_stop_signals();
  const bool tty = ::isatty(STDOUT_FILENO);
  TopScreen screen(tty);
  int interval_ms = static_cast<int>(std::clamp(o.interval, 0.1, 3600.0) * 1000);
  for (int frame = 0; !g_stop && (o.count <= 0 || frame < o.count); ++frame) {
    size_t rows = 0;
    winsize ws{};
    if (tty && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0) rows = ws.ws_row;
    std::string out;
    if (int status = top_frame(dir, rows, out); status != 0) return status;
    if (tty)
      std::cout << "\x1b[H\x1b[2J" << out << "(q to quit)" << std::flush;
    else
      std::cout << (frame ? "\n" : "") << out << std::flush;
    if (o.count > 0 && frame + 1 >= o.count) break;
    // Wait for the next frame, or a q.
    auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(interval_ms);
    while (!g_stop) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      until - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) break;
      pollfd p{STDIN_FILENO, POLLIN, 0};
      int n = ::poll(&p, screen.reads_keys() ? 1 : 0, static_cast<int>(left));
      if (n > 0 && (p.revents & POLLIN)) {
        char c = 0;
        if (::read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q')) return 0;
      }
    }
  }
  return 0;
}

// GET /processes, /workers or /workers/kinds as a table, or its JSON.
int run_list(const std::string& dir, const CtlOptions& o) {
  std::string path = o.what == "processes" ? "/processes"
                     : o.what == "kinds"   ? "/workers/kinds"
                                           : "/workers";
  ControlAnswer a = exchange(dir, control_request("GET", path), 60'000);
  if (!a.error.empty()) return no_answer(o.what, a);
  if (a.status != 200) return refused(o.what, a);
  auto j = nlohmann::json::parse(a.body, nullptr, false);
  if (j.is_discarded()) {
    std::cerr << "corral: ctl " << o.what << ": not JSON: " << a.body.substr(0, 200) << "\n";
    return kCtlRefused;
  }
  if (o.json)
    std::cout << json_out(j);
  else if (o.what == "processes")
    std::cout << format_processes(j, static_cast<int64_t>(std::time(nullptr)));
  else if (o.what == "kinds")
    std::cout << format_kinds(j);
  else
    std::cout << format_workers(j);
  return 0;
}

// POST /workers/{address}/{retry|stop|suspend|resume}: one line saying what happened.
int run_action(const std::string& dir, const CtlOptions& o) {
  if (o.address.empty()) {
    std::cerr << "corral: ctl " << o.what
              << " needs an ADDRESS (e.g. doc:42; see: corral ctl workers)\n";
    return kCtlUsage;
  }
  const std::string what = o.what + " " + o.address;
  std::string encoded = http::percent_encode_name(o.address);  // one path segment
  ControlAnswer a =
      exchange(dir, control_request("POST", "/workers/" + encoded + "/" + o.what), 60'000);
  if (!a.error.empty()) return no_answer(what, a);
  if (a.status < 200 || a.status >= 300) return refused(what, a);
  auto j = nlohmann::json::parse(a.body, nullptr, false);
  if (o.json || j.is_discarded() || !j.is_object())
    std::cout << (j.is_discarded() ? a.body + "\n" : json_out(j));
  else
    std::cout << format_action(o.what, j);
  return 0;
}

// `ctl cluster`: the nodes in etcd and how many addresses each owns, read from the etcd that
// --config's [cluster] names (not through a running corral: any machine with the file can ask).
int run_cluster(const CtlOptions& o) {
  if (o.config_path.empty()) {
    std::cerr << "corral: ctl cluster: name the configuration with --config FILE (its [cluster] "
                 "says where etcd is)\n";
    return kCtlUsage;
  }
  Config config;
  auto errors = load_config(o.config_path, config);
  for (const auto& p : errors.problems)
    std::cerr << "corral: " << o.config_path << ": " << p << "\n";
  if (!errors.empty()) return kCtlBadConfig;
  const ClusterConfig& k = config.cluster;
  if (k.etcd.empty()) {
    std::cerr << "corral: ctl cluster: " << o.config_path << " has no [cluster] section\n";
    return kCtlBadConfig;
  }
  core::EventLoop loop;
  cluster::ClientOptions options;
  options.endpoints = k.etcd;
  options.request_timeout_ms = 3000;
  auto client = cluster::Client::create(loop, options);
  if (!client) {
    std::cerr << "corral: ctl cluster: " << client.error().reason << "\n";
    return kCtlBadConfig;
  }
  std::string nodes_prefix = k.name + "/nodes/";
  std::string addresses_prefix = k.name + "/addresses/";
  std::optional<core::Result<cluster::RangeResponse>> nodes, addresses;
  (*client)->range({.key = nodes_prefix, .range_end = cluster::prefix_end(nodes_prefix)},
                   [&](core::Result<cluster::RangeResponse> r) { nodes.emplace(std::move(r)); });
  (*client)->range(
      {.key = addresses_prefix, .range_end = cluster::prefix_end(addresses_prefix)},
      [&](core::Result<cluster::RangeResponse> r) { addresses.emplace(std::move(r)); });
  // Every call ends within the client's request timeout.
  while (!nodes || !addresses) loop.run_once(100);
  for (auto* r : {&*nodes, &*addresses}) {
    if (!*r) {
      std::cerr << "corral: ctl cluster: etcd (" << fmt::format("{}", fmt::join(k.etcd, ", "))
                << "): " << r->error().reason << "\n";
      return kCtlUnavailable;
    }
  }
  struct Row {
    std::string advertise = "-";  // an owner whose node key went (its lease is expiring)
    size_t owned = 0;
  };
  std::map<std::string, Row> rows;
  for (const auto& kv : (*nodes)->kvs)
    rows[kv.key.substr(nodes_prefix.size())].advertise = kv.value;
  size_t failed = 0;
  for (const auto& kv : (*addresses)->kvs) {
    if (kv.key.ends_with("/owner")) ++rows[kv.value].owned;
    if (kv.key.ends_with("/failed")) ++failed;
  }
  if (o.json) {
    nlohmann::json j{{"name", k.name}, {"failed", failed}, {"nodes", nlohmann::json::array()}};
    for (const auto& [node, row] : rows)
      j["nodes"].push_back(
          {{"node", node}, {"advertise", row.advertise}, {"addresses", row.owned}});
    std::cout << json_out(j);
    return 0;
  }
  size_t w_node = 4, w_adv = 9;
  for (const auto& [node, row] : rows) {
    w_node = std::max(w_node, node.size());
    w_adv = std::max(w_adv, row.advertise.size());
  }
  std::cout << fmt::format("{:<{}}  {:<{}}  {}\n", "NODE", w_node, "ADVERTISE", w_adv, "ADDRESSES");
  for (const auto& [node, row] : rows)
    std::cout << fmt::format("{:<{}}  {:<{}}  {}\n", node, w_node, row.advertise, w_adv, row.owned);
  if (failed) std::cout << failed << (failed == 1 ? " address" : " addresses") << " failed\n";
  return 0;
}

}  // namespace

CLI::App* add_ctl_command(CLI::App& app, CtlOptions& o) {
  auto* ctl = app.add_subcommand("ctl", "Ask a running corral (its control socket)");
  ctl->add_option("WHAT", o.what,
                  "processes | workers | kinds | top | logs | retry | stop | suspend | resume | "
                  "rollout | cluster (default processes)")
      ->check(CLI::IsMember({"processes", "workers", "kinds", "top", "logs", "retry", "stop",
                             "suspend", "resume", "rollout", "cluster"}));
  ctl->add_option("ADDRESS", o.address,
                  "The worker address (logs, retry, stop, suspend, resume) or the KIND (rollout)");
  ctl->add_option("--config", o.config_path,
                  "Find the running corral from its configuration file (its state_dir)");
  ctl->add_option("--state-dir", o.state_dir,
                  "The state directory of the running corral (before --config's)");
  ctl->add_flag("--json", o.json, "Print the control API's JSON, not a table or a line");
  ctl->add_option("--to", o.to, "rollout: a kept VERSION to roll back to (a prefix of 8+ digits)");
  ctl->add_option("-n,--lines", o.lines, "logs: how many of the last lines (default 100)")
      ->check(CLI::Range(size_t{1}, size_t{10'000}));
  ctl->add_flag("-f,--follow", o.follow, "logs: print each new line as it comes, until Ctrl-C");
  ctl->add_option("--count", o.count,
                  "top: stop after this many frames (default: until q or Ctrl-C)");
  ctl->add_option("--interval", o.interval, "top: seconds between frames (default 1)")
      ->check(CLI::Range(0.1, 3600.0));
  return ctl;
}

int run_ctl(const CtlOptions& o) {
  if (o.what == "cluster") return run_cluster(o);
  std::string dir;
  if (int status = find_state_dir(o, dir); status != 0) return status;
  if (o.what == "rollout") return run_rollout(dir, o.address, o.to, o.json);
  if (o.what == "logs") return run_logs(dir, o);
  if (o.what == "top") return run_top(dir, o);
  if (o.what == "processes" || o.what == "workers" || o.what == "kinds") return run_list(dir, o);
  return run_action(dir, o);
}

}  // namespace corral::cli
