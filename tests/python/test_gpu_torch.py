"""torch.distributed on CUDA tensors through the "collectived" backend: 1, 2 and 4 ranks sharing
GPU 0 on one sidecar (helpers/gpu_torch_worker.py has the checks: allreduce of float32, float16,
bfloat16 and int64 with SUM, PRODUCT, MIN and MAX; an async op right after a kernel queued on
the same stream; kernels queued after wait() that overwrite the op's input or read its output;
allocations freed with empty_cache and made again; allgather, broadcast,
reduce_scatter, barrier and a refused mix of devices; DDP on CUDA against one-process
training); and the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (VMM memory, shared
as POSIX file descriptors), including tensors that span several 20 MiB segments; and the same
with COLLECTIVED_STREAM_WAIT=signal (streams wait on words the sidecar's stream writes); every
op through the process's one native session. Skipped,
saying why, where torch has no CUDA or the sidecar sees no GPU: CI runs
Debian's CPU-only torch; scripts/gpu-check.sh runs these on a GPU machine.
"""

import pytest
import torch

from collectived import Client
from collectived import cuda as collectived_cuda
from torch_helpers import HELPERS, Sidecars, assert_check, launch, load_helper

WORKER = HELPERS / "gpu_torch_worker.py"
CHECKS = [fn.__name__ for fn in load_helper("gpu_torch_worker").CHECKS]
EXPANDABLE_CHECKS = [fn.__name__ for fn in load_helper("gpu_torch_worker").EXPANDABLE_CHECKS]
SIGNAL_CHECKS = [fn.__name__ for fn in load_helper("gpu_torch_worker").SIGNAL_CHECKS]


@pytest.fixture(scope="module")
def gpu_sidecar():
    if not torch.cuda.is_available():
        pytest.skip(f"torch {torch.__version__} has no CUDA here")
    if not collectived_cuda.available():
        pytest.skip("the client library was built without CUDA")
    sides = Sidecars(1)
    with Client(sides[0].unix_address) as client:
        gpus = list(client.sidecar_info().gpus)
        status = client.sidecar_info().gpu_status
    if not gpus:
        sides.stop()
        pytest.skip(f"the sidecar sees no GPU: {status}")
    yield sides
    logs = sides.logs()
    assert sides.stop() == [0], logs


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"{n}ranks")
def ranks(request, gpu_sidecar):
    return launch(WORKER, [], request.param, gpu_sidecar, init="tcp", timeout=300).wait()


@pytest.mark.parametrize("check", CHECKS)
def test_check(ranks, check, gpu_sidecar):
    assert_check(ranks, check, gpu_sidecar)


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"{n}ranks")
def expandable_ranks(request, gpu_sidecar):
    return launch(WORKER, ["expandable"], request.param, gpu_sidecar, init="tcp", timeout=300,
                  env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}).wait()


@pytest.mark.parametrize("check", EXPANDABLE_CHECKS)
def test_expandable_segments(expandable_ranks, check, gpu_sidecar):
    """VMM memory (PyTorch's expandable segments) travels as POSIX file descriptors: the same
    ops and DDP as on cudaMalloc memory pass."""
    assert_check(expandable_ranks, check, gpu_sidecar)


@pytest.fixture(scope="module", params=[1, 2], ids=lambda n: f"{n}ranks")
def signal_ranks(request, gpu_sidecar):
    return launch(WORKER, ["signal"], request.param, gpu_sidecar, init="tcp", timeout=300,
                  env={"COLLECTIVED_STREAM_WAIT": "signal"}).wait()


@pytest.mark.parametrize("check", SIGNAL_CHECKS)
def test_stream_signals(signal_ranks, check, gpu_sidecar):
    """COLLECTIVED_STREAM_WAIT=signal: wait() makes the stream wait on a word the sidecar's
    stream writes (cuStreamWaitValue32), with no CPU wait at all; the same ops and DDP pass."""
    assert_check(signal_ranks, check, gpu_sidecar)


