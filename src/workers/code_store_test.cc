// CodeStore on a real file system: every test works in a fresh mkdtemp directory (a code
// directory `src/` and a state directory `state/`) that it removes at the end.
#include "workers/code_store.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stop_token>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace corral::workers {
namespace {

namespace fs = std::filesystem;

class CodeStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // tmpfs when there is one: a snapshot fsyncs its new objects, its manifest and the history
    // (about 40 ms a snapshot on this machine's disk, 40 s for the 1,000 of the last test).
    const char* tmp = getenv("TMPDIR");
    std::string dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : tmp && *tmp ? tmp : "/tmp";
    std::string base = dir + "/code_store_test.XXXXXX";
    ASSERT_NE(mkdtemp(base.data()), nullptr);
    top_ = base;
    src_ = top_ + "/src";
    state_ = top_ + "/state";
    fs::create_directories(src_);
    fs::create_directories(state_);
    auto s = CodeStore::open(state_);
    ASSERT_TRUE(s.ok()) << s.error().reason;
    store_.emplace(std::move(*s));
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(top_, ec);
  }

  void write(const std::string& rel, const std::string& content) {
    fs::path p = fs::path(src_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary | std::ios::trunc) << content;
  }
  static std::string slurp(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // A snapshot made current, as a rollout the manager took does.
  CodeSet snap(const std::string& kind = "doc") {
    auto r = store_->snapshot(kind, src_);
    EXPECT_TRUE(r.ok()) << r.error().reason;
    if (!r.ok()) return CodeSet{};
    auto c = store_->make_current(kind, r->version);
    EXPECT_TRUE(c.ok()) << c.error().reason;
    return *r;
  }
  blkcnt_t blocks(const std::string& path) const {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_blocks;
  }
  size_t count(const std::string& dir, bool dirs_only = false) const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (!dirs_only || e.is_directory()) ++n;
    }
    return n;
  }
  std::string objects() const { return store_->root() + "/objects"; }
  std::string kind_dir(const std::string& kind = "doc") const {
    return store_->root() + "/versions/" + kind;
  }
  ino_t inode(const std::string& path) const {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_ino;
  }

  std::string top_, src_, state_;
  std::optional<CodeStore> store_;
};

TEST_F(CodeStoreTest, OpenMakesThePrivateLayout) {
  EXPECT_TRUE(fs::path(store_->root()).is_absolute());
  for (const char* d : {"", "/objects", "/versions"}) {
    struct stat st {};
    ASSERT_EQ(::stat((store_->root() + d).c_str(), &st), 0);
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0700u) << d;
  }
  auto again = CodeStore::open(state_);  // an existing store opens as is
  EXPECT_TRUE(again.ok());
}

