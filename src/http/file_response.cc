#include "http/file_response.h"

#include "http/text.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <ctime>

#include "http/http_date.h"
#include "http/mime.h"

namespace corral::http {
namespace {

// O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused after fstat); it has no
// effect on reads of regular files. O_NOCTTY: a terminal device inside the root never becomes
// our controlling terminal.
constexpr int kOpenFlags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;

int status_for_errno(int err) {
  switch (err) {
    case EACCES:
    case EPERM:
      return 403;
    case ENOENT:
    case ENOTDIR:
    case ELOOP:
    case EXDEV:  // RESOLVE_BENEATH: the path leads out of the root
    case ENAMETOOLONG:
    case EINVAL:
    case ENXIO:  // a socket file
    case ENODEV:
    case EISDIR:
      return 404;
    default:  // EMFILE, ENFILE, ENOMEM, EIO...: the server's trouble, not the client's
      return 500;
  }
}

// Opens `rel` beneath `root_fd`; returns an fd or -errno.
int open_beneath(int root_fd, const std::string& rel) {
  struct open_how how = {};
  how.flags = static_cast<uint64_t>(kOpenFlags);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    long fd = ::syscall(SYS_openat2, root_fd, rel.c_str(), &how, sizeof how);
    if (fd >= 0) return static_cast<int>(fd);
    if (errno == EINTR) continue;
    // EAGAIN: a concurrent rename raced the lookup (the kernel refuses rather than risk escape).
    if (errno == EAGAIN) return -ENOENT;
    if (errno == ENOSYS) return file_detail::open_beneath_walk(root_fd, rel, kOpenFlags);
    return -errno;
  }
}

// Whether any value of the list header `name` (#entity-tag, or "*") matches our strong `etag`.
// `strong`: If-Match's strong comparison (a weak tag never matches); else If-None-Match's weak
// comparison (opaque tags equal). An unparsable element ends that field line.
bool etag_list_matches(const Headers& headers, std::string_view name, std::string_view etag,
                       bool strong) {
  for (const Header& h : headers) {
    if (!iequals(h.name, name)) continue;
    std::string_view v = h.value;
    for (;;) {
      while (!v.empty() && (is_ows(v.front()) || v.front() == ',')) v.remove_prefix(1);
      if (v.empty()) break;
      if (v.front() == '*') return true;  // a current representation exists
      bool weak = false;
      if (v.starts_with("W/")) {
        weak = true;
        v.remove_prefix(2);
      }
      if (v.empty() || v.front() != '"') break;
      size_t close = v.find('"', 1);
      if (close == std::string_view::npos) break;
      std::string_view tag = v.substr(0, close + 1);
      v.remove_prefix(close + 1);
      if (strong && weak) continue;
      if (tag == etag) return true;
    }
  }
  return false;
}

std::optional<time_t> header_date(const Request& req, std::string_view name) {
  auto v = req.header(name);
  if (!v) return std::nullopt;
  return parse_http_date(trim_ows(*v));
}

// 16 hex digits from getrandom(); a process-wide counter mixed with the clock if that fails
// (the boundary need only be unlikely to occur in the file, not secret).
std::string make_boundary() {
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r)) {
    static std::atomic<uint64_t> counter{0};
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r = (counter.fetch_add(1) + 1) * 0x9E3779B97F4A7C15ull ^
        (static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec));
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, r);
  return std::string(buf, 16);
}

std::string content_range(const ByteRange& r, uint64_t size) {
  return "bytes " + std::to_string(r.first) + "-" + std::to_string(r.last) + "/" +
         std::to_string(size);
}

