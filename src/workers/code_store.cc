#include "workers/code_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <nettle/sha2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <system_error>

#include "core/escape.h"
#include "core/unique_fd.h"

namespace corral::workers {

namespace {

constexpr size_t kHexDigits = 2 * SHA256_DIGEST_SIZE;  // 64
constexpr size_t kMinPrefix = 8;
// A file up to this size is read into memory while it is hashed and written only when its
// content is new; a larger one is streamed into a temp object as it is read (one read either way).
constexpr size_t kInMemoryBytes = 1 << 20;
constexpr size_t kChunk = 64 * 1024;

// "<what> <path>: <strerror(errno)>" with errno as the code.
core::Error sys_error(std::string_view what, const std::string& path) {
  int e = errno;
  return core::Error{e, std::string(what) + " " + path + ": " + strerror(e)};
}

std::string join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a + "/" + b;
}

std::string to_hex(const uint8_t* bytes, size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 15];
  }
  return out;
}

bool is_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool is_version(std::string_view s) {
  return s.size() == kHexDigits && is_hex(s);
}

class Sha256 {
 public:
  Sha256() { sha256_init(&ctx_); }
  void update(const void* p, size_t n) { sha256_update(&ctx_, n, static_cast<const uint8_t*>(p)); }
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::string hex() {
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&ctx_, sizeof d, d);
    return to_hex(d, sizeof d);
  }

 private:
  sha256_ctx ctx_;
};

std::string version_of(const std::vector<CodeFile>& files) {
  Sha256 h;
  for (const auto& f : files) {
    h.update(f.path);
    h.update("\0", 1);
    h.update(f.digest);
    h.update("\n", 1);
  }
  return h.hex();
}

bool valid_utf8(std::string_view s) {
  while (!s.empty()) {
    size_t n = core::utf8_scalar_length(s);
    if (n == 0) return false;
    s.remove_prefix(n);
  }
  return true;
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

core::Result<void> make_dir(const std::string& path, mode_t mode) {
  if (::mkdir(path.c_str(), mode) == 0 || errno == EEXIST) {
    if (is_dir(path)) return {};
    errno = ENOTDIR;
  }
  return sys_error("mkdir", path);
}

core::Result<void> write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return sys_error("write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

core::Result<void> fsync_path(const std::string& path) {
  core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return sys_error("open", path);
  if (::fsync(fd.get()) < 0) return sys_error("fsync", path);
  return {};
}

// Writes `content` to `path` through a temp file in the same directory: written, fsync'd, renamed.
core::Result<void> replace_file(const std::string& path, std::string_view content) {
  std::string tmp = path + ".tmp-XXXXXX";
  core::UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));
  if (!fd) return sys_error("mkstemp", tmp);
  auto fail = [&](core::Error e) {
    ::unlink(tmp.c_str());
    return e;
  };
  if (auto r = write_all(fd.get(), content.data(), content.size(), tmp); !r) return fail(r.error());
  if (::fchmod(fd.get(), 0600) < 0) return fail(sys_error("chmod", tmp));
  if (::fsync(fd.get()) < 0) return fail(sys_error("fsync", tmp));
  fd.reset();
  if (::rename(tmp.c_str(), path.c_str()) < 0) return fail(sys_error("rename", tmp));
  return {};
}

core::Result<std::string> read_file(const std::string& path) {
  core::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return sys_error("open", path);
  std::string out;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("read", path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// The entries of a directory but "." and "..".
core::Result<std::vector<std::string>> list_dir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return sys_error("opendir", path);
  std::vector<std::string> names;
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    if (name != "." && name != "..") names.emplace_back(name);
    errno = 0;
  }
  if (errno != 0) {
    auto err = sys_error("readdir", path);
    ::closedir(d);
    return err;
  }
  ::closedir(d);
  return names;
}

core::Result<void> remove_tree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return core::Error{ec.value(), "remove " + path + ": " + ec.message()};
  return {};
}

// One file of a directory's current set, before it is copied: its relative path and the path to
// open (the file itself, or the regular file a symlink resolves to).
struct Found {
  std::string path;
  std::string source;
};

