// MetricsHttpServer: serves the Prometheus text exposition on GET /metrics (HTTP/1.0 and 1.1,
// one request per connection) from one thread that polls its listening socket, its connections
// and a stop eventfd. Stopping is one wake-up: prometheus-cpp's civetweb Exposer waits out a
// 2 s poll of its master thread, which made every sidecar stop take 2 s.
//
// Bounded against hostile scrapers: at most kMaxConnections at once (further ones wait in the
// kernel's backlog), a request head of at most kMaxRequestBytes, and a connection that has not
// sent its request or taken its response within kIdleTimeout is closed. A slow scraper delays
// other scrapes, never the sidecar: the page is rendered on this server's thread.
//
// Thread-safety: port() may be called from any thread; the destructor stops and joins.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "engine/vocabulary/status.h"

namespace collectived {

class MetricsHttpServer {
 public:
  // Renders the body of GET /metrics (text format 0.0.4). Called on the server's thread.
  using Render = std::function<std::string()>;

  static constexpr int kMaxConnections = 32;
  static constexpr size_t kMaxRequestBytes = 16 * 1024;
  static constexpr std::chrono::milliseconds kIdleTimeout{10000};

  // Binds `address` (HOST:PORT, [V6HOST]:PORT or :PORT for every interface; port 0 picks one)
  // and starts serving. Unavailable naming the address and the system's reason when it cannot
  // bind; InvalidArgument for an address it cannot parse.
  static StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& address,
                                                            Render render);
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port.
  int port() const { return port_; }

 private:
  struct Connection;
  MetricsHttpServer(int listen_fd, int stop_fd, int port, Render render);
  void Loop();

  const int listen_fd_;
  const int stop_fd_;
  const int port_;
  const Render render_;
  std::thread thread_;
};

}  // namespace collectived
