// The `corral` configuration: a TOML file, every key overridable by a flag. load_config() reports
// every mistake (the key and the problem), not only the first; `corral check` prints them.
// Keys and defaults are documented in docs/config.md; keep the two in step.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/log.h"
#include "http/admission.h"
#include "http/server.h"

namespace corral::cli {

// Exit status for a configuration that cannot run; a supervisor does not respawn on it.
constexpr int kExitBadConfig = 78;  // EX_CONFIG from sysexits.h

// A worker kind ([workers.<name>]): one process per address, started on demand.
struct WorkerKind {
  std::string name;
  std::vector<std::string> command;  // argv of the worker program
  std::map<std::string, std::string> env;
  std::vector<std::string> routes;  // "/doc/{id}/*": requests matching it go to "doc:{id}"
  uint32_t idle_ms = 300'000;
  uint32_t start_timeout_ms = 60'000;
  uint32_t ready_timeout_ms = 0;  // `started` -> `ready`; 0: 3 x start_timeout (the manager's)
  uint32_t stop_grace_ms = 5'000;
  uint32_t max_workers = 0;  // live workers of this kind; 0: only the global bound
  uint32_t spares = 0;       // warm spares kept launched (issue 14, process-model.md)
  // The kind's code (docs/deploying.md): a directory, relative to the configuration file's
  // directory (made absolute by load_config); empty: none. How a rollout brings a live worker to
  // a new version ("auto", "in-place" or "restart") and how long one worker's reload may take.
  std::string code;
  std::string reload = "auto";
  uint32_t reload_timeout_ms = 30'000;
  // A hanging worker (issue 14): how long the proxy waits for a response's head (then 504), and
  // the control link's heartbeat (a ping every heartbeat_ms; no pong within twice that: handled
  // as a lost link; 0: no pings).
  uint32_t response_timeout_ms = 60'000;
  uint32_t heartbeat_ms = 10'000;

  // --- Containment (issue 14; docs/config.md "Containment", workers/containment.h) ---
  // memory_max, pids_max, cpu_weight: each worker's limits (0: not limited); log_max_size,
  // log_keep: the rotation of <state>/logs/<name>.log.
  uint64_t memory_max = 0;
  uint64_t pids_max = 0;
  uint32_t cpu_weight = 0;
  uint64_t log_max_size = 10 * 1024 * 1024;
  uint32_t log_keep = 3;
  // --- end of Containment ---

  // --- Streamed request bodies (issue 14) ---
  // max_body: this kind's request body limit in bytes (an integer, or "512K", "64M", "2G",
  // binary units); nullopt: [limits] max_body. Bodies are streamed to the worker either way.
  std::optional<uint64_t> max_body;
  // --- end streamed request bodies ---
};

// [workers] max_workers, max_starting: the bounds of every kind together (0: the machine's
// defaults, workers::default_max_workers() and default_max_starting(); see process-model.md).
struct WorkerBounds {
  uint32_t max_workers = 0;
  uint32_t max_starting = 0;
};

// [tls]: HTTPS on TCP. An empty listen: no TLS listener. Empty cert and key: the dev certificate
// in <state_dir>/tls (made when absent).
// [tls] acme = { directory, email, domains, ca_file, challenges, until_issued }: certificates
// from an ACME CA, obtained and renewed by the supervisor (docs/tls.md). Instead of cert and key.
struct AcmeConfig {
  std::string directory;  // the CA's directory URL (https://...)
  std::string email;      // the account's contact ("": none)
  std::vector<std::string> domains;
  std::string ca_file;  // PEM to trust for the directory's TLS ("": the system's store)
  std::vector<std::string> challenges{"http-01", "tls-alpn-01"};  // by preference
  std::string until_issued = "dev";  // dev: the dev certificate meanwhile; refuse: no handshake
};

struct TlsConfig {
  std::string listen;  // "127.0.0.1:8443"
  std::string cert;    // PEM: the leaf first, then its chain
  std::string key;     // PEM
  std::optional<AcmeConfig> acme;
};

// [http3]: HTTP/3 on the TLS listener's port over UDP (on whenever [tls] listen is set, unless
// enabled = false). Steering and Retry are described in docs/steering.md and docs/http3.md.
struct Http3Config {
  bool enabled = true;
  std::string steering = "auto";  // auto | bpf | forward | off
  std::string retry = "auto";     // auto | on | off
  uint32_t idle_ms = 30'000;
};

// [admin]: the admin listener (control/admin.h, docs/operate.md). An empty listen: none.
// `allow` (CIDRs) admits those peers instead of loopback ones and then needs the token on every
// request; `token_file` (relative to the file's directory) holds the token, read by load_config
// into `token`.
struct AdminConfig {
  std::string listen;  // "127.0.0.1:8081"
  std::vector<std::string> allow;
  std::string token_file;
  std::string token;
};

// [cluster]: this node's place in a cluster on etcd (docs/cluster.md). Off while `etcd` is empty.
// `node` defaults to the host name, `advertise` to `listen`.
struct ClusterConfig {
  std::vector<std::string> etcd;  // "http://127.0.0.1:2379", ...
  std::string name = "corral";    // the key prefix shared by the cluster's nodes
  std::string node;
  std::string advertise;
  int ttl = 10;  // seconds: the node's etcd lease
};

struct Config {
  std::string listen = "127.0.0.1:8080";
  std::string root;   // empty: the embedded welcome site
  int processes = 1;  // 1: a single process, no supervisor; 0: one per CPU; N: a supervisor and N
  bool pin = false;   // pin process i to the i-th allowed CPU
  // Older generations a slot keeps draining after SIGHUPs (0..3: the QUIC CID's generation bits
  // allow 4 at once); past it the oldest is closed (its WebSockets get 1001).
  int max_draining_generations = 3;
  core::LogLevel log_level = core::LogLevel::kInfo;
  // log_format, access_log = "/path" (relative to the file's directory; "" with access_log =
  // true: the event log, stderr), access_log_format (docs/config.md).
  core::LogFormat log_format = core::LogFormat::kText;
  std::string access_log_path;
  core::AccessFormat access_log_format = core::AccessFormat::kCorral;
  std::vector<std::string> allowed_hosts;
  std::vector<std::string> relays;
  http::ServerOptions server;
  std::vector<WorkerKind> workers;
  WorkerBounds worker_bounds;
  bool watch = false;     // [workers] watch (or serve --watch): roll out each saved change of code
  std::string state_dir;  // empty: $XDG_STATE_HOME/corral or ./.corral
  TlsConfig tls;
  Http3Config http3;
  AdminConfig admin;
  ClusterConfig cluster;
  // With a root: serve paths with a segment starting with '.' (`.env`, `.git/`); false: 404
  // (a first segment `.well-known` is always served).
  bool serve_dotfiles = false;
  bool process_header = false;  // Corral-Process: slot=S pid=P on every response (tests, debugging)
};

struct ConfigErrors {
  std::vector<std::string> problems;  // "key: problem"
  bool empty() const { return problems.empty(); }
};

// Checks the [http3] values that are words (steering, retry); problems go to `errors`.
void check_http3(const Http3Config& h, ConfigErrors& errors);
// Reads `path` into `config` (keys not in the file keep their values).
ConfigErrors load_config(const std::string& path, Config& config);
// Builds the admission policy; problems go to `errors`.
std::shared_ptr<const http::AdmissionPolicy> build_policy(const Config& config,
                                                          ConfigErrors& errors);

}  // namespace corral::cli
