// Exact parsing and formatting of byte quantities.
#include "planner/inputs/units.hpp"

#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace np {
namespace {

struct Unit {
  std::string_view name;
  int64_t bytes;
};
constexpr std::array<Unit, 10> kUnits = {{{"B", 1},
                                          {"KB", kKB},
                                          {"MB", kMB},
                                          {"GB", kGB},
                                          {"TB", kTB},
                                          {"KIB", kKiB},
                                          {"MIB", kMiB},
                                          {"GIB", kGiB},
                                          {"TIB", kTiB},
                                          {"", 1}}};

std::string upper_trimmed(std::string_view s) {
  std::string out;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) out += static_cast<char>(std::toupper(c));
  return out;
}

Error budget_error(std::string_view text, std::string_view why) {
  return make_error("invalid byte quantity " + quote_input(text) + ": " + std::string(why) +
                    "; write e.g. 80GB (10^9 bytes), 80GiB (2^30 bytes) or 85899345920");
}

}  // namespace

std::string printable(std::string_view text) {
  constexpr size_t kMost = 64;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMost; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string quote_input(std::string_view text, char quote) {
  std::string out = quote + printable(text) + quote;
  return text.size() > 64 ? out + "..." : out;
}

Result<int64_t> parse_integer(std::string_view text) {
  size_t i = text.size() > 0 && text[0] == '-' ? 1 : 0;
  if (i == text.size()) return make_error("not a whole number");
  __int128 v = 0;
  for (size_t k = i; k < text.size(); ++k) {
    if (text[k] < '0' || text[k] > '9') return make_error("not a whole number");
    v = v * 10 + (text[k] - '0');
    if (v > (__int128{1} << 63)) return make_error("does not fit in 64 bits");
  }
  if (i == 1) v = -v;
  if (v > INT64_MAX) return make_error("does not fit in 64 bits");
  return static_cast<int64_t>(v);
}

Result<int64_t> parse_bytes(std::string_view text, bool allow_zero) {
  std::string s = upper_trimmed(text);
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) {
    if (s[i] == '-') return budget_error(text, "it must be positive");
    ++i;
  }
  __int128 whole = 0, frac = 0, frac_scale = 1;
  bool digits = false;
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, digits = true) {
    whole = whole * 10 + (s[i] - '0');
    if (whole > (__int128)1 << 62) return budget_error(text, "it is too large");
  }
  if (i < s.size() && s[i] == '.') {
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i, digits = true) {
      if (frac_scale > (__int128)1e17) return budget_error(text, "too many decimal places");
      frac = frac * 10 + (s[i] - '0');
      frac_scale *= 10;
    }
  }
  if (!digits) return budget_error(text, "no number");
  std::string_view unit(s.data() + i, s.size() - i);
  if (unit.size() > 1 && unit[0] == 'E' &&
      (std::isdigit(static_cast<unsigned char>(unit[1])) || unit[1] == '+' || unit[1] == '-'))
    return budget_error(text, "exponent notation is not accepted");
  const Unit* found = nullptr;
  for (const Unit& u : kUnits)
    if (unit == u.name) found = &u;
  if (!found) {
    if (unit == "G" || unit == "M" || unit == "T" || unit == "K")
      return budget_error(text, "unit " + quote_input(unit) + " is ambiguous");
    return budget_error(text, "unknown unit " + quote_input(unit) +
                                  " (valid: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  }
  __int128 scaled = frac * found->bytes;
  if (scaled % frac_scale != 0) return budget_error(text, "it is not a whole number of bytes");
  __int128 total = whole * found->bytes + scaled / frac_scale;
  if (total > INT64_MAX) return budget_error(text, "it is too large");
  if (total < 0 || (total == 0 && !allow_zero)) return budget_error(text, "it must be positive");
  return static_cast<int64_t>(total);
}

std::string format_gb(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GB", static_cast<double>(bytes) / kGB);
  return buf;
}

std::string format_gib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / kGiB);
  return buf;
}

std::string format_human(int64_t bytes) {
  return format_gib(bytes) + " (" + format_gb(bytes) + ")";
}

std::string format_signed_gib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%+.2f GiB", static_cast<double>(bytes) / kGiB);
  return buf;
}

std::string format_binary(int64_t bytes) {
  const std::pair<const char*, int64_t> units[] = {
      {"TiB", kTiB}, {"GiB", kGiB}, {"MiB", kMiB}, {"KiB", kKiB}};
  char buf[64];
  for (auto [name, size] : units)
    if (bytes >= size) {
      if (bytes % size == 0)
        std::snprintf(buf, sizeof buf, "%lld %s", static_cast<long long>(bytes / size), name);
      else
        std::snprintf(buf, sizeof buf, "%.2f %s", static_cast<double>(bytes) / size, name);
      return buf;
    }
  return std::to_string(bytes) + " B";
}

std::string format_int(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

std::string format_ranges(const std::vector<int>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1] == layers[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(layers[i]) +
         (j > i ? "-" + std::to_string(layers[j]) : "");
    i = j + 1;
  }
  return s.empty() ? "none" : s;
}

std::string count_noun(int64_t n, std::string_view noun) {
  std::string out = std::to_string(n) + " " + std::string(noun);
  if (n == 1) return out;
  auto ends = [&](std::string_view e) {
    return noun.size() >= e.size() && noun.substr(noun.size() - e.size()) == e;
  };
  return out + (ends("ch") || ends("sh") || ends("s") || ends("x") ? "es" : "s");
}

}  // namespace np
