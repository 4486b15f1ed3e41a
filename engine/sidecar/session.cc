#include "engine/sidecar/session.h"

#include <openssl/crypto.h>
#include <unistd.h>

#include <atomic>

#include "engine/vocabulary/random_id.h"

namespace collectived {

void Session::Hold(ResourceClaim claim) {
  std::lock_guard<std::mutex> lock(mutex_);
  held_.push_back(std::move(claim));
}

StatusOr<uint64_t> Session::RegisterBuffer(int fd, size_t expected_size, ResourceLedger& ledger) {
  Registered registered;
  // The count first: a refused registration maps nothing.
  StatusOr<ResourceClaim> buffer = ledger.Claim(resources_, Resource::kBuffers, 1);
  if (!buffer.ok()) {
    close(fd);
    return buffer.status();
  }
  registered.claims.push_back(std::move(*buffer));
  uint64_t id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_buffer_id_++;  // ids are never reused, even by a failed registration
  }
  StatusOr<std::shared_ptr<ShmSegment>> segment = ShmSegment::Adopt(
      fd, expected_size, "buffer " + std::to_string(id) + " of session " + label_);
  if (!segment.ok()) return segment.status();
  StatusOr<ResourceClaim> bytes =
      ledger.Claim(resources_, Resource::kMappedBytes, (*segment)->size());
  if (!bytes.ok()) return bytes.status();
  registered.claims.push_back(std::move(*bytes));
  if (!(*segment)->sealed()) {
    StatusOr<ResourceClaim> descriptor = ledger.Claim(resources_, Resource::kDescriptors, 1);
    if (!descriptor.ok()) return descriptor.status();
    registered.claims.push_back(std::move(*descriptor));
  }
  registered.segment = std::move(*segment);
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.emplace(id, std::move(registered));
  return id;
}

void Session::SetAttachedBy(PeerCredentials peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  attached_by_ = peer;
}

PeerCredentials Session::attached_by() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return attached_by_;
}

Status Session::UnregisterBuffer(uint64_t buffer_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (buffers_.erase(buffer_id) == 0) {
    return Status::NotFound("buffer " + std::to_string(buffer_id) +
                            " is not registered by session " + label_);
  }
  return Status::Ok();
}

StatusOr<std::shared_ptr<ShmSegment>> Session::BufferLocked(uint64_t buffer_id) const {
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) {
    return Status::NotFound("buffer " + std::to_string(buffer_id) +
                            " is not registered by session " + label_ +
                            " (a session can only use its own buffers)");
  }
  return it->second.segment;
}

StatusOr<std::shared_ptr<ShmSegment>> Session::Buffer(uint64_t buffer_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return BufferLocked(buffer_id);
}

StatusOr<StreamSignal> Session::Signal(uint64_t buffer_id, uint64_t offset, uint32_t value) const {
  std::lock_guard<std::mutex> lock(mutex_);
  StatusOr<std::shared_ptr<ShmSegment>> segment = BufferLocked(buffer_id);
  if (!segment.ok()) return segment.status().WithContext("stream signal");
  if (signal_buffer_id_ != buffer_id && buffers_.count(signal_buffer_id_) != 0) {
    return Status::InvalidArgument(
        "stream signal: session " + label_ + " signals through buffer " +
        std::to_string(signal_buffer_id_) + ", not buffer " + std::to_string(buffer_id) +
        " (a session has one stream-signal buffer, which the sidecar pins)");
  }
  StatusOr<StreamSignal> signal = MakeStreamSignal(std::move(*segment), offset, value);
  if (signal.ok()) signal_buffer_id_ = buffer_id;
  return signal;
}

size_t Session::RegisteredBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& [id, registered] : buffers_) total += registered.segment->size();
  return total;
}

size_t Session::BufferCount() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return buffers_.size();
}

StatusOr<DeviceMemoryImporter*> Session::DeviceMemory() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!device_memory_) {
    StatusOr<std::unique_ptr<DeviceMemoryImporter>> made = MakeDeviceMemoryImporter();
    if (!made.ok()) return made.status();
    device_memory_ = std::move(*made);
  }
  return device_memory_.get();
}

StatusOr<uint64_t> Session::RegisterCudaVmm(int fd, uint64_t bytes, int device) {
  StatusOr<DeviceMemoryImporter*> importer = DeviceMemory();
  if (!importer.ok()) {
    close(fd);
    return importer.status().WithContext("session " + label_ + ": CUDA VMM memory");
  }
  return (*importer)->RegisterVmm(fd, bytes, device);
}

Status Session::UnregisterCudaVmm(uint64_t id) {
  StatusOr<DeviceMemoryImporter*> importer = DeviceMemory();
  if (!importer.ok()) {
    return importer.status().WithContext("session " + label_ + ": CUDA VMM memory");
  }
  return (*importer)->UnregisterVmm(id).WithContext("session " + label_);
}

void Session::SetPeer(PeerCredentials peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  peer_ = peer;
}

PeerCredentials Session::peer() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peer_;
}