class Scanner {
 public:
  explicit Scanner(std::string root) : root_(std::move(root)) {}

  core::Result<void> scan(const std::string& rel) {
    std::string abs = rel.empty() ? root_ : root_ + "/" + rel;
    auto names = list_dir(abs);
    if (!names) return names.error();
    for (const auto& name : *names) {
      if (name[0] == '.') continue;  // .git, editor swap files (code_set_skips)
      std::string child_rel = join(rel, name);
      std::string child = abs + "/" + name;
      if (!valid_utf8(name)) {
        // The worker protocol and the manifest carry paths as JSON strings.
        return core::Error{EILSEQ,
                           child + ": a name that is not UTF-8: refused in a code directory"};
      }
      struct stat st;
      if (::lstat(child.c_str(), &st) < 0) return sys_error("stat", child);
      if (code_set_skips(name, S_ISDIR(st.st_mode))) continue;  // __pycache__, *.pyc
      if (S_ISDIR(st.st_mode)) {
        if (auto r = scan(child_rel); !r) return r;
      } else if (S_ISREG(st.st_mode)) {
        found_.push_back({child_rel, child});
      } else if (S_ISLNK(st.st_mode)) {
        auto target = resolve_link(child);
        if (!target) return target.error();
        found_.push_back({child_rel, std::move(*target)});
      } else {
        return core::Error{EINVAL, child + ": not a regular file, directory or symlink (" +
                                       kind_of(st.st_mode) + "): refused in a code directory"};
      }
    }
    return {};
  }

  std::vector<Found>& found() { return found_; }

 private:
  static std::string kind_of(mode_t m) {
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISFIFO(m)) return "a fifo";
    if (S_ISSOCK(m)) return "a socket";
    return "an unknown file type";
  }

  // A symlink counts only when it resolves to a regular file inside the directory.
  core::Result<std::string> resolve_link(const std::string& link) {
    char buf[PATH_MAX];
    if (!::realpath(link.c_str(), buf)) {
      if (errno == ENOENT) {
        return core::Error{ENOENT, link + ": a dangling symlink: refused in a code directory"};
      }
      return sys_error("resolve symlink", link);
    }
    std::string target(buf);
    if (target.compare(0, root_.size() + 1, root_ + "/") != 0) {
      return core::Error{
          EXDEV, link + ": a symlink to " + target + ", outside the code directory: refused"};
    }
    struct stat st;
    if (::stat(target.c_str(), &st) < 0) return sys_error("stat", target);
    if (!S_ISREG(st.st_mode)) {
      return core::Error{EINVAL, link + ": a symlink to " + target +
                                     ", not a regular file: refused in a code directory"};
    }
    return target;
  }

  std::string root_;  // realpath of the code directory
  std::vector<Found> found_;
};

// The current set of `dir`: its files in bytewise path order (std::string compares as unsigned
// char), or the error naming what is refused.
core::Result<std::vector<Found>> scan(const std::string& dir) {
  char buf[PATH_MAX];
  if (!::realpath(dir.c_str(), buf)) return sys_error("code directory", dir);
  std::string root(buf);
  struct stat st;
  if (::stat(root.c_str(), &st) < 0) return sys_error("code directory", dir);
  if (!S_ISDIR(st.st_mode)) {
    return core::Error{ENOTDIR, "code directory " + dir + ": " + strerror(ENOTDIR)};
  }
  Scanner scanner(root);
  if (auto r = scanner.scan(""); !r) return r.error();
  std::vector<Found> found = std::move(scanner.found());
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.path < b.path; });
  return found;
}

}  // namespace

core::Result<CodeStore> CodeStore::open(const std::string& state_dir) {
  std::string root = state_dir + "/code";
  if (auto r = make_dir(root, 0700); !r) return r.error();
  // Absolute: a worker opens the snapshot's dir from its own working directory.
  char buf[PATH_MAX];
  if (!::realpath(root.c_str(), buf)) return sys_error("resolve", root);
  root = buf;
  for (const char* sub : {"/objects", "/versions"}) {
    if (auto r = make_dir(root + sub, 0700); !r) return r.error();
  }
  return CodeStore(std::move(root));
}

