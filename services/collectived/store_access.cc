#include "services/collectived/store_access.h"

#include "engine/group/rendezvous/group_keys.h"
#include "engine/vocabulary/utf8.h"

namespace collectived {

bool StoreAccessPolicy::IsSidecar(const Caller& caller) const {
  if (caller.local) return false;
  if (!tls) return trust_plaintext_peers;
  return caller.tls_verified && caller.HasAnyName(sidecar_names);
}

Status StoreAccessPolicy::CheckKey(const Caller& caller, std::string_view method,
                                   std::string_view key) const {
  if (!GroupKeys::IsGroupKey(key) || IsSidecar(caller)) return Status::Ok();
  constexpr size_t kShownKeyBytes = 200;
  std::string shown = ValidUtf8(std::string(key.substr(0, kShownKeyBytes)));
  if (key.size() > kShownKeyBytes) shown += "...";
  return Status::PermissionDenied(
      "store " + std::string(method) + " of key '" + shown +
      "' refused: keys under collectived/groups/ belong to the sidecars of their group and only "
      "peer sidecars may read or write them (caller: " +
      caller.Describe() + ")" +
      (tls || caller.local ? ""
                           : "; without TLS no TCP caller is a sidecar unless the sidecar runs "
                             "with --trust-plaintext-peers"));
}

}  // namespace collectived
