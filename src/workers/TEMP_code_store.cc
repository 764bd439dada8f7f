// TEMP (dropped at merge: r-store builds the real code_store.cc / code_watch.cc): a naive
// CodeStore (versions are plain copies, objects unused) and a CodeWatcher that cannot watch, so
// that r-glue links and its tests run.
#include <fcntl.h>
#include <nettle/sha2.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "workers/code_store.h"
#include "workers/code_watch.h"

namespace corral::workers {

namespace fs = std::filesystem;

namespace {

std::string hex(const uint8_t* d, size_t n) {
  static const char* k = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    out.push_back(k[d[i] >> 4]);
    out.push_back(k[d[i] & 15]);
  }
  return out;
}

std::string sha256(const std::string& bytes) {
  sha256_ctx ctx;
  sha256_init(&ctx);
  sha256_update(&ctx, bytes.size(), reinterpret_cast<const uint8_t*>(bytes.data()));
  uint8_t d[SHA256_DIGEST_SIZE];
  sha256_digest(&ctx, sizeof d, d);
  return hex(d, sizeof d);
}

std::vector<std::string> read_history(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

void write_history(const std::string& path, const std::vector<std::string>& h) {
  std::ofstream out(path + ".tmp", std::ios::trunc);
  for (const auto& v : h) out << v << "\n";
  out.close();
  fs::rename(path + ".tmp", path);
}

}  // namespace

core::Result<CodeStore> CodeStore::open(const std::string& state_dir) {
  std::error_code ec;
  fs::create_directories(state_dir + "/code/objects", ec);
  fs::create_directories(state_dir + "/code/versions", ec);
  if (ec) return core::Error{ec.value(), state_dir + "/code: " + ec.message()};
  return CodeStore(state_dir + "/code");
}

core::Result<CodeSet> CodeStore::snapshot(const std::string& kind, const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return core::Error{errno, dir + ": " + std::strerror(errno)};
  if (!S_ISDIR(st.st_mode)) return core::Error{ENOTDIR, dir + ": not a directory"};
  std::vector<std::pair<std::string, std::string>> files;  // path, content
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (!name.empty() && name[0] == '.') {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_directory()) continue;
    if (!it->is_regular_file()) return core::Error{EINVAL, it->path().string() + ": not a file"};
    std::ifstream in(it->path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    files.emplace_back(fs::relative(it->path(), dir).generic_string(), ss.str());
  }
  if (ec) return core::Error{ec.value(), dir + ": " + ec.message()};
  std::sort(files.begin(), files.end());
  CodeSet set;
  std::string lines;
  for (const auto& [path, content] : files) {
    set.files.push_back({path, sha256(content)});
    lines += path + '\0' + set.files.back().digest + "\n";
  }
  set.version = sha256(lines);
  std::string kdir = root_ + "/versions/" + kind;
  fs::create_directories(kdir, ec);
  set.dir = kdir + "/" + set.version;
  if (!fs::exists(set.dir)) {
    for (const auto& [path, content] : files) {
      fs::create_directories(fs::path(set.dir + "/" + path).parent_path(), ec);
      std::ofstream(set.dir + "/" + path, std::ios::binary) << content;
    }
    fs::create_directories(set.dir, ec);
    nlohmann::json m = {{"version", set.version}, {"files", nlohmann::json::array()}};
    for (const auto& f : set.files) m["files"].push_back({{"path", f.path}, {"digest", f.digest}});
    std::ofstream(kdir + "/" + set.version + ".json") << m.dump();
  }
  auto h = read_history(kdir + "/history");
  h.push_back(set.version);
  write_history(kdir + "/history", h);
  return set;
}

core::Result<CodeSet> CodeStore::find(const std::string& kind, const std::string& prefix,
                                      bool make_current) {
  std::string kdir = root_ + "/versions/" + kind;
  std::string found;
  for (const auto& v : versions(kind))
    if (v.rfind(prefix, 0) == 0) {
      if (!found.empty()) return core::Error{EINVAL, "'" + prefix + "' names two versions"};
      found = v;
    }
  if (found.empty() || prefix.size() < 8) return core::Error{ENOENT, "no such version"};
  std::ifstream in(kdir + "/" + found + ".json");
  auto m = nlohmann::json::parse(in, nullptr, false);
  if (m.is_discarded()) return core::Error{EIO, "bad manifest"};
  CodeSet set{found, kdir + "/" + found, {}};
  for (const auto& f : m["files"]) set.files.push_back({f["path"], f["digest"]});
  if (make_current) {
    auto h = read_history(kdir + "/history");
    h.push_back(found);
    write_history(kdir + "/history", h);
  }
  return set;
}

std::vector<std::string> CodeStore::versions(const std::string& kind) const {
  auto h = read_history(root_ + "/versions/" + kind + "/history");
  std::vector<std::string> out;
  for (auto it = h.rbegin(); it != h.rend(); ++it)
    if (std::find(out.begin(), out.end(), *it) == out.end()) out.push_back(*it);
  return out;
}

core::Result<void> CodeStore::collect(const std::string& kind, size_t keep,
                                      const std::set<std::string>& in_use) {
  std::string kdir = root_ + "/versions/" + kind;
  auto all = versions(kind);
  std::vector<std::string> kept;
  std::error_code ec;
  for (size_t i = 0; i < all.size(); ++i) {
    if (i < keep || in_use.count(all[i])) {
      kept.push_back(all[i]);
      continue;
    }
    fs::remove_all(kdir + "/" + all[i], ec);
    fs::remove(kdir + "/" + all[i] + ".json", ec);
  }
  std::vector<std::string> h;
  for (const auto& v : read_history(kdir + "/history"))
    if (std::find(kept.begin(), kept.end(), v) != kept.end()) h.push_back(v);
  // Oldest first, each once (newest occurrence).
  std::vector<std::string> dedup;
  for (auto it = h.rbegin(); it != h.rend(); ++it)
    if (std::find(dedup.begin(), dedup.end(), *it) == dedup.end()) dedup.push_back(*it);
  std::reverse(dedup.begin(), dedup.end());
  write_history(kdir + "/history", dedup);
  return {};
}

core::Result<std::unique_ptr<CodeWatcher>> CodeWatcher::create(core::EventLoop&, core::Logger&,
                                                               std::string dir, uint32_t,
                                                               std::function<void()>) {
  return core::Error{ENOSYS, dir + ": TEMP: no watcher before the merge"};
}

CodeWatcher::~CodeWatcher() = default;
void CodeWatcher::on_io(uint32_t) {}

}  // namespace corral::workers
