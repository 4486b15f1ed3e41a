"""The torch backend's group-name grammar and bootstrap record (collectived.torch_names) follow
the vectors that rpc/torch_names.h and the Go client are tested against too."""

import pathlib

import pytest

from collectived import torch_names

VECTORS = pathlib.Path(__file__).resolve().parents[1] / "data" / "torch_names.tsv"


def rows(kind):
    found = [line.split("\t") for line in VECTORS.read_text(encoding="utf-8").splitlines()
             if line and not line.startswith("#") and line.split("\t")[0] == kind]
    assert found, f"no {kind!r} rows in {VECTORS}"
    return found


@pytest.mark.parametrize("row", rows("name"), ids=lambda row: row[4])
def test_group_names(row):
    _, job, index, random_hex, name = row
    assert torch_names.group_name(job, int(index), random_hex) == name


@pytest.mark.parametrize("row", rows("job_of"), ids=lambda row: row[1])
def test_jobs_of_group_names(row):
    assert torch_names.job_of_group_name(row[1]) == row[2]


def test_records_round_trip_and_bad_ones_are_refused():
    for _, record, group, address in rows("record"):
        assert torch_names.parse_bootstrap_record(record.encode()) == (group, address)
        assert torch_names.bootstrap_record(group, address) == record
    for row in rows("bad_record"):
        record = row[1] if len(row) > 1 else ""
        with pytest.raises(ValueError, match=r"NAME\|STORE_ADDRESS"):
            torch_names.parse_bootstrap_record(record)


def test_a_name_drawn_at_random_has_the_grammars_shape():
    name = torch_names.group_name("trainer", 4)
    assert torch_names.job_of_group_name(name) == "trainer"
    assert len(name) == len("trainer-pg4-") + 8
    assert len(torch_names.group_name("", 0)) == len("pg-") + 16
