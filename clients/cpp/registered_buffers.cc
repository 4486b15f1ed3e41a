#include "clients/cpp/registered_buffers.h"

#include "engine/vocabulary/op_traits.h"

namespace collectived {

const RegisteredBuffer* RegisteredBuffers::Add(std::unique_ptr<RegisteredBuffer> buffer) {
  const RegisteredBuffer* handle = buffer.get();
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.emplace(handle, std::move(buffer));
  return handle;
}

std::unique_ptr<RegisteredBuffer> RegisteredBuffers::Take(const RegisteredBuffer* buffer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = buffers_.find(buffer);
  if (it == buffers_.end()) return nullptr;
  std::unique_ptr<RegisteredBuffer> owned = std::move(it->second);
  buffers_.erase(it);
  return owned;
}

void RegisteredBuffers::Clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.clear();
}

Status RegisteredBuffers::CheckOwnedLocked(const std::string& group,
                                           const CollectiveArgs& args) const {
  auto check = [&](const std::vector<ClientTensor>& tensors, std::string_view role) -> Status {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].shm == nullptr || buffers_.count(tensors[i].shm) != 0) continue;
      return Status::InvalidArgument(
          std::string(OpKindName(args.type)) + " on group '" + group + "': " + std::string(role) +
          " " + std::to_string(i) +
          " refers to a shared-memory buffer that this client did not allocate or has freed");
    }
    return Status::Ok();
  };
  COLLECTIVED_RETURN_IF_ERROR(
      check(args.inputs, TraitsOf(args.type).in_place ? "tensor" : "input tensor"));
  return check(args.outputs, "output tensor");
}

}  // namespace collectived
