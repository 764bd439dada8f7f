#include "workers/kind_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <vector>

#include "core/escape.h"

namespace corral::workers {

KindLog::KindLog(std::string path, LogRotation rotation)
    : path_(std::move(path)), rotation_(rotation) {
  if (rotation_.max_size == 0) rotation_.max_size = 1;
}

core::Result<void> KindLog::open() {
  fd_.reset(::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
  if (!fd_) return core::errno_error(path_.c_str());
  struct stat st;
  size_ = ::fstat(fd_.get(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  return {};
}

core::Result<void> KindLog::rotate() {
  if (rotation_.keep == 0) {
    if (::ftruncate(fd_.get(), 0) != 0) return core::errno_error(path_.c_str());
    size_ = 0;
    return {};
  }
  auto numbered = [this](uint32_t i) { return path_ + "." + std::to_string(i); };
  // The oldest goes; each other moves up one; ENOENT: fewer files than `keep` so far.
  if (::unlink(numbered(rotation_.keep).c_str()) != 0 && errno != ENOENT)
    return core::errno_error(numbered(rotation_.keep).c_str());
  for (uint32_t i = rotation_.keep - 1; i >= 1; --i) {
    if (::rename(numbered(i).c_str(), numbered(i + 1).c_str()) != 0 && errno != ENOENT)
      return core::errno_error(numbered(i).c_str());
  }
  if (::rename(path_.c_str(), numbered(1).c_str()) != 0 && errno != ENOENT)
    return core::errno_error(path_.c_str());
  fd_.reset();
  return open();
}

core::Result<void> KindLog::append(std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd_.get(), data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return core::errno_error(path_.c_str());  // dropped: nothing is kept to retry
    size_ += static_cast<uint64_t>(n);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return {};
}

core::Result<void> KindLog::report(core::Result<void> r) {
  if (r) {
    failing_ = false;
    return r;
  }
  if (std::exchange(failing_, true)) return {};
  return r;
}

core::Result<void> KindLog::write(std::string_view lines) {
  if (!fd_) {
    if (auto r = open(); !r) return report(std::move(r));
  }
  // Runs of whole lines that fit the file go in one write; a line that does not fit starts the
  // next file (unless the file is empty: a line longer than max_size is a file of its own).
  size_t run = 0;  // the bytes of `lines` that fit so far
  while (run < lines.size()) {
    size_t nl = lines.find('\n', run);
    size_t end = nl == std::string_view::npos ? lines.size() : nl + 1;
    if (size_ + end > rotation_.max_size && size_ + run > 0) {
      if (run > 0) {
        if (auto r = append(lines.substr(0, run)); !r) return report(std::move(r));
        lines.remove_prefix(run);
        end -= run;
        run = 0;
      }
      if (size_ > 0) {
        if (auto r = rotate(); !r) return report(std::move(r));
      }
    }
    run = end;
  }
  return report(append(lines));
}

void KindLogs::reopen() {
  for (auto& [kind, log] : logs_) log->reopen();
}

KindLog& KindLogs::of(const std::string& kind, const std::string& dir, LogRotation rotation) {
  auto it = logs_.find(kind);
  if (it == logs_.end())
    it = logs_.emplace(kind, std::make_unique<KindLog>(dir + "/" + kind + ".log", rotation)).first;
  return *it->second;
}

std::string kind_log_address(std::string_view address) {
  std::string field;
  for (char c : core::wire_encode(address)) {
    if (c == ' ')
      field += "%20";
    else
      field += c;
  }
  return field;
}

void append_kind_log_line(std::string& out, int64_t unix_ms, std::string_view address_field,
                          int64_t pid, std::string_view line) {
  time_t secs = static_cast<time_t>(unix_ms / 1000);
  struct tm tm;
  gmtime_r(&secs, &tm);
  fmt::format_to(std::back_inserter(out), "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z {} [{}] ",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 unix_ms % 1000, address_field, pid);
  core::append_log_escaped(out, line, false);
  out += '\n';
}

bool kind_log_line_of(std::string_view line, std::string_view address_field) {
  size_t sp = line.find(' ');
  if (sp == std::string_view::npos) return false;
  line.remove_prefix(sp + 1);
  return line.size() > address_field.size() && line.starts_with(address_field) &&
         line[address_field.size()] == ' ';
}

namespace {

// Reads `path` backwards in blocks, adding its lines of `address_field` to `found` (newest
// first) until `want` are found or `budget` bytes are read.
core::Result<void> tail_one(const std::string& path, std::string_view address_field, size_t want,
                            uint64_t& budget, std::vector<std::string>& found) {
  core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return {};
    return core::errno_error(path.c_str());
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return core::errno_error(path.c_str());
  constexpr size_t kBlock = 64 * 1024;
  uint64_t end = static_cast<uint64_t>(st.st_size);
  std::string carry;  // the start of the line that the block read last ends in
  while (end > 0 && found.size() < want && budget > 0) {
    size_t n = static_cast<size_t>(std::min({uint64_t{kBlock}, end, budget}));
    std::string block(n, '\0');
    ssize_t got = ::pread(fd.get(), block.data(), n, static_cast<off_t>(end - n));
    if (got < 0 && errno == EINTR) continue;
    if (got != static_cast<ssize_t>(n)) return core::errno_error(path.c_str());
    end -= n;
    budget -= n;
    block += carry;
    // Whole lines are those after a newline of this block; the first part waits for the next.
    size_t stop = end == 0 ? 0 : block.find('\n');
    if (stop == std::string::npos) {
      carry = std::move(block);
      continue;
    }
    size_t from = end == 0 ? 0 : stop + 1;
    size_t pos = block.size();
    while (pos > from && found.size() < want) {
      size_t line_end = pos;
      if (block[line_end - 1] == '\n') --line_end;
      size_t nl = line_end > from ? block.rfind('\n', line_end - 1) : std::string::npos;
      size_t start = nl == std::string::npos || nl < from ? from : nl + 1;
      std::string_view line(block.data() + start, line_end - start);
      if (kind_log_line_of(line, address_field)) found.emplace_back(line);
      pos = start;
    }
    carry = block.substr(0, from);
  }
  return {};
}

}  // namespace

core::Result<std::string> tail_kind_log(const std::string& path, uint32_t keep,
                                        std::string_view address_field, size_t lines,
                                        uint64_t max_bytes) {
  std::vector<std::string> found;  // newest first
  uint64_t budget = max_bytes;
  for (uint32_t i = 0; i <= keep && found.size() < lines && budget > 0; ++i) {
    std::string file = i == 0 ? path : path + "." + std::to_string(i);
    if (auto r = tail_one(file, address_field, lines, budget, found); !r) return r.error();
  }
  std::string out;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    out += *it;
    out += '\n';
  }
  return out;
}

}  // namespace corral::workers
