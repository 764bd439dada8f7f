// The control protocol, manager side, as a sans-IO codec (STYLE rule 2): the twin of
// worker/control.h. A packet received from a worker on its control link in, a parsed worker
// message out; the manager's messages (`start`, `shutdown`, `reload`, `ping`) built here and
// written as packet text. One JSON object per SOCK_SEQPACKET packet, as docs/worker-protocol.md
// defines. No sockets here: the manager does the I/O (manager.cc), the unit tests
// (control_codec_test.cc) and a fuzzer (fuzz/worker_control_fuzz.cc) drive it with bytes alone.
//
// decode() checks the envelope only: a JSON object with a string `type` (anything else is an
// error the manager answers by closing the link, `worker_protocol_error`). The fields of each type
// are read by the manager where it handles them, each leniently (a missing or mistyped optional
// field is its default). Unknown types decode as `unknown` (forward compatibility: ignored).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/result.h"
#include "workers/code_set.h"

namespace corral::workers::control {

// The largest packet either side sends; a larger one is a protocol error (recv with MSG_TRUNC).
constexpr size_t kMaxPacket = 64 * 1024;

enum class WorkerMessageType { started, ready, idle, fatal, reloaded, pong, standby, unknown };

struct WorkerMessage {
  WorkerMessageType type = WorkerMessageType::unknown;
  std::string type_name;  // as received, for logs
  nlohmann::json body;    // the whole object: each type's fields are read from it
};

// A packet from a worker. EPROTO "not a JSON message" unless it is a JSON object with a string
// `type`; never throws.
core::Result<WorkerMessage> decode(std::string_view packet);

// The manager's messages. Addresses go in their wire form (core::wire_encode); the code set by
// reference (CodeSet::code_json), so its size never makes a message too large.
nlohmann::json start(std::string_view wire_address, nlohmann::json start_data, std::string lock,
                     const CodeSet* code);
nlohmann::json shutdown();
nlohmann::json reload(uint64_t id, const CodeSet& set);
nlohmann::json ping(uint64_t id);

// A message as packet text; EINVAL with the reason when it cannot be written (a string that is
// not valid UTF-8: a start hook's data, say). Never throws.
core::Result<std::string> encode(const nlohmann::json& msg);

}  // namespace corral::workers::control
