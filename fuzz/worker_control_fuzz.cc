// Fuzzes the manager side of the control protocol (workers/control_codec.h): what any worker, or
// a program that is not one, may write on its control link.
//
// Invariants, for any input bytes:
//  * decode never throws, aborts or overflows the stack: it answers a message or an error value;
//  * a decoded message's body is an object whose `type` is the decoded type name, and it encodes
//    (encode never throws for what decode accepted) to text that decodes again to the same type;
//  * the manager's own messages carrying the input as their untrusted strings (a start hook's
//    data, an address) encode or fail as values, never by a throw.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "workers/control_codec.h"

namespace {

using namespace corral::workers;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto decoded = control::decode(text);
  if (decoded) {
    const auto& m = decoded.value();
    check(m.body.is_object());
    check(m.body["type"].get<std::string>() == m.type_name);
    auto again = control::encode(m.body);
    check(again.ok());
    auto redecoded = control::decode(again.value());
    check(redecoded.ok());
    check(redecoded.value().type == m.type);
    check(redecoded.value().type_name == m.type_name);
  }
  (void)control::encode(control::start(text, {{"data", std::string(text)}}, "lock", nullptr));
  return 0;
}
