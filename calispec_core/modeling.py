"""Model loading and KV-cached sessions, shared by the draft and target services.

A `Session` owns one sequence: its token ids and a KV cache that covers a prefix of
them. Tokens past the cached prefix are *pending*: the next forward feeds them. Rolling
back is cropping the cache, so a session never recomputes what it already cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedTokenizerBase

from calispec_core import attention
from calispec_core.batch_forward import packed_forward
from calispec_core.compute import compute_thread, on_compute_thread
from calispec_core.errors import InvalidArgument, require
from calispec_core.int8_fusion import fuse_gate_up_mlps
from calispec_core.int8_outliers import isolating_outliers, use_int8_outlier_split
from calispec_core.kv_cache import SessionLayer, crop_to, new_session_cache
from calispec_core.lean_decoder import LeanDecoder
from calispec_core.limits import FP32_LINEAR_CHOICES, INT8, INT8_OUTLIER_CHOICES, INT8_SPLIT
from calispec_core.onednn_linear import set_fp32_linear_path
from calispec_core.prefix_cache import PrefixCache
from calispec_core.sessions import check_session_id
from calispec_core.vocab_pruning import pruned_columns

log = logging.getLogger(__name__)

# Prompt tokens per prefill forward. The compute thread runs calls in arrival order, so a round
# waiting behind a long prompt waits for one chunk, not for the whole prompt.
PREFILL_CHUNK = 128

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# int8: dynamic quantisation of every Linear layer (weights int8, activations quantised per call,
# float32 elsewhere); CPU only. A serving dtype like the others: SD stays exact w.r.t. the model served.
DTYPE_CHOICES = ["auto", *DTYPES, INT8]


def cpu_flags_text() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def onednn_bf16_usable() -> bool:
    """Whether torch's oneDNN may run bf16 here: False where the CPU lacks AVX512 or oneDNN is capped
    below it (`ONEDNN_MAX_CPU_ISA=AVX2`, how docs/performance.md emulates an AVX2-only CPU)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


def cpu_has_fast_bf16() -> bool:
    """True where the CPU has native bf16 matrix units (AMX or AVX512-BF16) and torch may use them."""
    flags = cpu_flags_text()
    return ("amx_bf16" in flags or "avx512_bf16" in flags) and onednn_bf16_usable()


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def wait_for(device: torch.device) -> None:
    """Block until `device`'s queued kernels are done: CUDA runs them asynchronously, so a clock read right after
    a forward would time its launches only."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: bf16 on CUDA and on CPUs with bf16 units, float32 elsewhere; int8 computes in float32."""
    if name == "auto":
        fast_bf16 = device.type == "cuda" or cpu_has_fast_bf16()
        return torch.bfloat16 if fast_bf16 else torch.float32
    if name == INT8:
        require(device.type == "cpu", "dtype int8 (dynamic quantisation) runs on CPU only")
        return torch.float32
    if name not in DTYPES:
        raise InvalidArgument(f"unknown dtype {name!r}; choose one of {DTYPE_CHOICES}")
    return DTYPES[name]


def serving_dtype_name(name: str, device: torch.device) -> str:
    """What a model service serves for `--dtype name`: `auto` resolved on this machine, int8 as int8."""
    return name if name == INT8 else str(resolve_dtype(name, device)).removeprefix("torch.")


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantisation of the Linear layers (fbgemm): about 2-4x cheaper decode steps on CPU.
    A Llama/Qwen2 MLP's gate and up projections become one call (`int8_fusion.FusedGateUpMLP`, same bits)."""
    torch.backends.quantized.engine = "fbgemm" if "fbgemm" in torch.backends.quantized.supported_engines else "qnnpack"
    model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    fuse_gate_up_mlps(model)
    return model


