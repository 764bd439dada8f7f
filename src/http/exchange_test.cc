#include "http/exchange.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace corral::http {
namespace {

// What a protocol sends, walking the cursor the way HTTP/1.1 does (text whole, ranges in pieces
// of at most `step` bytes), written as "text" or "@offset+length".
std::vector<std::string> walk(FileCursor& c, uint64_t step) {
  std::vector<std::string> out;
  while (c.active()) {
    FileSegment s = c.current();
    if (!s.text.empty()) {
      out.emplace_back(s.text);
      c.advance(s.text.size());
      continue;
    }
    uint64_t n = s.length < step ? s.length : step;
    out.push_back("@" + std::to_string(s.offset) + "+" + std::to_string(n));
    c.advance(n);
  }
  return out;
}

// The same pieces from file_segments(), split the same way.
std::vector<std::string> expected(const ResolvedFile& f, uint64_t step) {
  std::vector<std::string> out;
  for (const auto& s : file_segments(f)) {
    if (!s.text.empty()) {
      out.emplace_back(s.text);
      continue;
    }
    for (uint64_t off = 0; off < s.length; off += step) {
      uint64_t n = s.length - off < step ? s.length - off : step;
      out.push_back("@" + std::to_string(s.offset + off) + "+" + std::to_string(n));
    }
  }
  return out;
}

ResolvedFile file_of(uint64_t size) {
  ResolvedFile f;
  f.fd = core::UniqueFd(::dup(0));  // any open fd: file_segments() wants one
  f.size = size;
  f.content_length = size;
  return f;
}

TEST(FileCursor, WholeFile) {
  for (uint64_t step : {1u, 3u, 1000u}) {
    ResolvedFile f = file_of(10);
    auto want = expected(f, step);
    FileCursor c;
    c.start(std::move(f));
    EXPECT_EQ(walk(c, step), want);
    EXPECT_FALSE(c.active());
  }
}

TEST(FileCursor, OneRange) {
  ResolvedFile f = file_of(100);
  f.status = 206;
  f.ranges = {{10, 19}};
  f.content_length = 10;
  auto want = expected(f, 4);
  ASSERT_EQ(want, (std::vector<std::string>{"@10+4", "@14+4", "@18+2"}));
  FileCursor c;
  c.start(std::move(f));
  EXPECT_EQ(walk(c, 4), want);
}

TEST(FileCursor, MultipartPartsAndDelimiter) {
  ResolvedFile f = file_of(100);
  f.status = 206;
  f.ranges = {{0, 4}, {50, 59}};
  f.parts = {{"\r\n--B\r\nContent-Range: bytes 0-4/100\r\n\r\n", {0, 4}},
             {"\r\n--B\r\nContent-Range: bytes 50-59/100\r\n\r\n", {50, 59}}};
  f.tail = "\r\n--B--\r\n";
  f.content_length = 1;  // only its being non-zero matters here
  auto want = expected(f, 8);
  FileCursor c;
  c.start(std::move(f));
  EXPECT_EQ(walk(c, 8), want);
  EXPECT_EQ(want.back(), "\r\n--B--\r\n");
  EXPECT_EQ(want.size(), 6u);  // head, 5 bytes, head, 8 + 2 bytes, delimiter
}

TEST(FileCursor, TextTakenInPieces) {
  // A protocol may send only part of a text piece (a short write): current() is what is left.
  ResolvedFile f = file_of(10);
  f.parts = {{"HEAD", {0, 1}}};
  f.tail = "END";
  FileCursor c;
  c.start(std::move(f));
  EXPECT_EQ(c.current().text, "HEAD");
  c.advance(1);
  EXPECT_EQ(c.current().text, "EAD");
  c.advance(3);
  EXPECT_EQ(c.current().offset, 0u);
  EXPECT_EQ(c.current().length, 2u);
  c.advance(2);
  EXPECT_EQ(c.current().text, "END");
  c.advance(3);
  EXPECT_FALSE(c.active());
  c.clear();
  EXPECT_FALSE(c.file().fd.valid());
}

}  // namespace
}  // namespace corral::http