TEST_F(CodeStoreTest, VersionIsTheDigestOfThePathDigestLines) {
  write("b.txt", "bee");
  write("a.py", "print(1)\n");
  CodeSet set = snap();
  ASSERT_EQ(set.files.size(), 2u);
  EXPECT_EQ(set.files[0].path, "a.py");
  EXPECT_EQ(set.files[1].path, "b.txt");
  EXPECT_EQ(set.files[1].digest.size(), 64u);
  EXPECT_EQ(set.version.size(), 64u);
  EXPECT_EQ(set.short_version(), set.version.substr(0, 12));
  EXPECT_EQ(set.dir, kind_dir() + "/" + set.version);
  EXPECT_EQ(set.manifest, set.dir + ".json");
  EXPECT_EQ(
      set.code_json(),
      (nlohmann::json{{"version", set.version}, {"dir", set.dir}, {"manifest", set.manifest}}));

  // The manifest says the same.
  auto m = nlohmann::json::parse(slurp(set.manifest));
  EXPECT_EQ(m["version"], set.version);
  EXPECT_EQ(m["files"], set.scripts_json());
  // Each file of the version is its object, read-only.
  for (const auto& f : set.files) {
    EXPECT_EQ(inode(set.dir + "/" + f.path), inode(objects() + "/" + f.digest));
    struct stat st {};
    ASSERT_EQ(::stat((objects() + "/" + f.digest).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0444u);
  }
  EXPECT_EQ(slurp(set.dir + "/a.py"), "print(1)\n");
}

TEST_F(CodeStoreTest, KnownDigests) {
  write("x", "abc");
  CodeSet set = snap();
  ASSERT_EQ(set.files.size(), 1u);
  // sha256("abc") (FIPS 180-2's example).
  EXPECT_EQ(set.files[0].digest,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // The version of the one line "x\0<digest>\n": checked against an independent SHA-256.
  std::string line = std::string("x") + '\0' + set.files[0].digest + "\n";
  std::string line_file = top_ + "/line";
  std::ofstream(line_file, std::ios::binary) << line;
  std::string cmd = "sha256sum " + line_file;
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char out[65] = {};
  ASSERT_EQ(fread(out, 1, 64, p), 64u);
  pclose(p);
  EXPECT_EQ(set.version, std::string(out, 64));
}

TEST_F(CodeStoreTest, EmptyDirectoryHasAVersion) {
  CodeSet set = snap();
  EXPECT_TRUE(set.files.empty());
  // sha256 of no bytes.
  EXPECT_EQ(set.version, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_TRUE(fs::is_directory(set.dir));
  EXPECT_EQ(count(set.dir), 0u);
  EXPECT_EQ(store_->versions("doc"), std::vector<std::string>{set.version});
}

TEST_F(CodeStoreTest, TwoVersionsShareAnUnchangedFile) {
  write("lib/shared.py", "shared = True\n");
  write("app.py", "v = 1\n");
  CodeSet v1 = snap();
  write("app.py", "v = 2\n");
  CodeSet v2 = snap();
  ASSERT_NE(v1.version, v2.version);
  // Stored once: the same inode in both trees, one object for it.
  EXPECT_EQ(inode(v1.dir + "/lib/shared.py"), inode(v2.dir + "/lib/shared.py"));
  EXPECT_NE(inode(v1.dir + "/app.py"), inode(v2.dir + "/app.py"));
  EXPECT_EQ(count(objects()), 3u);  // shared, app v1, app v2
  struct stat st {};
  ASSERT_EQ(::stat((v1.dir + "/lib/shared.py").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 3u);  // the object and two versions
  EXPECT_EQ(slurp(v1.dir + "/app.py"), "v = 1\n");
  EXPECT_EQ(slurp(v2.dir + "/app.py"), "v = 2\n");
  EXPECT_EQ(store_->versions("doc"), (std::vector<std::string>{v2.version, v1.version}));
}

TEST_F(CodeStoreTest, UnchangedDirectoryIsTheSameVersionReused) {
  write("app.py", "v = 1\n");
  CodeSet a = snap();
  ino_t before = inode(a.dir + "/app.py");
  CodeSet b = snap();
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.files, b.files);
  EXPECT_EQ(inode(b.dir + "/app.py"), before);
  EXPECT_EQ(count(objects()), 1u);
  EXPECT_EQ(count(kind_dir(), true), 1u);
  // Becoming current again while current is not a new history entry.
  EXPECT_EQ(slurp(kind_dir() + "/history"), a.version + "\n");
}

TEST_F(CodeStoreTest, NestedDirectoriesAndDotfiles) {
  write("a/b/c/deep.txt", "deep");
  write("a/top.txt", "top");
  write("z.txt", "z");
  write(".git/config", "[core]");
  write(".app.py.swp", "swap");
  write("a/.hidden", "hidden");
  write(".hiddendir/x/y.txt", "no");
  fs::create_directories(src_ + "/empty/sub");
  CodeSet set = snap();
  std::vector<std::string> paths;
  for (const auto& f : set.files) paths.push_back(f.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"a/b/c/deep.txt", "a/top.txt", "z.txt"}));
  EXPECT_EQ(slurp(set.dir + "/a/b/c/deep.txt"), "deep");
  EXPECT_FALSE(fs::exists(set.dir + "/.git"));
}

TEST_F(CodeStoreTest, PathsAreSortedBytewise) {
  // '-' (0x2d) < '/' (0x2f) < '0' (0x30): "a/b" sorts between "a-b" and "a0", not after them
  // as a walk of the tree would list it.
  write("B", "1");
  write("a0", "2");
  write("a-b", "3");
  write("a/b", "4");
  write("\xc3\xa9", "5");  // é: above every ASCII byte
  CodeSet set = snap();
  std::vector<std::string> paths;
  for (const auto& f : set.files) paths.push_back(f.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"B", "a-b", "a/b", "a0", "\xc3\xa9"}));
}

