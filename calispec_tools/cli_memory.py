"""`calispec memory namespaces|stats|export|import`: operate the correction memory (`calibrate`: cli_calibrate.py).

calispec memory namespaces                   # every namespace with its size; * marks the running stack's
calispec memory stats [--tokenizer DIR]       # top pairs as text, top-20% share, distribution
calispec memory export --out FILE
calispec memory import --file FILE [--writer-token-file PATH]   # adds the file's counts
calispec memory seed [--pair qwen-coder]      # the shipped calibration, into a namespace never written (Kubernetes)
(a memory service under mutual TLS: --memory-tls-cert/-key/-ca; imports need a verifier's, i.e. target, certificate)

Without --memory-addr / --namespace / --writer-token-file they default to the running stack's
(`calispec up` records them, calispec_tools/stack_state.py), else the namespace is the memory
service's only one; with several and no stack, the error lists them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc

from calispec.v1 import memory_pb2, memory_pb2_grpc
from calispec_core.credentials import MEMORY, TlsConfig, read_writer_token, writer_metadata
from calispec_core.errors import CalispecError
from calispec_core.grpc_server import make_channel
from calispec_core.limits import MAX_STATS_TOP_PAIRS, int_in_range
from calispec_tools import arg_types as at
from calispec_tools import cli_calibrate
from calispec_tools.cli_auth import usage_error
from calispec_tools.memory_file import MemoryFileError, dump_export, load_export
from calispec_tools.memory_reads import memory_failure
from calispec_tools.memory_writes import record_when_admitted
from calispec_tools.shipped_calibration import (
    chosen_lambdas,
    file_namespace,
    seed_namespace,
    shipped_file,
    shipped_pairs,
)
from calispec_tools.stack_state import running_stack

DEFAULT_MEMORY = "127.0.0.1:50053"
MAX_IMPORT_PAIRS = 100_000  # one RecordEvents, hence one transaction: an import is all-or-nothing
EXPORT_MAX_PAIRS = 1_000_000
MAX_SEED_WAIT_S = 3600


def register(subparsers: argparse._SubParsersAction) -> None:
    cli_calibrate.register(subparsers)
    memory = subparsers.add_parser("memory", help="inspect and move correction-memory tables")
    sub = memory.add_subparsers(dest="memory_command", required=True)
    names = sub.add_parser("namespaces", help="every namespace with its size (* = the running stack's)")
    names.add_argument(
        "--memory-addr", type=at.address, default=None, help="memory service HOST:PORT (default: the running stack's)"
    )
    add_memory_tls_args(names)
    names.set_defaults(func=cmd_namespaces)
    stats = sub.add_parser("stats", help="top pairs, top-20%% share, count distribution, size")
    _common(stats)
    stats.add_argument("--tokenizer", type=Path, help="model dir whose tokenizer decodes the pairs")
    stats.add_argument(
        "--top",
        type=int_in_range(0, MAX_STATS_TOP_PAIRS),  # the service's bound; protobuf's uint32 raised on -1
        default=20,
        help=f"pairs to list, 0 to {MAX_STATS_TOP_PAIRS}",
    )
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(func=cmd_stats)
    export = sub.add_parser("export", help="write a namespace's table to a versioned file")
    _common(export)
    export.add_argument("--out", required=True, type=Path)
    export.set_defaults(func=cmd_export)
    imp = sub.add_parser("import", help="add a file's counts to a namespace (validated first; all or nothing)")
    _common(imp)
    imp.add_argument("--file", required=True, type=Path)
    imp.add_argument("--writer-token-file", type=Path, help="the verifiers' writer token (default: the stack's)")
    imp.set_defaults(func=cmd_import)
    seed = sub.add_parser(
        "seed", help="load a pair's shipped calibration into a namespace that never recorded an event (once)"
    )
    seed.add_argument("--pair", default="qwen-coder", choices=shipped_pairs(), help="whose shipped calibration")
    seed.add_argument(
        "--namespace", type=at.memory_namespace, default=None, help="default: the namespace the file was made for"
    )
    seed.add_argument(
        "--memory-addr", type=at.address, default=None, help="memory service HOST:PORT (default: the running stack's)"
    )
    seed.add_argument("--writer-token-file", type=Path, help="the verifiers' writer token (default: the stack's)")
    seed.add_argument(
        "--wait-s", type=int_in_range(1, MAX_SEED_WAIT_S), default=30, help="how long to wait for the service to listen"
    )
    add_memory_tls_args(seed)
    seed.set_defaults(func=cmd_seed)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namespace", type=at.memory_namespace, default=None, help="default: the running stack's, else the only one"
    )
    parser.add_argument(
        "--memory-addr", type=at.address, default=None, help="memory service HOST:PORT (default: the running stack's)"
    )
    add_memory_tls_args(parser)


def add_memory_tls_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("memory service over mutual TLS (docs/security.md)")
    group.add_argument("--memory-tls-cert", type=Path, help="client certificate (e.g. certs dev's client.pem)")
    group.add_argument("--memory-tls-key", type=Path, help="its private key")
    group.add_argument("--memory-tls-ca", type=Path, help="CA bundle of the memory service's certificate")


def memory_tls(args: argparse.Namespace, writes: bool = False) -> TlsConfig | None:
    """The --memory-tls-* files, read and checked once here: a missing, unreadable or unusable one is a usage
    error (one line, exit 2, as `generate --tls-ca` gives), not a traceback from the channel the command opens
    later, nor gRPC's "UNAVAILABLE" for a certificate it could not use. Without them, for the memory service of a
    running `calispec up --tls`: its certificates, `client` to read and the verifiers' `target` to write (the
    commands dialled it in plaintext, and failed with gRPC's "Socket closed"; found by probing)."""
    files = (args.memory_tls_cert, args.memory_tls_key, args.memory_tls_ca)
    if not any(files):
        tls = _the_stacks_tls(args.memory_addr, "target" if writes else "client")
    elif not all(files):
        raise SystemExit(usage_error("give all three of --memory-tls-cert, --memory-tls-key and --memory-tls-ca"))
    else:
        tls = TlsConfig(*files)
    try:
        if tls is not None:  # the stack's too: a --tls-dir of one's own may lack client.pem (a traceback; review)
            tls.read_checked("clientAuth")  # as the services check theirs, where the serve extra is installed
    except CalispecError as exc:
        raise SystemExit(usage_error(exc)) from None
    return tls


