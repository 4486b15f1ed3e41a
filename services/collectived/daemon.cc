#include "services/collectived/daemon.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/server_posix.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "engine/concurrency/clock.h"
#include "engine/cuda/gpu_inventory.h"
#include "engine/sidecar/sidecar.h"
#include "engine/store/memory_store.h"
#include "engine/vocabulary/logging.h"
#include "rpc/fd_channel_wire.h"
#include "rpc/limits.h"
#include "rpc/parse_failure_interceptor.h"
#include "rpc/remote_store.h"
#include "rpc/tls.h"
#include "services/collectived/admin_service.h"
#include "services/collectived/collectives_service.h"
#include "services/collectived/fd_channel_server.h"
#include "services/collectived/group_service.h"
#include "services/collectived/metrics.h"
#include "services/collectived/session_service.h"
#include "services/collectived/store_service.h"
#include "services/collectived/unix_listener.h"
#include "services/collectived/version.h"

namespace collectived {
namespace {

// Descriptors are the first thing a busy node runs out of: take the hard limit (the soft one
// is often 1,024), and let the ledger keep a reserve of it for connections and own files.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    LogWarning("cannot raise the open-file limit",
               {{"soft", std::to_string(before)}, {"error", std::strerror(errno)}});
  }
}

// Store values may be up to 16 MiB; leave room for the envelope.

// Whether a server accepts connections on the Unix socket `path` (a live sidecar).
bool SomeoneListensOn(const std::string& path) {
  sockaddr_un address{};
  if (path.size() >= sizeof(address.sun_path)) return false;
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool listening = ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  ::close(fd);
  return listening;
}