TEST_F(CodeStoreTest, SymlinkInsideIsItsTarget) {
  write("real/config.json", "{}");
  fs::create_symlink("real/config.json", src_ + "/config.json");
  CodeSet set = snap();
  ASSERT_EQ(set.files.size(), 2u);
  EXPECT_EQ(set.files[0].path, "config.json");
  EXPECT_EQ(set.files[0].digest, set.files[1].digest);
  // Stored as a file (a link to the object), not as a symlink.
  EXPECT_FALSE(fs::is_symlink(set.dir + "/config.json"));
  EXPECT_EQ(slurp(set.dir + "/config.json"), "{}");
}

TEST_F(CodeStoreTest, SymlinkOutsideIsRefused) {
  std::ofstream(top_ + "/secret") << "outside";
  fs::create_symlink(top_ + "/secret", src_ + "/leak");
  auto r = store_->snapshot("doc", src_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find(src_ + "/leak"), std::string::npos) << r.error().reason;
  EXPECT_NE(r.error().reason.find("outside"), std::string::npos) << r.error().reason;
  // Relative, through "..": refused too.
  fs::remove(src_ + "/leak");
  fs::create_symlink("../secret", src_ + "/leak");
  EXPECT_FALSE(store_->snapshot("doc", src_).ok());
  // A symlink to a directory inside, and a dangling one: refused.
  fs::remove(src_ + "/leak");
  fs::create_directories(src_ + "/d");
  fs::create_directory_symlink("d", src_ + "/dlink");
  r = store_->snapshot("doc", src_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find("not a regular file"), std::string::npos) << r.error().reason;
  fs::remove(src_ + "/dlink");
  fs::create_symlink("nowhere", src_ + "/dangling");
  r = store_->snapshot("doc", src_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find("dangling"), std::string::npos) << r.error().reason;
  // Nothing became current.
  EXPECT_TRUE(store_->versions("doc").empty());
}

TEST_F(CodeStoreTest, SpecialFilesAreRefused) {
  write("app.py", "x");
  ASSERT_EQ(mkfifo((src_ + "/pipe").c_str(), 0600), 0);
  auto r = store_->snapshot("doc", src_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find(src_ + "/pipe"), std::string::npos) << r.error().reason;
  EXPECT_NE(r.error().reason.find("fifo"), std::string::npos) << r.error().reason;
  fs::remove(src_ + "/pipe");

  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(s, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string sock = src_ + "/s";
  ASSERT_LT(sock.size(), sizeof addr.sun_path);
  memcpy(addr.sun_path, sock.c_str(), sock.size() + 1);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(s);
  r = store_->snapshot("doc", src_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find("socket"), std::string::npos) << r.error().reason;
}

TEST_F(CodeStoreTest, ANameThatIsNotUtf8IsRefused) {
  write("caf\xe9.txt", "latin-1");  // the protocol's JSON could not carry it
  auto r = store_->snapshot("doc", src_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EILSEQ);
  EXPECT_NE(r.error().reason.find("not UTF-8"), std::string::npos) << r.error().reason;
}

TEST_F(CodeStoreTest, MissingDirectoryAndBadKindAreErrors) {
  auto r = store_->snapshot("doc", top_ + "/nope");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ENOENT);
  EXPECT_NE(r.error().reason.find(top_ + "/nope"), std::string::npos) << r.error().reason;
  EXPECT_NE(r.error().reason.find(strerror(ENOENT)), std::string::npos) << r.error().reason;
  std::ofstream(top_ + "/file") << "x";
  r = store_->snapshot("doc", top_ + "/file");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ENOTDIR);
  EXPECT_FALSE(store_->snapshot("../x", src_).ok());
  EXPECT_FALSE(store_->snapshot("", src_).ok());
}

TEST_F(CodeStoreTest, UnreadableFileIsAnErrorNamingIt) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads anything";
  write("locked.py", "x");
  ASSERT_EQ(chmod((src_ + "/locked.py").c_str(), 0), 0);
  auto r = store_->snapshot("doc", src_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EACCES);
  EXPECT_NE(r.error().reason.find(src_ + "/locked.py"), std::string::npos) << r.error().reason;
}