def apply_threads(threads: int | None) -> None:
    """Intra-op threads of this process (one model per service process): None keeps torch's default."""
    if threads is not None:
        require(threads >= 1, f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 over the vocabulary and special tokens: equal fingerprints = same token ids."""
    payload = {"vocab": sorted(tokenizer.get_vocab().items()), "special": tokenizer.all_special_tokens}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


@dataclass(frozen=True)
class ModelSpec:
    """Which model to serve and how: the part of every model service's config."""

    path: Path
    dtype: str = "auto"
    device: str = "auto"
    threads: int | None = None  # torch intra-op threads; None: torch's default (all cores)
    fp32_linear: str = "auto"  # float32 CPU Linear path, one of FP32_LINEAR_CHOICES (auto: packed where it fits)
    lean_forward: bool = True  # rounds' passes through LeanDecoder where the model is one it reproduces
    # int8: a forward holding a sequence's first token quantises its outlier rows apart (int8_outliers.py)
    int8_outliers: str = INT8_SPLIT
    # a lock file the model services of this host share: their forwards take turns (host_lock.py); None: off
    compute_lock: Path | None = None


class ModelRunner:
    """A loaded causal LM; forwards run one at a time on the compute thread, so sessions share one model safely."""

    def __init__(self, spec: ModelSpec, output_vocab: int = 0) -> None:
        """output_vocab > 0 (draft services only): keep the output rows of ids [0, output_vocab) and of
        the special tokens; the logits then cover `logit_columns` (calispec_core/vocab_pruning.py).
        Loads on the process's compute thread, where every forward runs too (calispec_core/compute.py);
        with `spec.compute_lock`, every later job there takes turns with the host's other model services."""
        compute_thread().run(self._load, spec, output_vocab)
        compute_thread().use_host_lock(spec.compute_lock)  # one model per service: its spec decides

    def _load(self, spec: ModelSpec, output_vocab: int) -> None:
        if not Path(spec.path).is_dir():
            what = "model path is not a directory" if Path(spec.path).exists() else "model directory not found"
            raise InvalidArgument(f"{what}: {spec.path}")  # a file was "not found" (probed)
        require(spec.fp32_linear in FP32_LINEAR_CHOICES, f"fp32_linear must be one of {FP32_LINEAR_CHOICES}")
        require(spec.int8_outliers in INT8_OUTLIER_CHOICES, f"int8_outliers must be one of {INT8_OUTLIER_CHOICES}")
        apply_threads(spec.threads)
        self.device = resolve_device(spec.device)
        self.dtype = resolve_dtype(spec.dtype, self.device)  # of activations and logits
        self.dtype_name = serving_dtype_name(spec.dtype, self.device)
        # HF's SDPA attention, plus the batched pass's per-row attention (calispec_core/attention.py)
        model = AutoModelForCausalLM.from_pretrained(
            str(spec.path), dtype=self.dtype, local_files_only=True, attn_implementation=attention.register()
        )
        model = model.to(self.device).eval()
        self.tokenizer = load_tokenizer(spec.path)
        self.eos_token_ids = self._eos_ids(model)
        # Before quantising: the pruned layer is quantised too, and vocab_size stays the whole vocabulary.
        self.logit_columns = pruned_columns(model, self.tokenizer, output_vocab, self.eos_token_ids)
        self.vocab_size: int = self.logit_columns.vocab_size
        self.model = quantize_int8(model) if spec.dtype == INT8 else model
        # before the lean decoder fuses q/k/v: its fused layer takes its projections' class
        self.isolates_outliers = spec.dtype == INT8 and spec.int8_outliers == INT8_SPLIT
        if self.isolates_outliers:
            use_int8_outlier_split(self.model)
        # float32 CPU layers, bf16 ones on CPUs with bf16 units ("" for int8, CUDA); after quantising, after
        # pruning the head
        self.fp32_linear = set_fp32_linear_path(self.model, spec.fp32_linear, bf16=cpu_has_fast_bf16())
        # Llama/Qwen2: HF's ops without its wrappers, q/k/v fused in int8 (bitwise the same pass)
        self.decoder = LeanDecoder.build(self.model) if spec.lean_forward else None
        self.model_id = Path(spec.path).name
        self.max_context: int = int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.fingerprint = tokenizer_fingerprint(self.tokenizer)
        self.forward_costs: dict[int, float] = {}  # ms by new tokens, once measured (forward_costs.py)
        self.new_cache()  # refuses a model whose cache layers are not plain full attention, before serving

    def _eos_ids(self, model: torch.nn.Module) -> list[int]:
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        ids = eos if isinstance(eos, list) else [eos]
        return [int(i) for i in ids if i is not None]

    def new_cache(self) -> DynamicCache:
        """An empty session cache: grows in place (calispec_core/kv_cache.py)."""
        return new_session_cache(self.model.config)

    @on_compute_thread
    @torch.inference_mode()
    def forward(self, token_ids: list[int], cache: DynamicCache, logits_to_keep: int) -> torch.Tensor:
        """Feed token_ids after the cached prefix (extended in place); returns the last logits,
        [1, logits_to_keep, V] (V: logit_columns.width, the whole vocabulary unless the output layer is
        pruned). The batched pass with one row: HF's own attention on a cached decode step (SDPA with
        `enable_gqa` on the cache's views) cost more than the per-row attention's folded heads."""
        require(logits_to_keep >= 1, f"logits_to_keep must be >= 1, got {logits_to_keep}")
        return packed_forward(self, [cache], [token_ids], [logits_to_keep])[0][None]

    @on_compute_thread
    @torch.inference_mode()
    def forward_lean(
        self,
        input_ids: torch.Tensor,  # [1, T] the rows' new tokens end to end
        positions: torch.Tensor,  # [1, T]
        rows: list[list[SessionLayer]],  # [layer][row]
        widths: list[int],  # n_b
        masks: list[torch.Tensor | None],  # per row [g·n_b, L_b + n_b] or None
        kept: torch.Tensor,  # [K]
        first_tokens: bool = False,  # some row starts at position 0 (int8: its outlier rows quantised apart)
    ) -> torch.Tensor:  # [K, V]
        """A packed pass through `decoder` (calispec_core/batch_forward.py builds its arguments)."""
        assert self.decoder is not None
        with isolating_outliers(self.isolates_outliers and first_tokens):
            return self.decoder.forward(input_ids, positions, rows, widths, masks, kept)

    @on_compute_thread
    @torch.inference_mode()
    def forward_batch(
        self,
        input_ids: torch.Tensor,  # [B, S]
        attention_mask: torch.Tensor | None,  # [B, P + S] 1 on real entries, a [B, 1, S, P + S] bool mask, or None
        position_ids: torch.Tensor,  # [B, S] each token's own position
        cache: DynamicCache,  # [B, H, P, D] per layer
        logits_to_keep: int | torch.Tensor,  # the last n positions, or the positions' indices [K]
        first_tokens: bool = False,  # some row starts at position 0 (int8: its outlier rows quantised apart)
    ) -> torch.Tensor:  # [B, n or K, V]
        """A multi-session forward: padded rows, or sessions packed end to end (calispec_core.batch_forward).

        The last n positions are kept by index: HF slices them as a strided view, which torch's matmul
        runs against the output weight expanded per row and, in bf16, copied (467 MB a row for the 1.5B
        target's 151,936 × 1,536 head; docs/performance.md)."""
        if isinstance(logits_to_keep, int) and 0 < logits_to_keep < input_ids.shape[1]:
            width = input_ids.shape[1]
            logits_to_keep = torch.arange(width - logits_to_keep, width, device=input_ids.device)  # [n]
        with isolating_outliers(self.isolates_outliers and first_tokens):
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
            )
        return out.logits

    def check_token_ids(self, token_ids: list[int], what: str) -> None:
        bad = [t for t in token_ids if t >= self.vocab_size]
        require(
            not bad,
            f"{what}: token id {bad[0] if bad else 0} outside the vocabulary (size {self.vocab_size})",
        )