void Session::AddMembership(GroupRank membership) {
  std::lock_guard<std::mutex> lock(mutex_);
  memberships_.insert(std::move(membership));
}

bool Session::RemoveMembership(const std::string& group) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = memberships_.begin(); it != memberships_.end(); ++it) {
    if (it->group == group) {
      memberships_.erase(it);
      return true;
    }
  }
  return false;
}

int Session::GroupRankIn(const std::string& group) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& m : memberships_) {
    if (m.group == group) return m.group_rank;
  }
  return -1;
}

std::vector<Session::GroupRank> Session::Memberships() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {memberships_.begin(), memberships_.end()};
}

namespace {
std::atomic<uint64_t> next_registry_serial{1};
}  // namespace

SessionRegistry::SessionRegistry()
    : lookup_key_(RandomHex(32)), serial_(next_registry_serial.fetch_add(1)) {}

std::string SessionRegistry::LookupKey(std::string_view id) const {
  struct Memo {
    uint64_t registry = 0;  // serial_ of the registry whose key made `digest`
    std::string id;
    std::string digest;
  };
  thread_local Memo memo;
  // Compared in constant time (the length first, which every real id shares): a guess learns
  // nothing of the id that another session's lookup left here.
  if (memo.registry == serial_ && memo.id.size() == id.size() &&
      CRYPTO_memcmp(memo.id.data(), id.data(), id.size()) == 0) {
    return memo.digest;
  }
  std::string digest = lookup_key_.Digest(id);
  memo.registry = serial_;
  memo.id.assign(id);
  memo.digest = digest;
  return digest;
}

std::shared_ptr<Session> SessionRegistry::Open(const std::string& client_name, int64_t pid,
                                               const std::string& binding,
                                               std::shared_ptr<ResourceShare> share) {
  std::string label = "s" + std::to_string(next_label_.fetch_add(1));
  std::lock_guard<std::mutex> lock(mutex_);
  std::string id;
  std::string key;
  do {
    id = RandomHex(16);
    key = LookupKey(id);
  } while (sessions_.count(key) > 0);  // 2^-128: never, but a duplicate must not replace one
  auto session =
      std::make_shared<Session>(id, std::move(label), binding, client_name, pid, std::move(share));
  sessions_.emplace(std::move(key), session);
  return session;
}

StatusOr<std::shared_ptr<Session>> SessionRegistry::Find(const std::string& id) const {
  // The map is searched by a keyed digest of the id, not the id: its comparisons stop at the
  // first differing byte, and timing them tells a caller only how much of an unknowable digest
  // a guess matched, never how much of a real id. Equal digests are equal ids (a collision of
  // HMAC-SHA256 under a secret key is not a thing a caller can find).
  const std::string key = LookupKey(id);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) {
    return Status::NotFound(
        "unknown session: the session_id names no live session of this sidecar (it ended, or "
        "never existed): attach first and use the id of its `opened` event");
  }
  return it->second;
}

std::shared_ptr<Session> SessionRegistry::Remove(const std::string& id) {
  const std::string key = LookupKey(id);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sessions_.find(key);
  if (it == sessions_.end()) return nullptr;
  std::shared_ptr<Session> session = std::move(it->second);
  sessions_.erase(it);
  auto tokens = tokens_of_session_.find(session.get());
  if (tokens != tokens_of_session_.end()) {
    for (const std::string& token_key : tokens->second) channel_tokens_.erase(token_key);
    tokens_of_session_.erase(tokens);
  }
  return session;
}

std::string SessionRegistry::IssueChannelToken(const std::shared_ptr<Session>& session) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string token;
  std::string key;
  do {
    token = RandomHex(16);
    key = LookupKey(token);
  } while (channel_tokens_.count(key) > 0);
  std::vector<std::string>& outstanding = tokens_of_session_[session.get()];
  if (outstanding.size() >= kMaxChannelTokens) {
    channel_tokens_.erase(outstanding.front());
    outstanding.erase(outstanding.begin());
  }
  outstanding.push_back(key);
  channel_tokens_.emplace(std::move(key), session);
  return token;
}

StatusOr<std::shared_ptr<Session>> SessionRegistry::RedeemChannelToken(const std::string& token) {
  // Looked up by keyed digest, as session ids are (see Find).
  const std::string key = LookupKey(token);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = channel_tokens_.find(key);
  std::shared_ptr<Session> session = it == channel_tokens_.end() ? nullptr : it->second.lock();
  if (it != channel_tokens_.end()) {
    channel_tokens_.erase(it);
    auto tokens = tokens_of_session_.find(session.get());
    if (tokens != tokens_of_session_.end()) std::erase(tokens->second, key);
  }
  if (session == nullptr) {
    return Status::NotFound(
        "unknown or used fd-channel token: a token binds one connection once, and only while "
        "its session lives; ask for a new one on the session stream");
  }
  return session;
}

size_t SessionRegistry::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sessions_.size();
}

std::vector<std::shared_ptr<Session>> SessionRegistry::List() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<Session>> sessions;
  for (const auto& [id, s] : sessions_) sessions.push_back(s);
  return sessions;
}

}  // namespace collectived
