// Boolean switches in the environment (FLASHMLA_PERM_*): 0/1, true/false,
// on/off and yes/no, in any case, blanks around them ignored; unset or empty
// is the default, and any other value is refused, naming the variable and
// the value, as flashmla_perm/_switches.py does.
#pragma once

#include <cctype>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace flashmla_perm {

inline bool env_switch(const char* name, bool unset) {
  const char* raw = std::getenv(name);
  std::string v = raw ? raw : "";
  const size_t a = v.find_first_not_of(" \t\n\r\f\v"), b = v.find_last_not_of(" \t\n\r\f\v");
  v = a == std::string::npos ? "" : v.substr(a, b - a + 1);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (v.empty()) return unset;
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  throw std::invalid_argument(
      std::string(name) + "='" + (raw ? raw : "") +
      "' is not a switch value: use one of 1, true, on, yes (on) or 0, false, off, no "
      "(off), in any case");
}

}  // namespace flashmla_perm
