#include "workers/control_codec.h"

#include <cerrno>

namespace corral::workers::control {

namespace {

WorkerMessageType type_of(std::string_view name) {
  struct Name {
    std::string_view name;
    WorkerMessageType type;
  };
  static constexpr Name kNames[] = {
      {"started", WorkerMessageType::started},   {"ready", WorkerMessageType::ready},
      {"idle", WorkerMessageType::idle},         {"fatal", WorkerMessageType::fatal},
      {"reloaded", WorkerMessageType::reloaded}, {"pong", WorkerMessageType::pong},
      {"standby", WorkerMessageType::standby},
  };
  for (const auto& n : kNames)
    if (n.name == name) return n.type;
  return WorkerMessageType::unknown;
}

}  // namespace

core::Result<WorkerMessage> decode(std::string_view packet) {
  // No exceptions (allow_exceptions false): a parse error is a discarded value, and a depth too
  // deep for the parser is one too.
  auto body = nlohmann::json::parse(packet, nullptr, false);
  if (!body.is_object()) return core::Error{EPROTO, "not a JSON message"};
  auto type = body.find("type");
  if (type == body.end() || !type->is_string()) return core::Error{EPROTO, "not a JSON message"};
  WorkerMessage m;
  m.type_name = type->get<std::string>();
  m.type = type_of(m.type_name);
  m.body = std::move(body);
  return m;
}

nlohmann::json start(std::string_view wire_address, nlohmann::json start_data, std::string lock,
                     const CodeSet* code) {
  nlohmann::json msg = {{"type", "start"},
                        {"address", std::string(wire_address)},
                        {"start", std::move(start_data)},
                        {"lock", std::move(lock)}};
  if (code) msg["code"] = code->code_json();
  return msg;
}

nlohmann::json shutdown() {
  return {{"type", "shutdown"}};
}

nlohmann::json reload(uint64_t id, const CodeSet& set) {
  return {{"type", "reload"}, {"id", id}, {"code", set.code_json()}};
}

nlohmann::json ping(uint64_t id) {
  return {{"type", "ping"}, {"id", id}};
}

core::Result<std::string> encode(const nlohmann::json& msg) {
  try {
    return msg.dump();
  } catch (const nlohmann::json::exception& e) {
    return core::Error{EINVAL, e.what()};
  }
}

}  // namespace corral::workers::control
