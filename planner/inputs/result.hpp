// Error values for the planner library: library code returns them, only the CLI prints them and
// picks the exit code (2 for bad input).
#pragma once
#include <string>
#include <utility>
#include <variant>

namespace np {

struct Error {
  std::string message;  // one line: what is wrong and what the valid choices are
};

// A small std::expected stand-in (C++20): either a value or an Error.
template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}
  Result(Error error) : v_(std::move(error)) {}
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() { return std::get<0>(v_); }
  const T& value() const { return std::get<0>(v_); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

inline Error make_error(std::string message) {
  return Error{std::move(message)};
}

}  // namespace np
