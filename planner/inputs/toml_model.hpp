// Internal: strict reading of nanoplan's TOML schemas (model catalog files, scenarios, the GPU
// catalog): typed keys, unknown keys refused, each error one line "file:line: key: problem, got
// value"; and a model from a parsed table of the catalog schema.
#pragma once
#include <toml++/toml.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "planner/inputs/result.hpp"
#include "planner/inputs/spec.hpp"
#include "planner/inputs/units.hpp"

namespace np {

// A TOML value for an error message: strings quoted and escaped, tables and lists by kind.
inline std::string shown(const toml::node& n) {
  if (auto v = n.value_exact<std::string>()) return quote_input(*v, '"');
  if (n.is_table()) return "a table";
  if (const toml::array* a = n.as_array())
    return a->empty() ? "[]" : "a list of " + std::to_string(a->size());
  std::ostringstream os;
  n.visit([&](const auto& x) { os << x; });
  return os.str();
}

// Reads typed keys from a TOML table, collecting the first error as "file:line: key: problem, got
// value". Keys the schema does not have are refused by `only`.
class TomlReader {
 public:
  TomlReader(const toml::table& t, std::string path, std::string prefix = "")
      : t_(t), path_(std::move(path)), prefix_(std::move(prefix)) {}

  bool has(std::string_view key) const { return t_.get(key) != nullptr; }
  int64_t integer(std::string_view key, std::optional<int64_t> fallback = std::nullopt) {
    const toml::node* n = t_.get(key);
    if (!n) return missing(key, fallback);
    if (auto v = n->value_exact<int64_t>()) return *v;
    wrong(*n, key, "expected an integer");
    return 0;
  }
  double number(std::string_view key, std::optional<double> fallback = std::nullopt) {
    const toml::node* n = t_.get(key);
    if (!n) return fallback ? *fallback : (missing(key, std::optional<int64_t>{}), 0.0);
    if (n->is_number()) return *n->value<double>();
    wrong(*n, key, "expected a number");
    return 0;
  }
  bool boolean(std::string_view key, bool fallback) {
    const toml::node* n = t_.get(key);
    if (!n) return fallback;
    if (auto v = n->value_exact<bool>()) return *v;
    wrong(*n, key, "expected true or false");
    return false;
  }
  std::string string(std::string_view key, std::optional<std::string> fallback = std::nullopt) {
    const toml::node* n = t_.get(key);
    if (!n) return fallback ? *fallback : (missing(key, std::optional<int64_t>{}), std::string());
    if (auto v = n->value_exact<std::string>()) {
      if (!v->empty()) return *v;
      wrong(*n, key, "expected a non-empty string");
      return {};
    }
    wrong(*n, key, "expected a string");
    return {};
  }
  std::vector<std::string> strings(std::string_view key) {
    std::vector<std::string> out;
    const toml::node* n = t_.get(key);
    if (!n) return out;
    const toml::array* a = n->as_array();
    if (!a) wrong(*n, key, "expected a list of strings");
    for (size_t i = 0; a && i < a->size(); ++i) {
      auto v = (*a)[i].value_exact<std::string>();
      if (!v || v->empty()) {
        wrong((*a)[i], std::string(key) + "[" + std::to_string(i) + "]",
              "expected a non-empty string");
        break;
      }
      out.push_back(*v);
    }
    return out;
  }
  // A list of lists of non-empty strings (torchtitan's module_fqns_per_model_part).
  std::vector<std::vector<std::string>> string_lists(std::string_view key) {
    std::vector<std::vector<std::string>> out;
    const toml::node* n = t_.get(key);
    if (!n) return out;
    const toml::array* a = n->as_array();
    if (!a) wrong(*n, key, "expected a list of lists of strings");
    for (size_t i = 0; a && i < a->size() && !error_; ++i) {
      const toml::array* part = (*a)[i].as_array();
      if (!part) {
        wrong((*a)[i], std::string(key) + "[" + std::to_string(i) + "]",
              "expected a list of strings");
        break;
      }
      out.emplace_back();
      for (size_t j = 0; j < part->size(); ++j) {
        auto v = (*part)[j].value_exact<std::string>();
        if (!v || v->empty()) {
          wrong((*part)[j], std::string(key) + "[" + std::to_string(i) + "][" + std::to_string(j) + "]",
                "expected a non-empty string");
          break;
        }
        out.back().push_back(*v);
      }
    }
    return out;
  }
  template <typename E>
  E choice(std::string_view key, E fallback) {
    const toml::node* n = t_.get(key);
    if (!n) return fallback;
    std::string text = string(key);
    if (error_) return fallback;
    Result<E> r = parse_enum<E>(name(key), text);
    if (!r) error_ = make_error(where(*n) + ": " + r.error().message);
    return r ? *r : fallback;
  }
  // An integer in [lo, hi], or `fallback` when absent.
  int64_t integer_in(std::string_view key, int64_t lo, int64_t hi,
                     std::optional<int64_t> fallback = std::nullopt) {
    int64_t v = integer(key, fallback);
    const toml::node* n = t_.get(key);
    if (n && !error_ && (v < lo || v > hi))
      wrong(*n, key, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
  }
  // A non-empty list of T (int64_t, bool or std::string), or {fallback} when absent.
  template <typename T>
  std::vector<T> list(std::string_view key, T fallback) {
    const toml::node* n = t_.get(key);
    if (!n) return {fallback};
    const char* want = std::is_same_v<T, bool>          ? "a non-empty list of true/false"
                       : std::is_same_v<T, std::string> ? "a non-empty list of strings"
                                                        : "a non-empty list of integers";
    const toml::array* a = n->as_array();
    if (!a || a->empty()) {
      wrong(*n, key, std::string("expected ") + want);
      return {fallback};
    }
    std::vector<T> out;
    for (size_t i = 0; i < a->size(); ++i) {
      auto v = (*a)[i].value_exact<T>();
      if (!v) {
        wrong((*a)[i], std::string(key) + "[" + std::to_string(i) + "]", std::string("expected ") + want);
        return {fallback};
      }
      out.push_back(*v);
    }
    return out;
  }
  // A list of rows of `width` numbers each, all >= 0 (empty when absent).
  std::vector<std::vector<double>> rows(std::string_view key, size_t width) {
    std::vector<std::vector<double>> out;
    const toml::node* n = t_.get(key);
    if (!n) return out;
    const toml::array* a = n->as_array();
    const std::string want = "expected rows of " + std::to_string(width) + " non-negative numbers";
    if (!a) wrong(*n, key, want);
    for (size_t i = 0; a && i < a->size() && !error_; ++i) {
      std::optional<std::vector<double>> r = row((*a)[i], width);
      if (!r) {
        wrong((*a)[i], std::string(key) + "[" + std::to_string(i) + "]", want);
        break;
      }
      out.push_back(std::move(*r));
    }
    return out;
  }
  // One row of `width` numbers, all >= 0 (empty when absent).
  std::vector<double> numbers(std::string_view key, size_t width) {
    const toml::node* n = t_.get(key);
    if (!n) return {};
    std::optional<std::vector<double>> r = row(*n, width);
    if (!r) wrong(*n, key, "expected " + std::to_string(width) + " non-negative numbers");
    return r ? *r : std::vector<double>{};
  }
  // A sub-table, or nullptr when absent (an error when the key holds something else).
  const toml::table* table(std::string_view key) {
    const toml::node* n = t_.get(key);
    if (!n) return nullptr;
    if (!n->is_table()) wrong(*n, key, "expected a table");
    return n->as_table();
  }
  std::string where(std::string_view key) const {
    const toml::node* n = t_.get(key);
    return n ? where(*n) : path_;
  }
  // Refuses keys other than `keys`, naming the first unknown one and the valid ones.
  void only(std::initializer_list<std::string_view> keys) {
    for (const auto& [key, value] : t_) {
      if (std::find(keys.begin(), keys.end(), key.str()) != keys.end()) continue;
      std::string valid;
      for (std::string_view k : keys) valid += (valid.empty() ? "" : ", ") + std::string(k);
      std::string what = value.is_table() ? "unknown table [" + printable(name(key.str())) + "]"
                                          : "unknown key " + quote_input(name(key.str()));
      if (!error_) error_ = make_error(where(value) + ": " + what + " (valid: " + valid + ")");
      return;
    }
  }
  std::optional<Error> error() const { return error_; }

 private:
  std::string name(std::string_view key) const { return prefix_ + std::string(key); }
  static std::optional<std::vector<double>> row(const toml::node& n, size_t width) {
    const toml::array* a = n.as_array();
    if (!a || a->size() != width) return std::nullopt;
    std::vector<double> r;
    for (const toml::node& x : *a) {
      if (!x.is_number() || *x.value<double>() < 0) return std::nullopt;
      r.push_back(*x.value<double>());
    }
    return r;
  }
  std::string where(const toml::node& n) const {
    return path_ + ":" + std::to_string(n.source().begin.line);
  }
  int64_t missing(std::string_view key, std::optional<int64_t> fallback) {
    if (fallback) return *fallback;
    if (!error_) error_ = make_error(path_ + ": missing required key '" + name(key) + "'");
    return 0;
  }
  void wrong(const toml::node& n, std::string_view key, const std::string& want) {
    if (!error_) error_ = make_error(where(n) + ": " + name(key) + ": " + want + ", got " + shown(n));
  }

  const toml::table& t_;
  std::string path_, prefix_;
  std::optional<Error> error_;
};

// TOML text from `path`; a malformed document gives "path:LINE:COLUMN: malformed TOML: ...".
Result<toml::table> parse_toml_text(const std::string& text, const std::string& path);

Result<ModelSpec> model_from_table(const toml::table& table, const std::string& path);

}  // namespace np
