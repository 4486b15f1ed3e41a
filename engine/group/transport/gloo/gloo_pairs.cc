#include "engine/group/transport/gloo/gloo_pairs.h"

#include <gloo/transport/context.h>
#include <gloo/transport/device.h>
#include <gloo/transport/pair.h>

#include <algorithm>
#include <exception>
#include <utility>

namespace collectived {
namespace {

// The time left before `deadline`, for a store call's timeout (at least 1 ms).
std::chrono::milliseconds Left(const Clock& clock, Clock::TimePoint deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock.Now()));
}

// The outcome of one Store::WaitAsync, for a thread to block on.
struct Waited {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;  // guarded by mutex
  Status status;      // guarded by mutex
};

}  // namespace

StatusOr<std::shared_ptr<GlooPairs>> GlooPairs::Create(
    std::string group, int rank, int size, std::shared_ptr<gloo::transport::Device> device,
    std::shared_ptr<Store> store, std::chrono::milliseconds pair_timeout, Clock& clock) {
  if (size < 2 || rank < 0 || rank >= size || device == nullptr || store == nullptr) {
    return Status::InvalidArgument("group '" + group + "': no Gloo context for node " +
                                   std::to_string(rank) + " of " + std::to_string(size));
  }
  try {
    std::shared_ptr<GlooPairs> pairs(new GlooPairs(group, rank, size, std::move(store), clock));
    pairs->setTimeout(pair_timeout);
    pairs->transportContext_ = device->createContext(rank, size);
    pairs->transportContext_->setTimeout(pair_timeout);
    pairs->device_ = std::move(device);
    return pairs;
  } catch (const std::exception& error) {
    return Status::Unavailable("cannot create the Gloo context of group '" + group +
                               "': " + error.what());
  }
}

GlooPairs::GlooPairs(std::string group, int rank, int size, std::shared_ptr<Store> store,
                     Clock& clock)
    : gloo::Context(rank, size),
      group_(std::move(group)),
      store_(std::move(store)),
      clock_(clock),
      states_(static_cast<size_t>(size), PairState::kNone),
      failures_(static_cast<size_t>(size)) {}

GlooPairs::~GlooPairs() = default;

std::string GlooPairs::PairKey(int from, int to) {
  return "pair/" + std::to_string(from) + "/" + std::to_string(to);
}

Status GlooPairs::ClosedError(int peer) const {
  return Status::PeerLost("group '" + group_ + "': the Gloo connection with sidecar " +
                          std::to_string(peer) + " was closed (the group was aborted)");
}

Status GlooPairs::Connect(const std::vector<int>& peers, std::chrono::milliseconds timeout) {
  const Clock::TimePoint deadline = clock_.After(timeout);
  std::vector<int> wanted;
  for (int peer : peers) {
    if (peer < 0 || peer >= size) {
      return Status::InvalidArgument("group '" + group_ + "': no sidecar " + std::to_string(peer) +
                                     " among " + std::to_string(size));
    }
    if (peer != rank) wanted.push_back(peer);
  }
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());

  // 1. Create and publish every pair not created yet, before waiting on any peer.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return wanted.empty() ? Status::Ok() : ClosedError(wanted.front());
    std::vector<int> created;
    std::vector<std::string> keys;
    std::vector<std::string> addresses;
    for (int peer : wanted) {
      if (states_[peer] != PairState::kNone) continue;
      try {
        std::unique_ptr<gloo::transport::Pair>& pair = transportContext_->createPair(peer);
        const std::vector<char> bytes = pair->address().bytes();
        created.push_back(peer);
        keys.push_back(PairKey(rank, peer));
        addresses.emplace_back(bytes.begin(), bytes.end());
      } catch (const std::exception& error) {
        states_[peer] = PairState::kFailed;
        failures_[peer] =
            Status::Unavailable("group '" + group_ + "': cannot open a Gloo pair for sidecar " +
                                std::to_string(peer) + ": " + error.what());
      }
    }
    if (!keys.empty()) {
      Status published = store_->MultiSet(keys, std::move(addresses));
      for (int peer : created) {
        states_[peer] = published.ok() ? PairState::kPublished : PairState::kFailed;
        if (!published.ok()) {
          failures_[peer] = Status::Unavailable("group '" + group_ +
                                                "': cannot publish the Gloo address for sidecar " +
                                                std::to_string(peer) + ": " + published.message());
        }
      }
    }
  }

  // 2. Connect them in ascending peer order; one thread per pair, the others wait for it.
  for (int peer : wanted) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] { return closed_ || states_[peer] != PairState::kConnecting; });
      if (closed_) return ClosedError(peer);
      if (states_[peer] == PairState::kConnected) continue;
      if (states_[peer] == PairState::kFailed) return failures_[peer];
      states_[peer] = PairState::kConnecting;
    }
    Status connected = ConnectPair(peer, deadline);
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) {
      // Close may have closed the pair before Gloo's connect reopened it: close it for good.
      if (connected.ok()) transportContext_->getPair(peer)->close();
      connected = ClosedError(peer);
    }
    states_[peer] = connected.ok() ? PairState::kConnected : PairState::kFailed;
    if (connected.ok()) {
      ++connected_;
    } else {
      failures_[peer] = connected;
    }
    changed_.notify_all();
    if (!connected.ok()) return connected;
  }
  return Status::Ok();
}

