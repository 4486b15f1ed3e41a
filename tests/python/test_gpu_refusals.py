"""The GPU path where there is no GPU (CI, development machines): a sidecar built with CUDA and
NCCL says what it sees and why it cannot serve CUDA groups; CUDA groups and CUDA tensors are
refused at once with that reason (never a hang, never a crash), and CUDA tensors from a TCP
session are refused whatever the machine. On a GPU machine scripts/gpu-check.sh runs the GPU
tests; the refusals that need "no GPU" skip there, saying so.
"""

import ctypes
import os
import urllib.request

import numpy as np
import pytest

from collectived import CollectivedError, wire
from raw.raw_client import RawClient as Client  # raw requests: forged CUDA tensors
from collectived.v1 import common_pb2
from conftest import collectivectl, unique


def gpus_of(client):
    return list(client.sidecar_info().gpus)


def test_info_health_and_build_info_report_the_gpu_backend(sidecar):
    with Client(sidecar.unix_address) as client:
        info = client.sidecar_info()
    assert info.gpu_status, "the sidecar says nothing about GPUs"
    if info.nccl_available:
        assert info.nccl_version.count(".") == 2, info.nccl_version
        assert f"NCCL {info.nccl_version}" in info.gpu_status
        assert info.gpus or "no GPU:" in info.gpu_status
    else:
        assert info.gpu_status == "GPU backend not built"
    out = collectivectl("--address", sidecar.unix_address, "info")
    assert out.returncode == 0, out.stderr
    assert f"gpu:        {info.gpu_status}" in out.stdout
    out = collectivectl("--address", sidecar.unix_address, "health")
    assert out.returncode == 0 and f"gpu: {info.gpu_status}" in out.stdout
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{sidecar.metrics_port}/metrics").read().decode()
    line = next(l for l in metrics.splitlines() if l.startswith("collectived_build_info{"))
    assert f'nccl_version="{info.nccl_version}"' in line, line
    assert 'gpus="' in line


def test_a_cuda_group_is_refused_with_the_reason_where_no_gpu_is_usable(sidecar):
    with Client(sidecar.unix_address) as client:
        if gpus_of(client):
            pytest.skip("this machine has a GPU: scripts/gpu-check.sh covers CUDA groups")
        status = client.sidecar_info().gpu_status
        with pytest.raises(CollectivedError) as refused:
            client.create_group(unique(), 0, 1, device="cuda:0", timeout=30)
        message = str(refused.value)
        assert "CUDA groups need" in message, message
        # The reason the sidecar gives is the one `info` shows.
        assert status.split(": ", 1)[-1] in message or "GPU backend" in message, message
        # The session and the sidecar go on: a CPU group works right after.
        name = unique()
        client.create_group(name, 0, 1)
        x = np.ones(3, np.float32)
        client.allreduce(name, x)
        assert (x == 1).all()
    with pytest.raises(ValueError):
        Client.create_group(None, "g", 0, 1, device="tpu")


def cuda_allreduce(client, group):
    """Submits an allreduce of a CUDA IPC reference (a made-up handle: no GPU is needed to be
    refused) and waits for it."""
    def encode(writeback):
        return wire.op("allreduce", [wire.tensor(
            common_pb2.FLOAT32, 4, wire.cuda_ipc(b"\x01" * 64, 0, 16, 0, b""))])
    return client._submit(group, "allreduce", encode, 30, False)


def test_cuda_tensors_are_refused_with_the_reason_and_the_group_goes_on(sidecar):
    with Client(sidecar.unix_address) as client:
        name = unique()
        client.create_group(name, 0, 1)
        with pytest.raises(CollectivedError) as refused:
            cuda_allreduce(client, name)
        message = str(refused.value)
        assert "input tensor 0" in message, message
        if not gpus_of(client):
            assert "CUDA tensors need" in message, message
        else:  # the made-up handle is refused by the driver
            assert "CUDA IPC memory handle" in message, message
        x = np.full(2, 5.0, np.float32)
        client.allreduce(name, x)
        assert (x == 5).all()


def cuda_vmm_allreduce(client, group, ids, offset=0, length=16, device=0):
    """Submits an allreduce of a CUDA VMM reference (made-up registration ids) and waits."""
    def encode(writeback):
        return wire.op("allreduce", [wire.tensor(common_pb2.FLOAT32, length // 4, wire.cuda_vmm(
            common_pb2.CudaVmmRef(registration_ids=ids, offset=offset, length=length,
                                  device=device)))])
    return client._submit(group, "allreduce", encode, 30, False)


