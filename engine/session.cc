#include "engine/session.h"

#include "engine/group/job_token.h"  // HmacSha256
#include "engine/random_id.h"

namespace collectived {

StatusOr<uint64_t> Session::RegisterBuffer(const std::string& shm_name, size_t expected_size,
                                           size_t max_buffers) {
  auto full = [&] {
    return Status::ResourceExhausted("session " + label_ + " has " +
                                     std::to_string(buffers_.size()) +
                                     " registered buffers, the most a session may hold: "
                                     "unregister some first");
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (buffers_.size() >= max_buffers) return full();
  }
  StatusOr<std::shared_ptr<ShmSegment>> segment = ShmSegment::Open(shm_name, expected_size);
  if (!segment.ok()) return segment.status();
  std::lock_guard<std::mutex> lock(mutex_);
  if (buffers_.size() >= max_buffers) return full();  // registered meanwhile
  uint64_t id = next_buffer_id_++;
  buffers_.emplace(id, std::move(*segment));
  return id;
}

Status Session::UnregisterBuffer(uint64_t buffer_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (buffers_.erase(buffer_id) == 0) {
    return Status::NotFound("buffer " + std::to_string(buffer_id) +
                            " is not registered by session " + label_);
  }
  return Status::Ok();
}

StatusOr<std::shared_ptr<ShmSegment>> Session::Buffer(uint64_t buffer_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buffers_.find(buffer_id);
  if (it == buffers_.end()) {
    return Status::NotFound("buffer " + std::to_string(buffer_id) +
                            " is not registered by session " + label_ +
                            " (a session can only use its own buffers)");
  }
  return it->second;
}

size_t Session::RegisteredBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t total = 0;
  for (const auto& [id, segment] : buffers_) total += segment->size();
  return total;
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

SessionRegistry::SessionRegistry() : lookup_key_(RandomHex(32)) {}

std::string SessionRegistry::LookupKey(std::string_view id) const {
  return HmacSha256(lookup_key_, id);
}

std::shared_ptr<Session> SessionRegistry::Open(const std::string& client_name, int64_t pid,
                                               const std::string& binding) {
  std::string label = "s" + std::to_string(next_label_.fetch_add(1));
  std::lock_guard<std::mutex> lock(mutex_);
  std::string id;
  std::string key;
  do {
    id = RandomHex(16);
    key = LookupKey(id);
  } while (sessions_.count(key) > 0);  // 2^-128: never, but a duplicate must not replace one
  auto session = std::make_shared<Session>(id, std::move(label), binding, client_name, pid);
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
