// The environment variables collectived's clients read, in one table: each variable's default,
// which clients read it and what it does. Each client has one reader, which refuses a name the
// table does not hold: ClientSetting below (C++, at compile time), collectived.environment.get
// (Python) and setting() in clients/go/collectived/environment.go (Go), whose name sets
// client_environment_export writes (collectived/environment_table.py, environment_table.go),
// as it writes the Markdown table of docs/clients.md; the ctests
// client_environment_files_are_current and clients_read_only_tabled_variables fail when a generated
// file drifted or a client reads a COLLECTIVED_ variable the table does not hold. (The daemon's
// variables are its flags' fallbacks: `collectived --help=markdown`.)
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace collectived {

struct ClientVariable {
  std::string_view name;
  std::string_view fallback;  // what an unset or empty variable means
  std::string_view readers;   // the clients that read it
  std::string_view meaning;
};

inline constexpr ClientVariable kClientVariables[] = {
    {"COLLECTIVED_ADDRESS", "unix:///run/collectived/collectived.sock", "C++, Python, Go, torch",
     "the sidecar: unix:///path or host:port; {local_rank} in it stands for $LOCAL_RANK (one "
     "sidecar per GPU)"},
    {"COLLECTIVED_TLS_CA", "", "C++, Python, Go, torch",
     "PEM CA that signs the sidecar's certificate: TCP channels use mutual TLS"},
    {"COLLECTIVED_TLS_CERT", "", "C++, Python, Go, torch", "the client's PEM certificate"},
    {"COLLECTIVED_TLS_KEY", "", "C++, Python, Go, torch", "its PEM private key"},
    {"COLLECTIVED_TLS_PEER_NAME", "the address's host", "C++, Python, Go, torch",
     "the name expected in the sidecar's certificate"},
    {"COLLECTIVED_RING", "1", "C++, Python, torch",
     "0: no shared-memory submission ring; ops go over the session's gRPC stream"},
    {"COLLECTIVED_RING_SPIN_US", "300", "C++, Python, torch",
     "microseconds a client polls its ring for completions before it sleeps (0-100000)"},
    {"COLLECTIVED_RING_HOST_SPIN_US", "200", "the sidecar's end of each ring",
     "microseconds the sidecar polls a ring for submissions before it sleeps (0-100000)"},
    {"COLLECTIVED_STREAM_WAIT", "event", "C++, Python, torch",
     "signal: a CUDA op's stream-ordered wait() waits on a word the sidecar's stream writes, "
     "with no response awaited"},
    {"COLLECTIVED_CUDA_WAIT", "stream", "torch",
     "blocking: a CUDA op's wait() blocks the CPU until the op completed"},
    {"COLLECTIVED_TORCH_ADOPT_MIN_BYTES", "65536", "torch",
     "CPU tensors of at least this many bytes are moved into shared memory at first use"},
    {"COLLECTIVED_TORCH_ADOPT_MAX_BYTES", "4294967296", "torch",
     "the most bytes of tensors a process keeps adopted"},
    {"COLLECTIVED_JOB_TOKEN_FILE", "", "torch",
     "file holding the job's token (re-read for every group): only ranks that present it join "
     "the job's groups"},
    {"COLLECTIVED_JOB_TOKEN", "", "torch", "the job's token itself, when no file is named"},
    {"COLLECTIVED_JOB_NAME", "$TORCHELASTIC_RUN_ID", "torch",
     "the job's name in its groups' names, metrics and logs"},
    {"COLLECTIVED_FAULT_TOLERANCE", "fail-fast", "torch",
     "what the job's groups do when they lose a rank: fail-fast, or shrink (go on among the "
     "live ranks)"},
    {"COLLECTIVED_FAULT_TOLERANCE_MIN_RANKS", "1", "torch",
     "a shrinking group with fewer live ranks than this fails"},
};

// Whether the table holds `name`.
constexpr bool IsClientVariable(std::string_view name) {
  for (const ClientVariable& variable : kClientVariables)
    if (variable.name == name) return true;
  return false;
}

// A name of the table, checked when the program is compiled: ClientSetting("COLLECTIVED_RNG")
// does not build (a variable to add to the table first).
class TabledVariable {
 public:
  consteval TabledVariable(const char* name) : name_(name) {  // NOLINT: implicit by design
    if (!IsClientVariable(name)) throw "not a client variable of rpc/client_environment.h";
  }
  const char* name() const { return name_; }

 private:
  const char* name_;
};

// The C++ clients' one reader of their variables: `$name` when set and not empty, else nullopt
// (the caller applies the table's fallback).
inline std::optional<std::string> ClientSetting(TabledVariable variable) {
  const char* value = std::getenv(variable.name());
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

}  // namespace collectived
