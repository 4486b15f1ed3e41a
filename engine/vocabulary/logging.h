// Structured logging in logfmt ("ts=... level=info msg=\"...\" key=value"), one line per event,
// written to stderr. Used by the engine and the daemon alike; no dependency on either.
//
// Thread-safety: Log() may be called from any thread; lines never interleave.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace collectived {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Parses "debug", "info", "warning"/"warn", "error". Returns false on anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);
std::string_view LogLevelName(LogLevel level);

// Events below `level` are dropped. Default: info.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();

using LogField = std::pair<std::string_view, std::string>;

// Writes one line: timestamp, level, message, then each field as key=value (values quoted
// when they contain spaces, quotes or '=').
void Log(LogLevel level, std::string_view message, std::initializer_list<LogField> fields = {});

inline void LogInfo(std::string_view message, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kInfo, message, fields);
}
inline void LogWarning(std::string_view message, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kWarning, message, fields);
}
inline void LogError(std::string_view message, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kError, message, fields);
}
inline void LogDebug(std::string_view message, std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kDebug, message, fields);
}

}  // namespace collectived
