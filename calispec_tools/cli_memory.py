"""`calispec calibrate` and `calispec memory export|import|stats`: operate the correction memory.

calispec calibrate --prompts FILE --namespace NS       # standard SD over a calibration set seeds the memory
calispec memory stats --namespace NS [--tokenizer DIR]  # top pairs as text, top-20% share, distribution
calispec memory export --namespace NS --out FILE
calispec memory import --namespace NS --file FILE --writer-token-file PATH   # adds the file's counts
(a memory service under mutual TLS: --memory-tls-cert/-key/-ca; imports need a verifier's, i.e. target, certificate)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import grpc

from calispec.client import CalispecClient, CalispecRpcError
from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import MEMORY, TlsConfig, read_writer_token, writer_metadata
from calispec_core.errors import CalispecError
from calispec_core.grpc_server import make_channel
from calispec_tools.cli_auth import add_client_auth_args, client_auth
from calispec_tools.memory_file import MemoryFileError, dump_export, load_export
from calispec_tools.memory_reads import memory_events, wait_for_events

DEFAULT_COORDINATOR = "127.0.0.1:50050"
DEFAULT_MEMORY = "127.0.0.1:50053"
MAX_IMPORT_PAIRS = 100_000  # one RecordEvents, hence one transaction: an import is all-or-nothing
EXPORT_MAX_PAIRS = 1_000_000


def register(subparsers: argparse._SubParsersAction) -> None:
    calibrate = subparsers.add_parser("calibrate", help="seed the correction memory by running SD over prompts")
    calibrate.add_argument("--prompts", required=True, type=Path, help="one prompt per line, or JSONL with 'prompt'")
    calibrate.add_argument("--namespace", required=True, help="namespace the stack's target writes to")
    calibrate.add_argument("--address", default=DEFAULT_COORDINATOR, help="coordinator HOST:PORT")
    calibrate.add_argument("--memory-addr", default=DEFAULT_MEMORY, help="memory service HOST:PORT")
    calibrate.add_argument("--max-new-tokens", type=int, default=128)
    calibrate.add_argument(
        "--gamma", type=int, default=6, help="speculative tokens per round (fixed: adaptive γ may not draft at all)"
    )
    calibrate.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    add_client_auth_args(calibrate)
    _add_memory_tls_args(calibrate)
    calibrate.set_defaults(func=cmd_calibrate)

    memory = subparsers.add_parser("memory", help="inspect and move correction-memory tables")
    sub = memory.add_subparsers(dest="memory_command", required=True)
    stats = sub.add_parser("stats", help="top pairs, top-20%% share, count distribution, size")
    _common(stats)
    stats.add_argument("--tokenizer", type=Path, help="model dir whose tokenizer decodes the pairs")
    stats.add_argument("--top", type=int, default=20)
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(func=cmd_stats)
    export = sub.add_parser("export", help="write a namespace's table to a versioned file")
    _common(export)
    export.add_argument("--out", required=True, type=Path)
    export.set_defaults(func=cmd_export)
    imp = sub.add_parser("import", help="add a file's counts to a namespace (validated first; all or nothing)")
    _common(imp)
    imp.add_argument("--file", required=True, type=Path)
    imp.add_argument("--writer-token-file", required=True, type=Path, help="the verifiers' writer token")
    imp.set_defaults(func=cmd_import)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--memory-addr", default=DEFAULT_MEMORY, help="memory service HOST:PORT")
    _add_memory_tls_args(parser)


def _add_memory_tls_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("memory service over mutual TLS (docs/security.md)")
    group.add_argument("--memory-tls-cert", type=Path, help="client certificate (e.g. certs dev's client.pem)")
    group.add_argument("--memory-tls-key", type=Path, help="its private key")
    group.add_argument("--memory-tls-ca", type=Path, help="CA bundle of the memory service's certificate")


def _memory_tls(args: argparse.Namespace) -> TlsConfig | None:
    files = (args.memory_tls_cert, args.memory_tls_key, args.memory_tls_ca)
    if not any(files):
        return None
    if not all(files):
        raise SystemExit("error: give all three of --memory-tls-cert, --memory-tls-key and --memory-tls-ca")
    return TlsConfig(*files)


def _stub(args: argparse.Namespace) -> tuple[grpc.Channel, memory_pb2_grpc.MemoryServiceStub]:
    channel = make_channel(args.memory_addr, _memory_tls(args), server_name=MEMORY)
    return channel, memory_pb2_grpc.MemoryServiceStub(channel)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


# -- calibrate ------------------------------------------------------------------------------------


def read_prompts(path: Path) -> list[str]:
    """Plain text: one prompt per non-empty line. `.jsonl`: objects with a "prompt" string."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix != ".jsonl":
        return lines
    prompts = []
    for i, line in enumerate(lines, 1):
        item = json.loads(line)
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str):
            raise ValueError(f"{path}:{i}: expected an object with a 'prompt' string")
        prompts.append(item["prompt"])
    return prompts


