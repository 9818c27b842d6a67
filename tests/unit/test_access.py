"""Access control pieces without a server: plaintext policy, API keys, quotas, dev certificates."""

from __future__ import annotations

import ipaddress
import logging
import re
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

import coordinator.__main__ as coordinator_cli
import draft_service.__main__ as draft_cli
from calispec_core import access
from calispec_core.access import ApiKeys, Quota, QuotaBook, bearer_token, key_line, parse_bearer
from calispec_core.credentials import TlsConfig
from calispec_core.errors import FailedPrecondition, InvalidField, ResourceExhausted
from calispec_tools.certs import make_dev_certs
from calispec_tools.cli import main as calispec_main
from calispec_tools.deploy.ray_config import RayDeployConfig

TLS_FLAGS = ["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-ca", "ca.pem"]


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]"])
def test_plaintext_is_fine_on_loopback(host: str) -> None:
    TlsConfig().check(host)


def test_plaintext_on_a_public_bind_needs_tls_or_an_explicit_flag() -> None:
    with pytest.raises(FailedPrecondition, match="refusing to serve plaintext"):
        TlsConfig().check("0.0.0.0")
    TlsConfig(plaintext=True).check("0.0.0.0")
    TlsConfig(Path("c"), Path("k"), Path("ca")).check("0.0.0.0")
    with pytest.raises(FailedPrecondition, match="all three"):
        TlsConfig(cert=Path("c"), key=Path("k")).check("127.0.0.1")
    with pytest.raises(FailedPrecondition, match="contradicts"):
        TlsConfig(Path("c"), Path("k"), Path("ca"), plaintext=True).check("127.0.0.1")


def test_service_parsers_apply_the_policy() -> None:
    with pytest.raises(SystemExit):
        draft_cli.parse_config(["--host", "0.0.0.0", "--model", "m"])
    config, _ = draft_cli.parse_config(["--host", "0.0.0.0", "--model", "m", "--plaintext"])
    assert config.tls.plaintext and not config.tls.enabled
    config, _ = draft_cli.parse_config(["--host", "0.0.0.0", "--model", "m", *TLS_FLAGS])
    assert config.tls.enabled and config.tls.cert == Path("c.pem")


def test_an_open_coordinator_needs_loopback_or_an_explicit_flag() -> None:
    base = ["--host", "0.0.0.0", "--draft-addr", "d:1", "--target-addr", "t:1", "--tokenizer", "tok", *TLS_FLAGS]
    with pytest.raises(SystemExit):
        coordinator_cli.parse_config(base)
    assert coordinator_cli.parse_config([*base, "--allow-anonymous"])[0].allow_anonymous
    config, _ = coordinator_cli.parse_config([*base, "--api-keys-file", "keys", "--quota-rpm", "60"])
    assert config.api_keys_file == Path("keys") and config.quota == Quota(60.0, None, 0)


def test_api_keys_are_hashed_at_rest_and_reloaded_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# comment\n" + key_line("alice", "csk_alice-secret"))
    assert "csk_alice-secret" not in path.read_text()
    keys = ApiKeys(path, check_every_s=0)
    assert keys.identify("csk_alice-secret") == "alice"
    assert keys.identify("csk_bob-secret") is None and keys.identify(None) is None
    path.write_text(key_line("bob", "csk_bob-secret"))  # alice revoked, bob added
    assert keys.identify("csk_bob-secret") == "bob" and keys.identify("csk_alice-secret") is None
    path.write_text("bob not-a-hash\n")  # a broken edit keeps the keys in force
    assert keys.identify("csk_bob-secret") == "bob"
    with pytest.raises(FailedPrecondition, match="SHA256HEX"):
        ApiKeys(path)  # but a broken file at startup is an error


def _alices_keys_then_deleted(tmp_path: Path, check_every_s: float) -> tuple[Path, ApiKeys, list[float]]:
    """Alice's keys file, loaded at time 0 of a clock the test moves (`now[0]`; a 5 s grace), then deleted."""
    path = tmp_path / "keys"
    path.write_text(key_line("alice", "csk_alice-secret"))
    now = [0.0]
    keys = ApiKeys(path, check_every_s=check_every_s, clock=lambda: now[0], missing_grace_s=5)
    path.unlink()
    return path, keys, now