core::Result<std::string> CodeStore::kind_dir(const std::string& kind) const {
  // The kind names a directory of the store: one plain component.
  if (kind.empty() || kind[0] == '.' || kind.find('/') != std::string::npos ||
      kind.find('\0') != std::string::npos) {
    return core::Error{EINVAL, "kind \"" + kind + "\": not usable as a directory name"};
  }
  return root_ + "/versions/" + kind;
}

namespace {

// A temp object under objects/: unlinked when destroyed, unless it was renamed into place.
class TempObject {
 public:
  TempObject() = default;
  TempObject(const TempObject&) = delete;
  TempObject& operator=(const TempObject&) = delete;
  ~TempObject() { discard(); }

  core::Result<void> open(const std::string& objects) {
    path_ = objects + "/.tmp-XXXXXX";
    fd_.reset(::mkostemp(path_.data(), O_CLOEXEC));
    if (!fd_) {
      auto e = sys_error("mkstemp", path_);
      path_.clear();
      return e;
    }
    return {};
  }
  bool is_open() const { return static_cast<bool>(fd_); }
  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  // fchmod 0444, fsync, rename to `object`.
  core::Result<void> commit(const std::string& object) {
    if (::fchmod(fd_.get(), 0444) < 0) return sys_error("chmod", path_);
    if (::fsync(fd_.get()) < 0) return sys_error("fsync", path_);
    fd_.reset();
    if (::rename(path_.c_str(), object.c_str()) < 0) return sys_error("rename", path_);
    path_.clear();
    return {};
  }
  void discard() {
    fd_.reset();
    if (!path_.empty()) ::unlink(path_.c_str());
    path_.clear();
  }