def cmd_calibrate(args: argparse.Namespace) -> int:
    try:
        prompts = read_prompts(args.prompts)
    except (OSError, ValueError) as exc:
        return _fail(f"cannot read prompts: {exc}")
    if not prompts:
        return _fail(f"{args.prompts} holds no prompts")
    before = memory_events(args.memory_addr, args.namespace, tls=_memory_tls(args))
    rejections = 0
    with CalispecClient(args.address, **client_auth(args)) as client:
        for i, prompt in enumerate(prompts, 1):
            try:
                result = client.generate(
                    prompt, mode="sd", max_new_tokens=args.max_new_tokens,
                    num_speculative_tokens=args.gamma, timeout=args.timeout,
                )  # fmt: skip
            except CalispecRpcError as exc:
                return _fail(f"prompt {i}: {exc}")
            rejections += result.stats.rejections
            print(f"[{i}/{len(prompts)}] rejections {result.stats.rejections}", file=sys.stderr)
    # The target ships its events in the background: wait until the memory holds them all.
    tls = _memory_tls(args)
    seeded = wait_for_events(args.memory_addr, args.namespace, before + rejections, timeout_s=30, tls=tls) - before
    print(f"calibration: {len(prompts)} prompts, {rejections} rejection events, {seeded} recorded in {args.namespace}")
    if seeded < rejections:
        return _fail("not every event reached the memory: is --namespace the one the stack's target writes to?")
    return 0


# -- stats / export / import ----------------------------------------------------------------------


def _decoder(tokenizer_dir: Path | None):  # -> Callable[[int], str]
    if tokenizer_dir is None:
        return lambda token_id: f"#{token_id}"
    from calispec_core.modeling import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    return lambda token_id: repr(tokenizer.decode([token_id]))


def cmd_stats(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        try:
            s = stub.GetStats(memory_pb2.GetStatsRequest(namespace=args.namespace, top_k=args.top), timeout=30)
        except grpc.RpcError as exc:
            return _fail(f"{exc.code().name}: {exc.details()}")
    if args.json:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps(MessageToDict(s, preserving_proto_field_name=True)))
        return 0
    decode = _decoder(args.tokenizer)
    print(f"namespace {args.namespace}  version {s.version}")
    print(f"table: {s.distinct_pairs} pairs, {s.table_events} events (recorded ever: {s.total_events})")
    print(f"caps: {s.max_pairs} pairs, {s.max_pairs_per_draft} per draft token; half-life {s.half_life_s or 'off'}")
    print(f"database: {s.db_bytes / 1e6:.2f} MB (all namespaces)")
    print(f"top 20% of pairs cover {s.top20_share:.1%} of the table's rejections (paper: ~69%)")
    print("count distribution:")
    for b in s.count_histogram:
        print(f"  {b.min_count:>8}-{b.max_count:<8} {b.pairs:>8} pairs {b.events:>10} events")
    print(f"top {len(s.top_pairs)} pairs (draft -> target: count):")
    for p in s.top_pairs:
        print(f"  {decode(p.draft_token_id):>20} -> {decode(p.target_token_id):<20} {p.count}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    channel, stub = _stub(args)
    with channel:
        try:
            reply = stub.GetPairs(
                memory_pb2.GetPairsRequest(namespace=args.namespace, min_count=1, max_pairs=EXPORT_MAX_PAIRS),
                timeout=60,
            )
            vocab_size = stub.GetStats(memory_pb2.GetStatsRequest(namespace=args.namespace), timeout=60).vocab_size
        except grpc.RpcError as exc:
            return _fail(f"{exc.code().name}: {exc.details()}")
    pairs = [(p.draft_token_id, p.target_token_id, p.count) for p in reply.pairs]
    dump_export(args.out, args.namespace, reply.version, pairs, vocab_size)
    print(f"exported {len(pairs)} pairs of {args.namespace} at version {reply.version} to {args.out}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    try:
        token = read_writer_token(args.writer_token_file)
        export = load_export(args.file, args.namespace)
    except (MemoryFileError, CalispecError) as exc:
        return _fail(f"{exc} (nothing was imported)")
    pairs = export.pairs
    if len(pairs) > MAX_IMPORT_PAIRS:
        return _fail(f"{len(pairs)} pairs exceed one atomic import ({MAX_IMPORT_PAIRS}); nothing was imported")
    events = [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for d, t, c in pairs]
    request = memory_pb2.RecordEventsRequest(
        namespace=args.namespace, events=events, wait_durable=True, vocab_size=export.vocab_size
    )
    channel, stub = _stub(args)
    with channel:
        try:
            reply = stub.RecordEvents(request, timeout=120, metadata=writer_metadata(token, "calispec-import"))
        except grpc.RpcError as exc:
            return _fail(f"{exc.code().name}: {exc.details()} (nothing was imported)")
    print(f"imported {len(pairs)} pairs ({reply.recorded} events) into {args.namespace}, now version {reply.version}")
    return 0
