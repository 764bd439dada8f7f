// The control protocol, worker side, as a sans-IO codec (STYLE rule 2): a packet received on the
// control socket in, a parsed manager message out; worker messages out as packet bytes. One JSON
// object per SOCK_SEQPACKET packet, as docs/worker-protocol.md defines. No sockets here, so the
// unit tests (control_test.cc) and a fuzzer can drive it with bytes alone.
//
// Unknown message types parse as kUnknown (forward compatibility: the caller ignores them); a
// packet that is not a JSON object with a string `type`, or a `start` without its `lock`, is an
// error the caller logs and drops.
#pragma once

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

enum class ManagerMessageType { kStart, kShutdown, kUnknown };

struct StartMessage {
  std::string address;     // "doc:42"
  nlohmann::json start;    // the kind's start data (null when absent)
  nlohmann::json scripts;  // what a rollout ships (an empty array when absent)
  std::string lock;        // the lock file's path
};

struct ManagerMessage {
  ManagerMessageType type = ManagerMessageType::kUnknown;
  std::string type_name;  // as received, for logs
  StartMessage start;     // kStart only
};

core::Result<ManagerMessage> parse_manager_message(std::string_view packet);

nlohmann::json to_json(const PublicError& error);
std::string encode_started();
std::string encode_ready(bool idle);
std::string encode_idle(bool idle);
std::string encode_fatal(const PublicError& error);

}  // namespace corral::worker