TEST_F(CodeStoreTest, SnapshotIsIndependentOfLaterEdits) {
  write("app.py", "v = 1\n");
  CodeSet set = snap();
  // In place (same inode: what `echo >> file` does) and by replacement (what editors do).
  { std::ofstream(src_ + "/app.py", std::ios::app) << "appended\n"; }
  EXPECT_EQ(slurp(set.dir + "/app.py"), "v = 1\n");
  fs::remove(src_ + "/app.py");
  write("app.py", "v = 2\n");
  EXPECT_EQ(slurp(set.dir + "/app.py"), "v = 1\n");
  // Its object is a copy, not a link to the source.
  EXPECT_NE(inode(set.dir + "/app.py"), inode(src_ + "/app.py"));
  // And a read-only one.
  struct stat st {};
  ASSERT_EQ(::stat((set.dir + "/app.py").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0444u);
  if (geteuid() != 0) {  // root writes anything
    EXPECT_EQ(::open((set.dir + "/app.py").c_str(), O_WRONLY), -1);
    EXPECT_EQ(errno, EACCES);
  }
}

TEST_F(CodeStoreTest, LargeFileIsStreamed) {
  std::string big(3 * 1024 * 1024 + 17, 'x');
  for (size_t i = 0; i < big.size(); i += 4096) big[i] = static_cast<char>('a' + i % 26);
  write("big.bin", big);
  CodeSet a = snap();
  EXPECT_EQ(slurp(a.dir + "/big.bin"), big);
  CodeSet b = snap();  // stored already: the temp copy is dropped
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(count(objects()), 1u);
}

TEST_F(CodeStoreTest, ASnapshotIsNotCurrentUntilMadeCurrent) {
  write("app.py", "v = 1\n");
  CodeSet v1 = snap();
  write("app.py", "v = 2\n");
  auto v2 = store_->snapshot("doc", src_);
  ASSERT_TRUE(v2.ok()) << v2.error().reason;
  EXPECT_TRUE(fs::exists(v2->manifest));
  // Stored, but the kind's history still ends with v1: a set refused after its snapshot (the
  // manager closing) never becomes current, and the next collect removes it.
  EXPECT_EQ(store_->versions("doc"), std::vector<std::string>{v1.version});
  ASSERT_TRUE(store_->collect("doc", kKeepVersions, {}).ok());
  EXPECT_FALSE(fs::exists(v2->dir));
  EXPECT_TRUE(fs::exists(v1.dir));
  // Made current, it is the newest.
  v2 = store_->snapshot("doc", src_);
  ASSERT_TRUE(v2.ok());
  ASSERT_TRUE(store_->make_current("doc", v2->version).ok());
  EXPECT_EQ(store_->versions("doc"), (std::vector<std::string>{v2->version, v1.version}));
  // find() gives the manifest's path too.
  auto found = store_->find("doc", v1.version, false);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->manifest, v1.manifest);
}

TEST_F(CodeStoreTest, PythonBytecodeIsNotInTheSet) {
  write("app.py", "import lib\n");
  write("lib/__init__.py", "x = 1\n");
  write("__pycache__/app.cpython-311.pyc", "bytecode");
  write("lib/__pycache__/__init__.cpython-311.pyc", "bytecode");
  write("old.pyc", "bytecode");
  write("old.pyo", "bytecode");
  CodeSet set = snap();
  std::vector<std::string> paths;
  for (const auto& f : set.files) paths.push_back(f.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"app.py", "lib/__init__.py"}));
  // So a worker that writes bytecode beside its code does not change the set.
  write("lib/__pycache__/other.cpython-311.pyc", "more");
  EXPECT_EQ(snap().version, set.version);
}

TEST_F(CodeStoreTest, ASparseFileStaysSparse) {
  // 64 MiB with 4 KiB of data in the middle: a hole, data, a hole.
  const off_t size = 64 << 20, at = 32 << 20;
  std::string data(4096, 'd');
  {
    int fd = ::open((src_ + "/sparse.img").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, size), 0);
    ASSERT_EQ(::pwrite(fd, data.data(), data.size(), at), static_cast<ssize_t>(data.size()));
    ::close(fd);
  }
  if (blocks(src_ + "/sparse.img") * 512 > 1 << 20) GTEST_SKIP() << "no sparse files here";
  write("small.txt", "s");
  CodeSet set = snap();
  const std::string object = set.dir + "/sparse.img";
  // Stored sparse: about the data's blocks, not 64 MiB.
  EXPECT_LT(blocks(object) * 512, 1 << 20);
  struct stat st {};
  ASSERT_EQ(::stat(object.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, size);
  // Its content (and so its digest) is the file's: zeros, the data, zeros.
  std::string content = slurp(object);
  ASSERT_EQ(content.size(), static_cast<size_t>(size));
  EXPECT_EQ(content.substr(at, data.size()), data);
  EXPECT_EQ(content.find_first_not_of('\0'), static_cast<size_t>(at));
  EXPECT_EQ(content.find_last_not_of('\0'), static_cast<size_t>(at) + data.size() - 1);
  EXPECT_EQ(slurp(src_ + "/sparse.img"), content);
}

