"""Security commands and client flags of the CLI (docs/security.md).

calispec certs dev DIR            # a local CA and one certificate per service (mutual TLS)
calispec keys add NAME --file F   # a new API key: printed once, its SHA-256 appended to F

Every command that talks to a coordinator takes `--token` and `--tls-ca` (default: the
CALISPEC_TOKEN and CALISPEC_TLS_CA environment variables, read by the SDK).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from calispec._channel import TLS_CA_ENV, ClientAuth, read_ca_bundle
from calispec.client import CalispecRpcError
from calispec_core.access import key_line, new_api_key, parse_key_file
from calispec_core.errors import FailedPrecondition

USAGE_ERROR = 2  # exit status of input the command cannot use (argparse's for a bad flag)


def add_client_auth_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("coordinator access")
    group.add_argument("--token", help="API key (default: $CALISPEC_TOKEN)")
    group.add_argument(
        "--tls-ca", help="CA bundle of the coordinator's certificate: use TLS (default: $CALISPEC_TLS_CA)"
    )
    group.add_argument("--tls-server-name", help="name the coordinator's certificate carries (default: the host)")


def client_auth(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of CalispecClient / AsyncCalispecClient from the flags above."""
    return {"token": args.token, "tls_ca": args.tls_ca, "tls_server_name": args.tls_server_name}


def checked_client_auth(args: argparse.Namespace) -> dict[str, Any]:
    """client_auth(args), checked as the SDK will use it, before any client is built: ValueError naming a CA
    bundle (--tls-ca or CALISPEC_TLS_CA) it cannot read or that holds no PEM certificate, or a token or
    server name gRPC metadata cannot carry (the commands print it as one line, exit 2)."""
    options = client_auth(args)
    auth = ClientAuth.resolve(**options)
    if auth.tls_ca is not None:
        read_ca_bundle(auth.tls_ca)
    return options


def own_stack_auth() -> dict[str, Any]:
    """Client keyword arguments for a stack the command started itself (demo, bench/eval --local, bench compare
    and calibration): it runs open on loopback, so no credentials, not even the environment's ("" overrides
    CALISPEC_TOKEN / CALISPEC_TLS_CA, meant for the stack `calispec up --tls` runs)."""
    return {"token": "", "tls_ca": ""}


def uses_tls(auth: dict[str, Any]) -> bool:
    """Whether a client of these keyword arguments (client_auth) talks TLS (a CA given, or in the environment)."""
    return ClientAuth.resolve(**auth).tls_ca is not None


def rpc_error_line(exc: CalispecRpcError, tls: bool) -> str:
    """The one line of a failed call, with a hint where it looks like plaintext against TLS or the reverse
    (gRPC says only "Socket closed", or names an SSL record error)."""
    line = f"error: {exc}"
    if exc.code != "UNAVAILABLE":
        return line
    # a connection that never came up: "Socket closed" mid-reply is a coordinator gone, no TLS mismatch
    if not tls and "Socket closed" in exc.details and "failed to connect" in exc.details:
        return f"{line} (if the coordinator serves TLS, give --tls-ca or set {TLS_CA_ENV})"
    if tls and "WRONG_VERSION_NUMBER" in exc.details:
        return f"{line} (the coordinator may not serve TLS: give no --tls-ca, or --tls-ca '' over {TLS_CA_ENV})"
    return line


def usage_error(problem: Exception | str) -> int:
    """One line, exit 2, for input the command cannot use (an unreadable CA bundle, a token gRPC metadata
    cannot carry, a path it cannot write, a key name of two words)."""
    print(f"error: {problem}", file=sys.stderr)
    return USAGE_ERROR


def cannot_write_in(directory: Path) -> str | None:
    """Why no file can be made in `directory`, or None: tried, since os.access says yes to root on a read-only mount
    or in /proc."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def add_api_key(file: Path, name: str) -> str:
    """Append a new key's hash line to `file` (created 0600); returns the key (shown once, never stored).
    ValueError for a name the file cannot carry, or a file that does not parse (a coordinator keeps its
    previous keys until the file is mended: the new key would not work)."""
    key = new_api_key()
    line = key_line(name, key)
    file.parent.mkdir(parents=True, exist_ok=True)
    if not file.exists():
        file.touch(mode=0o600)
    text = file.read_text(encoding="utf-8")
    try:
        parse_key_file(text, str(file))
    except FailedPrecondition as exc:
        raise ValueError(f"{exc}: mend the file first (a coordinator reading it keeps its previous keys)") from None
    with file.open("a", encoding="utf-8") as f:
        f.write(line if not text or text.endswith("\n") else "\n" + line)  # a last line without its newline
    return key


def cmd_certs_dev(args: argparse.Namespace) -> int:
    from calispec_tools.certs import ROLES, make_dev_certs

    if (Path(args.dir) / "ca.pem").exists() and not args.force:  # it replaced the CA every service trusts, silently
        return usage_error(f"{args.dir} holds a CA already (ca.pem): --force replaces it and every certificate there")
    try:
        certs = make_dev_certs(Path(args.dir), namespace=args.namespace)
    except OSError as exc:
        return _unwritable(exc, args.dir)
    print(f"CA: {certs.ca}")
    for role in ROLES:
        print(f"{role:12s} --tls-cert {certs.cert(role)} --tls-key {certs.key(role)} --tls-ca {certs.ca}")
    print("clients of the coordinator need only the CA: --tls-ca (or CALISPEC_TLS_CA)", file=sys.stderr)
    return 0


K8S_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # a DNS-1123 label: each SAN holds it


def _k8s_namespace(text: str) -> str:
    if not K8S_NAMESPACE.fullmatch(text):  # "" or "Bad_NS!" made SANs such as draft..svc
        raise argparse.ArgumentTypeError(f"a Kubernetes namespace (lower-case letters, digits, '-'), got {text!r}")
    return text


def _directory(text: str) -> str:
    if not text.strip():  # "" wrote the 12 PEM files into the current directory
        raise argparse.ArgumentTypeError("a directory, got an empty path")
    return text


def _unwritable(exc: OSError, given: str) -> int:
    """A path the command cannot write is the caller's to fix: a usage error."""
    return usage_error(f"cannot write {exc.filename or given}: {exc.strerror or exc}")


def cmd_keys_add(args: argparse.Namespace) -> int:
    try:
        key = add_api_key(Path(args.file), args.name)
    except ValueError as exc:  # a name of more than one word, a file that does not parse: exit 2
        return usage_error(exc)
    except OSError as exc:  # a directory, a missing or read-only place
        return _unwritable(exc, args.file)
    print(key)
    print(f"added key {args.name!r} to {args.file} (only its SHA-256 is stored: keep the key now)", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    certs = sub.add_parser("certs", help="TLS certificates")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True)
    dev = certs_sub.add_parser("dev", help="a local CA and per-service certificates (development, tests)")
    dev.add_argument("dir", type=_directory, help="output directory")
    dev.add_argument(
        "--namespace",
        type=_k8s_namespace,
        default="calispec",
        help="Kubernetes namespace for the SANs (default calispec)",
    )
    dev.add_argument("--force", action="store_true", help="replace a CA and certificates already in DIR")
    dev.set_defaults(func=cmd_certs_dev)

    keys = sub.add_parser("keys", help="API keys of the coordinator")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    add = keys_sub.add_parser("add", help="make a key, print it once, append its hash to the keys file")
    add.add_argument("name", help="who the key is for (one word; quotas and logs use it)")
    add.add_argument("--file", required=True, help="the coordinator's --api-keys-file")
    add.set_defaults(func=cmd_keys_add)