 private:
  std::string path_;
  core::UniqueFd fd_;
};

core::Error cancelled() {
  return core::Error{ECANCELED, "the snapshot was cancelled (corral is stopping)"};
}

// What a file's stat says about its content: equal before and after a copy means nothing wrote
// it meanwhile (as far as the file system's timestamps tell: nanoseconds on ext4, xfs, btrfs).
bool unchanged(const struct stat& a, const struct stat& b) {
  return a.st_ino == b.st_ino && a.st_dev == b.st_dev && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
         a.st_ctim.tv_sec == b.st_ctim.tv_sec && a.st_ctim.tv_nsec == b.st_ctim.tv_nsec;
}

// Sleeps `ms` in steps, returning early (false) once a stop is asked.
bool pause_ms(int ms, const std::stop_token& stop) {
  for (int slept = 0; slept < ms; slept += 10) {
    if (stop.stop_requested()) return false;
    timespec ts{0, 10'000'000};
    ::nanosleep(&ts, nullptr);
  }
  return !stop.stop_requested();
}

// One read of a file's content: its digest, and the content itself (`held`, a small file) or a
// temp object it was written to (`tmp`, a large one: its holes stay holes).
struct Copied {
  std::string digest;
  std::string held;
  TempObject tmp;
  bool stable = false;  // nothing wrote the file while it was read
};

core::Result<void> copy_small(int in, const std::string& source, Sha256& hash, std::string& held) {
  std::vector<char> buf(kChunk);
  for (;;) {
    ssize_t n = ::read(in, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return sys_error("read", source);
    }
    if (n == 0) return {};
    hash.update(buf.data(), static_cast<size_t>(n));
    held.append(buf.data(), static_cast<size_t>(n));
    // It grew past what it was when it was opened: the stat after the copy says so; stop here.
    if (held.size() > kInMemoryBytes) return {};
  }
}

// [0, size) of `in` into `hash` and `out`, skipping holes (SEEK_DATA/SEEK_HOLE): a hole is hashed
// as the zeros it reads as and left a hole in `out` (which ends truncated to `size`).
core::Result<void> copy_sparse(int in, off_t size, const std::string& source, Sha256& hash,
                               TempObject& out, const std::stop_token& stop) {
  static const std::vector<char> zeros(kChunk, 0);
  std::vector<char> buf(kChunk);
  // A hole of gigabytes is seconds of hashing: a stop is seen within one chunk here too.
  auto hash_zeros = [&](off_t n) {
    while (n > 0 && !stop.stop_requested()) {
      size_t k = static_cast<size_t>(std::min<off_t>(n, static_cast<off_t>(zeros.size())));
      hash.update(zeros.data(), k);
      n -= static_cast<off_t>(k);
    }
  };
  for (off_t off = 0; off < size;) {
    if (stop.stop_requested()) return cancelled();
    off_t data = ::lseek(in, off, SEEK_DATA);
    if (data < 0) {
      if (errno != ENXIO) return sys_error("seek", source);
      data = size;  // no data past `off`: the rest is a hole
    }
    data = std::min(data, size);
    hash_zeros(data - off);
    if (stop.stop_requested()) return cancelled();
    if (data >= size) break;
    off_t hole = ::lseek(in, data, SEEK_HOLE);
    if (hole < 0) return sys_error("seek", source);
    hole = std::min(hole, size);
    for (off_t pos = data; pos < hole;) {
      if (stop.stop_requested()) return cancelled();
      size_t want = static_cast<size_t>(std::min<off_t>(hole - pos, static_cast<off_t>(kChunk)));
      ssize_t n = ::pread(in, buf.data(), want, pos);
      if (n < 0) {
        if (errno == EINTR) continue;
        return sys_error("read", source);
      }
      if (n == 0) return {};  // it shrank meanwhile: the stat after the copy says so
      hash.update(buf.data(), static_cast<size_t>(n));
      for (size_t done = 0; done < static_cast<size_t>(n);) {
        ssize_t w = ::pwrite(out.fd(), buf.data() + done, static_cast<size_t>(n) - done,
                             pos + static_cast<off_t>(done));
        if (w < 0) {
          if (errno == EINTR) continue;
          return sys_error("write", out.path());
        }
        done += static_cast<size_t>(w);
      }
      pos += n;
    }
    off = hole;
  }
  if (::ftruncate(out.fd(), size) < 0) return sys_error("truncate", out.path());
  return {};
}

core::Result<void> copy_once(const std::string& source, const std::string& objects,
                             const SnapshotControl& control, Copied& c) {
  // O_NOFOLLOW: the scan saw a regular file (or a symlink's resolved target) here; O_NONBLOCK: a
  // fifo swapped in meanwhile must not hang the copy (fstat below refuses it).
  core::UniqueFd in(::open(source.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!in) return sys_error("open", source);
  struct stat before;
  if (::fstat(in.get(), &before) < 0) return sys_error("stat", source);
  if (!S_ISREG(before.st_mode)) {
    return core::Error{EINVAL, source + ": no longer a regular file: refused"};
  }
  // Hashed while it is copied: the digest is of the bytes stored, never of a second read.
  Sha256 hash;
  if (before.st_size <= static_cast<off_t>(kInMemoryBytes)) {
    if (auto r = copy_small(in.get(), source, hash, c.held); !r) return r;
  } else {
    if (auto r = c.tmp.open(objects); !r) return r;
    if (auto r = copy_sparse(in.get(), before.st_size, source, hash, c.tmp, control.stop); !r)
      return r;
  }
  if (control.after_copy) control.after_copy(source);
  struct stat after;
  if (::fstat(in.get(), &after) < 0) return sys_error("stat", source);
  c.stable = unchanged(before, after);
  c.digest = hash.hex();
  return {};
}

}  // namespace

core::Result<std::string> CodeStore::store_object(const std::string& source,
                                                  const SnapshotControl& control, bool& wrote) {
  const std::string objects = root_ + "/objects";
  for (int attempt = 1;; ++attempt) {
    if (control.stop.stop_requested()) return cancelled();
    Copied c;
    if (auto r = copy_once(source, objects, control, c); !r) return r.error();
    if (!c.stable) {
      // Being written (an editor's save, a deploy tool's copy): a moment later it is whole.
      if (attempt == kCopyTries) {
        return core::Error{EAGAIN, source + ": changed while it was copied (" +
                                       std::to_string(kCopyTries) +
                                       " tries): refused; roll out again once it is written"};
      }
      if (!pause_ms(50 * attempt, control.stop)) return cancelled();
      continue;
    }
    std::string object = objects + "/" + c.digest;
    if (exists(object)) return c.digest;  // stored already: nothing to write (tmp is removed)
    if (!c.tmp.is_open()) {
      if (auto r = c.tmp.open(objects); !r) return r.error();
      if (auto r = write_all(c.tmp.fd(), c.held.data(), c.held.size(), c.tmp.path()); !r)
        return r.error();
    }
    if (auto r = c.tmp.commit(object); !r) return r.error();
    wrote = true;
    return c.digest;
  }
}

core::Result<void> CodeStore::build_version(const std::string& kdir, const CodeSet& set) {
  const std::string final_dir = kdir + "/" + set.version;
  if (!is_dir(final_dir)) {
    std::string tmp = kdir + "/.tmp-XXXXXX";
    if (!::mkdtemp(tmp.data())) return sys_error("mkdtemp", tmp);
    auto fail = [&](core::Error e) {
      (void)remove_tree(tmp);
      return e;
    };
    if (::chmod(tmp.c_str(), 0755) < 0) return fail(sys_error("chmod", tmp));
    std::set<std::string> made;  // the directories made so far (relative)
    for (const auto& f : set.files) {
      // Parents first, each once.
      for (size_t slash = f.path.find('/'); slash != std::string::npos;
           slash = f.path.find('/', slash + 1)) {
        std::string parent = f.path.substr(0, slash);
        if (made.contains(parent)) continue;
        if (auto r = make_dir(tmp + "/" + parent, 0755); !r) return fail(r.error());
        made.insert(std::move(parent));
      }
      std::string object = root_ + "/objects/" + f.digest;
      std::string link = tmp + "/" + f.path;
      if (::link(object.c_str(), link.c_str()) < 0) return fail(sys_error("link " + object, link));
    }
    if (::rename(tmp.c_str(), final_dir.c_str()) < 0) {
      // Made meanwhile (another store on the same state directory): the same content, by name.
      if ((errno != EEXIST && errno != ENOTEMPTY) || !is_dir(final_dir))
        return fail(sys_error("rename " + tmp, final_dir));
      (void)remove_tree(tmp);
    }
  }
  const std::string manifest = final_dir + ".json";
  if (!exists(manifest)) {
    nlohmann::json m = {{"version", set.version}, {"files", set.scripts_json()}};
    if (auto r = replace_file(manifest, m.dump()); !r) return r;
  }
  return {};
}

core::Result<std::vector<std::string>> CodeStore::read_history(const std::string& kdir) const {
  std::vector<std::string> out;
  auto text = read_file(kdir + "/history");
  // None yet is an empty history; an unreadable one is an error (collect must not take it for
  // an empty one and remove every version).
  if (!text) {
    if (text.error().code == ENOENT) return out;
    return text.error();
  }
  std::string_view rest(*text);
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    if (is_version(line)) out.emplace_back(line);
    if (nl == std::string_view::npos) break;
    rest.remove_prefix(nl + 1);
  }
  return out;
}

