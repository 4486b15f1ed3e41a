// The collectived daemon: owns the gRPC server (Unix socket and TCP listener), the services
// behind it, the rendezvous store and the metrics endpoint, from start-up to clean shutdown.
//
// Thread-safety: Start() and Shutdown() may be called from different threads; Shutdown() is
// idempotent.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>

#include "engine/vocabulary/status.h"
#include "services/collectived/config.h"

namespace collectived {

class AdminPolicy;
class AdminService;
class CollectivesService;
class FdChannelServer;
class GroupService;
class SessionService;
class Sidecar;
class Metrics;
class MemoryStore;
class StoreService;
class UnixListener;

class Daemon {
 public:
  explicit Daemon(DaemonConfig config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Binds every configured listener and starts serving. Returns Unavailable naming the address
  // that could not be bound (the socket's directory is created when missing).
  Status Start();

  // Stops accepting calls, lets in-flight calls finish within the grace period (then cancels
  // them), and removes the socket file. Safe to call more than once.
  void Shutdown(std::string_view reason);

  // The TCP port actually bound (useful with port 0), or 0 when TCP is disabled.
  int tcp_port() const { return tcp_port_; }
  // The metrics port actually bound, or 0.
  int metrics_port() const;
  // host:port under which peers reach this sidecar (known once Start() has bound the listener).
  std::string advertise_address() const;

 private:
  // A listener cannot accept for want of descriptors or memory (`exhausted`), or can again.
  void OnListenerExhaustion(std::string_view listener, bool exhausted, const std::string& reason);
  void UpdateHealthLocked();

  const DaemonConfig config_;
  mutable std::mutex address_mutex_;
  std::string advertise_address_;  // guarded by address_mutex_
  int tcp_port_ = 0;
  std::shared_ptr<MemoryStore> store_;
  std::shared_ptr<Metrics> metrics_;
  std::unique_ptr<Sidecar> sidecar_;
  std::unique_ptr<StoreService> store_service_;
  std::unique_ptr<SessionService> session_service_;
  std::unique_ptr<FdChannelServer> fd_channel_;
  std::unique_ptr<GroupService> group_service_;
  std::unique_ptr<CollectivesService> collectives_service_;
  std::unique_ptr<AdminPolicy> admin_policy_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<UnixListener> unix_listener_;
  // Health says SERVING once started, until shutdown begins, and not while a listener cannot
  // accept for want of resources.
  std::mutex health_mutex_;
  bool started_ = false;    // guarded by health_mutex_
  bool stopping_ = false;   // guarded by health_mutex_
  bool exhausted_ = false;  // guarded by health_mutex_
  std::mutex shutdown_mutex_;
  bool shut_down_ = false;
};

}  // namespace collectived
