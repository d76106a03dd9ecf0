// Internal: a whole input file as text, with the one-line errors every reader gives ("cannot read
// plan X: it is a folder; give a plan file", "...: no such file or not readable").
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "planner/inputs/result.hpp"

namespace np {

// `what` names the file's role in errors ("plan", "scenario"; empty: none).
inline Result<std::string> read_text_file(const std::string& path, const std::string& what = "") {
  std::string name = what.empty() ? path : what + " " + path;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return make_error("cannot read " + name + ": it is a folder; give a " +
                      (what.empty() ? std::string("file") : what + " file"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read " + name + ": no such file or not readable");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace np
