#include "cluster/etcd_codec.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <type_traits>

namespace corral::cluster {
namespace {

using nlohmann::json;

core::Error malformed(std::string what) {
  return core::Error{kMalformed, "malformed etcd response: " + std::move(what)};
}

// Decoding helpers: each reads one optional field of `obj` into `out`, false when it is there
// but not of the expected form (the field's name goes into `bad`).
struct Reader {
  const json& obj;
  std::string bad;

  const json* field(const char* name) {
    auto it = obj.find(name);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
  }
  template <typename Int>
  bool integer(const char* name, Int& out) {
    const json* f = field(name);
    if (!f) return true;
    if (f->is_number_integer()) {
      if constexpr (std::is_signed_v<Int>) {
        if (f->is_number_unsigned() && f->get<uint64_t>() > uint64_t(INT64_MAX)) return fail(name);
        out = static_cast<Int>(f->get<int64_t>());
      } else {
        if (!f->is_number_unsigned()) return fail(name);
        out = static_cast<Int>(f->get<uint64_t>());
      }
      return true;
    }
    if (!f->is_string()) return fail(name);
    const auto& s = f->get_ref<const std::string&>();
    Int v{};
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return fail(name);
    out = v;
    return true;
  }
  bool boolean(const char* name, bool& out) {
    const json* f = field(name);
    if (!f) return true;
    if (!f->is_boolean()) return fail(name);
    out = f->get<bool>();
    return true;
  }
  bool string(const char* name, std::string& out) {
    const json* f = field(name);
    if (!f) return true;
    if (!f->is_string()) return fail(name);
    out = f->get_ref<const std::string&>();
    return true;
  }
  bool bytes(const char* name, std::string& out) {
    const json* f = field(name);
    if (!f) return true;
    if (!f->is_string()) return fail(name);
    auto raw = base64_decode(f->get_ref<const std::string&>());
    if (!raw) return fail(name);
    out = std::move(*raw);
    return true;
  }
  // An object field (nullptr when absent); `ok` false when it is there but not an object.
  const json* object(const char* name, bool& ok) {
    const json* f = field(name);
    if (f && !f->is_object()) {
      ok = fail(name);
      return nullptr;
    }
    return f;
  }
  const json* array(const char* name, bool& ok) {
    const json* f = field(name);
    if (f && !f->is_array()) {
      ok = fail(name);
      return nullptr;
    }
    return f;
  }
  bool fail(const char* name) {
    if (bad.empty()) bad = name;
    return false;
  }
};

bool read_header(const json& obj, ResponseHeader& h, std::string& bad) {
  bool ok = true;
  Reader r{obj, {}};
  const json* hj = r.object("header", ok);
  if (ok && hj) {
    Reader hr{*hj, {}};
    ok = hr.integer("cluster_id", h.cluster_id) && hr.integer("member_id", h.member_id) &&
         hr.integer("revision", h.revision) && hr.integer("raft_term", h.raft_term);
    if (!ok) bad = "header." + hr.bad;
  } else if (!ok) {
    bad = r.bad;
  }
  return ok;
}

bool read_kv(const json& obj, KeyValue& kv, std::string& bad) {
  if (!obj.is_object()) {
    bad = "kv";
    return false;
  }
  Reader r{obj, {}};
  bool ok = r.bytes("key", kv.key) && r.bytes("value", kv.value) &&
            r.integer("create_revision", kv.create_revision) &&
            r.integer("mod_revision", kv.mod_revision) && r.integer("version", kv.version) &&
            r.integer("lease", kv.lease);
  if (!ok) bad = "kv." + r.bad;
  return ok;
}

bool read_kvs(const json& obj, const char* name, std::vector<KeyValue>& out, std::string& bad) {
  bool ok = true;
  Reader r{obj, {}};
  const json* arr = r.array(name, ok);
  if (!ok) {
    bad = name;
    return false;
  }
  if (!arr) return true;
  for (const auto& item : *arr) {
    KeyValue kv;
    if (!read_kv(item, kv, bad)) return false;
    out.push_back(std::move(kv));
  }
  return true;
}

bool read_range(const json& obj, RangeResponse& out, std::string& bad) {
  if (!read_header(obj, out.header, bad) || !read_kvs(obj, "kvs", out.kvs, bad)) return false;
  Reader r{obj, {}};
  if (!r.boolean("more", out.more) || !r.integer("count", out.count)) {
    bad = r.bad;
    return false;
  }
  return true;
}

bool read_put(const json& obj, PutResponse& out, std::string& bad) {
  if (!read_header(obj, out.header, bad)) return false;
  bool ok = true;
  Reader r{obj, {}};
  const json* prev = r.object("prev_kv", ok);
  if (!ok) {
    bad = r.bad;
    return false;
  }
  if (prev) {
    KeyValue kv;
    if (!read_kv(*prev, kv, bad)) return false;
    out.prev_kv = std::move(kv);
  }
  return true;
}

bool read_delete_range(const json& obj, DeleteRangeResponse& out, std::string& bad) {
  if (!read_header(obj, out.header, bad) || !read_kvs(obj, "prev_kvs", out.prev_kvs, bad))
    return false;
  Reader r{obj, {}};
  if (!r.integer("deleted", out.deleted)) {
    bad = r.bad;
    return false;
  }
  return true;
}

bool read_txn(const json& obj, TxnResponse& out, std::string& bad) {
  if (!read_header(obj, out.header, bad)) return false;
  bool ok = true;
  Reader r{obj, {}};
  const json* arr = r.array("responses", ok);
  if (!ok || !r.boolean("succeeded", out.succeeded)) {
    bad = r.bad;
    return false;
  }
  if (!arr) return true;
  for (const auto& item : *arr) {
    if (!item.is_object()) {
      bad = "responses";
      return false;
    }
    if (auto it = item.find("response_range"); it != item.end() && it->is_object()) {
      RangeResponse rr;
      if (!read_range(*it, rr, bad)) return false;
      out.responses.emplace_back(std::move(rr));
    } else if (auto it2 = item.find("response_put"); it2 != item.end() && it2->is_object()) {
      PutResponse pr;
      if (!read_put(*it2, pr, bad)) return false;
      out.responses.emplace_back(std::move(pr));
    } else if (auto it3 = item.find("response_delete_range");
               it3 != item.end() && it3->is_object()) {
      DeleteRangeResponse dr;
      if (!read_delete_range(*it3, dr, bad)) return false;
      out.responses.emplace_back(std::move(dr));
    } else {
      bad = "responses (an operation corral does not send)";
      return false;
    }
  }
  return true;
}

// Parses `text` as one JSON object.
core::Result<json> parse_object(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return malformed("not a JSON object");
  return j;
}

// A stream line: its "result" object, or the Error its "error" object says.
core::Result<json> stream_result(std::string_view line) {
  auto j = parse_object(line);
  if (!j) return j.error();
  if (auto err = j->find("error"); err != j->end()) {
    if (!err->is_object()) return malformed("error");
    return decode_error(200, err->dump());
  }
  auto res = j->find("result");
  if (res == j->end() || !res->is_object()) return malformed("no result");
  return json(std::move(*res));
}

template <typename T, typename Read>
core::Result<T> decode_with(std::string_view body, Read read) {
  auto j = parse_object(body);
  if (!j) return j.error();
  T out;
  std::string bad;
  if (!read(*j, out, bad)) return malformed(bad);
  return out;
}

const char* compare_result_name(Compare::Result r) {
  switch (r) {
    case Compare::Result::kEqual:
      return "EQUAL";
    case Compare::Result::kGreater:
      return "GREATER";
    case Compare::Result::kLess:
      return "LESS";
    case Compare::Result::kNotEqual:
      return "NOT_EQUAL";
  }
  return "EQUAL";
}

json to_json(const RangeRequest& r) {
  json j = json::object();
  j["key"] = base64_encode(r.key);
  if (!r.range_end.empty()) j["range_end"] = base64_encode(r.range_end);
  if (r.limit) j["limit"] = std::to_string(r.limit);
  if (r.revision) j["revision"] = std::to_string(r.revision);
  if (r.keys_only) j["keys_only"] = true;
  if (r.count_only) j["count_only"] = true;
  return j;
}
json to_json(const PutRequest& r) {
  json j = json::object();
  j["key"] = base64_encode(r.key);
  j["value"] = base64_encode(r.value);
  if (r.lease) j["lease"] = std::to_string(r.lease);
  if (r.prev_kv) j["prev_kv"] = true;
  return j;
}
json to_json(const DeleteRangeRequest& r) {
  json j = json::object();
  j["key"] = base64_encode(r.key);
  if (!r.range_end.empty()) j["range_end"] = base64_encode(r.range_end);
  if (r.prev_kv) j["prev_kv"] = true;
  return j;
}
json to_json(const Compare& c) {
  json j = json::object();
  j["key"] = base64_encode(c.key);
  j["result"] = compare_result_name(c.result);
  switch (c.target) {
    case Compare::Target::kVersion:
      j["target"] = "VERSION";
      j["version"] = std::to_string(c.number);
      break;
    case Compare::Target::kCreate:
      j["target"] = "CREATE";
      j["create_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kMod:
      j["target"] = "MOD";
      j["mod_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kValue:
      j["target"] = "VALUE";
      j["value"] = base64_encode(c.value);
      break;
    case Compare::Target::kLease:
      j["target"] = "LEASE";
      j["lease"] = std::to_string(c.number);
      break;
  }
  return j;
}
json to_json(const RequestOp& op) {
  json j = json::object();
  if (const auto* r = std::get_if<RangeRequest>(&op)) j["request_range"] = to_json(*r);
  if (const auto* p = std::get_if<PutRequest>(&op)) j["request_put"] = to_json(*p);
  if (const auto* d = std::get_if<DeleteRangeRequest>(&op)) j["request_delete_range"] = to_json(*d);
  return j;
}

}  // namespace

std::string base64_encode(std::string_view raw) {
  static constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((raw.size() + 2) / 3 * 4);
  for (size_t i = 0; i < raw.size(); i += 3) {
    uint32_t v = uint32_t(uint8_t(raw[i])) << 16;
    if (i + 1 < raw.size()) v |= uint32_t(uint8_t(raw[i + 1])) << 8;
    if (i + 2 < raw.size()) v |= uint8_t(raw[i + 2]);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < raw.size() ? kB64[(v >> 6) & 63] : '=';
    out += i + 2 < raw.size() ? kB64[v & 63] : '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  // Padded standard base64, as Go's encoding/json writes []byte; unpadded is accepted too.
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  size_t n = text.size();
  if (n % 4 == 0 && n > 0 && text[n - 1] == '=') --n;
  if (n % 4 == 3 && n > 0 && text[n - 1] == '=') --n;
  if (n % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(n / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < n; ++i) {
    int v = value(text[i]);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xff);
    }
  }
  // The bits left over must be zero (a canonical encoding).
  if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::string encode(const RangeRequest& r) {
  return to_json(r).dump();
}
std::string encode(const PutRequest& r) {
  return to_json(r).dump();
}
std::string encode(const DeleteRangeRequest& r) {
  return to_json(r).dump();
}
std::string encode(const TxnRequest& r) {
  json j = json::object();
  json cmp = json::array();
  for (const auto& c : r.compare) cmp.push_back(to_json(c));
  json success = json::array();
  for (const auto& op : r.success) success.push_back(to_json(op));
  json failure = json::array();
  for (const auto& op : r.failure) failure.push_back(to_json(op));
  j["compare"] = std::move(cmp);
  j["success"] = std::move(success);
  j["failure"] = std::move(failure);
  return j.dump();
}
std::string encode_lease_grant(int64_t ttl_s) {
  return json{{"TTL", std::to_string(ttl_s)}}.dump();
}
std::string encode_lease_keepalive(int64_t id) {
  return json{{"ID", std::to_string(id)}}.dump();
}
std::string encode_lease_revoke(int64_t id) {
  return json{{"ID", std::to_string(id)}}.dump();
}
std::string encode(const WatchRequest& r) {
  json c = json::object();
  c["key"] = base64_encode(r.key);
  if (!r.range_end.empty()) c["range_end"] = base64_encode(r.range_end);
  if (r.start_revision) c["start_revision"] = std::to_string(r.start_revision);
  if (r.prev_kv) c["prev_kv"] = true;
  if (r.progress_notify) c["progress_notify"] = true;
  return json{{"create_request", std::move(c)}}.dump();
}

core::Result<RangeResponse> decode_range(std::string_view body) {
  return decode_with<RangeResponse>(body, read_range);
}
core::Result<PutResponse> decode_put(std::string_view body) {
  return decode_with<PutResponse>(body, read_put);
}
core::Result<DeleteRangeResponse> decode_delete_range(std::string_view body) {
  return decode_with<DeleteRangeResponse>(body, read_delete_range);
}
core::Result<TxnResponse> decode_txn(std::string_view body) {
  return decode_with<TxnResponse>(body, read_txn);
}
core::Result<LeaseGrantResponse> decode_lease_grant(std::string_view body) {
  return decode_with<LeaseGrantResponse>(
      body, [](const json& j, LeaseGrantResponse& out, std::string& bad) {
        if (!read_header(j, out.header, bad)) return false;
        Reader r{j, {}};
        std::string error;
        if (!r.integer("ID", out.id) || !r.integer("TTL", out.ttl) || !r.string("error", error)) {
          bad = r.bad;
          return false;
        }
        if (!error.empty() || out.id == 0) {
          bad = "lease not granted: " + error;
          return false;
        }
        return true;
      });
}
core::Result<LeaseRevokeResponse> decode_lease_revoke(std::string_view body) {
  return decode_with<LeaseRevokeResponse>(
      body, [](const json& j, LeaseRevokeResponse& out, std::string& bad) {
        return read_header(j, out.header, bad);
      });
}

core::Result<LeaseKeepAliveResponse> decode_lease_keepalive(std::string_view line) {
  auto res = stream_result(line);
  if (!res) return res.error();
  LeaseKeepAliveResponse out;
  std::string bad;
  if (!read_header(*res, out.header, bad)) return malformed(bad);
  Reader r{*res, {}};
  if (!r.integer("ID", out.id) || !r.integer("TTL", out.ttl)) return malformed(r.bad);
  return out;
}

core::Result<WatchResponse> decode_watch(std::string_view line) {
  auto res = stream_result(line);
  if (!res) return res.error();
  const json& j = *res;
  WatchResponse out;
  std::string bad;
  if (!read_header(j, out.header, bad)) return malformed(bad);
  Reader r{j, {}};
  bool ok = true;
  const json* events = r.array("events", ok);
  if (!ok || !r.integer("watch_id", out.watch_id) || !r.boolean("created", out.created) ||
      !r.boolean("canceled", out.canceled) ||
      !r.integer("compact_revision", out.compact_revision) ||
      !r.string("cancel_reason", out.cancel_reason))
    return malformed(r.bad);
  if (events) {
    for (const auto& e : *events) {
      if (!e.is_object()) return malformed("events");
      Reader er{e, {}};
      WatchEvent ev;
      std::string type;
      if (!er.string("type", type)) return malformed("events.type");
      if (type.empty() || type == "PUT") {
        ev.type = WatchEvent::Type::kPut;
      } else if (type == "DELETE") {
        ev.type = WatchEvent::Type::kDelete;
      } else {
        return malformed("events.type");
      }
      bool eok = true;
      const json* kv = er.object("kv", eok);
      const json* prev = er.object("prev_kv", eok);
      if (!eok) return malformed("events." + er.bad);
      if (kv && !read_kv(*kv, ev.kv, bad)) return malformed("events." + bad);
      if (prev) {
        KeyValue p;
        if (!read_kv(*prev, p, bad)) return malformed("events." + bad);
        ev.prev_kv = std::move(p);
      }
      out.events.push_back(std::move(ev));
    }
  }
  return out;
}

core::Error decode_error(int status, std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    Reader r{j, {}};
    int64_t code = 0;
    std::string message;
    std::string error;
    // A unary call's error has "code"; a stream's has "grpc_code" (and "http_code").
    if (r.integer("code", code) && (code != 0 || r.integer("grpc_code", code)) &&
        r.string("message", message) && r.string("error", error) && code > 0 && code < 100) {
      if (message.empty()) message = error;
      return core::Error{kEtcdError + static_cast<int>(code), "etcd: " + message};
    }
  }
  return core::Error{kMalformed, "etcd gateway answered HTTP " + std::to_string(status)};
}

bool LineSplitter::feed(std::string_view data) {
  if (broken_) return false;
  if (pos_ > 0 && pos_ >= buf_.size() / 2) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  buf_.append(data);
  // The unread part holds no newline beyond what next_line() will find; a line in progress
  // longer than the limit breaks the stream.
  size_t nl = buf_.find('\n', pos_);
  size_t pending = (nl == std::string::npos ? buf_.size() : nl) - pos_;
  if (pending > max_line_) broken_ = true;
  return !broken_;
}

std::optional<std::string_view> LineSplitter::next_line() {
  while (!broken_) {
    size_t nl = buf_.find('\n', pos_);
    if (nl == std::string::npos) return std::nullopt;
    std::string_view line(buf_.data() + pos_, nl - pos_);
    pos_ = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    return line;
  }
  return std::nullopt;
}

}  // namespace corral::cluster
