"""The committed stubs in calispec/v1 must be exactly what grpcio-tools makes of proto/."""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc  # a dev dependency, installed by `make install`

REPO = Path(__file__).resolve().parents[2]


def test_generated_stubs_are_up_to_date(tmp_path: Path) -> None:
    protos = sorted(str(p.relative_to(REPO / "proto")) for p in (REPO / "proto").rglob("*.proto"))
    assert protos, "no .proto files found"
    args = ["protoc", f"-I{REPO / 'proto'}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}", *protos]  # fmt: skip
    include = Path(protoc.__file__).parent / "_proto"
    assert protoc.main([*args, f"-I{include}"]) == 0, "protoc failed"
    generated = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.py*"))
    committed = sorted(p.relative_to(REPO) for p in (REPO / "calispec" / "v1").glob("*_pb2*.py*"))
    assert generated == committed, "stub files differ from the protos: run `make proto`"
    stale = [str(p) for p in generated if (tmp_path / p).read_bytes() != (REPO / p).read_bytes()]
    assert not stale, f"stale stubs {stale}: run `make proto` and commit the result ({sys.executable})"
