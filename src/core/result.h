// Result<T>: a value or an error, for recoverable failures on the event loop (STYLE rule 3: no
// exceptions across the loop). An Error carries a stable code (errno-like or our own) and a static
// or owned reason; callers branch on the code and log the reason.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace corral::core {

struct Error {
  int code = 0;        // errno value, or a component-defined code
  std::string reason;  // human-readable, for logs; never sent to a client as is
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

Error errno_error(const char* what);  // Error{errno, "what: strerror(errno)"}

}  // namespace corral::core
