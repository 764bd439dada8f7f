#include "worker/control.h"

#include <cerrno>

#include <fmt/format.h>

#include "core/escape.h"

namespace corral::worker {

namespace {
core::Error invalid(std::string why) {
  return core::Error{EPROTO, "invalid control message: " + std::move(why)};
}

// `scripts` and `code` of a `start` or a `reload` into `out`; `what` names the message in errors.
// `code` may be absent (a kind without code) only when `code_required` is false.
core::Result<void> parse_code(const nlohmann::json& j, const std::string& what, bool code_required,
                              CodeUpdate& out) {
  out.scripts = nlohmann::json::array();
  if (auto s = j.find("scripts"); s != j.end() && !s->is_null()) {
    if (!s->is_array()) return invalid(what + " 'scripts' is not an array");
    out.scripts = *s;
  }
  auto code = j.find("code");
  if (code == j.end() || code->is_null()) {
    if (code_required) return invalid(what + " without 'code'");
    return {};
  }
  if (!code->is_object()) return invalid(what + " 'code' is not an object");
  auto version = code->find("version");
  if (version == code->end() || !version->is_string())
    return invalid(what + " 'code.version' is not a string");
  out.version = version->get<std::string>();
  if (auto dir = code->find("dir"); dir != code->end() && !dir->is_null()) {
    if (!dir->is_string()) return invalid(what + " 'code.dir' is not a string");
    out.dir = dir->get<std::string>();
  }
  if (auto m = code->find("manifest"); m != code->end() && !m->is_null()) {
    if (!m->is_string()) return invalid(what + " 'code.manifest' is not a string");
    out.manifest = m->get<std::string>();
  }
  return {};
}

std::string dump(const nlohmann::json& j) {
  // Replace invalid UTF-8 (an exception text, a report, may carry any bytes) instead of throwing.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
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
    if (auto r = parse_code(j, "start", /*code_required=*/false, m.start.code); !r)
      return r.error();
  } else if (m.type_name == "ping") {
    m.type = ManagerMessageType::kPing;
    auto id = j.find("id");
    if (id == j.end() || !id->is_number_unsigned()) return invalid("ping without an integer 'id'");
    m.ping_id = id->get<uint64_t>();
  } else if (m.type_name == "reload") {
    m.type = ManagerMessageType::kReload;
    auto id = j.find("id");
    if (id == j.end() || !id->is_number_unsigned() || id->get<uint64_t>() == 0)
      return invalid("reload without a positive integer 'id'");
    m.reload.id = id->get<uint64_t>();
    if (auto r = parse_code(j, "reload", /*code_required=*/true, m.reload.code); !r)
      return r.error();
  }
  return m;
}

core::Result<nlohmann::json> parse_code_manifest(std::string_view text, std::string_view version) {
  auto bad = [](std::string why) {
    return core::Error{EPROTO, "code manifest: " + std::move(why)};
  };
  nlohmann::json m = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return bad("not a JSON object");
  auto v = m.find("version");
  if (v == m.end() || !v->is_string() || v->get_ref<const std::string&>() != version)
    return bad("its version is not the set's");
  auto files = m.find("files");
  if (files == m.end() || !files->is_array()) return bad("no 'files' array");
  for (const auto& f : *files) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string())
      return bad("a file without a 'path'");
  }
  return std::move(*files);
}

nlohmann::json to_json(const PublicError& error) {
  nlohmann::json j = {{"message", error.message}};
  if (!error.code.empty()) j["code"] = error.code;
  if (!error.reason.empty()) j["reason"] = error.reason;
  return j;
}

std::string encode_standby() {
  return R"({"type":"standby"})";
}

std::string encode_started() {
  return R"({"type":"started"})";
}

std::string encode_ready(bool idle, bool reload, const Holds& holds) {
  nlohmann::json j = {{"type", "ready"},
                      {"idle", idle},
                      {"ping", true},
                      {"requests", holds.requests},
                      {"upgraded", holds.upgraded},
                      {"busy", holds.busy}};
  if (reload) j["reload"] = true;
  return j.dump();
}

std::string encode_idle(bool idle, const Holds& holds) {
  // Formatted by hand: this goes out on every flip of a busy worker.
  return fmt::format(R"({{"type":"idle","idle":{},"requests":{},"upgraded":{},"busy":{}}})",
                     idle ? "true" : "false", holds.requests, holds.upgraded, holds.busy);
}

std::string encode_pong(uint64_t id) {
  return fmt::format(R"({{"type":"pong","id":{}}})", id);
}

std::string encode_fatal(const PublicError& error) {
  return dump({{"type", "fatal"}, {"error", to_json(error)}});
}

std::string encode_reloaded(uint64_t id, std::string_view version, const nlohmann::json& report) {
  return dump({{"type", "reloaded"},
               {"id", id},
               {"version", version},
               {"report", report.is_null() ? nlohmann::json::object() : report}});
}

std::string encode_reload_failed(uint64_t id, std::string_view version, const PublicError& error) {
  return dump({{"type", "reloaded"}, {"id", id}, {"version", version}, {"error", to_json(error)}});
}

}  // namespace corral::worker
