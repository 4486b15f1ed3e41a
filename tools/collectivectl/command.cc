// collectivectl: what its commands share (command.h): failing with a message, printing ranks.
#include "tools/collectivectl/command.h"

#include <cstdio>
#include <string>

namespace collectived::collectivectl {

int Fail(const std::string& message) {
  std::fprintf(stderr, "collectivectl: %s\n", message.c_str());
  return 1;
}

int Fail(const Status& status) {
  return Fail(status.ToString());
}

std::string Join(const google::protobuf::RepeatedField<int32_t>& ranks) {
  std::string text = "[";
  for (int i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

}  // namespace collectived::collectivectl
