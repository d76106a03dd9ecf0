// The bounded pickle reader (pickle_reader.hpp). Opcodes and their operands as CPython's
// Lib/pickletools.py documents them (protocols 2 to 5); multi-byte operands are little-endian
// except BINFLOAT's, which is big-endian.
#include "planner/inputs/pickle_reader.hpp"

#include <bit>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>

namespace np {

namespace {
constexpr size_t kMaxStack = size_t{1} << 24;  // values on the stack at once
constexpr size_t kMaxMarks = size_t{1} << 16;  // open MARKs (nesting)
constexpr uint32_t kMaxMemo = uint32_t{1} << 28;
}  // namespace

class PickleParser {
 public:
  PickleParser(std::string_view file, std::string_view data) : file_(file), data_(data) {
    p_.data_ = data;
  }

  Result<Pickle> run() {
    while (true) {
      if (at_ >= data_.size()) return bad("ends before its STOP opcode (truncated)");
      size_t op_at = at_;
      auto op = static_cast<uint8_t>(data_[at_++]);
      std::optional<Error> e = step(op, op_at);
      if (e) return *e;
      if (stopped_) break;
    }
    if (stack_.size() != 1 || !marks_.empty())
      return bad("STOP with " + std::to_string(stack_.size()) + " values on the stack, not one");
    p_.root_ = stack_.back();
    return std::move(p_);
  }

 private:
  std::string file_;
  std::string_view data_;
  size_t at_ = 0;
  Pickle p_;
  std::vector<int32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, int32_t> memo_;
  bool stopped_ = false;