bool is_attr_char(unsigned char c) {
  // RFC 8187 attr-char: ALPHA / DIGIT / "!" / "#" / "$" / "&" / "+" / "-" / "." / "^" / "_" /
  // "`" / "|" / "~"
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::string_view("!#$&+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

// Whether `rel` (a path beneath the root, '/'-separated) has a segment starting with '.' other
// than a first segment ".well-known". Such files are a site's secrets far more often than its
// content (.env, .git/, .htpasswd, .ssh/), so they are served only when asked for. "." and ".."
// name no file: RESOLVE_BENEATH keeps them inside the root (admission refuses them in targets).
bool hidden_path(std::string_view rel) {
  bool first = true;
  while (!rel.empty()) {
    size_t slash = rel.find('/');
    std::string_view seg = rel.substr(0, slash);
    rel = slash == std::string_view::npos ? std::string_view() : rel.substr(slash + 1);
    if (seg.empty() || seg == "." || seg == "..") continue;
    if (seg.front() == '.' && !(first && seg == ".well-known")) return true;
    first = false;
  }
  return false;
}

ResolvedFile fail(ResolvedFile& out, int status) {
  out.status = status;
  out.fd.reset();
  out.content_length = 0;
  return std::move(out);
}

}  // namespace

namespace file_detail {

int open_beneath_walk(int root_fd, std::string_view rel, int flags) {
  if (rel.find('\0') != std::string_view::npos) return -ENOENT;
  // Split into components, skipping empty ones and ".".
  std::vector<std::string> parts;
  while (!rel.empty()) {
    size_t slash = rel.find('/');
    std::string_view comp = rel.substr(0, slash);
    rel = slash == std::string_view::npos ? std::string_view() : rel.substr(slash + 1);
    if (comp.empty() || comp == ".") continue;
    if (comp == "..") return -EXDEV;
    parts.emplace_back(comp);
  }
  if (parts.empty()) {
    int fd = ::openat(root_fd, ".", flags);
    return fd >= 0 ? fd : -errno;
  }
  core::UniqueFd dir;
  int at = root_fd;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    // O_NOFOLLOW with O_PATH opens a symlink itself; O_DIRECTORY then refuses it (ENOTDIR).
    int fd = ::openat(at, parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -errno;
    dir.reset(fd);
    at = fd;
  }
  int fd = ::openat(at, parts.back().c_str(), flags | O_NOFOLLOW);
  return fd >= 0 ? fd : -errno;
}

}  // namespace file_detail

std::string file_etag(uint64_t size, int64_t mtime_sec, int64_t mtime_nsec) {
  uint64_t ns =
      static_cast<uint64_t>(mtime_sec) * 1000000000ull + static_cast<uint64_t>(mtime_nsec);
  char buf[48];
  int n = std::snprintf(buf, sizeof buf, "\"%" PRIx64 "-%" PRIx64 "\"", size, ns);
  return std::string(buf, static_cast<size_t>(n));
}

std::string content_disposition_attachment(std::string_view name) {
  std::string out = "attachment; filename=\"";
  for (size_t i = 0; i < name.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (c >= 0x80) {
      // One '_' per UTF-8 character: continuation bytes (10xxxxxx) add nothing.
      if ((c & 0xC0) != 0x80) out += '_';
    } else if (c < 0x20 || c == 0x7F || c == '"' || c == '\\') {
      out += '_';
    } else {
      out += static_cast<char>(c);
    }
  }
  out += "\"; filename*=UTF-8''";
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (char ch : name) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (is_attr_char(c)) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
    }
  }
  return out;
}