def test_hostile_cuda_vmm_tensors_are_refused_naming_what_is_wrong_and_the_group_goes_on(sidecar):
    """A CudaVmmRef is bounded and checked on every sidecar, GPU or not; ids the session never
    registered are refused (no GPU: with the reason there is none)."""
    with Client(sidecar.unix_address) as client:
        name = unique()
        client.create_group(name, 0, 1)
        for ids, offset, words in (([], 0, "without registration ids"),
                                   (list(range(1, 66)), 0, "spans 65 allocations; at most 64"),
                                   ([1], 2**64 - 4, "overflows"),
                                   ([1], 0, None)):
            with pytest.raises(CollectivedError) as refused:
                cuda_vmm_allreduce(client, name, ids, offset)
            message = str(refused.value)
            assert "input tensor 0" in message, message
            if words is not None:
                assert words in message, message
            elif not gpus_of(client):
                assert "CUDA tensors need" in message, message
            else:
                assert "VMM registration 1 is not one of this session's" in message, message
        with pytest.raises(CollectivedError) as refused:
            cuda_vmm_allreduce(client, name, [1], device=-1)
        assert "negative device -1" in str(refused.value)
        x = np.full(2, 5.0, np.float32)
        client.allreduce(name, x)
        assert (x == 5).all()


@pytest.mark.parametrize("submit", [cuda_allreduce,
                                    lambda client, group: cuda_vmm_allreduce(client, group, [1])],
                         ids=["ipc", "vmm"])
def test_cuda_tensors_from_a_tcp_session_are_refused(sidecar, tls_client_environment, submit):
    with Client(sidecar.tcp_address) as client:
        name = unique()
        client.create_group(name, 0, 1)
        with pytest.raises(CollectivedError) as refused:
            submit(client, name)
        assert "only from clients on the sidecar's Unix socket" in str(refused.value)


def test_a_cuda_vmm_registration_is_refused_clearly_and_the_session_goes_on(sidecar):
    """kRegisterCudaVmm on the fd channel: a descriptor that is no VMM allocation (a memfd) is
    refused with the reason (no GPU here: the sidecar says so; with one, the driver refuses the
    import); a registration without a descriptor or with a device that is no ordinal is refused
    as such, and an unknown id given back is NotFound; the channel and the session go on."""
    with Client(sidecar.unix_address) as client:
        channel = client._fd_channel_locked()
        fd = os.memfd_create("not-vmm")
        os.ftruncate(fd, 2 << 20)
        try:
            with pytest.raises(CollectivedError) as refused:
                channel.register_cuda_vmm(fd, 2 << 20, 0)
            message = str(refused.value)
            if not gpus_of(client):
                assert "CUDA tensors need" in message and "CUDA VMM memory" in message, message
            else:
                assert "importing the VMM allocation's file descriptor" in message, message
            with pytest.raises(CollectivedError, match="not a CUDA device ordinal"):
                channel._exchange(4, 2 << 20, fd=fd, value1=2**40)
        finally:
            os.close(fd)
        with pytest.raises(CollectivedError, match="carries no file descriptor"):
            channel._exchange(4, 2 << 20)
        with pytest.raises(CollectivedError) as unknown:
            channel.unregister_cuda_vmm(12345)
        assert ("is not one of this session's" in str(unknown.value) or
                "CUDA tensors need" in str(unknown.value)), str(unknown.value)
        assert channel.alive()
        buffer = client.allocate(4096)
        name = unique()
        client.create_group(name, 0, 1)
        x = buffer.array(4, np.float32)
        x[:] = 3
        client.allreduce(name, x)
        assert (x == 3).all()


