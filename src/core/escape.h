// Bytes as text: the two ways corral writes a byte string it did not choose (a worker address, a
// request field) where only text may go.
//
//  * The wire form (wire_encode/wire_decode) is lossless: a JSON string, an environment variable
//    or a header value that carries an address. It is valid UTF-8 with no control character:
//    '%', every byte that is not part of valid UTF-8 (overlong forms, surrogates, stray
//    continuation bytes, "%C0%AE"), and every byte of a C0/C1 control, DEL, U+2028 or U+2029 are
//    percent-encoded ("%FF"); everything else is kept, so "doc:42" and "doc:café" read unchanged.
//    wire_decode(wire_encode(b)) == b for every b, NUL included. docs/worker-protocol.md states it
//    for the worker libraries that decode it.
//  * The log form (append_log_escaped) is for reading: control characters and bytes that are not
//    valid UTF-8 become "\xNN" (per byte), and in a quoted value '\' and '"' become "\\" and "\"",
//    so a value can never end its quotes, its line or its entry. Logger escapes every value it
//    formats (core/log.h); call sites do not.
//
//  * A file name (bounded_file_name) for an address in a directory (a worker's socket, lock or
//    data file): the percent-encoding of every byte but [A-Za-z0-9._-] while it fits in `max`
//    bytes ("doc:42" -> "doc%3A42"), else a readable prefix of it, '~' and the base64url of the
//    first 128 bits of the SHA-256 of the whole address ("doc%3Aaaaa…~Xk3…", exactly `max` bytes
//    or less). Never contains '/' or NUL, never "", "." or "..". Two addresses never share a
//    name: the short form is injective and never holds '~', and two long forms share one only on
//    a 128-bit hash collision.
//
// Pure functions, no state; the classification (utf8_scalar_length) is shared by both forms.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace corral::core {

// The length (1-4) of the well-formed UTF-8 scalar value at the start of `s` (RFC 3629: shortest
// form, no surrogates, at most U+10FFFF), or 0 when `s` does not start with one.
size_t utf8_scalar_length(std::string_view s);

// Whether the scalar value that `s` starts with (of utf8_scalar_length(s) bytes) is one that
// text must not carry raw: a C0 control, DEL, a C1 control, U+2028 or U+2029.
bool unsafe_scalar(std::string_view s, size_t length);

std::string wire_encode(std::string_view bytes);
void append_wire_encoded(std::string& out, std::string_view bytes);
// False on a '%' not followed by two hex digits (then `out` is unspecified). `out` is cleared.
bool wire_decode(std::string_view text, std::string& out);

// Percent-encodes every byte but [A-Za-z0-9._-] (upper-case hex): a safe file name or path
// segment for any bytes, never "", "." or ".." (those get a leading "%").
std::string name_encode(std::string_view bytes);
// The smallest `max` bounded_file_name accepts: '~' and the 22 characters of the hash.
constexpr size_t kMinFileName = 23;
// `max` >= kMinFileName.
std::string bounded_file_name(std::string_view bytes, size_t max);

// A JSON string (RFC 8259) of any bytes, quotes included: '"', '\\' and every control character
// escaped (\n, \u001b), U+2028/U+2029 as \u2028/\u2029 (safe in JavaScript too), and each byte
// that is not part of valid UTF-8 as \ufffd. The result is valid UTF-8 that any JSON parser reads.
void append_json_string(std::string& out, std::string_view bytes);

// `quoted`: also escape '\' and '"' (the value sits between quotes).
void append_log_escaped(std::string& out, std::string_view bytes, bool quoted = true);
std::string log_escaped(std::string_view bytes, bool quoted = true);

}  // namespace corral::core