TEST_F(CodeStoreTest, AFileChangedWhileItIsCopiedIsCopiedAgain) {
  write("app.py", "v = 1\n");
  write("big.bin", std::string(2 << 20, 'b'));  // the streamed path too
  int copies = 0;
  std::set<std::string> written;
  SnapshotControl control;
  control.after_copy = [&](const std::string& path) {
    ++copies;
    // The first copy of each file is overtaken by a write (as if a save were in progress).
    if (written.insert(path).second) std::ofstream(path, std::ios::app) << "more";
  };
  auto set = store_->snapshot("doc", src_, control);
  ASSERT_TRUE(set.ok()) << set.error().reason;
  EXPECT_EQ(copies, 4);  // each file twice
  // What is stored is the file as it was once nothing wrote it any more.
  EXPECT_EQ(slurp(set->dir + "/big.bin"), slurp(src_ + "/big.bin"));
  EXPECT_EQ(slurp(set->dir + "/app.py"), "v = 1\nmore");
}

TEST_F(CodeStoreTest, AFileThatKeepsChangingIsRefused) {
  write("app.py", "v = 1\n");
  write("log.txt", "");
  int copies = 0;
  SnapshotControl control;
  control.after_copy = [&](const std::string& path) {
    if (path.ends_with("/log.txt")) {
      ++copies;
      std::ofstream(path, std::ios::app) << "line\n";
    }
  };
  auto r = store_->snapshot("doc", src_, control);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(copies, kCopyTries);
  EXPECT_NE(r.error().reason.find(src_ + "/log.txt"), std::string::npos) << r.error().reason;
  EXPECT_NE(r.error().reason.find("changed while it was copied"), std::string::npos)
      << r.error().reason;
  EXPECT_TRUE(store_->versions("doc").empty());
  // No temp object is left behind.
  for (const auto& e : fs::directory_iterator(objects()))
    EXPECT_FALSE(e.path().filename().string().starts_with(".tmp-")) << e.path();
}

TEST_F(CodeStoreTest, AStoppedSnapshotEndsCancelled) {
  write("a.py", "a");
  write("b.py", "b");
  std::stop_source stop;
  SnapshotControl control;
  control.stop = stop.get_token();
  control.after_copy = [&](const std::string&) { stop.request_stop(); };
  auto r = store_->snapshot("doc", src_, control);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ECANCELED);
  EXPECT_TRUE(store_->versions("doc").empty());
}

TEST_F(CodeStoreTest, CheckSaysWhatASnapshotWouldRefuse) {
  write("app.py", "x");
  write("lib/util.py", "y");
  write("__pycache__/app.pyc", "skipped");
  auto n = CodeStore::check(src_);
  ASSERT_TRUE(n.ok()) << n.error().reason;
  EXPECT_EQ(*n, 2u);
  EXPECT_FALSE(fs::exists(objects() + "/x")) << "check copies nothing";
  EXPECT_EQ(count(objects()), 0u);

  ASSERT_EQ(mkfifo((src_ + "/pipe").c_str(), 0600), 0);
  auto r = CodeStore::check(src_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find(src_ + "/pipe"), std::string::npos) << r.error().reason;
  fs::remove(src_ + "/pipe");

  fs::create_symlink("/etc/hostname", src_ + "/leak");
  r = CodeStore::check(src_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find("outside"), std::string::npos) << r.error().reason;
  fs::remove(src_ + "/leak");

  if (geteuid() != 0) {  // root reads anything
    ASSERT_EQ(chmod((src_ + "/lib/util.py").c_str(), 0), 0);
    r = CodeStore::check(src_);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, EACCES);
    EXPECT_NE(r.error().reason.find(src_ + "/lib/util.py"), std::string::npos) << r.error().reason;
  }
}