  Error bad(const std::string& why) const {
    return make_error(file_ + ": not a readable pickle: " + why + " (byte " + std::to_string(at_) +
                      "; valid: a pickle of dicts, lists, tuples, strings, integers, floats, "
                      "booleans and None, protocol 2-5, as torch.cuda.memory._dump_snapshot() "
                      "writes)");
  }
  bool have(size_t n) const { return n <= data_.size() - at_; }
  uint64_t le(size_t n) {  // n <= 8 bytes, checked by the caller
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(data_[at_ + i])} << (8 * i);
    at_ += n;
    return v;
  }
  int32_t add(Pickle::Node n) {
    p_.nodes_.push_back(n);
    return static_cast<int32_t>(p_.nodes_.size() - 1);
  }
  int32_t container(Pickle::Kind k) {
    p_.containers_.emplace_back();
    return add({k, 0, static_cast<int64_t>(p_.containers_.size() - 1), 0});
  }
  std::optional<Error> push(int32_t id) {
    if (stack_.size() >= kMaxStack) return bad("more than 2^24 values on the stack");
    stack_.push_back(id);
    return std::nullopt;
  }
  // The values since the last MARK, taken off the stack with the mark.
  std::optional<Error> pop_mark(std::vector<int32_t>& out) {
    if (marks_.empty()) return bad("no MARK before a list of values");
    size_t from = marks_.back();
    marks_.pop_back();
    out.assign(stack_.begin() + static_cast<std::ptrdiff_t>(from), stack_.end());
    stack_.resize(from);
    return std::nullopt;
  }
  // The container on top of the stack (below the values just popped), of kind `k`.
  std::optional<Error> target(Pickle::Kind k, const char* opname, std::vector<int32_t>*& items) {
    if (stack_.empty() || (!marks_.empty() && marks_.back() >= stack_.size()))
      return bad(std::string(opname) + " with no container below it");
    const Pickle::Node& n = p_.nodes_[static_cast<size_t>(stack_.back())];
    if (n.kind != k) return bad(std::string(opname) + " on a value that is not a " +
                                (k == Pickle::Kind::kDict ? "dict" : "list"));
    items = &p_.containers_[static_cast<size_t>(n.value)];
    return std::nullopt;
  }
  std::optional<Error> string(size_t n) {
    if (!have(n)) return bad("a string longer than the bytes left (truncated)");
    int32_t id = add({Pickle::Kind::kString, static_cast<uint32_t>(n), static_cast<int64_t>(at_), 0});
    at_ += n;
    return push(id);
  }
  std::optional<Error> integer(int64_t v) { return push(add({Pickle::Kind::kInt, 0, v, 0})); }
  std::optional<Error> long_bytes(size_t n) {
    if (n > 8) return bad("an integer wider than 64 bits");
    if (!have(n)) return bad("an integer longer than the bytes left (truncated)");
    if (n == 0) return integer(0);
    uint64_t v = le(n);
    if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);  // sign-extend
    return integer(static_cast<int64_t>(v));
  }
  std::optional<Error> tuple(size_t n) {
    if (stack_.size() < n || (!marks_.empty() && stack_.size() - n < marks_.back()))
      return bad("a tuple of more values than the stack holds");
    int32_t id = container(Pickle::Kind::kTuple);
    auto& items = p_.containers_.back();
    items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
    stack_.resize(stack_.size() - n);
    return push(id);
  }
  std::optional<Error> memo_get(uint64_t index) {
    auto it = memo_.find(static_cast<uint32_t>(index));
    if (index >= kMaxMemo || it == memo_.end())
      return bad("a memo reference to " + std::to_string(index) + ", never stored");
    return push(it->second);
  }
  std::optional<Error> memo_put(uint64_t index) {
    if (stack_.empty()) return bad("a memo store with an empty stack");
    if (index >= kMaxMemo) return bad("a memo index beyond 2^28");
    memo_[static_cast<uint32_t>(index)] = stack_.back();
    return std::nullopt;
  }

  std::optional<Error> step(uint8_t op, size_t op_at) {
    using K = Pickle::Kind;
    std::vector<int32_t> values;
    std::vector<int32_t>* items = nullptr;
    switch (op) {
      case 0x80:  // PROTO n
        if (!have(1)) return bad("truncated PROTO");
        if (uint64_t v = le(1); v < 2 || v > 5)
          return bad("pickle protocol " + std::to_string(v) + ", not 2-5");
        return std::nullopt;
      case 0x95:  // FRAME: an 8-byte length; the frame's opcodes follow as usual
        if (!have(8)) return bad("truncated FRAME");
        le(8);
        return std::nullopt;
      case '.':  // STOP
        stopped_ = true;
        return std::nullopt;
      case '(':  // MARK
        if (marks_.size() >= kMaxMarks) return bad("more than 2^16 nested MARKs");
        marks_.push_back(stack_.size());
        return std::nullopt;
      case '0':  // POP
        if (stack_.empty() || (!marks_.empty() && marks_.back() >= stack_.size()))
          return bad("POP of an empty stack");
        stack_.pop_back();
        return std::nullopt;
      case '1':  // POP_MARK
        return pop_mark(values);
      case 'N': return push(add({K::kNone, 0, 0, 0}));
      case 0x88: return push(add({K::kBool, 0, 1, 0}));  // NEWTRUE
      case 0x89: return push(add({K::kBool, 0, 0, 0}));  // NEWFALSE
      case 'K':  // BININT1
        if (!have(1)) return bad("truncated BININT1");
        return integer(static_cast<int64_t>(le(1)));
      case 'M':  // BININT2
        if (!have(2)) return bad("truncated BININT2");
        return integer(static_cast<int64_t>(le(2)));
      case 'J':  // BININT: 4 bytes, signed
        if (!have(4)) return bad("truncated BININT");
        return integer(static_cast<int32_t>(static_cast<uint32_t>(le(4))));
      case 0x8a:  // LONG1
        if (!have(1)) return bad("truncated LONG1");
        return long_bytes(le(1));
      case 0x8b: {  // LONG4
        if (!have(4)) return bad("truncated LONG4");
        return long_bytes(le(4));
      }
      case 'G': {  // BINFLOAT: 8 bytes, big-endian
        if (!have(8)) return bad("truncated BINFLOAT");
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(data_[at_ + i]);
        at_ += 8;
        return push(add({K::kFloat, 0, 0, std::bit_cast<double>(v)}));
      }
      case 0x8c:  // SHORT_BINUNICODE
        if (!have(1)) return bad("truncated SHORT_BINUNICODE");
        return string(le(1));
      case 'X':  // BINUNICODE
        if (!have(4)) return bad("truncated BINUNICODE");
        return string(le(4));
      case 0x8d: {  // BINUNICODE8
        if (!have(8)) return bad("truncated BINUNICODE8");
        uint64_t n = le(8);
        if (n > UINT32_MAX) return bad("a string of 4 GiB or more");
        return string(n);
      }
      case '}': return push(container(K::kDict));   // EMPTY_DICT
      case ']': return push(container(K::kList));   // EMPTY_LIST
      case ')': return push(container(K::kTuple));  // EMPTY_TUPLE
      case 'a': {  // APPEND
        if (stack_.empty() || (!marks_.empty() && marks_.back() >= stack_.size()))
          return bad("APPEND with nothing to append");
        int32_t v = stack_.back();
        stack_.pop_back();
        if (auto e = target(K::kList, "APPEND", items)) return e;
        items->push_back(v);
        return std::nullopt;
      }
      case 'e':  // APPENDS
        if (auto e = pop_mark(values)) return e;
        if (auto e = target(K::kList, "APPENDS", items)) return e;
        items->insert(items->end(), values.begin(), values.end());
        return std::nullopt;
      case 's': {  // SETITEM
        if (stack_.size() < 2 || (!marks_.empty() && marks_.back() + 2 > stack_.size()))
          return bad("SETITEM without a key and a value");
        int32_t v = stack_.back(), k = stack_[stack_.size() - 2];
        stack_.resize(stack_.size() - 2);
        if (auto e = target(K::kDict, "SETITEM", items)) return e;
        items->push_back(k);
        items->push_back(v);
        return std::nullopt;
      }
      case 'u':  // SETITEMS
        if (auto e = pop_mark(values)) return e;
        if (values.size() % 2) return bad("SETITEMS with a key and no value");
        if (auto e = target(K::kDict, "SETITEMS", items)) return e;
        items->insert(items->end(), values.begin(), values.end());
        return std::nullopt;
      case 't': {  // TUPLE: the values since the MARK
        if (auto e = pop_mark(values)) return e;
        int32_t id = container(K::kTuple);
        p_.containers_.back() = std::move(values);
        return push(id);
      }
      case 0x85: return tuple(1);  // TUPLE1
      case 0x86: return tuple(2);  // TUPLE2
      case 0x87: return tuple(3);  // TUPLE3
      case 0x94: return memo_put(memo_.size());  // MEMOIZE
      case 'q':                                  // BINPUT
        if (!have(1)) return bad("truncated BINPUT");
        return memo_put(le(1));
      case 'r':  // LONG_BINPUT
        if (!have(4)) return bad("truncated LONG_BINPUT");
        return memo_put(le(4));
      case 'h':  // BINGET
        if (!have(1)) return bad("truncated BINGET");
        return memo_get(le(1));
      case 'j':  // LONG_BINGET
        if (!have(4)) return bad("truncated LONG_BINGET");
        return memo_get(le(4));
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        at_ = op_at;
        return bad(std::string("opcode ") + hex + " is not plain data");
      }
    }
  }
};

Result<Pickle> Pickle::read(std::string_view file, std::string_view data) {
  return PickleParser(file, data).run();
}

std::string_view Pickle::string(int32_t id) const {
  const Node& n = node(id);
  if (n.kind != Kind::kString) return {};
  return data_.substr(static_cast<size_t>(n.value), n.length);
}

const std::vector<int32_t>& Pickle::items(int32_t id) const {
  static const std::vector<int32_t> none;
  const Node& n = node(id);
  if (n.kind != Kind::kList && n.kind != Kind::kTuple && n.kind != Kind::kDict) return none;
  return containers_[static_cast<size_t>(n.value)];
}

int32_t Pickle::get(int32_t dict, std::string_view key) const {
  if (dict < 0 || kind(dict) != Kind::kDict) return -1;
  const auto& kv = items(dict);
  for (size_t i = 0; i + 1 < kv.size(); i += 2)
    if (kind(kv[i]) == Kind::kString && string(kv[i]) == key) return kv[i + 1];
  return -1;
}

}  // namespace np
