"""Pair namespaces name the models, not the transformers release that wrote their config.json."""

from __future__ import annotations

import json
from pathlib import Path

from calispec_tools.memory_file import load_export
from calispec_tools.namespaces import model_id, pair_namespace
from calispec_tools.shipped_calibration import shipped_file

# config.json of the qwen-coder pair as `calispec models pull` wrote it with transformers 5.25.0
PULLED = Path(__file__).parent / "data" / "qwen-coder"


def _copy(model: str, directory: Path, edit: dict | None = None, drop: tuple[str, ...] = ()) -> Path:
    """The pulled model's config.json in `directory`/<model>, with fields edited or dropped."""
    config = json.loads((PULLED / model / "config.json").read_text(encoding="utf-8"))
    config.update(edit or {})
    for key in drop:
        config.pop(key)
    out = directory / model
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out


def test_a_transformers_release_does_not_move_the_namespace(tmp_path: Path) -> None:
    # 5.24.0 -> 5.25.0 rewrote only this field; the shipped calibration was refused as another pair's
    older = _copy("draft", tmp_path / "a", {"transformers_version": "5.24.0"})
    newer = _copy("draft", tmp_path / "b", {"transformers_version": "5.25.0"})
    assert model_id(older) == model_id(newer) == model_id(PULLED / "draft")


def test_writer_fields_key_order_and_spacing_do_not_count(tmp_path: Path) -> None:
    pulled = PULLED / "target"
    config = json.loads((pulled / "config.json").read_text(encoding="utf-8"))
    reordered = tmp_path / "target"
    reordered.mkdir()
    shuffled = dict(reversed(list(config.items())), _name_or_path="/somewhere/else", _commit_hash="abc")
    (reordered / "config.json").write_text(json.dumps(shuffled), encoding="utf-8")
    assert model_id(reordered) == model_id(pulled)
    renamed = _copy("target", tmp_path / "old", {"torch_dtype": config["dtype"]}, drop=("dtype",))
    assert model_id(renamed) == model_id(pulled)  # transformers 4's name for the field


def test_a_model_field_moves_the_namespace(tmp_path: Path) -> None:
    wider = _copy("draft", tmp_path, {"hidden_size": 1024})
    assert model_id(wider) != model_id(PULLED / "draft")
    assert model_id(wider).startswith("draft-")


def test_a_config_that_is_not_json_is_hashed_as_it_is(tmp_path: Path) -> None:
    for text in ("not json", "[1, 2]"):
        model = tmp_path / text.replace(" ", "-").strip("[]").replace(",", "")
        model.mkdir()
        (model / "config.json").write_text(text, encoding="utf-8")
        assert model_id(model).startswith(f"{model.name}-")
    assert model_id(tmp_path / "not-json") != model_id(tmp_path / "1-2")


def test_the_shipped_calibration_is_for_the_pulled_pair() -> None:
    # the models' part of the namespace the pulled pair derives (its tokenizer files, which the
    # fingerprint after the last "/" hashes, are too large for the repo)
    path = shipped_file("qwen-coder")
    assert path is not None
    models, _, fingerprint = json.loads(path.read_text(encoding="utf-8"))["namespace"].rpartition("/")
    assert pair_namespace(PULLED / "draft", PULLED / "target").rpartition("/")[0] == models
    assert load_export(path, f"{models}/{fingerprint}").pairs