TEST_F(CodeStoreTest, FindByFullVersionAndPrefix) {
  write("app.py", "v = 1\n");
  CodeSet v1 = snap();
  write("app.py", "v = 2\n");
  CodeSet v2 = snap();

  auto full = store_->find("doc", v1.version, false);
  ASSERT_TRUE(full.ok()) << full.error().reason;
  EXPECT_EQ(full->version, v1.version);
  EXPECT_EQ(full->dir, v1.dir);
  EXPECT_EQ(full->files, v1.files);
  auto prefix = store_->find("doc", v1.version.substr(0, 8), false);
  ASSERT_TRUE(prefix.ok()) << prefix.error().reason;
  EXPECT_EQ(prefix->version, v1.version);
  // Upper case is the same hex.
  std::string upper = v1.version.substr(0, 10);
  for (auto& c : upper) c = static_cast<char>(toupper(c));
  EXPECT_TRUE(store_->find("doc", upper, false).ok());
  // Without make_current the history is unchanged; with it, a rollback appends.
  EXPECT_EQ(store_->versions("doc").front(), v2.version);
  ASSERT_TRUE(store_->find("doc", v1.short_version(), true).ok());
  EXPECT_EQ(store_->versions("doc"), (std::vector<std::string>{v1.version, v2.version}));
  EXPECT_EQ(slurp(kind_dir() + "/history"),
            v1.version + "\n" + v2.version + "\n" + v1.version + "\n");
}

TEST_F(CodeStoreTest, FindRefusesShortUnknownAndAmbiguous) {
  write("app.py", "v = 1\n");
  CodeSet v1 = snap();

  auto r = store_->find("doc", v1.version.substr(0, 7), false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EINVAL);
  EXPECT_NE(r.error().reason.find("too short"), std::string::npos) << r.error().reason;

  r = store_->find("doc", "not-hex-at-all", false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EINVAL);

  r = store_->find("doc", std::string(64, '0'), false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ENOENT);
  EXPECT_NE(r.error().reason.find("no kept version"), std::string::npos) << r.error().reason;
  r = store_->find("other", v1.version, false);  // another kind's versions are not its own
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ENOENT);

  // Two versions with the same first 8 digits: make one by hand (a copy of v1 under a name
  // sharing its prefix, with a manifest that does not match: only the prefix matters here).
  std::string twin = v1.version.substr(0, 8) + std::string(56, v1.version[8] == '0' ? '1' : '0');
  fs::create_directory(kind_dir() + "/" + twin);
  r = store_->find("doc", v1.version.substr(0, 8), false);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, EINVAL);
  EXPECT_NE(r.error().reason.find("ambiguous"), std::string::npos) << r.error().reason;
  EXPECT_NE(r.error().reason.find(v1.version.substr(0, 12)), std::string::npos);
  // A longer prefix settles it.
  auto ok = store_->find("doc", v1.version.substr(0, 9), false);
  ASSERT_TRUE(ok.ok()) << ok.error().reason;
  EXPECT_EQ(ok->version, v1.version);
  // The twin has no manifest: finding it is an error naming the manifest, not a crash.
  r = store_->find("doc", twin, false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().reason.find(twin + ".json"), std::string::npos) << r.error().reason;
}