@dataclass
class Session:
    """One sequence on a model service: token ids plus a KV cache over a prefix of them."""

    session_id: str
    tokens: list[int]
    cache: DynamicCache
    lock: threading.Lock = field(default_factory=threading.Lock)
    # A riding prefill's prompt less its last token, until the session's first batched forward has computed it
    # (`settle_riders`, `store_riders`); None once the cache holds it (or the prompt prefilled on its own).
    riding_prefix: list[int] | None = None

    @property
    def cached_len(self) -> int:
        return self.cache.get_seq_length()

    def pending(self) -> list[int]:
        return self.tokens[self.cached_len :]

    def checkpoint(self) -> tuple[int, int]:
        """(tokens, cached entries) now, for `restore` after a failed forward."""
        return len(self.tokens), self.cached_len

    def restore(self, checkpoint: tuple[int, int]) -> None:
        """Back to `checkpoint`: later tokens dropped, every cache layer back to its length then (a forward
        that raised part of the way through extended only some layers)."""
        tokens, cached = checkpoint
        del self.tokens[tokens:]
        crop_to(self.cache, cached)

    def truncate(self, length: int) -> None:
        """Drop tokens past `length` (and their cache entries).

        The last kept token stays pending (uncached), as after a prefill: the next forward must
        have an input, and a rollback to exactly the cached length would leave it none.
        """
        require(
            0 < length <= len(self.tokens),
            f"rollback length {length} outside [1, {len(self.tokens)}] for session {self.session_id}",
        )
        del self.tokens[length:]
        crop_to(self.cache, length - 1)
        if self.riding_prefix is not None:  # what rides is what is left of the prompt
            del self.riding_prefix[length - 1 :]


