#include "http/file_response.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "http/http_date.h"
#include "http/mime.h"

namespace corral::http {
namespace {

constexpr time_t kMtime = 1700000000;  // Tue, 14 Nov 2023 22:13:20 GMT
constexpr long kMtimeNsec = 123456789;

std::string pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + i % 26);
  return s;
}

void write_file(const std::string& path, std::string_view data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  struct timespec times[2] = {{kMtime, kMtimeNsec}, {kMtime, kMtimeNsec}};
  ASSERT_EQ(::futimens(fd, times), 0);
  ::close(fd);
}

std::optional<std::string_view> find(const ResolvedFile& f, std::string_view name) {
  for (const auto& [n, v] : f.headers)
    if (iequals(n, name)) return std::string_view(v);
  return std::nullopt;
}

std::string read_range(int fd, uint64_t first, uint64_t length) {
  std::string out(length, '\0');
  size_t got = 0;
  while (got < length) {
    ssize_t r = ::pread(fd, out.data() + got, length - got, static_cast<off_t>(first + got));
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  out.resize(got);
  return out;
}

// The body exactly as the connection would send it.
std::string body_of(const ResolvedFile& f) {
  if (!f.fd) return {};
  if (!f.parts.empty()) {
    std::string body;
    for (const FilePart& p : f.parts) {
      body += p.head;
      body += read_range(f.fd.get(), p.range.first, p.range.length());
    }
    return body + f.tail;
  }
  if (f.ranges.size() == 1) return read_range(f.fd.get(), f.ranges[0].first, f.ranges[0].length());
  return read_range(f.fd.get(), 0, f.size);
}

class FileResponseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/corral_file_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    root_ = base_ + "/root";
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
    write_file(base_ + "/outside.txt", "secret outside the root\n");
    write_file(root_ + "/hello.txt", "Hello, world!\n");
    write_file(root_ + "/data.bin", data_);
    write_file(root_ + "/empty.txt", "");
    write_file(root_ + "/index.html", "<p>root</p>");
    ASSERT_EQ(::mkdir((root_ + "/docs").c_str(), 0755), 0);
    write_file(root_ + "/docs/index.html", "<h1>docs</h1>");
    write_file(root_ + "/docs/page.css", "body{}");
    ASSERT_EQ(::mkdir((root_ + "/noindex").c_str(), 0755), 0);
    ASSERT_EQ(::symlink("hello.txt", (root_ + "/link_inside").c_str()), 0);
    ASSERT_EQ(::symlink("../hello.txt", (root_ + "/docs/link_up_inside").c_str()), 0);
    ASSERT_EQ(::symlink((root_ + "/hello.txt").c_str(), (root_ + "/abs_inside").c_str()), 0);
    ASSERT_EQ(::symlink("/etc/passwd", (root_ + "/passwd").c_str()), 0);
    ASSERT_EQ(::symlink("..", (root_ + "/up").c_str()), 0);
    ASSERT_EQ(::symlink("../outside.txt", (root_ + "/outside_link").c_str()), 0);
    ASSERT_EQ(::mkfifo((root_ + "/fifo").c_str(), 0644), 0);
    write_file(root_ + "/locked.txt", "no");
    ASSERT_EQ(::chmod((root_ + "/locked.txt").c_str(), 0), 0);
  }

  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(base_, ec);
    EXPECT_FALSE(ec) << ec.message();
  }

  ResolvedFile get(std::string path, Method method = Method::kGet) {
    req_.method = method;
    FileSpec spec;
    spec.root = root_;
    spec.path = std::move(path);
    return resolve_file(req_, spec);
  }

  ResolvedFile get_spec(const FileSpec& spec) { return resolve_file(req_, spec); }

  std::string base_, root_;
  std::string data_ = pattern(1000);
  Request req_;
};