core::Result<void> CodeStore::write_history(const std::string& kdir,
                                            const std::vector<std::string>& history) {
  std::string text;
  text.reserve(history.size() * (kHexDigits + 1));
  for (const auto& v : history) {
    text += v;
    text += '\n';
  }
  return replace_file(kdir + "/history", text);
}

core::Result<void> CodeStore::append_history(const std::string& kdir, const std::string& version) {
  auto history = read_history(kdir);
  if (!history) return history.error();
  if (!history->empty() && history->back() == version) return {};  // current already
  history->push_back(version);
  return write_history(kdir, *history);
}

core::Result<CodeSet> CodeStore::snapshot(const std::string& kind, const std::string& dir,
                                          const SnapshotControl& control) {
  auto kdir = kind_dir(kind);
  if (!kdir) return kdir.error();
  auto found = scan(dir);
  if (!found) return found.error();

  CodeSet set;
  set.files.reserve(found->size());
  bool wrote = false;
  for (const auto& f : *found) {
    auto digest = store_object(f.source, control, wrote);
    if (!digest) return digest.error();
    set.files.push_back({f.path, std::move(*digest)});
  }
  if (wrote) {
    if (auto r = fsync_path(root_ + "/objects"); !r) return r.error();
  }
  if (control.stop.stop_requested()) return cancelled();
  set.version = version_of(set.files);
  set.dir = *kdir + "/" + set.version;
  set.manifest = set.dir + ".json";

  if (auto r = make_dir(*kdir, 0700); !r) return r.error();
  if (auto r = build_version(*kdir, set); !r) return r.error();
  // The renames of the tree and the manifest are durable once their directory is.
  if (auto r = fsync_path(*kdir); !r) return r.error();
  return set;
}

