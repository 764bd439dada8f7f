#include "workers/code_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <nettle/sha2.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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
      if (name[0] == '.') continue;  // .git, editor swap files
      std::string child_rel = join(rel, name);
      std::string child = abs + "/" + name;
      if (!valid_utf8(name)) {
        // The worker protocol and the manifest carry paths as JSON strings.
        return core::Error{EILSEQ,
                           child + ": a name that is not UTF-8: refused in a code directory"};
      }
      struct stat st;
      if (::lstat(child.c_str(), &st) < 0) return sys_error("stat", child);
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

core::Result<std::string> CodeStore::store_object(const std::string& source) {
  // O_NOFOLLOW: the scan saw a regular file (or a symlink's resolved target) here; O_NONBLOCK: a
  // fifo swapped in meanwhile must not hang the loop (fstat below refuses it).
  core::UniqueFd in(::open(source.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!in) return sys_error("open", source);
  struct stat st;
  if (::fstat(in.get(), &st) < 0) return sys_error("stat", source);
  if (!S_ISREG(st.st_mode)) {
    return core::Error{EINVAL, source + ": no longer a regular file: refused"};
  }

  const std::string objects = root_ + "/objects";
  std::string tmp;  // set once the content is streamed to a temp object
  core::UniqueFd out;
  auto fail = [&](core::Error e) {
    if (!tmp.empty()) ::unlink(tmp.c_str());
    return e;
  };
  auto open_tmp = [&]() -> core::Result<void> {
    tmp = objects + "/.tmp-XXXXXX";
    out.reset(::mkostemp(tmp.data(), O_CLOEXEC));
    if (!out) {
      auto e = sys_error("mkstemp", tmp);
      tmp.clear();
      return e;
    }
    return {};
  };

  // Hashed while it is copied: the digest is of the bytes stored, never of a second read.
  Sha256 hash;
  std::string held;
  std::vector<char> buf(kChunk);
  for (;;) {
    ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return fail(sys_error("read", source));
    }
    if (n == 0) break;
    hash.update(buf.data(), static_cast<size_t>(n));
    if (!out && held.size() + static_cast<size_t>(n) <= kInMemoryBytes) {
      held.append(buf.data(), static_cast<size_t>(n));
      continue;
    }
    if (!out) {
      if (auto r = open_tmp(); !r) return r.error();
      if (auto r = write_all(out.get(), held.data(), held.size(), tmp); !r) return fail(r.error());
      held.clear();
      held.shrink_to_fit();
    }
    if (auto r = write_all(out.get(), buf.data(), static_cast<size_t>(n), tmp); !r)
      return fail(r.error());
  }
  std::string digest = hash.hex();
  std::string object = objects + "/" + digest;
  if (exists(object)) {  // stored already: nothing to write
    if (!tmp.empty()) ::unlink(tmp.c_str());
    return digest;
  }
  if (!out) {
    if (auto r = open_tmp(); !r) return r.error();
    if (auto r = write_all(out.get(), held.data(), held.size(), tmp); !r) return fail(r.error());
  }
  if (::fchmod(out.get(), 0444) < 0) return fail(sys_error("chmod", tmp));
  if (::fsync(out.get()) < 0) return fail(sys_error("fsync", tmp));
  out.reset();
  if (::rename(tmp.c_str(), object.c_str()) < 0) return fail(sys_error("rename", tmp));
  wrote_object_ = true;
  return digest;
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
    for (const auto& f : set.files) {
      // Parents first: the files are in path order, so a directory's files are together.
      for (size_t slash = f.path.find('/'); slash != std::string::npos;
           slash = f.path.find('/', slash + 1)) {
        if (auto r = make_dir(tmp + "/" + f.path.substr(0, slash), 0755); !r)
          return fail(r.error());
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

core::Result<void> CodeStore::make_current(const std::string& kdir, const std::string& version) {
  auto history = read_history(kdir);
  if (!history) return history.error();
  if (!history->empty() && history->back() == version) return {};  // current already
  history->push_back(version);
  return write_history(kdir, *history);
}

core::Result<CodeSet> CodeStore::snapshot(const std::string& kind, const std::string& dir) {
  auto kdir = kind_dir(kind);
  if (!kdir) return kdir.error();
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
  auto& found = scanner.found();
  // Bytewise path order (std::string compares as unsigned char).
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.path < b.path; });

  CodeSet set;
  set.files.reserve(found.size());
  wrote_object_ = false;
  for (const auto& f : found) {
    auto digest = store_object(f.source);
    if (!digest) return digest.error();
    set.files.push_back({f.path, std::move(*digest)});
  }
  if (wrote_object_) {
    if (auto r = fsync_path(root_ + "/objects"); !r) return r.error();
  }
  set.version = version_of(set.files);
  set.dir = *kdir + "/" + set.version;

  if (auto r = make_dir(*kdir, 0700); !r) return r.error();
  if (auto r = build_version(*kdir, set); !r) return r.error();
  if (auto r = make_current(*kdir, set.version); !r) return r.error();
  // The renames of the tree, the manifest and the history are durable once their directory is.
  if (auto r = fsync_path(*kdir); !r) return r.error();
  return set;
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
    if (auto r = this->make_current(*kdir, set->version); !r) return r.error();
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

  // Objects no version links (any kind's): link count 1. Temp objects too (a snapshot runs on
  // this thread, so none is being written now).
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