TEST_F(FileResponseTest, ServesAFileWithValidators) {
  ResolvedFile f = get("hello.txt");
  EXPECT_EQ(f.status, 200);
  ASSERT_TRUE(f.fd);
  EXPECT_EQ(f.size, 14u);
  EXPECT_EQ(f.content_length, 14u);
  EXPECT_EQ(f.content_type, "text/plain; charset=utf-8");
  EXPECT_TRUE(f.ranges.empty());
  EXPECT_TRUE(f.parts.empty());
  EXPECT_EQ(body_of(f), "Hello, world!\n");
  EXPECT_EQ(find(f, "ETag"), file_etag(14, kMtime, kMtimeNsec));
  EXPECT_EQ(find(f, "ETag"), "\"e-17979cfe3d85cd15\"");
  EXPECT_EQ(find(f, "Last-Modified"), "Tue, 14 Nov 2023 22:13:20 GMT");
  EXPECT_EQ(find(f, "Accept-Ranges"), "bytes");
  EXPECT_FALSE(find(f, "Cache-Control"));
  EXPECT_FALSE(find(f, "Content-Disposition"));
  EXPECT_FALSE(find(f, "Content-Range"));
  // The fd is read-only and close-on-exec.
  int flags = ::fcntl(f.fd.get(), F_GETFL);
  EXPECT_EQ(flags & O_ACCMODE, O_RDONLY);
  EXPECT_TRUE(::fcntl(f.fd.get(), F_GETFD) & FD_CLOEXEC);
}

TEST_F(FileResponseTest, FileEtagFormat) {
  EXPECT_EQ(file_etag(0x10, 1, 2), "\"10-3b9aca02\"");
  EXPECT_EQ(file_etag(0, 0, 0), "\"0-0\"");
}

TEST_F(FileResponseTest, LeadingSlashesAreStripped) {
  EXPECT_EQ(get("/hello.txt").status, 200);
  EXPECT_EQ(get("//docs/page.css").status, 200);
  EXPECT_EQ(get("/docs/page.css").content_type, "text/css; charset=utf-8");
}

TEST_F(FileResponseTest, EmptyFile) {
  ResolvedFile f = get("empty.txt");
  EXPECT_EQ(f.status, 200);
  EXPECT_EQ(f.content_length, 0u);
  req_.headers.add("Range", "bytes=0-");
  ResolvedFile r = get("empty.txt");
  EXPECT_EQ(r.status, 416);
  EXPECT_EQ(find(r, "Content-Range"), "bytes */0");
}

TEST_F(FileResponseTest, Missing) {
  EXPECT_EQ(get("nope.txt").status, 404);
  EXPECT_EQ(get("hello.txt/x").status, 404);  // ENOTDIR
  EXPECT_FALSE(get("nope.txt").fd);
  FileSpec spec;
  spec.root = base_ + "/no-such-root";
  spec.path = "hello.txt";
  EXPECT_EQ(get_spec(spec).status, 404);
}

TEST_F(FileResponseTest, TraversalNeverLeavesTheRoot) {
  for (std::string p : {"../outside.txt", "/../outside.txt", "docs/../../outside.txt",
                        "up/outside.txt", "up/root/hello.txt", "outside_link", "passwd",
                        "abs_inside", "../../../../../../etc/passwd", "/etc/passwd/../passwd"}) {
    ResolvedFile f = get(p);
    EXPECT_EQ(f.status, 404) << p;
    EXPECT_FALSE(f.fd) << p;
  }
}

TEST_F(FileResponseTest, SymlinksInsideTheRootAreFollowed) {
  ResolvedFile f = get("link_inside");
  EXPECT_EQ(f.status, 200);
  EXPECT_EQ(body_of(f), "Hello, world!\n");
  // The type comes from the requested name, not the link target.
  EXPECT_EQ(f.content_type, kDefaultMimeType);
  EXPECT_EQ(body_of(get("docs/link_up_inside")), "Hello, world!\n");
  EXPECT_EQ(body_of(get("docs/../hello.txt")), "Hello, world!\n");
}

TEST_F(FileResponseTest, NulInPathIsRefused) {
  EXPECT_EQ(get(std::string("hello.txt\0.png", 14)).status, 404);
  EXPECT_EQ(get(std::string("\0", 1)).status, 404);
}

TEST_F(FileResponseTest, SpecialFilesAreRefused) {
  ResolvedFile f = get("fifo");  // must not block waiting for a writer
  EXPECT_EQ(f.status, 404);
  EXPECT_FALSE(f.fd);
}

TEST_F(FileResponseTest, PermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads any file";
  EXPECT_EQ(get("locked.txt").status, 403);
}