def test_a_keys_file_that_is_gone_revokes_every_key_after_a_grace(tmp_path: Path) -> None:
    """Deleting the file kept every key valid for good ("a file being replaced"), while a restart refused it."""
    path, keys, now = _alices_keys_then_deleted(tmp_path, check_every_s=0)
    assert keys.identify("csk_alice-secret") == "alice"  # an editor's delete-and-write: kept through the gap
    now[0] = 4.9
    assert keys.identify("csk_alice-secret") == "alice"
    now[0] = 5.0
    assert keys.identify("csk_alice-secret") is None
    path.write_text(key_line("alice", "csk_alice-secret"))  # back: loaded anew
    now[0] = 6.0
    assert keys.identify("csk_alice-secret") == "alice"
    path.unlink()  # a new gap has its own grace
    now[0] = 7.0
    assert keys.identify("csk_alice-secret") == "alice"


def test_a_keys_file_that_is_not_utf8_keeps_the_keys_and_is_named_at_startup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A Latin-1 comment (`# café`): UnicodeDecodeError escaped the reload, so requests that checked the file failed
    INTERNAL, every second, and a SIGHUP killed the coordinator (found by probing)."""
    path = tmp_path / "keys"
    path.write_text(key_line("alice", "csk_alice-secret"))
    keys = ApiKeys(path, check_every_s=0)
    with path.open("ab") as file:
        file.write(b"# caf\xe9 team\n")
    with caplog.at_level(logging.ERROR, logger="calispec_core.access"):
        assert keys.identify("csk_alice-secret") == "alice"  # the previous keys, no exception
        keys.reload()  # SIGHUP's call
        assert keys.identify("csk_alice-secret") == "alice"
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 2 and all(f"{path}: 'utf-8' codec can't decode" in e for e in errors), errors
    with pytest.raises(FailedPrecondition, match=f"cannot load API keys from {path}: 'utf-8' codec"):
        ApiKeys(path)  # at start-up: named


def test_a_broken_keys_file_is_reported_once_not_at_every_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys"
    path.write_text(key_line("alice", "csk_alice-secret"))
    keys = ApiKeys(path, check_every_s=0)
    path.write_text("bob not-a-hash\n")
    with caplog.at_level(logging.ERROR, logger="calispec_core.access"):
        for _ in range(3):
            assert keys.identify("csk_alice-secret") == "alice"
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1


def test_a_good_version_written_while_a_torn_one_was_read_is_loaded_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed parse stamped the file as read from a stat taken after the read: a good version an editor finished
    meanwhile was never loaded (found by the review)."""
    path = tmp_path / "keys"
    path.write_text(key_line("alice", "csk_alice-secret"))
    keys = ApiKeys(path, check_every_s=0)
    path.write_text("bob 12")  # the editor's half-written version
    parse = access.parse_key_file

    def torn_then_finished(text: str, source: str) -> dict[str, str]:
        path.write_text(key_line("alice", "csk_alice-secret") + key_line("bob", "csk_bob-secret"))  # done now
        monkeypatch.setattr(access, "parse_key_file", parse)
        return parse(text, source)  # the torn text: refused

    monkeypatch.setattr(access, "parse_key_file", torn_then_finished)
    assert keys.identify("csk_alice-secret") == "alice"  # the torn version refused: the previous keys
    assert keys.identify("csk_bob-secret") == "bob"  # the finished one, read at the next check


def test_a_sighup_after_the_keys_file_is_gone_starts_its_grace(tmp_path: Path) -> None:
    """The countdown began at the first request that found the file gone: a SIGHUP after the delete only logged."""
    _, keys, now = _alices_keys_then_deleted(tmp_path, check_every_s=60)
    keys.reload()  # at 0
    now[0] = 61.0  # the next check, past the grace counted from the SIGHUP
    assert keys.identify("csk_alice-secret") is None


def test_sighup_never_ends_the_coordinator(caplog: pytest.LogCaptureFixture) -> None:
    """Without --api-keys-file no handler was installed, and SIGHUP's default action ended the process."""
    with caplog.at_level(logging.INFO, logger="coordinator"):
        coordinator_cli.on_hangup(None)
    assert "no --api-keys-file to reload" in caplog.text

    class Failing:
        def reload(self) -> None:
            raise RuntimeError("boom")

    coordinator_cli.on_hangup(Failing())  # type: ignore[arg-type]
    assert "previous keys stay in force" in caplog.text


@pytest.mark.parametrize("name", ["carol#ops", "#ops", "a b", ""])
def test_a_key_name_the_file_cannot_read_back_is_refused(name: str) -> None:
    """`carol#ops` was written, and broke the file (the parser cuts comments at `#`); `#ops` became a comment."""
    with pytest.raises(ValueError, match="one word without '#'"):
        key_line(name, "csk_k")