namespace {

// Opens spec's file into out.fd: beneath spec.root when one is set (then `root` and `rel` stay
// set, for the directory's index), else spec.path as given. Returns 0, or the status to fail with.
int open_target(const FileSpec& spec, core::UniqueFd& root, std::string& rel, ResolvedFile& out) {
  int fd = -1;
  if (!spec.root.empty()) {
    root.reset(::open(spec.root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!root) return status_for_errno(errno);
    std::string_view p = spec.path;
    while (!p.empty() && p.front() == '/') p.remove_prefix(1);
    if (!spec.dotfiles && hidden_path(p)) return 404;
    rel = p.empty() ? std::string(".") : std::string(p);
    fd = open_beneath(root.get(), rel);
  } else {
    if (spec.path.empty()) return 404;
    fd = ::open(spec.path.c_str(), kOpenFlags);
    if (fd < 0) fd = -errno;
  }
  if (fd < 0) return status_for_errno(-fd);
  out.fd.reset(fd);
  return 0;
}

// out.fd is a directory: replaces it with its index.html (and `st` with the index's), or asks
// for the trailing slash with a 301. Returns 0, or the status to fail with.
int open_directory_index(const Request& req, const FileSpec& spec, const core::UniqueFd& root,
                         const std::string& rel, ResolvedFile& out, struct stat& st) {
  if (!spec.directory_index) return 404;
  int fd = -1;
  if (root) {
    std::string index = rel == "." ? std::string() : rel;
    if (!index.empty() && index.back() != '/') index += '/';
    index += "index.html";
    fd = open_beneath(root.get(), index);
  } else {
    fd = ::openat(out.fd.get(), "index.html", kOpenFlags);
    if (fd < 0) fd = -errno;
  }
  if (fd < 0) return status_for_errno(-fd);
  out.fd.reset(fd);
  if (::fstat(out.fd.get(), &st) != 0) return 500;
  if (!S_ISREG(st.st_mode)) return 404;
  // Relative links in the index resolve against its directory only with the trailing slash.
  // Never for "//host" or "/\host": the Location would leave this site.
  std::string_view path = req.path;
  if (!path.empty() && path.front() == '/' && path.back() != '/' && !path.starts_with("//") &&
      !path.starts_with("/\\")) {
    out.location = std::string(path) + "/";
    if (!req.query.empty()) {
      out.location += '?';
      out.location += req.query;
    }
    return 301;
  }
  return 0;
}

// The conditional headers, in RFC 9110 §13.2.2 order: 0 to go on, 412 or 304.
int check_conditionals(const Request& req, std::string_view etag, time_t last_modified) {
  const bool get_or_head = req.method == Method::kGet || req.method == Method::kHead;
  if (req.headers.count("If-Match") > 0) {
    if (!etag_list_matches(req.headers, "If-Match", etag, /*strong=*/true)) return 412;
  } else if (auto since = header_date(req, "If-Unmodified-Since")) {
    if (last_modified > *since) return 412;
  }
  bool not_modified = false;
  if (req.headers.count("If-None-Match") > 0) {
    if (etag_list_matches(req.headers, "If-None-Match", etag, /*strong=*/false)) {
      if (!get_or_head) return 412;
      not_modified = true;
    }
  } else if (get_or_head) {
    auto since = header_date(req, "If-Modified-Since");
    not_modified = since && last_modified <= *since;
  }
  return not_modified ? 304 : 0;
}

// Range, only where a 200 would be sent, and only while If-Range's validator still holds.
RangeResult requested_range(const Request& req, std::string_view etag, time_t last_modified,
                            uint64_t size) {
  RangeResult range;
  if (req.method == Method::kGet || req.method == Method::kHead) {
    auto range_header = req.header("Range");
    if (range_header) {
      auto if_range = req.header("If-Range");
      if (!if_range || if_range_allows(*if_range, etag, last_modified))
        range = parse_range(*range_header, size);
    }
  }
  return range;
}

// A 206 of several ranges: one multipart/byteranges body, framed around out.ranges.
void frame_multipart(ResolvedFile& out, const std::string& type) {
  std::string boundary = make_boundary();
  uint64_t total = 0;
  out.parts.reserve(out.ranges.size());
  for (const ByteRange& r : out.ranges) {
    // Every part starts with CRLF: before the first it is an empty preamble's line end
    // (RFC 2046 §5.1.1), so all parts are framed alike.
    std::string head = "\r\n--" + boundary + "\r\nContent-Type: " + type +
                       "\r\nContent-Range: " + content_range(r, out.size) + "\r\n\r\n";
    total += head.size() + r.length();
    out.parts.push_back({std::move(head), r});
  }
  out.tail = "\r\n--" + boundary + "--\r\n";
  total += out.tail.size();
  out.content_length = total;
  out.content_type = "multipart/byteranges; boundary=" + boundary;
}

}  // namespace

ResolvedFile resolve_file(const Request& req, const FileSpec& spec) {
  ResolvedFile out;
  if (spec.path.find('\0') != std::string::npos || spec.root.find('\0') != std::string::npos)
    return fail(out, 404);

  // Open the file (or the directory, then its index).
  core::UniqueFd root;
  std::string rel;
  if (int status = open_target(spec, root, rel, out)) return fail(out, status);
  struct stat st;
  if (::fstat(out.fd.get(), &st) != 0) return fail(out, 500);
  std::string_view type_name = spec.path;
  if (S_ISDIR(st.st_mode)) {
    if (int status = open_directory_index(req, spec, root, rel, out, st)) return fail(out, status);
    type_name = "index.html";
  }
  if (!S_ISREG(st.st_mode)) return fail(out, 404);

  out.size = static_cast<uint64_t>(st.st_size);
  const time_t last_modified = st.st_mtim.tv_sec;
  std::string etag = file_etag(out.size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  char date[30];
  std::string last_modified_text(date, format_http_date(last_modified, date));
  std::string cache_control =
      spec.max_age > 0 ? "max-age=" + std::to_string(spec.max_age) : std::string();
  auto add_validators = [&] {
    out.headers.emplace_back("ETag", etag);
    out.headers.emplace_back("Last-Modified", last_modified_text);
  };

  if (int status = check_conditionals(req, etag, last_modified)) {
    if (status == 304) {
      add_validators();
      if (!cache_control.empty()) out.headers.emplace_back("Cache-Control", cache_control);
    }
    return fail(out, status);
  }

  std::string type =
      spec.content_type.empty() ? std::string(mime_type_for(type_name)) : spec.content_type;
  RangeResult range = requested_range(req, etag, last_modified, out.size);

  add_validators();
  out.headers.emplace_back("Accept-Ranges", "bytes");
  switch (range.kind) {
    case RangeKind::kNone:
      out.status = 200;
      out.content_length = out.size;
      out.content_type = std::move(type);
      break;
    case RangeKind::kUnsatisfiable:
      out.headers.emplace_back("Content-Range", "bytes */" + std::to_string(out.size));
      return fail(out, 416);
    case RangeKind::kSatisfiable:
      out.status = 206;
      out.ranges = std::move(range.ranges);
      if (out.ranges.size() == 1) {
        out.headers.emplace_back("Content-Range", content_range(out.ranges[0], out.size));
        out.content_length = out.ranges[0].length();
        out.content_type = std::move(type);
      } else {
        frame_multipart(out, type);
      }
      break;
  }
  if (!spec.download_name.empty())
    out.headers.emplace_back("Content-Disposition",
                             content_disposition_attachment(spec.download_name));
  if (!cache_control.empty()) out.headers.emplace_back("Cache-Control", cache_control);
  // HEAD: the same head, no body to read.
  if (req.method == Method::kHead) out.fd.reset();
  return out;
}

}  // namespace corral::http
