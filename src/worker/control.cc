#include "worker/control.h"

#include <cerrno>

#include "core/escape.h"

namespace corral::worker {

namespace {
core::Error invalid(std::string why) {
  return core::Error{EPROTO, "invalid control message: " + std::move(why)};
}
}  // namespace

core::Result<ManagerMessage> parse_manager_message(std::string_view packet) {
  // No exceptions: a malformed packet is a value, not a throw across the loop.
  nlohmann::json j = nlohmann::json::parse(packet, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return invalid("not JSON");
  if (!j.is_object()) return invalid("not an object");
  auto type = j.find("type");
  if (type == j.end() || !type->is_string()) return invalid("no string 'type'");

  ManagerMessage m;
  m.type_name = type->get<std::string>();
  if (m.type_name == "shutdown") {
    m.type = ManagerMessageType::kShutdown;
  } else if (m.type_name == "start") {
    m.type = ManagerMessageType::kStart;
    auto lock = j.find("lock");
    if (lock == j.end() || !lock->is_string() || lock->get_ref<const std::string&>().empty())
      return invalid("start without a 'lock' path");
    m.start.lock = lock->get<std::string>();
    if (auto a = j.find("address"); a != j.end()) {
      if (!a->is_string()) return invalid("start 'address' is not a string");
      // The wire form (core/escape.h) back to the address's bytes.
      if (!core::wire_decode(a->get_ref<const std::string&>(), m.start.address))
        return invalid("start 'address' is not a wire-form address");
    }
    if (auto s = j.find("start"); s != j.end()) m.start.start = *s;
    m.start.scripts = nlohmann::json::array();
    if (auto s = j.find("scripts"); s != j.end() && !s->is_null()) {
      if (!s->is_array()) return invalid("start 'scripts' is not an array");
      m.start.scripts = *s;
    }
  }
  return m;
}

nlohmann::json to_json(const PublicError& error) {
  nlohmann::json j = {{"message", error.message}};
  if (!error.code.empty()) j["code"] = error.code;
  if (!error.reason.empty()) j["reason"] = error.reason;
  return j;
}

std::string encode_started() {
  return R"({"type":"started"})";
}

std::string encode_ready(bool idle) {
  return idle ? R"({"type":"ready","idle":true})" : R"({"type":"ready","idle":false})";
}

std::string encode_idle(bool idle) {
  return idle ? R"({"type":"idle","idle":true})" : R"({"type":"idle","idle":false})";
}

std::string encode_fatal(const PublicError& error) {
  nlohmann::json j = {{"type", "fatal"}, {"error", to_json(error)}};
  // Replace invalid UTF-8 (an exception text may carry any bytes) instead of throwing.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace corral::worker
