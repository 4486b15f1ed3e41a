// collectivectl store: reads and writes the sidecar's rendezvous store.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "rpc/remote_store.h"
#include "tools/collectivectl/commands.h"

namespace collectived::collectivectl {

int StoreCommand(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  const auto& args = options.command;
  if (args.size() < 2) return Fail("store needs a subcommand (see --help)");
  RemoteStore store(channel);
  const std::string& verb = args[1];
  auto need = [&](size_t count) { return args.size() == count + 2; };
  std::vector<std::string> keys(args.begin() + 2, args.end());
  if (verb == "set" && need(2)) {
    Status status = store.Set(args[2], args[3]);
    return status.ok() ? 0 : Fail(status);
  }
  if (verb == "get" && need(1)) {
    auto value = store.Get(args[2], options.timeout);
    if (!value.ok()) return Fail(value.status());
    std::fwrite(value->data(), 1, value->size(), stdout);
    std::printf("\n");
    return 0;
  }
  if (verb == "add" && need(2)) {
    char* end = nullptr;
    long long delta = std::strtoll(args[3].c_str(), &end, 10);
    if (end == args[3].c_str() || *end != '\0') return Fail("DELTA must be an integer: " + args[3]);
    auto value = store.Add(args[2], delta);
    if (!value.ok()) return Fail(value.status());
    std::printf("%lld\n", static_cast<long long>(*value));
    return 0;
  }
  if (verb == "append" && need(2)) {
    Status status = store.Append(args[2], args[3]);
    return status.ok() ? 0 : Fail(status);
  }
  if (verb == "check" && args.size() >= 3) {
    // Each key by name: which one is missing is what a reader wants to know.
    bool all = true;
    for (const std::string& key : keys) {
      auto present = store.Check({key});
      if (!present.ok()) return Fail(present.status());
      std::printf("%s %s\n", *present ? "present" : "missing", key.c_str());
      all = all && *present;
    }
    return all ? 0 : 1;
  }
  if (verb == "wait" && args.size() >= 3) {
    Status status = store.Wait(keys, options.timeout);
    return status.ok() ? 0 : Fail(status);
  }
  if (verb == "delete" && need(1)) {
    auto deleted = store.DeleteKey(args[2]);
    if (!deleted.ok()) return Fail(deleted.status());
    std::printf("%s\n", *deleted ? "deleted" : "not found");
    return 0;
  }
  if (verb == "num-keys" && need(0)) {
    auto count = store.NumKeys();
    if (!count.ok()) return Fail(count.status());
    std::printf("%lld\n", static_cast<long long>(*count));
    return 0;
  }
  return Fail("bad store command (see --help)");
}

}  // namespace collectived::collectivectl
