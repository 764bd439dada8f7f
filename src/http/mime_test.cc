#include "http/mime.h"

#include <gtest/gtest.h>

namespace corral::http {
namespace {

TEST(Mime, CommonTypes) {
  EXPECT_EQ(mime_type_for("index.html"), "text/html; charset=utf-8");
  EXPECT_EQ(mime_type_for("a/b/page.htm"), "text/html; charset=utf-8");
  EXPECT_EQ(mime_type_for("style.css"), "text/css; charset=utf-8");
  EXPECT_EQ(mime_type_for("app.js"), "text/javascript; charset=utf-8");
  EXPECT_EQ(mime_type_for("mod.mjs"), "text/javascript; charset=utf-8");
  EXPECT_EQ(mime_type_for("data.json"), "application/json");
  EXPECT_EQ(mime_type_for("app.js.map"), "application/json");
  EXPECT_EQ(mime_type_for("notes.txt"), "text/plain; charset=utf-8");
  EXPECT_EQ(mime_type_for("README.md"), "text/markdown; charset=utf-8");
  EXPECT_EQ(mime_type_for("t.csv"), "text/csv; charset=utf-8");
  EXPECT_EQ(mime_type_for("feed.xml"), "application/xml");
  EXPECT_EQ(mime_type_for("logo.svg"), "image/svg+xml");
  EXPECT_EQ(mime_type_for("p.png"), "image/png");
  EXPECT_EQ(mime_type_for("p.jpg"), "image/jpeg");
  EXPECT_EQ(mime_type_for("p.jpeg"), "image/jpeg");
  EXPECT_EQ(mime_type_for("p.gif"), "image/gif");
  EXPECT_EQ(mime_type_for("p.webp"), "image/webp");
  EXPECT_EQ(mime_type_for("p.avif"), "image/avif");
  EXPECT_EQ(mime_type_for("favicon.ico"), "image/vnd.microsoft.icon");
  EXPECT_EQ(mime_type_for("f.woff"), "font/woff");
  EXPECT_EQ(mime_type_for("f.woff2"), "font/woff2");
  EXPECT_EQ(mime_type_for("f.ttf"), "font/ttf");
  EXPECT_EQ(mime_type_for("f.otf"), "font/otf");
  EXPECT_EQ(mime_type_for("m.wasm"), "application/wasm");
  EXPECT_EQ(mime_type_for("d.pdf"), "application/pdf");
  EXPECT_EQ(mime_type_for("a.zip"), "application/zip");
  EXPECT_EQ(mime_type_for("a.tar.gz"), "application/gzip");
  EXPECT_EQ(mime_type_for("a.tar"), "application/x-tar");
  EXPECT_EQ(mime_type_for("v.mp4"), "video/mp4");
  EXPECT_EQ(mime_type_for("v.webm"), "video/webm");
  EXPECT_EQ(mime_type_for("s.mp3"), "audio/mpeg");
  EXPECT_EQ(mime_type_for("s.ogg"), "audio/ogg");
  EXPECT_EQ(mime_type_for("s.wav"), "audio/wav");
  EXPECT_EQ(mime_type_for("site.webmanifest"), "application/manifest+json");
}

TEST(Mime, CaseInsensitive) {
  EXPECT_EQ(mime_type_for("INDEX.HTML"), "text/html; charset=utf-8");
  EXPECT_EQ(mime_type_for("Photo.JpG"), "image/jpeg");
}

TEST(Mime, DefaultsToOctetStream) {
  EXPECT_EQ(mime_type_for(""), kDefaultMimeType);
  EXPECT_EQ(mime_type_for("Makefile"), kDefaultMimeType);
  EXPECT_EQ(mime_type_for("name."), kDefaultMimeType);
  EXPECT_EQ(mime_type_for(".html"), kDefaultMimeType);  // a dotfile, not an extension
  EXPECT_EQ(mime_type_for("dir.html/file"), kDefaultMimeType);
  EXPECT_EQ(mime_type_for("x.unknownext"), kDefaultMimeType);
  EXPECT_EQ(mime_type_for("x.averyveryverylongextension"), kDefaultMimeType);
  EXPECT_EQ(mime_type_for("x.ht\xC3\xA9"), kDefaultMimeType);
}

TEST(Mime, ReturnsStaticStorage) {
  std::string path = "a.css";
  std::string_view t = mime_type_for(path);
  path.assign("overwritten");
  EXPECT_EQ(t, "text/css; charset=utf-8");
}

}  // namespace
}  // namespace corral::http
