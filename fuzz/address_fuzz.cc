// Fuzzes everything that turns an address or a request field into a message, a log line or a file
// name (core/escape.h, docs/worker-protocol.md "Addresses are bytes"). The input is used twice:
// as the address's bytes, and as a raw path segment that the router's percent-decoding turns into
// the bytes of a key (when it decodes).
//
// Invariants, for the bytes b of an address:
//  * the wire form is valid UTF-8 with no control character, it fits a JSON message (dump never
//    throws, the parse gives it back), and decoding it gives b: in the manager's `start` message
//    through the worker library's parser (parse_manager_message) too;
//  * a log value (Logger's formatting) has no byte below 0x20 nor DEL, is valid UTF-8, and every
//    '"' in it is escaped, so it cannot end its quotes or its line;
//  * a bounded file name is at most its bound, has no '/' nor NUL, is not "", "." or "..", and two
//    different addresses (the input's halves) never get one name.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/escape.h"
#include "core/log.h"
#include "http/percent.h"
#include "worker/control.h"

namespace {

using namespace corral;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

bool valid_text(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = core::utf8_scalar_length(s.substr(i));
    if (n == 0 || core::unsafe_scalar(s.substr(i), n)) return false;
    i += n;
  }
  return true;
}

void check_log(std::string_view b) {
  std::string line = core::log_detail::format("address=\"{}\" n={}", std::string(b), 7);
  std::string esc = core::log_escaped(b);
  check(line == "address=\"" + esc + "\" n=7");
  check(valid_text(esc));
  for (size_t i = 0; i < esc.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(esc[i]);
    check(c >= 0x20 && c != 0x7F);
    if (c == '\\')
      ++i;  // an escape: the next character is part of it
    else
      check(c != '"');
  }
  std::string unquoted = core::log_escaped(b, false);
  check(valid_text(unquoted));
}

void check_file_names(std::string_view a, std::string_view b) {
  for (size_t max : {core::kMinFileName, size_t{60}, size_t{200}}) {
    std::string name = core::bounded_file_name(a, max);
    check(name.size() <= max);
    check(name.find('/') == std::string::npos && name.find('\0') == std::string::npos);
    check(!name.empty() && name != "." && name != "..");
    if (a != b) check(name != core::bounded_file_name(b, max));
  }
}

void check_address(std::string_view b) {
  std::string wire = core::wire_encode(b);
  check(valid_text(wire));
  std::string back;
  check(core::wire_decode(wire, back) && back == b);

  nlohmann::json msg = {
      {"type", "start"}, {"address", wire}, {"start", nullptr}, {"lock", "/s/locks/x.lock"}};
  std::string text = msg.dump();  // throws (and so aborts the fuzzer) on invalid UTF-8
  auto parsed = nlohmann::json::parse(text, nullptr, false);
  check(parsed.is_object() && parsed["address"] == wire);
  auto m = worker::parse_manager_message(text);
  check(m.ok() && m->type == worker::ManagerMessageType::kStart && m->start.address == b);

  check_log(b);
  check_file_names(b, b.substr(b.size() / 2));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string input(reinterpret_cast<const char*>(data), size);
  check_address(input);
  // A route's {param}: what percent_decode_segment makes of the raw segment, behind the kind.
  std::string decoded;
  if (input.find('/') == std::string::npos && http::percent_decode_segment(input, decoded))
    check_address("doc:" + decoded);
  // Any text decodes or is refused; a decoded text encodes and decodes back to itself.
  if (core::wire_decode(input, decoded)) {
    std::string again;
    check(core::wire_decode(core::wire_encode(decoded), again) && again == decoded);
  }
  return 0;
}
