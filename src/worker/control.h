// The control protocol, worker side, as a sans-IO codec (STYLE rule 2): a packet received on the
// control socket in, a parsed manager message out; worker messages out as packet bytes. One JSON
// object per SOCK_SEQPACKET packet, as docs/worker-protocol.md defines. No sockets here, so the
// unit tests (control_test.cc) and a fuzzer can drive it with bytes alone.
//
// Unknown message types parse as kUnknown (forward compatibility: the caller ignores them); a
// packet that is not a JSON object with a string `type`, a `start` without its `lock`, or a
// `reload` without a positive integer `id` and a `code` object with a string `version`, or a
// `ping` whose `id` is not a non-negative integer, is an error the caller logs and drops.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/result.h"

namespace corral::worker {

// An error as it crosses to the manager (and, from there, to clients): already redacted, public.
// Empty `code` and `reason` are left out of the JSON.
struct PublicError {
  std::string message;
  std::string code;
  std::string reason;
};

enum class ManagerMessageType { kStart, kShutdown, kReload, kPing, kUnknown };

// A set of the kind's code, as `start` and `reload` carry it (docs/worker-protocol.md, "Code"):
// the version, the snapshot's directory (read-only files, never the live directory) and the
// files. A kind without code sends no `code`: version and dir are then empty. The files come by
// reference: `code.manifest` names the snapshot's manifest, which the worker reads (its text
// through parse_code_manifest) before the set is used; a message may carry them inline as `scripts`
// instead (older managers, tests).
struct CodeUpdate {
  std::string version;     // hex SHA-256 of the set
  std::string dir;         // the snapshot's directory
  std::string manifest;    // its manifest's path; empty when the message has none
  nlohmann::json scripts;  // [{"path","digest"}, ...]; an empty array when absent
};

struct StartMessage {
  std::string address;   // "doc:42"
  nlohmann::json start;  // the kind's start data (null when absent)
  CodeUpdate code;       // `scripts` and `code`
  std::string lock;      // the lock file's path
};

struct ReloadMessage {
  uint64_t id = 0;  // the manager's per-worker counter, from 1; the reply carries it back
  CodeUpdate code;  // the complete new set
};

struct ManagerMessage {
  ManagerMessageType type = ManagerMessageType::kUnknown;
  std::string type_name;  // as received, for logs
  StartMessage start;     // kStart only
  ReloadMessage reload;   // kReload only
  uint64_t ping_id = 0;   // kPing only: the pong carries it back
};

// What holds a worker (issue 14, "why alive"): its requests in flight, its open upgraded
// connections and its own busy count, as `ready` and `idle` report them.
struct Holds {
  uint64_t requests = 0;
  uint64_t upgraded = 0;
  uint64_t busy = 0;
  bool operator==(const Holds&) const = default;
};

core::Result<ManagerMessage> parse_manager_message(std::string_view packet);
// The `files` of a manifest's text ({version, files:[{path, digest}]}) whose version must be
// `version`: what `scripts` is for a set sent by reference (the worker reads the file). EPROTO
// with the reason otherwise.
core::Result<nlohmann::json> parse_code_manifest(std::string_view text, std::string_view version);

nlohmann::json to_json(const PublicError& error);
// A warm spare's (launched without an address) once it waits for `start` (issue 14).
std::string encode_standby();
std::string encode_started();
// `reload`: the application registered a reload hook (the worker can reload in place). `ready`
// always says `ping: true`: the library answers pings.
std::string encode_ready(bool idle, bool reload, const Holds& holds);
std::string encode_idle(bool idle, const Holds& holds);
std::string encode_pong(uint64_t id);
std::string encode_fatal(const PublicError& error);
// The answers to a `reload`: the hook's report (null becomes {}), or the public error. `version`
// is the reload's own (the set it was asked to run).
std::string encode_reloaded(uint64_t id, std::string_view version, const nlohmann::json& report);
std::string encode_reload_failed(uint64_t id, std::string_view version, const PublicError& error);

}  // namespace corral::worker
