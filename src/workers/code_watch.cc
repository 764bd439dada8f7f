#include "workers/code_watch.h"

#include <dirent.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#include <cerrno>
#include <string_view>

namespace corral::workers {

namespace {

// What changes a directory's current set (ROLLOUT.md); IN_ONLYDIR: a watch is on directories only.
constexpr uint32_t kMask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE |
                           IN_DELETE_SELF | IN_ATTRIB | IN_ONLYDIR;

core::Error watch_error(const std::string& dir) {
  int e = errno;
  return core::Error{e, "inotify_add_watch " + dir + ": " + strerror(e)};
}

}  // namespace

core::Result<std::unique_ptr<CodeWatcher>> CodeWatcher::create(core::EventLoop& loop,
                                                               core::Logger& log, std::string dir,
                                                               uint32_t settle_ms,
                                                               std::function<void()> on_change) {
  std::unique_ptr<CodeWatcher> w(
      new CodeWatcher(loop, log, std::move(dir), settle_ms, std::move(on_change)));
  w->fd_.reset(inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!w->fd_) return core::errno_error("inotify_init1");
  if (auto r = w->add_tree(w->dir_); !r) return r.error();
  if (auto r = loop.add(w->fd_.get(), EPOLLIN, w.get()); !r) return r.error();
  return w;
}

CodeWatcher::CodeWatcher(core::EventLoop& loop, core::Logger& log, std::string dir,
                         uint32_t settle_ms, std::function<void()> on_change)
    : loop_(loop),
      log_(log),
      dir_(std::move(dir)),
      settle_ms_(settle_ms),
      on_change_(std::move(on_change)) {
  settle_.bind(loop_.timers(), [this] { on_change_(); });
}

CodeWatcher::~CodeWatcher() {
  if (fd_) loop_.remove(fd_.get());
}

core::Result<void> CodeWatcher::add_tree(const std::string& dir) {
  // The watch first, then the listing: a subdirectory made in between is seen either way.
  // The root may be a symlink to the directory (followed); nothing under it is.
  int wd = inotify_add_watch(fd_.get(), dir.c_str(), dir == dir_ ? kMask : kMask | IN_DONT_FOLLOW);
  if (wd < 0) return watch_error(dir);
  dirs_[wd] = dir;
  DIR* d = opendir(dir.c_str());
  if (!d) {
    int e = errno;
    return core::Error{e, "opendir " + dir + ": " + strerror(e)};
  }
  core::Result<void> result;
  while (dirent* e = readdir(d)) {
    // Names beginning with '.' are not in the current set (.git, editor swap files): unwatched.
    if (e->d_name[0] == '.') continue;
    std::string child = dir + "/" + e->d_name;
    bool sub = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st;
      sub = lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    }
    if (!sub) continue;
    auto r = add_tree(child);
    // Gone meanwhile (its removal is an event of its own), or became a symlink: not ours.
    if (!r && r.error().code != ENOENT && r.error().code != ENOTDIR) {
      result = r;
      break;
    }
  }
  closedir(d);
  return result;
}

void CodeWatcher::drop_tree(const std::string& dir) {
  for (auto it = dirs_.begin(); it != dirs_.end();) {
    const std::string& d = it->second;
    if (d == dir ||
        (d.size() > dir.size() && d.compare(0, dir.size(), dir) == 0 && d[dir.size()] == '/')) {
      inotify_rm_watch(fd_.get(), it->first);
      it = dirs_.erase(it);
    } else {
      ++it;
    }
  }
}

void CodeWatcher::on_io(uint32_t) {
  // One read per wakeup (the loop is level-triggered); aligned for struct inotify_event.
  alignas(inotify_event) char buf[16 * 1024];
  ssize_t n = read(fd_.get(), buf, sizeof buf);
  if (n <= 0) return;  // EAGAIN, EINTR: the next wakeup
  bool changed = false;
  for (char* p = buf; p < buf + n;) {
    const auto* ev = reinterpret_cast<const inotify_event*>(p);
    p += sizeof(inotify_event) + ev->len;
    if (ev->mask & IN_Q_OVERFLOW) {
      // Events were lost: a new subdirectory may be unwatched. Watch the tree again.
      log_.warn("code_watch_overflow", "dir={}", dir_);
      if (auto r = add_tree(dir_); !r)
        log_.warn("code_watch_failed", "dir={} error={}", dir_, r.error().reason);
      changed = true;
      continue;
    }
    if (ev->mask & IN_IGNORED) {  // the directory is gone (or unmounted): its watch too
      dirs_.erase(ev->wd);
      continue;
    }
    auto it = dirs_.find(ev->wd);
    if (it == dirs_.end()) continue;
    std::string_view name = ev->len ? std::string_view(ev->name) : std::string_view();
    if (!name.empty() && name[0] == '.') continue;  // not in the current set
    std::string sub = it->second + "/" + std::string(name);
    // A directory moved out of the tree is no longer ours (moved within it: its IN_MOVED_TO
    // follows and watches it again under its new name).
    if ((ev->mask & IN_ISDIR) && (ev->mask & IN_MOVED_FROM)) drop_tree(sub);
    if ((ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO))) {
      if (auto r = add_tree(sub); !r && r.error().code != ENOENT && r.error().code != ENOTDIR)
        log_.warn("code_watch_failed", "dir={} error={}", sub, r.error().reason);
    }
    changed = true;
  }
  // The settle restarts at every change: on_change runs once the burst has been quiet.
  if (changed) settle_.arm_after(settle_ms_);
}

}  // namespace corral::workers