def check_prompt_fits(count: int, max_context: int) -> None:
    """InvalidArgument for a prompt of `count` tokens the context cannot hold. The servicers call it on the repeated
    field's length (O(1)) before converting it: a 64 MiB field became tens of millions of Python ints (~440 MB,
    seconds of CPU) only to be refused (found by probing)."""
    require(count < max_context, f"prompt of {count} tokens does not fit the context ({max_context})")


def prefill_session(
    runner: ModelRunner,
    session_id: str,
    token_ids: list[int],
    prefix_cache: PrefixCache | None = None,
    on_logits: Callable[[torch.Tensor, int], None] | None = None,
    ride_tokens: int = 0,
) -> Session:
    """Validate a prompt and cache all but its last token (the next forward's input); with a prefix
    cache, the longest stored prefix is reused and only the rest computed.

    `on_logits(logits, start)`, when given, gets every cached position's logits chunk by chunk ([n, V]: position
    start + i predicts prompt token start + i + 1), right after the chunk's forward; every position is computed
    then (no stored prefix is reused: its logits were never kept).

    A prompt of at most `ride_tokens` tokens (without `on_logits`) computes nothing here: it *rides* in the
    session's first batched forward, whose caller brackets the pass with `settle_riders` and `store_riders`
    (the whole prompt is pending until then). Why: a prefill on its own waits for the compute thread and the
    host lock behind the other sessions' rounds (at concurrency 8, 1.1 s for a 175 ms target prefill, 0.7 s
    for a 66 ms draft one: docs/performance.md "Prefills that ride"), and the 30 tokens cost less in a batch
    (+78 ms in an 8 × 4 verify)."""
    check_session_id(session_id)
    require(len(token_ids) > 0, "prompt token_ids must not be empty")
    check_prompt_fits(len(token_ids), runner.max_context)
    runner.check_token_ids(token_ids, "prompt")
    session = Session(session_id, list(token_ids), runner.new_cache())
    prefix = token_ids[:-1]
    if on_logits is None and len(token_ids) <= ride_tokens:
        session.riding_prefix = list(prefix)
        return session
    reused = 0
    if prefix_cache is not None and on_logits is None:
        # The cache's copies are torch work: on the compute thread, like every forward (one OpenMP team per process)
        reused = compute_thread().run(prefix_cache.attach, prefix, session.cache)
    for start in range(reused, len(prefix), PREFILL_CHUNK):  # other sessions' forwards run between chunks
        chunk = prefix[start : start + PREFILL_CHUNK]
        logits = runner.forward(chunk, session.cache, logits_to_keep=len(chunk) if on_logits else 1)  # [1, n, V]
        if on_logits is not None:
            on_logits(logits[0], start)
    if prefix_cache is not None:
        compute_thread().run(prefix_cache.store, prefix, session.cache)
    wait_for(runner.device)  # on CUDA: the prefill's own time (a riding one, above, computed nothing to wait for)
    return session


def settle_riders(sessions: Sequence[Session], prefix_cache: PrefixCache | None) -> None:
    """(On the compute thread, before a batched forward) give each riding session whose cache is still empty the
    longest stored prefix of its prompt; the forward computes the rest. Idempotent: a rerun of a failed forward
    finds the prefix attached. A failed attach (out of memory for the copy) leaves the cache empty, never part-filled:
    the forward then computes the whole prompt (the cache only saves work)."""
    if prefix_cache is None:
        return
    for session in sessions:
        if session.riding_prefix is not None and session.cached_len == 0:
            try:
                prefix_cache.attach(session.riding_prefix, session.cache)
            except Exception:
                crop_to(session.cache, 0)  # some layers may hold the prefix: none must
                log.exception("session %r: the prefix cache's attach failed", session.session_id)


def store_riders(sessions: Sequence[Session], prefix_cache: PrefixCache | None) -> None:
    """(On the compute thread, after a batched forward that succeeded) keep each riding session's prompt KV for
    later prompts; the sessions ride no more. A failed store is logged, never raised: the round it follows has
    computed (and its caller commits) every row."""
    for session in sessions:
        if session.riding_prefix is not None and prefix_cache is not None:
            try:
                prefix_cache.store(session.riding_prefix, session.cache)
            except Exception:
                log.exception("session %r: the prefix cache's store failed", session.session_id)
        session.riding_prefix = None