@pytest.mark.parametrize(
    "value", ["Bearer csk_k", "bearer csk_k", "BEARER csk_k", "bEaReR csk_k", "Bearer\tcsk_k", " Bearer \t csk_k \t"]
)
def test_the_bearer_scheme_is_matched_in_any_case_with_blanks_before_the_token(value: str) -> None:
    """RFC 9110 §11.1: auth schemes are case-insensitive; `bearer KEY` and `BEARER KEY` were refused."""
    assert parse_bearer(value) == "csk_k"


@pytest.mark.parametrize("value", [None, "", "csk_k", "Bearer", "Bearer ", "Bearercsk_k", "Basic csk_k", "Bearer a b"])
def test_other_authorization_values_carry_no_bearer_token(value: str | None) -> None:
    assert parse_bearer(value) is None


class _Metadata:
    """A servicer context as far as `bearer_token` reads one."""

    def __init__(self, *metadata: tuple[str, str]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def test_grpc_metadata_is_read_the_same_way() -> None:
    assert bearer_token(_Metadata(("authorization", "bearer csk_k"))) == "csk_k"  # type: ignore[arg-type]
    assert bearer_token(_Metadata(("authorization", "BEARER  csk_k"))) == "csk_k"  # type: ignore[arg-type]
    assert bearer_token(_Metadata(("x-other", "Bearer csk_x"), ("authorization", "Basic x"))) is None  # type: ignore[arg-type]


def test_only_the_first_authorization_metadata_counts_as_the_http_api_reads_the_first_header() -> None:
    """`Basic x` then `Bearer <key>` was the key over gRPC and refused over HTTP (found by probing)."""
    two = _Metadata(("authorization", "Basic x"), ("authorization", "Bearer csk_k"))
    assert bearer_token(two) is None  # type: ignore[arg-type]
    first = _Metadata(("authorization", "Bearer csk_k"), ("authorization", "Basic x"))
    assert bearer_token(first) == "csk_k"  # type: ignore[arg-type]


def test_quota_limits_rate_and_concurrency_per_caller() -> None:
    now = [0.0]
    book = QuotaBook(Quota(requests_per_minute=2, burst=2, max_concurrent=1), clock=lambda: now[0])
    for _ in range(2):
        with book.admit("alice"), pytest.raises(ResourceExhausted, match="in flight"), book.admit("alice"):
            pass
    with pytest.raises(ResourceExhausted, match="requests/minute"), book.admit("alice"):
        pass
    with book.admit("bob"):  # another caller has its own bucket
        pass
    now[0] = 30.0  # 2/min: one request's worth refilled
    with book.admit("alice"):
        pass
    with pytest.raises(ResourceExhausted), book.admit("alice"):
        pass


def test_a_request_of_several_choices_counts_as_that_many_requests() -> None:
    now = [0.0]
    book = QuotaBook(Quota(requests_per_minute=4, burst=4, max_concurrent=3), clock=lambda: now[0])
    with book.admit("alice", 3), pytest.raises(ResourceExhausted, match="in flight"), book.admit("alice"):
        pass  # three slots held by one request of three choices
    with pytest.raises(ResourceExhausted, match="requests/minute"), book.admit("alice", 2):
        pass  # 4 - 3 = 1 left of the burst: two choices do not fit, and take nothing
    with book.admit("alice"):  # the slots came back and the one request left is still there
        pass
    # never admitted, whatever the caller waits: the request's fault (a 429 had clients retry it for good)
    never = re.escape("n counts as 4 requests (one per choice); 'bob' may have 3 in flight: ask for fewer choices")
    with pytest.raises(InvalidField, match=never), book.admit("bob", 4):
        pass
    beyond_burst = "counts as 5 requests (one per choice); 'carol' may send 4 at once"
    with pytest.raises(InvalidField, match=re.escape(beyond_burst)), QuotaBook(Quota(4, burst=4)).admit("carol", 5):
        pass


def test_a_list_of_prompts_over_the_quota_names_the_prompt_not_n() -> None:
    """A batch of two prompts without `n` got a 400 naming `n` (found by probing)."""
    with (
        pytest.raises(InvalidField, match="fewer prompts") as info,
        QuotaBook(Quota(max_concurrent=1)).admit("alice", 2, "prompt"),
    ):
        pass
    assert info.value.field == "prompt"


@pytest.mark.parametrize("rate", [1e-323, 5e-5])
def test_a_rate_too_small_to_refill_is_refused_up_front(rate: float) -> None:
    """`--quota-rpm 1e-323` was accepted, and its refusals divided by a per-second rate of 0: 500s (found by
    probing)."""
    with pytest.raises(ValueError, match=r"or at least 0\.0001"):
        Quota(requests_per_minute=rate)
    book = QuotaBook(Quota(requests_per_minute=1e-4, burst=1))  # the slowest allowed still says when
    with book.admit("alice"):
        pass
    with pytest.raises(ResourceExhausted) as info, book.admit("alice"):
        pass
    assert info.value.retry_after_s is not None and info.value.retry_after_s > 0


def test_a_rate_limited_caller_is_told_when_its_bucket_refills() -> None:
    """No Retry-After nor retry pushback came with a refusal (found by probing)."""
    now = [0.0]
    book = QuotaBook(Quota(requests_per_minute=6, burst=2), clock=lambda: now[0])  # one request each 10 s
    for _ in range(2):
        with book.admit("alice"):
            pass
    now[0] = 4.0
    with pytest.raises(ResourceExhausted) as refused, book.admit("alice"):
        pass
    assert refused.value.retry_after_s == pytest.approx(6.0)
    one_at_a_time = QuotaBook(Quota(max_concurrent=1))
    with one_at_a_time.admit("bob"), pytest.raises(ResourceExhausted) as busy, one_at_a_time.admit("bob"):
        pass
    assert busy.value.retry_after_s is None  # a slot comes back when one of the caller's own requests ends


def test_dev_certificates_name_each_role_for_both_directions(tmp_path: Path) -> None:
    certs = make_dev_certs(tmp_path, namespace="prod")
    cert = x509.load_pem_x509_certificate(certs.cert("target").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = set(sans.get_values_for_type(x509.DNSName))
    assert {"target", "target-pods", "target.prod.svc", "target-pods.prod.svc.cluster.local", "localhost"} <= names
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usages)
    assert stat.S_IMODE(certs.key("target").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca-key.pem").stat().st_mode) == 0o600


def test_keys_add_prints_the_key_once_and_stores_its_hash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "keys"
    assert calispec_main(["keys", "add", "ci-bot", "--file", str(path)]) == 0
    key = capsys.readouterr().out.strip()
    assert key.startswith("csk_") and key not in path.read_text()
    assert ApiKeys(path).identify(key) == "ci-bot"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_keys_add_after_a_last_line_without_its_newline_starts_a_line_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was glued onto the last line: `bob <hash>dave <hash>`, a file no coordinator loads (both keys lost)."""
    path = tmp_path / "keys"
    path.write_text(key_line("bob", "csk_bob-secret").rstrip("\n"))
    assert calispec_main(["keys", "add", "dave", "--file", str(path)]) == 0
    key = capsys.readouterr().out.strip()
    keys = ApiKeys(path)
    assert keys.identify(key) == "dave" and keys.identify("csk_bob-secret") == "bob"


def test_keys_add_to_a_file_that_does_not_parse_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The new key would never work: a coordinator keeps its previous keys while the file does not parse."""
    path = tmp_path / "keys"
    path.write_text("bob not-a-hash\n")
    assert calispec_main(["keys", "add", "dave", "--file", str(path)]) == 2
    assert "keys:1: expected `NAME SHA256HEX`: mend the file first" in capsys.readouterr().err
    assert path.read_text() == "bob not-a-hash\n"


def test_ray_ships_each_service_its_own_pems(tmp_path: Path) -> None:
    certs = make_dev_certs(tmp_path)
    config = RayDeployConfig.from_dict({"models": {"draft": "/d", "target": "/t"}, "tls_dir": str(tmp_path)})
    bundle = config.tls_bundle()
    assert bundle["draft"]["cert"] == certs.cert("draft").read_text()
    assert bundle["memory"]["key"] == certs.key("memory").read_text()
    assert {b["ca"] for b in bundle.values()} == {certs.ca.read_text()}
    assert RayDeployConfig.from_dict({"models": {"draft": "/d", "target": "/t"}}).tls_bundle() == {}


def test_the_sdk_takes_its_credentials_from_the_environment_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from calispec._channel import ClientAuth

    monkeypatch.setenv("CALISPEC_TOKEN", "csk_from-env")
    monkeypatch.setenv("CALISPEC_TLS_CA", "/etc/ca.pem")
    auth = ClientAuth.resolve()
    assert auth.metadata == (("authorization", "Bearer csk_from-env"),) and auth.tls_ca == Path("/etc/ca.pem")
    assert ClientAuth.resolve(token="csk_given").metadata == (("authorization", "Bearer csk_given"),)
    monkeypatch.delenv("CALISPEC_TOKEN")
    monkeypatch.delenv("CALISPEC_TLS_CA")
    assert ClientAuth.resolve() == ClientAuth()  # plaintext, no metadata
