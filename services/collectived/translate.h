// Translation between the v1 protobuf messages and the engine's types: dtypes, reduce ops,
// tensors (shared-memory ranges of the calling session, or inline bytes) and whole requests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collectived/v1/collectives.pb.h"
#include "collectived/v1/common.pb.h"
#include "engine/sidecar/session.h"
#include "engine/vocabulary/op.h"
#include "engine/vocabulary/work.h"

namespace collectived {

// An engine request plus what is needed to answer: the tensors whose bytes travel back inline.
struct TranslatedRequest {
  OpRequest request;
  // The op's output tensors in the order of CollectiveResponse.outputs; `inline_output[i]` says
  // whether output i was inline (its bytes go back in the response) or shared memory.
  std::vector<TensorView> outputs;
  std::vector<bool> inline_output;
  // Bytes the sidecar allocated for the inline tensors (inputs and outputs).
  size_t inline_bytes = 0;
  // The registered buffers the op uses: FillResponse fails the op if a client shrank one under
  // it (ShmSegment::CheckIntact).
  std::vector<std::shared_ptr<ShmSegment>> segments;
};

// Validates and converts `proto` for `session`: unknown dtypes, buffers of other sessions,
// out-of-range or misaligned shm ranges, inline byte counts that do not match, and CUDA tensors
// (not served by this build) are InvalidArgument/NotFound errors naming the tensor.
StatusOr<TranslatedRequest> TranslateRequest(const v1::CollectiveRequest& proto,
                                             const Session& session);

// The engine's reference to a CUDA VMM tensor: InvalidArgument naming what is wrong for no
// registration ids, more than kMaxVmmAllocationsPerTensor, a negative device, or an offset +
// length that overflows. Whether the ids are the session's and the range lies within their
// allocations is the importer's to check.
StatusOr<DeviceTensorRef> TranslateCudaVmmRef(const v1::CudaVmmRef& ref);

v1::ErrorKind ToProtoErrorKind(ErrorKind kind);
void FillError(const Status& status, v1::Error* error);

// Fills `response` from a finished op: its status (failed if a buffer it used was shrunk under
// it), sequence number and inline outputs.
void FillResponse(const TranslatedRequest& translated, const Work& work, uint64_t client_op_id,
                  v1::CollectiveResponse* response);

}  // namespace collectived