core::Result<void> CodeStore::make_current(const std::string& kind, const std::string& version) {
  auto kdir = kind_dir(kind);
  if (!kdir) return kdir.error();
  if (auto r = append_history(*kdir, version); !r) return r;
  return fsync_path(*kdir);
}

core::Result<size_t> CodeStore::check(const std::string& dir) {
  auto found = scan(dir);
  if (!found) return found.error();
  for (const auto& f : *found) {
    core::UniqueFd fd(::open(f.source.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (!fd) return sys_error("open", f.source);
  }
  return found->size();
}

core::Result<CodeSet> CodeStore::load(const std::string& kdir, const std::string& version) const {
  const std::string manifest = kdir + "/" + version + ".json";
  auto text = read_file(manifest);
  if (!text) return text.error();
  auto m = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const char* why) {
    return core::Error{EINVAL, "manifest " + manifest + ": " + why};
  };
  if (!m.is_object()) return bad("not a JSON object");
  auto v = m.find("version");
  if (v == m.end() || !v->is_string() || v->get<std::string>() != version)
    return bad("its version is not its name");
  auto files = m.find("files");
  if (files == m.end() || !files->is_array()) return bad("no files array");
  CodeSet set;
  set.version = version;
  set.dir = kdir + "/" + version;
  set.manifest = manifest;
  for (const auto& f : *files) {
    if (!f.is_object()) return bad("a file is not an object");
    auto p = f.find("path");
    auto d = f.find("digest");
    if (p == f.end() || !p->is_string() || d == f.end() || !d->is_string())
      return bad("a file without path or digest");
    set.files.push_back({p->get<std::string>(), d->get<std::string>()});
  }
  if (version_of(set.files) != version) return bad("its files do not make its version");
  if (!is_dir(set.dir)) {
    errno = ENOENT;
    return sys_error("version directory", set.dir);
  }
  return set;
}

core::Result<CodeSet> CodeStore::find(const std::string& kind, const std::string& version_or_prefix,
                                      bool make_current) {
  auto kdir = kind_dir(kind);
  if (!kdir) return kdir.error();
  std::string want = version_or_prefix;
  std::transform(want.begin(), want.end(), want.begin(), [](char c) {
    return (c >= 'A' && c <= 'F') ? static_cast<char>(c - 'A' + 'a') : c;
  });
  if (want.size() > kHexDigits || !is_hex(want)) {
    return core::Error{
        EINVAL, "version \"" + version_or_prefix + "\": not a version (up to 64 hex digits)"};
  }
  if (want.size() < kMinPrefix) {
    return core::Error{EINVAL, "version \"" + version_or_prefix +
                                   "\": too short (a prefix needs at least 8 hex digits)"};
  }
  std::vector<std::string> matches;
  if (is_dir(*kdir)) {
    auto names = list_dir(*kdir);
    if (!names) return names.error();
    for (const auto& name : *names) {
      if (is_version(name) && name.compare(0, want.size(), want) == 0 && is_dir(*kdir + "/" + name))
        matches.push_back(name);
    }
  }
  if (matches.empty()) {
    return core::Error{ENOENT,
                       "version " + version_or_prefix + ": no kept version of kind " + kind};
  }
  if (matches.size() > 1) {
    std::sort(matches.begin(), matches.end());
    std::string list;
    for (const auto& m : matches) list += (list.empty() ? "" : ", ") + m.substr(0, 12);
    return core::Error{EINVAL, "version " + version_or_prefix + ": ambiguous, " +
                                   std::to_string(matches.size()) + " kept versions of kind " +
                                   kind + " begin with it (" + list + ")"};
  }
  auto set = load(*kdir, matches[0]);
  if (!set) return set.error();
  if (make_current) {
    if (auto r = append_history(*kdir, set->version); !r) return r.error();
    if (auto r = fsync_path(*kdir); !r) return r.error();
  }
  return set;
}

std::vector<std::string> CodeStore::versions(const std::string& kind) const {
  std::vector<std::string> out;
  auto kdir = kind_dir(kind);
  if (!kdir) return out;
  auto read = read_history(*kdir);
  if (!read) return out;
  const auto& history = *read;
  std::set<std::string> seen;
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    if (seen.insert(*it).second && is_dir(*kdir + "/" + *it)) out.push_back(*it);
  }
  return out;
}

