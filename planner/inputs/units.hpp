// Byte quantities: parsing "80GB", "80GiB", "85899345920", "80 GB" exactly (GB = 10^9, GiB = 2^30),
// and formatting bytes for people.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "planner/inputs/result.hpp"

namespace np {

inline constexpr int64_t kKiB = 1024, kMiB = kKiB * 1024, kGiB = kMiB * 1024, kTiB = kGiB * 1024;
inline constexpr int64_t kKB = 1000, kMB = kKB * 1000, kGB = kMB * 1000, kTB = kGB * 1000;

// Parses a positive byte count. Decimal fractions are exact ("79.5GB" = 79500000000); a result
// that is not a whole number of bytes, zero, negative or ambiguous ("80G") is an error.
Result<int64_t> parse_bytes(std::string_view text, bool allow_zero = false);

// A whole decimal number that fits in 64 bits, with an optional minus sign: no fraction, exponent,
// unit or surrounding space, and no silent wrap ("9223372036854775808" is out of range).
Result<int64_t> parse_integer(std::string_view text);

// Text a user gave, for an error message: in quotes (single by default), bytes outside printable
// ASCII written \xNN, cut after 64 characters with "...".
std::string quote_input(std::string_view text, char quote = '\'');
// The same text unquoted: its first 64 bytes, those outside printable ASCII as \xNN.
std::string printable(std::string_view text);

std::string format_gb(int64_t bytes);      // "80.00 GB"
std::string format_gib(int64_t bytes);     // "74.51 GiB"
std::string format_human(int64_t bytes);   // "74.51 GiB (80.00 GB)"
std::string format_int(int64_t value);     // "70,553,706,496"
std::string format_binary(int64_t bytes);  // "512 MiB", "1.50 GiB": the largest fitting IEC unit
std::string format_signed_gib(int64_t bytes);  // "+1.25 GiB" / "-0.50 GiB"

// "1 micro-batch", "4 micro-batches", "8 GPUs": a count with its noun, plural unless 1 (nouns
// ending in ch, sh, s or x take "es").
std::string count_noun(int64_t n, std::string_view noun);
// Layer indices as ranges: "0-3,8-11" ("none" when empty).
std::string format_ranges(const std::vector<int>& layers);

}  // namespace np