def test_the_vmm_export_says_why_it_cannot_be_made_without_a_gpu():
    """The client's VMM export (collectived.cuda with a VmmRegistrations) of memory it cannot
    share is a clear error: no CUDA in the library, no driver, or (on a GPU machine) host memory;
    nothing is sent to the sidecar and nothing is kept."""
    from collectived import cuda
    sent = []
    registrations = cuda.VmmRegistrations(lambda fd, n, d: sent.append(fd) or 1)
    host = np.zeros(16, np.float32)
    if not cuda.available():
        with pytest.raises(ValueError, match="built without CUDA|need the CUDA runtime"):
            cuda.export(host.ctypes.data, host.nbytes, 0, 0, registrations)
        return
    lib = cuda._library()
    error = ctypes.create_string_buffer(512)
    answer = lib.collectived_cuda_is_vmm(host.ctypes.data, 0, error, len(error))
    assert answer in (-1, 0), answer
    if answer == -1:
        assert error.value, "no reason given"
        print("VMM query here:", error.value.decode())
    count = lib.collectived_cuda_vmm_chunks(host.ctypes.data, host.nbytes, 0, None, None, None, 0,
                                            error, len(error))
    assert count == -1 and error.value, count
    with pytest.raises(ValueError):
        cuda.export(host.ctypes.data, host.nbytes, 0, 0, registrations)
    assert sent == [] and len(registrations) == 0


def test_a_cuda_export_that_cannot_be_made_is_a_clear_error_not_a_crash():
    """The client's own CUDA export (collectived.cuda, the C++ client's code through ctypes):
    host memory handed over as a CUDA pointer is refused with CUDA's reason (no driver here; "not
    device memory" on a GPU machine), and the process goes on."""
    from collectived import cuda
    host = np.zeros(16, np.float32)
    if not cuda.available():
        with pytest.raises(ValueError, match="built without CUDA|need the CUDA runtime"):
            cuda.export(host.ctypes.data, host.nbytes, 0, 0)
        return
    for _ in range(3):
        with pytest.raises(ValueError) as refused:
            cuda.export(host.ctypes.data, host.nbytes, 0, 0)
        message = str(refused.value)
        assert "cuda" in message.lower(), message
    print("CUDA export of host memory here:", message)


def test_the_torch_backend_routes_by_device_and_refuses_other_devices(sidecar):
    """The torch process group serves CPU and (with a CUDA client) CUDA tensors; a tensor on any
    other device is refused with the device named, and the group goes on."""
    import datetime
    import torch
    import torch.distributed as dist
    from collectived import cuda
    from collectived.native_session import NativeSession
    from collectived.torch.adoption import Adopter
    from collectived.torch.backend import ProcessGroupCollectived, _served_device_types
    from collectived.torch.staging import StagingPool

    assert _served_device_types() == (["cpu", "cuda"] if cuda.built() else ["cpu"])
    store = dist.HashStore()
    session = NativeSession(sidecar.unix_address)
    session.staging, session.adopter = StagingPool(session), Adopter(session)
    try:
        group = ProcessGroupCollectived(store, 0, 1, datetime.timedelta(seconds=30),
                                        session=session)
        with pytest.raises(ValueError, match="expected a CPU or CUDA tensor, got one on meta"):
            group.allreduce([torch.empty(4, device="meta")])
        x = torch.ones(4)
        group.allreduce([x]).wait()
        assert x.tolist() == [1, 1, 1, 1]
        assert group._cuda_group is None  # no CUDA op ran: no CUDA group was created
        group.shutdown()
    finally:
        session.close()


def test_ops_carry_their_device_in_metrics_and_the_flight_recorder(sidecar):
    """Every op is labelled with where its group's tensors live: "cpu" here (a CUDA group's ops
    say "cuda"; scripts/gpu-check.sh runs those)."""
    from collectived.v1 import admin_pb2
    with Client(sidecar.unix_address) as client:
        name = unique()
        client.create_group(name, 0, 1)
        client.allreduce(name, np.ones(4, np.float32))
        recorder = client._call(client._admin_stub.GetFlightRecorder,
                                admin_pb2.GetFlightRecorderRequest(group=name), "flight recorder")
    assert [op.device for op in recorder.ops] == ["cpu"], recorder
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{sidecar.metrics_port}/metrics").read().decode()
    ops = [l for l in metrics.splitlines()
           if l.startswith("collectived_ops_total{") and f'group="{name}"' in l]
    assert ops and all('device="cpu"' in l for l in ops), ops
    latency = [l for l in metrics.splitlines()
               if l.startswith("collectived_op_latency_seconds_count{") and f'group="{name}"' in l]
    assert latency and all('device="cpu"' in l for l in latency), latency
