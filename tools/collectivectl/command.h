// collectivectl: what its commands share: the options of the command line, how a command fails
// and how ranks are printed.
#pragma once

#include <google/protobuf/repeated_field.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/vocabulary/status.h"
#include "rpc/tls.h"

namespace collectived::collectivectl {

struct Options {
  std::string address;
  std::chrono::milliseconds timeout{5000};
  bool timeout_set = false;                                    // --timeout-ms given
  TlsClientOptions tls = TlsClientOptions::FromEnvironment();  // flags override
  std::vector<std::string> command;
};

// Prints "collectivectl: MESSAGE" on stderr and returns 1, the exit code of a failed command.
int Fail(const std::string& message);
int Fail(const Status& status);

// "[0, 1, 2]".
std::string Join(const google::protobuf::RepeatedField<int32_t>& ranks);

}  // namespace collectived::collectivectl
