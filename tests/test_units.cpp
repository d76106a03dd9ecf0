// Budget parsing: SI and IEC units taken exactly (GB = 10^9, GiB = 2^30), bad spellings rejected.
#include <gtest/gtest.h>

#include "planner/inputs/units.hpp"

namespace np {
namespace {

int64_t ok(const char* text) {
  Result<int64_t> r = parse_bytes(text);
  EXPECT_TRUE(r.ok()) << text << ": " << (r.ok() ? "" : r.error().message);
  return r.ok() ? *r : -1;
}

std::string err(const char* text) {
  Result<int64_t> r = parse_bytes(text);
  EXPECT_FALSE(r.ok()) << text << " parsed as " << (r.ok() ? *r : 0);
  return r.ok() ? "" : r.error().message;
}

TEST(ParseBytes, TheIssueSpellings) {
  EXPECT_EQ(ok("80GB"), 80'000'000'000);
  EXPECT_EQ(ok("80GiB"), 85'899'345'920);
  EXPECT_EQ(ok("85899345920"), 85'899'345'920);
  EXPECT_EQ(ok("80 GB"), 80'000'000'000);
}

TEST(ParseBytes, UnitsAndCase) {
  EXPECT_EQ(ok("1B"), 1);
  EXPECT_EQ(ok("1kb"), 1000);
  EXPECT_EQ(ok("1KiB"), 1024);
  EXPECT_EQ(ok("3MiB"), 3 * 1024 * 1024);
  EXPECT_EQ(ok("2TB"), 2'000'000'000'000);
  EXPECT_EQ(ok("1TiB"), 1LL << 40);
  EXPECT_EQ(ok("141gb"), 141'000'000'000);
}

TEST(ParseBytes, ExactDecimals) {
  EXPECT_EQ(ok("79.5GB"), 79'500'000'000);
  EXPECT_EQ(ok("1.5KiB"), 1536);
  EXPECT_EQ(ok("0.25GiB"), 268'435'456);
  EXPECT_NE(err("0.5B").find("whole number"), std::string::npos);
  EXPECT_NE(err("1.1KiB").find("whole number"), std::string::npos);  // 1126.4 bytes
}

TEST(ParseBytes, RejectsBadInput) {
  EXPECT_NE(err("80G").find("ambiguous"), std::string::npos);
  EXPECT_NE(err("80XB").find("valid: B, KB"), std::string::npos);
  EXPECT_NE(err("abc").find("no number"), std::string::npos);
  EXPECT_NE(err("0GB").find("positive"), std::string::npos);
  EXPECT_NE(err("-5GB").find("positive"), std::string::npos);
  EXPECT_NE(err("").find("no number"), std::string::npos);
  EXPECT_NE(err("99999999999TB").find("too large"), std::string::npos);
}

TEST(ParseBytes, ExponentNotationIsNamed) {
  auto r = parse_bytes("1e10");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("'1e10': exponent notation is not accepted"), std::string::npos)
      << r.error().message;
  EXPECT_FALSE(parse_bytes("2E+3GB").ok());
  auto eb = parse_bytes("10EB");  // a unit, not an exponent
  ASSERT_FALSE(eb.ok());
  EXPECT_NE(eb.error().message.find("unknown unit 'EB'"), std::string::npos) << eb.error().message;
}

TEST(ParseInteger, WholeNumbersWithoutWrap) {
  EXPECT_EQ(*parse_integer("8"), 8);
  EXPECT_EQ(*parse_integer("-3"), -3);
  EXPECT_EQ(*parse_integer("007"), 7);
  EXPECT_EQ(*parse_integer("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(*parse_integer("-9223372036854775808"), INT64_MIN);
  for (const char* bad : {"", "-", "1.5", "1e3", " 2", "2 ", "+2", "0x10", "8GB"}) {
    auto r = parse_integer(bad);
    ASSERT_FALSE(r.ok()) << "'" << bad << "'";
    EXPECT_EQ(r.error().message, "not a whole number") << "'" << bad << "'";
  }
  for (const char* big : {"9223372036854775808", "-9223372036854775809",
                          "99999999999999999999999999999999"}) {
    auto r = parse_integer(big);
    ASSERT_FALSE(r.ok()) << big;
    EXPECT_EQ(r.error().message, "does not fit in 64 bits") << big;
  }
}

TEST(QuoteInput, EscapesAndCuts) {
  EXPECT_EQ(quote_input("h100"), "'h100'");
  EXPECT_EQ(quote_input("a\x01\xff" "b"), "'a\\x01\\xffb'");
  EXPECT_EQ(quote_input("line\nbreak", '"'), "\"line\\x0abreak\"");
  std::string long_text(100, 'z');
  EXPECT_EQ(quote_input(long_text), "'" + std::string(64, 'z') + "'...");
}

TEST(Format, IntegersAndUnits) {
  EXPECT_EQ(format_int(70553706496), "70,553,706,496");
  EXPECT_EQ(format_int(999), "999");
  EXPECT_EQ(format_int(-1000), "-1,000");
  EXPECT_EQ(format_gb(80'000'000'000), "80.00 GB");
  EXPECT_EQ(format_gib(85'899'345'920), "80.00 GiB");
  EXPECT_EQ(format_binary(512LL << 20), "512 MiB");
  EXPECT_EQ(format_binary(3LL << 29), "1.50 GiB");
  EXPECT_EQ(format_binary(7), "7 B");
}

}  // namespace
}  // namespace np

namespace np {
namespace {
// Counts read as English: singular for one, "es" after ch, sh, s and x.
TEST(Units, CountNoun) {
  EXPECT_EQ(count_noun(1, "micro-batch"), "1 micro-batch");
  EXPECT_EQ(count_noun(4, "micro-batch"), "4 micro-batches");
  EXPECT_EQ(count_noun(1, "GPU"), "1 GPU");
  EXPECT_EQ(count_noun(0, "GPU"), "0 GPUs");
  EXPECT_EQ(count_noun(2, "stage program"), "2 stage programs");
  EXPECT_EQ(count_noun(3, "box"), "3 boxes");
}
}  // namespace
}  // namespace np