def _the_stacks_tls(given_address: str | None, role: str) -> TlsConfig | None:
    from calispec_tools.certs import DevCerts

    stack = running_stack()
    if stack is None or not stack.tls_dir or not (given_address is None or stack.serves_memory_at(given_address)):
        return None
    return DevCerts(Path(stack.tls_dir)).tls(role)


def _stub(address: str, tls: TlsConfig | None) -> tuple[grpc.Channel, memory_pb2_grpc.MemoryServiceStub]:
    channel = make_channel(address, tls, server_name=MEMORY)
    return channel, memory_pb2_grpc.MemoryServiceStub(channel)


def memory_address(given: str | None) -> str:
    """--memory-addr, else the running stack's memory service, else the default. An address that names the stack's
    service another way (`localhost` for 127.0.0.1) becomes the stack's own, so its writer token goes where the
    stack bound and nowhere a name might resolve first (such as [::1])."""
    stack = running_stack()
    if stack is not None and (given is None or stack.serves_memory_at(given)):
        return stack.memory
    return given or DEFAULT_MEMORY


def list_namespaces(address: str, tls: TlsConfig | None = None) -> list[memory_pb2.NamespaceInfo]:
    channel, stub = _stub(address, tls)
    with channel:
        return list(stub.ListNamespaces(memory_pb2.ListNamespacesRequest(), timeout=30).namespaces)


def resolve_namespace(address: str, given: str | None, tls: TlsConfig | None = None, flag: str = "--namespace") -> str:
    """`flag`'s value, else the running stack's (if it is this memory service), else the service's only one."""
    if given:
        return given
    stack = running_stack()
    if stack is not None and stack.serves_memory_at(address):
        return stack.namespace
    names = [n.namespace for n in list_namespaces(address, tls)]
    if len(names) == 1:
        return names[0]
    listing = "".join(f"\n  {n}" for n in names) or " (none yet)"
    # a flag the command needs and was not given: a usage error, exit 2 (it exited 1, as a failed command)
    raise SystemExit(usage_error(f"give {flag}; the memory service at {address} holds{listing}"))


def resolved(args: argparse.Namespace) -> tuple[str, str]:
    """(memory address, namespace) of a command, defaults applied."""
    address = memory_address(args.memory_addr)
    try:
        return address, resolve_namespace(address, args.namespace, memory_tls(args))
    except grpc.RpcError as exc:
        raise SystemExit(f"error: {memory_failure(address, exc)}") from None


