// ErrnoMessage: "what: <the text of errno>", the message of a failed system call. Read errno
// before anything else may change it.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

namespace collectived {

inline std::string ErrnoMessage(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

}  // namespace collectived
