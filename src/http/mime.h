// Content types by file extension, for files served without an explicit type. A fixed table
// compiled into the binary (no /etc/mime.types: the same file gets the same type on every host).
// Textual types carry "; charset=utf-8". Pure; the returned views are static.
#pragma once

#include <string_view>

namespace corral::http {

inline constexpr std::string_view kDefaultMimeType = "application/octet-stream";

// The type of `path` by its last extension (case-insensitive): "a/b.tar.GZ" -> application/gzip.
// A name without an extension, or a dotfile such as ".env", gets kDefaultMimeType.
std::string_view mime_type_for(std::string_view path);

}  // namespace corral::http
