#include "workers/code_watch.h"

#include <dirent.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>

#include <cerrno>
#include <string_view>

#include "workers/code_set.h"

namespace corral::workers {

namespace {

// What changes a directory's current set (ROLLOUT.md); IN_ONLYDIR: a watch is on directories only.
constexpr uint32_t kMask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE |
                           IN_DELETE_SELF | IN_ATTRIB | IN_ONLYDIR;
// The root's own move: the path no longer leads to it.
constexpr uint32_t kRootMask = kMask | IN_MOVE_SELF;
// The parent: what puts something at the directory's name, or takes it away.
constexpr uint32_t kParentMask = IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM | IN_ONLYDIR;

core::Error watch_error(const std::string& dir) {
  int e = errno;
  return core::Error{e, "inotify_add_watch " + dir + ": " + strerror(e)};
}

}  // namespace

PathChange parent_event(uint32_t mask, std::string_view name, std::string_view watched) {
  if (name != watched) return PathChange::kNone;
  if (mask & (IN_CREATE | IN_MOVED_TO)) return PathChange::kReplaced;
  if (mask & (IN_DELETE | IN_MOVED_FROM)) return PathChange::kGone;
  return PathChange::kNone;
}

core::Result<std::unique_ptr<CodeWatcher>> CodeWatcher::create(core::EventLoop& loop,
                                                               core::Logger& log, std::string dir,
                                                               uint32_t settle_ms,
                                                               std::function<void()> on_change) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::unique_ptr<CodeWatcher> w(
      new CodeWatcher(loop, log, std::move(dir), settle_ms, std::move(on_change)));
  w->fd_.reset(inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!w->fd_) return core::errno_error("inotify_init1");
  // The parent first: a replacement made while the tree is being watched is seen either way.
  size_t slash = w->dir_.rfind('/');
  w->parent_ = slash == std::string::npos ? "." : slash == 0 ? "/" : w->dir_.substr(0, slash);
  w->name_ = slash == std::string::npos ? w->dir_ : w->dir_.substr(slash + 1);
  if (!w->name_.empty() && w->name_ != "." && w->name_ != "..") {
    w->parent_wd_ = inotify_add_watch(w->fd_.get(), w->parent_.c_str(), kParentMask);
    if (w->parent_wd_ < 0)  // still watched, but not followed: say so
      log.warn("code_watch_failed",
               "dir={} error=\"{}: the directory is not followed if it is "
               "replaced\"",
               w->dir_, watch_error(w->parent_).reason);
  }
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
  settle_.bind(loop_.timers(), [this] {
    // Nothing at the path: no set to roll out. Its return is a change of its own.
    if (root_wd_ >= 0) on_change_();
  });
}

CodeWatcher::~CodeWatcher() {
  if (fd_) loop_.remove(fd_.get());
}

core::Result<void> CodeWatcher::add_tree(const std::string& dir) {
  // The watch first, then the listing: a subdirectory made in between is seen either way.
  // The root may be a symlink to the directory (followed); nothing under it is.
  const bool root = dir == dir_;
  int wd = inotify_add_watch(fd_.get(), dir.c_str(), root ? kRootMask : kMask | IN_DONT_FOLLOW);
  if (wd < 0) return watch_error(dir);
  dirs_[wd] = dir;
  if (root) root_wd_ = wd;
  DIR* d = opendir(dir.c_str());
  if (!d) {
    int e = errno;
    return core::Error{e, "opendir " + dir + ": " + strerror(e)};
  }
  core::Result<void> result;
  while (dirent* e = readdir(d)) {
    // What is not in the current set (.git, editor swap files, __pycache__) is not watched.
    if (e->d_name[0] == '.') continue;
    std::string child = dir + "/" + e->d_name;
    bool sub = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st;
      sub = lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    }
    if (!sub || code_set_skips(e->d_name, true)) continue;
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
      if (it->first == root_wd_) root_wd_ = -1;
      inotify_rm_watch(fd_.get(), it->first);
      it = dirs_.erase(it);
    } else {
      ++it;
    }
  }
}

void CodeWatcher::lose(const char* why) {
  if (root_wd_ < 0 && dirs_.empty()) return;  // lost already
  drop_tree(dir_);
  log_.warn("code_watch_lost", "dir={} reason={} (watched again when it is back)", dir_, why);
}

void CodeWatcher::rearm(const char* why) {
  drop_tree(dir_);  // the old directory (moved elsewhere, or replaced) is no longer ours
  auto r = add_tree(dir_);
  if (!r) {
    drop_tree(dir_);
    // Not a directory (a file took the name), or gone again: lost until the next one comes.
    log_.warn("code_watch_lost", "dir={} reason={} error=\"{}\"", dir_, why, r.error().reason);
    return;
  }
  log_.info("code_watch_rearmed", "dir={} reason={}", dir_, why);
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
    std::string_view name = ev->len ? std::string_view(ev->name) : std::string_view();
    if (ev->mask & IN_Q_OVERFLOW) {
      // Events were lost: a new subdirectory may be unwatched, the directory replaced. Watch the
      // path again.
      log_.warn("code_watch_overflow", "dir={}", dir_);
      rearm("overflow");
      changed = true;
      continue;
    }
    if (ev->wd == parent_wd_) {
      switch (parent_event(ev->mask, name, name_)) {
        case PathChange::kReplaced:
          rearm(ev->mask & IN_CREATE ? "created" : "moved_in");
          changed = true;
          break;
        case PathChange::kGone:
          lose(ev->mask & IN_DELETE ? "deleted" : "moved_away");
          break;
        case PathChange::kNone:
          break;
      }
      continue;
    }
    if (ev->mask & IN_IGNORED) {  // the directory is gone (or unmounted): its watch too
      if (ev->wd == root_wd_) root_wd_ = -1;
      dirs_.erase(ev->wd);
      continue;
    }
    auto it = dirs_.find(ev->wd);
    if (it == dirs_.end()) continue;  // a watch dropped meanwhile: an old tree's event
    if (ev->wd == root_wd_ && (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF))) {
      // The directory itself went (the parent's event for its name says so too, unless the path
      // is a symlink to it): nothing of the old tree is ours any more.
      lose(ev->mask & IN_DELETE_SELF ? "deleted" : "moved_away");
      continue;
    }
    if (!name.empty() && code_set_skips(name, ev->mask & IN_ISDIR)) continue;  // not in the set
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
