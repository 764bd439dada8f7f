// Fuzzes the codec of the server-process <-> supervisor link (workers/link_codec.h): both ends
// decode what the other sends, and either may be the one that misbehaves.
//
// Invariants, for any input text:
//  * decode never throws, aborts or overflows the stack: it answers a message or an error value;
//  * a message it answers encodes (encode never throws), and the encoding decodes again to a
//    message that encodes to the same text: encode(decode(encode(m))) == encode(m);
//  * a typed address round-trips as bytes: Forget{b} and Resolve{id, b} decode to b, for the
//    input's bytes b (whatever they are: NUL, invalid UTF-8, '%').
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "core/message_link.h"
#include "workers/link_codec.h"

namespace {

using namespace corral::workers;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto decoded = link::decode(text);
  if (decoded) {
    std::string once = link::encode(decoded.value());
    // An encoding can outgrow the input (1e5 is written 100000.0): only one within the link's
    // bound must decode.
    if (once.size() <= corral::core::MessageLink::kMaxMessage) {
      auto again = link::decode(once);
      check(again.ok());
      check(link::encode(again.value()) == once);
    }
  }

  // The wire form is at most 3 bytes a byte: keep the messages within the link's bound.
  if (size > 16 * 1024) return 0;
  std::string bytes(text);
  auto forget = link::decode(link::encode(link::Forget{bytes}));
  check(forget.ok());
  const auto* f = std::get_if<link::Forget>(&forget.value());
  check(f && f->address == bytes);
  auto resolve = link::decode(link::encode(link::Resolve{7, bytes}));
  check(resolve.ok());
  const auto* r = std::get_if<link::Resolve>(&resolve.value());
  check(r && r->id == 7 && r->address == bytes);
  return 0;
}