core::Result<void> CodeStore::collect(const std::string& kind, size_t keep,
                                      const std::set<std::string>& in_use) {
  auto kdir = kind_dir(kind);
  if (!kdir) return kdir.error();
  core::Result<void> result;  // the first error; the rest is still tried
  auto note = [&](core::Result<void> r) {
    if (!r && result) result = std::move(r);
  };

  auto read = read_history(*kdir);
  if (!read) return read.error();
  const auto& history = *read;
  std::set<std::string> kept(in_use);
  {
    std::set<std::string> newest;
    for (auto it = history.rbegin(); it != history.rend() && newest.size() < keep; ++it)
      newest.insert(*it);
    kept.insert(newest.begin(), newest.end());
  }

  if (is_dir(*kdir)) {
    auto names = list_dir(*kdir);
    if (!names) return names.error();
    for (const auto& name : *names) {
      std::string path = *kdir + "/" + name;
      if (name.starts_with(".tmp-") || name.starts_with("history.tmp-")) {
        note(remove_tree(path));  // left by a snapshot that did not finish
      } else if (is_version(name)) {
        if (!kept.contains(name)) note(remove_tree(path));
      } else if (name.size() == kHexDigits + 5 && name.ends_with(".json") &&
                 is_version(std::string_view(name).substr(0, kHexDigits))) {
        if (!kept.contains(name.substr(0, kHexDigits)) && ::unlink(path.c_str()) < 0 &&
            errno != ENOENT)
          note(sys_error("unlink", path));
      }
    }
  }

  // The history keeps the last entry of each kept version, in order.
  std::vector<std::string> trimmed;
  {
    std::set<std::string> seen;
    for (auto it = history.rbegin(); it != history.rend(); ++it) {
      if (kept.contains(*it) && seen.insert(*it).second && is_dir(*kdir + "/" + *it))
        trimmed.push_back(*it);
    }
    std::reverse(trimmed.begin(), trimmed.end());
  }
  if (trimmed != history) note(write_history(*kdir, trimmed));

  // Objects no version links (any kind's): link count 1. Temp objects too (snapshots run on the
  // thread that collects, one task at a time, so none is being written now).
  const std::string objects = root_ + "/objects";
  auto names = list_dir(objects);
  if (!names) {
    note(names.error());
    return result;
  }
  for (const auto& name : *names) {
    std::string path = objects + "/" + name;
    struct stat st;
    if (::lstat(path.c_str(), &st) < 0) {
      if (errno != ENOENT) note(sys_error("stat", path));
      continue;
    }
    if (S_ISREG(st.st_mode) && st.st_nlink == 1 && ::unlink(path.c_str()) < 0 && errno != ENOENT)
      note(sys_error("unlink", path));
  }
  return result;
}

}  // namespace corral::workers
