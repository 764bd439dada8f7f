#include "workers/link_codec.h"

#include <cerrno>
#include <limits>

#include "core/escape.h"
#include "core/message_link.h"

namespace corral::workers::link {

namespace {

constexpr auto kReplace = nlohmann::json::error_handler_t::replace;

core::Error bad(const char* reason) {
  return core::Error{EINVAL, reason};
}

// Link messages nest a few levels (a report's stats); copying and dumping a JSON value recurse on
// the thread's stack, so deeper text is refused before it is parsed (a pass over the bytes that
// skips strings).
constexpr int kMaxDepth = 16;
bool shallow(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) return false;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return true;
}

const nlohmann::json* field(const nlohmann::json& m, const char* key) {
  auto it = m.find(key);
  return it == m.end() ? nullptr : &*it;
}

// A positive id; 0 when missing or not one.
uint64_t id_of(const nlohmann::json& m) {
  const auto* id = field(m, "id");
  return id && id->is_number_unsigned() ? id->get<uint64_t>() : 0;
}

const std::string* string_of(const nlohmann::json& m, const char* key) {
  const auto* f = field(m, key);
  return f && f->is_string() ? f->get_ptr<const std::string*>() : nullptr;
}

std::optional<std::string> address_of(const nlohmann::json& m) {
  const auto* text = string_of(m, "address");
  std::string address;
  if (!text || !core::wire_decode(*text, address)) return std::nullopt;
  return address;
}

Refused refused_of(const nlohmann::json& m, uint64_t id) {
  Refused r;
  r.id = id;
  if (const auto* s = field(m, "status"); s && s->is_number_integer()) {
    auto status = s->get<int64_t>();
    if (status >= 400 && status <= 599) r.status = static_cast<int>(status);
  }
  if (const auto* e = field(m, "error"); e && e->is_object()) r.error = *e;
  if (const auto* ra = field(m, "retryAfter"); ra && ra->is_number_unsigned()) {
    auto s = ra->get<uint64_t>();
    r.retry_after_s = static_cast<uint32_t>(std::min<uint64_t>(s, 86'400));  // a day at most
  }
  return r;
}

struct Encoder {
  nlohmann::json operator()(const Resolve& m) const {
    return {
        {"type", "resolve"}, {"id", m.id}, {"address", core::wire_encode(m.address.value_or(""))}};
  }
  nlohmann::json operator()(const Resolved& m) const {
    nlohmann::json j = {{"type", "resolved"}, {"id", m.id}, {"socket", m.socket}};
    if (m.pid > 0) j["pid"] = m.pid;
    if (m.cold) j["cold"] = true;
    return j;
  }
  nlohmann::json operator()(const Refused& m) const {
    nlohmann::json j = {{"type", "refused"}, {"id", m.id}, {"status", m.status}};
    if (!m.error.is_null()) j["error"] = m.error;
    if (m.retry_after_s > 0) j["retryAfter"] = m.retry_after_s;
    return j;
  }
  nlohmann::json operator()(const Forget& m) const {
    return {{"type", "forget"}, {"address", core::wire_encode(m.address)}};
  }
  nlohmann::json operator()(const Report& m) const {
    nlohmann::json j = m.fields.is_object() ? m.fields : nlohmann::json::object();
    j["type"] = "report";
    return j;
  }
};

}  // namespace

std::string encode(const Message& message) {
  return std::visit(Encoder{}, message).dump(-1, ' ', false, kReplace);
}

core::Result<Message> decode(std::string_view text) {
  if (text.size() > core::MessageLink::kMaxMessage) return bad("link message: too long");
  if (!shallow(text)) return bad("link message: nested too deeply");
  // No exceptions (allow_exceptions = false): a parse error is a discarded value.
  auto m = nlohmann::json::parse(text, nullptr, false);
  if (!m.is_object()) return bad("link message: not a JSON object");
  const auto* type = string_of(m, "type");
  if (!type) return bad("link message: no type");
  if (*type == "report") {
    m.erase("type");
    return Message{Report{std::move(m)}};
  }
  if (*type == "forget") {
    auto address = address_of(m);
    if (!address) return bad("link message: forget without a wire-form address");
    return Message{Forget{std::move(*address)}};
  }
  uint64_t id = id_of(m);
  if (id == 0) return bad("link message: no id");
  if (*type == "resolve") return Message{Resolve{id, address_of(m)}};
  if (*type == "resolved") {
    const auto* socket = string_of(m, "socket");
    if (!socket || socket->empty()) return bad("link message: resolved without a socket");
    Resolved r{id, *socket};
    if (const auto* pid = field(m, "pid"); pid && pid->is_number_unsigned())
      r.pid = static_cast<int64_t>(
          std::min<uint64_t>(pid->get<uint64_t>(), std::numeric_limits<int64_t>::max()));
    if (const auto* cold = field(m, "cold"); cold && cold->is_boolean()) r.cold = cold->get<bool>();
    return Message{std::move(r)};
  }
  if (*type == "refused") return Message{refused_of(m, id)};
  return bad("link message: unknown type");
}

}  // namespace corral::workers::link