def writer_token_file(given: Path | None, address: str) -> Path:
    """--writer-token-file, else the running stack's (its verifiers' token) when `address` is the stack's memory
    service: never sent to another one (wave 54: any --memory-addr got it, found by probing); else a usage error."""
    if given is not None:
        return given
    stack = running_stack()
    if stack is None:
        raise SystemExit(usage_error("give --writer-token-file (no running `calispec up` to take it from)"))
    if not stack.serves_memory_at(address):
        raise SystemExit(
            usage_error(
                f"give --writer-token-file: the running stack's token is for its memory service at {stack.memory}, "
                f"not {address}"
            )
        )
    return Path(stack.writer_token_file)


def writer_token(given: Path | None, address: str) -> str:
    """The token of writer_token_file(given, address), read before any connection: a file missing, unreadable or
    holding no token is a usage error (one line, exit 2, as the --memory-tls-* files), not a failed command (exit 1)."""
    try:
        token = read_writer_token(writer_token_file(given, address))
    except CalispecError as exc:
        raise SystemExit(usage_error(exc)) from None
    assert token is not None  # a path was given
    return token


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


# -- stats / export / import ----------------------------------------------------------------------


def _decoder(tokenizer_dir: Path | None):  # -> Callable[[int], str]
    """Token id -> text for the top pairs; ValueError naming a --tokenizer it cannot load (it was a traceback)."""
    if tokenizer_dir is None:
        return lambda token_id: f"#{token_id}"
    if not tokenizer_dir.is_dir():  # a bare name would be read as a Hugging Face Hub repo id
        raise ValueError(f"--tokenizer {tokenizer_dir}: not a directory (a model directory holding a tokenizer)")
    from calispec_core.modeling import load_tokenizer

    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except (OSError, ValueError) as exc:
        raise ValueError(f"--tokenizer {tokenizer_dir}: no tokenizer loads from it ({type(exc).__name__})") from exc
    return lambda token_id: repr(tokenizer.decode([token_id]))


