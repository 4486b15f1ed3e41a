// collectivectl: the entry points of its commands, one file each; main.cc dispatches to them.
#pragma once

#include <grpcpp/channel.h>

#include <memory>

#include "tools/collectivectl/command.h"

namespace collectived::collectivectl {

// Each takes the parsed command line (options.command[0] is the command's name) and the
// channel to the sidecar at options.address, and returns the exit code of collectivectl.
int Health(const Options& options, std::shared_ptr<grpc::Channel> channel);
int Info(const Options& options, std::shared_ptr<grpc::Channel> channel);
int Groups(const Options& options, std::shared_ptr<grpc::Channel> channel);
int Describe(const Options& options, std::shared_ptr<grpc::Channel> channel);  // and --cluster
int Abort(const Options& options, std::shared_ptr<grpc::Channel> channel);
int FlightRecorderCommand(const Options& options, std::shared_ptr<grpc::Channel> channel);
int StoreCommand(const Options& options, std::shared_ptr<grpc::Channel> channel);

// smoke opens a session per rank itself (the addresses of --ranks): no channel.
int Smoke(const Options& options);

}  // namespace collectived::collectivectl
