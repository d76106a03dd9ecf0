// Internal: typed, strict reads from a JSON document, each failure one line naming the value's path
// ("stages[1].tensors[57].bytes: expected an integer, got 1.5"). Integers never wrap or lose a
// fraction; enums list their valid spellings; unknown keys can be refused. Errors are thrown as
// std::invalid_argument and turned into np::Error by the caller.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "planner/inputs/spec.hpp"
#include "planner/inputs/units.hpp"

namespace np {

struct JsonReader {
  const nlohmann::json& j;
  std::string path;

  // The value shown in an error: JSON text, invalid UTF-8 replaced, cut after 40 characters.
  static std::string shown(const nlohmann::json& v) {
    std::string s = v.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
    return s.size() > 40 ? s.substr(0, 37) + "..." : s;
  }
  [[noreturn]] void bad(const std::string& what) const {
    throw std::invalid_argument(path + ": " + what + ", got " + shown(j));
  }
  JsonReader at(const std::string& key) const {
    std::string p = path.empty() ? key : path + "." + key;
    if (!j.is_object()) bad("expected an object");
    if (!j.contains(key)) throw std::invalid_argument(p + ": missing");
    return {j[key], p};
  }
  JsonReader at(size_t i) const { return {j.at(i), path + "[" + std::to_string(i) + "]"}; }
  bool has(const std::string& key) const { return j.is_object() && j.contains(key); }
  // Refuses keys other than `keys`, naming the first unknown one and the valid ones.
  void only(std::initializer_list<const char*> keys) const {
    if (!j.is_object()) bad("expected an object");
    for (const auto& [key, value] : j.items()) {
      bool known = false;
      for (const char* k : keys) known = known || key == k;
      if (known) continue;
      std::string valid;
      for (const char* k : keys) valid += (valid.empty() ? "" : ", ") + std::string(k);
      throw std::invalid_argument((path.empty() ? "" : path + ": ") + "unknown key " +
                                  quote_input(key) + " (valid: " + valid + ")");
    }
  }
  size_t size() const {
    if (!j.is_array()) bad("expected a list");
    return j.size();
  }
  int64_t integer(int64_t lo, int64_t hi) const {
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      bad("expected an integer that fits in 64 bits");
    if (!j.is_number_integer()) bad("expected an integer");
    int64_t v = j.get<int64_t>();
    if (v < lo || v > hi)
      bad("expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v;
  }
  int64_t positive() const { return integer(1, INT64_MAX); }
  bool boolean() const {
    if (!j.is_boolean()) bad("expected true or false");
    return j.get<bool>();
  }
  std::string text() const {
    if (!j.is_string()) bad("expected a string");
    return j.get<std::string>();
  }
  double number() const {
    if (!j.is_number()) bad("expected a number");
    return j.get<double>();
  }
  template <typename E>
  E choice() const {
    Result<E> r = parse_enum<E>(path.c_str(), text());
    if (!r) throw std::invalid_argument(r.error().message);
    return *r;
  }
};

// Parses JSON text from `path`. A malformed document gives "path:LINE:COLUMN: malformed JSON: what
// the parser expected", without the library's prefix or an echo of the input.
inline Result<nlohmann::json> parse_json(const std::string& text, const std::string& path) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    size_t end = std::min(e.byte > 0 ? e.byte - 1 : 0, text.size());
    size_t line = 1, column = 1;
    for (size_t i = 0; i < end; ++i) text[i] == '\n' ? (++line, column = 1) : ++column;
    std::string what = e.what();
    size_t colon = what.find(": ", what.find("column"));  // after "parse error at line L, column C"
    if (colon != std::string::npos) what = what.substr(colon + 2);
    size_t last = what.find("; last read");
    if (last != std::string::npos) what = what.substr(0, last);
    for (char& c : what)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    return make_error(path + ":" + std::to_string(line) + ":" + std::to_string(column) +
                      ": malformed JSON: " + what);
  } catch (const nlohmann::json::out_of_range&) {
    return make_error(path + ": malformed JSON: a number is out of range (beyond a 64-bit float)");
  } catch (const nlohmann::json::exception&) {
    return make_error(path + ": malformed JSON");
  }
}

}  // namespace np
