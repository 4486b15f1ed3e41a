"""gRPC server reflection: generic tools (grpcurl, grpc_cli) discover the API over the Unix
socket and over the mutual-TLS TCP listener.

python3-grpcio has no reflection module: the reflection messages are generated from Go's copy
of reflection.proto (golang-google-grpc-dev, installed by scripts/setup.sh) with protoc.
"""

import importlib
import pathlib
import subprocess
import sys

import pytest

import collectived

REFLECTION_PROTO = pathlib.Path("/usr/share/gocode/src/google.golang.org/grpc/reflection/"
                                "grpc_reflection_v1alpha/reflection.proto")
METHOD = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


@pytest.fixture(scope="module")
def reflection_pb2(tmp_path_factory):
    if not REFLECTION_PROTO.exists():
        print(f"skipping: {REFLECTION_PROTO} is absent (scripts/setup.sh installs "
              "golang-google-grpc-dev)")
        pytest.skip(f"{REFLECTION_PROTO} is absent")
    out = tmp_path_factory.mktemp("reflection")
    subprocess.run(["protoc", f"-I{REFLECTION_PROTO.parent}", f"--python_out={out}",
                    REFLECTION_PROTO.name], check=True, capture_output=True, text=True)
    sys.path.insert(0, str(out))
    try:
        yield importlib.import_module("reflection_pb2")
    finally:
        sys.path.remove(str(out))


def ask(address, pb2, request):
    """One ServerReflectionInfo exchange over a fresh channel (TLS from the environment)."""
    with collectived.open_channel(address) as channel:
        call = channel.stream_stream(METHOD,
                                     request_serializer=pb2.ServerReflectionRequest.SerializeToString,
                                     response_deserializer=pb2.ServerReflectionResponse.FromString)
        return next(iter(call(iter([request]), timeout=10)))


def test_services_are_listed_over_the_unix_socket_and_mutual_tls(sidecar, reflection_pb2):
    expected = {"collectived.v1.Session", "collectived.v1.Groups", "collectived.v1.Collectives",
                "collectived.v1.Store", "collectived.v1.Admin", "grpc.health.v1.Health",
                "grpc.reflection.v1alpha.ServerReflection"}
    for address in (sidecar.unix_address, sidecar.tcp_address):
        response = ask(address, reflection_pb2,
                       reflection_pb2.ServerReflectionRequest(list_services=""))
        names = {s.name for s in response.list_services_response.service}
        assert expected <= names, f"{address}: {sorted(names)}"
    # A tool can then fetch the schema of a service.
    response = ask(sidecar.unix_address, reflection_pb2,
                   reflection_pb2.ServerReflectionRequest(
                       file_containing_symbol="collectived.v1.Session"))
    files = response.file_descriptor_response.file_descriptor_proto
    assert files and any(b"collectived/v1/session.proto" in f for f in files)
