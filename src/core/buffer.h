// Buffer: a growable byte buffer with a read and a write position, used for a connection's input
// and output. Storage is kept across requests (consume() moves the read position; compact() slides
// the unread bytes to the front), so a keep-alive connection allocates only when it first grows.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

namespace corral::core {

class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { std::free(data_); }

  const char* data() const { return data_ + rpos_; }
  char* mutable_data() { return data_ + rpos_; }
  size_t size() const { return wpos_ - rpos_; }
  bool empty() const { return wpos_ == rpos_; }
  size_t capacity() const { return cap_; }
  std::string_view view() const { return {data(), size()}; }

  // Space for at least n more bytes at write_ptr().
  char* reserve(size_t n) {
    if (cap_ - wpos_ < n) grow(n);
    return data_ + wpos_;
  }
  char* write_ptr() { return data_ + wpos_; }
  size_t writable() const { return cap_ - wpos_; }
  void commit(size_t n) { wpos_ += n; }

  void append(std::string_view s) {
    if (s.empty()) return;  // memcpy with a null pointer is undefined even for 0 bytes
    std::memcpy(reserve(s.size()), s.data(), s.size());
    wpos_ += s.size();
  }
  void append(char c) {
    *reserve(1) = c;
    ++wpos_;
  }

  void consume(size_t n) {
    rpos_ += n;
    if (rpos_ == wpos_) rpos_ = wpos_ = 0;
  }
  void clear() { rpos_ = wpos_ = 0; }
  // Frees the storage (for idle connections holding a large buffer).
  void release() {
    std::free(data_);
    data_ = nullptr;
    cap_ = rpos_ = wpos_ = 0;
  }

 private:
  void grow(size_t n) {
    if (rpos_ > 0) {  // slide first: often enough without a realloc
      std::memmove(data_, data_ + rpos_, wpos_ - rpos_);
      wpos_ -= rpos_;
      rpos_ = 0;
      if (cap_ - wpos_ >= n) return;
    }
    size_t cap = cap_ ? cap_ : 4096;
    while (cap - wpos_ < n) cap *= 2;
    char* p = static_cast<char*>(std::realloc(data_, cap));
    if (!p) throw std::bad_alloc();
    data_ = p;
    cap_ = cap;
  }

  char* data_ = nullptr;
  size_t cap_ = 0;
  size_t rpos_ = 0;
  size_t wpos_ = 0;
};

}  // namespace corral::core