Status GlooPairs::ConnectPair(int peer, Clock::TimePoint deadline) {
  StatusOr<std::string> address = AwaitPeerAddress(peer, deadline);
  if (!address.ok()) {
    if (address.status().kind() == ErrorKind::kPeerLost) return address.status();
    return Status::Unavailable(
        "group '" + group_ + "': cannot connect to sidecar " + std::to_string(peer) +
        " over Gloo: its address did not appear: " + address.status().message());
  }
  try {
    // The pair was created under mutex_ before this thread took it over; pairs_ is never resized.
    transportContext_->getPair(peer)->connect(std::vector<char>(address->begin(), address->end()));
    return Status::Ok();
  } catch (const std::exception& error) {
    return Status::Unavailable("group '" + group_ + "': cannot connect to sidecar " +
                               std::to_string(peer) + " over Gloo: " + error.what());
  }
}

StatusOr<std::string> GlooPairs::AwaitPeerAddress(int peer, Clock::TimePoint deadline) {
  const std::string key = PairKey(peer, rank);
  auto waited = std::make_shared<Waited>();
  const WaitId id = store_->WaitAsync({key}, Left(clock_, deadline), [waited](Status status) {
    std::lock_guard<std::mutex> lock(waited->mutex);
    waited->status = std::move(status);
    waited->done = true;
    waited->done_cv.notify_all();
  });
  if (id != kInvalidWaitId) {
    bool cancel = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (closed_) {
        cancel = true;
      } else {
        address_waits_.push_back(id);
      }
    }
    if (cancel) store_->CancelWait(id);
  }
  Status status;
  {
    std::unique_lock<std::mutex> lock(waited->mutex);
    waited->done_cv.wait(lock, [&] { return waited->done; });
    status = waited->status;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    address_waits_.erase(std::remove(address_waits_.begin(), address_waits_.end(), id),
                         address_waits_.end());
    if (closed_) return ClosedError(peer);
  }
  if (!status.ok()) return status;
  return store_->Get(key, Left(clock_, deadline));
}

int GlooPairs::connected_peers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return connected_;
}

void GlooPairs::Close() {
  std::vector<WaitId> waits;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    waits.swap(address_waits_);
    for (int peer = 0; peer < size; ++peer) {
      if (states_[peer] == PairState::kNone) continue;
      std::unique_ptr<gloo::transport::Pair>& pair = transportContext_->getPair(peer);
      if (pair) pair->close();
    }
  }
  changed_.notify_all();
  for (WaitId id : waits) store_->CancelWait(id);
}

}  // namespace collectived
