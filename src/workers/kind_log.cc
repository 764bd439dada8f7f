#include "workers/kind_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

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

KindLog& KindLogs::of(const std::string& kind, const std::string& dir, LogRotation rotation) {
  auto it = logs_.find(kind);
  if (it == logs_.end())
    it = logs_.emplace(kind, std::make_unique<KindLog>(dir + "/" + kind + ".log", rotation)).first;
  return *it->second;
}

}  // namespace corral::workers
