// Spelling shared by the recording fake's two halves (the executor and the trace adapter).
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "met/types.h"

namespace met::testing {

inline std::string sid(const Sequence& s) {
  // A detached slot (-1) prints as usize::MAX, as the reference fake does.
  return "s" + std::to_string(s.session_hash) + "@" +
         std::to_string(static_cast<uint64_t>(s.slot)) + ":len=" + std::to_string(s.seq_len);
}

inline std::string int_list(const std::vector<int32_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

inline std::string quoted_list(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", \"" : "\"") + v[i] + "\"";
  return out + "]";
}

inline std::string hex(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

inline const char* boolean(bool b) { return b ? "true" : "false"; }

}  // namespace met::testing