TEST_F(CodeStoreTest, CollectKeepsTheNewestAndInUse) {
  std::vector<CodeSet> sets;
  write("shared.txt", "shared");
  for (int i = 0; i < 8; ++i) {
    write("app.py", "v = " + std::to_string(i) + "\n");
    sets.push_back(snap());
  }
  EXPECT_EQ(count(kind_dir(), true), 8u);
  EXPECT_EQ(count(objects()), 9u);
  // Keep 3 newest, and v1 which a worker still runs.
  ASSERT_TRUE(store_->collect("doc", 3, {sets[1].version}).ok());
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(kind_dir()))
    if (e.is_directory()) left.insert(e.path().filename());
  EXPECT_EQ(left, (std::set<std::string>{sets[1].version, sets[5].version, sets[6].version,
                                         sets[7].version}));
  for (int i : {0, 2, 3, 4}) {
    EXPECT_FALSE(fs::exists(sets[i].dir + ".json")) << i;
  }
  EXPECT_TRUE(fs::exists(sets[1].dir + ".json"));
  // Objects: shared + the 4 kept app.py contents; the removed versions' contents are gone.
  EXPECT_EQ(count(objects()), 5u);
  for (int i : {0, 2, 3, 4})
    EXPECT_FALSE(fs::exists(objects() + "/" + sets[i].files[0].digest)) << i;
  EXPECT_EQ(slurp(sets[7].dir + "/app.py"), "v = 7\n");
  // The history is trimmed to what is kept, in order.
  EXPECT_EQ(store_->versions("doc"), (std::vector<std::string>{sets[7].version, sets[6].version,
                                                               sets[5].version, sets[1].version}));
  // The rollback target still works.
  EXPECT_TRUE(store_->find("doc", sets[1].version, true).ok());
  // Once nothing runs it (and it is not among the newest), it goes too.
  ASSERT_TRUE(store_->collect("doc", 1, {}).ok());
  EXPECT_EQ(store_->versions("doc"), std::vector<std::string>{sets[1].version});
  EXPECT_EQ(count(kind_dir(), true), 1u);
  EXPECT_EQ(count(objects()), 2u);
}

TEST_F(CodeStoreTest, CollectLeavesOtherKindsAlone) {
  write("app.py", "same\n");
  CodeSet doc = snap("doc");
  CodeSet room = snap("room");
  EXPECT_EQ(doc.version, room.version);
  EXPECT_EQ(count(objects()), 1u);  // shared across kinds too
  write("app.py", "new\n");
  snap("doc");
  ASSERT_TRUE(store_->collect("doc", 1, {}).ok());
  EXPECT_FALSE(fs::exists(doc.dir));
  EXPECT_TRUE(fs::exists(room.dir + "/app.py"));
  EXPECT_EQ(count(objects()), 2u);
}

TEST_F(CodeStoreTest, CollectRemovesLeftoverTemps) {
  write("app.py", "x");
  snap();
  fs::create_directories(kind_dir() + "/.tmp-abc123/sub");
  std::ofstream(objects() + "/.tmp-xyz") << "partial";
  ASSERT_TRUE(store_->collect("doc", kKeepVersions, {}).ok());
  EXPECT_FALSE(fs::exists(kind_dir() + "/.tmp-abc123"));
  EXPECT_FALSE(fs::exists(objects() + "/.tmp-xyz"));
  EXPECT_EQ(count(objects()), 1u);
}

// The acceptance point: 1,000 rollouts leave no growth beyond the kept versions.
TEST_F(CodeStoreTest, ThousandSnapshotsLeaveOnlyTheKept) {
  write("lib/static.py", "static = 1\n");
  std::vector<std::string> recent;
  for (int i = 0; i < 1000; ++i) {
    write("app.py", std::to_string(i));
    if (i % 7 == 0) write("lib/sometimes.py", std::to_string(i / 7));
    CodeSet set = snap();
    ASSERT_FALSE(set.version.empty()) << i;
    recent.push_back(set.version);
    ASSERT_TRUE(store_->collect("doc", kKeepVersions, {}).ok()) << i;
    ASSERT_LE(count(kind_dir(), true), kKeepVersions) << i;
  }
  std::vector<std::string> newest(recent.rbegin(), recent.rbegin() + kKeepVersions);
  EXPECT_EQ(store_->versions("doc"), newest);
  // versions/doc: the 5 trees, their 5 manifests and the history.
  EXPECT_EQ(count(kind_dir()), 2 * kKeepVersions + 1);
  // objects/: exactly what the kept versions link.
  std::set<std::string> linked;
  for (const auto& v : newest) {
    auto set = store_->find("doc", v, false);
    ASSERT_TRUE(set.ok()) << set.error().reason;
    for (const auto& f : set->files) linked.insert(f.digest);
  }
  std::set<std::string> stored;
  for (const auto& e : fs::directory_iterator(objects())) stored.insert(e.path().filename());
  EXPECT_EQ(stored, linked);
  // The history holds only the kept versions.
  std::string history = slurp(kind_dir() + "/history");
  EXPECT_EQ(static_cast<size_t>(std::count(history.begin(), history.end(), '\n')), kKeepVersions);
}

}  // namespace
}  // namespace corral::workers