TEST_F(FileResponseTest, DirectoryIndex) {
  ResolvedFile f = get("docs/");
  EXPECT_EQ(f.status, 200);
  EXPECT_EQ(f.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(body_of(f), "<h1>docs</h1>");
  EXPECT_EQ(body_of(get("")), "<p>root</p>");
  EXPECT_EQ(body_of(get("/")), "<p>root</p>");
  EXPECT_EQ(get("noindex/").status, 404);

  FileSpec spec;
  spec.root = root_;
  spec.path = "docs/";
  spec.directory_index = false;
  EXPECT_EQ(get_spec(spec).status, 404);
}

TEST_F(FileResponseTest, DirectoryWithoutSlashRedirects) {
  req_.path = "/static/docs";
  req_.query = "a=1";
  ResolvedFile f = get("docs");
  EXPECT_EQ(f.status, 301);
  EXPECT_EQ(f.location, "/static/docs/?a=1");
  EXPECT_FALSE(f.fd);
  EXPECT_EQ(f.content_length, 0u);

  req_.query = "";
  EXPECT_EQ(get("docs").location, "/static/docs/");
  // Never a redirect to another host.
  req_.path = "//evil.example/docs";
  EXPECT_EQ(get("docs").status, 200);
  req_.path = "/\\evil.example/docs";
  EXPECT_EQ(get("docs").status, 200);
  // A request path that already ends with '/' is served.
  req_.path = "/static/docs/";
  EXPECT_EQ(get("docs").status, 200);
  // No index, no redirect.
  req_.path = "/static/noindex";
  EXPECT_EQ(get("noindex").status, 404);
}

TEST_F(FileResponseTest, WithoutRootThePathIsOpenedAsGiven) {
  FileSpec spec;
  spec.path = base_ + "/outside.txt";
  ResolvedFile f = get_spec(spec);
  EXPECT_EQ(f.status, 200);
  EXPECT_EQ(body_of(f), "secret outside the root\n");
  spec.path = root_ + "/docs";
  req_.path = "/docs/";
  EXPECT_EQ(body_of(get_spec(spec)), "<h1>docs</h1>");
  spec.path = base_ + "/nope";
  EXPECT_EQ(get_spec(spec).status, 404);
  spec.path = "";
  EXPECT_EQ(get_spec(spec).status, 404);
}

TEST_F(FileResponseTest, SpecOverrides) {
  FileSpec spec;
  spec.root = root_;
  spec.path = "data.bin";
  spec.content_type = "application/x-custom";
  spec.max_age = 3600;
  spec.download_name = "report.bin";
  ResolvedFile f = get_spec(spec);
  EXPECT_EQ(f.content_type, "application/x-custom");
  EXPECT_EQ(find(f, "Cache-Control"), "max-age=3600");
  EXPECT_EQ(find(f, "Content-Disposition"),
            "attachment; filename=\"report.bin\"; filename*=UTF-8''report.bin");
}

TEST_F(FileResponseTest, IfNoneMatch) {
  std::string etag = file_etag(14, kMtime, kMtimeNsec);
  for (std::string v :
       {etag, "W/" + etag, "\"other\", " + etag, "\"a\",W/" + etag + " ,\"b\"", std::string("*")}) {
    req_.headers.clear();
    req_.headers.add("If-None-Match", v);
    ResolvedFile f = get("hello.txt");
    EXPECT_EQ(f.status, 304) << v;
    EXPECT_FALSE(f.fd);
    EXPECT_EQ(f.content_length, 0u);
    EXPECT_EQ(f.content_type, "");
    EXPECT_EQ(find(f, "ETag"), etag);
    EXPECT_EQ(find(f, "Last-Modified"), "Tue, 14 Nov 2023 22:13:20 GMT");
    EXPECT_EQ(get("hello.txt", Method::kHead).status, 304);
  }
  req_.headers.clear();
  req_.headers.add("If-None-Match", "\"other\"");
  req_.headers.add("If-None-Match", etag);  // a second field line counts too
  EXPECT_EQ(get("hello.txt").status, 304);

  req_.headers.clear();
  req_.headers.add("If-None-Match", "\"other\"");
  // A mismatching If-None-Match wins over a matching If-Modified-Since.
  req_.headers.add("If-Modified-Since", "Tue, 14 Nov 2023 22:13:20 GMT");
  ResolvedFile f = get("hello.txt");
  EXPECT_EQ(f.status, 200);
  EXPECT_TRUE(f.fd);

  // Other methods: 412.
  req_.headers.clear();
  req_.headers.add("If-None-Match", etag);
  EXPECT_EQ(get("hello.txt", Method::kPost).status, 412);
}

TEST_F(FileResponseTest, NotModifiedCarriesCacheControl) {
  FileSpec spec;
  spec.root = root_;
  spec.path = "hello.txt";
  spec.max_age = 60;
  req_.headers.add("If-None-Match", "*");
  ResolvedFile f = get_spec(spec);
  EXPECT_EQ(f.status, 304);
  EXPECT_EQ(find(f, "Cache-Control"), "max-age=60");
}

TEST_F(FileResponseTest, IfModifiedSince) {
  req_.headers.add("If-Modified-Since", "Tue, 14 Nov 2023 22:13:20 GMT");
  EXPECT_EQ(get("hello.txt").status, 304);
  req_.headers.clear();
  req_.headers.add("If-Modified-Since", "Wed, 15 Nov 2023 00:00:00 GMT");
  EXPECT_EQ(get("hello.txt").status, 304);
  req_.headers.clear();
  req_.headers.add("If-Modified-Since", "Tue, 14 Nov 2023 22:13:19 GMT");
  EXPECT_EQ(get("hello.txt").status, 200);
  req_.headers.clear();
  req_.headers.add("If-Modified-Since", "garbage");
  EXPECT_EQ(get("hello.txt").status, 200);
  // Only for GET and HEAD.
  req_.headers.clear();
  req_.headers.add("If-Modified-Since", "Wed, 15 Nov 2023 00:00:00 GMT");
  EXPECT_EQ(get("hello.txt", Method::kPost).status, 200);
}

TEST_F(FileResponseTest, IfMatchAndIfUnmodifiedSince) {
  // Headers are views: the strings they point into must outlive the request.
  std::string etag = file_etag(14, kMtime, kMtimeNsec), weak = "W/" + etag;
  req_.headers.add("If-Match", "\"nope\"");
  EXPECT_EQ(get("hello.txt").status, 412);
  req_.headers.clear();
  req_.headers.add("If-Match", weak);  // strong comparison
  EXPECT_EQ(get("hello.txt").status, 412);
  req_.headers.clear();
  req_.headers.add("If-Match", etag);
  req_.headers.add("If-Unmodified-Since", "Mon, 01 Jan 2001 00:00:00 GMT");  // ignored
  EXPECT_EQ(get("hello.txt").status, 200);
  req_.headers.clear();
  req_.headers.add("If-Match", "*");
  EXPECT_EQ(get("hello.txt").status, 200);
  req_.headers.clear();
  req_.headers.add("If-Unmodified-Since", "Mon, 01 Jan 2001 00:00:00 GMT");
  EXPECT_EQ(get("hello.txt").status, 412);
  req_.headers.clear();
  req_.headers.add("If-Unmodified-Since", "Tue, 14 Nov 2023 22:13:20 GMT");
  EXPECT_EQ(get("hello.txt").status, 200);
}

TEST_F(FileResponseTest, SingleRange) {
  req_.headers.add("Range", "bytes=10-19");
  ResolvedFile f = get("data.bin");
  EXPECT_EQ(f.status, 206);
  ASSERT_EQ(f.ranges.size(), 1u);
  EXPECT_TRUE(f.parts.empty());
  EXPECT_EQ(f.content_length, 10u);
  EXPECT_EQ(f.content_type, kDefaultMimeType);
  EXPECT_EQ(find(f, "Content-Range"), "bytes 10-19/1000");
  EXPECT_EQ(body_of(f), data_.substr(10, 10));

  req_.headers.clear();
  req_.headers.add("Range", "bytes=-5");
  f = get("data.bin");
  EXPECT_EQ(find(f, "Content-Range"), "bytes 995-999/1000");
  EXPECT_EQ(body_of(f), data_.substr(995));

  // Overlapping ranges coalesce into a single part.
  req_.headers.clear();
  req_.headers.add("Range", "bytes=0-99,50-149");
  f = get("data.bin");
  EXPECT_EQ(f.status, 206);
  EXPECT_EQ(find(f, "Content-Range"), "bytes 0-149/1000");
  EXPECT_EQ(body_of(f), data_.substr(0, 150));
}

TEST_F(FileResponseTest, HeadGetsTheSameHeadWithoutAnFd) {
  req_.headers.add("Range", "bytes=10-19");
  ResolvedFile f = get("data.bin", Method::kHead);
  EXPECT_EQ(f.status, 206);
  EXPECT_EQ(f.content_length, 10u);
  EXPECT_EQ(find(f, "Content-Range"), "bytes 10-19/1000");
  EXPECT_FALSE(f.fd);
  req_.headers.clear();
  f = get("data.bin", Method::kHead);
  EXPECT_EQ(f.status, 200);
  EXPECT_EQ(f.content_length, 1000u);
  EXPECT_FALSE(f.fd);
}

TEST_F(FileResponseTest, RangeOnlyForGetAndHead) {
  req_.headers.add("Range", "bytes=10-19");
  ResolvedFile f = get("data.bin", Method::kPost);
  EXPECT_EQ(f.status, 200);
  EXPECT_EQ(f.content_length, 1000u);
}

TEST_F(FileResponseTest, InvalidRangeServesWhole) {
  req_.headers.add("Range", "bytes=19-10");
  ResolvedFile f = get("data.bin");
  EXPECT_EQ(f.status, 200);
  EXPECT_EQ(body_of(f), data_);
}

TEST_F(FileResponseTest, Multipart) {
  req_.headers.add("Range", "bytes=0-4, 100-109, -3");
  ResolvedFile f = get("data.bin");
  EXPECT_EQ(f.status, 206);
  ASSERT_EQ(f.parts.size(), 3u);
  ASSERT_EQ(f.ranges.size(), 3u);
  EXPECT_FALSE(find(f, "Content-Range"));
  const std::string prefix = "multipart/byteranges; boundary=";
  ASSERT_TRUE(f.content_type.starts_with(prefix));
  std::string boundary = f.content_type.substr(prefix.size());
  EXPECT_GE(boundary.size(), 16u);
  EXPECT_EQ(boundary.find_first_not_of("0123456789abcdef"), std::string::npos);

  std::string expected;
  auto part = [&](std::string_view range, std::string_view bytes) {
    expected += "\r\n--" + boundary + "\r\nContent-Type: application/octet-stream\r\n" +
                "Content-Range: bytes " + std::string(range) + "/1000\r\n\r\n" + std::string(bytes);
  };
  part("0-4", data_.substr(0, 5));
  part("100-109", data_.substr(100, 10));
  part("997-999", data_.substr(997));
  expected += "\r\n--" + boundary + "--\r\n";

  std::string body = body_of(f);
  EXPECT_EQ(body, expected);
  EXPECT_EQ(f.content_length, body.size());
  EXPECT_EQ(f.tail, "\r\n--" + boundary + "--\r\n");

  // Each response gets its own boundary.
  ResolvedFile g = get("data.bin");
  EXPECT_NE(g.content_type, f.content_type);
  EXPECT_EQ(g.content_length, f.content_length);
}

TEST_F(FileResponseTest, MultipartUsesTheFileType) {
  req_.headers.add("Range", "bytes=0-1,5-6");
  ResolvedFile f = get("hello.txt");
  ASSERT_EQ(f.parts.size(), 2u);
  EXPECT_NE(f.parts[0].head.find("Content-Type: text/plain; charset=utf-8\r\n"), std::string::npos);
  EXPECT_EQ(body_of(f).size(), f.content_length);
}

TEST_F(FileResponseTest, Unsatisfiable) {
  req_.headers.add("Range", "bytes=1000-");
  ResolvedFile f = get("data.bin");
  EXPECT_EQ(f.status, 416);
  EXPECT_EQ(find(f, "Content-Range"), "bytes */1000");
  EXPECT_FALSE(f.fd);
  EXPECT_EQ(f.content_length, 0u);
  EXPECT_EQ(f.content_type, "");
}

TEST_F(FileResponseTest, IfRange) {
  std::string etag = file_etag(1000, kMtime, kMtimeNsec), weak = "W/" + etag;
  req_.headers.add("Range", "bytes=0-9");
  req_.headers.add("If-Range", etag);
  EXPECT_EQ(get("data.bin").status, 206);

  req_.headers.clear();
  req_.headers.add("Range", "bytes=0-9");
  req_.headers.add("If-Range", "\"stale\"");
  ResolvedFile f = get("data.bin");
  EXPECT_EQ(f.status, 200);
  EXPECT_EQ(f.content_length, 1000u);

  req_.headers.clear();
  req_.headers.add("Range", "bytes=0-9");
  req_.headers.add("If-Range", weak);
  EXPECT_EQ(get("data.bin").status, 200);

  req_.headers.clear();
  req_.headers.add("Range", "bytes=0-9");
  req_.headers.add("If-Range", "Tue, 14 Nov 2023 22:13:20 GMT");
  EXPECT_EQ(get("data.bin").status, 206);

  req_.headers.clear();
  req_.headers.add("Range", "bytes=0-9");
  req_.headers.add("If-Range", "Tue, 14 Nov 2023 22:13:21 GMT");
  EXPECT_EQ(get("data.bin").status, 200);

  // A stale If-Range also turns a would-be 416 into a 200.
  req_.headers.clear();
  req_.headers.add("Range", "bytes=5000-");
  req_.headers.add("If-Range", "\"stale\"");
  EXPECT_EQ(get("data.bin").status, 200);
}

TEST(ContentDisposition, EncodesNonAsciiAndQuotes) {
  EXPECT_EQ(content_disposition_attachment("r\xC3\xA9sum\xC3\xA9 \"x\".pdf"),
            "attachment; filename=\"r_sum_ _x_.pdf\"; "
            "filename*=UTF-8''r%C3%A9sum%C3%A9%20%22x%22.pdf");
  EXPECT_EQ(content_disposition_attachment("plain-name_1.txt"),
            "attachment; filename=\"plain-name_1.txt\"; filename*=UTF-8''plain-name_1.txt");
  EXPECT_EQ(content_disposition_attachment("a\\b"),
            "attachment; filename=\"a_b\"; filename*=UTF-8''a%5Cb");
  // A four-byte character is one '_'.
  EXPECT_EQ(content_disposition_attachment("\xF0\x9F\x98\x80.png"),
            "attachment; filename=\"_.png\"; filename*=UTF-8''%F0%9F%98%80.png");
}

TEST(ContentDisposition, NoHeaderInjection) {
  std::string v = content_disposition_attachment(std::string("a\r\nSet-Cookie: x\0y", 18));
  EXPECT_EQ(v.find_first_of(std::string("\r\n\0", 3)), std::string::npos) << v;
  EXPECT_EQ(v,
            "attachment; filename=\"a__Set-Cookie: x_y\"; "
            "filename*=UTF-8''a%0D%0ASet-Cookie%3A%20x%00y");
}

TEST_F(FileResponseTest, OpenBeneathWalkFallback) {
  core::UniqueFd root(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(root);
  auto open_walk = [&](std::string_view rel) {
    return file_detail::open_beneath_walk(root.get(), rel, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  };
  for (std::string_view ok : {"hello.txt", "docs/index.html", "./docs//index.html", "", "docs"}) {
    int fd = open_walk(ok);
    EXPECT_GE(fd, 0) << ok;
    if (fd >= 0) ::close(fd);
  }
  EXPECT_EQ(open_walk("nope"), -ENOENT);
  EXPECT_EQ(open_walk("../outside.txt"), -EXDEV);
  EXPECT_EQ(open_walk("docs/../hello.txt"), -EXDEV);  // stricter than openat2: no ".." at all
  EXPECT_EQ(open_walk("link_inside"), -ELOOP);        // and no symlinks
  EXPECT_EQ(open_walk("passwd"), -ELOOP);
  EXPECT_EQ(open_walk("up/outside.txt"), -ENOTDIR);
  EXPECT_EQ(open_walk(std::string_view("a\0b", 3)), -ENOENT);
}

TEST_F(FileResponseTest, DotfilesAre404UnlessAllowed) {
  ASSERT_EQ(::mkdir((root_ + "/.git").c_str(), 0755), 0);
  write_file(root_ + "/.git/config", "[core]");
  write_file(root_ + "/.env", "SECRET=1");
  write_file(root_ + "/docs/.htpasswd", "admin:x");
  ASSERT_EQ(::mkdir((root_ + "/.well-known").c_str(), 0755), 0);
  write_file(root_ + "/.well-known/security.txt", "Contact: x");
  write_file(root_ + "/.well-known/.secret", "x");
  for (std::string p : {".env", "/.env", ".git/config", ".git", ".git/", "docs/.htpasswd", "//.env",
                        ".well-known/.secret", "docs/.well-known/x"}) {
    ResolvedFile f = get(p);
    EXPECT_EQ(f.status, 404) << p;
    EXPECT_FALSE(f.fd) << p;
  }
  EXPECT_EQ(body_of(get(".well-known/security.txt")), "Contact: x");
  EXPECT_EQ(body_of(get("/.well-known/security.txt")), "Contact: x");
  EXPECT_EQ(body_of(get("docs/../hello.txt")), "Hello, world!\n");  // not a dotfile

  FileSpec spec;
  spec.root = root_;
  spec.dotfiles = true;
  spec.path = ".env";
  EXPECT_EQ(body_of(get_spec(spec)), "SECRET=1");
  spec.path = ".git/config";
  EXPECT_EQ(body_of(get_spec(spec)), "[core]");
  // Without a root the application chose the path: no rule.
  FileSpec abs;
  abs.path = root_ + "/.env";
  EXPECT_EQ(body_of(get_spec(abs)), "SECRET=1");
}

}  // namespace
}  // namespace corral::http
