// A bounded reader of Python pickles made only of plain data: dicts, lists, tuples, strings,
// integers of up to 64 bits, floats, booleans and None. It is what PyTorch's memory snapshot
// (torch.cuda.memory._dump_snapshot(), a pickle.dump of a dict) needs, read without Python.
//
// The opcodes are those of pickle protocols 2 to 5 for these types (Lib/pickletools.py names
// them); anything else (globals, object construction, persistent ids, the text opcodes of
// protocols 0 and 1) is refused, so no input can ask for more than data. Every length is checked
// against the bytes left, the stack and the mark stack are bounded, and values are nodes of an
// arena indexed by number: a pickle whose memo makes a list contain itself is still finite here.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "planner/inputs/result.hpp"

namespace np {

class Pickle {
 public:
  enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kString, kList, kTuple, kDict };
  struct Node {
    Kind kind = Kind::kNone;
    uint32_t length = 0;  // kString: its bytes
    int64_t value = 0;    // kBool, kInt: the value; kString: its offset; containers: their index
    double real = 0;      // kFloat
  };

  // `data` must outlive the Pickle (strings point into it). `file` names it in errors.
  static Result<Pickle> read(std::string_view file, std::string_view data);

  int32_t root() const { return root_; }
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  Kind kind(int32_t id) const { return node(id).kind; }
  std::string_view string(int32_t id) const;
  // A list's or tuple's items, a dict's keys and values alternating (in insertion order).
  const std::vector<int32_t>& items(int32_t id) const;
  // The value of a string key in a dict; -1 when absent (or `dict` is not a dict).
  int32_t get(int32_t dict, std::string_view key) const;
  size_t size() const { return nodes_.size(); }

 private:
  std::string_view data_;
  std::vector<Node> nodes_;
  std::vector<std::vector<int32_t>> containers_;
  int32_t root_ = -1;
  friend class PickleParser;
};

}  // namespace np