def cmd_namespaces(args: argparse.Namespace) -> int:
    address = memory_address(args.memory_addr)
    try:
        names = list_namespaces(address, memory_tls(args))
    except grpc.RpcError as exc:
        return _fail(memory_failure(address, exc))
    stack = running_stack()
    mine = stack.namespace if stack is not None and stack.serves_memory_at(address) else None
    print(f"{'':2}{'namespace':<70} {'pairs':>8} {'events':>10} {'recorded':>10} {'version':>8}")
    for n in names:
        mark = "* " if n.namespace == mine else "  "
        row = f"{n.namespace:<70} {n.distinct_pairs:>8} {n.table_events:>10} {n.total_events:>10} {n.version:>8}"
        print(mark + row)
    if not names:
        print(f"  (no namespace yet at {address})")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    try:  # before the call: a tokenizer that does not load is the command's input, not the service's answer
        decode = _decoder(None if args.json else args.tokenizer)
    except ValueError as exc:
        return usage_error(exc)
    address, namespace = resolved(args)
    channel, stub = _stub(address, memory_tls(args))
    with channel:
        try:
            s = stub.GetStats(memory_pb2.GetStatsRequest(namespace=namespace, top_k=args.top), timeout=30)
        except grpc.RpcError as exc:
            return _fail(memory_failure(address, exc))
    if args.json:
        from google.protobuf.json_format import MessageToDict

        print(json.dumps(MessageToDict(s, preserving_proto_field_name=True)))
        return 0
    print(f"namespace {namespace}  version {s.version}")
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
    address, namespace = resolved(args)
    channel, stub = _stub(address, memory_tls(args))
    with channel:
        try:
            reply = stub.GetPairs(
                memory_pb2.GetPairsRequest(namespace=namespace, min_count=1, max_pairs=EXPORT_MAX_PAIRS),
                timeout=60,
            )
            vocab_size = stub.GetStats(memory_pb2.GetStatsRequest(namespace=namespace), timeout=60).vocab_size
        except grpc.RpcError as exc:
            return _fail(memory_failure(address, exc))
    every = [(p.draft_token_id, p.target_token_id, p.count) for p in reply.pairs]
    if reply.version == 0 and not every:  # never written: most likely a typo (it wrote an empty file, exit 0)
        return _fail(f"namespace {namespace} was never written at {address} (`calispec memory namespaces` lists them)")
    # a namespace written before its vocabulary was declared may hold ids outside it (verifiers skip them): an
    # export carrying them named a vocabulary beside ids it does not have, and no import could read it back
    inside = [p for p in every if not vocab_size or max(p[0], p[1]) < vocab_size]
    pairs = [p for p in inside if p[0] != p[1]]  # imported before wave 55 refused them: no import reads them now
    try:
        dump_export(args.out, namespace, reply.version, pairs, vocab_size)
    except MemoryFileError as exc:
        return _fail(str(exc))
    print(f"exported {len(pairs)} pairs of {namespace} at version {reply.version} to {args.out}")
    if outside := len(every) - len(inside):
        print(f"left out {outside} pairs with token ids outside the vocabulary of {vocab_size}", file=sys.stderr)
    if selves := len(inside) - len(pairs):
        print(f"left out {selves} pairs of a token with itself (no rejection makes one)", file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    tls = memory_tls(args, writes=True)  # the usage errors before any connection: the TLS files, then the token
    token = writer_token(args.writer_token_file, memory_address(args.memory_addr))
    address, namespace = resolved(args)
    try:
        export = load_export(args.file, namespace)
    except (MemoryFileError, CalispecError) as exc:
        return _fail(f"{exc} (nothing was imported)")
    pairs = export.pairs
    if len(pairs) > MAX_IMPORT_PAIRS:
        return _fail(f"{len(pairs)} pairs exceed one atomic import ({MAX_IMPORT_PAIRS}); nothing was imported")
    events = [memory_pb2.PairCount(draft_token_id=d, target_token_id=t, count=c) for d, t, c in pairs]
    request = memory_pb2.RecordEventsRequest(
        namespace=namespace,
        events=events,
        wait_durable=True,
        vocab_size=export.vocab_size,
        write_id=import_write_id(pairs, export.vocab_size),
    )
    channel, stub = _stub(address, tls)
    with channel:
        try:
            before = stub.GetStats(memory_pb2.GetStatsRequest(namespace=namespace), timeout=30).version
            reply = record_when_admitted(stub, request, 120, writer_metadata(token, "calispec-import"))
        except grpc.RpcError as exc:
            return _fail(f"{memory_failure(address, exc)} ({import_outcome(exc.code(), exc.details() or '')})")
    if reply.version <= before:  # the service replayed the reply of this file's earlier import: nothing counted
        print(f"already imported into {namespace} (the same file, at version {reply.version}): nothing was counted")
    else:
        print(f"imported {len(pairs)} pairs ({reply.recorded} events) into {namespace}, now version {reply.version}")
    return 0


def import_write_id(pairs: Sequence[tuple[int, int, int]], vocab_size: int) -> str:
    """The file's write id: its digest, so that the same file imported into a namespace again (a retry after a
    reply that was lost) counts once (the service remembers the last 65,536 ids). A retry counted it twice."""
    digest = hashlib.blake2b(repr((vocab_size, sorted(pairs))).encode(), digest_size=16).hexdigest()
    return f"import-{digest}"


def import_outcome(code: grpc.StatusCode, details: str) -> str:
    """What the user can know of an import that failed with `code`: a call that ended without its reply (the
    write accepted but not committed in time, a deadline, a broken connection) may still have counted; one that
    never connected did not."""
    ended_unanswered = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)
    # refused before anything was taken: never connected, or the memory cannot commit (its database: a full disk)
    refused = ("failed to connect", "cannot commit", "the correction memory's database")
    if code in ended_unanswered and not any(why in details.lower() for why in refused):
        return "it may have been imported: run the same command again, which counts the file once"
    return "nothing was imported"


def cmd_seed(args: argparse.Namespace) -> int:
    """What a deployment without `calispec up` runs once (deploy/k8s/calibration-seed/job.yaml): exit 0 when the
    namespace holds counts afterwards (loaded now, or before), 1 when the file was refused or the service failed."""
    tls = memory_tls(args, writes=True)
    token = writer_token(args.writer_token_file, memory_address(args.memory_addr))
    path = shipped_file(args.pair)
    assert path is not None  # --pair's choices are the shipped files
    namespace = args.namespace or file_namespace(path)
    if namespace is None:
        return _fail(f"{path} names no namespace: give --namespace")
    address = memory_address(args.memory_addr)
    print(f"namespace {namespace}")
    try:
        result = seed_namespace(address, namespace, path, token, tls, wait_s=args.wait_s)
    except grpc.RpcError as exc:
        return _fail(f"{memory_failure(address, exc)} (nothing was loaded)")
    print(result.message)
    for dtype, lam in chosen_lambdas(args.pair, meaning_guard=True):
        print(f"λ chosen for it: {lam} where the target serves {dtype} with the meaning guard (--default-lambda)")
    return 0 if result.present else 1
