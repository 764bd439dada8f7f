#include "core/buffer.h"

#include <gtest/gtest.h>

namespace corral::core {
namespace {

TEST(Buffer, AppendConsumeKeepsOrder) {
  Buffer b;
  b.append("hello ");
  b.append("world");
  EXPECT_EQ(b.view(), "hello world");
  b.consume(6);
  EXPECT_EQ(b.view(), "world");
  b.consume(5);
  EXPECT_TRUE(b.empty());
}

TEST(Buffer, GrowsBySlidingBeforeReallocating) {
  Buffer b;
  b.append(std::string(4000, 'a'));
  size_t cap = b.capacity();
  b.consume(3990);
  b.append(std::string(3000, 'b'));  // fits after sliding the 10 unread bytes to the front
  EXPECT_EQ(b.capacity(), cap);
  EXPECT_EQ(b.size(), 3010u);
  EXPECT_EQ(b.view().substr(0, 10), std::string(10, 'a'));
}

}  // namespace
}  // namespace corral::core
