// Serving a file: resolves a route's FileSpec against the request into what to send. Opens the
// file safely beneath its root, derives the validators (ETag, Last-Modified), evaluates the
// conditional headers (RFC 9110 §13.2.2 order) and the Range header, and lays out a
// multipart/byteranges body. The connection then writes the head, the parts' framing and the file
// bytes (sendfile or pread); this file does no socket I/O and reads no file contents.
//
// Path safety with a root: openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) relative to the root,
// so "..", absolute symlinks and symlinks that lead out of the root fail in the kernel and are
// answered 404; symlinks that stay inside the root are followed. Needs Linux >= 5.6: where openat2
// is missing (ENOSYS, e.g. some sandboxes) a fallback walks the path one component at a time and
// refuses every symlink and every "..". Without a root, the path is opened as given.
//
// Dotfiles: with a root, a path with a segment starting with '.' is 404 (before anything is
// opened) unless FileSpec::dotfiles says otherwise; a first segment ".well-known" is allowed.
//
// Blocking: opening and fstat-ing a file are synchronous filesystem calls (as in nginx without
// thread pools). FIFOs and devices are opened non-blocking and refused (404), never read.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/unique_fd.h"
#include "http/range.h"
#include "http/request.h"
#include "http/response.h"

namespace corral::http {

// One part of a multipart/byteranges body: the part's head text, then that range of the file.
struct FilePart {
  std::string head;  // "\r\n--B\r\nContent-Type: T\r\nContent-Range: bytes a-b/size\r\n\r\n"
  ByteRange range;
};

struct ResolvedFile {
  // 200, 206, 301 (a directory asked for without its trailing slash: see location), 304, 403,
  // 404, 412 (If-Match / If-Unmodified-Since failed), 416, or 500 (out of fds, I/O error).
  int status = 200;
  // Open (O_RDONLY) only when a body is to be sent: 200 and 206 to a method other than HEAD.
  core::UniqueFd fd;
  uint64_t size = 0;  // the whole file's size, when it was opened
  // Bytes of body to send, multipart framing included. For HEAD the value a GET would have had
  // (the Content-Length to announce); 0 for 301, 304, 4xx, 5xx.
  uint64_t content_length = 0;
  // 200: empty (send the whole file). 206: one range, or the parts' ranges for multipart.
  std::vector<ByteRange> ranges;
  std::vector<FilePart> parts;  // non-empty only for multipart/byteranges
  std::string tail;             // multipart closing delimiter "\r\n--B--\r\n"
  // Of the response: the file's type, or "multipart/byteranges; boundary=B". Empty when there is
  // no body (301, 304, 4xx, 5xx): the connection sends no Content-Type then.
  std::string content_type;
  // ETag, Last-Modified, Accept-Ranges, Content-Range (single 206; "bytes */size" with 416),
  // Content-Disposition, Cache-Control, in that order, as applicable. A 304 carries ETag,
  // Last-Modified and Cache-Control (§15.4.5).
  std::vector<std::pair<std::string, std::string>> headers;
  std::string location;  // with 301: the request path plus "/" (and the query, if any)
};

ResolvedFile resolve_file(const Request& req, const FileSpec& spec);

// `attachment; filename="<ASCII fallback>"; filename*=UTF-8''<percent-encoded>` (RFC 6266,
// RFC 8187). The fallback replaces control characters, '"', '\\' and each non-ASCII character
// with '_'; the extended form keeps the exact bytes. Safe for any input (no CR/LF can get out).
std::string content_disposition_attachment(std::string_view name);

// The strong validator of a file: "\"<size hex>-<mtime ns hex>\"".
std::string file_etag(uint64_t size, int64_t mtime_sec, int64_t mtime_nsec);

namespace file_detail {
// The openat2-less fallback, exposed for its tests: opens `rel` beneath `root_fd` walking one
// component at a time, refusing "..", every symlink and a NUL byte. Returns an fd or -errno.
int open_beneath_walk(int root_fd, std::string_view rel, int flags);
}  // namespace file_detail

}  // namespace corral::http