// Makes `path` ready to listen on: its directory exists, and a socket file left behind by a
// sidecar that was killed (SIGKILL, OOM) is removed, so the restarted sidecar serves at once.
// A live sidecar on the path, or a file that is not a socket, is never touched.
Status PrepareSocketPath(const std::string& path) {
  std::error_code error;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  if (error) {
    return Status::Unavailable("cannot create the directory of socket " + path + ": " +
                               error.message() + " (choose another path with --socket)");
  }
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return Status::Ok();  // nothing there
  if (!S_ISSOCK(info.st_mode)) {
    return Status::Unavailable("cannot listen on " + path +
                               ": a file that is not a socket is in the way (remove it or "
                               "choose another path with --socket)");
  }
  if (SomeoneListensOn(path)) {
    return Status::Unavailable("cannot listen on " + path +
                               ": another collectived is serving it (stop it first)");
  }
  LogInfo("removing a stale socket left by a previous sidecar", {{"socket", path}});
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::Unavailable("cannot remove the stale socket " + path + ": " +
                               std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Daemon::Daemon(DaemonConfig config) : config_(std::move(config)) {}

Daemon::~Daemon() {
  Shutdown("daemon destroyed");
  if (metrics_) metrics_->Watch(nullptr);  // scrapes must not reach the sidecar destroyed next
}

std::string Daemon::advertise_address() const {
  std::lock_guard<std::mutex> lock(address_mutex_);
  return advertise_address_;
}

int Daemon::metrics_port() const {
  return metrics_ ? metrics_->port() : 0;
}

Status Daemon::Start() {
  SetLogLevel(config_.log_level);
  RaiseOpenFileLimit();
  COLLECTIVED_RETURN_IF_ERROR(CheckListenerSecurity(config_));
  const std::string tcp_security = TcpSecurityMode(config_);
  // Peers are called with this sidecar's own certificate as the client certificate.
  ChannelSecurity peer_security;
  if (config_.tls_enabled()) {
    TlsClientOptions peer_tls;
    peer_tls.ca_file = config_.tls_ca_file;
    peer_tls.cert_file = config_.tls_cert_file;
    peer_tls.key_file = config_.tls_key_file;
    peer_tls.server_name = config_.tls_peer_name;
    peer_tls.refresh_seconds = config_.tls_refresh_seconds;
    StatusOr<ChannelSecurity> made = ChannelSecurity::Make(peer_tls);
    if (!made.ok()) return made.status();
    peer_security = std::move(*made);
  }
  store_ = std::make_shared<MemoryStore>(config_.store_max_bytes);
  COLLECTIVED_RETURN_IF_ERROR(store_->SetDefaultTimeout(config_.store_timeout));
  metrics_ = std::make_shared<Metrics>(config_.metrics_max_groups, tcp_security);
  if (!config_.metrics_address.empty()) {
    COLLECTIVED_RETURN_IF_ERROR(metrics_->Serve(config_.metrics_address));
  }
  StoreAccessPolicy store_access;
  store_access.tls = config_.tls_enabled();
  store_access.sidecar_names = config_.sidecar_names;
  store_access.trust_plaintext_peers = config_.trust_plaintext_peers;
  store_service_ = std::make_unique<StoreService>(store_, std::move(store_access), *metrics_);
  // Unique among the peers of every group: the host, this process, and a random part (ports may
  // still be unknown here when listening on port 0).
  std::string sidecar_id = config_.advertise_host + "/" + std::to_string(getpid()) + "-" +
                           std::to_string(std::random_device{}() % 1000000);
  GroupRegistryOptions groups;
  groups.sidecar_id = sidecar_id;
  groups.advertise_host = config_.advertise_host;
  groups.observer = config_.op_telemetry ? metrics_ : nullptr;
  groups.flight_recorder_size = config_.op_telemetry ? config_.flight_recorder_size : 0;
  groups.stuck_threshold = config_.stuck_threshold;
  groups.max_ops_in_flight = config_.max_ops_in_flight;
  groups.summary_agreement_from_nodes = static_cast<int>(config_.summary_agreement_from_sidecars);
  groups.split_digest_above_ranks = static_cast<int>(config_.split_digest_above_ranks);
  // Known once the listener is bound (before any group can be joined).
  groups.admin_address = [this] { return advertise_address(); };
  if (!config_.post_mortem_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(config_.post_mortem_dir, error);
    if (error || access(config_.post_mortem_dir.c_str(), W_OK) != 0) {
      return Status::Unavailable("cannot write post-mortems to --post-mortem-dir " +
                                 config_.post_mortem_dir + ": " +
                                 (error ? error.message() : std::strerror(errno)));
    }
  }
  groups.post_mortems =
      std::make_shared<PostMortems>(config_.failed_groups_kept, config_.post_mortem_dir);
  RuntimeOptions runtime;
  runtime.executor.threads = config_.executor_threads;
  runtime.executor.max_blocking_threads = config_.executor_blocking_threads;
  StatusOr<std::shared_ptr<Runtime>> started = Runtime::Create(runtime);
  if (!started.ok()) return started.status();
  groups.runtime = *started;
  SidecarOptions sidecar;
  sidecar.groups = std::move(groups);
  sidecar.local_store = store_;
  sidecar.quotas = config_.session_quotas;
  sidecar.ceilings = ResourceCeilings::Defaults(MachineLimits::OfThisProcess());
  for (size_t i = 0; i < kResourceCount; ++i) {
    const ResourceCeiling& set = config_.ceiling_overrides.of[i];
    ResourceCeiling& ceiling = sidecar.ceilings.of[i];
    if (set.total > 0) ceiling.total = set.total;
    if (set.per_client > 0) ceiling.per_client = set.per_client;
    if (ceiling.per_client > ceiling.total) ceiling.per_client = ceiling.total;
  }
  sidecar.on_resource_refused = [metrics = metrics_](Resource resource) {
    metrics->CountResourceRefusal(ResourceName(resource));
  };
  // Rendezvous stores of other sidecars are reached over gRPC.
  sidecar.resolve_store =
      [peer_security](const std::string& address) -> StatusOr<std::shared_ptr<Store>> {
    StatusOr<std::shared_ptr<RemoteStore>> store = RemoteStore::Connect(address, peer_security);
    if (!store.ok()) return store.status();
    return std::shared_ptr<Store>(*store);
  };
  sidecar_ = std::make_unique<Sidecar>(std::move(sidecar));
  metrics_->Watch(sidecar_.get());
  const std::string fd_channel_path =
      config_.socket_path.empty() ? "" : FdChannelPath(config_.socket_path);
  session_service_ = std::make_unique<SessionService>(*sidecar_, *metrics_, kVersion,
                                                      kNcclAvailable, fd_channel_path);
  group_service_ = std::make_unique<GroupService>(*sidecar_, *metrics_);
  collectives_service_ =
      std::make_unique<CollectivesService>(*sidecar_, *session_service_, *metrics_);
  AdminPolicyOptions admin;
  admin.token_file = config_.admin_token_file;
  admin.admin_names = config_.admin_names;
  admin.check_group_token = [sidecar = sidecar_.get()](const std::string& group,
                                                       const std::string& token) {
    return sidecar->CheckGroupToken(group, token);
  };
  StatusOr<std::unique_ptr<AdminPolicy>> admin_policy = AdminPolicy::Create(std::move(admin));
  if (!admin_policy.ok()) return admin_policy.status();
  admin_policy_ = std::move(*admin_policy);

  grpc::EnableDefaultHealthCheckService(true);
  // Generic gRPC tools (grpcurl, grpc_cli) discover the API on every listener.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // gRPC turns SO_REUSEPORT on by default: a second sidecar on the same port would then start
  // "successfully" and silently take half of the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.experimental().SetInterceptorCreators(ParseFailureInterceptors());
  grpc::ResourceQuota quota("collectived");
  quota.SetMaxThreads(config_.max_threads);
  builder.SetResourceQuota(quota);
  if (!config_.socket_path.empty()) {
    // Accepted by collectived itself (UnixListener), so that each connection is told apart.
    COLLECTIVED_RETURN_IF_ERROR(PrepareSocketPath(config_.socket_path));
    UnixListenerOptions unix_listener;
    unix_listener.path = config_.socket_path;
    unix_listener.mode = config_.socket_mode;
    unix_listener.on_connection = [this](int fd) {
      grpc::AddInsecureChannelFromFd(server_.get(), fd);
    };
    unix_listener.on_exhaustion = [this](bool exhausted, const std::string& reason) {
      OnListenerExhaustion("unix", exhausted, reason);
    };
    StatusOr<std::unique_ptr<UnixListener>> listening = UnixListener::Listen(
        std::move(unix_listener), sidecar_->runtime().reactor(), sidecar_->runtime().timers());
    if (!listening.ok()) return listening.status();
    unix_listener_ = std::move(*listening);
  }
  if (!config_.listen_address.empty()) {
    builder.AddListeningPort(
        config_.listen_address,
        config_.tls_enabled()
            ? MutualTlsServerCredentials(
                  {config_.tls_cert_file, config_.tls_key_file, config_.tls_ca_file},
                  config_.tls_refresh_seconds)
            : grpc::InsecureServerCredentials(),
        &tcp_port_);
  }
  builder.RegisterService(store_service_.get());
  builder.RegisterService(session_service_.get());
  builder.RegisterService(group_service_.get());
  builder.RegisterService(collectives_service_.get());
  // The advertised address needs the bound port, known only after BuildAndStart.
  admin_service_ = std::make_unique<AdminService>(config_, *sidecar_, *admin_policy_, *metrics_,
                                                  [this] { return advertise_address(); });
  builder.RegisterService(admin_service_.get());

  server_ = builder.BuildAndStart();
  if (!server_) {
    return Status::Unavailable(
        "cannot listen on " + (config_.socket_path.empty() ? "" : "unix:" + config_.socket_path) +
        (config_.listen_address.empty() ? "" : " " + config_.listen_address) +
        " (address in use, or no permission?)");
  }
  // Not ready until the address peers use is known (GetInfo and groups need it).
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  if (!config_.listen_address.empty() && tcp_port_ == 0) {
    server_->Shutdown();
    return Status::Unavailable("cannot listen on " + config_.listen_address);
  }
  if (unix_listener_) {
    if (Status watched = unix_listener_->Start(); !watched.ok()) {
      server_->Shutdown();
      return watched;
    }
  }
  if (!fd_channel_path.empty()) {
    // Memory enters the sidecar only as file descriptors, on this socket beside the gRPC one.
    Status prepared = PrepareSocketPath(fd_channel_path);
    if (prepared.ok()) {
      fd_channel_ = std::make_unique<FdChannelServer>(
          *sidecar_, *metrics_, FdChannelOptions{fd_channel_path, config_.socket_mode});
      prepared = fd_channel_->Start();
    }
    if (!prepared.ok()) {
      server_->Shutdown();
      return prepared;
    }
  }
  {
    std::lock_guard<std::mutex> lock(address_mutex_);
    advertise_address_ = config_.advertise_host + ":" + std::to_string(tcp_port_);
  }
  {
    std::lock_guard<std::mutex> lock(health_mutex_);
    started_ = true;
    UpdateHealthLocked();
  }
  LogInfo("collectived listening", {{"version", kVersion},
                                    {"socket", config_.socket_path},
                                    {"fd_channel", fd_channel_path},
                                    {"tcp", config_.listen_address},
                                    {"tcp_port", std::to_string(tcp_port_)},
                                    {"tcp_security", tcp_security},
                                    {"advertise", advertise_address()},
                                    {"metrics", config_.metrics_address},
                                    {"metrics_port", std::to_string(metrics_port())},
                                    {"gloo", kGlooAvailable ? "yes" : "no"},
                                    {"nccl", kNcclAvailable ? "yes" : "no"},
                                    {"gpus", ProbeGpus().Summary()}});
  if (const std::string advice = ProbeGpus().MpsAdvice(); !advice.empty()) {
    LogWarning(advice, {{"gpus", ProbeGpus().DeviceList()}});
  }
  if (tcp_security == "insecure (--insecure-listen)") {
    LogWarning(
        "the TCP listener serves plaintext without authentication (--insecure-listen): "
        "anyone who reaches it can drive this sidecar; give --tls-cert, --tls-key and "
        "--tls-ca for mutual TLS",
        {{"tcp", config_.listen_address}});
  }
  return Status::Ok();
}

void Daemon::OnListenerExhaustion(std::string_view listener, bool exhausted,
                                  const std::string& reason) {
  if (exhausted) {
    metrics_->CountListenerExhaustion(listener);
    LogError(
        "cannot accept connections: the sidecar is out of resources; not serving until "
        "they return",
        {{"listener", std::string(listener)}, {"error", reason}});
  } else {
    LogInfo("accepting connections again", {{"listener", std::string(listener)}});
  }
  std::lock_guard<std::mutex> lock(health_mutex_);
  exhausted_ = exhausted;
  UpdateHealthLocked();
}

void Daemon::UpdateHealthLocked() {
  if (!server_) return;
  if (auto* health = server_->GetHealthCheckService())
    health->SetServingStatus(started_ && !stopping_ && !exhausted_);
}

void Daemon::Shutdown(std::string_view reason) {
  std::lock_guard<std::mutex> lock(shutdown_mutex_);
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  LogInfo("collectived shutting down", {{"reason", std::string(reason)}});
  // Not ready any more: new clients and Kubernetes go elsewhere while in-flight ops finish.
  {
    std::lock_guard<std::mutex> lock(health_mutex_);
    stopping_ = true;
    UpdateHealthLocked();
  }
  sidecar_->Drain(Status::Unavailable("the sidecar is shutting down (" + std::string(reason) +
                                      "): it accepts no new groups or ops"));
  const Clock& clock = sidecar_->runtime().clock();
  const Clock::TimePoint drain_start = clock.Now();
  const size_t left = sidecar_->WaitDrained(Clock::Saturating(drain_start, config_.drain_timeout));
  LogInfo(left == 0 ? "drained" : "drain timed out",
          {{"ms", std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(clock.Now() -
                                                                                       drain_start)
                                     .count())},
           {"ops_failed", std::to_string(left)}});
  if (auto* health = server_->GetHealthCheckService()) health->Shutdown();
  // In-flight ops and blocked store waits fail at once instead of holding the grace period.
  sidecar_->Shutdown(Status::Aborted("the sidecar is shutting down"));
  if (fd_channel_) fd_channel_->Shutdown();
  session_service_->Shutdown(Status::Aborted("the sidecar is shutting down"));
  store_service_->Shutdown("the sidecar is shutting down");
  if (unix_listener_) unix_listener_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + config_.shutdown_grace);
  server_->Wait();
  if (!config_.socket_path.empty()) ::unlink(config_.socket_path.c_str());
  LogInfo("collectived stopped");
}

}  // namespace collectived
