// Who may touch which keys of the sidecar's store. The keys of groups (GroupKeys::IsGroupKey:
// announcements, the job token commitment, `failed`, the roll call, the transports' addresses)
// are reserved to the sidecars: a client that could write them could kill a live group or
// redirect its connections, and one that could read them could learn its topology. Every
// other key is the job's c10d store, open to every client that reaches the store.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/vocabulary/status.h"
#include "rpc/caller.h"

namespace collectived {

struct StoreAccessPolicy {
  // Whether the TCP listener requires mutual TLS. Then a peer sidecar is a caller whose verified
  // certificate carries one of `sidecar_names`. Without TLS no caller can prove it is a sidecar:
  // none is taken for one unless `trust_plaintext_peers` (--trust-plaintext-peers, for tests
  // and single-node demos) makes every TCP caller one.
  bool tls = false;
  bool trust_plaintext_peers = false;
  std::vector<std::string> sidecar_names = {"collectived"};

  // Whether `caller` is a peer sidecar. Callers on the Unix socket never are: sidecars reach
  // each other's stores over TCP.
  bool IsSidecar(const Caller& caller) const;

  // Ok, or PermissionDenied naming the key, the method and the caller when `caller` may not
  // touch `key`.
  Status CheckKey(const Caller& caller, std::string_view method, std::string_view key) const;
};

}  // namespace collectived
