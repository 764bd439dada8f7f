// Percent-decoding of request paths (RFC 3986 §2.1), for the router and anything that turns a raw
// path into names. The rules are strict on purpose: a decoded segment can never contain a '/' (so
// "%2F" can never act as a separator and smuggle "a/../b" past a segment-wise check) nor a NUL (so
// a name can never be cut short by a C API). '+' is a literal '+' in paths; only query strings use
// it for a space. Pure functions: no allocation beyond the output string, which is cleared first
// and keeps its capacity.
#pragma once

#include "http/text.h"

#include <string>
#include <string_view>

namespace corral::http {

// Decodes one path segment (the text between two '/'). Returns false, leaving `out` unspecified,
// on a malformed escape ("%", "%1", "%G1"), on a decoded NUL ("%00"), on a decoded '/' ("%2F",
// "%2f"), and on a raw '/' or NUL in `in` (a segment contains neither).
bool percent_decode_segment(std::string_view in, std::string& out);

// Decodes a whole path, keeping each raw '/' as a separator: the segment-wise decoding of every
// segment, joined by '/'. Fails exactly where percent_decode_segment fails on some segment.
bool percent_decode_path(std::string_view in, std::string& out);

// True when percent_decode_path(in, ...) would succeed. Allocates nothing.
bool percent_path_decodable(std::string_view in);

// RFC 3986 pchar without the '%' of pct-encoded: unreserved / sub-delims / ':' / '@'.
bool is_valid_path_char(char c);

// Percent-encodes every byte but [A-Za-z0-9._-]: a safe file name or path segment for any string
// (worker addresses: "doc:42" -> "doc%3A42"). Never "", "." or "..": those get a leading "%".
std::string percent_encode_name(std::string_view s);

}  // namespace corral::http
